/*
 * The daemon at the protocol level, driven by raw frames: version
 * negotiation, bad input (malformed, oversized, wrong descriptors), the
 * shared-memory queue pair (a NOP round trip, garbage entries, an unarmed
 * entry that must not block armed ones), memory registration (host memory
 * checks; GPU memory refused by the host engine), and SIGTERM shutdown.
 * Every test starts its own dfccld.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl_queue.h"
#include "harness.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x

static struct raw_client connect_ok(struct daemon_proc *d)
{
	struct raw_client c;
	assert_int_equal(raw_connect(&c, d->socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	assert_true(c.session_id > 0);
	return c;
}

/* The code of an ErrorReply (-1 when the reply is something else). */
static int error_code(const dfccl_envelope *r)
{
	return r && r->body_case == DFCCL__V1__ENVELOPE__BODY_ERROR ? (int)r->error->code : -1;
}

static void test_hello_and_status(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	dfccl_envelope *r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	const Dfccl__V1__StatusInfo *st = r->query_reply->status;
	assert_int_equal(st->protocol_version, DFCCL_PROTO_VERSION);
	assert_int_equal(st->engine, DFCCL__V1__ENGINE_KIND__ENGINE_HOST);
	assert_int_equal(st->n_devices, 2);
	assert_int_equal(st->nsessions, 1);
	assert_string_equal(st->socket_path, d->socket);
	for (size_t i = 0; i < st->n_devices; i++) {
		assert_true(st->devices[i]->worker_up);
		assert_true(st->devices[i]->worker_pid > 0);
	}
	frame_envelope_free(r);

	/* A second Hello on the same connection is refused, the session lives on. */
	Dfccl__V1__Hello h = DFCCL__V1__HELLO__INIT;
	h.min_version = h.max_version = DFCCL_PROTO_VERSION;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_HELLO;
	env.hello = &h;
	r = raw_request(&c, &env, NULL, 0, NULL, NULL);
	assert_int_equal(error_code(r), EC(INVALID_USAGE));
	frame_envelope_free(r);
	r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS);
	assert_non_null(r);
	assert_int_equal(r->query_reply->n_sessions, 1);
	assert_int_equal(r->query_reply->sessions[0]->pid, getpid());
	assert_int_equal(r->query_reply->sessions[0]->uid, getuid());
	assert_string_equal(r->query_reply->sessions[0]->client_name, "integration-test");
	frame_envelope_free(r);
	raw_close(&c);
}

static void test_version_mismatch(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c;
	dfccl_envelope *err = NULL;
	uint32_t v = DFCCL_PROTO_VERSION + 7;
	assert_int_equal(raw_connect(&c, d->socket, v, v, &err), -1);
	assert_int_equal(error_code(err), EC(VERSION_MISMATCH));
	/* The message names both ranges so the user knows what to install. */
	char want[64];
	snprintf(want, sizeof(want), "versions %u..%u", v, v);
	assert_non_null(strstr(err->error->message, want));
	snprintf(want, sizeof(want), "%u..%u", DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION);
	assert_non_null(strstr(err->error->message, want));
	frame_envelope_free(err);
	/* The daemon still serves everyone else. */
	struct raw_client ok = connect_ok(d);
	raw_close(&ok);
}

