/*
 * The engine of a worker: what executes its device's collectives.
 *
 * A worker process (daemon/worker.c) owns one device and one engine. The
 * worker keeps the control plane -- its socket to the supervisor, the
 * mappings of queue pairs, registrations and communicator regions -- and
 * hands each of them to the engine; the engine takes submissions from the
 * queue pairs and completes them. Two engines implement this interface:
 *
 *   host  (gpu/host/host_engine.h): CPU threads of the worker take the
 *         entries and run the collectives on host shared memory.
 *   cuda  (gpu/cuda/cuda_engine.h): a persistent daemon kernel on the GPU
 *         takes the entries straight from the queue pairs and runs the
 *         collectives on GPU (or host-registered) memory; the worker's CPU
 *         only launches it, wakes sleeping clients and keeps its tables.
 *
 * The worker's loop is the same for both (engine_poll, then pause or sleep
 * as the engine says), and so are its control messages and its fault
 * handling. Threading: the worker's single thread calls everything here.
 */
#ifndef DFCCL_ENGINE_H
#define DFCCL_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "dfccl_comm.h"
#include "dfccl_stats.h"
#include "scheduler.h"
#include "sq.h"

enum engine_kind { ENGINE_HOST = 1, ENGINE_CUDA = 2 };

/* The engines' clock: CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t engine_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* What kind of memory a registration is, as the worker received it. */
enum engine_mem {
	ENGINE_MEM_HOST = 1,        /* host shared memory, mapped by the worker at sq_reg.base */
	ENGINE_MEM_CUDA_IPC = 2,    /* GPU memory: a legacy CUDA IPC handle of a whole allocation */
	ENGINE_MEM_CUDA_VMM_FD = 3, /* GPU memory: a VMM allocation exported as a POSIX file descriptor */
};

/* Where a registration's memory comes from (struct sq_reg says which range
 * of it and whose it is). */
struct engine_mem_src {
	int mem;           /* enum engine_mem */
	const void *ipc;   /* ENGINE_MEM_CUDA_IPC: the handle */
	size_t ipc_len;
	int fd;            /* ENGINE_MEM_CUDA_VMM_FD: the descriptor, borrowed (the caller closes it) */
	uint64_t offset;   /* GPU kinds: the buffer's start inside the allocation */
};

struct engine_config {
	uint32_t device;                  /* the worker's device */
	struct sched_params sched;        /* thresholds and ordering (all zero: defaults) */
	struct dfccl_worker_stats *stats; /* the shared statistics page */
	sq_reg_lookup_fn reg_lookup;      /* the worker's registrations, by id */
	void *reg_ctx;
	uint32_t algo;                    /* enum dfccl_algo: for entries without a hint */
	uint32_t channels;                /* cuda: blocks of the daemon kernel */
	uint32_t spread_blocks;           /* cuda: 1: a collective starts on a block chosen by its instance */
	uint64_t kernel_idle_ns;          /* cuda: idle time before the daemon kernel quits */
	uint32_t resident_blocks;         /* cuda: resident blocks beside a bulk block per channel (0: one grid) */
	uint64_t bulk_idle_ns;            /* cuda: idle time before a bulk block leaves */
	uint32_t gate;                    /* cuda: 1: a stopped kernel's launch waits on the GPU for the next
	                                   * stream-ordered entry's arm (cuda_engine.cu, ce_gate_open) */
	uint64_t gate_idle_ns;            /* cuda, with gate: idle time before the kernel quits when the last
	                                   * entry it took was stream-armed (at most kernel_idle_ns) */
	uint32_t early_take;              /* cuda: 1: stream-ordered entries may be taken before their arm */
	uint32_t push_bytes;              /* cuda: largest pushed all-reduce (0: none) */
	uint32_t ll_bytes;                /* cuda: largest pushed all-reduce sent as flagged lines (0: none) */
	uint64_t visit_bytes;             /* bytes a channel moves per visit before it yields (0: the engine's default) */
	uint64_t chan_bytes;              /* cuda: a channel per this many bytes of a collective (0: the default) */
	uint64_t oneshot_bytes;           /* cuda: largest one-shot all-reduce on more than two ranks (0: none at all) */
	uint32_t max_inflight;            /* collectives of one queue pair in the engine (0: the most, scheduler.h) */
	uint32_t max_inflight_uid;        /* collectives of one uid's queue pairs in the engine (0: the default) */
};

