/*
 * The deadlock-risk simulator (client/tools/sim.h, sim_layout.h).
 *
 * Layouts are checked entry by entry on small cases. Ratios are checked
 * against probabilities derived by hand for configurations small enough
 * to enumerate, in both engines; exact event sequences (traces) must and
 * must not deadlock in each model, with the verdict the model gives; and
 * the fast engine must agree with the literal one, which draws every pick,
 * within sampling error on layouts where every shortcut of the fast one is
 * at work.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim.h"
#include "sim_layout.h"

static struct sim_layout *layout_3d(int tp, int dp, int pp, int ct, int cd, enum sim_order order)
{
	struct sim_layout *l;
	char err[256];
	int rc = sim_layout_3d(tp, dp, pp, ct, cd, order, &l, err, sizeof(err));
	if (rc)
		fail_msg("3d layout: %s", err);
	return l;
}

static struct sim_layout *layout_json(const char *json)
{
	struct sim_layout *l;
	char err[256];
	if (sim_layout_free_json(json, SIM_ORDER_INTERLEAVE, &l, err, sizeof(err)))
		fail_msg("free layout: %s", err);
	return l;
}

static struct sim_layout *layout_trace(const char *json)
{
	struct sim_layout *l;
	char err[256];
	if (sim_layout_trace_json(json, &l, err, sizeof(err)))
		fail_msg("trace: %s", err);
	return l;
}

/* The expected order of GPU h, as collective ids. */
static void assert_order(const struct sim_layout *l, int h, const int32_t *want, int n)
{
	assert_int_equal(sim_gpu_ncolls(l, h), n);
	for (int i = 0; i < n; i++)
		assert_int_equal(l->order[l->gpu_off[h] + i], want[i]);
}

static void test_layout_3d(void **state)
{
	/* TP 2, DP 3, PP 2: per stage three TP groups of two consecutive GPUs
	 * and two DP groups of three; the stages share nothing. */
	struct sim_layout *l = layout_3d(2, 3, 2, 2, 3, SIM_ORDER_INTERLEAVE);
	assert_int_equal(l->ngpus, 12);
	assert_int_equal(l->ngroups, 10);
	assert_int_equal(l->ncolls, 2 * (3 * 2 + 2 * 3));
	assert_int_equal(l->invocations, 12 * (2 + 3));
	assert_int_equal(l->ncomps, 2);
	const int32_t tp1[] = {2, 3}, dp0[] = {0, 2, 4}, dp1_stage1[] = {7, 9, 11};
	assert_int_equal(sim_group_size(l, 1), 2);
	assert_memory_equal(l->grp_members + l->grp_moff[1], tp1, sizeof(tp1));
	assert_memory_equal(l->grp_members + l->grp_moff[3], dp0, sizeof(dp0));
	assert_memory_equal(l->grp_members + l->grp_moff[9], dp1_stage1, sizeof(dp1_stage1));
	/* GPU 0: TP group 0 (ids 0, 1), DP group 3 (ids 6, 7, 8), round-robin. */
	const int32_t gpu0[] = {0, 6, 1, 7, 8};
	assert_order(l, 0, gpu0, 5);
	/* GPU 2 expects collective 7 (the second of DP group 3) at position 3,
	 * as member 1 of that group. */
	assert_int_equal(sim_eidx(l, 7, 1), 3);
	assert_true(l->consistent);
	sim_layout_free(l);

	l = layout_3d(2, 3, 2, 2, 3, SIM_ORDER_CONCAT);
	const int32_t gpu0c[] = {0, 1, 6, 7, 8};
	assert_order(l, 0, gpu0c, 5);
	assert_true(l->consistent);
	sim_layout_free(l);
}

