/*
 * The session with dfccld; see client.h for the model.
 *
 * Locks, in the order they may nest: default_lock (the process-wide session
 * pointer, held while it is opened), attach_lock (held across the attach
 * request, so two threads never map the same device twice) or map_lock
 * (held across the status query that builds the device map), then either
 * lock (waiters, async slots, the lost state) or write_lock (one frame at a
 * time on the socket), never both. The poller takes only `lock`, and never
 * while reading, so a slow daemon cannot make a caller wait for a lock.
 */
#include "client.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "cudrv.h"
#include "dfccl_internal.h"
#include "errors.h"
#include "mem.h"
#include "pci_id.h"
#include "qp.h"
#include "req.h"
#include "stream.h"

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
#define CLIENT_LIBRARY_VERSION STRINGIFY(DFCCL_MAJOR) "." STRINGIFY(DFCCL_MINOR) "." STRINGIFY(DFCCL_PATCH)

/* How long the Hello may take. Generous, because a socket-activated daemon
 * answers only once it has started its workers; finite, so that a wedged
 * daemon turns into an error instead of a silent hang. */
#define CLIENT_HELLO_TIMEOUT_S 60

/*
 * How the numbers an application gives name the daemon's devices in one
 * session: built once, by devmap_build, and read without a lock after
 * `built` is set.
 */
struct devmap {
	bool built;           /* atomic */
	bool by_bus_id;       /* the numbers are CUDA ordinals of this process */
	int nordinals;        /* GPUs this process sees (by_bus_id) */
	int *index_of;        /* [nordinals]: the daemon's device with each one's bus id, or -1 */
	int *ordinal_of;      /* [info.ndevices]: the ordinal of each daemon device, or -1 */
	char (*bus_id)[PCI_ID_MAX]; /* [nordinals]: as the driver wrote it; "" where it failed */
	char why[256];        /* the driver's reason for the first bus id it could not give */
	char served[2048];    /* the daemon's devices, for sentences: "0 (0000:1b:00.0), 1 (...)" */
};

/* One caller blocked in a request. Lives on the caller's stack. */
struct client_waiter {
	struct client_waiter *next;
	uint64_t id;
	pthread_cond_t cond;
	bool done;                  /* the reply was delivered into rep */
	struct client_reply *rep;
	struct client_async *bind;  /* client_comm_init: link under the new comm_id */
};

struct client {
	int refs;              /* atomic */
	int fd;
	int lost;              /* atomic; qp waits read it through qp->lost */
	uint64_t next_id;      /* atomic; request ids, never 0 */
	bool poller_started;
	pthread_t poller;

	pthread_mutex_t lock;  /* waiters, asyncs, lost_reason */
	struct client_waiter *waiters;
	struct client_async *asyncs;
	char lost_reason[256];

	pthread_mutex_t write_lock;

	pthread_mutex_t attach_lock;
	struct qp **qps;       /* [info.ndevices] */

	pthread_mutex_t map_lock; /* held while the map is built */
	struct devmap map;

	struct req_poller *reqs; /* the completion thread and its trackers */

	struct frame_reader reader; /* the hello, then the poller only */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct client_info info;
};

static _Thread_local int current_device;

static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static struct client *default_client;

const char *client_socket_path(void)
{
	const char *p = getenv("DFCCL_SOCKET");
	return p && *p ? p : DFCCL_DEFAULT_SOCKET;
}

int client_current_device(void)
{
	return current_device;
}

struct req_poller *client_req_poller(const struct client *c)
{
	return c->reqs;
}

const struct client_info *client_info(const struct client *c)
{
	return &c->info;
}

bool client_lost(const struct client *c)
{
	return __atomic_load_n(&c->lost, __ATOMIC_ACQUIRE) != 0;
}

/* The sentence of a lost session: rc is 0 for an end of stream, else the
 * negative errno of the failed read. */
static void lost_sentence(int rc, char *msg, size_t msglen)
{
	snprintf(msg, msglen, "lost the connection to dfccld (%s); is dfccld running? (systemctl status dfccld)",
	         rc == 0 ? "the daemon closed it" : strerror(-rc));
}

bool client_gone(struct client *c, char *msg, size_t msglen)
{
	if (client_lost(c)) {
		if (msg) {
			pthread_mutex_lock(&c->lock);
			snprintf(msg, msglen, "%s", c->lost_reason);
			pthread_mutex_unlock(&c->lock);
		}
		return true;
	}
	/* The daemon's end is closed once its process is gone, before the
	 * poller reads up to the end of the stream: ask the socket. Only a
	 * closed peer raises POLLRDHUP or POLLHUP on a Unix stream socket,
	 * and nothing is read, so the poller stays its only reader. */
	struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
	if (c->fd < 0 || poll(&p, 1, 0) != 1 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
		return false;
	if (msg)
		lost_sentence(0, msg, msglen);
	return true;
}

dfcclResult_t client_check_device(const struct client *c, int device)
{
	if (device < 0 || (uint32_t)device >= c->info.ndevices)
		return errors_set(dfcclInvalidArgument, "device %d does not exist: dfccld serves %u device(s) (dfcclGetDeviceCount)",
		                  device, c->info.ndevices);
	return dfcclSuccess;
}

struct client *client_ref(struct client *c)
{
	__atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
	return c;
}

/* Frees a session in any state of construction. */
static void client_destroy(struct client *c)
{
	if (c->poller_started) {
		/* Wakes the poller out of recvmsg with an end of stream. */
		shutdown(c->fd, SHUT_RDWR);
		pthread_join(c->poller, NULL);
	}
	if (c->fd >= 0)
		close(c->fd);
	/* Before the queue pairs: its thread reads their completion words. */
	req_poller_free(c->reqs);
	if (c->qps)
		for (uint32_t i = 0; i < c->info.ndevices; i++)
			qp_free(c->qps[i]);
	free(c->qps);
	free(c->map.index_of);
	free(c->map.ordinal_of);
	free(c->map.bus_id);
	frame_reader_free(&c->reader);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->write_lock);
	pthread_mutex_destroy(&c->attach_lock);
	pthread_mutex_destroy(&c->map_lock);
	free(c);
}

