/*
 * Tests of the worker-uid policy (daemon/worker_user.c): how the setting
 * resolves against MPS, which identity a device's worker gets from the
 * sessions attached to it, which changes force a restart, whose resources a
 * worker may receive, which attaches are refused and what the refusal says;
 * and, as root, that a process that becomes another user holds exactly that
 * user's credentials and nothing more. The capability check is held against
 * /proc/self/status, read independently.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker_user.h"

#define SELF 0u
#define ALICE 3999001u /* uids no user database names */
#define BOB 3999002u

static struct worker_user_policy policy(int setting, int mps, int can_switch)
{
	struct worker_user_policy p;
	worker_user_policy_init(&p, setting, mps, SELF, SELF, can_switch);
	return p;
}

static void test_resolve(void **state)
{
	struct worker_user_policy p = policy(WORKER_USER_AUTO, 1, 1);
	assert_true(p.job);
	assert_string_equal(worker_user_mode_name(&p), "job");
	p = policy(WORKER_USER_AUTO, 0, 1);
	assert_false(p.job);
	assert_string_equal(worker_user_mode_name(&p), "daemon");
	p = policy(WORKER_USER_JOB, 0, 1);
	assert_true(p.job);
	assert_false(p.mps);
	p = policy(WORKER_USER_DAEMON, 1, 1);
	assert_false(p.job);
	assert_true(p.mps);
	assert_int_equal(p.self_uid, SELF);
}

static void test_target(void **state)
{
	const struct worker_cred alice = {ALICE, 4000};
	const struct worker_cred self = {SELF, 7};

	/* daemon: always the daemon's own, with its device open. */
	struct worker_user_policy d = policy(WORKER_USER_DAEMON, 1, 1);
	struct worker_ident t = worker_user_target(&d, &alice);
	assert_int_equal(t.cred.uid, SELF);
	assert_int_equal(t.cred.gid, SELF);
	assert_false(t.parked);
	t = worker_user_target(&d, NULL);
	assert_int_equal(t.cred.uid, SELF);
	assert_false(t.parked);

	/* job: the sessions' uid and gid; no session: the daemon's, parked. */
	struct worker_user_policy j = policy(WORKER_USER_JOB, 0, 1);
	t = worker_user_target(&j, &alice);
	assert_int_equal(t.cred.uid, ALICE);
	assert_int_equal(t.cred.gid, 4000);
	assert_false(t.parked);
	t = worker_user_target(&j, NULL);
	assert_int_equal(t.cred.uid, SELF);
	assert_true(t.parked);
	/* A job of the daemon's own uid needs the device open. */
	t = worker_user_target(&j, &self);
	assert_int_equal(t.cred.uid, SELF);
	assert_false(t.parked);
}

static void test_differs(void **state)
{
	struct worker_ident a = {{ALICE, 10}, 0};
	struct worker_ident b = a;
	assert_false(worker_user_differs(&a, &b));
	b.cred.gid = 11; /* the gid alone never cuts a uid's sessions off */
	assert_false(worker_user_differs(&a, &b));
	b.cred.uid = BOB;
	assert_true(worker_user_differs(&a, &b));
	b = a;
	b.parked = 1;
	assert_true(worker_user_differs(&a, &b));
}

static void test_serves(void **state)
{
	struct worker_ident alice = {{ALICE, 1}, 0};
	struct worker_ident parked = {{SELF, SELF}, 1};
	struct worker_user_policy d = policy(WORKER_USER_DAEMON, 0, 1);
	assert_true(worker_user_serves(&d, &alice, BOB));
	assert_true(worker_user_serves(&d, &alice, ALICE));

	struct worker_user_policy j = policy(WORKER_USER_JOB, 1, 1);
	assert_true(worker_user_serves(&j, &alice, ALICE));
	assert_false(worker_user_serves(&j, &alice, BOB));
	assert_false(worker_user_serves(&j, &alice, SELF));
	/* A parked worker takes nothing, not even its own uid's. */
	assert_false(worker_user_serves(&j, &parked, SELF));
}

static void expect_words(const char *msg, const char *const *words)
{
	for (; *words; words++) {
		if (!strstr(msg, *words))
			fail_msg("'%s' lacks '%s'", msg, *words);
	}
}

