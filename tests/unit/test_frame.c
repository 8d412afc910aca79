/*
 * Tests of the control-message framing (proto/frame.c): every envelope kind
 * survives encode -> reader -> decode unchanged; descriptors sent with a
 * frame are handed to that frame and no other, however the kernel batches the
 * bytes; frames delivered one byte at a time decode once complete; a bad
 * length prefix, a payload that does not decode and a frame with too many
 * descriptors each give their documented error, with every descriptor closed
 * (the fixture counts /proc/self/fd before and after each test).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "frame.h"
#include "testutil.h"

struct fixture {
	int sv[2]; /* sv[0] sends, sv[1] is read through rd */
	struct frame_reader rd;
	int fds_before;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	f->fds_before = tu_count_fds();
	if (tu_socketpair(f->sv) < 0 || tu_set_rcvtimeo(f->sv[1], 2000) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	frame_reader_free(&f->rd);
	close(f->sv[0]);
	close(f->sv[1]);
	/* Every test must leave exactly the descriptors it found. */
	int leaked = tu_count_fds() - f->fds_before;
	free(f);
	assert_int_equal(leaked, 0);
	return 0;
}

/* ------------------------------------------------------------ round trips */

/* Encodes env, checks the prefix, feeds the frame to a fresh reader and
 * checks that the decoded envelope packs to the very same bytes. */
static void roundtrip(const dfccl_envelope *env)
{
	uint8_t *buf;
	size_t len;
	assert_int_equal(frame_encode(env, &buf, &len), 0);
	size_t plen = dfccl__v1__envelope__get_packed_size(env);
	assert_int_equal(len, 4 + plen);
	uint32_t prefix = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
	assert_int_equal(prefix, plen);

	struct frame_reader r = FRAME_READER_INIT;
	assert_int_equal(tu_reader_append(&r, buf, len), 0);
	dfccl_envelope *out;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds = 99;
	assert_int_equal(frame_reader_next(&r, &out, fds, &nfds), 1);
	assert_int_equal(nfds, 0);
	assert_int_equal(r.len, 0);
	assert_int_equal(out->body_case, env->body_case);
	assert_int_equal(out->request_id, env->request_id);
	uint8_t *again = malloc(plen);
	assert_non_null(again);
	assert_int_equal(dfccl__v1__envelope__pack(out, again), plen);
	assert_memory_equal(again, buf + 4, plen);
	free(again);
	frame_envelope_free(out);
	frame_reader_free(&r);
	free(buf);
}

