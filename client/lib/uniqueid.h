/*
 * The layout of a dfcclUniqueId.
 *
 * A unique id names a communicator before it exists: rank 0 draws one and
 * hands it to the other ranks out of band, and every rank presents it to the
 * daemon. It must be unguessable (the daemon lets only ranks of the same uid
 * join, but within a uid the id is the only secret), so most of it comes from
 * the kernel's CSPRNG. The 128 bytes are laid out as
 *
 *   [0, 4)    tag: 'D' 'F' 'C' and the layout version, so that garbage (or an
 *             NCCL id passed by mistake) is refused with a clear message
 *   [4, 8)    flags, little-endian: UNIQUEID_F_DERIVED for ids derived from
 *             another (uniqueid_derive), else zero
 *   [8, 40)   32 random bytes from getrandom()
 *   [40, 64)  bootstrap address of the owning daemon for communicators that
 *             span nodes: family (2 bytes), port (2 bytes, network order),
 *             address (16 bytes), reserved (4 bytes); zero for node-local ids
 *   [64, 128) reserved, zero
 */
#ifndef DFCCL_CLIENT_UNIQUEID_H
#define DFCCL_CLIENT_UNIQUEID_H

#include <stddef.h>
#include <stdint.h>

#include "dfccl.h"

#define UNIQUEID_VERSION 1u
#define UNIQUEID_RANDOM_BYTES 32u

struct uniqueid_layout {
	uint8_t tag[4];
	uint8_t flags[4];
	uint8_t random[UNIQUEID_RANDOM_BYTES];
	uint16_t bootstrap_family;
	uint16_t bootstrap_port;
	uint8_t bootstrap_addr[16];
	uint8_t bootstrap_reserved[4];
	uint8_t reserved[64];
};

_Static_assert(sizeof(struct uniqueid_layout) == DFCCL_UNIQUE_ID_BYTES, "unique id layout size");
_Static_assert(offsetof(struct uniqueid_layout, random) == 8, "unique id random offset");
_Static_assert(offsetof(struct uniqueid_layout, bootstrap_family) == 40, "unique id bootstrap offset");
_Static_assert(offsetof(struct uniqueid_layout, reserved) == 64, "unique id reserved offset");

/* Fills id with a fresh node-local id. Returns 0 or a negative errno. */
int uniqueid_generate(dfcclUniqueId *id);

/* 0 if id carries this library's tag, -EINVAL if not. */
int uniqueid_check(const dfcclUniqueId *id);

/* The id of a communicator made from parent's (shrink, split): the same on
 * every rank that derives it with the same salt, unguessable to whoever
 * does not know parent. It carries UNIQUEID_F_DERIVED. */
#define UNIQUEID_F_DERIVED 0x1u
void uniqueid_derive(const dfcclUniqueId *parent, const void *salt, size_t len, dfcclUniqueId *out);

#endif /* DFCCL_CLIENT_UNIQUEID_H */
