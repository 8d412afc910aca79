/*
 * The supervisor's descriptor budget.
 *
 * The supervisor keeps descriptors for what clients create: one socket per
 * session, a memfd and an eventfd per queue pair, and for every host-memory
 * registration one duplicate per device (each worker maps it, and a
 * restarted worker is sent it again). Left unchecked, one user's
 * registrations use up RLIMIT_NOFILE and every other client's attach, and
 * the daemon's own work, fails with EMFILE.
 *
 * So each of those is charged here before it is made. Registrations may use
 * the limit less `fd-reserve` descriptors; a new session and its queue
 * pairs may use the reserve too (less a small slack for the descriptors the
 * daemon opens for a moment, such as a worker restart's), so that dfcclctl
 * and new jobs can still connect and attach when registrations have taken
 * the rest. Queue pairs are few (max-qps-per-uid), registrations are not.
 */
#ifndef DFCCLD_FD_BUDGET_H
#define DFCCLD_FD_BUDGET_H

#include <stdint.h>

/* Descriptors the daemon keeps for itself out of even the reserve. */
#define FD_BUDGET_SLACK 32

struct fd_budget {
	int64_t limit;   /* RLIMIT_NOFILE (soft, raised to the hard limit by fd_budget_init) */
	int64_t base;    /* open before clients came: listener, logs, workers' channels */
	int64_t used;    /* charged for sessions, queue pairs and registrations */
	int64_t reserve; /* setting fd-reserve */
	int spare;       /* /dev/null, given up to accept and refuse a connection at EMFILE (-1: none) */
};

enum fd_use { FD_FOR_REGISTRATION = 0, FD_FOR_CONNECTION = 1 /* sessions and queue pairs */ };

/* Raises the soft descriptor limit to the hard one and records what is
 * open now. base_extra counts descriptors opened later for the daemon's own
 * use (per worker). */
void fd_budget_init(struct fd_budget *b, int64_t reserve, int64_t base_extra);

/* Charges n descriptors for `use`. Returns 0, or -EMFILE when that would
 * reach into what is kept back (nothing charged). */
int fd_budget_charge(struct fd_budget *b, int64_t n, enum fd_use use);
void fd_budget_uncharge(struct fd_budget *b, int64_t n);

/*
 * Keeps a spare descriptor for fd_budget_shed. Without it a listening
 * socket whose accept() fails with EMFILE stays readable, and the event loop
 * spins on it at full speed while the connection waits unanswered.
 */
void fd_budget_keep_spare(struct fd_budget *b);

/* After accept() failed with EMFILE or ENFILE: gives up the spare, accepts
 * one connection and closes it (the client sees the daemon hang up rather
 * than wait forever), and takes the spare back. Returns 0 if a connection
 * was shed, else a negative errno. */
int fd_budget_shed(struct fd_budget *b, int listen_fd);

/* What registrations may use in all. */
int64_t fd_budget_registration_cap(const struct fd_budget *b);

#endif
