/*
 * Properties of the host engine's ring and tree algorithms (gpu/host/
 * host_algo.h) over random plans -- random rings, random trees with up to
 * 7 children per node, 2 to 64 ranks -- for every collective and
 * algorithm, element sizes 1 to 8, counts from 0 to several pipelined
 * slices, every root:
 *   - every step of every rank passes host_algo_step_valid (sources and
 *     destination within the buffers the collective owns, the destination
 *     the rank's own, waits on real ranks and phases);
 *   - no set of waits is circular: the graph whose nodes are (rank, step)
 *     and whose edges go from a step to the steps it waits for (and to the
 *     rank's previous step) has no cycle, so the instance cannot deadlock;
 *   - each connector half a step writes is read only by steps that
 *     finished before the writer writes it again (checked by simulating
 *     the instance in the order the waits allow, with reads and writes
 *     stamped per half).
 * The engine's data results are checked in test_host_engine; this file
 * checks shapes no data test would cover (64 ranks, odd trees).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "host_algo.h"
#include "testutil.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(uint32_t below)
{
	return tu_rand(&rng, below);
}

static void random_plan(struct dfccl_comm_plan *p, uint32_t n)
{
	tu_random_plan(p, n, DFCCL_ALGO_DIRECT, &rng);
}

/* One instance: every rank's algorithm. */
struct inst {
	uint32_t n, nsteps;
	struct host_algo a[DFCCL_COMM_MAX_RANKS];
};

/* Simulates the instance: repeatedly runs the next step of a random rank
 * whose waits are met, so the interleavings vary. Fails when ranks remain
 * but none can move (a deadlock), or when a connector half is overwritten
 * before its reader read it. */
static void simulate(const struct inst *in)
{
	uint32_t done[DFCCL_COMM_MAX_RANKS] = {0}; /* steps finished per rank */
	/* Per rank and half: the step that wrote it last, and whether each
	 * reader of that write has finished reading it (by its step index). */
	int64_t written_at[DFCCL_COMM_MAX_RANKS][2];
	uint32_t pending_reads[DFCCL_COMM_MAX_RANKS][2];
	memset(written_at, 0xff, sizeof(written_at));
	memset(pending_reads, 0, sizeof(pending_reads));
	uint64_t half_elems = DFCCL_COMM_CONN_HALF / in->a[0].dsize;
	uint32_t remaining = in->n;
	while (remaining) {
		/* the ranks whose next step may run; one of them, at random, does */
		uint32_t ready_ranks[DFCCL_COMM_MAX_RANKS], nready = 0;
		struct host_algo_step steps[DFCCL_COMM_MAX_RANKS];
		for (uint32_t r = 0; r < in->n; r++) {
			if (done[r] == in->nsteps)
				continue;
			host_algo_step(&in->a[r], done[r], &steps[r]);
			int ready = 1;
			for (uint32_t k = 0; k < steps[r].nwait && ready; k++)
				ready = done[steps[r].wait[k]] >= steps[r].phase[k];
			if (ready)
				ready_ranks[nready++] = r;
		}
		if (nready == 0)
			fail_msg("deadlock: %u ranks cannot move", remaining);
		uint32_t r = ready_ranks[rnd(nready)];
		const struct host_algo_step *s = &steps[r];
		if (s->nsrc && s->elems) {
			for (uint32_t k = 0; k < s->nsrc; k++) {
				if (s->src[k].kind != HOST_BUF_CONN)
					continue;
				uint32_t q = s->src[k].rank, h = s->src[k].off >= half_elems;
				if (written_at[q][h] < 0)
					fail_msg("rank %u step %u reads rank %u's connector half %u before anything was written", r,
					         done[r], q, h);
				if (pending_reads[q][h] == 0)
					fail_msg("rank %u step %u reads rank %u's half %u, already read or overwritten", r, done[r], q,
					         h);
				pending_reads[q][h]--;
			}
			if (s->dst.kind == HOST_BUF_CONN) {
				uint32_t h = s->dst.off >= half_elems;
				if (pending_reads[r][h])
					fail_msg("rank %u step %u overwrites its connector half %u before it was read", r, done[r], h);
				written_at[r][h] = done[r];
				pending_reads[r][h] = 1; /* one reader: the next rank of a chain or the parent */
			}
		}
		done[r]++;
		remaining -= done[r] == in->nsteps;
	}
	for (uint32_t r = 0; r < in->n; r++)
		for (uint32_t h = 0; h < 2; h++)
			if (pending_reads[r][h])
				fail_msg("rank %u: connector half %u written but never read", r, h);
}

