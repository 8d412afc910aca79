/*
 * Communicators (jobs) in the supervisor.
 *
 * dfcclCommInitRank semantics: ranks that present the same 128-byte unique
 * id are gathered into one communicator. The first rank to arrive creates it
 * and makes its uid the owner; ranks of any other uid are refused. Init
 * completes, for every rank at once, when all nranks have joined, or fails
 * for every rank that joined after the init timeout, with an error naming the
 * ranks that never came.
 *
 * Once every rank joined, the supervisor creates the communicator's shared
 * region (proto/dfccl_comm.h) and hands it to each worker with a rank in it;
 * the ranks' CommInit is answered when every one of those workers has
 * acknowledged, so no entry can name a communicator its worker does not
 * know. Where the engines of a communicator that spans devices export
 * something for each other (engine_comm_export: the CUDA engine maps its
 * peers' GPU memory), the supervisor keeps each device's blob from its
 * acknowledgement, hands every worker the other devices' blobs
 * (WorkerCommPeers) once all acknowledged, and answers the ranks only when
 * each has acknowledged those too. A failure is broadcast by storing the status into the region's
 * `aborted` word (every task of every worker sees it at its next wait) and
 * by telling the workers, which fail later entries at once.
 *
 * The init timeout bounds both waits: the ranks' joining, and (restarted
 * once all joined) the workers' taking the communicator, so a worker that
 * never answers fails the init rather than leaving the ranks waiting.
 *
 * States: initializing -> activating -> [exchanging ->] ready -> (aborted |
 * peer-lost | device-lost | timed-out), and
 * the communicator is freed when its last member has left (destroy, abort or
 * disconnect). Once it left `ready`, the surviving members have been told
 * with a Notice and their collectives fail.
 */
#ifndef DFCCLD_COMM_H
#define DFCCLD_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "dfccl.pb-c.h"

struct server;
struct session;

enum comm_state {
	COMM_INITIALIZING, /* ranks joining */
	COMM_ACTIVATING,   /* every rank joined; the workers are taking the communicator */
	COMM_EXCHANGING,   /* every worker took it; they are taking each other's blobs */
	COMM_READY,
	COMM_ABORTED,
	COMM_PEER_LOST,
	COMM_DEVICE_LOST,
	COMM_TIMED_OUT,    /* a collective waited longer than the timeout (daemon/watch.h) */
};

/* One device's exported blob (1..DFCCL_PEER_BLOB_MAX bytes, owned). */
struct comm_blob {
	uint32_t device;
	uint32_t len;
	uint8_t *data;
};

enum comm_member_state { MEMBER_EMPTY = 0, MEMBER_JOINING, MEMBER_ACTIVE, MEMBER_LEFT };

struct comm_member {
	enum comm_member_state state;
	struct session *session;
	uint64_t session_id;
	uint64_t request_id; /* the CommInit to answer */
	uint32_t device;
	int32_t pid;
	int64_t coll_timeout_ms; /* what the rank asked for: 0 the daemon's setting, -1 none */
};

#define COMM_ID_BYTES 128

struct comm {
	struct comm *prev, *next;
	struct server *srv;
	uint64_t id;
	uint8_t unique_id[COMM_ID_BYTES];
	uid_t uid;
	uint32_t nranks;
	uint32_t joined;  /* members JOINING or ACTIVE */
	enum comm_state state;
	struct comm_member *members;
	uv_timer_t timer; /* init timeout: for the ranks to join, then as long again for the workers */
	uint64_t init_timeout_ms;
	uint64_t created_ms;
	int region_fd;    /* the shared region, once activating; -1 before */
	void *region;
	size_t region_size;
	uint64_t devices; /* bitmask of the devices with a rank (devices < 64) */
	uint64_t acks;    /* bitmask of the devices whose worker acknowledged */
	uint64_t peer_acks; /* exchanging: the devices whose worker took its peers' blobs */
	/* The non-empty blobs the workers exported (engine_comm_export), while
	 * activating and exchanging. */
	struct comm_blob *blobs;
	unsigned nblobs;
	int awaiting_device; /* every rank joined; activation waits for this device's worker (-1: none) */
	uint64_t shrink_advice; /* `dfcclctl shrink`: the ranks advised to be excluded (bit r); 0: none */
};

