/*
 * The client side of a queue pair (proto/dfccl_queue.h): mapping the region
 * the daemon handed over, submitting entries, and waiting for their
 * completion words.
 *
 * A struct qp is one mapped region plus its doorbell eventfd. Any number of
 * threads may submit to it at once: sequence numbers are reserved with an
 * atomic increment of sq_tail, and each submission owns its slot until its
 * completion status has been read. The completion word alone cannot say
 * that: the next lap's entry overwrites it as soon as the engine completes
 * that entry. So each submission carries a ticket, and the process keeps,
 * per slot, the ticket of its occupant and the last sequence number whose
 * status was read ("reaped"). A slot is free for entry s once entry s - n is
 * reaped. Whoever sees the occupant's completion first (the waiting owner,
 * or a submitter that needs the slot) moves its status into the ticket, so
 * a thread that waits for a slot held by its own earlier entry (a group
 * larger than the queue) still makes progress. Nothing here talks to the
 * daemon's socket; the owner (the client session) passes a flag that says
 * when the connection is gone, so that a wait never outlives the daemon.
 *
 * Every engine submits and waits through this module: the host engine's
 * collectives now, and the same entry points for the CUDA engine later.
 * Functions return dfcclSuccess or a result with the thread's last error set.
 */
#ifndef DFCCL_CLIENT_QP_H
#define DFCCL_CLIENT_QP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dfccl.h"
#include "dfccl_queue.h"

/* One submission in flight; owned by the submitter until qp_wait returns. */
struct qp_ticket {
	uint64_t seq;     /* queue sequence number */
	uint32_t status;  /* DFCCL_CQ_*, valid once done */
	int done;         /* atomic: status captured, slot released */
	int abandoned;    /* atomic: given up by qp_abandon (never completes) */
};

/*
 * How long a waiter spins before it sleeps (qp_backoff). A host engine needs
 * the CPU that a spinning waiter would take (CI machines run eight ranks on
 * two cores); the spin covers a small collective, and the engine wakes a
 * sleeper right after it completes an entry. A GPU's daemon kernel needs no
 * CPU of the clients, and its worker looks for completions to wake sleepers
 * only every 20 us (CE_RUNNING_PAUSE_NS), after which the futex wake-up
 * takes its own time: there a waiter spins up to a millisecond, as CUDA's
 * own synchronisation spins by default where cores allow.
 */
#define QP_SPIN_NS 50000ull
#define QP_SPIN_GPU_NS 1000000ull

struct qp {
	struct dfccl_qp_header *hdr;
	struct dfccl_sqe *sq;
	uint64_t *cw;
	size_t size;       /* bytes mapped */
	uint32_t entries;  /* n, a power of two */
	uint32_t device;   /* the daemon's device index */
	uint64_t spin_ns;  /* QP_SPIN_NS, or QP_SPIN_GPU_NS on the CUDA engine: set before anyone waits */
	int ordinal;       /* the CUDA ordinal of that device in this process, for driver calls (-1: none) */
	uint32_t qp_id;
	int doorbell;      /* eventfd the engine sleeps on */
	const int *lost;   /* nonzero once the owner's connection to the daemon is gone */
	struct qp_ticket **tickets; /* [entries], atomic: the occupant of each slot */
	uint64_t *reaped;  /* [entries], atomic: last sequence number of each slot whose status was read */
	uintptr_t dev_base; /* atomic: the region's address for GPU streams once registered (0: not yet) */
	pthread_mutex_t stream_lock; /* serialises that registration */
	/* The device completion words (qp_stream_words): entries x 8 bytes of
	 * device memory where the engine stores a stream-ordered entry's
	 * completion word too (DFCCL_SQE_F_DEVICE_DONE), for its stream to
	 * wait on. */
	uintptr_t words;       /* atomic: their address (0: none; streams wait on the region's words) */
	uint32_t words_reg;    /* their registration */
	bool words_tried;      /* atomic: client_stream_words asked for them (set under the client's attach lock) */
	bool words_released;   /* the watch copied the region's words over them since the worker died */
	uint64_t words_dead_ns; /* when the watch first saw the worker dead (0: alive); both guarded
	                         * by the watch's lock */
	struct qp *words_next; /* the watch's list */
};

