/*
 * The selection table: latency-bound sizes get a latency algorithm and
 * bandwidth-bound sizes a bandwidth one, every choice can run its
 * collective, the `algo` setting forces a family, tuning files override
 * entries (and a shown table loads back as a tuning file), and bad tuning
 * files name the field at fault.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "topo_fixture.h"

static struct topo_select_table *build(const char *file, unsigned nranks, int force)
{
	struct topo_model *m = fixture_model(file);
	struct topo_select_params p;
	topo_select_params_default(&p);
	p.force = force;
	struct topo_select_table *t;
	assert_int_equal(topo_select_table_build(m, fixture_identity(), nranks, &p, &t), 0);
	topo_model_free(m);
	return t;
}

static struct topo_choice pick(const struct topo_select_table *t, enum topo_coll c, unsigned n, uint64_t bytes)
{
	struct topo_choice ch;
	assert_int_equal(topo_select(t, c, n, bytes, &ch), 0);
	return ch;
}

static void test_small_and_large(void **state)
{
	static const char *const files[] = {"dgx1-cube-mesh.json", "nvswitch-8.json", "pcie-dual-socket-8.json"};
	for (size_t f = 0; f < 3; f++) {
		struct topo_select_table *t = build(files[f], 8, TOPO_FORCE_AUTO);
		struct topo_choice small = pick(t, TOPO_COLL_ALLREDUCE, 8, 8), big = pick(t, TOPO_COLL_ALLREDUCE, 8, 1ull << 30);
		print_message("%s: 8 B -> %s/%u, 1 GiB -> %s/%u\n", files[f], topo_algo_name(small.algo), small.channels,
		              topo_algo_name(big.algo), big.channels);
		/* A ring of 8 takes 14 steps: never the latency choice. A single
		 * tree moves the whole buffer per level: never the bandwidth one. */
		assert_int_not_equal(small.algo, TOPO_ALGO_RING);
		assert_int_equal(small.channels, 1);
		assert_int_not_equal(big.algo, TOPO_ALGO_TREE);
		assert_int_not_equal(big.algo, TOPO_ALGO_DIRECT_ONESHOT);
		assert_true(big.channels > 1);
		for (int c = 0; c < TOPO_COLL_COUNT_; c++)
			for (unsigned n = 2; n <= 8; n++)
				for (unsigned b = 0; b < 41; b++) {
					struct topo_choice ch = pick(t, (enum topo_coll)c, n, (uint64_t)1 << b);
					assert_true(topo_algo_valid((enum topo_coll)c, ch.algo));
					assert_true(ch.channels >= 1);
				}
		topo_select_table_free(t);
	}
}

static void test_edges_of_the_table(void **state)
{
	struct topo_select_table *t = build("pcie-4.json", 4, TOPO_FORCE_AUTO);
	struct topo_choice ch;
	assert_int_equal(topo_select(t, TOPO_COLL_ALLREDUCE, 1, 1 << 20, &ch), 0);
	assert_int_equal(ch.algo, TOPO_ALGO_DIRECT_ONESHOT);
	assert_int_equal(ch.channels, 1);
	/* More ranks than the table knows: its last row answers. */
	struct topo_choice last = pick(t, TOPO_COLL_ALLGATHER, 4, 1 << 20), more = pick(t, TOPO_COLL_ALLGATHER, 9, 1 << 20);
	assert_int_equal(last.algo, more.algo);
	assert_int_equal(last.channels, more.channels);
	assert_int_equal(topo_select(t, TOPO_COLL_COUNT_, 4, 1, &ch), -EINVAL);
	assert_int_equal(topo_select(t, TOPO_COLL_ALLREDUCE, 0, 1, &ch), -EINVAL);
	assert_int_equal(topo_size_bucket(0), 0);
	assert_int_equal(topo_size_bucket(1), 0);
	assert_int_equal(topo_size_bucket(2), 1);
	assert_int_equal(topo_size_bucket(3), 2);
	assert_int_equal(topo_size_bucket(UINT64_MAX), TOPO_SIZE_BUCKETS - 1);
	topo_select_table_free(t);
}

