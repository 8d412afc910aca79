/*
 * Outstanding entries, their trackers and the completion thread; see req.h.
 *
 * A scan of a tracker walks its list under the tracker's lock, completes
 * what has completed (req_test), remembers the first failure, and unlinks
 * what may be retired. Entries with callbacks are collected into a local
 * list and their callbacks run after every lock is released: a callback
 * may submit (which takes the same tracker's lock) or destroy a
 * communicator (which unlinks a tracker under the poller's lock).
 */
#include "req.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

enum req_state {
	REQ_PENDING = 0,
	REQ_COMPLETING = 1, /* one thread is writing the result */
	REQ_COMPLETE = 2,
};

struct req_poller {
	pthread_mutex_t lock;       /* trackers, watched, stop, started */
	pthread_cond_t wake;
	struct req_tracker *trackers;
	struct req_tracker orphans; /* entries of aborted communicators */
	unsigned watched;           /* entries listed that only this thread retires */
	bool started;
	bool stop;
	pthread_t thread;
	int refs;                   /* atomic: the owner's, plus the running thread's */
	/* atomic: the thread's rounds (a scan of every tracker, then the
	 * callbacks of what it retired) begun, and the last one finished */
	uint64_t rounds_begun, rounds_done;
};

/* ---------------------------------------------------------------- one req */

struct req *req_new(unsigned opcode, dfcclCallback_t callback, void *user_arg, bool handle)
{
	struct req *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->opcode = opcode;
	r->callback = callback;
	r->user_arg = user_arg;
	r->refs = handle ? 2 : 1;
	return r;
}

void req_unref(struct req *r)
{
	if (r && __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) == 0)
		free(r);
}

/* Records r's result once; a thread that loses the race waits the moment
 * the winner takes to publish it. */
static void req_finish(struct req *r, dfcclResult_t result)
{
	int expected = REQ_PENDING;
	if (!__atomic_compare_exchange_n(&r->state, &expected, REQ_COMPLETING, false, __ATOMIC_ACQ_REL,
	                                 __ATOMIC_ACQUIRE)) {
		while (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != REQ_COMPLETE)
			;
		return;
	}
	r->result = result;
	if (result != dfcclSuccess)
		snprintf(r->message, sizeof(r->message), "%s", errors_last());
	__atomic_store_n(&r->state, REQ_COMPLETE, __ATOMIC_RELEASE);
}

bool req_test(struct req *r)
{
	if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) == REQ_COMPLETE)
		return true;
	if (qp_test(r->qp, &r->ticket)) {
		req_finish(r, qp_status_result(r->ticket.status, r->opcode));
		return true;
	}
	/* The daemon will never complete it: fail it here. */
	dfcclResult_t h = qp_health(r->qp);
	if (h == dfcclSuccess)
		return false;
	char why[sizeof(r->message)];
	snprintf(why, sizeof(why), "%s", errors_last());
	if (qp_abandon(r->qp, &r->ticket))
		req_finish(r, errors_set(h, "%s did not complete: %s", qp_op_name(r->opcode), why));
	else
		req_finish(r, qp_status_result(r->ticket.status, r->opcode));
	return true;
}

dfcclResult_t req_result(const struct req *r)
{
	if (r->result != dfcclSuccess)
		return errors_set(r->result, "%s", r->message);
	return dfcclSuccess;
}

dfcclResult_t req_wait(struct req *r)
{
	struct qp_backoff b = QP_BACKOFF_ON(r->qp);
	while (!req_test(r)) {
		if (qp_backoff_sleeping(&b))
			qp_heartbeat(r->qp);
		qp_backoff_pause(&b);
	}
	qp_backoff_end(&b);
	return req_result(r);
}

/* ---------------------------------------------------------------- trackers */

static void tracker_link_locked(struct req_tracker *t, struct req *r)
{
	r->tracker = t;
	r->index = ++t->next_index;
	r->next = NULL;
	r->prev = t->tail;
	if (t->tail)
		t->tail->next = r;
	else
		t->head = r;
	t->tail = r;
}

static void tracker_unlink_locked(struct req_tracker *t, struct req *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		t->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		t->tail = r->prev;
	r->prev = r->next = NULL;
	r->tracker = NULL;
}

