/*
 * A session with dfccld: one Unix-socket connection, its poller thread, and
 * what the session owns on the daemon's side (queue pairs per device).
 *
 * Model. client_open connects, says Hello, and starts the poller thread,
 * which from then on is the only reader of the socket. A caller sends a
 * request (writes are serialised by a mutex) and sleeps on its own condition
 * variable until the poller hands it the reply with the same request_id, so
 * any number of threads can have requests in flight at once (four ranks of
 * one process blocking in CommInitRank, say). Unsolicited notices
 * (request_id 0) set the asynchronous error of the communicators they name
 * through "async slots" that communicators register here, so this module
 * does not need to know what a communicator is.
 *
 * States: ready -> lost. A session becomes lost when the socket reaches end
 * of stream or fails; every waiting and later request then fails with
 * dfcclDaemonUnavailable, every async slot gets that error, and queue-pair
 * waits stop. A lost session is never revived: client_default opens a new
 * one for later calls while objects that hold the old one keep failing.
 *
 * Besides the poller, a session has a completion thread (req.h), started
 * with the first entry that has a callback; callbacks run on it.
 *
 * Lifetime: reference counted. The process-wide session (client_default) is
 * held by the library, by every communicator and by every allocation made
 * through it; the last client_unref stops the poller and unmaps the queue
 * pairs.
 *
 * Functions return dfcclSuccess or a result with the thread's last error set.
 */
#ifndef DFCCL_CLIENT_CLIENT_H
#define DFCCL_CLIENT_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "dfccl.h"
#include "dfccl_comm.h"
#include "frame.h"
#include "qp.h"

struct client;
struct req_poller;

/* What the daemon said in its HelloReply. */
struct client_info {
	uint32_t version;        /* protocol version in use */
	char daemon_version[64];
	uint64_t session_id;
	uint32_t engine;         /* dfccl.v1.EngineKind */
	uint32_t ndevices;
};

/* A reply: the envelope and the descriptors that came with it. Descriptors
 * still >= 0 at client_reply_release are closed there. */
struct client_reply {
	dfccl_envelope *env;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds;
};

#define CLIENT_REPLY_INIT {NULL, {0}, 0}

/*
 * The asynchronous error of one communicator, and the shrink advice an
 * operator gave for it (`dfcclctl shrink`), which is kept apart from the
 * error: it may come after the communicator failed otherwise. Owned by the
 * communicator; linked into its session by client_comm_init and unlinked
 * by client_async_remove. Everything but `next`, `comm_id` and `device` is
 * guarded by the session.
 */
struct client_async {
	struct client_async *next;
	uint64_t comm_id;
	uint32_t device;
	dfcclResult_t error; /* first error wins */
	char message[1024];
	uint32_t advice_n;   /* ranks in advice; 0: no advice (the latest advice wins) */
	uint32_t advice[DFCCL_COMM_MAX_RANKS];
};

/* $DFCCL_SOCKET, or DFCCL_DEFAULT_SOCKET. */
const char *client_socket_path(void);

/*
 * Connects to the daemon at `path`, introduces itself as `name`, and starts
 * the poller. Honours DFCCL_PROTO_VERSION_OVERRIDE (see dfccl.h).
 */
dfcclResult_t client_open(const char *path, const char *name, struct client **out);

/* The process-wide session, opened on first use at client_socket_path() and
 * reopened if the previous one was lost or the daemon closed it (client_gone).
 * Returns a new reference. */
dfcclResult_t client_default(struct client **out);

/* client_default without asking the socket (client_gone's system call)
 * whether the daemon closed a session not yet seen lost: for the calls
 * that time the queue itself (dfcclInternalNop), where that call would be
 * part of every figure. */
dfcclResult_t client_default_quick(struct client **out);

struct client *client_ref(struct client *c);
void client_unref(struct client *c);

const struct client_info *client_info(const struct client *c);

/* The session's completion thread and outstanding-entry trackers (req.h). */
struct req_poller *client_req_poller(const struct client *c);

/* True once the connection is gone. */
bool client_lost(const struct client *c);

/*
 * True once the connection is gone or the daemon has closed its end, which
 * the poller may not have read yet (the daemon's process died a moment
 * ago): a question the failure paths ask, never the hot path, since it may
 * cost a system call. With msg, the sentence that says so.
 */
bool client_gone(struct client *c, char *msg, size_t msglen);

/* dfcclSuccess if the daemon serves device index `device`, else
 * dfcclInvalidArgument. */
dfcclResult_t client_check_device(const struct client *c, int device);

