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
 *   - appends one line per message to the log file, naming each received
 *     descriptor by its inode, so the test sees which worker got what.
 * What to do comes from the file $DFCCL_FAKE_WORKER_CTL, read at each
 * message: a word (ok, refuse-reg, alloc-fail, alloc-nofd, alloc-slow,
 * alloc-die) and the device it applies to ("alloc-fail 1"); the log goes to
 * $DFCCL_FAKE_WORKER_LOG. It exits when the supervisor hangs up.
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
	if (fscanf(f, "%31s %u", word, &dev) == 2 && dev == device)
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
		default: break;
		}
		frame_close_fds(fds, nfds);
		frame_envelope_free(e);
	}
	frame_reader_free(&rd);
	return 0;
}
