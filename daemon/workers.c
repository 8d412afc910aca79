/*
 * See workers.h. Each worker is this binary re-executed with
 * --worker-device N; it inherits its control socket as fd 3 and the
 * device's statistics page as fd 4 (worker.h).
 *
 * What happens when a worker dies: libuv reports the exit; the supervisor
 * (which maps every queue-pair region it created) completes each entry the
 * dead worker had not completed with DEVICE_LOST, so no client waits
 * forever; it tells the communicators with a rank on the device; and it
 * starts a replacement after a back-off that doubles while deaths come
 * quickly. The replacement receives every queue pair and registration again.
 */
#include "workers.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm.h"
#include "conn.h"
#include "dfccl_stats.h"
#include "log.h"
#include "queue.h"
#include "server.h"
#include "session.h"
#include "worker.h"

#define BACKOFF_MAX_MS 5000u
#define QUICK_DEATH_MS 10000u

struct qp_rec {
	struct qp_rec *next;
	uint32_t qp_id;
	uint32_t sq_entries; /* our own copy: the client can scribble on the header */
	uint64_t session_id;
	struct worker_cred cred; /* the session's: the worker of the device runs as it in job mode */
	int memfd, efd;
	size_t size;
	struct dfccl_qp_header *hdr; /* the whole region, mapped */
};

struct reg_rec {
	struct reg_rec *next;
	uint32_t reg_id;
	uint64_t session_id;
	uid_t uid;         /* the session's: only a worker that serves this uid gets it */
	int kind;
	uint64_t size, offset;
	uint8_t ipc[64];
	size_t ipc_len;
	int fd;
};

/* A client's RegisterMem waiting for the workers' acknowledgements. */
struct reg_wait {
	struct reg_wait *next;
	uint32_t reg_id;
	uint64_t session_id;
	uint64_t request_id;
	uint64_t pending;  /* bitmask of devices yet to acknowledge */
	int code;          /* the first refusal, if any */
	char message[160];
};

/* A client's AllocMem waiting for the worker that allocates: sent to it, or
 * (sent = 0) waiting for a worker on its way up that serves the uid. */
struct alloc_wait {
	struct alloc_wait *next;
	uint32_t reg_id;
	uint32_t device;
	uint64_t session_id;
	uint64_t request_id;
	uint64_t size;
	uid_t uid;
	int sent;
};

/* W_SWITCHING: a planned stop, so that a worker of another identity
 * (worker_user.h) takes the device; its exit starts the replacement at once
 * and fails nothing, since the device has no session of the old identity.
 * The state lasts until the replacement is spawned. */
enum worker_state { W_STARTING, W_READY, W_DEAD, W_SWITCHING, W_STOPPING, W_STOPPED };

struct worker {
	struct workers *ws;
	uint32_t device;
	struct device_desc desc;
	enum worker_state state;
	uv_process_t proc;
	int proc_alive;   /* the process has not been reaped */
	int proc_handle;  /* proc is an initialised handle not yet closed */
	struct conn ctl;
	int ctl_open;
	struct worker_ident ident; /* who the process runs (or last ran) as */
	uv_timer_t timer; /* start timeout, restart back-off, stop grace */
	int pid;
	unsigned restarts;
	uint64_t started_ms;
	uint64_t backoff_ms;
	int stats_fd;
	struct dfccl_worker_stats *stats;
	struct qp_rec *qps;
	unsigned nqps;
	struct reg_rec *regs;
};

/* A communicator spanning devices, deleted: the devices whose workers have
 * still to say they released the others' memory of it, and those holding
 * memory of their own for it (workers_comm_del). */
struct comm_release {
	struct comm_release *next;
	uint64_t comm_id;
	uint64_t waiting, holders; /* bit d: device d */
};

struct workers {
	struct server *srv;
	unsigned n;
	struct worker *w;
	struct reg_wait *reg_waits;
	struct alloc_wait *alloc_waits;
	struct comm_release *releases;
	void (*stop_done)(struct server *srv);
	unsigned handles_open; /* timers, process handles and ctl polls still open */
};

static int worker_spawn(struct worker *wk);
static int worker_send_env(struct workers *w, uint32_t device, Dfccl__V1__Envelope *env, const int *fds,
                           unsigned nfds);
static void release_answer(struct workers *ws, uint64_t comm_id, uint32_t device);
static int release_clear(struct workers *ws, struct comm_release **pp, uint32_t device);
static void reg_wait_answer(struct workers *ws, uint32_t reg_id, uint32_t device, int code, const char *msg);
static void alloc_wait_answer(struct workers *ws, uint32_t device, uint32_t reg_id, int code, const char *msg, int fd,
                              uint64_t map_size);
static void worker_send_allocs(struct worker *wk);
static void worker_grace_cb(uv_timer_t *t);

static const char *engine_arg(int engine)
{
	return engine == DFCCLD_ENGINE_CUDA ? "cuda" : "host";
}

static void qp_rec_free(struct qp_rec *q)
{
	if (!q)
		return;
	if (q->hdr)
		munmap(q->hdr, q->size);
	if (q->memfd >= 0)
		close(q->memfd);
	if (q->efd >= 0)
		close(q->efd);
	free(q);
}

static void reg_rec_free(struct reg_rec *r)
{
	if (!r)
		return;
	if (r->fd >= 0)
		close(r->fd);
	free(r);
}

/* ------------------------------------------------------------ messages to a worker */

/* Whether the worker may be given what sessions of uid `owner` hold. */
static int worker_serves(const struct worker *wk, uid_t owner)
{
	return worker_user_serves(&wk->ws->srv->worker_users, &wk->ident, owner);
}

static void worker_send_qp(struct worker *wk, struct qp_rec *q)
{
	if (!worker_serves(wk, q->cred.uid))
		return;
	Dfccl__V1__WorkerAttachQp a = DFCCL__V1__WORKER_ATTACH_QP__INIT;
	a.qp_id = q->qp_id;
	a.session_id = q->session_id;
	a.region_size = q->size;
	a.uid = q->cred.uid;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_ATTACH_QP;
	env.worker_attach_qp = &a;
	int fds[2] = {q->memfd, q->efd};
	int rc = conn_send(&wk->ctl, &env, fds, 2);
	if (rc < 0)
		log_warn("worker", "device %u: cannot send queue pair %u to the worker: %s", wk->device, q->qp_id,
		         strerror(-rc));
}

/* Returns 1 when r was sent (the worker will acknowledge it), 0 when the
 * worker serves another uid, or a negative errno when it could not be sent. */
static int worker_send_reg(struct worker *wk, struct reg_rec *r)
{
	if (!worker_serves(wk, r->uid))
		return 0;
	Dfccl__V1__WorkerAddReg a = DFCCL__V1__WORKER_ADD_REG__INIT;
	a.reg_id = r->reg_id;
	a.session_id = r->session_id;
	a.kind = r->kind;
	a.size = r->size;
	a.offset = r->offset;
	a.ipc_handle.data = r->ipc;
	a.ipc_handle.len = r->ipc_len;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_ADD_REG;
	env.worker_add_reg = &a;
	int rc = conn_send(&wk->ctl, &env, r->fd >= 0 ? &r->fd : NULL, r->fd >= 0 ? 1 : 0);
	if (rc < 0)
		log_warn("worker", "device %u: cannot send registration %u to the worker: %s", wk->device, r->reg_id,
		         strerror(-rc));
	return rc < 0 ? rc : 1;
}

