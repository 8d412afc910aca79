/*
 * dfccl-chaos: the deadlock stress test. Several rank processes run
 * collectives on several communicators (or several registered collectives
 * of one communicator), each rank in its own random order every iteration,
 * with random types and sizes; under NCCL such orders deadlock, under
 * dfccld every collective must complete with the right data.
 *
 * What a collective is (type, data type, reduction, root, size, in place or
 * not) depends only on (seed, iteration, communicator), so every rank makes
 * the same choice; the order of submission depends on (seed, rank,
 * iteration). Each rank fills its send buffers with reference data
 * (tool.h), submits its K collectives without waiting, then waits for all of
 * them and checks every result against the reference it computes itself.
 *
 * Buffers are host memory from dfcclMemAllocHost, or with --mem device, vmm
 * or memalloc GPU memory on the rank's device (cudaMalloc, a VMM allocation
 * exportable as a file descriptor, or dfcclMemAlloc's memory; a build with
 * a CUDA toolkit):
 * the reference data is copied in before each submission and the results
 * are copied out after the waits (membuf.h); the collectives are the same
 * NULL-stream calls (registered runs: callbacks).
 *
 * --sync makes a device-wide synchronization between submissions, which
 * must not deadlock collectives either: cudaDeviceSynchronize with GPU
 * buffers. With host buffers there is no device of this process to
 * synchronize: the point is counted and reported, and nothing else happens.
 *
 * The parent process only draws the unique ids, forks the ranks, and reads
 * the daemon's preemption counters (the stats query of dfcclctl, through
 * the internal client API) before and after. A rank that dies makes the
 * others fail (their collectives complete with errors), and the run fails.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "errors.h"
#include "membuf.h"
#include "tool.h"

static const char usage[] =
    "Usage: dfccl-chaos --nranks N --comms K --iters M [OPTIONS]\n"
    "Runs K collectives per iteration (one per communicator, or K registered\n"
    "collectives of one communicator) in a different random order on every\n"
    "rank, and checks that all of them complete with correct results.\n"
    "\n"
    "      --nranks N       rank processes (default 4), spread over the daemon's devices\n"
    "      --comms K        communicators shared by all ranks (default 4)\n"
    "      --iters M        iterations (default 100)\n"
    "      --min-bytes SIZE smallest collective (default 8; K, M, G suffixes)\n"
    "      --max-bytes SIZE largest collective (default 1M)\n"
    "      --seed S         seed of the choices and orders (default: time; printed)\n"
    "      --sync           a device-wide synchronization between submissions\n"
    "                       (cudaDeviceSynchronize with GPU buffers; counted, and a\n"
    "                       no-op, with host buffers)\n"
    "      --mem KIND       where the buffers are: host (dfcclMemAllocHost, default); on\n"
    "                       the rank's GPU, device (cudaMalloc), vmm (cuMemCreate\n"
    "                       exportable as a POSIX file descriptor, mapped with cuMemMap)\n"
    "                       or memalloc (dfcclMemAlloc: device memory the daemon owns);\n"
    "                       the GPU kinds need the CUDA engine and a build with a CUDA\n"
    "                       toolkit\n"
    "      --devices LIST   comma-separated devices of the ranks, as dfcclSetDevice takes them\n"
    "                       (CUDA ordinals where the ranks see GPUs): rank r on the (r mod\n"
    "                       length)-th (default: rank r on device r mod dfcclGetDeviceCount)\n"
    "      --registered     K registered (DFCCL-style) collectives on one communicator\n"
    "      --socket PATH    the daemon's socket (default $DFCCL_SOCKET)\n"
    "  -h, --help           this text\n"
    "  -V, --version        the library version\n"
    "\n"
    "Exit status: 0 every collective completed correctly, 1 a failure or wrong\n"
    "data, 2 usage.\n";

/* Collective types chaos mixes: the registered ones, then the NCCL-style only. */
static const int chaos_colls[] = {TOOL_ALLREDUCE, TOOL_ALLGATHER, TOOL_REDUCESCATTER, TOOL_BROADCAST,
                                  TOOL_REDUCE,    TOOL_ALLTOALL,  TOOL_SENDRECV};
#define CHAOS_REGISTERED_COLLS 5

static const dfcclCollType_t coll_type_of[CHAOS_REGISTERED_COLLS] = {
    dfcclCollAllReduce, dfcclCollAllGather, dfcclCollReduceScatter, dfcclCollBroadcast, dfcclCollReduce};

struct rank_result {
	uint64_t collectives;
	uint64_t bytes;
	uint64_t syncs;
	uint64_t callbacks;
	double seconds;
};

