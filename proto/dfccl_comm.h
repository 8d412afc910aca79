/*
 * The shared-memory region of one communicator, shared by the workers that
 * host its ranks (the host engine's connectors).
 *
 * The supervisor creates it in a memfd when the communicator becomes ready
 * and hands it to every worker with a rank in it (WorkerCommAdd). Clients
 * never see it. Every field is written by exactly one rank's task (in the
 * worker hosting that rank) and read by the tasks of the other ranks, so
 * the only synchronisation is release stores of monotonically growing
 * words and acquire loads of them; a dead worker leaves words that simply
 * stop growing, and the supervisor aborts the communicator.
 *
 * A collective instance is identified by a key >= 1: the per-communicator
 * sequence number for NCCL-style collectives, the run number for a
 * registered collective, the n-th message for a send/receive pair. Each
 * instance lives in a slot chosen by its key, so each in-flight collective
 * has its own connector state, and nothing of a preempted collective is
 * ever touched by another one.
 *
 * Per instance, rank r:
 *   1. waits until every rank's `done` in the slot is >= key - nslots (the
 *      previous user of the slot is finished everywhere), then writes its
 *      post (buffers as registration id + offset, count) and stores `key`;
 *   2. waits until every rank it reads from has stored `key`;
 *   3. works in phases; after phase p it stores `progress` =
 *      DFCCL_PROGRESS(key, p), and waits on the progress words of the ranks
 *      whose results it needs;
 *   4. stores `done` = key, waits until every rank's `done` >= key (nobody
 *      reads its buffers any more), and only then completes the entry to its
 *      client.
 * Every wait is a bounded spin followed by preemption (DFCCL, section 4):
 * the task keeps its phase and position, and resumes where it stopped.
 *
 * Send/receive use mailboxes per ordered pair (src -> dst): the sender
 * waits until the mailbox's `ack` >= key - DFCCL_COMM_P2P_SLOTS, posts its
 * buffer and stores `key`; the receiver waits for `key`, copies, and stores
 * `ack` = key; the sender completes once `ack` >= key.
 */
#ifndef DFCCL_COMM_H
#define DFCCL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dfccl_queue.h"

#define DFCCL_COMM_MAGIC 0x3130524d4d434644ull /* "DFCCMR01" */
#define DFCCL_COMM_MAX_RANKS 64u    /* ranks a host-engine communicator may have */
#define DFCCL_COMM_SLOTS 32u        /* NCCL-style collectives in flight per communicator */
#define DFCCL_COMM_MAX_COLLS 256u   /* registered collective ids 0..255 */
#define DFCCL_COMM_COLL_SLOTS 4u    /* runs in flight per registered collective */
#define DFCCL_COMM_P2P_SLOTS 8u     /* messages in flight per ordered pair of ranks */

/* progress word: the key in the high bits, the completed phase in the low 8. */
#define DFCCL_PROGRESS(key, phase) (((uint64_t)(key) << 8) | ((uint64_t)(phase)&0xffu))

/* One rank's part of one collective instance: one cache line. */
struct dfccl_rank_post {
	uint64_t key;      /* this rank: the instance it posted for (stored last, release) */
	uint64_t progress; /* this rank: DFCCL_PROGRESS(key, last phase completed) */
	uint64_t done;     /* this rank: the last key it finished (reads nobody's buffers any more) */
	uint64_t send_off; /* this rank: byte offset in send_reg */
	uint64_t recv_off; /* this rank: byte offset in recv_reg */
	uint64_t count;    /* this rank: element count of its entry, to detect mismatches */
	uint32_t send_reg; /* this rank: registration id of its send buffer (0: none) */
	uint32_t recv_reg; /* this rank: registration id of its receive buffer (0: none) */
	uint64_t reserved;
};

/* A send/receive mailbox for one ordered pair: one cache line. */
struct dfccl_p2p_box {
	uint64_t key;      /* sender: the message number posted (stored last, release) */
	uint64_t ack;      /* receiver: the last message number it finished copying */
	uint64_t send_off; /* sender */
	uint64_t count;    /* sender: elements */
	uint32_t send_reg; /* sender */
	uint32_t dtype;    /* sender: to detect mismatches */
	uint64_t reserved[3];
};

