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
 *      client. (The daemon kernel's pushed all-reduce, whose ranks read
 *      only their own connectors, completes right after storing `done`;
 *      it posts root = 1, so ranks that disagree about pushing fail with a
 *      mismatch. gpu/cuda/dkernel.cu.)
 * Every wait is a bounded spin followed by preemption (DFCCL, section 4):
 * the task keeps its phase and position, and resumes where it stopped.
 *
 * Send/receive use mailboxes per ordered pair (src -> dst): the sender
 * waits until the mailbox's `ack` >= key - DFCCL_COMM_P2P_SLOTS, posts its
 * buffer and stores `key`; the receiver waits for the same, stores `want` =
 * key (it waits for that message: what the sender's engine admits a send
 * for, see dfccl_comm_peer_posted), waits for `key`, copies, and stores
 * `ack` = key; the sender completes once `ack` >= key. Since the receiver
 * stores `want` only once the mailbox's previous message is acknowledged,
 * `want` only grows, and a message nobody has sent yet reads `want` == key
 * exactly while its receive waits.
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
/* The most a worker's engine may export for the communicator's other
 * workers (WorkerCommAck.peer_blob, engine_comm_export). */
#define DFCCL_PEER_BLOB_MAX 256u

#define DFCCL_COMM_MAX_CHANNELS 32u  /* channels (daemon-kernel blocks) one instance may use */

#define DFCCL_COMM_CONN_BYTES 65536u /* connector of one rank in one instance slot: two halves */
#define DFCCL_COMM_CONN_HALF (DFCCL_COMM_CONN_BYTES / 2)

/* progress word: the low 40 bits of the key in the high bits, the completed
 * phase in the low 24, so an algorithm may have up to
 * DFCCL_PROGRESS_MAX_PHASE steps. A rank stores DFCCL_PROGRESS(key, 0)
 * before it publishes `key`, so a peer that saw the key compares only
 * words of that instance, whatever the key's size. */
#define DFCCL_PROGRESS_BITS 24
#define DFCCL_PROGRESS_MAX_PHASE ((1u << DFCCL_PROGRESS_BITS) - 1u)
#define DFCCL_PROGRESS(key, phase) \
	(((uint64_t)(key) << DFCCL_PROGRESS_BITS) | ((uint64_t)(phase)&DFCCL_PROGRESS_MAX_PHASE))

/* What every rank of an instance must agree on besides the count: the
 * post's `shape`. Its algorithm byte holds the enum dfccl_algo in bits 0-2
 * and, where the engine splits an instance into channels (the daemon
 * kernel), the channel count less one in bits 3-7
 * (DFCCL_POST_ALGO_CHANNELS), so that ranks that would split the data
 * differently disagree. */
#define DFCCL_POST_SHAPE(opcode, dtype, redop, algo) \
	((uint32_t)(opcode) | (uint32_t)(dtype) << 8 | (uint32_t)(redop) << 16 | (uint32_t)(algo) << 24)
#define DFCCL_POST_ALGO_CHANNELS(algo, nch) ((uint32_t)(algo) | ((uint32_t)(nch)-1u) << 3)
#define DFCCL_POST_SHAPE_ALGO(shape) ((uint32_t)(shape) >> 24 & 7u)

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
	uint32_t shape;    /* this rank: DFCCL_POST_SHAPE of its entry, to detect mismatches */
	uint32_t root;     /* this rank: the root of its entry (broadcast, reduce), else 0 */
};