/* ------------------------------------------------------------ identity */

/* What the device's worker should be now, from the sessions attached to it
 * (in job mode they are all of one uid: workers_admit sees to it). */
static struct worker_ident worker_target(const struct worker *wk)
{
	return worker_user_target(&wk->ws->srv->worker_users, wk->qps ? &wk->qps->cred : NULL);
}

static void ident_describe(const struct worker_ident *id, char *buf, size_t len)
{
	snprintf(buf, len, "uid %u gid %u%s", (unsigned)id->cred.uid, (unsigned)id->cred.gid,
	         id->parked ? ", parked" : "");
}

/*
 * A worker that is not what its device needs now makes way for one that is:
 * a planned stop (SIGTERM, SIGKILL after shutdown-grace-ms) whose exit starts
 * the replacement through the restart path. Called whenever the device's
 * sessions change. The target differs from a serving worker only when no
 * session it serves is left on the device, so nothing in flight is cut off;
 * sessions that attach meanwhile wait, as they do for any worker on its way
 * up. A dead worker needs nothing (its restart spawns the right one), nor
 * one already switching or stopping.
 */
static void worker_reconcile(struct worker *wk)
{
	if (wk->state != W_READY && wk->state != W_STARTING)
		return;
	struct worker_ident want = worker_target(wk);
	if (!worker_user_differs(&wk->ident, &want))
		return;
	char have_s[64], want_s[64];
	ident_describe(&wk->ident, have_s, sizeof(have_s));
	ident_describe(&want, want_s, sizeof(want_s));
	log_info("worker", "device %u: worker %d (%s) makes way for a worker of %s", wk->device, wk->pid, have_s,
	         want_s);
	wk->state = W_SWITCHING;
	uv_process_kill(&wk->proc, SIGTERM);
	uv_timer_start(&wk->timer, worker_grace_cb, (uint64_t)wk->ws->srv->cfg.shutdown_grace_ms, 0);
}

/* ------------------------------------------------------------ death and restart */

/* Completes every entry the dead worker left behind with DEVICE_LOST. Only
 * called while no worker runs on the device, so nobody else writes the
 * engine's side of the region. */
static void qp_fail_pending(struct qp_rec *q)
{
	struct dfccl_qp_header *h = q->hdr;
	uint64_t n = q->sq_entries;
	_Atomic uint64_t *cw = (_Atomic uint64_t *)((char *)h + DFCCL_QP_CW_OFFSET(n));
	uint64_t tail = atomic_load_explicit((_Atomic uint64_t *)&h->sq_tail, memory_order_acquire);
	uint64_t head = atomic_load_explicit((_Atomic uint64_t *)&h->sq_head, memory_order_relaxed);
	if (head == 0)
		head = 1;
	/* The client can scribble on both counters. Sequence numbers live in
	 * the 48 bits of a completion word; anything beyond is forged, and a
	 * value near 2^64 would make the loop below wrap and never end. */
	if (head > DFCCL_CW_SEQ(UINT64_MAX) - n) {
		log_notice("worker", "queue pair %u: corrupt sq_head %llu; nothing to fail", q->qp_id,
		           (unsigned long long)head);
		atomic_store_explicit((_Atomic uint32_t *)&h->engine_state, DFCCL_ENGINE_DEAD, memory_order_release);
		return;
	}
	if (tail >= head + n) /* a client that lies about its tail gets a clamp */
		tail = head + n - 1;
	if (tail < head) /* nothing outstanding (or a tail moved backwards) */
		tail = head - 1;
	uint64_t failed = 0;
	for (uint64_t s = tail >= n ? tail - n + 1 : 1; s <= tail; s++) {
		uint32_t slot = DFCCL_QP_SLOT(s, n);
		uint64_t w = atomic_load_explicit(&cw[slot], memory_order_relaxed);
		if (DFCCL_CW_SEQ(w) < s) {
			atomic_store_explicit(&cw[slot], DFCCL_CW_MAKE(s, DFCCL_CQ_DEVICE_LOST), memory_order_release);
			failed++;
		}
	}
	atomic_fetch_add_explicit((_Atomic uint64_t *)&h->completed, failed, memory_order_release);
	queue_wake_waiters(h);
	atomic_store_explicit((_Atomic uint64_t *)&h->sq_head, tail + 1, memory_order_release);
	atomic_store_explicit((_Atomic uint32_t *)&h->engine_state, DFCCL_ENGINE_DEAD, memory_order_release);
	if (failed)
		log_notice("worker", "queue pair %u: %llu pending entries failed with device-lost", q->qp_id,
		           (unsigned long long)failed);
}

static void ws_handle_closed(struct workers *ws)
{
	ws->handles_open--;
	if (ws->handles_open == 0 && ws->stop_done)
		ws->stop_done(ws->srv);
}

static void worker_timer_closed(uv_handle_t *h)
{
	struct worker *wk = h->data;
	ws_handle_closed(wk->ws);
}

static void worker_ctl_closed(struct conn *c)
{
	struct worker *wk = c->owner;
	ws_handle_closed(wk->ws);
}

static void worker_close_ctl(struct worker *wk)
{
	if (!wk->ctl_open)
		return;
	wk->ctl_open = 0;
	conn_close(&wk->ctl, worker_ctl_closed);
}

static void worker_restart_cb(uv_timer_t *t)
{
	struct worker *wk = t->data;
	if (wk->state != W_DEAD && wk->state != W_SWITCHING)
		return;
	int rc = worker_spawn(wk);
	if (rc < 0) {
		log_err("worker", "device %u: cannot restart the worker: %s; retrying in %llu ms", wk->device,
		        uv_strerror(rc), (unsigned long long)wk->backoff_ms);
		uv_timer_start(&wk->timer, worker_restart_cb, wk->backoff_ms, 0);
	}
}

static void worker_proc_closed(uv_handle_t *h)
{
	struct worker *wk = h->data;
	wk->proc_handle = 0;
	ws_handle_closed(wk->ws);
}

