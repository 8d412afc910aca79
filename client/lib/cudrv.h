/*
 * The few CUDA driver calls libdfccl makes: what a pointer is, the legacy
 * IPC handle of a GPU allocation, and VMM allocations (cuMemCreate) shared
 * as POSIX file descriptors: exported by a client, imported and mapped by
 * a client (dfcclMemAlloc on the CUDA engine) or by the CUDA engine's
 * worker, which uses this module too, so that the sequence of driver calls
 * that maps another process's allocation is written (and tested) once.
 *
 * Model. libdfccl never links against CUDA: it opens libcuda.so.1 with
 * dlopen the first time it asks the driver anything (once per process, from
 * any thread), and a machine without the driver, or a process that never
 * initialised it, simply has no device memory: every query then answers
 * "not device memory". The library never calls cuInit on its own, because
 * a process that holds a device pointer has initialised the driver already,
 * and initialising it in one that does not would be a side effect (a
 * process that forks after cuInit cannot use CUDA in the child); only a
 * caller that asks for device memory (cudrv_init, for dfcclMemAlloc) does,
 * and one that is about to put a communicator on a daemon that serves GPUs
 * (cudrv_device_count), since the CUDA ordinal it was given means nothing
 * until the driver has counted the GPUs this process sees.
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
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUmemAllocationHandleType;
typedef int CUmemAllocationGranularity_flags;
typedef struct CUmemLocation_st {
	int type;
	int id;
} CUmemLocation;
typedef struct CUmemAccessDesc_st {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;
/* The leading fields of cuda.h's CUmemAllocationProp, padded to its size:
 * the fields past `location` stay zero here. */
typedef struct CUmemAllocationProp_st {
	int type;
	CUmemAllocationHandleType requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	unsigned char allocFlags[8];
} CUmemAllocationProp;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

enum {
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
	CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
	CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,
	CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
	CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19,
	CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID = 20,
};

enum { CU_MEMORYTYPE_DEVICE = 2 };
enum { CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 };
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };
enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0 };
typedef struct CUstream_st *CUstream;
enum { CU_MEMHOSTREGISTER_PORTABLE = 0x01, CU_MEMHOSTREGISTER_DEVICEMAP = 0x02 };
enum { CU_STREAM_MEM_OP_WAIT_VALUE_64 = 4, CU_STREAM_MEM_OP_WRITE_VALUE_64 = 5 };
enum { CU_STREAM_WAIT_VALUE_GEQ = 0 };
typedef int CUstreamCaptureStatus;
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0 };
enum { CU_STREAM_NON_BLOCKING = 0x1 };
/* cuda.h's CUstreamBatchMemOpParams for the 64-bit wait and write
 * operations, the only ones used: one 48-byte union member. */
typedef union CUstreamBatchMemOpParams_union {
	struct {
		int operation;
		CUdeviceptr address;
		unsigned long long value64;
		unsigned int flags;
		CUdeviceptr alias;
	} waitValue;
	unsigned long long pad[6];
} CUstreamBatchMemOpParams;
/* cuda.h's CUDA_MEMCPY2D (cuMemcpy2DAsync_v2's); the array fields stay
 * NULL here. */
typedef int CUmemorytype;
typedef struct CUDA_MEMCPY2D_st {
	size_t srcXInBytes;
	size_t srcY;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes;
	size_t dstY;
	CUmemorytype dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes;
	size_t Height;
} CUDA_MEMCPY2D;
#endif /* CUDA_VERSION */

/* Bytes of a legacy CUDA IPC handle (CU_IPC_HANDLE_SIZE). */
#define CUDRV_IPC_HANDLE_BYTES 64

/* How the memory a device pointer lies in was allocated. */
enum cudrv_mem_kind {
	CUDRV_MEM_LEGACY = 1,  /* cudaMalloc / cuMemAlloc: legacy CUDA IPC shares it */
	CUDRV_MEM_VMM = 2,     /* any other device memory: a VMM mapping (cuMemCreate + cuMemMap), as far as the
	                        * pointer attributes tell; cudrv_vmm_export finds out for sure */
	CUDRV_MEM_POOL = 3,    /* a memory pool's (cudaMallocAsync) */
	CUDRV_MEM_MANAGED = 4, /* managed memory (cudaMallocManaged) */
};

/* The GPU allocation a pointer lies in. */
struct cudrv_ptr_info {
	int device;         /* CUDA ordinal of the device it lives on, in this process */
	enum cudrv_mem_kind kind;
	uintptr_t base;     /* its first byte: the allocation's (legacy), or the mapping's (VMM) */
	size_t size;        /* its size in bytes, likewise */
	uint64_t buffer_id; /* the driver's id for it, never reused within the process */
	uint64_t block_id;  /* the driver's id for the physical allocation, never reused within the process */
	bool fd_exportable; /* VMM: created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its handle types */
};

