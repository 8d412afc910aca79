/*
 * Collectives, send/recv and group calls; see coll.h.
 *
 * The group state is per thread, as NCCL's is: a group collects the calls of
 * the thread that opened it.
 */
#include "coll.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "cudrv.h"
#include "errors.h"
#include "mem.h"
#include "qp.h"
#include "stream.h"

/* One call, ready to submit. */
struct coll_op {
	struct dfcclComm *comm;
	struct dfccl_sqe sqe;
	dfcclStream_t stream; /* NULL: armed by the CPU, completed through the communicator */
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

static uint8_t coll_algo_hint;
static pthread_once_t coll_algo_once = PTHREAD_ONCE_INIT;

/* DFCCL_ALGO, read once: the algorithm every entry asks for.
 * An unknown name is ignored (the daemon's setting applies), as a typo in a
 * tuning knob should not fail the job. */
static void coll_algo_read(void)
{
	int a = dfccl_algo_parse(getenv("DFCCL_ALGO"));
	coll_algo_hint = a > 0 ? (uint8_t)a : DFCCL_ALGO_AUTO;
}

static uint8_t coll_algo(void)
{
	pthread_once(&coll_algo_once, coll_algo_read);
	return coll_algo_hint;
}

int coll_group_depth(void)
{
	return group.depth;
}

/*
 * Translates one buffer of `scale` * count elements into the entry's (reg,
 * off), saying in the message how large the buffer must be.
 */
static dfcclResult_t coll_buffer(const struct coll_args *a, const char *what, const void *ptr, size_t scale,
                                 uint32_t *reg, uint64_t *off)
{
	const char *name = qp_op_name(a->opcode);
	size_t esize = coll_dtype_size(a->dtype), elems = a->count * scale, bytes = elems * esize;
	if ((uintptr_t)ptr % esize)
		return errors_set(dfcclInvalidArgument, "%s: %s %p is not aligned to its elements (%zu bytes each)", name,
		                  what, ptr, esize);
	struct mem_ref ref;
	dfcclResult_t r = mem_translate(a->comm->client, ptr, bytes, &ref);
	if (r != dfcclSuccess) {
		char why[512];
		snprintf(why, sizeof(why), "%s", errors_last());
		return errors_set(r, "%s: %s must hold %s = %zu elements (%zu bytes): %s", name, what,
		                  scale > 1 ? "nranks*count" : "count", elems, bytes, why);
	}
	if ((uint32_t)ref.device != a->comm->dev_index)
		return errors_set(dfcclInvalidArgument, "%s: buffer %p lies on dfccld's device %d but the communicator on its "
		                  "device %u, device %d of this process (GPU buffers must be on the communicator's GPU; call "
		                  "dfcclSetDevice before dfcclMemAlloc)", name, ptr, ref.device, a->comm->dev_index,
		                  a->comm->device);
	*reg = ref.reg_id;
	*off = ref.offset;
	return dfcclSuccess;
}

/* The checks every call shares: communicator, stream, type, reduction,
 * root or peer, size, and that the communicator is still usable. */
static dfcclResult_t coll_check(const struct coll_args *a)
{
	const char *name = qp_op_name(a->opcode);
	struct dfcclComm *comm = a->comm;
	unsigned o = a->opcode;
	bool reduces = o == DFCCL_OP_ALLREDUCE || o == DFCCL_OP_REDUCE || o == DFCCL_OP_REDUCESCATTER;
	bool p2p = o == DFCCL_OP_SEND || o == DFCCL_OP_RECV;
	bool has_peer = p2p || o == DFCCL_OP_BROADCAST || o == DFCCL_OP_REDUCE;

	if (!comm)
		return errors_set(dfcclInvalidArgument, "%s: comm is NULL", name);
	if (a->stream && !cudrv_streams_usable())
		return errors_set(dfcclNotSupported, "%s: a stream-ordered call needs the CUDA driver: %s; pass a NULL "
		                  "stream instead (the call then returns once submitted, and dfcclCommSynchronize "
		                  "waits for it)", name, cudrv_last_error());
	if (a->stream && cudrv_stream_capturing(a->stream, comm->device) > 0)
		return errors_set(dfcclNotSupported, "%s: the stream is being captured into a CUDA graph, and "
		                  "stream-ordered dfccl calls cannot be captured (a replay would arm again an entry the "
		                  "daemon took already); make the call outside the capture", name);
	size_t elem = coll_dtype_size(a->dtype);
	if (elem == 0)
		return errors_set(dfcclInvalidArgument, "%s: unknown data type %d", name, a->dtype);
	if (reduces && (a->redop < 0 || a->redop >= dfcclNumOps))
		return errors_set(dfcclInvalidArgument, "%s: unknown reduction operation %d", name, a->redop);
	if (has_peer && (a->peer < 0 || a->peer >= comm->nranks))
		return errors_set(dfcclInvalidArgument, "%s: %s %d is outside 0..%d", name, p2p ? "peer" : "root", a->peer,
		                  comm->nranks - 1);
	if (p2p && a->peer == comm->rank)
		return errors_set(dfcclInvalidArgument, "%s: peer %d is this rank itself; copy the data locally instead",
		                  name, a->peer);
	/* nranks * nranks covers all-to-all's nranks blocks of nranks * count. */
	if (a->count > SIZE_MAX / elem / (size_t)comm->nranks / (size_t)comm->nranks)
		return errors_set(dfcclInvalidArgument, "%s: count %zu is too large", name, a->count);
	return comm_check(comm);
}

/* Whether [s, s + send_bytes) and [r, r + recv_bytes) share a byte. */
static bool bufs_overlap(const void *send, size_t send_bytes, const void *recv, size_t recv_bytes)
{
	uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
	return s < r + recv_bytes && r < s + send_bytes;
}

/*
 * Refuses buffers that overlap other than in NCCL's in-place layout for the
 * collective: the same buffer for all-reduce, broadcast and reduce; for
 * all-gather sendbuff at this rank's block of recvbuff; for reduce-scatter
 * recvbuff at this rank's block of sendbuff. The engines read one buffer
 * while they write the other (and peers read this rank's sendbuff until
 * the collective is done), so any other overlap would corrupt the result.
 */
static dfcclResult_t coll_overlap(const struct coll_args *a, size_t send_bytes, size_t recv_bytes)
{
	uintptr_t s = (uintptr_t)a->send, r = (uintptr_t)a->recv;
	if (!bufs_overlap(a->send, send_bytes, a->recv, recv_bytes))
		return dfcclSuccess;
	uintptr_t rank = (uintptr_t)a->comm->rank;
	const char *layout;
	switch (a->opcode) {
	case DFCCL_OP_ALLGATHER:
		if (s == r + rank * send_bytes)
			return dfcclSuccess;
		layout = "for all-gather, sendbuff = recvbuff + rank * sendcount elements";
		break;
	case DFCCL_OP_REDUCESCATTER:
		if (r == s + rank * recv_bytes)
			return dfcclSuccess;
		layout = "for reduce-scatter, recvbuff = sendbuff + rank * recvcount elements";
		break;
	default:
		if (s == r)
			return dfcclSuccess;
		layout = "sendbuff = recvbuff";
		break;
	}
	return errors_set(dfcclInvalidArgument, "%s: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap but "
	                  "are not in place (%s, rank %d): the result would be corrupted; pass buffers that do not "
	                  "overlap, or the in-place layout", qp_op_name(a->opcode), a->send, send_bytes, a->recv,
	                  recv_bytes, layout, a->comm->rank);
}

/*
 * Checks a call and builds its entry (all but its key). *empty is set for a
 * call with nothing to move (count 0), which NCCL completes without
 * submitting anything.
 */
static dfcclResult_t coll_prepare(const struct coll_args *a, struct coll_op *op, bool *empty)
{
	struct dfcclComm *comm = a->comm;
	unsigned o = a->opcode;
	dfcclResult_t r = coll_check(a);
	*empty = false;
	if (r != dfcclSuccess)
		return r;
	if (a->count == 0) {
		*empty = true;
		return dfcclSuccess;
	}

	/* Which buffers this rank touches, and how many elements of each. */
	bool reduces = o == DFCCL_OP_ALLREDUCE || o == DFCCL_OP_REDUCE || o == DFCCL_OP_REDUCESCATTER;
	bool has_peer = o == DFCCL_OP_SEND || o == DFCCL_OP_RECV || o == DFCCL_OP_BROADCAST || o == DFCCL_OP_REDUCE;
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

	size_t esize = coll_dtype_size(a->dtype);
	if (use_send && use_recv &&
	    (r = coll_overlap(a, a->count * scale_send * esize, a->count * scale_recv * esize)) != dfcclSuccess)
		return r;

	struct dfccl_sqe *e = &op->sqe;
	memset(op, 0, sizeof(*op));
	op->comm = comm;
	op->stream = a->stream;
	e->comm_id = comm->id;
	e->rank = (uint32_t)comm->rank;
	e->count = a->count;
	e->peer = has_peer ? (uint32_t)a->peer : 0;
	e->opcode = (uint8_t)o;
	e->dtype = (uint8_t)a->dtype;
	e->redop = reduces ? (uint8_t)a->redop : 0;
	e->algo = coll_algo();
	bool in_place = use_send && use_recv && a->send == a->recv;
	if (use_send && (r = coll_buffer(a, "sendbuff", a->send, scale_send, &e->send_reg, &e->send_off)) != dfcclSuccess)
		return r;
	if (in_place && scale_send == scale_recv) {
		/* In place over the same elements: the same buffer, looked up
		 * once (a GPU buffer's look-up asks the CUDA driver about it). */
		e->recv_reg = e->send_reg;
		e->recv_off = e->send_off;
	} else if (use_recv &&
	           (r = coll_buffer(a, "recvbuff", a->recv, scale_recv, &e->recv_reg, &e->recv_off)) != dfcclSuccess) {
		return r;
	}
	if (in_place)
		e->flags |= DFCCL_SQE_F_INPLACE;
	return dfcclSuccess;
}

/* Submits a prepared entry as a tracked, asynchronous one; with `arm`,
 * unarmed, for a stream to arm (req_submit). */
static dfcclResult_t coll_submit(struct dfcclComm *comm, const struct dfccl_sqe *e, dfcclCallback_t callback,
                                 void *user_arg, struct req **handle, struct qp_stream_arm *arm)
{
	struct req *r = req_new(e->opcode, callback, user_arg, handle != NULL);
	if (!r)
		return errors_set(dfcclSystemError, "out of memory");
	dfcclResult_t res = req_submit(&comm->tracker, comm->qp, e, r, arm);
	if (res == dfcclSuccess && handle) {
		r->client = client_ref(comm->client);
		r->comm_id = comm->id;
		*handle = r;
	}
	return res;
}

/* The result of a request handle, explained as the communicator's failure
 * where it is one; the handle is used up. */
static dfcclResult_t coll_handle_done(struct req *r)
{
	dfcclResult_t res = req_result(r);
	if (r->client) {
		res = comm_explain(r->client, r->comm_id, res);
		client_unref(r->client);
		r->client = NULL;
	}
	req_unref(r);
	return res;
}

/*
 * Submits ops[0..n) in order, without waiting: each gets its key now, in
 * call order. Stream-ordered ones are posted unarmed, and their streams
 * arm them all and then wait for them all. Stops submitting at the first
 * failure (the queue pair died, or stayed full), whose sentence stays the
 * last error; what was posted before is still armed and waited for.
 */
static dfcclResult_t coll_run(struct coll_op *ops, size_t n)
{
	struct stream_batch b = {0};
	dfcclResult_t r = dfcclSuccess;
	for (size_t i = 0; i < n && r == dfcclSuccess; i++) {
		struct coll_op *op = &ops[i];
		if (!op->stream) {
			op->sqe.comm_seq = comm_next_seq(op->comm, op->sqe.opcode, (int)op->sqe.peer);
			r = coll_submit(op->comm, &op->sqe, NULL, NULL, NULL, NULL);
			continue;
		}
		if (!b.items && !(b.items = calloc(n - i, sizeof(*b.items)))) {
			r = errors_set(dfcclSystemError, "out of memory");
			break;
		}
		if (stream_batch_crowded(&b, op->comm->qp) && (r = stream_batch_arm(&b)) != dfcclSuccess)
			break;
		client_stream_words(op->comm->client, op->comm->qp);
		/* A slot first, bounded: a call that gives up has used no key,
		 * so the communicator's later calls still match the peers'. */
		if ((r = qp_wait_free(op->comm->qp, qp_queue_wait_ms())) != dfcclSuccess)
			break;
		op->sqe.comm_seq = comm_next_seq(op->comm, op->sqe.opcode, (int)op->sqe.peer);
		struct stream_item *it = &b.items[b.n];
		it->stream = op->stream;
		it->qp = op->comm->qp;
		r = coll_submit(op->comm, &op->sqe, NULL, NULL, NULL, &it->arm);
		if (r == dfcclSuccess)
			b.n++;
	}
	if (b.n > 0) {
		char first[1024];
		snprintf(first, sizeof(first), "%s", errors_last());
		dfcclResult_t rf = stream_batch_finish(&b);
		r = r != dfcclSuccess ? errors_set(r, "%s", first) : rf;
	}
	free(b.items);
	return r;
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

/* Inside a group, a failure is kept for the outermost GroupEnd. */
static dfcclResult_t coll_group_note(dfcclResult_t r)
{
	if (r != dfcclSuccess && group.depth > 0 && group.error == dfcclSuccess) {
		group.error = r;
		snprintf(group.message, sizeof(group.message), "%s", errors_last());
	}
	return r;
}

static dfcclResult_t coll_call(const struct coll_args *a)
{
	struct coll_op op;
	bool empty;
	dfcclResult_t r = coll_prepare(a, &op, &empty);
	if (r == dfcclSuccess && !empty)
		r = group.depth > 0 ? coll_group_add(&op) : coll_run(&op, 1);
	return coll_group_note(r);
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

/*
 * Checks the whole of both buffers first (each rank's blocks are sends and
 * receives that check only their own block), copies the block to itself
 * locally (the engine refuses a send to oneself), and issues the rest as one
 * group, nested in the caller's group if there is one.
 */
static dfcclResult_t coll_alltoall(const char *send, char *recv, size_t count, dfcclDataType_t dtype,
                                   struct dfcclComm *comm, dfcclStream_t stream)
{
	/* Checked as an all-gather: no root or peer, and a buffer of nranks
	 * blocks, here on both sides. */
	struct coll_args a = {DFCCL_OP_ALLGATHER, send, recv, count, dtype, 0, 0, comm, stream};
	struct coll_op op;
	dfcclResult_t r = coll_check(&a);
	if (r != dfcclSuccess || count == 0)
		return r;
	size_t n = (size_t)comm->nranks, block = count * coll_dtype_size(dtype);
	if (send == recv)
		return errors_set(dfcclInvalidArgument, "AllToAll: sendbuff and recvbuff are the same buffer; all-to-all "
		                  "does not work in place");
	if (bufs_overlap(send, n * block, recv, n * block))
		return errors_set(dfcclInvalidArgument, "AllToAll: sendbuff %p and recvbuff %p overlap (%zu bytes each); "
		                  "all-to-all needs two separate buffers", (const void *)send, (void *)recv, n * block);
	if ((r = coll_buffer(&a, "sendbuff", send, n, &op.sqe.send_reg, &op.sqe.send_off)) != dfcclSuccess ||
	    (r = coll_buffer(&a, "recvbuff", recv, n, &op.sqe.recv_reg, &op.sqe.recv_off)) != dfcclSuccess)
		return r;

	/* The own block: GPU memory is not the CPU's to copy, the driver does it. */
	char *own_dst = recv + (size_t)comm->rank * block;
	const char *own_src = send + (size_t)comm->rank * block;
	struct cudrv_ptr_info pi;
	if (stream) {
		/* In the stream's order, as the rest of the exchange. */
		if (cudrv_copy_async(own_dst, own_src, block, stream, comm->device) < 0)
			return errors_set(dfcclUnhandledCudaError, "AllToAll: cannot queue the copy of the rank's own block "
			                  "on the stream: %s", cudrv_last_error());
	} else if (cudrv_pointer_info(own_dst, &pi) == 1 || cudrv_pointer_info(own_src, &pi) == 1) {
		if (cudrv_copy(own_dst, own_src, block, pi.device) < 0)
			return errors_set(dfcclUnhandledCudaError, "AllToAll: cannot copy the rank's own block: %s",
			                  cudrv_last_error());
	} else {
		memmove(own_dst, own_src, block);
	}
	dfcclGroupStart();
	for (int j = 0; j < comm->nranks; j++) {
		if (j == comm->rank)
			continue;
		dfcclSend(send + (size_t)j * block, count, dtype, j, comm, stream);
		dfcclRecv(recv + (size_t)j * block, count, dtype, j, comm, stream);
	}
	return dfcclGroupEnd();
}

dfcclResult_t dfcclAllToAll(const void *sendbuff, void *recvbuff, size_t count, dfcclDataType_t datatype,
                            dfcclComm_t comm, dfcclStream_t stream)
{
	return coll_group_note(coll_alltoall(sendbuff, recvbuff, count, datatype, comm, stream));
}

/* ---------------------------------------------------------------- registered collectives */

static const unsigned coll_type_opcode[dfcclNumCollTypes] = {
    [dfcclCollAllReduce] = DFCCL_OP_ALLREDUCE, [dfcclCollAllGather] = DFCCL_OP_ALLGATHER,
    [dfcclCollReduceScatter] = DFCCL_OP_REDUCESCATTER, [dfcclCollBroadcast] = DFCCL_OP_BROADCAST,
    [dfcclCollReduce] = DFCCL_OP_REDUCE,
};

static dfcclResult_t coll_id_check(const char *fn, struct dfcclComm *comm, int collId)
{
	if (!comm)
		return errors_set(dfcclInvalidArgument, "%s: comm is NULL", fn);
	if (collId < 0 || collId >= DFCCL_MAX_COLL_ID)
		return errors_set(dfcclInvalidArgument, "%s: collId %d is outside 0..%d", fn, collId, DFCCL_MAX_COLL_ID - 1);
	return dfcclSuccess;
}

dfcclResult_t dfcclRegisterCollective(dfcclComm_t comm, int collId, const dfcclCollDesc_t *desc)
{
	static const char fn[] = "dfcclRegisterCollective";
	dfcclResult_t r = coll_id_check(fn, comm, collId);
	if (r != dfcclSuccess)
		return r;
	if (!desc)
		return errors_set(dfcclInvalidArgument, "%s: desc is NULL", fn);
	if ((unsigned)desc->type >= dfcclNumCollTypes)
		return errors_set(dfcclInvalidArgument, "%s: unknown collective type %d", fn, (int)desc->type);
	if (desc->count == 0)
		return errors_set(dfcclInvalidArgument, "%s: count is 0; a registered collective must move data", fn);
	unsigned o = coll_type_opcode[desc->type];
	size_t elem = coll_dtype_size(desc->datatype);
	if (elem == 0)
		return errors_set(dfcclInvalidArgument, "%s: unknown data type %d", fn, (int)desc->datatype);
	if (desc->count > SIZE_MAX / elem / (size_t)comm->nranks)
		return errors_set(dfcclInvalidArgument, "%s: count %zu is too large", fn, desc->count);
	if ((o == DFCCL_OP_ALLREDUCE || o == DFCCL_OP_REDUCE || o == DFCCL_OP_REDUCESCATTER) &&
	    (unsigned)desc->op >= dfcclNumOps)
		return errors_set(dfcclInvalidArgument, "%s: unknown reduction operation %d", fn, (int)desc->op);
	if ((o == DFCCL_OP_BROADCAST || o == DFCCL_OP_REDUCE) && (desc->root < 0 || desc->root >= comm->nranks))
		return errors_set(dfcclInvalidArgument, "%s: root %d is outside 0..%d", fn, desc->root, comm->nranks - 1);

	pthread_mutex_lock(&comm->lock);
	struct comm_coll *c = &comm->colls[collId];
	bool taken = c->used;
	if (!taken) {
		c->used = true;
		c->desc = *desc;
	}
	pthread_mutex_unlock(&comm->lock);
	if (taken)
		return errors_set(dfcclInvalidUsage, "%s: collId %d is registered already; deregister it first", fn, collId);
	return dfcclSuccess;
}

dfcclResult_t dfcclDeregisterCollective(dfcclComm_t comm, int collId)
{
	static const char fn[] = "dfcclDeregisterCollective";
	dfcclResult_t r = coll_id_check(fn, comm, collId);
	if (r != dfcclSuccess)
		return r;
	pthread_mutex_lock(&comm->lock);
	bool used = comm->colls[collId].used;
	comm->colls[collId].used = false;
	pthread_mutex_unlock(&comm->lock);
	if (!used)
		return errors_set(dfcclInvalidArgument, "%s: collId %d is not registered", fn, collId);
	return dfcclSuccess;
}

dfcclResult_t dfcclRunCollective(dfcclComm_t comm, int collId, const void *sendbuff, void *recvbuff,
                                 dfcclCallback_t callback, void *userArg, dfcclRequest_t *request)
{
	static const char fn[] = "dfcclRunCollective";
	dfcclResult_t r = coll_id_check(fn, comm, collId);
	if (r != dfcclSuccess)
		return r;
	if (request)
		*request = NULL;
	pthread_mutex_lock(&comm->lock);
	bool used = comm->colls[collId].used;
	dfcclCollDesc_t d = comm->colls[collId].desc;
	pthread_mutex_unlock(&comm->lock);
	if (!used)
		return errors_set(dfcclInvalidArgument, "%s: collId %d is not registered (dfcclRegisterCollective)", fn,
		                  collId);

	struct coll_args a = {coll_type_opcode[d.type], sendbuff, recvbuff, d.count, d.datatype, d.op, d.root, comm,
	                      NULL};
	struct coll_op op;
	bool empty;
	r = coll_prepare(&a, &op, &empty);
	if (r != dfcclSuccess)
		return r;
	op.sqe.flags |= DFCCL_SQE_F_REGISTERED;
	op.sqe.coll_id = (uint32_t)collId;
	op.sqe.comm_seq = __atomic_add_fetch(&comm->colls[collId].runs, 1, __ATOMIC_RELAXED);
	if (d.priority != 0) {
		op.sqe.flags |= DFCCL_SQE_F_PRIORITY;
		op.sqe.priority = d.priority;
	}
	return coll_submit(comm, &op.sqe, callback, userArg, (struct req **)request, NULL);
}

dfcclResult_t dfcclWait(dfcclRequest_t request)
{
	if (!request)
		return errors_set(dfcclInvalidArgument, "dfcclWait: request is NULL");
	struct req *r = (struct req *)request;
	req_wait(r);
	return coll_handle_done(r);
}

dfcclResult_t dfcclTest(dfcclRequest_t request, int *done)
{
	if (!request || !done)
		return errors_set(dfcclInvalidArgument, "dfcclTest: %s is NULL", request ? "done" : "request");
	struct req *r = (struct req *)request;
	*done = req_test(r);
	if (!*done)
		return dfcclSuccess;
	return coll_handle_done(r);
}
