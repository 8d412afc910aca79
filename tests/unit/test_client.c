/*
 * Unit tests of libdfccl's logic that needs no daemon: result strings and
 * the mapping of daemon error codes, the unique-id layout, the allocation
 * table and buffer translation, group nesting, argument checks that fail
 * before any connection, the queue-pair submission protocol against an
 * engine emulated by a thread of this test, and what a communicator's
 * collectives report when a daemon emulated by another thread goes away.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "client.h"
#include "coll.h"
#include "comm.h"
#include "dfccl.h"
#include "errors.h"
#include "mem.h"
#include "qp.h"
#include "queue.h"
#include "req.h"
#include "uniqueid.h"

/* ---------------------------------------------------------------- results */

static void test_error_strings(void **state)
{
	for (int i = 0; i < dfcclNumResults; i++) {
		const char *s = dfcclGetErrorString((dfcclResult_t)i);
		assert_non_null(s);
		assert_string_not_equal(s, "unknown result code");
		for (int k = 0; k < i; k++)
			assert_string_not_equal(s, dfcclGetErrorString((dfcclResult_t)k));
	}
	assert_string_equal(dfcclGetErrorString(dfcclNumResults), "unknown result code");
	assert_string_equal(dfcclGetErrorString((dfcclResult_t)-1), "unknown result code");
}

static void test_error_codes(void **state)
{
	static const struct {
		uint32_t code;
		dfcclResult_t result;
	} map[] = {
	    {DFCCL__V1__ERROR_CODE__ERROR_NONE, dfcclSuccess},
	    {DFCCL__V1__ERROR_CODE__ERROR_INTERNAL, dfcclInternalError},
	    {DFCCL__V1__ERROR_CODE__ERROR_INVALID_ARGUMENT, dfcclInvalidArgument},
	    {DFCCL__V1__ERROR_CODE__ERROR_INVALID_USAGE, dfcclInvalidUsage},
	    {DFCCL__V1__ERROR_CODE__ERROR_VERSION_MISMATCH, dfcclVersionMismatch},
	    {DFCCL__V1__ERROR_CODE__ERROR_PERMISSION, dfcclPermissionDenied},
	    {DFCCL__V1__ERROR_CODE__ERROR_NOT_FOUND, dfcclInvalidArgument},
	    {DFCCL__V1__ERROR_CODE__ERROR_TIMEOUT, dfcclTimeout},
	    {DFCCL__V1__ERROR_CODE__ERROR_PEER_LOST, dfcclRemoteError},
	    {DFCCL__V1__ERROR_CODE__ERROR_ABORTED, dfcclAborted},
	    {DFCCL__V1__ERROR_CODE__ERROR_DEVICE_LOST, dfcclDeviceLost},
	    {DFCCL__V1__ERROR_CODE__ERROR_SHUTTING_DOWN, dfcclDaemonUnavailable},
	    {DFCCL__V1__ERROR_CODE__ERROR_RESOURCE, dfcclSystemError},
	    {DFCCL__V1__ERROR_CODE__ERROR_NOT_SUPPORTED, dfcclNotSupported},
	    {1000, dfcclInternalError}, /* a code from a newer daemon */
	};
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		assert_int_equal(errors_from_code(map[i].code), map[i].result);
}

static void *other_thread_last_error(void *arg)
{
	*(int *)arg = dfcclGetLastError(NULL)[0] == 0;
	return NULL;
}

static void test_last_error(void **state)
{
	assert_int_equal(errors_set(dfcclTimeout, "ranks %d and %d never came", 2, 3), dfcclTimeout);
	assert_string_equal(dfcclGetLastError(NULL), "ranks 2 and 3 never came");
	assert_string_equal(errors_last(), "ranks 2 and 3 never came");

	/* The sentence belongs to the thread that failed. */
	pthread_t t;
	int empty = 0;
	assert_int_equal(pthread_create(&t, NULL, other_thread_last_error, &empty), 0);
	pthread_join(t, NULL);
	assert_true(empty);

	int version = 0;
	assert_int_equal(dfcclGetVersion(&version), dfcclSuccess);
	assert_int_equal(version, DFCCL_VERSION_CODE);
	assert_int_equal(dfcclGetVersion(NULL), dfcclInvalidArgument);
}

/* ---------------------------------------------------------------- unique ids */

static void test_unique_id_format(void **state)
{
	dfcclUniqueId a, b;
	assert_int_equal(dfcclGetUniqueId(&a), dfcclSuccess);
	assert_int_equal(dfcclGetUniqueId(&b), dfcclSuccess);

	const struct uniqueid_layout *l = (const void *)a.internal;
	assert_memory_equal(l->tag, "DFC\x01", 4);
	assert_memory_equal(l->flags, "\0\0\0\0", 4);
	static const uint8_t zero[64] = {0};
	assert_memory_equal(&l->bootstrap_family, zero, 24); /* node-local: no bootstrap address */
	assert_memory_equal(l->reserved, zero, sizeof(l->reserved));
	assert_memory_not_equal(l->random, zero, UNIQUEID_RANDOM_BYTES);

	/* Two draws share the tag and nothing of the random part. */
	assert_memory_not_equal(a.internal + 8, b.internal + 8, UNIQUEID_RANDOM_BYTES);
	assert_memory_equal(a.internal + 40, b.internal + 40, DFCCL_UNIQUE_ID_BYTES - 40);

	assert_int_equal(uniqueid_check(&a), 0);
	a.internal[3] = 2; /* another layout version */
	assert_int_equal(uniqueid_check(&a), -EINVAL);
	memset(&b, 0, sizeof(b));
	assert_int_equal(uniqueid_check(&b), -EINVAL);
	assert_int_equal(dfcclGetUniqueId(NULL), dfcclInvalidArgument);
}

static void test_unique_ids_differ(void **state)
{
	enum { N = 256 };
	static dfcclUniqueId ids[N];
	for (int i = 0; i < N; i++)
		assert_int_equal(dfcclGetUniqueId(&ids[i]), dfcclSuccess);
	for (int i = 0; i < N; i++)
		for (int k = 0; k < i; k++)
			assert_memory_not_equal(ids[i].internal, ids[k].internal, DFCCL_UNIQUE_ID_BYTES);
}

/* ---------------------------------------------------------------- allocations */

static struct mem_alloc fake_alloc(uint64_t id, uintptr_t base, size_t size, uint32_t reg_id)
{
	return (struct mem_alloc){.id = id, .base = base, .size = size, .map_size = size, .reg_id = reg_id,
	                          .memfd = -1, .device = 0, .client = NULL};
}