struct dfccl_comm_header {
	uint64_t magic;      /* supervisor */
	uint64_t comm_id;    /* supervisor */
	uint32_t nranks;     /* supervisor */
	uint32_t header_size;
	uint64_t region_size;
	uint64_t aborted;    /* supervisor or any worker: nonzero DFCCL_CQ_* status once the
	                      * communicator is aborted; every task fails with it */
	uint8_t reserved[64 - 40];
};

DFCCL_STATIC_ASSERT(sizeof(struct dfccl_rank_post) == 64, "rank post is one cache line");
DFCCL_STATIC_ASSERT(sizeof(struct dfccl_p2p_box) == 64, "p2p box is one cache line");
DFCCL_STATIC_ASSERT(sizeof(struct dfccl_comm_header) == 64, "comm header size");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_rank_post, key) == 0, "post key offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_rank_post, done) == 16, "post done offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_rank_post, send_reg) == 48, "post send_reg offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_p2p_box, ack) == 8, "box ack offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_comm_header, aborted) == 32, "aborted offset");

/*
 * Layout for n ranks (all offsets from the start of the region):
 *   header                                    64 bytes, then aligned to 4096
 *   NCCL-style slots: [DFCCL_COMM_SLOTS][n] posts
 *   registered slots: [DFCCL_COMM_MAX_COLLS][DFCCL_COMM_COLL_SLOTS][n] posts
 *   p2p boxes:        [n src][n dst][DFCCL_COMM_P2P_SLOTS] boxes
 * A new memfd is zero: every key, done and ack starts at 0 (nothing posted).
 */
#define DFCCL_COMM_SLOTS_OFFSET ((uint64_t)4096)
#define DFCCL_COMM_REG_OFFSET(n) \
	(DFCCL_COMM_SLOTS_OFFSET + (uint64_t)DFCCL_COMM_SLOTS * (n) * sizeof(struct dfccl_rank_post))
#define DFCCL_COMM_P2P_OFFSET(n)                                                                   \
	(DFCCL_COMM_REG_OFFSET(n) +                                                               \
	 (uint64_t)DFCCL_COMM_MAX_COLLS * DFCCL_COMM_COLL_SLOTS * (n) * sizeof(struct dfccl_rank_post))
#define DFCCL_COMM_REGION_SIZE(n)                                                                  \
	((DFCCL_COMM_P2P_OFFSET(n) + (uint64_t)(n) * (n)*DFCCL_COMM_P2P_SLOTS * sizeof(struct dfccl_p2p_box) + \
	  4095u) &                                                                                 \
	 ~(uint64_t)4095u)

/* The post of `rank` for NCCL-style key `key` (>= 1). */
static inline struct dfccl_rank_post *dfccl_comm_post(void *region, uint32_t n, uint64_t key, uint32_t rank)
{
	uint64_t slot = key % DFCCL_COMM_SLOTS;
	return (struct dfccl_rank_post *)((char *)region + DFCCL_COMM_SLOTS_OFFSET) + slot * n + rank;
}

/* The post of `rank` for run `run` (>= 1) of registered collective coll_id. */
static inline struct dfccl_rank_post *dfccl_comm_reg_post(void *region, uint32_t n, uint32_t coll_id, uint64_t run,
                                                          uint32_t rank)
{
	uint64_t slot = (uint64_t)coll_id * DFCCL_COMM_COLL_SLOTS + run % DFCCL_COMM_COLL_SLOTS;
	return (struct dfccl_rank_post *)((char *)region + DFCCL_COMM_REG_OFFSET(n)) + slot * n + rank;
}

/* The mailbox of message `key` (>= 1) from src to dst. */
static inline struct dfccl_p2p_box *dfccl_comm_box(void *region, uint32_t n, uint32_t src, uint32_t dst, uint64_t key)
{
	uint64_t idx = ((uint64_t)src * n + dst) * DFCCL_COMM_P2P_SLOTS + key % DFCCL_COMM_P2P_SLOTS;
	return (struct dfccl_p2p_box *)((char *)region + DFCCL_COMM_P2P_OFFSET(n)) + idx;
}

#endif /* DFCCL_COMM_H */
