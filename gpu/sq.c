/*
 * See sq.h. Memory ordering: the client stores `arm` with release after
 * writing the entry, so an acquire load of `arm` that sees the expected
 * sequence number makes the rest of the entry visible to the copy. The
 * completion word is stored with release after any result data.
 */
#include "sq.h"

#include <errno.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "queue.h"
#include "scheduler.h"
#include "sqe_check.h"

#define A64(p) ((_Atomic uint64_t *)(p))
#define A32(p) ((_Atomic uint32_t *)(p))

unsigned sq_dtype_size(uint32_t dtype)
{
	return sqe_dtype_size(dtype);
}

int sq_queue_open(struct sq_queue *q, void *map, size_t size, uint32_t qp_id, uint64_t session_id, char *err,
                  size_t errlen)
{
	memset(q, 0, sizeof(*q));
	struct dfccl_qp_header *h = map;
	int rc = queue_header_check(h, size, err, errlen);
	if (rc < 0)
		return rc;
	q->hdr = h;
	q->size = size;
	q->n = h->sq_entries;
	q->qp_id = qp_id;
	q->session_id = session_id;
	q->sq = (struct dfccl_sqe *)((char *)map + DFCCL_QP_SQ_OFFSET);
	q->cw = (uint64_t *)((char *)map + DFCCL_QP_CW_OFFSET(q->n));
	uint64_t head = atomic_load_explicit(A64(&h->sq_head), memory_order_acquire);
	/* The client can write sq_head too. Sequence numbers must fit the 48
	 * bits of a completion word; a head beyond that is forged, and one near
	 * 2^64 would make head + n wrap and sq_take's scan never end. */
	if (head > DFCCL_CW_SEQ(UINT64_MAX) - q->n) {
		snprintf(err, errlen, "queue region's sq_head %llu is beyond the sequence space (corrupt region)",
		         (unsigned long long)head);
		return -EINVAL;
	}
	q->taken = calloc(q->n, sizeof(*q->taken));
	q->groups = calloc(q->n, sizeof(*q->groups));
	if (!q->taken || !q->groups) {
		sq_queue_close(q);
		return -ENOMEM;
	}
	q->head = head ? head : 1;
	/* Entries below head were handled by an earlier worker (or failed by
	 * the supervisor when it died): mark their slots as taken. */
	for (uint64_t s = q->head > q->n ? q->head - q->n : 1; s < q->head; s++)
		q->taken[DFCCL_QP_SLOT(s, q->n)] = s;
	atomic_store_explicit(A64(&h->sq_head), q->head, memory_order_release);
	return 0;
}

void sq_queue_close(struct sq_queue *q)
{
	free(q->taken);
	free(q->groups);
	q->taken = NULL;
	q->groups = NULL;
}

static uint64_t sq_tail_clamped(const struct sq_queue *q)
{
	uint64_t tail = atomic_load_explicit(A64(&q->hdr->sq_tail), memory_order_acquire);
	/* The client owns the tail: never look further than one lap ahead. */
	if (tail >= q->head + q->n)
		tail = q->head + q->n - 1;
	return tail;
}

int sq_pending(const struct sq_queue *q)
{
	return sq_tail_clamped(q) >= q->head;
}

/* Whether an entry of [from, s) not taken yet reads armed, loaded after
 * the acquire of s's arm word (scheduler.h, "Taking in order"). */
static bool armed_before(const struct sq_queue *q, uint64_t from, uint64_t s)
{
	for (uint64_t x = from; x < s; x++) {
		uint32_t slot = DFCCL_QP_SLOT(x, q->n);
		if (q->taken[slot] != x && atomic_load_explicit(A64(&q->sq[slot].arm), memory_order_acquire) == x)
			return true;
	}
	return false;
}

/* Takes from `from` on, as sq_take_if says, or with `ordered` as sq_take
 * does (from the head, in order while it is armed); returns how many,
 * and in *end the sequence number after the last one looked at. */
static unsigned take_from(struct sq_queue *q, uint64_t from, uint64_t tail, struct dfccl_sqe *out, unsigned max,
                          int (*want)(void *ctx, const struct dfccl_sqe *e), void *ctx, unsigned looks,
                          bool ordered, uint64_t *end)
{
	unsigned got = 0;
	bool in_order = false;
	uint64_t open = 0; /* the first entry looked at and left (0: none) */
	uint64_t s;
	for (s = from; s <= tail && got < max && looks > 0; s++) {
		uint32_t slot = DFCCL_QP_SLOT(s, q->n);
		if (q->taken[slot] == s)
			continue;
		struct dfccl_sqe *e = &q->sq[slot];
		bool armed = atomic_load_explicit(A64(&e->arm), memory_order_acquire) == s;
		if (ordered && s == from)
			in_order = armed;
		if (!armed) {
			if (in_order)
				break;
			open = open ? open : s;
			continue; /* not armed yet: later entries may be */
		}
		/* Past entries left: only if none was armed before this one. */
		if (ordered && open && armed_before(q, open, s))
			break;
		memcpy(&out[got], e, sizeof(*e));
		looks--;
		if (want && !want(ctx, &out[got]))
			continue; /* stays armed: a later call may take it */
		q->taken[slot] = s;
		got++;
	}
	*end = s;
	return got;
}

/* Advances head over the contiguous run of taken entries. */
static void advance_head(struct sq_queue *q, uint64_t tail)
{
	while (q->head <= tail && q->taken[DFCCL_QP_SLOT(q->head, q->n)] == q->head)
		q->head++;
	atomic_store_explicit(A64(&q->hdr->sq_head), q->head, memory_order_release);
}

