/*
 * The contract between the daemon kernel (dkernel.cu) and its host side in
 * the worker (cuda_engine.cu): the tables the kernel reads, the tasks it
 * keeps, and where each word lives and who writes it.
 *
 * Placement. Everything the kernel reads often lives in device memory, in
 * one `struct dk_state` the host side allocates per worker: the queue-pair,
 * communicator and registration tables (written by the host side with
 * copies on a stream of its own while the kernel runs, read by the kernel
 * with volatile loads), the tasks and their contexts, the per-block inboxes.
 * What the host side reads while the kernel runs lives in mapped pinned host
 * memory, `struct dk_host`: per-block counters, each word written by one
 * block only, so no atomics cross PCIe.
 *
 * Updating a table under a running kernel. An entry is written in two
 * copies: its body while its `live` (or `state`) word still says "ignore
 * me", then that word. Removing one, and anything that maps or unmaps
 * memory (CUDA calls that may wait for the device to be idle), happens with
 * the kernel parked: the host side sets dk_ctl.park, every block leaves at
 * the top of its loop (waits give up early), and the tasks stay in global
 * memory with their contexts; the next launch rebuilds each block's queue
 * from them (DFCCL's voluntary quit with saved contexts). So within one
 * launch the tables hold still: a task looks its queue pair, communicator
 * and buffers up once per launch (dk_params.epoch), and a parked task whose
 * entry went away meanwhile notices when it resumes.
 */
#ifndef DFCCL_DKERNEL_H
#define DFCCL_DKERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "algo.h"
#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "scheduler.h"
#include "sqe_check.h"

#define DK_MAX_QPS 256u
#define DK_MAX_COMMS 256u
#define DK_REG_CAP 8192u /* registration hash table: a power of two */
#define DK_MAX_TASKS SCHED_MAX_TASKS
/* Blocks: with resident-blocks R > 0 the kernel has R resident blocks and
 * a bulk block per channel beside them (cuda_engine.cu), so that a
 * collective of every channel runs on bulk blocks alone; R is at most
 * DK_MAX_RESIDENT (the resident-blocks settings' bound, daemon/config.c). */
#define DK_MAX_RESIDENT 8u
#define DK_MAX_BLOCKS (DFCCL_COMM_MAX_CHANNELS + DK_MAX_RESIDENT)
#define DK_THREADS 512u
/* Blocks of the kernel that an SM must be able to hold at once, which caps
 * the registers of a thread at 65536 / (DK_THREADS * this): with 1 (128
 * registers) a daemon block takes a whole SM's registers, and no block of
 * another process's kernel can share that SM under MPS; with 2 it leaves
 * half, at the price of spills in the control path. A build setting
 * (DFCCL_DK_MIN_BLOCKS_PER_SM) while the trade is measured. */
#ifndef DK_MIN_BLOCKS_PER_SM
#define DK_MIN_BLOCKS_PER_SM 1
#endif
/* Phase 2 of the two-shot all-reduce: 1 stores this rank's chunk into the
 * peers' buffers, with a drain on failure (dkernel.cu, before
 * sync_fence_sc); 0 loads the other chunks from theirs. A build setting
 * (DFCCL_DK_PHASE2_STORES), off: on 2 H100s the stores passed the quick
 * GPU suites and gained 9 % at 512 MiB with 16 channels, nothing with 32
 * (tests/perf/RESULTS.md, tenth run), and the drain leaves cases it does
 * not cover (dkernel.cu). */
#ifndef DK_PHASE2_STORES
#define DK_PHASE2_STORES 0
#endif
/* The threads of a block that run its tasks; the last warp of block 0 is
 * the queue reader (lane 0, with lanes 8-31 copying entries for it), which
 * has counters and a trace ring of its own, after the blocks': slot
 * DK_READER. */
#define DK_WORKERS (DK_THREADS - 32u)
#define DK_READER DK_MAX_BLOCKS
#define DK_SLOTS (DK_MAX_BLOCKS + 1u)
#define DK_NO_TASK 0xffffffffu

/* A queue pair. Host side: every field but those marked kernel. */
/*
 * A group of entries (DFCCL_SQE_F_GROUP) as its completions go, kept at
 * the slot of its last entry: the count word (sqe_group_count), and the
 * last entry's completion for whichever entry completes the group after
 * it: its sequence number (stored last), status and device completion
 * word by registration (resolved again where used: a pointer would not
 * outlive the launch that resolved it).
 */
struct dk_group {
	uint64_t count;
	uint64_t last_seq;
	uint64_t done_off;
	uint32_t done_reg;
	uint32_t last_status;
};

struct dk_qp {
	uint32_t live;                /* host: 1 while served; written last on add, first on removal */
	uint32_t gen;                 /* host: changes with every use of the slot */
	uint32_t n;                   /* host: entries (its own record, not the region's header) */
	uint32_t uid_slot;            /* host: its uid's index in dk_state.uid_inflight */
	uint64_t session_id;          /* host */
	struct dfccl_qp_header *hdr;  /* host: the region as the GPU sees it */
	struct dfccl_sqe *sq;         /* host */
	uint64_t *cw;                 /* host */
	uint64_t *taken;              /* host: device array [n]; kernel: sequence last taken per slot */
	struct dk_group *groups;      /* host: device array [n] (zeroed), after taken's; kernel: per slot of a
	                               * group's last entry, the group's count (complete_group, dkernel.cu) */
	uint64_t head;                /* kernel (host sets it on add): lowest sequence not yet taken */
	uint64_t completed;           /* kernel (host sets it on add: the header's): completions written, under
	                               * `lock` */
	int32_t lock;                 /* kernel: orders completions of several blocks */
	uint32_t inflight;            /* kernel (host zeroes it on add): its tasks in the kernel (atomic) */
	uint32_t comm_hint;           /* kernel: 1 + the communicator slot of its last entry (checked before use) */
	uint64_t look;                /* kernel (host zeroes it on add): where the last look beyond the room
	                               * stopped (sched_look_start), 0: at the head */
	uint64_t sweep;               /* kernel (host zeroes it on add): where the next pass looks past the
	                               * window after the head (read_queues), 0: right after it */
	uint64_t early;               /* kernel (host zeroes it on add): the sequence of its task taken before
	                               * its arm and not armed yet (early_take, dkernel.cu), 0: none */
	uint64_t early_no;            /* kernel (host zeroes it on add): the last entry early_take copied and
	                               * left for its arm (not one of those it takes), or one given back: not
	                               * copied again */
	uint64_t early_back;          /* kernel (host zeroes it on add): the entry of its early task that the
	                               * task's block gave back (early_give_back, dkernel.cu), for the reader
	                               * to move the head back to; 0: none */
	uint32_t early_miss;          /* kernel (host zeroes it on add): entries early_take copied and left since
	                               * it last took one (at most DK_EARLY_MISSES, dkernel.cu) */
	uint32_t reserved_early;
};

