/*
 * The ring and tree algorithms of both engines, as a sequence of steps:
 * plain C in static inline functions that compile as host code (the host
 * engine) and, under nvcc, as device code (the daemon kernel), as
 * gpu/scheduler.h does for the scheduling policy.
 *
 * A communicator's topology (struct algo_topo) comes from the plan the
 * supervisor wrote into its region (proto/dfccl_comm.h): the ring order,
 * up to DFCCL_PLAN_TREES trees, and the algorithm per collective and size.
 * A task's algorithm (struct algo_run) is fixed when the task is created;
 * algo_step_get() then describes its step i: which ranks' progress it
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
 * A part: an algorithm may run over a part of the collective, elements
 * [base, base + count) of every block of `total` elements (the daemon
 * kernel runs one part per channel, each with its own progress words and
 * connector); the host engine runs the whole, base 0 and count = total.
 *
 * Buffers: a rank's send and receive buffers (the client's) and its
 * connector in the instance's slot (two halves of conn_bytes / 2 bytes:
 * DFCCL_COMM_CONN_BYTES on the host engine), the staging place of partial results that have no room in the
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
 *   reduce-scatter ring  n-1 steps per slice (a connector half) of
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
#ifndef DFCCL_ALGO_H
#define DFCCL_ALGO_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "sqe_check.h"

#define ALGO_TREE_MAX_CHILDREN 8u   /* a re-rooted tree node; the plan's trees have at most 7 */
#define ALGO_MAX_WAIT (ALGO_TREE_MAX_CHILDREN + 1)
#define ALGO_MAX_SRC (ALGO_TREE_MAX_CHILDREN + 1)
#define ALGO_SLICE_BYTES (256u * 1024) /* pipelined broadcast: bytes per step */

/* A communicator's plan, checked, as an engine uses it. */
struct algo_topo {
	int planned;                                            /* 1: from the region's plan; 0: defaults */
	uint32_t n;
	uint8_t ntrees;                                         /* 1..DFCCL_PLAN_TREES */
	uint8_t ring[DFCCL_COMM_MAX_RANKS];                     /* rank at ring position i */
	uint8_t ring_pos[DFCCL_COMM_MAX_RANKS];                 /* ring position of rank r */
	uint8_t parent[DFCCL_PLAN_TREES][DFCCL_COMM_MAX_RANKS]; /* DFCCL_PLAN_NO_PARENT at a root */
	uint8_t algo[DFCCL_PLAN_COLLS][DFCCL_PLAN_BUCKETS];     /* enum dfccl_algo */
};


/* One rank in one tree, rooted where the collective needs it. */
struct algo_tree_node {
	uint8_t parent; /* DFCCL_PLAN_NO_PARENT at the root */
	uint8_t nchild;
	uint8_t child[ALGO_TREE_MAX_CHILDREN];
	uint8_t leaf_mask; /* bit c: child[c] is a leaf (reduce reads its send buffer) */
};

/* A task's algorithm: its static context. */
struct algo_run {
	const struct algo_topo *topo;
	uint64_t total;   /* elements of the entry (a block of all-gather and reduce-scatter) */
	uint64_t base;    /* the part: from this element of every block ... */
	uint64_t count;   /* ... this many */
	uint32_t conn_bytes; /* the connector: two halves */
	uint32_t reserved;
	uint64_t slice;   /* elements per pipelined step */
	uint64_t nslices; /* pipelined steps per tree part (or of the chain) */
	uint32_t n, rank, root, dsize;
	uint32_t nsteps;
	uint8_t opcode, algo, redop, ntrees;
	struct algo_tree_node node[DFCCL_PLAN_TREES];
};

enum algo_buf_kind { ALGO_BUF_SEND = 0, ALGO_BUF_RECV, ALGO_BUF_CONN };

struct algo_buf {
	uint32_t rank;
	uint32_t kind; /* enum algo_buf_kind */
	uint64_t off;  /* elements from the start of the buffer (connector: of the whole connector) */
};

struct algo_step {
	uint32_t nwait;
	uint32_t wait[ALGO_MAX_WAIT];  /* ranks */
	uint32_t phase[ALGO_MAX_WAIT]; /* wait[k] must have finished its step phase[k] - 1 */
	uint32_t nsrc;                      /* 0: the step moves nothing */
	struct algo_buf src[ALGO_MAX_SRC];
	struct algo_buf dst;           /* this rank's */
	uint64_t elems;
	uint8_t reduce;                     /* 1: dst = src[0] op ... ; 0: dst = src[0] */
	uint8_t redop;                      /* the step's operation (avg: sum until the last) */
};

