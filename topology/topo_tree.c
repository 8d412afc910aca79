/*
 * See topo_tree.h. split() is the recursion: a set C (global rank ids) with
 * its root r is cut by kl_bisect(), joined by its heaviest crossing pair
 * from r, and both halves are split in turn; any failure below makes this
 * level fall back to exhaustive(), which searches every balanced split of
 * C by dynamic programming over subsets (the best tree of a subset from a
 * given root does not depend on the rest, so each is computed once).
 */
#include "topo_tree.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-9
#define KL_MAX_PASSES 16

struct builder {
	const double *w;
	unsigned n;
	struct topo_tree *t;
};

static inline double W(const struct builder *b, unsigned x, unsigned y)
{
	return b->w[(size_t)x * b->n + y];
}

unsigned topo_tree_min_height(unsigned n)
{
	unsigned h = 0;
	while ((1u << h) < n)
		h++;
	return h;
}

/* ---------------------------------------------------------------- Kernighan-Lin */

/*
 * Cuts c[0..m) into A (ceil(m/2) members, always including c[ri]) and B,
 * minimizing the weight across the cut. side[i] gets 0 for A, 1 for B.
 * Starts from A grown greedily around the root, then runs KL passes: swap
 * the best pair, lock it, repeat, keep the best prefix of swaps.
 */
static void kl_bisect(const struct builder *b, const unsigned *c, unsigned m, unsigned ri, int *side)
{
	unsigned na = (m + 1) / 2;
	double d[TOPO_MAX_RANKS];
	int locked[TOPO_MAX_RANKS];
	unsigned swap_a[TOPO_MAX_RANKS], swap_b[TOPO_MAX_RANKS];
	double gain[TOPO_MAX_RANKS];

	for (unsigned i = 0; i < m; i++)
		side[i] = 1;
	side[ri] = 0;
	for (unsigned k = 1; k < na; k++) {
		unsigned pick = m;
		double best = -1;
		for (unsigned i = 0; i < m; i++) {
			if (side[i] == 0)
				continue;
			double s = 0;
			for (unsigned j = 0; j < m; j++)
				if (side[j] == 0)
					s += W(b, c[i], c[j]);
			if (s > best + EPS) {
				best = s;
				pick = i;
			}
		}
		side[pick] = 0;
	}

	for (int pass = 0; pass < KL_MAX_PASSES; pass++) {
		/* d: external minus internal weight of each member. */
		for (unsigned i = 0; i < m; i++) {
			d[i] = 0;
			for (unsigned j = 0; j < m; j++)
				if (j != i)
					d[i] += side[j] != side[i] ? W(b, c[i], c[j]) : -W(b, c[i], c[j]);
			locked[i] = i == ri;
		}
		unsigned nswaps = 0;
		for (;;) {
			double g = -INFINITY;
			unsigned ba = m, bb = m;
			for (unsigned i = 0; i < m; i++) {
				if (locked[i] || side[i] != 0)
					continue;
				for (unsigned j = 0; j < m; j++) {
					if (locked[j] || side[j] != 1)
						continue;
					double x = d[i] + d[j] - 2 * W(b, c[i], c[j]);
					if (x > g + EPS) {
						g = x;
						ba = i;
						bb = j;
					}
				}
			}
			if (ba == m)
				break;
			locked[ba] = locked[bb] = 1;
			for (unsigned x = 0; x < m; x++) {
				if (locked[x])
					continue;
				double wa = W(b, c[x], c[ba]), wb = W(b, c[x], c[bb]);
				d[x] += side[x] == 0 ? 2 * wa - 2 * wb : 2 * wb - 2 * wa;
			}
			swap_a[nswaps] = ba;
			swap_b[nswaps] = bb;
			gain[nswaps++] = g;
		}
		double total = 0, best = EPS;
		unsigned keep = 0;
		for (unsigned k = 0; k < nswaps; k++) {
			total += gain[k];
			if (total > best) {
				best = total;
				keep = k + 1;
			}
		}
		if (keep == 0)
			break;
		for (unsigned k = 0; k < keep; k++) {
			side[swap_a[k]] = 1;
			side[swap_b[k]] = 0;
		}
	}
}

/* ---------------------------------------------------------------- exhaustive */

struct exact {
	const struct builder *b;
	const unsigned *c; /* local index -> rank */
	unsigned m;
	double *memo;      /* [(1 << m) * m]: best weight of the tree of subset S from local root r */
};

#define UNKNOWN (-2.0)
#define INFEASIBLE (-1.0)

static double exact_best(struct exact *e, uint32_t s, unsigned r);

