/*
 * The fault suite: faults injected into running jobs, many times over, on
 * a real dfccld, with figures: the host engine with 2 devices, or with
 * --engine cuda every GPU of the machine (the ranks spread over them, or
 * sharing the one). The ranks' buffers are host memory on either engine.
 *
 * Kill trials: N rank processes join C communicators and run batches of
 * checked all-reduces, each rank submitting its batch over the
 * communicators in an order of its own. At a random moment the suite
 * SIGKILLs a random rank. Every survivor must see an error (the time from
 * the kill to its first error is recorded), shrink every communicator with
 * DFCCL_SHRINK_ABORT and run more checked all-reduces on the shrunk ones.
 * After each trial the daemon must hold no session and no communicator,
 * and every deleted communicator's workers must have released it,
 * and no worker may have died -- except on the CUDA engine under MPS, where
 * a SIGKILLed client poisons every CUDA context on its GPU and the
 * supervisor restarts that GPU's worker (DESIGN.md, "Processes"): there
 * restarts are counted and reported, survivors whose device was lost
 * (dfcclDeviceLost) leave their communicators instead of going on, and the
 * trial after a restart must work as any other.
 *
 * Stop trials: the same traffic on communicators with a collective
 * timeout of T ms (--stop-timeout-ms), and a random rank SIGSTOPped
 * instead (never killed while the survivors run). Every survivor must get
 * dfcclTimeout naming the stopped rank, by its pid, as stopped, within
 * T + L ms of the stop (L: --latency-ms), and then shrink and go on as
 * after a kill. The stopped rank is then continued (it must find its
 * communicators failed and leave them) or killed, at random.
 *
 * Restart trials: ranks in the middle of their batches when dfccld itself
 * is SIGKILLed must get an error promptly (dfcclDaemonUnavailable), wait
 * for the daemon to come back (the suite restarts it on the same socket),
 * and make new communicators in the same processes that work.
 *
 * Any hang (a rank still running 20 s after the fault), wrong result,
 * missing error, leftover or worker death fails the suite; it prints the
 * distribution of the error latencies and dfccld's resident memory before
 * and after. Usage: fault_suite [--trials N] [--stop-trials N]
 * [--restart-trials N] [--ranks N] [--comms N] [--seed S] [--latency-ms L]
 * [--stop-timeout-ms T] [--engine host|cuda] [--dfccld PATH] (errors later
 * than L ms after a kill, or T + L ms after a stop, fail the suite;
 * defaults 1000 and 1000; PATH: the dfccld to start, by default this
 * build's).
 */
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dfccl.h"
#include "harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define MAX_RANKS 8
#define MAX_COMMS 4
#define MAX_COUNT 4096   /* elements (int64) of one all-reduce, at most */
#define HANG_MS 20000    /* a rank still running this long after the fault hangs */
#define RUN_MS 10000     /* a rank gives up (and fails) when no fault came this long */
#define STALE_MS "500"   /* the daemon's heartbeat-stale-ms: below any stop trial's timeout */
#define BACK_MS 30000    /* how long the daemon's workers may take to be up again (a CUDA context, MPS) */

enum fault { FAULT_KILL, FAULT_DAEMON, FAULT_STOP };

/* Shared between the suite and its ranks (an anonymous shared mapping). */
struct shared {
	dfcclUniqueId ids[MAX_COMMS];   /* the trial's communicators */
	dfcclUniqueId after[MAX_COMMS]; /* restart trials: the communicators made afterwards */
	int nranks, ncomms, ndev;
	int mps;                        /* the CUDA engine under MPS: a kill may cost a worker restart */
	int timeout_ms;                 /* collective timeout of the trial's communicators (0: the daemon's) */
	enum fault fault;               /* the trial's */
	uint64_t seed;
	_Atomic int running;            /* ranks in their batch loop */
	_Atomic uint64_t fault_ns;      /* when the suite injected the fault (0: not yet) */
	_Atomic int victim;             /* kill and stop trials: the rank killed or stopped */
	_Atomic int victim_pid;
	_Atomic int errored;            /* stop trials: survivors that got their error */
	_Atomic int back;               /* restart trials: the daemon and every worker are up again */
	int lost[MAX_RANKS];            /* under MPS: survivors that lost their device instead of going on */
	uint64_t err_ns[MAX_RANKS];     /* each rank's first error */
	int err_code[MAX_RANKS];
	char msg[MAX_RANKS][240];       /* why a rank failed */
};

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* What old rank q contributes to element i of batch it on communicator k. */
static int64_t contrib(int q, uint64_t it, int k, size_t i)
{
	return (int64_t)(mix(((uint64_t)q << 40) ^ (it << 8) ^ (uint64_t)k ^ ((uint64_t)i << 20)) >> 40);
}

/* Fails rank `rank` with a sentence: a later failure of the rank in the
 * same trial is appended to its first, which is mostly the cause. */
#define RFAIL(...)                                                                            \
	do {                                                                                  \
		size_t used_ = strlen(sh->msg[rank]);                                         \
		if (used_ && used_ + 8 < sizeof(sh->msg[rank]))                               \
			used_ += (size_t)snprintf(sh->msg[rank] + used_, 8, "; then ");       \
		if (used_ < sizeof(sh->msg[rank]))                                            \
			snprintf(sh->msg[rank] + used_, sizeof(sh->msg[rank]) - used_, __VA_ARGS__); \
		return 1;                                                                     \
	} while (0)

