/*
 * dfccl-chaos: a deadlock stress test. Several ranks run collectives on
 * several communicators, each rank in its own random order, with random
 * sizes; under NCCL such orders deadlock, under dfccld every collective must
 * complete with the right data.
 *
 * It needs an engine that executes collectives; until the host engine
 * arrives this program only documents its interface and exits with status 3
 * on any run.
 */
#include "tool.h"

static const char usage[] =
    "Usage: dfccl-chaos [OPTIONS]\n"
    "Runs all-reduces on several communicators in a different random order on\n"
    "every rank and checks that all of them complete with correct results.\n"
    "\n"
    "      --nranks N       ranks, one process each (default 4)\n"
    "      --comms N        communicators shared by all ranks (default 4)\n"
    "      --iters N        collectives per communicator per rank (default 100)\n"
    "      --min-bytes SIZE smallest message (default 8; K, M, G suffixes)\n"
    "      --max-bytes SIZE largest message (default 1M)\n"
    "      --seed N         seed of the per-rank orders (default: time; printed)\n"
    "      --sync           wait for each collective before issuing the next\n"
    "      --registered     use registered (DFCCL-style) collectives\n"
    "  -h, --help           this text\n"
    "  -V, --version        the library version\n"
    "\n"
    "Exit status: 0 every collective completed correctly, 1 a failure or wrong\n"
    "data, 2 usage, 3 not available with this build.\n";

int main(int argc, char **argv)
{
	return tool_unavailable_main(argc, argv, "dfccl-chaos", usage, "collectives need the host engine");
}