static void test_mem_table(void **state)
{
	struct mem_table t = MEM_TABLE_INIT;
	struct mem_alloc a = fake_alloc(1, 0x10000, 0x1000, 7);
	struct mem_alloc b = fake_alloc(2, 0x30000, 0x2000, 8);
	struct mem_alloc c = fake_alloc(3, 0x11000, 0x1000, 9); /* adjacent to a */
	struct mem_alloc overlap = fake_alloc(4, 0x30fff, 0x10, 10);
	struct mem_alloc under = fake_alloc(5, 0x2ffff, 0x2, 11);

	assert_int_equal(mem_table_insert(&t, &b), 0);
	assert_int_equal(mem_table_insert(&t, &a), 0);
	assert_int_equal(mem_table_insert(&t, &c), 0);
	assert_int_equal(mem_table_insert(&t, &overlap), -EEXIST);
	assert_int_equal(mem_table_insert(&t, &under), -EEXIST);
	assert_int_equal(t.n, 3);

	assert_ptr_equal(mem_table_find(&t, 0x10000), &a);
	assert_ptr_equal(mem_table_find(&t, 0x10fff), &a);
	assert_ptr_equal(mem_table_find(&t, 0x11000), &c);
	assert_ptr_equal(mem_table_find(&t, 0x31fff), &b);
	assert_null(mem_table_find(&t, 0xffff));
	assert_null(mem_table_find(&t, 0x12000));
	assert_null(mem_table_find(&t, 0x32000));

	assert_null(mem_table_take(&t, 0x10008)); /* only the base frees */
	assert_ptr_equal(mem_table_take(&t, 0x11000), &c);
	assert_null(mem_table_take(&t, 0x11000));
	assert_int_equal(t.n, 2);
	assert_null(mem_table_find(&t, 0x11000));
	mem_table_clear(&t);
	assert_int_equal(t.n, 0);
}

static void test_mem_translate_bounds(void **state)
{
	struct mem_table t = MEM_TABLE_INIT;
	struct mem_alloc a = fake_alloc(41, 0x10000, 0x1000, 7);
	struct mem_alloc b = fake_alloc(42, 0x11000, 0x1000, 8); /* right after a */
	struct mem_ref ref;
	assert_int_equal(mem_table_insert(&t, &a), 0);
	assert_int_equal(mem_table_insert(&t, &b), 0);

	assert_int_equal(mem_table_translate(&t, NULL, (void *)0x10000, 0x1000, &ref), dfcclSuccess);
	assert_int_equal(ref.reg_id, 7);
	assert_int_equal(ref.offset, 0);
	assert_int_equal(ref.alloc_id, 41);

	assert_int_equal(mem_table_translate(&t, NULL, (void *)0x10ff0, 0x10, &ref), dfcclSuccess);
	assert_int_equal(ref.offset, 0xff0);

	assert_int_equal(mem_table_translate(&t, NULL, (void *)0x11800, 8, &ref), dfcclSuccess);
	assert_int_equal(ref.reg_id, 8);
	assert_int_equal(ref.offset, 0x800);

	/* One byte past the end, spanning two adjacent allocations, before the
	 * first, and a length that wraps the address space all fail. */
	assert_int_equal(mem_table_translate(&t, NULL, (void *)0x10ff0, 0x11, &ref), dfcclInvalidArgument);
	assert_non_null(strstr(dfcclGetLastError(NULL), "host-engine buffers must come from dfcclMemAlloc"));
	assert_int_equal(mem_table_translate(&t, NULL, (void *)0x10800, 0x1000, &ref), dfcclInvalidArgument);
	assert_int_equal(mem_table_translate(&t, NULL, (void *)0xfff0, 0x20, &ref), dfcclInvalidArgument);
	assert_int_equal(mem_table_translate(&t, NULL, (void *)0x10010, SIZE_MAX, &ref), dfcclInvalidArgument);
	assert_int_equal(mem_table_translate(&t, NULL, (void *)0x12000, 1, &ref), dfcclInvalidArgument);

	/* An allocation of another session (the daemon restarted since). */
	assert_int_equal(mem_table_translate(&t, (struct client *)&a, (void *)0x10000, 8, &ref), dfcclInvalidUsage);
	mem_table_clear(&t);
}

static void test_mem_api_arguments(void **state)
{
	void *p = (void *)1;
	assert_int_equal(dfcclMemAlloc(NULL, 10), dfcclInvalidArgument);
	assert_int_equal(dfcclMemAlloc(&p, 0), dfcclInvalidArgument);
	assert_null(p);
	assert_int_equal(dfcclMemFree(NULL), dfcclSuccess);
	int on_stack;
	assert_int_equal(dfcclMemFree(&on_stack), dfcclInvalidArgument);
}

/* ---------------------------------------------------------------- groups */

static void test_group_nesting(void **state)
{
	assert_int_equal(coll_group_depth(), 0);
	assert_int_equal(dfcclGroupEnd(), dfcclInvalidUsage);
	assert_non_null(strstr(dfcclGetLastError(NULL), "without a matching dfcclGroupStart"));

	assert_int_equal(dfcclGroupStart(), dfcclSuccess);
	assert_int_equal(dfcclGroupStart(), dfcclSuccess);
	assert_int_equal(coll_group_depth(), 2);
	assert_int_equal(dfcclGroupEnd(), dfcclSuccess);
	assert_int_equal(coll_group_depth(), 1);
	assert_int_equal(dfcclGroupEnd(), dfcclSuccess); /* an empty group submits nothing */
	assert_int_equal(coll_group_depth(), 0);
	assert_int_equal(dfcclGroupEnd(), dfcclInvalidUsage);
}

static void test_group_failed_call(void **state)
{
	int buf[4];
	assert_int_equal(dfcclGroupStart(), dfcclSuccess);
	assert_int_equal(dfcclAllReduce(buf, buf, 4, dfcclInt, dfcclSum, NULL, NULL), dfcclInvalidArgument);
	/* The failure is returned again by the outermost GroupEnd, which submits
	 * nothing, and the next group starts clean. */
	assert_int_equal(dfcclGroupEnd(), dfcclInvalidArgument);
	assert_non_null(strstr(dfcclGetLastError(NULL), "none of the group was submitted"));
	assert_int_equal(coll_group_depth(), 0);
	assert_int_equal(dfcclGroupStart(), dfcclSuccess);
	assert_int_equal(dfcclGroupEnd(), dfcclSuccess);
}

