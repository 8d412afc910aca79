/*
 * Collectives end to end on the host engine, through the public API, with
 * one forked process per rank as in real jobs:
 *   - every collective x data type x reduction x in/out of place, on 2, 3,
 *     4 and 8 ranks, checked against the reference data of tool.h; each
 *     rank count runs its share of the combinations (a random rotation per
 *     run), so the four tests together cover every combination every run;
 *   - the DFCCL deadlock pattern (dfccl-chaos: 4 and 8 ranks, 8
 *     communicators, per-rank orders, 200 iterations, from 256 B up to
 *     256 KiB on 4 ranks and 128 KiB on 8, so that each test stays within
 *     a minute on two cores; DFCCL_TEST_CHAOS_MAX_BYTES=1M runs the
 *     pattern's full 1 MiB), and the same with registered collectives;
 *   - the pattern with DFCCL_ALGO=ring, tree and multitree (4 ranks, 4
 *     communicators, 20 iterations): its all-reduces run the forced
 *     algorithm, the other collectives their own;
 *   - a Megatron-style 3D grouping: 8 ranks in tensor-, pipeline- and
 *     data-parallel groups of 2, each rank in three communicators, random
 *     orders;
 *   - the tools' --mem and --devices: host buffers on chosen devices, and
 *     GPU buffers refused with a reason where they cannot be had;
 *   - dfccl-perf's backends and modes: what NCCL and the stream form cannot
 *     do here refused with the reason, and grouped and ungrouped batches
 *     on dfccl with the header and JSON that say how they ran;
 *   - a rank SIGKILLed in the middle of a chaos run: the other ranks end
 *     with errors instead of hanging, and the daemon serves a new run.
 * The daemon runs with --host-devices 2, so ranks share devices as they do
 * on a CI machine with two cores.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl.h"
#include "harness.h"
#include "membuf.h"
#include "tool.h"

#if !defined(DFCCL_CHAOS_PATH) || !defined(DFCCL_PERF_PATH)
#error "DFCCL_CHAOS_PATH and DFCCL_PERF_PATH must name the dfccl-chaos and dfccl-perf binaries"
#endif

#define FAIL(...)                                          \
	do {                                               \
		fprintf(stderr, "rank %d: ", rank);        \
		fprintf(stderr, __VA_ARGS__);              \
		fprintf(stderr, "\n");                     \
		rc = 1;                                    \
		goto out;                                  \
	} while (0)

/* Runs fn on nranks forked ranks and expects all of them to succeed within
 * timeout_ms. */
static void run_ranks(int nranks, int (*fn)(void *arg, int rank), void *arg, int timeout_ms)
{
	pid_t pids[64];
	for (int r = 0; r < nranks; r++)
		pids[r] = child_run(fn, arg, r);
	int failed = 0;
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	for (int r = 0; r < nranks; r++) {
		uint64_t now = now_ms();
		int rc = child_wait(pids[r], now < deadline ? (int)(deadline - now) : 1);
		if (rc != 0) {
			fprintf(stderr, "rank %d ended with %d%s\n", r, rc, rc < 0 ? " (timed out)" : "");
			failed++;
		}
	}
	assert_int_equal(failed, 0);
}

/* ------------------------------------------------------------ the matrix */

/* One combination of the matrix. */
struct combo {
	int coll, dtype, op;
	bool inplace;
};

#define MAX_COMBOS 512
#define MATRIX_BATCH 16 /* collectives in flight per rank before a synchronize */

struct matrix_job {
	dfcclUniqueId id;
	int nranks;
	struct combo combos[MAX_COMBOS];
	int ncombos;
	uint64_t seed;
};

/* Every combination, in a fixed order. */
static int all_combos(struct combo *out)
{
	int n = 0;
	for (int c = 0; c < TOOL_NCOLLS; c++)
		for (int t = 0; t < dfcclNumTypes; t++)
			for (int o = 0; o < (tool_coll_reduces(c) ? dfcclNumOps : 1); o++)
				for (int ip = 0; ip < 2; ip++) {
					if (ip && (c == TOOL_SENDRECV || c == TOOL_ALLTOALL))
						continue;
					out[n++] = (struct combo){c, t, o, ip};
				}
	return n;
}

