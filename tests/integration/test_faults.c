/*
 * Detection and visibility of stuck collectives, against the real daemon
 * with one client process per rank: the collective timeout names a rank
 * that was SIGSTOPped (as stopped) and one that never submitted (as
 * running), in a sentence that names the communicator once; a send whose
 * receiver never receives, a receive whose sender never sends and a run of
 * a registered collective that the other ranks never run time out too,
 * naming the operation and the missing ranks; `dfcclctl stuck` shows a
 * stuck collective, a stuck registered run and a stuck message at once,
 * and nothing once they completed or timed out, the flight recorder keeps
 * a killed client's last collectives, and the new requests refuse bad
 * input with a sentence.
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "dfccl.h"
#include "harness.h"

#define COUNT 1024
#define TIMEOUT_MS 1000

struct job {
	dfcclUniqueId id;
	int nranks;
	int timeout_ms;      /* dfcclConfig_t.timeoutMs */
	int warmup;          /* all-reduces every rank completes first */
	int pid_fd;          /* rank 1 writes its pid here */
	int pid_rd;          /* ... and rank 0 reads it here (-1: it does not) */
	const char *peer_state; /* how rank 0's error must describe rank 1 ("stopped", "running") */
	int ready_fd;        /* each rank writes one byte after the warm-up */
	int go_fd;           /* rank 1 reads one byte before its next step */
	int stop_self;       /* rank 1 stops itself (SIGSTOP) after the warm-up */
	int late_submit;     /* rank 1 submits the next all-reduce after go */
	int expect;          /* rank 0's result of the next all-reduce */
	const char *expect_msg[3];
	/* The whole sentence of rank 0's async error (text_matches), with %d
	 * for rank 1's pid; its dfcclCommSynchronize error is "AllReduce
	 * failed: the collective timed out: " and the same sentence. */
	const char *expect_text;
};

/* Checks err (the thread's last error after `what`) against prefix and
 * the pattern `fmt` with its %d standing for pid: exactly, except for the
 * numbers ({n}). */
static int text_is(int rank, const char *what, const char *err, const char *prefix, const char *fmt, int pid)
{
	char pattern[1024];
	const char *at = strstr(fmt, "%d");
	snprintf(pattern, sizeof(pattern), "%s%.*s%d%s", prefix, (int)(at - fmt), fmt, pid, at + 2);
	if (!text_matches(err, pattern))
		RANK_FAIL("%s: '%s' is not '%s'", what, err, pattern);
	return 0;
}

/* One all-reduce of ranks' (rank + 1) * (i + 1), checked against the sum. */
static int allreduce_checked(dfcclComm_t comm, float *buf, int nranks, int rank)
{
	for (int i = 0; i < COUNT; i++)
		buf[i] = (float)((rank + 1) * (i % 7 + 1));
	if (dfcclAllReduce(buf, buf, COUNT, dfcclFloat, dfcclSum, comm, NULL) != dfcclSuccess ||
	    dfcclCommSynchronize(comm) != dfcclSuccess)
		RANK_FAIL("all-reduce: %s", dfcclGetLastError(NULL));
	float ranks_sum = (float)(nranks * (nranks + 1) / 2);
	for (int i = 0; i < COUNT; i++)
		if (buf[i] != ranks_sum * (float)(i % 7 + 1))
			RANK_FAIL("element %d is %g, expected %g", i, buf[i], ranks_sum * (float)(i % 7 + 1));
	return 0;
}

static int rank_main(void *arg, int rank)
{
	struct job *j = arg;
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	cfg.device = rank % 2;
	cfg.timeoutMs = j->timeout_ms;
	dfcclComm_t comm = NULL;
	float *buf = NULL;
	if (dfcclSetDevice(rank % 2) != dfcclSuccess)
		RANK_FAIL("set device: %s", dfcclGetLastError(NULL));
	if (dfcclCommInitRankConfig(&comm, j->nranks, j->id, rank, &cfg) != dfcclSuccess)
		RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	if (dfcclMemAlloc((void **)&buf, COUNT * sizeof(float)) != dfcclSuccess)
		RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
	for (int k = 0; k < j->warmup; k++)
		if (allreduce_checked(comm, buf, j->nranks, rank))
			return 1;
	char b = 'r';
	if (j->ready_fd >= 0 && write(j->ready_fd, &b, 1) != 1)
		RANK_FAIL("ready pipe");
	if (rank == 1) {
		pid_t me = getpid();
		if (j->pid_fd >= 0 && write(j->pid_fd, &me, sizeof(me)) != sizeof(me))
			RANK_FAIL("pid pipe");
		if (j->stop_self)
			raise(SIGSTOP); /* the test kills it */
		if (j->go_fd >= 0 && read(j->go_fd, &b, 1) != 1)
			RANK_FAIL("go pipe");
		if (j->late_submit) {
			if (allreduce_checked(comm, buf, j->nranks, rank))
				return 1;
			/* Destroy, not exit: a rank that vanishes fails its peers'
			 * collectives still in flight. */
			if (dfcclCommDestroy(comm) != dfcclSuccess)
				RANK_FAIL("destroy: %s", dfcclGetLastError(NULL));
			return 0;
		}
		/* It never submitted: its communicator failed meanwhile. */
		dfcclResult_t ae = dfcclSuccess;
		dfcclCommGetAsyncError(comm, &ae);
		if ((int)ae != j->expect)
			RANK_FAIL("async error %d (%s), expected %d", ae, dfcclGetErrorString(ae), j->expect);
		dfcclCommAbort(comm);
		return 0;
	}
	if (j->expect == dfcclSuccess) {
		if (allreduce_checked(comm, buf, j->nranks, rank))
			return 1;
		if (dfcclCommDestroy(comm) != dfcclSuccess)
			RANK_FAIL("destroy: %s", dfcclGetLastError(NULL));
		return 0;
	}
	char name[96] = "";
	pid_t peer = 0;
	if (j->pid_rd >= 0) {
		if (read(j->pid_rd, &peer, sizeof(peer)) != sizeof(peer))
			RANK_FAIL("pid pipe");
		snprintf(name, sizeof(name), "1 (pid %d, device 1, %s", (int)peer, j->peer_state);
	}
	uint64_t t0 = now_ms();
	dfcclResult_t r = dfcclAllReduce(buf, buf, COUNT, dfcclFloat, dfcclSum, comm, NULL);
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(comm);
	uint64_t took = now_ms() - t0;
	const char *msg = dfcclGetLastError(NULL);
	if ((int)r != j->expect)
		RANK_FAIL("all-reduce returned %d (%s: %s), expected %d", r, dfcclGetErrorString(r), msg, j->expect);
	/* Named within timeout + 1 s of the submission. */
	if (took < (uint64_t)j->timeout_ms || took > (uint64_t)j->timeout_ms + 1000)
		RANK_FAIL("the timeout came after %llu ms, expected %d..%d", (unsigned long long)took, j->timeout_ms,
		     j->timeout_ms + 1000);
	for (int k = 0; k < 3 && j->expect_msg[k]; k++)
		if (!strstr(msg, j->expect_msg[k]))
			RANK_FAIL("error '%s' lacks '%s'", msg, j->expect_msg[k]);
	if (name[0] && !strstr(msg, name))
		RANK_FAIL("error '%s' lacks '%s'", msg, name);
	if (j->expect_text) {
		if (text_is(rank, "synchronize", msg, "AllReduce failed: the collective timed out: ", j->expect_text, peer))
			return 1;
		dfcclResult_t ae = dfcclSuccess;
		if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess || ae != dfcclTimeout)
			RANK_FAIL("async error %d, expected dfcclTimeout", ae);
		if (text_is(rank, "async error", dfcclGetLastError(NULL), "", j->expect_text, peer))
			return 1;
	}
	dfcclCommAbort(comm);
	return 0;
}

