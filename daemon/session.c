/*
 * See session.h. Every request gets exactly one reply carrying its
 * request_id: the specific reply, Ok, or an ErrorReply with a code and a
 * sentence (what is wrong and what to do). CommInit is the one request whose
 * reply comes later, when the communicator completes or times out.
 *
 * Bad input never takes the daemon down: a frame that does not decode gets
 * an ErrorReply with request_id 0 (after SESSION_MAX_BAD_FRAMES of them the
 * session is closed), an oversized length prefix closes the session, and
 * descriptors that a message did not ask for are closed and refused.
 */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "dfccl_queue.h"
#include "log.h"
#include "recorder.h"
#include "server.h"
#include "user.h"
#include "watch.h"
#include "workers.h"

#ifndef DFCCL_VERSION_STRING
#define DFCCL_VERSION_STRING "0.1.0"
#endif

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x
#define SESSION_MAX_BAD_FRAMES 16u
#define IPC_HANDLE_BYTES 64u

static void session_free_cb(struct conn *c)
{
	struct session *s = c->owner;
	free(s);
}

/* ------------------------------------------------------------ replies */

int session_reply(struct session *s, uint64_t request_id, Dfccl__V1__Envelope *env, const int *fds, unsigned nfds)
{
	if (s->state == SESSION_CLOSING)
		return -EPIPE;
	env->request_id = request_id;
	int rc = conn_send(&s->conn, env, fds, nfds);
	if (rc < 0)
		log_warn("session", "session %llu (pid %d): cannot send a reply: %s", (unsigned long long)s->id,
		         (int)s->pid, strerror(-rc));
	return rc;
}

static int reply_error_msg(struct session *s, uint64_t request_id, int code, const char *msg)
{
	Dfccl__V1__ErrorReply er = DFCCL__V1__ERROR_REPLY__INIT;
	er.code = code;
	er.message = (char *)msg;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ERROR;
	env.error = &er;
	log_debug("session", "session %llu: request %llu failed: %s", (unsigned long long)s->id,
	          (unsigned long long)request_id, msg);
	return session_reply(s, request_id, &env, NULL, 0);
}

int session_reply_error(struct session *s, uint64_t request_id, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return reply_error_msg(s, request_id, code, msg);
}

static int reply_ok(struct session *s, uint64_t request_id)
{
	Dfccl__V1__Ok ok = DFCCL__V1__OK__INIT;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_OK;
	env.ok = &ok;
	return session_reply(s, request_id, &env, NULL, 0);
}

int session_send_shrink_notice(struct session *s, int code, uint64_t comm_id, uint32_t device, const char *message,
                               const uint32_t *exclude, size_t n)
{
	Dfccl__V1__Notice no = DFCCL__V1__NOTICE__INIT;
	no.code = code;
	no.comm_id = comm_id;
	no.device = device;
	no.message = (char *)message;
	no.shrink_exclude = (uint32_t *)exclude;
	no.n_shrink_exclude = n;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_NOTICE;
	env.notice = &no;
	return session_reply(s, 0, &env, NULL, 0);
}

int session_send_notice(struct session *s, int code, uint64_t comm_id, uint32_t device, const char *message)
{
	return session_send_shrink_notice(s, code, comm_id, device, message, NULL, 0);
}

/* ------------------------------------------------------------ handlers */

static void handle_hello(struct session *s, uint64_t req, const Dfccl__V1__Hello *h)
{
	uint32_t lo = h->min_version > DFCCL_PROTO_MIN_VERSION ? h->min_version : DFCCL_PROTO_MIN_VERSION;
	uint32_t hi = h->max_version < DFCCL_PROTO_VERSION ? h->max_version : DFCCL_PROTO_VERSION;
	if (h->min_version > h->max_version || lo > hi) {
		log_notice("session", "session %llu (pid %d): no common protocol version (client %u..%u, daemon %u..%u)",
		           (unsigned long long)s->id, (int)s->pid, h->min_version, h->max_version,
		           DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION);
		session_reply_error(s, req, EC(VERSION_MISMATCH),
		                    "protocol version mismatch: the client speaks versions %u..%u, dfccld %s speaks "
		                    "%u..%u; install a libdfccl that matches the daemon",
		                    h->min_version, h->max_version, DFCCL_VERSION_STRING, DFCCL_PROTO_MIN_VERSION,
		                    DFCCL_PROTO_VERSION);
		s->state = SESSION_CLOSING;
		conn_end_after_flush(&s->conn);
		return;
	}
	conn_clear_deadline(&s->conn);
	s->version = hi;
	snprintf(s->client_name, sizeof(s->client_name), "%s", h->client_name ? h->client_name : "");
	s->state = SESSION_READY;
	Dfccl__V1__HelloReply r = DFCCL__V1__HELLO_REPLY__INIT;
	r.version = hi;
	r.daemon_version = DFCCL_VERSION_STRING;
	r.session_id = s->id;
	r.engine = s->srv->engine == DFCCLD_ENGINE_CUDA ? DFCCL__V1__ENGINE_KIND__ENGINE_CUDA
	                                                  : DFCCL__V1__ENGINE_KIND__ENGINE_HOST;
	r.ndevices = workers_ndevices(s->srv->workers);
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY;
	env.hello_reply = &r;
	session_reply(s, req, &env, NULL, 0);
	log_info("session", "session %llu: %s (pid %d, uid %u) connected, protocol %u", (unsigned long long)s->id,
	         s->client_name[0] ? s->client_name : "client", (int)s->pid, (unsigned)s->uid, hi);
}

