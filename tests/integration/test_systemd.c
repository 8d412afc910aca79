/*
 * systemd integration of the real daemon: READY=1 and STATUS= on start,
 * WATCHDOG=1 at half the interval systemd asks for, STOPPING=1 on SIGTERM
 * (through a notification socket of our own, as systemd would provide),
 * and socket activation (a listening socket handed over on fd 3, which the
 * daemon uses and leaves in place when it stops).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

struct notify_log {
	char text[16384];
	size_t len;
	unsigned watchdogs;
};

/* Reads notification datagrams for ms milliseconds. */
static void collect(int fd, struct notify_log *l, int ms)
{
	uint64_t deadline = now_ms() + (uint64_t)ms;
	while (now_ms() < deadline) {
		struct timeval tv = {.tv_sec = 0, .tv_usec = 20000};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		char buf[1024];
		ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		if (strstr(buf, "WATCHDOG=1"))
			l->watchdogs++;
		size_t room = sizeof(l->text) - l->len - 2;
		size_t take = (size_t)n < room ? (size_t)n : room;
		memcpy(l->text + l->len, buf, take);
		l->len += take;
		l->text[l->len++] = '\n';
		l->text[l->len] = '\0';
	}
}

static int bind_unix(int type, const char *path)
{
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return -1;
	return fd;
}

static void test_notify_and_watchdog(void **state)
{
	char dir[] = "/tmp/dfccl-notify-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/notify", dir);
	int nfd = bind_unix(SOCK_DGRAM, path);
	assert_true(nfd >= 0);
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("WATCHDOG_USEC", "100000", 1);
	struct daemon_opts o = {.keep_systemd_env = 1};
	struct daemon_proc d;
	assert_int_equal(daemon_start_with(&d, &o, 2, NULL), 0);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");

	struct notify_log l = {0};
	collect(nfd, &l, 600);
	assert_non_null(strstr(l.text, "READY=1"));
	assert_non_null(strstr(l.text, "STATUS=serving 2 host devices"));
	/* 100 ms interval, pinged every 50 ms: several in 600 ms. */
	assert_true(l.watchdogs >= 4);

	kill(d.pid, SIGTERM);
	collect(nfd, &l, 300);
	assert_non_null(strstr(l.text, "STOPPING=1"));
	assert_int_equal(child_wait(d.pid, 10000), 0);
	d.pid = 0;
	daemon_stop(&d);
	close(nfd);
	unlink(path);
	rmdir(dir);
}

static void test_socket_activation(void **state)
{
	char dir[] = "/tmp/dfccl-activate-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/activated.sock", dir);
	int lfd = bind_unix(SOCK_STREAM, path);
	assert_true(lfd >= 0);
	assert_int_equal(listen(lfd, 16), 0);
	struct daemon_opts o = {.listen_fd = lfd, .listen_path = path};
	struct daemon_proc d;
	assert_int_equal(daemon_start_with(&d, &o, 1, NULL), 0);
	close(lfd);

	struct raw_client c;
	assert_int_equal(raw_connect(&c, path, DFCCL_PROTO_MIN_VERSION, DFCCL_PROTO_VERSION, NULL), 0);
	dfccl_envelope *r = raw_query(&c, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
	assert_non_null(r);
	assert_int_equal(r->query_reply->status->n_devices, 1);
	frame_envelope_free(r);
	raw_close(&c);
	assert_true(daemon_log_contains(&d, "passed by systemd") >= 1);

	assert_int_equal(daemon_stop(&d), 0);
	/* systemd owns the socket file: the daemon leaves it. */
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	unlink(path);
	rmdir(dir);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_notify_and_watchdog),
	    cmocka_unit_test(test_socket_activation),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
