/*
 * nccl_lib.h declares NCCL's types, constants and calls itself, so that the
 * tools build without NCCL. This file, built only where nccl.h is found,
 * holds them against it at compile time: every (name, value) pair of its
 * lists, and the type of every call of struct nccl_api but ncclGroupStart
 * and ncclGroupEnd, which nccl.h declares without a prototype (any
 * parameter list would match them).
 */
#include <nccl.h>

#include "nccl_lib.h"

#define SAME_TYPE(fn, member)                                                                                      \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&fn), __typeof__(((struct nccl_api *)0)->member)), \
	               #fn " has the type of nccl_api." #member)

SAME_TYPE(ncclGetVersion, get_version);
SAME_TYPE(ncclGetUniqueId, get_unique_id);
SAME_TYPE(ncclCommInitRank, comm_init_rank);
SAME_TYPE(ncclCommDestroy, comm_destroy);
SAME_TYPE(ncclCommAbort, comm_abort);
SAME_TYPE(ncclCommGetAsyncError, comm_get_async_error);
SAME_TYPE(ncclGetErrorString, get_error_string);
SAME_TYPE(ncclGetLastError, get_last_error);
SAME_TYPE(ncclAllReduce, all_reduce);
SAME_TYPE(ncclBroadcast, broadcast);
SAME_TYPE(ncclReduce, reduce);
SAME_TYPE(ncclAllGather, all_gather);
SAME_TYPE(ncclReduceScatter, reduce_scatter);
SAME_TYPE(ncclSend, send);
SAME_TYPE(ncclRecv, recv);
SAME_TYPE(ncclMemAlloc, mem_alloc);
SAME_TYPE(ncclMemFree, mem_free);
SAME_TYPE(ncclCommWindowRegister, comm_window_register);
SAME_TYPE(ncclCommWindowDeregister, comm_window_deregister);

#define SAME_VALUE(name, value) _Static_assert((name) == (value), #name " is " #value " in nccl.h");
NCCL_LIB_RESULTS(SAME_VALUE)
NCCL_LIB_TYPES(SAME_VALUE)
NCCL_LIB_OPS(SAME_VALUE)
NCCL_LIB_MACROS(SAME_VALUE)
_Static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "a unique id has 128 bytes");