static int check_device(struct session *s, uint64_t req, uint32_t device)
{
	unsigned n = workers_ndevices(s->srv->workers);
	if (device >= n || device >= SESSION_MAX_DEVICES) {
		session_reply_error(s, req, EC(NOT_FOUND), "device %u does not exist: dfccld serves %u device%s (0..%u)",
		                    device, n, n == 1 ? "" : "s", n ? n - 1 : 0);
		return -1;
	}
	return 0;
}

/* A queue pair keeps a memfd and an eventfd in the supervisor. */
#define QP_FDS 2

/* Charges a new queue pair to the uid and the descriptor budget; replies
 * with the limit reached and returns -1 when one is. */
static int qp_charge(struct session *s, uint64_t req)
{
	struct server *srv = s->srv;
	if (user_charge_qp(&srv->users, s->user) < 0) {
		session_reply_error(s, req, EC(RESOURCE),
		                    "uid %u already holds %lld queue pairs, its limit (setting max-qps-per-uid)",
		                    (unsigned)s->uid, (long long)srv->users.limits.max_qps);
		return -1;
	}
	if (fd_budget_charge(&srv->fds, QP_FDS, FD_FOR_CONNECTION) < 0) {
		user_uncharge_qp(s->user);
		session_reply_error(s, req, EC(RESOURCE),
		                    "dfccld is out of descriptors for queue pairs (%lld in use, limit %lld): raise the "
		                    "daemon's LimitNOFILE",
		                    (long long)srv->fds.used, (long long)srv->fds.limit);
		return -1;
	}
	return 0;
}

static void qp_uncharge(struct session *s)
{
	user_uncharge_qp(s->user);
	fd_budget_uncharge(&s->srv->fds, QP_FDS);
}

/*
 * The session's queue pair on `device` (n entries), created when it has
 * none: its descriptors into memfd, efd, size (borrowed). Whose uid the
 * device's worker runs as decides who may attach (worker_user.h): a refusal
 * names the holder and what to do. Returns 0, or -1 with the client
 * answered.
 */
static int session_take_device(struct session *s, uint64_t req, uint32_t device, uint32_t n, int *memfd, int *efd,
                               size_t *size)
{
	int rc;
	uint32_t qp_id = s->qp_ids[device];
	if (qp_id) {
		rc = workers_qp_fds(s->srv->workers, device, qp_id, memfd, efd, size);
	} else {
		char err[512];
		if (workers_admit(s->srv->workers, s->uid, device, err, sizeof(err)) < 0) {
			log_notice("session", "session %llu (pid %d, uid %u): %s", (unsigned long long)s->id, (int)s->pid,
			           (unsigned)s->uid, err);
			reply_error_msg(s, req, EC(PERMISSION), err);
			return -1;
		}
		if (qp_charge(s, req) < 0)
			return -1;
		rc = workers_attach_qp(s->srv->workers, device, s->id, s->uid, s->gid, n, &qp_id, memfd, efd, size);
		if (rc < 0)
			qp_uncharge(s);
	}
	if (rc < 0) {
		log_err("session", "session %llu: cannot create a queue pair on device %u: %s",
		        (unsigned long long)s->id, device, strerror(-rc));
		session_reply_error(s, req, EC(RESOURCE), "cannot create a queue pair on device %u: %s", device,
		                    strerror(-rc));
		return -1;
	}
	s->qp_ids[device] = qp_id;
	return 0;
}

static void handle_attach(struct session *s, uint64_t req, const Dfccl__V1__AttachDevice *a)
{
	if (check_device(s, req, a->device) < 0)
		return;
	uint32_t n = a->sq_entries ? a->sq_entries : (uint32_t)s->srv->cfg.sq_entries;
	if (n < DFCCL_SQ_MIN_ENTRIES || n > DFCCL_SQ_MAX_ENTRIES || (n & (n - 1))) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT),
		                    "sq_entries %u must be a power of two between %u and %u", n, DFCCL_SQ_MIN_ENTRIES,
		                    DFCCL_SQ_MAX_ENTRIES);
		return;
	}
	int memfd, efd;
	size_t size;
	if (session_take_device(s, req, a->device, n, &memfd, &efd, &size) < 0)
		return;
	uint32_t qp_id = s->qp_ids[a->device];
	Dfccl__V1__AttachReply r = DFCCL__V1__ATTACH_REPLY__INIT;
	r.device = a->device;
	r.qp_id = qp_id;
	r.region_size = size;
	r.nfds = 2;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ATTACH_REPLY;
	env.attach_reply = &r;
	int fds[2] = {memfd, efd};
	session_reply(s, req, &env, fds, 2);
}

static void handle_comm_init(struct session *s, uint64_t req, const Dfccl__V1__CommInit *ci)
{
	if (check_device(s, req, ci->device) < 0)
		return;
	if (!s->qp_ids[ci->device]) {
		session_reply_error(s, req, EC(INVALID_USAGE),
		                    "attach to device %u before joining a communicator on it", ci->device);
		return;
	}
	unsigned held = comm_session_count(s->srv, s);
	if (held >= (uint64_t)s->srv->cfg.max_comms_per_session) {
		session_reply_error(s, req, EC(RESOURCE),
		                    "this connection already holds %u communicator memberships, its limit (setting "
		                    "max-comms-per-session): destroy communicators it no longer uses",
		                    held);
		return;
	}
	char err[512];
	int code = comm_join(s->srv, s, req, ci->unique_id.data, ci->unique_id.len, ci->nranks, ci->rank, ci->device,
	                     ci->timeout_ms, ci->coll_timeout_ms, err, sizeof(err));
	if (code)
		reply_error_msg(s, req, code, err);
}

