/*
 * Tests of the host engine (gpu/host/) with several simulated workers in
 * one process: K engines (one per "device"), each session's queue pair in
 * plain memory initialised with queue_header_init, the communicators'
 * shared regions in plain memory, and one registration table that every
 * engine looks buffers up in. The client half writes entries as the ABI
 * says (arm last); the worker half takes, checks and submits them; one loop
 * runs every engine round-robin on this single thread until every
 * completion word has arrived, with a cap on the rounds so a bug fails the
 * test instead of hanging it. Spin thresholds are small: on one thread a
 * spinning engine only delays the peers it waits for.
 *
 * Inputs are small integers, so every exact result fits every type and the
 * reference is computed here in int64 or double arithmetic, then wrapped or
 * rounded to the element type with code of this file's own.
 *
 * Covered: every collective x dtype x op x in/out-of-place on 2, 3, 4 and 8
 * ranks, spread over 1, 2 and 3 engines, with ranks sharing engines and
 * sessions; send/recv with mailbox reuse; a large message that takes several
 * visits; the DFCCL deadlock pattern (4 ranks, 4 communicators, per-rank
 * random orders); all-reduce over a forced ring, tree, multi-tree and
 * direct algorithm, for every collective each one runs (entry hint, engine
 * setting, or the plan's table; default and random plans: random rings,
 * random trees) x dtype x op x in/out-of-place on 2, 3, 4, 5 and 8 ranks,
 * large messages that yield mid-step and reuse connector halves, the plan's
 * choice by size and a damaged plan, mismatched entries, and the deadlock
 * pattern with each algorithm forced;
 * registered collectives in different orders per rank;
 * priority order; more tasks than the task queue holds; fair admission
 * through the engine interface (a flooder refused past max-inflight, the
 * sessions of one uid refused past the uid's limit, flooders within the
 * limits that leave a victim its place, with memory given back when they
 * drain, and collectives and sends/receives in opposite orders that
 * complete beyond the room); abort,
 * inconsistent posts, a lost queue, a removed communicator, every
 * submit-time check, and a head wait on a starved engine, which naps and
 * still ends within its threshold's worth of time.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cmocka.h>

#include "dfccl_comm.h"
#include "host_engine.h"
#include "queue.h"
#include "sq.h"
#include "testutil.h"

#define QN 2048u      /* entries per test queue */
#define MAX_ENG 4u
#define MAX_Q 16u
#define MAX_REGIONS 64u
#define MAX_REGS 8192u
#define MAX_N 8u
#define ROUND_CAP 200000u

static const struct sched_params small_spins = {
    .spin_head = 64, .spin_other = 4, .stick_mult = 4, .spin_max = 1024, .order = SCHED_ORDER_FIFO};

/* ------------------------------------------------------------------ registrations */

static struct sq_reg regs[MAX_REGS];
static uint32_t nregs;
static uint32_t lookup_log[64];
static unsigned nlog;
static int logging;

static const struct sq_reg *reg_lookup(void *ctx, uint32_t id)
{
	(void)ctx;
	if (logging && nlog < 64)
		lookup_log[nlog++] = id;
	if (id == 0 || id > nregs || !regs[id - 1].base)
		return NULL;
	return &regs[id - 1];
}

static uint32_t reg_new(uint64_t session, size_t bytes)
{
	assert_true(nregs < MAX_REGS);
	struct sq_reg *r = &regs[nregs++];
	r->reg_id = nregs;
	r->session_id = session;
	r->size = bytes;
	r->base = malloc(bytes ? bytes : 1);
	assert_non_null(r->base);
	memset(r->base, 0xa5, bytes);
	return r->reg_id;
}

static char *reg_ptr(uint32_t id)
{
	return regs[id - 1].base;
}

static void regs_reset(void)
{
	for (uint32_t i = 0; i < nregs; i++)
		free(regs[i].base);
	memset(regs, 0, sizeof(regs));
	nregs = 0;
}

/* ------------------------------------------------------------------ simulated workers */

struct tq {
	void *map;
	struct sq_queue q;
	unsigned eng;
	uint64_t submitted;
	int gone;
};

struct sim {
	struct host_engine *eng[MAX_ENG];
	struct dfccl_worker_stats stats[MAX_ENG];
	unsigned neng;
	struct tq qs[MAX_Q];
	unsigned nq;
	void *regions[MAX_REGIONS];
	size_t region_size[MAX_REGIONS];
	unsigned nregions;
	const struct engine_ops *ops; /* engines behind the worker's interface: they take their own entries */
};

/* The bytes a task moves per visit in the engines sim_init makes (0: the
 * engine's default): test_visit_bytes sets it, and sets it back. */
static uint64_t sim_visit_bytes;
/* How their waits give up the core (NULL: the engine's nap):
 * test_starved_wait sets it, and sets it back. */
static void (*sim_nap)(void);

/* Engines whose all-reduce setting is algo (enum dfccl_algo). */
static void sim_init_algo(struct sim *s, unsigned neng, const struct sched_params *p, uint32_t algo)
{
	memset(s, 0, sizeof(*s));
	s->neng = neng;
	for (unsigned i = 0; i < neng; i++) {
		struct host_engine_config cfg = {.device = i,
		                                 .sched = *p,
		                                 .stats = &s->stats[i],
		                                 .reg_lookup = reg_lookup,
		                                 .reg_ctx = NULL,
		                                 .algo = algo,
		                                 .visit_bytes = sim_visit_bytes,
		                                 .nap = sim_nap};
		assert_int_equal(host_engine_new(&cfg, &s->eng[i]), 0);
	}
}

static void sim_init(struct sim *s, unsigned neng, const struct sched_params *p)
{
	sim_init_algo(s, neng, p, DFCCL_ALGO_AUTO);
}

/* A queue pair of session `session` of user `uid` on engine `eng`; returns
 * its index. */
static unsigned sim_queue_uid(struct sim *s, unsigned eng, uint64_t session, uint32_t uid)
{
	assert_true(s->nq < MAX_Q);
	struct tq *t = &s->qs[s->nq];
	size_t size = DFCCL_QP_REGION_SIZE(QN);
	t->map = aligned_alloc(4096, size);
	assert_non_null(t->map);
	memset(t->map, 0, size);
	queue_header_init(t->map, s->nq + 1, eng, QN);
	char err[128];
	assert_int_equal(sq_queue_open(&t->q, t->map, size, s->nq + 1, session, err, sizeof(err)), 0);
	t->q.uid = uid;
	t->eng = eng;
	if (s->ops)
		assert_int_equal(s->ops->qp_add(s->eng[eng], &t->q, err, sizeof(err)), 0);
	return s->nq++;
}

/* A queue pair of session `session`, all of one user, on engine `eng`. */
static unsigned sim_queue(struct sim *s, unsigned eng, uint64_t session)
{
	return sim_queue_uid(s, eng, session, 0);
}

/* A communicator of n ranks, rank r served by queue rank_q[r]. */
static void sim_comm(struct sim *s, uint64_t comm_id, uint32_t n, const unsigned *rank_q)
{
	assert_true(s->nregions < MAX_REGIONS);
	/* Zero pages on demand, as the supervisor's memfd: the connectors
	 * make the region large and mostly untouched. */
	size_t size = DFCCL_COMM_REGION_SIZE(n);
	struct dfccl_comm_header *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	assert_true(h != MAP_FAILED);
	h->magic = DFCCL_COMM_MAGIC;
	h->comm_id = comm_id;
	h->nranks = n;
	h->header_size = sizeof(*h);
	h->region_size = size;
	s->region_size[s->nregions] = size;
	s->regions[s->nregions++] = h;
	struct engine_member m[DFCCL_COMM_MAX_RANKS];
	int hosts[MAX_ENG] = {0};
	for (uint32_t r = 0; r < n; r++) {
		const struct tq *t = &s->qs[rank_q[r]];
		m[r] = (struct engine_member){.rank = r, .device = t->eng, .session_id = t->q.session_id};
		hosts[t->eng] = 1;
	}
	for (unsigned e = 0; e < s->neng; e++)
		if (hosts[e])
			assert_int_equal(host_engine_comm_add(s->eng[e], comm_id, n, m, h, size), 0);
}

static struct dfccl_comm_header *sim_region(struct sim *s, unsigned i)
{
	return s->regions[i];
}

/* The client's side: reserve, write everything but arm, arm last. */
static uint64_t sim_submit(struct sim *s, unsigned qi, const struct dfccl_sqe *tmpl)
{
	struct tq *t = &s->qs[qi];
	_Atomic uint64_t *tail = (_Atomic uint64_t *)&t->q.hdr->sq_tail;
	uint64_t seq = atomic_load(tail) + 1;
	atomic_store(tail, seq);
	struct dfccl_sqe *e = &t->q.sq[(seq - 1) % QN];
	memcpy((char *)e + 8, (const char *)tmpl + 8, sizeof(*e) - 8);
	e->seq = seq;
	atomic_store_explicit((_Atomic uint64_t *)&e->arm, seq, memory_order_release);
	t->submitted++;
	return seq;
}

/* The worker's side: take, check, submit (engines behind the interface
 * take their entries themselves, as fair admission allows). */
static void sim_pump(struct sim *s)
{
	struct dfccl_sqe batch[32];
	if (s->ops) {
		for (unsigned e = 0; e < s->neng; e++)
			s->ops->poll(s->eng[e]);
		return;
	}
	for (unsigned i = 0; i < s->nq; i++) {
		struct tq *t = &s->qs[i];
		if (t->gone)
			continue;
		unsigned got = sq_take(&t->q, batch, 32);
		for (unsigned k = 0; k < got; k++) {
			uint32_t st = sq_check(&t->q, &batch[k], reg_lookup, NULL);
			if (st != DFCCL_CQ_OK)
				host_engine_refuse(s->eng[t->eng], &t->q, &batch[k], st);
			else if (batch[k].opcode == DFCCL_OP_NOP)
				sq_complete(&t->q, batch[k].seq, st);
			else
				host_engine_submit(s->eng[t->eng], &t->q, &batch[k]);
		}
	}
}

static uint64_t q_completed(const struct tq *t)
{
	return atomic_load((_Atomic uint64_t *)&t->q.hdr->completed);
}

/* Runs everything until every live queue's entries completed. Returns the
 * rounds it took; fails the test at the cap. */
static unsigned sim_drive(struct sim *s)
{
	for (unsigned round = 1; round <= ROUND_CAP; round++) {
		sim_pump(s);
		for (unsigned e = 0; e < s->neng; e++)
			host_engine_run(s->eng[e]);
		int all = 1;
		for (unsigned i = 0; i < s->nq && all; i++)
			all = s->qs[i].gone || q_completed(&s->qs[i]) == s->qs[i].submitted;
		if (all)
			return round;
	}
	for (unsigned i = 0; i < s->nq; i++)
		print_error("queue %u (engine %u): %llu of %llu completed\n", i, s->qs[i].eng,
		            (unsigned long long)q_completed(&s->qs[i]), (unsigned long long)s->qs[i].submitted);
	for (unsigned e = 0; e < s->neng; e++)
		print_error("engine %u: %u pending\n", e, host_engine_pending(s->eng[e]));
	for (unsigned g = 0; g < s->nregions; g++) {
		struct dfccl_comm_header *h = s->regions[g];
		for (uint64_t k = 1; k <= DFCCL_COMM_SLOTS; k++)
			for (uint32_t r = 0; r < h->nranks; r++) {
				struct dfccl_rank_post *p = dfccl_comm_post(h, h->nranks, k, r);
				if (p->done != p->key)
					print_error("slot %llu rank %u: key %llu progress %llx done %llu count %llu\n",
					            (unsigned long long)k, r, (unsigned long long)p->key,
					            (unsigned long long)p->progress, (unsigned long long)p->done,
					            (unsigned long long)p->count);
			}
	}
	fail_msg("the engines did not complete every entry within %u rounds", ROUND_CAP);
	return 0;
}