/* One rank's communicators and buffers: n ranks, olds[r] the original rank
 * of rank r (what it contributes), me this process's rank. */
struct rank_job {
	dfcclComm_t comm[MAX_COMMS];
	int64_t *buf[MAX_COMMS]; /* send [MAX_COUNT], then receive [MAX_COUNT] */
	int olds[MAX_RANKS];
	int n, me;
};

static dfcclResult_t job_alloc(struct rank_job *j, int ncomms)
{
	for (int k = 0; k < ncomms; k++) {
		dfcclResult_t r = dfcclMemAllocHost((void **)&j->buf[k], 2 * MAX_COUNT * sizeof(int64_t));
		if (r != dfcclSuccess)
			return r;
	}
	return dfcclSuccess;
}

/*
 * Batches of all-reduces until one fails (returns its result) or `batches`
 * are done (dfcclSuccess; a negative count runs until a failure or
 * RUN_MS). Wrong results set *bad.
 */
static dfcclResult_t run_batches(struct shared *sh, struct rank_job *j, int rank, uint64_t *it, long batches,
                                 uint64_t rng, int *bad)
{
	uint64_t t0 = now_ms();
	for (long b = 0; batches < 0 ? now_ms() - t0 < RUN_MS : b < batches; b++, (*it)++) {
		int order[MAX_COMMS];
		for (int k = 0; k < sh->ncomms; k++)
			order[k] = k;
		for (int k = sh->ncomms - 1; k > 0; k--) { /* this rank's own order */
			rng = mix(rng);
			int x = (int)(rng % (uint64_t)(k + 1)), t = order[k];
			order[k] = order[x];
			order[x] = t;
		}
		size_t count[MAX_COMMS];
		for (int o = 0; o < sh->ncomms; o++) {
			int k = order[o];
			count[k] = 1 + mix(sh->seed ^ (*it << 4) ^ (uint64_t)k) % MAX_COUNT;
			for (size_t i = 0; i < count[k]; i++)
				j->buf[k][i] = contrib(j->olds[j->me], *it, k, i);
			dfcclResult_t r = dfcclAllReduce(j->buf[k], j->buf[k] + MAX_COUNT, count[k], dfcclInt64, dfcclSum,
			                                 j->comm[k], NULL);
			if (r != dfcclSuccess)
				return r;
		}
		for (int k = 0; k < sh->ncomms; k++) {
			dfcclResult_t r = dfcclCommSynchronize(j->comm[k]);
			if (r != dfcclSuccess)
				return r;
		}
		for (int k = 0; k < sh->ncomms; k++)
			for (size_t i = 0; i < count[k]; i++) {
				int64_t want = 0;
				for (int q = 0; q < j->n; q++)
					want += contrib(j->olds[q], *it, k, i);
				if (j->buf[k][MAX_COUNT + i] != want && !*bad) {
					*bad = 1;
					snprintf(sh->msg[rank], sizeof(sh->msg[rank]),
					         "batch %llu communicator %d element %zu: %lld, expected %lld",
					         (unsigned long long)*it, k, i, (long long)j->buf[k][MAX_COUNT + i], (long long)want);
				}
			}
		if (*bad)
			return dfcclInternalError;
	}
	return dfcclSuccess;
}

/* Joins the ncomms communicators of ids as rank `rank` of n. */
static dfcclResult_t job_init(struct shared *sh, struct rank_job *j, const dfcclUniqueId *ids, int rank)
{
	j->n = sh->nranks;
	j->me = rank;
	for (int q = 0; q < j->n; q++)
		j->olds[q] = q;
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	if (sh->timeout_ms)
		cfg.timeoutMs = sh->timeout_ms;
	for (int k = 0; k < sh->ncomms; k++) {
		dfcclResult_t r = dfcclCommInitRankConfig(&j->comm[k], sh->nranks, ids[k], rank, &cfg);
		if (r != dfcclSuccess)
			return r;
	}
	return dfcclSuccess;
}

static void note_error(struct shared *sh, int rank, dfcclResult_t r)
{
	if (!sh->err_ns[rank]) {
		sh->err_ns[rank] = mono_ns();
		sh->err_code[rank] = (int)r;
	}
}

/*
 * Sets rank `rank` up (device, communicators, buffers), runs its batches
 * until one fails and records when: 0 with *r that failure, or 1 when the
 * rank fails (a wrong result, no error, or an error before any fault).
 */
static int run_until_fault(struct shared *sh, struct rank_job *j, int rank, uint64_t *it, dfcclResult_t *r)
{
	memset(j, 0, sizeof(*j));
	if (dfcclSetDevice(rank % sh->ndev) != dfcclSuccess || job_init(sh, j, sh->ids, rank) != dfcclSuccess ||
	    job_alloc(j, sh->ncomms) != dfcclSuccess)
		RFAIL("set-up: %s", dfcclGetLastError(NULL));
	atomic_fetch_add(&sh->running, 1);
	*it = 0;
	int bad = 0;
	*r = run_batches(sh, j, rank, it, -1, mix(sh->seed ^ (uint64_t)rank), &bad);
	if (bad)
		return 1;
	if (*r == dfcclSuccess)
		RFAIL("no error within %d ms of running", RUN_MS);
	note_error(sh, rank, *r);
	if (!atomic_load(&sh->fault_ns))
		RFAIL("error %d before any fault: %s", *r, dfcclGetLastError(NULL));
	return 0;
}

