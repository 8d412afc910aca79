/*
 * See worker.h. The worker is single-threaded in this release: one loop
 * serves the control socket and every queue pair of the device.
 *
 * Idling: after the queues run dry the loop keeps polling for a short spin
 * window (new work often follows at once), then announces SLEEPING in every
 * queue header, re-checks the queues (a client that armed an entry just
 * before seeing SLEEPING would otherwise not ring), and blocks in epoll on
 * the doorbell eventfds and the control socket. Clients ring only when they
 * see SLEEPING, so the busy path has no system call on either side.
 */
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "devices.h"
#include "dfccl_comm.h"
#include "dfccl_stats.h"
#include "frame.h"
#include "engine.h"
#include "log.h"
#include "sq.h"
#include "worker_user.h"

#define WORKER_SPIN_NS 200000ull /* keep polling this long after the last entry */
/* With work in flight that nothing can wake us for (tasks blocked on peers
 * in other workers, a running daemon kernel), poll again after a pause that
 * grows from MIN to the engine's maximum, so a blocked engine costs little
 * CPU (CI runs 8 ranks on 2 cores) yet notices progress soon. */
#define BLOCKED_PAUSE_MIN_NS 5000ull

struct wqp {
	struct wqp *next;
	struct sq_queue q;
	int efd;
	void *map;
};

struct wreg {
	struct wreg *next;
	struct sq_reg r;
	int kind;
	void *map;
	size_t map_len;
};

struct wcomm {
	struct wcomm *next;
	uint64_t comm_id;
	void *map;
	size_t size;
	uint64_t devices; /* the devices of its ranks (bit d): whose blobs WorkerCommPeers may carry */
};

struct worker_state {
	unsigned device;
	int engine;
	int ctl;
	int ep;
	struct frame_reader rd;
	struct dfccl_worker_stats *stats;
	struct engine *eng;  /* NULL in a parked worker */
	struct wqp *qps;
	struct wreg *regs;
	struct wcomm *comms;
};

static volatile sig_atomic_t worker_stop;

