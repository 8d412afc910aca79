/*
 * The CUDA driver, loaded on first use; see cudrv.h.
 *
 * The function table is resolved once (pthread_once) and then read without
 * a lock. A test's table, when set, wins over it; the real driver is not
 * even loaded then. Symbols are looked up by the names libcuda.so.1 exports
 * for the API version this code was written against (cuDevicePrimaryCtxRelease
 * is cuDevicePrimaryCtxRelease_v2 since CUDA 11), so a newer driver keeps
 * giving the behaviour documented here.
 *
 * Pointer queries use cuPointerGetAttributes rather than
 * cuPointerGetAttribute: it answers every attribute in one call, and for a
 * pointer the driver does not know it succeeds with zeroes instead of
 * failing, so "not device memory" needs no error path.
 *
 * A VMM allocation is shared by its allocation handle, which the driver
 * gives for any address of a mapping (cuMemRetainAllocationHandle), not by
 * the address: so a client exports exactly the allocation mapped there now.
 * The driver keeps the memory alive while any handle, exported descriptor
 * or mapping refers to it, so every reference taken here is released
 * before returning, except the importer's, which cudrv_vmm_unmap releases.
 */
#include "cudrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static const struct cudrv_ops *_Atomic drv_test_ops;
static struct cudrv_ops drv_real;
static bool drv_loaded;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static __thread char drv_err[256];

_Static_assert(sizeof(CUipcMemHandle) == CUDRV_IPC_HANDLE_BYTES, "a legacy IPC handle has 64 bytes");

/* Resolves every entry point, or none: a driver that lacks one of them is
 * treated as no driver at all. The handle is never closed, since the
 * process may hold device memory until it exits. */
static void drv_load(void)
{
	static const struct {
		const char *name;
		size_t offset;
		bool optional;
	} syms[] = {
	    {"cuPointerGetAttributes", offsetof(struct cudrv_ops, pointer_get_attributes), false},
	    {"cuIpcGetMemHandle", offsetof(struct cudrv_ops, ipc_get_mem_handle), false},
	    {"cuDeviceGet", offsetof(struct cudrv_ops, device_get), false},
	    {"cuDevicePrimaryCtxRetain", offsetof(struct cudrv_ops, primary_ctx_retain), false},
	    {"cuDevicePrimaryCtxRelease_v2", offsetof(struct cudrv_ops, primary_ctx_release), false},
	    {"cuCtxGetCurrent", offsetof(struct cudrv_ops, ctx_get_current), false},
	    {"cuCtxSetCurrent", offsetof(struct cudrv_ops, ctx_set_current), false},
	    {"cuGetErrorName", offsetof(struct cudrv_ops, get_error_name), true},
	    {"cuMemcpy", offsetof(struct cudrv_ops, memcpy), true},
	    {"cuInit", offsetof(struct cudrv_ops, init), false},
	    {"cuMemRetainAllocationHandle", offsetof(struct cudrv_ops, mem_retain_allocation_handle), false},
	    {"cuMemExportToShareableHandle", offsetof(struct cudrv_ops, mem_export_to_shareable_handle), false},
	    {"cuMemImportFromShareableHandle", offsetof(struct cudrv_ops, mem_import_from_shareable_handle), false},
	    {"cuMemGetAllocationPropertiesFromHandle",
	     offsetof(struct cudrv_ops, mem_get_allocation_properties_from_handle), false},
	    {"cuMemGetAllocationGranularity", offsetof(struct cudrv_ops, mem_get_allocation_granularity), false},
	    {"cuMemCreate", offsetof(struct cudrv_ops, mem_create), false},
	    {"cuMemRelease", offsetof(struct cudrv_ops, mem_release), false},
	    {"cuMemAddressReserve", offsetof(struct cudrv_ops, mem_address_reserve), false},
	    {"cuMemAddressFree", offsetof(struct cudrv_ops, mem_address_free), false},
	    {"cuMemMap", offsetof(struct cudrv_ops, mem_map), false},
	    {"cuMemUnmap", offsetof(struct cudrv_ops, mem_unmap), false},
	    {"cuMemSetAccess", offsetof(struct cudrv_ops, mem_set_access), false},
	    {"cuMemHostRegister_v2", offsetof(struct cudrv_ops, mem_host_register), true},
	    {"cuMemHostUnregister", offsetof(struct cudrv_ops, mem_host_unregister), true},
	    {"cuMemHostGetDevicePointer_v2", offsetof(struct cudrv_ops, mem_host_get_device_pointer), true},
	    {"cuStreamBatchMemOp_v2", offsetof(struct cudrv_ops, stream_batch_mem_op), true},
	    {"cuMemcpyAsync", offsetof(struct cudrv_ops, memcpy_async), true},
	    {"cuMemcpy2DAsync_v2", offsetof(struct cudrv_ops, memcpy_2d_async), true},
	    {"cuStreamIsCapturing", offsetof(struct cudrv_ops, stream_is_capturing), true},
	    {"cuStreamCreate", offsetof(struct cudrv_ops, stream_create), true},
	    {"cuStreamSynchronize", offsetof(struct cudrv_ops, stream_synchronize), true},
	    {"cuStreamDestroy_v2", offsetof(struct cudrv_ops, stream_destroy), true},
	    {"cuDeviceGetCount", offsetof(struct cudrv_ops, device_get_count), true},
	    {"cuDeviceGetPCIBusId", offsetof(struct cudrv_ops, device_get_pci_bus_id), true},
	};
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return;
	struct cudrv_ops ops;
	memset(&ops, 0, sizeof(ops));
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *f = dlsym(lib, syms[i].name);
		if (!f && !syms[i].optional) {
			dlclose(lib);
			return;
		}
		memcpy((char *)&ops + syms[i].offset, &f, sizeof(f));
	}
	drv_real = ops;
	drv_loaded = true;
}