static void test_dtype_sizes(void **state)
{
	static const size_t want[dfcclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
	for (int i = 0; i < dfcclNumTypes; i++)
		assert_int_equal(coll_dtype_size(i), want[i]);
	assert_int_equal(coll_dtype_size(dfcclNumTypes), 0);
	assert_int_equal(coll_dtype_size(-1), 0);
}

/* ---------------------------------------------------------------- checks before connecting */

static int setup_no_daemon(void **state)
{
	setenv("DFCCL_SOCKET", "/nonexistent/dfccld.sock", 1);
	return 0;
}

static void test_comm_init_arguments(void **state)
{
	dfcclComm_t comm = (dfcclComm_t)1;
	dfcclUniqueId id, bad;
	assert_int_equal(dfcclGetUniqueId(&id), dfcclSuccess);
	memset(&bad, 0, sizeof(bad));

	assert_int_equal(dfcclCommInitRank(NULL, 2, id, 0), dfcclInvalidArgument);
	assert_int_equal(dfcclCommInitRank(&comm, 0, id, 0), dfcclInvalidArgument);
	assert_null(comm);
	assert_int_equal(dfcclCommInitRank(&comm, 2, id, 2), dfcclInvalidArgument);
	assert_int_equal(dfcclCommInitRank(&comm, 2, id, -1), dfcclInvalidArgument);
	assert_int_equal(dfcclCommInitRank(&comm, 2, bad, 0), dfcclInvalidArgument);
	assert_string_equal(dfcclGetLastError(NULL), "not a dfccl unique id (use dfcclGetUniqueId)");

	dfcclConfig_t config = DFCCL_CONFIG_INITIALIZER;
	config.magic = 0;
	assert_int_equal(dfcclCommInitRankConfig(&comm, 2, id, 0, &config), dfcclInvalidArgument);
	config = (dfcclConfig_t)DFCCL_CONFIG_INITIALIZER;
	config.initTimeoutMs = -5;
	assert_int_equal(dfcclCommInitRankConfig(&comm, 2, id, 0, &config), dfcclInvalidArgument);

	/* Valid arguments reach the connection, which fails clearly. */
	assert_int_equal(dfcclCommInitRank(&comm, 2, id, 0), dfcclDaemonUnavailable);
	assert_non_null(strstr(dfcclGetLastError(NULL), "cannot connect to /nonexistent/dfccld.sock"));
	assert_non_null(strstr(dfcclGetLastError(NULL), "is dfccld running? (systemctl start dfccld)"));

	assert_int_equal(dfcclCommDestroy(NULL), dfcclSuccess);
	assert_int_equal(dfcclCommAbort(NULL), dfcclSuccess);
	int n;
	assert_int_equal(dfcclGetDeviceCount(&n), dfcclDaemonUnavailable);
}

static void test_devices(void **state)
{
	int d = -1;
	assert_int_equal(dfcclGetDevice(&d), dfcclSuccess);
	assert_int_equal(d, 0);
	assert_int_equal(dfcclSetDevice(3), dfcclSuccess);
	assert_int_equal(dfcclGetDevice(&d), dfcclSuccess);
	assert_int_equal(d, 3);
	assert_int_equal(client_current_device(), 3);
	assert_int_equal(dfcclSetDevice(-1), dfcclInvalidArgument);
	assert_int_equal(dfcclSetDevice(0), dfcclSuccess);
}

/* ---------------------------------------------------------------- the queue pair */

#define TEST_SQ_ENTRIES 16u

/* A queue pair mapped as the client maps it, with a thread in the role of
 * the engine: it completes every armed entry in order, NOPs with OK,
 * entries with a user_tag with status user_tag - 1, and everything else
 * with the status in `status`. */
struct qp_fixture {
	struct qp *q;
	struct dfccl_qp_header *engine_view; /* the region as the fake engine reaches it: the client's
	                                      * own mapping, so the thread sanitizer sees every
	                                      * hand-off between the two (it cannot follow one made
	                                      * through a second mapping of the same memory) */
	size_t size;
	int bell;
	int lost;
	int stop;
	int status;     /* atomic */
	int engine_on;  /* atomic: the engine thread completes entries */
	int bad_seq;    /* atomic: armed entries whose seq or seq_check was not their sequence */
	pthread_t engine;
	struct req_poller *reqs; /* a session's completion thread, for the req tests */
	struct req_tracker t;    /* a communicator's tracker on it */
	bool t_gone;             /* the test drained or orphaned t itself */
};

static void *fake_engine(void *arg)
{
	struct qp_fixture *f = arg;
	struct dfccl_qp_header *h = f->engine_view;
	struct dfccl_sqe *sq = (void *)((char *)h + h->sq_offset);
	uint64_t *cw = (void *)((char *)h + h->cw_offset);
	uint64_t head = 1;
	while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
		if (!__atomic_load_n(&f->engine_on, __ATOMIC_ACQUIRE)) {
			usleep(100);
			continue;
		}
		uint32_t slot = DFCCL_QP_SLOT(head, h->sq_entries);
		if (head > __atomic_load_n(&h->sq_tail, __ATOMIC_ACQUIRE) ||
		    __atomic_load_n(&sq[slot].arm, __ATOMIC_ACQUIRE) != head) {
			usleep(20);
			continue;
		}
		if (sq[slot].seq != head || sq[slot].seq_check != (uint32_t)head)
			__atomic_add_fetch(&f->bad_seq, 1, __ATOMIC_RELAXED);
		uint32_t st = sq[slot].opcode == DFCCL_OP_NOP ? DFCCL_CQ_OK
		              : sq[slot].user_tag   ? (uint32_t)(sq[slot].user_tag - 1)
		                                    : (uint32_t)__atomic_load_n(&f->status, __ATOMIC_ACQUIRE);
		__atomic_store_n(&cw[slot], DFCCL_CW_MAKE(head, st), __ATOMIC_RELEASE);
		head++;
		__atomic_store_n(&h->sq_head, head, __ATOMIC_RELEASE);
		__atomic_add_fetch(&h->completed, 1, __ATOMIC_RELEASE);
		queue_wake_waiters(h); /* as the real engine does after every completion */
	}
	return NULL;
}

