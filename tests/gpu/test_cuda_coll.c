/*
 * test_cuda_coll: every collective of dfccld's CUDA engine, checked element
 * by element on GPU buffers, and the DFCCL deadlock programs.
 *
 * The parent process parses the options, draws the communicators' unique
 * ids and forks one process per rank. CUDA is initialised only in the
 * ranks, after the fork: a CUDA context does not survive fork(), and a
 * parent that touched CUDA would leave its children a broken driver state.
 * Each rank selects its GPU for CUDA and for libdfccl (several ranks may
 * share one GPU), joins the communicator(s), and runs one of two programs.
 *
 * The collective sweep (the default) runs every collective x data type x
 * reduction x in place or out of place x count, one at a time: a NULL-stream
 * call, then dfcclCommSynchronize. Device buffers are of the kind --buffers
 * names: cudaMalloc (registered through legacy CUDA IPC), VMM (cuMemCreate
 * exportable as a POSIX file descriptor, mapped with cuMemMap: registered by
 * that descriptor), or dfcclMemAlloc (device memory the daemon allocates and
 * owns). They are placed in turn in allocations of their own and at aligned
 * and unaligned offsets inside one larger allocation (the "arena"); then
 * each collective runs once on a dfcclMemAllocHost host buffer and once on a
 * device buffer registered with dfcclCommRegister. Allocations of their own
 * are freed after each case, so addresses are reused and every kind's cache
 * of registrations is exercised. Buffers of every kind come from membuf.h.
 * After each call the rank reads back the output window (the output plus
 * CANARY_BYTES on each side) and checks that every output element equals
 * the reference, that the bytes around the output kept their canary value,
 * and that an out-of-place send buffer is unchanged.
 *
 * --stream makes the calls stream-ordered (NCCL's form): each collective
 * goes on a non-blocking CUDA stream of the rank's between a kernel that
 * keeps the stream busy for a while followed by the copy that writes the
 * send data (the send buffer held other bytes until then), and a copy of
 * the output window into pinned memory queued right after the call; the
 * rank then synchronizes the stream. The result is checked as above, and
 * the copy taken on the stream must equal the final output: an entry the
 * daemon took before its stream armed it reads the wrong send data, and a
 * stream that did not wait for the collective copies the output too early.
 * Every other case goes in a group (dfcclGroupStart/End) after a lead
 * all-reduce of 4 MiB, which usually completes after the case: the stream
 * waits for the group once, and the copy of the lead's output queued
 * after the group must hold the lead's sum. Every fourth case the lead
 * comes in two halves, the second on a stream of its own, issued between
 * the first and the case: the case's stream's entries of the group are
 * then not in a row in the queue, and still waited for once. Cases on dfcclMemAllocHost
 * buffers stay in the NULL-stream form.
 *
 * --deadlock A|B runs the DFCCL deadlock programs: every iteration each rank
 * issues one float all-reduce on each of K communicators (A) or K registered
 * collectives of one communicator (B), in a permutation of its own, and only
 * then waits for them. See deadlock_rank for why neither can deadlock on
 * dfccld although the same pattern hangs NCCL (nccl_deadlock replays it
 * there: --print-pattern writes the pattern for it).
 *
 * Reference data. Every element of every send buffer is an integer drawn
 * from (case key, rank, index), so each rank computes the expected output of
 * every rank by itself, with plain arithmetic here, not the daemon's
 * reduction code. The ranges make every result exact and independent of the
 * order in which an engine combines the ranks: integer sums and products
 * wrap modulo 2^bits (as on the engines, which accumulate in the unsigned
 * type of the same width), max and min take any value of the type, an
 * integer average stays clear of overflow (the sum divided by nranks,
 * truncated toward zero), and floating-point inputs are integers small
 * enough that every partial sum of them is exact in the type (|sum| <= 2048
 * for float16, 256 for bfloat16, 2^24 for float32, 2^53 for float64) and
 * every product is +-1, 2 or 3. A floating-point average is the exact sum
 * divided by nranks in the type the engines accumulate in (float for the
 * 16-bit types and float32, double for float64) and rounded to nearest even
 * into the element type: gpu/host/reduce.c's semantics, written here
 * independently. It is compared exactly unless --avg-ulps allows slack for
 * an engine that multiplies by 1/nranks instead.
 *
 * Exit status: 0 every check passed, 1 a failure, 2 usage, 77 skipped (no
 * usable GPU).
 */
#include <cuda_runtime_api.h>
#include <execinfo.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dfccl.h"
#include "gputest.h"
#include "membuf.h"
#include "spin_kernel.h"
#include "tool.h"

#define PROG "test_cuda_coll"
#define MAX_RANKS 64
#define MAX_COMMS 64

/* Bytes checked on each side of an output, and the value they hold. */
#define CANARY_BYTES 4096u
#define CANARY_BYTE 0xa5
/* Largest offset a placement adds inside an arena area. */
#define MAX_MISALIGN 4096u
/* Buffers in allocations of their own are kept to this many elements: each
 * allocation is a new registration with the daemon. */
#define OWN_MAX_COUNT 65537u

static const char usage[] =
    "Usage: " PROG " --nranks N [--gpus LIST] [OPTIONS]\n"
    "Forks N rank processes on the GPUs of LIST (rank r on the (r mod len)-th;\n"
    "several ranks may share a GPU), joins them in a communicator of the dfccld\n"
    "at $DFCCL_SOCKET, and checks every collective on GPU buffers against a\n"
    "reference, or runs a deadlock program.\n"
    "\n"
    "      --socket PATH     the daemon's socket (default $DFCCL_SOCKET)\n"
    "      --nranks N        rank processes (default 2)\n"
    "      --gpus LIST       comma-separated GPU indices (default 0)\n"
    "      --seed S          seed of the data, counts and orders (default: time; printed)\n"
    "      --quick           fewer counts, no 8M-element case (a CI-sized sweep)\n"
    "      --avg-ulps N      accept floating-point averages within N units in the\n"
    "                        last place (default 0: exact)\n"
    "      --timeout S       a rank that waits longer than S seconds for one collective\n"
    "                        (an iteration of a deadlock program) says which and fails\n"
    "                        (default 120; 0: wait forever)\n"
    "      --buffers KIND    where the device buffers of the sweep and of the deadlock\n"
    "                        programs come from: cudamalloc (cudaMalloc), vmm (cuMemCreate\n"
    "                        exportable as a POSIX file descriptor, mapped with cuMemMap)\n"
    "                        or memalloc (dfcclMemAlloc: device memory the daemon owns);\n"
    "                        default cudamalloc\n"
    "      --host-buffers    every buffer from dfcclMemAllocHost and no CUDA at all (checks\n"
    "                        this program against the host engine)\n"
    "      --stream          stream-ordered calls: the sweep and program A put each\n"
    "                        collective on a CUDA stream between a kernel, the copy of\n"
    "                        its send data and a copy of its output, and check both\n"
    "                        (program A: one stream per communicator); every other\n"
    "                        case of the sweep goes in a group after an all-reduce of\n"
    "                        4 MiB whose output is copied and checked too\n"
    "      --deadlock A|B    the deadlock program instead of the sweep: A, all-reduces on\n"
    "                        K communicators (NULL stream, then dfcclCommSynchronize on\n"
    "                        each); B, K registered collectives of one communicator\n"
    "                        (dfcclRunCollective, dfcclWait), with cudaDeviceSynchronize\n"
    "                        and cudaMallocHost/cudaFreeHost between the calls\n"
    "      --comms K         deadlock: collectives per iteration (default 8)\n"
    "      --iters M         deadlock: iterations (default 200)\n"
    "      --min-bytes SIZE  deadlock: smallest all-reduce (default 256)\n"
    "      --max-bytes SIZE  deadlock: largest all-reduce (default 1M)\n"
    "      --print-pattern   deadlock: print the ranks' GPUs, sizes and orders for\n"
    "                        nccl_deadlock and exit\n"
    "  -h, --help            this text\n"
    "\n"
    "Exit status: 0 all checks passed, 1 a failure, 2 usage, 77 no usable GPU.\n";

/* Where device buffers come from: --buffers' names and membuf's kinds. */
static const struct {
	const char *name;
	int kind;
} buffer_kinds[] = {{"cudamalloc", MEMBUF_DEVICE}, {"vmm", MEMBUF_VMM}, {"memalloc", MEMBUF_MEMALLOC}};

/* What every rank runs: set up by the parent, inherited through fork. */
struct config {
	int nranks;
	struct tool_devices gpus; /* rank r on gpus.dev[r % gpus.n] */
	uint64_t seed;
	bool quick, host_buffers, print_pattern, stream;
	int buffers; /* enum membuf_kind of the device buffers (--buffers) */
	int avg_ulps;
	unsigned timeout_s;
	char deadlock; /* 0: the collective sweep; 'A' or 'B' */
	int comms, iters;
	uint64_t min_bytes, max_bytes;
	dfcclUniqueId ids[MAX_COMMS];
};

