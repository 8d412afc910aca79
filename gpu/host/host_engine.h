/*
 * The host engine: executes collectives on CPU threads of a worker process,
 * over client buffers in host shared memory (registered memfds) and the
 * communicators' shared regions (proto/dfccl_comm.h).
 *
 * It is the DFCCL daemon of one device (DFCCL, section 4) on a CPU: the
 * worker hands it checked submission entries; each becomes a task with a
 * static part (what to do, on which buffers) and a dynamic part (phase and
 * position), placed in a task queue ordered FIFO or by priority
 * (gpu/scheduler.h, the policy shared with the CUDA engine). host_engine_run()
 * walks the queue; every wait on a peer spins up to the task's threshold
 * (largest for the head of the queue, raised after progress) and then the
 * task is preempted and the next one runs. A preempted task keeps its
 * dynamic context and resumes exactly where it stopped; nothing it posted is
 * ever consumed by another collective.
 *
 * Threading: one thread (the worker's loop) calls every function here.
 * Ownership: the engine maps nothing itself; the worker gives it the
 * communicator regions and a registration lookup, and every address it
 * computes is bounds-checked against a registration first.
 */
#ifndef DFCCL_HOST_ENGINE_H
#define DFCCL_HOST_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "dfccl_queue.h"
#include "dfccl_stats.h"
#include "engine.h"
#include "scheduler.h"
#include "sq.h"

struct host_engine;


struct host_engine_config {
	uint32_t device;                     /* the worker's device */
	struct sched_params sched;           /* thresholds and ordering */
	struct dfccl_worker_stats *stats;    /* counters to update (the shared stats page) */
	sq_reg_lookup_fn reg_lookup;         /* registration id -> buffer, for every session */
	void *reg_ctx;
	uint32_t algo;                       /* enum dfccl_algo: for entries without a hint */
	uint32_t max_inflight;               /* tasks one served queue pair may hold (0: SCHED_MAX_INFLIGHT) */
	uint32_t max_inflight_uid;           /* tasks the served queue pairs of one uid (sq_queue.uid) may hold
	                                      * together (0: SCHED_DEFAULT_INFLIGHT_UID) */
	uint64_t visit_bytes;                /* bytes a task moves per visit before it yields (0: the default) */
	void (*nap)(void);                   /* how a task waiting on a remote rank gives up the core
	                                      * (NULL: host_coll_nap; tests stand in for a busy node) */
};

/* Fair admission of a served queue pair's entries, and the limits per
 * queue pair and per uid: scheduler.h (sched_admit), the daemon kernel's
 * policy too. */

int host_engine_new(const struct host_engine_config *cfg, struct host_engine **out);
void host_engine_free(struct host_engine *e);

/*
 * A communicator with at least one rank on this device. region is the
 * mapped communicator region (DFCCL_COMM_REGION_SIZE(nranks) bytes, header
 * checked by the caller); the engine keeps the pointer until comm_del.
 * Returns 0 or a negative errno.
 */
int host_engine_comm_add(struct host_engine *e, uint64_t comm_id, uint32_t nranks,
                         const struct engine_member *members, void *region, size_t region_size);

/* The communicator failed (a peer lost, an abort, a device lost): every
 * pending task of it completes with `status` (a DFCCL_CQ_*), and so does
 * every later entry naming it. */
void host_engine_comm_abort(struct host_engine *e, uint64_t comm_id, uint32_t status);

/* The communicator is gone: its tasks fail with DFCCL_CQ_BAD_COMM (none
 * should be left), and the region pointer is released. */
void host_engine_comm_del(struct host_engine *e, uint64_t comm_id);

/*
 * A checked entry (sq_check passed, opcode is not NOP) taken from queue q.
 * The engine validates what only it can (the communicator, that the
 * entry's rank belongs to q's session, root/peer ranges, buffer sizes the
 * collective needs) and either queues a task or completes the entry at once
 * with an error status through sq_complete(q, ...).
 */
void host_engine_submit(struct host_engine *e, struct sq_queue *q, const struct dfccl_sqe *sqe);

/*
 * An entry of queue q that failed sq_check with `status`: completes it, and
 * when it names a communicator of this engine and a rank of q's session,
 * fails that communicator on every rank (CAS of the region's `aborted`),
 * since the rank's peers would otherwise wait for its part forever.
 * host_engine_submit does the same for the entries it refuses.
 */
void host_engine_refuse(struct host_engine *e, struct sq_queue *q, const struct dfccl_sqe *sqe, uint32_t status);

/*
 * Runs the task queue once around. Returns the number of tasks that made
 * progress (completed or advanced a phase); 0 means every task is blocked
 * on a peer, or there are none.
 */
unsigned host_engine_run(struct host_engine *e);

/* Tasks queued (blocked or runnable). */
unsigned host_engine_pending(const struct host_engine *e);

/* Tasks the engine has room for now (its task storage), for tests of its
 * memory bound. */
unsigned host_engine_capacity(const struct host_engine *e);

/* Queue q is going away (its session ended): its tasks are dropped without
 * completion (nobody can read it) after leaving their instances in a state
 * that fails the peers rather than hanging them. */
void host_engine_queue_gone(struct host_engine *e, struct sq_queue *q);

/*
 * The host engine behind the worker's engine interface (gpu/engine.h): it
 * serves the queue pairs given with qp_add (takes armed entries as fair
 * admission allows, checks them with sq_check and submits them) and runs
 * its task queue on each poll. Creates an engine from the common
 * configuration.
 */
int host_engine_ops_new(const struct engine_config *cfg, const struct engine_ops **ops, void **impl);

#endif /* DFCCL_HOST_ENGINE_H */
