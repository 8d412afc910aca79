/*
 * The collectives of the host engine, one task at a time: the instance
 * protocol of proto/dfccl_comm.h (post, wait for the peers' posts, work in
 * phases, finish together) and the data movement, on direct access to every
 * rank's registered buffers.
 *
 * A task is a collective of one rank: a static context copied from its entry
 * (buffers, count, types, its instance's slot) and a dynamic context (the
 * step it is at, the element position inside that step, the first rank a
 * wait has not yet seen ready). host_coll_step() runs a task from where it
 * stopped until it completes, or a wait on a peer outlasts the spin
 * threshold (the task is preempted), or it used its byte budget for one
 * visit (it yields so the other tasks of the engine are not starved). Every
 * step either finishes or records exactly how far it got, so a resumed task
 * neither repeats a store that peers read nor skips work; data steps are
 * idempotent over the range they record as not yet done.
 *
 * Algorithms (the element order of every reduction is rank 0, 1, ..., n-1,
 * the same on every rank):
 *   allreduce      two-shot: rank r reduces chunk r of every rank's send
 *                  buffer into its own receive buffer, publishes phase 1,
 *                  and once every rank has, copies chunk t from rank t's
 *                  receive buffer for every t != r. In-place is safe: in
 *                  phase 1 a rank writes only its own chunk, which nobody
 *                  else reads then, and phase 2 overwrites the other chunks
 *                  only after every rank finished reading them.
 *   allgather      copy every rank's send buffer into its block.
 *   reducescatter  reduce block r of every rank's send buffer.
 *   broadcast      copy the root's send buffer.
 *   reduce         the root reduces every rank's send buffer.
 *   send/recv      the receiver copies from the sender's buffer, through the
 *                  pair's mailbox.
 *
 * Ring and tree algorithms (gpu/algo.h) run all-reduce, all-gather,
 * reduce-scatter, broadcast and reduce when the entry's `algo` hint, else
 * the engine's setting, else the communicator's plan (the selection table
 * for the collective and its size) asks for one the engine runs. Their
 * reduction order differs from the direct algorithms', so results are the
 * same only where the arithmetic is exact. Send/receive, all-to-all and a
 * communicator of one rank always run direct.
 *
 * Every rank posts the shape of its entry (opcode, type, operation,
 * algorithm) and its root next to its count; ranks that disagree on any of
 * them fail with DFCCL_CQ_MISMATCH before anything is moved, instead of
 * running two algorithms against each other, and the communicator is
 * aborted (its later collectives would be matched against the wrong
 * instances).
 */
#ifndef DFCCL_HOST_COLL_H
#define DFCCL_HOST_COLL_H

#include <stdint.h>

#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "dfccl_stats.h"
#include "algo.h"
#include "host_engine.h"
#include "scheduler.h"
#include "sq.h"

/* A communicator as one engine knows it. */
struct host_comm {
	uint64_t comm_id;
	uint32_t nranks;
	uint32_t abort_status;           /* the engine's abort table: nonzero once aborted here */
	struct dfccl_comm_header *hdr;   /* the shared region */
	size_t region_size;
	struct algo_topo topo;           /* its plan: ring, trees, algorithm per size */
	struct engine_member members[]; /* by rank */
};

/* What a task needs from its engine. */
struct host_coll_env {
	const struct sched_params *params;
	struct dfccl_worker_stats *stats;
	sq_reg_lookup_fn reg_lookup;
	void *reg_ctx;
	uint32_t device;
	uint64_t visit_bytes; /* bytes a task may move in one visit before it yields */
	void (*nap)(void);    /* how a long wait gives up the core (host_coll_nap) */
};