/* The weight of the best tree of s from r that joins v (in B, the other
 * half) to r, or INFEASIBLE. */
static double exact_split_value(struct exact *e, uint32_t s, unsigned r, uint32_t bset, unsigned v)
{
	double edge = W(e->b, e->c[r], e->c[v]);
	if (edge <= 0)
		return INFEASIBLE;
	double x = exact_best(e, s & ~bset, r);
	if (x < 0)
		return INFEASIBLE;
	double y = exact_best(e, bset, v);
	if (y < 0)
		return INFEASIBLE;
	return edge + x + y;
}

/*
 * Scans every split of s from r (size >= 2): a choice of B, floor(|s|/2)
 * of the members other than r, enumerated as same-size bit patterns over
 * those members with Gosper's hack, and of v in B. With want < 0 it returns
 * the best value; otherwise it stops at the first split worth at least
 * `want`, returns its value and stores it in *bset / *v.
 */
static double exact_scan(struct exact *e, uint32_t s, unsigned r, double want, uint32_t *bset_out, unsigned *v_out)
{
	unsigned idx[TOPO_TREE_EXACT_MAX], k = 0;
	for (unsigned i = 0; i < e->m; i++)
		if ((s >> i & 1) && i != r)
			idx[k++] = i;
	unsigned nb = (unsigned)__builtin_popcount(s) / 2;
	double best = INFEASIBLE;
	for (uint32_t pick = (1u << nb) - 1; pick < (1u << k);) {
		uint32_t bset = 0;
		for (unsigned i = 0; i < k; i++)
			if (pick >> i & 1)
				bset |= 1u << idx[i];
		for (unsigned i = 0; i < k; i++) {
			if (!(pick >> i & 1))
				continue;
			double x = exact_split_value(e, s, r, bset, idx[i]);
			if (want >= 0 && x >= want - EPS) {
				*bset_out = bset;
				*v_out = idx[i];
				return x;
			}
			if (x > best + EPS)
				best = x;
		}
		uint32_t lo = pick & -pick, hi = pick + lo;
		pick = (((hi ^ pick) >> 2) / lo) | hi;
	}
	return best;
}

/* The best tree of s from r, or INFEASIBLE. */
static double exact_best(struct exact *e, uint32_t s, unsigned r)
{
	double *slot = &e->memo[(size_t)s * e->m + r];
	if (*slot == UNKNOWN)
		*slot = __builtin_popcount(s) == 1 ? 0 : exact_scan(e, s, r, -1, NULL, NULL);
	return *slot;
}

/* Writes the best tree of s from r (known to be feasible) into the tree. */
static void exact_emit(struct exact *e, uint32_t s, unsigned r, unsigned level)
{
	if (__builtin_popcount(s) == 1)
		return;
	uint32_t bset = 0;
	unsigned v = 0;
	exact_scan(e, s, r, exact_best(e, s, r), &bset, &v);
	e->b->t->parent[e->c[v]] = (int)e->c[r];
	e->b->t->level[e->c[v]] = level;
	exact_emit(e, s & ~bset, r, level + 1);
	exact_emit(e, bset, v, level + 1);
}

static int exhaustive(const struct builder *b, const unsigned *c, unsigned m, unsigned ri, unsigned level)
{
	if (m > TOPO_TREE_EXACT_MAX)
		return -ENOENT;
	size_t slots = ((size_t)1 << m) * m;
	struct exact e = {.b = b, .c = c, .m = m, .memo = malloc(slots * sizeof(double))};
	if (!e.memo)
		return -ENOMEM;
	for (size_t i = 0; i < slots; i++)
		e.memo[i] = UNKNOWN;
	uint32_t all = m == 32 ? UINT32_MAX : (1u << m) - 1;
	int rc = -ENOENT;
	if (exact_best(&e, all, ri) >= 0) {
		exact_emit(&e, all, ri, level);
		rc = 0;
	}
	free(e.memo);
	return rc;
}

/* ---------------------------------------------------------------- the recursion */