struct chaos {
	int nranks, comms, iters;
	uint64_t min_bytes, max_bytes, seed;
	bool sync, registered;
	int mem; /* enum membuf_kind */
	struct tool_devices devices;
	dfcclUniqueId *ids;
	struct rank_result *res; /* shared with the ranks */
	size_t capacity;         /* bytes of each buffer */
};

/* One collective of one iteration, the same on every rank. */
struct plan {
	int coll, dtype, op, root;
	size_t count, bytes;
	bool inplace;
	uint64_t key;
};

static void plan_of(const struct chaos *c, int it, int k, struct plan *p)
{
	uint64_t h = tool_hash(c->seed, (uint64_t)it, (uint64_t)k, 0xc4a05);
	int ncolls = c->registered ? CHAOS_REGISTERED_COLLS : c->nranks > 1 ? 7 : 6;
	p->coll = chaos_colls[h % (uint64_t)ncolls];
	h = tool_hash(h, 1, 0, 0);
	p->dtype = (int)(h % dfcclNumTypes);
	p->op = (int)(h / dfcclNumTypes % dfcclNumOps);
	p->root = (int)(h / 100 % (uint64_t)c->nranks);
	p->inplace = (h >> 40) & 1;
	uint64_t span = c->max_bytes - c->min_bytes + 1;
	size_t bytes = (size_t)(c->min_bytes + tool_hash(h, 2, 0, 0) % span);
	size_t elem = tool_dtype_size(p->dtype);
	p->count = tool_count_for(p->coll, bytes, elem, c->nranks);
	if (p->count == 0)
		p->count = 1;
	size_t se = tool_send_elems(p->coll, p->count, c->nranks), re = tool_recv_elems(p->coll, p->count, c->nranks);
	p->bytes = (se > re ? se : re) * elem;
	p->key = tool_hash(c->seed, (uint64_t)it, (uint64_t)k, 0x4b1d);
	if (!tool_coll_reduces(p->coll))
		p->op = dfcclSum;
}

static void plan_describe(const struct plan *p, char *buf, size_t len)
{
	snprintf(buf, len, "%s of %zu x %s%s%s, root %d%s", tool_coll_name(p->coll), p->count, tool_dtype_name(p->dtype),
	         tool_coll_reduces(p->coll) ? " " : "", tool_coll_reduces(p->coll) ? tool_op_name(p->op) : "", p->root,
	         p->inplace ? ", in place" : "");
}

/* The order in which this rank submits iteration it's K collectives. */
static void chaos_permutation(const struct chaos *c, int rank, int it, int *perm)
{
	for (int k = 0; k < c->comms; k++)
		perm[k] = k;
	for (int k = c->comms - 1; k > 0; k--) {
		int j = (int)(tool_hash(c->seed, (uint64_t)rank, (uint64_t)it, (uint64_t)k) % (uint64_t)(k + 1));
		int t = perm[k];
		perm[k] = perm[j];
		perm[j] = t;
	}
}

static void on_complete(dfcclResult_t result, void *arg)
{
	__atomic_add_fetch((uint64_t *)arg, 1, __ATOMIC_RELAXED);
}

/* The pointers collective p gets in the buffers of its slot. */
static void plan_buffers(const struct plan *p, const struct membuf_pair *b, int rank, const void **send, void **recv)
{
	if (!p->inplace || !tool_inplace(p->coll, b->recv.ptr, p->count, p->dtype, rank, send, recv)) {
		*send = b->send.ptr;
		*recv = b->recv.ptr;
	}
}

#define RANK_FAIL(...)                                   \
	do {                                             \
		fprintf(stderr, "dfccl-chaos: rank %d: ", rank); \
		fprintf(stderr, __VA_ARGS__);            \
		fprintf(stderr, "\n");                   \
		goto out;                                \
	} while (0)

