/*
 * Tests of the early take's choices (gpu/cuda/dkernel.h: dk_early_looks,
 * dk_early_fits, dk_idle_step): which unarmed heads the queue reader looks
 * at after misses, which entries it takes before their arm, and what it
 * does after a pass with nothing but such tasks live. Expected values are
 * written out, not computed by the functions again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/dkernel.h"

#define US 1000ull

static void looks_at_every_head_until_two_misses(void **state)
{
	(void)state;
	for (uint64_t head = 1; head < 40; head++) {
		assert_true(dk_early_looks(0, head));
		assert_true(dk_early_looks(1, head));
	}
	/* Then only every 16th head, whatever the count beyond. */
	int looked = 0;
	for (uint64_t head = 1; head <= 64; head++)
		looked += dk_early_looks(2, head);
	assert_int_equal(looked, 4);
	assert_true(dk_early_looks(2, 16));
	assert_true(dk_early_looks(7, 48));
	assert_false(dk_early_looks(2, 17));
	assert_false(dk_early_looks(9, 31));
}

/* A stream-ordered all-reduce posted as `seq`. */
static struct dfccl_sqe stream_entry(uint64_t seq)
{
	struct dfccl_sqe e;
	memset(&e, 0, sizeof(e));
	e.seq = seq;
	e.flags = DFCCL_SQE_F_STREAM_ARMED;
	e.opcode = DFCCL_OP_ALLREDUCE;
	return e;
}

static void takes_a_lone_stream_collective_early(void **state)
{
	(void)state;
	struct dfccl_sqe e = stream_entry(9);
	assert_true(dk_early_fits(&e, 9, 1, 2));
	assert_true(dk_early_fits(&e, 9, 1, 100));
	e.opcode = DFCCL_OP_BROADCAST;
	assert_true(dk_early_fits(&e, 9, 1, 2));
}

static void leaves_the_others_for_their_arm(void **state)
{
	(void)state;
	struct dfccl_sqe e = stream_entry(9);
	/* Another lap's entry, or one not posted under this sequence yet. */
	assert_false(dk_early_fits(&e, 10, 1, 2));
	/* Its checks failed, or several channels (not simple). */
	assert_false(dk_early_fits(&e, 9, 0, 2));
	/* The pair's last room stays for an armed entry. */
	assert_false(dk_early_fits(&e, 9, 1, 1));
	assert_false(dk_early_fits(&e, 9, 1, 0));
	/* Armed by the CPU. */
	e.flags = 0;
	assert_false(dk_early_fits(&e, 9, 1, 2));
	/* In a group. */
	e.flags = DFCCL_SQE_F_STREAM_ARMED | DFCCL_SQE_F_GROUP;
	assert_false(dk_early_fits(&e, 9, 1, 2));
	/* Sends and receives. */
	e = stream_entry(9);
	e.opcode = DFCCL_OP_SEND;
	assert_false(dk_early_fits(&e, 9, 1, 2));
	e.opcode = DFCCL_OP_RECV;
	assert_false(dk_early_fits(&e, 9, 1, 2));
}

static void work_keeps_the_reader_going(void **state)
{
	(void)state;
	/* A pass that took entries, or live tasks not all taken early. */
	assert_int_equal(dk_idle_step(1, 0, 0, 10 * US, 5 * US), DK_IDLE_ACTIVE);
	assert_int_equal(dk_idle_step(0, 3, 0, 900 * US, 5 * US), DK_IDLE_ACTIVE);
	assert_int_equal(dk_idle_step(0, 3, 2, 900 * US, 5 * US), DK_IDLE_ACTIVE);
	assert_int_equal(dk_idle_step(2, 1, 1, 900 * US, 5 * US), DK_IDLE_ACTIVE);
}

static void early_tasks_alone_go_back_after_the_wait(void **state)
{
	(void)state;
	/* Whatever the idle: 50 us, not the kernel's idle, for them. */
	assert_int_equal(dk_idle_step(0, 1, 1, 49 * US, 5 * US), DK_IDLE_WAIT);
	assert_int_equal(dk_idle_step(0, 1, 1, 50 * US, 5 * US), DK_IDLE_GIVE_BACK);
	assert_int_equal(dk_idle_step(0, 2, 2, 50 * US, 200 * US), DK_IDLE_GIVE_BACK);
	assert_int_equal(dk_idle_step(0, 2, 2, 10 * US, 1 * US), DK_IDLE_WAIT);
}

static void nothing_live_quits_after_the_idle(void **state)
{
	(void)state;
	assert_int_equal(dk_idle_step(0, 0, 0, 4 * US, 5 * US), DK_IDLE_WAIT);
	assert_int_equal(dk_idle_step(0, 0, 0, 5 * US, 5 * US), DK_IDLE_QUIT);
	assert_int_equal(dk_idle_step(0, 0, 0, 0, 0), DK_IDLE_QUIT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(looks_at_every_head_until_two_misses),
	    cmocka_unit_test(takes_a_lone_stream_collective_early),
	    cmocka_unit_test(leaves_the_others_for_their_arm),
	    cmocka_unit_test(work_keeps_the_reader_going),
	    cmocka_unit_test(early_tasks_alone_go_back_after_the_wait),
	    cmocka_unit_test(nothing_live_quits_after_the_idle),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
