/*
 * dfccl-perf: bandwidth and latency of dfccl collectives, with the flags and
 * columns of nccl-tests so that results compare line by line.
 *
 * It forks one process per rank; each joins one communicator on device
 * rank % devices. Per size, out of place and then in place: WARMUP untimed
 * iterations, a barrier (an all-reduce of one element, waited for), then
 * ITERS timed iterations, each a batch of B collectives issued back to back
 * inside one group and then waited for with dfcclCommSynchronize; the time
 * of one collective is the elapsed time over ITERS * B, as rank 0 measured
 * it. With -c 1 one more collective runs on reference data (tool.h) and
 * every rank counts its wrong elements; #wrong is their sum over the ranks
 * (an all-reduce). algbw = size / time, busbw = algbw * factor, nccl-tests'
 * factors: all-reduce 2(n-1)/n, all-gather, reduce-scatter and all-to-all
 * (n-1)/n, the others 1. Sizes follow nccl-tests too: the larger buffer of
 * the call (see tool_count_for).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dfccl.h"
#include "dfccl_queue.h"
#include "tool.h"

static const char usage[] =
    "Usage: dfccl-perf COLLECTIVE [OPTIONS]\n"
    "COLLECTIVE: allreduce allgather reducescatter broadcast reduce sendrecv alltoall\n"
    "Measures dfccl collectives the way nccl-tests does: one line per size with\n"
    "size, count, type, redop, root, time, algbw, busbw and #wrong, out of place\n"
    "and in place (busbw factors: all-reduce 2(n-1)/n, all-gather, reduce-scatter\n"
    "and all-to-all (n-1)/n, others 1), and the average bus bandwidth at the end.\n"
    "\n"
    "  -b, --minbytes SIZE    smallest size (default 8; K, M, G suffixes)\n"
    "  -e, --maxbytes SIZE    largest size (default 64M)\n"
    "  -f, --stepfactor N     multiply the size by N between lines (default 2)\n"
    "  -n, --iters N          timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N   untimed iterations per size (default 5)\n"
    "  -c, --check 0|1        check the results (default 1)\n"
    "      --nranks N         rank processes (default 2), spread over the daemon's devices\n"
    "      --dtype TYPE       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
    "                         (default float)\n"
    "      --op OP            reduction: sum prod max min avg (default sum)\n"
    "      --batch B          B collectives back to back in one group before each wait\n"
    "                         (default 1); the time column is per collective\n"
    "      --algo NAME        all-reduce algorithm: auto direct ring tree multitree\n"
    "                         (default auto: the daemon's setting; sets DFCCL_ALGO)\n"
    "      --json             one JSON object per size instead of the table\n"
    "      --socket PATH      the daemon's socket (default $DFCCL_SOCKET)\n"
    "  -h, --help             this text\n"
    "  -V, --version          the library version\n"
    "\n"
    "Exit status: 0 success, 1 a collective failed or returned wrong data, 2 usage.\n";

struct perf {
	int coll, dtype, op, root, nranks, batch;
	uint64_t min_bytes, max_bytes;
	long factor, iters, warmup;
	bool check, json;
	dfcclUniqueId id;
};

/* One measurement: out of place or in place. */
struct measure {
	bool valid;   /* the collective has this form */
	double us;    /* per collective */
	uint64_t wrong;
};

static dfcclResult_t perf_batch(const struct perf *p, const void *send, void *recv, size_t count, dfcclComm_t comm)
{
	dfcclGroupStart();
	for (int i = 0; i < p->batch; i++)
		tool_issue(p->coll, send, recv, count, p->dtype, p->op, p->root, comm);
	dfcclResult_t r = dfcclGroupEnd();
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(comm);
	return r;
}

/* An all-reduce of one int64 (sum), waited for: a barrier that also sums. */
static dfcclResult_t perf_allsum(int64_t *cell, int64_t v, dfcclComm_t comm)
{
	*cell = v;
	dfcclResult_t r = dfcclAllReduce(cell, cell, 1, dfcclInt64, dfcclSum, comm, NULL);
	return r == dfcclSuccess ? dfcclCommSynchronize(comm) : r;
}

