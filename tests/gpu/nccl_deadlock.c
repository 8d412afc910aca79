/*
 * nccl_deadlock: the DFCCL deadlock pattern on NCCL itself, for comparison
 * with dfccld.
 *
 * It replays the pattern that `test_cuda_coll --deadlock A --print-pattern`
 * prints: R ranks on their GPUs, K communicators, and per iteration one float
 * sum all-reduce on every communicator, issued by each rank in an order of
 * its own. One process per rank (forked; CUDA starts only in the ranks),
 * each on its own GPU, issuing every communicator's all-reduce on one
 * stream, as a framework with one communication stream does: NCCL then runs
 * a rank's all-reduces in its issue order, each waiting for its peers, so
 * ranks that disagree on the order wait for each other forever. That is the
 * expected outcome; dfccld completes the same pattern because its daemon
 * kernel runs the collectives independently of the order of submission.
 *
 * Each rank gives up once the pattern has run for --timeout seconds
 * (default 20): it says so and aborts its communicators (ncclCommAbort stops
 * their kernels), and the program reports "NCCL hung on the permuted
 * pattern (expected)". Should NCCL complete, every result is checked.
 *
 * NCCL is loaded at run time through nccl_lib.h (--nccl-lib PATH, else
 * $DFCCL_NCCL_LIB or libnccl.so.2 from the library path, else the copy
 * PyTorch's wheel installs), which declares what it uses, so this builds
 * without NCCL's headers.
 *
 * Exit status: 0 NCCL completed the pattern with correct results, 3 NCCL
 * hung (expected), 1 an error, 2 usage, 77 skipped (no NCCL, or too few
 * GPUs: NCCL needs one GPU per rank).
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_lib.h"

#define PROG "nccl_deadlock"
#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define EXIT_HUNG 3
#define EXIT_SKIP 77
#define MAX_RANKS 64
#define MAX_COMMS 64

/* Where PyTorch's NCCL wheel puts the library on the GPU machines. */
#define TORCH_NCCL_LIB "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"

/* ---------------------------------------------------------------- NCCL */

/* Opens NCCL: the file at path, else nccl_lib_open's default, else
 * PyTorch's copy. The path used, or NULL (reason printed). */
static const char *nccl_load(const char *path)
{
	if (nccl_lib_open(path) < 0 && (path || nccl_lib_open(TORCH_NCCL_LIB) < 0)) {
		printf("SKIPPED: %s (or pass --nccl-lib)\n", nccl_lib_error());
		return NULL;
	}
	return nccl_lib_path();
}

/* ---------------------------------------------------------------- messages and checks */

static int self_rank = -1;

/* A rank's message, on one line. stderr is line-buffered (main), so each
 * line leaves in one write and the ranks' lines do not interleave. */
#define say(...) \
	(fprintf(stderr, PROG ": rank %d: ", self_rank), fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))

/* One check per error domain: the CUDA runtime and NCCL. */
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)
static bool cuda_ok(cudaError_t e, const char *what, int line)
{
	if (e != cudaSuccess)
		say("line %d: %s: %s", line, what, cudaGetErrorString(e));
	return e == cudaSuccess;
}

