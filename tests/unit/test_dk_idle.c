/*
 * Tests of how long the daemon kernel stays idle after a stream-armed entry
 * (gpu/cuda/dkernel.h: dk_stream_idle), which the queue reader works out
 * at every launch from the idle the last launch kept and how soon this
 * launch followed that one's quit: doubling while launches follow quits
 * within DK_STREAM_BACK_NS, up to 40 us or kernel-idle-us, halving back to
 * launch-gate-idle-us after longer gaps, and never moving from a setting
 * of 0 (a launch per collective). Expected values are written out, not
 * computed by the function again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cuda/dkernel.h"

#define US 1000ull
#define MS 1000000ull

/* The reader's sequence of launches: each quits at q[i] and the next
 * begins at b[i]; returns the idle the last one keeps. */
static uint64_t run(uint64_t base, uint64_t idle, const uint64_t *gap_ns, int n, uint64_t *seen)
{
	uint64_t cur = 0, quit = 0, now = 1 * MS;
	for (int i = 0; i < n; i++) {
		cur = dk_stream_idle(base, idle, cur, quit, now);
		seen[i] = cur;
		quit = now + 50 * US; /* the launch's work, then its idle */
		now = quit + gap_ns[i];
	}
	return cur;
}

static void first_launch_keeps_the_base(void **state)
{
	(void)state;
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, 0, 0, 7 * MS), 5 * US);
	/* A stored idle within its bounds is kept where no quit came before. */
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, 20 * US, 0, 7 * MS), 20 * US);
	/* One outside them (a state never stored, another setting) is the base. */
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, 3 * US, 0, 7 * MS), 5 * US);
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, 41 * US, 0, 7 * MS), 5 * US);
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, UINT64_MAX, 6 * MS, 7 * MS), 5 * US);
}

static void back_to_back_grows_to_the_bound(void **state)
{
	(void)state;
	const uint64_t gaps[6] = {30 * US, 30 * US, 30 * US, 30 * US, 30 * US, 30 * US};
	uint64_t seen[6];
	run(5 * US, 5 * MS, gaps, 6, seen);
	const uint64_t want[6] = {5 * US, 10 * US, 20 * US, 40 * US, 40 * US, 40 * US};
	for (int i = 0; i < 6; i++)
		assert_int_equal(seen[i], want[i]);
	/* Just inside and at DK_STREAM_BACK_NS. */
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, 10 * US, 1 * MS, 1 * MS + 99999), 20 * US);
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, 10 * US, 1 * MS, 1 * MS + 100 * US), 5 * US);
}

static void compute_between_calls_comes_back_to_the_base(void **state)
{
	(void)state;
	/* Grown by back-to-back calls, then a trainer's 500 us kernels between. */
	const uint64_t gaps[8] = {10 * US, 10 * US, 10 * US, 500 * US, 500 * US, 500 * US, 500 * US, 500 * US};
	uint64_t seen[8];
	run(5 * US, 5 * MS, gaps, 8, seen);
	const uint64_t want[8] = {5 * US, 10 * US, 20 * US, 40 * US, 20 * US, 10 * US, 5 * US, 5 * US};
	for (int i = 0; i < 8; i++)
		assert_int_equal(seen[i], want[i]);
	/* An odd base: halving stops at it. */
	assert_int_equal(dk_stream_idle(7 * US, 5 * MS, 12 * US, 1 * MS, 2 * MS), 7 * US);
}

static void bounds_from_the_settings(void **state)
{
	(void)state;
	/* A setting of 0: a launch per stream-ordered collective, always. */
	const uint64_t fast[4] = {1 * US, 1 * US, 1 * US, 1 * US};
	uint64_t seen[4];
	assert_int_equal(run(0, 5 * MS, fast, 4, seen), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(seen[i], 0);
	/* kernel-idle-us below 40 us bounds the growth. */
	assert_int_equal(dk_stream_idle(5 * US, 8 * US, 5 * US, 1 * MS, 1 * MS + 10 * US), 8 * US);
	/* A base above the bound stays (the kernel never keeps less than asked). */
	assert_int_equal(dk_stream_idle(50 * US, 5 * MS, 50 * US, 1 * MS, 1 * MS + 10 * US), 50 * US);
	assert_int_equal(dk_stream_idle(50 * US, 5 * MS, 50 * US, 1 * MS, 3 * MS), 50 * US);
	/* The gate off: stream_idle_ns is idle_ns, which the growth cannot pass. */
	assert_int_equal(dk_stream_idle(5 * MS, 5 * MS, 5 * MS, 1 * MS, 1 * MS + 10 * US), 5 * MS);
	/* A launch stamped before the quit (no order the clock gives): unchanged. */
	assert_int_equal(dk_stream_idle(5 * US, 5 * MS, 20 * US, 2 * MS, 1 * MS), 20 * US);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(first_launch_keeps_the_base),
	    cmocka_unit_test(back_to_back_grows_to_the_bound),
	    cmocka_unit_test(compute_between_calls_comes_back_to_the_base),
	    cmocka_unit_test(bounds_from_the_settings),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
