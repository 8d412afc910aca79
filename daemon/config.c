/*
 * The settings table. Every setting of dfccld is one row here; nothing else
 * parses options. Each row names the field it fills, its type, its bounds
 * and its default, so help text, validation and the three sources (file,
 * environment, command line) cannot drift apart.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "dfccl_queue.h"
#include "log.h"
#include "worker_user.h"

#ifndef DFCCL_VERSION_STRING
#define DFCCL_VERSION_STRING "0.1.0"
#endif

enum setting_type { T_STRING, T_INT, T_SIZE, T_ENUM, T_POW2 };

struct setting {
	const char *name;
	enum setting_type type;
	size_t offset;
	size_t size;          /* for T_STRING: buffer size */
	int64_t min, max;     /* for numbers */
	const char *def;      /* default, as text */
	const char *const *choices; /* for T_ENUM, NULL-terminated; index is the value */
	const char *help;
};

static const char *const engine_choices[] = {"auto", "host", "cuda", NULL};
/* Indexed by enum topo_force (topology/topo_select.h). */
static const char *const algo_choices[DFCCL_ALGO_COUNT_ + 1] = DFCCL_ALGO_NAMES;
/* Indexed by enum log_level: the first three slots are unused. */
static const char *const level_choices[] = {"", "", "", "err", "warn", "notice", "info", "debug", NULL};
static const char *const target_choices[] = {"auto", "stderr", "journal", NULL};
/* Indexed by enum worker_user_setting (worker_user.h). */
static const char *const worker_user_choices[] = {"auto", "daemon", "job", NULL};
DFCCL_STATIC_ASSERT(WORKER_USER_AUTO == 0 && WORKER_USER_DAEMON == 1 && WORKER_USER_JOB == 2,
                    "worker_user_choices follows enum worker_user_setting");

#define F(field) offsetof(struct dfccld_config, field), sizeof(((struct dfccld_config *)0)->field)

