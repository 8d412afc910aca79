/*
 * Balanced binary trees of maximum weight over a communicator's ranks.
 *
 * A tree is built by splitting: the set of all ranks, rooted at the chosen
 * root, is cut in two halves of (almost) equal size by Kernighan-Lin
 * bisection, which keeps strongly linked ranks together; the heaviest pair
 * (root, v) across the cut joins v to the tree, and each half is split the
 * same way from its own root (the root's half from the root, the other
 * half from v). Every split halves the sets, so the tree has
 * ceil(log2 n) levels: a reduction takes that many steps, which is what
 * "balanced" buys (latency), while the heaviest crossing pairs buy
 * bandwidth. When a cut leaves no usable pair from the root into the other
 * half (KL optimizes the cut, not that pair), the split is found by
 * exhaustive search instead, for sets of up to TOPO_TREE_EXACT_MAX ranks.
 *
 * The result, read as a reduction: at step s = height .. 1, every rank whose
 * level is s sends its partial result to its parent; a broadcast runs the
 * steps the other way. A rank receives from its children in decreasing
 * level order, and has received from all of them before its own step.
 *
 * Several trees (multi-tree, for bandwidth: tree k carries 1/k of the data,
 * rooted at rank k) are built one after another; a pair already used by a
 * tree has its weight multiplied by the link-usage penalty (default 0.7),
 * so later trees prefer links the earlier ones left free.
 */
#ifndef DFCCL_TOPO_TREE_H
#define DFCCL_TOPO_TREE_H

#include "topo_model.h"

#define TOPO_TREE_EXACT_MAX 12
#define TOPO_MAX_TREES 16
#define TOPO_TREE_PENALTY 0.7

struct topo_tree {
	unsigned n;
	unsigned root;
	int parent[TOPO_MAX_RANKS];     /* the rank this one sends to in a reduction; -1 for the root */
	unsigned level[TOPO_MAX_RANKS]; /* the split (1..height) that joined it to its parent; 0 for the root */
	unsigned height;                /* splits from the root down: ceil(log2 n) */
	double bw_gbps;                 /* bandwidth of the slowest edge (unpenalized); self when n == 1 */
};

/*
 * The tree over n ranks rooted at root, on weights w (n x n, row-major,
 * symmetric; a weight <= 0 forbids the pair). Returns 0, -ENOENT when no
 * balanced tree uses only allowed pairs (as far as the search can tell for
 * sets above TOPO_TREE_EXACT_MAX), or -EINVAL / -ENOMEM. out->bw_gbps is
 * the smallest weight used.
 */
int topo_tree_build(const double *w, unsigned n, unsigned root, struct topo_tree *out);

/*
 * The engine's entry point: ntrees trees (1..TOPO_MAX_TREES) over the
 * communicator whose rank r runs on device rank_dev[r]; tree k is rooted
 * at rank k % nranks. Each tree first uses only the fastest class of links
 * that still allows a balanced tree from its root (so the slowest edge is
 * as fast as it can be), then the heaviest such tree under the penalized
 * weights. penalty in (0, 1]; 1 disables it. Returns 0, -EINVAL or -ENOMEM.
 */
int topo_trees(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks, unsigned ntrees,
               double penalty, struct topo_tree *out);

/* ceil(log2 n): the height of a balanced tree of n ranks. */
unsigned topo_tree_min_height(unsigned n);

#endif /* DFCCL_TOPO_TREE_H */