static dfcclResult_t perf_measure(const struct perf *p, void *sbuf, void *rbuf, size_t count, bool inplace,
                                  int rank, int64_t *cell, dfcclComm_t comm, struct measure *m)
{
	const void *send = sbuf;
	void *recv = rbuf;
	dfcclResult_t r = dfcclSuccess;
	m->valid = !inplace || tool_inplace(p->coll, rbuf, count, p->dtype, rank, &send, &recv);
	if (!m->valid)
		return dfcclSuccess;
	for (long i = 0; i < p->warmup && r == dfcclSuccess; i++)
		r = perf_batch(p, send, recv, count, comm);
	if (r == dfcclSuccess)
		r = perf_allsum(cell, 0, comm);
	double t0 = tool_now();
	for (long i = 0; i < p->iters && r == dfcclSuccess; i++)
		r = perf_batch(p, send, recv, count, comm);
	m->us = (tool_now() - t0) * 1e6 / (double)(p->iters * p->batch);
	if (r != dfcclSuccess || !p->check)
		return r;

	size_t first;
	double got, want;
	uint64_t key = tool_hash(count, inplace, 0xbe7c, 0);
	tool_poison(rbuf, tool_recv_elems(p->coll, count, p->nranks), p->dtype);
	tool_fill(p->coll, (void *)send, count, p->dtype, p->op, rank, p->nranks, key);
	r = tool_issue(p->coll, send, recv, count, p->dtype, p->op, p->root, comm);
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(comm);
	if (r != dfcclSuccess)
		return r;
	size_t wrong = tool_check(p->coll, recv, count, p->dtype, p->op, p->root, rank, p->nranks, key, &first, &got,
	                          &want);
	r = perf_allsum(cell, (int64_t)wrong, comm);
	m->wrong = (uint64_t)*cell;
	return r;
}

