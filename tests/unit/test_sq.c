/*
 * Tests of the engine side of a queue pair (gpu/sq.c) on a real region from
 * queue_region_create, mapped twice: once as the client sees it, once as the
 * engine does. The client half is written here from the ABI comment in
 * proto/dfccl_queue.h (reserve a sequence number, fill the slot, arm last),
 * and every expected slot, offset and completion word is computed here with
 * plain arithmetic rather than with the macros under test.
 *
 * Covered: armed entries are taken in any order and an unarmed one never
 * blocks those behind it; sq_head moves only over contiguous taken entries;
 * a client-written tail beyond one lap is clamped; reopening a queue does not
 * retake old entries; a filtered take with few looks resumes where the
 * last one stopped, so it reaches every entry of a long queue; sq_check maps each bad field to its status; and a
 * client thread and an engine thread run thousands of entries through a
 * small queue (the test to run under TSan).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "queue.h"
#include "sq.h"

#define N 16u             /* entries of the test queue */
#define SESSION 42u
#define OTHER_SESSION 99u

/* What the client does to a region, written from the ABI description. */
struct client {
	struct dfccl_qp_header *h;
	struct dfccl_sqe *sq;
	uint64_t *cw;
};

struct fixture {
	int fd;
	size_t size;
	void *client_map, *engine_map;
	struct client c;
	struct sq_queue q;
};

static void client_bind(struct client *c, void *map)
{
	c->h = map;
	c->sq = (struct dfccl_sqe *)((char *)map + 4096);
	c->cw = (uint64_t *)((char *)map + 4096 + N * 128);
}

static struct dfccl_sqe *client_slot(struct client *c, uint64_t seq)
{
	return &c->sq[(seq - 1) % N];
}

/* Reserves the next sequence number (sq_tail is the client's). */
static uint64_t client_reserve(struct client *c)
{
	_Atomic uint64_t *tail = (_Atomic uint64_t *)&c->h->sq_tail;
	uint64_t s = atomic_load_explicit(tail, memory_order_relaxed) + 1;
	atomic_store_explicit(tail, s, memory_order_release);
	return s;
}

/* Writes every field of entry seq from tmpl except `arm`, which the engine
 * may be polling and which is only ever stored last. */
static void client_write(struct client *c, uint64_t seq, const struct dfccl_sqe *tmpl)
{
	struct dfccl_sqe *e = client_slot(c, seq);
	memcpy((char *)e + 8, (const char *)tmpl + 8, sizeof(*e) - 8);
	e->seq = seq;
}

static void client_arm(struct client *c, uint64_t seq)
{
	atomic_store_explicit((_Atomic uint64_t *)&client_slot(c, seq)->arm, seq, memory_order_release);
}

/* A well-formed all-reduce of 256 floats from registration 1 into 2. */
static struct dfccl_sqe good_entry(void)
{
	struct dfccl_sqe e;
	memset(&e, 0, sizeof(e));
	e.opcode = DFCCL_OP_ALLREDUCE;
	e.dtype = 7; /* float32 */
	e.redop = 0; /* sum */
	e.comm_id = 5;
	e.count = 256;
	e.send_reg = 1;
	e.recv_reg = 2;
	return e;
}

static uint64_t submit(struct client *c, int arm)
{
	struct dfccl_sqe t = good_entry();
	uint64_t s = client_reserve(c);
	client_write(c, s, &t);
	if (arm)
		client_arm(c, s);
	return s;
}

