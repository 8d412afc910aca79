/*
 * A framed, non-blocking connection on the supervisor's event loop: the
 * transport under a client session and under the channel to a worker.
 *
 * Reads are driven by a uv_poll_t: every complete frame is handed to the
 * owner's on_frame callback together with the descriptors that came with it
 * (the callback owns both). Writes are queued and flushed when the socket is
 * writable, so a client that stops reading never blocks the daemon; a queue
 * that grows beyond CONN_MAX_QUEUED bytes is treated as a dead peer.
 *
 * States: open -> closing (conn_close called: no more callbacks) -> closed
 * (the close callback ran; the owner may free the memory holding the conn).
 */
#ifndef DFCCLD_CONN_H
#define DFCCLD_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "frame.h"

#define CONN_MAX_QUEUED (8u << 20)

struct conn;
struct conn_outbuf;

/* A complete frame: the callback owns env (frame_envelope_free) and fds. */
typedef void (*conn_frame_cb)(struct conn *c, dfccl_envelope *env, int *fds, unsigned nfds);
/* The stream ended (err 0) or failed (negative errno, -EBADMSG etc. for a
 * malformed frame). No more frames follow; the owner should close. */
typedef void (*conn_end_cb)(struct conn *c, int err);
typedef void (*conn_closed_cb)(struct conn *c);

struct conn {
	int fd;
	int closing;
	uv_poll_t poll;
	int poll_events;
	struct frame_reader rd;
	struct conn_outbuf *out_head, *out_tail;
	size_t out_bytes;
	void *owner;
	conn_frame_cb on_frame;
	conn_end_cb on_end;
	conn_closed_cb on_closed;
	int end_when_flushed;
	uv_timer_t timer;           /* a deadline, or a failure reported from the loop */
	int failed;                 /* negative errno: a frame was lost, end with it */
	unsigned handles_open;      /* poll and timer: on_closed runs when both are closed */
	uint64_t frames_in, frames_out, bad_frames;
};

/* Takes ownership of fd (made non-blocking). Returns 0 or -errno. */
int conn_init(struct conn *c, uv_loop_t *loop, int fd, void *owner, conn_frame_cb on_frame, conn_end_cb on_end);

/*
 * Queues one frame. fds are duplicated, the caller keeps its own. Returns 0,
 * or a negative errno when the frame was not queued: -ENOBUFS when the peer
 * has stopped reading, -ENOMEM, -EMFILE... In every such case but -EPIPE
 * (already closing) the connection is ended with on_end(err) from the loop.
 */
int conn_send(struct conn *c, const dfccl_envelope *env, const int *fds, unsigned nfds);

/* Ends the stream (on_end(c, 0)) once everything queued has been written:
 * used to deliver a final error reply before hanging up. */
void conn_end_after_flush(struct conn *c);

/* Ends the stream with on_end(-ETIMEDOUT) after ms milliseconds unless
 * conn_clear_deadline is called first. */
void conn_set_deadline(struct conn *c, uint64_t ms);
void conn_clear_deadline(struct conn *c);

/* Stops callbacks and closes the descriptor; on_closed runs from the loop
 * once libuv has released the handle. Calling it twice is harmless. */
void conn_close(struct conn *c, conn_closed_cb on_closed);

/*
 * Feeds bytes as if they had arrived on the socket and dispatches the frames
 * they complete. Used by the fuzz target to drive the message handlers
 * without a peer. Returns what reading returned (0 ok, negative: ended).
 */
int conn_feed(struct conn *c, const uint8_t *data, size_t len);

#endif
