/*
 * See cuda_engine.h. State of the daemon kernel as the host side sees it:
 *
 *   STOPPED --(an armed entry)--> RUNNING --(the kernel quit: idle)--> STOPPED
 *      |                           ^  |
 *      |                           |  +--(a CUDA error)--> FAILED (fatal)
 *      +--(gate: an entry posted --+
 *          for a stream to arm)       the launch queued on the kernel's stream
 *                                     behind a wait on that entry's arm word:
 *                                     counted as RUNNING from then on
 *
 * Table updates go through `ctl_stream`, a non-blocking stream beside the
 * kernel's own, so they are carried out while the kernel runs; each update
 * waits for its copy to land before the next step of the protocol in
 * dkernel.h. Everything here runs on the worker's single thread.
 */
#include <cuda.h> /* before cudrv.h, which then takes the driver's types from it */

/* The project's headers are C. */
extern "C" {
#include "cuda_engine.h"
#include "cudrv.h"
#include "queue.h"
}

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "dkernel.h"

/* A channel per this many bytes of a collective (up to `channels`;
 * `chan-bytes`). */
#define CE_CHAN_BYTES (256u << 10)
/* Bytes a channel moves in one visit before the next task of its block gets
 * its turn (`visit-bytes`): each visit, and each piece of data, costs about
 * 13 us beyond its data on H200 (9 when its task goes on alone), against
 * 260-420 us for a 4 MiB visit's data, which is also about how long a task
 * that arrives on a busy block may wait for its turn (tests/perf/RESULTS.md,
 * seventeenth run). */
#define CE_VISIT_BYTES (4u << 20)
/* While the kernel runs, the worker looks for completions to wake sleepers
 * and for the kernel's exit this often. */
#define CE_RUNNING_PAUSE_NS 20000ull
/* The same where the kernel has bulk blocks: the reader's ask for one
 * waits for the worker's next look (bulk-idle-us keeps them running
 * through a job's collectives, so a job pays this at its first); and
 * while a launch waits behind a gate (ce_gate_open). */
#define CE_BULK_PAUSE_NS 4000ull
/* Tasks in the kernel per resident block from which single-channel ones go
 * to the bulk blocks too (dk_params.spill_at, dk_spills): a lone
 * collective, or a few on several streams, stays on the resident grid, a
 * batch spreads. */
#define CE_SPILL_PER_RESIDENT 4u
/* Longest pause between looks at entries a stream has still to arm, while
 * the kernel is not running: the delay it adds to such a call. */
#define CE_UNARMED_PAUSE_NS 10000ull
/* Counters of struct dk_block_stats that go to the statistics page. */
#define CE_NCOUNTERS DK_NCOUNTERS
/* A kernel that does not park within this long is stuck: fatal. */
#define CE_PARK_TIMEOUT_NS 5000000000ull

struct ce_qp {
	struct sq_queue *q; /* NULL: free slot */
	uint64_t *taken;    /* device memory */
	char *dev_sq;       /* the entries as the GPU sees them (the gate's wait) */
	uint64_t last_completed;
	uint32_t gen;
	uint32_t uid_slot;  /* its uid's slot in the kernel's uid_inflight */
};

/* A uid's slot in the kernel's per-uid in-flight counts. */
struct ce_uid {
	uint32_t uid;
	uint32_t nqps; /* queue pairs of this uid served now (0: the slot may be given to another uid) */
};

struct ce_reg {
	struct ce_reg *next;
	uint32_t reg_id;
	uint32_t slot;      /* in the device hash table */
	int mem;            /* enum engine_mem: how it was mapped */
	void *ipc_ptr;      /* CUDA IPC: the opened allocation */
	struct cudrv_vmm vmm; /* VMM: the imported and mapped allocation */
	void *host_base;    /* host-registered: the registered start */
	char *dev_base;
	uint64_t session_id, size; /* whose it is, and its bytes from dev_base (ce_release_words) */
};

/* An allocation of ce_mem_alloc, held until this worker maps it as its
 * registration or the registration is dropped. */
struct ce_alloc {
	struct ce_alloc *next;
	uint32_t reg_id;
	unsigned long long handle;
};

/* What ce_comm_del kept of a communicator: the memory it exported, which
 * other GPUs' workers may still map, until ce_comm_free. */
struct ce_kept {
	struct ce_kept *next;
	uint64_t comm_id;
	void *sync;
	char *conn;
};

struct ce_comm {
	uint64_t comm_id;   /* 0: free slot */
	void *region;
	char *conn;         /* device memory: the connectors of this device's ranks, one after the other in
	                     * rank order; NULL where the GPU had no memory for them */
	int conn_unshared;  /* they could not be exported: every GPU runs without them */
	void *sync;         /* device memory: the protocol words (dk_comm.sync) */
	uint32_t nranks;
	uint32_t here;      /* its ranks on this device */
	uint32_t npeers;
	void *peer[DK_MAX_PEERS];      /* the other GPUs' copies, mapped (cudaIpcOpenMemHandle) */
	void *peer_conn[DK_MAX_PEERS]; /* their ranks' connectors, mapped (NULL: they have none) */
	uint32_t device[DFCCL_COMM_MAX_RANKS]; /* by rank */
	uint32_t gen;
	struct ce_kept *keep; /* ce_comm_export handed out its memory, which other GPUs may map: where
	                       * ce_comm_del keeps it (allocated by the export, so keeping cannot fail) */
};

struct cuda_engine {
	struct engine_config cfg;
	struct dfccl_worker_stats *stats;
	cudaStream_t kstream, ctl_stream;
	cudaStream_t bstream[DK_MAX_BLOCKS]; /* each bulk block's (dk_params.bulk0), made at its first launch */
	struct dk_state *dst;  /* device */
	struct dk_host *host;  /* mapped pinned host memory */
	struct dk_host *host_dev;
	struct dk_params params;
	struct ce_qp qps[DK_MAX_QPS];
	struct ce_uid uids[DK_MAX_QPS];
	struct ce_comm comms[DK_MAX_COMMS];
	uint8_t reg_used[DK_REG_CAP]; /* mirror of the device table's states */
	struct ce_reg *regs;
	struct ce_alloc *allocs;
	struct ce_kept *kept;
	uint64_t stats_base[CE_NCOUNTERS]; /* the page's counters when this engine started (they survive restarts) */
	uint64_t block_base[DK_MAX_BLOCKS]; /* the page's by_block then */
	DFCCL_STATIC_ASSERT(DK_MAX_BLOCKS <= DFCCL_STATS_BLOCKS, "every block has its counter on the page");
	uint32_t nqps;          /* queue-pair slots below this may be in use */
	uint32_t ncomms;        /* communicator slots below this may be in use */
	int running;
	uint32_t bulk_launched[DK_MAX_BLOCKS]; /* launches of each bulk block (dk_host.bulk_exits: ended) */
	uint32_t bulk_seen[DK_MAX_BLOCKS];     /* dk_host.bulk_want at each block's last launch asked for */
	int resume;             /* the kernel left with tasks in flight: launch it again */
	/* The gate (engine_config.gate): a launch queued on kstream behind a
	 * stream wait on entry `seq` of queue pair `qp` being armed. */
	struct {
		int queued;         /* the launch waits there (running is 1 too) */
		uint32_t qp;
		uint64_t seq;
	} gate;
	char *trace_path;       /* DK_TRACE_ENV: where the kernel's trace goes at the end */
	char fatal[256];
};

/*
 * The statistics page's counters that the kernel's per-block counters
 * (struct dk_block_stats, in its order) add up to.
 */
static void ce_page_counters(struct dfccl_worker_stats *s, uint64_t *out[CE_NCOUNTERS])
{
	out[0] = &s->completed;
	out[1] = &s->errors;
	out[2] = &s->preemptions;
	out[3] = &s->context_switches;
	out[4] = &s->spins;
	for (int a = DFCCL_ALGO_DIRECT; a < DFCCL_ALGO_COUNT_; a++)
		out[5 + a - DFCCL_ALGO_DIRECT] = &s->by_algo[a];
	out[5 + DFCCL_ALGO_COUNT_ - 1] = &s->early_taken;
	out[6 + DFCCL_ALGO_COUNT_ - 1] = &s->early_given_back;
}

static int ce_failed(struct cuda_engine *e, cudaError_t rc, const char *what)
{
	if (rc == cudaSuccess)
		return 0;
	if (!e->fatal[0])
		snprintf(e->fatal, sizeof(e->fatal), "GPU %u: %s: %s", e->cfg.device, what, cudaGetErrorString(rc));
	return 1;
}

static void ce_gate_open(struct cuda_engine *e);

/* Copies bytes of host memory into the device state at `off` and waits for
 * the copy to land, so the next word written is seen after it. A launch
 * behind a gate starts first: the stream wait ahead of it stalls its
 * hardware queue, which the control stream may share (the driver maps
 * streams onto CUDA_DEVICE_MAX_CONNECTIONS queues), and the copy would
 * wait for the client. */
