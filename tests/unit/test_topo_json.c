/*
 * Topology model files: every shipped synthetic model loads and says what
 * it should, a dump loads back into the same model, a whole topology
 * document loads as its model, and invalid files fail with a message that
 * names the field at fault.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "topo_fixture.h"

static const struct {
	const char *file;
	unsigned ndev;
} shipped[] = {
    {"dgx1-cube-mesh.json", 8}, {"nvswitch-8.json", 8}, {"pcie-dual-socket-8.json", 8},
    {"pcie-4.json", 4},         {"two-gpu.json", 2},
};
#define NSHIPPED (sizeof(shipped) / sizeof(shipped[0]))

static void test_load_shipped(void **state)
{
	for (size_t i = 0; i < NSHIPPED; i++) {
		struct topo_model *m = fixture_model(shipped[i].file);
		assert_int_equal(m->ndev, shipped[i].ndev);
		for (unsigned a = 0; a < m->ndev; a++) {
			assert_int_equal(topo_model_link(m, a, a)->type, TOPO_LINK_SELF);
			for (unsigned b = 0; b < m->ndev; b++)
				if (a != b)
					assert_true(topo_model_link(m, a, b)->bw_gbps > 0);
		}
		topo_model_free(m);
	}
	/* Spot checks against the DGX-1V matrix: GPU0-GPU3 is NV2, GPU0-GPU1
	 * NV1, GPU0-GPU5 goes through the CPUs. */
	struct topo_model *m = fixture_model("dgx1-cube-mesh.json");
	char label[16];
	topo_link_label(topo_model_link(m, 0, 3), label, sizeof(label));
	assert_string_equal(label, "NV2");
	assert_true(topo_model_link(m, 3, 0)->bw_gbps == 50);
	topo_link_label(topo_model_link(m, 1, 0), label, sizeof(label));
	assert_string_equal(label, "NV1");
	topo_link_label(topo_model_link(m, 0, 5), label, sizeof(label));
	assert_string_equal(label, "SYS");
	assert_true(topo_model_link(m, 5, 0)->bw_gbps == 10);
	assert_int_equal(m->dev[6].numa_node, 1);
	assert_int_equal(m->nnic, 2);
	topo_model_free(m);
}

static void assert_same_model(const struct topo_model *x, const struct topo_model *y)
{
	assert_string_equal(x->name, y->name);
	assert_int_equal(x->ndev, y->ndev);
	for (unsigned i = 0; i < x->ndev; i++) {
		assert_string_equal(x->dev[i].name, y->dev[i].name);
		assert_string_equal(x->dev[i].pci_bus_id, y->dev[i].pci_bus_id);
		assert_string_equal(x->dev[i].cpu_affinity, y->dev[i].cpu_affinity);
		assert_int_equal(x->dev[i].numa_node, y->dev[i].numa_node);
		for (unsigned j = 0; j < x->ndev; j++) {
			const struct topo_link *a = topo_model_link(x, i, j), *b = topo_model_link(y, i, j);
			assert_int_equal(a->type, b->type);
			assert_int_equal(a->nvlinks, b->nvlinks);
			assert_int_equal(a->nvlink_gen, b->nvlink_gen);
			assert_true(a->bw_gbps == b->bw_gbps);
			assert_true(a->lat_us == b->lat_us);
		}
	}
	assert_int_equal(x->nnic, y->nnic);
	for (unsigned i = 0; i < x->nnic; i++) {
		assert_string_equal(x->nic[i].name, y->nic[i].name);
		assert_true(x->nic[i].bw_gbps == y->nic[i].bw_gbps);
	}
}

static void test_round_trip(void **state)
{
	char err[512];
	for (size_t i = 0; i < NSHIPPED; i++) {
		struct topo_model *m = fixture_model(shipped[i].file), *back;
		char *text = topo_json_dump(m);
		assert_non_null(text);
		assert_int_equal(topo_json_parse(text, &back, err, sizeof(err)), 0);
		assert_same_model(m, back);
		/* ...and a second dump is the same text. */
		char *again = topo_json_dump(back);
		assert_string_equal(text, again);
		free(again);
		free(text);
		topo_model_free(back);
		topo_model_free(m);
	}
	/* The host engine's model round-trips too (its own link type). */
	struct topo_model *h, *back;
	assert_int_equal(topo_model_host(5, &h), 0);
	char *text = topo_json_dump(h);
	assert_int_equal(topo_json_parse(text, &back, err, sizeof(err)), 0);
	assert_same_model(h, back);
	assert_int_equal(topo_model_link(back, 1, 4)->type, TOPO_LINK_HOST);
	free(text);
	topo_model_free(back);
	topo_model_free(h);
}

static void test_document_loads_as_model(void **state)
{
	struct topo_model *m = fixture_model("pcie-4.json"), *back;
	struct topo_ring ring;
	struct topo_tree tree;
	struct topo_select_table *t;
	char err[512];
	assert_int_equal(topo_rings(m, fixture_identity(), 4, 1, 1.0, &ring), 0);
	assert_int_equal(topo_trees(m, fixture_identity(), 4, 1, 1.0, &tree), 0);
	assert_int_equal(topo_select_table_build(m, fixture_identity(), 4, NULL, &t), 0);
	char *doc = topo_json_document(m, &ring, 1, &tree, 1, t);
	assert_non_null(doc);
	assert_non_null(strstr(doc, "\"rings\""));
	assert_non_null(strstr(doc, "\"selection\""));
	assert_int_equal(topo_json_parse(doc, &back, err, sizeof(err)), 0);
	assert_same_model(m, back);
	free(doc);
	topo_model_free(back);
	topo_select_table_free(t);
	topo_model_free(m);
}

