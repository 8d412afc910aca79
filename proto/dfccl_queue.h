/*
 * The shared-memory queue-pair ABI between libdfccl and a dfccld engine.
 *
 * One queue-pair region exists per (session, device). The daemon's supervisor
 * creates it in a memfd, initialises the header, and passes the descriptor to
 * the client (with the AttachReply) and to the worker that owns the device.
 * Three parties therefore map it: the client process (CPU, and later the
 * client's GPU stream through cuStreamWriteValue/WaitValue on host-registered
 * memory), the engine in the worker (CPU threads of the host engine, or the
 * daemon kernel reading host-mapped memory), and the supervisor (only to mark
 * the queue dead when the worker dies).
 *
 * Layout of a region (all offsets from the start of the memfd):
 *
 *   [0, 512)                 struct dfccl_qp_header
 *   [sq_offset, +n*128)      n submission entries (struct dfccl_sqe)
 *   [cw_offset, +n*8)        n completion words, one per submission slot
 *
 * No pointer ever crosses the boundary: buffers are named by registration id
 * and offset, communicators by id. Everything here is plain fixed-width
 * integers so that the same header compiles as C11, C++ and CUDA C++.
 *
 * Submission protocol (client side):
 *   1. Take the next sequence number s = ++sq_tail (s starts at 1). The entry
 *      lives in slot (s - 1) & (n - 1). The slot is free once the previous
 *      occupant (s - n) completed AND its owner has read its completion word
 *      (or s <= n): the next occupant's completion overwrites the word, so a
 *      client must not reuse a slot whose status nobody has read yet. That
 *      bookkeeping is the client's own; the engine needs none of it.
 *   2. Write every field of the entry except `arm`, with `seq` = s, and
 *      last `seq_check` = s's low 32 bits.
 *   3. Arm it: store `arm` = s with release ordering. A stream-ordered call
 *      instead lets its GPU stream write `arm` = s after the work before it.
 *   4. If `engine_state` is not DFCCL_ENGINE_POLLING, ring the doorbell
 *      eventfd. Steps 3 and 4 need a full barrier between them (a seq_cst
 *      store of `arm` and a seq_cst load of `engine_state` will do): the
 *      engine stores SLEEPING, then re-reads the arm words, so one of the two
 *      sides always sees the other.
 * Engine side: scan slots of sequence numbers (sq_head, sq_tail]; an entry is
 * ready when arm == seq == its expected sequence. The engine copies the entry
 * before it checks it: after it saw the arm word, or in the same read, in
 * which case it takes the copy only where seq_check agrees as well (each
 * 64-byte line of the entry is read whole; the client stores the line
 * holding seq_check before it arms). It takes ready entries in any order, so an unarmed
 * entry never blocks an armed one behind it. sq_head is the lowest sequence
 * number not yet taken. The engine may also store s + 2^62 into the `arm` of
 * a posted entry s that is not armed yet (with a compare-and-swap that only
 * replaces an earlier lap's value): a GPU engine's launch gate, which waits for arm >= s, opened
 * by the engine itself; the value is not s, so the entry stays unarmed until
 * the client's own arm overwrites it. Clients never read `arm`.
 * Completion: the engine writes the slot's completion word once, as a single
 * 64-bit store, DFCCL_CW_MAKE(seq, status); then it increments `completed`,
 * and if `waiters` is nonzero (read after a full barrier) it wakes the
 * futex on the low 32 bits of `completed`. A client thread that wants to
 * sleep increments `waiters`, reads `completed`, checks its entries once
 * more, and sleeps on that futex value: a completion after the read changes
 * the value, one before it is seen by the check, so no wake-up is lost.
 * Per slot the word only grows (seq grows with each lap), so a GPU stream can
 * wait on it with a 64-bit ">=" against DFCCL_CW_MAKE(seq, 0).
 */
#ifndef DFCCL_QUEUE_H
#define DFCCL_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__cplusplus)
#define DFCCL_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define DFCCL_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* Functions of the ABI headers compile for the host and, under nvcc, for
 * the GPU too. */
#if !defined(DFCCL_HD)
#if defined(__CUDACC__)
#define DFCCL_HD __host__ __device__
#else
#define DFCCL_HD
#endif
#endif

