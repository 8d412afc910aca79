/*
 * The engine worker process: one per device (DESIGN.md, "Processes").
 *
 * Started by the supervisor as `dfccld --worker-device N --engine E`, with
 * its control socket on fd WORKER_CTL_FD and the device's statistics page on
 * fd WORKER_STATS_FD. It opens its device (a CUDA context for the cuda
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

#define WORKER_CTL_FD 3
#define WORKER_STATS_FD 4

struct dfccld_config;

/* Runs the worker for `device` with the settings it was started with
 * (engine, logging, scheduler thresholds); returns the exit code. */
int worker_main(unsigned device, const struct dfccld_config *cfg);

#endif
