/*
 * The compute kernel of the overlap benchmark; see compute_kernel.h.
 */
#include "compute_kernel.h"

#include <cuda_runtime.h>

static __global__ void __launch_bounds__(COMPUTE_THREADS) compute_kernel(uint4 *buf, uint32_t rounds)
{
	static_assert(COMPUTE_LANES == 4, "one uint4 per thread");
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint4 v = buf[i];
#pragma unroll 8
	for (uint32_t k = 0; k < rounds; k++) {
		v.x = v.x * COMPUTE_MUL + COMPUTE_ADD;
		v.y = v.y * COMPUTE_MUL + COMPUTE_ADD;
		v.z = v.z * COMPUTE_MUL + COMPUTE_ADD;
		v.w = v.w * COMPUTE_MUL + COMPUTE_ADD;
	}
	buf[i] = v;
}

extern "C" int compute_kernel_grid(unsigned *blocks)
{
	int dev = 0, sms = 0, per_sm = 0;
	cudaError_t e = cudaGetDevice(&dev);
	if (e == cudaSuccess)
		e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
	if (e == cudaSuccess)
		e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, compute_kernel, COMPUTE_THREADS, 0);
	if (e != cudaSuccess)
		return (int)e;
	*blocks = 2u * (unsigned)sms * (unsigned)(per_sm > 0 ? per_sm : 1);
	return 0;
}

extern "C" int compute_kernel_launch(uint32_t *buf, unsigned blocks, uint32_t rounds, struct CUstream_st *stream)
{
	compute_kernel<<<blocks, COMPUTE_THREADS, 0, stream>>>((uint4 *)buf, rounds);
	return (int)cudaGetLastError();
}

extern "C" const char *compute_kernel_error(int code)
{
	return cudaGetErrorString((cudaError_t)code);
}
