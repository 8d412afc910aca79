/*
 * Topology through the real daemon and dfcclctl: dfccld started with the
 * DGX-1 cube-mesh model on eight host-engine devices shows that model in
 * `dfcclctl --json topo`; `topo --dump` loads back with --topology and
 * dumps the same text; the host engine without a model gets its uniform
 * one; `algo` and `tuning-file` reach the selection table and, through
 * each communicator's plan, the engines; and a model of
 * another device count, or an invalid one, makes dfccld exit non-zero with
 * a message that says why.
 */
#include <errno.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl.h"
#include "dfccl_queue.h"
#include "harness.h"

#define MODELS TOPO_MODELS_DIR

/*
 * Runs argv (NULL-terminated) with stdout and stderr into `out` (a file),
 * waits up to 30 s, and returns the exit status (or -1). The file's text is
 * read into buf.
 */
static int run_capture(const char *const *argv, const char *out, char *buf, size_t len)
{
	pid_t pid = child_exec(argv[0], argv, out, NULL);
	if (pid < 0)
		return -1;
	int rc = child_wait(pid, 30000);
	read_text_file(out, buf, len);
	return rc;
}

/* Writes text to /tmp/dfccl-topo-<what>-<pid>.json; path gets the name. */
static void write_temp(char *path, size_t len, const char *what, const char *text)
{
	snprintf(path, len, "/tmp/dfccl-topo-%s-%d.json", what, (int)getpid());
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* dfcclctl against d with the given arguments (NULL-terminated). */
static int ctl(const struct daemon_proc *d, char *buf, size_t len, ...)
{
	const char *argv[16] = {DFCCLCTL_PATH, "--socket", d->socket};
	int argc = 3;
	va_list ap;
	va_start(ap, len);
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL && argc < 15)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;
	char out[160];
	snprintf(out, sizeof(out), "%s/ctl.out", d->dir);
	return run_capture(argv, out, buf, len);
}

static json_t *topo_json(const struct daemon_proc *d)
{
	static char buf[1 << 20];
	assert_int_equal(ctl(d, buf, sizeof(buf), "--json", "topo", NULL), 0);
	json_error_t je;
	json_t *j = json_loads(buf, 0, &je);
	if (!j)
		fail_msg("dfcclctl --json topo printed no JSON (%s): %.300s", je.text, buf);
	return j;
}

static void test_cube_mesh(void **state)
{
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 8, "--topology", MODELS "/dgx1-cube-mesh.json", NULL), 0);
	json_t *doc = topo_json(&d);
	json_t *model = json_object_get(doc, "model");
	assert_int_equal(json_array_size(json_object_get(model, "devices")), 8);
	/* 16 NVLink pairs in a DGX-1V (six links per GPU: two doubles and two
	 * singles, 4 * 8 / 2 pairs); the other 12 go through the CPUs. */
	size_t i, nvlink = 0, sys = 0;
	json_t *l;
	json_array_foreach(json_object_get(model, "links"), i, l) {
		const char *type = json_string_value(json_object_get(l, "type"));
		nvlink += strcmp(type, "nvlink") == 0;
		sys += strcmp(type, "sys") == 0;
		if (json_integer_value(json_object_get(l, "a")) == 0 && json_integer_value(json_object_get(l, "b")) == 3)
			assert_int_equal(json_integer_value(json_object_get(l, "nvlinks")), 2);
	}
	assert_int_equal(nvlink, 16);
	assert_int_equal(sys, 12);
	assert_int_equal(json_array_size(json_object_get(doc, "trees")), 8);
	assert_true(json_array_size(json_object_get(doc, "rings")) >= 1);
	assert_true(json_array_size(json_object_get(json_object_get(doc, "selection"), "entries")) > 0);
	json_decref(doc);

	static char text[65536];
	assert_int_equal(ctl(&d, text, sizeof(text), "topo", NULL), 0);
	assert_non_null(strstr(text, "GPU0   X     NV1   NV1   NV2   NV2   SYS"));
	assert_non_null(strstr(text, "Rings"));
	assert_non_null(strstr(text, "Trees"));
	assert_non_null(strstr(text, "allreduce"));
	assert_int_equal(daemon_stop(&d), 0);
}

