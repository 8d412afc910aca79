/*
 * test_cuda_stream_death: a GPU stream waiting on a stream-ordered
 * collective when the daemon's worker for its GPU dies must go on.
 *
 * The parent forks two rank processes on --gpus (CUDA starts in them, after
 * the fork), which join one communicator of the dfccld at --socket. Rank 0
 * issues one all-reduce on a stream of its own, which rank 1 never joins:
 * the stream must still be waiting 200 ms later (it waits for the
 * collective, not for a word that was never cleared). Rank 0 then says so
 * and synchronizes the stream; rank 1 SIGKILLs --kill-pid, the worker of
 * rank 0's GPU as `dfcclctl status` names it, and notes the time. The
 * supervisor fails the collective in the queue's completion words; the
 * worker that replaces the dead one stores the failure into the device
 * completion word the stream waits on (gpu/cuda/cuda_engine.cu,
 * ce_release_words), or, where none has within 3 s, the library copies it
 * there (client/lib/qp.h, qp_stream_words): so a latency under 3 s says
 * the replacement did. The stream goes on and dfcclCommGetAsyncError
 * reports the failure. With --wait host the stream
 * waits on the queue's completion words in host memory instead, which the
 * supervisor itself fails. The check: the stream went on within
 * --max-latency seconds of the kill, with an asynchronous error that is
 * not success. Prints a line for scripts:
 *   RESULT latency_ms=31.4 async=device-lost
 *
 * Exit status: 0 the checks passed, 1 a failure, 2 usage, 77 no usable GPU.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "dfccl.h"
#include "gputest.h"

#define PROG "test_cuda_stream_death"
#define COUNT 4096 /* floats */

static const char usage[] =
    "Usage: " PROG " --kill-pid PID [OPTIONS]\n"
    "A stream-ordered all-reduce that its peer never joins is pending on rank 0's\n"
    "GPU when PID (the daemon's worker for that GPU) is SIGKILLed: rank 0's stream\n"
    "must go on within the latency bound, and dfcclCommGetAsyncError must report it.\n"
    "\n"
    "      --kill-pid PID     the worker to kill (dfcclctl --json status: worker_pid)\n"
    "      --socket PATH      the daemon's socket (default $DFCCL_SOCKET)\n"
    "      --gpus LIST        the GPUs of ranks 0 and 1 (default 0,0)\n"
    "      --max-latency S    the bound on the stream's wait after the kill (default 5)\n"
    "      --wait WHERE       device (default): the stream waits on device completion words\n"
    "                         (DFCCL_STREAM_WAIT=device); host: on the queue's words\n"
    "  -h, --help             this text\n";

/* Written by the ranks, read by the other: one page shared across the fork. */
struct shared {
	volatile int pending;   /* rank 0: its collective is pending, and it waits on the stream */
	volatile int done;      /* rank 0: the stream went on */
	volatile double killed; /* rank 1: when it sent SIGKILL (tool_now) */
	volatile double resumed; /* rank 0: when the stream went on */
	volatile int async;     /* rank 0: dfcclCommGetAsyncError's answer */
};

struct config {
	struct tool_devices gpus;
	pid_t kill_pid;
	double max_latency;
	dfcclUniqueId id;
	struct shared *sh;
};

static int rank_main(int rank, void *arg)
{
	struct config *cfg = arg;
	struct shared *sh = cfg->sh;
	gputest_set_rank(rank);
	int gpu = tool_rank_device(&cfg->gpus, rank, 0);
	dfcclComm_t comm = NULL;
	float *buf = NULL;
	cudaStream_t stream = NULL;
	if (!CUDA_OK(cudaSetDevice(gpu)) || !DFCCL_OK(dfcclSetDevice(gpu)) ||
	    !CUDA_OK(cudaMalloc((void **)&buf, COUNT * sizeof(float))) ||
	    !CUDA_OK(cudaMemset(buf, 0, COUNT * sizeof(float))) ||
	    !DFCCL_OK(dfcclCommInitRank(&comm, 2, cfg->id, rank)))
		return 1;
	int rc = 1;
	if (rank == 1) {
		/* The peer that never joins: it kills the worker once rank 0
		 * waits, and waits for rank 0's stream, bounded. */
		double deadline = tool_now() + 60;
		while (!sh->pending && tool_now() < deadline)
			usleep(1000);
		if (!sh->pending) {
			gputest_say("rank 0 never said its collective was pending");
			goto out;
		}
		usleep(100000); /* into its synchronization */
		sh->killed = tool_now();
		if (kill(cfg->kill_pid, SIGKILL) != 0) {
			gputest_say("cannot SIGKILL the worker %d: %s", (int)cfg->kill_pid, strerror(errno));
			goto out;
		}
		deadline = tool_now() + cfg->max_latency + 30;
		while (!sh->done && tool_now() < deadline)
			usleep(1000);
		if (!sh->done) {
			gputest_say("rank 0's stream was still waiting %.0f s after the kill",
			            cfg->max_latency + 30);
			goto out;
		}
		rc = 0;
	} else {
		if (!CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) ||
		    !DFCCL_OK(dfcclAllReduce(buf, buf, COUNT, dfcclFloat, dfcclSum, comm, stream)))
			goto out;
		usleep(200000);
		cudaError_t q = cudaStreamQuery(stream);
		if (q != cudaErrorNotReady) {
			gputest_say("the stream went on before its collective could complete (%s)", cudaGetErrorString(q));
			goto out;
		}
		sh->pending = 1;
		cudaError_t s = cudaStreamSynchronize(stream);
		sh->resumed = tool_now();
		dfcclResult_t async = dfcclSuccess;
		dfcclResult_t g = dfcclCommGetAsyncError(comm, &async);
		sh->async = g == dfcclSuccess ? (int)async : -1;
		sh->done = 1;
		if (s != cudaSuccess) {
			gputest_say("cudaStreamSynchronize: %s", cudaGetErrorString(s));
			goto out;
		}
		rc = 0;
	}