static void worker_exit_cb(uv_process_t *p, int64_t status, int sig)
{
	struct worker *wk = p->data;
	struct workers *ws = wk->ws;
	struct server *srv = ws->srv;
	wk->proc_alive = 0;
	uv_close((uv_handle_t *)&wk->proc, worker_proc_closed);
	worker_close_ctl(wk);
	uv_timer_stop(&wk->timer);

	/* Registrations the dead worker never acknowledged stay recorded and go
	 * to its replacement; their clients need not wait for that. */
	for (struct reg_rec *r = wk->regs; r; r = r->next)
		reg_wait_answer(ws, r->reg_id, wk->device, 0, "");
	/* Its mappings and its memory went with it. */
	for (struct comm_release **pp = &ws->releases; *pp;) {
		struct comm_release *r = *pp;
		uint64_t bit = wk->device < 64 ? 1ull << wk->device : 0;
		if (!(r->holders & bit)) {
			pp = &r->next;
			continue;
		}
		r->holders &= ~bit;
		if (!release_clear(ws, pp, wk->device))
			pp = &r->next; /* still waiting for others */
	}
	/* Allocations it never answered are gone with it. Those that wait for
	 * a worker serving their uid go to the replacement of a planned exit. */
	for (struct alloc_wait *a = ws->alloc_waits, *next; a; a = next) {
		next = a->next;
		if (a->device == wk->device && (a->sent || wk->state != W_SWITCHING))
			alloc_wait_answer(ws, a->device, a->reg_id, DFCCL__V1__ERROR_CODE__ERROR_DEVICE_LOST,
			                  "the device's worker died before the allocation completed; try again", -1, 0);
	}

	if (wk->state == W_SWITCHING) {
		/* Planned: the queue pairs on the device belong to sessions the
		 * leaving worker never served, so none of their entries fails;
		 * the replacement takes them. */
		struct worker_ident want = worker_target(wk);
		char want_s[64];
		ident_describe(&want, want_s, sizeof(want_s));
		log_info("worker", "device %u: worker %d exited; starting a worker of %s", wk->device, wk->pid, want_s);
		if (wk->backoff_ms < (uint64_t)srv->cfg.worker_restart_delay_ms)
			wk->backoff_ms = (uint64_t)srv->cfg.worker_restart_delay_ms;
		uv_timer_start(&wk->timer, worker_restart_cb, 0, 0);
		return;
	}
	for (struct qp_rec *q = wk->qps; q; q = q->next)
		qp_fail_pending(q);

	if (wk->state == W_STOPPING) {
		log_info("worker", "device %u: worker %d exited", wk->device, wk->pid);
		wk->state = W_STOPPED;
		uv_close((uv_handle_t *)&wk->timer, worker_timer_closed);
		return;
	}
	if (sig)
		log_err("worker", "device %u: worker %d killed by signal %d; its collectives fail, restarting it",
		        wk->device, wk->pid, sig);
	else
		log_err("worker", "device %u: worker %d exited with status %lld; its collectives fail, restarting it",
		        wk->device, wk->pid, (long long)status);
	wk->state = W_DEAD;
	comm_device_lost(srv, wk->device);

	uint64_t lived = server_now_ms() - wk->started_ms;
	uint64_t base = (uint64_t)srv->cfg.worker_restart_delay_ms;
	if (lived < QUICK_DEATH_MS && wk->restarts > 0)
		wk->backoff_ms = wk->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : wk->backoff_ms * 2;
	else
		wk->backoff_ms = base;
	if (wk->backoff_ms < base)
		wk->backoff_ms = base;
	wk->restarts++;
	uv_timer_start(&wk->timer, worker_restart_cb, wk->backoff_ms, 0);
}

static void worker_start_timeout_cb(uv_timer_t *t)
{
	struct worker *wk = t->data;
	if (wk->state != W_STARTING || !wk->proc_alive)
		return;
	const struct worker_user_policy *pol = &wk->ws->srv->worker_users;
	log_err("worker", "device %u: worker %d did not report ready in %lld ms; killing it%s", wk->device, wk->pid,
	        (long long)wk->ws->srv->cfg.worker_start_timeout_ms,
	        pol->mps && pol->job ? " (under MPS a worker waits in CUDA initialisation while processes of another "
	                               "uid still use the GPUs)"
	                             : "");
	uv_process_kill(&wk->proc, SIGKILL);
}

/* ------------------------------------------------------------ the control channel */

static void reg_rec_remove(struct worker *wk, uint32_t reg_id)
{
	for (struct reg_rec **pp = &wk->regs; *pp; pp = &(*pp)->next) {
		if ((*pp)->reg_id == reg_id) {
			struct reg_rec *r = *pp;
			*pp = r->next;
			reg_rec_free(r);
			return;
		}
	}
}

/* Device `device` acknowledged (code 0), refused, or died before answering
 * (code 0: its replacement gets the registration). Answers the client once
 * every device has. */
static void reg_wait_answer(struct workers *ws, uint32_t reg_id, uint32_t device, int code, const char *msg)
{
	for (struct reg_wait **pp = &ws->reg_waits; *pp; pp = &(*pp)->next) {
		struct reg_wait *rw = *pp;
		if (rw->reg_id != reg_id || !(rw->pending & (1ull << device)))
			continue;
		rw->pending &= ~(1ull << device);
		if (code && !rw->code) {
			rw->code = code;
			snprintf(rw->message, sizeof(rw->message), "%s", msg ? msg : "");
		}
		if (rw->pending)
			return;
		*pp = rw->next;
		if (rw->code) {
			log_warn("worker", "registration %u refused: %s", rw->reg_id, rw->message);
			workers_del_reg_all(ws, rw->reg_id);
		}
		session_reg_done(ws->srv, rw->session_id, rw->request_id, rw->reg_id, rw->code, rw->message);
		free(rw);
		return;
	}
	/* Not waited for: a registration re-sent to a replacement worker, or
	 * one the session dropped before the answer came. */
}

/* The worker of `device` allocated registration reg_id's memory (code 0,
 * fd: its descriptor, which this call takes) or could not. A descriptor
 * nobody waits for any more is closed, and the worker is told to let go
 * of the allocation. */
static void alloc_wait_answer(struct workers *ws, uint32_t device, uint32_t reg_id, int code, const char *msg, int fd,
                              uint64_t map_size)
{
	for (struct alloc_wait **pp = &ws->alloc_waits; *pp; pp = &(*pp)->next) {
		struct alloc_wait *a = *pp;
		if (a->reg_id != reg_id || a->device != device)
			continue;
		*pp = a->next;
		session_alloc_done(ws->srv, a->session_id, a->request_id, reg_id, device, code, msg, fd, map_size);
		free(a);
		return;
	}
	log_warn("worker", "device %u: an allocation for registration %u that nobody asked for", device, reg_id);
	if (fd >= 0) {
		close(fd);
		workers_del_reg(ws, device, reg_id);
	}
}

/* WorkerAllocDone: exactly one descriptor on success, none otherwise. */
static void worker_alloc_done(struct worker *wk, const Dfccl__V1__WorkerAllocDone *d, int *fds, unsigned nfds)
{
	int code = d->code, fd = -1;
	const char *msg = d->message;
	if (code == DFCCL__V1__ERROR_CODE__ERROR_NONE && nfds == 1) {
		fd = fds[0];
		fds[0] = -1;
	} else if (code == DFCCL__V1__ERROR_CODE__ERROR_NONE) {
		code = DFCCL__V1__ERROR_CODE__ERROR_INTERNAL;
		msg = "the device's worker answered the allocation without its descriptor";
		log_err("worker", "device %u: %s", wk->device, msg);
	}
	alloc_wait_answer(wk->ws, wk->device, d->reg_id, code, msg && *msg ? msg : "the device's worker cannot allocate",
	                  fd, d->map_size);
}

