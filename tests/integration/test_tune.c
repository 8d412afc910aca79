/*
 * `dfcclctl tune` against the real daemon: it measures every algorithm of
 * every collective (the engines count them: DFCCL_ALGO reached them), and
 * the tuning file it writes is well formed (per collective, entries that
 * cover every size from 0 up without a gap or an overlap, on size-bucket
 * boundaries, each with an algorithm that can run the collective), applies
 * to a selection table, and loads in a daemon started with --tuning-file,
 * which then shows exactly those entries as tuned. Also: --json prints the
 * file alone; bad arguments exit 2, an unreachable daemon and a failing
 * measurement exit 1 and leave no file behind.
 *
 * Sizes and iterations are kept small: the point is the file, not the
 * numbers, and CI has two cores.
 */
#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "harness.h"
#include "topo_json.h"
#include "topo_model.h"
#include "topo_select.h"

#define OUT_MAX (1 << 18)

/* What one dfcclctl run printed. */
struct ctl_run {
	int rc;
	char out[OUT_MAX];
	char err[OUT_MAX];
};

/*
 * Runs dfcclctl with the given arguments (NULL-terminated) in dir, stdout
 * and stderr apart, for at most 60 s; fills *r.
 */
static void ctl_in(const char *dir, struct ctl_run *r, ...)
{
	const char *argv[40] = {DFCCLCTL_PATH};
	int argc = 1;
	va_list ap;
	va_start(ap, r);
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL && argc < 39)
		argv[argc++] = a;
	va_end(ap);
	argv[argc] = NULL;

	char out[160], err[160];
	snprintf(out, sizeof(out), "%s/ctl.out", dir);
	snprintf(err, sizeof(err), "%s/ctl.err", dir);
	pid_t pid = child_exec(argv[0], argv, out, err);
	assert_true(pid >= 0);
	r->rc = child_wait(pid, 60000);
	read_text_file(out, r->out, sizeof(r->out));
	read_text_file(err, r->err, sizeof(r->err));
}

/* Collectives started per algorithm (enum dfccl_algo), summed over the devices. */
static void by_algo(const struct daemon_proc *d, uint64_t out[DFCCL_ALGO_COUNT_])
{
	assert_int_equal(daemon_by_algo(d, out), 0);
}

/* The entry's integer field, or -1 where it has none. */
static json_int_t field_int(const json_t *e, const char *key)
{
	const json_t *v = json_object_get(e, key);
	return v ? json_integer_value(v) : -1;
}

static const char *field_str(const json_t *e, const char *key)
{
	const char *s = json_string_value(json_object_get(e, key));
	return s ? s : "";
}

/*
 * Checks a tuning document as tune writes it: version 1; for exactly the
 * collectives of `colls` (bits of enum topo_coll), one run of entries each,
 * for `nranks` ranks on one channel (a multi-tree: on the plan's trees, one
 * per rank up to DFCCL_PLAN_TREES), the first from 0, each next one from
 * right after the previous one's max_bytes (a bucket boundary, 2^k), the
 * last without max_bytes; neighbours with different algorithms (runs are
 * merged), every algorithm one that can run its collective.
 */
static void check_tuning(const json_t *doc, unsigned colls, int nranks)
{
	assert_int_equal(field_int(doc, "version"), 1);
	const json_t *entries = json_object_get(doc, "entries");
	assert_true(json_is_array(entries));
	assert_true(json_array_size(entries) > 0);
	unsigned seen = 0;
	int coll = -1, prev_algo = -1;
	json_int_t next_min = 0;
	size_t i;
	json_t *e;
	json_array_foreach(entries, i, e) {
		assert_int_equal(json_object_size(e), json_object_get(e, "max_bytes") ? 6 : 5);
		int c = topo_coll_parse(field_str(e, "coll"));
		int a = topo_algo_parse(field_str(e, "algo"));
		if (c < 0 || a < 0 || !topo_algo_valid((enum topo_coll)c, (enum topo_algo)a))
			fail_msg("entries[%zu]: %s cannot run %s", i, field_str(e, "algo"), field_str(e, "coll"));
		assert_int_equal(field_int(e, "nranks"), nranks);
		json_int_t trees = nranks < (int)DFCCL_PLAN_TREES ? nranks : (int)DFCCL_PLAN_TREES;
		assert_int_equal(field_int(e, "channels"), a == TOPO_ALGO_MULTITREE ? trees : 1);
		if (c != coll) {
			/* A new collective: the previous one ended without a limit. */
			if (coll >= 0)
				assert_int_equal(next_min, -1);
			assert_false(seen & (1u << c));
			seen |= 1u << c;
			coll = c;
			next_min = 0;
			prev_algo = -1;
		}
		if (next_min < 0)
			fail_msg("entries[%zu]: %s has an entry after its unlimited one", i, field_str(e, "coll"));
		assert_int_equal(field_int(e, "min_bytes"), next_min);
		assert_int_not_equal(a, prev_algo);
		prev_algo = a;
		json_int_t max = field_int(e, "max_bytes");
		if (max >= 0) {
			assert_true(max >= next_min);
			assert_int_equal(max & (max - 1), 0);
			next_min = max + 1;
		} else {
			next_min = -1;
		}
	}
	assert_int_equal(next_min, -1);
	assert_int_equal(seen, colls);
}

