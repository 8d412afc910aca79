/*
 * The CUDA runtime side of device discovery (see gpu/devices.h). Runs only
 * in the probe process and in workers, never in the supervisor.
 */
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

extern "C" int devices_mps_active(void);

extern "C" int cuda_probe_print(FILE *f)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		fprintf(f, "gpus 0 mps 0\n# no usable GPU: %s\n", cudaGetErrorString(e));
		return 0;
	}
	fprintf(f, "gpus %d mps %d\n", n, devices_mps_active());
	for (int i = 0; i < n; i++) {
		cudaDeviceProp p;
		char pci[32] = "unknown";
		if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
			fprintf(f, "gpu %d unknown (properties unavailable)\n", i);
			continue;
		}
		cudaDeviceGetPCIBusId(pci, sizeof(pci), i);
		fprintf(f, "gpu %d %s %s (sm_%d%d, %zu MiB)\n", i, pci, p.name, p.major, p.minor,
		        p.totalGlobalMem >> 20);
	}
	return 0;
}

extern "C" int cuda_open_device(int index, char *name, size_t namelen, char *pci, size_t pcilen, char *err,
                                size_t errlen)
{
	cudaError_t e = cudaSetDevice(index);
	if (e == cudaSuccess)
		e = cudaFree(0); /* creates the primary context now, not on first use */
	if (e != cudaSuccess) {
		snprintf(err, errlen, "cannot open GPU %d: %s", index, cudaGetErrorString(e));
		return -ENODEV;
	}
	cudaDeviceProp p;
	if (cudaGetDeviceProperties(&p, index) == cudaSuccess)
		snprintf(name, namelen, "%s (sm_%d%d, %zu MiB)", p.name, p.major, p.minor, p.totalGlobalMem >> 20);
	if (cudaDeviceGetPCIBusId(pci, (int)pcilen, index) != cudaSuccess)
		snprintf(pci, pcilen, "unknown");
	return 0;
}