/* Runs a few rounds without expecting completion. */
static void sim_spin(struct sim *s, unsigned rounds)
{
	while (rounds--) {
		sim_pump(s);
		for (unsigned e = 0; e < s->neng; e++)
			host_engine_run(s->eng[e]);
	}
}

/* The status of entry seq of queue qi, which must have completed. */
static uint32_t sim_status(struct sim *s, unsigned qi, uint64_t seq)
{
	uint64_t w = atomic_load((_Atomic uint64_t *)&s->qs[qi].q.cw[(seq - 1) % QN]);
	assert_int_equal(DFCCL_CW_SEQ(w), seq);
	return DFCCL_CW_STATUS(w);
}

static int sim_completed(struct sim *s, unsigned qi, uint64_t seq)
{
	uint64_t w = atomic_load((_Atomic uint64_t *)&s->qs[qi].q.cw[(seq - 1) % QN]);
	return DFCCL_CW_SEQ(w) == seq;
}

static uint64_t sim_stat(struct sim *s, size_t offset)
{
	uint64_t sum = 0;
	for (unsigned e = 0; e < s->neng; e++)
		sum += *(uint64_t *)((char *)&s->stats[e] + offset);
	return sum;
}

static void sim_free(struct sim *s)
{
	for (unsigned e = 0; e < s->neng; e++) {
		assert_int_equal(host_engine_pending(s->eng[e]), 0);
		host_engine_free(s->eng[e]);
	}
	for (unsigned i = 0; i < s->nq; i++) {
		sq_queue_close(&s->qs[i].q);
		free(s->qs[i].map);
	}
	for (unsigned i = 0; i < s->nregions; i++)
		munmap(s->regions[i], s->region_size[i]);
	regs_reset();
}

/* ------------------------------------------------------------------ values and reference */

static const unsigned esize[10] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

static int dt_float(unsigned dt)
{
	return dt >= 6;
}

static int dt_unsigned(unsigned dt)
{
	return dt == 1 || dt == 3 || dt == 5;
}

/* The input of rank r at element j of case `id`: a small integer. */
static int vin(unsigned id, uint32_t r, uint64_t j, unsigned dt)
{
	uint64_t h = (id * 0x9e3779b97f4a7c15ull) ^ (r * 0xc2b2ae3d27d4eb4full) ^ (j * 0x165667b19e3779f9ull);
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return dt_unsigned(dt) ? (int)(h % 4) : (int)(h % 7) - 3;
}

/* Small integers in float16 and bfloat16, by table. */
static const uint16_t f16_small[4] = {0x0000, 0x3c00, 0x4000, 0x4200};
static const uint16_t bf16_small[4] = {0x0000, 0x3f80, 0x4000, 0x4040};

static void put_small(unsigned dt, void *p, int v)
{
	int64_t i = v;
	float f = (float)v;
	double d = v;
	uint16_t h = (uint16_t)((dt == 6 ? f16_small : bf16_small)[v < 0 ? -v : v] | (v < 0 ? 0x8000 : 0));
	switch (dt) {
	case 6: case 9: memcpy(p, &h, 2); break;
	case 7: memcpy(p, &f, 4); break;
	case 8: memcpy(p, &d, 8); break;
	default: memcpy(p, &i, esize[dt]); break; /* little-endian: the low bytes */
	}
}

/* An element as a number: integers exactly (as int64 bits), floats as double. */
static double get_float(unsigned dt, const void *p)
{
	uint16_t h;
	float f;
	double d;
	switch (dt) {
	case 6:
		memcpy(&h, p, 2);
		d = ((h >> 10) & 31) ? ldexp((h & 1023) + 1024, ((h >> 10) & 31) - 25) : ldexp(h & 1023, -24);
		return (h & 0x8000) ? -d : d;
	case 9: {
		memcpy(&h, p, 2);
		uint32_t u = (uint32_t)h << 16;
		memcpy(&f, &u, 4);
		return f;
	}
	case 7: memcpy(&f, p, 4); return f;
	default: memcpy(&d, p, 8); return d;
	}
}

static int64_t get_int(unsigned dt, const void *p)
{
	switch (dt) {
	case 0: return *(const int8_t *)p;
	case 1: return *(const uint8_t *)p;
	case 2: { int32_t v; memcpy(&v, p, 4); return v; }
	case 3: { uint32_t v; memcpy(&v, p, 4); return v; }
	default: { int64_t v; memcpy(&v, p, 8); return v; }
	}
}

/* v wrapped to the integer type, as get_int would read it back. */
static int64_t wrap_int(unsigned dt, int64_t v)
{
	switch (dt) {
	case 0: return (int8_t)v;
	case 1: return (uint8_t)v;
	case 2: return (int32_t)v;
	case 3: return (uint32_t)v;
	default: return v;
	}
}

/* x rounded to nearest even with mbits mantissa bits and exponents >= emin. */
static double round_to(double x, int mbits, int emin)
{
	if (x == 0)
		return x;
	int e = ilogb(x);
	double q = ldexp(1.0, (e < emin ? emin : e) - mbits);
	return nearbyint(x / q) * q;
}

struct refval {
	int64_t i;
	double f;
};

/* The reduction of n small integers under op, in the element type. */
static struct refval ref_reduce(unsigned dt, unsigned op, const int *v, uint32_t n)
{
	int64_t acc = v[0];
	for (uint32_t k = 1; k < n; k++) {
		if (op == 0 || op == 4)
			acc += v[k];
		else if (op == 1)
			acc *= v[k];
		else if (op == 2)
			acc = v[k] > acc ? v[k] : acc;
		else
			acc = v[k] < acc ? v[k] : acc;
	}
	struct refval r = {0, 0};
	if (!dt_float(dt)) {
		r.i = wrap_int(dt, acc);
		if (op == 4)
			r.i = dt_unsigned(dt) ? (int64_t)((uint64_t)r.i / n) : r.i / (int64_t)n;
		return r;
	}
	double x = op == 4 ? (double)acc / n : (double)acc;
	r.f = dt == 6 ? round_to(x, 10, -14) : dt == 9 ? round_to(x, 7, -126) : dt == 7 ? round_to(x, 23, -126) : x;
	return r;
}

static int elem_matches(unsigned dt, const void *p, struct refval want)
{
	return dt_float(dt) ? get_float(dt, p) == want.f : get_int(dt, p) == want.i;
}

static struct refval ref_copy(unsigned dt, int v)
{
	struct refval r = {v, v};
	if (!dt_float(dt))
		r.i = wrap_int(dt, v);
	return r;
}

/* ------------------------------------------------------------------ collective cases */

struct coll {
	unsigned id;
	uint8_t op, dt, redop;
	int inplace;
	uint32_t n, root;
	uint64_t count;
	uint32_t sreg[MAX_N], rreg[MAX_N];
	uint64_t soff[MAX_N], roff[MAX_N];
	unsigned q[MAX_N];
	uint64_t seq[MAX_N];
	int32_t priority;
	uint8_t algo; /* the entries' algorithm hint (0: the engines' setting, else the plan) */
};

/* Whether rank r has a send buffer and a receive buffer (even when empty). */
static void coll_sides(const struct coll *c, uint32_t r, int *send, int *recv)
{
	*send = !(c->op == DFCCL_OP_BROADCAST && r != c->root);
	*recv = !(c->op == DFCCL_OP_REDUCE && r != c->root);
}

/* Elements of rank r's send and receive buffers. */
static void coll_elems(const struct coll *c, uint32_t r, uint64_t *send, uint64_t *recv)
{
	uint64_t one = c->count, all = c->count * c->n;
	int root = r == c->root;
	switch (c->op) {
	case DFCCL_OP_ALLGATHER: *send = one, *recv = all; break;
	case DFCCL_OP_REDUCESCATTER: *send = all, *recv = one; break;
	case DFCCL_OP_BROADCAST: *send = root ? one : 0, *recv = one; break;
	case DFCCL_OP_REDUCE: *send = one, *recv = root ? one : 0; break;
	default: *send = one, *recv = one; break;
	}
}

/* Buffers and inputs of collective c, for every rank. */
static void coll_prepare(struct sim *s, struct coll *c)
{
	size_t es = esize[c->dt];
	for (uint32_t r = 0; r < c->n; r++) {
		uint64_t se, re;
		int has_send, has_recv;
		coll_elems(c, r, &se, &re);
		coll_sides(c, r, &has_send, &has_recv);
		uint64_t session = s->qs[c->q[r]].q.session_id;
		c->soff[r] = c->roff[r] = 0;
		c->sreg[r] = c->rreg[r] = 0;
		if (c->inplace) {
			/* One buffer; the send range inside the receive range as NCCL
			 * defines in-place for each collective. */
			uint64_t big = se > re ? se : re;
			uint32_t reg = reg_new(session, big * es + 16);
			c->sreg[r] = has_send ? reg : 0;
			c->rreg[r] = has_recv ? reg : 0;
			if (has_send && has_recv) {
				c->soff[r] = c->op == DFCCL_OP_ALLGATHER ? r * c->count * es : 0;
				c->roff[r] = c->op == DFCCL_OP_REDUCESCATTER ? r * c->count * es : 0;
			}
		} else {
			if (has_send)
				c->sreg[r] = reg_new(session, se * es);
			if (has_recv)
				c->rreg[r] = reg_new(session, re * es);
		}
		for (uint64_t j = 0; j < se; j++)
			put_small(c->dt, reg_ptr(c->sreg[r]) + c->soff[r] + j * es, vin(c->id, r, j, c->dt));
	}
}

/* Rank r's entry for collective c, on its queue c->q[r]. */
static void coll_submit_rank(struct sim *s, struct coll *c, uint32_t r, uint64_t comm_id, uint64_t comm_seq,
                             uint32_t flags, uint32_t coll_id)
{
	struct dfccl_sqe e = {
	    .comm_id = comm_id, .comm_seq = comm_seq, .count = c->count, .send_off = c->soff[r],
	    .recv_off = c->roff[r], .send_reg = c->sreg[r], .recv_reg = c->rreg[r], .peer = c->root,
	    .coll_id = coll_id, .priority = c->priority, .flags = (uint16_t)flags, .opcode = c->op,
	    .dtype = c->dt, .redop = c->redop, .algo = c->algo, .rank = r};
	if (c->inplace && c->sreg[r] && c->sreg[r] == c->rreg[r] && c->soff[r] == c->roff[r])
		e.flags |= DFCCL_SQE_F_INPLACE;
	c->seq[r] = sim_submit(s, c->q[r], &e);
}

static void coll_submit(struct sim *s, struct coll *c, uint64_t comm_id, uint64_t comm_seq)
{
	coll_prepare(s, c);
	for (uint32_t r = 0; r < c->n; r++)
		coll_submit_rank(s, c, r, comm_id, comm_seq, 0, 0);
}

