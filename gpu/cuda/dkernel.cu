/*
 * The daemon kernel (DFCCL, sections 3-4): one persistent kernel per GPU, a
 * grid of channel blocks, each with its own task queue in shared memory.
 *
 * One lane of block 0's last warp, the queue reader, reads the submission
 * queues while the blocks run their tasks: it polls the arm word of every
 * queue pair's next entries in host memory (as far as fair
 * admission lets the pair hold more tasks, gpu/scheduler.h; at its
 * max-inflight-per-session entries are refused), has the warp's copier
 * lanes copy the armed entries (one PCIe read each, together) and check
 * each copy (gpu/sqe_check.h, the same checks the host engine makes, and
 * the communicator and registrations), a lane per entry, and then in the
 * entries' order either completes each at once with an error status or
 * takes a task for it, which the copier lanes fill, and hands the task
 * to c blocks through their inboxes, c channels
 * chosen by size: blocks 0..c-1, or with the spread-blocks setting c
 * blocks from one chosen by the instance (block_of); where the kernel has
 * bulk blocks (dk_params.bulk0), single-channel tasks go to the resident
 * grid (but for a backlog's) and the others to the bulk blocks, which run
 * only while they have work (dk_main). Each block then runs
 * its part of the task -- its channel's share of the data -- interleaved
 * with its other tasks under the shared scheduling policy
 * (gpu/scheduler.h): a wait on a peer spins up to the task's threshold and
 * is then preempted; the channel's step and position are kept in global
 * memory, so a preempted collective resumes exactly where it stopped.
 *
 * The instance protocol is the host engine's (proto/dfccl_comm.h), over the
 * communicator's region in host memory, with one addition: the progress of
 * channel c lives in channel words of its own, so the channels of an
 * instance never wait for each other. Per channel of a collective:
 *   SLOT (channel 0: wait until the slot's previous instance is finished on
 *   every rank, reset this rank's channel words, post) -> POSTS (wait for
 *   every rank's post, check them) -> WORK1 -> [two-shot all-reduce: SYNC1 -> WORK2;
 *   DK_PHASE2_STORES: WORK2, and DRAIN before a failed rank completes]
 *   -> CHDONE (the last channel of the rank to get here stores `done`) ->
 *   FINISH (that channel waits until every rank is done, then completes).
 * Send and receive run on one channel through the pair's mailbox, as on
 * the host engine. A pushed all-reduce (small, one channel, push_fits)
 * runs SLOT -> PUSH (its data into every peer's connector, then its
 * channel word) -> SYNC1 (every rank's word; then the posts are checked)
 * -> WORK2 (the reduction from its own connector) -> CHDONE (`done`, and
 * it completes at once: no rank reads another's buffers, so there is no
 * FINISH). The small ones go as lines (DK_PUSH_LL, dkernel.h: a flag
 * beside every 4 bytes of data): SLOT -> PUSH (the lines into every peer's
 * region, and meanwhile, from another thread, the post with the channel
 * word) -> SYNC1 (each source's last line, which carries its count and
 * shape, checked) -> LLPULL (every line's flag, then the reduction
 * straight from the lines) -> CHDONE: no fence between a rank's data and
 * what says they came, no wait for the post's release before the data,
 * and no copy into the connector. Its ranks may therefore complete with
 * different statuses: one
 * that finished before a peer failed (a peer's client gone, its buffer
 * deregistered) completes with its correct result, the peer with the
 * error, and the communicator is aborted either way.
 *
 * Algorithms, chosen per entry by the entry's hint (DFCCL_ALGO) or the
 * `algo` setting, with the communicator's plan for its rings and trees
 * (gpu/algo.h's algo_choose, as on the host engine; direct when neither
 * asks, see entry_prepare). The choice is part of the posted shape, so
 * ranks that disagree fail with DFCCL_CQ_MISMATCH:
 *   direct: over every rank's buffers as this GPU maps them (CUDA IPC over
 *   NVLink or PCIe, or the GPU itself for ranks sharing it): two-shot
 *   all-reduce (rank r reduces chunk r of its channel's share into its own
 *   buffer, then copies the other chunks from their owners, or with
 *   DK_PHASE2_STORES stores its own into theirs), one-shot where no rank
 *   works in place, on two ranks at every size and on more for small ones
 *   (each rank reduces the whole share from every rank's input: no second
 *   phase, oneshot_fits), and
 *   all-gather, reduce-scatter, broadcast and reduce by reading the peers'
 *   buffers. The reduction order is rank 0, 1, ..., n-1 on every rank.
 *   ring and trees: the steps of gpu/algo.h, the host engine's, each
 *   channel running its part of the data (algo_init's part) with its own
 *   progress words and its share of the connectors: AWAIT (the step's
 *   waits on peers' channel words) -> AWORK (its copy or reduction) ->
 *   its channel word = DFCCL_PROGRESS(key, step + 1).
 *
 * Memory ordering: data are written with plain stores and published with a
 * system-scope fence before the word that announces them; a waiter reads the
 * word with an acquire load and a fence before its block reads the data, and
 * data loads bypass L1 (ld.global.cg), which other SMs and peers do not keep
 * coherent. A pushed all-reduce's lines (DK_PUSH_LL) are the exception: no
 * word announces them; each 8-byte half of a line carries the flag beside
 * its data and is stored and loaded whole (st/ld.volatile.v4), so a half
 * whose flag is the instance's holds the instance's data. The take checks
 * every line's flags before any result is stored, and reads the data in a
 * second load of the same line, by whichever thread reduces it: the lines
 * do not change until this rank's `done`, but the PTX memory model promises
 * the data only to the load that saw the flags, so the check should move
 * into the reduction's own loads (ll_take).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dkernel.h"
#include "sqe_check.h"

/* ------------------------------------------------------------------ memory */

__device__ __forceinline__ uint64_t ld_acq_sys(const uint64_t *p)
{
	uint64_t v;
	asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
	return v;
}



