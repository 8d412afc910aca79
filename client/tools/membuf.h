/*
 * Buffers of the tools and the GPU tests, of four kinds, each with a host
 * image through which reference data goes in and results come out:
 *   - host: host shared memory the daemon can reach (dfcclMemAllocHost, on
 *     either engine);
 *   - device: cudaMalloc on the calling thread's CUDA device, which
 *     libdfccl registers with the daemon (legacy CUDA IPC) the first time a
 *     collective names it;
 *   - vmm: a VMM allocation as an application that shares it with another
 *     process makes it: cuMemCreate exportable as a POSIX file descriptor,
 *     mapped with cuMemMap into an address range of its own with read-write
 *     access for this GPU, registered by libdfccl through that descriptor;
 *   - memalloc: dfcclMemAlloc's device memory, which the daemon allocates
 *     and owns (CUDA engine only: the host engine's dfcclMemAlloc gives
 *     host memory, which membuf_alloc refuses for this kind);
 *   - nccl: ncclMemAlloc's memory, which NCCL can register as a symmetric
 *     window (NCCL loaded with nccl_lib_open first: nccl_lib.h).
 * The last four are GPU memory (membuf_on_gpu): the CPU never dereferences
 * them.
 *
 * A host buffer is its own image: uploads and downloads do nothing. A GPU
 * buffer has a malloc'd image of its size; membuf_upload copies a range of
 * the image to the GPU and waits until it has landed, because the daemon
 * reads the buffer from another process with no stream order to this one
 * (the data must be in place before the collective is issued, as a trainer
 * synchronizes before a NULL-stream call); membuf_download copies a range
 * back.
 *
 * GPU memory needs a build with a CUDA toolkit. Without one, every GPU
 * operation fails with a message saying so, and membuf_require() tells a
 * tool before it starts any rank. VMM allocations reach the driver's calls
 * through the CUDA runtime (cudaGetDriverEntryPointByVersion), so nothing
 * links libcuda and a program starts, to say what it lacks, on machines
 * without one. CUDA is initialised by the first call that needs it, never
 * earlier: a process that forks rank processes must not touch CUDA before
 * the fork (a CUDA context does not survive fork(), and the children would
 * inherit a broken driver state).
 *
 * The module also holds the few other CUDA runtime calls of the tools: a
 * stream of their own for the stream-ordered form of the collectives, and
 * events that time the work on it.
 *
 * Functions return 0 or -1; after -1, membuf_error() is a sentence saying
 * what failed, for the caller's message.
 */
#ifndef DFCCL_MEMBUF_H
#define DFCCL_MEMBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum membuf_kind {
	MEMBUF_HOST,     /* dfcclMemAllocHost */
	MEMBUF_DEVICE,   /* cudaMalloc */
	MEMBUF_VMM,      /* cuMemCreate exportable as a POSIX fd, cuMemMap'd */
	MEMBUF_MEMALLOC, /* dfcclMemAlloc's device memory (CUDA engine) */
	MEMBUF_NCCL,     /* ncclMemAlloc */
	MEMBUF_NKINDS
};

/* "host", "device", "vmm", "memalloc", "nccl"; the kind or -1. */
const char *membuf_kind_name(int kind);
int membuf_kind_parse(const char *s);

/* Whether kind is GPU memory (device, vmm, memalloc, nccl). */
bool membuf_on_gpu(int kind);

/* 0 if this build can allocate buffers of kind; else -1, and
 * membuf_error() says why (a build without CUDA for GPU memory, NCCL not
 * loaded or too old for nccl memory). */
int membuf_require(int kind);

/* What the last failure of this process's membuf calls was. */
const char *membuf_error(void);

/*
 * Makes GPU `device` the calling thread's CUDA device and creates its
 * context, for GPU memory; does nothing for host memory. Memalloc buffers
 * also need dfcclSetDevice(device) before they are allocated (dfcclMemAlloc
 * allocates on libdfccl's device). The index is a CUDA ordinal, the same
 * number dfcclSetDevice takes in a process that sees GPUs: libdfccl finds
 * the daemon's device by that GPU's PCI bus id, whatever
 * CUDA_VISIBLE_DEVICES the caller runs with.
 */
