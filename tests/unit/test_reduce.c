/*
 * Tests of the host engine's reductions (gpu/host/reduce.c) against a
 * reference written here from the documented semantics, sharing no code
 * with it: integers are reduced in 64 bits and wrapped to the type's width
 * by masking and sign extension; float16 and bfloat16 are decoded with
 * ldexp and encoded by a binary search over every finite value of the
 * format, picking the nearest and the even encoding on a tie.
 *
 * Covered: every dtype x op, 1 to 8 sources, counts around the block size,
 * the destination aliasing the first, a middle or the last source; the
 * rounding edges of float16 and bfloat16 (ties to even, overflow to
 * infinity, subnormals, signs); and the exported conversions over every
 * 16-bit pattern and a million random floats.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reduce.h"

#define NDT 10u
#define NOPS 5u
#define MAXSRC 8u

static const unsigned esize[NDT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const char *const dname[NDT] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                       "uint64", "float16", "float32", "float64", "bfloat16"};

/* ------------------------------------------------------------------ minifloats */

struct minifmt {
	int ebits, mbits;
};
static const struct minifmt F16 = {5, 10}, BF16 = {8, 7};

static double mf_decode(struct minifmt f, uint16_t bits)
{
	int emax = (1 << f.ebits) - 1, bias = (1 << (f.ebits - 1)) - 1;
	int e = (bits >> f.mbits) & emax;
	uint32_t m = bits & ((1u << f.mbits) - 1);
	double sign = (bits >> (f.ebits + f.mbits)) & 1 ? -1.0 : 1.0;
	if (e == emax)
		return m ? NAN : sign * INFINITY;
	if (e == 0)
		return sign * ldexp(m, 1 - bias - f.mbits);
	return sign * ldexp(m + (1u << f.mbits), e - bias - f.mbits);
}

/* Nearest encoding, ties to the even one, overflow past the midpoint above
 * the largest finite value to infinity. */
static uint16_t mf_encode(struct minifmt f, float x)
{
	uint16_t sign = (uint16_t)(signbit(x) ? 1u << (f.ebits + f.mbits) : 0);
	uint16_t inf = (uint16_t)(((1u << f.ebits) - 1) << f.mbits);
	if (isnan(x))
		return (uint16_t)(inf | 1u << (f.mbits - 1));
	double ax = fabs((double)x);
	uint16_t maxfin = (uint16_t)(inf - 1);
	/* Positive encodings grow with their values: search the largest <= ax. */
	uint32_t lo = 0, hi = maxfin;
	while (lo < hi) {
		uint32_t mid = (lo + hi + 1) / 2;
		if (mf_decode(f, (uint16_t)mid) <= ax)
			lo = mid;
		else
			hi = mid - 1;
	}
	double below = mf_decode(f, (uint16_t)lo);
	double above = lo == maxfin ? below + (below - mf_decode(f, (uint16_t)(maxfin - 1))) : mf_decode(f, (uint16_t)(lo + 1));
	uint32_t pick;
	if (ax - below < above - ax)
		pick = lo;
	else if (ax - below > above - ax)
		pick = lo + 1;
	else
		pick = (lo & 1) ? lo + 1 : lo;
	if (isinf(x) || pick > maxfin)
		pick = inf;
	return (uint16_t)(sign | pick);
}

/* ------------------------------------------------------------------ reference */

static int is_signed_int(unsigned dt)
{
	return dt == 0 || dt == 2 || dt == 4;
}

static int is_float(unsigned dt)
{
	return dt >= 6;
}

/* An integer element, zero- or sign-extended to 64 bits. */
static uint64_t int_get(unsigned dt, const void *p)
{
	uint64_t v = 0;
	memcpy(&v, p, esize[dt]); /* little-endian */
	return v;
}

/* Wraps v to the type's width; signed types come back sign-extended. */
static uint64_t int_wrap(unsigned dt, uint64_t v)
{
	unsigned bits = esize[dt] * 8;
	if (bits < 64) {
		v &= (1ull << bits) - 1;
		if (is_signed_int(dt) && (v >> (bits - 1)))
			v |= ~0ull << bits;
	}
	return v;
}

static double flt_get(unsigned dt, const void *p)
{
	if (dt == 6 || dt == 9) {
		uint16_t b;
		memcpy(&b, p, 2);
		return mf_decode(dt == 6 ? F16 : BF16, b);
	}
	if (dt == 7) {
		float f;
		memcpy(&f, p, 4);
		return f;
	}
	double d;
	memcpy(&d, p, 8);
	return d;
}

