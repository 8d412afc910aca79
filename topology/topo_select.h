/*
 * Algorithm selection: which algorithm and how many channels an engine
 * uses for one collective, by collective, rank count and message size.
 *
 * The engines' contract. An engine builds one table per communicator (or
 * one per node) with topo_select_table_build(), from the topology model and
 * the device each rank runs on, and then, per collective, asks
 * topo_select() -- a lookup, cheap enough for every call. The rings and
 * trees an algorithm runs over come from topo_rings() (topo_ring.h) and
 * topo_trees() (topo_tree.h) with the same rank-to-device map: ring c
 * serves channel c; tree k carries the k-th of ntrees equal parts of the
 * data (multi-tree) and tree 0 alone serves the single-tree algorithm.
 *
 * The table's defaults come from a cost model: every step costs a fixed
 * synchronization time plus the link latency, every byte costs the
 * bandwidth the algorithm gets from the topology (its slowest hop, shared
 * among the rings or trees that use a link, at most channel_gbps per
 * channel). Among channel counts, the smallest within 3 % of the best time
 * wins (fewer channels leave the engine's blocks to other collectives).
 * A tuning file (topo_json.h) overrides entries with measured choices, and
 * the daemon's `algo` setting forces one algorithm family everywhere it
 * applies; a forced algorithm beats the tuning file.
 *
 * Message size, `bytes`, is the size of the buffer each rank passes: for
 * all-reduce, broadcast and reduce the buffer; for all-gather the whole
 * output (nranks parts); for reduce-scatter the whole input.
 *
 * Sizes fall into TOPO_SIZE_BUCKETS power-of-two buckets: bucket 0 holds 0
 * and 1 byte, bucket k holds (2^(k-1), 2^k], the last bucket everything
 * larger. Rows exist for 2..max_ranks ranks; rows above 16 ranks are
 * computed for powers of two and for max_ranks, and a rank count without a
 * row of its own uses the closest smaller one.
 */
#ifndef DFCCL_TOPO_SELECT_H
#define DFCCL_TOPO_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "topo_model.h"

enum topo_coll {
	TOPO_COLL_ALLREDUCE = 0,
	TOPO_COLL_ALLGATHER,
	TOPO_COLL_REDUCESCATTER,
	TOPO_COLL_BROADCAST,
	TOPO_COLL_REDUCE,
	TOPO_COLL_COUNT_
};

enum topo_algo {
	TOPO_ALGO_DIRECT_ONESHOT = 0, /* every rank reads its peers' buffers at once, one step */
	TOPO_ALGO_DIRECT_TWOSHOT,     /* all-reduce only: direct reduce-scatter, then direct all-gather */
	TOPO_ALGO_RING,               /* ring(s), one per channel */
	TOPO_ALGO_TREE,               /* one balanced tree (latency) */
	TOPO_ALGO_MULTITREE,          /* several trees, each carrying a part of the data (bandwidth) */
	TOPO_ALGO_COUNT_
};

/* The daemon's `algo` setting, in the order of its choices. */
enum topo_force {
	TOPO_FORCE_AUTO = 0,
	TOPO_FORCE_DIRECT,    /* one-shot or two-shot, whichever the cost model prefers */
	TOPO_FORCE_RING,
	TOPO_FORCE_TREE,
	TOPO_FORCE_MULTITREE,
	TOPO_FORCE_COUNT_
};

struct topo_choice {
	enum topo_algo algo;
	unsigned channels; /* 1..max_channels; for MULTITREE, the number of trees (one channel each) */
};

struct topo_select_params {
	double step_us;        /* synchronization cost of one algorithm step, beyond link latency */
	double channel_gbps;   /* bandwidth one channel can drive */
	unsigned max_channels; /* 1..TOPO_MAX_RINGS */
	unsigned ntrees;       /* trees for MULTITREE: 0 means one per rank, at most TOPO_MAX_TREES */
	double penalty;        /* link-usage penalty for later rings and trees, (0, 1] */
	int force;             /* enum topo_force */
};

#define TOPO_SIZE_BUCKETS 41

struct topo_select_row {
	int computed;                                /* 0: use the closest smaller row */
	struct topo_choice choice[TOPO_SIZE_BUCKETS];
	unsigned char tuned[TOPO_SIZE_BUCKETS];      /* set by a tuning file */
};

struct topo_select_table {
	unsigned max_ranks;
	struct topo_select_params params;
	struct topo_select_row *rows; /* [TOPO_COLL_COUNT_ * (max_ranks + 1)], see topo_select_row_at() */
};

void topo_select_params_default(struct topo_select_params *p);

/*
 * Builds the table for the communicator whose rank r runs on device
 * rank_dev[r] (nranks ranks, 1..TOPO_MAX_RANKS): the row for k ranks models
 * the communicator of ranks 0..k-1. p NULL: defaults. Returns 0, -EINVAL or
 * -ENOMEM.
 */
int topo_select_table_build(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks,
                            const struct topo_select_params *p, struct topo_select_table **out);
void topo_select_table_free(struct topo_select_table *t);

/*
 * The engine's per-collective call: the algorithm and channel count for
 * coll over nranks ranks with a buffer of `bytes` (see above). nranks
 * above the table's max_ranks uses the last row; nranks 1 needs no
 * communication and answers DIRECT_ONESHOT on one channel. Returns 0, or
 * -EINVAL for an unknown collective or nranks 0.
 */
int topo_select(const struct topo_select_table *t, enum topo_coll coll, unsigned nranks, uint64_t bytes,
                struct topo_choice *out);

/* Whether algo can run coll. */
int topo_algo_valid(enum topo_coll coll, enum topo_algo algo);

/*
 * Overrides the entries of coll (every collective when coll is
 * TOPO_COLL_COUNT_) for nranks ranks (every row when 0) whose size bucket
 * lies within [min_bytes, max_bytes], unless a forced algorithm applies.
 * Returns the number of entries changed, or -EINVAL when the algorithm
 * cannot run that collective or the channel count is out of range.
 */
int topo_select_override(struct topo_select_table *t, enum topo_coll coll, unsigned nranks, uint64_t min_bytes,
                         uint64_t max_bytes, const struct topo_choice *c);

/* Bucket of a size, and the largest size of a bucket (UINT64_MAX for the last). */
unsigned topo_size_bucket(uint64_t bytes);
uint64_t topo_bucket_max(unsigned bucket);

static inline struct topo_select_row *topo_select_row_at(const struct topo_select_table *t, enum topo_coll coll,
                                                         unsigned nranks)
{
	return &t->rows[(size_t)coll * (t->max_ranks + 1) + nranks];
}

/* Names ("allreduce", "ring", "multitree", ...) and back (-1 when unknown). */
const char *topo_coll_name(enum topo_coll c);
int topo_coll_parse(const char *name);
const char *topo_algo_name(enum topo_algo a);
int topo_algo_parse(const char *name);

#endif /* DFCCL_TOPO_SELECT_H */
