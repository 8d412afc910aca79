/*
 * Stream-ordered collectives, end to end on the host engine, with a fake
 * CUDA driver whose streams are threads of the rank process.
 *
 * A stream here is a thread that runs, in order, what was queued on it:
 * writes of 64-bit words, waits until a word reaches a value (cyclic, as
 * cuStreamWaitValue64's GEQ), copies, and host functions that play the
 * compute kernels of a trainer. The fake driver (cudrv_set_ops_for_test)
 * queues cuStreamBatchMemOp's operations and cuMemcpyAsync's copies there,
 * and records the shape of each batch. Everything else about the path is
 * real: libdfccl writes the entries into the queue pair, the daemon's
 * worker watches entries that no doorbell announces, the engine takes one
 * only once "the GPU" armed it, and the completion word releases the wait.
 *
 * Covered:
 *   - every collective and send/recv, stream-ordered, 3 ranks, checked
 *     against references computed here: a producer writes the input late
 *     (so an entry taken before its stream armed it would read the old
 *     input) and a consumer takes a snapshot of the output right after
 *     the call (so a stream that did not wait would snapshot the poison
 *     written into the output before the call);
 *   - a group arms all its entries and then waits for all of them, with
 *     one batch of operations per stream;
 *   - two communicators on two streams, issued in opposite orders on the
 *     two ranks, complete;
 *   - a collective the ranks disagree on fails, the stream goes on, and
 *     dfcclCommGetAsyncError and dfcclCommSynchronize report it;
 *   - a stream that never arms its entries fills the queue: the next call
 *     fails after DFCCL_QUEUE_WAIT_MS with a sentence, and once the
 *     stream moves everything completes;
 *   - a driver without stream memory operations: dfcclNotSupported;
 *   - the library raised CUDA_DEVICE_MAX_CONNECTIONS before main;
 *   - a stream being captured into a CUDA graph is refused.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cudrv.h"
#include "dfccl.h"
#include "harness.h"
#include "stream.h"

/* ------------------------------------------------------------ the fake stream */

enum fs_kind { FS_WRITE, FS_WAIT, FS_COPY, FS_CALL };

struct fs_op {
	enum fs_kind kind;
	uint64_t *addr;
	uint64_t value;
	void *dst;
	const void *src;
	size_t bytes;
	void (*fn)(void *arg);
	void *arg;
};

#define FS_MAX_OPS 4096
#define FS_MAX_BATCHES 256

struct fake_stream {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct fs_op ops[FS_MAX_OPS];
	unsigned head, tail; /* ops[head..tail) wait to run (indices mod FS_MAX_OPS) */
	unsigned done;       /* operations run so far */
	bool stop;
	bool capturing; /* cuStreamIsCapturing says so */
	pthread_t thread;
	/* Each batch the driver got, an operation a letter: W a write, A a
	 * wait ("await"); and each copy of words (cuMemcpy2DAsync), a C a
	 * word. */
	unsigned nbatches;
	char batch[FS_MAX_BATCHES][CUDRV_STREAM_OPS_MAX + 1];
	/* When (by a counter of every batch of the process) this stream last
	 * got a batch of arms only, and of waits only. */
	unsigned arm_batch_at, wait_batch_at;
};

static void fs_run(struct fs_op *o)
{
	switch (o->kind) {
	case FS_WRITE: __atomic_store_n(o->addr, o->value, __ATOMIC_SEQ_CST); break;
	case FS_WAIT:
		while ((int64_t)(__atomic_load_n(o->addr, __ATOMIC_ACQUIRE) - o->value) < 0)
			usleep(20);
		break;
	case FS_COPY: memmove(o->dst, o->src, o->bytes); break;
	case FS_CALL: o->fn(o->arg); break;
	}
}