static void worker_on_frame(struct conn *c, dfccl_envelope *env, int *fds, unsigned nfds)
{
	struct worker *wk = c->owner;
	if (env && env->body_case == DFCCL__V1__ENVELOPE__BODY_WORKER_ALLOC_DONE)
		worker_alloc_done(wk, env->worker_alloc_done, fds, nfds);
	frame_close_fds(fds, nfds);
	if (!env) {
		log_warn("worker", "device %u: malformed frame from the worker", wk->device);
		return;
	}
	if (env->body_case == DFCCL__V1__ENVELOPE__BODY_WORKER_HELLO && wk->state == W_STARTING) {
		const Dfccl__V1__WorkerHello *h = env->worker_hello;
		if (h->name && *h->name)
			snprintf(wk->desc.name, sizeof(wk->desc.name), "%s", h->name);
		if (h->pci_bus_id && *h->pci_bus_id)
			snprintf(wk->desc.pci_bus_id, sizeof(wk->desc.pci_bus_id), "%s", h->pci_bus_id);
		wk->state = W_READY;
		uv_timer_stop(&wk->timer);
		log_info("worker", "device %u: worker %d ready (%s%s%s)", wk->device, wk->pid, wk->desc.name,
		         wk->desc.pci_bus_id[0] ? ", " : "", wk->desc.pci_bus_id);
		/* Only what its identity serves (worker_send_*). The
		 * registrations before the queue pairs: a queue pair reads as
		 * served once its worker has it, and an entry taken before the
		 * buffers it names were mapped would fail with
		 * DFCCL_CQ_BAD_REG (or leave a stream waiting on a device
		 * completion word that could not be found). */
		for (struct reg_rec *r = wk->regs; r; r = r->next)
			worker_send_reg(wk, r);
		worker_send_allocs(wk);
		for (struct qp_rec *q = wk->qps; q; q = q->next)
			worker_send_qp(wk, q);
		comm_worker_up(wk->ws->srv, wk->device);
	} else if (env->body_case == DFCCL__V1__ENVELOPE__BODY_WORKER_REG_ACK) {
		reg_wait_answer(wk->ws, env->worker_reg_ack->reg_id, wk->device, env->worker_reg_ack->code,
		                env->worker_reg_ack->message);
	} else if (env->body_case == DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ACK) {
		const Dfccl__V1__WorkerCommAck *a = env->worker_comm_ack;
		comm_worker_acked(wk->ws->srv, a->comm_id, wk->device, a->code, a->message, a->peer_blob.data,
		                  a->peer_blob.len);
	} else if (env->body_case == DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_RELEASED) {
		release_answer(wk->ws, env->worker_comm_released->comm_id, wk->device);
	} else if (env->body_case != DFCCL__V1__ENVELOPE__BODY_WORKER_ALLOC_DONE) {
		log_warn("worker", "device %u: unexpected message %d from the worker", wk->device, (int)env->body_case);
	}
	frame_envelope_free(env);
}

static void worker_ctl_lost_cb(uv_timer_t *t)
{
	struct worker *wk = t->data;
	if (wk->proc_alive && wk->state != W_STOPPING) {
		log_warn("worker", "device %u: worker %d closed its control channel but did not exit; killing it",
		         wk->device, wk->pid);
		uv_process_kill(&wk->proc, SIGKILL);
	}
}

static void worker_on_end(struct conn *c, int err)
{
	struct worker *wk = c->owner;
	/* The worker closed its end: it is exiting (the exit callback follows
	 * and does the rest) or broken, in which case it is killed if it has
	 * not exited a moment later. */
	int told_to_exit = wk->state == W_STOPPING || wk->state == W_SWITCHING;
	/* One told to exit may leave unread what was sent before it was told;
	 * the socket then fails, and that is no news. */
	if (err && !told_to_exit)
		log_warn("worker", "device %u: control channel failed: %s", wk->device, strerror(-err));
	if (wk->proc_alive && !told_to_exit)
		uv_timer_start(&wk->timer, worker_ctl_lost_cb, 1000, 0);
	worker_close_ctl(wk);
}

static int worker_spawn(struct worker *wk)
{
	struct server *srv = wk->ws->srv;
	/* The worker reads its settings through the same table: pass the
	 * ones it uses by name (config_worker_settings). The engine is the
	 * resolved one, never auto. */
	size_t npassed;
	const char *const *passed = config_worker_settings(&npassed);
	enum { NPASSED = 32 };
	if (npassed > NPASSED)
		return -E2BIG;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	char devbuf[16], uidbuf[16], gidbuf[16], values[NPASSED][64], flags[NPASSED][32];
	snprintf(devbuf, sizeof(devbuf), "%u", wk->device);
	char *args[12 + 2 * NPASSED];
	int argc = 0;
	args[argc++] = (char *)srv->exe_path;
	args[argc++] = "--worker-device";
	args[argc++] = devbuf;
	args[argc++] = "--engine";
	args[argc++] = (char *)engine_arg(srv->engine);
	/* Who it is to be (worker.h): the worker drops to another uid itself,
	 * first thing, and checks the result. */
	wk->ident = worker_target(wk);
	if (wk->ident.cred.uid != srv->worker_users.self_uid) {
		snprintf(uidbuf, sizeof(uidbuf), "%u", (unsigned)wk->ident.cred.uid);
		snprintf(gidbuf, sizeof(gidbuf), "%u", (unsigned)wk->ident.cred.gid);
		args[argc++] = "--worker-uid";
		args[argc++] = uidbuf;
		args[argc++] = "--worker-gid";
		args[argc++] = gidbuf;
	}
	if (wk->ident.parked) {
		args[argc++] = "--worker-parked";
		args[argc++] = "1";
	}
	for (size_t i = 0; i < npassed; i++) {
		snprintf(flags[i], sizeof(flags[i]), "--%s", passed[i]);
		/* Under MPS (the supervisor's probe says) a setting with an MPS
		 * twin passes the twin's value. */
		const char *from = srv->mps_active ? config_mps_twin(passed[i]) : passed[i];
		config_format(&srv->cfg, from, values[i], sizeof(values[i]));
		args[argc++] = flags[i];
		args[argc++] = values[i];
	}
	args[argc] = NULL;
	uv_stdio_container_t stdio[WORKER_STATS_FD + 1];
	stdio[0].flags = UV_IGNORE;
	stdio[1].flags = UV_INHERIT_FD;
	stdio[1].data.fd = 1;
	stdio[2].flags = UV_INHERIT_FD;
	stdio[2].data.fd = 2;
	stdio[WORKER_CTL_FD].flags = UV_INHERIT_FD;
	stdio[WORKER_CTL_FD].data.fd = sv[1];
	stdio[WORKER_STATS_FD].flags = UV_INHERIT_FD;
	stdio[WORKER_STATS_FD].data.fd = wk->stats_fd;
	uv_process_options_t opts;
	memset(&opts, 0, sizeof(opts));
	opts.exit_cb = worker_exit_cb;
	opts.file = srv->exe_path;
	opts.args = args;
	opts.stdio_count = WORKER_STATS_FD + 1;
	opts.stdio = stdio;
	wk->proc.data = wk;
	int rc = uv_spawn(srv->loop, &wk->proc, &opts);
	close(sv[1]);
	if (rc < 0) {
		close(sv[0]);
		/* uv_spawn initialises the handle even when it fails: close it. */
		wk->proc_handle = 1;
		wk->ws->handles_open++;
		uv_close((uv_handle_t *)&wk->proc, worker_proc_closed);
		return rc;
	}
	wk->proc_handle = 1;
	wk->proc_alive = 1;
	wk->ws->handles_open++;
	wk->pid = wk->proc.pid;
	wk->started_ms = server_now_ms();
	rc = conn_init(&wk->ctl, srv->loop, sv[0], wk, worker_on_frame, worker_on_end);
	if (rc < 0) {
		close(sv[0]);
		uv_process_kill(&wk->proc, SIGKILL);
		return 0; /* the exit callback restarts it */
	}
	wk->ctl_open = 1;
	wk->ws->handles_open++;
	wk->state = W_STARTING;
	uv_timer_start(&wk->timer, worker_start_timeout_cb, (uint64_t)srv->cfg.worker_start_timeout_ms, 0);
	char id_s[64];
	ident_describe(&wk->ident, id_s, sizeof(id_s));
	log_info("worker", "device %u: started worker %d (%s engine, %s)", wk->device, wk->pid, engine_arg(srv->engine),
	         id_s);
	return 0;
}

