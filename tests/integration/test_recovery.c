/*
 * Recovery from faults through libdfccl (host engine, one client process
 * per rank): survivors of a SIGKILLed rank shrink with DFCCL_SHRINK_ABORT
 * and run checked collectives on the new communicator; dfcclCommRevoke
 * fails a hanging collective on every rank and an idle shrink follows;
 * dfcclCommSplit groups ranks by color and orders them by key, twice on
 * one parent; non-blocking init (dfcclInProgress until the last rank
 * came, a timeout reported through the async error, an abort that does not
 * wait); a communicator grown by a new rank, the old ranks keeping theirs;
 * `dfcclctl abort` by the owner (and refused to another uid), after which
 * the ranks renew the communicator; `dfcclctl shrink --exclude` by the
 * owner, after which the survivors shrink with the advice and go on while
 * the excluded rank is told to leave;
 * bad arguments get clear errors. The test process never
 * initialises libdfccl (unique ids need no daemon), so every forked rank
 * starts clean.
 */
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dfccl.h"
#include "harness.h"

struct job {
	dfcclUniqueId id;
	int nranks;
	int ready_fd; /* a rank writes one byte when it is where the test wants it */
	int go_fd;    /* the read end of that pipe, for a rank that waits on another */
	int go_wr;    /* > 0: the write end of go_fd's pipe when only the test writes it (ranks close it) */
};

/* Rank `rank` on device rank % 2, which its buffers are allocated for too. */
static dfcclResult_t init(const struct job *j, int rank, dfcclComm_t *comm)
{
	dfcclResult_t r = dfcclSetDevice(rank % 2);
	return r == dfcclSuccess ? dfcclCommInitRank(comm, j->nranks, j->id, rank) : r;
}

/* `iters` all-reduces (sum of int64) on comm, each checked against the sum
 * of every rank's contribution, computed here from `olds` (the old rank of
 * each new rank: what each contributes). Returns 0 or 1 with a message. */
static int checked_allreduces(dfcclComm_t comm, const int *olds, int iters, int rank)
{
	int n = 0, me = 0;
	if (dfcclCommCount(comm, &n) != dfcclSuccess || dfcclCommUserRank(comm, &me) != dfcclSuccess)
		RANK_FAIL("count/rank: %s", dfcclGetLastError(NULL));
	const size_t count = 1000;
	int64_t *buf = NULL;
	if (dfcclMemAlloc((void **)&buf, 2 * count * sizeof(*buf)) != dfcclSuccess)
		RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
	for (int it = 0; it < iters; it++) {
		for (size_t i = 0; i < count; i++)
			buf[i] = (int64_t)olds[me] * 1000003 + (int64_t)i * (it + 1);
		if (dfcclAllReduce(buf, buf + count, count, dfcclInt64, dfcclSum, comm, NULL) != dfcclSuccess ||
		    dfcclCommSynchronize(comm) != dfcclSuccess)
			RANK_FAIL("all-reduce %d: %s", it, dfcclGetLastError(NULL));
		for (size_t i = 0; i < count; i++) {
			int64_t want = 0;
			for (int q = 0; q < n; q++)
				want += (int64_t)olds[q] * 1000003 + (int64_t)i * (it + 1);
			if (buf[count + i] != want)
				RANK_FAIL("all-reduce %d element %zu: %lld, expected %lld", it, i, (long long)buf[count + i],
				     (long long)want);
		}
	}
	dfcclMemFree(buf);
	return 0;
}

/* ------------------------------------------------------------ shrink after a kill */

