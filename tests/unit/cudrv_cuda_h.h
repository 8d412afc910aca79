/*
 * The driver constants and names that cudrv.h declares itself, listed once
 * for both sides of the comparison with cuda.h: cudrv_cuda_h.c expands the
 * list with cuda.h's definitions, test_cudrv_mem with cudrv.h's.
 */
#ifndef DFCCL_TEST_CUDRV_CUDA_H_H
#define DFCCL_TEST_CUDRV_CUDA_H_H

#include <stddef.h>

#define CUDRV_CHECKED_VALUES                                                                                     \
	CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_NOT_INITIALIZED,                \
	    CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_NOT_PERMITTED,      \
	    CUDA_ERROR_NOT_SUPPORTED,                                                                                \
	    CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_IS_MANAGED,         \
	    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,                    \
	    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,                                  \
	    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,                          \
	    CU_POINTER_ATTRIBUTE_MAPPING_SIZE, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,                               \
	    CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, CU_MEMORYTYPE_DEVICE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,    \
	    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,          \
	    CU_MEM_ALLOC_GRANULARITY_MINIMUM, sizeof(CUdeviceptr), sizeof(CUipcMemHandle),                           \
	    sizeof(CUmemGenericAllocationHandle), sizeof(CUmemAllocationHandleType), sizeof(CUmemLocation),         \
	    sizeof(CUmemAccessDesc), offsetof(CUmemAccessDesc, flags), sizeof(CUmemAllocationProp),                  \
	    offsetof(CUmemAllocationProp, requestedHandleTypes), offsetof(CUmemAllocationProp, location),            \
	    offsetof(CUmemAllocationProp, win32HandleMetaData), CU_MEMHOSTREGISTER_PORTABLE,                        \
	    CU_MEMHOSTREGISTER_DEVICEMAP, CU_STREAM_MEM_OP_WAIT_VALUE_64, CU_STREAM_MEM_OP_WRITE_VALUE_64,           \
	    CU_STREAM_WAIT_VALUE_GEQ, sizeof(CUstreamBatchMemOpParams),                                              \
	    offsetof(CUstreamBatchMemOpParams, waitValue.address), offsetof(CUstreamBatchMemOpParams, waitValue.value64), \
	    offsetof(CUstreamBatchMemOpParams, waitValue.flags), CU_STREAM_CAPTURE_STATUS_NONE,                     \
	    sizeof(CUDA_MEMCPY2D), offsetof(CUDA_MEMCPY2D, srcMemoryType), offsetof(CUDA_MEMCPY2D, srcDevice),     \
	    offsetof(CUDA_MEMCPY2D, srcPitch), offsetof(CUDA_MEMCPY2D, dstMemoryType),                              \
	    offsetof(CUDA_MEMCPY2D, dstDevice), offsetof(CUDA_MEMCPY2D, dstPitch),                                   \
	    offsetof(CUDA_MEMCPY2D, WidthInBytes), offsetof(CUDA_MEMCPY2D, Height)

/* CUDRV_CHECKED_VALUES as cuda.h defines them. */
extern const long cuda_h_values[];

/* The symbol cuda.h binds each driver call of cudrv_ops to, in the order of
 * the table's members. */
extern const char *const cuda_h_symbols[];

#endif
