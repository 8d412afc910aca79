/*
 * dfcclctl: what dfccld is doing, from the command line.
 *
 * Each subcommand is one query over a session of its own (client_open with
 * the socket given by --socket, $DFCCL_SOCKET or the default), printed as
 * aligned tables for people or, with --json, as JSON for scripts. The JSON
 * is produced from the protobuf-c descriptors of the reply, so a field added
 * to the protocol appears in it without a change here; the tables choose
 * and format their columns by hand.
 *
 * `tune` is the one subcommand that does more than ask: it runs collectives
 * in rank processes of its own (tune.h).
 *
 * Exit status: 0 success, 1 the daemon could not be reached or refused (or
 * a tune measurement failed), 2 a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "errors.h"
#include "pb_json.h"
#include "tool.h"
#include "topo_json.h"
#include "tune.h"

static const char usage[] =
    "Usage: dfcclctl [--socket PATH] [--json] COMMAND [OPTIONS]\n"
    "Shows the state of dfccld, the node's collective-communication daemon.\n"
    "\n"
    "Commands:\n"
    "  status       daemon version, uptime, engine, MPS, sessions, devices and their workers (pid, uid)\n"
    "  sessions     connected client processes\n"
    "  comms        communicators: ranks, members, state, the ring of their plan (--json: trees too)\n"
    "  queues       queue pairs: submitted, consumed, completed entries\n"
    "  stats        per-device engine counters (CUDA engine: BLOCKS, the daemon-kernel blocks that\n"
    "               completed entries, --json: by_block, how many each; EARLY and GIVEN BACK,\n"
    "               stream-ordered entries taken before their arm and those given back unarmed)\n"
    "  stuck        what waited at least one watch tick, per communicator: the oldest unfinished\n"
    "               collective, the lowest pending run of each registered collective and the lowest\n"
    "               pending message of each sender -> receiver pair; for each, how long, which\n"
    "               ranks submitted it and which did not (pid, device, heartbeat), preemptions\n"
    "               meanwhile; prints nothing when nothing is stuck\n"
    "  abort COMM   fail every pending and later collective of communicator COMM on every rank\n"
    "               (dfcclAborted, naming who did it); its ranks can then shrink or destroy it.\n"
    "               For the communicator's owner and root\n"
    "  shrink COMM --exclude RANKS\n"
    "               abort communicator COMM as abort does, and advise its ranks to shrink it\n"
    "               without RANKS (comma-separated, e.g. 2 or 1,3): dfcclCommGetShrinkAdvice\n"
    "               gives every rank the list, which the others pass to dfcclCommShrink; the\n"
    "               excluded ranks are told to leave. For the communicator's owner and root\n"
    "  dump COMM    the flight recorder of communicator COMM: each rank's last collectives with\n"
    "               their submit, start and end times (ms since the communicator was created,\n"
    "               sampled every watch-interval-ms, -1 when not seen) and status; --json prints\n"
    "               the FlightDumpReply message of proto/dfccl.proto, the schema of the files\n"
    "               dfccld writes into flight-recorder-dir on a timeout\n"
    "  topo         link matrix, the rings and trees in use, the algorithm selection table\n"
    "               --dump       print only the model, as `dfccld --topology FILE` loads it\n"
    "  ping         round trip of NOP entries through a device's queue pair\n"
    "               --device N   the device (default 0)\n"
    "               --count K    how many NOPs (default 5)\n"
    "  tune         measure which algorithm is fastest per collective and size, by running each\n"
    "               (collective, algorithm) in rank processes with DFCCL_ALGO set, every result\n"
    "               checked, and print the tuning file `dfccld --tuning-file FILE` loads; the\n"
    "               table of times goes to stderr (to stdout with --output; none with --json)\n"
    "               --nranks N            rank processes (default 2, or the device count if larger)\n"
    "               --colls LIST          comma-separated, of allreduce allgather reducescatter\n"
    "                                     broadcast reduce (default all five)\n"
    "               -b, --minbytes SIZE   smallest size (default 8; K, M, G suffixes); sizes are\n"
    "                                     the selection table's: all-gather the whole output,\n"
    "                                     reduce-scatter the whole input\n"
    "               -e, --maxbytes SIZE   largest size (default 64M)\n"
    "               -f, --stepfactor N    multiply the size by N between sizes (default 4)\n"
    "               -n, --iters N         timed iterations per size (default 20)\n"
    "               -w, --warmup_iters N  untimed iterations per size (default 5)\n"
    "               --output FILE         write the tuning file there (through a temporary file\n"
    "                                     and a rename) instead of to stdout\n"
    "\n"
    "Options:\n"
    "  -s, --socket PATH   the daemon's socket (default $DFCCL_SOCKET, else " DFCCL_DEFAULT_SOCKET ")\n"
    "  -j, --json          print JSON instead of tables\n"
    "  -h, --help          this text\n"
    "  -V, --version       versions of dfcclctl and its protocol\n"
    "\n"
    "Exit status: 0 success, 1 dfccld unreachable, a failed request or measurement, 2 usage error.\n";

/* ---------------------------------------------------------------- tables */

#define TABLE_MAX_COLS 14

/* Cells are collected first and printed once every column's width is known. */
struct table {
	unsigned ncols;
	char **cells;      /* row-major */
	size_t ncells;
	size_t cap;
};

