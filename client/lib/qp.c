/*
 * Submission and completion on a queue pair; see qp.h and the protocol in
 * proto/dfccl_queue.h.
 *
 * The region is shared with another process, so every access to a word that
 * the other side reads or writes goes through the __atomic builtins: they
 * give the orderings the protocol needs (release on `arm`, acquire on the
 * completion words, a full barrier between arming and reading
 * engine_state) and they keep the compiler from caching or tearing those
 * words.
 *
 * Waiting spins for the queue pair's spin_ns (qp.h: briefly on the host
 * engine, whose CPU a spinning waiter would steal, longer on a GPU's), then
 * sleeps on the completion futex, or with a doubling delay up to
 * QP_SLEEP_MAX_NS where there is no queue pair to sleep on.
 */
#include "qp.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cudrv.h"
#include "errors.h"
#include "queue.h"

#define QP_SPINS 256u               /* polls before the first sleep, at least, and for at least the
                                     * queue pair's spin_ns (qp.h) */
#define QP_SLEEP_MIN_NS 1000ull     /* first sleep: 1 us */
#define QP_SLEEP_MAX_NS 1000000ull  /* longest sleep: 1 ms */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t qp_now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* The supervisor reads this to tell a stopped client from a slow one, in
 * units of its heartbeat-stale-ms (100 ms at least): the coarse clock (the
 * same count, a tick behind at most) serves, and costs a call that is on
 * the path of every submission less than the precise one. */
void qp_heartbeat(struct qp *q)
{
	__atomic_store_n(&q->hdr->client_heartbeat_ns, clock_ns(CLOCK_MONOTONIC_COARSE), __ATOMIC_RELAXED);
}

const char *qp_op_name(unsigned opcode)
{
	return queue_op_name(opcode);
}

dfcclResult_t qp_map(int memfd, int doorbell, uint64_t region_size, uint32_t device, const int *lost,
                     struct qp **out)
{
	dfcclResult_t r;
	struct qp *q = NULL;
	void *base = MAP_FAILED;
	struct stat st;
	char err[256];

