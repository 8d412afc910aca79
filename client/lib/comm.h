/*
 * Communicators: the client's record of one rank's membership in a
 * communicator the daemon created.
 *
 * Model. dfcclCommInitRank checks its arguments, makes sure the session has
 * a queue pair on the device, and asks the daemon to join; the reply makes
 * the communicator ready. From then on it is used by the collectives (which
 * take its queue pair, id and next per-communicator sequence number) until
 * dfcclCommDestroy or dfcclCommAbort frees it. Its asynchronous error (a
 * peer lost, an abort by another rank, the device's worker lost, the daemon
 * gone) arrives through the session's async slot and is checked before each
 * submission; once set it stays (first error wins).
 */
#ifndef DFCCL_CLIENT_COMM_H
#define DFCCL_CLIENT_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "client.h"
#include "dfccl.h"
#include "qp.h"

struct mem_handle;

struct dfcclComm {
	struct client *client;   /* reference held */
	struct qp *qp;           /* the session's queue pair on `device` */
	struct client_async async;
	uint64_t id;             /* daemon-wide communicator id */
	int nranks;
	int rank;
	int device;
	uint64_t next_seq;       /* atomic: comm_seq of the next submission */

	pthread_mutex_t lock;    /* handles */
	struct mem_handle *handles; /* dfcclCommRegister registrations (mem.c) */
};

/*
 * dfcclSuccess if collectives may be submitted on comm; otherwise its
 * asynchronous error (or dfcclDeviceLost when its queue pair is dead), with
 * the reason as the thread's last error.
 */
dfcclResult_t comm_check(struct dfcclComm *comm);

/* The per-communicator sequence number of the next submission (1, 2, ...). */
uint64_t comm_next_seq(struct dfcclComm *comm);

#endif /* DFCCL_CLIENT_COMM_H */