#define ALGO_PLAN_MAX_CHILDREN (ALGO_TREE_MAX_CHILDREN - 1) /* re-rooting adds one */

/* ------------------------------------------------------------------ topology */

static inline DFCCL_HD void algo_topo_defaults(struct algo_topo *t, uint32_t n)
{
	memset(t, 0, sizeof(*t));
	t->n = n;
	t->ntrees = (uint8_t)(n < DFCCL_PLAN_TREES ? n : DFCCL_PLAN_TREES);
	for (uint32_t i = 0; i < n; i++)
		t->ring[i] = (uint8_t)i;
	/* Tree k: the heap over the ranks rotated by k n / ntrees, so every
	 * tree has another root. */
	for (uint32_t k = 0; k < t->ntrees; k++) {
		uint32_t shift = k * n / t->ntrees;
		for (uint32_t pos = 0; pos < n; pos++)
			t->parent[k][(pos + shift) % n] = pos ? (uint8_t)(((pos - 1) / 2 + shift) % n) : DFCCL_PLAN_NO_PARENT;
	}
	memset(t->algo, DFCCL_ALGO_DIRECT, sizeof(t->algo));
}

/* Whether parent[] is one tree over n ranks whose nodes have at most
 * ALGO_PLAN_MAX_CHILDREN children. */
static inline DFCCL_HD int algo_tree_valid(const uint8_t *parent, uint32_t n)
{
	uint32_t roots = 0, nchild[DFCCL_COMM_MAX_RANKS] = {0};
	for (uint32_t r = 0; r < n; r++) {
		if (parent[r] == DFCCL_PLAN_NO_PARENT) {
			roots++;
			continue;
		}
		if (parent[r] >= n || parent[r] == r || ++nchild[parent[r]] > ALGO_PLAN_MAX_CHILDREN)
			return 0;
	}
	if (roots != 1)
		return 0;
	/* One root and no cycle: every chain of parents reaches it within n. */
	for (uint32_t r = 0; r < n; r++) {
		uint32_t v = r, hops = 0;
		while (parent[v] != DFCCL_PLAN_NO_PARENT && hops++ < n)
			v = parent[v];
		if (parent[v] != DFCCL_PLAN_NO_PARENT)
			return 0;
	}
	return 1;
}

static inline DFCCL_HD int algo_plan_valid(const struct dfccl_comm_plan *p, uint32_t n)
{
	if (p->ntrees < 1 || p->ntrees > DFCCL_PLAN_TREES || p->ntrees > n)
		return 0;
	uint8_t seen[DFCCL_COMM_MAX_RANKS] = {0};
	for (uint32_t i = 0; i < n; i++) {
		if (p->ring[i] >= n || seen[p->ring[i]])
			return 0;
		seen[p->ring[i]] = 1;
	}
	for (uint32_t k = 0; k < p->ntrees; k++)
		if (!algo_tree_valid(p->parent[k], n))
			return 0;
	for (uint32_t c = 0; c < DFCCL_PLAN_COLLS; c++)
		for (uint32_t b = 0; b < DFCCL_PLAN_BUCKETS; b++)
			if (p->algo[c][b] == DFCCL_ALGO_AUTO || p->algo[c][b] >= DFCCL_ALGO_COUNT_)
				return 0;
	return 1;
}

/*
 * Loads the plan of a region for n ranks (1..DFCCL_COMM_MAX_RANKS). A plan
 * that is absent or fails a check (the ring is no permutation, a tree has
 * a cycle, two roots or a node with too many children, an unknown
 * algorithm) is replaced by the defaults: rank order, balanced heap-order
 * trees rotated to distinct roots, direct everywhere. Returns 0 when the
 * plan was used, -ENOENT when there was none, -EINVAL when it was invalid.
 */
