/*
 * test_cuda_kill: a client SIGKILLed in the middle of a collective on GPU
 * buffers while a kernel of its own runs on the GPU, and what its peer
 * sees. With --loop it is the bystander of the fault tests instead: ranks
 * that run checked all-reduces for a while and report the longest one.
 *
 * The fault. The parent forks two rank processes (CUDA starts in them,
 * after the fork: a CUDA context does not survive fork()) on the GPUs of
 * --gpus. Both join one communicator of the dfccld at $DFCCL_SOCKET and run
 * --iters float all-reduces on cudaMalloc buffers, NULL stream, each
 * checked against the reference data of tool.h. Then:
 *   - rank 1, the victim, launches a kernel of its own on a stream of its
 *     own (spin_kernel.h), whose heartbeat lies in a page it shares with the
 *     parent, waits until the heartbeat moves, says it is ready and submits
 *     nothing more;
 *   - rank 0, the survivor, submits one more all-reduce, which the victim
 *     never joins, says it is ready and waits for it in
 *     dfcclCommSynchronize.
 * The parent checks that the heartbeat still moves (the victim's kernel
 * runs when it dies), SIGKILLs the victim and notes the time. The survivor
 * notes when its wait returned and with which result; a second later it
 * probes its own CUDA context (a device synchronization, a copy and an
 * allocation): under MPS a client killed while its kernel runs poisons
 * every context on that GPU, the survivor's too when it shares the GPU, and
 * the probe tells the fault test whether the daemon's worker for that GPU
 * must have been restarted.
 *
 * The parent checks that the result is one that --expect allows, reached
 * the survivor within --max-latency seconds of the kill, and prints a line
 * for scripts:
 *   RESULT status=peer-lost latency_ms=41.2 survivor_context=ok
 * status is peer-lost (dfcclRemoteError), device-lost (dfcclDeviceLost),
 * aborted, timeout, success or error-N; survivor_context is ok, poisoned,
 * or none.
 *
 * --host-buffers runs the same on dfcclMemAllocHost buffers without CUDA, the
 * victim's kernel played by a thread (survivor_context=none), which checks
 * this program against the host engine.
 *
 * Exit status: 0 the checks passed, 1 a failure, 2 usage, 77 no usable GPU.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dfccl.h"
#include "gputest.h"
#include "membuf.h"
#include "spin_kernel.h"
#include "tool.h"

#define PROG "test_cuda_kill"
#define SURVIVOR 0
#define VICTIM 1
/* Both ranks set up, warm up and get ready within this long. */
#define READY_TIMEOUT_S 120.0
/* The survivor probes its CUDA context this long after its result. */
#define PROBE_DELAY_S 1
/* The parent watches the heartbeat move for this long before the kill. */
#define HEARTBEAT_WATCH_US 200000
/* The spinning kernel ends by itself after this long. */
#define SPIN_MAX_S 600

