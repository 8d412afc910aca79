/* See host_algo.h. */
#include "host_algo.h"

#include <errno.h>
#include <string.h>

#include "reduce.h"
#include "sqe_check.h"

#define NO_PARENT DFCCL_PLAN_NO_PARENT
#define PLAN_MAX_CHILDREN (HOST_TREE_MAX_CHILDREN - 1) /* re-rooting adds one */

/* ------------------------------------------------------------------ topology */

static void topo_defaults(struct host_topo *t, uint32_t n)
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
			t->parent[k][(pos + shift) % n] = pos ? (uint8_t)(((pos - 1) / 2 + shift) % n) : NO_PARENT;
	}
	memset(t->algo, DFCCL_ALGO_DIRECT, sizeof(t->algo));
}

/* Whether parent[] is one tree over n ranks whose nodes have at most
 * PLAN_MAX_CHILDREN children. */
static int tree_valid(const uint8_t *parent, uint32_t n)
{
	uint32_t roots = 0, nchild[DFCCL_COMM_MAX_RANKS] = {0};
	for (uint32_t r = 0; r < n; r++) {
		if (parent[r] == NO_PARENT) {
			roots++;
			continue;
		}
		if (parent[r] >= n || parent[r] == r || ++nchild[parent[r]] > PLAN_MAX_CHILDREN)
			return 0;
	}
	if (roots != 1)
		return 0;
	/* One root and no cycle: every chain of parents reaches it within n. */
	for (uint32_t r = 0; r < n; r++) {
		uint32_t v = r, hops = 0;
		while (parent[v] != NO_PARENT && hops++ < n)
			v = parent[v];
		if (parent[v] != NO_PARENT)
			return 0;
	}
	return 1;
}

static int plan_valid(const struct dfccl_comm_plan *p, uint32_t n)
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
		if (!tree_valid(p->parent[k], n))
			return 0;
	for (uint32_t c = 0; c < DFCCL_PLAN_COLLS; c++)
		for (uint32_t b = 0; b < DFCCL_PLAN_BUCKETS; b++)
			if (p->algo[c][b] == DFCCL_ALGO_AUTO || p->algo[c][b] >= DFCCL_ALGO_COUNT_)
				return 0;
	return 1;
}