/* Destroy (0), abort (1) or revoke (2) of comm_id. */
static void handle_comm_leave(struct session *s, uint64_t req, uint64_t comm_id, int how)
{
	char err[512];
	int code = how == 2 ? comm_revoke(s->srv, s, comm_id, err, sizeof(err))
	                    : comm_leave(s->srv, s, comm_id, how, err, sizeof(err));
	if (code)
		reply_error_msg(s, req, code, err);
	else
		reply_ok(s, req);
}

static void handle_shrink_advice(struct session *s, uint64_t req, const Dfccl__V1__CommShrinkAdvice *a)
{
	char err[512];
	int code = comm_shrink_advice(s->srv, s, a->comm_id, a->exclude, a->n_exclude, err, sizeof(err));
	if (code)
		reply_error_msg(s, req, code, err);
	else
		reply_ok(s, req);
}

static struct session_reg *reg_find(struct session *s, uint32_t reg_id)
{
	struct session_reg *r = s->regs;
	while (r && r->reg_id != reg_id)
		r = r->next;
	return r;
}

/*
 * Records a new registration of the session on `device`, of `size` bytes,
 * for which the supervisor keeps `nfds` descriptors, and charges it: the
 * session's and the uid's counts, the uid's bytes and the descriptor
 * budget. Returns the record, or NULL after replying with the limit that
 * was reached and the setting that sets it.
 */
static struct session_reg *reg_new(struct session *s, uint64_t req, uint32_t device, uint64_t size, unsigned nfds)
{
	struct server *srv = s->srv;
	const struct dfccld_config *cfg = &srv->cfg;
	if (s->nregs >= (uint64_t)cfg->max_regs_per_session) {
		session_reply_error(s, req, EC(RESOURCE),
		                    "this connection already holds %u registrations, its limit (setting "
		                    "max-regs-per-session): deregister buffers it no longer uses",
		                    s->nregs);
		return NULL;
	}
	if (user_charge_reg(&srv->users, s->user) < 0) {
		session_reply_error(s, req, EC(RESOURCE),
		                    "uid %u already holds %lld registrations, its limit (setting max-regs-per-uid)",
		                    (unsigned)s->uid, (long long)srv->users.limits.max_regs);
		return NULL;
	}
	if (user_charge_bytes(&srv->users, s->user, (int64_t)size) < 0) {
		session_reply_error(s, req, EC(RESOURCE),
		                    "uid %u would exceed its registered-memory quota of %lld bytes (holds %lld; setting "
		                    "max-registered-bytes-per-uid)",
		                    (unsigned)s->uid, (long long)srv->users.limits.max_registered_bytes,
		                    (long long)s->user->registered_bytes);
		goto no_bytes;
	}
	if (fd_budget_charge(&srv->fds, nfds, FD_FOR_REGISTRATION) < 0) {
		session_reply_error(s, req, EC(RESOURCE),
		                    "dfccld is out of descriptors for registrations (%lld in use of the %lld its "
		                    "descriptor limit leaves after setting fd-reserve): deregister buffers, or raise "
		                    "the daemon's LimitNOFILE",
		                    (long long)srv->fds.used, (long long)fd_budget_registration_cap(&srv->fds));
		goto no_fds;
	}
	struct session_reg *r = calloc(1, sizeof(*r));
	if (!r) {
		session_reply_error(s, req, EC(RESOURCE), "out of memory");
		fd_budget_uncharge(&srv->fds, nfds);
		goto no_fds;
	}
	r->reg_id = ++srv->next_reg_id;
	r->device = device;
	r->size = size;
	r->nfds = nfds;
	r->alloc_fd = -1;
	r->next = s->regs;
	s->regs = r;
	s->nregs++;
	s->registered_bytes += size;
	return r;
no_fds:
	user_uncharge_bytes(s->user, (int64_t)size);
no_bytes:
	user_uncharge_reg(s->user);
	return NULL;
}

/* Drops the session's record of r and its charge (the workers hold
 * nothing of it, or are told by the caller). */
