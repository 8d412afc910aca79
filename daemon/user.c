/* See user.h. A linked list: a node has a handful of users. */
#include "user.h"

#include <errno.h>
#include <stdlib.h>

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

int user_charge_session(struct user_table *t, struct user *u)
{
	if (u->nsessions + 1 > t->limits.max_sessions)
		return -EDQUOT;
	u->nsessions++;
	return 0;
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
	if (u->ncomms + 1 > t->limits.max_comms)
		return -EDQUOT;
	u->ncomms++;
	return 0;
}

void user_uncharge_comm(struct user *u)
{
	u->ncomms--;
}

void user_table_free(struct user_table *t)
{
	while (t->head) {
		struct user *u = t->head;
		t->head = u->next;
		free(u);
	}
}