enum dk_reg_state { DK_REG_EMPTY = 0, DK_REG_LIVE = 1, DK_REG_GONE = 2 };

/* A registration: open addressing by reg_id; GONE entries keep probes going. */
struct dk_reg {
	uint32_t reg_id;     /* host */
	uint32_t state;      /* host: enum dk_reg_state, written after the rest */
	uint64_t session_id; /* host */
	uint64_t size;       /* host */
	char *base;          /* host: the buffer as the GPU sees it */
};

/* Other GPUs a communicator may span, as seen from one of them. */
#define DK_MAX_PEERS 15u

/*
 * A communicator with a rank on this device.
 *
 * Protocol words (posts, channel words, mailboxes): in device memory
 * (sync), and repeated into the region in host memory (mirror) for the
 * supervisor. Where the communicator spans GPUs, every GPU's worker keeps
 * a copy of all of them in its own memory and maps the others' (npeers,
 * peer_off): a rank stores each word into every copy, over NVLink or PCIe,
 * and reads them from its own GPU's copy, so no wait crosses a link.
 *
 * Connectors (the staging memory of reduce and reduce-scatter over rings
 * and trees) live in device memory: per rank, DFCCL_COMM_CONN_SLOTS
 * instance slots of DFCCL_COMM_CONN_BYTES, a slot shared out among the
 * instance's channels (dk_conn_bytes each). Each worker allocates them for
 * the ranks of its device and, where the communicator spans GPUs, maps the
 * other workers' (CUDA IPC, exchanged with the protocol words), so a step
 * reads or writes any rank's connector directly over NVLink or PCIe;
 * conn_all says every rank's is set. Where some GPU had no memory for its
 * ranks' connectors (or could not export them), conn_all stays 0 on every
 * GPU of the communicator, and
 * those two collectives run with the direct algorithms, which every rank
 * of it decides alike.
 */
struct dk_comm {
	uint32_t live;                    /* host: as dk_qp.live */
	uint32_t gen;                     /* host */
	uint64_t comm_id;                 /* host */
	uint32_t nranks;                  /* host */
	uint32_t abort_status;            /* host, and the kernel (comm_fail): nonzero once aborted here */
	struct dfccl_comm_header *hdr;    /* host: the region's synchronisation part as the GPU sees it */
	struct dfccl_comm_header *sync;   /* host: where the kernel's protocol words live: hdr, or (every
	                                   * rank on this GPU) a copy in device memory, whose words the
	                                   * kernel also stores into hdr for the supervisor's watch */
	int64_t mirror;                   /* host: (char *)hdr - (char *)sync; 0 when sync is hdr */
	uint64_t session[DFCCL_COMM_MAX_RANKS]; /* host: by rank */
	uint32_t device[DFCCL_COMM_MAX_RANKS];  /* host: by rank */
	char *conn[DFCCL_COMM_MAX_RANKS];       /* host: by rank, this GPU's memory or a peer's mapped */
	uint32_t conn_all;                      /* host: 1 when every rank's conn is set */
	uint32_t npeers;                        /* host: the other GPUs' copies of the protocol words */
	int64_t peer_off[DK_MAX_PEERS];         /* host: (char *)copy - (char *)sync, each mapped here */
	struct algo_topo topo;                  /* host: the plan, checked (algo_topo_load) */
};

/* A channel's share of an instance slot's connector: 32-byte multiples. */
static inline DFCCL_HD uint32_t dk_conn_bytes(uint32_t nch)
{
	return DFCCL_COMM_CONN_BYTES / nch / 32u * 32u;
}

/* One of the n - 1 regions, one per other rank, that `bytes` are cut
 * into on 16-byte boundaries (0 for a single rank). */
static inline DFCCL_HD uint32_t dk_region_bytes(uint32_t bytes, uint32_t n)
{
	return n > 1 ? bytes / (n - 1) / 16u * 16u : 0;
}

/* What one source of a pushed all-reduce may bring into a channel's
 * share of a connector: a region of the share. */
static inline DFCCL_HD uint32_t dk_push_room(uint32_t nch, uint32_t n)
{
	return dk_region_bytes(dk_conn_bytes(nch), n);
}

/*
 * Lines of a pushed all-reduce (dk_task.push == DK_PUSH_LL, dkernel.cu):
 * each 16-byte line carries 8 bytes of data, each 4-byte half with the
 * instance's flag beside it (as NCCL's LL protocol), so a receiver that
 * polls the lines needs no word that says they arrived, and a sender no
 * fence between its data and that word. They live in an area of their own
 * after each rank's connectors, one slot of DK_LL_SLOT_BYTES per instance
 * slot, cut into n - 1 regions, one per source rank: the connectors serve
 * rings and trees too, whose data may hold any flag. The worker zeroes the
 * area when it allocates it, and no flag is 0 (dk_ll_flag).
 */
