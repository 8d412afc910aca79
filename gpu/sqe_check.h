/*
 * The checks of a submission entry, written once for both engines: plain C
 * in static inline functions that compile as host code (gpu/sq.c and the
 * host engine's collectives) and, under nvcc, as device code (the daemon
 * kernel), as gpu/scheduler.h does for the scheduling policy.
 *
 * An engine runs them on its own copy of the entry, in this order:
 *   sqe_check_entry   the entry on its own: arm, opcode, flags, type,
 *                     operation, a communicator named, a size that fits
 *   sqe_check_member  the entry against its communicator: the rank belongs
 *                     to the submitting session and this device, the
 *                     instance key, root and peer ranges
 *   sqe_check_range   every buffer the collective touches against the
 *                     registration it names: owned by the right session,
 *                     offset + bytes inside it, without overflow
 * Each returns DFCCL_CQ_OK or the DFCCL_CQ_* status to complete with.
 */
#ifndef DFCCL_SQE_CHECK_H
#define DFCCL_SQE_CHECK_H

#include <stdint.h>

#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "scheduler.h" /* DFCCL_HD */

#define SQE_NDTYPES 10u
#define SQE_NREDOPS 5u
/* dfcclRedOp_t values (client/include/dfccl.h) */
enum sqe_redop { SQE_REDOP_SUM = 0, SQE_REDOP_PROD = 1, SQE_REDOP_MAX = 2, SQE_REDOP_MIN = 3, SQE_REDOP_AVG = 4 };
#define SQE_KNOWN_FLAGS \
	(DFCCL_SQE_F_INPLACE | DFCCL_SQE_F_REGISTERED | DFCCL_SQE_F_PRIORITY | DFCCL_SQE_F_STREAM_ARMED | \
	 DFCCL_SQE_F_DEVICE_DONE | DFCCL_SQE_F_GROUP)

/* Bytes of one element of a dfcclDataType_t value (client/include/dfccl.h); 0 if unknown. */
static inline DFCCL_HD unsigned sqe_dtype_size(uint32_t dtype)
{
	switch (dtype) {
	case 0: case 1: return 1;         /* int8, uint8 */
	case 2: case 3: case 7: return 4; /* int32, uint32, float32 */
	case 4: case 5: case 8: return 8; /* int64, uint64, float64 */
	case 6: case 9: return 2;         /* float16, bfloat16 */
	default: return 0;
	}
}

static inline DFCCL_HD int sqe_is_p2p(uint8_t opcode)
{
	return opcode == DFCCL_OP_SEND || opcode == DFCCL_OP_RECV;
}

static inline DFCCL_HD int sqe_has_root(uint8_t opcode)
{
	return opcode == DFCCL_OP_BROADCAST || opcode == DFCCL_OP_REDUCE;
}

static inline DFCCL_HD int sqe_reduces(uint8_t opcode)
{
	return opcode == DFCCL_OP_ALLREDUCE || opcode == DFCCL_OP_REDUCESCATTER || opcode == DFCCL_OP_REDUCE;
}

/* Whether a * b fits in 64 bits. Without a division on a GPU, which
 * divides 64-bit words in software: a long chain of instructions for the
 * one thread that checks an entry. */
static inline DFCCL_HD int sqe_mul_fits(uint64_t a, uint64_t b)
{
#if defined(__CUDA_ARCH__)
	return __umul64hi(a, b) == 0;
#else
	return b == 0 || a <= UINT64_MAX / b;
#endif
}

/*
 * Elements of the send and receive buffers a rank uses in a collective of
 * `count` (0: it uses none), for a communicator of nranks. Returns -1 for
 * an unknown opcode.
 */
static inline DFCCL_HD int sqe_buf_elems(uint8_t opcode, uint64_t count, uint32_t nranks, int is_root,
                                         uint64_t *send, uint64_t *recv)
{
	uint64_t one = count, all = count * nranks;
	switch (opcode) {
	case DFCCL_OP_ALLREDUCE: *send = one, *recv = one; break;
	case DFCCL_OP_ALLGATHER: *send = one, *recv = all; break;
	case DFCCL_OP_REDUCESCATTER: *send = all, *recv = one; break;
	case DFCCL_OP_BROADCAST: *send = is_root ? one : 0, *recv = one; break;
	case DFCCL_OP_REDUCE: *send = one, *recv = is_root ? one : 0; break;
	case DFCCL_OP_SEND: *send = one, *recv = 0; break;
	case DFCCL_OP_RECV: *send = 0, *recv = one; break;
	default: return -1;
	}
	return 0;
}