static void reg_forget(struct session *s, struct session_reg *r)
{
	for (struct session_reg **pp = &s->regs; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	user_uncharge_bytes(s->user, (int64_t)r->size);
	user_uncharge_reg(s->user);
	fd_budget_uncharge(&s->srv->fds, r->nfds);
	s->nregs--;
	s->registered_bytes -= r->size;
	if (r->alloc_fd >= 0)
		close(r->alloc_fd);
	free(r);
}

static void reg_release(struct session *s, struct session_reg *r)
{
	workers_del_reg_all(s->srv->workers, r->reg_id);
	reg_forget(s, r);
}

/* Answers the RegisterMem, or the AllocMem with the allocation's
 * descriptor, that made r. */
static void reply_registered(struct session *s, uint64_t req, struct session_reg *r)
{
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	if (r->alloc_fd < 0) {
		Dfccl__V1__RegisterReply rep = DFCCL__V1__REGISTER_REPLY__INIT;
		rep.reg_id = r->reg_id;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY;
		env.register_reply = &rep;
		session_reply(s, req, &env, NULL, 0);
		return;
	}
	Dfccl__V1__AllocMemReply rep = DFCCL__V1__ALLOC_MEM_REPLY__INIT;
	rep.reg_id = r->reg_id;
	rep.size = r->size;
	rep.map_size = r->map_size;
	rep.device = r->device;
	rep.nfds = 1;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM_REPLY;
	env.alloc_mem_reply = &rep;
	session_reply(s, req, &env, &r->alloc_fd, 1);
	/* The workers' records keep the memory alive from here on. */
	close(r->alloc_fd);
	r->alloc_fd = -1;
}

/* Hands registration r (fd: its descriptor, borrowed; -1 for none) to
 * every worker; the client is answered now when no worker is up to
 * acknowledge it, else by session_reg_done. Returns 0, or -1 with r
 * forgotten and the client answered. */
static int reg_to_workers(struct session *s, uint64_t req, struct session_reg *r, int kind, uint64_t offset,
                          const uint8_t *ipc, size_t ipc_len, int fd)
{
	int rc = workers_add_reg(s->srv->workers, r->reg_id, s->id, s->uid, kind, r->size, offset, ipc, ipc_len, fd, req);
	if (rc < 0) {
		reg_forget(s, r);
		session_reply_error(s, req, EC(RESOURCE), "cannot record the registration: %s", strerror(-rc));
		return -1;
	}
	if (rc == 1)
		reply_registered(s, req, r);
	return 0;
}

/* GPU memory needs the CUDA engine: 0, or -1 with the client answered. */
static int require_cuda_engine(struct session *s, uint64_t req, const char *what)
{
	if (s->srv->engine == DFCCLD_ENGINE_CUDA)
		return 0;
	session_reply_error(s, req, EC(NOT_SUPPORTED),
	                    "this dfccld runs the %s engine, which cannot reach GPU memory: %s needs dfccld started with "
	                    "--engine cuda on a GPU node; with the host engine, use buffers from dfcclMemAlloc (host "
	                    "shared memory)",
	                    config_engine_name(s->srv->engine), what);
	return -1;
}

/* A range inside an allocation whose size the supervisor cannot learn
 * (only a worker that maps it can): it must at least not wrap around. */
static int check_wrap(struct session *s, uint64_t req, uint64_t offset, uint64_t size)
{
	if (offset <= UINT64_MAX - size)
		return 0;
	session_reply_error(s, req, EC(INVALID_ARGUMENT), "range [%llu, +%llu) wraps around", (unsigned long long)offset,
	                    (unsigned long long)size);
	return -1;
}

/* The checks of a host-memory registration's memfd: 0, or -1 answered. */
static int check_memfd(struct session *s, uint64_t req, const Dfccl__V1__RegisterMem *m, int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "the descriptor for host memory registration is not a memfd");
		return -1;
	}
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT),
		                    "host memory must be a memfd sealed against shrinking (F_SEAL_SHRINK), so the daemon "
		                    "never maps memory that can vanish");
		return -1;
	}
	if (m->offset > (uint64_t)st.st_size || m->size > (uint64_t)st.st_size - m->offset) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "range [%llu, +%llu) lies outside the %lld-byte memfd",
		                    (unsigned long long)m->offset, (unsigned long long)m->size, (long long)st.st_size);
		return -1;
	}
	return 0;
}

/* The checks of a GPU registration by kind: 0, or -1 answered. */
static int check_gpu_reg(struct session *s, uint64_t req, const Dfccl__V1__RegisterMem *m)
{
	if (m->kind == DFCCL__V1__MEM_KIND__MEM_CUDA_IPC && m->ipc_handle.len != IPC_HANDLE_BYTES) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "a CUDA IPC handle has %u bytes, got %zu", IPC_HANDLE_BYTES,
		                    m->ipc_handle.len);
		return -1;
	}
	if (m->kind == DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD && m->ipc_handle.len) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT),
		                    "a VMM registration names its allocation by the descriptor it carries, not by an IPC "
		                    "handle (got %zu bytes of one)",
		                    m->ipc_handle.len);
		return -1;
	}
	if (check_wrap(s, req, m->offset, m->size) < 0)
		return -1;
	return require_cuda_engine(s, req,
	                           m->kind == DFCCL__V1__MEM_KIND__MEM_CUDA_IPC
	                               ? "GPU memory shared through CUDA IPC (cudaMalloc)"
	                               : "GPU memory exported as a file descriptor (cuMemCreate)");
}

static void handle_register(struct session *s, uint64_t req, const Dfccl__V1__RegisterMem *m, const int *fds)
{
	int fd = -1;
	if (check_device(s, req, m->device) < 0)
		return;
	if (m->size == 0) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "cannot register an empty buffer (size 0)");
		return;
	}
	switch (m->kind) {
	case DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD:
	case DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD:
		fd = fds[0]; /* session_on_frame checked that exactly one came */
		if (m->kind == DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD ? check_memfd(s, req, m, fd) < 0
		                                                   : check_gpu_reg(s, req, m) < 0)
			return;
		break;
	case DFCCL__V1__MEM_KIND__MEM_CUDA_IPC:
		if (check_gpu_reg(s, req, m) < 0)
			return;
		break;
	default:
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "unknown memory kind %d", (int)m->kind);
		return;
	}
	/* A descriptor is kept per worker (each gets its own duplicate). */
	struct session_reg *r = reg_new(s, req, m->device, m->size, fd >= 0 ? workers_ndevices(s->srv->workers) : 0);
	if (r)
		reg_to_workers(s, req, r, m->kind, m->offset, m->ipc_handle.data, m->ipc_handle.len, fd);
	/* answered now, or by session_reg_done once the workers mapped it */
}

