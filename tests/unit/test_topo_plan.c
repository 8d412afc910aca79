/*
 * The communicator plan (topology/topo_plan.h) on the shipped models: the
 * ring and every tree edge use NVLink on the cube-mesh, the trees have
 * distinct roots, the table follows the forced algorithm and the tuning
 * file, several ranks may share a device, bad input is refused, and the
 * host engine accepts every plan the topology produces (algo_topo_load
 * checks them independently of how they were built).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "algo.h"
#include "topo_fixture.h"
#include "topo_plan.h"

static void check_nvlink(const struct topo_model *m, unsigned a, unsigned b)
{
	if (!topo_link_is_nvlink(topo_model_link(m, a, b)))
		fail_msg("%u-%u is not an NVLink edge", a, b);
}

static void test_cube_mesh(void **state)
{
	(void)state;
	struct topo_model *m = fixture_model("dgx1-cube-mesh.json");
	struct dfccl_comm_plan p;
	char err[256];
	assert_int_equal(topo_plan_build(m, fixture_identity(), 8, NULL, NULL, &p, err, sizeof(err)), 0);
	assert_int_equal(p.valid, DFCCL_PLAN_VALID);
	assert_int_equal(p.ntrees, DFCCL_PLAN_TREES);
	unsigned seen = 0;
	for (unsigned i = 0; i < 8; i++) {
		seen |= 1u << p.ring[i];
		check_nvlink(m, p.ring[i], p.ring[(i + 1) % 8]);
	}
	assert_int_equal(seen, 0xff);
	unsigned roots = 0;
	for (unsigned k = 0; k < p.ntrees; k++)
		for (unsigned r = 0; r < 8; r++) {
			if (p.parent[k][r] == DFCCL_PLAN_NO_PARENT)
				roots |= 1u << r;
			else
				check_nvlink(m, r, p.parent[k][r]);
		}
	assert_int_equal(__builtin_popcount(roots), DFCCL_PLAN_TREES); /* one root per tree, all distinct */
	struct algo_topo t;
	assert_int_equal(algo_topo_load(&t, &p, 8), 0);
	assert_int_equal(t.planned, 1);
	topo_model_free(m);
}

static void test_forced_and_tuned(void **state)
{
	(void)state;
	struct topo_model *m = fixture_model("nvswitch-8.json");
	struct topo_select_params sp;
	topo_select_params_default(&sp);
	struct dfccl_comm_plan p;
	char err[256];
	sp.force = TOPO_FORCE_RING;
	assert_int_equal(topo_plan_build(m, fixture_identity(), 8, &sp, NULL, &p, err, sizeof(err)), 0);
	for (unsigned c = 0; c < DFCCL_PLAN_COLLS; c++)
		for (unsigned b = 0; b < DFCCL_PLAN_BUCKETS; b++)
			assert_int_equal(p.algo[c][b], DFCCL_ALGO_RING);
	sp.force = TOPO_FORCE_TREE;
	assert_int_equal(topo_plan_build(m, fixture_identity(), 8, &sp, NULL, &p, err, sizeof(err)), 0);
	for (unsigned b = 0; b < DFCCL_PLAN_BUCKETS; b++) {
		assert_int_equal(p.algo[TOPO_COLL_ALLREDUCE][b], DFCCL_ALGO_TREE);
		assert_int_equal(p.algo[TOPO_COLL_REDUCE][b], DFCCL_ALGO_TREE);
		assert_int_not_equal(p.algo[TOPO_COLL_ALLGATHER][b], DFCCL_ALGO_TREE); /* where it applies */
	}
	/* A tuning file: all-reduce of 8 ranks up to 1 KiB over a tree; an entry
	 * for 4 ranks does not touch an 8-rank plan. */
	static const char tuning[] =
	    "{\"version\": 1, \"entries\": ["
	    "{\"coll\": \"allreduce\", \"nranks\": 8, \"max_bytes\": 1024, \"algo\": \"tree\", \"channels\": 1},"
	    "{\"coll\": \"allgather\", \"nranks\": 4, \"algo\": \"ring\", \"channels\": 1}]}";
	struct dfccl_comm_plan base;
	assert_int_equal(topo_plan_build(m, fixture_identity(), 8, NULL, NULL, &base, err, sizeof(err)), 0);
	assert_int_equal(topo_plan_build(m, fixture_identity(), 8, NULL, tuning, &p, err, sizeof(err)), 0);
	for (unsigned b = 0; b < DFCCL_PLAN_BUCKETS; b++) {
		uint8_t want = b <= dfccl_size_bucket(1024) ? DFCCL_ALGO_TREE : base.algo[TOPO_COLL_ALLREDUCE][b];
		assert_int_equal(p.algo[TOPO_COLL_ALLREDUCE][b], want);
		assert_int_equal(p.algo[TOPO_COLL_ALLGATHER][b], base.algo[TOPO_COLL_ALLGATHER][b]);
	}
	/* and the forced algorithm beats the tuning file */
	sp.force = TOPO_FORCE_RING;
	assert_int_equal(topo_plan_build(m, fixture_identity(), 8, &sp, tuning, &p, err, sizeof(err)), 0);
	assert_int_equal(p.algo[TOPO_COLL_ALLREDUCE][0], DFCCL_ALGO_RING);
	topo_model_free(m);
}