/* ------------------------------------------------------------ public */

static int stats_page_create(uint32_t device, struct dfccl_worker_stats **map)
{
	int fd = memfd_create("dfccl-stats", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, DFCCL_STATS_SIZE) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	void *p = mmap(NULL, DFCCL_STATS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		close(fd);
		return -e;
	}
	struct dfccl_worker_stats *s = p;
	s->magic = DFCCL_STATS_MAGIC;
	s->device = device;
	*map = s;
	return fd;
}

int workers_new(struct server *srv, const struct device_desc *devs, unsigned ndevices, struct workers **out)
{
	struct workers *ws = calloc(1, sizeof(*ws));
	if (!ws)
		return -ENOMEM;
	ws->srv = srv;
	ws->n = ndevices;
	ws->w = calloc(ndevices ? ndevices : 1, sizeof(*ws->w));
	if (!ws->w) {
		free(ws);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < ndevices; i++) {
		struct worker *wk = &ws->w[i];
		wk->ws = ws;
		wk->device = i;
		wk->desc = devs[i];
		wk->state = W_DEAD;
		wk->stats_fd = -1;
		uv_timer_init(srv->loop, &wk->timer);
		wk->timer.data = wk;
		ws->handles_open++;
		int fd = stats_page_create(i, &wk->stats);
		if (fd < 0) {
			log_err("worker", "device %u: cannot create the statistics page: %s", i, strerror(-fd));
			*out = ws;
			return fd;
		}
		wk->stats_fd = fd;
	}
	*out = ws;
	for (unsigned i = 0; i < ndevices; i++) {
		int rc = worker_spawn(&ws->w[i]);
		if (rc < 0) {
			log_err("worker", "device %u: cannot start a worker: %s", i, uv_strerror(rc));
			return rc;
		}
	}
	return 0;
}

unsigned workers_ndevices(const struct workers *w)
{
	return w ? w->n : 0;
}

int workers_device_up(const struct workers *w, uint32_t device)
{
	if (!w || device >= w->n)
		return -1;
	switch (w->w[device].state) {
	case W_READY: return 1;
	case W_STARTING:
	case W_SWITCHING:
	case W_DEAD: return 0;
	default: return -1;
	}
}

/* The word for a worker's state in the stats reply (dfccl.proto,
 * DeviceStats.worker_state). */
static const char *worker_state_name(const struct worker *wk)
{
	switch (wk->state) {
	case W_READY: return wk->ident.parked ? "parked" : "up";
	case W_STARTING: return "starting";
	case W_SWITCHING: return "switching";
	case W_DEAD: return "dead";
	case W_STOPPING: return "stopping";
	default: return "stopped";
	}
}

unsigned workers_ready_count(const struct workers *w)
{
	unsigned n = 0;
	for (unsigned i = 0; w && i < w->n; i++)
		n += w->w[i].state == W_READY;
	return n;
}

static struct qp_rec *qp_find(struct worker *wk, uint32_t qp_id)
{
	for (struct qp_rec *q = wk->qps; q; q = q->next)
		if (q->qp_id == qp_id)
			return q;
	return NULL;
}

int workers_admit(struct workers *w, uid_t uid, uint32_t device, char *err, size_t errlen)
{
	if (!w)
		return 0;
	const struct worker_cred *holder = NULL;
	for (unsigned d = 0; d < w->n && !holder; d++)
		if (w->w[d].qps)
			holder = &w->w[d].qps->cred;
	return worker_user_admit(&w->srv->worker_users, holder, uid, device, err, errlen);
}

int workers_attach_qp(struct workers *w, uint32_t device, uint64_t session_id, uid_t uid, gid_t gid,
                      uint32_t sq_entries, uint32_t *qp_id, int *memfd, int *efd, size_t *size)
{
	if (!w)
		return -ENODEV;
	if (device >= w->n)
		return -ENODEV;
	struct worker *wk = &w->w[device];
	struct qp_rec *q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->memfd = q->efd = -1;
	q->qp_id = ++w->srv->next_qp_id;
	q->session_id = session_id;
	q->cred.uid = uid;
	q->cred.gid = gid;
	q->sq_entries = sq_entries;
	int rc = queue_region_create(q->qp_id, device, sq_entries, &q->size);
	if (rc < 0)
		goto fail;
	q->memfd = rc;
	q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (q->efd < 0) {
		rc = -errno;
		goto fail;
	}
	void *p = mmap(NULL, q->size, PROT_READ | PROT_WRITE, MAP_SHARED, q->memfd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		goto fail;
	}
	q->hdr = p;
	q->next = wk->qps;
	wk->qps = q;
	wk->nqps++;
	/* The first session of a uid on the device: its worker may have to
	 * make way for one of that uid before it sees the queue pair. */
	worker_reconcile(wk);
	/* A queue pair created while the worker is dead (a fault) reads as dead
	 * until the replacement takes it. One created while a worker is on its
	 * way (starting, or replacing one of another identity) reads as not
	 * started yet: entries armed meanwhile wait for it. */
	if (wk->state == W_DEAD)
		q->hdr->engine_state = DFCCL_ENGINE_DEAD;
	if (wk->state == W_READY)
		worker_send_qp(wk, q);
	*qp_id = q->qp_id;
	*memfd = q->memfd;
	*efd = q->efd;
	*size = q->size;
	return 0;
fail:
	qp_rec_free(q);
	return rc;
}

int workers_qp_fds(struct workers *w, uint32_t device, uint32_t qp_id, int *memfd, int *efd, size_t *size)
{
	if (!w)
		return -ENODEV;
	if (device >= w->n)
		return -ENODEV;
	struct qp_rec *q = qp_find(&w->w[device], qp_id);
	if (!q)
		return -ENOENT;
	*memfd = q->memfd;
	*efd = q->efd;
	*size = q->size;
	return 0;
}

