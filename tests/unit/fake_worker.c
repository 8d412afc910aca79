/*
 * fake_worker: a stand-in for dfccld's engine worker, which the supervisor
 * tests (test_session) start through the real workers module instead of
 * dfccld, so that the supervisor's side of GPU registrations and of
 * dfcclMemAlloc's device memory runs on machines without a GPU.
 *
 * It is started as the worker is (`fake_worker --worker-device N ...`, its
 * control socket on fd 3), says WorkerHello, and then:
 *   - acknowledges every WorkerAddReg, or refuses it when told to;
 *   - answers WorkerAllocMem with a memfd of the size asked, rounded up to
 *     64 KiB, standing for the exported allocation; or refuses, answers
 *     without a descriptor, answers late, or exits without answering, as
 *     told;
 *   - acknowledges every WorkerCommAdd, exporting the blob "dev N" (its
 *     device) when told to, or exiting right after that acknowledgement;
 *     or refuses it, or answers late, when told to;
 *     and acknowledges every WorkerCommPeers, or refuses it, or never
 *     answers it, when told to;
 *   - answers WorkerCommDel with await_free by WorkerCommReleased, or
 *     never ("release-silent"), or by exiting ("release-die");
 *   - appends one line per message to the log file, naming each received
 *     descriptor by its inode and each peer's blob by its text, so the
 *     test sees which worker got what.
 * What to do comes from the file $DFCCL_FAKE_WORKER_CTL, read at each
 * message: lines of a word (ok, refuse-reg, alloc-fail, alloc-nofd,
 * alloc-slow, alloc-die, blob, refuse-peers, peers-silent, blob-die,
 * refuse-comm, comm-slow, release-silent, release-die) and the device it applies to ("alloc-fail 1"); a device no line names does
 * "ok". The log goes to $DFCCL_FAKE_WORKER_LOG. It exits when the
 * supervisor hangs up.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frame.h"

#define CTL_FD 3
#define GRAN ((uint64_t)64 << 10)

static unsigned device;

/* The instruction for this device: "ok" unless the control file names it. */
static void mode(char *out, size_t len)
{
	snprintf(out, len, "ok");
	FILE *f = fopen(getenv("DFCCL_FAKE_WORKER_CTL") ? getenv("DFCCL_FAKE_WORKER_CTL") : "", "r");
	if (!f)
		return;
	char word[32];
	unsigned dev;
	while (fscanf(f, "%31s %u", word, &dev) == 2)
		if (dev == device)
			snprintf(out, len, "%s", word);
	fclose(f);
}

static void logf_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_line(const char *fmt, ...)
{
	const char *path = getenv("DFCCL_FAKE_WORKER_LOG");
	char line[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (!path || n < 0)
		return;
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n] = '\n';
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0) {
		(void)!write(fd, line, (size_t)n + 1);
		close(fd);
	}
}

static unsigned long inode_of(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

static void send_env(Dfccl__V1__Envelope *env, const int *fds, unsigned nfds)
{
	if (frame_send(CTL_FD, env, fds, nfds) < 0)
		exit(1);
}

static void add_reg(const Dfccl__V1__WorkerAddReg *a, const int *fds, unsigned nfds)
{
	char m[32];
	mode(m, sizeof(m));
	logf_line("addreg dev=%u reg=%u session=%llu kind=%d size=%llu offset=%llu nfds=%u inode=%lu", device, a->reg_id,
	          (unsigned long long)a->session_id, (int)a->kind, (unsigned long long)a->size,
	          (unsigned long long)a->offset, nfds, nfds ? inode_of(fds[0]) : 0);
	Dfccl__V1__WorkerRegAck ack = DFCCL__V1__WORKER_REG_ACK__INIT;
	ack.reg_id = a->reg_id;
	if (!strcmp(m, "refuse-reg")) {
		ack.code = DFCCL__V1__ERROR_CODE__ERROR_INVALID_ARGUMENT;
		ack.message = "the fake worker refuses this buffer";
	}
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_REG_ACK;
	env.worker_reg_ack = &ack;
	send_env(&env, NULL, 0);
}

static void alloc_mem(const Dfccl__V1__WorkerAllocMem *a)
{
	char m[32];
	mode(m, sizeof(m));
	logf_line("alloc dev=%u reg=%u size=%llu", device, a->reg_id, (unsigned long long)a->size);
	if (!strcmp(m, "alloc-die"))
		exit(3);
	if (!strcmp(m, "alloc-slow"))
		usleep(300 * 1000);
	Dfccl__V1__WorkerAllocDone done = DFCCL__V1__WORKER_ALLOC_DONE__INIT;
	done.reg_id = a->reg_id;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_ALLOC_DONE;
	env.worker_alloc_done = &done;
	if (!strcmp(m, "alloc-fail")) {
		done.code = DFCCL__V1__ERROR_CODE__ERROR_RESOURCE;
		done.message = "the fake worker has no device memory";
		send_env(&env, NULL, 0);
		return;
	}
	done.map_size = (a->size + GRAN - 1) / GRAN * GRAN;
	int fd = memfd_create("fake-allocation", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)done.map_size) < 0)
		exit(1);
	logf_line("allocdone dev=%u reg=%u inode=%lu", device, a->reg_id, inode_of(fd));
	send_env(&env, &fd, strcmp(m, "alloc-nofd") ? 1 : 0);
	close(fd);
}

