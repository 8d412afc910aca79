/*
 * Stream-ordered submission: the stream operations of a set of entries
 * posted unarmed (qp_submit_unarmed) for their GPU streams to arm.
 *
 * Model. For each entry, its stream gets a write that arms it (after the
 * work queued on the stream before) and a wait for its completion word (the
 * work queued after waits for it). A batch collects the entries of one
 * call, or of one group: each stream arms all of its entries, then waits
 * for all of them (one driver call where they fit, with one stream; with
 * several, every stream's arms go before any stream's waits), so the
 * daemon sees a group's entries together. A stream's entries in a row of
 * one queue pair are armed by one copy of their sequence numbers into
 * their arm words (STREAM_ARM_COPY_MIN); a stream's entries of one queue
 * pair, in a row or not, are waited for once: they are posted as a group
 * of the queue (DFCCL_SQE_F_GROUP), whose last completion word the daemon
 * writes only once all of them completed, and the stream waits for that
 * word alone (a wait costs the GPU about 1 us; stream_groups). A batch
 * larger than half a queue arms what it has before it posts more
 * (stream_batch_crowded), since a later entry's slot may be held by an
 * earlier one that only its arm can complete.
 *
 * Streams and the GPU's hardware queues. The driver maps streams onto a
 * number of hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set)
 * and a queue runs its work in submission order. A wait for a collective
 * stalls its queue, and with it the work of every other stream mapped there,
 * arms included: streams that carry collectives in different orders on
 * different ranks complete only while each of them has a queue of its own.
 * So the library raises the default to 16 when the process starts, unless
 * the environment sets it. Not more: under MPS the connections of every
 * client of a GPU come from one pool, and on the H100 four clients of 32
 * (or eight of 16) already failed to create their contexts, while four of
 * 16 and eight of 8 worked.
 */
#ifndef DFCCL_CLIENT_STREAM_H
#define DFCCL_CLIENT_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "dfccl.h"
#include "qp.h"

struct stream_batch {
	struct stream_item {
		dfcclStream_t stream;
		struct qp *qp;
		struct qp_stream_arm arm; /* filled by qp_submit_unarmed */
		bool ready;   /* its entry is finished (qp_stream_ready) */
		bool covered; /* its wait is its group's last entry's */
	} *items;     /* room for every entry the batch may get */
	size_t n;     /* entries posted */
	size_t armed; /* items[0..armed) have their arms queued (or were armed by the CPU) */
};

/* Whether posting one more entry on q could wait for a slot whose entry is
 * among the items not armed yet: then arm them first (stream_batch_arm). */
bool stream_batch_crowded(const struct stream_batch *b, const struct qp *q);

/*
 * Queues the arms of every item not armed yet, stream by stream. A stream
 * the driver refuses gets its entries armed by the CPU instead, so that
 * the peers' halves never wait for them; the result then says that those
 * collectives ran without waiting for the stream's earlier work.
 */
dfcclResult_t stream_batch_arm(struct stream_batch *b);

/* Ends the batch: arms what is not armed yet and queues every wait, in one
 * driver call per stream when nothing was armed before. */
dfcclResult_t stream_batch_finish(struct stream_batch *b);

/*
 * Whether streams wait on device completion words (client_stream_words)
 * rather than on the queue region's completion words in host memory:
 * DFCCL_STREAM_WAIT=device, read once; any other value, or none, is the
 * default, host. Device words save 1.5-2.5 us per small stream-ordered
 * all-reduce; when a GPU's worker dies their streams are released by its
 * replacement, or, where none comes, by a copy on a stream of this process
 * (qp_stream_words), which can wait behind one of those very streams where
 * the two share a hardware queue. The region's words are released by the
 * supervisor alone.
 */
bool stream_waits_on_device(void);

/* Whether a batch's entries in a row are posted as a group of the queue
 * and waited for once (the default), rather than each waited for:
 * DFCCL_GROUP_WAIT=each, read once, asks for the latter (the daemon's
 * groups side by side with a wait per entry). */
bool stream_groups(void);

/* The CUDA_DEVICE_MAX_CONNECTIONS this library asks for when the
 * environment names none. */
#define STREAM_CUDA_CONNECTIONS "16"

/* Entries in a row (one stream, one queue pair) from which a group arms
 * them with one copy instead of a stream write each: on an H200 the GPU
 * took 0.76 us for each write to host memory, 3-5 us for a copy of 1 to
 * 150 words (tests/perf/RESULTS.md, twenty-ninth run). */
#define STREAM_ARM_COPY_MIN 8u

#endif /* DFCCL_CLIENT_STREAM_H */
