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
#include "workers.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x
#define WATCH_MAX_ADVANCE 1000000u /* keys one tick may pass, so a garbage word cannot stall it */

struct watch_qp {
	struct watch_qp *next;
	uint32_t qp_id;
	uint64_t low; /* lowest queue sequence not yet seen completed */
	int seen;
};

/* What the watcher knows of one ready communicator. */
struct watch_comm {
	struct watch_comm *next;
	uint64_t comm_id;
	int seen;
	uint64_t low;     /* lowest NCCL-style key some rank has not finished */
	uint64_t key;     /* the unfinished instance being timed; 0: none */
	uint64_t first_ms, change_ms, sig, preempt_base;
	/* The instance as its entries describe it. */
	uint8_t op, dtype;
	uint64_t count;
	/* Per rank, this tick: the lowest NCCL-style key pending in its queue
	 * (0: none), and what that entry says. */
	uint64_t pend_key[DFCCL_COMM_MAX_RANKS];
	uint8_t pend_op[DFCCL_COMM_MAX_RANKS], pend_dtype[DFCCL_COMM_MAX_RANKS];
	uint64_t pend_count[DFCCL_COMM_MAX_RANKS];
};

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
		free(c);
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

static struct watch_comm *wc_get(struct watch *w, uint64_t comm_id)
{
	struct watch_comm *c = wc_find(w, comm_id);
	if (c)
		return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->comm_id = comm_id;
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
			free(c);
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
	return c->region && c->state != COMM_INITIALIZING && c->state != COMM_ACTIVATING;
}

static int op_is_coll(uint32_t opcode)
{
	return opcode >= DFCCL_OP_ALLREDUCE && opcode <= DFCCL_OP_REDUCE;
}

/* ------------------------------------------------------------ queue pairs */

/* One submission entry of session s: into its communicator's recorder and,
 * when pending, into the pending keys of its rank. */
static void watch_entry(struct watch *w, const struct session *s, uint32_t qp_id, uint64_t seq,
                        const struct dfccl_sqe *e, uint64_t cw, uint64_t now)
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
	if (done || !wc || !op_is_coll(e->opcode) || (e->flags & DFCCL_SQE_F_REGISTERED))
		return;
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
		watch_entry(w, s, qp_id, seq, &e, cw, now);
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

static enum rank_state rank_state_of(const struct comm *c, const struct watch_comm *wc, uint32_t r)
{
	if (c->members[r].state != MEMBER_ACTIVE)
		return RS_LEFT;
	const struct dfccl_rank_post *p = dfccl_comm_post(c->region, c->nranks, wc->key, r);
	if (ld64(&p->done) >= wc->key)
		return RS_FINISHED;
	if (ld64(&p->key) == wc->key)
		return RS_POSTED;
	if (wc->pend_key[r] == wc->key)
		return RS_QUEUED;
	return RS_MISSING;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
	return (h ^ v) * 0x100000001b3ull;
}

/* A digest of everything that moves while the instance makes progress:
 * each rank's post, progress and done words, its channel words (the CUDA
 * engine's progress), and whether its entry is queued. */
