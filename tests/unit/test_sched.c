/*
 * Tests of the scheduling policy shared by the engines (gpu/scheduler.h): the
 * order of the task queue (FIFO by arrival; by priority, FIFO among equals),
 * the spin thresholds (head of the queue against later positions, the raise
 * after progress, its cap and its reset on preemption), removal keeping the
 * order of the rest, a full queue refusing an insert, and fair admission
 * with its limits per queue pair and per uid.
 *
 * Expected orders are written out by hand, not derived from sched_before.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "scheduler.h"

static const struct sched_params fifo = {
    .spin_head = 1000, .spin_other = 10, .stick_mult = 20, .spin_max = 15000, .order = SCHED_ORDER_FIFO};
static const struct sched_params prio = {
    .spin_head = 1000, .spin_other = 10, .stick_mult = 20, .spin_max = 15000, .order = SCHED_ORDER_PRIORITY};

static struct sched_state states[SCHED_MAX_TASKS + 1];
static struct sched_queue queue;

static void reset(void)
{
	memset(states, 0, sizeof(states));
	memset(&queue, 0, sizeof(queue));
}

/* Task t arrives as number `arrival` with priority p. */
static void arrive(const struct sched_params *p, uint32_t t, uint64_t arrival, int32_t priority)
{
	states[t] = (struct sched_state){.arrival = arrival, .priority = priority, .boost = 1};
	assert_int_equal(sched_insert(p, &queue, states, t), 0);
}

static void expect_order(const uint32_t *want, uint32_t n)
{
	assert_int_equal(queue.n, n);
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(queue.idx[i], want[i]);
}

static void test_fifo_order(void **state)
{
	(void)state;
	reset();
	/* Priorities are ignored under FIFO. */
	arrive(&fifo, 5, 1, 0);
	arrive(&fifo, 2, 2, 9);
	arrive(&fifo, 7, 3, -4);
	arrive(&fifo, 0, 4, 100);
	expect_order((const uint32_t[]){5, 2, 7, 0}, 4);
}

static void test_priority_order(void **state)
{
	(void)state;
	reset();
	arrive(&prio, 1, 1, 0);
	arrive(&prio, 2, 2, 5);
	arrive(&prio, 3, 3, 0);
	arrive(&prio, 4, 4, 5);
	arrive(&prio, 5, 5, -1);
	arrive(&prio, 6, 6, 7);
	/* larger first; FIFO among equal priorities */
	expect_order((const uint32_t[]){6, 2, 4, 1, 3, 5}, 6);
}

static void test_remove_keeps_order(void **state)
{
	(void)state;
	reset();
	for (uint32_t t = 0; t < 6; t++)
		arrive(&prio, t, t + 1, (int32_t)(t % 3));
	/* priorities 0 1 2 0 1 2 -> 2 5 1 4 0 3 */
	expect_order((const uint32_t[]){2, 5, 1, 4, 0, 3}, 6);
	sched_remove_at(&queue, 0);
	expect_order((const uint32_t[]){5, 1, 4, 0, 3}, 5);
	sched_remove_at(&queue, 2);
	expect_order((const uint32_t[]){5, 1, 0, 3}, 4);
	sched_remove_at(&queue, 3);
	expect_order((const uint32_t[]){5, 1, 0}, 3);
	/* A later arrival with an equal priority goes after its equals. */
	arrive(&prio, 9, 10, 1);
	expect_order((const uint32_t[]){5, 1, 9, 0}, 4);
}

static void test_thresholds(void **state)
{
	(void)state;
	struct sched_state s = {.arrival = 1, .priority = 0, .boost = 1};
	assert_int_equal(sched_threshold(&fifo, 0, &s), 1000);
	assert_int_equal(sched_threshold(&fifo, 1, &s), 10);
	assert_int_equal(sched_threshold(&fifo, 500, &s), 10);
	/* A state that was never initialised counts as no boost. */
	s.boost = 0;
	assert_int_equal(sched_threshold(&fifo, 0, &s), 1000);
}

static void test_stickiness(void **state)
{
	(void)state;
	struct sched_state s = {.arrival = 1, .priority = 0, .boost = 1};
	sched_on_progress(&fifo, &s);
	/* The head's is raised by stick_mult, capped at spin_max; a task
	 * behind the head keeps its short spin. */
	assert_int_equal(sched_threshold(&fifo, 0, &s), 15000);
	assert_int_equal(sched_threshold(&fifo, 1, &s), 10);
	assert_int_equal(sched_threshold(&fifo, 500, &s), 10);
	/* Progress again does not compound beyond stick_mult. */
	sched_on_progress(&fifo, &s);
	assert_int_equal(sched_threshold(&fifo, 0, &s), 15000);
	/* Preemption resets it. */
	sched_on_preempt(&s);
	assert_int_equal(sched_threshold(&fifo, 1, &s), 10);
	assert_int_equal(sched_threshold(&fifo, 0, &s), 1000);
	/* A zero multiplier means no raise. */
	struct sched_params flat = fifo;
	flat.stick_mult = 0;
	sched_on_progress(&fifo, &s);
	assert_int_equal(sched_threshold(&fifo, 0, &s), 15000);
	sched_on_progress(&flat, &s);
	assert_int_equal(sched_threshold(&flat, 0, &s), 1000);
}

