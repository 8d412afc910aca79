/*
 * The layout of a simulated job for dfccl-sim: GPUs, groups of GPUs, the
 * collectives of each group, and the order in which each GPU expects to
 * invoke its collectives.
 *
 * Every group has its own ordered list of collectives; collective ids are
 * numbered group by group, so the j-th collective of group g has the id
 * first[g] + j. A GPU invokes the collectives of every group it belongs to.
 * Its expected order either interleaves the lists of its groups round-robin
 * (the first collective of each group in group order, then the second of
 * each, ...), or concatenates them (all of its first group's, then all of
 * the next group's), or, for a recorded trace, is the order the trace
 * gives.
 *
 * Layouts come from the 3D (Megatron) grouping: TP groups are consecutive
 * GPUs, DP groups take the GPU at one TP position across the TP groups of
 * a pipeline stage, and pipeline groups have no collectives, so every
 * stage is a separate component; from a file that lists groups (free
 * grouping); or from a trace of per-rank invocation orders.
 *
 * The simulator works on components (sets of GPUs connected through shared
 * groups) separately: nothing that happens in one can affect another.
 */
#ifndef DFCCL_SIM_LAYOUT_H
#define DFCCL_SIM_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sim_order {
	SIM_ORDER_INTERLEAVE, /* round-robin over the GPU's groups (the published model) */
	SIM_ORDER_CONCAT,     /* each group's list in turn */
	SIM_ORDER_TRACE,      /* given per GPU (a recorded trace) */
};

/* Positions and ids are 32-bit: a layout is refused beyond SIM_MAX_INVOCATIONS. */
#define SIM_MAX_INVOCATIONS (INT32_MAX / 2)
/* eidx of a member that never invokes a collective (a trace that ends first). */
#define SIM_NEVER INT32_MAX

struct sim_layout {
	int ngpus, ngroups;
	int32_t ncolls;
	int64_t invocations; /* sum over GPUs of their collectives: picks per round */
	enum sim_order order_kind;

	/* Groups: members grp_members[moff[g] .. moff[g+1]), collectives
	 * first[g] .. first[g+1]. */
	int32_t *grp_moff;    /* [ngroups + 1] */
	int32_t *grp_members; /* GPU ids */
	int32_t *grp_first;   /* [ngroups + 1] */
	/* Where member mi of group g expects collective first[g] + j in its own
	 * order: eidx[eoff[g] + j * size + mi], or SIM_NEVER. */
	int64_t *grp_eoff; /* [ngroups + 1] */
	int32_t *eidx;
	int32_t *coll_group; /* [ncolls] */

	/* GPUs: expected order order[off[h] .. off[h+1]) of collective ids, and
	 * for each entry the GPU's member index in that collective's group. */
	int64_t *gpu_off; /* [ngpus + 1] */
	int32_t *order;
	int32_t *order_mi;

	/* Synchronizations recorded in a trace: GPU h synchronizes before its
	 * sync_at[soff[h] .. soff[h+1])-th invocation (ascending). */
	int64_t *sync_off; /* [ngpus + 1] */
	int32_t *sync_at;

	/* Components, each a list of GPUs (ascending) and of groups. */
	int ncomps;
	int32_t *comp_goff, *comp_gpus;   /* [ncomps + 1], [ngpus] */
	int32_t *comp_grpoff, *comp_grps; /* [ncomps + 1], [ngroups] */

	/* Whether some one order of all collectives agrees with every GPU's
	 * expected order (always so for generated layouts; a trace may not be):
	 * then a round without disorder cannot deadlock. */
	bool consistent;

	/* Names for reports (a trace's collectives and groups); NULL elsewhere. */
	char **coll_names;
	char **group_names;
	/* What the layout is, in words, for reports. */
	char desc[160];
};

