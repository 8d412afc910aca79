/*
 * `dfcclctl tune`: measures on the running daemon which algorithm is
 * fastest per collective and message size, and writes the result as a
 * tuning file (topology/topo_json.h) for dfccld's `tuning-file` setting.
 *
 * Every (collective, algorithm) pair is one sweep of bench.h in fresh rank
 * processes whose DFCCL_ALGO names the algorithm, so that every entry they
 * submit asks the engine for it. Every size is checked on reference data as
 * well: an algorithm that returns a wrong element fails the whole run, and
 * no file is written, so a broken algorithm can never be the fastest.
 */
#ifndef DFCCL_TUNE_H
#define DFCCL_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tune_opts {
	int nranks;         /* 0: 2, or the daemon's device count if larger */
	unsigned colls;     /* a bit per tool.h collective (1u << TOOL_ALLREDUCE, ...); 0: every one with a choice */
	uint64_t min_bytes, max_bytes;
	long factor, iters, warmup;
	const char *output; /* NULL: the tuning file goes to stdout */
	bool json;          /* the tuning file alone, no table */
};

#define TUNE_OPTS_INIT {.min_bytes = 8, .max_bytes = 64u << 20, .factor = 4, .iters = 20, .warmup = 5}

/* Largest size tune measures, and the rank counts it accepts. */
#define TUNE_MAX_BYTES (4ull << 30)
#define TUNE_MAX_RANKS 64

/*
 * Parses a comma-separated list of collectives into o->colls. Returns 0, or
 * -EINVAL with err saying which name is not a collective with an algorithm
 * to choose.
 */
int tune_colls_parse(struct tune_opts *o, const char *list, char *err, size_t errlen);

/* Whether the options go together; -EINVAL with err saying why not. */
int tune_opts_check(const struct tune_opts *o, char *err, size_t errlen);

/*
 * Runs the measurements against the daemon at socket_path and prints or
 * writes the tuning file. Returns the exit status: 0, TOOL_EXIT_FAIL (the
 * daemon cannot be reached, a measurement failed or the file cannot be
 * written; no file is left behind), or TOOL_EXIT_USAGE (no size of the
 * sweep suits the daemon's rank count).
 */
int tune_run(const struct tune_opts *o, const char *socket_path);

#endif /* DFCCL_TUNE_H */