#define DK_LL_SLOT_BYTES 33792u /* n = 2: 16 KiB of data as lines (32 KiB) and the last line */
#define DK_LL_MAX_BYTES 16384u  /* the largest all-reduce sent as lines (the ll-bytes setting's bound) */
#define DK_CONN_RANK_BYTES ((uint64_t)DFCCL_COMM_CONN_SLOTS * (DFCCL_COMM_CONN_BYTES + DK_LL_SLOT_BYTES))
#define DK_LL_AREA_OFFSET ((uint64_t)DFCCL_COMM_CONN_SLOTS * DFCCL_COMM_CONN_BYTES)
enum { DK_PUSH_PLAIN = 1, DK_PUSH_LL = 2 };

/* The bytes of one source's region of a slot's lines. */
static inline DFCCL_HD uint32_t dk_ll_room(uint32_t n)
{
	return dk_region_bytes(DK_LL_SLOT_BYTES, n);
}

/* The data lines of `bytes`: 8 bytes each; the region's last line, the
 * instance's count and shape, comes after them. */
static inline DFCCL_HD uint64_t dk_ll_lines(uint64_t bytes)
{
	return (bytes + 7u) / 8u;
}

/* Whether a direct all-reduce of `bytes` on n ranks may run in one shot
 * (dkernel.cu's oneshot_fits, which also asks that no rank works in
 * place): a rank then reads (n - 1) times `bytes` of its peers' data where
 * two shots read 2 (n - 1) / n times. On two ranks that is the same, so
 * any size may; on more, up to `limit` bytes (the oneshot-bytes setting).
 * A limit of 0: never, on two ranks too. */
static inline DFCCL_HD int dk_oneshot_size_fits(uint64_t bytes, uint32_t n, uint64_t limit)
{
	return limit != 0 && (n <= 2 || bytes <= limit);
}

/* The rank whose block a direct all-gather's channel ch copies at element
 * pos of its data step (len elements of each of the n ranks' blocks, one
 * block after another): channel ch starts with block ch % n and takes the
 * others in turn, so that the channels are spread over the blocks at every
 * point. With every channel on the same block at once, a rank copied its
 * own block (local memory) on all its channels at one time and read the
 * peers' (the links) at another (2x H200, 256 MiB-1 GiB: 13-14 % less
 * time; tests/perf/RESULTS.md, nineteenth run). */
static inline DFCCL_HD uint32_t dk_gather_source(uint64_t pos, uint64_t len, uint32_t ch, uint32_t n)
{
	return (uint32_t)((pos / len + ch) % n);
}

/* First element of part i of len elements split into parts (len for i >=
 * parts): floor(len * i / parts), rounded up to 16 bytes of elements of
 * dsize (1, 2, 4 or 8 bytes) where that stays within len. In the
 * narrowest arithmetic that holds it: the GPU divides in software, 128
 * bits costing far more than 32 (tests/unit/test_dk_split.c holds the
 * fast paths to the 128-bit one). */
static inline DFCCL_HD uint64_t dk_split_at(uint64_t len, uint32_t parts, uint32_t i, uint32_t dsize)
{
	if (i >= parts)
		return len;
	uint64_t lo;
	if ((len >> 32) == 0 && len * parts < (1ull << 32))
		lo = (uint32_t)len * i / parts; /* i <= parts: len * i fits too */
	else if (sqe_mul_fits(len, parts))
		lo = len * i / parts;
	else
		lo = (uint64_t)(((unsigned __int128)len * i) / parts);
	uint64_t a = 16 / dsize; /* a power of two */
	lo = (lo + a - 1) & ~(a - 1);
	return lo < len ? lo : len;
}

/* Whether `bytes` of data and the region's last line fit one region. */
static inline DFCCL_HD int dk_ll_fits(uint64_t bytes, uint32_t n)
{
	return n > 1 && bytes <= DK_LL_MAX_BYTES && dk_ll_lines(bytes) + 1u <= dk_ll_room(n) / 16u;
}

/* The flag of instance `key` in its lines: key mod (2^32 - 1), plus one,
 * so never 0 (the zeroed area). Keys that share an instance slot differ by
 * multiples of the slot count (32 or 4 instances a slot, prime to
 * 2^32 - 1), so a line left by an earlier instance of the slot has another
 * flag unless that instance came (2^32 - 1) slot counts of instances before,
 * with no instance since as long as it: a take reads only its own count's
 * lines, and each instance rewrites the lines it reaches. */
static inline DFCCL_HD uint32_t dk_ll_flag(uint64_t key)
{
	uint64_t s = (key & 0xFFFFFFFFu) + (key >> 32); /* 2^32 = 1 (mod 2^32 - 1) */
	s = (s & 0xFFFFFFFFu) + (s >> 32);
	uint32_t m = (uint32_t)s == 0xFFFFFFFFu ? 0u : (uint32_t)s;
	return m + 1u;
}

/* Steps of a channel of a task (see dkernel.cu). */
enum dk_step {
	DK_SLOT = 0,
	DK_POSTS,
	DK_WORK1,
	DK_SYNC1,
	DK_WORK2,
	DK_CHDONE,
	DK_FINISH,
	DK_BOX_FREE,
	DK_BOX_ACK,
	DK_BOX_KEY,
	DK_AWAIT,  /* ring and trees: the waits of algorithm step `astep` */
	DK_AWORK,  /* ring and trees: its data */
	DK_BOX_WANT, /* a receive: post `want` once the mailbox's previous message is acknowledged */
	DK_PUSH,   /* a pushed all-reduce: this rank's data into every peer's connector (dkernel.cu) */
	DK_LEFT,   /* this channel's part is over: not in its block's queue any more */
	DK_DRAIN,  /* DK_PHASE2_STORES: a failed rank waits until no peer stores into its buffers */
	DK_LLPULL, /* a pushed all-reduce's lines: the block checks every flag, then reduces from them */
	DK_SELF,   /* a communicator of one rank: its channel's range of the copy, then the completion */
};