static void table_init(struct table *t, unsigned ncols)
{
	if (ncols == 0 || ncols > TABLE_MAX_COLS)
		abort(); /* a table of this file is wider than TABLE_MAX_COLS */
	*t = (struct table){.ncols = ncols};
}

static void table_cell(struct table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void table_cell(struct table *t, const char *fmt, ...)
{
	char *s;
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	if (t->ncells == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 64;
		char **cells = realloc(t->cells, cap * sizeof(*cells));
		if (!cells) {
			free(s);
			return;
		}
		t->cells = cells;
		t->cap = cap;
	}
	t->cells[t->ncells++] = s;
}

static void table_print_free(struct table *t)
{
	size_t width[TABLE_MAX_COLS] = {0};
	for (size_t i = 0; i < t->ncells; i++) {
		size_t len = t->cells[i] ? strlen(t->cells[i]) : 0;
		if (len > width[i % t->ncols])
			width[i % t->ncols] = len;
	}
	for (size_t i = 0; i < t->ncells; i++) {
		unsigned col = (unsigned)(i % t->ncols);
		const char *s = t->cells[i] ? t->cells[i] : "";
		if (col + 1 == t->ncols || i + 1 == t->ncells)
			printf("%s\n", s);
		else
			printf("%-*s  ", (int)width[col], s);
		free(t->cells[i]);
	}
	free(t->cells);
	*t = (struct table){0};
}

/* A table whose first row is the header. */
static void table_start(struct table *t, unsigned ncols, ...)
{
	va_list ap;
	table_init(t, ncols);
	va_start(ap, ncols);
	for (unsigned i = 0; i < ncols; i++)
		table_cell(t, "%s", va_arg(ap, const char *));
	va_end(ap);
}

/* ---------------------------------------------------------------- formatting */

static void format_duration(char *buf, size_t len, uint64_t ms)
{
	uint64_t s = ms / 1000;
	if (s < 60)
		snprintf(buf, len, "%llu.%llus", (unsigned long long)s, (unsigned long long)(ms % 1000 / 100));
	else if (s < 3600)
		snprintf(buf, len, "%llum %02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
	else if (s < 86400)
		snprintf(buf, len, "%lluh %02llum %02llus", (unsigned long long)(s / 3600),
		         (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60));
	else
		snprintf(buf, len, "%llud %02lluh %02llum", (unsigned long long)(s / 86400),
		         (unsigned long long)(s / 3600 % 24), (unsigned long long)(s / 60 % 60));
}

static void format_bytes(char *buf, size_t len, uint64_t bytes)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	unsigned u = 0;
	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, len, "%.1f %s", v, units[u]);
}

static const char *engine_name(uint32_t engine)
{
	switch (engine) {
	case DFCCL__V1__ENGINE_KIND__ENGINE_HOST: return "host";
	case DFCCL__V1__ENGINE_KIND__ENGINE_CUDA: return "cuda";
	default: return "unknown";
	}
}

/* ---------------------------------------------------------------- JSON */

static void json_print_free(json_t *j)
{
	json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	fputc('\n', stdout);
	json_decref(j);
}

/* ---------------------------------------------------------------- subcommands */

/* "1000 (alice)", or the number alone for a uid without a user name. */
static void format_uid(char *buf, size_t len, uint32_t uid)
{
	const struct passwd *pw = getpwuid((uid_t)uid);
	if (pw && pw->pw_name && *pw->pw_name)
		snprintf(buf, len, "%u (%s)", uid, pw->pw_name);
	else
		snprintf(buf, len, "%u", uid);
}

static const char *worker_user_text(const Dfccl__V1__StatusInfo *s)
{
	if (strcmp(s->worker_user, "job") != 0)
		return "dfccld's own (worker-user daemon)";
	return s->worker_user_can_switch ? "the job's, one user at a time (worker-user job)"
	                                 : "dfccld's own; other users are refused, dfccld is not root (worker-user job)";
}

static void print_status(const Dfccl__V1__StatusInfo *s, const char *socket_path)
{
	char buf[64];
	struct table t;

	format_duration(buf, sizeof(buf), s->uptime_ms);
	printf("dfccld %s, protocol %u, up %s\n\n", s->daemon_version, s->protocol_version, buf);
	table_init(&t, 2);
	table_cell(&t, "engine");
	table_cell(&t, "%s", engine_name(s->engine));
	table_cell(&t, "MPS");
	table_cell(&t, "%s", s->engine != DFCCL__V1__ENGINE_KIND__ENGINE_CUDA ? "n/a (host engine)"
	                     : s->mps_active                                  ? "active"
	                                                                      : "not active");
	table_cell(&t, "socket");
	table_cell(&t, "%s", s->socket_path[0] ? s->socket_path : socket_path);
	table_cell(&t, "sessions");
	table_cell(&t, "%u", s->nsessions);
	table_cell(&t, "communicators");
	if (s->nreleasing_comms)
		table_cell(&t, "%u (%u initializing; %u deleted, waiting for their workers to release them)", s->ncomms,
		           s->npending_comms, s->nreleasing_comms);
	else
		table_cell(&t, "%u (%u initializing)", s->ncomms, s->npending_comms);
	table_cell(&t, "worker uids");
	table_cell(&t, "%s", worker_user_text(s));
	table_print_free(&t);
	printf("\n");

	char uid[96];
	table_start(&t, 8, "DEVICE", "NAME", "PCI BUS ID", "WORKER PID", "UID", "STATE", "RESTARTS", "QUEUE PAIRS");
	for (size_t i = 0; i < s->n_devices; i++) {
		const Dfccl__V1__DeviceInfo *d = s->devices[i];
		format_uid(uid, sizeof(uid), d->worker_uid);
		table_cell(&t, "%u", d->index);
		table_cell(&t, "%s", d->name);
		table_cell(&t, "%s", d->pci_bus_id[0] ? d->pci_bus_id : "-");
		table_cell(&t, "%d", d->worker_pid);
		table_cell(&t, "%s", uid);
		table_cell(&t, "%s", !d->worker_up ? "down" : d->worker_parked ? "parked" : "up");
		table_cell(&t, "%u", d->worker_restarts);
		table_cell(&t, "%u", d->queue_pairs);
	}
	table_print_free(&t);
}

