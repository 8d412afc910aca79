/*
 * Rings: NVLink only on the DGX-1 hybrid cube-mesh, the inter-socket link
 * crossed only twice on the PCIe dual-socket node, every pair alike on
 * NVSwitch, later rings spread over free links, and on random topologies
 * every ring is a permutation of the ranks. Crossings and link kinds are
 * counted here from the ring orders.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "topo_fixture.h"

static void assert_permutation(const struct topo_ring *r, unsigned n)
{
	int seen[TOPO_MAX_RANKS] = {0};
	assert_int_equal(r->n, n);
	for (unsigned i = 0; i < n; i++) {
		assert_true(r->order[i] < n);
		assert_false(seen[r->order[i]]);
		seen[r->order[i]] = 1;
	}
}

static void test_cube_mesh_rings_nvlink_only(void **state)
{
	struct topo_model *m = fixture_model("dgx1-cube-mesh.json");
	struct topo_ring rings[4];
	assert_int_equal(topo_rings(m, fixture_identity(), 8, 4, TOPO_TREE_PENALTY, rings), 0);
	for (unsigned k = 0; k < 4; k++) {
		assert_permutation(&rings[k], 8);
		for (unsigned i = 0; i < 8; i++) {
			unsigned a = rings[k].order[i], b = rings[k].order[(i + 1) % 8];
			if (topo_model_link(m, a, b)->type != TOPO_LINK_NVLINK)
				fail_msg("ring %u: hop %u-%u is not an NVLink", k, a, b);
		}
		assert_true(rings[k].bw_gbps >= 25);
	}
	/* Four GPUs of one quad are all NVLinked: a ring over them too. */
	static const unsigned quad[] = {4, 5, 6, 7};
	assert_int_equal(topo_rings(m, quad, 4, 1, 1.0, rings), 0);
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(topo_model_link(m, quad[rings[0].order[i]], quad[rings[0].order[(i + 1) % 4]])->type,
		                 TOPO_LINK_NVLINK);
	topo_model_free(m);
}

static void test_dual_socket_crosses_twice(void **state)
{
	struct topo_model *m = fixture_model("pcie-dual-socket-8.json");
	struct topo_ring rings[2];
	assert_int_equal(topo_rings(m, fixture_identity(), 8, 2, TOPO_TREE_PENALTY, rings), 0);
	for (unsigned k = 0; k < 2; k++) {
		assert_permutation(&rings[k], 8);
		unsigned crossings = 0;
		for (unsigned i = 0; i < 8; i++) {
			/* GPUs 0-3 hang off socket 0, 4-7 off socket 1. */
			unsigned a = rings[k].order[i], b = rings[k].order[(i + 1) % 8];
			crossings += (a / 4) != (b / 4);
		}
		assert_int_equal(crossings, 2);
	}
	topo_model_free(m);
}

static void test_nvswitch_all_pairs_equal(void **state)
{
	struct topo_model *m = fixture_model("nvswitch-8.json");
	const struct topo_link *first = topo_model_link(m, 0, 1);
	for (unsigned a = 0; a < 8; a++) {
		for (unsigned b = 0; b < 8; b++) {
			if (a == b)
				continue;
			const struct topo_link *l = topo_model_link(m, a, b);
			assert_int_equal(l->type, TOPO_LINK_NVSWITCH);
			assert_true(l->bw_gbps == first->bw_gbps && l->lat_us == first->lat_us);
			assert_int_equal(l->nvlinks, first->nvlinks);
		}
	}
	struct topo_ring ring;
	assert_int_equal(topo_rings(m, fixture_identity(), 8, 1, 1.0, &ring), 0);
	assert_permutation(&ring, 8);
	assert_true(ring.bw_gbps == first->bw_gbps);
	topo_model_free(m);
}

static void test_random_rings_are_permutations(void **state)
{
	srand(777);
	for (int iter = 0; iter < 100; iter++) {
		unsigned n = 1 + (unsigned)rand() % (iter < 70 ? 10 : 40);
		struct topo_model *m;
		assert_int_equal(topo_model_new(n, &m), 0);
		for (unsigned a = 0; a < n; a++) {
			for (unsigned b = a + 1; b < n; b++) {
				struct topo_link l = {.type = TOPO_LINK_PHB, .bw_gbps = 5.0 + rand() % 4 * 10, .lat_us = 1};
				topo_model_set_link(m, a, b, &l);
			}
		}
		struct topo_ring rings[3];
		assert_int_equal(topo_rings(m, fixture_identity(), n, 3, TOPO_TREE_PENALTY, rings), 0);
		for (unsigned k = 0; k < 3; k++) {
			assert_permutation(&rings[k], n);
			/* Its bandwidth is that of its slowest hop. */
			double min = n == 1 ? TOPO_SELF_GBPS : 1e30;
			for (unsigned i = 0; n > 1 && i < n; i++) {
				double bw = topo_model_link(m, rings[k].order[i], rings[k].order[(i + 1) % n])->bw_gbps;
				min = bw < min ? bw : min;
			}
			assert_true(rings[k].bw_gbps == min);
		}
		topo_model_free(m);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cube_mesh_rings_nvlink_only),
	    cmocka_unit_test(test_dual_socket_crosses_twice),
	    cmocka_unit_test(test_nvswitch_all_pairs_equal),
	    cmocka_unit_test(test_random_rings_are_permutations),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
