/*
 * launch_path: what the queue path of a stream-ordered call costs when the
 * daemon's CPU takes each entry and launches a kernel for it, against a
 * persistent kernel that polls for it: the measurement behind the choice
 * between a resident daemon kernel and one launched per collective under
 * MPS (tests/perf/RESULTS.md).
 *
 * The parent forks a "daemon" process on GPU 0, which serves the parent's
 * arm word (in shared host memory) in one of two ways, in turn:
 *   persistent: a one-thread persistent kernel polls the arm word and, once
 *     it moves, stores the completion word (a release at system scope);
 *   launch: a CPU thread polls the arm word and, once it moves, launches a
 *     kernel of one block of 512 threads, with a 256-byte argument (a
 *     task's worth), whose thread 0 stores the completion word;
 *   gated: the daemon's stream holds, ahead of time, for each of the next
 *     16 calls a stream wait on the arm word (>= the call's number) and the
 *     same kernel behind it; its CPU only tops the queue up as completions
 *     pass. No CPU in a call's path, and no SM held between calls.
 * The parent's stream does, --iters times, cuStreamWriteValue64(arm = i)
 * and cuStreamWaitValue64(completion >= i), timed with events: the round
 * trip back to back; and with --compute US, a compute kernel of about US
 * microseconds on every SM before each call (a trainer's step), timed
 * against the compute kernel alone in the same loop: the time the call
 * adds to a step. Run under MPS and without (a persistent kernel and the
 * parent's kernels take turns at time slices without MPS: there the
 * compute loop measures the time slice).
 *
 * Usage: launch_path [--iters N] [--compute US]
 * Exits 77 where no GPU is.
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PERF_PROG "launch_path"
#include "perf_cuda.h"

enum { MODE_NONE = 0, MODE_PERSISTENT = 1, MODE_LAUNCH = 2, MODE_GATED = 3, MODE_QUIT = 4 };
/* Calls the gated server keeps queued ahead. */
#define GATED_DEPTH 16u

/* Host memory shared across the fork. */
struct shared {
	uint64_t arm;
	uint64_t pad0[7];
	uint64_t cw;
	uint64_t pad1[7];
	volatile int mode, mode_ack, ready, failed;
	volatile uint64_t launches;
};

/* A task's worth of launch argument. */
struct task_arg {
	uint64_t *cw;
	uint64_t value;
	uint64_t rest[30];
};

/* The persistent server: until *quit (device memory) is set. */
__global__ void persistent_kernel(struct shared *h, const volatile uint32_t *quit)
{
	uint64_t last = ld_acquire_sys(&h->arm);
	while (!*quit) {
		uint64_t a = ld_acquire_sys(&h->arm);
		if (a <= last)
			continue;
		last = a;
		st_release_sys(&h->cw, a);
	}
}

/* The launched server: one block, its thread 0 completes the call. */
__global__ void __launch_bounds__(512) launched_kernel(struct task_arg t)
{
	if (threadIdx.x == 0)
		st_release_sys(t.cw, t.value);
}

/* The parent's step: every thread spins until `us` microseconds have
 * passed since its block started. */
__global__ void compute_kernel(uint32_t us)
{
	uint64_t t0 = globaltimer();
	while (globaltimer() - t0 < (uint64_t)us * 1000u)
		;
}

/* The daemon: serves the arm word in the mode the parent asks for, until
 * MODE_QUIT. Both kernels are launched once before anything runs (lazy
 * loading of a kernel while a persistent one runs hangs the process). */