static const char usage[] =
    "Usage: " PROG " [--gpus A,B] [OPTIONS]       the fault\n"
    "       " PROG " --loop SECONDS [--gpus LIST] [--nranks N] [OPTIONS]\n"
    "The fault: rank 0 (the survivor) on GPU A and rank 1 (the victim) on GPU B\n"
    "run checked all-reduces on cudaMalloc buffers through the dfccld at\n"
    "$DFCCL_SOCKET; then the victim starts a spinning kernel of its own and\n"
    "submits nothing more, the survivor waits in an all-reduce the victim never\n"
    "joins, and the victim is SIGKILLed. The survivor must see one of the\n"
    "expected results within --max-latency seconds; prints\n"
    "RESULT status=... latency_ms=... survivor_context=ok|poisoned.\n"
    "--loop: N ranks on the GPUs of LIST run checked all-reduces for SECONDS.\n"
    "\n"
    "      --socket PATH      the daemon's socket (default $DFCCL_SOCKET)\n"
    "      --gpus LIST        comma-separated GPU indices of the ranks (default 0,0)\n"
    "      --iters N          fault: checked all-reduces before the fault (default 20)\n"
    "      --count N          floats per all-reduce (default 262144)\n"
    "      --expect LIST      fault: the results the survivor may see, of peer-lost,\n"
    "                         device-lost, aborted, timeout (default peer-lost,device-lost)\n"
    "      --max-latency S    fault: most seconds from the kill to the survivor's result\n"
    "                         (default 1)\n"
    "      --spin-blocks N    fault: blocks of the victim's kernel (default 4)\n"
    "      --loop SECONDS     the bystander loop instead of the fault\n"
    "      --nranks N         loop: rank processes (default 2)\n"
    "      --max-wait S       loop: most seconds one iteration may take (default 5)\n"
    "      --host-buffers     dfcclMemAllocHost buffers and no CUDA: a thread plays the victim's\n"
    "                         kernel (checks this program against the host engine)\n"
    "      --seed S           seed of the data (default: time; printed)\n"
    "  -h, --help             this text\n"
    "\n"
    "Exit status: 0 the checks passed, 1 a failure, 2 usage, 77 no usable GPU.\n";

/* A page the parent and the rank processes share (mapped before the fork). */
struct shared {
	uint64_t heartbeat;      /* the victim's kernel counts here */
	uint32_t stop;           /* non-zero: the victim's kernel ends */
	int result;              /* the survivor's dfcclResult_t; -1 until it has one */
	int async;               /* dfcclCommGetAsyncError after it */
	double done_at;          /* tool_now() when the survivor's wait returned */
	int context_ok;          /* the survivor's probe: 1 ok, 0 poisoned, -1 not made, 2 no CUDA */
	char context_error[160];
	char last_error[320];    /* dfcclGetLastError with the survivor's result */
};

struct config {
	struct tool_devices gpus;
	int nranks;
	long iters;
	size_t count;
	uint64_t seed;
	double max_latency, loop_s, max_wait;
	unsigned expect;         /* a bit per dfcclResult_t the survivor may see */
	unsigned spin_blocks;
	bool host_buffers;
	int mem;                 /* enum membuf_kind of the buffers */
	dfcclUniqueId id;
	struct shared *sh;
	int ready_fd;            /* a rank writes a byte here when it is ready for the kill */
};

/* ---------------------------------------------------------------- results */

static const struct {
	const char *name;
	dfcclResult_t result;
} statuses[] = {
    {"success", dfcclSuccess}, {"peer-lost", dfcclRemoteError}, {"device-lost", dfcclDeviceLost},
    {"aborted", dfcclAborted}, {"timeout", dfcclTimeout},
};
#define NSTATUSES (sizeof(statuses) / sizeof(statuses[0]))

static const char *status_name(int r, char *buf, size_t len)
{
	for (size_t i = 0; i < NSTATUSES; i++)
		if ((int)statuses[i].result == r)
			return statuses[i].name;
	snprintf(buf, len, "error-%d", r);
	return buf;
}

/* A comma-separated list of status names into a bit per result. */
static bool parse_expect(const char *s, unsigned *bits)
{
	char copy[128], *save = NULL;
	snprintf(copy, sizeof(copy), "%s", s);
	*bits = 0;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		size_t i = 0;
		while (i < NSTATUSES && strcmp(statuses[i].name, t))
			i++;
		if (i == NSTATUSES || statuses[i].result == dfcclSuccess)
			return false;
		*bits |= 1u << statuses[i].result;
	}
	return *bits != 0;
}

/* ---------------------------------------------------------------- one rank */

struct rank_ctx {
	const struct config *cfg;
	int rank, gpu, nranks;
	dfcclComm_t comm;
	struct membuf_pair bufs;
};

