/*
 * The spinning kernel of the fault tests; see spin_kernel.h.
 */
#include "spin_kernel.h"

static __device__ uint64_t spin_clock_ns(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

static __global__ void spin_kernel(volatile uint64_t *heartbeat, volatile const uint32_t *stop, uint64_t max_ns)
{
	bool beats = blockIdx.x == 0 && threadIdx.x == 0;
	uint64_t start = spin_clock_ns();
	while (!*stop && spin_clock_ns() - start < max_ns) {
		if (beats) {
			*heartbeat = *heartbeat + 1;
			__threadfence_system();
		}
		__nanosleep(1000);
	}
}

extern "C" cudaError_t spin_kernel_launch(uint64_t *heartbeat, const uint32_t *stop, unsigned max_seconds,
                                          unsigned blocks, cudaStream_t stream)
{
	spin_kernel<<<blocks, 32, 0, stream>>>(heartbeat, stop, (uint64_t)max_seconds * 1000000000ull);
	return cudaGetLastError();
}

static __global__ void delay_kernel(uint64_t ns)
{
	uint64_t start = spin_clock_ns();
	while (spin_clock_ns() - start < ns)
		__nanosleep(1000);
}

extern "C" cudaError_t delay_kernel_launch(unsigned microseconds, cudaStream_t stream)
{
	delay_kernel<<<1, 1, 0, stream>>>((uint64_t)microseconds * 1000ull);
	return cudaGetLastError();
}
