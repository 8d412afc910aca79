/*
 * See topo_json.h. Validation reads every object through the helpers in
 * the first section: each knows the path of the object it reads
 * ("links[3]") and writes the first problem it finds into err, so a caller
 * only forwards the return code.
 */
#include "topo_json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOPO_JSON_VERSION 1

/* ---------------------------------------------------------------- reading helpers */

struct reader {
	char *err;
	size_t errlen;
};

static int fail(struct reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct reader *r, const char *fmt, ...)
{
	if (r->err && r->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->err, r->errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* Every member of o must be one of the NULL-terminated `known`. */
static int check_keys(struct reader *r, const json_t *o, const char *where, const char *const *known)
{
	if (!json_is_object(o))
		return fail(r, "%s: expected an object", where);
	const char *key;
	json_t *v;
	json_object_foreach((json_t *)o, key, v) {
		int ok = 0;
		for (size_t i = 0; known[i] && !ok; i++)
			ok = strcmp(key, known[i]) == 0;
		if (!ok)
			return fail(r, "%s: unknown field '%s'", where, key);
	}
	return 0;
}

/* An integer member in [min, max]; absent: *out = def, or an error when
 * required. */
static int get_int(struct reader *r, const json_t *o, const char *where, const char *key, int required,
                   json_int_t min, json_int_t max, json_int_t def, json_int_t *out)
{
	json_t *v = json_object_get(o, key);
	if (!v) {
		if (required)
			return fail(r, "%s: missing required field '%s'", where, key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v))
		return fail(r, "%s.%s: expected an integer", where, key);
	json_int_t x = json_integer_value(v);
	if (x < min || x > max)
		return fail(r, "%s.%s: %" JSON_INTEGER_FORMAT " is outside [%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT "]",
		            where, key, x, min, max);
	*out = x;
	return 0;
}

/* A number member (integer or real) that must be >= min (> min when
 * strict). */
static int get_number(struct reader *r, const json_t *o, const char *where, const char *key, int required,
                      double min, int strict, double def, double *out)
{
	json_t *v = json_object_get(o, key);
	if (!v) {
		if (required)
			return fail(r, "%s: missing required field '%s'", where, key);
		*out = def;
		return 0;
	}
	if (!json_is_number(v))
		return fail(r, "%s.%s: expected a number", where, key);
	double x = json_number_value(v);
	if (strict ? !(x > min) : !(x >= min))
		return fail(r, "%s.%s: %g must be %s %g", where, key, x, strict ? "greater than" : "at least", min);
	*out = x;
	return 0;
}

/* A string member copied into buf (which it must fit). */
static int get_string(struct reader *r, const json_t *o, const char *where, const char *key, int required,
                      char *buf, size_t len)
{
	json_t *v = json_object_get(o, key);
	if (!v) {
		if (required)
			return fail(r, "%s: missing required field '%s'", where, key);
		buf[0] = '\0';
		return 0;
	}
	if (!json_is_string(v))
		return fail(r, "%s.%s: expected a string", where, key);
	if (json_string_length(v) >= len)
		return fail(r, "%s.%s: longer than %zu characters", where, key, len - 1);
	memcpy(buf, json_string_value(v), json_string_length(v) + 1);
	return 0;
}

static int get_array(struct reader *r, const json_t *o, const char *where, const char *key, int required,
                     size_t min, size_t max, json_t **out)
{
	json_t *v = json_object_get(o, key);
	*out = v;
	if (!v) {
		if (required)
			return fail(r, "%s: missing required field '%s'", where, key);
		return 0;
	}
	if (!json_is_array(v))
		return fail(r, "%s.%s: expected an array", where, key);
	if (json_array_size(v) < min || json_array_size(v) > max)
		return fail(r, "%s.%s: has %zu entries, expected %zu to %zu", where, key, json_array_size(v), min, max);
	return 0;
}

static int check_version(struct reader *r, const json_t *o, const char *where)
{
	json_int_t v = 0;
	int rc = get_int(r, o, where, "version", 1, 0, INT32_MAX, 0, &v);
	if (rc == 0 && v != TOPO_JSON_VERSION)
		return fail(r, "%s.version: %" JSON_INTEGER_FORMAT " is not supported (this build reads version %d)", where, v,
		            TOPO_JSON_VERSION);
	return rc;
}

/* The text of a link-type or algorithm list, for error messages. */
static void type_list(char *buf, size_t len)
{
	buf[0] = '\0';
	for (int t = TOPO_LINK_NVLINK; t < TOPO_LINK_TYPE_COUNT_; t++)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", t > TOPO_LINK_NVLINK ? ", " : "",
		         topo_link_type_name((enum topo_link_type)t));
}