static void test_request_before_hello(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c;
	memset(&c, 0, sizeof(c));
	c.next_req = 1;
	c.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->socket);
	assert_int_equal(connect(c.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	Dfccl__V1__Query q = DFCCL__V1__QUERY__INIT;
	q.kind = DFCCL__V1__QUERY_KIND__QUERY_STATUS;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY;
	env.query = &q;
	dfccl_envelope *r = raw_request(&c, &env, NULL, 0, NULL, NULL);
	assert_int_equal(error_code(r), EC(INVALID_USAGE));
	frame_envelope_free(r);
	raw_close(&c);
}

static void send_bytes(int fd, const void *p, size_t n)
{
	assert_int_equal(write(fd, p, n), (ssize_t)n);
}

static void test_malformed_frames(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client bad = connect_ok(d);
	struct raw_client good = connect_ok(d);

	/* A well-framed payload that is not an Envelope: an error reply with
	 * request id 0, and the session keeps working. */
	uint8_t junk[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
	send_bytes(bad.fd, junk, sizeof(junk));
	dfccl_envelope *r = raw_next(&bad, 5000, NULL, NULL);
	assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
	assert_int_equal(r->request_id, 0);
	frame_envelope_free(r);
	r = raw_query(&bad, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	frame_envelope_free(r);

	/* An envelope with an unknown body (field 99): refused, session lives. */
	uint8_t unknown[] = {3, 0, 0, 0, 0x98, 0x06, 0x01};
	send_bytes(bad.fd, unknown, sizeof(unknown));
	r = raw_next(&bad, 5000, NULL, NULL);
	assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
	frame_envelope_free(r);

	/* A worker-only message on the client socket. */
	Dfccl__V1__WorkerDetachQp wd = DFCCL__V1__WORKER_DETACH_QP__INIT;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_DETACH_QP;
	env.worker_detach_qp = &wd;
	r = raw_request(&bad, &env, NULL, 0, NULL, NULL);
	assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
	frame_envelope_free(r);

	/* Descriptors on a request that takes none: refused and closed. */
	int efd = eventfd(0, EFD_CLOEXEC);
	Dfccl__V1__Query q = DFCCL__V1__QUERY__INIT;
	q.kind = DFCCL__V1__QUERY_KIND__QUERY_STATUS;
	env = (Dfccl__V1__Envelope)DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY;
	env.query = &q;
	r = raw_request(&bad, &env, &efd, 1, NULL, NULL);
	assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
	assert_non_null(strstr(r->error->message, "descriptors"));
	frame_envelope_free(r);
	close(efd);

	/* An oversized length prefix: that connection is closed... */
	uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3};
	send_bytes(bad.fd, huge, sizeof(huge));
	r = raw_next(&bad, 5000, NULL, NULL);
	assert_null(r);
	raw_close(&bad);

	/* ...and the daemon keeps serving the other client. */
	r = raw_query(&good, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	assert_int_equal(r->query_reply->status->nsessions, 1);
	frame_envelope_free(r);
	raw_close(&good);
}

static void test_truncated_frame_then_close(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	uint8_t partial[] = {100, 0, 0, 0, 1, 2, 3};
	send_bytes(c.fd, partial, sizeof(partial));
	raw_close(&c);
	struct raw_client c2 = connect_ok(d);
	dfccl_envelope *r = raw_query(&c2, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	assert_int_equal(r->query_reply->status->nsessions, 1);
	frame_envelope_free(r);
	raw_close(&c2);
}

/* ------------------------------------------------------------ queue pairs */

struct qp_map {
	struct dfccl_qp_header *h;
	size_t size;
	int efd;
	struct dfccl_sqe *sq;
	_Atomic uint64_t *cw;
	uint32_t n;
};

static struct qp_map attach(struct raw_client *c, uint32_t device)
{
	int fds[8];
	unsigned nfds = 0;
	dfccl_envelope *r = raw_attach(c, device, 16, fds, &nfds);
	assert_non_null(r);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_ATTACH_REPLY);
	assert_int_equal(nfds, 2);
	struct qp_map m;
	m.size = r->attach_reply->region_size;
	m.h = mmap(NULL, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	assert_true(m.h != MAP_FAILED);
	close(fds[0]);
	m.efd = fds[1];
	assert_int_equal(m.h->magic, DFCCL_QP_MAGIC);
	assert_int_equal(m.h->abi_version, DFCCL_QUEUE_ABI_VERSION);
	assert_int_equal(m.h->sq_entries, 16);
	assert_int_equal(m.h->device, device);
	m.n = m.h->sq_entries;
	m.sq = (struct dfccl_sqe *)((char *)m.h + m.h->sq_offset);
	m.cw = (_Atomic uint64_t *)((char *)m.h + m.h->cw_offset);
	frame_envelope_free(r);
	return m;
}

/* Writes entry seq (not armed). */
static struct dfccl_sqe *put(struct qp_map *m, uint64_t seq, uint8_t opcode)
{
	struct dfccl_sqe *e = &m->sq[DFCCL_QP_SLOT(seq, m->n)];
	memset((char *)e + 8, 0, sizeof(*e) - 8);
	e->seq = seq;
	e->opcode = opcode;
	e->user_tag = 1000 + seq;
	e->comm_id = 1;
	e->dtype = 7;
	return e;
}

static void arm(struct qp_map *m, uint64_t seq)
{
	struct dfccl_sqe *e = &m->sq[DFCCL_QP_SLOT(seq, m->n)];
	atomic_store_explicit((_Atomic uint64_t *)&e->arm, seq, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load((_Atomic uint32_t *)&m->h->engine_state) != DFCCL_ENGINE_POLLING) {
		uint64_t one = 1;
		assert_int_equal(write(m->efd, &one, sizeof(one)), 8);
	}
}

static void reserve(struct qp_map *m, uint64_t tail)
{
	atomic_store_explicit((_Atomic uint64_t *)&m->h->sq_tail, tail, memory_order_release);
}

/* Waits for the completion word of seq; returns its status or -1. */
static int wait_cw(struct qp_map *m, uint64_t seq, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	while (now_ms() < deadline) {
		uint64_t w = atomic_load_explicit(&m->cw[DFCCL_QP_SLOT(seq, m->n)], memory_order_acquire);
		if (DFCCL_CW_SEQ(w) == seq)
			return (int)DFCCL_CW_STATUS(w);
		usleep(200);
	}
	return -1;
}

static void qp_unmap(struct qp_map *m)
{
	munmap(m->h, m->size);
	close(m->efd);
}

static void test_queue_nop_and_garbage(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	struct qp_map m = attach(&c, 1);

	/* A NOP completes OK; a well-formed entry naming no registration is
	 * refused with a precise status. */
	put(&m, 1, DFCCL_OP_NOP);
	reserve(&m, 1);
	arm(&m, 1);
	assert_int_equal(wait_cw(&m, 1, 5000), DFCCL_CQ_OK);

	struct dfccl_sqe *e = put(&m, 2, 200); /* unknown opcode */
	(void)e;
	e = put(&m, 3, DFCCL_OP_ALLREDUCE);
	e->dtype = 77; /* unknown data type */
	e = put(&m, 4, DFCCL_OP_ALLREDUCE);
	e->redop = 9; /* unknown reduction */
	e = put(&m, 5, DFCCL_OP_ALLREDUCE);
	e->send_reg = 12345; /* never registered */
	e->recv_reg = 12345;
	e->count = 4;
	e = put(&m, 6, DFCCL_OP_ALLREDUCE);
	e->comm_id = 0; /* no communicator */
	e = put(&m, 7, DFCCL_OP_NOP);
	e->flags = 0x8000; /* unknown flag */
	reserve(&m, 7);
	for (uint64_t s = 2; s <= 7; s++)
		arm(&m, s);
	assert_int_equal(wait_cw(&m, 2, 5000), DFCCL_CQ_BAD_OPCODE);
	assert_int_equal(wait_cw(&m, 3, 5000), DFCCL_CQ_BAD_DTYPE);
	assert_int_equal(wait_cw(&m, 4, 5000), DFCCL_CQ_BAD_REDOP);
	assert_int_equal(wait_cw(&m, 5, 5000), DFCCL_CQ_BAD_REG);
	assert_int_equal(wait_cw(&m, 6, 5000), DFCCL_CQ_BAD_COMM);
	assert_int_equal(wait_cw(&m, 7, 5000), DFCCL_CQ_BAD_ENTRY);
	assert_int_equal(atomic_load((_Atomic uint64_t *)&m.h->completed), 7);

	/* An entry whose seq field disagrees with its arm word. */
	e = put(&m, 8, DFCCL_OP_NOP);
	e->seq = 999;
	reserve(&m, 8);
	atomic_store_explicit((_Atomic uint64_t *)&e->arm, 8, memory_order_release);
	uint64_t one = 1;
	assert_int_equal(write(m.efd, &one, sizeof(one)), 8);
	assert_int_equal(wait_cw(&m, 8, 5000), DFCCL_CQ_BAD_ENTRY);

	/* The daemon counted the errors and still serves. */
	dfccl_envelope *r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_STATS);
	assert_non_null(r);
	assert_int_equal(r->query_reply->n_stats, 2);
	assert_int_equal(r->query_reply->stats[1]->completed, 1);
	assert_int_equal(r->query_reply->stats[1]->errors, 7);
	assert_int_equal(r->query_reply->stats[0]->errors, 0);
	/* Both workers serve: their state says so in words. */
	assert_string_equal(r->query_reply->stats[0]->worker_state, "up");
	assert_string_equal(r->query_reply->stats[1]->worker_state, "up");
	frame_envelope_free(r);
	qp_unmap(&m);
	raw_close(&c);
}

static void test_unarmed_does_not_block(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	struct qp_map m = attach(&c, 0);

	/* Entries 1..4 reserved; 1 and 3 stay unarmed (as if their GPU
	 * streams had not reached them yet); 2 and 4 are armed. */
	for (uint64_t s = 1; s <= 4; s++)
		put(&m, s, DFCCL_OP_NOP);
	reserve(&m, 4);
	arm(&m, 2);
	arm(&m, 4);
	assert_int_equal(wait_cw(&m, 2, 5000), DFCCL_CQ_OK);
	assert_int_equal(wait_cw(&m, 4, 5000), DFCCL_CQ_OK);
	assert_int_equal(wait_cw(&m, 1, 50), -1);
	assert_int_equal(wait_cw(&m, 3, 50), -1);
	/* The head stays at the oldest unarmed entry. */
	assert_int_equal(atomic_load((_Atomic uint64_t *)&m.h->sq_head), 1);
	arm(&m, 3);
	assert_int_equal(wait_cw(&m, 3, 5000), DFCCL_CQ_OK);
	arm(&m, 1);
	assert_int_equal(wait_cw(&m, 1, 5000), DFCCL_CQ_OK);
	uint64_t deadline = now_ms() + 2000;
	while (atomic_load((_Atomic uint64_t *)&m.h->sq_head) != 5 && now_ms() < deadline)
		usleep(1000);
	assert_int_equal(atomic_load((_Atomic uint64_t *)&m.h->sq_head), 5);

	/* Many laps through the 16-entry ring, with the engine asleep between
	 * some of them: every entry completes exactly once. */
	for (uint64_t s = 5; s < 5 + 16 * 20; s++) {
		put(&m, s, DFCCL_OP_NOP);
		reserve(&m, s);
		arm(&m, s);
		assert_int_equal(wait_cw(&m, s, 5000), DFCCL_CQ_OK);
		if (s % 97 == 0)
			usleep(2000);
	}
	assert_int_equal(atomic_load((_Atomic uint64_t *)&m.h->completed), 4 + 16 * 20);
	qp_unmap(&m);
	raw_close(&c);
}

static void test_register_checks(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);

	/* Unsealed memfd: refused (it could shrink under the engine). */
	int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_int_equal(ftruncate(fd, 8192), 0);
	dfccl_envelope *r = raw_register_memfd(&c, 0, 0, 4096, fd);
	assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
	assert_non_null(strstr(r->error->message, "F_SEAL_SHRINK"));
	frame_envelope_free(r);

	/* Sealed: accepted; a range beyond the file is refused. */
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	r = raw_register_memfd(&c, 0, 8000, 4096, fd);
	assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
	frame_envelope_free(r);
	r = raw_register_memfd(&c, 0, 4096, 4096, fd);
	assert_non_null(r);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY);
	uint32_t reg_id = r->register_reply->reg_id;
	assert_true(reg_id > 0);
	frame_envelope_free(r);

	/* No descriptor at all; an unknown device. */
	r = raw_register_memfd(&c, 0, 4096, 4096, -1);
	assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
	frame_envelope_free(r);
	r = raw_register_memfd(&c, 9, 4096, 4096, fd);
	assert_int_equal(error_code(r), EC(NOT_FOUND));
	assert_non_null(strstr(r->error->message, "device 9 does not exist"));
	frame_envelope_free(r);

	r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS);
	assert_int_equal(r->query_reply->sessions[0]->nregs, 1);
	assert_int_equal(r->query_reply->sessions[0]->registered_bytes, 4096);
	frame_envelope_free(r);

	Dfccl__V1__DeregisterMem dm = DFCCL__V1__DEREGISTER_MEM__INIT;
	dm.reg_id = reg_id + 1000;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_DEREGISTER_MEM;
	env.deregister_mem = &dm;
	r = raw_request(&c, &env, NULL, 0, NULL, NULL);
	assert_int_equal(error_code(r), EC(NOT_FOUND));
	frame_envelope_free(r);
	dm.reg_id = reg_id;
	r = raw_request(&c, &env, NULL, 0, NULL, NULL);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_OK);
	frame_envelope_free(r);
	close(fd);
	raw_close(&c);
}

