/*
 * Logging for dfccld (supervisor and workers): one function with a level and
 * a subsystem, printf-checked, and cheap when the level is off (the macros
 * test the level before any argument is evaluated). Messages go to the
 * systemd journal (with PRIORITY, DFCCL_SUBSYSTEM, CODE_FUNC and CODE_LINE
 * fields) when stderr is connected to it or the target says so, and to stderr
 * otherwise.
 */
#ifndef DFCCLD_LOG_H
#define DFCCLD_LOG_H

#include <stdarg.h>

enum log_level {
	LOG_LEVEL_ERR = 3,
	LOG_LEVEL_WARN = 4,
	LOG_LEVEL_NOTICE = 5,
	LOG_LEVEL_INFO = 6,
	LOG_LEVEL_DEBUG = 7,
};

enum log_target {
	LOG_TARGET_AUTO = 0, /* the journal if stderr is a journal stream, else stderr */
	LOG_TARGET_STDERR = 1,
	LOG_TARGET_JOURNAL = 2,
};

extern int log_max_level;

/* ident prefixes stderr lines ("dfccld", "dfccld-worker[3]"). */
void log_setup(int max_level, enum log_target target, const char *ident);

void log_emit(int level, const char *subsys, const char *func, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define log_at(level, subsys, ...)                                                   \
	do {                                                                         \
		if ((level) <= log_max_level)                                        \
			log_emit((level), (subsys), __func__, __LINE__, __VA_ARGS__); \
	} while (0)

#define log_err(subsys, ...) log_at(LOG_LEVEL_ERR, subsys, __VA_ARGS__)
#define log_warn(subsys, ...) log_at(LOG_LEVEL_WARN, subsys, __VA_ARGS__)
#define log_notice(subsys, ...) log_at(LOG_LEVEL_NOTICE, subsys, __VA_ARGS__)
#define log_info(subsys, ...) log_at(LOG_LEVEL_INFO, subsys, __VA_ARGS__)
#define log_debug(subsys, ...) log_at(LOG_LEVEL_DEBUG, subsys, __VA_ARGS__)

/* "err", "warn", ... for a level; NULL if unknown. */
const char *log_level_name(int level);

#endif /* DFCCLD_LOG_H */