/* The dynamic context of one channel of a task: its step and position. */
struct dk_chan_ctx {
	uint32_t step;      /* enum dk_step */
	uint32_t wait_rank; /* the current wait has seen ranks below this ready */
	uint64_t pos;       /* elements done in the current data step */
	uint32_t waits;     /* waits begun: every 8th looks at the abort word first */
	uint32_t astep;     /* ring and trees: the algorithm's step */
	uint32_t epoch;     /* the launch (dk_params.epoch) in which the task's queue pair and communicator
	                     * were last found in place: tables change only between launches */
	uint16_t oneshot;   /* direct all-reduce in one pass (decided at POSTS, dkernel.cu) */
	uint16_t chan;      /* the channel this context's block runs (set with the task: block_at) */
};

enum dk_task_state { DK_TASK_FREE = 0, DK_TASK_LIVE = 1 };

/* Every rank's buffers of an instance, as this GPU maps them. */
struct dk_bufs {
	char *send[DFCCL_COMM_MAX_RANKS];
	char *recv[DFCCL_COMM_MAX_RANKS];
};

/*
 * A collective of one rank: its fixed context (from the entry, set before
 * the task is published and unchanged until it is freed) and what changes
 * as it runs, with one dynamic context per channel. Kernel-owned. The
 * fixed part comes first, DK_TASK_FIXED_BYTES of it, so that a block can
 * copy it into shared memory with one parallel load at the start of each
 * visit.
 */
struct dk_task {
	uint32_t qp, qp_gen;
	uint32_t comm, comm_gen;
	uint32_t rank, peer, dsize;
	uint32_t send_reg, recv_reg;
	uint32_t slot;      /* the instance slot (channel words) */
	uint64_t seq;       /* the entry: where its completion goes */
	uint64_t key;       /* the instance */
	uint64_t count;
	uint64_t send_off, recv_off;
	uint64_t slot_free; /* the slot is free once every rank's done >= this */
	uint64_t arrival;
	uint8_t opcode, dtype, redop, nch;
	uint8_t algo;       /* enum dfccl_algo, chosen when the entry was taken */
	uint8_t reserved_part; /* 1: admitted from the reserve, 0: from the shared part (scheduler.h) */
	uint8_t uid_slot;   /* its queue pair's uid_slot, charged while the task lives */
	uint8_t push;       /* a pushed all-reduce: DK_PUSH_PLAIN or DK_PUSH_LL (push_fits, dkernel.cu); 0: not */
	struct dfccl_rank_post *posts; /* collectives: the instance's posts, [rank] */
	struct dfccl_p2p_box *box;     /* send/recv */
	/* This rank's own buffers as the queue reader resolved them when it
	 * checked the entry, valid in launch accept_epoch only (registrations
	 * change while the kernel is parked): what a pushed all-reduce
	 * touches besides the connectors (bufs_own, dkernel.cu). */
	char *own_send, *own_recv;
	/* Its device completion word (DFCCL_SQE_F_DEVICE_DONE): resolved as
	 * the buffers are (own_done, valid in accept_epoch), and its
	 * registration for a later launch (done_of, dkernel.cu); done_reg 0:
	 * none. */
	char *own_done;
	uint64_t done_off;
	uint32_t done_reg;
	uint32_t accept_epoch;
	uint8_t block0;     /* the block that runs channel 0; channel c runs on block (block0 + c) % blocks
	                     * (block_of, dkernel.cu) */
	uint8_t early;      /* 1: taken before its stream armed it (early_take, dkernel.cu): its block
	                     * waits for the arm word before the instance's slot */
	uint8_t reserved2[2];
	uint32_t group_n;     /* its entry's group (DFCCL_SQE_F_GROUP, sqe_group): entries, 0: none; */
	uint64_t group_last;  /* and the last one's sequence */
	/* What changes. */
	uint32_t state;     /* enum dk_task_state */
	uint32_t chdone;    /* channels finished (atomic) */
	uint32_t status;    /* completion status once known */
	uint32_t bufs_epoch; /* the launch whose registrations `bufs` was resolved against (0: none) */
	struct dk_chan_ctx ch[DK_MAX_BLOCKS]; /* by the block that runs the channel */
	struct algo_run alg[DK_MAX_BLOCKS]; /* ring and trees: each channel's part (set at POSTS) */
	/* Every rank's post (or the sender's mailbox), copied once checked:
	 * posts do not change while the instance runs, and reading them again
	 * from host memory on every visit would cost a PCIe round trip each. */
	struct dk_post_copy {
		uint64_t send_off, recv_off;
		uint32_t send_reg, recv_reg;
	} post[DFCCL_COMM_MAX_RANKS];
	/* The posts' buffers resolved: registrations are added and removed
	 * only while the kernel is parked, so a resolution holds for the rest
	 * of the launch that made it (bufs_epoch), and the next launch makes
	 * it again. Written by whichever channel resolves first. */
	struct dk_bufs bufs;
};

#define DK_TASK_FIXED_BYTES offsetof(struct dk_task, state)
DFCCL_STATIC_ASSERT(DK_TASK_FIXED_BYTES % 16 == 0, "the fixed part of a task is copied in 16-byte words");

/* A block's inbox of new tasks: the queue reader appends, the owner takes. */
struct dk_inbox {
	uint32_t head;                 /* owner */
	uint32_t tail;                 /* the queue reader */
	uint32_t active;               /* a bulk block (dk_params.bulk0): 0 once it decided to leave with nothing
	                                * in its inbox, or left parked (a launch rebuilds it); 1 from its start, or
	                                * from the queue reader's ask for its launch (bulk_ask, dk_main) */
	uint32_t asks;                 /* a bulk block: launches of it the queue reader asked for */
	uint32_t idx[DK_MAX_TASKS];
};

