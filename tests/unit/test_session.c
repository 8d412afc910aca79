/*
 * Tests of client sessions (daemon/session.c, conn.c, comm.c) on a detached
 * server: no listener and no workers, so the server has 0 devices. Each
 * session sits on one end of a socketpair and the test plays the client on
 * the other end, pumping the server's libuv loop with UV_RUN_NOWAIT while it
 * waits for replies.
 *
 * Covered: the Hello handshake (before it, refused; a version range that
 * misses ours, refused and hung up; twice, refused); queries; requests that
 * need a device fail with NOT_FOUND and a sentence; descriptors a request did
 * not ask for are refused and closed; malformed frames get an ErrorReply with
 * request id 0 and, after 16 of them, the connection is closed; a bad length
 * prefix ends the session; the per-uid session quota; a connection that never
 * says Hello is closed after hello-timeout-ms; a client that stops reading
 * its replies is disconnected, another served throughout.
 *
 * Communicators: CommInit on the wire needs an attached device, which needs a
 * worker, so on a detached server it stops at the device check. The
 * communicator logic behind it is driven here through comm_join on real
 * sessions (gathering, replies to every rank, PERMISSION for another uid,
 * timeouts, abort and peer-loss notices, the comm quota, an operator's
 * shrink advice and its refusals); the path from the wire with real
 * workers is the integration tests' job.
 *
 * GPU memory: a server of the CUDA engine whose two workers are fake ones
 * (fake_worker.c), started through the real workers module. A VMM
 * registration reaches every worker with a duplicate of the client's
 * descriptor and is answered once all acknowledged; deregistration and the
 * end of the session let go of it everywhere; bad input (no descriptor, an
 * empty or wrapping range, an IPC handle besides the descriptor, an unknown
 * device, the host engine, a worker's refusal) is refused with a sentence
 * and leaves nothing held or charged. AllocMem: the device's worker
 * allocates, every worker maps it, the client gets the descriptor; bad
 * requests, the host engine, the quota, a worker that cannot allocate,
 * answers without a descriptor or dies, and a client that goes while the
 * worker allocates each end with nothing held, and the worker told to let
 * go of what it made. Descriptors are counted throughout: the test process
 * is the supervisor.
 *
 * The exchange between the workers of a communicator that spans devices,
 * with the same fake workers exporting blobs: each worker gets exactly the
 * other's blob before the ranks hear; a refusal, a worker's death, a rank
 * that leaves meanwhile, a worker that never answers (the init timeout)
 * each fail the init on every rank with a sentence and leave nothing held;
 * without blobs nothing is exchanged.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm.h"
#include "config.h"
#include "devices.h"
#include "frame.h"
#include "log.h"
#include "server.h"
#include "session.h"
#include "testutil.h"
#include "user.h"
#include "workers.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x

struct peer {
	int fd;
	struct frame_reader rd;
	struct session *s; /* valid while the session is open */
};

struct fixture {
	uv_loop_t loop;
	struct server srv;
	struct peer p[4];
	unsigned npeers;
	int fds_before;
	char dir[64];       /* with fake workers: their log and control files */
	char log[96], ctl[96];
};

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	if (!fx)
		return -1;
	fx->fds_before = tu_count_fds();
	struct dfccld_config cfg;
	config_defaults(&cfg);
	if (uv_loop_init(&fx->loop) < 0 || server_init_detached(&fx->srv, &fx->loop, &cfg) < 0)
		return -1;
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	server_fini_detached(&fx->srv);
	for (unsigned i = 0; i < fx->npeers; i++) {
		frame_reader_free(&fx->p[i].rd);
		if (fx->p[i].fd >= 0)
			close(fx->p[i].fd);
	}
	/* Every handle closed, every descriptor closed, every user freed. */
	int loop_rc = uv_loop_close(&fx->loop);
	int leaked = tu_count_fds() - fx->fds_before;
	struct user *users = fx->srv.users.head;
	free(fx);
	assert_int_equal(loop_rc, 0);
	assert_int_equal(leaked, 0);
	assert_null(users);
	return 0;
}

/* Opens a session whose client end is the returned peer. */
static struct peer *peer_open(struct fixture *fx)
{
	assert_true(fx->npeers < 4);
	struct peer *p = &fx->p[fx->npeers++];
	int sv[2];
	assert_int_equal(tu_socketpair(sv), 0);
	assert_int_equal(session_new(&fx->srv, sv[0], &p->s), 0);
	p->fd = sv[1];
	return p;
}

static void send_env(struct peer *p, const dfccl_envelope *env, const int *fds, unsigned nfds)
{
	assert_int_equal(frame_send(p->fd, env, fds, nfds), 0);
}

/* Waits (pumping the loop) for the next frame from the daemon. Returns 1
 * with it, 0 when the daemon closed the connection, -ETIMEDOUT after
 * `ms` milliseconds with neither. The frame's descriptors go to fds
 * (DFCCL_FRAME_MAX_FDS of room) when it is not NULL, else are closed. */
static int recv_fds_within(struct fixture *fx, struct peer *p, dfccl_envelope **env, int ms, int *out_fds,
                           unsigned *out_nfds)
{
	for (int waited = 0; waited <= ms; waited += 5) {
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 0;
		int rc = frame_reader_next(&p->rd, env, fds, &nfds);
		if (rc == 1 && out_fds) {
			memcpy(out_fds, fds, nfds * sizeof(int));
			*out_nfds = nfds;
		} else {
			frame_close_fds(fds, rc == 1 ? nfds : 0);
		}
		if (rc != 0)
			return rc;
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		struct pollfd pf = {.fd = p->fd, .events = POLLIN};
		if (poll(&pf, 1, 5) > 0) {
			rc = frame_reader_fill(&p->rd, p->fd);
			if (rc <= 0)
				return rc;
		}
	}
	return -ETIMEDOUT;
}

static int recv_within(struct fixture *fx, struct peer *p, dfccl_envelope **env, int ms)
{
	return recv_fds_within(fx, p, env, ms, NULL, NULL);
}

static dfccl_envelope *expect_body(struct fixture *fx, struct peer *p, uint64_t req, int body)
{
	dfccl_envelope *env = NULL;
	assert_int_equal(recv_within(fx, p, &env, 2000), 1);
	if ((int)env->body_case != body && env->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR)
		print_error("unexpected error reply: %s\n", env->error->message);
	assert_int_equal(env->body_case, body);
	assert_int_equal(env->request_id, req);
	return env;
}

/* The next frame must be an ErrorReply to req with code and a message
 * containing needle. */
static void expect_error(struct fixture *fx, struct peer *p, uint64_t req, int code, const char *needle)
{
	dfccl_envelope *env = expect_body(fx, p, req, DFCCL__V1__ENVELOPE__BODY_ERROR);
	assert_int_equal(env->error->code, code);
	assert_non_null(env->error->message);
	if (!strstr(env->error->message, needle))
		fail_msg("error message \"%s\" does not mention \"%s\"", env->error->message, needle);
	frame_envelope_free(env);
}

/* Sends m (without descriptors) and expects an ErrorReply to it. */
static void request_fails(struct fixture *fx, struct peer *p, struct tu_msg *m, int code, const char *needle)
{
	send_env(p, &m->env, NULL, 0);
	expect_error(fx, p, m->env.request_id, code, needle);
}

static void expect_ok(struct fixture *fx, struct peer *p, uint64_t req)
{
	frame_envelope_free(expect_body(fx, p, req, DFCCL__V1__ENVELOPE__BODY_OK));
}

static void expect_notice(struct fixture *fx, struct peer *p, int code, uint64_t comm_id)
{
	dfccl_envelope *env = expect_body(fx, p, 0, DFCCL__V1__ENVELOPE__BODY_NOTICE);
	assert_int_equal(env->notice->code, code);
	assert_int_equal(env->notice->comm_id, comm_id);
	assert_true(strlen(env->notice->message) > 10);
	frame_envelope_free(env);
}

/* The daemon hangs up, with nothing more to say. */
static void expect_closed(struct fixture *fx, struct peer *p)
{
	dfccl_envelope *env = NULL;
	int rc = recv_within(fx, p, &env, 2000);
	if (rc == 1)
		fail_msg("expected the connection to end, got message %d", (int)env->body_case);
	assert_int_equal(rc, 0);
}

/* Nothing arrives for a while (a request the daemon answers later). */
static void expect_silence(struct fixture *fx, struct peer *p)
{
	dfccl_envelope *env = NULL;
	assert_int_equal(recv_within(fx, p, &env, 30), -ETIMEDOUT);
}

static uint64_t hello(struct fixture *fx, struct peer *p)
{
	struct tu_msg m;
	tu_msg_hello(&m, 1, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION);
	send_env(p, &m.env, NULL, 0);
	dfccl_envelope *env = expect_body(fx, p, 1, DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY);
	uint64_t id = env->hello_reply->session_id;
	frame_envelope_free(env);
	return id;
}

static Dfccl__V1__QueryReply *query(struct fixture *fx, struct peer *p, uint64_t req, Dfccl__V1__QueryKind kind,
                                    dfccl_envelope **env)
{
	struct tu_msg m;
	tu_msg_query(&m, req, kind);
	send_env(p, &m.env, NULL, 0);
	*env = expect_body(fx, p, req, DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY);
	assert_int_equal((*env)->query_reply->kind, kind);
	return (*env)->query_reply;
}

/* ------------------------------------------------------------ handshake */