/*
 * Under MPS the kill may have poisoned the GPU of this rank: its worker is
 * restarted, and this process's queue pair to it stays dead. Such a rank
 * (r is dfcclDeviceLost) leaves every communicator it has and ends, noted
 * in sh->lost (the suite then requires a worker restart in the trial);
 * returns 1 where it did. Anywhere else a lost device is a failure.
 */
static int lost_device(struct shared *sh, struct rank_job *j, struct rank_job *small, int rank, dfcclResult_t r)
{
	if (r != dfcclDeviceLost || !sh->mps)
		return 0;
	sh->lost[rank] = 1;
	for (int k = 0; k < sh->ncomms; k++) {
		if (small && small->comm[k])
			dfcclCommAbort(small->comm[k]);
		dfcclCommAbort(j->comm[k]);
	}
	return 1;
}

/* A survivor drops the victim from every communicator of j and goes on. */
static int shrink_and_go_on(struct shared *sh, struct rank_job *j, int rank, dfcclResult_t first)
{
	uint64_t it;
	int bad = 0;
	int victim = atomic_load(&sh->victim);
	struct rank_job small = *j;
	if (lost_device(sh, j, NULL, rank, first))
		return 0;
	small.n = 0;
	memset(small.comm, 0, sizeof(small.comm));
	for (int q = 0; q < j->n; q++)
		if (q != victim) {
			if (q == rank)
				small.me = small.n;
			small.olds[small.n++] = q;
		}
	for (int k = 0; k < sh->ncomms; k++) {
		dfcclResult_t r = dfcclCommShrink(j->comm[k], &victim, 1, &small.comm[k], NULL, DFCCL_SHRINK_ABORT);
		if (r != dfcclSuccess && lost_device(sh, j, &small, rank, r))
			return 0;
		if (r != dfcclSuccess)
			RFAIL("shrink of communicator %d without rank %d: %s", k, victim, dfcclGetLastError(NULL));
	}
	/* Survivors may have stopped in different batches (one saw its last
	 * batch complete, another the failure of that batch's last collective
	 * while it waited for every rank to finish): they agree afresh. */
	it = 1u << 20;
	dfcclResult_t r = run_batches(sh, &small, rank, &it, 20, mix(sh->seed ^ (uint64_t)rank ^ 0x5a5a), &bad);
	if (r != dfcclSuccess && !bad && lost_device(sh, j, &small, rank, r))
		return 0;
	if (r != dfcclSuccess)
		RFAIL("after the shrink: %d: %s", r, dfcclGetLastError(NULL));
	for (int k = 0; k < sh->ncomms; k++) {
		dfcclCommDestroy(small.comm[k]);
		dfcclCommAbort(j->comm[k]);
	}
	return 0;
}

/* A survivor of a stop trial got r: it must be the timeout naming the
 * stopped rank as stopped, and every survivor must have its timeout before
 * any shrinks (a shrink revokes the communicators, which would turn a
 * survivor's timeout still to come into dfcclAborted). Returns 0 or 1. */
static int stop_timed_out(struct shared *sh, int rank, dfcclResult_t r)
{
	int victim = atomic_load(&sh->victim);
	char name[96];
	/* The daemon's device number: on the CUDA engine the ranks' CUDA
	 * ordinals, which name the daemon's devices in the same order (the
	 * daemon runs in the suite's environment, on every GPU it sees). */
	snprintf(name, sizeof(name), "%d (pid %d, device %d, stopped or hung: no heartbeat for ", victim,
	         atomic_load(&sh->victim_pid), victim % sh->ndev);
	if (r != dfcclTimeout || !strstr(dfcclGetLastError(NULL), name))
		RFAIL("the stop gave %d, not dfcclTimeout naming rank %d as stopped: '%.160s'", r, victim,
		      dfcclGetLastError(NULL));
	atomic_fetch_add(&sh->errored, 1);
	for (uint64_t t0 = now_ms(); atomic_load(&sh->errored) < sh->nranks - 1; usleep(1000))
		if (now_ms() - t0 > HANG_MS / 2)
			RFAIL("only %d of %d survivors got their timeout", atomic_load(&sh->errored), sh->nranks - 1);
	return 0;
}

/* A rank of a kill or a stop trial. A survivor shrinks and goes on; the
 * stopped rank of a stop trial, if it is continued, leaves its failed
 * communicators. */
static int fault_rank(void *arg, int rank)
{
	struct shared *sh = arg;
	struct rank_job j;
	uint64_t it;
	dfcclResult_t r;
	if (run_until_fault(sh, &j, rank, &it, &r))
		return 1;
	if (sh->fault == FAULT_STOP && rank == atomic_load(&sh->victim)) {
		for (int k = 0; k < sh->ncomms; k++)
			dfcclCommAbort(j.comm[k]);
		return 0;
	}
	if (sh->fault == FAULT_STOP && stop_timed_out(sh, rank, r))
		return 1;
	return shrink_and_go_on(sh, &j, rank, r);
}

