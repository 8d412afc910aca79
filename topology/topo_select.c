/*
 * See topo_select.h. The cost model needs, per rank count k, a few facts
 * about the communicator of ranks 0..k-1 (struct facts): the step latency,
 * the bandwidth of 1..c rings together, of one tree and of c trees
 * together, and the bandwidth a rank can pull from all its peers at once.
 * Everything else is arithmetic on those, per collective, algorithm,
 * channel count and size bucket.
 */
#include "topo_select.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfccl_comm.h"
#include "topo_ring.h"
#include "topo_tree.h"

_Static_assert(TOPO_SIZE_BUCKETS == DFCCL_PLAN_BUCKETS, "the plan and the table share the size buckets");
_Static_assert(TOPO_COLL_COUNT_ == DFCCL_PLAN_COLLS, "the plan holds every collective of the table");

/* Rank counts above this get rows only at powers of two (and at the top):
 * the ring and tree searches grow quickly with the rank count. */
#define DENSE_ROWS_MAX 16
/* A channel count (or a more elaborate algorithm) within this factor of
 * the best time is as good. */
#define CHANNEL_SLACK 1.03

static const char *const coll_names[TOPO_COLL_COUNT_] = {"allreduce", "allgather", "reducescatter", "broadcast",
                                                          "reduce"};
static const char *const algo_names[TOPO_ALGO_COUNT_] = {"oneshot", "twoshot", "ring", "tree", "multitree"};