static int ce_put(struct cuda_engine *e, void *dev, const void *src, size_t bytes)
{
	ce_gate_open(e);
	cudaError_t rc = cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, e->ctl_stream);
	if (rc == cudaSuccess)
		rc = cudaStreamSynchronize(e->ctl_stream);
	return ce_failed(e, rc, "updating the daemon kernel's tables") ? -EIO : 0;
}

static int ce_put32(struct cuda_engine *e, uint32_t *dev, uint32_t v)
{
	return ce_put(e, dev, &v, sizeof(v));
}

/* Reads a word of the kernel's state (parked or not: it is only read);
 * as ce_put, after opening a gate. */
static int ce_get32(struct cuda_engine *e, const uint32_t *dev, uint32_t *v)
{
	ce_gate_open(e);
	cudaError_t rc = cudaMemcpyAsync(v, dev, sizeof(*v), cudaMemcpyDeviceToHost, e->ctl_stream);
	if (rc == cudaSuccess)
		rc = cudaStreamSynchronize(e->ctl_stream);
	return ce_failed(e, rc, "reading the daemon kernel's state");
}

/* The address of a field of the device state (computed, never dereferenced here). */
#define OFF(field) (&e->dst->field)

/* The first bulk block with a launch not ended, or 0 (none is a bulk
 * block). */
static uint32_t ce_bulk_running(const struct cuda_engine *e)
{
	for (uint32_t b = e->params.bulk0; e->params.bulk0 && b < e->params.blocks; b++)
		if (__atomic_load_n(&e->host->bulk_exits[b], __ATOMIC_ACQUIRE) != e->bulk_launched[b])
			return b;
	return 0;
}

/* Notices the kernel's exit (or its failure). A bulk block says when its
 * launch ends (dk_host.bulk_exits); one that failed never does, and
 * fails the resident grid with it (a fault is the context's), or, where
 * that is gone, its stream says why. */
static void ce_check_kernel(struct cuda_engine *e)
{
	if (!e->running) {
		uint32_t b = ce_bulk_running(e);
		cudaError_t rc = b ? cudaStreamQuery(e->bstream[b]) : cudaSuccess;
		if (rc != cudaErrorNotReady)
			ce_failed(e, rc, "a bulk block of the daemon kernel failed");
		return;
	}
	cudaError_t rc = cudaStreamQuery(e->kstream);
	if (rc == cudaErrorNotReady)
		return;
	e->running = 0;
	e->gate.queued = 0; /* over, whoever opened it */
	if (ce_failed(e, rc, "the daemon kernel failed"))
		return;
	/* Idle, it leaves nothing behind; parked or stopped, it may have. */
	if (__atomic_exchange_n(&e->host->quit_voluntary, 0u, __ATOMIC_ACQ_REL))
		__atomic_fetch_add(&e->stats->kernel_quits, 1, __ATOMIC_RELAXED);
	else
		e->resume = 1;
}

/*
 * Parks the kernel: every block leaves at the top of its loop, the tasks
 * stay in device memory with their contexts, and the next launch resumes
 * them. Done before anything that maps or unmaps memory or removes a table
 * entry: such CUDA calls may wait for the device to go idle, which a
 * resident kernel whose tasks wait on a client blocked in that very call
 * would never do; and no block holds what it read from an entry afterwards.
 */
static void ce_park(struct cuda_engine *e)
{
	ce_check_kernel(e);
	if (!e->running && !ce_bulk_running(e))
		return;
	/* A launch behind a gate starts (ce_put opens it) and leaves at once. */
	if (ce_put32(e, OFF(ctl.park), 1) < 0)
		return;
	uint64_t start = engine_now_ns();
	while (e->running || ce_bulk_running(e)) {
		ce_check_kernel(e);
		if (e->fatal[0])
			return;
		if (engine_now_ns() - start > CE_PARK_TIMEOUT_NS) {
			snprintf(e->fatal, sizeof(e->fatal), "GPU %u: the daemon kernel did not park within 5 s",
			         e->cfg.device);
			return;
		}
		usleep(5);
	}
}

/* Launches bulk block b on its stream, after its last launch (dkernel.h,
 * dk_params.bulk0): rebuild as dk_params says. */
static int ce_launch_bulk(struct cuda_engine *e, uint32_t b, uint32_t rebuild)
{
	if (e->fatal[0])
		return -1;
	if (!e->bstream[b] &&
	    ce_failed(e, cudaStreamCreateWithFlags(&e->bstream[b], cudaStreamNonBlocking), "creating a bulk block's stream"))
		return -1;
	struct dk_params p = e->params;
	p.first = b;
	p.rebuild = rebuild;
	if (ce_failed(e, (cudaError_t)dk_launch(&p, e->bstream[b]), "launching a bulk block of the daemon kernel"))
		return -1;
	e->bulk_launched[b]++;
	__atomic_fetch_add(&e->stats->kernel_launches, 1, __ATOMIC_RELAXED);
	return 0;
}

/* Launches the kernel: the resident grid, and where the kernel left with
 * tasks in flight every bulk block with it, all rebuilding their queues.
 * With `gated`, the launch waits on the GPU behind a stream wait on entry
 * `seq` of queue pair qi being armed (ce_gate_open). */
static void ce_start(struct cuda_engine *e, int gated, uint32_t qi, uint64_t seq)
{
	/* A resume waits for every bulk block to be gone: one may still hold
	 * tasks its next launch must rebuild. */
	if (e->running || e->fatal[0] || (e->resume && ce_bulk_running(e)) || (gated && e->resume))
		return;
	for (uint32_t i = 0; i < e->nqps; i++)
		if (e->qps[i].q)
			sq_set_engine_state(e->qps[i].q, DFCCL_ENGINE_POLLING);
	/* quit, stop (0: the engine is not being freed), park and started, in
	 * one copy. It is waited for, as every control word: one still on its
	 * way could land after a park the host writes next. */
	static const uint32_t ctl_clear[4] = {0, 0, 0, 0};
	if (ce_put(e, OFF(ctl), ctl_clear, sizeof(ctl_clear)) < 0)
		return;
	int both = e->params.bulk0 && e->resume;
	e->resume = 0;
	if (++e->params.epoch == 0)
		e->params.epoch = 1;
	e->params.first = 0;
	e->params.rebuild = 1;
	e->params.wait_blocks = e->params.bulk0 && !both ? e->params.bulk0 : e->params.blocks;
	if (gated) {
		const struct ce_qp *p = &e->qps[qi];
		struct cudrv_stream_op wait = {
		    true, (uintptr_t)(p->dev_sq + (size_t)DFCCL_QP_SLOT(seq, p->q->n) * sizeof(struct dfccl_sqe)), seq};
		if (cudrv_stream_ops(e->kstream, &wait, 1, (int)e->cfg.device) < 0) {
			/* Nothing queued: the worker launches by itself from now. */
			fprintf(stderr, "GPU %u: no launch gate (%s): launching from the worker\n", e->cfg.device,
			        cudrv_last_error());
			e->cfg.gate = 0;
			e->params.stream_idle_ns = e->params.idle_ns;
			gated = 0;
		}
	}
	if (ce_failed(e, (cudaError_t)dk_launch(&e->params, e->kstream), "launching the daemon kernel"))
		return;
	e->running = 1;
	if (gated) {
		e->gate.queued = 1;
		e->gate.qp = qi;
		e->gate.seq = seq;
		__atomic_fetch_add(&e->stats->kernel_gated, 1, __ATOMIC_RELAXED);
	}
	__atomic_fetch_add(&e->stats->kernel_launches, 1, __ATOMIC_RELAXED);
	for (uint32_t b = e->params.bulk0; both && b < e->params.blocks; b++)
		if (ce_launch_bulk(e, b, 1) < 0)
			return;
}

/* Launches the kernel now: a launch queued behind a gate starts. */
static void ce_launch(struct cuda_engine *e)
{
	if (e->gate.queued)
		ce_gate_open(e);
	else
		ce_start(e, 0, 0, 0);
}

/* Launches the bulk blocks the queue reader asked for since the last look
 * (bulk_ask, dkernel.cu); returns how many. */
static unsigned ce_bulk_asked(struct cuda_engine *e)
{
	unsigned n = 0;
	for (uint32_t b = e->params.bulk0; e->params.bulk0 && b < e->params.blocks; b++) {
		uint32_t want = __atomic_load_n(&e->host->bulk_want[b], __ATOMIC_ACQUIRE);
		if (want == e->bulk_seen[b])
			continue;
		e->bulk_seen[b] = want;
		n += ce_launch_bulk(e, b, 0) == 0;
	}
	return n;
}

/* What the queue pairs hold that the kernel has not taken. */
enum { CE_QUEUES_EMPTY = 0, CE_QUEUES_UNARMED = 1, CE_QUEUES_ARMED = 2 };