/* Written by the host side (device memory), read by every block. */
struct dk_ctl {
	uint32_t quit;       /* the queue reader decided to quit (idle); host clears it before a launch */
	uint32_t stop;       /* host: leave now (the worker is exiting) */
	uint32_t park;       /* host: leave now, tasks kept for the next launch; cleared before a launch */
	uint32_t started;    /* blocks that rebuilt their queue in this launch (the reader waits for all) */
	uint32_t nqps;       /* host: queue-pair slots in use are below this */
	uint32_t ncomms;     /* host: communicator slots in use are below this */
};

/* Counters of one block, in host memory; the block is the only writer.
 * started[a - 1]: collectives the queue reader started with algorithm a (direct ..
 * multitree; an entry given back and taken again counts twice). early_taken:
 * entries the queue reader took before their stream armed them; early_backs:
 * those the block gave back to their queues unarmed (early_take, dkernel.cu). */
#define DK_NCOUNTERS 11
struct dk_block_stats {
	uint64_t completed, errors, preemptions, context_switches, spins;
	uint64_t started[DFCCL_ALGO_COUNT_ - 1];
	uint64_t early_taken, early_backs;
	uint64_t reserved[16 - DK_NCOUNTERS];
};
DFCCL_STATIC_ASSERT(DK_NCOUNTERS == 7 + DFCCL_ALGO_COUNT_ - 1, "one started counter per algorithm but auto");

/* Mapped pinned host memory: what the host side reads while the kernel runs. */
struct dk_host {
	struct dk_block_stats block[DK_SLOTS]; /* the blocks', then the queue reader's */
	uint32_t quit_voluntary; /* the queue reader: set when the kernel quit for being idle */
	uint32_t reserved[15];
	uint32_t bulk_want[DK_MAX_BLOCKS];  /* the queue reader: dk_inbox.asks of each bulk block */
	uint32_t bulk_exits[DK_MAX_BLOCKS]; /* each bulk block: its launches that ended, moved last thing */
};
DFCCL_STATIC_ASSERT(DK_MAX_BLOCKS <= 256, "a task's first block is a byte");

/* Everything of one daemon kernel in device memory. */
struct dk_state {
	struct dk_ctl ctl;
	uint32_t live_tasks;  /* tasks not FREE (atomic) */
	uint32_t admit_reserve, admit_shared; /* tasks admitted from each part (atomic; scheduler.h) */
	uint32_t task_cursor; /* the queue reader: where the search for a free task starts */
	uint64_t arrivals;    /* the queue reader */
	uint64_t stream_quit_ns; /* the queue reader: when its launch last quit idle after a stream-armed entry
	                          * (%globaltimer), 0 where the last launch did not (dk_stream_idle) */
	uint64_t stream_idle_ns; /* the queue reader: the idle after a stream-armed entry it came to (dk_stream_idle) */
	uint32_t early_tasks; /* tasks taken before their arm and not armed yet (atomic; early_take, dkernel.cu) */
	uint32_t early_backs; /* entries given back (dk_qp.early_back) the reader has not moved back to (atomic) */
	uint64_t early_off;   /* the queue reader: no entry is taken before its arm until this time (%globaltimer) */
	uint32_t early_ask;   /* the queue reader: 1: the blocks give back their early tasks not armed yet */
	uint32_t reserved_early[3];
	uint32_t uid_inflight[DK_MAX_QPS]; /* tasks per uid slot (atomic; a uid per queue pair at most) */
	struct dk_qp qps[DK_MAX_QPS];
	struct dk_comm comms[DK_MAX_COMMS];
	struct dk_reg regs[DK_REG_CAP];
	struct dk_task tasks[DK_MAX_TASKS];
	struct sched_state states[DK_MAX_BLOCKS][DK_MAX_TASKS];
	struct dk_inbox inbox[DK_MAX_BLOCKS];
	/* Each block's counters (and the queue reader's) as it last stored
	 * them to dk_host: where a launch's blocks load them from, in device
	 * memory (dkernel.cu, ctx_start). */
	struct dk_block_stats counters[DK_SLOTS];
};
/* The blocks load quit, stop and park in one 16-byte word (dk_main); the
 * host clears them and started with one copy before a launch (ce_launch). */
DFCCL_STATIC_ASSERT(offsetof(struct dk_state, ctl) == 0 && offsetof(struct dk_ctl, quit) == 0 &&
                        offsetof(struct dk_ctl, stop) == 4 && offsetof(struct dk_ctl, park) == 8 &&
                        offsetof(struct dk_ctl, started) == 12,
                    "the control words in the state's first 16 bytes");
/* The kernel loads registrations and the fixed part of tasks in 16-byte words. */
DFCCL_STATIC_ASSERT(offsetof(struct dk_state, regs) % 16 == 0 && sizeof(struct dk_reg) % 16 == 0,
                    "registrations on 16-byte boundaries");
DFCCL_STATIC_ASSERT(offsetof(struct dk_state, tasks) % 16 == 0 && sizeof(struct dk_task) % 16 == 0,
                    "tasks on 16-byte boundaries");