/* A wait that needs nothing more of its rank spins like a task behind the
 * head, never boosted, and never beyond spin_max. */
static void test_drain_threshold(void **state)
{
	(void)state;
	assert_int_equal(sched_threshold_drain(&fifo), 10);
	struct sched_params tight = fifo;
	tight.spin_max = 4;
	assert_int_equal(sched_threshold_drain(&tight), 4);
}

static void test_queue_full(void **state)
{
	(void)state;
	reset();
	for (uint32_t t = 0; t < SCHED_MAX_TASKS; t++)
		arrive(&fifo, t, t + 1, 0);
	states[SCHED_MAX_TASKS] = (struct sched_state){.arrival = SCHED_MAX_TASKS + 1, .boost = 1};
	assert_int_equal(sched_insert(&fifo, &queue, states, SCHED_MAX_TASKS), -1);
	assert_int_equal(queue.n, SCHED_MAX_TASKS);
	assert_int_equal(queue.idx[0], 0);
	assert_int_equal(queue.idx[SCHED_MAX_TASKS - 1], SCHED_MAX_TASKS - 1);
	/* Room again after a removal. */
	sched_remove_at(&queue, 0);
	assert_int_equal(sched_insert(&fifo, &queue, states, SCHED_MAX_TASKS), 0);
	assert_int_equal(queue.idx[SCHED_MAX_TASKS - 1], SCHED_MAX_TASKS);
}

/* Fair admission: every queue pair's guarantee from the reserve, the rest
 * from the shared part, never past max_inflight nor past either part. A
 * simulation of many queue pairs taking all they may checks the bounds. */
static void test_admission(void **state)
{
	(void)state;
	assert_int_equal(sched_max_inflight(0), SCHED_MAX_INFLIGHT);
	assert_int_equal(sched_max_inflight(7), 7);
	assert_int_equal(sched_max_inflight(SCHED_MAX_INFLIGHT + 5), SCHED_MAX_INFLIGHT);
	/* a fresh queue pair gets its guarantee, then one shared task at a time */
	assert_int_equal(sched_admit_room(0, 0, 0, 100), SCHED_QP_GUARANTEE);
	assert_int_equal(sched_admit_room(SCHED_QP_GUARANTEE, 0, 0, 100), 100 - SCHED_QP_GUARANTEE);
	assert_int_equal(sched_admit_room(SCHED_QP_GUARANTEE, 0, SCHED_SHARED, 100), 0);
	assert_int_equal(sched_admit_room(1, SCHED_RESERVE, 0, 100), 0);
	assert_int_equal(sched_admit_room(1, SCHED_RESERVE - 1, 0, 100), 1);
	assert_int_equal(sched_admit_room(10, 0, 0, 10), 0);
	assert_int_equal(sched_admit_room(2, 0, 0, 3), 1);

	/* 200 queue pairs, the first 20 flooding: each takes what it may in
	 * turn until nobody can take more */
	enum { NQP = 200 };
	static uint32_t inflight[NQP];
	uint32_t reserve = 0, shared = 0, max = 300;
	for (int moved = 1; moved;) {
		moved = 0;
		for (int q = 0; q < NQP; q++) {
			uint32_t want = q < 20 ? 100000 : SCHED_QP_GUARANTEE;
			while (inflight[q] < want && sched_admit_room(inflight[q], reserve, shared, max) > 0) {
				if (sched_admit_reserved(inflight[q]++))
					reserve++;
				else
					shared++;
				moved = 1;
			}
		}
	}
	uint32_t total = 0;
	for (int q = 0; q < NQP; q++) {
		assert_true(inflight[q] <= max);
		total += inflight[q];
	}
	assert_true(reserve <= SCHED_RESERVE && shared <= SCHED_SHARED);
	assert_int_equal(total, reserve + shared);
	assert_true(total <= SCHED_MAX_TASKS);
	/* the quiet queue pairs got their guarantee while the reserve lasted:
	 * 200 x 4 > 512, so the first 128 did, the others found it used up */
	for (int q = 20; q < NQP && (q + 1) * SCHED_QP_GUARANTEE <= SCHED_RESERVE; q++)
		assert_int_equal(inflight[q], SCHED_QP_GUARANTEE);
	assert_int_equal(reserve, SCHED_RESERVE);
	assert_int_equal(shared, SCHED_SHARED);
}

static struct sched_admission admit(uint32_t lqp, uint32_t luid, uint32_t qp, uint32_t uid, uint32_t reserve,
                                uint32_t shared)
{
	struct sched_limits l = {.qp = lqp, .uid = luid};
	struct sched_load n = {.qp = qp, .uid = uid, .reserve = reserve, .shared = shared};
	return sched_admit(&l, &n);
}

