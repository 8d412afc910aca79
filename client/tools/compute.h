/*
 * A trainer's compute, for the overlap benchmark of dfccl-perf: a kernel
 * (compute_kernel.h) that keeps the SMs of the calling thread's GPU busy
 * for about a given time, launched on a stream of the caller's before the
 * collectives, and the exact check of what it computed.
 *
 * The kernel works on a buffer of its own (never a collective's): every
 * 32-bit word starts as compute_seed(index) and each launch applies
 * `rounds` rounds of x -> COMPUTE_MUL * x + COMPUTE_ADD (mod 2^32) to it. The
 * host follows how many rounds were launched in all (`done`), so the
 * expected content is compute_expect(compute_seed(i), done), computed in
 * O(log done) steps by composing the affine map with itself: a launch that
 * did not run, ran twice or ran short shows.
 *
 * The rounds per launch set the kernel's length. compute_calibrate measures
 * it on the stream and sets the rounds that take about the time asked, on
 * the GPU as it is at that moment; a caller that compares two runs (alone,
 * and beside other work) gives the second the first's rounds instead.
 *
 * Functions return 0 or -1; after -1, compute_error() says what failed. In
 * a build without a CUDA toolkit every GPU function fails, saying so.
 */
#ifndef DFCCL_COMPUTE_H
#define DFCCL_COMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "membuf.h"

/* The longest kernel the benchmark asks for (us). */
#define COMPUTE_MAX_US 1000000L
/* The most rounds per launch. */
#define COMPUTE_MAX_ROUNDS (1L << 31)

struct compute {
	membuf_stream_t stream; /* the caller's: launches and timing go there */
	uint32_t *buf;          /* GPU memory: words() 32-bit words */
	unsigned blocks;        /* the grid (compute_kernel.h) */
	uint32_t rounds;        /* per launch */
	uint64_t done;          /* rounds launched in all since compute_open */
};

#define COMPUTE_INIT {0}

/* What the last failure of this thread's compute calls was. */
const char *compute_error(void);

/* 0 if this build can run the kernel; else -1 (a build without CUDA). */
int compute_require(void);

/* The grid and the seeded buffer on the calling thread's current GPU,
 * launches on stream; rounds is 1 until set or calibrated. */
int compute_open(struct compute *c, membuf_stream_t stream);
void compute_close(struct compute *c); /* a closed or COMPUTE_INIT one: nothing */

/* Sets c->rounds to `rounds` where that is positive (1 to
 * COMPUTE_MAX_ROUNDS), else to the rounds with which one launch takes about
 * us microseconds on the stream (1 to COMPUTE_MAX_US), measured; the
 * calibration's launches count in done. */
int compute_calibrate(struct compute *c, long us, long rounds);

/* One launch of c->rounds rounds on the stream. */
int compute_launch(struct compute *c);

/* n launches back to back between two events on the stream, waited for:
 * in *us the time of one. */
int compute_time(struct compute *c, long n, double *us);

/* Waits for the GPU, reads the buffer back and counts in *wrong the words
 * that differ from what c->done rounds make of their seeds; -1 only when
 * the buffer could not be read. */
int compute_check(struct compute *c, size_t *wrong);

/* The first value of word `index`, and what `rounds` rounds make of x. */
uint32_t compute_seed(size_t index);
uint32_t compute_expect(uint32_t x, uint64_t rounds);

#endif /* DFCCL_COMPUTE_H */