static int shrink_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL, small = NULL;
	if (init(j, rank, &comm) != dfcclSuccess)
		RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	/* Every rank says when it is where the kill should find it: rank 2
	 * idle, the others waiting for a collective rank 2 never joins (which
	 * fails once rank 2 is gone). */
	char b = 'r';
	if (rank == 2) {
		if (write(j->ready_fd, &b, 1) != 1)
			RANK_FAIL("ready pipe");
		pause(); /* the test kills it */
		return 1;
	}
	int64_t *buf = NULL;
	if (dfcclMemAlloc((void **)&buf, 16) != dfcclSuccess)
		RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
	if (dfcclAllReduce(buf, buf + 1, 1, dfcclInt64, dfcclSum, comm, NULL) != dfcclSuccess)
		RANK_FAIL("submit: %s", dfcclGetLastError(NULL));
	if (write(j->ready_fd, &b, 1) != 1)
		RANK_FAIL("ready pipe");
	uint64_t t0 = now_ms();
	dfcclResult_t r = dfcclCommSynchronize(comm);
	if (r == dfcclSuccess)
		RANK_FAIL("the all-reduce with a dead rank completed");
	if (now_ms() - t0 > 5000)
		RANK_FAIL("the dead rank's error took %llu ms", (unsigned long long)(now_ms() - t0));
	dfcclMemFree(buf);

	int excl[] = {2};
	if (dfcclCommShrink(comm, excl, 1, &small, NULL, DFCCL_SHRINK_ABORT) != dfcclSuccess)
		RANK_FAIL("shrink: %s", dfcclGetLastError(NULL));
	int n = 0, me = -1, dev = -1;
	if (dfcclCommCount(small, &n) != dfcclSuccess || n != 2 || dfcclCommUserRank(small, &me) != dfcclSuccess ||
	    me != rank || dfcclCommDevice(small, &dev) != dfcclSuccess || dev != rank % 2)
		RANK_FAIL("shrunk communicator: %d ranks, rank %d, device %d", n, me, dev);
	const int olds[] = {0, 1};
	if (checked_allreduces(small, olds, 100, rank))
		return 1;
	if (dfcclCommDestroy(small) != dfcclSuccess)
		RANK_FAIL("destroy the shrunk communicator: %s", dfcclGetLastError(NULL));
	dfcclCommAbort(comm);
	return 0;
}

static void test_shrink_after_kill(void **state)
{
	(void)state;
	struct job j = {.nranks = 3, .go_fd = -1};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	j.ready_fd = ready[1];
	pid_t p[3];
	for (int r = 0; r < 3; r++)
		p[r] = child_run(shrink_rank, &j, r);
	for (int r = 0; r < 3; r++) {
		char b;
		assert_int_equal(read(ready[0], &b, 1), 1);
	}
	kill(p[2], SIGKILL);
	assert_int_equal(child_wait(p[2], 5000), 128 + SIGKILL);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(p[r], 30000), 0);
	close(ready[0]);
	close(ready[1]);
}

/* ------------------------------------------------------------ revoke, then an idle shrink */

static int revoke_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL, again = NULL;
	if (init(j, rank, &comm) != dfcclSuccess)
		RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	int64_t *buf = NULL;
	if (dfcclMemAlloc((void **)&buf, 16) != dfcclSuccess)
		RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
	char b = 'r';
	if (rank == 0) {
		/* A collective its peer never joins, then a shrink while it hangs. */
		if (dfcclAllReduce(buf, buf + 1, 1, dfcclInt64, dfcclSum, comm, NULL) != dfcclSuccess)
			RANK_FAIL("submit: %s", dfcclGetLastError(NULL));
		if (dfcclCommShrink(comm, NULL, 0, &again, NULL, DFCCL_SHRINK_DEFAULT) != dfcclInvalidUsage ||
		    !strstr(dfcclGetLastError(NULL), "outstanding"))
			RANK_FAIL("a default shrink with a collective outstanding: '%s'", dfcclGetLastError(NULL));
		if (write(j->ready_fd, &b, 1) != 1)
			RANK_FAIL("ready pipe");
		uint64_t t0 = now_ms();
		dfcclResult_t r = dfcclCommSynchronize(comm);
		if (r != dfcclAborted)
			RANK_FAIL("the hanging all-reduce ended with %d (%s), expected dfcclAborted", r, dfcclGetLastError(NULL));
		/* The daemon's notice may come after the engine failed the entry. */
		dfcclResult_t ae = dfcclSuccess;
		for (uint64_t t1 = now_ms(); ae == dfcclSuccess && now_ms() - t1 < 2000; usleep(2000))
			if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess)
				RANK_FAIL("dfcclCommGetAsyncError: %s", dfcclGetLastError(NULL));
		if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess || ae != dfcclAborted ||
		    !strstr(dfcclGetLastError(NULL), "rank 1 (pid"))
			RANK_FAIL("the communicator's error is %d, '%s': expected dfcclAborted naming rank 1's revoke", ae,
			     dfcclGetLastError(NULL));
		if (now_ms() - t0 > 5000)
			RANK_FAIL("the revoke took %llu ms to reach rank 0", (unsigned long long)(now_ms() - t0));
		if (dfcclAllReduce(buf, buf + 1, 1, dfcclInt64, dfcclSum, comm, NULL) == dfcclSuccess &&
		    dfcclCommSynchronize(comm) == dfcclSuccess)
			RANK_FAIL("a collective on the revoked communicator succeeded");
	} else {
		char go;
		if (read(j->go_fd, &go, 1) != 1)
			RANK_FAIL("go pipe");
		if (dfcclCommRevoke(comm) != dfcclSuccess)
			RANK_FAIL("revoke: %s", dfcclGetLastError(NULL));
	}
	dfcclMemFree(buf);
	/* Both idle now: a shrink that excludes nobody renews the communicator. */
	if (dfcclCommShrink(comm, NULL, 0, &again, NULL, DFCCL_SHRINK_DEFAULT) != dfcclSuccess)
		RANK_FAIL("shrink after the revoke: %s", dfcclGetLastError(NULL));
	const int olds[] = {0, 1};
	if (checked_allreduces(again, olds, 20, rank))
		return 1;
	dfcclCommDestroy(again);
	dfcclCommDestroy(comm);
	return 0;
}

