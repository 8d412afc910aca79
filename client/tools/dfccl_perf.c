/*
 * dfccl-perf: bandwidth and latency of dfccl collectives, with the flags and
 * columns of nccl-tests so that results compare line by line.
 *
 * The measurement needs an engine that executes collectives; until the host
 * engine arrives this program only documents its interface and exits with
 * status 3 on any run.
 */
#include "tool.h"

static const char usage[] =
    "Usage: dfccl-perf COLLECTIVE [OPTIONS]\n"
    "COLLECTIVE: allreduce allgather reducescatter broadcast reduce sendrecv alltoall\n"
    "Measures dfccl collectives the way nccl-tests does: one line per size with\n"
    "size, count, type, redop, time, algbw, busbw and #wrong (busbw factors:\n"
    "all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, others 1).\n"
    "\n"
    "  -b, --minbytes SIZE    smallest size (default 8; K, M, G suffixes)\n"
    "  -e, --maxbytes SIZE    largest size (default 128M)\n"
    "  -f, --stepfactor N     multiply the size by N between lines (default 2)\n"
    "  -n, --iters N          timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N   untimed iterations per size (default 5)\n"
    "  -c, --check 0|1        check the results (default 1)\n"
    "      --nranks N         ranks, one process each, on this node (default: every device)\n"
    "      --dtype TYPE       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
    "      --op OP            reduction: sum prod max min avg (default sum)\n"
    "      --batch N          issue N collectives inside one group before waiting\n"
    "      --json             one JSON object per line instead of the table\n"
    "  -h, --help             this text\n"
    "  -V, --version          the library version\n"
    "\n"
    "Exit status: 0 success, 1 a collective failed or returned wrong data, 2 usage,\n"
    "3 not available with this build.\n";

int main(int argc, char **argv)
{
	return tool_unavailable_main(argc, argv, "dfccl-perf", usage, "collectives need the host engine");
}