/* A rank of a restart trial. */
static int restart_rank(void *arg, int rank)
{
	struct shared *sh = arg;
	struct rank_job j;
	uint64_t it;
	int bad = 0;
	dfcclResult_t r;
	if (run_until_fault(sh, &j, rank, &it, &r))
		return 1;
	/* A wrong error fails this rank, which still goes on to the new
	 * communicators: the other ranks wait there for every rank, and would
	 * otherwise be reported hung, an echo of this failure. */
	int wrong = r != dfcclDaemonUnavailable;
	if (wrong)
		snprintf(sh->msg[rank], sizeof(sh->msg[rank]), "the daemon's death gave %d (%s), expected "
		         "dfcclDaemonUnavailable", r, dfcclGetLastError(NULL));
	for (int k = 0; k < sh->ncomms; k++)
		dfcclCommAbort(j.comm[k]);
	/* The daemon comes back (the suite says when its workers are up: a
	 * communicator needs its device's worker): new communicators in this
	 * same process, which must reach the new daemon. */
	uint64_t t0 = now_ms();
	while (!atomic_load(&sh->back))
		if (now_ms() - t0 > BACK_MS)
			RFAIL("the daemon did not come back within %d s", BACK_MS / 1000);
		else
			usleep(20000);
	int ndev = 0;
	if (dfcclGetDeviceCount(&ndev) != dfcclSuccess)
		RFAIL("the daemon came back, but this rank does not reach it: %s", dfcclGetLastError(NULL));
	memset(&j, 0, sizeof(j));
	if (job_init(sh, &j, sh->after, rank) != dfcclSuccess || job_alloc(&j, sh->ncomms) != dfcclSuccess)
		RFAIL("set-up after the restart: %s", dfcclGetLastError(NULL));
	it = 1u << 20; /* as after a shrink: the ranks agree afresh */
	r = run_batches(sh, &j, rank, &it, 20, mix(sh->seed ^ (uint64_t)rank ^ 0xa5a5), &bad);
	if (r != dfcclSuccess)
		RFAIL("after the restart: %d: %s", r, dfcclGetLastError(NULL));
	for (int k = 0; k < sh->ncomms; k++)
		dfcclCommDestroy(j.comm[k]);
	return wrong;
}

/* ------------------------------------------------------------ the suite */

/* Resident memory of pid in KiB (0 if unknown). */
static long rss_kib(pid_t pid)
{
	char path[64], text[4096];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	read_text_file(path, text, sizeof(text));
	const char *p = strstr(text, "VmRSS:");
	return p ? strtol(p + 6, NULL, 10) : 0;
}

/* What the suite asks of the daemon's status. */
struct daemon_state {
	unsigned sessions;  /* besides the one asking */
	unsigned comms;     /* made and pending */
	unsigned releasing; /* deleted, their workers' memory of them not yet freed */
	unsigned restarts;  /* worker restarts, summed over the devices */
	unsigned ndev, up;  /* devices, and those whose worker is up */
	int mps;            /* MPS active (CUDA engine) */
};

