/* See notify.h. */
#include "notify.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>

#include <systemd/sd-daemon.h>

#include "log.h"

void notify_status(const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sd_notifyf(0, "STATUS=%s", msg);
}

void notify_ready(void)
{
	sd_notify(0, "READY=1");
}

void notify_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

void notify_watchdog(void)
{
	sd_notify(0, "WATCHDOG=1");
}

uint64_t notify_watchdog_usec(void)
{
	uint64_t usec = 0;
	if (sd_watchdog_enabled(0, &usec) > 0)
		return usec;
	return 0;
}

int notify_listen_fd(void)
{
	int n = sd_listen_fds(1);
	if (n <= 0)
		return -1;
	if (n > 1)
		log_warn("systemd", "systemd passed %d sockets; using the first", n);
	int fd = SD_LISTEN_FDS_START;
	if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
		log_err("systemd", "the socket passed by systemd is not a listening Unix stream socket; ignoring it");
		return -1;
	}
	return fd;
}