static int rank_join(struct rank_ctx *x)
{
	const struct config *cfg = x->cfg;
	if (!MEM_OK(membuf_use_device(cfg->mem, x->gpu)) || !DFCCL_OK(dfcclSetDevice(x->gpu)) ||
	    !DFCCL_OK(dfcclCommInitRank(&x->comm, x->nranks, cfg->id, x->rank)))
		return -1;
	return MEM_OK(membuf_pair_open(&x->bufs, cfg->mem, cfg->count * sizeof(float))) ? 0 : -1;
}

static void rank_leave(struct rank_ctx *x, bool failed)
{
	if (x->comm)
		DFCCL_OK(failed ? dfcclCommAbort(x->comm) : dfcclCommDestroy(x->comm));
	membuf_pair_close(&x->bufs);
}

/* The all-reduce of iteration `it`, the same on every rank. */
static uint64_t allreduce_key(const struct config *cfg, long it)
{
	return tool_hash(cfg->seed, (uint64_t)it, 0xc1a5, 0);
}

/* Writes the reference data of all-reduce `it` and submits it. */
static int allreduce_start(struct rank_ctx *x, long it)
{
	const struct config *cfg = x->cfg;
	if (!MEM_OK(membuf_pair_stage(&x->bufs, TOOL_ALLREDUCE, x->bufs.send.ptr, x->bufs.recv.ptr, cfg->count,
	                              dfcclFloat32, dfcclSum, x->rank, x->nranks, allreduce_key(cfg, it))))
		return -1;
	return DFCCL_OK(tool_issue(TOOL_ALLREDUCE, x->bufs.send.ptr, x->bufs.recv.ptr, cfg->count, dfcclFloat32,
	                           dfcclSum, 0, x->comm))
	           ? 0
	           : -1;
}

/* Waits for all-reduce `it` and checks its result. */
static int allreduce_finish(struct rank_ctx *x, long it)
{
	const struct config *cfg = x->cfg;
	size_t wrong = 0, first = 0;
	double got = 0, want = 0;
	if (!DFCCL_OK(dfcclCommSynchronize(x->comm)) ||
	    !MEM_OK(membuf_pair_check(&x->bufs, TOOL_ALLREDUCE, x->bufs.recv.ptr, cfg->count, dfcclFloat32, dfcclSum,
	                              0, x->rank, x->nranks, allreduce_key(cfg, it), &wrong, &first, &got, &want)))
		return -1;
	if (wrong) {
		gputest_say("FAIL all-reduce %ld: %zu of %zu floats wrong, the first at index %zu: got %g, expected %g", it, wrong,
		    cfg->count, first, got, want);
		return -1;
	}
	return 0;
}

static void say_ready(const struct config *cfg)
{
	char c = 'r';
	if (write(cfg->ready_fd, &c, 1) != 1)
		gputest_say("cannot tell the parent: %s", strerror(errno));
}

/* ---------------------------------------------------------------- the fault's ranks */

/* --host-buffers: the victim's kernel, played by a thread. */
static void *heartbeat_thread(void *arg)
{
	struct shared *sh = arg;
	while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
		__atomic_add_fetch(&sh->heartbeat, 1, __ATOMIC_RELEASE);
		usleep(1000);
	}
	return NULL;
}

/* Starts what beats the heartbeat: the spinning kernel, or a thread. */
static int victim_spin(struct rank_ctx *x)
{
	struct shared *sh = x->cfg->sh;
	cudaStream_t stream;
	uint64_t *beat_dev;
	uint32_t *stop_dev;
	pthread_t t;
	if (x->cfg->host_buffers) {
		int e = pthread_create(&t, NULL, heartbeat_thread, sh);
		if (e)
			gputest_say("pthread_create: %s", strerror(e));
		return e ? -1 : 0;
	}
	/* Its own non-blocking stream: nothing of this process waits on it. */
	return CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) &&
	               CUDA_OK(cudaHostRegister(sh, (size_t)sysconf(_SC_PAGESIZE),
	                                        cudaHostRegisterMapped | cudaHostRegisterPortable)) &&
	               CUDA_OK(cudaHostGetDevicePointer((void **)&beat_dev, &sh->heartbeat, 0)) &&
	               CUDA_OK(cudaHostGetDevicePointer((void **)&stop_dev, &sh->stop, 0)) &&
	               CUDA_OK(spin_kernel_launch(beat_dev, stop_dev, SPIN_MAX_S, x->cfg->spin_blocks, stream))
	           ? 0
	           : -1;
}

