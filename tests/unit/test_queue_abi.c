/*
 * Tests of the queue-pair ABI (proto/dfccl_queue.h, proto/queue.c,
 * proto/dfccl_stats.h) beyond what the static_asserts pin down: the region
 * geometry and slot arithmetic against numbers worked out by hand, the
 * completion-word packing at its limits, a freshly created region that
 * passes its own check after a real mmap, each corruption of the header
 * rejected with the documented error, and the memfd's seals.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "dfccl_stats.h"
#include "queue.h"
#include "testutil.h"

static void test_region_geometry(void **state)
{
	/* header page + n * 128 + n * 8, rounded up to a 4 KiB page */
	assert_int_equal(DFCCL_QP_SQ_OFFSET, 4096);
	assert_int_equal(DFCCL_QP_CW_OFFSET(16), 4096 + 2048);
	assert_int_equal(DFCCL_QP_REGION_SIZE(16), 8192);      /* 6272 -> 8192 */
	assert_int_equal(DFCCL_QP_REGION_SIZE(32), 12288);     /* 8448 -> 12288 */
	assert_int_equal(DFCCL_QP_REGION_SIZE(1024), 143360);  /* already a page multiple */
	assert_int_equal(DFCCL_QP_REGION_SIZE(65536), 8916992);
	assert_int_equal(DFCCL_QP_CW_OFFSET(65536), 4096 + 8388608);
	/* The header fits in the page before the entries. */
	assert_true(DFCCL_QP_HEADER_SIZE <= DFCCL_QP_SQ_OFFSET);
	assert_int_equal(sizeof(struct dfccl_qp_header), 512);
	assert_int_equal(sizeof(struct dfccl_sqe), 128);
	/* Counters written by different parties sit on different cache lines. */
	assert_int_not_equal(offsetof(struct dfccl_qp_header, sq_tail) / 64,
	                     offsetof(struct dfccl_qp_header, sq_head) / 64);
	assert_int_not_equal(offsetof(struct dfccl_qp_header, sq_head) / 64,
	                     offsetof(struct dfccl_qp_header, engine_state) / 64);
}

static void test_slot(void **state)
{
	assert_int_equal(DFCCL_QP_SLOT(1, 16), 0);
	assert_int_equal(DFCCL_QP_SLOT(16, 16), 15);
	assert_int_equal(DFCCL_QP_SLOT(17, 16), 0);
	assert_int_equal(DFCCL_QP_SLOT(1000, 1024), 999);
	assert_int_equal(DFCCL_QP_SLOT(1025, 1024), 0);
	assert_int_equal(DFCCL_QP_SLOT(65536, 65536), 65535);
	/* 2^64 - 1: (2^64 - 2) mod 16 = 14 */
	assert_int_equal(DFCCL_QP_SLOT(UINT64_MAX, 16), 14);
	for (uint64_t s = 1; s <= 64; s++)
		assert_int_equal(DFCCL_QP_SLOT(s, 32), (s - 1) % 32);
}

/* A launch gate's mark (DFCCL_ARM_GATE_MARK): it passes the gate's wait
 * but never reads as the entry armed, and opening a gate replaces only a
 * value the wait does not pass yet: the client's arm, a later lap's, or a
 * mark already there stay. Expected values from the definition, a cyclic
 * >= on 64 bits. */
static void test_gate_mark(void **state)
{
	(void)state;
	const uint64_t seqs[] = {1, 2, 1023, 1024, 1025, 1ull << 40, (1ull << 62) - 1};
	const uint64_t laps[] = {1, 8, 1024, 65536};
	for (size_t i = 0; i < sizeof(seqs) / sizeof(seqs[0]); i++)
		for (size_t k = 0; k < sizeof(laps) / sizeof(laps[0]); k++) {
			uint64_t s = seqs[i], n = laps[k];
			uint64_t mark = DFCCL_ARM_GATE_MARK(s);
			assert_true(mark != s);
			assert_true(dfccl_arm_passes(mark, s));
			assert_true(dfccl_arm_passes(s, s));
			assert_true(dfccl_arm_passes(s + n, s));
			assert_false(dfccl_arm_passes(0, s));
			if (s > n)
				assert_false(dfccl_arm_passes(s - n, s));
			/* Opening: an earlier lap's value (or a fresh slot's 0) gets
			 * the mark; the arm, a later lap's, the mark itself stay. */
			const uint64_t before[] = {s > n ? s - n : 0, s, s + n, mark};
			for (size_t b = 0; b < sizeof(before) / sizeof(before[0]); b++) {
				uint64_t arm = before[b];
				dfccl_arm_gate_open(&arm, s);
				assert_int_equal(arm, b == 0 ? mark : before[b]);
				assert_true(dfccl_arm_passes(arm, s));
			}
		}
}