/* The posted entries of queue pair i that the kernel may not have taken:
 * sequences [*from, *to), one lap at most (sq_head and sq_tail are both
 * client-writable). NULL where the pair is not served. */
static struct sq_queue *ce_posted(const struct cuda_engine *e, uint32_t i, uint64_t *from, uint64_t *to)
{
	struct sq_queue *q = e->qps[i].q;
	if (!q || sq_qp_state(q) != DFCCL_QP_ACTIVE)
		return NULL;
	uint64_t tail = __atomic_load_n(&q->hdr->sq_tail, __ATOMIC_ACQUIRE);
	uint64_t head = __atomic_load_n(&q->hdr->sq_head, __ATOMIC_ACQUIRE);
	if (tail >= q->n && head < tail - q->n + 1)
		head = tail - q->n + 1;
	if (head == 0)
		head = 1;
	*from = head;
	*to = tail < head ? head : tail - head < q->n ? tail + 1 : head + q->n;
	return q;
}

static uint64_t ce_arm_word(const struct sq_queue *q, uint64_t s)
{
	return __atomic_load_n(&q->sq[DFCCL_QP_SLOT(s, q->n)].arm, __ATOMIC_ACQUIRE);
}

/* An entry to gate on (ce_queues). */
struct ce_pick {
	int found;
	uint32_t qi;
	uint64_t seq;
};

/* CE_QUEUES_ARMED if some queue pair has an armed entry the kernel has not
 * taken; else CE_QUEUES_UNARMED if some entry is posted but not armed yet
 * (a stream will arm it, and cannot ring the doorbell); else EMPTY. With
 * `pick`, in the same look, the entry to gate on where none is armed: the
 * first posted and not armed of a queue pair, one whose gate the worker
 * has not opened already (its marker would pass a new wait at once). */
static int ce_queues(struct cuda_engine *e, struct ce_pick *pick)
{
	int found = CE_QUEUES_EMPTY;
	for (uint32_t i = 0; i < e->nqps; i++) {
		uint64_t from, to;
		const struct sq_queue *q = ce_posted(e, i, &from, &to);
		int pair_looked = 0; /* this pair's first entry not armed was looked at */
		for (uint64_t s = from; q && s < to; s++) {
			uint64_t a = ce_arm_word(q, s);
			/* Taken and completed already, after a head the kernel
			 * left behind (entries taken while an earlier one was not
			 * armed yet, or before an entry an early take gave back:
			 * dkernel.cu, early_take): no reason for a launch. */
			if (a == s && DFCCL_CW_SEQ(__atomic_load_n(&q->cw[DFCCL_QP_SLOT(s, q->n)], __ATOMIC_ACQUIRE)) >= s)
				continue;
			if (a == s)
				return CE_QUEUES_ARMED;
			found = CE_QUEUES_UNARMED;
			if (!pick || pick->found || pair_looked)
				continue;
			pair_looked = 1;
			if (a != DFCCL_ARM_GATE_MARK(s))
				*pick = (struct ce_pick){1, i, s};
		}
	}
	return found;
}

static int ce_armed(struct cuda_engine *e)
{
	return ce_queues(e, NULL) == CE_QUEUES_ARMED;
}

/*
 * The gate (engine_config.gate). While the kernel is stopped and a
 * stream-ordered entry is posted but not armed, its launch is queued on
 * the kernel's stream behind a stream wait (>=) on that entry's arm word,
 * so that the client's stream arming it starts the kernel on the GPU: no
 * worker in the path, and no SM held before (tests/perf/launch_path.cu:
 * 8.8 us a call under MPS against 6.4 for a resident kernel, whose SM a
 * trainer's full waves lack). The worker counts such a launch as running.
 * To launch for any other reason (another pair armed, a park, the end) it
 * opens the gate itself: it stores DFCCL_ARM_GATE_MARK(seq) into the arm
 * word where the wait does not pass yet (dfccl_arm_gate_open), which
 * passes it but is not the sequence, so neither the kernel nor ce_queues
 * takes the entry for armed; the client's own arm overwrites it. A wait
 * that never passes would leave the device busy for good, and calls that
 * wait for it idle (the reason for parking) would never return.
 */
/* Opens the queued gate, if any. */
static void ce_gate_open(struct cuda_engine *e)
{
	if (!e->gate.queued)
		return;
	e->gate.queued = 0;
	struct sq_queue *q = e->qps[e->gate.qp].q;
	/* A later lap's arm is kept too: the gate may have opened long ago,
	 * unseen (the kernel took the entry and ran on). */
	dfccl_arm_gate_open(&q->sq[DFCCL_QP_SLOT(e->gate.seq, q->n)].arm, e->gate.seq);
}

/* Wakes clients sleeping on a completion count the kernel moved, and copies
 * the kernel's counters to the statistics page. */
static unsigned ce_completions(struct cuda_engine *e)
{
	unsigned moved = 0;
	for (uint32_t i = 0; i < e->nqps; i++) {
		struct ce_qp *p = &e->qps[i];
		if (!p->q)
			continue;
		uint64_t c = __atomic_load_n(&p->q->hdr->completed, __ATOMIC_ACQUIRE);
		if (c != p->last_completed) {
			p->last_completed = c;
			queue_wake_waiters(p->q->hdr);
			moved++;
		}
	}
	uint64_t *page[CE_NCOUNTERS];
	ce_page_counters(e->stats, page);
	uint64_t sum[CE_NCOUNTERS];
	memcpy(sum, e->stats_base, sizeof(sum));
	for (uint32_t b = 0; b < DK_SLOTS; b++) {
		const volatile uint64_t *v = (const volatile uint64_t *)&e->host->block[b];
		uint64_t x[CE_NCOUNTERS];
		for (int k = 0; k < CE_NCOUNTERS; k++)
			sum[k] += x[k] = v[k];
		/* x[0], x[1]: the block's completions and errors (dk_block_stats) */
		if (b < DK_MAX_BLOCKS)
			__atomic_store_n(&e->stats->by_block[b], e->block_base[b] + x[0] + x[1], __ATOMIC_RELAXED);
	}
	for (int k = 0; k < CE_NCOUNTERS; k++)
		__atomic_store_n(page[k], sum[k], __ATOMIC_RELAXED);
	return moved;
}

/* ------------------------------------------------------------------ mappings */

/* Registers host memory with the GPU and gives its device address; on
 * failure nothing stays registered and the runtime's error is cleared. */
static cudaError_t ce_host_map(void *p, size_t bytes, void **dev)
{
	cudaError_t rc = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
	if (rc != cudaSuccess) {
		cudaGetLastError();
		return rc;
	}
	rc = cudaHostGetDevicePointer(dev, p, 0);
	if (rc != cudaSuccess) {
		cudaGetLastError();
		cudaHostUnregister(p);
	}
	return rc;
}

/* Gives back what ce_reg_add mapped, and the record. */
static void ce_reg_release(struct ce_reg *cr)
{
	if (cr->mem == ENGINE_MEM_CUDA_IPC)
		cudaIpcCloseMemHandle(cr->ipc_ptr);
	else if (cr->mem == ENGINE_MEM_CUDA_VMM_FD)
		cudrv_vmm_unmap(&cr->vmm);
	else
		cudaHostUnregister(cr->host_base);
	free(cr);
}

/* Lets go of the allocation made for registration reg_id, if it is held. */
static void ce_alloc_drop(struct cuda_engine *e, uint32_t reg_id)
{
	for (struct ce_alloc **pp = &e->allocs; *pp; pp = &(*pp)->next) {
		struct ce_alloc *a = *pp;
		if (a->reg_id != reg_id)
			continue;
		*pp = a->next;
		cudrv_vmm_release(a->handle);
		free(a);
		return;
	}
}

/* Gives back what ce_qp_add mapped and allocated for a queue pair. */
static void ce_qp_release(struct ce_qp *p)
{
	cudaFree(p->taken);
	cudaHostUnregister(p->q->hdr);
	p->q = NULL;
	p->taken = NULL;
}

/* ------------------------------------------------------------------ the engine interface */

/*
 * The slot of uid in the kernel's per-uid counts: the one its other queue
 * pairs use, else one no queue pair uses and whose count has drained (a
 * slot is never given to another uid while tasks are charged to it).
 * DK_MAX_QPS when none is free. With the kernel parked.
 */
static uint32_t ce_uid_slot(struct cuda_engine *e, uint32_t uid)
{
	uint32_t free_slot = DK_MAX_QPS;
	for (uint32_t k = 0; k < DK_MAX_QPS; k++) {
		if (e->uids[k].nqps && e->uids[k].uid == uid)
			return k;
		uint32_t charged = 1;
		if (free_slot == DK_MAX_QPS && !e->uids[k].nqps && ce_get32(e, OFF(uid_inflight[k]), &charged) == 0 &&
		    charged == 0)
			free_slot = k;
	}
	return free_slot;
}

