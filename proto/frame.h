/*
 * Framing of control messages on a stream socket.
 *
 * A frame is a 4-byte little-endian length L (1 <= L <= DFCCL_FRAME_MAX)
 * followed by L bytes of a packed dfccl.v1.Envelope. Descriptors are sent as
 * SCM_RIGHTS with the first sendmsg() of their frame; the kernel ends the read
 * that delivers them inside that sendmsg's bytes, so the reader remembers the
 * stream position of the last byte of that read and hands a frame exactly the
 * descriptors that arrived inside it. A peer cannot smuggle descriptors into
 * somebody else's frame, and a frame with a surprising number of descriptors
 * is the handler's to reject.
 *
 * Used by the daemon (non-blocking sockets, with an output queue), by the
 * client library and by the worker (blocking sockets).
 */
#ifndef DFCCL_FRAME_H
#define DFCCL_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "dfccl.pb-c.h"

/* The control protocol version of this tree (see proto/dfccl.proto). */
#define DFCCL_PROTO_VERSION 1u
#define DFCCL_PROTO_MIN_VERSION 1u

#define DFCCL_FRAME_HDR 4u
#define DFCCL_FRAME_MAX (1u << 20)  /* largest envelope accepted */
#define DFCCL_FRAME_MAX_FDS 8u      /* descriptors one frame may carry */

typedef Dfccl__V1__Envelope dfccl_envelope;

struct frame_reader {
	uint8_t *buf;   /* bytes received, not yet consumed */
	size_t len;     /* valid bytes in buf */
	size_t cap;     /* allocated bytes */
	uint64_t base;  /* stream position of buf[0] */
	int fds[4 * DFCCL_FRAME_MAX_FDS];
	uint64_t fd_pos[4 * DFCCL_FRAME_MAX_FDS]; /* stream position each fd arrived at */
	unsigned nfds;
};

#define FRAME_READER_INIT {0}

/* Frees the buffer and closes every descriptor not handed out. */
void frame_reader_free(struct frame_reader *r);

/*
 * Receives what the socket has (one recvmsg). Returns the number of bytes
 * read (> 0), 0 on orderly end of stream, or a negative errno (-EAGAIN on a
 * non-blocking socket with nothing to read). Descriptors beyond what the
 * reader can hold are closed and make the call fail with -EMFILE.
 */
int frame_reader_fill(struct frame_reader *r, int sock);

/*
 * Takes the next complete frame out of the reader: returns 1 with *env set
 * (free it with frame_envelope_free) and the frame's descriptors moved to
 * fds[0..*nfds) (the caller owns them; at most DFCCL_FRAME_MAX_FDS), 0 when no
 * complete frame is buffered, -EMSGSIZE for a length of 0 or above
 * DFCCL_FRAME_MAX, -EBADMSG for bytes that do not decode as an Envelope (that
 * frame is consumed and its descriptors closed), -E2BIG for a frame with more
 * than DFCCL_FRAME_MAX_FDS descriptors (consumed, descriptors closed).
 * After -EMSGSIZE the stream cannot be resynchronised: close it.
 */
int frame_reader_next(struct frame_reader *r, dfccl_envelope **env, int *fds, unsigned *nfds);

void frame_envelope_free(dfccl_envelope *env);

/* Packs env into a new buffer with its length prefix. Returns 0 or -errno. */
int frame_encode(const dfccl_envelope *env, uint8_t **out, size_t *len);

/*
 * One sendmsg() of buf[0..len), with fds attached when nfds > 0. Returns the
 * number of bytes sent or a negative errno. MSG_NOSIGNAL: a closed peer is
 * -EPIPE, never SIGPIPE.
 */
int frame_sendmsg(int sock, const uint8_t *buf, size_t len, const int *fds, unsigned nfds);

/* Encodes and sends a whole frame on a blocking socket (retries short writes
 * and EINTR). Returns 0 or a negative errno. */
int frame_send(int sock, const dfccl_envelope *env, const int *fds, unsigned nfds);

/*
 * Blocks until one frame arrives on a blocking socket, reading through r.
 * Returns 1 with the frame, 0 on end of stream, negative errno otherwise
 * (the errors of frame_reader_fill and frame_reader_next).
 */
int frame_recv(struct frame_reader *r, int sock, dfccl_envelope **env, int *fds, unsigned *nfds);

/* Closes fds[0..n). */
void frame_close_fds(const int *fds, unsigned n);

#endif /* DFCCL_FRAME_H */