static void print_sessions(const Dfccl__V1__QueryReply *q, const char *socket_path)
{
	struct table t;
	char age[64], bytes[64], devices[256];
	char hb[64];
	table_start(&t, 10, "SESSION", "UID", "PID", "NAME", "COMMS", "REGS", "REGISTERED", "DEVICES", "AGE",
	            "HEARTBEAT");
	for (size_t i = 0; i < q->n_sessions; i++) {
		const Dfccl__V1__SessionInfo *s = q->sessions[i];
		size_t off = 0;
		devices[0] = 0;
		for (size_t k = 0; k < s->n_devices && off < sizeof(devices); k++)
			off += (size_t)snprintf(devices + off, sizeof(devices) - off, "%s%u", k ? "," : "", s->devices[k]);
		format_duration(age, sizeof(age), s->age_ms);
		format_bytes(bytes, sizeof(bytes), s->registered_bytes);
		table_cell(&t, "%llu", (unsigned long long)s->session_id);
		table_cell(&t, "%u", s->uid);
		table_cell(&t, "%d", s->pid);
		table_cell(&t, "%s", s->client_name[0] ? s->client_name : "-");
		table_cell(&t, "%u", s->ncomms);
		table_cell(&t, "%u", s->nregs);
		table_cell(&t, "%s", bytes);
		table_cell(&t, "%s", devices[0] ? devices : "-");
		table_cell(&t, "%s", age);
		format_duration(hb, sizeof(hb), s->heartbeat_age_ms < 0 ? 0 : (uint64_t)s->heartbeat_age_ms);
		if (s->heartbeat_age_ms < 0)
			table_cell(&t, "-");
		else
			table_cell(&t, "%s ago%s", hb, s->stopped ? " (stopped?)" : "");
	}
	table_print_free(&t);
}

static void print_comms(const Dfccl__V1__QueryReply *q, const char *socket_path)
{
	struct table t;
	char age[64], members[512], ring[512];
	table_start(&t, 8, "COMM", "UID", "RANKS", "JOINED", "STATE", "AGE", "RING", "MEMBERS (rank:pid@device)");
	for (size_t i = 0; i < q->n_comms; i++) {
		const Dfccl__V1__CommInfo *c = q->comms[i];
		size_t off = 0;
		members[0] = 0;
		for (size_t k = 0; k < c->n_ranks && off < sizeof(members); k++)
			off += (size_t)snprintf(members + off, sizeof(members) - off, "%s%u:%d@%u", k ? " " : "",
			                        c->ranks[k]->rank, c->ranks[k]->pid, c->ranks[k]->device);
		off = 0;
		snprintf(ring, sizeof(ring), "-");
		for (size_t k = 0; k < c->n_ring && off < sizeof(ring); k++)
			off += (size_t)snprintf(ring + off, sizeof(ring) - off, "%s%u", k ? " " : "", c->ring[k]);
		format_duration(age, sizeof(age), c->age_ms);
		table_cell(&t, "%llu", (unsigned long long)c->comm_id);
		table_cell(&t, "%u", c->uid);
		table_cell(&t, "%u", c->nranks);
		table_cell(&t, "%u", c->joined);
		if (c->n_shrink_exclude) {
			char adv[400];
			size_t o = 0;
			for (size_t k = 0; k < c->n_shrink_exclude && o < sizeof(adv); k++)
				o += (size_t)snprintf(adv + o, sizeof(adv) - o, "%s%u", k ? "," : "", c->shrink_exclude[k]);
			table_cell(&t, "%s (shrink without %s)", c->state, adv);
		} else {
			table_cell(&t, "%s", c->state);
		}
		table_cell(&t, "%s", age);
		table_cell(&t, "%s", ring);
		table_cell(&t, "%s", members);
	}
	table_print_free(&t);
}

static void print_queues(const Dfccl__V1__QueryReply *q, const char *socket_path)
{
	struct table t;
	table_start(&t, 8, "SESSION", "DEVICE", "QP", "ENTRIES", "SUBMITTED", "CONSUMED", "COMPLETED", "ENGINE");
	for (size_t i = 0; i < q->n_queues; i++) {
		const Dfccl__V1__QueueInfo *u = q->queues[i];
		table_cell(&t, "%llu", (unsigned long long)u->session_id);
		table_cell(&t, "%u", u->device);
		table_cell(&t, "%u", u->qp_id);
		table_cell(&t, "%u", u->sq_entries);
		table_cell(&t, "%llu", (unsigned long long)u->sq_tail);
		table_cell(&t, "%llu", (unsigned long long)(u->sq_head ? u->sq_head - 1 : 0));
		table_cell(&t, "%llu", (unsigned long long)u->completed);
		table_cell(&t, "%s", u->engine_state);
	}
	table_print_free(&t);
}

