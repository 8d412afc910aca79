/*
 * The timed sweep of dfccl-perf and `dfcclctl tune`; see bench.h. Each step
 * that differs between the backends (join, issue, group, wait, barrier,
 * leave) is one function that picks the backend's calls, so that the sweep
 * itself (bench_run, bench_measure) is written once for both.
 */
#include "bench.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

const char *bench_backend_name(int backend)
{
	return backend == BENCH_NCCL ? "nccl" : "dfccl";
}

const char *bench_mode_name(int mode)
{
	return mode == BENCH_STREAM ? "stream" : "callback";
}

/* The k in [0, n) that name(k) calls s, or -1. */
static int name_parse(const char *(*name)(int), int n, const char *s)
{
	for (int k = 0; k < n; k++)
		if (!strcmp(s, name(k)))
			return k;
	return -1;
}

int bench_backend_parse(const char *s)
{
	return name_parse(bench_backend_name, BENCH_NCCL + 1, s);
}

int bench_mode_parse(const char *s)
{
	return name_parse(bench_mode_name, BENCH_STREAM + 1, s);
}

unsigned bench_sizes(const struct bench_spec *s, struct bench_size *out)
{
	size_t elem = tool_dtype_size(s->dtype);
	unsigned n = 0;
	for (uint64_t bytes = s->min_bytes; bytes <= s->max_bytes && n < BENCH_MAX_SIZES; bytes *= (uint64_t)s->factor) {
		size_t count = tool_count_for(s->coll, (size_t)bytes, elem, s->nranks);
		if (count > 0) {
			size_t se = tool_send_elems(s->coll, count, s->nranks), re = tool_recv_elems(s->coll, count, s->nranks);
			out[n++] = (struct bench_size){count, (se > re ? se : re) * elem};
		}
		if (s->factor <= 1)
			break;
	}
	return n;
}

/* ---------------------------------------------------------------- failures outside libdfccl */

/* The reason goes to b->err, for bench_leave. */
static dfcclResult_t bench_failed(struct bench_rank *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dfcclResult_t bench_failed(struct bench_rank *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->err, sizeof(b->err), fmt, ap);
	va_end(ap);
	return dfcclUnhandledCudaError;
}

/* GPU memory, streams and events (membuf.h). */
static dfcclResult_t bench_mem_failed(struct bench_rank *b, const char *what)
{
	return bench_failed(b, "%s: %s", what, membuf_error());
}

/* An NCCL call's result. */
static dfcclResult_t bench_nccl(struct bench_rank *b, ncclResult_t r, const char *what)
{
	if (nccl_lib_check(r, b->ncomm, what) == 0)
		return dfcclSuccess;
	return bench_failed(b, "%s", nccl_lib_error());
}

/* ---------------------------------------------------------------- NCCL's calls */

static ncclDataType_t nccl_type(int dtype)
{
	static const ncclDataType_t types[dfcclNumTypes] = {
	    [dfcclInt8] = ncclInt8,       [dfcclUint8] = ncclUint8,     [dfcclInt32] = ncclInt32,
	    [dfcclUint32] = ncclUint32,   [dfcclInt64] = ncclInt64,     [dfcclUint64] = ncclUint64,
	    [dfcclFloat16] = ncclFloat16, [dfcclFloat32] = ncclFloat32, [dfcclFloat64] = ncclFloat64,
	    [dfcclBfloat16] = ncclBfloat16,
	};
	return types[dtype];
}

static ncclRedOp_t nccl_op(int op)
{
	static const ncclRedOp_t ops[dfcclNumOps] = {
	    [dfcclSum] = ncclSum, [dfcclProd] = ncclProd, [dfcclMax] = ncclMax, [dfcclMin] = ncclMin, [dfcclAvg] = ncclAvg,
	};
	return ops[op];
}