#define ALL_COLLS ((1u << TOPO_COLL_COUNT_) - 1)

/*
 * The file applies to a selection table for nranks ranks: every size bucket
 * of every entry then answers the entry's algorithm, marked tuned.
 */
static void check_applies(const json_t *doc, const char *text, unsigned nranks)
{
	struct topo_model *m = NULL;
	struct topo_select_table *t = NULL;
	unsigned rank_dev[TOPO_MAX_RANKS];
	char err[256];
	for (unsigned r = 0; r < nranks; r++)
		rank_dev[r] = r;
	assert_int_equal(topo_model_host(nranks, &m), 0);
	assert_int_equal(topo_select_table_build(m, rank_dev, nranks, NULL, &t), 0);
	int rc = topo_json_apply_tuning(t, text, err, sizeof(err));
	if (rc < 0)
		fail_msg("the tuning file does not apply: %s", err);
	const json_t *entries = json_object_get(doc, "entries");
	assert_int_equal(rc, (int)json_array_size(entries));
	size_t i;
	json_t *e;
	json_array_foreach(entries, i, e) {
		enum topo_coll c = (enum topo_coll)topo_coll_parse(field_str(e, "coll"));
		json_int_t max = field_int(e, "max_bytes");
		unsigned b0 = topo_size_bucket((uint64_t)field_int(e, "min_bytes"));
		unsigned b1 = max < 0 ? TOPO_SIZE_BUCKETS - 1 : topo_size_bucket((uint64_t)max);
		const struct topo_select_row *row = topo_select_row_at(t, c, nranks);
		for (unsigned b = b0; b <= b1; b++) {
			struct topo_choice ch;
			assert_int_equal(topo_select(t, c, nranks, topo_bucket_max(b), &ch), 0);
			assert_string_equal(topo_algo_name(ch.algo), field_str(e, "algo"));
			assert_int_equal(ch.channels, field_int(e, "channels"));
			assert_true(row->tuned[b]);
		}
	}
	topo_select_table_free(t);
	topo_model_free(m);
}

/* A daemon started with --tuning-file path shows the file's entries for
 * nranks ranks, each one tuned, in its selection table (`topo --json`). */
static void check_daemon_loads(const char *path, const json_t *doc, unsigned nranks)
{
	static struct ctl_run r;
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, nranks, "--tuning-file", path, NULL), 0);
	ctl_in(d.dir, &r, "--socket", d.socket, "--json", "topo", NULL);
	assert_int_equal(r.rc, 0);
	json_error_t je;
	json_t *topo = json_loads(r.out, 0, &je);
	if (!topo)
		fail_msg("dfcclctl --json topo printed no JSON (%s): %.300s", je.text, r.out);
	const json_t *want = json_object_get(doc, "entries");
	size_t i, k = 0;
	json_t *e;
	json_array_foreach(json_object_get(json_object_get(topo, "selection"), "entries"), i, e) {
		if (field_int(e, "nranks") != (json_int_t)nranks)
			continue;
		const json_t *w = json_array_get(want, k++);
		assert_non_null(w);
		assert_true(json_is_true(json_object_get(e, "tuned")));
		assert_string_equal(field_str(e, "coll"), field_str(w, "coll"));
		assert_string_equal(field_str(e, "algo"), field_str(w, "algo"));
		assert_int_equal(field_int(e, "min_bytes"), field_int(w, "min_bytes"));
		assert_int_equal(field_int(e, "max_bytes"), field_int(w, "max_bytes"));
		assert_int_equal(field_int(e, "channels"), field_int(w, "channels"));
	}
	assert_int_equal(k, json_array_size(want));
	json_decref(topo);
	assert_int_equal(daemon_stop(&d), 0);
}