static int split(const struct builder *b, const unsigned *c, unsigned m, unsigned ri, unsigned level)
{
	if (m == 1)
		return 0;
	int side[TOPO_MAX_RANKS];
	unsigned a[TOPO_MAX_RANKS], bb[TOPO_MAX_RANKS], na = 0, nb = 0, ra = 0, rb = 0;
	kl_bisect(b, c, m, ri, side);
	double best = 0;
	unsigned v = m;
	for (unsigned i = 0; i < m; i++) {
		if (side[i] == 1 && W(b, c[ri], c[i]) > best + EPS) {
			best = W(b, c[ri], c[i]);
			v = i;
		}
	}
	int rc = -ENOENT;
	if (v < m) {
		for (unsigned i = 0; i < m; i++) {
			if (side[i] == 0) {
				if (i == ri)
					ra = na;
				a[na++] = c[i];
			} else {
				if (i == v)
					rb = nb;
				bb[nb++] = c[i];
			}
		}
		b->t->parent[c[v]] = (int)c[ri];
		b->t->level[c[v]] = level;
		rc = split(b, a, na, ra, level + 1);
		if (rc == 0)
			rc = split(b, bb, nb, rb, level + 1);
	}
	if (rc == -ENOENT)
		rc = exhaustive(b, c, m, ri, level);
	return rc;
}

static void tree_reset(struct topo_tree *t, unsigned n, unsigned root)
{
	t->n = n;
	t->root = root;
	for (unsigned i = 0; i < n; i++) {
		t->parent[i] = -1;
		t->level[i] = 0;
	}
	t->height = topo_tree_min_height(n);
	t->bw_gbps = TOPO_SELF_GBPS;
}

int topo_tree_build(const double *w, unsigned n, unsigned root, struct topo_tree *out)
{
	if (n == 0 || n > TOPO_MAX_RANKS || root >= n)
		return -EINVAL;
	struct builder b = {.w = w, .n = n, .t = out};
	unsigned c[TOPO_MAX_RANKS];
	for (unsigned i = 0; i < n; i++)
		c[i] = i;
	tree_reset(out, n, root);
	int rc = split(&b, c, n, root, 1);
	if (rc < 0)
		return rc;
	double min = n > 1 ? INFINITY : TOPO_SELF_GBPS;
	for (unsigned i = 0; i < n; i++)
		if (out->parent[i] >= 0 && w[(size_t)i * n + (unsigned)out->parent[i]] < min)
			min = w[(size_t)i * n + (unsigned)out->parent[i]];
	out->bw_gbps = min;
	return 0;
}

/* Distinct off-diagonal weights, largest first. Returns how many. */
static unsigned weight_classes(const double *w, unsigned n, double *cls)
{
	unsigned k = 0;
	for (unsigned i = 0; i < n; i++) {
		for (unsigned j = i + 1; j < n; j++) {
			double x = w[(size_t)i * n + j];
			unsigned p = 0;
			while (p < k && cls[p] > x + EPS)
				p++;
			if (p < k && fabs(cls[p] - x) <= EPS)
				continue;
			memmove(&cls[p + 1], &cls[p], (k - p) * sizeof(double));
			cls[p] = x;
			k++;
		}
	}
	return k;
}

int topo_trees(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks, unsigned ntrees,
               double penalty, struct topo_tree *out)
{
	if (ntrees == 0 || ntrees > TOPO_MAX_TREES || !(penalty > 0 && penalty <= 1))
		return -EINVAL;
	size_t nn = (size_t)nranks * nranks;
	/* raw, penalized, the weights one attempt sees, and the classes */
	double *w = malloc((3 * nn + nn / 2 + 1) * sizeof(double));
	if (!w)
		return -ENOMEM;
	double *pw = w + nn, *tw = pw + nn, *cls = tw + nn;
	int rc = topo_model_rank_gbps(m, rank_dev, nranks, w);
	if (rc < 0)
		goto out;
	memcpy(pw, w, nn * sizeof(double));
	unsigned ncls = weight_classes(w, nranks, cls);
	for (unsigned k = 0; k < ntrees; k++) {
		struct topo_tree *t = &out[k];
		unsigned root = k % nranks;
		rc = -ENOENT;
		for (unsigned c = 0; c < ncls && rc == -ENOENT; c++) {
			/* Only links at least as fast as this class; penalized
			 * weights decide among them. */
			for (size_t i = 0; i < nn; i++)
				tw[i] = w[i] >= cls[c] - EPS ? pw[i] : 0;
			rc = topo_tree_build(tw, nranks, root, t);
		}
		if (ncls == 0)
			rc = topo_tree_build(w, nranks, root, t);
		if (rc < 0)
			goto out;
		double min = nranks > 1 ? INFINITY : TOPO_SELF_GBPS;
		for (unsigned i = 0; i < nranks; i++) {
			if (t->parent[i] < 0)
				continue;
			size_t e1 = (size_t)i * nranks + (unsigned)t->parent[i], e2 = (size_t)t->parent[i] * nranks + i;
			min = w[e1] < min ? w[e1] : min;
			pw[e1] *= penalty;
			pw[e2] *= penalty;
		}
		t->bw_gbps = min;
	}
out:
	free(w);
	return rc;
}