/* Runs nprocs processes of fn (ranks 0..nprocs-1) over a fresh job of
 * nranks whose ready_fd/go_fd are the two ends of one pipe (one rank
 * writes, another reads), and waits for every one to succeed. */
static void run_piped(int (*fn)(void *, int), int nranks, int nprocs)
{
	struct job j = {.nranks = nranks};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	j.go_fd = pfd[0];
	j.ready_fd = pfd[1];
	pid_t p[8];
	for (int r = 0; r < nprocs; r++)
		p[r] = child_run(fn, &j, r);
	for (int r = 0; r < nprocs; r++)
		assert_int_equal(child_wait(p[r], 30000), 0);
	close(pfd[0]);
	close(pfd[1]);
}

/* Rank 0 writes into the pipe once its collective hangs; rank 1 then
 * revokes. */
static void test_revoke(void **state)
{
	(void)state;
	run_piped(revoke_rank, 2, 2);
}

/* ------------------------------------------------------------ split */

static int split_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL, sub = NULL, all = NULL;
	if (init(j, rank, &comm) != dfcclSuccess)
		RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	/* Bad arguments first: nothing reaches the daemon. */
	int self[] = {rank}, twice[] = {(rank + 1) % j->nranks, (rank + 1) % j->nranks}, far[] = {j->nranks};
	if (dfcclCommShrink(comm, self, 1, &sub, NULL, 0) != dfcclInvalidArgument ||
	    !strstr(dfcclGetLastError(NULL), "excludes itself"))
		RANK_FAIL("shrink excluding itself: '%s'", dfcclGetLastError(NULL));
	if (dfcclCommShrink(comm, twice, 2, &sub, NULL, 0) != dfcclInvalidArgument ||
	    !strstr(dfcclGetLastError(NULL), "twice"))
		RANK_FAIL("shrink excluding a rank twice: '%s'", dfcclGetLastError(NULL));
	if (dfcclCommShrink(comm, far, 1, &sub, NULL, 0) != dfcclInvalidArgument ||
	    !strstr(dfcclGetLastError(NULL), "outside"))
		RANK_FAIL("shrink excluding a rank outside: '%s'", dfcclGetLastError(NULL));
	if (dfcclCommShrink(comm, NULL, 0, &sub, NULL, 0x10) != dfcclInvalidArgument)
		RANK_FAIL("shrink with unknown flags: '%s'", dfcclGetLastError(NULL));
	if (dfcclCommSplit(comm, -5, 0, &sub, NULL) != dfcclInvalidArgument || !strstr(dfcclGetLastError(NULL), "color"))
		RANK_FAIL("split with color -5: '%s'", dfcclGetLastError(NULL));

	/* Colors by parity, the last rank without one; keys reverse the order. */
	int last = j->nranks - 1;
	int color = rank == last ? DFCCL_SPLIT_NOCOLOR : rank % 2;
	if (dfcclCommSplit(comm, color, -rank, &sub, NULL) != dfcclSuccess)
		RANK_FAIL("split: %s", dfcclGetLastError(NULL));
	if (color == DFCCL_SPLIT_NOCOLOR) {
		if (sub)
			RANK_FAIL("DFCCL_SPLIT_NOCOLOR got a communicator");
	} else {
		/* The members of this color, by descending old rank. */
		int olds[16], n = 0, me = -1;
		for (int q = last - 1; q >= 0; q--)
			if (q % 2 == color) {
				if (q == rank)
					me = n;
				olds[n++] = q;
			}
		int got_n = 0, got_me = -1;
		if (!sub || dfcclCommCount(sub, &got_n) != dfcclSuccess || got_n != n ||
		    dfcclCommUserRank(sub, &got_me) != dfcclSuccess || got_me != me)
			RANK_FAIL("split: %d ranks, rank %d; expected %d and %d", got_n, got_me, n, me);
		if (checked_allreduces(sub, olds, 10, rank))
			return 1;
		dfcclCommDestroy(sub);
	}
	/* A second split of the same parent: everyone, by rank. */
	if (dfcclCommSplit(comm, 7, rank, &all, NULL) != dfcclSuccess)
		RANK_FAIL("second split: %s", dfcclGetLastError(NULL));
	int olds[16];
	for (int q = 0; q < j->nranks; q++)
		olds[q] = q;
	if (checked_allreduces(all, olds, 10, rank))
		return 1;
	dfcclCommDestroy(all);
	dfcclCommDestroy(comm);
	return 0;
}

