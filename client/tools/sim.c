/*
 * Rounds of the deadlock-risk model (see sim.h for the model): the fast
 * engine, the literal reference engine, and the threaded runner.
 *
 * Randomness. Every round draws from streams seeded by (seed, round, GPU,
 * purpose), so a round's outcome does not depend on which thread runs it
 * or on how many threads there are. The fast engine gives each GPU one
 * stream for its skips and one for its synchronizations, which lets it
 * look ahead at a GPU's whole sequence before deciding whether to step
 * the component at all, and then replay the same draws while stepping.
 *
 * The fast engine's remaining list. A GPU's remaining collectives are its
 * expected order from position ptr on, less the positions in A (taken
 * ahead of their turn by a skip; sorted, all beyond ptr). An in-order pick
 * takes ptr and moves past any A entries that follow; a skip of depth d
 * takes the d-th remaining entry and adds it to A. A is almost always
 * empty or one entry long, so picks cost O(1).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim.h"
#include "tool.h"

/* ---------------------------------------------------------------- random */

struct rng {
	uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* [0, 1) */
static inline double rng_uniform(struct rng *r)
{
	return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

#define SIM_INF (INT64_MAX / 4)

/* Failures before the first success of probability q, given lq = log1p(-q). */
static inline int64_t rng_geometric(struct rng *r, double lq)
{
	if (lq == 0)
		return SIM_INF;
	if (isinf(lq))
		return 0;
	double u = (double)((rng_next(r) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
	double g = floor(log(u) / lq);
	return g >= 1e15 ? SIM_INF : (int64_t)g;
}

enum { STREAM_SKIP = 1, STREAM_SYNC = 2, STREAM_LITERAL = 3 };

static void rng_seed(struct rng *r, const struct sim_params *p, uint64_t round, uint64_t gpu, uint64_t purpose)
{
	r->s = tool_hash(p->seed, round, gpu, purpose);
}

/* ---------------------------------------------------------------- work */

/* A GPU in a round: active -> suspended (it synchronized with collectives
 * not done) -> active (the last of them completed), active -> finished (it
 * invoked its last collective). */
enum gpu_run { RUN_ACTIVE, RUN_SUSPENDED, RUN_FINISHED };

struct gpu_state {
	int32_t ptr, nA; /* remaining list: expected order from ptr on, less A */
	int32_t n, picks;
	int32_t held;    /* single queue: picked position not yet invoked, or -1 */
	int32_t undone;  /* synchronization: invoked collectives not yet done */
	int32_t lw;      /* positions below lw are invoked and done */
	int32_t rec;     /* next recorded synchronization */
	int32_t susp_at; /* index in the suspended list */
	uint8_t run;
	int64_t next_skip; /* pick index of the next skip (first candidate skipped) */
	int64_t sync_at;   /* pick count before which the next random sync comes */
	int64_t sync_next; /* the earlier of sync_at and the next recorded one */
	const int32_t *order; /* the GPU's expected order */
	int32_t *A;           /* its taken-ahead positions */
	struct rng skip, sync;
};

struct sim_work {
	const struct sim_layout *l;
	struct gpu_state *st;
	int32_t *A;    /* per GPU at gpu_off[h] */
	int32_t *cnt;  /* per collective: invocations still missing */
	int32_t *cur;  /* single queue: per group, its current collective or -1 */
	int32_t *ninv; /* single queue: GPUs that invoked it */
	uint8_t *flag; /* single queue: per group member, invoked the current one */
	int32_t *susp; /* suspended GPUs of the component */
	int nsusp;
	uint32_t epoch, *mark; /* DFS */
	int32_t *parent, *via, *stack;
	int32_t *scratch, *scratch2; /* undone collectives of a GPU */
	/* Literal engine. */
	int32_t *lrem;  /* remaining lists, per GPU at gpu_off[h] */
	uint8_t *linv;  /* invoked, per GPU and expected position */
	int32_t *lpend; /* single queue: GPUs in the group's current collective */
	double lq_skip, lq_sync;
};

void sim_work_free(struct sim_work *w)
{
	if (!w)
		return;
	free(w->st);
	free(w->A);
	free(w->cnt);
	free(w->cur);
	free(w->ninv);
	free(w->flag);
	free(w->susp);
	free(w->mark);
	free(w->parent);
	free(w->via);
	free(w->stack);
	free(w->scratch);
	free(w->scratch2);
	free(w->lrem);
	free(w->linv);
	free(w->lpend);
	free(w);
}

struct sim_work *sim_work_new(const struct sim_layout *l)
{
	struct sim_work *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	size_t ng = (size_t)l->ngpus, inv = (size_t)(l->invocations ? l->invocations : 1);
	size_t nc = (size_t)(l->ncolls ? l->ncolls : 1), ngr = (size_t)l->ngroups;
	size_t nm = (size_t)l->grp_moff[l->ngroups] + 1;
	int32_t longest = 1;
	for (int h = 0; h < l->ngpus; h++)
		if (sim_gpu_ncolls(l, h) > longest)
			longest = sim_gpu_ncolls(l, h);
	w->l = l;
	w->st = calloc(ng, sizeof(*w->st));
	w->A = malloc(inv * sizeof(int32_t));
	w->cnt = malloc(nc * sizeof(int32_t));
	w->cur = malloc(ngr * sizeof(int32_t));
	w->ninv = malloc(ngr * sizeof(int32_t));
	w->flag = calloc(nm, 1);
	w->susp = malloc(ng * sizeof(int32_t));
	w->mark = calloc(ng, sizeof(uint32_t));
	w->parent = malloc(ng * sizeof(int32_t));
	w->via = malloc(ng * sizeof(int32_t));
	w->stack = malloc(ng * sizeof(int32_t));
	w->scratch = malloc((size_t)longest * sizeof(int32_t));
	w->scratch2 = malloc((size_t)longest * sizeof(int32_t));
	w->lrem = malloc(inv * sizeof(int32_t));
	w->linv = malloc(inv);
	w->lpend = malloc(nm * sizeof(int32_t));
	if (!w->st || !w->A || !w->cnt || !w->cur || !w->ninv || !w->flag || !w->susp || !w->mark || !w->parent ||
	    !w->via || !w->stack || !w->scratch || !w->scratch2 || !w->lrem || !w->linv || !w->lpend) {
		sim_work_free(w);
		return NULL;
	}
	return w;
}

/* ---------------------------------------------------------------- picks (fast engine) */

/* Moves ptr past the entries of A that follow it. */
static inline void absorb(struct gpu_state *s, int32_t *A)
{
	while (s->nA && A[0] == s->ptr) {
		memmove(A, A + 1, (size_t)--s->nA * sizeof(*A));
		s->ptr++;
	}
}

static inline int32_t take_head(struct gpu_state *s, int32_t *A)
{
	int32_t pos = s->ptr++;
	absorb(s, A);
	return pos;
}

/* Takes the d-th (d >= 1) remaining entry. */
static int32_t take_at(struct gpu_state *s, int32_t *A, int32_t d)
{
	int32_t pos = s->ptr, ai = 0;
	for (;;) {
		if (ai < s->nA && A[ai] == pos) {
			ai++;
			pos++;
			continue;
		}
		if (d == 0)
			break;
		d--;
		pos++;
	}
	memmove(A + ai + 1, A + ai, (size_t)(s->nA - ai) * sizeof(*A));
	A[ai] = pos;
	s->nA++;
	return pos;
}

/* Depth of a skip: the first candidate is skipped; each further one is
 * skipped with the disorder probability, the last never. */
static int32_t skip_depth(struct gpu_state *s, double p)
{
	int32_t r = s->n - s->picks, d = 1;
	while (d < r - 1 && rng_uniform(&s->skip) < p)
		d++;
	return d;
}

static int32_t pick_slow(struct gpu_state *s, double lq, double p)
{
	int32_t pos;
	if (s->picks == s->next_skip && s->n - s->picks >= 2) {
		pos = take_at(s, s->A, skip_depth(s, p));
		s->next_skip = s->picks + 1 + rng_geometric(&s->skip, lq);
	} else {
		pos = take_head(s, s->A);
	}
	s->picks++;
	return pos;
}

/* The next pick's position in the expected order. */
static inline int32_t pick(struct sim_work *w, struct gpu_state *s, double p)
{
	if (__builtin_expect(s->picks != s->next_skip && s->nA == 0, 1)) {
		s->picks++;
		return s->ptr++;
	}
	return pick_slow(s, w->lq_skip, p);
}

/* k in-order picks at once (no skip among them). */
static void advance(struct gpu_state *s, int64_t k)
{
	int32_t *A = s->A;
	s->picks += (int32_t)k;
	while (k > 0) {
		int64_t room = s->nA ? A[0] - s->ptr : k;
		int64_t t = room < k ? room : k;
		s->ptr += (int32_t)t;
		k -= t;
		absorb(s, A);
	}
}

static inline int32_t recorded_sync(const struct sim_layout *l, int h, int32_t rec)
{
	int64_t at = l->sync_off[h] + rec;
	return at < l->sync_off[h + 1] ? l->sync_at[at] : INT32_MAX;
}

static inline void next_sync(const struct sim_layout *l, int h, struct gpu_state *s)
{
	int64_t rec = recorded_sync(l, h, s->rec);
	s->sync_next = rec < s->sync_at ? rec : s->sync_at;
}

static void gpu_start(struct sim_work *w, const struct sim_params *p, uint64_t round, int h)
{
	struct gpu_state *s = &w->st[h];
	const struct sim_layout *l = w->l;
	memset(s, 0, sizeof(*s));
	s->n = sim_gpu_ncolls(l, h);
	s->held = -1;
	s->rec = (int32_t)0;
	rng_seed(&s->skip, p, round, (uint64_t)h, STREAM_SKIP);
	rng_seed(&s->sync, p, round, (uint64_t)h, STREAM_SYNC);
	/* Skips happen only at picks with two or more candidates left. */
	int64_t first = rng_geometric(&s->skip, w->lq_skip);
	s->next_skip = first < s->n - 1 ? first : SIM_INF;
	s->sync_at = p->model == SIM_SYNC ? rng_geometric(&s->sync, w->lq_sync) : SIM_INF;
	s->order = l->order + l->gpu_off[h];
	s->A = w->A + l->gpu_off[h];
	next_sync(l, h, s);
	s->run = s->n ? RUN_ACTIVE : RUN_FINISHED;
}

/*
 * Whether GPU h ever synchronizes while a collective it skipped is still
 * pending (A not empty): only then can its synchronizations separate two
 * collectives against the order every GPU agrees on.
 */
static bool sync_in_hole(struct sim_work *w, const struct sim_params *p, uint64_t round, int h)
{
	const struct sim_layout *l = w->l;
	struct gpu_state *s = &w->st[h];
	gpu_start(w, p, round, h);
	for (;;) {
		int64_t at = s->sync_next;
		if (at < s->n && at <= s->next_skip) {
			advance(s, at - s->picks);
			if (s->nA)
				return true;
			if (recorded_sync(l, h, s->rec) == at)
				s->rec++;
			else
				s->sync_at = at + rng_geometric(&s->sync, w->lq_sync);
			next_sync(l, h, s);
			continue;
		}
		if (s->next_skip >= s->n - 1)
			return false;
		advance(s, s->next_skip - s->picks);
		pick(w, s, p->disorder);
	}
}

/* ---------------------------------------------------------------- queries */

/* Whether member mi (GPU m) of collective c's group has invoked c. */
static bool has_invoked(struct sim_work *w, int m, int32_t c, int mi)
{
	int32_t e = sim_eidx(w->l, c, mi);
	const struct gpu_state *s = &w->st[m];
	if (e == SIM_NEVER)
		return false;
	if (e < s->ptr)
		return true;
	const int32_t *A = s->A;
	for (int32_t i = 0; i < s->nA && A[i] <= e; i++)
		if (A[i] == e)
			return true;
	return false;
}

/* GPU h's invoked collectives that are not done, into buf; their count. */
static int32_t undone_of(struct sim_work *w, int h, int32_t *buf)
{
	struct gpu_state *s = &w->st[h];
	const int32_t *order = s->order;
	const int32_t *A = s->A;
	int32_t n = 0;
	while (s->lw < s->ptr && w->cnt[order[s->lw]] == 0)
		s->lw++;
	for (int32_t i = s->lw; i < s->ptr; i++)
		if (w->cnt[order[i]] > 0)
			buf[n++] = order[i];
	for (int32_t i = 0; i < s->nA; i++)
		if (w->cnt[order[A[i]]] > 0)
			buf[n++] = order[A[i]];
	return n;
}

static int member_of(const struct sim_layout *l, int g, int h)
{
	const int32_t *m = l->grp_members + l->grp_moff[g];
	int lo = 0, hi = sim_group_size(l, g) - 1;
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		if (m[mid] == h)
			return mid;
		if (m[mid] < h)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

static void report_gpu(struct sim_report *rep, int h, int32_t waits)
{
	if (rep->n < SIM_REPORT_GPUS) {
		rep->gpus[rep->n] = h;
		rep->waits[rep->n] = waits;
	}
	rep->n++;
}

/* ---------------------------------------------------------------- synchronization model (fast) */

/*
 * A cycle through the newly suspended GPU h: a search along "waits for"
 * among suspended GPUs. On success the report lists the cycle from h.
 */
static bool cycle_through(struct sim_work *w, int h, struct sim_report *rep)
{
	const struct sim_layout *l = w->l;
	uint32_t epoch = ++w->epoch;
	int sp = 0;
	w->stack[sp++] = h;
	w->mark[h] = epoch;
	w->parent[h] = -1;
	while (sp) {
		int u = w->stack[--sp];
		int32_t n = undone_of(w, u, w->scratch);
		for (int32_t i = 0; i < n; i++) {
			int32_t c = w->scratch[i];
			int g = l->coll_group[c];
			const int32_t *mem = l->grp_members + l->grp_moff[g];
			for (int mi = 0; mi < sim_group_size(l, g); mi++) {
				int m = mem[mi];
				if (m == u || w->st[m].run != RUN_SUSPENDED || has_invoked(w, m, c, mi))
					continue;
				if (m == h) {
					if (rep) {
						/* The path h -> ... -> u, then u -> h through c. */
						int path[SIM_REPORT_GPUS], np = 0;
						for (int x = u; x != -1 && np < SIM_REPORT_GPUS; x = w->parent[x])
							path[np++] = x;
						rep->verdict = SIM_CYCLE;
						rep->n = 0;
						for (int k = np - 1; k >= 0; k--)
							report_gpu(rep, path[k], k ? w->via[path[k - 1]] : c);
					}
					return true;
				}
				if (w->mark[m] != epoch) {
					w->mark[m] = epoch;
					w->parent[m] = u;
					w->via[m] = c;
					w->stack[sp++] = m;
				}
			}
		}
	}
	return false;
}

/* The published shortcut: h waits for a suspended GPU, and one waits for h. */
static bool shortcut(struct sim_work *w, int h, struct sim_report *rep)
{
	const struct sim_layout *l = w->l;
	if (w->nsusp < 2)
		return false;
	int out = -1, in = -1;
	int32_t n = undone_of(w, h, w->scratch);
	for (int32_t i = 0; i < n && out < 0; i++) {
		int32_t c = w->scratch[i];
		int g = l->coll_group[c];
		const int32_t *mem = l->grp_members + l->grp_moff[g];
		for (int mi = 0; mi < sim_group_size(l, g) && out < 0; mi++)
			if (mem[mi] != h && w->st[mem[mi]].run == RUN_SUSPENDED && !has_invoked(w, mem[mi], c, mi))
				out = i;
	}
	if (out < 0)
		return false;
	int32_t out_c = w->scratch[out], in_c = -1;
	for (int k = 0; k < w->nsusp && in < 0; k++) {
		int u = w->susp[k];
		if (u == h)
			continue;
		int32_t nu = undone_of(w, u, w->scratch2);
		for (int32_t i = 0; i < nu; i++) {
			int32_t c = w->scratch2[i];
			int mi = member_of(l, l->coll_group[c], h);
			if (mi >= 0 && !has_invoked(w, h, c, mi)) {
				in = u;
				in_c = c;
				break;
			}
		}
	}
	if (in < 0)
		return false;
	if (rep) {
		rep->verdict = SIM_CHAIN;
		rep->n = 0;
		report_gpu(rep, in, in_c);
		report_gpu(rep, h, out_c);
	}
	return true;
}

static void release(struct sim_work *w, int h)
{
	struct gpu_state *s = &w->st[h];
	int last = w->susp[--w->nsusp];
	w->susp[s->susp_at] = last;
	w->st[last].susp_at = s->susp_at;
	s->run = RUN_ACTIVE;
}

static inline void complete(struct sim_work *w, int32_t c)
{
	const struct sim_layout *l = w->l;
	int g = l->coll_group[c];
	for (int32_t i = l->grp_moff[g]; i < l->grp_moff[g + 1]; i++) {
		struct gpu_state *m = &w->st[l->grp_members[i]];
		if (--m->undone == 0 && m->run == RUN_SUSPENDED)
			release(w, l->grp_members[i]);
	}
}

static void reset_counts(struct sim_work *w, int k)
{
	const struct sim_layout *l = w->l;
	for (int32_t i = l->comp_grpoff[k]; i < l->comp_grpoff[k + 1]; i++) {
		int g = l->comp_grps[i];
		int size = sim_group_size(l, g);
		for (int32_t c = l->grp_first[g]; c < l->grp_first[g + 1]; c++)
			w->cnt[c] = size;
		w->cur[g] = -1;
		w->ninv[g] = 0;
	}
}

/* A synchronization step of GPU h; true when it deadlocks. */
static bool sync_step(struct sim_work *w, const struct sim_params *p, int h, struct sim_report *rep)
{
	struct gpu_state *s = &w->st[h];
	if (s->undone == 0)
		return false;
	s->run = RUN_SUSPENDED;
	s->susp_at = w->nsusp;
	w->susp[w->nsusp++] = h;
	return p->decision == SIM_EXACT ? cycle_through(w, h, rep) : shortcut(w, h, rep);
}

/* Every unfinished GPU is suspended (or waits) and no decision named it:
 * report what each waits for. */
static void report_stall(struct sim_work *w, int k, struct sim_report *rep)
{
	const struct sim_layout *l = w->l;
	rep->verdict = SIM_STALL;
	rep->n = 0;
	for (int32_t i = l->comp_goff[k]; i < l->comp_goff[k + 1]; i++) {
		int h = l->comp_gpus[i];
		struct gpu_state *s = &w->st[h];
		if (s->run == RUN_FINISHED)
			continue;
		int32_t wait = -1;
		if (s->held >= 0) {
			int32_t c = l->order[l->gpu_off[h] + s->held];
			wait = w->cur[l->coll_group[c]];
		} else if (undone_of(w, h, w->scratch) > 0) {
			wait = w->scratch[0];
		}
		report_gpu(rep, h, wait);
	}
}

static bool incomplete(struct sim_work *w, int k, struct sim_report *rep);

/* The end of a component's round that found every GPU left waiting. */
static bool stalled(struct sim_work *w, int k, int64_t sweep, struct sim_report *rep)
{
	if (rep) {
		report_stall(w, k, rep);
		rep->sweep = sweep;
		rep->gpu = -1;
	}
	return true;
}

/* The end of a component's round in which every GPU invoked everything. */
static bool finished(struct sim_work *w, int k, struct sim_report *rep)
{
	if (w->l->coll_names)
		incomplete(w, k, rep);
	return false;
}

static bool incomplete(struct sim_work *w, int k, struct sim_report *rep)
{
	const struct sim_layout *l = w->l;
	for (int32_t i = l->comp_grpoff[k]; i < l->comp_grpoff[k + 1]; i++) {
		int g = l->comp_grps[i];
		for (int32_t c = l->grp_first[g]; c < l->grp_first[g + 1]; c++)
			if (w->cnt[c] > 0 && w->cnt[c] < sim_group_size(l, g)) {
				if (rep) {
					rep->verdict = SIM_INCOMPLETE;
					rep->n = 0;
					report_gpu(rep, -1, c);
				}
				return true;
			}
	}
	return false;
}

/* One pick and invocation of GPU h (synchronization model). */
static inline void invoke_next(struct sim_work *w, struct gpu_state *s, double p, int *unfinished)
{
	int32_t c = s->order[pick(w, s, p)];
	s->undone++;
	if (--w->cnt[c] == 0)
		complete(w, c);
	if (s->picks == s->n) {
		s->run = RUN_FINISHED;
		(*unfinished)--;
	}
}

/*
 * With no GPU suspended, every active GPU invokes one collective per sweep
 * until the first synchronization comes due, and nothing looks at the state
 * in between: those sweeps are done GPU by GPU. Returns how many.
 */
static int64_t quiet_sweeps(struct sim_work *w, const int32_t *gpus, int ng, double p, int *unfinished)
{
	int64_t t = SIM_INF;
	for (int i = 0; i < ng; i++) {
		struct gpu_state *s = &w->st[gpus[i]];
		if (s->run == RUN_ACTIVE && s->sync_next - s->picks < t)
			t = s->sync_next - s->picks;
	}
	if (t <= 0 || t == SIM_INF)
		return 0;
	for (int i = 0; i < ng; i++) {
		struct gpu_state *s = &w->st[gpus[i]];
		for (int64_t k = 0; k < t && s->run == RUN_ACTIVE; k++)
			invoke_next(w, s, p, unfinished);
	}
	return t;
}

static bool step_sync_model(struct sim_work *w, const struct sim_params *p, int k, struct sim_report *rep)
{
	const struct sim_layout *l = w->l;
	const int32_t *gpus = l->comp_gpus + l->comp_goff[k];
	int ng = l->comp_goff[k + 1] - l->comp_goff[k], unfinished = 0;
	reset_counts(w, k);
	w->nsusp = 0;
	for (int i = 0; i < ng; i++)
		unfinished += w->st[gpus[i]].run != RUN_FINISHED;
	for (int64_t sweep = 0; unfinished; sweep++) {
		if (!w->nsusp) {
			sweep += quiet_sweeps(w, gpus, ng, p->disorder, &unfinished);
			if (!unfinished)
				break;
		}
		bool stepped = false;
		for (int i = 0; i < ng; i++) {
			int h = gpus[i];
			struct gpu_state *s = &w->st[h];
			if (s->run != RUN_ACTIVE)
				continue;
			stepped = true;
			if (s->sync_next != s->picks) {
				invoke_next(w, s, p->disorder, &unfinished);
				continue;
			}
			/* A recorded synchronization first, then a random one. */
			if (recorded_sync(l, h, s->rec) == s->picks)
				s->rec++;
			else
				s->sync_at = s->picks + rng_geometric(&s->sync, w->lq_sync);
			next_sync(l, h, s);
			if (sync_step(w, p, h, rep)) {
				if (rep) {
					rep->sweep = sweep;
					rep->gpu = h;
				}
				return true;
			}
		}
		if (!stepped)
			return stalled(w, k, sweep, rep);
	}
	return finished(w, k, rep);
}

/* ---------------------------------------------------------------- single-queue model (fast) */

static void group_clear(struct sim_work *w, int g)
{
	const struct sim_layout *l = w->l;
	memset(w->flag + l->grp_moff[g], 0, (size_t)sim_group_size(l, g));
	w->cur[g] = -1;
	w->ninv[g] = 0;
}

static bool step_single_queue(struct sim_work *w, const struct sim_params *p, int k, struct sim_report *rep)
{
	const struct sim_layout *l = w->l;
	const int32_t *gpus = l->comp_gpus + l->comp_goff[k];
	int ng = l->comp_goff[k + 1] - l->comp_goff[k], unfinished = 0;
	reset_counts(w, k);
	for (int32_t i = l->comp_grpoff[k]; i < l->comp_grpoff[k + 1]; i++)
		group_clear(w, l->comp_grps[i]);
	for (int i = 0; i < ng; i++)
		unfinished += w->st[gpus[i]].run != RUN_FINISHED;
	for (int64_t sweep = 0; unfinished; sweep++) {
		bool progress = false;
		for (int i = 0; i < ng; i++) {
			int h = gpus[i];
			struct gpu_state *s = &w->st[h];
			if (s->run == RUN_FINISHED)
				continue;
			if (s->held < 0)
				s->held = pick(w, s, p->disorder);
			int64_t at = l->gpu_off[h] + s->held;
			int32_t c = l->order[at];
			int g = l->coll_group[c];
			uint8_t *flag = w->flag + l->grp_moff[g] + l->order_mi[at];
			if (w->cur[g] < 0) {
				w->cur[g] = c;
			} else if (w->cur[g] != c) {
				if (*flag)
					continue; /* waits for the group's current collective */
				if (rep) {
					rep->verdict = SIM_MISMATCH;
					rep->sweep = sweep;
					rep->gpu = h;
					rep->group = g;
					rep->coll[0] = w->cur[g];
					rep->coll[1] = c;
				}
				return true;
			}
			*flag = 1;
			w->cnt[c]--;
			if (++w->ninv[g] == sim_group_size(l, g))
				group_clear(w, g);
			s->held = -1;
			progress = true;
			if (s->picks == s->n) {
				s->run = RUN_FINISHED;
				unfinished--;
			}
		}
		if (!progress && unfinished)
			return stalled(w, k, sweep, rep);
	}
	return finished(w, k, rep);
}

/* ---------------------------------------------------------------- the fast engine */

static bool fast_component(struct sim_work *w, const struct sim_params *p, uint64_t round, int k,
                           struct sim_report *rep)
{
	const struct sim_layout *l = w->l;
	const int32_t *gpus = l->comp_gpus + l->comp_goff[k];
	int ng = l->comp_goff[k + 1] - l->comp_goff[k];
	/* Components whose orders agree and that nothing disturbs cannot
	 * deadlock; the shortcut's verdict depends on timing, so it always
	 * steps, and so does a trace, whose replay reports where it ends. */
	bool need = !l->consistent || l->order_kind == SIM_ORDER_TRACE ||
	            (p->model == SIM_SYNC && p->decision == SIM_SHORTCUT);
	if (p->model == SIM_SINGLE_QUEUE) {
		for (int i = 0; i < ng; i++) {
			gpu_start(w, p, round, gpus[i]);
			need |= w->st[gpus[i]].next_skip != SIM_INF;
		}
	} else {
		for (int i = 0; i < ng && !need; i++)
			need = sync_in_hole(w, p, round, gpus[i]);
		for (int i = 0; need && i < ng; i++)
			gpu_start(w, p, round, gpus[i]);
	}
	if (!need)
		return false;
	return p->model == SIM_SYNC ? step_sync_model(w, p, k, rep) : step_single_queue(w, p, k, rep);
}

/* ---------------------------------------------------------------- the literal engine */

/*
 * The reference: every GPU's remaining list is an array, every candidate and
 * every step draws a random number, all GPUs step in one round-robin, and
 * deadlocks are decided from explicit sets, as the published simulator
 * does. Slow (a pick costs O(list length)), simple, and independent of the
 * fast engine's shortcuts.
 */
static int32_t literal_pick(struct sim_work *w, const struct sim_params *p, struct rng *rng, int h)
{
	struct gpu_state *s = &w->st[h];
	int32_t *rem = w->lrem + w->l->gpu_off[h];
	int32_t r = s->n - s->picks, i = 0;
	while (i < r - 1 && rng_uniform(rng) < p->disorder)
		i++;
	int32_t pos = rem[i];
	memmove(rem + i, rem + i + 1, (size_t)(r - i - 1) * sizeof(*rem));
	s->picks++;
	w->linv[w->l->gpu_off[h] + pos] = 1;
	return pos;
}

static bool literal_invoked(struct sim_work *w, int m, int32_t c)
{
	const struct sim_layout *l = w->l;
	int mi = member_of(l, l->coll_group[c], m);
	if (mi < 0)
		return true; /* not a member: nothing to wait for */
	int32_t e = sim_eidx(l, c, mi);
	return e != SIM_NEVER && w->linv[l->gpu_off[m] + e];
}

/* Invoked by h and not done: scans h's whole list. */
static int32_t literal_undone(struct sim_work *w, int h, int32_t *buf)
{
	const struct sim_layout *l = w->l;
	int32_t n = 0;
	for (int64_t e = l->gpu_off[h]; e < l->gpu_off[h + 1]; e++)
		if (w->linv[e] && w->cnt[l->order[e]] > 0)
			buf[n++] = l->order[e];
	return n;
}

/* Whether u waits for v: u invoked an unfinished collective v has not. */
static bool literal_waits(struct sim_work *w, int u, int v)
{
	int32_t n = literal_undone(w, u, w->scratch);
	for (int32_t i = 0; i < n; i++)
		if (member_of(w->l, w->l->coll_group[w->scratch[i]], v) >= 0 && !literal_invoked(w, v, w->scratch[i]))
			return true;
	return false;
}

/* Any cycle among the suspended GPUs (colour DFS over the whole graph). */
static bool literal_cycle(struct sim_work *w, int ngpus, const uint8_t *susp)
{
	size_t n = ngpus > 0 ? (size_t)ngpus : 1;
	uint8_t *colour = calloc(n, 1);
	int32_t *next = calloc(n, sizeof(*next));
	bool found = false;
	if (!colour || !next) {
		free(colour);
		free(next);
		return true; /* cannot decide: call it a deadlock rather than miss one */
	}
	for (int root = 0; root < ngpus && !found; root++) {
		if (!susp[root] || colour[root])
			continue;
		int sp = 0;
		w->stack[sp++] = root;
		colour[root] = 1;
		while (sp && !found) {
			int u = w->stack[sp - 1];
			int v = next[u]++;
			if (v >= ngpus) {
				colour[u] = 2;
				sp--;
				continue;
			}
			if (v == u || !susp[v] || !literal_waits(w, u, v))
				continue;
			if (colour[v] == 1)
				found = true;
			else if (!colour[v]) {
				colour[v] = 1;
				w->stack[sp++] = v;
			}
		}
	}
	free(colour);
	free(next);
	return found;
}

static bool literal_shortcut(struct sim_work *w, int ngpus, const uint8_t *susp, int h)
{
	int nsusp = 0;
	for (int u = 0; u < ngpus; u++)
		nsusp += susp[u];
	if (nsusp < 2)
		return false;
	bool out = false, in = false;
	for (int u = 0; u < ngpus; u++) {
		if (u == h || !susp[u])
			continue;
		out = out || literal_waits(w, h, u);
		in = in || literal_waits(w, u, h);
	}
	return out && in;
}

static bool literal_round(struct sim_work *w, const struct sim_params *p, uint64_t round)
{
	const struct sim_layout *l = w->l;
	struct rng rng;
	rng_seed(&rng, p, round, 0, STREAM_LITERAL);
	uint8_t *susp = calloc((size_t)l->ngpus, 1);
	int unfinished = 0;
	memset(w->linv, 0, (size_t)l->invocations);
	for (int h = 0; h < l->ngpus; h++) {
		struct gpu_state *s = &w->st[h];
		memset(s, 0, sizeof(*s));
		s->n = sim_gpu_ncolls(l, h);
		s->held = -1;
		for (int32_t i = 0; i < s->n; i++)
			w->lrem[l->gpu_off[h] + i] = i;
		unfinished += s->n > 0;
	}
	for (int g = 0; g < l->ngroups; g++) {
		for (int32_t c = l->grp_first[g]; c < l->grp_first[g + 1]; c++)
			w->cnt[c] = sim_group_size(l, g);
		w->cur[g] = -1;
		w->ninv[g] = 0;
	}
	bool dead = false;
	while (unfinished && !dead) {
		bool any = false;
		for (int h = 0; h < l->ngpus && !dead; h++) {
			struct gpu_state *s = &w->st[h];
			if (s->picks == s->n && s->held < 0)
				continue;
			if (p->model == SIM_SYNC) {
				if (susp[h]) {
					if (literal_undone(w, h, w->scratch2))
						continue;
					susp[h] = 0;
				}
				any = true;
				bool sync = recorded_sync(l, h, s->rec) == s->picks;
				if (sync)
					s->rec++;
				else
					sync = rng_uniform(&rng) < p->sync;
				if (sync) {
					if (literal_undone(w, h, w->scratch2)) {
						susp[h] = 1;
						/* Suspended is what the sets say now: a GPU
						 * whose collectives all completed since its
						 * last turn no longer counts. */
						for (int u = 0; u < l->ngpus; u++)
							susp[u] = susp[u] && literal_undone(w, u, w->scratch2);
						dead = p->decision == SIM_EXACT ? literal_cycle(w, l->ngpus, susp)
						                                : literal_shortcut(w, l->ngpus, susp, h);
					}
					continue;
				}
				int32_t c = l->order[l->gpu_off[h] + literal_pick(w, p, &rng, h)];
				w->cnt[c]--;
			} else {
				if (s->held < 0)
					s->held = literal_pick(w, p, &rng, h);
				int32_t c = l->order[l->gpu_off[h] + s->held];
				int g = l->coll_group[c];
				int32_t *pend = w->lpend + l->grp_moff[g];
				bool mine = false;
				for (int i = 0; i < w->ninv[g]; i++)
					mine = mine || pend[i] == h;
				if (w->ninv[g] && w->cur[g] != c) {
					if (mine)
						continue;
					dead = true;
					break;
				}
				w->cur[g] = c;
				pend[w->ninv[g]++] = h;
				if (w->ninv[g] == sim_group_size(l, g))
					w->ninv[g] = 0;
				w->cnt[c]--;
				s->held = -1;
				any = true;
			}
			if (s->picks == s->n && s->held < 0)
				unfinished--;
		}
		if (!any && !dead)
			dead = true; /* everyone left waits */
	}
	free(susp);
	return dead;
}

/* ---------------------------------------------------------------- rounds and runs */

bool sim_round(const struct sim_layout *l, const struct sim_params *p, uint64_t round, struct sim_work *w,
               struct sim_report *rep)
{
	w->lq_skip = log1p(-p->disorder);
	w->lq_sync = p->model == SIM_SYNC ? log1p(-p->sync) : 0;
	if (rep) {
		int32_t *keep = rep->invoked;
		memset(rep, 0, sizeof(*rep));
		rep->invoked = keep;
		rep->gpu = -1;
		rep->group = -1;
	}
	bool dead = false;
	if (p->engine == SIM_LITERAL) {
		dead = literal_round(w, p, round);
		if (rep && dead)
			rep->verdict = SIM_STALL; /* the literal engine reports no detail */
	} else if (!rep) {
		for (int k = 0; k < l->ncomps && !dead; k++)
			dead = fast_component(w, p, round, k, NULL);
	} else {
		/* A report runs every component, so that it says how far each
		 * GPU got; it keeps the first deadlock (or incomplete end). */
		for (int k = 0; k < l->ncomps; k++) {
			struct sim_report r = {.verdict = SIM_DONE};
			bool d = fast_component(w, p, round, k, &r);
			if ((d && !dead) || (rep->verdict == SIM_DONE && r.verdict != SIM_DONE && !dead)) {
				int32_t *keep = rep->invoked;
				*rep = r;
				rep->invoked = keep;
			}
			dead |= d;
		}
	}
	if (rep && rep->invoked)
		for (int h = 0; h < l->ngpus; h++)
			rep->invoked[h] = w->st[h].picks - (w->st[h].held >= 0);
	return dead;
}

struct run {
	const struct sim_layout *l;
	const struct sim_params *p;
	uint64_t rounds;
	_Atomic uint64_t next, done, deadlocks;
	_Atomic int failed;
};

#define RUN_CHUNK 16

static void *run_thread(void *arg)
{
	struct run *r = arg;
	struct sim_work *w = sim_work_new(r->l);
	if (!w) {
		atomic_store(&r->failed, 1);
		return NULL;
	}
	for (;;) {
		uint64_t first = atomic_fetch_add(&r->next, RUN_CHUNK);
		if (first >= r->rounds || atomic_load(&r->failed))
			break;
		uint64_t last = first + RUN_CHUNK < r->rounds ? first + RUN_CHUNK : r->rounds, dead = 0;
		for (uint64_t i = first; i < last; i++)
			dead += sim_round(r->l, r->p, i, w, NULL);
		atomic_fetch_add(&r->deadlocks, dead);
		atomic_fetch_add(&r->done, last - first);
	}
	sim_work_free(w);
	return NULL;
}

int sim_run(const struct sim_layout *l, const struct sim_params *p, uint64_t rounds, int threads,
            sim_progress_fn *progress, void *arg, struct sim_result *res)
{
	struct run r = {.l = l, .p = p, .rounds = rounds};
	if (p->model == SIM_SYNC && !(p->sync < 1))
		return -EINVAL; /* every step would synchronize: no round ends */
	if (threads < 1)
		threads = 1;
	pthread_t *tid = calloc((size_t)threads, sizeof(*tid));
	if (!tid)
		return -ENOMEM;
	double t0 = tool_now();
	int started = 0;
	for (; started < threads; started++)
		if (pthread_create(&tid[started], NULL, run_thread, &r))
			break;
	if (!started) {
		free(tid);
		return -EAGAIN;
	}
	while (progress && atomic_load(&r.done) < rounds && !atomic_load(&r.failed)) {
		struct timespec ts = {0, 100 * 1000 * 1000};
		nanosleep(&ts, NULL);
		progress(atomic_load(&r.done), rounds, atomic_load(&r.deadlocks), tool_now() - t0, arg);
	}
	for (int i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	free(tid);
	if (atomic_load(&r.failed))
		return -ENOMEM;
	res->rounds = rounds;
	res->deadlocks = atomic_load(&r.deadlocks);
	res->seconds = tool_now() - t0;
	return 0;
}

void sim_wilson(uint64_t k, uint64_t n, double *lo, double *hi)
{
	if (n == 0) {
		*lo = 0;
		*hi = 1;
		return;
	}
	const double z = 1.959963984540054;
	double ph = (double)k / (double)n, nn = (double)n;
	double den = 1 + z * z / nn;
	double mid = (ph + z * z / (2 * nn)) / den;
	double half = z * sqrt(ph * (1 - ph) / nn + z * z / (4 * nn * nn)) / den;
	*lo = mid - half < 0 ? 0 : mid - half;
	*hi = mid + half > 1 ? 1 : mid + half;
}

double sim_zscore(uint64_t k, uint64_t n, double expected, uint64_t n_ref)
{
	double ph = n ? (double)k / (double)n : 0;
	/* The variance under the expected ratio, so a measured 0 still has one. */
	double q = expected > 0 && expected < 1 ? expected : ph;
	double var = q * (1 - q) / (double)(n ? n : 1);
	if (n_ref)
		var += q * (1 - q) / (double)n_ref;
	if (var <= 0)
		return ph == expected ? 0 : INFINITY;
	return (ph - expected) / sqrt(var);
}

const char *sim_verdict_name(enum sim_verdict v)
{
	switch (v) {
	case SIM_DONE:
		return "no deadlock";
	case SIM_MISMATCH:
		return "mismatch";
	case SIM_STALL:
		return "stall";
	case SIM_CYCLE:
		return "cycle";
	case SIM_CHAIN:
		return "chain";
	case SIM_INCOMPLETE:
		return "incomplete";
	}
	return "?";
}