static void handle_alloc(struct session *s, uint64_t req, const Dfccl__V1__AllocMem *m)
{
	if (check_device(s, req, m->device) < 0 || require_cuda_engine(s, req, "device memory from dfcclMemAlloc") < 0)
		return;
	if (m->size == 0) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "cannot allocate an empty buffer (size 0)");
		return;
	}
	/* The memory belongs to the device's worker, which must run as this
	 * session's uid when workers follow the jobs' uids: the session takes
	 * the device as an attach does (and holds it until it ends), and the
	 * allocation waits for a worker of its uid. */
	int memfd, efd;
	size_t size;
	if (s->srv->worker_users.job &&
	    session_take_device(s, req, m->device, (uint32_t)s->srv->cfg.sq_entries, &memfd, &efd, &size) < 0)
		return;
	/* The allocation's descriptor is kept per worker, as a memfd's. */
	struct session_reg *r = reg_new(s, req, m->device, m->size, workers_ndevices(s->srv->workers));
	if (!r)
		return;
	r->allocating = 1;
	int rc = workers_alloc_mem(s->srv->workers, m->device, s->uid, r->reg_id, s->id, req, m->size);
	if (rc < 0) {
		reg_forget(s, r);
		if (rc == -ENODEV)
			session_reply_error(s, req, EC(DEVICE_LOST),
			                    "the worker of device %u is not running (restarting after a failure); try again in "
			                    "a moment",
			                    m->device);
		else
			session_reply_error(s, req, EC(RESOURCE), "cannot ask for the allocation: %s", strerror(-rc));
	}
	/* else answered by session_alloc_done */
}

static struct session *session_find(struct server *srv, uint64_t session_id)
{
	struct session *s = srv->sessions;
	while (s && s->id != session_id)
		s = s->next;
	return s;
}

void session_alloc_done(struct server *srv, uint64_t session_id, uint64_t request_id, uint32_t reg_id,
                        uint32_t device, int code, const char *message, int fd, uint64_t map_size)
{
	struct session *s = session_find(srv, session_id);
	struct session_reg *r = s ? reg_find(s, reg_id) : NULL;
	if (!r || !r->allocating || code || map_size < r->size) {
		/* Whatever the worker made goes again. */
		if (fd >= 0) {
			close(fd);
			workers_del_reg(srv->workers, device, reg_id);
		}
		if (!s)
			return;
		if (!r || !r->allocating)
			session_reply_error(s, request_id, EC(NOT_FOUND),
			                    "registration %u was dropped before its allocation completed", reg_id);
		else if (code)
			reply_error_msg(s, request_id, code, message);
		else
			session_reply_error(s, request_id, EC(INTERNAL),
			                    "the worker of device %u allocated %llu bytes where %llu were asked for", device,
			                    (unsigned long long)map_size, (unsigned long long)r->size);
		if (r && r->allocating)
			reg_forget(s, r);
		return;
	}
	r->allocating = 0;
	r->alloc_fd = fd;
	r->map_size = map_size;
	if (reg_to_workers(s, request_id, r, DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD, 0, NULL, 0, fd) < 0)
		workers_del_reg(srv->workers, device, reg_id); /* the allocating worker still holds it */
}

void session_reg_done(struct server *srv, uint64_t session_id, uint64_t request_id, uint32_t reg_id, int code,
                      const char *message)
{
	struct session *s = session_find(srv, session_id);
	if (!s)
		return;
	struct session_reg *r = reg_find(s, reg_id);
	if (!r) {
		/* Deregistered by an id the client was not told yet: the
		 * workers were told to let go already. */
		session_reply_error(s, request_id, EC(NOT_FOUND), "registration %u was dropped before it was mapped",
		                    reg_id);
		return;
	}
	if (code == DFCCL__V1__ERROR_CODE__ERROR_NONE) {
		reply_registered(s, request_id, r);
		return;
	}
	reg_forget(s, r); /* the workers already forgot it */
	reply_error_msg(s, request_id, code, message && *message ? message : "the device's worker refused the buffer");
}

static void handle_deregister(struct session *s, uint64_t req, uint32_t reg_id)
{
	struct session_reg *r = reg_find(s, reg_id);
	if (!r) {
		session_reply_error(s, req, EC(NOT_FOUND), "registration %u does not exist in this session", reg_id);
		return;
	}
	reg_release(s, r);
	reply_ok(s, req);
}

/* Whether viewer may see what uid owns. */
static int visible_to(const struct session *viewer, uid_t uid)
{
	return viewer->sees_all || viewer->uid == uid;
}

static uid_t session_owner(const struct server *srv, uint64_t session_id)
{
	for (const struct session *s = srv->sessions; s; s = s->next)
		if (s->id == session_id)
			return s->uid;
	return (uid_t)-1; /* gone: only those who see all see it */
}

/*
 * Moves the items viewer may not see to the end of the array and returns
 * how many come before them: the reply is sent with that many, and freed
 * with all of them.
 */