/* What a failure of nccl_issue names. */
static const char *const nccl_call_names[TOOL_NCOLLS] = {
    [TOOL_ALLREDUCE] = "ncclAllReduce", [TOOL_ALLGATHER] = "ncclAllGather",
    [TOOL_REDUCESCATTER] = "ncclReduceScatter", [TOOL_BROADCAST] = "ncclBroadcast",
    [TOOL_REDUCE] = "ncclReduce", [TOOL_SENDRECV] = "ncclSend/ncclRecv",
    [TOOL_ALLTOALL] = "ncclSend/ncclRecv of an all-to-all",
};

/* Send/recv and all-to-all as nccl-tests issues them: a group of sends and
 * receives, with the next and the previous rank, or with every rank. */
static ncclResult_t nccl_exchange(const struct bench_spec *s, int rank, const void *send, void *recv, size_t count,
                                  ncclComm_t comm, membuf_stream_t st)
{
	ncclDataType_t t = nccl_type(s->dtype);
	size_t block = count * tool_dtype_size(s->dtype);
	int n = s->nranks;
	ncclResult_t r = nccl.group_start();
	if (r != ncclSuccess)
		return r;
	if (s->coll == TOOL_SENDRECV) {
		r = nccl.send(send, count, t, (rank + 1) % n, comm, st);
		if (r == ncclSuccess)
			r = nccl.recv(recv, count, t, (rank + n - 1) % n, comm, st);
	}
	for (int p = 0; s->coll == TOOL_ALLTOALL && p < n && r == ncclSuccess; p++) {
		r = nccl.send((const char *)send + (size_t)p * block, count, t, p, comm, st);
		if (r == ncclSuccess)
			r = nccl.recv((char *)recv + (size_t)p * block, count, t, p, comm, st);
	}
	ncclResult_t e = nccl.group_end();
	return r != ncclSuccess ? r : e;
}

/* One collective of tool.h on NCCL. */
static ncclResult_t nccl_issue(const struct bench_spec *s, int rank, const void *send, void *recv, size_t count,
                               ncclComm_t comm, membuf_stream_t st)
{
	ncclDataType_t t = nccl_type(s->dtype);
	ncclRedOp_t o = nccl_op(s->op);
	switch (s->coll) {
	case TOOL_ALLREDUCE: return nccl.all_reduce(send, recv, count, t, o, comm, st);
	case TOOL_ALLGATHER: return nccl.all_gather(send, recv, count, t, comm, st);
	case TOOL_REDUCESCATTER: return nccl.reduce_scatter(send, recv, count, t, o, comm, st);
	case TOOL_BROADCAST: return nccl.broadcast(send, recv, count, t, s->root, comm, st);
	case TOOL_REDUCE: return nccl.reduce(send, recv, count, t, o, s->root, comm, st);
	default: return nccl_exchange(s, rank, send, recv, count, comm, st);
	}
}

/* ---------------------------------------------------------------- the steps, per backend */

static dfcclResult_t join_dfccl(struct bench_rank *b, size_t cap)
{
	const struct bench_spec *s = b->spec;
	int ndev = 1;
	if (s->algo)
		setenv("DFCCL_ALGO", s->algo, 1);
	dfcclResult_t r = dfcclGetDeviceCount(&ndev);
	if (r != dfcclSuccess)
		return r;
	b->device = tool_rank_device(&s->devices, b->rank, ndev);
	/* GPU buffers, and a stream whatever the buffers, need the device's
	 * CUDA context. */
	if (membuf_use_device(s->mode == BENCH_STREAM ? MEMBUF_DEVICE : s->mem, b->device) < 0)
		return bench_mem_failed(b, "selecting the GPU");
	r = dfcclSetDevice(b->device);
	if (r == dfcclSuccess)
		r = dfcclCommInitRank(&b->comm, s->nranks, s->id, b->rank);
	if (r == dfcclSuccess && membuf_pair_open(&b->bufs, s->mem, cap) < 0)
		return bench_mem_failed(b, "allocating the buffers");
	if (r == dfcclSuccess)
		r = dfcclMemAllocHost((void **)&b->cell, sizeof(*b->cell));
	return r;
}

