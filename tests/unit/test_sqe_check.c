/*
 * Tests of the sizes behind the entry checks that both engines make
 * (gpu/sqe_check.h): the buffers a collective of `count` uses on each
 * rank, and their refusal where a product overflows 64 bits, at either
 * of its two factors (the element's size, then the ranks). The GPU build
 * makes the same checks with a multiply-high instead of divisions; the
 * limits here are worked out by hand. And the fields of a device
 * completion word, as the GPU engine checks them (the host engine refuses
 * the flag outright: test_sq).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "sqe_check.h"

static void test_mul_fits(void **state)
{
	(void)state;
	assert_true(sqe_mul_fits(UINT64_MAX, 1));
	assert_true(sqe_mul_fits(UINT64_MAX, 0));
	assert_true(sqe_mul_fits(0, UINT64_MAX));
	assert_true(sqe_mul_fits(UINT64_C(1) << 32, UINT64_C(1) << 31));
	assert_true(sqe_mul_fits(UINT64_C(0xFFFFFFFF), UINT64_C(0x100000001))); /* 2^64 - 1 exactly */
	assert_false(sqe_mul_fits(UINT64_C(1) << 32, UINT64_C(1) << 32));
	assert_false(sqe_mul_fits(UINT64_MAX, 2));
	assert_false(sqe_mul_fits(UINT64_C(0x100000000), UINT64_C(0x100000001)));
}

/* Against the product in 128 bits, where the compiler has them (the GPU's
 * multiply-high computes the same high word). */
static void test_mul_fits_wide(void **state)
{
	(void)state;
#if defined(__SIZEOF_INT128__)
	const uint64_t v[] = {0, 1, 2, 3, 7, 8, 255, UINT64_C(1) << 31, UINT64_C(0xFFFFFFFF), UINT64_C(1) << 32,
	                      UINT64_C(0x100000001), UINT64_MAX / 12, UINT64_MAX / 12 + 1, UINT64_MAX / 8,
	                      UINT64_MAX / 8 + 1, UINT64_C(1) << 62, UINT64_MAX - 1, UINT64_MAX};
	const size_t n = sizeof(v) / sizeof(v[0]);
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++) {
			__extension__ unsigned __int128 p = (unsigned __int128)v[i] * v[j];
			assert_int_equal(sqe_mul_fits(v[i], v[j]), (p >> 64) == 0);
		}
#else
	skip();
#endif
}

/* The element checks mask offsets with size - 1: every known size is a
 * power of two. */
static void test_dtype_sizes_powers_of_two(void **state)
{
	(void)state;
	unsigned known = 0;
	for (uint32_t t = 0; t < 256; t++) {
		unsigned d = sqe_dtype_size(t);
		if (d == 0)
			continue;
		known++;
		assert_true(d <= 8 && (d & (d - 1)) == 0);
	}
	assert_int_equal(known, SQE_NDTYPES);
}

static void test_buf_bytes(void **state)
{
	(void)state;
	uint64_t sb = 0, rb = 0;
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLGATHER, 10, 4, 3, 0, &sb, &rb), 0);
	assert_int_equal(sb, 40);
	assert_int_equal(rb, 120);
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_REDUCESCATTER, 10, 8, 3, 0, &sb, &rb), 0);
	assert_int_equal(sb, 240);
	assert_int_equal(rb, 80);
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_BROADCAST, 10, 2, 4, 0, &sb, &rb), 0);
	assert_int_equal(sb, 0); /* off the root */
	assert_int_equal(rb, 20);

	/* The largest count whose product with 4 and 3 fits, and one more. */
	const uint64_t most = UINT64_MAX / 12;
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLGATHER, most, 4, 3, 0, &sb, &rb), 0);
	assert_true(rb == most * 12);
	assert_true(rb > UINT64_MAX - 12);
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLGATHER, most + 1, 4, 3, 0, &sb, &rb), -1);
	/* count * size fits, times the ranks does not; then count * size
	 * alone does not, with one rank. */
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLREDUCE, UINT64_MAX / 8, 8, 2, 0, &sb, &rb), -1);
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLREDUCE, UINT64_MAX / 8 + 1, 8, 1, 0, &sb, &rb), -1);
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLREDUCE, UINT64_MAX / 8, 8, 1, 0, &sb, &rb), 0);
	assert_true(sb == UINT64_MAX / 8 * 8);
	/* No element size, no ranks, an unknown operation. */
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLREDUCE, 1, 0, 2, 0, &sb, &rb), -1);
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_ALLREDUCE, 1, 4, 0, 0, &sb, &rb), -1);
	assert_int_equal(sqe_buf_bytes(DFCCL_OP_COUNT_, 1, 4, 2, 0, &sb, &rb), -1);
}

/* DFCCL_SQE_F_DEVICE_DONE: a registration named and one aligned word;
 * without the flag the fields are not looked at. */
static void test_device_done_fields(void **state)
{
	(void)state;
	struct dfccl_sqe e;
	memset(&e, 0, sizeof(e));
	e.seq = e.arm = 5;
	e.opcode = DFCCL_OP_ALLREDUCE;
	e.dtype = 7; /* float32 */
	e.comm_id = 1;
	e.count = 16;
	e.flags = DFCCL_SQE_F_STREAM_ARMED | DFCCL_SQE_F_DEVICE_DONE;
	e.done_reg = 3;
	e.done_off = 8 * 1023;
	uint64_t bytes;
	assert_int_equal(sqe_check_entry(&e, &bytes), DFCCL_CQ_OK);
	assert_int_equal(bytes, 64);
	for (uint64_t off = 1; off < 8; off++) {
		e.done_off = 8 * 1023 + off;
		assert_int_equal(sqe_check_entry(&e, &bytes), DFCCL_CQ_BAD_ENTRY);
	}
	e.done_off = 0;
	e.done_reg = 0;
	assert_int_equal(sqe_check_entry(&e, &bytes), DFCCL_CQ_BAD_ENTRY);
	e.flags = DFCCL_SQE_F_STREAM_ARMED;
	e.done_off = 3;
	assert_int_equal(sqe_check_entry(&e, &bytes), DFCCL_CQ_OK);
	/* A NOP too: its stream waits on the word as any entry's. */
	e.opcode = DFCCL_OP_NOP;
	e.flags = DFCCL_SQE_F_DEVICE_DONE;
	assert_int_equal(sqe_check_entry(&e, &bytes), DFCCL_CQ_BAD_ENTRY);
	e.done_reg = 9;
	e.done_off = 0;
	assert_int_equal(sqe_check_entry(&e, &bytes), DFCCL_CQ_OK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_mul_fits),
	    cmocka_unit_test(test_mul_fits_wide),
	    cmocka_unit_test(test_dtype_sizes_powers_of_two),
	    cmocka_unit_test(test_buf_bytes),
	    cmocka_unit_test(test_device_done_fields),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