/*
 * A layout under construction: groups are added one by one (members and
 * a collective count), then sim_layout_finish orders every GPU's
 * collectives. Errors are written to err (a sentence) and make the
 * functions return -EINVAL or -ENOMEM.
 */
struct sim_builder;

struct sim_builder *sim_builder_new(void);
void sim_builder_free(struct sim_builder *b);
/* Adds a group; returns its id (>= 0) or a negative errno. */
int sim_builder_group(struct sim_builder *b, const int32_t *gpus, int n, int32_t colls, char *err, size_t errlen);
/* Finishes with a generated order (interleave or concat); the builder is
 * consumed either way. */
int sim_layout_finish(struct sim_builder *b, enum sim_order order, struct sim_layout **out, char *err,
                      size_t errlen);

/* 3D grouping: tp * dp * pp GPUs, (tp + dp) * pp groups. */
int sim_layout_3d(int tp, int dp, int pp, int32_t colls_tp, int32_t colls_dp, enum sim_order order,
                  struct sim_layout **out, char *err, size_t errlen);

/*
 * Free grouping from JSON text, in one of these forms:
 *   {"groups": [{"gpus": [0, 1, 2], "collectives": 400}, ...]}
 *   {"groups": [[0, 1, 2], [2, 3], ...], "collectives": 400}
 *   {"groups": [[0, 1, 2], [2, 3], ...], "collectives": [400, 1200]}
 *       (a list alternates: group i has collectives[i % length])
 *   {"gpu_per_group": [[...], ...], "coll_cnt_per_group": [...]}
 *       (the published simulator's configuration keys)
 * GPUs are numbered from 0, and every GPU up to the largest must be in a
 * group.
 */
int sim_layout_free_json(const char *text, enum sim_order order, struct sim_layout **out, char *err,
                         size_t errlen);

/*
 * A trace: per-rank invocation orders, as {"ranks": [[event, ...], ...]}
 * or a bare list of per-rank lists. An event is
 *   "name"                         a collective; the ranks that list the
 *                                  same name take part in it, and
 *                                  collectives with the same set of ranks
 *                                  form a group;
 *   {"comm": C, "seq": N, ...}     the N-th collective of communicator C
 *                                  (a string or a number), as a flight
 *                                  recorder writes it; a communicator is a
 *                                  group of the ranks that appear with it,
 *                                  and a rank of it that never lists
 *                                  (C, N) never invokes it;
 *   "sync", {"sync": true} or {"op": "sync"}
 *                                  a device synchronization.
 * Other keys of an event object ("op", "bytes", ...) are ignored.
 * The text may instead be dfccld's flight-recorder dump of a communicator
 * (`dfcclctl dump COMM --json`), or a list of such dumps, one per
 * communicator of the job: each client process becomes a rank, its
 * collectives ordered by submission time (see sim_layout.c).
 */
int sim_layout_trace_json(const char *text, struct sim_layout **out, char *err, size_t errlen);

void sim_layout_free(struct sim_layout *l);

/* Collectives of GPU h; size of group g; group of GPU h's i-th group slot. */
static inline int32_t sim_gpu_ncolls(const struct sim_layout *l, int h)
{
	return (int32_t)(l->gpu_off[h + 1] - l->gpu_off[h]);
}

static inline int sim_group_size(const struct sim_layout *l, int g)
{
	return l->grp_moff[g + 1] - l->grp_moff[g];
}

/* Expected position of collective c in the order of member mi of its group. */
static inline int32_t sim_eidx(const struct sim_layout *l, int32_t c, int mi)
{
	int g = l->coll_group[c];
	int size = sim_group_size(l, g);
	return l->eidx[l->grp_eoff[g] + (int64_t)(c - l->grp_first[g]) * size + mi];
}

/* Writes a collective's name ("g3#17", or the trace's) to buf. */
void sim_coll_name(const struct sim_layout *l, int32_t c, char *buf, size_t len);

#endif /* DFCCL_SIM_LAYOUT_H */
