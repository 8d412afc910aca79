/*
 * See host_coll.h. The steps of a task, in order:
 *
 *   collectives: SLOT (wait until the slot's previous instance is finished
 *   everywhere, then post) -> POSTS (wait for every rank's post, check them)
 *   -> WORK1 -> [allreduce: SYNC1 (wait until every rank finished phase 1)
 *   -> WORK2] -> FINISH (store done, wait until every rank has).
 *   collectives over a ring or trees (gpu/algo.h): SLOT -> POSTS ->
 *   (AWAIT (wait for the ranks the algorithm step depends on) -> AWORK (the
 *   step's data movement, then progress = DFCCL_PROGRESS(key, step + 1)))
 *   for every step of the algorithm -> FINISH.
 *   send: BOX_FREE (wait until the receiver acknowledged the mailbox's
 *   previous message, then post) -> BOX_ACK (wait for the acknowledgement).
 *   recv: BOX_WANT (wait until this rank acknowledged the mailbox's
 *   previous message, then store `want`) -> BOX_KEY (wait for the sender's
 *   post, check it) -> WORK1 (copy, then acknowledge).
 *
 * Every wait is one predicate, "word >= target" over one word or over the
 * same word of every rank's post, so one spin loop serves them all. Words
 * in the regions only grow while an instance is in flight, so a rank seen
 * ready stays ready and a wait resumes at the first rank it has not seen.
 *
 * Memory ordering: a rank's stores of data and post fields happen before
 * its release store of the word that announces them (key, progress, done,
 * ack), and a reader acquires that word before it reads them. The release
 * store of `done` also orders the reads of peers' buffers before it, so a
 * peer that acquires it may let its client reuse the buffers.
 */
#include "host_coll.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "reduce.h"
#include "sqe_check.h"

#define A64(p) ((_Atomic uint64_t *)(p))

