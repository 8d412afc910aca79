/*
 * Properties of the ring and tree algorithms both engines run (gpu/algo.h)
 * over random plans -- random rings, random trees with up to 7 children
 * per node, 2 to 64 ranks -- for every collective and algorithm, element
 * sizes 1 to 8, counts from 0 to several pipelined slices, every root, the
 * whole collective (host engine) or one part of it (a daemon-kernel
 * channel, with its smaller connector):
 *   - every step of every rank passes algo_step_valid (sources and
 *     destination within the buffers the collective owns, the destination
 *     the rank's own, waits on real ranks and phases);
 *   - no set of waits is circular: the graph whose nodes are (rank, step)
 *     and whose edges go from a step to the steps it waits for (and to the
 *     rank's previous step) has no cycle, so the instance cannot deadlock;
 *   - each connector half a step writes is read only by steps that
 *     finished before the writer writes it again (checked by simulating
 *     the instance in the order the waits allow, with reads and writes
 *     stamped per half).
 * test_parts_data runs every part of a collective over host arrays in an
 * order the waits allow and compares the results with references computed
 * directly: the parts of a split cover every element once, blocked
 * buffers (all-gather, reduce-scatter) included.
 * The engines' data results are checked in test_host_engine and the GPU
 * tests; this file checks shapes no data test would cover (64 ranks, odd
 * trees).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "algo.h"
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
	struct algo_run a[DFCCL_COMM_MAX_RANKS];
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
	uint64_t half_elems = in->a[0].conn_bytes / 2 / in->a[0].dsize;
	uint32_t remaining = in->n;
	while (remaining) {
		/* the ranks whose next step may run; one of them, at random, does */
		uint32_t ready_ranks[DFCCL_COMM_MAX_RANKS], nready = 0;
		struct algo_step steps[DFCCL_COMM_MAX_RANKS];
		for (uint32_t r = 0; r < in->n; r++) {
			if (done[r] == in->nsteps)
				continue;
			algo_step_get(&in->a[r], done[r], &steps[r]);
			int ready = 1;
			for (uint32_t k = 0; k < steps[r].nwait && ready; k++)
				ready = done[steps[r].wait[k]] >= steps[r].phase[k];
			if (ready)
				ready_ranks[nready++] = r;
		}
		if (nready == 0)
			fail_msg("deadlock: %u ranks cannot move", remaining);
		uint32_t r = ready_ranks[rnd(nready)];
		const struct algo_step *s = &steps[r];
		if (s->nsrc && s->elems) {
			for (uint32_t k = 0; k < s->nsrc; k++) {
				if (s->src[k].kind != ALGO_BUF_CONN)
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
			if (s->dst.kind == ALGO_BUF_CONN) {
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

/* A random plan for n ranks into topo, a random collective and algorithm;
 * whether that algorithm runs that collective. */
static int random_case(struct algo_topo *topo, uint32_t n, uint8_t *op, uint8_t *algo)
{
	struct dfccl_comm_plan plan;
	random_plan(&plan, n);
	assert_int_equal(algo_topo_load(topo, &plan, n), 0);
	*op = colls[rnd(sizeof(colls))];
	*algo = algos[rnd(sizeof(algos))];
	return algo_runs(*op, *algo);
}

static void test_properties(void **state)
{
	(void)state;
	static struct inst in;
	static struct algo_topo topo;
	unsigned instances = 0;
	for (unsigned iter = 0; iter < 400; iter++) {
		uint32_t n = iter % 5 == 0 ? 2 + rnd(63) : 2 + rnd(9);
		uint8_t op, algo;
		if (!random_case(&topo, n, &op, &algo))
			continue;
		uint32_t dsize = dsizes[rnd(4)];
		/* small, then up to about four connector halves or broadcast slices
		 * per part; fewer elements for many ranks to keep it quick */
		uint64_t slice = (op == DFCCL_OP_BROADCAST ? ALGO_SLICE_BYTES : DFCCL_COMM_CONN_HALF) / dsize;
		uint64_t count = rnd(3) == 0 ? rnd(2 * n) : rnd((uint32_t)(n > 16 ? slice : 4 * slice * 4));
		uint32_t root = rnd(n);
		assert_int_equal(algo_choose(&topo, op, count, dsize, algo, 0), algo);
		/* Half of the instances: one part of the collective, as a channel
		 * of the daemon kernel runs it. */
		uint32_t parts = rnd(2) ? 1 + rnd(DFCCL_COMM_MAX_CHANNELS) : 1, part = rnd(parts);
		uint64_t base = part * count / parts, len = (part + 1) * count / parts - base;
		uint32_t conn = DFCCL_COMM_CONN_BYTES / parts / 32 * 32;
		in.n = n;
		for (uint32_t r = 0; r < n; r++)
			assert_int_equal(algo_init(&in.a[r], &topo, algo, op, 0, r, root, count, base, len, dsize, conn), 0);
		in.nsteps = in.a[0].nsteps;
		for (uint32_t r = 0; r < n; r++) {
			assert_int_equal(in.a[r].nsteps, in.nsteps); /* every rank the same steps */
			for (uint32_t i = 0; i < in.nsteps; i++) {
				struct algo_step s;
				algo_step_get(&in.a[r], i, &s);
				if (!algo_step_valid(&in.a[r], &s))
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
	struct algo_topo topo;
	random_plan(&plan, 4);
	assert_int_equal(algo_topo_load(&topo, &plan, 4), 0);
	struct algo_run a;
	assert_int_equal(algo_init(&a, &topo, DFCCL_ALGO_RING, DFCCL_OP_REDUCE, 0, 1, 0, 100, 0, 100, 4,
	                           DFCCL_COMM_CONN_BYTES),
	                 0);
	struct algo_step s;
	algo_step_get(&a, 0, &s);
	assert_true(algo_step_valid(&a, &s));
	struct algo_step bad = s;
	bad.wait[0] = 9, bad.nwait = 1;
	assert_false(algo_step_valid(&a, &bad));
	bad = s;
	bad.nsrc = 1, bad.elems = 10, bad.src[0] = (struct algo_buf){2, ALGO_BUF_SEND, 95};
	bad.dst = (struct algo_buf){1, ALGO_BUF_CONN, 0};
	assert_false(algo_step_valid(&a, &bad)); /* past the send buffer's 100 */
	bad.src[0].off = 90;
	assert_true(algo_step_valid(&a, &bad));
	bad.dst = (struct algo_buf){1, ALGO_BUF_RECV, 0}; /* rank 1 is no root: no receive buffer */
	assert_false(algo_step_valid(&a, &bad));
	bad.dst = (struct algo_buf){2, ALGO_BUF_CONN, 0}; /* another rank's connector */
	assert_false(algo_step_valid(&a, &bad));
	/* a plan whose ring repeats a rank is refused, and the defaults are used */
	plan.ring[1] = plan.ring[0];
	assert_int_equal(algo_topo_load(&topo, &plan, 4), -EINVAL);
	assert_int_equal(topo.planned, 0);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(topo.ring[i], i);
}

/* ------------------------------------------------------------------ data over parts */

#define DT_MAX_RANKS 9u
#define DT_MAX_PARTS 5u

/* Every rank's buffers of one collective of uint64 elements, and a
 * connector per rank and part. */
struct dt_bufs {
	uint64_t *send[DT_MAX_RANKS], *recv[DT_MAX_RANKS];
	uint64_t *conn[DT_MAX_RANKS][DT_MAX_PARTS];
};

static uint64_t *dt_at(struct dt_bufs *b, uint32_t part, const struct algo_buf *x)
{
	switch (x->kind) {
	case ALGO_BUF_SEND: return b->send[x->rank] + x->off;
	case ALGO_BUF_RECV: return b->recv[x->rank] + x->off;
	default: return b->conn[x->rank][part] + x->off;
	}
}

/* Runs every part of every rank to the end, a ready step at a time (a
 * step is ready when its waits are met within its part). Sum only: exact
 * in any order. */
static void dt_run(struct algo_run a[DT_MAX_PARTS][DT_MAX_RANKS], uint32_t parts, uint32_t n, struct dt_bufs *b)
{
	uint32_t done[DT_MAX_PARTS][DT_MAX_RANKS] = {{0}};
	for (int moved = 1; moved;) {
		moved = 0;
		for (uint32_t p = 0; p < parts; p++)
			for (uint32_t r = 0; r < n; r++) {
				if (done[p][r] == a[p][r].nsteps)
					continue;
				struct algo_step s;
				algo_step_get(&a[p][r], done[p][r], &s);
				assert_true(algo_step_valid(&a[p][r], &s));
				int ready = 1;
				for (uint32_t k = 0; k < s.nwait; k++)
					ready = ready && done[p][s.wait[k]] >= s.phase[k];
				if (!ready)
					continue;
				if (s.nsrc && s.elems) {
					uint64_t *dst = dt_at(b, p, &s.dst);
					for (uint64_t i = 0; i < s.elems; i++) {
						uint64_t v = dt_at(b, p, &s.src[0])[i];
						for (uint32_t k = 1; k < s.nsrc && s.reduce; k++)
							v += dt_at(b, p, &s.src[k])[i];
						dst[i] = v;
					}
				}
				done[p][r]++;
				moved = 1;
			}
	}
	for (uint32_t p = 0; p < parts; p++)
		for (uint32_t r = 0; r < n; r++)
			assert_int_equal(done[p][r], a[p][r].nsteps);
}

static void test_parts_data(void **state)
{
	(void)state;
	static struct algo_run a[DT_MAX_PARTS][DT_MAX_RANKS];
	static struct algo_topo topo;
	unsigned checked = 0;
	for (unsigned iter = 0; iter < 300; iter++) {
		uint32_t n = 2 + rnd(DT_MAX_RANKS - 1), parts = 1 + rnd(DT_MAX_PARTS), root = rnd(n);
		uint8_t op, algo;
		if (!random_case(&topo, n, &op, &algo))
			continue;
		/* small connectors, so reduce and reduce-scatter pipeline */
		uint32_t conn = 32u << rnd(4);
		uint64_t count = rnd(4) == 0 ? rnd(2 * parts) : rnd(200);
		struct dt_bufs b;
		memset(&b, 0, sizeof(b));
		uint64_t sendn = 0, recvn = 0;
		for (uint32_t r = 0; r < n; r++) {
			assert_int_equal(sqe_buf_elems(op, count, n, r == root, &sendn, &recvn), 0);
			b.send[r] = calloc(sendn + 1, 8);
			b.recv[r] = calloc(recvn + 1, 8);
			for (uint64_t i = 0; i < sendn; i++)
				b.send[r][i] = ((uint64_t)r << 32) + i * 7 + 1;
			for (uint64_t i = 0; i < recvn; i++)
				b.recv[r][i] = 0xdeadull;
			for (uint32_t p = 0; p < parts; p++)
				b.conn[r][p] = calloc(conn / 8, 8);
		}
		for (uint32_t p = 0; p < parts; p++) {
			uint64_t lo = p * count / parts, hi = (p + 1) * count / parts;
			for (uint32_t r = 0; r < n; r++)
				assert_int_equal(algo_init(&a[p][r], &topo, algo, op, 0, r, root, count, lo, hi - lo, 8, conn), 0);
		}
		dt_run(a, parts, n, &b);
		/* the references, from the send buffers' formula */
		for (uint32_t r = 0; r < n; r++) {
			assert_int_equal(sqe_buf_elems(op, count, n, r == root, &sendn, &recvn), 0);
			for (uint64_t i = 0; i < recvn; i++) {
				uint64_t want = 0;
				switch (op) {
				case DFCCL_OP_ALLREDUCE:
				case DFCCL_OP_REDUCE:
					for (uint32_t q = 0; q < n; q++)
						want += ((uint64_t)q << 32) + i * 7 + 1;
					break;
				case DFCCL_OP_REDUCESCATTER:
					for (uint32_t q = 0; q < n; q++)
						want += ((uint64_t)q << 32) + ((uint64_t)r * count + i) * 7 + 1;
					break;
				case DFCCL_OP_ALLGATHER: want = ((i / count) << 32) + (i % count) * 7 + 1; break;
				default: /* DFCCL_OP_BROADCAST */ want = ((uint64_t)root << 32) + i * 7 + 1; break;
				}
				if (b.recv[r][i] != want)
					fail_msg("op %u algo %u n %u parts %u count %llu conn %u root %u: rank %u element %llu is %llx, "
					         "expected %llx",
					         op, algo, n, parts, (unsigned long long)count, conn, root, r, (unsigned long long)i,
					         (unsigned long long)b.recv[r][i], (unsigned long long)want);
			}
			assert_int_equal(b.recv[r][recvn], 0); /* nothing past the end */
		}
		for (uint32_t r = 0; r < n; r++) {
			free(b.send[r]);
			free(b.recv[r]);
			for (uint32_t p = 0; p < parts; p++)
				free(b.conn[r][p]);
		}
		checked++;
	}
	print_message("%u split collectives checked\n", checked);
	assert_true(checked > 100);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_properties),
	    cmocka_unit_test(test_validity_check),
	    cmocka_unit_test(test_parts_data),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