/* Bytes of the send and receive buffers, as sqe_buf_elems; -1 when the
 * sizes overflow. */
static inline DFCCL_HD int sqe_buf_bytes(uint8_t opcode, uint64_t count, unsigned dsize, uint32_t nranks, int is_root,
                                         uint64_t *send, uint64_t *recv)
{
	if (dsize == 0 || nranks == 0 || !sqe_mul_fits(count, dsize) || !sqe_mul_fits(count * dsize, nranks) ||
	    sqe_buf_elems(opcode, count, nranks, is_root, send, recv) < 0)
		return -1;
	*send *= dsize;
	*recv *= dsize;
	return 0;
}

/* Whether the entry must name a send (receive) buffer of count elements
 * whatever its rank (broadcast and reduce need one only at or off the root). */
static inline DFCCL_HD int sqe_requires_send(uint8_t opcode)
{
	return opcode != DFCCL_OP_RECV && opcode != DFCCL_OP_BROADCAST && opcode != DFCCL_OP_REDUCE;
}

static inline DFCCL_HD int sqe_requires_recv(uint8_t opcode)
{
	return opcode != DFCCL_OP_SEND && opcode != DFCCL_OP_BROADCAST && opcode != DFCCL_OP_REDUCE;
}

/*
 * The group of the entry taken under sequence number seq from a queue of
 * qn entries (DFCCL_SQE_F_GROUP): how many entries it has, *last the
 * sequence number of its last one; 0 where the entry has no group or its
 * fields do not hold: at most half the queue's entries, the entry at or
 * before the last by less than half the queue (the group's entries need
 * not be in a row), a last that fits a completion word's 48 bits. An
 * entry whose fields do not hold for the largest queue is refused
 * (sqe_check_entry); one whose fields fit a larger queue than its own
 * counts for no group, and its word is written at its completion.
 */
static inline DFCCL_HD uint32_t sqe_group(const struct dfccl_sqe *e, uint64_t seq, uint32_t qn, uint64_t *last)
{
	*last = 0;
	if (!(e->flags & DFCCL_SQE_F_GROUP) || e->group_n == 0 || e->group_n > qn / 2u || e->group_last < seq ||
	    e->group_last - seq >= qn / 2u || e->group_last > DFCCL_CW_SEQ(UINT64_MAX))
		return 0;
	*last = e->group_last;
	return e->group_n;
}

/*
 * A group's count word, one per slot of a group's last entry, kept by the
 * engine: DFCCL_CW_MAKE(last, entries of that group completed), after one
 * more entry of group `last` completed. A word of any other group (an
 * earlier lap's, or one a client's forged fields left) starts over, so the
 * words need no reset. The engine keeps beside it the last entry's own
 * completion (its sequence number, its status and where its device word
 * is), stored before its count. The last entry's word is written by the
 * last entry itself where its count reaches the group's size (sqe_group)
 * or passes it, else by the entry whose count reaches the size, provided
 * the last entry's completion is there (a forged group whose count came
 * without it gets the last's word when the last completes).
 */
static inline DFCCL_HD uint64_t sqe_group_count(uint64_t w, uint64_t last)
{
	if (DFCCL_CW_SEQ(w) != last)
		return DFCCL_CW_MAKE(last, 1);
	return DFCCL_CW_STATUS(w) < 0xffffu ? w + 1 : w;
}

