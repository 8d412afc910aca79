/*
 * See watch.h. Every read of shared memory here is a relaxed or acquire
 * load of a word somebody else writes; a submission entry is copied before
 * any field of it is used, and nothing read is trusted beyond choosing what
 * to report: a client that scribbles on its queue can only confuse its own
 * records.
 *
 * Per queue pair the watcher keeps a cursor, the lowest queue sequence
 * number it has not yet seen completed; each tick it reads the entries from
 * there to the tail (at most one queue's worth), so an entry is seen on
 * every tick while it is pending and once after it ends.
 */
#include "watch.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "comm.h"
#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "log.h"
#include "queue.h"
#include "recorder.h"
#include "server.h"
#include "session.h"
#include "sq.h"
#include "workers.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x
#define WATCH_MAX_ADVANCE 1000000u /* keys one tick may pass, so a garbage word cannot stall it */

struct watch_qp {
	struct watch_qp *next;
	uint32_t qp_id;
	uint64_t low; /* lowest queue sequence not yet seen completed */
	int seen;
};

/* The instances the watcher times: an NCCL-style collective (key: its
 * sequence number), a run of a registered collective (key: the run number
 * of coll_id), a message from one rank to another (key: the n-th message
 * from src to dst). */
enum inst_kind { INST_COLL, INST_REG, INST_P2P };

/* One instance being timed: of its kind and id, the lowest one unfinished. */
struct watch_inst {
	uint8_t kind;      /* enum inst_kind */
	uint32_t coll_id;  /* INST_REG */
	uint32_t src, dst; /* INST_P2P: sender and receiver */
	uint64_t key;      /* the instance timed; 0: none */
	uint64_t first_ms, change_ms, sig;
	uint64_t preempt_base; /* the devices' preemptions when key was first seen */
	/* The instance as its entries or posts describe it. */
	uint8_t op, dtype;
	uint64_t count;
	/* This tick: the lowest key of this kind and id pending in some
	 * rank's queue (0: none), the ranks whose entry for it is pending
	 * (bit r), and what such an entry says. */
	uint64_t tick_key, queued;
	uint8_t tick_op, tick_dtype;
	uint64_t tick_count;
};

#define WATCH_REG_IDS DFCCL_COMM_MAX_COLLS /* extra_at: registered ids first, then ordered pairs */

/* What the watcher knows of one ready communicator. */
struct watch_comm {
	struct watch_comm *next;
	uint64_t comm_id;
	int seen;
	uint64_t low;     /* lowest NCCL-style key some rank has not finished */
	struct watch_inst coll; /* the NCCL-style instance `low`, once some rank submitted it */
	/* Per rank, this tick: the lowest NCCL-style key pending in its queue
	 * (0: none), and what that entry says. */
	uint64_t pend_key[DFCCL_COMM_MAX_RANKS];
	uint8_t pend_op[DFCCL_COMM_MAX_RANKS], pend_dtype[DFCCL_COMM_MAX_RANKS];
	uint64_t pend_count[DFCCL_COMM_MAX_RANKS];
	/* Registered collectives and messages with an entry pending: one
	 * instance per registered id and per ordered pair of ranks, found
	 * through extra_at (index + 1 in extra, 0: none; WATCH_REG_IDS +
	 * nranks * nranks places, allocated with the first one). */
	struct watch_inst *extra;
	uint32_t nextra, extra_cap;
	uint32_t *extra_at;
	uint32_t nranks;
};

_Static_assert(DFCCL_COMM_MAX_RANKS <= 64, "the watcher keeps ranks in 64-bit masks");

struct watch {
	struct server *srv;
	uv_timer_t timer;
	int running;
	struct watch_qp *qps;
	struct watch_comm *comms;
	struct recorder_table rec;
};