static void test_dump_round_trip(void **state)
{
	struct daemon_proc d;
	static char first[1 << 18], second[1 << 18];
	char path[160];
	assert_int_equal(daemon_start(&d, 8, "--topology", MODELS "/dgx1-cube-mesh.json", NULL), 0);
	assert_int_equal(ctl(&d, first, sizeof(first), "topo", "--dump", NULL), 0);
	assert_int_equal(daemon_stop(&d), 0);

	write_temp(path, sizeof(path), "dump", first);
	assert_int_equal(daemon_start(&d, 8, "--topology", path, NULL), 0);
	assert_int_equal(ctl(&d, second, sizeof(second), "topo", "--dump", NULL), 0);
	assert_int_equal(daemon_stop(&d), 0);
	unlink(path);
	assert_string_equal(first, second);
	assert_non_null(strstr(first, "\"dgx1-hybrid-cube-mesh\""));
}

static void test_host_engine_model(void **state)
{
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 3, NULL), 0);
	json_t *doc = topo_json(&d);
	json_t *model = json_object_get(doc, "model");
	assert_int_equal(json_array_size(json_object_get(model, "devices")), 3);
	size_t i;
	json_t *l;
	json_array_foreach(json_object_get(model, "links"), i, l)
		assert_string_equal(json_string_value(json_object_get(l, "type")), "host");
	json_decref(doc);
	assert_int_equal(daemon_stop(&d), 0);
}

static void test_algo_and_tuning(void **state)
{
	char tuning[160];
	write_temp(tuning, sizeof(tuning), "tuning",
	           "{\"version\": 1, \"entries\": [{\"coll\": \"allgather\", \"nranks\": 4, \"algo\": \"oneshot\", "
	           "\"channels\": 3}]}");
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 4, "--topology", MODELS "/pcie-4.json", "--algo", "ring", "--tuning-file",
	                              tuning, NULL),
	                 0);
	json_t *doc = topo_json(&d);
	size_t i;
	json_t *e;
	unsigned tuned = 0;
	json_array_foreach(json_object_get(json_object_get(doc, "selection"), "entries"), i, e) {
		const char *coll = json_string_value(json_object_get(e, "coll"));
		const char *algo = json_string_value(json_object_get(e, "algo"));
		/* Forced everywhere; the forced algorithm beats the tuning file. */
		assert_string_equal(algo, "ring");
		if (strcmp(coll, "allgather") == 0 && json_is_true(json_object_get(e, "tuned")))
			tuned++;
	}
	assert_int_equal(tuned, 0);
	json_decref(doc);
	assert_int_equal(daemon_stop(&d), 0);

	assert_int_equal(daemon_start(&d, 4, "--topology", MODELS "/pcie-4.json", "--tuning-file", tuning, NULL), 0);
	doc = topo_json(&d);
	json_array_foreach(json_object_get(json_object_get(doc, "selection"), "entries"), i, e) {
		if (json_is_true(json_object_get(e, "tuned"))) {
			tuned++;
			assert_string_equal(json_string_value(json_object_get(e, "coll")), "allgather");
			assert_string_equal(json_string_value(json_object_get(e, "algo")), "oneshot");
			assert_int_equal(json_integer_value(json_object_get(e, "channels")), 3);
		}
	}
	assert_int_equal(tuned, 1); /* every size: one merged range */
	json_decref(doc);
	assert_int_equal(daemon_stop(&d), 0);
	unlink(tuning);
}

/* dfccl-perf against d; returns its exit status, output in buf. */
static int perf(const struct daemon_proc *d, char *buf, size_t len, const char *coll, const char *max)
{
	const char *argv[] = {DFCCL_PERF_PATH, coll, "--socket", d->socket, "--nranks", "4", "-b", "64",
	                      "-e", max, "-f", "4", "-n", "2", "-w", "1", NULL};
	char out[160];
	snprintf(out, sizeof(out), "%s/perf.out", d->dir);
	return run_capture(argv, out, buf, len);
}

/*
 * The daemon's plan reaches the engines: with a tuning file that names a
 * tree for small all-reduces, multi-tree for large ones, a ring for every
 * all-gather and a tree for every reduce, dfccl-perf (algorithm auto, its
 * results checked) runs correctly and the engines count their collectives
 * under exactly those algorithms.
 */