static void test_split(void **state)
{
	(void)state;
	struct job j = {.nranks = 5, .ready_fd = -1, .go_fd = -1};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	pid_t p[5];
	for (int r = 0; r < j.nranks; r++)
		p[r] = child_run(split_rank, &j, r);
	for (int r = 0; r < j.nranks; r++)
		assert_int_equal(child_wait(p[r], 30000), 0);
}

/* ------------------------------------------------------------ non-blocking init */

/* Polls comm's async error while it is dfcclInProgress, up to ms. */
static dfcclResult_t poll_init(dfcclComm_t comm, int ms)
{
	dfcclResult_t ae = dfcclInProgress;
	for (uint64_t t0 = now_ms(); ae == dfcclInProgress && now_ms() - t0 < (uint64_t)ms; usleep(1000))
		if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess)
			return dfcclInternalError;
	return ae;
}

static int nonblocking_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL;
	if (dfcclSetDevice(rank % 2) != dfcclSuccess)
		RANK_FAIL("set device: %s", dfcclGetLastError(NULL));
	if (rank == 1) {
		usleep(300000); /* rank 0 waits in the meantime */
		if (dfcclCommInitRank(&comm, 2, j->id, 1) != dfcclSuccess)
			RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	} else {
		dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
		cfg.blocking = 0;
		uint64_t t0 = now_ms();
		if (dfcclCommInitRankConfig(&comm, 2, j->id, 0, &cfg) != dfcclInProgress || !comm)
			RANK_FAIL("non-blocking init: '%s'", dfcclGetLastError(NULL));
		if (now_ms() - t0 > 200)
			RANK_FAIL("non-blocking init took %llu ms to return", (unsigned long long)(now_ms() - t0));
		int64_t *buf = NULL;
		if (dfcclMemAlloc((void **)&buf, 16) != dfcclSuccess)
			RANK_FAIL("alloc: %s", dfcclGetLastError(NULL));
		if (dfcclAllReduce(buf, buf + 1, 1, dfcclInt64, dfcclSum, comm, NULL) != dfcclInProgress ||
		    !strstr(dfcclGetLastError(NULL), "still being initialised"))
			RANK_FAIL("a collective during the init: '%s'", dfcclGetLastError(NULL));
		dfcclMemFree(buf);
		dfcclResult_t ae = poll_init(comm, 10000);
		if (ae != dfcclSuccess)
			RANK_FAIL("the non-blocking init ended with %d: %s", ae, dfcclGetLastError(NULL));
		if (now_ms() - t0 < 250)
			RANK_FAIL("the init was ready after %llu ms, before rank 1 came", (unsigned long long)(now_ms() - t0));
	}
	const int olds[] = {0, 1};
	if (checked_allreduces(comm, olds, 10, rank))
		return 1;
	dfcclCommDestroy(comm);
	return 0;
}

/* Alone in a communicator of 2: the non-blocking init times out (reported
 * through the async error), and a second one is aborted while it waits. */