static int matrix_rank(void *arg, int rank)
{
	const struct matrix_job *j = arg;
	int rc = 0, ndev = 1;
	dfcclComm_t comm = NULL;
	void *send[MATRIX_BATCH] = {0}, *recv[MATRIX_BATCH] = {0};
	const size_t cap = 8 * 1024 * 8 + 64; /* 1024 elements of 8 bytes, times 8 ranks */

	if (dfcclGetDeviceCount(&ndev) != dfcclSuccess)
		FAIL("device count: %s", dfcclGetLastError(NULL));
	dfcclSetDevice(rank % ndev);
	if (dfcclCommInitRank(&comm, j->nranks, j->id, rank) != dfcclSuccess)
		FAIL("init: %s", dfcclGetLastError(NULL));
	for (int i = 0; i < MATRIX_BATCH; i++)
		if (dfcclMemAlloc(&send[i], cap) != dfcclSuccess || dfcclMemAlloc(&recv[i], cap) != dfcclSuccess)
			FAIL("alloc: %s", dfcclGetLastError(NULL));

	for (int base = 0; base < j->ncombos; base += MATRIX_BATCH) {
		int n = j->ncombos - base < MATRIX_BATCH ? j->ncombos - base : MATRIX_BATCH;
		size_t counts[MATRIX_BATCH];
		int roots[MATRIX_BATCH];
		for (int i = 0; i < n; i++) {
			const struct combo *c = &j->combos[base + i];
			uint64_t key = tool_hash(j->seed, (uint64_t)(base + i), 0, 0);
			counts[i] = 1 + key % 1000;
			roots[i] = (int)((key >> 20) % (uint64_t)j->nranks);
			const void *s = send[i];
			void *r = recv[i];
			if (c->inplace)
				tool_inplace(c->coll, recv[i], counts[i], c->dtype, rank, &s, &r);
			tool_poison(recv[i], tool_recv_elems(c->coll, counts[i], j->nranks), c->dtype);
			tool_fill(c->coll, (void *)s, counts[i], c->dtype, c->op, rank, j->nranks, key);
			dfcclResult_t res = tool_issue(c->coll, s, r, counts[i], c->dtype, c->op, roots[i], comm);
			if (res != dfcclSuccess)
				FAIL("%s %s %s%s: %s", tool_coll_name(c->coll), tool_dtype_name(c->dtype), tool_op_name(c->op),
				     c->inplace ? " in place" : "", dfcclGetLastError(NULL));
		}
		dfcclResult_t res = dfcclCommSynchronize(comm);
		if (res != dfcclSuccess)
			FAIL("synchronize after combinations %d..%d: %s: %s", base, base + n - 1, dfcclGetErrorString(res),
			     dfcclGetLastError(NULL));
		for (int i = 0; i < n; i++) {
			const struct combo *c = &j->combos[base + i];
			uint64_t key = tool_hash(j->seed, (uint64_t)(base + i), 0, 0);
			const void *s = send[i];
			void *r = recv[i];
			size_t first;
			double got, want;
			if (c->inplace)
				tool_inplace(c->coll, recv[i], counts[i], c->dtype, rank, &s, &r);
			size_t wrong = tool_check(c->coll, r, counts[i], c->dtype, c->op, roots[i], rank, j->nranks, key,
			                          &first, &got, &want);
			if (wrong)
				FAIL("%s %s %s%s of %zu: %zu wrong, first at %zu: got %g, expected %g", tool_coll_name(c->coll),
				     tool_dtype_name(c->dtype), tool_op_name(c->op), c->inplace ? " in place" : "", counts[i],
				     wrong, first, got, want);
		}
	}
out:
	if (comm && rc)
		dfcclCommAbort(comm);
	else if (comm && dfcclCommDestroy(comm) != dfcclSuccess)
		rc = 1;
	for (int i = 0; i < MATRIX_BATCH; i++) {
		dfcclMemFree(send[i]);
		dfcclMemFree(recv[i]);
	}
	return rc;
}

/* The rotation of this run: which of the four rank counts checks which
 * combinations. Drawn once per process, printed for reproduction. */
static uint64_t suite_seed(void)
{
	static uint64_t seed;
	if (!seed) {
		const char *s = getenv("DFCCL_TEST_SEED");
		seed = s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
		if (!seed)
			seed = 1;
		fprintf(stderr, "test_collectives: seed %llu (DFCCL_TEST_SEED to repeat)\n", (unsigned long long)seed);
	}
	return seed;
}

static void run_matrix(int nranks, int share)
{
	struct combo all[MAX_COMBOS];
	int n = all_combos(all);
	struct matrix_job *j = calloc(1, sizeof(*j));
	assert_non_null(j);
	assert_int_equal(dfcclGetUniqueId(&j->id), dfcclSuccess);
	j->nranks = nranks;
	j->seed = suite_seed();
	for (int i = 0; i < n; i++)
		if ((uint64_t)(i + (int)(j->seed % 4)) % 4 == (uint64_t)share)
			j->combos[j->ncombos++] = all[i];
	run_ranks(nranks, matrix_rank, j, 55000);
	free(j);
}

static void test_matrix_2(void **state) { run_matrix(2, 0); }
static void test_matrix_3(void **state) { run_matrix(3, 1); }
static void test_matrix_4(void **state) { run_matrix(4, 2); }
static void test_matrix_8(void **state) { run_matrix(8, 3); }

/* ------------------------------------------------------------ dfccl-chaos */

/* What run_chaos kills, kill_after_ms after the start. */
enum chaos_victim {
	VICTIM_NONE,
	VICTIM_RANK,    /* one of dfccl-chaos's rank processes */
	VICTIM_WORKER0, /* the daemon's worker of device 0 */
};

/* The pid of device `dev`'s worker, from the daemon's status; *up tells
 * whether it is serving (optional). */
