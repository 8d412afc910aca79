/*
 * The per-device statistics page shared by a worker and the supervisor.
 *
 * The supervisor creates one page per device in a memfd and hands it to the
 * worker it starts for that device (and to every replacement after a
 * restart, so counters survive a worker's death). The worker's engine is the
 * only writer; the supervisor reads it to answer dfcclctl without a round
 * trip to the worker, so a stuck worker cannot stall a query. Counters only
 * grow; readers use relaxed 64-bit loads.
 */
#ifndef DFCCL_STATS_H
#define DFCCL_STATS_H

#include <stdint.h>

#include "dfccl_queue.h"

#define DFCCL_STATS_MAGIC 0x3130535443434644ull /* "DFCCST01" */
#define DFCCL_STATS_SIZE 4096u
#define DFCCL_STATS_BLOCKS 40u /* daemon-kernel blocks counted apiece (by_block) */

struct dfccl_worker_stats {
	uint64_t magic;            /* supervisor, at creation */
	uint32_t device;           /* supervisor */
	uint32_t reserved0;
	uint64_t completed;        /* worker: entries completed with DFCCL_CQ_OK */
	uint64_t errors;           /* worker: entries completed with an error status */
	uint64_t preemptions;      /* worker: collectives preempted */
	uint64_t context_switches; /* worker: task switches */
	uint64_t spins;            /* worker: polling rounds that found nothing */
	uint64_t doorbells;        /* worker: wake-ups by a doorbell */
	uint64_t heartbeat_ns;     /* worker: CLOCK_MONOTONIC of its last loop turn */
	uint64_t by_algo[DFCCL_ALGO_COUNT_]; /* worker: collectives started, by enum dfccl_algo
	                                      * (send/recv and all-to-all count as direct) */
	uint64_t kernel_launches;  /* worker (CUDA engine): daemon-kernel launches */
	uint64_t kernel_quits;     /* worker (CUDA engine): voluntary quits of the daemon kernel */
	uint64_t by_block[DFCCL_STATS_BLOCKS]; /* worker (CUDA engine): entries each block of the daemon kernel
	                                        * completed, with either status (the queue reader's own, NOPs
	                                        * and refusals, are in completed and errors only) */
	uint64_t kernel_gated;     /* worker (CUDA engine): daemon-kernel launches queued behind a gate (launch-gate) */
	uint64_t early_taken;      /* worker (CUDA engine): stream-ordered entries taken before their arm (early-take) */
	uint64_t early_given_back; /* worker (CUDA engine): those of them given back to their queues unarmed */
	uint8_t reserved[DFCCL_STATS_SIZE - 112 - 8 * DFCCL_ALGO_COUNT_ - 8 * DFCCL_STATS_BLOCKS];
};

DFCCL_STATIC_ASSERT(sizeof(struct dfccl_worker_stats) == DFCCL_STATS_SIZE, "stats page size");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_worker_stats, completed) == 16, "completed offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_worker_stats, errors) == 24, "errors offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_worker_stats, preemptions) == 32, "preemptions offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_worker_stats, heartbeat_ns) == 64, "heartbeat offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_worker_stats, by_algo) == 72, "by_algo offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_worker_stats, kernel_launches) == 72 + 8 * DFCCL_ALGO_COUNT_,
                    "kernel_launches offset");
DFCCL_STATIC_ASSERT(offsetof(struct dfccl_worker_stats, by_block) == 88 + 8 * DFCCL_ALGO_COUNT_, "by_block offset");

#endif