static inline DFCCL_HD int algo_topo_load(struct algo_topo *t, const struct dfccl_comm_plan *plan, uint32_t n)
{
	int rc = -ENOENT;
	algo_topo_defaults(t, n);
	if (plan && plan->valid == DFCCL_PLAN_VALID) {
		/* Copied first: the checks and the use must see the same bytes. */
		struct dfccl_comm_plan p;
		memcpy(&p, plan, sizeof(p));
		rc = -EINVAL;
		if (algo_plan_valid(&p, n)) {
			t->planned = 1;
			t->ntrees = p.ntrees;
			memcpy(t->ring, p.ring, n);
			memcpy(t->parent, p.parent, sizeof(t->parent));
			memcpy(t->algo, p.algo, sizeof(t->algo));
			rc = 0;
		}
	}
	for (uint32_t i = 0; i < n; i++)
		t->ring_pos[t->ring[i]] = (uint8_t)i;
	return rc;
}

/*
 * Rank `rank` in tree k re-rooted at `root`: the nodes on the path from
 * root up to the tree's own root turn their edge around, every other node
 * keeps its parent. A child is a leaf when its only neighbour is us.
 */
static inline DFCCL_HD void algo_tree_node_of(const struct algo_topo *t, uint32_t k, uint32_t rank, uint32_t root,
                      struct algo_tree_node *out)
{
	const uint8_t *P = t->parent[k];
	uint32_t n = t->n;
	uint8_t newp[DFCCL_COMM_MAX_RANKS];
	memcpy(newp, P, n);
	uint32_t prev = DFCCL_PLAN_NO_PARENT;
	for (uint32_t v = root; v != DFCCL_PLAN_NO_PARENT; v = P[v]) {
		newp[v] = (uint8_t)prev;
		prev = v;
	}
	uint8_t degree[DFCCL_COMM_MAX_RANKS] = {0};
	for (uint32_t v = 0; v < n; v++)
		if (P[v] != DFCCL_PLAN_NO_PARENT)
			degree[v]++, degree[P[v]]++;
	memset(out, 0, sizeof(*out));
	out->parent = newp[rank];
	for (uint32_t v = 0; v < n; v++) {
		if (newp[v] != rank)
			continue;
		if (degree[v] == 1)
			out->leaf_mask |= (uint8_t)(1u << out->nchild);
		out->child[out->nchild++] = (uint8_t)v;
	}
}

/* ------------------------------------------------------------------ choice */


/* Whether the host engine runs `algo` (enum dfccl_algo) for opcode. */
static inline DFCCL_HD int algo_runs(uint8_t opcode, uint8_t algo)
{
	switch (algo) {
	case DFCCL_ALGO_RING:
		return opcode == DFCCL_OP_ALLREDUCE || opcode == DFCCL_OP_ALLGATHER || opcode == DFCCL_OP_REDUCESCATTER ||
		       opcode == DFCCL_OP_BROADCAST || opcode == DFCCL_OP_REDUCE;
	case DFCCL_ALGO_TREE:
	case DFCCL_ALGO_MULTITREE:
		return opcode == DFCCL_OP_ALLREDUCE || opcode == DFCCL_OP_BROADCAST || opcode == DFCCL_OP_REDUCE;
	default: return 0;
	}
}

/* The plan's row of a collective (its order is enum topo_coll's), or -1. */
static inline DFCCL_HD int algo_plan_coll(uint8_t opcode)
{
	switch (opcode) {
	case DFCCL_OP_ALLREDUCE: return 0;
	case DFCCL_OP_ALLGATHER: return 1;
	case DFCCL_OP_REDUCESCATTER: return 2;
	case DFCCL_OP_BROADCAST: return 3;
	case DFCCL_OP_REDUCE: return 4;
	default: return -1;
	}
}

static inline DFCCL_HD uint32_t algo_ntrees(const struct algo_topo *t, uint8_t algo)
{
	return algo == DFCCL_ALGO_MULTITREE ? t->ntrees : 1;
}

/* Elements per pipelined step (reduce and reduce-scatter: a connector
 * half), and the steps of one part of count. */
static inline DFCCL_HD uint64_t algo_slice(uint8_t opcode, uint32_t dsize, uint32_t conn_bytes)
{
	switch (opcode) {
	case DFCCL_OP_REDUCE:
	case DFCCL_OP_REDUCESCATTER: return conn_bytes / 2 / dsize;
	case DFCCL_OP_BROADCAST: return ALGO_SLICE_BYTES / dsize;
	default: return 0; /* not pipelined */
	}
}

static inline DFCCL_HD uint64_t algo_nslices(uint64_t count, uint32_t parts, uint64_t slice)
{
	uint64_t part = (count + parts - 1) / parts;
	return part > slice ? (part + slice - 1) / slice : 1;
}

