/*
 * `dfcclctl tune`; see tune.h.
 *
 * Per collective, every algorithm that can run it is swept over the same
 * sizes (out of place, float sums, root 0), each in its own set of rank
 * processes: libdfccl reads DFCCL_ALGO once per process, so one process
 * cannot try two algorithms. Rank 0 of a sweep leaves its results in
 * shared memory for this process, which picks the fastest algorithm per
 * size and turns runs of sizes with one winner into one tuning entry.
 *
 * The entries of a collective cover every size without a gap: the first
 * starts at 0, each ends at the end of the size bucket (topo_select.h) of
 * its largest measured size, the next starts right after it, and the last
 * has no end. The buckets between two measured sizes therefore go to the
 * winner of the larger one, and sizes beyond the sweep to the winner of its
 * largest. The measured sizes are the `bytes` of the selection table
 * already (bench.h), so no conversion is needed; and since the sweep's
 * factor is at least 2, no two of them share a bucket.
 */
#include "tune.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "client.h"
#include "dfccl.h"
#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "tool.h"
#include "topo_plan.h"
#include "topo_select.h"

/* The collectives with an algorithm to choose: those of the selection table. */
static int tune_topo_coll(int coll)
{
	return topo_coll_parse(tool_coll_name(coll));
}

/*
 * The selection table's name for what DFCCL_ALGO=family runs for coll, or
 * -1 if that family cannot run it: the member of the family
 * (topo_plan_algo_family) that can. The one family with two members for a
 * collective is the direct all-reduce, one-shot or two-shot to the table,
 * which the engines run as one family and shape themselves (the host
 * engine two-shot: every rank reduces its chunk, then gathers the others';
 * the CUDA engine one-shot on two ranks and for small sizes where no rank
 * works in place, oneshot_fits): the later member is the one it names.
 */
static int tune_topo_algo(enum topo_coll coll, int family)
{
	int found = -1;
	for (int a = 0; a < TOPO_ALGO_COUNT_; a++)
		if (topo_algo_valid(coll, (enum topo_algo)a) && (int)topo_plan_algo_family((enum topo_algo)a) == family)
			found = a;
	return found;
}

int tune_colls_parse(struct tune_opts *o, const char *list, char *err, size_t errlen)
{
	char *copy = strdup(list), *save = NULL;
	int rc = copy ? 0 : -ENOMEM;
	o->colls = 0;
	for (char *name = copy ? strtok_r(copy, ",", &save) : NULL; name && rc == 0; name = strtok_r(NULL, ",", &save)) {
		int c = tool_coll_parse(name);
		if (c < 0 || tune_topo_coll(c) < 0) {
			snprintf(err, errlen, "--colls: '%s' is not a collective with an algorithm to choose (allreduce, "
			         "allgather, reducescatter, broadcast, reduce)", name);
			rc = -EINVAL;
		}
		o->colls |= c >= 0 ? 1u << c : 0;
	}
	if (rc == 0 && o->colls == 0) {
		snprintf(err, errlen, "--colls: no collective in '%s'", list);
		rc = -EINVAL;
	}
	free(copy);
	return rc;
}

int tune_opts_check(const struct tune_opts *o, char *err, size_t errlen)
{
	if (o->min_bytes == 0 || o->min_bytes > o->max_bytes || o->max_bytes > TUNE_MAX_BYTES) {
		snprintf(err, errlen, "need 0 < -b <= -e <= 4G, not -b %llu -e %llu", (unsigned long long)o->min_bytes,
		         (unsigned long long)o->max_bytes);
		return -EINVAL;
	}
	if (o->output && !o->output[0]) {
		snprintf(err, errlen, "--output needs a file name");
		return -EINVAL;
	}
	return 0;
}

/* ---------------------------------------------------------------- measuring */

/* One sweep: what its rank processes run and where rank 0 leaves results. */
struct tune_sweep {
	struct bench_spec spec;
	const struct bench_size *sizes;
	unsigned nsizes;
	struct bench_result *out; /* [nsizes], shared with the rank processes */
};