static void test_shared_devices_and_errors(void **state)
{
	(void)state;
	struct topo_model *m = fixture_model("pcie-4.json");
	struct dfccl_comm_plan p;
	char err[256];
	/* 8 ranks on 4 GPUs, two per GPU, in an odd order */
	static const unsigned dev[8] = {3, 1, 0, 2, 0, 1, 3, 2};
	assert_int_equal(topo_plan_build(m, dev, 8, NULL, NULL, &p, err, sizeof(err)), 0);
	struct algo_topo t;
	assert_int_equal(algo_topo_load(&t, &p, 8), 0);
	/* one rank: nothing to exchange */
	assert_int_equal(topo_plan_build(m, dev, 1, NULL, NULL, &p, err, sizeof(err)), 0);
	assert_int_equal(p.ntrees, 1);
	assert_int_equal(p.parent[0][0], DFCCL_PLAN_NO_PARENT);
	assert_int_equal(p.algo[0][5], DFCCL_ALGO_DIRECT);
	assert_int_equal(algo_topo_load(&t, &p, 1), 0);
	/* refused: no ranks, too many, a device the model lacks, a bad tuning file */
	assert_int_equal(topo_plan_build(m, dev, 0, NULL, NULL, &p, err, sizeof(err)), -EINVAL);
	assert_int_equal(topo_plan_build(m, dev, DFCCL_COMM_MAX_RANKS + 1, NULL, NULL, &p, err, sizeof(err)), -EINVAL);
	static const unsigned bad_dev[2] = {0, 7};
	assert_int_equal(topo_plan_build(m, bad_dev, 2, NULL, NULL, &p, err, sizeof(err)), -EINVAL);
	assert_int_equal(topo_plan_build(m, dev, 4, NULL, "{\"version\": 1, \"entries\": [{\"coll\": \"x\"}]}", &p, err,
	                                 sizeof(err)),
	                 -EINVAL);
	assert_non_null(strstr(err, "entries[0]"));
	topo_model_free(m);
}

/* Every shipped model, every rank count: the engine takes the plan as it is. */
static void test_engine_accepts(void **state)
{
	(void)state;
	static const char *const files[] = {"dgx1-cube-mesh.json", "nvswitch-8.json", "pcie-dual-socket-8.json",
	                                    "pcie-4.json", "two-gpu.json"};
	for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
		struct topo_model *m = fixture_model(files[f]);
		for (unsigned n = 1; n <= m->ndev; n++) {
			struct dfccl_comm_plan p;
			char err[256];
			assert_int_equal(topo_plan_build(m, fixture_identity(), n, NULL, NULL, &p, err, sizeof(err)), 0);
			struct algo_topo t;
			if (algo_topo_load(&t, &p, n) != 0)
				fail_msg("%s, %u ranks: the engine refused the plan", files[f], n);
		}
		topo_model_free(m);
	}
	/* and refuses one that is damaged */
	struct dfccl_comm_plan p;
	struct algo_topo t;
	char err[256];
	struct topo_model *m = fixture_model("two-gpu.json");
	assert_int_equal(topo_plan_build(m, fixture_identity(), 2, NULL, NULL, &p, err, sizeof(err)), 0);
	p.parent[1][0] = p.parent[1][1] = 0; /* a node its own parent */
	assert_int_equal(algo_topo_load(&t, &p, 2), -EINVAL);
	assert_int_equal(t.planned, 0);
	p.valid = 0;
	assert_int_equal(algo_topo_load(&t, &p, 2), -ENOENT);
	topo_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cube_mesh),
	    cmocka_unit_test(test_forced_and_tuned),
	    cmocka_unit_test(test_shared_devices_and_errors),
	    cmocka_unit_test(test_engine_accepts),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