static void test_completion_word(void **state)
{
	const uint64_t max_seq = (1ull << 48) - 1;
	const uint64_t seqs[] = {1, 2, 0xffff, 0x10000, 123456789, max_seq};
	for (unsigned i = 0; i < sizeof(seqs) / sizeof(seqs[0]); i++) {
		for (uint32_t st = 0; st < DFCCL_CQ_STATUS_COUNT_; st++) {
			uint64_t w = DFCCL_CW_MAKE(seqs[i], st);
			assert_int_equal(w, seqs[i] * 65536 + st);
			assert_int_equal(DFCCL_CW_SEQ(w), seqs[i]);
			assert_int_equal(DFCCL_CW_STATUS(w), st);
			/* A stream waits with ">= MAKE(seq, 0)": any status of seq
			 * satisfies it and nothing of an earlier lap does. */
			assert_true(w >= DFCCL_CW_MAKE(seqs[i], 0));
			assert_true(w > DFCCL_CW_MAKE(seqs[i] - 1, 0xffff));
		}
	}
	assert_int_equal(DFCCL_CW_MAKE(max_seq, 0xffff), UINT64_MAX);
	/* A status wider than 16 bits cannot bleed into the sequence. */
	assert_int_equal(DFCCL_CW_MAKE(5, 0x12345), 5 * 65536 + 0x2345);
	assert_int_equal(DFCCL_CW_STATUS_BITS, 16);
}

/* The post's shape: every channel count of the daemon kernel is a shape
 * of its own, and the algorithm reads back whatever the channel count. */
static void test_post_shape(void **state)
{
	(void)state;
	for (uint32_t algo = DFCCL_ALGO_DIRECT; algo < DFCCL_ALGO_COUNT_; algo++)
		for (uint32_t nch = 1; nch <= DFCCL_COMM_MAX_CHANNELS; nch++) {
			uint32_t shape = DFCCL_POST_SHAPE(DFCCL_OP_ALLREDUCE, 7, 0, DFCCL_POST_ALGO_CHANNELS(algo, nch));
			assert_int_equal(DFCCL_POST_SHAPE_ALGO(shape), algo);
			assert_int_equal(shape & 0xffffffu, DFCCL_POST_SHAPE(DFCCL_OP_ALLREDUCE, 7, 0, 0));
			if (nch > 1)
				assert_int_not_equal(shape, DFCCL_POST_SHAPE(DFCCL_OP_ALLREDUCE, 7, 0,
				                                             DFCCL_POST_ALGO_CHANNELS(algo, nch - 1)));
		}
	/* The host engine posts the algorithm alone. */
	assert_int_equal(DFCCL_POST_SHAPE_ALGO(DFCCL_POST_SHAPE(DFCCL_OP_REDUCE, 2, 1, DFCCL_ALGO_RING)), DFCCL_ALGO_RING);
}

static void test_stats_page(void **state)
{
	assert_int_equal(sizeof(struct dfccl_worker_stats), 4096);
	assert_int_equal(offsetof(struct dfccl_worker_stats, device), 8);
	assert_int_equal(offsetof(struct dfccl_worker_stats, context_switches), 40);
	assert_int_equal(offsetof(struct dfccl_worker_stats, spins), 48);
	assert_int_equal(offsetof(struct dfccl_worker_stats, doorbells), 56);
	assert_int_equal(offsetof(struct dfccl_worker_stats, by_block), 128);
	assert_int_equal(sizeof(((struct dfccl_worker_stats *)0)->by_block), 8 * DFCCL_STATS_BLOCKS);
	assert_int_equal(offsetof(struct dfccl_worker_stats, kernel_gated), 128 + 8 * DFCCL_STATS_BLOCKS);
	assert_int_equal(offsetof(struct dfccl_worker_stats, early_taken), 136 + 8 * DFCCL_STATS_BLOCKS);
	assert_int_equal(offsetof(struct dfccl_worker_stats, early_given_back), 144 + 8 * DFCCL_STATS_BLOCKS);
	assert_int_not_equal(DFCCL_STATS_MAGIC, DFCCL_QP_MAGIC);
}