static dfcclResult_t join_nccl(struct bench_rank *b, size_t cap)
{
	const struct bench_spec *s = b->spec;
	if (s->mode != BENCH_STREAM)
		return bench_failed(b, "NCCL has the stream form only (the callback form is dfccl's)");
	/* One GPU per rank: rank r on GPU r unless the devices say otherwise. */
	b->device = tool_rank_device(&s->devices, b->rank, s->nranks);
	if (membuf_use_device(MEMBUF_DEVICE, b->device) < 0)
		return bench_mem_failed(b, "selecting the GPU");
	dfcclResult_t r = bench_nccl(b, nccl.comm_init_rank(&b->ncomm, s->nranks, s->nccl_id, b->rank), "ncclCommInitRank");
	if (r != dfcclSuccess)
		return r;
	if (membuf_pair_open(&b->bufs, s->mem, cap) < 0)
		return bench_mem_failed(b, "allocating the buffers");
	if (membuf_alloc(MEMBUF_DEVICE, (void **)&b->cell, sizeof(*b->cell)) < 0)
		return bench_mem_failed(b, "allocating the barrier's element");
	if (!s->symmetric)
		return dfcclSuccess;
	/* Collective calls: every rank registers the same sizes in the same
	 * order. */
	r = bench_nccl(b,
	               nccl.comm_window_register(b->ncomm, b->bufs.send.ptr, cap, &b->win[0], NCCL_WIN_COLL_SYMMETRIC),
	               "ncclCommWindowRegister of the send buffer");
	if (r == dfcclSuccess)
		r = bench_nccl(b,
		               nccl.comm_window_register(b->ncomm, b->bufs.recv.ptr, cap, &b->win[1],
		                                         NCCL_WIN_COLL_SYMMETRIC),
		               "ncclCommWindowRegister of the receive buffer");
	return r;
}

static dfcclResult_t bench_issue(struct bench_rank *b, const void *send, void *recv, size_t count)
{
	const struct bench_spec *s = b->spec;
	if (s->backend == BENCH_NCCL)
		return bench_nccl(b, nccl_issue(s, b->rank, send, recv, count, b->ncomm, b->stream),
		                  nccl_call_names[s->coll]);
	return tool_issue_on(s->coll, send, recv, count, s->dtype, s->op, s->root, b->comm, b->stream);
}

static dfcclResult_t bench_group(struct bench_rank *b, bool start)
{
	if (b->spec->backend == BENCH_NCCL)
		return bench_nccl(b, start ? nccl.group_start() : nccl.group_end(),
		                  start ? "ncclGroupStart" : "ncclGroupEnd");
	return start ? dfcclGroupStart() : dfcclGroupEnd();
}

/* The communicator's asynchronous error (a non-blocking init still in
 * progress is none). */
static dfcclResult_t bench_async_error(struct bench_rank *b)
{
	if (b->spec->backend == BENCH_NCCL) {
		ncclResult_t e = ncclSuccess, r = nccl.comm_get_async_error(b->ncomm, &e);
		if (r == ncclSuccess && e != ncclInProgress)
			r = e;
		return bench_nccl(b, r, "the NCCL communicator's asynchronous error");
	}
	dfcclResult_t e = dfcclSuccess, r = dfcclCommGetAsyncError(b->comm, &e);
	return r == dfcclSuccess && e != dfcclInProgress ? e : r;
}

/* Waits until everything this rank issued has completed: in stream mode
 * by polling the stream and the communicator's asynchronous error (as
 * nccl-tests does), so that a failed collective ends the wait; once the
 * stream is done, the error is asked once more, since a failed collective
 * lets its stream go on (dfccl.h) and the failure may be the last thing
 * that happened. */
static dfcclResult_t bench_wait(struct bench_rank *b)
{
	if (b->spec->mode == BENCH_CALLBACK)
		return dfcclCommSynchronize(b->comm);
	for (;;) {
		int q = membuf_stream_query(b->stream);
		if (q < 0)
			return bench_mem_failed(b, "waiting for the stream");
		dfcclResult_t r = bench_async_error(b);
		if (r != dfcclSuccess || q > 0)
			return r;
		sched_yield();
	}
}

