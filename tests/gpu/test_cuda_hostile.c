/*
 * test_cuda_hostile: a hostile client against dfccld's CUDA engine. It
 * writes raw submission entries into its own queue pair, bypassing every
 * check libdfccl makes, and verifies that the daemon rejects each one with
 * its DFCCL_CQ_* status without touching memory: a registration must bound
 * what the engine may read and write, whatever the entry says.
 *
 * Set-up, in one process: communicators of two ranks, joined from two
 * threads (a process may hold several ranks), whose entries this process
 * writes for both ranks through libdfccl's internal queue-pair interface
 * (qp.h), so a wrongly accepted entry finds its partner and really runs.
 * Each collective gets a communicator of its own: the daemon fails a whole
 * communicator when it refuses a member's entry (its peers would otherwise
 * wait for the refused part forever), and a wrongly accepted pair must find
 * a healthy one to run on, writing where the canaries are. A
 * device allocation of 3 x SPAN bytes registered by hand (its legacy CUDA
 * IPC handle) with only its middle SPAN bytes as the range: the SPAN bytes
 * on each side are canaries inside the same allocation, so an engine that
 * ignored the range would write into memory this test can read. A second
 * session registers a buffer of its own, and a dfcclMemAlloc buffer is
 * allocated and freed again, so entries can name another session's and a
 * dead registration.
 *
 * Then: a well-formed all-reduce of both ranks (it must work, or the rest
 * proves nothing); every hostile entry, from both ranks (garbage opcodes,
 * data types and reductions; unknown, foreign and dead registrations;
 * offsets and counts beyond the range, near 2^64, and whose byte size
 * wraps; all-gather and reduce-scatter sizes that only overflow once scaled
 * by the rank count; an unknown communicator, a rank outside it, unknown
 * flags, a root outside it; well-formed all-reduces on which the two
 * ranks disagree: count, data type, reduction; device completion words
 * unnamed, misaligned, unknown, foreign or past their registration), each
 * of which must complete
 * with its status within a few seconds; registrations that reach past the allocation, which
 * must be refused (a cudaMalloc allocation's legacy IPC handle, and a VMM
 * allocation's descriptor, whose worker bounds the range by what the driver
 * lets it map); a second well-formed all-reduce (the daemon still
 * serves). Finally every byte of both sessions' allocations must hold what
 * the test wrote or what the two all-reduces computed, and the device's
 * error counter must have grown by exactly the number of hostile entries.
 *
 * --host-buffers does the same with sealed memfds (MEM_HOST_MEMFD) and no
 * CUDA, which checks this program against the host engine.
 *
 * Exit status: 0 every check passed, 1 a failure, 2 usage, 77 no usable GPU.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "comm.h"
#include "cudrv.h"
#include "dfccl.h"
#include "dfccl_queue.h"
#include "mem.h"
#include "qp.h"

#define PROG "test_cuda_hostile"
#define EXIT_SKIP 77

/* Bytes of the registered range; as many canary bytes lie on each side. */
#define SPAN 65536u
#define CANARY_BYTE 0xa5
/* Floats of the well-formed all-reduces. */
#define CONTROL_COUNT 1024u
/* How long an entry may take to complete. */
#define COMPLETION_TIMEOUT_S 5.0
/* Each collective is submitted for both ranks. */
#define NRANKS 2
/* Communicators: one per hostile case, and the two well-formed all-reduces'. */
#define MAX_PAIRS 40
#define NO_STATUS DFCCL_CQ_STATUS_COUNT_

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, PROG ": FAIL: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	failures++;
}

#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)
static bool cuda_ok(cudaError_t e, const char *what, int line)
{
	if (e != cudaSuccess)
		fail("line %d: %s: %s", line, what, cudaGetErrorString(e));
	return e == cudaSuccess;
}

