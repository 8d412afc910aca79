/*
 * The scheduling policy of a daemon (DFCCL, section 4), written once for
 * both engines: plain C in static inline functions that compile as host
 * code and, under nvcc, as device code (DFCCL_HD).
 *
 * Two-phase blocking: a task waiting on a peer polls up to a spin threshold
 * and is then preempted. Adaptive stickiness: the head of the task queue
 * gets the largest threshold and later entries smaller ones, and a head
 * that made progress has its threshold raised, so the ranks of one
 * collective tend to stay on it together (gang scheduling without
 * coordination). Ordering: FIFO by arrival by default; by priority (larger
 * first, FIFO among equals) when the client gives priorities.
 *
 * The task queue here is an array of task indices kept in order; the
 * engines own the task storage. Everything is bounded: no allocation.
 */
#ifndef DFCCL_SCHEDULER_H
#define DFCCL_SCHEDULER_H

#include <stdint.h>

#include "dfccl_queue.h" /* DFCCL_HD */

/* Not SCHED_FIFO: <sched.h> (and so <pthread.h>) defines that name as a
 * macro, which after this header would turn a FIFO order into priority. */
enum sched_order { SCHED_ORDER_FIFO = 0, SCHED_ORDER_PRIORITY = 1 };

struct sched_params {
	uint32_t spin_head;   /* spin threshold of the head of the queue (polls) */
	uint32_t spin_other;  /* spin threshold of every later task */
	uint32_t stick_mult;  /* a task that progressed gets threshold * stick_mult ... */
	uint32_t spin_max;    /* ... up to this */
	uint32_t order;       /* enum sched_order */
};

/* Per-task scheduling state (part of the engine's task). */
struct sched_state {
	uint64_t arrival;     /* engine-wide arrival number: FIFO order */
	int32_t priority;     /* larger first under SCHED_ORDER_PRIORITY */
	uint32_t boost;       /* multiplier earned by progress (1: none) */
};

#define SCHED_MAX_TASKS 1024u

struct sched_queue {
	uint32_t n;
	uint32_t idx[SCHED_MAX_TASKS]; /* task indices, in run order */
};

/*
 * Fair admission. The task queue holds SCHED_MAX_TASKS tasks; a collective
 * whose peers never post stays in it, so whoever fills it stalls everyone
 * on the device. An engine therefore takes entries from a queue pair only
 * while it holds fewer tasks than it may, and otherwise leaves them in the
 * client's own submission queue (whose slots the client's library waits
 * for): half the task queue is a reserve from which each queue pair may
 * hold SCHED_QP_GUARANTEE tasks, the other half is shared, no queue pair
 * holds more than its limit (the max-inflight-per-session setting), and the
 * queue pairs of one uid hold no more than theirs together
 * (max-inflight-per-uid). An entry that arrives while its queue pair, or
 * its uid, already holds its limit is refused with DFCCL_CQ_LIMIT, or
 * DFCCL_CQ_LIMIT_UID. So a queue pair always finds a place for its first
 * SCHED_QP_GUARANTEE collectives while fewer than SCHED_RESERVE /
 * SCHED_QP_GUARANTEE queue pairs hold theirs (the supervisor's
 * max-qps-per-uid keeps one user below that).
 *
 * Beyond its room (but within both limits) a queue pair's entry is still
 * admitted when another rank already posted its instance
 * (dfccl_comm_peer_posted): ranks that submit more collectives than their
 * guarantee, in different orders, would otherwise wait for each other's
 * entries forever while other sessions fill the shared part. Such entries
 * count against the parts like any other (which may then go over), so an
 * engine holds at most SCHED_MAX_TASKS tasks plus those, each of which
 * completes an instance its peers wait on, and no uid holds more than its
 * limit.
 *
 * Why any order still completes. Take tasks that are all blocked while
 * other sessions hold the shared part. Each has posted its instance
 * (collectives their key, sends their message, receives their `want`:
 * proto/dfccl_comm.h) and waits for the other ranks' parts of it, or waits
 * to post until an earlier instance of its communicator that uses the same
 * slot or mailbox is over, which the same holds for. The other ranks'
 * entries of a posted instance, once armed, read as peer-posted to their
 * engines, which take them beyond the room: an engine looks at
 * SCHED_BEYOND_LOOKS entries beyond the room per looking pass (the daemon
 * kernel's reader looks past an unarmed head on every 4th pass at most,
 * down to every 32nd while those looks find nothing armed: dkernel.cu's
 * look_past), each resuming where the last stopped
 * (sched_look_start), so every armed entry is looked at within a bounded
 * number of passes. Only the limits end this, with an
 * error that names them. Sends are why receives post `want`: without it,
 * two ranks whose admitted tasks are receives from each other and whose
 * sends lie beyond the room would wait for each other forever. A task the
 * daemon kernel took before its stream armed it (dkernel.cu, early_take)
 * is charged like any other but has posted nothing, and its arm may wait
 * for another stream's collective: it needs room for one more entry of
 * its pair when it is taken, and where a pair then finds no room (the
 * parts used up) every such task goes back to its queue, so that the room
 * goes to armed entries, as above. (A pair at its own limit refuses
 * entries instead of looking for room.)
 */
