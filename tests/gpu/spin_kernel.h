/*
 * Kernels of a test client's own. The spinning kernel keeps running on the
 * GPU, as a trainer's compute does, for the fault tests: a client killed
 * while it runs is the case that, under MPS, poisons every context on that
 * GPU.
 *
 * Thread 0 of block 0 adds one to *heartbeat (host memory mapped into the
 * GPU) about every microsecond, so another process that shares the page
 * sees that the kernel really runs; every block runs until *stop becomes
 * non-zero or max_seconds have passed on the GPU's clock (a bound, so a
 * test that loses track of it cannot leave it spinning for ever).
 */
#ifndef DFCCL_TEST_SPIN_KERNEL_H
#define DFCCL_TEST_SPIN_KERNEL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Launches `blocks` blocks of 32 threads on stream; heartbeat and stop are
 * device addresses of mapped host memory. */
cudaError_t spin_kernel_launch(uint64_t *heartbeat, const uint32_t *stop, unsigned max_seconds, unsigned blocks,
                               cudaStream_t stream);

/* One thread that only waits `microseconds` on the GPU's clock: stands for
 * a compute kernel that keeps a stream busy. */
cudaError_t delay_kernel_launch(unsigned microseconds, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DFCCL_TEST_SPIN_KERNEL_H */