/* Checks every rank's status and result against the reference. */
static void coll_check(struct sim *s, const struct coll *c)
{
	size_t es = esize[c->dt];
	int v[MAX_N];
	for (uint32_t r = 0; r < c->n; r++) {
		uint32_t st = sim_status(s, c->q[r], c->seq[r]);
		if (st != DFCCL_CQ_OK)
			fail_msg("case %u (op %u dtype %u redop %u n %u inplace %d count %llu): rank %u status %u", c->id, c->op,
			         c->dt, c->redop, c->n, c->inplace, (unsigned long long)c->count, r, st);
		uint64_t se, re;
		coll_elems(c, r, &se, &re);
		const char *out = c->rreg[r] ? reg_ptr(c->rreg[r]) + c->roff[r] : NULL;
		for (uint64_t j = 0; j < re; j++) {
			struct refval want;
			uint64_t blk = j / (c->count ? c->count : 1), i = j % (c->count ? c->count : 1);
			switch (c->op) {
			case DFCCL_OP_ALLGATHER: want = ref_copy(c->dt, vin(c->id, (uint32_t)blk, i, c->dt)); break;
			case DFCCL_OP_BROADCAST: want = ref_copy(c->dt, vin(c->id, c->root, j, c->dt)); break;
			default:
				for (uint32_t k = 0; k < c->n; k++)
					v[k] = vin(c->id, k, c->op == DFCCL_OP_REDUCESCATTER ? r * c->count + j : j, c->dt);
				want = ref_reduce(c->dt, c->redop, v, c->n);
				break;
			}
			if (!elem_matches(c->dt, out + j * es, want))
				fail_msg("case %u (op %u dtype %u redop %u n %u inplace %d count %llu): rank %u element %llu "
				         "wrong",
				         c->id, c->op, c->dt, c->redop, c->n, c->inplace, (unsigned long long)c->count, r,
				         (unsigned long long)j);
		}
	}
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(uint32_t below)
{
	return tu_rand(&rng, below);
}

/*
 * n ranks on `neng` engines (rank r on engine r % neng); with one engine,
 * pairs of ranks share a session and its queue.
 */
static void layout(struct sim *s, uint32_t n, unsigned neng, unsigned *rank_q, uint64_t session_base)
{
	for (uint32_t r = 0; r < n; r++) {
		if (neng == 1 && (r & 1)) {
			rank_q[r] = rank_q[r - 1];
			continue;
		}
		rank_q[r] = sim_queue(s, r % neng, session_base + r);
	}
}

/* Engines, a layout of n ranks on them, and communicator comm_id over it. */
static void sim_start(struct sim *s, uint32_t n, unsigned neng, unsigned *rank_q, uint64_t session_base,
                      uint64_t comm_id)
{
	sim_init(s, neng, &small_spins);
	layout(s, n, neng, rank_q, session_base);
	sim_comm(s, comm_id, n, rank_q);
}

/* Every rank's entry seq[r] completed with status. */
static void expect_all(struct sim *s, const unsigned *rank_q, const uint64_t *seq, uint32_t n, uint32_t status)
{
	for (uint32_t r = 0; r < n; r++)
		assert_int_equal(sim_status(s, rank_q[r], seq[r]), status);
}

/* ------------------------------------------------------------------ tests */

/*
 * Every collective x dtype x op x in-place on 2, 3, 4 and 8 ranks: the
 * combinations of each rank count are dealt round-robin to its 1-, 2- and
 * 3-engine layouts, and each layout runs its share on one communicator in
 * batches of 48 (more than the 32 slots, so slots are reused).
 */
static void test_collectives_matrix(void **state)
{
	(void)state;
	static const uint8_t ops[] = {DFCCL_OP_ALLREDUCE, DFCCL_OP_ALLGATHER, DFCCL_OP_REDUCESCATTER,
	                              DFCCL_OP_BROADCAST, DFCCL_OP_REDUCE};
	static const uint32_t nranks[] = {2, 3, 4, 8};
	unsigned total = 0, id = 0;
	static struct coll cases[400];
	for (size_t ni = 0; ni < sizeof(nranks) / sizeof(nranks[0]); ni++) {
		uint32_t n = nranks[ni];
		for (unsigned neng = 1; neng <= 3; neng++) {
			struct sim s;
			sim_init(&s, neng, &small_spins);
			unsigned rank_q[MAX_N];
			layout(&s, n, neng, rank_q, 100);
			sim_comm(&s, 7, n, rank_q);
			unsigned ncases = 0, combo = 0;
			for (size_t oi = 0; oi < sizeof(ops); oi++)
				for (uint8_t dt = 0; dt < 10; dt++)
					for (uint8_t redop = 0; redop < 5; redop++)
						for (int inplace = 0; inplace < 2; inplace++) {
							int reducing = ops[oi] != DFCCL_OP_ALLGATHER && ops[oi] != DFCCL_OP_BROADCAST;
							if (!reducing && redop)
								continue;
							if (combo++ % 3 != neng - 1)
								continue;
							struct coll *c = &cases[ncases++];
							memset(c, 0, sizeof(*c));
							*c = (struct coll){.id = ++id, .op = ops[oi], .dt = dt, .redop = redop,
							                   .inplace = inplace, .n = n, .root = rnd(n)};
							/* Mostly small, some empty, some past a reduction block. */
							uint32_t pick = rnd(10);
							c->count = pick == 0 ? 0 : pick == 1 ? 1500 + rnd(700) : 1 + rnd(40);
							memcpy(c->q, rank_q, sizeof(rank_q));
						}
			uint64_t seq = 0;
			for (unsigned b = 0; b < ncases; b += 48) {
				unsigned end = b + 48 < ncases ? b + 48 : ncases;
				for (unsigned k = b; k < end; k++)
					coll_submit(&s, &cases[k], 7, ++seq);
				sim_drive(&s);
				for (unsigned k = b; k < end; k++)
					coll_check(&s, &cases[k]);
			}
			total += ncases;
			sim_free(&s);
		}
	}
	/* 4 rank counts x (3 reducing x 10 x 5 + 2 copying x 10) x 2 in-place */
	assert_int_equal(total, 4 * (3 * 10 * 5 + 2 * 10) * 2);
}

/* Send/receive: every ordered pair of 3 ranks (on 2 engines) exchanges 12
 * messages (more than the 8 mailbox slots), the receives submitted first on
 * one rank, the sends first on the others. */
static void test_send_recv(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s, 2, &small_spins);
	unsigned rank_q[3];
	for (uint32_t r = 0; r < 3; r++)
		rank_q[r] = sim_queue(&s, r % 2, 50 + r);
	sim_comm(&s, 11, 3, rank_q);
	enum { MSGS = 12, N = 3 };
	struct {
		uint32_t sreg, rreg;
		uint64_t sseq, rseq;
		uint64_t count;
	} m[N][N][MSGS];
	const unsigned dt = 2; /* int32 */
	for (uint32_t a = 0; a < N; a++)
		for (uint32_t b = 0; b < N; b++)
			for (unsigned k = 0; k < (a == b ? 0u : (unsigned)MSGS); k++) {
				m[a][b][k].count = 1 + rnd(300);
				m[a][b][k].sreg = reg_new(50 + a, m[a][b][k].count * 4);
				m[a][b][k].rreg = reg_new(50 + b, m[a][b][k].count * 4);
				for (uint64_t j = 0; j < m[a][b][k].count; j++)
					put_small(dt, reg_ptr(m[a][b][k].sreg) + j * 4, vin(a * 100 + b * 10 + k, a, j, dt));
			}
	for (int phase = 0; phase < 2; phase++)
		for (uint32_t r = 0; r < N; r++) {
			int recv_now = (r == 0) == (phase == 0); /* rank 0 receives first */
			for (uint32_t p = 0; p < N; p++)
				for (unsigned k = 0; k < (p == r ? 0u : (unsigned)MSGS); k++) {
					struct dfccl_sqe e = {.comm_id = 11, .comm_seq = k + 1, .dtype = dt, .rank = r, .peer = p};
					if (recv_now) {
						e.opcode = DFCCL_OP_RECV, e.count = m[p][r][k].count, e.recv_reg = m[p][r][k].rreg;
						m[p][r][k].rseq = sim_submit(&s, rank_q[r], &e);
					} else {
						e.opcode = DFCCL_OP_SEND, e.count = m[r][p][k].count, e.send_reg = m[r][p][k].sreg;
						m[r][p][k].sseq = sim_submit(&s, rank_q[r], &e);
					}
				}
		}
	sim_drive(&s);
	for (uint32_t a = 0; a < N; a++)
		for (uint32_t b = 0; b < N; b++)
			for (unsigned k = 0; k < (a == b ? 0u : (unsigned)MSGS); k++) {
				assert_int_equal(sim_status(&s, rank_q[a], m[a][b][k].sseq), DFCCL_CQ_OK);
				assert_int_equal(sim_status(&s, rank_q[b], m[a][b][k].rseq), DFCCL_CQ_OK);
				assert_memory_equal(reg_ptr(m[a][b][k].rreg), reg_ptr(m[a][b][k].sreg), m[a][b][k].count * 4);
			}
	sim_free(&s);
}

/* A receive that expects another count fails both sides, not hangs them. */
static void test_send_recv_mismatch(void **state)
{
	(void)state;
	struct sim s;
	unsigned rank_q[2];
	sim_start(&s, 2, 2, rank_q, 60, 12);
	uint32_t sreg = reg_new(60, 64), rreg = reg_new(61, 64);
	struct dfccl_sqe snd = {.comm_id = 12, .comm_seq = 1, .count = 16, .dtype = 2, .rank = 0, .peer = 1,
	                        .opcode = DFCCL_OP_SEND, .send_reg = sreg};
	struct dfccl_sqe rcv = {.comm_id = 12, .comm_seq = 1, .count = 8, .dtype = 2, .rank = 1, .peer = 0,
	                        .opcode = DFCCL_OP_RECV, .recv_reg = rreg};
	uint64_t a = sim_submit(&s, rank_q[0], &snd), b = sim_submit(&s, rank_q[1], &rcv);
	sim_drive(&s);
	assert_int_equal(sim_status(&s, rank_q[0], a), DFCCL_CQ_BAD_ENTRY);
	assert_int_equal(sim_status(&s, rank_q[1], b), DFCCL_CQ_BAD_ENTRY);
	sim_free(&s);
}

/*
 * The DFCCL deadlock pattern in miniature: 4 ranks on 4 engines, 4
 * communicators over all of them; in each of 50 iterations every rank
 * submits one all-reduce per communicator in its own random order. Without
 * preemption the first iteration whose orders differ would hang.
 */