static void *fs_main(void *arg)
{
	struct fake_stream *s = arg;
	pthread_mutex_lock(&s->lock);
	for (;;) {
		while (s->head == s->tail && !s->stop)
			pthread_cond_wait(&s->cond, &s->lock);
		if (s->head == s->tail)
			break;
		struct fs_op o = s->ops[s->head % FS_MAX_OPS];
		pthread_mutex_unlock(&s->lock);
		fs_run(&o);
		pthread_mutex_lock(&s->lock);
		s->head++;
		s->done++;
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

static struct fake_stream *fs_new(void)
{
	struct fake_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_create(&s->thread, NULL, fs_main, s);
	return s;
}

static void fs_push(struct fake_stream *s, const struct fs_op *o)
{
	pthread_mutex_lock(&s->lock);
	while (s->tail - s->head == FS_MAX_OPS)
		pthread_cond_wait(&s->cond, &s->lock);
	s->ops[s->tail++ % FS_MAX_OPS] = *o;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static void fs_call(struct fake_stream *s, void (*fn)(void *), void *arg)
{
	struct fs_op o = {.kind = FS_CALL, .fn = fn, .arg = arg};
	fs_push(s, &o);
}

/* cudaStreamSynchronize: waits until everything queued so far ran, up to
 * timeout_ms; returns 0, or -1 on timeout. */
static int fs_sync(struct fake_stream *s, int timeout_ms)
{
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L)
		dl.tv_sec++, dl.tv_nsec -= 1000000000L;
	int rc = 0;
	pthread_mutex_lock(&s->lock);
	unsigned target = s->tail;
	while ((int)(s->head - target) < 0 && rc == 0)
		rc = pthread_cond_timedwait(&s->cond, &s->lock, &dl);
	bool ok = (int)(s->head - target) >= 0;
	pthread_mutex_unlock(&s->lock);
	return ok ? 0 : -1;
}

/* ------------------------------------------------------------ the fake driver */

static bool fd_no_memops; /* a driver without stream memory operations */

static CUresult fd_pointer_attrs(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
	(void)n, (void)attrs, (void)data, (void)p;
	return CUDA_ERROR_NOT_INITIALIZED; /* no device memory in this process */
}

static CUresult fd_host_register(void *p, size_t bytes, unsigned flags)
{
	(void)p, (void)bytes;
	return (flags & CU_MEMHOSTREGISTER_DEVICEMAP) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fd_host_unregister(void *p)
{
	(void)p;
	return CUDA_SUCCESS;
}

static CUresult fd_host_dev_ptr(CUdeviceptr *dev, void *p, unsigned flags)
{
	(void)flags;
	*dev = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
	return CUDA_SUCCESS;
}

static CUresult fd_batch(CUstream stream, unsigned count, CUstreamBatchMemOpParams *ops, unsigned flags)
{
	struct fake_stream *s = (struct fake_stream *)stream;
	/* The driver's limits: fewer than 256 operations, flags 0. */
	if (!s || count == 0 || count >= 256 || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	char seq[CUDRV_STREAM_OPS_MAX + 1];
	for (unsigned i = 0; i < count; i++) {
		int op = ops[i].waitValue.operation;
		if (op != CU_STREAM_MEM_OP_WAIT_VALUE_64 && op != CU_STREAM_MEM_OP_WRITE_VALUE_64)
			return CUDA_ERROR_INVALID_VALUE;
		if (op == CU_STREAM_MEM_OP_WAIT_VALUE_64 && ops[i].waitValue.flags != CU_STREAM_WAIT_VALUE_GEQ)
			return CUDA_ERROR_INVALID_VALUE;
		seq[i] = op == CU_STREAM_MEM_OP_WRITE_VALUE_64 ? 'W' : 'A';
	}
	seq[count] = 0;
	static unsigned batches;
	unsigned at = __atomic_add_fetch(&batches, 1, __ATOMIC_RELAXED);
	pthread_mutex_lock(&s->lock);
	if (s->nbatches < FS_MAX_BATCHES)
		memcpy(s->batch[s->nbatches++], seq, count + 1);
	if (!strchr(seq, 'A'))
		s->arm_batch_at = at;
	if (!strchr(seq, 'W'))
		s->wait_batch_at = at;
	pthread_mutex_unlock(&s->lock);
	for (unsigned i = 0; i < count; i++) {
		struct fs_op o = {
		    .kind = ops[i].waitValue.operation == CU_STREAM_MEM_OP_WRITE_VALUE_64 ? FS_WRITE : FS_WAIT,
		    .addr = (uint64_t *)(uintptr_t)ops[i].waitValue.address,
		    .value = ops[i].waitValue.value64,
		};
		fs_push(s, &o);
	}
	return CUDA_SUCCESS;
}

static CUresult fd_copy_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
	struct fs_op o = {.kind = FS_COPY, .dst = (void *)(uintptr_t)dst, .src = (const void *)(uintptr_t)src,
	                  .bytes = bytes};
	fs_push((struct fake_stream *)stream, &o);
	return CUDA_SUCCESS;
}

/* A copy of 8-byte words at a pitch, as the library asks for one: a write
 * of each word, whole. The words are read when the copy is queued, not when
 * it runs: the library copies entries' `seq` words, which change only once
 * their entries completed, and the stream's thread would otherwise read
 * lines the library writes again after a completion that reached it through
 * the daemon, an order the race detector cannot see. */
static CUresult fd_copy_2d(const CUDA_MEMCPY2D *c, CUstream stream)
{
	struct fake_stream *s = (struct fake_stream *)stream;
	if (!s || c->WidthInBytes != sizeof(uint64_t) || c->Height == 0 || c->srcMemoryType != CU_MEMORYTYPE_DEVICE || c->dstMemoryType != CU_MEMORYTYPE_DEVICE ||
	    c->srcPitch < sizeof(uint64_t) || c->dstPitch < sizeof(uint64_t) || c->srcXInBytes || c->srcY ||
	    c->dstXInBytes || c->dstY)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&s->lock);
	if (s->nbatches < FS_MAX_BATCHES) {
		/* The log holds a batch's worth of letters; a longer copy is
		 * logged short. */
		size_t n = c->Height < CUDRV_STREAM_OPS_MAX ? c->Height : CUDRV_STREAM_OPS_MAX;
		memset(s->batch[s->nbatches], 'C', n);
		s->batch[s->nbatches++][n] = 0;
	}
	pthread_mutex_unlock(&s->lock);
	for (size_t i = 0; i < c->Height; i++) {
		struct fs_op o = {.kind = FS_WRITE, .addr = (uint64_t *)(uintptr_t)(c->dstDevice + i * c->dstPitch),
		                  .value = *(const uint64_t *)(uintptr_t)(c->srcDevice + i * c->srcPitch)};
		fs_push(s, &o);
	}
	return CUDA_SUCCESS;
}

static CUresult fd_is_capturing(CUstream stream, CUstreamCaptureStatus *status)
{
	*status = ((struct fake_stream *)stream)->capturing;
	return CUDA_SUCCESS;
}

static struct cudrv_ops fake_driver;

static void fake_driver_install(bool memops)
{
	memset(&fake_driver, 0, sizeof(fake_driver));
	fake_driver.pointer_get_attributes = fd_pointer_attrs;
	fake_driver.mem_host_register = fd_host_register;
	fake_driver.mem_host_unregister = fd_host_unregister;
	fake_driver.mem_host_get_device_pointer = fd_host_dev_ptr;
	fake_driver.stream_batch_mem_op = memops ? fd_batch : NULL;
	fake_driver.memcpy_async = fd_copy_async;
	fake_driver.memcpy_2d_async = memops ? fd_copy_2d : NULL;
	fake_driver.stream_is_capturing = memops ? fd_is_capturing : NULL;
	fd_no_memops = !memops;
	cudrv_set_ops_for_test(&fake_driver);
}

/* ------------------------------------------------------------ jobs */

struct job {
	dfcclUniqueId id[2];
	int nranks;
	_Atomic int *failed; /* ranks that saw their collective fail (a page shared by every rank) */
};

#define CHECK(cond, ...)                           \
	do {                                       \
		if (!(cond))                       \
			RANK_FAIL(__VA_ARGS__);    \
	} while (0)

#define DF(call)                                                                                 \
	do {                                                                                     \
		dfcclResult_t r_ = (call);                                                       \
		if (r_ != dfcclSuccess)                                                          \
			RANK_FAIL("%s: %s (%s)", #call, dfcclGetErrorString(r_), dfcclGetLastError(NULL)); \
	} while (0)

/* A "kernel" that writes the input late: sleeps, then fills. */
struct fill {
	float *buf;
	size_t n;
	int rank, key;
	unsigned delay_us;
};

static float in_value(int key, int rank, size_t i)
{
	return (float)((key * 7 + rank * 13 + (int)(i % 97)) % 61) - 30.0f;
}

static void fill_late(void *arg)
{
	struct fill *f = arg;
	usleep(f->delay_us);
	for (size_t i = 0; i < f->n; i++)
		f->buf[i] = in_value(f->key, f->rank, i);
}

/* A "kernel" that poisons the output before the collective, and one that
 * takes a snapshot of it right after. */
struct snap {
	float *out;
	float *copy;
	size_t n;
};

static void poison(void *arg)
{
	struct snap *s = arg;
	for (size_t i = 0; i < s->n; i++)
		s->out[i] = -12345.0f;
}

static void snapshot(void *arg)
{
	struct snap *s = arg;
	memcpy(s->copy, s->out, s->n * sizeof(float));
}

static int join(struct job *j, int rank, int which, dfcclComm_t *comm)
{
	DF(dfcclSetDevice(rank % 2));
	DF(dfcclCommInitRank(comm, j->nranks, j->id[which], rank));
	return 0;
}

/* A rank's start: the fake driver (with stream memory operations or not),
 * then communicator 0 of the job. */
static int rank_begin(struct job *j, int rank, bool memops, dfcclComm_t *comm)
{
	fake_driver_install(memops);
	return join(j, rank, 0, comm);
}

/* A rank's end: nothing failed, nothing left. */
static int rank_end(int rank, dfcclComm_t comm)
{
	DF(dfcclCommSynchronize(comm));
	DF(dfcclCommDestroy(comm));
	return 0;
}

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCESCATTER, C_BROADCAST, C_REDUCE, C_SENDRECV, C_ALLTOALL, C_COUNT };
static const char *const coll_names[C_COUNT] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                                 "Reduce",    "SendRecv",  "AllToAll"};

/* The expected output element i of collective c on `rank` (count elements per rank part). */
static float expect(int c, int key, int rank, int nranks, size_t count, size_t i)
{
	float sum = 0;
	switch (c) {
	case C_ALLREDUCE:
		for (int r = 0; r < nranks; r++)
			sum += in_value(key, r, i);
		return sum;
	case C_ALLGATHER: return in_value(key, (int)(i / count), i % count);
	case C_REDUCESCATTER:
		for (int r = 0; r < nranks; r++)
			sum += in_value(key, r, (size_t)rank * count + i);
		return sum;
	case C_BROADCAST: return in_value(key, 1 % nranks, i);
	case C_REDUCE:
		for (int r = 0; r < nranks; r++)
			sum += in_value(key, r, i);
		return sum;
	case C_SENDRECV: return in_value(key, (rank + nranks - 1) % nranks, i);
	case C_ALLTOALL: {
		int from = (int)(i / count);
		return in_value(key, from, (size_t)rank * count + i % count);
	}
	}
	return 0;
}

/* Every collective, stream-ordered, each between a late producer and an
 * immediate consumer, all queued before the rank waits once at the end. */
static int rank_all_collectives(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm;
	if (rank_begin(j, rank, true, &comm))
		return 1;
	struct fake_stream *st = fs_new();
	CHECK(st, "no stream");
	int n = j->nranks;
	const size_t counts[] = {1, 33, 4096};
	const int ncounts = 3;
	struct fill fills[C_COUNT * 3];
	struct snap snaps[C_COUNT * 3];
	float *ins[C_COUNT * 3], *outs[C_COUNT * 3];
	int k = 0;
	for (int c = 0; c < C_COUNT; c++) {
		for (int ci = 0; ci < ncounts; ci++, k++) {
			size_t count = counts[ci];
			size_t nin = (c == C_REDUCESCATTER || c == C_ALLTOALL) ? count * (size_t)n : count;
			size_t nout = (c == C_ALLGATHER || c == C_ALLTOALL) ? count * (size_t)n : count;
			DF(dfcclMemAllocHost((void **)&ins[k], nin * sizeof(float)));
			DF(dfcclMemAllocHost((void **)&outs[k], nout * sizeof(float)));
			memset(ins[k], 0, nin * sizeof(float));
			fills[k] = (struct fill){ins[k], nin, rank, k + 1, 3000};
			snaps[k] = (struct snap){outs[k], calloc(nout, sizeof(float)), nout};
			CHECK(snaps[k].copy, "out of memory");
			fs_call(st, poison, &snaps[k]);
			fs_call(st, fill_late, &fills[k]);
			dfcclStream_t s = (dfcclStream_t)st;
			switch (c) {
			case C_ALLREDUCE: DF(dfcclAllReduce(ins[k], outs[k], count, dfcclFloat32, dfcclSum, comm, s)); break;
			case C_ALLGATHER: DF(dfcclAllGather(ins[k], outs[k], count, dfcclFloat32, comm, s)); break;
			case C_REDUCESCATTER:
				DF(dfcclReduceScatter(ins[k], outs[k], count, dfcclFloat32, dfcclSum, comm, s));
				break;
			case C_BROADCAST: DF(dfcclBroadcast(ins[k], outs[k], count, dfcclFloat32, 1 % n, comm, s)); break;
			case C_REDUCE: DF(dfcclReduce(ins[k], outs[k], count, dfcclFloat32, dfcclSum, 0, comm, s)); break;
			case C_SENDRECV:
				DF(dfcclGroupStart());
				DF(dfcclSend(ins[k], count, dfcclFloat32, (rank + 1) % n, comm, s));
				DF(dfcclRecv(outs[k], count, dfcclFloat32, (rank + n - 1) % n, comm, s));
				DF(dfcclGroupEnd());
				break;
			case C_ALLTOALL: DF(dfcclAllToAll(ins[k], outs[k], count, dfcclFloat32, comm, s)); break;
			}
			fs_call(st, snapshot, &snaps[k]);
		}
	}
	CHECK(fs_sync(st, 60000) == 0, "the stream did not finish within 60 s");
	dfcclResult_t async;
	DF(dfcclCommGetAsyncError(comm, &async));
	CHECK(async == dfcclSuccess, "async error %s: %s", dfcclGetErrorString(async), dfcclGetLastError(comm));
	k = 0;
	for (int c = 0; c < C_COUNT; c++) {
		for (int ci = 0; ci < ncounts; ci++, k++) {
			size_t count = counts[ci];
			if (c == C_REDUCE && rank != 0)
				continue; /* only the root's output is defined */
			for (size_t i = 0; i < snaps[k].n; i++) {
				float want = expect(c, k + 1, rank, n, count, i);
				CHECK(snaps[k].copy[i] == want, "%s of %zu: element %zu is %g, expected %g%s", coll_names[c], count,
				      i, (double)snaps[k].copy[i], (double)want,
				      snaps[k].copy[i] == -12345.0f ? " (the poison: the stream did not wait)" : "");
			}
		}
	}
	return rank_end(rank, comm);
}

/* A group of four all-reduces on one stream and two on another: one batch
 * per stream, its arms before its waits. */
static int rank_group(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm;
	if (rank_begin(arg, rank, true, &comm))
		return 1;
	struct fake_stream *sa = fs_new(), *sb = fs_new();
	CHECK(sa && sb, "no stream");
	/* The library asked the driver for a hardware queue per stream. */
	const char *conn = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
	CHECK(conn && !strcmp(conn, STREAM_CUDA_CONNECTIONS), "CUDA_DEVICE_MAX_CONNECTIONS is %s, expected %s",
	      conn ? conn : "unset", STREAM_CUDA_CONNECTIONS);
	enum { N = 6, COUNT = 64 };
	float *in[N], *out[N];
	for (int i = 0; i < N; i++) {
		DF(dfcclMemAllocHost((void **)&in[i], COUNT * sizeof(float)));
		DF(dfcclMemAllocHost((void **)&out[i], COUNT * sizeof(float)));
		for (size_t e = 0; e < COUNT; e++)
			in[i][e] = in_value(i + 50, rank, e);
	}
	DF(dfcclGroupStart());
	for (int i = 0; i < N; i++)
		DF(dfcclAllReduce(in[i], out[i], COUNT, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)(i < 4 ? sa : sb)));
	DF(dfcclGroupEnd());
	CHECK(fs_sync(sa, 30000) == 0 && fs_sync(sb, 30000) == 0, "the streams did not finish");
	for (int i = 0; i < N; i++)
		for (size_t e = 0; e < COUNT; e++) {
			float want = 0;
			for (int r = 0; r < j->nranks; r++)
				want += in_value(i + 50, r, e);
			CHECK(out[i][e] == want, "all-reduce %d element %zu: %g, expected %g", i, e, (double)out[i][e],
			      (double)want);
		}
	/* Two streams: each stream's arms in one batch, queued before either
	 * stream's waits (so streams sharing a hardware queue arm the whole
	 * group first); each stream's entries in a row are a group of the
	 * queue, waited for once. */
	CHECK(sa->nbatches == 2 && !strcmp(sa->batch[0], "WWWW") && !strcmp(sa->batch[1], "A"),
	      "stream A got %u batches, \"%s\" first; expected its 4 arms, then one wait", sa->nbatches,
	      sa->batch[0]);
	CHECK(sb->nbatches == 2 && !strcmp(sb->batch[0], "WW") && !strcmp(sb->batch[1], "A"),
	      "stream B got %u batches, \"%s\" first; expected its 2 arms, then one wait", sb->nbatches,
	      sb->batch[0]);
	CHECK(sa->wait_batch_at > sb->arm_batch_at && sb->wait_batch_at > sa->arm_batch_at,
	      "a stream's waits were queued before the other stream's arms");
	/* One stream: its arms and waits in one batch. */
	DF(dfcclGroupStart());
	for (int i = 0; i < 3; i++)
		DF(dfcclAllReduce(in[i], out[i], COUNT, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sa));
	DF(dfcclGroupEnd());
	CHECK(fs_sync(sa, 30000) == 0, "the stream did not finish");
	CHECK(sa->nbatches == 3 && !strcmp(sa->batch[2], "WWWA"),
	      "a group on one stream: expected one batch \"WWWA\", got \"%s\"", sa->batch[sa->nbatches - 1]);
	/* A stream being captured into a graph is refused, and nothing queued. */
	sb->capturing = true;
	dfcclResult_t r = dfcclAllReduce(in[0], out[0], COUNT, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sb);
	CHECK(r == dfcclNotSupported && strstr(dfcclGetLastError(comm), "captured into a CUDA graph"),
	      "a capturing stream: %s (%s), expected dfcclNotSupported", dfcclGetErrorString(r), dfcclGetLastError(comm));
	CHECK(sb->nbatches == 2, "a capturing stream got %u batches", sb->nbatches);
	sb->capturing = false;
	/* A buffer off its elements' boundaries is refused with the reason,
	 * and nothing queued. */
	r = dfcclAllReduce((const char *)in[0] + 2, out[0], 4, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sb);
	CHECK(r == dfcclInvalidArgument && strstr(dfcclGetLastError(comm), "not aligned to its elements"),
	      "a misaligned sendbuff: %s (%s), expected dfcclInvalidArgument", dfcclGetErrorString(r),
	      dfcclGetLastError(comm));
	CHECK(sb->nbatches == 2, "a refused call queued work: %u batches", sb->nbatches);
	/* Buffers that overlap other than in NCCL's in-place layout (the same
	 * buffer; this rank's block) are refused with the reason, and nothing
	 * queued; test_collectives runs the in-place layouts themselves. */
	const int other = 1 - rank;
	const char *says = "overlap but are not in place (sendbuff = recvbuff";
	r = dfcclAllReduce(in[0], in[0] + 4, 8, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sb);
	CHECK(r == dfcclInvalidArgument && strstr(dfcclGetLastError(comm), says),
	      "an all-reduce whose recvbuff starts inside its sendbuff: %s (%s)", dfcclGetErrorString(r),
	      dfcclGetLastError(comm));
	/* The root's broadcast (each rank names itself: refused before any
	 * rank's entry exists). */
	r = dfcclBroadcast(in[1] + 1, in[1], 8, dfcclFloat32, rank, comm, (dfcclStream_t)sb);
	CHECK(r == dfcclInvalidArgument && strstr(dfcclGetLastError(comm), says),
	      "a root's broadcast whose buffers overlap: %s (%s)", dfcclGetErrorString(r), dfcclGetLastError(comm));
	says = "for all-gather, sendbuff = recvbuff + rank * sendcount elements";
	r = dfcclAllGather(in[2] + 8 * other, in[2], 8, dfcclFloat32, comm, (dfcclStream_t)sb);
	CHECK(r == dfcclInvalidArgument && strstr(dfcclGetLastError(comm), says),
	      "an all-gather whose sendbuff is the other rank's block of recvbuff: %s (%s)", dfcclGetErrorString(r),
	      dfcclGetLastError(comm));
	says = "for reduce-scatter, recvbuff = sendbuff + rank * recvcount elements";
	r = dfcclReduceScatter(in[3], in[3] + 8 * other, 8, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sb);
	CHECK(r == dfcclInvalidArgument && strstr(dfcclGetLastError(comm), says),
	      "a reduce-scatter whose recvbuff is the other rank's block of sendbuff: %s (%s)", dfcclGetErrorString(r),
	      dfcclGetLastError(comm));
	r = dfcclAllToAll(in[4], in[4] + 4, 8, dfcclFloat32, comm, (dfcclStream_t)sb);
	CHECK(r == dfcclInvalidArgument && strstr(dfcclGetLastError(comm), "all-to-all needs two separate buffers"),
	      "an all-to-all whose buffers overlap: %s (%s)", dfcclGetErrorString(r), dfcclGetLastError(comm));
	CHECK(sb->nbatches == 2, "a refused call queued work: %u batches", sb->nbatches);
	/* Outside a group: the arm and the wait, in one batch. */
	DF(dfcclAllReduce(in[0], out[0], COUNT, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sa));
	CHECK(fs_sync(sa, 30000) == 0, "the stream did not finish");
	CHECK(sa->nbatches == 4 && !strcmp(sa->batch[3], "WA"),
	      "a call outside a group: expected one batch \"WA\", got %u batches, the last \"%s\"", sa->nbatches,
	      sa->batch[sa->nbatches - 1]);
	/* A group whose last entry completes first: a small all-reduce after
	 * one of 16 MiB, which takes several of the engine's visits. The
	 * stream waits for the last's word alone, which the engine writes
	 * only once the large one completed too, so a snapshot queued after
	 * the group sees both results (a wait that let the stream go on
	 * early would copy the poison). */
	enum { BIG = 4 << 20 };
	float *big_in, *big_out;
	DF(dfcclMemAllocHost((void **)&big_in, BIG * sizeof(float)));
	DF(dfcclMemAllocHost((void **)&big_out, BIG * sizeof(float)));
	for (size_t e = 0; e < BIG; e++)
		big_in[e] = in_value(70, rank, e);
	struct snap sbig = {big_out, malloc(BIG * sizeof(float)), BIG};
	struct snap ssmall = {out[5], malloc(COUNT * sizeof(float)), COUNT};
	CHECK(sbig.copy && ssmall.copy, "out of memory");
	fs_call(sa, poison, &sbig);
	fs_call(sa, poison, &ssmall);
	DF(dfcclGroupStart());
	DF(dfcclAllReduce(big_in, big_out, BIG, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sa));
	DF(dfcclAllReduce(in[5], out[5], COUNT, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sa));
	DF(dfcclGroupEnd());
	fs_call(sa, snapshot, &sbig);
	fs_call(sa, snapshot, &ssmall);
	CHECK(fs_sync(sa, 30000) == 0, "the stream did not finish");
	CHECK(!strcmp(sa->batch[sa->nbatches - 1], "WWA"), "a group of two: expected one batch \"WWA\", got \"%s\"",
	      sa->batch[sa->nbatches - 1]);
	for (int g = 0; g < 2; g++) {
		const struct snap *sn = g ? &ssmall : &sbig;
		const int key = g ? 5 + 50 : 70;
		for (size_t e = 0; e < sn->n; e++) {
			float want = 0;
			for (int rk = 0; rk < j->nranks; rk++)
				want += in_value(key, rk, e);
			CHECK(sn->copy[e] == want, "the group's %s all-reduce, element %zu: %g, expected %g%s",
			      g ? "small, last" : "large, first", e, (double)sn->copy[e], (double)want,
			      sn->copy[e] == -12345.0f ? " (the poison: the stream did not wait for the whole group)" : "");
		}
	}
	free(sbig.copy);
	free(ssmall.copy);
	DF(dfcclMemFree(big_in));
	DF(dfcclMemFree(big_out));
	/* A group whose calls alternate between the two streams: each
	 * stream's entries, not in a row in the queue, are still one group of
	 * it, waited for once. */
	unsigned fa = sa->nbatches, fb = sb->nbatches;
	for (int i = 0; i < 4; i++)
		for (size_t e = 0; e < COUNT; e++)
			out[i][e] = -12345.0f;
	DF(dfcclGroupStart());
	for (int i = 0; i < 4; i++)
		DF(dfcclAllReduce(in[i], out[i], COUNT, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)(i % 2 ? sb : sa)));
	DF(dfcclGroupEnd());
	CHECK(fs_sync(sa, 30000) == 0 && fs_sync(sb, 30000) == 0, "the streams did not finish");
	for (int i = 0; i < 4; i++)
		for (size_t e = 0; e < COUNT; e++) {
			float want = 0;
			for (int rk = 0; rk < j->nranks; rk++)
				want += in_value(i + 50, rk, e);
			CHECK(out[i][e] == want, "alternating group, all-reduce %d element %zu: %g, expected %g", i, e,
			      (double)out[i][e], (double)want);
		}
	CHECK(sa->nbatches == fa + 2 && !strcmp(sa->batch[fa], "WW") && !strcmp(sa->batch[fa + 1], "A"),
	      "alternating group, stream A: expected its 2 arms, then one wait; got %u batches, \"%s\" first",
	      sa->nbatches - fa, sa->batch[fa]);
	CHECK(sb->nbatches == fb + 2 && !strcmp(sb->batch[fb], "WW") && !strcmp(sb->batch[fb + 1], "A"),
	      "alternating group, stream B: expected its 2 arms, then one wait; got %u batches, \"%s\" first",
	      sb->nbatches - fb, sb->batch[fb]);
	/* Larger groups on one stream: entries in a row are armed by copies
	 * of their sequence numbers (C), STREAM_ARM_COPY_MIN or more at a
	 * time (two copies, or a copy and writes, where a group's slots wrap
	 * around the queue's end), then waited for. Three groups, so that one
	 * is likely to wrap. */
	enum { G = 40 };
	float *gout[G];
	for (int i = 0; i < G; i++)
		DF(dfcclMemAllocHost((void **)&gout[i], COUNT * sizeof(float)));
	size_t copied = 0;
	for (int round = 0; round < 3; round++) {
		unsigned first = sa->nbatches;
		for (int i = 0; i < G; i++)
			for (size_t e = 0; e < COUNT; e++)
				gout[i][e] = -12345.0f;
		DF(dfcclGroupStart());
		for (int i = 0; i < G; i++)
			DF(dfcclAllReduce(in[i % N], gout[i], COUNT, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)sa));
		DF(dfcclGroupEnd());
		CHECK(fs_sync(sa, 30000) == 0, "the stream did not finish a group of %d", G);
		for (int i = 0; i < G; i++)
			for (size_t e = 0; e < COUNT; e++) {
				float want = 0;
				for (int q = 0; q < j->nranks; q++)
					want += in_value(i % N + 50, q, e);
				CHECK(gout[i][e] == want, "group of %d, all-reduce %d element %zu: %g, expected %g", G, i, e,
				      (double)gout[i][e], (double)want);
			}
		char all[8 * (CUDRV_STREAM_OPS_MAX + 1)] = "";
		for (unsigned k = first; k < sa->nbatches; k++) {
			size_t len = strlen(sa->batch[k]);
			CHECK(sa->batch[k][0] != 'C' || len >= STREAM_ARM_COPY_MIN,
			      "a copy armed %zu entries, fewer than STREAM_ARM_COPY_MIN", len);
			copied += sa->batch[k][0] == 'C' ? len : 0;
			strncat(all, sa->batch[k], sizeof(all) - strlen(all) - 1);
		}
		/* Half a queue armed at a time, each half one group of the
		 * queue or two (where it wraps): a wait each. */
		size_t arms = strspn(all, "CW"), waits = strspn(all + arms, "A");
		CHECK(arms == G && waits >= 1 && waits <= 2 * (G / 8 + 1) && all[arms + waits] == 0,
		      "a group of %d on one stream: expected its %d arms, then a wait per group of the queue; got \"%s\"",
		      G, G, all);
	}
	/* The test's queue pairs are small (a group arms half a queue at a
	 * time, and a half may wrap around), but not all halves wrap. */
	CHECK(copied >= STREAM_ARM_COPY_MIN, "no group's arms were copied (%zu entries)", copied);
	for (int i = 0; i < G; i++)
		DF(dfcclMemFree(gout[i]));
	DF(dfcclCommDestroy(comm));
	return 0;
}