/*
 * Describes the allocation that p points into, with one driver call: 1 and
 * *out for device memory; 0 for anything else (host memory, no driver, a
 * driver nobody initialised); a negative errno when the driver fails. The
 * attributes it asks for exist since CUDA 11.7's driver (R515).
 */
int cudrv_pointer_info(const void *p, struct cudrv_ptr_info *out);

/*
 * The driver's ids of the allocation p points into (cudrv_ptr_info's
 * buffer_id and block_id), asked alone: a cached translation of p is still
 * right while both are those it was made with, and two attributes cost the
 * driver less than cudrv_pointer_info's twelve. false when the driver
 * cannot answer (no driver, or p is no pointer it knows of).
 */
bool cudrv_pointer_ids(const void *p, uint64_t *buffer_id, uint64_t *block_id);

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

/* Initialises the driver (cuInit) for a caller that is about to use device
 * memory. Returns 0, or -ENODEV when there is no driver or no device. */
int cudrv_init(void);

/*
 * Exports VMM allocation a (kind CUDRV_MEM_VMM) as a POSIX file descriptor:
 * *fd, the caller's to close. -ENOTSUP when the memory is no VMM
 * allocation, or one not created exportable that way (cudrv_last_error
 * says which); another negative errno when the driver fails.
 */
int cudrv_vmm_export(const struct cudrv_ptr_info *a, int *fd);

/* A VMM allocation of another process, mapped into this one. */
struct cudrv_vmm {
	unsigned long long handle; /* the imported CUmemGenericAllocationHandle; 0: nothing mapped */
	uintptr_t base;            /* the reserved and mapped range */
	size_t size;
};

/*
 * Imports the allocation that fd (borrowed, not closed) stands for and maps
 * its first `bytes` bytes, rounded up to the allocation's granularity, with
 * read-write access for device `device`; the driver refuses a mapping past
 * the allocation's end (-ERANGE). Returns 0 or a negative errno.
 */
int cudrv_vmm_import(int fd, uint64_t bytes, int device, struct cudrv_vmm *out);

/* Unmaps and releases what cudrv_vmm_import made (a no-op on a zeroed one). */
void cudrv_vmm_unmap(struct cudrv_vmm *m);

/*
 * Creates an allocation of at least `size` bytes on `device`, exportable as
 * a POSIX file descriptor, and exports it: *fd (the caller's to close),
 * *handle (this process's reference: cudrv_vmm_release) and *alloc_size
 * (size rounded up to the allocation granularity). Returns 0 or a negative
 * errno.
 */
int cudrv_vmm_create(int device, uint64_t size, int *fd, unsigned long long *handle, uint64_t *alloc_size);

/* Drops a reference of cudrv_vmm_create (0: none). */
void cudrv_vmm_release(unsigned long long handle);

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
	CUresult (*init)(unsigned flags);
	CUresult (*mem_retain_allocation_handle)(CUmemGenericAllocationHandle *h, void *addr);
	CUresult (*mem_export_to_shareable_handle)(void *shareable, CUmemGenericAllocationHandle h,
	                                           CUmemAllocationHandleType type, unsigned long long flags);
	CUresult (*mem_import_from_shareable_handle)(CUmemGenericAllocationHandle *h, void *os_handle,
	                                             CUmemAllocationHandleType type);
	CUresult (*mem_get_allocation_properties_from_handle)(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h);
	CUresult (*mem_get_allocation_granularity)(size_t *granularity, const CUmemAllocationProp *prop,
	                                           CUmemAllocationGranularity_flags option);
	CUresult (*mem_create)(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
	                       unsigned long long flags);
	CUresult (*mem_release)(CUmemGenericAllocationHandle h);
	CUresult (*mem_address_reserve)(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
	                                unsigned long long flags);
	CUresult (*mem_address_free)(CUdeviceptr ptr, size_t size);
	CUresult (*mem_map)(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
	                    unsigned long long flags);
	CUresult (*mem_unmap)(CUdeviceptr ptr, size_t size);
	CUresult (*mem_set_access)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
	/* Stream-ordered submission; optional (a driver without them has no
	 * stream-ordered calls, everything else works). */
	CUresult (*mem_host_register)(void *p, size_t bytes, unsigned flags);
	CUresult (*mem_host_unregister)(void *p);
	CUresult (*mem_host_get_device_pointer)(CUdeviceptr *dev, void *p, unsigned flags);
	CUresult (*stream_batch_mem_op)(CUstream stream, unsigned count, CUstreamBatchMemOpParams *ops, unsigned flags);
	CUresult (*memcpy_async)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
	CUresult (*memcpy_2d_async)(const CUDA_MEMCPY2D *copy, CUstream stream); /* optional among these too */
	CUresult (*stream_is_capturing)(CUstream stream, CUstreamCaptureStatus *status);
	CUresult (*stream_create)(CUstream *stream, unsigned flags);
	CUresult (*stream_synchronize)(CUstream stream);
	CUresult (*stream_destroy)(CUstream stream);
	/* Which GPU an ordinal is; optional (without them every ordinal is
	 * taken for a daemon's device index, as on a machine without GPUs). */
	CUresult (*device_get_count)(int *count);
	CUresult (*device_get_pci_bus_id)(char *bus_id, int len, CUdevice dev);
};

