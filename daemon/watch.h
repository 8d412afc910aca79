/*
 * The watcher: timeouts, `dfcclctl stuck` and the flight recorder, from the
 * supervisor alone.
 *
 * On a tick of watch-interval-ms (running only while a communicator exists)
 * the supervisor reads what it already maps: the header, submission entries
 * and completion words of every queue pair, and the posts of every ready
 * communicator's region (proto/dfccl_comm.h). Engines and clients do no
 * work per collective for it, so it sees either engine's communicators the
 * same way.
 *
 * Per communicator it follows the oldest NCCL-style collective instance
 * that some rank submitted and not every rank finished, and, among the
 * entries pending in the queues, the lowest run of each registered
 * collective id and the lowest message of each ordered pair of ranks
 * (sender -> receiver). When nothing about such an instance changed -- no
 * rank submitted it, posted it, progressed in it or finished it; for a
 * message, neither the sender's post nor the receiver's `want` or
 * acknowledgement in the mailbox -- for the communicator's timeout (comm.h,
 * comm_coll_timeout_ms), the communicator fails with DFCCL_CQ_TIMEOUT
 * through comm_fail, with a sentence naming the communicator, the
 * operation (the collective and its sequence number; the registered
 * collective's id and run number; Send or Recv with both ranks and the
 * message number) and the ranks that never submitted it, each told apart
 * as stopped (its library's heartbeat in the queue header is older than
 * heartbeat-stale-ms) or running. Detection happens on the first tick
 * after the timeout: within timeout + watch-interval-ms. `dfcclctl stuck`
 * shows every one of these instances that waited at least one tick, with
 * the state of each rank taking part in it.
 */
#ifndef DFCCLD_WATCH_H
#define DFCCLD_WATCH_H

#include <stdint.h>
#include <sys/types.h>

#include "dfccl.pb-c.h"

struct server;
struct session;
struct watch;
struct recorder;

/* Creates the watcher of srv (its timer starts with watch_comm_ready).
 * Returns 0 or -ENOMEM. */
int watch_new(struct server *srv, struct watch **out);

/* A communicator became ready: make sure the tick runs. */
void watch_comm_ready(struct watch *w);

/* One tick, now (also what the timer runs). */
void watch_tick(struct watch *w);

/* Stops the timer and frees the watcher once the handle is closed. */
void watch_close(struct watch *w);

/* The age of session s's newest heartbeat in ms (-1: none yet) and whether
 * it reads as stopped. */
int64_t watch_heartbeat_age_ms(struct watch *w, const struct session *s, int *stopped);

/* Fills reply->stuck with the instances of the communicators of `uid`
 * (every one for uid 0) that waited at least one tick: per communicator
 * the NCCL-style one, then the registered runs by id, then the messages
 * by sender and receiver. */
int watch_fill_stuck(struct watch *w, uid_t uid, Dfccl__V1__QueryReply *reply);
void watch_stuck_free(Dfccl__V1__QueryReply *reply);

/* The flight recorder of comm_id, live or gone, or NULL. */
struct recorder *watch_recorder(struct watch *w, uint64_t comm_id);

/* The tick, in ms: the precision of every time the watcher reports. */
uint32_t watch_interval_ms(const struct watch *w);

#endif
