/*
 * Trees: on the DGX-1 hybrid cube-mesh every tree edge is an NVLink and
 * every tree is balanced (three levels for eight GPUs), and the link-usage
 * penalty makes later trees reuse fewer links; on random topologies every
 * tree spans all ranks exactly once with the minimal height. Expectations
 * are computed here from the trees' parent/level arrays, not by the code
 * under test.
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

/* The NVLink pairs of a DGX-1V, from its nvidia-smi topo -m matrix. */
static int dgx1_nvlink(unsigned a, unsigned b)
{
	static const unsigned char pairs[][2] = {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 2}, {1, 3}, {1, 5}, {2, 3},
	                                         {2, 6}, {3, 7}, {4, 5}, {4, 6}, {4, 7}, {5, 6}, {5, 7}, {6, 7}};
	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
		if ((pairs[i][0] == a && pairs[i][1] == b) || (pairs[i][0] == b && pairs[i][1] == a))
			return 1;
	return 0;
}

/*
 * Checks that t is a valid level-structured tree over n ranks and returns
 * its height: the root has no parent, every other rank reaches the root by
 * parents without a cycle, a rank joins at a level deeper than its parent
 * did (so it has its whole subtree reduced before its own step), and no
 * rank gets two children at one level (each split joins one rank).
 */
static unsigned checked_height(const struct topo_tree *t, unsigned n)
{
	assert_int_equal(t->n, n);
	assert_true(t->root < n);
	assert_int_equal(t->parent[t->root], -1);
	assert_int_equal(t->level[t->root], 0);
	unsigned height = 0;
	for (unsigned r = 0; r < n; r++) {
		if (r == t->root)
			continue;
		assert_true(t->parent[r] >= 0 && (unsigned)t->parent[r] < n);
		unsigned p = (unsigned)t->parent[r];
		assert_true(t->level[r] > t->level[p]);
		height = t->level[r] > height ? t->level[r] : height;
		unsigned x = r, steps = 0;
		while (x != t->root) {
			x = (unsigned)t->parent[x];
			assert_true(++steps <= n);
		}
		for (unsigned s = 0; s < n; s++)
			if (s != r && s != t->root && t->parent[s] == t->parent[r])
				assert_int_not_equal(t->level[s], t->level[r]);
	}
	return height;
}

static unsigned ceil_log2(unsigned n)
{
	unsigned h = 0;
	for (unsigned x = 1; x < n; x *= 2)
		h++;
	return h;
}

static void test_cube_mesh_trees(void **state)
{
	struct topo_model *m = fixture_model("dgx1-cube-mesh.json");
	struct topo_tree trees[8];
	assert_int_equal(topo_trees(m, fixture_identity(), 8, 8, TOPO_TREE_PENALTY, trees), 0);
	for (unsigned k = 0; k < 8; k++) {
		assert_int_equal(trees[k].root, k);
		assert_int_equal(checked_height(&trees[k], 8), 3);
		for (unsigned r = 0; r < 8; r++)
			if (trees[k].parent[r] >= 0 && !dgx1_nvlink(r, (unsigned)trees[k].parent[r]))
				fail_msg("tree %u: edge %u-%d is not an NVLink", k, r, trees[k].parent[r]);
		assert_true(trees[k].bw_gbps >= 25);
	}
	topo_model_free(m);
}

/* Edges of trees 1.. that some earlier tree already used. */
static unsigned reused_links(const struct topo_tree *trees, unsigned ntrees, unsigned n)
{
	int used[8][8] = {{0}};
	unsigned reused = 0;
	for (unsigned k = 0; k < ntrees; k++) {
		for (unsigned r = 0; r < n; r++) {
			if (trees[k].parent[r] < 0)
				continue;
			unsigned p = (unsigned)trees[k].parent[r];
			reused += used[r][p] ? 1 : 0;
		}
		for (unsigned r = 0; r < n; r++) {
			if (trees[k].parent[r] < 0)
				continue;
			unsigned p = (unsigned)trees[k].parent[r];
			used[r][p] = used[p][r] = 1;
		}
	}
	return reused;
}