__device__ __forceinline__ uint32_t ld_acq_gpu32(const uint32_t *p)
{
	uint32_t v;
	asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ __forceinline__ uint32_t ld_acq_sys32(const uint32_t *p)
{
	uint32_t v;
	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ __forceinline__ void st_rel_sys(uint64_t *p, uint64_t v)
{
	asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* A store other GPUs may read, ordered by an earlier fence or release. */
__device__ __forceinline__ void st_rlx_sys(uint64_t *p, uint64_t v)
{
	asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void st_rel_sys32(uint32_t *p, uint32_t v)
{
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <typename T> __device__ __forceinline__ T vload(const T *p)
{
	return *(const volatile T *)p;
}

/*
 * The communicator of the visit in progress, per block: what every access
 * to its protocol words needs, read by thread 0 when a visit begins with
 * another communicator than the block's last one, or in a new launch (the
 * table does not change during a launch, dkernel.h), and kept in shared
 * memory, where reading it costs no trip to global memory.
 */
struct dk_visit {
	int64_t mirror;                /* dk_comm.mirror */
	struct dfccl_comm_header *sync; /* dk_comm.sync */
	uint32_t n;                    /* dk_comm.nranks */
	uint32_t npeers;               /* dk_comm.npeers */
	int64_t peer_off[DK_MAX_PEERS]; /* dk_comm.peer_off */
	uint32_t comm, epoch;          /* whose: the communicator's slot, in launch `epoch` (0: nobody's) */
};
__shared__ dk_visit vis;

/*
 * A communicator's protocol words (posts, channel words, mailboxes), in
 * this GPU's memory (dk_comm.sync); each store is repeated, plainly, into
 * the region in host memory (dk_comm.mirror), which the supervisor watches
 * for timeouts and diagnostics. Where every rank is on this GPU, only this
 * kernel reads them, and GPU scope orders them with the ranks' data: a
 * release costs no PCIe round trip. Where the communicator spans GPUs,
 * each store goes to every GPU's copy too (vis.peer_off, over the links),
 * at system scope after one release fence, and loads read this GPU's copy
 * with a system-scope acquire: a wait never crosses a link.
 */
__device__ __forceinline__ uint64_t sync_load(const uint64_t *p)
{
	uint64_t v;
	if (vis.mirror && !vis.npeers)
		asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
	else
		asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
	return v;
}

/* v into the word at p of every copy but this GPU's, relaxed. */
__device__ __forceinline__ void sync_to_peers(uint64_t *p, uint64_t v)
{
	for (uint32_t k = 0; k < vis.npeers; k++)
		st_rlx_sys((uint64_t *)((char *)p + vis.peer_off[k]), v);
}

/* A release of v into the word at p of every GPU's copy; not the host's. */
__device__ __forceinline__ void sync_release(uint64_t *p, uint64_t v)
{
	if (vis.npeers) {
		asm volatile("fence.acq_rel.sys;" ::: "memory");
		st_rlx_sys(p, v);
		sync_to_peers(p, v);
	} else if (vis.mirror) {
		asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
	} else {
		asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
	}
}

__device__ __forceinline__ void sync_store(uint64_t *p, uint64_t v)
{
	int64_t m = vis.mirror;
	sync_release(p, v);
	if (m)
		*(volatile uint64_t *)((char *)p + m) = v;
}

/* A plain store of a protocol word, published by a later release of the
 * same thread: a sync_store, or (a pushed all-reduce's `done`) the
 * completion word's release in complete(). */
__device__ __forceinline__ void sync_put(uint64_t *p, uint64_t v)
{
	int64_t m = vis.mirror;
	*(volatile uint64_t *)p = v;
	sync_to_peers(p, v);
	if (m)
		*(volatile uint64_t *)((char *)p + m) = v;
}

__device__ __forceinline__ void sync_fence(void)
{
	if (vis.mirror && !vis.npeers)
		asm volatile("fence.acq_rel.gpu;" ::: "memory");
	else
		asm volatile("fence.acq_rel.sys;" ::: "memory");
}

/* The barrier of a block's task-running threads (DK_WORKERS of them:
 * block 0's last warp reads the queues and never joins it). */
__device__ __forceinline__ void work_sync(void)
{
	asm volatile("bar.sync 1, %0;" ::"n"(DK_WORKERS) : "memory");
}

__device__ __forceinline__ uint64_t now_ns(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* ------------------------------------------------------------------ reductions */

enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3, OP_AVG = 4 };

/* Element types: T in memory, A accumulated (as gpu/host/reduce.c: integers
 * wrap in their unsigned type and compare and divide as signed; halves
 * accumulate in float). */
template <typename T, typename A> struct elem {
	static __device__ __forceinline__ A load(T x) { return (A)x; }
	static __device__ __forceinline__ T store(A a) { return (T)a; }
	static __device__ __forceinline__ bool gt(A a, A b) { return (T)a > (T)b; }
	static __device__ __forceinline__ A avg(A a, unsigned d) { return (A)(T)((int64_t)(T)a / (int64_t)d); }
};
template <typename T> struct elem_plain {
	static __device__ __forceinline__ T load(T x) { return x; }
	static __device__ __forceinline__ T store(T a) { return a; }
	static __device__ __forceinline__ bool gt(T a, T b) { return a > b; }
	static __device__ __forceinline__ T avg(T a, unsigned d) { return a / (T)d; }
};
template <> struct elem<uint8_t, uint8_t> : elem_plain<uint8_t> {};
template <> struct elem<uint32_t, uint32_t> : elem_plain<uint32_t> {};
template <> struct elem<uint64_t, uint64_t> : elem_plain<uint64_t> {};
template <> struct elem<float, float> : elem_plain<float> {};
template <> struct elem<double, double> : elem_plain<double> {};
struct elem_f16 {
	static __device__ __forceinline__ float load(uint16_t x) { return __half2float(__ushort_as_half(x)); }
	static __device__ __forceinline__ uint16_t store(float a) { return __half_as_ushort(__float2half_rn(a)); }
	static __device__ __forceinline__ bool gt(float a, float b) { return a > b; }
	static __device__ __forceinline__ float avg(float a, unsigned d) { return a / (float)d; }
};
struct elem_bf16 {
	static __device__ __forceinline__ float load(uint16_t x) { return __bfloat162float(__ushort_as_bfloat16(x)); }
	static __device__ __forceinline__ uint16_t store(float a) { return __bfloat16_as_ushort(__float2bfloat16_rn(a)); }
	static __device__ __forceinline__ bool gt(float a, float b) { return a > b; }
	static __device__ __forceinline__ float avg(float a, unsigned d) { return a / (float)d; }
};

template <typename E, typename A, int OP> __device__ __forceinline__ A combine(A acc, A v)
{
	if (OP == OP_SUM || OP == OP_AVG)
		return (A)(acc + v);
	if (OP == OP_PROD)
		return (A)(acc * v);
	if (OP == OP_MAX)
		return E::gt(v, acc) ? v : acc;
	return E::gt(acc, v) ? v : acc;
}

/* One data movement: dst[i] = reduce over k of src[k][i] (or a copy), for
 * i < elems. Built by thread 0, carried out by the whole block. */
struct dk_op {
	char *dst;
	const char *src[DFCCL_COMM_MAX_RANKS];
	uint32_t nsrc;
	uint32_t reduce; /* 0: copy src[0] */
	uint32_t dtype, redop, div;
	uint64_t elems;
	uint32_t dsize;
	uint32_t ll;          /* a pushed all-reduce's lines (ll_send, ll_take): DK_LL_SEND, DK_LL_TAKE or
	                       * DK_LL_RUN; 0: none */
	uint32_t flag, shape; /* the lines' flag (dk_ll_flag), and the shape their last line carries */
	uint32_t rank;        /* DK_LL_TAKE, DK_LL_RUN: this rank */
	const char *lines;    /* DK_LL_TAKE, DK_LL_RUN: the first region of this rank's slot */
	const dk_task *task;  /* DK_LL_SEND, DK_LL_RUN: the task, whose post one thread stores meanwhile */
};

template <typename T> __device__ __forceinline__ T ld_cg(const T *p);
template <> __device__ __forceinline__ uint8_t ld_cg(const uint8_t *p) { return __ldcg(p); }
template <> __device__ __forceinline__ int8_t ld_cg(const int8_t *p) { return (int8_t)__ldcg((const signed char *)p); }
template <> __device__ __forceinline__ uint16_t ld_cg(const uint16_t *p) { return __ldcg(p); }
template <> __device__ __forceinline__ int32_t ld_cg(const int32_t *p) { return __ldcg(p); }
template <> __device__ __forceinline__ uint32_t ld_cg(const uint32_t *p) { return __ldcg(p); }
template <> __device__ __forceinline__ int64_t ld_cg(const int64_t *p) { return (int64_t)__ldcg((const long long *)p); }
template <> __device__ __forceinline__ uint64_t ld_cg(const uint64_t *p)
{
	return (uint64_t)__ldcg((const unsigned long long *)p);
}
template <> __device__ __forceinline__ float ld_cg(const float *p) { return __ldcg(p); }
template <> __device__ __forceinline__ double ld_cg(const double *p) { return __ldcg(p); }

/*
 * 16-byte packs where every pointer allows it, single elements for the rest.
 * A thread keeps U packs of every source in flight before it combines them
 * (U * K accumulators, at most 16): a peer's memory over NVLink
 * answers in microseconds, and a block of a few hundred threads with one
 * load each in flight would move a few GB/s.
 */
template <typename T, typename A, typename E, int OP> __device__ __noinline__ void reduce_run(const dk_op &o)
{
	const uint32_t tid = threadIdx.x, nt = DK_WORKERS;
	const unsigned K = 16 / sizeof(T);
	const unsigned U = K >= 16 ? 1 : K >= 8 ? 2 : 4;
	bool aligned = ((uintptr_t)o.dst & 15u) == 0;
	for (uint32_t k = 0; k < o.nsrc; k++)
		aligned = aligned && ((uintptr_t)o.src[k] & 15u) == 0;
	uint64_t npack = aligned ? o.elems / K : 0;
	uint64_t i = tid;
	/* Two sources (two ranks' halves, the common case): each result comes
	 * from one pack of each, without accumulators, so twice the packs fit
	 * in flight (16 per thread) in the same registers. */
	if (o.nsrc == 2) {
		const unsigned U2 = 8;
		for (; i + (uint64_t)(U2 - 1) * nt < npack; i += (uint64_t)U2 * nt) {
			uint4 v[U2], w[U2];
#pragma unroll
			for (unsigned u = 0; u < U2; u++)
				v[u] = __ldcg((const uint4 *)o.src[0] + i + u * nt);
#pragma unroll
			for (unsigned u = 0; u < U2; u++)
				w[u] = __ldcg((const uint4 *)o.src[1] + i + u * nt);
#pragma unroll
			for (unsigned u = 0; u < U2; u++) {
				const T *a = (const T *)&v[u], *b = (const T *)&w[u];
				uint4 out;
				T *r = (T *)&out;
#pragma unroll
				for (unsigned j = 0; j < K; j++) {
					A x = combine<E, A, OP>(E::load(a[j]), E::load(b[j]));
					r[j] = E::store(OP == OP_AVG ? E::avg(x, o.div) : x);
				}
				((uint4 *)o.dst)[i + u * nt] = out;
			}
		}
	}
	for (; i + (uint64_t)(U - 1) * nt < npack; i += (uint64_t)U * nt) {
		uint4 v[U], w[U];
		A acc[U][K];
		/* The first two sources' loads go out together. */
#pragma unroll
		for (unsigned u = 0; u < U; u++)
			v[u] = __ldcg((const uint4 *)o.src[0] + i + u * nt);
		if (o.nsrc > 1) {
#pragma unroll
			for (unsigned u = 0; u < U; u++)
				w[u] = __ldcg((const uint4 *)o.src[1] + i + u * nt);
		}
#pragma unroll
		for (unsigned u = 0; u < U; u++)
#pragma unroll
			for (unsigned j = 0; j < K; j++)
				acc[u][j] = E::load(((const T *)&v[u])[j]);
		for (uint32_t k = 1; k < o.nsrc; k++) {
			if (k > 1) {
#pragma unroll
				for (unsigned u = 0; u < U; u++)
					w[u] = __ldcg((const uint4 *)o.src[k] + i + u * nt);
			}
#pragma unroll
			for (unsigned u = 0; u < U; u++)
#pragma unroll
				for (unsigned j = 0; j < K; j++)
					acc[u][j] = combine<E, A, OP>(acc[u][j], E::load(((const T *)&w[u])[j]));
		}
#pragma unroll
		for (unsigned u = 0; u < U; u++) {
			uint4 out;
			T *r = (T *)&out;
#pragma unroll
			for (unsigned j = 0; j < K; j++)
				r[j] = E::store(OP == OP_AVG ? E::avg(acc[u][j], o.div) : acc[u][j]);
			((uint4 *)o.dst)[i + u * nt] = out;
		}
	}
	for (; i < npack; i += nt) {
		uint4 v = __ldcg((const uint4 *)o.src[0] + i);
		const T *t = (const T *)&v;
		A acc[K];
#pragma unroll
		for (unsigned j = 0; j < K; j++)
			acc[j] = E::load(t[j]);
		for (uint32_t k = 1; k < o.nsrc; k++) {
			uint4 w = __ldcg((const uint4 *)o.src[k] + i);
			const T *u = (const T *)&w;
#pragma unroll
			for (unsigned j = 0; j < K; j++)
				acc[j] = combine<E, A, OP>(acc[j], E::load(u[j]));
		}
		uint4 out;
		T *r = (T *)&out;
#pragma unroll
		for (unsigned j = 0; j < K; j++)
			r[j] = E::store(OP == OP_AVG ? E::avg(acc[j], o.div) : acc[j]);
		((uint4 *)o.dst)[i] = out;
	}
	for (uint64_t e = npack * K + tid; e < o.elems; e += nt) {
		A acc = E::load(ld_cg((const T *)o.src[0] + e));
		for (uint32_t k = 1; k < o.nsrc; k++)
			acc = combine<E, A, OP>(acc, E::load(ld_cg((const T *)o.src[k] + e)));
		((T *)o.dst)[e] = E::store(OP == OP_AVG ? E::avg(acc, o.div) : acc);
	}
}

/* The reductions' instances, one per type and operation: a table of them
 * and one indirect call, where a switch over every instance made a call
 * site of each, and ptxas gave dk_main, into which the switches were
 * inlined, about 55 bytes of stack per call site (5.5 KB: the driver
 * reserves the stack of the largest frame for every thread the GPU can
 * hold, dk_main). Row: dfcclDataType_t (int8, uint8, int32, uint32,
 * int64, uint64, float16, float32, float64, bfloat16; any other value
 * the last); column: the operation (OP_*, any other value OP_AVG). */
typedef void (*dk_red_fn)(const dk_op &);
typedef elem<int8_t, uint8_t> elem_i8;
typedef elem<uint8_t, uint8_t> elem_u8;
typedef elem<int32_t, uint32_t> elem_i32;
typedef elem<uint32_t, uint32_t> elem_u32;
typedef elem<int64_t, uint64_t> elem_i64;
typedef elem<uint64_t, uint64_t> elem_u64;
typedef elem<float, float> elem_f32;
typedef elem<double, double> elem_f64;
#define DK_RED_TYPES 10u
#define DK_RED_OPS 5u
#define DK_RED_ROW(F, T, A, E) F<T, A, E, OP_SUM>, F<T, A, E, OP_PROD>, F<T, A, E, OP_MAX>, F<T, A, E, OP_MIN>, F<T, A, E, OP_AVG>
#define DK_RED_TABLE(F)                                                                                    \
	{DK_RED_ROW(F, int8_t, uint8_t, elem_i8),     DK_RED_ROW(F, uint8_t, uint8_t, elem_u8),              \
	 DK_RED_ROW(F, int32_t, uint32_t, elem_i32),  DK_RED_ROW(F, uint32_t, uint32_t, elem_u32),           \
	 DK_RED_ROW(F, int64_t, uint64_t, elem_i64),  DK_RED_ROW(F, uint64_t, uint64_t, elem_u64),           \
	 DK_RED_ROW(F, uint16_t, float, elem_f16),    DK_RED_ROW(F, float, float, elem_f32),                 \
	 DK_RED_ROW(F, double, double, elem_f64),     DK_RED_ROW(F, uint16_t, float, elem_bf16)}

__device__ __forceinline__ void red_call(const dk_red_fn *fns, const dk_op &o)
{
	uint32_t t = o.dtype < DK_RED_TYPES ? o.dtype : DK_RED_TYPES - 1u;
	uint32_t r = o.redop < DK_RED_OPS ? o.redop : OP_AVG;
	fns[t * DK_RED_OPS + r](o);
}

__device__ const dk_red_fn dk_reduce_fns[DK_RED_TYPES * DK_RED_OPS] = DK_RED_TABLE(reduce_run);

__device__ void copy_run(const dk_op &o)
{
	const uint32_t tid = threadIdx.x, nt = DK_WORKERS;
	uint64_t bytes = o.elems * o.dsize;
	if (o.dst == o.src[0])
		return; /* in place */
	const char *s = o.src[0];
	char *d = o.dst;
	uint64_t npack = (((uintptr_t)s | (uintptr_t)d) & 15u) == 0 ? bytes / 16 : 0;
	/* Eight packs in flight per thread (reduce_run says why). */
	const unsigned U = 8;
	uint64_t i = tid;
	for (; i + (uint64_t)(U - 1) * nt < npack; i += (uint64_t)U * nt) {
		uint4 v[U];
#pragma unroll
		for (unsigned u = 0; u < U; u++)
			v[u] = __ldcg((const uint4 *)s + i + u * nt);
#pragma unroll
		for (unsigned u = 0; u < U; u++)
			((uint4 *)d)[i + u * nt] = v[u];
	}
	for (; i < npack; i += nt)
		((uint4 *)d)[i] = __ldcg((const uint4 *)s + i);
	if (npack == 0 && (((uintptr_t)s | (uintptr_t)d) & 3u) == 0) {
		uint64_t nw = bytes / 4;
		for (uint64_t i = tid; i < nw; i += nt)
			((uint32_t *)d)[i] = __ldcg((const uint32_t *)s + i);
		npack = nw / 4; /* bytes below npack * 16 + (nw % 4) * 4 are done */
		for (uint64_t i = nw * 4 + tid; i < bytes; i += nt)
			d[i] = (char)__ldcg((const uint8_t *)s + i);
		return;
	}
	for (uint64_t i = npack * 16 + tid; i < bytes; i += nt)
		d[i] = (char)__ldcg((const uint8_t *)s + i);
}

/*
 * A pushed all-reduce's lines (DK_PUSH_LL, dkernel.h): line j of a source's
 * region carries bytes [8j, 8j + 8) of its data, each 4-byte half with the
 * flag beside it in one 8-byte word, which a GPU stores and loads whole;
 * line L, after the L lines of data, the count and shape, for the
 * receiver's check. DK_LL_SEND: src[0] the data, src[1..nsrc) the regions
 * it goes to, one per peer. DK_LL_TAKE: `lines` the first of the n - 1
 * regions of this rank's slot (dk_ll_room(n) bytes apart, source rank
 * + 1 first), src[0] this rank's data, dst its result, n = div; ll_result
 * says whether every line had come and the result is stored
 * (DK_LL_READY), or not (DK_LL_LATE: nothing stored). DK_LL_RUN: both, one
 * after the other, in one visit of the block (ll_run_starts).
 */
enum { DK_LL_SEND = 1, DK_LL_TAKE = 2, DK_LL_RUN = 3 };
enum { DK_LL_READY = 1, DK_LL_LATE = 2 };
#define DK_LL_POLLS 64u /* polls of a thread's lines before a take gives way */
__shared__ uint32_t ll_result;

__device__ __forceinline__ void ll_store(uint4 *p, uint32_t lo, uint32_t hi, uint32_t flag)
{
	asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(lo), "r"(flag), "r"(hi), "r"(flag)
	             : "memory");
}

__device__ __forceinline__ uint4 ll_load(const uint4 *p)
{
	uint4 v;
	asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
	             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	             : "l"(p)
	             : "memory");
	return v;
}

/* The workers' barrier (work_sync's), returning whether p held in all. */
__device__ __forceinline__ bool work_all(bool p)
{
	uint32_t r;
	asm volatile("{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\tbar.red.and.pred q, 1, %2, p;\n\t"
	             "selp.u32 %0, 1, 0, q;\n\t}"
	             : "=r"(r)
	             : "r"((uint32_t)p), "n"(DK_WORKERS)
	             : "memory");
	return r != 0;
}

/* Bytes [8j, 8j + 8) of `bytes` at s, those past the end 0. */
__device__ __forceinline__ uint64_t ll_chunk(const char *s, uint64_t bytes, uint32_t j)
{
	if (((uintptr_t)s & 7u) == 0 && 8ull * j + 8u <= bytes)
		return (uint64_t)__ldcg((const unsigned long long *)s + j);
	uint64_t w = 0;
	for (uint32_t k = 0; k < 8u && 8ull * j + k < bytes; k++)
		w |= (uint64_t)__ldcg((const uint8_t *)s + 8ull * j + k) << (8u * k);
	return w;
}

__device__ void post(const dk_task *t, uint32_t phase);

/* The last of the workers posts the task (its release waits for a round
 * trip over the links) while the others store the lines. */
#define DK_LL_POSTER (DK_WORKERS - 1u)

__device__ void ll_send(const dk_op &o)
{
	const uint32_t tid = threadIdx.x, nt = DK_WORKERS - 1u;
	const uint64_t bytes = o.elems * o.dsize;
	const uint32_t L = (uint32_t)dk_ll_lines(bytes);
	if (tid == DK_LL_POSTER) {
		post(o.task, 1);
		return;
	}
	for (uint32_t j = tid; j < L; j += nt) {
		uint64_t w = ll_chunk(o.src[0], bytes, j);
		for (uint32_t d = 1; d < o.nsrc; d++)
			ll_store((uint4 *)o.src[d] + j, (uint32_t)w, (uint32_t)(w >> 32), o.flag);
	}
	/* The last line once thread 0's data lines are out: nothing orders
	 * any line's arrival, but the receivers' first look (DK_SYNC1) is at
	 * the last line, and their take polls every line, a while, before it
	 * gives way. */
	if (tid == 0)
		for (uint32_t d = 1; d < o.nsrc; d++)
			ll_store((uint4 *)o.src[d] + L, (uint32_t)o.elems, o.shape, o.flag);
}

/* Line j of region g of this rank's slot (DK_LL_TAKE): source rank
 * (rank + 1 + g) mod n's. */
__device__ __forceinline__ const uint4 *ll_at(const dk_op &o, uint32_t g, uint32_t j)
{
	return (const uint4 *)(o.lines + (uint64_t)g * dk_ll_room(o.div)) + j;
}

/* Line j of source rank k's region. */
__device__ __forceinline__ const uint4 *ll_line(const dk_op &o, uint32_t k, uint32_t j)
{
	uint32_t n = o.div;
	return ll_at(o, (k + n - o.rank - 1u) % n, j);
}

/* The take's reduction, once every line is there: chunk j of the result
 * from chunk j of every rank, in rank order (this rank's from its own
 * data), as reduce_run combines them. */
/* Chunks a thread has in flight at once in a take: each of its loads is a
 * round trip, and a take's lines are few per thread. */
#define DK_LL_BATCH 4u

template <typename T, typename A, typename E, int OP> __device__ __noinline__ void ll_reduce(const dk_op &o)
{
	const uint32_t tid = threadIdx.x, nt = DK_WORKERS, n = o.div, r = o.rank, B = DK_LL_BATCH;
	const unsigned K = 8 / sizeof(T);
	const uint64_t bytes = o.elems * sizeof(T);
	const uint32_t L = (uint32_t)dk_ll_lines(bytes);
	for (uint32_t j0 = tid; j0 < L; j0 += B * nt) {
		A acc[B][K];
		for (uint32_t k = 0; k < n; k++) {
			uint64_t w[B];
#pragma unroll
			for (uint32_t u = 0; u < B; u++) {
				uint32_t j = j0 + u * nt;
				if (j >= L) {
					w[u] = 0;
				} else if (k == r) {
					w[u] = ll_chunk(o.src[0], bytes, j);
				} else {
					uint4 v = ll_load(ll_line(o, k, j));
					w[u] = (uint64_t)v.x | (uint64_t)v.z << 32;
				}
			}
#pragma unroll
			for (uint32_t u = 0; u < B; u++) {
				const T *e = (const T *)&w[u];
#pragma unroll
				for (unsigned i = 0; i < K; i++)
					acc[u][i] = k == 0 ? E::load(e[i]) : combine<E, A, OP>(acc[u][i], E::load(e[i]));
			}
		}
#pragma unroll
		for (uint32_t u = 0; u < B; u++) {
			uint32_t j = j0 + u * nt;
			if (j >= L)
				break;
			T out[K];
#pragma unroll
			for (unsigned i = 0; i < K; i++)
				out[i] = E::store(OP == OP_AVG ? E::avg(acc[u][i], o.div) : acc[u][i]);
			if (((uintptr_t)o.dst & 7u) == 0 && 8ull * j + 8u <= bytes) {
				uint64_t v;
				memcpy(&v, out, 8);
				((unsigned long long *)o.dst)[j] = v;
			} else {
				for (unsigned i = 0; i < K && (uint64_t)j * K + i < o.elems; i++)
					((T *)o.dst)[(uint64_t)j * K + i] = out[i];
			}
		}
	}
}

__device__ const dk_red_fn dk_line_fns[DK_RED_TYPES * DK_RED_OPS] = DK_RED_TABLE(ll_reduce);

__device__ void ll_take(const dk_op &o)
{
	const uint32_t tid = threadIdx.x, nt = DK_WORKERS, n = o.div;
	const uint32_t L = (uint32_t)dk_ll_lines(o.elems * o.dsize);
	/* In a run (DK_LL_RUN) the take polls each source's last line too, and
	 * agrees with it: no look at the last lines came before. */
	const uint32_t per = o.ll == DK_LL_RUN ? L + 1u : L, total = per * (n - 1);
	bool ok = true;
	for (uint32_t poll = 0;; poll++) {
		ok = true;
		for (uint32_t i0 = tid; i0 < total && ok; i0 += DK_LL_BATCH * nt) {
			uint4 v[DK_LL_BATCH];
			bool last[DK_LL_BATCH];
#pragma unroll
			for (uint32_t u = 0; u < DK_LL_BATCH; u++) {
				uint32_t i = i0 + u * nt, j = i % per;
				last[u] = i < total && j == L;
				v[u] = i < total ? ll_load(ll_at(o, i / per, j)) : make_uint4(0, o.flag, 0, o.flag);
			}
#pragma unroll
			for (uint32_t u = 0; u < DK_LL_BATCH; u++)
				ok = ok && v[u].y == o.flag && v[u].w == o.flag &&
				     (!last[u] || (v[u].x == (uint32_t)o.elems && v[u].z == o.shape));
		}
		if (ok || poll >= DK_LL_POLLS)
			break;
		__nanosleep(64);
	}
	if (!work_all(ok)) {
		if (tid == 0)
			ll_result = DK_LL_LATE;
		return;
	}
	/* Every line is there, and stays until this rank's `done` lets the
	 * peers reuse the slot. */
	red_call(dk_line_fns, o);
	if (tid == 0)
		ll_result = DK_LL_READY;
}

__device__ void op_run(const dk_op &o)
{
	if (o.ll) {
		if (o.ll != DK_LL_TAKE)
			ll_send(o);
		if (o.ll != DK_LL_SEND)
			ll_take(o);
		return;
	}
	if (!o.reduce)
		copy_run(o);
	else
		red_call(dk_reduce_fns, o);
}

/* ------------------------------------------------------------------ tables */

/* Probe i of reg_id's search: a whole table entry, two independent 16-byte
 * loads through L2, so one round trip, rather than its words one after
 * another. */
__device__ __forceinline__ void reg_load(dk_state *st, uint32_t reg_id, uint32_t i, dk_reg *out)
{
	DFCCL_STATIC_ASSERT(sizeof(dk_reg) == 32, "a registration is two 16-byte words");
	const uint4 *src = (const uint4 *)&st->regs[(dk_reg_hash(reg_id) + i) & (DK_REG_CAP - 1u)];
	uint4 v[2] = {__ldcg(src), __ldcg(src + 1)};
	memcpy(out, v, sizeof(*out));
}

/* Whether the probe r ends reg_id's search, and then *found. */
__device__ __forceinline__ bool reg_ends(const dk_reg &r, uint32_t reg_id, bool *found)
{
	*found = r.state == DK_REG_LIVE && r.reg_id == reg_id;
	return *found || r.state == DK_REG_EMPTY;
}

/* A copy of reg_id's live entry, or false. */
__device__ bool reg_find(dk_state *st, uint32_t reg_id, dk_reg *out)
{
	if (reg_id == 0)
		return false;
	for (uint32_t i = 0; i < DK_REG_CAP; i++) {
		bool found;
		reg_load(st, reg_id, i, out);
		if (reg_ends(*out, reg_id, &found))
			return found;
	}
	return false;
}

/* The first probe of each of N registrations (an id of 0 is not looked
 * up), loaded together and not yet used: reg_finish ends the searches,
 * so that other loads may go in the same L2 round trip between the two. */
template <int N> __device__ __forceinline__ void reg_probe(dk_state *st, const uint32_t id[N], dk_reg out[N])
{
	for (int k = 0; k < N; k++)
		if (id[k] != 0)
			reg_load(st, id[k], 0, &out[k]);
}

/* After reg_probe: each search ended (found[k]) from its first probe, or
 * continued where that collided. */
template <int N> __device__ void reg_finish(dk_state *st, const uint32_t id[N], dk_reg out[N], bool found[N])
{
	for (int k = 0; k < N; k++)
		if (id[k] == 0)
			found[k] = false;
		else if (!reg_ends(out[k], id[k], &found[k]))
			found[k] = reg_find(st, id[k], &out[k]);
}

/* The address of [off, off + bytes) of reg_id (found: its entry r) owned
 * by session; NULL with *status set when that is not a buffer of this
 * session, or NULL for no bytes. */
__device__ char *resolve_found(uint32_t reg_id, bool found, const dk_reg &r, uint64_t session, uint64_t off,
                               uint64_t bytes, uint32_t *status)
{
	*status = DFCCL_CQ_OK;
	if (bytes == 0)
		return NULL;
	uint32_t s = sqe_check_range(reg_id, found, found ? r.session_id : 0, found ? r.size : 0, session, off, bytes, 1);
	if (s != DFCCL_CQ_OK) {
		*status = s;
		return NULL;
	}
	return r.base + off;
}

/* resolve_found, looking reg_id up. */
__device__ char *resolve(dk_state *st, uint32_t reg_id, uint64_t session, uint64_t off, uint64_t bytes, uint32_t *status)
{
	dk_reg r = {};
	bool found = bytes && reg_find(st, reg_id, &r);
	return resolve_found(reg_id, found, r, session, off, bytes, status);
}

/* ------------------------------------------------------------------ completions and counters */

struct dk_ctx {
	dk_params p;
	dk_state *st;
	dk_block_stats *bs; /* this block's counters (host memory) */
	dk_block_stats acc; /* their values, kept here */
	dk_block_stats out; /* what was stored last */
	uint64_t flushed;   /* when the counters were last stored (ns) */
	uint64_t trace_n;   /* events this block recorded (its ring's count, kept here) */
	uint32_t b;
	uint32_t slot;      /* its counters and trace ring: b, or DK_READER for the queue reader */
	uint32_t passes;    /* the queue reader: its passes over the queue pairs so far */
	uint32_t nqps;      /* the queue reader: dk_ctl.nqps, which changes only while the kernel is parked */
	bool cpu_last;      /* the queue reader: the last entry it took was armed by the CPU (reader_main) */
	bool early_live;    /* the queue reader: tasks it took before their arm may be unarmed still, or
	                     * given back and not moved back to (early_take): st->early_tasks and
	                     * st->early_backs need loading; false, they are 0 */
	/* The queue reader's own (reader_main loads them at its start): */
	uint64_t arrivals;  /* dk_state.arrivals, stored back by inbox_publish */
	uint32_t rtail[DK_MAX_BLOCKS]; /* each inbox's next place (its tail once published) */
	uint64_t rknown;    /* bit b: rtail[b] loaded in this launch (entry_take) */
	uint64_t rpend;     /* blocks whose inbox has places not published (bit b: block b) */
	uint32_t free_base, free_mask; /* bit k: task free_base + k is known free (task_alloc) */
};

/*
 * What the queue reader read of the first DK_QCACHE queue pairs in this
 * launch (and, its own, when each pair's next look past its head comes:
 * look_past): the table changes only while the kernel is parked (dkernel.h;
 * adding a pair parks it too), so a pair's `live` and the words a pass
 * needs first hold for the whole launch, and its head moves only by the
 * reader, which keeps it here as well as in the table. A pass thus starts
 * with the PCIe round trip of the pair's header instead of two L2 round
 * trips before it (whether the pair is live, then its words).
 */
#define DK_QCACHE 32u
struct dk_qcache {
	uint32_t known, live;                 /* bit qi: looked at in this launch; found live */
	uint32_t n[DK_QCACHE];
	dfccl_qp_header *hdr[DK_QCACHE];
	dfccl_sqe *sq[DK_QCACHE];
	volatile uint64_t *taken[DK_QCACHE];
	uint64_t head[DK_QCACHE];
	/* The last sequence an entry may have been taken under past the
	 * head (taken out of order; before this launch, anywhere in the lap
	 * from the head: the client's tail, which it may lower or set to
	 * anything, bounds nothing): past it no entry reads taken, and an
	 * in-order pass loads no taken words there. */
	uint64_t taken_hi[DK_QCACHE];
	uint8_t look_gap[DK_QCACHE];  /* passes between two looks past the pair's unarmed head (look_past) */
	uint8_t look_wait[DK_QCACHE]; /* passes to go before the next */
};
__shared__ dk_qcache qcache;

/* The next record of this block's trace ring (dkernel.h, DK_TRACE_ENV). */
__device__ __forceinline__ dk_trace_rec *trace_next(dk_ctx &c, dk_trace *tr)
{
	uint64_t i = c.trace_n++;
	tr->n[c.slot] = c.trace_n;
	return &tr->rec[c.slot][i & (DK_TRACE_EVENTS - 1u)];
}

/* Records an event of thread 0 of this block. The clock is read at the
 * record's store: read before the ring's arithmetic, it cost dk_main's
 * loop about 90 bytes more of spills (ptxas), traced or not. */
__device__ __forceinline__ void trace(dk_ctx &c, uint32_t event, uint32_t arg)
{
	dk_trace *tr = c.p.trace;
	if (!tr)
		return;
	dk_trace_rec *r = trace_next(c, tr);
	r->t_ns = now_ns();
	r->event = event;
	r->arg = arg;
}

/* Records an event that another thread of the block timed (t_ns). */
__device__ __forceinline__ void trace_at(dk_ctx &c, uint32_t event, uint32_t arg, uint64_t t_ns)
{
	dk_trace *tr = c.p.trace;
	if (!tr)
		return;
	dk_trace_rec *r = trace_next(c, tr);
	r->t_ns = t_ns;
	r->event = event;
	r->arg = arg;
}

/* Stores the counters that changed: the writes cross PCIe, and a stream of
 * them from every block would delay the reads the scheduling waits on.
 * stats_tick stores them at most every DK_STATS_NS while the block is busy,
 * and at once when it is idle (so that a reader sees the counters of
 * everything that finished). */
#define DK_STATS_NS 20000u

__device__ void stats_flush(dk_ctx &c)
{
	volatile uint64_t *d = (volatile uint64_t *)c.bs;
	volatile uint64_t *dev = (volatile uint64_t *)&c.st->counters[c.slot];
	const uint64_t *a = (const uint64_t *)&c.acc;
	uint64_t *o = (uint64_t *)&c.out;
	for (int k = 0; k < DK_NCOUNTERS; k++)
		if (a[k] != o[k]) {
			d[k] = a[k];
			dev[k] = a[k];
			o[k] = a[k];
		}
	c.flushed = now_ns();
}

__device__ void stats_tick(dk_ctx &c, bool idle)
{
	if (idle || now_ns() - c.flushed >= DK_STATS_NS)
		stats_flush(c);
}

/* The single-word completion of entry seq (DFCCL's optimized CQ; what its
 * client waits on), with a release store at system scope: the results
 * before the word (`fenced`: a system fence of the caller's did that, and
 * the stores are relaxed). With a device completion word (done: its
 * address, the entry's DFCCL_SQE_F_DEVICE_DONE), that one first, with the
 * release, for the stream that waits there; the queue's word after it,
 * ordered after the results by the same fence. */
__device__ void complete_word(dk_qp *q, uint64_t seq, uint32_t status, char *done, bool fenced)
{
	uint32_t slot = DFCCL_QP_SLOT(seq, vload(&q->n));
	const uint64_t w = DFCCL_CW_MAKE(seq, status);
	uint64_t *first = done ? (uint64_t *)done : &vload(&q->cw)[slot];
	if (fenced)
		st_rlx_sys(first, w);
	else
		st_rel_sys(first, w);
	if (done)
		st_rlx_sys(&vload(&q->cw)[slot], w);
}

/*
 * Where entry seq's completion goes: its device completion word (done,
 * resolved in this launch; by registration, done_reg 0: none) and its
 * group (DFCCL_SQE_F_GROUP, sqe_group: gn entries, the last `last`; gn 0:
 * none).
 */
struct dk_cq_to {
	uint64_t seq;
	char *done;
	uint64_t done_off;
	uint32_t done_reg;
	uint32_t gn;
	uint64_t last;
};

/*
 * The completion words of an entry (to): its own word, but for a group's
 * last entry, which leaves its completion in the group's slot (dk_group)
 * and writes its word only where its count completes the group (or passes
 * it); else the entry whose count completes the group writes the last's,
 * with the last's status and device word (sqe_group_count). Every entry's
 * results come before its count by the system fence before the count,
 * and the count before the last's word by the one after it, so a stream
 * that sees the last's word sees every result of the group. Returns the
 * words written (0 to 2), for complete_count.
 */
__device__ uint32_t complete_words(dk_ctx &c, dk_qp *q, const dk_cq_to &to, uint32_t status)
{
	trace(c, DK_EV_COMPLETE, status);
	if (to.gn <= 1) {
		complete_word(q, to.seq, status, to.done, false);
		return 1;
	}
	dk_group *g = &vload(&q->groups)[DFCCL_QP_SLOT(to.last, vload(&q->n))];
	const bool is_last = to.seq == to.last;
	if (is_last) {
		*(volatile uint64_t *)&g->done_off = to.done_off;
		*(volatile uint32_t *)&g->done_reg = to.done_reg;
		*(volatile uint32_t *)&g->last_status = status;
		*(volatile uint64_t *)&g->last_seq = to.seq;
	}
	__threadfence_system();
	unsigned long long w = vload(&g->count), was;
	uint64_t next;
	for (;;) {
		next = sqe_group_count(w, to.last);
		was = atomicCAS((unsigned long long *)&g->count, w, (unsigned long long)next);
		if (was == w)
			break;
		w = was;
	}
	const uint32_t count = DFCCL_CW_STATUS(next);
	if (is_last) {
		if (count < to.gn)
			return 0;
		complete_word(q, to.seq, status, to.done, true);
		return 1;
	}
	complete_word(q, to.seq, status, to.done, true);
	if (count != to.gn)
		return 1;
	__threadfence_system();
	if (vload(&g->last_seq) != to.last)
		return 1; /* counted without the last (forged): it writes its own */
	const uint32_t reg = vload(&g->done_reg);
	uint32_t rs;
	char *done = reg ? resolve(c.st, reg, vload(&q->session_id), vload(&g->done_off), 8, &rs) : NULL;
	complete_word(q, to.last, vload(&g->last_status), done, true);
	return 2;
}

/* After complete_words: the queue pair's `completed` (the futex its
 * sleeping clients wait on, proto/dfccl_queue.h; the host side wakes
 * them) advanced by the words written, which several blocks may do: under
 * the queue pair's lock, so the count only grows. Then the block's
 * counters, an entry's. */
__device__ void complete_count(dk_ctx &c, dk_qp *q, uint32_t status, uint32_t words)
{
	if (words) {
		while (atomicCAS(&q->lock, 0, 1) != 0)
			;
		uint64_t n = vload(&q->completed) + words;
		*(volatile uint64_t *)&q->completed = n;
		st_rel_sys(&vload(&q->hdr)->completed, n);
		__threadfence();
		atomicExch(&q->lock, 0);
	}
	if (status == DFCCL_CQ_OK)
		c.acc.completed++;
	else
		c.acc.errors++;
}

/* Task t's device completion word (DFCCL_SQE_F_DEVICE_DONE), or NULL: as
 * the reader resolved it in the launch that accepted t, else resolved
 * again (registrations change only while the kernel is parked), for its
 * queue pair's session while that pair is the one t came from. */
__device__ char *done_of(dk_ctx &c, const dk_task *t)
{
	if (t->done_reg == 0)
		return NULL;
	if (t->accept_epoch == c.p.epoch)
		return t->own_done;
	dk_qp *q = &c.st->qps[t->qp];
	if (!vload(&q->live) || vload(&q->gen) != t->qp_gen)
		return NULL;
	uint32_t s;
	return resolve(c.st, t->done_reg, vload(&q->session_id), t->done_off, 8, &s);
}

/* An entry's completion: its words, then the count. */
__device__ void complete(dk_ctx &c, dk_qp *q, const dk_cq_to &to, uint32_t status)
{
	complete_count(c, q, status, complete_words(c, q, to, status));
}

/* Where task t's completion goes. */
__device__ dk_cq_to cq_to_of(dk_ctx &c, const dk_task *t)
{
	return dk_cq_to{t->seq, done_of(c, t), t->done_off, t->done_reg, t->group_n, t->group_last};
}

/* Task t's completion with status. */
__device__ void complete_task(dk_ctx &c, dk_qp *q, const dk_task *t, uint32_t status)
{
	complete(c, q, cq_to_of(c, t), status);
}

/* Fails every rank of a communicator: this GPU's tasks of it through its
 * table entry, the kernels of the other GPUs it spans through their copies
 * of the region's word (which they poll, comm_aborted), and the supervisor
 * through the region's word in host memory. Plain stores: every writer
 * stores some failure, and any of them will do. */
__device__ void comm_fail(dk_comm *cm, uint32_t status)
{
	atomicCAS(&cm->abort_status, 0u, status);
	uint64_t *own = &vload(&cm->sync)->aborted;
	uint32_t np = vload(&cm->npeers);
	for (uint32_t k = 0; k < np && k < DK_MAX_PEERS; k++)
		st_rlx_sys((uint64_t *)((char *)own + vload(&cm->peer_off[k])), status);
	uint64_t *w = &vload(&cm->hdr)->aborted;
	if (ld_acq_sys(w) == 0)
		st_rel_sys(w, status);
}

/*
 * The failure status of a communicator, or 0, in a block's visit of one of
 * its tasks (vis holds the communicator). Its table entry has what the
 * supervisor (through the worker) and this kernel said. Where the
 * communicator spans GPUs, the kernels of the others say it in this GPU's
 * copy of the region's word (comm_fail), read from this GPU's memory, in
 * the same round trip as the entry; the region's word in host memory,
 * which every failure reaches too, costs a PCIe round trip and is read
 * only where `host` asks (a backstop, at a fraction of the looks:
 * chan_wait).
 */
__device__ uint32_t comm_aborted(dk_comm *cm, bool host)
{
	const bool others = !(vis.mirror && !vis.npeers);
	uint32_t a = vload(&cm->abort_status);
	uint64_t w = others ? ld_acq_sys(&vis.sync->aborted) : 0;
	if (a || !others)
		return a;
	a = dfccl_comm_abort_status(w);
	if (a || !host)
		return a;
	return dfccl_comm_abort_status(ld_acq_sys(&vload(&cm->hdr)->aborted));
}

/* ------------------------------------------------------------------ taking entries (the queue reader) */

/*
 * The communicator comm_id of an entry of queue pair q, among the first nc
 * slots, where the slot its last entry named (comm_hint, which
 * entry_prepare looks at first) is not it: every slot, eight at a time
 * with independent loads so that a scan costs one L2 round trip per eight
 * slots rather than two per slot. The slot found becomes the pair's hint.
 */
__device__ dk_comm *comm_find(dk_state *st, dk_qp *q, uint64_t comm_id, uint32_t nc, uint32_t *index)
{
	if (nc > DK_MAX_COMMS)
		nc = DK_MAX_COMMS;
	const uint32_t W = 8;
	for (uint32_t i = 0; i < nc; i += W) {
		uint32_t live[W];
		uint64_t id[W];
#pragma unroll
		for (uint32_t k = 0; k < W; k++) {
			uint32_t j = i + k < nc ? i + k : i;
			live[k] = vload(&st->comms[j].live);
			id[k] = vload(&st->comms[j].comm_id);
		}
#pragma unroll
		for (uint32_t k = 0; k < W; k++)
			if (i + k < nc && live[k] && id[k] == comm_id) {
				*index = i + k;
				q->comm_hint = i + k + 1u;
				return &st->comms[i + k];
			}
	}
	return NULL;
}

/*
 * Free tasks. The queue reader alone makes tasks live, so a task seen free
 * stays free until it takes it: the states of 32 tasks are loaded at once
 * and those found free are kept (c.free_mask), one L2 round trip per 32
 * tasks rather than one per task. The search goes round from where the
 * last one ended (the oldest frees first): task_probe looks at the next
 * group.
 */
#define DK_TASK_PROBE 32u
DFCCL_STATIC_ASSERT(DK_MAX_TASKS % DK_TASK_PROBE == 0, "task probes of whole groups");
__device__ void task_probe(dk_ctx &c)
{
	dk_state *st = c.st;
	uint32_t base = st->task_cursor / DK_TASK_PROBE * DK_TASK_PROBE % DK_MAX_TASKS;
	uint32_t state[DK_TASK_PROBE], m = 0;
#pragma unroll
	for (uint32_t k = 0; k < DK_TASK_PROBE; k++)
		state[k] = vload(&st->tasks[base + k].state);
#pragma unroll
	for (uint32_t k = 0; k < DK_TASK_PROBE; k++)
		m |= (uint32_t)(state[k] == DK_TASK_FREE) << k;
	c.free_base = base;
	c.free_mask = m;
	st->task_cursor = (base + DK_TASK_PROBE) % DK_MAX_TASKS;
}

/* At least `want` tasks known free (c.free_mask), where a probe of each
 * group finds them: the groups known free before are dropped (they are
 * found again when the search comes round). Returns how many are known. */
__device__ uint32_t task_supply(dk_ctx &c, uint32_t want)
{
	for (uint32_t r = 0; (uint32_t)__popc(c.free_mask) < want && r < DK_MAX_TASKS / DK_TASK_PROBE; r++)
		task_probe(c);
	return __popc(c.free_mask);
}

/* A free task, or DK_NO_TASK. */
__device__ uint32_t task_alloc(dk_ctx &c)
{
	for (uint32_t r = 0; !c.free_mask && r < DK_MAX_TASKS / DK_TASK_PROBE; r++)
		task_probe(c);
	if (!c.free_mask)
		return DK_NO_TASK;
	uint32_t k = __ffs(c.free_mask) - 1;
	c.free_mask &= c.free_mask - 1;
	return c.free_base + k;
}

__device__ void task_free(dk_state *st, dk_task *t)
{
	/* Its admission is given back: to its part, and to its queue pair
	 * unless the slot serves another one by now (which starts from 0). */
	dk_qp *q = &st->qps[t->qp];
	atomicSub(t->reserved_part ? &st->admit_reserve : &st->admit_shared, 1u);
	atomicSub(&st->uid_inflight[t->uid_slot], 1u);
	if (vload(&q->live) && vload(&q->gen) == t->qp_gen)
		atomicSub(&q->inflight, 1u);
	__threadfence();
	*(volatile uint32_t *)&t->state = DK_TASK_FREE;
	atomicSub(&st->live_tasks, 1u);
}

/* Channels of a collective of `bytes`: one per chan_bytes, at most `blocks`.
 * Every rank computes the same, and posts it in its shape. */
__device__ uint32_t channels_for(const dk_params &p, uint8_t opcode, uint64_t bytes)
{
	if (sqe_is_p2p(opcode) || bytes < p.chan_bytes)
		return 1; /* without a 64-bit division, which one thread pays for in every small entry */
	uint64_t c = bytes / p.chan_bytes + 1;
	uint32_t most = p.blocks - p.bulk0; /* the bulk blocks (cuda_engine.cu: at least 2) */
	return c > most ? most : (uint32_t)c;
}

/*
 * The block that runs channel 0 of the task of entry e (instance key, nch
 * channels); channel c runs on the block c after it, wrapping around the
 * task's range of blocks (dkernel.h, dk_range_lo). Where the kernel has bulk
 * blocks (dk_params.bulk0), a task of several channels runs on them, and
 * one of a single channel on the resident grid, unless `spill` (the
 * kernel has a backlog, entry_prepare) sends it to the bulk blocks too.
 * With the spread setting, a single-channel task (or, in one grid, any
 * task that leaves blocks free) starts on block lo + (key + s) * nch % the
 * range's size (dk_spread_block), where s is a hash of what the
 * instance's numbering is counted in: the communicator, and the
 * registered collective or the sending and receiving ranks of a message.
 * So consecutive collectives of one communicator run side by side on
 * consecutive blocks (or groups of nch) rather than one after the other
 * on block 0, and the i-th of different communicators (or of the
 * registered collectives of an iteration) do not all land on one block.
 * Tasks of several channels on the bulk blocks are spread only with a
 * backlog (`spill`), else they start on the first, so that a job of
 * middle sizes keeps only the blocks its channels need, and the others
 * leave (dk_main). Every rank
 * computes the same from the entry, shifted by its rank where it spreads
 * (but `spill`, which is the GPU's own:
 * a spilled task may run on different blocks on two ranks, which costs
 * them turns, not progress), so the ranks' blocks that run a channel see
 * the same tasks in the same order and run them together. A channel's
 * context and scheduling state are kept by the block that runs it
 * (dk_task.ch, dk_state.states), its protocol words and connector share
 * by the channel.
 */
__device__ uint32_t block_of(const dk_params &p, const dfccl_sqe *e, uint64_t key, uint32_t nch, bool spill)
{
	uint32_t lo, span;
	if (!dk_start_range(p.bulk0, p.blocks, nch, spill, p.spread, &lo, &span))
		return lo;
	uint64_t s = e->comm_id * 0x9E3779B97F4A7C15ull;
	if (sqe_is_p2p(e->opcode)) {
		uint64_t from = e->opcode == DFCCL_OP_SEND ? e->rank : e->peer;
		uint64_t to = e->opcode == DFCCL_OP_SEND ? e->peer : e->rank;
		s += (from << 32 | to) * 0xC2B2AE3D27D4EB4Full;
	} else if (e->flags & DFCCL_SQE_F_REGISTERED) {
		s += ((uint64_t)e->coll_id + 1) * 0x165667B19E3779F9ull;
	}
	s ^= s >> 29;
	/* In 32 bits: a 64-bit remainder costs the reader a long chain of
	 * instructions per entry. Consecutive keys still go to consecutive
	 * blocks, or groups of nch (but once in 2^32). Each rank's tasks are
	 * shifted by its rank: ranks that share a GPU then run an instance
	 * side by side, where on one block the first to come waited for the
	 * other's turn (a 2-rank 8-byte all-reduce on one H200 66 us), and
	 * ranks on different GPUs still see the same tasks in the same order
	 * on their blocks. */
	return dk_spread_block(lo, span, nch, (uint32_t)key + (uint32_t)(s ^ s >> 32) + e->rank);
}

/* The channel of task t that block b runs (>= t->nch: none); and the
 * block that runs channel ch of a task whose channel 0 runs on block0
 * (dkernel.h, dk_chan_of). */
__device__ __forceinline__ uint32_t chan_of(const dk_params &p, const dk_task *t, uint32_t b)
{
	return dk_chan_of(p.bulk0, p.blocks, t->block0, b);
}

__device__ __forceinline__ uint32_t block_at(const dk_params &p, uint32_t block0, uint32_t ch)
{
	return dk_block_at(p.bulk0, p.blocks, block0, ch);
}

/*
 * Whether an all-reduce is pushed: each rank copies its data into a
 * region of every peer's connector, stores its channel word, and reduces
 * its own connector's regions with its own data once every rank's word
 * says so. One exchange between the ranks (the posts ride along: they are
 * checked after it), no read of a peer's memory, and no wait for the peers
 * to finish reading this rank's buffers, since none does. For small ones
 * on one channel, where each peer's data fits its region of the slot's
 * connector, and only where every rank's connector is mapped. Every rank
 * decides alike: from the size, the channel count and conn_all, which are
 * the same on every GPU of the communicator, and the daemon's settings; the
 * decision, lines or not, is posted too (post_root), so ranks that decide
 * otherwise fail with a mismatch.
 */
__device__ uint8_t push_fits(const dk_params &p, uint8_t opcode, uint8_t algo, uint32_t nch, uint32_t n,
                             uint64_t bytes, uint32_t conn_all)
{
	if (!(opcode == DFCCL_OP_ALLREDUCE && algo == DFCCL_ALGO_DIRECT && nch == 1 && n >= 2 && conn_all &&
	      bytes <= p.push_bytes && bytes <= dk_push_room(nch, n)))
		return 0;
	/* The small ones as lines (dkernel.h): one exchange with no word that
	 * says it is over. Not an empty one: it would have no line to poll. */
	return bytes > 0 && bytes <= p.ll_bytes && dk_ll_fits(bytes, n) ? (uint8_t)DK_PUSH_LL : (uint8_t)DK_PUSH_PLAIN;
}

/*
 * What the checks of an entry found, made by a copier lane for each entry
 * of a chunk at once (entry_prepare) and used by the reader in the
 * entries' order (read_queues, entry_take, task_fill). Every load of the
 * checks is in the tables, which change only between launches
 * (dk_chan_ctx.epoch), so a look a few microseconds before the entry's
 * turn is as good as one at it, and the chunk's lookups overlap instead of
 * following each other: the reader's time per entry is what a batch of
 * small collectives takes per collective. The one word that changes within
 * a launch is the communicator's abort_status: an entry whose refusal
 * fails its communicator (comm_fail) leaves the later entries of the chunk
 * prepared as before it, so those become tasks, which fail at their first
 * wait (chan_wait's abort looks) with the same status, later.
 */
#define DK_NO_COMM 0xFFFFFFFFu
struct dk_prep {
	char *own_send, *own_recv; /* the entry's buffers, resolved */
	char *own_done;            /* its device completion word (DFCCL_SQE_F_DEVICE_DONE), resolved; NULL: none */
	uint32_t done_reg;         /* that word's registration (0: none) */
	void *region;              /* its communicator's protocol words (sync) */
	uint32_t check;            /* sqe_check_entry: the entry on its own */
	uint32_t status;           /* with check OK and not a NOP: what accepting it would complete with
	                            * (DFCCL_CQ_OK: acceptable) */
	uint32_t ci;               /* its communicator's slot, or DK_NO_COMM */
	uint32_t member;           /* 1: its rank is the submitting session's in ci (refusals fail the
	                            * communicator's peers: read_queues) */
	uint32_t checked;          /* 1: sqe_check_member passed (a failure after it fails the communicator) */
	uint32_t n, conn_all;      /* the communicator's ranks, and conn_all */
	uint32_t qp_gen, comm_gen, uid_slot;
	uint32_t dsize;
	/* Acceptable: the task's shape (the reader places it in its blocks'
	 * inboxes, task_fill makes it). */
	uint8_t nch, block0, algo, push;
};

/* The words of communicator slot i that entry_prepare uses, rank rk's
 * (any rank within the arrays: used only for one below nranks), loaded
 * together. */
struct dk_comm_words {
	uint64_t id, member_sess;
	struct dfccl_comm_header *sync;
	uint32_t live, n, member_dev, aborted, gen, conn_all;
};

__device__ __forceinline__ void comm_words(dk_state *st, uint32_t i, uint32_t rk, dk_comm_words *w)
{
	dk_comm *cm = &st->comms[i];
	w->live = vload(&cm->live);
	w->id = vload(&cm->comm_id);
	w->n = vload(&cm->nranks);
	w->member_sess = vload(&cm->session[rk]);
	w->member_dev = vload(&cm->device[rk]);
	w->aborted = vload(&cm->abort_status);
	w->gen = vload(&cm->gen);
	w->conn_all = vload(&cm->conn_all);
	w->sync = vload(&cm->sync);
}

/* The checks of entry e of queue pair q (taken under e->arm), the
 * `ahead`-th of its chunk, for accepting it or completing it at once: into
 * *o. Loads only. `counted` of the live tasks are the chunk's own, counted
 * ahead of it (admit_ahead). */
__device__ void entry_prepare(const dk_params &p, dk_qp *q, const dfccl_sqe *e, uint32_t ahead, uint32_t counted,
                              dk_prep *o)
{
	dk_state *st = p.st;
	uint64_t bytes;
	o->check = sqe_check_entry(e, &bytes);
	o->status = o->check;
	o->ci = DK_NO_COMM;
	o->member = o->checked = 0;
	o->own_send = o->own_recv = o->own_done = NULL;
	o->region = NULL;
	o->n = o->conn_all = 0;
	o->dsize = sqe_dtype_size(e->dtype);
	/* The device completion word is resolved whatever the entry's fate:
	 * a refused entry's stream waits there too. */
	const uint32_t done_reg = (e->flags & DFCCL_SQE_F_DEVICE_DONE) && e->done_off % 8u == 0 ? e->done_reg : 0;
	o->done_reg = done_reg;
	const bool nop = e->opcode == DFCCL_OP_NOP;
	/* The loads in two L2 round trips where they went in five, one after
	 * another: first every load that needs no other -- the
	 * registrations' first probes, the pair's words, and the words of the
	 * communicator the pair's last entry named (comm_hint) -- then, only
	 * where those miss, the searches. The tables change only between
	 * launches, so words loaded before the slot is known to be the
	 * entry's are as good as after. A pass's checks of one entry: 3.0 us
	 * before, 2.5 after (tests/perf/RESULTS.md, twenty-fifth run). */
	const uint32_t reg_ids[3] = {nop ? 0u : e->send_reg, nop ? 0u : e->recv_reg, done_reg};
	dk_reg regs[3];
	bool found[3];
	reg_probe<3>(st, reg_ids, regs);
	const uint32_t rk = e->rank < DFCCL_COMM_MAX_RANKS ? e->rank : 0;
	const uint32_t hint = vload(&q->comm_hint) - 1u;
	dk_comm_words w;
	comm_words(st, hint < DK_MAX_COMMS ? hint : 0, rk, &w);
	const uint64_t sess = vload(&q->session_id);
	const uint32_t qp_gen = vload(&q->gen), uid_slot = vload(&q->uid_slot);
	/* `counted` are among them once their count landed; a load that
	 * came first reads them as fewer, never as a wrapped count. */
	uint32_t live_tasks = vload(&st->live_tasks);
	live_tasks = live_tasks > counted ? live_tasks - counted : 0;
	const uint32_t nc = vload(&st->ctl.ncomms);
	reg_finish<3>(st, reg_ids, regs, found);
	uint32_t ds;
	if (nop && o->check == DFCCL_CQ_OK) {
		if (done_reg)
			o->own_done = resolve_found(done_reg, found[2], regs[2], sess, e->done_off, 8, &ds);
		return;
	}
	uint32_t ci = hint;
	dk_comm *cm = NULL;
	if (hint < nc && hint < DK_MAX_COMMS && w.live && w.id == e->comm_id)
		cm = &st->comms[hint];
	else if ((cm = comm_find(st, q, e->comm_id, nc, &ci)) != NULL)
		comm_words(st, ci, rk, &w);
	if (!cm) {
		if (o->status == DFCCL_CQ_OK)
			o->status = DFCCL_CQ_BAD_COMM;
		if (done_reg)
			o->own_done = resolve_found(done_reg, found[2], regs[2], sess, e->done_off, 8, &ds);
		return;
	}
	const uint32_t n = w.n;
	const uint64_t member_sess = w.member_sess;
	const uint32_t member_dev = w.member_dev, aborted = w.aborted;
	o->qp_gen = qp_gen;
	o->comm_gen = w.gen;
	o->conn_all = w.conn_all;
	o->uid_slot = uid_slot;
	o->region = w.sync;
	o->ci = ci;
	o->n = n;
	o->member = e->rank < n && member_sess == sess;
	if (done_reg) {
		o->own_done = resolve_found(done_reg, found[2], regs[2], sess, e->done_off, 8, &ds);
		if (o->status == DFCCL_CQ_OK)
			o->status = ds;
	}
	if (o->status != DFCCL_CQ_OK)
		return;
	uint32_t s = sqe_check_member(e, n, e->rank < n ? member_sess : 0, e->rank < n ? member_dev : 0, sess,
	                              p.device);
	if (s == DFCCL_CQ_OK) {
		o->checked = 1;
		uint64_t sb, rb;
		if (sqe_buf_bytes(e->opcode, e->count, o->dsize, n, e->peer == e->rank, &sb, &rb) < 0)
			s = DFCCL_CQ_OUT_OF_RANGE;
		if (s == DFCCL_CQ_OK)
			o->own_send = resolve_found(e->send_reg, found[0], regs[0], sess, e->send_off, sb, &s);
		if (s == DFCCL_CQ_OK)
			o->own_recv = resolve_found(e->recv_reg, found[1], regs[1], sess, e->recv_off, rb, &s);
		/* Aborted here (comm_fail, the host); an abort in the protocol
		 * words (another GPU's rank failed) is seen by the task's first
		 * wait, which comes before anything it stores (chan_wait's abort
		 * looks), so the reader does not wait for those words' round
		 * trip. */
		if (s == DFCCL_CQ_OK && aborted)
			s = aborted;
	}
	o->status = s;
	if (s != DFCCL_CQ_OK)
		return;
	uint32_t nch = channels_for(p, e->opcode, bytes);
	/* The entry's hint or the setting, the same on every rank. Without
	 * either the daemon kernel runs direct: the plan's size tables are
	 * estimates of the topology model that no measurement of the daemon
	 * kernel's rings and trees backs yet (`dfcclctl tune` makes one). */
	uint8_t algo = e->algo || p.algo ? algo_choose(&cm->topo, e->opcode, e->count, o->dsize, e->algo, (uint8_t)p.algo)
	                                 : (uint8_t)DFCCL_ALGO_DIRECT;
	if ((algo_uses_conn(e->opcode, algo) && !o->conn_all) || n == 1)
		algo = DFCCL_ALGO_DIRECT; /* one rank: a copy (DK_SELF) */
	o->nch = (uint8_t)nch;
	o->algo = algo;
	o->push = push_fits(p, e->opcode, algo, nch, n, bytes, o->conn_all);
	/* With a backlog (dk_spills), a single-channel task goes to the bulk
	 * blocks, and one of several starts on a block there chosen by its
	 * instance: a batch of small collectives then runs side by side there
	 * rather than one after another on the resident grid, and one of
	 * middle sizes over every bulk block rather than the first nch. The
	 * chunk's entries before it count: at a batch's start the whole chunk
	 * is placed before any of it is live, and would all go to the same
	 * blocks. */
	bool spill = dk_spills(p.bulk0, p.spill_at, nch, live_tasks, ahead);
	o->block0 = (uint8_t)block_of(p, e, e->comm_seq, nch, spill);
}

/* Records a phase of the queue reader's take (tracing: whether the trace is
 * on, kept in a register by the reader). */
__device__ __forceinline__ void take_at(dk_ctx &c, bool tracing, uint32_t phase)
{
	if (tracing)
		trace(c, DK_EV_TAKE, phase);
}

/*
 * Task ti of entry e of queue pair qi, prepared (pr) and accepted: its
 * fixed part, its channels' contexts and scheduling states. A copier lane
 * fills each task of a chunk, all at once (the stores of one task from one
 * thread took a microsecond); the reader numbered them (arrival), counted
 * their admission (part) and placed them in their blocks' inboxes, and
 * publishes them once every fill is done.
 */
__device__ void task_fill(const dk_params &p, uint32_t qi, uint32_t qn, const dfccl_sqe *e, const dk_prep &pr,
                          uint32_t ti, uint64_t arrival, uint32_t part)
{
	dk_state *st = p.st;
	dk_task *t = &st->tasks[ti];
	t->qp = qi;
	t->qp_gen = pr.qp_gen;
	t->comm = pr.ci;
	t->comm_gen = pr.comm_gen;
	t->rank = e->rank;
	t->peer = e->peer;
	t->dsize = pr.dsize;
	t->send_reg = e->send_reg;
	t->recv_reg = e->recv_reg;
	t->seq = e->arm;
	t->group_n = sqe_group(e, e->arm, qn, &t->group_last);
	t->key = e->comm_seq;
	t->count = e->count;
	t->send_off = e->send_off;
	t->recv_off = e->recv_off;
	t->own_send = pr.own_send;
	t->own_recv = pr.own_recv;
	t->own_done = pr.own_done;
	t->done_reg = (e->flags & DFCCL_SQE_F_DEVICE_DONE) ? e->done_reg : 0;
	t->done_off = e->done_off;
	t->accept_epoch = p.epoch;
	t->opcode = e->opcode;
	t->dtype = e->dtype;
	t->redop = e->redop;
	t->status = DFCCL_CQ_OK;
	t->chdone = 0;
	t->bufs_epoch = 0;
	t->early = 0; /* early_take marks its own after the fill */
	t->arrival = arrival;
	uint32_t n = pr.n;
	uint64_t nslots;
	if (sqe_is_p2p(e->opcode)) {
		int sending = e->opcode == DFCCL_OP_SEND;
		t->box = dfccl_comm_box(pr.region, n, sending ? e->rank : e->peer, sending ? e->peer : e->rank, t->key);
		t->posts = NULL;
		nslots = DFCCL_COMM_P2P_SLOTS;
		t->slot = 0;
	} else if (e->flags & DFCCL_SQE_F_REGISTERED) {
		t->posts = dfccl_comm_reg_post(pr.region, n, e->coll_id, t->key, 0);
		t->slot = dfccl_comm_reg_conn_slot(e->coll_id, t->key);
		nslots = DFCCL_COMM_COLL_SLOTS;
	} else {
		t->posts = dfccl_comm_post(pr.region, n, t->key, 0);
		t->slot = dfccl_comm_conn_slot(t->key);
		nslots = DFCCL_COMM_SLOTS;
	}
	t->slot_free = t->key > nslots ? t->key - nslots : 0;
	t->nch = pr.nch;
	t->algo = pr.algo;
	t->push = pr.push;
	t->block0 = pr.block0;
	t->reserved_part = (uint8_t)part;
	t->uid_slot = (uint8_t)pr.uid_slot;
	uint32_t first = sqe_is_p2p(e->opcode) ? (e->opcode == DFCCL_OP_SEND ? DK_BOX_FREE : DK_BOX_WANT) : DK_SLOT;
	/* A communicator of one rank copies and completes (DK_SELF): no post
	 * or peer to wait for; channel 0 waits for the instance's slot (the
	 * `done` its completion stores grows), the others copy at once. */
	const uint32_t rest = n == 1 ? DK_SELF : DK_POSTS;
	uint8_t priority = (e->flags & DFCCL_SQE_F_PRIORITY) ? e->priority : 0;
	for (uint32_t ch = 0; ch < pr.nch; ch++) {
		uint32_t b = block_at(p, pr.block0, ch);
		t->ch[b].step = ch == 0 ? first : rest;
		t->ch[b].wait_rank = 0;
		t->ch[b].pos = 0;
		t->ch[b].waits = 0;
		t->ch[b].astep = 0;
		t->ch[b].epoch = p.epoch; /* its pair and communicator were just found */
		t->ch[b].oneshot = 0;
		t->ch[b].chan = (uint16_t)ch;
		st->states[b][ti].arrival = arrival;
		st->states[b][ti].priority = priority;
		st->states[b][ti].boost = 1;
	}
}

/* The first of the next k places of block b's inbox, for the reader's
 * context c: its copy of the inbox's tail (loaded at its first use in a
 * launch), moved past them. The mask's bit is set atomically: a take at
 * once's copier lanes reserve places of different inboxes side by side
 * (take_one). */
__device__ __forceinline__ uint32_t inbox_reserve(dk_ctx *c, uint32_t b, uint32_t k)
{
	if (!(c->rknown >> b & 1u)) {
		c->rtail[b] = vload(&c->st->inbox[b].tail);
		atomicOr((unsigned long long *)&c->rknown, 1ull << b);
	}
	const uint32_t at = c->rtail[b];
	c->rtail[b] = at + k;
	return at;
}

/*
 * The reader's part of accepting a prepared entry: a free task, marked live
 * at once (task_alloc's next probes must not see it free), and its place in
 * each of its blocks' inboxes (the tails move in inbox_publish). Returns
 * the task, or DK_NO_TASK when none is free (the entry stays). A task is
 * thus live before the copier lanes fill it: sound because the only other
 * reader of `state` is the blocks' rebuild at a launch's start, and a pass
 * fills and publishes every task it took before the reader looks at park;
 * anything that comes to read `state` while the kernel runs must not take
 * a live task for a filled one.
 */
__device__ uint32_t entry_take(dk_ctx &c, const dk_prep &pr)
{
	dk_state *st = c.st;
	uint32_t ti = task_alloc(c);
	if (ti == DK_NO_TASK)
		return DK_NO_TASK;
	*(volatile uint32_t *)&st->tasks[ti].state = DK_TASK_LIVE;
	for (uint32_t ch = 0; ch < pr.nch; ch++) {
		uint32_t b = block_at(c.p, pr.block0, ch);
		st->inbox[b].idx[inbox_reserve(&c, b, 1) % DK_MAX_TASKS] = ti;
		c.rpend |= 1ull << b;
	}
	c.acc.started[pr.algo - 1]++;
	return ti;
}

DFCCL_STATIC_ASSERT(DK_MAX_BLOCKS <= 64, "dk_ctx.rpend and rknown have a bit per block");

/*
 * Whether bulk block ib's owner may leave: its side of bulk_ask's
 * handshake. It clears active, fences, and leaves only if the reader has
 * not moved the tail meanwhile; else it marks itself active again.
 */
__device__ bool bulk_leave(dk_inbox *ib)
{
	*(volatile uint32_t *)&ib->active = 0;
	asm volatile("fence.sc.gpu;" ::: "memory");
	if (vload(&ib->tail) == ib->head)
		return true;
	*(volatile uint32_t *)&ib->active = 1;
	return false;
}

/*
 * Asks the worker for a launch of each bulk block in `m`, whose inboxes
 * just received tasks, that is not running. The block's side (bulk_leave)
 * stores active = 0, fences, and leaves only if its tail has not moved;
 * the reader moves the tail, fences, and reads active: one of the two
 * sees the other's store, so a task is never left in the inbox of a block
 * that has gone with no launch asked for. Asking marks the block active,
 * so that the tasks that come before it starts ask no more; if the block
 * was still leaving, it may clear the mark after, and the next task for it
 * asks for one more launch, which finds nothing and leaves after
 * bulk_idle_ns.
 */
__device__ void bulk_ask(dk_ctx &c, uint64_t m)
{
	dk_state *st = c.st;
	asm volatile("fence.sc.gpu;" ::: "memory");
	while (m) {
		uint32_t b = __ffsll((long long)m) - 1;
		m &= m - 1;
		dk_inbox *ib = &st->inbox[b];
		if (vload(&ib->active))
			continue;
		*(volatile uint32_t *)&ib->active = 1;
		uint32_t asks = vload(&ib->asks) + 1;
		*(volatile uint32_t *)&ib->asks = asks;
		*(volatile uint32_t *)&c.p.host->bulk_want[b] = asks;
	}
}

/* The tasks placed since the last call, in their blocks' inboxes: one
 * fence publishes them and their places, then the tails move (the reader
 * alone moves them). */
__device__ void inbox_publish(dk_ctx &c)
{
	uint64_t m = c.rpend;
	if (!m)
		return;
	__threadfence();
	for (uint64_t k = m; k;) {
		uint32_t b = __ffsll((long long)k) - 1;
		k &= k - 1;
		*(volatile uint32_t *)&c.st->inbox[b].tail = c.rtail[b];
	}
	c.rpend = 0;
	c.st->arrivals = c.arrivals;
	if (c.p.bulk0 && (m >> c.p.bulk0))
		bulk_ask(c, m >> c.p.bulk0 << c.p.bulk0);
}

/* The admission of queue pair q's next entries as its tasks stand now
 * (scheduler.h), and the pair's tasks in the engine as loaded (*inflight:
 * no fewer than now, as only the reader adds to them) and its uid's slot. */
__device__ __forceinline__ struct sched_admission qp_admission(const dk_ctx &c, dk_qp *q, uint32_t *inflight,
                                                               uint32_t *uid)
{
	dk_state *st = c.st;
	struct sched_limits lim = {c.p.max_inflight, c.p.max_inflight_uid};
	*uid = vload(&q->uid_slot);
	struct sched_load load = {vload(&q->inflight), vload(&st->uid_inflight[*uid]), vload(&st->admit_reserve),
	                          vload(&st->admit_shared)};
	*inflight = load.qp;
	return sched_admit(&lim, &load);
}

/* Takes the armed entries of every queue pair. Returns how many. */
/* Entries whose words read_queues loads together. */
#define DK_SCAN 16u

/*
 * The copiers: lanes 8-31 of the queue reader's warp copy the armed entries
 * of a chunk for the reader (lane 0) into shared memory, eight lanes per
 * entry, so that each entry crosses PCIe as one 128-byte read. Loads of one
 * line of host memory from one thread are served one after another
 * (dk_prims, H200: eight 16-byte loads of an entry 5.7 us, sixteen loads of
 * different lines 1.3 us); one warp instruction's loads of a line are one
 * request, and the three entries of each instruction, and the instructions
 * after it, are in flight together. Then each entry's checks are made by a
 * lane of its own (entry_prepare), all at once. The reader names the
 * entries and meets the copiers at a warp barrier, which they wait at
 * without taking issue slots; a second barrier ends the copy (both order
 * the shared memory between them). Lanes 1-7 take no part: with lane 0
 * busy elsewhere, the copies of an instruction are whole lines only with
 * lanes 8-31.
 */
#define DK_COPIERS 0xFFFFFF00u                /* lanes 8-31 */
#define DK_COPY_LANES (DK_COPIERS | 1u)      /* and the reader: the barriers' mask */
#define DK_COPY_PER_ROUND 3u                  /* entries per warp instruction */
#define DK_COPY_ROUNDS ((DK_SCAN + DK_COPY_PER_ROUND - 1) / DK_COPY_PER_ROUND)
#define DK_COPY_QUIT 0xFFFFFFFFu              /* rcopy.n: the copiers leave */
#define DK_COPY_FILL 0x80000000u              /* rcopy.n: the copiers fill the tasks of rcopy.fill */
#define DK_COPY_TAKE 0x80000001u              /* rcopy.n: the copiers take entries 0..take_n - 1 (take_one) */
DFCCL_STATIC_ASSERT(sizeof(dfccl_sqe) == 8 * 16, "an entry is eight 16-byte pieces, one per copier lane");
DFCCL_STATIC_ASSERT(DK_SCAN <= 24, "a copier lane for each entry's checks");

struct dk_rcopy {
	const uint4 *src[DK_SCAN]; /* the entries to copy */
	uint64_t seq[DK_SCAN];     /* the sequence each is taken under */
	dk_qp *q;                  /* their queue pair */
	uint32_t qi;               /* its slot */
	uint32_t first;            /* the first of them to copy (the ones before are copied already) */
	uint32_t n;                /* how many, DK_COPY_FILL or DK_COPY_QUIT */
	uint32_t fill;             /* DK_COPY_FILL: bit i, entry i accepted as task[i] */
	uint32_t simple;           /* bit i: entry i's checks passed, a collective of one channel (take_one) */
	uint32_t valid;            /* bit i: copy i read armed under its sequence, seq_check agreeing */
	uint32_t raw;              /* bit i: copy i read armed under its sequence, seq_check or not */
	uint32_t take_n;           /* DK_COPY_TAKE: the entries, 0..take_n - 1; */
	uint32_t take_max;         /* a copy's take (read_queues): the most entries the copiers take from
	                            * the first, as take_one (0: none); the admission of that many is
	                            * counted, each in part[0] */
	uint32_t trusted;          /* bit i: copy i follows its arm word's acquire (taken where it read
	                            * armed, seq_check or not) */
	uint32_t took;             /* a copy's take: bit i, copy i taken (a run from the first) */
	volatile uint64_t *taken;  /* the pair's taken words, and its entries */
	uint32_t qn;
	dk_ctx *rc;                /* the queue reader's context: its free tasks (free_base + each bit
	                            * of free_mask, in order, one an entry), the arrival count before
	                            * entry 0's, its inboxes' tails and counters */
	uint4 buf[DK_SCAN][8];     /* their copies (arm: the sequence) */
	dk_prep prep[DK_SCAN];     /* their checks */
	uint32_t task[DK_SCAN], part[DK_SCAN]; /* accepted: the task, its admission's part */
	uint64_t arrival[DK_SCAN];
	uint64_t t_loaded, t_prepared; /* tracing: DK_TAKE_LOADED and DK_TAKE_PREPARED's times */
	uint64_t t_filled, t_handed;   /* tracing, a copy's take: its first task filled, and published */
};
__shared__ dk_rcopy rcopy;

/* rcopy.n, stored by the reader with a release and loaded by the copiers
 * with an acquire (CTA scope): with the reader's system fence after the arm
 * words before it, the copiers' loads of the entries are ordered after the
 * arm words by the memory model itself, not only by the warp barrier. */
__device__ __forceinline__ void rcopy_put_n(uint32_t n)
{
	asm volatile("st.release.cta.shared.u32 [%0], %1;" ::"r"((uint32_t)__cvta_generic_to_shared(&rcopy.n)), "r"(n)
	             : "memory");
}

__device__ __forceinline__ uint32_t rcopy_get_n(void)
{
	uint32_t n;
	asm volatile("ld.acquire.cta.shared.u32 %0, [%1];"
	             : "=r"(n)
	             : "r"((uint32_t)__cvta_generic_to_shared(&rcopy.n))
	             : "memory");
	return n;
}

/*
 * Copy i of the chunk (and its checks, pr != NULL) out of shared memory,
 * for a copier lane to work on in registers: entry_prepare and task_fill
 * reach the entry and their results through generic pointers, so with
 * both in shared memory every store of a result made the compiler load
 * the entry's fields it used next again.
 */
__device__ __forceinline__ void entry_in_registers(uint32_t i, dfccl_sqe *e, dk_prep *pr)
{
	uint4 w[sizeof(dfccl_sqe) / 16];
#pragma unroll
	for (uint32_t k = 0; k < sizeof(dfccl_sqe) / 16; k++)
		w[k] = rcopy.buf[i][k];
	memcpy(e, w, sizeof(*e));
	if (pr)
		*pr = rcopy.prep[i];
}

/*
 * Copier lane `lane`'s part of a chunk's take (DK_COPY_TAKE): entry i of
 * the run, accepted as the reader's entry_take and task_fill would have
 * it, every entry of the run at once. Its task is the i-th free one of
 * the reader's; its place in its block's inbox follows those of the run's
 * entries before it that go to the same block (the lanes of one block
 * agree on where the group starts, and its first lane moves the reader's
 * tail and publishes the group's places).
 */
__device__ __noinline__ void take_one(const dk_params &p, uint32_t lane, uint32_t i, uint32_t take_n, bool sys)
{
	dk_state *st = p.st;
	dk_ctx *rc = rcopy.rc;
	dfccl_sqe e;
	dk_prep pr;
	entry_in_registers(i, &e, &pr);
	const uint32_t ti = rc->free_base + __fns(rc->free_mask, 0, (int)i + 1);
	*(volatile uint32_t *)&st->tasks[ti].state = DK_TASK_LIVE;
	const uint32_t b = block_at(p, pr.block0, 0);
	const uint32_t lanes = ((1u << take_n) - 1u) << 8;
	const uint32_t same = __match_any_sync(lanes, b);
	const uint32_t lead = __ffs(same) - 1u;
	uint32_t at = 0;
	if (lane == lead)
		at = inbox_reserve(rc, b, __popc(same));
	at = __shfl_sync(same, at, (int)lead) + __popc(same & ((1u << lane) - 1u));
	st->inbox[b].idx[at % DK_MAX_TASKS] = ti;
	atomicAdd((unsigned long long *)&rc->acc.started[pr.algo - 1], 1ull);
	rcopy.taken[DFCCL_QP_SLOT(e.arm, rcopy.qn)] = e.arm;
	task_fill(p, rcopy.qi, rcopy.qn, &e, pr, ti, rc->arrivals + i + 1u, rcopy.part[i]);
	const bool timed = p.trace && i == 0;
	if (timed)
		rcopy.t_filled = now_ns();
	/* The group's first lane publishes the block's tasks of the run, once
	 * every lane of the group has filled its own: one fence, then the
	 * tail (the reader's own places before them were published at the end
	 * of their chunk), and a bulk block asked for. The reader's steps for
	 * this, one inbox after another, took 3.9 us a chunk (tests/perf/
	 * RESULTS.md, twenty-eighth run). */
	__syncwarp(same);
	if (lane == lead) {
		/* sys: the run's copies read their arm words without an
		 * acquire; the fence makes them one for what the tasks read. */
		if (sys)
			__threadfence_system();
		else
			__threadfence();
		*(volatile uint32_t *)&st->inbox[b].tail = rc->rtail[b];
		if (timed)
			rcopy.t_handed = now_ns();
		if (p.bulk0 && b >= p.bulk0)
			bulk_ask(*rc, 1ull << b);
	}
}

/* A copier lane's loop, until the reader says quit. */
__device__ __noinline__ void copier_main(uint32_t lane, dk_params p)
{
	const uint32_t g = (lane - 8u) / 8u, piece = lane % 8u, mine = lane - 8u;
	for (;;) {
		__syncwarp(DK_COPY_LANES); /* a request */
		uint32_t n = rcopy_get_n();
		if (n == DK_COPY_QUIT)
			return;
		if (n == DK_COPY_FILL) {
			if (mine < DK_SCAN && (rcopy.fill >> mine & 1u)) {
				dfccl_sqe e;
				dk_prep pr;
				entry_in_registers(mine, &e, &pr);
				task_fill(p, rcopy.qi, rcopy.qn, &e, pr, rcopy.task[mine], rcopy.arrival[mine],
				          rcopy.part[mine]);
				/* Its stores before the reader's publication, at GPU
				 * scope, whatever the barrier orders. */
				__threadfence();
			}
			__syncwarp(DK_COPY_LANES); /* done */
			continue;
		}
		if (n == DK_COPY_TAKE) {
			const uint32_t tn = *(volatile uint32_t *)&rcopy.take_n;
			if (mine < tn)
				take_one(p, lane, mine, tn, false);
			__syncwarp(DK_COPY_LANES); /* done */
			continue;
		}
		const uint32_t first = *(volatile uint32_t *)&rcopy.first, end = first + n;
		uint4 v[DK_COPY_ROUNDS];
#pragma unroll
		for (uint32_t r = 0; r < DK_COPY_ROUNDS; r++) {
			uint32_t i = first + r * DK_COPY_PER_ROUND + g;
			if (i < end)
				v[r] = __ldcv(*(const uint4 *const volatile *)&rcopy.src[i] + piece);
		}
#pragma unroll
		for (uint32_t r = 0; r < DK_COPY_ROUNDS; r++) {
			uint32_t i = first + r * DK_COPY_PER_ROUND + g;
			if (i < end)
				rcopy.buf[i][piece] = v[r];
		}
		__syncwarp(DK_COPIERS); /* every copy whole */
		bool simple = false, ok = false, raw = false;
		if (mine >= first && mine < end) {
			const bool timed = p.trace && mine == first;
			if (timed)
				rcopy.t_loaded = now_ns();
			/* The sequence it is taken under: into the copy in shared
			 * memory (the reader and the fill read it there) and into
			 * the registers' copy, not read back through another type. */
			const uint64_t seq = *(volatile uint64_t *)&rcopy.seq[mine];
			const dfccl_sqe *got_e = (const dfccl_sqe *)rcopy.buf[mine];
			raw = got_e->arm == seq && got_e->seq == seq;
			ok = raw && got_e->seq_check == (uint32_t)seq;
			((dfccl_sqe *)rcopy.buf[mine])->arm = seq;
			dfccl_sqe e;
			entry_in_registers(mine, &e, NULL);
			e.arm = seq;
			dk_prep pr;
			entry_prepare(p, *(dk_qp *const volatile *)&rcopy.q, &e, mine, *(volatile uint32_t *)&rcopy.take_max,
			              &pr);
			rcopy.prep[mine] = pr;
			simple = pr.check == DFCCL_CQ_OK && e.opcode != DFCCL_OP_NOP && pr.status == DFCCL_CQ_OK && pr.nch == 1;
			if (timed)
				rcopy.t_prepared = now_ns();
		}
		/* Which of these entries a chunk's take may take at once
		 * (read_queues, take_one); the others' bits as they were. */
		const uint32_t got = __ballot_sync(DK_COPIERS, simple) >> 8;
		const uint32_t oks = __ballot_sync(DK_COPIERS, ok) >> 8;
		const uint32_t raws = __ballot_sync(DK_COPIERS, raw) >> 8;
		const uint32_t range = (end >= 32u ? ~0u : (1u << end) - 1u) & ~((1u << first) - 1u);
		if (mine == 0) {
			rcopy.simple = (rcopy.simple & ~range) | (got & range);
			rcopy.valid = (rcopy.valid & ~range) | (oks & range);
			rcopy.raw = (rcopy.raw & ~range) | (raws & range);
		}
		/* The copy's take: the run read_queues would take at once, decided
		 * alike here (its armed run: a copy trusted, or read armed with
		 * seq_check agreeing, unless one read armed without it; of that,
		 * the acceptable ones from the first, as many as take_max), taken
		 * in this same round rather than after the reader's look at the
		 * copies. Only a copy from the chunk's first entry: take_one's
		 * i-th entry is copy i, on lane 8 + i. */
		const uint32_t tmax = *(volatile uint32_t *)&rcopy.take_max;
		if (tmax) {
			const uint32_t trusted = *(volatile uint32_t *)&rcopy.trusted & range;
			uint32_t t = 0;
			if (first == 0 && !(raws & ~oks & range & ~trusted)) {
				uint32_t v = (oks & range) | trusted;
				v &= ~(v + 1u);
				t = v & got;
				t &= ~(t + 1u);
				if ((uint32_t)__popc(t) > tmax)
					t = (1u << tmax) - 1u;
			}
			const uint32_t tn = __popc(t);
			if (mine < tn)
				take_one(p, lane, mine, tn, t & ~trusted);
			if (mine == 0)
				rcopy.took = t;
		}
		__syncwarp(DK_COPY_LANES); /* done */
	}
}

/* The reader's request to the copiers: copy rcopy.src[first..first + n)
 * into rcopy.buf and check them into rcopy.prep (first + n <= DK_SCAN),
 * fill the tasks of rcopy.fill (DK_COPY_FILL), or leave (DK_COPY_QUIT).
 * The reader may go on with loads of its own until copy_wait. */
__device__ __forceinline__ void copy_begin(uint32_t first, uint32_t n)
{
	*(volatile uint32_t *)&rcopy.first = first;
	rcopy_put_n(n);
	__syncwarp(DK_COPY_LANES);
}

/* The copiers' work of the last copy_begin done. */
__device__ __forceinline__ void copy_wait(void)
{
	__syncwarp(DK_COPY_LANES);
	asm volatile("" ::: "memory"); /* the copies are read after the barrier */
}

/* copy_begin, then copy_wait (but for DK_COPY_QUIT). */
__device__ void copy_entries(uint32_t n)
{
	copy_begin(0, n);
	if (n != DK_COPY_QUIT)
		copy_wait();
}

/*
 * The admission of the tasks of q that the reader accepted from its copies
 * m (bit i: rcopy entry i), in their order: the pair's count, each task's
 * part (rcopy.part, as each would have had counted alone), the uid's and
 * the parts' counts, and the live tasks. Before the tasks are published,
 * and before any admission of q is made again.
 */
__device__ void admit_count(dk_ctx &c, dk_qp *q, uint32_t m)
{
	dk_state *st = c.st;
	if (!m)
		return;
	uint32_t na = __popc(m), nres = 0;
	uint32_t uid = rcopy.prep[__ffs(m) - 1].uid_slot;
	uint32_t inflight = atomicAdd(&q->inflight, na);
	while (m) {
		uint32_t i = __ffs(m) - 1;
		m &= m - 1;
		uint32_t part = (uint32_t)sched_admit_reserved(inflight++);
		rcopy.part[i] = part;
		nres += part;
	}
	atomicAdd(&st->uid_inflight[uid], na);
	if (nres)
		atomicAdd(&st->admit_reserve, nres);
	if (na > nres)
		atomicAdd(&st->admit_shared, na - nres);
	atomicAdd(&st->live_tasks, na);
}

/*
 * The admission of the k entries a copy's take may take (read_queues),
 * counted before the copy: the tasks it publishes must not be freed
 * before they are counted. All in one part: within one admission's room
 * the pair's next tasks are all reserved or all shared (scheduler.h,
 * sched_admit_room), judged from `inflight` (no fewer than now: a task
 * freed meanwhile only moves the judgement to the shared part). The
 * copiers' checks take the k from the live tasks they read (the barrier
 * that starts the copy orders these counts before their loads).
 */
__device__ void admit_ahead(dk_ctx &c, dk_qp *q, uint32_t uid, uint32_t inflight, uint32_t k)
{
	dk_state *st = c.st;
	const uint32_t part = (uint32_t)sched_admit_reserved(inflight);
	for (uint32_t i = 0; i < k; i++)
		rcopy.part[i] = part;
	atomicAdd(&q->inflight, k);
	atomicAdd(&st->uid_inflight[uid], k);
	atomicAdd(part ? &st->admit_reserve : &st->admit_shared, k);
	atomicAdd(&st->live_tasks, k);
}

/* admit_ahead's count of k entries given back (a copy's take took fewer). */
__device__ void admit_back(dk_ctx &c, dk_qp *q, uint32_t uid, uint32_t k)
{
	dk_state *st = c.st;
	atomicSub(&q->inflight, k);
	atomicSub(&st->uid_inflight[uid], k);
	atomicSub(rcopy.part[0] ? &st->admit_reserve : &st->admit_shared, k);
	atomicSub(&st->live_tasks, k);
}

/*
 * A pass over a queue pair looks at DK_SCAN_WINDOW entries from its head
 * and at DK_SCAN more past them, from where the last pass's look stopped
 * (dk_qp.sweep), going round the posted entries: a client whose streams
 * arm entries in the order they were posted has its next armed entry at
 * the head, while a queue may hold a whole lap posted ahead, whose arm
 * words cost a PCIe round trip per DK_SCAN. So a pass over a pair that
 * looks costs four round trips (its header, the window, the chunk)
 * however long the queue, plus the copy of each entry it takes, and an
 * entry armed beyond the window (several streams arming out of order) is
 * seen within n / DK_SCAN looking passes (look_past: at most every 4th pass
 * looks past an unarmed head). A pass whose head is armed takes in order instead
 * (scheduler.h): the window and the chunk right after it, up to the
 * first entry not armed; one whose head is not takes an entry past
 * entries not taken only if none of them reads armed after it
 * (armed_before).
 */
#define DK_SCAN_WINDOW 32u

/* The fewest entries a chunk's take takes at once (read_queues): fewer
 * go entry by entry, which cost a lone entry about 0.7 us less than the
 * lanes' take (its lanes' agreement on the inboxes, their atomics; one
 * H200, tests/perf/RESULTS.md, twenty-seventh run). Since the lanes
 * publish their own tasks, 1 measured the same as 4 (twenty-eighth run). */
#define DK_TAKE_AT_ONCE 4u

/*
 * A pass whose head is not armed costs a PCIe round trip for the header
 * and the head's arm word, and one more per DK_SCAN entries it looks at
 * past the head. A stream arms its entries in order, so the next entry
 * of a queue pair is mostly its head: at most every DK_LOOK_PAST-th pass
 * looks past an unarmed head, and the others come round at a fraction of
 * the cost, so that the head's arm is seen sooner. The looks past the
 * head (the window, the sweep, and beyond the pair's room for entries
 * whose instance a peer posted: scheduler.h) thus take DK_LOOK_PAST times
 * the passes they took or more, and their cursors move on looking passes
 * only.
 * The price: two GPUs' readers are at different points of their cycles,
 * so entries of different streams armed a few passes apart, the later
 * one past the head, may be taken in different orders by different GPUs
 * (scheduler.h, "Taking in order"), where before they had to be armed
 * within about one pass of each other (more while the looks back off:
 * DK_LOOK_PAST_MAX).
 */
#define DK_LOOK_PAST 4u

/*
 * Per queue pair, the looks back off: a look past the head that finds
 * nothing armed there doubles the pair's gap to its next look, up to
 * DK_LOOK_PAST_MAX, and one that finds an entry armed past the head
 * brings it back to DK_LOOK_PAST. The gap counts the passes that find
 * the pair active with its head unarmed. A pair fed by one stream, which
 * arms its entries in order, thus rarely pays for a look, while one whose
 * streams arm out of order keeps the rate above. A look past a long
 * queue costs several PCIe round trips (a window and a sweep chunk: about
 * 10 us on H200), and an arm that comes during one waits for it to end;
 * with a look every 4th pass, the looks took about half of the reader's
 * time while a stream-ordered client waited between its calls (2 ranks on
 * 2 H200: 8 B-4 KiB all-reduces 43.8-45.9 -> 42.6-43.6 us a call, 32 KiB
 * 54.4 -> 50.2).
 *
 * The price, after a run in order: an entry armed out of order is found
 * after as many looks as before, but those come up to DK_LOOK_PAST_MAX
 * passes apart, so one beyond the window, which the sweep reaches only
 * DK_SCAN entries a look, waits up to n / DK_SCAN * DK_LOOK_PAST_MAX
 * passes (a 256-entry queue: 512 passes, about 2 ms) where it waited a
 * quarter of that; and two GPUs' readers may take entries of different
 * streams armed up to about DK_LOOK_PAST_MAX passes apart in different
 * orders (scheduler.h, "Taking in order"), which preemption resolves as
 * it does any order. Once a look finds one, the rate is back. The cause
 * is that a look which covered only part of the queue backs off too;
 * backing off only after looks that reached the tail would remove it.
 * The pairs past the reader's cache (DK_QCACHE) keep the fixed rate.
 */
#define DK_LOOK_PAST_MAX 32u
DFCCL_STATIC_ASSERT(DK_LOOK_PAST >= 1 && DK_LOOK_PAST_MAX <= 255, "a pair's gap is kept in a byte (dk_qcache)");

/* Whether this pass looks past pair qi's unarmed head. */
__device__ __forceinline__ bool look_past(const dk_ctx &c, uint32_t qi)
{
	if (c.passes == 0) /* a whole look (before sleeping) */
		return true;
	if (qi >= DK_QCACHE)
		return c.passes % DK_LOOK_PAST == 0;
	if (qcache.look_wait[qi] == 0)
		return true;
	qcache.look_wait[qi]--;
	return false;
}

/* After a look past pair qi's head: whether it found an entry armed there. */
__device__ __forceinline__ void look_found(uint32_t qi, bool found)
{
	if (qi >= DK_QCACHE)
		return;
	uint32_t gap = found ? DK_LOOK_PAST : 2u * qcache.look_gap[qi];
	gap = gap > DK_LOOK_PAST_MAX ? DK_LOOK_PAST_MAX : gap;
	qcache.look_gap[qi] = (uint8_t)gap;
	qcache.look_wait[qi] = (uint8_t)(gap - 1u);
}

/* Bit k: entry s0 + k (to hi, at most DK_SCAN of them) read taken, the
 * chunk's taken words in one L2 round trip (read_queues: a chunk that
 * starts past taken_hi loads none). The words stay in registers
 * (constant indices only) and are reduced to a mask: a value stored to
 * memory right after its load would make every load wait for the one
 * before. */
__device__ __forceinline__ uint32_t taken_mask(const volatile uint64_t *taken, uint32_t n, uint64_t s0, uint64_t hi)
{
	uint64_t tk[DK_SCAN];
	uint32_t m = 0;
#pragma unroll
	for (uint32_t k = 0; k < DK_SCAN; k++)
		tk[k] = s0 + k <= hi ? taken[DFCCL_QP_SLOT(s0 + k, n)] : 0;
#pragma unroll
	for (uint32_t k = 0; k < DK_SCAN; k++)
		m |= (uint32_t)(tk[k] == s0 + k) << k;
	return m;
}

/*
 * The first entry of [from, s) not taken yet that reads armed, loaded after
 * the acquire of s's arm word (0: none; scheduler.h, "Taking in order"): a
 * stream arms its entries one after the other, each write after a fence,
 * so an entry armed before s shows here even where the pass's first look
 * missed it. Out of line, as the reader is: it is off the common path.
 */
__device__ __noinline__ uint64_t armed_before(const dfccl_sqe *sq, const volatile uint64_t *taken, uint32_t n,
                                              uint64_t from, uint64_t s)
{
	for (uint64_t s0 = from; s0 < s; s0 += DK_SCAN) {
		uint64_t tk[DK_SCAN], arm[DK_SCAN];
#pragma unroll
		for (uint32_t k = 0; k < DK_SCAN; k++) {
			uint32_t slot = DFCCL_QP_SLOT(s0 + k, n);
			tk[k] = s0 + k < s ? taken[slot] : s0 + k;
			arm[k] = s0 + k < s ? vload(&sq[slot].arm) : 0;
		}
#pragma unroll
		for (uint32_t k = 0; k < DK_SCAN; k++)
			if (tk[k] != s0 + k && arm[k] == s0 + k)
				return s0 + k;
	}
	return 0;
}

/* After the copier lanes took copies 0..nrun - 1 (take_one): the tasks
 * known free, the arrival count and cpu_last moved past them. */
__device__ __forceinline__ void run_taken(dk_ctx &c, uint32_t nrun)
{
	uint32_t fm = c.free_mask;
	for (uint32_t k = 0; k < nrun; k++)
		fm &= fm - 1u;
	c.free_mask = fm;
	c.arrivals += nrun;
	c.st->arrivals = c.arrivals;
	c.cpu_last = !(((const dfccl_sqe *)rcopy.buf[nrun - 1u])->flags & DFCCL_SQE_F_STREAM_ARMED);
}

/*
 * The reader's part of a chunk's take at once (read_queues): entries
 * 0..nrun - 1 of the copies, of queue pair q (taken: its taken words, n
 * its entries), counted and taken by the copier lanes, which publish them
 * (take_one), then the tasks known free, the arrival count and cpu_last
 * moved past them. Out of line, so that the entry-by-entry steps keep
 * their registers.
 */
__device__ __noinline__ void take_run(dk_ctx &c, dk_qp *q, volatile uint64_t *taken, uint32_t n, uint32_t nrun,
                                      bool tracing)
{
	take_at(c, tracing, DK_TAKE_ARMED);
	admit_count(c, q, (1u << nrun) - 1u);
	/* The admission's counts before the tasks are published (as before
	 * inbox_publish's). */
	__threadfence();
	rcopy.take_n = nrun;
	rcopy.taken = taken;
	rcopy.qn = n;
	rcopy.rc = &c;
	copy_entries(DK_COPY_TAKE);
	take_at(c, tracing, DK_TAKE_TASK);
	run_taken(c, nrun);
	take_at(c, tracing, DK_TAKE_DONE);
}

/* Pair qi's head moved from `head` to h (its entries below taken), and on
 * past those taken already after it, up to the tail. */
__device__ __forceinline__ void head_advance(dk_qp *q, uint32_t qi, dfccl_qp_header *hdr, volatile uint64_t *taken,
                                             uint32_t n, uint64_t head, uint64_t h, uint64_t tail)
{
	while (h <= tail && (qi >= DK_QCACHE || h <= qcache.taken_hi[qi]) && taken[DFCCL_QP_SLOT(h, n)] == h)
		h++;
	if (h != head) {
		*(volatile uint64_t *)&q->head = h;
		if (qi < DK_QCACHE)
			qcache.head[qi] = h;
		/* For the client's and dfcclctl's information only: a plain
		 * store, which waits for nothing. */
		*(volatile uint64_t *)&hdr->sq_head = h;
	}
}

/*
 * A stream-ordered collective taken before its arm. A client that runs
 * ahead of its stream (a trainer, or nccl-tests' loop) posts its entries
 * long before the stream arms them, one after the work before it; a pass
 * that waits for the arm then spends, after it, the poll that finds it,
 * the entry's copy, its checks, the admission, the fill and the handing to
 * a block: 22.6 us from a completion to the next entry of the same stream
 * taken on two H200 (tests/perf/RESULTS.md, thirty-third run), most of a
 * 34 us call. Taken early, all of that runs while the stream's work before
 * it does, and the task waits on its block for the arm word (early_wait),
 * which starts it at once: the instance's slot, its post, the exchange
 * (34 -> 22 us a call there).
 *
 * Only the pair's head, not armed, posted whole (seq_check agrees, read
 * with an acquire before the copy: the client stores it after every other
 * field), armed by a stream, not part of a group, a collective of one
 * channel whose checks passed, with room for one more after it (a task
 * charged while it waits for its arm must not take the pair's last room
 * from an armed entry) and a free task. An entry it copies and leaves is
 * not copied again (dk_qp.early_no), and after DK_EARLY_MISSES such in a
 * row only every DK_EARLY_SAMPLE-th head is looked at until one is taken:
 * a pair of NOPs, groups or collectives of several channels paid a copy
 * and its checks in the pass after each take (stream-ordered NOPs 16 -> 25
 * us each). One such task a pair at a time (dk_qp.early).
 *
 * Given back. A task not armed yet goes back to its queue, unposted and
 * unfinished (early_give_back): where such tasks alone kept the kernel
 * resident for DK_EARLY_WAIT_NS (reader_main asks, st->early_ask, and
 * takes none early for DK_EARLY_OFF_NS), so that the kernel quits as
 * without them and a trainer's compute gets its SMs (and, without MPS, the
 * GPU) back, the launch gate waiting on the entry again; where a pair
 * finds the engine out of admission room (read_queues: the arm may wait
 * on an entry that room would admit); and where its
 * communicator failed first, so that the entry completes, failed, only
 * once its stream armed it, as any other (a completion before the arm
 * would let the client post the slot's next lap, whose arm the stream's
 * late one could overwrite). Its block frees the task and marks its taken
 * word and dk_qp.early_back; the reader moves the pair's head back to it
 * (early_move_back). A pair removed meanwhile: the removal parks the
 * kernel, and a new launch's first visit drops the task. The early-take
 * setting (dk_params.early_take, on by default) turns all of this on.
 */
#define DK_EARLY_OFF_NS 10000000ull

/* The reader asks the blocks for every early task not armed yet
 * (early_wait gives it back) and takes none early for DK_EARLY_OFF_NS. */
__device__ void early_ask_back(dk_ctx &c, uint64_t now)
{
	*(volatile uint64_t *)&c.st->early_off = now + DK_EARLY_OFF_NS;
	*(volatile uint32_t *)&c.st->early_ask = 1;
}
__device__ __noinline__ bool early_take(dk_ctx &c, dk_qp *q, uint32_t qi, dfccl_qp_header *hdr, const dfccl_sqe *sq,
                                        volatile uint64_t *taken, uint32_t n, uint64_t head, uint64_t tail)
{
	dk_state *st = c.st;
	if (vload(&q->early) != 0 || vload(&q->early_no) == head || vload(&q->early_back) != 0)
		return false;
	const uint64_t now = now_ns();
	if (now < vload(&st->early_off))
		return false;
	const uint32_t miss = vload(&q->early_miss);
	if (!dk_early_looks(miss, head))
		return false;
	const uint32_t slot = DFCCL_QP_SLOT(head, n);
	if (ld_acq_sys32(&sq[slot].seq_check) != (uint32_t)head)
		return false;
	uint32_t inflight, uid;
	struct sched_admission a = qp_admission(c, q, &inflight, &uid);
	if (a.refuse != DFCCL_CQ_OK || a.room < 2u) /* dk_early_fits's room, before the copy */
		return false;
	/* The copy and its checks, after seq_check's acquire. */
	rcopy.src[0] = (const uint4 *)&sq[slot];
	rcopy.seq[0] = head;
	rcopy.q = q;
	rcopy.qi = qi;
	rcopy.take_max = 0;
	copy_begin(0, 1);
	copy_wait();
	const dfccl_sqe *e = (const dfccl_sqe *)rcopy.buf[0];
	const dk_prep &pr = rcopy.prep[0];
	if (!dk_early_fits(e, head, rcopy.simple & 1u, a.room)) {
		/* Taken once armed, as any other. */
		*(volatile uint64_t *)&q->early_no = head;
		if (miss < DK_EARLY_MISSES)
			*(volatile uint32_t *)&q->early_miss = miss + 1u;
		return false;
	}
	const uint32_t ti = entry_take(c, pr);
	if (ti == DK_NO_TASK)
		return false;
	/* The blocks gave back what the last ask was for (its early_off has
	 * run out): this one is not asked for. */
	if (vload(&st->early_ask))
		*(volatile uint32_t *)&st->early_ask = 0;
	rcopy.task[0] = ti;
	rcopy.arrival[0] = ++c.arrivals;
	admit_count(c, q, 1u);
	atomicAdd(&st->early_tasks, 1u);
	c.early_live = true;
	c.acc.early_taken++;
	rcopy.fill = 1u;
	rcopy.qn = n;
	copy_entries(DK_COPY_FILL);
	*(volatile uint8_t *)&st->tasks[ti].early = 1;
	*(volatile uint64_t *)&q->early = head;
	if (miss)
		*(volatile uint32_t *)&q->early_miss = 0;
	taken[slot] = head;
	c.cpu_last = false;
	inbox_publish(c);
	head_advance(q, qi, hdr, taken, n, head, head + 1u, tail);
	return true;
}

/*
 * The entries the blocks gave back (early_give_back): each pair's head
 * moved back to its entry (its taken word no longer says taken), which is
 * then not taken early again at once (early_no), and the pair may take
 * another early. The reader's cache of the pair is dropped: its taken_hi
 * says which entries may read taken, and was raised past none of those
 * taken in order after the head (read_queues loads it afresh, from the
 * new head, on its next look). Where no pair holds one, the count is a
 * removed pair's (its slot zeroed on its next use): dropped. Out of line:
 * rare.
 */
__device__ __noinline__ void early_move_back(dk_ctx &c, uint32_t backs)
{
	dk_state *st = c.st;
	/* The count's load an acquire: each block's taken word and early_back
	 * came before its count (early_give_back). */
	__threadfence();
	uint32_t found = 0;
	for (uint32_t qi = 0; qi < c.nqps && qi < DK_MAX_QPS; qi++) {
		dk_qp *q = &st->qps[qi];
		const uint64_t s = vload(&q->early_back);
		if (!s)
			continue;
		found++;
		if (vload(&q->live)) {
			const bool cached = qi < DK_QCACHE && (qcache.known >> qi & 1u);
			const uint64_t head = cached ? qcache.head[qi] : vload(&q->head);
			if (s < head) {
				*(volatile uint64_t *)&q->head = s;
				*(volatile uint64_t *)&vload(&q->hdr)->sq_head = s;
			}
			if (cached)
				qcache.known &= ~(1u << qi);
			*(volatile uint64_t *)&q->early_no = s;
			*(volatile uint64_t *)&q->early = 0;
		}
		*(volatile uint64_t *)&q->early_back = 0;
	}
	if (found) {
		/* An early_back found before its block's count: the taken word
		 * before it is read after this. */
		__threadfence();
		atomicSub(&st->early_backs, min(found, backs));
	} else {
		atomicCAS(&st->early_backs, backs, 0u);
	}
}

/* Out of line: the queue reader is one thread of its own (reader_main),
 * and inlined into dk_main its registers shaped the allocation of the
 * blocks' loop too (ptxas: 714 bytes of dk_main's spills, 610 with the
 * reader apart). */
__device__ __noinline__ uint32_t read_queues(dk_ctx &c)
{
	dk_state *st = c.st;
	const bool tracing = c.p.trace != NULL;
	uint32_t got = 0;
	if (c.early_live) {
		/* The tasks' count first, an acquire: a block counts its
		 * give-back before it uncounts the task (early_give_back), so
		 * with none left the give-back's count is seen. Neither: both
		 * stay 0 until the reader takes one early again, and no pass
		 * loads them (a callback-form pair pays nothing for them). */
		const uint32_t tasks = ld_acq_gpu32(&st->early_tasks);
		const uint32_t backs = vload(&st->early_backs);
		if (backs)
			early_move_back(c, backs);
		else if (!tasks)
			c.early_live = false;
	}
	for (uint32_t qi = 0; qi < c.nqps && qi < DK_MAX_QPS; qi++) {
		dk_qp *q = &st->qps[qi];
		const bool cached = qi < DK_QCACHE && (qcache.known >> qi & 1u);
		uint32_t n;
		dfccl_qp_header *hdr;
		dfccl_sqe *sq;
		volatile uint64_t *taken;
		uint64_t head;
		if (cached) {
			if (!(qcache.live >> qi & 1u))
				continue;
			n = qcache.n[qi];
			hdr = qcache.hdr[qi];
			sq = qcache.sq[qi];
			taken = qcache.taken[qi];
			head = qcache.head[qi];
		} else {
			if (!vload(&q->live)) {
				if (qi < DK_QCACHE)
					qcache.known |= 1u << qi;
				continue;
			}
			/* Table fields through L2: the slot may have served another
			 * queue pair before, and L1 is not kept coherent with the
			 * host's copies. */
			n = vload(&q->n);
			hdr = vload(&q->hdr);
			sq = vload(&q->sq);
			taken = vload(&q->taken);
			head = vload(&q->head);
			if (qi < DK_QCACHE) {
				qcache.n[qi] = n;
				qcache.hdr[qi] = hdr;
				qcache.sq[qi] = sq;
				qcache.taken[qi] = taken;
				qcache.head[qi] = head;
				qcache.look_gap[qi] = DK_LOOK_PAST;
				qcache.look_wait[qi] = 0;
				qcache.known |= 1u << qi;
				qcache.live |= 1u << qi;
			}
		}
		uint64_t h = head;
		/* Three words in one PCIe round trip: the state, the tail and
		 * the arm word of the head's entry. Only the arm word orders
		 * what follows (its acquire: the entry was written before it);
		 * the tail only says how far to look, and the state needs no
		 * order (a pair closed a moment ago has its entries taken, as
		 * one closed a moment later would). */
		uint32_t qstate = vload(&hdr->qp_state);
		uint64_t tail = vload(&hdr->sq_tail);
		uint64_t arm_head = ld_acq_sys(&sq[DFCCL_QP_SLOT(head, n)].arm);
		if (!cached && qi < DK_QCACHE)
			qcache.taken_hi[qi] = head + n - 1u;
		/* No entry from here on reads taken (taken_hi). */
		const uint64_t untaken = qi < DK_QCACHE ? qcache.taken_hi[qi] + 1u : ~0ull;
		if (tail < head || qstate != DFCCL_QP_ACTIVE)
			continue;
		if (arm_head != head && c.p.early_take && early_take(c, q, qi, hdr, sq, taken, n, head, tail)) {
			got++;
			continue;
		}
		/* Past an unarmed head only on some passes (look_past), before
		 * the admission's loads too. */
		const bool past = arm_head != head;
		if (past && !look_past(c, qi))
			continue;
		bool seen = false; /* an entry not taken read armed */
		take_at(c, tracing, DK_TAKE_HEADER);
		/* The client owns the tail: never look further than one lap. */
		if (tail >= head + n)
			tail = head + n - 1;
		/* Fair admission (scheduler.h): entries beyond the pair's room
		 * stay armed in its queue, but for those whose instance a peer
		 * posted; at a limit they are refused. A pass that starts with
		 * no room looks at a few entries, from where the last stopped. */
		uint32_t inflight, uid;
		struct sched_admission a = qp_admission(c, q, &inflight, &uid);
		uint32_t room = a.room, beyond = a.beyond, looks = 0;
		bool readmit = true; /* the admission may be made again where the room ran out */
		bool looking = a.refuse == DFCCL_CQ_OK && room == 0;
		/* Out of room (the engine's parts used up: a pair at its own
		 * limit is refused instead) while tasks taken early wait for
		 * their arms: an arm may come only after an entry that has no
		 * room now (another stream's collective, on this pair or
		 * another), so every early task goes back and its room with it
		 * (scheduler.h's any order counts only armed entries). */
		if (looking && c.early_live && vload(&st->early_tasks) != 0 && !vload(&st->early_ask))
			early_ask_back(c, now_ns());
		uint64_t start = looking ? sched_look_start(vload(&q->look), head, tail) : head, stopped = 0;
		/* In order (scheduler.h, "Taking in order"): with the head armed
		 * the pass takes the armed run from it, through the window and on
		 * into the chunk right after it, and ends at the run's first gap. */
		bool in_order = !looking && arm_head == head;
		/* Looking beyond the room keeps its own bounds (scheduler.h);
		 * else the window, then the sweep's DK_SCAN entries past it. */
		uint64_t end = !looking && tail - start >= DK_SCAN_WINDOW ? start + DK_SCAN_WINDOW - 1 : tail;
		uint64_t sweep = end + 1;
		if (end < tail && !in_order) {
			uint64_t at = vload(&q->sweep);
			if (at > sweep && at <= tail)
				sweep = at;
		}
		bool stop = false;
		for (uint32_t part = 0; part < 2 && !stop; part++) {
			if (part == 1 && end >= tail)
				break;
			uint64_t lo = part == 0 ? start : sweep;
			uint64_t hi = part == 0 ? end : (sweep + DK_SCAN - 1 < tail ? sweep + DK_SCAN - 1 : tail);
			for (uint64_t s0 = lo; s0 <= hi && !stop; s0 += DK_SCAN) {
				/* The taken words of DK_SCAN entries at once (none past
				 * taken_hi), then, unless the chunk is copied with them,
				 * their arm words at once (relaxed): a stream arms its
				 * entries long after they are posted, so a queue may hold
				 * many posted entries of which few are armed, and a round
				 * trip per entry would make every pass as slow as the
				 * queue is long. Each is reduced to a mask in registers. */
				uint32_t was_taken = 0, armed = 0; /* bit k: entry s0 + k */
				uint32_t adm = 0, fill = 0; /* bit i: copy i accepted, its admission not counted / its task to fill */
				/* In order, a chunk none of whose entries a pass took
				 * already: its entries copied at once, their arm words
				 * with them (proto/dfccl_queue.h: a copy is trusted where
				 * it read armed and seq_check agrees), and the run of
				 * such from the first taken (the head read armed
				 * already, an acquire). The chunk's arm words cost a
				 * round trip of their own before, 3.6 us a chunk (one
				 * H200, tests/perf/RESULTS.md, twenty-ninth run). */
				uint32_t spec_v = 0; /* the copies that read armed and checked */
				uint32_t ct = 0;     /* entries the copy's take took, from s0 */
				if (s0 < untaken)
					was_taken = taken_mask(taken, n, s0, hi);
				bool spec = in_order && !was_taken;
				if (spec) {
					const uint32_t cnt = hi - s0 + 1 < DK_SCAN ? (uint32_t)(hi - s0 + 1) : DK_SCAN;
					for (uint32_t k = 0; k < cnt; k++) {
						rcopy.src[k] = (const uint4 *)&sq[DFCCL_QP_SLOT(s0 + k, n)];
						rcopy.seq[k] = s0 + k;
					}
					rcopy.q = q;
					rcopy.qi = qi;
					/* The copy's take (copier_main): the chunk's first
					 * entries, where the chunk starts at the first not
					 * taken, the pair may take more and tasks are free, are
					 * taken by the copier lanes in the round that copies
					 * and checks them, so a lone entry costs one round of
					 * the lanes, not three (copy, fill, publish). */
					uint32_t tmax = 0;
					if (s0 == h && a.refuse == DFCCL_CQ_OK && room > 0) {
						const uint32_t want = cnt < room ? cnt : room;
						tmax = min(want, task_supply(c, want));
					}
					if (tmax) {
						/* Without the fence take_run makes after its
						 * counts: the barrier that starts the copy orders
						 * them before the lanes' fence and publication. */
						admit_ahead(c, q, uid, inflight, tmax);
						inflight += tmax;
						rcopy.taken = taken;
						rcopy.qn = n;
						rcopy.rc = &c;
					}
					rcopy.take_max = tmax;
					rcopy.trusted = s0 == head ? 1u : 0u;
					copy_begin(0, cnt);
					copy_wait();
					if (tmax) {
						ct = __popc(rcopy.took);
						if (ct < tmax) {
							admit_back(c, q, uid, tmax - ct);
							inflight -= tmax - ct;
						}
						rcopy.take_max = 0; /* the other copies take nothing */
						if (ct)
							run_taken(c, ct);
					}
					const uint32_t all = (cnt >= 32u ? ~0u : (1u << cnt) - 1u) & ~(s0 == head ? 1u : 0u);
					spec_v = rcopy.valid & all;
					/* A copy that read armed without its seq_check (a client
					 * that does not write it, or a line read before the
					 * client's stores reached it): the chunk the usual way,
					 * its arm words first. */
					spec = !(rcopy.raw & ~spec_v & all);
				}
				if (spec) {
					uint32_t v = spec_v;
					if (s0 == head)
						v |= 1u; /* its arm word read armed, an acquire: copied after */
					armed = v & ~(v + 1u);
					seen = seen || armed;
					/* The fence after the loads that read the arm words makes
					 * them acquires for what the tasks read later (the copy's
					 * take fenced for its own). */
					if (armed & ~((1u << ct) - 1u) & ~(s0 == head ? 1u : 0u))
						__threadfence_system();
					take_at(c, tracing, DK_TAKE_SCANNED);
					if (armed) {
						if (tracing) {
							trace_at(c, DK_EV_TAKE, DK_TAKE_LOADED, rcopy.t_loaded);
							trace_at(c, DK_EV_TAKE, DK_TAKE_PREPARED, rcopy.t_prepared);
							if (ct) {
								trace_at(c, DK_EV_TAKE, DK_TAKE_FILLED, rcopy.t_filled);
								trace_at(c, DK_EV_TAKE, DK_TAKE_HANDED, rcopy.t_handed);
							}
						}
						take_at(c, tracing, DK_TAKE_COPIED);
					}
				}
				/* Else, in order, the head is armed (its arm word an
				 * acquire) and not taken (the head is the first entry not
				 * taken): its copy and checks are asked for before the
				 * chunk's words are loaded, not after. The copier lanes
				 * share the reader's warp, so the two overlap only in
				 * part: a pass that takes one entry went from 15.0 to 13.4
				 * us (2 H200, tests/perf/RESULTS.md, fifteenth run). */
				const bool early = !spec && in_order && s0 == head;
				if (early) {
					rcopy.src[0] = (const uint4 *)&sq[DFCCL_QP_SLOT(head, n)];
					rcopy.seq[0] = head;
					rcopy.q = q;
					rcopy.qi = qi;
					copy_begin(0, 1);
				}
				if (!spec) {
					{
						/* The arm words (PCIe), reduced to a mask (the taken
						 * words were before them). */
						uint64_t arm[DK_SCAN];
#pragma unroll
						for (uint32_t k = 0; k < DK_SCAN; k++)
							arm[k] = s0 + k <= hi && s0 + k != head ? vload(&sq[DFCCL_QP_SLOT(s0 + k, n)].arm)
							                                       : arm_head;
#pragma unroll
						for (uint32_t k = 0; k < DK_SCAN; k++)
							armed |= (uint32_t)(arm[k] == s0 + k) << k;
					}
					armed &= ~was_taken;
					seen = seen || armed;
					/* One acquire for every armed entry of the chunk but the
					 * head (its arm word was an acquire load): the fence after
					 * the relaxed loads orders the copies after them, where a
					 * second load of each arm word with an acquire cost a PCIe
					 * round trip per entry. */
					if (armed & ~(s0 == head ? 1u : 0u))
						__threadfence_system();
					take_at(c, tracing, DK_TAKE_SCANNED);
					/* Every armed entry of the chunk copied at once (but an
					 * early head: copied already, and kept unless it read
					 * taken), after the acquire; those the pass then leaves
					 * cost nothing more. */
					const bool kept = early && (armed & 1u);
					if (early)
						copy_wait();
					if (armed & ~(kept ? 1u : 0u)) {
						uint32_t nc = kept ? 1u : 0u, first = nc;
						for (uint32_t k = nc; k < DK_SCAN; k++)
							if (armed >> k & 1u) {
								rcopy.src[nc] = (const uint4 *)&sq[DFCCL_QP_SLOT(s0 + k, n)];
								rcopy.seq[nc++] = s0 + k;
							}
						rcopy.q = q;
						rcopy.qi = qi;
						copy_begin(first, nc - first);
						copy_wait();
					}
					if (armed) {
						if (tracing) {
							trace_at(c, DK_EV_TAKE, DK_TAKE_LOADED, rcopy.t_loaded);
							trace_at(c, DK_EV_TAKE, DK_TAKE_PREPARED, rcopy.t_prepared);
						}
						take_at(c, tracing, DK_TAKE_COPIED);
					}
				}
				/* The common case at once (take_one): in order, the
				 * chunk's armed entries a run from the first not taken,
				 * at least DK_TAKE_AT_ONCE of them, each acceptable as
				 * it stands (its checks passed, one channel), with room
				 * and free tasks for all. Entry by entry the reader took
				 * 2.2 us each, most of it in the steps below, one after
				 * another (one H200, batches of 150; tests/perf/
				 * RESULTS.md, twenty-seventh run). */
				uint32_t nrun = __popc(armed);
				const bool at_once = !ct && in_order && s0 == h && !was_taken && nrun >= DK_TAKE_AT_ONCE &&
				                     !(armed & (armed + 1u)) &&
				                     a.refuse == DFCCL_CQ_OK && (rcopy.simple & armed) == armed && room >= nrun &&
				                     (nrun = min(nrun, task_supply(c, nrun))) > 0;
				if (at_once) {
					/* The run's first nrun (as many as there are free
					 * tasks): the entry-by-entry steps take the rest,
					 * as taken by an earlier pass. */
					take_run(c, q, taken, n, nrun, tracing);
					inflight += nrun;
					was_taken = (1u << nrun) - 1u;
					room -= nrun;
					got += nrun;
					h = s0 + nrun;
					/* In order, an entry not armed ends the pass; a
					 * whole chunk taken goes on to the next, as the
					 * entry-by-entry steps do. */
					stop = nrun < DK_SCAN && s0 + nrun <= hi && !(armed >> nrun & 1u);
				}
				if (ct) {
					/* As taken at once. */
					was_taken = ct >= 32u ? ~0u : (1u << ct) - 1u;
					room -= ct;
					got += ct;
					h = s0 + ct;
					stop = ct < DK_SCAN && s0 + ct <= hi && !(armed >> ct & 1u);
					take_at(c, tracing, DK_TAKE_DONE);
				}
				/* Past the entries taken at once: a step over each cost
				 * 0.14 us (2.2 a chunk; tests/perf/RESULTS.md,
				 * twenty-eighth run). */
				for (uint32_t k = at_once ? nrun : ct; k < DK_SCAN && !stop; k++) {
					uint64_t s = s0 + k;
					if (s > hi)
						break;
					uint32_t slot = DFCCL_QP_SLOT(s, n);
					if (was_taken >> k & 1u) {
						h += h == s; /* taken by an earlier pass */
						continue;
					}
					/* Not armed yet: later entries may be. */
					if (!(armed >> k & 1u)) {
						stop = in_order;
						if (stop)
							break;
						continue;
					}
					/* Past entries not taken: only if none of them was armed
					 * before this one -- one this pass looked at too early,
					 * or, in the sweep's chunk, one between the window and
					 * the chunk, which this pass did not look at: the next
					 * pass's sweep then starts at it. */
					take_at(c, tracing, DK_TAKE_ARMED);
					uint64_t first = !looking && h < s ? armed_before(sq, taken, n, h, s) : 0;
					if (first) {
						if (part == 1 && first > end)
							*(volatile uint64_t *)&q->sweep = first;
						stop = true;
						break;
					}
					/* The room ran out in a pass that takes: the pair's tasks
					 * may have gone past its guarantee from the reserve, and
					 * sched_admit gives the shared part's room only then;
					 * or they completed meanwhile, and the guarantee is
					 * there again. So the admission is made again, as long
					 * as it gives room, rather than copying the entry to
					 * look beyond the room and leaving it for the next
					 * pass: with few tasks of the pair live, its passes
					 * would take a guarantee's worth each (made once a
					 * pass, tasks that complete within a pass, as one
					 * rank's do, gave passes of 4 entries, 19 us each;
					 * tests/perf/RESULTS.md, thirty-first run). */
					if (room == 0 && !looking && readmit && a.refuse == DFCCL_CQ_OK) {
						/* Only more room counts: a limit the pass's own
						 * entries reached, or no room, leaves the rest for
						 * the next pass, as before. */
						admit_count(c, q, adm);
						adm = 0;
						struct sched_admission again = qp_admission(c, q, &inflight, &uid);
						if (again.refuse == DFCCL_CQ_OK)
							room = again.room;
						readmit = room > 0;
					}
					/* The copy and its checks (made with the chunk's):
					 * everything after is decided on them alone. */
					const uint32_t ck = __popc(armed & ((1u << k) - 1u));
					const dfccl_sqe *e = (const dfccl_sqe *)rcopy.buf[ck];
					const dk_prep &pr = rcopy.prep[ck];
					uint32_t status = pr.check;
					take_at(c, tracing, DK_TAKE_CHECKED);
					uint32_t ti = DK_NO_TASK;
					bool work = status == DFCCL_CQ_OK && e->opcode != DFCCL_OP_NOP;
					if (work && a.refuse == DFCCL_CQ_OK && room == 0) {
						/* No room: it waits in the queue, unless a peer posted
						 * its instance (scheduler.h); a few such looks a pass. */
						if (looks++ >= SCHED_BEYOND_LOOKS || beyond == 0) {
							stopped = s;
							stop = true;
							break;
						}
						if (pr.ci == DK_NO_COMM || !dfccl_comm_peer_posted(pr.region, pr.n, e))
							continue;
						beyond--;
					}
					/* Accepting: the checks against the communicator and the
					 * registrations decide; else a refusal, or the entry's
					 * own fault. Failing fails the communicator where the
					 * rank is a member (its peers would wait for its part):
					 * when accepting, once the membership checks passed. */
					const bool accepting = work && a.refuse == DFCCL_CQ_OK;
					if (accepting)
						status = pr.status;
					else if (work)
						status = a.refuse;
					const bool fails_comm = status != DFCCL_CQ_OK && (accepting ? pr.checked : pr.member);
					if (accepting && status == DFCCL_CQ_OK) {
						room -= room > 0;
						ti = entry_take(c, pr);
						take_at(c, tracing, DK_TAKE_TASK);
						if (ti == DK_NO_TASK) {
							stop = true; /* every task in use: leave it armed */
							break;
						}
						rcopy.task[ck] = ti;
						rcopy.arrival[ck] = ++c.arrivals;
						adm |= 1u << ck;
						fill |= 1u << ck;
					}
					taken[slot] = s;
					if (s != h && qi < DK_QCACHE && s > qcache.taken_hi[qi])
						qcache.taken_hi[qi] = s;
					h += h == s;
					got++;
					c.cpu_last = !(e->flags & DFCCL_SQE_F_STREAM_ARMED);
					if (ti == DK_NO_TASK) {
						if (fails_comm)
							comm_fail(&st->comms[pr.ci], status);
						dk_cq_to to{s, pr.own_done, e->done_off, pr.done_reg, 0, 0};
						to.gn = sqe_group(e, s, n, &to.last);
						complete(c, q, to, status);
					}
					take_at(c, tracing, DK_TAKE_DONE);
				}
				/* The chunk's tasks counted, filled by the copier lanes, and
				 * handed to their blocks, together. */
				if (adm) {
					admit_count(c, q, adm);
					inflight += __popc(adm);
					take_at(c, tracing, DK_TAKE_ADMITTED);
				}
				if (fill) {
					rcopy.fill = fill;
					rcopy.qn = n; /* task_fill's groups */
					copy_entries(DK_COPY_FILL);
					take_at(c, tracing, DK_TAKE_FILLED);
				}
				if (c.rpend) {
					inbox_publish(c);
					take_at(c, tracing, DK_TAKE_HANDED);
				}
			}
		}
		/* The sweep goes on past its chunk once the chunk was read to its
		 * end; a pass that stopped before reads it again next time. */
		if (end < tail && !stop)
			*(volatile uint64_t *)&q->sweep = sweep + DK_SCAN <= tail ? sweep + DK_SCAN : 0;
		if (looking)
			*(volatile uint64_t *)&q->look = stopped; /* 0: past the tail, the head next time */
		if (past)
			look_found(qi, seen);
		head_advance(q, qi, hdr, taken, n, head, h, tail);
	}
	return got;
}

__device__ void set_engine_state(dk_state *st, uint32_t state)
{
	uint32_t nq = vload(&st->ctl.nqps);
	for (uint32_t qi = 0; qi < nq && qi < DK_MAX_QPS; qi++) {
		dk_qp *q = &st->qps[qi];
		if (vload(&q->live))
			st_rel_sys32(&vload(&q->hdr)->engine_state, state);
	}
	__threadfence_system();
}

/* ------------------------------------------------------------------ running a task's channel */

/* What a visit of a task's channel ended with: blocked or progressed (it
 * stays queued), this channel's part is over (R_CHDONE: it leaves this
 * block's queue), or the whole task is over (R_FREE: it leaves, and this
 * block frees it). */
enum { R_BLOCKED = 0, R_PROGRESS = 1, R_CHDONE = 2, R_FREE = 3 };
enum { A_DATA = 1, A_RETURN = 2 };

struct dk_shared {
	sched_queue q;
	dk_op op;
	uint32_t act, ret, quit, npos;
	/* The task being visited: its fixed part, and this block's channel
	 * context and scheduling state, copied in when the visit begins and
	 * the latter two stored back when it ends (dk_main). */
	uint4 tfix[DK_TASK_FIXED_BYTES / 16];
	dk_chan_ctx x;
	sched_state s;
	/* chan_control's scratch (thread 0's, one visit at a time): here and
	 * not on the stack, where a kilobyte of one thread's costs the
	 * driver's reservation of that stack for every thread the GPU can
	 * hold (dk_main). */
	dk_bufs bufs;
	uint64_t bufs_of; /* the arrival of the task whose ranks' buffers bufs holds, all of them (0: none) */
	algo_step as;
};
DFCCL_STATIC_ASSERT(sizeof(dk_chan_ctx) == 32 && sizeof(sched_state) == 16, "copied in 8-byte words");

__device__ uint32_t shape_of(const dk_task *t)
{
	/* The algorithm byte carries the channel count too, so ranks that
	 * would split the data differently fail instead of mixing parts. */
	return DFCCL_POST_SHAPE(t->opcode, t->dtype, t->redop, DFCCL_POST_ALGO_CHANNELS(t->algo, t->nch));
}

/* The post's root: a rooted collective's root; for the others whether the
 * all-reduce is pushed, which rests on settings no entry carries, so that
 * ranks that decide differently fail with DFCCL_CQ_MISMATCH instead of
 * reducing what was never pushed. */
__device__ __forceinline__ uint32_t post_root(const dk_task *t)
{
	return sqe_has_root(t->opcode) ? t->peer : t->push;
}

/* Copies and checks what the peers posted for the instance (the sender's
 * mailbox for a receive), once, when they all have. */
__device__ uint32_t posts_take(dk_task *t, dk_comm *cm)
{
	if (t->opcode == DFCCL_OP_RECV) {
		const dfccl_p2p_box *x = t->box;
		if (sync_load(&x->key) != t->key || vload(&x->count) != t->count || vload(&x->dtype) != t->dtype)
			return DFCCL_CQ_BAD_ENTRY;
		t->post[0].send_reg = vload(&x->send_reg);
		t->post[0].send_off = vload(&x->send_off);
		return DFCCL_CQ_OK;
	}
	uint32_t shape = shape_of(t);
	uint32_t root = post_root(t);
	uint32_t n = vis.n;
	for (uint32_t r = 0; r < n; r++) {
		/* The whole post (one cache line) in four independent loads, so
		 * they cross PCIe together; its key was acquired by the wait. */
		const uint4 *src = (const uint4 *)&t->posts[r];
		uint4 v[sizeof(dfccl_rank_post) / 16];
#pragma unroll
		for (int k = 0; k < (int)(sizeof(dfccl_rank_post) / 16); k++)
			v[k] = __ldcv(src + k);
		dfccl_rank_post p;
		memcpy(&p, v, sizeof(p));
		/* A post of another instance means a broken protocol; another
		 * count, operation, type, root or channel count means the ranks
		 * disagree about this collective. */
		if (p.key != t->key)
			return DFCCL_CQ_BAD_ENTRY;
		if (p.count != t->count || p.shape != shape || p.root != root)
			return DFCCL_CQ_MISMATCH;
		t->post[r].send_reg = p.send_reg;
		t->post[r].recv_reg = p.recv_reg;
		t->post[r].send_off = p.send_off;
		t->post[r].recv_off = p.recv_off;
	}
	return DFCCL_CQ_OK;
}

/* Resolves every rank's buffers from the posts' copy, against the
 * registration table of this launch (bufs_load keeps the result for it; a
 * buffer deregistered while the kernel was parked is noticed in the next
 * launch, before it is touched). */
__device__ uint32_t bufs_get(dk_ctx &c, const dk_task *t, dk_comm *cm, dk_bufs *b)
{
	dk_state *st = c.st;
	uint32_t n = vis.n, s;
	if (t->opcode == DFCCL_OP_RECV) {
		uint64_t bytes = t->count * t->dsize;
		b->send[0] = resolve(st, t->post[0].send_reg, vload(&cm->session[t->peer]), t->post[0].send_off, bytes, &s);
		if (s == DFCCL_CQ_OK)
			b->recv[0] = resolve(st, t->recv_reg, vload(&cm->session[t->rank]), t->recv_off, bytes, &s);
		return s;
	}
	/* Per rank, its session and the first probes of both registrations
	 * in one L2 round trip (reg_probe), where the receive buffer's look-up
	 * waited for the send buffer's (two ranks at once cost dk_main's
	 * control path more spills than they saved: tests/perf/RESULTS.md,
	 * twenty-sixth run). */
	const bool own = t->accept_epoch == c.p.epoch;
	for (uint32_t r = 0; r < n; r++) {
		if (own && r == t->rank) {
			/* This rank's, as the queue reader resolved them in this
			 * launch (entry_prepare; bufs_own): one look-up fewer
			 * (one rank: POSTS to WORK1 4.5 -> 4.2 us; tests/perf/
			 * RESULTS.md, twenty-eighth run). */
			b->send[r] = t->own_send;
			b->recv[r] = t->own_recv;
			continue;
		}
		uint64_t bytes[2];
		if (sqe_buf_bytes(t->opcode, t->count, t->dsize, n, r == t->peer, &bytes[0], &bytes[1]) < 0)
			return DFCCL_CQ_OUT_OF_RANGE;
		/* No look-up for a buffer of no bytes, as resolve. */
		const uint32_t ids[2] = {bytes[0] ? t->post[r].send_reg : 0u, bytes[1] ? t->post[r].recv_reg : 0u};
		dk_reg regs[2];
		bool found[2];
		reg_probe<2>(st, ids, regs);
		const uint64_t session = vload(&cm->session[r]);
		reg_finish<2>(st, ids, regs, found);
		b->send[r] = resolve_found(t->post[r].send_reg, found[0], regs[0], session, t->post[r].send_off, bytes[0], &s);
		if (s == DFCCL_CQ_OK)
			b->recv[r] = resolve_found(t->post[r].recv_reg, found[1], regs[1], session, t->post[r].recv_off, bytes[1],
			                           &s);
		if (s != DFCCL_CQ_OK)
			return s;
	}
	return DFCCL_CQ_OK;
}

/*
 * bufs_get, once per launch: the first channel to resolve the instance's
 * buffers in a launch keeps them in the task, and every later piece of any
 * of its channels reads them back (registrations change only while the
 * kernel is parked, dkernel.h). The cache is published with a release of
 * its epoch; channels that race store the same addresses.
 */
__device__ uint32_t bufs_load(dk_ctx &c, dk_task *t, dk_comm *cm, dk_bufs *b)
{
	uint32_t n = t->opcode == DFCCL_OP_RECV ? 1u : vis.n;
	uint32_t epoch;
	asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(epoch) : "l"(&t->bufs_epoch) : "memory");
	if (epoch == c.p.epoch) {
		/* Four ranks' addresses loaded before any is stored: a store
		 * right after each load would wait for it. */
		for (uint32_t r0 = 0; r0 < n; r0 += 4) {
			uint64_t v[8];
#pragma unroll
			for (uint32_t k = 0; k < 4; k++) {
				uint32_t r = r0 + k < n ? r0 + k : r0;
				v[2 * k] = __ldcg((const unsigned long long *)&t->bufs.send[r]);
				v[2 * k + 1] = __ldcg((const unsigned long long *)&t->bufs.recv[r]);
			}
#pragma unroll
			for (uint32_t k = 0; k < 4; k++)
				if (r0 + k < n) {
					b->send[r0 + k] = (char *)v[2 * k];
					b->recv[r0 + k] = (char *)v[2 * k + 1];
				}
		}
		return DFCCL_CQ_OK;
	}
	uint32_t s = bufs_get(c, t, cm, b);
	if (s != DFCCL_CQ_OK)
		return s;
	for (uint32_t r = 0; r < n; r++) {
		*(char *volatile *)&t->bufs.send[r] = b->send[r];
		*(char *volatile *)&t->bufs.recv[r] = b->recv[r];
	}
	asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&t->bufs_epoch), "r"(c.p.epoch) : "memory");
	return DFCCL_CQ_OK;
}