static int qp_setup(void **state)
{
	struct qp_fixture *f = calloc(1, sizeof(*f));
	int memfd = queue_region_create(5, 0, TEST_SQ_ENTRIES, &f->size);
	assert_true(memfd >= 0);
	f->bell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	int client_bell = dup(f->bell);
	f->status = DFCCL_CQ_NOT_SUPPORTED;
	f->engine_on = 1;
	assert_int_equal(qp_map(memfd, client_bell, f->size, 0, &f->lost, &f->q), dfcclSuccess);
	f->engine_view = f->q->hdr;
	assert_int_equal(f->q->entries, TEST_SQ_ENTRIES);
	assert_int_equal(f->q->qp_id, 5);
	assert_int_equal(pthread_create(&f->engine, NULL, fake_engine, f), 0);
	assert_int_equal(req_poller_new(&f->reqs), dfcclSuccess);
	req_tracker_init(&f->t, f->reqs);
	*state = f;
	return 0;
}

static int qp_teardown(void **state)
{
	struct qp_fixture *f = *state;
	if (!f->t_gone)
		req_tracker_drain(&f->t);
	req_poller_free(f->reqs);
	__atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
	pthread_join(f->engine, NULL);
	qp_free(f->q);
	close(f->bell);
	free(f);
	return 0;
}

static struct dfccl_sqe sqe_of(unsigned opcode)
{
	struct dfccl_sqe e;
	memset(&e, 0, sizeof(e));
	e.opcode = (uint8_t)opcode;
	return e;
}

static void test_qp_map_rejects(void **state)
{
	int lost = 0;
	struct qp *q;
	size_t size;
	int memfd = queue_region_create(1, 0, TEST_SQ_ENTRIES, &size);
	/* Another device than the one asked for. */
	assert_int_equal(qp_map(memfd, eventfd(0, 0), size, 1, &lost, &q), dfcclInternalError);
	/* Garbage instead of a region. */
	memfd = memfd_create("not-a-qp", 0);
	assert_int_equal(ftruncate(memfd, (off_t)size), 0);
	assert_int_equal(qp_map(memfd, eventfd(0, 0), size, 0, &lost, &q), dfcclVersionMismatch);
	/* A size the descriptor does not have. */
	memfd = queue_region_create(1, 0, TEST_SQ_ENTRIES, &size);
	assert_int_equal(qp_map(memfd, eventfd(0, 0), size * 2, 0, &lost, &q), dfcclInternalError);
}

static void test_qp_nop_and_doorbell(void **state)
{
	struct qp_fixture *f = *state;
	struct dfccl_sqe e = sqe_of(DFCCL_OP_NOP);

	/* The engine says it sleeps: every submission rings. */
	__atomic_store_n(&f->engine_view->engine_state, DFCCL_ENGINE_SLEEPING, __ATOMIC_RELEASE);
	for (int i = 0; i < 3; i++)
		assert_int_equal(qp_run(f->q, &e), dfcclSuccess);
	uint64_t rings = 0;
	assert_int_equal(read(f->bell, &rings, sizeof(rings)), sizeof(rings));
	assert_int_equal(rings, 3);

	/* A polling engine needs no doorbell. */
	__atomic_store_n(&f->engine_view->engine_state, DFCCL_ENGINE_POLLING, __ATOMIC_RELEASE);
	assert_int_equal(qp_run(f->q, &e), dfcclSuccess);
	assert_int_equal(read(f->bell, &rings, sizeof(rings)), -1);

	assert_int_equal(f->engine_view->sq_tail, 4);
	assert_true(f->engine_view->client_heartbeat_ns > 0);
}

static void test_qp_status_mapping(void **state)
{
	struct qp_fixture *f = *state;
	struct dfccl_sqe e = sqe_of(DFCCL_OP_ALLREDUCE);
	assert_int_equal(qp_run(f->q, &e), dfcclNotSupported);
	assert_string_equal(dfcclGetLastError(NULL), "the daemon's engine does not execute AllReduce yet");

	static const struct {
		uint32_t status;
		dfcclResult_t result;
	} map[] = {
	    {DFCCL_CQ_OK, dfcclSuccess},
	    {DFCCL_CQ_PEER_LOST, dfcclRemoteError},
	    {DFCCL_CQ_ABORTED, dfcclAborted},
	    {DFCCL_CQ_DEVICE_LOST, dfcclDeviceLost},
	    {DFCCL_CQ_TIMEOUT, dfcclTimeout},
	    {DFCCL_CQ_NOT_SUPPORTED, dfcclNotSupported},
	    {DFCCL_CQ_MISMATCH, dfcclInvalidUsage},
	    {DFCCL_CQ_LIMIT, dfcclSystemError},
	    {DFCCL_CQ_LIMIT_UID, dfcclSystemError},
	    {DFCCL_CQ_BAD_REG, dfcclInvalidArgument},
	    {DFCCL_CQ_OUT_OF_RANGE, dfcclInvalidArgument},
	    {DFCCL_CQ_BAD_ENTRY, dfcclInvalidArgument},
	    {999, dfcclInvalidArgument},
	};
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		assert_int_equal(qp_status_result(map[i].status, DFCCL_OP_SEND), map[i].result);
	qp_status_result(DFCCL_CQ_OUT_OF_RANGE, DFCCL_OP_RECV);
	assert_non_null(strstr(dfcclGetLastError(NULL), "Recv failed: buffer offset and size fall outside"));
}

/* More entries than the queue has slots, all submitted before the first
 * wait: the submitter itself must reap its own completed entries to free
 * their slots, and every ticket must still get its own status. */
static void test_qp_more_than_a_lap(void **state)
{
	struct qp_fixture *f = *state;
	enum { N = 3 * TEST_SQ_ENTRIES + 5 };
	struct qp_ticket t[N];
	for (int i = 0; i < N; i++) {
		struct dfccl_sqe e = sqe_of(i % 2 ? DFCCL_OP_NOP : DFCCL_OP_SEND);
		e.seq_check = 0xdeadbeefu; /* the library's own, whatever the caller's copy held */
		assert_int_equal(qp_submit(f->q, &e, &t[i]), dfcclSuccess);
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(qp_wait(f->q, &t[i]), dfcclSuccess);
		assert_int_equal(t[i].status, i % 2 ? DFCCL_CQ_OK : DFCCL_CQ_NOT_SUPPORTED);
	}
	/* Each lap's entries carried their own sequence in seq and seq_check
	 * (proto/dfccl_queue.h: an engine may trust a copy by them). */
	assert_int_equal(__atomic_load_n(&f->bad_seq, __ATOMIC_RELAXED), 0);
}

struct nop_thread {
	struct qp *q;
	int failures;
};

