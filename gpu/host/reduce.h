/*
 * Element-wise reductions of the host engine, for every dfcclDataType_t and
 * dfcclRedOp_t value (client/include/dfccl.h).
 *
 * The result is deterministic and the same on every rank: it is always
 * ((s0 op s1) op s2) ... op s(n-1), in source order. Integer arithmetic
 * wraps in the element type. float16 and bfloat16 accumulate in float and
 * are rounded once, at the end, to nearest even. avg is the sum divided by
 * the divisor given (the communicator's rank count), an integer division
 * for integer types.
 *
 * The destination may be one of the sources (in-place collectives): the
 * reduction works in blocks, reading every source of a block before it
 * writes the block, so dst == srcs[k] for any k is correct. Any other
 * overlap between dst and a source is not.
 */
#ifndef DFCCL_HOST_REDUCE_H
#define DFCCL_HOST_REDUCE_H

#include <stddef.h>
#include <stdint.h>

/* dfcclRedOp_t values. */
enum reduce_op { REDUCE_SUM = 0, REDUCE_PROD = 1, REDUCE_MAX = 2, REDUCE_MIN = 3, REDUCE_AVG = 4, REDUCE_NOPS = 5 };

/* dfcclDataType_t values. */
enum reduce_dtype {
	REDUCE_INT8 = 0,
	REDUCE_UINT8 = 1,
	REDUCE_INT32 = 2,
	REDUCE_UINT32 = 3,
	REDUCE_INT64 = 4,
	REDUCE_UINT64 = 5,
	REDUCE_FLOAT16 = 6,
	REDUCE_FLOAT32 = 7,
	REDUCE_FLOAT64 = 8,
	REDUCE_BFLOAT16 = 9,
	REDUCE_NDTYPES = 10
};

/*
 * dst[i] = srcs[0][i] op ... op srcs[nsrc-1][i] for i < count, then / avg_div
 * for REDUCE_AVG. nsrc >= 1. Returns 0, or -EINVAL for an unknown dtype or
 * op (nothing written).
 */
int reduce_into(void *dst, const void *const *srcs, unsigned nsrc, size_t count, uint32_t dtype, uint32_t op,
                unsigned avg_div);

/* IEEE binary16 and bfloat16 <-> float; to-float is exact, from-float
 * rounds to nearest even (overflow to infinity, NaN stays NaN). */
float reduce_f16_to_float(uint16_t h);
uint16_t reduce_f16_from_float(float f);
float reduce_bf16_to_float(uint16_t b);
uint16_t reduce_bf16_from_float(float f);

#endif /* DFCCL_HOST_REDUCE_H */