/* The table in use, or NULL when there is no driver. */
static const struct cudrv_ops *drv(void)
{
	const struct cudrv_ops *t = drv_test_ops;
	if (t)
		return t;
	pthread_once(&drv_once, drv_load);
	return drv_loaded ? &drv_real : NULL;
}

/* The driver table, or NULL with the reason recorded. */
static const struct cudrv_ops *drv_required(void)
{
	const struct cudrv_ops *ops = drv();
	if (!ops)
		snprintf(drv_err, sizeof(drv_err), "the CUDA driver (libcuda.so.1) cannot be loaded");
	return ops;
}

void cudrv_set_ops_for_test(const struct cudrv_ops *ops)
{
	drv_test_ops = ops;
}

const char *cudrv_last_error(void)
{
	return drv_err;
}

/* Records that `call` failed with r and returns the errno it stands for.
 * The one place where a driver error enters this library's domain. */
static int drv_fail(const struct cudrv_ops *ops, const char *call, CUresult r)
{
	const char *name = NULL;
	if (!ops->get_error_name || ops->get_error_name(r, &name) != CUDA_SUCCESS || !name)
		name = "an unknown error";
	snprintf(drv_err, sizeof(drv_err), "%s failed with %s (%d)", call, name, (int)r);
	return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

int cudrv_pointer_info(const void *p, struct cudrv_ptr_info *out)
{
	const struct cudrv_ops *ops = drv();
	if (!ops)
		return 0;
	/* Every answer goes into a zeroed 8-byte slot: the attributes are 4 or
	 * 8 bytes wide (the boolean ones are not documented further), and on
	 * a little-endian machine a narrower answer reads the same from the
	 * slot. */
	enum { TYPE, ORDINAL, BUFFER, START, SIZE, LEGACY, MANAGED, POOL, MAP_BASE, MAP_SIZE, BLOCK, HANDLES, N };
	CUpointer_attribute attrs[N] = {
	    [TYPE] = CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
	    [ORDINAL] = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	    [BUFFER] = CU_POINTER_ATTRIBUTE_BUFFER_ID,
	    [START] = CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
	    [SIZE] = CU_POINTER_ATTRIBUTE_RANGE_SIZE,
	    [LEGACY] = CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	    [MANAGED] = CU_POINTER_ATTRIBUTE_IS_MANAGED,
	    [POOL] = CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
	    [MAP_BASE] = CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
	    [MAP_SIZE] = CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
	    [BLOCK] = CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
	    [HANDLES] = CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
	};
	uint64_t v[N] = {0};
	void *data[N];
	for (unsigned i = 0; i < N; i++)
		data[i] = &v[i];
	CUresult r = ops->pointer_get_attributes(N, attrs, data, (CUdeviceptr)(uintptr_t)p);
	/* A process that never initialised the driver, or is tearing it down,
	 * cannot hold device memory. */
	if (r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_DEINITIALIZED)
		return 0;
	if (r != CUDA_SUCCESS)
		return drv_fail(ops, "cuPointerGetAttributes", r);
	if ((uint32_t)v[TYPE] != CU_MEMORYTYPE_DEVICE)
		return 0;
	out->device = (int)(uint32_t)v[ORDINAL];
	out->buffer_id = v[BUFFER];
	out->block_id = v[BLOCK];
	out->fd_exportable = (v[HANDLES] & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
	out->kind = v[LEGACY] ? CUDRV_MEM_LEGACY
	            : (uint32_t)v[MANAGED] ? CUDRV_MEM_MANAGED
	            : v[POOL] ? CUDRV_MEM_POOL
	                      : CUDRV_MEM_VMM;
	/* A VMM allocation is shared whole, as the one mapping it is: the
	 * address range may hold several. */
	bool mapping = out->kind == CUDRV_MEM_VMM;
	out->base = (uintptr_t)v[mapping ? MAP_BASE : START];
	out->size = (size_t)v[mapping ? MAP_SIZE : SIZE];
	/* The range must contain p, or the driver answered about something
	 * this code does not understand. */
	if ((uintptr_t)p < out->base || (uintptr_t)p - out->base >= out->size) {
		snprintf(drv_err, sizeof(drv_err), "cuPointerGetAttributes placed %p in [%#llx, +%zu), which does not "
		         "contain it", p, (unsigned long long)out->base, out->size);
		return -EIO;
	}
	return 1;
}

bool cudrv_pointer_ids(const void *p, uint64_t *buffer_id, uint64_t *block_id)
{
	const struct cudrv_ops *ops = drv();
	if (!ops)
		return false;
	CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID};
	unsigned long long v[2] = {0, 0};
	void *data[2] = {&v[0], &v[1]};
	if (ops->pointer_get_attributes(2, attrs, data, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return false;
	*buffer_id = v[0];
	*block_id = v[1];
	return true;
}

/* A driver call that needs a context, made in the device's primary context
 * (the one the CUDA runtime allocates in) for a thread that has no current
 * context (one that never made a CUDA call); the thread's own context, if
 * any, is made current again afterwards. */
struct drv_call {
	const char *name;
	CUresult (*fn)(const struct cudrv_ops *ops, void *arg);
	void *arg;
};

static CUresult drv_in_primary(const struct cudrv_ops *ops, int device, const struct drv_call *c, const char **call)
{
	CUdevice dev;
	CUcontext ctx = NULL, prev = NULL;
	CUresult r;

	*call = "cuDeviceGet";
	if ((r = ops->device_get(&dev, device)) != CUDA_SUCCESS)
		return r;
	*call = "cuDevicePrimaryCtxRetain";
	if ((r = ops->primary_ctx_retain(&ctx, dev)) != CUDA_SUCCESS)
		return r;
	*call = "cuCtxGetCurrent";
	if ((r = ops->ctx_get_current(&prev)) != CUDA_SUCCESS)
		goto release;
	*call = "cuCtxSetCurrent";
	if ((r = ops->ctx_set_current(ctx)) != CUDA_SUCCESS)
		goto release;
	*call = c->name;
	r = c->fn(ops, c->arg);
	ops->ctx_set_current(prev);
release:
	ops->primary_ctx_release(dev);
	return r;
}

/* Makes call c, in the primary context of device if the thread has none. */
static CUresult drv_with_context(const struct cudrv_ops *ops, int device, const struct drv_call *c, const char **call)
{
	*call = c->name;
	CUresult r = c->fn(ops, c->arg);
	if (r == CUDA_ERROR_INVALID_CONTEXT)
		r = drv_in_primary(ops, device, c, call);
	return r;
}

/* drv_with_context for call `name` (fn on arg): 0, or drv_fail's negative
 * errno naming the driver call that failed. */
static int drv_run(const struct cudrv_ops *ops, int device, const char *name,
                   CUresult (*fn)(const struct cudrv_ops *ops, void *arg), void *arg)
{
	struct drv_call c = {name, fn, arg};
	const char *call;
	CUresult r = drv_with_context(ops, device, &c, &call);
	return r == CUDA_SUCCESS ? 0 : drv_fail(ops, call, r);
}

/* -ENODEV, saying that the driver lacks what `with` names. */
static int drv_missing(const char *with)
{
	snprintf(drv_err, sizeof(drv_err), "the CUDA driver (libcuda.so.1) with %s cannot be loaded", with);
	return -ENODEV;
}

struct drv_ipc_arg {
	CUipcMemHandle *h;
	CUdeviceptr base;
};

static CUresult drv_ipc_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_ipc_arg *a = arg;
	return ops->ipc_get_mem_handle(a->h, a->base);
}

int cudrv_ipc_handle(const struct cudrv_ptr_info *a, uint8_t out[CUDRV_IPC_HANDLE_BYTES])
{
	const struct cudrv_ops *ops = drv_required();
	if (!ops)
		return -ENODEV;
	CUipcMemHandle h;
	struct drv_ipc_arg arg = {&h, (CUdeviceptr)a->base};
	struct drv_call c = {"cuIpcGetMemHandle", drv_ipc_call, &arg};
	const char *call;
	CUresult r = drv_with_context(ops, a->device, &c, &call);
	if (r != CUDA_SUCCESS)
		return drv_fail(ops, call, r);
	memcpy(out, h.reserved, CUDRV_IPC_HANDLE_BYTES);
	return 0;
}

struct drv_copy_arg {
	void *dst;
	const void *src;
	size_t bytes;
	CUstream stream; /* cudrv_copy_async's */
};

static CUresult drv_copy_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_copy_arg *a = arg;
	return ops->memcpy((CUdeviceptr)(uintptr_t)a->dst, (CUdeviceptr)(uintptr_t)a->src, a->bytes);
}

int cudrv_copy(void *dst, const void *src, size_t bytes, int device)
{
	const struct cudrv_ops *ops = drv();
	if (!ops || !ops->memcpy)
		return drv_missing("cuMemcpy");
	struct drv_copy_arg arg = {dst, src, bytes, NULL};
	return drv_run(ops, device, "cuMemcpy", drv_copy_call, &arg);
}

static CUresult drv_copy_async_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_copy_arg *a = arg;
	return ops->memcpy_async((CUdeviceptr)(uintptr_t)a->dst, (CUdeviceptr)(uintptr_t)a->src, a->bytes, a->stream);
}

