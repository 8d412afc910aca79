/*
 * A client session: one connection on the daemon's socket.
 *
 * The session is the unit of ownership: queue pairs, registrations and
 * communicator memberships all belong to one session and are released when
 * it ends, however it ends (orderly close, SIGKILLed client, protocol error,
 * daemon shutdown). Resources are charged to the uid SO_PEERCRED reported.
 *
 * States: hello (only Hello accepted) -> ready -> closing (conn closing;
 * resources released at once) -> freed from the conn's close callback.
 */
#ifndef DFCCLD_SESSION_H
#define DFCCLD_SESSION_H

#include <stdint.h>
#include <sys/types.h>

#include "conn.h"
#include "dfccl.pb-c.h"

struct server;
struct user;

enum session_state { SESSION_HELLO, SESSION_READY, SESSION_CLOSING };

#define SESSION_MAX_DEVICES 64

struct session_reg {
	struct session_reg *next;
	uint32_t reg_id;
	uint32_t device;
	uint64_t size;
	unsigned nfds;           /* descriptors the supervisor keeps for it (fd budget) */
	/* Device memory of AllocMem: allocating (no worker answered yet), then
	 * the exported descriptor and the allocation's size until the reply
	 * hands them to the client. */
	int allocating;
	int alloc_fd;
	uint64_t map_size;
};

struct session {
	struct session *prev, *next;
	struct server *srv;
	struct conn conn;
	enum session_state state;
	uint64_t id;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	struct user *user;
	int sees_all;            /* root or an admin: queries show every user's objects */
	uint32_t version;
	char client_name[64];
	uint64_t created_ms;
	uint32_t qp_ids[SESSION_MAX_DEVICES]; /* 0: no queue pair on that device */
	struct session_reg *regs;
	unsigned nregs;
	uint64_t registered_bytes;
	unsigned bad_frames;
};

/*
 * Creates a session for an accepted connection (takes fd). Reads the peer's
 * credentials; refuses (closing fd, returning -EDQUOT) when the uid is at its
 * session quota. Returns 0 or a negative errno.
 */
int session_new(struct server *srv, int fd, struct session **out);

/* Ends a session: releases everything it holds and closes the connection. */
void session_end(struct session *s);

/* Tells the client, then ends the session once the notice is written. */
void session_end_with_notice(struct session *s, int code, const char *message);

/* Replies with body env (request_id is filled in). */
int session_reply(struct session *s, uint64_t request_id, Dfccl__V1__Envelope *env, const int *fds,
                  unsigned nfds);
int session_reply_error(struct session *s, uint64_t request_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int session_send_notice(struct session *s, int code, uint64_t comm_id, uint32_t device, const char *message);

/* A notice that carries a shrink advice: the n ranks of `exclude` (comm.h,
 * comm_shrink_advice). */
int session_send_shrink_notice(struct session *s, int code, uint64_t comm_id, uint32_t device, const char *message,
                               const uint32_t *exclude, size_t n);

/* The worker acknowledged (code 0) or refused a registration: answer the
 * client's RegisterMem (request_id) if the session still exists. */
void session_reg_done(struct server *srv, uint64_t session_id, uint64_t request_id, uint32_t reg_id, int code,
                      const char *message);

/*
 * The worker of `device` allocated the memory of a client's AllocMem
 * (request_id), to become registration reg_id (code 0; fd: the exported
 * allocation, taken by this call), or could not (code, message). Registers
 * it with every worker, answering the client once they all acknowledged;
 * if the session or its pending registration is gone, the descriptor is
 * closed and the worker told to let go of the allocation.
 */
void session_alloc_done(struct server *srv, uint64_t session_id, uint64_t request_id, uint32_t reg_id,
                        uint32_t device, int code, const char *message, int fd, uint64_t map_size);

/* Feeds raw bytes to the session's frame handler (fuzzing). */
int session_feed(struct session *s, const uint8_t *data, size_t len);

#endif
