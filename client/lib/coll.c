/*
 * Collectives, send/recv and group calls; see coll.h.
 *
 * The group state is per thread, as NCCL's is: a group collects the calls of
 * the thread that opened it.
 */
#include "coll.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "errors.h"
#include "mem.h"
#include "qp.h"

/* One call, ready to submit. */
struct coll_op {
	struct dfcclComm *comm;
	struct dfccl_sqe sqe;
	struct qp_ticket ticket; /* once submitted */
};

/* What one collective call asked for. */
struct coll_args {
	unsigned opcode;
	const void *send;
	void *recv;
	size_t count;
	int dtype;
	int redop; /* for the reducing operations */
	int peer;  /* root (Broadcast, Reduce) or peer rank (Send, Recv) */
	struct dfcclComm *comm;
	dfcclStream_t stream;
};

struct coll_group {
	int depth;
	struct coll_op *ops;
	size_t n;
	size_t cap;
	dfcclResult_t error;   /* first failed call inside the group */
	char message[1024];    /* its last error */
};

static _Thread_local struct coll_group group;

size_t coll_dtype_size(int dtype)
{
	static const size_t sizes[dfcclNumTypes] = {
	    [dfcclInt8] = 1,    [dfcclUint8] = 1,   [dfcclInt32] = 4,   [dfcclUint32] = 4,   [dfcclInt64] = 8,
	    [dfcclUint64] = 8,  [dfcclFloat16] = 2, [dfcclFloat32] = 4, [dfcclFloat64] = 8,  [dfcclBfloat16] = 2,
	};
	return dtype >= 0 && dtype < dfcclNumTypes ? sizes[dtype] : 0;
}

int coll_group_depth(void)
{
	return group.depth;
}

/* Translates one buffer of `bytes` into the entry's (reg, off). */
static dfcclResult_t coll_buffer(const struct coll_args *a, const void *ptr, size_t bytes, uint32_t *reg,
                                 uint64_t *off)
{
	struct mem_ref ref;
	dfcclResult_t r = mem_translate(a->comm->client, ptr, bytes, &ref);
	if (r != dfcclSuccess)
		return r;
	if (ref.device != a->comm->device)
		return errors_set(dfcclInvalidArgument, "%s: buffer %p was allocated for device %d but the communicator uses "
		                  "device %d (call dfcclSetDevice before dfcclMemAlloc)", qp_op_name(a->opcode), ptr,
		                  ref.device, a->comm->device);
	*reg = ref.reg_id;
	*off = ref.offset;
	return dfcclSuccess;
}

/*
 * Checks a call and builds its entry. *empty is set for a call with nothing
 * to move (count 0), which NCCL completes without submitting anything.
 */
