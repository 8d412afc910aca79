/*
 * Fuzz target for the frame reader (proto/frame.c), without a socket: the
 * input is appended to a reader in chunks (the first byte picks the chunk
 * size, so frames arrive split at every possible point) and every complete
 * frame is taken out. A frame that decodes must survive a second trip
 * through frame_encode and the reader unchanged. Nothing may crash or leak.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "testutil.h"

/*
 * Whether m or any message inside it kept fields its schema does not know.
 * protobuf-c keeps them and packs them back in canonical form, which it does
 * not always accept again (an over-long tag 0 decodes as an unknown field,
 * the canonical tag 0 is refused), so the exact round trip below is only
 * asked of envelopes without them.
 */
static int has_unknown_fields(const ProtobufCMessage *m)
{
	if (m->n_unknown_fields)
		return 1;
	const ProtobufCMessageDescriptor *d = m->descriptor;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		const char *field = (const char *)m + f->offset;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
			ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)field;
			for (size_t k = 0; k < n; k++)
				if (has_unknown_fields(v[k]))
					return 1;
			continue;
		}
		/* A member of a oneof is there only when the case names it. */
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
			continue;
		const ProtobufCMessage *sub = *(ProtobufCMessage *const *)field;
		if (sub && has_unknown_fields(sub))
			return 1;
	}
	return 0;
}

/* Packs env, reads it back through a fresh reader, and checks it packs to
 * the same bytes again. */
static void check_roundtrip(const dfccl_envelope *env)
{
	if (has_unknown_fields(&env->base))
		return;
	uint8_t *buf;
	size_t len;
	int rc = frame_encode(env, &buf, &len);
	if (rc == -EINVAL || rc == -EMSGSIZE)
		return; /* an envelope with nothing to send, or too large to send */
	if (rc < 0)
		abort();
	struct frame_reader r = FRAME_READER_INIT;
	dfccl_envelope *again = NULL;
	if (tu_reader_append(&r, buf, len) < 0 || frame_reader_next(&r, &again, NULL, NULL) != 1 || r.len != 0)
		abort();
	size_t plen = dfccl__v1__envelope__get_packed_size(again);
	if (plen != len - DFCCL_FRAME_HDR)
		abort();
	uint8_t *p = malloc(plen);
	if (!p)
		abort();
	dfccl__v1__envelope__pack(again, p);
	if (memcmp(p, buf + DFCCL_FRAME_HDR, plen) != 0)
		abort();
	free(p);
	frame_envelope_free(again);
	frame_reader_free(&r);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	size_t chunk = (size_t)(data[0] & 0x3f) + 1;
	/* Half the inputs are read by a caller with no room for descriptors. */
	int want_fds = !(data[0] & 0x40);
	struct frame_reader r = FRAME_READER_INIT;
	int dead = 0;
	for (size_t off = 1; off < size && !dead; off += chunk) {
		size_t n = size - off < chunk ? size - off : chunk;
		if (tu_reader_append(&r, data + off, n) < 0)
			break;
		for (;;) {
			dfccl_envelope *env = NULL;
			int fds[DFCCL_FRAME_MAX_FDS];
			unsigned nfds = 0;
			int rc = frame_reader_next(&r, &env, want_fds ? fds : NULL, want_fds ? &nfds : NULL);
			if (rc == 0)
				break;
			if (rc == -EBADMSG || rc == -E2BIG) {
				if (env)
					abort();
				continue;
			}
			if (rc < 0) {
				/* -EMSGSIZE: the stream cannot be resynchronised. */
				if (rc != -EMSGSIZE || env)
					abort();
				dead = 1;
				break;
			}
			/* No socket, so no descriptors. */
			if (rc != 1 || !env || nfds != 0)
				abort();
			check_roundtrip(env);
			frame_envelope_free(env);
		}
	}
	frame_reader_free(&r);
	return 0;
}
