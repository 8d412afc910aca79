/*
 * Host and GPU buffers of the tools and the GPU tests; see membuf.h. The
 * CUDA runtime is called only in a build with a CUDA toolkit
 * (DFCCL_HAVE_CUDA); elsewhere the GPU kinds fail with a message.
 */
#include "membuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef DFCCL_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

#include "dfccl.h"
#include "nccl_lib.h"
#include "tool.h"

static _Thread_local char membuf_err[320];

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(membuf_err, sizeof(membuf_err), fmt, ap);
	va_end(ap);
}

const char *membuf_error(void)
{
	return membuf_err;
}

static const char *const kind_names[MEMBUF_NKINDS] = {
    [MEMBUF_HOST] = "host", [MEMBUF_DEVICE] = "device", [MEMBUF_VMM] = "vmm", [MEMBUF_MEMALLOC] = "memalloc",
    [MEMBUF_NCCL] = "nccl"};

const char *membuf_kind_name(int kind)
{
	return kind >= 0 && kind < MEMBUF_NKINDS ? kind_names[kind] : "?";
}

int membuf_kind_parse(const char *s)
{
	for (int k = 0; k < MEMBUF_NKINDS; k++)
		if (!strcmp(s, kind_names[k]))
			return k;
	return -1;
}

bool membuf_on_gpu(int kind)
{
	return kind == MEMBUF_DEVICE || kind == MEMBUF_VMM || kind == MEMBUF_MEMALLOC || kind == MEMBUF_NCCL;
}

/* An allocation of libdfccl's (dfcclMemAlloc or dfcclMemAllocHost). */
static int dfccl_alloc(dfcclResult_t (*alloc)(void **, size_t), const char *name, void **p, size_t size)
{
	if (alloc(p, size) == dfcclSuccess)
		return 0;
	set_error("%s of %zu bytes: %s", name, size, dfcclGetLastError(NULL));
	return -1;
}

/* ---------------------------------------------------------------- GPU memory */

#ifdef DFCCL_HAVE_CUDA

static int have_cuda(void)
{
	return 0;
}

/* The check of every CUDA runtime call: records which call failed. */
static int cuda_check(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	set_error("%s: %s", what, cudaGetErrorString(e));
	return -1;
}

static int dev_use(int device)
{
	char what[48];
	snprintf(what, sizeof(what), "cudaSetDevice(%d)", device);
	if (cuda_check(cudaSetDevice(device), what) < 0)
		return -1;
	return cuda_check(cudaFree(NULL), "creating the CUDA context");
}

static int dev_alloc(void **p, size_t size)
{
	char what[64];
	snprintf(what, sizeof(what), "cudaMalloc of %zu bytes", size);
	return cuda_check(cudaMalloc(p, size), what);
}

static void dev_free(void *p)
{
	cudaFree(p);
}

/* A copy from pageable memory may return before its DMA has landed: the
 * device synchronization makes sure it has (see membuf.h). */
