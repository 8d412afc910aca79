/*
 * The ring and tree algorithms of the host engine, as a sequence of steps.
 *
 * A communicator's topology (struct host_topo) comes from the plan the
 * supervisor wrote into its region (proto/dfccl_comm.h): the ring order,
 * up to DFCCL_PLAN_TREES trees, and the algorithm per collective and size.
 * A task's algorithm (struct host_algo) is fixed when the task is created;
 * host_algo_step() then describes its step i: which ranks' progress it
 * waits for, and what it moves -- a copy of one source or a reduction of
 * several into this rank's receive buffer or connector. Every rank of an
 * instance runs the same number of steps and publishes
 * DFCCL_PROGRESS(key, i + 1) once its step i is done, so a step waits for
 * "rank q finished its step j" as "q's progress >= DFCCL_PROGRESS(key,
 * j + 1)". A step waits either for lower-numbered steps of other ranks,
 * or for the same step of its neighbours along a tree (children on the way
 * up, the parent on the way down) or a chain; trees and chains have no
 * cycles, so no set of waits is circular (test_host_algo simulates every
 * shape).
 *
 * Buffers: a rank's send and receive buffers (the client's) and its
 * connector in the instance's slot (two halves of DFCCL_COMM_CONN_HALF
 * bytes), the staging place of partial results that have no room in the
 * client's buffers. A connector half is written again only after the rank
 * that read its previous contents finished that step.
 *
 *   all-reduce ring      2(n-1) steps over the plan's ring: reduce-scatter of
 *                        chunk (p - i - 1) of ring position p into the
 *                        receive buffers, then all-gather of the chunks.
 *   all-reduce trees     2 steps per tree: up (own send op the children's
 *                        partials -> receive), down (the parent's result).
 *                        Tree k carries part k of ntrees (multi-tree), tree
 *                        0 alone the whole buffer (single tree).
 *   all-gather ring      n steps: own block, then block (p - s) from the left.
 *   reduce-scatter ring  n-1 steps per slice of DFCCL_COMM_CONN_HALF bytes of
 *                        a block: the partial of block (p - s - 2) travels
 *                        through the connectors, the last step lands in the
 *                        receive buffer.
 *   broadcast ring       a chain from the root, pipelined in slices.
 *   broadcast trees      the plan's trees re-rooted at the root, pipelined.
 *   reduce ring          a chain ending at the root, partials in connectors.
 *   reduce trees         the trees re-rooted at the root, partials in
 *                        connectors, children that are leaves read directly.
 *
 * Reductions with avg sum through the intermediate steps and divide in the
 * step that finishes an element (ring: the chunk's last step, trees: the
 * root). The element order of a reduction follows the ring or tree, so
 * results equal the direct algorithms' only where arithmetic is exact.
 */
#ifndef DFCCL_HOST_ALGO_H
#define DFCCL_HOST_ALGO_H

#include <stdint.h>

#include "dfccl_comm.h"
#include "dfccl_queue.h"

#define HOST_TREE_MAX_CHILDREN 8u   /* a re-rooted tree node; the plan's trees have at most 7 */
#define HOST_ALGO_MAX_WAIT (HOST_TREE_MAX_CHILDREN + 1)
#define HOST_ALGO_MAX_SRC (HOST_TREE_MAX_CHILDREN + 1)
#define HOST_ALGO_SLICE_BYTES (256u * 1024) /* pipelined broadcast: bytes per step */

/* A communicator's plan, checked, as an engine uses it. */
struct host_topo {
	int planned;                                            /* 1: from the region's plan; 0: defaults */
	uint32_t n;
	uint8_t ntrees;                                         /* 1..DFCCL_PLAN_TREES */
	uint8_t ring[DFCCL_COMM_MAX_RANKS];                     /* rank at ring position i */
	uint8_t ring_pos[DFCCL_COMM_MAX_RANKS];                 /* ring position of rank r */
	uint8_t parent[DFCCL_PLAN_TREES][DFCCL_COMM_MAX_RANKS]; /* DFCCL_PLAN_NO_PARENT at a root */
	uint8_t algo[DFCCL_PLAN_COLLS][DFCCL_PLAN_BUCKETS];     /* enum dfccl_algo */
};