static inline DFCCL_HD uint64_t algo_steps(const struct algo_topo *t, uint8_t algo, uint8_t opcode, uint64_t count,
                                            uint32_t dsize, uint32_t conn_bytes)
{
	uint32_t n = t->n, k = algo_ntrees(t, algo);
	uint64_t slice = algo_slice(opcode, dsize, conn_bytes);
	switch (opcode) {
	case DFCCL_OP_ALLREDUCE: return algo == DFCCL_ALGO_RING ? 2 * (n - 1) : 2 * k;
	case DFCCL_OP_ALLGATHER: return n;
	case DFCCL_OP_REDUCESCATTER: return algo_nslices(count, 1, slice) * (n - 1);
	default: return algo == DFCCL_ALGO_RING ? algo_nslices(count, 1, slice) : k * algo_nslices(count, k, slice);
	}
}

/*
 * The algorithm a task runs: the entry's hint, else the engine's setting,
 * else the plan's choice for the collective and its size, as long as the
 * engine runs it for this collective and its steps fit the progress word;
 * DFCCL_ALGO_DIRECT otherwise (and always for one rank, send/recv and
 * all-to-all). Every rank computes the same from the same entry fields.
 * (The steps are counted for connectors of DFCCL_COMM_CONN_BYTES; an engine
 * whose parts have smaller ones checks its parts' steps in algo_init.)
 */
static inline DFCCL_HD uint8_t algo_choose(const struct algo_topo *t, uint8_t opcode, uint64_t count, uint32_t dsize,
                                           uint8_t hint, uint8_t setting)
{
	int c = algo_plan_coll(opcode);
	if (t->n < 2 || c < 0)
		return DFCCL_ALGO_DIRECT;
	uint8_t a = hint ? hint : setting;
	if (a == DFCCL_ALGO_AUTO) {
		uint64_t bytes = count * dsize;
		if (opcode == DFCCL_OP_ALLGATHER || opcode == DFCCL_OP_REDUCESCATTER)
			bytes *= t->n;
		a = t->algo[c][dfccl_size_bucket(bytes)];
	}
	if (!algo_runs(opcode, a) || algo_steps(t, a, opcode, count, dsize, DFCCL_COMM_CONN_BYTES) > DFCCL_PROGRESS_MAX_PHASE)
		return DFCCL_ALGO_DIRECT;
	return a;
}

/*
 * Fills a for the part [base, base + count) of a task of rank `rank` of a
 * collective of `total` elements running algo (not DIRECT), with
 * connectors of conn_bytes (a multiple of 32, at least 32). Returns 0, or
 * -E2BIG when the part has more steps than a progress word counts.
 */
static inline DFCCL_HD int algo_init(struct algo_run *a, const struct algo_topo *t, uint8_t algo, uint8_t opcode,
                                     uint8_t redop, uint32_t rank, uint32_t root, uint64_t total, uint64_t base,
                                     uint64_t count, uint32_t dsize, uint32_t conn_bytes)
{
	memset(a, 0, sizeof(*a));
	a->topo = t;
	a->n = t->n;
	a->rank = rank;
	a->root = root;
	a->total = total;
	a->base = base;
	a->count = count;
	a->conn_bytes = conn_bytes;
	a->dsize = dsize;
	a->opcode = opcode;
	a->algo = algo;
	a->redop = redop;
	a->ntrees = (uint8_t)algo_ntrees(t, algo);
	a->slice = algo_slice(opcode, dsize, conn_bytes);
	if (a->slice)
		a->nslices = algo_nslices(count, algo == DFCCL_ALGO_RING ? 1 : a->ntrees, a->slice);
	uint64_t steps = algo_steps(t, algo, opcode, count, dsize, conn_bytes);
	if (steps > DFCCL_PROGRESS_MAX_PHASE)
		return -E2BIG;
	a->nsteps = (uint32_t)steps;
	if (algo == DFCCL_ALGO_RING)
		return 0;
	for (uint32_t k = 0; k < a->ntrees; k++) {
		uint32_t r = root;
		if (opcode == DFCCL_OP_ALLREDUCE) /* each tree at its own root */
			for (r = 0; t->parent[k][r] != DFCCL_PLAN_NO_PARENT; r++)
				;
		algo_tree_node_of(t, k, rank, r, &a->node[k]);
	}
	return 0;
}

/* ------------------------------------------------------------------ steps */

