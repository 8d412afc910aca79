/*
 * dfccl-sim: how often NCCL-style collectives deadlock for a job layout
 * when ranks now and then invoke them out of order or synchronize the GPU,
 * the simulation of the DFCCL paper's section 2.4 (its Table 1). Nothing
 * here needs a GPU or a daemon.
 *
 * A run simulates --rounds rounds (sim.h) and prints the deadlock ratio
 * with its 95 % confidence interval (Wilson), its standard error and the
 * speed. --expect compares the ratio with a published one (itself taken
 * from --expect-rounds rounds, so it has an interval of its own, printed
 * beside it) and fails when they lie more than three standard errors
 * apart. --trace replays per-rank invocation orders recorded from a real
 * job through both models and says whether, and where, that order
 * deadlocks.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "sim.h"
#include "tool.h"
#include "topo_json.h"

static const char usage[] =
    "Usage: dfccl-sim --policy 3d --tp N --dp N --pp N --colls-tp N --colls-dp N [OPTIONS]\n"
    "       dfccl-sim --policy free --groups FILE [OPTIONS]\n"
    "       dfccl-sim --trace FILE [OPTIONS]\n"
    "Simulates rounds of collective invocations under NCCL-style execution and\n"
    "prints how many deadlock: the deadlock ratio of the layout without dfccl.\n"
    "\n"
    "Layout:\n"
    "      --policy 3d|free     3D (TP/DP/PP) grouping, or groups from a file\n"
    "      --tp, --dp, --pp N   group sizes of the 3D grouping\n"
    "      --colls-tp N         collectives of each TP group (default 400)\n"
    "      --colls-dp N         collectives of each DP group (default 1200)\n"
    "      --groups FILE        JSON: {\"groups\": [{\"gpus\": [0, 1], \"collectives\": 400}, ...]}\n"
    "                           or {\"groups\": [[0, 1], ...], \"collectives\": [400, 1200]}\n"
    "                           (a list of counts alternates over the groups)\n"
    "      --order interleave|concat\n"
    "                           a GPU's expected order: the lists of its groups\n"
    "                           round-robin (default), or one group after another\n"
    "      --trace FILE         per-rank invocation orders recorded from a job (JSON:\n"
    "                           {\"ranks\": [[\"a\", \"b\", \"sync\"], [\"b\", \"a\"]]}, entries\n"
    "                           {\"comm\": C, \"seq\": N}, or dfccld's flight-recorder dumps,\n"
    "                           `dfcclctl dump COMM --json`, one --trace per communicator);\n"
    "                           replays them and says whether and where they deadlock\n"
    "Model:\n"
    "      --model single-queue|sync\n"
    "                           single-queue (default): each group runs one collective\n"
    "                           at a time, in invocation order; sync: unlimited streams,\n"
    "                           and a synchronization suspends the GPU until its\n"
    "                           collectives are done\n"
    "      --disorder P         probability of skipping a candidate collective\n"
    "      --sync P             probability that a step synchronizes (sync model)\n"
    "      --decision exact|shortcut\n"
    "                           sync model: the exact cycle check (default) or the\n"
    "                           published simulator's shortcut\n"
    "Run:\n"
    "      --rounds N           rounds (default 32000; the paper's count)\n"
    "      --seed N             seed (default 1); results do not depend on --threads\n"
    "      --threads N          threads (default: the online CPUs)\n"
    "      --engine fast|literal\n"
    "                           literal draws every pick, as the published simulator\n"
    "                           does (slow; a reference)\n"
    "      --expect R           compare with the ratio R (0.0121 or 1.21%); exit 1 when\n"
    "                           they differ by more than 3 standard errors\n"
    "      --expect-rounds N    rounds behind R (default 32000; 0: R is exact); R's own\n"
    "                           95% interval from that many rounds is printed\n"
    "      --json               one JSON object on stdout\n"
    "      --quiet              no progress line\n"
    "  -h, --help               this text\n"
    "  -V, --version            the version\n"
    "\n"
    "Exit status: 0 done, 1 --expect failed or a trace deadlocks, 2 usage or input.\n";

#define MAX_TRACES 256

struct opts {
	const char *policy, *groups, *trace;
	const char *traces[MAX_TRACES]; /* --trace, once per file */
	int ntraces;
	long tp, dp, pp, colls_tp, colls_dp;
	enum sim_order order;
	struct sim_params p;
	bool model_given, sync_given;
	uint64_t rounds, expect_rounds;
	long threads;
	double expect;
	bool json, quiet;
};

