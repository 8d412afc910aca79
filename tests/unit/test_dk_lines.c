/*
 * Tests of the layout and flags of a pushed all-reduce's lines
 * (gpu/cuda/dkernel.h, DK_PUSH_LL), which the daemon kernel and the worker
 * that allocates the area share: the flag is never 0 (the zeroed area reads
 * as "nothing came") and differs between the instances that share a slot,
 * also across the 2^32 wrap; a source's region holds its lines and the
 * last one for every size dk_ll_fits accepts, and the regions of a slot
 * stay inside it for every rank count; the per-rank allocation is the
 * connectors followed by the area. Also the size rule of a one-shot
 * all-reduce (dk_oneshot_size_fits), which the kernel applies per task,
 * and the order in which an all-gather's channels take the ranks' blocks
 * (dk_gather_source).
 *
 * Expected flags are worked out by hand from the definition (key mod
 * 2^32 - 1, plus one), not by calling a second implementation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cuda/dkernel.h"

static void flag_values(void **state)
{
	(void)state;
	assert_int_equal(dk_ll_flag(0), 1);
	assert_int_equal(dk_ll_flag(1), 2);
	assert_int_equal(dk_ll_flag(41), 42);
	assert_int_equal(dk_ll_flag(0xFFFFFFFEull), 0xFFFFFFFFu);
	/* 2^32 - 1 = 0 (mod 2^32 - 1): the flag of key 0 again, never 0. */
	assert_int_equal(dk_ll_flag(0xFFFFFFFFull), 1);
	assert_int_equal(dk_ll_flag(0x100000000ull), 2);
	assert_int_equal(dk_ll_flag(0x100000005ull), 7);
	/* 3 * (2^32 - 1) + 10 */
	assert_int_equal(dk_ll_flag(3ull * 0xFFFFFFFFull + 10u), 11);
	assert_int_equal(dk_ll_flag(UINT64_MAX), 1); /* 2^64 - 1 is a multiple of 2^32 - 1 */
}

static void flag_never_zero_and_slots_differ(void **state)
{
	(void)state;
	/* Keys near every boundary of the folding, and the keys that share an
	 * instance slot with each (the slot counts of dfccl_comm.h). */
	const uint64_t bases[] = {1, 1000, 0xFFFFFF00ull, 0xFFFFFFFFull - 40u, 0x1FFFFFFF0ull, 0xFFFFFFFF00000000ull,
	                          UINT64_MAX - 5000u};
	const uint64_t apart[] = {DFCCL_COMM_SLOTS, DFCCL_COMM_COLL_SLOTS, DFCCL_COMM_CONN_SLOTS};
	for (size_t b = 0; b < sizeof(bases) / sizeof(bases[0]); b++)
		for (uint64_t k = bases[b]; k < bases[b] + 2000u && k >= bases[b]; k++) {
			assert_int_not_equal(dk_ll_flag(k), 0);
			for (size_t a = 0; a < sizeof(apart) / sizeof(apart[0]); a++)
				if (k + apart[a] > k)
					assert_int_not_equal(dk_ll_flag(k), dk_ll_flag(k + apart[a]));
		}
}

static void regions_hold_their_lines(void **state)
{
	(void)state;
	/* Data lines: 8 bytes each, the last one partly filled. */
	assert_int_equal(dk_ll_lines(0), 0);
	assert_int_equal(dk_ll_lines(1), 1);
	assert_int_equal(dk_ll_lines(8), 1);
	assert_int_equal(dk_ll_lines(9), 2);
	assert_int_equal(dk_ll_lines(DK_LL_MAX_BYTES), DK_LL_MAX_BYTES / 8);
	assert_int_equal(dk_ll_room(1), 0);
	assert_false(dk_ll_fits(8, 1));
	for (uint32_t n = 2; n <= DFCCL_COMM_MAX_RANKS; n++) {
		uint32_t room = dk_ll_room(n);
		assert_int_equal(room % 16u, 0);
		assert_true((uint64_t)room * (n - 1) <= DK_LL_SLOT_BYTES);
		uint64_t largest = 0;
		for (uint64_t bytes = 1; bytes <= DK_LL_MAX_BYTES + 64u; bytes++)
			if (dk_ll_fits(bytes, n)) {
				/* The data lines and the last one, inside the region. */
				assert_true(((bytes + 7u) / 8u + 1u) * 16u <= room);
				assert_true(bytes <= DK_LL_MAX_BYTES);
				largest = bytes;
			}
		/* Every size up to the largest fits (no gaps), and the largest
		 * leaves no whole line unused. */
		for (uint64_t bytes = 1; bytes <= largest; bytes++)
			assert_true(dk_ll_fits(bytes, n));
		if (largest < DK_LL_MAX_BYTES)
			assert_true(((largest + 7u) / 8u + 1u) * 16u + 16u > room);
	}
	/* Two ranks carry the largest size the setting allows. */
	assert_true(dk_ll_fits(DK_LL_MAX_BYTES, 2));
	assert_false(dk_ll_fits(DK_LL_MAX_BYTES + 1u, 2));
}