/* ---------------------------------------------------------------- model: reading */

static int read_device(struct reader *r, const json_t *o, unsigned i, struct topo_device *d)
{
	static const char *const keys[] = {"index", "name", "pci_bus_id", "numa_node", "cpu_affinity", NULL};
	char where[32];
	snprintf(where, sizeof(where), "devices[%u]", i);
	json_int_t index = 0, numa = -1;
	int rc = check_keys(r, o, where, keys);
	if (rc == 0)
		rc = get_int(r, o, where, "index", 1, 0, TOPO_MAX_DEVICES - 1, 0, &index);
	if (rc == 0 && index != (json_int_t)i)
		rc = fail(r, "%s.index: %" JSON_INTEGER_FORMAT " differs from its position %u (devices are listed in order)",
		          where, index, i);
	if (rc == 0)
		rc = get_string(r, o, where, "name", 0, d->name, sizeof(d->name));
	if (rc == 0)
		rc = get_string(r, o, where, "pci_bus_id", 0, d->pci_bus_id, sizeof(d->pci_bus_id));
	if (rc == 0)
		rc = get_int(r, o, where, "numa_node", 0, -1, 4095, -1, &numa);
	if (rc == 0)
		rc = get_string(r, o, where, "cpu_affinity", 0, d->cpu_affinity, sizeof(d->cpu_affinity));
	if (rc == 0)
		d->numa_node = (int)numa;
	return rc;
}

static int read_link(struct reader *r, const json_t *o, unsigned i, struct topo_model *m, int *seen)
{
	static const char *const keys[] = {"a", "b", "type", "nvlinks", "nvlink_gen", "bw_gbps", "lat_us", NULL};
	char where[32], type[16];
	snprintf(where, sizeof(where), "links[%u]", i);
	json_int_t a = 0, b = 0, nvlinks = 0, gen = 0;
	struct topo_link l = {0};
	int rc = check_keys(r, o, where, keys);
	if (rc == 0)
		rc = get_int(r, o, where, "a", 1, 0, (json_int_t)m->ndev - 1, 0, &a);
	if (rc == 0)
		rc = get_int(r, o, where, "b", 1, 0, (json_int_t)m->ndev - 1, 0, &b);
	if (rc == 0 && a == b)
		rc = fail(r, "%s: links join two different devices (a and b are both %" JSON_INTEGER_FORMAT ")", where, a);
	if (rc == 0 && json_object_get(o, "type") && !json_is_string(json_object_get(o, "type")))
		rc = fail(r, "%s.type: expected a string", where);
	if (rc == 0)
		rc = get_string(r, o, where, "type", 1, type, sizeof(type));
	if (rc == 0) {
		int t = topo_link_type_parse(type);
		if (t <= TOPO_LINK_SELF) {
			char list[128];
			type_list(list, sizeof(list));
			return fail(r, "%s.type: '%s' is not one of %s", where, type, list);
		}
		l.type = (enum topo_link_type)t;
	}
	int nv = l.type == TOPO_LINK_NVLINK || l.type == TOPO_LINK_NVSWITCH;
	if (rc == 0)
		rc = get_int(r, o, where, "nvlinks", nv, nv ? 1 : 0, nv ? 64 : 0, 0, &nvlinks);
	if (rc == 0)
		rc = get_int(r, o, where, "nvlink_gen", 0, 0, nv ? 16 : 0, 0, &gen);
	if (rc == 0)
		rc = get_number(r, o, where, "bw_gbps", 1, 0, 1, 0, &l.bw_gbps);
	if (rc == 0)
		rc = get_number(r, o, where, "lat_us", 1, 0, 0, 0, &l.lat_us);
	if (rc < 0)
		return rc;
	l.nvlinks = (unsigned)nvlinks;
	l.nvlink_gen = (unsigned)gen;
	unsigned lo = (unsigned)(a < b ? a : b), hi = (unsigned)(a < b ? b : a);
	int *s = &seen[lo * m->ndev + hi];
	if (*s)
		return fail(r, "%s: devices %u and %u already have a link (links[%d]); each pair is listed once", where, lo,
		            hi, *s - 1);
	*s = (int)i + 1;
	topo_model_set_link(m, lo, hi, &l);
	return 0;
}