/* Descriptors open in the daemon's supervisor. */
static int daemon_fd_count(const struct daemon_proc *d)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
	DIR *dir = opendir(path);
	assert_non_null(dir);
	int n = 0;
	for (struct dirent *e; (e = readdir(dir));)
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* Sends env (with descriptor fd, -1: none); the reply must be an
 * ErrorReply with code and a message containing needle. */
static void request_refused(struct raw_client *c, dfccl_envelope *env, int fd, int code, const char *needle)
{
	dfccl_envelope *r = raw_request(c, env, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, NULL, NULL);
	assert_int_equal(error_code(r), code);
	if (!strstr(r->error->message, needle))
		fail_msg("error \"%s\" does not mention \"%s\"", r->error->message, needle);
	frame_envelope_free(r);
}

/* GPU memory needs the CUDA engine: the host engine refuses it with a
 * sentence saying so, after the checks of the request itself, and charges
 * nothing for it nor keeps a descriptor. */
static void test_register_gpu_needs_cuda_engine(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	uint8_t handle[65] = {0};
	Dfccl__V1__RegisterMem rm = DFCCL__V1__REGISTER_MEM__INIT;
	rm.kind = DFCCL__V1__MEM_KIND__MEM_CUDA_IPC;
	rm.device = 1;
	rm.size = 1 << 20;
	rm.ipc_handle.data = handle;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	env.register_mem = &rm;

	/* A handle of the wrong length, or none. */
	size_t bad_lens[] = {0, 63, 65};
	for (size_t i = 0; i < sizeof(bad_lens) / sizeof(bad_lens[0]); i++) {
		rm.ipc_handle.len = bad_lens[i];
		dfccl_envelope *r = raw_request(&c, &env, NULL, 0, NULL, NULL);
		assert_int_equal(error_code(r), EC(INVALID_ARGUMENT));
		assert_non_null(strstr(r->error->message, "has 64 bytes"));
		frame_envelope_free(r);
	}
	/* A well-formed handle: the host engine cannot use it. */
	rm.ipc_handle.len = 64;
	dfccl_envelope *r = raw_request(&c, &env, NULL, 0, NULL, NULL);
	assert_int_equal(error_code(r), EC(NOT_SUPPORTED));
	assert_non_null(strstr(r->error->message, "runs the host engine"));
	assert_non_null(strstr(r->error->message, "--engine cuda on a GPU node"));
	frame_envelope_free(r);
	/* Nor an unknown device: that check comes first. */
	rm.device = 9;
	r = raw_request(&c, &env, NULL, 0, NULL, NULL);
	assert_int_equal(error_code(r), EC(NOT_FOUND));
	frame_envelope_free(r);

	/* A VMM allocation exported as a descriptor: the request's own checks
	 * first (its descriptor, its size), then the engine's refusal. */
	int fd = sealed_memfd(4096);
	int daemon_fds = daemon_fd_count(d);
	rm.kind = DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD;
	rm.device = 0;
	rm.size = 4096;
	rm.ipc_handle.len = 0;
	request_refused(&c, &env, -1, EC(INVALID_ARGUMENT), "carries 0 descriptors, expected 1");
	rm.size = 0;
	request_refused(&c, &env, fd, EC(INVALID_ARGUMENT), "size 0");
	rm.size = 4096;
	rm.offset = UINT64_MAX - 10;
	request_refused(&c, &env, fd, EC(INVALID_ARGUMENT), "wraps around");
	rm.offset = 0;
	request_refused(&c, &env, fd, EC(NOT_SUPPORTED), "runs the host engine, which cannot reach GPU memory: GPU "
	                                                   "memory exported as a file descriptor (cuMemCreate) needs "
	                                                   "dfccld started with --engine cuda on a GPU node");
	close(fd);
	/* Device memory from the daemon: the host engine has none. */
	Dfccl__V1__AllocMem am = DFCCL__V1__ALLOC_MEM__INIT;
	am.device = 0;
	am.size = 4096;
	Dfccl__V1__Envelope aenv = DFCCL__V1__ENVELOPE__INIT;
	aenv.body_case = DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM;
	aenv.alloc_mem = &am;
	request_refused(&c, &aenv, -1, EC(NOT_SUPPORTED), "device memory from dfcclMemAlloc needs dfccld started with "
	                                                  "--engine cuda");
	/* None of the descriptors sent stayed with the daemon. */
	assert_int_equal(daemon_fd_count(d), daemon_fds);

	r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS);
	assert_int_equal(r->query_reply->sessions[0]->nregs, 0);
	assert_int_equal(r->query_reply->sessions[0]->registered_bytes, 0);
	frame_envelope_free(r);
	raw_close(&c);
}