/*
 * Whether a direct all-reduce runs in one shot: every rank reduces the
 * whole of its channel's share from every rank's send buffer into its own
 * receive buffer, with no second phase and no wait between. A rank then
 * reads (n - 1) S of its peers' data for S bytes, where two shots read
 * 2 (n - 1) S / n: the same on two ranks, so these go in one shot at
 * every size (one wait and one pass over the links fewer: on 2x H200,
 * 256 KiB 65 -> 50 us, 16 MiB 120 -> 107, 1 GiB unchanged;
 * tests/perf/RESULTS.md, eighteenth run), and on more ranks the small ones,
 * where the wait costs more than the extra reads: up to the `oneshot-bytes`
 * setting (dk_oneshot_size_fits; 0: never). Not when some rank works in
 * place: its result would overwrite the input the others are still
 * reading. Every rank decides alike, from the size, the setting (the same
 * for every GPU of the daemon; not in the posts) and the posts.
 */
__device__ bool oneshot_fits(const dk_params &p, const dk_task *t, const dk_task *tg, uint32_t n)
{
	if (t->opcode != DFCCL_OP_ALLREDUCE || !dk_oneshot_size_fits(t->count * t->dsize, n, p.oneshot_bytes))
		return false;
	for (uint32_t r = 0; r < n; r++)
		if (tg->post[r].send_reg == tg->post[r].recv_reg && tg->post[r].send_off == tg->post[r].recv_off)
			return false;
	return true;
}