/* A send/receive mailbox for one ordered pair: one cache line. */
struct dfccl_p2p_box {
	uint64_t key;      /* sender: the message number posted (stored last, release) */
	uint64_t ack;      /* receiver: the last message number it finished copying */
	uint64_t send_off; /* sender */
	uint64_t count;    /* sender: elements */
	uint32_t send_reg; /* sender */
	uint32_t dtype;    /* sender: to detect mismatches */
	uint64_t want;     /* receiver: the message number a receive waits for (release) */
	uint64_t reserved[2];
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

/*
 * The communicator's algorithm plan, written by the supervisor before it
 * hands the region to any worker and never changed afterwards, so every
 * rank of every worker makes the same choices: the ring order, the trees
 * and the algorithm per collective and size, all computed from the
 * topology model for the devices the ranks run on (topology/topo_plan.h).
 * An engine checks it when it maps the region and uses rank order, heap
 * trees and its direct algorithms when it is absent or invalid.
 */
#define DFCCL_PLAN_TREES 4u      /* trees a multi-tree algorithm uses at most */
#define DFCCL_PLAN_COLLS 5u      /* allreduce, allgather, reducescatter, broadcast, reduce */
#define DFCCL_PLAN_BUCKETS 41u   /* message sizes, see dfccl_size_bucket() */
#define DFCCL_PLAN_NO_PARENT 0xffu
#define DFCCL_PLAN_VALID 0x4e414c50u /* "PLAN" */

struct dfccl_comm_plan {
	uint32_t valid;  /* DFCCL_PLAN_VALID once written */
	uint8_t ntrees;  /* trees in parent[], 1..DFCCL_PLAN_TREES */
	uint8_t reserved0[3];
	uint8_t ring[DFCCL_COMM_MAX_RANKS];                      /* the rank at ring position i */
	uint8_t parent[DFCCL_PLAN_TREES][DFCCL_COMM_MAX_RANKS];  /* tree t: parent of rank r, or NO_PARENT */
	uint8_t algo[DFCCL_PLAN_COLLS][DFCCL_PLAN_BUCKETS];     /* enum dfccl_algo per collective and size */
	uint8_t reserved1[576 - 8 - 64 - 256 - 205];
};

#define DFCCL_COMM_PLAN_OFFSET 64u

DFCCL_STATIC_ASSERT(DFCCL_ALGO_COUNT_ <= 8 && DFCCL_COMM_MAX_CHANNELS <= 32,
                    "the algorithm and the channel count share the shape's algorithm byte");

DFCCL_STATIC_ASSERT(sizeof(struct dfccl_rank_post) == 64, "rank post is one cache line");
DFCCL_STATIC_ASSERT(sizeof(struct dfccl_p2p_box) == 64, "p2p box is one cache line");
DFCCL_STATIC_ASSERT(sizeof(struct dfccl_comm_header) == 64, "comm header size");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_rank_post, key) == 0, "post key offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_rank_post, done) == 16, "post done offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_rank_post, send_reg) == 48, "post send_reg offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_p2p_box, ack) == 8, "box ack offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_p2p_box, want) == 40, "box want offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_comm_header, aborted) == 32, "aborted offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_rank_post, shape) == 56, "post shape offset");
DFCCL_STATIC_ASSERT(sizeof(struct dfccl_comm_plan) == 576, "plan size");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_comm_plan, ring) == 8, "plan ring offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_comm_plan, parent) == 72, "plan parent offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_comm_plan, algo) == 328, "plan algo offset");
DFCCL_STATIC_ASSERT(DFCCL_COMM_PLAN_OFFSET + sizeof(struct dfccl_comm_plan) <= 4096, "plan fits the header page");

/*
 * The size bucket of a message of `bytes`: bucket 0 holds 0 and 1 byte,
 * bucket k holds (2^(k-1), 2^k], the last bucket everything larger. The
 * plan and the selection table (topology/topo_select.h) share it.
 */
static inline DFCCL_HD unsigned dfccl_size_bucket(uint64_t bytes)
{
	unsigned k = 0;
	while (k + 1 < DFCCL_PLAN_BUCKETS && bytes > ((uint64_t)1 << k))
		k++;
	return k;
}