static size_t partition_visible(void **items, size_t n, const struct session *viewer,
                                uid_t (*owner)(const struct session *viewer, const void *item))
{
	size_t kept = 0;
	for (size_t i = 0; i < n; i++) {
		if (!visible_to(viewer, owner(viewer, items[i])))
			continue;
		void *t = items[kept];
		items[kept++] = items[i];
		items[i] = t;
	}
	return kept;
}

static uid_t comm_owner(const struct session *viewer, const void *item)
{
	(void)viewer;
	return (uid_t)((const Dfccl__V1__CommInfo *)item)->uid;
}

static uid_t queue_owner(const struct session *viewer, const void *item)
{
	return session_owner(viewer->srv, ((const Dfccl__V1__QueueInfo *)item)->session_id);
}

static int fill_sessions(struct server *srv, const struct session *viewer, Dfccl__V1__QueryReply *r)
{
	r->sessions = calloc(srv->nsessions ? srv->nsessions : 1, sizeof(*r->sessions));
	if (!r->sessions)
		return -ENOMEM;
	uint64_t now = server_now_ms();
	for (struct session *s = srv->sessions; s; s = s->next) {
		if (!visible_to(viewer, s->uid))
			continue;
		Dfccl__V1__SessionInfo *si = calloc(1, sizeof(*si));
		if (!si)
			return -ENOMEM;
		dfccl__v1__session_info__init(si);
		r->sessions[r->n_sessions++] = si;
		si->session_id = s->id;
		si->uid = (uint32_t)s->uid;
		si->pid = s->pid;
		si->client_name = s->client_name;
		si->ncomms = comm_session_count(srv, s);
		si->nregs = s->nregs;
		si->registered_bytes = s->registered_bytes;
		si->age_ms = now - s->created_ms;
		int stopped = 0;
		si->heartbeat_age_ms = srv->watch ? watch_heartbeat_age_ms(srv->watch, s, &stopped) : -1;
		si->stopped = stopped;
		si->devices = calloc(SESSION_MAX_DEVICES, sizeof(uint32_t));
		if (!si->devices)
			return -ENOMEM;
		for (uint32_t d = 0; d < SESSION_MAX_DEVICES; d++)
			if (s->qp_ids[d])
				si->devices[si->n_devices++] = d;
	}
	return 0;
}

static void free_sessions(Dfccl__V1__QueryReply *r)
{
	for (size_t i = 0; i < r->n_sessions; i++) {
		free(r->sessions[i]->devices);
		free(r->sessions[i]);
	}
	free(r->sessions);
}

static void handle_query(struct session *s, uint64_t req, const Dfccl__V1__Query *q)
{
	struct server *srv = s->srv;
	Dfccl__V1__QueryReply r = DFCCL__V1__QUERY_REPLY__INIT;
	Dfccl__V1__StatusInfo st = DFCCL__V1__STATUS_INFO__INIT;
	r.kind = q->kind;
	int rc = 0;
	switch (q->kind) {
	case DFCCL__V1__QUERY_KIND__QUERY_STATUS: {
		unsigned ready, pending;
		comm_count(srv, &ready, &pending);
		st.daemon_version = DFCCL_VERSION_STRING;
		st.protocol_version = DFCCL_PROTO_VERSION;
		st.uptime_ms = server_now_ms() - srv->start_ms;
		st.engine = srv->engine == DFCCLD_ENGINE_CUDA ? DFCCL__V1__ENGINE_KIND__ENGINE_CUDA
		                                              : DFCCL__V1__ENGINE_KIND__ENGINE_HOST;
		st.mps_active = srv->mps_active;
		st.nsessions = srv->nsessions;
		st.ncomms = ready;
		st.npending_comms = pending;
		st.nreleasing_comms = workers_comm_releases(srv->workers);
		st.socket_path = srv->cfg.socket_path;
		st.worker_user = (char *)worker_user_mode_name(&srv->worker_users);
		st.worker_user_can_switch = srv->worker_users.can_switch;
		rc = workers_fill_status(srv->workers, &st);
		r.status = &st;
		break;
	}
	case DFCCL__V1__QUERY_KIND__QUERY_SESSIONS: rc = fill_sessions(srv, s, &r); break;
	case DFCCL__V1__QUERY_KIND__QUERY_COMMS: rc = comm_query(srv, &r); break;
	case DFCCL__V1__QUERY_KIND__QUERY_QUEUES: rc = workers_fill_queues(srv->workers, &r); break;
	case DFCCL__V1__QUERY_KIND__QUERY_STATS: rc = workers_fill_stats(srv->workers, &r); break;
	case DFCCL__V1__QUERY_KIND__QUERY_STUCK:
		/* Another user's jobs stay invisible; root and admins see every one. */
		rc = srv->watch ? watch_fill_stuck(srv->watch, s->sees_all ? 0 : s->uid, &r) : 0;
		break;
	case DFCCL__V1__QUERY_KIND__QUERY_TOPOLOGY:
		/* Computed once at start; a detached server (tests) has none. */
		r.topology_json = srv->topo_doc ? srv->topo_doc : (char *)"";
		break;
	default:
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "unknown query kind %d", (int)q->kind);
		return;
	}
	/* Other users' communicators and queues are theirs to see: only the
	 * counts in status and the devices' stats are shared. */
	size_t ncomms = r.n_comms, nqueues = r.n_queues;
	if (rc < 0) {
		session_reply_error(s, req, EC(RESOURCE), "out of memory answering the query");
	} else {
		r.n_comms = partition_visible((void **)r.comms, ncomms, s, comm_owner);
		r.n_queues = partition_visible((void **)r.queues, nqueues, s, queue_owner);
		Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY;
		env.query_reply = &r;
		session_reply(s, req, &env, NULL, 0);
	}
	r.n_comms = ncomms;
	r.n_queues = nqueues;
	free_sessions(&r);
	comm_query_free(&r);
	watch_stuck_free(&r);
	workers_query_free(&r, &st);
}