static void test_request_before_hello(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	struct tu_msg m;
	tu_msg_query(&m, 7, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	request_fails(fx, p, &m, EC(INVALID_USAGE), "Hello");
	tu_msg_attach(&m, 8, 0, 0);
	request_fails(fx, p, &m, EC(INVALID_USAGE), "Hello");
	/* The session is still there and can say Hello now. */
	assert_true(hello(fx, p) > 0);
}

static void test_version_mismatch(void **state)
{
	struct fixture *fx = *state;
	/* Ranges that miss version 1: above, below (0..0), and inverted. */
	static const uint32_t ranges[][2] = {{2, 5}, {0, 0}, {3, 1}};
	for (unsigned i = 0; i < 3; i++) {
		struct peer *p = peer_open(fx);
		struct tu_msg m;
		tu_msg_hello(&m, 40 + i, ranges[i][0], ranges[i][1]);
		send_env(p, &m.env, NULL, 0);
		expect_error(fx, p, 40 + i, EC(VERSION_MISMATCH), "version");
		expect_closed(fx, p);
	}
	assert_int_equal(fx->srv.nsessions, 0);
	assert_null(fx->srv.sessions);
}

static void test_hello(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	uint64_t expected_id = p->s->id;
	struct tu_msg m;
	/* A client that also speaks later versions settles on ours. */
	tu_msg_hello(&m, 3, 0, 9);
	send_env(p, &m.env, NULL, 0);
	dfccl_envelope *env = expect_body(fx, p, 3, DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY);
	assert_int_equal(env->hello_reply->version, DFCCL_PROTO_VERSION);
	assert_int_equal(env->hello_reply->session_id, expected_id);
	assert_true(expected_id > 0);
	assert_int_equal(env->hello_reply->engine, DFCCL__V1__ENGINE_KIND__ENGINE_HOST);
	assert_int_equal(env->hello_reply->ndevices, 0);
	assert_true(strlen(env->hello_reply->daemon_version) > 0);
	frame_envelope_free(env);
	assert_string_equal(p->s->client_name, "unit-test");

	tu_msg_hello(&m, 4, 1, 1);
	request_fails(fx, p, &m, EC(INVALID_USAGE), "already");

	/* Session ids are unique. */
	struct peer *q = peer_open(fx);
	assert_int_not_equal(hello(fx, q), expected_id);
}

/* ------------------------------------------------------------ requests */

static void test_queries(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx), *q = peer_open(fx);
	hello(fx, p);
	hello(fx, q);
	dfccl_envelope *env;

	Dfccl__V1__QueryReply *r = query(fx, p, 10, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	assert_non_null(r->status);
	assert_int_equal(r->status->protocol_version, DFCCL_PROTO_VERSION);
	assert_int_equal(r->status->nsessions, 2);
	assert_int_equal(r->status->ncomms, 0);
	assert_int_equal(r->status->npending_comms, 0);
	assert_int_equal(r->status->n_devices, 0);
	assert_string_equal(r->status->socket_path, fx->srv.cfg.socket_path);
	frame_envelope_free(env);

	r = query(fx, p, 11, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS, &env);
	assert_int_equal(r->n_sessions, 2);
	for (size_t i = 0; i < r->n_sessions; i++) {
		assert_int_equal(r->sessions[i]->pid, getpid());
		assert_int_equal(r->sessions[i]->uid, getuid());
		assert_string_equal(r->sessions[i]->client_name, "unit-test");
		assert_int_equal(r->sessions[i]->n_devices, 0);
		assert_int_equal(r->sessions[i]->nregs, 0);
	}
	assert_int_not_equal(r->sessions[0]->session_id, r->sessions[1]->session_id);
	frame_envelope_free(env);

	r = query(fx, q, 12, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(r->n_comms, 0);
	frame_envelope_free(env);
	r = query(fx, q, 13, DFCCL__V1__QUERY_KIND__QUERY_QUEUES, &env);
	assert_int_equal(r->n_queues, 0);
	frame_envelope_free(env);
	r = query(fx, q, 14, DFCCL__V1__QUERY_KIND__QUERY_STATS, &env);
	assert_int_equal(r->n_stats, 0);
	frame_envelope_free(env);

	struct tu_msg m;
	tu_msg_query(&m, 15, (Dfccl__V1__QueryKind)99);
	request_fails(fx, p, &m, EC(INVALID_ARGUMENT), "99");
	tu_msg_query(&m, 16, DFCCL__V1__QUERY_KIND__QUERY_UNSPECIFIED);
	request_fails(fx, p, &m, EC(INVALID_ARGUMENT), "query kind");
}

/* A session sees only its own user's sessions and communicators, unless it
 * sees all (root, dfccl-admin); the counts in status stay whole. */
static void test_query_visibility(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx), *q = peer_open(fx);
	hello(fx, p);
	hello(fx, q);
	p->s->sees_all = 0;
	q->s->uid = getuid() + 4242; /* another user, as far as display goes */
	static const uint8_t id[128] = {7, 7, 7};
	char err[512];
	assert_int_equal(comm_join(&fx->srv, q->s, 5, id, sizeof(id), 2, 0, 0, 0, 0, err, sizeof(err)), 0);
	dfccl_envelope *env;
	Dfccl__V1__QueryReply *r = query(fx, p, 20, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS, &env);
	assert_int_equal(r->n_sessions, 1);
	assert_int_equal(r->sessions[0]->session_id, p->s->id);
	frame_envelope_free(env);
	r = query(fx, p, 21, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(r->n_comms, 0);
	frame_envelope_free(env);
	r = query(fx, p, 22, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	assert_int_equal(r->status->nsessions, 2);
	assert_int_equal(r->status->npending_comms, 1);
	frame_envelope_free(env);
	/* The owner sees its communicator; one who sees all sees everything. */
	r = query(fx, q, 23, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(r->n_comms, 1);
	assert_int_equal(r->comms[0]->uid, q->s->uid);
	frame_envelope_free(env);
	p->s->sees_all = 1;
	r = query(fx, p, 24, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS, &env);
	assert_int_equal(r->n_sessions, 2);
	frame_envelope_free(env);
	r = query(fx, p, 25, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(r->n_comms, 1);
	frame_envelope_free(env);
	assert_int_equal(user_sees_all(0, 0), 1);
}

static void test_no_devices(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	struct tu_msg m;
	tu_msg_attach(&m, 20, 0, 0);
	request_fails(fx, p, &m, EC(NOT_FOUND), "device 0 does not exist");
	tu_msg_attach(&m, 21, 63, 1024);
	request_fails(fx, p, &m, EC(NOT_FOUND), "device 63");

	/* On the wire, CommInit stops at the device check first, whatever its
	 * unique id says: the id checks are tested through comm_join below. */
	uint8_t id[3] = {1, 2, 3};
	tu_msg_comm_init(&m, 22, id, sizeof(id), 2, 0, 0);
	request_fails(fx, p, &m, EC(NOT_FOUND), "device 0");

	int fd = tu_memfd(4096, 1);
	tu_msg_register_memfd(&m, 23, 0, 4096);
	send_env(p, &m.env, &fd, 1);
	close(fd);
	expect_error(fx, p, 23, EC(NOT_FOUND), "device 0");

	tu_msg_deregister(&m, 24, 5);
	request_fails(fx, p, &m, EC(NOT_FOUND), "registration 5");
	tu_msg_comm_destroy(&m, 25, 9);
	request_fails(fx, p, &m, EC(NOT_FOUND), "communicator 9");
	tu_msg_comm_abort(&m, 26, 9);
	request_fails(fx, p, &m, EC(NOT_FOUND), "communicator 9");
}

static void test_descriptor_counts(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	struct tu_msg m;
	/* Host memory registration without its memfd. */
	tu_msg_register_memfd(&m, 30, 0, 4096);
	request_fails(fx, p, &m, EC(INVALID_ARGUMENT), "carries 0 descriptors, expected 1");
	/* With two. */
	int fds[2] = {tu_memfd(4096, 1), tu_memfd(4096, 1)};
	send_env(p, &m.env, fds, 2);
	expect_error(fx, p, 30, EC(INVALID_ARGUMENT), "carries 2 descriptors, expected 1");
	/* A query has no business carrying one; the daemon must close it (the
	 * fixture's descriptor count checks). */
	tu_msg_query(&m, 31, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	send_env(p, &m.env, fds, 1);
	expect_error(fx, p, 31, EC(INVALID_ARGUMENT), "carries 1 descriptors, expected 0");
	frame_close_fds(fds, 2);
	/* Before Hello the count is checked too, and the session goes on. */
	struct peer *q = peer_open(fx);
	int fd = tu_memfd(64, 0);
	send_env(q, &m.env, &fd, 1);
	close(fd);
	expect_error(fx, q, 31, EC(INVALID_ARGUMENT), "descriptors");
	hello(fx, q);
}

static void test_not_a_request(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	/* An envelope with no body (only a request id). */
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.request_id = 50;
	send_env(p, &env, NULL, 0);
	expect_error(fx, p, 50, EC(INVALID_ARGUMENT), "empty request");
	/* A reply, or a worker message, sent by a client. */
	Dfccl__V1__Ok ok = DFCCL__V1__OK__INIT;
	env.request_id = 51;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_OK;
	env.ok = &ok;
	send_env(p, &env, NULL, 0);
	expect_error(fx, p, 51, EC(INVALID_ARGUMENT), "not a request");
	Dfccl__V1__WorkerDelReg wd = DFCCL__V1__WORKER_DEL_REG__INIT;
	env.request_id = 52;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_DEL_REG;
	env.worker_del_reg = &wd;
	send_env(p, &env, NULL, 0);
	expect_error(fx, p, 52, EC(INVALID_ARGUMENT), "not a request");
	/* A field number this daemon does not know decodes as an empty body. */
	static const uint8_t unknown_field[] = {0x08, 0x35, 0xba, 0x06, 0x00}; /* id 53, field 103 */
	assert_true(tu_send_raw(p->fd, sizeof(unknown_field), unknown_field, sizeof(unknown_field), NULL, 0) > 0);
	expect_error(fx, p, 53, EC(INVALID_ARGUMENT), "empty request");
}

/* ------------------------------------------------------------ bad frames */

static const uint8_t garbage[] = {0x07, 0xff, 0x00};

static void send_garbage(struct peer *p)
{
	assert_int_equal(tu_send_raw(p->fd, sizeof(garbage), garbage, sizeof(garbage), NULL, 0), 4 + sizeof(garbage));
}

static void test_malformed_frame(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	/* Before Hello and after it, a frame that does not decode gets an
	 * error with request id 0 and the session goes on. */
	send_garbage(p);
	expect_error(fx, p, 0, EC(INVALID_ARGUMENT), "malformed");
	hello(fx, p);
	send_garbage(p);
	expect_error(fx, p, 0, EC(INVALID_ARGUMENT), "malformed");
	dfccl_envelope *env;
	query(fx, p, 60, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	frame_envelope_free(env);
	/* A frame with a descriptor too many is treated the same way. */
	int fds[DFCCL_FRAME_MAX_FDS + 1];
	for (unsigned i = 0; i < DFCCL_FRAME_MAX_FDS + 1; i++)
		fds[i] = tu_memfd(64, 0);
	assert_true(tu_send_raw(p->fd, sizeof(garbage), garbage, sizeof(garbage), fds, DFCCL_FRAME_MAX_FDS + 1) > 0);
	frame_close_fds(fds, DFCCL_FRAME_MAX_FDS + 1);
	expect_error(fx, p, 0, EC(INVALID_ARGUMENT), "malformed");
	query(fx, p, 61, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	frame_envelope_free(env);
}

static void test_malformed_limit(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	for (unsigned i = 0; i < 15; i++) {
		send_garbage(p);
		expect_error(fx, p, 0, EC(INVALID_ARGUMENT), "malformed");
	}
	dfccl_envelope *env;
	query(fx, p, 70, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	frame_envelope_free(env);
	/* The 16th is answered, then the session is closed; a request sent
	 * behind it in the same burst is not served. */
	send_garbage(p);
	struct tu_msg m;
	tu_msg_query(&m, 71, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	send_env(p, &m.env, NULL, 0);
	expect_error(fx, p, 0, EC(INVALID_ARGUMENT), "malformed");
	expect_closed(fx, p);
	assert_int_equal(fx->srv.nsessions, 0);
}

static void test_bad_length_prefix(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	/* The stream cannot be resynchronised after a bad length: hang up. */
	assert_int_equal(tu_send_raw(p->fd, 0, NULL, 0, NULL, 0), 4);
	expect_closed(fx, p);
	assert_int_equal(fx->srv.nsessions, 0);

	struct peer *q = peer_open(fx);
	assert_int_equal(tu_send_raw(q->fd, DFCCL_FRAME_MAX + 1, NULL, 0, NULL, 0), 4);
	expect_closed(fx, q);
}

static void test_feed(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	/* Bytes fed directly reach the same handlers as bytes from the socket,
	 * including a frame split across two feeds. */
	struct tu_msg m;
	tu_msg_hello(&m, 80, 1, 1);
	uint8_t *buf;
	size_t len;
	assert_int_equal(frame_encode(&m.env, &buf, &len), 0);
	assert_int_equal(session_feed(p->s, buf, 3), 0);
	assert_int_equal(session_feed(p->s, buf + 3, len - 3), 0);
	free(buf);
	frame_envelope_free(expect_body(fx, p, 80, DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY));
	/* A bad length ends the session from inside the feed. */
	static const uint8_t zero[4] = {0};
	assert_int_equal(session_feed(p->s, zero, sizeof(zero)), -EMSGSIZE);
	assert_int_equal(fx->srv.nsessions, 0);
	expect_closed(fx, p);
}

static void test_client_hangs_up(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx), *q = peer_open(fx);
	hello(fx, p);
	assert_int_equal(fx->srv.nsessions, 2);
	close(p->fd);
	p->fd = -1;
	for (int i = 0; i < 100 && fx->srv.nsessions != 1; i++)
		uv_run(&fx->loop, UV_RUN_NOWAIT);
	assert_int_equal(fx->srv.nsessions, 1);
	/* The other session is untouched. */
	hello(fx, q);
}

static void test_session_quota(void **state)
{
	struct fixture *fx = *state;
	fx->srv.users.limits.max_sessions = 2;
	peer_open(fx);
	peer_open(fx);
	int sv[2];
	assert_int_equal(tu_socketpair(sv), 0);
	struct session *s = NULL;
	assert_int_equal(session_new(&fx->srv, sv[0], &s), -EDQUOT);
	/* The refused client is told why, then the connection ends. */
	struct peer *r = &fx->p[fx->npeers++];
	r->fd = sv[1];
	expect_error(fx, r, 0, EC(RESOURCE), "max-sessions-per-uid");
	expect_closed(fx, r);
	assert_int_equal(fx->srv.nsessions, 2);
	assert_int_equal(fx->srv.users.head->nsessions, 2);
}

/* A connection that never says Hello is closed after hello-timeout-ms; one
 * that did is not. */
static void test_hello_timeout(void **state)
{
	struct fixture *fx = *state;
	fx->srv.cfg.hello_timeout_ms = 50;
	struct peer *silent = peer_open(fx), *talker = peer_open(fx);
	hello(fx, talker);
	uint64_t t0 = server_now_ms();
	expect_closed(fx, silent);
	uint64_t waited = server_now_ms() - t0;
	assert_true(waited >= 40 && waited < 1500);
	assert_int_equal(fx->srv.nsessions, 1);
	/* Well past its own deadline, the talker is still served. */
	for (int i = 0; i < 20; i++) {
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		usleep(5000);
	}
	dfccl_envelope *env;
	query(fx, talker, 2, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	frame_envelope_free(env);
	assert_int_equal(fx->srv.nsessions, 1);
}

/*
 * A client that sends requests but never reads the replies: once more than
 * CONN_MAX_QUEUED bytes wait for it, the session is closed as if it had hung
 * up (its resources released); another session is served throughout.
 */
static void test_reader_stops(void **state)
{
	struct fixture *fx = *state;
	struct peer *flood = peer_open(fx), *other = peer_open(fx);
	hello(fx, flood);
	hello(fx, other);
	struct tu_msg m;
	tu_msg_query(&m, 9, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS);
	uint8_t *buf;
	size_t len;
	assert_int_equal(frame_encode(&m.env, &buf, &len), 0);
	assert_int_equal(fcntl(flood->fd, F_SETFL, O_NONBLOCK), 0);
	uint64_t sent = 0;
	size_t off = 0;
	/* Each reply is larger than its request, so the daemon's queue for
	 * this client grows by more than CONN_MAX_QUEUED well before 4x that
	 * many request bytes were written. */
	while (fx->srv.nsessions == 2 && sent < 4ull * CONN_MAX_QUEUED) {
		ssize_t n = write(flood->fd, buf + off, len - off);
		if (n > 0) {
			sent += (uint64_t)n;
			off = (off + (size_t)n) % len;
		}
		uv_run(&fx->loop, UV_RUN_NOWAIT);
	}
	free(buf);
	assert_int_equal(fx->srv.nsessions, 1);
	assert_ptr_equal(fx->srv.sessions, other->s);
	dfccl_envelope *env;
	query(fx, other, 3, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	assert_int_equal(env->query_reply->status->nsessions, 1);
	frame_envelope_free(env);
}

/* ------------------------------------------------------------ communicators */

static const uint8_t uid_a[128] = {1, 2, 3, 4};
static const uint8_t uid_b[128] = {9, 9, 9};

/* Session p joins as `rank` with its rank on `device`. */
static int join_device(struct fixture *fx, struct peer *p, uint64_t req, const uint8_t *id, size_t idlen,
                       uint32_t nranks, uint32_t rank, uint32_t device, uint32_t timeout_ms, char *err)
{
	err[0] = '\0';
	return comm_join(&fx->srv, p->s, req, id, idlen, nranks, rank, device, timeout_ms, 0, err, 512);
}

static int join(struct fixture *fx, struct peer *p, uint64_t req, const uint8_t *id, size_t idlen, uint32_t nranks,
                uint32_t rank, uint32_t timeout_ms, char *err)
{
	return join_device(fx, p, req, id, idlen, nranks, rank, 0, timeout_ms, err);
}

static void test_comm_join_arguments(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	char err[512];
	assert_int_equal(join(fx, p, 1, uid_a, 3, 2, 0, 0, err), EC(INVALID_ARGUMENT));
	assert_non_null(strstr(err, "3 bytes"));
	assert_int_equal(join(fx, p, 1, uid_a, 129, 2, 0, 0, err), EC(INVALID_ARGUMENT));
	assert_int_equal(join(fx, p, 1, uid_a, 128, 0, 0, 0, err), EC(INVALID_ARGUMENT));
	assert_non_null(strstr(err, "nranks 0"));
	assert_int_equal(join(fx, p, 1, uid_a, 128, 65537, 0, 0, err), EC(INVALID_ARGUMENT));
	assert_int_equal(join(fx, p, 1, uid_a, 128, 2, 2, 0, err), EC(INVALID_ARGUMENT));
	assert_non_null(strstr(err, "rank 2"));
	assert_null(fx->srv.comms);
	assert_int_equal(fx->srv.users.head->ncomms, 0);
}

/* Receives a CommInitReply for req and returns its comm id. */
static uint64_t expect_comm_ready(struct fixture *fx, struct peer *p, uint64_t req, uint32_t rank, uint32_t nranks)
{
	dfccl_envelope *env = expect_body(fx, p, req, DFCCL__V1__ENVELOPE__BODY_COMM_INIT_REPLY);
	Dfccl__V1__CommInitReply *r = env->comm_init_reply;
	assert_int_equal(r->rank, rank);
	assert_int_equal(r->nranks, nranks);
	assert_int_equal(r->n_ranks, nranks);
	for (uint32_t i = 0; i < nranks; i++) {
		assert_int_equal(r->ranks[i]->rank, i);
		assert_int_equal(r->ranks[i]->pid, getpid());
	}
	uint64_t id = r->comm_id;
	frame_envelope_free(env);
	return id;
}

/* Sessions a and b join a communicator of 2 as ranks 0 and 1; its id. */
static uint64_t join_two(struct fixture *fx, struct peer *a, struct peer *b)
{
	char err[512];
	assert_int_equal(join(fx, a, 1, uid_a, 128, 2, 0, 0, err), 0);
	assert_int_equal(join(fx, b, 2, uid_a, 128, 2, 1, 0, err), 0);
	uint64_t c = expect_comm_ready(fx, a, 1, 0, 2);
	assert_int_equal(expect_comm_ready(fx, b, 2, 1, 2), c);
	return c;
}

static void test_comm_two_sessions(void **state)
{
	struct fixture *fx = *state;
	struct peer *a = peer_open(fx), *b = peer_open(fx);
	uint64_t sa = hello(fx, a), sb = hello(fx, b);
	char err[512];

	/* Rank 0 waits for rank 1: no reply yet, the comm is pending. */
	assert_int_equal(join(fx, a, 100, uid_a, 128, 2, 0, 0, err), 0);
	expect_silence(fx, a);
	dfccl_envelope *env;
	Dfccl__V1__QueryReply *q = query(fx, a, 101, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(q->n_comms, 1);
	assert_string_equal(q->comms[0]->state, "initializing");
	assert_int_equal(q->comms[0]->joined, 1);
	frame_envelope_free(env);
	/* A rank cannot be taken twice, nor nranks changed. */
	assert_int_equal(join(fx, b, 200, uid_a, 128, 2, 0, 0, err), EC(INVALID_ARGUMENT));
	assert_non_null(strstr(err, "already taken"));
	assert_int_equal(join(fx, b, 200, uid_a, 128, 3, 1, 0, err), EC(INVALID_ARGUMENT));
	assert_non_null(strstr(err, "nranks 3"));

	/* Rank 1 arrives: both get their reply to their own request. */
	assert_int_equal(join(fx, b, 200, uid_a, 128, 2, 1, 0, err), 0);
	uint64_t ca = expect_comm_ready(fx, a, 100, 0, 2);
	uint64_t cb = expect_comm_ready(fx, b, 200, 1, 2);
	assert_int_equal(ca, cb);
	assert_true(ca > 0);

	q = query(fx, b, 201, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(q->n_comms, 1);
	assert_int_equal(q->comms[0]->comm_id, ca);
	assert_string_equal(q->comms[0]->state, "ready");
	assert_int_equal(q->comms[0]->n_ranks, 2);
	assert_int_equal(q->comms[0]->ranks[0]->session_id, sa);
	assert_int_equal(q->comms[0]->ranks[1]->session_id, sb);
	frame_envelope_free(env);
	q = query(fx, b, 202, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS, &env);
	for (size_t i = 0; i < q->n_sessions; i++)
		assert_int_equal(q->sessions[i]->ncomms, 1);
	frame_envelope_free(env);
	assert_int_equal(fx->srv.users.head->ncomms, 2);

	/* Rank 1 aborts: it gets Ok, rank 0 gets an ABORTED notice. */
	struct tu_msg m;
	tu_msg_comm_abort(&m, 203, cb);
	send_env(b, &m.env, NULL, 0);
	expect_ok(fx, b, 203);
	expect_notice(fx, a, EC(ABORTED), ca);
	/* Rank 1 is gone from it; rank 0 destroys its side and the comm goes. */
	tu_msg_comm_destroy(&m, 204, cb);
	request_fails(fx, b, &m, EC(NOT_FOUND), "not a member");
	tu_msg_comm_destroy(&m, 102, ca);
	send_env(a, &m.env, NULL, 0);
	expect_ok(fx, a, 102);
	assert_null(fx->srv.comms);
	assert_int_equal(fx->srv.users.head->ncomms, 0);

	/* The same unique id can start a new communicator afterwards. */
	assert_int_equal(join(fx, a, 103, uid_a, 128, 1, 0, 0, err), 0);
	assert_true(expect_comm_ready(fx, a, 103, 0, 1) > ca);
}

static void test_comm_other_uid(void **state)
{
	struct fixture *fx = *state;
	struct peer *a = peer_open(fx), *b = peer_open(fx);
	hello(fx, a);
	hello(fx, b);
	char err[512];
	assert_int_equal(join(fx, a, 1, uid_b, 128, 2, 0, 0, err), 0);
	/* A session of another user presenting the same unique id. */
	b->s->uid = a->s->uid + 1;
	assert_int_equal(join(fx, b, 2, uid_b, 128, 2, 1, 0, err), EC(PERMISSION));
	assert_non_null(strstr(err, "another user"));
	b->s->uid = a->s->uid;
}

static void test_comm_timeout(void **state)
{
	struct fixture *fx = *state;
	struct peer *a = peer_open(fx), *b = peer_open(fx);
	hello(fx, a);
	hello(fx, b);
	char err[512];
	/* Ranks 0 and 2 of 3 come; rank 1 never does. */
	assert_int_equal(join(fx, a, 300, uid_b, 128, 3, 0, 20, err), 0);
	assert_int_equal(join(fx, b, 400, uid_b, 128, 3, 2, 0, err), 0);
	expect_error(fx, a, 300, EC(TIMEOUT), "missing rank 1");
	expect_error(fx, b, 400, EC(TIMEOUT), "2 of 3 ranks joined");
	/* The comm is released once its timer handle is closed. */
	uv_run(&fx->loop, UV_RUN_NOWAIT);
	assert_null(fx->srv.comms);
	assert_int_equal(fx->srv.users.head->ncomms, 0);
}

static void test_comm_peer_lost(void **state)
{
	struct fixture *fx = *state;
	struct peer *a = peer_open(fx), *b = peer_open(fx);
	hello(fx, a);
	hello(fx, b);
	uint64_t c = join_two(fx, a, b);
	/* Rank 1's process dies: rank 0 is told, the comm is marked. */
	close(b->fd);
	b->fd = -1;
	expect_notice(fx, a, EC(PEER_LOST), c);
	assert_int_equal(fx->srv.nsessions, 1);
	dfccl_envelope *env;
	Dfccl__V1__QueryReply *q = query(fx, a, 3, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(q->n_comms, 1);
	assert_string_equal(q->comms[0]->state, "peer-lost");
	assert_int_equal(q->comms[0]->joined, 1);
	frame_envelope_free(env);
	assert_int_equal(fx->srv.users.head->ncomms, 1);
}

static void test_comm_quota(void **state)
{
	struct fixture *fx = *state;
	fx->srv.users.limits.max_comms = 1;
	struct peer *a = peer_open(fx);
	hello(fx, a);
	char err[512];
	assert_int_equal(join(fx, a, 1, uid_a, 128, 2, 0, 0, err), 0);
	assert_int_equal(join(fx, a, 2, uid_b, 128, 2, 0, 0, err), EC(RESOURCE));
	assert_non_null(strstr(err, "max-comms-per-uid"));
	/* Nothing was created for the refused join. */
	unsigned n = 0;
	for (struct comm *c = fx->srv.comms; c; c = c->next)
		n++;
	assert_int_equal(n, 1);
}

/* Sends a CommShrinkAdvice from p for comm_id excluding the n ranks of ex. */
static void send_shrink_advice(struct peer *p, uint64_t req, uint64_t comm_id, uint32_t *ex, size_t n)
{
	Dfccl__V1__CommShrinkAdvice a = DFCCL__V1__COMM_SHRINK_ADVICE__INIT;
	a.comm_id = comm_id;
	a.exclude = ex;
	a.n_exclude = n;
	dfccl_envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.request_id = req;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_SHRINK_ADVICE;
	env.comm_shrink_advice = &a;
	send_env(p, &env, NULL, 0);
}

/* A member's notice of a shrink advice: ABORTED, the list, and a sentence
 * that names the ranks and tells this rank what to do. */
static void expect_advice(struct fixture *fx, struct peer *p, uint64_t comm_id, const uint32_t *ex, size_t n,
                          const char *ranks, const char *todo)
{
	dfccl_envelope *env = expect_body(fx, p, 0, DFCCL__V1__ENVELOPE__BODY_NOTICE);
	const Dfccl__V1__Notice *no = env->notice;
	assert_int_equal(no->code, EC(ABORTED));
	assert_int_equal(no->comm_id, comm_id);
	assert_int_equal(no->n_shrink_exclude, n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(no->shrink_exclude[i], ex[i]);
	char head[160];
	snprintf(head, sizeof(head), "communicator %llu: ", (unsigned long long)comm_id);
	if (strncmp(no->message, head, strlen(head)) != 0 || !strstr(no->message, ranks) || !strstr(no->message, todo))
		fail_msg("advice notice \"%s\" lacks \"%s\", \"%s\" or \"%s\"", no->message, head, ranks, todo);
	frame_envelope_free(env);
}

static void expect_advice_kept(struct fixture *fx, struct peer *p, uint64_t req, const uint32_t *ex, size_t n)
{
	dfccl_envelope *env;
	Dfccl__V1__QueryReply *q = query(fx, p, req, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(q->n_comms, 1);
	assert_string_equal(q->comms[0]->state, "aborted");
	assert_int_equal(q->comms[0]->n_shrink_exclude, n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(q->comms[0]->shrink_exclude[i], ex[i]);
	frame_envelope_free(env);
}

/* `dfcclctl shrink` from a session outside the communicator (op): bad
 * lists, an unknown communicator and another uid are refused with a reason
 * and tell the members nothing; an advice revokes the communicator, tells
 * each member the list (the excluded one that it is excluded), stays with
 * the communicator, and a later one replaces it. */
static void test_comm_shrink_advice(void **state)
{
	struct fixture *fx = *state;
	struct peer *a = peer_open(fx), *b = peer_open(fx), *op = peer_open(fx);
	hello(fx, a);
	hello(fx, b);
	hello(fx, op);
	uint64_t c = join_two(fx, a, b);

	uint32_t none[1], far[] = {2}, twice[] = {1, 1}, all[] = {1, 0}, one[] = {1}, zero[] = {0};
	send_shrink_advice(op, 10, c, none, 0);
	expect_error(fx, op, 10, EC(INVALID_ARGUMENT), "at least one rank");
	send_shrink_advice(op, 11, c, far, 1);
	expect_error(fx, op, 11, EC(INVALID_ARGUMENT), "rank 2 is outside 0..1");
	send_shrink_advice(op, 12, c, twice, 2);
	expect_error(fx, op, 12, EC(INVALID_ARGUMENT), "rank 1 is excluded twice");
	send_shrink_advice(op, 13, c, all, 2);
	expect_error(fx, op, 13, EC(INVALID_ARGUMENT), "leaves nobody");
	send_shrink_advice(op, 14, c + 1, one, 1);
	expect_error(fx, op, 14, EC(NOT_FOUND), "does not exist");
	op->s->uid = a->s->uid + 1;
	send_shrink_advice(op, 15, c, one, 1);
	expect_error(fx, op, 15, EC(NOT_FOUND), "another user's");
	op->s->uid = a->s->uid;
	expect_silence(fx, a);
	expect_silence(fx, b);

	send_shrink_advice(op, 16, c, one, 1);
	expect_ok(fx, op, 16);
	expect_advice(fx, a, c, one, 1, "revoked it from outside and advises shrinking it without rank 1",
	              "the other ranks call dfcclCommShrink with exactly those ranks");
	expect_advice(fx, b, c, one, 1, "without rank 1", "this rank is excluded");
	expect_advice_kept(fx, op, 17, one, 1);
	/* A second advice, after the communicator was revoked: it replaces the
	 * first. */
	send_shrink_advice(op, 18, c, zero, 1);
	expect_ok(fx, op, 18);
	expect_advice(fx, a, c, zero, 1, "without rank 0", "this rank is excluded");
	expect_advice(fx, b, c, zero, 1, "without rank 0", "the other ranks call dfcclCommShrink");
	expect_advice_kept(fx, op, 19, zero, 1);
}

/* ------------------------------------------------------------ GPU memory, with fake workers
 *
 * A server of the CUDA engine with two devices whose workers are
 * fake_worker processes, started and watched by the real workers module:
 * what the supervisor does with VMM registrations and with dfcclMemAlloc's
 * device memory, on a machine without a GPU (see fake_worker.c).
 */

static int workers_stopped_flag;

static void on_workers_stopped(struct server *srv)
{
	(void)srv;
	workers_stopped_flag = 1;
}

static int setup_workers(void **state)
{
	if (setup(state) < 0)
		return -1;
	struct fixture *fx = *state;
	snprintf(fx->dir, sizeof(fx->dir), "/tmp/dfccl-test-session-XXXXXX");
	if (!mkdtemp(fx->dir))
		return -1;
	snprintf(fx->log, sizeof(fx->log), "%s/log", fx->dir);
	snprintf(fx->ctl, sizeof(fx->ctl), "%s/ctl", fx->dir);
	setenv("DFCCL_FAKE_WORKER_LOG", fx->log, 1);
	setenv("DFCCL_FAKE_WORKER_CTL", fx->ctl, 1);
	fx->srv.engine = DFCCLD_ENGINE_CUDA;
	fx->srv.exe_path = FAKE_WORKER_PATH;
	struct device_desc devs[2];
	devices_host(devs, 2);
	if (workers_new(&fx->srv, devs, 2, &fx->srv.workers) < 0)
		return -1;
	for (int i = 0; i < 5000 && workers_ready_count(fx->srv.workers) < 2; i++) {
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	return workers_ready_count(fx->srv.workers) == 2 ? 0 : -1;
}

static int teardown_workers(void **state)
{
	struct fixture *fx = *state;
	while (fx->srv.sessions)
		session_end(fx->srv.sessions);
	workers_stopped_flag = 0;
	workers_stop(fx->srv.workers, on_workers_stopped);
	for (int i = 0; i < 10000 && !workers_stopped_flag; i++) {
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_true(workers_stopped_flag);
	workers_free(fx->srv.workers);
	fx->srv.workers = NULL;
	unlink(fx->log);
	unlink(fx->ctl);
	rmdir(fx->dir);
	unsetenv("DFCCL_FAKE_WORKER_LOG");
	unsetenv("DFCCL_FAKE_WORKER_CTL");
	return teardown(state);
}

/* Tells the fake worker of `device` what to do with the next messages. */
static void worker_mode(struct fixture *fx, const char *mode, unsigned device)
{
	FILE *f = fopen(fx->ctl, "w");
	assert_non_null(f);
	fprintf(f, "%s %u\n", mode, device);
	fclose(f);
}

/* Tells the fake worker of device 0 what to do with the next messages,
 * and that of device 1 too. */
static void worker_modes(struct fixture *fx, const char *mode0, const char *mode1)
{
	FILE *f = fopen(fx->ctl, "w");
	assert_non_null(f);
	fprintf(f, "%s 0\n%s 1\n", mode0, mode1);
	fclose(f);
}

/* How many lines of the fake workers' log contain needle. */
static unsigned worker_log_count(struct fixture *fx, const char *needle)
{
	FILE *f = fopen(fx->log, "r");
	char line[512];
	unsigned n = 0;
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	if (f)
		fclose(f);
	return n;
}

/* Whether a line of the fake workers' log contains needle; waits (pumping
 * the loop) up to ms milliseconds for one. */
static bool worker_logged(struct fixture *fx, const char *needle, int ms)
{
	for (int waited = 0;; waited += 5) {
		bool found = worker_log_count(fx, needle) > 0;
		if (found || waited >= ms)
			return found;
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		usleep(5000);
	}
}

static unsigned long inode_of(int fd)
{
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	return (unsigned long)st.st_ino;
}

/* Pumps the loop until `want` descriptors are open (the supervisor closes
 * some in callbacks). */
static void expect_fd_count(struct fixture *fx, int want)
{
	int n = tu_count_fds();
	for (int i = 0; i < 2000 && n != want; i++) {
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		usleep(1000);
		n = tu_count_fds();
	}
	assert_int_equal(n, want);
}

/* A VMM registration of `size` bytes with descriptor fd (-1: none). */
static void send_vmm_reg(struct peer *p, struct tu_msg *m, uint64_t req, uint32_t device, uint64_t size,
                         uint64_t offset, int fd)
{
	tu_msg_register_memfd(m, req, device, size);
	m->u.register_mem.kind = DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD;
	m->u.register_mem.offset = offset;
	send_env(p, &m->env, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}

/* Both workers mapped registration reg (VMM, of session sid) from a
 * duplicate of the descriptor fd stands for. */
static void expect_mapped_everywhere(struct fixture *fx, uint32_t reg, uint64_t sid, uint64_t size, uint64_t offset,
                                     int fd)
{
	char want[256];
	for (unsigned d = 0; d < 2; d++) {
		snprintf(want, sizeof(want), "addreg dev=%u reg=%u session=%llu kind=3 size=%llu offset=%llu nfds=1 "
		         "inode=%lu", d, reg, (unsigned long long)sid, (unsigned long long)size,
		         (unsigned long long)offset, inode_of(fd));
		if (!worker_logged(fx, want, 0))
			fail_msg("no worker log line \"%s\"", want);
	}
}

/* Both workers were told to let go of registration reg. */
static void expect_dropped_everywhere(struct fixture *fx, uint32_t reg)
{
	char want[64];
	for (unsigned d = 0; d < 2; d++) {
		snprintf(want, sizeof(want), "delreg dev=%u reg=%u", d, reg);
		if (!worker_logged(fx, want, 2000))
			fail_msg("no worker log line \"%s\"", want);
	}
}

/* Deregisters reg: answered Ok, both workers let go, and the supervisor
 * is back to `fds` descriptors and charges nothing. */
static void deregister_everywhere(struct fixture *fx, struct peer *p, uint64_t req, uint32_t reg, int fds)
{
	struct tu_msg m;
	tu_msg_deregister(&m, req, reg);
	send_env(p, &m.env, NULL, 0);
	expect_ok(fx, p, req);
	expect_dropped_everywhere(fx, reg);
	expect_fd_count(fx, fds);
	assert_int_equal(p->s->nregs, 0);
	assert_int_equal(fx->srv.users.head->registered_bytes, 0);
}

/* The client goes: both workers let go of reg, and the session's socket
 * pair is gone, `fds` being the count before. */
static void hang_up_everywhere(struct fixture *fx, struct peer *p, uint32_t reg, int fds)
{
	close(p->fd);
	p->fd = -1;
	expect_dropped_everywhere(fx, reg);
	expect_fd_count(fx, fds - 2);
}

static uint32_t expect_registered(struct fixture *fx, struct peer *p, uint64_t req)
{
	dfccl_envelope *env = expect_body(fx, p, req, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY);
	uint32_t id = env->register_reply->reg_id;
	frame_envelope_free(env);
	assert_true(id > 0);
	return id;
}

static void test_vmm_reg_to_every_worker(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	uint64_t sid = hello(fx, p);
	int fd = tu_memfd(1 << 20, 0); /* stands for an exported allocation */
	int base = tu_count_fds();
	struct tu_msg m;

	/* Answered once both workers mapped it, each from its own duplicate
	 * of the client's descriptor; the supervisor keeps one per worker
	 * (for a replacement). */
	send_vmm_reg(p, &m, 1, 1, 1 << 20, 4096, fd);
	uint32_t reg = expect_registered(fx, p, 1);
	expect_mapped_everywhere(fx, reg, sid, 1 << 20, 4096, fd);
	expect_fd_count(fx, base + 2);
	assert_int_equal(p->s->nregs, 1);
	assert_int_equal(p->s->registered_bytes, 1 << 20);

	/* Deregistered: both workers let go, and so does the supervisor. */
	deregister_everywhere(fx, p, 2, reg, base);

	/* A session that ends takes its registrations with it. */
	send_vmm_reg(p, &m, 3, 0, 1 << 20, 0, fd);
	reg = expect_registered(fx, p, 3);
	expect_fd_count(fx, base + 2);
	hang_up_everywhere(fx, p, reg, base);
	close(fd);
}

static void test_vmm_reg_bad_input(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	int fd = tu_memfd(4096, 0);
	int base = tu_count_fds();
	struct tu_msg m;

	/* No descriptor; an empty buffer; a range that wraps; an IPC handle
	 * besides the descriptor; a device that does not exist. */
	send_vmm_reg(p, &m, 10, 0, 4096, 0, -1);
	expect_error(fx, p, 10, EC(INVALID_ARGUMENT), "carries 0 descriptors, expected 1");
	send_vmm_reg(p, &m, 11, 0, 0, 0, fd);
	expect_error(fx, p, 11, EC(INVALID_ARGUMENT), "empty buffer (size 0)");
	send_vmm_reg(p, &m, 12, 0, 4096, UINT64_MAX - 100, fd);
	expect_error(fx, p, 12, EC(INVALID_ARGUMENT), "wraps around");
	uint8_t handle[64] = {0};
	tu_msg_register_memfd(&m, 13, 0, 4096);
	m.u.register_mem.kind = DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD;
	m.u.register_mem.ipc_handle.data = handle;
	m.u.register_mem.ipc_handle.len = sizeof(handle);
	send_env(p, &m.env, &fd, 1);
	expect_error(fx, p, 13, EC(INVALID_ARGUMENT), "not by an IPC handle");
	send_vmm_reg(p, &m, 14, 2, 4096, 0, fd);
	expect_error(fx, p, 14, EC(NOT_FOUND), "device 2 does not exist");

	/* The host engine cannot reach GPU memory, and says so. */
	fx->srv.engine = DFCCLD_ENGINE_HOST;
	send_vmm_reg(p, &m, 15, 0, 4096, 0, fd);
	expect_error(fx, p, 15, EC(NOT_SUPPORTED), "runs the host engine, which cannot reach GPU memory: GPU memory "
	                                             "exported as a file descriptor (cuMemCreate) needs dfccld started "
	                                             "with --engine cuda");
	fx->srv.engine = DFCCLD_ENGINE_CUDA;

	/* A worker refuses it (the range past the allocation, say): the
	 * client hears why, and the other worker lets go of it. */
	worker_mode(fx, "refuse-reg", 1);
	send_vmm_reg(p, &m, 16, 0, 4096, 0, fd);
	expect_error(fx, p, 16, EC(INVALID_ARGUMENT), "the fake worker refuses this buffer");
	assert_true(worker_logged(fx, "delreg dev=0", 2000));
	worker_mode(fx, "ok", 1);

	/* Nothing of all that is held or charged. */
	expect_fd_count(fx, base);
	assert_int_equal(p->s->nregs, 0);
	assert_int_equal(fx->srv.users.head->registered_bytes, 0);
	close(fd);
}

/* AllocMem of `size` bytes on device; returns the reply (its descriptor in *fd). */
static dfccl_envelope *alloc_mem(struct fixture *fx, struct peer *p, uint64_t req, uint32_t device, uint64_t size,
                                 int *fd)
{
	struct tu_msg m;
	tu_msg_alloc_mem(&m, req, device, size);
	send_env(p, &m.env, NULL, 0);
	dfccl_envelope *env = NULL;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds = 0;
	assert_int_equal(recv_fds_within(fx, p, &env, 3000, fds, &nfds), 1);
	assert_int_equal(env->request_id, req);
	*fd = nfds == 1 ? fds[0] : -1;
	if (nfds != 1)
		frame_close_fds(fds, nfds);
	return env;
}

/* An AllocMem of 4096 bytes on device, answered by an ErrorReply with code
 * and a message containing needle, and no descriptor. */
static void alloc_refused(struct fixture *fx, struct peer *p, uint64_t req, uint32_t device, int code,
                          const char *needle)
{
	int fd;
	dfccl_envelope *env = alloc_mem(fx, p, req, device, 4096, &fd);
	assert_int_equal(env->body_case, DFCCL__V1__ENVELOPE__BODY_ERROR);
	assert_int_equal(env->error->code, code);
	if (!strstr(env->error->message, needle))
		fail_msg("error \"%s\" does not mention \"%s\"", env->error->message, needle);
	frame_envelope_free(env);
	assert_int_equal(fd, -1);
}

static void test_alloc_mem(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	uint64_t sid = hello(fx, p);
	int base = tu_count_fds();
	char want[256];

	/* The worker of the device allocates; every worker maps it as a
	 * registration of the session; the client gets the descriptor. */
	int fd;
	dfccl_envelope *env = alloc_mem(fx, p, 20, 1, 100000, &fd);
	assert_int_equal(env->body_case, DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM_REPLY);
	const Dfccl__V1__AllocMemReply *r = env->alloc_mem_reply;
	uint32_t reg = r->reg_id;
	assert_true(reg > 0);
	assert_int_equal(r->size, 100000);
	assert_int_equal(r->map_size, 131072);
	assert_int_equal(r->device, 1);
	assert_int_equal(r->nfds, 1);
	assert_true(fd >= 0);
	frame_envelope_free(env);
	snprintf(want, sizeof(want), "alloc dev=1 reg=%u size=100000", reg);
	assert_true(worker_logged(fx, want, 0));
	snprintf(want, sizeof(want), "allocdone dev=1 reg=%u inode=%lu", reg, inode_of(fd));
	assert_true(worker_logged(fx, want, 0));
	expect_mapped_everywhere(fx, reg, sid, 100000, 0, fd);
	assert_int_equal(p->s->nregs, 1);
	assert_int_equal(p->s->registered_bytes, 100000);
	/* The client's descriptor, and the supervisor's one per worker. */
	expect_fd_count(fx, base + 3);
	close(fd);

	/* Freed: every worker lets go, and the supervisor closes its
	 * descriptors. */
	deregister_everywhere(fx, p, 21, reg, base);

	/* Left allocated when the client goes: freed all the same. */
	env = alloc_mem(fx, p, 22, 0, 4096, &fd);
	assert_int_equal(env->body_case, DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM_REPLY);
	reg = env->alloc_mem_reply->reg_id;
	frame_envelope_free(env);
	close(fd);
	hang_up_everywhere(fx, p, reg, base);
}

static void test_alloc_mem_failures(void **state)
{
	struct fixture *fx = *state;
	struct peer *p = peer_open(fx);
	hello(fx, p);
	int base = tu_count_fds();
	struct tu_msg m;
	char want[128];

	/* Bad requests, and the host engine. */
	tu_msg_alloc_mem(&m, 30, 0, 0);
	request_fails(fx, p, &m, EC(INVALID_ARGUMENT), "empty buffer (size 0)");
	tu_msg_alloc_mem(&m, 31, 5, 4096);
	request_fails(fx, p, &m, EC(NOT_FOUND), "device 5 does not exist");
	fx->srv.engine = DFCCLD_ENGINE_HOST;
	tu_msg_alloc_mem(&m, 32, 0, 4096);
	request_fails(fx, p, &m, EC(NOT_SUPPORTED), "device memory from dfcclMemAlloc needs dfccld started with "
	                                            "--engine cuda");
	fx->srv.engine = DFCCLD_ENGINE_CUDA;
	/* The uid's quota. */
	fx->srv.users.limits.max_registered_bytes = 8192;
	tu_msg_alloc_mem(&m, 33, 0, 8193);
	request_fails(fx, p, &m, EC(RESOURCE), "max-registered-bytes-per-uid");
	fx->srv.users.limits.max_registered_bytes = INT64_MAX;

	/* The worker cannot allocate; answers without the descriptor. */
	worker_mode(fx, "alloc-fail", 0);
	alloc_refused(fx, p, 34, 0, EC(RESOURCE), "the fake worker has no device memory");
	worker_mode(fx, "alloc-nofd", 0);
	alloc_refused(fx, p, 35, 0, EC(INTERNAL), "without its descriptor");

	/* The worker dies before it answers. */
	worker_mode(fx, "alloc-die", 1);
	alloc_refused(fx, p, 36, 1, EC(DEVICE_LOST), "died before the allocation completed");
	/* While it is down, allocations on its device are refused at once. */
	tu_msg_alloc_mem(&m, 37, 1, 4096);
	request_fails(fx, p, &m, EC(DEVICE_LOST), "the worker of device 1 is not running");
	worker_mode(fx, "ok", 1);
	for (int i = 0; i < 5000 && workers_ready_count(fx->srv.workers) < 2; i++) {
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(workers_ready_count(fx->srv.workers), 2);
	assert_int_equal(p->s->nregs, 0);
	assert_int_equal(fx->srv.users.head->registered_bytes, 0);
	expect_fd_count(fx, base);

	/* The client goes while the worker allocates: what the worker made is
	 * closed again, and the worker told to let go of it. */
	worker_mode(fx, "alloc-slow", 0);
	tu_msg_alloc_mem(&m, 38, 0, 4096);
	send_env(p, &m.env, NULL, 0);
	uint32_t reg = fx->srv.next_reg_id + 1;
	snprintf(want, sizeof(want), "alloc dev=0 reg=%u size=4096", reg);
	assert_true(worker_logged(fx, want, 2000));
	close(p->fd);
	p->fd = -1;
	snprintf(want, sizeof(want), "allocdone dev=0 reg=%u", reg);
	assert_true(worker_logged(fx, want, 3000));
	snprintf(want, sizeof(want), "delreg dev=0 reg=%u", reg);
	assert_true(worker_logged(fx, want, 3000));
	expect_fd_count(fx, base - 2); /* the session's socket pair is gone */
	assert_false(worker_logged(fx, "addreg", 0));
}

/* ------------------------------------------------------------ the exchange between workers, with fake workers
 *
 * Engines that export a blob after taking a communicator (the CUDA
 * engine's handles of its GPU memory) get the other devices' blobs before
 * the ranks hear that the communicator is ready. The fake workers export
 * "dev N" and log what they receive.
 */

/* Opens two sessions that said Hello. */
static void open_two(struct fixture *fx, struct peer **a, struct peer **b)
{
	*a = peer_open(fx);
	*b = peer_open(fx);
	hello(fx, *a);
	hello(fx, *b);
}

/* Sessions a (rank 0, device 0) and b (rank 1, device dev_b) join a
 * communicator of 2 with requests 1 and 2; the id it will have. */
static uint64_t join_pair(struct fixture *fx, struct peer *a, struct peer *b, uint32_t dev_b)
{
	char err[512];
	uint64_t id = fx->srv.next_comm_id + 1;
	assert_int_equal(join_device(fx, a, 1, uid_a, 128, 2, 0, 0, 0, err), 0);
	assert_int_equal(join_device(fx, b, 2, uid_a, 128, 2, 1, dev_b, 0, err), 0);
	return id;
}

/* The fake workers logged the line `want` exactly once, and no other line
 * of its kind (`kind`). */
static void expect_logged_once(struct fixture *fx, const char *want, const char *kind)
{
	if (worker_log_count(fx, want) != 1)
		fail_msg("the worker log has %u lines \"%s\", expected 1", worker_log_count(fx, want), want);
	assert_int_equal(worker_log_count(fx, kind), 1);
}

/* Both workers were told to drop communicator id; the supervisor holds
 * nothing of it (its descriptors, its charge). */
static void expect_comm_dropped(struct fixture *fx, uint64_t id, int fds)
{
	char want[64];
	for (unsigned d = 0; d < 2; d++) {
		snprintf(want, sizeof(want), "commdel dev=%u comm=%llu", d, (unsigned long long)id);
		if (!worker_logged(fx, want, 2000))
			fail_msg("no worker log line \"%s\"", want);
	}
	uv_run(&fx->loop, UV_RUN_NOWAIT);
	assert_null(fx->srv.comms);
	assert_int_equal(fx->srv.users.head->ncomms, 0);
	expect_fd_count(fx, fds);
}

static void test_comm_peer_exchange(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	char want[128];
	worker_modes(fx, "blob", "blob");

	/* Each worker gets exactly the other's blob, and has taken it
	 * (logged before its acknowledgement) before the ranks hear. */
	uint64_t id = join_pair(fx, a, b, 1);
	assert_int_equal(expect_comm_ready(fx, a, 1, 0, 2), id);
	assert_int_equal(expect_comm_ready(fx, b, 2, 1, 2), id);
	snprintf(want, sizeof(want), "peers dev=0 comm=%llu n=1 [1:dev 1]\n", (unsigned long long)id);
	expect_logged_once(fx, want, "peers dev=0 ");
	snprintf(want, sizeof(want), "peers dev=1 comm=%llu n=1 [0:dev 0]\n", (unsigned long long)id);
	expect_logged_once(fx, want, "peers dev=1 ");
	dfccl_envelope *env;
	Dfccl__V1__QueryReply *q = query(fx, a, 3, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(q->n_comms, 1);
	assert_string_equal(q->comms[0]->state, "ready");
	frame_envelope_free(env);
	assert_null(fx->srv.comms->blobs);
}

static void test_comm_peers_refused(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	int base = tu_count_fds();
	worker_modes(fx, "blob", "refuse-peers");

	/* Every rank hears the refusing worker's sentence; both workers
	 * drop what they took. */
	uint64_t id = join_pair(fx, a, b, 1);
	static const char why[] = "the worker for device 1 could not take what the communicator's other devices "
	                          "exported: the fake worker cannot map its peers' memory";
	expect_error(fx, a, 1, EC(RESOURCE), why);
	expect_error(fx, b, 2, EC(RESOURCE), why);
	assert_true(worker_logged(fx, "peers dev=1 ", 0));
	expect_comm_dropped(fx, id, base);
}

static void test_comm_peers_worker_dies(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	char err[512];

	/* The worker of device 1 exits right after taking the communicator:
	 * the init fails for every rank, whether its death is seen before
	 * the blobs go out or after. */
	worker_modes(fx, "blob", "blob-die");
	join_pair(fx, a, b, 1);
	expect_error(fx, a, 1, EC(DEVICE_LOST), "worker for device 1");
	expect_error(fx, b, 2, EC(DEVICE_LOST), "worker for device 1");
	uv_run(&fx->loop, UV_RUN_NOWAIT);
	assert_null(fx->srv.comms);
	assert_int_equal(fx->srv.users.head->ncomms, 0);

	/* Once its replacement is up, the same ranks make a communicator. */
	worker_modes(fx, "blob", "blob");
	for (int i = 0; i < 5000 && workers_ready_count(fx->srv.workers) < 2; i++) {
		uv_run(&fx->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(workers_ready_count(fx->srv.workers), 2);
	uint64_t id = fx->srv.next_comm_id + 1;
	assert_int_equal(join_device(fx, a, 3, uid_b, 128, 2, 0, 0, 0, err), 0);
	assert_int_equal(join_device(fx, b, 4, uid_b, 128, 2, 1, 1, 0, err), 0);
	assert_int_equal(expect_comm_ready(fx, a, 3, 0, 2), id);
	assert_int_equal(expect_comm_ready(fx, b, 4, 1, 2), id);
	char want[128];
	snprintf(want, sizeof(want), "peers dev=1 comm=%llu n=1 [0:dev 0]\n", (unsigned long long)id);
	assert_int_equal(worker_log_count(fx, want), 1);
}

static void test_comm_peers_rank_leaves(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	int base = tu_count_fds();
	char want[64];

	/* The worker of device 1 never answers the blobs: the communicator
	 * shows as exchanging, and no rank hears anything yet. */
	worker_modes(fx, "blob", "peers-silent");
	uint64_t id = join_pair(fx, a, b, 1);
	snprintf(want, sizeof(want), "peers dev=1 comm=%llu", (unsigned long long)id);
	assert_true(worker_logged(fx, want, 2000));
	expect_silence(fx, a);
	dfccl_envelope *env;
	Dfccl__V1__QueryReply *q = query(fx, a, 3, DFCCL__V1__QUERY_KIND__QUERY_COMMS, &env);
	assert_int_equal(q->n_comms, 1);
	assert_string_equal(q->comms[0]->state, "exchanging");
	frame_envelope_free(env);

	/* Rank 1's process goes: rank 0's init fails with the reason, and
	 * the workers drop the communicator. */
	close(b->fd);
	b->fd = -1;
	expect_error(fx, a, 1, EC(PEER_LOST), "rank 1");
	expect_comm_dropped(fx, id, base - 2);
}

static void test_comm_peers_timeout(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	int base = tu_count_fds();
	char err[512];

	/* The worker of device 1 never answers the blobs: once the init
	 * timeout has passed again after every rank joined, the init fails
	 * on every rank, naming the worker, and the workers drop it. */
	worker_modes(fx, "blob", "peers-silent");
	uint64_t id = fx->srv.next_comm_id + 1;
	assert_int_equal(join_device(fx, a, 1, uid_a, 128, 2, 0, 0, 200, err), 0);
	assert_int_equal(join_device(fx, b, 2, uid_a, 128, 2, 1, 1, 0, err), 0);
	static const char why[] = "every rank joined, but no answer came from the daemon's worker for device 1, taking "
	                          "what the communicator's other devices exported";
	expect_error(fx, a, 1, EC(TIMEOUT), why);
	expect_error(fx, b, 2, EC(TIMEOUT), why);
	expect_comm_dropped(fx, id, base);
}

static void test_comm_late_ack(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	int base = tu_count_fds();
	char want[64];

	/* The worker of device 1 refuses the communicator while that of
	 * device 0 is still taking it: the ranks hear the refusal, and the
	 * worker of device 0 is told to drop it once it has it; the refusing
	 * one holds nothing to drop. */
	worker_modes(fx, "comm-slow", "refuse-comm");
	uint64_t id = join_pair(fx, a, b, 1);
	static const char why[] = "the worker for device 1 could not take the communicator: the fake worker refuses "
	                          "this communicator";
	expect_error(fx, a, 1, EC(RESOURCE), why);
	expect_error(fx, b, 2, EC(RESOURCE), why);
	snprintf(want, sizeof(want), "commdel dev=0 comm=%llu", (unsigned long long)id);
	assert_true(worker_logged(fx, want, 3000));
	snprintf(want, sizeof(want), "commdel dev=1 comm=%llu", (unsigned long long)id);
	assert_false(worker_logged(fx, want, 0));
	assert_null(fx->srv.comms);
	expect_fd_count(fx, base);
}

/* The log line of the first fake-worker line containing needle (0: none). */
static unsigned worker_log_line(struct fixture *fx, const char *needle)
{
	FILE *f = fopen(fx->log, "r");
	char line[512];
	unsigned n = 0, at = 0;
	while (f && !at && fgets(line, sizeof(line), f)) {
		n++;
		if (strstr(line, needle))
			at = n;
	}
	if (f)
		fclose(f);
	return at;
}

/* Both clients go: their sessions end. */
static void close_pair(struct peer *a, struct peer *b)
{
	close(a->fd);
	a->fd = -1;
	close(b->fd);
	b->fd = -1;
}

/* A communicator on devices 0 and 1, ready; then both ranks' sessions end. */
static uint64_t pair_ready_then_gone(struct fixture *fx, struct peer *a, struct peer *b)
{
	uint64_t id = join_pair(fx, a, b, 1);
	assert_int_equal(expect_comm_ready(fx, a, 1, 0, 2), id);
	assert_int_equal(expect_comm_ready(fx, b, 2, 1, 2), id);
	close_pair(a, b);
	return id;
}

/*
 * A communicator spanning devices is deleted in two steps: each worker
 * first lets go of the others' memory of it, keeping its own, which the
 * others may still map, and only once both said so are they told to free
 * their own.
 */
static void test_comm_free_after_release(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	worker_modes(fx, "blob", "blob");
	uint64_t id = pair_ready_then_gone(fx, a, b);
	char want[64];
	unsigned del_at[2], free_at[2];
	for (unsigned d = 0; d < 2; d++) {
		snprintf(want, sizeof(want), "commdel dev=%u comm=%llu await\n", d, (unsigned long long)id);
		assert_true(worker_logged(fx, want, 2000));
		del_at[d] = worker_log_line(fx, want);
	}
	for (unsigned d = 0; d < 2; d++) {
		snprintf(want, sizeof(want), "commfree dev=%u comm=%llu\n", d, (unsigned long long)id);
		assert_true(worker_logged(fx, want, 2000));
		free_at[d] = worker_log_line(fx, want);
	}
	/* Each worker logs the deletion before it answers: both came before
	 * either free. */
	for (unsigned d = 0; d < 2; d++)
		for (unsigned e = 0; e < 2; e++)
			assert_true(del_at[d] < free_at[e]);
	assert_int_equal(worker_log_count(fx, "commfree "), 2);
	assert_int_equal(workers_comm_releases(fx->srv.workers), 0);
}

/* A worker that does not answer holds the others' memory: nobody is told
 * to free it. One that dies instead has let go of everything. */
static void test_comm_free_waits_for_release(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	worker_modes(fx, "ok", "release-silent");
	uint64_t id = pair_ready_then_gone(fx, a, b);
	char want[64];
	snprintf(want, sizeof(want), "commdel dev=1 comm=%llu await\n", (unsigned long long)id);
	assert_true(worker_logged(fx, want, 2000));
	assert_false(worker_logged(fx, "commfree ", 300));

	assert_int_equal(workers_comm_releases(fx->srv.workers), 1);

	/* The worker of device 1 dies on the next deletion: device 0 frees
	 * its memory of both communicators, device 1 is told nothing. */
	struct peer *c, *d;
	open_two(fx, &c, &d);
	dfccl_envelope *env;
	Dfccl__V1__QueryReply *q = query(fx, c, 9, DFCCL__V1__QUERY_KIND__QUERY_STATUS, &env);
	assert_int_equal(q->status->nreleasing_comms, 1);
	frame_envelope_free(env);
	worker_modes(fx, "ok", "release-die");
	uint64_t id2 = pair_ready_then_gone(fx, c, d);
	uint64_t ids[2] = {id, id2};
	for (unsigned k = 0; k < 2; k++) {
		snprintf(want, sizeof(want), "commfree dev=0 comm=%llu\n", (unsigned long long)ids[k]);
		assert_true(worker_logged(fx, want, 3000));
	}
	assert_false(worker_logged(fx, "commfree dev=1 ", 200));
	assert_int_equal(worker_log_count(fx, "commfree "), 2);
	assert_int_equal(workers_comm_releases(fx->srv.workers), 0);
}

/* With every rank on one device nobody else maps its memory: one step. */
static void test_comm_free_one_device(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	char err[512], want[64];
	uint64_t id = fx->srv.next_comm_id + 1;
	assert_int_equal(join_device(fx, a, 1, uid_a, 128, 2, 0, 0, 0, err), 0);
	assert_int_equal(join_device(fx, b, 2, uid_a, 128, 2, 1, 0, 0, err), 0);
	assert_int_equal(expect_comm_ready(fx, a, 1, 0, 2), id);
	close_pair(a, b);
	snprintf(want, sizeof(want), "commdel dev=0 comm=%llu\n", (unsigned long long)id);
	assert_true(worker_logged(fx, want, 2000));
	assert_false(worker_logged(fx, "commfree ", 100));
	assert_int_equal(workers_comm_releases(fx->srv.workers), 0);
}

static void test_comm_no_blobs(void **state)
{
	struct fixture *fx = *state;
	struct peer *a, *b;
	open_two(fx, &a, &b);
	char want[64];

	/* Nothing exported (the host engine): ready once both took it, and
	 * WorkerCommPeers is never sent. */
	uint64_t id = join_pair(fx, a, b, 1);
	assert_int_equal(expect_comm_ready(fx, a, 1, 0, 2), id);
	assert_int_equal(expect_comm_ready(fx, b, 2, 1, 2), id);
	for (unsigned d = 0; d < 2; d++) {
		snprintf(want, sizeof(want), "commadd dev=%u comm=%llu nranks=2 nfds=1", d, (unsigned long long)id);
		assert_true(worker_logged(fx, want, 0));
	}

	/* Blobs, but every rank on one device: nobody to hand them to. */
	worker_modes(fx, "blob", "blob");
	char err[512];
	id = fx->srv.next_comm_id + 1;
	assert_int_equal(join_device(fx, a, 3, uid_b, 128, 2, 0, 0, 0, err), 0);
	assert_int_equal(join_device(fx, b, 4, uid_b, 128, 2, 1, 0, 0, err), 0);
	assert_int_equal(expect_comm_ready(fx, a, 3, 0, 2), id);
	assert_int_equal(expect_comm_ready(fx, b, 4, 1, 2), id);
	snprintf(want, sizeof(want), "commadd dev=0 comm=%llu", (unsigned long long)id);
	assert_true(worker_logged(fx, want, 0));
	snprintf(want, sizeof(want), "commadd dev=1 comm=%llu", (unsigned long long)id);
	assert_false(worker_logged(fx, want, 0));
	assert_int_equal(worker_log_count(fx, "peers "), 0);
}

int main(void)
{
	log_setup(LOG_LEVEL_WARN, LOG_TARGET_STDERR, "test_session");
	/* libuv opens a process-wide pipe on the first uv_loop_init and keeps
	 * it: open it now so the per-test descriptor count sees only the test. */
	uv_loop_t warm;
	uv_loop_init(&warm);
	uv_loop_close(&warm);
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
	    T(test_request_before_hello),
	    T(test_version_mismatch),
	    T(test_hello),
	    T(test_queries),
    T(test_query_visibility),
	    T(test_no_devices),
	    T(test_descriptor_counts),
	    T(test_not_a_request),
	    T(test_malformed_frame),
	    T(test_malformed_limit),
	    T(test_bad_length_prefix),
	    T(test_feed),
	    T(test_client_hangs_up),
	    T(test_session_quota),
    T(test_hello_timeout),
    T(test_reader_stops),
	    T(test_comm_join_arguments),
	    T(test_comm_two_sessions),
	    T(test_comm_other_uid),
	    T(test_comm_timeout),
	    T(test_comm_peer_lost),
	    T(test_comm_quota),
	    T(test_comm_shrink_advice),
	    cmocka_unit_test_setup_teardown(test_vmm_reg_to_every_worker, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_vmm_reg_bad_input, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_alloc_mem, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_alloc_mem_failures, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_peer_exchange, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_peers_refused, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_peers_worker_dies, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_peers_rank_leaves, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_peers_timeout, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_late_ack, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_no_blobs, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_free_after_release, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_free_waits_for_release, setup_workers, teardown_workers),
	    cmocka_unit_test_setup_teardown(test_comm_free_one_device, setup_workers, teardown_workers),
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
