/*
 * See harness.h. The daemon's stderr goes to a log file in the test's
 * temporary directory, so a failing test can print what the daemon said.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dfccl_queue.h"

#ifndef DFCCLD_PATH
#error "DFCCLD_PATH must name the dfccld binary"
#endif

uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int text_matches(const char *text, const char *pattern)
{
	while (*pattern) {
		if (strncmp(pattern, "{n}", 3) == 0) {
			const char *start = text;
			int dots = 0;
			while ((*text >= '0' && *text <= '9') || (*text == '.' && !dots++ && text != start))
				text++;
			if (text == start || text[-1] == '.')
				return 0;
			pattern += 3;
		} else if (*text++ != *pattern++) {
			return 0;
		}
	}
	return *text == '\0';
}

void daemon_dump_log(const struct daemon_proc *d)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return;
	char line[1024];
	fprintf(stderr, "---- dfccld log ----\n");
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fprintf(stderr, "---- end of log ----\n");
	fclose(f);
}

int daemon_log_contains(const struct daemon_proc *d, const char *needle)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return 0;
	char line[1024];
	int n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* Whether the daemon serves ndev devices (*arg; 0: any number but 0) and
 * every worker is up. */
static int all_up(const Dfccl__V1__StatusInfo *st, void *arg)
{
	unsigned ndev = *(unsigned *)arg;
	if (ndev ? st->n_devices != ndev : st->n_devices == 0)
		return 0;
	for (size_t i = 0; i < st->n_devices; i++)
		if (!st->devices[i]->worker_up)
			return 0;
	return 1;
}

static int daemon_vstart(struct daemon_proc *d, const struct daemon_opts *o, unsigned ndev, va_list ap);

int daemon_setup2(void **state)
{
	struct daemon_proc *d = calloc(1, sizeof(*d));
	if (!d || daemon_start(d, 2, NULL) < 0) {
		free(d);
		return -1;
	}
	*state = d;
	return 0;
}

int daemon_teardown(void **state)
{
	struct daemon_proc *d = *state;
	int rc = daemon_stop(d);
	free(d);
	return rc == 0 ? 0 : -1;
}

int daemon_start(struct daemon_proc *d, unsigned ndev, ...)
{
	static const struct daemon_opts defaults = {0};
	va_list ap;
	va_start(ap, ndev);
	int rc = daemon_vstart(d, &defaults, ndev, ap);
	va_end(ap);
	return rc;
}

int daemon_start_with(struct daemon_proc *d, const struct daemon_opts *o, unsigned ndev, ...)
{
	va_list ap;
	va_start(ap, ndev);
	int rc = daemon_vstart(d, o, ndev, ap);
	va_end(ap);
	return rc;
}