/* The daemon's state into *out; -1 when it does not answer. */
static int daemon_status(const struct daemon_proc *d, struct daemon_state *out)
{
	dfccl_envelope *r = daemon_query(d, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	if (!r || !r->query_reply || !r->query_reply->status) {
		if (r)
			frame_envelope_free(r);
		return -1;
	}
	const Dfccl__V1__StatusInfo *st = r->query_reply->status;
	memset(out, 0, sizeof(*out));
	out->sessions = st->nsessions - 1;
	out->comms = st->ncomms + st->npending_comms;
	out->releasing = st->nreleasing_comms;
	out->ndev = (unsigned)st->n_devices;
	out->mps = st->mps_active;
	for (size_t i = 0; i < st->n_devices; i++) {
		out->restarts += st->devices[i]->worker_restarts;
		out->up += st->devices[i]->worker_up != 0;
	}
	frame_envelope_free(r);
	return 0;
}

static unsigned worker_restarts; /* under MPS: restarts the kills cost, over the suite */

/* Waits until the daemon holds no session, no communicator and no deleted
 * one its workers have not released (5 s) and
 * every worker is up (BACK_MS: a restarted one starts afresh); its state
 * into *st. 0, or -1 naming what is left. */
static int wait_settled(const struct daemon_proc *d, struct daemon_state *st)
{
	int answered = 0;
	memset(st, 0, sizeof(*st));
	for (uint64_t t0 = now_ms();; usleep(10000)) {
		answered = daemon_status(d, st) == 0;
		int idle = answered && st->sessions == 0 && st->comms == 0 && st->releasing == 0;
		if ((idle && st->up == st->ndev) || now_ms() - t0 > (idle ? BACK_MS : 5000))
			break;
	}
	if (!answered) {
		fprintf(stderr, "fault_suite: the daemon does not answer a status query\n");
		return -1;
	}
	if (st->sessions || st->comms || st->releasing) {
		fprintf(stderr,
		        "fault_suite: the daemon still holds %u session(s), %u communicator(s) and %u deleted one(s) its "
		        "workers have not released\n",
		        st->sessions, st->comms, st->releasing);
		return -1;
	}
	if (st->up != st->ndev) {
		fprintf(stderr, "fault_suite: the workers of %u of %u devices are not up after %d s\n", st->ndev - st->up,
		        st->ndev, BACK_MS / 1000);
		return -1;
	}
	return 0;
}

/* The probe: one checked all-reduce on a one-rank communicator of its own
 * on every device. Exits 0, 2 when a device was lost, else 1 (why in
 * sh->msg[0]). */
static int probe_rank(void *arg, int rank)
{
	struct shared *sh = arg;
	for (int dev = 0; dev < sh->ndev; dev++) {
		dfcclUniqueId id;
		dfcclComm_t comm;
		int64_t *buf;
		dfcclResult_t r = dfcclSetDevice(dev);
		if (r == dfcclSuccess)
			r = dfcclGetUniqueId(&id);
		if (r == dfcclSuccess)
			r = dfcclCommInitRank(&comm, 1, id, 0);
		if (r == dfcclSuccess && (r = dfcclMemAllocHost((void **)&buf, 64 * sizeof(int64_t))) != dfcclSuccess)
			dfcclCommAbort(comm);
		if (r != dfcclSuccess) {
			snprintf(sh->msg[rank], sizeof(sh->msg[rank]), "device %d: %s", dev, dfcclGetLastError(NULL));
			return r == dfcclDeviceLost ? 2 : 1;
		}
		for (int i = 0; i < 32; i++)
			buf[i] = contrib(dev, (uint64_t)sh->seed, 0, (size_t)i);
		r = dfcclAllReduce(buf, buf + 32, 32, dfcclInt64, dfcclSum, comm, NULL);
		if (r == dfcclSuccess)
			r = dfcclCommSynchronize(comm);
		if (r == dfcclSuccess && memcmp(buf, buf + 32, 32 * sizeof(int64_t)) != 0)
			r = dfcclInternalError;
		if (r != dfcclSuccess) {
			snprintf(sh->msg[rank], sizeof(sh->msg[rank]), "device %d: the all-reduce gave %d: %s", dev, r,
			         r == dfcclInternalError ? "wrong data" : dfcclGetLastError(NULL));
			return r == dfcclDeviceLost ? 2 : 1;
		}
		dfcclCommDestroy(comm);
		dfcclMemFree(buf);
	}
	return 0;
}

/*
 * After a trial: the daemon must hold nothing of it, and every device must
 * serve a fresh process (the probe). Under MPS a context the kill poisoned
 * may show only at its worker's next CUDA call: the probe makes that call
 * here, so the restart it costs is this trial's, and the probe is repeated
 * on the restarted worker. 0, or -1 naming what failed.
 */
static int wait_served(const struct daemon_proc *d, struct shared *sh, struct daemon_state *st)
{
	int served = 0;
	for (int tries = 0;; tries++) {
		if (wait_settled(d, st) < 0)
			return -1;
		if (served)
			return 0; /* and the probe's session is gone */
		memset(sh->msg[0], 0, sizeof(sh->msg[0]));
		int rc = child_wait(child_run(probe_rank, sh, 0), HANG_MS);
		served = rc == 0;
		if (rc == 0 || (rc == 2 && sh->mps && tries < 3))
			continue;
		fprintf(stderr, "fault_suite: after the trial, a fresh process %s: %s\n", rc < 0 ? "hung" : "was not served",
		        sh->msg[0][0] ? sh->msg[0] : "(no message)");
		return -1;
	}
}

/*
 * Waits until the trial is over (wait_served); 0, or -1 naming what is
 * wrong. Workers restarted since restarts0 fail the trial, but under MPS
 * (sh->mps), where they are counted in *restarted and reported. A rank
 * that lost its device (sh->lost) needs such a restart.
 */
static int wait_clean(const struct daemon_proc *d, struct shared *sh, unsigned restarts0, unsigned *restarted)
{
	struct daemon_state st;
	if (wait_served(d, sh, &st) < 0)
		return -1;
	*restarted = st.restarts - restarts0;
	int lost = 0;
	for (int r = 0; r < sh->nranks; r++)
		lost += sh->lost[r];
	if (*restarted && !sh->mps) {
		fprintf(stderr, "fault_suite: %u worker restart(s) during the trial\n", *restarted);
		return -1;
	}
	if (lost && !*restarted) {
		fprintf(stderr, "fault_suite: %d rank(s) lost their device, but no worker was restarted\n", lost);
		return -1;
	}
	if (*restarted)
		printf("fault_suite: %u worker restart(s) in this trial (MPS: the killed client poisoned its GPU), %d "
		       "survivor(s) lost their device; every device serves again\n", *restarted, lost);
	worker_restarts += *restarted;
	return 0;
}
static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The survivors' error latencies of one kind of trial (us from the fault
 * to each survivor's first error) and their limit. */
struct lat_set {
	const char *what;
	uint64_t *v;
	size_t n;
	uint64_t limit_us;
};

static unsigned stops_continued, stops_killed; /* how stop trials ended */

/* The daemon under test: its engine ("host" or "cuda") and binary (NULL:
 * this build's). */
static const char *engine = "host";
static const char *dfccld_exe;

/*
 * Starts dfccld (again on d's socket when reuse) with ndev devices (0 on
 * the CUDA engine: every GPU it finds) and waits for every worker. On the
 * CUDA engine its workers run as its own uid, which is the ranks' (they
 * are the suite's children): under MPS, which serves one uid at a time,
 * workers must be of the uid of the jobs, and none is parked between jobs,
 * so a worker changes only when it dies.
 */
static int suite_daemon_start(struct daemon_proc *d, int reuse, unsigned ndev)
{
	struct daemon_opts o = {.reuse = reuse, .engine = engine, .exe = dfccld_exe};
	if (strcmp(engine, "cuda") == 0)
		return daemon_start_with(d, &o, ndev, "--heartbeat-stale-ms", STALE_MS, "--worker-user", "daemon", NULL);
	return daemon_start_with(d, &o, ndev, "--heartbeat-stale-ms", STALE_MS, NULL);
}

/* The stopped rank of a stop trial, once its survivors are done: continued
 * (it must leave its failed communicators and exit cleanly) or killed, as
 * the trial's random bits say. Returns 0 or -1. */
static int stop_cleanup(const struct shared *sh, pid_t pid, int victim, uint64_t rng)
{
	if (rng & (1ull << 40)) {
		stops_killed++;
		kill(pid, SIGKILL);
		if (child_wait(pid, HANG_MS) == 128 + SIGKILL)
			return 0;
		fprintf(stderr, "fault_suite: the stopped rank %d did not die of SIGKILL\n", victim);
		return -1;
	}
	stops_continued++;
	kill(pid, SIGCONT);
	int rc = child_wait(pid, HANG_MS);
	if (rc == 0)
		return 0;
	fprintf(stderr, "fault_suite: the stopped rank %d, continued, %s: %s\n", victim, rc < 0 ? "hung" : "failed",
	        sh->msg[victim][0] ? sh->msg[victim] : "(no message)");
	return -1;
}

/* Runs one trial: ranks during traffic, the fault `what` after a random
 * delay. Appends the survivors' error latencies to ls. Returns 0 or -1. */
static int trial(struct daemon_proc *d, struct shared *sh, enum fault what, uint64_t *rng, struct lat_set *ls)
{
	int n = sh->nranks;
	int (*fn)(void *, int) = what == FAULT_DAEMON ? restart_rank : fault_rank;
	for (int k = 0; k < sh->ncomms; k++)
		if (dfcclGetUniqueId(&sh->ids[k]) != dfcclSuccess || dfcclGetUniqueId(&sh->after[k]) != dfcclSuccess)
			return -1;
	sh->fault = what;
	atomic_store(&sh->running, 0);
	atomic_store(&sh->fault_ns, 0);
	atomic_store(&sh->errored, 0);
	atomic_store(&sh->back, 0);
	memset(sh->lost, 0, sizeof(sh->lost));
	memset(sh->err_ns, 0, sizeof(sh->err_ns));
	memset(sh->msg, 0, sizeof(sh->msg));
	*rng = mix(*rng);
	sh->seed = *rng;
	pid_t pid[MAX_RANKS];
	for (int r = 0; r < n; r++)
		pid[r] = child_run(fn, sh, r);
	for (uint64_t t0 = now_ms(); atomic_load(&sh->running) < n && now_ms() - t0 < 10000;)
		usleep(1000);
	int victim = (int)(*rng % (uint64_t)n);
	atomic_store(&sh->victim, victim);
	atomic_store(&sh->victim_pid, (int)pid[victim]);
	usleep((useconds_t)(1000 * (5 + (*rng >> 20) % 150)));
	atomic_store(&sh->fault_ns, mono_ns());
	if (what == FAULT_KILL) {
		kill(pid[victim], SIGKILL);
	} else if (what == FAULT_STOP) {
		kill(pid[victim], SIGSTOP);
	} else {
		kill(d->pid, SIGKILL);
		child_wait(d->pid, 5000);
		if (suite_daemon_start(d, 1, (unsigned)sh->ndev) < 0) {
			fprintf(stderr, "fault_suite: dfccld did not start again\n");
			for (int r = 0; r < n; r++)
				child_wait(pid[r], 0);
			return -1;
		}
		atomic_store(&sh->back, 1);
	}
	int failed = 0;
	for (int r = 0; r < n; r++) {
		if (what != FAULT_DAEMON && r == victim)
			continue;
		int rc = child_wait(pid[r], HANG_MS);
		if (rc != 0) {
			failed = 1;
			fprintf(stderr, "fault_suite: rank %d %s: %s\n", r, rc < 0 ? "hung" : "failed",
			        sh->msg[r][0] ? sh->msg[r] : "(no message)");
			continue;
		}
		ls->v[ls->n++] = (sh->err_ns[r] - atomic_load(&sh->fault_ns)) / 1000;
	}
	if (what == FAULT_KILL)
		child_wait(pid[victim], HANG_MS);
	if (what == FAULT_STOP && stop_cleanup(sh, pid[victim], victim, *rng) < 0)
		failed = 1;
	return failed ? -1 : 0;
}

/* Prints the distribution of ls; returns how many came later than its limit. */
static int lat_report(struct lat_set *ls)
{
	if (!ls->n)
		return 0;
	int late = 0;
	qsort(ls->v, ls->n, sizeof(*ls->v), cmp_u64);
	for (size_t i = 0; i < ls->n; i++)
		late += ls->v[i] > ls->limit_us;
	printf("%s: %zu survivor errors after the fault, us: min %llu, median %llu, p99 %llu, max %llu (limit %llu)\n",
	       ls->what, ls->n, (unsigned long long)ls->v[0], (unsigned long long)ls->v[ls->n / 2],
	       (unsigned long long)ls->v[(ls->n * 99) / 100], (unsigned long long)ls->v[ls->n - 1],
	       (unsigned long long)ls->limit_us);
	if (late)
		fprintf(stderr, "fault_suite: %d error(s) after a %s came later than %llu ms (the latest after %llu ms)\n",
		        late, ls->what, (unsigned long long)ls->limit_us / 1000,
		        (unsigned long long)ls->v[ls->n - 1] / 1000);
	return late;
}

/* `count` trials of one kind; 0, or -1 after the first that failed. The
 * resident memory of dfccld after the first and the last into rss (when
 * not NULL). A worker restart in the last trial (under MPS) adds one more
 * trial, which must work: the daemon serves again after a restart. */
static int trials_run(struct daemon_proc *d, struct shared *sh, enum fault what, long count, uint64_t *rng,
                      struct lat_set *ls, unsigned long long seed, long *rss)
{
	static const char *const names[] = {"kill", "restart", "stop"};
	int extra = 0;
	for (long t = 0; t < count + extra; t++) {
		struct daemon_state st;
		unsigned restarted = 0;
		/* A restart starts the workers afresh: count restarts after it. */
		if ((what != FAULT_DAEMON && daemon_status(d, &st) < 0) || trial(d, sh, what, rng, ls) < 0 ||
		    (what == FAULT_DAEMON && daemon_status(d, &st) < 0) || wait_clean(d, sh, st.restarts, &restarted) < 0) {
			fprintf(stderr, "fault_suite: %s trial %ld (seed %llu) failed\n", names[what], t, seed);
			return -1;
		}
		if (restarted && t == count - 1 && !extra) {
			printf("fault_suite: one more %s trial after the restart\n", names[what]);
			extra = 1;
		}
		if (rss && t == 0)
			rss[0] = rss_kib(d->pid);
	}
	if (rss && count > 0)
		rss[1] = rss_kib(d->pid);
	return 0;
}

/* The suite's settings from the command line. */
struct suite_args {
	long trials, stops, restarts, latency_ms, stop_timeout_ms;
	unsigned long long seed;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: fault_suite [--trials N] [--stop-trials N] [--restart-trials N] [--ranks 3..%d] "
	           "[--comms 1..%d] [--seed S] [--latency-ms L] [--stop-timeout-ms T (> %s)] [--engine host|cuda] "
	           "[--dfccld PATH]\n", MAX_RANKS, MAX_COMMS, STALE_MS);
}

