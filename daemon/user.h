/*
 * Per-uid accounting. Every resource a client holds (its sessions, the
 * bytes it registered, its communicator memberships) is charged to the uid
 * that SO_PEERCRED reported for its socket, and refused with a clear error
 * once the uid's quota (settings max-*-per-uid) is reached. A user object
 * lives while anything is charged to it.
 */
#ifndef DFCCLD_USER_H
#define DFCCLD_USER_H

#include <stdint.h>
#include <sys/types.h>

struct user {
	struct user *next;
	uid_t uid;
	unsigned refs;          /* sessions holding a reference */
	int64_t nsessions;
	int64_t registered_bytes;
	int64_t ncomms;
	int64_t nregs;
	int64_t nqps;
};

struct user_limits {
	int64_t max_sessions;
	int64_t max_registered_bytes;
	int64_t max_comms;
	int64_t max_regs;
	int64_t max_qps;
};

struct user_table {
	struct user *head;
	struct user_limits limits;
};

/* Finds or creates the user of uid and takes a reference. NULL on ENOMEM. */
struct user *user_ref(struct user_table *t, uid_t uid);
/* Drops a reference; the user is freed when the last one goes. */
void user_unref(struct user_table *t, struct user *u);

/* Each charge returns 0 or -EDQUOT (quota reached; nothing charged). */
int user_charge_session(struct user_table *t, struct user *u);
void user_uncharge_session(struct user *u);
int user_charge_bytes(struct user_table *t, struct user *u, int64_t bytes);
void user_uncharge_bytes(struct user *u, int64_t bytes);
int user_charge_comm(struct user_table *t, struct user *u);
void user_uncharge_comm(struct user *u);

int user_charge_reg(struct user_table *t, struct user *u);
void user_uncharge_reg(struct user *u);
int user_charge_qp(struct user_table *t, struct user *u);
void user_uncharge_qp(struct user *u);

/* The group whose members, like root, see every user's sessions,
 * communicators and queues in dfcclctl (others see only their own). */
#define USER_ADMIN_GROUP "dfccl-admin"

/* Whether uid (primary group gid) is root or a member of USER_ADMIN_GROUP. */
int user_sees_all(uid_t uid, gid_t gid);

void user_table_free(struct user_table *t);

#endif