static int tune_rank(int rank, void *arg)
{
	struct tune_sweep *w = arg;
	struct bench_rank b = BENCH_RANK_INIT;
	dfcclResult_t r = bench_join(&b, &w->spec, rank);
	for (unsigned k = 0; k < w->nsizes && r == dfcclSuccess; k++) {
		struct bench_result m;
		r = bench_measure(&b, &w->sizes[k], false, &m);
		if (r == dfcclSuccess && rank == 0)
			w->out[k] = m;
		/* Every rank sees the same sum: all stop here together. */
		if (r == dfcclSuccess && m.wrong)
			break;
	}
	return bench_leave(&b, r) == dfcclSuccess ? 0 : 1;
}

/* Measures coll with DFCCL_ALGO=algo over every size into times[k]; an error
 * message on failure. */
static int tune_measure(struct tune_sweep *w, const char *algo, double *times)
{
	const char *coll = tool_coll_name(w->spec.coll);
	w->spec.algo = algo;
	memset(w->out, 0, w->nsizes * sizeof(*w->out));
	if (dfcclGetUniqueId(&w->spec.id) != dfcclSuccess) {
		fprintf(stderr, "dfcclctl: tune: %s\n", dfcclGetLastError(NULL));
		return -1;
	}
	if (tool_run_ranks("dfcclctl tune", w->spec.nranks, tune_rank, w, 30) != 0) {
		fprintf(stderr, "dfcclctl: tune: %s with DFCCL_ALGO=%s failed\n", coll, algo);
		return -1;
	}
	for (unsigned k = 0; k < w->nsizes; k++) {
		const struct bench_result *m = &w->out[k];
		if (m->wrong) {
			fprintf(stderr, "dfcclctl: tune: %s with DFCCL_ALGO=%s gave %llu wrong elements at %zu bytes\n", coll,
			        algo, (unsigned long long)m->wrong, w->sizes[k].bytes);
			return -1;
		}
		if (!m->valid) {
			fprintf(stderr, "dfcclctl: tune: %s with DFCCL_ALGO=%s left %zu bytes unmeasured\n", coll, algo,
			        w->sizes[k].bytes);
			return -1;
		}
		times[k] = m->us;
	}
	return 0;
}

/* ---------------------------------------------------------------- results */

/* The measurements of one collective: times[k * nalgos + i] of algorithm i
 * at size k. */
struct tune_coll {
	enum topo_coll coll;
	unsigned nalgos;
	int dfccl_algo[DFCCL_ALGO_COUNT_];
	enum topo_algo algo[DFCCL_ALGO_COUNT_];
	double *times;
};

/* A later (more elaborate) algorithm must beat the earlier ones by this
 * fraction of their time to win: below it, differences are noise of the
 * node (a few hundred ns at small sizes) and would flip the table between
 * runs. */
#define TUNE_MARGIN 0.05

/* The index of the fastest algorithm at size k, candidates taken in the
 * order direct, ring, tree, multi-tree, each needing TUNE_MARGIN over the
 * best before it. */
static unsigned tune_winner(const struct tune_coll *t, unsigned k)
{
	const double *row = &t->times[k * t->nalgos];
	unsigned best = 0;
	for (unsigned i = 1; i < t->nalgos; i++)
		if (row[i] < row[best] * (1.0 - TUNE_MARGIN))
			best = i;
	return best;
}

static void tune_print(FILE *f, const struct tune_coll *t, const struct bench_size *sizes, unsigned nsizes)
{
	fprintf(f, "# %s\n#%11s", topo_coll_name(t->coll), "size (B)");
	for (unsigned i = 0; i < t->nalgos; i++)
		fprintf(f, " %10s", topo_algo_name(t->algo[i]));
	fprintf(f, "  winner\n");
	for (unsigned k = 0; k < nsizes; k++) {
		fprintf(f, " %11zu", sizes[k].bytes);
		for (unsigned i = 0; i < t->nalgos; i++)
			fprintf(f, " %10.2f", t->times[k * t->nalgos + i]);
		fprintf(f, "  %s\n", topo_algo_name(t->algo[tune_winner(t, k)]));
	}
	fflush(f);
}