static int victim_run(struct rank_ctx *x)
{
	struct shared *sh = x->cfg->sh;
	if (victim_spin(x) < 0)
		return -1;
	double t0 = tool_now();
	while (__atomic_load_n(&sh->heartbeat, __ATOMIC_ACQUIRE) == 0) {
		if (tool_now() - t0 > 30) {
			gputest_say("FAIL: the spinning kernel did not start within 30 s");
			return -1;
		}
		usleep(1000);
	}
	gputest_say("%s runs; waiting to be killed",
	            x->cfg->host_buffers ? "the thread that plays the spinning kernel" : "the spinning kernel");
	say_ready(x->cfg);
	for (;;)
		pause();
}

/* The survivor's CUDA context after the fault: 1 usable, 0 not (why in err). */
static int context_probe(struct rank_ctx *x, char *err, size_t len)
{
	void *p = NULL;
	float v;
	cudaError_t e = cudaDeviceSynchronize();
	if (e == cudaSuccess)
		e = cudaMemcpy(&v, x->bufs.recv.ptr, sizeof(v), cudaMemcpyDeviceToHost);
	if (e == cudaSuccess)
		e = cudaMalloc(&p, 1 << 20);
	if (e == cudaSuccess)
		e = cudaFree(p);
	if (e == cudaSuccess)
		return 1;
	snprintf(err, len, "%s", cudaGetErrorString(e));
	return 0;
}

static int survivor_run(struct rank_ctx *x)
{
	const struct config *cfg = x->cfg;
	struct shared *sh = cfg->sh;
	char name[24];
	if (allreduce_start(x, cfg->iters) < 0)
		return -1;
	say_ready(cfg);
	dfcclResult_t r = dfcclCommSynchronize(x->comm);
	double done = tool_now();
	snprintf(sh->last_error, sizeof(sh->last_error), "%s", dfcclGetLastError(NULL));
	dfcclResult_t async = dfcclSuccess;
	dfcclCommGetAsyncError(x->comm, &async);
	sh->async = async;
	sh->done_at = done;
	__atomic_store_n(&sh->result, (int)r, __ATOMIC_RELEASE);
	gputest_say("the all-reduce the victim never joined ended: %s (%s); the communicator's error: %s",
	    status_name(r, name, sizeof(name)), sh->last_error, dfcclGetErrorString(async));
	if (cfg->host_buffers) {
		sh->context_ok = 2;
		return 0;
	}
	sleep(PROBE_DELAY_S);
	sh->context_ok = context_probe(x, sh->context_error, sizeof(sh->context_error));
	return 0;
}

static int fault_rank(int rank, void *arg)
{
	const struct config *cfg = arg;
	struct rank_ctx x = {.cfg = cfg, .rank = rank, .nranks = 2, .gpu = tool_rank_device(&cfg->gpus, rank, 0)};
	int rc = -1;
	gputest_set_rank(rank);
	if (rank_join(&x) < 0)
		goto out;
	for (long it = 0; it < cfg->iters; it++)
		if (allreduce_start(&x, it) < 0 || allreduce_finish(&x, it) < 0)
			goto out;
	printf(PROG ": rank %d (GPU %d): %ld all-reduces checked before the fault\n", rank, x.gpu, cfg->iters);
	fflush(stdout);
	rc = rank == VICTIM ? victim_run(&x) : survivor_run(&x);
out:
	/* The survivor's communicator has failed by now: it aborts. */
	rank_leave(&x, true);
	return rc ? TOOL_EXIT_FAIL : 0;
}

/* ---------------------------------------------------------------- the fault's parent */

