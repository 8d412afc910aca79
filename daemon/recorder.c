/*
 * See recorder.h. Each rank's entries form a ring in one array; lookups
 * walk a rank's ring from the newest entry back, which finds the entries the
 * watcher asks about (the ones still pending) within a few steps.
 */
#include "recorder.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "pb_json.h"
#include "queue.h"

static void recorder_free(struct recorder *r)
{
	if (!r)
		return;
	free(r->members);
	free(r->head);
	free(r->used);
	free(r->entries);
	free(r);
}

struct recorder *recorder_find(struct recorder_table *t, uint64_t comm_id)
{
	for (struct recorder *r = t->list; r; r = r->next)
		if (r->comm_id == comm_id)
			return r;
	return NULL;
}

static struct recorder *recorder_new(const struct recorder_table *t, const struct comm *c)
{
	struct recorder *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->comm_id = c->id;
	r->uid = c->uid;
	r->nranks = c->nranks;
	r->created_ms = c->created_ms;
	r->cap = t->cap;
	r->members = calloc(c->nranks, sizeof(*r->members));
	r->head = calloc(c->nranks, sizeof(*r->head));
	r->used = calloc(c->nranks, sizeof(*r->used));
	r->entries = calloc((size_t)c->nranks * t->cap, sizeof(*r->entries));
	if (!r->members || !r->head || !r->used || !r->entries) {
		recorder_free(r);
		return NULL;
	}
	return r;
}

struct recorder *recorder_get(struct recorder_table *t, const struct comm *c)
{
	if (t->cap == 0)
		return NULL;
	struct recorder *r = recorder_find(t, c->id);
	if (!r) {
		r = recorder_new(t, c);
		if (!r)
			return NULL;
		r->next = t->list;
		t->list = r;
	}
	/* A member that left keeps its last pid and device. */
	for (uint32_t i = 0; i < c->nranks; i++) {
		const struct comm_member *m = &c->members[i];
		if (m->state == MEMBER_JOINING || m->state == MEMBER_ACTIVE)
			r->members[i] = (struct rec_member){.device = m->device, .pid = m->pid, .session_id = m->session_id};
	}
	snprintf(r->state, sizeof(r->state), "%s", comm_state_name(c->state));
	return r;
}

int64_t recorder_rel(const struct recorder *r, uint64_t now_ms)
{
	return now_ms >= r->created_ms ? (int64_t)(now_ms - r->created_ms) : 0;
}

/* The k-th newest entry of rank (k = 0: the newest), k < used. */
static struct rec_entry *ring_at(const struct recorder *r, uint32_t rank, uint32_t k)
{
	uint32_t i = (r->head[rank] + r->cap - 1 - k) % r->cap;
	return &r->entries[(size_t)rank * r->cap + i];
}

struct rec_entry *recorder_note(struct recorder *r, uint32_t rank, uint32_t qp_id, uint64_t qp_seq,
                                const struct dfccl_sqe *e, uint64_t now_ms)
{
	if (rank >= r->nranks)
		return NULL;
	for (uint32_t k = 0; k < r->used[rank]; k++) {
		struct rec_entry *x = ring_at(r, rank, k);
		if (x->qp_id == qp_id && x->qp_seq == qp_seq)
			return x;
	}
	struct rec_entry *x = &r->entries[(size_t)rank * r->cap + r->head[rank]];
	r->head[rank] = (r->head[rank] + 1) % r->cap;
	if (r->used[rank] < r->cap)
		r->used[rank]++;
	*x = (struct rec_entry){
	    .qp_id = qp_id,
	    .qp_seq = qp_seq,
	    .seq = e->comm_seq,
	    .count = e->count,
	    .peer = e->peer,
	    .opcode = e->opcode,
	    .dtype = e->dtype,
	    .algo = e->algo,
	    .submit_ms = recorder_rel(r, now_ms),
	    .start_ms = -1,
	    .end_ms = -1,
	};
	return x;
}

static int op_is_coll(uint32_t opcode)
{
	return opcode >= DFCCL_OP_ALLREDUCE && opcode <= DFCCL_OP_REDUCE;
}

struct rec_entry *recorder_find_coll(struct recorder *r, uint32_t rank, uint64_t seq)
{
	if (rank >= r->nranks)
		return NULL;
	for (uint32_t k = 0; k < r->used[rank]; k++) {
		struct rec_entry *x = ring_at(r, rank, k);
		if (x->seq == seq && op_is_coll(x->opcode))
			return x;
	}
	return NULL;
}