/* Parses argv into a and sh; 0, 1 after --help, or 2 (said why). */
static int args_parse(int argc, char **argv, struct suite_args *a, struct shared *sh)
{
	static const struct option opts[] = {
	    {"trials", required_argument, NULL, 't'},      {"restart-trials", required_argument, NULL, 'r'},
	    {"ranks", required_argument, NULL, 'n'},       {"comms", required_argument, NULL, 'c'},
	    {"seed", required_argument, NULL, 's'},        {"latency-ms", required_argument, NULL, 'l'},
	    {"stop-trials", required_argument, NULL, 'p'}, {"stop-timeout-ms", required_argument, NULL, 'T'},
	    {"engine", required_argument, NULL, 'e'},      {"dfccld", required_argument, NULL, 'd'},
	    {"help", no_argument, NULL, 'h'},              {NULL, 0, NULL, 0},
	};
	int opt;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		long v = optarg ? strtol(optarg, NULL, 10) : 0;
		switch (opt) {
		case 't': a->trials = v; break;
		case 'r': a->restarts = v; break;
		case 'p': a->stops = v; break;
		case 'T': a->stop_timeout_ms = v; break;
		case 'n': sh->nranks = (int)v; break;
		case 'c': sh->ncomms = (int)v; break;
		case 's': a->seed = strtoull(optarg, NULL, 10); break;
		case 'l': a->latency_ms = v; break;
		case 'e': engine = optarg; break;
		case 'd': dfccld_exe = optarg; break;
		case 'h': usage(stdout); return 1;
		default: usage(stderr); return 2;
		}
	}
	if (strcmp(engine, "host") != 0 && strcmp(engine, "cuda") != 0) {
		fprintf(stderr, "fault_suite: --engine %s: the engine is host or cuda\n", engine);
		return 2;
	}
	if (optind < argc || a->trials < 0 || a->stops < 0 || a->restarts < 0 || sh->nranks < 3 ||
	    sh->nranks > MAX_RANKS || sh->ncomms < 1 || sh->ncomms > MAX_COMMS || a->latency_ms < 1 ||
	    a->stop_timeout_ms <= atol(STALE_MS) || a->stop_timeout_ms > 600000) {
		fprintf(stderr, "fault_suite: bad arguments (see --help)\n");
		return 2;
	}
	return 0;
}

