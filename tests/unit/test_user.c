/*
 * Tests of per-uid accounting (daemon/user.c): a user object per uid shared
 * by every reference and freed with the last one; each quota (sessions,
 * registered bytes, communicator memberships, registrations, queue pairs)
 * refuses the charge that would pass the limit, charges nothing when it
 * refuses, and makes room again when a charge is returned. Also the
 * supervisor's descriptor budget (daemon/fd_budget.c) and its reserve.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "fd_budget.h"
#include "user.h"

static struct user_table table(int64_t sessions, int64_t bytes, int64_t comms)
{
	struct user_table t = {.head = NULL,
	                       .limits = {.max_sessions = sessions, .max_registered_bytes = bytes, .max_comms = comms}};
	return t;
}

static unsigned count_users(const struct user_table *t)
{
	unsigned n = 0;
	for (const struct user *u = t->head; u; u = u->next)
		n++;
	return n;
}

static void test_refcount(void **state)
{
	struct user_table t = table(4, 100, 4);
	struct user *a = user_ref(&t, 1000);
	struct user *b = user_ref(&t, 1001);
	struct user *a2 = user_ref(&t, 1000);
	assert_non_null(a);
	assert_non_null(b);
	assert_ptr_equal(a, a2);
	assert_ptr_not_equal(a, b);
	assert_int_equal(a->refs, 2);
	assert_int_equal(a->uid, 1000);
	assert_int_equal(count_users(&t), 2);

	user_unref(&t, a);
	assert_int_equal(count_users(&t), 2); /* a2 still holds it */
	user_unref(&t, b);
	assert_int_equal(count_users(&t), 1);
	assert_ptr_equal(t.head, a2);
	user_unref(&t, a2);
	assert_int_equal(count_users(&t), 0);
	assert_null(t.head);

	/* A uid that comes back starts from nothing. */
	struct user *c = user_ref(&t, 1000);
	assert_int_equal(c->refs, 1);
	assert_int_equal(c->nsessions, 0);
	user_unref(&t, NULL); /* harmless */
	user_table_free(&t);
	assert_null(t.head);
}

static void test_unlink_middle(void **state)
{
	struct user_table t = table(4, 100, 4);
	struct user *u[3];
	for (unsigned i = 0; i < 3; i++)
		u[i] = user_ref(&t, 10 + i);
	user_unref(&t, u[1]);
	assert_int_equal(count_users(&t), 2);
	for (const struct user *x = t.head; x; x = x->next)
		assert_int_not_equal(x->uid, 11);
	user_unref(&t, u[0]);
	user_unref(&t, u[2]);
	assert_null(t.head);
}

static void test_session_quota(void **state)
{
	struct user_table t = table(2, 100, 4);
	struct user *u = user_ref(&t, 1);
	struct user *other = user_ref(&t, 2);
	assert_int_equal(user_charge_session(&t, u), 0);
	assert_int_equal(user_charge_session(&t, u), 0);
	assert_int_equal(user_charge_session(&t, u), -EDQUOT);
	assert_int_equal(u->nsessions, 2);
	/* Quotas are per uid: another user is not affected. */
	assert_int_equal(user_charge_session(&t, other), 0);
	user_uncharge_session(u);
	assert_int_equal(user_charge_session(&t, u), 0);
	assert_int_equal(user_charge_session(&t, u), -EDQUOT);
	user_table_free(&t);
}

static void test_bytes_quota(void **state)
{
	struct user_table t = table(4, 1000, 4);
	struct user *u = user_ref(&t, 1);
	assert_int_equal(user_charge_bytes(&t, u, 600), 0);
	assert_int_equal(user_charge_bytes(&t, u, 401), -EDQUOT);
	assert_int_equal(u->registered_bytes, 600);
	assert_int_equal(user_charge_bytes(&t, u, 400), 0); /* exactly to the limit */
	assert_int_equal(user_charge_bytes(&t, u, 1), -EDQUOT);
	assert_int_equal(user_charge_bytes(&t, u, 0), 0);
	user_uncharge_bytes(u, 600);
	assert_int_equal(user_charge_bytes(&t, u, 600), 0);
	/* Negative and absurd sizes never pass (and cannot overflow the sum). */
	assert_int_equal(user_charge_bytes(&t, u, -5), -EDQUOT);
	assert_int_equal(user_charge_bytes(&t, u, INT64_MAX), -EDQUOT);
	assert_int_equal(u->registered_bytes, 1000);
	user_table_free(&t);

	/* The default quota is a large number; the check must not overflow. */
	struct user_table big = table(4, INT64_MAX, 4);
	u = user_ref(&big, 1);
	assert_int_equal(user_charge_bytes(&big, u, INT64_MAX - 10), 0);
	assert_int_equal(user_charge_bytes(&big, u, 11), -EDQUOT);
	assert_int_equal(user_charge_bytes(&big, u, 10), 0);
	user_table_free(&big);
}

