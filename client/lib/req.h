/*
 * Outstanding entries: what libdfccl remembers of each asynchronous
 * submission until it has completed and its result has been delivered.
 *
 * Model. Every collective, send, receive and registered run submitted on a
 * communicator becomes a struct req: the queue-pair ticket (qp.h), what to
 * report (the result and its sentence), and how (an optional callback, an
 * optional request handle for dfcclWait/dfcclTest). A req lives in the
 * tracker of its communicator from submission until it is retired, so that
 * dfcclCommSynchronize can wait for "everything submitted so far" and
 * return the first error among it.
 *
 * States of a req: pending -> complete, exactly once. Whoever looks first
 * (a submitter reaping, a thread in dfcclCommSynchronize, dfcclWait or
 * dfcclTest, the completion thread) reads the completion word and records
 * the result; when the queue pair or the connection to the daemon dies
 * first, the entry is abandoned (qp_abandon) and completes with that error,
 * so no wait outlives the daemon. A complete req is retired from its tracker
 * by the next scan of it; one with a callback is retired only by the
 * completion thread, which runs the callback after retiring it, without any
 * lock held, so the callback may submit more work or destroy communicators.
 *
 * The completion thread (one per session, started with the first entry
 * that has a callback) scans the trackers while entries with callbacks are
 * outstanding, with the spin-then-sleep of qp_backoff, and sleeps on a
 * condition variable when there are none: it costs nothing when idle.
 * Callbacks run on it and nowhere else. Entries of a communicator that was
 * aborted are handed to the session's orphan tracker, which the same
 * thread reaps as they complete, so their slots in the queue are freed as
 * the ABI asks and their requests stay valid.
 *
 * Locks: a poller's lock, then a tracker's lock; a req's result is
 * published through its atomic state and needs neither.
 */
#ifndef DFCCL_CLIENT_REQ_H
#define DFCCL_CLIENT_REQ_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dfccl.h"
#include "qp.h"

struct client;

struct req_poller;

struct req {
	struct qp_ticket ticket;
	struct qp *qp;
	struct req_tracker *tracker; /* tracker lock: where it is listed */
	struct req *prev, *next;     /* tracker lock: its place in the list */
	uint64_t index;              /* order of submission in its tracker */
	unsigned opcode;
	dfcclCallback_t callback;
	void *user_arg;
	int refs;                    /* atomic: the tracker's, plus the request handle's */
	int state;                   /* atomic: enum req_state (req.c) */
	bool accounted;              /* tracker lock: its error was considered for the tracker */
	dfcclResult_t result;        /* valid once complete */
	char message[512];           /* the sentence of a failed result */
	struct client *client;       /* a request handle's: its session (a reference) and */
	uint64_t comm_id;            /* communicator, to explain a failure (coll.c) */
};

/* The outstanding entries of one communicator. */
struct req_tracker {
	pthread_mutex_t lock;
	struct req *head, *tail;     /* in submission order */
	uint64_t next_index;
	dfcclResult_t error;         /* first failure since the last req_tracker_sync(wait) */
	uint64_t error_index;        /* its entry's index: "first" is by submission, not by
	                              * the order in which scans happen to see completions */
	char message[512];
	struct req_poller *poller;
	struct qp *qp;               /* the queue pair its entries go to (a communicator has one device) */
	struct req_tracker *next;    /* poller lock: in the poller's list */
};

/* A session's completion thread and the trackers it scans. */
dfcclResult_t req_poller_new(struct req_poller **out);

/* Stops the thread (detaches it when called on that very thread) and frees
 * the poller once the thread has let go of it. */
void req_poller_free(struct req_poller *p);

/* In a child after fork(): the thread does not exist there and its locks
 * may have been held by threads that do not either. Makes the poller
 * usable for freeing what the child inherited. */
void req_poller_after_fork(struct req_poller *p);

/* Starts tracking for a communicator of the session that owns p. */
void req_tracker_init(struct req_tracker *t, struct req_poller *p);

/* Waits until every entry of t has been retired (the callbacks of its
 * entries included), then unlinks t from its poller. */
void req_tracker_drain(struct req_tracker *t);

/* Hands every entry still in t to the session's orphan tracker (the
 * communicator was aborted: nobody will wait for them), then unlinks t. */
void req_tracker_orphan(struct req_tracker *t);

/*
 * dfcclSuccess when every entry submitted on t before the call has
 * completed and none failed since the last waiting call; the first failure
 * otherwise (with its sentence as the last error), which a waiting call
 * also clears. Without `wait`: dfcclInProgress while entries are pending.
 */
dfcclResult_t req_tracker_sync(struct req_tracker *t, bool wait);

/*
 * A new req for an entry of `opcode`. With `handle`, the caller keeps a
 * reference for dfcclWait/dfcclTest (req_wait / req_test, then req_unref).
 */
struct req *req_new(unsigned opcode, dfcclCallback_t callback, void *user_arg, bool handle);

void req_unref(struct req *r);

/*
 * Submits entry e for r on q and lists r in t. On failure r is freed (the
 * handle's reference included) and the result returned. With `arm`, the
 * entry is posted unarmed for a GPU stream to arm (qp_submit_unarmed, which
 * fills *arm); else the CPU arms it at once.
 */
dfcclResult_t req_submit(struct req_tracker *t, struct qp *q, const struct dfccl_sqe *e, struct req *r,
                         struct qp_stream_arm *arm);

/* True once r is complete (its result then in r->result); never blocks. */
bool req_test(struct req *r);

/* Waits until r is complete and returns its result, with its sentence as
 * the calling thread's last error. */
dfcclResult_t req_wait(struct req *r);

/* The result of a complete req, with its sentence as the last error. */
dfcclResult_t req_result(const struct req *r);

#endif /* DFCCL_CLIENT_REQ_H */