/*
 * The device completion words (DFCCL_SQE_F_DEVICE_DONE) of q's entries that
 * the supervisor failed when this GPU's previous worker died: it stored
 * DFCCL_CQ_DEVICE_LOST into the queue's words alone, and the streams of
 * those entries wait on their device words. They get the same word now,
 * from this worker's own context, before q reads as served (libdfccl's
 * watch copies them too, but only if no worker has done it within
 * QP_WORDS_GRACE_MS: its copy goes through the client's streams). The
 * entry is the client's memory: its words count only where they name a
 * word of one of q's session's registrations.
 */
static void ce_release_words(struct cuda_engine *e, struct sq_queue *q)
{
	for (uint64_t s = q->head > q->n ? q->head - q->n : 1; s < q->head; s++) {
		uint32_t slot = DFCCL_QP_SLOT(s, q->n);
		const volatile struct dfccl_sqe *v = &q->sq[slot];
		uint16_t flags = v->flags;
		uint64_t seq = v->seq, off = v->done_off;
		uint32_t reg_id = v->done_reg;
		uint64_t w = __atomic_load_n(&q->cw[slot], __ATOMIC_ACQUIRE);
		if (!(flags & DFCCL_SQE_F_DEVICE_DONE) || seq != s || DFCCL_CW_SEQ(w) != s ||
		    DFCCL_CW_STATUS(w) != DFCCL_CQ_DEVICE_LOST || off % 8u)
			continue;
		const struct ce_reg *r = e->regs;
		while (r && r->reg_id != reg_id)
			r = r->next;
		if (!r || r->session_id != q->session_id || off > r->size || r->size - off < sizeof(w))
			continue;
		cudaError_t rc = cudaMemcpyAsync(r->dev_base + off, &w, sizeof(w), cudaMemcpyHostToDevice, e->ctl_stream);
		if (rc == cudaSuccess)
			rc = cudaStreamSynchronize(e->ctl_stream);
		if (ce_failed(e, rc, "storing a failed entry's device completion word"))
			return;
	}
}

static int ce_qp_add(void *impl, struct sq_queue *q, char *err, size_t errlen)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	uint32_t i = 0;
	while (i < DK_MAX_QPS && e->qps[i].q)
		i++;
	if (i == DK_MAX_QPS) {
		snprintf(err, errlen, "GPU %u serves %u queue pairs already", e->cfg.device, DK_MAX_QPS);
		return -ENOSPC;
	}
	struct ce_qp *p = &e->qps[i];
	ce_park(e);
	uint32_t us = ce_uid_slot(e, q->uid);
	if (us == DK_MAX_QPS) {
		snprintf(err, errlen, "GPU %u: every per-user count of the daemon kernel is in use", e->cfg.device);
		return -ENOSPC;
	}
	void *dev = NULL;
	uint64_t *taken = NULL;
	cudaError_t rc = ce_host_map(q->hdr, q->size, &dev);
	if (rc != cudaSuccess) {
		snprintf(err, errlen, "cannot register the queue region with the GPU: %s", cudaGetErrorString(rc));
		return -ENOMEM;
	}
	/* The taken words, then the groups' (zero: no group has a count). */
	const size_t taken_bytes = (size_t)q->n * sizeof(uint64_t);
	rc = cudaMalloc((void **)&taken, taken_bytes + (size_t)q->n * sizeof(struct dk_group));
	if (rc == cudaSuccess)
		rc = cudaMemcpyAsync(taken, q->taken, taken_bytes, cudaMemcpyHostToDevice, e->ctl_stream);
	if (rc == cudaSuccess)
		rc = cudaMemsetAsync((char *)taken + taken_bytes, 0, (size_t)q->n * sizeof(struct dk_group),
		                     e->ctl_stream);
	if (rc == cudaSuccess)
		rc = cudaStreamSynchronize(e->ctl_stream);
	if (rc != cudaSuccess) {
		snprintf(err, errlen, "cannot map the queue region for the GPU: %s", cudaGetErrorString(rc));
		cudaFree(taken);
		cudaHostUnregister(q->hdr);
		return -ENOMEM;
	}
	struct dk_qp d;
	memset(&d, 0, sizeof(d)); /* live = 0: the kernel ignores the slot until the second copy */
	d.gen = ++p->gen;
	d.n = q->n;
	d.session_id = q->session_id;
	d.hdr = (struct dfccl_qp_header *)dev;
	d.sq = (struct dfccl_sqe *)((char *)dev + DFCCL_QP_SQ_OFFSET);
	d.cw = (uint64_t *)((char *)dev + DFCCL_QP_CW_OFFSET(q->n));
	d.taken = taken;
	d.groups = (struct dk_group *)((char *)taken + taken_bytes);
	d.head = q->head; /* sq_queue_open's view: entries below were handled before */
	/* The kernel's count goes on from the header's, which it stores
	 * into (complete_count): a worker that went away may have completed
	 * entries of the pair, and the supervisor counts those it failed. */
	d.completed = __atomic_load_n(&q->hdr->completed, __ATOMIC_ACQUIRE);
	d.uid_slot = us;
	if (ce_put(e, OFF(qps[i]), &d, sizeof(d)) < 0 || ce_put32(e, OFF(qps[i].live), 1) < 0) {
		snprintf(err, errlen, "%s", e->fatal);
		cudaFree(taken);
		cudaHostUnregister(q->hdr);
		return -EIO;
	}
	p->q = q;
	p->taken = taken;
	p->dev_sq = (char *)d.sq;
	p->uid_slot = us;
	e->uids[us].uid = q->uid;
	e->uids[us].nqps++;
	p->last_completed = __atomic_load_n(&q->hdr->completed, __ATOMIC_ACQUIRE);
	if (i + 1 > e->nqps) {
		e->nqps = i + 1;
		ce_put32(e, OFF(ctl.nqps), e->nqps);
	}
	ce_release_words(e, q);
	sq_set_engine_state(q, e->running ? DFCCL_ENGINE_POLLING : DFCCL_ENGINE_SLEEPING);
	return 0;
}

static void ce_qp_del(void *impl, struct sq_queue *q)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	for (uint32_t i = 0; i < e->nqps; i++) {
		struct ce_qp *p = &e->qps[i];
		if (p->q != q)
			continue;
		/* The kernel drops the queue's tasks (failing their peers) on
		 * their next visit; parked, it reads nothing of the region any
		 * more. */
		ce_park(e);
		ce_put32(e, OFF(qps[i].live), 0);
		e->uids[p->uid_slot].nqps--;
		ce_qp_release(p);
		return;
	}
}

/* cuMemGetAddressRange of the driver API, reached through the runtime. */
typedef int (*ce_range_fn)(unsigned long long *base, size_t *size, unsigned long long ptr);
static ce_range_fn ce_mem_range;

/* Opens a legacy CUDA IPC handle: cr->ipc_ptr and dev_base. */
static int ce_map_ipc(struct cuda_engine *e, const struct sq_reg *r, const struct engine_mem_src *src,
                      struct ce_reg *cr, char *err, size_t errlen)
{
	cudaIpcMemHandle_t h;
	if (!src->ipc || src->ipc_len != sizeof(h)) {
		snprintf(err, errlen, "a CUDA IPC handle has %zu bytes, got %zu", sizeof(h), src->ipc_len);
		return -EINVAL;
	}
	memcpy(&h, src->ipc, sizeof(h));
	void *p = NULL;
	cudaError_t rc = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
	if (rc != cudaSuccess) {
		snprintf(err, errlen, "GPU %u cannot open the client's GPU buffer: %s", e->cfg.device,
		         cudaGetErrorString(rc));
		cudaGetLastError();
		return -EIO;
	}
	/* The client names the range; the allocation bounds it. A range
	 * past the end would let the kernel fault on memory that is not
	 * there (and lose the context of everyone on this GPU). */
	unsigned long long base = 0;
	size_t size = 0;
	uint64_t avail = 0;
	if (ce_mem_range && ce_mem_range(&base, &size, (unsigned long long)(uintptr_t)p) == 0 &&
	    base + size > (uintptr_t)p)
		avail = base + size - (uintptr_t)p;
	if (src->offset > avail || r->size > avail - src->offset) {
		snprintf(err, errlen, "range [%llu, +%llu) lies outside the %llu-byte GPU allocation",
		         (unsigned long long)src->offset, (unsigned long long)r->size, (unsigned long long)avail);
		cudaIpcCloseMemHandle(p);
		return -EINVAL;
	}
	cr->ipc_ptr = p;
	cr->dev_base = (char *)p + src->offset;
	return 0;
}

/* Imports and maps a VMM allocation's descriptor: cr->vmm and dev_base.
 * The mapping covers [0, offset + size) rounded up to the allocation's
 * granularity, and the driver refuses one past the allocation's end: that
 * bounds the registration. */