static void print_stats(const Dfccl__V1__QueryReply *q, const char *socket_path)
{
	struct table t;
	table_start(&t, 14, "DEVICE", "COMPLETED", "PREEMPTIONS", "ERRORS", "CTX SWITCHES", "SPINS", "LAUNCHES", "GATED",
	            "QUITS", "EARLY", "GIVEN BACK", "BLOCKS", "QUEUE PAIRS", "WORKER");
	for (size_t i = 0; i < q->n_stats; i++) {
		const Dfccl__V1__DeviceStats *s = q->stats[i];
		table_cell(&t, "%u", s->device);
		table_cell(&t, "%llu", (unsigned long long)s->completed);
		table_cell(&t, "%llu", (unsigned long long)s->preemptions);
		table_cell(&t, "%llu", (unsigned long long)s->errors);
		table_cell(&t, "%llu", (unsigned long long)s->context_switches);
		table_cell(&t, "%llu", (unsigned long long)s->spins);
		table_cell(&t, "%llu", (unsigned long long)s->kernel_launches);
		table_cell(&t, "%llu", (unsigned long long)s->kernel_gated);
		table_cell(&t, "%llu", (unsigned long long)s->kernel_quits);
		table_cell(&t, "%llu", (unsigned long long)s->early_taken);
		table_cell(&t, "%llu", (unsigned long long)s->early_given_back);
		unsigned used = 0;
		for (size_t b = 0; b < s->n_by_block; b++)
			used += s->by_block[b] != 0;
		table_cell(&t, "%u", used);
		table_cell(&t, "%u", s->queue_pairs);
		/* A daemon before the state word: up or down only. */
		table_cell(&t, "%s", s->worker_state && *s->worker_state ? s->worker_state : s->worker_up ? "up" : "down");
	}
	table_print_free(&t);
}

/* What a stuck instance is, as the daemon's timeout error names it:
 * "AllReduce #3", "registered collective 7 (AllReduce) run #2", "Send #1
 * from rank 0 to rank 2" or, when only the receiver submitted it, "Recv #1
 * by rank 2 from rank 0". */
static void stuck_what(const Dfccl__V1__StuckInfo *si, char *buf, size_t len)
{
	unsigned long long seq = (unsigned long long)si->seq;
	switch (si->kind) {
	case DFCCL__V1__STUCK_KIND__STUCK_REGISTERED:
		snprintf(buf, len, "registered collective %u (%s) run #%llu", si->coll_id, si->op, seq);
		break;
	case DFCCL__V1__STUCK_KIND__STUCK_MESSAGE:
		if (strcmp(si->op, "Recv") == 0)
			snprintf(buf, len, "Recv #%llu by rank %u from rank %u", seq, si->dst, si->src);
		else
			snprintf(buf, len, "%s #%llu from rank %u to rank %u", si->op, seq, si->src, si->dst);
		break;
	default:
		snprintf(buf, len, "%s #%llu", si->op, seq);
		break;
	}
}

/* One line per stuck instance, then one per rank taking part in it;
 * nothing at all when nothing is stuck, so scripts can test for empty
 * output. */
static void print_stuck(const Dfccl__V1__QueryReply *q, const char *socket_path)
{
	for (size_t i = 0; i < q->n_stuck; i++) {
		const Dfccl__V1__StuckInfo *si = q->stuck[i];
		char waited[64], idle[64], to[64], what[160];
		format_duration(waited, sizeof(waited), si->waited_ms);
		format_duration(idle, sizeof(idle), si->idle_ms);
		format_duration(to, sizeof(to), si->timeout_ms > 0 ? (uint64_t)si->timeout_ms : 0);
		stuck_what(si, what, sizeof(what));
		printf("%scommunicator %llu (uid %u): %s, %llu elements of %s, waiting %s (no progress for %s; "
		       "timeout %s), %llu preemptions meanwhile\n",
		       i ? "\n" : "", (unsigned long long)si->comm_id, si->uid, what, (unsigned long long)si->count,
		       si->dtype, waited, idle, si->timeout_ms > 0 ? to : "none", (unsigned long long)si->preemptions);
		struct table t;
		table_start(&t, 6, "RANK", "STATE", "PID", "DEVICE", "SESSION", "HEARTBEAT");
		for (size_t k = 0; k < si->n_ranks; k++) {
			const Dfccl__V1__StuckRank *r = si->ranks[k];
			char hb[64];
			format_duration(hb, sizeof(hb), r->heartbeat_age_ms < 0 ? 0 : (uint64_t)r->heartbeat_age_ms);
			table_cell(&t, "%u", r->rank);
			table_cell(&t, "%s", r->state);
			table_cell(&t, "%d", r->pid);
			table_cell(&t, "%u", r->device);
			table_cell(&t, "%llu", (unsigned long long)r->session_id);
			if (r->heartbeat_age_ms < 0)
				table_cell(&t, "-");
			else
				table_cell(&t, "%s ago%s", hb, r->stopped ? " (stopped?)" : "");
		}
		table_print_free(&t);
	}
}

static void print_status_reply(const Dfccl__V1__QueryReply *q, const char *socket_path)
{
	print_status(q->status, socket_path);
}

/*
 * The query subcommands. `field` names the QueryReply field that carries the
 * answer; --json prints it as {"<json_key>": ...}, or, for the status, the
 * StatusInfo object itself.
 */
