/*
 * Communicator lifecycle: init, destroy, abort, queries and the async
 * error; see comm.h.
 *
 * Arguments are checked here before anything reaches the daemon, so the
 * common mistakes (a rank outside 0..nranks-1, an id that did not come from
 * dfcclGetUniqueId) fail at once with a sentence that names them, and the
 * daemon's own checks are the second line for what only it can know (ranks
 * that disagree on nranks, another user's communicator).
 */
#include "comm.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "mem.h"
#include "uniqueid.h"

static void comm_free(struct dfcclComm *comm)
{
	if (!comm)
		return;
	if (comm->tracking)
		req_tracker_drain(&comm->tracker);
	free(comm->p2p_seq);
	if (comm->client) {
		client_async_remove(comm->client, &comm->async);
		client_unref(comm->client);
	}
	mem_comm_release(comm);
	pthread_mutex_destroy(&comm->lock);
	free(comm);
}

/* DFCCL_TIMEOUT_MS as a CommInit coll_timeout_ms: 0 when unset (the
 * daemon's setting), -1 for "0" (none), else the milliseconds. */
static dfcclResult_t comm_env_timeout(int64_t *out)
{
	const char *v = getenv("DFCCL_TIMEOUT_MS");
	*out = 0;
	if (!v || !*v)
		return dfcclSuccess;
	char *end;
	errno = 0;
	long long ms = strtoll(v, &end, 10);
	if (errno || *end || ms < 0 || ms > INT32_MAX)
		return errors_set(dfcclInvalidArgument, "DFCCL_TIMEOUT_MS=%s: give milliseconds from 0 (no timeout) to %d",
		                  v, INT32_MAX);
	*out = ms ? ms : -1;
	return dfcclSuccess;
}

/* The config's collective timeout as a CommInit coll_timeout_ms, read only
 * from a config large enough to hold it, so a program built against an
 * older dfccl.h keeps working. */
static dfcclResult_t comm_config_timeout(const dfcclConfig_t *config, int64_t *coll_timeout_ms)
{
	int t = -1;
	if (config && config->size >= offsetof(dfcclConfig_t, timeoutMs) + sizeof(int))
		t = config->timeoutMs;
	if (t < -1)
		return errors_set(dfcclInvalidArgument, "config timeoutMs %d: use milliseconds, 0 for none or -1 for the "
		                  "default", t);
	if (t == -1)
		return comm_env_timeout(coll_timeout_ms);
	*coll_timeout_ms = t ? t : -1;
	return dfcclSuccess;
}

static dfcclResult_t comm_config(const dfcclConfig_t *config, int *device, int *timeout_ms, int *blocking,
                                 int64_t *coll_timeout_ms)
{
	*device = client_current_device();
	*timeout_ms = 0;
	*blocking = 1;
	if (!config)
		return comm_config_timeout(NULL, coll_timeout_ms);
	if (config->magic != DFCCL_CONFIG_MAGIC || config->size < offsetof(dfcclConfig_t, blocking) + sizeof(int))
		return errors_set(dfcclInvalidArgument, "config was not initialised with DFCCL_CONFIG_INITIALIZER");
	if (config->device < -1)
		return errors_set(dfcclInvalidArgument, "config device %d: use a device (a CUDA ordinal, or the daemon's "
		                  "device index where this process sees no GPU), or -1 for the calling thread's device",
		                  config->device);
	if (config->initTimeoutMs < 0)
		return errors_set(dfcclInvalidArgument, "config initTimeoutMs %d is negative (0 means the daemon's default)",
		                  config->initTimeoutMs);
	if (config->blocking != 0 && config->blocking != 1)
		return errors_set(dfcclInvalidArgument, "config blocking %d: use 1 (the call returns once the "
		                  "communicator is ready) or 0 (non-blocking)", config->blocking);
	dfcclResult_t r = comm_config_timeout(config, coll_timeout_ms);
	if (r != dfcclSuccess)
		return r;
	if (config->device >= 0)
		*device = config->device;
	*timeout_ms = config->initTimeoutMs;
	*blocking = config->blocking;
	return dfcclSuccess;
}

/* Joins cm (allocated, its rank, size and device set) through the daemon:
 * a queue pair on the device, the CommInit request and its reply. */