static void test_registered_range_checked_by_engine(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	struct qp_map m = attach(&c, 0);
	int fd = sealed_memfd(4096);
	Dfccl__V1__RegisterMem rm = DFCCL__V1__REGISTER_MEM__INIT;
	rm.kind = DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD;
	rm.size = 4096;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	env.register_mem = &rm;
	dfccl_envelope *r = raw_request(&c, &env, &fd, 1, NULL, NULL);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY);
	uint32_t reg = r->register_reply->reg_id;
	frame_envelope_free(r);

	/* 1024 floats fit exactly; 1025 do not; an offset near 2^64 does not
	 * wrap around; a receive buffer 2 bytes into a float is refused, though
	 * in range. */
	struct dfccl_sqe *e = put(&m, 1, DFCCL_OP_ALLREDUCE);
	e->send_reg = e->recv_reg = reg;
	e->count = 1024;
	e = put(&m, 2, DFCCL_OP_ALLREDUCE);
	e->send_reg = e->recv_reg = reg;
	e->count = 1025;
	e = put(&m, 3, DFCCL_OP_ALLREDUCE);
	e->send_reg = e->recv_reg = reg;
	e->count = 4;
	e->send_off = UINT64_MAX - 8;
	e = put(&m, 4, DFCCL_OP_ALLREDUCE);
	e->send_reg = e->recv_reg = reg;
	e->count = UINT64_MAX / 2;
	e = put(&m, 5, DFCCL_OP_ALLREDUCE);
	e->send_reg = e->recv_reg = reg;
	e->count = 16;
	e->recv_off = 2;
	reserve(&m, 5);
	for (uint64_t s = 1; s <= 5; s++)
		arm(&m, s);
	/* In range: it reaches the engine, which knows no communicator 1. */
	assert_int_equal(wait_cw(&m, 1, 5000), DFCCL_CQ_BAD_COMM);
	assert_int_equal(wait_cw(&m, 2, 5000), DFCCL_CQ_OUT_OF_RANGE);
	assert_int_equal(wait_cw(&m, 3, 5000), DFCCL_CQ_OUT_OF_RANGE);
	assert_int_equal(wait_cw(&m, 4, 5000), DFCCL_CQ_OUT_OF_RANGE);
	assert_int_equal(wait_cw(&m, 5, 5000), DFCCL_CQ_OUT_OF_RANGE);

	/* Another session cannot use this session's registration. */
	struct raw_client other = connect_ok(d);
	struct qp_map m2 = attach(&other, 0);
	e = put(&m2, 1, DFCCL_OP_ALLREDUCE);
	e->send_reg = e->recv_reg = reg;
	e->count = 16;
	reserve(&m2, 1);
	arm(&m2, 1);
	assert_int_equal(wait_cw(&m2, 1, 5000), DFCCL_CQ_BAD_REG);
	qp_unmap(&m2);
	raw_close(&other);
	qp_unmap(&m);
	close(fd);
	raw_close(&c);
}

