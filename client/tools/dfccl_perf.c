/*
 * dfccl-perf: bandwidth and latency of dfccl collectives, with the flags and
 * columns of nccl-tests so that results compare line by line, and the same
 * measurement on NCCL (--backend nccl) for a ratio taken in one run on one
 * machine.
 *
 * It forks one process per rank; each runs the sweep of bench.h (one
 * communicator, per size WARMUP untimed batches, a barrier, ITERS timed
 * batches of B collectives), out of place and then in place, and rank 0
 * prints its times. With -c 1 every size is also checked on reference data
 * (tool.h); #wrong is the wrong elements summed over the ranks. algbw =
 * size / time, busbw = algbw * factor, nccl-tests' factors: all-reduce
 * 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n, the others
 * 1. Sizes follow nccl-tests too: the larger buffer of the call (see
 * tool_count_for).
 *
 * Two modes (bench.h): stream, nccl-tests' way (each collective on a CUDA
 * stream, timed with CUDA events), and callback, dfccl's host-side form
 * (NULL-stream calls, each batch waited for with dfcclCommSynchronize).
 * NCCL has the stream form only.
 *
 * The send and receive buffers are host memory from dfcclMemAllocHost, or
 * with --mem device, vmm, memalloc or nccl GPU memory on each rank's device
 * (cudaMalloc, a VMM allocation exportable as a file descriptor,
 * dfcclMemAlloc's memory, or ncclMemAlloc's; a build with a CUDA toolkit):
 * the check copies the reference data in and the result out (membuf.h).
 *
 * With --overlap US, every timed iteration is a trainer's step on the
 * rank's stream: a compute kernel of about US microseconds (compute.h),
 * then the collective; the kernel alone is timed in the same loop, and the
 * columns become the kernel's time alone, the step's, and the time the
 * collective added (bench.h). --compute-only US runs that kernel alone in
 * this one process, no daemon and no collective: the bystander of
 * tests/perf/overlap.sh, timed alone and beside a dfccl job on its GPU.
 * --queue-only times the daemon's queue without a collective: a NOP entry
 * submitted and waited for, one at a time, in this one process -- the
 * floor under every collective of the callback form (the client's write,
 * the engine's take and completion, the client's sight of it).
 *
 * Everything that decides whether the run can happen (options, the NCCL
 * library, CUDA in this build, the GPUs) is settled in the parent before
 * any rank starts; the parent never touches CUDA, so the ranks it forks
 * can (NCCL's unique id is made in the parent too: it starts NCCL's
 * bootstrap thread there and nothing on a GPU).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "compute.h"
#include "compute_kernel.h"
#include "dfccl.h"
#include "dfccl_internal.h"
#include "dfccl_queue.h"
#include "membuf.h"
#include "nccl_lib.h"
#include "tool.h"

static const char usage[] =
    "Usage: dfccl-perf COLLECTIVE [OPTIONS]\n"
    "       dfccl-perf --compute-only US [-n N] [-w N] [--devices D] [--compute-rounds R] [--json]\n"
    "       dfccl-perf --queue-only [-n N] [-w N] [--devices D] [--mode MODE] [--json] [--socket PATH]\n"
    "COLLECTIVE: allreduce allgather reducescatter broadcast reduce sendrecv alltoall\n"
    "Measures dfccl collectives the way nccl-tests does: one line per size with\n"
    "size, count, type, redop, root, time, algbw, busbw and #wrong, out of place\n"
    "and in place (busbw factors: all-reduce 2(n-1)/n, all-gather, reduce-scatter\n"
    "and all-to-all (n-1)/n, others 1), and the average bus bandwidth at the end;\n"
    "with --backend nccl, the same measurement on NCCL.\n"
    "\n"
    "  -b, --minbytes SIZE    smallest size (default 8; K, M, G suffixes)\n"
    "  -e, --maxbytes SIZE    largest size (default 64M)\n"
    "  -f, --stepfactor N     multiply the size by N between lines (default 2)\n"
    "  -n, --iters N          timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N   untimed iterations per size (default 5)\n"
    "  -c, --check 0|1        check the results (default 1)\n"
    "      --nranks N         rank processes (default 2), spread over the daemon's devices\n"
    "      --devices LIST     comma-separated devices of the ranks, as dfcclSetDevice takes them\n"
    "                         (CUDA ordinals where the ranks see GPUs): rank r on the (r mod\n"
    "                         length)-th (default: rank r on device r mod dfcclGetDeviceCount;\n"
    "                         with --backend nccl, rank r on GPU r)\n"
    "      --backend NAME     dfccl (default), or nccl: the same measurement on NCCL, loaded\n"
    "                         at run time, one rank process per GPU (no two ranks may share\n"
    "                         one); needs a build with a CUDA toolkit, not dfccld\n"
    "      --nccl-lib PATH    the NCCL library to load (default $DFCCL_NCCL_LIB, else\n"
    "                         libnccl.so.2 from the library path: LD_LIBRARY_PATH)\n"
    "      --nccl-symmetric   NCCL's buffers from ncclMemAlloc, registered as symmetric\n"
    "                         windows (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC,\n"
    "                         as nccl-tests -R 2); NCCL 2.27 or later\n"
    "      --mode MODE        stream: every collective on a CUDA stream of the rank's own,\n"
    "                         the timed iterations back to back between two CUDA events,\n"
    "                         as nccl-tests; callback: dfccl's host-side form, NULL-stream\n"
    "                         calls, each iteration waited for with dfcclCommSynchronize,\n"
    "                         timed on the host clock (dfccl only). Default: stream for GPU\n"
    "                         buffers and on NCCL, callback for host buffers\n"
    "      --mem KIND         where the buffers are: host (dfcclMemAllocHost, default);\n"
    "                         on the rank's GPU, device (cudaMalloc), vmm (cuMemCreate\n"
    "                         exportable as a POSIX file descriptor, mapped with cuMemMap),\n"
    "                         memalloc (dfcclMemAlloc: device memory the daemon owns) or\n"
    "                         nccl (ncclMemAlloc); the GPU kinds need a build with a CUDA\n"
    "                         toolkit (and on dfccl the CUDA engine). --backend nccl takes\n"
    "                         device (its default), vmm or nccl\n"
    "      --dtype TYPE       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
    "                         (default float)\n"
    "      --op OP            reduction: sum prod max min avg (default sum)\n"
    "      --batch B          B collectives back to back per iteration (default 1); the\n"
    "                         time column is per collective\n"
    "      --group 0|1        1: the B collectives inside one GroupStart/GroupEnd (default;\n"
    "                         with --batch 1 the plain call, as nccl-tests); 0: B plain calls\n"
    "      --algo NAME        algorithm: auto direct ring tree multitree, where it can run\n"
    "                         the collective (default auto: the daemon's choice; sets\n"
    "                         DFCCL_ALGO in the rank processes)\n"
    "      --overlap US       a trainer's step: on each rank's stream, a compute kernel of about\n"
    "                         US microseconds (1 to 1000000; every SM busy, on a buffer of its\n"
    "                         own) before every iteration's collectives. The kernel alone is\n"
    "                         timed in the same loop; per size the columns are the kernel's\n"
    "                         time alone and with the collectives, per iteration, and the time\n"
    "                         added per collective. Stream mode, GPU buffers (default device);\n"
    "                         a build with a CUDA toolkit\n"
    "      --compute-only US  no collective and no daemon: the compute kernel alone, -n times\n"
    "                         after -w untimed, on the first of --devices (default GPU 0); prints\n"
    "                         its time per iteration and checks its result\n"
    "      --queue-only       no collective: a NOP entry submitted to the daemon and waited for,\n"
    "                         one at a time, -n times after -w untimed, on the first of --devices\n"
    "                         (the daemon's device index, default 0); prints the round trip's\n"
    "                         median, mean, min, 99th percentile and max: the queue's own cost\n"
    "                         under every collective of the callback form. With --mode stream,\n"
    "                         the entries are stream-ordered back to back on a CUDA stream of\n"
    "                         that GPU (a build with a CUDA toolkit), and it prints the time per\n"
    "                         entry (the stream's round trip, or the host's cost to issue one,\n"
    "                         whichever is longer); D is then also the GPU's CUDA ordinal\n"
    "      --compute-rounds R the kernel's rounds per launch (its length) instead of calibrating\n"
    "                         them to US on the GPU as it is: a second run given the first's R\n"
    "                         does exactly the same work\n"
    "      --json             one JSON object per size instead of the table\n"
    "      --socket PATH      the daemon's socket (default $DFCCL_SOCKET)\n"
    "  -h, --help             this text\n"
    "  -V, --version          the library version\n"
    "\n"
    "The header says the backend and its library version, the mode, symmetric, batch and\n"
    "group; so does every --json object.\n"
    "\n"
    "Exit status: 0 success, 1 a collective failed or returned wrong data, 2 usage, or\n"
    "what was asked cannot run here (no NCCL, a build without CUDA, too few GPUs).\n";

struct perf {
	struct bench_spec spec;
	long compute_only_us; /* --compute-only */
	bool queue_only;      /* --queue-only */
	bool json;
	int version;      /* the backend library's version code */
	char library[80]; /* "dfccl 0.1.0", "NCCL 2.28.9" */
	char where[4096]; /* NCCL: the file it was loaded from */
};

