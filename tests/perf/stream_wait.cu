/*
 * stream_wait: how soon a GPU stream's wait-value notices a word that a
 * persistent kernel of another process stores late, with the word in host
 * memory or in that process's device memory (CUDA IPC): the choice behind
 * DFCCL_SQE_F_DEVICE_DONE (proto/dfccl_queue.h).
 *
 * The parent forks a "daemon" process, which runs a one-thread persistent
 * kernel on GPU 0: it polls an arm word in shared host memory and, once it
 * changes, spins for W microseconds (the collective's work) and stores the
 * completion word with a release at system scope. The parent's stream then
 * does, --iters times, cuStreamWriteValue64(arm = i) and
 * cuStreamWaitValue64(completion >= i), timed with events; and the same
 * round trip from the CPU (a store, then polling), for reference. Each line
 * gives the microseconds per round trip beyond W: the CPU's, the stream's
 * with the completion word in host memory, and in the daemon's device
 * memory.
 *
 * Usage: stream_wait [--iters N] [--work LIST]   (LIST: microseconds, default 0,5,10,20,30)
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

#define PERF_PROG "stream_wait"
#include "perf_cuda.h"

#define MAX_WORKS 16

/* Host memory shared across the fork: the arm word, the host completion
 * word, and the daemon's control. */
struct shared {
	uint64_t arm;
	uint64_t pad0[7];
	uint64_t cw;
	uint64_t pad1[7];
	cudaIpcMemHandle_t dev; /* the daemon's device words: [0] the completion word, [8] quit */
	volatile uint32_t work_ns, cw_on_device;
	volatile int ready, quit, failed;
};

/* The daemon's kernel: the settings are read again every 64 idle polls (a
 * read of host memory costs a PCIe round trip). */
__global__ void daemon_kernel(struct shared *h, uint64_t *dev)
{
	uint64_t last = 0;
	uint32_t work = 0, on_device = 0;
	for (uint32_t it = 0; !*(volatile uint64_t *)&dev[8]; it++) {
		if (it % 64 == 0) {
			work = *(volatile uint32_t *)&h->work_ns;
			on_device = *(volatile uint32_t *)&h->cw_on_device;
		}
		uint64_t a = ld_acquire_sys(&h->arm);
		if (a <= last)
			continue;
		last = a;
		uint64_t t0 = globaltimer();
		while (globaltimer() - t0 < work)
			;
		st_release_sys(on_device ? &dev[0] : &h->cw, a);
	}
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int daemon_main(struct shared *h)
{
	CK(cudaSetDevice(0));
	CK(cudaHostRegister(h, sizeof(*h), cudaHostRegisterMapped | cudaHostRegisterPortable));
	struct shared *dh;
	CK(cudaHostGetDevicePointer((void **)&dh, h, 0));
	uint64_t *dev;
	CK(cudaMalloc((void **)&dev, 4096));
	CK(cudaMemset(dev, 0, 4096));
	CK(cudaIpcGetMemHandle(&h->dev, dev));
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	daemon_kernel<<<1, 1, 0, s>>>(dh, dev);
	CK(cudaGetLastError());
	__atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&h->quit, __ATOMIC_ACQUIRE))
		usleep(1000);
	uint64_t one = 1;
	CK(cudaMemcpy(dev + 8, &one, sizeof(one), cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
	return 0;
}

static bool parse_works(const char *s, unsigned *works, int *n)
{
	*n = 0;
	while (*s && *n < MAX_WORKS) {
		char *end;
		unsigned long v = strtoul(s, &end, 10);
		if (end == s || v > 1000000)
			return false;
		works[(*n)++] = (unsigned)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return false;
	}
	return *n > 0 && !*s;
}

int main(int argc, char **argv)
{
	int iters = 1000, nworks = 5;
	unsigned works[MAX_WORKS] = {0, 5, 10, 20, 30};
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc && (iters = atoi(argv[i + 1])) > 0) {
			i++;
		} else if (!strcmp(argv[i], "--work") && i + 1 < argc && parse_works(argv[i + 1], works, &nworks)) {
			i++;
		} else {
			fprintf(stderr, "usage: stream_wait [--iters N] [--work US,US,...]\n");
			return 2;
		}
	}
	pid_t pid;
	struct shared *h = (struct shared *)perf_start_daemon(
	    sizeof(struct shared), offsetof(struct shared, ready),
	    [](void *mem) { return daemon_main((struct shared *)mem); }, &pid);
	uint64_t *dev;
	CK(cudaIpcOpenMemHandle((void **)&dev, h->dev, cudaIpcMemLazyEnablePeerAccess));
	uint64_t *arm_p, *hcw_p;
	CK(cudaHostGetDevicePointer((void **)&arm_p, &h->arm, 0));
	CK(cudaHostGetDevicePointer((void **)&hcw_p, &h->cw, 0));
	CUdeviceptr arm = (CUdeviceptr)(uintptr_t)arm_p, hcw = (CUdeviceptr)(uintptr_t)hcw_p;
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	uint64_t seq = 0;
	printf("stream_wait: GPU 0, %d round trips each, us per round trip beyond the kernel's work W\n", iters);
	printf("%8s %10s %14s %16s\n", "W (us)", "CPU", "stream, host", "stream, device");
	for (int wi = 0; wi < nworks; wi++) {
		double r[3];
		for (int m = 0; m < 3; m++) {
			CK(cudaStreamSynchronize(s));
			h->work_ns = works[wi] * 1000u;
			h->cw_on_device = m == 2;
			usleep(10000); /* the kernel reads its settings again */
			if (m == 0) {
				/* From the CPU: the same words through the cache. */
				double t0 = 0;
				for (int k = -50; k < iters; k++) {
					if (k == 0)
						t0 = now_us();
					seq++;
					__atomic_store_n(&h->arm, seq, __ATOMIC_SEQ_CST);
					while (__atomic_load_n(&h->cw, __ATOMIC_ACQUIRE) < seq)
						;
				}
				r[m] = (now_us() - t0) / iters;
				continue;
			}
			CUdeviceptr cw = m == 2 ? (CUdeviceptr)(uintptr_t)dev : hcw;
			float ms = 0;
			for (int pass = 0; pass < 2; pass++) { /* the first warms up */
				CK(cudaEventRecord(e0, s));
				for (int k = 0; k < iters; k++) {
					seq++;
					CD(write_value64((CUstream)s, arm, seq, 0));
					CD(wait_value64((CUstream)s, cw, seq, CU_STREAM_WAIT_VALUE_GEQ));
				}
				CK(cudaEventRecord(e1, s));
				CK(cudaStreamSynchronize(s));
				CK(cudaEventElapsedTime(&ms, e0, e1));
			}
			r[m] = (double)ms * 1000.0 / iters;
		}
		printf("%8u %10.2f %14.2f %16.2f\n", works[wi], r[0] - works[wi], r[1] - works[wi], r[2] - works[wi]);
	}
	__atomic_store_n(&h->quit, 1, __ATOMIC_RELEASE);
	int st = 0;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