int cudrv_copy_async(void *dst, const void *src, size_t bytes, void *stream, int device)
{
	const struct cudrv_ops *ops = drv();
	if (!ops || !ops->memcpy_async)
		return drv_missing("cuMemcpyAsync");
	struct drv_copy_arg arg = {dst, src, bytes, (CUstream)stream};
	return drv_run(ops, device, "cuMemcpyAsync", drv_copy_async_call, &arg);
}

static CUresult drv_copy_apart_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_copy_arg *a = arg;
	CUstream s;
	CUresult r = ops->stream_create(&s, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS)
		return r;
	r = ops->memcpy_async((CUdeviceptr)(uintptr_t)a->dst, (CUdeviceptr)(uintptr_t)a->src, a->bytes, s);
	CUresult rs = ops->stream_synchronize(s);
	ops->stream_destroy(s);
	return r != CUDA_SUCCESS ? r : rs;
}

int cudrv_copy_apart(void *dst, const void *src, size_t bytes, int device)
{
	const struct cudrv_ops *ops = drv();
	if (!ops || !ops->memcpy_async || !ops->stream_create || !ops->stream_synchronize || !ops->stream_destroy)
		return drv_missing("cuStreamCreate and cuMemcpyAsync");
	struct drv_copy_arg arg = {dst, src, bytes, NULL};
	return drv_run(ops, device, "cuMemcpyAsync", drv_copy_apart_call, &arg);
}