/* Element i of the reduction of n sources, written to out. Floats other
 * than float64 accumulate in float, as the contract says. */
static void ref_elem(unsigned dt, unsigned op, const void *const *srcs, unsigned n, size_t i, void *out)
{
	size_t es = esize[dt];
	if (!is_float(dt)) {
		uint64_t acc = int_wrap(dt, int_get(dt, (const char *)srcs[0] + i * es));
		for (unsigned k = 1; k < n; k++) {
			uint64_t v = int_wrap(dt, int_get(dt, (const char *)srcs[k] + i * es));
			int gt = is_signed_int(dt) ? (int64_t)v > (int64_t)acc : v > acc;
			int lt = is_signed_int(dt) ? (int64_t)v < (int64_t)acc : v < acc;
			if (op == 0 || op == 4)
				acc = int_wrap(dt, acc + v);
			else if (op == 1)
				acc = int_wrap(dt, acc * v);
			else if (op == 2)
				acc = gt ? v : acc;
			else if (op == 3)
				acc = lt ? v : acc;
		}
		if (op == 4)
			acc = is_signed_int(dt) ? (uint64_t)((int64_t)acc / (int64_t)n) : acc / n;
		memcpy(out, &acc, es);
		return;
	}
	if (dt == 8) {
		double acc = flt_get(dt, (const char *)srcs[0] + i * es);
		for (unsigned k = 1; k < n; k++) {
			double v = flt_get(dt, (const char *)srcs[k] + i * es);
			acc = op == 1 ? acc * v : op == 2 ? (v > acc ? v : acc) : op == 3 ? (v < acc ? v : acc) : acc + v;
		}
		if (op == 4)
			acc /= n;
		memcpy(out, &acc, 8);
		return;
	}
	float acc = (float)flt_get(dt, (const char *)srcs[0] + i * es);
	for (unsigned k = 1; k < n; k++) {
		float v = (float)flt_get(dt, (const char *)srcs[k] + i * es);
		acc = op == 1 ? acc * v : op == 2 ? (v > acc ? v : acc) : op == 3 ? (v < acc ? v : acc) : acc + v;
	}
	if (op == 4)
		acc /= (float)n;
	if (dt == 7) {
		memcpy(out, &acc, 4);
	} else {
		uint16_t b = mf_encode(dt == 6 ? F16 : BF16, acc);
		memcpy(out, &b, 2);
	}
}

/* Equal bit for bit, or both NaN for floating types. */
static int elem_equal(unsigned dt, const void *a, const void *b)
{
	if (!memcmp(a, b, esize[dt]))
		return 1;
	return is_float(dt) && isnan(flt_get(dt, a)) && isnan(flt_get(dt, b));
}

/* ------------------------------------------------------------------ data */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* Random elements: every bit pattern for integers; finite values of
 * moderate size for floats, so sums and products stay meaningful. */
static void fill(unsigned dt, void *p, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		char *e = (char *)p + i * esize[dt];
		uint64_t r = rnd();
		if (dt == 6 || dt == 9) {
			/* exponent field kept a few steps around 1.0 */
			int mb = dt == 6 ? 10 : 7, bias = dt == 6 ? 15 : 127;
			uint16_t b = (uint16_t)((r & 1) << 15 | (uint16_t)(bias - 6 + (r >> 1) % 10) << mb |
			                        (uint16_t)((r >> 8) & ((1u << mb) - 1)));
			memcpy(e, &b, 2);
		} else if (dt == 7) {
			float f = (float)((double)(int64_t)(r >> 11) / (double)(1ull << 50) - 2.0) * 100.0f;
			memcpy(e, &f, 4);
		} else if (dt == 8) {
			double d = ((double)(r >> 11) / (double)(1ull << 53) - 0.5) * 1e3;
			memcpy(e, &d, 8);
		} else {
			memcpy(e, &r, esize[dt]);
		}
	}
}

/* Runs reduce_into over fresh sources and compares every element. alias:
 * -1 out of place, else the index of the source the destination is. */