/*
 * The watchdog: a rank that waits too long for a collective says which one
 * before it fails, instead of being killed silently by an outer timeout.
 * watchdog_arm prepares the message and starts an alarm; the handler only
 * writes it and exits (async-signal-safe calls only).
 */
static char watchdog_line[768];
static size_t watchdog_len;

static void watchdog_fire(int sig)
{
	(void)sig;
	ssize_t n = write(STDERR_FILENO, watchdog_line, watchdog_len);
	(void)n;
	_exit(TOOL_EXIT_FAIL);
}

static void watchdog_arm(unsigned seconds, const char *what)
{
	if (!seconds)
		return;
	int n = snprintf(watchdog_line, sizeof(watchdog_line), PROG ": rank %d: FAIL %s: no completion within %u s\n",
	                 gputest_rank(), what, seconds);
	watchdog_len = n < 0 ? 0 : (size_t)n < sizeof(watchdog_line) ? (size_t)n : sizeof(watchdog_line) - 1;
	signal(SIGALRM, watchdog_fire);
	alarm(seconds);
}

static void watchdog_disarm(void)
{
	alarm(0);
}

/* ---------------------------------------------------------------- element types */

struct type_info {
	unsigned bits;      /* width of an element */
	bool is_float;
	bool is_signed;
	unsigned mant_bits; /* floats: significand bits, the implicit one included */
	unsigned exp_bits;  /* floats: exponent bits */
	int64_t exact;      /* floats: every integer of at most this magnitude is exact */
};

static const struct type_info types[dfcclNumTypes] = {
    [dfcclInt8] = {8, false, true, 0, 0, 0},
    [dfcclUint8] = {8, false, false, 0, 0, 0},
    [dfcclInt32] = {32, false, true, 0, 0, 0},
    [dfcclUint32] = {32, false, false, 0, 0, 0},
    [dfcclInt64] = {64, false, true, 0, 0, 0},
    [dfcclUint64] = {64, false, false, 0, 0, 0},
    [dfcclFloat16] = {16, true, true, 11, 5, 2048},
    [dfcclFloat32] = {32, true, true, 24, 8, 1 << 24},
    [dfcclFloat64] = {64, true, true, 53, 11, INT64_C(1) << 53},
    [dfcclBfloat16] = {16, true, true, 8, 8, 256},
};

static size_t elem_size(int dtype)
{
	return types[dtype].bits / 8;
}

static uint64_t width_mask(unsigned bits)
{
	return bits == 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
}

/* An integer type's element bits as the value they stand for. */
static int64_t int_from_bits(int dtype, uint64_t bits)
{
	const struct type_info *t = &types[dtype];
	if (t->is_signed && t->bits < 64 && (bits >> (t->bits - 1) & 1))
		bits |= ~width_mask(t->bits);
	return (int64_t)bits;
}

/* x rounded to `bits` significant bits, to nearest even (x normal or 0). */
static double round_significand(double x, unsigned bits)
{
	if (x == 0)
		return x;
	int e;
	frexp(x, &e);
	return ldexp(nearbyint(ldexp(x, (int)bits - e)), e - (int)bits);
}

/* The bits of a float16 or bfloat16 holding x, which must be 0 or a normal
 * number of the type. */
static uint64_t narrow_float_bits(const struct type_info *t, double x)
{
	unsigned frac_bits = t->mant_bits - 1;
	uint64_t sign = signbit(x) ? UINT64_C(1) << (t->bits - 1) : 0;
	if (x == 0)
		return sign;
	int e, bias = (1 << (t->exp_bits - 1)) - 1;
	double m = frexp(fabs(x), &e); /* |x| = m * 2^e, m in [0.5, 1) */
	uint64_t frac = (uint64_t)ldexp(2 * m - 1, (int)frac_bits);
	return sign | (uint64_t)(e - 1 + bias) << frac_bits | frac;
}

/* The value of float16 or bfloat16 bits, subnormals, infinities and NaN
 * included (an engine's wrong output may be any of them). */
static double narrow_float_value(const struct type_info *t, uint64_t bits)
{
	unsigned frac_bits = t->mant_bits - 1;
	int bias = (1 << (t->exp_bits - 1)) - 1;
	uint64_t frac = bits & width_mask(frac_bits);
	uint64_t ex = bits >> frac_bits & width_mask(t->exp_bits);
	double v;
	if (ex == 0)
		v = ldexp((double)frac, 1 - bias - (int)frac_bits);
	else if (ex == width_mask(t->exp_bits))
		v = frac ? NAN : INFINITY;
	else
		v = ldexp((double)(frac | UINT64_C(1) << frac_bits), (int)ex - bias - (int)frac_bits);
	return bits >> (t->bits - 1) & 1 ? -v : v;
}

/* The bits of floating-point type dtype holding x (exactly representable). */
static uint64_t float_bits(int dtype, double x)
{
	if (dtype == dfcclFloat64) {
		uint64_t u;
		memcpy(&u, &x, sizeof(u));
		return u;
	}
	if (dtype == dfcclFloat32) {
		float f = (float)x;
		uint32_t u;
		memcpy(&u, &f, sizeof(u));
		return u;
	}
	return narrow_float_bits(&types[dtype], x);
}

static double float_value(int dtype, uint64_t bits)
{
	if (dtype == dfcclFloat64) {
		double d;
		memcpy(&d, &bits, sizeof(d));
		return d;
	}
	if (dtype == dfcclFloat32) {
		uint32_t u = (uint32_t)bits;
		float f;
		memcpy(&f, &u, sizeof(f));
		return f;
	}
	return narrow_float_value(&types[dtype], bits);
}

/* An element of dtype at index i of buf, as bits (little endian, as every
 * platform CUDA supports). */
static uint64_t elem_load(const unsigned char *buf, int dtype, size_t i)
{
	uint64_t v = 0;
	memcpy(&v, buf + i * elem_size(dtype), elem_size(dtype));
	return v;
}

static void elem_store(unsigned char *buf, int dtype, size_t i, uint64_t bits)
{
	memcpy(buf + i * elem_size(dtype), &bits, elem_size(dtype));
}

static void elem_format(int dtype, uint64_t bits, char *out, size_t len)
{
	const struct type_info *t = &types[dtype];
	if (t->is_float)
		snprintf(out, len, "%.17g (0x%0*" PRIx64 ")", float_value(dtype, bits), (int)t->bits / 4, bits);
	else if (t->is_signed)
		snprintf(out, len, "%" PRId64, int_from_bits(dtype, bits));
	else
		snprintf(out, len, "%" PRIu64, bits);
}

/* ---------------------------------------------------------------- the reference */

/* One collective call: the same on every rank. */
struct ccase {
	int coll, dtype, op, root;
	size_t count;
	bool inplace;
	int arena;      /* enum arena_id: where the buffers are */
	int place;      /* enum place_kind: how they sit there */
	uint64_t key;   /* seeds the reference data */
};

static bool case_reduces(const struct ccase *c)
{
	return tool_coll_reduces(c->coll);
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= UINT64_C(0xff51afd7ed558ccd);
	x ^= x >> 33;
	x *= UINT64_C(0xc4ceb9fe1a85ec53);
	x ^= x >> 33;
	return x;
}

/* A value in [-bound, bound] (signed; bound < 2^63) or [0, bound] from h. */
static int64_t within(uint64_t h, uint64_t bound, bool is_signed)
{
	if (!is_signed)
		return (int64_t)(bound == UINT64_MAX ? h : h % (bound + 1));
	return (int64_t)(h % (2 * bound + 1)) - (int64_t)bound;
}

/*
 * Element i of rank's send buffer, as an integer: for integer types the
 * element's value (sign- or zero-extended bits), for floating-point types an
 * integer the type holds exactly. The ranges are the ones the file comment
 * explains.
 */
static int64_t send_value(const struct ccase *c, int nranks, int rank, size_t i)
{
	const struct type_info *t = &types[c->dtype];
	uint64_t h = mix64(c->key + (uint64_t)rank * UINT64_C(0x9e3779b97f4a7c15) + i * UINT64_C(0xd1b54a32d192ed03));
	bool reducing = case_reduces(c);
	if (!t->is_float) {
		if (reducing && c->op == dfcclAvg)
			return within(h, width_mask(t->bits - t->is_signed) / (uint64_t)nranks, t->is_signed);
		return int_from_bits(c->dtype, h & width_mask(t->bits));
	}
	if (reducing && c->op == dfcclProd) {
		/* One rank per element contributes 2 or 3, the others +-1. */
		int64_t mag = (size_t)rank == i % (size_t)nranks ? 2 + (int64_t)(h >> 8 & 1) : 1;
		return h & 1 ? -mag : mag;
	}
	bool sums = reducing && (c->op == dfcclSum || c->op == dfcclAvg);
	return within(h, (uint64_t)(sums ? t->exact / nranks : t->exact), true);
}