#define DEV2 "\"devices\": [{\"index\": 0}, {\"index\": 1}]"
#define LINK01 "{\"a\": 0, \"b\": 1, \"type\": \"pix\", \"bw_gbps\": 20, \"lat_us\": 1}"

static void test_bad_files(void **state)
{
	static const struct {
		const char *text, *expect;
	} bad[] = {
	    {"{\"version\": 1, " DEV2, "not valid JSON"},
	    {"{" DEV2 ", \"links\": [" LINK01 "]}", "missing required field 'version'"},
	    {"{\"version\": 2, " DEV2 ", \"links\": [" LINK01 "]}", "version: 2 is not supported"},
	    {"{\"version\": 1, \"devices\": [{\"index\": 0}, {\"index\": 1, \"nmae\": \"x\"}], \"links\": [" LINK01 "]}",
	     "devices[1]: unknown field 'nmae'"},
	    {"{\"version\": 1, \"devices\": [{\"index\": 0}, {\"index\": 2}], \"links\": [" LINK01 "]}",
	     "devices[1].index: 2 differs from its position 1"},
	    {"{\"version\": 1, " DEV2 ", \"links\": [{\"a\": 0, \"b\": 1, \"type\": \"nvlnk\", \"bw_gbps\": 20, "
	     "\"lat_us\": 1}]}",
	     "links[0].type: 'nvlnk' is not one of"},
	    {"{\"version\": 1, " DEV2 ", \"links\": [{\"a\": 0, \"b\": 1, \"type\": \"nvlink\", \"bw_gbps\": 20, "
	     "\"lat_us\": 1}]}",
	     "links[0]: missing required field 'nvlinks'"},
	    {"{\"version\": 1, " DEV2 ", \"links\": [{\"a\": 0, \"b\": 1, \"type\": \"pix\", \"bw_gbps\": 0, "
	     "\"lat_us\": 1}]}",
	     "links[0].bw_gbps: 0 must be greater than 0"},
	    {"{\"version\": 1, " DEV2 ", \"links\": [{\"a\": 0, \"b\": 5, \"type\": \"pix\", \"bw_gbps\": 1, "
	     "\"lat_us\": 1}]}",
	     "links[0].b: 5 is outside [0, 1]"},
	    {"{\"version\": 1, " DEV2 ", \"links\": [{\"a\": 1, \"b\": 1, \"type\": \"pix\", \"bw_gbps\": 1, "
	     "\"lat_us\": 1}]}",
	     "links[0]: links join two different devices"},
	    {"{\"version\": 1, " DEV2 ", \"links\": [" LINK01 ", {\"a\": 1, \"b\": 0, \"type\": \"sys\", \"bw_gbps\": 1, "
	     "\"lat_us\": 1}]}",
	     "links[1]: devices 0 and 1 already have a link (links[0])"},
	    {"{\"version\": 1, \"devices\": [{\"index\": 0}, {\"index\": 1}, {\"index\": 2}], \"links\": [" LINK01 "]}",
	     "devices 0 and 2 have no link"},
	    {"{\"version\": 1, " DEV2 ", \"links\": [" LINK01 "], \"nics\": [{\"bw_gbps\": 12}]}",
	     "nics[0]: missing required field 'name'"},
	    {"{\"version\": 1, \"devices\": [], \"links\": []}", "devices: has 0 entries"},
	    {"[1, 2]", "expected an object"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char err[512] = "";
		struct topo_model *m = (struct topo_model *)1;
		int rc = topo_json_parse(bad[i].text, &m, err, sizeof(err));
		if (rc != -EINVAL || !strstr(err, bad[i].expect))
			fail_msg("case %zu: rc %d, message \"%s\", expected one containing \"%s\"", i, rc, err, bad[i].expect);
		assert_null(m);
	}
	/* The good one, for contrast. */
	char err[512];
	struct topo_model *m;
	assert_int_equal(topo_json_parse("{\"version\": 1, " DEV2 ", \"links\": [" LINK01 "]}", &m, err, sizeof(err)), 0);
	topo_model_free(m);
}

static void test_file_errors_name_the_file(void **state)
{
	char err[512] = "", path[] = "/tmp/dfccl-topo-XXXXXX";
	struct topo_model *m;
	assert_int_equal(topo_json_load_file("/nonexistent/model.json", &m, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/model.json"));
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	FILE *f = fdopen(fd, "w");
	fputs("{\"version\": 1, \"devices\": [{\"index\": 0}], \"links\": [], \"extra\": 1}", f);
	fclose(f);
	assert_int_equal(topo_json_load_file(path, &m, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "unknown field 'extra'"));
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_load_shipped),
	    cmocka_unit_test(test_round_trip),
	    cmocka_unit_test(test_document_loads_as_model),
	    cmocka_unit_test(test_bad_files),
	    cmocka_unit_test(test_file_errors_name_the_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
