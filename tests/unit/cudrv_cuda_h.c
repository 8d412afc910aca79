/*
 * cudrv.h declares the CUDA driver's types and constants itself, so that
 * libdfccl builds without a toolkit. This file, built only where cuda.h is
 * found, holds them against cuda.h: the function types of the table at
 * compile time, and the constants and symbol names through the arrays that
 * test_cudrv_mem compares with cudrv.h's own (cudrv_cuda_h.h).
 */
#include <cuda.h>

#include "cudrv.h"
#include "cudrv_cuda_h.h"

#define SAME_TYPE(fn, member)                                                                                  \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&fn), __typeof__(((struct cudrv_ops *)0)->member)), \
	               #fn " has the type of cudrv_ops." #member)

SAME_TYPE(cuPointerGetAttributes, pointer_get_attributes);
SAME_TYPE(cuIpcGetMemHandle, ipc_get_mem_handle);
SAME_TYPE(cuDeviceGet, device_get);
SAME_TYPE(cuDevicePrimaryCtxRetain, primary_ctx_retain);
SAME_TYPE(cuDevicePrimaryCtxRelease, primary_ctx_release);
SAME_TYPE(cuCtxGetCurrent, ctx_get_current);
SAME_TYPE(cuCtxSetCurrent, ctx_set_current);
SAME_TYPE(cuGetErrorName, get_error_name);
SAME_TYPE(cuInit, init);
SAME_TYPE(cuMemRetainAllocationHandle, mem_retain_allocation_handle);
SAME_TYPE(cuMemExportToShareableHandle, mem_export_to_shareable_handle);
SAME_TYPE(cuMemImportFromShareableHandle, mem_import_from_shareable_handle);
SAME_TYPE(cuMemGetAllocationPropertiesFromHandle, mem_get_allocation_properties_from_handle);
SAME_TYPE(cuMemGetAllocationGranularity, mem_get_allocation_granularity);
SAME_TYPE(cuMemCreate, mem_create);
SAME_TYPE(cuMemRelease, mem_release);
SAME_TYPE(cuMemAddressReserve, mem_address_reserve);
SAME_TYPE(cuMemAddressFree, mem_address_free);
SAME_TYPE(cuMemMap, mem_map);
SAME_TYPE(cuMemUnmap, mem_unmap);
SAME_TYPE(cuMemSetAccess, mem_set_access);
SAME_TYPE(cuMemHostRegister, mem_host_register);
SAME_TYPE(cuMemHostUnregister, mem_host_unregister);
SAME_TYPE(cuMemHostGetDevicePointer, mem_host_get_device_pointer);
SAME_TYPE(cuStreamBatchMemOp, stream_batch_mem_op);
SAME_TYPE(cuMemcpyAsync, memcpy_async);
SAME_TYPE(cuMemcpy2DAsync, memcpy_2d_async);
SAME_TYPE(cuStreamIsCapturing, stream_is_capturing);
SAME_TYPE(cuDeviceGetCount, device_get_count);
SAME_TYPE(cuDeviceGetPCIBusId, device_get_pci_bus_id);

_Static_assert(CU_IPC_HANDLE_SIZE == CUDRV_IPC_HANDLE_BYTES, "a legacy IPC handle has 64 bytes");

const long cuda_h_values[] = {CUDRV_CHECKED_VALUES};

/* The name each call has in libcuda.so.1 for this header's API version:
 * cuda.h maps calls whose behaviour changed to versioned symbols. */
#define NAME(fn) NAME_(fn)
#define NAME_(fn) #fn
const char *const cuda_h_symbols[] = {
    NAME(cuPointerGetAttributes),
    NAME(cuIpcGetMemHandle),
    NAME(cuDeviceGet),
    NAME(cuDevicePrimaryCtxRetain),
    NAME(cuDevicePrimaryCtxRelease),
    NAME(cuCtxGetCurrent),
    NAME(cuCtxSetCurrent),
    NAME(cuGetErrorName),
    NAME(cuInit),
    NAME(cuMemRetainAllocationHandle),
    NAME(cuMemExportToShareableHandle),
    NAME(cuMemImportFromShareableHandle),
    NAME(cuMemGetAllocationPropertiesFromHandle),
    NAME(cuMemGetAllocationGranularity),
    NAME(cuMemCreate),
    NAME(cuMemRelease),
    NAME(cuMemAddressReserve),
    NAME(cuMemAddressFree),
    NAME(cuMemMap),
    NAME(cuMemUnmap),
    NAME(cuMemSetAccess),
    NAME(cuMemHostRegister),
    NAME(cuMemHostUnregister),
    NAME(cuMemHostGetDevicePointer),
    NAME(cuStreamBatchMemOp),
    NAME(cuMemcpyAsync),
    NAME(cuMemcpy2DAsync),
    NAME(cuStreamIsCapturing),
    NAME(cuDeviceGetCount),
    NAME(cuDeviceGetPCIBusId),
};