	/* The daemon chose the size, but a size that does not match the
	 * descriptor would make the first access beyond its end a SIGBUS. */
	if (region_size < DFCCL_QP_REGION_SIZE(DFCCL_SQ_MIN_ENTRIES) ||
	    region_size > DFCCL_QP_REGION_SIZE(DFCCL_SQ_MAX_ENTRIES)) {
		r = errors_set(dfcclInternalError, "dfccld sent a queue pair of %llu bytes, outside the sizes the queue ABI allows",
		               (unsigned long long)region_size);
		goto fail;
	}
	if (fstat(memfd, &st) < 0 || (uint64_t)st.st_size < region_size) {
		r = errors_set(dfcclInternalError, "the queue-pair descriptor from dfccld is smaller than the %llu bytes announced",
		               (unsigned long long)region_size);
		goto fail;
	}
	base = mmap(NULL, region_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (base == MAP_FAILED) {
		r = errors_set(dfcclSystemError, "cannot map the queue pair of device %u: mmap: %s", device, strerror(errno));
		goto fail;
	}
	if (queue_header_check(base, region_size, err, sizeof(err)) < 0) {
		r = errors_set(dfcclVersionMismatch, "queue pair of device %u: %s", device, err);
		goto fail;
	}
	struct dfccl_qp_header *h = base;
	if (h->device != device) {
		r = errors_set(dfcclInternalError, "dfccld sent the queue pair of device %u when device %u was asked for",
		               h->device, device);
		goto fail;
	}
	q = calloc(1, sizeof(*q));
	if (q) {
		q->spin_ns = QP_SPIN_NS;
		q->tickets = calloc(h->sq_entries, sizeof(*q->tickets));
		q->reaped = calloc(h->sq_entries, sizeof(*q->reaped));
	}
	if (!q || !q->tickets || !q->reaped) {
		r = errors_set(dfcclSystemError, "out of memory");
		goto fail;
	}
	q->hdr = h;
	q->sq = (struct dfccl_sqe *)((char *)base + h->sq_offset);
	q->cw = (uint64_t *)((char *)base + h->cw_offset);
	q->size = region_size;
	q->entries = h->sq_entries;
	q->device = device;
	q->ordinal = (int)device;
	q->qp_id = h->qp_id;
	q->doorbell = doorbell;
	q->lost = lost;
	pthread_mutex_init(&q->stream_lock, NULL);
	close(memfd);
	*out = q;
	return dfcclSuccess;

fail:
	if (q) {
		free(q->tickets);
		free(q->reaped);
		free(q);
	}
	if (base != MAP_FAILED)
		munmap(base, region_size);
	close(memfd);
	close(doorbell);
	return r;
}

static void words_unwatch(struct qp *q);

void qp_free(struct qp *q)
{
	if (!q)
		return;
	words_unwatch(q);
	if (q->dev_base)
		cudrv_host_unregister(q->hdr, q->ordinal);
	pthread_mutex_destroy(&q->stream_lock);
	munmap(q->hdr, q->size);
	close(q->doorbell);
	free(q->tickets);
	free(q->reaped);
	free(q);
}

/* Whether the queue pair's states (qp_state qs, engine_state es) say its
 * worker died: the supervisor failed its pending entries, then stored
 * DEAD with release. */
static bool qp_worker_dead(uint32_t qs, uint32_t es)
{
	return qs == DFCCL_QP_DEAD || es == DFCCL_ENGINE_DEAD;
}

dfcclResult_t qp_health(const struct qp *q)
{
	uint32_t qs = __atomic_load_n(&q->hdr->qp_state, __ATOMIC_ACQUIRE);
	uint32_t es = __atomic_load_n(&q->hdr->engine_state, __ATOMIC_ACQUIRE);
	if (qp_worker_dead(qs, es))
		return errors_set(dfcclDeviceLost, "the daemon's worker for device %u died; its collectives failed "
		                  "(dfcclctl status shows when it is back)", q->device);
	if (qs == DFCCL_QP_CLOSED)
		return errors_set(dfcclDaemonUnavailable, "dfccld closed the queue pair of device %u", q->device);
	if (__atomic_load_n(q->lost, __ATOMIC_ACQUIRE))
		return errors_set(dfcclDaemonUnavailable, "lost the connection to dfccld while using device %u; "
		                  "is dfccld running? (systemctl status dfccld)", q->device);
	return dfcclSuccess;
}

/*
 * Moves the completion of slot's occupant t (word w) into t and frees the
 * slot. Only the thread that wins the exchange touches t, so a ticket is
 * never written after its owner saw it done and let it go.
 */
static void qp_harvest(struct qp *q, uint32_t slot, struct qp_ticket *t, uint64_t w)
{
	if (!__atomic_compare_exchange_n(&q->tickets[slot], &t, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	uint64_t seq = t->seq;
	t->status = DFCCL_CW_STATUS(w);
	/* The owner may return and reuse t the moment done is set. */
	__atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&q->reaped[slot], seq, __ATOMIC_RELEASE);
}

/* What a wait waits for: the slot's previous occupant `prev` reaped (ticket
 * NULL), or the completion of ticket t. */
struct qp_cond {
	uint32_t slot;
	uint64_t prev;
	struct qp_ticket *ticket;
	uint64_t wait_ms; /* give up after this long; 0: never */
};

bool qp_test(struct qp *q, struct qp_ticket *t)
{
	if (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE))
		return true;
	uint32_t slot = DFCCL_QP_SLOT(t->seq, q->entries);
	uint64_t w = __atomic_load_n(&q->cw[slot], __ATOMIC_ACQUIRE);
	if (DFCCL_CW_SEQ(w) == t->seq)
		qp_harvest(q, slot, t, w);
	return __atomic_load_n(&t->done, __ATOMIC_ACQUIRE);
}

static bool qp_cond_met(struct qp *q, const struct qp_cond *c)
{
	if (c->ticket)
		return qp_test(q, c->ticket);
	if (__atomic_load_n(&q->reaped[c->slot], __ATOMIC_ACQUIRE) >= c->prev)
		return true;
	/* Once the completion word shows entry prev, the slot's ticket can only
	 * be prev's (or already gone), so it is safe to harvest it unseen. An
	 * occupant whose owner abandoned it (qp_abandon) has no ticket: reading
	 * its word here is the read the ABI asks for, and frees the slot. */
	uint64_t w = __atomic_load_n(&q->cw[c->slot], __ATOMIC_ACQUIRE);
	if (DFCCL_CW_SEQ(w) != c->prev)
		return false;
	struct qp_ticket *t = __atomic_load_n(&q->tickets[c->slot], __ATOMIC_ACQUIRE);
	if (t)
		qp_harvest(q, c->slot, t, w);
	else
		__atomic_store_n(&q->reaped[c->slot], c->prev, __ATOMIC_RELEASE);
	return __atomic_load_n(&q->reaped[c->slot], __ATOMIC_ACQUIRE) >= c->prev;
}

/* Longest futex sleep: the waiter wakes this often to check that the
 * queue pair and the daemon are alive. */
#define QP_FUTEX_TIMEOUT_NS 10000000ull

void qp_backoff_pause(struct qp_backoff *b)
{
	if (b->spins < QP_SPINS) {
		b->spins++;
		/* Past the count, keep spinning until the time is up too. */
		if (b->spins == QP_SPINS) {
			uint64_t now = qp_now_ns();
			if (!b->spin_until)
				b->spin_until = now + (b->spin_ns ? b->spin_ns : b->q ? b->q->spin_ns : QP_SPIN_NS);
			if (now < b->spin_until)
				b->spins -= 32;
		}
		if (b->q)
			b->mark = queue_completion_mark(b->q->hdr);
		cpu_relax();
		return;
	}
	if (b->q) {
		if (!b->waiting) {
			/* Count ourselves in, then let the caller check once more
			 * against a fresh mark before the first sleep. */
			__atomic_add_fetch(&b->q->hdr->waiters, 1, __ATOMIC_SEQ_CST);
			b->waiting = true;
			b->mark = queue_completion_mark(b->q->hdr);
			return;
		}
		queue_wait_completion(b->q->hdr, b->mark, QP_FUTEX_TIMEOUT_NS);
		b->mark = queue_completion_mark(b->q->hdr);
		return;
	}
	if (b->delay_ns < QP_SLEEP_MIN_NS)
		b->delay_ns = QP_SLEEP_MIN_NS;
	struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)b->delay_ns};
	nanosleep(&ts, NULL);
	b->delay_ns = b->delay_ns * 2 > QP_SLEEP_MAX_NS ? QP_SLEEP_MAX_NS : b->delay_ns * 2;
}