static void deadlock_run(uint8_t algo, unsigned ITERS)
{
	enum { N = 4, COMMS = 4 };
	struct sim s;
	sim_init(&s, N, &small_spins);
	unsigned rank_q[N];
	layout(&s, N, N, rank_q, 200);
	for (unsigned k = 0; k < COMMS; k++)
		sim_comm(&s, 20 + k, N, rank_q);
	struct coll c[COMMS];
	unsigned differing = 0;
	for (unsigned it = 0; it < ITERS; it++) {
		for (unsigned k = 0; k < COMMS; k++) {
			c[k] = (struct coll){.id = 5000 + it * COMMS + k, .op = DFCCL_OP_ALLREDUCE, .dt = 7, .redop = 0,
			                     .n = N, .count = 64 + rnd(2000), .algo = algo};
			memcpy(c[k].q, rank_q, sizeof(rank_q));
		}
		/* Each rank's own order of the communicators. */
		unsigned perm[N][COMMS];
		for (uint32_t r = 0; r < N; r++) {
			for (unsigned k = 0; k < COMMS; k++)
				perm[r][k] = k;
			for (unsigned k = COMMS - 1; k > 0; k--) {
				unsigned j = rnd(k + 1), t = perm[r][k];
				perm[r][k] = perm[r][j];
				perm[r][j] = t;
			}
			differing += memcmp(perm[r], perm[0], sizeof(perm[0])) != 0;
		}
		for (unsigned k = 0; k < COMMS; k++)
			coll_prepare(&s, &c[k]);
		for (uint32_t r = 0; r < N; r++)
			for (unsigned i = 0; i < COMMS; i++)
				coll_submit_rank(&s, &c[perm[r][i]], r, 20 + perm[r][i], it + 1, 0, 0);
		sim_drive(&s);
		for (unsigned k = 0; k < COMMS; k++)
			coll_check(&s, &c[k]);
	}
	uint64_t pre = sim_stat(&s, offsetof(struct dfccl_worker_stats, preemptions));
	uint64_t sw = sim_stat(&s, offsetof(struct dfccl_worker_stats, context_switches));
	uint64_t done = sim_stat(&s, offsetof(struct dfccl_worker_stats, completed));
	print_message("deadlock pattern (algo %u): %u collectives, %llu preemptions, %llu context switches, %u "
	              "differing rank orders\n",
	              algo, N * COMMS * ITERS, (unsigned long long)pre, (unsigned long long)sw, differing);
	assert_int_equal(done, N * COMMS * ITERS);
	assert_true(differing > 0);
	assert_true(pre > 0);
	assert_true(sw > 0);
	sim_free(&s);
}

static void test_deadlock_pattern(void **state)
{
	(void)state;
	deadlock_run(0, 50);
}

/* The same with each all-reduce algorithm forced by the entries. */
static void test_deadlock_pattern_algos(void **state)
{
	(void)state;
	static const uint8_t algos[] = {DFCCL_ALGO_RING, DFCCL_ALGO_TREE, DFCCL_ALGO_MULTITREE, DFCCL_ALGO_DIRECT};
	for (size_t a = 0; a < sizeof(algos); a++)
		deadlock_run(algos[a], 15);
}

/* A random plan (tu_random_plan) in communicator region i: every shape the
 * engine accepts must give the right results, not only balanced trees. */
static void sim_plan(struct sim *s, unsigned i, uint32_t n, uint8_t algo)
{
	tu_random_plan(dfccl_comm_plan_of(s->regions[i]), n, algo, &rng);
}

/* Whether the host engine runs algo for op (gpu/algo.h). */
static int algo_runs(uint8_t algo, uint8_t op)
{
	if (algo == DFCCL_ALGO_DIRECT || algo == DFCCL_ALGO_RING)
		return 1;
	return op == DFCCL_OP_ALLREDUCE || op == DFCCL_OP_BROADCAST || op == DFCCL_OP_REDUCE;
}

static const uint8_t every_algo[] = {DFCCL_ALGO_RING, DFCCL_ALGO_TREE, DFCCL_ALGO_MULTITREE, DFCCL_ALGO_DIRECT};
static const uint8_t every_coll[] = {DFCCL_OP_ALLREDUCE, DFCCL_OP_ALLGATHER, DFCCL_OP_REDUCESCATTER,
                                     DFCCL_OP_BROADCAST, DFCCL_OP_REDUCE};

/*
 * Every collective under every algorithm that runs it, x dtype x op x
 * in-place on 2, 3, 4, 5 and 8 ranks, the combinations dealt round-robin
 * to 1-, 2- and 3-engine layouts. How the algorithm is chosen varies with
 * the layout: 1 engine, the entries' hint over the default plan; 2
 * engines, the engines' setting over a random plan; 3 engines, the plan's
 * table alone (a random plan naming the algorithm).
 */
static void test_algos(void **state)
{
	(void)state;
	static const uint32_t nranks[] = {2, 3, 4, 5, 8};
	static struct coll cases[64];
	unsigned total = 0, id = 20000;
	for (size_t a = 0; a < sizeof(every_algo); a++) {
		uint8_t algo = every_algo[a];
		for (size_t o = 0; o < sizeof(every_coll); o++) {
			uint8_t op = every_coll[o];
			if (!algo_runs(algo, op))
				continue;
			for (size_t ni = 0; ni < sizeof(nranks) / sizeof(nranks[0]); ni++) {
				uint32_t n = nranks[ni];
				for (unsigned neng = 1; neng <= 3; neng++) {
					struct sim s;
					sim_init_algo(&s, neng, &small_spins, neng == 2 ? algo : DFCCL_ALGO_AUTO);
					unsigned rank_q[MAX_N];
					layout(&s, n, neng, rank_q, 100);
					sim_comm(&s, 7, n, rank_q);
					if (neng > 1)
						sim_plan(&s, 0, n, neng == 3 ? algo : DFCCL_ALGO_DIRECT);
					unsigned ncases = 0, combo = 0;
					for (uint8_t dt = 0; dt < 10; dt++)
						for (uint8_t redop = 0; redop < 5; redop++)
							for (int inplace = 0; inplace < 2; inplace++) {
								/* every third to this layout; the collectives
								 * other than all-reduce and reduce see every
								 * sixth */
								unsigned k = combo++;
								if (k % 3 != neng - 1 ||
								    (op != DFCCL_OP_ALLREDUCE && op != DFCCL_OP_REDUCE && (k / 3) % 2))
									continue;
								struct coll *c = &cases[ncases++];
								*c = (struct coll){.id = ++id, .op = op, .dt = dt, .redop = redop,
								                   .inplace = inplace, .n = n, .root = rnd(n),
								                   .algo = neng == 1 ? algo : 0};
								/* Mostly small, some empty, some shorter
								 * than the rank count, some past a
								 * reduction block. */
								uint32_t pick = rnd(10);
								c->count = pick == 0   ? 0
								           : pick == 1 ? 1500 + rnd(700)
								           : pick == 2 ? 1 + rnd(n)
								                       : 1 + rnd(40);
								memcpy(c->q, rank_q, sizeof(rank_q));
							}
					uint64_t seq = 0;
					for (unsigned k = 0; k < ncases; k++)
						coll_submit(&s, &cases[k], 7, ++seq);
					sim_drive(&s);
					for (unsigned k = 0; k < ncases; k++)
						coll_check(&s, &cases[k]);
					total += ncases;
					sim_free(&s);
				}
			}
		}
	}
	print_message("algorithms: %u collectives checked\n", total);
	assert_true(total > 1500);
}

/*
 * Large messages over each algorithm (direct too), in place, on random plans: steps take
 * more than one visit (tasks yield and resume mid-step), and the pipelined
 * algorithms run several slices, so connector halves are reused.
 */
static void test_algos_large(void **state)
{
	(void)state;
	unsigned id = 9100;
	for (size_t a = 0; a < sizeof(every_algo); a++) {
		for (size_t o = 0; o < sizeof(every_coll); o++) {
			uint8_t op = every_coll[o];
			if (!algo_runs(every_algo[a], op))
				continue;
			uint32_t n = op == DFCCL_OP_REDUCESCATTER || op == DFCCL_OP_ALLGATHER ? 4 : 5;
			struct sim s;
			unsigned rank_q[MAX_N];
			sim_start(&s, n, 2, rank_q, 10, 3);
			sim_plan(&s, 0, n, DFCCL_ALGO_DIRECT);
			/* float: 8 Ki elements per connector half, 64 Ki per broadcast slice */
			uint64_t count = op == DFCCL_OP_ALLREDUCE    ? (3u << 20) + 5
			                 : op == DFCCL_OP_BROADCAST ? (5u << 16) + 7
			                                            : (5u << 13) + 3;
			++id;
			struct coll c = {.id = id, .op = op, .dt = 7, .redop = (uint8_t)(id % 2 ? 0 : 2), .inplace = 1,
			                 .n = n, .root = rnd(n), .count = count, .algo = every_algo[a]};
			memcpy(c.q, rank_q, sizeof(rank_q));
			coll_submit(&s, &c, 3, 1);
			unsigned rounds = sim_drive(&s);
			coll_check(&s, &c);
			assert_true(rounds > 1);
			sim_free(&s);
		}
	}
}

/*
 * The visit-bytes setting: the same 4 MiB all-reduce of 2 ranks, correct
 * with the engine's default visit and with 64 KiB visits, and the small
 * visits take as many turns of the engines as their data needs (each
 * rank's share of each phase is 2 MiB: 32 visits at least), the default
 * a few.
 */
static void test_visit_bytes(void **state)
{
	(void)state;
	unsigned rounds[2];
	const uint64_t visit[2] = {0, 64u << 10};
	for (unsigned v = 0; v < 2; v++) {
		sim_visit_bytes = visit[v];
		struct sim s;
		unsigned rank_q[2];
		sim_start(&s, 2, 2, rank_q, 9300 + 10 * v, 3);
		struct coll c = {.id = 9400 + v, .op = DFCCL_OP_ALLREDUCE, .dt = 7, .redop = 0, .n = 2,
		                 .count = (1u << 20) + 3, .algo = DFCCL_ALGO_DIRECT};
		memcpy(c.q, rank_q, sizeof(rank_q));
		coll_submit(&s, &c, 3, 1);
		rounds[v] = sim_drive(&s);
		coll_check(&s, &c);
		sim_free(&s);
	}
	sim_visit_bytes = 0;
	print_message("visit-bytes: %u turns with the default visit, %u with 64 KiB\n", rounds[0], rounds[1]);
	assert_true(rounds[0] < 8);
	assert_true(rounds[1] >= 32);
}

/* Re-adds the communicators of the first two regions of s to every engine:
 * the engines read the plan when a communicator is added. */
static void sim_readd(struct sim *s, const unsigned *rank_q, uint32_t n, const uint64_t *ids)
{
	struct engine_member m[MAX_N];
	for (uint32_t r = 0; r < n; r++)
		m[r] = (struct engine_member){.rank = r, .device = s->qs[rank_q[r]].eng,
		                                 .session_id = s->qs[rank_q[r]].q.session_id};
	for (unsigned e = 0; e < s->neng; e++)
		for (unsigned i = 0; i < 2; i++) {
			host_engine_comm_del(s->eng[e], ids[i]);
			assert_int_equal(host_engine_comm_add(s->eng[e], ids[i], n, m, s->regions[i], s->region_size[i]), 0);
		}
}

/*
 * The plan decides by size: a table naming ring up to 4 KiB and multitree
 * above for all-reduce, seen through the progress words (a ring all-reduce
 * of n ranks publishes 2(n - 1) steps, a multitree one 2 per tree); and a
 * damaged plan is not used (the defaults run direct: progress phase 1).
 */