#define SCHED_QP_GUARANTEE 4u
#define SCHED_RESERVE (SCHED_MAX_TASKS / 2)
#define SCHED_SHARED (SCHED_MAX_TASKS - SCHED_RESERVE)
#define SCHED_MAX_INFLIGHT SCHED_SHARED
/* One uid's tasks: as many as the task queue holds by default. Fair
 * admission alone keeps a uid's share below that (its queue pairs'
 * guarantees and the shared part, while it has fewer than SCHED_RESERVE /
 * SCHED_QP_GUARANTEE queue pairs), so the default refuses only what goes
 * beyond the room, and bounds it; a smaller setting caps a user's share. */
#define SCHED_DEFAULT_INFLIGHT_UID SCHED_MAX_TASKS
#define SCHED_MAX_INFLIGHT_UID (4u * SCHED_MAX_TASKS)

/* The limits as an engine applies them. */
struct sched_limits {
	uint32_t qp;  /* tasks one queue pair may hold (max-inflight-per-session) */
	uint32_t uid; /* tasks the queue pairs of one uid may hold together (max-inflight-per-uid) */
};

/* What holds tasks when a queue pair's entries are looked at. */
struct sched_load {
	uint32_t qp;      /* the queue pair's tasks in the engine */
	uint32_t uid;     /* the tasks of every queue pair of its uid */
	uint32_t reserve; /* the engine's tasks charged to the reserve (sched_admit_reserved) */
	uint32_t shared;  /* the engine's tasks charged to the shared part */
};

/* What the queue pair's entries may do now. */
struct sched_admission {
	uint32_t refuse; /* DFCCL_CQ_OK, or the DFCCL_CQ_LIMIT* status its entries are refused with */
	uint32_t room;   /* entries that may enter */
	uint32_t beyond; /* with room 0: entries whose instance a peer posted that may still enter */
};

/* max-inflight-per-session as an engine applies it (0: the most). */
static inline DFCCL_HD uint32_t sched_max_inflight(uint32_t setting)
{
	return setting && setting < SCHED_MAX_INFLIGHT ? setting : SCHED_MAX_INFLIGHT;
}

/* max-inflight-per-uid as an engine applies it (0: the default). */
static inline DFCCL_HD uint32_t sched_max_inflight_uid(uint32_t setting)
{
	if (!setting)
		return SCHED_DEFAULT_INFLIGHT_UID;
	return setting < SCHED_MAX_INFLIGHT_UID ? setting : SCHED_MAX_INFLIGHT_UID;
}

/* Whether the next task of a queue pair that holds `inflight` counts
 * against the reserve (else against the shared part). */
static inline DFCCL_HD int sched_admit_reserved(uint32_t inflight)
{
	return inflight < SCHED_QP_GUARANTEE;
}

