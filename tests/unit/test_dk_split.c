/*
 * Tests of the daemon kernel's split of a collective's elements into
 * channels and chunks (gpu/cuda/dkernel.h: dk_split_at), which takes 32-
 * or 64-bit arithmetic where it holds the product and 128 bits only where
 * it must: written-out splits, the edges of each arithmetic, and many
 * random splits against a reference made here in 128 bits and a
 * rounding loop, with the split's own properties (boundaries in order, on
 * 16 bytes, the whole covered).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cuda/dkernel.h"

/* The reference: floor(len * i / parts) in 128 bits, then the next
 * multiple of 16 bytes of elements, found by counting, within len. */
static uint64_t reference(uint64_t len, uint32_t parts, uint32_t i, uint32_t dsize)
{
	if (i >= parts)
		return len;
	unsigned __int128 lo = (unsigned __int128)len * i / parts;
	while ((uint64_t)(lo * dsize) % 16u != 0 && lo < len)
		lo++;
	return lo < len ? (uint64_t)lo : len;
}

static void written_out(void **state)
{
	(void)state;
	/* 10 floats in 3 parts: 3.33 -> 4, 6.67 -> 8 (16 bytes: 4 floats). */
	assert_int_equal(dk_split_at(10, 3, 0, 4), 0);
	assert_int_equal(dk_split_at(10, 3, 1, 4), 4);
	assert_int_equal(dk_split_at(10, 3, 2, 4), 8);
	assert_int_equal(dk_split_at(10, 3, 3, 4), 10);
	assert_int_equal(dk_split_at(10, 3, 7, 4), 10);
	/* Bytes: 16 a boundary; the last part may be short or empty. */
	assert_int_equal(dk_split_at(40, 2, 1, 1), 32);
	assert_int_equal(dk_split_at(17, 2, 1, 1), 16);
	assert_int_equal(dk_split_at(15, 2, 1, 1), 15);
	/* Doubles: two to 16 bytes. */
	assert_int_equal(dk_split_at(1000, 32, 5, 8), 156);
	/* One part: the whole. */
	assert_int_equal(dk_split_at(12345, 1, 0, 2), 0);
	assert_int_equal(dk_split_at(12345, 1, 1, 2), 12345);
}

/* Around 2^32 / parts (the 32-bit path's edge), 2^64 / parts (the 64-bit
 * path's) and near 2^64 (128 bits). */
static void the_edges_of_each_arithmetic(void **state)
{
	(void)state;
	const uint32_t parts_list[] = {1, 2, 3, 7, 16, 31, 32, 64, 1000};
	for (size_t p = 0; p < sizeof(parts_list) / sizeof(parts_list[0]); p++) {
		uint32_t parts = parts_list[p];
		const uint64_t centres[] = {(1ull << 32) / parts, UINT64_MAX / parts, UINT64_MAX - 64};
		for (size_t c = 0; c < 3; c++)
			for (int64_t d = -3; d <= 3; d++) {
				uint64_t len = centres[c] + (uint64_t)d;
				if (len == 0 || len > UINT64_MAX - 64)
					continue;
				for (uint32_t dsize = 1; dsize <= 8; dsize *= 2)
					for (uint32_t i = 0; i <= parts; i += parts > 8 ? parts / 8 : 1)
						assert_int_equal(dk_split_at(len, parts, i, dsize), reference(len, parts, i, dsize));
			}
	}
}

static uint64_t next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void random_splits(void **state)
{
	(void)state;
	uint64_t x = 0x9E3779B97F4A7C15ull;
	for (int k = 0; k < 200000; k++) {
		/* Lengths of every magnitude, from a few elements to 2^63. */
		uint64_t len = next(&x) >> (next(&x) % 64);
		if (len == 0 || len > UINT64_MAX - 64)
			continue;
		uint32_t parts = 1 + (uint32_t)(next(&x) % 64);
		uint32_t dsize = 1u << (next(&x) % 4);
		uint64_t prev = 0;
		for (uint32_t i = 0; i <= parts; i++) {
			uint64_t lo = dk_split_at(len, parts, i, dsize);
			assert_int_equal(lo, reference(len, parts, i, dsize));
			/* In order, on 16 bytes but at the end, the whole covered. */
			assert_true(lo >= prev && lo <= len);
			assert_true(lo == len || (lo * dsize) % 16u == 0);
			prev = lo;
		}
		assert_int_equal(prev, len);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(written_out),
	    cmocka_unit_test(the_edges_of_each_arithmetic),
	    cmocka_unit_test(random_splits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
