/*
 * Length-prefixed protobuf frames with SCM_RIGHTS descriptors; see frame.h.
 */
#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FRAME_READER_MAX_FDS (4 * DFCCL_FRAME_MAX_FDS)

void frame_close_fds(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

void frame_reader_free(struct frame_reader *r)
{
	if (!r)
		return;
	free(r->buf);
	frame_close_fds(r->fds, r->nfds);
	memset(r, 0, sizeof(*r));
}

static int reader_reserve(struct frame_reader *r, size_t extra)
{
	if (r->cap - r->len >= extra)
		return 0;
	size_t cap = r->cap ? r->cap : 4096;
	while (cap - r->len < extra)
		cap *= 2;
	uint8_t *nb = realloc(r->buf, cap);
	if (!nb)
		return -ENOMEM;
	r->buf = nb;
	r->cap = cap;
	return 0;
}

int frame_reader_fill(struct frame_reader *r, int sock)
{
	int rc = reader_reserve(r, 16384);
	if (rc < 0)
		return rc;

	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * DFCCL_FRAME_MAX_FDS * 2)];
	} ctrl;
	struct iovec iov = {.iov_base = r->buf + r->len, .iov_len = r->cap - r->len};
	struct msghdr msg = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf, .msg_controllen = sizeof(ctrl.buf)};
	ssize_t n;
	do {
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;

	int overflow = (msg.msg_flags & MSG_CTRUNC) != 0;
	/* Linux returns a message's descriptors when a read reaches the buffer
	 * that carries them, and ends that read inside it; the read may have
	 * begun in earlier frames that carried none. So the descriptors belong
	 * to the frame of the last byte read, not the first. */
	uint64_t pos = r->base + r->len + (n > 0 ? (uint64_t)n - 1 : 0);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		const unsigned char *data = CMSG_DATA(c);
		for (size_t i = 0; i < cnt; i++) {
			int fd;
			memcpy(&fd, data + i * sizeof(int), sizeof(int));
			if (r->nfds < FRAME_READER_MAX_FDS) {
				r->fds[r->nfds] = fd;
				r->fd_pos[r->nfds] = pos;
				r->nfds++;
			} else {
				close(fd);
				overflow = 1;
			}
		}
	}
	r->len += (size_t)n;
	if (overflow)
		return -EMFILE;
	return (int)n;
}

/* Moves the descriptors that arrived before stream position `end` out of the
 * reader: into out (up to max) or closed. Returns how many there were. */
static unsigned reader_take_fds(struct frame_reader *r, uint64_t end, int *out, unsigned max)
{
	unsigned taken = 0, keep = 0;
	for (unsigned i = 0; i < r->nfds; i++) {
		if (r->fd_pos[i] < end) {
			if (out && taken < max)
				out[taken] = r->fds[i];
			else
				close(r->fds[i]);
			taken++;
		} else {
			r->fds[keep] = r->fds[i];
			r->fd_pos[keep] = r->fd_pos[i];
			keep++;
		}
	}
	r->nfds = keep;
	return taken;
}

static void reader_consume(struct frame_reader *r, size_t n)
{
	memmove(r->buf, r->buf + n, r->len - n);
	r->len -= n;
	r->base += n;
}

int frame_reader_next(struct frame_reader *r, dfccl_envelope **env, int *fds, unsigned *nfds)
{
	*env = NULL;
	if (nfds)
		*nfds = 0;
	if (r->len < DFCCL_FRAME_HDR)
		return 0;
	uint32_t flen = (uint32_t)r->buf[0] | (uint32_t)r->buf[1] << 8 | (uint32_t)r->buf[2] << 16 |
	                (uint32_t)r->buf[3] << 24;
	if (flen == 0 || flen > DFCCL_FRAME_MAX)
		return -EMSGSIZE;
	size_t total = DFCCL_FRAME_HDR + (size_t)flen;
	if (r->len < total)
		return 0;

	uint64_t end = r->base + total;
	int tmp[FRAME_READER_MAX_FDS];
	unsigned got = reader_take_fds(r, end, tmp, FRAME_READER_MAX_FDS);
	dfccl_envelope *e =
	    dfccl__v1__envelope__unpack(NULL, flen, r->buf + DFCCL_FRAME_HDR);
	reader_consume(r, total);
	if (got > DFCCL_FRAME_MAX_FDS || !fds) {
		frame_close_fds(tmp, got < FRAME_READER_MAX_FDS ? got : FRAME_READER_MAX_FDS);
		if (got > DFCCL_FRAME_MAX_FDS) {
			frame_envelope_free(e);
			return -E2BIG;
		}
		if (!e)
			return -EBADMSG;
		*env = e;
		return 1;
	}
	if (!e) {
		frame_close_fds(tmp, got);
		return -EBADMSG;
	}
	memcpy(fds, tmp, got * sizeof(int));
	if (nfds)
		*nfds = got;
	*env = e;
	return 1;
}

void frame_envelope_free(dfccl_envelope *env)
{
	if (env)
		dfccl__v1__envelope__free_unpacked(env, NULL);
}

int frame_encode(const dfccl_envelope *env, uint8_t **out, size_t *len)
{
	size_t plen = dfccl__v1__envelope__get_packed_size(env);
	if (plen == 0 || plen > DFCCL_FRAME_MAX) {
		/* An empty envelope is packed as zero bytes; protobuf would accept it
		 * but the framing reserves length 0 as invalid. Every envelope we send
		 * has a body, so this is a programming error or an oversized reply. */
		return plen == 0 ? -EINVAL : -EMSGSIZE;
	}
	uint8_t *buf = malloc(DFCCL_FRAME_HDR + plen);
	if (!buf)
		return -ENOMEM;
	buf[0] = (uint8_t)plen;
	buf[1] = (uint8_t)(plen >> 8);
	buf[2] = (uint8_t)(plen >> 16);
	buf[3] = (uint8_t)(plen >> 24);
	dfccl__v1__envelope__pack(env, buf + DFCCL_FRAME_HDR);
	*out = buf;
	*len = DFCCL_FRAME_HDR + plen;
	return 0;
}

int frame_sendmsg(int sock, const uint8_t *buf, size_t len, const int *fds, unsigned nfds)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * DFCCL_FRAME_MAX_FDS)];
	} ctrl;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > DFCCL_FRAME_MAX_FDS)
		return -E2BIG;
	if (nfds > 0) {
		memset(&ctrl, 0, sizeof(ctrl));
		msg.msg_control = ctrl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	ssize_t n;
	do {
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : (int)n;
}

int frame_send(int sock, const dfccl_envelope *env, const int *fds, unsigned nfds)
{
	uint8_t *buf;
	size_t len;
	int rc = frame_encode(env, &buf, &len);
	if (rc < 0)
		return rc;
	size_t off = 0;
	while (off < len) {
		rc = frame_sendmsg(sock, buf + off, len - off, off == 0 ? fds : NULL, off == 0 ? nfds : 0);
		if (rc < 0)
			break;
		off += (size_t)rc;
		rc = 0;
	}
	free(buf);
	return rc;
}

int frame_recv(struct frame_reader *r, int sock, dfccl_envelope **env, int *fds, unsigned *nfds)
{
	for (;;) {
		int rc = frame_reader_next(r, env, fds, nfds);
		if (rc != 0)
			return rc;
		rc = frame_reader_fill(r, sock);
		if (rc <= 0)
			return rc;
	}
}
