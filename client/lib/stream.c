/*
 * Stream-ordered submission; see stream.h.
 */
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudrv.h"
#include "errors.h"

/* Before main, and so before the application can initialise CUDA: the
 * driver reads the variable once, when it starts. */
__attribute__((constructor)) static void stream_connections(void)
{
	setenv("CUDA_DEVICE_MAX_CONNECTIONS", STREAM_CUDA_CONNECTIONS, 0);
}

/* The settings of the environment, read once. */
static bool wait_on_device, groups_off;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static bool env_is(const char *name, const char *value)
{
	const char *v = getenv(name);
	return v && strcmp(v, value) == 0;
}

static void env_read(void)
{
	wait_on_device = env_is("DFCCL_STREAM_WAIT", "device");
	groups_off = env_is("DFCCL_GROUP_WAIT", "each");
}

bool stream_waits_on_device(void)
{
	pthread_once(&env_once, env_read);
	return wait_on_device;
}

bool stream_groups(void)
{
	pthread_once(&env_once, env_read);
	return !groups_off;
}

enum { BATCH_ARMS = 1, BATCH_WAITS = 2 };

/* The next item after i on i's stream, or b->n. */
static size_t stream_next(const struct stream_batch *b, size_t i)
{
	size_t j = i + 1;
	while (j < b->n && b->items[j].stream != b->items[i].stream)
		j++;
	return j;
}

/* How many items from i on (i's stream's, in order) arm entries that
 * follow one another in one queue pair: their arm words lie one entry
 * apart, and a copy of their sequence numbers arms them all. */
static unsigned arm_run(const struct stream_batch *b, size_t i)
{
	const struct stream_item *last = &b->items[i];
	unsigned run = 1;
	for (size_t j = stream_next(b, i); j < b->n; j = stream_next(b, j)) {
		const struct stream_item *it = &b->items[j];
		if (it->qp != last->qp || it->arm.seq != last->arm.seq + 1 ||
		    it->arm.arm_addr != last->arm.arm_addr + sizeof(struct dfccl_sqe))
			break;
		last = it;
		run++;
	}
	return run;
}

/* Whether item j may join the group of the stream's items that starts at
 * item i: the same queue pair, not finished, and less than half the queue
 * after i's entry (sqe_group's bound; other threads' entries may lie
 * between). */
static bool group_joins(const struct stream_batch *b, size_t i, size_t j)
{
	const struct stream_item *a = &b->items[i], *it = &b->items[j];
	return !it->ready && it->qp == a->qp && it->arm.seq - a->arm.seq < a->qp->entries / 2;
}

/* Finishes the entries of the items of [from, n) (qp_stream_ready) before
 * their arms are queued: each stream's items of one queue pair as a group
 * of the queue, whose last entry's wait covers the others' (in a row or
 * not: a group's calls on several streams interleave in the queue). */
static void batch_ready(struct stream_batch *b, size_t from)
{
	const bool groups = stream_groups();
	for (size_t i = from; i < b->n; i++) {
		if (b->items[i].ready)
			continue;
		unsigned members = 1;
		size_t last = i;
		if (groups)
			for (size_t j = stream_next(b, i); j < b->n && group_joins(b, i, j); j = stream_next(b, j)) {
				members++;
				last = j;
			}
		const uint64_t last_seq = b->items[last].arm.seq;
		for (size_t j = i;; j = stream_next(b, j)) {
			struct stream_item *it = &b->items[j];
			qp_stream_ready(it->qp, it->arm.seq, members > 1 ? last_seq : 0, members > 1 ? members : 0);
			it->ready = true;
			it->covered = j != last;
			if (j == last)
				break;
		}
	}
}

/* Queues on `stream`, in order, the arms of the items of [from, n) on it
 * (with BATCH_ARMS), then their waits (BATCH_WAITS), in one driver call
 * where they fit; the arms of STREAM_ARM_COPY_MIN or more entries in a row
 * as one copy of their sequence numbers (each entry's `seq`, the value its
 * arm takes, lies beside its `arm`). Returns 0, or -1 with the driver's
 * reason in cudrv_last_error. */
