/*
 * One user cannot starve or exhaust the daemon: the attacks of a hostile
 * client, each beside an ordinary client that must not notice.
 *
 * - Collective flood (two uids, root only): a flooder of one uid submits
 *   collectives its peer never joins, far past max-inflight-per-session, and
 *   then holds as many stuck ones as it may, while a victim job of another
 *   uid runs all-reduces on the same devices. The flooder gets the limit
 *   error; the victim's results are right and its run takes at most twice as
 *   long as the same run without the flooder (measured here, as a ratio);
 *   the workers' resident memory grows by less than FLOOD_RSS_BOUND.
 * - The same with a flooder of several sessions (ranks of one job), each
 *   within max-inflight-per-session but together past max-inflight-per-uid:
 *   the flood ends with the error naming the per-uid limit, and the victim
 *   keeps its latency and its results.
 * - Registration flood: registrations past max-regs-per-session, and past
 *   the descriptor budget under a low RLIMIT_NOFILE, are refused with the
 *   setting named, while a client of another uid still connects, attaches
 *   both devices and queries; once the flooder leaves it registers too.
 * - A client that stops reading its replies is disconnected; another is
 *   served throughout. A connection that never says Hello is closed after
 *   hello-timeout-ms.
 *
 * Where the test does not run as root, the tests that need two uids skip
 * and say so.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl.h"
#include "harness.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x
#define VICTIM_UID 40001
#define FLOODER_UID 40002
#define FLOOD_ENTRIES 30000     /* the attack grew a worker by ~0.9 KB per entry */
#define FLOOD_HELD 200          /* stuck collectives the flooder keeps, within its limit */
#define UID_SESSION_LIMIT "120" /* max-inflight-per-session of the per-uid flood's daemon */
#define UID_LIMIT "160"         /* its max-inflight-per-uid */
#define UID_FLOOD_RANKS 4       /* the per-uid flooder's ranks: the even ones, on device 0, flood */
#define UID_FLOOD_ENTRIES 100   /* each flooding rank's: within its own limit, past the uid's together */
#define UID_FLOOD_HELD 75       /* stuck collectives each keeps, within both limits */
#define FLOOD_RSS_BOUND (16 << 20)
#define VICTIM_ITERS 600
#define VICTIM_COUNT 4096

static int need_root(void)
{
	if (geteuid() == 0)
		return 1;
	fprintf(stderr, "skipped: needs root, to run clients of two different uids\n");
	return 0;
}

/* Drops this (child) process to uid, keeping nothing of root. */
static int become(uid_t uid)
{
	return setgroups(0, NULL) == 0 && setgid(uid) == 0 && setuid(uid) == 0 ? 0 : -1;
}

static dfcclResult_t init_rank(dfcclComm_t *comm, int nranks, const dfcclUniqueId *id, int rank)
{
	dfcclResult_t r = dfcclSetDevice(rank % 2); /* for dfcclMemAlloc too */
	if (r != dfcclSuccess)
		return r;
	return dfcclCommInitRank(comm, nranks, *id, rank);
}

/* ------------------------------------------------------------ the victim */

struct victim {
	dfcclUniqueId id;
	int time_fd; /* rank 0 writes the run's milliseconds (uint64_t) */
};

/* VICTIM_ITERS all-reduces of VICTIM_COUNT floats, each checked against
 * the sum computed here: rank r contributes (r + 1) * (i + k % 7). */
static int victim_main(void *arg, int rank)
{
	struct victim *v = arg;
	if (become(VICTIM_UID) < 0)
		RANK_FAIL("cannot become uid %d: %s", VICTIM_UID, strerror(errno));
	dfcclComm_t comm;
	if (init_rank(&comm, 2, &v->id, rank) != dfcclSuccess)
		RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	float *send, *recv;
	if (dfcclMemAlloc((void **)&send, VICTIM_COUNT * sizeof(float)) != dfcclSuccess ||
	    dfcclMemAlloc((void **)&recv, VICTIM_COUNT * sizeof(float)) != dfcclSuccess)
		RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
	uint64_t t0 = now_ms();
	for (int i = 0; i < VICTIM_ITERS; i++) {
		for (int k = 0; k < VICTIM_COUNT; k++)
			send[k] = (float)((rank + 1) * (i + k % 7));
		if (dfcclAllReduce(send, recv, VICTIM_COUNT, dfcclFloat, dfcclSum, comm, NULL) != dfcclSuccess ||
		    dfcclCommSynchronize(comm) != dfcclSuccess)
			RANK_FAIL("all-reduce %d: %s", i, dfcclGetLastError(comm));
		for (int k = 0; k < VICTIM_COUNT; k++)
			if (recv[k] != (float)(3 * (i + k % 7)))
				RANK_FAIL("all-reduce %d: element %d is %g, expected %d", i, k, recv[k], 3 * (i + k % 7));
	}
	uint64_t ms = now_ms() - t0;
	if (rank == 0 && write(v->time_fd, &ms, sizeof(ms)) != sizeof(ms))
		RANK_FAIL("time pipe");
	if (dfcclCommDestroy(comm) != dfcclSuccess)
		RANK_FAIL("destroy: %s", dfcclGetLastError(NULL));
	return 0;
}