static inline DFCCL_HD uint32_t sched_min(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* How many more entries of a queue pair holding `inflight` tasks may enter
 * an engine whose tasks use reserve_used of the reserve and shared_used of
 * the shared part, the queue pair's limit being max_inflight (its uid's is
 * sched_admit's). */
static inline DFCCL_HD uint32_t sched_admit_room(uint32_t inflight, uint32_t reserve_used, uint32_t shared_used,
                                                 uint32_t max_inflight)
{
	if (inflight >= max_inflight)
		return 0;
	uint32_t room;
	if (sched_admit_reserved(inflight)) {
		uint32_t left = reserve_used < SCHED_RESERVE ? SCHED_RESERVE - reserve_used : 0;
		room = sched_min(SCHED_QP_GUARANTEE - inflight, left);
	} else {
		room = shared_used < SCHED_SHARED ? SCHED_SHARED - shared_used : 0;
	}
	return sched_min(room, max_inflight - inflight);
}

/* The whole admission decision for a queue pair's next entries. */
static inline DFCCL_HD struct sched_admission sched_admit(const struct sched_limits *l, const struct sched_load *n)
{
	struct sched_admission a = {DFCCL_CQ_OK, 0, 0};
	if (n->qp >= l->qp) {
		a.refuse = DFCCL_CQ_LIMIT;
		return a;
	}
	if (n->uid >= l->uid) {
		a.refuse = DFCCL_CQ_LIMIT_UID;
		return a;
	}
	uint32_t left = sched_min(l->qp - n->qp, l->uid - n->uid);
	a.room = sched_min(sched_admit_room(n->qp, n->reserve, n->shared, l->qp), left);
	a.beyond = a.room ? 0 : left;
	return a;
}

/*
 * Taking in order. The order tasks arrive in is the order every block
 * runs them in, and ranks on different GPUs gang-schedule a collective
 * only when their engines run it at the same position (the head's long
 * spin). A stream arms a group's entries one after the other while an
 * engine's pass reads their arm words, so a pass may find entries armed
 * past one that is not yet: taking those first gives each GPU its own
 * order, and then each GPU's head waits on a collective its peer runs
 * behind its own head, visited once a round. (On 2 GPUs, 150
 * stream-ordered all-reduces of 1 MiB in one group took about 1 ms each,
 * with 160 preemptions each, against 70 us in the callback form, which
 * arms one entry at a time: the orders differing is the likely cause.)
 * So a pass whose first entry not yet taken (the
 * head) is armed takes the run of armed entries from the head and ends
 * at its first gap; the entries past the gap wait for the next pass. A
 * pass whose head is not armed looks past it as before (in the daemon
 * kernel, at most every 4th such pass: look_past), so that an entry armed out
 * of order (several streams), or one that an entry before it waits for,
 * is still taken -- once a looking pass finds the head not armed.
 * Such a pass takes an entry past entries not taken only if none of them
 * reads armed when loaded again after that entry's arm word: a stream
 * arms in order, each write after a fence, so one of them armed first
 * shows then, where the pass's first look at it came too early or did not
 * come at all (the daemon kernel's sweep, which then starts at it on the
 * next pass). Only entries of different streams, armed at about
 * the same moment (in the daemon kernel, within a few passes, up to
 * about 32 while its looks back off: dkernel.cu's look_past), can still
 * be taken in different orders by different GPUs. The check costs a pass a read of those entries' arm words for
 * each entry it takes out of order.
 */

/* Entries beyond a queue pair's room an engine looks at per looking pass
 * for one whose instance a peer posted: a flooder's full queue must not
 * cost every pass a scan. */
#define SCHED_BEYOND_LOOKS 16u

/* Where a pass looking beyond the room starts: where the last one stopped
 * (look), unless that is outside the entries not yet taken [head, tail]. */
static inline DFCCL_HD uint64_t sched_look_start(uint64_t look, uint64_t head, uint64_t tail)
{
	return look > head && look <= tail ? look : head;
}

/* Defaults: the head's measured for the host engine (DFCCL used 100,000
 * for the head and 20x after success on GPUs). The others' spin is short:
 * on a GPU a poll costs about 0.3 us, and measured on 2 GPUs with 150
 * all-reduces in flight (dfccl-perf --batch 150), 200 polls made 4 KiB in
 * one group of stream-ordered calls 141 us per all-reduce and 1 MiB
 * callbacks 202 us, 8 polls 53 and 71 us, with single all-reduces
 * unchanged. */
#define SCHED_DEFAULT_SPIN_HEAD 20000u
#define SCHED_DEFAULT_SPIN_OTHER 8u
#define SCHED_DEFAULT_STICK_MULT 20u
#define SCHED_DEFAULT_SPIN_MAX 2000000u

/* Whether task a runs before task b. */
static inline DFCCL_HD int sched_before(const struct sched_params *p, const struct sched_state *a,
                                        const struct sched_state *b)
{
	if (p->order == SCHED_ORDER_PRIORITY && a->priority != b->priority)
		return a->priority > b->priority;
	return a->arrival < b->arrival;
}

/*
 * The spin threshold of the task at `position` in the queue (0: head).
 * Stickiness raises the head's only: a task behind the head keeps the short
 * spin whatever it earned, because its peers run their own queues in their
 * own order, and a long spin there -- say on a post that a peer's block,
 * busy with another task, will not make for a while -- holds up the head
 * and every other task of this block (measured on 2 GPUs: 150 collectives
 * in flight, each boosted wait behind the head cost milliseconds, and the
 * batch took 10x the time of its collectives one by one).
 */
static inline DFCCL_HD uint32_t sched_threshold(const struct sched_params *p, uint32_t position,
                                                const struct sched_state *s)
{
	uint64_t t = position == 0 ? (uint64_t)p->spin_head * (s->boost ? s->boost : 1u) : p->spin_other;
	return t > p->spin_max ? p->spin_max : (uint32_t)t;
}

/*
 * The threshold of a wait that needs nothing more of this rank: its peers
 * finishing with its buffers (the end of a collective, a sender waiting for
 * the receiver's acknowledgement). The head's long, boosted spin exists to
 * gang-schedule an instance whose peers are about to arrive; here the peers
 * go on without us, and spinning would only keep this engine's other tasks
 * -- perhaps the very ones those peers wait for -- from running.
 */
static inline DFCCL_HD uint32_t sched_threshold_drain(const struct sched_params *p)
{
	return p->spin_other < p->spin_max ? p->spin_other : p->spin_max;
}

/* A primitive of the task succeeded: raise its stickiness. */
static inline DFCCL_HD void sched_on_progress(const struct sched_params *p, struct sched_state *s)
{
	s->boost = p->stick_mult ? p->stick_mult : 1u;
}

/* The task was preempted: it starts from the base threshold next time. */
static inline DFCCL_HD void sched_on_preempt(struct sched_state *s)
{
	s->boost = 1u;
}

/*
 * Inserts task index `t` with state states[t] in order. Returns 0, or -1
 * when the queue is full.
 */
static inline DFCCL_HD int sched_insert(const struct sched_params *p, struct sched_queue *q,
                                        const struct sched_state *states, uint32_t t)
{
	if (q->n >= SCHED_MAX_TASKS)
		return -1;
	uint32_t i = q->n;
	while (i > 0 && sched_before(p, &states[t], &states[q->idx[i - 1]])) {
		q->idx[i] = q->idx[i - 1];
		i--;
	}
	q->idx[i] = t;
	q->n++;
	return 0;
}

/* Removes the entry at `position`, keeping the order of the rest. */
static inline DFCCL_HD void sched_remove_at(struct sched_queue *q, uint32_t position)
{
	for (uint32_t i = position; i + 1 < q->n; i++)
		q->idx[i] = q->idx[i + 1];
	q->n--;
}

#endif /* DFCCL_SCHEDULER_H */