/* Starts the daemon and learns its devices and MPS into sh; 0 or -1 (said
 * why). */
static int suite_start(struct daemon_proc *d, struct shared *sh)
{
	int cuda = strcmp(engine, "cuda") == 0;
	struct daemon_state st;
	if (suite_daemon_start(d, 0, cuda ? 0 : (unsigned)sh->ndev) < 0) {
		if (cuda)
			fprintf(stderr, "fault_suite: dfccld could not start the CUDA engine%s (its log above says why)\n",
			        daemon_log_contains(d, "no usable GPU") ? ": it found no usable GPU" : "");
		else
			fprintf(stderr, "fault_suite: dfccld did not start\n");
		return -1;
	}
	if (daemon_status(d, &st) < 0 || st.ndev == 0) {
		fprintf(stderr, "fault_suite: dfccld does not answer a status query\n");
		return -1;
	}
	sh->ndev = (int)st.ndev;
	sh->mps = cuda && st.mps;
	printf("fault_suite: dfccld on the %s engine, %d device%s%s\n", engine, sh->ndev, sh->ndev == 1 ? "" : "s",
	       cuda ? (sh->mps ? ", MPS active" : ", MPS not active") : "");
	fflush(stdout);
	return 0;
}

/* A latency set with room for `count` trials and the one more a worker
 * restart may add. */
