/*
 * Layouts of simulated jobs: the 3D and free groupings and recorded traces,
 * turned into the arrays the simulator walks (see sim_layout.h).
 *
 * A builder collects groups (members and a collective count) and, for a
 * trace, every GPU's order; sim_layout_finish and its trace variant number
 * the collectives, order each GPU's list, record where each member expects
 * each collective, split the GPUs into components, and check whether one
 * order of all collectives agrees with every GPU's (a topological sort of
 * the "comes before on some GPU" relation).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sim_layout.h"

struct sim_builder {
	int ngroups, cap;
	int32_t *count; /* [cap] collectives per group */
	int32_t *moff;  /* [cap + 1] */
	int32_t *members;
	int64_t nmembers, mcap;
	/* A trace's orders and syncs (NULL for generated layouts). */
	int nranks;
	int32_t **rank_order, *rank_n;
	int32_t **rank_sync, *rank_nsync;
	char **coll_names, **group_names; /* handed to the layout */
};

static int fail(char *err, size_t len, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t len, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return rc;
}

struct sim_builder *sim_builder_new(void)
{
	struct sim_builder *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->moff = calloc(1, sizeof(*b->moff));
	if (!b->moff) {
		free(b);
		return NULL;
	}
	return b;
}

static void free_strings(char **v, int64_t n)
{
	if (!v)
		return;
	for (int64_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void sim_builder_free(struct sim_builder *b)
{
	if (!b)
		return;
	for (int r = 0; r < b->nranks; r++) {
		free(b->rank_order ? b->rank_order[r] : NULL);
		free(b->rank_sync ? b->rank_sync[r] : NULL);
	}
	free(b->rank_order);
	free(b->rank_n);
	free(b->rank_sync);
	free(b->rank_nsync);
	int64_t ncolls = 0;
	for (int g = 0; g < b->ngroups; g++)
		ncolls += b->count[g];
	free_strings(b->coll_names, ncolls);
	free_strings(b->group_names, b->ngroups);
	free(b->count);
	free(b->moff);
	free(b->members);
	free(b);
}

/* A failure's return, with the sentence for running out of memory. */
static int failed(int rc, char *err, size_t errlen)
{
	if (rc == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	return rc;
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

int sim_builder_group(struct sim_builder *b, const int32_t *gpus, int n, int32_t colls, char *err, size_t errlen)
{
	int g = b->ngroups;
	if (n < 1)
		return fail(err, errlen, -EINVAL, "group %d has no GPUs", g);
	if (colls < 1)
		return fail(err, errlen, -EINVAL, "group %d has no collectives (%d)", g, (int)colls);
	int32_t *sorted = malloc((size_t)n * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	memcpy(sorted, gpus, (size_t)n * sizeof(*sorted));
	qsort(sorted, (size_t)n, sizeof(*sorted), cmp_i32);
	for (int i = 0; i < n; i++) {
		if (sorted[i] < 0 || (i && sorted[i] == sorted[i - 1])) {
			int32_t bad = sorted[i];
			free(sorted);
			return fail(err, errlen, -EINVAL, "group %d: GPU %d %s", g, (int)bad,
			            bad < 0 ? "is negative" : "is listed twice");
		}
	}
	free(sorted);
	if (b->ngroups == b->cap) {
		int cap = b->cap ? 2 * b->cap : 16;
		int32_t *c = realloc(b->count, (size_t)cap * sizeof(*c));
		if (!c)
			return -ENOMEM;
		b->count = c;
		int32_t *m = realloc(b->moff, (size_t)(cap + 1) * sizeof(*m));
		if (!m)
			return -ENOMEM;
		b->moff = m;
		b->cap = cap;
	}
	if (b->nmembers + n > b->mcap) {
		int64_t cap = b->mcap ? 2 * b->mcap : 64;
		while (cap < b->nmembers + n)
			cap *= 2;
		int32_t *m = realloc(b->members, (size_t)cap * sizeof(*m));
		if (!m)
			return -ENOMEM;
		b->members = m;
		b->mcap = cap;
	}
	if (b->nmembers + n > SIM_MAX_INVOCATIONS)
		return fail(err, errlen, -EINVAL, "too many group members");
	memcpy(b->members + b->nmembers, gpus, (size_t)n * sizeof(*gpus));
	b->nmembers += n;
	b->count[g] = colls;
	b->moff[g + 1] = (int32_t)b->nmembers;
	b->ngroups++;
	return g;
}

/* ---------------------------------------------------------------- finishing */

void sim_layout_free(struct sim_layout *l)
{
	if (!l)
		return;
	free(l->grp_moff);
	free(l->grp_members);
	free(l->grp_first);
	free(l->grp_eoff);
	free(l->eidx);
	free(l->coll_group);
	free(l->gpu_off);
	free(l->order);
	free(l->order_mi);
	free(l->sync_off);
	free(l->sync_at);
	free(l->comp_goff);
	free(l->comp_gpus);
	free(l->comp_grpoff);
	free(l->comp_grps);
	free_strings(l->coll_names, l->ncolls);
	free_strings(l->group_names, l->ngroups);
	free(l);
}

static int member_index(const struct sim_layout *l, int g, int h)
{
	for (int32_t i = l->grp_moff[g]; i < l->grp_moff[g + 1]; i++)
		if (l->grp_members[i] == h)
			return i - l->grp_moff[g];
	return -1;
}

/* Groups and collectives: copies the builder's groups, numbers the collectives. */
static int layout_groups(struct sim_layout *l, struct sim_builder *b, char *err, size_t errlen)
{
	l->ngroups = b->ngroups;
	int32_t maxgpu = -1;
	for (int64_t i = 0; i < b->nmembers; i++)
		if (b->members[i] > maxgpu)
			maxgpu = b->members[i];
	l->ngpus = maxgpu + 1;
	if (b->nranks > l->ngpus)
		l->ngpus = b->nranks;
	int64_t ncolls = 0, eidx_n = 0;
	for (int g = 0; g < b->ngroups; g++) {
		ncolls += b->count[g];
		eidx_n += (int64_t)b->count[g] * (b->moff[g + 1] - b->moff[g]);
	}
	if (ncolls > SIM_MAX_INVOCATIONS || eidx_n > SIM_MAX_INVOCATIONS)
		return fail(err, errlen, -EINVAL, "the layout is too large (%lld collectives, %lld invocations)",
		            (long long)ncolls, (long long)eidx_n);
	l->ncolls = (int32_t)ncolls;
	l->invocations = eidx_n;
	l->grp_moff = malloc((size_t)(l->ngroups + 1) * sizeof(int32_t));
	l->grp_members = malloc((size_t)(b->nmembers ? b->nmembers : 1) * sizeof(int32_t));
	l->grp_first = malloc((size_t)(l->ngroups + 1) * sizeof(int32_t));
	l->grp_eoff = malloc((size_t)(l->ngroups + 1) * sizeof(int64_t));
	l->eidx = malloc((size_t)(eidx_n ? eidx_n : 1) * sizeof(int32_t));
	l->coll_group = malloc((size_t)(ncolls ? ncolls : 1) * sizeof(int32_t));
	if (!l->grp_moff || !l->grp_members || !l->grp_first || !l->grp_eoff || !l->eidx || !l->coll_group)
		return -ENOMEM;
	memcpy(l->grp_moff, b->moff, (size_t)(l->ngroups + 1) * sizeof(int32_t));
	memcpy(l->grp_members, b->members, (size_t)b->nmembers * sizeof(int32_t));
	l->grp_first[0] = 0;
	l->grp_eoff[0] = 0;
	for (int g = 0; g < l->ngroups; g++) {
		/* Members ascending, so member indices follow GPU order. */
		qsort(l->grp_members + l->grp_moff[g], (size_t)sim_group_size(l, g), sizeof(int32_t), cmp_i32);
		l->grp_first[g + 1] = l->grp_first[g] + b->count[g];
		l->grp_eoff[g + 1] = l->grp_eoff[g] + (int64_t)b->count[g] * sim_group_size(l, g);
		for (int32_t c = l->grp_first[g]; c < l->grp_first[g + 1]; c++)
			l->coll_group[c] = g;
	}
	for (int64_t i = 0; i < eidx_n; i++)
		l->eidx[i] = SIM_NEVER;
	return 0;
}

/* The groups of every GPU in group order: gslot[goff[h] .. goff[h+1]). */
static int gpu_groups(const struct sim_layout *l, int32_t **goff_out, int32_t **gslot_out)
{
	int32_t *goff = calloc((size_t)l->ngpus + 1, sizeof(*goff));
	int32_t *gslot = malloc((size_t)(l->grp_moff[l->ngroups] ? l->grp_moff[l->ngroups] : 1) * sizeof(*gslot));
	int32_t *fill = calloc((size_t)l->ngpus + 1, sizeof(*fill));
	if (!goff || !gslot || !fill) {
		free(goff);
		free(gslot);
		free(fill);
		return -ENOMEM;
	}
	for (int32_t i = 0; i < l->grp_moff[l->ngroups]; i++)
		goff[l->grp_members[i] + 1]++;
	for (int h = 0; h < l->ngpus; h++)
		goff[h + 1] += goff[h];
	for (int g = 0; g < l->ngroups; g++)
		for (int32_t i = l->grp_moff[g]; i < l->grp_moff[g + 1]; i++) {
			int h = l->grp_members[i];
			gslot[goff[h] + fill[h]++] = g;
		}
	free(fill);
	*goff_out = goff;
	*gslot_out = gslot;
	return 0;
}

/* Generated orders: interleaved or concatenated lists of the GPU's groups. */
static int layout_generated_orders(struct sim_layout *l, enum sim_order order, char *err, size_t errlen)
{
	int32_t *goff, *gslot;
	if (gpu_groups(l, &goff, &gslot))
		return -ENOMEM;
	l->gpu_off = malloc((size_t)(l->ngpus + 1) * sizeof(int64_t));
	l->order = malloc((size_t)(l->invocations ? l->invocations : 1) * sizeof(int32_t));
	l->order_mi = malloc((size_t)(l->invocations ? l->invocations : 1) * sizeof(int32_t));
	if (!l->gpu_off || !l->order || !l->order_mi) {
		free(goff);
		free(gslot);
		return -ENOMEM;
	}
	int64_t pos = 0;
	for (int h = 0; h < l->ngpus; h++) {
		l->gpu_off[h] = pos;
		if (goff[h] == goff[h + 1]) {
			free(goff);
			free(gslot);
			return fail(err, errlen, -EINVAL, "GPU %d is in no group (GPUs are numbered from 0)", h);
		}
		int32_t longest = 0;
		for (int32_t s = goff[h]; s < goff[h + 1]; s++) {
			int g = gslot[s];
			if (l->grp_first[g + 1] - l->grp_first[g] > longest)
				longest = l->grp_first[g + 1] - l->grp_first[g];
		}
		/* Interleave: round j takes the j-th collective of every group
		 * that has one; concat: one "round" per group slot. */
		int32_t rounds = order == SIM_ORDER_CONCAT ? goff[h + 1] - goff[h] : longest;
		for (int32_t j = 0; j < rounds; j++) {
			for (int32_t s = goff[h]; s < goff[h + 1]; s++) {
				int g = gslot[s];
				int32_t n = l->grp_first[g + 1] - l->grp_first[g];
				int32_t lo = order == SIM_ORDER_CONCAT ? (s - goff[h] == j ? 0 : n) : j;
				int32_t hi = order == SIM_ORDER_CONCAT ? n : (j < n ? j + 1 : j);
				int mi = member_index(l, g, h);
				for (int32_t k = lo; k < hi; k++) {
					l->order[pos] = l->grp_first[g] + k;
					l->order_mi[pos] = mi;
					pos++;
				}
			}
		}
	}
	l->gpu_off[l->ngpus] = pos;
	free(goff);
	free(gslot);
	return 0;
}

static void layout_eidx(struct sim_layout *l)
{
	for (int h = 0; h < l->ngpus; h++) {
		for (int64_t p = l->gpu_off[h]; p < l->gpu_off[h + 1]; p++) {
			int32_t c = l->order[p];
			int g = l->coll_group[c];
			int64_t at = l->grp_eoff[g] + (int64_t)(c - l->grp_first[g]) * sim_group_size(l, g) + l->order_mi[p];
			l->eidx[at] = (int32_t)(p - l->gpu_off[h]);
		}
	}
}

static int find_root(int32_t *parent, int32_t x)
{
	while (parent[x] != x) {
		parent[x] = parent[parent[x]];
		x = parent[x];
	}
	return x;
}

/* Components: GPUs joined by the groups they share (union-find). */
static int layout_components(struct sim_layout *l)
{
	int32_t *parent = malloc((size_t)l->ngpus * sizeof(*parent));
	int32_t *id = malloc((size_t)l->ngpus * sizeof(*id));
	l->comp_goff = calloc((size_t)l->ngpus + 1, sizeof(int32_t));
	l->comp_gpus = malloc((size_t)l->ngpus * sizeof(int32_t));
	l->comp_grpoff = calloc((size_t)l->ngpus + 1, sizeof(int32_t));
	l->comp_grps = malloc((size_t)(l->ngroups ? l->ngroups : 1) * sizeof(int32_t));
	if (!parent || !id || !l->comp_goff || !l->comp_gpus || !l->comp_grpoff || !l->comp_grps) {
		free(parent);
		free(id);
		return -ENOMEM;
	}
	for (int h = 0; h < l->ngpus; h++)
		parent[h] = h;
	for (int g = 0; g < l->ngroups; g++)
		for (int32_t i = l->grp_moff[g] + 1; i < l->grp_moff[g + 1]; i++) {
			int a = find_root(parent, l->grp_members[l->grp_moff[g]]), c = find_root(parent, l->grp_members[i]);
			if (a != c)
				parent[a > c ? a : c] = a < c ? a : c;
		}
	/* Components numbered by their smallest GPU, GPUs ascending inside. */
	l->ncomps = 0;
	for (int h = 0; h < l->ngpus; h++)
		id[h] = find_root(parent, h) == h ? l->ncomps++ : -1;
	for (int h = 0; h < l->ngpus; h++)
		id[h] = id[find_root(parent, h)];
	for (int h = 0; h < l->ngpus; h++)
		l->comp_goff[id[h] + 1]++;
	for (int g = 0; g < l->ngroups; g++)
		l->comp_grpoff[id[l->grp_members[l->grp_moff[g]]] + 1]++;
	for (int k = 0; k < l->ncomps; k++) {
		l->comp_goff[k + 1] += l->comp_goff[k];
		l->comp_grpoff[k + 1] += l->comp_grpoff[k];
	}
	int32_t *fill = parent; /* reused as fill counters */
	memset(fill, 0, (size_t)l->ngpus * sizeof(*fill));
	for (int h = 0; h < l->ngpus; h++)
		l->comp_gpus[l->comp_goff[id[h]] + fill[id[h]]++] = h;
	memset(fill, 0, (size_t)l->ngpus * sizeof(*fill));
	for (int g = 0; g < l->ngroups; g++) {
		int k = id[l->grp_members[l->grp_moff[g]]];
		l->comp_grps[l->comp_grpoff[k] + fill[k]++] = g;
	}
	free(parent);
	free(id);
	return 0;
}

/* Kahn's algorithm over "a comes right before b on some GPU". */
static int layout_consistency(struct sim_layout *l)
{
	int64_t nedges = l->invocations;
	int32_t *indeg = calloc((size_t)l->ncolls + 1, sizeof(*indeg));
	int64_t *eoff = calloc((size_t)l->ncolls + 2, sizeof(*eoff));
	int32_t *edges = malloc((size_t)(nedges ? nedges : 1) * sizeof(*edges));
	int32_t *queue = malloc((size_t)(l->ncolls ? l->ncolls : 1) * sizeof(*queue));
	if (!indeg || !eoff || !edges || !queue) {
		free(indeg);
		free(eoff);
		free(edges);
		free(queue);
		return -ENOMEM;
	}
	for (int h = 0; h < l->ngpus; h++)
		for (int64_t p = l->gpu_off[h]; p + 1 < l->gpu_off[h + 1]; p++)
			eoff[l->order[p] + 2]++;
	for (int32_t c = 0; c < l->ncolls; c++)
		eoff[c + 2] += eoff[c + 1];
	for (int h = 0; h < l->ngpus; h++)
		for (int64_t p = l->gpu_off[h]; p + 1 < l->gpu_off[h + 1]; p++) {
			edges[eoff[l->order[p] + 1]++] = l->order[p + 1];
			indeg[l->order[p + 1]]++;
		}
	int32_t head = 0, tail = 0;
	for (int32_t c = 0; c < l->ncolls; c++)
		if (!indeg[c])
			queue[tail++] = c;
	while (head < tail) {
		int32_t c = queue[head++];
		for (int64_t e = eoff[c]; e < eoff[c + 1]; e++)
			if (!--indeg[edges[e]])
				queue[tail++] = edges[e];
	}
	l->consistent = tail == l->ncolls;
	free(indeg);
	free(eoff);
	free(edges);
	free(queue);
	return 0;
}

static int layout_common(struct sim_layout *l)
{
	layout_eidx(l);
	int rc = layout_components(l);
	if (!rc)
		rc = layout_consistency(l);
	if (!rc && !l->sync_off) {
		l->sync_off = calloc((size_t)l->ngpus + 1, sizeof(int64_t));
		l->sync_at = malloc(sizeof(int32_t));
		if (!l->sync_off || !l->sync_at)
			rc = -ENOMEM;
	}
	return rc;
}

int sim_layout_finish(struct sim_builder *b, enum sim_order order, struct sim_layout **out, char *err,
                      size_t errlen)
{
	struct sim_layout *l = calloc(1, sizeof(*l));
	int rc = l ? 0 : -ENOMEM;
	if (!rc && b->ngroups == 0)
		rc = fail(err, errlen, -EINVAL, "the layout has no groups");
	if (!rc)
		rc = layout_groups(l, b, err, errlen);
	if (!rc) {
		l->order_kind = order;
		rc = layout_generated_orders(l, order, err, errlen);
	}
	if (!rc)
		rc = layout_common(l);
	sim_builder_free(b);
	if (rc) {
		sim_layout_free(l);
		return failed(rc, err, errlen);
	}
	snprintf(l->desc, sizeof(l->desc), "free grouping, %d groups", l->ngroups);
	*out = l;
	return 0;
}

int sim_layout_3d(int tp, int dp, int pp, int32_t colls_tp, int32_t colls_dp, enum sim_order order,
                  struct sim_layout **out, char *err, size_t errlen)
{
	if (tp < 1 || dp < 1 || pp < 1 || (int64_t)tp * dp * pp > 1 << 24)
		return fail(err, errlen, -EINVAL, "TP, DP and PP sizes must be at least 1 (and their product at most 2^24)");
	struct sim_builder *b = sim_builder_new();
	int32_t *gpus = malloc((size_t)(tp > dp ? tp : dp) * sizeof(*gpus));
	int rc = b && gpus ? 0 : -ENOMEM;
	/* Per stage: dp TP groups of tp consecutive GPUs, then tp DP groups,
	 * each of the GPUs at one TP position. */
	for (int s = 0; rc >= 0 && s < pp; s++) {
		int base = s * tp * dp;
		for (int t = 0; rc >= 0 && t < dp; t++) {
			for (int i = 0; i < tp; i++)
				gpus[i] = base + t * tp + i;
			rc = sim_builder_group(b, gpus, tp, colls_tp, err, errlen);
		}
		for (int i = 0; rc >= 0 && i < tp; i++) {
			for (int t = 0; t < dp; t++)
				gpus[t] = base + t * tp + i;
			rc = sim_builder_group(b, gpus, dp, colls_dp, err, errlen);
		}
	}
	rc = rc < 0 ? rc : 0;
	free(gpus);
	if (rc) {
		sim_builder_free(b);
		return failed(rc, err, errlen);
	}
	rc = sim_layout_finish(b, order, out, err, errlen);
	if (!rc)
		snprintf((*out)->desc, sizeof((*out)->desc), "3D grouping TP %d, DP %d, PP %d, %d/%d collectives per TP/DP group",
		         tp, dp, pp, (int)colls_tp, (int)colls_dp);
	return rc;
}

/* ---------------------------------------------------------------- JSON */

static int json_gpu_list(json_t *a, int32_t **out, int *n, int g, char *err, size_t errlen)
{
	if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > (size_t)1 << 24)
		return fail(err, errlen, -EINVAL, "group %d: the GPU list must be a non-empty array", g);
	*n = (int)json_array_size(a);
	*out = malloc((size_t)*n * sizeof(**out));
	if (!*out)
		return -ENOMEM;
	for (int i = 0; i < *n; i++) {
		json_t *v = json_array_get(a, (size_t)i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= 1 << 24) {
			free(*out);
			return fail(err, errlen, -EINVAL, "group %d: GPU entry %d is not a GPU number (0 to 2^24-1)", g, i);
		}
		(*out)[i] = (int32_t)json_integer_value(v);
	}
	return 0;
}

static int json_count(json_t *v, int32_t *out, int g, char *err, size_t errlen)
{
	if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SIM_MAX_INVOCATIONS)
		return fail(err, errlen, -EINVAL, "group %d: the collective count must be a positive integer", g);
	*out = (int32_t)json_integer_value(v);
	return 0;
}

/* The count of group g from a number or an alternating list. */
static int json_group_count(json_t *counts, int g, int32_t *out, char *err, size_t errlen)
{
	if (json_is_array(counts)) {
		if (json_array_size(counts) == 0)
			return fail(err, errlen, -EINVAL, "the list of collective counts is empty");
		return json_count(json_array_get(counts, (size_t)g % json_array_size(counts)), out, g, err, errlen);
	}
	if (!counts)
		return fail(err, errlen, -EINVAL, "group %d has no collective count (\"collectives\")", g);
	return json_count(counts, out, g, err, errlen);
}

static int free_groups(struct sim_builder *b, json_t *root, char *err, size_t errlen)
{
	json_t *groups = json_object_get(root, "groups");
	json_t *counts = json_object_get(root, "collectives");
	if (!groups) {
		groups = json_object_get(root, "gpu_per_group");
		counts = json_object_get(root, "coll_cnt_per_group");
	}
	if (!json_is_array(groups) || json_array_size(groups) == 0)
		return fail(err, errlen, -EINVAL, "expected a non-empty \"groups\" array");
	for (size_t g = 0; g < json_array_size(groups); g++) {
		json_t *e = json_array_get(groups, g);
		json_t *list = json_is_object(e) ? json_object_get(e, "gpus") : e;
		json_t *cnt = json_is_object(e) ? json_object_get(e, "collectives") : NULL;
		int32_t *gpus = NULL, colls = 0;
		int n = 0;
		int rc = json_gpu_list(list, &gpus, &n, (int)g, err, errlen);
		if (rc)
			return rc;
		rc = cnt ? json_count(cnt, &colls, (int)g, err, errlen) : json_group_count(counts, (int)g, &colls, err, errlen);
		if (!rc)
			rc = sim_builder_group(b, gpus, n, colls, err, errlen);
		free(gpus);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int sim_layout_free_json(const char *text, enum sim_order order, struct sim_layout **out, char *err,
                         size_t errlen)
{
	json_error_t je;
	json_t *root = json_loads(text, 0, &je);
	if (!root)
		return fail(err, errlen, -EINVAL, "not JSON: %s (line %d)", je.text, je.line);
	if (!json_is_object(root)) {
		json_decref(root);
		return fail(err, errlen, -EINVAL, "expected a JSON object with a \"groups\" array");
	}
	struct sim_builder *b = sim_builder_new();
	int rc = b ? free_groups(b, root, err, errlen) : -ENOMEM;
	json_decref(root);
	if (rc) {
		sim_builder_free(b);
		return failed(rc, err, errlen);
	}
	return sim_layout_finish(b, order, out, err, errlen);
}

/* ---------------------------------------------------------------- traces */

/*
 * Trace parsing in two passes. The first gives every collective a key
 * ("n:name" or "c:comm#seq") and collects its ranks, and every communicator
 * its ranks; the second assigns groups (a communicator, or the set of ranks
 * of a named collective), numbers the collectives group by group, and
 * writes every rank's order and synchronizations.
 */
struct trace_coll {
	char *key;         /* "n:name" or "c:comm#seq" */
	char comm[96];     /* "c:comm", or empty for a named collective */
	json_t *ranks;     /* the ranks that list it */
	int64_t seq;       /* order inside the group */
	int32_t gid, id;
};

struct trace {
	json_t *index;  /* key -> position in colls */
	json_t *groups; /* group key -> array of ranks (a communicator's union) or group id */
	struct trace_coll *colls;
	int64_t ncolls, cap;
};

static int event_kind(json_t *ev, char *key, size_t len, char *gkey, size_t glen, int64_t *seq)
{
	if (json_is_string(ev)) {
		if (!strcmp(json_string_value(ev), "sync"))
			return 0;
		snprintf(key, len, "n:%s", json_string_value(ev));
		*gkey = 0;
		*seq = 0;
		return 1;
	}
	if (!json_is_object(ev))
		return -1;
	json_t *op = json_object_get(ev, "op");
	if (json_is_true(json_object_get(ev, "sync")) ||
	    (json_is_string(op) && (!strcmp(json_string_value(op), "sync") || !strcmp(json_string_value(op), "synchronize"))))
		return 0;
	json_t *comm = json_object_get(ev, "comm"), *s = json_object_get(ev, "seq"), *name = json_object_get(ev, "name");
	if (comm && json_is_integer(s)) {
		char cs[64];
		if (json_is_string(comm))
			snprintf(cs, sizeof(cs), "%s", json_string_value(comm));
		else if (json_is_integer(comm))
			snprintf(cs, sizeof(cs), "%lld", (long long)json_integer_value(comm));
		else
			return -1;
		snprintf(key, len, "c:%s#%lld", cs, (long long)json_integer_value(s));
		snprintf(gkey, glen, "c:%s", cs);
		*seq = json_integer_value(s);
		return 1;
	}
	if (json_is_string(name)) {
		snprintf(key, len, "n:%s", json_string_value(name));
		*gkey = 0;
		*seq = 0;
		return 1;
	}
	return -1;
}

static json_t *trace_ranks(json_t *root)
{
	return json_is_array(root) ? root : json_object_get(root, "ranks");
}

/* Pass 1: keys, ranks per collective and per communicator. */
static int trace_collect(struct trace *t, json_t *ranks, char *err, size_t errlen)
{
	char key[160], gkey[96];
	for (size_t r = 0; r < json_array_size(ranks); r++) {
		json_t *list = json_array_get(ranks, r);
		if (!json_is_array(list))
			return fail(err, errlen, -EINVAL, "rank %zu: expected a list of events", r);
		json_t *seen = json_object();
		for (size_t i = 0; i < json_array_size(list); i++) {
			int64_t seq;
			int k = event_kind(json_array_get(list, i), key, sizeof(key), gkey, sizeof(gkey), &seq);
			if (k < 0) {
				json_decref(seen);
				return fail(err, errlen, -EINVAL,
				            "rank %zu, event %zu: expected a name, \"sync\", or an object with \"comm\" and \"seq\"", r, i);
			}
			if (k == 0)
				continue;
			if (json_object_get(seen, key)) {
				json_decref(seen);
				return fail(err, errlen, -EINVAL, "rank %zu lists collective %s twice", r, key + 2);
			}
			json_object_set_new(seen, key, json_true());
			json_t *at = json_object_get(t->index, key);
			if (!at) {
				if (t->ncolls == t->cap) {
					int64_t cap = t->cap ? 2 * t->cap : 64;
					struct trace_coll *c = realloc(t->colls, (size_t)cap * sizeof(*c));
					if (!c) {
						json_decref(seen);
						return -ENOMEM;
					}
					t->colls = c;
					t->cap = cap;
				}
				struct trace_coll *c = &t->colls[t->ncolls];
				memset(c, 0, sizeof(*c));
				c->key = strdup(key);
				c->ranks = json_array();
				snprintf(c->comm, sizeof(c->comm), "%s", gkey);
				c->seq = seq;
				c->gid = -1;
				json_object_set_new(t->index, key, json_integer(t->ncolls++));
				at = json_object_get(t->index, key);
				if (!c->key || !c->ranks) {
					json_decref(seen);
					return -ENOMEM;
				}
			}
			struct trace_coll *c = &t->colls[json_integer_value(at)];
			json_array_append_new(c->ranks, json_integer((json_int_t)r));
			if (*gkey) {
				json_t *cr = json_object_get(t->groups, gkey);
				if (!cr) {
					cr = json_object();
					json_object_set_new(t->groups, gkey, cr);
				}
				char rk[24];
				snprintf(rk, sizeof(rk), "%zu", r);
				json_object_set_new(cr, rk, json_true());
			}
		}
		json_decref(seen);
	}
	return 0;
}

static int cmp_coll_order(const void *a, const void *b)
{
	const struct trace_coll *x = a, *y = b;
	if (x->gid != y->gid)
		return (x->gid > y->gid) - (x->gid < y->gid);
	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Pass 2a: group of every collective, and the builder's groups. */
static int trace_groups(struct trace *t, struct sim_builder *b, char *err, size_t errlen)
{
	json_t *gid = json_object();
	json_t *gmembers = json_array();
	json_t *gcount = json_array();
	json_t *gnames = json_array();
	int rc = 0;
	for (int64_t i = 0; i < t->ncolls && !rc; i++) {
		struct trace_coll *c = &t->colls[i];
		char gk[4096];
		json_t *members;
		if (*c->comm) {
			snprintf(gk, sizeof(gk), "%s", c->comm);
			members = json_array();
			const char *rk;
			json_t *v;
			json_object_foreach(json_object_get(t->groups, gk), rk, v)
				json_array_append_new(members, json_integer(atoll(rk)));
		} else {
			size_t n = 0;
			n += (size_t)snprintf(gk, sizeof(gk), "p:");
			for (size_t k = 0; k < json_array_size(c->ranks) && n < sizeof(gk); k++)
				n += (size_t)snprintf(gk + n, sizeof(gk) - n, "%s%lld", k ? "," : "",
				                      (long long)json_integer_value(json_array_get(c->ranks, k)));
			members = json_incref(c->ranks);
		}
		json_t *at = json_object_get(gid, gk);
		if (!at) {
			json_object_set_new(gid, gk, json_integer((json_int_t)json_array_size(gmembers)));
			at = json_object_get(gid, gk);
			json_array_append(gmembers, members);
			json_array_append_new(gcount, json_integer(0));
			json_array_append_new(gnames, json_string(gk + 2));
		}
		json_decref(members);
		c->gid = (int32_t)json_integer_value(at);
		json_t *cnt = json_array_get(gcount, (size_t)c->gid);
		json_integer_set(cnt, json_integer_value(cnt) + 1);
	}
	for (size_t g = 0; g < json_array_size(gmembers) && rc >= 0; g++) {
		json_t *m = json_array_get(gmembers, g);
		int32_t *gpus = malloc(json_array_size(m) * sizeof(*gpus) + 1);
		if (!gpus) {
			rc = -ENOMEM;
			break;
		}
		for (size_t k = 0; k < json_array_size(m); k++)
			gpus[k] = (int32_t)json_integer_value(json_array_get(m, k));
		rc = sim_builder_group(b, gpus, (int)json_array_size(m), (int32_t)json_integer_value(json_array_get(gcount, g)),
		                       err, errlen);
		free(gpus);
	}
	if (rc >= 0) {
		rc = 0;
		b->group_names = calloc(json_array_size(gnames) + 1, sizeof(char *));
		for (size_t g = 0; b->group_names && g < json_array_size(gnames); g++)
			b->group_names[g] = strdup(json_string_value(json_array_get(gnames, g)));
		if (!b->group_names)
			rc = -ENOMEM;
	}
	json_decref(gid);
	json_decref(gmembers);
	json_decref(gcount);
	json_decref(gnames);
	return rc;
}

/* Pass 2b: collective ids group by group (by sequence), names, orders. */
static int trace_orders(struct trace *t, struct sim_builder *b, json_t *ranks, char *err, size_t errlen)
{
	qsort(t->colls, (size_t)t->ncolls, sizeof(*t->colls), cmp_coll_order);
	b->coll_names = calloc((size_t)t->ncolls + 1, sizeof(char *));
	if (!b->coll_names)
		return -ENOMEM;
	for (int64_t i = 0; i < t->ncolls; i++) {
		t->colls[i].id = (int32_t)i;
		json_object_set_new(t->index, t->colls[i].key, json_integer(i));
		b->coll_names[i] = strdup(t->colls[i].key + 2);
		if (!b->coll_names[i])
			return -ENOMEM;
	}
	b->nranks = (int)json_array_size(ranks);
	b->rank_order = calloc((size_t)b->nranks, sizeof(int32_t *));
	b->rank_n = calloc((size_t)b->nranks, sizeof(int32_t));
	b->rank_sync = calloc((size_t)b->nranks, sizeof(int32_t *));
	b->rank_nsync = calloc((size_t)b->nranks, sizeof(int32_t));
	if (!b->rank_order || !b->rank_n || !b->rank_sync || !b->rank_nsync)
		return -ENOMEM;
	char key[160], gkey[96];
	for (int r = 0; r < b->nranks; r++) {
		json_t *list = json_array_get(ranks, (size_t)r);
		size_t n = json_array_size(list);
		b->rank_order[r] = malloc((n + 1) * sizeof(int32_t));
		b->rank_sync[r] = malloc((n + 1) * sizeof(int32_t));
		if (!b->rank_order[r] || !b->rank_sync[r])
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			int64_t seq;
			if (event_kind(json_array_get(list, i), key, sizeof(key), gkey, sizeof(gkey), &seq) == 0) {
				/* Two synchronizations in a row are one. */
				int32_t at = b->rank_n[r];
				if (!b->rank_nsync[r] || b->rank_sync[r][b->rank_nsync[r] - 1] != at)
					b->rank_sync[r][b->rank_nsync[r]++] = at;
				continue;
			}
			b->rank_order[r][b->rank_n[r]++] = (int32_t)json_integer_value(json_object_get(t->index, key));
		}
		if (b->rank_n[r] == 0)
			return fail(err, errlen, -EINVAL, "rank %d invokes no collective", r);
	}
	return 0;
}

/* Finishing a trace: the orders are the recorded ones. */
static int layout_trace_orders(struct sim_layout *l, struct sim_builder *b)
{
	l->gpu_off = malloc((size_t)(l->ngpus + 1) * sizeof(int64_t));
	l->sync_off = malloc((size_t)(l->ngpus + 1) * sizeof(int64_t));
	int64_t nsync = 0, n = 0;
	for (int h = 0; h < b->nranks; h++) {
		n += b->rank_n[h];
		nsync += b->rank_nsync[h];
	}
	l->order = malloc((size_t)(n + 1) * sizeof(int32_t));
	l->order_mi = malloc((size_t)(n + 1) * sizeof(int32_t));
	l->sync_at = malloc((size_t)(nsync + 1) * sizeof(int32_t));
	if (!l->gpu_off || !l->sync_off || !l->order || !l->order_mi || !l->sync_at)
		return -ENOMEM;
	int64_t pos = 0, spos = 0;
	for (int h = 0; h < l->ngpus; h++) {
		l->gpu_off[h] = pos;
		l->sync_off[h] = spos;
		for (int32_t i = 0; i < b->rank_n[h]; i++) {
			l->order[pos] = b->rank_order[h][i];
			l->order_mi[pos] = member_index(l, l->coll_group[l->order[pos]], h);
			pos++;
		}
		for (int32_t i = 0; i < b->rank_nsync[h]; i++)
			l->sync_at[spos++] = b->rank_sync[h][i];
	}
	l->gpu_off[l->ngpus] = pos;
	l->sync_off[l->ngpus] = spos;
	l->invocations = pos;
	return 0;
}

/* ---------------------------------------------------------------- flight-recorder dumps */

/*
 * dfccld's flight-recorder dumps (`dfcclctl dump COMM --json`, or the files
 * the daemon writes) hold, per communicator, each rank's last collectives
 * with their sequence number and submission time. A rank of the job is a
 * client process (its session, else its pid and device), and its order
 * across communicators is the order of submission times. Those are watch
 * ticks, so collectives of different communicators submitted within one
 * tick keep the order (communicator id, sequence): a replay of such a tie
 * may find an inversion the job did not have, or miss one. Sequence numbers
 * older than some rank of the communicator still holds are dropped (its
 * ring overwrote them, and they had completed); point-to-point records are
 * not collectives of the whole group and are left out.
 */
struct dump_event {
	int proc;
	int64_t t;
	int64_t comm, seq;
};

static bool is_dump(json_t *j)
{
	return json_is_object(j) && json_object_get(j, "records") && json_object_get(j, "comm_id");
}

static int cmp_dump_event(const void *a, const void *b)
{
	const struct dump_event *x = a, *y = b;
	if (x->proc != y->proc)
		return (x->proc > y->proc) - (x->proc < y->proc);
	if (x->t != y->t)
		return (x->t > y->t) - (x->t < y->t);
	if (x->comm != y->comm)
		return (x->comm > y->comm) - (x->comm < y->comm);
	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* The process a communicator rank belongs to, numbered by first appearance. */
static int dump_proc(json_t *procs, json_t *dump, int64_t rank)
{
	char key[96];
	json_t *r, *ranks = json_object_get(dump, "ranks");
	size_t i;
	snprintf(key, sizeof(key), "c%lld:r%lld", (long long)json_integer_value(json_object_get(dump, "comm_id")),
	         (long long)rank);
	json_array_foreach(ranks, i, r) {
		if (json_integer_value(json_object_get(r, "rank")) != rank)
			continue;
		json_int_t sid = json_integer_value(json_object_get(r, "session_id"));
		if (sid)
			snprintf(key, sizeof(key), "s%lld", (long long)sid);
		else
			snprintf(key, sizeof(key), "p%lld:d%lld", (long long)json_integer_value(json_object_get(r, "pid")),
			         (long long)json_integer_value(json_object_get(r, "device")));
		break;
	}
	json_t *at = json_object_get(procs, key);
	if (!at) {
		json_object_set_new(procs, key, json_integer((json_int_t)json_object_size(procs)));
		at = json_object_get(procs, key);
	}
	return (int)json_integer_value(at);
}

static bool dump_collective(json_t *rec)
{
	const char *op = json_string_value(json_object_get(rec, "op"));
	return !op || (strcmp(op, "send") && strcmp(op, "recv"));
}

/* The oldest sequence every rank of the dump still holds. */
static int64_t dump_window(json_t *dump)
{
	json_t *oldest = json_object(), *rec;
	size_t i;
	json_array_foreach(json_object_get(dump, "records"), i, rec) {
		if (!dump_collective(rec))
			continue;
		char rk[24];
		snprintf(rk, sizeof(rk), "%lld", (long long)json_integer_value(json_object_get(rec, "rank")));
		json_int_t seq = json_integer_value(json_object_get(rec, "seq"));
		json_t *o = json_object_get(oldest, rk);
		if (!o || seq < json_integer_value(o))
			json_object_set_new(oldest, rk, json_integer(seq));
	}
	int64_t lo = 0;
	const char *k;
	json_t *v;
	json_object_foreach(oldest, k, v)
		if (json_integer_value(v) > lo)
			lo = json_integer_value(v);
	json_decref(oldest);
	return lo;
}

/* Dumps (one, or a list) as {"ranks": [[{"comm": C, "seq": N}, ...], ...]}. */
static int dumps_to_trace(json_t *root, json_t **out, char *err, size_t errlen)
{
	json_t *dumps = is_dump(root) ? json_pack("[O]", root) : json_incref(root), *d, *rec;
	json_t *procs = json_object();
	size_t n = 0, cap = 1024, i, k;
	struct dump_event *ev = malloc(cap * sizeof(*ev));
	int rc = dumps && procs && ev ? 0 : -ENOMEM;
	json_array_foreach(dumps, i, d) {
		if (rc)
			break;
		if (!is_dump(d)) {
			rc = fail(err, errlen, -EINVAL, "entry %zu is not a flight-recorder dump (no \"comm_id\" and \"records\")", i);
			break;
		}
		int64_t lo = dump_window(d), comm = json_integer_value(json_object_get(d, "comm_id"));
		json_array_foreach(json_object_get(d, "records"), k, rec) {
			int64_t seq = json_integer_value(json_object_get(rec, "seq"));
			if (!dump_collective(rec) || seq < lo)
				continue;
			if (n == cap) {
				struct dump_event *bigger = realloc(ev, 2 * cap * sizeof(*ev));
				if (!bigger) {
					rc = -ENOMEM;
					break;
				}
				ev = bigger;
				cap *= 2;
			}
			ev[n++] = (struct dump_event){dump_proc(procs, d, json_integer_value(json_object_get(rec, "rank"))),
			                              json_integer_value(json_object_get(rec, "submit_ms")), comm, seq};
		}
	}
	if (!rc) {
		qsort(ev, n, sizeof(*ev), cmp_dump_event);
		json_t *ranks = json_array();
		for (size_t p = 0; p < json_object_size(procs); p++)
			json_array_append_new(ranks, json_array());
		for (size_t e = 0; e < n; e++)
			json_array_append_new(json_array_get(ranks, (size_t)ev[e].proc),
			                      json_pack("{s:I,s:I}", "comm", (json_int_t)ev[e].comm, "seq", (json_int_t)ev[e].seq));
		*out = json_pack("{s:o}", "ranks", ranks);
	}
	free(ev);
	json_decref(procs);
	json_decref(dumps);
	return rc;
}

int sim_layout_trace_json(const char *text, struct sim_layout **out, char *err, size_t errlen)
{
	json_error_t je;
	json_t *root = json_loads(text, 0, &je);
	if (!root)
		return fail(err, errlen, -EINVAL, "not JSON: %s (line %d)", je.text, je.line);
	if (is_dump(root) || is_dump(json_array_get(root, 0))) {
		json_t *orders = NULL;
		int rc = dumps_to_trace(root, &orders, err, errlen);
		json_decref(root);
		if (rc)
			return failed(rc, err, errlen);
		root = orders;
	}
	json_t *ranks = trace_ranks(root);
	struct trace t = {.index = json_object(), .groups = json_object()};
	struct sim_builder *b = sim_builder_new();
	struct sim_layout *l = calloc(1, sizeof(*l));
	int rc = b && l ? 0 : -ENOMEM;
	if (!rc && (!json_is_array(ranks) || json_array_size(ranks) == 0 || json_array_size(ranks) > 1 << 20))
		rc = fail(err, errlen, -EINVAL, "expected {\"ranks\": [[...], ...]} or a list of per-rank lists");
	if (!rc)
		rc = trace_collect(&t, ranks, err, errlen);
	if (!rc)
		rc = trace_groups(&t, b, err, errlen);
	if (!rc)
		rc = trace_orders(&t, b, ranks, err, errlen);
	if (!rc)
		rc = layout_groups(l, b, err, errlen);
	if (!rc) {
		l->order_kind = SIM_ORDER_TRACE;
		rc = layout_trace_orders(l, b);
	}
	if (!rc)
		rc = layout_common(l);
	if (!rc) {
		l->coll_names = b->coll_names;
		l->group_names = b->group_names;
		b->coll_names = b->group_names = NULL;
		snprintf(l->desc, sizeof(l->desc), "trace of %d ranks, %d groups", l->ngpus, l->ngroups);
	}
	for (int64_t i = 0; i < t.ncolls; i++) {
		free(t.colls[i].key);
		json_decref(t.colls[i].ranks);
	}
	free(t.colls);
	json_decref(t.index);
	json_decref(t.groups);
	json_decref(root);
	sim_builder_free(b);
	if (rc) {
		sim_layout_free(l);
		return failed(rc, err, errlen);
	}
	*out = l;
	return 0;
}

void sim_coll_name(const struct sim_layout *l, int32_t c, char *buf, size_t len)
{
	if (l->coll_names) {
		snprintf(buf, len, "%s", l->coll_names[c]);
		return;
	}
	int g = l->coll_group[c];
	snprintf(buf, len, "g%d#%d", g, (int)(c - l->grp_first[g]));
}