static pid_t worker_pid_of(const struct daemon_proc *d, unsigned dev, int *up)
{
	struct raw_client c;
	assert_int_equal(raw_connect(&c, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	dfccl_envelope *r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	raw_close(&c);
	assert_non_null(r);
	assert_true(r->query_reply->status->n_devices > dev);
	pid_t pid = r->query_reply->status->devices[dev]->worker_pid;
	if (up)
		*up = r->query_reply->status->devices[dev]->worker_up;
	frame_envelope_free(r);
	return pid;
}

/* Runs the tool at path (dfccl-chaos or dfccl-perf) with args
 * (NULL-terminated) and its output in *out (caller frees); returns its exit
 * status, or -1 on timeout. With a victim, that process is SIGKILLed
 * kill_after_ms after the start. */
static int run_tool(const struct daemon_proc *d, const char *path, int timeout_ms, enum chaos_victim victim_kind,
                    int kill_after_ms, char **out, ...)
{
	char log[160];
	snprintf(log, sizeof(log), "%s/tool.out", d->dir);
	const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	const char *argv[32] = {name, "--socket", d->socket};
	int argc = 3;
	va_list ap;
	va_start(ap, out);
	for (const char *a; argc < 31 && (a = va_arg(ap, const char *));)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;

	pid_t pid = child_exec(path, argv, log, NULL);
	assert_true(pid > 0);
	if (victim_kind == VICTIM_WORKER0) {
		usleep((useconds_t)kill_after_ms * 1000);
		assert_int_equal(kill(worker_pid_of(d, 0, NULL), SIGKILL), 0);
	} else if (victim_kind == VICTIM_RANK) {
		usleep((useconds_t)kill_after_ms * 1000);
		/* A rank is a child of dfccl-chaos. */
		char children[64], buf[256] = "";
		snprintf(children, sizeof(children), "/proc/%d/task/%d/children", (int)pid, (int)pid);
		FILE *f = fopen(children, "r");
		assert_non_null(f);
		assert_non_null(fgets(buf, sizeof(buf), f));
		fclose(f);
		pid_t victim = (pid_t)strtol(buf, NULL, 10);
		assert_true(victim > 0);
		assert_int_equal(kill(victim, SIGKILL), 0);
	}
	int rc = child_wait(pid, timeout_ms);
	*out = malloc(1 << 16);
	assert_non_null(*out);
	read_text_file(log, *out, 1 << 16);
	if (rc != 0 && victim_kind == VICTIM_NONE)
		fprintf(stderr, "%s exited with %d:\n%s\n", name, rc, *out);
	return rc;
}

#define run_chaos(d, ...) run_tool(d, DFCCL_CHAOS_PATH, __VA_ARGS__)

static void chaos_expect_ok(void **state, ...)
{
	struct daemon_proc *d = *state;
	const char *a[16] = {0};
	va_list ap;
	va_start(ap, state);
	for (int i = 0; i < 15 && (a[i] = va_arg(ap, const char *)); i++)
		;
	va_end(ap);
	char *out;
	int rc = run_chaos(d, 120000, VICTIM_NONE, 0, &out, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
	                   a[10], a[11], a[12], a[13], a[14], NULL);
	int ok = strstr(out, "OK: every collective completed with a correct result") != NULL;
	free(out);
	assert_int_equal(rc, 0);
	assert_true(ok);
}

/* The largest collective of the deadlock pattern: `fallback`, or
 * $DFCCL_TEST_CHAOS_MAX_BYTES. */
static const char *chaos_max_bytes(const char *fallback)
{
	const char *v = getenv("DFCCL_TEST_CHAOS_MAX_BYTES");
	return v && *v ? v : fallback;
}

static void test_deadlock_pattern_4(void **state)
{
	chaos_expect_ok(state, "--nranks", "4", "--comms", "8", "--iters", "200", "--min-bytes", "256", "--max-bytes",
	                chaos_max_bytes("256K"), NULL);
}

static void test_deadlock_pattern_8(void **state)
{
	chaos_expect_ok(state, "--nranks", "8", "--comms", "8", "--iters", "200", "--min-bytes", "256", "--max-bytes",
	                chaos_max_bytes("128K"), NULL);
}

static void test_deadlock_registered(void **state)
{
	chaos_expect_ok(state, "--nranks", "4", "--comms", "8", "--iters", "100", "--min-bytes", "256", "--max-bytes",
	                "64K", "--registered", NULL);
}

/* The pattern with every rank's all-reduces forced to each algorithm. The
 * variable is removed before any assertion, so a failure here does not
 * leak it into the tests after this one. */
static void test_deadlock_algos(void **state)
{
	struct daemon_proc *d = *state;
	static const char *const algos[] = {"ring", "tree", "multitree"};
	int failed = 0;
	for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
		/* dfccl-chaos and its ranks inherit it. */
		if (setenv("DFCCL_ALGO", algos[i], 1) < 0) {
			failed++;
			break;
		}
		char *out;
		int rc = run_chaos(d, 120000, VICTIM_NONE, 0, &out, "--nranks", "4", "--comms", "4", "--iters", "20",
		                   "--min-bytes", "256", "--max-bytes", "64K", NULL);
		if (rc != 0 || !strstr(out, "OK: every collective completed with a correct result")) {
			fprintf(stderr, "DFCCL_ALGO=%s: dfccl-chaos failed\n", algos[i]);
			failed++;
		}
		free(out);
	}
	unsetenv("DFCCL_ALGO");
	assert_int_equal(failed, 0);
}

static void test_daemon_algo_setting(void **state)
{
	/* The daemon's own setting forces the algorithm of entries that carry
	 * no hint (the client's DFCCL_ALGO is unset here). */
	static const char *const algos[] = {"ring", "multitree"};
	for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
		struct daemon_proc d;
		assert_int_equal(daemon_start(&d, 2, "--algo", algos[i], NULL), 0);
		struct daemon_proc *dp = &d;
		chaos_expect_ok((void **)&dp, "--nranks", "3", "--comms", "3", "--iters", "15", "--min-bytes", "256",
		                "--max-bytes", "32K", NULL);
		assert_true(daemon_log_contains(&d, "--algo") == 0); /* it was taken, not refused */
		assert_int_equal(daemon_stop(&d), 0);
	}
}