static void test_roundtrip_requests(void **state)
{
	uint8_t id[128];
	for (unsigned i = 0; i < sizeof(id); i++)
		id[i] = (uint8_t)(i * 7 + 1);
	struct tu_msg m;
	tu_msg_hello(&m, 1, 1, 3);
	roundtrip(&m.env);
	tu_msg_query(&m, 2, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
	roundtrip(&m.env);
	tu_msg_attach(&m, 3, 5, 1024);
	roundtrip(&m.env);
	tu_msg_comm_init(&m, 4, id, sizeof(id), 8, 7, 1);
	roundtrip(&m.env);
	tu_msg_comm_destroy(&m, 5, 77);
	roundtrip(&m.env);
	tu_msg_comm_abort(&m, 6, UINT64_MAX);
	roundtrip(&m.env);
	tu_msg_register_memfd(&m, 7, 0, 1ull << 40);
	roundtrip(&m.env);
	tu_msg_deregister(&m, UINT64_MAX, UINT32_MAX);
	roundtrip(&m.env);
}

static void test_roundtrip_replies(void **state)
{
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.request_id = 42;

	Dfccl__V1__HelloReply hr = DFCCL__V1__HELLO_REPLY__INIT;
	hr.version = 1;
	hr.daemon_version = "0.1.0";
	hr.session_id = 9;
	hr.engine = DFCCL__V1__ENGINE_KIND__ENGINE_HOST;
	hr.ndevices = 2;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY;
	env.hello_reply = &hr;
	roundtrip(&env);

	Dfccl__V1__ErrorReply er = DFCCL__V1__ERROR_REPLY__INIT;
	er.code = DFCCL__V1__ERROR_CODE__ERROR_NOT_FOUND;
	er.message = "device 3 does not exist";
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ERROR;
	env.error = &er;
	roundtrip(&env);

	/* Ok has no fields: the frame still has a body (the field tag). */
	Dfccl__V1__Ok ok = DFCCL__V1__OK__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_OK;
	env.ok = &ok;
	roundtrip(&env);

	Dfccl__V1__AttachReply ar = DFCCL__V1__ATTACH_REPLY__INIT;
	ar.device = 1;
	ar.qp_id = 3;
	ar.region_size = 143360;
	ar.nfds = 2;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ATTACH_REPLY;
	env.attach_reply = &ar;
	roundtrip(&env);

	Dfccl__V1__CommRank ranks[3], *rankp[3];
	for (unsigned i = 0; i < 3; i++) {
		dfccl__v1__comm_rank__init(&ranks[i]);
		ranks[i].rank = i;
		ranks[i].device = i % 2;
		ranks[i].session_id = 100 + i;
		ranks[i].pid = -1 - (int)i;
		rankp[i] = &ranks[i];
	}
	Dfccl__V1__CommInitReply cr = DFCCL__V1__COMM_INIT_REPLY__INIT;
	cr.comm_id = 5;
	cr.nranks = 3;
	cr.rank = 2;
	cr.n_ranks = 3;
	cr.ranks = rankp;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_INIT_REPLY;
	env.comm_init_reply = &cr;
	roundtrip(&env);

	Dfccl__V1__RegisterReply rr = DFCCL__V1__REGISTER_REPLY__INIT;
	rr.reg_id = 17;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY;
	env.register_reply = &rr;
	roundtrip(&env);

	Dfccl__V1__DeviceInfo di = DFCCL__V1__DEVICE_INFO__INIT, *dip = &di;
	di.index = 0;
	di.name = "host0";
	di.worker_up = 1;
	di.worker_pid = 1234;
	Dfccl__V1__StatusInfo si = DFCCL__V1__STATUS_INFO__INIT;
	si.daemon_version = "0.1.0";
	si.protocol_version = DFCCL_PROTO_VERSION;
	si.n_devices = 1;
	si.devices = &dip;
	Dfccl__V1__QueryReply qr = DFCCL__V1__QUERY_REPLY__INIT;
	qr.kind = DFCCL__V1__QUERY_KIND__QUERY_STATUS;
	qr.status = &si;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY;
	env.query_reply = &qr;
	roundtrip(&env);

	Dfccl__V1__Notice no = DFCCL__V1__NOTICE__INIT;
	no.code = DFCCL__V1__ERROR_CODE__ERROR_PEER_LOST;
	no.comm_id = 5;
	no.message = "rank 1 disconnected";
	env.request_id = 0;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_NOTICE;
	env.notice = &no;
	roundtrip(&env);
}

static void test_roundtrip_worker_messages(void **state)
{
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.request_id = 3;

	Dfccl__V1__WorkerHello wh = DFCCL__V1__WORKER_HELLO__INIT;
	wh.device = 1;
	wh.pid = 4321;
	wh.name = "host1";
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_HELLO;
	env.worker_hello = &wh;
	roundtrip(&env);

	Dfccl__V1__WorkerAttachQp wa = DFCCL__V1__WORKER_ATTACH_QP__INIT;
	wa.qp_id = 2;
	wa.session_id = 8;
	wa.region_size = 8192;
	wa.uid = 40001;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_ATTACH_QP;
	env.worker_attach_qp = &wa;
	roundtrip(&env);

	Dfccl__V1__WorkerDetachQp wd = DFCCL__V1__WORKER_DETACH_QP__INIT;
	wd.qp_id = 2;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_DETACH_QP;
	env.worker_detach_qp = &wd;
	roundtrip(&env);

	uint8_t handle[64] = {1, 2, 3};
	Dfccl__V1__WorkerAddReg war = DFCCL__V1__WORKER_ADD_REG__INIT;
	war.reg_id = 4;
	war.session_id = 8;
	war.kind = DFCCL__V1__MEM_KIND__MEM_CUDA_IPC;
	war.size = 1 << 20;
	war.ipc_handle.data = handle;
	war.ipc_handle.len = sizeof(handle);
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_ADD_REG;
	env.worker_add_reg = &war;
	roundtrip(&env);

	Dfccl__V1__WorkerDelReg wdr = DFCCL__V1__WORKER_DEL_REG__INIT;
	wdr.reg_id = 4;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_DEL_REG;
	env.worker_del_reg = &wdr;
	roundtrip(&env);
}

static void test_encode_limits(void **state)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	/* An envelope with nothing set packs to zero bytes, which the framing
	 * reserves as invalid. */
	Dfccl__V1__Envelope empty = DFCCL__V1__ENVELOPE__INIT;
	assert_int_equal(frame_encode(&empty, &buf, &len), -EINVAL);

	/* A message just over the limit is refused rather than truncated. */
	char *big = malloc(DFCCL_FRAME_MAX + 1);
	assert_non_null(big);
	memset(big, 'x', DFCCL_FRAME_MAX);
	big[DFCCL_FRAME_MAX] = '\0';
	Dfccl__V1__ErrorReply er = DFCCL__V1__ERROR_REPLY__INIT;
	er.message = big;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_ERROR;
	env.error = &er;
	assert_int_equal(frame_encode(&env, &buf, &len), -EMSGSIZE);
	assert_int_equal(frame_send(-1, &env, NULL, 0), -EMSGSIZE);
	free(big);

	/* frame_sendmsg refuses more descriptors than a frame may carry before
	 * touching the socket (sock -1 would fail with EBADF otherwise). */
	int fds[DFCCL_FRAME_MAX_FDS + 1] = {0};
	assert_int_equal(frame_sendmsg(-1, (const uint8_t *)"abcd", 4, fds, DFCCL_FRAME_MAX_FDS + 1), -E2BIG);
}