static int daemon_main(struct shared *h)
{
	CK(cudaSetDevice(0));
	CK(cudaHostRegister(h, sizeof(*h), cudaHostRegisterMapped | cudaHostRegisterPortable));
	struct shared *dh;
	CK(cudaHostGetDevicePointer((void **)&dh, h, 0));
	uint32_t *quit;
	CK(cudaMalloc((void **)&quit, sizeof(*quit)));
	cudaStream_t s, ctl;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&ctl, cudaStreamNonBlocking));
	struct task_arg t;
	memset(&t, 0, sizeof(t));
	t.cw = &dh->pad1[0]; /* a word nobody waits on */
	launched_kernel<<<1, 512, 0, s>>>(t);
	CK(cudaMemset(quit, 1, sizeof(*quit)));
	persistent_kernel<<<1, 1, 0, s>>>(dh, quit);
	CK(cudaStreamSynchronize(s));
	t.cw = &dh->cw;
	__atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
	for (;;) {
		int mode = __atomic_load_n(&h->mode, __ATOMIC_ACQUIRE);
		if (mode == MODE_QUIT)
			return 0;
		if (mode == MODE_PERSISTENT) {
			CK(cudaMemset(quit, 0, sizeof(*quit)));
			persistent_kernel<<<1, 1, 0, s>>>(dh, quit);
			CK(cudaGetLastError());
			__atomic_store_n(&h->mode_ack, mode, __ATOMIC_RELEASE);
			while (__atomic_load_n(&h->mode, __ATOMIC_ACQUIRE) == mode)
				usleep(1000);
			uint32_t one = 1;
			CK(cudaMemcpyAsync(quit, &one, sizeof(one), cudaMemcpyHostToDevice, ctl));
			CK(cudaStreamSynchronize(ctl));
			CK(cudaStreamSynchronize(s));
		} else if (mode == MODE_LAUNCH) {
			uint64_t last = __atomic_load_n(&h->arm, __ATOMIC_ACQUIRE);
			__atomic_store_n(&h->mode_ack, mode, __ATOMIC_RELEASE);
			for (uint32_t k = 0; __atomic_load_n(&h->mode, __ATOMIC_RELAXED) == mode; k++) {
				uint64_t a = __atomic_load_n(&h->arm, __ATOMIC_ACQUIRE);
				if (a <= last)
					continue;
				last = a;
				t.value = a;
				launched_kernel<<<1, 512, 0, s>>>(t);
				h->launches++;
				/* A failed launch shows at once or in the stream. */
				if ((k & 1023u) == 0)
					CK(cudaGetLastError());
			}
			CK(cudaStreamSynchronize(s));
		} else if (mode == MODE_GATED) {
			uint64_t queued = __atomic_load_n(&h->arm, __ATOMIC_ACQUIRE);
			__atomic_store_n(&h->mode_ack, mode, __ATOMIC_RELEASE);
			while (__atomic_load_n(&h->mode, __ATOMIC_RELAXED) == mode) {
				uint64_t done = __atomic_load_n(&h->cw, __ATOMIC_ACQUIRE);
				while (queued < done + GATED_DEPTH) {
					queued++;
					CD(wait_value64((CUstream)s, (CUdeviceptr)(uintptr_t)&dh->arm, queued,
					                CU_STREAM_WAIT_VALUE_GEQ));
					t.value = queued;
					launched_kernel<<<1, 512, 0, s>>>(t);
					h->launches++;
				}
			}
			/* The waits still queued are let through: this is the last
			 * mode the parent asks for, and it arms nothing more. */
			__atomic_store_n(&h->arm, queued, __ATOMIC_RELEASE);
			CK(cudaStreamSynchronize(s));
		} else {
			__atomic_store_n(&h->mode_ack, mode, __ATOMIC_RELEASE);
			usleep(1000);
		}
	}
}

/* Asks the daemon for a mode and waits until it serves it. */
static void set_mode(struct shared *h, pid_t pid, int mode)
{
	__atomic_store_n(&h->mode, mode, __ATOMIC_RELEASE);
	while (__atomic_load_n(&h->mode_ack, __ATOMIC_ACQUIRE) != mode) {
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			fprintf(stderr, "launch_path: the daemon process failed\n");
			exit(1);
		}
		usleep(100);
	}
	usleep(10000); /* its kernel running */
}

/* Microseconds per iteration of `iters` calls on s, each after a compute
 * kernel of `us` (0: none) and, with `call`, a stream-ordered round trip;
 * the second of two passes (the first warms up). */