static void test_layout_free_forms(void **state)
{
	const char *forms[] = {
	    "{\"groups\": [{\"gpus\": [0, 1, 2], \"collectives\": 2}, {\"gpus\": [2, 3], \"collectives\": 3}]}",
	    "{\"groups\": [[0, 1, 2], [2, 3]], \"collectives\": [2, 3]}",
	    "{\"gpu_per_group\": [[2, 1, 0], [3, 2]], \"coll_cnt_per_group\": [2, 3]}",
	};
	for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
		struct sim_layout *l = layout_json(forms[f]);
		assert_int_equal(l->ngpus, 4);
		assert_int_equal(l->ngroups, 2);
		assert_int_equal(l->ncomps, 1);
		/* GPU 2 is in both: 0, 2, 1, 3, 4 round-robin. */
		const int32_t gpu2[] = {0, 2, 1, 3, 4}, gpu3[] = {2, 3, 4};
		assert_order(l, 2, gpu2, 5);
		assert_order(l, 3, gpu3, 3);
		sim_layout_free(l);
	}
	/* An alternating list: group i has counts[i % 2]. */
	struct sim_layout *l = layout_json("{\"groups\": [[0], [1], [2]], \"collectives\": [400, 1200]}");
	assert_int_equal(sim_gpu_ncolls(l, 0), 400);
	assert_int_equal(sim_gpu_ncolls(l, 1), 1200);
	assert_int_equal(sim_gpu_ncolls(l, 2), 400);
	assert_int_equal(l->ncomps, 3);
	sim_layout_free(l);
}

static void assert_free_error(const char *json, const char *fragment)
{
	struct sim_layout *l = NULL;
	char err[256] = "";
	assert_int_not_equal(sim_layout_free_json(json, SIM_ORDER_INTERLEAVE, &l, err, sizeof(err)), 0);
	if (!strstr(err, fragment))
		fail_msg("error '%s' does not say '%s'", err, fragment);
}

static void test_layout_errors(void **state)
{
	assert_free_error("{\"groups\": [[0, 2]], \"collectives\": 3}", "GPU 1 is in no group");
	assert_free_error("{\"groups\": [[0, 1, 1]], \"collectives\": 3}", "listed twice");
	assert_free_error("{\"groups\": [[0, 1]], \"collectives\": 0}", "positive");
	assert_free_error("{\"groups\": [[0, 1]]}", "no collective count");
	assert_free_error("{\"groups\": []}", "non-empty");
	assert_free_error("{\"groups\": [[0, -1]], \"collectives\": 1}", "not a GPU number");
	assert_free_error("[1, 2", "not JSON");

	struct sim_layout *l = NULL;
	char err[256] = "";
	assert_int_not_equal(sim_layout_trace_json("{\"ranks\": [[\"a\", \"a\"]]}", &l, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "twice"));
	assert_int_not_equal(sim_layout_trace_json("{\"ranks\": [[\"a\"], [\"sync\"]]}", &l, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "rank 1 invokes no collective"));
	assert_int_not_equal(sim_layout_trace_json("{\"ranks\": [[3]]}", &l, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "rank 0, event 0"));
}

/* ---------------------------------------------------------------- ratios */

struct measured {
	uint64_t k, n;
};

static struct measured run(const struct sim_layout *l, enum sim_model model, enum sim_decision decision,
                           enum sim_engine engine, double p, double s, uint64_t rounds, uint64_t seed)
{
	struct sim_params prm = {
	    .model = model, .decision = decision, .engine = engine, .disorder = p, .sync = s, .seed = seed};
	struct sim_result r;
	assert_int_equal(sim_run(l, &prm, rounds, 2, NULL, NULL, &r), 0);
	assert_int_equal(r.rounds, rounds);
	return (struct measured){r.deadlocks, r.rounds};
}

/* The measured ratio lies within 4 standard errors of the exact one. */
static void assert_ratio(struct measured m, double want, const char *what)
{
	double z = sim_zscore(m.k, m.n, want, 0);
	if (fabs(z) > 4)
		fail_msg("%s: %llu of %llu rounds (%.5f), expected %.5f: %.1f standard errors", what,
		         (unsigned long long)m.k, (unsigned long long)m.n, (double)m.k / (double)m.n, want, z);
}