/* The bits of a send element as stored in the buffer. */
static uint64_t send_bits(const struct ccase *c, int nranks, int rank, size_t i)
{
	int64_t v = send_value(c, nranks, rank, i);
	if (types[c->dtype].is_float)
		return float_bits(c->dtype, (double)v);
	return (uint64_t)v & width_mask(types[c->dtype].bits);
}

/* a > b in the order of integer type dtype (values as send_value gives them). */
static bool int_greater(int dtype, int64_t a, int64_t b)
{
	return types[dtype].is_signed ? a > b : (uint64_t)a > (uint64_t)b;
}

static uint64_t reduce_integers(const struct ccase *c, int nranks, size_t j)
{
	const struct type_info *t = &types[c->dtype];
	int64_t best = send_value(c, nranks, 0, j);
	uint64_t acc = (uint64_t)best; /* unsigned: wrapping is defined */
	for (int r = 1; r < nranks; r++) {
		int64_t v = send_value(c, nranks, r, j);
		if (c->op == dfcclProd)
			acc *= (uint64_t)v;
		else
			acc += (uint64_t)v;
		if (c->op == dfcclMax ? int_greater(c->dtype, v, best) : int_greater(c->dtype, best, v))
			best = v;
	}
	if (c->op == dfcclMax || c->op == dfcclMin)
		return (uint64_t)best & width_mask(t->bits);
	acc &= width_mask(t->bits);
	if (c->op != dfcclAvg)
		return acc;
	/* No overflow by construction; C division truncates toward zero. */
	if (!t->is_signed)
		return acc / (uint64_t)nranks;
	return (uint64_t)(int_from_bits(c->dtype, acc) / nranks) & width_mask(t->bits);
}

/* The engines' floating-point average: the sum divided in the type they
 * accumulate in, then rounded into the element type. */
static double float_average(int dtype, double sum, int nranks)
{
	if (dtype == dfcclFloat64)
		return sum / nranks;
	float q = (float)sum / (float)nranks;
	return round_significand(q, types[dtype].mant_bits);
}

static uint64_t reduce_floats(const struct ccase *c, int nranks, size_t j)
{
	double acc = (double)send_value(c, nranks, 0, j);
	for (int r = 1; r < nranks; r++) {
		double v = (double)send_value(c, nranks, r, j);
		switch (c->op) {
		case dfcclProd: acc *= v; break;
		case dfcclMax: acc = v > acc ? v : acc; break;
		case dfcclMin: acc = v < acc ? v : acc; break;
		default: acc += v; break;
		}
	}
	if (c->op == dfcclAvg)
		acc = float_average(c->dtype, acc, nranks);
	return float_bits(c->dtype, acc);
}

/* Element j of the reduction over every rank's send buffer. */
static uint64_t reduced_bits(const struct ccase *c, int nranks, size_t j)
{
	return types[c->dtype].is_float ? reduce_floats(c, nranks, j) : reduce_integers(c, nranks, j);
}

/* Element i of rank's receive buffer after the collective. */
static uint64_t expected_bits(const struct ccase *c, int nranks, int rank, size_t i)
{
	size_t n = c->count, block = i / n, within_block = i % n;
	int left = (rank + nranks - 1) % nranks;
	switch (c->coll) {
	case TOOL_ALLREDUCE:
	case TOOL_REDUCE: return reduced_bits(c, nranks, i);
	case TOOL_REDUCESCATTER: return reduced_bits(c, nranks, (size_t)rank * n + i);
	case TOOL_BROADCAST: return send_bits(c, nranks, c->root, i);
	case TOOL_ALLGATHER: return send_bits(c, nranks, (int)block, within_block);
	case TOOL_ALLTOALL: return send_bits(c, nranks, (int)block, (size_t)rank * n + within_block);
	default: return send_bits(c, nranks, left, i); /* TOOL_SENDRECV: from the left neighbour */
	}
}

/* Whether got is acceptable for want: equal bits, or for a floating-point
 * average within ulps units in the last place of want. */
static bool elem_matches(const struct ccase *c, uint64_t want, uint64_t got, int ulps)
{
	if (want == got)
		return true;
	if (!ulps || !types[c->dtype].is_float || c->op != dfcclAvg || !case_reduces(c))
		return false;
	double w = float_value(c->dtype, want), g = float_value(c->dtype, got);
	int e;
	frexp(w == 0 ? 1 : w, &e);
	return fabs(g - w) <= ulps * ldexp(1, e - (int)types[c->dtype].mant_bits);
}

/* ---------------------------------------------------------------- buffers */

/* The kind of the main buffers: --buffers, or host memory under
 * --host-buffers. */
static int main_kind(const struct config *cfg)
{
	return cfg->host_buffers ? MEMBUF_HOST : cfg->buffers;
}

/*
 * An arena: one allocation that holds `slots` pairs of areas, a send area
 * and an output area each; a case's buffers sit in one pair at an offset of
 * its placement. The output area has CANARY_BYTES in front of and behind
 * the largest output, plus room for the largest offset.
 */
enum arena_id {
	ARENA_MAIN,       /* --buffers' kind (dfcclMemAllocHost under --host-buffers) */
	ARENA_HOST,       /* dfcclMemAllocHost */
	ARENA_REGISTERED, /* like ARENA_MAIN, registered with dfcclCommRegister */
	ARENA_COUNT
};

static const char *const arena_names[ARENA_COUNT] = {"arena", "dfcclMemAllocHost buffer",
                                                     "dfcclCommRegister'd buffer"};

struct arena {
	int kind;                   /* enum membuf_kind */
	char *base;
	size_t send_area, out_area; /* bytes of one area of each sort */
	int slots;
	void *handle;               /* dfcclCommRegister's, or NULL */
};

static size_t round_up(size_t n, size_t to)
{
	return (n + to - 1) / to * to;
}

static int arena_open(struct arena *a, int kind, size_t max_send, size_t max_out, int slots,
                      dfcclComm_t register_with)
{
	memset(a, 0, sizeof(*a));
	a->kind = kind;
	a->slots = slots;
	a->send_area = round_up(MAX_MISALIGN + max_send, 4096);
	a->out_area = round_up(CANARY_BYTES + MAX_MISALIGN + max_out + CANARY_BYTES, 4096);
	size_t size = (a->send_area + a->out_area) * (size_t)slots;
	if (membuf_alloc(kind, (void **)&a->base, size) < 0) {
		gputest_say("cannot allocate a %s arena of %zu bytes: %s", membuf_kind_name(kind), size, membuf_error());
		a->base = NULL;
		return -1;
	}
	if (register_with && !DFCCL_OK(dfcclCommRegister(register_with, a->base, size, &a->handle))) {
		membuf_free(kind, a->base);
		a->base = NULL;
		return -1;
	}
	return 0;
}

static void arena_close(struct arena *a, dfcclComm_t registered_with)
{
	if (a->handle)
		DFCCL_OK(dfcclCommDeregister(registered_with, a->handle));
	if (a->base)
		membuf_free(a->kind, a->base);
	memset(a, 0, sizeof(*a));
}

/* How a case's buffers sit in memory. */
enum place_kind {
	PLACE_OWN,      /* allocations of their own, the output at the start of its own */
	PLACE_ALIGNED,  /* in an arena, 4096-byte aligned */
	PLACE_ONE_ELEM, /* in an arena, one element past alignment */
	PLACE_PAGE_END, /* in an arena, one element before a page boundary */
	PLACE_COUNT
};

static const char *const place_names[PLACE_COUNT] = {"own allocations", "aligned", "+1 element",
                                                     "1 element before a page"};

/* Where a placement inside an arena puts a buffer, past its area's start. */
static size_t place_offset(int place, size_t esize)
{
	switch (place) {
	case PLACE_ONE_ELEM: return esize;
	case PLACE_PAGE_END: return 4096 - esize;
	default: return 0;
	}
}

/* A case's buffers: the call's pointers and the watched output window. */
struct placement {
	int kind;            /* enum membuf_kind */
	char *send, *recv;   /* what the call gets */
	char *out;           /* the output region: recv (out of place) or the in-place buffer */
	size_t front, back;  /* canary bytes watched before out and after out + out_bytes */
	void *own_send, *own_out; /* PLACE_OWN's allocations, freed after the case */
};

struct case_sizes {
	size_t esize, send_elems, recv_elems;
	size_t send_bytes, recv_bytes, out_bytes;
};

static struct case_sizes sizes_of(const struct ccase *c, int nranks)
{
	struct case_sizes z;
	z.esize = elem_size(c->dtype);
	z.send_elems = tool_send_elems(c->coll, c->count, nranks);
	z.recv_elems = tool_recv_elems(c->coll, c->count, nranks);
	z.send_bytes = z.send_elems * z.esize;
	z.recv_bytes = z.recv_elems * z.esize;
	/* In place, the one buffer holds the larger side (an all-gather's
	 * output, a reduce-scatter's input). */
	z.out_bytes = c->inplace && z.send_bytes > z.recv_bytes ? z.send_bytes : z.recv_bytes;
	return z;
}