/* Runs the victim job; returns its run's milliseconds. */
static uint64_t victim_run(void)
{
	struct victim v;
	int p[2];
	assert_int_equal(dfcclGetUniqueId(&v.id), dfcclSuccess);
	assert_int_equal(pipe(p), 0);
	v.time_fd = p[1];
	pid_t r0 = child_run(victim_main, &v, 0), r1 = child_run(victim_main, &v, 1);
	assert_int_equal(child_wait(r0, 120000), 0);
	assert_int_equal(child_wait(r1, 120000), 0);
	uint64_t ms = 0;
	assert_int_equal(read(p[0], &ms, sizeof(ms)), sizeof(ms));
	close(p[0]);
	close(p[1]);
	return ms ? ms : 1;
}

/* ------------------------------------------------------------ the flooder */

struct flooder {
	dfcclUniqueId a, b;
	int nranks;          /* ranks of the flooding job: the even ones (on device 0) flood */
	int entries;         /* all-reduces each flooding rank submits on communicator a */
	int held;            /* stuck ones each keeps on communicator b, within the limits */
	const char *setting; /* the limit the flood must end at */
	int ready_fd;        /* each flooding rank writes one byte once it holds its stuck collectives */
	int go_fd;           /* every rank reads one byte before it leaves */
};

/*
 * The even ranks submit `entries` all-reduces on communicator a, which the
 * odd ones never join in (the attack): they must end with the
 * error naming `setting`. Then each keeps `held` stuck ones on
 * communicator b until told to go.
 */
static int flooder_main(void *arg, int rank)
{
	struct flooder *f = arg;
	if (become(FLOODER_UID) < 0)
		RANK_FAIL("cannot become uid %d: %s", FLOODER_UID, strerror(errno));
	dfcclComm_t a, b;
	if (init_rank(&a, f->nranks, &f->a, rank) != dfcclSuccess || init_rank(&b, f->nranks, &f->b, rank) != dfcclSuccess)
		RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	float *buf;
	if (dfcclMemAlloc((void **)&buf, 64 * sizeof(float)) != dfcclSuccess)
		RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
	char byte = 'x';
	if (rank % 2 == 0) {
		for (int i = 0; i < f->entries; i++) {
			dfcclResult_t r = dfcclAllReduce(buf, buf, 64, dfcclFloat, dfcclSum, a, NULL);
			if (r != dfcclSuccess && r != dfcclSystemError)
				RANK_FAIL("submission %d: %s", i, dfcclGetLastError(a));
		}
		dfcclResult_t r = dfcclCommSynchronize(a);
		if (r != dfcclSystemError || !strstr(dfcclGetLastError(a), f->setting))
			RANK_FAIL("the flood ended with %d (%s), not the error naming %s", r, dfcclGetLastError(a),
			          f->setting);
		for (int i = 0; i < f->held; i++)
			if (dfcclAllReduce(buf, buf, 64, dfcclFloat, dfcclSum, b, NULL) != dfcclSuccess)
				RANK_FAIL("held submission %d: %s", i, dfcclGetLastError(b));
		if (write(f->ready_fd, &byte, 1) != 1)
			RANK_FAIL("ready pipe");
	}
	if (read(f->go_fd, &byte, 1) != 1)
		RANK_FAIL("go pipe");
	dfcclCommAbort(b);
	dfcclCommAbort(a);
	return 0;
}

/* ------------------------------------------------------------ worker memory */

static uint64_t rss_of(int pid)
{
	char path[64], text[4096];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	read_text_file(path, text, sizeof(text));
	const char *p = strstr(text, "VmRSS:");
	return p ? strtoull(p + 6, NULL, 10) * 1024u : 0;
}

