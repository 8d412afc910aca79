/*
 * The CUDA runtime side of detection (see topo_detect.h): the GPUs in CUDA
 * order with their PCI bus ids, and whether each pair has P2P access.
 * Built only when the CUDA toolkit is found.
 */
#include <cerrno>
#include <cstdio>

#include <cuda_runtime.h>

extern "C" int topo_cuda_devices(unsigned max, char (*pci)[32], int *p2p, char *err, size_t errlen)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		snprintf(err, errlen, "the CUDA runtime finds no usable GPU: %s", cudaGetErrorString(e));
		return -ENODEV;
	}
	if ((unsigned)n > max)
		n = (int)max;
	for (int i = 0; i < n; i++) {
		if (cudaDeviceGetPCIBusId(pci[i], 32, i) != cudaSuccess)
			pci[i][0] = '\0';
		for (int j = 0; j < n; j++) {
			int access = i == j;
			if (i != j && cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported, i, j) != cudaSuccess)
				access = 0;
			p2p[i * n + j] = access;
		}
	}
	return n;
}