struct query_cmd {
	const char *name;
	Dfccl__V1__QueryKind kind;
	const char *field;
	const char *json_key; /* NULL: the field's object, unwrapped */
	void (*print)(const Dfccl__V1__QueryReply *q, const char *socket_path);
};

static const struct query_cmd query_cmds[] = {
    {"status", DFCCL__V1__QUERY_KIND__QUERY_STATUS, "status", NULL, print_status_reply},
    {"sessions", DFCCL__V1__QUERY_KIND__QUERY_SESSIONS, "sessions", "sessions", print_sessions},
    {"comms", DFCCL__V1__QUERY_KIND__QUERY_COMMS, "comms", "comms", print_comms},
    {"queues", DFCCL__V1__QUERY_KIND__QUERY_QUEUES, "queues", "queues", print_queues},
    {"stats", DFCCL__V1__QUERY_KIND__QUERY_STATS, "stats", "devices", print_stats},
    {"stuck", DFCCL__V1__QUERY_KIND__QUERY_STUCK, "stuck", "stuck", print_stuck},
};

/* Sends one query; the caller releases *rep. */
static dfcclResult_t query_send(struct client *c, Dfccl__V1__QueryKind kind, struct client_reply *rep)
{
	Dfccl__V1__Query query = DFCCL__V1__QUERY__INIT;
	query.kind = kind;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY;
	req.query = &query;
	return client_request(c, &req, NULL, 0, DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY, rep);
}

static dfcclResult_t run_query(struct client *c, const struct query_cmd *cmd, bool json, const char *socket_path)
{
	struct client_reply rep;
	dfcclResult_t r = query_send(c, cmd->kind, &rep);
	if (r != dfcclSuccess)
		return r;
	const Dfccl__V1__QueryReply *q = rep.env->query_reply;

	if (cmd->kind == DFCCL__V1__QUERY_KIND__QUERY_STATUS && !q->status) {
		r = errors_set(dfcclInternalError, "dfccld answered the status query without a status");
	} else if (json) {
		const ProtobufCFieldDescriptor *f =
		    protobuf_c_message_descriptor_get_field_by_name(q->base.descriptor, cmd->field);
		json_t *v = pb_field_json(&q->base, f);
		json_print_free(cmd->json_key ? json_pack("{s:o}", cmd->json_key, v) : v);
	} else {
		cmd->print(q, socket_path);
	}
	client_reply_release(&rep);
	return r;
}

/* ---------------------------------------------------------------- dump */

static void print_dump(const Dfccl__V1__FlightDumpReply *d)
{
	char age[64];
	format_duration(age, sizeof(age), d->age_ms);
	printf("communicator %llu (uid %u, %u ranks, %s, created %s ago); times in ms since its creation, sampled "
	       "every %u ms (-1: not seen)\n",
	       (unsigned long long)d->comm_id, d->uid, d->nranks, d->state, age, d->interval_ms);
	if (d->failure[0])
		printf("failure: %s\n", d->failure);
	if (d->missed)
		printf("%llu collectives came and went between two samples and are not recorded\n",
		       (unsigned long long)d->missed);
	struct table t;
	table_start(&t, 12, "RANK", "PID", "DEVICE", "OP", "SEQ", "COUNT", "TYPE", "ALGO", "SUBMIT", "START", "END",
	            "STATUS");
	for (size_t i = 0; i < d->n_records; i++) {
		const Dfccl__V1__FlightRecord *f = d->records[i];
		const Dfccl__V1__CommRank *m = f->rank < d->n_ranks ? d->ranks[f->rank] : NULL;
		table_cell(&t, "%u", f->rank);
		table_cell(&t, "%d", m ? m->pid : 0);
		table_cell(&t, "%u", m ? m->device : 0);
		table_cell(&t, "%s", f->op);
		table_cell(&t, "%llu", (unsigned long long)f->seq);
		table_cell(&t, "%llu", (unsigned long long)f->count);
		table_cell(&t, "%s", f->dtype);
		table_cell(&t, "%s", f->algo);
		table_cell(&t, "%lld", (long long)f->submit_ms);
		table_cell(&t, "%lld", (long long)f->start_ms);
		table_cell(&t, "%lld", (long long)f->end_ms);
		table_cell(&t, "%s", f->status);
	}
	table_print_free(&t);
}