static void test_two_gpus_two_collectives(void **state)
{
	/* One group of two GPUs with two collectives. A GPU swaps them when it
	 * skips the first of its two candidates (probability p; the last pick
	 * has no choice). The single queue deadlocks exactly when the two GPUs'
	 * orders differ: 2 p (1 - p). */
	struct sim_layout *l = layout_json("{\"groups\": [[0, 1]], \"collectives\": 2}");
	const double p = 0.3;
	for (int e = 0; e < 2; e++)
		assert_ratio(run(l, SIM_SINGLE_QUEUE, SIM_EXACT, e, p, 0, 20000, 1), 2 * p * (1 - p),
		             e ? "single queue, literal" : "single queue, fast");
	/* Synchronization model: a deadlock needs the opposite orders and, on
	 * both GPUs, a synchronization between the two invocations (the step
	 * after the first is a synchronization with probability s): then each
	 * waits for its first collective, which the other invokes second. With
	 * two GPUs the shortcut's chain is the cycle itself. */
	const double s = 0.5, want = 2 * p * (1 - p) * s * s;
	for (int d = 0; d < 2; d++)
		for (int e = 0; e < 2; e++)
			assert_ratio(run(l, SIM_SYNC, d, e, p, s, 20000, 2), want, d ? "sync, shortcut" : "sync, exact");
	/* Without disorder nothing deadlocks, whatever synchronizes. */
	assert_int_equal(run(l, SIM_SYNC, SIM_EXACT, SIM_FAST, 0, 0.9, 2000, 3).k, 0);
	assert_int_equal(run(l, SIM_SYNC, SIM_SHORTCUT, SIM_LITERAL, 0, 0.9, 2000, 3).k, 0);
	sim_layout_free(l);
}

static void test_two_gpus_three_collectives(void **state)
{
	/* Three collectives: the first pick takes candidate 1, 2 or 3 with
	 * probabilities (1-p), p(1-p), p^2; the second takes the first of the
	 * two left with 1-p. The six orders' probabilities q_i follow, and the
	 * GPUs deadlock unless they draw the same order: 1 - sum q_i^2. */
	struct sim_layout *l = layout_json("{\"groups\": [[0, 1]], \"collectives\": 3}");
	const double p = 0.2, a = 1 - p;
	const double q[6] = {a * a, a * p, p * a * a, p * a * p, p * p * a, p * p * p};
	double same = 0, total = 0;
	for (int i = 0; i < 6; i++) {
		same += q[i] * q[i];
		total += q[i];
	}
	assert_true(fabs(total - 1) < 1e-12);
	for (int e = 0; e < 2; e++)
		assert_ratio(run(l, SIM_SINGLE_QUEUE, SIM_EXACT, e, p, 0, 20000, 4), 1 - same, "three collectives");
	sim_layout_free(l);
}

static void test_independent_groups(void **state)
{
	/* k separate groups of two GPUs and two collectives: a round deadlocks
	 * when any group does, 1 - (1 - 2p(1-p))^k; the fast engine sees k
	 * components, the literal one a single round-robin over all GPUs. */
	struct sim_layout *l = layout_json("{\"groups\": [[0, 1], [2, 3], [4, 5], [6, 7]], \"collectives\": 2}");
	assert_int_equal(l->ncomps, 4);
	const double p = 0.05, want = 1 - pow(1 - 2 * p * (1 - p), 4);
	for (int e = 0; e < 2; e++)
		assert_ratio(run(l, SIM_SINGLE_QUEUE, SIM_EXACT, e, p, 0, 20000, 5), want, "independent groups");
	sim_layout_free(l);
}

/* Two-sample check: the engines agree within 4 standard errors. */
static void assert_engines_agree(const struct sim_layout *l, enum sim_model model, enum sim_decision decision,
                                 double p, double s, uint64_t rounds, const char *what)
{
	struct measured f = run(l, model, decision, SIM_FAST, p, s, rounds, 11);
	struct measured t = run(l, model, decision, SIM_LITERAL, p, s, rounds, 12);
	double pf = (double)f.k / (double)f.n, pt = (double)t.k / (double)t.n;
	double pool = (double)(f.k + t.k) / (double)(f.n + t.n);
	double se = sqrt(pool * (1 - pool) * (1.0 / (double)f.n + 1.0 / (double)t.n));
	print_message("%s: fast %.4f, literal %.4f\n", what, pf, pt);
	/* A comparison of zeros (or of certainties) would prove nothing. */
	assert_true(pool > 0.01 && pool < 0.99);
	if (fabs(pf - pt) > 4 * se)
		fail_msg("%s: fast %.5f and literal %.5f differ by %.1f standard errors", what, pf, pt, fabs(pf - pt) / se);
}