/*
 * The channels of a tuning entry: what the measured algorithm ran on. Every
 * algorithm of the engines runs on one channel; a multi-tree runs on the
 * trees of the communicator's plan (topo_plan.h: one per rank, at most
 * DFCCL_PLAN_TREES), and its channel count is its number of trees.
 */
static unsigned tune_channels(enum topo_algo a, int nranks)
{
	if (a != TOPO_ALGO_MULTITREE)
		return 1;
	return (unsigned)nranks < DFCCL_PLAN_TREES ? (unsigned)nranks : DFCCL_PLAN_TREES;
}

/* Appends t's entries (see the top of the file) to entries. */
static int tune_entries(json_t *entries, const struct tune_coll *t, int nranks, const struct bench_size *sizes,
                        unsigned nsizes)
{
	uint64_t lo = 0;
	for (unsigned k = 0; k < nsizes; k++) {
		unsigned w = tune_winner(t, k);
		bool last = k + 1 == nsizes;
		if (!last && tune_winner(t, k + 1) == w)
			continue;
		json_t *e = json_pack("{s:s, s:i, s:I}", "coll", topo_coll_name(t->coll), "nranks", nranks, "min_bytes",
		                      (json_int_t)lo);
		if (!e)
			return -ENOMEM;
		if (!last) {
			uint64_t hi = topo_bucket_max(topo_size_bucket(sizes[k].bytes));
			json_object_set_new(e, "max_bytes", json_integer((json_int_t)hi));
			lo = hi + 1;
		}
		json_object_set_new(e, "algo", json_string(topo_algo_name(t->algo[w])));
		json_object_set_new(e, "channels", json_integer(tune_channels(t->algo[w], nranks)));
		if (json_array_append_new(entries, e) < 0)
			return -ENOMEM;
	}
	return 0;
}

/* ---------------------------------------------------------------- output */

/* Writes text and a newline to path through a temporary file beside it
 * and a rename, so that a daemon (re)starting meanwhile reads the old file
 * or the new one, never half of one. */
static int tune_write(const char *path, const char *text)
{
	size_t len = strlen(path) + 8;
	char *tmp = malloc(len);
	if (!tmp)
		return -ENOMEM;
	snprintf(tmp, len, "%s.XXXXXX", path);
	int rc = 0, fd = mkstemp(tmp);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	/* mkstemp makes it private; the daemon may run as another user. */
	mode_t mask = umask(0);
	umask(mask);
	FILE *f = fdopen(fd, "w");
	if (!f) {
		rc = -errno;
		close(fd);
	} else {
		if (fchmod(fd, 0666 & ~mask) < 0 || fprintf(f, "%s\n", text) < 0 || fflush(f) != 0 || fsync(fd) < 0)
			rc = errno ? -errno : -EIO;
		if (fclose(f) != 0 && rc == 0)
			rc = errno ? -errno : -EIO;
	}
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
out:
	free(tmp);
	return rc;
}

/* ---------------------------------------------------------------- run */