/* A rank of a communicator, as WorkerCommAdd describes it. */
struct engine_member {
	uint32_t rank;
	uint32_t device;
	uint64_t session_id;
};

struct engine;

/*
 * Creates the engine of `kind` for cfg->device. For the cuda engine the
 * calling thread must have made the device current (devices_open_cuda).
 * Returns 0 or a negative errno with a sentence in err.
 */
int engine_new(int kind, const struct engine_config *cfg, struct engine **out, char *err, size_t errlen);
void engine_free(struct engine *e);

/* A queue pair opened by the worker (sq_queue_open, q->uid set); the
 * engine serves it until engine_qp_del, after which it completes nothing
 * more on it. */
int engine_qp_add(struct engine *e, struct sq_queue *q, char *err, size_t errlen);

/* The queue pair goes away (its session ended): its tasks are dropped
 * without completion, their communicators failed so peers do not hang.
 * On return the engine no longer touches q's memory. */
void engine_qp_del(struct engine *e, struct sq_queue *q);

/*
 * A registration the worker recorded (r stays valid until engine_reg_del):
 * for ENGINE_MEM_HOST, r->base is the worker's mapping; for the GPU kinds,
 * src names an allocation (an IPC handle, or a descriptor the engine
 * imports and maps) and the buffer is [src->offset, src->offset + r->size)
 * of it (r->base is NULL); a range past the allocation's end is refused.
 * Returns 0 or a negative errno with a sentence in err.
 */
int engine_reg_add(struct engine *e, const struct sq_reg *r, const struct engine_mem_src *src, char *err,
                   size_t errlen);

/* On return the engine no longer touches the registration's memory, and
 * holds nothing of it (mappings, imported handles, an allocation of
 * engine_mem_alloc made for this id). */
void engine_reg_del(struct engine *e, uint32_t reg_id);

/*
 * Allocates at least `size` bytes of device memory that will become
 * registration reg_id, exported as a POSIX file descriptor (*fd, the
 * caller's to close; *alloc_size: the allocation's size, a multiple of its
 * granularity). The engine holds the allocation until it maps it as
 * registration reg_id (engine_reg_add of that descriptor) or
 * engine_reg_del(reg_id). -ENOTSUP on an engine without device memory.
 * Returns 0 or a negative errno with a sentence in err.
 */
int engine_mem_alloc(struct engine *e, uint32_t reg_id, uint64_t size, int *fd, uint64_t *alloc_size, char *err,
                     size_t errlen);

/* A communicator with a rank on this device; region is its mapped shared
 * region (proto/dfccl_comm.h), kept until engine_comm_del. */
int engine_comm_add(struct engine *e, uint64_t comm_id, uint32_t nranks, const struct engine_member *members,
                    void *region, size_t region_size, char *err, size_t errlen);

/*
 * The exchange between the workers of a communicator that spans devices.
 * After engine_comm_add, each worker's engine may export a blob for the
 * other workers (the CUDA engine: a handle of the communicator's protocol
 * words in its GPU's memory); *len = 0 when it has none. The supervisor
 * collects them and, where any is not empty, hands every worker the others'
 * blobs (engine_comm_peers) before the communicator is ready: no entry runs
 * before every worker has mapped its peers. At most ENGINE_PEER_BLOB_MAX
 * bytes each. Both return 0 or a negative errno with a sentence in err.
 */
#define ENGINE_PEER_BLOB_MAX DFCCL_PEER_BLOB_MAX /* proto/dfccl_comm.h: the supervisor checks it too */

struct engine_peer_blob {
	uint32_t device; /* the worker's device */
	uint32_t len;
	const void *data;
};

