/*
 * Timing one collective over a sweep of sizes, as dfccl-perf and `dfcclctl
 * tune` both do it.
 *
 * Each rank is a process of its own (tool_run_ranks): it joins one
 * communicator on its device (tool_rank_device: by default rank % the
 * daemon's devices) and allocates its buffers once, for the largest size of
 * the sweep (bench_join): host memory from dfcclMemAllocHost, or GPU memory
 * of one of membuf.h's kinds on that device, where reference data is copied
 * in and results are copied out for the check. Per size and form (out of
 * place or in place), bench_measure runs WARMUP untimed iterations, a
 * barrier (an all-reduce of one element, waited for), then ITERS timed
 * iterations, each a batch of B collectives issued back to back inside one
 * group and then waited for with dfcclCommSynchronize; the time of one
 * collective is the elapsed time over ITERS * B as this rank measured it.
 * With `check`, one more collective runs on reference data (tool.h) and the
 * wrong elements of every rank are summed over the ranks, so every rank
 * learns whether the result was right.
 *
 * Sizes are nccl-tests' (tool_count_for): the larger buffer of the call,
 * which is also the `bytes` of the daemon's selection table (topo_select.h:
 * the buffer of an all-reduce, broadcast or reduce, the whole output of an
 * all-gather, the whole input of a reduce-scatter).
 */
#ifndef DFCCL_BENCH_H
#define DFCCL_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dfccl.h"
#include "membuf.h"
#include "tool.h"

/* More than a sweep can hold: 4 GiB is at most 33 doublings from 1 byte. */
#define BENCH_MAX_SIZES 64

/* What every rank of one sweep runs. */
struct bench_spec {
	const char *name;  /* the tool, for messages */
	int coll, dtype, op, root, nranks, batch;
	uint64_t min_bytes, max_bytes;
	long factor; /* 1 measures min_bytes alone */
	long iters, warmup;
	bool check;
	const char *algo;  /* DFCCL_ALGO of the rank processes; NULL: as inherited */
	int mem;           /* enum membuf_kind of the send and receive buffers */
	struct tool_devices devices; /* the ranks' devices (n == 0: rank % the daemon's) */
	dfcclUniqueId id;
};

/* One size of a sweep: the call's count and the size in bytes it stands for. */
struct bench_size {
	size_t count;
	size_t bytes;
};

/* One measurement of one size and form. */
struct bench_result {
	bool valid;     /* the collective has this form (in place) and it was measured */
	double us;      /* per collective */
	uint64_t wrong; /* wrong elements over all ranks (0 without check) */
};

/* A rank's part of a sweep. */
struct bench_rank {
	const struct bench_spec *spec;
	int rank;
	int device;
	dfcclComm_t comm;
	struct membuf_pair bufs;
	int64_t *cell; /* the barrier's element (host memory) */
	char err[320]; /* what failed outside libdfccl, for bench_leave */
};

#define BENCH_RANK_INIT {0}

/*
 * The sizes of s's sweep, min_bytes, min_bytes * factor, ... up to
 * max_bytes, into out[BENCH_MAX_SIZES]; a size too small to give every rank
 * one element of the collective is left out. Returns how many there are.
 */
unsigned bench_sizes(const struct bench_spec *s, struct bench_size *out);

/*
 * Joins rank `rank` of s's communicator and allocates its buffers. A
 * failure to set up GPU memory returns dfcclUnhandledCudaError (the reason
 * in b->err). Sets
 * DFCCL_ALGO first when s->algo says so: libdfccl reads it once, at the
 * process's first collective, and a rank process is new. On failure the
 * caller still calls bench_leave.
 */
dfcclResult_t bench_join(struct bench_rank *b, const struct bench_spec *s, int rank);

/* Times one size (see above), out of place or in place, into *m. */
dfcclResult_t bench_measure(struct bench_rank *b, const struct bench_size *z, bool inplace, struct bench_result *m);

/* The sum of every rank's v, in *sum; a barrier too. */
dfcclResult_t bench_allsum(struct bench_rank *b, int64_t v, int64_t *sum);

/*
 * Ends the rank's part: after a failure r, says so on stderr ("NAME: rank
 * N: ...") and aborts the communicator (its peers may be stuck in a
 * collective), else destroys it; frees the buffers. Returns r.
 */
dfcclResult_t bench_leave(struct bench_rank *b, dfcclResult_t r);

#endif /* DFCCL_BENCH_H */