/* Index of name in names[0..n), or -1. */
static int name_index(const char *const *names, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *topo_coll_name(enum topo_coll c)
{
	return (unsigned)c < TOPO_COLL_COUNT_ ? coll_names[c] : "unknown";
}

int topo_coll_parse(const char *name)
{
	return name_index(coll_names, TOPO_COLL_COUNT_, name);
}

const char *topo_algo_name(enum topo_algo a)
{
	return (unsigned)a < TOPO_ALGO_COUNT_ ? algo_names[a] : "unknown";
}

int topo_algo_parse(const char *name)
{
	return name_index(algo_names, TOPO_ALGO_COUNT_, name);
}

int topo_algo_valid(enum topo_coll coll, enum topo_algo algo)
{
	switch (algo) {
	case TOPO_ALGO_DIRECT_ONESHOT:
	case TOPO_ALGO_RING: return (unsigned)coll < TOPO_COLL_COUNT_;
	case TOPO_ALGO_DIRECT_TWOSHOT: return coll == TOPO_COLL_ALLREDUCE;
	case TOPO_ALGO_TREE:
	case TOPO_ALGO_MULTITREE:
		/* Trees reduce toward a root and broadcast away from it; an
		 * all-gather or reduce-scatter has no root to use them. */
		return coll == TOPO_COLL_ALLREDUCE || coll == TOPO_COLL_BROADCAST || coll == TOPO_COLL_REDUCE;
	default: return 0;
	}
}

static int forced_family(int force, enum topo_algo a)
{
	switch (force) {
	case TOPO_FORCE_DIRECT: return a == TOPO_ALGO_DIRECT_ONESHOT || a == TOPO_ALGO_DIRECT_TWOSHOT;
	case TOPO_FORCE_RING: return a == TOPO_ALGO_RING;
	case TOPO_FORCE_TREE: return a == TOPO_ALGO_TREE;
	case TOPO_FORCE_MULTITREE: return a == TOPO_ALGO_MULTITREE;
	default: return 1;
	}
}

/* Whether the forced family has a member that can run coll. */
static int force_applies(int force, enum topo_coll coll)
{
	if (force == TOPO_FORCE_AUTO)
		return 0;
	for (int a = 0; a < TOPO_ALGO_COUNT_; a++)
		if (forced_family(force, (enum topo_algo)a) && topo_algo_valid(coll, (enum topo_algo)a))
			return 1;
	return 0;
}

void topo_select_params_default(struct topo_select_params *p)
{
	*p = (struct topo_select_params){
	    .step_us = 2.0,
	    .channel_gbps = 20.0,
	    .max_channels = TOPO_MAX_RINGS,
	    .ntrees = 0,
	    .penalty = TOPO_TREE_PENALTY,
	    .force = TOPO_FORCE_AUTO,
	};
}

unsigned topo_size_bucket(uint64_t bytes)
{
	return dfccl_size_bucket(bytes);
}

uint64_t topo_bucket_max(unsigned bucket)
{
	return bucket + 1 >= TOPO_SIZE_BUCKETS ? UINT64_MAX : (uint64_t)1 << bucket;
}

/* ---------------------------------------------------------------- facts */

struct facts {
	unsigned n, height, ntrees, max_channels;
	double alpha_us;
	double ring_gbps[TOPO_MAX_RINGS + 1];  /* all of c rings together */
	double tree_gbps;                      /* one tree */
	double mtree_rate[TOPO_MAX_TREES + 1]; /* each of c trees, when c run together */
	double in_gbps;                        /* what the worst-placed rank pulls from all peers */
};

static int facts_compute(const struct topo_model *m, const unsigned *rank_dev, unsigned n,
                         const struct topo_select_params *p, struct topo_ring *rings, struct topo_tree *trees,
                         struct facts *f)
{
	memset(f, 0, sizeof(*f));
	f->n = n;
	f->max_channels = p->max_channels;
	f->ntrees = p->ntrees ? p->ntrees : n;
	if (f->ntrees > TOPO_MAX_TREES)
		f->ntrees = TOPO_MAX_TREES;
	double lat = 0;
	for (unsigned a = 0; a < n; a++)
		for (unsigned b = 0; b < n; b++)
			if (rank_dev[a] != rank_dev[b] && topo_model_link(m, rank_dev[a], rank_dev[b])->lat_us > lat)
				lat = topo_model_link(m, rank_dev[a], rank_dev[b])->lat_us;
	f->alpha_us = p->step_us + lat;

	int rc = topo_rings(m, rank_dev, n, p->max_channels, p->penalty, rings);
	if (rc == 0)
		rc = topo_trees(m, rank_dev, n, f->ntrees, p->penalty, trees);
	if (rc < 0)
		return rc;
	unsigned *load = calloc((size_t)n * n, sizeof(unsigned));
	if (!load)
		return -ENOMEM;

	/* c rings share a directed hop that several of them use; each ring
	 * runs at the rate of its most shared, slowest hop. */
	for (unsigned c = 1; c <= p->max_channels; c++) {
		const struct topo_ring *r = &rings[c - 1];
		for (unsigned i = 0; i < n; i++)
			load[r->order[i] * n + r->order[(i + 1) % n]]++;
		double x = INFINITY;
		for (unsigned a = 0; a < n; a++)
			for (unsigned b = 0; b < n; b++)
				if (a != b && load[a * n + b])
					x = fmin(x, topo_model_pair_gbps(m, rank_dev[a], rank_dev[b]) / load[a * n + b]);
		f->ring_gbps[c] = c * x;
	}

	f->height = trees[0].height;
	f->tree_gbps = trees[0].bw_gbps;
	memset(load, 0, sizeof(unsigned) * n * n);
	for (unsigned c = 1; c <= f->ntrees; c++) {
		const struct topo_tree *t = &trees[c - 1];
		for (unsigned i = 0; i < n; i++) {
			if (t->parent[i] < 0)
				continue;
			load[i * n + (unsigned)t->parent[i]]++;
			load[(unsigned)t->parent[i] * n + i]++;
		}
		double x = INFINITY;
		for (unsigned a = 0; a < n; a++)
			for (unsigned b = 0; b < n; b++)
				if (a != b && load[a * n + b])
					x = fmin(x, topo_model_pair_gbps(m, rank_dev[a], rank_dev[b]) / load[a * n + b]);
		f->mtree_rate[c] = x;
	}

	f->in_gbps = INFINITY;
	for (unsigned r = 0; r < n; r++) {
		unsigned peers[TOPO_MAX_RANKS], np = 0;
		for (unsigned q = 0; q < n; q++)
			if (q != r)
				peers[np++] = rank_dev[q];
		f->in_gbps = fmin(f->in_gbps, topo_model_inbound_gbps(m, rank_dev[r], peers, np));
	}
	free(load);
	return 0;
}

/* ---------------------------------------------------------------- costs */

/* Microseconds to move s bytes at g GB/s. */
static double xfer_us(double s, double g)
{
	return s / (g * 1e3);
}

/* Time of one algorithm on c channels, or INFINITY where it does not apply. */
static double cost_us(const struct facts *f, const struct topo_select_params *p, enum topo_coll coll,
                      enum topo_algo algo, unsigned c, double s)
{
	const double n = f->n, h = f->height, a = f->alpha_us;
	const double cap = c * p->channel_gbps;
	const int bcast = coll == TOPO_COLL_BROADCAST || coll == TOPO_COLL_REDUCE;
	const int gather = coll == TOPO_COLL_ALLGATHER || coll == TOPO_COLL_REDUCESCATTER;
	switch (algo) {
	case TOPO_ALGO_DIRECT_ONESHOT: {
		double g = fmin(f->in_gbps, cap);
		if (gather)
			return 2 * a + xfer_us((n - 1) / n * s, g);
		/* All-reduce: every rank pulls every peer's whole buffer;
		 * broadcast/reduce: the root's port carries n-1 copies. */
		return 2 * a + xfer_us((n - 1) * s, g);
	}
	case TOPO_ALGO_DIRECT_TWOSHOT:
		return 4 * a + xfer_us(2 * (n - 1) / n * s, fmin(f->in_gbps, cap));
	case TOPO_ALGO_RING: {
		double g = fmin(f->ring_gbps[c], cap);
		if (gather)
			return (n - 1) * a + xfer_us((n - 1) / n * s, g);
		if (bcast)
			return (n - 1) * a + xfer_us(s, g); /* pipelined along the chain */
		return 2 * (n - 1) * a + xfer_us(2 * (n - 1) / n * s, g);
	}
	case TOPO_ALGO_TREE: {
		/* Every level moves the whole buffer, one level after another. */
		double steps = bcast ? h : 2 * h;
		return steps * (a + xfer_us(s, fmin(f->tree_gbps, cap)));
	}
	case TOPO_ALGO_MULTITREE: {
		if (c < 2 || c > f->ntrees)
			return INFINITY;
		double steps = bcast ? h : 2 * h;
		return steps * (a + xfer_us(s / c, fmin(f->mtree_rate[c], p->channel_gbps)));
	}
	default: return INFINITY;
	}
}

/* The channel count for algo at size s: the fewest within CHANNEL_SLACK of
 * the best. Returns the time; *channels gets the count (0: not applicable). */
static double best_channels(const struct facts *f, const struct topo_select_params *p, enum topo_coll coll,
                            enum topo_algo algo, double s, unsigned *channels)
{
	unsigned lo = algo == TOPO_ALGO_MULTITREE ? 2 : 1;
	unsigned hi = algo == TOPO_ALGO_MULTITREE ? f->ntrees : f->max_channels;
	double best = INFINITY;
	for (unsigned c = lo; c <= hi; c++)
		best = fmin(best, cost_us(f, p, coll, algo, c, s));
	*channels = 0;
	if (!isfinite(best))
		return INFINITY;
	for (unsigned c = lo; c <= hi; c++) {
		double t = cost_us(f, p, coll, algo, c, s);
		if (t <= best * CHANNEL_SLACK) {
			*channels = c;
			return t;
		}
	}
	return best;
}

static void row_fill(const struct facts *f, const struct topo_select_params *p, enum topo_coll coll,
                     struct topo_select_row *row)
{
	int forced = force_applies(p->force, coll);
	row->computed = 1;
	for (unsigned b = 0; b < TOPO_SIZE_BUCKETS; b++) {
		/* The largest size of the bucket; the last bucket is costed
		 * at twice the size of the one before. */
		double s = b + 1 >= TOPO_SIZE_BUCKETS ? ldexp(1.0, (int)b) : (double)topo_bucket_max(b);
		double best = INFINITY;
		struct topo_choice pick = {TOPO_ALGO_RING, 1};
		for (int a = 0; a < TOPO_ALGO_COUNT_; a++) {
			if (!topo_algo_valid(coll, (enum topo_algo)a) || (forced && !forced_family(p->force, (enum topo_algo)a)))
				continue;
			unsigned c;
			double t = best_channels(f, p, coll, (enum topo_algo)a, s, &c);
			/* Algorithms are tried simplest first; a later one must be
			 * clearly faster, not faster by a rounding error. */
			if (c && t * CHANNEL_SLACK < best) {
				best = t;
				pick = (struct topo_choice){(enum topo_algo)a, c};
			}
		}
		row->choice[b] = pick;
		row->tuned[b] = 0;
	}
}

/* ---------------------------------------------------------------- the table */

static int row_wanted(unsigned k, unsigned nranks)
{
	return k >= 2 && (k <= DENSE_ROWS_MAX || (k & (k - 1)) == 0 || k == nranks);
}

int topo_select_table_build(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks,
                            const struct topo_select_params *p, struct topo_select_table **out)
{
	*out = NULL;
	struct topo_select_params defaults;
	if (!p) {
		topo_select_params_default(&defaults);
		p = &defaults;
	}
	if (nranks == 0 || nranks > TOPO_MAX_RANKS || p->max_channels == 0 || p->max_channels > TOPO_MAX_RINGS ||
	    !(p->penalty > 0 && p->penalty <= 1) || !(p->channel_gbps > 0) || !(p->step_us >= 0) ||
	    (unsigned)p->force >= TOPO_FORCE_COUNT_)
		return -EINVAL;
	for (unsigned r = 0; r < nranks; r++)
		if (rank_dev[r] >= m->ndev)
			return -EINVAL;

	int rc = -ENOMEM;
	struct topo_select_table *t = calloc(1, sizeof(*t));
	struct topo_ring *rings = calloc(TOPO_MAX_RINGS, sizeof(*rings));
	struct topo_tree *trees = calloc(TOPO_MAX_TREES, sizeof(*trees));
	if (!t || !rings || !trees)
		goto fail;
	t->max_ranks = nranks;
	t->params = *p;
	t->rows = calloc((size_t)TOPO_COLL_COUNT_ * (nranks + 1), sizeof(*t->rows));
	if (!t->rows)
		goto fail;
	for (unsigned k = 2; k <= nranks; k++) {
		if (!row_wanted(k, nranks))
			continue;
		struct facts f;
		rc = facts_compute(m, rank_dev, k, p, rings, trees, &f);
		if (rc < 0)
			goto fail;
		for (int c = 0; c < TOPO_COLL_COUNT_; c++)
			row_fill(&f, p, (enum topo_coll)c, topo_select_row_at(t, (enum topo_coll)c, k));
	}
	free(trees);
	free(rings);
	*out = t;
	return 0;

fail:
	free(trees);
	free(rings);
	topo_select_table_free(t);
	return rc;
}

void topo_select_table_free(struct topo_select_table *t)
{
	if (!t)
		return;
	free(t->rows);
	free(t);
}

/* The row that answers for nranks: its own, else the closest smaller one. */
static const struct topo_select_row *row_lookup(const struct topo_select_table *t, enum topo_coll coll,
                                                unsigned nranks)
{
	if (nranks > t->max_ranks)
		nranks = t->max_ranks;
	for (; nranks >= 2; nranks--)
		if (topo_select_row_at(t, coll, nranks)->computed)
			return topo_select_row_at(t, coll, nranks);
	return NULL;
}

int topo_select(const struct topo_select_table *t, enum topo_coll coll, unsigned nranks, uint64_t bytes,
                struct topo_choice *out)
{
	if ((unsigned)coll >= TOPO_COLL_COUNT_ || nranks == 0)
		return -EINVAL;
	const struct topo_select_row *row = nranks == 1 ? NULL : row_lookup(t, coll, nranks);
	if (!row) {
		*out = (struct topo_choice){TOPO_ALGO_DIRECT_ONESHOT, 1};
		return 0;
	}
	*out = row->choice[topo_size_bucket(bytes)];
	return 0;
}

int topo_select_override(struct topo_select_table *t, enum topo_coll coll, unsigned nranks, uint64_t min_bytes,
                         uint64_t max_bytes, const struct topo_choice *c)
{
	if (nranks > t->max_ranks || min_bytes > max_bytes)
		return -EINVAL;
	unsigned max_ch = c->algo == TOPO_ALGO_MULTITREE ? TOPO_MAX_TREES : t->params.max_channels;
	if (c->channels < (c->algo == TOPO_ALGO_MULTITREE ? 2u : 1u) || c->channels > max_ch)
		return -EINVAL;
	int changed = 0;
	for (int cl = 0; cl < TOPO_COLL_COUNT_; cl++) {
		if (coll != TOPO_COLL_COUNT_ && cl != (int)coll)
			continue;
		if (!topo_algo_valid((enum topo_coll)cl, c->algo)) {
			if (coll != TOPO_COLL_COUNT_)
				return -EINVAL;
			continue; /* "every collective": those that can run it */
		}
		if (force_applies(t->params.force, (enum topo_coll)cl))
			continue;
		for (unsigned k = nranks ? nranks : 2; k <= (nranks ? nranks : t->max_ranks); k++) {
			struct topo_select_row *row = topo_select_row_at(t, (enum topo_coll)cl, k);
			if (!row->computed) {
				/* A row of its own, starting as the one it borrowed. */
				const struct topo_select_row *from = row_lookup(t, (enum topo_coll)cl, k);
				if (!nranks)
					continue;
				if (from)
					*row = *from;
				row->computed = 1;
			}
			for (unsigned b = 0; b < TOPO_SIZE_BUCKETS; b++) {
				uint64_t lo = b == 0 ? 0 : topo_bucket_max(b - 1) + 1, hi = topo_bucket_max(b);
				if (lo >= min_bytes && hi <= max_bytes) {
					row->choice[b] = *c;
					row->tuned[b] = 1;
					changed++;
				}
			}
		}
	}
	return changed;
}