static inline DFCCL_HD void algo_add_wait(struct algo_step *s, uint32_t rank, uint32_t phase)
{
	s->wait[s->nwait] = rank;
	s->phase[s->nwait++] = phase;
}

static inline DFCCL_HD struct algo_buf algo_buf_at(uint32_t rank, uint32_t kind, uint64_t off)
{
	struct algo_buf b;
	b.rank = rank;
	b.kind = kind;
	b.off = off;
	return b;
}

static inline DFCCL_HD void algo_add_src(struct algo_step *s, uint32_t rank, uint32_t kind, uint64_t off)
{
	s->src[s->nsrc++] = algo_buf_at(rank, kind, off);
}

/* Whether algo stages partial results of opcode in connectors. */
static inline DFCCL_HD int algo_uses_conn(uint8_t opcode, uint8_t algo)
{
	return algo != DFCCL_ALGO_DIRECT && (opcode == DFCCL_OP_REDUCE || opcode == DFCCL_OP_REDUCESCATTER);
}

/* The reduction of a step: avg sums until the step that finishes. */
static inline DFCCL_HD uint8_t algo_step_op(const struct algo_run *a, int last)
{
	return a->redop == SQE_REDOP_AVG && !last ? (uint8_t)SQE_REDOP_SUM : a->redop;
}

static inline DFCCL_HD uint32_t algo_ring_at(const struct algo_run *a, uint32_t pos, int delta)
{
	uint32_t n = a->n;
	return a->topo->ring[(pos + n + (uint32_t)(delta % (int)n)) % n];
}

/* First element of chunk i of n (all-reduce) or part i of k (trees). */
static inline DFCCL_HD uint64_t algo_split_lo(uint64_t count, uint32_t i, uint32_t k)
{
	return (uint64_t)i * count / k;
}

static inline DFCCL_HD void algo_allreduce_ring(const struct algo_run *a, uint32_t i, struct algo_step *s)
{
	uint32_t n = a->n, r = a->rank, p = a->topo->ring_pos[r];
	uint32_t left = algo_ring_at(a, p, -1), right = algo_ring_at(a, p, 1);
	if (i < n - 1) {
		/* reduce-scatter: chunk (p - i - 1) becomes left's partial op ours */
		uint32_t k = (p + 2 * n - i - 1) % n;
		uint64_t lo = algo_split_lo(a->count, k, n);
		s->elems = algo_split_lo(a->count, k + 1, n) - lo;
		if (i > 0)
			algo_add_wait(s, left, i);
		algo_add_src(s, left, i > 0 ? ALGO_BUF_RECV : ALGO_BUF_SEND, lo);
		algo_add_src(s, r, ALGO_BUF_SEND, lo);
		s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
		s->reduce = 1;
		s->redop = algo_step_op(a, i == n - 2);
		return;
	}
	/* all-gather: chunk (p - s) from left. The first step overwrites our
	 * chunk p, which right's first reduce-scatter step reads (in place: the
	 * same bytes as our send buffer). The chain of left waits already
	 * orders it after that read (left finished its reduce-scatter, which
	 * needed right's first step); the wait on right says so directly and
	 * costs one load. */
	uint32_t st = i - (n - 1), k = (p + n - st) % n;
	uint64_t lo = algo_split_lo(a->count, k, n);
	s->elems = algo_split_lo(a->count, k + 1, n) - lo;
	algo_add_wait(s, left, i);
	if (st == 0)
		algo_add_wait(s, right, i);
	algo_add_src(s, left, ALGO_BUF_RECV, lo);
	s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
}

static inline DFCCL_HD void algo_allreduce_tree(const struct algo_run *a, uint32_t i, struct algo_step *s)
{
	uint32_t tree = i / 2, r = a->rank;
	const struct algo_tree_node *nd = &a->node[tree];
	uint64_t lo = algo_split_lo(a->count, tree, a->ntrees);
	s->elems = algo_split_lo(a->count, tree + 1, a->ntrees) - lo;
	s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
	if (i % 2 == 0) {
		/* up: our send buffer op the children's partials */
		algo_add_src(s, r, ALGO_BUF_SEND, lo);
		for (uint32_t c = 0; c < nd->nchild; c++) {
			algo_add_wait(s, nd->child[c], i + 1);
			algo_add_src(s, nd->child[c], ALGO_BUF_RECV, lo);
		}
		s->reduce = 1;
		s->redop = algo_step_op(a, nd->parent == DFCCL_PLAN_NO_PARENT);
		return;
	}
	if (nd->parent == DFCCL_PLAN_NO_PARENT) {
		s->elems = 0; /* the root's part is final since its up step */
		return;
	}
	algo_add_wait(s, nd->parent, i + 1);
	algo_add_src(s, nd->parent, ALGO_BUF_RECV, lo);
}

