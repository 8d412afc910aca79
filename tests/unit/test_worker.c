/*
 * Tests of the engine worker's side of the exchange between the workers of
 * a communicator (daemon/worker.c): the real dfccld runs as the worker of
 * device 1 (`dfccld --worker-device 1 --engine host`, as the supervisor
 * starts it), and the test plays the supervisor on the other end of its
 * control socket.
 *
 * Covered: the acknowledgement of WorkerCommAdd carries no blob (the host
 * engine exports nothing); WorkerCommPeers for a communicator the worker
 * does not hold, naming a device outside the communicator or the worker's
 * own, a device twice, or an empty or too long blob, is refused with the
 * reason, and the worker serves on; well-formed ones (with blobs, or none)
 * are acknowledged; the worker, still serving, stops cleanly at SIGTERM.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl_comm.h"
#include "dfccl_stats.h"
#include "frame.h"
#include "testutil.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x
#define COMM_ID 7u
#define DEVICE 1u

struct fixture {
	pid_t pid;
	int ctl; /* the supervisor's end of the control socket */
	struct frame_reader rd;
};

/* The statistics page a worker insists on (fd 4), as the supervisor makes it. */
static int stats_page(void)
{
	int fd = memfd_create("test-stats", 0);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, DFCCL_STATS_SIZE), 0);
	struct dfccl_worker_stats *s = mmap(NULL, DFCCL_STATS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(s != MAP_FAILED);
	s->magic = DFCCL_STATS_MAGIC;
	s->device = DEVICE;
	munmap(s, DFCCL_STATS_SIZE);
	return fd;
}