int workers_qp_view(struct workers *w, uint32_t device, uint32_t qp_id, struct dfccl_qp_header **hdr,
                    uint32_t *entries)
{
	struct qp_rec *q = w && device < w->n ? qp_find(&w->w[device], qp_id) : NULL;
	if (!q)
		return -ENOENT;
	*hdr = q->hdr;
	*entries = q->sq_entries;
	return 0;
}

void workers_detach_qp(struct workers *w, uint32_t device, uint32_t qp_id)
{
	if (!w)
		return;
	if (device >= w->n)
		return;
	struct worker *wk = &w->w[device];
	for (struct qp_rec **pp = &wk->qps; *pp; pp = &(*pp)->next) {
		struct qp_rec *q = *pp;
		if (q->qp_id != qp_id)
			continue;
		*pp = q->next;
		wk->nqps--;
		atomic_store_explicit((_Atomic uint32_t *)&q->hdr->qp_state, DFCCL_QP_CLOSED, memory_order_release);
		Dfccl__V1__WorkerDetachQp d = DFCCL__V1__WORKER_DETACH_QP__INIT;
		d.qp_id = qp_id;
		Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_DETACH_QP;
		env.worker_detach_qp = &d;
		worker_send_env(w, device, &env, NULL, 0);
		qp_rec_free(q);
		/* The last session of a uid left: the device goes back to a
		 * worker of the daemon's own uid. */
		worker_reconcile(wk);
		return;
	}
}

/* Records registration r on one worker and sends it if that worker is up.
 * Returns 1 when the worker was sent r (its answer completes the
 * registration), 0 when it is not running or serves another uid (it gets r
 * when a worker that serves the uid is ready), or a negative errno when r
 * could not be sent (r is then not kept: the channel ends and the worker is
 * restarted, but the client must hear of it now). */
static int worker_add_reg_rec(struct worker *wk, struct reg_rec *r)
{
	int sent = 0;
	if (wk->state == W_READY) {
		sent = worker_send_reg(wk, r);
		if (sent < 0) {
			reg_rec_free(r);
			return sent;
		}
	}
	r->next = wk->regs;
	wk->regs = r;
	return sent;
}

