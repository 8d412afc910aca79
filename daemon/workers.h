/*
 * The supervisor's side of the engine workers: one process per device.
 *
 * For each device the supervisor keeps what a worker needs to do its job
 * (the queue pairs of every session on that device, every registration of
 * every session, and a statistics page) and hands all of it to each worker
 * it starts, so a worker that dies can be replaced without the clients
 * doing anything: the collectives that were in flight on the device fail
 * with DEVICE_LOST, its communicators are told, and the new worker serves
 * the same queue pairs.
 *
 * Each worker runs as the identity worker_user.h chooses from the sessions
 * attached to its device; when that changes, the worker is replaced by a
 * planned restart (switching).
 *
 * Worker states: starting (spawned, no WorkerHello yet) -> ready ->
 * dead (exited; restart scheduled with back-off) -> starting ... ;
 * starting or ready -> switching (SIGTERM, then SIGKILL after
 * shutdown-grace-ms: its device needs a worker of another identity and has
 * no session it serves) -> starting at once; and stopping
 * (shutdown: SIGTERM, then SIGKILL after shutdown-grace-ms).
 */
#ifndef DFCCLD_WORKERS_H
#define DFCCLD_WORKERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "devices.h"
#include "dfccl.pb-c.h"

struct comm_blob;
struct server;
struct workers;

/* Spawns one worker per device. Returns 0 or a negative errno. */
int workers_new(struct server *srv, const struct device_desc *devs, unsigned ndevices, struct workers **out);

unsigned workers_ndevices(const struct workers *w);

/*
 * Whether a session of `uid` may attach to `device` now (worker_user_admit,
 * with the sessions attached anywhere as the holder). Returns 0, or -EPERM
 * with a sentence in err for the client.
 */
int workers_admit(struct workers *w, uid_t uid, uint32_t device, char *err, size_t errlen);

/*
 * Creates the queue pair of a session (uid, gid) on a device (memfd region
 * and doorbell eventfd) and hands it to the device's worker (now, or when it
 * is ready; first replacing a worker of another identity). Call
 * workers_admit first. The returned descriptors stay owned by the workers
 * table. Returns 0 or a negative errno.
 */
int workers_attach_qp(struct workers *w, uint32_t device, uint64_t session_id, uid_t uid, gid_t gid,
                      uint32_t sq_entries, uint32_t *qp_id, int *memfd, int *efd, size_t *size);

/* The descriptors of an existing queue pair (borrowed). 0 or -ENOENT. */
int workers_qp_fds(struct workers *w, uint32_t device, uint32_t qp_id, int *memfd, int *efd, size_t *size);

/* Closes a queue pair: the engine stops reading it. A device left without
 * sessions gets a worker of the daemon's own uid again. */
void workers_detach_qp(struct workers *w, uint32_t device, uint32_t qp_id);

/*
 * Adds a registration of a session of `uid` (fd borrowed and duplicated; -1
 * for none; ipc_handle copied, at most 64 bytes) and hands it to every
 * worker that serves that uid, whatever the device the memory lives on:
 * collectives read and write peers' buffers directly, so each worker maps
 * each buffer (host memory by its memfd, GPU memory by opening its CUDA IPC
 * handle). Each worker receives
 * WorkerAddReg{reg_id, session_id, kind, size, offset, ipc_handle}, now or
 * when it is next ready. Returns 0 when workers will acknowledge it
 * (session_reg_done is called once all have, with request_id), 1 when it is
 * recorded and there is nothing to wait for (no worker is up: replacements
 * get it), or a negative errno.
 */
int workers_add_reg(struct workers *w, uint32_t reg_id, uint64_t session_id, uid_t uid, int kind, uint64_t size,
                    uint64_t offset, const uint8_t *ipc_handle, size_t ipc_len, int fd, uint64_t request_id);