static dfcclResult_t coll_prepare(const struct coll_args *a, struct coll_op *op, bool *empty)
{
	const char *name = qp_op_name(a->opcode);
	struct dfcclComm *comm = a->comm;

	*empty = false;
	if (!comm)
		return errors_set(dfcclInvalidArgument, "%s: comm is NULL", name);
	if (a->stream)
		return errors_set(dfcclNotSupported, "%s: stream-ordered submission needs the CUDA engine, which this "
		                  "release does not have; pass a NULL stream", name);
	size_t elem = coll_dtype_size(a->dtype);
	if (elem == 0)
		return errors_set(dfcclInvalidArgument, "%s: unknown data type %d", name, a->dtype);
	unsigned o = a->opcode;
	bool reduces = o == DFCCL_OP_ALLREDUCE || o == DFCCL_OP_REDUCE || o == DFCCL_OP_REDUCESCATTER;
	bool p2p = o == DFCCL_OP_SEND || o == DFCCL_OP_RECV;
	bool has_peer = p2p || o == DFCCL_OP_BROADCAST || o == DFCCL_OP_REDUCE;
	if (reduces && (a->redop < 0 || a->redop >= dfcclNumOps))
		return errors_set(dfcclInvalidArgument, "%s: unknown reduction operation %d", name, a->redop);
	if (has_peer && (a->peer < 0 || a->peer >= comm->nranks))
		return errors_set(dfcclInvalidArgument, "%s: %s %d is outside 0..%d", name, p2p ? "peer" : "root", a->peer,
		                  comm->nranks - 1);
	dfcclResult_t r = comm_check(comm);
	if (r != dfcclSuccess)
		return r;

	/* Which buffers this rank touches, and how many bytes of each. */
	bool root = has_peer && a->peer == comm->rank;
	size_t scale_send = 1, scale_recv = 1;
	bool use_send = true, use_recv = true;
	switch (o) {
	case DFCCL_OP_BROADCAST: use_send = root; break;
	case DFCCL_OP_REDUCE: use_recv = root; break;
	case DFCCL_OP_ALLGATHER: scale_recv = (size_t)comm->nranks; break;
	case DFCCL_OP_REDUCESCATTER: scale_send = (size_t)comm->nranks; break;
	case DFCCL_OP_SEND: use_recv = false; break;
	case DFCCL_OP_RECV: use_send = false; break;
	default: break;
	}
	if (a->count > SIZE_MAX / elem / (size_t)comm->nranks)
		return errors_set(dfcclInvalidArgument, "%s: count %zu is too large", name, a->count);
	if (a->count == 0) {
		*empty = true;
		return dfcclSuccess;
	}
	size_t bytes = a->count * elem;

	struct dfccl_sqe *e = &op->sqe;
	memset(op, 0, sizeof(*op));
	op->comm = comm;
	e->comm_id = comm->id;
	e->count = a->count;
	e->peer = has_peer ? (uint32_t)a->peer : 0;
	e->opcode = (uint8_t)o;
	e->dtype = (uint8_t)a->dtype;
	e->redop = reduces ? (uint8_t)a->redop : 0;
	if (use_send && (r = coll_buffer(a, a->send, bytes * scale_send, &e->send_reg, &e->send_off)) != dfcclSuccess)
		return r;
	if (use_recv && (r = coll_buffer(a, a->recv, bytes * scale_recv, &e->recv_reg, &e->recv_off)) != dfcclSuccess)
		return r;
	if (use_send && use_recv && a->send == a->recv)
		e->flags |= DFCCL_SQE_F_INPLACE;
	return dfcclSuccess;
}

/*
 * Submits ops[0..n) in order, then waits for each. Returns the first
 * failure, keeping its sentence as the last error even when later entries
 * fail too.
 */
static dfcclResult_t coll_run(struct coll_op *ops, size_t n)
{
	dfcclResult_t first = dfcclSuccess, r;
	char message[sizeof(group.message)] = "";
	size_t submitted = 0;

	for (; submitted < n; submitted++) {
		struct coll_op *op = &ops[submitted];
		op->sqe.comm_seq = comm_next_seq(op->comm);
		r = qp_submit(op->comm->qp, &op->sqe, &op->ticket);
		if (r != dfcclSuccess) {
			first = r;
			snprintf(message, sizeof(message), "%s", errors_last());
			break;
		}
	}
	for (size_t i = 0; i < submitted; i++) {
		r = qp_wait(ops[i].comm->qp, &ops[i].ticket);
		if (r == dfcclSuccess)
			r = qp_status_result(ops[i].ticket.status, ops[i].sqe.opcode);
		if (r != dfcclSuccess && first == dfcclSuccess) {
			first = r;
			snprintf(message, sizeof(message), "%s", errors_last());
		}
	}
	if (first != dfcclSuccess && strcmp(message, errors_last()) != 0)
		errors_set(first, "%s", message);
	return first;
}

