/*
 * Whose uid the workers run as (setting worker-user), through the real
 * daemon with the host engine and `worker-user job` forced, as under MPS:
 * an unused device's worker runs as the daemon's uid, parked; a job of uid A
 * gets workers of uid A on its devices (status and /proc/<pid>/status
 * agree, no supplementary group is left) and its collectives are correct
 * there; a job of uid B meanwhile is refused on every device with a message
 * that names A, and A's workers are not disturbed; once A has left, the
 * devices go back to the daemon's uid, and B gets workers of its own. A
 * daemon that is not root serves its own uid and refuses the others.
 *
 * Every step needs root (to act as other users): the test skips (77)
 * otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl.h"
#include "harness.h"

#define UID_A 65534u   /* nobody: a user with a name */
#define UID_B 3999002u /* a uid without a user name */
#define COUNT 4096

/* ------------------------------------------------------------ job ranks */

struct job {
	dfcclUniqueId id;
	int nranks;
	int device[2];      /* device of each rank */
	uid_t uid;          /* 0: stay root */
	int expect;         /* the init result */
	const char *words[4]; /* what a refusal must say (NULL-terminated) */
	int ready_fd;       /* one byte once init and a checked all-reduce are done */
	int go_fd;          /* one byte to leave */
};

/* An all-reduce (sum) of COUNT floats, checked against the sums computed
 * here: rank r contributes r * 1000 + i at index i. */
static int allreduce_checked(dfcclComm_t comm, int rank, int nranks)
{
	float *send = NULL, *recv = NULL;
	if (dfcclMemAlloc((void **)&send, COUNT * sizeof(float)) != dfcclSuccess ||
	    dfcclMemAlloc((void **)&recv, COUNT * sizeof(float)) != dfcclSuccess)
		RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
	for (int i = 0; i < COUNT; i++) {
		send[i] = (float)(rank * 1000 + i);
		recv[i] = -1.0f;
	}
	if (dfcclAllReduce(send, recv, COUNT, dfcclFloat, dfcclSum, comm, NULL) != dfcclSuccess ||
	    dfcclCommSynchronize(comm) != dfcclSuccess)
		RANK_FAIL("all-reduce: %s", dfcclGetLastError(NULL));
	for (int i = 0; i < COUNT; i++) {
		float want = (float)(1000 * nranks * (nranks - 1) / 2 + nranks * i);
		if (recv[i] != want)
			RANK_FAIL("all-reduce: element %d is %g, expected %g", i, recv[i], want);
	}
	dfcclMemFree(send);
	dfcclMemFree(recv);
	return 0;
}

static int rank_main(void *arg, int rank)
{
	struct job *j = arg;
	if (j->uid && (setgroups(0, NULL) < 0 || setgid(j->uid) < 0 || setuid(j->uid) < 0))
		RANK_FAIL("cannot become uid %u: %s", (unsigned)j->uid, strerror(errno));
	/* A rank never outlives the test, even one that failed half-way (set
	 * after the change of uid, which clears it). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	dfcclSetDevice(j->device[rank]); /* where dfcclMemAlloc puts buffers */
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	cfg.device = j->device[rank];
	dfcclComm_t comm = NULL;
	dfcclResult_t r = dfcclCommInitRankConfig(&comm, j->nranks, j->id, rank, &cfg);
	if ((int)r != j->expect)
		RANK_FAIL("init returned %d (%s: %s), expected %d", r, dfcclGetErrorString(r), dfcclGetLastError(NULL),
		     j->expect);
	for (int w = 0; w < 4 && j->words[w]; w++)
		if (!strstr(dfcclGetLastError(NULL), j->words[w]))
			RANK_FAIL("error '%s' lacks '%s'", dfcclGetLastError(NULL), j->words[w]);
	if (r != dfcclSuccess)
		return 0;
	if (allreduce_checked(comm, rank, j->nranks))
		return 1;
	char b = 'r';
	if (j->ready_fd >= 0 && write(j->ready_fd, &b, 1) != 1)
		RANK_FAIL("ready pipe");
	if (j->go_fd >= 0 && read(j->go_fd, &b, 1) != 1)
		RANK_FAIL("go pipe");
	/* The worker still serves after the others came and went. */
	if (allreduce_checked(comm, rank, j->nranks))
		return 1;
	if (dfcclCommDestroy(comm) != dfcclSuccess)
		RANK_FAIL("destroy: %s", dfcclGetLastError(NULL));
	return 0;
}

/* A job of nranks ranks (rank r on device r) run by uid, held after its
 * first all-reduce until job_release. */
struct held {
	struct job j;
	int ready[2], go[2];
	pid_t pid[2];
};

static void job_init(struct job *j, int nranks, uid_t uid)
{
	memset(j, 0, sizeof(*j));
	assert_int_equal(dfcclGetUniqueId(&j->id), dfcclSuccess);
	j->nranks = nranks;
	for (int r = 0; r < 2; r++)
		j->device[r] = r;
	j->uid = uid;
	j->expect = dfcclSuccess;
	j->ready_fd = j->go_fd = -1;
}