struct host_task {
	/* static context: from the entry, fixed for the task's life */
	struct sq_queue *q;
	struct host_comm *comm;
	uint64_t seq;      /* the entry: where its completion goes */
	uint64_t group_last; /* its group (DFCCL_SQE_F_GROUP, sqe_group): the last entry's sequence, */
	uint32_t group_n;    /* and how many entries it has (0: none) */
	uint64_t key;      /* the instance: comm_seq */
	uint64_t count;
	uint64_t send_off, recv_off;
	uint32_t send_reg, recv_reg;
	uint32_t rank;
	uint32_t peer;     /* root (broadcast, reduce) or the other rank (send, recv) */
	uint32_t dsize;
	uint8_t opcode, dtype, redop;
	uint8_t algo;      /* enum dfccl_algo: DIRECT, or the ring or tree algorithm in alg */
	uint32_t conn_slot;            /* the instance slot of the connectors */
	struct algo_run alg;          /* ring and trees: the algorithm's static context */
	struct dfccl_rank_post *posts; /* collectives: the instance's slot, posts[r] for every rank */
	struct dfccl_p2p_box *box;     /* send/recv: the pair's mailbox */
	uint64_t slot_free;            /* the slot is free once every rank's done >= this */
	/* dynamic context */
	uint32_t step;
	uint32_t astep;     /* ring and trees: the algorithm step, which is also the progress phase done */
	struct algo_step cur; /* ring and trees: step astep's description (algo_step_get) */
	uint32_t wait_rank; /* the current wait has seen ranks below this ready */
	uint64_t pos;       /* elements done in the current data step */
	uint32_t status;    /* the completion status, once the task is done */
	/* engine bookkeeping */
	uint8_t where;
	uint32_t next;
	uint32_t idle;      /* visits in a row that found it blocked (set by the engine) */
};

/*
 * A task found blocked more than HOST_IDLE_GRACE visits in a row waits for
 * peers that are not coming soon (a rank that never joins, a job stopped in
 * a debugger): its waits look once instead of spinning, so that one
 * session's stuck collectives cost the others a load each per round rather
 * than a spin (the head's is long, and yields the core now and then). It is
 * still looked at on every round, so it moves as soon as its peers do.
 */
#define HOST_IDLE_GRACE 8u

enum host_step {
	HOST_STEP_BLOCKED = 0,  /* preempted without progress */
	HOST_STEP_PROGRESS = 1, /* advanced, then preempted or yielded */
	HOST_STEP_DONE = 2,     /* finished: complete the entry with t->status */
};

/*
 * Checks what sq_check cannot, for an entry naming communicator c: the
 * rank's membership, root and peer, the comm_seq, and every buffer size the
 * collective needs against the registrations of q's session. Returns
 * DFCCL_CQ_OK or the status to complete the entry with.
 */
uint32_t host_coll_check(const struct host_coll_env *env, const struct host_comm *c, const struct sq_queue *q,
                         const struct dfccl_sqe *e);

/* Fills t from a checked entry, ready to run from its first step. algo is
 * the engine's setting (enum dfccl_algo), used when the entry has no hint. */
void host_coll_init(struct host_task *t, struct host_comm *c, struct sq_queue *q, const struct dfccl_sqe *e,
                    uint32_t algo);

/*
 * Runs t from where it stopped. position is its place in the task queue (0:
 * head), s its scheduling state (threshold boost).
 */
enum host_step host_coll_step(const struct host_coll_env *env, struct host_task *t, uint32_t position,
                              struct sched_state *s);

/* A waiting task's nap: a sleep of about a microsecond (the timer slack
 * makes it longer), which lets other processes have the core without
 * losing this one's place in the scheduler's fairness (host_coll.c). */
void host_coll_nap(void);

/* The communicator's abort status (the engine's table first, then the
 * region's word), 0 while it is healthy. */
uint32_t host_comm_aborted(const struct host_comm *c);

/* Stores status into the region's `aborted` word unless one is there
 * already, so every rank of every worker fails instead of waiting. */
void host_comm_fail(struct host_comm *c, uint32_t status);

#endif /* DFCCL_HOST_COLL_H */