static void test_fast_matches_literal(void **state)
{
	/* 3D with both orders (several components, skips across and within
	 * groups, tails of one group only). */
	struct sim_layout *l = layout_3d(2, 2, 2, 12, 30, SIM_ORDER_INTERLEAVE);
	assert_engines_agree(l, SIM_SINGLE_QUEUE, SIM_EXACT, 0.004, 0, 6000, "3d single queue");
	assert_engines_agree(l, SIM_SYNC, SIM_EXACT, 0.05, 0.05, 6000, "3d sync exact");
	assert_engines_agree(l, SIM_SYNC, SIM_SHORTCUT, 0.05, 0.05, 6000, "3d sync shortcut");
	sim_layout_free(l);
	l = layout_3d(2, 2, 1, 12, 30, SIM_ORDER_CONCAT);
	assert_engines_agree(l, SIM_SYNC, SIM_EXACT, 0.05, 0.1, 6000, "3d concat sync exact");
	sim_layout_free(l);
	/* Free grouping: GPUs in one to three groups, so GPUs drift apart, wait
	 * in the single queue, and stay suspended across many steps. */
	l = layout_json("{\"groups\": [[0, 1, 2], [2, 3], [3, 4, 0], [1, 4], [5, 2]], \"collectives\": [8, 20]}");
	assert_engines_agree(l, SIM_SINGLE_QUEUE, SIM_EXACT, 0.01, 0, 6000, "free single queue");
	assert_engines_agree(l, SIM_SYNC, SIM_EXACT, 0.1, 0.1, 6000, "free sync exact");
	assert_engines_agree(l, SIM_SYNC, SIM_SHORTCUT, 0.1, 0.1, 6000, "free sync shortcut");
	sim_layout_free(l);
	/* Large disorder: deep skips and several entries taken ahead at once. */
	l = layout_json("{\"groups\": [[0, 1], [1, 2]], \"collectives\": 5}");
	assert_engines_agree(l, SIM_SINGLE_QUEUE, SIM_EXACT, 0.12, 0, 6000, "deep skips, single queue");
	assert_engines_agree(l, SIM_SYNC, SIM_EXACT, 0.5, 0.3, 6000, "deep skips, sync");
	sim_layout_free(l);
}

static void test_shortcut_over_reports(void **state)
{
	/* Where GPUs belong to several groups, the shortcut's chains are often
	 * not cycles: it reports more deadlocks than the exact check, never
	 * fewer, and on the same rounds every exact deadlock is also its. */
	struct sim_layout *l = layout_json("{\"groups\": [[0, 1, 2], [2, 3], [3, 4, 0], [1, 4], [5, 2]], \"collectives\": [8, 20]}");
	struct sim_work *w = sim_work_new(l);
	struct sim_params ex = {.model = SIM_SYNC, .decision = SIM_EXACT, .disorder = 0.1, .sync = 0.2, .seed = 9};
	struct sim_params sc = ex;
	sc.decision = SIM_SHORTCUT;
	int exact = 0, chains = 0;
	for (uint64_t r = 0; r < 3000; r++) {
		bool e = sim_round(l, &ex, r, w, NULL), s = sim_round(l, &sc, r, w, NULL);
		/* The rounds are the same until the first suspension the exact
		 * check clears and the shortcut does not. */
		assert_true(!e || s);
		exact += e;
		chains += s;
	}
	print_message("exact %d, shortcut %d of 3000\n", exact, chains);
	assert_true(exact > 30);
	assert_true(chains > exact + 30);
	sim_work_free(w);
	sim_layout_free(l);
}

static void test_threads_do_not_matter(void **state)
{
	struct sim_layout *l = layout_3d(2, 2, 2, 12, 30, SIM_ORDER_INTERLEAVE);
	struct sim_params prm = {.model = SIM_SYNC, .decision = SIM_EXACT, .disorder = 0.05, .sync = 0.05, .seed = 5};
	struct sim_result a, b;
	assert_int_equal(sim_run(l, &prm, 3000, 1, NULL, NULL, &a), 0);
	assert_int_equal(sim_run(l, &prm, 3000, 3, NULL, NULL, &b), 0);
	assert_int_equal(a.deadlocks, b.deadlocks);
	assert_true(a.deadlocks > 0);
	/* Every step synchronizing would never end a round: refused. */
	prm.sync = 1;
	assert_int_equal(sim_run(l, &prm, 10, 1, NULL, NULL, &a), -EINVAL);
	sim_layout_free(l);
}