static void test_forced(void **state)
{
	struct topo_select_table *t = build("dgx1-cube-mesh.json", 8, TOPO_FORCE_RING);
	for (int c = 0; c < TOPO_COLL_COUNT_; c++)
		for (unsigned b = 0; b < 41; b += 5)
			assert_int_equal(pick(t, (enum topo_coll)c, 8, (uint64_t)1 << b).algo, TOPO_ALGO_RING);
	topo_select_table_free(t);

	/* Trees cannot all-gather: forcing them leaves all-gather to the cost model. */
	t = build("dgx1-cube-mesh.json", 8, TOPO_FORCE_TREE);
	assert_int_equal(pick(t, TOPO_COLL_ALLREDUCE, 8, 1ull << 30).algo, TOPO_ALGO_TREE);
	assert_int_equal(pick(t, TOPO_COLL_BROADCAST, 8, 4).algo, TOPO_ALGO_TREE);
	assert_true(topo_algo_valid(TOPO_COLL_ALLGATHER, pick(t, TOPO_COLL_ALLGATHER, 8, 4).algo));
	/* A forced algorithm beats the tuning file. */
	char err[256];
	assert_true(topo_json_apply_tuning(t,
	                                   "{\"version\": 1, \"entries\": [{\"coll\": \"allreduce\", \"algo\": "
	                                   "\"ring\", \"channels\": 2}]}",
	                                   err, sizeof(err)) >= 0);
	assert_int_equal(pick(t, TOPO_COLL_ALLREDUCE, 8, 1 << 20).algo, TOPO_ALGO_TREE);
	topo_select_table_free(t);

	t = build("dgx1-cube-mesh.json", 8, TOPO_FORCE_DIRECT);
	struct topo_choice a = pick(t, TOPO_COLL_ALLREDUCE, 8, 8), b = pick(t, TOPO_COLL_ALLREDUCE, 8, 1ull << 30);
	assert_true(a.algo == TOPO_ALGO_DIRECT_ONESHOT || a.algo == TOPO_ALGO_DIRECT_TWOSHOT);
	assert_int_equal(b.algo, TOPO_ALGO_DIRECT_TWOSHOT); /* half the bytes of one-shot per rank */
	topo_select_table_free(t);
}

static void test_tuning_overrides(void **state)
{
	struct topo_select_table *t = build("dgx1-cube-mesh.json", 8, TOPO_FORCE_AUTO);
	struct topo_choice before = pick(t, TOPO_COLL_ALLREDUCE, 8, 1 << 20), before6 = pick(t, TOPO_COLL_ALLREDUCE, 6, 512);
	char err[256] = "";
	int rc = topo_json_apply_tuning(t,
	                                "{\"version\": 1, \"entries\": ["
	                                "{\"coll\": \"allreduce\", \"nranks\": 8, \"min_bytes\": 0, \"max_bytes\": 65536,"
	                                " \"algo\": \"multitree\", \"channels\": 4},"
	                                "{\"coll\": \"*\", \"nranks\": 4, \"algo\": \"tree\", \"channels\": 3}]}",
	                                err, sizeof(err));
	assert_int_equal(rc, 2);
	struct topo_choice c = pick(t, TOPO_COLL_ALLREDUCE, 8, 1000);
	assert_int_equal(c.algo, TOPO_ALGO_MULTITREE);
	assert_int_equal(c.channels, 4);
	c = pick(t, TOPO_COLL_ALLREDUCE, 8, 65536);
	assert_int_equal(c.algo, TOPO_ALGO_MULTITREE);
	c = pick(t, TOPO_COLL_ALLREDUCE, 8, 1 << 20);
	assert_int_equal(c.algo, before.algo);
	assert_int_equal(c.channels, before.channels);
	c = pick(t, TOPO_COLL_ALLREDUCE, 6, 512);
	assert_int_equal(c.algo, before6.algo);
	/* "*": every collective that trees can run, at 4 ranks, every size. */
	assert_int_equal(pick(t, TOPO_COLL_REDUCE, 4, 1ull << 35).algo, TOPO_ALGO_TREE);
	assert_int_equal(pick(t, TOPO_COLL_BROADCAST, 4, 0).channels, 3);
	assert_int_not_equal(pick(t, TOPO_COLL_ALLGATHER, 4, 1 << 20).algo, TOPO_ALGO_TREE);
	topo_select_table_free(t);
}

