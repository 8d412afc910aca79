/*
 * The plan of one communicator (struct dfccl_comm_plan, proto/dfccl_comm.h):
 * what its engines run, computed once by the supervisor from the topology
 * model and the device of every rank, and written into the communicator's
 * shared region before any worker sees it.
 *
 *   ring    ring 0 of topo_rings() (the maximum-bandwidth ring); engines
 *           whose tasks run on one channel use this one;
 *   trees   the first min(nranks, DFCCL_PLAN_TREES) trees of topo_trees(),
 *           with the link-usage penalty, each rooted at another rank: the
 *           single-tree algorithm uses tree 0, multi-tree all of them;
 *   algo    per collective and size bucket, the family (enum dfccl_algo)
 *           of the selection table's choice for nranks ranks, after the
 *           tuning file and the forced algorithm (params->force).
 */
#ifndef DFCCL_TOPO_PLAN_H
#define DFCCL_TOPO_PLAN_H

#include <stddef.h>

#include "dfccl_comm.h"
#include "topo_model.h"
#include "topo_select.h"

/*
 * Fills *out for ranks 0..nranks-1 on devices rank_dev[] (1 ..
 * DFCCL_COMM_MAX_RANKS ranks). p NULL: the selection defaults; tuning NULL
 * or "": no tuning file, else its text (topo_json.h). Returns 0, or -EINVAL
 * (bad arguments, a tuning file that does not apply: err says why) or
 * -ENOMEM.
 */
int topo_plan_build(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks,
                    const struct topo_select_params *p, const char *tuning, struct dfccl_comm_plan *out, char *err,
                    size_t errlen);

/* The engines' name of a selection-table algorithm (enum dfccl_algo). */
unsigned topo_plan_algo_family(enum topo_algo a);

#endif /* DFCCL_TOPO_PLAN_H */