static void on_sigterm(int sig)
{
	(void)sig;
	worker_stop = 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void stat_add(uint64_t *p, uint64_t v)
{
	atomic_fetch_add_explicit((_Atomic uint64_t *)p, v, memory_order_relaxed);
}

static const struct sq_reg *reg_lookup(void *ctx, uint32_t reg_id)
{
	struct worker_state *w = ctx;
	for (struct wreg *r = w->regs; r; r = r->next)
		if (r->r.reg_id == reg_id)
			return &r->r;
	return NULL;
}

/* ------------------------------------------------------------ control messages */

static void wqp_free(struct worker_state *w, struct wqp *p)
{
	engine_qp_del(w->eng, &p->q);
	epoll_ctl(w->ep, EPOLL_CTL_DEL, p->efd, NULL);
	close(p->efd);
	sq_queue_close(&p->q);
	munmap(p->map, p->q.size);
	free(p);
}

static void attach_qp(struct worker_state *w, const Dfccl__V1__WorkerAttachQp *a, int *fds, unsigned nfds)
{
	char err[256];
	if (nfds != 2) {
		log_err("worker", "queue pair %u arrived with %u descriptors, expected 2", a->qp_id, nfds);
		return;
	}
	struct wqp *p = calloc(1, sizeof(*p));
	if (!p)
		return;
	p->efd = fds[1];
	fds[1] = -1;
	p->map = mmap(NULL, a->region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (p->map == MAP_FAILED) {
		log_err("worker", "cannot map queue pair %u: %s", a->qp_id, strerror(errno));
		close(p->efd);
		free(p);
		return;
	}
	int rc = sq_queue_open(&p->q, p->map, a->region_size, a->qp_id, a->session_id, err, sizeof(err));
	if (rc < 0) {
		log_err("worker", "queue pair %u of session %llu rejected: %s", a->qp_id,
		        (unsigned long long)a->session_id, err);
		munmap(p->map, a->region_size);
		close(p->efd);
		free(p);
		return;
	}
	p->q.uid = a->uid;
	rc = engine_qp_add(w->eng, &p->q, err, sizeof(err));
	if (rc < 0) {
		log_err("worker", "device %u: the engine cannot serve queue pair %u: %s", w->device, a->qp_id, err);
		sq_queue_close(&p->q);
		munmap(p->map, a->region_size);
		close(p->efd);
		free(p);
		return;
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = p};
	epoll_ctl(w->ep, EPOLL_CTL_ADD, p->efd, &ev);
	p->next = w->qps;
	w->qps = p;
	log_debug("worker", "device %u: attached queue pair %u (session %llu of uid %u, %u entries)", w->device,
	          a->qp_id, (unsigned long long)a->session_id, a->uid, p->q.n);
}

static void detach_qp(struct worker_state *w, uint32_t qp_id)
{
	for (struct wqp **pp = &w->qps; *pp; pp = &(*pp)->next) {
		if ((*pp)->q.qp_id == qp_id) {
			struct wqp *p = *pp;
			*pp = p->next;
			wqp_free(w, p);
			return;
		}
	}
}

/* Sends one frame to the supervisor. The control socket is non-blocking for
 * the loop's sake; a reply is small and the supervisor drains the socket,
 * so a blocking send cannot stall for long (and a wedged supervisor is
 * noticed through its death anyway). */
static void ctl_send(struct worker_state *w, Dfccl__V1__Envelope *env, const int *fds, unsigned nfds)
{
	int fl = fcntl(w->ctl, F_GETFL);
	fcntl(w->ctl, F_SETFL, fl & ~O_NONBLOCK);
	int rc = frame_send(w->ctl, env, fds, nfds);
	fcntl(w->ctl, F_SETFL, fl);
	if (rc < 0)
		log_warn("worker", "cannot answer the supervisor: %s", strerror(-rc));
}

/* The protocol's code for an engine's negative errno. */
static int error_code(int rc)
{
	switch (rc) {
	case -EINVAL:
	case -ERANGE: return DFCCL__V1__ERROR_CODE__ERROR_INVALID_ARGUMENT;
	case -ENOTSUP: return DFCCL__V1__ERROR_CODE__ERROR_NOT_SUPPORTED;
	default: return DFCCL__V1__ERROR_CODE__ERROR_RESOURCE;
	}
}

static void reg_ack(struct worker_state *w, uint32_t reg_id, int code, const char *msg)
{
	Dfccl__V1__WorkerRegAck ack = DFCCL__V1__WORKER_REG_ACK__INIT;
	ack.reg_id = reg_id;
	ack.code = code;
	ack.message = (char *)msg;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_REG_ACK;
	env.worker_reg_ack = &ack;
	ctl_send(w, &env, NULL, 0);
}

/* Answers WorkerCommAdd (with the engine's exported blob, len bytes) or
 * WorkerCommPeers (blob NULL). */
static void comm_ack(struct worker_state *w, uint64_t comm_id, int code, const char *msg, const void *blob,
                     size_t len)
{
	Dfccl__V1__WorkerCommAck ack = DFCCL__V1__WORKER_COMM_ACK__INIT;
	ack.comm_id = comm_id;
	ack.code = code;
	ack.message = (char *)msg;
	ack.peer_blob.data = (uint8_t *)blob;
	ack.peer_blob.len = len;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ACK;
	env.worker_comm_ack = &ack;
	ctl_send(w, &env, NULL, 0);
}

static struct wcomm *wcomm_find(struct worker_state *w, uint64_t comm_id)
{
	for (struct wcomm *c = w->comms; c; c = c->next)
		if (c->comm_id == comm_id)
			return c;
	return NULL;
}

/* What the engine exports for the other workers of comm_id (blob, up to
 * ENGINE_PEER_BLOB_MAX bytes; *len = 0: nothing). Returns 0 or a negative
 * errno with a sentence in msg. */
static int comm_export(struct worker_state *w, uint64_t comm_id, uint8_t *blob, size_t *len, char *msg,
                       size_t msglen)
{
	msg[0] = '\0';
	int rc = engine_comm_export(w->eng, comm_id, blob, len, msg, msglen);
	if (rc == 0 && *len > ENGINE_PEER_BLOB_MAX) {
		snprintf(msg, msglen, "the engine exported %zu bytes for the communicator's other devices, more than the "
		         "%u allowed", *len, ENGINE_PEER_BLOB_MAX);
		rc = -EOVERFLOW;
	} else if (rc < 0 && !msg[0]) {
		snprintf(msg, msglen, "the engine cannot export communicator %llu to its other devices: %s",
		         (unsigned long long)comm_id, strerror(-rc));
	}
	return rc;
}

static void add_comm(struct worker_state *w, const Dfccl__V1__WorkerCommAdd *a, int *fds, unsigned nfds)
{
	char msg[200] = "";
	int code = DFCCL__V1__ERROR_CODE__ERROR_INTERNAL;
	struct engine_member *members = NULL;
	struct wcomm *c = calloc(1, sizeof(*c));
	if (!c || nfds != 1 || a->nranks == 0 || a->nranks > DFCCL_COMM_MAX_RANKS || a->n_members != a->nranks ||
	    a->region_size != DFCCL_COMM_REGION_SIZE(a->nranks)) {
		snprintf(msg, sizeof(msg), "malformed communicator %llu", (unsigned long long)a->comm_id);
		goto fail;
	}
	c->comm_id = a->comm_id;
	c->size = a->region_size;
	c->map = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (c->map == MAP_FAILED) {
		c->map = NULL;
		snprintf(msg, sizeof(msg), "cannot map the communicator region: %s", strerror(errno));
		code = DFCCL__V1__ERROR_CODE__ERROR_RESOURCE;
		goto fail;
	}
	const struct dfccl_comm_header *h = c->map;
	if (h->magic != DFCCL_COMM_MAGIC || h->comm_id != a->comm_id || h->nranks != a->nranks) {
		snprintf(msg, sizeof(msg), "communicator region does not match communicator %llu",
		         (unsigned long long)a->comm_id);
		goto fail;
	}
	members = calloc(a->nranks, sizeof(*members));
	if (!members)
		goto fail;
	for (size_t i = 0; i < a->n_members; i++) {
		uint32_t r = a->members[i]->rank;
		if (r >= a->nranks || members[r].session_id) {
			snprintf(msg, sizeof(msg), "communicator %llu lists rank %u twice or out of range",
			         (unsigned long long)a->comm_id, r);
			goto fail;
		}
		members[r].rank = r;
		members[r].device = a->members[i]->device;
		members[r].session_id = a->members[i]->session_id;
		if (members[r].device < 64)
			c->devices |= 1ull << members[r].device;
	}
	int rc = engine_comm_add(w->eng, a->comm_id, a->nranks, members, c->map, c->size, msg, sizeof(msg));
	if (rc < 0) {
		code = DFCCL__V1__ERROR_CODE__ERROR_RESOURCE;
		goto fail;
	}
	uint8_t blob[ENGINE_PEER_BLOB_MAX];
	size_t len = 0;
	rc = comm_export(w, a->comm_id, blob, &len, msg, sizeof(msg));
	if (rc < 0) {
		/* Nobody got what it exported: nothing to wait for. */
		engine_comm_del(w->eng, a->comm_id);
		engine_comm_free(w->eng, a->comm_id);
		code = error_code(rc);
		goto fail;
	}
	free(members);
	c->next = w->comms;
	w->comms = c;
	log_debug("worker", "device %u: communicator %llu (%u ranks, %zu bytes exported)", w->device,
	          (unsigned long long)a->comm_id, a->nranks, len);
	comm_ack(w, a->comm_id, DFCCL__V1__ERROR_CODE__ERROR_NONE, "", blob, len);
	return;
fail:
	log_err("worker", "device %u: %s", w->device, msg);
	free(members);
	if (c && c->map)
		munmap(c->map, c->size);
	free(c);
	comm_ack(w, a->comm_id, code, msg, NULL, 0);
}

/* Checks the blobs of WorkerCommPeers against communicator c: each of
 * another device of c, once, of 1..ENGINE_PEER_BLOB_MAX bytes. Returns 0,
 * or -1 with the reason in msg. */
static int peers_check(const struct worker_state *w, const struct wcomm *c, const Dfccl__V1__WorkerCommPeers *m,
                       char *msg, size_t msglen)
{
	uint64_t seen = 0;
	for (size_t i = 0; i < m->n_peers; i++) {
		uint32_t d = m->peers[i]->device;
		size_t len = m->peers[i]->blob.len;
		if (d >= 64 || d == w->device || !(c->devices & (1ull << d))) {
			snprintf(msg, msglen, "device %u is not another device of communicator %llu", d,
			         (unsigned long long)c->comm_id);
			return -1;
		}
		if (seen & (1ull << d)) {
			snprintf(msg, msglen, "the blobs of communicator %llu list device %u twice",
			         (unsigned long long)c->comm_id, d);
			return -1;
		}
		if (len == 0 || len > ENGINE_PEER_BLOB_MAX) {
			snprintf(msg, msglen, "the blob of device %u has %zu bytes, outside 1..%u", d, len,
			         ENGINE_PEER_BLOB_MAX);
			return -1;
		}
		seen |= 1ull << d;
	}
	return 0;
}

/* WorkerCommPeers: the engine takes what the communicator's other workers
 * exported; the supervisor hears whether it could. */
static void comm_peers(struct worker_state *w, const Dfccl__V1__WorkerCommPeers *m)
{
	char msg[200] = "";
	int code = DFCCL__V1__ERROR_CODE__ERROR_INVALID_ARGUMENT;
	struct engine_peer_blob *peers = NULL;
	struct wcomm *c = wcomm_find(w, m->comm_id);
	if (!c) {
		snprintf(msg, sizeof(msg), "communicator %llu is unknown to this worker", (unsigned long long)m->comm_id);
		code = DFCCL__V1__ERROR_CODE__ERROR_NOT_FOUND;
		goto fail;
	}
	if (peers_check(w, c, m, msg, sizeof(msg)) < 0)
		goto fail;
	peers = calloc(m->n_peers ? m->n_peers : 1, sizeof(*peers));
	if (!peers) {
		snprintf(msg, sizeof(msg), "out of memory taking the blobs of communicator %llu",
		         (unsigned long long)m->comm_id);
		code = DFCCL__V1__ERROR_CODE__ERROR_RESOURCE;
		goto fail;
	}
	for (size_t i = 0; i < m->n_peers; i++)
		peers[i] = (struct engine_peer_blob){m->peers[i]->device, (uint32_t)m->peers[i]->blob.len,
		                                     m->peers[i]->blob.data};
	int rc = engine_comm_peers(w->eng, m->comm_id, peers, m->n_peers, msg, sizeof(msg));
	if (rc < 0) {
		if (!msg[0])
			snprintf(msg, sizeof(msg), "the engine cannot take the blobs of communicator %llu: %s",
			         (unsigned long long)m->comm_id, strerror(-rc));
		code = error_code(rc);
		goto fail;
	}
	free(peers);
	log_debug("worker", "device %u: communicator %llu took %zu peers' blobs", w->device,
	          (unsigned long long)m->comm_id, m->n_peers);
	comm_ack(w, m->comm_id, DFCCL__V1__ERROR_CODE__ERROR_NONE, "", NULL, 0);
	return;
fail:
	log_err("worker", "device %u: %s", w->device, msg);
	free(peers);
	comm_ack(w, m->comm_id, code, msg, NULL, 0);
}

/* Tells the supervisor that this worker maps no other worker's memory of
 * communicator comm_id any more (WorkerCommDel with await_free). */
static void comm_released(struct worker_state *w, uint64_t comm_id)
{
	Dfccl__V1__WorkerCommReleased m = DFCCL__V1__WORKER_COMM_RELEASED__INIT;
	m.comm_id = comm_id;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_RELEASED;
	env.worker_comm_released = &m;
	ctl_send(w, &env, NULL, 0);
}

/* WorkerCommDel: the engine lets go of the communicator, keeping what it
 * exported to other workers until WorkerCommFree when await_free says
 * that message comes, else freeing it now. */
static void del_comm(struct worker_state *w, uint64_t comm_id, int await_free)
{
	for (struct wcomm **pp = &w->comms; *pp; pp = &(*pp)->next) {
		if ((*pp)->comm_id == comm_id) {
			struct wcomm *c = *pp;
			*pp = c->next;
			engine_comm_del(w->eng, comm_id);
			if (!await_free)
				engine_comm_free(w->eng, comm_id);
			munmap(c->map, c->size);
			free(c);
			break;
		}
	}
	if (await_free)
		comm_released(w, comm_id);
}

static void add_reg(struct worker_state *w, const Dfccl__V1__WorkerAddReg *a, int *fds, unsigned nfds)
{
	struct wreg *r = calloc(1, sizeof(*r));
	if (!r) {
		reg_ack(w, a->reg_id, DFCCL__V1__ERROR_CODE__ERROR_RESOURCE, "worker out of memory");
		return;
	}
	r->r.reg_id = a->reg_id;
	r->r.session_id = a->session_id;
	r->r.size = a->size;
	r->kind = a->kind;
	if (a->kind == DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD && nfds == 1) {
		/* Map from the start of the file: mmap offsets must be page
		 * aligned, registration offsets need not be. */
		r->map_len = a->offset + a->size;
		r->map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
		if (r->map == MAP_FAILED) {
			char msg[160];
			snprintf(msg, sizeof(msg), "the device's worker cannot map the buffer: %s", strerror(errno));
			log_err("worker", "registration %u: %s", a->reg_id, msg);
			free(r);
			reg_ack(w, a->reg_id, DFCCL__V1__ERROR_CODE__ERROR_RESOURCE, msg);
			return;
		}
		r->r.base = (char *)r->map + a->offset;
	}
	char err[200] = "";
	struct engine_mem_src src = {.mem = ENGINE_MEM_HOST, .fd = -1, .offset = a->offset};
	int rc = 0;
	switch (a->kind) {
	case DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD: break;
	case DFCCL__V1__MEM_KIND__MEM_CUDA_IPC:
		src.mem = ENGINE_MEM_CUDA_IPC;
		src.ipc = a->ipc_handle.data;
		src.ipc_len = a->ipc_handle.len;
		break;
	case DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD:
		src.mem = ENGINE_MEM_CUDA_VMM_FD;
		src.fd = nfds == 1 ? fds[0] : -1;
		break;
	default:
		snprintf(err, sizeof(err), "memory kind %d is not supported by this worker", (int)a->kind);
		rc = -ENOTSUP;
		break;
	}
	if (rc == 0)
		rc = engine_reg_add(w->eng, &r->r, &src, err, sizeof(err));
	if (rc < 0) {
		log_err("worker", "device %u: registration %u: %s", w->device, a->reg_id, err);
		if (r->map)
			munmap(r->map, r->map_len);
		free(r);
		reg_ack(w, a->reg_id, error_code(rc), err);
		return;
	}
	r->next = w->regs;
	w->regs = r;
	reg_ack(w, a->reg_id, DFCCL__V1__ERROR_CODE__ERROR_NONE, "");
}

static void del_reg(struct worker_state *w, uint32_t reg_id)
{
	/* Also when the worker never mapped it: the engine may hold an
	 * allocation made for it (alloc_mem). */
	engine_reg_del(w->eng, reg_id);
	for (struct wreg **pp = &w->regs; *pp; pp = &(*pp)->next) {
		if ((*pp)->r.reg_id == reg_id) {
			struct wreg *r = *pp;
			*pp = r->next;
			if (r->map)
				munmap(r->map, r->map_len);
			free(r);
			return;
		}
	}
}

/* Why a parked worker (no engine) refuses work: the supervisor never sends
 * it any (worker_user_serves), so this is said only if that breaks. */
static const char parked_msg[] = "this device's worker is parked (no job uses the device)";

/* The supervisor asks for device memory of a client's dfcclMemAlloc; the
 * answer carries it as a descriptor (see WorkerAllocMem). */
static void alloc_mem(struct worker_state *w, const Dfccl__V1__WorkerAllocMem *a)
{
	char err[200] = "";
	int fd = -1;
	uint64_t map_size = 0;
	int rc = -ENODEV;
	if (w->eng)
		rc = engine_mem_alloc(w->eng, a->reg_id, a->size, &fd, &map_size, err, sizeof(err));
	else
		snprintf(err, sizeof(err), "%s", parked_msg);
	Dfccl__V1__WorkerAllocDone done = DFCCL__V1__WORKER_ALLOC_DONE__INIT;
	done.reg_id = a->reg_id;
	if (rc < 0) {
		log_err("worker", "device %u: allocation for registration %u: %s", w->device, a->reg_id, err);
		done.code = error_code(rc);
		done.message = err;
	} else {
		done.map_size = map_size;
		log_debug("worker", "device %u: allocated %llu bytes for registration %u", w->device,
		          (unsigned long long)map_size, a->reg_id);
	}
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_ALLOC_DONE;
	env.worker_alloc_done = &done;
	ctl_send(w, &env, rc < 0 ? NULL : &fd, rc < 0 ? 0 : 1);
	if (fd >= 0)
		close(fd);
}

/*
 * A parked worker has no engine: it refuses what would need one and
 * ignores the rest, which concerns things it does not hold (alloc_mem
 * answers for itself). Returns 1 when env was handled.
 */
static int parked_refuse(struct worker_state *w, const dfccl_envelope *env)
{
	switch (env->body_case) {
	case DFCCL__V1__ENVELOPE__BODY_WORKER_ATTACH_QP:
		log_err("worker", "device %u: queue pair %u refused: %s", w->device, env->worker_attach_qp->qp_id,
		        parked_msg);
		return 1;
	case DFCCL__V1__ENVELOPE__BODY_WORKER_ADD_REG:
		reg_ack(w, env->worker_add_reg->reg_id, DFCCL__V1__ERROR_CODE__ERROR_INTERNAL, parked_msg);
		return 1;
	case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ADD:
		comm_ack(w, env->worker_comm_add->comm_id, DFCCL__V1__ERROR_CODE__ERROR_INTERNAL, parked_msg, NULL, 0);
		return 1;
	case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_PEERS:
		comm_ack(w, env->worker_comm_peers->comm_id, DFCCL__V1__ERROR_CODE__ERROR_INTERNAL, parked_msg, NULL, 0);
		return 1;
	case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_DEL:
		/* Nothing mapped here: released at once. */
		if (env->worker_comm_del->await_free)
			comm_released(w, env->worker_comm_del->comm_id);
		return 1;
	case DFCCL__V1__ENVELOPE__BODY_WORKER_DETACH_QP:
	case DFCCL__V1__ENVELOPE__BODY_WORKER_DEL_REG:
	case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ABORT:
	case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_FREE: return 1;
	default: return 0;
	}
}

/* Returns 0, or -1 when the supervisor is gone. */
static int handle_ctl(struct worker_state *w)
{
	int rc = frame_reader_fill(&w->rd, w->ctl);
	if (rc == -EAGAIN || rc == -EINTR)
		return 0;
	if (rc <= 0)
		return -1;
	for (;;) {
		dfccl_envelope *env;
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 0;
		rc = frame_reader_next(&w->rd, &env, fds, &nfds);
		if (rc == 0)
			return 0;
		if (rc < 0) {
			log_err("worker", "malformed frame from the supervisor: %s", strerror(-rc));
			return -1;
		}
		if (!w->eng && parked_refuse(w, env)) {
			frame_close_fds(fds, nfds);
			frame_envelope_free(env);
			continue;
		}
		switch (env->body_case) {
		case DFCCL__V1__ENVELOPE__BODY_WORKER_ATTACH_QP: attach_qp(w, env->worker_attach_qp, fds, nfds); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_DETACH_QP: detach_qp(w, env->worker_detach_qp->qp_id); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_ADD_REG: add_reg(w, env->worker_add_reg, fds, nfds); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_DEL_REG: del_reg(w, env->worker_del_reg->reg_id); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_ALLOC_MEM: alloc_mem(w, env->worker_alloc_mem); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ADD: add_comm(w, env->worker_comm_add, fds, nfds); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_PEERS: comm_peers(w, env->worker_comm_peers); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ABORT:
			engine_comm_abort(w->eng, env->worker_comm_abort->comm_id, env->worker_comm_abort->status);
			break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_DEL:
			del_comm(w, env->worker_comm_del->comm_id, env->worker_comm_del->await_free);
			break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_FREE: engine_comm_free(w->eng, env->worker_comm_free->comm_id); break;
		default: log_warn("worker", "unexpected message %d from the supervisor", (int)env->body_case); break;
		}
		frame_close_fds(fds, nfds);
		frame_envelope_free(env);
	}
}

/* ------------------------------------------------------------ the loop */

static int run_loop(struct worker_state *w)
{
	uint64_t last_work = now_ns();
	uint64_t pause_ns = 0;
	while (!worker_stop) {
		unsigned work = engine_poll(w->eng);
		const char *fatal = engine_fatal(w->eng);
		if (fatal) {
			log_err("worker", "device %u: %s; exiting so that a fresh worker takes the device", w->device, fatal);
			return 1;
		}
		if (work > 0) {
			last_work = now_ns();
			pause_ns = 0;
			continue;
		}
		uint64_t now = now_ns();
		atomic_store_explicit((_Atomic uint64_t *)&w->stats->heartbeat_ns, now, memory_order_relaxed);
		struct timespec ts = {0, 0}, *timeout = &ts;
		int slept = 0;
		uint64_t pause_max;
		if (engine_busy(w->eng, &pause_max)) {
			pause_ns = pause_ns ? pause_ns * 2 : BLOCKED_PAUSE_MIN_NS;
			if (pause_ns > pause_max)
				pause_ns = pause_max;
			ts.tv_nsec = (long)pause_ns;
		} else if (now - last_work > WORKER_SPIN_NS) {
			/* Going to sleep: the engine announces it and looks once
			 * more, so an entry armed before the announcement is not
			 * missed. */
			if (!engine_sleep(w->eng)) {
				last_work = now_ns();
				continue;
			}
			timeout = NULL;
			slept = 1;
		}
		struct epoll_event evs[16];
		int n = epoll_pwait2(w->ep, evs, 16, timeout, NULL);
		if (n < 0 && errno != EINTR) {
			log_err("worker", "epoll_pwait2: %s", strerror(errno));
			return 1;
		}
		if (slept)
			engine_wake(w->eng);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr == NULL) {
				if (handle_ctl(w) < 0)
					return worker_stop ? 0 : 1;
				continue;
			}
			struct wqp *p = evs[i].data.ptr;
			uint64_t v;
			if (read(p->efd, &v, sizeof(v)) == sizeof(v))
				stat_add(&w->stats->doorbells, 1);
		}
		if (n > 0)
			last_work = now_ns();
	}
	return 0;
}

