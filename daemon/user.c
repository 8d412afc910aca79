/* See user.h. A linked list: a node has a handful of users. */
#include "user.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>

struct user *user_ref(struct user_table *t, uid_t uid)
{
	for (struct user *u = t->head; u; u = u->next) {
		if (u->uid == uid) {
			u->refs++;
			return u;
		}
	}
	struct user *u = calloc(1, sizeof(*u));
	if (!u)
		return NULL;
	u->uid = uid;
	u->refs = 1;
	u->next = t->head;
	t->head = u;
	return u;
}

void user_unref(struct user_table *t, struct user *u)
{
	if (!u || --u->refs > 0)
		return;
	for (struct user **pp = &t->head; *pp; pp = &(*pp)->next) {
		if (*pp == u) {
			*pp = u->next;
			break;
		}
	}
	free(u);
}

/* One more of a counted resource, if the quota allows it. */
static int charge_one(int64_t *count, int64_t max)
{
	if (*count + 1 > max)
		return -EDQUOT;
	(*count)++;
	return 0;
}

int user_charge_session(struct user_table *t, struct user *u)
{
	return charge_one(&u->nsessions, t->limits.max_sessions);
}

void user_uncharge_session(struct user *u)
{
	u->nsessions--;
}

int user_charge_bytes(struct user_table *t, struct user *u, int64_t bytes)
{
	if (bytes < 0 || bytes > t->limits.max_registered_bytes - u->registered_bytes)
		return -EDQUOT;
	u->registered_bytes += bytes;
	return 0;
}

void user_uncharge_bytes(struct user *u, int64_t bytes)
{
	u->registered_bytes -= bytes;
}

int user_charge_comm(struct user_table *t, struct user *u)
{
	return charge_one(&u->ncomms, t->limits.max_comms);
}

void user_uncharge_comm(struct user *u)
{
	u->ncomms--;
}

int user_charge_reg(struct user_table *t, struct user *u)
{
	return charge_one(&u->nregs, t->limits.max_regs);
}

void user_uncharge_reg(struct user *u)
{
	u->nregs--;
}

int user_charge_qp(struct user_table *t, struct user *u)
{
	return charge_one(&u->nqps, t->limits.max_qps);
}

void user_uncharge_qp(struct user *u)
{
	u->nqps--;
}

int user_sees_all(uid_t uid, gid_t gid)
{
	if (uid == 0)
		return 1;
	struct group *g = getgrnam(USER_ADMIN_GROUP);
	if (!g)
		return 0;
	if (g->gr_gid == gid)
		return 1;
	gid_t admin = g->gr_gid;
	struct passwd *pw = getpwuid(uid);
	if (!pw)
		return 0;
	/* getgrnam's storage is overwritten by getpwuid's lookups on some
	 * systems: look the group up again for its members. */
	g = getgrgid(admin);
	for (char **m = g ? g->gr_mem : NULL; m && *m; m++)
		if (strcmp(*m, pw->pw_name) == 0)
			return 1;
	return 0;
}

void user_table_free(struct user_table *t)
{
	while (t->head) {
		struct user *u = t->head;
		t->head = u->next;
		free(u);
	}
}