/*
 * Copies bytes between any two buffers the driver can address (device or
 * host, unified addressing), synchronously; device names the GPU whose
 * primary context serves a thread that has none. Returns 0 or a negative
 * errno (cudrv_last_error says why).
 */
int cudrv_copy(void *dst, const void *src, size_t bytes, int device);

/*
 * As cudrv_copy, on a non-blocking stream of its own, waited for: where
 * cudrv_copy goes through the legacy default stream, which waits for every
 * blocking stream's work first, this waits for none (a stream stuck on the
 * very words being written would block it forever). Needs the
 * stream-ordered entry points (cudrv_streams_usable).
 */
int cudrv_copy_apart(void *dst, const void *src, size_t bytes, int device);

/*
 * Stream-ordered submission (client/lib/qp.c): a GPU stream writes a 64-bit
 * word of host memory after the work queued before it, and waits until
 * another such word reaches a value, so that the work queued after it runs
 * only then. The memory is the queue-pair region, which every process maps
 * from one memfd.
 */

/* Whether this process can make stream-ordered calls: a driver with the
 * calls above. Never initialises the driver. */
bool cudrv_streams_usable(void);

/*
 * Registers [p, p + bytes) (page-aligned host memory) with the driver for
 * every context (portable, device-mapped) and gives the address by which a
 * stream of device `device` names it. Returns 0 or a negative errno.
 */
int cudrv_host_register(void *p, size_t bytes, int device, uintptr_t *dev);

/* Undoes cudrv_host_register. */
void cudrv_host_unregister(void *p, int device);

/* One operation on a stream: a write of `value`, or a wait until the word
 * is at least `value` (as 64-bit numbers that wrap: (int64_t)(word - value)
 * >= 0). */
struct cudrv_stream_op {
	bool wait;
	uintptr_t address; /* from cudrv_host_register */
	uint64_t value;
};

/* The most operations one cudrv_stream_ops takes: the driver takes fewer
 * than 256 in a call (a batch of 256 failed with CUDA_ERROR_INVALID_VALUE
 * on the H100). */
#define CUDRV_STREAM_OPS_MAX 255u

/*
 * Queues ops[0..n), n <= CUDRV_STREAM_OPS_MAX, on `stream` (a CUstream /
 * cudaStream_t of device `device`), in order, with one driver call.
 * Returns 0 or a negative errno; after a failure none was queued.
 */
int cudrv_stream_ops(void *stream, const struct cudrv_stream_op *ops, unsigned n, int device);

/*
 * Queues on `stream` (of device `device`) one copy of `rows` 8-byte words,
 * the i-th from src + i * pitch to dst + i * pitch (addresses from
 * cudrv_host_register): many words of host memory written in the stream's
 * order by one operation, where a stream memory operation writes one (the
 * GPU took 0.76 us for each such write to host memory on an H200, 3.5-5 us
 * for a copy of 150 words; tests/perf/RESULTS.md). Each word is written
 * whole, in no particular order. Returns 0, -ENOTSUP where the driver lacks
 * cuMemcpy2DAsync (cudrv_stream_ops can write the words instead), or
 * another negative errno; after a failure nothing was queued.
 */
int cudrv_stream_copy_words(void *stream, uintptr_t dst, uintptr_t src, size_t pitch, unsigned rows, int device);

/* Whether `stream` (of device `device`) is being captured into a CUDA
 * graph: 1 yes, 0 no (or a driver that cannot say), a negative errno when
 * the driver fails. */
int cudrv_stream_capturing(void *stream, int device);

/* As cudrv_copy, queued on `stream` (a CUstream of device `device`)
 * instead: the copy happens in the stream's order. */
int cudrv_copy_async(void *dst, const void *src, size_t bytes, void *stream, int device);

/*
 * Which GPU a CUDA ordinal is (client/lib/client.c maps the numbers an
 * application gives to the daemon's devices by PCI bus id).
 */

/*
 * The number of GPUs this process sees (CUDA_VISIBLE_DEVICES applies). It
 * initialises the driver (cuInit), as asking for device memory does: call
 * it only where the GPUs are about to be used. 0 when there is no driver,
 * no GPU, or a driver without the calls (cudrv_last_error says which).
 */
int cudrv_device_count(void);

/* The PCI bus id of CUDA ordinal `ordinal`, as the driver writes it
 * ("0000:1B:00.0"), into buf (len bytes). 0 or a negative errno. */
int cudrv_device_pci_bus_id(int ordinal, char *buf, size_t len);

/* Makes every later call use ops (borrowed; NULL: the real driver again).
 * For unit tests, before any thread queries the driver. */
void cudrv_set_ops_for_test(const struct cudrv_ops *ops);

#endif /* DFCCL_CLIENT_CUDRV_H */