static const struct setting settings[] = {
    {"socket", T_STRING, F(socket_path), 0, 0, "/run/dfccl/dfccld.sock", NULL,
     "Unix socket to listen on (a socket passed by systemd takes precedence)"},
    {"config", T_STRING, F(config_file), 0, 0, DFCCLD_DEFAULT_CONFIG, NULL,
     "configuration file of 'name = value' lines (command line and environment only)"},
    {"topology", T_STRING, F(topology_file), 0, 0, "", NULL,
     "topology model file to load instead of detecting the node"},
    {"tuning-file", T_STRING, F(tuning_file), 0, 0, "", NULL,
     "algorithm selection overrides (JSON, see topology/topo_json.h) applied over the cost model"},
    {"algo", T_ENUM, F(algo), 0, 0, "auto", algo_choices,
     "force a collective algorithm where it applies: auto, direct, ring, tree or multitree"},
    {"engine", T_ENUM, F(engine), 0, 0, "auto", engine_choices,
     "engine that executes collectives: host, cuda, or auto (cuda when GPUs are present)"},
    {"host-devices", T_INT, F(host_devices), 1, 64, "2", NULL,
     "number of devices the host engine emulates (one worker process each)"},
    {"host-pci-bus-ids", T_STRING, F(host_pci_bus_ids), 0, 0, "", NULL,
     "PCI bus ids the host engine's emulated devices report, one per device in order, comma-separated (empty: "
     "none); clients that see GPUs then find their device by bus id, as on the cuda engine (for testing)"},
    {"log-level", T_ENUM, F(log_level), 0, 0, "info", level_choices,
     "most verbose level logged: err, warn, notice, info or debug"},
    {"log-target", T_ENUM, F(log_target), 0, 0, "auto", target_choices,
     "where logs go: auto (the journal under systemd, else stderr), stderr or journal"},
    {"max-sessions-per-uid", T_INT, F(max_sessions_per_uid), 1, 65536, "256", NULL,
     "client connections one user may hold at once"},
    {"max-registered-bytes-per-uid", T_SIZE, F(max_registered_bytes_per_uid), 0, INT64_MAX, "64G", NULL,
     "bytes of memory one user may register with the daemon (suffixes K, M, G, T)"},
    {"max-comms-per-uid", T_INT, F(max_comms_per_uid), 1, 1 << 20, "4096", NULL,
     "communicator memberships one user may hold at once"},
    {"comm-init-timeout-ms", T_INT, F(comm_init_timeout_ms), 10, 3600000, "30000", NULL,
     "how long dfcclCommInitRank waits for every rank before failing"},
    {"sq-entries", T_POW2, F(sq_entries), 16, 65536, "1024", NULL,
     "default submission-queue entries per queue pair (a power of two)"},
    {"worker-restart-delay-ms", T_INT, F(worker_restart_delay_ms), 0, 60000, "100", NULL,
     "delay before restarting a worker that died; doubles on each quick repeat, up to 5 s"},
    {"worker-start-timeout-ms", T_INT, F(worker_start_timeout_ms), 100, 600000, "30000", NULL,
     "how long a worker may take to report ready before it is killed and restarted"},
    {"shutdown-grace-ms", T_INT, F(shutdown_grace_ms), 0, 60000, "2000", NULL,
     "on SIGTERM, how long workers get to exit before they are killed"},
    {"worker-user", T_ENUM, F(worker_user), 0, 0, "auto", worker_user_choices,
     "whose uid workers run as: daemon (dfccld's own), job (each device's worker as the uid of the job using "
     "it, one user at a time; needs root), or auto (job under MPS, which serves one uid at a time, else daemon)"},
    {"spin-head", T_INT, F(spin_head), 1, 100000000, "20000", NULL,
     "polls a collective at the head of a device's task queue waits on a peer before it is preempted"},
    {"spin-other", T_INT, F(spin_other), 1, 100000000, "8", NULL,
     "polls any other collective waits on a peer before it is preempted"},
    {"stick-mult", T_INT, F(stick_mult), 1, 1000, "20", NULL,
     "after a collective progressed, its thresholds are multiplied by this (adaptive stickiness)"},
    {"spin-max", T_INT, F(spin_max), 1, 1000000000, "2000000", NULL,
     "the largest spin threshold stickiness can reach"},
    {"channels", T_INT, F(channels), 1, 32, "32", NULL,
     "cuda engine: channels of each GPU's daemon kernel, a block each (resident-blocks adds blocks beside "
     "them); a collective uses up to this many, by size "
     "(without MPS the kernel and the trainers' kernels take turns on the whole GPU, so its blocks cost them "
     "nothing)"},
    {"channels-mps", T_INT, F(channels_mps), 1, 32, "32", NULL,
     "cuda engine under MPS (where the daemon kernel runs beside the trainers' kernels and each of its blocks "
     "holds an SM while it is resident): its channels"},
    {"spread-blocks", T_INT, F(spread_blocks), 0, 1, "1", NULL,
     "cuda engine: 1 starts each collective that uses fewer channels than the daemon kernel has blocks on a "
     "block chosen by its instance number and a hash of its communicator (and registered collective, or the "
     "ranks of a message), the same on every rank, so that small collectives run side by side on different "
     "blocks; 0 starts every collective on block 0"},
    {"kernel-idle-us", T_INT, F(kernel_idle_us), 0, 60000000, "200", NULL,
     "cuda engine: microseconds a daemon kernel with nothing to do stays resident before it quits; without MPS "
     "keep it short, since a resident kernel makes the trainers' kernels wait for time slices"},
    {"kernel-idle-mps-us", T_INT, F(kernel_idle_mps_us), 0, 60000000, "5000", NULL,
     "cuda engine under MPS (where a resident daemon kernel runs beside the trainers' kernels): microseconds it "
     "stays resident with nothing to do, so that a trainer whose compute between two collectives is shorter "
     "pays no relaunch; with the launch gate, after collectives the CPU armed only (launch-gate-idle-us)"},
    {"resident-blocks", T_INT, F(resident_blocks), 0, 8, "0", NULL,
     "cuda engine: 0 runs the daemon kernel as one grid of `channels` blocks, resident while it has work; N "
     "adds N resident blocks, which run the queue reader and single-channel collectives, and makes each of the "
     "`channels` blocks a bulk block: launched when a collective of more channels (or one of a single channel "
     "while the GPU's kernel holds 4 N collectives or more) comes to it, it leaves after bulk-idle-us without one "
     "(with fewer than 2 channels: one grid)"},
    {"resident-blocks-mps", T_INT, F(resident_blocks_mps), 0, 8, "1", NULL,
     "cuda engine under MPS (where each resident block holds an SM the trainers' kernels cannot use): "
     "resident-blocks"},
    {"bulk-idle-us", T_INT, F(bulk_idle_us), 0, 60000000, "1000", NULL,
     "cuda engine with resident-blocks: microseconds a bulk block stays with nothing to do before "
     "it leaves. A block that stays holds its SM: a job whose collectives of several channels come closer "
     "together than this keeps its bulk blocks, and another process's kernels on the GPU lack those SMs; 0 "
     "gives them back at once, at the price of a launch for each such collective"},
    {"launch-gate", T_INT, F(launch_gate), 0, 1, "0", NULL,
     "cuda engine: 1: while the daemon kernel is stopped and an entry is posted for a stream to arm, its "
     "launch waits on the GPU behind a wait on that entry's arm word, so that the stream arming it starts "
     "the kernel with no worker in the path (the worker opens the gate itself to launch for anything else)"},
    {"launch-gate-mps", T_INT, F(launch_gate_mps), 0, 1, "1", NULL,
     "cuda engine under MPS (where a kernel that stays resident between collectives holds SMs the trainers' "
     "kernels lack): launch-gate"},
    {"launch-gate-idle-us", T_INT, F(launch_gate_idle_us), 0, 60000000, "5", NULL,
     "cuda engine with the launch gate on: microseconds the daemon kernel stays with nothing to do when the last "
     "collective it took was armed by a stream (the gate launches it again for the next one); after one the CPU "
     "armed, kernel-idle-us (kernel-idle-mps-us) applies. Shorter lets a trainer's next kernel have every SM "
     "sooner, longer keeps back-to-back collectives from relaunching it; the kernel doubles it, up to 40 us, "
     "while launches follow its quits within 100 us, and halves it back after longer gaps"},
    {"early-take", T_INT, F(early_take), 0, 1, "1", NULL,
     "cuda engine: 1 (the default): a stream-ordered collective posted before its stream armed it may be taken "
     "and checked "
     "while the stream's work before it runs, one per queue pair at a time; its block then waits for the arm "
     "and starts it at once (under MPS, back-to-back small all-reduces about a third faster); where such "
     "collectives alone kept the kernel resident for 50 us they go back to their queues and none is taken early "
     "for 10 ms, so that the kernel quits as without them, and one whose communicator fails before its arm goes "
     "back too; 0: entries are taken once armed"},
    {"push-bytes", T_INT, F(push_bytes), 0, 65536, "65536", NULL,
     "cuda engine: all-reduces up to this many bytes on one channel are pushed: each rank writes its data into "
     "the other ranks' GPU memory and reduces what it received, one exchange with no reads across GPUs "
     "(0: never; also bounded by 64 KiB / (ranks - 1))"},
    {"ll-bytes", T_INT, F(ll_bytes), 0, 16384, "16384", NULL,
     "cuda engine: pushed all-reduces up to this many bytes go as lines that carry a flag beside every 4 bytes "
     "of data, so the receivers poll the data itself and no rank waits for a word that says it arrived (0: "
     "never; also bounded by 33 KiB / (2 * (ranks - 1)))"},
    {"chan-bytes", T_SIZE, F(chan_bytes), 16384, 1073741824, "256K", NULL,
     "cuda engine: a collective gets a channel per this many bytes, up to `channels`; fewer bytes per "
     "channel spread middle sizes over more blocks (every daemon of a communicator's GPUs must agree, as "
     "for channels)"},
    {"oneshot-bytes", T_SIZE, F(oneshot_bytes), 0, 1073741824, "64K", NULL,
     "cuda engine: a direct all-reduce on which no rank works in place runs in one shot (every rank reduces "
     "its channels' share from every rank's buffer: no second phase and no wait between) on two ranks at "
     "every size, where it reads no more than two shots, and on more ranks up to this many bytes (0: never, "
     "on two ranks too; every daemon of a communicator's GPUs must agree)"},
    {"visit-bytes", T_SIZE, F(visit_bytes), 65536, 1073741824, "4M", NULL,
     "bytes a collective's channel moves in one visit before it yields its block to the next collective of "
     "the block's queue (on a GPU, a collective alone on its block goes on without yielding): larger visits "
     "move large collectives faster when blocks are shared, smaller ones let other collectives in "
     "sooner"},
    {"coll-timeout-ms", T_INT, F(coll_timeout_ms), 0, 86400000, "600000", NULL,
     "a collective some ranks submitted and others did not, or that made no progress, for this long fails "
     "with a timeout on every rank (0: never); a client's DFCCL_TIMEOUT_MS or config overrides it"},
    {"watch-interval-ms", T_INT, F(watch_interval_ms), 10, 10000, "100", NULL,
     "how often the supervisor samples queues and communicator regions for timeouts, dfcclctl stuck and the "
     "flight recorder (the precision of their times)"},
    {"heartbeat-stale-ms", T_INT, F(heartbeat_stale_ms), 100, 3600000, "2000", NULL,
     "a client whose library has not stored a heartbeat for this long is reported as stopped"},
    {"flight-recorder-entries", T_INT, F(flight_recorder_entries), 0, 65536, "128", NULL,
     "collectives the flight recorder keeps per rank of each communicator (0: no recorder)"},
    {"flight-recorder-keep", T_INT, F(flight_recorder_keep), 0, 4096, "16", NULL,
     "flight recorders kept for `dfcclctl dump` after their communicator is gone"},
    {"flight-recorder-dir", T_STRING, F(flight_recorder_dir), 0, 0, "", NULL,
     "folder where the flight recorder of a communicator that timed out is written as JSON "
     "(comm-ID-TIME.json; empty: not written)"},
    {"hello-timeout-ms", T_INT, F(hello_timeout_ms), 10, 3600000, "10000", NULL,
     "a connection that has not said Hello after this long is closed"},
    {"max-inflight-per-session", T_INT, F(max_inflight_per_session), 1, 512, "256", NULL,
     "collectives one client may have in a device's engine at once; more are refused with a limit error"},
    {"max-inflight-per-uid", T_INT, F(max_inflight_per_uid), 1, 4096, "1024", NULL,
     "collectives one user's clients may have in a device's engine at once, together; more are refused with a "
     "limit error"},
    {"max-regs-per-session", T_INT, F(max_regs_per_session), 1, 1 << 20, "4096", NULL,
     "memory registrations one client connection may hold at once"},
    {"max-regs-per-uid", T_INT, F(max_regs_per_uid), 1, 1 << 24, "16384", NULL,
     "memory registrations one user may hold at once, over all its connections"},
    {"max-comms-per-session", T_INT, F(max_comms_per_session), 1, 1 << 20, "1024", NULL,
     "communicator memberships one client connection may hold at once"},
    {"max-qps-per-uid", T_INT, F(max_qps_per_uid), 1, 1 << 20, "64", NULL,
     "queue pairs (one per connection and device) one user may hold at once; at most 127 keeps every other "
     "user's place in a host engine's task queue"},
    {"fd-reserve", T_INT, F(fd_reserve), 16, 1 << 20, "256", NULL,
     "descriptors that registrations may not use, kept for new connections (dfcclctl too) and their queue pairs"},
};
#define NSETTINGS (sizeof(settings) / sizeof(settings[0]))

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static const struct setting *setting_find(const char *name, size_t len)
{
	for (size_t i = 0; i < NSETTINGS; i++)
		if (strlen(settings[i].name) == len && strncmp(settings[i].name, name, len) == 0)
			return &settings[i];
	return NULL;
}

