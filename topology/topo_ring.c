/*
 * See topo_ring.h. A ring's score is (slowest hop, total bandwidth),
 * compared in that order; both searches below maximize it.
 */
#include "topo_ring.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-9
/* A later ring slower than this share of the first is not worth a channel. */
#define RING_SPREAD_MIN 0.5

struct score {
	double min, sum;
};

/* a better than b? Bandwidths are compared with a small tolerance so that
 * rounding in penalized weights does not decide between equal rings. */
static int score_better(struct score a, struct score b)
{
	if (a.min > b.min + EPS)
		return 1;
	if (a.min < b.min - EPS)
		return 0;
	return a.sum > b.sum + EPS;
}

static struct score tour_score(const double *w, unsigned n, const unsigned *order)
{
	struct score s = {INFINITY, 0};
	for (unsigned i = 0; i < n; i++) {
		double x = w[(size_t)order[i] * n + order[(i + 1) % n]];
		s.min = x < s.min ? x : s.min;
		s.sum += x;
	}
	return s;
}

/* ---------------------------------------------------------------- exact */

struct dfs {
	const double *w;
	unsigned n;
	double wmax;
	unsigned cur[TOPO_RING_EXACT_MAX];
	unsigned best[TOPO_RING_EXACT_MAX];
	struct score best_score;
	int used[TOPO_RING_EXACT_MAX];
};

static void dfs_extend(struct dfs *d, unsigned depth, double min, double sum)
{
	const unsigned n = d->n;
	if (depth == n) {
		double close = d->w[(size_t)d->cur[n - 1] * n + d->cur[0]];
		struct score s = {close < min ? close : min, sum + close};
		if (score_better(s, d->best_score)) {
			d->best_score = s;
			memcpy(d->best, d->cur, n * sizeof(unsigned));
		}
		return;
	}
	/* The slowest hop only gets slower, and the sum can at most gain the
	 * fastest link on each remaining hop (n - depth of them, closing
	 * included). */
	if (min < d->best_score.min - EPS)
		return;
	if (min <= d->best_score.min + EPS && sum + (double)(n - depth + 1) * d->wmax <= d->best_score.sum + EPS)
		return;
	unsigned last = d->cur[depth - 1];
	for (unsigned v = 1; v < n; v++) {
		if (d->used[v])
			continue;
		double x = d->w[(size_t)last * n + v];
		d->used[v] = 1;
		d->cur[depth] = v;
		dfs_extend(d, depth + 1, x < min ? x : min, sum + x);
		d->used[v] = 0;
	}
}

static void ring_exact(const double *w, unsigned n, unsigned *order)
{
	struct dfs d = {.w = w, .n = n, .best_score = {-1, -1}};
	for (size_t i = 0; i < (size_t)n * n; i++)
		if (i / n != i % n && w[i] > d.wmax)
			d.wmax = w[i];
	d.cur[0] = 0;
	d.used[0] = 1;
	dfs_extend(&d, 1, INFINITY, 0);
	memcpy(order, d.best, n * sizeof(unsigned));
}

/* ---------------------------------------------------------------- heuristic */

/* Reverses order[i..j]. */
static void reverse(unsigned *order, unsigned i, unsigned j)
{
	while (i < j) {
		unsigned t = order[i];
		order[i++] = order[j];
		order[j--] = t;
	}
}

/* 2-opt: reverse a stretch of the tour while that improves the score. */
static void two_opt(const double *w, unsigned n, unsigned *order)
{
	struct score cur = tour_score(w, n, order);
	for (int improved = 1; improved;) {
		improved = 0;
		for (unsigned i = 1; i + 1 < n; i++) {
			for (unsigned j = i + 1; j < n; j++) {
				reverse(order, i, j);
				struct score s = tour_score(w, n, order);
				if (score_better(s, cur)) {
					cur = s;
					improved = 1;
				} else {
					reverse(order, i, j);
				}
			}
		}
	}
}

