/*
 * See conn.h. The descriptors of a queued frame travel with its first byte:
 * they are attached to the sendmsg() that starts the frame and closed once
 * that call succeeded, so a partially written frame never loses or repeats
 * them.
 */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

struct conn_outbuf {
	struct conn_outbuf *next;
	uint8_t *buf;
	size_t len, off;
	int fds[DFCCL_FRAME_MAX_FDS];
	unsigned nfds;
};

static void outbuf_free(struct conn_outbuf *o)
{
	if (!o)
		return;
	frame_close_fds(o->fds, o->nfds);
	free(o->buf);
	free(o);
}

static void conn_update_poll(struct conn *c);
static void conn_fail(struct conn *c, int err);

static void conn_end(struct conn *c, int err)
{
	if (c->closing)
		return;
	uv_poll_stop(&c->poll);
	uv_timer_stop(&c->timer);
	c->poll_events = 0;
	c->on_end(c, err);
}

/* Dispatches every complete frame in the reader. Returns 0, or a negative
 * errno after which the stream must end. */
static int conn_dispatch(struct conn *c)
{
	while (!c->closing && !c->failed) {
		dfccl_envelope *env;
		int fds[DFCCL_FRAME_MAX_FDS];
		unsigned nfds = 0;
		int rc = frame_reader_next(&c->rd, &env, fds, &nfds);
		if (rc == 0)
			return 0;
		if (rc == -EBADMSG || rc == -E2BIG) {
			/* The frame boundary is intact: the peer gets an error
			 * reply from the owner through a NULL envelope. */
			c->bad_frames++;
			c->on_frame(c, NULL, NULL, 0);
			continue;
		}
		if (rc < 0)
			return rc;
		c->frames_in++;
		c->on_frame(c, env, fds, nfds);
	}
	return 0;
}

static int conn_flush(struct conn *c)
{
	while (c->out_head) {
		struct conn_outbuf *o = c->out_head;
		int first = o->off == 0;
		int rc = frame_sendmsg(c->fd, o->buf + o->off, o->len - o->off, first ? o->fds : NULL,
		                       first ? o->nfds : 0);
		if (rc == -EAGAIN || rc == -EWOULDBLOCK)
			return 0;
		if (rc < 0)
			return rc;
		if (first) {
			frame_close_fds(o->fds, o->nfds);
			o->nfds = 0;
		}
		o->off += (size_t)rc;
		c->out_bytes -= (size_t)rc;
		if (o->off == o->len) {
			c->out_head = o->next;
			if (!c->out_head)
				c->out_tail = NULL;
			outbuf_free(o);
			c->frames_out++;
		}
	}
	return 0;
}

static void conn_poll_cb(uv_poll_t *h, int status, int events)
{
	struct conn *c = h->data;
	if (c->closing)
		return;
	if (status < 0) {
		conn_end(c, status);
		return;
	}
	if (events & UV_WRITABLE) {
		int rc = conn_flush(c);
		if (rc < 0 || (c->end_when_flushed && !c->out_head)) {
			conn_end(c, rc);
			return;
		}
	}
	if (c->end_when_flushed)
		events &= ~(UV_READABLE | UV_DISCONNECT); /* ignore what it says now */
	if (events & (UV_READABLE | UV_DISCONNECT)) {
		int rc = frame_reader_fill(&c->rd, c->fd);
		if (rc == -EAGAIN || rc == -EWOULDBLOCK) {
			rc = 1;
		} else if (rc > 0 || rc == -EMFILE) {
			int drc = conn_dispatch(c);
			if (rc == -EMFILE || drc < 0) {
				conn_end(c, rc == -EMFILE ? rc : drc);
				return;
			}
		}
		if (rc <= 0) {
			conn_end(c, rc);
			return;
		}
	}
	if (!c->closing)
		conn_update_poll(c);
}

static void conn_update_poll(struct conn *c)
{
	if (c->end_when_flushed || c->failed)
		return;
	int want = UV_READABLE | UV_DISCONNECT | (c->out_head ? UV_WRITABLE : 0);
	if (want != c->poll_events) {
		uv_poll_start(&c->poll, want, conn_poll_cb);
		c->poll_events = want;
	}
}

int conn_init(struct conn *c, uv_loop_t *loop, int fd, void *owner, conn_frame_cb on_frame, conn_end_cb on_end)
{
	memset(c, 0, sizeof(*c));
	c->fd = fd;
	c->owner = owner;
	c->on_frame = on_frame;
	c->on_end = on_end;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	int rc = uv_poll_init(loop, &c->poll, fd);
	if (rc < 0)
		return rc;
	c->poll.data = c;
	uv_timer_init(loop, &c->timer); /* cannot fail */
	c->timer.data = c;
	c->handles_open = 2;
	conn_update_poll(c);
	return 0;
}