int cudrv_init(void)
{
	const struct cudrv_ops *ops = drv_required();
	if (!ops)
		return -ENODEV;
	CUresult r = ops->init(0);
	if (r == CUDA_SUCCESS)
		return 0;
	drv_fail(ops, "cuInit", r);
	return -ENODEV;
}

struct drv_export_arg {
	CUdeviceptr base;
	int *fd;
	bool not_vmm;       /* the driver knows no allocation handle for the address */
	const char *failed; /* the call that failed */
};

static CUresult drv_export_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_export_arg *a = arg;
	CUmemGenericAllocationHandle h;
	a->failed = "cuMemRetainAllocationHandle";
	CUresult r = ops->mem_retain_allocation_handle(&h, (void *)(uintptr_t)a->base);
	if (r != CUDA_SUCCESS) {
		a->not_vmm = r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED;
		return r;
	}
	int fd = -1;
	a->failed = "cuMemExportToShareableHandle";
	r = ops->mem_export_to_shareable_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	ops->mem_release(h);
	if (r == CUDA_SUCCESS)
		*a->fd = fd;
	return r;
}

int cudrv_vmm_export(const struct cudrv_ptr_info *a, int *fd)
{
	const struct cudrv_ops *ops = drv_required();
	if (!ops)
		return -ENODEV;
	if (!a->fd_exportable) {
		snprintf(drv_err, sizeof(drv_err), "the allocation was not created exportable as a POSIX file descriptor "
		         "(CUmemAllocationProp.requestedHandleTypes lacks CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
		return -ENOTSUP;
	}
	struct drv_export_arg arg = {(CUdeviceptr)a->base, fd, false, ""};
	struct drv_call c = {"cuMemRetainAllocationHandle", drv_export_call, &arg};
	const char *call;
	CUresult r = drv_with_context(ops, a->device, &c, &call);
	if (r == CUDA_SUCCESS)
		return 0;
	int rc = drv_fail(ops, call == c.name ? arg.failed : call, r);
	return arg.not_vmm ? -ENOTSUP : rc;
}

static size_t round_up(uint64_t n, size_t to)
{
	return (size_t)((n + to - 1) / to * to);
}

struct drv_import_arg {
	int fd;
	uint64_t bytes;
	int device;
	struct cudrv_vmm *out;
	const char *failed; /* the call that failed */
};

/* Imports, reserves, maps and opens access; undoes what it did on failure
 * (drv_with_context may call it again in another context). */
static CUresult drv_import_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_import_arg *a = arg;
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	CUdeviceptr va = 0;
	size_t g = 0, size = 0;
	CUresult r;

	memset(&prop, 0, sizeof(prop));
	a->failed = "cuMemImportFromShareableHandle";
	r = ops->mem_import_from_shareable_handle(&h, (void *)(uintptr_t)a->fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return r;
	a->failed = "cuMemGetAllocationPropertiesFromHandle";
	r = ops->mem_get_allocation_properties_from_handle(&prop, h);
	if (r == CUDA_SUCCESS) {
		a->failed = "cuMemGetAllocationGranularity";
		r = ops->mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
		if (r == CUDA_SUCCESS && (g == 0 || a->bytes == 0 || a->bytes > SIZE_MAX - g))
			r = CUDA_ERROR_INVALID_VALUE;
	}
	if (r == CUDA_SUCCESS) {
		size = round_up(a->bytes, g);
		a->failed = "cuMemAddressReserve";
		r = ops->mem_address_reserve(&va, size, g, 0, 0);
	}
	if (r == CUDA_SUCCESS) {
		a->failed = "cuMemMap";
		r = ops->mem_map(va, size, 0, h, 0);
		if (r != CUDA_SUCCESS)
			ops->mem_address_free(va, size);
	}
	if (r == CUDA_SUCCESS) {
		CUmemAccessDesc access;
		memset(&access, 0, sizeof(access));
		access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		access.location.id = a->device;
		access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		a->failed = "cuMemSetAccess";
		r = ops->mem_set_access(va, size, &access, 1);
		if (r != CUDA_SUCCESS) {
			ops->mem_unmap(va, size);
			ops->mem_address_free(va, size);
		}
	}
	if (r != CUDA_SUCCESS) {
		ops->mem_release(h);
		return r;
	}
	*a->out = (struct cudrv_vmm){h, (uintptr_t)va, size};
	return CUDA_SUCCESS;
}

int cudrv_vmm_import(int fd, uint64_t bytes, int device, struct cudrv_vmm *out)
{
	memset(out, 0, sizeof(*out));
	const struct cudrv_ops *ops = drv_required();
	if (!ops)
		return -ENODEV;
	struct drv_import_arg arg = {fd, bytes, device, out, ""};
	struct drv_call c = {"cuMemImportFromShareableHandle", drv_import_call, &arg};
	const char *call;
	CUresult r = drv_with_context(ops, device, &c, &call);
	if (r == CUDA_SUCCESS)
		return 0;
	int rc = drv_fail(ops, call == c.name ? arg.failed : call, r);
	/* The one refusal a range can provoke: a mapping past the end. */
	return r == CUDA_ERROR_INVALID_VALUE && !strcmp(arg.failed, "cuMemMap") ? -ERANGE : rc;
}

void cudrv_vmm_unmap(struct cudrv_vmm *m)
{
	if (!m->handle)
		return;
	const struct cudrv_ops *ops = drv();
	if (!ops)
		return;
	ops->mem_unmap((CUdeviceptr)m->base, m->size);
	ops->mem_address_free((CUdeviceptr)m->base, m->size);
	ops->mem_release(m->handle);
	memset(m, 0, sizeof(*m));
}

int cudrv_vmm_create(int device, uint64_t size, int *fd, unsigned long long *handle, uint64_t *alloc_size)
{
	const struct cudrv_ops *ops = drv_required();
	if (!ops)
		return -ENODEV;
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = device;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	size_t g = 0;
	CUresult r = ops->mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return drv_fail(ops, "cuMemGetAllocationGranularity", r);
	if (g == 0 || size == 0 || size > SIZE_MAX - g) {
		snprintf(drv_err, sizeof(drv_err), "cannot allocate %llu bytes in %zu-byte granules",
		         (unsigned long long)size, g);
		return -EINVAL;
	}
	CUmemGenericAllocationHandle h;
	r = ops->mem_create(&h, round_up(size, g), &prop, 0);
	if (r != CUDA_SUCCESS)
		return drv_fail(ops, "cuMemCreate", r);
	int shared = -1;
	r = ops->mem_export_to_shareable_handle(&shared, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		ops->mem_release(h);
		return drv_fail(ops, "cuMemExportToShareableHandle", r);
	}
	*fd = shared;
	*handle = h;
	*alloc_size = round_up(size, g);
	return 0;
}

void cudrv_vmm_release(unsigned long long handle)
{
	const struct cudrv_ops *ops = handle ? drv() : NULL;
	if (ops)
		ops->mem_release(handle);
}

/* ---------------------------------------------------------------- streams */

static const struct cudrv_ops *drv_streams(void)
{
	const struct cudrv_ops *ops = drv();
	if (ops && ops->mem_host_register && ops->mem_host_unregister && ops->mem_host_get_device_pointer &&
	    ops->stream_batch_mem_op)
		return ops;
	snprintf(drv_err, sizeof(drv_err), "%s", ops ? "the CUDA driver lacks stream memory operations "
	         "(cuStreamBatchMemOp_v2, cuMemHostRegister_v2)" : "the CUDA driver (libcuda.so.1) cannot be loaded");
	return NULL;
}

bool cudrv_streams_usable(void)
{
	return drv_streams() != NULL;
}

struct drv_host_arg {
	void *p;
	size_t bytes;
	uintptr_t *dev;
	const char *failed;
};

static CUresult drv_host_register_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_host_arg *a = arg;
	a->failed = "cuMemHostRegister";
	CUresult r = ops->mem_host_register(a->p, a->bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	if (r != CUDA_SUCCESS)
		return r;
	CUdeviceptr d = 0;
	a->failed = "cuMemHostGetDevicePointer";
	r = ops->mem_host_get_device_pointer(&d, a->p, 0);
	if (r != CUDA_SUCCESS) {
		ops->mem_host_unregister(a->p);
		return r;
	}
	*a->dev = (uintptr_t)d;
	return CUDA_SUCCESS;
}

int cudrv_host_register(void *p, size_t bytes, int device, uintptr_t *dev)
{
	const struct cudrv_ops *ops = drv_streams();
	if (!ops)
		return -ENODEV;
	struct drv_host_arg arg = {p, bytes, dev, ""};
	struct drv_call c = {"cuMemHostRegister", drv_host_register_call, &arg};
	const char *call;
	CUresult r = drv_with_context(ops, device, &c, &call);
	return r == CUDA_SUCCESS ? 0 : drv_fail(ops, call == c.name ? arg.failed : call, r);
}

static CUresult drv_host_unregister_call(const struct cudrv_ops *ops, void *arg)
{
	return ops->mem_host_unregister(((struct drv_host_arg *)arg)->p);
}

void cudrv_host_unregister(void *p, int device)
{
	const struct cudrv_ops *ops = drv_streams();
	if (!ops)
		return;
	struct drv_host_arg arg = {p, 0, NULL, ""};
	struct drv_call c = {"cuMemHostUnregister", drv_host_unregister_call, &arg};
	const char *call;
	drv_with_context(ops, device, &c, &call);
}

struct drv_memop_arg {
	CUstream stream;
	unsigned n;
	CUstreamBatchMemOpParams *params;
};

static CUresult drv_memop_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_memop_arg *a = arg;
	return ops->stream_batch_mem_op(a->stream, a->n, a->params, 0);
}

