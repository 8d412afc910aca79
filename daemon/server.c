/*
 * See server.h. Start-up order matters: the device list is settled first
 * (a probe process for GPUs), then workers are spawned, then the socket is
 * opened and systemd is told READY=1; clients that connect while a worker
 * is still starting are served, and their queue pairs reach the worker as
 * soon as it reports ready.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "devices.h"
#include "log.h"
#include "notify.h"
#include "session.h"
#include "watch.h"
#include "dfccl_queue.h"
#include "topo_json.h"
#include "topo_select.h"
#include "workers.h"

/* The `algo` setting is read by the topology's selection (enum topo_force)
 * and by the engines (enum dfccl_algo): one numbering for both. */
DFCCL_STATIC_ASSERT((int)TOPO_FORCE_AUTO == (int)DFCCL_ALGO_AUTO && (int)TOPO_FORCE_DIRECT == (int)DFCCL_ALGO_DIRECT &&
                        (int)TOPO_FORCE_RING == (int)DFCCL_ALGO_RING && (int)TOPO_FORCE_TREE == (int)DFCCL_ALGO_TREE &&
                        (int)TOPO_FORCE_MULTITREE == (int)DFCCL_ALGO_MULTITREE &&
                        (int)TOPO_FORCE_COUNT_ == (int)DFCCL_ALGO_COUNT_,
                    "the algo setting means the same to the topology and the engines");

#define PROBE_TIMEOUT_MS 60000
#define PROBE_TOPOLOGY_MAX (1u << 20) /* a 64-GPU model is about 250 KiB of JSON */
#define MAX_DEVICES 64

uint64_t server_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ------------------------------------------------------------ devices */

/* Runs `exe MODE` (--probe-devices, --probe-topology) and collects its
 * output. */
