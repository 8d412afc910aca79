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

#ifdef __cplusplus
}
#endif

#endif /* DFCCL_INTERNAL_H */