#define NCCL_OK(call) nccl_ok((call), #call, __LINE__)
static bool nccl_ok(ncclResult_t r, const char *what, int line)
{
	if (nccl_lib_check(r, NULL, what) < 0)
		say("line %d: %s", line, nccl_lib_error());
	return r == ncclSuccess;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- the pattern */

struct pattern {
	int nranks, comms, iters;
	int gpus[MAX_RANKS];
	int *bytes;  /* [iters][comms] */
	int *orders; /* [iters][nranks][comms] */
};

/* Reads the next line that is not a comment into v[0..n): it must start
 * with tag and hold exactly n integers. */
static bool read_line(FILE *f, const char *tag, int *v, int n)
{
	char line[4096];
	do {
		if (!fgets(line, sizeof(line), f))
			return false;
	} while (line[0] == '#');
	char *save, *tok = strtok_r(line, " \t\n", &save);
	if (!tok || strcmp(tok, tag))
		return false;
	for (int i = 0; i < n; i++) {
		char *end;
		tok = strtok_r(NULL, " \t\n", &save);
		errno = 0;
		long x = tok ? strtol(tok, &end, 10) : 0;
		if (!tok || errno || *end || x < 0 || x > (1L << 30))
			return false;
		v[i] = (int)x;
	}
	return strtok_r(NULL, " \t\n", &save) == NULL;
}

static bool pattern_read(FILE *f, struct pattern *p)
{
	int head[3];
	if (!read_line(f, "pattern", head, 3) || head[0] < 1 || head[0] > MAX_RANKS || head[1] < 1 ||
	    head[1] > MAX_COMMS || head[2] < 1)
		return false;
	p->nranks = head[0];
	p->comms = head[1];
	p->iters = head[2];
	p->bytes = calloc((size_t)p->iters * (size_t)p->comms, sizeof(int));
	p->orders = calloc((size_t)p->iters * (size_t)p->nranks * (size_t)p->comms, sizeof(int));
	if (!p->bytes || !p->orders || !read_line(f, "gpus", p->gpus, p->nranks))
		return false;
	for (int it = 0; it < p->iters; it++) {
		if (!read_line(f, "bytes", p->bytes + it * p->comms, p->comms))
			return false;
		for (int r = 0; r < p->nranks; r++) {
			int *o = p->orders + ((size_t)it * (size_t)p->nranks + (size_t)r) * (size_t)p->comms;
			if (!read_line(f, "order", o, p->comms))
				return false;
			for (int i = 0; i < p->comms; i++)
				if (o[i] >= p->comms)
					return false;
		}
	}
	return true;
}

/* The largest all-reduce of communicator k over the iterations. */
static size_t pattern_max_bytes(const struct pattern *p, int k)
{
	size_t m = 4;
	for (int it = 0; it < p->iters; it++)
		m = (size_t)p->bytes[it * p->comms + k] > m ? (size_t)p->bytes[it * p->comms + k] : m;
	return m;
}

/* Rank r's element i of communicator k's send buffer in iteration it: small
 * integers, so every sum is exact in float. */
static float send_value(int r, int it, int k, size_t i)
{
	return (float)((r + 1) * (int)((i * 7 + (size_t)k + (size_t)it) % 31));
}

/* ---------------------------------------------------------------- one rank */

/* What the ranks share: rank 0 draws the unique ids after the fork (NCCL
 * starts its bootstrap listener in the process that draws them). */
struct shared {
	int ready; /* atomic: ids are valid */
	ncclUniqueId ids[MAX_COMMS];
};

struct run {
	const struct pattern *p;
	struct shared *sh;
	double timeout_s;
};

struct rank_state {
	cudaStream_t stream;
	ncclComm_t comms[MAX_COMMS];
	float *send[MAX_COMMS], *recv[MAX_COMMS];
	float *host;
};

static int join(const struct run *run, int rank, struct rank_state *s)
{
	const struct pattern *p = run->p;
	if (rank == 0) {
		for (int k = 0; k < p->comms; k++)
			if (!NCCL_OK(nccl.get_unique_id(&run->sh->ids[k])))
				return -1;
		__atomic_store_n(&run->sh->ready, 1, __ATOMIC_RELEASE);
	}
	for (double give_up = now_s() + 60; !__atomic_load_n(&run->sh->ready, __ATOMIC_ACQUIRE); usleep(1000))
		if (now_s() > give_up) {
			say("rank 0 never published the unique ids");
			return -1;
		}
	/* Every rank joins the communicators in the same order. */
	for (int k = 0; k < p->comms; k++)
		if (!NCCL_OK(nccl.comm_init_rank(&s->comms[k], p->nranks, run->sh->ids[k], rank)))
			return -1;
	size_t most = 4;
	for (int k = 0; k < p->comms; k++) {
		size_t m = pattern_max_bytes(p, k);
		most = m > most ? m : most;
		if (!CUDA_OK(cudaMalloc((void **)&s->send[k], m)) || !CUDA_OK(cudaMalloc((void **)&s->recv[k], m)))
			return -1;
	}
	s->host = malloc(most);
	return s->host ? 0 : -1;
}

/* Waits for the stream until the deadline: 0 done, 1 still running, -1 error. */
static int stream_wait(cudaStream_t stream, double deadline)
{
	for (;;) {
		cudaError_t e = cudaStreamQuery(stream);
		if (e == cudaSuccess)
			return 0;
		if (e != cudaErrorNotReady)
			return CUDA_OK(e) ? 0 : -1;
		if (now_s() > deadline)
			return 1;
		usleep(1000);
	}
}

static int check_results(const struct pattern *p, int it, struct rank_state *s)
{
	int sum_of_factors = p->nranks * (p->nranks + 1) / 2;
	for (int k = 0; k < p->comms; k++) {
		size_t n = (size_t)p->bytes[it * p->comms + k] / 4;
		if (!CUDA_OK(cudaMemcpy(s->host, s->recv[k], n * 4, cudaMemcpyDeviceToHost)))
			return -1;
		for (size_t i = 0; i < n; i++) {
			float want = send_value(0, it, k, i) * (float)sum_of_factors;
			if (s->host[i] != want) {
				say("iteration %d, communicator %d: element %zu is %g, expected %g", it, k, i, s->host[i], want);
				return -1;
			}
		}
	}
	return 0;
}

/* One iteration: fill, issue in this rank's order on the one stream, wait.
 * 0 done, EXIT_HUNG past the deadline, -1 an error. */
static int run_iteration(const struct run *run, int rank, int it, double deadline, struct rank_state *s)
{
	const struct pattern *p = run->p;
	const int *order = p->orders + ((size_t)it * (size_t)p->nranks + (size_t)rank) * (size_t)p->comms;
	for (int k = 0; k < p->comms; k++) {
		size_t n = (size_t)p->bytes[it * p->comms + k] / 4;
		for (size_t i = 0; i < n; i++)
			s->host[i] = send_value(rank, it, k, i);
		if (!CUDA_OK(cudaMemcpy(s->send[k], s->host, n * 4, cudaMemcpyHostToDevice)))
			return -1;
	}
	for (int i = 0; i < p->comms; i++) {
		int k = order[i];
		size_t n = (size_t)p->bytes[it * p->comms + k] / 4;
		if (!NCCL_OK(nccl.all_reduce(s->send[k], s->recv[k], n, ncclFloat32, ncclSum, s->comms[k], s->stream)))
			return -1;
	}
	int w = stream_wait(s->stream, deadline);
	if (w > 0) {
		say("iteration %d: the all-reduces have not completed after %.0f s: NCCL hung", it, run->timeout_s);
		return EXIT_HUNG;
	}
	return w < 0 ? -1 : check_results(p, it, s);
}

static int rank_main(const struct run *run, int rank)
{
	const struct pattern *p = run->p;
	struct rank_state s = {0};
	int rc = -1, it = 0;
	self_rank = rank;
	if (cudaSetDevice(p->gpus[rank]) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
		say("GPU %d cannot be used", p->gpus[rank]);
		return EXIT_SKIP;
	}
	if (CUDA_OK(cudaStreamCreate(&s.stream)) && join(run, rank, &s) == 0) {
		double deadline = now_s() + run->timeout_s;
		for (rc = 0; it < p->iters && rc == 0; it++)
			rc = run_iteration(run, rank, it, deadline, &s);
	}
	/* A hung or failed rank aborts: that also stops the kernels still
	 * waiting for peers. */
	for (int k = 0; k < p->comms; k++)
		if (s.comms[k])
			NCCL_OK(rc ? nccl.comm_abort(s.comms[k]) : nccl.comm_destroy(s.comms[k]));
	if (rc == 0)
		printf(PROG ": rank %d (GPU %d): %d iterations completed, results correct\n", rank, p->gpus[rank], it);
	fflush(NULL);
	return rc == EXIT_HUNG ? EXIT_HUNG : rc ? EXIT_FAIL : 0;
}

/* ---------------------------------------------------------------- the parent */

/* Forks the ranks and waits for them, killing any left `grace_s` after the
 * ranks' own deadline (an abort that itself hangs), or 5 s after a rank
 * failed or could not start (its peers would wait for it in
 * ncclCommInitRank). Returns the exit status of the whole run. */
static int run_ranks(const struct run *run, double grace_s)
{
	int n = run->p->nranks, left = 0, hung = 0, skipped = 0, failed = 0;
	bool killed = false;
	pid_t pids[MAX_RANKS];
	fflush(NULL);
	for (int r = 0; r < n; r++) {
		pids[r] = fork();
		if (pids[r] == 0)
			_exit(rank_main(run, r));
		left += pids[r] > 0;
		failed += pids[r] < 0;
	}
	double kill_at = now_s() + run->timeout_s + grace_s;
	while (left > 0) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid > 0) {
			for (int r = 0; r < n; r++)
				pids[r] = pids[r] == pid ? 0 : pids[r]; /* never signal a reaped pid */
			left--;
			int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
			if (killed)
				continue; /* what we killed says nothing */
			hung += code == EXIT_HUNG;
			skipped += code == EXIT_SKIP;
			failed += code != 0 && code != EXIT_HUNG && code != EXIT_SKIP;
			if (code && code != EXIT_HUNG && kill_at > now_s() + 5)
				kill_at = now_s() + 5;
			continue;
		}
		if (!killed && now_s() > kill_at) {
			fprintf(stderr, PROG ": ranks still running after a rank failed, or %.0f s after their deadline: "
			        "killed\n", grace_s);
			for (int r = 0; r < n; r++)
				if (pids[r] > 0)
					kill(pids[r], SIGKILL);
			hung += !skipped && !failed;
			killed = true;
		}
		usleep(10000);
	}
	if (skipped) {
		printf("SKIPPED: a rank's GPU cannot be used\n");
		return EXIT_SKIP;
	}
	if (hung) {
		printf("NCCL hung on the permuted pattern (expected)\n");
		return EXIT_HUNG;
	}
	if (failed) {
		printf("FAILED: %d of %d ranks failed\n", failed, n);
		return EXIT_FAIL;
	}
	printf("NCCL completed the permuted pattern: %d iterations, results correct\n", run->p->iters);
	return 0;
}