/* Whether only the completion thread may retire r. */
static bool req_watched(const struct req_tracker *t, const struct req *r)
{
	return r->callback || t == &t->poller->orphans;
}

static void poller_unwatch(struct req_poller *p, unsigned n)
{
	if (n == 0)
		return;
	pthread_mutex_lock(&p->lock);
	p->watched -= n;
	pthread_mutex_unlock(&p->lock);
}

/* Complete entry r's failure becomes t's first if t has none. */
static void tracker_account_locked(struct req_tracker *t, struct req *r)
{
	if (r->accounted)
		return;
	r->accounted = true;
	if (r->result != dfcclSuccess && (t->error == dfcclSuccess || r->index < t->error_index)) {
		t->error = r->result;
		t->error_index = r->index;
		snprintf(t->message, sizeof(t->message), "%s", r->message);
	}
}

/* Retires complete entry r: accounted, unlinked, let go. */
static void tracker_retire_locked(struct req_tracker *t, struct req *r)
{
	tracker_account_locked(t, r);
	tracker_unlink_locked(t, r);
	req_unref(r);
}

/*
 * One look at every entry of t: completes what completed, records the
 * first failure, unlinks what may be retired. Entries only the completion
 * thread retires are moved onto *done when `retire_watched`, for the caller
 * to finish with req_retire_all once no lock is held. Returns how many
 * entries it retired; *oldest gets the index of the oldest pending entry
 * (UINT64_MAX if none).
 */
static unsigned tracker_scan_locked(struct req_tracker *t, bool retire_watched, struct req **done, uint64_t *oldest)
{
	unsigned retired = 0;
	*oldest = UINT64_MAX;
	for (struct req *r = t->head, *next; r; r = next) {
		next = r->next;
		if (!req_test(r)) {
			if (r->index < *oldest)
				*oldest = r->index;
			continue;
		}
		tracker_account_locked(t, r);
		if (!req_watched(t, r)) {
			tracker_retire_locked(t, r);
			retired++;
		} else if (retire_watched) {
			/* Accounted like the others, but kept referenced for its callback. */
			__atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED);
			tracker_retire_locked(t, r);
			r->next = *done;
			*done = r;
			retired++;
		}
	}
	return retired;
}

/* Runs the callbacks of retired entries, oldest first, and lets them go. */
static void req_retire_all(struct req_poller *p, struct req *done)
{
	/* The scan pushed them newest first. */
	struct req *order = NULL;
	unsigned n = 0;
	while (done) {
		struct req *next = done->next;
		done->next = order;
		order = done;
		done = next;
		n++;
	}
	poller_unwatch(p, n);
	while (order) {
		struct req *next = order->next;
		if (order->callback)
			order->callback(order->result, order->user_arg);
		req_unref(order);
		order = next;
	}
}

static _Thread_local struct req_poller *completion_thread_of;

static bool on_completion_thread(const struct req_poller *p)
{
	return completion_thread_of == p;
}

/* One scan of t by any thread; entries with callbacks are retired (and
 * their callbacks run) only on the completion thread. */
static unsigned tracker_scan(struct req_tracker *t, uint64_t *oldest, bool *left)
{
	struct req *done = NULL;
	bool mine = on_completion_thread(t->poller);
	pthread_mutex_lock(&t->lock);
	unsigned n = tracker_scan_locked(t, mine, &done, oldest);
	if (left)
		*left = t->head != NULL;
	pthread_mutex_unlock(&t->lock);
	req_retire_all(t->poller, done);
	return n;
}

void req_tracker_init(struct req_tracker *t, struct req_poller *p)
{
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->lock, NULL);
	t->poller = p;
	pthread_mutex_lock(&p->lock);
	t->next = p->trackers;
	p->trackers = t;
	pthread_mutex_unlock(&p->lock);
}

static void tracker_fini(struct req_tracker *t)
{
	struct req_poller *p = t->poller;
	pthread_mutex_lock(&p->lock);
	for (struct req_tracker **q = &p->trackers; *q; q = &(*q)->next) {
		if (*q == t) {
			*q = t->next;
			break;
		}
	}
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_destroy(&t->lock);
}

