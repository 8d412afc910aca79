/*
 * dfccld's entry point. The same binary runs three ways: the supervisor (the
 * daemon proper, settings from config.c), an engine worker for one device
 * (`--worker-device N`, started only by the supervisor), and the GPU probes
 * (`--probe-devices`, and `--probe-topology`, which prints the detected
 * topology model as JSON; started by the supervisor, and useful by hand).
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "devices.h"
#include "log.h"
#include "server.h"
#include "topo_detect.h"
#include "worker.h"
#include "worker_user.h"

/* The worker's own arguments, all numbers. */
enum { WARG_DEVICE, WARG_UID, WARG_GID, WARG_PARKED, WARG_COUNT_ };
static const char *const worker_args[WARG_COUNT_] = {"--worker-device", "--worker-uid", "--worker-gid",
                                                     "--worker-parked"};

/* The worker's arguments: --worker-device N, the identity it is to have
 * (--worker-uid and --worker-gid together, --worker-parked), then settings
 * as --name VALUE pairs, read through the same table as the supervisor's.
 * Its own numbers parse strictly: a user id that does not parse must not
 * turn into another one. */
static int worker_entry(int argc, char **argv)
{
	unsigned long val[WARG_COUNT_] = {0};
	int seen[WARG_COUNT_] = {0};
	struct dfccld_config cfg;
	config_defaults(&cfg);
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		char err[256], *end;
		int a = 0;
		while (a < WARG_COUNT_ && strcmp(k, worker_args[a]) != 0)
			a++;
		if (a == WARG_COUNT_) {
			if (strncmp(k, "--", 2) != 0 || config_set(&cfg, k + 2, v, err, sizeof(err)) < 0)
				fprintf(stderr, "dfccld-worker: ignoring argument %s %s\n", k, v);
			continue;
		}
		errno = 0;
		val[a] = strtoul(v, &end, 10);
		if (errno || end == v || *end || v[0] == '-' || val[a] >= UINT32_MAX) {
			fprintf(stderr, "dfccld-worker: %s '%s' is not a number below %u\n", k, v, UINT32_MAX);
			return 2;
		}
		seen[a] = 1;
	}
	if (seen[WARG_UID] != seen[WARG_GID]) {
		fprintf(stderr, "dfccld-worker: --worker-uid and --worker-gid go together\n");
		return 2;
	}
	unsigned device = (unsigned)val[WARG_DEVICE];
	struct worker_ident id = {
	    .cred = {seen[WARG_UID] ? (uid_t)val[WARG_UID] : WORKER_KEEP_UID, (gid_t)val[WARG_GID]},
	    .parked = val[WARG_PARKED] != 0,
	};
	char ident[32];
	snprintf(ident, sizeof(ident), "dfccld-worker[%u]", device);
	log_setup(cfg.log_level, cfg.log_target, ident);
	return worker_main(device, &id, &cfg);
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "--probe-devices") == 0)
		return devices_probe_print(stdout);
	if (argc >= 2 && strcmp(argv[1], "--probe-topology") == 0)
		return topo_detect_print(stdout);
	if (argc >= 3 && strcmp(argv[1], "--worker-device") == 0)
		return worker_entry(argc, argv);

	struct dfccld_config cfg;
	char err[512];
	int rc = config_parse(&cfg, argc, argv, err, sizeof(err));
	if (rc == 1)
		return 0;
	if (rc < 0) {
		fprintf(stderr, "dfccld: %s\n", err);
		return 2;
	}
	log_setup(cfg.log_level, cfg.log_target, "dfccld");

	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		fprintf(stderr, "dfccld: cannot find its own executable (/proc/self/exe)\n");
		return 1;
	}
	exe[n] = '\0';
	return server_run(&cfg, exe);
}