#define DFCCL_QP_MAGIC 0x3130505143434644ull /* "DFCCQP01" little-endian */
/* 2: DFCCL_SQE_F_DEVICE_DONE, which a version-1 engine refuses while its
 * stream would wait for a word nobody stores. 3: DFCCL_SQE_F_GROUP, whose
 * stream waits for its group's last word alone. */
#define DFCCL_QUEUE_ABI_VERSION 3u

#define DFCCL_CACHE_LINE 64u
#define DFCCL_QP_HEADER_SIZE 512u
#define DFCCL_SQE_SIZE 128u
#define DFCCL_CW_SIZE 8u
#define DFCCL_SQ_MIN_ENTRIES 16u
#define DFCCL_SQ_MAX_ENTRIES 65536u

/* engine_state: written by the engine, read by the client before ringing. */
enum dfccl_engine_state {
	DFCCL_ENGINE_STOPPED = 0,  /* not started yet */
	DFCCL_ENGINE_POLLING = 1,  /* actively scanning: no doorbell needed */
	DFCCL_ENGINE_SLEEPING = 2, /* idle: ring the doorbell after arming */
	DFCCL_ENGINE_DEAD = 3,     /* the worker died; set by the supervisor */
};

/* qp_state: lifecycle of the queue pair as a whole. */
enum dfccl_qp_state {
	DFCCL_QP_ACTIVE = 0,
	DFCCL_QP_CLOSED = 1, /* session ended; engine stops reading */
	DFCCL_QP_DEAD = 2,   /* worker died: every pending entry has failed */
};

/* Operation codes of a submission entry. */
enum dfccl_opcode {
	DFCCL_OP_NOP = 0, /* completes at once: used to probe the queue */
	DFCCL_OP_ALLREDUCE = 1,
	DFCCL_OP_ALLGATHER = 2,
	DFCCL_OP_REDUCESCATTER = 3,
	DFCCL_OP_BROADCAST = 4,
	DFCCL_OP_REDUCE = 5,
	DFCCL_OP_SEND = 6,
	DFCCL_OP_RECV = 7,
	DFCCL_OP_COUNT_ = 8 /* first invalid opcode */
};

/*
 * Algorithms a collective may be forced to use (sqe.algo, the daemon's
 * `algo` setting, DFCCL_ALGO for libdfccl): one numbering and one set of
 * names for all of them.
 */
enum dfccl_algo {
	DFCCL_ALGO_AUTO = 0,      /* the engine chooses */
	DFCCL_ALGO_DIRECT = 1,    /* one-shot / two-shot over peers' buffers */
	DFCCL_ALGO_RING = 2,
	DFCCL_ALGO_TREE = 3,      /* one balanced binary tree */
	DFCCL_ALGO_MULTITREE = 4, /* several trees, each over a part of the data */
	DFCCL_ALGO_COUNT_ = 5
};

#define DFCCL_ALGO_NAMES {"auto", "direct", "ring", "tree", "multitree"}

/* The enum dfccl_algo value of a name, or -1. */
static inline int dfccl_algo_parse(const char *name)
{
	static const char *const names[] = DFCCL_ALGO_NAMES;
	for (int i = 0; name && i < DFCCL_ALGO_COUNT_; i++) {
		const char *a = names[i], *b = name;
		while (*a && *a == *b)
			a++, b++;
		if (*a == *b)
			return i;
	}
	return -1;
}

/* sqe.flags */
#define DFCCL_SQE_F_INPLACE 0x1u     /* send and recv name the same range */
#define DFCCL_SQE_F_REGISTERED 0x2u  /* a registered collective: coll_id + run */
#define DFCCL_SQE_F_PRIORITY 0x4u    /* `priority` is meaningful */
#define DFCCL_SQE_F_STREAM_ARMED 0x8u /* armed by a GPU stream, not the CPU */
/* The completion word goes to the 8 bytes at (done_reg, done_off) too,
 * first, with the same release, and from the GPU engine only (the host
 * engine refuses the entry with DFCCL_CQ_NOT_SUPPORTED): a GPU stream
 * waits there (libdfccl with DFCCL_STREAM_WAIT=device). A stream's wait
 * on device memory notices a word that comes 20-30 us after the wait
 * began 4-6 us sooner than one on host memory (tests/perf/stream_wait.cu).
 * The engine stores the word whatever else is wrong with the entry, as
 * long as it names a word of the session's own registrations. Per slot
 * the client's words grow as the queue's do, so the same ">=" wait
 * works. */