static int dev_put(void *dst, const void *src, size_t n)
{
	if (cuda_check(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU") < 0)
		return -1;
	return cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after a copy to the GPU");
}

static int dev_get(void *dst, const void *src, size_t n)
{
	return cuda_check(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
}

static int dev_sync(void)
{
	return cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int dev_count(void)
{
	int n = 0;
	return cudaGetDeviceCount(&n) == cudaSuccess ? n : -1;
}

/* dfcclMemAlloc's memory, which must be device memory: the host engine's
 * is host memory, which this kind's GPU copies must not be given. */
static int memalloc_alloc(void **p, size_t size)
{
	struct cudaPointerAttributes attr;
	if (dfccl_alloc(dfcclMemAlloc, "dfcclMemAlloc", p, size) < 0)
		return -1;
	int rc = cuda_check(cudaPointerGetAttributes(&attr, *p), "cudaPointerGetAttributes of dfcclMemAlloc's memory");
	if (rc == 0 && attr.type == cudaMemoryTypeUnregistered) {
		set_error("dfcclMemAlloc gave host memory (dfccld runs the host engine): memalloc buffers need the CUDA "
		          "engine");
		rc = -1;
	}
	if (rc < 0) {
		dfcclMemFree(*p);
		*p = NULL;
	}
	return rc;
}

/*
 * The driver calls of VMM allocations, reached through the runtime (which
 * loads the driver itself) so that nothing links libcuda.
 */
static struct {
	CUresult (*granularity)(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option);
	CUresult (*create)(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
	                   unsigned long long flags);
	CUresult (*release)(CUmemGenericAllocationHandle h);
	CUresult (*reserve)(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags);
	CUresult (*address_free)(CUdeviceptr ptr, size_t size);
	CUresult (*map)(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
	                unsigned long long flags);
	CUresult (*unmap)(CUdeviceptr ptr, size_t size);
	CUresult (*set_access)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
	CUresult (*error_name)(CUresult r, const char **name);
} drv;

static int drv_load(void)
{
	static const struct {
		const char *name;
		void **fn;
	} syms[] = {
	    {"cuMemGetAllocationGranularity", (void **)&drv.granularity},
	    {"cuMemCreate", (void **)&drv.create},
	    {"cuMemRelease", (void **)&drv.release},
	    {"cuMemAddressReserve", (void **)&drv.reserve},
	    {"cuMemAddressFree", (void **)&drv.address_free},
	    {"cuMemMap", (void **)&drv.map},
	    {"cuMemUnmap", (void **)&drv.unmap},
	    {"cuMemSetAccess", (void **)&drv.set_access},
	    {"cuGetErrorName", (void **)&drv.error_name},
	};
	if (drv.error_name)
		return 0;
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		enum cudaDriverEntryPointQueryResult q;
		cudaError_t e = cudaGetDriverEntryPointByVersion(syms[i].name, syms[i].fn, 12000, cudaEnableDefault, &q);
		if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
			set_error("the CUDA driver has no %s (%s)", syms[i].name,
			          e != cudaSuccess ? cudaGetErrorString(e) : "not found");
			*syms[i].fn = NULL;
			return -1;
		}
	}
	return 0;
}

/* The check of every CUDA driver call: records which call failed. */
static int drv_check(CUresult r, const char *what)
{
	if (r == CUDA_SUCCESS)
		return 0;
	const char *name = NULL;
	drv.error_name(r, &name);
	set_error("%s: %s", what, name ? name : "an unknown CUDA driver error");
	return -1;
}

/* The VMM allocations of this process, for their release: the driver keeps
 * no size of a mapping that cuMemUnmap and cuMemAddressFree could be given. */
static struct vmm_area {
	void *p;
	size_t size;
} *vmm_areas;
static size_t vmm_nareas;

/* A free slot of vmm_areas, grown as needed; NULL when out of memory. */
static struct vmm_area *vmm_slot(void)
{
	for (size_t i = 0; i < vmm_nareas; i++)
		if (!vmm_areas[i].p)
			return &vmm_areas[i];
	size_t n = vmm_nareas ? 2 * vmm_nareas : 16;
	struct vmm_area *a = realloc(vmm_areas, n * sizeof(*a));
	if (!a) {
		set_error("out of memory for the table of VMM allocations");
		return NULL;
	}
	size_t first_new = vmm_nareas;
	memset(a + first_new, 0, (n - first_new) * sizeof(*a));
	vmm_areas = a;
	vmm_nareas = n;
	return &vmm_areas[first_new];
}

/* Unmaps and frees the address range of a mapping (the memory goes once
 * every process that maps it, the daemon included, has let go of it). */
static void vmm_unmap(CUdeviceptr va, size_t size)
{
	drv.unmap(va, size);
	drv.address_free(va, size);
}

/* cuMemCreate exportable as a POSIX file descriptor on the current device,
 * mapped into an address range of its own with read-write access for that
 * GPU. The mapping holds the memory: the creation handle is released at
 * once. */
static int vmm_alloc(void **p, size_t n)
{
	int dev;
	struct vmm_area *slot = vmm_slot();
	if (!slot || drv_load() < 0 || cuda_check(cudaGetDevice(&dev), "cudaGetDevice") < 0)
		return -1;
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	size_t g = 0;
	if (drv_check(drv.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity") < 0)
		return -1;
	size_t size = (n + g - 1) / g * g;
	CUmemGenericAllocationHandle h;
	CUdeviceptr va = 0;
	char what[80];
	snprintf(what, sizeof(what), "cuMemCreate of %zu bytes on GPU %d", size, dev);
	if (drv_check(drv.create(&h, size, &prop, 0), what) < 0)
		return -1;
	int rc = drv_check(drv.reserve(&va, size, g, 0, 0), "cuMemAddressReserve");
	if (rc == 0 && (rc = drv_check(drv.map(va, size, 0, h, 0), "cuMemMap")) < 0)
		drv.address_free(va, size);
	drv.release(h);
	if (rc < 0)
		return -1;
	CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	if (drv_check(drv.set_access(va, size, &access, 1), "cuMemSetAccess") < 0) {
		vmm_unmap(va, size);
		return -1;
	}
	*slot = (struct vmm_area){(void *)(uintptr_t)va, size};
	*p = slot->p;
	return 0;
}

static void vmm_free(void *p)
{
	for (size_t i = 0; i < vmm_nareas; i++) {
		if (vmm_areas[i].p == p) {
			vmm_unmap((CUdeviceptr)(uintptr_t)p, vmm_areas[i].size);
			vmm_areas[i].p = NULL;
			return;
		}
	}
	fprintf(stderr, "membuf: %p is no VMM allocation of this process: not freed\n", p);
}

/* ---------------------------------------------------------------- streams and events */

int membuf_stream_create(membuf_stream_t *s)
{
	cudaStream_t cs = NULL;
	int rc = cuda_check(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
	*s = rc == 0 ? cs : NULL;
	return rc;
}

void membuf_stream_destroy(membuf_stream_t s)
{
	if (s)
		cudaStreamDestroy(s);
}

int membuf_stream_query(membuf_stream_t s)
{
	cudaError_t e = cudaStreamQuery(s);
	if (e == cudaErrorNotReady)
		return 0;
	return cuda_check(e, "the work on the stream (cudaStreamQuery)") < 0 ? -1 : 1;
}

int membuf_event_create(membuf_event_t *e)
{
	cudaEvent_t ce = NULL;
	int rc = cuda_check(cudaEventCreate(&ce), "cudaEventCreate");
	*e = rc == 0 ? ce : NULL;
	return rc;
}

void membuf_event_destroy(membuf_event_t e)
{
	if (e)
		cudaEventDestroy(e);
}

int membuf_event_record(membuf_event_t e, membuf_stream_t s)
{
	return cuda_check(cudaEventRecord(e, s), "cudaEventRecord");
}

int membuf_event_elapsed(membuf_event_t start, membuf_event_t stop, double *ms)
{
	float f = 0;
	if (cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize") < 0 ||
	    cuda_check(cudaEventElapsedTime(&f, start, stop), "cudaEventElapsedTime") < 0)
		return -1;
	*ms = f;
	return 0;
}

#else /* no CUDA toolkit at build time */

static int no_cuda(void)
{
	set_error("GPU buffers are not available: built without CUDA (no CUDA toolkit was found when dfccl was "
	          "built); rebuild with a toolkit, or use host buffers");
	return -1;
}

static int have_cuda(void)
{
	return no_cuda();
}

static int dev_use(int device)
{
	(void)device;
	return no_cuda();
}

static int dev_alloc(void **p, size_t size)
{
	(void)p;
	(void)size;
	return no_cuda();
}

static void dev_free(void *p)
{
	(void)p;
}

static int dev_put(void *dst, const void *src, size_t n)
{
	(void)dst;
	(void)src;
	(void)n;
	return no_cuda();
}

static int dev_get(void *dst, const void *src, size_t n)
{
	(void)dst;
	(void)src;
	(void)n;
	return no_cuda();
}

static int dev_sync(void)
{
	return no_cuda();
}

static int dev_count(void)
{
	return -1;
}

static int vmm_alloc(void **p, size_t n)
{
	return dev_alloc(p, n);
}

static int memalloc_alloc(void **p, size_t n)
{
	return dev_alloc(p, n);
}

static void vmm_free(void *p)
{
	(void)p;
}

int membuf_stream_create(membuf_stream_t *s)
{
	*s = NULL;
	return no_cuda();
}

void membuf_stream_destroy(membuf_stream_t s)
{
	(void)s;
}

int membuf_stream_query(membuf_stream_t s)
{
	(void)s;
	return no_cuda();
}

int membuf_event_create(membuf_event_t *e)
{
	*e = NULL;
	return no_cuda();
}

void membuf_event_destroy(membuf_event_t e)
{
	(void)e;
}

int membuf_event_record(membuf_event_t e, membuf_stream_t s)
{
	(void)e;
	(void)s;
	return no_cuda();
}

int membuf_event_elapsed(membuf_event_t start, membuf_event_t stop, double *ms)
{
	(void)start;
	(void)stop;
	(void)ms;
	return no_cuda();
}

#endif /* DFCCL_HAVE_CUDA */

/* ---------------------------------------------------------------- every kind */

/* ncclMemAlloc's memory, of the NCCL that nccl_lib_open() loaded (no CUDA
 * call of this module's: NCCL makes them). */
static int have_nccl_mem(void)
{
	if (!nccl_lib_loaded()) {
		set_error("nccl buffers come from ncclMemAlloc, and NCCL is not loaded in this program");
		return -1;
	}
	if (!nccl.mem_alloc || !nccl.mem_free) {
		set_error("the NCCL at %s has no ncclMemAlloc (NCCL 2.19 or later has)", nccl_lib_path());
		return -1;
	}
	return 0;
}

static int ncclmem_alloc(void **p, size_t size)
{
	char what[64];
	if (have_nccl_mem() < 0)
		return -1;
	snprintf(what, sizeof(what), "ncclMemAlloc of %zu bytes", size);
	if (nccl_lib_check(nccl.mem_alloc(p, size), NULL, what) == 0)
		return 0;
	set_error("%s", nccl_lib_error());
	*p = NULL;
	return -1;
}

static void ncclmem_free(void *p)
{
	if (nccl.mem_free)
		nccl.mem_free(p);
}

int membuf_require(int kind)
{
	if (kind < 0 || kind >= MEMBUF_NKINDS) {
		set_error("unknown kind of memory %d", kind);
		return -1;
	}
	if (!membuf_on_gpu(kind))
		return 0;
	if (have_cuda() < 0)
		return -1;
	return kind == MEMBUF_NCCL ? have_nccl_mem() : 0;
}

int membuf_use_device(int kind, int device)
{
	return membuf_on_gpu(kind) ? dev_use(device) : 0;
}

int membuf_alloc(int kind, void **p, size_t size)
{
	*p = NULL;
	switch (kind) {
	case MEMBUF_DEVICE: return dev_alloc(p, size);
	case MEMBUF_VMM: return vmm_alloc(p, size);
	case MEMBUF_MEMALLOC: return memalloc_alloc(p, size);
	case MEMBUF_NCCL: return ncclmem_alloc(p, size);
	default: return dfccl_alloc(dfcclMemAllocHost, "dfcclMemAllocHost", p, size);
	}
}

void membuf_free(int kind, void *p)
{
	if (!p)
		return;
	switch (kind) {
	case MEMBUF_DEVICE: dev_free(p); break;
	case MEMBUF_VMM: vmm_free(p); break;
	case MEMBUF_NCCL: ncclmem_free(p); break;
	default: dfcclMemFree(p); break;
	}
}

int membuf_put(int kind, void *dst, const void *src, size_t n)
{
	if (membuf_on_gpu(kind))
		return dev_put(dst, src, n);
	memmove(dst, src, n);
	return 0;
}

int membuf_get(int kind, void *dst, const void *src, size_t n)
{
	if (membuf_on_gpu(kind))
		return dev_get(dst, src, n);
	memmove(dst, src, n);
	return 0;
}

int membuf_sync(int kind)
{
	return membuf_on_gpu(kind) ? dev_sync() : 0;
}

int membuf_gpu_count(void)
{
	if (have_cuda() < 0)
		return -1;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		int n = dev_count();
		_exit(n >= 0 && n < 255 ? n : 255);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) == 255)
		return -1;
	return WEXITSTATUS(st);
}

/* ---------------------------------------------------------------- buffers with images */

int membuf_open(struct membuf *b, int kind, size_t size)
{
	*b = (struct membuf){.kind = kind, .size = size};
	if (membuf_alloc(kind, (void **)&b->ptr, size) < 0)
		return -1;
	if (!membuf_on_gpu(kind)) {
		b->img = b->ptr;
		return 0;
	}
	b->img = malloc(size ? size : 1);
	if (!b->img) {
		set_error("out of memory for a %zu-byte host image of a GPU buffer", size);
		membuf_close(b);
		return -1;
	}
	return 0;
}

void membuf_close(struct membuf *b)
{
	if (b->img && b->img != b->ptr)
		free(b->img);
	membuf_free(b->kind, b->ptr);
	*b = (struct membuf){.kind = b->kind};
}

bool membuf_holds(const struct membuf *b, const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p, lo = (uintptr_t)b->ptr;
	return b->ptr && a >= lo && n <= b->size && a - lo <= b->size - n;
}

void *membuf_image(const struct membuf *b, const void *p)
{
	return b->img + ((const char *)p - b->ptr);
}

int membuf_upload(const struct membuf *b, const void *p, size_t n)
{
	if (!membuf_on_gpu(b->kind) || n == 0)
		return 0;
	return membuf_put(b->kind, (void *)p, membuf_image(b, p), n);
}

int membuf_download(const struct membuf *b, const void *p, size_t n)
{
	if (!membuf_on_gpu(b->kind) || n == 0)
		return 0;
	return membuf_get(b->kind, membuf_image(b, p), p, n);
}

int membuf_pair_open(struct membuf_pair *bp, int kind, size_t size)
{
	*bp = (struct membuf_pair)MEMBUF_PAIR_INIT;
	if (membuf_open(&bp->send, kind, size) == 0 && membuf_open(&bp->recv, kind, size) == 0)
		return 0;
	membuf_pair_close(bp);
	return -1;
}

void membuf_pair_close(struct membuf_pair *bp)
{
	membuf_close(&bp->send);
	membuf_close(&bp->recv);
}

/* The buffer of the pair that holds [p, p + n), or NULL. */
static const struct membuf *pair_buffer(const struct membuf_pair *bp, const void *p, size_t n)
{
	if (membuf_holds(&bp->recv, p, n))
		return &bp->recv;
	if (membuf_holds(&bp->send, p, n))
		return &bp->send;
	set_error("a collective's buffer [%p, +%zu) lies outside its send and receive buffers", p, n);
	return NULL;
}

int membuf_pair_stage(const struct membuf_pair *bp, int coll, const void *send, const void *recv, size_t count,
                      int dtype, int op, int rank, int nranks, uint64_t key)
{
	size_t esize = tool_dtype_size(dtype);
	size_t sbytes = tool_send_elems(coll, count, nranks) * esize, rbytes = tool_recv_elems(coll, count, nranks) * esize;
	const struct membuf *sb = pair_buffer(bp, send, sbytes), *rb = pair_buffer(bp, recv, rbytes);
	if (!sb || !rb)
		return -1;
	/* In place, the send range lies in the receive buffer: filled after
	 * the poison, it keeps its data where the two overlap. */
	tool_poison(membuf_image(rb, recv), rbytes / esize, dtype);
	tool_fill(coll, membuf_image(sb, send), count, dtype, op, rank, nranks, key);
	if (membuf_upload(rb, recv, rbytes) < 0 || membuf_upload(sb, send, sbytes) < 0)
		return -1;
	return 0;
}

int membuf_pair_check(const struct membuf_pair *bp, int coll, const void *recv, size_t count, int dtype, int op,
                      int root, int rank, int nranks, uint64_t key, size_t *wrong, size_t *first, double *got,
                      double *want)
{
	size_t rbytes = tool_recv_elems(coll, count, nranks) * tool_dtype_size(dtype);
	const struct membuf *rb = pair_buffer(bp, recv, rbytes);
	if (!rb || membuf_download(rb, recv, rbytes) < 0)
		return -1;
	*wrong = tool_check(coll, membuf_image(rb, recv), count, dtype, op, root, rank, nranks, key, first, got, want);
	return 0;
}