static int lonely_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL;
	dfcclConfig_t cfg = DFCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	cfg.initTimeoutMs = 500;
	if (dfcclCommInitRankConfig(&comm, 2, j->id, 0, &cfg) != dfcclInProgress)
		RANK_FAIL("non-blocking init: '%s'", dfcclGetLastError(NULL));
	dfcclResult_t ae = poll_init(comm, 10000);
	if (ae != dfcclTimeout || !strstr(dfcclGetLastError(NULL), "missing rank 1"))
		RANK_FAIL("the lonely init ended with %d, '%s': expected a timeout naming rank 1", ae, dfcclGetLastError(NULL));
	if (dfcclCommDestroy(comm) != dfcclSuccess)
		RANK_FAIL("destroy after a failed init: %s", dfcclGetLastError(NULL));

	cfg.initTimeoutMs = 5000;
	if (dfcclCommInitRankConfig(&comm, 2, j->id, 0, &cfg) != dfcclInProgress)
		RANK_FAIL("second non-blocking init: '%s'", dfcclGetLastError(NULL));
	uint64_t t0 = now_ms();
	if (dfcclCommAbort(comm) != dfcclSuccess)
		RANK_FAIL("abort during the init: %s", dfcclGetLastError(NULL));
	if (now_ms() - t0 > 100)
		RANK_FAIL("abort during a non-blocking init waited %llu ms", (unsigned long long)(now_ms() - t0));
	return 0;
}

static void test_nonblocking_init(void **state)
{
	(void)state;
	struct job j = {.nranks = 2, .ready_fd = -1, .go_fd = -1};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	pid_t p[2];
	for (int r = 0; r < 2; r++)
		p[r] = child_run(nonblocking_rank, &j, r);
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(p[r], 30000), 0);
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	assert_int_equal(child_wait(child_run(lonely_rank, &j, 0), 30000), 0);
}

/* ------------------------------------------------------------ grow */

/* Ranks 0 and 1 make a communicator and grow it to 3; rank 2 joins with
 * the id rank 0 took (through the pipe). */
static int grow_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL, big = NULL;
	if (dfcclSetDevice(rank % 2) != dfcclSuccess)
		RANK_FAIL("set device: %s", dfcclGetLastError(NULL));
	if (rank == 2) {
		dfcclUniqueId gid;
		if (read(j->go_fd, &gid, sizeof(gid)) != (ssize_t)sizeof(gid))
			RANK_FAIL("grow id pipe");
		if (dfcclCommGrow(NULL, 3, &gid, 2, &big, NULL) != dfcclSuccess)
			RANK_FAIL("grow as a new rank: %s", dfcclGetLastError(NULL));
	} else {
		if (dfcclCommInitRank(&comm, 2, j->id, rank) != dfcclSuccess)
			RANK_FAIL("init: %s", dfcclGetLastError(NULL));
		if (rank == 0) {
			dfcclUniqueId gid;
			if (dfcclCommGetGrowId(comm, 2, &gid) != dfcclInvalidArgument)
				RANK_FAIL("a grow id for no more ranks: '%s'", dfcclGetLastError(NULL));
			if (dfcclCommGetGrowId(comm, 3, &gid) != dfcclSuccess)
				RANK_FAIL("grow id: %s", dfcclGetLastError(NULL));
			if (write(j->ready_fd, &gid, sizeof(gid)) != (ssize_t)sizeof(gid))
				RANK_FAIL("grow id pipe");
		}
		if (dfcclCommGrow(comm, 3, NULL, -1, &big, NULL) != dfcclSuccess)
			RANK_FAIL("grow as an old rank: %s", dfcclGetLastError(NULL));
	}
	int me = -1, n = 0;
	if (dfcclCommUserRank(big, &me) != dfcclSuccess || me != rank || dfcclCommCount(big, &n) != dfcclSuccess || n != 3)
		RANK_FAIL("grown communicator: rank %d of %d", me, n);
	const int olds[] = {0, 1, 2};
	if (checked_allreduces(big, olds, 10, rank))
		return 1;
	dfcclCommDestroy(big);
	if (comm) {
		/* The old communicator still works beside the new one. */
		if (checked_allreduces(comm, olds, 5, rank))
			return 1;
		dfcclCommDestroy(comm);
	}
	return 0;
}

static void test_grow(void **state)
{
	(void)state;
	run_piped(grow_rank, 2, 3);
}

/* ------------------------------------------------------------ dfcclctl abort */