int cudrv_stream_ops(void *stream, const struct cudrv_stream_op *ops_in, unsigned n, int device)
{
	const struct cudrv_ops *ops = drv_streams();
	if (!ops)
		return -ENODEV;
	if (n == 0 || n > CUDRV_STREAM_OPS_MAX) {
		snprintf(drv_err, sizeof(drv_err), "%u stream operations in one call (1 to %u)", n, CUDRV_STREAM_OPS_MAX);
		return -EINVAL;
	}
	CUstreamBatchMemOpParams params[CUDRV_STREAM_OPS_MAX];
	memset(params, 0, n * sizeof(params[0]));
	for (unsigned i = 0; i < n; i++) {
		const struct cudrv_stream_op *o = &ops_in[i];
		/* The write's parameters have the wait's layout. */
		params[i].waitValue.operation = o->wait ? CU_STREAM_MEM_OP_WAIT_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_64;
		params[i].waitValue.address = (CUdeviceptr)o->address;
		params[i].waitValue.value64 = o->value;
		params[i].waitValue.flags = o->wait ? CU_STREAM_WAIT_VALUE_GEQ : 0;
	}
	struct drv_memop_arg arg = {(CUstream)stream, n, params};
	return drv_run(ops, device, "cuStreamBatchMemOp", drv_memop_call, &arg);
}