static void *nop_loop(void *arg)
{
	struct nop_thread *n = arg;
	struct dfccl_sqe e = sqe_of(DFCCL_OP_NOP);
	for (int i = 0; i < 200; i++)
		n->failures += qp_run(n->q, &e) != dfcclSuccess;
	return NULL;
}

static void test_qp_threads(void **state)
{
	struct qp_fixture *f = *state;
	enum { T = 6 };
	pthread_t th[T];
	struct nop_thread n[T];
	for (int i = 0; i < T; i++) {
		n[i] = (struct nop_thread){.q = f->q};
		assert_int_equal(pthread_create(&th[i], NULL, nop_loop, &n[i]), 0);
	}
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(n[i].failures, 0);
	}
}

static void engine_pause(struct qp_fixture *f, int on)
{
	__atomic_store_n(&f->engine_on, on, __ATOMIC_RELEASE);
	if (!on)
		usleep(2000); /* let a turn of the engine in progress finish */
}

/* A bounded wait on an entry nobody completes ends in dfcclTimeout with a
 * sentence naming the entry and the time, gives the ticket up, and the
 * queue pair goes on once the engine completes the entry after all. */
static void test_qp_wait_for_timeout(void **state)
{
	struct qp_fixture *f = *state;
	struct dfccl_sqe e = sqe_of(DFCCL_OP_NOP);
	struct qp_ticket t;
	engine_pause(f, 0);
	assert_int_equal(qp_submit(f->q, &e, &t), dfcclSuccess);
	char want[128];
	snprintf(want, sizeof(want), "entry %llu of device 0's submission queue has not completed in 50 ms",
	         (unsigned long long)t.seq);
	assert_int_equal(qp_wait_for(f->q, &t, 50), dfcclTimeout);
	assert_non_null(strstr(dfcclGetLastError(NULL), want));
	engine_pause(f, 1);
	for (unsigned i = 0; i < TEST_SQ_ENTRIES + 2; i++)
		assert_int_equal(qp_run(f->q, &e), dfcclSuccess);
}

static void test_qp_dead_and_lost(void **state)
{
	struct qp_fixture *f = *state;
	struct dfccl_sqe e = sqe_of(DFCCL_OP_NOP);
	struct qp_ticket t;

	/* The worker dies with an entry outstanding. */
	__atomic_store_n(&f->engine_on, 0, __ATOMIC_RELEASE);
	usleep(1000);
	assert_int_equal(qp_submit(f->q, &e, &t), dfcclSuccess);
	__atomic_store_n(&f->engine_view->qp_state, DFCCL_QP_DEAD, __ATOMIC_RELEASE);
	assert_int_equal(qp_wait(f->q, &t), dfcclDeviceLost);
	assert_int_equal(qp_run(f->q, &e), dfcclDeviceLost);
	assert_int_equal(qp_health(f->q), dfcclDeviceLost);

	__atomic_store_n(&f->engine_view->qp_state, DFCCL_QP_ACTIVE, __ATOMIC_RELEASE);
	__atomic_store_n(&f->lost, 1, __ATOMIC_RELEASE);
	assert_int_equal(qp_run(f->q, &e), dfcclDaemonUnavailable);
	assert_non_null(strstr(dfcclGetLastError(NULL), "lost the connection to dfccld"));
}

/* ---------------------------------------------------------------- outstanding entries */

/* An entry the fake engine completes with `status`. */
static struct dfccl_sqe sqe_status(uint32_t status)
{
	struct dfccl_sqe e = sqe_of(DFCCL_OP_ALLREDUCE);
	e.user_tag = status + 1;
	return e;
}

static struct req *submit_one(struct qp_fixture *f, struct req_tracker *t, uint32_t status, dfcclCallback_t cb,
                              void *arg, bool handle)
{
	struct dfccl_sqe e = sqe_status(status);
	struct req *r = req_new(DFCCL_OP_ALLREDUCE, cb, arg, handle);
	assert_non_null(r);
	assert_int_equal(req_submit(t, f->q, &e, r, NULL), dfcclSuccess);
	return r;
}

static void test_req_wait_and_test(void **state)
{
	struct qp_fixture *f = *state;
	struct req_tracker *t = &f->t;

	engine_pause(f, 0);
	struct req *a = submit_one(f, t, DFCCL_CQ_OK, NULL, NULL, true);
	struct req *b = submit_one(f, t, DFCCL_CQ_TIMEOUT, NULL, NULL, true);
	int done = 1;
	assert_int_equal(dfcclTest((dfcclRequest_t)a, &done), dfcclSuccess);
	assert_int_equal(done, 0);
	assert_int_equal(dfcclCommQuery(NULL), dfcclInvalidArgument);
	assert_int_equal(req_tracker_sync(t, false), dfcclInProgress);
	engine_pause(f, 1);
	do
		assert_int_equal(dfcclTest((dfcclRequest_t)a, &done), dfcclSuccess);
	while (!done);
	assert_int_equal(dfcclWait((dfcclRequest_t)b), dfcclTimeout);
	assert_non_null(strstr(dfcclGetLastError(NULL), "AllReduce failed: the collective timed out"));
	/* The tracker saw the failure too, once. */
	assert_int_equal(req_tracker_sync(t, true), dfcclTimeout);
	assert_int_equal(req_tracker_sync(t, true), dfcclSuccess);
	req_tracker_drain(t);
	f->t_gone = true;
}

static void test_req_sync_first_error(void **state)
{
	struct qp_fixture *f = *state;
	struct req_tracker *t = &f->t;

	/* Asynchronous entries nobody holds a handle of: the tracker reports
	 * the first failure among everything submitted before the call. */
	engine_pause(f, 0);
	submit_one(f, t, DFCCL_CQ_OK, NULL, NULL, false);
	submit_one(f, t, DFCCL_CQ_ABORTED, NULL, NULL, false);
	submit_one(f, t, DFCCL_CQ_PEER_LOST, NULL, NULL, false);
	assert_int_equal(req_tracker_sync(t, false), dfcclInProgress);
	engine_pause(f, 1);
	assert_int_equal(req_tracker_sync(t, true), dfcclAborted);
	assert_non_null(strstr(dfcclGetLastError(NULL), "the communicator was aborted"));
	assert_int_equal(req_tracker_sync(t, false), dfcclSuccess);

	/* Many more entries than the queue has slots, never waited for one by
	 * one: submitters reap the completed ones, so none is kept. */
	for (int i = 0; i < 5 * (int)TEST_SQ_ENTRIES; i++)
		submit_one(f, t, DFCCL_CQ_OK, NULL, NULL, false);
	assert_int_equal(req_tracker_sync(t, true), dfcclSuccess);
	assert_null(t->head);
	req_tracker_drain(t);
	f->t_gone = true;
}