/* The decision with both limits: refused at either limit (the queue
 * pair's named first), room within both, and beyond the room as much as
 * both limits leave. */
static void test_admission_limits(void **state)
{
	(void)state;
	assert_int_equal(sched_max_inflight_uid(0), SCHED_DEFAULT_INFLIGHT_UID);
	assert_int_equal(sched_max_inflight_uid(9), 9);
	assert_int_equal(sched_max_inflight_uid(1u << 30), SCHED_MAX_INFLIGHT_UID);
	struct sched_admission a = admit(100, 300, 0, 0, 0, 0);
	assert_int_equal(a.refuse, DFCCL_CQ_OK);
	assert_int_equal(a.room, 4);
	a = admit(100, 300, 4, 50, 0, 0);
	assert_int_equal(a.room, 96);
	/* the uid's limit leaves less than the queue pair's */
	a = admit(100, 300, 4, 290, 0, 0);
	assert_int_equal(a.room, 10);
	a = admit(100, 300, 2, 299, 0, 0);
	assert_int_equal(a.room, 1);
	/* at a limit: refused, with the status naming it */
	a = admit(100, 300, 50, 300, 0, 0);
	assert_int_equal(a.refuse, DFCCL_CQ_LIMIT_UID);
	assert_int_equal(a.room + a.beyond, 0);
	a = admit(100, 300, 100, 300, 0, 0);
	assert_int_equal(a.refuse, DFCCL_CQ_LIMIT);
	a = admit(100, 300, 120, 120, 0, 0);
	assert_int_equal(a.refuse, DFCCL_CQ_LIMIT);
	/* no room in the shared part: beyond it, what the limits leave */
	a = admit(100, 300, 10, 200, 0, SCHED_SHARED);
	assert_int_equal(a.refuse, DFCCL_CQ_OK);
	assert_int_equal(a.room, 0);
	assert_int_equal(a.beyond, 90);
	a = admit(100, 300, 10, 295, 0, SCHED_SHARED);
	assert_int_equal(a.beyond, 5);
	a = admit(100, 300, 1, 1, SCHED_RESERVE, 0);
	assert_int_equal(a.room, 0);
	assert_int_equal(a.beyond, 99);
	/* with room, nothing is taken beyond it */
	a = admit(100, 300, 10, 10, 0, 0);
	assert_true(a.room > 0);
	assert_int_equal(a.beyond, 0);

	/* 3 uids of 10 queue pairs each take what they may: each uid stops at
	 * its limit, none of its queue pairs at its own, and the shared part is
	 * shared between the uids */
	enum { NUID = 3, PER = 10 };
	const uint32_t lqp = 100, luid = 120;
	static uint32_t qp[NUID * PER], uid[NUID];
	uint32_t reserve = 0, shared = 0;
	for (int moved = 1; moved;) {
		moved = 0;
		for (int q = 0; q < NUID * PER; q++) {
			a = admit(lqp, luid, qp[q], uid[q / PER], reserve, shared);
			assert_int_equal(a.refuse == DFCCL_CQ_OK, qp[q] < lqp && uid[q / PER] < luid);
			for (uint32_t k = 0; k < a.room; k++) {
				if (sched_admit_reserved(qp[q]++))
					reserve++;
				else
					shared++;
				uid[q / PER]++;
				moved = 1;
			}
		}
	}
	for (int u = 0; u < NUID; u++)
		assert_int_equal(uid[u], luid);
	for (int q = 0; q < NUID * PER; q++)
		assert_true(qp[q] < lqp);
	assert_int_equal(reserve, NUID * PER * SCHED_QP_GUARANTEE);
	assert_int_equal(shared, NUID * (luid - PER * SCHED_QP_GUARANTEE));
	/* each uid's first queue pair took what the uid's limit left */
	assert_int_equal(qp[0], luid - (PER - 1) * SCHED_QP_GUARANTEE);
}

/* Looks beyond the room resume where the last stopped, within the entries
 * not yet taken. */
static void test_look_start(void **state)
{
	(void)state;
	assert_int_equal(sched_look_start(0, 5, 40), 5);
	assert_int_equal(sched_look_start(21, 5, 40), 21);
	assert_int_equal(sched_look_start(40, 5, 40), 40);
	assert_int_equal(sched_look_start(41, 5, 40), 5); /* past the tail: from the head again */
	assert_int_equal(sched_look_start(3, 5, 40), 5);  /* behind the head */
	assert_int_equal(sched_look_start(5, 5, 4), 5);   /* nothing to take */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_fifo_order),  cmocka_unit_test(test_priority_order),
	    cmocka_unit_test(test_remove_keeps_order), cmocka_unit_test(test_thresholds),
	    cmocka_unit_test(test_stickiness),  cmocka_unit_test(test_queue_full),
	    cmocka_unit_test(test_drain_threshold), cmocka_unit_test(test_admission),
	    cmocka_unit_test(test_admission_limits), cmocka_unit_test(test_look_start),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