static int chaos_rank(int rank, void *arg)
{
	const struct chaos *c = arg;
	struct rank_result *res = &c->res[rank];
	int ncomms = c->registered ? 1 : c->comms, K = c->comms, rc = 1, ndev = 1;
	dfcclComm_t *comms = calloc((size_t)ncomms, sizeof(*comms));
	struct membuf_pair *b = calloc((size_t)K, sizeof(*b));
	struct plan *plans = calloc((size_t)K, sizeof(*plans));
	dfcclRequest_t *reqs = calloc((size_t)K, sizeof(*reqs));
	int *perm = calloc((size_t)K, sizeof(*perm));
	char what[160];
	dfcclResult_t r;

	if (!comms || !b || !plans || !reqs || !perm)
		RANK_FAIL("out of memory");
	if ((r = dfcclGetDeviceCount(&ndev)) != dfcclSuccess)
		RANK_FAIL("%s", dfcclGetLastError(NULL));
	int dev = tool_rank_device(&c->devices, rank, ndev);
	if (membuf_use_device(c->mem, dev) < 0)
		RANK_FAIL("GPU %d: %s", dev, membuf_error());
	if ((r = dfcclSetDevice(dev)) != dfcclSuccess)
		RANK_FAIL("%s", dfcclGetLastError(NULL));
	/* Every rank joins in the same order: init blocks until all joined. */
	for (int k = 0; k < ncomms; k++)
		if ((r = dfcclCommInitRank(&comms[k], c->nranks, c->ids[k], rank)) != dfcclSuccess)
			RANK_FAIL("joining communicator %d: %s", k, dfcclGetLastError(NULL));
	for (int k = 0; k < K; k++)
		if (membuf_pair_open(&b[k], c->mem, c->capacity) < 0)
			RANK_FAIL("%s buffers: %s", membuf_kind_name(c->mem), membuf_error());

	double t0 = tool_now();
	for (int it = 0; it < c->iters; it++) {
		chaos_permutation(c, rank, it, perm);
		for (int k = 0; k < K; k++) {
			struct plan *p = &plans[k];
			plan_of(c, it, k, p);
			if (!c->registered)
				continue;
			/* Re-registered with this iteration's shape: runs still match
			 * by (id, run number), which re-registration keeps counting. */
			dfcclCollDesc_t d = {coll_type_of[p->coll], p->count, (dfcclDataType_t)p->dtype, (dfcclRedOp_t)p->op,
			                     p->root, (int)(tool_hash(c->seed, (uint64_t)it, (uint64_t)k, 7) % 3)};
			if (it > 0)
				dfcclDeregisterCollective(comms[0], k);
			if ((r = dfcclRegisterCollective(comms[0], k, &d)) != dfcclSuccess)
				RANK_FAIL("registering collective %d: %s", k, dfcclGetLastError(NULL));
		}
		for (int i = 0; i < K; i++) {
			int k = perm[i];
			const struct plan *p = &plans[k];
			const void *send;
			void *recv;
			plan_buffers(p, &b[k], rank, &send, &recv);
			if (membuf_pair_stage(&b[k], p->coll, send, recv, p->count, p->dtype, p->op, rank, c->nranks,
			                      p->key) < 0)
				RANK_FAIL("iteration %d, communicator %d: %s", it, k, membuf_error());
			if (c->registered)
				r = dfcclRunCollective(comms[0], k, send, recv, on_complete, &res->callbacks, &reqs[k]);
			else
				r = tool_issue(p->coll, send, recv, p->count, p->dtype, p->op, p->root, comms[k]);
			if (r != dfcclSuccess) {
				plan_describe(p, what, sizeof(what));
				RANK_FAIL("iteration %d, communicator %d, %s: submission failed: %s", it, k, what,
				          dfcclGetLastError(NULL));
			}
			if (c->sync && membuf_sync(c->mem) < 0)
				RANK_FAIL("iteration %d, after communicator %d: %s", it, k, membuf_error());
			res->syncs += c->sync;
			res->bytes += p->bytes;
		}
		for (int k = 0; k < K; k++) {
			r = c->registered ? dfcclWait(reqs[k]) : dfcclCommSynchronize(comms[k]);
			if (r != dfcclSuccess) {
				plan_describe(&plans[k], what, sizeof(what));
				RANK_FAIL("iteration %d, communicator %d, %s: %s: %s", it, k, what, dfcclGetErrorString(r),
				          dfcclGetLastError(NULL));
			}
		}
		for (int k = 0; k < K; k++) {
			const struct plan *p = &plans[k];
			const void *send;
			void *recv;
			size_t first = 0, wrong = 0;
			double got = 0, want = 0;
			plan_buffers(p, &b[k], rank, &send, &recv);
			if (membuf_pair_check(&b[k], p->coll, recv, p->count, p->dtype, p->op, p->root, rank, c->nranks,
			                      p->key, &wrong, &first, &got, &want) < 0)
				RANK_FAIL("iteration %d, communicator %d: %s", it, k, membuf_error());
			if (wrong) {
				plan_describe(p, what, sizeof(what));
				RANK_FAIL("iteration %d, communicator %d, %s: %zu wrong element(s), the first at index %zu: "
				          "got %g, expected %g", it, k, what, wrong, first, got, want);
			}
		}
		res->collectives += (uint64_t)K;
	}
	res->seconds = tool_now() - t0;
	/* Callbacks run on the library's completion thread, independently of
	 * dfcclWait; give the last ones a moment. */
	for (int i = 0; c->registered && i < 5000 && __atomic_load_n(&res->callbacks, __ATOMIC_RELAXED) < res->collectives;
	     i++)
		usleep(1000);
	if (c->registered && res->callbacks != res->collectives)
		RANK_FAIL("%" PRIu64 " callbacks ran for %" PRIu64 " registered runs", res->callbacks, res->collectives);
	rc = 0;
out:
	/* A failed rank aborts, so the others' collectives fail instead of
	 * waiting for it. */
	for (int k = 0; k < ncomms && comms; k++)
		if (comms[k] && rc)
			dfcclCommAbort(comms[k]);
		else if (comms[k])
			dfcclCommDestroy(comms[k]);
	for (int k = 0; k < K && b; k++)
		membuf_pair_close(&b[k]);
	free(comms);
	free(b);
	free(plans);
	free(reqs);
	free(perm);
	return rc;
}