#define DFCCL_SQE_F_DEVICE_DONE 0x10u
/* One of a group of group_n entries of this queue pair, the last of which
 * is group_last and the others before it by less than half the queue
 * (not necessarily in a row: a stream's entries among another stream's),
 * each carrying the same group_last and group_n (1 <= group_n <= half the
 * queue's entries): the engine writes every entry's completion word as
 * usual but the last one's, which it writes (with the last entry's own
 * status) only once every entry of the group has completed, so that a
 * GPU stream waits for a whole group of stream-ordered calls with one
 * wait. An entry whose group fields do not hold is refused
 * (DFCCL_CQ_BAD_ENTRY) and counts for no group; a group some of whose
 * entries never come (a client that never arms one) never completes its
 * last word. The group's count lives with the engine (a word per slot of
 * a last entry), so the client sets the fields before it arms the
 * entries and never again. */
#define DFCCL_SQE_F_GROUP 0x20u

/* Completion status in the low 16 bits of a completion word. */
enum dfccl_cq_status {
	DFCCL_CQ_OK = 0,
	DFCCL_CQ_BAD_OPCODE = 1,
	DFCCL_CQ_BAD_DTYPE = 2,
	DFCCL_CQ_BAD_REDOP = 3,
	DFCCL_CQ_BAD_REG = 4,      /* unknown registration id, or not this session's */
	DFCCL_CQ_OUT_OF_RANGE = 5, /* offset + bytes outside the registered range */
	DFCCL_CQ_BAD_COMM = 6,     /* unknown communicator, or not a member */
	DFCCL_CQ_BAD_ENTRY = 7,    /* inconsistent fields (seq, flags, counts) */
	DFCCL_CQ_PEER_LOST = 8,
	DFCCL_CQ_ABORTED = 9,
	DFCCL_CQ_DEVICE_LOST = 10,
	DFCCL_CQ_TIMEOUT = 11,
	DFCCL_CQ_NOT_SUPPORTED = 12,
	DFCCL_CQ_MISMATCH = 13,    /* the ranks' entries disagree (count, operation, type, root, algorithm) */
	DFCCL_CQ_LIMIT = 14,       /* the session has max-inflight-per-session collectives in the engine already */
	DFCCL_CQ_LIMIT_UID = 15,   /* the session's uid has max-inflight-per-uid collectives in the engine already */
	DFCCL_CQ_STATUS_COUNT_ = 16
};

#define DFCCL_CW_STATUS_BITS 16u
#define DFCCL_CW_MAKE(seq, status) \
	(((uint64_t)(seq) << DFCCL_CW_STATUS_BITS) | ((uint64_t)(status)&0xffffu))
#define DFCCL_CW_SEQ(word) ((uint64_t)(word) >> DFCCL_CW_STATUS_BITS)
#define DFCCL_CW_STATUS(word) ((uint32_t)((word)&0xffffu))

/*
 * The region header. Counters that different parties write live on cache
 * lines of their own, so the client's submissions and the engine's progress
 * never share a line.
 */
