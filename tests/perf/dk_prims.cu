/*
 * dk_prims: what the memory operations of the daemon kernel's control path
 * cost on this GPU, one thread timing a chain of each where every operation
 * waits for the one before (as thread 0's steps do: gpu/cuda/dkernel.cu).
 * The figures say which of a step's operations its microseconds go to:
 * loads through L2, acquire loads at GPU and system scope, reads of mapped
 * host memory (the queues), one at a time and several at once as the queue
 * reader loads them, and of a peer GPU's memory (another GPU's copy
 * of a communicator's words), fences with and without stores to host memory
 * outstanding, release stores, atomics, __nanosleep, and a block barrier.
 *
 * Usage: dk_prims [--iters N] [--peer GPU]
 * Prints one line per operation: its name and nanoseconds per operation
 * (the median of 5 runs of N, default 2000). --peer also times GPU 0's
 * reads of GPU PEER's memory (needs peer access between them). Exits 77
 * where no GPU is.
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUNS 5
#define CHASE 4096u /* words of a pointer chase (16 KiB, within L2) */

enum {
	OP_LD_L2,        /* ld.volatile (through L2) */
	OP_LD_ACQ_GPU,   /* ld.acquire.gpu */
	OP_LD_ACQ_SYS,   /* ld.acquire.sys of device memory */
	OP_LD_HOST,      /* ld.volatile of mapped host memory (PCIe) */
	OP_LD_ACQ_HOST,  /* ld.acquire.sys of mapped host memory */
	OP_LD_PEER,      /* ld.volatile of a peer GPU's memory */
	OP_LD_HOST_X16,  /* 16 independent ld.volatile of mapped host memory (the reader's look at 16 arm words) */
	OP_LD_HOST_CV16, /* 8 independent 16-byte ld.global.cv of one 128-byte entry in mapped host memory */
	OP_LD_HOST_COPY, /* 16 independent 8-byte ld.volatile of one 128-byte entry (the reader's copy of an entry) */
	OP_FENCE_GPU,    /* fence.acq_rel.gpu */
	OP_FENCE_SYS,    /* fence.acq_rel.sys, nothing outstanding */
	OP_ST_HOST_FENCE, /* a store to host memory, then fence.acq_rel.sys */
	OP_ST_REL_HOST,  /* st.release.sys to host memory */
	OP_ST_REL_GPU,   /* st.release.gpu to device memory */
	OP_ST_PEER_FENCE, /* a store to a peer's memory, then fence.acq_rel.sys */
	OP_FENCE_SC_GPU, /* fence.sc.gpu (__threadfence) */
	OP_FENCE_SC_SYS, /* fence.sc.sys (__threadfence_system), nothing outstanding */
	OP_ST_GPU_FENCE, /* a store to device memory, then fence.acq_rel.gpu */
	OP_ST_GPU_FENCE_SC, /* a store to device memory, then fence.sc.gpu */
	OP_ATOMIC_ADD,   /* atomicAdd on device memory, its result used */
	OP_ATOMIC_CAS,   /* atomicCAS on device memory, its result used */
	OP_NANOSLEEP,    /* __nanosleep(64) */
	OP_BARRIER,      /* bar.sync of 512 threads */
	OP_COUNT
};

static const char *const names[OP_COUNT] = {
    "ld.volatile, device memory (L2)",     "ld.acquire.gpu, device memory",
    "ld.acquire.sys, device memory",       "ld.volatile, mapped host memory",
    "ld.acquire.sys, mapped host memory",  "ld.volatile, peer GPU memory",
    "16 ld.volatile at once, host memory", "8 16-byte ld.cv of an entry, host",
    "16 8-byte ld.volatile of an entry, host",
    "fence.acq_rel.gpu",                   "fence.acq_rel.sys, nothing outstanding",
    "store to host memory + fence.sys",    "st.release.sys to host memory",
    "st.release.gpu to device memory",     "store to peer GPU memory + fence.sys",
    "fence.sc.gpu (__threadfence)",        "fence.sc.sys, nothing outstanding",
    "store to device mem + fence.acq_rel.gpu", "store to device mem + fence.sc.gpu",
    "atomicAdd (result used)",             "atomicCAS (result used)",
    "__nanosleep(64)",                     "bar.sync, 512 threads"};

