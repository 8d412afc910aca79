/*
 * Collectives and group calls: the client half.
 *
 * Model. Each collective call is checked (communicator usable, data type,
 * reduction, root or peer, counts), its buffers are translated into
 * (registration, offset) with bounds, and it becomes one submission entry.
 * Outside a group the entry is submitted on the communicator's queue pair
 * and the call waits for its completion. Between dfcclGroupStart and the
 * outermost dfcclGroupEnd the calling thread's entries are held back; the
 * outer GroupEnd submits them all in call order, then waits for every one.
 * If a call inside a group fails its checks, the group is submitted not at
 * all and GroupEnd returns that failure, so the ranks never see half of a
 * group. Per-communicator sequence numbers (comm_seq) are assigned at
 * submission, in call order.
 */
#ifndef DFCCL_CLIENT_COLL_H
#define DFCCL_CLIENT_COLL_H

#include <stddef.h>

#include "dfccl.h"

/* Bytes of one element of dtype; 0 for an unknown type. */
size_t coll_dtype_size(int dtype);

/* The calling thread's dfcclGroupStart nesting depth. */
int coll_group_depth(void);

#endif /* DFCCL_CLIENT_COLL_H */