/* The next frame from the worker, within 10 s. */
static dfccl_envelope *recv_env(struct fixture *fx)
{
	struct pollfd pf = {.fd = fx->ctl, .events = POLLIN};
	dfccl_envelope *env = NULL;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds = 0;
	/* A frame may already sit in the reader. */
	if (frame_reader_next(&fx->rd, &env, fds, &nfds) == 1)
		return env;
	assert_int_equal(poll(&pf, 1, 10000), 1);
	assert_int_equal(frame_recv(&fx->rd, fx->ctl, &env, fds, &nfds), 1);
	frame_close_fds(fds, nfds);
	return env;
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	int sv[2];
	if (!fx || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -1;
	int stats = stats_page();
	fx->pid = fork();
	if (fx->pid == 0) {
		dup2(sv[1], 3);
		dup2(stats, 4);
		execl(DFCCLD_PATH, DFCCLD_PATH, "--worker-device", "1", "--engine", "host", "--log-level", "err",
		      (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	close(stats);
	fx->ctl = sv[0];
	fx->rd = (struct frame_reader)FRAME_READER_INIT;
	*state = fx;
	dfccl_envelope *env = recv_env(fx);
	assert_int_equal(env->body_case, DFCCL__V1__ENVELOPE__BODY_WORKER_HELLO);
	assert_int_equal(env->worker_hello->device, DEVICE);
	frame_envelope_free(env);
	return fx->pid > 0 ? 0 : -1;
}

/* The supervisor stops the worker (SIGTERM, as at shutdown): it is still
 * there, and exits with status 0. */
static int teardown(void **state)
{
	struct fixture *fx = *state;
	assert_int_equal(kill(fx->pid, SIGTERM), 0);
	close(fx->ctl);
	frame_reader_free(&fx->rd);
	int status = -1;
	assert_int_equal(waitpid(fx->pid, &status, 0), fx->pid);
	free(fx);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	return 0;
}

/* The worker's answer to what was just sent: a WorkerCommAck of COMM_ID
 * with code, and a message containing needle. */
static void expect_ack(struct fixture *fx, uint64_t comm_id, int code, const char *needle)
{
	dfccl_envelope *env = recv_env(fx);
	assert_int_equal(env->body_case, DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ACK);
	const Dfccl__V1__WorkerCommAck *a = env->worker_comm_ack;
	assert_int_equal(a->comm_id, comm_id);
	assert_int_equal(a->code, code);
	if (!strstr(a->message, needle))
		fail_msg("acknowledgement \"%s\" does not mention \"%s\"", a->message, needle);
	assert_int_equal(a->peer_blob.len, 0);
	frame_envelope_free(env);
}

/* WorkerCommAdd of COMM_ID: rank 0 on device 0, rank 1 on this worker's. */
static void add_comm(struct fixture *fx)
{
	size_t size = DFCCL_COMM_REGION_SIZE(2);
	int fd = memfd_create("test-comm", 0);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	struct dfccl_comm_header *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(h != MAP_FAILED);
	h->magic = DFCCL_COMM_MAGIC;
	h->comm_id = COMM_ID;
	h->nranks = 2;
	h->header_size = sizeof(*h);
	h->region_size = size;
	munmap(h, size);

	Dfccl__V1__CommRank ranks[2], *rankp[2] = {&ranks[0], &ranks[1]};
	for (uint32_t r = 0; r < 2; r++) {
		dfccl__v1__comm_rank__init(&ranks[r]);
		ranks[r].rank = r;
		ranks[r].device = r == 0 ? 0 : DEVICE;
		ranks[r].session_id = 100 + r;
	}
	Dfccl__V1__WorkerCommAdd a = DFCCL__V1__WORKER_COMM_ADD__INIT;
	a.comm_id = COMM_ID;
	a.nranks = 2;
	a.n_members = 2;
	a.members = rankp;
	a.region_size = size;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ADD;
	env.worker_comm_add = &a;
	assert_int_equal(frame_send(fx->ctl, &env, &fd, 1), 0);
	close(fd);
}

/* WorkerCommPeers of comm_id with n blobs: devices[i] exported len[i]
 * bytes. */
static void send_peers(struct fixture *fx, uint64_t comm_id, const uint32_t *devices, const size_t *len, size_t n)
{
	static uint8_t data[DFCCL_PEER_BLOB_MAX + 1];
	memset(data, 'x', sizeof(data));
	Dfccl__V1__PeerBlob blobs[4], *ptrs[4];
	assert_true(n <= 4);
	for (size_t i = 0; i < n; i++) {
		dfccl__v1__peer_blob__init(&blobs[i]);
		blobs[i].device = devices[i];
		blobs[i].blob.data = data;
		blobs[i].blob.len = len[i];
		ptrs[i] = &blobs[i];
	}
	Dfccl__V1__WorkerCommPeers p = DFCCL__V1__WORKER_COMM_PEERS__INIT;
	p.comm_id = comm_id;
	p.n_peers = n;
	p.peers = ptrs;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_PEERS;
	env.worker_comm_peers = &p;
	assert_int_equal(frame_send(fx->ctl, &env, NULL, 0), 0);
}

static void test_peers_refused(void **state)
{
	struct fixture *fx = *state;
	add_comm(fx);
	expect_ack(fx, COMM_ID, EC(NONE), "");

	/* A communicator it does not hold. */
	static const uint32_t dev0[] = {0}, dev1[] = {DEVICE}, dev5[] = {5}, twice[] = {0, 0};
	static const size_t one[] = {16}, two[] = {16, 16}, empty[] = {0}, big[] = {DFCCL_PEER_BLOB_MAX + 1};
	send_peers(fx, COMM_ID + 1, dev0, one, 1);
	expect_ack(fx, COMM_ID + 1, EC(NOT_FOUND), "communicator 8 is unknown to this worker");
	/* Devices that are not another one of the communicator's. */
	send_peers(fx, COMM_ID, dev5, one, 1);
	expect_ack(fx, COMM_ID, EC(INVALID_ARGUMENT), "device 5 is not another device of communicator 7");
	send_peers(fx, COMM_ID, dev1, one, 1);
	expect_ack(fx, COMM_ID, EC(INVALID_ARGUMENT), "device 1 is not another device of communicator 7");
	send_peers(fx, COMM_ID, twice, two, 2);
	expect_ack(fx, COMM_ID, EC(INVALID_ARGUMENT), "list device 0 twice");
	/* Blobs of no bytes, or too many. */
	send_peers(fx, COMM_ID, dev0, empty, 1);
	expect_ack(fx, COMM_ID, EC(INVALID_ARGUMENT), "the blob of device 0 has 0 bytes, outside 1..256");
	send_peers(fx, COMM_ID, dev0, big, 1);
	expect_ack(fx, COMM_ID, EC(INVALID_ARGUMENT), "the blob of device 0 has 257 bytes, outside 1..256");
}

static void test_peers_taken(void **state)
{
	struct fixture *fx = *state;
	add_comm(fx);
	expect_ack(fx, COMM_ID, EC(NONE), "");
	/* The other device's blob, of the largest size; then none at all
	 * (only this worker's engine exported one). */
	static const uint32_t dev0[] = {0};
	static const size_t max[] = {DFCCL_PEER_BLOB_MAX};
	send_peers(fx, COMM_ID, dev0, max, 1);
	expect_ack(fx, COMM_ID, EC(NONE), "");
	send_peers(fx, COMM_ID, NULL, NULL, 0);
	expect_ack(fx, COMM_ID, EC(NONE), "");
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_peers_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_peers_taken, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
