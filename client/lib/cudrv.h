/*
 * The few CUDA driver calls libdfccl makes: what a pointer is, and the
 * legacy IPC handle of a GPU allocation.
 *
 * Model. libdfccl never links against CUDA: it opens libcuda.so.1 with
 * dlopen the first time it asks the driver anything (once per process, from
 * any thread), and a machine without the driver, or a process that never
 * initialised it, simply has no device memory: every query then answers
 * "not device memory". The library never calls cuInit itself, because a
 * process that holds a device pointer has initialised the driver already,
 * and initialising it in one that does not would be a side effect (a
 * process that forks after cuInit cannot use CUDA in the child).
 *
 * The driver's types and constants below are declared here, with the values
 * of CUDA 13's cuda.h (the driver keeps them stable across releases), so
 * that the library builds without a CUDA toolkit. Include cuda.h, where
 * needed at all, before this header: the declarations then come from it.
 *
 * The calls go through a table of function pointers that unit tests replace
 * with a fake driver (cudrv_set_ops_for_test), so the logic built on them
 * is tested on machines without a GPU.
 *
 * Functions return 0 or a positive documented answer, or a negative errno
 * with the driver's side of the story in cudrv_last_error(); the sentence
 * for the user is the caller's to write.
 */
#ifndef DFCCL_CLIENT_CUDRV_H
#define DFCCL_CLIENT_CUDRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef CUDA_VERSION /* cuda.h was not included: declare what we use */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef int CUpointer_attribute;
typedef struct CUipcMemHandle_st {
	char reserved[64];
} CUipcMemHandle;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_INVALID_CONTEXT = 201,
};

enum {
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
};

enum { CU_MEMORYTYPE_DEVICE = 2 };
#endif /* CUDA_VERSION */

/* Bytes of a legacy CUDA IPC handle (CU_IPC_HANDLE_SIZE). */
#define CUDRV_IPC_HANDLE_BYTES 64

/* The GPU allocation a pointer lies in. */
struct cudrv_ptr_info {
	int device;         /* CUDA ordinal of the device it lives on, in this process */
	uintptr_t base;     /* its first byte */
	size_t size;        /* its size in bytes */
	uint64_t buffer_id; /* the driver's id for it, never reused within the process */
	bool ipc_capable;   /* legacy CUDA IPC can share it (cudaMalloc memory; not VMM, pools or managed memory) */
};

/*
 * Describes the allocation that p points into, with one driver call: 1 and
 * *out for device memory; 0 for anything else (host memory, no driver, a
 * driver nobody initialised); a negative errno when the driver fails.
 */
int cudrv_pointer_info(const void *p, struct cudrv_ptr_info *out);

/*
 * The legacy IPC handle of allocation a (from cudrv_pointer_info), which
 * another process opens with cudaIpcOpenMemHandle. A calling thread with no
 * usable context borrows the device's primary context for the call and is
 * left as it was. Returns 0 or a negative errno.
 */
int cudrv_ipc_handle(const struct cudrv_ptr_info *a, uint8_t out[CUDRV_IPC_HANDLE_BYTES]);

/* What the driver said when this thread's last cudrv call failed: the call
 * and the driver's error name ("" if none failed). */
const char *cudrv_last_error(void);

/* The driver entry points used, by their names in libcuda.so.1. */
struct cudrv_ops {
	CUresult (*pointer_get_attributes)(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p);
	CUresult (*ipc_get_mem_handle)(CUipcMemHandle *h, CUdeviceptr base);
	CUresult (*device_get)(CUdevice *dev, int ordinal);
	CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice dev);
	CUresult (*primary_ctx_release)(CUdevice dev);
	CUresult (*ctx_get_current)(CUcontext *ctx);
	CUresult (*ctx_set_current)(CUcontext ctx);
	CUresult (*get_error_name)(CUresult r, const char **name); /* optional */
	CUresult (*memcpy)(CUdeviceptr dst, CUdeviceptr src, size_t bytes); /* optional */
};

/*
 * Copies bytes between any two buffers the driver can address (device or
 * host, unified addressing), synchronously; device names the GPU whose
 * primary context serves a thread that has none. Returns 0 or a negative
 * errno (cudrv_last_error says why).
 */
int cudrv_copy(void *dst, const void *src, size_t bytes, int device);

/* Makes every later call use ops (borrowed; NULL: the real driver again).
 * For unit tests, before any thread queries the driver. */
void cudrv_set_ops_for_test(const struct cudrv_ops *ops);

#endif /* DFCCL_CLIENT_CUDRV_H */