/* One GPU (or emulated device) as the daemon and as this process name it. */
struct client_device {
	uint32_t index; /* the daemon's device index: for every request and queue pair */
	int ordinal;    /* the CUDA ordinal of this process: for driver calls */
};

/*
 * What the number an application gives (dfcclSetDevice, config.device, or
 * the ordinal the driver says a GPU buffer lies on) names, in session c.
 * Where the daemon's devices have PCI bus ids and this process sees GPUs,
 * `device` is a CUDA ordinal of this process, and the daemon's device is
 * the one with that GPU's bus id; otherwise (the host engine, no driver, no
 * GPU) it is the daemon's device index, and the ordinal the same number.
 * The first call of a session asks the daemon for its devices and, where
 * they are GPUs, the driver for this process's (initialising it); the
 * answer is kept for the session. dfcclInvalidArgument for an ordinal this
 * process does not have or whose GPU the daemon does not serve (the
 * sentence names its bus id and the daemon's devices).
 */
dfcclResult_t client_device_map(struct client *c, int device, struct client_device *out);

/*
 * Sends `req` (its request_id is assigned here) with `fds` attached and waits
 * for the reply. An ErrorReply becomes its result with the daemon's message
 * as the last error; any other body than `expect` (a
 * DFCCL__V1__ENVELOPE__BODY_* value) is a protocol error. On success the
 * caller owns `rep` and releases it with client_reply_release.
 */
dfcclResult_t client_request(struct client *c, dfccl_envelope *req, const int *fds, unsigned nfds, int expect,
                             struct client_reply *rep);

/* client_request for a dfcclctl query (kind: dfccl.v1.QueryKind); the
 * caller reads rep->env->query_reply and releases rep. */
dfcclResult_t client_query(struct client *c, int kind, struct client_reply *rep);

/* client_request for a request answered by Ok: nothing to hand back. */
dfcclResult_t client_request_ok(struct client *c, dfccl_envelope *req);

/*
 * client_request for a CommInit. If the daemon answers with a
 * CommInitReply, the poller links `async` into the session under the new
 * comm_id before it reads the next frame, so no notice about the new
 * communicator can slip past it.
 */
dfcclResult_t client_comm_init(struct client *c, dfccl_envelope *req, struct client_async *async,
                               struct client_reply *rep);

void client_reply_release(struct client_reply *rep);

/* Unlinks an async slot (no-op if it was never linked). */
void client_async_remove(struct client *c, struct client_async *a);

/* Reads a slot: its error, with the message copied into msg. */
dfcclResult_t client_async_get(struct client *c, const struct client_async *a, char *msg, size_t msglen);

/* The same for the linked slot of communicator comm_id; dfcclSuccess (and
 * msg untouched) where none is linked any more. */
dfcclResult_t client_async_find(struct client *c, uint64_t comm_id, char *msg, size_t msglen);

/* A slot's shrink advice: its ranks into out (up to cap of them); returns
 * how many there are (0: none). */
uint32_t client_async_advice(struct client *c, const struct client_async *a, int *out, uint32_t cap);

/* Sets a slot's error unless it already has one. */
void client_async_set(struct client *c, struct client_async *a, dfcclResult_t error, const char *message);

/*
 * The session's queue pair on daemon device `device`, attaching on first
 * use (once per device per session, also when several threads ask at once).
 * The queue pair lives as long as the session; its `ordinal` is the CUDA
 * ordinal of that GPU in this process (client_device_map), or -1 where this
 * process does not see it.
 */
dfcclResult_t client_attach(struct client *c, uint32_t device, struct qp **out);

/*
 * With DFCCL_STREAM_WAIT=device (stream_waits_on_device), gives queue pair
 * q of c its device completion words (qp_stream_words), once, on the CUDA
 * engine, before its first stream-ordered entry: memory from the daemon
 * like dfcclMemAlloc's. Otherwise, or where that fails (said on stderr),
 * streams wait on the region's words.
 */
void client_stream_words(struct client *c, struct qp *q);

/* Submits a NOP on `device` and waits for its completion: a probe of the
 * whole queue path (dfcclctl ping). */
dfcclResult_t client_nop(struct client *c, uint32_t device);
/* dfcclInternalNopStream's work on c. */
dfcclResult_t client_nop_stream(struct client *c, uint32_t device, dfcclStream_t stream, long count,
                                double *issue_us);

/* The calling thread's device (dfcclSetDevice; 0 by default). */
int client_current_device(void);

#endif /* DFCCL_CLIENT_CLIENT_H */