static int read_nic(struct reader *r, const json_t *o, unsigned i, struct topo_nic *n)
{
	static const char *const keys[] = {"name", "pci_bus_id", "numa_node", "bw_gbps", NULL};
	char where[32];
	snprintf(where, sizeof(where), "nics[%u]", i);
	json_int_t numa = -1;
	int rc = check_keys(r, o, where, keys);
	if (rc == 0)
		rc = get_string(r, o, where, "name", 1, n->name, sizeof(n->name));
	if (rc == 0)
		rc = get_string(r, o, where, "pci_bus_id", 0, n->pci_bus_id, sizeof(n->pci_bus_id));
	if (rc == 0)
		rc = get_int(r, o, where, "numa_node", 0, -1, 4095, -1, &numa);
	if (rc == 0)
		rc = get_number(r, o, where, "bw_gbps", 1, 0, 1, 0, &n->bw_gbps);
	if (rc == 0)
		n->numa_node = (int)numa;
	return rc;
}

int topo_json_from(const json_t *j, struct topo_model **out, char *err, size_t errlen)
{
	static const char *const keys[] = {"version", "name", "devices", "links", "nics", NULL};
	struct reader r = {err, errlen};
	*out = NULL;
	const char *where = "model";
	if (json_is_object(j) && json_object_get(j, "model")) {
		j = json_object_get(j, "model");
		where = "model";
	} else {
		where = "(top level)";
	}
	json_t *devices = NULL, *links = NULL, *nics = NULL;
	int rc = check_keys(&r, j, where, keys);
	if (rc == 0)
		rc = check_version(&r, j, where);
	if (rc == 0)
		rc = get_array(&r, j, where, "devices", 1, 1, TOPO_MAX_DEVICES, &devices);
	if (rc == 0)
		rc = get_array(&r, j, where, "links", 1, 0, SIZE_MAX, &links);
	if (rc == 0)
		rc = get_array(&r, j, where, "nics", 0, 0, TOPO_MAX_NICS, &nics);
	if (rc < 0)
		return rc;

	unsigned ndev = (unsigned)json_array_size(devices);
	struct topo_model *m;
	int *seen = calloc((size_t)ndev * ndev, sizeof(int));
	rc = seen ? topo_model_new(ndev, &m) : -ENOMEM;
	if (rc < 0)
		goto out_seen;
	rc = get_string(&r, j, where, "name", 0, m->name, sizeof(m->name));
	for (unsigned i = 0; rc == 0 && i < ndev; i++)
		rc = read_device(&r, json_array_get(devices, i), i, &m->dev[i]);
	for (unsigned i = 0; rc == 0 && i < json_array_size(links); i++)
		rc = read_link(&r, json_array_get(links, i), i, m, seen);
	for (unsigned a = 0; rc == 0 && a < ndev; a++)
		for (unsigned b = a + 1; rc == 0 && b < ndev; b++)
			if (!seen[a * ndev + b])
				rc = fail(&r, "links: devices %u and %u have no link (every pair of devices needs one)", a, b);
	for (unsigned i = 0; rc == 0 && nics && i < json_array_size(nics); i++)
		rc = read_nic(&r, json_array_get(nics, i), i, &m->nic[i]);
	if (rc == 0)
		m->nnic = nics ? (unsigned)json_array_size(nics) : 0;
	if (rc < 0) {
		topo_model_free(m);
		goto out_seen;
	}
	*out = m;
out_seen:
	free(seen);
	return rc;
}

int topo_json_parse(const char *text, struct topo_model **out, char *err, size_t errlen)
{
	json_error_t je;
	*out = NULL;
	json_t *j = json_loads(text, 0, &je);
	if (!j) {
		snprintf(err, errlen, "not valid JSON: line %d, column %d: %s", je.line, je.column, je.text);
		return -EINVAL;
	}
	int rc = topo_json_from(j, out, err, errlen);
	json_decref(j);
	return rc;
}