/* The channel's share of the elements: [lo, hi) of count. */
__device__ void chan_range(const dk_task *t, uint32_t ch, uint64_t *lo, uint64_t *hi)
{
	*lo = dk_split_at(t->count, t->nch, ch, t->dsize);
	*hi = dk_split_at(t->count, t->nch, ch + 1, t->dsize);
}

/* Elements of the current data step of a channel. */
__device__ uint64_t work_total(const dk_task *t, uint32_t ch, uint32_t step, uint32_t n, bool oneshot)
{
	uint64_t lo, hi;
	chan_range(t, ch, &lo, &hi);
	uint64_t len = hi - lo;
	switch (t->opcode) {
	case DFCCL_OP_ALLREDUCE: {
		if (oneshot)
			return len;
		uint64_t own = dk_split_at(len, n, t->rank + 1, t->dsize) - dk_split_at(len, n, t->rank, t->dsize);
#if DK_PHASE2_STORES
		/* Phase 2: this rank's chunk, to each of the n - 1 others. */
		return step == DK_WORK1 ? own : own * (n - 1);
#else
		return step == DK_WORK1 ? own : len;
#endif
	}
	case DFCCL_OP_ALLGATHER: return len * n;
	case DFCCL_OP_REDUCE: return t->rank == t->peer ? len : 0;
	default: return len;
	}
}

