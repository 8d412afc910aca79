/*
 * systemd integration: readiness and status notification, the watchdog, and
 * the listening socket passed by socket activation. Every call is a no-op
 * when the daemon was not started by systemd.
 */
#ifndef DFCCLD_NOTIFY_H
#define DFCCLD_NOTIFY_H

#include <stdint.h>

void notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void notify_ready(void);
void notify_stopping(void);
void notify_watchdog(void);

/* The watchdog interval systemd asked for, in microseconds (0: none). */
uint64_t notify_watchdog_usec(void);

/* A listening AF_UNIX stream socket passed by systemd, or -1 (none), or a
 * negative errno other than -1 is never returned: misfits are logged and
 * ignored. */
int notify_listen_fd(void);

#endif