/* Two communicators on two streams, in opposite orders on the two ranks. */
static int rank_orders(void *arg, int rank)
{
	struct job *j = arg;
	fake_driver_install(true);
	dfcclComm_t comm[2];
	if (join(j, rank, 0, &comm[0]) || join(j, rank, 1, &comm[1]))
		return 1;
	struct fake_stream *st[2] = {fs_new(), fs_new()};
	CHECK(st[0] && st[1], "no stream");
	enum { ITERS = 20, COUNT = 256 };
	float *in[2], *out[2][ITERS];
	for (int c = 0; c < 2; c++) {
		DF(dfcclMemAllocHost((void **)&in[c], COUNT * sizeof(float)));
		for (size_t e = 0; e < COUNT; e++)
			in[c][e] = in_value(c + 90, rank, e);
		for (int it = 0; it < ITERS; it++)
			DF(dfcclMemAllocHost((void **)&out[c][it], COUNT * sizeof(float)));
	}
	for (int it = 0; it < ITERS; it++)
		for (int k = 0; k < 2; k++) {
			int c = rank == 0 ? k : 1 - k;
			DF(dfcclAllReduce(in[c], out[c][it], COUNT, dfcclFloat32, dfcclSum, comm[c], (dfcclStream_t)st[c]));
		}
	CHECK(fs_sync(st[0], 60000) == 0 && fs_sync(st[1], 60000) == 0, "the streams did not finish");
	for (int c = 0; c < 2; c++)
		for (int it = 0; it < ITERS; it++)
			for (size_t e = 0; e < COUNT; e++) {
				float want = 0;
				for (int r = 0; r < j->nranks; r++)
					want += in_value(c + 90, r, e);
				CHECK(out[c][it][e] == want, "communicator %d, iteration %d, element %zu: %g, expected %g", c, it,
				      e, (double)out[c][it][e], (double)want);
			}
	DF(dfcclCommDestroy(comm[0]));
	DF(dfcclCommDestroy(comm[1]));
	return 0;
}