static int run_probe(const char *exe, const char *mode, char *out, size_t outlen)
{
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(pfd[0]);
		close(pfd[1]);
		return -e;
	}
	if (pid == 0) {
		dup2(pfd[1], STDOUT_FILENO);
		execl(exe, exe, mode, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	size_t len = 0;
	uint64_t deadline = server_now_ms() + PROBE_TIMEOUT_MS;
	int rc = 0;
	for (;;) {
		uint64_t now = server_now_ms();
		if (now >= deadline) {
			kill(pid, SIGKILL);
			rc = -ETIMEDOUT;
			break;
		}
		struct pollfd p = {.fd = pfd[0], .events = POLLIN};
		int n = poll(&p, 1, (int)(deadline - now));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			continue;
		ssize_t r = read(pfd[0], out + len, outlen - 1 - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len += (size_t)r;
		if (len >= outlen - 1)
			break;
	}
	out[len] = '\0';
	close(pfd[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (rc == 0 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
		rc = -ECHILD;
	return rc;
}

/* The host engine's emulated devices. */
static int server_host_devices(struct server *srv, struct device_desc *devs, unsigned *ndev)
{
	char err[256];
	srv->engine = DFCCLD_ENGINE_HOST;
	*ndev = (unsigned)srv->cfg.host_devices;
	devices_host(devs, *ndev);
	int rc = devices_host_bus_ids(devs, *ndev, srv->cfg.host_pci_bus_ids, err, sizeof(err));
	if (rc < 0)
		log_err("server", "%s", err);
	return rc;
}

/* Settles the engine and the device list. */
static int server_find_devices(struct server *srv, struct device_desc *devs, unsigned *ndev)
{
	if (srv->cfg.engine == DFCCLD_ENGINE_HOST)
		return server_host_devices(srv, devs, ndev);
	notify_status("probing GPUs");
	char out[8192];
	int rc = run_probe(srv->exe_path, "--probe-devices", out, sizeof(out));
	int mps = 0, ngpus = rc < 0 ? rc : devices_parse_probe(out, devs, MAX_DEVICES, &mps);
	if (ngpus > MAX_DEVICES)
		ngpus = MAX_DEVICES;
	if (ngpus > 0) {
		srv->engine = DFCCLD_ENGINE_CUDA;
		srv->mps_active = mps;
		*ndev = (unsigned)ngpus;
		log_info("server", "found %d GPU%s%s", ngpus, ngpus == 1 ? "" : "s", mps ? " (MPS active)" : "");
		if (!mps)
			log_notice("server", "MPS is not active: client kernels and the daemon's kernels time-slice "
			                     "the GPUs (see deploy/nvidia-mps.service)");
		return 0;
	}
	const char *why = strchr(out, '#');
	if (srv->cfg.engine == DFCCLD_ENGINE_CUDA) {
		log_err("server", "--engine cuda, but no usable GPU was found%s%s", why ? ": " : "", why ? why + 1 : "");
		return -ENODEV;
	}
	log_info("server", "no GPU found; using the host engine with %u emulated devices",
	         (unsigned)srv->cfg.host_devices);
	return server_host_devices(srv, devs, ndev);
}

#define HOST_ENGINE_STEP_US 10.0

/*
 * Settles the topology model and the document dfcclctl shows: the file
 * given by `topology`, else for GPUs the model the probe process detects
 * (the supervisor never touches a GPU), else the host engine's uniform
 * model. A model that describes another number of devices than the daemon
 * serves is refused: every decision made from it would be about the wrong
 * machine. Detection failing is not fatal: the daemon serves with a
 * uniform model and says how to give the right one.
 */
static int server_load_topology(struct server *srv, unsigned ndev)
{
	char err[512] = "";
	struct topo_model *m = NULL;
	const char *source = "the host engine";
	int rc;
	if (srv->cfg.topology_file[0]) {
		source = srv->cfg.topology_file;
		rc = topo_json_load_file(srv->cfg.topology_file, &m, err, sizeof(err));
		if (rc < 0) {
			log_err("server", "cannot load the topology model: %s", err);
			return rc;
		}
	} else if (srv->engine == DFCCLD_ENGINE_CUDA) {
		source = "detection";
		char *out = malloc(PROBE_TOPOLOGY_MAX);
		if (!out)
			return -ENOMEM;
		notify_status("detecting the topology");
		rc = run_probe(srv->exe_path, "--probe-topology", out, PROBE_TOPOLOGY_MAX);
		const char *why = out[0] == '#' ? out + 1 : NULL;
		if (rc == 0)
			rc = topo_json_parse(out, &m, err, sizeof(err));
		else
			snprintf(err, sizeof(err), "%s", why ? why + strspn(why, " ") : strerror(-rc));
		free(out);
		if (rc < 0) {
			err[strcspn(err, "\n")] = '\0';
			log_warn("server", "topology detection failed (%s); choosing algorithms as for %u GPUs linked alike "
			                   "(give the model with --topology FILE)", err, ndev);
			source = "a uniform stand-in";
			rc = topo_model_uniform(ndev, TOPO_LINK_SYS, 10.0, 2.5, &m);
		}
	} else {
		rc = topo_model_host(ndev, &m);
	}
	if (rc < 0)
		return rc;
	if (m->ndev != ndev) {
		log_err("server", "the topology model from %s describes %u device%s, but this daemon serves %u (%s engine); "
		                  "give a model of this node",
		        source, m->ndev, m->ndev == 1 ? "" : "s", ndev, config_engine_name(srv->engine));
		topo_model_free(m);
		return -EINVAL;
	}

	/* The whole-node communicator: rank i on device i. */
	unsigned ids[TOPO_MAX_DEVICES];
	for (unsigned i = 0; i < ndev; i++)
		ids[i] = i;
	struct topo_select_params p;
	topo_select_params_default(&p);
	p.force = srv->cfg.algo;
	/* A host-engine step is a wait that often needs a context switch (its
	 * ranks and workers share cores), not a GPU flag poll. */
	if (srv->engine == DFCCLD_ENGINE_HOST)
		p.step_us = HOST_ENGINE_STEP_US;
	srv->select_params = p;
	unsigned ntrees = ndev < TOPO_MAX_TREES ? ndev : TOPO_MAX_TREES;
	struct topo_select_table *t = NULL;
	struct topo_ring *rings = calloc(p.max_channels, sizeof(*rings));
	struct topo_tree *trees = calloc(ntrees, sizeof(*trees));
	rc = rings && trees ? 0 : -ENOMEM;
	if (rc == 0)
		rc = topo_select_table_build(m, ids, ndev, &p, &t);
	if (rc == 0)
		rc = topo_rings(m, ids, ndev, p.max_channels, p.penalty, rings);
	if (rc == 0)
		rc = topo_trees(m, ids, ndev, ntrees, p.penalty, trees);
	if (rc < 0) {
		log_err("server", "cannot compute rings, trees and the selection table: %s", strerror(-rc));
		goto out;
	}
	if (srv->cfg.tuning_file[0]) {
		rc = topo_json_load_tuning(t, srv->cfg.tuning_file, &srv->tuning_text, err, sizeof(err));
		if (rc < 0) {
			log_err("server", "cannot apply the tuning file: %s", err);
			goto out;
		}
		log_info("server", "applied %d selection override%s from %s", rc, rc == 1 ? "" : "s", srv->cfg.tuning_file);
	}
	srv->topo_doc = topo_json_document(m, rings, p.max_channels, trees, ntrees, t);
	rc = srv->topo_doc ? 0 : -ENOMEM;
	if (rc == 0) {
		log_info("server", "topology: %s from %s, %u device%s%s", m->name[0] ? m->name : "unnamed model", source, ndev,
		         ndev == 1 ? "" : "s", p.force ? "; one algorithm forced by the setting 'algo'" : "");
		srv->topo = m;
		m = NULL;
	}
out:
	topo_select_table_free(t);
	free(trees);
	free(rings);
	topo_model_free(m);
	return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------ the socket */

static void on_accept(uv_poll_t *h, int status, int events)
{
	struct server *srv = h->data;
	if (status < 0 || srv->state != SERVER_SERVING)
		return;
	for (;;) {
		int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EMFILE || errno == ENFILE) {
				if (fd_budget_shed(&srv->fds, srv->listen_fd) == 0)
					continue;
				return;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				log_warn("server", "accept: %s", strerror(errno));
			return;
		}
		struct session *s;
		session_new(srv, fd, &s);
	}
}

static int socket_in_use(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int used = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return used;
}

static int server_listen(struct server *srv)
{
	int fd = notify_listen_fd();
	if (fd >= 0) {
		srv->listen_from_systemd = 1;
		log_info("server", "using the socket passed by systemd");
	} else {
		const char *path = srv->cfg.socket_path;
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		if (strlen(path) >= sizeof(sa.sun_path)) {
			log_err("server", "socket path %s is too long", path);
			return -ENAMETOOLONG;
		}
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
		/* The default lives in /run/dfccl, which systemd creates; a
		 * daemon started by hand creates it too. */
		char dir[sizeof(sa.sun_path)];
		snprintf(dir, sizeof(dir), "%s", path);
		char *slash = strrchr(dir, '/');
		if (slash && slash != dir) {
			*slash = '\0';
			if (mkdir(dir, 0755) < 0 && errno != EEXIST)
				log_warn("server", "cannot create %s: %s", dir, strerror(errno));
		}
		if (socket_in_use(path)) {
			log_err("server", "another dfccld is already serving %s", path);
			return -EADDRINUSE;
		}
		unlink(path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return -errno;
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
			int e = errno;
			log_err("server", "cannot listen on %s: %s", path, strerror(e));
			close(fd);
			return -e;
		}
		/* Access: the dfccl group when it exists, else everyone; either
		 * way each client is identified by SO_PEERCRED and can reach
		 * only its own user's communicators. */
		struct group *g = getgrnam("dfccl");
		if (g && chown(path, (uid_t)-1, g->gr_gid) == 0)
			chmod(path, 0660);
		else
			chmod(path, 0666);
	}
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	srv->listen_fd = fd;
	fd_budget_keep_spare(&srv->fds);
	uv_poll_init(srv->loop, &srv->listen_poll, fd);
	srv->listen_poll.data = srv;
	uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
	return 0;
}

/* ------------------------------------------------------------ signals, watchdog, stop */

static void on_signal(uv_signal_t *h, int sig)
{
	struct server *srv = h->data;
	log_notice("server", "received signal %d; shutting down", sig);
	server_stop(srv);
}

static void on_watchdog(uv_timer_t *t)
{
	notify_watchdog();
}

static void close_handle(uv_handle_t *h)
{
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

static void server_finish(struct server *srv)
{
	if (srv->state == SERVER_STOPPED)
		return;
	srv->state = SERVER_STOPPED;
	if (srv->exe_path) { /* a detached server never made these */
		close_handle((uv_handle_t *)&srv->sig_term);
		close_handle((uv_handle_t *)&srv->sig_int);
		close_handle((uv_handle_t *)&srv->watchdog_timer);
	}
	close_handle((uv_handle_t *)&srv->stop_timer);
	comm_free_all(srv);
	watch_close(srv->watch);
	srv->watch = NULL;
	log_info("server", "stopped");
}

static void workers_stopped(struct server *srv)
{
	/* Sessions were told and are closing; end any that still linger. */
	while (srv->sessions)
		session_end(srv->sessions);
	server_finish(srv);
}

static void on_stop_timer(uv_timer_t *t)
{
	struct server *srv = t->data;
	while (srv->sessions)
		session_end(srv->sessions);
}

void server_stop(struct server *srv)
{
	if (srv->state == SERVER_STOPPING || srv->state == SERVER_STOPPED)
		return;
	srv->state = SERVER_STOPPING;
	notify_stopping();
	if (srv->listen_fd >= 0) {
		uv_poll_stop(&srv->listen_poll);
		close_handle((uv_handle_t *)&srv->listen_poll);
		close(srv->listen_fd);
		srv->listen_fd = -1;
		if (!srv->listen_from_systemd)
			unlink(srv->cfg.socket_path);
	}
	for (struct session *s = srv->sessions; s; s = s->next)
		session_end_with_notice(s, DFCCL__V1__ERROR_CODE__ERROR_SHUTTING_DOWN,
		                        "dfccld is shutting down; every communicator of this process is gone");
	uv_timer_start(&srv->stop_timer, on_stop_timer, 500, 0);
	if (srv->workers)
		workers_stop(srv->workers, workers_stopped);
	else
		workers_stopped(srv);
}

/* ------------------------------------------------------------ run */

/* Whose uid workers run as, from the setting, MPS and the daemon's own
 * credentials and privilege. */
static void server_settle_worker_users(struct server *srv)
{
	worker_user_policy_init(&srv->worker_users, srv->cfg.worker_user, srv->mps_active, geteuid(), getegid(),
	                        worker_user_can_switch());
}

static void server_base_init(struct server *srv, uv_loop_t *loop, const struct dfccld_config *cfg)
{
	memset(srv, 0, sizeof(*srv));
	srv->loop = loop;
	srv->cfg = *cfg;
	srv->listen_fd = -1;
	srv->start_ms = server_now_ms();
	srv->users.limits.max_sessions = cfg->max_sessions_per_uid;
	srv->users.limits.max_registered_bytes = cfg->max_registered_bytes_per_uid;
	srv->users.limits.max_comms = cfg->max_comms_per_uid;
	srv->users.limits.max_regs = cfg->max_regs_per_uid;
	srv->users.limits.max_qps = cfg->max_qps_per_uid;
	/* Each worker keeps its channel, its stats page and its process's
	 * descriptors in the supervisor. */
	fd_budget_init(&srv->fds, cfg->fd_reserve, 4 * (cfg->host_devices > 8 ? cfg->host_devices : 8));
	srv->engine = cfg->engine == DFCCLD_ENGINE_CUDA ? DFCCLD_ENGINE_CUDA : DFCCLD_ENGINE_HOST;
	server_settle_worker_users(srv);
	uv_timer_init(loop, &srv->stop_timer);
	srv->stop_timer.data = srv;
	/* Without a watcher the daemon still serves; only timeouts, dfcclctl
	 * stuck and the flight recorder are missing, which the log says. */
	if (watch_new(srv, &srv->watch) < 0)
		log_err("server", "out of memory creating the collective watcher: no timeouts, stuck reports or flight "
		        "recorders");
}

int server_run(const struct dfccld_config *cfg, const char *exe_path)
{
	static struct server srv_storage;
	struct server *srv = &srv_storage;
	uv_loop_t *loop = uv_default_loop();
	server_base_init(srv, loop, cfg);
	srv->exe_path = exe_path;
	srv->state = SERVER_STARTING;
	signal(SIGPIPE, SIG_IGN);

	uv_signal_init(loop, &srv->sig_term);
	uv_signal_init(loop, &srv->sig_int);
	srv->sig_term.data = srv->sig_int.data = srv;
	uv_signal_start(&srv->sig_term, on_signal, SIGTERM);
	uv_signal_start(&srv->sig_int, on_signal, SIGINT);
	uv_timer_init(loop, &srv->watchdog_timer);
	srv->watchdog_usec = notify_watchdog_usec();
	if (srv->watchdog_usec) {
		uint64_t ms = srv->watchdog_usec / 2000u;
		uv_timer_start(&srv->watchdog_timer, on_watchdog, ms ? ms : 1, ms ? ms : 1);
	}

	struct device_desc devs[MAX_DEVICES];
	unsigned ndev = 0;
	int rc = server_find_devices(srv, devs, &ndev);
	if (rc == 0) {
		server_settle_worker_users(srv);
		worker_user_log_policy(&srv->worker_users);
		rc = server_load_topology(srv, ndev);
	}
	if (rc == 0) {
		notify_status("starting %u worker%s", ndev, ndev == 1 ? "" : "s");
		rc = workers_new(srv, devs, ndev, &srv->workers);
	}
	if (rc == 0)
		rc = server_listen(srv);
	if (rc < 0) {
		srv->exit_code = 1;
		server_stop(srv);
	} else {
		srv->state = SERVER_SERVING;
		log_notice("server", "dfccld serving %s: %s engine, %u device%s", srv->cfg.socket_path,
		           config_engine_name(srv->engine), ndev, ndev == 1 ? "" : "s");
		notify_status("serving %u %s device%s on %s", ndev, config_engine_name(srv->engine), ndev == 1 ? "" : "s",
		              srv->listen_from_systemd ? "the systemd socket" : srv->cfg.socket_path);
		notify_ready();
	}
	uv_run(loop, UV_RUN_DEFAULT);
	workers_free(srv->workers);
	srv->workers = NULL;
	topo_model_free(srv->topo);
	free(srv->topo_doc);
	free(srv->tuning_text);
	user_table_free(&srv->users);
	uv_loop_close(loop);
	return srv->exit_code;
}

int server_init_detached(struct server *srv, uv_loop_t *loop, const struct dfccld_config *cfg)
{
	server_base_init(srv, loop, cfg);
	srv->state = SERVER_SERVING;
	return 0;
}

void server_fini_detached(struct server *srv)
{
	while (srv->sessions)
		session_end(srv->sessions);
	comm_free_all(srv);
	watch_close(srv->watch);
	srv->watch = NULL;
	close_handle((uv_handle_t *)&srv->stop_timer);
	uv_run(srv->loop, UV_RUN_NOWAIT);
	user_table_free(&srv->users);
}