struct drv_copy_words_arg {
	CUstream stream;
	CUDA_MEMCPY2D copy;
};

static CUresult drv_copy_words_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_copy_words_arg *a = arg;
	return ops->memcpy_2d_async(&a->copy, a->stream);
}

int cudrv_stream_copy_words(void *stream, uintptr_t dst, uintptr_t src, size_t pitch, unsigned rows, int device)
{
	const struct cudrv_ops *ops = drv_streams();
	if (!ops)
		return -ENODEV;
	if (!ops->memcpy_2d_async) {
		snprintf(drv_err, sizeof(drv_err), "the CUDA driver lacks cuMemcpy2DAsync_v2");
		return -ENOTSUP;
	}
	struct drv_copy_words_arg arg = {(CUstream)stream, {0}};
	arg.copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	arg.copy.srcDevice = (CUdeviceptr)src;
	arg.copy.srcPitch = pitch;
	arg.copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	arg.copy.dstDevice = (CUdeviceptr)dst;
	arg.copy.dstPitch = pitch;
	arg.copy.WidthInBytes = sizeof(uint64_t);
	arg.copy.Height = rows;
	return drv_run(ops, device, "cuMemcpy2DAsync", drv_copy_words_call, &arg);
}

struct drv_capture_arg {
	CUstream stream;
	CUstreamCaptureStatus status;
};

