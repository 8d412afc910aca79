/*
 * The supervisor: dfccld's control plane.
 *
 * One libuv loop runs everything the supervisor does: it accepts clients on
 * the Unix socket (one session each), gathers communicators, keeps the
 * registration and queue-pair tables, starts and watches one worker process
 * per device, answers dfcclctl queries and talks to systemd. It never touches
 * a device: GPUs are opened only by workers (and by a short-lived probe
 * process at start-up), so a GPU fault can take down a worker but never the
 * supervisor.
 *
 * States: starting (devices probed, workers spawned) -> serving (READY=1) ->
 * stopping (SIGTERM: clients told, workers stopped) -> stopped (loop ends).
 */
#ifndef DFCCLD_SERVER_H
#define DFCCLD_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "fd_budget.h"
#include "topo_select.h"
#include "user.h"
#include "worker_user.h"

struct session;
struct comm;
struct workers;
struct watch;
struct topo_model;

enum server_state { SERVER_STARTING, SERVER_SERVING, SERVER_STOPPING, SERVER_STOPPED };

struct server {
	uv_loop_t *loop;
	struct dfccld_config cfg;
	enum server_state state;
	const char *exe_path;       /* this binary, re-executed for workers and the probe */

	int listen_fd;
	int listen_from_systemd;    /* the socket came from systemd: do not unlink it */
	uv_poll_t listen_poll;
	uv_signal_t sig_term, sig_int;
	uv_timer_t watchdog_timer;
	uv_timer_t stop_timer;
	uint64_t watchdog_usec;

	struct session *sessions;   /* doubly linked through session->prev/next */
	unsigned nsessions;
	uint64_t next_session_id;

	struct comm *comms;         /* every communicator, initializing or ready */
	uint64_t next_comm_id;

	uint32_t next_qp_id;
	uint32_t next_reg_id;

	struct user_table users;
	struct fd_budget fds;       /* descriptors for sessions, queue pairs, registrations (fd_budget.h) */
	struct workers *workers;
	struct watch *watch;        /* timeouts, dfcclctl stuck, flight recorders (watch.h) */

	struct topo_model *topo;    /* the node's model: loaded, detected by the probe, or the host engine's */
	struct topo_select_params select_params; /* the cost model's, with the forced algorithm */
	char *tuning_text;          /* the tuning file's text, applied to every communicator's plan */
	char *topo_doc;             /* its JSON document (model, rings, trees, selection) for QUERY_TOPOLOGY */

	int engine;                 /* enum dfccld_engine, resolved (never AUTO) */
	int mps_active;
	struct worker_user_policy worker_users; /* whose uid each worker runs as */
	uint64_t start_ms;
	int exit_code;
};

/* Monotonic milliseconds. */
uint64_t server_now_ms(void);

/* Runs the supervisor until it stops. Returns the process exit code. */
int server_run(const struct dfccld_config *cfg, const char *exe_path);

/* Begins an orderly shutdown (as on SIGTERM). */
void server_stop(struct server *srv);

/* Sets up a server with no listener, no workers and no systemd, for the fuzz
 * target and unit tests that drive sessions directly. */
int server_init_detached(struct server *srv, uv_loop_t *loop, const struct dfccld_config *cfg);
void server_fini_detached(struct server *srv);

#endif
