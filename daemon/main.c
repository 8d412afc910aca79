/*
 * dfccld's entry point. The same binary runs three ways: the supervisor (the
 * daemon proper, settings from config.c), an engine worker for one device
 * (`--worker-device N`, started only by the supervisor), and the GPU probes
 * (`--probe-devices`, and `--probe-topology`, which prints the detected
 * topology model as JSON; started by the supervisor, and useful by hand).
 */
#include <limits.h>
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

/* The worker's arguments: --worker-device N, then settings as --name VALUE
 * pairs, read through the same table as the supervisor's. */
static int worker_entry(int argc, char **argv)
{
	unsigned device = 0;
	struct dfccld_config cfg;
	config_defaults(&cfg);
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		char err[256];
		if (strcmp(k, "--worker-device") == 0)
			device = (unsigned)strtoul(v, NULL, 10);
		else if (strncmp(k, "--", 2) != 0 || config_set(&cfg, k + 2, v, err, sizeof(err)) < 0)
			fprintf(stderr, "dfccld-worker: ignoring argument %s %s\n", k, v);
	}
	char ident[32];
	snprintf(ident, sizeof(ident), "dfccld-worker[%u]", device);
	log_setup(cfg.log_level, cfg.log_target, ident);
	return worker_main(device, &cfg);
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