/*
 * Layout for n ranks (all offsets from the start of the region):
 *   header                                    64 bytes, then aligned to 4096
 *   NCCL-style slots: [DFCCL_COMM_SLOTS][n] posts
 *   registered slots: [DFCCL_COMM_MAX_COLLS][DFCCL_COMM_COLL_SLOTS][n] posts
 *   p2p boxes:        [n src][n dst][DFCCL_COMM_P2P_SLOTS] boxes
 *   channel words:    [DFCCL_COMM_CONN_SLOTS][n][DFCCL_COMM_MAX_CHANNELS] uint64, then aligned to 4096
 *   connectors:       [DFCCL_COMM_CONN_SLOTS][n] x DFCCL_COMM_CONN_BYTES
 * The plan lies in the header's page, at DFCCL_COMM_PLAN_OFFSET. A new memfd
 * is zero: every key, done and ack starts at 0 (nothing posted). Connectors
 * are the staging memory of the algorithms whose partial results have no
 * place in the client's buffers (reduce and reduce-scatter over rings and
 * trees); one per instance slot, so a preempted instance keeps its own.
 * The memfd is sparse: only connector pages an algorithm touched use memory.
 *
 * Channel words serve the CUDA engine, whose collective instances run on
 * several channels (blocks of the daemon kernel) at once, each over its own
 * part of the data: channel c of rank r stores DFCCL_PROGRESS(key, phase)
 * into its word of the instance slot, and channel c of every other rank
 * waits on it, so channels never wait for each other. Rank r's channel 0
 * resets its rank's words to DFCCL_PROGRESS(key, 0) before it publishes
 * `key`, as the progress word of the post. Everything before the connectors
 * is what a GPU engine maps (DFCCL_COMM_SYNC_BYTES).
 */
#define DFCCL_COMM_CONN_SLOTS (DFCCL_COMM_SLOTS + DFCCL_COMM_MAX_COLLS * DFCCL_COMM_COLL_SLOTS)
#define DFCCL_COMM_SLOTS_OFFSET ((uint64_t)4096)
#define DFCCL_COMM_REG_OFFSET(n) \
	(DFCCL_COMM_SLOTS_OFFSET + (uint64_t)DFCCL_COMM_SLOTS * (n) * sizeof(struct dfccl_rank_post))
#define DFCCL_COMM_P2P_OFFSET(n)                                                                   \
	(DFCCL_COMM_REG_OFFSET(n) +                                                               \
	 (uint64_t)DFCCL_COMM_MAX_COLLS * DFCCL_COMM_COLL_SLOTS * (n) * sizeof(struct dfccl_rank_post))
#define DFCCL_COMM_CHAN_OFFSET(n) \
	(DFCCL_COMM_P2P_OFFSET(n) + (uint64_t)(n) * (n)*DFCCL_COMM_P2P_SLOTS * sizeof(struct dfccl_p2p_box))
#define DFCCL_COMM_CONN_OFFSET(n)                                                                      \
	((DFCCL_COMM_CHAN_OFFSET(n) + (uint64_t)DFCCL_COMM_CONN_SLOTS * (n)*DFCCL_COMM_MAX_CHANNELS * 8u + \
	  4095u) &                                                                                     \
	 ~(uint64_t)4095u)
#define DFCCL_COMM_SYNC_BYTES(n) DFCCL_COMM_CONN_OFFSET(n)
#define DFCCL_COMM_REGION_SIZE(n) \
	(DFCCL_COMM_CONN_OFFSET(n) + (uint64_t)DFCCL_COMM_CONN_SLOTS * (n)*DFCCL_COMM_CONN_BYTES)

/* The status a communicator fails with, from its region's `aborted` word
 * (0: healthy): whoever wrote the word meant an abort, so a value that is
 * no status still fails the tasks, with the generic one. */
static inline DFCCL_HD uint32_t dfccl_comm_abort_status(uint64_t aborted)
{
	if (aborted == 0)
		return DFCCL_CQ_OK;
	return aborted < DFCCL_CQ_STATUS_COUNT_ ? (uint32_t)aborted : (uint32_t)DFCCL_CQ_ABORTED;
}

static inline DFCCL_HD struct dfccl_comm_plan *dfccl_comm_plan_of(void *region)
{
	return (struct dfccl_comm_plan *)((char *)region + DFCCL_COMM_PLAN_OFFSET);
}

/* The post of `rank` for NCCL-style key `key` (>= 1). */
static inline DFCCL_HD struct dfccl_rank_post *dfccl_comm_post(void *region, uint32_t n, uint64_t key, uint32_t rank)
{
	uint64_t slot = key % DFCCL_COMM_SLOTS;
	return (struct dfccl_rank_post *)((char *)region + DFCCL_COMM_SLOTS_OFFSET) + slot * n + rank;
}

/* The post of `rank` for run `run` (>= 1) of registered collective coll_id. */
static inline DFCCL_HD struct dfccl_rank_post *dfccl_comm_reg_post(void *region, uint32_t n, uint32_t coll_id, uint64_t run,
                                                          uint32_t rank)
{
	uint64_t slot = (uint64_t)coll_id * DFCCL_COMM_COLL_SLOTS + run % DFCCL_COMM_COLL_SLOTS;
	return (struct dfccl_rank_post *)((char *)region + DFCCL_COMM_REG_OFFSET(n)) + slot * n + rank;
}

