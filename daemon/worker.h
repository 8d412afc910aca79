/*
 * The engine worker process: one per device (DESIGN.md, "Processes").
 *
 * Started by the supervisor as `dfccld --worker-device N --engine E`, with
 * its control socket on fd WORKER_CTL_FD and the device's statistics page on
 * fd WORKER_STATS_FD; `--worker-uid U --worker-gid G` make it become that
 * user before anything else (worker_user_become), and `--worker-parked 1`
 * makes it a parked worker, which never opens its device and serves nothing
 * (worker_user.h says when). It opens its device (a CUDA context for the cuda
 * engine), says WorkerHello, then maps the queue pairs and registrations the
 * supervisor sends and serves their submission queues: every armed entry is
 * copied, checked against the registrations of the entry's own session, and
 * completed. In this release the engine completes DFCCL_OP_NOP and rejects
 * entries it cannot execute with a precise status; the scheduler and the
 * collectives run here once the engines exist.
 *
 * It exits when the supervisor closes the control socket or dies, or on
 * SIGTERM.
 */
#ifndef DFCCLD_WORKER_H
#define DFCCLD_WORKER_H

#include <sys/types.h>

#define WORKER_CTL_FD 3
#define WORKER_STATS_FD 4
/* worker_ident.cred.uid of a worker that keeps the credentials it was
 * started with. */
#define WORKER_KEEP_UID ((uid_t)-1)

struct dfccld_config;
struct worker_ident;

/* Runs the worker for `device` as `id` with the settings it was started with
 * (engine, logging, scheduler thresholds); returns the exit code. */
int worker_main(unsigned device, const struct worker_ident *id, const struct dfccld_config *cfg);

#endif
