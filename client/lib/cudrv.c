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
 */
#include "cudrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static const struct cudrv_ops *_Atomic drv_test_ops;
static struct cudrv_ops drv_real;
static bool drv_loaded;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static __thread char drv_err[160];

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
	 * 8 bytes wide (the boolean one is not documented further), and on a
	 * little-endian machine a narrower answer reads the same from the
	 * slot. */
	CUpointer_attribute attrs[] = {
	    CU_POINTER_ATTRIBUTE_MEMORY_TYPE,     CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	    CU_POINTER_ATTRIBUTE_BUFFER_ID,       CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
	    CU_POINTER_ATTRIBUTE_RANGE_SIZE,      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	};
	enum { N = sizeof(attrs) / sizeof(attrs[0]) };
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
	if ((uint32_t)v[0] != CU_MEMORYTYPE_DEVICE)
		return 0;
	out->device = (int)(uint32_t)v[1];
	out->buffer_id = v[2];
	out->base = (uintptr_t)v[3];
	out->size = (size_t)v[4];
	out->ipc_capable = v[5] != 0;
	/* The range must contain p, or the driver answered about something
	 * this code does not understand. */
	if ((uintptr_t)p < out->base || (uintptr_t)p - out->base >= out->size) {
		snprintf(drv_err, sizeof(drv_err), "cuPointerGetAttributes placed %p in [%#llx, +%zu), which does not "
		         "contain it", p, (unsigned long long)out->base, out->size);
		return -EIO;
	}
	return 1;
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
	const struct cudrv_ops *ops = drv();
	if (!ops) {
		snprintf(drv_err, sizeof(drv_err), "the CUDA driver (libcuda.so.1) cannot be loaded");
		return -ENODEV;
	}
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
};

static CUresult drv_copy_call(const struct cudrv_ops *ops, void *arg)
{
	struct drv_copy_arg *a = arg;
	return ops->memcpy((CUdeviceptr)(uintptr_t)a->dst, (CUdeviceptr)(uintptr_t)a->src, a->bytes);
}

int cudrv_copy(void *dst, const void *src, size_t bytes, int device)
{
	const struct cudrv_ops *ops = drv();
	if (!ops || !ops->memcpy) {
		snprintf(drv_err, sizeof(drv_err), "the CUDA driver (libcuda.so.1) with cuMemcpy cannot be loaded");
		return -ENODEV;
	}
	struct drv_copy_arg arg = {dst, src, bytes};
	struct drv_call c = {"cuMemcpy", drv_copy_call, &arg};
	const char *call;
	CUresult r = drv_with_context(ops, device, &c, &call);
	return r == CUDA_SUCCESS ? 0 : drv_fail(ops, call, r);
}