/* Says how a rank process ended. */
static void report_exit(int rank, int status)
{
	if (WIFSIGNALED(status))
		gputest_say("rank %d was killed by signal %d (%s)", rank, WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		gputest_say("rank %d exited with status %d", rank, WEXITSTATUS(status));
}

/* Waits until both ranks said they are ready; -1 when one ended first or
 * the time ran out. */
static int wait_ready(int fd, pid_t *pids)
{
	int ready = 0;
	double t0 = tool_now();
	while (ready < 2) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		char c;
		if (poll(&p, 1, 100) > 0 && read(fd, &c, 1) == 1) {
			ready++;
			continue;
		}
		for (int r = 0; r < 2; r++) {
			int st;
			if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
				pids[r] = 0;
				report_exit(r, st);
				gputest_say("FAIL: rank %d ended before the fault", r);
				return -1;
			}
		}
		if (tool_now() - t0 > READY_TIMEOUT_S) {
			gputest_say("FAIL: the ranks were not ready for the fault within %.0f s", READY_TIMEOUT_S);
			return -1;
		}
	}
	return 0;
}

/* The fault as the parent runs it. */
struct fault_run {
	pid_t pids[2];         /* 0 once reaped */
	double killed_at;      /* tool_now() at the kill */
	double victim_gone_at; /* when the victim was reaped; 0 before */
};

/* Reaps the victim if it has ended, noting when. */
static void victim_poll(struct fault_run *f)
{
	int st;
	if (f->pids[VICTIM] > 0 && waitpid(f->pids[VICTIM], &st, WNOHANG) == f->pids[VICTIM]) {
		f->pids[VICTIM] = 0;
		f->victim_gone_at = tool_now();
	}
}

/* Waits up to `seconds` for rank r to end, watching the victim meanwhile;
 * its wait status, or -1 if it did not end. */
static int wait_exit(struct fault_run *f, int r, double seconds)
{
	double t0 = tool_now();
	for (;;) {
		int st;
		victim_poll(f);
		if (f->pids[r] <= 0)
			return 0; /* the victim, reaped by victim_poll */
		pid_t p = waitpid(f->pids[r], &st, WNOHANG);
		if (p == f->pids[r] || (p < 0 && errno == ECHILD)) {
			f->pids[r] = 0;
			return p < 0 ? 0 : st;
		}
		if (tool_now() - t0 > seconds)
			return -1;
		usleep(1000);
	}
}

static bool heartbeat_moves(struct shared *sh, uint64_t *seen)
{
	uint64_t a = __atomic_load_n(&sh->heartbeat, __ATOMIC_ACQUIRE);
	usleep(HEARTBEAT_WATCH_US);
	*seen = __atomic_load_n(&sh->heartbeat, __ATOMIC_ACQUIRE);
	return *seen != a;
}