/* What every piece of a task's data has in common: its element type and
 * reduction (avg divides by n). */
__device__ __forceinline__ void op_of(const dk_task *t, uint32_t n, dk_op &op)
{
	op.ll = 0;
	op.dsize = t->dsize;
	op.dtype = t->dtype;
	op.redop = t->redop;
	op.div = n;
}

/*
 * Describes the next piece of a channel's data step, from element `pos` of
 * the step, at most `max` elements, into op. Returns the elements it covers
 * (some pieces skip a range without moving it: op.elems is then 0).
 */
__device__ uint64_t work_piece(const dk_task *t, uint32_t ch, uint32_t step, uint32_t n, bool oneshot,
                               const dk_bufs &b, uint64_t pos, uint64_t max, dk_op &op)
{
	uint32_t r = t->rank, ds = t->dsize;
	uint64_t lo, hi;
	chan_range(t, ch, &lo, &hi);
	uint64_t len = hi - lo, m = max;
	op_of(t, n, op);
	op.reduce = 0;
	op.nsrc = 1;
	switch (t->opcode) {
	case DFCCL_OP_ALLREDUCE:
		if (step == DK_WORK1) {
			/* One shot: the channel's whole share; two: chunk r of it. */
			uint64_t i = lo + (oneshot ? 0 : dk_split_at(len, n, r, ds)) + pos;
			op.dst = b.recv[r] + i * ds;
			for (uint32_t k = 0; k < n; k++)
				op.src[k] = b.send[k] + i * ds;
			op.nsrc = n;
			op.reduce = 1;
		} else {
#if DK_PHASE2_STORES
			/* Chunk r into the same range of every peer's buffer (the
			 * comment before sync_fence_sc says why that is safe), rank
			 * r + 1 first, so that the ranks' first stores go to
			 * different peers. */
			uint64_t c0 = dk_split_at(len, n, r, ds), own = dk_split_at(len, n, r + 1, ds) - c0;
			uint64_t d = pos / own, i = pos % own;
			uint32_t o = (uint32_t)((r + 1 + d) % n);
			if (m > own - i)
				m = own - i;
			op.dst = b.recv[o] + (lo + c0 + i) * ds;
			op.src[0] = b.recv[r] + (lo + c0 + i) * ds;
#else
			/* The owner of element pos of the channel's share. Phase 2
			 * loads the other chunks from their owners: storing this
			 * rank's into theirs would not hold the threads for round
			 * trips over the links, but lets a peer's kernel write into
			 * a buffer whose rank already failed and whose client may
			 * be reusing it, unless failures drain (DK_PHASE2_STORES). */
			uint32_t o = 0;
			while (o + 1 < n && dk_split_at(len, n, o + 1, ds) <= pos)
				o++;
			uint64_t end = dk_split_at(len, n, o + 1, ds);
			if (m > end - pos)
				m = end - pos;
			if (o == r) {
				op.elems = 0; /* our own chunk is final since phase 1 */
				return m;
			}
			op.dst = b.recv[r] + (lo + pos) * ds;
			op.src[0] = b.recv[o] + (lo + pos) * ds;
#endif
		}
		break;
	case DFCCL_OP_ALLGATHER: {
		uint64_t s = dk_gather_source(pos, len, ch, n), i = pos % len;
		if (m > len - i)
			m = len - i;
		op.dst = b.recv[r] + (s * t->count + lo + i) * ds;
		op.src[0] = b.send[s] + (lo + i) * ds;
		break;
	}
	case DFCCL_OP_REDUCESCATTER:
		op.dst = b.recv[r] + (lo + pos) * ds;
		for (uint32_t k = 0; k < n; k++)
			op.src[k] = b.send[k] + ((uint64_t)r * t->count + lo + pos) * ds;
		op.nsrc = n;
		op.reduce = 1;
		break;
	case DFCCL_OP_BROADCAST:
		op.dst = b.recv[r] + (lo + pos) * ds;
		op.src[0] = b.send[t->peer] + (lo + pos) * ds;
		break;
	case DFCCL_OP_REDUCE:
		op.dst = b.recv[r] + (lo + pos) * ds;
		for (uint32_t k = 0; k < n; k++)
			op.src[k] = b.send[k] + (lo + pos) * ds;
		op.nsrc = n;
		op.reduce = 1;
		break;
	default: /* DFCCL_OP_RECV */
		op.dst = b.recv[0] + pos * ds;
		op.src[0] = b.send[0] + pos * ds;
		break;
	}
	/* A single source needs no arithmetic, except avg's division. */
	if (op.reduce && op.nsrc == 1 && t->redop != OP_AVG)
		op.reduce = 0;
	op.elems = m;
	return m;
}

