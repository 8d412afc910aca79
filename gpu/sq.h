/*
 * The engine's side of a queue pair (proto/dfccl_queue.h): taking armed
 * submission entries, checking them, and writing completion words.
 *
 * Shared by every engine. An entry is copied out of shared memory before any
 * field is looked at, so a client that rewrites an entry while the engine
 * reads it can only hurt itself; every check runs on the copy. Entries are
 * taken in any order (an unarmed entry never blocks an armed one behind it),
 * and the engine keeps its own record of what it took, never trusting the
 * client-writable region for that.
 */
#ifndef DFCCL_SQ_H
#define DFCCL_SQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dfccl_queue.h"

/* A registered buffer as the engine knows it. */
struct sq_reg {
	uint32_t reg_id;
	uint64_t session_id;
	uint64_t size;
	void *base; /* the engine's mapping, NULL where it has none */
};

/* Looks a registration up by id; NULL if unknown. */
typedef const struct sq_reg *(*sq_reg_lookup_fn)(void *ctx, uint32_t reg_id);

struct sq_queue {
	struct dfccl_qp_header *hdr;
	size_t size;
	uint32_t n;           /* entries: from the engine's own record, not the header */
	uint32_t qp_id;
	uint64_t session_id;
	uint32_t uid;         /* the session's user: set by the opener before an engine serves q (0 after open) */
	struct dfccl_sqe *sq;
	uint64_t *cw;
	uint64_t *taken;      /* per slot: the sequence number last taken from it */
	uint64_t head;        /* lowest sequence number not yet taken */
	uint64_t look;        /* sq_take_if: where its next look starts (sched_look_start) */
	/* Per slot of a group's last entry (DFCCL_SQE_F_GROUP): the group's
	 * count word (sqe_group_count), and the last entry's completion once
	 * it came: its sequence number and status; sq_complete_group's. */
	struct sq_group {
		uint64_t count;
		uint64_t last_seq;
		uint32_t last_status;
	} *groups;
};

/*
 * Binds q to a mapped region of `size` bytes (checked with
 * queue_header_check). Returns 0 or a negative errno with a sentence in err.
 */
int sq_queue_open(struct sq_queue *q, void *map, size_t size, uint32_t qp_id, uint64_t session_id, char *err,
                  size_t errlen);
void sq_queue_close(struct sq_queue *q);

/*
 * Copies up to max ready entries into out (in slot order from head) and
 * records them as taken. Returns how many. With the head armed it takes
 * the run of armed entries from there and stops at the first that is not
 * (scheduler.h, "Taking in order"); else it skips the unarmed ones, and
 * stops before an entry past them when one of them reads armed by then.
 */
unsigned sq_take(struct sq_queue *q, struct dfccl_sqe *out, unsigned max);

/* As sq_take, but only the armed entries for which want(ctx, entry) holds
 * (called on a copy), looking at no more than `looks` armed entries; the
 * others stay armed in the queue. Each call starts where the last one
 * stopped looking (back at the head once it reached the tail), so however
 * long the queue, every armed entry is looked at within a few calls. */
unsigned sq_take_if(struct sq_queue *q, struct dfccl_sqe *out, unsigned max,
                    int (*want)(void *ctx, const struct dfccl_sqe *e), void *ctx, unsigned looks);

/* Whether any entry is submitted but not yet taken (armed or not). */
int sq_pending(const struct sq_queue *q);

/*
 * Checks a copied entry against the registrations of q's session, for the
 * host engine (which refuses DFCCL_SQE_F_DEVICE_DONE: it has no device
 * memory to store into). Returns DFCCL_CQ_OK or the DFCCL_CQ_* status to
 * complete it with.
 */
uint32_t sq_check(const struct sq_queue *q, const struct dfccl_sqe *e, sq_reg_lookup_fn lookup, void *ctx);

/* Writes the completion word of entry `seq` (one 64-bit store). */
void sq_complete(struct sq_queue *q, uint64_t seq, uint32_t status);

/*
 * As sq_complete, for an entry of a group of group_n entries whose last is
 * group_last (sqe_group; group_n 0: none, which is sq_complete): its own
 * word, but the last entry's only once every entry of the group has
 * completed, by whichever completes the group, with the last's status.
 * Safe from several threads at once.
 */
void sq_complete_group(struct sq_queue *q, uint64_t seq, uint32_t status, uint64_t group_last, uint32_t group_n);

/*
 * Whether entry seq (e, a copy of it, in a queue of n entries sq whose
 * completion words are cws) is the last of a group (DFCCL_SQE_F_GROUP)
 * an earlier entry of which (one before it by less than half the queue
 * that names the same group) has no completion word yet: its own word
 * waits for the group, whatever its own collective did. Reads the
 * client's entries as they stand: for a view (the supervisor's watch).
 */
bool sq_group_waits(const struct dfccl_sqe *e, uint64_t seq, uint32_t n, const struct dfccl_sqe *sq,
                    const uint64_t *cws);

void sq_set_engine_state(struct sq_queue *q, uint32_t state);
uint32_t sq_qp_state(const struct sq_queue *q);

/* Bytes of one element of a dfcclDataType_t value; 0 if unknown. */
unsigned sq_dtype_size(uint32_t dtype);

#endif
