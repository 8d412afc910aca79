/*
 * Fuzz target for the engine's handling of submission entries (gpu/sq.c):
 * the first 128 bytes of the input become a struct dfccl_sqe written into a
 * real queue region the way a client would (armed for the sequence number
 * the engine expects), then taken, checked against a small registration
 * table, and completed. The bytes after the entry steer the rest: keep the
 * entry's own seq (so seq != arm), and set the engine's starting head and
 * the client's tail to arbitrary values. Any status outside DFCCL_CQ_*, a
 * completion word other than DFCCL_CW_MAKE(seq, status), a scan that does
 * not end (libFuzzer's -timeout) or a crash is a bug.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "queue.h"
#include "sq.h"
#include "sqe_check.h"

#define N 16u
#define SESSION 7u

static const struct sq_reg regs[] = {
    {.reg_id = 1, .session_id = SESSION, .size = 1u << 20},
    {.reg_id = 2, .session_id = SESSION, .size = 4096},
    {.reg_id = 3, .session_id = SESSION + 1, .size = 1u << 20},
    {.reg_id = UINT32_MAX, .session_id = SESSION, .size = UINT64_MAX},
};

static const struct sq_reg *lookup(void *ctx, uint32_t id)
{
	for (unsigned i = 0; i < sizeof(regs) / sizeof(regs[0]); i++)
		if (regs[i].reg_id == id)
			return &regs[i];
	return NULL;
}

static uint64_t take_u64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static void *map;
	static size_t map_size;
	if (!map) {
		map_size = DFCCL_QP_REGION_SIZE(N);
		map = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (map == MAP_FAILED)
			abort();
	}
	struct dfccl_sqe e;
	memset(&e, 0, sizeof(e));
	memcpy(&e, data, size < sizeof(e) ? size : sizeof(e));
	const uint8_t *ctl = size > sizeof(e) ? data + sizeof(e) : NULL;
	size_t nctl = ctl ? size - sizeof(e) : 0;

	/* The raw entry, whatever it says, checks to a known status. */
	memset(map, 0, map_size);
	struct dfccl_qp_header *h = map;
	queue_header_init(h, 1, 0, N);
	if (nctl >= 9)
		h->sq_head = take_u64(ctl + 1);
	struct sq_queue q;
	char err[256];
	if (sq_queue_open(&q, map, map_size, 1, SESSION, err, sizeof(err)) < 0) {
		/* Refused only for a head beyond the 48-bit sequence space. */
		if (h->sq_head <= (1ull << 48) - 1 - N)
			abort();
		return 0;
	}
	if (sq_check(&q, &e, lookup, NULL) >= DFCCL_CQ_STATUS_COUNT_)
		abort();

	/* The same entry submitted through the queue. */
	uint64_t s = q.head;
	int own_seq = nctl >= 1 && (ctl[0] & 1);
	int own_tail = nctl >= 17 && (ctl[0] & 2);
	if (!own_seq)
		e.seq = s;
	e.arm = s;
	memcpy((char *)map + DFCCL_QP_SQ_OFFSET + (uint64_t)DFCCL_QP_SLOT(s, N) * DFCCL_SQE_SIZE, &e, sizeof(e));
	h->sq_tail = own_tail ? take_u64(ctl + 9) : s;

	struct dfccl_sqe out[N];
	unsigned got = sq_take(&q, out, N);
	if (got > N || (!own_tail && got != 1))
		abort();
	for (unsigned i = 0; i < got; i++) {
		uint32_t st = sq_check(&q, &out[i], lookup, NULL);
		if (st >= DFCCL_CQ_STATUS_COUNT_)
			abort();
		uint64_t before = h->completed, last;
		uint64_t *cw = (uint64_t *)((char *)map + DFCCL_QP_CW_OFFSET(N));
		/* An entry of a group: its own word unless it is the last, and
		 * at most the last's too; else exactly its own. */
		uint32_t gn = sqe_group(&out[i], out[i].seq, N, &last);
		sq_complete_group(&q, out[i].seq, st, last, gn);
		if (gn) {
			if ((out[i].seq != last && cw[DFCCL_QP_SLOT(out[i].seq, N)] != DFCCL_CW_MAKE(out[i].seq, st)) ||
			    h->completed > before + 2)
				abort();
			continue;
		}
		if (cw[DFCCL_QP_SLOT(out[i].seq, N)] != DFCCL_CW_MAKE(out[i].seq, st) || h->completed != before + 1)
			abort();
	}
	sq_queue_close(&q);
	return 0;
}