static void test_names(void **state)
{
	/* Every status has its own sentence; anything beyond is "unknown". */
	const char *unknown = queue_status_string(DFCCL_CQ_STATUS_COUNT_);
	assert_non_null(unknown);
	assert_string_equal(queue_status_string(0xffffffffu), unknown);
	for (uint32_t a = 0; a < DFCCL_CQ_STATUS_COUNT_; a++) {
		const char *sa = queue_status_string(a);
		assert_non_null(sa);
		assert_true(strlen(sa) > 0);
		assert_string_not_equal(sa, unknown);
		for (uint32_t b = 0; b < a; b++)
			assert_string_not_equal(sa, queue_status_string(b));
	}
	assert_string_equal(queue_engine_state_name(DFCCL_ENGINE_STOPPED), "stopped");
	assert_string_equal(queue_engine_state_name(DFCCL_ENGINE_POLLING), "polling");
	assert_string_equal(queue_engine_state_name(DFCCL_ENGINE_SLEEPING), "sleeping");
	assert_string_equal(queue_engine_state_name(DFCCL_ENGINE_DEAD), "dead");
	assert_string_equal(queue_engine_state_name(4), "unknown");
}

static void test_create_map_check(void **state)
{
	const uint32_t sizes[] = {16, 64, 1024, 65536};
	for (unsigned i = 0; i < 4; i++) {
		size_t size = 0;
		int fd = queue_region_create(7, 3, sizes[i], &size);
		assert_true(fd >= 0);
		assert_int_equal(size, DFCCL_QP_REGION_SIZE(sizes[i]));
		assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
		struct stat st;
		assert_int_equal(fstat(fd, &st), 0);
		assert_int_equal(st.st_size, (off_t)size);

		struct dfccl_qp_header *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		assert_true(h != MAP_FAILED);
		char err[256] = "";
		assert_int_equal(queue_header_check(h, size, err, sizeof(err)), 0);
		assert_int_equal(h->magic, 0x3130505143434644ull);
		assert_memory_equal(&h->magic, "DFCCQP01", 8);
		assert_int_equal(h->abi_version, DFCCL_QUEUE_ABI_VERSION);
		assert_int_equal(h->sq_entries, sizes[i]);
		assert_int_equal(h->qp_id, 7);
		assert_int_equal(h->device, 3);
		assert_int_equal(h->sq_offset, 4096);
		assert_int_equal(h->cw_offset, 4096 + (uint64_t)sizes[i] * 128);
		assert_int_equal(h->region_size, size);
		assert_int_equal(h->sq_tail, 0);
		assert_int_equal(h->sq_head, 0);
		assert_int_equal(h->completed, 0);
		assert_int_equal(h->engine_state, DFCCL_ENGINE_STOPPED);
		assert_int_equal(h->qp_state, DFCCL_QP_ACTIVE);
		/* A mapping shorter than the region is refused. */
		assert_int_equal(queue_header_check(h, size - 1, err, sizeof(err)), -EINVAL);
		munmap(h, size);
		close(fd);
	}
}

static void test_create_bad_entries(void **state)
{
	const uint32_t bad[] = {0, 1, 8, 15, 17, 100, 1000, 131072, UINT32_MAX};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t size = 12345;
		assert_int_equal(queue_region_create(1, 0, bad[i], &size), -EINVAL);
		assert_int_equal(size, 12345);
	}
}

/* Checks a header built by queue_header_init(n = 16) after `corrupt` changed
 * it, against a mapping as large as the region claims to be. */
static int check_corrupted(void (*corrupt)(struct dfccl_qp_header *h))
{
	static uint64_t region[8192 / 8];
	struct dfccl_qp_header *h = (struct dfccl_qp_header *)region;
	memset(region, 0, sizeof(region));
	queue_header_init(h, 1, 0, 16);
	corrupt(h);
	char err[256] = "";
	int rc = queue_header_check(h, sizeof(region), err, sizeof(err));
	/* Every refusal explains itself. */
	if (rc < 0)
		assert_true(strlen(err) > 10);
	return rc;
}