/* Sets the call's pointers from the output region (NCCL's in-place rules). */
static void place_pointers(const struct ccase *c, int rank, struct placement *p)
{
	const void *send = p->send;
	void *recv = p->out;
	if (c->inplace)
		tool_inplace(c->coll, p->out, c->count, c->dtype, rank, &send, &recv);
	p->send = (char *)send;
	p->recv = recv;
}

static int place_case(const struct ccase *c, int nranks, int rank, const struct arena *a, int slot,
                      struct placement *p)
{
	struct case_sizes z = sizes_of(c, nranks);
	memset(p, 0, sizeof(*p));
	p->kind = a->kind;
	if (c->place == PLACE_OWN) {
		/* The output first in its allocation: only the canary behind it
		 * lies inside memory this rank owns. */
		if (!MEM_OK(membuf_alloc(a->kind, &p->own_out, z.out_bytes + CANARY_BYTES)) ||
		    (!c->inplace && !MEM_OK(membuf_alloc(a->kind, &p->own_send, z.send_bytes))))
			return -1;
		p->out = p->own_out;
		p->send = p->own_send;
		p->back = CANARY_BYTES;
	} else {
		size_t misalign = place_offset(c->place, z.esize);
		char *pair = a->base + (size_t)slot * (a->send_area + a->out_area);
		p->send = pair + misalign;
		p->out = pair + a->send_area + CANARY_BYTES + misalign;
		p->front = p->back = CANARY_BYTES;
	}
	place_pointers(c, rank, p);
	return 0;
}

static void placement_release(struct placement *p)
{
	membuf_free(p->kind, p->own_send);
	membuf_free(p->kind, p->own_out);
	p->own_send = p->own_out = NULL;
}

/* Host images of one case's buffers. */
struct staging {
	unsigned char *before, *after;         /* the output window as written and as read back */
	unsigned char *send, *send_after;      /* an out-of-place send buffer, likewise */
	/* --stream: pinned, so that copies on the stream never block the CPU */
	unsigned char *pin_send;               /* the send data the stream writes */
	unsigned char *pin_out;                /* the output window the stream copies right after the call */
};

static int staging_open(struct staging *s, size_t max_send, size_t max_out, bool stream)
{
	size_t win = CANARY_BYTES + max_out + CANARY_BYTES;
	s->before = malloc(win);
	s->after = malloc(win);
	s->send = malloc(max_send);
	s->send_after = malloc(max_send);
	if (stream && (!CUDA_OK(cudaMallocHost((void **)&s->pin_send, max_send ? max_send : 1)) ||
	               !CUDA_OK(cudaMallocHost((void **)&s->pin_out, win))))
		return -1;
	if (s->before && s->after && s->send && s->send_after)
		return 0;
	gputest_say("out of memory for %zu-byte host images", win);
	return -1;
}

static void staging_close(struct staging *s)
{
	free(s->before);
	free(s->after);
	free(s->send);
	free(s->send_after);
	if (s->pin_send)
		cudaFreeHost(s->pin_send);
	if (s->pin_out)
		cudaFreeHost(s->pin_out);
	memset(s, 0, sizeof(*s));
}

/* ---------------------------------------------------------------- one rank */

struct rank_ctx {
	const struct config *cfg;
	int rank, gpu, ncomms;
	dfcclComm_t comms[MAX_COMMS];
	cudaStream_t streams[MAX_COMMS]; /* --stream: one per communicator */
	/* --stream: every other case of the sweep is issued in a group after
	 * a lead all-reduce of LEAD_COUNT ones (out of place), whose output
	 * the stream copies into lead_pin after the group too. */
	float *lead_in, *lead_out, *lead_pin;
	cudaStream_t lead_stream;       /* the second half's, where the lead comes in two (LEAD_SPLIT) */
	uint64_t streamed;              /* the sweep's stream-ordered cases so far */
	struct arena arenas[ARENA_COUNT];
	uint64_t checks, failures;
};

static void case_describe(const struct rank_ctx *x, const struct ccase *c, char *buf, size_t len)
{
	bool own = c->place == PLACE_OWN;
	snprintf(buf, len, "%s %s%s%s, count %zu, %s, root %d, %s %s%s%s", tool_coll_name(c->coll),
	         tool_dtype_name(c->dtype), case_reduces(c) ? " " : "", case_reduces(c) ? tool_op_name(c->op) : "",
	         c->count, c->inplace ? "in place" : "out of place", c->root, membuf_kind_name(x->arenas[c->arena].kind),
	         own ? place_names[PLACE_OWN] : arena_names[c->arena], own ? "" : ", ", own ? "" : place_names[c->place]);
}