struct cb_state {
	struct qp_fixture *f;
	struct req_tracker *t;
	int calls;            /* atomic */
	int errors;           /* atomic */
	int resubmit;         /* atomic: submit one more entry from the callback */
	pthread_t thread;
	int other_thread;     /* atomic: a callback ran on another thread than the first */
};

static void on_done(dfcclResult_t result, void *arg)
{
	struct cb_state *s = arg;
	if (__atomic_add_fetch(&s->calls, 1, __ATOMIC_ACQ_REL) == 1)
		s->thread = pthread_self();
	else if (!pthread_equal(s->thread, pthread_self()))
		__atomic_store_n(&s->other_thread, 1, __ATOMIC_RELEASE);
	if (result != dfcclSuccess)
		__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
	/* No lock is held here: submitting on the same tracker must work. */
	if (__atomic_exchange_n(&s->resubmit, 0, __ATOMIC_ACQ_REL))
		submit_one(s->f, s->t, DFCCL_CQ_OK, on_done, s, false);
}

static void wait_calls(struct cb_state *s, int n)
{
	for (int i = 0; i < 5000 && __atomic_load_n(&s->calls, __ATOMIC_ACQUIRE) < n; i++)
		usleep(1000);
	assert_int_equal(__atomic_load_n(&s->calls, __ATOMIC_ACQUIRE), n);
}

static void test_req_callbacks(void **state)
{
	struct qp_fixture *f = *state;
	struct req_tracker *t = &f->t;
	struct cb_state s = {.f = f, .t = t, .resubmit = 1};

	for (int i = 0; i < 10; i++)
		submit_one(f, t, i == 3 ? DFCCL_CQ_BAD_REG : DFCCL_CQ_OK, on_done, &s, false);
	wait_calls(&s, 11);
	assert_int_equal(__atomic_load_n(&s.errors, __ATOMIC_ACQUIRE), 1);
	/* Every callback ran on the library's completion thread. */
	assert_false(pthread_equal(s.thread, pthread_self()));
	assert_int_equal(s.other_thread, 0);

	/* A request with a callback: both report, independently. */
	struct req *r = submit_one(f, t, DFCCL_CQ_OK, on_done, &s, true);
	assert_int_equal(dfcclWait((dfcclRequest_t)r), dfcclSuccess);
	wait_calls(&s, 12);
	/* Drain waits for the callbacks of the tracker's entries too. */
	engine_pause(f, 0);
	submit_one(f, t, DFCCL_CQ_OK, on_done, &s, false);
	engine_pause(f, 1);
	req_tracker_drain(t);
	f->t_gone = true;
	assert_int_equal(__atomic_load_n(&s.calls, __ATOMIC_ACQUIRE), 13);
}

static void test_req_connection_lost(void **state)
{
	struct qp_fixture *f = *state;
	struct req_tracker *t = &f->t;
	struct cb_state s = {.f = f, .t = t};

	/* The engine never answers and the daemon goes away: the library fails
	 * every outstanding entry itself. */
	engine_pause(f, 0);
	struct req *r = submit_one(f, t, DFCCL_CQ_OK, NULL, NULL, true);
	submit_one(f, t, DFCCL_CQ_OK, on_done, &s, false);
	submit_one(f, t, DFCCL_CQ_OK, NULL, NULL, false);
	__atomic_store_n(&f->lost, 1, __ATOMIC_RELEASE);
	assert_int_equal(dfcclWait((dfcclRequest_t)r), dfcclDaemonUnavailable);
	assert_non_null(strstr(dfcclGetLastError(NULL), "AllReduce did not complete: lost the connection"));
	wait_calls(&s, 1);
	assert_int_equal(__atomic_load_n(&s.errors, __ATOMIC_ACQUIRE), 1);
	assert_int_equal(req_tracker_sync(t, true), dfcclDaemonUnavailable);
	req_tracker_drain(t);
	f->t_gone = true;

	/* The abandoned entries' slots come back once the engine completes
	 * them anyway: a full lap more of submissions does not block. */
	__atomic_store_n(&f->lost, 0, __ATOMIC_RELEASE);
	engine_pause(f, 1);
	struct dfccl_sqe e = sqe_of(DFCCL_OP_NOP);
	for (int i = 0; i < 2 * (int)TEST_SQ_ENTRIES; i++)
		assert_int_equal(qp_run(f->q, &e), dfcclSuccess);
}

static void test_req_orphans(void **state)
{
	struct qp_fixture *f = *state;
	struct req_tracker *t = &f->t;
	struct cb_state s = {.f = f, .t = t};

	/* An aborted communicator hands its entries to the session, which
	 * reaps them when they complete; their requests stay valid. */
	engine_pause(f, 0);
	struct req *r = submit_one(f, t, DFCCL_CQ_ABORTED, NULL, NULL, true);
	submit_one(f, t, DFCCL_CQ_ABORTED, NULL, NULL, false);
	submit_one(f, t, DFCCL_CQ_ABORTED, on_done, &s, false);
	req_tracker_orphan(t);
	f->t_gone = true;
	engine_pause(f, 1);
	assert_int_equal(dfcclWait((dfcclRequest_t)r), dfcclAborted);
	wait_calls(&s, 1);
	for (int i = 0; i < 2 * (int)TEST_SQ_ENTRIES; i++)
		assert_int_equal(qp_run(f->q, &(struct dfccl_sqe){.opcode = DFCCL_OP_NOP}), dfcclSuccess);
}

/* ---------------------------------------------------------------- the daemon goes away */

#define FAKE_COMM_ID 42

/*
 * Just enough of a daemon for one session: it answers the Hello and
 * CommInit (communicator FAKE_COMM_ID), and, once told to go, sends the
 * PEER_LOST notice `notice` (when set) and closes the connection
 * `close_delay_ms` later, as its death would.
 */
struct fake_daemon {
	char dir[64];
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int listen_fd;
	pthread_t thread;
	int go;             /* atomic */
	const char *notice;
	unsigned close_delay_ms;
};