#define DFCCL_OK(call) dfccl_ok((call), #call, __LINE__)
static bool dfccl_ok(dfcclResult_t r, const char *what, int line)
{
	if (r != dfcclSuccess)
		fail("line %d: %s: %s: %s", line, what, dfcclGetErrorString(r), dfcclGetLastError(NULL));
	return r == dfcclSuccess;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- buffers registered by hand */

/*
 * 3 x SPAN bytes of device memory (or of a sealed memfd), of which
 * [SPAN, 2 * SPAN) is registered; `image` is what every byte must hold.
 */
struct target {
	bool device;
	char *base;
	int memfd;
	unsigned char *image;
	uint32_t reg_id;
};

static int target_open(struct target *t, bool device)
{
	memset(t, 0, sizeof(*t));
	t->device = device;
	t->memfd = -1;
	t->image = malloc(3 * SPAN);
	if (!t->image)
		return -1;
	memset(t->image, CANARY_BYTE, 3 * SPAN);
	for (unsigned i = 0; i < SPAN; i++)
		t->image[SPAN + i] = (unsigned char)(i * 7 + 1);
	if (device)
		return CUDA_OK(cudaMalloc((void **)&t->base, 3 * SPAN)) ? 0 : -1;
	/* Sealed against shrinking, as the daemon requires of host memory. */
	t->memfd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (t->memfd < 0 || ftruncate(t->memfd, 3 * SPAN) < 0 || fcntl(t->memfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		return -1;
	t->base = mmap(NULL, 3 * SPAN, PROT_READ | PROT_WRITE, MAP_SHARED, t->memfd, 0);
	return t->base == MAP_FAILED ? (t->base = NULL, -1) : 0;
}

static void target_close(struct target *t)
{
	if (t->base && t->device)
		CUDA_OK(cudaFree(t->base));
	else if (t->base)
		munmap(t->base, 3 * SPAN);
	if (t->memfd >= 0)
		close(t->memfd);
	free(t->image);
	memset(t, 0, sizeof(*t));
}

/* Copies between the target's memory and host memory. */
static int target_copy(const struct target *t, void *dst, const void *src, size_t n, bool to_target)
{
	if (!t->device) {
		memcpy(dst, src, n);
		return 0;
	}
	return CUDA_OK(cudaMemcpy(dst, src, n, to_target ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost)) ? 0 : -1;
}

/* Writes the image into the target's memory. */
static int target_upload(const struct target *t)
{
	return target_copy(t, t->base, t->image, 3 * SPAN, true);
}

/* Registers [offset, offset + size) of the target with session c. */
static dfcclResult_t target_register(const struct target *t, struct client *c, int device, uint64_t offset,
                                     uint64_t size, uint32_t *reg_id)
{
	Dfccl__V1__RegisterMem reg = DFCCL__V1__REGISTER_MEM__INIT;
	cudaIpcMemHandle_t h;
	reg.device = (uint32_t)device;
	reg.size = size;
	reg.offset = offset;
	if (t->device) {
		if (!CUDA_OK(cudaIpcGetMemHandle(&h, t->base)))
			return dfcclUnhandledCudaError;
		reg.kind = DFCCL__V1__MEM_KIND__MEM_CUDA_IPC;
		reg.ipc_handle.data = (uint8_t *)&h;
		reg.ipc_handle.len = sizeof(h);
	} else {
		reg.kind = DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD;
	}
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	req.register_mem = &reg;
	struct client_reply rep = CLIENT_REPLY_INIT;
	dfcclResult_t r = client_request(c, &req, t->device ? NULL : &t->memfd, t->device ? 0 : 1,
	                                 DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY, &rep);
	if (r == dfcclSuccess)
		*reg_id = rep.env->register_reply->reg_id;
	client_reply_release(&rep);
	return r;
}

/* The id of a registration that existed and is gone: a dfcclMemAlloc
 * buffer's (on the calling thread's device), freed again. */
static int dead_registration(struct client *c, uint32_t *reg_id)
{
	void *p;
	struct mem_ref ref = {0};
	if (!DFCCL_OK(dfcclMemAlloc(&p, 4096)))
		return -1;
	bool ok = DFCCL_OK(mem_translate(c, p, 4096, &ref));
	ok = DFCCL_OK(dfcclMemFree(p)) && ok;
	*reg_id = ref.reg_id;
	return ok ? 0 : -1;
}

/* Reads the target back and compares every byte with its image. */
static void target_verify(const struct target *t, const char *name)
{
	unsigned char *now = malloc(3 * SPAN);
	if (!now || target_copy(t, now, t->base, 3 * SPAN, false) < 0) {
		fail("cannot read %s back", name);
		free(now);
		return;
	}
	size_t i = 0;
	while (i < 3 * SPAN && now[i] == t->image[i])
		i++;
	if (i < 3 * SPAN)
		fail("%s: byte %ld from the start of the registered range is 0x%02x, expected 0x%02x (%s)", name,
		     (long)i - (long)SPAN, now[i], t->image[i],
		     i < SPAN || i >= 2 * SPAN ? "a canary outside the range" : "inside the range");
	free(now);
}

/* ---------------------------------------------------------------- entries */

/* What the entries are built from. */
struct env {
	struct qp *qp;
	uint64_t comm_id;            /* the communicator of the next collective */
	uint32_t reg, foreign, dead; /* this session's, another session's, a deregistered one */
};

/* Where rank r's send and receive buffers of the well-formed all-reduce lie
 * in the registered range. */
static uint64_t send_off(int rank)
{
	return rank ? SPAN / 4 : 0;
}

static uint64_t recv_off(int rank)
{
	return rank ? 3 * SPAN / 4 : SPAN / 2;
}

/* A well-formed all-reduce of CONTROL_COUNT floats by `rank`. */
static struct dfccl_sqe entry_base(const struct env *v, int rank)
{
	struct dfccl_sqe e;
	memset(&e, 0, sizeof(e));
	e.comm_id = v->comm_id;
	e.comm_seq = 1; /* every communicator runs one collective */
	e.rank = (uint32_t)rank;
	e.opcode = DFCCL_OP_ALLREDUCE;
	e.dtype = dfcclFloat32;
	e.redop = dfcclSum;
	e.count = CONTROL_COUNT;
	e.send_reg = e.recv_reg = v->reg;
	e.send_off = send_off(rank);
	e.recv_off = recv_off(rank);
	return e;
}

/*
 * Makes rank `rank`'s well-formed entry hostile case `which`; returns what
 * it is, with the status it must complete with in *want (and a second
 * acceptable one in *also, or NO_STATUS), or NULL past the last case. The
 * last cases are well-formed entries on which the ranks disagree (rank 1's
 * differs): both must fail with DFCCL_CQ_MISMATCH, and nothing may be
 * stored. Their all-reduces are small enough to go as lines, which the
 * daemon kernel sends and takes in one piece where it can
 * (ll_run_starts): a take must not reduce lines whose last one says
 * another collective.
 */
static const char *hostile_shape(int which, int rank, const struct env *v, struct dfccl_sqe *e, uint32_t *want,
                                 uint32_t *also)
{
	*also = NO_STATUS;
	*want = DFCCL_CQ_OUT_OF_RANGE;
	if (which >= 24 && which <= 27)
		*want = DFCCL_CQ_MISMATCH;
	switch (which) {
	case 0: *want = DFCCL_CQ_BAD_OPCODE; e->opcode = 200; return "opcode 200";
	case 1: *want = DFCCL_CQ_BAD_OPCODE; e->opcode = DFCCL_OP_COUNT_; return "the first opcode past the last";
	case 2: *want = DFCCL_CQ_BAD_DTYPE; e->dtype = 77; return "data type 77";
	case 3: *want = DFCCL_CQ_BAD_DTYPE; e->dtype = dfcclNumTypes; return "the first data type past the last";
	case 4: *want = DFCCL_CQ_BAD_REDOP; e->redop = 9; return "reduction 9";
	case 5: *want = DFCCL_CQ_BAD_REDOP; e->redop = dfcclNumOps; return "the first reduction past the last";
	case 6: *want = DFCCL_CQ_BAD_REG; e->send_reg = e->recv_reg = 0xfffffff0u; return "a registration id never given";
	case 7: *want = DFCCL_CQ_BAD_REG; e->recv_reg = v->foreign; return "another session's registration to receive into";
	case 8: *want = DFCCL_CQ_BAD_REG; e->send_reg = v->foreign; return "another session's registration to send from";
	case 9: *want = DFCCL_CQ_BAD_REG; e->send_reg = e->recv_reg = v->dead; return "a deregistered registration";
	case 10: e->count = SPAN / 4 + 1; e->send_off = e->recv_off = 0; return "one float more than the range holds";
	case 11: e->recv_off = SPAN - 4 * e->count + 4; return "a receive buffer ending 4 bytes past the range";
	case 12: e->recv_off = SPAN; e->count = 1; return "a receive buffer at the end of the range";
	case 13: e->send_off = UINT64_MAX - 8; return "a send offset near 2^64";
	case 14: e->recv_off = UINT64_MAX - 3; return "a receive offset whose end wraps around 2^64";
	case 15: e->count = UINT64_MAX / 2; return "a count whose byte size overflows";
	case 16: e->count = UINT64_MAX / 4 + 2; return "a count whose byte size wraps around to 4";
	case 17:
		e->opcode = DFCCL_OP_ALLGATHER;
		e->count = SPAN / 8 + 1;
		e->send_off = e->recv_off = 0;
		return "an all-gather whose output, count x nranks, overflows the range";
	case 18:
		e->opcode = DFCCL_OP_ALLGATHER;
		e->count = UINT64_C(1) << 61;
		return "an all-gather whose output size wraps around to 0";
	case 19:
		e->opcode = DFCCL_OP_REDUCESCATTER;
		e->count = SPAN / 8 + 1;
		e->send_off = e->recv_off = 0;
		return "a reduce-scatter whose input, count x nranks, overflows the range";
	case 20: *want = DFCCL_CQ_BAD_COMM; e->comm_id = 0xdeadbeefu; return "an unknown communicator";
	case 21:
		*want = DFCCL_CQ_BAD_COMM;
		*also = DFCCL_CQ_BAD_ENTRY;
		e->rank = 5;
		return "a rank outside the communicator";
	case 22: *want = DFCCL_CQ_BAD_ENTRY; e->flags = 0x8000; return "an unknown flag";
	case 23:
		*want = DFCCL_CQ_BAD_ENTRY;
		*also = DFCCL_CQ_BAD_COMM;
		e->opcode = DFCCL_OP_BROADCAST;
		e->peer = 7;
		return "a broadcast root outside the communicator";
	case 24:
		if (rank == 1)
			e->count = CONTROL_COUNT + 8;
		return "all-reduces of different counts (rank 1's longer)";
	case 25:
		if (rank == 1)
			e->count = CONTROL_COUNT - 8;
		return "all-reduces of different counts (rank 1's shorter)";
	case 26:
		if (rank == 1)
			e->dtype = dfcclInt32;
		return "all-reduces of different data types of the same size";
	case 27:
		if (rank == 1)
			e->redop = dfcclMax;
		return "all-reduces of different reductions";
	/* A device completion word (DFCCL_SQE_F_DEVICE_DONE) the kernel must
	 * not store: none named, not one aligned word, not this session's
	 * memory, or past its registration. */
	case 28:
		*want = DFCCL_CQ_BAD_ENTRY;
		e->flags |= DFCCL_SQE_F_DEVICE_DONE;
		return "a device completion word without a registration";
	case 29:
		*want = DFCCL_CQ_BAD_ENTRY;
		e->flags |= DFCCL_SQE_F_DEVICE_DONE;
		e->done_reg = v->reg;
		e->done_off = 4;
		return "a device completion word not 8-byte aligned";
	case 30:
		*want = DFCCL_CQ_BAD_REG;
		e->flags |= DFCCL_SQE_F_DEVICE_DONE;
		e->done_reg = 0xfffffff0u;
		return "a device completion word in a registration never given";
	case 31:
		*want = DFCCL_CQ_BAD_REG;
		e->flags |= DFCCL_SQE_F_DEVICE_DONE;
		e->done_reg = v->foreign;
		return "a device completion word in another session's registration";
	case 32:
		e->flags |= DFCCL_SQE_F_DEVICE_DONE;
		e->done_reg = v->reg;
		e->done_off = SPAN;
		return "a device completion word at the end of its registration";
	default: return NULL;
	}
}

/* Waits for ticket t up to the timeout; its status, or NO_STATUS. */
static uint32_t ticket_wait(struct qp *q, struct qp_ticket *t, double deadline)
{
	while (!qp_test(q, t)) {
		if (now_s() > deadline) {
			qp_abandon(q, t);
			return NO_STATUS;
		}
		qp_heartbeat(q);
		usleep(200);
	}
	return t->status;
}

/* ---------------------------------------------------------------- the test */

struct joiner {
	int device;
	dfcclUniqueId id;
	dfcclComm_t comm;
	dfcclResult_t result;
};

/* Rank 1 joins on a thread of its own: the join waits for every rank. */
static void *join_rank1(void *arg)
{
	struct joiner *j = arg;
	j->result = dfcclSetDevice(j->device);
	if (j->result == dfcclSuccess)
		j->result = dfcclCommInitRank(&j->comm, NRANKS, j->id, 1);
	return NULL;
}

static int join_pair(int device, dfcclComm_t comms[NRANKS])
{
	struct joiner j = {.device = device};
	pthread_t th;
	if (!DFCCL_OK(dfcclGetUniqueId(&j.id)) || pthread_create(&th, NULL, join_rank1, &j) != 0)
		return -1;
	bool ok = DFCCL_OK(dfcclCommInitRank(&comms[0], NRANKS, j.id, 0));
	pthread_join(th, NULL);
	comms[1] = j.comm;
	return ok && DFCCL_OK(j.result) ? 0 : -1;
}

/* Everything the test holds; released by teardown in reverse order. */
struct hostile_test {
	int device;
	bool use_device;
	dfcclComm_t pairs[MAX_PAIRS][NRANKS];
	int npairs;
	struct client *client, *other; /* the process's session (the communicators'), another one */
	struct target mine, theirs;
	struct env env;
};

/* Joins a communicator of its own for the next collective. */
static int next_pair(struct hostile_test *h)
{
	if (h->npairs == MAX_PAIRS || join_pair(h->device, h->pairs[h->npairs]) < 0) {
		fail("cannot join communicator %d", h->npairs);
		return -1;
	}
	h->env.comm_id = h->pairs[h->npairs++][0]->id;
	return 0;
}

/* The well-formed all-reduce of both ranks; true if both completed OK.
 * Their results then stand in the image. */
static bool run_control(struct hostile_test *h)
{
	const struct env *v = &h->env;
	struct target *t = &h->mine;
	struct qp_ticket tk[NRANKS];
	if (next_pair(h) < 0)
		return false;
	bool ok = true;
	for (int r = 0; r < NRANKS; r++) {
		struct dfccl_sqe e = entry_base(v, r);
		if (!DFCCL_OK(qp_submit(v->qp, &e, &tk[r])))
			return false;
	}
	double deadline = now_s() + COMPLETION_TIMEOUT_S;
	for (int r = 0; r < NRANKS; r++) {
		uint32_t st = ticket_wait(v->qp, &tk[r], deadline);
		if (st != DFCCL_CQ_OK) {
			fail("a well-formed all-reduce of rank %d completed with status %u%s", r, st,
			     st == NO_STATUS ? " (no completion within the timeout)" : "");
			ok = false;
		}
	}
	/* Both ranks receive the sum of both ranks' sends. */
	for (unsigned i = 0; i < CONTROL_COUNT; i++) {
		float a, b;
		memcpy(&a, t->image + SPAN + send_off(0) + 4 * i, 4);
		memcpy(&b, t->image + SPAN + send_off(1) + 4 * i, 4);
		a += b;
		for (int r = 0; r < NRANKS; r++)
			memcpy(t->image + SPAN + recv_off(r) + 4 * i, &a, 4);
	}
	return ok;
}

/* Submits every hostile case for both ranks, then checks each completion;
 * returns the number of entries submitted. */
static unsigned run_hostile(struct hostile_test *h)
{
	enum { MAX_ENTRIES = 80 };
	const struct env *v = &h->env;
	struct qp_ticket tk[MAX_ENTRIES];
	const char *what[MAX_ENTRIES];
	uint32_t want[MAX_ENTRIES], also[MAX_ENTRIES];
	unsigned n = 0;
	for (int which = 0; n + NRANKS <= MAX_ENTRIES; which++) {
		struct dfccl_sqe e[NRANKS];
		if (next_pair(h) < 0)
			break;
		for (int r = 0; r < NRANKS; r++) {
			e[r] = entry_base(v, r);
			what[n + (unsigned)r] =
			    hostile_shape(which, r, v, &e[r], &want[n + (unsigned)r], &also[n + (unsigned)r]);
		}
		if (!what[n])
			break;
		for (int r = 0; r < NRANKS; r++, n++)
			if (!DFCCL_OK(qp_submit(v->qp, &e[r], &tk[n])))
				return n;
	}
	double deadline = now_s() + COMPLETION_TIMEOUT_S;
	for (unsigned i = 0; i < n; i++) {
		uint32_t st = ticket_wait(v->qp, &tk[i], deadline);
		if (st == want[i] || st == also[i])
			continue;
		if (st == NO_STATUS)
			fail("%s (rank %u): no completion within %.0f s; expected status %u", what[i], i % NRANKS,
			     COMPLETION_TIMEOUT_S, want[i]);
		else
			fail("%s (rank %u): completed with status %u, expected %u", what[i], i % NRANKS, st, want[i]);
	}
	printf(PROG ": %u hostile entries (%u cases x %d ranks) submitted\n", n, n / NRANKS, NRANKS);
	return n;
}

/* Registrations reaching past the allocation must be refused. */
static void check_bad_registrations(const struct target *t, struct client *c, int device)
{
	static const struct {
		uint64_t offset, size;
		const char *what;
	} bad[] = {
	    {2 * SPAN, 2 * SPAN, "a range reaching SPAN bytes past the allocation"},
	    {3 * SPAN, 1, "a range starting at the end of the allocation"},
	    {UINT64_MAX - 100, 4096, "a range whose end wraps around 2^64"},
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint32_t reg = 0;
		if (target_register(t, c, device, bad[i].offset, bad[i].size, &reg) == dfcclSuccess)
			fail("registering %s was accepted (registration %u)", bad[i].what, reg);
	}
}

/* Registers [offset, offset + size) of the VMM allocation behind fd with
 * session c. */
static dfcclResult_t vmm_register(struct client *c, int device, int fd, uint64_t offset, uint64_t size,
                                  uint32_t *reg_id)
{
	Dfccl__V1__RegisterMem reg = DFCCL__V1__REGISTER_MEM__INIT;
	reg.kind = DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD;
	reg.device = (uint32_t)device;
	reg.size = size;
	reg.offset = offset;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	req.register_mem = &reg;
	struct client_reply rep = CLIENT_REPLY_INIT;
	dfcclResult_t r = client_request(c, &req, &fd, 1, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY, &rep);
	if (r == dfcclSuccess)
		*reg_id = rep.env->register_reply->reg_id;
	client_reply_release(&rep);
	return r;
}

/* The same with a VMM allocation exported as a descriptor: the whole of
 * it is accepted (and dropped again), a range past its end is not. */
static void check_bad_vmm_registrations(struct client *c, int device)
{
	int fd = -1;
	unsigned long long handle = 0;
	uint64_t size = 0;
	uint32_t reg = 0;
	if (cudrv_vmm_create(device, 1, &fd, &handle, &size) < 0) {
		fail("cannot make a VMM allocation exportable as a file descriptor: %s", cudrv_last_error());
		return;
	}
	if (DFCCL_OK(vmm_register(c, device, fd, 0, size, &reg)))
		DFCCL_OK(mem_deregister(c, reg));
	else
		fail("registering the whole of a %" PRIu64 "-byte VMM allocation was refused", size);
	const struct {
		uint64_t offset, size;
		const char *what;
	} bad[] = {
	    {0, size + 1, "a range one byte longer than the VMM allocation"},
	    {size, 1, "a range starting at the end of the VMM allocation"},
	    {size - 4096, 8192, "a range crossing the end of the VMM allocation"},
	    {UINT64_MAX - 100, 4096, "a VMM range whose end wraps around 2^64"},
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (vmm_register(c, device, fd, bad[i].offset, bad[i].size, &reg) == dfcclSuccess)
			fail("registering %s was accepted (registration %u)", bad[i].what, reg);
	close(fd);
	cudrv_vmm_release(handle);
}

/* Entries the device's engine completed with an error status so far. */
static int device_errors(struct client *c, int device, uint64_t *errors)
{
	struct client_reply rep = CLIENT_REPLY_INIT;
	if (!DFCCL_OK(client_query(c, DFCCL__V1__QUERY_KIND__QUERY_STATS, &rep)))
		return -1;
	int rc = -1;
	for (size_t i = 0; i < rep.env->query_reply->n_stats; i++)
		if (rep.env->query_reply->stats[i]->device == (uint32_t)device) {
			*errors = rep.env->query_reply->stats[i]->errors;
			rc = 0;
		}
	client_reply_release(&rep);
	return rc;
}

static int setup(struct hostile_test *h)
{
	/* The session and queue pair every communicator of this process uses. */
	if (!DFCCL_OK(client_default(&h->client)) || !DFCCL_OK(client_attach(h->client, (uint32_t)h->device, &h->env.qp)))
		return -1;
	if (target_open(&h->mine, h->use_device) < 0 || target_open(&h->theirs, h->use_device) < 0 ||
	    target_upload(&h->mine) < 0 || target_upload(&h->theirs) < 0) {
		fail("cannot set up the test's buffers");
		return -1;
	}
	if (!DFCCL_OK(target_register(&h->mine, h->client, h->device, SPAN, SPAN, &h->env.reg)) ||
	    dead_registration(h->client, &h->env.dead) < 0)
		return -1;
	/* Another session: another client as far as the daemon can tell. */
	if (!DFCCL_OK(client_open(client_socket_path(), PROG "-other", &h->other)) ||
	    !DFCCL_OK(target_register(&h->theirs, h->other, h->device, SPAN, SPAN, &h->env.foreign)))
		return -1;
	return 0;
}

static void teardown(struct hostile_test *h)
{
	for (int p = 0; p < h->npairs; p++)
		for (int r = 0; r < NRANKS; r++)
			if (h->pairs[p][r])
				DFCCL_OK(dfcclCommDestroy(h->pairs[p][r]));
	if (h->other)
		client_unref(h->other);
	if (h->client)
		client_unref(h->client);
	target_close(&h->theirs);
	target_close(&h->mine);
}

static int run(struct hostile_test *h)
{
	uint64_t errors_before = 0, errors_after = 0;
	if (setup(h) < 0)
		return -1;
	struct client *c = h->client;
	if (device_errors(c, h->device, &errors_before) < 0)
		return -1;
	if (!run_control(h)) {
		fail("a well-formed all-reduce failed: the hostile entries would prove nothing");
		return -1;
	}
	unsigned submitted = run_hostile(h);
	check_bad_registrations(&h->mine, c, h->device);
	if (h->use_device)
		check_bad_vmm_registrations(c, h->device);
	if (!run_control(h))
		fail("the daemon no longer serves well-formed entries after the hostile ones");
	if (!DFCCL_OK(client_nop(c, (uint32_t)h->device)))
		fail("a NOP round trip failed after the hostile entries");
	target_verify(&h->mine, "this session's buffer");
	target_verify(&h->theirs, "the other session's buffer");
	if (device_errors(c, h->device, &errors_after) < 0)
		return -1;
	printf(PROG ": device %d counted %" PRIu64 " error completions\n", h->device, errors_after - errors_before);
	if (errors_after - errors_before != submitted)
		fail("device %d counted %" PRIu64 " error completions for %u hostile entries", h->device,
		     errors_after - errors_before, submitted);
	return 0;
}

static const char usage[] =
    "Usage: " PROG " [--socket PATH] [--gpu N] [--host-buffers]\n"
    "Submits hostile raw entries to the dfccld at $DFCCL_SOCKET and checks that\n"
    "each is rejected with its status and that no byte outside what two\n"
    "well-formed all-reduces write changes.\n"
    "\n"
    "      --socket PATH   the daemon's socket (default $DFCCL_SOCKET)\n"
    "      --gpu N         the device to use (default 0)\n"
    "      --host-buffers  sealed memfds instead of GPU memory, no CUDA (checks this\n"
    "                      program against the host engine)\n"
    "  -h, --help          this text\n"
    "\n"
    "Exit status: 0 every check passed, 1 a failure, 2 usage, 77 no usable GPU.\n";

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"socket", required_argument, NULL, 'S'}, {"gpu", required_argument, NULL, 'g'},
	    {"host-buffers", no_argument, NULL, 'H'}, {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct hostile_test h = {.use_device = true};
	int opt, ngpu = 0;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'S': setenv("DFCCL_SOCKET", optarg, 1); break;
		case 'g': h.device = atoi(optarg); break;
		case 'H': h.use_device = false; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind < argc || h.device < 0) {
		fputs(usage, stderr);
		return 2;
	}
	if (h.use_device) {
		if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu <= h.device) {
			printf("SKIPPED: no usable GPU %d (" PROG " runs on GPU machines)\n", h.device);
			return EXIT_SKIP;
		}
		if (!CUDA_OK(cudaSetDevice(h.device)))
			return 1;
	}
	if (!DFCCL_OK(dfcclSetDevice(h.device)))
		return 1;
	int rc = run(&h);
	teardown(&h);
	if (rc < 0 || failures) {
		printf("FAILED: %d check(s) failed\n", failures);
		return 1;
	}
	printf("OK: every hostile entry was rejected with its status, and no byte outside the results changed\n");
	return 0;
}