out:
	if (comm)
		dfcclCommAbort(comm);
	if (stream)
		cudaStreamDestroy(stream);
	cudaFree(buf);
	return rc;
}

static int parse_options(int argc, char **argv, struct config *cfg)
{
	static const struct option longopts[] = {
	    {"kill-pid", required_argument, NULL, 'k'}, {"socket", required_argument, NULL, 'S'},
	    {"gpus", required_argument, NULL, 'g'},     {"max-latency", required_argument, NULL, 'L'},
	    {"wait", required_argument, NULL, 'w'},     {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c;
	long v;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'k':
			if (!tool_parse_long(optarg, 1, 4194304, &v))
				return gputest_usage_error("bad --kill-pid", optarg);
			cfg->kill_pid = (pid_t)v;
			break;
		case 'S':
			setenv("DFCCL_SOCKET", optarg, 1);
			break;
		case 'g':
			if (!tool_parse_devices(optarg, &cfg->gpus) || cfg->gpus.n != 2)
				return gputest_usage_error("--gpus takes two GPUs", optarg);
			break;
		case 'L': {
			char *end;
			cfg->max_latency = strtod(optarg, &end);
			if (*optarg == '\0' || *end || !(cfg->max_latency > 0))
				return gputest_usage_error("bad --max-latency", optarg);
			break;
		}
		case 'w':
			if (strcmp(optarg, "device") && strcmp(optarg, "host"))
				return gputest_usage_error("--wait takes device or host", optarg);
			setenv("DFCCL_STREAM_WAIT", optarg, 1);
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fprintf(stderr, "%s", usage);
			return TOOL_EXIT_USAGE;
		}
	}
	if (optind < argc)
		return gputest_usage_error("unexpected argument", argv[optind]);
	if (cfg->kill_pid == 0)
		return gputest_usage_error("--kill-pid is required", "");
	return -1;
}

int main(int argc, char **argv)
{
	gputest_init(PROG);
	static struct config cfg = {.gpus = {2, {0, 0}}, .max_latency = 5};
	setenv("DFCCL_STREAM_WAIT", "device", 1); /* --wait may say otherwise */
	int rc = parse_options(argc, argv, &cfg);
	if (rc >= 0)
		return rc;
	if ((rc = gputest_need_gpus(&cfg.gpus)) != 0)
		return rc;
	cfg.sh = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (cfg.sh == MAP_FAILED || !DFCCL_OK(dfcclGetUniqueId(&cfg.id))) {
		gputest_say("cannot set up: %s", cfg.sh == MAP_FAILED ? strerror(errno) : "no unique id");
		return TOOL_EXIT_FAIL;
	}
	printf(PROG ": rank 0 on GPU %d waits on its stream (%s completion words) for an all-reduce that rank 1 "
	       "(GPU %d) never joins; worker %d is killed\n",
	       tool_rank_device(&cfg.gpus, 0, 0), getenv("DFCCL_STREAM_WAIT"), tool_rank_device(&cfg.gpus, 1, 0),
	       (int)cfg.kill_pid);
	int failed = tool_run_ranks(PROG, 2, rank_main, &cfg, 30);
	const struct shared *sh = cfg.sh;
	if (failed || !sh->done) {
		printf("FAILED\n");
		return TOOL_EXIT_FAIL;
	}
	double latency = sh->resumed - sh->killed;
	printf("RESULT latency_ms=%.1f async=%s\n", latency * 1e3,
	       sh->async == dfcclDeviceLost ? "device-lost" : sh->async == dfcclSuccess ? "success" : "other");
	if (sh->async == dfcclSuccess || sh->async < 0) {
		printf("FAILED: dfcclCommGetAsyncError reported no failure after the worker died\n");
		return TOOL_EXIT_FAIL;
	}
	if (latency > cfg.max_latency) {
		printf("FAILED: the stream went on %.2f s after the kill (at most %.1f)\n", latency, cfg.max_latency);
		return TOOL_EXIT_FAIL;
	}
	printf("OK: the stream went on %.1f ms after the worker died, with the failure reported\n", latency * 1e3);
	return 0;
}