/* The daemon's preemptions and completed entries, over every device. */
static int daemon_counters(uint64_t *preemptions, uint64_t *completed)
{
	struct client *cl;
	dfcclResult_t r = client_open(client_socket_path(), "dfccl-chaos", &cl);
	if (r != dfcclSuccess)
		return -1;
	struct client_reply rep;
	r = client_query(cl, DFCCL__V1__QUERY_KIND__QUERY_STATS, &rep);
	if (r == dfcclSuccess) {
		*preemptions = *completed = 0;
		for (size_t i = 0; i < rep.env->query_reply->n_stats; i++) {
			*preemptions += rep.env->query_reply->stats[i]->preemptions;
			*completed += rep.env->query_reply->stats[i]->completed;
		}
		client_reply_release(&rep);
	}
	client_unref(cl);
	return r == dfcclSuccess ? 0 : -1;
}

static int usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "dfccl-chaos: %s '%s' (see dfccl-chaos --help)\n", what, arg);
	return TOOL_EXIT_USAGE;
}

static void format_size(char *buf, size_t len, uint64_t v)
{
	if (v >= (1u << 20) && v % (1u << 20) == 0)
		snprintf(buf, len, "%" PRIu64 " MiB", v >> 20);
	else if (v >= 1024 && v % 1024 == 0)
		snprintf(buf, len, "%" PRIu64 " KiB", v >> 10);
	else
		snprintf(buf, len, "%" PRIu64 " B", v);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"nranks", required_argument, NULL, 'n'},    {"comms", required_argument, NULL, 'k'},
	    {"iters", required_argument, NULL, 'i'},     {"min-bytes", required_argument, NULL, 'a'},
	    {"max-bytes", required_argument, NULL, 'b'}, {"seed", required_argument, NULL, 's'},
	    {"sync", no_argument, NULL, 'y'},            {"registered", no_argument, NULL, 'r'},
	    {"socket", required_argument, NULL, 'S'},    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},         {"mem", required_argument, NULL, 'M'},
	    {"devices", required_argument, NULL, 'D'},   {NULL, 0, NULL, 0},
	};
	struct chaos c = {.nranks = 4, .comms = 4, .iters = 100, .min_bytes = 8, .max_bytes = 1 << 20,
	                  .seed = (uint64_t)time(NULL)};
	int rc = tool_standard_options(argc, argv, "dfccl-chaos", usage);
	if (rc >= 0)
		return rc;
	long v;
	int opt;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "hV", opts, NULL)) != -1) {
		switch (opt) {
		case 'n':
			if (!tool_parse_long(optarg, 1, 64, &v))
				return usage_error("--nranks takes 1 to 64, not", optarg);
			c.nranks = (int)v;
			break;
		case 'k':
			if (!tool_parse_long(optarg, 1, DFCCL_MAX_COLL_ID, &v))
				return usage_error("--comms takes 1 to 256, not", optarg);
			c.comms = (int)v;
			break;
		case 'i':
			if (!tool_parse_long(optarg, 1, 100000000, &v))
				return usage_error("--iters takes a positive number, not", optarg);
			c.iters = (int)v;
			break;
		case 'a':
		case 'b':
			if (!tool_parse_size(optarg, opt == 'a' ? &c.min_bytes : &c.max_bytes))
				return usage_error("not a size:", optarg);
			break;
		case 's':
			if (!tool_parse_size(optarg, &c.seed))
				return usage_error("--seed takes a number, not", optarg);
			break;
		case 'y': c.sync = true; break;
		case 'r': c.registered = true; break;
		case 'S': setenv("DFCCL_SOCKET", optarg, 1); break;
		case 'M':
			if ((c.mem = membuf_kind_parse(optarg)) < 0)
				return usage_error("--mem takes host, device, vmm or memalloc, not", optarg);
			if (membuf_require(c.mem) < 0) {
				fprintf(stderr, "dfccl-chaos: --mem %s: %s\n", optarg, membuf_error());
				return TOOL_EXIT_USAGE;
			}
			break;
		case 'D':
			if (!tool_parse_devices(optarg, &c.devices))
				return usage_error("--devices takes comma-separated device indices, not", optarg);
			break;
		default: return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_error("unexpected argument", argv[optind]);
	if (c.min_bytes == 0 || c.min_bytes > c.max_bytes || c.max_bytes > (1ull << 30))
		return usage_error("need 0 < --min-bytes <= --max-bytes <= 1G; got --max-bytes", "");

	/* Room for the largest collective, and for one element per rank of the
	 * widest type when a size is smaller than that. */
	c.capacity = (size_t)c.max_bytes + 8u * (size_t)c.nranks + 64;
	int nids = c.registered ? 1 : c.comms;
	c.ids = calloc((size_t)nids, sizeof(*c.ids));
	c.res = mmap(NULL, (size_t)c.nranks * sizeof(*c.res), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!c.ids || c.res == MAP_FAILED) {
		fprintf(stderr, "dfccl-chaos: out of memory\n");
		return TOOL_EXIT_FAIL;
	}
	for (int k = 0; k < nids; k++)
		if (dfcclGetUniqueId(&c.ids[k]) != dfcclSuccess) {
			fprintf(stderr, "dfccl-chaos: %s\n", dfcclGetLastError(NULL));
			return TOOL_EXIT_FAIL;
		}

	char lo[32], hi[32];
	format_size(lo, sizeof(lo), c.min_bytes);
	format_size(hi, sizeof(hi), c.max_bytes);
	printf("dfccl-chaos: %d ranks, %d %s, %d iterations, %s to %s, %s buffers, seed %" PRIu64 "%s\n", c.nranks,
	       c.comms, c.registered ? "registered collectives on one communicator" : "communicators", c.iters, lo, hi,
	       membuf_kind_name(c.mem), c.seed, c.sync ? ", --sync" : "");
	uint64_t pre0 = 0, done0 = 0, pre1 = 0, done1 = 0;
	bool counters = daemon_counters(&pre0, &done0) == 0;
	if (!counters)
		fprintf(stderr, "dfccl-chaos: cannot read the daemon's counters: %s\n", errors_last());

	double t0 = tool_now();
	int failed = tool_run_ranks("dfccl-chaos", c.nranks, chaos_rank, &c, 30);
	double wall = tool_now() - t0;
	counters = counters && daemon_counters(&pre1, &done1) == 0;

	uint64_t colls = 0, bytes = 0, syncs = 0;
	double secs = 0;
	for (int r = 0; r < c.nranks; r++) {
		colls += c.res[r].collectives;
		bytes += c.res[r].bytes;
		syncs += c.res[r].syncs;
		secs = c.res[r].seconds > secs ? c.res[r].seconds : secs;
	}
	if (secs == 0)
		secs = wall;
	uint64_t per_rank = colls / (uint64_t)c.nranks;
	printf("collectives:   %" PRIu64 " per rank (%" PRIu64 " rank-collectives)\n", per_rank, colls);
	printf("bytes:         %" PRIu64 " per rank\n", bytes / (uint64_t)c.nranks);
	printf("seconds:       %.3f\n", secs);
	printf("collectives/s: %.1f\n", (double)per_rank / secs);
	if (counters)
		printf("preemptions:   %" PRIu64 " (%.2f per rank-collective)\n", pre1 - pre0,
		       colls ? (double)(pre1 - pre0) / (double)colls : 0.0);
	else
		printf("preemptions:   unknown (the daemon's counters could not be read)\n");
	if (c.sync)
		printf("device synchronizations: %" PRIu64 "%s\n", syncs,
		       membuf_on_gpu(c.mem) ? " (cudaDeviceSynchronize)" : " (no-ops with host buffers)");
	free(c.ids);
	munmap(c.res, (size_t)c.nranks * sizeof(*c.res));
	if (failed) {
		printf("FAILED: %d of %d ranks did not complete every collective correctly\n", failed, c.nranks);
		return TOOL_EXIT_FAIL;
	}
	printf("OK: every collective completed with a correct result\n");
	return 0;
}