/*
 * Maps a queue-pair region. Takes ownership of both descriptors: on success
 * the memfd is closed (the mapping keeps the memory) and the doorbell is
 * kept; on failure both are closed. `lost` must outlive the qp; it is read
 * atomically while waiting. The ordinal starts as the device index; the
 * caller sets it before anyone uses the qp.
 */
dfcclResult_t qp_map(int memfd, int doorbell, uint64_t region_size, uint32_t device, const int *lost,
                     struct qp **out);

void qp_free(struct qp *q);

/*
 * Submits a copy of `e` (its seq and arm fields are ignored) under ticket t.
 * Blocks while the entry's slot is still held by the entry one lap earlier.
 * After success the caller must qp_wait on t before t goes away.
 */
dfcclResult_t qp_submit(struct qp *q, const struct dfccl_sqe *e, struct qp_ticket *t);

/* Arms entry seq of q from the CPU (and rings the doorbell if the engine
 * sleeps): the entry was posted with qp_submit_unarmed (and finished,
 * qp_stream_ready). */
void qp_arm(struct qp *q, uint64_t seq);

/*
 * Stream-ordered submission. qp_submit_unarmed posts a copy of e with
 * DFCCL_SQE_F_STREAM_ARMED and leaves it unarmed and unfinished: the
 * caller finishes it (qp_stream_ready), then makes a GPU
 * stream write arm->seq to arm->arm_addr after the work queued before, and
 * wait until the word at arm->cw_addr is at least
 * DFCCL_CW_MAKE(arm->seq, 0) before the work queued after (cudrv.h). The
 * first such call registers the region with the CUDA driver. The ticket is
 * tracked as qp_submit's. Call qp_wait_free first: the slot of an entry
 * must come free through a stream that arms an earlier one, which may
 * never happen.
 */
struct qp_stream_arm {
	uint64_t seq;
	uintptr_t arm_addr; /* device address of the entry's arm word */
	uintptr_t cw_addr;  /* device address of its completion word */
};

dfcclResult_t qp_submit_unarmed(struct qp *q, const struct dfccl_sqe *e, struct qp_ticket *t,
                                struct qp_stream_arm *arm);

/*
 * Finishes the entry of `seq`, posted by qp_submit_unarmed, before its arm
 * is queued (or stored by the CPU): with group_n, one of the group of
 * group_n entries whose last is group_last (DFCCL_SQE_F_GROUP: the daemon
 * writes the last's completion word only once all of them completed);
 * then its seq_check, so that an engine that copies the entry with its arm
 * copies these fields too.
 */
void qp_stream_ready(struct qp *q, uint64_t seq, uint64_t group_last, uint32_t group_n);

/*
 * Gives q device completion words: `words`, q->entries 8-byte words of
 * device memory registered as reg_id (at offset 0), which this zeroes.
 * From then on qp_submit_unarmed's entries carry DFCCL_SQE_F_DEVICE_DONE
 * and their streams wait there (a stream's wait on device memory notices
 * a late word sooner than one on host memory). A process-wide watch then
 * looks at q every QP_WORDS_WATCH_MS: once the daemon's worker for q
 * died, the supervisor has failed the pending entries in the region's
 * words only. The worker that replaces it stores those failures into the
 * device words before it serves q; where none has within
 * QP_WORDS_GRACE_MS of the death, the watch copies the region's words
 * over the device words itself, and the streams waiting there go on
 * (once per death of a worker).
 */
#define QP_WORDS_WATCH_MS 20
#define QP_WORDS_GRACE_MS 3000
dfcclResult_t qp_stream_words(struct qp *q, void *words, uint32_t reg_id);

/* In a forked child: the watch's thread and lock are the parent's, and the
 * inherited queue pairs are not the child's to watch. */
void qp_words_after_fork(void);

/*
 * Waits until the next entry's slot is free, without taking it, for at most
 * wait_ms (0: as long as the queue pair lives): an entry whose stream never
 * arms it, or an engine that stopped taking entries, then ends in
 * dfcclTimeout with a sentence, and nothing was posted. Another thread may
 * take the slot meanwhile; the submission then waits as qp_submit does.
 */
dfcclResult_t qp_wait_free(struct qp *q, uint64_t wait_ms);

