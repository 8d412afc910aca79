/*
 * Whose uid each device's worker runs as (setting worker-user), and how a
 * worker becomes that user.
 *
 * Why: MPS runs one server per uid, and the control daemon runs one server
 * at a time for every GPU it manages. A CUDA client of another uid waits in
 * CUDA initialisation until every client of the running server has exited
 * (measured on H200s; nvidia-cuda-mps-control(1)). A worker and the
 * trainers it serves must therefore run as one uid, and while one user's
 * jobs use the node, another user's cannot start.
 *
 * The policy, in one place:
 * - daemon: every worker runs as the daemon's own uid and opens its device
 *   at once; every uid is served (what happens without MPS).
 * - job: the worker of a device runs as the uid (and gid) of the sessions
 *   attached to that device; a device without sessions has a worker of the
 *   daemon's uid that is *parked*: it does not open its device, since an
 *   idle context of the daemon's uid would keep every other user's CUDA
 *   work waiting under MPS. While sessions of one uid are attached anywhere,
 *   a session of another uid is refused with a sentence that names the
 *   holder and says what to do. A supervisor that cannot start processes as
 *   other users (not root) serves its own uid only and refuses the others.
 * - auto (the default): job under MPS, daemon otherwise.
 *
 * A worker changes identity by a planned restart (workers.c), only when the
 * sessions its device serves are gone. Apart from worker_user_become, which
 * a worker calls on itself, this module only decides: it never touches a
 * process.
 */
#ifndef DFCCLD_WORKER_USER_H
#define DFCCLD_WORKER_USER_H

#include <stddef.h>
#include <sys/types.h>

/* The setting's values (config.c's choices are in this order). */
enum worker_user_setting { WORKER_USER_AUTO = 0, WORKER_USER_DAEMON = 1, WORKER_USER_JOB = 2 };

struct worker_user_policy {
	int job;        /* workers follow the jobs' uids (resolved: never auto) */
	int mps;        /* MPS is active: the refusals say why in its terms */
	int can_switch; /* the supervisor may start processes as other users */
	uid_t self_uid; /* the daemon's own credentials */
	gid_t self_gid;
};

struct worker_cred {
	uid_t uid;
	gid_t gid;
};

/* Who a worker process is: its credentials, and whether it is parked
 * (running without opening its device). */
struct worker_ident {
	struct worker_cred cred;
	int parked;
};

/* Resolves the setting against the machine (mps_active) and the daemon's
 * credentials and privilege (can_switch, as worker_user_can_switch says). */
void worker_user_policy_init(struct worker_user_policy *p, int setting, int mps_active, uid_t self_uid,
                             gid_t self_gid, int can_switch);

/* "daemon" or "job". */
const char *worker_user_mode_name(const struct worker_user_policy *p);

/* Whether this process holds CAP_SETUID and CAP_SETGID (root has them). */
int worker_user_can_switch(void);

/*
 * What the worker of a device should be now. holder: the credentials of
 * the sessions attached to that device (all of one uid in job mode), or
 * NULL when none is.
 */
struct worker_ident worker_user_target(const struct worker_user_policy *p, const struct worker_cred *holder);

/* Whether a worker that is `have` must be replaced to be `want`: the uid or
 * parking differ. The gid alone never forces a restart (it follows the
 * first session of the uid), so sessions of one uid are never cut off. */
int worker_user_differs(const struct worker_ident *have, const struct worker_ident *want);

/* Whether resources (queue pairs, registrations) of sessions of `owner` may
 * be handed to the worker `w`: in job mode only to an unparked worker of
 * that very uid, so no process of one user maps another user's memory. */
int worker_user_serves(const struct worker_user_policy *p, const struct worker_ident *w, uid_t owner);

/*
 * Whether a session of `uid` may attach to `device`. holder: the
 * credentials of the sessions attached anywhere on the node (NULL: none).
 * Returns 0, or -EPERM with a sentence in err that names the holder (uid
 * and user name), says why, and what to do.
 */
int worker_user_admit(const struct worker_user_policy *p, const struct worker_cred *holder, uid_t uid,
                      unsigned device, char *err, size_t errlen);

/* Logs, once at start, how workers' uids will be chosen and any limit. */
void worker_user_log_policy(const struct worker_user_policy *p);

/*
 * Becomes `c` for good: drops supplementary groups, sets the real,
 * effective and saved gid and uid, marks the process non-dumpable (the
 * job's user must not be able to drive the worker's control channel), and
 * verifies the result: the ids, no supplementary group, no capability
 * left, and root cannot be regained. Returns 0, or a negative errno with a
 * sentence in err.
 */
int worker_user_become(const struct worker_cred *c, char *err, size_t errlen);

#endif
