/*
 * Shared by the topology unit tests: the synthetic models shipped in
 * tests/topology (TOPO_MODELS_DIR is set by tests/unit/CMakeLists.txt), and
 * the identity rank-to-device map of a whole-node communicator.
 */
#ifndef DFCCL_TOPO_FIXTURE_H
#define DFCCL_TOPO_FIXTURE_H

#include <stdio.h>

#include "topo_json.h"

/* Loads tests/topology/<file>; fails the test with the loader's message. */
static inline struct topo_model *fixture_model(const char *file)
{
	char path[512], err[512] = "";
	struct topo_model *m = NULL;
	snprintf(path, sizeof(path), "%s/%s", TOPO_MODELS_DIR, file);
	if (topo_json_load_file(path, &m, err, sizeof(err)) < 0)
		fail_msg("loading %s: %s", path, err);
	return m;
}

static inline const unsigned *fixture_identity(void)
{
	static unsigned ids[TOPO_MAX_RANKS];
	for (unsigned i = 0; i < TOPO_MAX_RANKS; i++)
		ids[i] = i;
	return ids;
}

#endif