void qp_backoff_end(struct qp_backoff *b)
{
	if (b->waiting)
		__atomic_sub_fetch(&b->q->hdr->waiters, 1, __ATOMIC_SEQ_CST);
	b->waiting = false;
}

void qp_backoff_reset(struct qp_backoff *b)
{
	b->spins = 0;
	b->spin_until = 0;
	b->delay_ns = 0;
}

bool qp_backoff_sleeping(const struct qp_backoff *b)
{
	return b->spins >= QP_SPINS;
}

/* Polls until c is met, spinning first, then sleeping with a doubling delay;
 * gives up when the queue pair or the connection dies, or after c->wait_ms. */
static dfcclResult_t qp_poll(struct qp *q, const struct qp_cond *c)
{
	struct qp_backoff b = QP_BACKOFF_ON(q);
	dfcclResult_t r = dfcclSuccess;
	uint64_t deadline_ns = c->wait_ms ? qp_now_ns() + c->wait_ms * 1000000ull : 0;
	for (;;) {
		if (qp_cond_met(q, c))
			break;
		if (qp_backoff_sleeping(&b)) {
			r = qp_health(q);
			if (r != dfcclSuccess)
				break;
			qp_heartbeat(q);
			if (deadline_ns && qp_now_ns() > deadline_ns) {
				if (c->ticket)
					r = errors_set(dfcclTimeout, "entry %llu of device %u's submission queue has not "
					               "completed in %llu ms (the stream that arms it may be blocked, or dfccld "
					               "stopped taking entries; dfcclctl queues shows the queue)",
					               (unsigned long long)c->ticket->seq, q->device,
					               (unsigned long long)c->wait_ms);
				else
					r = errors_set(dfcclTimeout, "the submission queue of device %u stayed full for %llu ms: "
					               "its entry %llu has not completed (the stream that arms it may be blocked, "
					               "or dfccld stopped taking entries; dfcclctl queues shows the queue)",
					               q->device, (unsigned long long)c->wait_ms, (unsigned long long)c->prev);
				break;
			}
		}
		qp_backoff_pause(&b);
	}
	qp_backoff_end(&b);
	return r;
}