/* ------------------------------------------------------------ send/recv and registered runs */

enum lone_kind { LONE_SEND, LONE_RECV, LONE_REG };

/* Rank `waiter` submits one operation its peers never match: after one
 * matched warm-up, a send to rank 1 that rank 1 never receives
 * (LONE_SEND, waiter 0), a receive from rank 0 that rank 0 never sends
 * (LONE_RECV, waiter 1), or run 2 of registered collective 7 that the
 * other ranks never run (LONE_REG, waiter 0). The others write (rank, pid)
 * into `pids`, wait for `go` and find the timeout as their communicator's
 * error. */
struct lone_job {
	dfcclUniqueId id;
	int nranks;
	enum lone_kind kind;
	int waiter;
	int pid_wr, pid_rd, go_rd, go_wr;
	const char *text; /* the waiter's async error: pattern with {n}, and %d for each peer's pid in rank order */
};

#define LONE_COLL 7

/* The warm-up: one checked message 0 -> 1, or one checked run of the
 * registered all-reduce. buf holds 2 * COUNT floats. */
static int lone_warmup(const struct lone_job *j, dfcclComm_t comm, float *buf, int rank)
{
	for (int i = 0; i < COUNT; i++)
		buf[i] = (float)(rank + 1) * (float)(i % 5 + 1);
	dfcclResult_t r;
	if (j->kind == LONE_REG) {
		dfcclCollDesc_t d = {dfcclCollAllReduce, COUNT, dfcclFloat, dfcclSum, 0, 0};
		dfcclRequest_t req = NULL;
		r = dfcclRegisterCollective(comm, LONE_COLL, &d);
		if (r == dfcclSuccess)
			r = dfcclRunCollective(comm, LONE_COLL, buf, buf + COUNT, NULL, NULL, &req);
		if (r == dfcclSuccess)
			r = dfcclWait(req);
	} else if (rank == 0) {
		r = dfcclSend(buf, COUNT, dfcclFloat, 1, comm, NULL);
	} else {
		r = dfcclRecv(buf + COUNT, COUNT, dfcclFloat, 0, comm, NULL);
	}
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(comm);
	if (r != dfcclSuccess)
		RANK_FAIL("warm-up: %s", dfcclGetLastError(NULL));
	float ranks = j->kind == LONE_REG ? (float)(j->nranks * (j->nranks + 1) / 2) : 1.0f;
	for (int i = 0; i < COUNT && (j->kind == LONE_REG || rank == 1); i++)
		if (buf[COUNT + i] != ranks * (float)(i % 5 + 1))
			RANK_FAIL("warm-up element %d is %g, expected %g", i, buf[COUNT + i], ranks * (float)(i % 5 + 1));
	return 0;
}

/* The waiter's unmatched operation: its result and how long it took. */
static dfcclResult_t lone_submit(const struct lone_job *j, dfcclComm_t comm, float *buf, uint64_t *took)
{
	uint64_t t0 = now_ms();
	dfcclResult_t r;
	if (j->kind == LONE_REG) {
		dfcclRequest_t req = NULL;
		r = dfcclRunCollective(comm, LONE_COLL, buf, buf + COUNT, NULL, NULL, &req);
		if (r == dfcclSuccess)
			r = dfcclWait(req);
	} else {
		r = j->kind == LONE_SEND ? dfcclSend(buf, COUNT, dfcclFloat, 1, comm, NULL)
		                         : dfcclRecv(buf + COUNT, COUNT, dfcclFloat, 0, comm, NULL);
		if (r == dfcclSuccess)
			r = dfcclCommSynchronize(comm);
	}
	*took = now_ms() - t0;
	return r;
}

/* The expected async error of the waiter: j->text with the peers' pids. */
static void lone_pattern(const struct lone_job *j, const pid_t *pids, char *out, size_t len)
{
	size_t off = 0;
	int q = 0;
	for (const char *p = j->text; *p && off + 1 < len; p++) {
		if (p[0] == '%' && p[1] == 'd') {
			while (q == j->waiter)
				q++;
			off += (size_t)snprintf(out + off, len - off, "%d", (int)pids[q++]);
			p++;
		} else {
			out[off++] = *p;
		}
	}
	out[off] = '\0';
}