static void test_plan_by_size(void **state)
{
	(void)state;
	enum { N = 4 };
	static const uint64_t ids[2] = {60, 61};
	struct sim s;
	unsigned rank_q[N];
	sim_start(&s, N, 2, rank_q, 400, ids[0]);
	sim_comm(&s, ids[1], N, rank_q);
	sim_plan(&s, 0, N, DFCCL_ALGO_RING);
	struct dfccl_comm_plan *p = dfccl_comm_plan_of(s.regions[0]);
	for (unsigned b = dfccl_size_bucket(4096) + 1; b < DFCCL_PLAN_BUCKETS; b++)
		p->algo[0][b] = DFCCL_ALGO_MULTITREE;
	/* the second: a ring that is no permutation */
	sim_plan(&s, 1, N, DFCCL_ALGO_RING);
	p = dfccl_comm_plan_of(s.regions[1]);
	p->ring[1] = p->ring[0];
	sim_readd(&s, rank_q, N, ids);
	static const struct {
		unsigned region;
		uint64_t key, count, phases;
	} cases[] = {
	    {0, 1, 100, 2 * (N - 1)}, /* 400 B: ring */
	    {0, 2, 4096, 2 * N},       /* 16 KiB: multitree, N trees */
	    {1, 1, 100, 1},            /* damaged plan: direct */
	};
	for (unsigned k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct coll c = {.id = 9300 + k, .op = DFCCL_OP_ALLREDUCE, .dt = 7, .n = N, .count = cases[k].count};
		memcpy(c.q, rank_q, sizeof(rank_q));
		coll_submit(&s, &c, ids[cases[k].region], cases[k].key);
		sim_drive(&s);
		coll_check(&s, &c);
		struct dfccl_comm_header *h = s.regions[cases[k].region];
		for (uint32_t r = 0; r < N; r++)
			assert_int_equal(dfccl_comm_post(h, N, cases[k].key, r)->progress,
			                 DFCCL_PROGRESS(cases[k].key, cases[k].phases));
	}
	/* and the engines counted each rank's task under its algorithm */
	static const uint8_t ran[] = {DFCCL_ALGO_RING, DFCCL_ALGO_MULTITREE, DFCCL_ALGO_DIRECT};
	for (unsigned k = 0; k < sizeof(ran); k++)
		assert_int_equal(sim_stat(&s, offsetof(struct dfccl_worker_stats, by_algo) + 8 * ran[k]), N);
	assert_int_equal(sim_stat(&s, offsetof(struct dfccl_worker_stats, by_algo) + 8 * DFCCL_ALGO_TREE), 0);
	sim_free(&s);
}

/*
 * Registered collectives: 6 of them (every collective type) on 3 ranks,
 * 6 runs each (more than the 4 slots of a collective); every rank runs the
 * collectives of a run in its own order, and submits all runs at once.
 */
static void test_registered_any_order(void **state)
{
	(void)state;
	enum { N = 3, COLLS = 6, RUNS = 6 };
	static const uint8_t ops[COLLS] = {DFCCL_OP_ALLREDUCE, DFCCL_OP_ALLGATHER, DFCCL_OP_REDUCESCATTER,
	                                   DFCCL_OP_BROADCAST, DFCCL_OP_REDUCE, DFCCL_OP_ALLREDUCE};
	struct sim s;
	unsigned rank_q[N];
	sim_start(&s, N, N, rank_q, 300, 33);
	static struct coll c[RUNS][COLLS];
	for (unsigned run = 0; run < RUNS; run++)
		for (unsigned k = 0; k < COLLS; k++) {
			c[run][k] = (struct coll){.id = 7000 + run * COLLS + k, .op = ops[k], .dt = (uint8_t)(k + 2),
			                          .redop = (uint8_t)(k % 5), .n = N, .root = k % N, .count = 5 + k * 3,
			                          .inplace = (int)(run & 1)};
			memcpy(c[run][k].q, rank_q, sizeof(rank_q));
			coll_prepare(&s, &c[run][k]);
		}
	for (uint32_t r = 0; r < N; r++)
		for (unsigned run = 0; run < RUNS; run++) {
			unsigned perm[COLLS];
			for (unsigned k = 0; k < COLLS; k++)
				perm[k] = k;
			for (unsigned k = COLLS - 1; k > 0; k--) {
				unsigned j = rnd(k + 1), t = perm[k];
				perm[k] = perm[j];
				perm[j] = t;
			}
			for (unsigned i = 0; i < COLLS; i++)
				coll_submit_rank(&s, &c[run][perm[i]], r, 33, run + 1, DFCCL_SQE_F_REGISTERED, perm[i]);
		}
	sim_drive(&s);
	for (unsigned run = 0; run < RUNS; run++)
		for (unsigned k = 0; k < COLLS; k++)
			coll_check(&s, &c[run][k]);
	sim_free(&s);
}

/*
 * Priorities: three ready one-rank all-reduces. The order the engine runs
 * them in shows in the order it first looks their buffers up.
 */
static void priority_case(uint32_t order, uint32_t flags, const unsigned *want)
{
	struct sim s;
	struct sched_params p = small_spins;
	p.order = order;
	sim_init(&s, 1, &p);
	unsigned rank_q[1] = {sim_queue(&s, 0, 400)};
	sim_comm(&s, 44, 1, rank_q);
	static const int32_t prio[3] = {1, 5, 3};
	struct coll c[3];
	for (unsigned k = 0; k < 3; k++) {
		c[k] = (struct coll){.id = 8000 + k, .op = DFCCL_OP_ALLREDUCE, .dt = 7, .n = 1, .count = 4,
		                     .priority = prio[k]};
		c[k].q[0] = rank_q[0];
		coll_prepare(&s, &c[k]);
		coll_submit_rank(&s, &c[k], 0, 44, k + 1, flags, 0);
	}
	sim_pump(&s);
	nlog = 0;
	logging = 1;
	host_engine_run(s.eng[0]);
	logging = 0;
	/* First appearances of each collective's send buffer. */
	unsigned seen = 0, order_seen[3];
	for (unsigned i = 0; i < nlog && seen < 3; i++)
		for (unsigned k = 0; k < 3; k++)
			if (lookup_log[i] == c[k].sreg[0]) {
				int dup = 0;
				for (unsigned x = 0; x < seen; x++)
					dup |= order_seen[x] == k;
				if (!dup)
					order_seen[seen++] = k;
			}
	assert_int_equal(seen, 3);
	for (unsigned i = 0; i < 3; i++)
		assert_int_equal(order_seen[i], want[i]);
	sim_drive(&s);
	for (unsigned k = 0; k < 3; k++)
		coll_check(&s, &c[k]);
	sim_free(&s);
}

static void test_priority_order(void **state)
{
	(void)state;
	static const unsigned fifo_order[3] = {0, 1, 2}, prio_order[3] = {1, 2, 0};
	priority_case(SCHED_ORDER_PRIORITY, DFCCL_SQE_F_PRIORITY, prio_order);
	priority_case(SCHED_ORDER_FIFO, 0, fifo_order);
	/* Entries that carry priorities are ordered by them even on an engine
	 * configured for FIFO. */
	priority_case(SCHED_ORDER_FIFO, DFCCL_SQE_F_PRIORITY, prio_order);
	/* Under SCHED_ORDER_PRIORITY, entries without the flag count as priority 0. */
	priority_case(SCHED_ORDER_PRIORITY, 0, fifo_order);
}

/* More tasks than the task queue holds: the rest wait in the backlog and
 * every one completes in order. */
static void test_backlog(void **state)
{
	(void)state;
	enum { N = 2, COUNT = 1100 };
	struct sim s;
	unsigned rank_q[N];
	sim_start(&s, N, N, rank_q, 500, 55);
	static struct coll c[COUNT];
	for (unsigned k = 0; k < COUNT; k++) {
		c[k] = (struct coll){.id = 9000 + k, .op = DFCCL_OP_ALLREDUCE, .dt = 2, .n = N, .count = 4};
		memcpy(c[k].q, rank_q, sizeof(rank_q));
		coll_prepare(&s, &c[k]);
		coll_submit_rank(&s, &c[k], 0, 55, k + 1, 0, 0);
	}
	/* Rank 1 is late: rank 0's engine takes everything and can finish nothing. */
	sim_spin(&s, COUNT / 32 + 4);
	assert_int_equal(host_engine_pending(s.eng[0]), COUNT);
	assert_true(COUNT > SCHED_MAX_TASKS);
	for (unsigned k = 0; k < COUNT; k++)
		coll_submit_rank(&s, &c[k], 1, 55, k + 1, 0, 0);
	sim_drive(&s);
	for (unsigned k = 0; k < COUNT; k++)
		coll_check(&s, &c[k]);
	sim_free(&s);
}

/* Engines behind the worker's interface (host_engine_ops_new), with a
 * per-queue-pair limit of max_inflight and a per-uid one of max_uid (0:
 * the default). */
static void sim_init_served(struct sim *s, unsigned neng, uint32_t max_inflight, uint32_t max_uid)
{
	memset(s, 0, sizeof(*s));
	s->neng = neng;
	for (unsigned i = 0; i < neng; i++) {
		struct engine_config cfg = {.device = i, .sched = small_spins, .stats = &s->stats[i],
		                            .reg_lookup = reg_lookup, .max_inflight = max_inflight,
		                            .max_inflight_uid = max_uid};
		void *impl;
		assert_int_equal(host_engine_ops_new(&cfg, &s->ops, &impl), 0);
		s->eng[i] = impl;
	}
}

/* An all-reduce of 4 int32 by rank r on comm_id, from fresh buffers. */
static uint64_t submit_simple(struct sim *s, unsigned qi, uint64_t comm_id, uint64_t comm_seq, uint32_t rank,
                              uint64_t count)
{
	uint64_t session = s->qs[qi].q.session_id;
	struct dfccl_sqe e = {.comm_id = comm_id, .comm_seq = comm_seq, .count = count,
	                      .send_reg = reg_new(session, count * 4), .recv_reg = reg_new(session, count * 4),
	                      .opcode = DFCCL_OP_ALLREDUCE, .dtype = 2, .redop = 0, .rank = rank};
	return sim_submit(s, qi, &e);
}

/* A nap on a busy node: the engine gives up its core and a busy process
 * keeps it for a slice, as the scheduler does to a worker that yields
 * often beside CPU-bound processes. */
static unsigned starved_naps;

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void starved_nap(void)
{
	starved_naps++;
	struct timespec ts = {0, 2000000};
	nanosleep(&ts, NULL);
}

/*
 * A head task whose peer has not posted waits at most its threshold's worth
 * of time, however little CPU its engine gets: its waits nap (they do not
 * spin on sched_yield, which starves the caller beside busy processes) and
 * time away from the core counts against the threshold. Here every nap
 * costs 2 ms and the threshold is spin-max, 2,000,000 polls: counted in
 * polls alone (a nap per 64) the wait would last over a minute, as the
 * workers of a restarted daemon did on a busy node. Counted in time it is
 * preempted within 2,000,000 x 50 ns = 100 ms, and the collective then
 * completes once the peer posts.
 */
static void test_starved_wait(void **state)
{
	(void)state;
	const struct sched_params sticky = {.spin_head = 2000000, .spin_other = 4, .stick_mult = 20,
	                                    .spin_max = 2000000, .order = SCHED_ORDER_FIFO};
	struct sim s;
	sim_nap = starved_nap;
	sim_init(&s, 2, &sticky);
	sim_nap = NULL;
	unsigned rank_q[2] = {sim_queue(&s, 0, 101), sim_queue(&s, 1, 102)};
	sim_comm(&s, 7, 2, rank_q);
	uint64_t seq0 = submit_simple(&s, rank_q[0], 7, 1, 0, 4);
	sim_pump(&s);
	starved_naps = 0;
	uint64_t t0 = now_ms();
	host_engine_run(s.eng[0]);
	uint64_t took = now_ms() - t0;
	print_message("a starved head wait: preempted after %llu ms, %u naps\n", (unsigned long long)took, starved_naps);
	assert_true(starved_naps > 0);
	assert_true(took < 2000);
	assert_int_equal(s.stats[0].preemptions, 1);
	assert_false(sim_completed(&s, rank_q[0], seq0));
	uint64_t seq1 = submit_simple(&s, rank_q[1], 7, 1, 1, 4);
	sim_drive(&s);
	assert_int_equal(sim_status(&s, rank_q[0], seq0), DFCCL_CQ_OK);
	assert_int_equal(sim_status(&s, rank_q[1], seq1), DFCCL_CQ_OK);
	sim_free(&s);
}