/* Whether dir holds a file whose name starts with prefix. */
static int dir_has(const char *dir, const char *prefix)
{
	DIR *dp = opendir(dir);
	struct dirent *de;
	int found = 0;
	while (dp && (de = readdir(dp)) != NULL)
		found |= strncmp(de->d_name, prefix, strlen(prefix)) == 0;
	if (dp)
		closedir(dp);
	return found;
}

/*
 * The whole path on three devices, so the default rank count is the device
 * count and all-gather and reduce-scatter leave out sizes too small for
 * three ranks.
 */
static void test_tune_writes_a_loadable_file(void **state)
{
	(void)state;
	static struct ctl_run r;
	struct daemon_proc d;
	char path[160], kept[160];
	uint64_t n0[DFCCL_ALGO_COUNT_], n1[DFCCL_ALGO_COUNT_];
	assert_int_equal(daemon_start(&d, 3, NULL), 0);
	snprintf(path, sizeof(path), "%s/tuning.json", d.dir);
	by_algo(&d, n0);
	ctl_in(d.dir, &r, "--socket", d.socket, "tune", "-b", "8", "-e", "2K", "-f", "4", "-n", "2", "-w", "1",
	       "--output", path, NULL);
	if (r.rc != 0)
		fail_msg("dfcclctl tune: exit %d\n%s%s", r.rc, r.out, r.err);
	by_algo(&d, n1);

	/* The table, on stdout since the file went elsewhere. */
	static const char *const names[] = {"# allreduce\n", "# allgather\n", "# reducescatter\n", "# broadcast\n",
	                                    "# reduce\n", "winner", "3 ranks", "# tuning file written to "};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strstr(r.out, names[i]))
			fail_msg("no '%s' in the table:\n%s", names[i], r.out);
	/* Every algorithm ran in the engines: direct and ring for all five
	 * collectives, the trees for three. */
	for (int a = DFCCL_ALGO_DIRECT; a < DFCCL_ALGO_COUNT_; a++)
		if (n1[a] <= n0[a])
			fail_msg("no collective ran with algorithm %d", a);
	assert_true(n1[DFCCL_ALGO_RING] - n0[DFCCL_ALGO_RING] > n1[DFCCL_ALGO_TREE] - n0[DFCCL_ALGO_TREE]);

	/* Renamed into place, readable by a daemon of another user. */
	struct stat st;
	mode_t mask = umask(0);
	umask(mask);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0666 & ~mask);
	assert_false(dir_has(d.dir, "tuning.json."));

	static char text[OUT_MAX];
	read_text_file(path, text, sizeof(text));
	json_error_t je;
	json_t *doc = json_loads(text, 0, &je);
	if (!doc)
		fail_msg("%s is not JSON (%s):\n%s", path, je.text, text);
	check_tuning(doc, ALL_COLLS, 3);
	check_applies(doc, text, 3);

	/* The file outlives this daemon: the next one loads it. */
	snprintf(kept, sizeof(kept), "/tmp/dfccl-tune-%d.json", (int)getpid());
	assert_int_equal(rename(path, kept), 0);
	assert_int_equal(daemon_stop(&d), 0);
	check_daemon_loads(kept, doc, 3);
	unlink(kept);
	json_decref(doc);
}

/* --json: stdout is the tuning file and nothing else, no table anywhere;
 * --colls and --nranks choose what is measured. */
static void test_tune_json(void **state)
{
	(void)state;
	static struct ctl_run r;
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 2, NULL), 0);
	ctl_in(d.dir, &r, "--socket", d.socket, "--json", "tune", "--nranks", "2", "--colls", "reduce,allreduce", "-b",
	       "64", "-e", "256", "-n", "1", "-w", "0", NULL);
	if (r.rc != 0)
		fail_msg("dfcclctl --json tune: exit %d\n%s%s", r.rc, r.out, r.err);
	assert_null(strstr(r.out, "winner"));
	assert_null(strstr(r.err, "winner"));
	json_error_t je;
	json_t *doc = json_loads(r.out, 0, &je); /* the whole output, nothing after the document */
	if (!doc)
		fail_msg("stdout is not one JSON document (%s):\n%s", je.text, r.out);
	check_tuning(doc, 1u << TOPO_COLL_ALLREDUCE | 1u << TOPO_COLL_REDUCE, 2);
	json_decref(doc);
	assert_int_equal(daemon_stop(&d), 0);
}