static int ce_map_vmm(struct cuda_engine *e, const struct sq_reg *r, const struct engine_mem_src *src,
                      struct ce_reg *cr, char *err, size_t errlen)
{
	if (src->fd < 0) {
		snprintf(err, errlen, "a VMM registration arrived without its file descriptor");
		return -EINVAL;
	}
	if (src->offset > UINT64_MAX - r->size) {
		snprintf(err, errlen, "range [%llu, +%llu) wraps around", (unsigned long long)src->offset,
		         (unsigned long long)r->size);
		return -EINVAL;
	}
	int rc = cudrv_vmm_import(src->fd, src->offset + r->size, (int)e->cfg.device, &cr->vmm);
	if (rc == -ERANGE) {
		snprintf(err, errlen, "range [%llu, +%llu) lies outside the GPU allocation (%s)",
		         (unsigned long long)src->offset, (unsigned long long)r->size, cudrv_last_error());
		return rc;
	}
	if (rc < 0) {
		snprintf(err, errlen, "GPU %u cannot map the client's GPU buffer: %s", e->cfg.device, cudrv_last_error());
		return rc;
	}
	cr->dev_base = (char *)cr->vmm.base + src->offset;
	return 0;
}

/* Registers host memory with the GPU: cr->host_base and dev_base. */
static int ce_map_host(struct cuda_engine *e, const struct sq_reg *r, struct ce_reg *cr, char *err, size_t errlen)
{
	/* Whole pages (the worker's mapping covers them); the kernel gets the
	 * buffer's place inside. */
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)r->base & ~(page - 1);
	uintptr_t hi = ((uintptr_t)r->base + r->size + page - 1) & ~(page - 1);
	void *dev = NULL;
	cudaError_t rc = ce_host_map((void *)lo, hi - lo, &dev);
	if (rc != cudaSuccess) {
		snprintf(err, errlen, "cannot register the host buffer with GPU %u: %s", e->cfg.device,
		         cudaGetErrorString(rc));
		return -ENOMEM;
	}
	cr->host_base = (void *)lo;
	cr->dev_base = (char *)dev + ((uintptr_t)r->base - lo);
	return 0;
}

static int ce_reg_add(void *impl, const struct sq_reg *r, const struct engine_mem_src *src, char *err, size_t errlen)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	struct ce_reg *cr = (struct ce_reg *)calloc(1, sizeof(*cr));
	if (!cr) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	cr->reg_id = r->reg_id;
	cr->mem = src->mem;
	cr->session_id = r->session_id;
	cr->size = r->size;
	ce_park(e);
	int rc;
	switch (src->mem) {
	case ENGINE_MEM_CUDA_IPC: rc = ce_map_ipc(e, r, src, cr, err, errlen); break;
	case ENGINE_MEM_CUDA_VMM_FD: rc = ce_map_vmm(e, r, src, cr, err, errlen); break;
	case ENGINE_MEM_HOST: rc = ce_map_host(e, r, cr, err, errlen); break;
	default:
		snprintf(err, errlen, "memory kind %d is unknown to the cuda engine", src->mem);
		rc = -EINVAL;
		break;
	}
	if (rc < 0) {
		free(cr);
		return rc;
	}
	uint32_t h = dk_reg_hash(r->reg_id), slot = DK_REG_CAP;
	for (uint32_t i = 0; i < DK_REG_CAP; i++) {
		uint32_t s = (h + i) & (DK_REG_CAP - 1u);
		if (e->reg_used[s] != DK_REG_LIVE) {
			slot = s;
			break;
		}
	}
	struct dk_reg d = {r->reg_id, (uint32_t)e->reg_used[slot == DK_REG_CAP ? 0 : slot], r->session_id, r->size,
	                   cr->dev_base};
	if (slot == DK_REG_CAP || ce_put(e, OFF(regs[slot]), &d, sizeof(d)) < 0 ||
	    ce_put32(e, OFF(regs[slot].state), DK_REG_LIVE) < 0) {
		snprintf(err, errlen, "%s", slot == DK_REG_CAP ? "too many registrations on this GPU" : e->fatal);
		ce_reg_release(cr);
		return -ENOSPC;
	}
	e->reg_used[slot] = DK_REG_LIVE;
	cr->slot = slot;
	cr->next = e->regs;
	e->regs = cr;
	/* An allocation of this worker's is now held by its own mapping. */
	ce_alloc_drop(e, r->reg_id);
	return 0;
}

static void ce_reg_del(void *impl, uint32_t reg_id)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	ce_alloc_drop(e, reg_id);
	for (struct ce_reg **pp = &e->regs; *pp; pp = &(*pp)->next) {
		struct ce_reg *cr = *pp;
		if (cr->reg_id != reg_id)
			continue;
		*pp = cr->next;
		/* Tasks look buffers up once per launch: parked, none
		 * holds this one, and the next launch looks again. */
		ce_park(e);
		ce_put32(e, OFF(regs[cr->slot].state), DK_REG_GONE);
		e->reg_used[cr->slot] = DK_REG_GONE;
		ce_reg_release(cr);
		return;
	}
}

/*
 * dfcclMemAlloc on this GPU: a VMM allocation exportable as a POSIX file
 * descriptor, rather than cudaMalloc and a legacy IPC handle, because a
 * descriptor is a reference to the memory that outlives this process: the
 * supervisor keeps it, so the client's buffer survives a restart of this
 * worker and the replacement maps it again, while memory of cudaMalloc
 * would be freed with the worker and a legacy IPC handle cannot be passed
 * on by a process that did not allocate it. This worker keeps its own
 * reference only until its mapping of the registration takes over.
 */
static int ce_mem_alloc(void *impl, uint32_t reg_id, uint64_t size, int *fd, uint64_t *alloc_size, char *err,
                        size_t errlen)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	struct ce_alloc *a = (struct ce_alloc *)calloc(1, sizeof(*a));
	if (!a) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* Allocating device memory may wait for the device, as cudaMalloc
	 * does: see ce_park. */
	ce_park(e);
	int rc = cudrv_vmm_create((int)e->cfg.device, size, fd, &a->handle, alloc_size);
	if (rc < 0) {
		snprintf(err, errlen, "GPU %u cannot allocate %llu bytes: %s", e->cfg.device, (unsigned long long)size,
		         cudrv_last_error());
		free(a);
		return rc;
	}
	a->reg_id = reg_id;
	a->next = e->allocs;
	e->allocs = a;
	return 0;
}

/* Connectors of one rank and its lines' area (dkernel.h, struct dk_comm). */
#define CE_CONN_RANK_BYTES ((size_t)DK_CONN_RANK_BYTES)

/* conn[r] for the ranks on `device`, which keeps their connectors at base,
 * one after the other in rank order (ce_comm_add); the other entries stay. */
static void ce_conn_place(const uint32_t *rank_device, uint32_t nranks, uint32_t device, char *base, char **conn)
{
	for (uint32_t r = 0, k = 0; r < nranks; r++)
		if (rank_device[r] == device)
			conn[r] = base + CE_CONN_RANK_BYTES * k++;
}

/* Lets go of c's slot: unmaps the other GPUs' memory and frees this
 * GPU's, or, given keep, records it there instead (ce_comm_del). */
static void ce_comm_release(struct ce_comm *c, struct ce_kept *keep)
{
	for (uint32_t k = 0; k < c->npeers; k++) {
		cudaIpcCloseMemHandle(c->peer[k]);
		if (c->peer_conn[k])
			cudaIpcCloseMemHandle(c->peer_conn[k]);
		c->peer_conn[k] = NULL;
	}
	cudaHostUnregister(c->region);
	if (keep) {
		keep->comm_id = c->comm_id;
		keep->sync = c->sync;
		keep->conn = c->conn;
	} else {
		cudaFree(c->conn);
		cudaFree(c->sync);
	}
	if (c->keep != keep)
		free(c->keep);
	c->keep = NULL;
	c->comm_id = 0;
	c->region = NULL;
	c->conn = NULL;
	c->conn_unshared = 0;
	c->sync = NULL;
	c->npeers = 0;
}