static void test_admit(void **state)
{
	char err[512];
	const struct worker_cred alice = {ALICE, 1};
	const struct worker_cred root = {0, 0};

	/* daemon: everyone, whoever else is attached. */
	struct worker_user_policy d = policy(WORKER_USER_DAEMON, 1, 1);
	assert_int_equal(worker_user_admit(&d, &alice, BOB, 0, err, sizeof(err)), 0);

	/* job: the first uid, then only it. */
	struct worker_user_policy j = policy(WORKER_USER_JOB, 1, 1);
	assert_int_equal(worker_user_admit(&j, NULL, BOB, 0, err, sizeof(err)), 0);
	assert_int_equal(worker_user_admit(&j, &alice, ALICE, 5, err, sizeof(err)), 0);
	err[0] = '\0';
	assert_int_equal(worker_user_admit(&j, &alice, BOB, 3, err, sizeof(err)), -EPERM);
	/* Names the device, the refused uid, the holder, why, and what to do.
	 * A uid without a user name is given as the number alone. */
	expect_words(err, (const char *const[]){"device 3", "uid 3999002", "jobs of uid 3999001,", "MPS serves one user",
	                                        "retry once", "run this job as uid 3999001", NULL});
	/* A holder with a user name is named. */
	assert_int_equal(worker_user_admit(&j, &root, BOB, 0, err, sizeof(err)), -EPERM);
	expect_words(err, (const char *const[]){"uid 0 (root)", NULL});
	/* Without MPS (forced job) the reason is the setting. */
	struct worker_user_policy f = policy(WORKER_USER_JOB, 0, 1);
	assert_int_equal(worker_user_admit(&f, &alice, BOB, 1, err, sizeof(err)), -EPERM);
	expect_words(err, (const char *const[]){"worker-user = job", NULL});
	assert_null(strstr(err, "MPS"));
}

static void test_admit_cannot_switch(void **state)
{
	char err[512];
	struct worker_user_policy p;
	worker_user_policy_init(&p, WORKER_USER_JOB, 1, ALICE, 50, 0);
	const struct worker_cred alice = {ALICE, 50};
	/* Its own uid, always; any other, never, even on an idle node. */
	assert_int_equal(worker_user_admit(&p, NULL, ALICE, 0, err, sizeof(err)), 0);
	assert_int_equal(worker_user_admit(&p, &alice, ALICE, 0, err, sizeof(err)), 0);
	assert_int_equal(worker_user_admit(&p, NULL, BOB, 2, err, sizeof(err)), -EPERM);
	expect_words(err, (const char *const[]){"device 2", "uid 3999002", "runs as uid 3999001", "needs root",
	                                        "under MPS", "run the job as uid 3999001", "run dfccld as root", NULL});
	/* Its workers never need another uid. */
	struct worker_ident t = worker_user_target(&p, &alice);
	assert_int_equal(t.cred.uid, ALICE);
	assert_false(t.parked);
}

/* CapEff from /proc/self/status. */
static uint64_t proc_cap_eff(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	assert_non_null(f);
	char line[256];
	unsigned long long v = ~0ull;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &v) == 1)
			break;
	fclose(f);
	assert_true(v != ~0ull);
	return v;
}

static void test_can_switch(void **state)
{
	uint64_t eff = proc_cap_eff();
	int expect = (eff >> 6 & 1) && (eff >> 7 & 1); /* CAP_SETGID 6, CAP_SETUID 7 */
	assert_int_equal(worker_user_can_switch(), expect);
}

/* In a child: become nobody and check every credential independently. */
static int child_become(void)
{
	char err[256];
	struct worker_cred c = {65534, 65534};
	if (worker_user_become(&c, err, sizeof(err)) < 0) {
		fprintf(stderr, "become: %s\n", err);
		return 1;
	}
	uid_t r, e, s;
	gid_t gr, ge, gs;
	if (getresuid(&r, &e, &s) || getresgid(&gr, &ge, &gs))
		return 2;
	if (r != 65534 || e != 65534 || s != 65534 || gr != 65534 || ge != 65534 || gs != 65534)
		return 3;
	if (getgroups(0, NULL) != 0)
		return 4;
	if (prctl(PR_GET_DUMPABLE) != 0)
		return 5;
	if (proc_cap_eff() != 0)
		return 6;
	if (setuid(0) == 0 || errno != EPERM)
		return 7;
	/* Now unprivileged, becoming someone else must fail, and say how. */
	struct worker_cred other = {65533, 65533};
	if (worker_user_become(&other, err, sizeof(err)) != -EPERM || !strstr(err, "setgroups"))
		return 8;
	return 0;
}

static void test_become(void **state)
{
	if (geteuid() != 0 || !worker_user_can_switch()) {
		print_message("skipped: becoming another user needs root\n");
		skip();
	}
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(child_become());
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_resolve),
	    cmocka_unit_test(test_target),
	    cmocka_unit_test(test_differs),
	    cmocka_unit_test(test_serves),
	    cmocka_unit_test(test_admit),
	    cmocka_unit_test(test_admit_cannot_switch),
	    cmocka_unit_test(test_can_switch),
	    cmocka_unit_test(test_become),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