static void test_plan_reaches_engines(void **state)
{
	(void)state;
	char tuning[160];
	write_temp(tuning, sizeof(tuning), "plan",
	           "{\"version\": 1, \"entries\": ["
	           "{\"coll\": \"allreduce\", \"nranks\": 4, \"max_bytes\": 1024, \"algo\": \"tree\", \"channels\": 1},"
	           "{\"coll\": \"allreduce\", \"nranks\": 4, \"min_bytes\": 1025, \"algo\": \"multitree\", "
	           "\"channels\": 4},"
	           "{\"coll\": \"allgather\", \"nranks\": 4, \"algo\": \"ring\", \"channels\": 1},"
	           "{\"coll\": \"reduce\", \"nranks\": 4, \"algo\": \"tree\", \"channels\": 1}]}");
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 4, "--topology", MODELS "/pcie-4.json", "--tuning-file", tuning, NULL), 0);
	static char out[1 << 16];
	uint64_t n0[5], n1[5], n2[5];
	assert_int_equal(daemon_by_algo(&d, n0), 0);
	int rc = perf(&d, out, sizeof(out), "allreduce", "16K");
	if (rc != 0)
		fail_msg("dfccl-perf allreduce: exit %d\n%s", rc, out);
	assert_int_equal(daemon_by_algo(&d, n1), 0);
	assert_true(n1[DFCCL_ALGO_TREE] > n0[DFCCL_ALGO_TREE]);
	assert_true(n1[DFCCL_ALGO_MULTITREE] > n0[DFCCL_ALGO_MULTITREE]);
	assert_int_equal(n1[DFCCL_ALGO_RING], n0[DFCCL_ALGO_RING]);
	rc = perf(&d, out, sizeof(out), "allgather", "16K");
	if (rc != 0)
		fail_msg("dfccl-perf allgather: exit %d\n%s", rc, out);
	rc = perf(&d, out, sizeof(out), "reduce", "16K");
	if (rc != 0)
		fail_msg("dfccl-perf reduce: exit %d\n%s", rc, out);
	assert_int_equal(daemon_by_algo(&d, n2), 0);
	assert_true(n2[DFCCL_ALGO_RING] > n1[DFCCL_ALGO_RING]);
	/* reduce: trees; the barriers and #wrong sums: small all-reduces, trees too */
	assert_true(n2[DFCCL_ALGO_TREE] > n1[DFCCL_ALGO_TREE]);
	assert_int_equal(n2[DFCCL_ALGO_DIRECT], n0[DFCCL_ALGO_DIRECT]);
	assert_int_equal(daemon_stop(&d), 0);
	unlink(tuning);
}

/* A rank of the communicator of test_comm_plan: joins on device `rank`
 * with its placement in the ring reversed (rank r on device 7 - r), says
 * so on the ready pipe, and leaves when the go pipe closes. */
struct plan_job {
	dfcclUniqueId id;
	int ready, go, go_write;
};

static int plan_rank(void *arg, int rank)
{
	struct plan_job *j = arg;
	close(j->go_write); /* the go pipe ends when the test closes its end */
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	cfg.device = 7 - rank;
	dfcclComm_t comm;
	if (dfcclCommInitRankConfig(&comm, 8, j->id, rank, &cfg) != dfcclSuccess)
		return 1;
	char b = 'r';
	if (write(j->ready, &b, 1) != 1)
		return 1;
	while (read(j->go, &b, 1) > 0)
		;
	return dfcclCommDestroy(comm) == dfcclSuccess ? 0 : 1;
}

/* Whether devices a and b are NVLink peers in the cube-mesh document. */
static int nvlink_pair(json_t *model, int a, int b)
{
	size_t i;
	json_t *l;
	json_array_foreach(json_object_get(model, "links"), i, l) {
		int x = (int)json_integer_value(json_object_get(l, "a")), y = (int)json_integer_value(json_object_get(l, "b"));
		if ((x == a && y == b) || (x == b && y == a))
			return strcmp(json_string_value(json_object_get(l, "type")), "nvlink") == 0;
	}
	return 0;
}

/*
 * Each communicator gets a plan from the topology for the devices its ranks
 * are on: on the cube-mesh, with rank r on device 7 - r, `dfcclctl comms`
 * shows a ring whose every hop and trees whose every edge is an NVLink pair
 * of the ranks' devices, trees rooted at distinct ranks.
 */