int topo_json_read_file(const char *path, char **text, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		int e = errno;
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(e));
		return -e;
	}
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	int rc = 0;
	while (buf) {
		len += fread(buf + len, 1, cap - len - 1, f);
		if (len < cap - 1)
			break;
		char *bigger = realloc(buf, cap * 2);
		if (!bigger) {
			free(buf);
			buf = NULL;
			break;
		}
		buf = bigger;
		cap *= 2;
	}
	if (!buf) {
		snprintf(err, errlen, "out of memory reading %s", path);
		rc = -ENOMEM;
	} else if (ferror(f)) {
		snprintf(err, errlen, "cannot read %s", path);
		free(buf);
		rc = -EIO;
	} else {
		buf[len] = '\0';
		*text = buf;
	}
	fclose(f);
	return rc;
}

/* Prefixes err with the file name, so that a message says where. */
static void err_in_file(const char *path, char *err, size_t errlen)
{
	char tmp[512];
	snprintf(tmp, sizeof(tmp), "%s", err);
	snprintf(err, errlen, "%s: %s", path, tmp);
}

int topo_json_load_file(const char *path, struct topo_model **out, char *err, size_t errlen)
{
	char *text;
	*out = NULL;
	int rc = topo_json_read_file(path, &text, err, errlen);
	if (rc < 0)
		return rc;
	rc = topo_json_parse(text, out, err, errlen);
	if (rc == -EINVAL)
		err_in_file(path, err, errlen);
	free(text);
	return rc;
}

/* ---------------------------------------------------------------- model: writing */

/* Bandwidths and latencies print without float noise (25, not 25.0000001). */
static json_t *json_num(double x)
{
	double r = (double)(long long)(x * 1000 + (x >= 0 ? 0.5 : -0.5)) / 1000;
	if (r == (double)(json_int_t)r)
		return json_integer((json_int_t)r);
	return json_real(r);
}

json_t *topo_json_model(const struct topo_model *m)
{
	json_t *devices = json_array(), *links = json_array(), *nics = json_array();
	json_t *o = json_pack("{s:i, s:s, s:o, s:o, s:o}", "version", TOPO_JSON_VERSION, "name", m->name, "devices",
	                      devices, "links", links, "nics", nics);
	if (!o)
		return NULL;
	for (unsigned i = 0; i < m->ndev; i++) {
		const struct topo_device *d = &m->dev[i];
		json_t *jd = json_pack("{s:i, s:s, s:s, s:i, s:s}", "index", (int)i, "name", d->name, "pci_bus_id",
		                       d->pci_bus_id, "numa_node", d->numa_node, "cpu_affinity", d->cpu_affinity);
		if (json_array_append_new(devices, jd) < 0)
			goto fail;
	}
	for (unsigned a = 0; a < m->ndev; a++) {
		for (unsigned b = a + 1; b < m->ndev; b++) {
			const struct topo_link *l = topo_model_link(m, a, b);
			json_t *jl = json_pack("{s:i, s:i, s:s}", "a", (int)a, "b", (int)b, "type", topo_link_type_name(l->type));
			if (!jl)
				goto fail;
			if (topo_link_is_nvlink(l)) {
				json_object_set_new(jl, "nvlinks", json_integer(l->nvlinks));
				if (l->nvlink_gen)
					json_object_set_new(jl, "nvlink_gen", json_integer(l->nvlink_gen));
			}
			json_object_set_new(jl, "bw_gbps", json_num(l->bw_gbps));
			json_object_set_new(jl, "lat_us", json_num(l->lat_us));
			if (json_array_append_new(links, jl) < 0)
				goto fail;
		}
	}
	for (unsigned i = 0; i < m->nnic; i++) {
		const struct topo_nic *n = &m->nic[i];
		json_t *jn = json_pack("{s:s, s:s, s:i, s:o}", "name", n->name, "pci_bus_id", n->pci_bus_id, "numa_node",
		                       n->numa_node, "bw_gbps", json_num(n->bw_gbps));
		if (json_array_append_new(nics, jn) < 0)
			goto fail;
	}
	return o;
fail:
	json_decref(o);
	return NULL;
}

char *topo_json_dump(const struct topo_model *m)
{
	json_t *j = topo_json_model(m);
	if (!j)
		return NULL;
	char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
	json_decref(j);
	if (!s)
		return NULL;
	size_t len = strlen(s);
	char *t = realloc(s, len + 2);
	if (!t) {
		free(s);
		return NULL;
	}
	t[len] = '\n';
	t[len + 1] = '\0';
	return t;
}