static uint64_t engine_head(struct fixture *f)
{
	return atomic_load((_Atomic uint64_t *)&f->c.h->sq_head);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	f->fd = queue_region_create(1, 0, N, &f->size);
	if (f->fd < 0)
		return -1;
	/* Two mappings of one memfd, as in two processes. */
	f->client_map = mmap(NULL, f->size, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
	f->engine_map = mmap(NULL, f->size, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
	if (f->client_map == MAP_FAILED || f->engine_map == MAP_FAILED || f->client_map == f->engine_map)
		return -1;
	client_bind(&f->c, f->client_map);
	char err[256];
	if (sq_queue_open(&f->q, f->engine_map, f->size, 1, SESSION, err, sizeof(err)) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	sq_queue_close(&f->q);
	munmap(f->client_map, f->size);
	munmap(f->engine_map, f->size);
	close(f->fd);
	free(f);
	return 0;
}

/* ------------------------------------------------------------ taking */

static void test_open(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(f->q.n, N);
	/* A fresh queue starts at sequence number 1 and says so. */
	assert_int_equal(f->q.head, 1);
	assert_int_equal(engine_head(f), 1);
	assert_false(sq_pending(&f->q));
	struct dfccl_sqe out[N];
	assert_int_equal(sq_take(&f->q, out, N), 0);

	/* A region that fails its header check is refused. */
	struct sq_queue q2;
	char err[256] = "";
	assert_int_equal(sq_queue_open(&q2, f->engine_map, f->size - 4096, 1, SESSION, err, sizeof(err)), -EINVAL);
	assert_true(strlen(err) > 0);
	sq_queue_close(&q2);
}

static void test_take_in_order(void **state)
{
	struct fixture *f = *state;
	for (int i = 0; i < 3; i++)
		submit(&f->c, 1);
	assert_true(sq_pending(&f->q));
	struct dfccl_sqe out[N];
	assert_int_equal(sq_take(&f->q, out, N), 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(out[i].seq, i + 1);
		assert_int_equal(out[i].arm, i + 1);
		assert_int_equal(out[i].count, 256);
	}
	assert_int_equal(engine_head(f), 4);
	assert_false(sq_pending(&f->q));
	assert_int_equal(sq_take(&f->q, out, N), 0);
}

static void test_take_respects_max(void **state)
{
	struct fixture *f = *state;
	for (int i = 0; i < 5; i++)
		submit(&f->c, 1);
	struct dfccl_sqe out[2];
	assert_int_equal(sq_take(&f->q, out, 2), 2);
	assert_int_equal(out[1].seq, 2);
	assert_int_equal(engine_head(f), 3);
	assert_int_equal(sq_take(&f->q, out, 2), 2);
	assert_int_equal(sq_take(&f->q, out, 2), 1);
	assert_int_equal(out[0].seq, 5);
	assert_int_equal(engine_head(f), 6);
}

static void test_unarmed_head_does_not_block(void **state)
{
	struct fixture *f = *state;
	uint64_t s1 = submit(&f->c, 0); /* a stream will arm it later */
	submit(&f->c, 1);
	submit(&f->c, 1);
	struct dfccl_sqe out[N];
	assert_int_equal(sq_take(&f->q, out, N), 2);
	assert_int_equal(out[0].seq, 2);
	assert_int_equal(out[1].seq, 3);
	/* Entry 1 is not taken, so the head cannot pass it. */
	assert_int_equal(engine_head(f), 1);
	assert_true(sq_pending(&f->q));
	/* Taking again does not repeat 2 and 3. */
	assert_int_equal(sq_take(&f->q, out, N), 0);

	client_arm(&f->c, s1);
	assert_int_equal(sq_take(&f->q, out, N), 1);
	assert_int_equal(out[0].seq, 1);
	assert_int_equal(engine_head(f), 4);
	assert_false(sq_pending(&f->q));
}

/* With the head armed, a take ends at the first entry not armed: entries
 * a stream armed past it wait for the next take, so that engines on
 * different GPUs take a group's entries in the same order. */
static void test_armed_head_takes_the_run(void **state)
{
	struct fixture *f = *state;
	submit(&f->c, 1);
	submit(&f->c, 1);
	uint64_t s3 = submit(&f->c, 0); /* not armed yet ... */
	uint64_t s4 = submit(&f->c, 0);
	client_arm(&f->c, s4);          /* ... while the one after it is */
	submit(&f->c, 1);
	struct dfccl_sqe out[N];
	assert_int_equal(sq_take(&f->q, out, N), 2);
	assert_int_equal(out[0].seq, 1);
	assert_int_equal(out[1].seq, 2);
	assert_int_equal(engine_head(f), 3);

	/* Armed in the meantime: the run goes on in order, 3, 4, 5. */
	client_arm(&f->c, s3);
	assert_int_equal(sq_take(&f->q, out, N), 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(out[i].seq, 3 + i);
	assert_int_equal(engine_head(f), 6);
	assert_false(sq_pending(&f->q));

	/* Still not armed at the next take: the head is not armed, so that
	 * take looks past it (as test_unarmed_head_does_not_block). */
	uint64_t s6 = submit(&f->c, 0);
	submit(&f->c, 1);
	assert_int_equal(sq_take(&f->q, out, N), 1);
	assert_int_equal(out[0].seq, 7);
	assert_int_equal(engine_head(f), 6);
	client_arm(&f->c, s6);
	assert_int_equal(sq_take(&f->q, out, N), 1);
	assert_int_equal(out[0].seq, 6);
	assert_int_equal(engine_head(f), 8);
}

/* sq_take_if's test: the entry's count is one of the two wanted. */
static uint64_t wanted[2];

static int count_wanted(void *ctx, const struct dfccl_sqe *e)
{
	(void)ctx;
	return e->count == wanted[0] || e->count == wanted[1];
}

static uint64_t submit_count(struct client *c, uint64_t count)
{
	struct dfccl_sqe t = good_entry();
	t.count = count;
	uint64_t s = client_reserve(c);
	client_write(c, s, &t);
	client_arm(c, s);
	return s;
}

/* Three looks a call over 15 armed entries: the wanted ones, 14th and 2nd,
 * are found as the looks move on, wrapping to the head past the tail; the
 * others stay armed for sq_take, and the head moves over what is taken. */
static void test_take_if_resumes(void **state)
{
	struct fixture *f = *state;
	for (uint64_t k = 1; k <= 15; k++)
		submit_count(&f->c, 100 + k);
	wanted[0] = 114;
	wanted[1] = 0;
	struct dfccl_sqe out[N];
	unsigned calls = 0, got = 0;
	while (got == 0 && calls < 10) {
		got = sq_take_if(&f->q, out, N, count_wanted, NULL, 3);
		calls++;
	}
	assert_int_equal(got, 1);
	assert_int_equal(out[0].seq, 14);
	assert_int_equal(calls, 5); /* looks 1-3, 4-6, 7-9, 10-12, 13-15 */
	assert_int_equal(engine_head(f), 1);
	/* Past the tail: the next call looks from the head again. */
	wanted[1] = 102;
	assert_int_equal(sq_take_if(&f->q, out, N, count_wanted, NULL, 3), 1);
	assert_int_equal(out[0].seq, 2);
	assert_int_equal(engine_head(f), 1);
	/* The rest, in order, for whoever takes them all. */
	assert_int_equal(sq_take(&f->q, out, N), 13);
	assert_int_equal(out[0].seq, 1);
	assert_int_equal(out[1].seq, 3);
	assert_int_equal(out[12].seq, 15);
	assert_int_equal(engine_head(f), 16);
}

static void test_head_contiguous(void **state)
{
	struct fixture *f = *state;
	submit(&f->c, 1);
	uint64_t s2 = submit(&f->c, 0);
	submit(&f->c, 1);
	uint64_t s4 = submit(&f->c, 0);
	submit(&f->c, 1);
	struct dfccl_sqe out[N];
	assert_int_equal(sq_take(&f->q, out, N), 1); /* the armed run from the head: 1 */
	assert_int_equal(engine_head(f), 2);
	assert_int_equal(sq_take(&f->q, out, N), 2); /* the head not armed: 3, 5 */
	assert_int_equal(out[0].seq, 3);
	assert_int_equal(out[1].seq, 5);
	assert_int_equal(engine_head(f), 2);
	client_arm(&f->c, s4);
	assert_int_equal(sq_take(&f->q, out, N), 1);
	assert_int_equal(out[0].seq, 4);
	assert_int_equal(engine_head(f), 2); /* 2 still missing */
	client_arm(&f->c, s2);
	assert_int_equal(sq_take(&f->q, out, N), 1);
	assert_int_equal(out[0].seq, 2);
	assert_int_equal(engine_head(f), 6);
}

static void test_wrong_lap_not_taken(void **state)
{
	struct fixture *f = *state;
	/* Slot 0 holds an entry armed for sequence 17 while the engine expects
	 * 1 there: a stale or forged entry of another lap is not ready. */
	uint64_t s = client_reserve(&f->c);
	struct dfccl_sqe t = good_entry();
	client_write(&f->c, s, &t);
	client_slot(&f->c, s)->seq = s + N;
	atomic_store((_Atomic uint64_t *)&client_slot(&f->c, s)->arm, s + N);
	struct dfccl_sqe out[N];
	assert_int_equal(sq_take(&f->q, out, N), 0);
	assert_int_equal(engine_head(f), 1);
}

static void test_tail_clamped(void **state)
{
	struct fixture *f = *state;
	/* Fill a whole lap properly, then claim a tail far beyond it. */
	for (unsigned i = 0; i < N; i++)
		submit(&f->c, 1);
	f->c.h->sq_tail = 1000000;
	struct dfccl_sqe out[2 * N];
	assert_int_equal(sq_take(&f->q, out, 2 * N), N);
	for (unsigned i = 0; i < N; i++)
		assert_int_equal(out[i].seq, i + 1);
	assert_int_equal(engine_head(f), N + 1);

	/* A tail at the top of the range must not make the scan run away or
	 * wrap: nothing is armed, nothing is taken. */
	f->c.h->sq_tail = UINT64_MAX;
	assert_int_equal(sq_take(&f->q, out, 2 * N), 0);
	assert_int_equal(engine_head(f), N + 1);
	/* A tail behind the head means nothing to do. */
	f->c.h->sq_tail = 3;
	assert_false(sq_pending(&f->q));
	assert_int_equal(sq_take(&f->q, out, 2 * N), 0);
}

static void test_wraps_around(void **state)
{
	struct fixture *f = *state;
	struct dfccl_sqe out[N];
	/* Three laps through the queue, completing everything in between. */
	for (unsigned lap = 0; lap < 3; lap++) {
		for (unsigned i = 0; i < N; i++)
			submit(&f->c, 1);
		assert_int_equal(sq_take(&f->q, out, N), N);
		for (unsigned i = 0; i < N; i++) {
			assert_int_equal(out[i].seq, lap * N + i + 1);
			sq_complete(&f->q, out[i].seq, DFCCL_CQ_OK);
		}
	}
	assert_int_equal(engine_head(f), 3 * N + 1);
	assert_int_equal(f->c.h->completed, 3 * N);
	for (unsigned i = 0; i < N; i++)
		assert_int_equal(f->c.cw[i], (uint64_t)(2 * N + i + 1) << 16);
}

static void test_entry_is_a_copy(void **state)
{
	struct fixture *f = *state;
	uint64_t s = submit(&f->c, 1);
	struct dfccl_sqe out[1];
	assert_int_equal(sq_take(&f->q, out, 1), 1);
	/* The client rewrites the entry after the engine took it: the engine's
	 * copy, which is what gets checked and executed, does not change. */
	client_slot(&f->c, s)->count = UINT64_MAX;
	client_slot(&f->c, s)->send_reg = 77;
	assert_int_equal(out[0].count, 256);
	assert_int_equal(out[0].send_reg, 1);
}

static void test_reopen_does_not_retake(void **state)
{
	struct fixture *f = *state;
	for (int i = 0; i < 5; i++)
		submit(&f->c, 1);
	struct dfccl_sqe out[N];
	assert_int_equal(sq_take(&f->q, out, N), 5);
	assert_int_equal(engine_head(f), 6);

	/* A replacement worker opens the same region: entries 1..5 are still
	 * armed in memory but below sq_head, so they were handled. */
	sq_queue_close(&f->q);
	char err[256];
	assert_int_equal(sq_queue_open(&f->q, f->engine_map, f->size, 1, SESSION, err, sizeof(err)), 0);
	assert_int_equal(f->q.head, 6);
	assert_false(sq_pending(&f->q));
	assert_int_equal(sq_take(&f->q, out, N), 0);
	submit(&f->c, 1);
	assert_int_equal(sq_take(&f->q, out, N), 1);
	assert_int_equal(out[0].seq, 6);
	assert_int_equal(engine_head(f), 7);

	/* Reopening after more than a lap: the scan still starts at the head. */
	for (unsigned i = 0; i < N + 3; i++) {
		submit(&f->c, 1);
		if (sq_take(&f->q, out, 1) != 1)
			fail();
	}
	sq_queue_close(&f->q);
	assert_int_equal(sq_queue_open(&f->q, f->engine_map, f->size, 1, SESSION, err, sizeof(err)), 0);
	assert_int_equal(f->q.head, 7 + N + 3);
	assert_int_equal(sq_take(&f->q, out, N), 0);
}

static void test_reopen_forged_head(void **state)
{
	struct fixture *f = *state;
	char err[256];
	struct dfccl_sqe out[N];
	sq_queue_close(&f->q);
	/* sq_head lies in memory the client can write. Near 2^64, head + n
	 * would wrap and the scan would never end (the engine's whole device
	 * would hang); beyond the 48 bits of a completion word it is forged. */
	const uint64_t max_seq = (1ull << 48) - 1;
	const uint64_t forged[] = {UINT64_MAX, UINT64_MAX - N + 1, 1ull << 63, max_seq - N + 1};
	for (unsigned i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
		f->c.h->sq_head = forged[i];
		f->c.h->sq_tail = UINT64_MAX;
		err[0] = '\0';
		assert_int_equal(sq_queue_open(&f->q, f->engine_map, f->size, 1, SESSION, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "sq_head"));
		sq_queue_close(&f->q);
	}
	/* The highest head still accepted leaves room for one lap; a scan
	 * against a runaway tail ends. */
	f->c.h->sq_head = max_seq - N;
	assert_int_equal(sq_queue_open(&f->q, f->engine_map, f->size, 1, SESSION, err, sizeof(err)), 0);
	assert_int_equal(sq_take(&f->q, out, N), 0);
	assert_true(sq_pending(&f->q));
}

/* ------------------------------------------------------------ checking */

static const struct sq_reg regs[] = {
    {.reg_id = 1, .session_id = SESSION, .size = 4096},
    {.reg_id = 2, .session_id = SESSION, .size = 1024},
    {.reg_id = 3, .session_id = OTHER_SESSION, .size = 4096},
};

static const struct sq_reg *lookup(void *ctx, uint32_t id)
{
	for (unsigned i = 0; i < sizeof(regs) / sizeof(regs[0]); i++)
		if (regs[i].reg_id == id)
			return &regs[i];
	return NULL;
}

static uint32_t check(struct fixture *f, const struct dfccl_sqe *e)
{
	return sq_check(&f->q, e, lookup, NULL);
}

/* A good entry of opcode op, armed as sequence 1. */
static struct dfccl_sqe entry_of(uint8_t op)
{
	struct dfccl_sqe e = good_entry();
	e.opcode = op;
	e.seq = e.arm = 1;
	return e;
}

static void test_check_good(void **state)
{
	struct fixture *f = *state;
	for (uint8_t op = 0; op < DFCCL_OP_COUNT_; op++) {
		struct dfccl_sqe e = entry_of(op);
		assert_int_equal(check(f, &e), DFCCL_CQ_OK);
	}
	/* NOP completes whatever else the entry says. */
	struct dfccl_sqe nop;
	memset(&nop, 0xab, sizeof(nop));
	nop.opcode = DFCCL_OP_NOP;
	nop.flags = DFCCL_SQE_F_PRIORITY;
	nop.seq = nop.arm = 9;
	assert_int_equal(check(f, &nop), DFCCL_CQ_OK);
	/* Every known flag is accepted. */
	struct dfccl_sqe e = entry_of(DFCCL_OP_ALLREDUCE);
	e.flags = DFCCL_SQE_F_INPLACE | DFCCL_SQE_F_REGISTERED | DFCCL_SQE_F_PRIORITY | DFCCL_SQE_F_STREAM_ARMED;
	assert_int_equal(check(f, &e), DFCCL_CQ_OK);
	/* A buffer that exactly fills its registration: 1024 bytes at 3072 of
	 * 4096, into all of registration 2. */
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.send_off = 3072;
	assert_int_equal(check(f, &e), DFCCL_CQ_OK);
	/* Zero elements at the very end of a registration. */
	e.count = 0;
	e.send_off = 4096;
	e.recv_off = 1024;
	assert_int_equal(check(f, &e), DFCCL_CQ_OK);
	/* An offset that is not a whole number of elements is refused only
	 * where the entry names that buffer: a receive has no send buffer. */
	e = entry_of(DFCCL_OP_RECV);
	e.send_reg = 0;
	e.send_off = 3;
	assert_int_equal(check(f, &e), DFCCL_CQ_OK);
	/* One byte into a one-byte type is a whole element. */
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.dtype = 0; /* int8 */
	e.send_off = 1;
	e.recv_off = 3;
	assert_int_equal(check(f, &e), DFCCL_CQ_OK);
}

static void test_check_dtype_sizes(void **state)
{
	struct fixture *f = *state;
	/* dfcclDataType_t: int8 uint8 int32 uint32 int64 uint64 f16 f32 f64 bf16 */
	static const unsigned size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
	for (uint8_t dt = 0; dt < 10; dt++) {
		assert_int_equal(sq_dtype_size(dt), size[dt]);
		/* Exactly 1024 bytes fit registration 2; one element more does not. */
		struct dfccl_sqe e = entry_of(DFCCL_OP_ALLREDUCE);
		e.dtype = dt;
		e.count = 1024 / size[dt];
		assert_int_equal(check(f, &e), DFCCL_CQ_OK);
		e.count++;
		assert_int_equal(check(f, &e), DFCCL_CQ_OUT_OF_RANGE);
	}
	assert_int_equal(sq_dtype_size(10), 0);
	assert_int_equal(sq_dtype_size(UINT32_MAX), 0);
}

static void test_check_bad_fields(void **state)
{
	struct fixture *f = *state;
	struct dfccl_sqe e;
	int reached[DFCCL_CQ_STATUS_COUNT_] = {0};
#define EXPECT(status)                                 \
	do {                                           \
		uint32_t st_ = check(f, &e);           \
		assert_int_equal(st_, (status));       \
		reached[st_] = 1;                      \
	} while (0)

	e = entry_of(DFCCL_OP_ALLREDUCE);
	EXPECT(DFCCL_CQ_OK);

	e = entry_of(DFCCL_OP_COUNT_);
	EXPECT(DFCCL_CQ_BAD_OPCODE);
	e = entry_of(255);
	EXPECT(DFCCL_CQ_BAD_OPCODE);

	e = entry_of(DFCCL_OP_ALLGATHER);
	e.dtype = 10;
	EXPECT(DFCCL_CQ_BAD_DTYPE);
	e.dtype = 255;
	EXPECT(DFCCL_CQ_BAD_DTYPE);

	/* The reduction operator matters only to reducing collectives. */
	static const uint8_t reducing[] = {DFCCL_OP_ALLREDUCE, DFCCL_OP_REDUCESCATTER, DFCCL_OP_REDUCE};
	static const uint8_t plain[] = {DFCCL_OP_ALLGATHER, DFCCL_OP_BROADCAST, DFCCL_OP_SEND, DFCCL_OP_RECV};
	for (unsigned i = 0; i < sizeof(reducing); i++) {
		e = entry_of(reducing[i]);
		e.redop = 5;
		EXPECT(DFCCL_CQ_BAD_REDOP);
		e.redop = 255;
		EXPECT(DFCCL_CQ_BAD_REDOP);
		e.redop = 4; /* avg, the last valid one */
		EXPECT(DFCCL_CQ_OK);
	}
	for (unsigned i = 0; i < sizeof(plain); i++) {
		e = entry_of(plain[i]);
		e.redop = 200;
		EXPECT(DFCCL_CQ_OK);
	}

	e = entry_of(DFCCL_OP_BROADCAST);
	e.comm_id = 0;
	EXPECT(DFCCL_CQ_BAD_COMM);

	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.send_reg = 77; /* never registered */
	EXPECT(DFCCL_CQ_BAD_REG);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.recv_reg = 3; /* another session's */
	EXPECT(DFCCL_CQ_BAD_REG);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.send_reg = 0; /* an all-reduce needs a send buffer */
	EXPECT(DFCCL_CQ_BAD_REG);
	e = entry_of(DFCCL_OP_SEND);
	e.recv_reg = 0; /* a send needs none to receive into */
	EXPECT(DFCCL_CQ_OK);
	e = entry_of(DFCCL_OP_RECV);
	e.send_reg = 0;
	EXPECT(DFCCL_CQ_OK);
	e.recv_reg = 0;
	EXPECT(DFCCL_CQ_BAD_REG);

	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.send_off = 3073; /* 1024 bytes from 3073 end one byte past 4096 */
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.recv_off = 1; /* registration 2 is exactly 1024 bytes */
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.send_off = 4097;
	e.count = 0;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	/* offset + bytes wraps around 2^64 to something small. */
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.send_off = UINT64_MAX - 100;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	/* count * 4 wraps to 0 and count * 8 wraps to 8: still out of range. */
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.count = (UINT64_MAX / 4) + 1;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.dtype = 8; /* float64 */
	e.count = (1ull << 61) + 1;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	e.count = UINT64_MAX;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);

	/* Buffers off their elements' boundaries, in range (a GPU would stop
	 * on the first misaligned load). */
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.send_off = 2; /* float32: half an element in */
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.recv_off = 1;
	e.count = 16;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.dtype = 8; /* float64 */
	e.count = 16;
	e.send_off = 4;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.dtype = 6; /* float16 */
	e.recv_off = 7;
	e.count = 16;
	EXPECT(DFCCL_CQ_OUT_OF_RANGE);

	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.arm = 2; /* armed for another sequence number than it says */
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e = entry_of(DFCCL_OP_NOP);
	e.seq = 0;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.flags = 0x10;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.flags = 0x8000;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e = entry_of(DFCCL_OP_NOP);
	e.flags = 0x40; /* unknown flags are refused even on a NOP */
	EXPECT(DFCCL_CQ_BAD_ENTRY);

	/* A group's fields must hold: the entry (seq 1) within the group of
	 * group_n ending at group_last, a size of 1 to half the largest
	 * queue, a last that fits a completion word. */
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.flags = DFCCL_SQE_F_GROUP;
	e.group_last = 3;
	e.group_n = 3;
	EXPECT(DFCCL_CQ_OK);
	e.group_n = 2; /* not in a row: 1 and 3 (a stream's among another's) */
	EXPECT(DFCCL_CQ_OK);
	e.group_last = 1 + DFCCL_SQ_MAX_ENTRIES / 2; /* half the largest queue after it */
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.group_last = DFCCL_SQ_MAX_ENTRIES / 2;
	EXPECT(DFCCL_CQ_OK);
	e.group_last = 1;
	e.group_n = 1;
	EXPECT(DFCCL_CQ_OK);
	e.group_n = 0;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.group_last = 0; /* before the entry */
	e.group_n = 4;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.group_last = DFCCL_SQ_MAX_ENTRIES / 2;
	e.group_n = DFCCL_SQ_MAX_ENTRIES / 2;
	EXPECT(DFCCL_CQ_OK);
	e.group_last = e.group_n = DFCCL_SQ_MAX_ENTRIES / 2 + 1;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.group_last = UINT64_MAX; /* far past any group of it */
	e.group_n = 2;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	/* Group fields without the flag are not looked at. */
	e.flags = 0;
	EXPECT(DFCCL_CQ_OK);
	e = entry_of(DFCCL_OP_NOP);
	e.flags = DFCCL_SQE_F_GROUP;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.group_last = e.group_n = 1;
	EXPECT(DFCCL_CQ_OK);

	/* A device completion word must be named and one aligned word; the
	 * host engine, with no device memory to store into, refuses even a
	 * good one, NOP or not (the GPU engine stores it). */
	e = entry_of(DFCCL_OP_ALLREDUCE);
	e.flags = DFCCL_SQE_F_DEVICE_DONE | DFCCL_SQE_F_STREAM_ARMED;
	e.done_reg = 0;
	e.done_off = 8;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.done_reg = 2;
	e.done_off = 12;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
	e.done_off = 16;
	EXPECT(DFCCL_CQ_NOT_SUPPORTED);
	e = entry_of(DFCCL_OP_NOP);
	e.flags = DFCCL_SQE_F_DEVICE_DONE;
	e.done_reg = 2;
	EXPECT(DFCCL_CQ_NOT_SUPPORTED);
	e.done_off = 4;
	EXPECT(DFCCL_CQ_BAD_ENTRY);
#undef EXPECT

	/* Every status a submission entry can earn by its own fields was
	 * reached; the rest (peer lost, aborted, device lost, timeout, not
	 * supported) come from the engine while it runs the collective. */
	for (uint32_t st = DFCCL_CQ_OK; st <= DFCCL_CQ_BAD_ENTRY; st++)
		assert_true(reached[st]);
}

static void test_complete(void **state)
{
	struct fixture *f = *state;
	sq_complete(&f->q, 1, DFCCL_CQ_OK);
	assert_int_equal(f->c.cw[0], 1ull << 16);
	assert_int_equal(f->c.h->completed, 1);
	sq_complete(&f->q, 2, DFCCL_CQ_OUT_OF_RANGE);
	assert_int_equal(f->c.cw[1], (2ull << 16) | 5);
	sq_complete(&f->q, 16, DFCCL_CQ_NOT_SUPPORTED);
	assert_int_equal(f->c.cw[15], (16ull << 16) | 12);
	/* The next lap's entry in slot 0 overwrites with a larger word. */
	sq_complete(&f->q, 17, DFCCL_CQ_TIMEOUT);
	assert_int_equal(f->c.cw[0], (17ull << 16) | 11);
	assert_int_equal(f->c.h->completed, 4);
	/* Nothing else in the region moved. */
	assert_int_equal(f->c.cw[2], 0);
	assert_int_equal(f->c.h->sq_tail, 0);

	sq_set_engine_state(&f->q, DFCCL_ENGINE_SLEEPING);
	assert_int_equal(f->c.h->engine_state, DFCCL_ENGINE_SLEEPING);
	f->c.h->qp_state = DFCCL_QP_CLOSED;
	assert_int_equal(sq_qp_state(&f->q), DFCCL_QP_CLOSED);
}

/* A group's completions: every entry's word at once but the last's, which
 * comes (with its own status) with the group's last completion, whatever
 * the order; `completed` counts words written. */
static void test_complete_group(void **state)
{
	struct fixture *f = *state;
	volatile uint64_t *cw = f->c.cw;
	/* Entries 3..6, the last (6) first, with an error of its own. */
	sq_complete_group(&f->q, 6, DFCCL_CQ_MISMATCH, 6, 4);
	assert_int_equal(cw[5], 0);
	assert_int_equal(f->c.h->completed, 0);
	sq_complete_group(&f->q, 4, DFCCL_CQ_OK, 6, 4);
	sq_complete_group(&f->q, 3, DFCCL_CQ_ABORTED, 6, 4);
	assert_int_equal(cw[3], 4ull << 16);
	assert_int_equal(cw[2], (3ull << 16) | DFCCL_CQ_ABORTED);
	assert_int_equal(cw[5], 0);
	assert_int_equal(f->c.h->completed, 2);
	sq_complete_group(&f->q, 5, DFCCL_CQ_OK, 6, 4);
	assert_int_equal(cw[4], 5ull << 16);
	assert_int_equal(cw[5], (6ull << 16) | DFCCL_CQ_MISMATCH);
	assert_int_equal(f->c.h->completed, 4);

	/* The next lap's group at the same last slot starts its count over:
	 * 20..22, the last one completing last. */
	sq_complete_group(&f->q, 20, DFCCL_CQ_OK, 22, 3);
	sq_complete_group(&f->q, 21, DFCCL_CQ_OK, 22, 3);
	assert_int_equal(cw[5], (6ull << 16) | DFCCL_CQ_MISMATCH);
	sq_complete_group(&f->q, 22, DFCCL_CQ_OK, 22, 3);
	assert_int_equal(cw[5], 22ull << 16);
	assert_int_equal(f->c.h->completed, 7);

	/* A forged group whose count reaches its size without its last
	 * (30 claims a group of 2 ending at 32, 31 one of 3): nobody writes
	 * the last's word from another's completion (what the slot holds is
	 * an earlier lap's), the last writes its own when it comes. */
	sq_complete_group(&f->q, 30, DFCCL_CQ_OK, 32, 2);
	sq_complete_group(&f->q, 31, DFCCL_CQ_OK, 32, 2);
	assert_int_equal(cw[15], 0);
	assert_int_equal(f->c.h->completed, 9);
	sq_complete_group(&f->q, 32, DFCCL_CQ_BAD_ENTRY, 32, 2);
	assert_int_equal(cw[15], (32ull << 16) | DFCCL_CQ_BAD_ENTRY);
	assert_int_equal(f->c.h->completed, 10);

	/* A group of one is a plain completion; so is no group. */
	sq_complete_group(&f->q, 23, DFCCL_CQ_TIMEOUT, 23, 1);
	assert_int_equal(cw[6], (23ull << 16) | DFCCL_CQ_TIMEOUT);
	sq_complete_group(&f->q, 24, DFCCL_CQ_OK, 0, 0);
	assert_int_equal(cw[7], 24ull << 16);
	assert_int_equal(f->c.h->completed, 12);
}

/* A group's last entry waits for its group while an earlier entry of it
 * has no word, in a row or not; not a group's other entries, nor one
 * alone, nor for entries of other groups. */
static void test_group_waits(void **state)
{
	struct fixture *f = *state;
	struct dfccl_sqe *sq = f->c.sq;
	/* Entries 4, 6 and 7 a group ending at 7 (a stream's), 5 another's. */
	for (uint64_t s = 4; s <= 7; s++) {
		sq[s - 1] = entry_of(DFCCL_OP_ALLREDUCE);
		sq[s - 1].seq = sq[s - 1].arm = s;
		if (s != 5) {
			sq[s - 1].flags = DFCCL_SQE_F_GROUP;
			sq[s - 1].group_last = 7;
			sq[s - 1].group_n = 3;
		}
	}
	const struct dfccl_sqe *e = &sq[6];
	assert_true(sq_group_waits(e, 7, N, sq, f->c.cw));
	assert_false(sq_group_waits(&sq[5], 6, N, sq, f->c.cw)); /* not the last */
	sq_complete_group(&f->q, 4, DFCCL_CQ_OK, 7, 3);
	assert_true(sq_group_waits(e, 7, N, sq, f->c.cw));
	sq_complete_group(&f->q, 6, DFCCL_CQ_ABORTED, 7, 3);
	/* 5 is pending, but of no group of 7's: the last's own work is left */
	assert_false(sq_group_waits(e, 7, N, sq, f->c.cw));
	/* The next lap's group in the same slots: the words there are the
	 * earlier lap's, and its entries say so too. */
	for (uint64_t s = 4; s <= 7; s++) {
		sq[s - 1].seq = sq[s - 1].arm = s + N;
		sq[s - 1].group_last = 7 + N;
	}
	assert_true(sq_group_waits(e, 7 + N, N, sq, f->c.cw));
	sq[3].seq = 4; /* its slot still holds the earlier lap's entry: no member */
	sq[5].seq = 6;
	assert_false(sq_group_waits(e, 7 + N, N, sq, f->c.cw));
	struct dfccl_sqe alone = *e;
	alone.flags = 0;
	assert_false(sq_group_waits(&alone, 7 + N, N, sq, f->c.cw));
	alone.flags = DFCCL_SQE_F_GROUP;
	alone.group_n = N; /* more than half the queue: no group */
	assert_false(sq_group_waits(&alone, 7 + N, N, sq, f->c.cw));
}

/* ------------------------------------------------------------ two threads */

#define STRESS_ENTRIES 20000u
#define STRESS_WINDOW 4u /* reserved together, armed in reverse order (or in order: forward) */

struct stress {
	struct fixture *f;
	uint8_t seen[STRESS_ENTRIES + 1];
	unsigned bad; /* engine thread's findings */
	unsigned client_bad;
	int forward;          /* arm each window in order, as a stream arms a group */
	unsigned out_of_order; /* entries taken after a later one */
};

static void *stress_engine(void *arg)
{
	struct stress *st = arg;
	struct sq_queue *q = &st->f->q;
	struct dfccl_sqe out[N];
	unsigned done = 0;
	uint64_t last = 0;
	while (done < STRESS_ENTRIES) {
		unsigned got = sq_take(q, out, N);
		if (!got)
			sched_yield();
		for (unsigned i = 0; i < got; i++) {
			uint64_t s = out[i].seq;
			st->out_of_order += s < last;
			last = s > last ? s : last;
			uint32_t status = sq_check(q, &out[i], lookup, NULL);
			/* The copy must be the entry the client wrote for s. */
			if (s == 0 || s > STRESS_ENTRIES || st->seen[s] || status != DFCCL_CQ_OK ||
			    out[i].user_tag != s * 3)
				st->bad++;
			else
				st->seen[s] = 1;
			sq_complete(q, s, status);
			done++;
		}
	}
	return NULL;
}

static void *stress_client(void *arg)
{
	struct stress *st = arg;
	struct client *c = &st->f->c;
	for (uint64_t base = 1; base <= STRESS_ENTRIES; base += STRESS_WINDOW) {
		uint64_t s[STRESS_WINDOW];
		for (unsigned k = 0; k < STRESS_WINDOW; k++) {
			s[k] = base + k;
			/* The slot is free once its previous occupant completed. */
			if (s[k] > N) {
				_Atomic uint64_t *w = (_Atomic uint64_t *)&c->cw[(s[k] - 1) % N];
				while (atomic_load_explicit(w, memory_order_acquire) < ((s[k] - N) << 16))
					sched_yield();
			}
			struct dfccl_sqe t = good_entry();
			t.user_tag = s[k] * 3;
			/* No CMocka assertion off the main thread: count instead. */
			if (client_reserve(c) != s[k])
				st->client_bad++;
			client_write(c, s[k], &t);
		}
		for (unsigned k = 0; k < STRESS_WINDOW; k++)
			client_arm(c, s[st->forward ? k : STRESS_WINDOW - 1 - k]);
	}
	return NULL;
}

static void two_threads(void **state, int forward)
{
	struct stress *st = calloc(1, sizeof(*st));
	assert_non_null(st);
	st->f = *state;
	st->forward = forward;
	pthread_t te, tc;
	assert_int_equal(pthread_create(&te, NULL, stress_engine, st), 0);
	assert_int_equal(pthread_create(&tc, NULL, stress_client, st), 0);
	pthread_join(tc, NULL);
	pthread_join(te, NULL);
	assert_int_equal(st->bad, 0);
	assert_int_equal(st->client_bad, 0);
	for (uint64_t s = 1; s <= STRESS_ENTRIES; s++)
		assert_true(st->seen[s]);
	assert_int_equal(st->f->c.h->completed, STRESS_ENTRIES);
	assert_int_equal(engine_head(st->f), STRESS_ENTRIES + 1);
	for (unsigned i = 0; i < N; i++)
		assert_int_equal(st->f->c.cw[i], (uint64_t)(STRESS_ENTRIES - N + i + 1) << 16);
	/* Armed in order, taken in order, however the takes fell between the
	 * arms (scheduler.h, "Taking in order"). */
	if (forward)
		assert_int_equal(st->out_of_order, 0);
	free(st);
}

static void test_two_threads(void **state)
{
	two_threads(state, 0);
}

static void test_two_threads_armed_in_order(void **state)
{
	two_threads(state, 1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
	    T(test_open),
	    T(test_take_in_order),
	    T(test_take_respects_max),
	    T(test_unarmed_head_does_not_block),
	    T(test_armed_head_takes_the_run),
	    T(test_take_if_resumes),
	    T(test_head_contiguous),
	    T(test_wrong_lap_not_taken),
	    T(test_tail_clamped),
	    T(test_wraps_around),
	    T(test_entry_is_a_copy),
	    T(test_reopen_does_not_retake),
	    T(test_reopen_forged_head),
	    T(test_check_good),
	    T(test_check_dtype_sizes),
	    T(test_check_bad_fields),
	    T(test_complete),
	    T(test_complete_group),
	    T(test_group_waits),
	    T(test_two_threads),
	    T(test_two_threads_armed_in_order),
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