/* ------------------------------------------------------------ descriptors */

/* Sends a query frame with request id `req` carrying n fresh memfds; their
 * numbers (still open here) go to sent[]. */
static void send_with_fds(int sock, uint64_t req, unsigned n, int *sent)
{
	for (unsigned i = 0; i < n; i++) {
		sent[i] = tu_memfd(4096, 0);
		assert_true(sent[i] >= 0);
	}
	struct tu_msg m;
	tu_msg_query(&m, req, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_int_equal(frame_send(sock, &m.env, sent, n), 0);
}

/* Receives the next frame and checks that it is request `req` with exactly
 * the files of sent[0..n), in order. */
static void expect_frame(struct fixture *f, uint64_t req, const int *sent, unsigned n)
{
	dfccl_envelope *env;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds;
	assert_int_equal(frame_recv(&f->rd, f->sv[1], &env, fds, &nfds), 1);
	assert_int_equal(env->request_id, req);
	assert_int_equal(nfds, n);
	for (unsigned i = 0; i < n; i++)
		assert_true(tu_same_file(fds[i], sent[i]));
	frame_close_fds(fds, nfds);
	frame_close_fds(sent, n);
	frame_envelope_free(env);
}

/* Sends frames with the given descriptor counts back to back, lets the reader
 * take whatever one recvmsg() gives, then checks each frame got its own. */
static void fds_pattern(struct fixture *f, const unsigned *counts, unsigned nframes)
{
	int sent[8][DFCCL_FRAME_MAX_FDS];
	for (unsigned i = 0; i < nframes; i++)
		send_with_fds(f->sv[0], 100 + i, counts[i], sent[i]);
	assert_true(frame_reader_fill(&f->rd, f->sv[1]) > 0);
	for (unsigned i = 0; i < nframes; i++)
		expect_frame(f, 100 + i, sent[i], counts[i]);
}

static void test_fds_bound_to_frame(void **state)
{
	struct fixture *f = *state;
	/* The kernel hands over a message's descriptors with the last part of
	 * the data it returns, so a frame without descriptors followed by one
	 * with them comes back in a single read: the case that matters most. */
	static const unsigned p1[] = {0, 2}, p2[] = {1, 2}, p3[] = {2, 0}, p4[] = {3, 1}, p5[] = {0, 0, 3},
	                      p6[] = {8, 0, 8}, p7[] = {0, 1, 0, 1, 0};
	fds_pattern(f, p1, 2);
	fds_pattern(f, p2, 2);
	fds_pattern(f, p3, 2);
	fds_pattern(f, p4, 2);
	fds_pattern(f, p5, 3);
	fds_pattern(f, p6, 3);
	fds_pattern(f, p7, 5);
}

static void test_byte_by_byte_socket(void **state)
{
	struct fixture *f = *state;
	struct tu_msg m;
	tu_msg_query(&m, 11, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	uint8_t *buf;
	size_t len;
	assert_int_equal(frame_encode(&m.env, &buf, &len), 0);
	int sent[2] = {tu_memfd(64, 0), tu_memfd(64, 0)};

	/* First frame: two descriptors on its first byte, then one byte per
	 * sendmsg. Second frame: none; it must not inherit the first's. */
	for (unsigned pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < len; i++) {
			int attach = pass == 0 && i == 0;
			assert_int_equal(frame_sendmsg(f->sv[0], buf + i, 1, attach ? sent : NULL, attach ? 2 : 0), 1);
			assert_int_equal(frame_reader_fill(&f->rd, f->sv[1]), 1);
			dfccl_envelope *env;
			int fds[DFCCL_FRAME_MAX_FDS];
			unsigned nfds;
			int rc = frame_reader_next(&f->rd, &env, fds, &nfds);
			if (i + 1 < len) {
				assert_int_equal(rc, 0);
				assert_null(env);
				continue;
			}
			assert_int_equal(rc, 1);
			assert_int_equal(env->request_id, 11);
			assert_int_equal(nfds, pass == 0 ? 2 : 0);
			for (unsigned k = 0; k < nfds; k++)
				assert_true(tu_same_file(fds[k], sent[k]));
			frame_close_fds(fds, nfds);
			frame_envelope_free(env);
		}
	}
	frame_close_fds(sent, 2);
	free(buf);
}

static void test_byte_by_byte_buffer(void **state)
{
	struct tu_msg m;
	tu_msg_hello(&m, 5, 1, 1);
	uint8_t *buf;
	size_t len;
	assert_int_equal(frame_encode(&m.env, &buf, &len), 0);
	struct frame_reader r = FRAME_READER_INIT;
	for (size_t i = 0; i < len; i++) {
		assert_int_equal(tu_reader_append(&r, buf + i, 1), 0);
		dfccl_envelope *env;
		int rc = frame_reader_next(&r, &env, NULL, NULL);
		assert_int_equal(rc, i + 1 < len ? 0 : 1);
		if (rc == 1) {
			assert_int_equal(env->body_case, DFCCL__V1__ENVELOPE__BODY_HELLO);
			assert_int_equal(env->hello->min_version, 1);
			frame_envelope_free(env);
		}
	}
	assert_int_equal(r.len, 0);
	assert_int_equal(r.base, len);
	frame_reader_free(&r);
	free(buf);
}

/* ------------------------------------------------------------ bad input */

static int next_of(const uint8_t *bytes, size_t len)
{
	struct frame_reader r = FRAME_READER_INIT;
	assert_int_equal(tu_reader_append(&r, bytes, len), 0);
	dfccl_envelope *env;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds;
	int rc = frame_reader_next(&r, &env, fds, &nfds);
	if (rc == 1)
		frame_envelope_free(env);
	else
		assert_null(env);
	frame_reader_free(&r);
	return rc;
}

static void test_bad_length(void **state)
{
	static const uint8_t zero[] = {0, 0, 0, 0, 0x08, 0x01};
	static const uint8_t over[] = {0x01, 0x00, 0x10, 0x00}; /* DFCCL_FRAME_MAX + 1 */
	static const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff};
	static const uint8_t at_max[] = {0x00, 0x00, 0x10, 0x00, 0x08}; /* legal, incomplete */
	static const uint8_t short_hdr[] = {0x02, 0x00, 0x00};
	assert_int_equal(next_of(zero, sizeof(zero)), -EMSGSIZE);
	assert_int_equal(next_of(over, sizeof(over)), -EMSGSIZE);
	assert_int_equal(next_of(huge, sizeof(huge)), -EMSGSIZE);
	assert_int_equal(next_of(at_max, sizeof(at_max)), 0);
	assert_int_equal(next_of(short_hdr, sizeof(short_hdr)), 0);
	assert_int_equal(next_of(NULL, 0), 0);
}