int workers_add_reg(struct workers *w, uint32_t reg_id, uint64_t session_id, uid_t uid, int kind, uint64_t size,
                    uint64_t offset, const uint8_t *ipc_handle, size_t ipc_len, int fd, uint64_t request_id)
{
	if (!w || w->n == 0)
		return -ENODEV;
	if (ipc_len > sizeof(((struct reg_rec *)0)->ipc))
		return -EINVAL;
	struct reg_wait *rw = calloc(1, sizeof(*rw));
	if (!rw)
		return -ENOMEM;
	rw->reg_id = reg_id;
	rw->session_id = session_id;
	rw->request_id = request_id;
	for (unsigned d = 0; d < w->n; d++) {
		struct reg_rec *r = calloc(1, sizeof(*r));
		int e = 0;
		if (!r)
			e = ENOMEM;
		else if (fd >= 0 && (r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0)
			e = errno;
		if (e) {
			free(r);
			for (unsigned u = 0; u < d; u++)
				workers_del_reg(w, u, reg_id);
			free(rw);
			return -e;
		}
		if (fd < 0)
			r->fd = -1;
		r->reg_id = reg_id;
		r->session_id = session_id;
		r->uid = uid;
		r->kind = kind;
		r->size = size;
		r->offset = offset;
		if (ipc_len)
			memcpy(r->ipc, ipc_handle, ipc_len);
		r->ipc_len = ipc_len;
		int sent = worker_add_reg_rec(&w->w[d], r);
		if (sent < 0) {
			for (unsigned u = 0; u < d; u++)
				workers_del_reg(w, u, reg_id);
			free(rw);
			return sent;
		}
		if (sent)
			rw->pending |= 1ull << d;
	}
	if (!rw->pending) {
		free(rw);
		return 1;
	}
	rw->next = w->reg_waits;
	w->reg_waits = rw;
	return 0;
}

/* Sends allocation a to its device's worker, which is ready and serves a's
 * uid. Returns 0 or a negative errno. */
static int alloc_wait_send(struct workers *w, struct alloc_wait *a)
{
	Dfccl__V1__WorkerAllocMem m = DFCCL__V1__WORKER_ALLOC_MEM__INIT;
	m.reg_id = a->reg_id;
	m.size = a->size;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_ALLOC_MEM;
	env.worker_alloc_mem = &m;
	int rc = worker_send_env(w, a->device, &env, NULL, 0);
	a->sent = rc == 0;
	return rc;
}

/* A worker said hello: the allocations waiting for it go now, or fail when
 * it serves another uid. */
static void worker_send_allocs(struct worker *wk)
{
	struct workers *ws = wk->ws;
	for (struct alloc_wait *a = ws->alloc_waits, *next; a; a = next) {
		next = a->next;
		if (a->device != wk->device || a->sent)
			continue;
		if (!worker_serves(wk, a->uid))
			alloc_wait_answer(ws, a->device, a->reg_id, DFCCL__V1__ERROR_CODE__ERROR_PERMISSION,
			                  "the device's worker runs as another user; allocate after attaching", -1, 0);
		else if (alloc_wait_send(ws, a) < 0)
			alloc_wait_answer(ws, a->device, a->reg_id, DFCCL__V1__ERROR_CODE__ERROR_DEVICE_LOST,
			                  "cannot reach the device's worker; try again", -1, 0);
	}
}

int workers_alloc_mem(struct workers *w, uint32_t device, uid_t uid, uint32_t reg_id, uint64_t session_id,
                      uint64_t request_id, uint64_t size)
{
	if (!w || device >= w->n)
		return -ENODEV;
	struct worker *wk = &w->w[device];
	/* A worker on its way up (starting, or replacing one of another
	 * identity) gets it when it is ready; one that died fails it now. */
	int now = wk->state == W_READY && worker_serves(wk, uid);
	if (!now && wk->state != W_STARTING && wk->state != W_SWITCHING)
		return -ENODEV;
	struct alloc_wait *a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->reg_id = reg_id;
	a->device = device;
	a->session_id = session_id;
	a->request_id = request_id;
	a->size = size;
	a->uid = uid;
	int rc = now ? alloc_wait_send(w, a) : 0;
	if (rc < 0) {
		free(a);
		return rc;
	}
	a->next = w->alloc_waits;
	w->alloc_waits = a;
	return 0;
}

void workers_del_reg(struct workers *w, uint32_t device, uint32_t reg_id)
{
	if (!w || device >= w->n)
		return;
	reg_rec_remove(&w->w[device], reg_id);
	Dfccl__V1__WorkerDelReg d = DFCCL__V1__WORKER_DEL_REG__INIT;
	d.reg_id = reg_id;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_DEL_REG;
	env.worker_del_reg = &d;
	worker_send_env(w, device, &env, NULL, 0);
}

void workers_del_reg_all(struct workers *w, uint32_t reg_id)
{
	for (unsigned d = 0; w && d < w->n; d++)
		for (struct reg_rec *r = w->w[d].regs; r; r = r->next)
			if (r->reg_id == reg_id) {
				workers_del_reg(w, d, reg_id);
				break;
			}
}

/* ------------------------------------------------------------ communicators */

/* Sends env to the worker of `device` if it is serving; a worker that is
 * not gets everything it needs when it says hello. */
static int worker_send_env(struct workers *w, uint32_t device, Dfccl__V1__Envelope *env, const int *fds,
                           unsigned nfds)
{
	if (!w || device >= w->n || w->w[device].state != W_READY)
		return -ENODEV;
	return conn_send(&w->w[device].ctl, env, fds, nfds);
}

int workers_comm_add(struct workers *w, uint32_t device, uint64_t comm_id, uint32_t nranks,
                     const Dfccl__V1__CommRank **members, int region_fd, size_t region_size)
{
	Dfccl__V1__WorkerCommAdd a = DFCCL__V1__WORKER_COMM_ADD__INIT;
	a.comm_id = comm_id;
	a.nranks = nranks;
	a.n_members = nranks;
	a.members = (Dfccl__V1__CommRank **)members;
	a.region_size = region_size;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ADD;
	env.worker_comm_add = &a;
	return worker_send_env(w, device, &env, &region_fd, 1);
}

int workers_comm_peers(struct workers *w, uint32_t device, uint64_t comm_id, const struct comm_blob *peers,
                       size_t n)
{
	/* The pointer array and the records in one block. */
	void *block = calloc(n ? n : 1, sizeof(Dfccl__V1__PeerBlob *) + sizeof(Dfccl__V1__PeerBlob));
	if (!block)
		return -ENOMEM;
	Dfccl__V1__PeerBlob **ptrs = block;
	Dfccl__V1__PeerBlob *recs = (Dfccl__V1__PeerBlob *)(ptrs + (n ? n : 1));
	Dfccl__V1__WorkerCommPeers m = DFCCL__V1__WORKER_COMM_PEERS__INIT;
	m.comm_id = comm_id;
	m.peers = ptrs;
	for (size_t i = 0; i < n; i++) {
		if (peers[i].device == device)
			continue;
		Dfccl__V1__PeerBlob *b = &recs[m.n_peers];
		dfccl__v1__peer_blob__init(b);
		b->device = peers[i].device;
		b->blob.data = peers[i].data;
		b->blob.len = peers[i].len;
		ptrs[m.n_peers++] = b;
	}
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_PEERS;
	env.worker_comm_peers = &m;
	int rc = worker_send_env(w, device, &env, NULL, 0);
	free(block);
	return rc;
}

void workers_comm_abort(struct workers *w, uint32_t device, uint64_t comm_id, uint32_t status)
{
	Dfccl__V1__WorkerCommAbort a = DFCCL__V1__WORKER_COMM_ABORT__INIT;
	a.comm_id = comm_id;
	a.status = status;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ABORT;
	env.worker_comm_abort = &a;
	worker_send_env(w, device, &env, NULL, 0);
}

static int comm_del_send(struct workers *w, uint32_t device, uint64_t comm_id, int await_free)
{
	Dfccl__V1__WorkerCommDel a = DFCCL__V1__WORKER_COMM_DEL__INIT;
	a.comm_id = comm_id;
	a.await_free = await_free;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_DEL;
	env.worker_comm_del = &a;
	return worker_send_env(w, device, &env, NULL, 0);
}

void workers_comm_del(struct workers *w, uint64_t devices, uint64_t comm_id)
{
	/* One device: nobody else maps its memory of the communicator. */
	struct comm_release *r = NULL;
	if (devices & (devices - 1)) {
		r = calloc(1, sizeof(*r));
		if (!r)
			log_warn("worker", "communicator %llu: out of memory; its workers free their memory of it at once",
			         (unsigned long long)comm_id);
	}
	for (uint32_t d = 0; d < 64; d++) {
		if (!(devices & (1ull << d)))
			continue;
		if (comm_del_send(w, d, comm_id, r != NULL) == 0) {
			if (r)
				r->waiting |= 1ull << d;
		} else if (r && d < w->n && w->w[d].proc_alive && w->w[d].state != W_STARTING) {
			/* Alive but not taking messages (switching uid, stopping,
			 * its channel closed), its mappings still there: its exit
			 * releases them (worker_exit_cb). */
			r->waiting |= 1ull << d;
		}
	}
	if (!r)
		return;
	if (!r->waiting) {
		free(r);
		return;
	}
	r->comm_id = comm_id;
	r->holders = r->waiting;
	r->next = w->releases;
	w->releases = r;
}

unsigned workers_comm_releases(const struct workers *w)
{
	unsigned n = 0;
	for (const struct comm_release *r = w ? w->releases : NULL; r; r = r->next)
		n++;
	return n;
}

/* Device `device` let go of the other workers' memory of the record at
 * *pp (its WorkerCommReleased, or its death): once every one did, each
 * holder frees its own, and the record goes (unlinked from *pp): returns
 * 1 then, else 0. */
static int release_clear(struct workers *ws, struct comm_release **pp, uint32_t device)
{
	struct comm_release *r = *pp;
	if (device < 64)
		r->waiting &= ~(1ull << device);
	if (r->waiting)
		return 0;
	*pp = r->next;
	log_debug("worker", "communicator %llu: every worker released the others' memory of it; freeing",
	          (unsigned long long)r->comm_id);
	Dfccl__V1__WorkerCommFree f = DFCCL__V1__WORKER_COMM_FREE__INIT;
	f.comm_id = r->comm_id;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_FREE;
	env.worker_comm_free = &f;
	for (uint32_t d = 0; d < 64; d++)
		if (r->holders & (1ull << d))
			worker_send_env(ws, d, &env, NULL, 0);
	free(r);
	return 1;
}

/* WorkerCommReleased from the worker of `device`. */
static void release_answer(struct workers *ws, uint64_t comm_id, uint32_t device)
{
	for (struct comm_release **pp = &ws->releases; *pp; pp = &(*pp)->next) {
		if ((*pp)->comm_id == comm_id) {
			release_clear(ws, pp, device);
			return;
		}
	}
	log_debug("worker", "device %u: released communicator %llu, which awaits no release", device,
	          (unsigned long long)comm_id);
}

static uint64_t load64(const uint64_t *p)
{
	return atomic_load_explicit((_Atomic uint64_t *)p, memory_order_relaxed);
}

uint64_t workers_preemptions(struct workers *w, uint32_t device)
{
	if (!w || device >= w->n || !w->w[device].stats)
		return 0;
	return load64(&w->w[device].stats->preemptions);
}

int workers_fill_status(struct workers *w, Dfccl__V1__StatusInfo *st)
{
	if (!w)
		return 0;
	st->devices = calloc(w->n ? w->n : 1, sizeof(*st->devices));
	if (!st->devices)
		return -ENOMEM;
	for (unsigned i = 0; i < w->n; i++) {
		struct worker *wk = &w->w[i];
		Dfccl__V1__DeviceInfo *d = calloc(1, sizeof(*d));
		if (!d)
			return -ENOMEM;
		dfccl__v1__device_info__init(d);
		st->devices[st->n_devices++] = d;
		d->index = i;
		d->name = wk->desc.name;
		d->pci_bus_id = wk->desc.pci_bus_id;
		d->worker_up = wk->state == W_READY;
		d->worker_pid = wk->proc_alive ? wk->pid : 0;
		d->worker_restarts = wk->restarts;
		d->queue_pairs = wk->nqps;
		d->worker_uid = (uint32_t)wk->ident.cred.uid;
		d->worker_gid = (uint32_t)wk->ident.cred.gid;
		d->worker_parked = wk->ident.parked;
	}
	return 0;
}

/* A reply's copy of n counters of the statistics page (none when n is 0). */
static int counters_copy(uint64_t **out, size_t *nout, const uint64_t *page, unsigned n)
{
	if (n == 0)
		return 0;
	*out = calloc(n, sizeof(**out));
	if (!*out)
		return -ENOMEM;
	*nout = n;
	for (unsigned k = 0; k < n; k++)
		(*out)[k] = load64(&page[k]);
	return 0;
}

int workers_fill_stats(struct workers *w, Dfccl__V1__QueryReply *r)
{
	if (!w)
		return 0;
	r->stats = calloc(w->n ? w->n : 1, sizeof(*r->stats));
	if (!r->stats)
		return -ENOMEM;
	for (unsigned i = 0; i < w->n; i++) {
		struct worker *wk = &w->w[i];
		Dfccl__V1__DeviceStats *d = calloc(1, sizeof(*d));
		if (!d)
			return -ENOMEM;
		dfccl__v1__device_stats__init(d);
		r->stats[r->n_stats++] = d;
		d->device = i;
		d->completed = load64(&wk->stats->completed);
		d->errors = load64(&wk->stats->errors);
		d->preemptions = load64(&wk->stats->preemptions);
		d->context_switches = load64(&wk->stats->context_switches);
		d->spins = load64(&wk->stats->spins);
		d->queue_pairs = wk->nqps;
		d->worker_up = wk->state == W_READY;
		d->worker_state = (char *)worker_state_name(wk);
		d->kernel_launches = load64(&wk->stats->kernel_launches);
		d->kernel_quits = load64(&wk->stats->kernel_quits);
		d->kernel_gated = load64(&wk->stats->kernel_gated);
		d->early_taken = load64(&wk->stats->early_taken);
		d->early_given_back = load64(&wk->stats->early_given_back);
		/* Per block, up to the last that completed anything (none on
		 * the host engine). */
		unsigned nb = 0;
		for (unsigned b = 0; b < DFCCL_STATS_BLOCKS; b++)
			if (load64(&wk->stats->by_block[b]))
				nb = b + 1;
		if (counters_copy(&d->by_algo, &d->n_by_algo, wk->stats->by_algo, DFCCL_ALGO_COUNT_) < 0 ||
		    counters_copy(&d->by_block, &d->n_by_block, wk->stats->by_block, nb) < 0)
			return -ENOMEM;
	}
	return 0;
}

int workers_fill_queues(struct workers *w, Dfccl__V1__QueryReply *r)
{
	if (!w)
		return 0;
	size_t n = 0;
	for (unsigned i = 0; i < w->n; i++)
		n += w->w[i].nqps;
	r->queues = calloc(n ? n : 1, sizeof(*r->queues));
	if (!r->queues)
		return -ENOMEM;
	for (unsigned i = 0; i < w->n; i++) {
		for (struct qp_rec *q = w->w[i].qps; q; q = q->next) {
			Dfccl__V1__QueueInfo *qi = calloc(1, sizeof(*qi));
			if (!qi)
				return -ENOMEM;
			dfccl__v1__queue_info__init(qi);
			r->queues[r->n_queues++] = qi;
			qi->session_id = q->session_id;
			qi->device = i;
			qi->qp_id = q->qp_id;
			qi->sq_entries = q->sq_entries;
			qi->sq_tail = load64(&q->hdr->sq_tail);
			qi->sq_head = load64(&q->hdr->sq_head);
			qi->completed = load64(&q->hdr->completed);
			qi->engine_state = (char *)queue_engine_state_name(
			    atomic_load_explicit((_Atomic uint32_t *)&q->hdr->engine_state, memory_order_relaxed));
		}
	}
	return 0;
}

void workers_query_free(Dfccl__V1__QueryReply *r, Dfccl__V1__StatusInfo *st)
{
	if (st) {
		for (size_t i = 0; i < st->n_devices; i++)
			free(st->devices[i]);
		free(st->devices);
		st->devices = NULL;
		st->n_devices = 0;
	}
	if (r) {
		for (size_t i = 0; i < r->n_stats; i++) {
			free(r->stats[i]->by_algo);
			free(r->stats[i]->by_block);
			free(r->stats[i]);
		}
		free(r->stats);
		r->stats = NULL;
		r->n_stats = 0;
		for (size_t i = 0; i < r->n_queues; i++)
			free(r->queues[i]);
		free(r->queues);
		r->queues = NULL;
		r->n_queues = 0;
	}
}

static void worker_grace_cb(uv_timer_t *t)
{
	struct worker *wk = t->data;
	if (wk->proc_alive) {
		log_warn("worker", "device %u: worker %d did not exit in time; killing it", wk->device, wk->pid);
		uv_process_kill(&wk->proc, SIGKILL);
	}
}

void workers_stop(struct workers *w, void (*done)(struct server *srv))
{
	w->stop_done = done;
	for (unsigned i = 0; i < w->n; i++) {
		struct worker *wk = &w->w[i];
		uv_timer_stop(&wk->timer);
		if (wk->proc_alive) {
			wk->state = W_STOPPING;
			uv_process_kill(&wk->proc, SIGTERM);
			uv_timer_start(&wk->timer, worker_grace_cb, (uint64_t)w->srv->cfg.shutdown_grace_ms, 0);
		} else {
			/* Nothing to wait for: the timer goes now. A live worker's
			 * timer is the grace timer; its exit callback closes it. */
			wk->state = W_STOPPED;
			uv_close((uv_handle_t *)&wk->timer, worker_timer_closed);
		}
	}
	if (w->handles_open == 0 && done)
		done(w->srv);
}

void workers_free(struct workers *w)
{
	if (!w)
		return;
	for (unsigned i = 0; i < w->n; i++) {
		struct worker *wk = &w->w[i];
		while (wk->qps) {
			struct qp_rec *q = wk->qps;
			wk->qps = q->next;
			qp_rec_free(q);
		}
		while (wk->regs) {
			struct reg_rec *r = wk->regs;
			wk->regs = r->next;
			reg_rec_free(r);
		}
		if (wk->stats)
			munmap(wk->stats, DFCCL_STATS_SIZE);
		if (wk->stats_fd >= 0)
			close(wk->stats_fd);
	}
	while (w->reg_waits) {
		struct reg_wait *rw = w->reg_waits;
		w->reg_waits = rw->next;
		free(rw);
	}
	while (w->alloc_waits) {
		struct alloc_wait *a = w->alloc_waits;
		w->alloc_waits = a->next;
		free(a);
	}
	while (w->releases) {
		struct comm_release *r = w->releases;
		w->releases = r->next;
		free(r);
	}
	free(w->w);
	free(w);
}