static dfcclResult_t comm_join(struct dfcclComm *cm, dfcclUniqueId commId, int timeout_ms)
{
	struct client *c = NULL;
	struct qp *qp;
	struct client_reply rep = CLIENT_REPLY_INIT;
	dfcclResult_t r = client_default(&c);
	if (r != dfcclSuccess)
		return r;
	struct client_device dev;
	r = client_device_map(c, cm->device, &dev);
	if (r != dfcclSuccess)
		goto fail;
	r = client_attach(c, dev.index, &qp);
	if (r != dfcclSuccess)
		goto fail;
	/* Before the slot is linked: notices about the device match it. */
	cm->async.device = dev.index;
	cm->dev_index = dev.index;

	Dfccl__V1__CommInit init = DFCCL__V1__COMM_INIT__INIT;
	init.unique_id.data = (uint8_t *)commId.internal;
	init.unique_id.len = sizeof(commId.internal);
	init.nranks = (uint32_t)cm->nranks;
	init.rank = (uint32_t)cm->rank;
	init.device = dev.index;
	init.timeout_ms = (uint32_t)timeout_ms;
	init.coll_timeout_ms = cm->coll_timeout_ms;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_INIT;
	req.comm_init = &init;
	r = client_comm_init(c, &req, &cm->async, &rep);
	if (r != dfcclSuccess)
		goto fail;
	/* From here the async slot is linked; comm_free unlinks it. */
	cm->client = c;
	c = NULL;

	const Dfccl__V1__CommInitReply *cr = rep.env->comm_init_reply;
	if (cr->nranks != (uint32_t)cm->nranks || cr->rank != (uint32_t)cm->rank || cr->comm_id == 0) {
		r = errors_set(dfcclInternalError, "dfccld created communicator %llu as rank %u of %u, not rank %d of %d",
		               (unsigned long long)cr->comm_id, cr->rank, cr->nranks, cm->rank, cm->nranks);
		goto fail;
	}
	cm->qp = qp;
	req_tracker_init(&cm->tracker, client_req_poller(cm->client));
	cm->tracking = true;
	cm->id = cr->comm_id;
	cm->unique_id = commId;
fail:
	client_reply_release(&rep);
	client_unref(c);
	return r;
}

/* A non-blocking init in progress: what its thread needs. */
struct comm_init_job {
	struct dfcclComm *cm;
	dfcclUniqueId id;
	int timeout_ms;
};

static dfcclResult_t comm_leave(struct dfcclComm *comm, bool abort);

/* The thread of a non-blocking init: joins, then publishes the outcome, or
 * cleans up itself when the caller gave the handle up meanwhile. */
static void *comm_init_thread(void *arg)
{
	struct comm_init_job *job = arg;
	struct dfcclComm *cm = job->cm;
	dfcclResult_t r = comm_join(cm, job->id, job->timeout_ms);
	pthread_mutex_lock(&cm->lock);
	cm->init_result = r;
	if (r != dfcclSuccess)
		snprintf(cm->init_error, sizeof(cm->init_error), "%s", dfcclGetLastError(NULL));
	bool abandoned = cm->init_abandoned;
	__atomic_store_n(&cm->init_running, false, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&cm->lock);
	free(job);
	if (abandoned) {
		if (r == dfcclSuccess)
			comm_leave(cm, true);
		else
			comm_free(cm);
	}
	return NULL;
}