static uint64_t instance_sig(const struct comm *c, const struct watch_comm *wc)
{
	uint64_t h = 0xcbf29ce484222325ull;
	uint32_t slot = dfccl_comm_conn_slot(wc->key);
	for (uint32_t r = 0; r < c->nranks; r++) {
		const struct dfccl_rank_post *p = dfccl_comm_post(c->region, c->nranks, wc->key, r);
		h = mix(h, ld64(&p->key));
		h = mix(h, ld64(&p->progress));
		h = mix(h, ld64(&p->done));
		h = mix(h, wc->pend_key[r] == wc->key);
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

/* Operation, count and type of the instance: from a post, else from an
 * entry still in a queue. */
static void instance_describe(const struct comm *c, struct watch_comm *wc)
{
	for (uint32_t r = 0; r < c->nranks; r++) {
		const struct dfccl_rank_post *p = dfccl_comm_post(c->region, c->nranks, wc->key, r);
		if (ld64(&p->key) == wc->key) {
			uint32_t shape = p->shape;
			wc->op = (uint8_t)(shape & 0xff);
			wc->dtype = (uint8_t)((shape >> 8) & 0xff);
			wc->count = p->count;
			return;
		}
	}
	for (uint32_t r = 0; r < c->nranks; r++) {
		if (wc->pend_key[r] == wc->key) {
			wc->op = wc->pend_op[r];
			wc->dtype = wc->pend_dtype[r];
			wc->count = wc->pend_count[r];
			return;
		}
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

static void timeout_fire(struct watch *w, struct comm *c, struct watch_comm *wc, uint64_t timeout, uint64_t now)
{
	char msg[1024], ranks[768] = "";
	size_t off = 0;
	unsigned missing = 0, shown = 0;
	for (uint32_t r = 0; r < c->nranks; r++) {
		if (rank_state_of(c, wc, r) != RS_MISSING)
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
	char what[200];
	snprintf(what, sizeof(what), "communicator %" PRIu64 ": %s #%" PRIu64 " (%" PRIu64 " elements of %s)", c->id,
	         queue_op_name(wc->op), wc->key, wc->count, queue_dtype_name(wc->dtype));
	if (missing)
		snprintf(msg, sizeof(msg),
		         "%s timed out after %" PRIu64 " ms without progress (timeout %" PRIu64 " ms); rank%s that never "
		         "submitted it: %s",
		         what, now - wc->change_ms, timeout, missing == 1 ? "" : "s", ranks);
	else
		snprintf(msg, sizeof(msg),
		         "%s timed out: every rank submitted it, but it made no progress for %" PRIu64 " ms (timeout %" PRIu64
		         " ms); see dfcclctl stats and the daemon's log for its devices' workers",
		         what, now - wc->change_ms, timeout);
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

static void watch_comm_check(struct watch *w, struct comm *c, struct watch_comm *wc, uint64_t now)
{
	advance_low(c, wc);
	record_starts(w, c, wc, now);
	if (!instance_open(c, wc, wc->low)) {
		wc->key = 0;
		return;
	}
	if (wc->key != wc->low) {
		wc->key = wc->low;
		wc->first_ms = wc->change_ms = now;
		wc->sig = instance_sig(c, wc);
		wc->preempt_base = comm_preemptions(w, c);
		instance_describe(c, wc);
		return;
	}
	uint64_t sig = instance_sig(c, wc);
	if (sig != wc->sig) {
		wc->sig = sig;
		wc->change_ms = now;
		instance_describe(c, wc);
	}
	uint64_t timeout = comm_coll_timeout_ms(c);
	if (timeout && c->state == COMM_READY && now - wc->change_ms >= timeout)
		timeout_fire(w, c, wc, timeout, now);
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
		struct watch_comm *wc = wc_get(w, c->id);
		if (!wc)
			continue;
		wc->seen = 1;
		memset(wc->pend_key, 0, sizeof(wc->pend_key));
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

static int stuck_info(struct watch *w, const struct comm *c, const struct watch_comm *wc, uint64_t now,
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
	si->op = (char *)queue_op_name(wc->op);
	si->seq = wc->key;
	si->count = wc->count;
	si->dtype = (char *)queue_dtype_name(wc->dtype);
	si->waited_ms = now - wc->first_ms;
	si->idle_ms = now - wc->change_ms;
	si->timeout_ms = (int64_t)comm_coll_timeout_ms(c);
	uint64_t p = comm_preemptions(w, c);
	si->preemptions = p >= wc->preempt_base ? p - wc->preempt_base : 0;
	si->ranks = calloc(c->nranks, sizeof(*si->ranks));
	si->missing = calloc(c->nranks, sizeof(*si->missing));
	if (!si->ranks || !si->missing)
		return -ENOMEM;
	for (uint32_t r = 0; r < c->nranks; r++) {
		const struct comm_member *m = &c->members[r];
		Dfccl__V1__StuckRank *sr = calloc(1, sizeof(*sr));
		if (!sr)
			return -ENOMEM;
		dfccl__v1__stuck_rank__init(sr);
		si->ranks[si->n_ranks++] = sr;
		enum rank_state st = rank_state_of(c, wc, r);
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
	}
	return 0;
}

int watch_fill_stuck(struct watch *w, uid_t uid, Dfccl__V1__QueryReply *reply)
{
	uint64_t now = server_now_ms();
	size_t n = 0;
	for (struct watch_comm *wc = w->comms; wc; wc = wc->next)
		n++;
	reply->stuck = calloc(n ? n : 1, sizeof(*reply->stuck));
	if (!reply->stuck)
		return -ENOMEM;
	for (struct watch_comm *wc = w->comms; wc; wc = wc->next) {
		struct comm *c = comm_find(w->srv, wc->comm_id);
		if (!c || !comm_watched(c) || !wc->key || (uid != 0 && c->uid != uid))
			continue;
		/* Only what waited a whole tick: a collective merely in flight is
		 * not stuck. */
		if (now - wc->first_ms < watch_interval_ms(w))
			continue;
		int rc = stuck_info(w, c, wc, now, &reply->stuck[reply->n_stuck]);
		if (reply->stuck[reply->n_stuck])
			reply->n_stuck++;
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
