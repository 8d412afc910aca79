/*
 * See reduce.h. Each element type gets one function, generated from one
 * template: the sources are combined block by block into an accumulator
 * array on the stack (so dst may be any one of the sources), and every inner
 * loop is a plain two-operand loop over the block that the compiler
 * vectorizes at -O2 for the native types (float32 sum becomes addps).
 *
 * Integer types accumulate in their unsigned counterpart, where wrapping is
 * defined; signed max, min and avg convert back to compare and divide.
 */
#include "reduce.h"

#include <errno.h>
#include <string.h>

/* Elements per block: an accumulator of at most 8 KiB stays in L1. */
#define REDUCE_BLOCK 1024u

static inline float f16_to_float(uint16_t h)
{
	/* Shifting exponent and mantissa into a float's places gives the value
	 * scaled by 2^-112 (the bias difference), for subnormals too; the
	 * multiply undoes that. Infinity and NaN get the full exponent back. */
	uint32_t em = h & 0x7fffu;
	uint32_t u = em << 13;
	float f;
	memcpy(&f, &u, sizeof(f));
	f *= 0x1p112f;
	memcpy(&u, &f, sizeof(u));
	if (em >= 0x7c00u)
		u |= 0x7f800000u;
	u |= (uint32_t)(h & 0x8000u) << 16;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline uint16_t f16_from_float(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof(x));
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top of the payload */
		return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
	if (ax >= 0x47800000u) /* 2^16 and up, infinity included */
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) {
		/* Below 2^-14 the result is subnormal: adding 0.5 makes the FPU
		 * round to a multiple of 2^-24 (the ulp at 0.5), to nearest even,
		 * and leaves that multiple in the low mantissa bits. */
		float a;
		memcpy(&a, &ax, sizeof(a));
		a += 0.5f;
		uint32_t u;
		memcpy(&u, &a, sizeof(u));
		return (uint16_t)(sign | (u - 0x3f000000u));
	}
	/* Normal: rebias, then round the 13 dropped bits to nearest even; a
	 * carry out of the mantissa moves the exponent up, to infinity at the top. */
	uint32_t odd = (ax >> 13) & 1u;
	ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
	return (uint16_t)(sign | (ax >> 13));
}