static inline DFCCL_HD void algo_allgather_ring(const struct algo_run *a, uint32_t i, struct algo_step *s)
{
	uint32_t r = a->rank, p = a->topo->ring_pos[r];
	s->elems = a->count;
	if (i == 0) {
		algo_add_src(s, r, ALGO_BUF_SEND, 0);
		s->dst = algo_buf_at(r, ALGO_BUF_RECV, (uint64_t)r * a->count);
		return;
	}
	uint32_t left = algo_ring_at(a, p, -1), b = algo_ring_at(a, p, -(int)i);
	algo_add_wait(s, left, i);
	algo_add_src(s, left, ALGO_BUF_RECV, (uint64_t)b * a->count);
	s->dst = algo_buf_at(r, ALGO_BUF_RECV, (uint64_t)b * a->count);
}

/* [lo, lo + elems) of slice j of [plo, phi). */
static inline DFCCL_HD void algo_slice_range(const struct algo_run *a, uint64_t plo, uint64_t phi, uint64_t j, uint64_t *lo,
                        uint64_t *elems)
{
	uint64_t start = plo + j * a->slice;
	*lo = start;
	*elems = start >= phi ? 0 : (phi - start < a->slice ? phi - start : a->slice);
}

/* A connector half, in elements from the connector's start. */
static inline DFCCL_HD uint64_t algo_conn_half(const struct algo_run *a, uint64_t step)
{
	return (step % 2) * (a->conn_bytes / 2 / a->dsize);
}

static inline DFCCL_HD void algo_reducescatter_ring(const struct algo_run *a, uint32_t g, struct algo_step *s)
{
	uint32_t n = a->n, r = a->rank, p = a->topo->ring_pos[r];
	uint32_t left = algo_ring_at(a, p, -1), right = algo_ring_at(a, p, 1);
	uint32_t j = g / (n - 1), st = g % (n - 1);
	/* The partial of block b passes b + 1, b + 2, ..., and ends at b. */
	uint32_t b = algo_ring_at(a, p, -(int)st - 2);
	uint64_t lo, in_block = (uint64_t)b * a->count;
	algo_slice_range(a, 0, a->count, j, &lo, &s->elems);
	if (st == 0) {
		algo_add_src(s, left, ALGO_BUF_SEND, in_block + lo);
	} else {
		algo_add_wait(s, left, g);
		algo_add_src(s, left, ALGO_BUF_CONN, algo_conn_half(a, g - 1));
	}
	algo_add_src(s, r, ALGO_BUF_SEND, in_block + lo);
	s->reduce = 1;
	s->redop = algo_step_op(a, st == n - 2);
	if (st == n - 2) {
		s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
		return;
	}
	/* Our half was last read by right's step g - 1. */
	if (g >= 2)
		algo_add_wait(s, right, g);
	s->dst = algo_buf_at(r, ALGO_BUF_CONN, algo_conn_half(a, g));
}

static inline DFCCL_HD void algo_broadcast_ring(const struct algo_run *a, uint32_t j, struct algo_step *s)
{
	uint32_t r = a->rank, p = a->topo->ring_pos[r];
	uint64_t lo;
	algo_slice_range(a, 0, a->count, j, &lo, &s->elems);
	s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
	if (r == a->root) {
		algo_add_src(s, r, ALGO_BUF_SEND, lo);
		return;
	}
	uint32_t left = algo_ring_at(a, p, -1);
	algo_add_wait(s, left, j + 1);
	algo_add_src(s, left, ALGO_BUF_RECV, lo);
}

static inline DFCCL_HD void algo_broadcast_tree(const struct algo_run *a, uint32_t i, struct algo_step *s)
{
	uint32_t tree = (uint32_t)(i / a->nslices), r = a->rank;
	uint64_t lo;
	algo_slice_range(a, algo_split_lo(a->count, tree, a->ntrees), algo_split_lo(a->count, tree + 1, a->ntrees), i % a->nslices, &lo,
	            &s->elems);
	s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
	const struct algo_tree_node *nd = &a->node[tree];
	if (nd->parent == DFCCL_PLAN_NO_PARENT) {
		algo_add_src(s, r, ALGO_BUF_SEND, lo);
		return;
	}
	algo_add_wait(s, nd->parent, i + 1);
	algo_add_src(s, nd->parent, ALGO_BUF_RECV, lo);
}