static void test_garbage_then_valid(void **state)
{
	struct fixture *f = *state;
	/* Payloads that protobuf must reject: an invalid wire type, a
	 * length-delimited body that runs past the end, an unterminated varint. */
	static const uint8_t bad_wire[] = {0x07};
	static const uint8_t bad_len[] = {0x52, 0x10, 0x08};
	static const uint8_t bad_varint[] = {0x08, 0xff, 0xff};
	static const struct {
		const uint8_t *p;
		size_t n;
	} bad[] = {{bad_wire, sizeof(bad_wire)}, {bad_len, sizeof(bad_len)}, {bad_varint, sizeof(bad_varint)}};

	for (unsigned i = 0; i < 3; i++) {
		/* The garbage frame carries a descriptor: it must be closed, not
		 * handed to the next frame. */
		int fd = tu_memfd(64, 0);
		assert_int_equal(tu_send_raw(f->sv[0], (uint32_t)bad[i].n, bad[i].p, bad[i].n, &fd, 1),
		                 (int)(4 + bad[i].n));
		close(fd);
		struct tu_msg m;
		tu_msg_query(&m, 200 + i, DFCCL__V1__QUERY_KIND__QUERY_SESSIONS);
		assert_int_equal(frame_send(f->sv[0], &m.env, NULL, 0), 0);

		dfccl_envelope *env;
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 99;
		assert_int_equal(frame_recv(&f->rd, f->sv[1], &env, fds, &nfds), -EBADMSG);
		assert_null(env);
		assert_int_equal(nfds, 0);
		expect_frame(f, 200 + i, NULL, 0);
	}
}