/* Both ranks wait for the operator's abort, then renew the communicator. */
static int operator_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL, again = NULL;
	if (init(j, rank, &comm) != dfcclSuccess)
		RANK_FAIL("init: %s", dfcclGetLastError(NULL));
	char b = 'r';
	if (write(j->ready_fd, &b, 1) != 1)
		RANK_FAIL("ready pipe");
	dfcclResult_t ae = dfcclSuccess;
	for (uint64_t t0 = now_ms(); ae == dfcclSuccess && now_ms() - t0 < 10000; usleep(2000))
		if (dfcclCommGetAsyncError(comm, &ae) != dfcclSuccess)
			RANK_FAIL("dfcclCommGetAsyncError: %s", dfcclGetLastError(NULL));
	dfcclCommGetAsyncError(comm, &ae);
	if (ae != dfcclAborted || !strstr(dfcclGetLastError(NULL), "dfcclctl (pid") ||
	    !strstr(dfcclGetLastError(NULL), "from outside"))
		RANK_FAIL("after dfcclctl abort: %d, '%s'", ae, dfcclGetLastError(NULL));
	if (dfcclCommShrink(comm, NULL, 0, &again, NULL, DFCCL_SHRINK_DEFAULT) != dfcclSuccess)
		RANK_FAIL("shrink after the abort: %s", dfcclGetLastError(NULL));
	const int olds[] = {0, 1};
	if (checked_allreduces(again, olds, 5, rank))
		return 1;
	dfcclCommDestroy(again);
	dfcclCommDestroy(comm);
	return 0;
}

/* dfcclctl ARGS (NULL-terminated) on d's socket, as uid `uid` (or as this
 * process when uid < 0): its exit status, its output in out. */