/* The launch's parameters. */
struct dk_params {
	struct dk_state *st;     /* device memory */
	struct dk_host *host;    /* mapped host memory, device pointer */
	struct sched_params sched;
	uint32_t blocks;         /* every block: the channels, and the resident blocks where bulk0 > 0 */
	uint32_t device;
	uint64_t idle_ns;        /* quit after this long with nothing to do */
	uint64_t stream_idle_ns; /* or this long (at most idle_ns) where the last entry taken was armed by a
	                          * stream: the launch gate brings the kernel back for the next; the
	                          * base of what the reader keeps (dk_stream_idle) */
	uint64_t visit_bytes;    /* bytes a channel moves per visit before it yields */
	uint64_t chan_bytes;     /* a collective gets one channel per this many bytes, up to `blocks` */
	uint64_t oneshot_bytes;  /* largest one-shot all-reduce on more than two ranks (oneshot_fits); 0: none at all */
	uint32_t algo;           /* enum dfccl_algo: for entries without a hint (the `algo` setting) */
	uint32_t max_inflight;   /* tasks one queue pair may hold (sched_max_inflight) */
	uint32_t max_inflight_uid; /* tasks the queue pairs of one uid may hold (sched_max_inflight_uid) */
	struct dk_trace *trace;  /* device memory, or NULL: the blocks' event trace (DK_TRACE_ENV) */
	uint32_t epoch;          /* this launch's number, never 0: what a task resolved or checked in
	                          * this launch needs no new look (the tables change only while parked) */
	uint32_t push_bytes;     /* all-reduces up to this size may be pushed (push_fits, dkernel.cu); 0: never */
	uint32_t ll_bytes;       /* pushed all-reduces up to this size go as lines (DK_PUSH_LL); 0: never */
	uint32_t spread;         /* 1: a task's channels start at a block chosen by its instance (block_of) */
	uint32_t early_take;     /* 1: a stream-ordered entry posted ahead of its arm may be taken before it
	                          * (early_take, dkernel.cu) */
	/* Resident and bulk blocks. With bulk0 = 0 the kernel is one grid of
	 * `blocks`, resident while it has work. Otherwise blocks 0..bulk0-1
	 * are the resident grid (the queue reader's, which runs
	 * single-channel tasks), and each of blocks bulk0..blocks-1, which
	 * run the tasks of more channels (and single-channel ones with a
	 * backlog, dk_spills), is a grid of one block on a
	 * stream of its own: launched when the reader hands a task to it while it is
	 * not running, leaving after bulk_idle_ns with nothing to do, so that
	 * under MPS only the SMs that large collectives use stay taken
	 * (dkernel.cu, dk_main). One grid each, so that a block's launch
	 * waits for nothing but its own last one to end: were they one grid,
	 * a block that left would come back only once every other had left,
	 * and a task in its inbox could be what they wait for. */
	uint32_t bulk0;
	uint32_t spill_at;       /* tasks (live or ahead in the reader's chunk) from which single-channel ones go
	                          * to the bulk blocks too (dk_spills) */
	uint64_t bulk_idle_ns;
	/* This launch: */
	uint32_t first;          /* 0: the resident grid; else the bulk block it runs */
	uint32_t rebuild;        /* 1: its blocks rebuild their queues from the tasks (the kernel left with
	                          * tasks: every block is launched again); 0: a bulk block the reader asked
	                          * for, which left with an empty queue and goes on from its inbox */
	uint32_t wait_blocks;    /* blocks the queue reader waits for to have rebuilt their queues */
};

/*
 * Which blocks run a task's channels (dkernel.cu, block_of). Where the
 * kernel has bulk blocks (bulk0 > 0), a task whose channel 0 runs on a
 * block below bulk0 runs on the resident blocks 0..bulk0-1, any other on
 * the bulk blocks bulk0..blocks-1; in one grid (bulk0 = 0) on all blocks.
 * Its channel ch runs on the block ch after its first, block0, wrapping
 * around within that range [lo, hi). All without a division: ch < nch <=
 * the range's size.
 */
static inline DFCCL_HD uint32_t dk_range_lo(uint32_t bulk0, uint32_t block0)
{
	return bulk0 && block0 >= bulk0 ? bulk0 : 0;
}

static inline DFCCL_HD uint32_t dk_range_hi(uint32_t bulk0, uint32_t blocks, uint32_t block0)
{
	return bulk0 && block0 < bulk0 ? bulk0 : blocks;
}

/* The block that runs channel ch of a task whose channel 0 runs on block0. */
static inline DFCCL_HD uint32_t dk_block_at(uint32_t bulk0, uint32_t blocks, uint32_t block0, uint32_t ch)
{
	uint32_t b = block0 + ch, hi = dk_range_hi(bulk0, blocks, block0);
	return b >= hi ? b - (hi - dk_range_lo(bulk0, block0)) : b;
}

/* The channel of such a task that block b runs: DK_NO_TASK outside its
 * range, else a number to compare with the task's channel count. */
static inline DFCCL_HD uint32_t dk_chan_of(uint32_t bulk0, uint32_t blocks, uint32_t block0, uint32_t b)
{
	uint32_t lo = dk_range_lo(bulk0, block0), hi = dk_range_hi(bulk0, blocks, block0);
	if (b < lo || b >= hi)
		return DK_NO_TASK;
	return b >= block0 ? b - block0 : b + (hi - lo) - block0;
}

/* Tasks a collective of several channels counts as a backlog from (its
 * own not included): with one other it spreads, so that a batch's tasks of
 * middle sizes run side by side on every bulk block; alone it starts on
 * the first bulk block, so that a job of such collectives one after
 * another keeps only the blocks its channels need. */
#define DK_SPILL_AT_MULTI 1u

/* Whether the task of nch channels of an entry spills (dk_start_range):
 * the kernel has bulk blocks, and the tasks live in it (`live`) and those
 * of the entries before it in the queue reader's chunk (`ahead`, which
 * become tasks together, after every one of them was placed) reach the
 * backlog's mark: spill_at (dk_params) for a single channel,
 * DK_SPILL_AT_MULTI for several. Each GPU decides it alone; the ranks of
 * a batch decide alike for all but its first few tasks, and a task placed
 * differently on two ranks costs them turns, not progress. */
