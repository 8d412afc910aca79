/*
 * The flight recorder: per communicator, the last N collectives of each rank
 * (operation, sequence number, count, type, algorithm, when it was submitted,
 * started and ended, how it ended), kept by the supervisor so it outlives
 * the clients, and the communicator itself for a while (`dfcclctl dump`).
 *
 * Nothing here is written by the engines or the clients: the watcher
 * (watch.h) fills the recorder from what it samples on its tick -- the
 * submission entries and completion words of the queue pairs, and the
 * posts of the communicator's region -- so every time is the first tick
 * that saw the event, and a collective that started and ended between two
 * ticks has no start time (-1). A recorder holds at most
 * flight-recorder-entries entries per rank; when a rank's ring is full its
 * oldest entry is overwritten.
 *
 * States: live (its communicator exists) -> gone (kept, at most
 * flight-recorder-keep of them, the oldest freed first).
 */
#ifndef DFCCLD_RECORDER_H
#define DFCCLD_RECORDER_H

#include <stdint.h>
#include <sys/types.h>

#include "dfccl.pb-c.h"
#include "dfccl_queue.h"

struct comm;

/* One collective of one rank. Times are ms since the communicator was
 * created, -1 until observed. */
struct rec_entry {
	uint32_t qp_id;     /* where the entry was submitted, with qp_seq its identity */
	uint64_t qp_seq;
	uint64_t seq;       /* the entry's comm_seq */
	uint64_t count;
	uint32_t peer;
	uint8_t opcode, dtype, algo;
	uint8_t ended;      /* status is valid */
	uint32_t status;    /* DFCCL_CQ_*; DFCCL_CQ_STATUS_COUNT_: ended, status overwritten unseen */
	int64_t submit_ms, start_ms, end_ms;
};

struct rec_member {
	uint32_t device;
	int32_t pid;
	uint64_t session_id;
};

struct recorder {
	struct recorder *next;
	uint64_t comm_id;
	uid_t uid;
	uint32_t nranks;
	uint64_t created_ms;  /* server_now_ms() of the communicator's creation */
	uint32_t cap;         /* entries per rank */
	struct rec_member *members;
	uint32_t *head;       /* per rank: next slot to write */
	uint32_t *used;       /* per rank: entries held */
	struct rec_entry *entries; /* [nranks][cap] */
	uint64_t missed;
	char state[16];
	char failure[1024];
	int gone;
};

struct recorder_table {
	struct recorder *list; /* newest first */
	uint32_t cap;          /* flight-recorder-entries */
	uint32_t keep;         /* flight-recorder-keep */
};

/* The recorder of c, created on first need (NULL when recording is off or
 * memory is short). Refreshes its copy of the members and the state. */
struct recorder *recorder_get(struct recorder_table *t, const struct comm *c);

/* The recorder of a communicator id, live or gone, or NULL. */
struct recorder *recorder_find(struct recorder_table *t, uint64_t comm_id);

/* The entry of the submission (qp_id, qp_seq) of `rank`, created from e
 * with submit time now_ms (absolute) when it is new. */
struct rec_entry *recorder_note(struct recorder *r, uint32_t rank, uint32_t qp_id, uint64_t qp_seq,
                                const struct dfccl_sqe *e, uint64_t now_ms);

/* The newest entry of `rank` for NCCL-style collective `seq`, or NULL. */
struct rec_entry *recorder_find_coll(struct recorder *r, uint32_t rank, uint64_t seq);

/* A time for an entry: ms since the communicator's creation. */
int64_t recorder_rel(const struct recorder *r, uint64_t now_ms);

/* Marks recorders whose communicator is no longer listed by is_live as
 * gone, and frees the gone ones beyond `keep`, oldest first. */
void recorder_sweep(struct recorder_table *t, int (*is_live)(void *arg, uint64_t comm_id), void *arg);

/* The recorder as a FlightDumpReply (allocates; free with recorder_dump_free). */
int recorder_dump(const struct recorder *r, uint32_t interval_ms, uint64_t now_ms, Dfccl__V1__FlightDumpReply *out);
void recorder_dump_free(Dfccl__V1__FlightDumpReply *out);

/* Writes the dump as JSON (the schema of `dfcclctl dump --json`) to
 * dir/comm-ID-UNIXTIME.json through a temporary file and a rename. Returns
 * 0 with the path, or a negative errno. */
int recorder_write(const struct recorder *r, uint32_t interval_ms, uint64_t now_ms, const char *dir, char *path,
                   size_t pathlen);

void recorder_table_free(struct recorder_table *t);

#endif
