/*
 * Unique ids: a tag, flags and 32 bytes from getrandom(); see uniqueid.h.
 * dfcclGetUniqueId needs no daemon, so ids can be drawn before dfccld is up.
 */
#include "uniqueid.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "errors.h"

static const uint8_t uniqueid_tag[4] = {'D', 'F', 'C', UNIQUEID_VERSION};

int uniqueid_generate(dfcclUniqueId *id)
{
	struct uniqueid_layout l;
	memset(&l, 0, sizeof(l));
	memcpy(l.tag, uniqueid_tag, sizeof(l.tag));

	/* getrandom() of at most 256 bytes never returns short once the pool is
	 * initialised, but it can be interrupted while it is not yet. */
	size_t got = 0;
	while (got < sizeof(l.random)) {
		ssize_t n = getrandom(l.random + got, sizeof(l.random) - got, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		got += (size_t)n;
	}
	memcpy(id->internal, &l, sizeof(l));
	return 0;
}

/* splitmix64's finaliser. */
static uint64_t uniqueid_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Absorbs len bytes into the state word h. */
static uint64_t uniqueid_absorb(uint64_t h, const void *p, size_t len)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < len; i++)
		h = uniqueid_mix(h ^ ((uint64_t)b[i] << (8 * (i % 8))) ^ i);
	return h;
}

void uniqueid_derive(const dfcclUniqueId *parent, const void *salt, size_t len, dfcclUniqueId *out)
{
	struct uniqueid_layout l;
	memcpy(&l, parent->internal, sizeof(l));
	uint64_t h = uniqueid_absorb(0x6466636364657269ull, salt, len);
	/* Each output word depends on every parent random byte, the salt and
	 * its position. */
	uint8_t random[UNIQUEID_RANDOM_BYTES];
	for (size_t w = 0; w < UNIQUEID_RANDOM_BYTES / 8; w++) {
		uint64_t v = uniqueid_absorb(h ^ uniqueid_mix(w + 1), l.random, sizeof(l.random));
		memcpy(random + 8 * w, &v, 8);
	}
	memcpy(l.random, random, sizeof(random));
	l.flags[0] |= UNIQUEID_F_DERIVED;
	memcpy(out->internal, &l, sizeof(l));
}

int uniqueid_check(const dfcclUniqueId *id)
{
	return memcmp(id->internal, uniqueid_tag, sizeof(uniqueid_tag)) ? -EINVAL : 0;
}

dfcclResult_t dfcclGetUniqueId(dfcclUniqueId *uniqueId)
{
	if (!uniqueId)
		return errors_set(dfcclInvalidArgument, "dfcclGetUniqueId: uniqueId is NULL");
	int rc = uniqueid_generate(uniqueId);
	if (rc < 0)
		return errors_set(dfcclSystemError, "cannot draw a unique id: getrandom: %s", strerror(-rc));
	return dfcclSuccess;
}
