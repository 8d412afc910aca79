/*
 * See host_engine.h. The engine owns three things: the communicators it was
 * given, the task storage, and the task queue (gpu/scheduler.h) that orders the
 * tasks. What a task does is in host_coll.c.
 *
 * Task life: FREE -> QUEUED (in the task queue) -> FREE, through completion,
 * an abort, the communicator's removal or its queue going away. Entries of
 * served queue pairs are admitted fairly (host_engine.h), so they never
 * find the task queue full; an entry given directly to host_engine_submit
 * when it is full waits in a FIFO backlog (BACKLOG) and enters the queue as
 * places free up. Tasks are referred to by index, because the storage grows;
 * it is given back whenever the engine empties.
 *
 * Ordering: FIFO by arrival, as configured; the first entry that carries a
 * priority switches the queue to priority order (a FIFO queue of tasks that
 * all have priority 0 is already in priority order, so nothing moves), and
 * the configured order returns once the engine is empty.
 */
#include "host_engine.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_coll.h"
#include "sqe_check.h"

#define A64(p) ((_Atomic uint64_t *)(p))

/* Bytes a task moves in one visit before it lets the next task run: large
 * enough to stream at memory speed, small enough that a large collective
 * delays the others by a millisecond or so. */
#define HOST_VISIT_BYTES (4u << 20)
#define HOST_TASKS_INITIAL 64u
#define NO_TASK UINT32_MAX


enum task_where { TASK_FREE = 0, TASK_QUEUED = 1, TASK_BACKLOG = 2 };

/* A uid with queue pairs served here: admission limits their tasks
 * together (scheduler.h). */
struct host_uid {
	uint32_t uid;
	uint32_t nqps;     /* its served queue pairs */
	uint32_t inflight; /* their tasks in the engine */
};

struct host_qp {
	struct sq_queue *q;
	uint32_t inflight; /* its tasks in the engine */
	uint32_t uid;      /* its uid's index in the engine's uids */
};

struct host_engine {
	struct sched_params params; /* the configured policy, order possibly raised */
	uint32_t configured_order;
	struct dfccl_worker_stats own_stats; /* when the caller gives no stats page */
	struct host_coll_env env;

	struct host_comm **comms;
	uint32_t ncomms, comms_cap;

	struct host_task *tasks; /* [cap] */
	struct sched_state *states; /* [cap], indexed like tasks, as sched_insert wants */
	uint32_t *free_list;     /* [cap] indices of FREE tasks, nfree of them */
	uint32_t cap, nfree;
	struct sched_queue queue;
	uint32_t backlog_head, backlog_tail, nbacklog;

	struct host_qp *qps; /* the queue pairs served by host_engine_ops_new's poll */
	uint32_t nqps, qps_cap;
	struct host_uid *uids; /* the uids of the served queue pairs */
	uint32_t nuids, uids_cap;
	struct sched_limits limits;
	uint32_t reserve_used; /* sum over qps of min(inflight, SCHED_QP_GUARANTEE) */
	uint32_t shared_used;  /* sum over qps of the rest of inflight */

	uint32_t algo; /* enum dfccl_algo: the configured algorithm (auto: the plan decides) */
	uint64_t arrivals;
	uint64_t last_arrival; /* the task that ran last: running another is a context switch */
};

static void stat_add(uint64_t *counter, uint64_t v)
{
	atomic_fetch_add_explicit(A64(counter), v, memory_order_relaxed);
}