int engine_comm_export(struct engine *e, uint64_t comm_id, void *blob, size_t *len, char *err, size_t errlen);
int engine_comm_peers(struct engine *e, uint64_t comm_id, const struct engine_peer_blob *peers, size_t n, char *err,
                      size_t errlen);

/* Every pending and later collective of the communicator fails with status. */
void engine_comm_abort(struct engine *e, uint64_t comm_id, uint32_t status);

/*
 * On return the engine no longer touches the communicator's region, nor
 * the memory other workers exported to it (engine_comm_peers: unmapped).
 * What it exported itself (engine_comm_export) stays allocated, since
 * other workers may still map it, until engine_comm_free: the supervisor
 * says when every worker of the communicator has let go (WorkerCommDel,
 * WorkerCommFree in proto/dfccl.proto).
 */
void engine_comm_del(struct engine *e, uint64_t comm_id);

/* Frees what engine_comm_del kept of the communicator; nothing for an id
 * it holds nothing of. */
void engine_comm_free(struct engine *e, uint64_t comm_id);

/*
 * One turn of the worker's loop: takes what is armed, runs or watches the
 * collectives, completes entries. Returns how much happened (0: nothing).
 */
unsigned engine_poll(struct engine *e);

/*
 * Whether the engine has work in flight that engine_poll must look at again
 * soon although nothing can wake the worker (tasks blocked on peers in other
 * workers, a daemon kernel running). *pause_ns says how long the worker may
 * pause before the next poll.
 */
int engine_busy(struct engine *e, uint64_t *pause_ns);

/*
 * The worker wants to block until a doorbell or a control message: the
 * engine announces SLEEPING in its queue headers and looks once more.
 * Returns 1 when the worker may block, 0 when work turned up (the engine is
 * polling again).
 */
int engine_sleep(struct engine *e);

/* The worker woke from a block: the engine polls again. */
void engine_wake(struct engine *e);

/* NULL while the engine works; a sentence once it hit an error it cannot
 * recover from in this process (a lost GPU context): the worker then exits
 * and the supervisor starts a fresh one. */
const char *engine_fatal(const struct engine *e);

/* "host" or "cuda". */
const char *engine_name(const struct engine *e);

/*
 * The implementations' side: each engine fills an ops table; engine.c
 * dispatches. impl is the engine's own object.
 */
struct engine_ops {
	const char *name;
	void (*free)(void *impl);
	int (*qp_add)(void *impl, struct sq_queue *q, char *err, size_t errlen);
	void (*qp_del)(void *impl, struct sq_queue *q);
	int (*reg_add)(void *impl, const struct sq_reg *r, const struct engine_mem_src *src, char *err, size_t errlen);
	void (*reg_del)(void *impl, uint32_t reg_id);
	/* may be NULL: no device memory */
	int (*mem_alloc)(void *impl, uint32_t reg_id, uint64_t size, int *fd, uint64_t *alloc_size, char *err,
	                 size_t errlen);
	int (*comm_add)(void *impl, uint64_t comm_id, uint32_t nranks, const struct engine_member *members, void *region,
	                size_t region_size, char *err, size_t errlen);
	/* may be NULL: nothing to export, nothing to map */
	int (*comm_export)(void *impl, uint64_t comm_id, void *blob, size_t *len, char *err, size_t errlen);
	int (*comm_peers)(void *impl, uint64_t comm_id, const struct engine_peer_blob *peers, size_t n, char *err,
	                  size_t errlen);
	void (*comm_abort)(void *impl, uint64_t comm_id, uint32_t status);
	void (*comm_del)(void *impl, uint64_t comm_id);
	void (*comm_free)(void *impl, uint64_t comm_id); /* may be NULL: comm_del keeps nothing */
	unsigned (*poll)(void *impl);
	int (*busy)(void *impl, uint64_t *pause_ns);
	int (*sleep)(void *impl);
	void (*wake)(void *impl);
	const char *(*fatal)(void *impl); /* may be NULL: never fatal */
};

#endif /* DFCCL_ENGINE_H */