static void *fake_daemon_main(void *arg)
{
	struct fake_daemon *d = arg;
	struct frame_reader rd = FRAME_READER_INIT;
	int fd = accept(d->listen_fd, NULL, NULL);
	while (fd >= 0 && !__atomic_load_n(&d->go, __ATOMIC_ACQUIRE)) {
		dfccl_envelope *env;
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 0;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 10) == 0)
			continue;
		if (frame_recv(&rd, fd, &env, fds, &nfds) <= 0)
			break;
		frame_close_fds(fds, nfds);
		dfccl_envelope rep = DFCCL__V1__ENVELOPE__INIT;
		Dfccl__V1__HelloReply hello = DFCCL__V1__HELLO_REPLY__INIT;
		Dfccl__V1__CommInitReply init = DFCCL__V1__COMM_INIT_REPLY__INIT;
		rep.request_id = env->request_id;
		if (env->body_case == DFCCL__V1__ENVELOPE__BODY_HELLO) {
			hello.version = DFCCL_PROTO_VERSION;
			hello.engine = DFCCL__V1__ENGINE_KIND__ENGINE_HOST;
			hello.ndevices = 1;
			rep.body_case = DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY;
			rep.hello_reply = &hello;
		} else {
			init.comm_id = FAKE_COMM_ID;
			init.nranks = 1;
			rep.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_INIT_REPLY;
			rep.comm_init_reply = &init;
		}
		frame_envelope_free(env);
		if (frame_send(fd, &rep, NULL, 0) < 0)
			break;
	}
	if (fd >= 0 && d->notice) {
		Dfccl__V1__Notice n = DFCCL__V1__NOTICE__INIT;
		n.code = DFCCL__V1__ERROR_CODE__ERROR_PEER_LOST;
		n.comm_id = FAKE_COMM_ID;
		n.message = (char *)d->notice;
		dfccl_envelope env = DFCCL__V1__ENVELOPE__INIT;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_NOTICE;
		env.notice = &n;
		frame_send(fd, &env, NULL, 0);
	}
	usleep(1000 * d->close_delay_ms);
	if (fd >= 0)
		close(fd);
	frame_reader_free(&rd);
	return NULL;
}

static void fake_daemon_start(struct fake_daemon *d, const char *notice, unsigned close_delay_ms)
{
	memset(d, 0, sizeof(*d));
	d->notice = notice;
	d->close_delay_ms = close_delay_ms;
	snprintf(d->dir, sizeof(d->dir), "/tmp/dfccl-unit-XXXXXX");
	assert_non_null(mkdtemp(d->dir));
	snprintf(d->path, sizeof(d->path), "%s/dfccld.sock", d->dir);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->path);
	d->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(d->listen_fd >= 0);
	assert_int_equal(bind(d->listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(d->listen_fd, 1), 0);
	assert_int_equal(pthread_create(&d->thread, NULL, fake_daemon_main, d), 0);
}

static void fake_daemon_stop(struct fake_daemon *d)
{
	__atomic_store_n(&d->go, 1, __ATOMIC_RELEASE);
	pthread_join(d->thread, NULL);
	close(d->listen_fd);
	unlink(d->path);
	rmdir(d->dir);
}

/* A communicator of session c (the fake daemon's) whose entries go to the
 * fixture's queue pair, as comm_join makes one. */
static void fake_comm_join(struct client *c, struct qp *q, struct dfcclComm *cm)
{
	memset(cm, 0, sizeof(*cm));
	Dfccl__V1__CommInit init = DFCCL__V1__COMM_INIT__INIT;
	init.nranks = 1;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_INIT;
	req.comm_init = &init;
	struct client_reply rep;
	assert_int_equal(client_comm_init(c, &req, &cm->async, &rep), dfcclSuccess);
	client_reply_release(&rep);
	cm->client = c;
	cm->id = FAKE_COMM_ID;
	cm->nranks = 1;
	cm->qp = q;
	req_tracker_init(&cm->tracker, client_req_poller(c));
	cm->tracking = true;
}

static void fake_comm_leave(struct dfcclComm *cm)
{
	req_tracker_drain(&cm->tracker);
	client_async_remove(cm->client, &cm->async);
}

/*
 * The daemon dies while a collective is in its engine: its workers outlive
 * the supervisor by a moment, and one that drops its queue pairs fails the
 * communicator in the others, which complete the entry with PEER_LOST just
 * before the connection ends. The rank must see dfcclDaemonUnavailable,
 * not dfcclRemoteError, whichever it noticed first.
 */
static void test_daemon_death_beats_peer_lost(void **state)
{
	struct qp_fixture *f = *state;
	struct fake_daemon d;
	fake_daemon_start(&d, NULL, 30);
	struct client *c;
	assert_int_equal(client_open(d.path, "test_client", &c), dfcclSuccess);
	struct dfcclComm cm;
	fake_comm_join(c, f->q, &cm);

	struct req *r = req_new(DFCCL_OP_ALLREDUCE, NULL, NULL, false);
	assert_non_null(r);
	struct dfccl_sqe e = sqe_status(DFCCL_CQ_PEER_LOST);
	assert_int_equal(req_submit(&cm.tracker, f->q, &e, r, NULL), dfcclSuccess);
	__atomic_store_n(&d.go, 1, __ATOMIC_RELEASE);
	uint64_t t0 = qp_now_ns();
	assert_int_equal(dfcclCommSynchronize(&cm), dfcclDaemonUnavailable);
	assert_non_null(strstr(dfcclGetLastError(NULL), "lost the connection to dfccld"));
	assert_non_null(strstr(dfcclGetLastError(NULL), "a peer rank of the communicator was lost"));
	assert_true(qp_now_ns() - t0 < 5000000000ull);
	assert_true(client_gone(c, NULL, 0));
	/* What fails afterwards fails the same way. */
	assert_int_equal(comm_check(&cm), dfcclDaemonUnavailable);

	fake_comm_leave(&cm);
	client_unref(c);
	fake_daemon_stop(&d);
}

/* A peer lost before the daemon died stays dfcclRemoteError: the daemon's
 * notice, which comes before it fails the collectives, named it first. */
static void test_peer_lost_then_daemon_death(void **state)
{
	struct qp_fixture *f = *state;
	struct fake_daemon d;
	fake_daemon_start(&d, "rank 1 (pid 7) of communicator 42 disconnected; its collectives cannot complete", 0);
	struct client *c;
	assert_int_equal(client_open(d.path, "test_client", &c), dfcclSuccess);
	struct dfcclComm cm;
	fake_comm_join(c, f->q, &cm);

	__atomic_store_n(&d.go, 1, __ATOMIC_RELEASE);
	struct req *r = req_new(DFCCL_OP_ALLREDUCE, NULL, NULL, false);
	assert_non_null(r);
	struct dfccl_sqe e = sqe_status(DFCCL_CQ_PEER_LOST);
	assert_int_equal(req_submit(&cm.tracker, f->q, &e, r, NULL), dfcclSuccess);
	assert_int_equal(dfcclCommSynchronize(&cm), dfcclRemoteError);
	assert_non_null(strstr(dfcclGetLastError(NULL), "rank 1 (pid 7) of communicator 42 disconnected"));

	fake_comm_leave(&cm);
	client_unref(c);
	fake_daemon_stop(&d);
}