int membuf_use_device(int kind, int device);

/* One allocation of kind, and copies between it and host memory
 * (membuf_put waits until the data has landed). */
int membuf_alloc(int kind, void **p, size_t size);
void membuf_free(int kind, void *p);
int membuf_put(int kind, void *dst, const void *src, size_t n);
int membuf_get(int kind, void *dst, const void *src, size_t n);

/* A device-wide synchronization (cudaDeviceSynchronize) for GPU memory;
 * nothing for host memory. */
int membuf_sync(int kind);

/* How many GPUs CUDA sees, asked in a child process so that the caller
 * stays free of CUDA for the ranks it forks; -1 if CUDA cannot be used
 * (no driver, no GPU, or a build without CUDA). */
int membuf_gpu_count(void);

/*
 * A stream of the calling thread's CUDA device that does not synchronize
 * with the legacy default stream (cudaStreamNonBlocking, as nccl-tests
 * uses), and events on it. membuf_stream_query is 1 once everything issued
 * on the stream has completed, 0 while not, -1 on an error (of the stream's
 * work too). membuf_event_elapsed waits for `stop` and gives the
 * milliseconds from `start` to it. The *_destroy calls take NULL.
 */
typedef struct CUstream_st *membuf_stream_t;
typedef struct CUevent_st *membuf_event_t;

int membuf_stream_create(membuf_stream_t *s);
void membuf_stream_destroy(membuf_stream_t s);
int membuf_stream_query(membuf_stream_t s);
int membuf_event_create(membuf_event_t *e);
void membuf_event_destroy(membuf_event_t e);
int membuf_event_record(membuf_event_t e, membuf_stream_t s);
int membuf_event_elapsed(membuf_event_t start, membuf_event_t stop, double *ms);

/* A buffer and its host image. */
struct membuf {
	int kind;
	size_t size;
	char *ptr; /* what collectives get */
	char *img; /* the host image: ptr itself for host memory */
};

#define MEMBUF_INIT {0}

int membuf_open(struct membuf *b, int kind, size_t size);
void membuf_close(struct membuf *b); /* a closed or MEMBUF_INIT buffer: nothing */

/* Whether [p, p + n) lies inside b. */
bool membuf_holds(const struct membuf *b, const void *p, size_t n);

/* Where p, an address inside b, is in b's image. */
void *membuf_image(const struct membuf *b, const void *p);

/* Copies [p, p + n) of b from its image to the buffer, or back. */
int membuf_upload(const struct membuf *b, const void *p, size_t n);
int membuf_download(const struct membuf *b, const void *p, size_t n);

/* The two buffers of a collective, of one kind and size. An in-place
 * call's pointers both lie in recv (tool_inplace). */
struct membuf_pair {
	struct membuf send, recv;
};

#define MEMBUF_PAIR_INIT {MEMBUF_INIT, MEMBUF_INIT}

int membuf_pair_open(struct membuf_pair *bp, int kind, size_t size);
void membuf_pair_close(struct membuf_pair *bp);

/*
 * Prepares rank's buffers for collective (coll, key) of tool.h, whose call
 * gets `send` and `recv` (inside bp): the receive range is poisoned, the
 * send range filled with the reference data, in the images, and both are
 * uploaded.
 */
int membuf_pair_stage(const struct membuf_pair *bp, int coll, const void *send, const void *recv, size_t count,
                      int dtype, int op, int rank, int nranks, uint64_t key);

/*
 * After the collective: downloads the receive range and checks it against
 * the reference (tool_check): *wrong elements, the first of them at *first
 * with the value found and expected. -1 only when the range could not be
 * read.
 */
int membuf_pair_check(const struct membuf_pair *bp, int coll, const void *recv, size_t count, int dtype, int op,
                      int root, int rank, int nranks, uint64_t key, size_t *wrong, size_t *first, double *got,
                      double *want);

#endif /* DFCCL_MEMBUF_H */