/* After the kill: the survivor's result, its timing, and how it ended. */
static int fault_outcome(const struct config *cfg, struct fault_run *f)
{
	struct shared *sh = cfg->sh;
	static const char *const contexts[] = {"unknown", "poisoned", "ok", "none"};
	char name[24];
	int failed = 0, st;
	double limit = cfg->max_latency + 10;
	while (__atomic_load_n(&sh->result, __ATOMIC_ACQUIRE) < 0 && tool_now() - f->killed_at < limit) {
		victim_poll(f);
		usleep(200);
	}
	int r = __atomic_load_n(&sh->result, __ATOMIC_ACQUIRE);
	if (r < 0) {
		gputest_say("FAIL: the survivor's all-reduce had not ended %.0f s after the kill", limit);
		printf("RESULT status=none latency_ms=-1 survivor_context=unknown\n");
		return -1;
	}
	double latency = sh->done_at - f->killed_at;
	if ((st = wait_exit(f, SURVIVOR, PROBE_DELAY_S + 60)) < 0) {
		gputest_say("FAIL: the survivor did not end within %d s of its result (its CUDA probe hangs?)",
		            PROBE_DELAY_S + 60);
		failed = 1;
	} else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		report_exit(SURVIVOR, st);
		failed = 1;
	}
	const char *ctx = contexts[sh->context_ok + 1];
	printf("survivor: %s after %.1f ms (%s); its CUDA context afterwards: %s%s%s\n",
	       status_name(r, name, sizeof(name)), latency * 1e3, sh->last_error, ctx, sh->context_ok == 0 ? ": " : "",
	       sh->context_ok == 0 ? sh->context_error : "");
	printf("RESULT status=%s latency_ms=%.1f survivor_context=%s\n", status_name(r, name, sizeof(name)),
	       latency * 1e3, ctx);
	fflush(stdout);
	if (!(cfg->expect & (1u << r))) {
		gputest_say("FAIL: the survivor's all-reduce ended with %s, which --expect does not allow",
		            status_name(r, name, sizeof(name)));
		failed = 1;
	}
	if (latency > cfg->max_latency) {
		gputest_say("FAIL: the survivor learned of the fault %.3f s after the kill (at most %.3f s allowed)",
		            latency, cfg->max_latency);
		failed = 1;
	}
	if (r != dfcclSuccess && sh->async == dfcclSuccess) {
		gputest_say("FAIL: dfcclCommGetAsyncError reports no error after a failed all-reduce");
		failed = 1;
	}
	return failed ? -1 : 0;
}

static int fault_main(struct config *cfg)
{
	struct shared *sh = cfg->sh;
	struct fault_run f = {{0, 0}, 0, 0};
	int pfd[2], rc = -1;
	uint64_t beat;
	sh->result = -1;
	sh->context_ok = -1;
	if (pipe(pfd) < 0) {
		gputest_say("pipe: %s", strerror(errno));
		return TOOL_EXIT_FAIL;
	}
	cfg->ready_fd = pfd[1];
	fflush(NULL);
	for (int r = 0; r < 2; r++) {
		f.pids[r] = fork();
		if (f.pids[r] == 0) {
			close(pfd[0]);
			int code = fault_rank(r, cfg);
			fflush(NULL);
			_exit(code);
		}
		if (f.pids[r] < 0) {
			gputest_say("cannot start rank %d: %s", r, strerror(errno));
			goto out;
		}
	}
	close(pfd[1]);
	pfd[1] = -1;
	if (wait_ready(pfd[0], f.pids) < 0)
		goto out;
	if (!heartbeat_moves(sh, &beat)) {
		gputest_say("FAIL: the victim's kernel is not running (its heartbeat stays at %" PRIu64 ")", beat);
		goto out;
	}
	f.killed_at = tool_now();
	kill(f.pids[VICTIM], SIGKILL);
	printf(PROG ": killed rank %d (pid %d) while its kernel ran (heartbeat %" PRIu64 " and moving) and rank %d "
	       "waited in an all-reduce with it\n", VICTIM, (int)f.pids[VICTIM], beat, SURVIVOR);
	fflush(stdout);
	rc = fault_outcome(cfg, &f);
	if (wait_exit(&f, VICTIM, 60) < 0) {
		gputest_say("FAIL: the victim had not ended 60 s after SIGKILL");
		rc = -1;
	} else {
		printf(PROG ": the victim was gone %.1f ms after the kill\n", (f.victim_gone_at - f.killed_at) * 1e3);
	}
out:
	/* Whatever went wrong, nothing of ours stays behind. */
	__atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
	for (int r = 0; r < 2; r++)
		if (f.pids[r] > 0) {
			kill(f.pids[r], SIGKILL);
			wait_exit(&f, r, 30);
		}
	close(pfd[0]);
	if (pfd[1] >= 0)
		close(pfd[1]);
	return rc ? TOOL_EXIT_FAIL : 0;
}

/* ---------------------------------------------------------------- the loop */

/* Rank 0's vote to stop, summed over the ranks, so that every rank ends
 * after the same iteration. */
