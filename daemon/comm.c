/*
 * See comm.h. A node holds few communicators (tens to thousands), so they
 * sit in one list and lookups walk it; membership lives in the communicator
 * (an array of nranks members), so a session's memberships are found by
 * walking the list too. Neither walk is on the data path.
 */
#include "comm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dfccl_comm.h"
#include "log.h"
#include "server.h"
#include "session.h"
#include "topo_plan.h"
#include "user.h"
#include "watch.h"
#include "workers.h"

#define EC(x) DFCCL__V1__ERROR_CODE__ERROR_##x
#define COMM_MAX_RANKS DFCCL_COMM_MAX_RANKS

_Static_assert(COMM_MAX_RANKS <= 64, "a shrink advice is a 64-bit mask of ranks");

const char *comm_state_name(enum comm_state st)
{
	switch (st) {
	case COMM_INITIALIZING: return "initializing";
	case COMM_ACTIVATING: return "activating";
	case COMM_EXCHANGING: return "exchanging";
	case COMM_READY: return "ready";
	case COMM_ABORTED: return "aborted";
	case COMM_PEER_LOST: return "peer-lost";
	case COMM_DEVICE_LOST: return "device-lost";
	case COMM_TIMED_OUT: return "timed-out";
	}
	return "?";
}

int comm_setting_up(const struct comm *c)
{
	return c->state == COMM_ACTIVATING || c->state == COMM_EXCHANGING;
}

/* Lets go of the blobs the workers of c exported. */
static void comm_blobs_free(struct comm *c)
{
	for (unsigned i = 0; i < c->nblobs; i++)
		free(c->blobs[i].data);
	free(c->blobs);
	c->blobs = NULL;
	c->nblobs = 0;
}