static void c_none(struct dfccl_qp_header *h) {}
static void c_magic(struct dfccl_qp_header *h) { h->magic ^= 1; }
static void c_abi(struct dfccl_qp_header *h) { h->abi_version = DFCCL_QUEUE_ABI_VERSION + 1; }
static void c_header_size(struct dfccl_qp_header *h) { h->header_size = 256; }
static void c_sqe_size(struct dfccl_qp_header *h) { h->sqe_size = 64; }
static void c_cw_size(struct dfccl_qp_header *h) { h->cw_size = 4; }
static void c_entries_odd(struct dfccl_qp_header *h) { h->sq_entries = 24; }
static void c_entries_small(struct dfccl_qp_header *h) { h->sq_entries = 8; }
static void c_entries_big(struct dfccl_qp_header *h) { h->sq_entries = 1u << 17; }
static void c_sq_offset(struct dfccl_qp_header *h) { h->sq_offset = 512; }
static void c_cw_offset(struct dfccl_qp_header *h) { h->cw_offset += 8; }
static void c_region_size(struct dfccl_qp_header *h) { h->region_size = 4096; }
/* A consistent header for 32 entries does not fit the 8 KiB mapping. */
static void c_too_big_for_mapping(struct dfccl_qp_header *h) { queue_header_init(h, 1, 0, 32); }

static void test_corrupt_header(void **state)
{
	assert_int_equal(check_corrupted(c_none), 0);
	assert_int_equal(check_corrupted(c_magic), -EPROTO);
	assert_int_equal(check_corrupted(c_abi), -EPROTO);
	assert_int_equal(check_corrupted(c_header_size), -EINVAL);
	assert_int_equal(check_corrupted(c_sqe_size), -EINVAL);
	assert_int_equal(check_corrupted(c_cw_size), -EINVAL);
	assert_int_equal(check_corrupted(c_entries_odd), -EINVAL);
	assert_int_equal(check_corrupted(c_entries_small), -EINVAL);
	assert_int_equal(check_corrupted(c_entries_big), -EINVAL);
	assert_int_equal(check_corrupted(c_sq_offset), -EINVAL);
	assert_int_equal(check_corrupted(c_cw_offset), -EINVAL);
	assert_int_equal(check_corrupted(c_region_size), -EINVAL);
	assert_int_equal(check_corrupted(c_too_big_for_mapping), -EINVAL);

	/* A mapping too small to hold the header is refused before any field
	 * is read. */
	static uint64_t small[8];
	char err[128];
	assert_int_equal(queue_header_check((const struct dfccl_qp_header *)small, sizeof(small), err, sizeof(err)),
	                 -EINVAL);
}

static void test_sealed(void **state)
{
	size_t size;
	int fd = queue_region_create(1, 0, 16, &size);
	assert_true(fd >= 0);
	int seals = fcntl(fd, F_GET_SEALS);
	assert_true(seals >= 0);
	assert_true(seals & F_SEAL_SHRINK);
	assert_true(seals & F_SEAL_GROW);
	assert_true(seals & F_SEAL_SEAL);
	/* A client cannot make the engine's mapping end early... */
	assert_int_equal(ftruncate(fd, (off_t)size / 2), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(ftruncate(fd, 0), -1);
	/* ...nor grow it, nor lift the seals. */
	assert_int_equal(ftruncate(fd, (off_t)size * 2), -1);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, (off_t)size);
	/* Still writable: the queue is shared memory both sides write. */
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	munmap(p, size);
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_region_geometry), cmocka_unit_test(test_slot),
	    cmocka_unit_test(test_gate_mark),
	    cmocka_unit_test(test_completion_word), cmocka_unit_test(test_post_shape),
	    cmocka_unit_test(test_stats_page),
	    cmocka_unit_test(test_names),           cmocka_unit_test(test_create_map_check),
	    cmocka_unit_test(test_create_bad_entries), cmocka_unit_test(test_corrupt_header),
	    cmocka_unit_test(test_sealed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
