/*
 * See queue.h. The region is created in a memfd sealed against shrinking, so
 * a client that truncates it cannot make the engine fault on a mapping that
 * suddenly ends (growth is harmless and also sealed for simplicity).
 */
#include "queue.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void queue_header_init(struct dfccl_qp_header *h, uint32_t qp_id, uint32_t device, uint32_t sq_entries)
{
	memset(h, 0, sizeof(*h));
	h->magic = DFCCL_QP_MAGIC;
	h->abi_version = DFCCL_QUEUE_ABI_VERSION;
	h->header_size = DFCCL_QP_HEADER_SIZE;
	h->sqe_size = DFCCL_SQE_SIZE;
	h->cw_size = DFCCL_CW_SIZE;
	h->sq_entries = sq_entries;
	h->qp_id = qp_id;
	h->sq_offset = DFCCL_QP_SQ_OFFSET;
	h->cw_offset = DFCCL_QP_CW_OFFSET(sq_entries);
	h->region_size = DFCCL_QP_REGION_SIZE(sq_entries);
	h->device = device;
	h->engine_state = DFCCL_ENGINE_STOPPED;
	h->qp_state = DFCCL_QP_ACTIVE;
}

int queue_header_check(const struct dfccl_qp_header *h, size_t mapped, char *err, size_t errlen)
{
	if (mapped < sizeof(*h)) {
		snprintf(err, errlen, "queue region of %zu bytes is smaller than its header", mapped);
		return -EINVAL;
	}
	if (h->magic != DFCCL_QP_MAGIC) {
		snprintf(err, errlen, "queue region has a bad magic number (not a dfccl queue pair)");
		return -EPROTO;
	}
	if (h->abi_version != DFCCL_QUEUE_ABI_VERSION) {
		snprintf(err, errlen, "queue ABI version %u, this code speaks %u: update libdfccl and dfccld together",
		         h->abi_version, DFCCL_QUEUE_ABI_VERSION);
		return -EPROTO;
	}
	uint32_t n = h->sq_entries;
	if (h->header_size != DFCCL_QP_HEADER_SIZE || h->sqe_size != DFCCL_SQE_SIZE || h->cw_size != DFCCL_CW_SIZE ||
	    n < DFCCL_SQ_MIN_ENTRIES || n > DFCCL_SQ_MAX_ENTRIES || (n & (n - 1)) ||
	    h->sq_offset != DFCCL_QP_SQ_OFFSET || h->cw_offset != DFCCL_QP_CW_OFFSET(n) ||
	    h->region_size != DFCCL_QP_REGION_SIZE(n) || h->region_size > mapped) {
		snprintf(err, errlen, "queue region geometry is inconsistent (entries %u, region %llu bytes, mapped %zu)",
		         n, (unsigned long long)h->region_size, mapped);
		return -EINVAL;
	}
	return 0;
}

int queue_region_create(uint32_t qp_id, uint32_t device, uint32_t sq_entries, size_t *size)
{
	if (sq_entries < DFCCL_SQ_MIN_ENTRIES || sq_entries > DFCCL_SQ_MAX_ENTRIES || (sq_entries & (sq_entries - 1)))
		return -EINVAL;
	size_t sz = DFCCL_QP_REGION_SIZE(sq_entries);
	int fd = memfd_create("dfccl-qp", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	int rc = 0;
	if (ftruncate(fd, (off_t)sz) < 0) {
		rc = -errno;
		goto fail;
	}
	void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		goto fail;
	}
	queue_header_init(p, qp_id, device, sq_entries);
	munmap(p, sz);
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		rc = -errno;
		goto fail;
	}
	*size = sz;
	return fd;
fail:
	close(fd);
	return rc;
}

/* The low half of the 64-bit counter: the futex word (little-endian). */
static uint32_t *completed_word(const struct dfccl_qp_header *h)
{
	return (uint32_t *)&h->completed;
}

