/*
 * Results and the calling thread's last error.
 *
 * Every function of libdfccl that can fail returns a dfcclResult_t and, where
 * the failure originates, writes one sentence into the thread's last error
 * (dfcclGetLastError). Callers forward the result without touching the
 * message, so the sentence always describes the first thing that went wrong.
 * Inside the library the same convention holds for every module that
 * produces a public result: 0 (dfcclSuccess), or a positive dfcclResult_t
 * with the last error set. Helpers that only wrap system calls return 0 or a
 * negative errno and leave the sentence to their caller.
 *
 * DFCCL_DEBUG=WARN in the environment also prints each such origin with its
 * function and line on stderr.
 */
#ifndef DFCCL_CLIENT_ERRORS_H
#define DFCCL_CLIENT_ERRORS_H

#include <stdint.h>

#include "dfccl.h"

/* Records a failure: formats the thread's last error and returns `result`. */
dfcclResult_t errors_set_at(dfcclResult_t result, const char *func, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define errors_set(result, ...) errors_set_at((result), __func__, __LINE__, __VA_ARGS__)

/* The result a daemon ErrorCode (dfccl.v1.ErrorCode) stands for. */
dfcclResult_t errors_from_code(uint32_t code);

/* The thread's last error ("" if none). */
const char *errors_last(void);

#endif /* DFCCL_CLIENT_ERRORS_H */