/* Waits until the callbacks that the completion thread may be running
 * have returned: an entry it took off a tracker before this call was taken
 * in a round begun by then. Not on that thread, whose callbacks wait for
 * it to return. */
static void poller_wait_round(struct req_poller *p)
{
	if (on_completion_thread(p))
		return;
	uint64_t round = __atomic_load_n(&p->rounds_begun, __ATOMIC_SEQ_CST);
	struct qp_backoff b = QP_BACKOFF_INIT;
	while (__atomic_load_n(&p->rounds_done, __ATOMIC_ACQUIRE) < round)
		qp_backoff_pause(&b);
}

void req_tracker_drain(struct req_tracker *t)
{
	struct qp_backoff b = QP_BACKOFF_ON(t->qp);
	for (;;) {
		uint64_t oldest;
		bool left;
		if (tracker_scan(t, &oldest, &left) > 0)
			qp_backoff_reset(&b);
		if (!left)
			break;
		qp_backoff_pause(&b);
	}
	qp_backoff_end(&b);
	poller_wait_round(t->poller);
	tracker_fini(t);
}

static void poller_watch_locked(struct req_poller *p, unsigned n);

void req_tracker_orphan(struct req_tracker *t)
{
	struct req_poller *p = t->poller;
	unsigned moved = 0;
	pthread_mutex_lock(&p->lock);
	pthread_mutex_lock(&t->lock);
	pthread_mutex_lock(&p->orphans.lock);
	while (t->head) {
		struct req *r = t->head;
		/* Entries with callbacks were counted as watched already. */
		moved += !r->callback;
		tracker_unlink_locked(t, r);
		tracker_link_locked(&p->orphans, r);
	}
	pthread_mutex_unlock(&p->orphans.lock);
	pthread_mutex_unlock(&t->lock);
	poller_watch_locked(p, moved);
	pthread_mutex_unlock(&p->lock);
	tracker_fini(t);
}

dfcclResult_t req_tracker_sync(struct req_tracker *t, bool wait)
{
	pthread_mutex_lock(&t->lock);
	uint64_t target = t->next_index;
	struct qp_backoff b = QP_BACKOFF_ON(t->qp);
	pthread_mutex_unlock(&t->lock);
	for (;;) {
		uint64_t oldest;
		if (tracker_scan(t, &oldest, NULL) > 0)
			qp_backoff_reset(&b);
		bool pending = oldest <= target;
		if (pending && wait) {
			qp_backoff_pause(&b);
			continue;
		}
		qp_backoff_end(&b);
		pthread_mutex_lock(&t->lock);
		dfcclResult_t r = t->error;
		char message[sizeof(t->message)];
		snprintf(message, sizeof(message), "%s", t->message);
		if (wait)
			t->error = dfcclSuccess;
		pthread_mutex_unlock(&t->lock);
		if (r != dfcclSuccess)
			return errors_set(r, "%s", message);
		return pending ? dfcclInProgress : dfcclSuccess;
	}
}

/* Submissions between two looks for completed entries at a tracker's head
 * (req_submit): entries nobody waits for stay at most this many more. */
#define REQ_RETIRE_EVERY 32u