static const uint8_t colls[] = {DFCCL_OP_ALLREDUCE, DFCCL_OP_ALLGATHER, DFCCL_OP_REDUCESCATTER, DFCCL_OP_BROADCAST,
                                DFCCL_OP_REDUCE};
static const uint8_t algos[] = {DFCCL_ALGO_RING, DFCCL_ALGO_TREE, DFCCL_ALGO_MULTITREE};
static const uint32_t dsizes[] = {1, 2, 4, 8};

static void test_properties(void **state)
{
	(void)state;
	static struct inst in;
	static struct host_topo topo;
	unsigned instances = 0;
	for (unsigned iter = 0; iter < 400; iter++) {
		uint32_t n = iter % 5 == 0 ? 2 + rnd(63) : 2 + rnd(9);
		struct dfccl_comm_plan plan;
		random_plan(&plan, n);
		assert_int_equal(host_topo_load(&topo, &plan, n), 0);
		uint8_t op = colls[rnd(sizeof(colls))], algo = algos[rnd(sizeof(algos))];
		if (!host_algo_runs(op, algo))
			continue;
		uint32_t dsize = dsizes[rnd(4)];
		/* small, then up to about four connector halves or broadcast slices
		 * per part; fewer elements for many ranks to keep it quick */
		uint64_t slice = (op == DFCCL_OP_BROADCAST ? HOST_ALGO_SLICE_BYTES : DFCCL_COMM_CONN_HALF) / dsize;
		uint64_t count = rnd(3) == 0 ? rnd(2 * n) : rnd((uint32_t)(n > 16 ? slice : 4 * slice * 4));
		uint32_t root = rnd(n);
		assert_int_equal(host_algo_choose(&topo, op, count, dsize, algo, 0), algo);
		in.n = n;
		for (uint32_t r = 0; r < n; r++)
			host_algo_init(&in.a[r], &topo, algo, op, 0, r, root, count, dsize);
		in.nsteps = in.a[0].nsteps;
		for (uint32_t r = 0; r < n; r++) {
			assert_int_equal(in.a[r].nsteps, in.nsteps); /* every rank the same steps */
			for (uint32_t i = 0; i < in.nsteps; i++) {
				struct host_algo_step s;
				host_algo_step(&in.a[r], i, &s);
				if (!host_algo_step_valid(&in.a[r], &s))
					fail_msg("op %u algo %u n %u count %llu dsize %u root %u: rank %u step %u is out of bounds", op,
					         algo, n, (unsigned long long)count, dsize, root, r, i);
			}
		}
		simulate(&in);
		instances++;
	}
	print_message("%u instances checked\n", instances);
	assert_true(instances > 150);
}

/* The checks themselves catch what they should. */
static void test_validity_check(void **state)
{
	(void)state;
	struct dfccl_comm_plan plan;
	struct host_topo topo;
	random_plan(&plan, 4);
	assert_int_equal(host_topo_load(&topo, &plan, 4), 0);
	struct host_algo a;
	host_algo_init(&a, &topo, DFCCL_ALGO_RING, DFCCL_OP_REDUCE, 0, 1, 0, 100, 4);
	struct host_algo_step s;
	host_algo_step(&a, 0, &s);
	assert_true(host_algo_step_valid(&a, &s));
	struct host_algo_step bad = s;
	bad.wait[0] = 9, bad.nwait = 1;
	assert_false(host_algo_step_valid(&a, &bad));
	bad = s;
	bad.nsrc = 1, bad.elems = 10, bad.src[0] = (struct host_algo_buf){2, HOST_BUF_SEND, 95};
	bad.dst = (struct host_algo_buf){1, HOST_BUF_CONN, 0};
	assert_false(host_algo_step_valid(&a, &bad)); /* past the send buffer's 100 */
	bad.src[0].off = 90;
	assert_true(host_algo_step_valid(&a, &bad));
	bad.dst = (struct host_algo_buf){1, HOST_BUF_RECV, 0}; /* rank 1 is no root: no receive buffer */
	assert_false(host_algo_step_valid(&a, &bad));
	bad.dst = (struct host_algo_buf){2, HOST_BUF_CONN, 0}; /* another rank's connector */
	assert_false(host_algo_step_valid(&a, &bad));
	/* a plan whose ring repeats a rank is refused, and the defaults are used */
	plan.ring[1] = plan.ring[0];
	assert_int_equal(host_topo_load(&topo, &plan, 4), -EINVAL);
	assert_int_equal(topo.planned, 0);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(topo.ring[i], i);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_properties),
	    cmocka_unit_test(test_validity_check),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