static void comm_unlink(struct server *srv, struct comm *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		srv->comms = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

static void comm_timer_closed(uv_handle_t *h)
{
	struct comm *c = h->data;
	free(c->members);
	free(c);
}

/* Unlinks and frees c (after its timer handle is closed). */
static void comm_free(struct comm *c)
{
	workers_comm_del(c->srv->workers, c->acks, c->id);
	if (c->region)
		munmap(c->region, c->region_size);
	if (c->region_fd >= 0)
		close(c->region_fd);
	c->region = NULL;
	c->region_fd = -1;
	comm_blobs_free(c);
	comm_unlink(c->srv, c);
	uv_timer_stop(&c->timer);
	uv_close((uv_handle_t *)&c->timer, comm_timer_closed);
}

struct comm *comm_find(struct server *srv, uint64_t id)
{
	for (struct comm *c = srv->comms; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

/* The member slot of session s in c, or -1. */
static int comm_rank_of(const struct comm *c, const struct session *s)
{
	for (uint32_t r = 0; r < c->nranks; r++)
		if ((c->members[r].state == MEMBER_JOINING || c->members[r].state == MEMBER_ACTIVE) &&
		    c->members[r].session == s)
			return (int)r;
	return -1;
}

/* Marks member r gone and frees the communicator once nobody is left. */
static void comm_member_leave(struct comm *c, uint32_t r)
{
	struct comm_member *m = &c->members[r];
	if (m->session && m->session->user)
		user_uncharge_comm(m->session->user);
	/* A rank that leaves before init completes may come back (a restarted
	 * process) and is missing until it does; after init a slot is final. */
	m->state = c->state == COMM_INITIALIZING ? MEMBER_EMPTY : MEMBER_LEFT;
	m->session = NULL;
	c->joined--;
	if (c->joined == 0)
		comm_free(c);
}

/* Tells every active member except `except` (a rank, or -1). */
static void comm_notify(struct comm *c, int except, int code, const char *msg)
{
	for (uint32_t r = 0; r < c->nranks; r++) {
		struct comm_member *m = &c->members[r];
		if ((int)r == except || m->state != MEMBER_ACTIVE)
			continue;
		session_send_notice(m->session, code, c->id, m->device, msg);
	}
}

/* The ready communicator c failed: every worker's tasks of it see `status`
 * in the region at their next wait, and the workers fail later entries. */
static void comm_break(struct comm *c, enum comm_state st, uint32_t status)
{
	c->state = st;
	if (c->region) {
		uint64_t zero = 0;
		atomic_compare_exchange_strong((_Atomic uint64_t *)&((struct dfccl_comm_header *)c->region)->aborted,
		                               &zero, (uint64_t)status);
	}
	for (uint32_t d = 0; d < 64; d++)
		if (c->acks & (1ull << d))
			workers_comm_abort(c->srv->workers, d, c->id, status);
}

void comm_fail(struct comm *c, enum comm_state st, uint32_t status, int code, const char *msg)
{
	if (c->state != COMM_READY)
		return;
	log_notice("comm", "%s", msg);
	comm_notify(c, -1, code, msg);
	comm_break(c, st, status);
}

uint64_t comm_coll_timeout_ms(const struct comm *c)
{
	uint64_t best = 0;
	for (uint32_t r = 0; r < c->nranks; r++) {
		int64_t t = c->members[r].coll_timeout_ms;
		uint64_t ms = t == 0 ? (uint64_t)c->srv->cfg.coll_timeout_ms : t > 0 ? (uint64_t)t : 0;
		if (ms && (!best || ms < best))
			best = ms;
	}
	return best;
}

/* "rank 2" or "ranks 1, 3" (noun "rank") of the bits of mask into buf. */
static void bits_text(const char *noun, uint64_t mask, char *buf, size_t len)
{
	size_t off = (size_t)snprintf(buf, len, "%s%s", noun, (mask & (mask - 1)) ? "s" : "");
	const char *sep = " ";
	for (uint32_t r = 0; r < 64 && off < len; r++) {
		if (!(mask & (1ull << r)))
			continue;
		off += (size_t)snprintf(buf + off, len - off, "%s%u", sep, r);
		sep = ", ";
	}
}

/* Why c, whose ranks all joined, is not ready yet: the devices whose
 * worker has not answered what it was handed. */
static void comm_setup_why(const struct comm *c, char *why, size_t len)
{
	int exchanging = c->state == COMM_EXCHANGING;
	char devs[300];
	bits_text("device", c->devices & ~(exchanging ? c->peer_acks : c->acks), devs, sizeof(devs));
	snprintf(why, len, "every rank joined, but no answer came from the daemon's worker for %s, taking %s", devs,
	         exchanging ? "what the communicator's other devices exported" : "the communicator");
}

static void comm_fail_init(struct comm *c, int code, const char *msg);

/* The ranks did not all join in time, or the workers did not all take c
 * in as long again (comm_activate restarts the timer). */
static void comm_init_timeout(uv_timer_t *t)
{
	struct comm *c = t->data;
	char missing[512] = "";
	size_t off = 0;
	unsigned nmissing = 0;
	for (uint32_t r = 0; r < c->nranks; r++) {
		if (c->members[r].state != MEMBER_EMPTY)
			continue;
		nmissing++;
		if (off < sizeof(missing) - 16)
			off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%u", off ? ", " : "", r);
		else if (off < sizeof(missing) - 1)
			off += (size_t)snprintf(missing + off, sizeof(missing) - off, "...");
	}
	uint64_t waited = server_now_ms() - c->created_ms;
	char why[700], msg[800];
	if (comm_setting_up(c))
		comm_setup_why(c, why, sizeof(why));
	else if (nmissing == 0)
		snprintf(why, sizeof(why),
		         "every rank joined, but the daemon's worker for device %d did not come up (see dfcclctl status)",
		         c->awaiting_device);
	else
		snprintf(why, sizeof(why),
		         "%u of %u ranks joined; missing rank%s %s (did every rank call dfcclCommInitRank with the same "
		         "unique id?)",
		         c->joined, c->nranks, nmissing == 1 ? "" : "s", missing);
	snprintf(msg, sizeof(msg), "communicator init timed out after %llu ms: %s", (unsigned long long)waited, why);
	comm_fail_init(c, EC(TIMEOUT), msg);
}

/* Answers every joining rank with error `code` and dissolves c. */
static void comm_fail_init(struct comm *c, int code, const char *msg)
{
	uv_timer_stop(&c->timer);
	log_notice("comm", "communicator %llu: init failed: %s", (unsigned long long)c->id, msg);
	for (uint32_t r = 0; r < c->nranks; r++)
		if (c->members[r].state == MEMBER_JOINING)
			session_reply_error(c->members[r].session, c->members[r].request_id, code, "%s", msg);
	/* Members that joined leave; the last one frees c. A slot emptied
	 * during activation must not count, so leave only the joined ones. */
	for (uint32_t r = 0; r < c->nranks && c->joined > 0; r++)
		if (c->members[r].state == MEMBER_JOINING)
			comm_member_leave(c, r);
}

/* The ranks of c as the protocol lists them (CommInitReply, WorkerCommAdd):
 * one allocation, freed with free(*rankp). Returns 0 or -ENOMEM. */
static int comm_rank_table(const struct comm *c, Dfccl__V1__CommRank ***rankp)
{
	/* The pointer array and the records in one block. */
	void *block = calloc(c->nranks, sizeof(Dfccl__V1__CommRank *) + sizeof(Dfccl__V1__CommRank));
	if (!block)
		return -ENOMEM;
	Dfccl__V1__CommRank **ptrs = block;
	Dfccl__V1__CommRank *ranks = (Dfccl__V1__CommRank *)(ptrs + c->nranks);
	for (uint32_t r = 0; r < c->nranks; r++) {
		dfccl__v1__comm_rank__init(&ranks[r]);
		ranks[r].rank = r;
		ranks[r].device = c->members[r].device;
		ranks[r].session_id = c->members[r].session_id;
		ranks[r].pid = c->members[r].pid;
		ptrs[r] = &ranks[r];
	}
	*rankp = ptrs;
	return 0;
}

/* Every worker took the communicator: answer the ranks. */
static void comm_finish_init(struct comm *c)
{
	uv_timer_stop(&c->timer);
	c->state = COMM_READY;
	comm_blobs_free(c);
	Dfccl__V1__CommRank **rankp;
	if (comm_rank_table(c, &rankp) < 0) {
		comm_fail_init(c, EC(RESOURCE), "out of memory completing communicator init");
		return;
	}
	log_info("comm", "communicator %llu ready: %u ranks (uid %u)", (unsigned long long)c->id, c->nranks,
	         (unsigned)c->uid);
	watch_comm_ready(c->srv->watch);
	for (uint32_t r = 0; r < c->nranks; r++) {
		struct comm_member *m = &c->members[r];
		Dfccl__V1__CommInitReply rep = DFCCL__V1__COMM_INIT_REPLY__INIT;
		rep.comm_id = c->id;
		rep.nranks = c->nranks;
		rep.rank = r;
		rep.n_ranks = c->nranks;
		rep.ranks = rankp;
		Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_COMM_INIT_REPLY;
		env.comm_init_reply = &rep;
		m->state = MEMBER_ACTIVE;
		session_reply(m->session, m->request_id, &env, NULL, 0);
	}
	free(rankp);
}

/*
 * Writes the communicator's plan (rings, trees, algorithm per size) from
 * the node's topology into its region, before any worker maps it. Without
 * one the engines run rank order, heap trees and direct algorithms, which
 * is correct anywhere, so a plan that cannot be computed is a warning.
 */
static void comm_plan_write(struct comm *c)
{
	struct server *srv = c->srv;
	if (!srv->topo)
		return;
	unsigned dev[DFCCL_COMM_MAX_RANKS];
	for (uint32_t r = 0; r < c->nranks; r++)
		dev[r] = c->members[r].device;
	char err[256];
	int rc = topo_plan_build(srv->topo, dev, c->nranks, &srv->select_params, srv->tuning_text, dfccl_comm_plan_of(c->region), err,
	                         sizeof(err));
	if (rc < 0)
		log_warn("comm", "communicator %016" PRIx64 ": no algorithm plan (%s); its collectives run direct in rank order",
		         c->id, err[0] ? err : strerror(-rc));
}

static int comm_region_create(struct comm *c)
{
	size_t size = DFCCL_COMM_REGION_SIZE(c->nranks);
	int fd = memfd_create("dfccl-comm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	void *p = MAP_FAILED;
	if (ftruncate(fd, (off_t)size) < 0 ||
	    (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		int e = errno;
		close(fd);
		return -e;
	}
	fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	struct dfccl_comm_header *h = p;
	h->magic = DFCCL_COMM_MAGIC;
	h->comm_id = c->id;
	h->nranks = c->nranks;
	h->header_size = sizeof(*h);
	h->region_size = size;
	c->region_fd = fd;
	c->region = p;
	c->region_size = size;
	comm_plan_write(c);
	return 0;
}

/* The first device of c whose worker is on its way up (starting, or
 * restarting after a fault), or -1 when every one serves or is gone. */
static int comm_device_coming(const struct comm *c)
{
	for (uint32_t r = 0; r < c->nranks; r++)
		if (workers_device_up(c->srv->workers, c->members[r].device) == 0)
			return (int)c->members[r].device;
	return -1;
}

static void comm_activate(struct comm *c);

/* The worker of `device` could not be handed c: the init fails. */
static void comm_fail_worker_down(struct comm *c, uint32_t device)
{
	char msg[200];
	snprintf(msg, sizeof(msg), "the daemon's worker for device %u is not running; retry the init", device);
	comm_fail_init(c, EC(DEVICE_LOST), msg);
}

/* Every rank joined: activate now, or once the workers its ranks need are
 * up (a job started right after the daemon, or after a worker fault),
 * within the init timeout that is still running. */
static void comm_try_activate(struct comm *c)
{
	c->awaiting_device = c->srv->workers ? comm_device_coming(c) : -1;
	if (c->awaiting_device >= 0) {
		log_info("comm", "communicator %llu: every rank joined; waiting for the worker of device %d",
		         (unsigned long long)c->id, c->awaiting_device);
		return;
	}
	comm_activate(c);
}

/* Every rank joined: create the shared region and hand it to the workers
 * of the devices the ranks are on. */
static void comm_activate(struct comm *c)
{
	struct server *srv = c->srv;
	/* The workers get as long as the ranks had: a worker that never
	 * answers must not leave the ranks waiting for good. */
	uv_timer_start(&c->timer, comm_init_timeout, c->init_timeout_ms, 0);
	c->state = COMM_ACTIVATING;
	int rc = comm_region_create(c);
	if (rc < 0) {
		char msg[160];
		snprintf(msg, sizeof(msg), "cannot create the communicator's shared region: %s", strerror(-rc));
		comm_fail_init(c, EC(RESOURCE), msg);
		return;
	}
	Dfccl__V1__CommRank **rankp;
	if (comm_rank_table(c, &rankp) < 0) {
		comm_fail_init(c, EC(RESOURCE), "out of memory activating the communicator");
		return;
	}
	for (uint32_t r = 0; r < c->nranks; r++)
		c->devices |= 1ull << c->members[r].device;
	int failed_dev = -1;
	for (uint32_t d = 0; d < 64 && failed_dev < 0 && srv->workers; d++) {
		if (!(c->devices & (1ull << d)))
			continue;
		if (workers_comm_add(srv->workers, d, c->id, c->nranks, (const Dfccl__V1__CommRank **)rankp, c->region_fd,
		                     c->region_size) < 0)
			failed_dev = (int)d;
	}
	free(rankp);
	if (!srv->workers) {
		/* A detached server (server_init_detached) has no workers to
		 * hand the communicator to: it is ready as it stands. */
		comm_finish_init(c);
		return;
	}
	if (failed_dev >= 0)
		comm_fail_worker_down(c, (uint32_t)failed_dev);
}

/* Keeps a copy of the blob (len bytes, 1..DFCCL_PEER_BLOB_MAX) that the
 * worker of `device` exported for c. Returns 0 or -ENOMEM. */
static int comm_blob_keep(struct comm *c, uint32_t device, const uint8_t *blob, size_t len)
{
	struct comm_blob *more = realloc(c->blobs, (c->nblobs + 1) * sizeof(*more));
	if (!more)
		return -ENOMEM;
	c->blobs = more;
	uint8_t *copy = malloc(len);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, blob, len);
	c->blobs[c->nblobs++] = (struct comm_blob){.device = device, .len = (uint32_t)len, .data = copy};
	return 0;
}

/* Every worker of c took it and some exported a blob: each gets the other
 * devices' blobs, and c is ready once each acknowledged them. */
static void comm_exchange(struct comm *c)
{
	c->state = COMM_EXCHANGING;
	log_debug("comm", "communicator %llu: handing %u exported blobs to the workers", (unsigned long long)c->id,
	          c->nblobs);
	for (uint32_t d = 0; d < 64; d++) {
		if (!(c->devices & (1ull << d)))
			continue;
		if (workers_comm_peers(c->srv->workers, d, c->id, c->blobs, c->nblobs) < 0) {
			comm_fail_worker_down(c, d);
			return;
		}
	}
}

/* The worker of `device` took c (WorkerCommAdd), exporting blob (len
 * bytes; none when 0). */
static void comm_took(struct comm *c, uint32_t device, const uint8_t *blob, size_t len)
{
	if (c->acks & (1ull << device))
		return;
	/* It holds c from now on: when c goes, it is told (comm_free). */
	c->acks |= 1ull << device;
	if (len > DFCCL_PEER_BLOB_MAX) {
		char msg[200];
		snprintf(msg, sizeof(msg), "the worker for device %u exported %zu bytes for its peers, more than the %u "
		         "allowed", device, len, DFCCL_PEER_BLOB_MAX);
		comm_fail_init(c, EC(INTERNAL), msg);
		return;
	}
	if (len && comm_blob_keep(c, device, blob, len) < 0) {
		comm_fail_init(c, EC(RESOURCE), "out of memory activating the communicator");
		return;
	}
	if (c->acks != c->devices)
		return;
	/* One device has no peers to reach; without blobs there is nothing
	 * to hand on (the host engine's case). */
	if (c->nblobs == 0 || (c->devices & (c->devices - 1)) == 0)
		comm_finish_init(c);
	else
		comm_exchange(c);
}

/* The worker of `device` took the blobs of c's other devices. */
static void comm_took_peers(struct comm *c, uint32_t device)
{
	c->peer_acks |= 1ull << device;
	if (c->peer_acks == c->devices)
		comm_finish_init(c);
}

void comm_worker_acked(struct server *srv, uint64_t comm_id, uint32_t device, int code, const char *message,
                       const uint8_t *blob, size_t len)
{
	struct comm *c = comm_find(srv, comm_id);
	if (!c && code == 0) {
		/* The init failed elsewhere while this worker was taking c:
		 * nothing of it may stay there. */
		if (device < 64)
			workers_comm_del(srv->workers, 1ull << device, comm_id);
		return;
	}
	if (!c || !comm_setting_up(c) || device >= 64 || !(c->devices & (1ull << device)))
		return;
	if (code) {
		char msg[300];
		snprintf(msg, sizeof(msg), "the worker for device %u could not take %s: %s", device,
		         c->state == COMM_EXCHANGING ? "what the communicator's other devices exported"
		                                     : "the communicator",
		         message && *message ? message : "unknown error");
		comm_fail_init(c, code, msg);
		return;
	}
	if (c->state == COMM_ACTIVATING)
		comm_took(c, device, blob, len);
	else
		comm_took_peers(c, device);
}

int comm_join(struct server *srv, struct session *s, uint64_t request_id, const uint8_t *unique_id, size_t idlen,
              uint32_t nranks, uint32_t rank, uint32_t device, uint32_t timeout_ms, int64_t coll_timeout_ms,
              char *err, size_t errlen)
{
	if (idlen != COMM_ID_BYTES) {
		snprintf(err, errlen, "the unique id has %zu bytes, expected %u (use dfcclGetUniqueId)", idlen,
		         COMM_ID_BYTES);
		return EC(INVALID_ARGUMENT);
	}
	if (nranks < 1 || nranks > COMM_MAX_RANKS) {
		snprintf(err, errlen, "nranks %u is outside 1..%u", nranks, COMM_MAX_RANKS);
		return EC(INVALID_ARGUMENT);
	}
	if (rank >= nranks) {
		snprintf(err, errlen, "rank %u is outside 0..%u", rank, nranks - 1);
		return EC(INVALID_ARGUMENT);
	}
	if (coll_timeout_ms < -1) {
		snprintf(err, errlen, "collective timeout %lld ms: use milliseconds, 0 for the daemon's default or -1 for "
		         "none", (long long)coll_timeout_ms);
		return EC(INVALID_ARGUMENT);
	}

	struct comm *c = NULL;
	for (struct comm *it = srv->comms; it; it = it->next) {
		if (it->state == COMM_INITIALIZING && memcmp(it->unique_id, unique_id, COMM_ID_BYTES) == 0) {
			c = it;
			break;
		}
	}
	if (c) {
		if (c->uid != s->uid) {
			snprintf(err, errlen,
			         "the communicator with this unique id belongs to another user (uid %u); "
			         "communicators cannot be shared between users",
			         (unsigned)c->uid);
			return EC(PERMISSION);
		}
		if (c->nranks != nranks) {
			snprintf(err, errlen, "nranks %u differs from the %u given by the ranks that already joined", nranks,
			         c->nranks);
			return EC(INVALID_ARGUMENT);
		}
		if (c->members[rank].state != MEMBER_EMPTY) {
			snprintf(err, errlen, "rank %u of this communicator was already taken (by pid %d)", rank,
			         (int)c->members[rank].pid);
			return EC(INVALID_ARGUMENT);
		}
	}
	if (user_charge_comm(&srv->users, s->user) < 0) {
		snprintf(err, errlen, "uid %u already holds %lld communicator memberships (setting max-comms-per-uid)",
		         (unsigned)s->uid, (long long)srv->users.limits.max_comms);
		return EC(RESOURCE);
	}
	if (!c) {
		c = calloc(1, sizeof(*c));
		if (c)
			c->members = calloc(nranks, sizeof(*c->members));
		if (!c || !c->members) {
			if (c)
				free(c);
			user_uncharge_comm(s->user);
			snprintf(err, errlen, "out of memory creating a communicator of %u ranks", nranks);
			return EC(RESOURCE);
		}
		c->srv = srv;
		c->awaiting_device = -1;
		c->id = ++srv->next_comm_id;
		memcpy(c->unique_id, unique_id, COMM_ID_BYTES);
		c->uid = s->uid;
		c->nranks = nranks;
		c->state = COMM_INITIALIZING;
		c->region_fd = -1;
		c->created_ms = server_now_ms();
		uv_timer_init(srv->loop, &c->timer);
		c->timer.data = c;
		uint64_t to = timeout_ms ? timeout_ms : (uint64_t)srv->cfg.comm_init_timeout_ms;
		c->init_timeout_ms = to;
		uv_timer_start(&c->timer, comm_init_timeout, to, 0);
		c->next = srv->comms;
		if (srv->comms)
			srv->comms->prev = c;
		srv->comms = c;
		log_debug("comm", "communicator %llu initializing: %u ranks, timeout %llu ms", (unsigned long long)c->id,
		          nranks, (unsigned long long)to);
	}
	struct comm_member *m = &c->members[rank];
	m->state = MEMBER_JOINING;
	m->session = s;
	m->session_id = s->id;
	m->request_id = request_id;
	m->device = device;
	m->pid = s->pid;
	m->coll_timeout_ms = coll_timeout_ms;
	c->joined++;
	if (c->joined == c->nranks)
		comm_try_activate(c);
	return 0;
}

void comm_worker_up(struct server *srv, uint32_t device)
{
	struct comm *next;
	for (struct comm *c = srv->comms; c; c = next) {
		next = c->next; /* activation may dissolve c */
		if (c->state == COMM_INITIALIZING && c->joined == c->nranks && c->awaiting_device == (int)device)
			comm_try_activate(c);
	}
}

/* Member r (session s) of c, looked up for a request on comm_id: NULL with
 * the error in err when s has no active rank in it. */
static struct comm *comm_of_member(struct server *srv, struct session *s, uint64_t comm_id, int *r, char *err,
                                   size_t errlen)
{
	struct comm *c = comm_find(srv, comm_id);
	*r = c ? comm_rank_of(c, s) : -1;
	if (*r < 0 || c->members[*r].state != MEMBER_ACTIVE) {
		snprintf(err, errlen, "communicator %llu does not exist or this session is not a member of it",
		         (unsigned long long)comm_id);
		return NULL;
	}
	return c;
}

/* Who stops c, as its members are told: "rank 1 (pid 42)" for member r,
 * "dfcclctl (pid 42, uid 1000)" for session s from outside (r < 0). */
static void comm_stopper(int r, const struct session *s, char *buf, size_t len)
{
	if (r >= 0)
		snprintf(buf, len, "rank %d (pid %d)", r, (int)s->pid);
	else
		snprintf(buf, len, "%s (pid %d, uid %u)", s->client_name[0] ? s->client_name : "a client", (int)s->pid,
		         (unsigned)s->uid);
}

/* Session s stops c: every rank's pending and later collectives fail with
 * DFCCL_CQ_ABORTED, and the members (all but rank r, when s is one) are
 * told who did it and what (`verb`), before the engines fail anything, as
 * comm_fail does. */
static void comm_abort_by(struct comm *c, int r, const struct session *s, const char *verb)
{
	char who[160], msg[256];
	comm_stopper(r, s, who, sizeof(who));
	snprintf(msg, sizeof(msg), "%s %s communicator %llu%s", who, verb, (unsigned long long)c->id,
	         r >= 0 ? "" : " from outside");
	log_info("comm", "%s", msg);
	comm_notify(c, r, EC(ABORTED), msg);
	if (c->state == COMM_READY)
		comm_break(c, COMM_ABORTED, DFCCL_CQ_ABORTED);
}

int comm_leave(struct server *srv, struct session *s, uint64_t comm_id, int abort, char *err, size_t errlen)
{
	int r;
	struct comm *c = comm_of_member(srv, s, comm_id, &r, err, errlen);
	if (!c)
		return EC(NOT_FOUND);
	if (abort)
		comm_abort_by(c, r, s, "aborted");
	comm_member_leave(c, (uint32_t)r);
	return 0;
}

/* The ready (or failed) communicator comm_id as session s may stop it: as
 * a member (its rank in *r), or from outside (*r = -1) as the owner's uid
 * or root. NULL with a positive error code in *code and a sentence in err
 * otherwise. */
static struct comm *comm_stoppable(struct server *srv, struct session *s, uint64_t comm_id, int *r, int *code,
                                   char *err, size_t errlen)
{
	struct comm *c = comm_find(srv, comm_id);
	*r = c ? comm_rank_of(c, s) : -1;
	if (!c || (*r >= 0 && c->members[*r].state != MEMBER_ACTIVE) || (*r < 0 && s->uid != 0 && s->uid != c->uid)) {
		snprintf(err, errlen, "communicator %llu does not exist, or is another user's (only members, its owner and "
		         "root may stop it)", (unsigned long long)comm_id);
		*code = EC(NOT_FOUND);
		return NULL;
	}
	if (c->state == COMM_INITIALIZING || comm_setting_up(c)) {
		snprintf(err, errlen, "communicator %llu is %s: only a ready communicator can be stopped",
		         (unsigned long long)comm_id, comm_state_name(c->state));
		*code = EC(INVALID_ARGUMENT);
		return NULL;
	}
	return c;
}

int comm_revoke(struct server *srv, struct session *s, uint64_t comm_id, char *err, size_t errlen)
{
	int r, code;
	struct comm *c = comm_stoppable(srv, s, comm_id, &r, &code, err, errlen);
	if (!c)
		return code;
	comm_abort_by(c, r, s, r >= 0 ? "revoked" : "aborted");
	return 0;
}

/* The ranks of c's shrink advice, ascending, into out; how many. */
static size_t comm_advice_ranks(const struct comm *c, uint32_t *out)
{
	size_t n = 0;
	for (uint32_t r = 0; r < c->nranks; r++)
		if (c->shrink_advice & (1ull << r))
			out[n++] = r;
	return n;
}

/* The exclusion list of a CommShrinkAdvice as a mask of c's ranks, or -1
 * with the reason in err. */
static int comm_advice_mask(const struct comm *c, const uint32_t *exclude, size_t n, uint64_t *mask, char *err,
                            size_t errlen)
{
	*mask = 0;
	if (n == 0) {
		snprintf(err, errlen, "a shrink advice names at least one rank to exclude (to stop the communicator "
		         "without one, abort it)");
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		if (exclude[i] >= c->nranks) {
			snprintf(err, errlen, "rank %u is outside 0..%u of communicator %llu", exclude[i], c->nranks - 1,
			         (unsigned long long)c->id);
			return -1;
		}
		if (*mask & (1ull << exclude[i])) {
			snprintf(err, errlen, "rank %u is excluded twice", exclude[i]);
			return -1;
		}
		*mask |= 1ull << exclude[i];
	}
	if (n >= c->nranks) {
		snprintf(err, errlen, "excluding all %u ranks leaves nobody to shrink communicator %llu (abort it instead)",
		         c->nranks, (unsigned long long)c->id);
		return -1;
	}
	return 0;
}

int comm_shrink_advice(struct server *srv, struct session *s, uint64_t comm_id, const uint32_t *exclude, size_t n,
                       char *err, size_t errlen)
{
	int r, code;
	uint64_t mask;
	struct comm *c = comm_stoppable(srv, s, comm_id, &r, &code, err, errlen);
	if (!c)
		return code;
	if (comm_advice_mask(c, exclude, n, &mask, err, errlen) < 0)
		return EC(INVALID_ARGUMENT);
	c->shrink_advice = mask;
	uint32_t list[COMM_MAX_RANKS];
	size_t nlist = comm_advice_ranks(c, list);
	char who[160], ranks[400], head[700], msg[900];
	comm_stopper(r, s, who, sizeof(who));
	bits_text("rank", mask, ranks, sizeof(ranks));
	snprintf(head, sizeof(head), "communicator %llu: %s revoked it%s and advises shrinking it without %s "
	         "(dfcclCommGetShrinkAdvice)", (unsigned long long)c->id, who, r >= 0 ? "" : " from outside", ranks);
	log_info("comm", "%s", head);
	/* Every member, the advising one too, so each library holds the advice;
	 * the notice goes before the engines fail anything, as comm_fail's. */
	for (uint32_t q = 0; q < c->nranks; q++) {
		struct comm_member *m = &c->members[q];
		if (m->state != MEMBER_ACTIVE)
			continue;
		snprintf(msg, sizeof(msg), "%s; %s", head, (mask & (1ull << q))
		         ? "this rank is excluded: leave the communicator with dfcclCommDestroy or dfcclCommAbort"
		         : "the other ranks call dfcclCommShrink with exactly those ranks");
		session_send_shrink_notice(m->session, EC(ABORTED), c->id, m->device, msg, list, nlist);
	}
	if (c->state == COMM_READY)
		comm_break(c, COMM_ABORTED, DFCCL_CQ_ABORTED);
	return 0;
}

void comm_session_gone(struct server *srv, struct session *s)
{
	struct comm *c = srv->comms;
	while (c) {
		struct comm *next = c->next;
		int r = comm_rank_of(c, s);
		if (r >= 0 && comm_setting_up(c)) {
			char msg[200];
			snprintf(msg, sizeof(msg), "rank %d (pid %d) disconnected while the communicator was being set up",
			         r, (int)s->pid);
			/* Its own reply goes nowhere (the session is closing); the
			 * others learn why their init failed. */
			comm_fail_init(c, EC(PEER_LOST), msg);
		} else if (r >= 0) {
			if (c->state == COMM_READY) {
				comm_break(c, COMM_PEER_LOST, DFCCL_CQ_PEER_LOST);
				char msg[256];
				snprintf(msg, sizeof(msg),
				         "rank %d (pid %d) of communicator %llu disconnected; its collectives cannot complete",
				         r, (int)s->pid, (unsigned long long)c->id);
				log_info("comm", "%s", msg);
				comm_notify(c, r, EC(PEER_LOST), msg);
			}
			comm_member_leave(c, (uint32_t)r);
		}
		c = next;
	}
}

void comm_device_lost(struct server *srv, uint32_t device)
{
	struct comm *next;
	for (struct comm *c = srv->comms; c; c = next) {
		next = c->next;
		if (comm_setting_up(c) && device < 64 && (c->devices & (1ull << device))) {
			char msg[200];
			snprintf(msg, sizeof(msg), "the daemon's worker for device %u died while the communicator was being "
			         "set up; retry the init", device);
			comm_fail_init(c, EC(DEVICE_LOST), msg);
			continue;
		}
		if (c->state != COMM_READY)
			continue;
		int hit = 0;
		for (uint32_t r = 0; r < c->nranks; r++)
			if (c->members[r].state == MEMBER_ACTIVE && c->members[r].device == device)
				hit = 1;
		if (!hit)
			continue;
		comm_break(c, COMM_DEVICE_LOST, DFCCL_CQ_DEVICE_LOST);
		char msg[256];
		snprintf(msg, sizeof(msg),
		         "the daemon's worker for device %u died; collectives of communicator %llu fail (create a new "
		         "communicator to continue)",
		         device, (unsigned long long)c->id);
		comm_notify(c, -1, EC(DEVICE_LOST), msg);
	}
}

void comm_count(struct server *srv, unsigned *ready, unsigned *pending)
{
	*ready = *pending = 0;
	for (struct comm *c = srv->comms; c; c = c->next) {
		if (c->state == COMM_INITIALIZING)
			(*pending)++;
		else
			(*ready)++;
	}
}

unsigned comm_session_count(struct server *srv, const struct session *s)
{
	unsigned n = 0;
	for (struct comm *c = srv->comms; c; c = c->next)
		if (comm_rank_of(c, s) >= 0)
			n++;
	return n;
}

/* The plan of c's region into ci (nothing while there is none). */
static int comm_query_plan(const struct comm *c, Dfccl__V1__CommInfo *ci)
{
	if (!c->region)
		return 0;
	/* Workers map the region writable: read one copy, as untrusted. */
	struct dfccl_comm_plan copy;
	memcpy(&copy, dfccl_comm_plan_of(c->region), sizeof(copy));
	const struct dfccl_comm_plan *p = &copy;
	if (p->valid != DFCCL_PLAN_VALID || p->ntrees < 1 || p->ntrees > DFCCL_PLAN_TREES)
		return 0;
	ci->ring = calloc(c->nranks, sizeof(*ci->ring));
	ci->trees = calloc(p->ntrees, sizeof(*ci->trees));
	if (!ci->ring || !ci->trees)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->nranks; i++)
		ci->ring[ci->n_ring++] = p->ring[i];
	for (uint32_t k = 0; k < p->ntrees; k++) {
		Dfccl__V1__CommTree *t = calloc(1, sizeof(*t));
		if (!t)
			return -ENOMEM;
		dfccl__v1__comm_tree__init(t);
		ci->trees[ci->n_trees++] = t;
		t->parent = calloc(c->nranks, sizeof(*t->parent));
		if (!t->parent)
			return -ENOMEM;
		for (uint32_t r = 0; r < c->nranks; r++)
			t->parent[t->n_parent++] = p->parent[k][r] == DFCCL_PLAN_NO_PARENT ? -1 : p->parent[k][r];
	}
	return 0;
}

/* The shrink advice of c into ci (nothing while there is none). */
static int comm_query_advice(const struct comm *c, Dfccl__V1__CommInfo *ci)
{
	if (!c->shrink_advice)
		return 0;
	ci->shrink_exclude = calloc(c->nranks, sizeof(*ci->shrink_exclude));
	if (!ci->shrink_exclude)
		return -ENOMEM;
	ci->n_shrink_exclude = comm_advice_ranks(c, ci->shrink_exclude);
	return 0;
}

int comm_query(struct server *srv, Dfccl__V1__QueryReply *reply)
{
	size_t n = 0;
	for (struct comm *c = srv->comms; c; c = c->next)
		n++;
	reply->comms = calloc(n ? n : 1, sizeof(*reply->comms));
	if (!reply->comms)
		return -ENOMEM;
	reply->n_comms = 0;
	uint64_t now = server_now_ms();
	for (struct comm *c = srv->comms; c; c = c->next) {
		Dfccl__V1__CommInfo *ci = calloc(1, sizeof(*ci));
		if (!ci)
			return -ENOMEM;
		dfccl__v1__comm_info__init(ci);
		reply->comms[reply->n_comms++] = ci;
		ci->comm_id = c->id;
		ci->uid = (uint32_t)c->uid;
		ci->nranks = c->nranks;
		ci->joined = c->joined;
		ci->state = (char *)comm_state_name(c->state);
		ci->age_ms = now - c->created_ms;
		ci->ranks = calloc(c->nranks, sizeof(*ci->ranks));
		if (!ci->ranks)
			return -ENOMEM;
		for (uint32_t r = 0; r < c->nranks; r++) {
			const struct comm_member *m = &c->members[r];
			if (m->state != MEMBER_JOINING && m->state != MEMBER_ACTIVE)
				continue;
			Dfccl__V1__CommRank *cr = calloc(1, sizeof(*cr));
			if (!cr)
				return -ENOMEM;
			dfccl__v1__comm_rank__init(cr);
			cr->rank = r;
			cr->device = m->device;
			cr->session_id = m->session_id;
			cr->pid = m->pid;
			ci->ranks[ci->n_ranks++] = cr;
		}
		if (comm_query_plan(c, ci) < 0 || comm_query_advice(c, ci) < 0)
			return -ENOMEM;
	}
	return 0;
}

void comm_query_free(Dfccl__V1__QueryReply *reply)
{
	for (size_t i = 0; i < reply->n_comms; i++) {
		Dfccl__V1__CommInfo *ci = reply->comms[i];
		for (size_t j = 0; j < ci->n_ranks; j++)
			free(ci->ranks[j]);
		free(ci->ranks);
		for (size_t j = 0; j < ci->n_trees; j++) {
			free(ci->trees[j]->parent);
			free(ci->trees[j]);
		}
		free(ci->trees);
		free(ci->ring);
		free(ci->shrink_exclude);
		free(ci);
	}
	free(reply->comms);
	reply->comms = NULL;
	reply->n_comms = 0;
}

void comm_free_all(struct server *srv)
{
	while (srv->comms)
		comm_free(srv->comms);
}