struct dfccl_qp_header {
	/* --- line 0: identity; written once by the supervisor at creation, read by all */
	uint64_t magic;       /* DFCCL_QP_MAGIC */
	uint32_t abi_version; /* DFCCL_QUEUE_ABI_VERSION */
	uint32_t header_size; /* DFCCL_QP_HEADER_SIZE */
	uint32_t sqe_size;    /* DFCCL_SQE_SIZE */
	uint32_t cw_size;     /* DFCCL_CW_SIZE */
	uint32_t sq_entries;  /* n, a power of two in [MIN, MAX] */
	uint32_t qp_id;       /* daemon-wide id of this queue pair */
	uint64_t sq_offset;   /* byte offset of the submission entries */
	uint64_t cw_offset;   /* byte offset of the completion words */
	uint64_t region_size; /* total bytes of the region */
	uint32_t device;      /* device index the queue pair is bound to */
	uint32_t reserved0;
	/* --- line 1: client-written */
	uint64_t sq_tail; /* client: last sequence number reserved; engine reads */
	uint64_t client_heartbeat_ns; /* client: CLOCK_MONOTONIC of its last poll; supervisor reads */
	uint32_t waiters; /* client: threads sleeping on the low 32 bits of `completed` (a futex);
	                   * engine and supervisor read it after each completion and wake them */
	uint32_t reserved1;
	uint8_t pad1[DFCCL_CACHE_LINE - 24];
	/* --- line 2: engine-written progress */
	uint64_t sq_head;   /* engine: lowest sequence number not yet taken; client, dfcclctl read */
	uint64_t completed; /* engine: count of completion words written; client poller reads */
	uint8_t pad2[DFCCL_CACHE_LINE - 16];
	/* --- line 3: engine state, doorbell hand-shake */
	uint32_t engine_state; /* engine (supervisor on worker death): enum dfccl_engine_state; client reads */
	uint32_t qp_state;     /* supervisor: enum dfccl_qp_state; engine and client read */
	uint8_t pad3[DFCCL_CACHE_LINE - 8];
	/* --- lines 4..7: reserved for later engines; zero */
	uint8_t reserved[DFCCL_QP_HEADER_SIZE - 4 * DFCCL_CACHE_LINE];
};

/*
 * One submission entry: 128 bytes, two cache lines. Every field is written by
 * the client and read (after a copy) by the engine; the engine never writes
 * an entry. Sizes are in elements of `dtype`.
 */
struct dfccl_sqe {
	uint64_t arm;      /* client CPU or client GPU stream, last: == seq when ready */
	uint64_t seq;      /* client: this entry's sequence number (>= 1) */
	uint64_t user_tag; /* client: opaque, for the client's own bookkeeping */
	uint64_t comm_id;  /* client: communicator id from CommInitReply */
	uint64_t comm_seq; /* client: >= 1; NCCL-style collectives: per-communicator sequence of
	                    * collectives (send/recv do not count); send/recv: the n-th send to
	                    * (or receive from) `peer` on this communicator; registered: the run
	                    * number of coll_id */
	uint64_t count;    /* client: element count */
	uint64_t send_off; /* client: byte offset of the send buffer inside send_reg */
	uint64_t recv_off; /* client: byte offset of the receive buffer inside recv_reg */
	/* --- line 1 */
	uint32_t send_reg; /* client: registration id of the send buffer (0: none) */
	uint32_t recv_reg; /* client: registration id of the receive buffer (0: none) */
	uint32_t peer;     /* client: root for broadcast/reduce, peer rank for send/recv */
	uint32_t coll_id;  /* client: registered-collective id (DFCCL_SQE_F_REGISTERED) */
	int32_t priority;  /* client: larger runs first (DFCCL_SQE_F_PRIORITY) */
	uint16_t flags;    /* client: DFCCL_SQE_F_* */
	uint8_t opcode;    /* client: enum dfccl_opcode */
	uint8_t dtype;     /* client: dfcclDataType_t value */
	uint8_t redop;     /* client: dfcclRedOp_t value */
	uint8_t algo;      /* client: enum dfccl_algo hint for all-reduce; DFCCL_ALGO_AUTO: the
	                    * worker's setting */
	uint8_t reserved8[2];
	uint32_t rank;     /* client: the submitting rank in comm_id (a process may hold several ranks) */
	/* --- DFCCL_SQE_F_DEVICE_DONE: where the engine also stores the
	 * completion word, in device memory (GPU engine) */
	uint64_t done_off; /* client: byte offset inside done_reg, a multiple of 8 */
	uint32_t done_reg; /* client: registration id of that device memory */
	/* --- every entry */
	uint32_t seq_check; /* client: seq's low 32 bits, written with the rest of the entry: an engine
	                     * that copies an entry in the round trip that finds it armed (arm == seq)
	                     * trusts the copy only where this word, on the entry's other 64-byte
	                     * line, agrees too (an older client leaves it 0: its entries then fail
	                     * the check, all but one in 2^32, and are read after their arm words) */
	/* --- DFCCL_SQE_F_GROUP: the group this entry belongs to */
	uint64_t group_last; /* client: the sequence number of the group's last entry */
	uint32_t group_n;    /* client: entries in the group */
	uint32_t reserved;   /* client: zero */
};