/* A parked worker only waits for the supervisor: to close the control
 * socket, or to stop it with SIGTERM (which interrupts the wait). */
static int run_parked(struct worker_state *w)
{
	while (!worker_stop) {
		struct epoll_event ev;
		int n = epoll_wait(w->ep, &ev, 1, -1);
		if (n < 0 && errno != EINTR) {
			log_err("worker", "epoll_wait: %s", strerror(errno));
			return 1;
		}
		if (n > 0 && handle_ctl(w) < 0)
			return worker_stop ? 0 : 1;
	}
	return 0;
}

/*
 * Becomes the user the supervisor chose. A worker of another uid than the
 * daemon's cannot write the daemon's CUDA JIT cache (CUDA_CACHE_PATH, or
 * under $HOME): it does without rather than have CUDA fail on it.
 */
static int worker_become(unsigned device, const struct worker_ident *id, int engine)
{
	char err[256];
	if (worker_user_become(&id->cred, err, sizeof(err)) < 0) {
		log_err("worker", "device %u: cannot run as uid %u gid %u: %s", device, (unsigned)id->cred.uid,
		        (unsigned)id->cred.gid, err);
		return -1;
	}
	const char *cache = getenv("CUDA_CACHE_PATH");
	if (!cache || !*cache)
		cache = getenv("HOME");
	if (engine == DFCCLD_ENGINE_CUDA && cache && *cache && access(cache, W_OK) != 0) {
		setenv("CUDA_CACHE_DISABLE", "1", 1);
		log_debug("worker", "device %u: %s is not writable by uid %u: CUDA's JIT cache is off", device, cache,
		          (unsigned)id->cred.uid);
	}
	log_info("worker", "device %u: running as uid %u gid %u", device, (unsigned)id->cred.uid,
	         (unsigned)id->cred.gid);
	return 0;
}