static dfcclResult_t run_dump(struct client *c, uint64_t comm_id, bool json)
{
	Dfccl__V1__FlightDump fd = DFCCL__V1__FLIGHT_DUMP__INIT;
	fd.comm_id = comm_id;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_FLIGHT_DUMP;
	req.flight_dump = &fd;
	struct client_reply rep;
	dfcclResult_t r = client_request(c, &req, NULL, 0, DFCCL__V1__ENVELOPE__BODY_FLIGHT_DUMP_REPLY, &rep);
	if (r != dfcclSuccess)
		return r;
	if (json)
		json_print_free(pb_json(&rep.env->flight_dump_reply->base));
	else
		print_dump(rep.env->flight_dump_reply);
	client_reply_release(&rep);
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- abort and shrink */

/* `abort COMM` (n == 0) and `shrink COMM --exclude RANKS` (the n ranks):
 * every rank's collectives on the communicator fail; a shrink also advises
 * its ranks to shrink it without those ranks. */
static dfcclResult_t run_stop(struct client *c, uint64_t comm_id, const int *ranks, int n)
{
	Dfccl__V1__CommRevoke rv = DFCCL__V1__COMM_REVOKE__INIT;
	Dfccl__V1__CommShrinkAdvice a = DFCCL__V1__COMM_SHRINK_ADVICE__INIT;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	uint32_t exclude[DFCCL_COMM_MAX_RANKS];
	char list[400] = "";
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		exclude[i] = (uint32_t)ranks[i];
		if (off < sizeof(list))
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d", i ? ", " : "", ranks[i]);
	}
	rv.comm_id = a.comm_id = comm_id;
	a.exclude = exclude;
	a.n_exclude = (size_t)n;
	req.body_case = n ? DFCCL__V1__ENVELOPE__BODY_COMM_SHRINK_ADVICE : DFCCL__V1__ENVELOPE__BODY_COMM_REVOKE;
	if (n)
		req.comm_shrink_advice = &a;
	else
		req.comm_revoke = &rv;
	dfcclResult_t r = client_request_ok(c, &req);
	if (r == dfcclSuccess && n)
		printf("communicator %llu aborted: its ranks are advised to shrink it without rank%s %s\n",
		       (unsigned long long)comm_id, n > 1 ? "s" : "", list);
	else if (r == dfcclSuccess)
		printf("communicator %llu aborted: its ranks' collectives fail with dfcclAborted\n",
		       (unsigned long long)comm_id);
	return r;
}

/* ---------------------------------------------------------------- topo */

/* The link matrix, like nvidia-smi topo -m, with each device's NUMA node
 * and CPUs. */
static void print_link_matrix(const struct topo_model *m)
{
	char label[16];
	printf("%-7s", "");
	for (unsigned j = 0; j < m->ndev; j++) {
		snprintf(label, sizeof(label), "GPU%u", j);
		printf("%-6s", label);
	}
	printf("NUMA  CPU AFFINITY\n");
	for (unsigned i = 0; i < m->ndev; i++) {
		snprintf(label, sizeof(label), "GPU%u", i);
		printf("%-7s", label);
		for (unsigned j = 0; j < m->ndev; j++) {
			topo_link_label(topo_model_link(m, i, j), label, sizeof(label));
			printf("%-6s", label);
		}
		if (m->dev[i].numa_node >= 0)
			printf("%-6d", m->dev[i].numa_node);
		else
			printf("%-6s", "-");
		printf("%s\n", m->dev[i].cpu_affinity[0] ? m->dev[i].cpu_affinity : "-");
	}
	printf("\nX = self, NV# = # NVLinks, NVS = NVLink through NVSwitch, PIX = one PCIe switch, PXB = several\n"
	       "PCIe switches, PHB = a PCIe host bridge, NODE = host bridges of one NUMA node, SYS = across\n"
	       "sockets, HOST = host engine (copies through host memory)\n");
	for (unsigned i = 0; i < m->nnic; i++)
		printf("NIC %s at %s, NUMA %d, %.1f GB/s\n", m->nic[i].name, m->nic[i].pci_bus_id, m->nic[i].numa_node,
		       m->nic[i].bw_gbps);
}

/* The rings and trees of the document, one line each. */
static void print_rings_trees(const json_t *doc)
{
	size_t i, k;
	json_t *e, *x;
	printf("\nRings (one per channel; slowest hop):\n");
	json_array_foreach(json_object_get(doc, "rings"), i, e) {
		printf("  %2zu:", i);
		json_array_foreach(json_object_get(e, "order"), k, x)
			printf(" %lld", (long long)json_integer_value(x));
		printf("  (%g GB/s)\n", json_number_value(json_object_get(e, "bw_gbps")));
	}
	printf("\nTrees (child>parent at each level; slowest edge):\n");
	json_array_foreach(json_object_get(doc, "trees"), i, e) {
		json_t *parent = json_object_get(e, "parent"), *level = json_object_get(e, "level");
		json_int_t height = json_integer_value(json_object_get(e, "height"));
		printf("  %2zu: root %lld, height %lld:", i, (long long)json_integer_value(json_object_get(e, "root")),
		       (long long)height);
		for (json_int_t l = 1; l <= height; l++) {
			printf(" [");
			int first = 1;
			json_array_foreach(level, k, x) {
				if (json_integer_value(x) != l)
					continue;
				printf("%s%zu>%lld", first ? "" : " ", k, (long long)json_integer_value(json_array_get(parent, k)));
				first = 0;
			}
			printf("]");
		}
		printf("  (%g GB/s)\n", json_number_value(json_object_get(e, "bw_gbps")));
	}
}

/* The selection table's rows for the whole node (every rank count is in
 * --json). */
static void print_selection(const json_t *sel, json_int_t nranks)
{
	struct table t;
	size_t i;
	json_t *e;
	char lo[32], hi[32];
	printf("\nAlgorithm selection for %lld ranks (tuned entries marked *):\n", (long long)nranks);
	table_start(&t, 4, "COLLECTIVE", "SIZES", "ALGORITHM", "CHANNELS");
	json_array_foreach(json_object_get(sel, "entries"), i, e) {
		if (json_integer_value(json_object_get(e, "nranks")) != nranks)
			continue;
		/* Ranges follow each other, so each says where it ends. */
		json_t *max = json_object_get(e, "max_bytes");
		json_int_t min = json_integer_value(json_object_get(e, "min_bytes"));
		if (max)
			format_bytes(hi, sizeof(hi), (uint64_t)json_integer_value(max));
		else
			format_bytes(lo, sizeof(lo), (uint64_t)(min > 0 ? min - 1 : 0));
		table_cell(&t, "%s", json_string_value(json_object_get(e, "coll")));
		table_cell(&t, "%s %s", max ? "up to" : "above", max ? hi : lo);
		table_cell(&t, "%s%s", json_string_value(json_object_get(e, "algo")),
		           json_is_true(json_object_get(e, "tuned")) ? " *" : "");
		table_cell(&t, "%lld", (long long)json_integer_value(json_object_get(e, "channels")));
	}
	table_print_free(&t);
}

