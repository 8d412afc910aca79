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