int worker_main(unsigned device, const struct worker_ident *id, const struct dfccld_config *cfg)
{
	int engine = cfg->engine;
	struct worker_state w;
	memset(&w, 0, sizeof(w));
	w.device = device;
	w.engine = engine;
	w.ctl = WORKER_CTL_FD;
	w.ep = -1;

	/* Become the user first: a change of credentials clears the
	 * parent-death signal, which is set after it. */
	if (id->cred.uid != WORKER_KEEP_UID && worker_become(device, id, engine) < 0)
		return 3;
	/* Die with the supervisor, whatever kills it. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		return 1;
	/* The loop's pauses are microseconds long (the kernel's completions,
	 * entries a stream arms): the default timer slack of 50 us would
	 * stretch each of them into the client's latency. */
	prctl(PR_SET_TIMERSLACK, 1UL);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigterm;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	void *sp = mmap(NULL, DFCCL_STATS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, WORKER_STATS_FD, 0);
	if (sp == MAP_FAILED || ((struct dfccl_worker_stats *)sp)->magic != DFCCL_STATS_MAGIC) {
		log_err("worker", "device %u: no statistics page on fd %d; a worker is started by dfccld only", device,
		        WORKER_STATS_FD);
		return 2;
	}
	w.stats = sp;

	char err[256];
	struct device_desc desc;
	memset(&desc, 0, sizeof(desc));
	if (id->parked) {
		/* No device and no engine: under MPS an idle context would make
		 * every other user's CUDA work wait (worker_user.h). The hello
		 * names no device; the supervisor keeps the probe's name. */
	} else if (engine == DFCCLD_ENGINE_CUDA) {
		/* A kernel loaded lazily while the daemon kernel runs would never
		 * start (measured): load every module when the context is made. */
		setenv("CUDA_MODULE_LOADING", "EAGER", 1);
		int rc = devices_open_cuda((int)device, &desc, err, sizeof(err));
		if (rc < 0) {
			log_err("worker", "device %u: %s", device, err);
			return 1;
		}
	} else {
		devices_host(&desc, 1);
		snprintf(desc.name, sizeof(desc.name), "host-emulated device %u", device);
	}
	struct engine_config ec = {
	    .device = device,
	    .sched = {.spin_head = (uint32_t)cfg->spin_head,
	              .spin_other = (uint32_t)cfg->spin_other,
	              .stick_mult = (uint32_t)cfg->stick_mult,
	              .spin_max = (uint32_t)cfg->spin_max,
	              .order = SCHED_ORDER_FIFO},
	    .stats = w.stats,
	    .reg_lookup = reg_lookup,
	    .reg_ctx = &w,
	    .algo = (uint32_t)cfg->algo,
	    .channels = (uint32_t)cfg->channels,
	    .spread_blocks = (uint32_t)cfg->spread_blocks,
	    .kernel_idle_ns = (uint64_t)cfg->kernel_idle_us * 1000u,
	    .resident_blocks = (uint32_t)cfg->resident_blocks,
	    .bulk_idle_ns = (uint64_t)cfg->bulk_idle_us * 1000u,
	    .gate = (uint32_t)cfg->launch_gate,
	    .gate_idle_ns = (uint64_t)cfg->launch_gate_idle_us * 1000u,
	    .early_take = (uint32_t)cfg->early_take,
	    .push_bytes = (uint32_t)cfg->push_bytes,
	    .ll_bytes = (uint32_t)cfg->ll_bytes,
	    .visit_bytes = (uint64_t)cfg->visit_bytes,
	    .chan_bytes = (uint64_t)cfg->chan_bytes,
	    .oneshot_bytes = (uint64_t)cfg->oneshot_bytes,
	    .max_inflight = (uint32_t)cfg->max_inflight_per_session,
	    .max_inflight_uid = (uint32_t)cfg->max_inflight_per_uid,
	};
	if (!id->parked &&
	    engine_new(engine == DFCCLD_ENGINE_CUDA ? ENGINE_CUDA : ENGINE_HOST, &ec, &w.eng, err, sizeof(err)) < 0) {
		log_err("worker", "device %u: cannot create the engine: %s", device, err);
		return 1;
	}

	w.ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	if (w.ep < 0 || epoll_ctl(w.ep, EPOLL_CTL_ADD, w.ctl, &ev) < 0) {
		log_err("worker", "device %u: epoll: %s", device, strerror(errno));
		return 1;
	}

	Dfccl__V1__WorkerHello h = DFCCL__V1__WORKER_HELLO__INIT;
	h.device = device;
	h.pid = getpid();
	h.name = desc.name;
	h.pci_bus_id = desc.pci_bus_id;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_HELLO;
	env.worker_hello = &h;
	int rc = frame_send(w.ctl, &env, NULL, 0);
	if (rc < 0) {
		log_err("worker", "device %u: cannot reach the supervisor: %s", device, strerror(-rc));
		return 1;
	}
	/* Reads are driven by epoll; a non-blocking socket keeps a spurious
	 * wake-up from blocking the engine. */
	int fl = fcntl(w.ctl, F_GETFL);
	fcntl(w.ctl, F_SETFL, fl | O_NONBLOCK);

	rc = w.eng ? run_loop(&w) : run_parked(&w);

	while (w.qps) {
		struct wqp *p = w.qps;
		w.qps = p->next;
		sq_set_engine_state(&p->q, DFCCL_ENGINE_STOPPED);
		wqp_free(&w, p);
	}
	while (w.comms)
		del_comm(&w, w.comms->comm_id, 0);
	while (w.regs)
		del_reg(&w, w.regs->r.reg_id);
	engine_free(w.eng);
	frame_reader_free(&w.rd);
	close(w.ep);
	return rc;
}
