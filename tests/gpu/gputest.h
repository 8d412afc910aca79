/*
 * What the GPU test programs share: messages that name the program and,
 * in a rank process, the rank; one check per error domain (the CUDA
 * runtime, libdfccl, membuf.h) that says which call failed where; the usage
 * error; and the skip when the GPUs a test names are not there.
 *
 * Messages go to stderr in one write per line, so that the lines of rank
 * processes writing at the same time do not interleave.
 */
#ifndef DFCCL_GPUTEST_H
#define DFCCL_GPUTEST_H

#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "dfccl.h"
#include "tool.h"

/* The exit status of a test that cannot run here (ctest: skipped). */
#define GPUTEST_EXIT_SKIP 77

/* The program's name for messages; the rank, in a rank process (-1: none). */
void gputest_init(const char *prog);
void gputest_set_rank(int rank);
int gputest_rank(void);

void gputest_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define CUDA_OK(call) gputest_cuda_ok((call), #call, __LINE__)
#define DFCCL_OK(call) gputest_dfccl_ok((call), #call, __LINE__)
#define MEM_OK(call) gputest_mem_ok((call), #call, __LINE__)
bool gputest_cuda_ok(cudaError_t e, const char *what, int line);
bool gputest_dfccl_ok(dfcclResult_t r, const char *what, int line);
bool gputest_mem_ok(int rc, const char *what, int line);

/* "PROG: WHAT 'ARG' (see PROG --help)"; returns TOOL_EXIT_USAGE. */
int gputest_usage_error(const char *what, const char *arg);

/* 0 when CUDA sees every GPU that gpus names; else prints why the test is
 * skipped and returns GPUTEST_EXIT_SKIP. Asks in a child process, so the
 * caller stays free of CUDA for the ranks it forks. */
int gputest_need_gpus(const struct tool_devices *gpus);

#endif /* DFCCL_GPUTEST_H */