static int loop_vote(struct rank_ctx *x, int64_t *cell, int64_t mine, int64_t *sum)
{
	*cell = mine;
	if (!DFCCL_OK(dfcclAllReduce(cell, cell, 1, dfcclInt64, dfcclSum, x->comm, NULL)) ||
	    !DFCCL_OK(dfcclCommSynchronize(x->comm)))
		return -1;
	*sum = *cell;
	return 0;
}

static int loop_rank(int rank, void *arg)
{
	const struct config *cfg = arg;
	struct rank_ctx x = {.cfg = cfg, .rank = rank, .nranks = cfg->nranks, .gpu = tool_rank_device(&cfg->gpus, rank, 0)};
	int64_t *cell = NULL, stop = 0;
	double start = 0, longest = 0;
	long it = 0;
	int rc = -1;
	gputest_set_rank(rank);
	if (rank_join(&x) < 0 || !DFCCL_OK(dfcclMemAllocHost((void **)&cell, sizeof(*cell))))
		goto out;
	start = tool_now();
	for (; !stop; it++) {
		double t0 = tool_now();
		if (allreduce_start(&x, it) < 0 || allreduce_finish(&x, it) < 0 ||
		    loop_vote(&x, cell, rank == 0 && t0 - start >= cfg->loop_s, &stop) < 0)
			goto out;
		double took = tool_now() - t0;
		longest = took > longest ? took : longest;
		if (it == 0 && rank == 0) {
			printf(PROG ": looping\n");
			fflush(stdout);
		}
	}
	rc = 0;
	if (longest > cfg->max_wait) {
		gputest_say("FAIL: an iteration took %.3f s (at most %.3f s allowed)", longest, cfg->max_wait);
		rc = -1;
	}
out:
	printf(PROG ": rank %d (GPU %d): %ld all-reduces checked in %.1f s, the longest iteration %.1f ms%s\n", rank,
	       x.gpu, it, start ? tool_now() - start : 0.0, longest * 1e3, rc ? ", FAILED" : "");
	dfcclMemFree(cell);
	rank_leave(&x, rc != 0);
	return rc ? TOOL_EXIT_FAIL : 0;
}

/* ---------------------------------------------------------------- options */

static bool parse_seconds(const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi))
		return false;
	*out = v;
	return true;
}

/* Parses argv into cfg; returns -1 to go on, else the exit status. */
static int parse_options(int argc, char **argv, struct config *cfg)
{
	static const struct option opts[] = {
	    {"socket", required_argument, NULL, 'S'},      {"gpus", required_argument, NULL, 'g'},
	    {"iters", required_argument, NULL, 'i'},       {"count", required_argument, NULL, 'c'},
	    {"expect", required_argument, NULL, 'e'},      {"max-latency", required_argument, NULL, 'l'},
	    {"spin-blocks", required_argument, NULL, 'b'}, {"loop", required_argument, NULL, 'L'},
	    {"nranks", required_argument, NULL, 'n'},      {"max-wait", required_argument, NULL, 'w'},
	    {"seed", required_argument, NULL, 's'},        {"help", no_argument, NULL, 'h'},
	    {"host-buffers", no_argument, NULL, 'H'},      {NULL, 0, NULL, 0},
	};
	long v;
	int opt;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'S': setenv("DFCCL_SOCKET", optarg, 1); break;
		case 'g':
			if (!tool_parse_devices(optarg, &cfg->gpus))
				return gputest_usage_error("--gpus takes comma-separated GPU indices, not", optarg);
			break;
		case 'i':
			if (!tool_parse_long(optarg, 0, 1000000, &cfg->iters))
				return gputest_usage_error("--iters takes a count, not", optarg);
			break;
		case 'c':
			if (!tool_parse_long(optarg, 1, 1L << 28, &v))
				return gputest_usage_error("--count takes 1 to 268435456, not", optarg);
			cfg->count = (size_t)v;
			break;
		case 'e':
			if (!parse_expect(optarg, &cfg->expect))
				return gputest_usage_error("--expect takes peer-lost, device-lost, aborted, timeout, comma-separated, not",
				                   optarg);
			break;
		case 'l':
			if (!parse_seconds(optarg, 0.001, 600, &cfg->max_latency))
				return gputest_usage_error("--max-latency takes seconds, not", optarg);
			break;
		case 'b':
			if (!tool_parse_long(optarg, 1, 1024, &v))
				return gputest_usage_error("--spin-blocks takes 1 to 1024, not", optarg);
			cfg->spin_blocks = (unsigned)v;
			break;
		case 'L':
			if (!parse_seconds(optarg, 0.001, 86400, &cfg->loop_s))
				return gputest_usage_error("--loop takes seconds, not", optarg);
			break;
		case 'n':
			if (!tool_parse_long(optarg, 1, TOOL_MAX_DEVICES, &v))
				return gputest_usage_error("--nranks takes 1 to 64, not", optarg);
			cfg->nranks = (int)v;
			break;
		case 'w':
			if (!parse_seconds(optarg, 0.001, 86400, &cfg->max_wait))
				return gputest_usage_error("--max-wait takes seconds, not", optarg);
			break;
		case 's':
			if (!tool_parse_size(optarg, &cfg->seed))
				return gputest_usage_error("--seed takes a number, not", optarg);
			break;
		case 'H': cfg->host_buffers = true; break;
		case 'h': fputs(usage, stdout); return 0;
		default: return gputest_usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return gputest_usage_error("unexpected argument", argv[optind]);
	return -1;
}