DFCCL_STATIC_ASSERT(sizeof(struct dfccl_qp_header) == DFCCL_QP_HEADER_SIZE, "qp header size");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, magic) == 0, "magic offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, abi_version) == 8, "abi_version offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, header_size) == 12, "header_size offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, sqe_size) == 16, "sqe_size offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, cw_size) == 20, "cw_size offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, sq_entries) == 24, "sq_entries offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, qp_id) == 28, "qp_id offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, sq_offset) == 32, "sq_offset offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, cw_offset) == 40, "cw_offset offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, region_size) == 48, "region_size offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, device) == 56, "device offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, sq_tail) == 64, "sq_tail on line 1");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, client_heartbeat_ns) == 72, "heartbeat offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, waiters) == 80, "waiters offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, sq_head) == 128, "sq_head on line 2");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, completed) == 136, "completed offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, engine_state) == 192, "engine_state on line 3");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, qp_state) == 196, "qp_state offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_qp_header, reserved) == 256, "reserved offset");

DFCCL_STATIC_ASSERT(sizeof(struct dfccl_sqe) == DFCCL_SQE_SIZE, "sqe size");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, arm) == 0, "arm offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, seq) == 8, "seq offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, user_tag) == 16, "user_tag offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, comm_id) == 24, "comm_id offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, comm_seq) == 32, "comm_seq offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, count) == 40, "count offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, send_off) == 48, "send_off offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, recv_off) == 56, "recv_off offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, send_reg) == 64, "send_reg on line 1");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, recv_reg) == 68, "recv_reg offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, peer) == 72, "peer offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, coll_id) == 76, "coll_id offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, priority) == 80, "priority offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, flags) == 84, "flags offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, opcode) == 86, "opcode offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, dtype) == 87, "dtype offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, redop) == 88, "redop offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, algo) == 89, "algo offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, rank) == 92, "rank offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, done_off) == 96, "done_off offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, done_reg) == 104, "done_reg offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, seq_check) == 108, "seq_check on line 1");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, group_last) == 112, "group_last offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_sqe, group_n) == 120, "group_n offset");

/* Geometry of a region with n entries; the SQ starts on its own page-aligned
 * boundary after the header so a GPU can map header and entries separately. */
#define DFCCL_QP_SQ_OFFSET ((uint64_t)4096)
#define DFCCL_QP_CW_OFFSET(n) (DFCCL_QP_SQ_OFFSET + (uint64_t)(n)*DFCCL_SQE_SIZE)
#define DFCCL_QP_REGION_SIZE(n) \
	((DFCCL_QP_CW_OFFSET(n) + (uint64_t)(n)*DFCCL_CW_SIZE + 4095u) & ~(uint64_t)4095u)

/* Slot of a sequence number in a queue of n (a power of two) entries. */
#define DFCCL_QP_SLOT(seq, n) ((uint32_t)(((seq)-1u) & ((uint64_t)(n)-1u)))

/* A GPU engine's launch gate on entry s (see "Engine side" above): the
 * value the engine stores into the arm word to open it, which is not s; and
 * whether an arm word passes the gate's stream wait (a cyclic >=: the
 * client's arm of s and later laps' do, earlier laps' do not). */
#define DFCCL_ARM_GATE_MARK(s) ((uint64_t)(s) + (1ull << 62))
static inline int dfccl_arm_passes(uint64_t arm, uint64_t s)
{
	return (int64_t)(arm - s) >= 0;
}

/* Opens a gate on entry s whose arm word is *arm: stores the mark unless
 * the wait passes already, with a compare-and-swap, so an arm (the
 * client's, or a later lap's) that lands meanwhile is never overwritten. */
static inline void dfccl_arm_gate_open(uint64_t *arm, uint64_t s)
{
	uint64_t v = __atomic_load_n(arm, __ATOMIC_ACQUIRE);
	while (!dfccl_arm_passes(v, s) &&
	       !__atomic_compare_exchange_n(arm, &v, DFCCL_ARM_GATE_MARK(s), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		;
}

#endif /* DFCCL_QUEUE_H */
