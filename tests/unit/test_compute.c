/*
 * Unit tests of compute (client/tools/compute.c), the overlap benchmark's
 * compute kernel, on the host: the reference that its result is checked
 * against, and, in a build without CUDA, the refusal.
 *
 * Covered: compute_expect equals the kernel's round applied one at a time
 * (the loop below, written from compute_kernel.h's constants) for every
 * count up to a few thousand and for a million rounds; counts add up
 * (expect(expect(x, a), b) = expect(x, a + b)) far beyond what a loop can
 * reach; a word after any number of rounds below 2^32 differs from its
 * seed and from the word after one round more or less, so a launch that did
 * not run or ran twice shows; seeds of neighbouring words differ. Without
 * CUDA, compute_require and compute_open fail, saying the build has no
 * CUDA.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "compute.h"
#include "compute_kernel.h"

/* The kernel's round, one at a time. */
static uint32_t rounds_by_loop(uint32_t x, uint64_t n)
{
	for (uint64_t k = 0; k < n; k++)
		x = x * COMPUTE_MUL + COMPUTE_ADD;
	return x;
}

static void test_expect_matches_loop(void **state)
{
	(void)state;
	for (size_t i = 0; i < 8; i++) {
		uint32_t x = compute_seed(i), y = x;
		for (uint64_t n = 0; n <= 3000; n++) {
			if (compute_expect(x, n) != y)
				fail_msg("seed %zu: %llu rounds give %u, the loop %u", i, (unsigned long long)n,
				         compute_expect(x, n), y);
			y = y * COMPUTE_MUL + COMPUTE_ADD;
		}
		assert_int_equal(compute_expect(x, 1000000), rounds_by_loop(x, 1000000));
	}
	assert_int_equal(compute_expect(0, 1), COMPUTE_ADD);
}

static void test_expect_composes(void **state)
{
	(void)state;
	const uint64_t counts[] = {1, 4097, 1ull << 31, (1ull << 40) + 12345, 0xdeadbeefcafeull};
	for (size_t a = 0; a < sizeof(counts) / sizeof(counts[0]); a++)
		for (size_t b = 0; b < sizeof(counts) / sizeof(counts[0]); b++) {
			uint32_t x = compute_seed(a * 7 + b);
			assert_int_equal(compute_expect(compute_expect(x, counts[a]), counts[b]),
			                 compute_expect(x, counts[a] + counts[b]));
		}
}

static void test_rounds_show(void **state)
{
	(void)state;
	const uint64_t counts[] = {1, 2, 255, 3512, 1000000, (1ull << 32) - 1};
	for (size_t i = 0; i < 64; i++) {
		uint32_t x = compute_seed(i);
		assert_int_equal(compute_expect(x, 0), x);
		for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
			uint64_t n = counts[k];
			assert_int_not_equal(compute_expect(x, n), x);
			assert_int_not_equal(compute_expect(x, n), compute_expect(x, n + 1));
			assert_int_not_equal(compute_expect(x, n), compute_expect(x, n - 1));
		}
		assert_int_not_equal(compute_seed(i), compute_seed(i + 1));
	}
	/* The map has period 2^32: a full period is the identity. */
	assert_int_equal(compute_expect(compute_seed(3), 1ull << 32), compute_seed(3));
}

#ifndef DFCCL_TOOLS_HAVE_CUDA
static void test_no_cuda(void **state)
{
	(void)state;
	struct compute c = COMPUTE_INIT;
	assert_int_equal(compute_require(), -1);
	assert_non_null(strstr(compute_error(), "this build has no CUDA"));
	assert_int_equal(compute_open(&c, NULL), -1);
	assert_non_null(strstr(compute_error(), "this build has no CUDA"));
	compute_close(&c);
	assert_null(c.buf);
}
#endif

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_expect_matches_loop),
	    cmocka_unit_test(test_expect_composes),
	    cmocka_unit_test(test_rounds_show),
#ifndef DFCCL_TOOLS_HAVE_CUDA
	    cmocka_unit_test(test_no_cuda),
#endif
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