void client_unref(struct client *c)
{
	if (c && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
		client_destroy(c);
}

void client_reply_release(struct client_reply *rep)
{
	frame_close_fds(rep->fds, rep->nfds);
	frame_envelope_free(rep->env);
	*rep = (struct client_reply)CLIENT_REPLY_INIT;
}

/* The result of a reply whose body should be `expect`. */
static dfcclResult_t reply_result(const dfccl_envelope *env, int expect)
{
	if (env->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR) {
		dfcclResult_t r = errors_from_code(env->error->code);
		if (r == dfcclSuccess)
			r = dfcclInternalError;
		return errors_set(r, "%s", env->error->message[0] ? env->error->message : "dfccld refused the request without a reason");
	}
	if ((int)env->body_case != expect)
		return errors_set(dfcclInternalError, "dfccld answered with message %d where %d was expected",
		                  (int)env->body_case, expect);
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- async slots */

static void async_set_locked(struct client_async *a, dfcclResult_t error, const char *message)
{
	if (a->error != dfcclSuccess)
		return;
	snprintf(a->message, sizeof(a->message), "%s", message);
	/* Stored once, after its message: client_async_get looks at it
	 * without the lock. */
	__atomic_store_n(&a->error, error, __ATOMIC_RELEASE);
}

void client_async_set(struct client *c, struct client_async *a, dfcclResult_t error, const char *message)
{
	pthread_mutex_lock(&c->lock);
	async_set_locked(a, error, message);
	pthread_mutex_unlock(&c->lock);
}

/* A slot's error, its message copied into msg; under c->lock. */
static dfcclResult_t async_read_locked(const struct client_async *a, char *msg, size_t msglen)
{
	snprintf(msg, msglen, "%s", a->message);
	return a->error;
}

dfcclResult_t client_async_get(struct client *c, const struct client_async *a, char *msg, size_t msglen)
{
	/* No error, the case of every call that submits (comm_check): no lock
	 * and no copy of the message (6 % of a callback call's issue on the
	 * host, perf). */
	if (__atomic_load_n(&a->error, __ATOMIC_ACQUIRE) == dfcclSuccess) {
		if (msglen)
			msg[0] = '\0';
		return dfcclSuccess;
	}
	pthread_mutex_lock(&c->lock);
	dfcclResult_t r = async_read_locked(a, msg, msglen);
	pthread_mutex_unlock(&c->lock);
	return r;
}

dfcclResult_t client_async_find(struct client *c, uint64_t comm_id, char *msg, size_t msglen)
{
	dfcclResult_t r = dfcclSuccess;
	pthread_mutex_lock(&c->lock);
	for (struct client_async *a = c->asyncs; a; a = a->next)
		if (a->comm_id == comm_id && a->error != dfcclSuccess) {
			r = async_read_locked(a, msg, msglen);
			break;
		}
	pthread_mutex_unlock(&c->lock);
	return r;
}

uint32_t client_async_advice(struct client *c, const struct client_async *a, int *out, uint32_t cap)
{
	pthread_mutex_lock(&c->lock);
	uint32_t n = a->advice_n;
	for (uint32_t i = 0; i < n && i < cap; i++)
		out[i] = (int)a->advice[i];
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* A shrink advice replaces the slot's earlier one; ranks a communicator
 * cannot have are dropped. */
static void async_advise_locked(struct client_async *a, const uint32_t *exclude, size_t n)
{
	a->advice_n = 0;
	for (size_t i = 0; i < n && a->advice_n < DFCCL_COMM_MAX_RANKS; i++)
		if (exclude[i] < DFCCL_COMM_MAX_RANKS)
			a->advice[a->advice_n++] = exclude[i];
}

void client_async_remove(struct client *c, struct client_async *a)
{
	pthread_mutex_lock(&c->lock);
	for (struct client_async **p = &c->asyncs; *p; p = &(*p)->next) {
		if (*p == a) {
			*p = a->next;
			break;
		}
	}
	a->next = NULL;
	pthread_mutex_unlock(&c->lock);
}

/* A notice with a comm_id concerns that communicator. Without one it
 * concerns the session: a lost device fails the communicators on that
 * device, anything else (the daemon shutting down) fails them all. */
static void client_notice(struct client *c, const Dfccl__V1__Notice *n)
{
	dfcclResult_t r = errors_from_code(n->code);
	if (r == dfcclSuccess)
		return;
	char msg[1024];
	if (n->message[0])
		snprintf(msg, sizeof(msg), "%s", n->message);
	else
		snprintf(msg, sizeof(msg), "dfccld reported: %s", dfcclGetErrorString(r));

	pthread_mutex_lock(&c->lock);
	for (struct client_async *a = c->asyncs; a; a = a->next) {
		bool hit;
		if (n->comm_id != 0)
			hit = a->comm_id == n->comm_id;
		else if (n->code == DFCCL__V1__ERROR_CODE__ERROR_DEVICE_LOST)
			hit = a->device == n->device;
		else
			hit = true;
		if (!hit)
			continue;
		/* Error and advice together, so a thread that sees one sees both. */
		async_set_locked(a, r, msg);
		if (n->n_shrink_exclude && n->comm_id != 0)
			async_advise_locked(a, n->shrink_exclude, n->n_shrink_exclude);
	}
	pthread_mutex_unlock(&c->lock);
}

/* ---------------------------------------------------------------- the poller */

static void waiter_unlink_locked(struct client *c, struct client_waiter *w)
{
	for (struct client_waiter **p = &c->waiters; *p; p = &(*p)->next) {
		if (*p == w) {
			*p = w->next;
			return;
		}
	}
}

/* Hands a frame to whoever waits for it; takes ownership of env and fds. */
static void client_dispatch(struct client *c, dfccl_envelope *env, int *fds, unsigned nfds)
{
	if (env->request_id == 0) {
		if (env->body_case == DFCCL__V1__ENVELOPE__BODY_NOTICE)
			client_notice(c, env->notice);
		frame_close_fds(fds, nfds);
		frame_envelope_free(env);
		return;
	}

	pthread_mutex_lock(&c->lock);
	struct client_waiter *w = c->waiters;
	while (w && w->id != env->request_id)
		w = w->next;
	if (w) {
		w->rep->env = env;
		memcpy(w->rep->fds, fds, nfds * sizeof(int));
		w->rep->nfds = nfds;
		if (w->bind && env->body_case == DFCCL__V1__ENVELOPE__BODY_COMM_INIT_REPLY) {
			w->bind->comm_id = env->comm_init_reply->comm_id;
			w->bind->next = c->asyncs;
			c->asyncs = w->bind;
		}
		w->done = true;
		waiter_unlink_locked(c, w);
		pthread_cond_signal(&w->cond);
	}
	pthread_mutex_unlock(&c->lock);

	if (!w) {
		/* Nobody asked: requests are never abandoned, so this is a daemon
		 * bug; dropping the frame is all that can be done. */
		frame_close_fds(fds, nfds);
		frame_envelope_free(env);
	}
}

static void client_mark_lost(struct client *c, int rc)
{
	pthread_mutex_lock(&c->lock);
	lost_sentence(rc, c->lost_reason, sizeof(c->lost_reason));
	__atomic_store_n(&c->lost, 1, __ATOMIC_RELEASE);
	for (struct client_waiter *w = c->waiters; w; w = w->next)
		pthread_cond_signal(&w->cond);
	c->waiters = NULL;
	for (struct client_async *a = c->asyncs; a; a = a->next)
		async_set_locked(a, dfcclDaemonUnavailable, c->lost_reason);
	pthread_mutex_unlock(&c->lock);
}

/*
 * The heartbeat the daemon reads to tell a stopped process from a slow one:
 * stored into every queue pair each CLIENT_HEARTBEAT_MS while the process
 * runs, whatever its other threads do, so only a process that does not run
 * at all (SIGSTOP, a debugger, a machine-wide stall) lets it age.
 */
#define CLIENT_HEARTBEAT_MS 250

static void client_heartbeat(struct client *c)
{
	for (uint32_t d = 0; d < c->info.ndevices; d++) {
		struct qp *q = __atomic_load_n(&c->qps[d], __ATOMIC_ACQUIRE);
		if (q)
			qp_heartbeat(q);
	}
}

static void *client_poll(void *arg)
{
	struct client *c = arg;
	int rc;
	for (;;) {
		dfccl_envelope *env;
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 0;
		/* Any failure, an undecodable frame included, ends the session: the
		 * frame may have been the reply some caller waits for. */
		rc = frame_reader_next(&c->reader, &env, fds, &nfds);
		if (rc < 0)
			break;
		if (rc == 1) {
			client_dispatch(c, env, fds, nfds);
			continue;
		}
		struct pollfd p = {.fd = c->fd, .events = POLLIN};
		int n = poll(&p, 1, CLIENT_HEARTBEAT_MS);
		client_heartbeat(c);
		if (n == 0 || (n < 0 && errno == EINTR))
			continue;
		rc = frame_reader_fill(&c->reader, c->fd);
		if (rc == -EINTR || rc == -EAGAIN)
			continue;
		if (rc <= 0)
			break;
	}
	client_mark_lost(c, rc);
	return NULL;
}

/* ---------------------------------------------------------------- requests */

static dfcclResult_t client_call(struct client *c, dfccl_envelope *req, const int *fds, unsigned nfds, int expect,
                                 struct client_async *bind, struct client_reply *rep)
{
	dfcclResult_t r = dfcclSuccess;
	struct client_waiter w = {.rep = rep, .bind = bind};

	*rep = (struct client_reply)CLIENT_REPLY_INIT;
	w.id = __atomic_add_fetch(&c->next_id, 1, __ATOMIC_RELAXED);
	req->request_id = w.id;
	pthread_cond_init(&w.cond, NULL);

	/* Linked before the frame leaves, so the reply always finds it. */
	pthread_mutex_lock(&c->lock);
	if (client_lost(c)) {
		r = errors_set(dfcclDaemonUnavailable, "%s", c->lost_reason);
		pthread_mutex_unlock(&c->lock);
		goto out;
	}
	w.next = c->waiters;
	c->waiters = &w;
	pthread_mutex_unlock(&c->lock);

	pthread_mutex_lock(&c->write_lock);
	int rc = frame_send(c->fd, req, fds, nfds);
	pthread_mutex_unlock(&c->write_lock);

	pthread_mutex_lock(&c->lock);
	if (rc < 0) {
		waiter_unlink_locked(c, &w);
		pthread_mutex_unlock(&c->lock);
		if (rc == -EINVAL || rc == -EMSGSIZE)
			r = errors_set(dfcclInternalError, "cannot encode a request for dfccld: %s", strerror(-rc));
		else
			r = errors_set(dfcclDaemonUnavailable, "cannot send to dfccld at %s: %s; is dfccld running? "
			               "(systemctl status dfccld)", c->path, strerror(-rc));
		goto out;
	}
	while (!w.done && !client_lost(c))
		pthread_cond_wait(&w.cond, &c->lock);
	if (!w.done) {
		waiter_unlink_locked(c, &w);
		r = errors_set(dfcclDaemonUnavailable, "%s", c->lost_reason);
	}
	pthread_mutex_unlock(&c->lock);

	if (r == dfcclSuccess) {
		r = reply_result(rep->env, expect);
		if (r != dfcclSuccess) {
			/* A failed comm_init never linked `bind`; nothing to undo. */
			client_reply_release(rep);
		}
	}
out:
	pthread_cond_destroy(&w.cond);
	return r;
}

dfcclResult_t client_request(struct client *c, dfccl_envelope *req, const int *fds, unsigned nfds, int expect,
                             struct client_reply *rep)
{
	return client_call(c, req, fds, nfds, expect, NULL, rep);
}

dfcclResult_t client_query(struct client *c, int kind, struct client_reply *rep)
{
	Dfccl__V1__Query query = DFCCL__V1__QUERY__INIT;
	query.kind = (Dfccl__V1__QueryKind)kind;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY;
	req.query = &query;
	return client_request(c, &req, NULL, 0, DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY, rep);
}

dfcclResult_t client_request_ok(struct client *c, dfccl_envelope *req)
{
	struct client_reply rep;
	dfcclResult_t r = client_call(c, req, NULL, 0, DFCCL__V1__ENVELOPE__BODY_OK, NULL, &rep);
	if (r == dfcclSuccess)
		client_reply_release(&rep);
	return r;
}

dfcclResult_t client_comm_init(struct client *c, dfccl_envelope *req, struct client_async *async,
                               struct client_reply *rep)
{
	return client_call(c, req, NULL, 0, DFCCL__V1__ENVELOPE__BODY_COMM_INIT_REPLY, async, rep);
}

/* ---------------------------------------------------------------- connecting */

/* DFCCL_PROTO_VERSION_OVERRIDE=N: claim exactly version N (a diagnostic
 * knob for testing the daemon's version negotiation). */
static dfcclResult_t hello_versions(uint32_t *minv, uint32_t *maxv)
{
	*minv = DFCCL_PROTO_MIN_VERSION;
	*maxv = DFCCL_PROTO_VERSION;
	const char *ov = getenv("DFCCL_PROTO_VERSION_OVERRIDE");
	if (!ov || !*ov)
		return dfcclSuccess;
	char *end;
	errno = 0;
	unsigned long v = strtoul(ov, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return errors_set(dfcclInvalidArgument, "DFCCL_PROTO_VERSION_OVERRIDE=%s is not a protocol version number", ov);
	*minv = *maxv = (uint32_t)v;
	return dfcclSuccess;
}

static void set_recv_timeout(int fd, int seconds)
{
	struct timeval tv = {.tv_sec = seconds, .tv_usec = 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

/* Hello and its reply, before the poller runs. */
static dfcclResult_t client_hello(struct client *c, const char *name)
{
	dfcclResult_t r;
	uint32_t minv, maxv;
	dfccl_envelope *env = NULL;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds = 0;

	r = hello_versions(&minv, &maxv);
	if (r != dfcclSuccess)
		return r;

	Dfccl__V1__Hello hello = DFCCL__V1__HELLO__INIT;
	hello.min_version = minv;
	hello.max_version = maxv;
	hello.client_name = (char *)name;
	hello.library_version = (char *)CLIENT_LIBRARY_VERSION;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.request_id = __atomic_add_fetch(&c->next_id, 1, __ATOMIC_RELAXED);
	req.body_case = DFCCL__V1__ENVELOPE__BODY_HELLO;
	req.hello = &hello;

	int rc = frame_send(c->fd, &req, NULL, 0);
	if (rc < 0)
		return errors_set(dfcclDaemonUnavailable, "cannot talk to dfccld at %s: %s", c->path, strerror(-rc));
	set_recv_timeout(c->fd, CLIENT_HELLO_TIMEOUT_S);
	rc = frame_recv(&c->reader, c->fd, &env, fds, &nfds);
	set_recv_timeout(c->fd, 0);
	if (rc <= 0) {
		if (rc == 0)
			return errors_set(dfcclDaemonUnavailable, "dfccld at %s closed the connection before answering Hello", c->path);
		if (rc == -EAGAIN)
			return errors_set(dfcclDaemonUnavailable, "dfccld at %s did not answer Hello within %d s",
			                  c->path, CLIENT_HELLO_TIMEOUT_S);
		return errors_set(dfcclDaemonUnavailable, "cannot read dfccld's answer to Hello at %s: %s", c->path,
		                  strerror(-rc));
	}
	frame_close_fds(fds, nfds);

	if (env->request_id != req.request_id) {
		r = errors_set(dfcclInternalError, "dfccld answered Hello with request id %llu instead of %llu",
		               (unsigned long long)env->request_id, (unsigned long long)req.request_id);
		goto out;
	}
	r = reply_result(env, DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY);
	if (r != dfcclSuccess)
		goto out;
	const Dfccl__V1__HelloReply *h = env->hello_reply;
	if (h->version < minv || h->version > maxv) {
		r = errors_set(dfcclVersionMismatch, "dfccld chose protocol version %u; this libdfccl speaks %u to %u",
		               h->version, minv, maxv);
		goto out;
	}
	c->info.version = h->version;
	snprintf(c->info.daemon_version, sizeof(c->info.daemon_version), "%s", h->daemon_version);
	c->info.session_id = h->session_id;
	c->info.engine = h->engine;
	c->info.ndevices = h->ndevices;
out:
	frame_envelope_free(env);
	return r;
}

dfcclResult_t client_open(const char *path, const char *name, struct client **out)
{
	dfcclResult_t r;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (strlen(path) >= sizeof(sa.sun_path))
		return errors_set(dfcclInvalidArgument, "socket path %s is longer than %zu bytes", path, sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);

	struct client *c = calloc(1, sizeof(*c));
	if (!c)
		return errors_set(dfcclSystemError, "out of memory");
	c->refs = 1;
	c->fd = -1;
	c->reader = (struct frame_reader)FRAME_READER_INIT;
	snprintf(c->path, sizeof(c->path), "%s", path);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->write_lock, NULL);
	pthread_mutex_init(&c->attach_lock, NULL);
	pthread_mutex_init(&c->map_lock, NULL);

	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		r = errors_set(dfcclSystemError, "cannot create a socket: %s", strerror(errno));
		goto fail;
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = errors_set(dfcclDaemonUnavailable, "cannot connect to %s: %s; is dfccld running? (systemctl start dfccld)",
		               path, strerror(errno));
		goto fail;
	}
	r = client_hello(c, name);
	if (r != dfcclSuccess)
		goto fail;
	r = req_poller_new(&c->reqs);
	if (r != dfcclSuccess)
		goto fail;
	c->qps = calloc(c->info.ndevices ? c->info.ndevices : 1, sizeof(*c->qps));
	if (!c->qps) {
		r = errors_set(dfcclSystemError, "out of memory");
		goto fail;
	}

	/* The poller must never run the application's signal handlers. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(&c->poller, NULL, client_poll, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		r = errors_set(dfcclSystemError, "cannot start the libdfccl poller thread: %s", strerror(rc));
		goto fail;
	}
	c->poller_started = true;
	*out = c;
	return dfcclSuccess;

fail:
	client_destroy(c);
	return r;
}

/*
 * At exit, settle the process-wide session's poller so that the thread
 * sanitizer does not report it as leaked: join it if the connection was
 * lost (it has finished, and communicators may still hold the session), and
 * detach it otherwise (other threads may still use the session while the
 * process exits, and the daemon may close the connection at any moment).
 * The library keeps its reference, so the session is never freed under the
 * detached thread. Registered with atexit (which glibc ties to this library,
 * so dlclose runs it too) rather than as a destructor, because the
 * sanitizer's own exit checks run before the destructors of shared
 * libraries.
 */
static void client_default_reap(void)
{
	pthread_mutex_lock(&default_lock);
	struct client *c = default_client;
	if (c && c->poller_started) {
		if (client_lost(c))
			pthread_join(c->poller, NULL);
		else
			pthread_detach(c->poller);
		c->poller_started = false;
	}
	pthread_mutex_unlock(&default_lock);
}

/*
 * A forked child inherits the session's socket and queue pairs but not its
 * poller, and must not speak for the parent on either. The child marks the
 * inherited session lost (so communicators and buffers it inherited fail
 * with dfcclDaemonUnavailable instead of writing into the parent's queues),
 * closes its copy of the socket, and forgets it, so that its first call opens
 * a session of its own. The session's memory is left alone: inherited
 * objects still point to it. Its locks may have been held by threads that
 * do not exist in the child, hence the re-initialisation.
 */
static void client_fork_prepare(void)
{
	pthread_mutex_lock(&default_lock);
}

static void client_fork_parent(void)
{
	pthread_mutex_unlock(&default_lock);
}

static void client_fork_child(void)
{
	struct client *c = default_client;
	pthread_mutex_init(&default_lock, NULL);
	if (!c)
		return;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->write_lock, NULL);
	pthread_mutex_init(&c->attach_lock, NULL);
	pthread_mutex_init(&c->map_lock, NULL);
	if (c->reqs)
		req_poller_after_fork(c->reqs);
	snprintf(c->lost_reason, sizeof(c->lost_reason),
	         "this process was forked from the one that connected to dfccld; communicators and buffers do not "
	         "survive fork: create them after it");
	for (struct client_async *a = c->asyncs; a; a = a->next)
		async_set_locked(a, dfcclDaemonUnavailable, c->lost_reason);
	c->waiters = NULL;
	__atomic_store_n(&c->lost, 1, __ATOMIC_RELEASE);
	c->poller_started = false;
	qp_words_after_fork();
	close(c->fd);
	c->fd = -1;
	default_client = NULL;
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void client_default_once(void)
{
	atexit(client_default_reap);
	pthread_atfork(client_fork_prepare, client_fork_parent, client_fork_child);
}

static dfcclResult_t client_default_asking(struct client **out, bool ask_socket)
{
	dfcclResult_t r = dfcclSuccess;
	pthread_mutex_lock(&default_lock);
	if (default_client &&
	    (ask_socket ? client_gone(default_client, NULL, 0) : client_lost(default_client))) {
		client_unref(default_client);
		default_client = NULL;
	}
	if (!default_client) {
		pthread_once(&default_once, client_default_once);
		r = client_open(client_socket_path(), program_invocation_short_name, &default_client);
	}
	if (r == dfcclSuccess)
		*out = client_ref(default_client);
	pthread_mutex_unlock(&default_lock);
	return r;
}

dfcclResult_t client_default(struct client **out)
{
	return client_default_asking(out, true);
}

dfcclResult_t client_default_quick(struct client **out)
{
	return client_default_asking(out, false);
}

/* ---------------------------------------------------------------- devices */

/* Lists the daemon's devices with their bus ids into m->served and tells
 * whether any has one (the daemon serves GPUs, or emulates devices that
 * say which GPU they stand for). */
static bool devmap_served(struct devmap *m, const Dfccl__V1__StatusInfo *st)
{
	bool any = false;
	size_t at = 0;
	m->served[0] = '\0';
	for (size_t i = 0; i < st->n_devices; i++) {
		const char *bus = st->devices[i]->pci_bus_id;
		any = any || bus[0];
		if (at < sizeof(m->served))
			at += (size_t)snprintf(m->served + at, sizeof(m->served) - at, "%s%u (%s)", i ? ", " : "",
			                       st->devices[i]->index, bus[0] ? bus : "no PCI bus id");
	}
	return any;
}

/*
 * Whether this process may initialise CUDA now. Under MPS a process whose
 * user differs from the running MPS server's waits in CUDA initialisation
 * until that server's clients have all gone, and the workers are MPS
 * clients: where one of another user is up, the map is not built from the
 * driver, and the numbers stay the daemon's indices, which the attach
 * checks (a device another user's job holds is refused at once, naming the
 * holder; a free one is handed to this user's worker).
 */
static bool devmap_driver_safe(const Dfccl__V1__StatusInfo *st)
{
	if (!st->mps_active)
		return true;
	uid_t me = geteuid();
	for (size_t i = 0; i < st->n_devices; i++)
		if (st->devices[i]->worker_up && st->devices[i]->worker_uid != (uint32_t)me)
			return false;
	return true;
}

/* The daemon's device with bus id `bus`, or -1. */
static int devmap_find(const struct client *c, const Dfccl__V1__StatusInfo *st, const char *bus)
{
	for (size_t i = 0; i < st->n_devices; i++)
		if (st->devices[i]->index < c->info.ndevices && pci_id_equal(bus, st->devices[i]->pci_bus_id))
			return (int)st->devices[i]->index;
	return -1;
}

/* Fills c->map from the daemon's device list (a status query) and, where
 * the daemon's devices have bus ids, the bus ids of this process's GPUs. */
static dfcclResult_t devmap_build(struct client *c)
{
	struct devmap *m = &c->map;
	struct client_reply rep;
	dfcclResult_t r = client_query(c, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &rep);
	if (r != dfcclSuccess)
		return r;
	const Dfccl__V1__StatusInfo *st = rep.env->query_reply->status;
	if (!st) {
		client_reply_release(&rep);
		return errors_set(dfcclInternalError, "dfccld answered a status query without its status");
	}
	int n = devmap_served(m, st) && devmap_driver_safe(st) ? cudrv_device_count() : 0;
	m->ordinal_of = malloc((c->info.ndevices ? c->info.ndevices : 1) * sizeof(*m->ordinal_of));
	m->index_of = malloc((n ? (size_t)n : 1) * sizeof(*m->index_of));
	m->bus_id = calloc(n ? (size_t)n : 1, sizeof(*m->bus_id));
	if (!m->ordinal_of || !m->index_of || !m->bus_id) {
		client_reply_release(&rep);
		return errors_set(dfcclSystemError, "out of memory");
	}
	for (uint32_t d = 0; d < c->info.ndevices; d++)
		m->ordinal_of[d] = -1;
	for (int o = 0; o < n; o++) {
		m->index_of[o] = -1;
		if (cudrv_device_pci_bus_id(o, m->bus_id[o], sizeof(m->bus_id[o])) < 0) {
			m->bus_id[o][0] = '\0';
			if (!m->why[0])
				snprintf(m->why, sizeof(m->why), "%s", cudrv_last_error());
			continue;
		}
		int d = devmap_find(c, st, m->bus_id[o]);
		m->index_of[o] = d;
		if (d >= 0 && m->ordinal_of[d] < 0)
			m->ordinal_of[d] = o;
	}
	m->nordinals = n;
	m->by_bus_id = n > 0;
	client_reply_release(&rep);
	return dfcclSuccess;
}

/* c->map, built on first use. */
static dfcclResult_t devmap_get(struct client *c)
{
	if (__atomic_load_n(&c->map.built, __ATOMIC_ACQUIRE))
		return dfcclSuccess;
	dfcclResult_t r = dfcclSuccess;
	pthread_mutex_lock(&c->map_lock);
	if (!c->map.built) {
		r = devmap_build(c);
		if (r == dfcclSuccess) {
			__atomic_store_n(&c->map.built, true, __ATOMIC_RELEASE);
		} else {
			/* Nothing half-built is kept: the next call tries again. */
			free(c->map.index_of);
			free(c->map.ordinal_of);
			free(c->map.bus_id);
			memset(&c->map, 0, sizeof(c->map));
		}
	}
	pthread_mutex_unlock(&c->map_lock);
	return r;
}

dfcclResult_t client_device_map(struct client *c, int device, struct client_device *out)
{
	dfcclResult_t r = devmap_get(c);
	if (r != dfcclSuccess)
		return r;
	const struct devmap *m = &c->map;
	if (!m->by_bus_id) {
		r = client_check_device(c, device);
		if (r == dfcclSuccess)
			*out = (struct client_device){(uint32_t)device, device};
		return r;
	}
	if (device < 0 || device >= m->nordinals) {
		const char *visible = getenv("CUDA_VISIBLE_DEVICES");
		return errors_set(dfcclInvalidArgument, "device %d is no GPU of this process, which sees %d "
		                  "(CUDA_VISIBLE_DEVICES=%s): dfcclSetDevice and config.device take CUDA ordinals, as "
		                  "cudaSetDevice does", device, m->nordinals, visible ? visible : "unset");
	}
	if (!m->bus_id[device][0])
		return errors_set(dfcclUnhandledCudaError, "cannot tell which GPU CUDA device %d is: %s", device, m->why);
	if (m->index_of[device] < 0)
		return errors_set(dfcclInvalidArgument, "CUDA device %d of this process is the GPU at PCI bus id %s, which "
		                  "dfccld does not serve; it serves %s", device, m->bus_id[device], m->served);
	*out = (struct client_device){(uint32_t)m->index_of[device], device};
	return dfcclSuccess;
}

dfcclResult_t client_attach(struct client *c, uint32_t device, struct qp **out)
{
	dfcclResult_t r = client_check_device(c, (int)device);
	if (r == dfcclSuccess)
		r = devmap_get(c);
	if (r != dfcclSuccess)
		return r;

	pthread_mutex_lock(&c->attach_lock);
	if (c->qps[device]) {
		*out = c->qps[device];
		goto out;
	}
	Dfccl__V1__AttachDevice attach = DFCCL__V1__ATTACH_DEVICE__INIT;
	attach.device = device;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_ATTACH;
	req.attach = &attach;
	struct client_reply rep;
	r = client_request(c, &req, NULL, 0, DFCCL__V1__ENVELOPE__BODY_ATTACH_REPLY, &rep);
	if (r != dfcclSuccess)
		goto out;
	const Dfccl__V1__AttachReply *a = rep.env->attach_reply;
	if (a->device != device || a->nfds != 2 || rep.nfds != 2) {
		r = errors_set(dfcclInternalError, "dfccld attached device %u with %u descriptor(s) when device %u with 2 "
		               "was asked for", a->device, rep.nfds, device);
	} else {
		struct qp *q = NULL;
		r = qp_map(rep.fds[0], rep.fds[1], a->region_size, device, &c->lost, &q);
		rep.nfds = 0; /* qp_map took both descriptors */
		if (r == dfcclSuccess) {
			q->ordinal = c->map.by_bus_id ? c->map.ordinal_of[device] : (int)device;
			if (c->info.engine == DFCCL__V1__ENGINE_KIND__ENGINE_CUDA)
				q->spin_ns = QP_SPIN_GPU_NS;
			/* Published whole: the reader thread heartbeats through it. */
			__atomic_store_n(&c->qps[device], q, __ATOMIC_RELEASE);
			*out = q;
		}
	}
	client_reply_release(&rep);
out:
	pthread_mutex_unlock(&c->attach_lock);
	return r;
}

void client_stream_words(struct client *c, struct qp *q)
{
	if (!stream_waits_on_device() || __atomic_load_n(&q->words_tried, __ATOMIC_ACQUIRE) ||
	    c->info.engine != DFCCL__V1__ENGINE_KIND__ENGINE_CUDA || q->ordinal < 0)
		return;
	pthread_mutex_lock(&c->attach_lock);
	if (!q->words_tried) {
		__atomic_store_n(&q->words_tried, true, __ATOMIC_RELEASE);
		struct client_device dev = {q->device, q->ordinal};
		void *words;
		uint32_t reg_id;
		dfcclResult_t r = mem_device_words(c, &dev, (size_t)q->entries * sizeof(uint64_t), &words, &reg_id);
		if (r == dfcclSuccess)
			r = qp_stream_words(q, words, reg_id);
		/* Without them streams wait on the region's words, as before:
		 * slower, not wrong. */
		if (r != dfcclSuccess)
			fprintf(stderr, "libdfccl: device %u: stream-ordered calls wait on host memory: %s\n", q->device,
			        errors_last());
	}
	pthread_mutex_unlock(&c->attach_lock);
}

dfcclResult_t client_nop(struct client *c, uint32_t device)
{
	struct qp *q;
	dfcclResult_t r = client_attach(c, device, &q);
	if (r != dfcclSuccess)
		return r;
	struct dfccl_sqe e;
	memset(&e, 0, sizeof(e));
	e.opcode = DFCCL_OP_NOP;
	return qp_run(q, &e);
}

/*
 * Stream-ordered NOPs: each posted unarmed, then its arm and its wait
 * queued on the stream (stream.h), so that the stream arms entry i once
 * entry i - 1 completed. At most half a queue is in flight: the entry half
 * a queue back is waited for before the next is posted, while the stream
 * still has the half queued ahead of it.
 */
dfcclResult_t client_nop_stream(struct client *c, uint32_t device, dfcclStream_t stream, long count,
                                double *issue_us)
{
	if (count < 1)
		return errors_set(dfcclInvalidArgument, "stream-ordered NOPs: count %ld is not positive", count);
	if (!cudrv_streams_usable())
		return errors_set(dfcclNotSupported, "stream-ordered NOPs need the CUDA driver: %s", cudrv_last_error());
	struct qp *q;
	dfcclResult_t r = client_attach(c, device, &q);
	if (r != dfcclSuccess)
		return r;
	/* As coll_check refuses a collective: a replay of the capture would arm
	 * entries taken long ago. */
	if (cudrv_stream_capturing(stream, q->ordinal) > 0)
		return errors_set(dfcclNotSupported, "stream-ordered NOPs: the stream is being captured into a CUDA graph");
	client_stream_words(c, q);
	/* Every wait is bounded: a stream that never arms (blocked behind other
	 * work, or with an error) ends it in dfcclTimeout. */
	uint64_t wait_ms = qp_queue_wait_ms();
	long window = q->entries / 2, posted = 0, waited = 0;
	struct qp_ticket *t = calloc((size_t)window, sizeof(*t));
	if (!t)
		return errors_set(dfcclSystemError, "out of memory");
	uint64_t start = qp_now_ns(), waiting = 0;
	for (long i = 0; i < count && r == dfcclSuccess; i++) {
		if (i >= window) {
			uint64_t w0 = qp_now_ns();
			r = qp_wait_for(q, &t[waited % window], wait_ms);
			waiting += qp_now_ns() - w0;
			if (r == dfcclSuccess)
				r = qp_status_result(t[waited % window].status, DFCCL_OP_NOP);
			waited++;
			if (r != dfcclSuccess)
				break;
		}
		struct dfccl_sqe e;
		memset(&e, 0, sizeof(e));
		e.opcode = DFCCL_OP_NOP;
		struct stream_item it = {.stream = stream, .qp = q};
		if ((r = qp_wait_free(q, wait_ms)) != dfcclSuccess ||
		    (r = qp_submit_unarmed(q, &e, &t[i % window], &it.arm)) != dfcclSuccess)
			break;
		posted++;
		struct stream_batch b = {.items = &it, .n = 1};
		r = stream_batch_finish(&b);
	}
	if (issue_us)
		*issue_us = posted ? (double)(qp_now_ns() - start - waiting) / 1e3 / (double)posted : 0;
	/* Every posted entry is waited for, whatever failed: its ticket is
	 * freed below. */
	for (; waited < posted; waited++) {
		dfcclResult_t w = qp_wait_for(q, &t[waited % window], wait_ms);
		if (w == dfcclSuccess)
			w = qp_status_result(t[waited % window].status, DFCCL_OP_NOP);
		if (r == dfcclSuccess)
			r = w;
	}
	free(t);
	return r;
}

/* ---------------------------------------------------------------- public */

dfcclResult_t dfcclSetDevice(int device)
{
	if (device < 0)
		return errors_set(dfcclInvalidArgument, "dfcclSetDevice: device %d is negative", device);
	current_device = device;
	return dfcclSuccess;
}

dfcclResult_t dfcclGetDevice(int *device)
{
	if (!device)
		return errors_set(dfcclInvalidArgument, "dfcclGetDevice: device is NULL");
	*device = current_device;
	return dfcclSuccess;
}

dfcclResult_t dfcclGetDeviceCount(int *count)
{
	if (!count)
		return errors_set(dfcclInvalidArgument, "dfcclGetDeviceCount: count is NULL");
	struct client *c = NULL;
	dfcclResult_t r = client_default(&c);
	if (r == dfcclSuccess)
		r = devmap_get(c);
	if (r == dfcclSuccess)
		*count = c->map.by_bus_id ? c->map.nordinals : (int)client_info(c)->ndevices;
	client_unref(c);
	return r;
}

dfcclResult_t dfcclInternalNopStream(int device, void *stream, long count, double *issue_us)
{
	if (!stream)
		return errors_set(dfcclInvalidArgument, "dfcclInternalNopStream: stream is NULL");
	struct client *c;
	dfcclResult_t r = client_default_quick(&c);
	if (r != dfcclSuccess)
		return r;
	r = client_nop_stream(c, (uint32_t)device, (dfcclStream_t)stream, count, issue_us);
	client_unref(c);
	return r;
}

dfcclResult_t dfcclInternalNop(int device)
{
	struct client *c;
	dfcclResult_t r = client_default_quick(&c);
	if (r != dfcclSuccess)
		return r;
	r = client_nop(c, (uint32_t)device);
	client_unref(c);
	return r;
}