dfcclResult_t req_submit(struct req_tracker *t, struct qp *q, const struct dfccl_sqe *e, struct req *r,
                         struct qp_stream_arm *arm)
{
	struct req_poller *p = t->poller;
	r->qp = q;
	if (r->callback) {
		/* Counted before it can complete, so the thread is awake for it. */
		pthread_mutex_lock(&p->lock);
		poller_watch_locked(p, 1);
		pthread_mutex_unlock(&p->lock);
	}
	dfcclResult_t res = arm ? qp_submit_unarmed(q, e, &r->ticket, arm) : qp_submit(q, e, &r->ticket);
	if (res != dfcclSuccess) {
		if (r->callback)
			poller_unwatch(p, 1);
		free(r);
		return res;
	}
	/* Retire what already completed at the head, so that a communicator
	 * nobody synchronizes does not collect entries without bound: every
	 * REQ_RETIRE_EVERY-th submission, since a look at a head not complete
	 * yet reads its completion word and the queue pair's state, lines the
	 * daemon writes, on the path of every call. */
	pthread_mutex_lock(&t->lock);
	t->qp = q;
	tracker_link_locked(t, r);
	if (r->index % REQ_RETIRE_EVERY == 0)
		while (t->head != r && !req_watched(t, t->head) && req_test(t->head))
			tracker_retire_locked(t, t->head);
	pthread_mutex_unlock(&t->lock);
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- the completion thread */

static void *poller_main(void *arg)
{
	struct req_poller *p = arg;
	struct qp_backoff b = QP_BACKOFF_INIT;
	completion_thread_of = p;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->stop && p->watched == 0) {
			pthread_cond_wait(&p->wake, &p->lock);
			qp_backoff_reset(&b);
		}
		if (p->stop)
			break;
		/* Scanned under the poller's lock, so no tracker is unlinked (and
		 * freed) meanwhile; the callbacks run after it is released. */
		unsigned retired = 0;
		struct req *done = NULL;
		uint64_t oldest;
		uint64_t round = __atomic_add_fetch(&p->rounds_begun, 1, __ATOMIC_SEQ_CST);
		uint64_t spin = 0; /* the longest spin of the queue pairs with entries left */
		for (struct req_tracker *t = p->trackers; t; t = t->next) {
			pthread_mutex_lock(&t->lock);
			retired += tracker_scan_locked(t, true, &done, &oldest);
			if (t->head && t->qp && t->qp->spin_ns > spin)
				spin = t->qp->spin_ns;
			pthread_mutex_unlock(&t->lock);
		}
		b.spin_ns = spin;
		pthread_mutex_lock(&p->orphans.lock);
		retired += tracker_scan_locked(&p->orphans, true, &done, &oldest);
		pthread_mutex_unlock(&p->orphans.lock);
		pthread_mutex_unlock(&p->lock);
		req_retire_all(p, done);
		__atomic_store_n(&p->rounds_done, round, __ATOMIC_RELEASE);
		if (retired > 0)
			qp_backoff_reset(&b);
		else
			qp_backoff_pause(&b);
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	completion_thread_of = NULL;
	if (__atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) == 0)
		free(p);
	return NULL;
}

/* Counts n more watched entries, starting the thread on first need. A
 * thread that cannot start leaves callbacks undelivered, which is why its
 * failure is logged; the entries still complete for dfcclWait and
 * dfcclCommSynchronize. */
static void poller_watch_locked(struct req_poller *p, unsigned n)
{
	if (n == 0)
		return;
	if (p->watched == 0)
		pthread_cond_signal(&p->wake);
	p->watched += n;
	if (p->started)
		return;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	__atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
	int rc = pthread_create(&p->thread, NULL, poller_main, p);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		__atomic_sub_fetch(&p->refs, 1, __ATOMIC_RELAXED);
		errors_set(dfcclSystemError, "cannot start the libdfccl completion thread: %s; callbacks will not run",
		           strerror(rc));
		return;
	}
	p->started = true;
}

dfcclResult_t req_poller_new(struct req_poller **out)
{
	struct req_poller *p = calloc(1, sizeof(*p));
	if (!p)
		return errors_set(dfcclSystemError, "out of memory");
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_mutex_init(&p->orphans.lock, NULL);
	p->orphans.poller = p;
	p->refs = 1;
	*out = p;
	return dfcclSuccess;
}

void req_poller_after_fork(struct req_poller *p)
{
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_mutex_init(&p->orphans.lock, NULL);
	p->started = false;
	p->rounds_done = p->rounds_begun; /* no round of the parent's thread goes on here */
	for (struct req_tracker *t = p->trackers; t; t = t->next)
		pthread_mutex_init(&t->lock, NULL);
}

void req_poller_free(struct req_poller *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	bool started = p->started;
	p->stop = true;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	if (started) {
		if (on_completion_thread(p))
			pthread_detach(p->thread);
		else
			pthread_join(p->thread, NULL);
	}
	if (__atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return; /* the thread itself frees it on its way out */
	/* Orphans left now belong to a session that is going away. */
	while (p->orphans.head) {
		struct req *r = p->orphans.head;
		tracker_unlink_locked(&p->orphans, r);
		if (!req_test(r))
			qp_abandon(r->qp, &r->ticket);
		req_unref(r);
	}
	pthread_mutex_destroy(&p->orphans.lock);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