/* The ranks disagree on a count: the collective fails, the stream goes on. */
static int rank_mismatch(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm;
	if (rank_begin(arg, rank, true, &comm))
		return 1;
	struct fake_stream *st = fs_new();
	float *buf;
	DF(dfcclMemAllocHost((void **)&buf, 64 * sizeof(float)));
	DF(dfcclAllReduce(buf, buf, rank == 0 ? 16 : 32, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)st));
	CHECK(fs_sync(st, 30000) == 0, "the stream did not go on after the failed collective");
	dfcclResult_t async = dfcclSuccess;
	for (int i = 0; i < 200 && async == dfcclSuccess; i++) {
		DF(dfcclCommGetAsyncError(comm, &async));
		if (async == dfcclSuccess)
			usleep(10000);
	}
	CHECK(async == dfcclInvalidUsage, "dfcclCommGetAsyncError: %s, expected dfcclInvalidUsage",
	      dfcclGetErrorString(async));
	CHECK(strstr(dfcclGetLastError(comm), "AllReduce"), "the error does not name the collective: %s",
	      dfcclGetLastError(comm));
	dfcclResult_t r = dfcclCommSynchronize(comm);
	CHECK(r == dfcclInvalidUsage, "dfcclCommSynchronize: %s, expected the same failure", dfcclGetErrorString(r));
	/* No rank aborts before every rank has its failure: an abort that
	 * reaches a peer's worker before the peer's task has read the posts
	 * fails that collective as aborted, which is right, but not what this
	 * test looks for. */
	atomic_fetch_add(j->failed, 1);
	for (int i = 0; i < 10000 && atomic_load(j->failed) < j->nranks; i++)
		usleep(1000);
	dfcclCommAbort(comm);
	return 0;
}

