/*
 * The overlap benchmark's compute kernel, from the host side; see
 * compute.h. The kernel itself is compute_kernel.cu, built only with a
 * CUDA toolkit (DFCCL_HAVE_CUDA); GPU memory, events and copies go through
 * membuf.h.
 */
#include "compute.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "compute_kernel.h"

static _Thread_local char compute_err[400];

static int compute_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int compute_failed(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(compute_err, sizeof(compute_err), fmt, ap);
	va_end(ap);
	return -1;
}

const char *compute_error(void)
{
	return compute_err;
}

/* ---------------------------------------------------------------- the reference */

uint32_t compute_seed(size_t index)
{
	uint64_t z = (uint64_t)index * 0x9e3779b97f4a7c15ull + 0x5eedull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	return (uint32_t)(z ^ (z >> 31));
}

/* x -> mul * x + add (mod 2^32). */
struct affine {
	uint32_t mul, add;
};

/* g after f. */
static struct affine affine_then(struct affine f, struct affine g)
{
	return (struct affine){g.mul * f.mul, g.mul * f.add + g.add};
}

/* The kernel's round applied `rounds` times, by squaring. */
static struct affine affine_rounds(uint64_t rounds)
{
	struct affine all = {1, 0}, step = {COMPUTE_MUL, COMPUTE_ADD};
	for (; rounds; rounds >>= 1) {
		if (rounds & 1)
			all = affine_then(all, step);
		step = affine_then(step, step);
	}
	return all;
}

uint32_t compute_expect(uint32_t x, uint64_t rounds)
{
	struct affine f = affine_rounds(rounds);
	return f.mul * x + f.add;
}

/* ---------------------------------------------------------------- the kernel */

static size_t words(const struct compute *c)
{
	return (size_t)c->blocks * COMPUTE_THREADS * COMPUTE_LANES;
}

#ifdef DFCCL_HAVE_CUDA

int compute_require(void)
{
	return 0;
}

static int kernel_grid(struct compute *c)
{
	int e = compute_kernel_grid(&c->blocks);
	return e ? compute_failed("sizing the compute kernel's grid: %s", compute_kernel_error(e)) : 0;
}

static int kernel_launch(struct compute *c, uint32_t rounds)
{
	int e = compute_kernel_launch(c->buf, c->blocks, rounds, c->stream);
	if (e)
		return compute_failed("launching the compute kernel: %s", compute_kernel_error(e));
	c->done += rounds;
	return 0;
}

#else /* no CUDA toolkit at build time */

int compute_require(void)
{
	return compute_failed("the compute kernel runs on a GPU, and this build has no CUDA (no CUDA toolkit was "
	                      "found when dfccl was built)");
}

static int kernel_grid(struct compute *c)
{
	(void)c;
	return compute_require();
}

static int kernel_launch(struct compute *c, uint32_t rounds)
{
	(void)c;
	(void)rounds;
	return compute_require();
}

#endif /* DFCCL_HAVE_CUDA */

/* A failure of membuf's, said as the compute kernel's. */
static int mem_failed(const char *what)
{
	return compute_failed("%s: %s", what, membuf_error());
}

int compute_open(struct compute *c, membuf_stream_t stream)
{
	*c = (struct compute){.stream = stream, .rounds = 1};
	if (kernel_grid(c) < 0)
		return -1;
	size_t n = words(c);
	uint32_t *img = malloc(n * sizeof(*img));
	if (!img)
		return compute_failed("out of memory for the compute kernel's %zu words", n);
	for (size_t i = 0; i < n; i++)
		img[i] = compute_seed(i);
	int rc = membuf_alloc(MEMBUF_DEVICE, (void **)&c->buf, n * sizeof(*img));
	if (rc < 0)
		mem_failed("allocating the compute kernel's buffer");
	else if ((rc = membuf_put(MEMBUF_DEVICE, c->buf, img, n * sizeof(*img))) < 0)
		mem_failed("seeding the compute kernel's buffer");
	free(img);
	if (rc < 0)
		compute_close(c);
	return rc;
}

void compute_close(struct compute *c)
{
	membuf_free(MEMBUF_DEVICE, c->buf);
	*c = (struct compute)COMPUTE_INIT;
}

int compute_launch(struct compute *c)
{
	return kernel_launch(c, c->rounds);
}

int compute_time(struct compute *c, long n, double *us)
{
	membuf_event_t ev[2] = {NULL, NULL};
	double ms = 0;
	int rc = -1;
	if (membuf_event_create(&ev[0]) < 0 || membuf_event_create(&ev[1]) < 0 ||
	    membuf_event_record(ev[0], c->stream) < 0) {
		mem_failed("timing the compute kernel");
		goto out;
	}
	for (long i = 0; i < n; i++)
		if (compute_launch(c) < 0)
			goto out;
	if (membuf_event_record(ev[1], c->stream) < 0 || membuf_event_elapsed(ev[0], ev[1], &ms) < 0) {
		mem_failed("timing the compute kernel");
		goto out;
	}
	*us = n > 0 ? ms * 1e3 / (double)n : 0;
	rc = 0;
out:
	membuf_event_destroy(ev[0]);
	membuf_event_destroy(ev[1]);
	return rc;
}

/*
 * Three passes from a short kernel: each scales the rounds by the time
 * asked over the time measured. The first also loads the module and wakes
 * the clocks up; the launch overhead in the times makes the scaling
 * converge rather than land in one step. Each pass takes about 50 ms of
 * launches (at least one).
 */
int compute_calibrate(struct compute *c, long us, long given)
{
	double rounds = 256, t = 0;
	long n = us < 50000 / 20 ? 20 : 50000 / us > 1 ? 50000 / us : 1;
	if (given > COMPUTE_MAX_ROUNDS)
		return compute_failed("%ld rounds per launch: at most %ld", given, COMPUTE_MAX_ROUNDS);
	if (given > 0) {
		c->rounds = (uint32_t)given;
		return 0;
	}
	if (us < 1 || us > COMPUTE_MAX_US)
		return compute_failed("a compute kernel of %ld us: the length is 1 to %ld us", us, COMPUTE_MAX_US);
	for (int pass = 0; pass < 3; pass++) {
		c->rounds = (uint32_t)rounds;
		if (compute_time(c, n, &t) < 0)
			return -1;
		if (t > 0)
			rounds = rounds * (double)us / t;
		rounds = rounds < 1 ? 1 : rounds > (double)COMPUTE_MAX_ROUNDS ? (double)COMPUTE_MAX_ROUNDS : rounds;
	}
	c->rounds = (uint32_t)rounds;
	return 0;
}

int compute_check(struct compute *c, size_t *wrong)
{
	size_t n = words(c);
	uint32_t *img = malloc(n * sizeof(*img));
	if (!img)
		return compute_failed("out of memory for a copy of the compute kernel's %zu words", n);
	int rc = membuf_sync(MEMBUF_DEVICE);
	if (rc == 0)
		rc = membuf_get(MEMBUF_DEVICE, img, c->buf, n * sizeof(*img));
	if (rc < 0) {
		free(img);
		return mem_failed("reading the compute kernel's buffer");
	}
	struct affine f = affine_rounds(c->done);
	*wrong = 0;
	for (size_t i = 0; i < n; i++)
		*wrong += img[i] != f.mul * compute_seed(i) + f.add;
	free(img);
	return 0;
}