static void qp_ring(struct qp *q)
{
	uint64_t one = 1;
	ssize_t n;
	/* The counter cannot overflow in practice (the engine drains it on every
	 * wake-up), and a failed ring only delays the engine until its next
	 * poll, so errors other than EINTR are ignored. */
	do {
		n = write(q->doorbell, &one, sizeof(one));
	} while (n < 0 && errno == EINTR);
}

static uint64_t qp_wait_ms;
static pthread_once_t qp_wait_once = PTHREAD_ONCE_INIT;

static void qp_wait_read(void)
{
	const char *v = getenv("DFCCL_QUEUE_WAIT_MS");
	char *end = NULL;
	unsigned long long x = v ? strtoull(v, &end, 10) : 0;
	qp_wait_ms = v && *v && end && !*end && x > 0 ? x : QP_QUEUE_WAIT_MS_DEFAULT;
}

uint64_t qp_queue_wait_ms(void)
{
	pthread_once(&qp_wait_once, qp_wait_read);
	return qp_wait_ms;
}

dfcclResult_t qp_wait_free(struct qp *q, uint64_t wait_ms)
{
	uint64_t s = __atomic_load_n(&q->hdr->sq_tail, __ATOMIC_ACQUIRE) + 1;
	if (s <= q->entries)
		return dfcclSuccess;
	struct qp_cond c = {.slot = DFCCL_QP_SLOT(s, q->entries), .prev = s - q->entries, .wait_ms = wait_ms};
	return qp_poll(q, &c);
}

/*
 * Takes the next sequence number, waits for its slot, and writes every
 * field of the entry but `arm` under ticket t. The engine ignores the slot
 * until arm == seq, and arm still holds the previous lap's number.
 */
/* Posts entry e (unarmed) into the next slot. With `checked` its
 * seq_check is stored too; without, the entry is not finished yet
 * (qp_submit_unarmed) and seq_check gets a value that cannot agree until
 * qp_stream_ready stores it. */
static dfcclResult_t qp_post(struct qp *q, const struct dfccl_sqe *e, struct qp_ticket *t, bool checked)
{
	dfcclResult_t r = qp_health(q);
	if (r != dfcclSuccess)
		return r;

	uint64_t s = __atomic_add_fetch(&q->hdr->sq_tail, 1, __ATOMIC_SEQ_CST);
	uint32_t slot = DFCCL_QP_SLOT(s, q->entries);
	if (s > q->entries) {
		struct qp_cond c = {.slot = slot, .prev = s - q->entries};
		r = qp_poll(q, &c);
		if (r != dfcclSuccess)
			return r;
	}
	/* The slot is ours until our status is reaped: entry s + n waits for
	 * that, so no other thread stores here meanwhile. */
	*t = (struct qp_ticket){.seq = s};
	__atomic_store_n(&q->tickets[slot], t, __ATOMIC_RELEASE);

	struct dfccl_sqe tmp = *e;
	tmp.seq = s;
	if (tmp.flags & DFCCL_SQE_F_DEVICE_DONE)
		tmp.done_off += (uint64_t)slot * sizeof(uint64_t); /* the slot's word */
	struct dfccl_sqe *d = &q->sq[slot];
	/* Every field but `arm` and `seq_check`, then `seq_check` by a store
	 * of its own: stores become visible in program order, so an engine
	 * that reads seq_check's line with this entry's value reads the rest
	 * of the entry's stores too (proto/dfccl_queue.h), whatever order the
	 * copy stored its bytes in. Not yet where the entry may still change:
	 * a value that disagrees first (the earlier lap's would agree with
	 * nothing either, but a line read whole must not pair it with fields
	 * of this lap that are not final). */
	const size_t check = offsetof(struct dfccl_sqe, seq_check), after = check + sizeof(tmp.seq_check);
	if (!checked)
		__atomic_store_n(&d->seq_check, ~(uint32_t)s, __ATOMIC_RELAXED);
	memcpy((char *)d + sizeof(d->arm), (const char *)&tmp + sizeof(tmp.arm), check - sizeof(tmp.arm));
	memcpy((char *)d + after, (const char *)&tmp + after, sizeof(tmp) - after);
	if (checked)
		__atomic_store_n(&d->seq_check, (uint32_t)s, __ATOMIC_RELEASE);
	return dfcclSuccess;
}