static CUresult drv_capture_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_capture_arg *a = arg;
	return ops->stream_is_capturing(a->stream, &a->status);
}

int cudrv_stream_capturing(void *stream, int device)
{
	const struct cudrv_ops *ops = drv();
	if (!ops || !ops->stream_is_capturing)
		return 0;
	struct drv_capture_arg arg = {(CUstream)stream, CU_STREAM_CAPTURE_STATUS_NONE};
	struct drv_call c = {"cuStreamIsCapturing", drv_capture_call, &arg};
	const char *call;
	CUresult r = drv_with_context(ops, device, &c, &call);
	if (r != CUDA_SUCCESS)
		return drv_fail(ops, call, r);
	return arg.status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* ---------------------------------------------------------------- devices */

int cudrv_device_count(void)
{
	const struct cudrv_ops *ops = drv_required();
	if (!ops)
		return 0;
	if (!ops->device_get_count || !ops->device_get_pci_bus_id) {
		snprintf(drv_err, sizeof(drv_err), "the CUDA driver lacks cuDeviceGetCount or cuDeviceGetPCIBusId");
		return 0;
	}
	/* cuInit says CUDA_ERROR_NO_DEVICE where no GPU is visible; any other
	 * failure leaves the process unable to use a GPU just the same. */
	CUresult r = ops->init(0);
	if (r != CUDA_SUCCESS) {
		drv_fail(ops, "cuInit", r);
		return 0;
	}
	int n = 0;
	r = ops->device_get_count(&n);
	if (r != CUDA_SUCCESS) {
		drv_fail(ops, "cuDeviceGetCount", r);
		return 0;
	}
	return n > 0 ? n : 0;
}

int cudrv_device_pci_bus_id(int ordinal, char *buf, size_t len)
{
	const struct cudrv_ops *ops = drv_required();
	if (!ops)
		return -ENODEV;
	if (!ops->device_get_pci_bus_id || len == 0 || len > INT_MAX) {
		snprintf(drv_err, sizeof(drv_err), "cannot ask the CUDA driver for a PCI bus id");
		return -EINVAL;
	}
	CUdevice dev;
	CUresult r = ops->device_get(&dev, ordinal);
	if (r != CUDA_SUCCESS)
		return drv_fail(ops, "cuDeviceGet", r);
	buf[0] = '\0';
	r = ops->device_get_pci_bus_id(buf, (int)len, dev);
	if (r != CUDA_SUCCESS)
		return drv_fail(ops, "cuDeviceGetPCIBusId", r);
	buf[len - 1] = '\0';
	return 0;
}