/* A closed connection is seen at once, whether or not the reader thread
 * has read up to its end. */
static void test_client_gone(void **state)
{
	struct fake_daemon d;
	fake_daemon_start(&d, NULL, 0);
	struct client *c;
	assert_int_equal(client_open(d.path, "test_client", &c), dfcclSuccess);
	char msg[256];
	assert_false(client_gone(c, msg, sizeof(msg)));
	fake_daemon_stop(&d);
	assert_true(client_gone(c, msg, sizeof(msg)));
	assert_non_null(strstr(msg, "lost the connection to dfccld (the daemon closed it)"));
	client_unref(c);
}

static void test_comm_keys(void **state)
{
	/* Separate counters: collectives per communicator, sends and receives
	 * per peer and direction. */
	struct dfcclComm *c = calloc(1, sizeof(*c));
	c->nranks = 4;
	c->p2p_seq = calloc(8, sizeof(uint64_t));
	assert_int_equal(comm_next_seq(c, DFCCL_OP_ALLREDUCE, 0), 1);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_SEND, 1), 1);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_SEND, 1), 2);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_RECV, 1), 1);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_SEND, 3), 1);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_RECV, 3), 1);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_BROADCAST, 2), 2);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_RECV, 1), 2);
	assert_int_equal(comm_next_seq(c, DFCCL_OP_ALLGATHER, 0), 3);
	free(c->p2p_seq);
	free(c);
}

static void test_registered_arguments(void **state)
{
	dfcclCollDesc_t d = {dfcclCollAllReduce, 16, dfcclFloat32, dfcclSum, 0, 0};
	struct dfcclComm *c = calloc(1, sizeof(*c));
	c->nranks = 2;
	pthread_mutex_init(&c->lock, NULL);
	assert_int_equal(dfcclRegisterCollective(NULL, 0, &d), dfcclInvalidArgument);
	assert_int_equal(dfcclRegisterCollective(c, -1, &d), dfcclInvalidArgument);
	assert_int_equal(dfcclRegisterCollective(c, DFCCL_MAX_COLL_ID, &d), dfcclInvalidArgument);
	assert_non_null(strstr(dfcclGetLastError(NULL), "collId 256 is outside 0..255"));
	assert_int_equal(dfcclRegisterCollective(c, 0, NULL), dfcclInvalidArgument);
	d.type = dfcclNumCollTypes;
	assert_int_equal(dfcclRegisterCollective(c, 0, &d), dfcclInvalidArgument);
	d.type = dfcclCollReduce;
	d.root = 2;
	assert_int_equal(dfcclRegisterCollective(c, 0, &d), dfcclInvalidArgument);
	assert_non_null(strstr(dfcclGetLastError(NULL), "root 2 is outside 0..1"));
	d.root = 1;
	d.op = dfcclNumOps;
	assert_int_equal(dfcclRegisterCollective(c, 0, &d), dfcclInvalidArgument);
	d.op = dfcclAvg;
	d.count = 0;
	assert_int_equal(dfcclRegisterCollective(c, 0, &d), dfcclInvalidArgument);
	d.count = 16;
	assert_int_equal(dfcclRegisterCollective(c, 7, &d), dfcclSuccess);
	assert_int_equal(dfcclRegisterCollective(c, 7, &d), dfcclInvalidUsage);
	assert_int_equal(dfcclDeregisterCollective(c, 7), dfcclSuccess);
	assert_int_equal(dfcclDeregisterCollective(c, 7), dfcclInvalidArgument);
	assert_int_equal(dfcclRunCollective(c, 7, NULL, NULL, NULL, NULL, NULL), dfcclInvalidArgument);
	assert_non_null(strstr(dfcclGetLastError(NULL), "collId 7 is not registered"));
	assert_int_equal(dfcclWait(NULL), dfcclInvalidArgument);
	int done;
	assert_int_equal(dfcclTest(NULL, &done), dfcclInvalidArgument);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static void test_stream_and_alltoall_arguments(void **state)
{
	int buf[4] = {0};
	assert_int_equal(dfcclAllReduce(buf, buf, 4, dfcclInt, dfcclSum, NULL, NULL), dfcclInvalidArgument);
	assert_int_equal(dfcclAllToAll(buf, buf, 1, dfcclInt, NULL, NULL), dfcclInvalidArgument);
	assert_int_equal(dfcclCommSynchronize(NULL), dfcclInvalidArgument);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_error_strings),
	    cmocka_unit_test(test_error_codes),
	    cmocka_unit_test(test_last_error),
	    cmocka_unit_test(test_unique_id_format),
	    cmocka_unit_test(test_unique_ids_differ),
	    cmocka_unit_test(test_mem_table),
	    cmocka_unit_test(test_mem_translate_bounds),
	    cmocka_unit_test(test_mem_api_arguments),
	    cmocka_unit_test(test_group_nesting),
	    cmocka_unit_test(test_group_failed_call),
	    cmocka_unit_test(test_dtype_sizes),
	    cmocka_unit_test_setup(test_comm_init_arguments, setup_no_daemon),
	    cmocka_unit_test(test_devices),
	    cmocka_unit_test(test_qp_map_rejects),
	    cmocka_unit_test_setup_teardown(test_qp_nop_and_doorbell, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_qp_status_mapping, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_qp_more_than_a_lap, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_qp_threads, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_qp_wait_for_timeout, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_qp_dead_and_lost, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_req_wait_and_test, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_req_sync_first_error, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_req_callbacks, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_req_connection_lost, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_req_orphans, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_daemon_death_beats_peer_lost, qp_setup, qp_teardown),
	    cmocka_unit_test_setup_teardown(test_peer_lost_then_daemon_death, qp_setup, qp_teardown),
	    cmocka_unit_test(test_client_gone),
	    cmocka_unit_test(test_comm_keys),
	    cmocka_unit_test(test_registered_arguments),
	    cmocka_unit_test(test_stream_and_alltoall_arguments),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
