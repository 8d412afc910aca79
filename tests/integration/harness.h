/*
 * Integration-test harness: starts the real dfccld on a temporary socket,
 * talks to it over the raw protocol (no libdfccl, so the test process can
 * still fork clean client processes), and runs client processes with a
 * deadline.
 */
#ifndef DFCCL_TEST_HARNESS_H
#define DFCCL_TEST_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "frame.h"

struct daemon_proc {
	pid_t pid;
	char dir[64];
	char socket[108]; /* sizeof(sun_path) */
	char log[128];
};

/* How to start it, beyond the defaults of daemon_start. */
struct daemon_opts {
	int keep_systemd_env; /* pass NOTIFY_SOCKET / WATCHDOG_USEC from the environment */
	int listen_fd;        /* > 0: hand this listening socket over as systemd would (fd 3) */
	const char *listen_path; /* where listen_fd is bound: clients connect there */
	int reuse;            /* start again in d's folder, on its socket, appending to its log (a restart) */
	uid_t run_as;         /* > 0: the daemon runs as this uid (and gid), without groups */
	const char *engine;   /* NULL or "host": --engine host --host-devices ndev; "cuda": --engine cuda,
	                       * every GPU it finds (ndev of them, or with ndev 0 any number but 0) */
	const char *exe;      /* the dfccld to run (NULL: the one of this build, DFCCLD_PATH) */
};

/* daemon_start with o's choices. */
int daemon_start_with(struct daemon_proc *d, const struct daemon_opts *o, unsigned ndev, ...);

/* Starts dfccld --engine host --host-devices ndev (plus extra "--k v" args,
 * NULL-terminated) and waits until every worker is up. Sets DFCCL_SOCKET.
 * Returns 0 or -1 (and prints the daemon's log). */
int daemon_start(struct daemon_proc *d, unsigned ndev, ...);

/* CMocka fixtures: a daemon with 2 host devices in *state (a struct
 * daemon_proc), and its stop (which fails the test unless it exits cleanly). */
int daemon_setup2(void **state);
int daemon_teardown(void **state);

/* SIGTERM, wait up to 10 s; returns the exit status (or -1 if it had to be
 * killed). Removes the temporary directory. */
int daemon_stop(struct daemon_proc *d);

/* Prints the daemon's log to stderr (for failing tests). */
void daemon_dump_log(const struct daemon_proc *d);

/* Lines of the daemon's log that contain needle. */
int daemon_log_contains(const struct daemon_proc *d, const char *needle);

/* A raw protocol connection. */
struct raw_client {
	int fd;
	struct frame_reader rd;
	uint64_t next_req;
	uint64_t session_id;
};

/* Connects and says Hello with [minv, maxv]. Returns 0, or -1 with the
 * error reply (if any) in *err_env (caller frees). */
int raw_connect(struct raw_client *c, const char *socket, uint32_t minv, uint32_t maxv, dfccl_envelope **err_env);
void raw_close(struct raw_client *c);

/* Sends env as a request and returns its reply (notices are skipped and
 * freed). fds out: up to 8 received descriptors. Returns the reply or NULL
 * on timeout/EOF. */
dfccl_envelope *raw_request(struct raw_client *c, dfccl_envelope *env, const int *fds, unsigned nfds, int *rfds,
                            unsigned *nrfds);

/* Waits up to timeout_ms for the next frame of any kind. */
dfccl_envelope *raw_next(struct raw_client *c, int timeout_ms, int *rfds, unsigned *nrfds);

/* RegisterMem of host memory: [offset, offset + size) of memfd fd on
 * device (fd < 0: the request carries no descriptor). Returns the reply, or
 * NULL on timeout/EOF. */
dfccl_envelope *raw_register_memfd(struct raw_client *c, uint32_t device, uint64_t offset, uint64_t size, int fd);

/* AttachDevice (sq_entries 0: the daemon's default). The queue pair's
 * descriptors (memfd, eventfd) come back in fds (8 places). Returns the
 * reply, or NULL on timeout/EOF. */
dfccl_envelope *raw_attach(struct raw_client *c, uint32_t device, uint32_t sq_entries, int *fds, unsigned *nfds);

/* A status/stats/... query; NULL on failure. */
dfccl_envelope *raw_query(struct raw_client *c, int kind);

/* The same on a connection of its own to d (the caller frees the reply). */
dfccl_envelope *daemon_query(const struct daemon_proc *d, int kind);

/* Collectives the daemon's engines started per algorithm (out[a] for enum
 * dfccl_algo a, DFCCL_ALGO_COUNT_ entries), summed over the devices.
 * Returns 0, or -1 when the query failed. */
int daemon_by_algo(const struct daemon_proc *d, uint64_t *out);

/* Polls a status query until cond(status) holds or timeout; returns 1 if it held. */
int raw_wait_status(struct raw_client *c, int (*cond)(const Dfccl__V1__StatusInfo *st, void *arg), void *arg,
                    int timeout_ms);

/* Forks a child running fn(arg, rank); returns its pid. The child exits with
 * fn's return value. */
pid_t child_run(int (*fn)(void *arg, int rank), void *arg, int rank);

/* Waits for pid up to timeout_ms; returns its exit code, 128+signal, or -1
 * on timeout (the child is then killed). */
int child_wait(pid_t pid, int timeout_ms);

/* Forks and executes `path` with argv (NULL-terminated), its stdout into the
 * file out_path and its stderr into err_path (into out_path too when NULL).
 * Returns the pid, or -1. */
pid_t child_exec(const char *path, const char *const *argv, const char *out_path, const char *err_path);

/* The text of the file at path into buf (len bytes with the terminating
 * NUL; empty when the file cannot be read). */
void read_text_file(const char *path, char *buf, size_t len);

uint64_t now_ms(void);

/* Whether text is exactly pattern, where each "{n}" of pattern stands for a
 * number (digits, at most one '.' among them): for sentences with times
 * and counts in them. */
int text_matches(const char *text, const char *pattern);

/* A memfd of `size` bytes sealed against shrinking, as the daemon requires
 * of host memory it registers; -1 on failure. */
int sealed_memfd(off_t size);

/* In a child's rank function (child_run): says what failed, with the
 * rank, and returns 1 (the child's exit code). */
#define RANK_FAIL(...)                                 \
	do {                                           \
		fprintf(stderr, "rank %d: ", rank);    \
		fprintf(stderr, __VA_ARGS__);          \
		fprintf(stderr, "\n");                 \
		return 1;                              \
	} while (0)

#endif