/* ---------------------------------------------------------------- event sequences */

/* Replays a trace in one model with both engines; returns the fast verdict. */
static enum sim_verdict replay(const struct sim_layout *l, enum sim_model model, enum sim_decision decision,
                               struct sim_report *rep)
{
	struct sim_work *w = sim_work_new(l);
	struct sim_params prm = {.model = model, .decision = decision, .engine = SIM_FAST};
	bool dead = sim_round(l, &prm, 0, w, rep);
	prm.engine = SIM_LITERAL;
	struct sim_report lit = {0};
	assert_int_equal(sim_round(l, &prm, 0, w, &lit), dead);
	assert_int_equal(dead, rep->verdict != SIM_DONE && rep->verdict != SIM_INCOMPLETE);
	sim_work_free(w);
	return rep->verdict;
}

static void test_sequences_single_queue(void **state)
{
	struct sim_report rep = {0};
	int32_t invoked[3];
	rep.invoked = invoked;
	/* Opposite orders in one group: the group sees two collectives. */
	struct sim_layout *l = layout_trace("{\"ranks\": [[\"a\", \"b\"], [\"b\", \"a\"]]}");
	assert_false(l->consistent);
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_MISMATCH);
	assert_int_equal(rep.gpu, 1);
	assert_int_equal(rep.sweep, 0);
	assert_int_equal(invoked[0], 1);
	assert_int_equal(invoked[1], 0);
	/* Without synchronizations, unlimited streams do not deadlock on it. */
	assert_int_equal(replay(l, SIM_SYNC, SIM_EXACT, &rep), SIM_DONE);
	sim_layout_free(l);

	l = layout_trace("{\"ranks\": [[\"a\", \"b\"], [\"a\", \"b\"]]}");
	assert_true(l->consistent);
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_DONE);
	sim_layout_free(l);

	/* A wait cycle through three groups: every GPU has invoked the first
	 * collective of one group and waits to invoke its second until a GPU
	 * that is itself waiting invokes the first. No group ever sees two
	 * different collectives. */
	l = layout_trace("{\"ranks\": [[\"g1a\", \"g1b\", \"g3a\", \"g3b\"], [\"g2a\", \"g2b\", \"g1a\", \"g1b\"],"
	                 " [\"g3a\", \"g3b\", \"g2a\", \"g2b\"]]}");
	assert_int_equal(l->ngroups, 3);
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_STALL);
	assert_int_equal(rep.n, 3);
	assert_int_equal(rep.sweep, 1);
	sim_layout_free(l);
	/* The same collectives round-robin: no wait outlives a sweep. */
	l = layout_trace("{\"ranks\": [[\"g1a\", \"g3a\", \"g1b\", \"g3b\"], [\"g1a\", \"g2a\", \"g1b\", \"g2b\"],"
	                 " [\"g2a\", \"g3a\", \"g2b\", \"g3b\"]]}");
	assert_true(l->consistent);
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_DONE);
	sim_layout_free(l);
}

static void test_sequences_sync(void **state)
{
	struct sim_report rep = {0};
	int32_t invoked[4];
	rep.invoked = invoked;
	/* Fig. 1(d) of the paper: opposite orders, a synchronization after the
	 * first on both GPUs. */
	struct sim_layout *l = layout_trace("{\"ranks\": [[\"a\", \"sync\", \"b\"], [\"b\", {\"sync\": true}, \"a\"]]}");
	assert_int_equal(l->sync_off[2], 2);
	assert_int_equal(replay(l, SIM_SYNC, SIM_EXACT, &rep), SIM_CYCLE);
	assert_int_equal(rep.n, 2);
	assert_int_equal(rep.gpu, 1);
	assert_int_equal(rep.gpus[0], 1);
	assert_int_equal(rep.gpus[1], 0);
	assert_int_equal(replay(l, SIM_SYNC, SIM_SHORTCUT, &rep), SIM_CHAIN);
	sim_layout_free(l);
	/* One synchronization only: the other GPU's second invocation frees it. */
	l = layout_trace("{\"ranks\": [[\"a\", \"sync\", \"b\"], [\"b\", \"a\"]]}");
	assert_int_equal(replay(l, SIM_SYNC, SIM_EXACT, &rep), SIM_DONE);
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_MISMATCH);
	sim_layout_free(l);
	/* The shortcut's false alarm: C waits for A, A for B, B for D, which is
	 * not suspended and frees B, then A, then C. Sweeps: B and C suspend in
	 * the second, A in the third, when the chain C -> A -> B is complete. */
	l = layout_trace("{\"ranks\": [[\"x\", \"a2\", \"sync\", \"y\"], [\"z\", \"sync\", \"x\"],"
	                 " [\"y\", \"sync\", \"c2\"], [\"d1\", \"d2\", \"d3\", \"z\"]]}");
	assert_int_equal(replay(l, SIM_SYNC, SIM_EXACT, &rep), SIM_DONE);
	assert_int_equal(replay(l, SIM_SYNC, SIM_SHORTCUT, &rep), SIM_CHAIN);
	assert_int_equal(rep.gpu, 0);
	assert_int_equal(rep.sweep, 2);
	assert_int_equal(rep.gpus[0], 2); /* C waits for A ... */
	assert_int_equal(rep.gpus[1], 0); /* ... and A for B */
	sim_layout_free(l);
}