/* Rings unless the engine is polling. After a sequentially consistent
 * store of `arm` (or of anything the engine must notice), the load of
 * engine_state below is not reordered before it. */
static void qp_ring_if_idle(struct qp *q)
{
	if (__atomic_load_n(&q->hdr->engine_state, __ATOMIC_SEQ_CST) != DFCCL_ENGINE_POLLING)
		qp_ring(q);
}

void qp_arm(struct qp *q, uint64_t seq)
{
	/* Arm, then read engine_state, with a full barrier between them: a
	 * sequentially consistent store and load are never reordered with each
	 * other (xchg on x86, stlr/ldar on Arm), which is the fence the protocol
	 * asks for, in a form the thread sanitizer understands. The engine
	 * publishes SLEEPING, fences, and scans once more before it sleeps, so
	 * either it sees this entry or we see that it sleeps and ring. The store
	 * also releases the fields written before. */
	__atomic_store_n(&q->sq[DFCCL_QP_SLOT(seq, q->entries)].arm, seq, __ATOMIC_SEQ_CST);
	qp_ring_if_idle(q);
}

dfcclResult_t qp_submit(struct qp *q, const struct dfccl_sqe *e, struct qp_ticket *t)
{
	dfcclResult_t r = qp_post(q, e, t, true);
	if (r != dfcclSuccess)
		return r;
	qp_arm(q, t->seq);
	qp_heartbeat(q);
	return dfcclSuccess;
}

/* Registers the region with the driver once, for the streams of any
 * context of this process. */