static void check_case(unsigned dt, unsigned op, unsigned n, size_t count, int alias)
{
	size_t bytes = count * esize[dt] + 1;
	void *src[MAXSRC], *want = malloc(bytes), *out = malloc(bytes);
	assert_non_null(want);
	assert_non_null(out);
	for (unsigned k = 0; k < n; k++) {
		src[k] = malloc(bytes);
		assert_non_null(src[k]);
		fill(dt, src[k], count);
	}
	for (size_t i = 0; i < count; i++)
		ref_elem(dt, op, (const void *const *)src, n, i, (char *)want + i * esize[dt]);
	void *dst = alias >= 0 ? src[alias] : out;
	assert_int_equal(reduce_into(dst, (const void *const *)src, n, count, dt, op, n), 0);
	for (size_t i = 0; i < count; i++) {
		const char *got = (const char *)dst + i * esize[dt];
		const char *exp = (const char *)want + i * esize[dt];
		if (!elem_equal(dt, got, exp)) {
			print_error("%s op %u nsrc %u count %zu alias %d: element %zu differs\n", dname[dt], op, n, count,
			            alias, i);
			fail();
		}
	}
	for (unsigned k = 0; k < n; k++)
		free(src[k]);
	free(want);
	free(out);
}

static void test_every_dtype_and_op(void **state)
{
	(void)state;
	static const unsigned nsrcs[] = {1, 2, 3, 8};
	static const size_t counts[] = {0, 1, 13, 1024, 2500};
	for (unsigned dt = 0; dt < NDT; dt++)
		for (unsigned op = 0; op < NOPS; op++)
			for (size_t a = 0; a < sizeof(nsrcs) / sizeof(nsrcs[0]); a++)
				for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
					check_case(dt, op, nsrcs[a], counts[c], -1);
}

static void test_in_place(void **state)
{
	(void)state;
	for (unsigned dt = 0; dt < NDT; dt++)
		for (unsigned op = 0; op < NOPS; op++) {
			check_case(dt, op, 5, 2100, 0);
			check_case(dt, op, 5, 2100, 2);
			check_case(dt, op, 5, 2100, 4);
			check_case(dt, op, 1, 7, 0);
		}
}

static void test_bad_arguments(void **state)
{
	(void)state;
	int32_t a = 1, b = 2;
	const void *srcs[1] = {&a};
	assert_int_equal(reduce_into(&b, srcs, 1, 1, NDT, 0, 1), -22);
	assert_int_equal(reduce_into(&b, srcs, 1, 1, 2, NOPS, 1), -22);
	assert_int_equal(reduce_into(&b, srcs, 0, 1, 2, 0, 1), -22);
	assert_int_equal(reduce_into(&b, srcs, 1, 1, 2, 4, 0), -22);
	assert_int_equal(b, 2);
}

/* ------------------------------------------------------------------ rounding edges */

/* reduce_into over two 16-bit sources (one element each). */
static uint16_t red16(unsigned dt, unsigned op, uint16_t a, uint16_t b)
{
	uint16_t out = 0xdead;
	const void *srcs[2] = {&a, &b};
	assert_int_equal(reduce_into(&out, srcs, 2, 1, dt, op, 2), 0);
	return out;
}

static void test_f16_rounding(void **state)
{
	(void)state;
	const unsigned H = 6;
	/* 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: the even one, 1. */
	assert_int_equal(red16(H, 0, 0x3c00, 0x1000), 0x3c00);
	/* (1 + 2^-10) + 2^-11: halfway between mantissas 1 and 2: up, to 2. */
	assert_int_equal(red16(H, 0, 0x3c01, 0x1000), 0x3c02);
	/* The same with the sign: rounding is symmetric. */
	assert_int_equal(red16(H, 0, 0xbc00, 0x9000), 0xbc00);
	assert_int_equal(red16(H, 0, 0xbc01, 0x9000), 0xbc02);
	/* 65504 + 16 = 65520, the midpoint to the next binade: ties to even is
	 * infinity; 65504 + 8 stays finite. */
	assert_int_equal(red16(H, 0, 0x7bff, 0x4c00), 0x7c00);
	assert_int_equal(red16(H, 0, 0x7bff, 0x4800), 0x7bff);
	assert_int_equal(red16(H, 0, 0xfbff, 0xcc00), 0xfc00);
	/* Subnormals: 2^-24 * 0.5 is a tie between 0 and 2^-24: 0 (even);
	 * 3 * 2^-24 * 0.5 is a tie between 1 and 2 units: 2. */
	assert_int_equal(red16(H, 1, 0x0001, 0x3800), 0x0000);
	assert_int_equal(red16(H, 1, 0x0003, 0x3800), 0x0002);
	assert_int_equal(red16(H, 1, 0x8001, 0x3800), 0x8000);
	/* avg rounds once: (1 + (1 + 2^-10)) / 2 = 1 + 2^-11, a tie: 1. */
	assert_int_equal(red16(H, 4, 0x3c00, 0x3c01), 0x3c00);
	/* The largest subnormal plus its unit reaches the smallest normal. */
	assert_int_equal(red16(H, 0, 0x03ff, 0x0001), 0x0400);
	/* Infinities and NaN survive. */
	assert_int_equal(red16(H, 2, 0x7c00, 0x3c00), 0x7c00);
	assert_true((red16(H, 0, 0x7c00, 0xfc00) & 0x7fff) > 0x7c00);
}