/* The connector slot of NCCL-style key `key`, and of run `run` of
 * registered collective coll_id: the instance slot of their posts. */
static inline DFCCL_HD uint32_t dfccl_comm_conn_slot(uint64_t key)
{
	return (uint32_t)(key % DFCCL_COMM_SLOTS);
}

static inline DFCCL_HD uint32_t dfccl_comm_reg_conn_slot(uint32_t coll_id, uint64_t run)
{
	return DFCCL_COMM_SLOTS + coll_id * DFCCL_COMM_COLL_SLOTS + (uint32_t)(run % DFCCL_COMM_COLL_SLOTS);
}

/* The connector of `rank` in instance slot `slot`. */
static inline DFCCL_HD char *dfccl_comm_conn(void *region, uint32_t n, uint32_t slot, uint32_t rank)
{
	return (char *)region + DFCCL_COMM_CONN_OFFSET(n) + ((uint64_t)slot * n + rank) * DFCCL_COMM_CONN_BYTES;
}

/* The progress word of channel ch of `rank` in instance slot `slot`. */
static inline DFCCL_HD uint64_t *dfccl_comm_chan(void *region, uint32_t n, uint32_t slot, uint32_t rank, uint32_t ch)
{
	return (uint64_t *)((char *)region + DFCCL_COMM_CHAN_OFFSET(n)) +
	       ((uint64_t)slot * n + rank) * DFCCL_COMM_MAX_CHANNELS + ch;
}

/* The mailbox of message `key` (>= 1) from src to dst. */
static inline DFCCL_HD struct dfccl_p2p_box *dfccl_comm_box(void *region, uint32_t n, uint32_t src, uint32_t dst, uint64_t key)
{
	uint64_t idx = ((uint64_t)src * n + dst) * DFCCL_COMM_P2P_SLOTS + key % DFCCL_COMM_P2P_SLOTS;
	return (struct dfccl_p2p_box *)((char *)region + DFCCL_COMM_P2P_OFFSET(n)) + idx;
}

/*
 * Whether a rank other than the submitter of entry e (not yet checked) has
 * posted the instance e names, in the region of its communicator of n
 * ranks: a collective's post, for a receive the sender's message, for a
 * send the receiver's `want`. An engine admits such an entry even when its
 * queue pair has no room left (scheduler.h), since it completes an
 * instance that holds other ranks' places rather than holding one of its
 * own; without that, ranks that submit more collectives than their
 * guarantee in different orders could wait for each other's entries
 * forever while other sessions fill the shared part.
 */
static inline DFCCL_HD int dfccl_comm_peer_posted(void *region, uint32_t n, const struct dfccl_sqe *e)
{
	uint64_t key = e->comm_seq;
	if (key == 0 || e->rank >= n)
		return 0;
	if (e->opcode == DFCCL_OP_RECV)
		return e->peer < n && e->peer != e->rank &&
		       *(volatile uint64_t *)&dfccl_comm_box(region, n, e->peer, e->rank, key)->key == key;
	if (e->opcode == DFCCL_OP_SEND)
		return e->peer < n && e->peer != e->rank &&
		       *(volatile uint64_t *)&dfccl_comm_box(region, n, e->rank, e->peer, key)->want == key;
	if (e->opcode == DFCCL_OP_NOP || e->opcode >= DFCCL_OP_COUNT_)
		return 0;
	int registered = (e->flags & DFCCL_SQE_F_REGISTERED) != 0;
	if (registered && e->coll_id >= DFCCL_COMM_MAX_COLLS)
		return 0;
	for (uint32_t r = 0; r < n; r++) {
		if (r == e->rank)
			continue;
		struct dfccl_rank_post *p = registered ? dfccl_comm_reg_post(region, n, e->coll_id, key, r)
		                                       : dfccl_comm_post(region, n, key, r);
		if (*(volatile uint64_t *)&p->key == key)
			return 1;
	}
	return 0;
}

#endif /* DFCCL_COMM_H */