enum {
	OPT_POLICY = 256,
	OPT_TP,
	OPT_DP,
	OPT_PP,
	OPT_COLLS_TP,
	OPT_COLLS_DP,
	OPT_GROUPS,
	OPT_ORDER,
	OPT_TRACE,
	OPT_MODEL,
	OPT_DISORDER,
	OPT_SYNC,
	OPT_DECISION,
	OPT_ROUNDS,
	OPT_SEED,
	OPT_THREADS,
	OPT_ENGINE,
	OPT_EXPECT,
	OPT_EXPECT_ROUNDS,
	OPT_JSON,
	OPT_QUIET,
};

static const struct option longopts[] = {
    {"policy", required_argument, NULL, OPT_POLICY},
    {"tp", required_argument, NULL, OPT_TP},
    {"dp", required_argument, NULL, OPT_DP},
    {"pp", required_argument, NULL, OPT_PP},
    {"colls-tp", required_argument, NULL, OPT_COLLS_TP},
    {"colls-dp", required_argument, NULL, OPT_COLLS_DP},
    {"groups", required_argument, NULL, OPT_GROUPS},
    {"order", required_argument, NULL, OPT_ORDER},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"model", required_argument, NULL, OPT_MODEL},
    {"disorder", required_argument, NULL, OPT_DISORDER},
    {"sync", required_argument, NULL, OPT_SYNC},
    {"decision", required_argument, NULL, OPT_DECISION},
    {"rounds", required_argument, NULL, OPT_ROUNDS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"engine", required_argument, NULL, OPT_ENGINE},
    {"expect", required_argument, NULL, OPT_EXPECT},
    {"expect-rounds", required_argument, NULL, OPT_EXPECT_ROUNDS},
    {"json", no_argument, NULL, OPT_JSON},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {NULL, 0, NULL, 0},
};

static int usage_error(const char *fmt, const char *arg) __attribute__((format(printf, 1, 0)));

static int usage_error(const char *fmt, const char *arg)
{
	char msg[256];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
	snprintf(msg, sizeof(msg), fmt, arg);
#pragma GCC diagnostic pop
	fprintf(stderr, "dfccl-sim: %s\nTry 'dfccl-sim --help'.\n", msg);
	return TOOL_EXIT_USAGE;
}