/* dfcclctl dump COMM: the flight recorder, for its communicator's uid and
 * root, live or kept after the communicator is gone. */
static void handle_flight_dump(struct session *s, uint64_t req, const Dfccl__V1__FlightDump *fd)
{
	struct server *srv = s->srv;
	struct recorder *rec = srv->watch ? watch_recorder(srv->watch, fd->comm_id) : NULL;
	if (!rec || (s->uid != 0 && rec->uid != s->uid)) {
		session_reply_error(s, req, EC(NOT_FOUND),
		                    "no flight recorder for communicator %llu: it does not exist, belongs to another user, "
		                    "or is gone and no longer kept (dfcclctl comms lists the communicators; setting "
		                    "flight-recorder-keep says how many gone ones are kept)",
		                    (unsigned long long)fd->comm_id);
		return;
	}
	Dfccl__V1__FlightDumpReply d;
	if (recorder_dump(rec, watch_interval_ms(srv->watch), server_now_ms(), &d) < 0) {
		session_reply_error(s, req, EC(RESOURCE), "out of memory answering the flight-recorder dump");
	} else {
		Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_FLIGHT_DUMP_REPLY;
		env.flight_dump_reply = &d;
		session_reply(s, req, &env, NULL, 0);
	}
	recorder_dump_free(&d);
}

/* Descriptors each request may carry. */
static unsigned expected_fds(const dfccl_envelope *env)
{
	if (env->body_case == DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM &&
	    (env->register_mem->kind == DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD ||
	     env->register_mem->kind == DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD))
		return 1;
	return 0;
}

static void session_on_frame(struct conn *c, dfccl_envelope *env, int *fds, unsigned nfds)
{
	struct session *s = c->owner;
	if (s->state == SESSION_CLOSING)
		goto out;
	if (!env) {
		s->bad_frames++;
		log_notice("session", "session %llu (pid %d): malformed frame (%u so far)", (unsigned long long)s->id,
		           (int)s->pid, s->bad_frames);
		reply_error_msg(s, 0, EC(INVALID_ARGUMENT), "malformed frame: not a dfccl.v1.Envelope");
		if (s->bad_frames >= SESSION_MAX_BAD_FRAMES) {
			s->state = SESSION_CLOSING;
			conn_end_after_flush(&s->conn);
		}
		goto out;
	}
	uint64_t req = env->request_id;
	if (nfds != expected_fds(env)) {
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "this request carries %u descriptors, expected %u", nfds,
		                    expected_fds(env));
		goto out;
	}
	if (s->state == SESSION_HELLO && env->body_case != DFCCL__V1__ENVELOPE__BODY_HELLO) {
		session_reply_error(s, req, EC(INVALID_USAGE), "the first message must be Hello");
		goto out;
	}
	switch (env->body_case) {
	case DFCCL__V1__ENVELOPE__BODY_HELLO:
		if (s->state != SESSION_HELLO)
			session_reply_error(s, req, EC(INVALID_USAGE), "Hello was already exchanged on this connection");
		else
			handle_hello(s, req, env->hello);
		break;
	case DFCCL__V1__ENVELOPE__BODY_ATTACH: handle_attach(s, req, env->attach); break;
	case DFCCL__V1__ENVELOPE__BODY_COMM_INIT: handle_comm_init(s, req, env->comm_init); break;
	case DFCCL__V1__ENVELOPE__BODY_COMM_DESTROY: handle_comm_leave(s, req, env->comm_destroy->comm_id, 0); break;
	case DFCCL__V1__ENVELOPE__BODY_COMM_ABORT: handle_comm_leave(s, req, env->comm_abort->comm_id, 1); break;
	case DFCCL__V1__ENVELOPE__BODY_COMM_REVOKE: handle_comm_leave(s, req, env->comm_revoke->comm_id, 2); break;
	case DFCCL__V1__ENVELOPE__BODY_COMM_SHRINK_ADVICE: handle_shrink_advice(s, req, env->comm_shrink_advice); break;
	case DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM: handle_register(s, req, env->register_mem, fds); break;
	case DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM: handle_alloc(s, req, env->alloc_mem); break;
	case DFCCL__V1__ENVELOPE__BODY_DEREGISTER_MEM: handle_deregister(s, req, env->deregister_mem->reg_id); break;
	case DFCCL__V1__ENVELOPE__BODY_QUERY: handle_query(s, req, env->query); break;
	case DFCCL__V1__ENVELOPE__BODY_FLIGHT_DUMP: handle_flight_dump(s, req, env->flight_dump); break;
	case DFCCL__V1__ENVELOPE__BODY__NOT_SET:
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "empty request, or a request this daemon does not know");
		break;
	default:
		session_reply_error(s, req, EC(INVALID_ARGUMENT), "message %d is not a request a client may send",
		                    (int)env->body_case);
		break;
	}
out:
	frame_close_fds(fds, nfds);
	frame_envelope_free(env);
}