static int ce_comm_add(void *impl, uint64_t comm_id, uint32_t nranks, const struct engine_member *members,
                       void *region, size_t region_size, char *err, size_t errlen)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	if (comm_id == 0 || nranks == 0 || nranks > DFCCL_COMM_MAX_RANKS || region_size < DFCCL_COMM_REGION_SIZE(nranks)) {
		snprintf(err, errlen, "malformed communicator %llu", (unsigned long long)comm_id);
		return -EINVAL;
	}
	uint32_t i = 0;
	while (i < DK_MAX_COMMS && e->comms[i].comm_id)
		i++;
	if (i == DK_MAX_COMMS) {
		snprintf(err, errlen, "GPU %u holds %u communicators already", e->cfg.device, DK_MAX_COMMS);
		return -ENOSPC;
	}
	struct ce_comm *c = &e->comms[i];
	struct dk_comm *d = (struct dk_comm *)calloc(1, sizeof(*d));
	if (!d) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	d->gen = ++c->gen;
	d->comm_id = comm_id;
	d->nranks = nranks;
	uint32_t here = 0;
	for (uint32_t r = 0; r < nranks; r++) {
		d->session[members[r].rank] = members[r].session_id;
		d->device[members[r].rank] = members[r].device;
		c->device[members[r].rank] = members[r].device;
		here += members[r].device == e->cfg.device;
	}
	/* The plan as the region carries it; an absent or invalid one gives
	 * the defaults, the same in every worker. */
	algo_topo_load(&d->topo, dfccl_comm_plan_of(region), nranks);
	ce_park(e);
	void *dev = NULL;
	cudaError_t rc = ce_host_map(region, DFCCL_COMM_SYNC_BYTES(nranks), &dev);
	const char *what = "register its region with";
	c->region = region;
	if (rc == cudaSuccess && here) {
		/* The connectors of the ranks on this GPU (see dk_comm); the other
		 * GPUs' are mapped by ce_comm_peers. A GPU without the memory for
		 * them goes without, and says so in its blob: the communicator
		 * then runs the collectives that need them with the direct
		 * algorithms, on every GPU alike. */
		if (cudaMalloc((void **)&c->conn, CE_CONN_RANK_BYTES * here) != cudaSuccess) {
			cudaGetLastError();
			c->conn = NULL;
		}
		/* Zeroed, for the lines' flags (dk_ll_flag): the memory may have
		 * held an earlier communicator's. Ordered before the kernel's
		 * next launch by the stream's synchronisation below. */
		if (c->conn && cudaMemsetAsync(c->conn, 0, CE_CONN_RANK_BYTES * here, e->ctl_stream) != cudaSuccess) {
			cudaGetLastError();
			cudaFree(c->conn);
			c->conn = NULL;
		}
		if (c->conn)
			ce_conn_place(c->device, nranks, e->cfg.device, c->conn, d->conn);
		d->conn_all = c->conn && here == nranks;
	}
	/* The protocol words in this GPU's memory, starting as the region has
	 * them: the only copy, or this GPU's where the communicator spans
	 * several (ce_comm_peers maps the others'). */
	if (rc == cudaSuccess) {
		what = "allocate its protocol words on";
		rc = cudaMalloc(&c->sync, DFCCL_COMM_SYNC_BYTES(nranks));
	}
	if (rc == cudaSuccess)
		rc = cudaMemcpyAsync(c->sync, region, DFCCL_COMM_SYNC_BYTES(nranks), cudaMemcpyHostToDevice, e->ctl_stream);
	if (rc == cudaSuccess)
		rc = cudaStreamSynchronize(e->ctl_stream);
	if (rc != cudaSuccess) {
		cudaGetLastError();
		snprintf(err, errlen, "cannot %s GPU %u for communicator %llu: %s", what, e->cfg.device,
		         (unsigned long long)comm_id, cudaGetErrorString(rc));
		free(d);
		if (dev)
			ce_comm_release(c, NULL);
		c->region = NULL;
		return -ENOMEM;
	}
	d->hdr = (struct dfccl_comm_header *)dev;
	d->sync = (struct dfccl_comm_header *)c->sync;
	d->mirror = (int64_t)((char *)d->hdr - (char *)d->sync);
	c->here = here;
	c->nranks = nranks;
	int bad = ce_put(e, OFF(comms[i]), d, sizeof(*d)) < 0 || ce_put32(e, OFF(comms[i].live), 1) < 0;
	free(d);
	if (bad) {
		snprintf(err, errlen, "%s", e->fatal);
		ce_comm_release(c, NULL);
		return -EIO;
	}
	c->comm_id = comm_id;
	if (i + 1 > e->ncomms) {
		e->ncomms = i + 1;
		ce_put32(e, OFF(ctl.ncomms), e->ncomms);
	}
	return 0;
}

static struct ce_comm *ce_comm_find(struct cuda_engine *e, uint64_t comm_id, uint32_t *index)
{
	for (uint32_t i = 0; i < DK_MAX_COMMS; i++)
		if (e->comms[i].comm_id == comm_id && comm_id) {
			*index = i;
			return &e->comms[i];
		}
	return NULL;
}

/*
 * What the workers of a communicator's other GPUs need to map this GPU's
 * copy of its protocol words and the connectors of its ranks: CUDA IPC
 * handles of the allocations and their sizes. Only where the communicator
 * spans GPUs.
 */
struct ce_peer_blob {
	uint32_t magic; /* CE_PEER_MAGIC */
	uint32_t device;
	uint64_t bytes;                 /* the protocol words' */
	cudaIpcMemHandle_t handle;      /* of the protocol words */
	uint64_t conn_bytes;            /* the connectors of its ranks, in rank order; 0: it has none */
	cudaIpcMemHandle_t conn_handle; /* of the connectors */
};
#define CE_PEER_MAGIC 0x64667332u /* "dfs2" */

static int ce_comm_export(void *impl, uint64_t comm_id, void *blob, size_t *len, char *err, size_t errlen)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	uint32_t i;
	struct ce_comm *c = ce_comm_find(e, comm_id, &i);
	*len = 0;
	if (!c) {
		snprintf(err, errlen, "GPU %u has no communicator %llu", e->cfg.device, (unsigned long long)comm_id);
		return -ENOENT;
	}
	uint32_t nranks = c->nranks;
	if (c->here == nranks)
		return 0; /* every rank is here: nothing to share */
	if (!c->keep)
		c->keep = (struct ce_kept *)calloc(1, sizeof(*c->keep));
	if (!c->keep) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	struct ce_peer_blob b;
	memset(&b, 0, sizeof(b));
	b.magic = CE_PEER_MAGIC;
	b.device = e->cfg.device;
	b.bytes = DFCCL_COMM_SYNC_BYTES(nranks);
	cudaError_t rc = cudaIpcGetMemHandle(&b.handle, c->sync);
	if (rc != cudaSuccess) {
		cudaGetLastError();
		snprintf(err, errlen, "GPU %u cannot export the protocol words of communicator %llu: %s", e->cfg.device,
		         (unsigned long long)comm_id, cudaGetErrorString(rc));
		return -EIO;
	}
	/* Connectors that cannot be shared count as none, here too
	 * (ce_comm_peers), as where there was no memory for them. */
	c->conn_unshared = 0;
	if (c->conn && cudaIpcGetMemHandle(&b.conn_handle, c->conn) == cudaSuccess) {
		b.conn_bytes = CE_CONN_RANK_BYTES * c->here;
	} else {
		cudaGetLastError();
		c->conn_unshared = c->conn != NULL;
	}
	DFCCL_STATIC_ASSERT(sizeof(b) <= ENGINE_PEER_BLOB_MAX, "a peer blob fits the exchange");
	memcpy(blob, &b, sizeof(b));
	*len = sizeof(b);
	return 0;
}

/* Maps the other GPUs' copies of the protocol words and their ranks'
 * connectors, with the kernel parked, and tells the kernel where they are
 * (dk_comm.peer_off, conn, conn_all). Every GPU of the communicator must
 * reach the same conn_all (the algorithm is part of what the ranks post):
 * a GPU without connectors says so in its blob and every GPU runs without,
 * and a mapping that fails here fails the communicator's set-up. */