/* The payload of a valid Query frame, for hand-built frames. */
static uint8_t *query_payload(uint64_t req, size_t *plen)
{
	struct tu_msg m;
	tu_msg_query(&m, req, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	*plen = dfccl__v1__envelope__get_packed_size(&m.env);
	uint8_t *p = malloc(*plen);
	assert_non_null(p);
	dfccl__v1__envelope__pack(&m.env, p);
	return p;
}

static void open_memfds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		fds[i] = tu_memfd(64, 0);
		assert_true(fds[i] >= 0);
	}
}

static void test_too_many_fds(void **state)
{
	struct fixture *f = *state;
	size_t plen;
	uint8_t *p = query_payload(300, &plen);
	int fds[DFCCL_FRAME_MAX_FDS + 1];
	open_memfds(fds, DFCCL_FRAME_MAX_FDS + 1);
	assert_true(tu_send_raw(f->sv[0], (uint32_t)plen, p, plen, fds, DFCCL_FRAME_MAX_FDS + 1) > 0);
	frame_close_fds(fds, DFCCL_FRAME_MAX_FDS + 1);
	struct tu_msg m;
	tu_msg_query(&m, 301, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_int_equal(frame_send(f->sv[0], &m.env, NULL, 0), 0);

	dfccl_envelope *env;
	int got[DFCCL_FRAME_MAX_FDS];
	unsigned nfds = 99;
	assert_int_equal(frame_recv(&f->rd, f->sv[1], &env, got, &nfds), -E2BIG);
	assert_null(env);
	assert_int_equal(nfds, 0);
	assert_int_equal(f->rd.nfds, 0);
	/* The stream goes on. */
	expect_frame(f, 301, NULL, 0);
	free(p);
}

static void test_more_fds_than_one_read_holds(void **state)
{
	struct fixture *f = *state;
	/* More descriptors than the control buffer of one read: the kernel
	 * truncates, the reader reports -EMFILE, and nothing stays open. */
	size_t plen;
	uint8_t *p = query_payload(400, &plen);
	int fds[40];
	open_memfds(fds, 40);
	assert_true(tu_send_raw(f->sv[0], (uint32_t)plen, p, plen, fds, 40) > 0);
	frame_close_fds(fds, 40);
	assert_int_equal(frame_reader_fill(&f->rd, f->sv[1]), -EMFILE);
	dfccl_envelope *env;
	int got[DFCCL_FRAME_MAX_FDS];
	unsigned nfds;
	assert_int_equal(frame_reader_next(&f->rd, &env, got, &nfds), -E2BIG);
	free(p);
}

static void test_reader_fd_table_full(void **state)
{
	struct fixture *f = *state;
	/* Five frames of eight descriptors read before any is consumed: the
	 * reader holds 32; the rest are closed and reported. */
	int sent[DFCCL_FRAME_MAX_FDS];
	int rc = 0;
	for (unsigned i = 0; i < 5; i++) {
		send_with_fds(f->sv[0], 500 + i, DFCCL_FRAME_MAX_FDS, sent);
		frame_close_fds(sent, DFCCL_FRAME_MAX_FDS);
	}
	for (unsigned i = 0; i < 5 && rc >= 0; i++)
		rc = frame_reader_fill(&f->rd, f->sv[1]);
	assert_int_equal(rc, -EMFILE);
	assert_int_equal(f->rd.nfds, 4 * DFCCL_FRAME_MAX_FDS);
	/* The teardown's frame_reader_free closes the 32 still held. */
}

static void test_unclaimed_fds_closed(void **state)
{
	struct fixture *f = *state;
	int sent[3];
	send_with_fds(f->sv[0], 600, 3, sent);
	frame_close_fds(sent, 3);
	send_with_fds(f->sv[0], 601, 2, sent);
	frame_close_fds(sent, 2);
	/* A caller with no room for descriptors gets the frame; they are closed. */
	dfccl_envelope *env;
	assert_int_equal(frame_recv(&f->rd, f->sv[1], &env, NULL, NULL), 1);
	assert_int_equal(env->request_id, 600);
	frame_envelope_free(env);
	/* The second frame's descriptors are buffered and never claimed:
	 * frame_reader_free (in the teardown) must close them. */
	assert_true(frame_reader_fill(&f->rd, f->sv[1]) > 0);
	assert_int_equal(f->rd.nfds, 2);
}

static void test_end_of_stream(void **state)
{
	struct fixture *f = *state;
	struct tu_msg m;
	tu_msg_query(&m, 700, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_int_equal(frame_send(f->sv[0], &m.env, NULL, 0), 0);
	shutdown(f->sv[0], SHUT_WR);
	expect_frame(f, 700, NULL, 0);
	dfccl_envelope *env;
	assert_int_equal(frame_recv(&f->rd, f->sv[1], &env, NULL, NULL), 0);
	assert_null(env);
}

static void test_recv_timeout(void **state)
{
	struct fixture *f = *state;
	tu_set_rcvtimeo(f->sv[1], 50);
	dfccl_envelope *env;
	int rc = frame_recv(&f->rd, f->sv[1], &env, NULL, NULL);
	assert_true(rc == -EAGAIN || rc == -EWOULDBLOCK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_roundtrip_requests),
	    cmocka_unit_test(test_roundtrip_replies),
	    cmocka_unit_test(test_roundtrip_worker_messages),
	    cmocka_unit_test(test_encode_limits),
	    cmocka_unit_test_setup_teardown(test_fds_bound_to_frame, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_byte_by_byte_socket, setup, teardown),
	    cmocka_unit_test(test_byte_by_byte_buffer),
	    cmocka_unit_test(test_bad_length),
	    cmocka_unit_test_setup_teardown(test_garbage_then_valid, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_too_many_fds, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_more_fds_than_one_read_holds, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_reader_fd_table_full, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_unclaimed_fds_closed, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_end_of_stream, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_recv_timeout, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