dfcclResult_t dfcclCommInitRankConfig(dfcclComm_t *comm, int nranks, dfcclUniqueId commId, int rank,
                                      const dfcclConfig_t *config)
{
	dfcclResult_t r;
	int device, timeout_ms, blocking;
	int64_t coll_timeout_ms;

	if (!comm)
		return errors_set(dfcclInvalidArgument, "dfcclCommInitRank: comm is NULL");
	*comm = NULL;
	if (nranks < 1)
		return errors_set(dfcclInvalidArgument, "nranks %d: a communicator needs at least one rank", nranks);
	if (rank < 0 || rank >= nranks)
		return errors_set(dfcclInvalidArgument, "rank %d is outside 0..%d for a communicator of %d rank(s)",
		                  rank, nranks - 1, nranks);
	if (uniqueid_check(&commId) < 0)
		return errors_set(dfcclInvalidArgument, "not a dfccl unique id (use dfcclGetUniqueId)");
	r = comm_config(config, &device, &timeout_ms, &blocking, &coll_timeout_ms);
	if (r != dfcclSuccess)
		return r;

	struct dfcclComm *cm = calloc(1, sizeof(*cm));
	if (!cm)
		return errors_set(dfcclSystemError, "out of memory");
	pthread_mutex_init(&cm->lock, NULL);
	cm->nranks = nranks;
	cm->rank = rank;
	cm->device = device;
	cm->coll_timeout_ms = coll_timeout_ms;
	cm->p2p_seq = calloc(2 * (size_t)nranks, sizeof(*cm->p2p_seq));
	if (!cm->p2p_seq) {
		comm_free(cm);
		return errors_set(dfcclSystemError, "out of memory");
	}
	if (blocking) {
		r = comm_join(cm, commId, timeout_ms);
		if (r != dfcclSuccess) {
			comm_free(cm);
			return r;
		}
		*comm = cm;
		return dfcclSuccess;
	}
	/* Non-blocking: a thread of its own joins; the handle is valid at once
	 * and says dfcclInProgress until then (comm_usable). */
	struct comm_init_job *job = malloc(sizeof(*job));
	pthread_attr_t attr;
	pthread_t tid;
	int rc = job ? pthread_attr_init(&attr) : ENOMEM;
	if (rc == 0) {
		job->cm = cm;
		job->id = commId;
		job->timeout_ms = timeout_ms;
		cm->init_running = true;
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		rc = pthread_create(&tid, &attr, comm_init_thread, job);
		pthread_attr_destroy(&attr);
	}
	if (rc != 0) {
		free(job);
		comm_free(cm);
		return errors_set(dfcclSystemError, "cannot start the non-blocking init: %s", strerror(rc));
	}
	*comm = cm;
	return errors_set(dfcclInProgress, "communicator rank %d of %d is being initialised (non-blocking): poll "
	                  "dfcclCommGetAsyncError until it is not dfcclInProgress", rank, nranks);
}

dfcclResult_t comm_usable(struct dfcclComm *comm)
{
	if (__atomic_load_n(&comm->init_running, __ATOMIC_ACQUIRE))
		return errors_set(dfcclInProgress, "the communicator is still being initialised (non-blocking init); "
		                  "poll dfcclCommGetAsyncError until it is not dfcclInProgress");
	if (comm->init_result != dfcclSuccess)
		return errors_set(comm->init_result, "the communicator's non-blocking init failed: %s", comm->init_error);
	return dfcclSuccess;
}