static struct lat_set lat_set_new(const char *what, long count, long limit_ms)
{
	struct lat_set ls = {what, calloc((size_t)(count + 1) * MAX_RANKS, sizeof(uint64_t)), 0,
	                     (uint64_t)limit_ms * 1000};
	return ls;
}

int main(int argc, char **argv)
{
	struct suite_args a = {.trials = 20, .stops = 3, .restarts = 2, .latency_ms = 1000, .stop_timeout_ms = 1000,
	                       .seed = (unsigned long long)time(NULL)};
	struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	memset(sh, 0, sizeof(*sh));
	sh->nranks = 4;
	sh->ncomms = 3;
	sh->ndev = 2; /* the host engine's; the CUDA engine's are the GPUs */
	int rc = args_parse(argc, argv, &a, sh);
	if (rc)
		return rc == 1 ? 0 : rc;
	signal(SIGPIPE, SIG_IGN);
	printf("fault_suite: %ld kill trials, %ld stop trials (timeout %ld ms), %ld restart trials, %d ranks, %d "
	       "communicators, seed %llu\n", a.trials, a.stops, a.stop_timeout_ms, a.restarts, sh->nranks, sh->ncomms,
	       a.seed);
	fflush(stdout);

	struct daemon_proc d;
	if (suite_start(&d, sh) < 0) {
		daemon_stop(&d);
		printf("FAIL\n");
		return 1;
	}
	struct lat_set kills = lat_set_new("rank killed", a.trials, a.latency_ms);
	struct lat_set stopped = lat_set_new("rank stopped", a.stops, a.stop_timeout_ms + a.latency_ms);
	struct lat_set daemons = lat_set_new("daemon killed", a.restarts, a.latency_ms);
	if (!kills.v || !stopped.v || !daemons.v)
		return 1;
	uint64_t rng = a.seed;
	long rss[2] = {0, 0};
	int failed = trials_run(&d, sh, FAULT_KILL, a.trials, &rng, &kills, a.seed, rss) < 0;
	sh->timeout_ms = (int)a.stop_timeout_ms;
	failed = failed || trials_run(&d, sh, FAULT_STOP, a.stops, &rng, &stopped, a.seed, NULL) < 0;
	sh->timeout_ms = 0;
	failed = failed || trials_run(&d, sh, FAULT_DAEMON, a.restarts, &rng, &daemons, a.seed, NULL) < 0;
	int late = lat_report(&kills) + lat_report(&stopped) + lat_report(&daemons);
	if (a.stops)
		printf("stopped ranks: %u continued (each left its failed communicators), %u killed\n", stops_continued,
		       stops_killed);
	if (sh->mps)
		printf("worker restarts (MPS: killed clients poisoned their GPU): %u\n", worker_restarts);
	if (a.trials)
		printf("dfccld resident memory: %ld KiB after the first kill trial, %ld KiB after the last\n", rss[0],
		       rss[1]);
	if (late)
		failed = 1;
	/* Flat: a few pages of allocator slack, not growth per trial. (Under
	 * AddressSanitizer freed memory is held in quarantine: no measure.) */
	if (SANITIZED)
		printf("dfccld runs under AddressSanitizer: its resident memory is not checked\n");
	else if (a.trials > 1 && rss[1] > rss[0] + 2048 + rss[0] / 10) {
		fprintf(stderr, "fault_suite: dfccld grew from %ld to %ld KiB over the kill trials\n", rss[0], rss[1]);
		failed = 1;
	}
	if (failed)
		daemon_dump_log(&d);
	free(kills.v);
	free(stopped.v);
	free(daemons.v);
	if (daemon_stop(&d) != 0 && !failed) {
		fprintf(stderr, "fault_suite: dfccld did not stop cleanly\n");
		failed = 1;
	}
	printf("%s\n", failed ? "FAIL" : "OK: no hang, every survivor got its error and went on, nothing left behind");
	return failed;
}