int tune_run(const struct tune_opts *o, const char *socket_path)
{
	static const char *const algo_names[] = DFCCL_ALGO_NAMES;
	int ndev = 0, rc = TOOL_EXIT_FAIL;
	json_t *doc = NULL, *entries = json_array();
	char *text = NULL;
	struct bench_result *shared = MAP_FAILED;
	struct tune_coll t = {0};
	/* What the output must not be mixed with: the table goes to stderr
	 * when the tuning file goes to stdout. */
	FILE *table = o->json ? NULL : o->output ? stdout : stderr;

	/* The rank processes find the daemon the way libdfccl does. */
	setenv("DFCCL_SOCKET", socket_path, 1);
	/* The device count from a session of our own, closed again before any
	 * rank is forked: a session has a poller thread, and a child forked
	 * while that thread holds an allocator lock (the sanitizers' allocators
	 * are not fork-safe) would wait on it forever. */
	struct client *session;
	if (client_open(socket_path, "dfcclctl", &session) != dfcclSuccess) {
		fprintf(stderr, "dfcclctl: tune: cannot reach dfccld at %s: %s\n", socket_path, dfcclGetLastError(NULL));
		goto out;
	}
	ndev = (int)client_info(session)->ndevices;
	client_unref(session);
	int nranks = o->nranks ? o->nranks : ndev > 2 ? ndev : 2;
	unsigned colls = o->colls, every = 0;
	for (int c = 0; c < TOOL_NCOLLS; c++)
		every |= tune_topo_coll(c) >= 0 ? 1u << c : 0;
	colls = colls ? colls : every;

	shared = mmap(NULL, BENCH_MAX_SIZES * sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	t.times = calloc((size_t)BENCH_MAX_SIZES * DFCCL_ALGO_COUNT_, sizeof(*t.times));
	if (shared == MAP_FAILED || !t.times || !entries) {
		fprintf(stderr, "dfcclctl: tune: out of memory\n");
		goto out;
	}
	if (table)
		fprintf(table, "# dfcclctl tune: %d ranks, float sum, root 0, out of place, %ld warmup and %ld timed "
		        "iterations per size; time per collective in us\n", nranks, o->warmup, o->iters);

	for (int c = 0; c < TOOL_NCOLLS; c++) {
		if (!(colls & (1u << c)))
			continue;
		struct bench_size sizes[BENCH_MAX_SIZES];
		struct tune_sweep w = {
		    .spec = {.name = "dfcclctl tune", .coll = c, .dtype = dfcclFloat32, .op = dfcclSum, .nranks = nranks,
		             .batch = 1, .min_bytes = o->min_bytes, .max_bytes = o->max_bytes, .factor = o->factor,
		             .iters = o->iters, .warmup = o->warmup, .check = true},
		    .sizes = sizes,
		    .out = shared,
		};
		w.nsizes = bench_sizes(&w.spec, sizes);
		if (w.nsizes == 0) {
			fprintf(stderr, "dfcclctl: tune: %s: no size from %llu to %llu bytes gives each of %d ranks a float "
			        "(see -b and -e)\n", tool_coll_name(c), (unsigned long long)o->min_bytes,
			        (unsigned long long)o->max_bytes, nranks);
			rc = TOOL_EXIT_USAGE;
			goto out;
		}
		t.coll = (enum topo_coll)tune_topo_coll(c);
		t.nalgos = 0;
		for (int a = DFCCL_ALGO_AUTO + 1; a < DFCCL_ALGO_COUNT_; a++) {
			int ta = tune_topo_algo(t.coll, a);
			if (ta < 0)
				continue;
			t.dfccl_algo[t.nalgos] = a;
			t.algo[t.nalgos++] = (enum topo_algo)ta;
		}
		double times[BENCH_MAX_SIZES];
		for (unsigned i = 0; i < t.nalgos; i++) {
			if (tune_measure(&w, algo_names[t.dfccl_algo[i]], times) < 0)
				goto failed;
			for (unsigned k = 0; k < w.nsizes; k++)
				t.times[k * t.nalgos + i] = times[k];
		}
		if (table)
			tune_print(table, &t, sizes, w.nsizes);
		if (tune_entries(entries, &t, nranks, sizes, w.nsizes) < 0) {
			fprintf(stderr, "dfcclctl: tune: out of memory\n");
			goto out;
		}
	}

	doc = json_pack("{s:i, s:O}", "version", 1, "entries", entries);
	text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	if (!text) {
		fprintf(stderr, "dfcclctl: tune: out of memory\n");
		goto out;
	}
	if (!o->output) {
		printf("%s\n", text);
		rc = 0;
		goto out;
	}
	int err = tune_write(o->output, text);
	if (err < 0)
		fprintf(stderr, "dfcclctl: tune: cannot write %s: %s\n", o->output, strerror(-err));
	else if (table)
		fprintf(table, "# tuning file written to %s\n", o->output);
	rc = err < 0 ? TOOL_EXIT_FAIL : 0;
	goto out;
failed:
	fprintf(stderr, "dfcclctl: tune: no tuning file written\n");
out:
	free(text);
	json_decref(doc);
	json_decref(entries);
	free(t.times);
	if (shared != MAP_FAILED)
		munmap(shared, BENCH_MAX_SIZES * sizeof(*shared));
	return rc;
}