/* A probability: 0.004, 4e-3 or 0.4%. */
static bool parse_prob(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end != s && *end == '%' && !end[1]) {
		v /= 100;
		end++;
	}
	if (errno || end == s || *end || !(v >= 0 && v <= 1))
		return false;
	*out = v;
	return true;
}

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	errno = 0;
	if (*s == '-')
		return false;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static int parse_enum(const char *s, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

static const char *const model_names[] = {"single-queue", "sync"};
static const char *const decision_names[] = {"exact", "shortcut"};
static const char *const engine_names[] = {"fast", "literal"};
static const char *const order_names[] = {"interleave", "concat", "trace"};

static int parse_opt(struct opts *o, int c, const char *arg)
{
	int e;
	switch (c) {
	case OPT_POLICY:
		if (strcmp(arg, "3d") && strcmp(arg, "free"))
			return usage_error("--policy must be 3d or free, not '%s'", arg);
		o->policy = arg;
		return 0;
	case OPT_TP:
	case OPT_DP:
	case OPT_PP: {
		long *v = c == OPT_TP ? &o->tp : c == OPT_DP ? &o->dp : &o->pp;
		return tool_parse_long(arg, 1, 1 << 20, v) ? 0 : usage_error("a group size must be 1 or more, not '%s'", arg);
	}
	case OPT_COLLS_TP:
	case OPT_COLLS_DP:
		return tool_parse_long(arg, 1, SIM_MAX_INVOCATIONS, c == OPT_COLLS_TP ? &o->colls_tp : &o->colls_dp)
		           ? 0
		           : usage_error("a collective count must be 1 or more, not '%s'", arg);
	case OPT_GROUPS:
		o->groups = arg;
		return 0;
	case OPT_TRACE:
		if (o->ntraces == MAX_TRACES)
			return usage_error("at most %s --trace files", "256");
		o->trace = o->traces[o->ntraces++] = arg;
		return 0;
	case OPT_ORDER:
		if ((e = parse_enum(arg, order_names, 2)) < 0)
			return usage_error("--order must be interleave or concat, not '%s'", arg);
		o->order = (enum sim_order)e;
		return 0;
	case OPT_MODEL:
		if ((e = parse_enum(arg, model_names, 2)) < 0)
			return usage_error("--model must be single-queue or sync, not '%s'", arg);
		o->p.model = (enum sim_model)e;
		o->model_given = true;
		return 0;
	case OPT_DECISION:
		if ((e = parse_enum(arg, decision_names, 2)) < 0)
			return usage_error("--decision must be exact or shortcut, not '%s'", arg);
		o->p.decision = (enum sim_decision)e;
		return 0;
	case OPT_ENGINE:
		if ((e = parse_enum(arg, engine_names, 2)) < 0)
			return usage_error("--engine must be fast or literal, not '%s'", arg);
		o->p.engine = (enum sim_engine)e;
		return 0;
	case OPT_DISORDER:
		return parse_prob(arg, &o->p.disorder) ? 0 : usage_error("--disorder must be a probability, not '%s'", arg);
	case OPT_SYNC:
		o->sync_given = true;
		/* At 1 every step synchronizes and no GPU ever invokes anything. */
		return parse_prob(arg, &o->p.sync) && o->p.sync < 1
		           ? 0
		           : usage_error("--sync must be a probability below 1, not '%s'", arg);
	case OPT_EXPECT:
		return parse_prob(arg, &o->expect) ? 0 : usage_error("--expect must be a ratio, not '%s'", arg);
	case OPT_ROUNDS:
		return parse_u64(arg, 1, UINT64_C(1) << 40, &o->rounds) ? 0 : usage_error("--rounds must be 1 or more, not '%s'", arg);
	case OPT_EXPECT_ROUNDS:
		return parse_u64(arg, 0, UINT64_C(1) << 40, &o->expect_rounds) ? 0
		                                                               : usage_error("bad --expect-rounds '%s'", arg);
	case OPT_SEED:
		return parse_u64(arg, 0, UINT64_MAX, &o->p.seed) ? 0 : usage_error("bad --seed '%s'", arg);
	case OPT_THREADS:
		return tool_parse_long(arg, 1, 1024, &o->threads) ? 0 : usage_error("--threads must be 1 to 1024, not '%s'", arg);
	case OPT_JSON:
		o->json = true;
		return 0;
	case OPT_QUIET:
		o->quiet = true;
		return 0;
	}
	return usage_error("%s", "unknown option");
}

static int check_opts(struct opts *o)
{
	if (o->trace && (o->policy || o->groups || o->tp || o->dp || o->pp))
		return usage_error("%s", "--trace takes the layout from the trace: no --policy, --groups or group sizes");
	if (!o->trace && !o->policy)
		o->policy = o->groups ? "free" : "3d";
	if (o->policy && !strcmp(o->policy, "free") && !o->groups)
		return usage_error("%s", "--policy free needs --groups FILE");
	if (o->policy && !strcmp(o->policy, "3d") && (o->groups || !o->tp || !o->dp || !o->pp))
		return usage_error("%s", "--policy 3d needs --tp, --dp and --pp (and no --groups)");
	if (o->p.model == SIM_SINGLE_QUEUE && o->sync_given && o->p.sync > 0 && o->model_given)
		return usage_error("%s", "--sync applies to --model sync only");
	if (o->sync_given && !o->model_given)
		o->p.model = SIM_SYNC;
	return 0;
}

/* ---------------------------------------------------------------- output */

struct progress {
	bool tty;
	double last;
};

static void on_progress(uint64_t done, uint64_t total, uint64_t deadlocks, double seconds, void *arg)
{
	struct progress *pr = arg;
	if (seconds < 3 || seconds - pr->last < (pr->tty ? 0.5 : 15))
		return;
	pr->last = seconds;
	double rate = done / seconds;
	double eta = rate > 0 ? (double)(total - done) / rate : 0;
	fprintf(stderr, "%s%llu/%llu rounds, %llu deadlocks, %.0f rounds/s, %.0f s left%s", pr->tty ? "\r" : "",
	        (unsigned long long)done, (unsigned long long)total, (unsigned long long)deadlocks, rate, eta,
	        pr->tty ? "   " : "\n");
}

static void describe_model(const struct opts *o, char *buf, size_t len)
{
	if (o->p.model == SIM_SYNC)
		snprintf(buf, len, "sync model (%s decision), disorder %g, sync %g", decision_names[o->p.decision],
		         o->p.disorder, o->p.sync);
	else
		snprintf(buf, len, "single-queue model, disorder %g", o->p.disorder);
}

static int print_result(const struct opts *o, const struct sim_layout *l, const struct sim_result *r)
{
	double ratio = (double)r->deadlocks / (double)r->rounds, lo, hi;
	sim_wilson(r->deadlocks, r->rounds, &lo, &hi);
	double se = sqrt(ratio * (1 - ratio) / (double)r->rounds);
	double rate = r->seconds > 0 ? (double)r->rounds / r->seconds : 0;
	bool expect = o->expect >= 0;
	double z = expect ? sim_zscore(r->deadlocks, r->rounds, o->expect, o->expect_rounds) : 0;
	bool ok = !expect || fabs(z) <= 3;
	/* A published ratio from n rounds is k of n deadlocks: its own interval. */
	bool expect_ci = expect && o->expect_rounds > 0;
	double elo = 0, ehi = 0;
	if (expect_ci)
		sim_wilson((uint64_t)llround(o->expect * (double)o->expect_rounds), o->expect_rounds, &elo, &ehi);
	if (o->json) {
		json_t *j = json_pack("{s:s,s:i,s:i,s:I,s:I,s:s,s:s,s:s,s:s,s:f,s:f,s:I,s:I,s:f,s:[f,f],s:f,s:f,s:f,s:i,s:I}",
		                      "layout", l->desc, "gpus", l->ngpus, "groups", l->ngroups, "collectives",
		                      (json_int_t)l->ncolls, "invocations", (json_int_t)l->invocations, "order",
		                      order_names[l->order_kind], "model", model_names[o->p.model], "decision",
		                      decision_names[o->p.decision], "engine", engine_names[o->p.engine], "disorder",
		                      o->p.disorder, "sync", o->p.model == SIM_SYNC ? o->p.sync : 0.0, "rounds",
		                      (json_int_t)r->rounds, "deadlocks", (json_int_t)r->deadlocks, "ratio", ratio, "ci95",
		                      lo, hi, "stderr", se, "seconds", r->seconds, "rounds_per_s", rate, "threads",
		                      (int)o->threads, "seed", (json_int_t)o->p.seed);
		if (expect) {
			json_object_set_new(j, "expected", json_real(o->expect));
			json_object_set_new(j, "expected_rounds", json_integer((json_int_t)o->expect_rounds));
			if (expect_ci)
				json_object_set_new(j, "expected_ci95", json_pack("[f,f]", elo, ehi));
			json_object_set_new(j, "z", json_real(z));
			json_object_set_new(j, "within_3se", json_boolean(ok));
		}
		char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
		printf("%s\n", s);
		free(s);
		json_decref(j);
	} else {
		char model[160];
		describe_model(o, model, sizeof(model));
		printf("layout: %s (%s order): %d GPUs, %d groups, %lld collectives, %lld invocations per round\n",
		       l->desc, order_names[l->order_kind], l->ngpus, l->ngroups, (long long)l->ncolls,
		       (long long)l->invocations);
		printf("model: %s\n", model);
		printf("deadlock ratio %.4f%% (%llu of %llu rounds), 95%% CI %.4f%% - %.4f%%, standard error %.4f%%\n",
		       100 * ratio, (unsigned long long)r->deadlocks, (unsigned long long)r->rounds, 100 * lo, 100 * hi,
		       100 * se);
		printf("%llu rounds in %.2f s: %.0f rounds/s (%ld threads, %s engine, seed %llu)\n",
		       (unsigned long long)r->rounds, r->seconds, rate, o->threads, engine_names[o->p.engine],
		       (unsigned long long)o->p.seed);
		if (expect_ci)
			printf("expected %.4f%% (from %llu rounds: 95%% CI %.4f%% - %.4f%%): "
			       "%.2f standard errors away: %s\n",
			       100 * o->expect, (unsigned long long)o->expect_rounds, 100 * elo, 100 * ehi, z,
			       ok ? "within 3" : "MORE THAN 3");
		else if (expect)
			printf("expected %.4f%% (exact): %.2f standard errors away: %s\n", 100 * o->expect, z,
			       ok ? "within 3" : "MORE THAN 3");
	}
	return ok ? 0 : TOOL_EXIT_FAIL;
}

/* ---------------------------------------------------------------- traces */

static void trace_names(const struct sim_layout *l, int32_t c, char *buf, size_t len)
{
	if (c < 0)
		snprintf(buf, len, "(nothing)");
	else
		sim_coll_name(l, c, buf, len);
}

/* Ranks of c's group that have not invoked it. */
static void missing_ranks(const struct sim_layout *l, const struct sim_report *r, int32_t c, char *buf, size_t len)
{
	int g = l->coll_group[c];
	size_t n = 0;
	buf[0] = 0;
	for (int mi = 0; mi < sim_group_size(l, g) && n < len; mi++) {
		int m = l->grp_members[l->grp_moff[g] + mi];
		int32_t e = sim_eidx(l, c, mi);
		if (e == SIM_NEVER || e >= r->invoked[m])
			n += (size_t)snprintf(buf + n, len - n, "%s%d%s", n ? ", " : "", m, e == SIM_NEVER ? " (never)" : "");
	}
}

static void describe_report(const struct sim_layout *l, const struct sim_report *r, char *buf, size_t len)
{
	char a[96], b[96], miss[256];
	size_t n = 0;
	switch (r->verdict) {
	case SIM_DONE:
		snprintf(buf, len, "no deadlock");
		return;
	case SIM_INCOMPLETE:
		trace_names(l, r->waits[0], a, sizeof(a));
		missing_ranks(l, r, r->waits[0], miss, sizeof(miss));
		snprintf(buf, len, "no deadlock by order, but the trace ends first: %s is never invoked by rank %s", a,
		         miss);
		return;
	case SIM_MISMATCH:
		trace_names(l, r->coll[0], a, sizeof(a));
		trace_names(l, r->coll[1], b, sizeof(b));
		snprintf(buf, len,
		         "DEADLOCK in sweep %lld: rank %d invoked %s in group %s while %s, invoked first by other ranks "
		         "of the group, is not done (no common order exists)",
		         (long long)r->sweep, r->gpu, b,
		         l->group_names ? l->group_names[r->group] : "?", a);
		return;
	case SIM_CYCLE:
	case SIM_CHAIN:
	case SIM_STALL:
		if (r->verdict == SIM_STALL)
			n += (size_t)snprintf(buf, len, "DEADLOCK in sweep %lld: every rank left waits:", (long long)r->sweep);
		else
			n += (size_t)snprintf(buf, len, "DEADLOCK (%s) in sweep %lld, at rank %d's synchronization:",
			                      r->verdict == SIM_CYCLE ? "a cycle of suspended ranks" : "the published shortcut: a chain through it",
			                      (long long)r->sweep, r->gpu);
		for (int i = 0; i < r->n && i < SIM_REPORT_GPUS && n < len; i++) {
			trace_names(l, r->waits[i], a, sizeof(a));
			if (r->waits[i] >= 0)
				missing_ranks(l, r, r->waits[i], miss, sizeof(miss));
			else
				snprintf(miss, sizeof(miss), "-");
			n += (size_t)snprintf(buf + n, len - n, "%s rank %d waits on %s (not yet invoked by rank %s)",
			                      i ? ";" : "", r->gpus[i], a, miss);
		}
		return;
	}
}

static int replay_trace(const struct opts *o, const struct sim_layout *l)
{
	int32_t *invoked = calloc((size_t)l->ngpus, sizeof(*invoked));
	struct sim_work *w = sim_work_new(l);
	if (!invoked || !w) {
		fprintf(stderr, "dfccl-sim: out of memory\n");
		free(invoked);
		return TOOL_EXIT_FAIL;
	}
	int64_t nsync = l->sync_off[l->ngpus];
	json_t *j = json_pack("{s:s,s:i,s:i,s:I,s:I,s:b,s:{},s:{}}", "layout", l->desc, "ranks", l->ngpus, "groups",
	                      l->ngroups, "collectives", (json_int_t)l->ncolls, "synchronizations", (json_int_t)nsync,
	                      "consistent", l->consistent, "single_queue", "sync");
	if (!o->json) {
		printf("trace: %d ranks, %d groups, %lld collectives, %lld synchronizations\n", l->ngpus, l->ngroups,
		       (long long)l->ncolls, (long long)nsync);
		printf("one stream per rank for all groups: %s\n",
		       l->consistent ? "no deadlock (the orders agree with one common order)"
		                     : "DEADLOCK (the orders admit no common order)");
	}
	bool any = !l->consistent;
	for (int m = 0; m < 2; m++) {
		struct sim_params p = o->p;
		p.model = (enum sim_model)m;
		p.disorder = 0;
		p.sync = 0;
		p.engine = SIM_FAST;
		struct sim_report rep = {.invoked = invoked};
		bool dead = sim_round(l, &p, 0, w, &rep);
		any |= dead;
		char text[2048];
		describe_report(l, &rep, text, sizeof(text));
		json_t *jm = json_object_get(j, m ? "sync" : "single_queue");
		json_object_set_new(jm, "deadlock", json_boolean(dead));
		json_object_set_new(jm, "verdict", json_string(sim_verdict_name(rep.verdict)));
		json_object_set_new(jm, "text", json_string(text));
		json_t *inv = json_array();
		for (int h = 0; h < l->ngpus; h++)
			json_array_append_new(inv, json_integer(invoked[h]));
		json_object_set_new(jm, "invoked", inv);
		if (!o->json) {
			printf("%s: %s\n",
			       m ? "sync model (recorded synchronizations)" : "single-queue model (a queue per group on each rank)",
			       text);
			if (dead) {
				printf("  invoked by then:");
				for (int h = 0; h < l->ngpus; h++)
					printf(" rank %d %d/%d%s", h, invoked[h], sim_gpu_ncolls(l, h), h + 1 < l->ngpus ? "," : "\n");
			}
		}
	}
	if (o->json) {
		char *s = json_dumps(j, JSON_INDENT(2));
		printf("%s\n", s);
		free(s);
	}
	json_decref(j);
	sim_work_free(w);
	free(invoked);
	return any ? TOOL_EXIT_FAIL : 0;
}

/* ---------------------------------------------------------------- main */

/* The text of the --trace files: one file as it is, several (flight-recorder
 * dumps, one per communicator) as one JSON list. */
static char *trace_text(const struct opts *o, char *err, size_t errlen)
{
	char *all = NULL;
	size_t len = 0;
	for (int i = 0; i < o->ntraces; i++) {
		char *text = NULL;
		if (topo_json_read_file(o->traces[i], &text, err, errlen)) {
			free(all);
			return NULL;
		}
		if (o->ntraces == 1)
			return text;
		size_t n = strlen(text);
		char *bigger = realloc(all, len + n + 3);
		if (!bigger) {
			free(text);
			free(all);
			snprintf(err, errlen, "out of memory");
			return NULL;
		}
		all = bigger;
		all[len++] = i ? ',' : '[';
		memcpy(all + len, text, n);
		len += n;
		all[len] = 0;
		free(text);
	}
	all[len++] = ']';
	all[len] = 0;
	return all;
}

static int load_layout(const struct opts *o, struct sim_layout **l)
{
	char err[512];
	int rc;
	if (o->trace || o->groups) {
		const char *what = o->ntraces > 1 ? "the --trace files" : o->trace ? o->trace : o->groups;
		char *text = NULL;
		if (o->trace)
			text = trace_text(o, err, sizeof(err));
		else if (topo_json_read_file(o->groups, &text, err, sizeof(err)))
			text = NULL;
		if (!text) {
			fprintf(stderr, "dfccl-sim: %s\n", err);
			return TOOL_EXIT_USAGE;
		}
		rc = o->trace ? sim_layout_trace_json(text, l, err, sizeof(err))
		              : sim_layout_free_json(text, o->order, l, err, sizeof(err));
		free(text);
		if (rc) {
			fprintf(stderr, "dfccl-sim: %s: %s\n", what, err);
			return TOOL_EXIT_USAGE;
		}
		return 0;
	}
	rc = sim_layout_3d((int)o->tp, (int)o->dp, (int)o->pp, (int32_t)o->colls_tp, (int32_t)o->colls_dp, o->order, l,
	                   err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dfccl-sim: %s\n", err);
		return TOOL_EXIT_USAGE;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int rc = tool_standard_options(argc, argv, "dfccl-sim", usage);
	if (rc >= 0)
		return rc;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	struct opts o = {
	    .colls_tp = 400,
	    .colls_dp = 1200,
	    .order = SIM_ORDER_INTERLEAVE,
	    .p = {.model = SIM_SINGLE_QUEUE, .decision = SIM_EXACT, .engine = SIM_FAST, .seed = 1},
	    .rounds = 32000,
	    .expect_rounds = 32000,
	    .threads = ncpu > 0 ? ncpu : 1,
	    .expect = -1,
	};
	int c;
	while ((c = getopt_long(argc, argv, "hV", longopts, NULL)) != -1) {
		if (c == '?')
			return usage_error("%s", "unknown or incomplete option");
		if ((rc = parse_opt(&o, c, optarg)))
			return rc;
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	if ((rc = check_opts(&o)))
		return rc;
	struct sim_layout *l;
	if ((rc = load_layout(&o, &l)))
		return rc;
	if (o.trace) {
		rc = replay_trace(&o, l);
		bool randomized = o.p.disorder > 0 || o.p.sync > 0;
		if (!randomized || o.json) {
			sim_layout_free(l);
			return rc;
		}
		printf("with disorder %g and sync %g on top of the recorded order:\n", o.p.disorder, o.p.sync);
	}
	struct progress pr = {.tty = isatty(2)};
	struct sim_result res;
	int err = sim_run(l, &o.p, o.rounds, (int)o.threads, o.quiet ? NULL : on_progress, &pr, &res);
	if (pr.last > 0 && pr.tty)
		fputc('\n', stderr);
	if (err) {
		fprintf(stderr, "dfccl-sim: %s\n", strerror(-err));
		sim_layout_free(l);
		return TOOL_EXIT_FAIL;
	}
	int prc = print_result(&o, l, &res);
	sim_layout_free(l);
	return rc ? rc : prc;
}