static inline float bf16_to_float(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline uint16_t bf16_from_float(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, never rounded into infinity */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

float reduce_f16_to_float(uint16_t h)
{
	return f16_to_float(h);
}

uint16_t reduce_f16_from_float(float f)
{
	return f16_from_float(f);
}

float reduce_bf16_to_float(uint16_t b)
{
	return bf16_to_float(b);
}

uint16_t reduce_bf16_from_float(float f)
{
	return bf16_from_float(f);
}

/*
 * One element type: T in memory, A accumulated, LOAD: T -> A, STORE: A -> T,
 * GT(a, b): a > b in the type's order, AVG(a, d): a divided by d.
 *
 * name##_block reduces n elements from element `base`; it is called with
 * the constant REDUCE_BLOCK for every full block, so its loops have a trip
 * count the vectorizer knows (GCC's -O2 cost model vectorizes only loops
 * that need no scalar epilogue), and once more for the tail.
 */
#define REDUCE_DEFINE(name, T, A, LOAD, STORE, GT, AVG)                                                        \
	static inline __attribute__((always_inline)) void name##_block(                                            \
	    void *dst, const void *const *srcs, unsigned nsrc, size_t base, size_t n, uint32_t op, unsigned div)   \
	{                                                                                                          \
		A acc[REDUCE_BLOCK];                                                                               \
		const T *s = (const T *)srcs[0] + base;                                                            \
		for (size_t i = 0; i < n; i++)                                                                     \
			acc[i] = LOAD(s[i]);                                                                       \
		for (unsigned k = 1; k < nsrc; k++) {                                                              \
			s = (const T *)srcs[k] + base;                                                             \
			switch (op) {                                                                              \
			case REDUCE_SUM:                                                                           \
			case REDUCE_AVG:                                                                           \
				for (size_t i = 0; i < n; i++)                                                     \
					acc[i] = (A)(acc[i] + LOAD(s[i]));                                         \
				break;                                                                             \
			case REDUCE_PROD:                                                                          \
				for (size_t i = 0; i < n; i++)                                                     \
					acc[i] = (A)(acc[i] * LOAD(s[i]));                                         \
				break;                                                                             \
			case REDUCE_MAX:                                                                           \
				for (size_t i = 0; i < n; i++) {                                                   \
					A v = LOAD(s[i]);                                                          \
					acc[i] = GT(v, acc[i]) ? v : acc[i];                                       \
				}                                                                                  \
				break;                                                                             \
			default: /* REDUCE_MIN */                                                                  \
				for (size_t i = 0; i < n; i++) {                                                   \
					A v = LOAD(s[i]);                                                          \
					acc[i] = GT(acc[i], v) ? v : acc[i];                                       \
				}                                                                                  \
				break;                                                                             \
			}                                                                                          \
		}                                                                                                  \
		if (op == REDUCE_AVG)                                                                              \
			for (size_t i = 0; i < n; i++)                                                             \
				acc[i] = AVG(acc[i], div);                                                         \
		T *d = (T *)dst + base;                                                                            \
		for (size_t i = 0; i < n; i++)                                                                     \
			d[i] = STORE(acc[i]);                                                                      \
	}                                                                                                          \
	static void name(void *dst, const void *const *srcs, unsigned nsrc, size_t count, uint32_t op,             \
	                 unsigned div)                                                                             \
	{                                                                                                          \
		size_t base = 0;                                                                                   \
		for (; count - base >= REDUCE_BLOCK; base += REDUCE_BLOCK)                                         \
			name##_block(dst, srcs, nsrc, base, REDUCE_BLOCK, op, div);                                \
		if (base < count)                                                                                  \
			name##_block(dst, srcs, nsrc, base, count - base, op, div);                                \
	}

#define ID(x) (x)
#define GT_PLAIN(a, b) ((a) > (b))
#define AVG_FLOAT(a, d) ((a) / (d))
#define AVG_UNSIGNED(a, d) ((a) / (d))

/* Signed integers: accumulate in U (wrapping), compare and divide as T. */
#define REDUCE_DEFINE_SIGNED(name, T, U)                                                                       \
	static inline U name##_load(T x) { return (U)x; }                                                         \
	static inline T name##_store(U a) { return (T)a; }                                                        \
	static inline int name##_gt(U a, U b) { return (T)a > (T)b; }                                             \
	static inline U name##_avg(U a, unsigned d) { return (U)(T)((int64_t)(T)a / (int64_t)d); }               \
	REDUCE_DEFINE(name, T, U, name##_load, name##_store, name##_gt, name##_avg)

REDUCE_DEFINE_SIGNED(reduce_i8, int8_t, uint8_t)
REDUCE_DEFINE_SIGNED(reduce_i32, int32_t, uint32_t)
REDUCE_DEFINE_SIGNED(reduce_i64, int64_t, uint64_t)
REDUCE_DEFINE(reduce_u8, uint8_t, uint8_t, ID, ID, GT_PLAIN, AVG_UNSIGNED)
REDUCE_DEFINE(reduce_u32, uint32_t, uint32_t, ID, ID, GT_PLAIN, AVG_UNSIGNED)
REDUCE_DEFINE(reduce_u64, uint64_t, uint64_t, ID, ID, GT_PLAIN, AVG_UNSIGNED)
REDUCE_DEFINE(reduce_f32, float, float, ID, ID, GT_PLAIN, AVG_FLOAT)
REDUCE_DEFINE(reduce_f64, double, double, ID, ID, GT_PLAIN, AVG_FLOAT)
REDUCE_DEFINE(reduce_f16, uint16_t, float, f16_to_float, f16_from_float, GT_PLAIN, AVG_FLOAT)
REDUCE_DEFINE(reduce_bf16, uint16_t, float, bf16_to_float, bf16_from_float, GT_PLAIN, AVG_FLOAT)

typedef void (*reduce_fn)(void *, const void *const *, unsigned, size_t, uint32_t, unsigned);

static const reduce_fn reduce_fns[REDUCE_NDTYPES] = {
    [REDUCE_INT8] = reduce_i8,     [REDUCE_UINT8] = reduce_u8,     [REDUCE_INT32] = reduce_i32,
    [REDUCE_UINT32] = reduce_u32,  [REDUCE_INT64] = reduce_i64,    [REDUCE_UINT64] = reduce_u64,
    [REDUCE_FLOAT16] = reduce_f16, [REDUCE_FLOAT32] = reduce_f32,  [REDUCE_FLOAT64] = reduce_f64,
    [REDUCE_BFLOAT16] = reduce_bf16,
};

int reduce_into(void *dst, const void *const *srcs, unsigned nsrc, size_t count, uint32_t dtype, uint32_t op,
                unsigned avg_div)
{
	if (dtype >= REDUCE_NDTYPES || op >= REDUCE_NOPS || nsrc == 0 || (op == REDUCE_AVG && avg_div == 0))
		return -EINVAL;
	reduce_fns[dtype](dst, srcs, nsrc, count, op, avg_div);
	return 0;
}