static inline DFCCL_HD int dk_spills(uint32_t bulk0, uint32_t spill_at, uint32_t nch, uint32_t live, uint32_t ahead)
{
	return bulk0 && live + ahead >= (nch > 1 ? DK_SPILL_AT_MULTI : spill_at);
}

/*
 * How long a launch stays with nothing to do after a stream-armed entry:
 * from dk_params.stream_idle_ns (base, the launch-gate-idle-us setting)
 * up to DK_STREAM_IDLE_MAX_NS (and at most idle, kernel-idle-us), by
 * the client's pace. The last launch quit idle after such an entry at
 * quit_ns (0: it did not) and this one began at begun_ns: within
 * DK_STREAM_BACK_NS the client came back before a relaunch paid off
 * (back-to-back stream-ordered calls: the next arm comes a stream round
 * trip after the completion, about the base, and a relaunch costs 20-60
 * us of the call), so the idle the last launch kept (cur) doubles; later
 * (a trainer's compute between two calls) it halves, down to the base,
 * whose short stay gives the trainer's next kernel every SM sooner. A
 * base of 0 stays 0 (a launch per stream-ordered call).
 */
#define DK_STREAM_IDLE_MAX_NS 40000ull
#define DK_STREAM_BACK_NS 100000ull
static inline DFCCL_HD uint64_t dk_stream_idle(uint64_t base, uint64_t idle, uint64_t cur, uint64_t quit_ns,
                                               uint64_t begun_ns)
{
	uint64_t cap = idle < DK_STREAM_IDLE_MAX_NS ? idle : DK_STREAM_IDLE_MAX_NS;
	if (cap < base)
		cap = base;
	if (cur < base || cur > cap)
		cur = base;
	if (quit_ns == 0 || begun_ns < quit_ns)
		return cur;
	if (begun_ns - quit_ns < DK_STREAM_BACK_NS)
		return 2 * cur > cap ? cap : 2 * cur;
	return cur / 2 < base ? base : cur / 2;
}

/*
 * The early take's choices (dkernel.cu, early_take), apart so that they
 * are tested on the host (tests/unit/test_dk_early.c).
 *
 * dk_early_looks: whether the reader looks at pair's unarmed head `head`
 * (a copy and its checks) after `miss` heads in a row it copied and left:
 * every one below DK_EARLY_MISSES, then every DK_EARLY_SAMPLE-th, so that a
 * pair of NOPs, groups or collectives of several channels stops paying a
 * copy per entry (stream-ordered NOPs back to back took 25 us each against
 * 16 with every head copied: tests/perf/RESULTS.md, thirty-third run).
 */
#define DK_EARLY_MISSES 2u
#define DK_EARLY_SAMPLE 16u
static inline DFCCL_HD int dk_early_looks(uint32_t miss, uint64_t head)
{
	return miss < DK_EARLY_MISSES || head % DK_EARLY_SAMPLE == 0;
}

/* Whether entry e, copied as pair's head `head` (its checks passed, a
 * collective of one channel: `simple`), with `room` entries of the pair's
 * admission left, is taken before its arm: posted under that sequence,
 * armed by a stream, not in a group (a group is armed at once: nothing to
 * gain), not a send or receive, and with room for one more after it, so
 * that an early task waiting for its arm never takes the pair's last room
 * from an armed entry. */
static inline DFCCL_HD int dk_early_fits(const struct dfccl_sqe *e, uint64_t head, int simple, uint32_t room)
{
	return e->seq == head && (e->flags & DFCCL_SQE_F_STREAM_ARMED) && !(e->flags & DFCCL_SQE_F_GROUP) &&
	       !sqe_is_p2p(e->opcode) && simple && room >= 2u;
}

/* What the queue reader does after a pass (reader_main), from whether it
 * took entries, the live tasks, those of them taken early and not armed,
 * and how long since it last had work: DK_IDLE_ACTIVE (work: the clock
 * starts again), DK_IDLE_WAIT (nothing yet, or only early tasks for less
 * than DK_EARLY_WAIT_NS), DK_IDLE_GIVE_BACK (only early tasks, for
 * DK_EARLY_WAIT_NS: ask for them back, take none early for a while, and
 * start the clock again), DK_IDLE_QUIT (nothing at all for `idle`). */
#define DK_EARLY_WAIT_NS 50000ull
enum { DK_IDLE_ACTIVE = 0, DK_IDLE_WAIT = 1, DK_IDLE_GIVE_BACK = 2, DK_IDLE_QUIT = 3 };
static inline DFCCL_HD int dk_idle_step(uint32_t got, uint32_t live, uint32_t early, uint64_t since_ns,
                                        uint64_t idle_ns)
{
	if (got || (live && live != early))
		return DK_IDLE_ACTIVE;
	if (live)
		return since_ns >= DK_EARLY_WAIT_NS ? DK_IDLE_GIVE_BACK : DK_IDLE_WAIT;
	return since_ns >= idle_ns ? DK_IDLE_QUIT : DK_IDLE_WAIT;
}

/* Where a task of nch channels starts: the range [*lo, *lo + *span) it
 * runs in -- the bulk blocks for several channels, or for one when
 * `spill` (the kernel has a backlog), else the resident ones -- and
 * whether its first block is chosen in it by its instance (1: the spread
 * setting, a task that leaves blocks of the range free, and not one of
 * several channels on the bulk blocks without a backlog, which start on
 * the first of them) or is *lo (0). */
static inline DFCCL_HD int dk_start_range(uint32_t bulk0, uint32_t blocks, uint32_t nch, int spill, int spread,
                                          uint32_t *lo, uint32_t *span)
{
	int bulk = bulk0 && (nch > 1 || spill);
	*lo = bulk ? bulk0 : 0;
	*span = (bulk || !bulk0 ? blocks : bulk0) - *lo;
	return spread && nch < *span && !(bulk && nch > 1 && !spill);
}