static int parse_int(const char *v, int64_t *out, int allow_suffix)
{
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (errno || end == v)
		return -EINVAL;
	if (allow_suffix && *end) {
		int64_t mult;
		switch (toupper((unsigned char)*end)) {
		case 'K': mult = 1ll << 10; break;
		case 'M': mult = 1ll << 20; break;
		case 'G': mult = 1ll << 30; break;
		case 'T': mult = 1ll << 40; break;
		default: return -EINVAL;
		}
		end++;
		if (*end == 'B' || *end == 'b')
			end++;
		if (x < 0 || x > INT64_MAX / mult)
			return -ERANGE;
		x *= mult;
	}
	if (*end)
		return -EINVAL;
	*out = x;
	return 0;
}

static int setting_apply(struct dfccld_config *cfg, const struct setting *s, const char *value, char *err,
                         size_t errlen)
{
	char *field = (char *)cfg + s->offset;
	int64_t x;
	int rc;
	switch (s->type) {
	case T_STRING:
		if (strlen(value) >= s->size) {
			seterr(err, errlen, "setting '%s': value is longer than %zu characters", s->name, s->size - 1);
			return -ERANGE;
		}
		memcpy(field, value, strlen(value) + 1);
		return 0;
	case T_ENUM:
		for (int i = 0; s->choices[i]; i++) {
			if (s->choices[i][0] && strcmp(s->choices[i], value) == 0) {
				*(int *)field = i;
				return 0;
			}
		}
		{
			char list[256] = "";
			for (int i = 0; s->choices[i]; i++) {
				if (!s->choices[i][0])
					continue;
				if (list[0])
					strncat(list, ", ", sizeof(list) - strlen(list) - 1);
				strncat(list, s->choices[i], sizeof(list) - strlen(list) - 1);
			}
			seterr(err, errlen, "setting '%s': '%s' is not one of %s", s->name, value, list);
		}
		return -EINVAL;
	case T_INT:
	case T_SIZE:
	case T_POW2:
		rc = parse_int(value, &x, s->type == T_SIZE);
		if (rc < 0) {
			seterr(err, errlen, "setting '%s': '%s' is not %s", s->name, value,
			       s->type == T_SIZE ? "a size (a number with an optional K, M, G or T)" : "an integer");
			return rc;
		}
		if (x < s->min || x > s->max) {
			seterr(err, errlen, "setting '%s': %lld is outside [%lld, %lld]", s->name, (long long)x,
			       (long long)s->min, (long long)s->max);
			return -ERANGE;
		}
		if (s->type == T_POW2 && (x & (x - 1))) {
			seterr(err, errlen, "setting '%s': %lld is not a power of two", s->name, (long long)x);
			return -EINVAL;
		}
		*(int64_t *)field = x;
		return 0;
	}
	return -EINVAL;
}