static void test_table_json_loads_back(void **state)
{
	/* The table shown (with tuned entries) is itself a tuning file: loaded
	 * into a table built with other cost parameters, it reproduces every
	 * choice. */
	struct topo_select_table *t = build("pcie-dual-socket-8.json", 8, TOPO_FORCE_AUTO);
	char err[256];
	assert_int_equal(topo_json_apply_tuning(t,
	                                        "{\"version\": 1, \"entries\": [{\"coll\": \"broadcast\", \"nranks\": 5, "
	                                        "\"min_bytes\": 1024, \"max_bytes\": 4096, \"algo\": \"ring\", "
	                                        "\"channels\": 7}]}",
	                                        err, sizeof(err)),
	                 1);
	json_t *j = topo_json_select_table(t);
	char *text = json_dumps(j, 0);
	json_decref(j);

	/* Ranges per (collective, rank count) are contiguous from 0 up. */
	json_t *doc = json_loads(text, 0, NULL);
	json_t *entries = json_object_get(doc, "entries"), *e;
	size_t i;
	uint64_t next = 0;
	const char *coll = "";
	json_int_t nranks = -1;
	json_array_foreach(entries, i, e) {
		const char *ec = json_string_value(json_object_get(e, "coll"));
		json_int_t en = json_integer_value(json_object_get(e, "nranks"));
		if (strcmp(ec, coll) != 0 || en != nranks) {
			assert_true(next == UINT64_MAX || nranks == -1); /* the previous row ended unbounded */
			next = 0;
			coll = ec;
			nranks = en;
		}
		assert_int_equal((uint64_t)json_integer_value(json_object_get(e, "min_bytes")), next);
		json_t *max = json_object_get(e, "max_bytes");
		next = max ? (uint64_t)json_integer_value(max) + 1 : UINT64_MAX;
	}
	assert_true(next == UINT64_MAX);
	json_decref(doc);

	struct topo_model *m = fixture_model("pcie-dual-socket-8.json");
	struct topo_select_params p;
	topo_select_params_default(&p);
	p.step_us = 50;
	p.channel_gbps = 3;
	struct topo_select_table *u;
	assert_int_equal(topo_select_table_build(m, fixture_identity(), 8, &p, &u), 0);
	assert_true(topo_json_apply_tuning(u, text, err, sizeof(err)) > 0);
	for (int c = 0; c < TOPO_COLL_COUNT_; c++)
		for (unsigned n = 2; n <= 8; n++)
			for (unsigned b = 0; b < TOPO_SIZE_BUCKETS; b++) {
				struct topo_choice x = pick(t, (enum topo_coll)c, n, topo_bucket_max(b));
				struct topo_choice y = pick(u, (enum topo_coll)c, n, topo_bucket_max(b));
				assert_int_equal(x.algo, y.algo);
				assert_int_equal(x.channels, y.channels);
			}
	assert_int_equal(pick(u, TOPO_COLL_BROADCAST, 5, 2048).channels, 7);
	free(text);
	topo_select_table_free(u);
	topo_select_table_free(t);
	topo_model_free(m);
}

static void test_bad_tuning(void **state)
{
	static const struct {
		const char *text, *expect;
	} bad[] = {
	    {"{\"entries\": []}", "missing required field 'version'"},
	    {"{\"version\": 1, \"entries\": [{\"coll\": \"allgather\", \"algo\": \"tree\", \"channels\": 1}]}",
	     "entries[0]: tree on 1 channel cannot run allgather"},
	    {"{\"version\": 1, \"entries\": [{\"coll\": \"allreduce\", \"algo\": \"rings\", \"channels\": 1}]}",
	     "entries[0].algo: 'rings' is not an algorithm"},
	    {"{\"version\": 1, \"entries\": [{\"coll\": \"alreduce\", \"algo\": \"ring\", \"channels\": 1}]}",
	     "entries[0].coll: 'alreduce' is not a collective"},
	    {"{\"version\": 1, \"entries\": [{\"coll\": \"allreduce\", \"algo\": \"ring\", \"channels\": 1, "
	     "\"chanels\": 2}]}",
	     "entries[0]: unknown field 'chanels'"},
	    {"{\"version\": 1, \"entries\": [{\"coll\": \"allreduce\", \"algo\": \"ring\"}]}",
	     "entries[0]: missing required field 'channels'"},
	    {"{\"version\": 1, \"entries\": [{\"coll\": \"allreduce\", \"algo\": \"ring\", \"channels\": 1, "
	     "\"min_bytes\": 10, \"max_bytes\": 5}]}",
	     "entries[0]: min_bytes 10 is above max_bytes 5"},
	    {"{\"version\": 1, \"entries\": [{\"coll\": \"allreduce\", \"algo\": \"multitree\", \"channels\": 1}]}",
	     "multitree on 1 channel cannot run allreduce"},
	};
	struct topo_select_table *t = build("two-gpu.json", 2, TOPO_FORCE_AUTO);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char err[256] = "";
		int rc = topo_json_apply_tuning(t, bad[i].text, err, sizeof(err));
		if (rc != -EINVAL || !strstr(err, bad[i].expect))
			fail_msg("case %zu: rc %d, message \"%s\", expected one containing \"%s\"", i, rc, err, bad[i].expect);
	}
	topo_select_table_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_small_and_large),
	    cmocka_unit_test(test_edges_of_the_table),
	    cmocka_unit_test(test_forced),
	    cmocka_unit_test(test_tuning_overrides),
	    cmocka_unit_test(test_table_json_loads_back),
	    cmocka_unit_test(test_bad_tuning),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