/*
 * Asks the worker of `device` for `size` bytes of device memory that will
 * become registration reg_id of session_id, of `uid` (a client's AllocMem,
 * request_id): now, or when a worker on its way up is ready (one that
 * serves the uid: under worker-user job the session attaches first).
 * session_alloc_done is called with the outcome: the exported descriptor,
 * or an error (also when the worker dies first). Returns 0, or -ENODEV when
 * that worker is dead (a restart pending), -ENOMEM.
 */
int workers_alloc_mem(struct workers *w, uint32_t device, uid_t uid, uint32_t reg_id, uint64_t session_id,
                      uint64_t request_id, uint64_t size);

/* Removes a registration from one device's worker (which also lets go of
 * an allocation it made for it). */
void workers_del_reg(struct workers *w, uint32_t device, uint32_t reg_id);
/* Removes a registration made with workers_add_reg from every worker. */
void workers_del_reg_all(struct workers *w, uint32_t reg_id);

/* Whether the worker of `device` is serving (1), on its way up -- starting,
 * or dead with a restart scheduled -- (0), or gone for good, the daemon
 * stopping (-1). */
int workers_device_up(const struct workers *w, uint32_t device);

/*
 * Hands a ready communicator's shared region (fd borrowed) to the worker of
 * `device`; its acknowledgement arrives through comm_worker_acked. Returns
 * 0, or -ENODEV when that worker is not running.
 */
int workers_comm_add(struct workers *w, uint32_t device, uint64_t comm_id, uint32_t nranks,
                     const Dfccl__V1__CommRank **members, int region_fd, size_t region_size);
/*
 * Hands the worker of `device` the blobs that the other workers of
 * communicator comm_id exported (peers, n: every device's non-empty one;
 * that of `device` itself is left out) as WorkerCommPeers; its
 * acknowledgement arrives through comm_worker_acked. Returns 0, -ENODEV
 * when that worker is not running, or -ENOMEM.
 */
int workers_comm_peers(struct workers *w, uint32_t device, uint64_t comm_id, const struct comm_blob *peers,
                       size_t n);
/* The communicator failed with status (DFCCL_CQ_*): the worker fails its
 * pending and later entries. */
void workers_comm_abort(struct workers *w, uint32_t device, uint64_t comm_id, uint32_t status);
/*
 * The communicator is gone: the workers of `devices` (bit d: device d) let
 * go of it. Where it spans several, each may still map memory the others
 * exported, so they are told to keep their own until every one of them has
 * released the others' (WorkerCommReleased) or died, and then to free it
 * (WorkerCommFree); with one, it frees everything at once.
 */
void workers_comm_del(struct workers *w, uint64_t devices, uint64_t comm_id);
/* Deleted communicators whose workers have not all released them yet. */
unsigned workers_comm_releases(const struct workers *w);

/* Fills status->devices / reply->stats / reply->queues (allocating; freed by
 * workers_query_free). */
int workers_fill_status(struct workers *w, Dfccl__V1__StatusInfo *st);
int workers_fill_stats(struct workers *w, Dfccl__V1__QueryReply *r);
int workers_fill_queues(struct workers *w, Dfccl__V1__QueryReply *r);
void workers_query_free(Dfccl__V1__QueryReply *r, Dfccl__V1__StatusInfo *st);

struct dfccl_qp_header;

/*
 * The supervisor's own mapping of a queue pair, for the watcher
 * (daemon/watch.h): the whole region from its header, and the entry count
 * the supervisor created it with (the header's copy is client-writable).
 * Valid until the queue pair is detached. Returns 0 or -ENOENT.
 */
int workers_qp_view(struct workers *w, uint32_t device, uint32_t qp_id, struct dfccl_qp_header **hdr,
                    uint32_t *entries);

/* Preemptions the engine of `device` counted so far (0 when unknown). */
uint64_t workers_preemptions(struct workers *w, uint32_t device);

/* Workers currently up (ready). */
unsigned workers_ready_count(const struct workers *w);

/* Stops every worker (SIGTERM, SIGKILL after the grace period); calls done
 * once all have exited and every handle is closed. */
void workers_stop(struct workers *w, void (*done)(struct server *srv));

/* Frees the table (after workers_stop completed). */
void workers_free(struct workers *w);

#endif