/* The barrier on NCCL: an all-reduce of the element in GPU memory. */
static dfcclResult_t nccl_allsum(struct bench_rank *b, int64_t v, int64_t *sum)
{
	if (membuf_put(MEMBUF_DEVICE, b->cell, &v, sizeof(v)) < 0)
		return bench_mem_failed(b, "writing the barrier's element");
	dfcclResult_t r = bench_nccl(b, nccl.all_reduce(b->cell, b->cell, 1, ncclInt64, ncclSum, b->ncomm, b->stream),
	                             "ncclAllReduce of the barrier");
	if (r == dfcclSuccess)
		r = bench_wait(b);
	if (r == dfcclSuccess && membuf_get(MEMBUF_DEVICE, sum, b->cell, sizeof(*sum)) < 0)
		return bench_mem_failed(b, "reading the barrier's element");
	return r;
}

dfcclResult_t bench_allsum(struct bench_rank *b, int64_t v, int64_t *sum)
{
	if (b->spec->backend == BENCH_NCCL)
		return nccl_allsum(b, v, sum);
	*b->cell = v;
	dfcclResult_t r = dfcclAllReduce(b->cell, b->cell, 1, dfcclInt64, dfcclSum, b->comm, NULL);
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(b->comm);
	*sum = *b->cell;
	return r;
}

static void leave_dfccl(struct bench_rank *b, dfcclResult_t r)
{
	if (b->comm && r != dfcclSuccess)
		dfcclCommAbort(b->comm);
	else if (b->comm)
		dfcclCommDestroy(b->comm);
	dfcclMemFree(b->cell);
}

static void leave_nccl(struct bench_rank *b, dfcclResult_t r)
{
	if (b->ncomm && r != dfcclSuccess) {
		nccl.comm_abort(b->ncomm);
	} else if (b->ncomm) {
		for (int k = 0; k < 2; k++)
			if (b->win[k])
				nccl.comm_window_deregister(b->ncomm, b->win[k]);
		nccl.comm_destroy(b->ncomm);
	}
	membuf_free(MEMBUF_DEVICE, b->cell);
}

/* ---------------------------------------------------------------- the compute kernel (overlap) */

/* The kernel on the rank's stream, calibrated, with the ranks' mean rounds
 * (the slowest rank sets the pace of a collective, so they should agree),
 * or the spec's. */
static dfcclResult_t bench_compute_open(struct bench_rank *b)
{
	const struct bench_spec *s = b->spec;
	int64_t sum = 0;
	if (compute_open(&b->compute, b->stream) < 0 ||
	    compute_calibrate(&b->compute, s->overlap_us, s->compute_rounds) < 0)
		return bench_failed(b, "%s", compute_error());
	if (s->compute_rounds > 0)
		return dfcclSuccess;
	dfcclResult_t r = bench_allsum(b, b->compute.rounds, &sum);
	b->compute.rounds = (uint32_t)(sum / s->nranks > 0 ? sum / s->nranks : 1);
	return r;
}

static dfcclResult_t bench_compute(struct bench_rank *b)
{
	return compute_launch(&b->compute) < 0 ? bench_failed(b, "%s", compute_error()) : dfcclSuccess;
}