/*
 * The tools' choice of buffers and devices. Host buffers (--mem host) on
 * the devices --devices names work in both tools. GPU buffers (--mem
 * device, vmm or memalloc) need a build with a CUDA toolkit: without one
 * both tools refuse them as a usage error that says so; with one, against
 * the host engine, every rank fails with its reason (no GPU here, or an
 * engine that takes no GPU buffers) and the tool says so instead of
 * hanging. An unknown kind is a usage error.
 */
static void test_tools_memory(void **state)
{
	struct daemon_proc *d = *state;
	char *out;
	chaos_expect_ok(state, "--nranks", "3", "--comms", "2", "--iters", "5", "--max-bytes", "16K", "--mem", "host",
	                "--devices", "1,0", NULL);
	int rc = run_tool(d, DFCCL_PERF_PATH, 60000, VICTIM_NONE, 0, &out, "allreduce", "--mem", "host", "--devices",
	                  "1", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--json", NULL);
	int host_json = strstr(out, "\"mem\": \"host\"") != NULL && strstr(out, "\"wrong\": 0}") != NULL;
	free(out);
	assert_int_equal(rc, 0);
	assert_true(host_json);

	static const char *const tools[] = {DFCCL_CHAOS_PATH, DFCCL_PERF_PATH};
	static const char *const gpu_kinds[] = {"device", "vmm", "memalloc", "bogus"};
	for (int t = 0; t < 2; t++) {
		for (int k = 0; k < 4; k++) {
			if (t == 0)
				rc = run_tool(d, tools[t], 60000, VICTIM_NONE, 0, &out, "--nranks", "2", "--iters", "1",
				              "--mem", gpu_kinds[k], NULL);
			else
				rc = run_tool(d, tools[t], 60000, VICTIM_NONE, 0, &out, "allreduce", "-b", "8", "-e", "8",
				              "--mem", gpu_kinds[k], NULL);
#ifdef DFCCL_TOOLS_HAVE_CUDA
			int said = strstr(out, "rank 0") != NULL;
			int want_rc = TOOL_EXIT_FAIL;
#else
			int said = strstr(out, "built without CUDA") != NULL;
			int want_rc = TOOL_EXIT_USAGE;
#endif
			if (k == 3) {
				said = strstr(out, t == 0 ? "--mem takes host, device, vmm or memalloc, not"
				                          : "--mem takes host, device, vmm, memalloc or nccl, not") != NULL;
				want_rc = TOOL_EXIT_USAGE;
			}
			if (rc != want_rc || !said)
				fprintf(stderr, "%s --mem %s: exit %d\n%s", tools[t], gpu_kinds[k], rc, out);
			free(out);
			assert_int_equal(rc, want_rc);
			assert_true(said);
		}
	}
}

/*
 * dfccl-perf --backend, --mode, --group and NCCL's options. Every request
 * that NCCL or the stream form cannot serve here is refused before any rank
 * starts, with a message that says why: an unknown backend or mode, the
 * callback form on NCCL, two ranks on one GPU, symmetric buffers without
 * NCCL or from an NCCL without windows (the old fake NCCL), buffers NCCL
 * does not take, a missing library named by --nccl-lib or by
 * DFCCL_NCCL_LIB. Past loading NCCL (the current fake NCCL), a build
 * without CUDA refuses (the stream form too); in a build with CUDA the fake
 * NCCL finds no GPU (CI) or, where CUDA sees one, its rank reports the
 * fake's failure, and the stream form on the host engine finds no GPU or
 * runs with correct results. --overlap and --compute-only refuse bad
 * lengths, host buffers, the callback form and options that do not apply,
 * and, without CUDA, say the build has none; with CUDA, --compute-only
 * finds no GPU or runs its kernel with a correct result. --queue-only
 * refuses what does not apply, times NOP entries on the host engine, and
 * names a device the daemon does not have; --queue-only --mode stream
 * needs CUDA, and finds no GPU or times stream-ordered NOPs. On dfccl (the
 * host engine), host buffers default to the callback form, ungrouped and
 * grouped batches complete with correct results, and the header and the
 * JSON say backend, library version, mode, symmetric, batch and group.
 */
#if !defined(FAKE_NCCL_PATH) || !defined(FAKE_NCCL_OLD_PATH)
#error "FAKE_NCCL_PATH and FAKE_NCCL_OLD_PATH must name the fake NCCL libraries"
#endif

/* One request to dfccl-perf and what it must end with: an exit status and
 * phrases of its output. */
struct perf_expect {
	const char *args[12];
	int rc;
	const char *says[3];
};

static void perf_expect(struct daemon_proc *d, const struct perf_expect *e)
{
	const char *const *a = e->args;
	char *out;
	int rc = run_tool(d, DFCCL_PERF_PATH, 120000, VICTIM_NONE, 0, &out, a[0], a[1], a[2], a[3], a[4], a[5], a[6],
	                  a[7], a[8], a[9], a[10], a[11], NULL);
	int said = 1;
	for (int k = 0; k < 3 && e->says[k]; k++)
		said = said && strstr(out, e->says[k]) != NULL;
	if (rc != e->rc || !said)
		fprintf(stderr, "dfccl-perf %s %s %s %s ...: exit %d (want %d), want \"%s\"%s in:\n%s", a[0],
		        a[1] ? a[1] : "", a[2] ? a[2] : "", a[3] ? a[3] : "", rc, e->rc, e->says[0],
		        e->says[1] ? " and more" : "", out);
	free(out);
	assert_int_equal(rc, e->rc);
	assert_true(said);
}

static void test_perf_backends(void **state)
{
	struct daemon_proc *d = *state;
	const int usage = TOOL_EXIT_USAGE;
	const struct perf_expect refused[] = {
	    {{"allreduce", "--backend", "bogus"}, usage, {"--backend takes dfccl or nccl, not 'bogus'"}},
	    {{"allreduce", "--mode", "sync"}, usage, {"--mode takes stream or callback, not 'sync'"}},
	    {{"allreduce", "--group", "2"}, usage, {"--group takes 0 or 1, not '2'"}},
	    {{"allreduce", "--backend", "nccl", "--mode", "callback"}, usage, {"NCCL has the stream form only"}},
	    {{"allreduce", "--backend", "nccl", "--devices", "1,1"}, usage,
	     {"ranks 0 and 1 would share GPU 1: NCCL needs a GPU of its own per rank"}},
	    {{"allreduce", "--backend", "nccl", "--nranks", "3", "--devices", "0,1"}, usage,
	     {"ranks 0 and 2 would share GPU 0"}},
	    {{"allreduce", "--nccl-symmetric"}, usage, {"--nccl-symmetric is NCCL's: it needs --backend nccl"}},
	    {{"allreduce", "--mem", "nccl"}, usage, {"--mem nccl (ncclMemAlloc) is for --backend nccl"}},
	    {{"allreduce", "--backend", "nccl", "--mem", "host"}, usage,
	     {"--backend nccl takes --mem device, vmm or nccl, not --mem host"}},
	    {{"allreduce", "--backend", "nccl", "--nccl-symmetric", "--mem", "vmm"}, usage,
	     {"--nccl-symmetric allocates the buffers with ncclMemAlloc (--mem nccl), not --mem vmm"}},
	    {{"allreduce", "--backend", "nccl", "--nccl-lib", "/nonexistent/nccl/libnccl.so.2"}, usage,
	     {"cannot load NCCL (/nonexistent/nccl/libnccl.so.2)", "on LD_LIBRARY_PATH, or name the file in "
	      "DFCCL_NCCL_LIB"}},
	    {{"allreduce", "--backend", "nccl", "--nccl-lib", FAKE_NCCL_OLD_PATH, "--nccl-symmetric"}, usage,
	     {"NCCL 2.8.4", "symmetric windows need NCCL 2.27 or later"}},
	    {{"allreduce", "--overlap", "0"}, usage,
	     {"--overlap takes the compute kernel's microseconds, 1 to 1000000, not '0'"}},
	    {{"allreduce", "--overlap", "10ms"}, usage, {"--overlap takes the compute kernel's microseconds"}},
	    {{"allreduce", "--overlap", "100", "--mem", "host"}, usage,
	     {"--overlap measures a trainer's step, whose buffers are on the GPU", "not --mem host"}},
	    {{"allreduce", "--overlap", "100", "--mode", "callback"}, usage,
	     {"--overlap issues the compute kernel and the collectives on the rank's CUDA stream",
	      "not --mode callback"}},
	    {{"allreduce", "--compute-rounds", "5"}, usage,
	     {"--compute-rounds sets the kernel of --overlap or --compute-only"}},
	    {{"allreduce", "--overlap", "100", "--compute-rounds", "-3"}, usage,
	     {"--compute-rounds takes 1 to 2147483648 rounds, not '-3'"}},
	    {{"--compute-only", "1000001"}, usage,
	     {"--compute-only takes the compute kernel's microseconds, 1 to 1000000, not '1000001'"}},
	    {{"--compute-only", "100", "--nranks", "2"}, usage,
	     {"--compute-only runs the compute kernel alone; it takes -n, -w, --devices, --compute-rounds and "
	      "--json, not --nranks"}},
	    {{"--compute-only", "100", "allreduce"}, usage,
	     {"--compute-only runs no collective; unexpected argument 'allreduce'"}},
	    {{"--queue-only", "--nranks", "2"}, usage,
	     {"--queue-only times the daemon's queue alone; it takes -n, -w, --devices, --mode, --json and --socket, "
	      "not --nranks"}},
	    {{"--queue-only", "allreduce"}, usage, {"--queue-only runs no collective; unexpected argument 'allreduce'"}},
	    {{"--queue-only", "--compute-only", "100"}, usage,
	     {"--compute-only and --queue-only are two separate runs: give one of them"}},
#ifndef DFCCL_TOOLS_HAVE_CUDA
	    {{"allreduce", "--overlap", "100"}, usage,
	     {"--overlap: the compute kernel runs on a GPU, and this build has no CUDA"}},
	    {{"--compute-only", "100"}, usage,
	     {"--compute-only: the compute kernel runs on a GPU, and this build has no CUDA"}},
	    {{"--queue-only", "--mode", "stream"}, usage,
	     {"--queue-only --mode stream queues the entries on a CUDA stream, and this build has no CUDA"}},
	    {{"allreduce", "--backend", "nccl", "--nccl-lib", FAKE_NCCL_PATH}, usage,
	     {"--backend nccl runs on GPUs, and this build has no CUDA"}},
	    {{"allreduce", "--mode", "stream"}, usage,
	     {"--mode stream issues the collectives on a CUDA stream, and this build has no CUDA"}},
#endif
	};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		perf_expect(d, &refused[i]);

	/* The library named by the environment. The variable goes before any
	 * assertion, so that no later test inherits it. */
	setenv("DFCCL_NCCL_LIB", "/nonexistent/env/libnccl.so.2", 1);
	char *out;
	int rc = run_tool(d, DFCCL_PERF_PATH, 60000, VICTIM_NONE, 0, &out, "allreduce", "--backend", "nccl", NULL);
	unsetenv("DFCCL_NCCL_LIB");
	int said = strstr(out, "cannot load NCCL (DFCCL_NCCL_LIB=/nonexistent/env/libnccl.so.2)") != NULL;
	if (rc != usage || !said)
		fprintf(stderr, "DFCCL_NCCL_LIB: exit %d\n%s", rc, out);
	free(out);
	assert_int_equal(rc, usage);
	assert_true(said);

#ifdef DFCCL_TOOLS_HAVE_CUDA
	/* What follows depends on whether CUDA sees a GPU here. */
	bool gpu = membuf_gpu_count() > 0;
	/* Past loading the fake NCCL: no GPU here, or the rank reports the
	 * fake's failure. */
	const struct perf_expect fake = {
	    {"allreduce", "--backend", "nccl", "--nccl-lib", FAKE_NCCL_PATH, "--nranks", "1"},
	    gpu ? TOOL_EXIT_FAIL : usage,
	    {gpu ? "rank 0: ncclCommInitRank: fake NCCL error: the fake NCCL does no work"
	         : "--backend nccl: CUDA sees no GPU"}};
	perf_expect(d, &fake);
	/* The stream form on the host engine: without a GPU the ranks say
	 * that they cannot use one; with one, the collectives run
	 * stream-ordered, with correct results. */
	const struct perf_expect stream = {
	    {"allreduce", "--mode", "stream", "--devices", "0", "-b", "8", "-e", "1K"},
	    gpu ? 0 : TOOL_EXIT_FAIL,
	    {gpu ? ", mode stream, " : "rank 0: selecting the GPU: ", gpu ? "# Out of bounds values : 0 OK" : NULL}};
	perf_expect(d, &stream);
	/* The compute kernel alone: without a GPU it says so; with one it
	 * runs, and its result is right. */
	const struct perf_expect compute = {
	    {"--compute-only", "50", "-n", "20", "--devices", "0"},
	    gpu ? 0 : TOOL_EXIT_FAIL,
	    {gpu ? "# dfccl-perf compute-only: GPU 0, a kernel of about 50 us" : "--compute-only on GPU 0: ",
	     gpu ? "# Out of bounds values : 0 OK" : NULL}};
	perf_expect(d, &compute);
	/* NOPs stream-ordered on a CUDA stream: without a GPU it says so;
	 * with one, the host engine completes them as the stream arms them. */
	const struct perf_expect queue_stream = {
	    {"--queue-only", "--mode", "stream", "-n", "50", "--devices", "0"},
	    gpu ? 0 : TOOL_EXIT_FAIL,
	    {gpu ? "# dfccl-perf queue-only: device 0, NOP entries stream-ordered back to back on a CUDA stream, 5 "
	           "warmup and 50 timed"
	         : "--queue-only --mode stream on GPU 0: ",
	     gpu ? "# time per entry (us): " : NULL}};
	perf_expect(d, &queue_stream);
#endif

	/* dfccl, ungrouped and grouped: correct results, and the header and
	 * the JSON say how they ran. */
	char header[128], json[160];
	snprintf(header, sizeof(header), "# backend dfccl (dfccl %d.%d.%d), mode callback, symmetric 0, batch 4, group 0",
	         DFCCL_MAJOR, DFCCL_MINOR, DFCCL_PATCH);
	snprintf(json, sizeof(json), "{\"collective\": \"reducescatter\", \"backend\": \"dfccl\", \"library\": "
	         "\"dfccl %d.%d.%d\", \"version\": %d, ", DFCCL_MAJOR, DFCCL_MINOR, DFCCL_PATCH, DFCCL_VERSION_CODE);
	const struct perf_expect ran[] = {
	    /* The queue alone: NOP entries on the host engine's device 0, and
	     * a device the daemon does not have. */
	    {{"--queue-only", "-n", "50", "--devices", "0"}, 0,
	     {"# dfccl-perf queue-only: device 0, a NOP entry submitted and waited for, 5 warmup and 50 timed",
	      "# round trip (us): median "}},
	    {{"--queue-only", "--json", "--devices", "0"}, 0,
	     {"{\"mode\": \"queue-only\", \"form\": \"callback\", \"device\": 0, \"warmup\": 5, \"iters\": 20, "
	      "\"median_us\": "}},
	    {{"--queue-only", "-n", "5", "--devices", "60"}, TOOL_EXIT_FAIL,
	     {"--queue-only on device 60: invalid argument: device 60 does not exist"}},
	    {{"allreduce", "-b", "1K", "-e", "4K", "-n", "3", "--batch", "4", "--group", "0"}, 0,
	     {header, "# Out of bounds values : 0 OK"}},
	    {{"reducescatter", "-b", "1K", "-e", "4K", "-n", "3", "--batch", "3", "--json"}, 0,
	     {json, "\"mode\": \"callback\", \"symmetric\": false, \"nranks\": 2, \"mem\": \"host\", \"batch\": 3, "
	            "\"group\": 1, \"size\": 4096",
	      "\"wrong\": 0}}"}},
	};
	for (size_t i = 0; i < sizeof(ran) / sizeof(ran[0]); i++)
		perf_expect(d, &ran[i]);
}

static void test_rank_killed(void **state)
{
	struct daemon_proc *d = *state;
	char *out;
	uint64_t t0 = now_ms();
	int rc = run_chaos(d, 40000, VICTIM_RANK, 1500, &out, "--nranks", "4", "--comms", "4", "--iters", "100000", "--max-bytes",
	                   "64K", NULL);
	uint64_t took = now_ms() - t0;
	fprintf(stderr, "chaos with a killed rank: exit %d after %llu ms\n%s", rc, (unsigned long long)took, out);
	/* It failed, said which rank died, and the others ended on their own
	 * with errors rather than being killed for hanging. */
	assert_true(rc > 0 && rc < 128);
	assert_non_null(strstr(out, "was killed by signal 9"));
	assert_null(strstr(out, "did not end within"));
	assert_true(took < 1500 + 25000);
	free(out);
	/* The daemon still serves a new run. */
	chaos_expect_ok(state, "--nranks", "4", "--comms", "4", "--iters", "10", "--max-bytes", "64K", NULL);
}

/* The pids of pid's children (up to max); returns how many. */
static int children_of(pid_t pid, pid_t *out, int max)
{
	char path[64], buf[512] = "";
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
	read_text_file(path, buf, sizeof(buf));
	int n = 0;
	for (char *p = buf, *end; n < max; p = end) {
		long v = strtol(p, &end, 10);
		if (end == p)
			break;
		out[n++] = (pid_t)v;
	}
	return n;
}

/* Whether process pid is gone or a zombie: it runs no more. */
static int process_ended(pid_t pid)
{
	char path[64], buf[256] = "";
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	read_text_file(path, buf, sizeof(buf));
	const char *p = strrchr(buf, ')'); /* the state follows the command's name */
	return !buf[0] || (p && p[1] == ' ' && p[2] == 'Z');
}

/* Starts a long dfccl-perf run of 3 ranks, its output into log, and waits
 * until its rank processes run (their pids into ranks). */
static pid_t perf_with_ranks(struct daemon_proc *d, const char *log, pid_t *ranks)
{
	const char *argv[] = {"dfccl-perf", "--socket", d->socket, "allreduce", "--nranks", "3", "--mem", "host",
	                      "-b", "4K", "-e", "4K", "-n", "100000000", "-w", "0", NULL};
	pid_t pid = child_exec(DFCCL_PERF_PATH, argv, log, NULL);
	assert_true(pid > 0);
	int n = 0;
	for (uint64_t t0 = now_ms(); now_ms() - t0 < 20000 && (n = children_of(pid, ranks, 3)) < 3;)
		usleep(20000);
	assert_int_equal(n, 3);
	usleep(500000); /* well into their loop */
	return pid;
}

/* SIGTERM to dfccl-perf reaches its ranks: none outlives it, and it ends
 * by the signal, saying so. SIGKILLed, it cannot pass anything on: its
 * ranks end by the signal their parent's death sends them. */
static void test_perf_stopped(void **state)
{
	struct daemon_proc *d = *state;
	char log[160], out[4096];
	pid_t ranks[3];
	snprintf(log, sizeof(log), "%s/perf-stopped.out", d->dir);
	pid_t pid = perf_with_ranks(d, log, ranks);
	assert_int_equal(kill(pid, SIGTERM), 0);
	assert_int_equal(child_wait(pid, 20000), 128 + SIGTERM);
	for (int i = 0; i < 3; i++)
		assert_true(kill(ranks[i], 0) < 0 && errno == ESRCH);
	read_text_file(log, out, sizeof(out));
	assert_non_null(strstr(out, "dfccl-perf: stopped by signal 15 (Terminated): stopping the ranks"));
	assert_null(strstr(out, "did not end within"));

	snprintf(log, sizeof(log), "%s/perf-killed.out", d->dir);
	pid = perf_with_ranks(d, log, ranks);
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(child_wait(pid, 20000), 128 + SIGKILL);
	int ended = 0;
	for (uint64_t t0 = now_ms(); now_ms() - t0 < 10000; usleep(20000)) {
		ended = 0;
		for (int i = 0; i < 3; i++)
			ended += process_ended(ranks[i]);
		if (ended == 3)
			break;
	}
	assert_int_equal(ended, 3);

	/* The daemon still serves a new run. */
	chaos_expect_ok(state, "--nranks", "3", "--comms", "2", "--iters", "10", "--max-bytes", "64K", NULL);
}

static void test_worker_killed(void **state)
{
	struct daemon_proc *d = *state;
	char *out;
	/* Ranks alternate between the two devices, so every communicator of
	 * the run has ranks on device 0, whose worker dies mid-run. */
	uint64_t t0 = now_ms();
	int rc = run_chaos(d, 40000, VICTIM_WORKER0, 1500, &out, "--nranks", "4", "--comms", "4", "--iters",
	                   "100000", "--max-bytes", "64K", NULL);
	uint64_t took = now_ms() - t0;
	fprintf(stderr, "chaos with a killed worker: exit %d after %llu ms\n%s", rc, (unsigned long long)took, out);
	/* Said by the completion of an entry in flight, or by the library when
	 * the communicator was already marked failed at submission. */
	int lost = strstr(out, "worker for this device died") != NULL || strstr(out, "worker for device 0 died") != NULL;
	int hung = strstr(out, "did not end within") != NULL;
	free(out);
	/* Every rank ended on its own with an error, in bounded time. */
	assert_true(rc > 0 && rc < 128);
	assert_true(lost);
	assert_false(hung);
	assert_true(took < 1500 + 25000);
	/* The worker came back and the daemon serves a new run on both devices. */
	uint64_t deadline = now_ms() + 10000;
	int up = 0;
	while (now_ms() < deadline && (worker_pid_of(d, 0, &up), !up))
		usleep(50000);
	assert_true(up);
	chaos_expect_ok(state, "--nranks", "4", "--comms", "4", "--iters", "10", "--max-bytes", "64K", NULL);
}

/* ------------------------------------------------------------ 3D grouping */

#define MEGATRON_RANKS 8
#define MEGATRON_ITERS 60

struct megatron_job {
	dfcclUniqueId tp[4], pp[4], dp[4];
	uint64_t seed;
};

static int megatron_rank(void *arg, int rank)
{
	const struct megatron_job *j = arg;
	/* rank = dp * 4 + pp * 2 + tp: tensor-parallel pairs are neighbours,
	 * pipeline pairs two apart, data-parallel pairs four apart. */
	int tp = rank % 2, pp = rank / 2 % 2, dp = rank / 4;
	int group[3] = {rank / 2, dp * 2 + tp, rank % 4};          /* which tp, pp, dp communicator */
	int me[3] = {tp, pp, dp};                                 /* this rank's rank in each */
	const dfcclUniqueId *ids[3] = {&j->tp[group[0]], &j->pp[group[1]], &j->dp[group[2]]};
	static const int colls[3] = {TOOL_ALLREDUCE, TOOL_SENDRECV, TOOL_ALLGATHER};
	dfcclComm_t comm[3] = {0};
	void *send[3] = {0}, *recv[3] = {0};
	int rc = 0, ndev = 1;
	const size_t count = 4096, cap = count * 4 * 2;

	if (dfcclGetDeviceCount(&ndev) != dfcclSuccess)
		FAIL("device count: %s", dfcclGetLastError(NULL));
	dfcclSetDevice(rank % ndev);
	for (int g = 0; g < 3; g++) {
		if (dfcclCommInitRank(&comm[g], 2, *ids[g], me[g]) != dfcclSuccess)
			FAIL("init of group %d: %s", g, dfcclGetLastError(NULL));
		if (dfcclMemAlloc(&send[g], cap) != dfcclSuccess || dfcclMemAlloc(&recv[g], cap) != dfcclSuccess)
			FAIL("alloc: %s", dfcclGetLastError(NULL));
	}
	for (int it = 0; it < MEGATRON_ITERS; it++) {
		int order[3] = {0, 1, 2};
		for (int k = 2; k > 0; k--) {
			int x = (int)(tool_hash(j->seed, (uint64_t)rank, (uint64_t)it, (uint64_t)k) % (uint64_t)(k + 1));
			int t = order[k];
			order[k] = order[x];
			order[x] = t;
		}
		for (int i = 0; i < 3; i++) {
			int g = order[i];
			/* The key names the communicator instance, so both members agree. */
			uint64_t key = tool_hash(j->seed, (uint64_t)it, (uint64_t)g, (uint64_t)group[g]);
			tool_poison(recv[g], 2 * count, dfcclFloat32);
			tool_fill(colls[g], send[g], count, dfcclFloat32, dfcclSum, me[g], 2, key);
			if (tool_issue(colls[g], send[g], recv[g], count, dfcclFloat32, dfcclSum, 0, comm[g]) != dfcclSuccess)
				FAIL("iteration %d, group %d: %s", it, g, dfcclGetLastError(NULL));
		}
		for (int g = 0; g < 3; g++) {
			uint64_t key = tool_hash(j->seed, (uint64_t)it, (uint64_t)g, (uint64_t)group[g]);
			size_t first;
			double got, want;
			dfcclResult_t r = dfcclCommSynchronize(comm[g]);
			if (r != dfcclSuccess)
				FAIL("iteration %d, group %d: %s", it, g, dfcclGetLastError(NULL));
			if (tool_check(colls[g], recv[g], count, dfcclFloat32, dfcclSum, 0, me[g], 2, key, &first, &got, &want))
				FAIL("iteration %d, group %d (%s): index %zu is %g, expected %g", it, g, tool_coll_name(colls[g]),
				     first, got, want);
		}
	}
out:
	for (int g = 0; g < 3; g++) {
		if (comm[g] && rc)
			dfcclCommAbort(comm[g]);
		else if (comm[g])
			dfcclCommDestroy(comm[g]);
		dfcclMemFree(send[g]);
		dfcclMemFree(recv[g]);
	}
	return rc;
}

static void test_megatron_3d(void **state)
{
	struct megatron_job j;
	for (int i = 0; i < 4; i++) {
		assert_int_equal(dfcclGetUniqueId(&j.tp[i]), dfcclSuccess);
		assert_int_equal(dfcclGetUniqueId(&j.pp[i]), dfcclSuccess);
		assert_int_equal(dfcclGetUniqueId(&j.dp[i]), dfcclSuccess);
	}
	j.seed = suite_seed();
	run_ranks(MEGATRON_RANKS, megatron_rank, &j, 55000);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_matrix_2, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_matrix_3, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_matrix_4, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_matrix_8, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_deadlock_pattern_4, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_deadlock_pattern_8, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_deadlock_registered, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_deadlock_algos, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_megatron_3d, daemon_setup2, daemon_teardown),
	    cmocka_unit_test(test_daemon_algo_setting),
	    cmocka_unit_test_setup_teardown(test_tools_memory, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_perf_backends, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_rank_killed, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_perf_stopped, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_worker_killed, daemon_setup2, daemon_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
