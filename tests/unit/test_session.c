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
 * timeouts, abort and peer-loss notices, the comm quota); the path from the
 * wire with real workers is the integration tests' job.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm.h"
#include "config.h"
#include "frame.h"
#include "log.h"
#include "server.h"
#include "session.h"
#include "testutil.h"
#include "user.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x

struct peer {
	int fd;
	struct frame_reader rd;
	struct session *s; /* valid while the session is open */
};

struct fixture {
	uv_loop_t loop;
	struct server srv;
	struct peer p[3];
	unsigned npeers;
	int fds_before;
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
	assert_true(fx->npeers < 3);
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
 * `ms` milliseconds with neither. */
static int recv_within(struct fixture *fx, struct peer *p, dfccl_envelope **env, int ms)
{
	for (int waited = 0; waited <= ms; waited += 5) {
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 0;
		int rc = frame_reader_next(&p->rd, env, fds, &nfds);
		frame_close_fds(fds, rc == 1 ? nfds : 0);
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

static int join(struct fixture *fx, struct peer *p, uint64_t req, const uint8_t *id, size_t idlen, uint32_t nranks,
                uint32_t rank, uint32_t timeout_ms, char *err)
{
	err[0] = '\0';
	return comm_join(&fx->srv, p->s, req, id, idlen, nranks, rank, 0, timeout_ms, 0, err, 512);
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
	char err[512];
	assert_int_equal(join(fx, a, 1, uid_a, 128, 2, 0, 0, err), 0);
	assert_int_equal(join(fx, b, 2, uid_a, 128, 2, 1, 0, err), 0);
	uint64_t c = expect_comm_ready(fx, a, 1, 0, 2);
	expect_comm_ready(fx, b, 2, 1, 2);
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
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