__device__ __forceinline__ uint64_t now_ns(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* A chase: each load's address is the value of the one before. */
__device__ __forceinline__ uint32_t chase(int op, const uint32_t *p, uint32_t i)
{
	uint32_t v;
	switch (op) {
	case OP_LD_ACQ_GPU: asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p + i) : "memory"); break;
	case OP_LD_ACQ_SYS:
	case OP_LD_ACQ_HOST: asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p + i) : "memory"); break;
	default: v = *(const volatile uint32_t *)(p + i); break;
	}
	return v;
}

/* Words of host memory loaded at once from i on: 16 words 256 bytes apart
 * (x16), or one 128-byte entry in 8 16-byte pieces (cv16) or 16 8-byte ones
 * (copy); each group waits only for the one before, through i. */
__device__ __forceinline__ uint32_t group(int op, const uint32_t *p, uint32_t i)
{
	uint32_t sum = 0;
	if (op == OP_LD_HOST_X16) {
		uint32_t v[16];
#pragma unroll
		for (int k = 0; k < 16; k++)
			v[k] = *(const volatile uint32_t *)(p + ((i + 64u * k) & (CHASE - 1u)));
#pragma unroll
		for (int k = 0; k < 16; k++)
			sum += v[k];
	} else if (op == OP_LD_HOST_COPY) {
		const volatile uint64_t *q = (const volatile uint64_t *)(p + (i & (CHASE - 1u) & ~31u));
		uint64_t v[16];
#pragma unroll
		for (int k = 0; k < 16; k++)
			v[k] = q[k];
#pragma unroll
		for (int k = 0; k < 16; k++)
			sum += (uint32_t)v[k] + (uint32_t)(v[k] >> 32);
	} else {
		const uint4 *q = (const uint4 *)(p + (i & (CHASE - 1u) & ~31u));
		uint4 v[8];
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = __ldcv(q + k);
#pragma unroll
		for (int k = 0; k < 8; k++)
			sum += v[k].x + v[k].y + v[k].z + v[k].w;
	}
	return sum & (CHASE - 1u);
}