static dfcclResult_t qp_stream_map(struct qp *q)
{
	if (__atomic_load_n(&q->dev_base, __ATOMIC_ACQUIRE))
		return dfcclSuccess;
	dfcclResult_t r = dfcclSuccess;
	pthread_mutex_lock(&q->stream_lock);
	if (!q->dev_base) {
		uintptr_t dev;
		if (q->ordinal < 0)
			r = errors_set(dfcclInvalidUsage, "dfccld's device %u is no GPU this process sees, so no stream of "
			               "it can make stream-ordered calls", q->device);
		else if (cudrv_host_register(q->hdr, q->size, q->ordinal, &dev) < 0)
			r = errors_set(dfcclUnhandledCudaError, "cannot register the queue pair of device %u with the CUDA "
			               "driver for stream-ordered calls: %s", q->device, cudrv_last_error());
		else
			__atomic_store_n(&q->dev_base, dev, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&q->stream_lock);
	return r;
}

dfcclResult_t qp_submit_unarmed(struct qp *q, const struct dfccl_sqe *e, struct qp_ticket *t,
                                struct qp_stream_arm *arm)
{
	dfcclResult_t r = qp_stream_map(q);
	if (r != dfcclSuccess)
		return r;
	struct dfccl_sqe tmp = *e;
	tmp.flags |= DFCCL_SQE_F_STREAM_ARMED;
	uintptr_t words = __atomic_load_n(&q->words, __ATOMIC_ACQUIRE);
	if (words) {
		tmp.flags |= DFCCL_SQE_F_DEVICE_DONE;
		tmp.done_reg = q->words_reg;
		tmp.done_off = 0; /* qp_post adds the slot's */
	}
	r = qp_post(q, &tmp, t, false);
	if (r != dfcclSuccess)
		return r;
	uint32_t slot = DFCCL_QP_SLOT(t->seq, q->entries);
	uintptr_t base = q->dev_base;
	arm->seq = t->seq;
	arm->arm_addr = base + (uintptr_t)((char *)&q->sq[slot].arm - (char *)q->hdr);
	arm->cw_addr = words ? words + (uintptr_t)slot * sizeof(uint64_t)
	                     : base + (uintptr_t)((char *)&q->cw[slot] - (char *)q->hdr);
	/* The engine must watch the queue until the stream arms the entry;
	 * a sleeping one is told now (the stream cannot ring). The store of
	 * the tail above was sequentially consistent. */
	qp_ring_if_idle(q);
	qp_heartbeat(q);
	return dfcclSuccess;
}

void qp_stream_ready(struct qp *q, uint64_t seq, uint64_t group_last, uint32_t group_n)
{
	struct dfccl_sqe *e = &q->sq[DFCCL_QP_SLOT(seq, q->entries)];
	if (group_n) {
		e->group_last = group_last;
		e->group_n = group_n;
		e->flags |= DFCCL_SQE_F_GROUP;
	}
	/* Last, as qp_post would have; before the arm, which the stream
	 * stores after this returns. */
	__atomic_store_n(&e->seq_check, (uint32_t)seq, __ATOMIC_RELEASE);
}

/* ---------------------------------------------------------------- device completion words */

static pthread_mutex_t words_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t words_cond = PTHREAD_COND_INITIALIZER;
static struct qp *words_list; /* the queue pairs with device words */
static bool words_thread_started;

/* Whether q's worker died (qp_worker_dead). */
static bool words_dead(const struct qp *q)
{
	return qp_worker_dead(__atomic_load_n(&q->hdr->qp_state, __ATOMIC_ACQUIRE),
	                      __atomic_load_n(&q->hdr->engine_state, __ATOMIC_ACQUIRE));
}

/* The region's words over the device words of dead q: no engine stores
 * into either any more, and per slot the region's word is the later (the
 * engine stores the device word first, the supervisor only the region's),
 * so every stream waiting there sees its entry's failure. */
static void words_release(struct qp *q)
{
	if (cudrv_copy_apart((void *)q->words, q->cw, (size_t)q->entries * sizeof(uint64_t), q->ordinal) < 0)
		fprintf(stderr, "libdfccl: the worker of device %u died, and its streams' completion words could not "
		        "be written: %s; streams waiting on its collectives stay blocked\n", q->device, cudrv_last_error());
}

static void *words_watch(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&words_lock);
	for (;;) {
		while (!words_list)
			pthread_cond_wait(&words_cond, &words_lock);
		/* Once per death seen, and only when no replacement worker
		 * took the queue pair within QP_WORDS_GRACE_MS: the replacement
		 * stores the failed entries' words itself, from its own context
		 * (the CUDA engine's ce_release_words), while this copy goes
		 * through a stream of this process, which can wait behind a
		 * stream on the same hardware queue (stream_waits_on_device).
		 * The copy assumes no engine stores into the words meanwhile:
		 * none serves the queue pair while it reads dead. */
		uint64_t now = qp_now_ns();
		for (struct qp *q = words_list; q; q = q->words_next) {
			if (!words_dead(q)) {
				q->words_dead_ns = 0;
				q->words_released = false;
				continue;
			}
			if (!q->words_dead_ns)
				q->words_dead_ns = now;
			if (!q->words_released && now - q->words_dead_ns >= QP_WORDS_GRACE_MS * 1000000ull) {
				q->words_released = true;
				words_release(q);
			}
		}
		pthread_mutex_unlock(&words_lock);
		struct timespec ts = {0, QP_WORDS_WATCH_MS * 1000000L};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&words_lock);
	}
	return NULL;
}

static void words_unwatch(struct qp *q)
{
	pthread_mutex_lock(&words_lock);
	for (struct qp **pp = &words_list; *pp; pp = &(*pp)->words_next)
		if (*pp == q) {
			*pp = q->words_next;
			break;
		}
	pthread_mutex_unlock(&words_lock);
}

void qp_words_after_fork(void)
{
	pthread_mutex_init(&words_lock, NULL);
	pthread_cond_init(&words_cond, NULL);
	words_list = NULL;
	words_thread_started = false;
}