/* Where an algorithm step's buffer starts, as this GPU maps it: a rank's
 * send or receive buffer, or its connector's share for this channel. */
__device__ char *algo_base(const dk_task *t, uint32_t ch, dk_comm *cm, const dk_bufs &b, const algo_buf &x)
{
	switch (x.kind) {
	case ALGO_BUF_SEND: return b.send[x.rank];
	case ALGO_BUF_RECV: return b.recv[x.rank];
	default:
		return vload(&cm->conn[x.rank]) + (uint64_t)t->slot * DFCCL_COMM_CONN_BYTES +
		       (uint64_t)ch * dk_conn_bytes(t->nch);
	}
}

/* The piece [pos, pos + max) of algorithm step `as` (within its elems). */
__device__ void algo_piece(const dk_task *t, uint32_t ch, dk_comm *cm, const algo_step &as, const dk_bufs &b,
                           uint64_t pos, uint64_t max, dk_op &op)
{
	uint32_t ds = t->dsize;
	op.ll = 0;
	op.dsize = ds;
	op.dtype = t->dtype;
	op.redop = as.redop;
	op.div = vis.n;
	op.nsrc = as.nsrc;
	op.reduce = as.reduce;
	op.dst = algo_base(t, ch, cm, b, as.dst) + (as.dst.off + pos) * ds;
	for (uint32_t k = 0; k < as.nsrc; k++)
		op.src[k] = algo_base(t, ch, cm, b, as.src[k]) + (as.src[k].off + pos) * ds;
	if (op.reduce && op.nsrc == 1 && as.redop != OP_AVG)
		op.reduce = 0;
	op.elems = max;
}

/* Where source rank `src` of a pushed all-reduce puts its data in rank
 * `dst`'s connector, as this GPU maps it: region (src - dst - 1) mod n of
 * the channel's share of the instance slot. */
__device__ char *push_region(const dk_task *t, uint32_t ch, dk_comm *cm, uint32_t dst, uint32_t src)
{
	uint32_t n = vis.n;
	return vload(&cm->conn[dst]) + (uint64_t)t->slot * DFCCL_COMM_CONN_BYTES +
	       (uint64_t)ch * dk_conn_bytes(t->nch) + (uint64_t)((src + n - dst - 1) % n) * dk_push_room(t->nch, n);
}

/* Where source rank `src` of a pushed all-reduce sent as lines puts them
 * in rank `dst`'s area (dkernel.h), as this GPU maps it: region
 * (src - dst - 1) mod n of the instance slot. */
__device__ char *ll_region(const dk_task *t, dk_comm *cm, uint32_t dst, uint32_t src)
{
	uint32_t n = vis.n;
	return vload(&cm->conn[dst]) + DK_LL_AREA_OFFSET + (uint64_t)t->slot * DK_LL_SLOT_BYTES +
	       (uint64_t)((src + n - dst - 1) % n) * dk_ll_room(n);
}

/* The piece of a pushed all-reduce sent as lines, over this rank's
 * buffers: DK_LL_SEND the whole of its data to every peer (DK_PUSH),
 * DK_LL_TAKE every peer's reduced with it into its result (DK_LLPULL),
 * DK_LL_RUN both (ll_run_starts). */
__device__ void ll_piece(const dk_task *t, dk_comm *cm, const char *send, char *recv, uint32_t ll, dk_op &op)
{
	uint32_t n = vis.n, r = t->rank;
	op_of(t, n, op);
	op.ll = ll;
	op.reduce = 0;
	op.elems = t->count;
	op.flag = dk_ll_flag(t->key);
	op.shape = shape_of(t);
	op.rank = r;
	op.task = t;
	op.src[0] = send;
	op.nsrc = 1;
	if (ll != DK_LL_TAKE) {
		for (uint32_t j = 1; j < n; j++)
			op.src[j] = ll_region(t, cm, (r + j) % n, r);
		op.nsrc = n;
	}
	if (ll != DK_LL_SEND) {
		op.lines = ll_region(t, cm, r, (r + 1) % n);
		op.dst = recv;
	}
}

/* This rank's own buffers (all a pushed all-reduce touches besides the
 * connectors or its lines), into *send and *recv: as the queue reader
 * resolved them, in the launch that took the entry; resolved again in a
 * later one. */
__device__ uint32_t bufs_own(dk_ctx &c, const dk_task *t, dk_comm *cm, char **send, char **recv)
{
	if (t->accept_epoch == c.p.epoch) {
		*send = t->own_send;
		*recv = t->own_recv;
		return DFCCL_CQ_OK;
	}
	uint64_t bytes = t->count * t->dsize, session = vload(&cm->session[t->rank]);
	uint32_t s;
	*send = resolve(c.st, t->send_reg, session, t->send_off, bytes, &s);
	if (s == DFCCL_CQ_OK)
		*recv = resolve(c.st, t->recv_reg, session, t->recv_off, bytes, &s);
	return s;
}

/*
 * A piece of a pushed all-reduce's data steps. DK_PUSH: element pos of
 * len * (n - 1), the channel's share copied into the other ranks'
 * connectors, rank + 1 first. DK_WORK2: the reduction of the share from
 * every rank, in rank order, this rank's from its send buffer and the
 * others' from its own connector, into its receive buffer.
 */
__device__ uint64_t push_piece(const dk_task *t, uint32_t ch, dk_comm *cm, uint32_t step, const dk_bufs &b,
                               uint64_t pos, uint64_t max, dk_op &op)
{
	uint32_t n = vis.n, r = t->rank, ds = t->dsize;
	uint64_t lo, hi;
	chan_range(t, ch, &lo, &hi);
	uint64_t len = hi - lo, m = max;
	op_of(t, n, op);
	if (step == DK_PUSH) {
		uint64_t j = pos / len, i = pos % len;
		if (m > len - i)
			m = len - i;
		op.dst = push_region(t, ch, cm, (r + 1 + (uint32_t)j) % n, r) + i * ds;
		op.src[0] = b.send[r] + (lo + i) * ds;
		op.nsrc = 1;
		op.reduce = 0;
	} else {
		op.dst = b.recv[r] + (lo + pos) * ds;
		for (uint32_t k = 0; k < n; k++)
			op.src[k] = k == r ? b.send[r] + (lo + pos) * ds : push_region(t, ch, cm, r, k) + pos * ds;
		op.nsrc = n;
		op.reduce = 1;
	}
	op.elems = m;
	return m;
}

#if DK_PHASE2_STORES
/*
 * Phase 2 of the two-shot all-reduce as stores (DK_PHASE2_STORES): rank r
 * stores its reduced chunk into the same range of every peer's receive
 * buffer. Nothing else touches that range of a peer's buffer (in place,
 * only rank r read it, in its own phase 1), so the phases need no wait
 * between them, and FINISH, which waits for every rank's `done`, sees the
 * chunks arrived. A failure needs more: a rank that fails completes and
 * its client may reuse its buffers, so no peer may store into them after
 * that. Channel ch of a rank announces its stores (its channel word =
 * DFCCL_PROGRESS(key, 1)), then, after a sequentially consistent fence,
 * looks at the communicator's abort word in its GPU's memory. A rank that
 * fails, once all its channels have left and if it posted the instance,
 * sets that word (comm_fail: every GPU's copy), fences alike, and then
 * waits (DK_DRAIN, a wait that gives way like any other) until every
 * channel of every rank either never announced or ended its stores
 * (DFCCL_PROGRESS(key, DK_STORES_OFF), stored on every way out of a
 * channel that announced), and only then completes. Each side's store
 * reaches the GPU copy that the other side loads, so one of them sees
 * the other: a channel that missed the
 * abort was seen announcing, and is waited for. Phase 2 also looks at the
 * abort word before every piece, so the wait lasts a piece or the time a
 * peer's kernel needs to notice. It is bounded (DK_DRAIN_UNITS, then one
 * more look at each channel): a peer whose GPU stopped stores nothing
 * more either. Not covered: a rank whose worker dies has its entries
 * failed by the supervisor (DEVICE_LOST) without a drain, and the task of
 * a client that died is freed without one.
 */
#define DK_STORES_OFF 2u
#define DK_DRAIN_UNITS 200u /* the drain's bound, in units of 2^20 ns (about 210 ms) */

__device__ __forceinline__ void sync_fence_sc(void)
{
	if (vis.mirror && !vis.npeers)
		asm volatile("fence.sc.gpu;" ::: "memory");
	else
		asm volatile("fence.sc.sys;" ::: "memory");
}

/* A task whose phase 2 stores into the peers: a two-shot all-reduce on the
 * direct algorithm (a pushed one writes into connectors only), on a
 * communicator still in place (a deleted one's words are gone). */
__device__ __forceinline__ bool stores_task(dk_comm *cm, const dk_task *t, const dk_chan_ctx *x)
{
	return t->opcode == DFCCL_OP_ALLREDUCE && t->algo == DFCCL_ALGO_DIRECT && !t->push && !x->oneshot &&
	       vload(&cm->live) && vload(&cm->gen) == t->comm_gen;
}

/* Channel ch announces its stores; returns the failure it then sees, or 0. */
__device__ uint32_t stores_begin(dk_comm *cm, const dk_task *t, uint32_t ch)
{
	sync_store(dfccl_comm_chan(vis.sync, vis.n, t->slot, t->rank, ch), DFCCL_PROGRESS(t->key, 1));
	sync_fence_sc();
	return comm_aborted(cm, false);
}

/* Channel ch stores into no peer any more: said where it announced. */
__device__ void stores_off(const dk_task *t, uint32_t ch)
{
	uint64_t *w = dfccl_comm_chan(vis.sync, vis.n, t->slot, t->rank, ch);
	if (sync_load(w) == DFCCL_PROGRESS(t->key, 1))
		sync_store(w, DFCCL_PROGRESS(t->key, DK_STORES_OFF));
}

