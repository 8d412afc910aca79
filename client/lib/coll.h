/*
 * Collectives and group calls: the client half.
 *
 * Model. Each collective call is checked (communicator usable, data type,
 * reduction, root or peer, counts and buffer sizes), its buffers are
 * translated into (registration, offset) with bounds, and it becomes one
 * submission entry. Outside a group the entry is submitted on the
 * communicator's queue pair at once and the call returns without waiting:
 * completion is tracked by the communicator (req.h) and collected by
 * dfcclCommSynchronize / dfcclCommQuery, so a rank can issue collectives
 * on several communicators in any order without blocking on any of them.
 * Between dfcclGroupStart and the outermost dfcclGroupEnd the calling
 * thread's entries are held back; the outer GroupEnd submits them all in
 * call order, again without waiting. If a call inside a group fails its
 * checks, the group is submitted not at all and GroupEnd returns that
 * failure, so the ranks never see half of a group. Keys (comm_seq) are
 * assigned at submission, in call order (comm.h).
 *
 * AllToAll is a group of sends and receives, the block to this rank itself
 * copied locally. Registered collectives keep their descriptors in the
 * communicator; each run is one entry with the registered flag, its id and
 * its run number, and completes through a request (dfcclWait/dfcclTest)
 * and/or a callback on the completion thread.
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