dfcclResult_t qp_stream_words(struct qp *q, void *words, uint32_t reg_id)
{
	size_t bytes = (size_t)q->entries * sizeof(uint64_t);
	uint64_t *zero = calloc(q->entries, sizeof(uint64_t));
	if (!zero)
		return errors_set(dfcclSystemError, "out of memory");
	int rc = cudrv_copy_apart(words, zero, bytes, q->ordinal);
	free(zero);
	if (rc < 0)
		return errors_set(dfcclUnhandledCudaError, "cannot clear the device completion words of device %u: %s",
		                  q->device, cudrv_last_error());
	pthread_mutex_lock(&words_lock);
	if (!words_thread_started) {
		pthread_t th;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&th, &at, words_watch, NULL) != 0) {
			pthread_attr_destroy(&at);
			pthread_mutex_unlock(&words_lock);
			return errors_set(dfcclSystemError, "cannot start the thread that watches the device completion words");
		}
		pthread_attr_destroy(&at);
		words_thread_started = true;
	}
	q->words_reg = reg_id;
	q->words_next = words_list;
	words_list = q;
	__atomic_store_n(&q->words, (uintptr_t)words, __ATOMIC_RELEASE);
	pthread_cond_signal(&words_cond);
	pthread_mutex_unlock(&words_lock);
	return dfcclSuccess;
}

bool qp_abandon(struct qp *q, struct qp_ticket *t)
{
	/* Take the ticket out of its slot so that nobody writes into it after
	 * we return. If another thread is harvesting it right now, the entry
	 * did complete; wait the moment it takes to say so. */
	struct qp_ticket *expected = t;
	if (__atomic_compare_exchange_n(&q->tickets[DFCCL_QP_SLOT(t->seq, q->entries)], &expected, NULL, false,
	                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		__atomic_store_n(&t->abandoned, 1, __ATOMIC_RELEASE);
		return true;
	}
	/* Another thread took the ticket: a harvester (it completes it) or
	 * another abandoner (it gave it up); wait for whichever says so. */
	for (;;) {
		if (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE))
			return false;
		if (__atomic_load_n(&t->abandoned, __ATOMIC_ACQUIRE))
			return true;
		cpu_relax();
	}
}

dfcclResult_t qp_wait(struct qp *q, struct qp_ticket *t)
{
	return qp_wait_for(q, t, 0);
}

dfcclResult_t qp_wait_for(struct qp *q, struct qp_ticket *t, uint64_t wait_ms)
{
	struct qp_cond c = {.slot = DFCCL_QP_SLOT(t->seq, q->entries), .ticket = t, .wait_ms = wait_ms};
	dfcclResult_t r = qp_poll(q, &c);
	if (r == dfcclSuccess || qp_abandon(q, t))
		return r;
	return dfcclSuccess;
}

dfcclResult_t qp_status_result(uint32_t status, unsigned opcode)
{
	dfcclResult_t r;
	switch (status) {
	case DFCCL_CQ_OK:
		return dfcclSuccess;
	case DFCCL_CQ_NOT_SUPPORTED:
		return errors_set(dfcclNotSupported, "the daemon's engine does not execute %s yet", qp_op_name(opcode));
	case DFCCL_CQ_PEER_LOST:
		r = dfcclRemoteError;
		break;
	case DFCCL_CQ_ABORTED:
		r = dfcclAborted;
		break;
	case DFCCL_CQ_DEVICE_LOST:
		r = dfcclDeviceLost;
		break;
	case DFCCL_CQ_TIMEOUT:
		r = dfcclTimeout;
		break;
	case DFCCL_CQ_MISMATCH:
		r = dfcclInvalidUsage;
		break;
	case DFCCL_CQ_LIMIT:
	case DFCCL_CQ_LIMIT_UID:
		r = dfcclSystemError; /* as the supervisor's resource limits */
		break;
	default:
		/* The engine refused the entry: something in it was wrong. */
		r = dfcclInvalidArgument;
		break;
	}
	return errors_set(r, "%s failed: %s", qp_op_name(opcode), queue_status_string(status));
}

dfcclResult_t qp_run(struct qp *q, const struct dfccl_sqe *e)
{
	struct qp_ticket t;
	dfcclResult_t r = qp_submit(q, e, &t);
	if (r == dfcclSuccess)
		r = qp_wait(q, &t);
	if (r == dfcclSuccess)
		r = qp_status_result(t.status, e->opcode);
	return r;
}
