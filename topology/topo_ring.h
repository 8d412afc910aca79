/*
 * Rings over a communicator's ranks.
 *
 * A ring is an order of the ranks; rank order[i] sends to order[i + 1] and
 * the last one to the first. A ring collective moves every byte over every
 * hop, so its bandwidth is that of its slowest hop: the best ring has the
 * fastest slowest hop, and among those the largest total bandwidth (which,
 * on a PCIe node, means crossing the slow inter-socket link as few times as
 * possible). Rings of up to TOPO_RING_EXACT_MAX ranks are found by an
 * exhaustive search with pruning; larger ones by nearest-neighbour tours
 * improved with 2-opt.
 *
 * Several rings (one per channel) are searched one after the other with
 * the bandwidth of every pair already used multiplied by a usage penalty,
 * so later rings spread over links the earlier ones left free where the
 * topology has them. When the next ring would be slower than half the
 * first one, the spread has run out and the remaining channels repeat the
 * rings found so far, in order.
 */
#ifndef DFCCL_TOPO_RING_H
#define DFCCL_TOPO_RING_H

#include "topo_model.h"

#define TOPO_RING_EXACT_MAX 10
#define TOPO_MAX_RINGS 16

struct topo_ring {
	unsigned n;
	unsigned order[TOPO_MAX_RANKS]; /* ranks: order[i] sends to order[(i + 1) % n] */
	double bw_gbps;                 /* bandwidth of the slowest hop (unpenalized) */
};

/*
 * The best ring over n ranks given their pairwise bandwidths w (n x n,
 * row-major; the diagonal is ignored). order gets n ranks starting with 0.
 * Returns 0 or -EINVAL.
 */
int topo_ring_search(const double *w, unsigned n, unsigned *order);

/*
 * The engine's entry point: nrings rings (1..TOPO_MAX_RINGS) over the
 * communicator whose rank r runs on device rank_dev[r]. penalty in (0, 1]
 * multiplies a pair's bandwidth for each earlier ring that used it (1: no
 * spreading, every ring is the best one). Returns 0, -EINVAL or -ENOMEM.
 */
int topo_rings(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks, unsigned nrings,
               double penalty, struct topo_ring *out);

#endif /* DFCCL_TOPO_RING_H */