int main(int argc, char **argv)
{
	gputest_init(PROG);
	static struct config cfg = {.gpus = {2, {0, 0}}, .nranks = 2, .iters = 20, .count = 262144, .max_latency = 1,
	                            .max_wait = 5, .spin_blocks = 4,
	                            .expect = 1u << dfcclRemoteError | 1u << dfcclDeviceLost};
	cfg.seed = (uint64_t)time(NULL);
	int rc = parse_options(argc, argv, &cfg);
	if (rc >= 0)
		return rc;
	cfg.mem = cfg.host_buffers ? MEMBUF_HOST : MEMBUF_DEVICE;
	if (!cfg.host_buffers && (rc = gputest_need_gpus(&cfg.gpus)) != 0)
		return rc;
	cfg.sh = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (cfg.sh == MAP_FAILED || !DFCCL_OK(dfcclGetUniqueId(&cfg.id))) {
		gputest_say("cannot set up: %s", cfg.sh == MAP_FAILED ? strerror(errno) : "no unique id");
		return TOOL_EXIT_FAIL;
	}
	if (cfg.loop_s > 0) {
		printf(PROG ": %d ranks on GPU(s)", cfg.nranks);
		for (int r = 0; r < cfg.nranks; r++)
			printf("%s%d", r ? "," : " ", tool_rank_device(&cfg.gpus, r, 0));
		printf(", checked all-reduces of %zu floats for %.1f s, seed %" PRIu64 "\n", cfg.count, cfg.loop_s, cfg.seed);
		int failed = tool_run_ranks(PROG, cfg.nranks, loop_rank, &cfg, 30);
		printf("%s\n", failed ? "FAILED" : "OK: every all-reduce was correct and none took too long");
		return failed ? TOOL_EXIT_FAIL : 0;
	}
	printf(PROG ": survivor (rank 0) on GPU %d, victim (rank 1) on GPU %d, %ld checked all-reduces of %zu floats "
	       "first, seed %" PRIu64 "\n",
	       tool_rank_device(&cfg.gpus, SURVIVOR, 0), tool_rank_device(&cfg.gpus, VICTIM, 0), cfg.iters, cfg.count,
	       cfg.seed);
	rc = fault_main(&cfg);
	printf("%s\n", rc ? "FAILED" : "OK: the survivor got an expected error in time");
	return rc;
}
