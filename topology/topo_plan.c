/* See topo_plan.h. */
#include "topo_plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topo_json.h"
#include "topo_ring.h"
#include "topo_tree.h"

unsigned topo_plan_algo_family(enum topo_algo a)
{
	switch (a) {
	case TOPO_ALGO_RING: return DFCCL_ALGO_RING;
	case TOPO_ALGO_TREE: return DFCCL_ALGO_TREE;
	case TOPO_ALGO_MULTITREE: return DFCCL_ALGO_MULTITREE;
	default: return DFCCL_ALGO_DIRECT;
	}
}

int topo_plan_build(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks,
                    const struct topo_select_params *p, const char *tuning, struct dfccl_comm_plan *out, char *err,
                    size_t errlen)
{
	if (errlen)
		err[0] = '\0';
	if (!m || !rank_dev || nranks == 0 || nranks > DFCCL_COMM_MAX_RANKS)
		return -EINVAL;
	struct topo_select_params sp;
	if (p)
		sp = *p;
	else
		topo_select_params_default(&sp);
	memset(out, 0, sizeof(*out));
	unsigned ntrees = nranks < DFCCL_PLAN_TREES ? nranks : DFCCL_PLAN_TREES;
	struct topo_ring *ring = malloc(sizeof(*ring));
	struct topo_tree *trees = calloc(ntrees, sizeof(*trees));
	struct topo_select_table *t = NULL;
	int rc = ring && trees ? 0 : -ENOMEM;
	if (rc == 0)
		rc = topo_rings(m, rank_dev, nranks, 1, sp.penalty, ring);
	if (rc == 0)
		rc = topo_trees(m, rank_dev, nranks, ntrees, sp.penalty, trees);
	if (rc == 0 && nranks > 1)
		rc = topo_select_table_build(m, rank_dev, nranks, &sp, &t);
	if (rc < 0) {
		snprintf(err, errlen, "cannot compute rings, trees and the selection table: %s", strerror(-rc));
		goto out;
	}
	if (t && tuning && tuning[0]) {
		rc = topo_json_apply_tuning(t, tuning, err, errlen);
		if (rc < 0)
			goto out;
		rc = 0;
	}
	out->ntrees = (uint8_t)ntrees;
	for (unsigned i = 0; i < nranks; i++)
		out->ring[i] = (uint8_t)ring->order[i];
	for (unsigned k = 0; k < ntrees; k++)
		for (unsigned r = 0; r < nranks; r++)
			out->parent[k][r] = trees[k].parent[r] < 0 ? DFCCL_PLAN_NO_PARENT : (uint8_t)trees[k].parent[r];
	for (unsigned c = 0; c < DFCCL_PLAN_COLLS; c++)
		for (unsigned b = 0; b < DFCCL_PLAN_BUCKETS; b++) {
			struct topo_choice ch = {TOPO_ALGO_DIRECT_ONESHOT, 1};
			if (t)
				rc = topo_select(t, (enum topo_coll)c, nranks, topo_bucket_max(b), &ch);
			if (rc < 0)
				goto out;
			out->algo[c][b] = (uint8_t)topo_plan_algo_family(ch.algo);
		}
	out->valid = DFCCL_PLAN_VALID;
out:
	topo_select_table_free(t);
	free(trees);
	free(ring);
	return rc;
}