static void test_sequences_flight_recorder(void **state)
{
	struct sim_report rep = {0};
	int32_t invoked[3];
	rep.invoked = invoked;
	/* Communicator entries; rank 2 never reaches comm 7's second
	 * collective (its trace ends), and nothing else goes wrong. */
	struct sim_layout *l = layout_trace(
	    "{\"ranks\": [[{\"comm\": 7, \"seq\": 0, \"op\": \"allreduce\"}, {\"comm\": 7, \"seq\": 1}],"
	    " [{\"comm\": 7, \"seq\": 0}, {\"comm\": 7, \"seq\": 1}], [{\"comm\": 7, \"seq\": 0}]]}");
	assert_int_equal(l->ngroups, 1);
	assert_int_equal(sim_group_size(l, 0), 3);
	assert_int_equal(sim_eidx(l, 1, 2), SIM_NEVER);
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_INCOMPLETE);
	assert_int_equal(rep.waits[0], 1);
	sim_layout_free(l);
	/* Two communicators of the same ranks invoked in opposite orders, a
	 * synchronization after the first on both ranks: each communicator's
	 * queues agree (one stream for both would not: no common order), but
	 * the synchronizations close a cycle. */
	l = layout_trace("{\"ranks\": [[{\"comm\": \"a\", \"seq\": 0}, \"sync\", {\"comm\": \"b\", \"seq\": 0}],"
	                 " [{\"comm\": \"b\", \"seq\": 0}, {\"op\": \"sync\"}, {\"comm\": \"a\", \"seq\": 0}]]}");
	assert_int_equal(l->ngroups, 2);
	assert_false(l->consistent);
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_DONE);
	assert_int_equal(replay(l, SIM_SYNC, SIM_EXACT, &rep), SIM_CYCLE);
	sim_layout_free(l);
}

