/*
 * Communicators and faults through libdfccl, with one client process per
 * rank as in real jobs: init across processes, init timeouts that name the
 * missing ranks, users kept apart (SO_PEERCRED), a SIGKILLed client, a
 * SIGKILLed worker, and daemon shutdown. The test process itself never
 * initialises libdfccl, so every forked rank starts clean; it watches the
 * daemon over the raw protocol.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl.h"
#include "harness.h"

#define NOBODY 65534

/* ------------------------------------------------------------ rank bodies */

struct job {
	dfcclUniqueId id;
	int nranks;
	int device;          /* device of every rank, or -1: rank % 2 */
	int init_timeout_ms;
	int ready_fd;        /* rank writes one byte when its init succeeded */
	int go_fd;           /* rank reads one byte before it continues */
	int expect;          /* the init result the rank expects */
	const char *expect_msg;
	int wait_async;      /* after init: wait this long (ms) for an async error */
	int expect_async;    /* ... and expect this result (dfcclSuccess: none) */
	int drop_to_nobody;
};

static int rank_main(void *arg, int rank)
{
	struct job *j = arg;
	if (j->drop_to_nobody && (setgroups(0, NULL) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0))
		RANK_FAIL("cannot drop privileges: %s", strerror(errno));
	int dev = j->device >= 0 ? j->device : rank % 2;
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	cfg.device = dev;
	cfg.initTimeoutMs = j->init_timeout_ms;
	dfcclComm_t comm = NULL;
	dfcclResult_t r = dfcclCommInitRankConfig(&comm, j->nranks, j->id, rank, &cfg);
	if ((int)r != j->expect)
		RANK_FAIL("init returned %d (%s: %s), expected %d", r, dfcclGetErrorString(r), dfcclGetLastError(NULL),
		     j->expect);
	if (j->expect_msg && !strstr(dfcclGetLastError(NULL), j->expect_msg))
		RANK_FAIL("error message '%s' lacks '%s'", dfcclGetLastError(NULL), j->expect_msg);
	if (r != dfcclSuccess)
		return 0;
	int n = -1, me = -1, d = -1;
	if (dfcclCommCount(comm, &n) != dfcclSuccess || n != j->nranks)
		RANK_FAIL("count %d", n);
	if (dfcclCommUserRank(comm, &me) != dfcclSuccess || me != rank)
		RANK_FAIL("rank %d", me);
	if (dfcclCommDevice(comm, &d) != dfcclSuccess || d != dev)
		RANK_FAIL("device %d, expected %d", d, dev);
	char b = 'r';
	if (j->ready_fd >= 0 && write(j->ready_fd, &b, 1) != 1)
		RANK_FAIL("ready pipe");
	if (j->go_fd >= 0 && read(j->go_fd, &b, 1) != 1)
		RANK_FAIL("go pipe");
	if (j->wait_async) {
		dfcclResult_t ae = dfcclSuccess;
		uint64_t deadline = now_ms() + (uint64_t)j->wait_async;
		while (now_ms() < deadline) {
			if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess)
				RANK_FAIL("dfcclCommGetAsyncError failed");
			if (ae != dfcclSuccess)
				break;
			usleep(2000);
		}
		if ((int)ae != j->expect_async)
			RANK_FAIL("async error %d (%s), expected %d", ae, dfcclGetErrorString(ae), j->expect_async);
		if (ae != dfcclSuccess) {
			dfcclCommAbort(comm);
			return 0;
		}
	}
	if (dfcclCommDestroy(comm) != dfcclSuccess)
		RANK_FAIL("destroy: %s", dfcclGetLastError(NULL));
	return 0;
}

static void job_init(struct job *j, int nranks)
{
	memset(j, 0, sizeof(*j));
	assert_int_equal(dfcclGetUniqueId(&j->id), dfcclSuccess);
	j->nranks = nranks;
	j->device = -1;
	j->ready_fd = j->go_fd = -1;
	j->expect = dfcclSuccess;
	j->expect_async = dfcclSuccess;
}

