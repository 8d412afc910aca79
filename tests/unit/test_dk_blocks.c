/*
 * Tests of which blocks of the daemon kernel run a task's channels
 * (gpu/cuda/dkernel.h: dk_start_range, dk_block_at, dk_chan_of), which the
 * kernel applies to every task and every block's rebuild of its queue: for
 * every kernel shape (blocks, and bulk0 = 0 for one grid or a resident
 * count of up to DK_MAX_RESIDENT beside up to DFCCL_COMM_MAX_CHANNELS bulk
 * blocks) and every task the kernel can make (channel count, spilled or
 * not, spread or not, any instance), the channels land on distinct blocks
 * of the task's range and nowhere else, each block finds its own channel
 * back, a single-channel task stays on the resident blocks unless it
 * spills, one of several channels goes to the bulk blocks, and one grid
 * places channel c of a task that starts on block0 on (block0 + c) %
 * blocks, as before there were bulk blocks. And when a task counts as a
 * backlog's (dk_spills).
 *
 * Expected blocks are worked out from the definition with a division (the
 * kernel's functions avoid one), not by calling the functions again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cuda/dkernel.h"

/* The first block of a task, as the kernel's block_of picks it with the
 * instance hash h. */
static uint32_t first_block(uint32_t bulk0, uint32_t blocks, uint32_t nch, int spill, int spread, uint32_t h)
{
	uint32_t lo, span;
	if (!dk_start_range(bulk0, blocks, nch, spill, spread, &lo, &span))
		return lo;
	return dk_spread_block(lo, span, nch, h);
}

/* Checks every channel of a task of nch channels starting on block0 in a
 * kernel of `blocks` with bulk blocks from bulk0 (0: one grid); lo and hi:
 * the range it must stay in. */
static void check_task(uint32_t bulk0, uint32_t blocks, uint32_t block0, uint32_t nch, uint32_t lo, uint32_t hi)
{
	assert_true(block0 >= lo && block0 < hi);
	assert_true(nch >= 1 && nch <= hi - lo);
	uint64_t seen = 0;
	for (uint32_t ch = 0; ch < nch; ch++) {
		uint32_t b = dk_block_at(bulk0, blocks, block0, ch);
		/* The definition: the ch-th block after block0 within [lo, hi). */
		assert_int_equal(b, lo + (block0 - lo + ch) % (hi - lo));
		assert_false(seen >> b & 1u); /* no two channels on one block */
		seen |= 1ull << b;
		assert_int_equal(dk_chan_of(bulk0, blocks, block0, b), ch);
	}
	/* Every other block, inside the range or not, runs none of it. */
	for (uint32_t b = 0; b < blocks; b++)
		if (!(seen >> b & 1u)) {
			uint32_t ch = dk_chan_of(bulk0, blocks, block0, b);
			assert_true(ch >= nch);
			if (b < lo || b >= hi)
				assert_int_equal(ch, DK_NO_TASK);
		}
}

static void one_grid_as_before(void **state)
{
	(void)state;
	for (uint32_t blocks = 1; blocks <= DFCCL_COMM_MAX_CHANNELS; blocks++)
		for (uint32_t block0 = 0; block0 < blocks; block0++)
			for (uint32_t nch = 1; nch <= blocks; nch++) {
				for (uint32_t ch = 0; ch < nch; ch++)
					assert_int_equal(dk_block_at(0, blocks, block0, ch), (block0 + ch) % blocks);
				check_task(0, blocks, block0, nch, 0, blocks);
			}
	/* Where a task starts: block 0 without the spread or when it takes
	 * every block; else chosen by its instance among all blocks, groups of
	 * nch apart. */
	assert_int_equal(first_block(0, 16, 3, 0, 0, 7), 0);
	assert_int_equal(first_block(0, 16, 16, 0, 1, 7), 0);
	assert_int_equal(first_block(0, 16, 3, 0, 1, 7), 5);   /* 7 * 3 % 16 */
	assert_int_equal(first_block(0, 16, 3, 0, 1, 21), 15); /* 63 % 16 */
	assert_int_equal(first_block(0, 16, 1, 1, 1, 21), 5); /* no spill without bulk blocks */
	/* Several channels: groups of nch, consecutive instances side by side. */
	assert_int_equal(first_block(0, 32, 5, 0, 1, 0), 0);
	assert_int_equal(first_block(0, 32, 5, 0, 1, 1), 5);
	assert_int_equal(first_block(0, 32, 5, 0, 1, 6), 30);
	assert_int_equal(first_block(0, 32, 5, 0, 1, 7), 3); /* 35 % 32 */
}