static void test_disconnect_cleans_up(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	struct qp_map m = attach(&c, 0);
	struct qp_map m1 = attach(&c, 1);
	qp_unmap(&m);
	qp_unmap(&m1);
	struct raw_client watcher = connect_ok(d);
	dfccl_envelope *r = raw_query(&watcher, DFCCL__V1__QUERY_KIND__QUERY_QUEUES);
	assert_int_equal(r->query_reply->n_queues, 2);
	frame_envelope_free(r);
	raw_close(&c);
	uint64_t deadline = now_ms() + 3000;
	size_t nq = 99, ns = 99;
	while (now_ms() < deadline) {
		r = raw_query(&watcher, DFCCL__V1__QUERY_KIND__QUERY_QUEUES);
		nq = r->query_reply->n_queues;
		frame_envelope_free(r);
		r = raw_query(&watcher, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS);
		ns = r->query_reply->n_sessions;
		frame_envelope_free(r);
		if (nq == 0 && ns == 1)
			break;
		usleep(10000);
	}
	assert_int_equal(nq, 0);
	assert_int_equal(ns, 1);
	raw_close(&watcher);
}

static void test_sigterm_tells_clients(void **state)
{
	struct daemon_proc *d = *state;
	struct raw_client c = connect_ok(d);
	kill(d->pid, SIGTERM);
	dfccl_envelope *r = raw_next(&c, 5000, NULL, NULL);
	assert_non_null(r);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_NOTICE);
	assert_int_equal(r->notice->code, EC(SHUTTING_DOWN));
	frame_envelope_free(r);
	assert_null(raw_next(&c, 5000, NULL, NULL)); /* then the connection ends */
	raw_close(&c);
	int rc = child_wait(d->pid, 10000);
	d->pid = 0;
	assert_int_equal(rc, 0);
	struct stat st;
	assert_int_equal(stat(d->socket, &st), -1); /* the socket is gone */
	/* Its workers are gone too. */
	assert_int_equal(daemon_log_contains(d, "worker 0") + 0 >= 0, 1);
	assert_true(daemon_log_contains(d, "stopped") >= 1);
}

