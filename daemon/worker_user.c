/*
 * See worker_user.h. Everything here but worker_user_become and
 * worker_user_can_switch is a pure function of its arguments, so the policy
 * is tested without processes, privileges or GPUs (tests/unit).
 */
#include "worker_user.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

void worker_user_policy_init(struct worker_user_policy *p, int setting, int mps_active, uid_t self_uid,
                             gid_t self_gid, int can_switch)
{
	p->job = setting == WORKER_USER_JOB || (setting == WORKER_USER_AUTO && mps_active);
	p->mps = mps_active != 0;
	p->can_switch = can_switch != 0;
	p->self_uid = self_uid;
	p->self_gid = self_gid;
}

const char *worker_user_mode_name(const struct worker_user_policy *p)
{
	return p->job ? "job" : "daemon";
}

/* The effective and permitted capability sets of this process. */
static int caps_get(uint64_t *effective, uint64_t *permitted)
{
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	memset(d, 0, sizeof(d));
	if (syscall(SYS_capget, &h, d) < 0)
		return -errno;
	*effective = d[0].effective | (uint64_t)d[1].effective << 32;
	*permitted = d[0].permitted | (uint64_t)d[1].permitted << 32;
	return 0;
}

int worker_user_can_switch(void)
{
	uint64_t eff, perm;
	if (caps_get(&eff, &perm) < 0)
		return 0;
	uint64_t need = (1ull << CAP_SETUID) | (1ull << CAP_SETGID);
	return (eff & need) == need;
}

struct worker_ident worker_user_target(const struct worker_user_policy *p, const struct worker_cred *holder)
{
	struct worker_ident id = {.cred = {p->self_uid, p->self_gid}, .parked = 0};
	if (!p->job)
		return id;
	if (!holder) {
		id.parked = 1;
		return id;
	}
	id.cred = *holder;
	return id;
}

int worker_user_differs(const struct worker_ident *have, const struct worker_ident *want)
{
	return have->cred.uid != want->cred.uid || have->parked != want->parked;
}

int worker_user_serves(const struct worker_user_policy *p, const struct worker_ident *w, uid_t owner)
{
	if (!p->job)
		return 1;
	return !w->parked && w->cred.uid == owner;
}

/* "uid 1000 (alice)", or "uid 1000" for a uid the user database lacks. */
static void uid_describe(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *res = NULL;
	char tmp[1024];
	/* Only on the refusal path: a user-database lookup may be slow. */
	if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) == 0 && res && res->pw_name && *res->pw_name)
		snprintf(buf, len, "uid %u (%s)", (unsigned)uid, res->pw_name);
	else
		snprintf(buf, len, "uid %u", (unsigned)uid);
}

static const char *why_one_user(const struct worker_user_policy *p)
{
	return p->mps ? "MPS serves one user at a time (another user's CUDA work would wait until every process of "
	                "the first has exited)"
	              : "with worker-user = job dfccld serves one user at a time";
}

int worker_user_admit(const struct worker_user_policy *p, const struct worker_cred *holder, uid_t uid,
                      unsigned device, char *err, size_t errlen)
{
	if (!p->job)
		return 0;
	char who[300];
	if (!p->can_switch && uid != p->self_uid) {
		uid_describe(p->self_uid, who, sizeof(who));
		snprintf(err, errlen,
		         "device %u is refused to uid %u: dfccld runs as %s and may not start workers as other users "
		         "(that needs root), while %s a device's worker must run as the uid of the job it serves; run "
		         "the job as uid %u, or run dfccld as root (the packaged dfccld.service does)",
		         device, (unsigned)uid, who, p->mps ? "under MPS" : "with worker-user = job",
		         (unsigned)p->self_uid);
		return -EPERM;
	}
	if (holder && holder->uid != uid) {
		uid_describe(holder->uid, who, sizeof(who));
		snprintf(err, errlen,
		         "device %u is refused to uid %u: the node's devices are in use by jobs of %s, and %s; retry "
		         "once those jobs have ended (dfcclctl status shows each device's worker uid), or run this job "
		         "as uid %u",
		         device, (unsigned)uid, who, why_one_user(p), (unsigned)holder->uid);
		return -EPERM;
	}
	return 0;
}