/*
 * A flooder whose peer never joins cannot hold more than max-inflight tasks:
 * the entry past the limit is refused with DFCCL_CQ_LIMIT (and its
 * communicator fails, so the rest follow), while another session's
 * collectives on the same engine complete with the right data.
 */
static void test_inflight_limit(void **state)
{
	(void)state;
	enum { LIMIT = 64, FLOOD = 100 };
	struct sim s;
	sim_init_served(&s, 2, LIMIT, 0);
	unsigned victim[2] = {sim_queue(&s, 0, 1), sim_queue(&s, 1, 2)};
	unsigned flood[2] = {sim_queue(&s, 0, 10), sim_queue(&s, 1, 11)};
	sim_comm(&s, 77, 2, victim);
	sim_comm(&s, 101, 2, flood);
	uint64_t seq[FLOOD];
	for (unsigned k = 0; k < FLOOD; k++)
		seq[k] = submit_simple(&s, flood[0], 101, k + 1, 0, 4);
	for (unsigned round = 0; round < 50; round++) {
		sim_spin(&s, 1);
		assert_true(host_engine_pending(s.eng[0]) <= LIMIT);
	}
	assert_true(sim_completed(&s, flood[0], seq[LIMIT]));
	assert_int_equal(sim_status(&s, flood[0], seq[LIMIT]), DFCCL_CQ_LIMIT);
	struct coll c = {.id = 1, .op = DFCCL_OP_ALLREDUCE, .dt = 2, .n = 2, .count = 1000};
	memcpy(c.q, victim, sizeof(victim));
	coll_prepare(&s, &c);
	coll_submit_rank(&s, &c, 0, 77, 1, 0, 0);
	coll_submit_rank(&s, &c, 1, 77, 1, 0, 0);
	sim_drive(&s);
	coll_check(&s, &c);
	/* The flooder's tasks all ended with its communicator. */
	for (unsigned k = 0; k < FLOOD; k++)
		assert_int_not_equal(sim_status(&s, flood[0], seq[k]), DFCCL_CQ_OK);
	sim_free(&s);
}

/*
 * The sessions of one uid flood engine 0 with collectives their peer never
 * joins, each within max-inflight but together past the uid's limit: the
 * uid's tasks stop at its limit, the entry past it is refused with
 * DFCCL_CQ_LIMIT_UID (its communicator fails, so its other tasks end too),
 * while the other flooding session keeps what it holds and another uid's
 * collectives complete with the right data. Once the flood is aborted the
 * uid is admitted again, counted right after a queue pair of another uid
 * left the engine.
 */
static void test_uid_limit(void **state)
{
	(void)state;
	enum { LIMIT = 100, UID_LIMIT = 150, FLOOD = 90, FLOOD_UID = 7 };
	struct sim s;
	sim_init_served(&s, 2, LIMIT, UID_LIMIT);
	unsigned victim[2] = {sim_queue_uid(&s, 0, 1, 9), sim_queue_uid(&s, 1, 2, 9)};
	unsigned peer = sim_queue_uid(&s, 1, 20, 8);
	unsigned fq[2] = {sim_queue_uid(&s, 0, 10, FLOOD_UID), sim_queue_uid(&s, 0, 11, FLOOD_UID)};
	sim_comm(&s, 77, 2, victim);
	uint64_t seq[2][FLOOD];
	for (unsigned round = 0; round < 2; round++) {
		uint64_t done[2] = {q_completed(&s.qs[fq[0]]), q_completed(&s.qs[fq[1]])};
		for (unsigned f = 0; f < 2; f++) {
			unsigned ranks[2] = {fq[f], peer};
			sim_comm(&s, 101 + 2 * round + f, 2, ranks);
			for (unsigned k = 0; k < FLOOD; k++)
				seq[f][k] = submit_simple(&s, fq[f], 101 + 2 * round + f, k + 1, 0, 4);
		}
		for (unsigned r = 0; r < 50; r++) {
			sim_spin(&s, 1);
			assert_true(host_engine_pending(s.eng[0]) <= UID_LIMIT);
		}
		/* The flooder served first holds all it submitted; the other got
		 * what the uid's limit left, and the rest was refused. */
		unsigned held = q_completed(&s.qs[fq[0]]) == done[0] ? 0 : 1, refused = 1 - held;
		assert_int_equal(q_completed(&s.qs[fq[held]]), done[held]);
		for (unsigned k = 0; k < FLOOD; k++)
			assert_int_equal(sim_status(&s, fq[refused], seq[refused][k]), DFCCL_CQ_LIMIT_UID);
		assert_int_equal(host_engine_pending(s.eng[0]), FLOOD);
		struct coll c = {.id = 1 + round, .op = DFCCL_OP_ALLREDUCE, .dt = 2, .n = 2, .count = 1000};
		memcpy(c.q, victim, sizeof(victim));
		coll_prepare(&s, &c);
		coll_submit_rank(&s, &c, 0, 77 + round, 1, 0, 0);
		coll_submit_rank(&s, &c, 1, 77 + round, 1, 0, 0);
		for (unsigned r = 0; r < ROUND_CAP && !sim_completed(&s, victim[0], c.seq[0]); r++)
			sim_spin(&s, 1);
		coll_check(&s, &c);
		for (unsigned e = 0; e < 2; e++)
			host_engine_comm_abort(s.eng[e], 101 + 2 * round + held, DFCCL_CQ_ABORTED);
		sim_spin(&s, 2);
		assert_int_equal(host_engine_pending(s.eng[0]), 0);
		/* The victim's first queue pair leaves: its uid was the engine's
		 * first, so the flooders' uid moves into its place (and the
		 * flooders' queue pairs change places in the engine). */
		if (round == 0) {
			s.ops->qp_del(s.eng[0], &s.qs[victim[0]].q);
			victim[0] = sim_queue_uid(&s, 0, 3, 9);
			sim_comm(&s, 78, 2, victim);
		}
	}
	sim_free(&s);
}

/*
 * Flooders on engine 0 (sessions 10.., communicators 101..) whose peer on
 * engine 1 never joins, each submitting `each` all-reduces: they take their
 * guarantees and the whole shared part, and the rest of their entries wait
 * in their queues. Returns the first flooder's queue; the others follow.
 */
static unsigned flood_engine0(struct sim *s, unsigned nflood, unsigned each)
{
	unsigned peer = sim_queue(s, 1, 20);
	unsigned first = s->nq;
	for (unsigned f = 0; f < nflood; f++) {
		unsigned ranks[2] = {sim_queue(s, 0, 10 + f), peer};
		sim_comm(s, 101 + f, 2, ranks);
		for (unsigned k = 0; k < each; k++)
			submit_simple(s, ranks[0], 101 + f, k + 1, 0, 4);
	}
	sim_spin(s, 40);
	assert_int_equal(host_engine_pending(s->eng[0]), nflood * SCHED_QP_GUARANTEE + SCHED_SHARED);
	return first;
}

/* Ends flood_engine0's flood. */
static void flood_end(struct sim *s, unsigned nflood)
{
	for (unsigned f = 0; f < nflood; f++)
		for (unsigned e = 0; e < 2; e++)
			host_engine_comm_abort(s->eng[e], 101 + f, DFCCL_CQ_ABORTED);
}

/*
 * Flooders that stay within their limit but whose peers never join: each
 * holds what admission gives it and the rest waits in its own submission
 * queue, the engine never holds more than its task queue, and a victim
 * session's collectives still find a place and complete, one after another.
 * Once the flooders' communicators are aborted everything drains and the
 * engine gives its task storage back.
 */
static void test_fair_admission(void **state)
{
	(void)state;
	enum { NFLOOD = 3, FLOOD = 400, VICTIM = 10 };
	struct sim s;
	sim_init_served(&s, 2, SCHED_MAX_INFLIGHT, 0);
	unsigned victim[2] = {sim_queue(&s, 0, 1), sim_queue(&s, 1, 2)};
	sim_comm(&s, 77, 2, victim);
	unsigned fq = flood_engine0(&s, NFLOOD, FLOOD);
	assert_true(host_engine_capacity(s.eng[0]) <= SCHED_MAX_TASKS);
	for (unsigned f = 0; f < NFLOOD; f++)
		assert_int_equal(q_completed(&s.qs[fq + f]), 0); /* waiting, not refused */
	for (unsigned k = 0; k < VICTIM; k++) {
		struct coll c = {.id = 10 + k, .op = DFCCL_OP_ALLREDUCE, .dt = 2, .n = 2, .count = 256};
		memcpy(c.q, victim, sizeof(victim));
		coll_prepare(&s, &c);
		coll_submit_rank(&s, &c, 0, 77, k + 1, 0, 0);
		coll_submit_rank(&s, &c, 1, 77, k + 1, 0, 0);
		for (unsigned round = 0; round < ROUND_CAP && !sim_completed(&s, victim[0], k + 1); round++)
			sim_spin(&s, 1);
		coll_check(&s, &c);
	}
	flood_end(&s, NFLOOD);
	sim_drive(&s);
	assert_true(host_engine_capacity(s.eng[0]) <= 64);
	sim_free(&s);
}

/* Rounds a test of admission beyond the room waits for an entry: far more
 * than it takes, far fewer than ROUND_CAP, since a hang spins through all
 * of them with the flooders' tasks in the queue. */
#define ADMIT_ROUNDS 20000u

/* Spins until entry seq of queue qi completed or ADMIT_ROUNDS passed. */
static void spin_until(struct sim *s, unsigned qi, uint64_t seq)
{
	for (unsigned round = 0; round < ADMIT_ROUNDS && !sim_completed(s, qi, seq); round++)
		sim_spin(s, 1);
}

/*
 * Two ranks sharing a device submit more collectives than their guarantee
 * and than one pass looks at beyond it, on as many communicators, in
 * opposite orders, while flooders hold the shared part: each rank's
 * admitted collectives wait for the other's, which lie beyond its room.
 * They complete because an entry whose instance a peer posted is admitted
 * anyway (dfccl_comm_peer_posted), and each pass looks further along the
 * queue; each is checked against its reference, and the flooders still
 * hold only what they may.
 */
static void test_admission_keeps_any_order(void **state)
{
	(void)state;
	enum { NFLOOD = 3, FLOOD = 400, K = 2 * (SCHED_QP_GUARANTEE + SCHED_BEYOND_LOOKS) };
	struct sim s;
	sim_init_served(&s, 2, SCHED_MAX_INFLIGHT, 0);
	unsigned victim[2] = {sim_queue(&s, 0, 1), sim_queue(&s, 0, 2)};
	flood_engine0(&s, NFLOOD, FLOOD);
	static struct coll c[K];
	for (unsigned k = 0; k < K; k++) {
		sim_comm(&s, 300 + k, 2, victim);
		c[k] = (struct coll){.id = 40 + k, .op = DFCCL_OP_ALLREDUCE, .dt = 2, .n = 2, .count = 64 + k};
		memcpy(c[k].q, victim, sizeof(victim));
		coll_prepare(&s, &c[k]);
	}
	for (unsigned k = 0; k < K; k++) {
		coll_submit_rank(&s, &c[k], 0, 300 + k, 1, 0, 0);
		coll_submit_rank(&s, &c[K - 1 - k], 1, 300 + K - 1 - k, 1, 0, 0);
	}
	spin_until(&s, victim[1], c[0].seq[1]);
	for (unsigned k = 0; k < K; k++) {
		spin_until(&s, victim[0], c[k].seq[0]);
		coll_check(&s, &c[k]);
	}
	assert_true(host_engine_pending(s.eng[0]) <= NFLOOD * SCHED_QP_GUARANTEE + SCHED_SHARED);
	flood_end(&s, NFLOOD);
	sim_drive(&s);
	sim_free(&s);
}