/* Whether this rank posted this instance: only then may peers be storing
 * into its buffers (they start after every rank's post). */
__device__ __forceinline__ bool own_posted(const dk_task *t)
{
	return sync_load(&t->posts[t->rank].key) == t->key;
}

__device__ __forceinline__ uint32_t drain_clock(void)
{
	return (uint32_t)(now_ns() >> 20);
}

/* A failed rank's drain begins, in the channel that completes its task (the
 * last to leave, or the one in FINISH): every channel (x->pos), then the
 * completion. */
__device__ void drain_begin(dk_comm *cm, const dk_task *t, dk_chan_ctx *x, uint32_t status)
{
	comm_fail(cm, status);
	sync_fence_sc();
	x->pos = 0;
	x->astep = drain_clock();
	x->wait_rank = 0;
	x->step = DK_DRAIN;
}
#endif

/* The wait of a channel's step: word(r) >= target for every rank r; with
 * `ll`, both flags of the 16-byte line at word(r) == target for every
 * source region r of a pushed all-reduce's lines, the region of rank
 * (rank + 1 + r) mod n. */
struct dk_cond {
	const uint64_t *word;
	uint32_t stride; /* words between two ranks' words */
	uint32_t n;
	uint64_t target;
	uint64_t below; /* a word below this is ready too (0: none is) */
	uint32_t ll;
};

/* The last line of each source's region of a pushed all-reduce's lines:
 * its count and shape (ll_send), checked against this rank's. */
__device__ bool ll_last_agrees(const dk_task *t, dk_comm *cm)
{
	uint32_t n = vis.n, L = (uint32_t)dk_ll_lines(t->count * t->dsize), flag = dk_ll_flag(t->key);
	for (uint32_t k = 1; k < n; k++) {
		uint4 v = ll_load((const uint4 *)ll_region(t, cm, t->rank, (t->rank + k) % n) + L);
		if (v.y != flag || v.w != flag || v.x != (uint32_t)t->count || v.z != shape_of(t))
			return false;
	}
	return true;
}

__device__ dk_cond cond_of(const dk_task *t, dk_comm *cm, uint32_t ch, uint32_t step)
{
	const uint32_t post_words = sizeof(dfccl_rank_post) / sizeof(uint64_t);
	uint32_t n = vis.n;
	dk_cond w = {NULL, post_words, n, 0, 0, 0};
	switch (step) {
	case DK_SLOT: w.word = &t->posts[0].done, w.target = t->slot_free; break;
	case DK_POSTS: w.word = &t->posts[0].key, w.target = t->key; break;
	case DK_SYNC1:
		if (t->push == DK_PUSH_LL) {
			/* Each source's last line, both its flags (each half is
			 * stored whole, not the line). */
			uint32_t L = (uint32_t)dk_ll_lines(t->count * t->dsize);
			w.word = (const uint64_t *)ll_region(t, cm, t->rank, (t->rank + 1) % n) + 2u * L;
			w.stride = dk_ll_room(n) / 8u;
			w.n = n - 1;
			w.target = dk_ll_flag(t->key);
			w.ll = 1;
			break;
		}
		w.word = dfccl_comm_chan(vis.sync, n, t->slot, 0, ch);
		w.stride = DFCCL_COMM_MAX_CHANNELS;
		w.target = DFCCL_PROGRESS(t->key, 1);
		break;
	case DK_FINISH: w.word = &t->posts[0].done, w.target = t->key; break;
#if DK_PHASE2_STORES
	case DK_DRAIN: /* channel ch of every rank: announced no stores, or ended them */
		w.word = dfccl_comm_chan(vis.sync, n, t->slot, 0, ch);
		w.stride = DFCCL_COMM_MAX_CHANNELS;
		w.target = DFCCL_PROGRESS(t->key, DK_STORES_OFF);
		w.below = DFCCL_PROGRESS(t->key, 1);
		break;
#endif
	case DK_BOX_FREE:
	case DK_BOX_WANT: w.word = &t->box->ack, w.n = 1, w.target = t->slot_free; break;
	case DK_BOX_ACK: w.word = &t->box->ack, w.n = 1, w.target = t->key; break;
	case DK_BOX_KEY: w.word = &t->box->key, w.n = 1, w.target = t->key; break;
	default: w.n = 0; break; /* no wait (data steps never get here) */
	}
	return w;
}

/*
 * Whether the wait of a channel's step is over; where it is not, *blocker
 * gets a rank it still waits for, and x->wait_rank where to look first next
 * time. `as`: the algorithm step of DK_AWAIT (its ranks' channel words must
 * reach their phases), else NULL (the step's dk_cond).
 */
__device__ bool cond_ready(const dk_task *t, dk_chan_ctx *x, const dk_cond &w, const algo_step *as, uint32_t ch,
                           uint32_t *blocker)
{
	if (as) {
		void *region = vis.sync;
		uint32_t n = vis.n;
		for (uint32_t k = x->wait_rank; k < as->nwait; k++) {
			const uint64_t *word = dfccl_comm_chan(region, n, t->slot, as->wait[k], ch);
			if (sync_load(word) < DFCCL_PROGRESS(t->key, as->phase[k])) {
				x->wait_rank = k;
				*blocker = as->wait[k];
				return false;
			}
		}
		x->wait_rank = 0;
		return true;
	}
	for (uint32_t r = x->wait_rank; r < w.n; r++) {
		bool late;
		if (w.ll) {
			uint4 v = ll_load((const uint4 *)(w.word + (uint64_t)r * w.stride));
			late = v.y != (uint32_t)w.target || v.w != (uint32_t)w.target;
		} else {
			uint64_t v = sync_load(w.word + (uint64_t)r * w.stride);
			late = v < w.target && v >= w.below;
		}
		if (late) {
			x->wait_rank = r;
			*blocker = w.ll ? (t->rank + 1 + r) % vis.n : w.n == 1 ? t->peer : r;
			return false;
		}
	}
	x->wait_rank = 0;
	return true;
}

/*
 * Two-phase blocking (thread 0): polls the wait of the channel's step up to
 * its threshold. Returns 1 when ready, 0 when preempted, -status when the
 * communicator failed. `as` as for cond_ready.
 */
__device__ int chan_wait(dk_ctx &c, dk_chan_ctx *x, const dk_task *t, uint32_t ch, dk_comm *cm, uint32_t position,
                         sched_state *s, const algo_step *as)
{
#if DK_PHASE2_STORES
	bool draining = x->step == DK_DRAIN;
	dk_cond w = as ? dk_cond{} : cond_of(t, cm, draining ? (uint32_t)x->pos : ch, x->step);
#else
	const bool draining = false;
	dk_cond w = as ? dk_cond{} : cond_of(t, cm, ch, x->step);
#endif
	bool drain = x->step == DK_FINISH || x->step == DK_BOX_ACK || draining;
	uint32_t threshold = drain ? sched_threshold_drain(&c.p.sched) : sched_threshold(&c.p.sched, position, s);
	dk_inbox *ib = &c.st->inbox[c.b];
	uint32_t arrived = vload(&ib->tail);
	uint64_t spins = 0;
	int rc;
	for (;;) {
		/* The abort words: looked at every 64th poll and at the start of
		 * every 8th wait of the channel (a wait on a rank of this GPU ends
		 * after one poll), the channel's first among them, which comes
		 * before anything the task stores (entry_prepare relies on it);
		 * the one in host memory at an eighth of that, but never at the
		 * first wait: its PCIe round trip would delay every collective. */
		bool look, host;
		if (spins) {
			look = (spins & 63u) == 0;
			host = (spins & 511u) == 0;
		} else {
			uint32_t w = x->waits++;
			look = (w & 7u) == 0;
			host = (w & 63u) == 56u;
		}
		if (look) {
			/* A drain runs because the communicator failed. */
			uint32_t ab = draining ? 0 : comm_aborted(cm, host);
			if (ab) {
				rc = -(int)ab;
				break;
			}
			/* Parking or a stop must not wait for a long spin, and new
			 * tasks get posted at once (their peers may be waiting for
			 * exactly that): the queue reader keeps taking entries, and
			 * a new arrival ends the wait. */
			if (spins && (vload(&c.st->ctl.park) || vload(&c.st->ctl.stop))) {
				rc = 0;
				break;
			}
			if (spins && vload(&ib->tail) != arrived) {
				rc = 0;
				break;
			}
		}
		uint32_t blocker = 0;
		if (cond_ready(t, x, w, as, ch, &blocker)) {
			rc = 1;
			break;
		}
		/* A rank of this GPU moves only when a block of this kernel runs
		 * it, quite possibly this very block: give way at once. */
		uint32_t limit = vload(&cm->device[blocker]) == c.p.device ? 0 : threshold;
		if (spins >= limit) {
			rc = 0;
			break;
		}
		spins++;
		__nanosleep(64);
	}
	c.acc.spins += spins;
	if (rc == 0) {
		c.acc.preemptions++;
		sched_on_preempt(s);
	} else if (rc == 1) {
		/* The acquire load of the peers' word orders this thread's reads;
		 * the block's barrier before the data orders the other threads'. */
		sched_on_progress(&c.p.sched, s);
	}
	return rc;
}

/* The fields of this rank's post but its key. */
__device__ void post_fields(volatile dfccl_rank_post *vp, const dk_task *t)
{
	vp->send_off = t->send_off;
	vp->recv_off = t->recv_off;
	vp->count = t->count;
	vp->send_reg = t->send_reg;
	vp->recv_reg = t->recv_reg;
	vp->shape = shape_of(t);
	vp->root = post_root(t);
	vp->progress = DFCCL_PROGRESS(t->key, 0);
}

/* Posts this rank's part of the instance (channel 0: thread 0, or the
 * poster of ll_send), its channel words at `phase`. The key is released after the fields even for
 * a pushed all-reduce, whose peers read the post only after its channel
 * word or not at all (lines): a peer that disagrees about the collective
 * waits on the key alone (DK_POSTS), as does the supervisor's watch, and
 * must see this instance's fields with it. One sent as lines posts with
 * them, at phase 1: a peer that pushes without lines then reads the post
 * after its SYNC1 and fails with the mismatch. */
__device__ void post(const dk_task *t, uint32_t phase)
{
	dfccl_rank_post *p = &t->posts[t->rank];
	const int64_t m = vis.mirror;
	const uint64_t progress = DFCCL_PROGRESS(t->key, phase);
	post_fields(p, t);
	for (uint32_t k = 0; k < vis.npeers; k++)
		post_fields((dfccl_rank_post *)((char *)p + vis.peer_off[k]), t);
	/* Plain stores, then one release of the key into the GPUs' copies;
	 * the host's copy after it, plainly: the release would wait for
	 * those stores' PCIe round trip too, and only the supervisor's watch
	 * reads them (for timeouts and diagnostics, not for the protocol). */
	for (uint32_t ch = 0; ch < t->nch; ch++) {
		uint64_t *w = dfccl_comm_chan(vis.sync, vis.n, t->slot, t->rank, ch);
		*(volatile uint64_t *)w = progress;
		sync_to_peers(w, progress);
	}
	sync_release(&p->key, t->key);
	if (m) {
		post_fields((dfccl_rank_post *)((char *)p + m), t);
		for (uint32_t ch = 0; ch < t->nch; ch++)
			*(volatile uint64_t *)((char *)dfccl_comm_chan(vis.sync, vis.n, t->slot, t->rank, ch) + m) = progress;
		*(volatile uint64_t *)((char *)&p->key + m) = t->key;
	}
}

__device__ void box_fields(volatile dfccl_p2p_box *b, const dk_task *t)
{
	b->send_off = t->send_off;
	b->count = t->count;
	b->send_reg = t->send_reg;
	b->dtype = t->dtype;
}

__device__ void box_post(const dk_task *t)
{
	int64_t m = vis.mirror;
	box_fields(t->box, t);
	for (uint32_t k = 0; k < vis.npeers; k++)
		box_fields((dfccl_p2p_box *)((char *)t->box + vis.peer_off[k]), t);
	if (m)
		box_fields((dfccl_p2p_box *)((char *)t->box + m), t);
	sync_store(&t->box->key, t->key);
}

/*
 * The channel that block b runs leaves its task: its context says so in
 * global memory (a relaunch does not queue it again) before the count of
 * channels done moves, since once the last channel is counted the task may
 * be freed and its slot reused, and nothing of this channel may be stored
 * there after. Returns the count before this channel's.
 */
__device__ uint32_t chan_leave(dk_task *tg, uint32_t b)
{
	*(volatile uint32_t *)&tg->ch[b].step = DK_LEFT;
	__threadfence();
	return atomicAdd(&tg->chdone, 1u);
}

/*
 * Thread 0's part of a visit: advances the channel's steps until it needs
 * the block for data (returns A_DATA with sh.op filled and sh.npos the
 * elements it covers) or the visit ends (A_RETURN with sh.ret).
 * `piece_done` says the block just finished the piece described last time.
 */
/*
 * A pushed all-reduce sent as lines runs its whole exchange in one piece
 * (DK_LL_RUN: ll_send, then ll_take, which polls the peers' last lines
 * too) where the visit that reaches DK_SLOT finds the slot free at its
 * first look: no step between the send and the take, and none of a
 * wait's own work (chan_wait), whose steps took most of a small
 * all-reduce's time on its block (2 ranks on 2 H200, 8 B-512 B: 33 -> 26
 * us a call in the callback form, 43 -> 36 stream-ordered; tests/perf/
 * RESULTS.md, fifteenth run). The looks are chan_wait's first, the
 * abort words with them, before anything the task stores (entry_prepare
 * relies on it). Its own buffers as the queue reader resolved them, in
 * the launch that took the entry. A take that gives way (a peer's lines
 * late, or its last line disagreeing) leaves the channel at DK_SYNC1, as
 * a send at DK_PUSH would have: the wait and the agreement's check
 * (ll_last_agrees) follow as they do there.
 */
__device__ bool ll_run_starts(dk_ctx &c, const dk_task *t, dk_comm *cm, dk_chan_ctx *x, uint32_t ch)
{
	if (t->push != DK_PUSH_LL || t->accept_epoch != c.p.epoch)
		return false;
	if (comm_aborted(cm, false))
		return false;
	/* The slot's wait, one look: where it is over, the channel's wait
	 * rank is reset as any wait's end resets it, so that a wait at
	 * DK_SYNC1 after a take that gave way starts at the first rank. */
	uint32_t blocker;
	return cond_ready(t, x, cond_of(t, cm, ch, DK_SLOT), NULL, ch, &blocker);
}

/*
 * Whether a channel whose visit spent its budget may go on with a new one
 * rather than yield: its task is the only one in the block's queue, none
 * waits in the block's inbox, and the host asks for no stop or park. The
 * budget shares a block among its tasks; a task alone would only pay for
 * leaving and for the next visit's set-up (2x H200, 1 GiB all-reduces on
 * 16 channels: a visit cost about 13 us beyond its data, 4-6 of them the
 * yield and the set-up, the rest its piece's own; tests/perf/RESULTS.md,
 * seventeenth run). An arrival is thus seen at the budget's end, as before.
 */
__device__ bool visit_alone(const dk_ctx &c, const dk_shared &sh)
{
	const dk_inbox *ib = &c.st->inbox[c.b];
	const uint4 ctl = ll_load((const uint4 *)&c.st->ctl);
	return sh.q.n == 1 && vload(&ib->tail) == ib->head && !ctl.y && !ctl.z;
}

/*
 * A task taken before its arm goes back to its queue (early_take, "Given
 * back"), by its block: unposted, its channel never past DK_SLOT, so no
 * peer knows of it. Its taken word says not taken (the slot's lap before),
 * then dk_qp.early_back names it and the count tells the reader
 * (early_move_back); the caller frees the task (R_FREE: its admission
 * goes back), which the reader's count of live tasks sees after these.
 */
__device__ void early_give_back(dk_ctx &c, dk_task *tg, const dk_task *t, dk_qp *q)
{
	volatile uint64_t *taken = vload(&q->taken);
	const uint32_t qn = vload(&q->n);
	taken[DFCCL_QP_SLOT(t->seq, qn)] = t->seq > qn ? t->seq - qn : 0;
	__threadfence();
	*(volatile uint64_t *)&q->early_back = t->seq;
	__threadfence();
	atomicAdd(&c.st->early_backs, 1u);
	tg->early = 0;
	/* The give-back counted before the task is uncounted (read_queues
	 * loads them the other way round). */
	__threadfence();
	atomicSub(&c.st->early_tasks, 1u);
	c.acc.early_backs++;
}

/*
 * A task taken before its arm (early_take), on its block, before the
 * instance's slot: EARLY_ARMED once its stream armed it (the arm word's
 * acquire: the buffers it reads next were written before), EARLY_WAIT
 * while not, EARLY_BACK where it was given back (early_give_back): the
 * reader asks for it (st->early_ask), or its communicator failed (looked
 * at every 8th poll, the host's word every 512th, x->astep counting them:
 * a direct collective's step count starts at its POSTS). Its pair removed
 * meanwhile: the slot may serve another pair by now, so nothing of it is
 * read; the removal parked the kernel, and the next launch's first visit
 * drops the task. While the task is alone on its block (visit_alone), up
 * to DK_EARLY_LOOKS looks in a row, a PCIe round trip each, rather than
 * one a visit: a visit of the block's loop took 3.5 us (2 H200,
 * thirty-third run).
 */
#define DK_EARLY_LOOKS 32u
enum { EARLY_WAIT = 0, EARLY_ARMED = 1, EARLY_BACK = 2 };
__device__ int early_wait(dk_ctx &c, const dk_shared &sh, dk_task *tg, const dk_task *t, dk_qp *q, dk_comm *cm,
                          dk_chan_ctx *x)
{
	const uint32_t live = vload(&q->live), gen = vload(&q->gen), qn = vload(&q->n);
	const dfccl_sqe *sq = vload(&q->sq);
	if (!live || gen != t->qp_gen)
		return EARLY_WAIT;
	const uint64_t *word = &sq[DFCCL_QP_SLOT(t->seq, qn)].arm;
	uint64_t arm = ld_acq_sys(word);
	for (uint32_t k = 1; arm != t->seq && k < DK_EARLY_LOOKS && visit_alone(c, sh); k++)
		arm = ld_acq_sys(word);
	if (arm == t->seq) {
		x->astep = 0;
		tg->early = 0;
		((dk_task *)t)->early = 0; /* this visit's copy */
		if (vload(&q->early) == t->seq)
			*(volatile uint64_t *)&q->early = 0;
		atomicSub(&c.st->early_tasks, 1u);
		return EARLY_ARMED;
	}
	const uint32_t w = ++x->astep;
	bool back = vload(&c.st->early_ask) != 0;
	if (!back && (w & 7u) == 0)
		back = comm_aborted(cm, (w & 511u) == 0) != 0;
	if (!back)
		return EARLY_WAIT;
	x->astep = 0;
	early_give_back(c, tg, t, q);
	return EARLY_BACK;
}

