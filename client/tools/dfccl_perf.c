/*
 * dfccl-perf: bandwidth and latency of dfccl collectives, with the flags and
 * columns of nccl-tests so that results compare line by line.
 *
 * It forks one process per rank; each runs the sweep of bench.h (one
 * communicator, per size WARMUP untimed iterations, a barrier, ITERS timed
 * batches of B collectives), out of place and then in place, and rank 0
 * prints its times. With -c 1 every size is also checked on reference data
 * (tool.h); #wrong is the wrong elements summed over the ranks. algbw =
 * size / time, busbw = algbw * factor, nccl-tests' factors: all-reduce
 * 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n, the others
 * 1. Sizes follow nccl-tests too: the larger buffer of the call (see
 * tool_count_for).
 *
 * The send and receive buffers are host memory from dfcclMemAllocHost, or
 * with --mem device, vmm or memalloc GPU memory on each rank's device
 * (cudaMalloc, a VMM allocation exportable as a file descriptor, or
 * dfcclMemAlloc's memory; a build with a CUDA toolkit): the timed
 * collectives are the same NULL-stream calls, and the check copies the
 * reference data in and the result out (membuf.h).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "dfccl.h"
#include "dfccl_queue.h"
#include "membuf.h"
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
    "      --devices LIST     comma-separated devices of the ranks: rank r on the (r mod\n"
    "                         length)-th (default: rank r on device r mod the daemon's count)\n"
    "      --mem KIND         where the buffers are: host (dfcclMemAllocHost, default);\n"
    "                         on the rank's GPU, device (cudaMalloc), vmm (cuMemCreate\n"
    "                         exportable as a POSIX file descriptor, mapped with cuMemMap)\n"
    "                         or memalloc (dfcclMemAlloc: device memory the daemon owns);\n"
    "                         the GPU kinds need the CUDA engine and a build with a CUDA\n"
    "                         toolkit\n"
    "      --dtype TYPE       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
    "                         (default float)\n"
    "      --op OP            reduction: sum prod max min avg (default sum)\n"
    "      --batch B          B collectives back to back in one group before each wait\n"
    "                         (default 1); the time column is per collective\n"
    "      --algo NAME        algorithm: auto direct ring tree multitree, where it can run\n"
    "                         the collective (default auto: the daemon's choice; sets\n"
    "                         DFCCL_ALGO in the rank processes)\n"
    "      --json             one JSON object per size instead of the table\n"
    "      --socket PATH      the daemon's socket (default $DFCCL_SOCKET)\n"
    "  -h, --help             this text\n"
    "  -V, --version          the library version\n"
    "\n"
    "Exit status: 0 success, 1 a collective failed or returned wrong data, 2 usage.\n";

struct perf {
	struct bench_spec spec;
	bool json;
};

static void print_header(const struct bench_spec *s)
{
	printf("# dfccl-perf %s: %d ranks, %s, %s buffers, batch %d, %ld warmup and %ld timed iterations per size\n",
	       tool_coll_name(s->coll), s->nranks, tool_dtype_name(s->dtype), membuf_kind_name(s->mem), s->batch,
	       s->warmup, s->iters);
	printf("#%58s %-31s %-31s\n", "", "out-of-place", "in-place");
	printf("#%11s %13s %9s %7s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
	       "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
	printf("#%11s %13s %9s %7s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
	       "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_measure(const struct bench_spec *s, size_t bytes, const struct bench_result *m, double *busbw_sum,
                          int *nbw)
{
	if (!m->valid) {
		printf(" %8s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
		return;
	}
	double algbw = (double)bytes / (m->us * 1e-6) / 1e9, busbw = algbw * tool_bus_factor(s->coll, s->nranks);
	*busbw_sum += busbw;
	(*nbw)++;
	if (s->check)
		printf(" %8.2f %7.2f %7.2f %6" PRIu64, m->us, algbw, busbw, m->wrong);
	else
		printf(" %8.2f %7.2f %7.2f %6s", m->us, algbw, busbw, "N/A");
}

static void json_measure(const struct bench_spec *s, const char *name, size_t bytes, const struct bench_result *m)
{
	if (!m->valid) {
		printf(", \"%s\": null", name);
		return;
	}
	double algbw = (double)bytes / (m->us * 1e-6) / 1e9;
	printf(", \"%s\": {\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f", name, m->us, algbw,
	       algbw * tool_bus_factor(s->coll, s->nranks));
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
	int nbw = 0;
	double busbw_sum = 0;
	bool wrong = false;
	dfcclResult_t r = bench_join(&b, s, rank);
	if (r != dfcclSuccess)
		goto out;
	if (rank == 0 && !p->json)
		print_header(s);

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
			printf("{\"collective\": \"%s\", \"nranks\": %d, \"mem\": \"%s\", \"batch\": %d, \"size\": %zu, "
			       "\"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d",
			       tool_coll_name(s->coll), s->nranks, membuf_kind_name(s->mem), s->batch, size, count,
			       tool_dtype_name(s->dtype),
			       reduces ? tool_op_name(s->op) : "none", root);
			json_measure(s, "out_of_place", size, &m[0]);
			json_measure(s, "in_place", size, &m[1]);
			printf("}\n");
		} else {
			printf(" %11zu %13zu %9s %7s %6d", size, count, tool_dtype_name(s->dtype),
			       reduces ? tool_op_name(s->op) : "none", root);
			print_measure(s, size, &m[0], &busbw_sum, &nbw);
			print_measure(s, size, &m[1], &busbw_sum, &nbw);
			printf("\n");
		}
		fflush(stdout);
	}
	if (rank == 0 && !p->json) {
		printf("# Out of bounds values : %s\n", wrong ? "wrong results" : "0 OK");
		printf("# Avg bus bandwidth    : %g\n", nbw ? busbw_sum / nbw : 0.0);
	}
out:
	r = bench_leave(&b, r);
	return r != dfcclSuccess || wrong ? 1 : 0;
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
	    {"algo", required_argument, NULL, 'A'},    {"mem", required_argument, NULL, 'M'},
	    {"devices", required_argument, NULL, 'D'},
	    {NULL, 0, NULL, 0},
	};
	struct perf p = {.spec = {.name = "dfccl-perf", .dtype = dfcclFloat32, .op = dfcclSum, .nranks = 2, .batch = 1,
	                          .min_bytes = 8, .max_bytes = 64u << 20, .factor = 2, .iters = 20, .warmup = 5,
	                          .check = true}};
	struct bench_spec *s = &p.spec;
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
		case 'j': p.json = true; break;
		case 'S': setenv("DFCCL_SOCKET", optarg, 1); break;
		case 'A':
			if (dfccl_algo_parse(optarg) < 0)
				return usage_error("--algo takes auto, direct, ring, tree or multitree, not", optarg);
			s->algo = optarg;
			break;
		case 'M':
			if ((s->mem = membuf_kind_parse(optarg)) < 0)
				return usage_error("--mem takes host, device, vmm or memalloc, not", optarg);
			if (membuf_require(s->mem) < 0) {
				fprintf(stderr, "dfccl-perf: --mem %s: %s\n", optarg, membuf_error());
				return TOOL_EXIT_USAGE;
			}
			break;
		case 'D':
			if (!tool_parse_devices(optarg, &s->devices))
				return usage_error("--devices takes comma-separated device indices, not", optarg);
			break;
		default: return usage_error("unknown option", argv[optind - 1]);
		}
	}
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
	if (dfcclGetUniqueId(&s->id) != dfcclSuccess) {
		fprintf(stderr, "dfccl-perf: %s\n", dfcclGetLastError(NULL));
		return TOOL_EXIT_FAIL;
	}
	return tool_run_ranks("dfccl-perf", s->nranks, perf_rank, &p, 30) ? TOOL_EXIT_FAIL : 0;
}