/*
 * The same for sends and receives: two ranks sharing a device each submit
 * receives from the other first, on communicators of their own, and then
 * the sends the other waits for, while flooders hold the shared part. So
 * each rank's admitted tasks are receives, and the sends they wait for lie
 * beyond the other's room. A waiting receive stores `want`, which makes its
 * send read as peer-posted; without it both ranks would wait forever.
 * Every message arrives intact.
 */
static void test_admission_keeps_p2p_any_order(void **state)
{
	(void)state;
	enum { NFLOOD = 3, FLOOD = 400, K = 2 * SCHED_QP_GUARANTEE, DT = 2 /* int32 */ };
	struct sim s;
	sim_init_served(&s, 2, SCHED_MAX_INFLIGHT, 0);
	unsigned rq[2] = {sim_queue(&s, 0, 1), sim_queue(&s, 0, 2)};
	flood_engine0(&s, NFLOOD, FLOOD);
	/* Message m on communicator 300 + m: rank 1 sends it to rank 0 for
	 * m < K, rank 0 to rank 1 for the others. */
	struct {
		uint32_t from, sreg, rreg;
		uint64_t count, sseq, rseq;
	} m[2 * K];
	for (unsigned k = 0; k < 2 * K; k++) {
		sim_comm(&s, 300 + k, 2, rq);
		m[k].from = k < K ? 1 : 0;
		m[k].count = 16 + k;
		m[k].sreg = reg_new(s.qs[rq[m[k].from]].q.session_id, m[k].count * 4);
		m[k].rreg = reg_new(s.qs[rq[1 - m[k].from]].q.session_id, m[k].count * 4);
		for (uint64_t j = 0; j < m[k].count; j++)
			put_small(DT, reg_ptr(m[k].sreg) + j * 4, vin(700 + k, m[k].from, j, DT));
	}
	/* Each rank: its receives (the other's sends) first, then its sends. */
	for (uint32_t r = 0; r < 2; r++)
		for (int sending = 0; sending < 2; sending++)
			for (unsigned k = 0; k < 2 * K; k++) {
				if ((m[k].from == r) != sending)
					continue;
				struct dfccl_sqe e = {.comm_id = 300 + k, .comm_seq = 1, .count = m[k].count, .dtype = DT,
				                      .rank = r, .peer = 1 - r,
				                      .opcode = sending ? DFCCL_OP_SEND : DFCCL_OP_RECV};
				if (sending) {
					e.send_reg = m[k].sreg;
					m[k].sseq = sim_submit(&s, rq[r], &e);
				} else {
					e.recv_reg = m[k].rreg;
					m[k].rseq = sim_submit(&s, rq[r], &e);
				}
			}
	for (unsigned k = 0; k < 2 * K; k++) {
		spin_until(&s, rq[1 - m[k].from], m[k].rseq);
		spin_until(&s, rq[m[k].from], m[k].sseq);
		assert_int_equal(sim_status(&s, rq[m[k].from], m[k].sseq), DFCCL_CQ_OK);
		assert_int_equal(sim_status(&s, rq[1 - m[k].from], m[k].rseq), DFCCL_CQ_OK);
		assert_memory_equal(reg_ptr(m[k].rreg), reg_ptr(m[k].sreg), m[k].count * 4);
	}
	flood_end(&s, NFLOOD);
	sim_drive(&s);
	sim_free(&s);
}

/* Aborting a communicator completes its tasks with the status, now and
 * later, on this engine and (through the region) on the others, while
 * another communicator of the same ranks keeps working. */
static void test_abort(void **state)
{
	(void)state;
	struct sim s;
	unsigned rank_q[2];
	sim_start(&s, 2, 2, rank_q, 600, 30);
	sim_comm(&s, 31, 2, rank_q);
	uint64_t a = submit_simple(&s, rank_q[0], 30, 1, 0, 4);
	sim_spin(&s, 20);
	assert_false(sim_completed(&s, rank_q[0], a));
	assert_int_equal(host_engine_pending(s.eng[0]), 1);
	host_engine_comm_abort(s.eng[0], 30, DFCCL_CQ_ABORTED);
	assert_int_equal(sim_status(&s, rank_q[0], a), DFCCL_CQ_ABORTED);
	assert_int_equal(host_engine_pending(s.eng[0]), 0);
	assert_int_equal(sim_region(&s, 0)->aborted, DFCCL_CQ_ABORTED);
	/* Later entries: on the aborting engine, and on one not told yet. */
	uint64_t b = submit_simple(&s, rank_q[0], 30, 2, 0, 4);
	uint64_t c1 = submit_simple(&s, rank_q[1], 30, 1, 1, 4);
	struct coll y = {.id = 31, .op = DFCCL_OP_ALLREDUCE, .dt = 7, .redop = 2, .n = 2, .count = 100};
	memcpy(y.q, rank_q, sizeof(rank_q));
	coll_submit(&s, &y, 31, 1);
	sim_drive(&s);
	assert_int_equal(sim_status(&s, rank_q[0], b), DFCCL_CQ_ABORTED);
	assert_int_equal(sim_status(&s, rank_q[1], c1), DFCCL_CQ_ABORTED);
	coll_check(&s, &y);
	host_engine_comm_abort(s.eng[1], 30, DFCCL_CQ_PEER_LOST);
	assert_int_equal(sim_region(&s, 0)->aborted, DFCCL_CQ_ABORTED); /* the first status stays */
	sim_free(&s);
}

/* Ranks that disagree (a count mismatch; a buffer gone from under a post)
 * all fail, none hangs. */
static void test_inconsistent_posts(void **state)
{
	(void)state;
	enum { N = 3 };
	struct sim s;
	unsigned rank_q[N];
	sim_start(&s, N, N, rank_q, 700, 40);
	sim_comm(&s, 41, N, rank_q);
	uint64_t seq[N];
	for (uint32_t r = 0; r < N; r++)
		seq[r] = submit_simple(&s, rank_q[r], 40, 1, r, r == 2 ? 9 : 8);
	sim_drive(&s);
	expect_all(&s, rank_q, seq, N, DFCCL_CQ_MISMATCH);
	assert_int_equal(sim_region(&s, 0)->aborted, DFCCL_CQ_MISMATCH);

	/* Rank 0 posts, then its send buffer is deregistered. */
	seq[0] = submit_simple(&s, rank_q[0], 41, 1, 0, 8);
	sim_spin(&s, 5);
	uint32_t dropped = nregs - 1; /* its send registration: the one before the receive's */
	void *kept = regs[dropped - 1].base;
	regs[dropped - 1].base = NULL;
	for (uint32_t r = 1; r < N; r++)
		seq[r] = submit_simple(&s, rank_q[r], 41, 1, r, 8);
	sim_drive(&s);
	expect_all(&s, rank_q, seq, N, DFCCL_CQ_BAD_REG);
	regs[dropped - 1].base = kept;
	sim_free(&s);
}

/*
 * Ranks whose entries disagree on the operation, the type, the root or the
 * algorithm all fail with DFCCL_CQ_MISMATCH before anything moves, on a
 * communicator of their own each (a mismatch aborts it). A hint for an
 * algorithm that cannot run the collective is no disagreement: every rank
 * runs it direct.
 */
static void test_mismatch(void **state)
{
	(void)state;
	enum { N = 3 };
	static const struct {
		uint8_t op, redop, dt, algo, odd_redop, odd_dt, odd_algo;
		uint32_t root, odd_root;
		uint32_t status;
	} cases[] = {
	    {DFCCL_OP_ALLREDUCE, 0, 7, 0, 2, 7, 0, 0, 0, DFCCL_CQ_MISMATCH},                          /* operation */
	    {DFCCL_OP_ALLREDUCE, 0, 7, 0, 0, 2, 0, 0, 0, DFCCL_CQ_MISMATCH},                          /* type, same size */
	    {DFCCL_OP_BROADCAST, 0, 7, 0, 0, 7, 0, 0, 1, DFCCL_CQ_MISMATCH},                          /* root */
	    {DFCCL_OP_ALLREDUCE, 0, 7, 0, 0, 7, DFCCL_ALGO_RING, 0, 0, DFCCL_CQ_MISMATCH},           /* algorithm */
	    {DFCCL_OP_REDUCE, 0, 7, DFCCL_ALGO_TREE, 0, 7, DFCCL_ALGO_RING, 1, 1, DFCCL_CQ_MISMATCH}, /* algorithm */
	    {DFCCL_OP_ALLGATHER, 0, 7, 0, 0, 7, DFCCL_ALGO_TREE, 0, 0, DFCCL_CQ_OK},                 /* tree: n/a */
	};
	for (unsigned k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct sim s;
		unsigned rank_q[N];
		sim_start(&s, N, 2, rank_q, 900, 70);
		struct coll c = {.id = 9400 + k, .op = cases[k].op, .dt = cases[k].dt, .redop = cases[k].redop,
		                 .n = N, .root = cases[k].root, .count = 50, .algo = cases[k].algo};
		memcpy(c.q, rank_q, sizeof(rank_q));
		coll_prepare(&s, &c);
		for (uint32_t r = 0; r < N; r++) {
			struct coll odd = c;
			if (r == N - 1)
				odd.redop = cases[k].odd_redop, odd.dt = cases[k].odd_dt, odd.algo = cases[k].odd_algo,
				odd.root = cases[k].odd_root;
			coll_submit_rank(&s, &odd, r, 70, 1, 0, 0);
			c.seq[r] = odd.seq[r];
		}
		sim_drive(&s);
		if (cases[k].status == DFCCL_CQ_OK) {
			coll_check(&s, &c);
		} else {
			expect_all(&s, rank_q, c.seq, N, cases[k].status);
			assert_int_equal(sim_region(&s, 0)->aborted, cases[k].status);
		}
		sim_free(&s);
	}
}

/*
 * Keys past 2^40, where the progress word keeps only the low 40 bits of the
 * key: an instance in a slot whose previous user (key - 32, just below
 * 2^40) left a progress word that compares above the new instance's
 * targets must still wait for the new instance's steps. The region is
 * primed as if keys up to k - 1 had run.
 */
static void test_keys_past_progress_bits(void **state)
{
	(void)state;
	enum { N = 4 };
	static const uint8_t algos[] = {DFCCL_ALGO_RING, DFCCL_ALGO_TREE, DFCCL_ALGO_DIRECT};
	for (size_t a = 0; a < sizeof(algos); a++) {
		struct sim s;
		unsigned rank_q[N];
		sim_start(&s, N, 2, rank_q, 950, 80);
		const uint64_t k0 = (1ull << 40) - 3; /* k0 .. k0 + 5 cross the boundary */
		for (uint64_t k = k0; k < k0 + 6; k++)
			for (uint32_t r = 0; r < N; r++) {
				struct dfccl_rank_post *p = dfccl_comm_post(s.regions[0], N, k, r);
				uint64_t prev = k - DFCCL_COMM_SLOTS;
				p->key = p->done = prev;
				p->progress = DFCCL_PROGRESS(prev, 6);
			}
		struct coll c[6];
		for (unsigned i = 0; i < 6; i++) {
			c[i] = (struct coll){.id = 9500 + (unsigned)a * 8 + i, .op = DFCCL_OP_ALLREDUCE, .dt = 7, .n = N,
			                     .count = 300 + i, .algo = algos[a]};
			memcpy(c[i].q, rank_q, sizeof(rank_q));
			coll_submit(&s, &c[i], 80, k0 + i);
		}
		sim_drive(&s);
		for (unsigned i = 0; i < 6; i++)
			coll_check(&s, &c[i]);
		sim_free(&s);
	}
}

