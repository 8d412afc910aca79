/*
 * The CUDA engine: the host side of a GPU's daemon kernel, in the worker
 * that owns the GPU (gpu/engine.h is its interface; dkernel.h the contract
 * with the kernel).
 *
 * It keeps the kernel's tables in device memory (queue pairs, communicators,
 * registrations), maps what the kernel must reach in host memory (each
 * queue-pair region and the synchronisation part of each communicator
 * region, registered with the driver; host-memory buffers), opens GPU
 * buffers of every process (legacy CUDA IPC handles, and VMM allocations
 * passed as file descriptors: client/lib/cudrv.h), allocates the device memory of
 * dfcclMemAlloc, launches the kernel when an entry is armed while it is not
 * running, notices when it quit (it quits by itself after `kernel-idle-us`
 * with nothing to do), wakes client threads that sleep on a queue's
 * completion count (the GPU cannot wake a futex), and copies the kernel's
 * counters to the statistics page. A GPU error (a poisoned context) is
 * fatal: the worker exits and the supervisor restarts it.
 */
#ifndef DFCCL_CUDA_ENGINE_H
#define DFCCL_CUDA_ENGINE_H

#include <stddef.h>

#include "engine.h"

#if defined(__cplusplus)
extern "C" {
#endif

/* Creates the engine for the current CUDA device (made current by
 * devices_open_cuda). Returns 0 or a negative errno with a sentence in err. */
int cuda_engine_ops_new(const struct engine_config *cfg, const struct engine_ops **ops, void **impl, char *err,
                        size_t errlen);

#if defined(__cplusplus)
}
#endif

#endif /* DFCCL_CUDA_ENGINE_H */