static void resident_and_bulk_blocks(void **state)
{
	(void)state;
	const uint32_t hashes[] = {0, 1, 2, 5, 29, 30, 31, 1000003u, 0x7FFFFFFFu, 0xFFFFFFFFu};
	for (uint32_t blocks = 3; blocks <= DK_MAX_BLOCKS; blocks++)
		for (uint32_t bulk0 = 1; bulk0 + 2 <= blocks && bulk0 <= DK_MAX_RESIDENT; bulk0++)
			/* The bulk blocks hold at most blocks - bulk0 channels
			 * (channels_for). */
			for (uint32_t nch = 1; nch <= blocks - bulk0; nch++)
				for (int spill = 0; spill <= 1; spill++)
					for (int spread = 0; spread <= 1; spread++)
						for (size_t k = 0; k < sizeof(hashes) / sizeof(hashes[0]); k++) {
							uint32_t b0 = first_block(bulk0, blocks, nch, spill, spread, hashes[k]);
							int bulk = nch > 1 || spill;
							uint32_t lo = bulk ? bulk0 : 0, hi = bulk ? blocks : bulk0;
							/* Several channels start on the first bulk
							 * block, but with a backlog (spill); one, or
							 * several with a backlog, go by their
							 * instance where spread and the range has
							 * more blocks than channels, else to the
							 * range's first. */
							if ((nch > 1 && !spill) || !spread || hi - lo <= nch)
								assert_int_equal(b0, lo);
							else
								assert_int_equal(b0, lo + (uint32_t)((uint64_t)hashes[k] * nch % 4294967296ull) % (hi - lo));
							assert_int_equal(dk_range_lo(bulk0, b0), lo);
							assert_int_equal(dk_range_hi(bulk0, blocks, b0), hi);
							check_task(bulk0, blocks, b0, nch, lo, hi);
						}
}

/* Tasks that start anywhere in their range (a spilled one, or one whose
 * block a rebuild finds), channels wrapping past the range's end. */
static void wrap_within_the_range(void **state)
{
	(void)state;
	for (uint32_t blocks = 3; blocks <= DK_MAX_BLOCKS; blocks++)
		for (uint32_t bulk0 = 1; bulk0 + 2 <= blocks && bulk0 <= DK_MAX_RESIDENT; bulk0++) {
			for (uint32_t block0 = 0; block0 < bulk0; block0++)
				for (uint32_t nch = 1; nch <= bulk0; nch++)
					check_task(bulk0, blocks, block0, nch, 0, bulk0);
			for (uint32_t block0 = bulk0; block0 < blocks; block0++)
				for (uint32_t nch = 1; nch <= blocks - bulk0; nch++)
					check_task(bulk0, blocks, block0, nch, bulk0, blocks);
		}
	/* One case by hand: 8 blocks, 2 resident; a task of 4 channels from
	 * block 5 runs on 5, 6, 7 and 2, and block 1 runs none of it. */
	assert_int_equal(dk_block_at(2, 8, 5, 3), 2);
	assert_int_equal(dk_chan_of(2, 8, 5, 2), 3);
	assert_int_equal(dk_chan_of(2, 8, 5, 1), DK_NO_TASK);
	assert_int_equal(dk_chan_of(2, 8, 1, 5), DK_NO_TASK); /* a resident task on a bulk block */
	assert_int_equal(dk_block_at(2, 8, 1, 1), 0);         /* a resident task wraps within 0-1 */
}

/* The backlog's mark (dk_spills): a single-channel task spills from
 * spill_at tasks live or placed before it in the reader's chunk, one of
 * several channels from one; without bulk blocks nothing spills. */
static void backlog_marks(void **state)
{
	(void)state;
	for (uint32_t spill_at = 1; spill_at <= 4 * DK_MAX_RESIDENT; spill_at++)
		for (uint32_t nch = 1; nch <= DFCCL_COMM_MAX_CHANNELS; nch++)
			for (uint32_t live = 0; live <= 40; live++)
				for (uint32_t ahead = 0; ahead < 24; ahead++) {
					uint32_t mark = nch == 1 ? spill_at : 1;
					assert_int_equal(dk_spills(0, spill_at, nch, live, ahead), 0);
					assert_int_equal(dk_spills(1, spill_at, nch, live, ahead), live + ahead >= mark);
				}
	/* A batch's first chunk under the defaults (one resident block, 4 tasks
	 * per resident block): of 16 single-channel entries taken while none is
	 * live, the first 4 stay on the resident block; of 16 of five channels,
	 * the first alone starts on the first bulk block. */
	uint32_t home1 = 0, home5 = 0;
	for (uint32_t ahead = 0; ahead < 16; ahead++) {
		home1 += !dk_spills(1, 4, 1, 0, ahead);
		home5 += !dk_spills(1, 4, 5, 0, ahead);
	}
	assert_int_equal(home1, 4);
	assert_int_equal(home5, 1);
	/* A job of one collective at a time keeps its blocks. */
	assert_int_equal(dk_spills(1, 4, 5, 0, 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(one_grid_as_before),
	    cmocka_unit_test(resident_and_bulk_blocks),
	    cmocka_unit_test(wrap_within_the_range),
	    cmocka_unit_test(backlog_marks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