static void test_bf16_rounding(void **state)
{
	(void)state;
	const unsigned B = 9;
	/* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: 1. */
	assert_int_equal(red16(B, 0, 0x3f80, 0x3b80), 0x3f80);
	/* (1 + 2^-7) + 2^-8: halfway between mantissas 1 and 2: 2. */
	assert_int_equal(red16(B, 0, 0x3f81, 0x3b80), 0x3f82);
	/* Just above a tie rounds up: (1 + 2^-7) + 2^-8 + 2^-9 . */
	uint16_t a = 0x3f81, b = 0x3b80, c = 0x3b00, out;
	const void *three[3] = {&a, &b, &c};
	assert_int_equal(reduce_into(&out, three, 3, 1, B, 0, 3), 0);
	assert_int_equal(out, 0x3f82);
	/* Largest finite doubled overflows to infinity. */
	assert_int_equal(red16(B, 0, 0x7f7f, 0x7f7f), 0x7f80);
	assert_int_equal(red16(B, 3, 0xff7f, 0x7f7f), 0xff7f);
	/* Subnormal bfloat16 values are float's own subnormals. */
	assert_int_equal(red16(B, 0, 0x0001, 0x0001), 0x0002);
}

static void test_conversions_exhaustive(void **state)
{
	(void)state;
	for (uint32_t b = 0; b < 65536; b++) {
		double want16 = mf_decode(F16, (uint16_t)b), wantb = mf_decode(BF16, (uint16_t)b);
		float got16 = reduce_f16_to_float((uint16_t)b), gotb = reduce_bf16_to_float((uint16_t)b);
		if (isnan(want16))
			assert_true(isnan(got16));
		else
			assert_true((double)got16 == want16 && !signbit(got16) == !signbit(want16));
		if (isnan(wantb))
			assert_true(isnan(gotb));
		else
			assert_true((double)gotb == wantb && !signbit(gotb) == !signbit(wantb));
		/* Every finite value converts back to itself. */
		if (!isnan(want16))
			assert_int_equal(reduce_f16_from_float(got16), b);
		if (!isnan(wantb))
			assert_int_equal(reduce_bf16_from_float(gotb), b);
	}
	for (int i = 0; i < 1000000; i++) {
		uint32_t bits = (uint32_t)rnd();
		/* Half the draws near float16's range, where the interesting cases are. */
		if (i & 1)
			bits = (bits & 0x807fffffu) | (uint32_t)(100 + (bits >> 23) % 50) << 23;
		float f;
		memcpy(&f, &bits, 4);
		uint16_t w16 = mf_encode(F16, f), wb = mf_encode(BF16, f);
		uint16_t g16 = reduce_f16_from_float(f), gb = reduce_bf16_from_float(f);
		if (isnan(f)) {
			assert_true((g16 & 0x7fff) > 0x7c00);
			assert_true((gb & 0x7fff) > 0x7f80);
			continue;
		}
		if (g16 != w16 || gb != wb) {
			print_error("float bits 0x%08x: f16 0x%04x want 0x%04x, bf16 0x%04x want 0x%04x\n", bits, g16, w16,
			            gb, wb);
			fail();
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_every_dtype_and_op),   cmocka_unit_test(test_in_place),
	    cmocka_unit_test(test_bad_arguments),        cmocka_unit_test(test_f16_rounding),
	    cmocka_unit_test(test_bf16_rounding),        cmocka_unit_test(test_conversions_exhaustive),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