int conn_send(struct conn *c, const dfccl_envelope *env, const int *fds, unsigned nfds)
{
	if (c->closing)
		return -EPIPE;
	if (c->failed)
		return c->failed; /* the stream is ending: a later frame must not overtake a lost one */
	if (nfds > DFCCL_FRAME_MAX_FDS) {
		conn_fail(c, -E2BIG);
		return -E2BIG;
	}
	if (c->out_bytes > CONN_MAX_QUEUED) {
		conn_fail(c, -ENOBUFS);
		return -ENOBUFS;
	}
	struct conn_outbuf *o = calloc(1, sizeof(*o));
	if (!o) {
		conn_fail(c, -ENOMEM);
		return -ENOMEM;
	}
	int rc = frame_encode(env, &o->buf, &o->len);
	if (rc < 0) {
		free(o);
		conn_fail(c, rc);
		return rc;
	}
	for (unsigned i = 0; i < nfds; i++) {
		o->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
		if (o->fds[i] < 0) {
			rc = -errno;
			o->nfds = i;
			outbuf_free(o);
			conn_fail(c, rc);
			return rc;
		}
	}
	o->nfds = nfds;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->out_bytes += o->len;
	/* Try at once: most replies fit in the socket buffer, and that saves a
	 * loop iteration. */
	rc = conn_flush(c);
	if (rc < 0) {
		/* Report through the loop so the owner is never re-entered from
		 * inside its own send. */
		uv_poll_start(&c->poll, UV_READABLE | UV_WRITABLE | UV_DISCONNECT, conn_poll_cb);
		c->poll_events = UV_READABLE | UV_WRITABLE | UV_DISCONNECT;
		return 0;
	}
	conn_update_poll(c);
	return 0;
}

void conn_end_after_flush(struct conn *c)
{
	if (c->closing)
		return;
	c->end_when_flushed = 1;
	/* The writable event ends the stream once the queue is empty (at once if
	 * it already is). */
	uv_poll_start(&c->poll, UV_WRITABLE, conn_poll_cb);
	c->poll_events = UV_WRITABLE;
}

static void conn_closed(uv_handle_t *h)
{
	struct conn *c = h->data;
	if (--c->handles_open == 0 && c->on_closed)
		c->on_closed(c);
}

static void conn_timer_cb(uv_timer_t *t)
{
	struct conn *c = t->data;
	conn_end(c, c->failed ? c->failed : -ETIMEDOUT);
}

/* A frame was lost: the peer would wait for it forever, so the stream ends,
 * from the loop (the owner may be in the middle of walking its lists). */
static void conn_fail(struct conn *c, int err)
{
	if (c->closing || c->failed)
		return;
	c->failed = err;
	/* Nothing more is read: requests would only get replies that cannot
	 * be sent either. */
	uv_poll_stop(&c->poll);
	c->poll_events = 0;
	uv_timer_start(&c->timer, conn_timer_cb, 0, 0);
}

void conn_set_deadline(struct conn *c, uint64_t ms)
{
	if (!c->closing && !c->failed)
		uv_timer_start(&c->timer, conn_timer_cb, ms, 0);
}

void conn_clear_deadline(struct conn *c)
{
	if (!c->closing && !c->failed)
		uv_timer_stop(&c->timer);
}

void conn_close(struct conn *c, conn_closed_cb on_closed)
{
	if (c->closing)
		return;
	c->closing = 1;
	c->on_closed = on_closed;
	while (c->out_head) {
		struct conn_outbuf *o = c->out_head;
		c->out_head = o->next;
		outbuf_free(o);
	}
	c->out_tail = NULL;
	c->out_bytes = 0;
	frame_reader_free(&c->rd);
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, conn_closed);
	uv_close((uv_handle_t *)&c->timer, conn_closed);
	close(c->fd);
	c->fd = -1;
}

int conn_feed(struct conn *c, const uint8_t *data, size_t len)
{
	if (c->closing)
		return -EPIPE;
	if (len == 0)
		return 0; /* nothing arrived: the reader may not even have a buffer */
	if (c->rd.cap - c->rd.len < len) {
		size_t cap = c->rd.len + len;
		uint8_t *nb = realloc(c->rd.buf, cap);
		if (!nb)
			return -ENOMEM;
		c->rd.buf = nb;
		c->rd.cap = cap;
	}
	memcpy(c->rd.buf + c->rd.len, data, len);
	c->rd.len += len;
	int rc = conn_dispatch(c);
	if (rc < 0)
		conn_end(c, rc);
	return rc;
}