/* OP is a template parameter, so that each chain is the operation alone. */
template <int op>
__global__ void __launch_bounds__(512) prims(uint32_t *dev, uint32_t *host, uint32_t *peer, uint32_t iters,
                                             unsigned long long *out)
{
	__shared__ uint32_t sink;
	uint32_t tid = threadIdx.x;
	if (op == OP_BARRIER) {
		uint64_t t0 = now_ns();
		for (uint32_t k = 0; k < iters; k++)
			__syncthreads();
		if (tid == 0)
			*out = now_ns() - t0;
		return;
	}
	if (tid != 0)
		return;
	bool on_host = op == OP_LD_HOST || op == OP_LD_ACQ_HOST || op == OP_LD_HOST_X16 || op == OP_LD_HOST_CV16 ||
	               op == OP_LD_HOST_COPY;
	uint32_t *chased = on_host ? host : op == OP_LD_PEER ? peer : dev;
	uint32_t i = 0, acc = 0;
	uint64_t t0 = now_ns();
	for (uint32_t k = 0; k < iters; k++) {
		switch (op) {
		case OP_LD_L2:
		case OP_LD_ACQ_GPU:
		case OP_LD_ACQ_SYS:
		case OP_LD_HOST:
		case OP_LD_ACQ_HOST:
		case OP_LD_PEER: i = chase(op, chased, i); break;
		case OP_LD_HOST_X16:
		case OP_LD_HOST_CV16:
		case OP_LD_HOST_COPY: i = group(op, chased, i); break;
		case OP_FENCE_GPU: asm volatile("fence.acq_rel.gpu;" ::: "memory"); break;
		case OP_FENCE_SYS: asm volatile("fence.acq_rel.sys;" ::: "memory"); break;
		case OP_ST_HOST_FENCE:
			*(volatile uint32_t *)(host + (k & 63u)) = k;
			asm volatile("fence.acq_rel.sys;" ::: "memory");
			break;
		case OP_ST_REL_HOST:
			asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(host + (k & 63u)), "r"(k) : "memory");
			break;
		case OP_ST_REL_GPU:
			asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(dev + (k & 63u)), "r"(k) : "memory");
			break;
		case OP_ST_PEER_FENCE:
			*(volatile uint32_t *)(peer + (k & 63u)) = k;
			asm volatile("fence.acq_rel.sys;" ::: "memory");
			break;
		case OP_FENCE_SC_GPU: asm volatile("fence.sc.gpu;" ::: "memory"); break;
		case OP_FENCE_SC_SYS: asm volatile("fence.sc.sys;" ::: "memory"); break;
		case OP_ST_GPU_FENCE:
			*(volatile uint32_t *)(dev + (k & 63u)) = k;
			asm volatile("fence.acq_rel.gpu;" ::: "memory");
			break;
		case OP_ST_GPU_FENCE_SC:
			*(volatile uint32_t *)(dev + (k & 63u)) = k;
			asm volatile("fence.sc.gpu;" ::: "memory");
			break;
		case OP_ATOMIC_ADD: acc += atomicAdd(dev + (acc & 1u), 1u); break;
		case OP_ATOMIC_CAS: acc += atomicCAS(dev + (acc & 1u), acc, acc + 1u); break;
		default: __nanosleep(64); break;
		}
	}
	uint64_t t = now_ns() - t0;
	sink = i + acc;
	*out = t;
	/* Never true, but the compiler cannot tell: keeps the chains, whose
	 * non-volatile loads (ld.cv) would otherwise go as unused. */
	if (sink == iters + 0x7fffffffu)
		*out = 0;
}

/* Launches the chain of op (a runtime value) as its own kernel. */
template <int op> static void launch_from(int want, uint32_t *dev, uint32_t *host, uint32_t *peer, uint32_t iters,
                                          unsigned long long *out)
{
	if (want == op)
		prims<op><<<1, 512>>>(dev, host, peer, iters, out);
	else if (op + 1 < OP_COUNT)
		launch_from<(op + 1 < OP_COUNT ? op + 1 : op)>(want, dev, host, peer, iters, out);
}

/* A ring of CHASE words, each the index of the next, with a stride that
 * defeats prefetching but stays within the allocation. */
static void ring_init(uint32_t *w)
{
	for (uint32_t k = 0; k < CHASE; k++)
		w[k] = (k + 97u * 8u) % CHASE;
}

static int cmp_ull(const void *a, const void *b)
{
	unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
	return x < y ? -1 : x > y;
}