/* The summed resident memory of the daemon's workers. */
static uint64_t workers_rss(struct daemon_proc *d)
{
	struct raw_client c;
	assert_int_equal(raw_connect(&c, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	dfccl_envelope *r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	uint64_t sum = 0;
	for (size_t i = 0; i < r->query_reply->status->n_devices; i++) {
		uint64_t rss = rss_of(r->query_reply->status->devices[i]->worker_pid);
		assert_true(rss > 0);
		sum += rss;
	}
	frame_envelope_free(r);
	raw_close(&c);
	return sum;
}

/* ------------------------------------------------------------ tests */

static int setup(void **state)
{
	return daemon_setup2(state);
}

/* The fastest of n victim runs, in ms. */
static uint64_t victim_runs(int n)
{
	uint64_t best = UINT64_MAX;
	for (int i = 0; i < n; i++) {
		uint64_t t = victim_run();
		best = t < best ? t : best;
	}
	return best;
}

/* Reads one byte of fd within ms milliseconds; 0 when it came. */
static int read_byte_within(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char byte;
	return poll(&p, 1, ms) == 1 && read(fd, &byte, 1) == 1 ? 0 : -1;
}

/*
 * The victim runs alone, then beside flooder f (whose communicators' ids
 * are made here) once it holds its stuck collectives, then alone again
 * after it left: its time beside the flooder is at most twice its time
 * alone, and the workers' memory grows by less than FLOOD_RSS_BOUND.
 */
static void victim_beside(struct daemon_proc *d, struct flooder *f)
{
	/* Each side is the fastest of five runs: the machine running the test
	 * is shared (2 cores, tests in parallel), and a slow run of either
	 * would be noise, not a finding. */
	uint64_t alone = victim_runs(4);
	uint64_t rss_before = workers_rss(d);

	int ready[2], go[2];
	assert_int_equal(dfcclGetUniqueId(&f->a), dfcclSuccess);
	assert_int_equal(dfcclGetUniqueId(&f->b), dfcclSuccess);
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	f->ready_fd = ready[1];
	f->go_fd = go[0];
	pid_t pids[UID_FLOOD_RANKS];
	assert_true(f->nranks <= UID_FLOOD_RANKS);
	for (int r = 0; r < f->nranks; r++)
		pids[r] = child_run(flooder_main, f, r);
	/* A flooder that fails closes its end: no wait for a byte that cannot
	 * come. One whose flood never ends (no limit reached) is waited for a
	 * minute, and then ended with the others. */
	close(ready[1]);
	for (int r = 0; r < f->nranks; r += 2) {
		if (read_byte_within(ready[0], 60000) == 0)
			continue;
		for (int k = 0; k < f->nranks; k++) {
			kill(pids[k], SIGKILL);
			child_wait(pids[k], 10000);
		}
		fail_msg("the flooding ranks did not all reach the limit error naming %s", f->setting);
	}

	uint64_t flooded = victim_runs(5);
	uint64_t rss_during = workers_rss(d);
	for (int r = 0; r < f->nranks; r++)
		assert_int_equal(write(go[1], "g", 1), 1);
	for (int r = 0; r < f->nranks; r++)
		assert_int_equal(child_wait(pids[r], 60000), 0);
	close(ready[0]);
	close(go[0]);
	close(go[1]);
	/* The daemon serves on after the flooder left. */
	uint64_t again = victim_run();
	alone = again < alone ? again : alone;
	double ratio = (double)flooded / (double)alone;
	fprintf(stderr, "victim: %llu ms alone, %llu ms beside the flooder (ratio %.2f); workers' RSS %llu -> %llu KiB\n",
	        (unsigned long long)alone, (unsigned long long)flooded, ratio, (unsigned long long)rss_before >> 10,
	        (unsigned long long)rss_during >> 10);
	assert_true(ratio <= 2.0);
	assert_true(rss_during < rss_before + FLOOD_RSS_BOUND);
}

static void test_collective_flood(void **state)
{
	if (!need_root())
		skip();
	struct flooder f = {.nranks = 2, .entries = FLOOD_ENTRIES, .held = FLOOD_HELD,
	                    .setting = "max-inflight-per-session"};
	victim_beside(*state, &f);
}

static int setup_uid_limits(void **state)
{
	struct daemon_proc *d = calloc(1, sizeof(*d));
	if (!d || daemon_start(d, 2, "--max-inflight-per-session", UID_SESSION_LIMIT, "--max-inflight-per-uid",
	                       UID_LIMIT, NULL) < 0) {
		free(d);
		return -1;
	}
	*state = d;
	return 0;
}

/* A flooding job of several sessions, each within its own limit, reaches
 * its uid's together. */
static void test_uid_flood(void **state)
{
	if (!need_root())
		skip();
	/* The premise: each session stays within its limit, the uid does not,
	 * and what the flooders keep afterwards is within both. */
	const int per_session = atoi(UID_SESSION_LIMIT), per_uid = atoi(UID_LIMIT), flooding = UID_FLOOD_RANKS / 2;
	assert_true(UID_FLOOD_ENTRIES < per_session && flooding * UID_FLOOD_ENTRIES > per_uid);
	assert_true(flooding * UID_FLOOD_HELD < per_uid);
	struct flooder f = {.nranks = UID_FLOOD_RANKS, .entries = UID_FLOOD_ENTRIES, .held = UID_FLOOD_HELD,
	                    .setting = "max-inflight-per-uid"};
	victim_beside(*state, &f);
}

/* Registers one byte of a fresh memfd on device 0; returns the reply. */
static dfccl_envelope *register_one(struct raw_client *c)
{
	int fd = sealed_memfd(4096);
	assert_true(fd >= 0);
	dfccl_envelope *r = raw_register_memfd(c, 0, 0, 1, fd);
	close(fd);
	assert_non_null(r);
	return r;
}

/* Registers until refused; returns how many succeeded, and checks that the
 * refusal names `setting`. */
static unsigned register_until_refused(struct raw_client *c, unsigned cap, const char *setting)
{
	for (unsigned n = 0; n < cap; n++) {
		dfccl_envelope *r = register_one(c);
		if (r->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR) {
			if (!strstr(r->error->message, setting))
				fail_msg("registration %u refused with \"%s\", which does not name %s", n,
				         r->error->message, setting);
			assert_int_equal(r->error->code, EC(RESOURCE));
			frame_envelope_free(r);
			return n;
		}
		assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY);
		frame_envelope_free(r);
	}
	fail_msg("%u registrations were all accepted; expected a refusal naming %s", cap, setting);
	return cap;
}

/* Attaches device dev: returns 0, closing the descriptors it came with. */
static int attach(struct raw_client *c, uint32_t dev)
{
	int fds[8];
	unsigned nfds = 0;
	dfccl_envelope *r = raw_attach(c, dev, 0, fds, &nfds);
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	int ok = r && r->body_case == DFCCL__V1__ENVELOPE__BODY_ATTACH_REPLY;
	if (r && !ok && r->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR)
		fprintf(stderr, "attach refused: %s\n", r->error->message);
	frame_envelope_free(r);
	return ok ? 0 : -1;
}

/* A client of `uid` (when root) that connects, attaches both devices,
 * queries and, if `reg`, registers: exits 0 when all of it worked. */
struct other {
	const char *socket;
	int reg;
};

static int other_main(void *arg, int rank)
{
	struct other *o = arg;
	if (geteuid() == 0 && become(VICTIM_UID) < 0)
		RANK_FAIL("cannot become uid %d", VICTIM_UID);
	struct raw_client c;
	if (raw_connect(&c, o->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL) < 0)
		RANK_FAIL("connect");
	if (attach(&c, 0) < 0 || attach(&c, 1) < 0)
		RANK_FAIL("attach");
	dfccl_envelope *r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	if (!r)
		RANK_FAIL("query");
	frame_envelope_free(r);
	if (o->reg) {
		r = register_one(&c);
		if (r->body_case != DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY)
			RANK_FAIL("register: %s", r->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR ? r->error->message : "?");
		frame_envelope_free(r);
	}
	raw_close(&c);
	return 0;
}

static int other_client(const char *socket, int reg)
{
	struct other o = {.socket = socket, .reg = reg};
	return child_wait(child_run(other_main, &o, 0), 30000);
}

static void test_registration_count(void **state)
{
	(void)state;
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 2, "--max-regs-per-session", "40", "--max-regs-per-uid", "60", NULL), 0);
	struct raw_client a, b;
	assert_int_equal(raw_connect(&a, d.socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	assert_int_equal(register_until_refused(&a, 100, "max-regs-per-session"), 40);
	/* A second connection of the same uid reaches the uid's limit. */
	assert_int_equal(raw_connect(&b, d.socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	assert_int_equal(register_until_refused(&b, 100, "max-regs-per-uid"), 20);
	/* Another uid is untouched: it attaches and registers. */
	if (geteuid() == 0)
		assert_int_equal(other_client(d.socket, 1), 0);
	raw_close(&a);
	raw_close(&b);
	assert_int_equal(daemon_stop(&d), 0);
}

/* The descriptor budget's run, in a child process: a hard limit once
 * lowered cannot be raised again. Returns 0 or the failed step's line. */
#define CHECK(cond)                                                        \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "budget: failed: %s\n", #cond); \
			return __LINE__;                                   \
		}                                                          \
	} while (0)

static int budget_main(void *arg, int rank)
{
	(void)arg, (void)rank;
	struct rlimit low = {.rlim_cur = 600, .rlim_max = 600};
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
	struct daemon_proc d;
	CHECK(daemon_start(&d, 2, "--max-regs-per-session", "100000", "--max-regs-per-uid", "100000", NULL) == 0);
	struct raw_client a;
	CHECK(raw_connect(&a, d.socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL) == 0);
	unsigned n = 0;
	dfccl_envelope *r;
	for (;;) {
		r = register_one(&a);
		if (r->body_case != DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY)
			break;
		frame_envelope_free(r);
		CHECK(++n < 1000);
	}
	CHECK(r->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR);
	fprintf(stderr, "registrations under a 600-descriptor limit: %u, then \"%s\"\n", n, r->error->message);
	CHECK(strstr(r->error->message, "fd-reserve") != NULL);
	frame_envelope_free(r);
	CHECK(n > 50 && n < 300);
	/* Others still connect, attach and query; dfcclctl's status too. */
	CHECK(other_client(d.socket, 0) == 0);
	/* When the flooder leaves, its descriptors come back. */
	raw_close(&a);
	usleep(200000);
	CHECK(other_client(d.socket, 1) == 0);
	CHECK(daemon_log_contains(&d, "Too many open files") == 0);
	CHECK(daemon_stop(&d) == 0);
	return 0;
}

/* Under a low descriptor limit, one-byte registrations stop at the budget
 * with fd-reserve named, and others still connect and attach. */
static void test_descriptor_budget(void **state)
{
	(void)state;
	assert_int_equal(child_wait(child_run(budget_main, NULL, 0), 60000), 0);
}

/* Sends status queries and never reads the replies: the daemon hangs up
 * once more than its output limit waits; another client is served. */
static void test_reader_stops(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client flood, other;
	assert_int_equal(raw_connect(&flood, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	assert_int_equal(raw_connect(&other, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	Dfccl__V1__Query q = DFCCL__V1__QUERY__INIT;
	q.kind = DFCCL__V1__QUERY_KIND__QUERY_STATUS;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY;
	env.query = &q;
	env.request_id = 1;
	signal(SIGPIPE, SIG_IGN);
	int ended = 0;
	uint64_t deadline = now_ms() + 60000;
	for (unsigned i = 0; !ended && now_ms() < deadline; i++) {
		if (frame_send(flood.fd, &env, NULL, 0) < 0)
			ended = 1;
		if (i % 1000 == 0) {
			dfccl_envelope *r = raw_query(&other, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
			assert_non_null(r);
			frame_envelope_free(r);
		}
	}
	assert_true(ended);
	assert_true(daemon_log_contains(d, "stopped reading its replies") > 0);
	dfccl_envelope *r = raw_query(&other, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	assert_int_equal(r->query_reply->status->nsessions, 1);
	frame_envelope_free(r);
	raw_close(&flood);
	raw_close(&other);
}

static void test_hello_timeout(void **state)
{
	(void)state;
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 1, "--hello-timeout-ms", "300", NULL), 0);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d.socket);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	uint64_t t0 = now_ms();
	char b;
	assert_int_equal(read(fd, &b, 1), 0); /* end of stream, not the 5 s timeout */
	uint64_t waited = now_ms() - t0;
	assert_true(waited >= 250 && waited < 4000);
	close(fd);
	assert_true(daemon_log_contains(&d, "hello-timeout-ms") > 0);
	assert_int_equal(daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_collective_flood, setup, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_uid_flood, setup_uid_limits, daemon_teardown),
	    cmocka_unit_test(test_registration_count),
	    cmocka_unit_test(test_descriptor_budget),
	    cmocka_unit_test_setup_teardown(test_reader_stops, setup, daemon_teardown),
	    cmocka_unit_test(test_hello_timeout),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