static int ce_comm_peers(void *impl, uint64_t comm_id, const struct engine_peer_blob *peers, size_t n, char *err,
                         size_t errlen)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	uint32_t i;
	struct ce_comm *c = ce_comm_find(e, comm_id, &i);
	if (!c || c->npeers) {
		snprintf(err, errlen, "GPU %u: communicator %llu is %s", e->cfg.device, (unsigned long long)comm_id,
		         c ? "mapped to its peers already" : "unknown");
		return c ? -EALREADY : -ENOENT;
	}
	if (n > DK_MAX_PEERS) {
		snprintf(err, errlen, "communicator %llu spans %zu other GPUs, more than %u", (unsigned long long)comm_id,
		         n, DK_MAX_PEERS);
		return -E2BIG;
	}
	uint32_t nranks = c->nranks;
	int64_t off[DK_MAX_PEERS];
	char *conn[DFCCL_COMM_MAX_RANKS] = {NULL};
	if (c->conn && !c->conn_unshared)
		ce_conn_place(c->device, nranks, e->cfg.device, c->conn, conn);
	ce_park(e);
	for (size_t k = 0; k < n; k++) {
		struct ce_peer_blob b;
		if (peers[k].len != sizeof(b)) {
			snprintf(err, errlen, "the blob of GPU %u for communicator %llu has %u bytes, not %zu", peers[k].device,
			         (unsigned long long)comm_id, peers[k].len, sizeof(b));
			return -EINVAL;
		}
		memcpy(&b, peers[k].data, sizeof(b));
		uint32_t theirs = 0;
		for (uint32_t r = 0; r < nranks; r++)
			theirs += c->device[r] == b.device;
		if (b.magic != CE_PEER_MAGIC || b.device != peers[k].device || b.device == e->cfg.device ||
		    b.bytes != DFCCL_COMM_SYNC_BYTES(nranks) || !theirs ||
		    (b.conn_bytes && b.conn_bytes != CE_CONN_RANK_BYTES * theirs)) {
			snprintf(err, errlen, "the blob of GPU %u for communicator %llu does not describe its protocol words "
			         "and connectors",
			         peers[k].device, (unsigned long long)comm_id);
			return -EINVAL;
		}
		void *p = NULL;
		cudaError_t rc = cudaIpcOpenMemHandle(&p, b.handle, cudaIpcMemLazyEnablePeerAccess);
		if (rc != cudaSuccess) {
			cudaGetLastError();
			snprintf(err, errlen, "GPU %u cannot map the protocol words of communicator %llu on GPU %u: %s",
			         e->cfg.device, (unsigned long long)comm_id, b.device, cudaGetErrorString(rc));
			return -EIO;
		}
		c->peer_conn[c->npeers] = NULL;
		c->peer[c->npeers++] = p;
		off[k] = (int64_t)((char *)p - (char *)c->sync);
		if (!b.conn_bytes)
			continue;
		rc = cudaIpcOpenMemHandle(&p, b.conn_handle, cudaIpcMemLazyEnablePeerAccess);
		if (rc != cudaSuccess) {
			cudaGetLastError();
			snprintf(err, errlen, "GPU %u cannot map the connectors of communicator %llu on GPU %u: %s",
			         e->cfg.device, (unsigned long long)comm_id, b.device, cudaGetErrorString(rc));
			return -EIO;
		}
		c->peer_conn[c->npeers - 1] = p;
		ce_conn_place(c->device, nranks, b.device, (char *)p, conn);
	}
	uint32_t all = 1;
	for (uint32_t r = 0; r < nranks; r++)
		all = all && conn[r];
	/* The connectors and the offsets first, then the count of copies:
	 * the kernel reads the count. */
	if (ce_put(e, OFF(comms[i].conn), conn, nranks * sizeof(conn[0])) < 0 ||
	    ce_put32(e, OFF(comms[i].conn_all), all) < 0 ||
	    (n && ce_put(e, OFF(comms[i].peer_off), off, n * sizeof(off[0])) < 0) ||
	    ce_put32(e, OFF(comms[i].npeers), (uint32_t)n) < 0) {
		snprintf(err, errlen, "%s", e->fatal);
		return -EIO;
	}
	return 0;
}

static void ce_comm_abort(void *impl, uint64_t comm_id, uint32_t status)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	uint32_t i;
	struct ce_comm *c = ce_comm_find(e, comm_id, &i);
	if (!c)
		return;
	if (status == DFCCL_CQ_OK || status >= DFCCL_CQ_STATUS_COUNT_)
		status = DFCCL_CQ_ABORTED;
	/* The kernel's tasks see it on their next poll; ranks in other
	 * workers through the region's word. */
	ce_put32(e, OFF(comms[i].abort_status), status);
	uint64_t expected = 0;
	__atomic_compare_exchange_n(&((struct dfccl_comm_header *)c->region)->aborted, &expected, (uint64_t)status, 0,
	                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	if (!e->running && ce_armed(e))
		ce_launch(e);
}

/* Frees what ce_comm_del kept of comm_id, if anything. The kernel is
 * parked first: cudaFree may wait for the device. */
static void ce_kept_free(struct cuda_engine *e, uint64_t comm_id)
{
	for (struct ce_kept **pp = &e->kept; *pp; pp = &(*pp)->next) {
		struct ce_kept *k = *pp;
		if (k->comm_id != comm_id)
			continue;
		*pp = k->next;
		ce_park(e);
		cudaFree(k->conn);
		cudaFree(k->sync);
		free(k);
		return;
	}
}

/* The memory this GPU exported stays until ce_comm_free (engine.h): the
 * other GPUs' workers may not have unmapped it yet, and freeing memory
 * another process still maps through a CUDA IPC handle is undefined. */
static void ce_comm_del(void *impl, uint64_t comm_id)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	uint32_t i;
	struct ce_comm *c = ce_comm_find(e, comm_id, &i);
	if (!c)
		return;
	ce_park(e);
	ce_put32(e, OFF(comms[i].live), 0);
	struct ce_kept *k = c->keep;
	ce_comm_release(c, k);
	if (k) {
		k->next = e->kept;
		e->kept = k;
	}
}

static void ce_comm_free(void *impl, uint64_t comm_id)
{
	ce_kept_free((struct cuda_engine *)impl, comm_id);
}

static unsigned ce_poll(void *impl)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	ce_check_kernel(e);
	unsigned work = ce_completions(e) + ce_bulk_asked(e);
	if (e->running && !e->gate.queued)
		return work;
	/* Stopped, or behind a gate: one look at the queues decides. */
	struct ce_pick pick = {0, 0, 0};
	int queues = ce_queues(e, !e->running && e->cfg.gate ? &pick : NULL);
	if (!e->running && (e->resume || queues == CE_QUEUES_ARMED)) {
		ce_launch(e);
		work++;
	} else if (e->gate.queued && queues == CE_QUEUES_ARMED) {
		/* Armed elsewhere (or the gate's own entry, which opened it). */
		ce_gate_open(e);
		work++;
	} else if (!e->running && pick.found) {
		ce_start(e, 1, pick.qi, pick.seq);
	}
	return work;
}

static int ce_busy(void *impl, uint64_t *pause_ns)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	/* Behind a gate, an entry armed by a CPU (which rings no doorbell: the
	 * state says POLLING) waits for this look to open it. */
	*pause_ns = e->params.bulk0 || e->gate.queued ? CE_BULK_PAUSE_NS : CE_RUNNING_PAUSE_NS;
	if (e->running || ce_bulk_running(e))
		return 1;
	/* Entries that a stream will arm: watch them from here, as the
	 * kernel is gone and nobody rings once the stream arms one. */
	*pause_ns = CE_UNARMED_PAUSE_NS;
	return ce_queues(e, NULL) != CE_QUEUES_EMPTY;
}

static int ce_sleep(void *impl)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	ce_check_kernel(e);
	if (e->running)
		return 0;
	if (e->resume) {
		ce_launch(e);
		return 0;
	}
	for (uint32_t i = 0; i < e->nqps; i++)
		if (e->qps[i].q)
			sq_set_engine_state(e->qps[i].q, DFCCL_ENGINE_SLEEPING);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (ce_armed(e)) {
		ce_launch(e);
		return 0;
	}
	return 1;
}

static void ce_wake(void *impl)
{
	(void)impl; /* the next poll launches the kernel if something is armed */
}

static const char *ce_fatal(void *impl)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	return e->fatal[0] ? e->fatal : NULL;
}

/* Writes the kernel's event trace (dkernel.h) as text: a line per event,
 * block, nanoseconds since the first event of the trace, event, argument. */
static void ce_trace_write(struct cuda_engine *e)
{
	static const char *const names[DK_EV_COUNT_] = DK_TRACE_NAMES;
	struct dk_trace *t = (struct dk_trace *)malloc(sizeof(*t));
	FILE *f = NULL;
	if (!t || cudaMemcpy(t, e->params.trace, sizeof(*t), cudaMemcpyDeviceToHost) != cudaSuccess ||
	    !(f = fopen(e->trace_path, "w"))) {
		fprintf(stderr, "GPU %u: cannot write the kernel's trace to %s\n", e->cfg.device, e->trace_path);
		free(t);
		return;
	}
	uint64_t t0 = UINT64_MAX;
	for (uint32_t b = 0; b < DK_SLOTS; b++)
		for (uint64_t i = t->n[b] > DK_TRACE_EVENTS ? t->n[b] - DK_TRACE_EVENTS : 0; i < t->n[b]; i++) {
			uint64_t ts = t->rec[b][i & (DK_TRACE_EVENTS - 1u)].t_ns;
			t0 = ts < t0 ? ts : t0;
		}
	fprintf(f, "# block ns event arg (GPU %u; block %u: the queue reader)\n", e->cfg.device, DK_READER);
	for (uint32_t b = 0; b < DK_SLOTS; b++)
		for (uint64_t i = t->n[b] > DK_TRACE_EVENTS ? t->n[b] - DK_TRACE_EVENTS : 0; i < t->n[b]; i++) {
			const struct dk_trace_rec *r = &t->rec[b][i & (DK_TRACE_EVENTS - 1u)];
			fprintf(f, "%u %llu %s %u\n", b, (unsigned long long)(r->t_ns - t0),
			        r->event < DK_EV_COUNT_ ? names[r->event] : "?", r->arg);
		}
	fclose(f);
	free(t);
}