static int daemon_vstart(struct daemon_proc *d, const struct daemon_opts *o, unsigned ndev, va_list ap)
{
	if (!o->reuse) {
		memset(d, 0, sizeof(*d));
		snprintf(d->dir, sizeof(d->dir), "/tmp/dfccl-test-XXXXXX");
		if (!mkdtemp(d->dir))
			return -1;
		/* Other uids must reach the socket (the uid tests drop privileges). */
		chmod(d->dir, 0755);
		if (o->run_as > 0 && chown(d->dir, o->run_as, o->run_as) < 0)
			return -1;
		snprintf(d->socket, sizeof(d->socket), "%s/dfccld.sock", d->dir);
		snprintf(d->log, sizeof(d->log), "%s/dfccld.log", d->dir);
	}
	setenv("DFCCL_SOCKET", d->socket, 1);

	char ndevs[16];
	snprintf(ndevs, sizeof(ndevs), "%u", ndev);
	const char *exe = o->exe ? o->exe : DFCCLD_PATH;
	const char *argv[48] = {exe, "--socket", d->socket, "--log-level", "debug", "--log-target", "stderr",
	                        "--config", "/dev/null", "--engine", o->engine ? o->engine : "host"};
	int argc = 11;
	if (!o->engine || strcmp(o->engine, "host") == 0) {
		argv[argc++] = "--host-devices";
		argv[argc++] = ndevs;
	}
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL && argc < 46)
		argv[argc++] = a;
	argv[argc] = NULL;

	d->pid = fork();
	if (d->pid < 0)
		return -1;
	if (d->pid == 0) {
		/* A test that fails between start and stop (cmocka jumps out of
		 * it) or is killed must not leave its daemon behind. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		int fd = open(d->log, O_WRONLY | O_CREAT | O_CLOEXEC | (o->reuse ? O_APPEND : O_TRUNC), 0644);
		if (fd >= 0) {
			dup2(fd, STDERR_FILENO);
			dup2(fd, STDOUT_FILENO);
		}
		if (!o->keep_systemd_env) {
			unsetenv("NOTIFY_SOCKET");
			unsetenv("WATCHDOG_USEC");
		}
		if (o->run_as > 0 && (setgroups(0, NULL) < 0 || setgid(o->run_as) < 0 || setuid(o->run_as) < 0))
			_exit(126);
		unsetenv("WATCHDOG_PID");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		if (o->listen_fd > 0) {
			/* Socket activation: the socket on fd 3, LISTEN_PID = us. */
			char pid[16];
			if (o->listen_fd == 3)
				fcntl(3, F_SETFD, 0); /* dup2 onto itself keeps close-on-exec */
			else
				dup2(o->listen_fd, 3);
			snprintf(pid, sizeof(pid), "%d", (int)getpid());
			setenv("LISTEN_FDS", "1", 1);
			setenv("LISTEN_PID", pid, 1);
		}
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	if (o->listen_path)
		snprintf(d->socket, sizeof(d->socket), "%s", o->listen_path);
	/* Wait for the socket, then for every worker (a GPU's worker creates
	 * its CUDA context and loads every kernel first). */
	uint64_t deadline = now_ms() + (o->engine && strcmp(o->engine, "cuda") == 0 ? 30000 : 15000);
	struct raw_client c;
	while (now_ms() < deadline) {
		if (raw_connect(&c, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL) == 0) {
			int ok = raw_wait_status(&c, all_up, &ndev, (int)(deadline - now_ms()));
			raw_close(&c);
			if (ok)
				return 0;
			break;
		}
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->pid = 0;
			break;
		}
		usleep(20000);
	}
	fprintf(stderr, "dfccld did not come up\n");
	daemon_dump_log(d);
	return -1;
}

int child_wait(pid_t pid, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	int st;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return -1;
		if (now_ms() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		usleep(5000);
	}
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return -1;
}

int daemon_stop(struct daemon_proc *d)
{
	int rc = 0; /* a test may have stopped it already */
	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		rc = child_wait(d->pid, 10000);
		d->pid = 0;
	}
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	if (d->dir[0] && system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d->dir);
	return rc;
}

pid_t child_exec(const char *path, const char *const *argv, const char *out_path, const char *err_path)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int fe = err_path ? open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : fo;
	if (fo < 0 || fe < 0 || dup2(fo, STDOUT_FILENO) < 0 || dup2(fe, STDERR_FILENO) < 0)
		_exit(126);
	execv(path, (char *const *)argv);
	_exit(127);
}

void read_text_file(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, len - 1, f) : 0;
	buf[n] = '\0';
	if (f)
		fclose(f);
}

pid_t child_run(int (*fn)(void *arg, int rank), void *arg, int rank)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0)
		_exit(fn(arg, rank));
	return pid;
}


int daemon_by_algo(const struct daemon_proc *d, uint64_t *out)
{
	memset(out, 0, DFCCL_ALGO_COUNT_ * sizeof(out[0]));
	dfccl_envelope *r = daemon_query(d, DFCCL__V1__QUERY_KIND__QUERY_STATS);
	if (!r)
		return -1;
	const Dfccl__V1__QueryReply *q = r->query_reply;
	int rc = q ? 0 : -1;
	for (size_t i = 0; q && i < q->n_stats; i++)
		for (size_t k = 0; k < q->stats[i]->n_by_algo && k < DFCCL_ALGO_COUNT_; k++)
			out[k] += q->stats[i]->by_algo[k];
	frame_envelope_free(r);
	return rc;
}

/* ------------------------------------------------------------ raw client */