static inline DFCCL_HD void algo_reduce_ring(const struct algo_run *a, uint32_t j, struct algo_step *s)
{
	uint32_t n = a->n, r = a->rank, p = a->topo->ring_pos[r];
	uint32_t e = (p + n - a->topo->ring_pos[a->root]) % n; /* 1: the chain's start, 0: the root, its end */
	uint32_t pred = algo_ring_at(a, p, -1), succ = algo_ring_at(a, p, 1);
	uint64_t lo;
	algo_slice_range(a, 0, a->count, j, &lo, &s->elems);
	if (e == 1)
		return; /* the next rank reads our send buffer */
	if (e == 2 || (e == 0 && n == 2)) {
		algo_add_src(s, pred, ALGO_BUF_SEND, lo);
	} else {
		algo_add_wait(s, pred, j + 1);
		algo_add_src(s, pred, ALGO_BUF_CONN, algo_conn_half(a, j));
	}
	algo_add_src(s, r, ALGO_BUF_SEND, lo);
	s->reduce = 1;
	s->redop = algo_step_op(a, e == 0);
	if (e == 0) {
		s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
		return;
	}
	/* Our half was last read by succ's step j - 2. */
	if (j >= 2)
		algo_add_wait(s, succ, j - 1);
	s->dst = algo_buf_at(r, ALGO_BUF_CONN, algo_conn_half(a, j));
}

/* Whether rank writes its connector in tree k of a reduce: it is neither
 * the root nor a leaf. */
static inline DFCCL_HD int algo_reduce_writes(const struct algo_run *a, uint32_t k)
{
	return a->node[k].parent != DFCCL_PLAN_NO_PARENT && a->node[k].nchild > 0;
}

static inline DFCCL_HD void algo_reduce_tree(const struct algo_run *a, uint32_t i, struct algo_step *s)
{
	uint32_t tree = (uint32_t)(i / a->nslices), r = a->rank;
	uint64_t j = i % a->nslices, lo;
	const struct algo_tree_node *nd = &a->node[tree];
	uint64_t plo = algo_split_lo(a->count, tree, a->ntrees);
	algo_slice_range(a, plo, algo_split_lo(a->count, tree + 1, a->ntrees), j, &lo, &s->elems);
	if (nd->parent != DFCCL_PLAN_NO_PARENT && nd->nchild == 0)
		return; /* a leaf: the parent reads our send buffer */
	algo_add_src(s, r, ALGO_BUF_SEND, lo);
	for (uint32_t c = 0; c < nd->nchild; c++) {
		if (nd->leaf_mask & (1u << c)) {
			algo_add_src(s, nd->child[c], ALGO_BUF_SEND, lo);
		} else {
			algo_add_wait(s, nd->child[c], i + 1);
			algo_add_src(s, nd->child[c], ALGO_BUF_CONN, algo_conn_half(a, i));
		}
	}
	s->reduce = 1;
	s->redop = algo_step_op(a, nd->parent == DFCCL_PLAN_NO_PARENT);
	if (nd->parent == DFCCL_PLAN_NO_PARENT) {
		s->dst = algo_buf_at(r, ALGO_BUF_RECV, lo);
		return;
	}
	s->dst = algo_buf_at(r, ALGO_BUF_CONN, algo_conn_half(a, i));
	/* The last step before this one that wrote the same half: its reader
	 * (the parent in that step's tree) must have finished it. Within one
	 * tree that is step i - 2; across trees, the last step of that parity
	 * in the latest earlier tree this rank wrote in. */
	if (j >= 2) {
		algo_add_wait(s, nd->parent, i - 1);
		return;
	}
	for (uint32_t k = tree; k-- > 0;) {
		if (!algo_reduce_writes(a, k))
			continue;
		uint64_t last = (uint64_t)k * a->nslices + a->nslices - 1;
		if (last % 2 != i % 2) {
			if (a->nslices < 2)
				continue;
			last--;
		}
		algo_add_wait(s, a->node[k].parent, (uint32_t)last + 1);
		return;
	}
	/* Before the first tree this rank writes in: j == 1 can follow j == 0
	 * of this tree only, which wrote the other half. */
}