#define CHECK(call)                                                                                          \
	do {                                                                                                     \
		cudaError_t rc_ = (call);                                                                            \
		if (rc_ != cudaSuccess) {                                                                            \
			fprintf(stderr, "dk_prims: %s: %s\n", #call, cudaGetErrorString(rc_));                           \
			return 1;                                                                                        \
		}                                                                                                    \
	} while (0)

int main(int argc, char **argv)
{
	uint32_t iters = 2000;
	int peer_dev = -1;
	for (int a = 1; a < argc; a++) {
		if (!strcmp(argv[a], "--iters") || !strcmp(argv[a], "--peer")) {
			char *end = NULL;
			long v = a + 1 < argc ? strtol(argv[a + 1], &end, 10) : -1;
			if (a + 1 >= argc || end == argv[a + 1] || *end || v < 0 || v > 100000000) {
				fprintf(stderr, "dk_prims: %s takes a number (0 to 100000000)%s%s\n", argv[a],
				        a + 1 < argc ? ", not " : "", a + 1 < argc ? argv[a + 1] : "");
				return 2;
			}
			if (!strcmp(argv[a], "--iters"))
				iters = (uint32_t)v;
			else
				peer_dev = (int)v;
			a++;
		} else if (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help")) {
			printf("Usage: dk_prims [--iters N] [--peer GPU]\n"
			       "Times chains of the daemon kernel's memory operations on GPU 0, one thread,\n"
			       "each waiting for the one before: ns per operation, the median of %d runs\n"
			       "of N (default 2000). --peer GPU also times reads and stores of that GPU's\n"
			       "memory (peer access needed).\n",
			       RUNS);
			return 0;
		} else {
			fprintf(stderr, "dk_prims: unknown argument '%s' (see --help)\n", argv[a]);
			return 2;
		}
	}
	if (iters == 0) {
		fprintf(stderr, "dk_prims: --iters takes a positive count\n");
		return 2;
	}
	int ngpu = 0;
	if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu == 0) {
		printf("SKIPPED: dk_prims needs an NVIDIA GPU\n");
		return 77;
	}
	uint32_t ring[CHASE];
	ring_init(ring);
	uint32_t *dev = NULL, *host = NULL, *host_dev = NULL, *peer = NULL;
	unsigned long long *out = NULL;
	CHECK(cudaSetDevice(0));
	CHECK(cudaMalloc((void **)&dev, sizeof(ring)));
	CHECK(cudaMemcpy(dev, ring, sizeof(ring), cudaMemcpyHostToDevice));
	CHECK(cudaHostAlloc((void **)&host, sizeof(ring), cudaHostAllocMapped));
	memcpy(host, ring, sizeof(ring));
	CHECK(cudaHostGetDevicePointer((void **)&host_dev, host, 0));
	CHECK(cudaMalloc((void **)&out, sizeof(*out)));
	int can = 0;
	if (peer_dev >= 0 && (peer_dev == 0 || peer_dev >= ngpu || cudaDeviceCanAccessPeer(&can, 0, peer_dev) != cudaSuccess ||
	                      !can)) {
		/* The rest of the table still says something. */
		printf("# GPU 0 cannot reach GPU %d as a peer: the peer rows are left out\n", peer_dev);
		peer_dev = -1;
	}
	if (peer_dev >= 0) {
		CHECK(cudaDeviceEnablePeerAccess(peer_dev, 0));
		CHECK(cudaSetDevice(peer_dev));
		CHECK(cudaMalloc((void **)&peer, sizeof(ring)));
		CHECK(cudaMemcpy(peer, ring, sizeof(ring), cudaMemcpyHostToDevice));
		CHECK(cudaSetDevice(0));
	}
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("# dk_prims on GPU 0 (%s)%s, one thread, %u operations per run, median of %d runs\n", prop.name,
	       peer ? ", peer GPU given" : "", iters, RUNS);
	for (int op = 0; op < OP_COUNT; op++) {
		if (!peer && (op == OP_LD_PEER || op == OP_ST_PEER_FENCE))
			continue;
		unsigned long long t[RUNS];
		for (int r = 0; r < RUNS; r++) {
			launch_from<0>(op, dev, host_dev, peer, iters, out);
			CHECK(cudaGetLastError());
			CHECK(cudaDeviceSynchronize());
			CHECK(cudaMemcpy(&t[r], out, sizeof(t[r]), cudaMemcpyDeviceToHost));
		}
		qsort(t, RUNS, sizeof(t[0]), cmp_ull);
		printf("%-40s %9.1f ns\n", names[op], (double)t[RUNS / 2] / iters);
	}
	return 0;
}