static double loop_us(cudaStream_t s, uint64_t *seq, CUdeviceptr arm, CUdeviceptr cw, int iters, uint32_t us,
                      int grid, bool call)
{
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	float ms = 0;
	for (int pass = 0; pass < 2; pass++) {
		CK(cudaEventRecord(e0, s));
		for (int k = 0; k < iters; k++) {
			if (us)
				compute_kernel<<<grid, 256, 0, s>>>(us);
			if (call) {
				++*seq;
				CD(write_value64((CUstream)s, arm, *seq, 0));
				CD(wait_value64((CUstream)s, cw, *seq, CU_STREAM_WAIT_VALUE_GEQ));
			}
		}
		CK(cudaEventRecord(e1, s));
		CK(cudaStreamSynchronize(s));
		CK(cudaGetLastError());
		CK(cudaEventElapsedTime(&ms, e0, e1));
	}
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	return (double)ms * 1000.0 / iters;
}

int main(int argc, char **argv)
{
	int iters = 2000;
	unsigned compute = 0;
	for (int i = 1; i < argc; i++) {
		char *end = NULL;
		if (!strcmp(argv[i], "--iters") && i + 1 < argc && (iters = atoi(argv[i + 1])) > 0) {
			i++;
		} else if (!strcmp(argv[i], "--compute") && i + 1 < argc &&
		           (compute = (unsigned)strtoul(argv[i + 1], &end, 10), end && !*end && compute <= 100000)) {
			i++;
		} else {
			fprintf(stderr, "usage: launch_path [--iters N] [--compute US]\n");
			return 2;
		}
	}
	pid_t pid;
	struct shared *h = (struct shared *)perf_start_daemon(
	    sizeof(struct shared), offsetof(struct shared, ready),
	    [](void *mem) { return daemon_main((struct shared *)mem); }, &pid);
	uint64_t *arm_p, *cw_p;
	CK(cudaHostGetDevicePointer((void **)&arm_p, &h->arm, 0));
	CK(cudaHostGetDevicePointer((void **)&cw_p, &h->cw, 0));
	CUdeviceptr arm = (CUdeviceptr)(uintptr_t)arm_p, cw = (CUdeviceptr)(uintptr_t)cw_p;
	int sms = 0;
	CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	/* Two full waves of 256-thread blocks at 8 an SM, as overlap.sh's. */
	const int grid = sms * 16;
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	compute_kernel<<<1, 1, 0, s>>>(1);
	CK(cudaStreamSynchronize(s));
	/* The arm word starts past what the daemon saw at its start. */
	uint64_t seq = __atomic_load_n(&h->arm, __ATOMIC_ACQUIRE);
	printf("launch_path: GPU 0, %d calls per figure, us per stream-ordered round trip", iters);
	if (compute)
		printf("; and per step of a %u us compute kernel (%d blocks) and a call", compute, grid);
	printf("\n%-12s %14s", "server", "back to back");
	if (compute)
		printf(" %14s %14s %14s", "compute alone", "compute+call", "call added");
	printf("\n");
	/* Gated last: leaving it lets its queued waits through by moving the
	 * arm word past them. */
	const int modes[3] = {MODE_PERSISTENT, MODE_LAUNCH, MODE_GATED};
	const char *names[3] = {"persistent", "launch", "gated"};
	for (int m = 0; m < 3; m++) {
		set_mode(h, pid, modes[m]);
		uint64_t before = h->launches;
		double rt = loop_us(s, &seq, arm, cw, iters, 0, grid, true);
		printf("%-12s %14.2f", names[m], rt);
		if (compute) {
			int n = iters / 10 > 20 ? iters / 10 : 20;
			double alone = loop_us(s, &seq, arm, cw, n, compute, grid, false);
			double with = loop_us(s, &seq, arm, cw, n, compute, grid, true);
			printf(" %14.2f %14.2f %14.2f", alone, with, with - alone);
		}
		printf("\n");
		if (modes[m] != MODE_PERSISTENT && h->launches - before < (uint64_t)iters) {
			fprintf(stderr, "launch_path: the daemon launched %llu kernels for at least %d calls\n",
			        (unsigned long long)(h->launches - before), iters);
			h->failed = 1;
		}
	}
	set_mode(h, pid, MODE_NONE);
	__atomic_store_n(&h->mode, MODE_QUIT, __ATOMIC_RELEASE);
	int st = 0;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 && !h->failed ? 0 : 1;
}