static void test_penalty_spreads_trees(void **state)
{
	struct topo_model *m = fixture_model("dgx1-cube-mesh.json");
	struct topo_tree with[8], without[8];
	assert_int_equal(topo_trees(m, fixture_identity(), 8, 8, TOPO_TREE_PENALTY, with), 0);
	assert_int_equal(topo_trees(m, fixture_identity(), 8, 8, 1.0, without), 0);
	unsigned a = reused_links(with, 8, 8), b = reused_links(without, 8, 8);
	print_message("links reused by later trees: %u with the penalty, %u without\n", a, b);
	assert_true(a < b);
	topo_model_free(m);
}

static void test_tree_forbidden_pairs(void **state)
{
	/* Four ranks on a path 0-1-2-3, every other pair forbidden. From 0
	 * the halves are {0, x} and {v, y} with 0-v allowed, so v = 1, and
	 * {0, x} then needs a second pair from 0: there is none. From 1 it
	 * works: {1, 0} and {2, 3}, joined by 1-2. */
	double w[16] = {0};
	for (unsigned i = 0; i + 1 < 4; i++)
		w[i * 4 + i + 1] = w[(i + 1) * 4 + i] = 10;
	struct topo_tree t;
	assert_int_equal(topo_tree_build(w, 4, 0, &t), -ENOENT);
	assert_int_equal(topo_tree_build(w, 4, 1, &t), 0);
	assert_int_equal(checked_height(&t, 4), 2);
	assert_int_equal(t.parent[0], 1);
	assert_int_equal(t.parent[2], 1);
	assert_int_equal(t.parent[3], 2);
}

static void test_random_topologies(void **state)
{
	static const double classes[] = {6, 12, 25, 50, 100};
	static const enum topo_link_type types[] = {TOPO_LINK_SYS, TOPO_LINK_PHB, TOPO_LINK_NVLINK, TOPO_LINK_NVLINK,
	                                            TOPO_LINK_NVLINK};
	srand(12345);
	for (int iter = 0; iter < 200; iter++) {
		unsigned n = 1 + (unsigned)rand() % (iter < 150 ? 12 : 24);
		struct topo_model *m;
		assert_int_equal(topo_model_new(n, &m), 0);
		for (unsigned a = 0; a < n; a++) {
			for (unsigned b = a + 1; b < n; b++) {
				unsigned c = (unsigned)rand() % 5;
				struct topo_link l = {.type = types[c], .nvlinks = c >= 2 ? c - 1 : 0, .bw_gbps = classes[c],
				                      .lat_us = 1};
				topo_model_set_link(m, a, b, &l);
			}
		}
		/* Several ranks on one device, now and then. */
		unsigned rank_dev[TOPO_MAX_RANKS], nranks = n;
		for (unsigned r = 0; r < n; r++)
			rank_dev[r] = r;
		if (iter % 10 == 0 && n > 1) {
			nranks = n + 2;
			rank_dev[n] = 0;
			rank_dev[n + 1] = n - 1;
		}
		unsigned ntrees = nranks < TOPO_MAX_TREES ? nranks : TOPO_MAX_TREES;
		struct topo_tree trees[TOPO_MAX_TREES];
		assert_int_equal(topo_trees(m, rank_dev, nranks, ntrees, TOPO_TREE_PENALTY, trees), 0);
		for (unsigned k = 0; k < ntrees; k++) {
			assert_int_equal(trees[k].root, k % nranks);
			assert_int_equal(checked_height(&trees[k], nranks), ceil_log2(nranks));
			assert_int_equal(trees[k].height, ceil_log2(nranks));
		}
		topo_model_free(m);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cube_mesh_trees),
	    cmocka_unit_test(test_penalty_spreads_trees),
	    cmocka_unit_test(test_tree_forbidden_pairs),
	    cmocka_unit_test(test_random_topologies),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