/* The entry on its own. *bytes gets count * element size. */
static inline DFCCL_HD uint32_t sqe_check_entry(const struct dfccl_sqe *e, uint64_t *bytes)
{
	*bytes = 0;
	if (e->seq != e->arm)
		return DFCCL_CQ_BAD_ENTRY;
	if (e->opcode >= DFCCL_OP_COUNT_)
		return DFCCL_CQ_BAD_OPCODE;
	if (e->flags & ~SQE_KNOWN_FLAGS)
		return DFCCL_CQ_BAD_ENTRY;
	/* A device completion word: named, and whole in one aligned word. */
	if ((e->flags & DFCCL_SQE_F_DEVICE_DONE) && (e->done_reg == 0 || e->done_off % 8u))
		return DFCCL_CQ_BAD_ENTRY;
	uint64_t last;
	if ((e->flags & DFCCL_SQE_F_GROUP) && sqe_group(e, e->arm, DFCCL_SQ_MAX_ENTRIES, &last) == 0)
		return DFCCL_CQ_BAD_ENTRY;
	if (e->opcode == DFCCL_OP_NOP)
		return DFCCL_CQ_OK;
	unsigned dsize = sqe_dtype_size(e->dtype);
	if (!dsize)
		return DFCCL_CQ_BAD_DTYPE;
	if (sqe_reduces(e->opcode) && e->redop >= SQE_NREDOPS)
		return DFCCL_CQ_BAD_REDOP;
	if (e->comm_id == 0)
		return DFCCL_CQ_BAD_COMM;
	if (!sqe_mul_fits(e->count, dsize))
		return DFCCL_CQ_OUT_OF_RANGE;
	/* A named buffer starts on a whole element of its allocation (which
	 * starts on at least 256 bytes): engines load and store whole
	 * elements, and a GPU stops on a misaligned one, with every client of
	 * its daemon kernel. Offsets of buffers an entry does not name are
	 * not looked at. (dsize is a power of two.) */
	if ((e->send_reg && (e->send_off & (dsize - 1u))) || (e->recv_reg && (e->recv_off & (dsize - 1u))))
		return DFCCL_CQ_OUT_OF_RANGE;
	*bytes = e->count * dsize;
	return DFCCL_CQ_OK;
}

/*
 * A buffer [off, off + bytes) of registration reg_id against what the
 * engine knows of it: found (reg_found), its owner and size. reg_id 0
 * names no buffer, which is right only when the collective needs none.
 */
static inline DFCCL_HD uint32_t sqe_check_range(uint32_t reg_id, int reg_found, uint64_t reg_session,
                                                uint64_t reg_size, uint64_t session, uint64_t off, uint64_t bytes,
                                                int required)
{
	if (reg_id == 0)
		return required ? DFCCL_CQ_BAD_REG : DFCCL_CQ_OK;
	if (!reg_found || reg_session != session)
		return DFCCL_CQ_BAD_REG;
	if (off > reg_size || bytes > reg_size - off)
		return DFCCL_CQ_OUT_OF_RANGE;
	return DFCCL_CQ_OK;
}

/*
 * The entry against its communicator of nranks: the member at e->rank is
 * (member_session, member_device), the entry came from `session` on
 * `device`.
 */
static inline DFCCL_HD uint32_t sqe_check_member(const struct dfccl_sqe *e, uint32_t nranks, uint64_t member_session,
                                                 uint32_t member_device, uint64_t session, uint32_t device)
{
	if (e->rank >= nranks || member_session != session || member_device != device)
		return DFCCL_CQ_BAD_COMM;
	if (e->opcode == DFCCL_OP_NOP || e->opcode >= DFCCL_OP_COUNT_)
		return DFCCL_CQ_BAD_OPCODE;
	if (!sqe_dtype_size(e->dtype))
		return DFCCL_CQ_BAD_DTYPE;
	if (e->comm_seq == 0)
		return DFCCL_CQ_BAD_ENTRY;
	if (sqe_is_p2p(e->opcode) &&
	    (e->peer >= nranks || e->peer == e->rank || (e->flags & DFCCL_SQE_F_REGISTERED)))
		return DFCCL_CQ_BAD_ENTRY;
	if (sqe_has_root(e->opcode) && e->peer >= nranks)
		return DFCCL_CQ_BAD_ENTRY;
	if ((e->flags & DFCCL_SQE_F_REGISTERED) && e->coll_id >= DFCCL_COMM_MAX_COLLS)
		return DFCCL_CQ_BAD_ENTRY;
	return DFCCL_CQ_OK;
}

#endif /* DFCCL_SQE_CHECK_H */