dfcclResult_t dfcclCommInitRank(dfcclComm_t *comm, int nranks, dfcclUniqueId commId, int rank)
{
	return dfcclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

/* Destroy and abort: tell the daemon, then free the communicator whatever
 * it answered, because the caller gives up the handle either way. Destroy
 * lets the outstanding entries finish first; abort leaves them to fail (the
 * daemon fails them) and to be reaped by the session. */
static dfcclResult_t comm_leave(struct dfcclComm *comm, bool abort)
{
	if (!abort)
		req_tracker_drain(&comm->tracker);
	Dfccl__V1__CommDestroy destroy = DFCCL__V1__COMM_DESTROY__INIT;
	Dfccl__V1__CommAbort ab = DFCCL__V1__COMM_ABORT__INIT;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	if (abort) {
		ab.comm_id = comm->id;
		req.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_ABORT;
		req.comm_abort = &ab;
	} else {
		destroy.comm_id = comm->id;
		req.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_DESTROY;
		req.comm_destroy = &destroy;
	}
	dfcclResult_t r = client_request_ok(comm->client, &req);
	if (abort)
		req_tracker_orphan(&comm->tracker);
	comm->tracking = false;
	comm_free(comm);
	return r;
}

/* Destroy or abort of a communicator whose non-blocking init has not
 * finished, or failed: the init thread (if running) finishes the job, so
 * neither waits. Returns 1 when it took care of comm. */
static int comm_leave_early(struct dfcclComm *comm)
{
	pthread_mutex_lock(&comm->lock);
	bool running = __atomic_load_n(&comm->init_running, __ATOMIC_ACQUIRE);
	if (running)
		comm->init_abandoned = true;
	pthread_mutex_unlock(&comm->lock);
	if (running)
		return 1;
	if (comm->init_result == dfcclSuccess)
		return 0;
	comm_free(comm);
	return 1;
}

dfcclResult_t dfcclCommDestroy(dfcclComm_t comm)
{
	if (!comm || comm_leave_early(comm))
		return dfcclSuccess;
	return comm_leave(comm, false);
}

dfcclResult_t dfcclCommAbort(dfcclComm_t comm)
{
	if (!comm || comm_leave_early(comm))
		return dfcclSuccess;
	dfcclResult_t r = comm_leave(comm, true);
	/* Without a daemon there is nothing left to abort: the other ranks have
	 * lost their sessions too. */
	return r == dfcclDaemonUnavailable ? dfcclSuccess : r;
}

dfcclResult_t dfcclCommCount(const dfcclComm_t comm, int *count)
{
	if (!comm || !count)
		return errors_set(dfcclInvalidArgument, "dfcclCommCount: %s is NULL", comm ? "count" : "comm");
	*count = comm->nranks;
	return dfcclSuccess;
}

dfcclResult_t dfcclCommUserRank(const dfcclComm_t comm, int *rank)
{
	if (!comm || !rank)
		return errors_set(dfcclInvalidArgument, "dfcclCommUserRank: %s is NULL", comm ? "rank" : "comm");
	*rank = comm->rank;
	return dfcclSuccess;
}

dfcclResult_t dfcclCommDevice(const dfcclComm_t comm, int *device)
{
	if (!comm || !device)
		return errors_set(dfcclInvalidArgument, "dfcclCommDevice: %s is NULL", comm ? "device" : "comm");
	*device = comm->device;
	return dfcclSuccess;
}

/* Whether msg names communicator id ("communicator 12", not "... 123"):
 * the daemon's sentences about a communicator do; the library's own about
 * the session (the daemon lost) do not. */
static bool names_comm(const char *msg, uint64_t id)
{
	char name[40];
	int len = snprintf(name, sizeof(name), "communicator %llu", (unsigned long long)id);
	for (const char *p = strstr(msg, name); p; p = strstr(p + 1, name))
		if (p[len] < '0' || p[len] > '9')
			return true;
	return false;
}

dfcclResult_t comm_check(struct dfcclComm *comm)
{
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	char msg[sizeof(comm->async.message)];
	dfcclResult_t r = client_async_get(comm->client, &comm->async, msg, sizeof(msg));
	if (r != dfcclSuccess && names_comm(msg, comm->id))
		return errors_set(r, "%s", msg);
	if (r != dfcclSuccess)
		return errors_set(r, "communicator %llu: %s", (unsigned long long)comm->id, msg);
	return qp_health(comm->qp);
}

uint64_t comm_next_seq(struct dfcclComm *comm, unsigned opcode, int peer)
{
	uint64_t *counter = &comm->coll_seq;
	if (opcode == DFCCL_OP_SEND)
		counter = &comm->p2p_seq[peer];
	else if (opcode == DFCCL_OP_RECV)
		counter = &comm->p2p_seq[comm->nranks + peer];
	return __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
}

#define COMM_EXPLAIN_WAIT_MS 200

dfcclResult_t comm_explain(struct client *c, uint64_t comm_id, dfcclResult_t r)
{
	if (r != dfcclTimeout && r != dfcclRemoteError && r != dfcclAborted && r != dfcclDeviceLost)
		return r;
	char first[512], msg[sizeof(((struct client_async *)0)->message)];
	snprintf(first, sizeof(first), "%s", errors_last());
	for (int i = 0; i < COMM_EXPLAIN_WAIT_MS; i++) {
		dfcclResult_t why = client_async_find(c, comm_id, msg, sizeof(msg));
		if (why == dfcclDaemonUnavailable)
			goto daemon_gone;
		if (why != dfcclSuccess)
			return errors_set(r, "%s: %s", first, msg);
		usleep(1000);
	}
	/* No sentence came: the communicator was destroyed meanwhile, or the
	 * reader thread has not read up to the end of a connection that the
	 * daemon's death closed. */
	if (client_gone(c, msg, sizeof(msg)))
		goto daemon_gone;
	return r;

daemon_gone:
	/* The daemon's workers outlive its supervisor by a moment, and fail
	 * what they hold as they go: a peer lost (a worker drops its queue
	 * pairs, which fails the communicator in the other workers), an abort.
	 * Such a status says nothing about the ranks; what the application
	 * must do is wait for the daemon and make new communicators, which
	 * dfcclDaemonUnavailable says, whichever it saw first. */
	return errors_set(dfcclDaemonUnavailable, "%s (the collective had failed as dfccld went away: %s)", msg, first);
}

dfcclResult_t dfcclCommSynchronize(dfcclComm_t comm)
{
	if (!comm)
		return errors_set(dfcclInvalidArgument, "dfcclCommSynchronize: comm is NULL");
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	return comm_explain(comm->client, comm->id, req_tracker_sync(&comm->tracker, true));
}

dfcclResult_t dfcclCommQuery(dfcclComm_t comm)
{
	if (!comm)
		return errors_set(dfcclInvalidArgument, "dfcclCommQuery: comm is NULL");
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	return comm_explain(comm->client, comm->id, req_tracker_sync(&comm->tracker, false));
}

dfcclResult_t dfcclCommGetAsyncError(dfcclComm_t comm, dfcclResult_t *asyncError)
{
	if (!comm || !asyncError)
		return errors_set(dfcclInvalidArgument, "dfcclCommGetAsyncError: %s is NULL", comm ? "asyncError" : "comm");
	/* The first failure among its collectives, which is all a
	 * stream-ordered call's caller gets to see (its stream only waits for
	 * the completion word), reported until a dfcclCommSynchronize returns
	 * it; else the communicator's own state (revoked, a peer lost). */
	dfcclResult_t r = dfcclCommQuery(comm);
	if (r == dfcclInProgress || r == dfcclSuccess)
		r = comm_check(comm);
	*asyncError = r;
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- recovery */

dfcclResult_t dfcclCommRevoke(dfcclComm_t comm)
{
	if (!comm)
		return errors_set(dfcclInvalidArgument, "dfcclCommRevoke: comm is NULL");
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	Dfccl__V1__CommRevoke rv = DFCCL__V1__COMM_REVOKE__INIT;
	rv.comm_id = comm->id;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_REVOKE;
	req.comm_revoke = &rv;
	return client_request_ok(comm->client, &req);
}

dfcclResult_t dfcclCommGetShrinkAdvice(dfcclComm_t comm, int *excludeRanks, int capacity, int *count)
{
	if (!comm || !count)
		return errors_set(dfcclInvalidArgument, "dfcclCommGetShrinkAdvice: %s is NULL", comm ? "count" : "comm");
	if (capacity < 0 || (capacity > 0 && !excludeRanks))
		return errors_set(dfcclInvalidArgument, "dfcclCommGetShrinkAdvice: room for %d ranks in %s list", capacity,
		                  excludeRanks ? "the" : "a NULL");
	*count = 0;
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	*count = (int)client_async_advice(comm->client, &comm->async, excludeRanks, (uint32_t)capacity);
	return dfcclSuccess;
}

/* Whether the operator's shrink advice for comm excludes its own rank. */
static bool comm_advised_out(struct dfcclComm *comm)
{
	int ranks[DFCCL_COMM_MAX_RANKS];
	uint32_t n = client_async_advice(comm->client, &comm->async, ranks, DFCCL_COMM_MAX_RANKS);
	for (uint32_t i = 0; i < n && i < DFCCL_COMM_MAX_RANKS; i++)
		if (ranks[i] == comm->rank)
			return true;
	return false;
}

/* What derives a child's id: the kind of call, its number among the
 * parent's shrinks and splits, and what tells the children of one call
 * apart (the exclusion set, the color). */
struct comm_salt {
	char kind[8];
	uint64_t generation;
	int32_t color;
	uint8_t excluded[64];
};

/* The id of comm's next child named by salt: generation `next` of its
 * shrinks, splits and grows. */
static void comm_child_id(const struct dfcclComm *comm, struct comm_salt *salt, uint64_t next, dfcclUniqueId *id)
{
	salt->generation = next;
	uniqueid_derive(&comm->unique_id, salt, sizeof(*salt), id);
}

/* Joins the child of comm named by salt as rank `rank` of `nranks`, on
 * comm's device unless config names one. */
static dfcclResult_t comm_child(struct dfcclComm *comm, struct comm_salt *salt, int nranks, int rank,
                                dfcclComm_t *newcomm, const dfcclConfig_t *config)
{
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	if (config) {
		int64_t ct;
		dfcclResult_t r = comm_config(config, &cfg.device, &cfg.initTimeoutMs, &cfg.blocking, &ct);
		if (r != dfcclSuccess)
			return r;
		/* Back from CommInit's encoding to the config's. */
		cfg.timeoutMs = ct == 0 ? -1 : ct < 0 ? 0 : (int)ct;
		cfg.device = config->device;
	}
	if (cfg.device < 0)
		cfg.device = comm->device;
	dfcclUniqueId id;
	comm_child_id(comm, salt, __atomic_add_fetch(&comm->derived, 1, __ATOMIC_RELAXED), &id);
	return dfcclCommInitRankConfig(newcomm, nranks, id, rank, &cfg);
}

/* The salt of growing to nranks. */
static void comm_grow_salt(struct comm_salt *salt, int nranks)
{
	memset(salt, 0, sizeof(*salt));
	memcpy(salt->kind, "grow", 4);
	salt->color = nranks;
}

dfcclResult_t dfcclCommGetGrowId(dfcclComm_t comm, int nranks, dfcclUniqueId *growId)
{
	if (!comm || !growId)
		return errors_set(dfcclInvalidArgument, "dfcclCommGetGrowId: %s is NULL", comm ? "growId" : "comm");
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	if (nranks <= comm->nranks)
		return errors_set(dfcclInvalidArgument, "dfcclCommGetGrowId: %d ranks do not grow a communicator of %d",
		                  nranks, comm->nranks);
	struct comm_salt salt;
	comm_grow_salt(&salt, nranks);
	comm_child_id(comm, &salt, __atomic_load_n(&comm->derived, __ATOMIC_RELAXED) + 1, growId);
	return dfcclSuccess;
}

dfcclResult_t dfcclCommGrow(dfcclComm_t comm, int nranks, const dfcclUniqueId *growId, int rank, dfcclComm_t *newcomm,
                            dfcclConfig_t *config)
{
	if (!newcomm)
		return errors_set(dfcclInvalidArgument, "dfcclCommGrow: newcomm is NULL");
	*newcomm = NULL;
	if (!comm == !growId)
		return errors_set(dfcclInvalidArgument, "dfcclCommGrow: an old rank passes its communicator and no id, a "
		                  "new rank no communicator and the id from dfcclCommGetGrowId");
	if (!comm)
		return dfcclCommInitRankConfig(newcomm, nranks, *growId, rank, config);
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	if (nranks <= comm->nranks)
		return errors_set(dfcclInvalidArgument, "dfcclCommGrow: %d ranks do not grow a communicator of %d", nranks,
		                  comm->nranks);
	struct comm_salt salt;
	comm_grow_salt(&salt, nranks);
	return comm_child(comm, &salt, nranks, comm->rank, newcomm, config);
}

dfcclResult_t dfcclCommShrink(dfcclComm_t comm, int *excludeRanksList, int excludeRanksCount, dfcclComm_t *newcomm,
                              dfcclConfig_t *config, int shrinkFlags)
{
	if (!comm || !newcomm)
		return errors_set(dfcclInvalidArgument, "dfcclCommShrink: %s is NULL", comm ? "newcomm" : "comm");
	*newcomm = NULL;
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	if (shrinkFlags != DFCCL_SHRINK_DEFAULT && shrinkFlags != DFCCL_SHRINK_ABORT)
		return errors_set(dfcclInvalidArgument, "dfcclCommShrink: flags %#x: use DFCCL_SHRINK_DEFAULT or "
		                  "DFCCL_SHRINK_ABORT", (unsigned)shrinkFlags);
	if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
		return errors_set(dfcclInvalidArgument, "dfcclCommShrink: %d excluded ranks in %s list", excludeRanksCount,
		                  excludeRanksList ? "the" : "a NULL");
	struct comm_salt salt;
	memset(&salt, 0, sizeof(salt));
	memcpy(salt.kind, "shrink", 6);
	int below = 0;
	for (int i = 0; i < excludeRanksCount; i++) {
		int x = excludeRanksList[i];
		if (x < 0 || x >= comm->nranks)
			return errors_set(dfcclInvalidArgument, "dfcclCommShrink: excluded rank %d is outside 0..%d", x,
			                  comm->nranks - 1);
		if (x == comm->rank && comm_advised_out(comm))
			return errors_set(dfcclInvalidArgument, "dfcclCommShrink: rank %d is excluded by the shrink advice "
			                  "of communicator %llu (dfcclctl shrink): leave it with dfcclCommDestroy or "
			                  "dfcclCommAbort", x, (unsigned long long)comm->id);
		if (x == comm->rank)
			return errors_set(dfcclInvalidArgument, "dfcclCommShrink: rank %d excludes itself (excluded ranks "
			                  "do not call it)", x);
		if (salt.excluded[x / 8] & (1u << (x % 8)))
			return errors_set(dfcclInvalidArgument, "dfcclCommShrink: rank %d is excluded twice", x);
		salt.excluded[x / 8] |= (uint8_t)(1u << (x % 8));
		below += x < comm->rank;
	}
	if (shrinkFlags == DFCCL_SHRINK_ABORT) {
		/* Whatever hangs on comm fails now; a communicator that failed
		 * already (a peer lost) needs nothing more. */
		dfcclResult_t r = dfcclCommRevoke(comm);
		if (r != dfcclSuccess && r != dfcclDaemonUnavailable)
			return r;
	} else if (dfcclCommQuery(comm) == dfcclInProgress) {
		return errors_set(dfcclInvalidUsage, "dfcclCommShrink: communicator %llu has collectives outstanding; "
		                  "wait for them or shrink with DFCCL_SHRINK_ABORT", (unsigned long long)comm->id);
	}
	return comm_child(comm, &salt, comm->nranks - excludeRanksCount, comm->rank - below, newcomm, config);
}

dfcclResult_t dfcclCommSplit(dfcclComm_t comm, int color, int key, dfcclComm_t *newcomm, dfcclConfig_t *config)
{
	if (!comm || !newcomm)
		return errors_set(dfcclInvalidArgument, "dfcclCommSplit: %s is NULL", comm ? "newcomm" : "comm");
	*newcomm = NULL;
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
	if (color < 0 && color != DFCCL_SPLIT_NOCOLOR)
		return errors_set(dfcclInvalidArgument, "dfcclCommSplit: color %d: use a color >= 0 or "
		                  "DFCCL_SPLIT_NOCOLOR", color);
	/* Every rank's (color, key), through comm itself, in host memory the
	 * CPU fills and reads (dfcclMemAlloc would give device memory on the
	 * CUDA engine), allocated for comm's device (the allocation is for the
	 * thread's device). */
	int n = comm->nranks, thread_device = 0;
	int32_t *buf = NULL;
	dfcclGetDevice(&thread_device);
	dfcclSetDevice(comm->device);
	dfcclResult_t r = dfcclMemAllocHost((void **)&buf, (size_t)(2 + 2 * n) * sizeof(*buf));
	dfcclSetDevice(thread_device);
	if (r != dfcclSuccess)
		return r;
	buf[0] = color;
	buf[1] = key;
	r = dfcclAllGather(buf, buf + 2, 2, dfcclInt32, comm, NULL);
	if (r == dfcclSuccess)
		r = dfcclCommSynchronize(comm);
	if (r != dfcclSuccess) {
		char why[256];
		snprintf(why, sizeof(why), "%s", dfcclGetLastError(NULL));
		dfcclMemFree(buf);
		return errors_set(r, "dfcclCommSplit: exchanging colors over communicator %llu failed: %s",
		                  (unsigned long long)comm->id, why);
	}
	/* This rank's place among its color: ranks before it by (key, rank). */
	int members = 0, rank = 0;
	for (int q = 0; q < n; q++) {
		int32_t c = buf[2 + 2 * q], k = buf[3 + 2 * q];
		if (c != color)
			continue;
		members++;
		rank += k < key || (k == key && q < comm->rank);
	}
	dfcclMemFree(buf);
	struct comm_salt salt;
	memset(&salt, 0, sizeof(salt));
	memcpy(salt.kind, "split", 5);
	salt.color = color;
	/* Every rank counts the split, whatever its color, so later ids agree. */
	if (color == DFCCL_SPLIT_NOCOLOR) {
		__atomic_add_fetch(&comm->derived, 1, __ATOMIC_RELAXED);
		return dfcclSuccess;
	}
	return comm_child(comm, &salt, members, rank, newcomm, config);
}