/* One rank whose stream is held: the queue (16 entries) fills, the next
 * call fails after DFCCL_QUEUE_WAIT_MS; released, everything completes. */
static volatile int gate_open;

static void gate(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&gate_open, __ATOMIC_ACQUIRE))
		usleep(1000);
}

static int rank_queue_full(void *arg, int rank)
{
	struct job *j = arg;
	setenv("DFCCL_QUEUE_WAIT_MS", "300", 1);
	fake_driver_install(true);
	dfcclComm_t comm;
	if (join(j, rank, 0, &comm))
		return 1;
	struct fake_stream *st = fs_new();
	float *buf;
	DF(dfcclMemAllocHost((void **)&buf, 16 * sizeof(float)));
	for (int e = 0; e < 16; e++)
		buf[e] = 1.0f;
	fs_call(st, gate, NULL);
	int i = 0;
	dfcclResult_t r = dfcclSuccess;
	uint64_t t0 = now_ms(), t1 = 0;
	for (; i < 64 && r == dfcclSuccess; i++) {
		t1 = now_ms();
		r = dfcclAllReduce(buf, buf, 16, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)st);
	}
	uint64_t waited = now_ms() - t1;
	CHECK(r == dfcclTimeout, "call %d: %s, expected dfcclTimeout once the queue is full", i,
	      dfcclGetErrorString(r));
	CHECK(i == 17, "the queue of 16 entries took %d calls before one waited", i - 1);
	CHECK(waited >= 250 && waited < 5000, "the full queue made the call wait %llu ms, expected about 300",
	      (unsigned long long)waited);
	CHECK(strstr(dfcclGetLastError(comm), "stayed full"), "unexpected sentence: %s", dfcclGetLastError(comm));
	(void)t0;
	__atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
	CHECK(fs_sync(st, 30000) == 0, "the stream did not finish once released");
	/* 16 in-place all-reduces of ones on one rank: still ones. */
	for (int e = 0; e < 16; e++)
		CHECK(buf[e] == 1.0f, "element %d is %g after 16 one-rank all-reduces", e, (double)buf[e]);
	return rank_end(rank, comm);
}