enum coll_step {
	STEP_SLOT = 0,
	STEP_POSTS,
	STEP_WORK1,
	STEP_SYNC1,
	STEP_WORK2,
	STEP_FINISH,
	STEP_BOX_FREE,
	STEP_BOX_ACK,
	STEP_BOX_KEY,
	STEP_BOX_WANT,
	STEP_AWAIT,
	STEP_AWORK,
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static inline uint64_t load_acq(const uint64_t *p)
{
	return atomic_load_explicit(A64(p), memory_order_acquire);
}

static inline void store_rel(uint64_t *p, uint64_t v)
{
	atomic_store_explicit(A64(p), v, memory_order_release);
}

/* ------------------------------------------------------------------ buffers */

/*
 * The address of [off, off + bytes) of registration reg_id, which must
 * belong to `session` and be mapped here. bytes == 0 needs nothing (NULL).
 * Serves the entry's own check and every read of a peer's post: a post is
 * written by another worker and is checked as carefully as an entry.
 */
static uint32_t coll_resolve(const struct host_coll_env *env, uint32_t reg_id, uint64_t session, uint64_t off,
                             uint64_t bytes, char **out)
{
	*out = NULL;
	if (bytes == 0)
		return DFCCL_CQ_OK;
	const struct sq_reg *r = reg_id ? env->reg_lookup(env->reg_ctx, reg_id) : NULL;
	uint32_t st = sqe_check_range(reg_id, r && r->base, r ? r->session_id : 0, r ? r->size : 0, session, off, bytes, 1);
	if (st == DFCCL_CQ_OK)
		*out = (char *)r->base + off;
	return st;
}

#define coll_is_p2p sqe_is_p2p
#define coll_has_root sqe_has_root
#define coll_sizes sqe_buf_bytes

uint32_t host_coll_check(const struct host_coll_env *env, const struct host_comm *c, const struct sq_queue *q,
                         const struct dfccl_sqe *e)
{
	const struct engine_member *m = e->rank < c->nranks ? &c->members[e->rank] : NULL;
	uint32_t st = sqe_check_member(e, c->nranks, m ? m->session_id : 0, m ? m->device : 0, q->session_id,
	                               env->device);
	if (st != DFCCL_CQ_OK)
		return st;
	unsigned dsize = sq_dtype_size(e->dtype);
	uint64_t sbytes, rbytes;
	if (coll_sizes(e->opcode, e->count, dsize, c->nranks, e->peer == e->rank, &sbytes, &rbytes) < 0)
		return DFCCL_CQ_OUT_OF_RANGE;
	char *p;
	st = coll_resolve(env, e->send_reg, q->session_id, e->send_off, sbytes, &p);
	if (st == DFCCL_CQ_OK)
		st = coll_resolve(env, e->recv_reg, q->session_id, e->recv_off, rbytes, &p);
	return st;
}

static void algo_enter(struct host_task *t, uint32_t astep);

void host_coll_init(struct host_task *t, struct host_comm *c, struct sq_queue *q, const struct dfccl_sqe *e,
                    uint32_t algo)
{
	memset(t, 0, sizeof(*t));
	t->q = q;
	t->comm = c;
	t->seq = e->seq;
	t->group_n = sqe_group(e, e->seq, q->n, &t->group_last);
	t->key = e->comm_seq;
	t->count = e->count;
	t->send_off = e->send_off;
	t->recv_off = e->recv_off;
	t->send_reg = e->send_reg;
	t->recv_reg = e->recv_reg;
	t->rank = e->rank;
	t->peer = e->peer;
	t->dsize = sq_dtype_size(e->dtype);
	t->opcode = e->opcode;
	t->dtype = e->dtype;
	t->redop = e->redop;
	uint32_t n = c->nranks;
	t->algo = algo_choose(&c->topo, e->opcode, e->count, t->dsize, e->algo, (uint8_t)algo);
	if (t->algo != DFCCL_ALGO_DIRECT) {
		/* algo_choose counted the steps of the whole: they fit. */
		algo_init(&t->alg, &c->topo, t->algo, e->opcode, e->redop, e->rank, coll_has_root(e->opcode) ? e->peer : 0,
		          e->count, 0, e->count, t->dsize, DFCCL_COMM_CONN_BYTES);
		algo_enter(t, 0);
	}
	uint64_t nslots;
	if (coll_is_p2p(e->opcode)) {
		int sending = e->opcode == DFCCL_OP_SEND;
		t->box = dfccl_comm_box(c->hdr, n, sending ? e->rank : e->peer, sending ? e->peer : e->rank, t->key);
		t->step = sending ? STEP_BOX_FREE : STEP_BOX_WANT;
		nslots = DFCCL_COMM_P2P_SLOTS;
	} else if (e->flags & DFCCL_SQE_F_REGISTERED) {
		t->posts = dfccl_comm_reg_post(c->hdr, n, e->coll_id, t->key, 0);
		t->conn_slot = dfccl_comm_reg_conn_slot(e->coll_id, t->key);
		t->step = STEP_SLOT;
		nslots = DFCCL_COMM_COLL_SLOTS;
	} else {
		t->posts = dfccl_comm_post(c->hdr, n, t->key, 0);
		t->conn_slot = dfccl_comm_conn_slot(t->key);
		t->step = STEP_SLOT;
		nslots = DFCCL_COMM_SLOTS;
	}
	t->slot_free = t->key > nslots ? t->key - nslots : 0;
}

/* ------------------------------------------------------------------ aborts */

uint32_t host_comm_aborted(const struct host_comm *c)
{
	if (c->abort_status)
		return c->abort_status;
	return dfccl_comm_abort_status(load_acq(&c->hdr->aborted));
}

void host_comm_fail(struct host_comm *c, uint32_t status)
{
	uint64_t expected = 0;
	atomic_compare_exchange_strong_explicit(A64(&c->hdr->aborted), &expected, status, memory_order_acq_rel,
	                                        memory_order_acquire);
}

/* ------------------------------------------------------------------ ring and trees */

/* Enters step `astep` of t's algorithm: its description, derived once and
 * used by every wait and data visit of the step. */
static void algo_enter(struct host_task *t, uint32_t astep)
{
	t->astep = astep;
	algo_step_get(&t->alg, astep, &t->cur);
}

/* Whether the step t is at keeps within the collective's buffers and ranks
 * (algo_step_valid), checked before its wait and before its data. */
static int algo_step_ok(const struct host_task *t)
{
	return algo_step_valid(&t->alg, &t->cur);
}

/* ------------------------------------------------------------------ waits */

/*
 * Waiting on a remote rank. A wait polls without a break for HOST_SPIN_NS
 * (a peer on another core usually answers within that), then naps between
 * every HOST_NAP_POLLS polls, so that on a node with fewer cores than busy
 * processes (CI runs 8 ranks on 2 cores) the rank we wait for gets this
 * core. A nap is a real sleep, not sched_yield: Linux's EEVDF scheduler
 * moves a yielding task a whole slice further back, as if it had run that
 * slice, so a worker that yields every few microseconds is charged a
 * slice each time and gets next to no CPU beside busy processes. Measured
 * on Linux 6.18, 2 cores: two such spinners beside two busy loops got
 * between 0.3 % and 15 % of a core each, and a daemon's two workers,
 * waiting on each other that way, left their collectives stuck for tens
 * of seconds while their ranks slept (the fault suite's restart trials
 * beside two busy loops). A sleeper keeps its place in the scheduler's
 * fairness.
 *
 * The threshold counts polls, but time away from the core counts too, at
 * HOST_POLL_NS a poll: a wait ends within threshold x HOST_POLL_NS of wall
 * time however little CPU the worker gets (a boosted head, 400,000 polls
 * by default, within 20 ms), so a starved worker still preempts its head
 * and runs the tasks its peers wait for.
 */
#define HOST_NAP_POLLS 64u
#define HOST_SPIN_NS 20000ull
#define HOST_NAP_NS 1000l
#define HOST_POLL_NS 50ull

void host_coll_nap(void)
{
	struct timespec ts = {0, HOST_NAP_NS};
	nanosleep(&ts, NULL);
}

/* The predicate of the wait at t's step: word(r) >= target for r < n, or
 * for the algorithm steps, listed ranks each with its own target. */
struct coll_cond {
	const uint64_t *word; /* rank 0's word */
	size_t stride;        /* words between two ranks' words */
	uint32_t n;
	uint64_t target;
	int listed;           /* word(r) is rank rankv[r]'s, its target targetv[r] */
	uint32_t rankv[ALGO_MAX_WAIT];
	uint64_t targetv[ALGO_MAX_WAIT];
};

static struct coll_cond coll_cond_of(const struct host_task *t)
{
	const size_t post_words = sizeof(struct dfccl_rank_post) / sizeof(uint64_t);
	struct coll_cond w = {.stride = post_words, .n = t->comm->nranks};
	switch (t->step) {
	case STEP_SLOT: w.word = &t->posts[0].done, w.target = t->slot_free; break;
	case STEP_POSTS: w.word = &t->posts[0].key, w.target = t->key; break;
	case STEP_SYNC1: w.word = &t->posts[0].progress, w.target = DFCCL_PROGRESS(t->key, 1); break;
	case STEP_FINISH: w.word = &t->posts[0].done, w.target = t->key; break;
	case STEP_BOX_FREE:
	case STEP_BOX_WANT: w.word = &t->box->ack, w.n = 1, w.target = t->slot_free; break;
	case STEP_BOX_ACK: w.word = &t->box->ack, w.n = 1, w.target = t->key; break;
	case STEP_AWAIT: {
		const struct algo_step *p = &t->cur;
		w.word = &t->posts[0].progress, w.n = p->nwait, w.listed = 1;
		for (uint32_t k = 0; k < p->nwait; k++)
			w.rankv[k] = p->wait[k], w.targetv[k] = DFCCL_PROGRESS(t->key, p->phase[k]);
		break;
	}
	default: /* STEP_BOX_KEY */ w.word = &t->box->key, w.n = 1, w.target = t->key; break;
	}
	return w;
}

static int coll_ready(struct host_task *t, const struct coll_cond *w)
{
	for (uint32_t r = t->wait_rank; r < w->n; r++) {
		uint32_t rank = w->listed ? w->rankv[r] : r;
		if (load_acq(w->word + rank * w->stride) < (w->listed ? w->targetv[r] : w->target)) {
			t->wait_rank = r;
			return 0;
		}
	}
	t->wait_rank = 0;
	return 1;
}

/*
 * Two-phase blocking: polls the wait of t's step up to its threshold.
 * Returns 1 when the peers are ready, 0 when the task is preempted, or
 * -status when its communicator was aborted.
 */
static int coll_wait(const struct host_coll_env *env, struct host_task *t, uint32_t position, struct sched_state *s)
{
	struct coll_cond w = coll_cond_of(t);
	int drain = t->step == STEP_FINISH || t->step == STEP_BOX_ACK;
	uint32_t threshold = drain ? sched_threshold_drain(env->params) : sched_threshold(env->params, position, s);
	if (t->idle > HOST_IDLE_GRACE)
		threshold = 1;
	uint64_t spins = 0;  /* polls made */
	uint64_t spent = 0;  /* against the threshold: polls, or the time since t0 in polls if more */
	uint64_t t0 = 0;     /* read at the first look at the clock */
	int rc;
	for (;;) {
		uint32_t ab = host_comm_aborted(t->comm);
		if (ab) {
			rc = -(int)ab;
			break;
		}
		if (coll_ready(t, &w)) {
			rc = 1;
			break;
		}
		/* A rank this engine hosts can only move when this engine runs
		 * its task: spinning on it would just burn the threshold. A
		 * receive waiting to store `want` waits for this very rank. */
		uint32_t blocker = w.listed               ? w.rankv[t->wait_rank]
		                   : t->step == STEP_BOX_WANT ? t->rank
		                   : w.n == 1                 ? t->peer
		                                              : t->wait_rank;
		if (spent >= threshold || t->comm->members[blocker].device == env->device) {
			rc = 0;
			break;
		}
		spins++;
		spent++;
		if (spins % HOST_NAP_POLLS != 0) {
			cpu_relax();
			continue;
		}
		uint64_t now = engine_now_ns();
		if (!t0)
			t0 = now;
		else if (now - t0 >= HOST_SPIN_NS) {
			env->nap();
			now = engine_now_ns();
		}
		if ((now - t0) / HOST_POLL_NS > spent)
			spent = (now - t0) / HOST_POLL_NS;
	}
	/* One shared-page update per wait, not per poll. */
	if (spins)
		atomic_fetch_add_explicit(A64(&env->stats->spins), spins, memory_order_relaxed);
	if (rc == 0) {
		atomic_fetch_add_explicit(A64(&env->stats->preemptions), 1, memory_order_relaxed);
		sched_on_preempt(s);
	} else if (rc == 1) {
		sched_on_progress(env->params, s);
	}
	return rc;
}

/* ------------------------------------------------------------------ posts */

/* What every rank's entry of the instance must agree on, besides the count
 * and the root. */
static uint32_t coll_shape(const struct host_task *t)
{
	return DFCCL_POST_SHAPE(t->opcode, t->dtype, t->redop, t->algo);
}

static void coll_post(struct host_task *t)
{
	struct dfccl_rank_post *p = &t->posts[t->rank];
	p->send_off = t->send_off;
	p->recv_off = t->recv_off;
	p->count = t->count;
	p->send_reg = t->send_reg;
	p->recv_reg = t->recv_reg;
	p->shape = coll_shape(t);
	p->root = coll_has_root(t->opcode) ? t->peer : 0;
	/* The progress word keeps the low 40 bits of the key: a word left by an
	 * older instance of this slot could compare above this instance's
	 * targets once keys pass 2^40. Starting it afresh before the key is
	 * published means a peer that saw our key sees only this instance's
	 * progress. */
	store_rel(&p->progress, DFCCL_PROGRESS(t->key, 0));
	store_rel(&p->key, t->key);
}

static void box_post(struct host_task *t)
{
	struct dfccl_p2p_box *b = t->box;
	b->send_off = t->send_off;
	b->count = t->count;
	b->send_reg = t->send_reg;
	b->dtype = t->dtype;
	store_rel(&b->key, t->key);
}

/* Every rank's buffers, as this process maps them. */
struct coll_bufs {
	char *send[DFCCL_COMM_MAX_RANKS];
	char *recv[DFCCL_COMM_MAX_RANKS];
	char *conn[DFCCL_COMM_MAX_RANKS]; /* ring and trees: the connectors of the instance's slot */
};

/*
 * Resolves the buffers of the task's instance, from the posts (collectives)
 * or from the mailbox and the task (receive). Runs on every visit that
 * moves data, so a registration dropped since the last visit is noticed
 * before it is touched. Returns DFCCL_CQ_OK or the status to fail with.
 */
static uint32_t coll_bufs_get(const struct host_coll_env *env, const struct host_task *t, struct coll_bufs *b)
{
	const struct host_comm *c = t->comm;
	uint32_t n = c->nranks;
	uint64_t sbytes, rbytes;
	uint32_t st;
	if (t->opcode == DFCCL_OP_RECV) {
		const struct dfccl_p2p_box *x = t->box;
		if (load_acq(&x->key) != t->key || x->count != t->count || x->dtype != t->dtype)
			return DFCCL_CQ_BAD_ENTRY;
		uint64_t bytes = t->count * t->dsize;
		st = coll_resolve(env, x->send_reg, c->members[t->peer].session_id, x->send_off, bytes, &b->send[0]);
		if (st == DFCCL_CQ_OK)
			st = coll_resolve(env, t->recv_reg, t->q->session_id, t->recv_off, bytes, &b->recv[0]);
		return st;
	}
	for (uint32_t r = 0; r < n; r++) {
		const struct dfccl_rank_post *p = &t->posts[r];
		/* A post of another instance means a broken protocol; another
		 * count, operation, type, root or algorithm means the ranks
		 * disagree about this collective: nothing sensible can be done. */
		if (load_acq(&p->key) != t->key)
			return DFCCL_CQ_BAD_ENTRY;
		if (p->count != t->count || p->shape != coll_shape(t) ||
		    p->root != (coll_has_root(t->opcode) ? t->peer : 0))
			return DFCCL_CQ_MISMATCH;
		if (coll_sizes(t->opcode, t->count, t->dsize, n, r == t->peer, &sbytes, &rbytes) < 0)
			return DFCCL_CQ_OUT_OF_RANGE;
		uint64_t session = c->members[r].session_id;
		st = coll_resolve(env, p->send_reg, session, p->send_off, sbytes, &b->send[r]);
		if (st == DFCCL_CQ_OK)
			st = coll_resolve(env, p->recv_reg, session, p->recv_off, rbytes, &b->recv[r]);
		if (st != DFCCL_CQ_OK)
			return st;
		if (t->algo != DFCCL_ALGO_DIRECT)
			b->conn[r] = dfccl_comm_conn(c->hdr, n, t->conn_slot, r);
	}
	return DFCCL_CQ_OK;
}

/* ------------------------------------------------------------------ data */

/* First element of the two-shot all-reduce's chunk i (of n over count). */
static uint64_t chunk_lo(const struct host_task *t, uint32_t i)
{
	return (uint64_t)i * t->count / t->comm->nranks;
}

/* The rank whose allreduce chunk holds element i. */
static uint32_t chunk_owner(const struct host_task *t, uint64_t i)
{
	uint32_t n = t->comm->nranks;
	uint32_t o = (uint32_t)(i * n / t->count);
	while (o + 1 < n && chunk_lo(t, o + 1) <= i)
		o++;
	while (chunk_lo(t, o) > i)
		o--;
	return o;
}

static void copy_elems(char *dst, const char *src, uint64_t elems, uint32_t dsize)
{
	/* In-place ranks name the same bytes as source and destination. */
	if (dst != src)
		memmove(dst, src, elems * dsize);
}

static void reduce_elems(const struct host_task *t, char *dst, char *const *srcs, uint64_t src_off, uint64_t elems)
{
	uint32_t n = t->comm->nranks;
	const void *at[DFCCL_COMM_MAX_RANKS];
	for (uint32_t r = 0; r < n; r++)
		at[r] = srcs[r] + src_off * t->dsize;
	reduce_into(dst, at, n, elems, t->dtype, t->redop, n);
}

/* The start of one of the buffers an algorithm step names. */
static char *step_buf(const struct coll_bufs *b, const struct algo_buf *x)
{
	switch (x->kind) {
	case ALGO_BUF_SEND: return b->send[x->rank];
	case ALGO_BUF_RECV: return b->recv[x->rank];
	default: return b->conn[x->rank];
	}
}

/* Elements of the current data step of t. */
static uint64_t work_total(const struct host_task *t)
{
	uint32_t n = t->comm->nranks;
	if (t->step == STEP_AWORK)
		return t->cur.nsrc ? t->cur.elems : 0;
	switch (t->opcode) {
	case DFCCL_OP_ALLREDUCE:
		return t->step == STEP_WORK1 ? chunk_lo(t, t->rank + 1) - chunk_lo(t, t->rank) : t->count;
	case DFCCL_OP_ALLGATHER: return t->count * n;
	case DFCCL_OP_REDUCE: return t->rank == t->peer ? t->count : 0;
	default: return t->count;
	}
}

/*
 * Does up to `max` elements of the current data step from element `pos`;
 * returns how many elements it moved past (some steps skip whole ranges)
 * and the bytes it wrote in *bytes.
 */
static uint64_t work_piece(const struct host_task *t, const struct coll_bufs *b, uint64_t pos, uint64_t max,
                           uint64_t *bytes)
{
	uint32_t r = t->rank, ds = t->dsize;
	uint64_t m = max, lo;
	*bytes = 0;
	if (t->step == STEP_AWORK) {
		const struct algo_step *p = &t->cur;
		const void *at[ALGO_MAX_SRC];
		for (uint32_t k = 0; k < p->nsrc; k++)
			at[k] = step_buf(b, &p->src[k]) + (p->src[k].off + pos) * ds;
		char *dst = step_buf(b, &p->dst) + (p->dst.off + pos) * ds;
		if (p->reduce && (p->nsrc > 1 || p->redop == REDUCE_AVG))
			reduce_into(dst, at, p->nsrc, m, t->dtype, p->redop, t->comm->nranks);
		else
			copy_elems(dst, at[0], m, ds);
		*bytes = m * ds;
		return m;
	}
	switch (t->opcode) {
	case DFCCL_OP_ALLREDUCE:
		if (t->step == STEP_WORK1) {
			lo = chunk_lo(t, r) + pos;
			reduce_elems(t, b->recv[r] + lo * ds, b->send, lo, m);
			break;
		}
		uint32_t o = chunk_owner(t, pos);
		uint64_t end = chunk_lo(t, o + 1);
		if (m > end - pos)
			m = end - pos;
		if (o == r)
			return m; /* our own chunk is final since phase 1 */
		copy_elems(b->recv[r] + pos * ds, b->recv[o] + pos * ds, m, ds);
		break;
	case DFCCL_OP_ALLGATHER: {
		uint64_t s = pos / t->count, i = pos % t->count;
		if (m > t->count - i)
			m = t->count - i;
		copy_elems(b->recv[r] + (s * t->count + i) * ds, b->send[s] + i * ds, m, ds);
		break;
	}
	case DFCCL_OP_REDUCESCATTER:
		reduce_elems(t, b->recv[r] + pos * ds, b->send, (uint64_t)r * t->count + pos, m);
		break;
	case DFCCL_OP_BROADCAST:
		copy_elems(b->recv[r] + pos * ds, b->send[t->peer] + pos * ds, m, ds);
		break;
	case DFCCL_OP_REDUCE:
		reduce_elems(t, b->recv[r] + pos * ds, b->send, pos, m);
		break;
	default: /* DFCCL_OP_RECV */
		copy_elems(b->recv[0] + pos * ds, b->send[0] + pos * ds, m, ds);
		break;
	}
	*bytes = m * ds;
	return m;
}

/*
 * Runs the current data step from t->pos. Returns 1 when the step is
 * finished, 0 when the visit's byte budget ran out first (t->pos records
 * where to resume), or -status when a buffer cannot be resolved.
 */
static int coll_work(const struct host_coll_env *env, struct host_task *t)
{
	uint64_t total = work_total(t);
	if (t->pos >= total)
		return 1;
	if (t->step == STEP_AWORK && !algo_step_ok(t))
		return -(int)DFCCL_CQ_BAD_ENTRY;
	struct coll_bufs b;
	uint32_t st = coll_bufs_get(env, t, &b);
	if (st != DFCCL_CQ_OK)
		return -(int)st;
	/* At least one piece per visit, so any budget makes progress. */
	uint64_t budget = env->visit_bytes;
	uint64_t piece = budget / t->dsize ? budget / t->dsize : 1;
	do {
		uint64_t bytes;
		uint64_t m = total - t->pos < piece ? total - t->pos : piece;
		t->pos += work_piece(t, &b, t->pos, m, &bytes);
		budget = bytes < budget ? budget - bytes : 0;
	} while (t->pos < total && budget > 0);
	return t->pos >= total;
}

/* ------------------------------------------------------------------ steps */

/*
 * A registered collective's instance slot is one of 1024; connector pages
 * it touched would otherwise stay resident for the communicator's life.
 * Once every rank is done (nobody reads our connector any more), a task
 * whose algorithm staged data there gives the pages back (MADV_REMOVE
 * punches them out of the region's memfd; the next user faults in zeros).
 * The 32 NCCL-style slots stay warm: they are reused all the time.
 */
static void conn_release(const struct host_task *t)
{
	if (t->algo == DFCCL_ALGO_DIRECT || t->conn_slot < DFCCL_COMM_SLOTS ||
	    (t->opcode != DFCCL_OP_REDUCE && t->opcode != DFCCL_OP_REDUCESCATTER))
		return;
	(void)madvise(dfccl_comm_conn(t->comm->hdr, t->comm->nranks, t->conn_slot, t->rank), DFCCL_COMM_CONN_BYTES,
	              MADV_REMOVE);
}

static enum host_step coll_done(struct host_task *t, uint32_t status)
{
	t->status = status;
	return HOST_STEP_DONE;
}

/* The ranks disagree or a buffer went away: fail this task and, through
 * the region, every rank of the communicator. */
static enum host_step coll_fail(struct host_task *t, uint32_t status)
{
	host_comm_fail(t->comm, status);
	return coll_done(t, status);
}

/* Publishes a finished data step and returns the step after it. */
static uint32_t coll_after_work(struct host_task *t)
{
	if (t->step == STEP_AWORK) {
		store_rel(&t->posts[t->rank].progress, DFCCL_PROGRESS(t->key, t->astep + 1));
		if (t->astep + 1 < t->alg.nsteps) {
			algo_enter(t, t->astep + 1);
			return STEP_AWAIT;
		}
		store_rel(&t->posts[t->rank].done, t->key);
		return STEP_FINISH;
	}
	if (t->opcode == DFCCL_OP_ALLREDUCE && t->step == STEP_WORK1) {
		store_rel(&t->posts[t->rank].progress, DFCCL_PROGRESS(t->key, 1));
		return STEP_SYNC1;
	}
	store_rel(&t->posts[t->rank].done, t->key);
	return STEP_FINISH;
}

enum host_step host_coll_step(const struct host_coll_env *env, struct host_task *t, uint32_t position,
                              struct sched_state *s)
{
	int progressed = 0;
	for (;;) {
		int rc;
		uint32_t st;
		switch (t->step) {
		case STEP_WORK1:
		case STEP_WORK2:
		case STEP_AWORK:
			rc = coll_work(env, t);
			if (rc < 0)
				return coll_fail(t, (uint32_t)-rc);
			if (rc == 0)
				return HOST_STEP_PROGRESS; /* budget spent: let the others run */
			t->pos = 0;
			if (t->opcode == DFCCL_OP_RECV) {
				/* The sender's buffer is read: acknowledging frees it, and
				 * nobody reads ours, so the receiver is done. */
				store_rel(&t->box->ack, t->key);
				return coll_done(t, DFCCL_CQ_OK);
			}
			t->step = coll_after_work(t);
			progressed = 1;
			continue;
		default:
			break;
		}
		/* Every other step starts with a wait on peers. */
		if (t->step == STEP_AWAIT && !algo_step_ok(t))
			return coll_fail(t, DFCCL_CQ_BAD_ENTRY);
		rc = coll_wait(env, t, position, s);
		if (rc < 0)
			return coll_done(t, (uint32_t)-rc);
		if (rc == 0)
			return progressed ? HOST_STEP_PROGRESS : HOST_STEP_BLOCKED;
		progressed = 1;
		switch (t->step) {
		case STEP_SLOT:
			coll_post(t);
			t->step = STEP_POSTS;
			break;
		case STEP_POSTS:
		case STEP_BOX_KEY: {
			/* Check what the peers posted before anything is moved, even
			 * when there is nothing to move. */
			struct coll_bufs b;
			st = coll_bufs_get(env, t, &b);
			if (st != DFCCL_CQ_OK)
				return coll_fail(t, st);
			t->step = t->algo != DFCCL_ALGO_DIRECT && t->step == STEP_POSTS ? STEP_AWAIT : STEP_WORK1;
			break;
		}
		case STEP_SYNC1:
			t->step = STEP_WORK2;
			break;
		case STEP_AWAIT:
			t->step = STEP_AWORK;
			break;
		case STEP_BOX_FREE:
			box_post(t);
			t->step = STEP_BOX_ACK;
			break;
		case STEP_BOX_WANT:
			store_rel(&t->box->want, t->key);
			t->step = STEP_BOX_KEY;
			break;
		default: /* STEP_FINISH, STEP_BOX_ACK */
			if (t->step == STEP_FINISH)
				conn_release(t);
			return coll_done(t, DFCCL_CQ_OK);
		}
	}
}