static void area_follows_connectors(void **state)
{
	(void)state;
	assert_int_equal(DK_LL_AREA_OFFSET, (uint64_t)DFCCL_COMM_CONN_SLOTS * DFCCL_COMM_CONN_BYTES);
	assert_int_equal(DK_CONN_RANK_BYTES, DK_LL_AREA_OFFSET + (uint64_t)DFCCL_COMM_CONN_SLOTS * DK_LL_SLOT_BYTES);
	assert_int_equal(DK_LL_SLOT_BYTES % 16u, 0);
	assert_int_equal(DK_LL_AREA_OFFSET % 16u, 0);
}

/* Two ranks at every size (their reads are the same as two shots'); more
 * ranks up to the limit; a limit of 0 never, on two ranks too. */
static void oneshot_sizes(void **state)
{
	(void)state;
	const uint64_t limit = 64 * 1024;
	assert_true(dk_oneshot_size_fits(1ull << 30, 2, limit));
	assert_true(dk_oneshot_size_fits(UINT64_MAX, 2, limit));
	assert_true(dk_oneshot_size_fits(8, 1, limit));
	assert_false(dk_oneshot_size_fits(8, 2, 0));
	assert_false(dk_oneshot_size_fits(8, 4, 0));
	for (uint32_t n = 3; n <= 64; n++) {
		assert_true(dk_oneshot_size_fits(0, n, limit));
		assert_true(dk_oneshot_size_fits(limit, n, limit));
		assert_false(dk_oneshot_size_fits(limit + 1, n, limit));
	}
	assert_true(dk_oneshot_size_fits(1ull << 30, 8, 1ull << 30));
	assert_false(dk_oneshot_size_fits((1ull << 30) + 4, 8, 1ull << 30));
}

/* A channel copies every rank's block exactly once, starting with block
 * ch % n, the same block for every position of a step; at any step the
 * first n channels are on n different blocks. */
static void gather_sources(void **state)
{
	(void)state;
	const uint64_t lens[] = {1, 3, 4096, (1ull << 33) + 5};
	for (uint32_t n = 1; n <= 9; n++)
		for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
			const uint64_t len = lens[li];
			for (uint32_t ch = 0; ch < 2 * n + 3; ch++) {
				uint32_t seen = 0;
				for (uint64_t k = 0; k < n; k++) {
					uint32_t s = dk_gather_source(k * len, len, ch, n);
					assert_true(s < n);
					assert_int_equal(dk_gather_source(k * len + len - 1, len, ch, n), s);
					assert_false(seen >> s & 1u);
					seen |= 1u << s;
				}
				assert_int_equal(seen, (1u << n) - 1u);
				assert_int_equal(dk_gather_source(0, len, ch, n), ch % n);
			}
			for (uint64_t k = 0; k < n; k++) {
				uint32_t at_step = 0;
				for (uint32_t ch = 0; ch < n; ch++)
					at_step |= 1u << dk_gather_source(k * len, len, ch, n);
				assert_int_equal(at_step, (1u << n) - 1u);
			}
		}
	/* Two ranks: even channels start with rank 0's block, odd ones with
	 * rank 1's. */
	assert_int_equal(dk_gather_source(0, 100, 0, 2), 0);
	assert_int_equal(dk_gather_source(0, 100, 1, 2), 1);
	assert_int_equal(dk_gather_source(100, 100, 0, 2), 1);
	assert_int_equal(dk_gather_source(150, 100, 1, 2), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(flag_values),
	    cmocka_unit_test(flag_never_zero_and_slots_differ),
	    cmocka_unit_test(regions_hold_their_lines),
	    cmocka_unit_test(area_follows_connectors),
	    cmocka_unit_test(oneshot_sizes),
	    cmocka_unit_test(gather_sources),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
