/*
 * The timed sweep of dfccl-perf and `dfcclctl tune`; see bench.h.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

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

/* A failure outside libdfccl (GPU memory): the reason goes to b->err. */
static dfcclResult_t bench_mem_failed(struct bench_rank *b, const char *what)
{
	snprintf(b->err, sizeof(b->err), "%s: %s", what, membuf_error());
	return dfcclUnhandledCudaError;
}

dfcclResult_t bench_join(struct bench_rank *b, const struct bench_spec *s, int rank)
{
	size_t elem = tool_dtype_size(s->dtype);
	/* Room for the largest size rounded up to whole blocks of every rank. */
	size_t cap = (size_t)s->max_bytes + elem * (size_t)s->nranks + 64;
	int ndev = 1;
	*b = (struct bench_rank){.spec = s, .rank = rank};
	if (s->algo)
		setenv("DFCCL_ALGO", s->algo, 1);
	dfcclResult_t r = dfcclGetDeviceCount(&ndev);
	if (r != dfcclSuccess)
		return r;
	b->device = tool_rank_device(&s->devices, rank, ndev);
	if (membuf_use_device(s->mem, b->device) < 0)
		return bench_mem_failed(b, "selecting the GPU");
	r = dfcclSetDevice(b->device);
	if (r == dfcclSuccess)
		r = dfcclCommInitRank(&b->comm, s->nranks, s->id, rank);
	if (r == dfcclSuccess && membuf_pair_open(&b->bufs, s->mem, cap) < 0)
		return bench_mem_failed(b, "allocating the buffers");
	if (r == dfcclSuccess)
		r = dfcclMemAllocHost((void **)&b->cell, sizeof(*b->cell));
	if (r != dfcclSuccess)
		return r;
	memset(b->bufs.send.img, 0, cap);
	memset(b->bufs.recv.img, 0, cap);
	if (membuf_upload(&b->bufs.send, b->bufs.send.ptr, cap) < 0 ||
	    membuf_upload(&b->bufs.recv, b->bufs.recv.ptr, cap) < 0)
		return bench_mem_failed(b, "clearing the buffers");
	return dfcclSuccess;
}

static dfcclResult_t bench_batch(struct bench_rank *b, const void *send, void *recv, size_t count)
{
	const struct bench_spec *s = b->spec;
	dfcclGroupStart();
	for (int i = 0; i < s->batch; i++)
		tool_issue(s->coll, send, recv, count, s->dtype, s->op, s->root, b->comm);
	dfcclResult_t r = dfcclGroupEnd();
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(b->comm);
	return r;
}

dfcclResult_t bench_allsum(struct bench_rank *b, int64_t v, int64_t *sum)
{
	*b->cell = v;
	dfcclResult_t r = dfcclAllReduce(b->cell, b->cell, 1, dfcclInt64, dfcclSum, b->comm, NULL);
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(b->comm);
	*sum = *b->cell;
	return r;
}

dfcclResult_t bench_measure(struct bench_rank *b, const struct bench_size *z, bool inplace, struct bench_result *m)
{
	const struct bench_spec *s = b->spec;
	const void *send = b->bufs.send.ptr;
	void *recv = b->bufs.recv.ptr;
	int64_t sum;
	dfcclResult_t r = dfcclSuccess;
	*m = (struct bench_result){0};
	if (inplace && !tool_inplace(s->coll, b->bufs.recv.ptr, z->count, s->dtype, b->rank, &send, &recv))
		return dfcclSuccess;
	for (long i = 0; i < s->warmup && r == dfcclSuccess; i++)
		r = bench_batch(b, send, recv, z->count);
	if (r == dfcclSuccess)
		r = bench_allsum(b, 0, &sum);
	double t0 = tool_now();
	for (long i = 0; i < s->iters && r == dfcclSuccess; i++)
		r = bench_batch(b, send, recv, z->count);
	m->us = (tool_now() - t0) * 1e6 / (double)(s->iters * s->batch);
	if (r != dfcclSuccess)
		return r;
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
	r = tool_issue(s->coll, send, recv, z->count, s->dtype, s->op, s->root, b->comm);
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(b->comm);
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
	if (r != dfcclSuccess)
		fprintf(stderr, "%s: rank %d: %s: %s\n", b->spec ? b->spec->name : "dfccl", b->rank, dfcclGetErrorString(r),
		        b->err[0] ? b->err : dfcclGetLastError(NULL));
	if (b->comm && r != dfcclSuccess)
		dfcclCommAbort(b->comm);
	else if (b->comm)
		dfcclCommDestroy(b->comm);
	membuf_pair_close(&b->bufs);
	dfcclMemFree(b->cell);
	*b = (struct bench_rank){.spec = b->spec, .rank = b->rank};
	return r;
}