void recorder_sweep(struct recorder_table *t, int (*is_live)(void *arg, uint64_t comm_id), void *arg)
{
	uint32_t kept = 0;
	for (struct recorder **pp = &t->list; *pp;) {
		struct recorder *r = *pp;
		if (!r->gone && !is_live(arg, r->comm_id)) {
			r->gone = 1;
			snprintf(r->state, sizeof(r->state), "gone");
		}
		/* The list is newest first: the gone ones past `keep` are the oldest. */
		if (r->gone && ++kept > t->keep) {
			*pp = r->next;
			recorder_free(r);
			continue;
		}
		pp = &r->next;
	}
}

static const char *entry_status(const struct rec_entry *x)
{
	if (!x->ended)
		return "pending";
	if (x->status == DFCCL_CQ_OK)
		return "ok";
	if (x->status >= DFCCL_CQ_STATUS_COUNT_)
		return "ended (its status was overwritten before it was sampled)";
	return queue_status_string(x->status);
}

int recorder_dump(const struct recorder *r, uint32_t interval_ms, uint64_t now_ms, Dfccl__V1__FlightDumpReply *out)
{
	dfccl__v1__flight_dump_reply__init(out);
	out->comm_id = r->comm_id;
	out->uid = (uint32_t)r->uid;
	out->nranks = r->nranks;
	out->state = (char *)r->state;
	out->failure = (char *)r->failure;
	out->entries_per_rank = r->cap;
	out->interval_ms = interval_ms;
	out->missed = r->missed;
	out->age_ms = (uint64_t)recorder_rel(r, now_ms);
	size_t total = 0;
	for (uint32_t i = 0; i < r->nranks; i++)
		total += r->used[i];
	/* Pointer arrays and records each in one block. */
	out->ranks = calloc(r->nranks, sizeof(*out->ranks) + sizeof(Dfccl__V1__CommRank));
	out->records = calloc(total ? total : 1, sizeof(*out->records) + sizeof(Dfccl__V1__FlightRecord));
	if (!out->ranks || !out->records)
		return -ENOMEM;
	Dfccl__V1__CommRank *ranks = (Dfccl__V1__CommRank *)(out->ranks + r->nranks);
	for (uint32_t i = 0; i < r->nranks; i++) {
		dfccl__v1__comm_rank__init(&ranks[i]);
		ranks[i].rank = i;
		ranks[i].device = r->members[i].device;
		ranks[i].pid = r->members[i].pid;
		ranks[i].session_id = r->members[i].session_id;
		out->ranks[out->n_ranks++] = &ranks[i];
	}
	Dfccl__V1__FlightRecord *recs = (Dfccl__V1__FlightRecord *)(out->records + (total ? total : 1));
	for (uint32_t i = 0; i < r->nranks; i++) {
		for (uint32_t k = r->used[i]; k-- > 0;) {
			const struct rec_entry *x = ring_at(r, i, k);
			Dfccl__V1__FlightRecord *f = &recs[out->n_records];
			dfccl__v1__flight_record__init(f);
			f->rank = i;
			f->op = (char *)queue_op_name(x->opcode);
			f->seq = x->seq;
			f->count = x->count;
			f->dtype = (char *)queue_dtype_name(x->dtype);
			f->algo = (char *)queue_algo_name(x->algo);
			f->peer = x->peer;
			f->submit_ms = x->submit_ms;
			f->start_ms = x->start_ms;
			f->end_ms = x->end_ms;
			f->status = (char *)entry_status(x);
			out->records[out->n_records++] = f;
		}
	}
	return 0;
}

void recorder_dump_free(Dfccl__V1__FlightDumpReply *out)
{
	free(out->ranks);
	free(out->records);
	out->ranks = NULL;
	out->records = NULL;
	out->n_ranks = out->n_records = 0;
}

int recorder_write(const struct recorder *r, uint32_t interval_ms, uint64_t now_ms, const char *dir, char *path,
                   size_t pathlen)
{
	Dfccl__V1__FlightDumpReply d;
	int rc = recorder_dump(r, interval_ms, now_ms, &d);
	json_t *j = rc == 0 ? pb_json(&d.base) : NULL;
	recorder_dump_free(&d);
	if (!j)
		return rc < 0 ? rc : -ENOMEM;
	char tmp[512];
	snprintf(path, pathlen, "%s/comm-%" PRIu64 "-%lld.json", dir, r->comm_id, (long long)time(NULL));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	rc = json_dump_file(j, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0 ? 0 : -EIO;
	json_decref(j);
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0)
		unlink(tmp);
	return rc;
}

void recorder_table_free(struct recorder_table *t)
{
	while (t->list) {
		struct recorder *r = t->list;
		t->list = r->next;
		recorder_free(r);
	}
}
