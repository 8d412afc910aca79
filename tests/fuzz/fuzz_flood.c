/*
 * Fuzz target for the host engine's admission (gpu/host/host_engine.c),
 * behind the worker's interface: the input is the script of a hostile node,
 * many queue pairs of many sessions of three users on two engines, flooded
 * with entries
 * (all-reduces on communicators whose peers may never post, and garbage),
 * communicators aborted, queue pairs going away and coming back, between
 * engine polls.
 *
 * After every step neither engine holds more tasks than its task queue, nor
 * more task storage, nor more than its three users' limits allow. At the end every communicator is aborted and every
 * queue pair removed: both engines must then be empty and have given their
 * task storage back (and ASan sees every allocation freed).
 *
 * Script: byte 0 sets max-inflight and max-inflight-uid; then one operation
 * per byte, its low
 * three bits the kind and its high bits the queue pair or communicator,
 * some followed by argument bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dfccl_comm.h"
#include "host_engine.h"
#include "queue.h"

#define NENG 2u
#define NQP 16u       /* queue pair k: engine k % 2, session 100 + k, uid (k / 2) % NUID */
#define NUID 3u
#define NCOMM 8u      /* communicator c: ranks on queue pairs 2c (engine 0) and 2c + 1 (engine 1) */
#define QN 64u        /* small, so floods wrap the submission queues */
#define REG_BYTES 4096u

struct qp {
	void *map;
	struct sq_queue q;
	uint64_t comm_seq; /* the rank's next sequence on its communicator */
	int open;
};

static struct sq_reg regs[NQP]; /* registration k + 1 belongs to session 100 + k */

static const struct sq_reg *reg_lookup(void *ctx, uint32_t id)
{
	(void)ctx;
	return id >= 1 && id <= NQP ? &regs[id - 1] : NULL;
}

struct node {
	const struct engine_ops *ops;
	void *eng[NENG];
	struct qp qps[NQP];
	void *regions[NCOMM];
};

static uint64_t session_of(unsigned k)
{
	return 100u + k;
}

static int qp_open(struct node *n, unsigned k)
{
	struct qp *p = &n->qps[k];
	size_t size = DFCCL_QP_REGION_SIZE(QN);
	p->map = aligned_alloc(4096, size);
	if (!p->map)
		return -1;
	memset(p->map, 0, size);
	queue_header_init(p->map, k + 1, k % NENG, QN);
	char err[128];
	if (sq_queue_open(&p->q, p->map, size, k + 1, session_of(k), err, sizeof(err)) < 0)
		abort();
	p->q.uid = (k / 2) % NUID;
	if (n->ops->qp_add(n->eng[k % NENG], &p->q, err, sizeof(err)) < 0)
		abort();
	p->open = 1;
	return 0;
}

static void qp_close(struct node *n, unsigned k)
{
	struct qp *p = &n->qps[k];
	if (!p->open)
		return;
	n->ops->qp_del(n->eng[k % NENG], &p->q);
	sq_queue_close(&p->q);
	free(p->map);
	p->open = 0;
	p->comm_seq = 0;
}

static void comm_add(struct node *n, unsigned c)
{
	size_t size = DFCCL_COMM_REGION_SIZE(2);
	struct dfccl_comm_header *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE,
	                                   -1, 0);
	if (h == MAP_FAILED)
		abort();
	h->magic = DFCCL_COMM_MAGIC;
	h->comm_id = c + 1;
	h->nranks = 2;
	h->header_size = sizeof(*h);
	h->region_size = size;
	n->regions[c] = h;
	struct engine_member m[2] = {{.rank = 0, .device = 0, .session_id = session_of(2 * c)},
	                             {.rank = 1, .device = 1, .session_id = session_of(2 * c + 1)}};
	char err[128];
	for (unsigned e = 0; e < NENG; e++)
		if (n->ops->comm_add(n->eng[e], c + 1, 2, m, h, size, err, sizeof(err)) < 0)
			abort();
}

/* The client's side, as a hostile client may do it: reserve, write, arm,
 * whether or not the engine took the slot's previous entry. */
static void submit(struct qp *p, const struct dfccl_sqe *tmpl)
{
	uint64_t seq = ++p->q.hdr->sq_tail;
	struct dfccl_sqe *e = &p->q.sq[(seq - 1) % QN];
	memcpy((char *)e + sizeof(e->arm), (const char *)tmpl + sizeof(tmpl->arm), sizeof(*e) - sizeof(e->arm));
	e->seq = seq;
	__atomic_store_n(&e->arm, seq, __ATOMIC_RELEASE);
}

static void submit_allreduce(struct qp *p, unsigned k, uint8_t count)
{
	struct dfccl_sqe e = {.comm_id = k / 2 + 1, .comm_seq = ++p->comm_seq, .count = count % 64 + 1,
	                      .send_reg = k + 1, .recv_reg = k + 1, .opcode = DFCCL_OP_ALLREDUCE, .dtype = 2,
	                      .rank = k % 2};
	submit(p, &e);
}