static int ctl_as(struct daemon_proc *d, int uid, char *out, size_t len, const char *const *args)
{
	char path[200];
	snprintf(path, sizeof(path), "%s/ctl.out", d->dir);
	/* Writable for the other uid too. */
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	if (fd < 0 || fchmod(fd, 0666) < 0)
		return -1;
	close(fd);
	const char *argv[12] = {DFCCLCTL_PATH, "--socket", d->socket};
	int n = 3;
	for (int i = 0; args[i] && n < 11; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	pid_t p = fork();
	if (p == 0) {
		if (uid >= 0 && (setgroups(0, NULL) < 0 || setgid((gid_t)uid) < 0 || setuid((uid_t)uid) < 0))
			_exit(125);
		_exit(child_wait(child_exec(DFCCLCTL_PATH, argv, path, NULL), 10000));
	}
	int rc = child_wait(p, 15000);
	read_text_file(path, out, len);
	return rc;
}

/* dfcclctl abort ID, as ctl_as. */
static int ctl_abort(struct daemon_proc *d, uint64_t id, int uid, char *out, size_t len)
{
	char ids[32];
	snprintf(ids, sizeof(ids), "%llu", (unsigned long long)id);
	const char *args[] = {"abort", ids, NULL};
	return ctl_as(d, uid, out, len, args);
}

/* The id of the one communicator d holds. */
static uint64_t only_comm(struct daemon_proc *d)
{
	dfccl_envelope *q = daemon_query(d, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
	assert_non_null(q);
	assert_int_equal(q->query_reply->n_comms, 1);
	uint64_t id = q->query_reply->comms[0]->comm_id;
	frame_envelope_free(q);
	return id;
}

static void test_operator_abort(void **state)
{
	struct daemon_proc *d = *state;
	struct job j = {.nranks = 2, .go_fd = -1};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	j.ready_fd = pfd[1];
	pid_t p[2];
	for (int r = 0; r < 2; r++)
		p[r] = child_run(operator_rank, &j, r);
	for (int r = 0; r < 2; r++) {
		char b;
		assert_int_equal(read(pfd[0], &b, 1), 1);
	}
	uint64_t id = only_comm(d);
	char out[1024];
	assert_int_equal(ctl_abort(d, id + 1000, -1, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "does not exist"));
	if (geteuid() == 0) {
		/* Another user may not stop it (and learns nothing about it). */
		assert_int_equal(ctl_abort(d, id, 65534, out, sizeof(out)), 1);
		assert_non_null(strstr(out, "another user's"));
	}
	assert_int_equal(ctl_abort(d, id, -1, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "aborted"));
	for (int r = 0; r < 2; r++)
		assert_int_equal(child_wait(p[r], 30000), 0);
	close(pfd[0]);
	close(pfd[1]);
}

/* ------------------------------------------------------------ dfcclctl shrink */

#define ADVISED 2 /* the rank the operator drops from a job of 4 */

/* Polls comm's async error until it is set (up to 20 s); returns it, the
 * sentence as the thread's last error. */
static dfcclResult_t await_error(dfcclComm_t comm)
{
	dfcclResult_t ae = dfcclSuccess;
	for (uint64_t t0 = now_ms(); ae == dfcclSuccess && now_ms() - t0 < 20000; usleep(2000))
		dfcclCommGetAsyncError(comm, &ae);
	return ae;
}

/* Ranks 0, 1 and 3 hang in an all-reduce that rank 2 never joins, until the
 * operator's `dfcclctl shrink COMM --exclude 2`; then they shrink with the
 * advice (rank 3 with DFCCL_SHRINK_ABORT, the others idle) and run checked
 * all-reduces, and rank 2 learns that it is excluded. Every rank keeps the
 * old communicator until the test has looked at it (go). */
static int advised_rank(void *arg, int rank)
{
	struct job *j = arg;
	dfcclComm_t comm = NULL, small = NULL;
	int64_t *buf = NULL;
	int advice[4] = {-1, -1, -1, -1}, n = -1;
	close(j->go_wr); /* a test that ends early ends the read of go */
	if (init(j, rank, &comm) != dfcclSuccess || dfcclMemAlloc((void **)&buf, 16) != dfcclSuccess)
		RANK_FAIL("set-up: %s", dfcclGetLastError(NULL));
	if (dfcclCommGetShrinkAdvice(comm, advice, 4, &n) != dfcclSuccess || n != 0)
		RANK_FAIL("advice before any was given: %d ranks, '%s'", n, dfcclGetLastError(NULL));
	if (dfcclCommGetShrinkAdvice(comm, NULL, 1, &n) != dfcclInvalidArgument)
		RANK_FAIL("advice into a NULL list of 1: '%s'", dfcclGetLastError(NULL));
	if (rank != ADVISED && dfcclAllReduce(buf, buf + 1, 1, dfcclInt64, dfcclSum, comm, NULL) != dfcclSuccess)
		RANK_FAIL("submit: %s", dfcclGetLastError(NULL));
	char b = 'r';
	if (write(j->ready_fd, &b, 1) != 1)
		RANK_FAIL("ready pipe");
	if (rank != ADVISED && dfcclCommSynchronize(comm) != dfcclAborted)
		RANK_FAIL("the hanging all-reduce ended with '%s', expected dfcclAborted", dfcclGetLastError(NULL));
	dfcclResult_t ae = await_error(comm);
	char pattern[512];
	snprintf(pattern, sizeof(pattern), "communicator {n}: dfcclctl (pid {n}, uid %u) revoked it from outside and "
	         "advises shrinking it without rank 2 (dfcclCommGetShrinkAdvice); %s", (unsigned)getuid(),
	         rank == ADVISED ? "this rank is excluded: leave the communicator with dfcclCommDestroy or dfcclCommAbort"
	                         : "the other ranks call dfcclCommShrink with exactly those ranks");
	if (ae != dfcclAborted || !text_matches(dfcclGetLastError(NULL), pattern))
		RANK_FAIL("async error %d: '%s' is not '%s'", ae, dfcclGetLastError(NULL), pattern);
	if (dfcclCommGetShrinkAdvice(comm, advice, 4, &n) != dfcclSuccess || n != 1 || advice[0] != ADVISED ||
	    advice[1] != -1)
		RANK_FAIL("advice: %d ranks, first %d, then %d", n, advice[0], advice[1]);
	if (dfcclCommGetShrinkAdvice(comm, NULL, 0, &n) != dfcclSuccess || n != 1)
		RANK_FAIL("the advice's count alone: %d", n);
	if (rank == ADVISED) {
		if (dfcclCommShrink(comm, advice, n, &small, NULL, DFCCL_SHRINK_DEFAULT) != dfcclInvalidArgument ||
		    !strstr(dfcclGetLastError(NULL), "rank 2 is excluded by the shrink advice"))
			RANK_FAIL("the excluded rank's shrink: '%s'", dfcclGetLastError(NULL));
	} else {
		int flags = rank == 3 ? DFCCL_SHRINK_ABORT : DFCCL_SHRINK_DEFAULT, me = -1, count = 0;
		if (dfcclCommShrink(comm, advice, n, &small, NULL, flags) != dfcclSuccess)
			RANK_FAIL("shrink with the advice: %s", dfcclGetLastError(NULL));
		if (dfcclCommCount(small, &count) != dfcclSuccess || count != 3 ||
		    dfcclCommUserRank(small, &me) != dfcclSuccess || me != rank - (rank > ADVISED))
			RANK_FAIL("shrunk communicator: rank %d of %d", me, count);
		const int olds[] = {0, 1, 3};
		if (checked_allreduces(small, olds, 20, rank))
			return 1;
		if (dfcclCommDestroy(small) != dfcclSuccess)
			RANK_FAIL("destroy the shrunk communicator: %s", dfcclGetLastError(NULL));
	}
	dfcclMemFree(buf);
	if (read(j->go_fd, &b, 1) != 1)
		RANK_FAIL("go pipe");
	dfcclCommDestroy(comm);
	return 0;
}

/* dfcclctl with args; its exit status must be rc and its output hold want. */
static void ctl_expect(struct daemon_proc *d, int uid, int rc, const char *want, const char *const *args)
{
	char out[2048];
	int got = ctl_as(d, uid, out, sizeof(out), args);
	if (got != rc || !strstr(out, want))
		fail_msg("dfcclctl %s %s: exit %d, '%s'; expected exit %d and '%s'", args[0], args[1] ? args[1] : "", got,
		         out, rc, want);
}

static void test_operator_shrink(void **state)
{
	struct daemon_proc *d = *state;
	struct job j = {.nranks = 4};
	assert_int_equal(dfcclGetUniqueId(&j.id), dfcclSuccess);
	int ready[2], go[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	j.ready_fd = ready[1];
	j.go_fd = go[0];
	j.go_wr = go[1];
	pid_t p[4];
	for (int r = 0; r < 4; r++)
		p[r] = child_run(advised_rank, &j, r);
	for (int r = 0; r < 4; r++) {
		char b;
		assert_int_equal(read(ready[0], &b, 1), 1);
	}
	uint64_t id = only_comm(d);
	char ids[32], other[32];
	snprintf(ids, sizeof(ids), "%llu", (unsigned long long)id);
	snprintf(other, sizeof(other), "%llu", (unsigned long long)id + 1000);
	/* Refused, each with a reason, and the communicator untouched. */
	ctl_expect(d, -1, 2, "shrink takes --exclude RANKS", (const char *[]){"shrink", ids, NULL});
	ctl_expect(d, -1, 2, "--exclude takes ranks", (const char *[]){"shrink", ids, "--exclude", "two", NULL});
	ctl_expect(d, -1, 2, "--exclude goes with shrink", (const char *[]){"abort", ids, "--exclude", "2", NULL});
	ctl_expect(d, -1, 1, "rank 4 is outside 0..3", (const char *[]){"shrink", ids, "--exclude", "4", NULL});
	ctl_expect(d, -1, 1, "rank 1 is excluded twice", (const char *[]){"shrink", ids, "--exclude", "1,1", NULL});
	ctl_expect(d, -1, 1, "leaves nobody", (const char *[]){"shrink", ids, "--exclude", "3,2,1,0", NULL});
	ctl_expect(d, -1, 1, "does not exist", (const char *[]){"shrink", other, "--exclude", "2", NULL});
	if (geteuid() == 0)
		ctl_expect(d, 65534, 1, "another user's", (const char *[]){"shrink", ids, "--exclude", "2", NULL});
	dfccl_envelope *q = daemon_query(d, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
	assert_non_null(q);
	assert_string_equal(q->query_reply->comms[0]->state, "ready");
	assert_int_equal(q->query_reply->comms[0]->n_shrink_exclude, 0);
	frame_envelope_free(q);

	char want[160];
	snprintf(want, sizeof(want), "communicator %s aborted: its ranks are advised to shrink it without rank 2\n", ids);
	ctl_expect(d, -1, 0, want, (const char *[]){"shrink", ids, "--exclude", "2", NULL});
	/* The advice stays with the communicator while its ranks hold it
	 * (beside the shrunk one, once the survivors made it). */
	q = daemon_query(d, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
	assert_non_null(q);
	const Dfccl__V1__CommInfo *ci = NULL;
	for (size_t i = 0; i < q->query_reply->n_comms; i++)
		if (q->query_reply->comms[i]->comm_id == id)
			ci = q->query_reply->comms[i];
	assert_non_null(ci);
	assert_string_equal(ci->state, "aborted");
	assert_int_equal(ci->n_shrink_exclude, 1);
	assert_int_equal(ci->shrink_exclude[0], ADVISED);
	frame_envelope_free(q);
	ctl_expect(d, -1, 0, "aborted (shrink without 2)", (const char *[]){"comms", NULL});
	ctl_expect(d, -1, 0, "\"shrink_exclude\"", (const char *[]){"--json", "comms", NULL});
	for (int r = 0; r < 4; r++)
		assert_int_equal(write(go[1], "g", 1), 1);
	for (int r = 0; r < 4; r++)
		assert_int_equal(child_wait(p[r], 30000), 0);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_shrink_after_kill, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_revoke, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_split, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_nonblocking_init, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_grow, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_operator_abort, daemon_setup2, daemon_teardown),
	    cmocka_unit_test_setup_teardown(test_operator_shrink, daemon_setup2, daemon_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
