/*
 * Helpers shared by the unit tests and the fuzz targets: descriptor
 * accounting, socket pairs and memfds, raw frames with any length prefix and
 * any number of descriptors (what frame_send refuses to produce), and small
 * request envelopes built on the stack.
 *
 * Nothing here asserts: every helper returns 0 / a count / a negative errno,
 * so the fuzz targets can use them without CMocka.
 */
#ifndef DFCCL_TESTUTIL_H
#define DFCCL_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dfccl_comm.h"
#include "frame.h"

/* Descriptors open in this process (entries of /proc/self/fd). */
int tu_count_fds(void);

/* A close-on-exec AF_UNIX stream pair. Returns 0 or -errno. */
int tu_socketpair(int sv[2]);

/* Makes blocking reads on fd give up after ms milliseconds (EAGAIN). */
int tu_set_rcvtimeo(int fd, int ms);

/* A memfd of `size` bytes, sealed against shrinking when seal_shrink.
 * Returns the descriptor or -errno. */
int tu_memfd(size_t size, int seal_shrink);

/* 1 when a and b refer to the same open file (device and inode), else 0. */
int tu_same_file(int a, int b);

/* Appends bytes to a reader as if a socket had delivered them. */
int tu_reader_append(struct frame_reader *r, const void *data, size_t len);

/*
 * One sendmsg() of a frame built by hand: the 4-byte little-endian prefix
 * `len_prefix` (which need not match plen), then payload[0..plen), with up to
 * TU_MAX_RAW_FDS descriptors attached. Returns bytes sent or -errno.
 */
#define TU_MAX_RAW_FDS 64u
int tu_send_raw(int sock, uint32_t len_prefix, const void *payload, size_t plen, const int *fds, unsigned nfds);

/*
 * A request envelope with its body in the same object, so a test can build
 * one on the stack without allocating: tu_msg_hello(&m, ...) then &m.env.
 */
struct tu_msg {
	dfccl_envelope env;
	union {
		Dfccl__V1__Hello hello;
		Dfccl__V1__Query query;
		Dfccl__V1__AttachDevice attach;
		Dfccl__V1__CommInit comm_init;
		Dfccl__V1__CommDestroy comm_destroy;
		Dfccl__V1__CommAbort comm_abort;
		Dfccl__V1__RegisterMem register_mem;
		Dfccl__V1__DeregisterMem deregister_mem;
		Dfccl__V1__AllocMem alloc_mem;
	} u;
};

void tu_msg_hello(struct tu_msg *m, uint64_t request_id, uint32_t min_version, uint32_t max_version);
void tu_msg_query(struct tu_msg *m, uint64_t request_id, Dfccl__V1__QueryKind kind);
void tu_msg_attach(struct tu_msg *m, uint64_t request_id, uint32_t device, uint32_t sq_entries);
/* unique_id is borrowed: it must outlive the message. */
void tu_msg_comm_init(struct tu_msg *m, uint64_t request_id, const uint8_t *unique_id, size_t idlen,
                      uint32_t nranks, uint32_t rank, uint32_t device);
void tu_msg_comm_destroy(struct tu_msg *m, uint64_t request_id, uint64_t comm_id);
void tu_msg_comm_abort(struct tu_msg *m, uint64_t request_id, uint64_t comm_id);
void tu_msg_register_memfd(struct tu_msg *m, uint64_t request_id, uint32_t device, uint64_t size);
void tu_msg_deregister(struct tu_msg *m, uint64_t request_id, uint32_t reg_id);
void tu_msg_alloc_mem(struct tu_msg *m, uint64_t request_id, uint32_t device, uint64_t size);

/* xorshift64: the next number below `below` from *state (never 0). */
uint32_t tu_rand(uint64_t *state, uint32_t below);

/*
 * A random communicator plan for n ranks (2..DFCCL_COMM_MAX_RANKS): a
 * random ring; min(n, DFCCL_PLAN_TREES) random trees, each node's parent a
 * random earlier node of a random order (now and then the previous one, so
 * chains, the deepest trees, occur), at most 7 children per node; and
 * `algo` everywhere in the table. Every shape an engine must accept.
 */
void tu_random_plan(struct dfccl_comm_plan *p, uint32_t n, uint8_t algo, uint64_t *state);

#endif
