/*
 * Host and GPU buffers of the tools and the GPU tests; see membuf.h. The
 * CUDA runtime is called only in a build with a CUDA toolkit
 * (DFCCL_HAVE_CUDA); elsewhere the GPU kind fails with a message.
 */
#include "membuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef DFCCL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "dfccl.h"
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

static const char *const kind_names[MEMBUF_NKINDS] = {[MEMBUF_HOST] = "host", [MEMBUF_DEVICE] = "device"};

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

/* ---------------------------------------------------------------- GPU memory */

#ifdef DFCCL_HAVE_CUDA

int membuf_require(int kind)
{
	if (kind == MEMBUF_HOST || kind == MEMBUF_DEVICE)
		return 0;
	set_error("unknown kind of memory %d", kind);
	return -1;
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

#else /* no CUDA toolkit at build time */

static int no_cuda(void)
{
	set_error("GPU buffers are not available: built without CUDA (no CUDA toolkit was found when dfccl was "
	          "built); rebuild with a toolkit, or use host buffers");
	return -1;
}

int membuf_require(int kind)
{
	if (kind == MEMBUF_HOST)
		return 0;
	if (kind == MEMBUF_DEVICE)
		return no_cuda();
	set_error("unknown kind of memory %d", kind);
	return -1;
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

#endif /* DFCCL_HAVE_CUDA */

/* ---------------------------------------------------------------- either kind */

int membuf_use_device(int kind, int device)
{
	return kind == MEMBUF_DEVICE ? dev_use(device) : 0;
}

int membuf_alloc(int kind, void **p, size_t size)
{
	*p = NULL;
	if (kind == MEMBUF_DEVICE)
		return dev_alloc(p, size);
	dfcclResult_t r = dfcclMemAlloc(p, size);
	if (r == dfcclSuccess)
		return 0;
	set_error("dfcclMemAlloc of %zu bytes: %s", size, dfcclGetLastError(NULL));
	return -1;
}

void membuf_free(int kind, void *p)
{
	if (!p)
		return;
	if (kind == MEMBUF_DEVICE)
		dev_free(p);
	else
		dfcclMemFree(p);
}

int membuf_put(int kind, void *dst, const void *src, size_t n)
{
	if (kind == MEMBUF_DEVICE)
		return dev_put(dst, src, n);
	memmove(dst, src, n);
	return 0;
}

int membuf_get(int kind, void *dst, const void *src, size_t n)
{
	if (kind == MEMBUF_DEVICE)
		return dev_get(dst, src, n);
	memmove(dst, src, n);
	return 0;
}

int membuf_sync(int kind)
{
	return kind == MEMBUF_DEVICE ? dev_sync() : 0;
}

int membuf_gpu_count(void)
{
	if (membuf_require(MEMBUF_DEVICE) < 0)
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
	if (kind == MEMBUF_HOST) {
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
	if (b->kind == MEMBUF_HOST || n == 0)
		return 0;
	return membuf_put(b->kind, (void *)p, membuf_image(b, p), n);
}

int membuf_download(const struct membuf *b, const void *p, size_t n)
{
	if (b->kind == MEMBUF_HOST || n == 0)
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