/* ---------------------------------------------------------------- selection table */

static json_t *entry_json(enum topo_coll coll, unsigned k, unsigned b0, unsigned b1, const struct topo_select_row *row)
{
	json_t *e = json_pack("{s:s, s:i, s:I}", "coll", topo_coll_name(coll), "nranks", (int)k, "min_bytes",
	                      (json_int_t)(b0 == 0 ? 0 : topo_bucket_max(b0 - 1) + 1));
	if (!e)
		return NULL;
	/* The last bucket has no upper bound: no max_bytes. */
	if (b1 + 1 < TOPO_SIZE_BUCKETS)
		json_object_set_new(e, "max_bytes", json_integer((json_int_t)topo_bucket_max(b1)));
	json_object_set_new(e, "algo", json_string(topo_algo_name(row->choice[b0].algo)));
	json_object_set_new(e, "channels", json_integer(row->choice[b0].channels));
	if (row->tuned[b0])
		json_object_set_new(e, "tuned", json_true());
	return e;
}

json_t *topo_json_select_table(const struct topo_select_table *t)
{
	static const char *const force_names[TOPO_FORCE_COUNT_] = {"auto", "direct", "ring", "tree", "multitree"};
	const struct topo_select_params *p = &t->params;
	json_t *entries = json_array();
	json_t *o = json_pack("{s:i, s:{s:o, s:o, s:i, s:i, s:o, s:s}, s:o}", "version", TOPO_JSON_VERSION, "params",
	                      "step_us", json_num(p->step_us), "channel_gbps", json_num(p->channel_gbps), "max_channels",
	                      (int)p->max_channels, "ntrees", (int)p->ntrees, "penalty", json_num(p->penalty), "force",
	                      (unsigned)p->force < TOPO_FORCE_COUNT_ ? force_names[p->force] : "auto", "entries", entries);
	if (!o)
		return NULL;
	for (int c = 0; c < TOPO_COLL_COUNT_; c++) {
		for (unsigned k = 2; k <= t->max_ranks; k++) {
			const struct topo_select_row *row = topo_select_row_at(t, (enum topo_coll)c, k);
			if (!row->computed)
				continue;
			/* Adjacent buckets with the same choice make one range. */
			unsigned b0 = 0;
			for (unsigned b = 1; b <= TOPO_SIZE_BUCKETS; b++) {
				if (b < TOPO_SIZE_BUCKETS && row->choice[b].algo == row->choice[b0].algo &&
				    row->choice[b].channels == row->choice[b0].channels && row->tuned[b] == row->tuned[b0])
					continue;
				if (json_array_append_new(entries, entry_json((enum topo_coll)c, k, b0, b - 1, row)) < 0)
					goto fail;
				b0 = b;
			}
		}
	}
	return o;
fail:
	json_decref(o);
	return NULL;
}

static int read_tuning_entry(struct reader *r, struct topo_select_table *t, const json_t *o, unsigned i)
{
	static const char *const keys[] = {"coll", "nranks", "min_bytes", "max_bytes", "algo", "channels", "tuned", NULL};
	char where[32], coll[32], algo[32];
	snprintf(where, sizeof(where), "entries[%u]", i);
	json_int_t nranks = 0, lo = 0, hi = 0, channels = 1;
	int rc = check_keys(r, o, where, keys);
	if (rc == 0)
		rc = get_string(r, o, where, "coll", 1, coll, sizeof(coll));
	if (rc == 0)
		rc = get_int(r, o, where, "nranks", 0, 0, TOPO_MAX_RANKS, 0, &nranks);
	if (rc == 0)
		rc = get_int(r, o, where, "min_bytes", 0, 0, INT64_MAX, 0, &lo);
	if (rc == 0)
		rc = get_int(r, o, where, "max_bytes", 0, 0, INT64_MAX, INT64_MAX, &hi);
	if (rc == 0)
		rc = get_string(r, o, where, "algo", 1, algo, sizeof(algo));
	if (rc == 0)
		rc = get_int(r, o, where, "channels", 1, 1, TOPO_MAX_TREES, 1, &channels);
	if (rc < 0)
		return rc;
	int c = strcmp(coll, "*") == 0 ? TOPO_COLL_COUNT_ : topo_coll_parse(coll);
	if (c < 0)
		return fail(r, "%s.coll: '%s' is not a collective (allreduce, allgather, reducescatter, broadcast, "
		               "reduce, or * for all)", where, coll);
	int a = topo_algo_parse(algo);
	if (a < 0)
		return fail(r, "%s.algo: '%s' is not an algorithm (oneshot, twoshot, ring, tree, multitree)", where, algo);
	if (lo > hi)
		return fail(r, "%s: min_bytes %" JSON_INTEGER_FORMAT " is above max_bytes %" JSON_INTEGER_FORMAT, where, lo, hi);
	if ((unsigned)nranks > t->max_ranks)
		return 0; /* a communicator this table does not describe */
	struct topo_choice ch = {(enum topo_algo)a, (unsigned)channels};
	uint64_t max = hi == INT64_MAX ? UINT64_MAX : (uint64_t)hi;
	rc = topo_select_override(t, (enum topo_coll)c, (unsigned)nranks, (uint64_t)lo, max, &ch);
	if (rc == -EINVAL)
		return fail(r, "%s: %s on %u channel%s cannot run %s", where, algo, ch.channels, ch.channels == 1 ? "" : "s",
		            coll);
	return rc < 0 ? rc : 0;
}