static void test_comm_plan(void **state)
{
	(void)state;
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 8, "--topology", MODELS "/dgx1-cube-mesh.json", NULL), 0);
	json_t *doc = topo_json(&d);
	json_t *model = json_object_get(doc, "model");
	struct plan_job j;
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	int ready[2], go[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	j.ready = ready[1];
	j.go = go[0];
	j.go_write = go[1];
	pid_t pid[8];
	for (int r = 0; r < 8; r++)
		pid[r] = child_run(plan_rank, &j, r);
	close(go[0]);
	for (int r = 0; r < 8; r++) {
		char b;
		assert_int_equal(read(ready[0], &b, 1), 1);
	}
	static char buf[1 << 16];
	assert_int_equal(ctl(&d, buf, sizeof(buf), "--json", "comms", NULL), 0);
	json_error_t je;
	json_t *q = json_loads(buf, 0, &je);
	if (!q)
		fail_msg("dfcclctl --json comms printed no JSON (%s): %.300s", je.text, buf);
	json_t *comm = json_array_get(json_object_get(q, "comms"), 0);
	json_t *ringv = json_object_get(comm, "ring");
	assert_int_equal(json_array_size(ringv), 8);
	unsigned seen = 0;
	for (int i = 0; i < 8; i++) {
		int r = (int)json_integer_value(json_array_get(ringv, (size_t)i));
		int next = (int)json_integer_value(json_array_get(ringv, (size_t)(i + 1) % 8));
		seen |= 1u << r;
		if (!nvlink_pair(model, 7 - r, 7 - next))
			fail_msg("ring hop rank %d -> %d (devices %d -> %d) is not NVLink", r, next, 7 - r, 7 - next);
	}
	assert_int_equal(seen, 0xff);
	size_t k;
	json_t *tree;
	unsigned roots = 0;
	json_array_foreach(json_object_get(comm, "trees"), k, tree) {
		for (int r = 0; r < 8; r++) {
			int p = (int)json_integer_value(json_array_get(json_object_get(tree, "parent"), (size_t)r));
			if (p < 0)
				roots |= 1u << r;
			else if (!nvlink_pair(model, 7 - r, 7 - p))
				fail_msg("tree %zu: edge rank %d -> %d is not NVLink", k, r, p);
		}
	}
	assert_int_equal(json_array_size(json_object_get(comm, "trees")), 4);
	assert_int_equal(__builtin_popcount(roots), 4);
	assert_int_equal(ctl(&d, buf, sizeof(buf), "comms", NULL), 0);
	assert_non_null(strstr(buf, "RING"));
	json_decref(q);
	json_decref(doc);
	close(go[1]);
	for (int r = 0; r < 8; r++)
		assert_int_equal(child_wait(pid[r], 10000), 0);
	close(ready[0]);
	close(ready[1]);
	assert_int_equal(daemon_stop(&d), 0);
}

/* dfccld with these arguments must exit non-zero, saying `expect`. */
static void assert_refused(const char *ndev, const char *model, const char *expect)
{
	char dir[] = "/tmp/dfccl-topo-XXXXXX", sock[128], out[160];
	static char buf[65536];
	assert_non_null(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/dfccld.sock", dir);
	snprintf(out, sizeof(out), "%s/dfccld.log", dir);
	const char *argv[] = {DFCCLD_PATH, "--socket", sock, "--engine", "host", "--host-devices", ndev, "--topology", model,
	                      "--log-target", "stderr", "--config", "/dev/null", NULL};
	int rc = run_capture(argv, out, buf, sizeof(buf));
	if (rc <= 0 || !strstr(buf, expect))
		fail_msg("dfccld exited with %d and said:\n%s\n(expected a non-zero exit and \"%s\")", rc, buf, expect);
	unlink(out);
	rmdir(dir);
}

static void test_refused_models(void **state)
{
	assert_refused("4", MODELS "/dgx1-cube-mesh.json", "describes 8 devices, but this daemon serves 4");
	assert_refused("2", "/nonexistent/model.json", "cannot open /nonexistent/model.json");

	char path[160];
	write_temp(path, sizeof(path), "bad",
	           "{\"version\": 1, \"devices\": [{\"index\": 0}, {\"index\": 1}], \"links\": [{\"a\": 0, \"b\": 1, "
	           "\"type\": \"nvlnk\", \"bw_gbps\": 1, \"lat_us\": 1}]}");
	assert_refused("2", path, "links[0].type: 'nvlnk' is not one of");
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cube_mesh),
	    cmocka_unit_test(test_dump_round_trip),
	    cmocka_unit_test(test_host_engine_model),
	    cmocka_unit_test(test_algo_and_tuning),
	    cmocka_unit_test(test_plan_reaches_engines),
	    cmocka_unit_test(test_comm_plan),
	    cmocka_unit_test(test_refused_models),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