static const char usage[] =
    "Usage: " PROG " --pattern FILE [--timeout S] [--nccl-lib PATH]\n"
    "Runs the deadlock pattern of `test_cuda_coll --deadlock A --print-pattern` on\n"
    "NCCL (one process per rank, one GPU each, one stream for all communicators).\n"
    "\n"
    "      --pattern FILE  the pattern ('-': standard input)\n"
    "      --timeout S     give up after S seconds (default 20)\n"
    "      --nccl-lib PATH libnccl.so.2 to load (default: $DFCCL_NCCL_LIB, else the\n"
    "                      library path, then " TORCH_NCCL_LIB ")\n"
    "  -h, --help          this text\n"
    "\n"
    "Exit status: 0 NCCL completed the pattern, 3 NCCL hung (expected), 1 error,\n"
    "2 usage, 77 skipped (no NCCL, or too few GPUs).\n";

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"pattern", required_argument, NULL, 'p'}, {"timeout", required_argument, NULL, 't'},
	    {"nccl-lib", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *pattern_path = NULL, *lib = NULL;
	struct run run = {.timeout_s = 20};
	struct pattern p = {0};
	int opt;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'p': pattern_path = optarg; break;
		case 't': run.timeout_s = atof(optarg); break;
		case 'l': lib = optarg; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return EXIT_USAGE;
		}
	}
	if (!pattern_path || optind < argc || run.timeout_s <= 0) {
		fputs(usage, stderr);
		return EXIT_USAGE;
	}
	FILE *f = strcmp(pattern_path, "-") ? fopen(pattern_path, "r") : stdin;
	if (!f || !pattern_read(f, &p)) {
		fprintf(stderr, PROG ": %s is not a pattern of test_cuda_coll --print-pattern\n", pattern_path);
		return EXIT_USAGE;
	}
	for (int r = 0; r < p.nranks; r++)
		for (int q = 0; q < r; q++)
			if (p.gpus[q] == p.gpus[r]) {
				printf("SKIPPED: ranks %d and %d share GPU %d; NCCL needs one GPU per rank\n", q, r, p.gpus[r]);
				return EXIT_SKIP;
			}
	static char errbuf[BUFSIZ];
	setvbuf(stderr, errbuf, _IOLBF, sizeof(errbuf));
	/* NVLink multicast stays off on shared machines, whatever the caller's
	 * environment says. */
	setenv("NCCL_NVLS_ENABLE", "0", 1);
	const char *used = nccl_load(lib);
	if (!used)
		return EXIT_SKIP;
	run.p = &p;
	run.sh = mmap(NULL, sizeof(*run.sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (run.sh == MAP_FAILED) {
		perror(PROG ": mmap");
		return EXIT_FAIL;
	}
	printf(PROG ": %s, %d ranks, %d communicators on one stream per rank, %d iterations, timeout %.0f s\n", used,
	       p.nranks, p.comms, p.iters, run.timeout_s);
	return run_ranks(&run, 15);
}