/* How long a stream-ordered submission waits for a free slot:
 * DFCCL_QUEUE_WAIT_MS, else QP_QUEUE_WAIT_MS_DEFAULT. */
#define QP_QUEUE_WAIT_MS_DEFAULT 60000ull
uint64_t qp_queue_wait_ms(void);

/* Waits for the entry of ticket t to complete; its DFCCL_CQ_* status is then
 * in t->status. */
dfcclResult_t qp_wait(struct qp *q, struct qp_ticket *t);

/* qp_wait for at most wait_ms (0: as long as the queue pair lives), then
 * dfcclTimeout with a sentence, and t given up (qp_abandon). */
dfcclResult_t qp_wait_for(struct qp *q, struct qp_ticket *t, uint64_t wait_ms);

/* True once the entry of ticket t completed (its status is in t->status);
 * never blocks. Reads the completion word, so it also frees the slot. */
bool qp_test(struct qp *q, struct qp_ticket *t);

/*
 * Gives up on ticket t (its queue pair or connection died): after this the
 * queue never writes into t. True if t was taken out of its slot before it
 * completed; false if it completed meanwhile (t->status is then valid). An
 * abandoned entry's slot is freed once the engine completes it anyway.
 */
bool qp_abandon(struct qp *q, struct qp_ticket *t);

/*
 * How every waiter of libdfccl waits: QP_SPINS polls with a pause (and
 * for QP_SPIN_NS at least), then
 * sleeps that double from 1 us to 1 ms, so a waiter costs nothing on a
 * machine with fewer cores than ranks. Start from QP_BACKOFF_INIT; start
 * again after progress.
 */
/*
 * Waiting for completions: spin a little, then sleep on the queue pair's
 * completion futex (the engine wakes sleepers right after it completes an
 * entry; see dfccl_queue.h), or, without a queue pair to sleep on, with a
 * doubling delay. Use as
 *     struct qp_backoff b = QP_BACKOFF_ON(q);
 *     while (!done()) qp_backoff_pause(&b);
 *     qp_backoff_end(&b);
 * The pause takes the futex mark before the caller's next check, so a
 * completion between the check and the sleep is never missed.
 */
struct qp_backoff {
	unsigned spins;
	uint64_t spin_until; /* CLOCK_MONOTONIC ns when spinning ends (0: not started) */
	uint64_t delay_ns;
	struct qp *q;       /* the queue pair whose completions end the wait, or NULL */
	uint32_t mark;      /* futex value seen before the caller's last check */
	bool waiting;       /* counted in q's waiters */
	uint64_t spin_ns;   /* how long to spin: 0, q's spin_ns (QP_SPIN_NS without q); a waiter on
	                     * several queue pairs sets the longest of theirs */
};

#define QP_BACKOFF_INIT {0, 0, 0, NULL, 0, false, 0}
#define QP_BACKOFF_ON(qp) {0, 0, 0, (qp), 0, false, 0}

void qp_backoff_pause(struct qp_backoff *b);

/* Ends a wait (leaves the queue pair's waiters); call once the condition
 * holds or the wait is abandoned. Harmless when nothing slept. */
void qp_backoff_end(struct qp_backoff *b);

/* Starts the spinning over (progress was made) without leaving the waiters. */
void qp_backoff_reset(struct qp_backoff *b);

/* True once the spinning is over (a good time for slower checks). */
bool qp_backoff_sleeping(const struct qp_backoff *b);

/* Tells the supervisor this client is alive and polling. */
void qp_heartbeat(struct qp *q);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t qp_now_ns(void);

/* The result for a completion status of an entry of `opcode`; sets the last
 * error for every status but DFCCL_CQ_OK. */
dfcclResult_t qp_status_result(uint32_t status, unsigned opcode);

/* Submit, wait and map in one call. */
dfcclResult_t qp_run(struct qp *q, const struct dfccl_sqe *e);

/* "AllReduce", "Send", ... for an opcode. */
const char *qp_op_name(unsigned opcode);

/* The result that stops a wait on this queue pair now (the worker died,
 * the queue was closed, the connection is gone), or dfcclSuccess. */
dfcclResult_t qp_health(const struct qp *q);

#endif /* DFCCL_CLIENT_QP_H */