/* The first block of a task that dk_start_range lets its instance place:
 * h (the instance number plus a hash of what it is counted in, dkernel.cu's
 * block_of) times its channel count, so that consecutive instances take
 * consecutive groups of nch blocks rather than overlapping ones; in 32
 * bits, without a 64-bit remainder. */
static inline DFCCL_HD uint32_t dk_spread_block(uint32_t lo, uint32_t span, uint32_t nch, uint32_t h)
{
	return lo + h * nch % span;
}

/*
 * The kernel's event trace, for finding where its time goes: with
 * DFCCL_DK_TRACE=FILE in a CUDA worker's environment, thread 0 of every
 * block and the queue reader (as block DK_READER) record their events, with
 * the GPU's clock, each into a ring of its own in device memory (no PCIe
 * traffic while it runs), and the worker writes the rings to FILE as text
 * when it ends (GPU 0's worker; GPU N's to FILE.gpuN). A developer's tool:
 * it slows nothing when unset.
 */
#define DK_TRACE_ENV "DFCCL_DK_TRACE"
#define DK_TRACE_EVENTS 65536u /* per block, a power of two: the last ones are kept */

enum dk_trace_event {
	DK_EV_LOOP = 0,    /* the top of the block's loop; arg: tasks in its queue */
	DK_EV_QUEUES,      /* the queue reader read the queue pairs; arg: entries taken */
	DK_EV_TASK,        /* a new task reached this block; arg: its index */
	DK_EV_STEP,        /* a channel reached a step; arg: task << 16 | step */
	DK_EV_PREEMPT,     /* a wait gave up; arg: task << 16 | step */
	DK_EV_DATA,        /* a piece of data was moved; arg: bytes (saturated) */
	DK_EV_COMPLETE,    /* an entry completed; arg: its status */
	DK_EV_TAKE,        /* the queue reader's take of an entry reached a phase; arg: enum dk_take_phase */
	DK_EV_START,       /* a launch's block, or the queue reader, got this far; arg: enum dk_start_phase */
	DK_EV_COUNT_
};

#define DK_TRACE_NAMES {"loop", "queues", "task", "step", "preempt", "data", "complete", "take", "start"}

/* How far a block (or the queue reader) of a new launch got (DK_EV_START):
 * the time from a launch's first event to its first take is the kernel's
 * start (tests/perf/dk_trace_summary.py --launches). */
enum dk_start_phase {
	DK_START_BEGUN = 0, /* its first instruction (timed then, recorded once its counters are loaded) */
	DK_START_LOADED,    /* its counters loaded (ctx_start) */
	DK_START_READY,     /* a block: its queue rebuilt; the reader: every block's, its first pass next */
};

/* The phases of the queue reader's pass over a queue pair and of its take
 * of an entry, in order, as the trace records them (DK_EV_TAKE): the time
 * between two is what the part between them costs. A phase is recorded
 * when the reader gets there, which may be before the loads it issued
 * return: their wait then counts to the phase that uses them. */
enum dk_take_phase {
	DK_TAKE_HEADER = 0, /* the pair's header and head arm word read (a pass going on to take or look) */
	DK_TAKE_SCANNED,   /* DK_SCAN entries' taken and arm words read */
	DK_TAKE_COPIED,    /* those of them armed copied from the submission queue and checked against
	                    * the communicators and registrations, a copier lane each (entry_prepare) */
	DK_TAKE_ARMED,     /* an armed entry's turn in the pass */
	DK_TAKE_CHECKED,   /* its copy and checks read, its admission decided */
	DK_TAKE_TASK,      /* a free task taken and placed in its blocks' inboxes (entry_take) */
	DK_TAKE_DONE,      /* the entry marked taken (or completed at once) */
	DK_TAKE_ADMITTED,  /* the chunk's tasks' admission counted (admit_count) */
	DK_TAKE_FILLED,    /* the chunk's tasks filled in, a copier lane each (task_fill); a copy's take:
	                    * its first task filled (take_one's time) */
	DK_TAKE_HANDED,    /* the chunk's tasks published to their blocks (inbox_publish); a copy's take:
	                    * its first task's block's tail moved (take_one's time) */
	/* Two points inside DK_TAKE_COPIED, taken by the copier lane of the
	 * chunk's first armed entry and recorded by the reader with their
	 * times, before DK_TAKE_COPIED: */
	DK_TAKE_LOADED,    /* the chunk's copies in shared memory (their PCIe reads) */
	DK_TAKE_PREPARED,  /* the first entry's checks made (entry_prepare) */
};

struct dk_trace_rec {
	uint64_t t_ns;  /* %globaltimer */
	uint32_t event; /* enum dk_trace_event */
	uint32_t arg;
};

struct dk_trace {
	uint64_t n[DK_SLOTS]; /* events recorded by each block, and the queue reader, so far */
	struct dk_trace_rec rec[DK_SLOTS][DK_TRACE_EVENTS];
};

/* The registration table's first probe for reg_id. */
static inline DFCCL_HD uint32_t dk_reg_hash(uint32_t reg_id)
{
	return (reg_id * 2654435761u) & (DK_REG_CAP - 1u);
}

#if defined(__cplusplus)
extern "C" {
#endif
/* Launches a grid of the daemon kernel (dkernel.cu) on stream: the
 * resident grid (p->first 0) or bulk block p->first; returns a
 * cudaError_t. */
int dk_launch(const struct dk_params *p, void *stream);
/* How many blocks of the kernel device can hold at once (its SMs, as this
 * context sees them: a MIG instance's, an MPS client's share), or 0 when
 * unknown. Every block of the kernel must be resident together: the queue
 * reader waits for them all. */
uint32_t dk_max_blocks(int device);
/* Loads the kernel's module now (lazy loading must not happen while it runs). */
int dk_preload(void);
#if defined(__cplusplus)
}
#endif

#endif /* DFCCL_DKERNEL_H */