static void job_hold(struct held *h, int nranks, uid_t uid)
{
	job_init(&h->j, nranks, uid);
	/* Close-on-exec: a daemon started meanwhile must not hold them. */
	assert_int_equal(pipe2(h->ready, O_CLOEXEC), 0);
	assert_int_equal(pipe2(h->go, O_CLOEXEC), 0);
	h->j.ready_fd = h->ready[1];
	h->j.go_fd = h->go[0];
	for (int r = 0; r < nranks; r++)
		h->pid[r] = child_run(rank_main, &h->j, r);
	/* Only the ranks hold these ends: a rank that fails ends the wait. */
	close(h->ready[1]);
	close(h->go[0]);
	for (int r = 0; r < nranks; r++) {
		char b;
		assert_int_equal(read(h->ready[0], &b, 1), 1);
	}
}

static void job_release(struct held *h)
{
	assert_int_equal(write(h->go[1], "gg", (size_t)h->j.nranks), h->j.nranks);
	for (int r = 0; r < h->j.nranks; r++)
		assert_int_equal(child_wait(h->pid[r], 20000), 0);
	close(h->ready[0]);
	close(h->go[1]);
}

/* A one-rank job of uid on device, expected to be refused with words. */
static void job_refused(uid_t uid, int device, const char *w0, const char *w1, const char *w2)
{
	struct job j;
	job_init(&j, 1, uid);
	j.device[0] = device;
	j.expect = dfcclPermissionDenied;
	j.words[0] = w0;
	j.words[1] = w1;
	j.words[2] = w2;
	assert_int_equal(child_wait(child_run(rank_main, &j, 0), 20000), 0);
}

/* ------------------------------------------------------------ what the daemon says */

struct worker_view {
	int up, parked;
	unsigned uid, gid;
	int pid;
};

