/*
 * What the standalone CUDA measurements of tests/perf (stream_wait.cu,
 * launch_path.cu) share: the memory operations of their kernels, the
 * checks of CUDA calls, and the stream memory operations taken from the
 * driver at run time (no link against libcuda: a program must start, and
 * skip, where there is none). Define PERF_PROG, the program's name for its
 * messages, before including it.
 */
#ifndef DFCCL_PERF_CUDA_H
#define DFCCL_PERF_CUDA_H

#include <cuda.h>
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static __device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t *p)
{
	uint64_t v;
	asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
	return v;
}

static __device__ __forceinline__ void st_release_sys(uint64_t *p, uint64_t v)
{
	asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

static __device__ __forceinline__ uint64_t globaltimer(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* A runtime call that must succeed, and a driver call. */
#define CK(call)                                                                                                     \
	do {                                                                                                           \
		cudaError_t e_ = (call);                                                                                   \
		if (e_ != cudaSuccess) {                                                                                   \
			fprintf(stderr, PERF_PROG ": %s: %s\n", #call, cudaGetErrorString(e_));                               \
			exit(1);                                                                                               \
		}                                                                                                          \
	} while (0)
#define CD(call)                                                                                                     \
	do {                                                                                                           \
		CUresult e_ = (call);                                                                                      \
		if (e_ != CUDA_SUCCESS) {                                                                                  \
			fprintf(stderr, PERF_PROG ": %s: error %d\n", #call, (int)e_);                                        \
			exit(1);                                                                                               \
		}                                                                                                          \
	} while (0)

typedef CUresult (*write_value_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
static write_value_fn write_value64, wait_value64;

/* cuStreamWriteValue64 and cuStreamWaitValue64 from libcuda.so.1; false
 * where it is not there. Loading it calls nothing of CUDA, so a program
 * may still fork a CUDA process after it. */
static bool load_driver(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return false;
	write_value64 = (write_value_fn)dlsym(lib, "cuStreamWriteValue64_v2");
	wait_value64 = (write_value_fn)dlsym(lib, "cuStreamWaitValue64_v2");
	return write_value64 && wait_value64;
}

/*
 * Starts the measurement's other process: exits 77 (SKIPPED) where no GPU
 * driver is, maps `bytes` of zeroed memory shared with the child, forks
 * it to run daemon(memory), waits until the int at ready_off in that
 * memory becomes nonzero (its kernels are up; exits 1 if the child dies
 * first), and registers the memory for this process's use from GPU 0
 * (mapped). No CUDA call comes before the fork: a process that initialised
 * CUDA cannot use it in a child, so the driver's device node says whether
 * there is a GPU.
 */
static void *perf_start_daemon(size_t bytes, size_t ready_off, int (*daemon)(void *), pid_t *pid)
{
	if (access("/dev/nvidiactl", F_OK) != 0 || !load_driver()) {
		printf("SKIPPED: no NVIDIA GPU driver here\n");
		exit(77);
	}
	void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror(PERF_PROG ": mmap");
		exit(1);
	}
	memset(mem, 0, bytes);
	fflush(stdout);
	*pid = fork();
	if (*pid < 0) {
		perror(PERF_PROG ": fork");
		exit(1);
	}
	if (*pid == 0)
		_exit(daemon(mem));
	const int *ready = (const int *)((const char *)mem + ready_off);
	while (!__atomic_load_n(ready, __ATOMIC_ACQUIRE)) {
		if (waitpid(*pid, NULL, WNOHANG) == *pid) {
			fprintf(stderr, PERF_PROG ": the daemon process failed\n");
			exit(1);
		}
		usleep(1000);
	}
	CK(cudaSetDevice(0));
	CK(cudaHostRegister(mem, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
	return mem;
}

#endif