/* Pages of [p, p + len) resident in memory. */
static unsigned resident_pages(const void *p, size_t len)
{
	unsigned char vec[64];
	size_t pages = len / 4096;
	assert_true(pages <= sizeof(vec));
	assert_int_equal(mincore((void *)p, len, vec), 0);
	unsigned n = 0;
	for (size_t i = 0; i < pages; i++)
		n += vec[i] & 1;
	return n;
}

/*
 * Registered collectives over algorithms that stage data in connectors
 * give the connector pages back once the instance is done everywhere;
 * NCCL-style slots keep them. Results stay right either way.
 */
static void test_connector_release(void **state)
{
	(void)state;
	enum { N = 3 };
	struct sim s;
	unsigned rank_q[N];
	sim_start(&s, N, 2, rank_q, 960, 90);
	struct coll reg = {.id = 9600, .op = DFCCL_OP_REDUCE, .dt = 7, .n = N, .root = 2, .count = 3 * 8192 + 5,
	                   .algo = DFCCL_ALGO_RING};
	memcpy(reg.q, rank_q, sizeof(rank_q));
	coll_prepare(&s, &reg);
	for (uint32_t r = 0; r < N; r++)
		coll_submit_rank(&s, &reg, r, 90, 1, DFCCL_SQE_F_REGISTERED, 7);
	sim_drive(&s);
	coll_check(&s, &reg);
	struct coll nccl = reg;
	nccl.id = 9601;
	coll_submit(&s, &nccl, 90, 1);
	sim_drive(&s);
	coll_check(&s, &nccl);
	/* In the ring ending at rank 2, rank 1 (the middle of the chain) staged
	 * partials in its connector. */
	const char *reg_conn = dfccl_comm_conn(s.regions[0], N, dfccl_comm_reg_conn_slot(7, 1), 1);
	const char *nccl_conn = dfccl_comm_conn(s.regions[0], N, dfccl_comm_conn_slot(1), 1);
	assert_int_equal(resident_pages(reg_conn, DFCCL_COMM_CONN_BYTES), 0);
	assert_true(resident_pages(nccl_conn, DFCCL_COMM_CONN_BYTES) > 0);
	sim_free(&s);
}

/* A queue that goes away drops its tasks silently and fails its peers. */
static void test_queue_gone(void **state)
{
	(void)state;
	enum { N = 3 };
	struct sim s;
	unsigned rank_q[N];
	sim_start(&s, N, N, rank_q, 800, 50);
	uint64_t lost = submit_simple(&s, rank_q[2], 50, 1, 2, 16);
	sim_spin(&s, 5);
	host_engine_queue_gone(s.eng[2], &s.qs[rank_q[2]].q);
	s.qs[rank_q[2]].gone = 1;
	assert_int_equal(host_engine_pending(s.eng[2]), 0);
	uint64_t seq[2];
	for (uint32_t r = 0; r < 2; r++)
		seq[r] = submit_simple(&s, rank_q[r], 50, 1, r, 16);
	sim_drive(&s);
	expect_all(&s, rank_q, seq, 2, DFCCL_CQ_PEER_LOST);
	assert_false(sim_completed(&s, rank_q[2], lost));
	sim_free(&s);
}

/* Removing a communicator fails what is left of it, and what comes later. */
static void test_comm_del(void **state)
{
	(void)state;
	struct sim s;
	unsigned rank_q[2];
	sim_start(&s, 2, 2, rank_q, 900, 60);
	uint64_t a = submit_simple(&s, rank_q[0], 60, 1, 0, 4);
	sim_spin(&s, 5);
	host_engine_comm_del(s.eng[0], 60);
	host_engine_comm_del(s.eng[1], 60);
	assert_int_equal(sim_status(&s, rank_q[0], a), DFCCL_CQ_BAD_COMM);
	uint64_t b = submit_simple(&s, rank_q[1], 60, 1, 1, 4);
	sim_drive(&s);
	assert_int_equal(sim_status(&s, rank_q[1], b), DFCCL_CQ_BAD_COMM);
	sim_free(&s);
}

/* Every check host_engine_submit makes, one entry each, straight into the
 * engine (what sq_check catches never gets there). */
static void test_submit_checks(void **state)
{
	(void)state;
	struct sim s;
	sim_init(&s, 1, &small_spins);
	unsigned qa = sim_queue(&s, 0, 70), qb = sim_queue(&s, 0, 71);
	unsigned rank_q[2] = {qa, qb};
	sim_comm(&s, 80, 2, rank_q);
	uint32_t a16 = reg_new(70, 16), a64 = reg_new(70, 64), b64 = reg_new(71, 64);
	const struct dfccl_sqe ok = {.comm_id = 80, .comm_seq = 1, .count = 4, .send_reg = a64, .recv_reg = a64,
	                             .opcode = DFCCL_OP_ALLREDUCE, .dtype = 2, .rank = 0};
	struct {
		struct dfccl_sqe e;
		uint32_t want;
	} cases[16];
	unsigned n = 0;
#define CASE(field_changes, status)                                                                            \
	do {                                                                                                       \
		cases[n].e = ok;                                                                                   \
		struct dfccl_sqe *x = &cases[n].e;                                                                 \
		field_changes;                                                                                     \
		cases[n++].want = status;                                                                          \
	} while (0)
	CASE(x->comm_id = 81, DFCCL_CQ_BAD_COMM);
	CASE(x->rank = 2, DFCCL_CQ_BAD_COMM);
	CASE(x->rank = 1, DFCCL_CQ_BAD_COMM); /* rank 1 is session 71's */
	CASE(x->comm_seq = 0, DFCCL_CQ_BAD_ENTRY);
	CASE((x->opcode = DFCCL_OP_BROADCAST, x->peer = 2), DFCCL_CQ_BAD_ENTRY);
	CASE((x->opcode = DFCCL_OP_SEND, x->peer = 0), DFCCL_CQ_BAD_ENTRY);
	CASE((x->opcode = DFCCL_OP_RECV, x->peer = 7), DFCCL_CQ_BAD_ENTRY);
	CASE((x->opcode = DFCCL_OP_SEND, x->peer = 1, x->flags = DFCCL_SQE_F_REGISTERED), DFCCL_CQ_BAD_ENTRY);
	CASE((x->flags = DFCCL_SQE_F_REGISTERED, x->coll_id = DFCCL_COMM_MAX_COLLS), DFCCL_CQ_BAD_ENTRY);
	CASE((x->opcode = DFCCL_OP_ALLGATHER, x->recv_reg = a16, x->count = 3), DFCCL_CQ_OUT_OF_RANGE);
	CASE((x->opcode = DFCCL_OP_REDUCESCATTER, x->send_reg = a16, x->count = 3), DFCCL_CQ_OUT_OF_RANGE);
	CASE((x->opcode = DFCCL_OP_ALLGATHER, x->recv_off = 40), DFCCL_CQ_OUT_OF_RANGE);
	CASE(x->recv_reg = b64, DFCCL_CQ_BAD_REG);
	CASE((x->opcode = DFCCL_OP_BROADCAST, x->peer = 0, x->send_reg = 0), DFCCL_CQ_BAD_REG);
	CASE((x->opcode = DFCCL_OP_REDUCE, x->peer = 0, x->recv_reg = 99), DFCCL_CQ_BAD_REG);
	CASE(x->opcode = DFCCL_OP_NOP, DFCCL_CQ_BAD_OPCODE);
#undef CASE
	for (unsigned i = 0; i < n; i++) {
		cases[i].e.seq = cases[i].e.arm = i + 1; /* as sq_take hands it over */
		host_engine_submit(s.eng[0], &s.qs[qa].q, &cases[i].e);
		if (sim_status(&s, qa, i + 1) != cases[i].want)
			fail_msg("case %u: status %u, want %u", i, sim_status(&s, qa, i + 1), cases[i].want);
		/* Entries that are no member's leave the communicator alone; the
		 * first refused member's entry fails it for every rank. */
		assert_int_equal(sim_region(&s, 0)->aborted, i < 3 ? 0 : DFCCL_CQ_BAD_ENTRY);
	}
	assert_int_equal(host_engine_pending(s.eng[0]), 0);
	assert_int_equal(s.stats[0].errors, n);
	/* A good entry now completes with the communicator's failure. */
	struct dfccl_sqe good = ok;
	good.seq = good.arm = n + 1;
	host_engine_submit(s.eng[0], &s.qs[qa].q, &good);
	assert_int_equal(sim_status(&s, qa, n + 1), DFCCL_CQ_BAD_ENTRY);
	/* A good entry on a healthy communicator is taken. */
	sim_comm(&s, 84, 2, rank_q);
	good.comm_id = 84;
	good.seq = good.arm = n + 2;
	host_engine_submit(s.eng[0], &s.qs[qa].q, &good);
	assert_int_equal(host_engine_pending(s.eng[0]), 1);
	host_engine_comm_abort(s.eng[0], 84, DFCCL_CQ_ABORTED);
	assert_int_equal(sim_status(&s, qa, n + 2), DFCCL_CQ_ABORTED);
	/* comm_add refuses a duplicate id, a short region, no ranks. */
	struct engine_member m[2] = {{0, 0, 70}, {1, 0, 71}};
	assert_int_equal(host_engine_comm_add(s.eng[0], 80, 2, m, s.regions[0], DFCCL_COMM_REGION_SIZE(2)), -EEXIST);
	assert_int_equal(host_engine_comm_add(s.eng[0], 82, 2, m, s.regions[0], 4096), -EINVAL);
	assert_int_equal(host_engine_comm_add(s.eng[0], 83, 0, m, s.regions[0], DFCCL_COMM_REGION_SIZE(2)), -EINVAL);
	sim_free(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_collectives_matrix),
	    cmocka_unit_test(test_send_recv),
	    cmocka_unit_test(test_send_recv_mismatch),
	    cmocka_unit_test(test_deadlock_pattern),
	    cmocka_unit_test(test_deadlock_pattern_algos),
	    cmocka_unit_test(test_algos),
	    cmocka_unit_test(test_algos_large),
	    cmocka_unit_test(test_plan_by_size),
	    cmocka_unit_test(test_registered_any_order),
	    cmocka_unit_test(test_priority_order),
	    cmocka_unit_test(test_backlog),
	    cmocka_unit_test(test_inflight_limit),
	    cmocka_unit_test(test_uid_limit),
	    cmocka_unit_test(test_fair_admission),
	    cmocka_unit_test(test_admission_keeps_any_order),
	    cmocka_unit_test(test_admission_keeps_p2p_any_order),
	    cmocka_unit_test(test_abort),
	    cmocka_unit_test(test_inconsistent_posts),
	    cmocka_unit_test(test_mismatch),
	    cmocka_unit_test(test_keys_past_progress_bits),
	    cmocka_unit_test(test_connector_release),
	    cmocka_unit_test(test_queue_gone),
	    cmocka_unit_test(test_comm_del),
	    cmocka_unit_test(test_submit_checks),
	    cmocka_unit_test(test_visit_bytes),
	    cmocka_unit_test(test_starved_wait),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