/* Usage errors exit 2 and say what is wrong, before anything runs. */
static void test_tune_usage(void **state)
{
	(void)state;
	static const struct {
		const char *args[4];
		const char *expect;
	} cases[] = {
	    {{"--colls", "sendrecv"}, "'sendrecv' is not a collective with an algorithm to choose"},
	    {{"--colls", "allreduce,bogus"}, "'bogus' is not a collective"},
	    {{"--colls", ","}, "--colls: no collective"},
	    {{"-b", "1K", "-e", "8"}, "need 0 < -b <= -e <= 4G"},
	    {{"-b", "0"}, "need 0 < -b <= -e <= 4G"},
	    {{"-e", "8G"}, "need 0 < -b <= -e <= 4G"},
	    {{"-b", "lots"}, "-b takes a size"},
	    {{"-f", "1"}, "-f takes 2 to 1024"},
	    {{"-n", "0"}, "-n takes 1 to 100000000"},
	    {{"-w", "-1"}, "-w takes 0 to 100000000"},
	    {{"--nranks", "1"}, "--nranks takes 2 to 64"},
	    {{"--output", ""}, "--output needs a file name"},
	    {{"extra"}, "unexpected argument 'extra'"},
	};
	static struct ctl_run r;
	char dir[] = "/tmp/dfccl-tune-XXXXXX";
	assert_non_null(mkdtemp(dir));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *const *a = cases[i].args;
		ctl_in(dir, &r, "--socket", "/nonexistent/dfccld.sock", "tune", a[0], a[1], a[2], a[3], NULL);
		if (r.rc != 2 || !strstr(r.err, cases[i].expect))
			fail_msg("tune %s %s: exit %d, said:\n%s(expected exit 2 and \"%s\")", a[0], a[1] ? a[1] : "", r.rc,
			         r.err, cases[i].expect);
	}
	/* tune's options go with tune only. */
	ctl_in(dir, &r, "status", "--nranks", "2", NULL);
	assert_int_equal(r.rc, 2);
	assert_non_null(strstr(r.err, "go with tune"));
	/* The help lists it. */
	ctl_in(dir, &r, "--help", NULL);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "  tune "));
	assert_non_null(strstr(r.out, "--colls LIST"));

	/* No daemon: exit 1, saying so. */
	ctl_in(dir, &r, "--socket", "/nonexistent/dfccld.sock", "tune", "--output", "/tmp/never-written.json", NULL);
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "cannot reach dfccld at /nonexistent/dfccld.sock"));
	assert_int_equal(access("/tmp/never-written.json", F_OK), -1);
	char cmd[100];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/*
 * A measurement that fails (here: the daemon refuses the buffers, its
 * per-user limit being below them) exits 1 and writes no file, not even a
 * temporary one; so does a file that cannot be written.
 */
static void test_tune_failures(void **state)
{
	(void)state;
	static struct ctl_run r;
	struct daemon_proc d;
	char path[160];
	assert_int_equal(daemon_start(&d, 2, "--max-registered-bytes-per-uid", "64K", NULL), 0);
	snprintf(path, sizeof(path), "%s/tuning.json", d.dir);
	ctl_in(d.dir, &r, "--socket", d.socket, "tune", "--colls", "allreduce", "-b", "1M", "-e", "1M", "-n", "1",
	       "--output", path, NULL);
	if (r.rc != 1 || !strstr(r.err, "allreduce with DFCCL_ALGO=direct failed") ||
	    !strstr(r.err, "no tuning file written"))
		fail_msg("tune with refused buffers: exit %d, said:\n%s", r.rc, r.err);
	assert_false(dir_has(d.dir, "tuning.json"));

	/* Measured, but the directory does not exist. */
	snprintf(path, sizeof(path), "%s/missing/tuning.json", d.dir);
	ctl_in(d.dir, &r, "--socket", d.socket, "tune", "--colls", "reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
	       "--output", path, NULL);
	if (r.rc != 1 || !strstr(r.err, "cannot write"))
		fail_msg("tune into a missing directory: exit %d, said:\n%s", r.rc, r.err);
	assert_int_equal(daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tune_usage),
	    cmocka_unit_test(test_tune_writes_a_loadable_file),
	    cmocka_unit_test(test_tune_json),
	    cmocka_unit_test(test_tune_failures),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