/*
 * Loads the plan of a region for n ranks (1..DFCCL_COMM_MAX_RANKS). A plan
 * that is absent or fails a check (the ring is no permutation, a tree has
 * a cycle, two roots or a node with too many children, an unknown
 * algorithm) is replaced by the defaults: rank order, balanced heap-order
 * trees rotated to distinct roots, direct everywhere. Returns 0 when the
 * plan was used, -ENOENT when there was none, -EINVAL when it was invalid.
 */
int host_topo_load(struct host_topo *t, const struct dfccl_comm_plan *plan, uint32_t n);

/* One rank in one tree, rooted where the collective needs it. */
struct host_tree_node {
	uint8_t parent; /* DFCCL_PLAN_NO_PARENT at the root */
	uint8_t nchild;
	uint8_t child[HOST_TREE_MAX_CHILDREN];
	uint8_t leaf_mask; /* bit c: child[c] is a leaf (reduce reads its send buffer) */
};

/* A task's algorithm: its static context. */
struct host_algo {
	const struct host_topo *topo;
	uint64_t count;   /* elements of the entry */
	uint64_t slice;   /* elements per pipelined step */
	uint64_t nslices; /* pipelined steps per tree part (or of the chain) */
	uint32_t n, rank, root, dsize;
	uint32_t nsteps;
	uint8_t opcode, algo, redop, ntrees;
	struct host_tree_node node[DFCCL_PLAN_TREES];
};

enum host_buf_kind { HOST_BUF_SEND = 0, HOST_BUF_RECV, HOST_BUF_CONN };

struct host_algo_buf {
	uint32_t rank;
	uint32_t kind; /* enum host_buf_kind */
	uint64_t off;  /* elements from the start of the buffer (connector: of the whole connector) */
};

struct host_algo_step {
	uint32_t nwait;
	uint32_t wait[HOST_ALGO_MAX_WAIT];  /* ranks */
	uint32_t phase[HOST_ALGO_MAX_WAIT]; /* wait[k] must have finished its step phase[k] - 1 */
	uint32_t nsrc;                      /* 0: the step moves nothing */
	struct host_algo_buf src[HOST_ALGO_MAX_SRC];
	struct host_algo_buf dst;           /* this rank's */
	uint64_t elems;
	uint8_t reduce;                     /* 1: dst = src[0] op ... ; 0: dst = src[0] */
	uint8_t redop;                      /* the step's operation (avg: sum until the last) */
};


/* Whether the host engine runs `algo` (enum dfccl_algo) for opcode. */
int host_algo_runs(uint8_t opcode, uint8_t algo);

/*
 * The algorithm a task runs: the entry's hint, else the engine's setting,
 * else the plan's choice for the collective and its size, as long as the
 * engine runs it for this collective and its steps fit the progress word;
 * DFCCL_ALGO_DIRECT otherwise (and always for one rank, send/recv and
 * all-to-all). Every rank computes the same from the same entry fields.
 */
uint8_t host_algo_choose(const struct host_topo *t, uint8_t opcode, uint64_t count, uint32_t dsize, uint8_t hint,
                         uint8_t setting);

/* Fills a for a task of rank `rank` running algo (not DIRECT). */
void host_algo_init(struct host_algo *a, const struct host_topo *t, uint8_t algo, uint8_t opcode, uint8_t redop,
                    uint32_t rank, uint32_t root, uint64_t count, uint32_t dsize);

/* Describes step i (< a->nsteps) of a. */
void host_algo_step(const struct host_algo *a, uint32_t i, struct host_algo_step *s);

/*
 * Whether step s of a stays inside what the collective owns: every source
 * and the destination within its rank's send or receive buffer as the
 * collective sizes them (or within the connector), the destination this
 * rank's and not a send buffer, waits on ranks of the communicator for
 * phases that exist. The engine checks every step before it moves data,
 * so a wrong plan or a bug here fails the collective instead of writing
 * into another buffer.
 */
int host_algo_step_valid(const struct host_algo *a, const struct host_algo_step *s);

#endif /* DFCCL_HOST_ALGO_H */