/* The overlap table's header: the kernel, then the columns. */
static void print_overlap_header(const struct bench_spec *s, const struct compute *c)
{
	printf("# overlap: before every iteration, a compute kernel of about %ld us on the rank's stream (%u blocks of "
	       "%d threads, %u rounds per launch, %s)\n",
	       s->overlap_us, c->blocks, COMPUTE_THREADS, c->rounds, s->compute_rounds ? "as given" : "calibrated");
	printf("# compute: the kernel alone per iteration; total: kernel and collectives per iteration; added: "
	       "(total - compute) per collective\n");
	printf("#%58s %-33s %-33s\n", "", "out-of-place", "in-place");
	printf("#%11s %13s %9s %7s %6s %8s %8s %8s %6s %8s %8s %8s %6s\n", "size", "count", "type", "redop", "root",
	       "compute", "total", "added", "#wrong", "compute", "total", "added", "#wrong");
	printf("#%11s %13s %9s %7s %6s %8s %8s %8s %6s %8s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
	       "(us)", "(us)", "", "(us)", "(us)", "(us)", "");
}

static void print_header(const struct perf *p, const struct compute *c)
{
	const struct bench_spec *s = &p->spec;
	printf("# dfccl-perf %s: %d ranks, %s, %s buffers, %ld warmup and %ld timed iterations per size\n",
	       tool_coll_name(s->coll), s->nranks, tool_dtype_name(s->dtype), membuf_kind_name(s->mem), s->warmup,
	       s->iters);
	printf("# backend %s (%s%s%s), mode %s, symmetric %d, batch %d, group %d\n", bench_backend_name(s->backend),
	       p->library, p->where[0] ? " from " : "", p->where, bench_mode_name(s->mode), s->symmetric, s->batch,
	       !s->ungrouped);
	if (s->overlap_us > 0) {
		print_overlap_header(s, c);
		return;
	}
	printf("#%58s %-31s %-31s\n", "", "out-of-place", "in-place");
	printf("#%11s %13s %9s %7s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
	       "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
	printf("#%11s %13s %9s %7s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
	       "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

/* One form's columns; the figure averaged at the end (busbw, or the added
 * time with overlap) goes into *sum. */
static void print_measure(const struct bench_spec *s, size_t bytes, const struct bench_result *m, double *sum,
                          int *n)
{
	bool overlap = s->overlap_us > 0;
	if (!m->valid) {
		printf(overlap ? " %8s %8s %8s %6s" : " %8s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
		return;
	}
	double algbw = (double)bytes / (m->us * 1e-6) / 1e9, busbw = algbw * tool_bus_factor(s->coll, s->nranks);
	*sum += overlap ? m->us : busbw;
	(*n)++;
	if (overlap)
		printf(" %8.2f %8.2f %8.2f", m->compute_us, m->total_us, m->us);
	else
		printf(" %8.2f %7.2f %7.2f", m->us, algbw, busbw);
	if (s->check)
		printf(" %6" PRIu64, m->wrong);
	else
		printf(" %6s", "N/A");
}

static void json_measure(const struct bench_spec *s, const char *name, size_t bytes, const struct bench_result *m)
{
	if (!m->valid) {
		printf(", \"%s\": null", name);
		return;
	}
	double algbw = (double)bytes / (m->us * 1e-6) / 1e9;
	if (s->overlap_us > 0)
		printf(", \"%s\": {\"compute_us\": %.3f, \"total_us\": %.3f, \"added_us\": %.3f", name, m->compute_us,
		       m->total_us, m->us);
	else
		printf(", \"%s\": {\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f", name, m->us, algbw,
		       algbw * tool_bus_factor(s->coll, s->nranks));
	printf(", \"issue_us\": %.3f", m->issue_us);
	if (s->check)
		printf(", \"wrong\": %" PRIu64 "}", m->wrong);
	else
		printf(", \"wrong\": null}");
}

static int perf_rank(int rank, void *arg)
{
	const struct perf *p = arg;
	const struct bench_spec *s = &p->spec;
	struct bench_rank b = BENCH_RANK_INIT;
	struct bench_size sizes[BENCH_MAX_SIZES];
	unsigned nsizes = bench_sizes(s, sizes);
	int navg = 0;
	double avg_sum = 0;
	bool wrong = false;
	dfcclResult_t r = bench_join(&b, s, rank);
	if (r != dfcclSuccess)
		goto out;
	if (rank == 0 && !p->json)
		print_header(p, &b.compute);

	for (unsigned k = 0; k < nsizes; k++) {
		size_t size = sizes[k].bytes, count = sizes[k].count;
		struct bench_result m[2];
		for (int ip = 0; ip < 2 && r == dfcclSuccess; ip++)
			r = bench_measure(&b, &sizes[k], ip, &m[ip]);
		if (r != dfcclSuccess)
			goto out;
		wrong = wrong || m[0].wrong || m[1].wrong;
		if (rank != 0)
			continue;
		bool reduces = tool_coll_reduces(s->coll);
		int root = tool_coll_rooted(s->coll) ? s->root : -1;
		if (p->json) {
			printf("{\"collective\": \"%s\", \"backend\": \"%s\", \"library\": \"%s\", \"version\": %d, "
			       "\"mode\": \"%s\", \"symmetric\": %s, \"nranks\": %d, \"mem\": \"%s\", \"batch\": %d, "
			       "\"group\": %d, \"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
			       "\"root\": %d",
			       tool_coll_name(s->coll), bench_backend_name(s->backend), p->library, p->version,
			       bench_mode_name(s->mode), s->symmetric ? "true" : "false", s->nranks, membuf_kind_name(s->mem),
			       s->batch, !s->ungrouped, size, count, tool_dtype_name(s->dtype),
			       reduces ? tool_op_name(s->op) : "none", root);
			if (s->overlap_us > 0)
				printf(", \"overlap_us\": %ld, \"compute_rounds\": %u, \"compute_blocks\": %u", s->overlap_us,
				       b.compute.rounds, b.compute.blocks);
			json_measure(s, "out_of_place", size, &m[0]);
			json_measure(s, "in_place", size, &m[1]);
			printf("}\n");
		} else {
			printf(" %11zu %13zu %9s %7s %6d", size, count, tool_dtype_name(s->dtype),
			       reduces ? tool_op_name(s->op) : "none", root);
			print_measure(s, size, &m[0], &avg_sum, &navg);
			print_measure(s, size, &m[1], &avg_sum, &navg);
			printf("\n");
		}
		fflush(stdout);
	}
	if (rank == 0 && !p->json) {
		printf("# Out of bounds values : %s\n", wrong ? "wrong results" : "0 OK");
		if (s->overlap_us > 0)
			printf("# Avg added time       : %g us per collective\n", navg ? avg_sum / navg : 0.0);
		else
			printf("# Avg bus bandwidth    : %g\n", navg ? avg_sum / navg : 0.0);
	}
out:
	r = bench_leave(&b, r);
	return r != dfcclSuccess || wrong ? 1 : 0;
}

/*
 * --compute-only: the kernel alone in this process, on one GPU, -w untimed
 * and -n timed launches back to back, then its result checked. No fork
 * follows, so this process may use CUDA itself.
 */
static int perf_compute_only(const struct perf *p)
{
	const struct bench_spec *s = &p->spec;
	struct compute c = COMPUTE_INIT;
	membuf_stream_t st = NULL;
	int dev = tool_rank_device(&s->devices, 0, 1), rc = TOOL_EXIT_FAIL;
	double us = 0, warm;
	size_t wrong = 0;
	if (membuf_use_device(MEMBUF_DEVICE, dev) < 0 || membuf_stream_create(&st) < 0) {
		fprintf(stderr, "dfccl-perf: --compute-only on GPU %d: %s\n", dev, membuf_error());
		goto out;
	}
	if (compute_open(&c, st) < 0 || compute_calibrate(&c, p->compute_only_us, s->compute_rounds) < 0 ||
	    (s->warmup > 0 && compute_time(&c, s->warmup, &warm) < 0) || compute_time(&c, s->iters, &us) < 0 ||
	    compute_check(&c, &wrong) < 0) {
		fprintf(stderr, "dfccl-perf: --compute-only on GPU %d: %s\n", dev, compute_error());
		goto out;
	}
	const char *how = s->compute_rounds > 0 ? "as given" : "calibrated";
	if (p->json) {
		printf("{\"mode\": \"compute-only\", \"device\": %d, \"target_us\": %ld, \"blocks\": %u, \"threads\": %d, "
		       "\"rounds\": %u, \"rounds_from\": \"%s\", \"warmup\": %ld, \"iters\": %ld, \"time_us\": %.3f, "
		       "\"wrong\": %zu}\n",
		       dev, p->compute_only_us, c.blocks, COMPUTE_THREADS, c.rounds, how, s->warmup, s->iters, us, wrong);
	} else {
		printf("# dfccl-perf compute-only: GPU %d, a kernel of about %ld us (%u blocks of %d threads, %u rounds per "
		       "launch, %s), %ld warmup and %ld timed iterations\n",
		       dev, p->compute_only_us, c.blocks, COMPUTE_THREADS, c.rounds, how, s->warmup, s->iters);
		printf("# time per iteration   : %.2f us\n", us);
		printf("# Out of bounds values : %s\n", wrong ? "wrong results" : "0 OK");
	}
	if (wrong)
		fprintf(stderr, "dfccl-perf: the compute kernel's buffer holds %zu wrong words\n", wrong);
	rc = wrong ? TOOL_EXIT_FAIL : 0;
out:
	compute_close(&c);
	membuf_stream_destroy(st);
	return rc;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/*
 * --queue-only --mode stream: -w and then -n NOP entries back to back on a
 * CUDA stream of GPU dev, each armed by the stream once the one before
 * completed (dfcclInternalNopStream), timed on the host clock from the
 * first submission to the last completion: the round trip a stream-ordered
 * collective pays before any of its work, per entry.
 */
static int perf_queue_only_stream(const struct perf *p, int dev)
{
	const struct bench_spec *s = &p->spec;
	membuf_stream_t st = NULL;
	int rc = TOOL_EXIT_FAIL;
	if (membuf_use_device(MEMBUF_DEVICE, dev) < 0 || membuf_stream_create(&st) < 0) {
		fprintf(stderr, "dfccl-perf: --queue-only --mode stream on GPU %d: %s\n", dev, membuf_error());
		return TOOL_EXIT_FAIL;
	}
	/* One more untimed than -w: the first attaches the queue pair and
	 * registers it with the driver. */
	dfcclResult_t r = dfcclInternalNopStream(dev, st, s->warmup + 1, NULL);
	double t0 = tool_now(), issue = 0;
	if (r == dfcclSuccess)
		r = dfcclInternalNopStream(dev, st, s->iters, &issue);
	double us = (tool_now() - t0) * 1e6 / (double)s->iters;
	if (r != dfcclSuccess) {
		fprintf(stderr, "dfccl-perf: --queue-only --mode stream on device %d: %s: %s\n", dev, dfcclGetErrorString(r),
		        dfcclGetLastError(NULL));
		goto out;
	}
	if (p->json)
		printf("{\"mode\": \"queue-only\", \"form\": \"stream\", \"device\": %d, \"warmup\": %ld, \"iters\": %ld, "
		       "\"per_entry_us\": %.3f, \"issue_us\": %.3f}\n",
		       dev, s->warmup, s->iters, us, issue);
	else
		printf("# dfccl-perf queue-only: device %d, NOP entries stream-ordered back to back on a CUDA stream, %ld "
		       "warmup and %ld timed\n# time per entry (us): %.2f; the host's calls per entry (us): %.2f\n",
		       dev, s->warmup, s->iters, us, issue);
	rc = 0;
out:
	membuf_stream_destroy(st);
	return rc;
}

/*
 * --queue-only: -w untimed and -n timed NOP entries on one device, each
 * submitted and waited for alone, timed on the host clock. No fork follows.
 */
static int perf_queue_only(const struct perf *p)
{
	const struct bench_spec *s = &p->spec;
	int dev = tool_rank_device(&s->devices, 0, 1);
	if (s->mode == BENCH_STREAM)
		return perf_queue_only_stream(p, dev);
	double *us = calloc((size_t)s->iters, sizeof(*us));
	if (!us) {
		fprintf(stderr, "dfccl-perf: out of memory\n");
		return TOOL_EXIT_FAIL;
	}
	/* One more untimed than -w: the first attaches the queue pair. */
	for (long i = -s->warmup - 1; i < s->iters; i++) {
		double t0 = tool_now();
		dfcclResult_t r = dfcclInternalNop(dev);
		if (r != dfcclSuccess) {
			fprintf(stderr, "dfccl-perf: --queue-only on device %d: %s: %s\n", dev, dfcclGetErrorString(r),
			        dfcclGetLastError(NULL));
			free(us);
			return TOOL_EXIT_FAIL;
		}
		if (i >= 0)
			us[i] = (tool_now() - t0) * 1e6;
	}
	double sum = 0;
	for (long i = 0; i < s->iters; i++)
		sum += us[i];
	qsort(us, (size_t)s->iters, sizeof(*us), cmp_double);
	long n = s->iters;
	double median = n % 2 ? us[n / 2] : (us[n / 2 - 1] + us[n / 2]) / 2;
	double p99 = us[(n * 99 + 99) / 100 - 1]; /* nearest rank */
	if (p->json)
		printf("{\"mode\": \"queue-only\", \"form\": \"callback\", \"device\": %d, \"warmup\": %ld, \"iters\": %ld, "
		       "\"median_us\": %.3f, "
		       "\"mean_us\": %.3f, \"min_us\": %.3f, \"p99_us\": %.3f, \"max_us\": %.3f}\n",
		       dev, s->warmup, n, median, sum / (double)n, us[0], p99, us[n - 1]);
	else
		printf("# dfccl-perf queue-only: device %d, a NOP entry submitted and waited for, %ld warmup and %ld timed\n"
		       "# round trip (us): median %.2f, mean %.2f, min %.2f, p99 %.2f, max %.2f\n",
		       dev, s->warmup, n, median, sum / (double)n, us[0], p99, us[n - 1]);
	free(us);
	return 0;
}

static int usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "dfccl-perf: %s '%s' (see dfccl-perf --help)\n", what, arg);
	return TOOL_EXIT_USAGE;
}

/* A request this run cannot serve, said in full; the exit status. */
static int refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int refuse(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("dfccl-perf: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return TOOL_EXIT_USAGE;
}

/* What the options left open: how they were given, before the spec is
 * completed by perf_settle. */
struct perf_ask {
	int mode;              /* enum bench_mode, or -1: the default */
	bool mem_given;        /* --mem */
	const char *nccl_path; /* --nccl-lib, or NULL */
	int other_opt;         /* the last option given that --compute-only does not take */
	int other_queue_opt;   /* the last option given that --queue-only does not take */
};

/* The buffers by backend: NCCL's defaults, and the kinds each takes. */
static int perf_settle_mem(struct bench_spec *s, const struct perf_ask *a)
{
	bool on_nccl = s->backend == BENCH_NCCL;
	if (s->symmetric && !on_nccl)
		return refuse("--nccl-symmetric is NCCL's: it needs --backend nccl");
	if (on_nccl && !a->mem_given)
		s->mem = s->symmetric ? MEMBUF_NCCL : MEMBUF_DEVICE;
	else if (!a->mem_given && s->overlap_us > 0)
		s->mem = MEMBUF_DEVICE;
	if (s->symmetric && s->mem != MEMBUF_NCCL)
		return refuse("--nccl-symmetric allocates the buffers with ncclMemAlloc (--mem nccl), not --mem %s",
		              membuf_kind_name(s->mem));
	if (on_nccl && s->mem != MEMBUF_DEVICE && s->mem != MEMBUF_VMM && s->mem != MEMBUF_NCCL)
		return refuse("--backend nccl takes --mem device, vmm or nccl, not --mem %s", membuf_kind_name(s->mem));
	if (!on_nccl && s->mem == MEMBUF_NCCL)
		return refuse("--mem nccl (ncclMemAlloc) is for --backend nccl");
	return 0;
}

/* --overlap runs on the rank's stream, on GPU buffers, and needs the
 * kernel in this build; --compute-rounds belongs to it. */
static int perf_settle_overlap(const struct bench_spec *s, const struct perf_ask *a)
{
	if (s->overlap_us == 0)
		return s->compute_rounds ? refuse("--compute-rounds sets the kernel of --overlap or --compute-only; give "
		                                  "one of them")
		                         : 0;
	if (a->mode == BENCH_CALLBACK)
		return refuse("--overlap issues the compute kernel and the collectives on the rank's CUDA stream: it "
		              "needs --mode stream (its default), not --mode callback");
	if (a->mem_given && !membuf_on_gpu(s->mem))
		return refuse("--overlap measures a trainer's step, whose buffers are on the GPU: give --mem device "
		              "(the default with --overlap), vmm, memalloc or nccl, not --mem %s",
		              membuf_kind_name(s->mem));
	if (compute_require() < 0)
		return refuse("--overlap: %s", compute_error());
	return 0;
}

/* NCCL needs a GPU of its own per rank: two ranks on one GPU are refused. */
static int perf_distinct_gpus(const struct bench_spec *s)
{
	for (int r = 1; r < s->nranks; r++) {
		int dev = tool_rank_device(&s->devices, r, s->nranks);
		for (int q = 0; q < r; q++)
			if (tool_rank_device(&s->devices, q, s->nranks) == dev)
				return refuse("ranks %d and %d would share GPU %d: NCCL needs a GPU of its own per rank "
				              "(give --devices with %d distinct GPUs, or fewer --nranks)",
				              q, r, dev, s->nranks);
	}
	return 0;
}

/* GPU buffers, NCCL and the stream form need CUDA in this build. */
static int perf_need_cuda(const struct bench_spec *s)
{
	static const char no_cuda[] = "this build has no CUDA (no CUDA toolkit was found when dfccl was built)";
	const char *kind = membuf_kind_name(s->mem);
	if ((membuf_on_gpu(s->mem) || s->mode == BENCH_STREAM) && membuf_require(MEMBUF_DEVICE) < 0) {
		if (s->backend == BENCH_NCCL)
			return refuse("--backend nccl runs on GPUs, and %s: rebuild with a toolkit", no_cuda);
		if (membuf_on_gpu(s->mem))
			return refuse("--mem %s: %s", kind, membuf_error());
		return refuse("--mode stream issues the collectives on a CUDA stream, and %s: use --mode callback, or "
		              "rebuild with a toolkit",
		              no_cuda);
	}
	if (membuf_require(s->mem) < 0)
		return refuse("--mem %s: %s", kind, membuf_error());
	return 0;
}

/* Every rank's GPU must exist (asked in a child: this process stays free
 * of CUDA for the ranks it forks). */
static int perf_nccl_gpus(const struct bench_spec *s)
{
	int ngpu = membuf_gpu_count();
	if (ngpu <= 0)
		return refuse("--backend nccl: CUDA sees no GPU on this machine (no driver or no device)");
	for (int r = 0; r < s->nranks; r++) {
		int dev = tool_rank_device(&s->devices, r, s->nranks);
		if (dev >= ngpu)
			return refuse("--backend nccl: rank %d would run on GPU %d, and CUDA sees %d GPU%s (one GPU per "
			              "rank: fewer --nranks, or --devices)",
			              r, dev, ngpu, ngpu == 1 ? "" : "s");
	}
	return 0;
}

/* Loads NCCL, and records which one for the header. */
static int perf_open_nccl(struct perf *p, const struct perf_ask *a)
{
	struct bench_spec *s = &p->spec;
	char v[32];
	if (nccl_lib_open(a->nccl_path) < 0)
		return refuse("%s%s", nccl_lib_error(), a->nccl_path ? "" : " (or give --nccl-lib PATH)");
	if (s->symmetric && nccl_lib_need_windows() < 0)
		return refuse("--nccl-symmetric: %s", nccl_lib_error());
	p->version = nccl_lib_version();
	snprintf(p->library, sizeof(p->library), "NCCL %s", nccl_lib_version_name(p->version, v, sizeof(v)));
	snprintf(p->where, sizeof(p->where), "%s", nccl_lib_path());
	return 0;
}

/*
 * Completes the spec from what was asked, refusing what cannot run, in the
 * order that says the most useful thing first: the options' own conflicts,
 * then the NCCL library, CUDA in this build, the GPUs. Then makes the
 * unique id. Returns -1 when the run can go ahead, else the exit status
 * (the reason printed).
 */
static int perf_settle(struct perf *p, const struct perf_ask *a)
{
	struct bench_spec *s = &p->spec;
	bool on_nccl = s->backend == BENCH_NCCL;
	int rc;
	if (on_nccl && a->mode == BENCH_CALLBACK)
		return refuse("--mode callback is dfccl's host-side form; NCCL has the stream form only (--mode stream, "
		              "its default)");
	if ((rc = perf_settle_overlap(s, a)) != 0 || (rc = perf_settle_mem(s, a)) != 0)
		return rc;
	s->mode = a->mode >= 0 ? a->mode : on_nccl || membuf_on_gpu(s->mem) ? BENCH_STREAM : BENCH_CALLBACK;
	if (on_nccl && ((rc = perf_distinct_gpus(s)) != 0 || (rc = perf_open_nccl(p, a)) != 0))
		return rc;
	if ((rc = perf_need_cuda(s)) != 0)
		return rc;
	if (on_nccl && (rc = perf_nccl_gpus(s)) != 0)
		return rc;
	if (on_nccl) {
		if (nccl_lib_check(nccl.get_unique_id(&s->nccl_id), NULL, "ncclGetUniqueId") == 0)
			return -1;
		fprintf(stderr, "dfccl-perf: %s\n", nccl_lib_error());
		return TOOL_EXIT_FAIL;
	}
	dfcclGetVersion(&p->version);
	snprintf(p->library, sizeof(p->library), "dfccl %d.%d.%d", p->version / 10000, p->version / 100 % 100,
	         p->version % 100);
	if (dfcclGetUniqueId(&s->id) == dfcclSuccess)
		return -1;
	fprintf(stderr, "dfccl-perf: %s\n", dfcclGetLastError(NULL));
	return TOOL_EXIT_FAIL;
}

static const struct option perf_opts[] = {
    {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
    {"stepfactor", required_argument, NULL, 'f'}, {"iters", required_argument, NULL, 'n'},
    {"warmup_iters", required_argument, NULL, 'w'}, {"check", required_argument, NULL, 'c'},
    {"nranks", required_argument, NULL, 'N'}, {"dtype", required_argument, NULL, 'd'},
    {"op", required_argument, NULL, 'o'},     {"batch", required_argument, NULL, 'B'},
    {"json", no_argument, NULL, 'j'},         {"socket", required_argument, NULL, 'S'},
    {"help", no_argument, NULL, 'h'},         {"version", no_argument, NULL, 'V'},
    {"algo", required_argument, NULL, 'A'},    {"mem", required_argument, NULL, 'M'},
    {"devices", required_argument, NULL, 'D'}, {"backend", required_argument, NULL, 'K'},
    {"mode", required_argument, NULL, 'm'},    {"group", required_argument, NULL, 'G'},
    {"nccl-symmetric", no_argument, NULL, 'Y'}, {"nccl-lib", required_argument, NULL, 'L'},
    {"overlap", required_argument, NULL, 'O'}, {"compute-only", required_argument, NULL, 'C'},
    {"compute-rounds", required_argument, NULL, 'R'}, {"queue-only", no_argument, NULL, 'Q'},
    {NULL, 0, NULL, 0},
};

/* The options --compute-only takes: its own, -n, -w, --devices, --json,
 * and --socket, which it does not need (no daemon) but scripts that pass it
 * to every dfccl-perf may give. */
static const char compute_only_opts[] = "CRnwDjS";
/* The options --queue-only takes. */
static const char queue_only_opts[] = "QnwDjSm";

/* "--NAME" of an option of perf_opts, by its value. */
static const char *perf_opt_name(int opt, char *buf, size_t size)
{
	for (const struct option *o = perf_opts; o->name; o++)
		if (o->val == opt) {
			snprintf(buf, size, "--%s", o->name);
			return buf;
		}
	return "?";
}

/* A run without a collective (`flag`, which `does` and takes the options
 * `takes` names): an option it does not take (`other`, 0: none) or an
 * argument is refused. Returns -1 when there is neither. */
static int perf_alone_refusals(const char *flag, const char *does, const char *takes, int other, int argc,
                               char **argv)
{
	char name[40], what[80];
	if (other)
		return refuse("%s %s; it takes %s, not %s", flag, does, takes, perf_opt_name(other, name, sizeof(name)));
	snprintf(what, sizeof(what), "%s runs no collective; unexpected argument", flag);
	if (optind < argc)
		return usage_error(what, argv[optind]);
	return -1;
}

/* --compute-only: what it cannot take is refused, then it runs. */
static int perf_compute_only_main(const struct perf *p, const struct perf_ask *a, int argc, char **argv)
{
	int rc = perf_alone_refusals("--compute-only", "runs the compute kernel alone",
	                             "-n, -w, --devices, --compute-rounds and --json", a->other_opt, argc, argv);
	if (rc >= 0)
		return rc;
	if (compute_require() < 0)
		return refuse("--compute-only: %s", compute_error());
	return perf_compute_only(p);
}

/* --queue-only: what it cannot take is refused, then it runs. */
static int perf_queue_only_main(const struct perf *p, const struct perf_ask *a, int argc, char **argv)
{
	int rc = perf_alone_refusals("--queue-only", "times the daemon's queue alone",
	                             "-n, -w, --devices, --mode, --json and --socket", a->other_queue_opt, argc, argv);
	if (rc >= 0)
		return rc;
	if (a->mode == BENCH_STREAM && membuf_require(MEMBUF_DEVICE) < 0)
		return refuse("--queue-only --mode stream queues the entries on a CUDA stream, and this build has no CUDA "
		              "(no CUDA toolkit was found when dfccl was built)");
	struct perf q = *p;
	q.spec.mode = a->mode == BENCH_STREAM ? BENCH_STREAM : BENCH_CALLBACK;
	return perf_queue_only(&q);
}

int main(int argc, char **argv)
{
	struct perf p = {.spec = {.name = "dfccl-perf", .dtype = dfcclFloat32, .op = dfcclSum, .nranks = 2, .batch = 1,
	                          .min_bytes = 8, .max_bytes = 64u << 20, .factor = 2, .iters = 20, .warmup = 5,
	                          .check = true}};
	struct perf_ask ask = {.mode = -1};
	struct bench_spec *s = &p.spec;
	int rc = tool_standard_options(argc, argv, "dfccl-perf", usage);
	if (rc >= 0)
		return rc;
	long v;
	int opt;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "b:e:f:n:w:c:hV", perf_opts, NULL)) != -1) {
		if (!strchr(compute_only_opts, opt))
			ask.other_opt = opt;
		if (!strchr(queue_only_opts, opt))
			ask.other_queue_opt = opt;
		switch (opt) {
		case 'b':
		case 'e':
			if (!tool_parse_size(optarg, opt == 'b' ? &s->min_bytes : &s->max_bytes))
				return usage_error("not a size:", optarg);
			break;
		case 'f':
			if (!tool_parse_long(optarg, 1, 1024, &s->factor))
				return usage_error("-f takes 1 to 1024, not", optarg);
			break;
		case 'n':
			if (!tool_parse_long(optarg, 1, 100000000, &s->iters))
				return usage_error("-n takes a positive number, not", optarg);
			break;
		case 'w':
			if (!tool_parse_long(optarg, 0, 100000000, &s->warmup))
				return usage_error("-w takes a number, not", optarg);
			break;
		case 'c':
			if (!tool_parse_long(optarg, 0, 1, &v))
				return usage_error("-c takes 0 or 1, not", optarg);
			s->check = v != 0;
			break;
		case 'N':
			if (!tool_parse_long(optarg, 1, 64, &v))
				return usage_error("--nranks takes 1 to 64, not", optarg);
			s->nranks = (int)v;
			break;
		case 'd':
			if ((s->dtype = tool_dtype_parse(optarg)) < 0)
				return usage_error("unknown data type", optarg);
			break;
		case 'o':
			if ((s->op = tool_op_parse(optarg)) < 0)
				return usage_error("unknown reduction", optarg);
			break;
		case 'B':
			if (!tool_parse_long(optarg, 1, 100000, &v))
				return usage_error("--batch takes a positive number, not", optarg);
			s->batch = (int)v;
			break;
		case 'G':
			if (!tool_parse_long(optarg, 0, 1, &v))
				return usage_error("--group takes 0 or 1, not", optarg);
			s->ungrouped = v == 0;
			break;
		case 'j': p.json = true; break;
		case 'S': setenv("DFCCL_SOCKET", optarg, 1); break;
		case 'A':
			if (dfccl_algo_parse(optarg) < 0)
				return usage_error("--algo takes auto, direct, ring, tree or multitree, not", optarg);
			s->algo = optarg;
			break;
		case 'M':
			if ((s->mem = membuf_kind_parse(optarg)) < 0)
				return usage_error("--mem takes host, device, vmm, memalloc or nccl, not", optarg);
			ask.mem_given = true;
			break;
		case 'D':
			if (!tool_parse_devices(optarg, &s->devices))
				return usage_error("--devices takes comma-separated device indices, not", optarg);
			break;
		case 'K':
			if ((s->backend = bench_backend_parse(optarg)) < 0)
				return usage_error("--backend takes dfccl or nccl, not", optarg);
			break;
		case 'm':
			if ((ask.mode = bench_mode_parse(optarg)) < 0)
				return usage_error("--mode takes stream or callback, not", optarg);
			break;
		case 'Y': s->symmetric = true; break;
		case 'L': ask.nccl_path = optarg; break;
		case 'O':
			if (!tool_parse_long(optarg, 1, COMPUTE_MAX_US, &s->overlap_us))
				return usage_error("--overlap takes the compute kernel's microseconds, 1 to 1000000, not", optarg);
			break;
		case 'C':
			if (!tool_parse_long(optarg, 1, COMPUTE_MAX_US, &p.compute_only_us))
				return usage_error("--compute-only takes the compute kernel's microseconds, 1 to 1000000, not",
				                   optarg);
			break;
		case 'Q': p.queue_only = true; break;
		case 'R':
			if (!tool_parse_long(optarg, 1, COMPUTE_MAX_ROUNDS, &s->compute_rounds))
				return usage_error("--compute-rounds takes 1 to 2147483648 rounds, not", optarg);
			break;
		default: return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (p.compute_only_us > 0 && p.queue_only)
		return refuse("--compute-only and --queue-only are two separate runs: give one of them");
	if (p.compute_only_us > 0)
		return perf_compute_only_main(&p, &ask, argc, argv);
	if (p.queue_only)
		return perf_queue_only_main(&p, &ask, argc, argv);
	if (optind >= argc)
		return usage_error("no collective given; one of allreduce allgather reducescatter broadcast reduce "
		                   "sendrecv alltoall", "");
	if ((s->coll = tool_coll_parse(argv[optind])) < 0)
		return usage_error("unknown collective", argv[optind]);
	if (optind + 1 < argc)
		return usage_error("unexpected argument", argv[optind + 1]);
	if (s->min_bytes == 0 || s->min_bytes > s->max_bytes || s->max_bytes > (4ull << 30))
		return usage_error("need 0 < -b <= -e <= 4G", "");
	if (s->coll == TOOL_SENDRECV && s->nranks < 2)
		return usage_error("sendrecv needs at least 2 ranks; --nranks", "1");
	if (s->factor == 1 && s->min_bytes != s->max_bytes)
		return usage_error("-f 1 repeats one size; give -b equal to -e, not -b", "");
	if ((rc = perf_settle(&p, &ask)) >= 0)
		return rc;
	return tool_run_ranks("dfccl-perf", s->nranks, perf_rank, &p, 30) ? TOOL_EXIT_FAIL : 0;
}