static void print_header(const struct perf *p)
{
	printf("# dfccl-perf %s: %d ranks, %s, batch %d, %ld warmup and %ld timed iterations per size\n",
	       tool_coll_name(p->coll), p->nranks, tool_dtype_name(p->dtype), p->batch, p->warmup, p->iters);
	printf("#%58s %-31s %-31s\n", "", "out-of-place", "in-place");
	printf("#%11s %13s %9s %7s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
	       "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
	printf("#%11s %13s %9s %7s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
	       "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_measure(const struct perf *p, size_t bytes, const struct measure *m, double *busbw_sum, int *nbw)
{
	if (!m->valid) {
		printf(" %8s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
		return;
	}
	double algbw = (double)bytes / (m->us * 1e-6) / 1e9, busbw = algbw * tool_bus_factor(p->coll, p->nranks);
	*busbw_sum += busbw;
	(*nbw)++;
	if (p->check)
		printf(" %8.2f %7.2f %7.2f %6" PRIu64, m->us, algbw, busbw, m->wrong);
	else
		printf(" %8.2f %7.2f %7.2f %6s", m->us, algbw, busbw, "N/A");
}

static void json_measure(const struct perf *p, const char *name, size_t bytes, const struct measure *m)
{
	if (!m->valid) {
		printf(", \"%s\": null", name);
		return;
	}
	double algbw = (double)bytes / (m->us * 1e-6) / 1e9;
	printf(", \"%s\": {\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f", name, m->us, algbw,
	       algbw * tool_bus_factor(p->coll, p->nranks));
	if (p->check)
		printf(", \"wrong\": %" PRIu64 "}", m->wrong);
	else
		printf(", \"wrong\": null}");
}

static int perf_rank(int rank, void *arg)
{
	const struct perf *p = arg;
	int ndev = 1, rc = 1, nbw = 0;
	double busbw_sum = 0;
	size_t elem = tool_dtype_size(p->dtype);
	size_t cap = (size_t)p->max_bytes + elem * (size_t)p->nranks + 64;
	dfcclComm_t comm = NULL;
	void *sbuf = NULL, *rbuf = NULL;
	int64_t *cell = NULL;
	dfcclResult_t r = dfcclGetDeviceCount(&ndev);
	if (r == dfcclSuccess) {
		dfcclSetDevice(rank % ndev);
		r = dfcclCommInitRank(&comm, p->nranks, p->id, rank);
	}
	if (r == dfcclSuccess)
		r = dfcclMemAlloc(&sbuf, cap);
	if (r == dfcclSuccess)
		r = dfcclMemAlloc(&rbuf, cap);
	if (r == dfcclSuccess)
		r = dfcclMemAlloc((void **)&cell, sizeof(*cell));
	if (r != dfcclSuccess)
		goto out;
	memset(sbuf, 0, cap);
	memset(rbuf, 0, cap);
	if (rank == 0 && !p->json)
		print_header(p);

	bool wrong = false;
	for (uint64_t bytes = p->min_bytes; bytes <= p->max_bytes; bytes *= (uint64_t)p->factor) {
		size_t count = tool_count_for(p->coll, (size_t)bytes, elem, p->nranks);
		if (count == 0)
			continue;
		size_t se = tool_send_elems(p->coll, count, p->nranks), re = tool_recv_elems(p->coll, count, p->nranks);
		size_t size = (se > re ? se : re) * elem;
		struct measure m[2] = {{0}};
		for (int ip = 0; ip < 2 && r == dfcclSuccess; ip++)
			r = perf_measure(p, sbuf, rbuf, count, ip, rank, cell, comm, &m[ip]);
		if (r != dfcclSuccess)
			goto out;
		wrong = wrong || m[0].wrong || m[1].wrong;
		if (rank != 0)
			continue;
		bool reduces = tool_coll_reduces(p->coll);
		int root = tool_coll_rooted(p->coll) ? p->root : -1;
		if (p->json) {
			printf("{\"collective\": \"%s\", \"nranks\": %d, \"batch\": %d, \"size\": %zu, \"count\": %zu, "
			       "\"type\": \"%s\", \"redop\": \"%s\", \"root\": %d",
			       tool_coll_name(p->coll), p->nranks, p->batch, size, count, tool_dtype_name(p->dtype),
			       reduces ? tool_op_name(p->op) : "none", root);
			json_measure(p, "out_of_place", size, &m[0]);
			json_measure(p, "in_place", size, &m[1]);
			printf("}\n");
		} else {
			printf(" %11zu %13zu %9s %7s %6d", size, count, tool_dtype_name(p->dtype),
			       reduces ? tool_op_name(p->op) : "none", root);
			print_measure(p, size, &m[0], &busbw_sum, &nbw);
			print_measure(p, size, &m[1], &busbw_sum, &nbw);
			printf("\n");
		}
		fflush(stdout);
		if (p->factor == 1)
			break;
	}
	if (rank == 0 && !p->json) {
		printf("# Out of bounds values : %s\n", wrong ? "wrong results" : "0 OK");
		printf("# Avg bus bandwidth    : %g\n", nbw ? busbw_sum / nbw : 0.0);
	}
	rc = wrong ? 1 : 0;
out:
	if (r != dfcclSuccess)
		fprintf(stderr, "dfccl-perf: rank %d: %s: %s\n", rank, dfcclGetErrorString(r), dfcclGetLastError(NULL));
	if (comm && r != dfcclSuccess)
		dfcclCommAbort(comm);
	else if (comm)
		dfcclCommDestroy(comm);
	dfcclMemFree(sbuf);
	dfcclMemFree(rbuf);
	dfcclMemFree(cell);
	return rc;
}

static int usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "dfccl-perf: %s '%s' (see dfccl-perf --help)\n", what, arg);
	return TOOL_EXIT_USAGE;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
	    {"stepfactor", required_argument, NULL, 'f'}, {"iters", required_argument, NULL, 'n'},
	    {"warmup_iters", required_argument, NULL, 'w'}, {"check", required_argument, NULL, 'c'},
	    {"nranks", required_argument, NULL, 'N'}, {"dtype", required_argument, NULL, 'd'},
	    {"op", required_argument, NULL, 'o'},     {"batch", required_argument, NULL, 'B'},
	    {"json", no_argument, NULL, 'j'},         {"socket", required_argument, NULL, 'S'},
	    {"help", no_argument, NULL, 'h'},         {"version", no_argument, NULL, 'V'},
	    {"algo", required_argument, NULL, 'A'},
	    {NULL, 0, NULL, 0},
	};
	struct perf p = {.dtype = dfcclFloat32, .op = dfcclSum, .nranks = 2, .batch = 1, .min_bytes = 8,
	                 .max_bytes = 64u << 20, .factor = 2, .iters = 20, .warmup = 5, .check = true};
	int rc = tool_standard_options(argc, argv, "dfccl-perf", usage);
	if (rc >= 0)
		return rc;
	long v;
	int opt;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "b:e:f:n:w:c:hV", opts, NULL)) != -1) {
		switch (opt) {
		case 'b':
		case 'e':
			if (!tool_parse_size(optarg, opt == 'b' ? &p.min_bytes : &p.max_bytes))
				return usage_error("not a size:", optarg);
			break;
		case 'f':
			if (!tool_parse_long(optarg, 1, 1024, &p.factor))
				return usage_error("-f takes 1 to 1024, not", optarg);
			break;
		case 'n':
			if (!tool_parse_long(optarg, 1, 100000000, &p.iters))
				return usage_error("-n takes a positive number, not", optarg);
			break;
		case 'w':
			if (!tool_parse_long(optarg, 0, 100000000, &p.warmup))
				return usage_error("-w takes a number, not", optarg);
			break;
		case 'c':
			if (!tool_parse_long(optarg, 0, 1, &v))
				return usage_error("-c takes 0 or 1, not", optarg);
			p.check = v != 0;
			break;
		case 'N':
			if (!tool_parse_long(optarg, 1, 64, &v))
				return usage_error("--nranks takes 1 to 64, not", optarg);
			p.nranks = (int)v;
			break;
		case 'd':
			if ((p.dtype = tool_dtype_parse(optarg)) < 0)
				return usage_error("unknown data type", optarg);
			break;
		case 'o':
			if ((p.op = tool_op_parse(optarg)) < 0)
				return usage_error("unknown reduction", optarg);
			break;
		case 'B':
			if (!tool_parse_long(optarg, 1, 100000, &v))
				return usage_error("--batch takes a positive number, not", optarg);
			p.batch = (int)v;
			break;
		case 'j': p.json = true; break;
		case 'S': setenv("DFCCL_SOCKET", optarg, 1); break;
		case 'A':
			if (dfccl_algo_parse(optarg) < 0)
				return usage_error("--algo takes auto, direct, ring, tree or multitree, not", optarg);
			/* The rank processes are forked after this: they all read it. */
			setenv("DFCCL_ALGO", optarg, 1);
			break;
		default: return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return usage_error("no collective given; one of allreduce allgather reducescatter broadcast reduce "
		                   "sendrecv alltoall", "");
	if ((p.coll = tool_coll_parse(argv[optind])) < 0)
		return usage_error("unknown collective", argv[optind]);
	if (optind + 1 < argc)
		return usage_error("unexpected argument", argv[optind + 1]);
	if (p.min_bytes == 0 || p.min_bytes > p.max_bytes || p.max_bytes > (4ull << 30))
		return usage_error("need 0 < -b <= -e <= 4G", "");
	if (p.coll == TOOL_SENDRECV && p.nranks < 2)
		return usage_error("sendrecv needs at least 2 ranks; --nranks", "1");
	if (p.factor == 1 && p.min_bytes != p.max_bytes)
		return usage_error("-f 1 repeats one size; give -b equal to -e, not -b", "");
	if (dfcclGetUniqueId(&p.id) != dfcclSuccess) {
		fprintf(stderr, "dfccl-perf: %s\n", dfcclGetLastError(NULL));
		return TOOL_EXIT_FAIL;
	}
	return tool_run_ranks("dfccl-perf", p.nranks, perf_rank, &p, 30) ? TOOL_EXIT_FAIL : 0;
}
