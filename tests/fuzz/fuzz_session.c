/*
 * Fuzz target for the daemon's request handlers (daemon/session.c, conn.c,
 * comm.c): every input is fed to a fresh session of a detached server (no
 * listener, no workers) whose socket's other end is drained and dropped.
 * When the first byte is odd, a valid Hello goes first so that the handlers
 * past the handshake are reached. The session is then ended and the loop run
 * once, so handles and memory are released per input (ASan reports leaks).
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "frame.h"
#include "log.h"
#include "server.h"
#include "session.h"
#include "testutil.h"

static uv_loop_t loop;
static struct server srv;
static uint8_t *hello_frame;
static size_t hello_len;

static void init_once(void)
{
	static int done;
	if (done)
		return;
	done = 1;
	signal(SIGPIPE, SIG_IGN);
	/* Below every level: bad input is the normal case here. */
	log_setup(0, LOG_TARGET_STDERR, "fuzz_session");
	struct dfccld_config cfg;
	config_defaults(&cfg);
	if (uv_loop_init(&loop) < 0 || server_init_detached(&srv, &loop, &cfg) < 0)
		abort();
	struct tu_msg m;
	tu_msg_hello(&m, 1, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION);
	if (frame_encode(&m.env, &hello_frame, &hello_len) < 0)
		abort();
}

/* Reads and drops whatever the session wrote. A plain recv() passes no
 * control buffer, so the kernel drops any descriptors itself. */
static void drain(int fd)
{
	char buf[65536];
	while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	init_once();
	if (size == 0)
		return 0;
	int sv[2];
	if (tu_socketpair(sv) < 0)
		return 0;
	struct session *s;
	if (session_new(&srv, sv[0], &s) < 0) {
		close(sv[1]);
		return 0;
	}
	if (data[0] & 1)
		session_feed(s, hello_frame, hello_len);
	/* Two feeds, so frames also arrive split. A feed after the session
	 * ended is refused by the connection; the memory of s lives until the
	 * loop runs its close callback. */
	size_t half = (size - 1) / 2;
	session_feed(s, data + 1, half);
	drain(sv[1]);
	session_feed(s, data + 1 + half, size - 1 - half);
	drain(sv[1]);
	session_end(s);
	uv_run(&loop, UV_RUN_NOWAIT);
	close(sv[1]);
	if (srv.nsessions != 0 || srv.sessions || srv.comms)
		abort();
	return 0;
}