void config_defaults(struct dfccld_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < NSETTINGS; i++) {
		int rc = setting_apply(cfg, &settings[i], settings[i].def, NULL, 0);
		(void)rc; /* defaults are checked by the unit tests */
	}
}

int config_set(struct dfccld_config *cfg, const char *name, const char *value, char *err, size_t errlen)
{
	const struct setting *s = setting_find(name, strlen(name));
	if (!s) {
		seterr(err, errlen, "unknown setting '%s' (see --help)", name);
		return -ENOENT;
	}
	return setting_apply(cfg, s, value, err, errlen);
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

int config_load_file(struct dfccld_config *cfg, const char *path, int required, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		if (errno == ENOENT && !required)
			return 0;
		int e = errno;
		seterr(err, errlen, "cannot open configuration file %s: %s", path, strerror(e));
		return -e;
	}
	char line[1024];
	int lineno = 0, rc = 0;
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		char *l = trim(line);
		if (!*l)
			continue;
		char *eq = strchr(l, '=');
		if (!eq) {
			seterr(err, errlen, "%s:%d: expected 'name = value'", path, lineno);
			rc = -EINVAL;
			break;
		}
		*eq = '\0';
		char *name = trim(l), *value = trim(eq + 1);
		if (strcmp(name, "config") == 0) {
			seterr(err, errlen, "%s:%d: 'config' cannot be set from a configuration file", path, lineno);
			rc = -EINVAL;
			break;
		}
		char sub[512];
		rc = config_set(cfg, name, value, sub, sizeof(sub));
		if (rc < 0) {
			seterr(err, errlen, "%s:%d: %s", path, lineno, sub);
			break;
		}
	}
	fclose(f);
	return rc;
}

