/*
 * Timing one collective over a sweep of sizes, as dfccl-perf and `dfcclctl
 * tune` both do it, on dfccl or, for a side-by-side ratio, on NCCL.
 *
 * Each rank is a process of its own (tool_run_ranks): it joins one
 * communicator on its device and allocates its buffers once, for the
 * largest size of the sweep (bench_join): host memory from
 * dfcclMemAllocHost, or GPU memory of one of membuf.h's kinds on that
 * device, where reference data is copied in and results are copied out for
 * the check. On dfccl the device is tool_rank_device's (by default rank %
 * the daemon's devices); on NCCL, which needs a GPU of its own per rank,
 * rank r runs on GPU r unless the spec's devices say otherwise (the caller
 * makes sure no two ranks share one), and with `symmetric` the buffers come
 * from ncclMemAlloc and are registered as symmetric windows
 * (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC, as nccl-tests -R 2
 * does).
 *
 * A batch is B collectives issued back to back, inside one group (dfccl's or
 * NCCL's GroupStart/End) or, `ungrouped`, as B plain calls (a batch of one
 * is the plain call either way, as nccl-tests issues it). Per size and
 * form (out of place or in place), bench_measure times them in one of two
 * modes:
 *   - callback (dfccl only): the host-side form, NULL-stream calls completed
 *     by the daemon: WARMUP untimed batches, a barrier, then ITERS timed
 *     batches, each waited for with dfcclCommSynchronize, timed on the host
 *     clock;
 *   - stream: nccl-tests' way, on a CUDA stream of the rank's own
 *     (cudaStreamNonBlocking): WARMUP untimed batches and a wait for the
 *     stream, a barrier, then an event, ITERS batches back to back, an
 *     event, and a wait; the time is the GPU's between the two events. The
 *     wait polls the stream and the communicator's asynchronous error, so a
 *     collective that fails ends the wait with its error instead of a hang.
 * The time of one collective is the elapsed time over ITERS * B as this rank
 * measured it.
 *
 * With `overlap_us` (stream mode), every iteration is a trainer's step: the
 * compute kernel of compute.h, of about that many microseconds, then the
 * batch, on the same stream. bench_measure then also times the kernel alone
 * in the same loop (ITERS launches between two events, after a barrier),
 * and gives the time per iteration of both loops and the time the
 * collectives added, per collective: what a trainer pays for the
 * collective beyond its compute. The kernel never touches the
 * collectives' buffers; with `check` its own result is checked too (a
 * wrong one fails the rank). Its length is calibrated by every rank at
 * join, and the ranks run the mean of their rounds (or compute_rounds).
 *
 * The barrier is an all-reduce of one element on the backend measured,
 * waited for. With `check`, one more collective runs in the same mode on
 * reference data (tool.h), after a launch of the kernel with overlap, and
 * the wrong elements of every rank are summed over the ranks, so every rank
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

#include "compute.h"
#include "dfccl.h"
#include "membuf.h"
#include "nccl_lib.h"
#include "tool.h"

/* More than a sweep can hold: 4 GiB is at most 33 doublings from 1 byte. */
#define BENCH_MAX_SIZES 64

/* The library measured. */
enum bench_backend {
	BENCH_DFCCL,
	BENCH_NCCL, /* loaded with nccl_lib_open() before the ranks start */
};

/* How the collectives are issued and completed (see above). */
enum bench_mode {
	BENCH_CALLBACK,
	BENCH_STREAM,
};

/* What every rank of one sweep runs. Zeroed fields mean dfccl, callback
 * mode, grouped batches. */
struct bench_spec {
	const char *name;  /* the tool, for messages */
	int coll, dtype, op, root, nranks, batch;
	uint64_t min_bytes, max_bytes;
	long factor; /* 1 measures min_bytes alone */
	long iters, warmup;
	bool check;
	const char *algo;  /* DFCCL_ALGO of the rank processes; NULL: as inherited */
	int mem;           /* enum membuf_kind of the send and receive buffers */
	struct tool_devices devices; /* the ranks' devices (n == 0: see above) */
	int backend;       /* enum bench_backend */
	int mode;          /* enum bench_mode */
	bool ungrouped;    /* a batch is B plain calls, not one group */
	bool symmetric;    /* NCCL: the buffers are symmetric windows (mem is MEMBUF_NCCL) */
	long overlap_us;   /* > 0: a compute kernel of about this long before every iteration */
	long compute_rounds; /* overlap: the kernel's rounds per launch; 0: calibrated */
	dfcclUniqueId id;  /* dfccl's communicator */
	ncclUniqueId nccl_id; /* NCCL's */
};

/* One size of a sweep: the call's count and the size in bytes it stands for. */
struct bench_size {
	size_t count;
	size_t bytes;
};

/* One measurement of one size and form. */
struct bench_result {
	bool valid;     /* the collective has this form (in place) and it was measured */
	double us;      /* per collective; with overlap, the time the collective added */
	uint64_t wrong; /* wrong elements over all ranks (0 without check) */
	double compute_us, total_us; /* overlap: per iteration, the kernel alone and with the batch */
	double issue_us; /* the host's time per collective to make the calls, before the wait (with overlap,
	                  * the compute kernel's launch too); where it comes close to `us`, the host paces the
	                  * daemon */
};

/* A rank's part of a sweep. */
struct bench_rank {
	const struct bench_spec *spec;
	int rank;
	int device;
	dfcclComm_t comm;     /* dfccl */
	ncclComm_t ncomm;     /* NCCL */
	ncclWindow_t win[2];  /* NCCL symmetric: the send and receive buffers' windows */
	membuf_stream_t stream;  /* stream mode */
	membuf_event_t ev[2];    /* stream mode: around the timed batches */
	struct membuf_pair bufs;
	struct compute compute;  /* overlap */
	int64_t *cell; /* the barrier's element: host memory on dfccl, GPU memory on NCCL */
	char err[640]; /* what failed outside libdfccl, for bench_leave */
};

#define BENCH_RANK_INIT {0}

/* The name of a backend or mode ("dfccl", "nccl"; "callback", "stream"),
 * and back (-1 when s is none). */
const char *bench_backend_name(int backend);
int bench_backend_parse(const char *s);
const char *bench_mode_name(int mode);
int bench_mode_parse(const char *s);

/*
 * The sizes of s's sweep, min_bytes, min_bytes * factor, ... up to
 * max_bytes, into out[BENCH_MAX_SIZES]; a size too small to give every rank
 * one element of the collective is left out. Returns how many there are.
 */
unsigned bench_sizes(const struct bench_spec *s, struct bench_size *out);

/*
 * Joins rank `rank` of s's communicator and allocates its buffers (and, in
 * stream mode, its stream and events; with overlap, the compute kernel,
 * calibrated). A failure outside libdfccl (GPU
 * memory, CUDA, NCCL) returns dfcclUnhandledCudaError with the reason in
 * b->err. Sets DFCCL_ALGO first when s->algo says so: libdfccl reads it
 * once, at the process's first collective, and a rank process is new. On
 * failure the caller still calls bench_leave.
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
