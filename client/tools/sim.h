/*
 * The deadlock-risk model of dfccl-sim: rounds of simulated collective
 * invocations on a layout (sim_layout.h), under NCCL-style execution, and
 * whether each round deadlocks.
 *
 * A round starts afresh. GPUs take steps in turn (round-robin over GPUs)
 * until every GPU has invoked all of its collectives or a deadlock is
 * found. A step invokes the GPU's next collective, picked with disorder:
 * the GPU walks down its remaining list and skips each candidate with the
 * disorder probability (never the last one), taking the first it does not
 * skip. Two models say what invoking means:
 *
 * Single queue (as the published simulator has it): each group runs its
 * collectives one at a time, in the order its GPUs invoke them. A GPU may
 * invoke its next collective in a group only after the group's current
 * collective has been invoked by all of the group's GPUs (until then the
 * GPU waits, holding its pick). If the GPUs of a group have invoked
 * different collectives that are not yet done, that is a deadlock; so is a
 * sweep in which every GPU that is not finished waits (a cycle of waits
 * through several groups). Collectives of different groups do not wait for
 * each other here; whether one stream per GPU shared by all groups would
 * deadlock is whether the per-GPU orders admit one common order (the
 * layout's `consistent`, which a trace replay reports as well).
 *
 * Synchronization: at each step, with the sync probability, the GPU
 * synchronizes instead of invoking: it is suspended until every collective
 * it has invoked is done (invoked by all GPUs of its group). Resources are
 * otherwise unlimited. Deadlock is a cycle in the dependency graph among
 * suspended GPUs: GPU a waits for GPU b when a invoked a collective that
 * is not done and that b, suspended, has not invoked. The exact decision
 * looks for a cycle after every suspension (only a suspension can close
 * one, and it must pass through the GPU just suspended). The published
 * simulator's shortcut instead calls a newly suspended GPU deadlocked when
 * it waits for some suspended GPU and some suspended GPU waits for it,
 * whether or not the two chains meet; it reports every deadlock the exact
 * check finds, and also chains that will still resolve.
 *
 * Two engines compute rounds. The literal one draws every decision as the
 * published simulator does (a random number per candidate and per step,
 * remaining lists as arrays) over all GPUs at once: the reference. The
 * fast one samples the distance to the next skip and the next
 * synchronization instead of drawing per pick, keeps each GPU's remaining
 * list as a position in its expected order plus the few collectives taken
 * ahead of it, simulates components separately, and does not step a
 * component in which nothing can deadlock: in the single-queue model one
 * without any skip, in the synchronization model (exact decision) one in
 * which no GPU synchronizes while a skipped collective is still pending
 * (without that, every synchronization separates collectives in the one
 * order all GPUs agree on, so no cycle can form). Both give the same
 * distribution of outcomes; the fast one is what makes 3072-GPU layouts
 * run in seconds.
 */
#ifndef DFCCL_SIM_H
#define DFCCL_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "sim_layout.h"

enum sim_model { SIM_SINGLE_QUEUE, SIM_SYNC };
enum sim_decision { SIM_EXACT, SIM_SHORTCUT };
enum sim_engine { SIM_FAST, SIM_LITERAL };

struct sim_params {
	enum sim_model model;
	enum sim_decision decision; /* synchronization model only */
	enum sim_engine engine;
	double disorder; /* probability of skipping a candidate */
	double sync;     /* probability that a step synchronizes (synchronization model) */
	uint64_t seed;
};

enum sim_verdict {
	SIM_DONE,       /* every GPU invoked everything, every collective completed */
	SIM_MISMATCH,   /* single queue: a group's GPUs invoked different collectives */
	SIM_STALL,      /* every GPU left waits, and no decision above named it */
	SIM_CYCLE,      /* synchronization: a cycle of suspended GPUs (exact) */
	SIM_CHAIN,      /* synchronization: the shortcut's chain of suspended GPUs */
	SIM_INCOMPLETE, /* a trace ended with collectives some member never invokes */
};

#define SIM_REPORT_GPUS 32

/* Where a round deadlocked (what a trace replay prints). */
struct sim_report {
	enum sim_verdict verdict;
	int64_t sweep; /* round-robin pass (from 0) in which it was found */
	int gpu;       /* the GPU whose step found it */
	int group;     /* mismatch: the group, and its two collectives */
	int32_t coll[2];
	/* Cycle or stall: the GPUs (in order along the cycle) and, for each,
	 * the collective it waits on; n may exceed SIM_REPORT_GPUS (listed: the
	 * first ones). */
	int n;
	int gpus[SIM_REPORT_GPUS];
	int32_t waits[SIM_REPORT_GPUS];
	int32_t *invoked; /* if set by the caller (ngpus entries): invocations per GPU */
};

struct sim_work;

struct sim_work *sim_work_new(const struct sim_layout *l);
void sim_work_free(struct sim_work *w);

/* Runs round number `round` (its randomness depends on seed and round only);
 * returns true when it deadlocks. rep may be NULL; the literal engine fills
 * only its verdict (SIM_STALL for any deadlock). The sync probability must
 * be below 1. */
bool sim_round(const struct sim_layout *l, const struct sim_params *p, uint64_t round, struct sim_work *w,
               struct sim_report *rep);

struct sim_result {
	uint64_t rounds, deadlocks;
	double seconds;
};

/* Called about twice a second from the calling thread while rounds run. */
typedef void sim_progress_fn(uint64_t done, uint64_t total, uint64_t deadlocks, double seconds, void *arg);

/* Runs rounds 0 .. rounds-1 on `threads` threads; the counts do not depend
 * on the thread count. Returns 0, -EINVAL for a sync probability of 1 in
 * the synchronization model (no round would end), or another negative
 * errno. */
int sim_run(const struct sim_layout *l, const struct sim_params *p, uint64_t rounds, int threads,
            sim_progress_fn *progress, void *arg, struct sim_result *res);

/* The 95 % Wilson score interval of k successes in n trials. */
void sim_wilson(uint64_t k, uint64_t n, double *lo, double *hi);

/* How many standard errors lie between a measured ratio (k of n) and an
 * expected one, the latter itself an estimate from n_ref rounds (0: exact). */
double sim_zscore(uint64_t k, uint64_t n, double expected, uint64_t n_ref);

const char *sim_verdict_name(enum sim_verdict v);

#endif /* DFCCL_SIM_H */