__device__ uint32_t chan_control(dk_ctx &c, dk_shared &sh, uint32_t ti, uint32_t position, bool piece_done,
                                 uint64_t *budget, bool *progressed)
{
	dk_state *st = c.st;
	dk_task *tg = &st->tasks[ti];                 /* what changes, in global memory */
	const dk_task *t = (const dk_task *)sh.tfix; /* its fixed part, copied for this visit */
	const uint32_t ch = sh.x.chan;               /* the channel this block runs */
	dk_chan_ctx *x = &sh.x;                       /* the channel's context, and */
	sched_state *s = &sh.s;                       /* its scheduling state: copies (dk_main) */
	dk_qp *q = &st->qps[t->qp];
	dk_comm *cm = &st->comms[t->comm];
	if (vis.comm != t->comm || vis.epoch != c.p.epoch) {
		vis.mirror = vload(&cm->mirror);
		vis.sync = vload(&cm->sync);
		vis.n = vload(&cm->nranks);
		uint32_t np = vload(&cm->npeers);
		vis.npeers = np < DK_MAX_PEERS ? np : DK_MAX_PEERS;
		for (uint32_t k = 0; k < vis.npeers; k++)
			vis.peer_off[k] = vload(&cm->peer_off[k]);
		vis.comm = t->comm;
		vis.epoch = c.p.epoch;
	}
	uint32_t n = vis.n;
	if (x->epoch != c.p.epoch) {
		/* The first visit of this launch: the tables may have changed
		 * while the kernel was parked. */
		if (!vload(&q->live) || vload(&q->gen) != t->qp_gen) {
			/* The client is gone: nobody reads the completion, but
			 * peers must not wait for this rank. The channel in
			 * FINISH is the last one; any other frees the task if it
			 * is the last to leave. */
			if (vload(&cm->live) && vload(&cm->gen) == t->comm_gen)
				comm_fail(cm, DFCCL_CQ_PEER_LOST);
			if (t->early) /* never armed (early_wait) */
				atomicSub(&st->early_tasks, 1u);
			bool finishing = x->step == DK_FINISH;
#if DK_PHASE2_STORES
			if (stores_task(cm, t, x))
				stores_off(t, ch);
			finishing = finishing || x->step == DK_DRAIN;
#endif
			bool last = finishing || chan_leave(tg, c.b) + 1 == t->nch;
			sh.ret = last ? R_FREE : R_CHDONE;
			return A_RETURN;
		}
		if (!vload(&cm->live) || vload(&cm->gen) != t->comm_gen) {
			if (t->early) {
				/* Failed once armed (early_take, "Given back"). */
				early_give_back(c, tg, t, q);
				sh.ret = R_FREE;
				return A_RETURN;
			}
			tg->status = DFCCL_CQ_BAD_COMM;
			x->step = DK_CHDONE;
		}
		x->epoch = c.p.epoch;
	}
	if (piece_done) {
		x->pos += sh.npos;
		*progressed = true;
	}
	for (;;) {
		uint32_t status = DFCCL_CQ_OK;
		trace(c, DK_EV_STEP, ti << 16 | x->step);
		switch (x->step) {
		case DK_WORK1:
		case DK_WORK2:
		case DK_PUSH:
		case DK_AWORK: {
			algo_step &as = sh.as;
			uint64_t total;
			if (x->step == DK_AWORK) {
				algo_step_get(&tg->alg[ch], x->astep, &as);
				total = as.nsrc ? as.elems : 0;
			} else if (t->push == DK_PUSH_LL && x->step == DK_PUSH) {
				total = 1; /* one piece: every line */
			} else if (t->push) {
				uint64_t lo, hi;
				chan_range(t, ch, &lo, &hi);
				total = x->step == DK_PUSH ? (hi - lo) * (n - 1) : hi - lo;
			} else {
				total = work_total(t, ch, x->step, n, x->oneshot);
			}
			if (x->pos < total) {
				if (*budget == 0) {
					if (!visit_alone(c, sh)) {
						sh.ret = R_PROGRESS;
						return A_RETURN;
					}
					*budget = c.p.visit_bytes;
				}
#if DK_PHASE2_STORES
				/* Stores into the peers stop at the piece after a failure. */
				uint32_t ab = x->step == DK_WORK2 && stores_task(cm, t, x) ? comm_aborted(cm, false) : 0;
				if (ab) {
					tg->status = ab;
					x->step = DK_CHDONE;
					continue;
				}
#endif
				dk_bufs &b = sh.bufs;
				/* The buffers the POSTS step loaded are still here
				 * where no other task's came between: the task's cache
				 * is not read again (WORK1 to its data 3.5 -> 3.1
				 * us). */
				if (t->push) {
					status = bufs_own(c, t, cm, &b.send[t->rank], &b.recv[t->rank]);
					sh.bufs_of = 0;
				} else if (sh.bufs_of != t->arrival) {
					status = bufs_load(c, tg, cm, &b);
					sh.bufs_of = status == DFCCL_CQ_OK ? t->arrival : 0;
				}
				if (status != DFCCL_CQ_OK) {
					comm_fail(cm, status);
					tg->status = status;
					x->step = DK_CHDONE;
					continue;
				}
				/* dsize is a power of two (sqe_dtype_size): a shift, not the
				 * GPU's 64-bit division in software. */
				uint64_t max = *budget >> (__ffs(t->dsize) - 1);
				max = max ? max : 1;
				if (max > total - x->pos)
					max = total - x->pos;
				if (x->step == DK_AWORK) {
					algo_piece(t, ch, cm, as, b, x->pos, max, sh.op);
					sh.npos = sh.op.elems;
				} else if (t->push == DK_PUSH_LL && x->step == DK_PUSH) {
					ll_piece(t, cm, b.send[t->rank], b.recv[t->rank], DK_LL_SEND, sh.op);
					sh.npos = 1;
				} else if (t->push) {
					sh.npos = push_piece(t, ch, cm, x->step, b, x->pos, max, sh.op);
				} else {
					sh.npos = work_piece(t, ch, x->step, n, x->oneshot, b, x->pos, max, sh.op);
				}
				uint64_t bytes = sh.op.elems * t->dsize;
				*budget = bytes < *budget ? *budget - bytes : 0;
				trace(c, DK_EV_DATA, bytes < 0xffffffffu ? (uint32_t)bytes : 0xffffffffu);
				return A_DATA;
			}
			x->pos = 0;
			*progressed = true;
			/* Release stores are cumulative: what the block wrote before
			 * its barrier is published with them. */
			if (x->step == DK_AWORK) {
				/* Algorithm step done: the ranks that wait for it see it. */
				x->astep++;
				sync_store(dfccl_comm_chan(vis.sync, n, t->slot, t->rank, ch),
				           DFCCL_PROGRESS(t->key, x->astep));
				x->step = x->astep < tg->alg[ch].nsteps ? DK_AWAIT : DK_CHDONE;
				continue;
			}
			if (t->opcode == DFCCL_OP_RECV) {
				sync_store(&t->box->ack, t->key);
				x->step = DK_CHDONE;
				continue;
			}
			if (x->step == DK_PUSH) {
				/* Its data and its post, published to every rank; lines
				 * need no word, and were posted as they went (ll_send). */
				if (t->push != DK_PUSH_LL)
					sync_store(dfccl_comm_chan(vis.sync, n, t->slot, t->rank, ch), DFCCL_PROGRESS(t->key, 1));
				x->step = DK_SYNC1;
				continue;
			}
			if (t->opcode == DFCCL_OP_ALLREDUCE && x->step == DK_WORK1 && !x->oneshot) {
#if DK_PHASE2_STORES
				/* The chunk this block reduced is read by its own
				 * threads in phase 2: the block's barrier orders it. */
				uint32_t ab = stores_begin(cm, t, ch);
				if (ab) {
					tg->status = ab;
					x->step = DK_CHDONE;
					continue;
				}
				x->step = DK_WORK2;
#else
				sync_store(dfccl_comm_chan(vis.sync, n, t->slot, t->rank, ch), DFCCL_PROGRESS(t->key, 1));
				x->step = DK_SYNC1;
#endif
			} else {
				x->step = DK_CHDONE;
			}
			continue;
		}
		case DK_SELF: {
			/* One rank: every collective is its send buffer copied into
			 * its receive buffer (nothing in place; the reader checked
			 * both for count elements), this channel's range of it
			 * piece by piece, then the last channel to leave completes,
			 * its `done` stored where it did (the slot's next instance
			 * waits for it, the supervisor's watch follows it). A
			 * communicator failed before the copy fails it. */
			char *send = NULL, *recv = NULL;
			if (x->pos == 0 && tg->status == DFCCL_CQ_OK) {
				uint32_t ab = comm_aborted(cm, false);
				if (ab)
					tg->status = ab;
			}
			if (tg->status == DFCCL_CQ_OK)
				status = bufs_own(c, t, cm, &send, &recv);
			if (status != DFCCL_CQ_OK) {
				comm_fail(cm, status);
				tg->status = status;
			}
			uint64_t lo, hi;
			chan_range(t, ch, &lo, &hi);
			if (tg->status == DFCCL_CQ_OK && send != recv && x->pos < hi - lo) {
				if (*budget == 0) {
					if (!visit_alone(c, sh)) {
						sh.ret = R_PROGRESS;
						return A_RETURN;
					}
					*budget = c.p.visit_bytes;
				}
				uint64_t max = *budget >> (__ffs(t->dsize) - 1);
				max = max ? max : 1;
				if (max > hi - lo - x->pos)
					max = hi - lo - x->pos;
				dk_op &op = sh.op;
				op_of(t, 1, op);
				op.reduce = 0;
				op.nsrc = 1;
				op.src[0] = send + (lo + x->pos) * t->dsize;
				op.dst = recv + (lo + x->pos) * t->dsize;
				op.elems = max;
				sh.npos = max;
				uint64_t bytes = max * t->dsize;
				*budget = bytes < *budget ? *budget - bytes : 0;
				trace(c, DK_EV_DATA, bytes < 0xffffffffu ? (uint32_t)bytes : 0xffffffffu);
				return A_DATA;
			}
			*progressed = true;
			if (t->nch > 1) {
				sync_fence();
				if (chan_leave(tg, c.b) + 1 < t->nch) {
					trace(c, DK_EV_STEP, ti << 16 | DK_CHDONE); /* its channel left */
					sh.ret = R_CHDONE;
					return A_RETURN;
				}
			}
			/* Published by the completion word's release. */
			if (tg->status == DFCCL_CQ_OK)
				sync_put(&t->posts[t->rank].done, t->key);
			complete_task(c, q, t, tg->status);
			sh.ret = R_FREE;
			return A_RETURN;
		}
		case DK_LLPULL: {
			/* x->pos: 0 before the take, 1 once it ran (ll_result). */
			if (x->pos == 0) {
				char *send, *recv;
				status = bufs_own(c, t, cm, &send, &recv);
				if (status != DFCCL_CQ_OK) {
					comm_fail(cm, status);
					tg->status = status;
					x->step = DK_CHDONE;
					continue;
				}
				ll_piece(t, cm, send, recv, DK_LL_TAKE, sh.op);
				sh.npos = 1;
				return A_DATA;
			}
			x->pos = 0;
			if (ll_result == DK_LL_READY) {
				x->step = DK_CHDONE;
				continue;
			}
			/* A line not there yet, though the last one is: the
			 * peer's stores are still arriving. Give way; the next
			 * visit looks again from SYNC1 (its abort looks too). */
			x->step = DK_SYNC1;
			c.acc.preemptions++;
			sched_on_preempt(s);
			sh.ret = R_PROGRESS;
			return A_RETURN;
		}
		case DK_CHDONE: {
			if (t->push) {
				/* One channel, and no rank reads another's buffers: done
				 * once its own connector is read (`done` lets the peers
				 * reuse the slot), and complete at once. `done` orders
				 * nothing but the block's loads of the connector, which
				 * have returned (their sums are stored) before the
				 * barrier that led here: a plain store, without a fence
				 * of its own, after the completion word, whose release
				 * then waits for the results' stores alone, not for
				 * `done`'s into the peers' copies and the host's; the
				 * count's release publishes it. A peer reuses the slot
				 * only instances later (DFCCL_COMM_SLOTS). */
				const uint32_t words = complete_words(c, q, cq_to_of(c, t), tg->status);
				if (tg->status == DFCCL_CQ_OK) {
					sync_put(&t->posts[t->rank].done, t->key);
					/* No word, no count: its release is not there
					 * to publish `done`. */
					if (words == 0)
						sync_fence();
				}
				complete_count(c, q, tg->status, words);
				sh.ret = R_FREE;
				return A_RETURN;
			}
#if DK_PHASE2_STORES
			/* Before any drain: two failed ranks drain each other. */
			if (stores_task(cm, t, x))
				stores_off(t, ch);
#endif
			/* The last channel of this rank to get here finishes the task;
			 * its release of `done` covers the other channels' writes,
			 * which the fence orders before their count. */
			sync_fence();
			uint32_t done = chan_leave(tg, c.b) + 1;
			if (done < t->nch) {
				sh.ret = R_CHDONE;
				return A_RETURN;
			}
			if (tg->status != DFCCL_CQ_OK || sqe_is_p2p(t->opcode)) {
#if DK_PHASE2_STORES
				/* Every channel has left, so whether this rank posted
				 * is settled: if it did, peers may be storing into any
				 * channel's range of its buffers. */
				if (tg->status != DFCCL_CQ_OK && stores_task(cm, t, x) && own_posted(t)) {
					drain_begin(cm, t, x, tg->status);
					continue;
				}
#endif
				complete_task(c, q, t, tg->status);
				sh.ret = R_FREE;
				return A_RETURN;
			}
			sync_store(&t->posts[t->rank].done, t->key);
			x->step = DK_FINISH;
			*progressed = true;
			continue;
		}
		case DK_SLOT:
			if (t->early) {
				const int armed = early_wait(c, sh, tg, t, q, cm, x);
				if (armed == EARLY_BACK) {
					sh.ret = R_FREE;
					return A_RETURN;
				}
				if (armed == EARLY_WAIT) {
					sh.ret = *progressed ? R_PROGRESS : R_BLOCKED;
					return A_RETURN;
				}
			}
			if (n == 1) {
				/* One rank: one look at its own `done` (DK_SELF looks at
				 * the abort before its copy); chan_wait's round of the
				 * abort, the condition and the scheduler's state only
				 * where the slot's instance before has not completed
				 * (one H200, a 1-rank all-reduce 18.1-18.5 -> 16.8-16.9
				 * us; tests/perf/RESULTS.md, thirty-second run). */
				if (sync_load(&t->posts[0].done) >= t->slot_free) {
					*progressed = true;
					x->step = DK_SELF;
					continue;
				}
				break;
			}
			if (*budget && ll_run_starts(c, t, cm, x, ch)) {
				/* The whole exchange as one piece; its take's result
				 * is read at DK_LLPULL. */
				*progressed = true;
				sched_on_progress(&c.p.sched, s);
				ll_piece(t, cm, t->own_send, t->own_recv, DK_LL_RUN, sh.op);
				x->step = DK_LLPULL;
				x->pos = 0;
				sh.npos = 1;
				uint64_t bytes = t->count * t->dsize;
				*budget = bytes < *budget ? *budget - bytes : 0;
				trace(c, DK_EV_DATA, (uint32_t)bytes);
				return A_DATA;
			}
			break;
		default:
			break;
		}
		algo_step &as = sh.as;
		if (x->step == DK_AWAIT) {
			/* Checked before its wait and its data: a wrong plan or a bug
			 * fails the collective instead of touching another buffer. */
			algo_step_get(&tg->alg[ch], x->astep, &as);
			if (!algo_step_valid(&tg->alg[ch], &as)) {
				comm_fail(cm, DFCCL_CQ_BAD_ENTRY);
				tg->status = DFCCL_CQ_BAD_ENTRY;
				x->step = DK_CHDONE;
				continue;
			}
		}
		int rc = chan_wait(c, x, t, ch, cm, position, s, x->step == DK_AWAIT ? &as : NULL);
#if DK_PHASE2_STORES
		/* Past the bound, a channel's drain ends after one look at the
		 * peers' words: a peer whose GPU stopped stores nothing more. */
		if (rc == 0 && x->step == DK_DRAIN && drain_clock() - x->astep > DK_DRAIN_UNITS)
			rc = 1;
		if (rc < 0 && x->step == DK_FINISH && stores_task(cm, t, x) && own_posted(t)) {
			/* Every channel of this rank is past its stores; the peers'
			 * may not be. */
			tg->status = (uint32_t)-rc;
			drain_begin(cm, t, x, tg->status);
			continue;
		}
#endif
		if (rc < 0) {
			tg->status = (uint32_t)-rc;
			if (x->step == DK_FINISH) {
				complete_task(c, q, t, tg->status);
				sh.ret = R_FREE;
				return A_RETURN;
			}
			x->step = DK_CHDONE;
			continue;
		}
		if (rc == 0) {
			trace(c, DK_EV_PREEMPT, ti << 16 | x->step);
			sh.ret = *progressed ? R_PROGRESS : R_BLOCKED;
			return A_RETURN;
		}
		*progressed = true;
		switch (x->step) {
		case DK_SLOT:
			/* One rank: its copy, with nothing to post (DK_SELF). */
			if (n == 1) {
				x->step = DK_SELF;
				break;
			}
			/* Lines post as they go (DK_PUSH). */
			if (t->push != DK_PUSH_LL)
				post(t, 0);
			x->step = t->push ? DK_PUSH : DK_POSTS;
			break;
		case DK_POSTS:
		case DK_BOX_KEY: {
			dk_bufs &b = sh.bufs;
			status = posts_take(tg, cm);
			if (status == DFCCL_CQ_OK)
				status = bufs_load(c, tg, cm, &b);
			sh.bufs_of = status == DFCCL_CQ_OK ? t->arrival : 0;
			if (status == DFCCL_CQ_OK && t->algo != DFCCL_ALGO_DIRECT) {
				/* This channel's part of the ring or trees. */
				uint64_t lo, hi;
				chan_range(t, ch, &lo, &hi);
				if (algo_init(&tg->alg[ch], &cm->topo, t->algo, t->opcode, t->redop, t->rank,
				              sqe_has_root(t->opcode) ? t->peer : 0, t->count, lo, hi - lo, t->dsize,
				              dk_conn_bytes(t->nch)) < 0)
					status = DFCCL_CQ_OUT_OF_RANGE;
			}
			if (status != DFCCL_CQ_OK) {
				comm_fail(cm, status);
				tg->status = status;
				x->step = DK_CHDONE;
			} else if (t->algo != DFCCL_ALGO_DIRECT) {
				x->astep = 0;
				x->step = tg->alg[ch].nsteps ? DK_AWAIT : DK_CHDONE;
			} else {
				x->oneshot = oneshot_fits(c.p, t, tg, n);
				x->step = DK_WORK1;
			}
			break;
		}
		case DK_SYNC1:
			if (t->push == DK_PUSH_LL) {
				/* Every source's last line is there: the peers agree
				 * about the collective, and their data follow. */
				if (!ll_last_agrees(t, cm)) {
					comm_fail(cm, DFCCL_CQ_MISMATCH);
					tg->status = DFCCL_CQ_MISMATCH;
					x->step = DK_CHDONE;
					break;
				}
				x->pos = 0;
				x->step = DK_LLPULL;
				break;
			}
			if (t->push) {
				/* Every rank's post came before its channel word. */
				status = posts_take(tg, cm);
				if (status != DFCCL_CQ_OK) {
					comm_fail(cm, status);
					tg->status = status;
					x->step = DK_CHDONE;
					break;
				}
			}
			x->step = DK_WORK2;
			break;
		case DK_AWAIT: x->step = DK_AWORK; break;
		case DK_BOX_FREE:
			box_post(t);
			x->step = DK_BOX_ACK;
			break;
		case DK_BOX_WANT:
			/* The mailbox is this message's: its sender, even one
			 * beyond its engine's room, may come in (scheduler.h). */
			sync_store(&t->box->want, t->key);
			x->step = DK_BOX_KEY;
			break;
		case DK_BOX_ACK: x->step = DK_CHDONE; break;
#if DK_PHASE2_STORES
		case DK_DRAIN:
			x->wait_rank = 0; /* a look past the bound may have left it */
			if (++x->pos < t->nch)
				break; /* the next channel */
			complete_task(c, q, t, tg->status);
			sh.ret = R_FREE;
			return A_RETURN;
#endif
		default: /* DK_FINISH */
			complete_task(c, q, t, DFCCL_CQ_OK);
			sh.ret = R_FREE;
			return A_RETURN;
		}
	}
}

/* ------------------------------------------------------------------ the kernel */

/* Counters carry on from the last launch (thread 0 of each block, and the
 * reader): from their copy in device memory (dk_state.counters), which
 * stats_flush keeps with the host's, all loaded before any is stored so
 * that the loads overlap. Loaded from the host's over PCIe, they took 8.3
 * us from a launch's first instruction to block 0's queue rebuilt, on
 * every launch, whether or not the loads were staged so
 * (tests/perf/RESULTS.md, twenty-fourth run). */
__device__ void ctx_start(dk_ctx &c)
{
	const volatile uint64_t *v = (const volatile uint64_t *)&c.st->counters[c.slot];
	uint64_t x[DK_NCOUNTERS];
#pragma unroll
	for (int k = 0; k < DK_NCOUNTERS; k++)
		x[k] = v[k];
	uint64_t *a = (uint64_t *)&c.acc;
#pragma unroll
	for (int k = 0; k < DK_NCOUNTERS; k++)
		a[k] = x[k];
	c.out = c.acc;
	c.flushed = now_ns();
	c.trace_n = c.p.trace ? c.p.trace->n[c.slot] : 0;
}

/*
 * After a pass that took nothing the reader sleeps about this long
 * (__nanosleep: up to twice it) before the next. Its passes are mostly
 * PCIe reads of the queues' headers in host memory; back to back they
 * slowed the stream-ordered form, whose arm and completion words go
 * through host memory by the GPU's own stream operations: 2 ranks on 2
 * H200, 8 B to 4 KiB all-reduces, 48 us a call without a rest, 44.5 with
 * 1 us, 44 with 2 us, the callback form within 0.8 us of before
 * (tests/perf/RESULTS.md, fourteenth run).
 */
#define DK_READER_REST_NS 1000u

/*
 * The queue reader: one lane of block 0's last warp takes the armed entries
 * of every queue pair, makes tasks of them and hands them to the blocks'
 * inboxes, while the blocks run their tasks, so that no block's turn waits
 * for a pass over the queues (a PCIe round trip per queue pair at least).
 * It decides the voluntary quit: when no task is live and nothing came for
 * idle_ns it says so to the clients, looks once more, and sets ctl.quit;
 * the blocks leave once their queues are empty.
 */
__device__ void reader_main(dk_ctx &c)
{
	dk_state *st = c.st;
	const uint64_t begun = now_ns();
	ctx_start(c);
	trace_at(c, DK_EV_START, DK_START_BEGUN, begun);
	trace(c, DK_EV_START, DK_START_LOADED);
	/* Tasks only once every block has rebuilt its queue, so none is taken
	 * twice. */
	while (vload(&st->ctl.started) < c.p.wait_blocks) {
		if (vload(&st->ctl.stop) || vload(&st->ctl.park))
			return;
		__nanosleep(100);
	}
	trace(c, DK_EV_START, DK_START_READY);
	/* The reader's own copies: the tails and the arrival count are moved
	 * by it alone. A tail is loaded when a task first goes to its block
	 * (entry_take): every block's, one after the other, took about 7 us
	 * before a launch's first pass (twenty-fourth run). */
	c.rknown = 0;
	c.rpend = 0;
	c.arrivals = vload(&st->arrivals);
	c.free_base = c.free_mask = 0;
	c.nqps = vload(&st->ctl.nqps);
	rcopy.take_max = 0;
	qcache.known = qcache.live = 0;
	/* It quits after idle_ns with nothing to do where the last entry it
	 * took was armed by the CPU, after stream_idle where a stream armed
	 * it: the launch gate brings it back for the next stream-armed one,
	 * and a trainer's next kernel, which a stream orders after the
	 * completion, finds every SM free sooner (tests/perf/RESULTS.md,
	 * twenty-fourth run). stream_idle follows the client's pace
	 * (dk_stream_idle): longer while launches follow quits closely. */
	const uint64_t stream_idle =
	    dk_stream_idle(c.p.stream_idle_ns, c.p.idle_ns, vload(&st->stream_idle_ns), vload(&st->stream_quit_ns), begun);
	*(volatile uint64_t *)&st->stream_idle_ns = stream_idle;
	*(volatile uint64_t *)&st->stream_quit_ns = 0;
	uint64_t last_active = now_ns();
	c.passes = 0;
	c.cpu_last = false;
	/* Early tasks of the last launch may be waiting still. */
	c.early_live = c.p.early_take != 0;
	while (!vload(&st->ctl.stop) && !vload(&st->ctl.park)) {
		uint32_t got = read_queues(c);
		c.passes++;
		trace(c, DK_EV_QUEUES, got);
		uint64_t now = now_ns();
		const uint32_t live = got ? 0u : vload(&st->live_tasks);
		/* A second round trip after live's, only where tasks can be
		 * taken early. */
		const uint32_t early = live && c.early_live ? vload(&st->early_tasks) : 0u;
		const int step = dk_idle_step(got, live, early, now - last_active, c.cpu_last ? c.p.idle_ns : stream_idle);
		if (step == DK_IDLE_ACTIVE) {
			last_active = now;
		} else if (step == DK_IDLE_GIVE_BACK) {
			/* Only tasks taken early, waiting for their arms, kept the
			 * kernel: they go back to their queues (early_wait), and it
			 * quits idle as without them, taking none early for a
			 * while. */
			early_ask_back(c, now);
			last_active = now;
		} else if (step == DK_IDLE_QUIT) {
			/* Going: say so, then look once more, so an entry armed
			 * before a client saw SLEEPING is not missed. */
			set_engine_state(st, DFCCL_ENGINE_SLEEPING);
			c.passes = 0; /* a whole look: past every unarmed head too */
			/* The live tasks' count read 0 before: an entry given back
			 * (early_give_back, before its task was freed) is moved
			 * back to by this look, so the launch gate sees it. */
			__threadfence();
			got = read_queues(c);
			if (got > 0) {
				set_engine_state(st, DFCCL_ENGINE_POLLING);
				last_active = now_ns();
			} else {
				*(volatile uint32_t *)&st->ctl.quit = 1;
				if (!c.cpu_last)
					*(volatile uint64_t *)&st->stream_quit_ns = now;
				*(volatile uint32_t *)&c.p.host->quit_voluntary = 1;
				__threadfence_system();
				break;
			}
		}
		stats_tick(c, got == 0);
		if (!got)
			__nanosleep(DK_READER_REST_NS);
	}
	stats_flush(c);
}

__global__ void __launch_bounds__(DK_THREADS, DK_MIN_BLOCKS_PER_SM) dk_main(dk_params p)
{
	__shared__ dk_shared sh;
	/* The contexts of thread 0, which runs the block's control, and of
	 * the queue reader (block 0): in shared memory, not on the stack
	 * (dk_shared's scratch says why). No other thread uses them. */
	__shared__ dk_ctx ctxs[2];
	const uint32_t tid = threadIdx.x, b = p.first + blockIdx.x;
	if (tid >= DK_WORKERS) {
		uint32_t lane = tid - DK_WORKERS;
		if (b == 0 && lane == 0) {
			dk_ctx &c = ctxs[1];
			c.p = p;
			c.st = p.st;
			c.b = b;
			c.slot = DK_READER;
			c.bs = &p.host->block[DK_READER];
			reader_main(c);
			copy_entries(DK_COPY_QUIT);
		} else if (b == 0 && (DK_COPIERS >> lane & 1u)) {
			copier_main(lane, p);
		}
		return;
	}
	dk_ctx &c = ctxs[0];
	if (tid == 0) {
		c.p = p;
		c.st = p.st;
		c.b = b;
		c.slot = b;
		c.bs = &p.host->block[b];
	}
	dk_state *st = p.st;
	/* A bulk block leaves after bulk_idle_ns with nothing to do (thread
	 * 0: since when, 0: busy), or on a quit, through bulk_leave (left). */
	const bool bulk = p.bulk0 && b >= p.bulk0;
	uint64_t idle_since = 0;
	bool left = false;
	if (tid == 0) {
		const uint64_t begun = p.trace ? now_ns() : 0;
		ctx_start(c);
		trace_at(c, DK_EV_START, DK_START_BEGUN, begun);
		trace(c, DK_EV_START, DK_START_LOADED);
		vis.epoch = 0; /* no communicator's words read yet */
		sh.bufs_of = 0;
		sh.q.n = 0;
		dk_inbox *ib = &st->inbox[b];
		if (bulk)
			*(volatile uint32_t *)&ib->active = 1;
		if (p.rebuild) {
			/* Resume: the tasks this block had when the kernel last
			 * left (their contexts are in global memory), in their
			 * order. Tasks still in the inbox are among them, so it
			 * starts empty. */
			ib->head = vload(&ib->tail);
			uint32_t live = vload(&st->live_tasks);
			for (uint32_t ti = 0; live && ti < DK_MAX_TASKS; ti++) {
				dk_task *t = &st->tasks[ti];
				if (vload(&t->state) == DK_TASK_LIVE && chan_of(p, t, b) < t->nch &&
				    t->ch[b].step != DK_LEFT)
					sched_insert(&p.sched, &sh.q, st->states[b], ti);
			}
			__threadfence();
			atomicAdd(&st->ctl.started, 1u);
		}
		trace(c, DK_EV_START, DK_START_READY);
		/* Else a bulk block the reader asked for: it left with an
		 * empty queue, and its tasks since are in its inbox. */
	}
	uint64_t last_task = 0;
	for (;;) {
		if (tid == 0) {
			trace(c, DK_EV_LOOP, sh.q.n);
			dk_inbox *ib = &st->inbox[b];
			/* The control words in one load, on its way before the
			 * tail's acquire (which holds back the loads after it): a
			 * stop, park or quit seen a turn late costs a turn. */
			const uint4 ctl = ll_load((const uint4 *)&st->ctl);
			/* An acquire: the places and tasks the reader published with
			 * its fence before the tail are read after it. */
			uint32_t tail = ld_acq_gpu32(&ib->tail);
			while (ib->head != tail && sh.q.n < SCHED_MAX_TASKS) {
				uint32_t ti = vload(&ib->idx[ib->head % DK_MAX_TASKS]);
				trace(c, DK_EV_TASK, ti);
				sched_insert(&p.sched, &sh.q, st->states[b], ti);
				ib->head++;
			}
			sh.quit = 0;
			if (ctl.y || ctl.z) { /* stop, park */
				sh.quit = 1;
			} else if (ctl.x && sh.q.n == 0 && ib->head == vload(&ib->tail)) { /* quit */
				/* A bulk block too through the handshake: the host
				 * may have launched the kernel again meanwhile, and
				 * its reader handed this block a task. */
				if (bulk)
					left = bulk_leave(ib);
				sh.quit = !bulk || left;
			} else if (bulk && sh.q.n == 0) {
				uint64_t now = now_ns();
				if (!idle_since) {
					idle_since = now;
				} else if (now - idle_since >= p.bulk_idle_ns) {
					left = bulk_leave(ib);
					sh.quit = left;
					idle_since = 0;
				}
			} else {
				idle_since = 0;
			}
		}
		work_sync();
		if (sh.quit)
			break;
		uint32_t pos = 0;
		while (pos < sh.q.n) {
			uint32_t ti = sh.q.idx[pos];
			dk_task *t = &st->tasks[ti];
			/* The task's fixed part, in one parallel load through L2 (a
			 * task slot is reused, so L1 may hold an older task's). */
			const uint32_t F = DK_TASK_FIXED_BYTES / 16;
			if (tid < F)
				sh.tfix[tid] = __ldcg((const uint4 *)t + tid);
			else if (tid < F + 4)
				((unsigned long long *)&sh.x)[tid - F] =
				    __ldcg((const unsigned long long *)&t->ch[b] + (tid - F));
			else if (tid < F + 6)
				((unsigned long long *)&sh.s)[tid - F - 4] =
				    __ldcg((const unsigned long long *)&st->states[b][ti] + (tid - F - 4));
			work_sync();
			uint64_t arrival = ((const dk_task *)sh.tfix)->arrival;
			if (tid == 0 && arrival != last_task) {
				if (last_task)
					c.acc.context_switches++;
				last_task = arrival;
			}
			uint64_t budget = p.visit_bytes;
			bool progressed = false, piece_done = false;
			for (;;) {
				if (tid == 0)
					sh.act = chan_control(c, sh, ti, pos, piece_done, &budget, &progressed);
				work_sync();
				if (sh.act != A_DATA)
					break;
				if (sh.op.elems)
					op_run(sh.op);
				work_sync();
				piece_done = true;
			}
			uint32_t ret = sh.ret;
			if (tid == 0 && ret != R_CHDONE && ret != R_FREE) {
				/* Still ours (a channel that left may have seen its task
				 * freed, chan_leave): the copies go back. */
				volatile unsigned long long *gx = (volatile unsigned long long *)&t->ch[b];
				volatile unsigned long long *gs = (volatile unsigned long long *)&st->states[b][ti];
				for (uint32_t k = 0; k < 4; k++)
					gx[k] = ((const unsigned long long *)&sh.x)[k];
				for (uint32_t k = 0; k < 2; k++)
					gs[k] = ((const unsigned long long *)&sh.s)[k];
			}
			work_sync();
			if (ret == R_CHDONE || ret == R_FREE) {
				if (tid == 0) {
					sched_remove_at(&sh.q, pos);
					if (ret == R_FREE)
						task_free(st, t);
					stats_tick(c, false);
				}
				work_sync();
				continue;
			}
			pos++;
		}
		if (tid == 0)
			stats_tick(c, sh.q.n == 0);
		work_sync();
	}
	if (tid == 0) {
		if (bulk && !left) /* stop, park: the host launches it again */
			*(volatile uint32_t *)&st->inbox[b].active = 0;
		stats_flush(c);
		if (bulk) { /* the worker's sign that this launch is over (cuda_engine.cu) */
			__threadfence_system();
			volatile uint32_t *x = &p.host->bulk_exits[b];
			*x = *x + 1;
		}
	}
}

extern "C" int dk_launch(const struct dk_params *p, void *stream)
{
	uint32_t grid = p->first ? 1 : p->bulk0 ? p->bulk0 : p->blocks;
	dk_main<<<grid, DK_THREADS, 0, (cudaStream_t)stream>>>(*p);
	return (int)cudaGetLastError();
}

extern "C" uint32_t dk_max_blocks(int device)
{
	int sms = 0, per_sm = 0;
	cudaError_t rc = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
	if (rc == cudaSuccess)
		rc = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dk_main, DK_THREADS, 0);
	if (rc != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return sms > 0 && per_sm > 0 ? (uint32_t)sms * (uint32_t)per_sm : 0;
}

extern "C" int dk_preload(void)
{
	cudaFuncAttributes a;
	return (int)cudaFuncGetAttributes(&a, dk_main);
}