static uint64_t ld64(const uint64_t *p)
{
	return atomic_load_explicit((_Atomic uint64_t *)p, memory_order_acquire);
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint32_t watch_interval_ms(const struct watch *w)
{
	return (uint32_t)w->srv->cfg.watch_interval_ms;
}

static void watch_on_timer(uv_timer_t *t)
{
	watch_tick(t->data);
}

int watch_new(struct server *srv, struct watch **out)
{
	struct watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->srv = srv;
	w->rec.cap = (uint32_t)srv->cfg.flight_recorder_entries;
	w->rec.keep = (uint32_t)srv->cfg.flight_recorder_keep;
	uv_timer_init(srv->loop, &w->timer);
	w->timer.data = w;
	*out = w;
	return 0;
}

void watch_comm_ready(struct watch *w)
{
	if (!w || w->running)
		return;
	w->running = 1;
	uint64_t ms = watch_interval_ms(w);
	uv_timer_start(&w->timer, watch_on_timer, ms, ms);
}

static void wc_free(struct watch_comm *c)
{
	if (!c)
		return;
	free(c->extra);
	free(c->extra_at);
	free(c);
}

static void watch_closed(uv_handle_t *h)
{
	struct watch *w = h->data;
	while (w->qps) {
		struct watch_qp *q = w->qps;
		w->qps = q->next;
		free(q);
	}
	while (w->comms) {
		struct watch_comm *c = w->comms;
		w->comms = c->next;
		wc_free(c);
	}
	recorder_table_free(&w->rec);
	free(w);
}

void watch_close(struct watch *w)
{
	if (!w)
		return;
	uv_timer_stop(&w->timer);
	uv_close((uv_handle_t *)&w->timer, watch_closed);
}

struct recorder *watch_recorder(struct watch *w, uint64_t comm_id)
{
	return recorder_find(&w->rec, comm_id);
}

/* ------------------------------------------------------------ bookkeeping */

static struct watch_qp *wqp_get(struct watch *w, uint32_t qp_id)
{
	for (struct watch_qp *q = w->qps; q; q = q->next)
		if (q->qp_id == qp_id)
			return q;
	struct watch_qp *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->qp_id = qp_id;
	q->low = 1;
	q->next = w->qps;
	w->qps = q;
	return q;
}

static struct watch_comm *wc_find(struct watch *w, uint64_t comm_id)
{
	for (struct watch_comm *c = w->comms; c; c = c->next)
		if (c->comm_id == comm_id)
			return c;
	return NULL;
}

static struct watch_comm *wc_get(struct watch *w, const struct comm *cm)
{
	struct watch_comm *c = wc_find(w, cm->id);
	if (c)
		return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->comm_id = cm->id;
	c->nranks = cm->nranks;
	c->low = 1;
	c->next = w->comms;
	w->comms = c;
	return c;
}

/* Frees what was not seen this tick: queue pairs and communicators gone. */
static void watch_sweep(struct watch *w)
{
	for (struct watch_qp **pp = &w->qps; *pp;) {
		struct watch_qp *q = *pp;
		if (!q->seen) {
			*pp = q->next;
			free(q);
		} else {
			q->seen = 0;
			pp = &q->next;
		}
	}
	for (struct watch_comm **pp = &w->comms; *pp;) {
		struct watch_comm *c = *pp;
		if (!c->seen) {
			*pp = c->next;
			wc_free(c);
		} else {
			c->seen = 0;
			pp = &c->next;
		}
	}
}

static int comm_is_live(void *arg, uint64_t comm_id)
{
	return comm_find(arg, comm_id) != NULL;
}

/* Whether the watcher samples c: it has a region and is past init. */
static int comm_watched(const struct comm *c)
{
	return c->region && c->state != COMM_INITIALIZING && !comm_setting_up(c);
}

static int op_is_coll(uint32_t opcode)
{
	return opcode >= DFCCL_OP_ALLREDUCE && opcode <= DFCCL_OP_REDUCE;
}

/* ------------------------------------------------------------ queue pairs */

/* The instance of wc for a registered collective (kind INST_REG, id
 * coll_id) or an ordered pair of ranks (INST_P2P, src -> dst), created
 * when it is new; NULL when memory is short. */
static struct watch_inst *extra_get(struct watch_comm *wc, uint8_t kind, uint32_t coll_id, uint32_t src, uint32_t dst)
{
	uint32_t id = kind == INST_REG ? coll_id : WATCH_REG_IDS + src * wc->nranks + dst;
	if (!wc->extra_at) {
		wc->extra_at = calloc(WATCH_REG_IDS + (size_t)wc->nranks * wc->nranks, sizeof(*wc->extra_at));
		if (!wc->extra_at)
			return NULL;
	}
	if (wc->extra_at[id])
		return &wc->extra[wc->extra_at[id] - 1];
	if (wc->nextra == wc->extra_cap) {
		uint32_t cap = wc->extra_cap ? 2 * wc->extra_cap : 8;
		struct watch_inst *x = realloc(wc->extra, cap * sizeof(*x));
		if (!x)
			return NULL;
		wc->extra = x;
		wc->extra_cap = cap;
	}
	struct watch_inst *x = &wc->extra[wc->nextra++];
	*x = (struct watch_inst){.kind = kind, .coll_id = coll_id, .src = src, .dst = dst};
	wc->extra_at[id] = wc->nextra;
	return x;
}

static uint32_t extra_id(const struct watch_comm *wc, const struct watch_inst *x)
{
	return x->kind == INST_REG ? x->coll_id : WATCH_REG_IDS + x->src * wc->nranks + x->dst;
}

/* Drops wc's instance i (nothing of it is pending any more). */
static void extra_remove(struct watch_comm *wc, uint32_t i)
{
	wc->extra_at[extra_id(wc, &wc->extra[i])] = 0;
	if (i + 1 < wc->nextra) {
		wc->extra[i] = wc->extra[wc->nextra - 1];
		wc->extra_at[extra_id(wc, &wc->extra[i])] = i + 1;
	}
	wc->nextra--;
}

/* A pending entry of rank `rank` for x: x's lowest pending key this tick
 * and who has it pending (a send describes a message before its receive). */
static void inst_note(struct watch_inst *x, uint32_t rank, const struct dfccl_sqe *e)
{
	if (x->tick_key && e->comm_seq > x->tick_key)
		return;
	if (!x->tick_key || e->comm_seq < x->tick_key) {
		x->tick_key = e->comm_seq;
		x->queued = 0;
	}
	if (!x->queued || e->opcode == DFCCL_OP_SEND) {
		x->tick_op = e->opcode;
		x->tick_dtype = e->dtype;
		x->tick_count = e->count;
	}
	x->queued |= 1ull << rank;
}

/* A pending registered run or message of rank e->rank, into its instance. */
static void watch_entry_extra(struct watch_comm *wc, const struct dfccl_sqe *e)
{
	struct watch_inst *x = NULL;
	if (e->comm_seq == 0)
		return;
	if (e->flags & DFCCL_SQE_F_REGISTERED) {
		if (op_is_coll(e->opcode) && e->coll_id < DFCCL_COMM_MAX_COLLS)
			x = extra_get(wc, INST_REG, e->coll_id, 0, 0);
	} else if ((e->opcode == DFCCL_OP_SEND || e->opcode == DFCCL_OP_RECV) && e->peer < wc->nranks &&
	           e->peer != e->rank) {
		int sending = e->opcode == DFCCL_OP_SEND;
		x = extra_get(wc, INST_P2P, 0, sending ? e->rank : e->peer, sending ? e->peer : e->rank);
	}
	if (x)
		inst_note(x, e->rank, e);
}

/* One submission entry of session s: into its communicator's recorder and,
 * when pending (and not a group's last that waits for the group:
 * sq_group_waits; its own rank may well be past it, and what its ranks
 * wait for is the earlier entry, watched itself), into what its rank has
 * pending. */
static void watch_entry(struct watch *w, const struct session *s, uint32_t qp_id, uint64_t seq,
                        const struct dfccl_sqe *e, uint64_t cw, uint64_t now, bool waits)
{
	struct comm *c = comm_find(w->srv, e->comm_id);
	if (!c || !comm_watched(c) || e->rank >= c->nranks || c->members[e->rank].session != s)
		return;
	int done = DFCCL_CW_SEQ(cw) >= seq;
	struct recorder *r = recorder_get(&w->rec, c);
	struct rec_entry *x = r ? recorder_note(r, e->rank, qp_id, seq, e, now) : NULL;
	if (x && done && !x->ended) {
		x->ended = 1;
		x->status = DFCCL_CW_SEQ(cw) == seq ? DFCCL_CW_STATUS(cw) : DFCCL_CQ_STATUS_COUNT_;
		x->end_ms = recorder_rel(r, now);
	}
	struct watch_comm *wc = wc_find(w, c->id);
	if (done || waits || !wc)
		return;
	if (!op_is_coll(e->opcode) || (e->flags & DFCCL_SQE_F_REGISTERED)) {
		watch_entry_extra(wc, e);
		return;
	}
	uint32_t k = e->rank;
	if (wc->pend_key[k] == 0 || e->comm_seq < wc->pend_key[k]) {
		wc->pend_key[k] = e->comm_seq;
		wc->pend_op[k] = e->opcode;
		wc->pend_dtype[k] = e->dtype;
		wc->pend_count[k] = e->count;
	}
}

static void watch_qp_scan(struct watch *w, const struct session *s, uint32_t device, uint64_t now)
{
	struct dfccl_qp_header *h;
	uint32_t n;
	uint32_t qp_id = s->qp_ids[device];
	if (workers_qp_view(w->srv->workers, device, qp_id, &h, &n) < 0)
		return;
	struct watch_qp *q = wqp_get(w, qp_id);
	if (!q)
		return;
	q->seen = 1;
	const struct dfccl_sqe *sq = (const struct dfccl_sqe *)((const char *)h + DFCCL_QP_SQ_OFFSET);
	const uint64_t *cws = (const uint64_t *)((const char *)h + DFCCL_QP_CW_OFFSET(n));
	uint64_t tail = ld64(&h->sq_tail);
	uint64_t from = q->low;
	if (tail >= n && from < tail - n + 1) {
		/* Entries came and went between two ticks (or the client wrote
		 * garbage into its tail): those are not recorded. */
		from = tail - n + 1;
	}
	uint64_t low = 0;
	for (uint64_t seq = from; seq <= tail && seq - from < n; seq++) {
		uint32_t slot = DFCCL_QP_SLOT(seq, n);
		struct dfccl_sqe e;
		uint64_t arm = ld64(&sq[slot].arm);
		memcpy(&e, (const char *)&sq[slot], sizeof(e));
		uint64_t cw = ld64(&cws[slot]);
		if (arm != seq || e.seq != seq || e.comm_id == 0) {
			/* Not armed yet (or a NOP probe that names no communicator). */
			if (arm != seq && !low)
				low = seq;
			continue;
		}
		bool waits = DFCCL_CW_SEQ(cw) < seq && sq_group_waits(&e, seq, n, sq, cws);
		watch_entry(w, s, qp_id, seq, &e, cw, now, waits);
		if (DFCCL_CW_SEQ(cw) < seq && !low)
			low = seq;
	}
	q->low = low ? low : tail + 1;
}

/* ------------------------------------------------------------ heartbeats */

int64_t watch_heartbeat_age_ms(struct watch *w, const struct session *s, int *stopped)
{
	uint64_t newest = 0;
	for (uint32_t d = 0; d < SESSION_MAX_DEVICES; d++) {
		struct dfccl_qp_header *h;
		uint32_t n;
		if (s->qp_ids[d] && workers_qp_view(w->srv->workers, d, s->qp_ids[d], &h, &n) == 0) {
			uint64_t hb = ld64(&h->client_heartbeat_ns);
			if (hb > newest)
				newest = hb;
		}
	}
	if (stopped)
		*stopped = 0;
	if (!newest)
		return -1;
	uint64_t now = mono_ns();
	int64_t age = now > newest ? (int64_t)((now - newest) / 1000000u) : 0;
	if (stopped)
		*stopped = age >= w->srv->cfg.heartbeat_stale_ms;
	return age;
}

/* ------------------------------------------------------------ communicators */

enum rank_state { RS_MISSING, RS_QUEUED, RS_POSTED, RS_FINISHED, RS_LEFT };

static const char *rank_state_name(enum rank_state st)
{
	static const char *const names[] = {"missing", "queued", "posted", "finished", "left"};
	return names[st];
}

/* Whether rank r takes part in instance x: every rank, or the two ends
 * of a message. */
static int inst_involves(const struct watch_inst *x, uint32_t r)
{
	return x->kind != INST_P2P || r == x->src || r == x->dst;
}

/* The post of rank r for collective instance x (INST_COLL, INST_REG). */
static const struct dfccl_rank_post *inst_post(const struct comm *c, const struct watch_inst *x, uint32_t r)
{
	if (x->kind == INST_REG)
		return dfccl_comm_reg_post(c->region, c->nranks, x->coll_id, x->key, r);
	return dfccl_comm_post(c->region, c->nranks, x->key, r);
}

static const struct dfccl_p2p_box *inst_box(const struct comm *c, const struct watch_inst *x)
{
	return dfccl_comm_box(c->region, c->nranks, x->src, x->dst, x->key);
}

static enum rank_state inst_rank_state(const struct comm *c, const struct watch_inst *x, uint32_t r)
{
	if (c->members[r].state != MEMBER_ACTIVE)
		return RS_LEFT;
	if (x->kind == INST_P2P) {
		/* The receiver's acknowledgement finishes the message for both. */
		const struct dfccl_p2p_box *b = inst_box(c, x);
		if (ld64(&b->ack) >= x->key)
			return RS_FINISHED;
		if ((r == x->src && ld64(&b->key) == x->key) || (r == x->dst && ld64(&b->want) == x->key))
			return RS_POSTED;
	} else {
		const struct dfccl_rank_post *p = inst_post(c, x, r);
		if (ld64(&p->done) >= x->key)
			return RS_FINISHED;
		if (ld64(&p->key) == x->key)
			return RS_POSTED;
	}
	return (x->queued >> r) & 1 ? RS_QUEUED : RS_MISSING;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
	return (h ^ v) * 0x100000001b3ull;
}

/* A digest of everything that moves while the instance makes progress:
 * which ranks have its entry queued, and for a collective each rank's
 * post, progress and done words and its channel words (the CUDA engine's
 * progress), for a message its mailbox's key, want and acknowledgement. */
static uint64_t inst_sig(const struct comm *c, const struct watch_inst *x)
{
	uint64_t h = mix(0xcbf29ce484222325ull, x->queued);
	if (x->kind == INST_P2P) {
		const struct dfccl_p2p_box *b = inst_box(c, x);
		return mix(mix(mix(h, ld64(&b->key)), ld64(&b->want)), ld64(&b->ack));
	}
	uint32_t slot = x->kind == INST_REG ? dfccl_comm_reg_conn_slot(x->coll_id, x->key) : dfccl_comm_conn_slot(x->key);
	for (uint32_t r = 0; r < c->nranks; r++) {
		const struct dfccl_rank_post *p = inst_post(c, x, r);
		h = mix(h, ld64(&p->key));
		h = mix(h, ld64(&p->progress));
		h = mix(h, ld64(&p->done));
		for (uint32_t ch = 0; ch < DFCCL_COMM_MAX_CHANNELS; ch++)
			h = mix(h, ld64(dfccl_comm_chan(c->region, c->nranks, slot, r, ch)));
	}
	return h;
}

static uint64_t comm_preemptions(struct watch *w, const struct comm *c)
{
	uint64_t sum = 0;
	for (uint32_t d = 0; d < 64; d++)
		if (c->devices & (1ull << d))
			sum += workers_preemptions(w->srv->workers, d);
	return sum;
}

/* Operation, count and type of the instance: from a collective's post,
 * else from an entry still in a queue. */
static void inst_describe(const struct comm *c, struct watch_inst *x)
{
	for (uint32_t r = 0; x->kind != INST_P2P && r < c->nranks; r++) {
		const struct dfccl_rank_post *p = inst_post(c, x, r);
		if (ld64(&p->key) == x->key) {
			uint32_t shape = p->shape;
			x->op = (uint8_t)(shape & 0xff);
			x->dtype = (uint8_t)((shape >> 8) & 0xff);
			x->count = p->count;
			return;
		}
	}
	if (x->queued) {
		x->op = x->tick_op;
		x->dtype = x->tick_dtype;
		x->count = x->tick_count;
	}
}

/* Instance x is `key` this tick: a new instance starts its clock (and
 * its count from `preempt`, the devices' preemptions now), an old one
 * restarts it whenever anything about it moved. */
static void inst_update(const struct comm *c, struct watch_inst *x, uint64_t key, uint64_t now, uint64_t preempt)
{
	if (x->key != key) {
		x->key = key;
		x->first_ms = x->change_ms = now;
		x->preempt_base = preempt;
		x->sig = inst_sig(c, x);
		inst_describe(c, x);
		return;
	}
	uint64_t sig = inst_sig(c, x);
	if (sig != x->sig) {
		x->sig = sig;
		x->change_ms = now;
		inst_describe(c, x);
	}
}

/* Start times and algorithms of the posted, unfinished instances. */
static void record_starts(struct watch *w, const struct comm *c, const struct watch_comm *wc, uint64_t now)
{
	struct recorder *r = recorder_find(&w->rec, c->id);
	if (!r)
		return;
	for (uint64_t key = wc->low; key < wc->low + DFCCL_COMM_SLOTS; key++) {
		for (uint32_t k = 0; k < c->nranks; k++) {
			const struct dfccl_rank_post *p = dfccl_comm_post(c->region, c->nranks, key, k);
			if (ld64(&p->key) != key)
				continue;
			struct rec_entry *x = recorder_find_coll(r, k, key);
			if (!x || x->start_ms >= 0)
				continue;
			x->start_ms = recorder_rel(r, now);
			x->algo = (uint8_t)DFCCL_POST_SHAPE_ALGO(p->shape);
		}
	}
}

/* Advances wc->low past the instances every rank finished. */
static void advance_low(const struct comm *c, struct watch_comm *wc)
{
	for (uint32_t steps = 0; steps < WATCH_MAX_ADVANCE; steps++) {
		for (uint32_t r = 0; r < c->nranks; r++)
			if (ld64(&dfccl_comm_post(c->region, c->nranks, wc->low, r)->done) < wc->low)
				return;
		wc->low++;
	}
}

/* Whether some rank submitted instance `key` (queued or posted or finished). */
static int instance_open(const struct comm *c, const struct watch_comm *wc, uint64_t key)
{
	for (uint32_t r = 0; r < c->nranks; r++) {
		const struct dfccl_rank_post *p = dfccl_comm_post(c->region, c->nranks, key, r);
		if (ld64(&p->key) == key || ld64(&p->done) >= key || wc->pend_key[r] == key)
			return 1;
	}
	return 0;
}

/* "rank 1 (pid 42, device 1, stopped: no heartbeat for 3.2 s)" into buf. */
static size_t describe_rank(struct watch *w, const struct comm *c, uint32_t r, char *buf, size_t len)
{
	const struct comm_member *m = &c->members[r];
	int stopped = 0;
	int64_t age = m->session ? watch_heartbeat_age_ms(w, m->session, &stopped) : -1;
	char hb[96];
	if (age < 0)
		snprintf(hb, sizeof(hb), "no heartbeat yet");
	else if (stopped)
		snprintf(hb, sizeof(hb), "stopped or hung: no heartbeat for %.1f s", (double)age / 1e3);
	else
		snprintf(hb, sizeof(hb), "running: heartbeat %.1f s ago", (double)age / 1e3);
	return (size_t)snprintf(buf, len, "%u (pid %d, device %u, %s)", r, (int)m->pid, m->device, hb);
}

/* What timed out, named for the error: "communicator 5: AllReduce #3
 * (1024 elements of float32)", "communicator 5: registered collective 7
 * (AllReduce) run #2 (...)", "communicator 5: Send #1 from rank 0 to rank 1
 * (...)" (or the Recv, when only the receiver submitted it); and in
 * `missing` how the ranks that never submitted it are introduced. */
static void inst_name(const struct comm *c, const struct watch_inst *x, char *buf, size_t len, char *missing,
                      size_t mlen, unsigned nmissing)
{
	char size[96];
	snprintf(size, sizeof(size), "(%" PRIu64 " elements of %s)", x->count, queue_dtype_name(x->dtype));
	snprintf(missing, mlen, "rank%s that never submitted it", nmissing == 1 ? "" : "s");
	if (x->kind == INST_REG) {
		snprintf(buf, len, "communicator %" PRIu64 ": registered collective %u (%s) run #%" PRIu64 " %s", c->id,
		         x->coll_id, queue_op_name(x->op), x->key, size);
	} else if (x->kind == INST_P2P && inst_rank_state(c, x, x->src) != RS_MISSING) {
		snprintf(buf, len, "communicator %" PRIu64 ": Send #%" PRIu64 " from rank %u to rank %u %s", c->id, x->key,
		         x->src, x->dst, size);
		snprintf(missing, mlen, "peer that never submitted the matching Recv");
	} else if (x->kind == INST_P2P) {
		snprintf(buf, len, "communicator %" PRIu64 ": Recv #%" PRIu64 " by rank %u from rank %u %s", c->id, x->key,
		         x->dst, x->src, size);
		snprintf(missing, mlen, "peer that never submitted the matching Send");
	} else {
		snprintf(buf, len, "communicator %" PRIu64 ": %s #%" PRIu64 " %s", c->id, queue_op_name(x->op), x->key,
		         size);
	}
}

static void timeout_fire(struct watch *w, struct comm *c, const struct watch_inst *x, uint64_t timeout, uint64_t now)
{
	char msg[1024], ranks[640] = ""; /* msg has room for what, who and ranks whole */
	size_t off = 0;
	unsigned missing = 0, shown = 0;
	for (uint32_t r = 0; r < c->nranks; r++) {
		if (!inst_involves(x, r) || inst_rank_state(c, x, r) != RS_MISSING)
			continue;
		missing++;
		if (off + 160 >= sizeof(ranks))
			continue;
		if (shown++)
			off += (size_t)snprintf(ranks + off, sizeof(ranks) - off, "; ");
		off += describe_rank(w, c, r, ranks + off, sizeof(ranks) - off);
	}
	if (missing > shown)
		snprintf(ranks + off, sizeof(ranks) - off, "; and %u more", missing - shown);
	char what[200], who[64];
	inst_name(c, x, what, sizeof(what), who, sizeof(who), missing);
	if (missing)
		snprintf(msg, sizeof(msg),
		         "%s timed out after %" PRIu64 " ms without progress (timeout %" PRIu64 " ms); %s: %s", what,
		         now - x->change_ms, timeout, who, ranks);
	else
		snprintf(msg, sizeof(msg),
		         "%s timed out: every rank submitted it, but it made no progress for %" PRIu64 " ms (timeout %" PRIu64
		         " ms); see dfcclctl stats and the daemon's log for its devices' workers",
		         what, now - x->change_ms, timeout);
	struct recorder *rec = recorder_get(&w->rec, c);
	comm_fail(c, COMM_TIMED_OUT, DFCCL_CQ_TIMEOUT, EC(TIMEOUT), msg);
	if (!rec)
		return;
	snprintf(rec->failure, sizeof(rec->failure), "%s", msg);
	snprintf(rec->state, sizeof(rec->state), "%s", comm_state_name(c->state));
	const char *dir = w->srv->cfg.flight_recorder_dir;
	if (!dir[0])
		return;
	char path[512];
	int rc = recorder_write(rec, watch_interval_ms(w), now, dir, path, sizeof(path));
	if (rc < 0)
		log_warn("watch", "communicator %" PRIu64 ": cannot write its flight recorder into %s: %s", c->id, dir,
		         strerror(-rc));
	else
		log_notice("watch", "communicator %" PRIu64 ": flight recorder written to %s", c->id, path);
}

/* The NCCL-style instance: the oldest one some rank submitted and not
 * every rank finished. */
static void coll_check(struct watch *w, const struct comm *c, struct watch_comm *wc, uint64_t now, uint64_t preempt)
{
	struct watch_inst *x = &wc->coll;
	advance_low(c, wc);
	record_starts(w, c, wc, now);
	if (!instance_open(c, wc, wc->low)) {
		x->key = 0;
		return;
	}
	x->queued = 0;
	for (uint32_t r = c->nranks; r-- > 0;) {
		if (wc->pend_key[r] != wc->low)
			continue;
		x->queued |= 1ull << r;
		x->tick_op = wc->pend_op[r];
		x->tick_dtype = wc->pend_dtype[r];
		x->tick_count = wc->pend_count[r];
	}
	inst_update(c, x, wc->low, now, preempt);
}

/* Registered runs and messages: each kind and id's lowest pending one;
 * what nobody has pending any more is dropped. */
static void extras_check(const struct comm *c, struct watch_comm *wc, uint64_t now, uint64_t preempt)
{
	for (uint32_t i = 0; i < wc->nextra;) {
		struct watch_inst *x = &wc->extra[i];
		if (!x->tick_key) {
			extra_remove(wc, i);
			continue;
		}
		inst_update(c, x, x->tick_key, now, preempt);
		i++;
	}
}

/* Times every instance of c; the one that went longest without progress,
 * once past the timeout, fails the communicator. */
static void watch_comm_check(struct watch *w, struct comm *c, struct watch_comm *wc, uint64_t now)
{
	uint64_t preempt = comm_preemptions(w, c);
	coll_check(w, c, wc, now, preempt);
	extras_check(c, wc, now, preempt);
	uint64_t timeout = comm_coll_timeout_ms(c);
	if (!timeout || c->state != COMM_READY)
		return;
	const struct watch_inst *late = wc->coll.key && now - wc->coll.change_ms >= timeout ? &wc->coll : NULL;
	for (uint32_t i = 0; i < wc->nextra; i++) {
		const struct watch_inst *x = &wc->extra[i];
		if (now - x->change_ms >= timeout && (!late || x->change_ms < late->change_ms))
			late = x;
	}
	if (late)
		timeout_fire(w, c, late, timeout, now);
}

void watch_tick(struct watch *w)
{
	struct server *srv = w->srv;
	uint64_t now = server_now_ms();
	int any = 0;
	for (struct comm *c = srv->comms; c; c = c->next) {
		any = 1;
		if (!comm_watched(c))
			continue;
		struct watch_comm *wc = wc_get(w, c);
		if (!wc)
			continue;
		wc->seen = 1;
		memset(wc->pend_key, 0, sizeof(wc->pend_key));
		for (uint32_t i = 0; i < wc->nextra; i++)
			wc->extra[i].tick_key = wc->extra[i].queued = 0;
		recorder_get(&w->rec, c);
	}
	for (struct session *s = srv->sessions; s; s = s->next)
		for (uint32_t d = 0; d < SESSION_MAX_DEVICES; d++)
			if (s->qp_ids[d])
				watch_qp_scan(w, s, d, now);
	struct comm *next;
	for (struct comm *c = srv->comms; c; c = next) {
		next = c->next; /* a failure never frees c, but keep the walk safe */
		struct watch_comm *wc = comm_watched(c) ? wc_find(w, c->id) : NULL;
		if (wc && wc->seen)
			watch_comm_check(w, c, wc, now);
	}
	watch_sweep(w);
	recorder_sweep(&w->rec, comm_is_live, srv);
	if (!any && w->running) {
		/* Nothing to watch: no wake-ups until a communicator is ready. */
		uv_timer_stop(&w->timer);
		w->running = 0;
	}
}

/* ------------------------------------------------------------ dfcclctl stuck */

static const Dfccl__V1__StuckKind stuck_kinds[] = {
    [INST_COLL] = DFCCL__V1__STUCK_KIND__STUCK_COLLECTIVE,
    [INST_REG] = DFCCL__V1__STUCK_KIND__STUCK_REGISTERED,
    [INST_P2P] = DFCCL__V1__STUCK_KIND__STUCK_MESSAGE,
};

/* Rank r of instance x, appended to si->ranks (and si->missing). */
static int stuck_rank(struct watch *w, const struct comm *c, const struct watch_inst *x, uint32_t r,
                      Dfccl__V1__StuckInfo *si)
{
	const struct comm_member *m = &c->members[r];
	Dfccl__V1__StuckRank *sr = calloc(1, sizeof(*sr));
	if (!sr)
		return -ENOMEM;
	dfccl__v1__stuck_rank__init(sr);
	si->ranks[si->n_ranks++] = sr;
	enum rank_state st = inst_rank_state(c, x, r);
	sr->rank = r;
	sr->device = m->device;
	sr->pid = m->pid;
	sr->session_id = m->session_id;
	sr->state = (char *)rank_state_name(st);
	int stopped = 0;
	sr->heartbeat_age_ms = m->session && st != RS_LEFT ? watch_heartbeat_age_ms(w, m->session, &stopped) : -1;
	sr->stopped = stopped;
	if (st == RS_MISSING)
		si->missing[si->n_missing++] = r;
	return 0;
}

/* Instance x of communicator c as one StuckInfo: every rank of a
 * collective, the two ends of a message. */
static int stuck_info(struct watch *w, const struct comm *c, const struct watch_inst *x, uint64_t now,
                      Dfccl__V1__StuckInfo **out)
{
	Dfccl__V1__StuckInfo *si = calloc(1, sizeof(*si));
	if (!si)
		return -ENOMEM;
	*out = si;
	dfccl__v1__stuck_info__init(si);
	si->comm_id = c->id;
	si->uid = (uint32_t)c->uid;
	si->nranks = c->nranks;
	si->kind = stuck_kinds[x->kind];
	si->coll_id = x->kind == INST_REG ? x->coll_id : 0;
	si->src = x->kind == INST_P2P ? x->src : 0;
	si->dst = x->kind == INST_P2P ? x->dst : 0;
	si->op = (char *)queue_op_name(x->op);
	si->seq = x->key;
	si->count = x->count;
	si->dtype = (char *)queue_dtype_name(x->dtype);
	si->waited_ms = now - x->first_ms;
	si->idle_ms = now - x->change_ms;
	si->timeout_ms = (int64_t)comm_coll_timeout_ms(c);
	uint64_t p = comm_preemptions(w, c);
	si->preemptions = p >= x->preempt_base ? p - x->preempt_base : 0;
	si->ranks = calloc(c->nranks, sizeof(*si->ranks));
	si->missing = calloc(c->nranks, sizeof(*si->missing));
	if (!si->ranks || !si->missing)
		return -ENOMEM;
	for (uint32_t r = 0; r < c->nranks; r++) {
		int rc = inst_involves(x, r) ? stuck_rank(w, c, x, r, si) : 0;
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* Appends instance x to reply->stuck when it waited a whole tick: an
 * instance merely in flight is not stuck. */
static int stuck_add(struct watch *w, const struct comm *c, const struct watch_inst *x, uint64_t now,
                     Dfccl__V1__QueryReply *reply)
{
	if (!x->key || now - x->first_ms < watch_interval_ms(w))
		return 0;
	int rc = stuck_info(w, c, x, now, &reply->stuck[reply->n_stuck]);
	if (reply->stuck[reply->n_stuck])
		reply->n_stuck++;
	return rc;
}

/* The instances of wc in a stable order: the NCCL-style one, then the
 * registered ids in increasing order, then the ordered pairs by sender and
 * receiver (the order of extra_at). */
static int stuck_comm(struct watch *w, const struct comm *c, const struct watch_comm *wc, uint64_t now,
                      Dfccl__V1__QueryReply *reply)
{
	int rc = stuck_add(w, c, &wc->coll, now, reply);
	uint32_t places = wc->extra_at ? WATCH_REG_IDS + wc->nranks * wc->nranks : 0;
	for (uint32_t id = 0; id < places && rc == 0; id++)
		if (wc->extra_at[id])
			rc = stuck_add(w, c, &wc->extra[wc->extra_at[id] - 1], now, reply);
	return rc;
}

int watch_fill_stuck(struct watch *w, uid_t uid, Dfccl__V1__QueryReply *reply)
{
	uint64_t now = server_now_ms();
	size_t n = 0;
	for (struct watch_comm *wc = w->comms; wc; wc = wc->next)
		n += 1 + wc->nextra;
	reply->stuck = calloc(n ? n : 1, sizeof(*reply->stuck));
	if (!reply->stuck)
		return -ENOMEM;
	for (struct watch_comm *wc = w->comms; wc; wc = wc->next) {
		struct comm *c = comm_find(w->srv, wc->comm_id);
		if (!c || !comm_watched(c) || (uid != 0 && c->uid != uid))
			continue;
		int rc = stuck_comm(w, c, wc, now, reply);
		if (rc < 0)
			return rc;
	}
	return 0;
}

void watch_stuck_free(Dfccl__V1__QueryReply *reply)
{
	for (size_t i = 0; i < reply->n_stuck; i++) {
		Dfccl__V1__StuckInfo *si = reply->stuck[i];
		for (size_t k = 0; k < si->n_ranks; k++)
			free(si->ranks[k]);
		free(si->ranks);
		free(si->missing);
		free(si);
	}
	free(reply->stuck);
	reply->stuck = NULL;
	reply->n_stuck = 0;
}