static void test_flight_recorder_dumps(void **state)
{
	/* Two communicators' dumps as dfcclctl prints them. Processes (by
	 * session) become ranks in order of appearance: session 5 is rank 0.
	 * Session 5 submitted comm 11 #3 at 5 ms and comm 12 #0 at 7 ms,
	 * session 6 comm 12 #0 at 4 ms and comm 11 #3 at 9 ms: opposite orders
	 * across communicators. Comm 11 #2 is only in session 5's ring (6's
	 * overwrote it): dropped. The send is not a collective of the group. */
	struct sim_layout *l = layout_trace(
	    "[{\"comm_id\": 11, \"nranks\": 2, \"ranks\": [{\"rank\": 0, \"device\": 0, \"session_id\": 5, \"pid\": 100},"
	    " {\"rank\": 1, \"device\": 1, \"session_id\": 6, \"pid\": 101}],"
	    " \"records\": [{\"rank\": 0, \"op\": \"allreduce\", \"seq\": 2, \"submit_ms\": 1},"
	    " {\"rank\": 0, \"op\": \"allreduce\", \"seq\": 3, \"submit_ms\": 5},"
	    " {\"rank\": 1, \"op\": \"allreduce\", \"seq\": 3, \"submit_ms\": 9},"
	    " {\"rank\": 1, \"op\": \"send\", \"seq\": 0, \"submit_ms\": 2}]},"
	    " {\"comm_id\": 12, \"nranks\": 2, \"ranks\": [{\"rank\": 0, \"device\": 1, \"session_id\": 6, \"pid\": 101},"
	    " {\"rank\": 1, \"device\": 0, \"session_id\": 5, \"pid\": 100}],"
	    " \"records\": [{\"rank\": 1, \"op\": \"allgather\", \"seq\": 0, \"submit_ms\": 7},"
	    " {\"rank\": 0, \"op\": \"allgather\", \"seq\": 0, \"submit_ms\": 4}]}]");
	assert_int_equal(l->ngpus, 2);
	assert_int_equal(l->ngroups, 2);
	assert_int_equal(l->ncolls, 2);
	char a[32], b[32];
	sim_coll_name(l, l->order[l->gpu_off[0]], a, sizeof(a));
	sim_coll_name(l, l->order[l->gpu_off[0] + 1], b, sizeof(b));
	assert_string_equal(a, "11#3");
	assert_string_equal(b, "12#0");
	sim_coll_name(l, l->order[l->gpu_off[1]], a, sizeof(a));
	assert_string_equal(a, "12#0");
	assert_false(l->consistent);
	struct sim_report rep = {0};
	assert_int_equal(replay(l, SIM_SINGLE_QUEUE, SIM_EXACT, &rep), SIM_DONE);
	sim_layout_free(l);

	struct sim_layout *bad = NULL;
	char err[256] = "";
	assert_int_not_equal(sim_layout_trace_json("[{\"comm_id\": 1, \"records\": []}, [\"a\"]]", &bad, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "entry 1 is not a flight-recorder dump"));
}

static void test_statistics(void **state)
{
	double lo, hi;
	sim_wilson(0, 10, &lo, &hi);
	assert_true(lo == 0);
	assert_true(fabs(hi - 0.2775) < 1e-3);
	sim_wilson(50, 100, &lo, &hi);
	assert_true(fabs(lo - 0.4038) < 1e-3 && fabs(hi - 0.5962) < 1e-3);
	/* 1.10% of 32000 against 1.10% of 32000: 0; 1.30% against 1.10%:
	 * (0.002) / sqrt(2 * 0.011 * 0.989 / 32000) = 2.43. */
	assert_true(fabs(sim_zscore(352, 32000, 0.011, 32000)) < 1e-9);
	assert_true(fabs(sim_zscore(416, 32000, 0.011, 32000) - 2.43) < 0.01);
	assert_true(fabs(sim_zscore(416, 32000, 0.011, 0) - 3.44) < 0.01);
	/* A published ratio from few rounds: 3.59% is 23 of 640. Wilson:
	 * p = 0.0359375, z^2/n = 0.0060023, centre (p + z^2/2n) / (1 + z^2/n)
	 * = 0.038688, half-width 1.96 sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)
	 * = 0.014642: 2.405% - 5.333%. 1547 of 32000 (4.834%) lies
	 * 0.012444 / sqrt(0.0359 * 0.9641 * (1/32000 + 1/640)) = 1.68 standard
	 * errors from it, but 8.46 from the same ratio taken from 32000 rounds. */
	sim_wilson(23, 640, &lo, &hi);
	assert_true(fabs(lo - 0.02405) < 1e-4 && fabs(hi - 0.05333) < 1e-4);
	assert_true(fabs(sim_zscore(1547, 32000, 0.0359, 640) - 1.68) < 0.01);
	assert_true(fabs(sim_zscore(1547, 32000, 0.0359, 32000) - 8.46) < 0.01);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_layout_3d),
	    cmocka_unit_test(test_layout_free_forms),
	    cmocka_unit_test(test_layout_errors),
	    cmocka_unit_test(test_two_gpus_two_collectives),
	    cmocka_unit_test(test_two_gpus_three_collectives),
	    cmocka_unit_test(test_independent_groups),
	    cmocka_unit_test(test_fast_matches_literal),
	    cmocka_unit_test(test_shortcut_over_reports),
	    cmocka_unit_test(test_threads_do_not_matter),
	    cmocka_unit_test(test_sequences_single_queue),
	    cmocka_unit_test(test_sequences_sync),
	    cmocka_unit_test(test_sequences_flight_recorder),
	    cmocka_unit_test(test_flight_recorder_dumps),
	    cmocka_unit_test(test_statistics),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