static void env_name(const struct setting *s, char *out, size_t len)
{
	size_t j = snprintf(out, len, "DFCCLD_");
	for (const char *p = s->name; *p && j + 1 < len; p++)
		out[j++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	out[j] = '\0';
}

int config_load_env(struct dfccld_config *cfg, char *err, size_t errlen)
{
	for (size_t i = 0; i < NSETTINGS; i++) {
		char name[64];
		env_name(&settings[i], name, sizeof(name));
		const char *v = getenv(name);
		if (!v)
			continue;
		char sub[512];
		int rc = setting_apply(cfg, &settings[i], v, sub, sizeof(sub));
		if (rc < 0) {
			seterr(err, errlen, "environment %s: %s", name, sub);
			return rc;
		}
	}
	return 0;
}

void config_print_help(FILE *f, const char *argv0)
{
	fprintf(f,
	        "Usage: %s [--name VALUE | --name=VALUE]...\n"
	        "\n"
	        "dfccld is the node's collective-communication daemon: it owns the GPUs (or the\n"
	        "host engine's emulated devices), runs one worker process per device, and serves\n"
	        "libdfccl clients on a Unix socket.\n"
	        "\n"
	        "Settings (also DFCCLD_<NAME> in the environment, or 'name = value' in the\n"
	        "configuration file; the command line wins, then the environment, then the file):\n",
	        argv0);
	for (size_t i = 0; i < NSETTINGS; i++) {
		const struct setting *s = &settings[i];
		char envn[64], bounds[96] = "";
		env_name(s, envn, sizeof(envn));
		if (s->type == T_INT || s->type == T_POW2 || s->type == T_SIZE)
			snprintf(bounds, sizeof(bounds), ", range %lld..%lld", (long long)s->min, (long long)s->max);
		fprintf(f, "  --%-30s %s\n  %-32s default '%s'%s; env %s\n", s->name, s->help, "", s->def, bounds,
		        envn);
	}
	fprintf(f, "  --%-30s %s\n  --%-30s %s\n", "help", "print this help and exit", "version",
	        "print the version and exit");
}

static void setting_format(const struct dfccld_config *cfg, const struct setting *s, char *buf, size_t len)
{
	const char *field = (const char *)cfg + s->offset;
	switch (s->type) {
	case T_STRING: snprintf(buf, len, "%s", field); break;
	case T_ENUM: snprintf(buf, len, "%s", s->choices[*(const int *)field]); break;
	default: snprintf(buf, len, "%lld", (long long)*(const int64_t *)field); break;
	}
}

const char *config_mps_twin(const char *name)
{
	static const char *const twin[][2] = {
	    {"kernel-idle-us", "kernel-idle-mps-us"}, {"channels", "channels-mps"}, {"resident-blocks", "resident-blocks-mps"},
	    {"launch-gate", "launch-gate-mps"}};
	for (size_t k = 0; k < sizeof(twin) / sizeof(twin[0]); k++)
		if (strcmp(name, twin[k][0]) == 0)
			return twin[k][1];
	return name;
}

const char *const *config_worker_settings(size_t *n)
{
	static const char *const names[] = {
	    "log-level",      "log-target",   "spin-head",       "spin-other",          "stick-mult",
	    "spin-max",       "algo",         "channels",        "spread-blocks",       "kernel-idle-us",
	    "resident-blocks", "bulk-idle-us", "launch-gate",    "launch-gate-idle-us", "early-take",
	    "push-bytes",     "ll-bytes",     "visit-bytes",     "chan-bytes",          "oneshot-bytes",
	    "max-inflight-per-session", "max-inflight-per-uid"};
	*n = sizeof(names) / sizeof(names[0]);
	return names;
}

int config_setting_at(size_t i, const char **name, const char **help)
{
	if (i >= NSETTINGS)
		return -1;
	*name = settings[i].name;
	*help = settings[i].help;
	return 0;
}

int config_format(const struct dfccld_config *cfg, const char *name, char *buf, size_t len)
{
	const struct setting *s = setting_find(name, strlen(name));
	if (!s)
		return -ENOENT;
	setting_format(cfg, s, buf, len);
	return 0;
}

void config_dump(const struct dfccld_config *cfg, FILE *f)
{
	for (size_t i = 0; i < NSETTINGS; i++) {
		char v[300];
		setting_format(cfg, &settings[i], v, sizeof(v));
		fprintf(f, "%s %s\n", settings[i].name, v);
	}
}

const char *config_engine_name(int engine)
{
	if (engine < 0 || engine > DFCCLD_ENGINE_CUDA)
		return "?";
	return engine_choices[engine];
}

/* Splits "--name=value" / "--name value"; returns the setting or NULL. */
static int cli_next(int argc, char **argv, int *i, const struct setting **s, const char **value, char *err,
                    size_t errlen)
{
	const char *a = argv[*i];
	if (strncmp(a, "--", 2) != 0) {
		seterr(err, errlen, "unexpected argument '%s' (settings are given as --name VALUE; see --help)", a);
		return -EINVAL;
	}
	a += 2;
	const char *eq = strchr(a, '=');
	size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
	*s = setting_find(a, nlen);
	if (!*s) {
		seterr(err, errlen, "unknown option '%s' (see --help)", argv[*i]);
		return -ENOENT;
	}
	if (eq) {
		*value = eq + 1;
	} else {
		if (*i + 1 >= argc) {
			seterr(err, errlen, "option '--%s' needs a value", (*s)->name);
			return -EINVAL;
		}
		*value = argv[++*i];
	}
	return 0;
}

int config_parse(struct dfccld_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	config_defaults(cfg);

	/* First pass: --help, --version, and where the file is. */
	const char *file = getenv("DFCCLD_CONFIG");
	int explicit_file = file != NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			config_print_help(stdout, argv[0]);
			return 1;
		}
		if (strcmp(argv[i], "--version") == 0) {
			printf("dfccld %s (protocol %u)\n", DFCCL_VERSION_STRING, 1u);
			return 1;
		}
	}
	for (int i = 1; i < argc; i++) {
		const struct setting *s;
		const char *v;
		int rc = cli_next(argc, argv, &i, &s, &v, err, errlen);
		if (rc < 0)
			return rc;
		if (strcmp(s->name, "config") == 0) {
			file = v;
			explicit_file = 1;
		}
	}
	if (!file)
		file = DFCCLD_DEFAULT_CONFIG;
	int rc = config_set(cfg, "config", file, err, errlen);
	if (rc < 0)
		return rc;
	rc = config_load_file(cfg, cfg->config_file, explicit_file, err, errlen);
	if (rc < 0)
		return rc;
	rc = config_load_env(cfg, err, errlen);
	if (rc < 0)
		return rc;
	for (int i = 1; i < argc; i++) {
		const struct setting *s;
		const char *v;
		char sub[512];
		rc = cli_next(argc, argv, &i, &s, &v, err, errlen);
		if (rc < 0)
			return rc;
		rc = setting_apply(cfg, s, v, sub, sizeof(sub));
		if (rc < 0) {
			seterr(err, errlen, "%s", sub);
			return rc;
		}
	}
	return 0;
}