unsigned sq_take(struct sq_queue *q, struct dfccl_sqe *out, unsigned max)
{
	uint64_t tail = sq_tail_clamped(q), end;
	unsigned got = take_from(q, q->head, tail, out, max, NULL, NULL, UINT32_MAX, true, &end);
	advance_head(q, tail);
	return got;
}

unsigned sq_take_if(struct sq_queue *q, struct dfccl_sqe *out, unsigned max,
                    int (*want)(void *ctx, const struct dfccl_sqe *e), void *ctx, unsigned looks)
{
	uint64_t tail = sq_tail_clamped(q), end;
	unsigned got =
	    take_from(q, sched_look_start(q->look, q->head, tail), tail, out, max, want, ctx, looks, false, &end);
	q->look = end <= tail ? end : 0; /* past the tail: the next call starts at the head */
	advance_head(q, tail);
	return got;
}


static uint32_t check_range(const struct sq_queue *q, uint32_t reg_id, uint64_t off, uint64_t bytes, int required,
                            sq_reg_lookup_fn lookup, void *ctx)
{
	const struct sq_reg *r = reg_id ? lookup(ctx, reg_id) : NULL;
	return sqe_check_range(reg_id, r != NULL, r ? r->session_id : 0, r ? r->size : 0, q->session_id, off, bytes,
	                       required);
}

uint32_t sq_check(const struct sq_queue *q, const struct dfccl_sqe *e, sq_reg_lookup_fn lookup, void *ctx)
{
	uint64_t bytes;
	uint32_t st = sqe_check_entry(e, &bytes);
	/* The host engine has no device memory to store a completion in. */
	if (st == DFCCL_CQ_OK && (e->flags & DFCCL_SQE_F_DEVICE_DONE))
		return DFCCL_CQ_NOT_SUPPORTED;
	if (st != DFCCL_CQ_OK || e->opcode == DFCCL_OP_NOP)
		return st;
	st = check_range(q, e->send_reg, e->send_off, bytes, sqe_requires_send(e->opcode), lookup, ctx);
	if (st == DFCCL_CQ_OK)
		st = check_range(q, e->recv_reg, e->recv_off, bytes, sqe_requires_recv(e->opcode), lookup, ctx);
	return st;
}

void sq_complete(struct sq_queue *q, uint64_t seq, uint32_t status)
{
	sq_complete_group(q, seq, status, 0, 0);
}

void sq_complete_group(struct sq_queue *q, uint64_t seq, uint32_t status, uint64_t group_last, uint32_t group_n)
{
	uint64_t words = 0;
	bool own = true, last_word = false;
	uint32_t last_status = status;
	if (group_n > 1) {
		struct sq_group *g = &q->groups[DFCCL_QP_SLOT(group_last, q->n)];
		const bool is_last = seq == group_last;
		/* The last's completion before its count: whoever completes the
		 * group reads it after the count that includes it. */
		if (is_last) {
			atomic_store_explicit(A32(&g->last_status), status, memory_order_relaxed);
			atomic_store_explicit(A64(&g->last_seq), seq, memory_order_relaxed);
		}
		uint64_t w = atomic_load_explicit(A64(&g->count), memory_order_relaxed), next;
		do
			next = sqe_group_count(w, group_last);
		while (!atomic_compare_exchange_weak_explicit(A64(&g->count), &w, next, memory_order_acq_rel,
		                                              memory_order_relaxed));
		const uint32_t count = DFCCL_CW_STATUS(next);
		own = !is_last || count >= group_n;
		last_word = !is_last && count == group_n &&
		            atomic_load_explicit(A64(&g->last_seq), memory_order_relaxed) == group_last;
		if (last_word)
			last_status = atomic_load_explicit(A32(&g->last_status), memory_order_relaxed);
	}
	if (own) {
		atomic_store_explicit(A64(&q->cw[DFCCL_QP_SLOT(seq, q->n)]), DFCCL_CW_MAKE(seq, status),
		                      memory_order_release);
		words++;
	}
	if (last_word) {
		atomic_store_explicit(A64(&q->cw[DFCCL_QP_SLOT(group_last, q->n)]),
		                      DFCCL_CW_MAKE(group_last, last_status), memory_order_release);
		words++;
	}
	if (!words)
		return;
	atomic_fetch_add_explicit(A64(&q->hdr->completed), words, memory_order_release);
	queue_wake_waiters(q->hdr);
}

bool sq_group_waits(const struct dfccl_sqe *e, uint64_t seq, uint32_t n, const struct dfccl_sqe *sq,
                    const uint64_t *cws)
{
	uint64_t last;
	uint32_t gn = sqe_group(e, seq, n, &last);
	if (gn < 2 || last != seq)
		return false;
	for (uint64_t x = seq > n / 2u ? seq - n / 2u + 1 : 1; x < seq; x++) {
		const struct dfccl_sqe *m = &sq[DFCCL_QP_SLOT(x, n)];
		if (DFCCL_CW_SEQ(atomic_load_explicit(A64(&cws[DFCCL_QP_SLOT(x, n)]), memory_order_acquire)) >= x)
			continue; /* complete, or not this lap's */
		/* A member of this group, as the entry reads now. */
		uint16_t flags = atomic_load_explicit((_Atomic uint16_t *)&m->flags, memory_order_relaxed);
		if (atomic_load_explicit(A64(&m->seq), memory_order_relaxed) == x && (flags & DFCCL_SQE_F_GROUP) &&
		    atomic_load_explicit(A64(&m->group_last), memory_order_relaxed) == seq)
			return true;
	}
	return false;
}

void sq_set_engine_state(struct sq_queue *q, uint32_t state)
{
	atomic_store_explicit(A32(&q->hdr->engine_state), state, memory_order_seq_cst);
}

uint32_t sq_qp_state(const struct sq_queue *q)
{
	return atomic_load_explicit(A32(&q->hdr->qp_state), memory_order_acquire);
}
