/*
 * The compute kernel of the overlap benchmark (compute.h drives it): a
 * stand-in for a trainer's kernel that fills the GPU with blocks doing
 * integer arithmetic over a buffer of its own, so that its result can be
 * computed exactly on the host and checked.
 *
 * Every thread owns one group of COMPUTE_LANES 32-bit words of the buffer
 * and applies x -> COMPUTE_MUL * x + COMPUTE_ADD (mod 2^32) `rounds` times
 * to each word: COMPUTE_LANES independent chains per thread, so the
 * multiply-add units stay busy rather than waiting on one dependent chain.
 * The grid is twice the blocks of COMPUTE_THREADS threads that the GPU
 * holds resident at once: two waves, as a large trainer kernel has more
 * blocks than the GPU runs at once, so blocks that another kernel keeps off
 * the SMs delay it.
 */
#ifndef DFCCL_COMPUTE_KERNEL_H
#define DFCCL_COMPUTE_KERNEL_H

#include <stdint.h>

#define COMPUTE_LANES 4
#define COMPUTE_THREADS 256
#define COMPUTE_MUL 1664525u
#define COMPUTE_ADD 1013904223u

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

/* The grid for the calling thread's current device (see above), in
 * *blocks; 0, or a CUDA runtime error code. */
int compute_kernel_grid(unsigned *blocks);

/* Launches the kernel over buf (blocks * COMPUTE_THREADS groups of
 * COMPUTE_LANES words) on stream; 0, or a CUDA runtime error code. */
int compute_kernel_launch(uint32_t *buf, unsigned blocks, uint32_t rounds, struct CUstream_st *stream);

/* The CUDA runtime's text for an error code of the two above. */
const char *compute_kernel_error(int code);

#ifdef __cplusplus
}
#endif

#endif /* DFCCL_COMPUTE_KERNEL_H */