static void session_on_end(struct conn *c, int err)
{
	struct session *s = c->owner;
	if (err == -ETIMEDOUT && s->state == SESSION_HELLO)
		log_notice("session", "session %llu (pid %d): closed, no Hello within %lld ms (setting hello-timeout-ms)",
		           (unsigned long long)s->id, (int)s->pid, (long long)s->srv->cfg.hello_timeout_ms);
	else if (err == -ENOBUFS)
		log_notice("session", "session %llu (pid %d): closed, it stopped reading its replies (more than %u bytes "
		           "queued)", (unsigned long long)s->id, (int)s->pid, CONN_MAX_QUEUED);
	else if (err && err != -ECONNRESET)
		log_notice("session", "session %llu (pid %d): connection ended: %s", (unsigned long long)s->id, (int)s->pid,
		           strerror(-err));
	session_end(s);
}

/* ------------------------------------------------------------ lifecycle */

/* Says why before hanging up: a blocking write of one small frame to a
 * fresh socket cannot stall. Closes fd. */
static void refuse_connection(int fd, pid_t pid, const char *msg)
{
	Dfccl__V1__ErrorReply er = DFCCL__V1__ERROR_REPLY__INIT;
	er.code = EC(RESOURCE);
	er.message = (char *)msg;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ERROR;
	env.error = &er;
	frame_send(fd, &env, NULL, 0);
	log_notice("session", "refused a connection from pid %d: %s", (int)pid, msg);
	close(fd);
}

int session_new(struct server *srv, int fd, struct session **out)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	struct user *u = user_ref(&srv->users, cred.uid);
	if (!u) {
		close(fd);
		return -ENOMEM;
	}
	char msg[256];
	if (user_charge_session(&srv->users, u) < 0) {
		snprintf(msg, sizeof(msg), "uid %u already holds %lld sessions (setting max-sessions-per-uid)",
		         (unsigned)cred.uid, (long long)srv->users.limits.max_sessions);
		refuse_connection(fd, cred.pid, msg);
		user_unref(&srv->users, u);
		return -EDQUOT;
	}
	if (fd_budget_charge(&srv->fds, 1, FD_FOR_CONNECTION) < 0) {
		snprintf(msg, sizeof(msg), "dfccld has no descriptor left for another connection (limit %lld); try "
		         "again when clients have left, or raise the daemon's LimitNOFILE", (long long)srv->fds.limit);
		refuse_connection(fd, cred.pid, msg);
		user_uncharge_session(u);
		user_unref(&srv->users, u);
		return -EMFILE;
	}
	struct session *s = calloc(1, sizeof(*s));
	if (!s) {
		fd_budget_uncharge(&srv->fds, 1);
		user_uncharge_session(u);
		user_unref(&srv->users, u);
		close(fd);
		return -ENOMEM;
	}
	s->srv = srv;
	s->id = ++srv->next_session_id;
	s->uid = cred.uid;
	s->gid = cred.gid;
	s->pid = cred.pid;
	s->user = u;
	s->sees_all = user_sees_all(cred.uid, cred.gid);
	s->state = SESSION_HELLO;
	s->created_ms = server_now_ms();
	int rc = conn_init(&s->conn, srv->loop, fd, s, session_on_frame, session_on_end);
	if (rc < 0) {
		fd_budget_uncharge(&srv->fds, 1);
		user_uncharge_session(u);
		user_unref(&srv->users, u);
		close(fd);
		free(s);
		return rc;
	}
	s->next = srv->sessions;
	if (srv->sessions)
		srv->sessions->prev = s;
	srv->sessions = s;
	srv->nsessions++;
	conn_set_deadline(&s->conn, (uint64_t)srv->cfg.hello_timeout_ms);
	log_debug("session", "session %llu: accepted pid %d uid %u", (unsigned long long)s->id, (int)s->pid,
	          (unsigned)s->uid);
	*out = s;
	return 0;
}

/* Releases what the session holds; the session stays in the list (and
 * replies are refused) until session_end unlinks it. */
static void session_release(struct session *s)
{
	struct server *srv = s->srv;
	comm_session_gone(srv, s);
	while (s->regs)
		reg_release(s, s->regs);
	for (uint32_t d = 0; d < SESSION_MAX_DEVICES; d++) {
		if (s->qp_ids[d]) {
			workers_detach_qp(srv->workers, d, s->qp_ids[d]);
			s->qp_ids[d] = 0;
			qp_uncharge(s);
		}
	}
}

void session_end(struct session *s)
{
	struct server *srv = s->srv;
	if (s->conn.closing)
		return;
	s->state = SESSION_CLOSING;
	session_release(s);
	if (s->prev)
		s->prev->next = s->next;
	else
		srv->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	srv->nsessions--;
	fd_budget_uncharge(&srv->fds, 1);
	user_uncharge_session(s->user);
	user_unref(&srv->users, s->user);
	s->user = NULL;
	log_info("session", "session %llu (pid %d) closed", (unsigned long long)s->id, (int)s->pid);
	conn_close(&s->conn, session_free_cb);
}

void session_end_with_notice(struct session *s, int code, const char *message)
{
	if (s->state == SESSION_CLOSING)
		return;
	session_send_notice(s, code, 0, 0, message);
	s->state = SESSION_CLOSING;
	conn_end_after_flush(&s->conn);
}

int session_feed(struct session *s, const uint8_t *data, size_t len)
{
	return conn_feed(&s->conn, data, len);
}