/* Whether every launch of the kernel so far computed what it should. */
static dfcclResult_t bench_compute_check(struct bench_rank *b)
{
	size_t wrong = 0;
	if (compute_check(&b->compute, &wrong) < 0)
		return bench_failed(b, "%s", compute_error());
	if (wrong)
		return bench_failed(b, "the compute kernel's buffer holds %zu wrong words: not every launch ran as issued",
		                    wrong);
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- the sweep */

dfcclResult_t bench_join(struct bench_rank *b, const struct bench_spec *s, int rank)
{
	size_t elem = tool_dtype_size(s->dtype);
	/* Room for the largest size rounded up to whole blocks of every rank. */
	size_t cap = (size_t)s->max_bytes + elem * (size_t)s->nranks + 64;
	*b = (struct bench_rank){.spec = s, .rank = rank};
	dfcclResult_t r = s->backend == BENCH_NCCL ? join_nccl(b, cap) : join_dfccl(b, cap);
	if (r != dfcclSuccess)
		return r;
	if (s->mode == BENCH_STREAM && (membuf_stream_create(&b->stream) < 0 || membuf_event_create(&b->ev[0]) < 0 ||
	                                membuf_event_create(&b->ev[1]) < 0))
		return bench_mem_failed(b, "creating the stream and its events");
	if (s->overlap_us > 0 && (r = bench_compute_open(b)) != dfcclSuccess)
		return r;
	memset(b->bufs.send.img, 0, cap);
	memset(b->bufs.recv.img, 0, cap);
	if (membuf_upload(&b->bufs.send, b->bufs.send.ptr, cap) < 0 ||
	    membuf_upload(&b->bufs.recv, b->bufs.recv.ptr, cap) < 0)
		return bench_mem_failed(b, "clearing the buffers");
	return dfcclSuccess;
}

/* One batch: B collectives inside one group, or B plain calls; a batch of
 * one is the plain call, as nccl-tests issues it. */
static dfcclResult_t bench_batch(struct bench_rank *b, const void *send, void *recv, size_t count)
{
	const struct bench_spec *s = b->spec;
	bool grouped = !s->ungrouped && s->batch > 1;
	dfcclResult_t r = grouped ? bench_group(b, true) : dfcclSuccess;
	if (r != dfcclSuccess)
		return r;
	for (int i = 0; i < s->batch && r == dfcclSuccess; i++)
		r = bench_issue(b, send, recv, count);
	if (grouped) {
		dfcclResult_t e = bench_group(b, false);
		r = r != dfcclSuccess ? r : e;
	}
	return r;
}

/* What an iteration of bench_run issues. */
enum {
	RUN_BATCH = 1,   /* the batch of collectives */
	RUN_COMPUTE = 2, /* the compute kernel, first */
};

static dfcclResult_t bench_iteration(struct bench_rank *b, unsigned what, const void *send, void *recv, size_t count)
{
	dfcclResult_t r = what & RUN_COMPUTE ? bench_compute(b) : dfcclSuccess;
	if (r == dfcclSuccess && (what & RUN_BATCH))
		r = bench_batch(b, send, recv, count);
	return r;
}

/*
 * n iterations, completed: in callback mode each one waited for, timed on
 * the host clock; in stream mode back to back between two events and
 * waited for once, timed by the GPU. With us, the time per iteration; with
 * issue, the host's time per iteration to make the calls, before the wait
 * (in stream mode a full queue's wait for a free slot counts, which makes
 * it the daemon's pace once the stream is that far ahead).
 */
static dfcclResult_t bench_run(struct bench_rank *b, unsigned what, const void *send, void *recv, size_t count,
                               long n, double *us, double *issue)
{
	const struct bench_spec *s = b->spec;
	dfcclResult_t r = dfcclSuccess;
	double t0 = tool_now(), ms = 0;
	if (s->mode == BENCH_CALLBACK) {
		double issuing = 0;
		for (long i = 0; i < n && r == dfcclSuccess; i++) {
			double i0 = tool_now();
			r = bench_iteration(b, what, send, recv, count);
			issuing += tool_now() - i0;
			if (r == dfcclSuccess)
				r = bench_wait(b);
		}
		ms = (tool_now() - t0) * 1e3;
		if (issue && n > 0)
			*issue = issuing * 1e6 / (double)n;
	} else {
		if (membuf_event_record(b->ev[0], b->stream) < 0)
			return bench_mem_failed(b, "starting the stream's timer");
		for (long i = 0; i < n && r == dfcclSuccess; i++)
			r = bench_iteration(b, what, send, recv, count);
		if (issue && n > 0)
			*issue = (tool_now() - t0) * 1e6 / (double)n;
		if (r == dfcclSuccess && membuf_event_record(b->ev[1], b->stream) < 0)
			return bench_mem_failed(b, "stopping the stream's timer");
		if (r == dfcclSuccess)
			r = bench_wait(b);
		if (r == dfcclSuccess && membuf_event_elapsed(b->ev[0], b->ev[1], &ms) < 0)
			return bench_mem_failed(b, "reading the stream's timer");
	}
	if (us && n > 0)
		*us = ms * 1e3 / (double)n;
	return r;
}

dfcclResult_t bench_measure(struct bench_rank *b, const struct bench_size *z, bool inplace, struct bench_result *m)
{
	const struct bench_spec *s = b->spec;
	const void *send = b->bufs.send.ptr;
	void *recv = b->bufs.recv.ptr;
	bool overlap = s->overlap_us > 0;
	unsigned what = overlap ? RUN_COMPUTE | RUN_BATCH : RUN_BATCH;
	int64_t sum;
	*m = (struct bench_result){0};
	if (inplace && !tool_inplace(s->coll, b->bufs.recv.ptr, z->count, s->dtype, b->rank, &send, &recv))
		return dfcclSuccess;
	dfcclResult_t r = bench_run(b, what, send, recv, z->count, s->warmup, NULL, NULL);
	if (r == dfcclSuccess)
		r = bench_allsum(b, 0, &sum);
	if (r == dfcclSuccess && overlap)
		r = bench_run(b, RUN_COMPUTE, send, recv, z->count, s->iters, &m->compute_us, NULL);
	if (r == dfcclSuccess && overlap)
		r = bench_allsum(b, 0, &sum);
	if (r == dfcclSuccess)
		r = bench_run(b, what, send, recv, z->count, s->iters, &m->total_us, &m->issue_us);
	if (r != dfcclSuccess)
		return r;
	m->us = (m->total_us - m->compute_us) / s->batch;
	m->issue_us /= s->batch;
	m->valid = true;
	if (!s->check)
		return dfcclSuccess;

	/* The timed iterations ran on whatever the buffers held; the check
	 * runs once more on reference data, over a poisoned receive buffer so
	 * that an element the collective never wrote counts as wrong. */
	size_t first, wrong;
	double got, want;
	uint64_t key = tool_hash(z->count, inplace, 0xbe7c, 0);
	if (membuf_pair_stage(&b->bufs, s->coll, send, recv, z->count, s->dtype, s->op, b->rank, s->nranks, key) < 0)
		return bench_mem_failed(b, "writing the reference data");
	r = overlap ? bench_compute(b) : dfcclSuccess;
	if (r == dfcclSuccess)
		r = bench_issue(b, send, recv, z->count);
	if (r == dfcclSuccess)
		r = bench_wait(b);
	if (r == dfcclSuccess && overlap)
		r = bench_compute_check(b);
	if (r != dfcclSuccess)
		return r;
	if (membuf_pair_check(&b->bufs, s->coll, recv, z->count, s->dtype, s->op, s->root, b->rank, s->nranks, key,
	                      &wrong, &first, &got, &want) < 0)
		return bench_mem_failed(b, "reading the result");
	r = bench_allsum(b, (int64_t)wrong, &sum);
	m->wrong = (uint64_t)sum;
	return r;
}

dfcclResult_t bench_leave(struct bench_rank *b, dfcclResult_t r)
{
	const char *name = b->spec ? b->spec->name : "dfccl";
	if (r != dfcclSuccess && b->err[0])
		fprintf(stderr, "%s: rank %d: %s\n", name, b->rank, b->err);
	else if (r != dfcclSuccess)
		fprintf(stderr, "%s: rank %d: %s: %s\n", name, b->rank, dfcclGetErrorString(r), dfcclGetLastError(NULL));
	if (b->spec && b->spec->backend == BENCH_NCCL)
		leave_nccl(b, r);
	else
		leave_dfccl(b, r);
	compute_close(&b->compute);
	membuf_event_destroy(b->ev[0]);
	membuf_event_destroy(b->ev[1]);
	membuf_stream_destroy(b->stream);
	membuf_pair_close(&b->bufs);
	*b = (struct bench_rank){.spec = b->spec, .rank = b->rank};
	return r;
}