static void set_timeout(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

dfccl_envelope *raw_next(struct raw_client *c, int timeout_ms, int *rfds, unsigned *nrfds)
{
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned n = 0;
	dfccl_envelope *env = NULL;
	set_timeout(c->fd, timeout_ms);
	int rc = frame_recv(&c->rd, c->fd, &env, fds, &n);
	if (rc <= 0)
		return NULL;
	if (rfds && nrfds) {
		memcpy(rfds, fds, n * sizeof(int));
		*nrfds = n;
	} else {
		frame_close_fds(fds, n);
	}
	return env;
}

dfccl_envelope *raw_request(struct raw_client *c, dfccl_envelope *env, const int *fds, unsigned nfds, int *rfds,
                            unsigned *nrfds)
{
	env->request_id = c->next_req++;
	/* A daemon that refused the connection has said why and hung up: the
	 * send may fail, the reason is still there to read. */
	int sent = frame_send(c->fd, env, fds, nfds);
	for (;;) {
		dfccl_envelope *r = raw_next(c, sent < 0 ? 1000 : 10000, rfds, nrfds);
		if (!r)
			return NULL;
		/* The reply; or an error that answers no request in particular
		 * (a refused connection, a malformed frame). Notices are skipped. */
		if (r->request_id == env->request_id ||
		    (r->request_id == 0 && r->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR))
			return r;
		frame_envelope_free(r);
	}
}

int raw_connect(struct raw_client *c, const char *socket_path, uint32_t minv, uint32_t maxv, dfccl_envelope **err_env)
{
	memset(c, 0, sizeof(*c));
	c->next_req = 1;
	if (err_env)
		*err_env = NULL;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		return -1;
	}
	Dfccl__V1__Hello h = DFCCL__V1__HELLO__INIT;
	h.min_version = minv;
	h.max_version = maxv;
	h.client_name = "integration-test";
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	dfccl_envelope *r = raw_request(c, &env, NULL, 0, NULL, NULL);
	if (r && r->body_case == DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY) {
		c->session_id = r->hello_reply->session_id;
		frame_envelope_free(r);
		return 0;
	}
	if (err_env)
		*err_env = r;
	else
		frame_envelope_free(r);
	raw_close(c);
	return -1;
}

void raw_close(struct raw_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	frame_reader_free(&c->rd);
}

dfccl_envelope *daemon_query(const struct daemon_proc *d, int kind)
{
	struct raw_client c;
	if (raw_connect(&c, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL) < 0)
		return NULL;
	dfccl_envelope *r = raw_query(&c, kind);
	raw_close(&c);
	return r;
}

dfccl_envelope *raw_query(struct raw_client *c, int kind)
{
	Dfccl__V1__Query q = DFCCL__V1__QUERY__INIT;
	q.kind = kind;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY;
	env.query = &q;
	dfccl_envelope *r = raw_request(c, &env, NULL, 0, NULL, NULL);
	if (r && r->body_case != DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY) {
		frame_envelope_free(r);
		return NULL;
	}
	return r;
}

int raw_wait_status(struct raw_client *c, int (*cond)(const Dfccl__V1__StatusInfo *st, void *arg), void *arg,
                    int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	do {
		dfccl_envelope *r = raw_query(c, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
		if (!r)
			return 0;
		int ok = cond(r->query_reply->status, arg);
		frame_envelope_free(r);
		if (ok)
			return 1;
		usleep(20000);
	} while (now_ms() < deadline);
	return 0;
}

int sealed_memfd(off_t size)
{
	int fd = memfd_create("dfccl-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

dfccl_envelope *raw_register_memfd(struct raw_client *c, uint32_t device, uint64_t offset, uint64_t size, int fd)
{
	Dfccl__V1__RegisterMem rm = DFCCL__V1__REGISTER_MEM__INIT;
	rm.kind = DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD;
	rm.device = device;
	rm.offset = offset;
	rm.size = size;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	env.register_mem = &rm;
	return raw_request(c, &env, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, NULL, NULL);
}

dfccl_envelope *raw_attach(struct raw_client *c, uint32_t device, uint32_t sq_entries, int *fds, unsigned *nfds)
{
	Dfccl__V1__AttachDevice a = DFCCL__V1__ATTACH_DEVICE__INIT;
	a.device = device;
	a.sq_entries = sq_entries;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ATTACH;
	env.attach = &a;
	return raw_request(c, &env, NULL, 0, fds, nfds);
}