int host_engine_new(const struct host_engine_config *cfg, struct host_engine **out)
{
	*out = NULL;
	if (!cfg || !cfg->reg_lookup)
		return -EINVAL;
	struct host_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->params = cfg->sched;
	/* An all-zero policy means "the defaults". */
	if (!e->params.spin_head && !e->params.spin_other && !e->params.stick_mult && !e->params.spin_max) {
		e->params.spin_head = SCHED_DEFAULT_SPIN_HEAD;
		e->params.spin_other = SCHED_DEFAULT_SPIN_OTHER;
		e->params.stick_mult = SCHED_DEFAULT_STICK_MULT;
		e->params.spin_max = SCHED_DEFAULT_SPIN_MAX;
	}
	e->configured_order = e->params.order;
	e->env.params = &e->params;
	e->env.stats = cfg->stats ? cfg->stats : &e->own_stats;
	e->env.reg_lookup = cfg->reg_lookup;
	e->env.reg_ctx = cfg->reg_ctx;
	e->env.device = cfg->device;
	e->env.visit_bytes = cfg->visit_bytes ? cfg->visit_bytes : HOST_VISIT_BYTES;
	e->env.nap = cfg->nap ? cfg->nap : host_coll_nap;
	e->algo = cfg->algo;
	e->limits.qp = sched_max_inflight(cfg->max_inflight);
	e->limits.uid = sched_max_inflight_uid(cfg->max_inflight_uid);
	e->backlog_head = e->backlog_tail = NO_TASK;
	*out = e;
	return 0;
}

void host_engine_free(struct host_engine *e)
{
	if (!e)
		return;
	for (uint32_t i = 0; i < e->ncomms; i++)
		free(e->comms[i]);
	free(e->comms);
	free(e->qps);
	free(e->uids);
	free(e->tasks);
	free(e->states);
	free(e->free_list);
	free(e);
}

/* ------------------------------------------------------------------ communicators */

static struct host_comm *comm_find(const struct host_engine *e, uint64_t comm_id, uint32_t *index)
{
	for (uint32_t i = 0; i < e->ncomms; i++) {
		if (e->comms[i]->comm_id == comm_id) {
			if (index)
				*index = i;
			return e->comms[i];
		}
	}
	return NULL;
}