/* `topo`: the link matrix, rings, trees and selection table; --json the
 * whole document; --dump the model alone, in the form --topology loads. */
static dfcclResult_t run_topo(struct client *c, bool json, bool dump)
{
	struct client_reply rep;
	dfcclResult_t r = query_send(c, DFCCL__V1__QUERY_KIND__QUERY_TOPOLOGY, &rep);
	if (r != dfcclSuccess)
		return r;
	const char *text = rep.env->query_reply->topology_json;
	char err[512];
	json_error_t je;
	json_t *doc = text && text[0] ? json_loads(text, 0, &je) : NULL;
	struct topo_model *m = NULL;
	if (!doc) {
		r = errors_set(dfcclInternalError, "dfccld sent no topology document (a dfccld without topology support?)");
	} else if (topo_json_from(doc, &m, err, sizeof(err)) < 0) {
		r = errors_set(dfcclInternalError, "dfccld sent a topology model that does not load: %s", err);
	} else if (dump) {
		char *s = topo_json_dump(m);
		if (s)
			fputs(s, stdout);
		free(s);
	} else if (json) {
		/* As the daemon wrote it: 0.8, not 0.80000000000000004. */
		json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
		fputc('\n', stdout);
	} else {
		printf("Topology: %s, %u device%s\n\n", m->name[0] ? m->name : "(unnamed)", m->ndev, m->ndev == 1 ? "" : "s");
		print_link_matrix(m);
		print_rings_trees(doc);
		print_selection(json_object_get(doc, "selection"), m->ndev);
	}
	topo_model_free(m);
	json_decref(doc);
	client_reply_release(&rep);
	return r;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static dfcclResult_t run_ping(struct client *c, int device, long count, bool json)
{
	/* The first NOP also attaches the queue pair; it is not a round trip. */
	dfcclResult_t r = client_nop(c, (uint32_t)device);
	if (r != dfcclSuccess)
		return r;

	uint64_t min = UINT64_MAX, max = 0, sum = 0;
	json_t *samples = json ? json_array() : NULL;
	for (long i = 0; i < count; i++) {
		uint64_t t0 = now_ns();
		r = client_nop(c, (uint32_t)device);
		uint64_t dt = now_ns() - t0;
		if (r != dfcclSuccess)
			break;
		min = dt < min ? dt : min;
		max = dt > max ? dt : max;
		sum += dt;
		/* Every sample in JSON; as text, each one only for a short run. */
		if (json)
			json_array_append_new(samples, json_integer((json_int_t)dt));
		else if (count <= 10)
			printf("nop %ld on device %d: %.1f us\n", i + 1, device, (double)dt / 1e3);
	}
	if (r != dfcclSuccess) {
		json_decref(samples);
		return r;
	}
	if (json) {
		json_t *o = json_pack("{s:i, s:i, s:I, s:I, s:I, s:o}", "device", device, "count", (int)count, "min_ns",
		                      (json_int_t)min, "avg_ns", (json_int_t)(sum / (uint64_t)count), "max_ns",
		                      (json_int_t)max, "ping", samples);
		json_print_free(o);
	} else {
		printf("device %d: %ld NOPs, round trip min/avg/max = %.1f/%.1f/%.1f us\n", device, count,
		       (double)min / 1e3, (double)sum / (double)count / 1e3, (double)max / 1e3);
	}
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- main */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;
	fputs("dfcclctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (see dfcclctl --help)\n", stderr);
	return TOOL_EXIT_USAGE;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"socket", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
	    {"device", required_argument, NULL, 'd'}, {"count", required_argument, NULL, 'c'},
	    {"help", no_argument, NULL, 'h'},         {"version", no_argument, NULL, 'V'},
	    {"dump", no_argument, NULL, 'D'},
	    {"nranks", required_argument, NULL, 'N'}, {"colls", required_argument, NULL, 'C'},
	    {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
	    {"stepfactor", required_argument, NULL, 'f'}, {"iters", required_argument, NULL, 'n'},
	    {"warmup_iters", required_argument, NULL, 'w'}, {"output", required_argument, NULL, 'o'},
	    {"exclude", required_argument, NULL, 'x'},
	    {NULL, 0, NULL, 0},
	};
	const char *socket_path = client_socket_path();
	bool json = false, ping_opts = false, dump = false, tune_given = false;
	struct tune_opts tune_opts = TUNE_OPTS_INIT;
	char err[256];
	long device = 0, count = 5, v;
	int opt, exclude[DFCCL_COMM_MAX_RANKS], nexclude = -1;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "s:jd:c:hVb:e:f:n:w:", opts, NULL)) != -1) {
		tune_given = tune_given || (opt > 0 && strchr("NCbefnwo", opt));
		switch (opt) {
		case 's': socket_path = optarg; break;
		case 'j': json = true; break;
		case 'd':
			if (!tool_parse_long(optarg, 0, INT32_MAX, &device))
				return usage_error("--device takes a device index, not '%s'", optarg);
			ping_opts = true;
			break;
		case 'c':
			if (!tool_parse_long(optarg, 1, 1000000, &count))
				return usage_error("--count takes a number from 1 to 1000000, not '%s'", optarg);
			ping_opts = true;
			break;
		case 'D': dump = true; break;
		case 'N':
			if (!tool_parse_long(optarg, 2, TUNE_MAX_RANKS, &v))
				return usage_error("--nranks takes 2 to %d, not '%s'", TUNE_MAX_RANKS, optarg);
			tune_opts.nranks = (int)v;
			break;
		case 'C':
			if (tune_colls_parse(&tune_opts, optarg, err, sizeof(err)) < 0)
				return usage_error("%s", err);
			break;
		case 'b':
		case 'e':
			if (!tool_parse_size(optarg, opt == 'b' ? &tune_opts.min_bytes : &tune_opts.max_bytes))
				return usage_error("-%c takes a size (K, M, G suffixes), not '%s'", opt, optarg);
			break;
		case 'f':
		case 'n':
		case 'w': {
			/* Counts, bounded as dfccl-perf bounds them (a factor of 1 would
			 * measure one size only). */
			long lo = opt == 'f' ? 2 : opt == 'n' ? 1 : 0, hi = opt == 'f' ? 1024 : 100000000;
			long *to = opt == 'f' ? &tune_opts.factor : opt == 'n' ? &tune_opts.iters : &tune_opts.warmup;
			if (!tool_parse_long(optarg, lo, hi, to))
				return usage_error("-%c takes %ld to %ld, not '%s'", opt, lo, hi, optarg);
			break;
		}
		case 'o': tune_opts.output = optarg; break;
		case 'x':
			if (!tool_parse_list(optarg, DFCCL_COMM_MAX_RANKS - 1, exclude, DFCCL_COMM_MAX_RANKS, &nexclude))
				return usage_error("--exclude takes ranks separated by commas (0 to %u, at most %u of them), not "
				                   "'%s'", DFCCL_COMM_MAX_RANKS - 1, DFCCL_COMM_MAX_RANKS, optarg);
			break;
		case 'h': fputs(usage, stdout); return 0;
		case 'V':
			printf("dfcclctl %d.%d.%d (protocol %u..%u)\n", DFCCL_MAJOR, DFCCL_MINOR, DFCCL_PATCH,
			       DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION);
			return 0;
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return usage_error("no command given");
	const char *name = argv[optind];
	bool dump_cmd = !strcmp(name, "dump"), abort_cmd = !strcmp(name, "abort"), shrink_cmd = !strcmp(name, "shrink");
	unsigned long long comm_id = 0;
	if (dump_cmd || abort_cmd || shrink_cmd) {
		char *end;
		const char *arg = optind + 1 < argc ? argv[optind + 1] : NULL;
		if (!arg)
			return usage_error("%s takes the communicator's id (dfcclctl comms lists them)", name);
		errno = 0;
		comm_id = strtoull(arg, &end, 10);
		if (errno || !*arg || *end || arg[0] == '-' || comm_id == 0)
			return usage_error("%s takes a communicator id (a number from dfcclctl comms), not '%s'", name, arg);
		optind++;
	}
	if (optind + 1 < argc)
		return usage_error("unexpected argument '%s'", argv[optind + 1]);

	const struct query_cmd *cmd = NULL;
	for (size_t i = 0; i < sizeof(query_cmds) / sizeof(query_cmds[0]); i++)
		if (!strcmp(name, query_cmds[i].name))
			cmd = &query_cmds[i];
	bool ping = !strcmp(name, "ping"), topo = !strcmp(name, "topo"), tune = !strcmp(name, "tune");
	if (!cmd && !ping && !topo && !tune && !dump_cmd && !abort_cmd && !shrink_cmd)
		return usage_error("unknown command '%s'", name);
	if (nexclude >= 0 && !shrink_cmd)
		return usage_error("--exclude goes with shrink");
	if (shrink_cmd && nexclude < 0)
		return usage_error("shrink takes --exclude RANKS: the ranks its survivors should drop");
	if (ping_opts && !ping)
		return usage_error("--device and --count go with ping");
	if (dump && !topo)
		return usage_error("--dump goes with topo");
	if (tune_given && !tune)
		return usage_error("--nranks, --colls, -b, -e, -f, -n, -w and --output go with tune");
	if (tune) {
		tune_opts.json = json;
		if (tune_opts_check(&tune_opts, err, sizeof(err)) < 0)
			return usage_error("%s", err);
		return tune_run(&tune_opts, socket_path);
	}

	struct client *c;
	dfcclResult_t r = client_open(socket_path, "dfcclctl", &c);
	if (r == dfcclSuccess) {
		r = ping       ? run_ping(c, (int)device, count, json)
		    : dump_cmd ? run_dump(c, comm_id, json)
		    : abort_cmd ? run_stop(c, comm_id, NULL, 0)
		    : shrink_cmd ? run_stop(c, comm_id, exclude, nexclude)
		    : topo     ? run_topo(c, json, dump)
		           : run_query(c, cmd, json, socket_path);
		client_unref(c);
	}
	if (r != dfcclSuccess) {
		fprintf(stderr, "dfcclctl: %s\n", errors_last());
		return 1;
	}
	return 0;
}