static int lone_rank(void *arg, int rank)
{
	struct lone_job *j = arg;
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	cfg.timeoutMs = TIMEOUT_MS;
	dfcclComm_t comm = NULL;
	float *buf = NULL;
	if (dfcclSetDevice(rank % 2) != dfcclSuccess || dfcclCommInitRankConfig(&comm, j->nranks, j->id, rank, &cfg) !=
	    dfcclSuccess || dfcclMemAlloc((void **)&buf, 2 * COUNT * sizeof(float)) != dfcclSuccess)
		RANK_FAIL("set-up: %s", dfcclGetLastError(NULL));
	if (lone_warmup(j, comm, buf, rank))
		return 1;
	if (rank != j->waiter) {
		pid_t me[2] = {rank, getpid()};
		char b;
		close(j->go_wr); /* so a test that ends early ends this read too */
		if (write(j->pid_wr, me, sizeof(me)) != sizeof(me) || read(j->go_rd, &b, 1) != 1)
			RANK_FAIL("pipes");
		dfcclResult_t ae = dfcclSuccess;
		if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess || ae != dfcclTimeout ||
		    !strstr(dfcclGetLastError(NULL), "timed out after"))
			RANK_FAIL("async error %d, '%s': expected the timeout", ae, dfcclGetLastError(NULL));
		dfcclCommAbort(comm);
		return 0;
	}
	pid_t pids[8] = {0};
	for (int k = 0; k < j->nranks - 1; k++) {
		pid_t rp[2];
		if (read(j->pid_rd, rp, sizeof(rp)) != sizeof(rp) || rp[0] < 0 || rp[0] >= j->nranks)
			RANK_FAIL("pid pipe");
		pids[rp[0]] = rp[1];
	}
	uint64_t took;
	dfcclResult_t r = lone_submit(j, comm, buf, &took);
	char err[1024];
	snprintf(err, sizeof(err), "%s", dfcclGetLastError(NULL));
	if (r != dfcclTimeout)
		RANK_FAIL("the unmatched operation returned %d (%s), expected dfcclTimeout", r, err);
	if (took < TIMEOUT_MS || took > TIMEOUT_MS + 1000)
		RANK_FAIL("the timeout came after %llu ms, expected %d..%d", (unsigned long long)took, TIMEOUT_MS,
		          TIMEOUT_MS + 1000);
	char pattern[1024], full[1200];
	lone_pattern(j, pids, pattern, sizeof(pattern));
	/* What failed, with the daemon's sentence appended. */
	snprintf(full, sizeof(full), "%s failed: the collective timed out: %s",
	         j->kind == LONE_REG ? "AllReduce" : j->kind == LONE_SEND ? "Send" : "Recv", pattern);
	dfcclResult_t ae = dfcclSuccess;
	if (j->kind == LONE_REG) {
		/* dfcclWait says what failed and why, as dfcclCommSynchronize
		 * does; the async error reports the run's failure, explained,
		 * until a dfcclCommSynchronize has returned it. */
		if (!text_matches(err, full))
			RANK_FAIL("wait: '%s' is not '%s'", err, full);
		if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess || ae != dfcclTimeout ||
		    !text_matches(dfcclGetLastError(NULL), full))
			RANK_FAIL("async error %d before synchronize: '%s' is not '%s'", ae, dfcclGetLastError(NULL), full);
		r = dfcclCommSynchronize(comm);
		snprintf(err, sizeof(err), "%s", dfcclGetLastError(NULL));
	}
	if (r != dfcclTimeout || !text_matches(err, full))
		RANK_FAIL("synchronize %d: '%s' is not '%s'", r, err, full);
	/* Then the communicator's own error: the sentence alone. */
	if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess || ae != dfcclTimeout ||
	    !text_matches(dfcclGetLastError(NULL), pattern))
		RANK_FAIL("async error %d: '%s' is not '%s'", ae, dfcclGetLastError(NULL), pattern);
	dfcclCommAbort(comm);
	return 0;
}

/* A pipe, into its read and write ends. */
static void pipe_ends(int *rd, int *wr)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	*rd = fds[0];
	*wr = fds[1];
}

static void run_lone(enum lone_kind kind, int nranks, int waiter, const char *text)
{
	struct lone_job j = {.nranks = nranks, .kind = kind, .waiter = waiter, .text = text};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	pipe_ends(&j.pid_rd, &j.pid_wr);
	pipe_ends(&j.go_rd, &j.go_wr);
	pid_t p[8];
	for (int r = 0; r < nranks; r++)
		p[r] = child_run(lone_rank, &j, r);
	int rc = child_wait(p[waiter], 20000);
	for (int r = 0; r < nranks && rc != 0; r++)
		if (r != waiter && kill(p[r], SIGKILL) == 0)
			child_wait(p[r], 5000);
	assert_int_equal(rc, 0);
	for (int r = 0; r < nranks - 1; r++)
		assert_int_equal(write(j.go_wr, "g", 1), 1);
	for (int r = 0; r < nranks; r++)
		if (r != waiter)
			assert_int_equal(child_wait(p[r], 10000), 0);
	int fds[] = {j.pid_rd, j.pid_wr, j.go_rd, j.go_wr};
	for (int k = 0; k < 4; k++)
		close(fds[k]);
}

static void test_send_timeout(void **state)
{
	(void)state;
	run_lone(LONE_SEND, 2, 0,
	         "communicator {n}: Send #2 from rank 0 to rank 1 (1024 elements of float32) timed out after {n} ms "
	         "without progress (timeout 1000 ms); peer that never submitted the matching Recv: 1 (pid %d, device 1, "
	         "running: heartbeat {n} s ago)");
}

static void test_recv_timeout(void **state)
{
	(void)state;
	run_lone(LONE_RECV, 2, 1,
	         "communicator {n}: Recv #2 by rank 1 from rank 0 (1024 elements of float32) timed out after {n} ms "
	         "without progress (timeout 1000 ms); peer that never submitted the matching Send: 0 (pid %d, device 0, "
	         "running: heartbeat {n} s ago)");
}

static void test_registered_timeout(void **state)
{
	(void)state;
	run_lone(LONE_REG, 3, 0,
	         "communicator {n}: registered collective 7 (AllReduce) run #2 (1024 elements of float32) timed out "
	         "after {n} ms without progress (timeout 1000 ms); ranks that never submitted it: 1 (pid %d, device 1, "
	         "running: heartbeat {n} s ago); 2 (pid %d, device 0, running: heartbeat {n} s ago)");
}

static void job_init(struct job *j)
{
	memset(j, 0, sizeof(*j));
	assert_int_equal(dfcclGetUniqueId(&j->id), dfcclSuccess);
	j->nranks = 2;
	j->pid_fd = j->pid_rd = j->ready_fd = j->go_fd = -1;
	j->warmup = 2;
	j->expect = dfcclSuccess;
}