int topo_json_apply_tuning(struct topo_select_table *t, const char *text, char *err, size_t errlen)
{
	static const char *const keys[] = {"version", "entries", "params", NULL};
	struct reader r = {err, errlen};
	json_error_t je;
	json_t *j = json_loads(text, 0, &je);
	if (!j)
		return fail(&r, "not valid JSON: line %d, column %d: %s", je.line, je.column, je.text);
	json_t *entries;
	int rc = check_keys(&r, j, "(top level)", keys);
	if (rc == 0)
		rc = check_version(&r, j, "(top level)");
	if (rc == 0)
		rc = get_array(&r, j, "(top level)", "entries", 1, 0, SIZE_MAX, &entries);
	for (unsigned i = 0; rc == 0 && i < json_array_size(entries); i++)
		rc = read_tuning_entry(&r, t, json_array_get(entries, i), i);
	if (rc == 0)
		rc = (int)json_array_size(entries);
	json_decref(j);
	return rc;
}

int topo_json_load_tuning(struct topo_select_table *t, const char *path, char **text_out, char *err, size_t errlen)
{
	char *text;
	int rc = topo_json_read_file(path, &text, err, errlen);
	if (rc < 0)
		return rc;
	rc = topo_json_apply_tuning(t, text, err, errlen);
	if (rc == -EINVAL)
		err_in_file(path, err, errlen);
	if (rc >= 0 && text_out) {
		*text_out = text;
		text = NULL;
	}
	free(text);
	return rc;
}

/* ---------------------------------------------------------------- the document */

static json_t *ring_json(const struct topo_ring *r)
{
	json_t *order = json_array();
	for (unsigned i = 0; i < r->n; i++)
		json_array_append_new(order, json_integer(r->order[i]));
	return json_pack("{s:o, s:o}", "order", order, "bw_gbps", json_num(r->bw_gbps));
}

static json_t *tree_json(const struct topo_tree *t)
{
	json_t *parent = json_array(), *level = json_array();
	for (unsigned i = 0; i < t->n; i++) {
		json_array_append_new(parent, json_integer(t->parent[i]));
		json_array_append_new(level, json_integer(t->level[i]));
	}
	return json_pack("{s:i, s:i, s:o, s:o, s:o}", "root", (int)t->root, "height", (int)t->height, "bw_gbps",
	                 json_num(t->bw_gbps), "parent", parent, "level", level);
}

char *topo_json_document(const struct topo_model *m, const struct topo_ring *rings, unsigned nrings,
                         const struct topo_tree *trees, unsigned ntrees, const struct topo_select_table *t)
{
	json_t *jr = json_array(), *jt = json_array();
	for (unsigned i = 0; i < nrings; i++)
		json_array_append_new(jr, ring_json(&rings[i]));
	for (unsigned i = 0; i < ntrees; i++)
		json_array_append_new(jt, tree_json(&trees[i]));
	json_t *doc = json_pack("{s:o?, s:o, s:o, s:o?}", "model", topo_json_model(m), "rings", jr, "trees", jt,
	                        "selection", t ? topo_json_select_table(t) : json_null());
	if (!doc)
		return NULL;
	char *s = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
	json_decref(doc);
	return s;
}