static int ring_heuristic(const double *w, unsigned n, unsigned *order)
{
	unsigned *tour = malloc(2 * (size_t)n * sizeof(unsigned));
	int *used = malloc(n * sizeof(int));
	if (!tour || !used) {
		free(tour);
		free(used);
		return -ENOMEM;
	}
	unsigned *best = tour + n;
	struct score best_score = {-1, -1};
	/* Each start costs a 2-opt run of O(n^3) per pass: a few starts are
	 * enough to escape a poor first greedy choice. */
	for (unsigned start = 0; start < n && start < 8; start++) {
		memset(used, 0, n * sizeof(int));
		tour[0] = start;
		used[start] = 1;
		for (unsigned k = 1; k < n; k++) {
			unsigned pick = 0;
			double bw = -1;
			for (unsigned v = 0; v < n; v++)
				if (!used[v] && w[(size_t)tour[k - 1] * n + v] > bw)
					bw = w[(size_t)tour[k - 1] * n + (pick = v)];
			tour[k] = pick;
			used[pick] = 1;
		}
		two_opt(w, n, tour);
		struct score s = tour_score(w, n, tour);
		if (score_better(s, best_score)) {
			best_score = s;
			memcpy(best, tour, n * sizeof(unsigned));
		}
	}
	/* Rotate so that the ring starts at rank 0, as the exact search's do. */
	unsigned at = 0;
	while (best[at] != 0)
		at++;
	for (unsigned i = 0; i < n; i++)
		order[i] = best[(at + i) % n];
	free(used);
	free(tour);
	return 0;
}

int topo_ring_search(const double *w, unsigned n, unsigned *order)
{
	if (n == 0 || n > TOPO_MAX_RANKS)
		return -EINVAL;
	if (n <= 3) {
		for (unsigned i = 0; i < n; i++)
			order[i] = i;
		return 0;
	}
	if (n <= TOPO_RING_EXACT_MAX) {
		ring_exact(w, n, order);
		return 0;
	}
	return ring_heuristic(w, n, order);
}

int topo_rings(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks, unsigned nrings,
               double penalty, struct topo_ring *out)
{
	if (nrings == 0 || nrings > TOPO_MAX_RINGS || !(penalty > 0 && penalty <= 1))
		return -EINVAL;
	size_t nn = (size_t)nranks * nranks;
	double *w = malloc(2 * nn * sizeof(double));
	if (!w)
		return -ENOMEM;
	double *pw = w + nn;
	int rc = topo_model_rank_gbps(m, rank_dev, nranks, w);
	if (rc < 0)
		goto out;
	memcpy(pw, w, nn * sizeof(double));
	unsigned good = 0;
	for (unsigned k = 0; k < nrings; k++) {
		struct topo_ring *r = &out[k];
		if (good < k) {
			/* The spread ran out (below): repeat the good rings. */
			*r = out[k % good];
			continue;
		}
		r->n = nranks;
		rc = topo_ring_search(pw, nranks, r->order);
		if (rc < 0)
			goto out;
		r->bw_gbps = nranks == 1 ? TOPO_SELF_GBPS : tour_score(w, nranks, r->order).min;
		/* Once the penalty makes a much slower path look better than
		 * sharing a fast one, there is nothing left to spread over: a
		 * channel on a slow ring would set the pace of the collective.
		 * Later channels share the rings found so far. */
		if (k > 0 && r->bw_gbps < out[0].bw_gbps * RING_SPREAD_MIN) {
			*r = out[k % good];
			continue;
		}
		good++;
		if (nranks < 2)
			continue;
		/* A ring of two uses its one pair twice (there and back). */
		for (unsigned i = 0; i < nranks; i++) {
			unsigned a = r->order[i], b = r->order[(i + 1) % nranks];
			pw[(size_t)a * nranks + b] *= penalty;
			pw[(size_t)b * nranks + a] *= penalty;
		}
	}
out:
	free(w);
	return rc;
}