/* Where the daemon writes the recorders of timed-out communicators. */
static char fr_dir[64];

static int daemon_setup_faults(void **state)
{
	/* daemon_teardown frees it. */
	struct daemon_proc *d = calloc(1, sizeof(*d));
	snprintf(fr_dir, sizeof(fr_dir), "/tmp/dfccl-fr-XXXXXX");
	if (!d || !mkdtemp(fr_dir))
		return -1;
	*state = d;
	return daemon_start(d, 2, "--heartbeat-stale-ms", "500", "--watch-interval-ms", "50", "--flight-recorder-dir",
	                    fr_dir, NULL) == 0 ? 0 : -1;
}

static dfccl_envelope *request(struct daemon_proc *d, dfccl_envelope *env)
{
	struct raw_client c;
	assert_int_equal(raw_connect(&c, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	dfccl_envelope *r = raw_request(&c, env, NULL, 0, NULL, NULL);
	raw_close(&c);
	assert_non_null(r);
	return r;
}

static dfccl_envelope *query_kind(struct daemon_proc *d, int kind)
{
	Dfccl__V1__Query q = DFCCL__V1__QUERY__INIT;
	q.kind = kind;
	dfccl_envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY;
	env.query = &q;
	dfccl_envelope *r = request(d, &env);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY);
	return r;
}

static uint64_t the_comm_id(struct daemon_proc *d)
{
	dfccl_envelope *r = query_kind(d, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
	assert_int_equal(r->query_reply->n_comms, 1);
	uint64_t id = r->query_reply->comms[0]->comm_id;
	frame_envelope_free(r);
	return id;
}

static dfccl_envelope *flight_dump(struct daemon_proc *d, uint64_t comm_id)
{
	Dfccl__V1__FlightDump fd = DFCCL__V1__FLIGHT_DUMP__INIT;
	fd.comm_id = comm_id;
	dfccl_envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_FLIGHT_DUMP;
	env.flight_dump = &fd;
	return request(d, &env);
}

/* Runs dfcclctl with args into out (its stdout); returns its exit code. */
static int ctl(struct daemon_proc *d, const char *const *args, char *out, size_t len)
{
	const char *argv[8] = {DFCCLCTL_PATH, "--socket", d->socket};
	int n = 3;
	for (int i = 0; args[i] && n < 7; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	char path[128];
	snprintf(path, sizeof(path), "%s/ctl.out", d->dir);
	pid_t p = child_exec(DFCCLCTL_PATH, argv, path, "/dev/null");
	assert_true(p > 0);
	int rc = child_wait(p, 10000);
	read_text_file(path, out, len);
	return rc;
}

/* ------------------------------------------------------------ tests */

static void test_sigstopped_rank_named(void **state)
{
	(void)state;
	struct job j;
	job_init(&j);
	int pids[2];
	assert_int_equal(pipe(pids), 0);
	j.pid_fd = pids[1];
	j.timeout_ms = TIMEOUT_MS;
	j.stop_self = 1;
	j.expect = dfcclTimeout;
	j.pid_rd = pids[0];
	j.peer_state = "stopped";
	j.expect_msg[0] = "AllReduce #3 (1024 elements of float32)";
	j.expect_msg[1] = "never submitted it";
	/* The communicator is named once: the daemon's sentence starts with
	 * it, and the library adds nothing in front. */
	j.expect_text = "communicator {n}: AllReduce #3 (1024 elements of float32) timed out after {n} ms without "
	                "progress (timeout 1000 ms); rank that never submitted it: 1 (pid %d, device 1, stopped or hung: "
	                "no heartbeat for {n} s)";
	pid_t victim = child_run(rank_main, &j, 1);
	pid_t r0 = child_run(rank_main, &j, 0);
	assert_int_equal(child_wait(r0, 20000), 0);
	kill(victim, SIGKILL);
	assert_int_equal(child_wait(victim, 5000), 128 + SIGKILL);
	/* The recorder of the timed-out communicator went into the folder. */
	char cmd[160], out[256] = "";
	snprintf(cmd, sizeof(cmd), "grep -l '\"timed-out\"' %s/comm-*.json 2>/dev/null | head -n 1", fr_dir);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	assert_non_null(fgets(out, sizeof(out), p));
	pclose(p);
	close(pids[0]);
	close(pids[1]);
}

static void test_missing_rank_named(void **state)
{
	(void)state;
	struct job j;
	job_init(&j);
	int pids[2], go[2];
	assert_int_equal(pipe(pids), 0);
	assert_int_equal(pipe(go), 0);
	j.pid_fd = pids[1];
	j.go_fd = go[0];
	j.timeout_ms = TIMEOUT_MS;
	j.expect = dfcclTimeout;
	j.pid_rd = pids[0];
	j.peer_state = "running";
	j.expect_msg[0] = "AllReduce #3";
	j.expect_text = "communicator {n}: AllReduce #3 (1024 elements of float32) timed out after {n} ms without "
	                "progress (timeout 1000 ms); rank that never submitted it: 1 (pid %d, device 1, running: "
	                "heartbeat {n} s ago)";
	pid_t r1 = child_run(rank_main, &j, 1);
	pid_t r0 = child_run(rank_main, &j, 0);
	assert_int_equal(child_wait(r0, 20000), 0);
	assert_int_equal(write(go[1], "g", 1), 1);
	assert_int_equal(child_wait(r1, 10000), 0);
	close(pids[0]);
	close(pids[1]);
	close(go[0]);
	close(go[1]);
}

static void test_stuck_shows_missing_rank(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j);
	int pids[2], go[2];
	assert_int_equal(pipe(pids), 0);
	assert_int_equal(pipe(go), 0);
	j.pid_fd = pids[1];
	j.go_fd = go[0];
	j.late_submit = 1;
	j.timeout_ms = 0; /* no timeout: it stays stuck until rank 1 comes */
	char out[8192];
	const char *stuck[] = {"stuck", NULL};
	assert_int_equal(ctl(d, stuck, out, sizeof(out)), 0);
	assert_string_equal(out, "");
	pid_t r1 = child_run(rank_main, &j, 1);
	pid_t r0 = child_run(rank_main, &j, 0);
	pid_t pid1;
	assert_int_equal(read(pids[0], &pid1, sizeof(pid1)), sizeof(pid1));
	uint64_t comm_id = 0;
	int found = 0;
	for (uint64_t deadline = now_ms() + 10000; now_ms() < deadline && !found; usleep(50000)) {
		dfccl_envelope *r = query_kind(d, DFCCL__V1__QUERY_KIND__QUERY_STUCK);
		const Dfccl__V1__QueryReply *q = r->query_reply;
		if (q->n_stuck == 1 && q->stuck[0]->seq == 3) {
			const Dfccl__V1__StuckInfo *si = q->stuck[0];
			found = 1;
			comm_id = si->comm_id;
			assert_int_equal(si->kind, DFCCL__V1__STUCK_KIND__STUCK_COLLECTIVE);
			assert_string_equal(si->op, "AllReduce");
			assert_int_equal(si->count, COUNT);
			assert_int_equal(si->n_missing, 1);
			assert_int_equal(si->missing[0], 1);
			assert_int_equal(si->n_ranks, 2);
			assert_int_equal(si->ranks[1]->pid, pid1);
			assert_string_equal(si->ranks[1]->state, "missing");
			assert_string_not_equal(si->ranks[0]->state, "missing");
			assert_int_equal(si->timeout_ms, 0);
		}
		frame_envelope_free(r);
	}
	assert_true(found);
	assert_int_equal(ctl(d, stuck, out, sizeof(out)), 0);
	char want[64];
	snprintf(want, sizeof(want), "communicator %llu", (unsigned long long)comm_id);
	assert_non_null(strstr(out, want));
	assert_non_null(strstr(out, "missing"));
	/* Rank 1 comes: both complete with correct sums, nothing is stuck. */
	assert_int_equal(write(go[1], "g", 1), 1);
	assert_int_equal(child_wait(r1, 10000), 0);
	assert_int_equal(child_wait(r0, 10000), 0);
	usleep(200000);
	dfccl_envelope *r = query_kind(d, DFCCL__V1__QUERY_KIND__QUERY_STUCK);
	assert_int_equal(r->query_reply->n_stuck, 0);
	frame_envelope_free(r);
	assert_int_equal(ctl(d, stuck, out, sizeof(out)), 0);
	assert_string_equal(out, "");
	close(pids[0]);
	close(pids[1]);
	close(go[0]);
	close(go[1]);
}

/* ------------------------------------------------------------ every stuck instance */

/*
 * Three ranks, one registered all-reduce (id MIX_COLL) run once by all.
 * Then rank 0 runs it again and sends a message to rank 2, rank 1 runs it
 * again, and rank 2 does nothing until `go`: run #2 of MIX_COLL misses
 * rank 2, and message #1 from rank 0 to rank 2 misses its receive. With no
 * timeout rank 2 then runs and receives, and everything completes,
 * checked; with a timeout the others see it fail, and rank 2 finds the
 * failure as its communicator's error.
 */
#define MIX_COLL 7

struct mix_job {
	dfcclUniqueId id;
	int timeout_ms;
	int pid_wr, pid_rd; /* every rank writes (rank, pid) once warmed up */
	int done_wr, done_rd; /* ranks 0 and 1 write one byte after their timeout */
	int go_rd, go_wr;   /* each rank reads one byte before it goes on */
};

static int mix_run(dfcclComm_t comm, float *buf, dfcclRequest_t *req, int rank)
{
	if (dfcclRunCollective(comm, MIX_COLL, buf, buf + COUNT, NULL, NULL, req) != dfcclSuccess)
		RANK_FAIL("run: %s", dfcclGetLastError(NULL));
	return 0;
}

/* The all-reduce of MIX_COLL into buf + COUNT, checked: ranks 1 + 2 + 3. */
static int mix_check(const float *buf, const char *what, int rank)
{
	for (int i = 0; i < COUNT; i++)
		if (buf[COUNT + i] != 6.0f * (float)(i % 3 + 1))
			RANK_FAIL("%s: element %d is %g, expected %g", what, i, buf[COUNT + i], 6.0f * (float)(i % 3 + 1));
	return 0;
}

/* Ranks 0 and 1 after their pending run (and rank 0's send) ended: they
 * completed, checked, or timed out. */
static int mix_finish(const struct mix_job *j, dfcclComm_t comm, float *buf, dfcclRequest_t req, int rank)
{
	dfcclResult_t w = dfcclWait(req);
	dfcclResult_t s = dfcclCommSynchronize(comm);
	dfcclResult_t want = j->timeout_ms ? dfcclTimeout : dfcclSuccess;
	if (w != want || s != want)
		RANK_FAIL("wait %d, synchronize %d (%s), expected %d", w, s, dfcclGetLastError(NULL), want);
	if (!j->timeout_ms)
		return mix_check(buf, "run #2", rank);
	char b = 'd', g;
	if (write(j->done_wr, &b, 1) != 1 || read(j->go_rd, &g, 1) != 1)
		RANK_FAIL("pipes");
	return 0;
}

/* A failed communicator is aborted, a healthy one destroyed. */
static int mix_end(const struct mix_job *j, dfcclComm_t comm, int rank)
{
	if (j->timeout_ms) {
		dfcclCommAbort(comm);
		return 0;
	}
	if (dfcclCommDestroy(comm) != dfcclSuccess)
		RANK_FAIL("destroy: %s", dfcclGetLastError(NULL));
	return 0;
}

static int mix_rank(void *arg, int rank)
{
	struct mix_job *j = arg;
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	cfg.timeoutMs = j->timeout_ms;
	dfcclComm_t comm = NULL;
	float *buf = NULL;
	dfcclRequest_t req = NULL;
	dfcclCollDesc_t d = {dfcclCollAllReduce, COUNT, dfcclFloat, dfcclSum, 0, 0};
	close(j->go_wr); /* so a test that ends early ends the reads of go too */
	if (dfcclSetDevice(rank % 2) != dfcclSuccess || dfcclCommInitRankConfig(&comm, 3, j->id, rank, &cfg) !=
	    dfcclSuccess || dfcclMemAlloc((void **)&buf, 3 * COUNT * sizeof(float)) != dfcclSuccess ||
	    dfcclRegisterCollective(comm, MIX_COLL, &d) != dfcclSuccess)
		RANK_FAIL("set-up: %s", dfcclGetLastError(NULL));
	for (int i = 0; i < COUNT; i++)
		buf[i] = (float)(rank + 1) * (float)(i % 3 + 1);
	if (mix_run(comm, buf, &req, rank) || dfcclWait(req) != dfcclSuccess || mix_check(buf, "run #1", rank))
		RANK_FAIL("run #1: %s", dfcclGetLastError(NULL));
	memset(buf + COUNT, 0, COUNT * sizeof(float));
	pid_t me[2] = {rank, getpid()};
	if (write(j->pid_wr, me, sizeof(me)) != sizeof(me))
		RANK_FAIL("pid pipe");
	if (rank < 2) {
		if (mix_run(comm, buf, &req, rank))
			return 1;
		if (rank == 0 && dfcclSend(buf, COUNT, dfcclFloat, 2, comm, NULL) != dfcclSuccess)
			RANK_FAIL("send: %s", dfcclGetLastError(NULL));
		if (mix_finish(j, comm, buf, req, rank))
			return 1;
		return mix_end(j, comm, rank);
	}
	char g;
	if (read(j->go_rd, &g, 1) != 1)
		RANK_FAIL("go pipe");
	if (j->timeout_ms) {
		dfcclResult_t ae = dfcclSuccess;
		if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess || ae != dfcclTimeout)
			RANK_FAIL("async error %d (%s), expected dfcclTimeout", ae, dfcclGetLastError(NULL));
		return mix_end(j, comm, rank);
	}
	if (mix_run(comm, buf, &req, rank) ||
	    dfcclRecv(buf + 2 * COUNT, COUNT, dfcclFloat, 0, comm, NULL) != dfcclSuccess ||
	    dfcclWait(req) != dfcclSuccess || dfcclCommSynchronize(comm) != dfcclSuccess)
		RANK_FAIL("late run and receive: %s", dfcclGetLastError(NULL));
	if (mix_check(buf, "run #2", rank))
		return 1;
	for (int i = 0; i < COUNT; i++)
		if (buf[2 * COUNT + i] != (float)(i % 3 + 1))
			RANK_FAIL("received element %d is %g, expected %g", i, buf[2 * COUNT + i], (float)(i % 3 + 1));
	return mix_end(j, comm, rank);
}

/* One stuck instance in a line, the same from the protobuf message and
 * from dfcclctl's JSON: "registered 7 #2 AllReduce 1024 float32 timeout
 * 0: 0 posted 4242, 1 posted 4243, 2 missing 4244; missing 2". */
static void mix_line(char *out, size_t len, const char *kind, unsigned coll_id, unsigned src, unsigned dst,
                     unsigned long long seq, const char *op, unsigned long long count, const char *dtype,
                     long long timeout)
{
	snprintf(out, len, "%s %u %u>%u #%llu %s %llu %s timeout %lld:", kind, coll_id, src, dst, seq, op, count, dtype,
	         timeout);
}

static void mix_append(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void mix_append(char *out, size_t len, const char *fmt, ...)
{
	size_t off = strlen(out);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(out + off, len - off, fmt, ap);
	va_end(ap);
}

static const char *mix_kind_name(int kind)
{
	return kind == DFCCL__V1__STUCK_KIND__STUCK_REGISTERED ? "registered"
	       : kind == DFCCL__V1__STUCK_KIND__STUCK_MESSAGE  ? "message"
	                                                       : "collective";
}

/* The instances of reply q, one line each, separated by " | ". */
static void mix_from_reply(const Dfccl__V1__QueryReply *q, uint64_t comm_id, char *out, size_t len)
{
	out[0] = '\0';
	for (size_t i = 0; i < q->n_stuck; i++) {
		const Dfccl__V1__StuckInfo *si = q->stuck[i];
		char line[512];
		mix_line(line, sizeof(line), mix_kind_name(si->kind), si->coll_id, si->src, si->dst,
		         (unsigned long long)si->seq, si->op, (unsigned long long)si->count, si->dtype,
		         (long long)si->timeout_ms);
		mix_append(out, len, "%s%s%s", i ? " | " : "", si->comm_id == comm_id ? "" : "other comm ", line);
		for (size_t k = 0; k < si->n_ranks; k++)
			mix_append(out, len, "%s %u %s %d", k ? "," : "", si->ranks[k]->rank, si->ranks[k]->state,
			           (int)si->ranks[k]->pid);
		mix_append(out, len, "; missing");
		for (size_t k = 0; k < si->n_missing; k++)
			mix_append(out, len, " %u", si->missing[k]);
	}
}

/* The same from `dfcclctl --json stuck`. */
static void mix_from_json(const char *text, uint64_t comm_id, char *out, size_t len)
{
	json_error_t err;
	json_t *root = json_loads(text, 0, &err);
	json_t *list = json_object_get(root, "stuck");
	snprintf(out, len, "%s", json_is_array(list) ? "" : "not a JSON object with a \"stuck\" list");
	for (size_t i = 0; json_is_array(list) && i < json_array_size(list); i++) {
		json_t *si = json_array_get(list, i), *ranks = json_object_get(si, "ranks");
		json_t *missing = json_object_get(si, "missing");
		char line[512];
		mix_line(line, sizeof(line), json_string_value(json_object_get(si, "kind")),
		         (unsigned)json_integer_value(json_object_get(si, "coll_id")),
		         (unsigned)json_integer_value(json_object_get(si, "src")),
		         (unsigned)json_integer_value(json_object_get(si, "dst")),
		         (unsigned long long)json_integer_value(json_object_get(si, "seq")),
		         json_string_value(json_object_get(si, "op")),
		         (unsigned long long)json_integer_value(json_object_get(si, "count")),
		         json_string_value(json_object_get(si, "dtype")),
		         (long long)json_integer_value(json_object_get(si, "timeout_ms")));
		uint64_t id = (uint64_t)json_integer_value(json_object_get(si, "comm_id"));
		mix_append(out, len, "%s%s%s", i ? " | " : "", id == comm_id ? "" : "other comm ", line);
		for (size_t k = 0; k < json_array_size(ranks); k++) {
			json_t *r = json_array_get(ranks, k);
			mix_append(out, len, "%s %u %s %d", k ? "," : "",
			           (unsigned)json_integer_value(json_object_get(r, "rank")),
			           json_string_value(json_object_get(r, "state")),
			           (int)json_integer_value(json_object_get(r, "pid")));
		}
		mix_append(out, len, "; missing");
		for (size_t k = 0; k < json_array_size(missing); k++)
			mix_append(out, len, " %u", (unsigned)json_integer_value(json_array_get(missing, k)));
	}
	json_decref(root);
}

/* `dfcclctl stuck` as text: exactly, except for the numbers that change
 * ({n}), with every run of blanks as one space. */
static void squeeze(const char *in, char *out, size_t len)
{
	size_t o = 0;
	for (; *in && o + 1 < len; in++) {
		if (*in == ' ' && o && out[o - 1] == ' ')
			continue;
		if (*in == ' ' && o && out[o - 1] == '\n')
			continue;
		out[o++] = *in;
	}
	out[o] = '\0';
}

static void mix_text(uint64_t comm_id, const pid_t *pid, int timeout_ms, char *out, size_t len)
{
	char to[32];
	snprintf(to, sizeof(to), timeout_ms ? "{n}s" : "none");
	snprintf(out, len,
	         "communicator %llu (uid %u): registered collective 7 (AllReduce) run #2, 1024 elements of float32, "
	         "waiting {n}s (no progress for {n}s; timeout %s), {n} preemptions meanwhile\n"
	         "RANK STATE PID DEVICE SESSION HEARTBEAT\n"
	         "0 posted %d 0 {n} {n}s ago\n"
	         "1 posted %d 1 {n} {n}s ago\n"
	         "2 missing %d 0 {n} {n}s ago\n"
	         "\n"
	         "communicator %llu (uid %u): Send #1 from rank 0 to rank 2, 1024 elements of float32, "
	         "waiting {n}s (no progress for {n}s; timeout %s), {n} preemptions meanwhile\n"
	         "RANK STATE PID DEVICE SESSION HEARTBEAT\n"
	         "0 posted %d 0 {n} {n}s ago\n"
	         "2 missing %d 0 {n} {n}s ago\n",
	         (unsigned long long)comm_id, (unsigned)getuid(), to, (int)pid[0], (int)pid[1], (int)pid[2],
	         (unsigned long long)comm_id, (unsigned)getuid(), to, (int)pid[0], (int)pid[2]);
}

/* Polls the stuck query until it lists nothing (after the watcher's next
 * ticks), then checks that dfcclctl prints nothing either way. */
static void mix_expect_none(struct daemon_proc *d)
{
	char got[4096] = "?", out[4096];
	for (uint64_t deadline = now_ms() + 5000; now_ms() < deadline && got[0]; usleep(50000)) {
		dfccl_envelope *r = query_kind(d, DFCCL__V1__QUERY_KIND__QUERY_STUCK);
		mix_from_reply(r->query_reply, 0, got, sizeof(got));
		frame_envelope_free(r);
	}
	assert_string_equal(got, "");
	const char *text[] = {"stuck", NULL}, *json[] = {"--json", "stuck", NULL};
	assert_int_equal(ctl(d, text, out, sizeof(out)), 0);
	assert_string_equal(out, "");
	assert_int_equal(ctl(d, json, out, sizeof(out)), 0);
	mix_from_json(out, 0, got, sizeof(got));
	assert_string_equal(got, "");
}

static void run_mix(struct daemon_proc *d, int timeout_ms)
{
	struct mix_job j = {.timeout_ms = timeout_ms};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	pipe_ends(&j.pid_rd, &j.pid_wr);
	pipe_ends(&j.done_rd, &j.done_wr);
	pipe_ends(&j.go_rd, &j.go_wr);
	pid_t p[3], pid[3] = {0};
	for (int r = 0; r < 3; r++)
		p[r] = child_run(mix_rank, &j, r);
	for (int k = 0; k < 3; k++) {
		pid_t rp[2];
		assert_int_equal(read(j.pid_rd, rp, sizeof(rp)), sizeof(rp));
		assert_true(rp[0] >= 0 && rp[0] < 3);
		pid[rp[0]] = rp[1];
	}
	uint64_t comm_id = the_comm_id(d);
	char want[1024], got[4096] = "", out[8192];
	snprintf(want, sizeof(want),
	         "registered 7 0>0 #2 AllReduce 1024 float32 timeout %d: 0 posted %d, 1 posted %d, 2 missing %d; "
	         "missing 2 | message 0 0>2 #1 Send 1024 float32 timeout %d: 0 posted %d, 2 missing %d; missing 2",
	         timeout_ms, (int)pid[0], (int)pid[1], (int)pid[2], timeout_ms, (int)pid[0], (int)pid[2]);
	/* Both wait a tick, and each waiting rank's engine takes its part. */
	for (uint64_t deadline = now_ms() + 5000; now_ms() < deadline && strcmp(got, want); usleep(20000)) {
		dfccl_envelope *r = query_kind(d, DFCCL__V1__QUERY_KIND__QUERY_STUCK);
		mix_from_reply(r->query_reply, comm_id, got, sizeof(got));
		frame_envelope_free(r);
	}
	assert_string_equal(got, want);
	const char *json[] = {"--json", "stuck", NULL}, *text[] = {"stuck", NULL};
	assert_int_equal(ctl(d, json, out, sizeof(out)), 0);
	mix_from_json(out, comm_id, got, sizeof(got));
	assert_string_equal(got, want);
	char pattern[2048], squeezed[8192];
	assert_int_equal(ctl(d, text, out, sizeof(out)), 0);
	squeeze(out, squeezed, sizeof(squeezed));
	mix_text(comm_id, pid, timeout_ms, pattern, sizeof(pattern));
	if (!text_matches(squeezed, pattern))
		fail_msg("dfcclctl stuck printed\n%s\nexpected\n%s", squeezed, pattern);
	if (timeout_ms) {
		/* Ranks 0 and 1 saw the timeout; their communicator is failed
		 * but still there, and nothing of it is listed. */
		for (int k = 0; k < 2; k++) {
			char b;
			assert_int_equal(read(j.done_rd, &b, 1), 1);
		}
		mix_expect_none(d);
	}
	for (int k = 0; k < 3; k++)
		assert_int_equal(write(j.go_wr, "g", 1), 1);
	for (int r = 0; r < 3; r++)
		assert_int_equal(child_wait(p[r], 20000), 0);
	mix_expect_none(d);
	int fds[] = {j.pid_rd, j.pid_wr, j.done_rd, j.done_wr, j.go_rd, j.go_wr};
	for (int k = 0; k < 6; k++)
		close(fds[k]);
}

static void test_stuck_lists_runs_and_messages(void **state)
{
	run_mix(*state, 0);
}

static void test_stuck_clears_on_timeout(void **state)
{
	run_mix(*state, 3000);
}

static void test_recorder_keeps_killed_client(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j);
	int ready[2], go[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	j.ready_fd = ready[1];
	j.go_fd = go[0];
	j.warmup = 5;
	j.late_submit = 1;
	pid_t r1 = child_run(rank_main, &j, 1);
	struct job j0 = j;
	j0.go_fd = -1;
	j0.expect = dfcclRemoteError;
	pid_t r0 = child_run(rank_main, &j0, 0);
	for (int i = 0; i < 2; i++) {
		char b;
		assert_int_equal(read(ready[0], &b, 1), 1);
	}
	uint64_t comm_id = the_comm_id(d);
	usleep(300000); /* a few watch ticks */
	kill(r1, SIGKILL);
	assert_int_equal(child_wait(r1, 5000), 128 + SIGKILL);
	child_wait(r0, 10000); /* rank 0's own check of its failure is not this test's subject */
	usleep(200000);
	dfccl_envelope *r = flight_dump(d, comm_id);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_FLIGHT_DUMP_REPLY);
	const Dfccl__V1__FlightDumpReply *f = r->flight_dump_reply;
	assert_int_equal(f->comm_id, comm_id);
	assert_int_equal(f->nranks, 2);
	assert_int_equal(f->ranks[1]->pid, r1);
	uint64_t seen = 0;
	for (size_t i = 0; i < f->n_records; i++) {
		const Dfccl__V1__FlightRecord *x = f->records[i];
		if (x->rank != 1)
			continue;
		assert_string_equal(x->op, "AllReduce");
		assert_int_equal(x->count, COUNT);
		assert_string_equal(x->dtype, "float32");
		assert_string_equal(x->status, "ok");
		assert_true(x->submit_ms >= 0 && x->end_ms >= x->submit_ms);
		seen |= 1ull << x->seq;
	}
	/* Every one of the killed rank's five all-reduces, 1..5. */
	assert_int_equal(seen, 0x3eull);
	frame_envelope_free(r);
	char out[16384], id[32];
	snprintf(id, sizeof(id), "%llu", (unsigned long long)comm_id);
	const char *dump[] = {"--json", "dump", id, NULL};
	assert_int_equal(ctl(d, dump, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "\"records\""));
	assert_non_null(strstr(out, "\"AllReduce\""));
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

static void test_bad_input(void **state)
{
	struct daemon_proc *d = *state;
	dfccl_envelope *r = flight_dump(d, 987654321);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_ERROR);
	assert_int_equal(r->error->code, DFCCL__V1__ERROR_CODE__ERROR_NOT_FOUND);
	assert_non_null(strstr(r->error->message, "no flight recorder for communicator 987654321"));
	frame_envelope_free(r);
	char out[1024];
	const char *no_id[] = {"dump", NULL}, *bad_id[] = {"dump", "abc", NULL}, *unknown[] = {"dump", "424242", NULL};
	assert_int_equal(ctl(d, no_id, out, sizeof(out)), 2);
	assert_int_equal(ctl(d, bad_id, out, sizeof(out)), 2);
	assert_int_equal(ctl(d, unknown, out, sizeof(out)), 1);
	/* A collective timeout below -1 is refused by the daemon. */
	struct raw_client c;
	assert_int_equal(raw_connect(&c, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	Dfccl__V1__AttachDevice a = DFCCL__V1__ATTACH_DEVICE__INIT;
	dfccl_envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ATTACH;
	env.attach = &a;
	int fds[8];
	unsigned nfds = 0;
	r = raw_request(&c, &env, NULL, 0, fds, &nfds);
	assert_non_null(r);
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	frame_envelope_free(r);
	uint8_t uid[128] = {1, 2, 3};
	Dfccl__V1__CommInit ci = DFCCL__V1__COMM_INIT__INIT;
	ci.unique_id.data = uid;
	ci.unique_id.len = sizeof(uid);
	ci.nranks = 2;
	ci.coll_timeout_ms = -5;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_INIT;
	env.comm_init = &ci;
	r = raw_request(&c, &env, NULL, 0, NULL, NULL);
	assert_non_null(r);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_ERROR);
	assert_int_equal(r->error->code, DFCCL__V1__ERROR_CODE__ERROR_INVALID_ARGUMENT);
	assert_non_null(strstr(r->error->message, "collective timeout -5 ms"));
	frame_envelope_free(r);
	raw_close(&c);
	/* A bad DFCCL_TIMEOUT_MS fails the init with a sentence naming it. */
	setenv("DFCCL_TIMEOUT_MS", "soon", 1);
	dfcclUniqueId id;
	assert_int_equal(dfcclGetUniqueId(&id), dfcclSuccess);
	dfcclComm_t comm;
	assert_int_equal(dfcclCommInitRank(&comm, 1, id, 0), dfcclInvalidArgument);
	assert_non_null(strstr(dfcclGetLastError(NULL), "DFCCL_TIMEOUT_MS=soon"));
	unsetenv("DFCCL_TIMEOUT_MS");
}

static int daemon_teardown_faults(void **state)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", fr_dir);
	int rc = daemon_teardown(state);
	if (system(cmd) != 0)
		return -1;
	return rc;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_sigstopped_rank_named, daemon_setup_faults, daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_missing_rank_named, daemon_setup_faults, daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_stuck_shows_missing_rank, daemon_setup_faults, daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_stuck_lists_runs_and_messages, daemon_setup_faults,
	                                    daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_stuck_clears_on_timeout, daemon_setup_faults, daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_recorder_keeps_killed_client, daemon_setup_faults,
	                                    daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_bad_input, daemon_setup_faults, daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_send_timeout, daemon_setup_faults, daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_recv_timeout, daemon_setup_faults, daemon_teardown_faults),
	    cmocka_unit_test_setup_teardown(test_registered_timeout, daemon_setup_faults, daemon_teardown_faults),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