/* A driver without stream memory operations. */
static int rank_no_memops(void *arg, int rank)
{
	dfcclComm_t comm;
	if (rank_begin(arg, rank, false, &comm))
		return 1;
	float *buf;
	DF(dfcclMemAllocHost((void **)&buf, 16 * sizeof(float)));
	dfcclResult_t r = dfcclAllReduce(buf, buf, 16, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)(uintptr_t)0x10);
	CHECK(r == dfcclNotSupported, "%s, expected dfcclNotSupported", dfcclGetErrorString(r));
	CHECK(strstr(dfcclGetLastError(comm), "stream memory operations"), "unexpected sentence: %s",
	      dfcclGetLastError(comm));
	/* The callback form still works. */
	DF(dfcclAllReduce(buf, buf, 16, dfcclFloat32, dfcclSum, comm, NULL));
	return rank_end(rank, comm);
}

/* ------------------------------------------------------------ the tests */

static int run_job(int nranks, int (*fn)(void *, int), int timeout_ms)
{
	struct job j = {.nranks = nranks};
	if (dfcclGetUniqueId(&j.id[0]) != dfcclSuccess || dfcclGetUniqueId(&j.id[1]) != dfcclSuccess)
		return -1;
	j.failed = mmap(NULL, sizeof(*j.failed), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (j.failed == MAP_FAILED)
		return -1;
	pid_t pids[8];
	for (int r = 0; r < nranks; r++)
		pids[r] = child_run(fn, &j, r);
	int bad = 0;
	for (int r = 0; r < nranks; r++) {
		int rc = child_wait(pids[r], timeout_ms);
		if (rc != 0) {
			fprintf(stderr, "rank %d exited with %d\n", r, rc);
			bad++;
		}
	}
	munmap((void *)j.failed, sizeof(*j.failed));
	return bad;
}

/* One job of rank processes against the test's daemon. */
struct job_case {
	int nranks;
	int (*fn)(void *arg, int rank);
	int timeout_ms;
};

static struct daemon_proc dfccld;

static void run_case(void **state)
{
	const struct job_case *c = *state;
	if (run_job(c->nranks, c->fn, c->timeout_ms) != 0) {
		daemon_dump_log(&dfccld);
		fail();
	}
}

static int setup(void **state)
{
	(void)state;
	return daemon_start(&dfccld, 2, "--sq-entries", "16", NULL) < 0 ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	return daemon_stop(&dfccld) == 0 ? 0 : -1;
}

#define JOB_TEST(name, nranks, fn, timeout_ms) \
	{#name, run_case, NULL, NULL, &(struct job_case){nranks, fn, timeout_ms}}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    JOB_TEST(test_all_collectives, 3, rank_all_collectives, 120000),
	    JOB_TEST(test_group, 2, rank_group, 60000),
	    JOB_TEST(test_orders, 2, rank_orders, 60000),
	    JOB_TEST(test_mismatch, 2, rank_mismatch, 60000),
	    JOB_TEST(test_queue_full, 1, rank_queue_full, 60000),
	    JOB_TEST(test_no_memops, 1, rank_no_memops, 30000),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