static void check_bounds(const struct node *n, uint32_t max_uid)
{
	for (unsigned e = 0; e < NENG; e++)
		if (host_engine_pending(n->eng[e]) > SCHED_MAX_TASKS || host_engine_capacity(n->eng[e]) > SCHED_MAX_TASKS ||
		    host_engine_pending(n->eng[e]) > NUID * max_uid)
			abort();
}

static void poll_all(struct node *n, unsigned times)
{
	while (times--)
		for (unsigned e = 0; e < NENG; e++)
			n->ops->poll(n->eng[e]);
}

/* Aborts every communicator, removes every queue pair; the engines must
 * be empty and small again. Frees everything. */
static void finish(struct node *n)
{
	for (unsigned c = 0; c < NCOMM; c++)
		for (unsigned e = 0; e < NENG; e++)
			n->ops->comm_abort(n->eng[e], c + 1, DFCCL_CQ_ABORTED);
	poll_all(n, 4);
	for (unsigned k = 0; k < NQP; k++)
		qp_close(n, k);
	for (unsigned e = 0; e < NENG; e++) {
		if (host_engine_pending(n->eng[e]) != 0 || host_engine_capacity(n->eng[e]) > 64)
			abort();
		for (unsigned c = 0; c < NCOMM; c++)
			n->ops->comm_del(n->eng[e], c + 1);
		n->ops->free(n->eng[e]);
	}
	for (unsigned c = 0; c < NCOMM; c++)
		munmap(n->regions[c], DFCCL_COMM_REGION_SIZE(2));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t buffers[NQP][REG_BYTES];
	if (size == 0)
		return 0;
	for (unsigned k = 0; k < NQP; k++)
		regs[k] = (struct sq_reg){.reg_id = k + 1, .session_id = session_of(k), .size = REG_BYTES,
		                          .base = buffers[k]};
	struct node n = {0};
	/* Short spins: a blocked task costs little, so many inputs run. */
	struct engine_config cfg = {.sched = {.spin_head = 64, .spin_other = 4, .stick_mult = 4, .spin_max = 1024},
	                            .reg_lookup = reg_lookup,
	                            .max_inflight = data[0] % SCHED_MAX_INFLIGHT + 1,
	                            .max_inflight_uid = data[0] * 7u % (2 * SCHED_MAX_INFLIGHT) + 1};
	for (unsigned e = 0; e < NENG; e++) {
		cfg.device = e;
		if (host_engine_ops_new(&cfg, &n.ops, &n.eng[e]) < 0)
			abort();
	}
	for (unsigned k = 0; k < NQP; k++)
		qp_open(&n, k);
	for (unsigned c = 0; c < NCOMM; c++)
		comm_add(&n, c);
	for (size_t i = 1; i < size; i++) {
		unsigned op = data[i] & 7u, arg = data[i] >> 3;
		unsigned k = arg % NQP;
		struct qp *p = &n.qps[k];
		uint8_t next = i + 1 < size ? data[i + 1] : 0;
		switch (op) {
		case 0: /* a flood of all-reduces its peer may never join */
			for (unsigned r = 0; r < (unsigned)next * 8u && p->open; r++)
				submit_allreduce(p, k, (uint8_t)r);
			i++;
			break;
		case 1: /* one all-reduce */
			if (p->open)
				submit_allreduce(p, k, next);
			break;
		case 2: { /* garbage: the rest of the input, as far as an entry goes */
			struct dfccl_sqe e;
			size_t left = size - i - 1, take = left < sizeof(e) ? left : sizeof(e);
			memset(&e, 0, sizeof(e));
			memcpy(&e, data + i + 1, take);
			if (p->open)
				submit(p, &e);
			i += take;
			break;
		}
		case 3: case 4: /* the engines run */
			poll_all(&n, next % 8u + 1);
			i++;
			break;
		case 5: /* a communicator is aborted */
			for (unsigned e = 0; e < NENG; e++)
				n.ops->comm_abort(n.eng[e], arg % NCOMM + 1, DFCCL_CQ_ABORTED);
			break;
		case 6: /* a session goes away, another comes */
			qp_close(&n, k);
			qp_open(&n, k);
			break;
		default: /* both ranks of a communicator post, so it can complete */
			if (n.qps[2 * (arg % NCOMM)].open && n.qps[2 * (arg % NCOMM) + 1].open) {
				submit_allreduce(&n.qps[2 * (arg % NCOMM)], 2 * (arg % NCOMM), next);
				submit_allreduce(&n.qps[2 * (arg % NCOMM) + 1], 2 * (arg % NCOMM) + 1, next);
			}
			break;
		}
		check_bounds(&n, cfg.max_inflight_uid);
	}
	poll_all(&n, 16);
	check_bounds(&n, cfg.max_inflight_uid);
	finish(&n);
	return 0;
}
