/*
 * Communicators: the client's record of one rank's membership in a
 * communicator the daemon created.
 *
 * Model. dfcclCommInitRank checks its arguments, makes sure the session has
 * a queue pair on the device, and asks the daemon to join; the reply makes
 * the communicator ready. From then on it is used by the collectives (which
 * take its queue pair, id and next per-communicator sequence number) until
 * dfcclCommDestroy or dfcclCommAbort frees it. Its asynchronous error (a
 * peer lost, an abort by another rank, the device's worker lost, the daemon
 * gone) arrives through the session's async slot and is checked before each
 * submission; once set it stays (first error wins). An operator's shrink
 * advice (`dfcclctl shrink`) arrives the same way and is kept beside it,
 * the latest one winning (dfcclCommGetShrinkAdvice).
 *
 * Submissions are asynchronous: each one's entry is tracked in the
 * communicator's req_tracker (req.h) until it completes. dfcclCommDestroy
 * first waits for all of them; dfcclCommAbort tells the daemon first (which
 * fails them) and hands them to the session to reap, so it never waits.
 *
 * Keys (sqe.comm_seq) come from separate counters, as the queue ABI asks:
 * one sequence of NCCL-style collectives, one per peer for sends and one per
 * peer for receives, and one run counter per registered collective id.
 */
#ifndef DFCCL_CLIENT_COMM_H
#define DFCCL_CLIENT_COMM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "client.h"
#include "dfccl.h"
#include "qp.h"
#include "req.h"

struct mem_handle;

/* A registered (DFCCL-style) collective of a communicator. */
struct comm_coll {
	bool used;              /* comm lock */
	dfcclCollDesc_t desc;   /* comm lock */
	uint64_t runs;          /* atomic: runs submitted; kept across re-registration, since
	                         * runs match across ranks by (id, run number) */
};

struct dfcclComm {
	struct client *client;   /* reference held */
	struct qp *qp;           /* the session's queue pair on `device` */
	struct client_async async;
	uint64_t id;             /* daemon-wide communicator id */
	dfcclUniqueId unique_id; /* what it was made from: shrink and split derive their ids from it */
	uint64_t derived;        /* atomic: shrinks and splits made from it so far */
	int nranks;
	int rank;
	int device;              /* the application's number: a CUDA ordinal, for driver calls (client_device_map) */
	uint32_t dev_index;      /* the daemon's device it lives on; set by the join */
	int64_t coll_timeout_ms; /* CommInit coll_timeout_ms: 0 the daemon's, -1 none, else ms */
	uint64_t coll_seq;       /* atomic: NCCL-style collectives submitted */
	uint64_t *p2p_seq;       /* atomic, [2 * nranks]: sends to, then receives from, each peer */
	struct req_tracker tracker; /* outstanding entries */
	bool tracking;           /* tracker initialised */

	/* Non-blocking init (config.blocking = 0): the thread that joins clears
	 * init_running once init_result (and init_error) are final. */
	bool init_running;       /* atomic */
	bool init_abandoned;     /* lock: destroyed or aborted while running; the thread frees it */
	dfcclResult_t init_result;
	char init_error[256];

	pthread_mutex_t lock;    /* handles, colls[].used and .desc, init_abandoned */
	struct mem_handle *handles; /* dfcclCommRegister registrations (mem.c) */
	struct comm_coll colls[DFCCL_MAX_COLL_ID];
};

/*
 * dfcclSuccess if collectives may be submitted on comm; otherwise its
 * asynchronous error (or dfcclDeviceLost when its queue pair is dead), with
 * the reason as the thread's last error.
 */
dfcclResult_t comm_check(struct dfcclComm *comm);

/* dfcclSuccess once comm's init completed; dfcclInProgress while a
 * non-blocking init runs; its error if it failed (the thread's last error
 * set). Everything that uses the daemon's side of comm checks it first. */
dfcclResult_t comm_usable(struct dfcclComm *comm);

/* The key (sqe.comm_seq, 1, 2, ...) of the next NCCL-style entry of
 * `opcode`: the collective sequence, or for DFCCL_OP_SEND / DFCCL_OP_RECV
 * the message number to / from `peer`. */
uint64_t comm_next_seq(struct dfcclComm *comm, unsigned opcode, int peer);

/*
 * A collective that failed because its communicator comm_id did (a
 * timeout, a lost peer, an abort, a lost device) gets the daemon's sentence
 * about the communicator appended: which collective, which ranks never
 * submitted it. The daemon sends that notice before it fails the
 * collectives, so it is on the socket already; this waits only the moment
 * the reader thread takes to file it, and only on this failure path. A
 * communicator destroyed meanwhile has no sentence to add. Where the
 * sentence is the session's loss (or the daemon has closed the connection
 * unread), the result is dfcclDaemonUnavailable, whatever the collective's
 * own status said: the daemon's workers fail what they hold as it dies.
 */
dfcclResult_t comm_explain(struct client *c, uint64_t comm_id, dfcclResult_t r);

#endif /* DFCCL_CLIENT_COMM_H */