int host_topo_load(struct host_topo *t, const struct dfccl_comm_plan *plan, uint32_t n)
{
	int rc = -ENOENT;
	topo_defaults(t, n);
	if (plan && plan->valid == DFCCL_PLAN_VALID) {
		/* Copied first: the checks and the use must see the same bytes. */
		struct dfccl_comm_plan p;
		memcpy(&p, plan, sizeof(p));
		rc = -EINVAL;
		if (plan_valid(&p, n)) {
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
static void tree_node(const struct host_topo *t, uint32_t k, uint32_t rank, uint32_t root,
                      struct host_tree_node *out)
{
	const uint8_t *P = t->parent[k];
	uint32_t n = t->n;
	uint8_t newp[DFCCL_COMM_MAX_RANKS];
	memcpy(newp, P, n);
	uint32_t prev = NO_PARENT;
	for (uint32_t v = root; v != NO_PARENT; v = P[v]) {
		newp[v] = (uint8_t)prev;
		prev = v;
	}
	uint8_t degree[DFCCL_COMM_MAX_RANKS] = {0};
	for (uint32_t v = 0; v < n; v++)
		if (P[v] != NO_PARENT)
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


int host_algo_runs(uint8_t opcode, uint8_t algo)
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
static int plan_coll(uint8_t opcode)
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

static uint32_t algo_ntrees(const struct host_topo *t, uint8_t algo)
{
	return algo == DFCCL_ALGO_MULTITREE ? t->ntrees : 1;
}

/* Elements per pipelined step, and the steps of one part of count. */
static uint64_t algo_slice(uint8_t opcode, uint32_t dsize)
{
	switch (opcode) {
	case DFCCL_OP_REDUCE:
	case DFCCL_OP_REDUCESCATTER: return DFCCL_COMM_CONN_HALF / dsize;
	case DFCCL_OP_BROADCAST: return HOST_ALGO_SLICE_BYTES / dsize;
	default: return 0; /* not pipelined */
	}
}

static uint64_t algo_nslices(uint64_t count, uint32_t parts, uint64_t slice)
{
	uint64_t part = (count + parts - 1) / parts;
	return part > slice ? (part + slice - 1) / slice : 1;
}

static uint64_t algo_steps(const struct host_topo *t, uint8_t algo, uint8_t opcode, uint64_t count, uint32_t dsize)
{
	uint32_t n = t->n, k = algo_ntrees(t, algo);
	uint64_t slice = algo_slice(opcode, dsize);
	switch (opcode) {
	case DFCCL_OP_ALLREDUCE: return algo == DFCCL_ALGO_RING ? 2 * (n - 1) : 2 * k;
	case DFCCL_OP_ALLGATHER: return n;
	case DFCCL_OP_REDUCESCATTER: return algo_nslices(count, 1, slice) * (n - 1);
	default: return algo == DFCCL_ALGO_RING ? algo_nslices(count, 1, slice) : k * algo_nslices(count, k, slice);
	}
}

uint8_t host_algo_choose(const struct host_topo *t, uint8_t opcode, uint64_t count, uint32_t dsize, uint8_t hint,
                         uint8_t setting)
{
	int c = plan_coll(opcode);
	if (t->n < 2 || c < 0)
		return DFCCL_ALGO_DIRECT;
	uint8_t a = hint ? hint : setting;
	if (a == DFCCL_ALGO_AUTO) {
		uint64_t bytes = count * dsize;
		if (opcode == DFCCL_OP_ALLGATHER || opcode == DFCCL_OP_REDUCESCATTER)
			bytes *= t->n;
		a = t->algo[c][dfccl_size_bucket(bytes)];
	}
	if (!host_algo_runs(opcode, a) || algo_steps(t, a, opcode, count, dsize) > DFCCL_PROGRESS_MAX_PHASE)
		return DFCCL_ALGO_DIRECT;
	return a;
}

void host_algo_init(struct host_algo *a, const struct host_topo *t, uint8_t algo, uint8_t opcode, uint8_t redop,
                    uint32_t rank, uint32_t root, uint64_t count, uint32_t dsize)
{
	memset(a, 0, sizeof(*a));
	a->topo = t;
	a->n = t->n;
	a->rank = rank;
	a->root = root;
	a->count = count;
	a->dsize = dsize;
	a->opcode = opcode;
	a->algo = algo;
	a->redop = redop;
	a->ntrees = (uint8_t)algo_ntrees(t, algo);
	a->slice = algo_slice(opcode, dsize);
	if (a->slice)
		a->nslices = algo_nslices(count, algo == DFCCL_ALGO_RING ? 1 : a->ntrees, a->slice);
	a->nsteps = (uint32_t)algo_steps(t, algo, opcode, count, dsize);
	if (algo == DFCCL_ALGO_RING)
		return;
	for (uint32_t k = 0; k < a->ntrees; k++) {
		uint32_t r = root;
		if (opcode == DFCCL_OP_ALLREDUCE) /* each tree at its own root */
			for (r = 0; t->parent[k][r] != NO_PARENT; r++)
				;
		tree_node(t, k, rank, r, &a->node[k]);
	}
}

/* ------------------------------------------------------------------ steps */

static void add_wait(struct host_algo_step *s, uint32_t rank, uint32_t phase)
{
	s->wait[s->nwait] = rank;
	s->phase[s->nwait++] = phase;
}

static void add_src(struct host_algo_step *s, uint32_t rank, uint32_t kind, uint64_t off)
{
	s->src[s->nsrc++] = (struct host_algo_buf){rank, kind, off};
}

/* The reduction of a step: avg sums until the step that finishes. */
static uint8_t step_op(const struct host_algo *a, int last)
{
	return a->redop == REDUCE_AVG && !last ? REDUCE_SUM : a->redop;
}

static uint32_t ring_at(const struct host_algo *a, uint32_t pos, int delta)
{
	uint32_t n = a->n;
	return a->topo->ring[(pos + n + (uint32_t)(delta % (int)n)) % n];
}

/* First element of chunk i of n (all-reduce) or part i of k (trees). */
static uint64_t split_lo(uint64_t count, uint32_t i, uint32_t k)
{
	return (uint64_t)i * count / k;
}

static void allreduce_ring(const struct host_algo *a, uint32_t i, struct host_algo_step *s)
{
	uint32_t n = a->n, r = a->rank, p = a->topo->ring_pos[r];
	uint32_t left = ring_at(a, p, -1), right = ring_at(a, p, 1);
	if (i < n - 1) {
		/* reduce-scatter: chunk (p - i - 1) becomes left's partial op ours */
		uint32_t k = (p + 2 * n - i - 1) % n;
		uint64_t lo = split_lo(a->count, k, n);
		s->elems = split_lo(a->count, k + 1, n) - lo;
		if (i > 0)
			add_wait(s, left, i);
		add_src(s, left, i > 0 ? HOST_BUF_RECV : HOST_BUF_SEND, lo);
		add_src(s, r, HOST_BUF_SEND, lo);
		s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
		s->reduce = 1;
		s->redop = step_op(a, i == n - 2);
		return;
	}
	/* all-gather: chunk (p - s) from left. The first step overwrites our
	 * chunk p, which right's first reduce-scatter step reads (in place: the
	 * same bytes as our send buffer). The chain of left waits already
	 * orders it after that read (left finished its reduce-scatter, which
	 * needed right's first step); the wait on right says so directly and
	 * costs one load. */
	uint32_t st = i - (n - 1), k = (p + n - st) % n;
	uint64_t lo = split_lo(a->count, k, n);
	s->elems = split_lo(a->count, k + 1, n) - lo;
	add_wait(s, left, i);
	if (st == 0)
		add_wait(s, right, i);
	add_src(s, left, HOST_BUF_RECV, lo);
	s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
}

static void allreduce_tree(const struct host_algo *a, uint32_t i, struct host_algo_step *s)
{
	uint32_t tree = i / 2, r = a->rank;
	const struct host_tree_node *nd = &a->node[tree];
	uint64_t lo = split_lo(a->count, tree, a->ntrees);
	s->elems = split_lo(a->count, tree + 1, a->ntrees) - lo;
	s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
	if (i % 2 == 0) {
		/* up: our send buffer op the children's partials */
		add_src(s, r, HOST_BUF_SEND, lo);
		for (uint32_t c = 0; c < nd->nchild; c++) {
			add_wait(s, nd->child[c], i + 1);
			add_src(s, nd->child[c], HOST_BUF_RECV, lo);
		}
		s->reduce = 1;
		s->redop = step_op(a, nd->parent == NO_PARENT);
		return;
	}
	if (nd->parent == NO_PARENT) {
		s->elems = 0; /* the root's part is final since its up step */
		return;
	}
	add_wait(s, nd->parent, i + 1);
	add_src(s, nd->parent, HOST_BUF_RECV, lo);
}

static void allgather_ring(const struct host_algo *a, uint32_t i, struct host_algo_step *s)
{
	uint32_t r = a->rank, p = a->topo->ring_pos[r];
	s->elems = a->count;
	if (i == 0) {
		add_src(s, r, HOST_BUF_SEND, 0);
		s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, (uint64_t)r * a->count};
		return;
	}
	uint32_t left = ring_at(a, p, -1), b = ring_at(a, p, -(int)i);
	add_wait(s, left, i);
	add_src(s, left, HOST_BUF_RECV, (uint64_t)b * a->count);
	s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, (uint64_t)b * a->count};
}

/* [lo, lo + elems) of slice j of [plo, phi). */
static void slice_range(const struct host_algo *a, uint64_t plo, uint64_t phi, uint64_t j, uint64_t *lo,
                        uint64_t *elems)
{
	uint64_t start = plo + j * a->slice;
	*lo = start;
	*elems = start >= phi ? 0 : (phi - start < a->slice ? phi - start : a->slice);
}

/* A connector half, in elements from the connector's start. */
static uint64_t conn_half(const struct host_algo *a, uint64_t step)
{
	return (step % 2) * (DFCCL_COMM_CONN_HALF / a->dsize);
}

static void reducescatter_ring(const struct host_algo *a, uint32_t g, struct host_algo_step *s)
{
	uint32_t n = a->n, r = a->rank, p = a->topo->ring_pos[r];
	uint32_t left = ring_at(a, p, -1), right = ring_at(a, p, 1);
	uint32_t j = g / (n - 1), st = g % (n - 1);
	/* The partial of block b passes b + 1, b + 2, ..., and ends at b. */
	uint32_t b = ring_at(a, p, -(int)st - 2);
	uint64_t lo, in_block = (uint64_t)b * a->count;
	slice_range(a, 0, a->count, j, &lo, &s->elems);
	if (st == 0) {
		add_src(s, left, HOST_BUF_SEND, in_block + lo);
	} else {
		add_wait(s, left, g);
		add_src(s, left, HOST_BUF_CONN, conn_half(a, g - 1));
	}
	add_src(s, r, HOST_BUF_SEND, in_block + lo);
	s->reduce = 1;
	s->redop = step_op(a, st == n - 2);
	if (st == n - 2) {
		s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
		return;
	}
	/* Our half was last read by right's step g - 1. */
	if (g >= 2)
		add_wait(s, right, g);
	s->dst = (struct host_algo_buf){r, HOST_BUF_CONN, conn_half(a, g)};
}

static void broadcast_ring(const struct host_algo *a, uint32_t j, struct host_algo_step *s)
{
	uint32_t r = a->rank, p = a->topo->ring_pos[r];
	uint64_t lo;
	slice_range(a, 0, a->count, j, &lo, &s->elems);
	s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
	if (r == a->root) {
		add_src(s, r, HOST_BUF_SEND, lo);
		return;
	}
	uint32_t left = ring_at(a, p, -1);
	add_wait(s, left, j + 1);
	add_src(s, left, HOST_BUF_RECV, lo);
}

static void broadcast_tree(const struct host_algo *a, uint32_t i, struct host_algo_step *s)
{
	uint32_t tree = (uint32_t)(i / a->nslices), r = a->rank;
	uint64_t lo;
	slice_range(a, split_lo(a->count, tree, a->ntrees), split_lo(a->count, tree + 1, a->ntrees), i % a->nslices, &lo,
	            &s->elems);
	s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
	const struct host_tree_node *nd = &a->node[tree];
	if (nd->parent == NO_PARENT) {
		add_src(s, r, HOST_BUF_SEND, lo);
		return;
	}
	add_wait(s, nd->parent, i + 1);
	add_src(s, nd->parent, HOST_BUF_RECV, lo);
}

static void reduce_ring(const struct host_algo *a, uint32_t j, struct host_algo_step *s)
{
	uint32_t n = a->n, r = a->rank, p = a->topo->ring_pos[r];
	uint32_t e = (p + n - a->topo->ring_pos[a->root]) % n; /* 1: the chain's start, 0: the root, its end */
	uint32_t pred = ring_at(a, p, -1), succ = ring_at(a, p, 1);
	uint64_t lo;
	slice_range(a, 0, a->count, j, &lo, &s->elems);
	if (e == 1)
		return; /* the next rank reads our send buffer */
	if (e == 2 || (e == 0 && n == 2)) {
		add_src(s, pred, HOST_BUF_SEND, lo);
	} else {
		add_wait(s, pred, j + 1);
		add_src(s, pred, HOST_BUF_CONN, conn_half(a, j));
	}
	add_src(s, r, HOST_BUF_SEND, lo);
	s->reduce = 1;
	s->redop = step_op(a, e == 0);
	if (e == 0) {
		s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
		return;
	}
	/* Our half was last read by succ's step j - 2. */
	if (j >= 2)
		add_wait(s, succ, j - 1);
	s->dst = (struct host_algo_buf){r, HOST_BUF_CONN, conn_half(a, j)};
}

/* Whether rank writes its connector in tree k of a reduce: it is neither
 * the root nor a leaf. */
static int reduce_writes(const struct host_algo *a, uint32_t k)
{
	return a->node[k].parent != NO_PARENT && a->node[k].nchild > 0;
}

static void reduce_tree(const struct host_algo *a, uint32_t i, struct host_algo_step *s)
{
	uint32_t tree = (uint32_t)(i / a->nslices), r = a->rank;
	uint64_t j = i % a->nslices, lo;
	const struct host_tree_node *nd = &a->node[tree];
	uint64_t plo = split_lo(a->count, tree, a->ntrees);
	slice_range(a, plo, split_lo(a->count, tree + 1, a->ntrees), j, &lo, &s->elems);
	if (nd->parent != NO_PARENT && nd->nchild == 0)
		return; /* a leaf: the parent reads our send buffer */
	add_src(s, r, HOST_BUF_SEND, lo);
	for (uint32_t c = 0; c < nd->nchild; c++) {
		if (nd->leaf_mask & (1u << c)) {
			add_src(s, nd->child[c], HOST_BUF_SEND, lo);
		} else {
			add_wait(s, nd->child[c], i + 1);
			add_src(s, nd->child[c], HOST_BUF_CONN, conn_half(a, i));
		}
	}
	s->reduce = 1;
	s->redop = step_op(a, nd->parent == NO_PARENT);
	if (nd->parent == NO_PARENT) {
		s->dst = (struct host_algo_buf){r, HOST_BUF_RECV, lo};
		return;
	}
	s->dst = (struct host_algo_buf){r, HOST_BUF_CONN, conn_half(a, i)};
	/* The last step before this one that wrote the same half: its reader
	 * (the parent in that step's tree) must have finished it. Within one
	 * tree that is step i - 2; across trees, the last step of that parity
	 * in the latest earlier tree this rank wrote in. */
	if (j >= 2) {
		add_wait(s, nd->parent, i - 1);
		return;
	}
	for (uint32_t k = tree; k-- > 0;) {
		if (!reduce_writes(a, k))
			continue;
		uint64_t last = (uint64_t)k * a->nslices + a->nslices - 1;
		if (last % 2 != i % 2) {
			if (a->nslices < 2)
				continue;
			last--;
		}
		add_wait(s, a->node[k].parent, (uint32_t)last + 1);
		return;
	}
	/* Before the first tree this rank writes in: j == 1 can follow j == 0
	 * of this tree only, which wrote the other half. */
}

void host_algo_step(const struct host_algo *a, uint32_t i, struct host_algo_step *s)
{
	memset(s, 0, sizeof(*s));
	s->redop = a->redop;
	switch (a->opcode) {
	case DFCCL_OP_ALLREDUCE:
		if (a->algo == DFCCL_ALGO_RING)
			allreduce_ring(a, i, s);
		else
			allreduce_tree(a, i, s);
		break;
	case DFCCL_OP_ALLGATHER: allgather_ring(a, i, s); break;
	case DFCCL_OP_REDUCESCATTER: reducescatter_ring(a, i, s); break;
	case DFCCL_OP_BROADCAST:
		if (a->algo == DFCCL_ALGO_RING)
			broadcast_ring(a, i, s);
		else
			broadcast_tree(a, i, s);
		break;
	default: /* DFCCL_OP_REDUCE */
		if (a->algo == DFCCL_ALGO_RING)
			reduce_ring(a, i, s);
		else
			reduce_tree(a, i, s);
		break;
	}
}

/* Elements of rank r's buffer of kind k in a's collective. */
static uint64_t buf_elems(const struct host_algo *a, uint32_t r, uint32_t k)
{
	if (k == HOST_BUF_CONN)
		return DFCCL_COMM_CONN_BYTES / a->dsize;
	uint64_t send, recv;
	if (sqe_buf_elems(a->opcode, a->count, a->n, r == a->root, &send, &recv) < 0)
		return 0;
	return k == HOST_BUF_SEND ? send : recv;
}

static int buf_fits(const struct host_algo *a, const struct host_algo_buf *b, uint64_t elems)
{
	if (b->rank >= a->n || b->kind > HOST_BUF_CONN)
		return 0;
	uint64_t size = buf_elems(a, b->rank, b->kind);
	return b->off <= size && elems <= size - b->off;
}

int host_algo_step_valid(const struct host_algo *a, const struct host_algo_step *s)
{
	if (s->nwait > HOST_ALGO_MAX_WAIT || s->nsrc > HOST_ALGO_MAX_SRC)
		return 0;
	for (uint32_t k = 0; k < s->nwait; k++)
		if (s->wait[k] >= a->n || s->wait[k] == a->rank || s->phase[k] > a->nsteps)
			return 0;
	if (s->nsrc == 0 || s->elems == 0)
		return 1;
	if (s->dst.rank != a->rank || s->dst.kind == HOST_BUF_SEND || !buf_fits(a, &s->dst, s->elems))
		return 0;
	for (uint32_t k = 0; k < s->nsrc; k++)
		if (!buf_fits(a, &s->src[k], s->elems))
			return 0;
	return 1;
}