/*
 * Joins session s as `rank`. Returns 0 when the join was recorded (the reply
 * is sent when init completes or times out) or a positive
 * DFCCL__V1__ERROR_CODE__* with a sentence in err for the caller to send.
 */
int comm_join(struct server *srv, struct session *s, uint64_t request_id, const uint8_t *unique_id, size_t idlen,
              uint32_t nranks, uint32_t rank, uint32_t device, uint32_t timeout_ms, int64_t coll_timeout_ms,
              char *err, size_t errlen);

/* The communicator with this id, or NULL. */
struct comm *comm_find(struct server *srv, uint64_t comm_id);

/* The collective timeout of c in milliseconds (0: none): the shortest one
 * its ranks asked for, a rank that asked for nothing counting as the
 * daemon's setting coll-timeout-ms; none when every rank turned it off. */
uint64_t comm_coll_timeout_ms(const struct comm *c);

/*
 * The ready communicator c failed (state st, queue status `status`, a
 * DFCCL_CQ_*): every member is told with a Notice of `code` and `msg` first,
 * then the status is stored into the region and sent to the workers, so a
 * client that sees its collective fail finds the sentence already on its
 * socket. No-op unless c is ready.
 */
void comm_fail(struct comm *c, enum comm_state st, uint32_t status, int code, const char *msg);

/* dfcclCommDestroy (abort = 0) or dfcclCommAbort (abort = 1) from session s.
 * Returns 0 or a positive error code with a sentence in err. */
int comm_leave(struct server *srv, struct session *s, uint64_t comm_id, int abort, char *err, size_t errlen);

/* dfcclCommRevoke from session s (a member), or `dfcclctl abort` (the
 * owner's uid or root): c fails every pending and later collective with
 * DFCCL_CQ_ABORTED on every rank; the members stay. Returns 0 or a
 * positive error code with a sentence in err. */
int comm_revoke(struct server *srv, struct session *s, uint64_t comm_id, char *err, size_t errlen);

/*
 * `dfcclctl shrink` (CommShrinkAdvice) from session s, with the rights of
 * comm_revoke: c is revoked as by comm_revoke, `exclude` (n ranks) becomes
 * its shrink advice, and every member is told with a Notice that carries
 * it, the excluded ones that they are excluded. Returns 0 or a positive
 * error code with a sentence in err (bad ranks among them).
 */
int comm_shrink_advice(struct server *srv, struct session *s, uint64_t comm_id, const uint32_t *exclude, size_t n,
                       char *err, size_t errlen);

/* Session s is gone: leave everything it joined; other ranks are told. */
void comm_session_gone(struct server *srv, struct session *s);

/* The worker of `device` died: every communicator with a rank there fails. */
void comm_device_lost(struct server *srv, uint32_t device);

/* The worker of `device` is serving (again): communicators whose ranks all
 * joined while it was on its way up are activated now. */
void comm_worker_up(struct server *srv, uint32_t device);

/*
 * A worker acknowledged (code 0) or refused a communicator it was given
 * (WorkerCommAdd), or its peers' blobs (WorkerCommPeers): which one, c's
 * state says. blob (len bytes) is what the worker exported, on the first.
 */
void comm_worker_acked(struct server *srv, uint64_t comm_id, uint32_t device, int code, const char *message,
                       const uint8_t *blob, size_t len);

/* Counts for status. */
void comm_count(struct server *srv, unsigned *ready, unsigned *pending);

/* Memberships of session s (JOINING or ACTIVE). */
unsigned comm_session_count(struct server *srv, const struct session *s);

/* Fills reply->comms for dfcclctl (allocates; free with comm_query_free). */
int comm_query(struct server *srv, Dfccl__V1__QueryReply *reply);
void comm_query_free(Dfccl__V1__QueryReply *reply);

const char *comm_state_name(enum comm_state st);

/* Whether every rank of c joined and its workers are still taking it. */
int comm_setting_up(const struct comm *c);

/* Frees every communicator (shutdown). */
void comm_free_all(struct server *srv);

#endif