static struct worker_view worker_view(struct daemon_proc *d, unsigned device)
{
	dfccl_envelope *r = daemon_query(d, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	const Dfccl__V1__StatusInfo *st = r->query_reply->status;
	assert_true(device < st->n_devices);
	const Dfccl__V1__DeviceInfo *di = st->devices[device];
	struct worker_view v = {di->worker_up, di->worker_parked, di->worker_uid, di->worker_gid, di->worker_pid};
	frame_envelope_free(r);
	return v;
}

/* Waits until device's worker is up as uid, parked or not; returns its view. */
static struct worker_view wait_worker(struct daemon_proc *d, unsigned device, unsigned uid, int parked)
{
	uint64_t deadline = now_ms() + 10000;
	struct worker_view v;
	do {
		v = worker_view(d, device);
		if (v.up && v.pid > 0 && v.uid == uid && v.parked == parked)
			return v;
		usleep(10000);
	} while (now_ms() < deadline);
	daemon_dump_log(d);
	fail_msg("device %u: worker up %d, uid %u, parked %d; expected up as uid %u, parked %d", device, v.up, v.uid,
	         v.parked, uid, parked);
	return v;
}

/* The four ids of a "Uid:" or "Gid:" line of /proc/<pid>/status all equal
 * want, and "Groups:" is empty: what the kernel says the process is. */
static void expect_proc_ids(int pid, unsigned want_uid, unsigned want_gid)
{
	char path[64], text[4096];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	read_text_file(path, text, sizeof(text));
	unsigned u[4], g[4];
	const char *ul = strstr(text, "\nUid:"), *gl = strstr(text, "\nGid:"), *grl = strstr(text, "\nGroups:");
	assert_non_null(ul);
	assert_non_null(gl);
	assert_non_null(grl);
	assert_int_equal(sscanf(ul, "\nUid: %u %u %u %u", &u[0], &u[1], &u[2], &u[3]), 4);
	assert_int_equal(sscanf(gl, "\nGid: %u %u %u %u", &g[0], &g[1], &g[2], &g[3]), 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(u[i], want_uid);
		assert_int_equal(g[i], want_gid);
	}
	grl += strlen("\nGroups:");
	grl += strspn(grl, " \t");
	if (want_uid != 0 && *grl != '\n')
		fail_msg("worker %d keeps supplementary groups: %.40s", pid, grl);
}

/* `dfcclctl --json status` agrees on device's worker uid. */
static void expect_ctl_uid(struct daemon_proc *d, unsigned device, unsigned uid)
{
	char out[200], text[16384];
	snprintf(out, sizeof(out), "%s/ctl.json", d->dir);
	const char *const argv[] = {DFCCLCTL_PATH, "--socket", d->socket, "--json", "status", NULL};
	pid_t p = child_exec(DFCCLCTL_PATH, argv, out, NULL);
	assert_int_equal(child_wait(p, 20000), 0);
	read_text_file(out, text, sizeof(text));
	json_error_t je;
	json_t *doc = json_loads(text, 0, &je);
	if (!doc)
		fail_msg("dfcclctl --json status printed no JSON (%s): %.300s", je.text, text);
	assert_string_equal(json_string_value(json_object_get(doc, "worker_user")), "job");
	json_t *dev = json_array_get(json_object_get(doc, "devices"), device);
	assert_int_equal(json_integer_value(json_object_get(dev, "worker_uid")), uid);
	json_decref(doc);
}

/* ------------------------------------------------------------ tests */

static void test_jobs_take_turns(void **state)
{
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 2, "--worker-user", "job", NULL), 0);
	assert_true(daemon_log_contains(&d, "worker-user = job"));

	/* Nobody uses the devices: workers of the daemon's uid, parked. */
	for (unsigned dev = 0; dev < 2; dev++) {
		struct worker_view v = wait_worker(&d, dev, 0, 1);
		expect_proc_ids(v.pid, 0, 0);
	}

	/* Job A on both devices: its workers run as A, and its collectives
	 * (checked inside the ranks) run through them. */
	struct held a;
	job_hold(&a, 2, UID_A);
	struct worker_view va[2];
	for (unsigned dev = 0; dev < 2; dev++) {
		va[dev] = wait_worker(&d, dev, UID_A, 0);
		assert_int_equal(va[dev].gid, UID_A);
		expect_proc_ids(va[dev].pid, UID_A, UID_A);
	}
	expect_ctl_uid(&d, 0, UID_A);

	/* Job B meanwhile: refused on either device, with A named and what to
	 * do said; A's workers are the same processes afterwards. */
	job_refused(UID_B, 0, "uid 65534 (nobody)", "device 0", "retry once");
	job_refused(UID_B, 1, "uid 65534 (nobody)", "device 1", "run this job as uid 65534");
	/* The daemon's own uid is another user too. */
	job_refused(0, 0, "uid 65534 (nobody)", "refused to uid 0", NULL);
	for (unsigned dev = 0; dev < 2; dev++)
		assert_int_equal(worker_view(&d, dev).pid, va[dev].pid);

	/* A leaves (after one more checked all-reduce): its devices go back to
	 * workers of the daemon's uid. */
	job_release(&a);
	for (unsigned dev = 0; dev < 2; dev++) {
		struct worker_view v = wait_worker(&d, dev, 0, 1);
		assert_int_not_equal(v.pid, va[dev].pid);
		expect_proc_ids(v.pid, 0, 0);
	}

	/* Now B gets workers of its own, a uid without a user name. */
	struct held b;
	job_hold(&b, 2, UID_B);
	for (unsigned dev = 0; dev < 2; dev++) {
		struct worker_view v = wait_worker(&d, dev, UID_B, 0);
		expect_proc_ids(v.pid, UID_B, UID_B);
	}
	job_release(&b);
	/* Back to parked workers of the daemon's uid on both devices before
	 * the next job, as after A: a device still switching would not read
	 * parked below. */
	for (unsigned dev = 0; dev < 2; dev++)
		wait_worker(&d, dev, 0, 1);

	/* A job of the daemon's own uid on one device: that worker opens its
	 * device (no longer parked), the other stays parked. */
	struct held root;
	job_hold(&root, 1, 0);
	wait_worker(&d, 0, 0, 0);
	assert_true(worker_view(&d, 1).parked);
	job_release(&root);
	wait_worker(&d, 0, 0, 1);

	assert_int_equal(daemon_stop(&d), 0);
}

/* A daemon that cannot switch users (not root) serves its own uid only. */
static void test_not_root(void **state)
{
	struct daemon_proc d;
	struct daemon_opts o = {.run_as = UID_A};
	assert_int_equal(daemon_start_with(&d, &o, 2, "--worker-user", "job", NULL), 0);
	assert_true(daemon_log_contains(&d, "cannot start workers as other users"));
	dfccl_envelope *r = daemon_query(&d, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	assert_false(r->query_reply->status->worker_user_can_switch);
	frame_envelope_free(r);
	wait_worker(&d, 0, UID_A, 1);

	/* Root is another user here, and is told how to get served. */
	job_refused(0, 0, "may not start workers as other users", "run the job as uid 65534", "run dfccld as root");
	/* Its own uid's job runs. */
	struct held a;
	job_hold(&a, 2, UID_A);
	wait_worker(&d, 0, UID_A, 0);
	wait_worker(&d, 1, UID_A, 0);
	job_release(&a);
	wait_worker(&d, 0, UID_A, 1);
	assert_int_equal(daemon_stop(&d), 0);
}

int main(void)
{
	if (geteuid() != 0) {
		fprintf(stderr, "test_worker_uids: skipped: running jobs as other users needs root\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_jobs_take_turns),
	    cmocka_unit_test(test_not_root),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