static void test_comm_quota(void **state)
{
	struct user_table t = table(4, 100, 3);
	struct user *u = user_ref(&t, 1);
	for (int i = 0; i < 3; i++)
		assert_int_equal(user_charge_comm(&t, u), 0);
	assert_int_equal(user_charge_comm(&t, u), -EDQUOT);
	assert_int_equal(u->ncomms, 3);
	user_uncharge_comm(u);
	assert_int_equal(user_charge_comm(&t, u), 0);
	user_table_free(&t);
}

/* Registrations and queue pairs are counted per uid; two uids never share
 * a count. */
static void test_reg_qp_quota(void **state)
{
	struct user_table t = table(4, 100, 3);
	t.limits.max_regs = 2;
	t.limits.max_qps = 1;
	struct user *u = user_ref(&t, 1), *v = user_ref(&t, 2);
	assert_int_equal(user_charge_reg(&t, u), 0);
	assert_int_equal(user_charge_reg(&t, u), 0);
	assert_int_equal(user_charge_reg(&t, u), -EDQUOT);
	assert_int_equal(user_charge_reg(&t, v), 0);
	assert_int_equal(u->nregs, 2);
	user_uncharge_reg(u);
	assert_int_equal(user_charge_reg(&t, u), 0);
	assert_int_equal(user_charge_qp(&t, u), 0);
	assert_int_equal(user_charge_qp(&t, u), -EDQUOT);
	assert_int_equal(user_charge_qp(&t, v), 0);
	user_uncharge_qp(u);
	assert_int_equal(u->nqps, 0);
	user_table_free(&t);
}

/* Registrations stop at the limit less the reserve; connections may use
 * the reserve but not the slack; an uncharge gives room back. */
static void test_fd_budget(void **state)
{
	struct fd_budget b;
	fd_budget_init(&b, 100, 0);
	assert_true(b.limit >= 1024);
	assert_true(b.base > 2 && b.base < b.limit);
	b.limit = b.base + 100 + 50; /* 50 for resources, 118 for sessions */
	assert_int_equal(fd_budget_registration_cap(&b), 50);
	assert_int_equal(fd_budget_charge(&b, 40, FD_FOR_REGISTRATION), 0);
	assert_int_equal(fd_budget_charge(&b, 11, FD_FOR_REGISTRATION), -EMFILE);
	assert_int_equal(b.used, 40);
	assert_int_equal(fd_budget_charge(&b, 10, FD_FOR_REGISTRATION), 0);
	for (int i = 0; i < 150 - FD_BUDGET_SLACK - 50; i++)
		assert_int_equal(fd_budget_charge(&b, 1, FD_FOR_CONNECTION), 0);
	assert_int_equal(fd_budget_charge(&b, 1, FD_FOR_CONNECTION), -EMFILE);
	assert_int_equal(fd_budget_charge(&b, 1, FD_FOR_REGISTRATION), -EMFILE);
	fd_budget_uncharge(&b, 1);
	assert_int_equal(fd_budget_charge(&b, 1, FD_FOR_CONNECTION), 0);
}

/* At EMFILE the spare descriptor lets one waiting connection be accepted
 * and hung up on, so the listener stops being readable. */
static void test_fd_shed(void **state)
{
	struct fd_budget b;
	fd_budget_init(&b, 100, 0);
	assert_int_equal(fd_budget_shed(&b, -1), -EMFILE); /* no spare yet */
	fd_budget_keep_spare(&b);
	assert_true(b.spare >= 0);
	int l = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "dfccl-test-shed-%d", (int)getpid());
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(sa.sun_path + 1));
	assert_int_equal(bind(l, (struct sockaddr *)&sa, len), 0);
	assert_int_equal(listen(l, 4), 0);
	int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(c, (struct sockaddr *)&sa, len), 0);
	assert_int_equal(fd_budget_shed(&b, l), 0);
	char byte;
	assert_int_equal(read(c, &byte, 1), 0); /* hung up on */
	assert_true(b.spare >= 0);
	assert_int_equal(fd_budget_shed(&b, l), -EAGAIN); /* nobody else waits */
	close(c);
	close(l);
	close(b.spare);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_refcount),      cmocka_unit_test(test_unlink_middle),
	    cmocka_unit_test(test_session_quota), cmocka_unit_test(test_bytes_quota),
	    cmocka_unit_test(test_comm_quota),    cmocka_unit_test(test_reg_qp_quota),
	    cmocka_unit_test(test_fd_budget),     cmocka_unit_test(test_fd_shed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