static void comm_ack(uint64_t comm_id, int code, const char *msg, const char *blob)
{
	Dfccl__V1__WorkerCommAck ack = DFCCL__V1__WORKER_COMM_ACK__INIT;
	ack.comm_id = comm_id;
	ack.code = code;
	ack.message = (char *)msg;
	ack.peer_blob.data = (uint8_t *)blob;
	ack.peer_blob.len = blob ? strlen(blob) : 0;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ACK;
	env.worker_comm_ack = &ack;
	send_env(&env, NULL, 0);
}

/* Logs "commdel dev=D comm=C" (with " await" when await_free) and, with
 * await_free, answers as told. */
static void comm_del(const Dfccl__V1__WorkerCommDel *d)
{
	char m[32];
	mode(m, sizeof(m));
	logf_line("commdel dev=%u comm=%llu%s", device, (unsigned long long)d->comm_id, d->await_free ? " await" : "");
	if (!d->await_free || !strcmp(m, "release-silent"))
		return;
	if (!strcmp(m, "release-die"))
		exit(3);
	Dfccl__V1__WorkerCommReleased r = DFCCL__V1__WORKER_COMM_RELEASED__INIT;
	r.comm_id = d->comm_id;
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_RELEASED;
	env.worker_comm_released = &r;
	send_env(&env, NULL, 0);
}

/* "blob", "refuse-peers", "peers-silent" and "blob-die" export "dev N". */
static void comm_add(const Dfccl__V1__WorkerCommAdd *a, unsigned nfds)
{
	char m[32], blob[16];
	mode(m, sizeof(m));
	logf_line("commadd dev=%u comm=%llu nranks=%u nfds=%u", device, (unsigned long long)a->comm_id, a->nranks, nfds);
	snprintf(blob, sizeof(blob), "dev %u", device);
	int exports = !strcmp(m, "blob") || !strcmp(m, "refuse-peers") || !strcmp(m, "peers-silent") ||
	              !strcmp(m, "blob-die");
	if (!strcmp(m, "refuse-comm")) {
		comm_ack(a->comm_id, DFCCL__V1__ERROR_CODE__ERROR_RESOURCE, "the fake worker refuses this communicator",
		         NULL);
		return;
	}
	if (!strcmp(m, "comm-slow"))
		usleep(300 * 1000);
	comm_ack(a->comm_id, DFCCL__V1__ERROR_CODE__ERROR_NONE, "", exports ? blob : NULL);
	if (!strcmp(m, "blob-die"))
		exit(3);
}

/* Logs the blobs as "peers dev=0 comm=7 n=1 [1:dev 1]". */
static void comm_peers(const Dfccl__V1__WorkerCommPeers *p)
{
	char m[32], list[200] = "";
	size_t off = 0;
	mode(m, sizeof(m));
	for (size_t i = 0; i < p->n_peers && off < sizeof(list); i++)
		off += (size_t)snprintf(list + off, sizeof(list) - off, " [%u:%.*s]", p->peers[i]->device,
		                        (int)p->peers[i]->blob.len, (const char *)p->peers[i]->blob.data);
	logf_line("peers dev=%u comm=%llu n=%zu%s", device, (unsigned long long)p->comm_id, p->n_peers, list);
	if (!strcmp(m, "peers-silent"))
		return;
	if (!strcmp(m, "refuse-peers"))
		comm_ack(p->comm_id, DFCCL__V1__ERROR_CODE__ERROR_RESOURCE, "the fake worker cannot map its peers' memory",
		         NULL);
	else
		comm_ack(p->comm_id, DFCCL__V1__ERROR_CODE__ERROR_NONE, "", NULL);
}

int main(int argc, char **argv)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "--worker-device"))
			device = (unsigned)atoi(argv[i + 1]);
	Dfccl__V1__WorkerHello h = DFCCL__V1__WORKER_HELLO__INIT;
	h.device = device;
	h.pid = getpid();
	h.name = "fake device";
	Dfccl__V1__Envelope env = DFCCL__V1__ENVELOPE__INIT;
	env.body_case = DFCCL__V1__ENVELOPE__BODY_WORKER_HELLO;
	env.worker_hello = &h;
	send_env(&env, NULL, 0);

	struct frame_reader rd = FRAME_READER_INIT;
	for (;;) {
		dfccl_envelope *e;
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 0;
		if (frame_recv(&rd, CTL_FD, &e, fds, &nfds) <= 0)
			break;
		switch (e->body_case) {
		case DFCCL__V1__ENVELOPE__BODY_WORKER_ADD_REG: add_reg(e->worker_add_reg, fds, nfds); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_DEL_REG:
			logf_line("delreg dev=%u reg=%u", device, e->worker_del_reg->reg_id);
			break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_ALLOC_MEM: alloc_mem(e->worker_alloc_mem); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_ADD: comm_add(e->worker_comm_add, nfds); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_PEERS: comm_peers(e->worker_comm_peers); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_DEL: comm_del(e->worker_comm_del); break;
		case DFCCL__V1__ENVELOPE__BODY_WORKER_COMM_FREE:
			logf_line("commfree dev=%u comm=%llu", device, (unsigned long long)e->worker_comm_free->comm_id);
			break;
		default: break;
		}
		frame_close_fds(fds, nfds);
		frame_envelope_free(e);
	}
	frame_reader_free(&rd);
	return 0;
}