static void case_fail(const struct rank_ctx *x, const struct ccase *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void case_fail(const struct rank_ctx *x, const struct ccase *c, const char *fmt, ...)
{
	char what[256], msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	case_describe(x, c, what, sizeof(what));
	gputest_say("FAIL %s: %s", what, msg);
}

/* Writes rank's send data and the output window's initial bytes: canaries,
 * and in place the send data inside the output region. */
static int case_upload(const struct rank_ctx *x, const struct ccase *c, const struct placement *p,
                       struct staging *s)
{
	int n = x->cfg->nranks;
	struct case_sizes z = sizes_of(c, n);
	size_t win = p->front + z.out_bytes + p->back;
	unsigned char *send = s->send;
	memset(s->before, CANARY_BYTE, win);
	if (c->inplace)
		send = s->before + p->front + (size_t)(p->send - p->out);
	for (size_t i = 0; i < z.send_elems; i++)
		elem_store(send, c->dtype, i, send_bits(c, n, x->rank, i));
	if (!c->inplace && !MEM_OK(membuf_put(p->kind, p->send, s->send, z.send_bytes)))
		return -1;
	return MEM_OK(membuf_put(p->kind, p->out - p->front, s->before, win)) ? 0 : -1;
}

/* The first byte of [a, a + n) that differs from b, or n. */
static size_t first_difference(const unsigned char *a, const unsigned char *b, size_t n)
{
	size_t i = 0;
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

/* Canaries: the window's bytes outside [from, to) must be as written. */
static bool check_untouched_outside(const struct rank_ctx *x, const struct ccase *c, const struct staging *s,
                                    size_t win, size_t from, size_t to, const char *what)
{
	size_t front = first_difference(s->after, s->before, from);
	size_t back = to + first_difference(s->after + to, s->before + to, win - to);
	if (front == from && back == win)
		return true;
	size_t at = front < from ? front : back;
	long rel = front < from ? (long)at - (long)from : (long)(at - to);
	case_fail(x, c, "%s: byte %s%ld was written (0x%02x, expected 0x%02x)", what,
	          front < from ? "" : "+", rel, s->after[at], s->before[at]);
	return false;
}

static bool check_elements(const struct rank_ctx *x, const struct ccase *c, const unsigned char *recv)
{
	int n = x->cfg->nranks;
	size_t elems = tool_recv_elems(c->coll, c->count, n), wrong = 0, first = 0;
	uint64_t want_first = 0, got_first = 0;
	for (size_t i = 0; i < elems; i++) {
		uint64_t want = expected_bits(c, n, x->rank, i), got = elem_load(recv, c->dtype, i);
		if (elem_matches(c, want, got, x->cfg->avg_ulps))
			continue;
		if (wrong++ == 0) {
			first = i;
			want_first = want;
			got_first = got;
		}
	}
	if (!wrong)
		return true;
	char w[64], g[64];
	elem_format(c->dtype, want_first, w, sizeof(w));
	elem_format(c->dtype, got_first, g, sizeof(g));
	case_fail(x, c, "%zu of %zu elements wrong, the first at index %zu: expected %s, got %s", wrong, elems, first, w,
	          g);
	return false;
}

/* Reads the case's buffers back and checks them; counts the check and a
 * failure. Returns -1 only when the buffers could not be read. */
static int case_verify(struct rank_ctx *x, const struct ccase *c, const struct placement *p, struct staging *s)
{
	struct case_sizes z = sizes_of(c, x->cfg->nranks);
	size_t win = p->front + z.out_bytes + p->back;
	size_t recv_at = p->front + (size_t)(p->recv - p->out);
	if (!MEM_OK(membuf_get(p->kind, s->after, p->out - p->front, win)) ||
	    (!c->inplace && !MEM_OK(membuf_get(p->kind, s->send_after, p->send, z.send_bytes))))
		return -1;
	bool ok = true;
	x->checks++;
	if (c->coll == TOOL_REDUCE && x->rank != c->root) {
		/* Only the root receives: the others' output stays as it was. */
		ok = check_untouched_outside(x, c, s, win, 0, 0, "the receive buffer of a non-root rank");
	} else {
		/* In place, a reduce-scatter's other blocks are don't-care. */
		size_t end = c->inplace ? p->front + z.out_bytes : recv_at + z.recv_bytes;
		ok = check_untouched_outside(x, c, s, win, p->front, end, "canary around the output");
		ok = check_elements(x, c, s->after + recv_at) && ok;
	}
	if (!c->inplace) {
		size_t d = first_difference(s->send_after, s->send, z.send_bytes);
		if (d < z.send_bytes) {
			case_fail(x, c, "the send buffer changed at byte %zu", d);
			ok = false;
		}
	}
	x->failures += !ok;
	return 0;
}

/* ---------------------------------------------------------------- the sweep */

struct case_list {
	struct ccase *v;
	size_t n, cap;
};

static int case_add(struct case_list *l, const struct ccase *c)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 1024;
		struct ccase *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return -1;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = *c;
	return 0;
}

static bool coll_has_inplace(int coll)
{
	return coll != TOOL_SENDRECV && coll != TOOL_ALLTOALL;
}

/* The counts of one (collective, type, reduction, form): fixed ones, an odd
 * one drawn from the seed, and for float32 one large one. */
static unsigned sweep_counts(const struct config *cfg, int dtype, uint64_t h, size_t *out)
{
	static const size_t fixed[] = {1, 7, 1000, 4097, 65537};
	static const size_t fixed_quick[] = {1, 7, 4097};
	unsigned n = 0;
	const size_t *f = cfg->quick ? fixed_quick : fixed;
	unsigned nf = cfg->quick ? 3 : 5;
	for (unsigned i = 0; i < nf; i++)
		out[n++] = f[i];
	out[n++] = 1 + 2 * (size_t)(h % (cfg->quick ? 32768 : 524288)); /* odd, up to 64K or 1M */
	if (!cfg->quick && dtype == dfcclFloat32)
		out[n++] = (size_t)8 << 20;
	return n;
}

/* Every case of the sweep, in the same order on every rank. */
static int sweep_cases(const struct config *cfg, struct case_list *l)
{
	uint64_t index = 0;
	for (int coll = 0; coll < TOOL_NCOLLS; coll++) {
		if (coll == TOOL_SENDRECV && cfg->nranks == 1)
			continue; /* nobody to send to */
		bool reduces = tool_coll_reduces(coll);
		for (int dtype = 0; dtype < dfcclNumTypes; dtype++)
			for (int op = 0; op < (reduces ? dfcclNumOps : 1); op++)
				for (int inplace = 0; inplace <= (int)coll_has_inplace(coll); inplace++) {
					size_t counts[8];
					unsigned nc = sweep_counts(cfg, dtype, tool_hash(cfg->seed, (uint64_t)coll, (uint64_t)dtype,
					                                                 (uint64_t)(op * 2 + inplace)),
					                           counts);
					for (unsigned k = 0; k < nc; k++, index++) {
						int place = (int)(index % PLACE_COUNT);
						struct ccase c = {coll, dtype, op, (int)(index % (uint64_t)cfg->nranks), counts[k],
						                  inplace, ARENA_MAIN, place, tool_hash(cfg->seed, index, 0, 0)};
						if (place == PLACE_OWN && counts[k] > OWN_MAX_COUNT)
							c.place = PLACE_ALIGNED;
						if (case_add(l, &c) < 0)
							return -1;
					}
				}
		/* Once per collective on the other buffer sources. */
		for (int arena = ARENA_HOST; arena < ARENA_COUNT; arena++, index++) {
			struct ccase c = {coll, dfcclFloat32, dfcclSum, (int)(index % (uint64_t)cfg->nranks), 4097, false,
			                  arena, PLACE_ONE_ELEM, tool_hash(cfg->seed, index, 0, 0)};
			if (case_add(l, &c) < 0)
				return -1;
		}
	}
	return 0;
}

/* The largest send and output of the cases that use one arena. */
static void arena_needs(const struct case_list *l, int nranks, int arena, size_t *max_send, size_t *max_out)
{
	*max_send = *max_out = 0;
	for (size_t i = 0; i < l->n; i++) {
		if (l->v[i].arena != arena)
			continue;
		struct case_sizes z = sizes_of(&l->v[i], nranks);
		*max_send = z.send_bytes > *max_send ? z.send_bytes : *max_send;
		*max_out = z.out_bytes > *max_out ? z.out_bytes : *max_out;
	}
}

static dfcclResult_t case_issue(const struct ccase *c, const struct placement *p, dfcclComm_t comm)
{
	return tool_issue(c->coll, p->send, p->recv, c->count, c->dtype, c->op, c->root, comm);
}

/* How long the kernel before each stream-ordered collective keeps its
 * stream busy. */
#define STREAM_DELAY_US 100u

/* The lead all-reduce's elements: 4 MiB, longer than most cases', so that
 * the case, last in the group, usually completes first, and a stream that
 * went on at the last's completion alone would copy the lead's poison. */
#define LEAD_COUNT ((size_t)1 << 20)

/* How a case goes (stream_issue): alone, in a group after the lead, or in
 * a group after the lead's first half, with its second half on
 * lead_stream between the two. */
enum { LEAD_NONE = 0, LEAD_ONE = 1, LEAD_SPLIT = 2 };

static int lead_open(struct rank_ctx *x)
{
	const size_t bytes = LEAD_COUNT * sizeof(float);
	float *ones = malloc(bytes);
	if (!ones)
		return -1;
	for (size_t i = 0; i < LEAD_COUNT; i++)
		ones[i] = 1.0f;
	bool ok = CUDA_OK(cudaMalloc((void **)&x->lead_in, bytes)) && CUDA_OK(cudaMalloc((void **)&x->lead_out, bytes)) &&
	          CUDA_OK(cudaMallocHost((void **)&x->lead_pin, bytes)) &&
	          CUDA_OK(cudaMemcpy(x->lead_in, ones, bytes, cudaMemcpyHostToDevice)) &&
	          CUDA_OK(cudaStreamCreateWithFlags(&x->lead_stream, cudaStreamNonBlocking));
	free(ones);
	return ok ? 0 : -1;
}

static void lead_close(struct rank_ctx *x)
{
	if (x->lead_in)
		cudaFree(x->lead_in);
	if (x->lead_out)
		cudaFree(x->lead_out);
	if (x->lead_pin)
		cudaFreeHost(x->lead_pin);
	if (x->lead_stream)
		cudaStreamDestroy(x->lead_stream);
	x->lead_in = x->lead_out = x->lead_pin = NULL;
	x->lead_stream = NULL;
}

/*
 * The stream-ordered form of a case whose buffers case_upload wrote: the
 * send data is overwritten with other bytes now, and written again on the
 * stream, after a kernel; the collective follows on the stream, then a
 * copy of the output window into s->pin_out; with a lead (LEAD_ONE,
 * LEAD_SPLIT), in a group after it, its output copied into x->lead_pin.
 * Nothing here waits for the GPU but a split lead's second stream, once
 * every call is issued. Returns the call's result (-1 as dfcclSystemError
 * for a CUDA call that failed, which says so).
 */
static dfcclResult_t stream_issue(const struct rank_ctx *x, const struct ccase *c, const struct placement *p,
                                  struct staging *s, cudaStream_t st, dfcclComm_t comm, int lead)
{
	struct case_sizes z = sizes_of(c, x->cfg->nranks);
	size_t win = p->front + z.out_bytes + p->back;
	const unsigned char *good = c->inplace ? s->before + p->front + (size_t)(p->send - p->out) : s->send;
	bool sends = p->send && z.send_bytes > 0;
	if (sends) {
		memcpy(s->pin_send, good, z.send_bytes);
		/* On this stream alone, and waited for: the rank's other streams
		 * may be waiting for collectives the peers have not issued yet. */
		if (!CUDA_OK(cudaMemsetAsync(p->send, 0x5a, z.send_bytes, st)) || !CUDA_OK(cudaStreamSynchronize(st)))
			return dfcclSystemError;
	}
	if (!CUDA_OK(delay_kernel_launch(STREAM_DELAY_US, st)) ||
	    (sends && !CUDA_OK(cudaMemcpyAsync(p->send, s->pin_send, z.send_bytes, cudaMemcpyDefault, st))))
		return dfcclSystemError;
	/* With a lead: the lead's output poisoned on its stream first, the
	 * lead and the case in one group (each stream's entries of it waited
	 * for once, through its last one's completion word, proto/
	 * dfccl_queue.h DFCCL_SQE_F_GROUP); split, the second half's on
	 * lead_stream, between the first half and the case. */
	const size_t half = lead == LEAD_SPLIT ? LEAD_COUNT / 2 : LEAD_COUNT;
	const cudaStream_t st2 = x->lead_stream;
	if (lead && !CUDA_OK(cudaMemsetAsync(x->lead_out, 0xff, half * sizeof(float), st)))
		return dfcclSystemError;
	if (lead == LEAD_SPLIT &&
	    !CUDA_OK(cudaMemsetAsync(x->lead_out + half, 0xff, (LEAD_COUNT - half) * sizeof(float), st2)))
		return dfcclSystemError;
	dfcclResult_t r = lead ? dfcclGroupStart() : dfcclSuccess;
	if (lead && r == dfcclSuccess)
		r = dfcclAllReduce(x->lead_in, x->lead_out, half, dfcclFloat32, dfcclSum, comm, (dfcclStream_t)st);
	if (lead == LEAD_SPLIT && r == dfcclSuccess)
		r = dfcclAllReduce(x->lead_in + half, x->lead_out + half, LEAD_COUNT - half, dfcclFloat32, dfcclSum, comm,
		                   (dfcclStream_t)st2);
	if (r == dfcclSuccess)
		r = tool_issue_on(c->coll, p->send, p->recv, c->count, c->dtype, c->op, c->root, comm, (dfcclStream_t)st);
	if (lead) {
		dfcclResult_t re = dfcclGroupEnd();
		r = r != dfcclSuccess ? r : re;
	}
	if (r == dfcclSuccess && !CUDA_OK(cudaMemcpyAsync(s->pin_out, p->out - p->front, win, cudaMemcpyDefault, st)))
		return dfcclSystemError;
	if (r == dfcclSuccess && lead &&
	    !CUDA_OK(cudaMemcpyAsync(x->lead_pin, x->lead_out, half * sizeof(float), cudaMemcpyDeviceToHost, st)))
		return dfcclSystemError;
	if (r == dfcclSuccess && lead == LEAD_SPLIT &&
	    (!CUDA_OK(cudaMemcpyAsync(x->lead_pin + half, x->lead_out + half, (LEAD_COUNT - half) * sizeof(float),
	                              cudaMemcpyDeviceToHost, st2)) ||
	     !CUDA_OK(cudaStreamSynchronize(st2))))
		return dfcclSystemError;
	return r;
}

/* After case_verify of a stream-ordered case: the copy the stream took
 * right after the call must be the final output. */
static void stream_verify(struct rank_ctx *x, const struct ccase *c, const struct placement *p,
                          const struct staging *s, int lead)
{
	if (lead) {
		/* The lead's copy, taken after the group: every element the
		 * ranks' sum. */
		const float want = (float)x->cfg->nranks;
		size_t i = 0;
		while (i < LEAD_COUNT && x->lead_pin[i] == want)
			i++;
		x->checks++;
		if (i < LEAD_COUNT) {
			case_fail(x, c, "the copy of the lead all-reduce's output queued after its group has %g at element "
			          "%zu, expected %g: the stream did not wait for the whole group", (double)x->lead_pin[i],
			          i, (double)want);
			x->failures++;
		}
	}
	struct case_sizes z = sizes_of(c, x->cfg->nranks);
	size_t win = p->front + z.out_bytes + p->back;
	size_t d = first_difference(s->pin_out, s->after, win);
	if (d == win)
		return;
	case_fail(x, c, "the copy of the output queued on the stream right after the call differs from the final "
	          "output at byte %zu (0x%02x, then 0x%02x): the stream did not wait for the collective", d,
	          s->pin_out[d], s->after[d]);
	x->failures++;
}

/* Runs and checks one case; -1 when the collective itself failed (the
 * communicator is then unusable and the rank stops). */
static int sweep_run_case(struct rank_ctx *x, const struct ccase *planned, struct staging *s)
{
	struct placement p = {0};
	struct ccase moved = *planned, *c = &moved;
	char what[256];
	int rc = -1;
	/* An arena that could not be set up (one failure counted) is replaced
	 * by the main one: every rank must still issue every collective. */
	if (!x->arenas[c->arena].base)
		moved.arena = ARENA_MAIN;
	if (place_case(c, x->cfg->nranks, x->rank, &x->arenas[c->arena], 0, &p) < 0 || case_upload(x, c, &p, s) < 0)
		goto out;
	case_describe(x, c, what, sizeof(what));
	watchdog_arm(x->cfg->timeout_s, what);
	bool streamed = x->cfg->stream && c->arena != ARENA_HOST;
	/* Every other stream-ordered case in a group after the lead, every
	 * fourth after the lead in two halves on two streams. */
	int lead = LEAD_NONE;
	if (streamed && x->lead_in) {
		const uint64_t k = x->streamed++;
		lead = k % 2 == 0 ? LEAD_NONE : k % 4 == 3 ? LEAD_SPLIT : LEAD_ONE;
	}
	dfcclResult_t r;
	if (streamed) {
		r = stream_issue(x, c, &p, s, x->streams[0], x->comms[0], lead);
		if (r == dfcclSuccess && !CUDA_OK(cudaStreamSynchronize(x->streams[0])))
			r = dfcclSystemError;
		if (r == dfcclSuccess)
			DFCCL_OK(dfcclCommGetAsyncError(x->comms[0], &r));
	} else {
		r = case_issue(c, &p, x->comms[0]);
		if (r == dfcclSuccess)
			r = dfcclCommSynchronize(x->comms[0]);
	}
	watchdog_disarm();
	if (r != dfcclSuccess) {
		gputest_say("FAIL %s: the collective failed: %s: %s", what, dfcclGetErrorString(r), dfcclGetLastError(NULL));
		x->checks++;
		x->failures++;
		goto out;
	}
	rc = case_verify(x, c, &p, s);
	if (rc == 0 && streamed)
		stream_verify(x, c, &p, s, lead);
out:
	placement_release(&p);
	return rc;
}

static int sweep_rank(struct rank_ctx *x)
{
	const struct config *cfg = x->cfg;
	struct case_list l = {0};
	struct staging s = {0};
	int rc = -1;
	size_t ms, mo, all_send = 0, all_out = 0;
	if (sweep_cases(cfg, &l) < 0) {
		gputest_say("out of memory");
		goto out;
	}
	for (int a = 0; a < ARENA_COUNT; a++) {
		int kind = a == ARENA_HOST ? MEMBUF_HOST : main_kind(cfg);
		arena_needs(&l, cfg->nranks, a, &ms, &mo);
		if (arena_open(&x->arenas[a], kind, ms, mo, 1, a == ARENA_REGISTERED ? x->comms[0] : NULL) < 0) {
			/* Without the main arena nothing can run; without another
			 * one, only its cases are left out. */
			if (a == ARENA_MAIN)
				goto out;
			gputest_say("FAIL: no %s %s: its cases run in the main arena", membuf_kind_name(kind), arena_names[a]);
			x->failures++;
		}
		all_send = ms > all_send ? ms : all_send;
		all_out = mo > all_out ? mo : all_out;
	}
	if (staging_open(&s, all_send, all_out, cfg->stream) < 0)
		goto out;
	for (size_t i = 0; i < l.n; i++)
		if (sweep_run_case(x, &l.v[i], &s) < 0)
			goto out;
	rc = 0;
out:
	staging_close(&s);
	for (int a = 0; a < ARENA_COUNT; a++)
		arena_close(&x->arenas[a], x->comms[0]);
	free(l.v);
	printf(PROG ": rank %d (GPU %d): %" PRIu64 " collectives checked, %" PRIu64 " failures%s\n", x->rank, x->gpu,
	       x->checks, x->failures, rc ? ", stopped early" : "");
	return rc;
}

/* ---------------------------------------------------------------- the deadlock pattern */

/* The size of communicator k's all-reduce in iteration it, the same on every
 * rank: a whole number of floats in [min_bytes, max_bytes]. */
static size_t pattern_bytes(const struct config *cfg, int it, int k)
{
	uint64_t span = cfg->max_bytes - cfg->min_bytes + 1;
	size_t b = (size_t)(cfg->min_bytes + tool_hash(cfg->seed, (uint64_t)it, (uint64_t)k, 0x517e) % span);
	return b < 4 ? 4 : b / 4 * 4;
}

/*
 * The order in which each rank issues iteration it's collectives, into
 * orders[rank * comms + i]: the communicators sorted by a seeded hash of
 * (rank, iteration, salt). A rank whose order repeats a lower rank's draws
 * again with the next salt, so that ranks disagree whenever K! allows it:
 * disagreement is what deadlocks collectives that run in call order.
 */
static void pattern_orders(const struct config *cfg, int it, int *orders)
{
	int K = cfg->comms;
	uint64_t keys[MAX_COMMS];
	for (int r = 0; r < cfg->nranks; r++) {
		int *o = orders + r * K;
		for (uint64_t salt = 0; salt < 64; salt++) {
			for (int k = 0; k < K; k++) {
				uint64_t key = tool_hash(cfg->seed, (uint64_t)r, (uint64_t)it, salt * MAX_COMMS + (uint64_t)k);
				int j = k; /* insertion sort of k by key */
				for (; j > 0 && keys[j - 1] > key; j--) {
					keys[j] = keys[j - 1];
					o[j] = o[j - 1];
				}
				keys[j] = key;
				o[j] = k;
			}
			bool repeats = false;
			for (int q = 0; q < r && !repeats; q++)
				repeats = !memcmp(o, orders + q * K, (size_t)K * sizeof(*o));
			if (!repeats)
				break;
		}
	}
}

static void print_ints(FILE *f, const char *tag, const int *v, int n)
{
	fprintf(f, "%s", tag);
	for (int i = 0; i < n; i++)
		fprintf(f, " %d", v[i]);
	fputc('\n', f);
}

/* The pattern as nccl_deadlock reads it: a header, the ranks' GPUs, then
 * per iteration the sizes in bytes and each rank's order. */
static int print_pattern(const struct config *cfg)
{
	int *orders = malloc((size_t)cfg->nranks * (size_t)cfg->comms * sizeof(int));
	int gpus[MAX_RANKS], bytes[MAX_COMMS];
	if (!orders)
		return TOOL_EXIT_FAIL;
	printf("# the deadlock pattern of " PROG ", seed %" PRIu64 "\n", cfg->seed);
	printf("pattern %d %d %d\n", cfg->nranks, cfg->comms, cfg->iters);
	for (int r = 0; r < cfg->nranks; r++)
		gpus[r] = tool_rank_device(&cfg->gpus, r, 0);
	print_ints(stdout, "gpus", gpus, cfg->nranks);
	for (int it = 0; it < cfg->iters; it++) {
		for (int k = 0; k < cfg->comms; k++)
			bytes[k] = (int)pattern_bytes(cfg, it, k);
		print_ints(stdout, "bytes", bytes, cfg->comms);
		pattern_orders(cfg, it, orders);
		for (int r = 0; r < cfg->nranks; r++)
			print_ints(stdout, "order", orders + r * cfg->comms, cfg->comms);
	}
	free(orders);
	return 0;
}

/* ---------------------------------------------------------------- the deadlock programs */

/* What a client does between callback-form collectives that must not
 * deadlock them: a device-wide synchronization, and a pinned allocation
 * and its release (cudaFreeHost synchronizes the device as well). */
static int host_synchronize(void)
{
	void *pinned;
	if (!CUDA_OK(cudaDeviceSynchronize()) || !CUDA_OK(cudaMallocHost(&pinned, 1 << 20)))
		return -1;
	return CUDA_OK(cudaFreeHost(pinned)) ? 0 : -1;
}

static struct ccase deadlock_case(const struct config *cfg, int it, int k)
{
	struct ccase c = {TOOL_ALLREDUCE, dfcclFloat32, dfcclSum, 0, pattern_bytes(cfg, it, k) / 4, false, ARENA_MAIN,
	                  PLACE_ALIGNED, tool_hash(cfg->seed, (uint64_t)it, (uint64_t)k, 0xdead)};
	return c;
}

/* Issues collective k of the iteration: an all-reduce on communicator k
 * (program A) or a run of registered collective k (program B). */
static dfcclResult_t deadlock_issue(struct rank_ctx *x, const struct ccase *c, const struct placement *p, int k,
                                    dfcclRequest_t *req, struct staging *s)
{
	if (x->cfg->deadlock == 'A' && x->cfg->stream)
		return stream_issue(x, c, p, s, x->streams[k], x->comms[k], LEAD_NONE);
	if (x->cfg->deadlock == 'A')
		return case_issue(c, p, x->comms[k]);
	dfcclCollDesc_t d = {dfcclCollAllReduce, c->count, dfcclFloat32, dfcclSum, 0, 0};
	/* Re-registered with this iteration's size: runs keep matching by
	 * (id, run number), which re-registration keeps counting. */
	dfcclResult_t r = dfcclDeregisterCollective(x->comms[0], k);
	if (r == dfcclSuccess || r == dfcclInvalidArgument) /* not registered yet */
		r = dfcclRegisterCollective(x->comms[0], k, &d);
	return r == dfcclSuccess ? dfcclRunCollective(x->comms[0], k, p->send, p->recv, NULL, NULL, req) : r;
}

/*
 * Why neither program can deadlock on dfccld. A: every rank submits all K
 * all-reduces before it waits for any, so when rank r waits on communicator
 * k, every rank has submitted its part of k (or will without waiting first);
 * the daemon runs submitted collectives independently of the order of
 * submission, preempting one whose peers have not arrived, so k completes
 * whatever order the waits come in: the CPU only waits. B: the same, with
 * registered runs matched by (id, run number); the device-wide
 * synchronization between submissions waits only for this process's own
 * GPU work, and none of it waits on a collective, since the daemon kernel
 * runs in the daemon's own context. With --stream, A's all-reduces go on a
 * stream per communicator: each stream waits only for its own, and the
 * streams are synchronized in a fixed order.
 */
static int deadlock_iteration(struct rank_ctx *x, int it, int *orders, struct staging *st)
{
	const struct config *cfg = x->cfg;
	int K = cfg->comms;
	struct ccase c[MAX_COMMS];
	struct placement p[MAX_COMMS];
	dfcclRequest_t req[MAX_COMMS] = {0};
	dfcclResult_t r = dfcclSuccess;
	int issued = 0;
	char what[96];

	pattern_orders(cfg, it, orders);
	for (int k = 0; k < K; k++) {
		c[k] = deadlock_case(cfg, it, k);
		if (place_case(&c[k], cfg->nranks, x->rank, &x->arenas[ARENA_MAIN], k, &p[k]) < 0 ||
		    case_upload(x, &c[k], &p[k], &st[k]) < 0)
			return -1;
	}
	snprintf(what, sizeof(what), "deadlock program %c, iteration %d", cfg->deadlock, it);
	watchdog_arm(cfg->timeout_s, what);
	for (; issued < K && r == dfcclSuccess; issued++) {
		int k = orders[x->rank * K + issued];
		r = deadlock_issue(x, &c[k], &p[k], k, &req[k], &st[k]);
		if (r == dfcclSuccess && cfg->deadlock == 'B' && !cfg->host_buffers && host_synchronize() < 0)
			return -1;
	}
	if (r != dfcclSuccess) {
		gputest_say("iteration %d: submitting collective %d failed: %s: %s", it, orders[x->rank * K + issued - 1],
		    dfcclGetErrorString(r), dfcclGetLastError(NULL));
		return -1;
	}
	/* Waited for in a fixed order, whatever the order of submission. */
	for (int k = 0; k < K; k++) {
		if (cfg->stream && !CUDA_OK(cudaStreamSynchronize(x->streams[k])))
			return -1;
		r = cfg->deadlock == 'A' ? dfcclCommSynchronize(x->comms[k]) : dfcclWait(req[k]);
		if (r != dfcclSuccess) {
			gputest_say("iteration %d: collective %d (%zu floats) failed: %s: %s", it, k, c[k].count,
			    dfcclGetErrorString(r), dfcclGetLastError(NULL));
			return -1;
		}
	}
	watchdog_disarm();
	for (int k = 0; k < K; k++) {
		if (case_verify(x, &c[k], &p[k], &st[k]) < 0)
			return -1;
		if (cfg->stream)
			stream_verify(x, &c[k], &p[k], &st[k], LEAD_NONE);
	}
	return 0;
}

static int deadlock_rank(struct rank_ctx *x)
{
	const struct config *cfg = x->cfg;
	int K = cfg->comms, rc = -1, it = 0;
	struct staging st[MAX_COMMS] = {{0}};
	int *orders = malloc((size_t)cfg->nranks * (size_t)K * sizeof(int));
	if (!orders || arena_open(&x->arenas[ARENA_MAIN], main_kind(cfg),
	                          cfg->max_bytes, cfg->max_bytes, K, NULL) < 0)
		goto out;
	for (int k = 0; k < K; k++)
		if (staging_open(&st[k], cfg->max_bytes, cfg->max_bytes, cfg->stream) < 0)
			goto out;
	for (; it < cfg->iters; it++)
		if (deadlock_iteration(x, it, orders, st) < 0)
			goto out;
	rc = 0;
out:
	for (int k = 0; k < K; k++)
		staging_close(&st[k]);
	arena_close(&x->arenas[ARENA_MAIN], NULL);
	free(orders);
	printf(PROG ": rank %d (GPU %d): deadlock program %c: %d of %d iterations, %" PRIu64
	       " all-reduces checked, %" PRIu64 " failures\n",
	       x->rank, x->gpu, cfg->deadlock, it, cfg->iters, x->checks, x->failures);
	return rc;
}

/* ---------------------------------------------------------------- rank processes */

/* Runs in the forked child: CUDA and libdfccl start here. */
static int rank_main(int rank, void *arg)
{
	const struct config *cfg = arg;
	struct rank_ctx x = {.cfg = cfg, .rank = rank, .gpu = tool_rank_device(&cfg->gpus, rank, 0)};
	int rc = -1;
	gputest_set_rank(rank);
	/* Program B runs registered collectives of one communicator. */
	x.ncomms = cfg->deadlock == 'A' ? cfg->comms : 1;
	if (!MEM_OK(membuf_use_device(main_kind(cfg), x.gpu)))
		return TOOL_EXIT_FAIL;
	if (!DFCCL_OK(dfcclSetDevice(x.gpu)))
		return TOOL_EXIT_FAIL;
	/* Every rank joins in the same order: each join waits for all ranks. */
	for (int k = 0; k < x.ncomms; k++)
		if (!DFCCL_OK(dfcclCommInitRank(&x.comms[k], cfg->nranks, cfg->ids[k], rank)) ||
		    (cfg->stream && !CUDA_OK(cudaStreamCreateWithFlags(&x.streams[k], cudaStreamNonBlocking))))
			goto out;
	if (cfg->stream && !cfg->deadlock && lead_open(&x) < 0) {
		gputest_say("FAIL rank %d: no memory for the lead all-reduce of the grouped cases", rank);
		x.failures++;
		lead_close(&x);
	}
	rc = cfg->deadlock ? deadlock_rank(&x) : sweep_rank(&x);
	lead_close(&x);
out:
	/* A rank that stopped early aborts, so that its peers' collectives fail
	 * instead of waiting for it; wrong data alone does not stop a rank. */
	for (int k = 0; k < x.ncomms; k++)
		if (x.comms[k])
			DFCCL_OK(rc ? dfcclCommAbort(x.comms[k]) : dfcclCommDestroy(x.comms[k]));
	fflush(NULL);
	return rc || x.failures ? TOOL_EXIT_FAIL : 0;
}

/* ---------------------------------------------------------------- options */

/* Parses argv into cfg; returns -1 to go on, else the exit status. */
static int parse_options(int argc, char **argv, struct config *cfg)
{
	static const struct option opts[] = {
	    {"socket", required_argument, NULL, 'S'},   {"nranks", required_argument, NULL, 'n'},
	    {"gpus", required_argument, NULL, 'g'},     {"seed", required_argument, NULL, 's'},
	    {"quick", no_argument, NULL, 'q'},          {"avg-ulps", required_argument, NULL, 'u'},
	    {"host-buffers", no_argument, NULL, 'H'},   {"deadlock", required_argument, NULL, 'd'},
	    {"comms", required_argument, NULL, 'k'},    {"iters", required_argument, NULL, 'i'},
	    {"min-bytes", required_argument, NULL, 'a'}, {"max-bytes", required_argument, NULL, 'b'},
	    {"print-pattern", no_argument, NULL, 'p'},  {"timeout", required_argument, NULL, 't'},
	    {"buffers", required_argument, NULL, 'B'},  {"help", no_argument, NULL, 'h'},
	    {"stream", no_argument, NULL, 'O'},
	    {NULL, 0, NULL, 0},
	};
	long v;
	int opt;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'S': setenv("DFCCL_SOCKET", optarg, 1); break;
		case 'n':
			if (!tool_parse_long(optarg, 1, MAX_RANKS, &v))
				return gputest_usage_error("--nranks takes 1 to 64, not", optarg);
			cfg->nranks = (int)v;
			break;
		case 'g':
			if (!tool_parse_devices(optarg, &cfg->gpus))
				return gputest_usage_error("--gpus takes comma-separated GPU indices, not", optarg);
			break;
		case 's':
			if (!tool_parse_size(optarg, &cfg->seed))
				return gputest_usage_error("--seed takes a number, not", optarg);
			break;
		case 'q': cfg->quick = true; break;
		case 'u':
			if (!tool_parse_long(optarg, 0, 1000000, &v))
				return gputest_usage_error("--avg-ulps takes a count, not", optarg);
			cfg->avg_ulps = (int)v;
			break;
		case 'H': cfg->host_buffers = true; break;
		case 'O': cfg->stream = true; break;
		case 'B':
			cfg->buffers = -1;
			for (size_t k = 0; k < sizeof(buffer_kinds) / sizeof(buffer_kinds[0]); k++)
				if (!strcmp(optarg, buffer_kinds[k].name))
					cfg->buffers = buffer_kinds[k].kind;
			if (cfg->buffers < 0)
				return gputest_usage_error("--buffers takes cudamalloc, vmm or memalloc, not", optarg);
			break;
		case 't':
			if (!tool_parse_long(optarg, 0, 86400, &v))
				return gputest_usage_error("--timeout takes seconds, not", optarg);
			cfg->timeout_s = (unsigned)v;
			break;
		case 'd':
			if (strcmp(optarg, "A") && strcmp(optarg, "B"))
				return gputest_usage_error("--deadlock takes A or B, not", optarg);
			cfg->deadlock = optarg[0];
			break;
		case 'k':
			if (!tool_parse_long(optarg, 1, MAX_COMMS, &v))
				return gputest_usage_error("--comms takes 1 to 64, not", optarg);
			cfg->comms = (int)v;
			break;
		case 'i':
			if (!tool_parse_long(optarg, 1, 100000000, &v))
				return gputest_usage_error("--iters takes a positive number, not", optarg);
			cfg->iters = (int)v;
			break;
		case 'a':
		case 'b':
			if (!tool_parse_size(optarg, opt == 'a' ? &cfg->min_bytes : &cfg->max_bytes))
				return gputest_usage_error("not a size:", optarg);
			break;
		case 'p': cfg->print_pattern = true; break;
		case 'h': fputs(usage, stdout); return 0;
		default: return gputest_usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return gputest_usage_error("unexpected argument", argv[optind]);
	if (cfg->min_bytes == 0 || cfg->min_bytes > cfg->max_bytes || cfg->max_bytes > (1u << 30))
		return gputest_usage_error("need 0 < --min-bytes <= --max-bytes <= 1G; got --max-bytes", "");
	if (cfg->host_buffers && cfg->buffers != MEMBUF_DEVICE)
		return gputest_usage_error("--host-buffers takes no device buffers: drop --buffers",
		                           membuf_kind_name(cfg->buffers));
	if (cfg->stream && (cfg->host_buffers || cfg->deadlock == 'B'))
		return gputest_usage_error("--stream takes GPU buffers and the sweep or program A, not",
		                           cfg->host_buffers ? "--host-buffers" : "--deadlock B");
	if (cfg->print_pattern && !cfg->deadlock)
		return gputest_usage_error("--print-pattern needs", "--deadlock");
	return -1;
}

/* A rank that crashes says where: the trace names the frames, which
 * addr2line turns into lines on the machine that built the program. */
static void on_crash(int sig)
{
	void *frames[48];
	int n = backtrace(frames, 48);
	static const char msg[] = "test_cuda_coll: crashed; stack:\n";
	(void)!write(2, msg, sizeof(msg) - 1);
	backtrace_symbols_fd(frames, n, 2);
	signal(sig, SIG_DFL);
	raise(sig);
}

int main(int argc, char **argv)
{
	gputest_init(PROG);
	signal(SIGSEGV, on_crash);
	signal(SIGBUS, on_crash);
	static struct config cfg = {.nranks = 2, .gpus = {1, {0}}, .buffers = MEMBUF_DEVICE, .timeout_s = 120,
	                            .comms = 8, .iters = 200, .min_bytes = 256, .max_bytes = 1 << 20};
	cfg.seed = (uint64_t)time(NULL);
	int rc = parse_options(argc, argv, &cfg);
	if (rc >= 0)
		return rc;
	if (cfg.print_pattern)
		return print_pattern(&cfg);

	if (!cfg.host_buffers && (rc = gputest_need_gpus(&cfg.gpus)) != 0)
		return rc;
	int nids = cfg.deadlock == 'A' ? cfg.comms : 1;
	for (int k = 0; k < nids; k++)
		if (!DFCCL_OK(dfcclGetUniqueId(&cfg.ids[k])))
			return TOOL_EXIT_FAIL;

	printf(PROG ": %d ranks on GPU(s)", cfg.nranks);
	for (int r = 0; r < cfg.nranks; r++)
		printf("%s%d", r ? "," : " ", tool_rank_device(&cfg.gpus, r, 0));
	if (cfg.deadlock) {
		int first[2 * MAX_COMMS];
		printf(", deadlock program %c: %d %s, %d iterations, %" PRIu64 " to %" PRIu64 " bytes on %s buffers, seed %" PRIu64
		       "\n",
		       cfg.deadlock, cfg.comms, cfg.deadlock == 'A' ? "communicators" : "registered collectives",
		       cfg.iters, cfg.min_bytes, cfg.max_bytes, membuf_kind_name(main_kind(&cfg)), cfg.seed);
		/* The first iteration's orders of ranks 0 and 1, to show that they differ. */
		struct config two = cfg;
		two.nranks = cfg.nranks < 2 ? cfg.nranks : 2;
		pattern_orders(&two, 0, first);
		for (int r = 0; r < two.nranks; r++)
			print_ints(stdout, r ? "  rank 1, iteration 0, order:" : "  rank 0, iteration 0, order:",
			           first + r * cfg.comms, cfg.comms);
	} else {
		printf(", collective sweep%s on %s buffers, seed %" PRIu64 "%s\n", cfg.quick ? " (quick)" : "",
		       membuf_kind_name(main_kind(&cfg)), cfg.seed, cfg.host_buffers ? ", host buffers only" : "");
	}
	int failed = tool_run_ranks(PROG, cfg.nranks, rank_main, &cfg, 30);
	if (failed) {
		printf("FAILED: %d of %d ranks failed (seed %" PRIu64 ")\n", failed, cfg.nranks, cfg.seed);
		return TOOL_EXIT_FAIL;
	}
	printf("OK: every check passed\n");
	return 0;
}
