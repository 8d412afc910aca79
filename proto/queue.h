/*
 * Helpers around the queue-pair ABI (dfccl_queue.h) that every party needs:
 * the supervisor creates and initialises a region, the worker and the client
 * check a region they were handed before trusting any offset in it.
 */
#ifndef DFCCL_QUEUE_HELPERS_H
#define DFCCL_QUEUE_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "dfccl_queue.h"

/* Writes a fresh header for a region of DFCCL_QP_REGION_SIZE(sq_entries)
 * bytes (the rest of the region must be zero, as a new memfd is). */
void queue_header_init(struct dfccl_qp_header *h, uint32_t qp_id, uint32_t device, uint32_t sq_entries);

/*
 * Checks that a mapped region of `mapped` bytes carries a header this code
 * understands and that every offset stays inside the mapping. Returns 0, or
 * -EPROTO (magic or ABI version), -EINVAL (geometry) with a sentence in err.
 */
int queue_header_check(const struct dfccl_qp_header *h, size_t mapped, char *err, size_t errlen);

/*
 * Creates a memfd holding an initialised region. Returns the descriptor
 * (close-on-exec, sealed against shrinking) or a negative errno; *size gets
 * the region size.
 */
int queue_region_create(uint32_t qp_id, uint32_t device, uint32_t sq_entries, size_t *size);

/* Engine and supervisor side, after incrementing `completed`: wakes the
 * client threads sleeping on it, if any (a system call only then). */
void queue_wake_waiters(struct dfccl_qp_header *h);

/* Client side: the futex value to sleep on (the low 32 bits of `completed`). */
uint32_t queue_completion_mark(const struct dfccl_qp_header *h);

/*
 * Client side: sleeps until `completed` moves past `mark` or timeout_ns
 * passes (the caller has incremented `waiters` before taking the mark).
 * Returns at once if it already moved.
 */
void queue_wait_completion(struct dfccl_qp_header *h, uint32_t mark, uint64_t timeout_ns);

/* Human name of an engine_state value ("polling", "sleeping", ...). */
const char *queue_engine_state_name(uint32_t state);

/* Human sentence for a completion status (DFCCL_CQ_*). */
const char *queue_status_string(uint32_t status);

/* Names of an opcode ("AllReduce"), a data type ("float32") and an
 * algorithm ("ring"), for messages and dfcclctl. */
const char *queue_op_name(uint32_t opcode);
const char *queue_dtype_name(uint32_t dtype);
const char *queue_algo_name(uint32_t algo);

#endif