static void wait_ready(int fd, int n)
{
	for (int i = 0; i < n; i++) {
		char b;
		assert_int_equal(read(fd, &b, 1), 1);
	}
}

static dfccl_envelope *query(struct daemon_proc *d, int kind)
{
	dfccl_envelope *r = daemon_query(d, kind);
	assert_non_null(r);
	return r;
}

/* Waits until the daemon holds `sessions` sessions (not counting the
 * watcher) and `comms` communicators. */
static void wait_counts(struct daemon_proc *d, unsigned sessions, unsigned comms)
{
	uint64_t deadline = now_ms() + 5000;
	unsigned s = 0, c = 0;
	while (now_ms() < deadline) {
		dfccl_envelope *r = query(d, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
		s = r->query_reply->status->nsessions - 1;
		c = r->query_reply->status->ncomms + r->query_reply->status->npending_comms;
		frame_envelope_free(r);
		if (s == sessions && c == comms)
			return;
		usleep(10000);
	}
	fail_msg("daemon holds %u sessions and %u communicators, expected %u and %u", s, c, sessions, comms);
}

/* ------------------------------------------------------------ tests */

static void test_library_basics(void **state)
{
	struct daemon_proc *d = *state;
	(void)d;
	/* In a child: libdfccl keeps one connection per process. */
	pid_t p = fork();
	if (p == 0) {
		int n = 0;
		if (dfcclGetDeviceCount(&n) != dfcclSuccess || n != 2)
			_exit(1);
		int v = 0;
		if (dfcclGetVersion(&v) != dfcclSuccess || v != DFCCL_VERSION_CODE)
			_exit(2);
		for (int i = 0; i < dfcclNumResults; i++)
			if (!dfcclGetErrorString((dfcclResult_t)i) || !*dfcclGetErrorString((dfcclResult_t)i))
				_exit(3);
		dfcclUniqueId a, b;
		if (dfcclGetUniqueId(&a) || dfcclGetUniqueId(&b) || memcmp(&a, &b, sizeof(a)) == 0)
			_exit(4);
		_exit(0);
	}
	assert_int_equal(child_wait(p, 10000), 0);

	p = fork();
	if (p == 0) {
		setenv("DFCCL_SOCKET", "/nonexistent/dfccld.sock", 1);
		int n;
		if (dfcclGetDeviceCount(&n) != dfcclDaemonUnavailable)
			_exit(1);
		if (!strstr(dfcclGetLastError(NULL), "/nonexistent/dfccld.sock") ||
		    !strstr(dfcclGetLastError(NULL), "dfccld running"))
			_exit(2);
		_exit(0);
	}
	assert_int_equal(child_wait(p, 10000), 0);

	p = fork();
	if (p == 0) {
		setenv("DFCCL_PROTO_VERSION_OVERRIDE", "99", 1);
		int n;
		if (dfcclGetDeviceCount(&n) != dfcclVersionMismatch)
			_exit(1);
		if (!strstr(dfcclGetLastError(NULL), "version"))
			_exit(2);
		_exit(0);
	}
	assert_int_equal(child_wait(p, 10000), 0);
}

static void test_init_four_processes(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j, 4);
	int ready[2], go[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	j.ready_fd = ready[1];
	j.go_fd = go[0];
	pid_t pids[4];
	for (int r = 0; r < 4; r++)
		pids[r] = child_run(rank_main, &j, r);
	wait_ready(ready[0], 4);

	dfccl_envelope *q = query(d, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
	assert_int_equal(q->query_reply->n_comms, 1);
	const Dfccl__V1__CommInfo *ci = q->query_reply->comms[0];
	assert_string_equal(ci->state, "ready");
	assert_int_equal(ci->nranks, 4);
	assert_int_equal(ci->n_ranks, 4);
	assert_int_equal(ci->uid, getuid());
	for (size_t i = 0; i < ci->n_ranks; i++) {
		assert_int_equal(ci->ranks[i]->rank, i);
		assert_int_equal(ci->ranks[i]->pid, pids[i]);
		assert_int_equal(ci->ranks[i]->device, i % 2);
	}
	frame_envelope_free(q);

	assert_int_equal(write(go[1], "gggg", 4), 4);
	for (int r = 0; r < 4; r++)
		assert_int_equal(child_wait(pids[r], 10000), 0);
	wait_counts(d, 0, 0);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

static void test_init_timeout_names_missing_ranks(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j, 4);
	j.init_timeout_ms = 400;
	j.expect = dfcclTimeout;
	j.expect_msg = "missing ranks 1, 3";
	uint64_t t0 = now_ms();
	pid_t a = child_run(rank_main, &j, 0);
	pid_t b = child_run(rank_main, &j, 2);
	assert_int_equal(child_wait(a, 10000), 0);
	assert_int_equal(child_wait(b, 10000), 0);
	uint64_t took = now_ms() - t0;
	assert_true(took >= 400);
	assert_true(took < 5000);
	wait_counts(d, 0, 0);
	assert_true(daemon_log_contains(d, "missing ranks 1, 3") >= 1);

	/* Bad arguments fail at once with a clear message. */
	job_init(&j, 2);
	j.expect = dfcclInvalidArgument;
	pid_t c = child_run(rank_main, &j, 5);
	assert_int_equal(child_wait(c, 10000), 0);
}

static void test_other_uid_refused(void **state)
{
	struct daemon_proc *d = *state;
	if (geteuid() != 0) {
		print_message("skipped: dropping to another uid needs root\n");
		skip();
	}
	/* Rank 0 (root) creates the communicator; rank 1 runs as nobody and
	 * must be refused; rank 0 then times out waiting for it. */
	struct job owner;
	job_init(&owner, 2);
	owner.init_timeout_ms = 1500;
	owner.expect = dfcclTimeout;
	owner.expect_msg = "missing rank 1";
	pid_t a = child_run(rank_main, &owner, 0);
	wait_counts(d, 1, 1);

	struct job intruder = owner;
	intruder.drop_to_nobody = 1;
	intruder.expect = dfcclPermissionDenied;
	intruder.expect_msg = "another user";
	pid_t b = child_run(rank_main, &intruder, 1);
	assert_int_equal(child_wait(b, 10000), 0);
	assert_int_equal(child_wait(a, 10000), 0);

	/* The same uid (nobody) can of course build its own communicator: the
	 * daemon saw its real uid through SO_PEERCRED. */
	struct job own;
	job_init(&own, 2);
	own.drop_to_nobody = 1;
	int ready[2], go[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	own.ready_fd = ready[1];
	own.go_fd = go[0];
	pid_t p0 = child_run(rank_main, &own, 0);
	pid_t p1 = child_run(rank_main, &own, 1);
	wait_ready(ready[0], 2);
	dfccl_envelope *q = query(d, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
	assert_int_equal(q->query_reply->n_comms, 1);
	assert_int_equal(q->query_reply->comms[0]->uid, NOBODY);
	frame_envelope_free(q);
	q = query(d, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS);
	unsigned nobody_sessions = 0;
	for (size_t i = 0; i < q->query_reply->n_sessions; i++)
		nobody_sessions += q->query_reply->sessions[i]->uid == NOBODY;
	assert_int_equal(nobody_sessions, 2);
	frame_envelope_free(q);
	assert_int_equal(write(go[1], "gg", 2), 2);
	assert_int_equal(child_wait(p0, 10000), 0);
	assert_int_equal(child_wait(p1, 10000), 0);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

static void test_killed_client(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j, 3);
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	j.ready_fd = ready[1];
	j.wait_async = 5000;
	j.expect_async = dfcclRemoteError;
	pid_t survivors[2];
	survivors[0] = child_run(rank_main, &j, 0);
	survivors[1] = child_run(rank_main, &j, 1);
	struct job victim_job = j;
	int go[2];
	assert_int_equal(pipe(go), 0);
	victim_job.go_fd = go[0]; /* blocks forever: it will be killed */
	victim_job.wait_async = 0;
	pid_t victim = child_run(rank_main, &victim_job, 2);
	wait_ready(ready[0], 3);

	uint64_t t0 = now_ms();
	kill(victim, SIGKILL);
	assert_int_equal(child_wait(victim, 5000), 128 + SIGKILL);
	for (int i = 0; i < 2; i++)
		assert_int_equal(child_wait(survivors[i], 5000), 0);
	/* Survivors learned about it within a second. */
	assert_true(now_ms() - t0 < 1000 + 200);
	wait_counts(d, 0, 0);
	assert_true(daemon_log_contains(d, "disconnected") >= 1);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

static int worker_pid(struct daemon_proc *d, unsigned dev, unsigned *restarts, int *up)
{
	dfccl_envelope *q = query(d, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	const Dfccl__V1__DeviceInfo *di = q->query_reply->status->devices[dev];
	int pid = di->worker_pid;
	if (restarts)
		*restarts = di->worker_restarts;
	if (up)
		*up = di->worker_up;
	frame_envelope_free(q);
	return pid;
}

static void test_killed_worker(void **state)
{
	struct daemon_proc *d = *state;
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	/* Communicator A on device 0 loses its device; B on device 1 must not
	 * notice anything. */
	struct job a, b;
	job_init(&a, 2);
	a.device = 0;
	a.ready_fd = ready[1];
	a.wait_async = 5000;
	a.expect_async = dfcclDeviceLost;
	job_init(&b, 2);
	b.device = 1;
	b.ready_fd = ready[1];
	b.wait_async = 2500;
	b.expect_async = dfcclSuccess;
	pid_t pa[2], pb[2];
	for (int r = 0; r < 2; r++) {
		pa[r] = child_run(rank_main, &a, r);
		pb[r] = child_run(rank_main, &b, r);
	}
	wait_ready(ready[0], 4);
	int w0 = worker_pid(d, 0, NULL, NULL);
	int w1 = worker_pid(d, 1, NULL, NULL);
	assert_true(w0 > 0 && w1 > 0);
	uint64_t t0 = now_ms();
	kill(w0, SIGKILL);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(pa[r], 5000), 0);
	assert_true(now_ms() - t0 < 1000 + 200);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(pb[r], 10000), 0);

	/* The supervisor restarted worker 0 and never touched worker 1. */
	uint64_t deadline = now_ms() + 5000;
	unsigned restarts = 0;
	int up = 0, npid = 0;
	while (now_ms() < deadline) {
		npid = worker_pid(d, 0, &restarts, &up);
		if (up && restarts == 1)
			break;
		usleep(20000);
	}
	assert_true(up);
	assert_int_equal(restarts, 1);
	assert_true(npid != w0);
	unsigned r1 = 9;
	assert_int_equal(worker_pid(d, 1, &r1, NULL), w1);
	assert_int_equal(r1, 0);

	/* A new communicator on the restarted device works. */
	struct job c;
	job_init(&c, 2);
	c.device = 0;
	pid_t pc[2];
	for (int r = 0; r < 2; r++)
		pc[r] = child_run(rank_main, &c, r);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(pc[r], 10000), 0);
	close(ready[0]);
	close(ready[1]);
}

/*
 * A communicator whose ranks all join while the worker of their device is
 * down (here: killed, restarted 1 s later) waits for it instead of
 * failing, and works once it is up; one whose worker does not come back
 * within the init timeout says so.
 */
static void test_init_waits_for_worker(void **state)
{
	(void)state;
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 2, "--worker-restart-delay-ms", "1000", NULL), 0);
	int w0 = worker_pid(&d, 0, NULL, NULL);
	assert_true(w0 > 0);
	kill(w0, SIGKILL);
	int up = 1;
	for (uint64_t deadline = now_ms() + 2000; up && now_ms() < deadline;)
		worker_pid(&d, 0, NULL, &up);
	assert_false(up);
	struct job c;
	job_init(&c, 2);
	c.device = 0;
	pid_t pc[2];
	uint64_t t0 = now_ms();
	for (int r = 0; r < 2; r++)
		pc[r] = child_run(rank_main, &c, r);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(pc[r], 10000), 0);
	assert_true(now_ms() - t0 >= 300); /* it did wait for the restart */
	assert_int_equal(daemon_log_contains(&d, "waiting for the worker of device 0"), 1);

	/* Worker 0 killed again, with a restart delay beyond the init timeout. */
	assert_int_equal(daemon_stop(&d), 0);
	assert_int_equal(daemon_start(&d, 2, "--worker-restart-delay-ms", "5000", NULL), 0);
	kill(worker_pid(&d, 0, NULL, NULL), SIGKILL);
	up = 1;
	for (uint64_t deadline = now_ms() + 2000; up && now_ms() < deadline;)
		worker_pid(&d, 0, NULL, &up);
	job_init(&c, 2);
	c.device = 0;
	c.init_timeout_ms = 800;
	c.expect = dfcclTimeout;
	c.expect_msg = "worker for device 0 did not come up";
	for (int r = 0; r < 2; r++)
		pc[r] = child_run(rank_main, &c, r);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(pc[r], 10000), 0);
	assert_int_equal(daemon_stop(&d), 0);
}

