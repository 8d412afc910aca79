/*
 * Messages, checks and the GPU skip of the GPU test programs; see
 * gputest.h.
 */
#include "gputest.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "membuf.h"

static const char *prog_name = "test";
static int self_rank = -1;

void gputest_init(const char *prog)
{
	prog_name = prog;
}

void gputest_set_rank(int rank)
{
	self_rank = rank;
}

int gputest_rank(void)
{
	return self_rank;
}

void gputest_say(const char *fmt, ...)
{
	char line[1024];
	int n = self_rank >= 0 ? snprintf(line, sizeof(line), "%s: rank %d: ", prog_name, self_rank)
	                       : snprintf(line, sizeof(line), "%s: ", prog_name);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	strcat(line, "\n");
	fputs(line, stderr);
}

bool gputest_cuda_ok(cudaError_t e, const char *what, int line)
{
	if (e == cudaSuccess)
		return true;
	gputest_say("line %d: %s: %s", line, what, cudaGetErrorString(e));
	return false;
}

bool gputest_dfccl_ok(dfcclResult_t r, const char *what, int line)
{
	if (r == dfcclSuccess)
		return true;
	gputest_say("line %d: %s: %s: %s", line, what, dfcclGetErrorString(r), dfcclGetLastError(NULL));
	return false;
}

bool gputest_mem_ok(int rc, const char *what, int line)
{
	if (rc == 0)
		return true;
	gputest_say("line %d: %s: %s", line, what, membuf_error());
	return false;
}

int gputest_usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "%s: %s '%s' (see %s --help)\n", prog_name, what, arg, prog_name);
	return TOOL_EXIT_USAGE;
}

int gputest_need_gpus(const struct tool_devices *gpus)
{
	int n = membuf_gpu_count(), need = 0;
	for (int i = 0; i < gpus->n; i++)
		need = gpus->dev[i] + 1 > need ? gpus->dev[i] + 1 : need;
	if (n <= 0) {
		printf("SKIPPED: no usable GPU (%s runs on GPU machines)\n", prog_name);
		return GPUTEST_EXIT_SKIP;
	}
	if (n < need) {
		printf("SKIPPED: the test names GPU %d, this machine has %d\n", need - 1, n);
		return GPUTEST_EXIT_SKIP;
	}
	return 0;
}