/*
 * Where offset `off` of the part (as the steps above describe it: blocks of
 * count elements) lies in the client's buffer of `kind` (blocks of total
 * elements, the part from base in each). A step never crosses a block.
 */
static inline DFCCL_HD uint64_t algo_part_off(const struct algo_run *a, uint32_t kind, uint64_t off)
{
	int blocked = (a->opcode == DFCCL_OP_ALLGATHER && kind == ALGO_BUF_RECV) ||
	              (a->opcode == DFCCL_OP_REDUCESCATTER && kind == ALGO_BUF_SEND);
	if (kind == ALGO_BUF_CONN)
		return off;
	if (!blocked || a->count == 0)
		return a->base + off;
	return off / a->count * a->total + a->base + off % a->count;
}

/* Describes step i (< a->nsteps) of a. */
static inline DFCCL_HD void algo_step_get(const struct algo_run *a, uint32_t i, struct algo_step *s)
{
	memset(s, 0, sizeof(*s));
	s->redop = a->redop;
	switch (a->opcode) {
	case DFCCL_OP_ALLREDUCE:
		if (a->algo == DFCCL_ALGO_RING)
			algo_allreduce_ring(a, i, s);
		else
			algo_allreduce_tree(a, i, s);
		break;
	case DFCCL_OP_ALLGATHER: algo_allgather_ring(a, i, s); break;
	case DFCCL_OP_REDUCESCATTER: algo_reducescatter_ring(a, i, s); break;
	case DFCCL_OP_BROADCAST:
		if (a->algo == DFCCL_ALGO_RING)
			algo_broadcast_ring(a, i, s);
		else
			algo_broadcast_tree(a, i, s);
		break;
	default: /* DFCCL_OP_REDUCE */
		if (a->algo == DFCCL_ALGO_RING)
			algo_reduce_ring(a, i, s);
		else
			algo_reduce_tree(a, i, s);
		break;
	}
	if (a->base == 0 && a->count == a->total)
		return;
	for (uint32_t k = 0; k < s->nsrc; k++)
		s->src[k].off = algo_part_off(a, s->src[k].kind, s->src[k].off);
	s->dst.off = algo_part_off(a, s->dst.kind, s->dst.off);
}

/* Elements of rank r's buffer of kind k in a's collective. */
static inline DFCCL_HD uint64_t algo_buf_elems(const struct algo_run *a, uint32_t r, uint32_t k)
{
	if (k == ALGO_BUF_CONN)
		return a->conn_bytes / a->dsize;
	uint64_t send, recv;
	if (sqe_buf_elems(a->opcode, a->total, a->n, r == a->root, &send, &recv) < 0)
		return 0;
	return k == ALGO_BUF_SEND ? send : recv;
}

static inline DFCCL_HD int algo_buf_fits(const struct algo_run *a, const struct algo_buf *b, uint64_t elems)
{
	if (b->rank >= a->n || b->kind > ALGO_BUF_CONN)
		return 0;
	uint64_t size = algo_buf_elems(a, b->rank, b->kind);
	return b->off <= size && elems <= size - b->off;
}

/*
 * Whether step s of a stays inside what the collective owns: every source
 * and the destination within its rank's send or receive buffer as the
 * collective sizes them (or within the connector), the destination this
 * rank's and not a send buffer, waits on ranks of the communicator for
 * phases that exist. The engine checks every step before it moves data,
 * so a wrong plan or a bug here fails the collective instead of writing
 * into another buffer.
 */
static inline DFCCL_HD int algo_step_valid(const struct algo_run *a, const struct algo_step *s)
{
	if (s->nwait > ALGO_MAX_WAIT || s->nsrc > ALGO_MAX_SRC)
		return 0;
	for (uint32_t k = 0; k < s->nwait; k++)
		if (s->wait[k] >= a->n || s->wait[k] == a->rank || s->phase[k] > a->nsteps)
			return 0;
	if (s->nsrc == 0 || s->elems == 0)
		return 1;
	if (s->dst.rank != a->rank || s->dst.kind == ALGO_BUF_SEND || !algo_buf_fits(a, &s->dst, s->elems))
		return 0;
	for (uint32_t k = 0; k < s->nsrc; k++)
		if (!algo_buf_fits(a, &s->src[k], s->elems))
			return 0;
	return 1;
}

#endif /* DFCCL_ALGO_H */