static void test_shutdown_notifies_clients(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j, 2);
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	j.ready_fd = ready[1];
	j.wait_async = 5000;
	j.expect_async = dfcclDaemonUnavailable;
	pid_t p[2];
	for (int r = 0; r < 2; r++)
		p[r] = child_run(rank_main, &j, r);
	wait_ready(ready[0], 2);
	kill(d->pid, SIGTERM);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(p[r], 5000), 0);
	assert_int_equal(child_wait(d->pid, 10000), 0);
	d->pid = 0;
	close(ready[0]);
	close(ready[1]);
}

/* The settings a worker uses reach it: its command line carries the
 * daemon's values (without MPS: channels, not channels-mps). */
static void test_worker_settings(void **state)
{
	(void)state;
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 1, "--channels", "3", "--channels-mps", "5", "--kernel-idle-us", "4321",
	                              "--spin-head", "777", "--visit-bytes", "8M", "--chan-bytes", "64K",
	                              "--oneshot-bytes", "128K", NULL),
	                 0);
	int pid = worker_pid(&d, 0, NULL, NULL);
	assert_true(pid > 0);
	char path[64], cmd[4096];
	snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(cmd, 1, sizeof(cmd) - 1, f);
	fclose(f);
	for (size_t i = 0; i < n; i++)
		if (cmd[i] == '\0')
			cmd[i] = ' ';
	cmd[n] = '\0';
	assert_non_null(strstr(cmd, "--channels 3 "));
	assert_null(strstr(cmd, "--channels 5 "));
	assert_non_null(strstr(cmd, "--kernel-idle-us 4321 "));
	assert_non_null(strstr(cmd, "--spin-head 777 "));
	assert_non_null(strstr(cmd, "--visit-bytes 8388608 "));
	assert_non_null(strstr(cmd, "--chan-bytes 65536 "));
	assert_non_null(strstr(cmd, "--oneshot-bytes 131072 "));
	assert_int_equal(daemon_stop(&d), 0);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_library_basics, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_init_four_processes, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_init_timeout_names_missing_ranks, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_other_uid_refused, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_killed_client, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_killed_worker, daemon_setup2, daemon_teardown),
	    cmocka_unit_test(test_init_waits_for_worker),
	    cmocka_unit_test(test_worker_settings),
	    cmocka_unit_test_setup_teardown(test_shutdown_notifies_clients, daemon_setup2, daemon_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