void queue_wake_waiters(struct dfccl_qp_header *h)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit((_Atomic uint32_t *)&h->waiters, memory_order_relaxed) == 0)
		return;
	/* Shared futex: the region is mapped by other processes. */
	syscall(SYS_futex, completed_word(h), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

uint32_t queue_completion_mark(const struct dfccl_qp_header *h)
{
	return atomic_load_explicit((_Atomic uint32_t *)completed_word(h), memory_order_acquire);
}

void queue_wait_completion(struct dfccl_qp_header *h, uint32_t mark, uint64_t timeout_ns)
{
	struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000u), .tv_nsec = (long)(timeout_ns % 1000000000u)};
	syscall(SYS_futex, completed_word(h), FUTEX_WAIT, mark, &ts, NULL, 0);
}

const char *queue_engine_state_name(uint32_t state)
{
	switch (state) {
	case DFCCL_ENGINE_STOPPED: return "stopped";
	case DFCCL_ENGINE_POLLING: return "polling";
	case DFCCL_ENGINE_SLEEPING: return "sleeping";
	case DFCCL_ENGINE_DEAD: return "dead";
	default: return "unknown";
	}
}

const char *queue_status_string(uint32_t status)
{
	static const char *const s[DFCCL_CQ_STATUS_COUNT_] = {
	    [DFCCL_CQ_OK] = "completed",
	    [DFCCL_CQ_BAD_OPCODE] = "unknown operation code in the submission entry",
	    [DFCCL_CQ_BAD_DTYPE] = "unknown data type in the submission entry",
	    [DFCCL_CQ_BAD_REDOP] = "unknown reduction operation in the submission entry",
	    [DFCCL_CQ_BAD_REG] = "unknown buffer registration (not registered by this session)",
	    [DFCCL_CQ_OUT_OF_RANGE] = "buffer offset and size fall outside the registered range",
	    [DFCCL_CQ_BAD_COMM] = "unknown communicator, or this session is not a member",
	    [DFCCL_CQ_BAD_ENTRY] = "inconsistent submission entry",
	    [DFCCL_CQ_PEER_LOST] = "a peer rank of the communicator was lost",
	    [DFCCL_CQ_ABORTED] = "the communicator was aborted",
	    [DFCCL_CQ_DEVICE_LOST] = "the daemon's worker for this device died",
	    [DFCCL_CQ_TIMEOUT] = "the collective timed out",
	    [DFCCL_CQ_NOT_SUPPORTED] = "operation not supported by the daemon's engine",
	    [DFCCL_CQ_MISMATCH] = "the ranks disagree on this collective (count, type, operation, root or algorithm)",
	    [DFCCL_CQ_LIMIT] = ("this client already has as many collectives in the device's engine as dfccld allows "
	                        "(setting max-inflight-per-session); wait for some to complete before submitting more"),
	    [DFCCL_CQ_LIMIT_UID] = ("this user's clients already have as many collectives in the device's engine as dfccld "
	                            "allows one user (setting max-inflight-per-uid); wait for some to complete before "
	                            "submitting more"),
	};
	if (status >= DFCCL_CQ_STATUS_COUNT_)
		return "unknown completion status";
	return s[status];
}

const char *queue_op_name(uint32_t opcode)
{
	static const char *const names[DFCCL_OP_COUNT_] = {
	    [DFCCL_OP_NOP] = "NOP",
	    [DFCCL_OP_ALLREDUCE] = "AllReduce",
	    [DFCCL_OP_ALLGATHER] = "AllGather",
	    [DFCCL_OP_REDUCESCATTER] = "ReduceScatter",
	    [DFCCL_OP_BROADCAST] = "Broadcast",
	    [DFCCL_OP_REDUCE] = "Reduce",
	    [DFCCL_OP_SEND] = "Send",
	    [DFCCL_OP_RECV] = "Recv",
	};
	return opcode < DFCCL_OP_COUNT_ ? names[opcode] : "unknown operation";
}

const char *queue_dtype_name(uint32_t dtype)
{
	/* Indexed by dfcclDataType_t (client/include/dfccl.h). */
	static const char *const names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
	                                    "uint64",  "float16", "float32", "float64", "bfloat16"};
	return dtype < sizeof(names) / sizeof(names[0]) ? names[dtype] : "unknown type";
}

const char *queue_algo_name(uint32_t algo)
{
	static const char *const names[DFCCL_ALGO_COUNT_] = DFCCL_ALGO_NAMES;
	return algo < DFCCL_ALGO_COUNT_ ? names[algo] : "unknown algorithm";
}
