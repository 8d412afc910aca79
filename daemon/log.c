/*
 * See log.h. The journal is written through sd_journal_send so that the
 * subsystem and code location become fields one can filter on
 * (journalctl DFCCL_SUBSYSTEM=comm).
 */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-journal.h>

int log_max_level = LOG_LEVEL_INFO;
static int log_to_journal;
static char log_ident[64] = "dfccld";

static const char *const level_names[] = {
    [LOG_LEVEL_ERR] = "err", [LOG_LEVEL_WARN] = "warn", [LOG_LEVEL_NOTICE] = "notice",
    [LOG_LEVEL_INFO] = "info", [LOG_LEVEL_DEBUG] = "debug",
};

const char *log_level_name(int level)
{
	if (level < LOG_LEVEL_ERR || level > LOG_LEVEL_DEBUG)
		return NULL;
	return level_names[level];
}

/* systemd sets JOURNAL_STREAM=dev:ino when stderr is a journal stream. */
static int stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	struct stat st;
	unsigned long long dev, ino;
	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_setup(int max_level, enum log_target target, const char *ident)
{
	log_max_level = max_level;
	if (ident)
		snprintf(log_ident, sizeof(log_ident), "%s", ident);
	switch (target) {
	case LOG_TARGET_JOURNAL:
		log_to_journal = 1;
		break;
	case LOG_TARGET_STDERR:
		log_to_journal = 0;
		break;
	default:
		log_to_journal = stderr_is_journal();
		break;
	}
}

void log_emit(int level, const char *subsys, const char *func, int line, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	if (log_to_journal) {
		char codeline[32];
		snprintf(codeline, sizeof(codeline), "CODE_LINE=%d", line);
		sd_journal_send_with_location("CODE_FILE=dfccld", codeline, func, "MESSAGE=%s: %s", subsys, msg,
		                              "PRIORITY=%d", level, "DFCCL_SUBSYSTEM=%s", subsys,
		                              "SYSLOG_IDENTIFIER=%s", log_ident, NULL);
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	localtime_r(&ts.tv_sec, &tm);
	const char *lname = log_level_name(level);
	/* Errors carry their origin (function:line) so they can be traced; the
	 * rest stay short. */
	if (level <= LOG_LEVEL_WARN)
		fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s %s: %s (%s:%d)\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
		        ts.tv_nsec / 1000000, log_ident, lname ? lname : "?", subsys, msg, func, line);
	else
		fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
		        ts.tv_nsec / 1000000, log_ident, lname ? lname : "?", subsys, msg);
}