void worker_user_log_policy(const struct worker_user_policy *p)
{
	if (!p->job) {
		if (p->mps)
			log_warn("server", "worker-user = daemon under MPS: every worker runs as uid %u, so the CUDA "
			                   "work of any other user waits until the workers exit; set worker-user = auto",
			         (unsigned)p->self_uid);
		else
			log_info("server", "workers run as dfccld's own uid %u (worker-user = daemon, or auto without MPS)",
			         (unsigned)p->self_uid);
		return;
	}
	if (!p->can_switch) {
		log_warn("server", "worker-user = job%s: dfccld runs as uid %u without CAP_SETUID and CAP_SETGID (it is "
		                   "not root), so it cannot start workers as other users: only jobs of uid %u are served, "
		                   "those of other users are refused",
		         p->mps ? " (MPS is active)" : "", (unsigned)p->self_uid, (unsigned)p->self_uid);
		return;
	}
	log_info("server", "each device's worker runs as the uid of the job using it, one user at a time, and an "
	                   "idle one is parked without its device (worker-user = job%s)",
	         p->mps ? ", since MPS is active" : "");
}

static int become_fail(char *err, size_t errlen, int e, const char *what)
{
	snprintf(err, errlen, "%s: %s", what, strerror(e));
	return -e;
}

/* Checks that the process is exactly c and cannot become anything else. */
static int become_verify(const struct worker_cred *c, char *err, size_t errlen)
{
	uid_t r, e, s;
	gid_t gr, ge, gs;
	if (getresuid(&r, &e, &s) < 0 || getresgid(&gr, &ge, &gs) < 0)
		return become_fail(err, errlen, errno, "getresuid/getresgid");
	if (r != c->uid || e != c->uid || s != c->uid || gr != c->gid || ge != c->gid || gs != c->gid) {
		snprintf(err, errlen, "credentials are uid %u/%u/%u gid %u/%u/%u, expected uid %u gid %u", (unsigned)r,
		         (unsigned)e, (unsigned)s, (unsigned)gr, (unsigned)ge, (unsigned)gs, (unsigned)c->uid,
		         (unsigned)c->gid);
		return -EPERM;
	}
	int ngroups = getgroups(0, NULL);
	if (ngroups != 0) {
		snprintf(err, errlen, "%d supplementary groups are left", ngroups);
		return -EPERM;
	}
	if (c->uid == 0)
		return 0;
	if (setuid(0) == 0 || seteuid(0) == 0) {
		snprintf(err, errlen, "root could be regained after dropping to uid %u", (unsigned)c->uid);
		return -EPERM;
	}
	uint64_t eff, perm;
	int rc = caps_get(&eff, &perm);
	if (rc < 0)
		return become_fail(err, errlen, -rc, "capget");
	if (eff || perm) {
		snprintf(err, errlen, "capabilities are left (effective %#llx, permitted %#llx)", (unsigned long long)eff,
		         (unsigned long long)perm);
		return -EPERM;
	}
	return 0;
}

int worker_user_become(const struct worker_cred *c, char *err, size_t errlen)
{
	/* Groups first: after setuid there is no right left to drop them. */
	if (setgroups(0, NULL) < 0)
		return become_fail(err, errlen, errno, "setgroups");
	if (setresgid(c->gid, c->gid, c->gid) < 0)
		return become_fail(err, errlen, errno, "setresgid");
	if (setresuid(c->uid, c->uid, c->uid) < 0)
		return become_fail(err, errlen, errno, "setresuid");
	/* A process of the job's uid could otherwise attach to the worker
	 * (ptrace) and speak for it on the supervisor's control channel. */
	if (prctl(PR_SET_DUMPABLE, 0) < 0)
		return become_fail(err, errlen, errno, "prctl(PR_SET_DUMPABLE)");
	return become_verify(c, err, errlen);
}