static dfcclResult_t coll_group_add(const struct coll_op *op)
{
	if (group.n == group.cap) {
		size_t cap = group.cap ? group.cap * 2 : 16;
		struct coll_op *ops = realloc(group.ops, cap * sizeof(*ops));
		if (!ops)
			return errors_set(dfcclSystemError, "out of memory");
		group.ops = ops;
		group.cap = cap;
	}
	group.ops[group.n++] = *op;
	return dfcclSuccess;
}

static dfcclResult_t coll_call(const struct coll_args *a)
{
	struct coll_op op;
	bool empty;
	dfcclResult_t r = coll_prepare(a, &op, &empty);
	if (r == dfcclSuccess && !empty)
		r = group.depth > 0 ? coll_group_add(&op) : coll_run(&op, 1);
	if (r != dfcclSuccess && group.depth > 0 && group.error == dfcclSuccess) {
		group.error = r;
		snprintf(group.message, sizeof(group.message), "%s", errors_last());
	}
	return r;
}

dfcclResult_t dfcclGroupStart(void)
{
	if (group.depth == INT_MAX)
		return errors_set(dfcclInvalidUsage, "dfcclGroupStart: groups nested too deeply");
	group.depth++;
	return dfcclSuccess;
}

dfcclResult_t dfcclGroupEnd(void)
{
	if (group.depth == 0)
		return errors_set(dfcclInvalidUsage, "dfcclGroupEnd without a matching dfcclGroupStart");
	if (--group.depth > 0)
		return dfcclSuccess;

	dfcclResult_t r;
	if (group.error != dfcclSuccess)
		r = errors_set(group.error, "a call inside the group failed, so none of the group was submitted: %s",
		               group.message);
	else
		r = coll_run(group.ops, group.n);
	free(group.ops);
	group = (struct coll_group){0};
	return r;
}

/* ---------------------------------------------------------------- the calls */

dfcclResult_t dfcclAllReduce(const void *sendbuff, void *recvbuff, size_t count, dfcclDataType_t datatype,
                             dfcclRedOp_t op, dfcclComm_t comm, dfcclStream_t stream)
{
	struct coll_args a = {DFCCL_OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream};
	return coll_call(&a);
}

dfcclResult_t dfcclBroadcast(const void *sendbuff, void *recvbuff, size_t count, dfcclDataType_t datatype, int root,
                             dfcclComm_t comm, dfcclStream_t stream)
{
	struct coll_args a = {DFCCL_OP_BROADCAST, sendbuff, recvbuff, count, datatype, 0, root, comm, stream};
	return coll_call(&a);
}

dfcclResult_t dfcclReduce(const void *sendbuff, void *recvbuff, size_t count, dfcclDataType_t datatype,
                          dfcclRedOp_t op, int root, dfcclComm_t comm, dfcclStream_t stream)
{
	struct coll_args a = {DFCCL_OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream};
	return coll_call(&a);
}

dfcclResult_t dfcclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, dfcclDataType_t datatype,
                             dfcclComm_t comm, dfcclStream_t stream)
{
	struct coll_args a = {DFCCL_OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, stream};
	return coll_call(&a);
}

dfcclResult_t dfcclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, dfcclDataType_t datatype,
                                 dfcclRedOp_t op, dfcclComm_t comm, dfcclStream_t stream)
{
	struct coll_args a = {DFCCL_OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream};
	return coll_call(&a);
}

dfcclResult_t dfcclSend(const void *sendbuff, size_t count, dfcclDataType_t datatype, int peer, dfcclComm_t comm,
                        dfcclStream_t stream)
{
	struct coll_args a = {DFCCL_OP_SEND, sendbuff, NULL, count, datatype, 0, peer, comm, stream};
	return coll_call(&a);
}

dfcclResult_t dfcclRecv(void *recvbuff, size_t count, dfcclDataType_t datatype, int peer, dfcclComm_t comm,
                        dfcclStream_t stream)
{
	struct coll_args a = {DFCCL_OP_RECV, NULL, recvbuff, count, datatype, 0, peer, comm, stream};
	return coll_call(&a);
}