static int batch_queue(const struct stream_batch *b, size_t from, dfcclStream_t stream, int what)
{
	struct cudrv_stream_op ops[CUDRV_STREAM_OPS_MAX];
	unsigned k = 0, skip = 0;
	int device = 0;
	bool copies = true;
	for (int pass = BATCH_ARMS; pass <= BATCH_WAITS; pass++) {
		if (!(what & pass))
			continue;
		for (size_t i = from; i < b->n; i++) {
			const struct stream_item *it = &b->items[i];
			if (it->stream != stream || (pass == BATCH_WAITS && it->covered))
				continue;
			device = it->qp->ordinal;
			if (skip > 0) {
				skip--;
				continue;
			}
			unsigned run = pass == BATCH_ARMS && copies ? arm_run(b, i) : 1;
			if (run >= STREAM_ARM_COPY_MIN) {
				/* What is queued before it goes first, in order. */
				if (k > 0 && cudrv_stream_ops(stream, ops, k, device) < 0)
					return -1;
				k = 0;
				uintptr_t arm = it->arm.arm_addr;
				int rc = cudrv_stream_copy_words(stream, arm, arm + offsetof(struct dfccl_sqe, seq),
				                                 sizeof(struct dfccl_sqe), run, device);
				if (rc == 0) {
					skip = run - 1;
					continue;
				}
				if (rc != -ENOTSUP)
					return -1;
				copies = false; /* a driver without the copy: a write each */
			}
			ops[k++] = pass == BATCH_WAITS
			               ? (struct cudrv_stream_op){true, it->arm.cw_addr, DFCCL_CW_MAKE(it->arm.seq, 0)}
			               : (struct cudrv_stream_op){false, it->arm.arm_addr, it->arm.seq};
			if (k == CUDRV_STREAM_OPS_MAX) {
				if (cudrv_stream_ops(stream, ops, k, device) < 0)
					return -1;
				k = 0;
			}
		}
	}
	return k > 0 && cudrv_stream_ops(stream, ops, k, device) < 0 ? -1 : 0;
}

/* Whether item i is the first of [from, i] on its stream. */
static bool batch_first(const struct stream_batch *b, size_t from, size_t i)
{
	for (size_t j = from; j < i; j++)
		if (b->items[j].stream == b->items[i].stream)
			return false;
	return true;
}

/* stream_batch_arm, and with `wait` (when none was armed before) every
 * item's wait after the arms of its stream. */
static dfcclResult_t batch_arm(struct stream_batch *b, bool wait)
{
	dfcclResult_t r = dfcclSuccess;
	size_t from = b->armed;
	batch_ready(b, from);
	for (size_t i = from; i < b->n; i++) {
		if (!batch_first(b, from, i))
			continue;
		if (batch_queue(b, from, b->items[i].stream, wait ? BATCH_ARMS | BATCH_WAITS : BATCH_ARMS) == 0)
			continue;
		for (size_t j = from; j < b->n; j++)
			if (b->items[j].stream == b->items[i].stream)
				qp_arm(b->items[j].qp, b->items[j].arm.seq);
		if (r == dfcclSuccess)
			r = errors_set(dfcclUnhandledCudaError, "cannot queue a stream-ordered collective on its stream: %s; "
			               "it was started without waiting for the stream's earlier work, so its result may "
			               "be wrong: abort the communicator", cudrv_last_error());
	}
	b->armed = b->n;
	return r;
}

/* Queues every item's wait, stream by stream, once all are armed. */
static dfcclResult_t batch_wait(struct stream_batch *b)
{
	dfcclResult_t r = dfcclSuccess;
	for (size_t i = 0; i < b->n; i++) {
		if (!batch_first(b, 0, i) || batch_queue(b, 0, b->items[i].stream, BATCH_WAITS) == 0)
			continue;
		if (r == dfcclSuccess)
			r = errors_set(dfcclUnhandledCudaError, "cannot make the stream wait for its collective: %s; the "
			               "work queued after it may run before the collective completes",
			               cudrv_last_error());
	}
	return r;
}

bool stream_batch_crowded(const struct stream_batch *b, const struct qp *q)
{
	/* Fewer items not armed than that in all: no count (a group's every
	 * call asks, so counting each time made a group quadratic). */
	if (b->n - b->armed < q->entries / 2)
		return false;
	size_t on_q = 0;
	for (size_t i = b->armed; i < b->n; i++)
		on_q += b->items[i].qp == q;
	return on_q >= q->entries / 2;
}

dfcclResult_t stream_batch_arm(struct stream_batch *b)
{
	return batch_arm(b, false);
}

dfcclResult_t stream_batch_finish(struct stream_batch *b)
{
	if (b->n == 0)
		return dfcclSuccess;
	/* Arms and waits in one batch when the batch has one stream and none
	 * of its arms had to go ahead (a group larger than half a queue).
	 * With several streams every stream's arms are queued before any
	 * wait: streams that share a hardware queue then still arm all of
	 * the group before one of them waits. */
	bool together = b->armed == 0;
	for (size_t i = 1; together && i < b->n; i++)
		together = b->items[i].stream == b->items[0].stream;
	dfcclResult_t ra = batch_arm(b, together);
	dfcclResult_t rw = together ? dfcclSuccess : batch_wait(b);
	return ra != dfcclSuccess ? ra : rw;
}