static void ce_free(void *impl)
{
	struct cuda_engine *e = (struct cuda_engine *)impl;
	if (!e)
		return;
	if ((e->running || ce_bulk_running(e)) && !e->fatal[0]) {
		uint32_t one = 1;
		ce_put(e, OFF(ctl.stop), &one, sizeof(one));
		uint64_t start = engine_now_ns();
		while ((e->running || ce_bulk_running(e)) && engine_now_ns() - start < 2000000000ull) {
			ce_check_kernel(e);
			usleep(100);
		}
	}
	while (e->regs) {
		struct ce_reg *cr = e->regs;
		e->regs = cr->next;
		ce_reg_release(cr);
	}
	while (e->allocs)
		ce_alloc_drop(e, e->allocs->reg_id);
	for (uint32_t i = 0; i < DK_MAX_COMMS; i++)
		if (e->comms[i].comm_id)
			ce_comm_release(&e->comms[i], NULL);
	while (e->kept)
		ce_kept_free(e, e->kept->comm_id);
	for (uint32_t i = 0; i < DK_MAX_QPS; i++)
		if (e->qps[i].q)
			ce_qp_release(&e->qps[i]);
	if (e->params.trace && !e->fatal[0])
		ce_trace_write(e);
	cudaFree(e->params.trace);
	free(e->trace_path);
	cudaFree(e->dst);
	cudaFreeHost(e->host);
	if (e->kstream)
		cudaStreamDestroy(e->kstream);
	for (uint32_t b = 0; b < DK_MAX_BLOCKS; b++)
		if (e->bstream[b])
			cudaStreamDestroy(e->bstream[b]);
	if (e->ctl_stream)
		cudaStreamDestroy(e->ctl_stream);
	free(e);
}

static const struct engine_ops cuda_ops = {
    "cuda",         ce_free,       ce_qp_add,     ce_qp_del,   ce_reg_add, ce_reg_del, ce_mem_alloc, ce_comm_add,
    ce_comm_export, ce_comm_peers, ce_comm_abort, ce_comm_del, ce_comm_free, ce_poll,    ce_busy,    ce_sleep,
    ce_wake,        ce_fatal,
};

extern "C" int cuda_engine_ops_new(const struct engine_config *cfg, const struct engine_ops **ops, void **impl,
                                   char *err, size_t errlen)
{
	struct cuda_engine *e = (struct cuda_engine *)calloc(1, sizeof(*e));
	if (!e) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	e->cfg = *cfg;
	e->stats = cfg->stats;
	uint64_t *page[CE_NCOUNTERS];
	ce_page_counters(e->stats, page);
	for (int k = 0; k < CE_NCOUNTERS; k++)
		e->stats_base[k] = __atomic_load_n(page[k], __ATOMIC_RELAXED);
	for (uint32_t b = 0; b < DK_MAX_BLOCKS; b++)
		e->block_base[b] = __atomic_load_n(&e->stats->by_block[b], __ATOMIC_RELAXED);
	/* Peers' buffers and protocol words are reached directly over NVLink
	 * or PCIe, through CUDA IPC handles opened with lazy peer access
	 * (ce_map_ipc, ce_comm_peers): a worker touches another GPU only once
	 * a communicator spans the two, and a pair without P2P fails there
	 * with a clear error. Enabling every peer up front would give this
	 * process a context on every GPU, and under MPS a client's fault on
	 * one GPU tears down every process with a context there (measured on
	 * 2x H200: the fault of a job on GPU 0 reset the worker of GPU 1). */
	cudaError_t rc = (cudaError_t)dk_preload();
	enum cudaDriverEntryPointQueryResult q;
	if (rc == cudaSuccess)
		rc = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&ce_mem_range, 12000, cudaEnableDefault,
		                                      &q);
	if (rc == cudaSuccess)
		rc = cudaStreamCreateWithFlags(&e->kstream, cudaStreamNonBlocking);
	if (rc == cudaSuccess)
		rc = cudaStreamCreateWithFlags(&e->ctl_stream, cudaStreamNonBlocking);
	if (rc == cudaSuccess)
		rc = cudaMalloc((void **)&e->dst, sizeof(struct dk_state));
	if (rc == cudaSuccess)
		rc = cudaMemset(e->dst, 0, sizeof(struct dk_state));
	if (rc == cudaSuccess)
		rc = cudaHostAlloc((void **)&e->host, sizeof(struct dk_host), cudaHostAllocMapped | cudaHostAllocPortable);
	if (rc == cudaSuccess) {
		memset(e->host, 0, sizeof(struct dk_host));
		rc = cudaHostGetDevicePointer((void **)&e->host_dev, e->host, 0);
	}
	if (rc == cudaSuccess)
		rc = cudaDeviceSynchronize();
	if (rc != cudaSuccess) {
		snprintf(err, errlen, "GPU %u: cannot set up the daemon kernel: %s", cfg->device, cudaGetErrorString(rc));
		ce_free(e);
		return -EIO;
	}
	struct sched_params sp = cfg->sched;
	if (!sp.spin_head && !sp.spin_other && !sp.stick_mult && !sp.spin_max) {
		sp.spin_head = SCHED_DEFAULT_SPIN_HEAD;
		sp.spin_other = SCHED_DEFAULT_SPIN_OTHER;
		sp.stick_mult = SCHED_DEFAULT_STICK_MULT;
		sp.spin_max = SCHED_DEFAULT_SPIN_MAX;
	}
	e->params.st = e->dst;
	e->params.host = e->host_dev;
	e->params.sched = sp;
	/* A block per channel; with resident blocks (below), a bulk block
	 * per channel beside them, so that a collective of every channel
	 * runs on bulk blocks alone. */
	uint32_t channels = cfg->channels ? cfg->channels : 1;
	if (channels > DFCCL_COMM_MAX_CHANNELS)
		channels = DFCCL_COMM_MAX_CHANNELS;
	uint32_t resident = cfg->resident_blocks < DK_MAX_RESIDENT ? cfg->resident_blocks : DK_MAX_RESIDENT;
	if (resident && channels < 2) {
		fprintf(stderr, "GPU %u: resident blocks need 2 channels or more beside them (channels %u): running one grid\n",
		        cfg->device, channels);
		resident = 0;
	}
	e->params.blocks = resident + channels;
	uint32_t fit = dk_max_blocks((int)cfg->device);
	if (fit && e->params.blocks > fit) {
		/* Fewer SMs than blocks (a MIG instance, an MPS share): a block
		 * that never starts would stop the kernel. Communicators that span
		 * this GPU and one with more channels fail with a mismatch. */
		if (resident && fit < resident + 2)
			resident = 0;
		fprintf(stderr,
		        "GPU %u: %u blocks of the daemon kernel asked (%u channels, %u resident), %u fit at once: "
		        "running %u channels%s\n",
		        cfg->device, e->params.blocks, channels, e->params.blocks - channels, fit, fit - resident,
		        resident ? " beside the resident blocks" : " in one grid");
		e->params.blocks = fit;
	}
	e->params.device = cfg->device;
	e->params.idle_ns = cfg->kernel_idle_ns;
	e->params.stream_idle_ns =
	    cfg->gate && cfg->gate_idle_ns < cfg->kernel_idle_ns ? cfg->gate_idle_ns : cfg->kernel_idle_ns;
	e->params.visit_bytes = cfg->visit_bytes ? cfg->visit_bytes : CE_VISIT_BYTES;
	e->params.chan_bytes = cfg->chan_bytes ? cfg->chan_bytes : CE_CHAN_BYTES;
	e->params.oneshot_bytes = cfg->oneshot_bytes;
	e->params.push_bytes = cfg->push_bytes;
	e->params.ll_bytes = cfg->ll_bytes;
	e->params.spread = cfg->spread_blocks ? 1u : 0u;
	e->params.early_take = cfg->early_take ? 1u : 0u;
	/* Blocks 0..resident-1 resident, the channels' bulk blocks after them
	 * (a task of one channel runs on the resident grid). */
	if (resident) {
		e->params.bulk0 = resident;
		e->params.spill_at = CE_SPILL_PER_RESIDENT * resident;
	}
	e->params.bulk_idle_ns = cfg->bulk_idle_ns;
	e->params.algo = cfg->algo;
	e->params.max_inflight = sched_max_inflight(cfg->max_inflight);
	e->params.max_inflight_uid = sched_max_inflight_uid(cfg->max_inflight_uid);
	const char *trace = getenv(DK_TRACE_ENV);
	if (trace && *trace) {
		/* A developer's trace: without memory for it the worker runs
		 * untraced, and says so. */
		size_t len = strlen(trace) + 16;
		e->trace_path = (char *)malloc(len);
		if (e->trace_path && cfg->device == 0)
			snprintf(e->trace_path, len, "%s", trace);
		else if (e->trace_path)
			snprintf(e->trace_path, len, "%s.gpu%u", trace, cfg->device);
		if (!e->trace_path || cudaMalloc((void **)&e->params.trace, sizeof(struct dk_trace)) != cudaSuccess ||
		    cudaMemset(e->params.trace, 0, sizeof(struct dk_trace)) != cudaSuccess) {
			cudaGetLastError();
			cudaFree(e->params.trace);
			e->params.trace = NULL;
			fprintf(stderr, "GPU %u: no memory for the kernel's trace; running untraced\n", cfg->device);
		}
	}
	*ops = &cuda_ops;
	*impl = e;
	return 0;
}
