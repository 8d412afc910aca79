/*
 * dfccl_internal.h - diagnostic entry points of libdfccl that are not part
 * of its stable interface.
 *
 * They are exported so that tests and tools linked against libdfccl.so can
 * probe the daemon, but they may change or disappear in any release and are
 * not installed with dfccl.h.
 */
#ifndef DFCCL_INTERNAL_H
#define DFCCL_INTERNAL_H

#include "dfccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Submits a NOP entry on `device` through the process's session (attaching
 * the device's queue pair first if needed) and waits for its completion. */
dfcclResult_t dfcclInternalNop(int device);

/* Submits `count` NOP entries on `device`, stream-ordered on `stream` (a
 * cudaStream_t of the device): each is armed by the stream after the one
 * before completed, as a stream-ordered collective is, and the stream waits
 * for its completion. Returns once all of them completed. With issue_us,
 * the host time the calls took per entry besides their waits for earlier
 * entries' completions: posting, and queuing the arm and the wait on the
 * stream (where it is close to the time per entry, the host is what paces
 * the stream). */
dfcclResult_t dfcclInternalNopStream(int device, void *stream, long count, double *issue_us);

#ifdef __cplusplus
}
#endif

#endif /* DFCCL_INTERNAL_H */