static void test_uid_quotas(void **state)
{
	struct daemon_proc d;
	assert_int_equal(daemon_start(&d, 1, "--max-sessions-per-uid", "2", "--max-registered-bytes-per-uid", "8K",
	                              NULL),
	                 0);
	/* The harness's own readiness check has closed its session; two may be
	 * open, a third is refused with a reason. */
	struct raw_client a = connect_ok(&d), b = connect_ok(&d), c;
	dfccl_envelope *err = NULL;
	uint64_t deadline = now_ms() + 2000;
	int rc;
	while ((rc = raw_connect(&c, d.socket, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, &err)) == 0 &&
	       now_ms() < deadline) {
		/* The daemon may not have reaped the readiness session yet. */
		raw_close(&c);
		usleep(10000);
	}
	assert_int_equal(rc, -1);
	assert_int_equal(error_code(err), EC(RESOURCE));
	assert_non_null(strstr(err->error->message, "max-sessions-per-uid"));
	frame_envelope_free(err);
	raw_close(&b);

	/* 8 KiB of registrations: 4 KiB + 4 KiB fit, one byte more does not,
	 * and deregistering makes room again. */
	int fd = sealed_memfd(16384);
	Dfccl__V1__RegisterMem rm = DFCCL__V1__REGISTER_MEM__INIT;
	rm.kind = DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD;
	rm.size = 4096;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	env.register_mem = &rm;
	uint32_t ids[2];
	for (int i = 0; i < 2; i++) {
		dfccl_envelope *r = raw_request(&a, &env, &fd, 1, NULL, NULL);
		assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY);
		ids[i] = r->register_reply->reg_id;
		frame_envelope_free(r);
	}
	rm.size = 1;
	dfccl_envelope *r = raw_request(&a, &env, &fd, 1, NULL, NULL);
	assert_int_equal(error_code(r), EC(RESOURCE));
	assert_non_null(strstr(r->error->message, "max-registered-bytes-per-uid"));
	frame_envelope_free(r);
	Dfccl__V1__DeregisterMem dm = DFCCL__V1__DEREGISTER_MEM__INIT;
	dm.reg_id = ids[0];
	Dfccl__V1__Envelope denv = DFCCL__V1__ENVELOPE__INIT;
	denv.body_case = DFCCL__V1__ENVELOPE__BODY_DEREGISTER_MEM;
	denv.deregister_mem = &dm;
	r = raw_request(&a, &denv, NULL, 0, NULL, NULL);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_OK);
	frame_envelope_free(r);
	r = raw_request(&a, &env, &fd, 1, NULL, NULL);
	assert_int_equal(r->body_case, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY);
	frame_envelope_free(r);
	close(fd);
	raw_close(&a);
	assert_int_equal(daemon_stop(&d), 0);
}

static void test_engine_cuda_without_gpu(void **state)
{
	/* Asking for the CUDA engine where no GPU can be used fails at start
	 * with a reason, instead of serving devices that do not work. Skipped
	 * where a GPU is present. */
	if (access("/dev/nvidiactl", F_OK) == 0) {
		print_message("skipped: this machine has a GPU\n");
		skip();
	}
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "%s --engine cuda --socket /tmp/dfccl-nogpu-%d.sock --config /dev/null "
	         "--log-target stderr 2>&1", DFCCLD_PATH, (int)getpid());
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	char out[4096] = "";
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	assert_non_null(strstr(out, "no usable GPU"));
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_hello_and_status, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_version_mismatch, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_request_before_hello, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_malformed_frames, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_truncated_frame_then_close, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_queue_nop_and_garbage, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_unarmed_does_not_block, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_register_checks, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_register_gpu_needs_cuda_engine, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_registered_range_checked_by_engine, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_disconnect_cleans_up, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_tells_clients, daemon_setup2, daemon_teardown),
	    cmocka_unit_test(test_uid_quotas),
	    cmocka_unit_test(test_engine_cuda_without_gpu),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