int host_engine_comm_add(struct host_engine *e, uint64_t comm_id, uint32_t nranks,
                         const struct engine_member *members, void *region, size_t region_size)
{
	if (comm_id == 0 || nranks == 0 || nranks > DFCCL_COMM_MAX_RANKS || !members || !region ||
	    region_size < DFCCL_COMM_REGION_SIZE(nranks))
		return -EINVAL;
	if (comm_find(e, comm_id, NULL))
		return -EEXIST;
	if (e->ncomms == e->comms_cap) {
		uint32_t cap = e->comms_cap ? 2 * e->comms_cap : 8;
		struct host_comm **p = realloc(e->comms, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		e->comms = p;
		e->comms_cap = cap;
	}
	struct host_comm *c = calloc(1, sizeof(*c) + nranks * sizeof(c->members[0]));
	if (!c)
		return -ENOMEM;
	c->comm_id = comm_id;
	c->nranks = nranks;
	c->hdr = region;
	c->region_size = region_size;
	memcpy(c->members, members, nranks * sizeof(c->members[0]));
	/* A missing plan is normal for engines fed without a supervisor; a
	 * damaged one leaves the safe defaults too. */
	algo_topo_load(&c->topo, dfccl_comm_plan_of(region), nranks);
	e->comms[e->ncomms++] = c;
	return 0;
}

/* ------------------------------------------------------------------ tasks */

static int task_grow(struct host_engine *e)
{
	uint32_t cap = e->cap ? 2 * e->cap : HOST_TASKS_INITIAL;
	struct host_task *t = realloc(e->tasks, cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	e->tasks = t;
	struct sched_state *s = realloc(e->states, cap * sizeof(*s));
	if (!s)
		return -ENOMEM;
	e->states = s;
	uint32_t *f = realloc(e->free_list, cap * sizeof(*f));
	if (!f)
		return -ENOMEM;
	e->free_list = f;
	/* Hand out low indices first: they are warm in the cache. */
	for (uint32_t i = cap; i > e->cap; i--) {
		e->tasks[i - 1].where = TASK_FREE;
		e->free_list[e->nfree++] = i - 1;
	}
	e->cap = cap;
	return 0;
}

/* The completion of entry seq of group (group_last, group_n) (sqe_group;
 * group_n 0: none). */
static void engine_complete(struct host_engine *e, struct sq_queue *q, uint64_t seq, uint64_t group_last,
                            uint32_t group_n, uint32_t status)
{
	sq_complete_group(q, seq, status, group_last, group_n);
	stat_add(status == DFCCL_CQ_OK ? &e->env.stats->completed : &e->env.stats->errors, 1);
}

/* The completion of a taken entry that gets no task. The arm word is the
 * sequence number the entry was taken under; the seq field is the
 * client's claim and may be what was wrong with it. */
static void entry_complete(struct host_engine *e, struct sq_queue *q, const struct dfccl_sqe *sqe, uint32_t status)
{
	uint64_t last;
	uint32_t n = sqe_group(sqe, sqe->arm, q->n, &last);
	engine_complete(e, q, sqe->arm, last, n, status);
}

static void backlog_push(struct host_engine *e, uint32_t idx)
{
	e->tasks[idx].where = TASK_BACKLOG;
	e->tasks[idx].next = NO_TASK;
	if (e->backlog_tail == NO_TASK)
		e->backlog_head = idx;
	else
		e->tasks[e->backlog_tail].next = idx;
	e->backlog_tail = idx;
	e->nbacklog++;
}

/* Moves backlog tasks into the task queue while it has room. */
static void backlog_admit(struct host_engine *e)
{
	while (e->backlog_head != NO_TASK && e->queue.n < SCHED_MAX_TASKS) {
		uint32_t idx = e->backlog_head;
		e->backlog_head = e->tasks[idx].next;
		if (e->backlog_head == NO_TASK)
			e->backlog_tail = NO_TASK;
		e->nbacklog--;
		e->tasks[idx].where = TASK_QUEUED;
		sched_insert(&e->params, &e->queue, e->states, idx);
	}
}

static struct host_qp *qp_find(struct host_engine *e, const struct sq_queue *q)
{
	for (uint32_t k = 0; k < e->nqps; k++)
		if (e->qps[k].q == q)
			return &e->qps[k];
	return NULL; /* a queue given to host_engine_submit directly */
}

/* A task of hq entered the engine: from the reserve while hq holds fewer
 * than its guarantee, else from the shared part; and its uid's. */
static void qp_charge(struct host_engine *e, struct host_qp *hq)
{
	if (!hq)
		return;
	e->uids[hq->uid].inflight++;
	if (sched_admit_reserved(hq->inflight++))
		e->reserve_used++;
	else
		e->shared_used++;
}

static void qp_uncharge(struct host_engine *e, struct host_qp *hq)
{
	if (!hq)
		return;
	e->uids[hq->uid].inflight--;
	if (sched_admit_reserved(--hq->inflight))
		e->reserve_used--;
	else
		e->shared_used--;
}

/* What hq's entries may do now. */
static struct sched_admission qp_admit(const struct host_engine *e, const struct host_qp *hq)
{
	struct sched_load load = {.qp = hq->inflight,
	                          .uid = e->uids[hq->uid].inflight,
	                          .reserve = e->reserve_used,
	                          .shared = e->shared_used};
	return sched_admit(&e->limits, &load);
}

static void task_release(struct host_engine *e, uint32_t idx)
{
	qp_uncharge(e, qp_find(e, e->tasks[idx].q));
	e->tasks[idx].where = TASK_FREE;
	e->free_list[e->nfree++] = idx;
	if (e->queue.n == 0 && e->nbacklog == 0)
		e->params.order = e->configured_order;
}

void host_engine_refuse(struct host_engine *e, struct sq_queue *q, const struct dfccl_sqe *sqe, uint32_t status)
{
	/* An entry that is not even a member's speaks for nobody; a member's
	 * refused part would leave its peers waiting for its post forever. */
	struct host_comm *c = comm_find(e, sqe->comm_id, NULL);
	if (c && sqe->rank < c->nranks && c->members[sqe->rank].session_id == q->session_id)
		host_comm_fail(c, status);
	entry_complete(e, q, sqe, status);
}

void host_engine_submit(struct host_engine *e, struct sq_queue *q, const struct dfccl_sqe *sqe)
{
	struct host_comm *c = comm_find(e, sqe->comm_id, NULL);
	uint32_t st = c ? host_coll_check(&e->env, c, q, sqe) : DFCCL_CQ_BAD_COMM;
	if (st == DFCCL_CQ_OK)
		st = host_comm_aborted(c);
	if (st == DFCCL_CQ_OK && e->nfree == 0 && task_grow(e) < 0)
		st = DFCCL_CQ_ABORTED; /* out of memory: fail this entry, not the engine */
	if (st != DFCCL_CQ_OK) {
		host_engine_refuse(e, q, sqe, st);
		return;
	}
	uint32_t idx = e->free_list[--e->nfree];
	struct host_task *t = &e->tasks[idx];
	host_coll_init(t, c, q, sqe, e->algo);
	qp_charge(e, qp_find(e, q));
	stat_add(&e->env.stats->by_algo[t->algo], 1);
	int prioritized = (sqe->flags & DFCCL_SQE_F_PRIORITY) != 0;
	e->states[idx] = (struct sched_state){
	    .arrival = ++e->arrivals,
	    .priority = prioritized ? sqe->priority : 0,
	    .boost = 1,
	};
	if (prioritized)
		e->params.order = SCHED_ORDER_PRIORITY;
	t->where = TASK_QUEUED;
	if (e->nbacklog || sched_insert(&e->params, &e->queue, e->states, idx) < 0)
		backlog_push(e, idx);
}

/* Gives the task storage back once the engine is empty, so a burst (or a
 * client that flooded and left) does not keep its memory. */
static void task_trim(struct host_engine *e)
{
	if (e->queue.n || e->nbacklog || e->cap <= HOST_TASKS_INITIAL)
		return;
	free(e->tasks);
	free(e->states);
	free(e->free_list);
	e->tasks = NULL;
	e->states = NULL;
	e->free_list = NULL;
	e->cap = e->nfree = 0;
}

unsigned host_engine_run(struct host_engine *e)
{
	unsigned progressed = 0;
	backlog_admit(e);
	uint32_t pos = 0;
	while (pos < e->queue.n) {
		uint32_t idx = e->queue.idx[pos];
		struct host_task *t = &e->tasks[idx];
		struct sched_state *s = &e->states[idx];
		if (s->arrival != e->last_arrival) {
			if (e->last_arrival)
				stat_add(&e->env.stats->context_switches, 1);
			e->last_arrival = s->arrival;
		}
		enum host_step r = host_coll_step(&e->env, t, pos, s);
		t->idle = r == HOST_STEP_BLOCKED ? t->idle + 1 : 0;
		if (r == HOST_STEP_DONE) {
			engine_complete(e, t->q, t->seq, t->group_last, t->group_n, t->status);
			sched_remove_at(&e->queue, pos);
			task_release(e, idx);
			progressed++;
			continue; /* the next task moved into this position */
		}
		if (r == HOST_STEP_PROGRESS)
			progressed++;
		pos++;
	}
	backlog_admit(e);
	task_trim(e);
	return progressed;
}

unsigned host_engine_pending(const struct host_engine *e)
{
	return e->queue.n + e->nbacklog;
}

unsigned host_engine_capacity(const struct host_engine *e)
{
	return e->cap;
}

static int task_selected(const struct host_task *t, const struct host_comm *c, const struct sq_queue *q)
{
	return (c && t->comm == c) || (q && t->q == q);
}

/* Ends a task outside host_engine_run: completed with status, or, without
 * one (its queue is gone, nobody reads its completion), failing its
 * communicator's other ranks through the region, since they would
 * otherwise wait for it forever. */
static void task_drop(struct host_engine *e, uint32_t idx, uint32_t status)
{
	struct host_task *t = &e->tasks[idx];
	if (status)
		engine_complete(e, t->q, t->seq, t->group_last, t->group_n, status);
	else
		host_comm_fail(t->comm, DFCCL_CQ_PEER_LOST);
	task_release(e, idx);
}

/* Drops every task of communicator c (when c) or of queue q (when q), from
 * the task queue and the backlog, keeping the order of the others. */
static void engine_drop(struct host_engine *e, const struct host_comm *c, const struct sq_queue *q, uint32_t status)
{
	uint32_t kept = 0;
	for (uint32_t pos = 0; pos < e->queue.n; pos++) {
		uint32_t idx = e->queue.idx[pos];
		if (task_selected(&e->tasks[idx], c, q))
			task_drop(e, idx, status);
		else
			e->queue.idx[kept++] = idx;
	}
	e->queue.n = kept;
	uint32_t prev = NO_TASK;
	for (uint32_t idx = e->backlog_head; idx != NO_TASK;) {
		uint32_t next = e->tasks[idx].next;
		if (task_selected(&e->tasks[idx], c, q)) {
			if (prev == NO_TASK)
				e->backlog_head = next;
			else
				e->tasks[prev].next = next;
			if (e->backlog_tail == idx)
				e->backlog_tail = prev;
			e->nbacklog--;
			task_drop(e, idx, status);
		} else {
			prev = idx;
		}
		idx = next;
	}
	/* task_release restores the configured order only once everything is
	 * gone; the queue may have emptied before the backlog did. */
	if (e->queue.n == 0 && e->nbacklog == 0)
		e->params.order = e->configured_order;
	task_trim(e);
}

void host_engine_comm_abort(struct host_engine *e, uint64_t comm_id, uint32_t status)
{
	struct host_comm *c = comm_find(e, comm_id, NULL);
	if (!c)
		return;
	if (status == DFCCL_CQ_OK || status >= DFCCL_CQ_STATUS_COUNT_)
		status = DFCCL_CQ_ABORTED;
	if (!c->abort_status)
		c->abort_status = status;
	/* Ranks in other workers may hear of the abort later than this one:
	 * the region's word makes them fail now rather than wait for us. */
	host_comm_fail(c, c->abort_status);
	engine_drop(e, c, NULL, c->abort_status);
}

void host_engine_comm_del(struct host_engine *e, uint64_t comm_id)
{
	uint32_t i;
	struct host_comm *c = comm_find(e, comm_id, &i);
	if (!c)
		return;
	engine_drop(e, c, NULL, DFCCL_CQ_BAD_COMM);
	e->comms[i] = e->comms[--e->ncomms];
	free(c);
}

void host_engine_queue_gone(struct host_engine *e, struct sq_queue *q)
{
	engine_drop(e, NULL, q, DFCCL_CQ_OK);
}

/* ------------------------------------------------------------------ the engine interface */

/* Entries taken from one queue pair in one go. */
#define TAKE_BATCH 32u
/* A blocked engine polls again after at most this long: its tasks wait on
 * peers in other workers, and nothing wakes this one when they move. */
#define HOST_BLOCKED_PAUSE_NS 200000ull
/* While an entry waits for the stream that arms it (and cannot ring),
 * the queues are looked at this often. */
#define HOST_UNARMED_PAUSE_NS 20000ull

/* Counts a served queue pair of uid; *index: the uid's in e->uids. */
static int uid_ref(struct host_engine *e, uint32_t uid, uint32_t *index)
{
	for (uint32_t i = 0; i < e->nuids; i++)
		if (e->uids[i].uid == uid) {
			e->uids[i].nqps++;
			*index = i;
			return 0;
		}
	if (e->nuids == e->uids_cap) {
		uint32_t cap = e->uids_cap ? 2 * e->uids_cap : 4;
		struct host_uid *p = realloc(e->uids, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		e->uids = p;
		e->uids_cap = cap;
	}
	e->uids[e->nuids] = (struct host_uid){.uid = uid, .nqps = 1};
	*index = e->nuids++;
	return 0;
}

/* A queue pair of the uid at index went away, with its tasks: the uid is
 * forgotten with its last one (the last uid moves into its place). */
static void uid_unref(struct host_engine *e, uint32_t index)
{
	if (--e->uids[index].nqps)
		return;
	uint32_t last = --e->nuids;
	if (index == last)
		return;
	e->uids[index] = e->uids[last];
	for (uint32_t k = 0; k < e->nqps; k++)
		if (e->qps[k].uid == last)
			e->qps[k].uid = index;
}

static int ops_qp_add(void *impl, struct sq_queue *q, char *err, size_t errlen)
{
	struct host_engine *e = impl;
	(void)err, (void)errlen;
	if (e->nqps == e->qps_cap) {
		uint32_t cap = e->qps_cap ? 2 * e->qps_cap : 8;
		struct host_qp *p = realloc(e->qps, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		e->qps = p;
		e->qps_cap = cap;
	}
	uint32_t uid;
	if (uid_ref(e, q->uid, &uid) < 0)
		return -ENOMEM;
	e->qps[e->nqps++] = (struct host_qp){.q = q, .uid = uid};
	sq_set_engine_state(q, DFCCL_ENGINE_POLLING);
	return 0;
}

static void ops_qp_del(void *impl, struct sq_queue *q)
{
	struct host_engine *e = impl;
	host_engine_queue_gone(e, q);
	for (uint32_t i = 0; i < e->nqps; i++)
		if (e->qps[i].q == q) {
			uint32_t uid = e->qps[i].uid;
			e->qps[i] = e->qps[--e->nqps];
			uid_unref(e, uid);
			break;
		}
}

static int ops_reg_add(void *impl, const struct sq_reg *r, const struct engine_mem_src *src, char *err, size_t errlen)
{
	(void)impl;
	if (src->mem == ENGINE_MEM_HOST && r->base)
		return 0;
	snprintf(err, errlen, "the host engine runs collectives on host memory only; GPU memory needs the cuda engine");
	return -ENOTSUP;
}

static void ops_reg_del(void *impl, uint32_t reg_id)
{
	(void)impl, (void)reg_id; /* the worker's lookup forgets it; tasks resolve buffers on every visit */
}

static int ops_comm_add(void *impl, uint64_t comm_id, uint32_t nranks, const struct engine_member *members,
                        void *region, size_t region_size, char *err, size_t errlen)
{
	int rc = host_engine_comm_add(impl, comm_id, nranks, members, region, region_size);
	if (rc < 0)
		snprintf(err, errlen, "the engine cannot take communicator %llu: %s", (unsigned long long)comm_id,
		         strerror(-rc));
	return rc;
}

static void ops_comm_abort(void *impl, uint64_t comm_id, uint32_t status)
{
	host_engine_comm_abort(impl, comm_id, status);
}

static void ops_comm_del(void *impl, uint64_t comm_id)
{
	host_engine_comm_del(impl, comm_id);
}

/* Checks and submits (or refuses with `limit` when not OK) one taken entry. */
static void serve_entry(struct host_engine *e, struct sq_queue *q, const struct dfccl_sqe *sqe, uint32_t limit)
{
	uint32_t st = sq_check(q, sqe, e->env.reg_lookup, e->env.reg_ctx);
	if (sqe->opcode == DFCCL_OP_NOP && st == DFCCL_CQ_OK)
		entry_complete(e, q, sqe, st);
	else if (st == DFCCL_CQ_OK && limit == DFCCL_CQ_OK)
		host_engine_submit(e, q, sqe);
	else
		/* Refused: the communicator fails too, so its peers do not
		 * wait for a rank that never posts. */
		host_engine_refuse(e, q, sqe, st != DFCCL_CQ_OK ? st : limit);
}

/* sq_take_if's test: another rank posted the entry's instance. */
static int peer_posted(void *ctx, const struct dfccl_sqe *sqe)
{
	struct host_comm *c = comm_find(ctx, sqe->comm_id, NULL);
	return c && dfccl_comm_peer_posted(c->hdr, c->nranks, sqe);
}

/*
 * Takes what is armed in one queue pair, as far as admission allows
 * (scheduler.h): entries beyond the pair's room wait in its queue, but for
 * those whose instance a peer posted, and while the pair or its uid holds
 * its limit the pair's entries are refused. Returns how many entries it
 * took.
 */
static unsigned serve_queue(struct host_engine *e, uint32_t k)
{
	struct dfccl_sqe batch[TAKE_BATCH];
	unsigned total = 0;
	for (;;) {
		struct host_qp *hq = &e->qps[k];
		struct sq_queue *q = hq->q;
		struct sched_admission a = qp_admit(e, hq);
		unsigned got;
		if (a.room == 0 && a.refuse == DFCCL_CQ_OK) {
			got = sq_take_if(q, batch, a.beyond < TAKE_BATCH ? a.beyond : TAKE_BATCH, peer_posted, e,
			                 SCHED_BEYOND_LOOKS);
			for (unsigned i = 0; i < got; i++)
				serve_entry(e, q, &batch[i], DFCCL_CQ_OK);
			return total + got;
		}
		/* Refused entries are taken as they come: each is answered. */
		unsigned max = a.refuse != DFCCL_CQ_OK || a.room > TAKE_BATCH ? TAKE_BATCH : a.room;
		got = sq_take(q, batch, max);
		for (unsigned i = 0; i < got; i++)
			serve_entry(e, q, &batch[i], a.refuse);
		total += got;
		/* Fewer than asked: the pass is over (it may have stopped at an
		 * entry not yet armed, past which the next pass looks). */
		if (got < max)
			return total;
	}
}

/* Serves every active queue pair; returns how many entries were taken. */
static unsigned serve_queues(struct host_engine *e)
{
	unsigned total = 0;
	for (uint32_t k = 0; k < e->nqps; k++)
		if (sq_qp_state(e->qps[k].q) == DFCCL_QP_ACTIVE)
			total += serve_queue(e, k);
	return total;
}

static unsigned ops_poll(void *impl)
{
	struct host_engine *e = impl;
	unsigned work = serve_queues(e);
	return work + host_engine_run(e);
}

static int ops_busy(void *impl, uint64_t *pause_ns)
{
	struct host_engine *e = impl;
	*pause_ns = HOST_BLOCKED_PAUSE_NS;
	if (host_engine_pending(e) > 0)
		return 1;
	/* Posted but not armed: a stream-ordered entry, whose stream arms it
	 * without a doorbell. */
	*pause_ns = HOST_UNARMED_PAUSE_NS;
	for (uint32_t k = 0; k < e->nqps; k++)
		if (sq_qp_state(e->qps[k].q) == DFCCL_QP_ACTIVE && sq_pending(e->qps[k].q))
			return 1;
	return 0;
}

static void set_states(struct host_engine *e, uint32_t st)
{
	for (uint32_t k = 0; k < e->nqps; k++)
		sq_set_engine_state(e->qps[k].q, st);
}

static int ops_sleep(void *impl)
{
	struct host_engine *e = impl;
	/* Announce it, then look once more: an entry armed before a client
	 * saw SLEEPING comes without a doorbell. */
	set_states(e, DFCCL_ENGINE_SLEEPING);
	atomic_thread_fence(memory_order_seq_cst);
	if (serve_queues(e) > 0) {
		set_states(e, DFCCL_ENGINE_POLLING);
		return 0;
	}
	return 1;
}

static void ops_wake(void *impl)
{
	set_states(impl, DFCCL_ENGINE_POLLING);
}

static void ops_free(void *impl)
{
	host_engine_free(impl);
}

static const struct engine_ops host_ops = {
    .name = "host",
    .free = ops_free,
    .qp_add = ops_qp_add,
    .qp_del = ops_qp_del,
    .reg_add = ops_reg_add,
    .reg_del = ops_reg_del,
    .comm_add = ops_comm_add,
    .comm_abort = ops_comm_abort,
    .comm_del = ops_comm_del,
    .poll = ops_poll,
    .busy = ops_busy,
    .sleep = ops_sleep,
    .wake = ops_wake,
};

int host_engine_ops_new(const struct engine_config *cfg, const struct engine_ops **ops, void **impl)
{
	struct host_engine_config hc = {
	    .device = cfg->device,
	    .sched = cfg->sched,
	    .stats = cfg->stats,
	    .reg_lookup = cfg->reg_lookup,
	    .reg_ctx = cfg->reg_ctx,
	    .algo = cfg->algo,
	    .max_inflight = cfg->max_inflight,
	    .max_inflight_uid = cfg->max_inflight_uid,
	    .visit_bytes = cfg->visit_bytes,
	};
	struct host_engine *e;
	int rc = host_engine_new(&hc, &e);
	if (rc < 0)
		return rc;
	*ops = &host_ops;
	*impl = e;
	return 0;
}
