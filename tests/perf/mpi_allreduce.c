/*
 * mpi_allreduce: Open MPI's MPI_Allreduce measured exactly as dfccl-perf
 * measures dfcclAllReduce, so that the two tables compare line by line
 * (tests/perf/compare_mpi.sh runs both): the same flags (-b -e -f -n -w -c),
 * the same columns, out of place and then in place (MPI_IN_PLACE), per size
 * WARMUP untimed iterations, a barrier, then ITERS timed ones on rank 0's
 * clock; busbw = algbw * 2(n-1)/n. With -c 1 one more all-reduce of known
 * data (rank r contributes r + 1 + index % 7) is checked and #wrong summed
 * over the ranks.
 */
#include <errno.h>
#include <getopt.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Usage: mpi_allreduce [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
    "MPI_Allreduce of floats (sum) with dfccl-perf's columns; run under mpirun.\n";

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	switch (*end) {
	case 'K': case 'k': v <<= 10; end++; break;
	case 'M': case 'm': v <<= 20; end++; break;
	case 'G': case 'g': v <<= 30; end++; break;
	default: break;
	}
	if (*end)
		return -1;
	*out = v;
	return 0;
}

/* Time of one all-reduce in microseconds, and the wrong elements of a
 * checked one (summed over the ranks), for one size and placement. */
static void measure(float *send, float *recv, size_t count, int inplace, long warmup, long iters, int check,
                    int rank, int nranks, double *us, long *wrong)
{
	const void *s = inplace ? MPI_IN_PLACE : send;
	for (long i = 0; i < warmup; i++)
		MPI_Allreduce(s, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (long i = 0; i < iters; i++)
		MPI_Allreduce(s, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	*us = (MPI_Wtime() - t0) * 1e6 / (double)iters;
	*wrong = 0;
	if (!check)
		return;
	float *in = inplace ? recv : send;
	for (size_t i = 0; i < count; i++)
		in[i] = (float)(rank + 1 + (int)(i % 7));
	MPI_Allreduce(s, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	long bad = 0;
	for (size_t i = 0; i < count; i++)
		bad += recv[i] != (float)(nranks * (nranks + 1) / 2 + nranks * (int)(i % 7));
	MPI_Allreduce(&bad, wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
	uint64_t minb = 8, maxb = 64u << 20;
	long factor = 2, iters = 20, warmup = 5, check = 1;
	int opt;
	while ((opt = getopt(argc, argv, "b:e:f:n:w:c:h")) != -1) {
		switch (opt) {
		case 'b': if (parse_size(optarg, &minb)) goto bad; break;
		case 'e': if (parse_size(optarg, &maxb)) goto bad; break;
		case 'f': factor = strtol(optarg, NULL, 10); break;
		case 'n': iters = strtol(optarg, NULL, 10); break;
		case 'w': warmup = strtol(optarg, NULL, 10); break;
		case 'c': check = strtol(optarg, NULL, 10); break;
		case 'h': fputs(usage, stdout); return 0;
		default: goto bad;
		}
	}
	if (factor < 2 || iters < 1 || warmup < 0 || minb < 4 || minb > maxb)
		goto bad;

	MPI_Init(&argc, &argv);
	int rank, nranks;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	float *send = calloc(maxb / 4 + 1, 4), *recv = calloc(maxb / 4 + 1, 4);
	if (!send || !recv)
		MPI_Abort(MPI_COMM_WORLD, 1);
	double factor_bus = 2.0 * (nranks - 1) / nranks, bw_sum = 0;
	int nbw = 0;
	if (rank == 0) {
		printf("# mpi_allreduce: %d ranks, float, %ld warmup and %ld timed iterations per size\n", nranks, warmup,
		       iters);
		printf("#%58s %-31s %-31s\n", "", "out-of-place", "in-place");
		printf("#%11s %13s %9s %7s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
		       "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
	}
	for (uint64_t bytes = minb; bytes <= maxb; bytes *= (uint64_t)factor) {
		size_t count = bytes / 4;
		double us[2];
		long wrong[2];
		for (int ip = 0; ip < 2; ip++)
			measure(send, recv, count, ip, warmup, iters, (int)check, rank, nranks, &us[ip], &wrong[ip]);
		if (rank != 0)
			continue;
		printf(" %11zu %13zu %9s %7s %6d", count * 4, count, "float", "sum", -1);
		for (int ip = 0; ip < 2; ip++) {
			double algbw = (double)(count * 4) / (us[ip] * 1e-6) / 1e9;
			bw_sum += algbw * factor_bus;
			nbw++;
			printf(" %8.2f %7.2f %7.2f %6ld", us[ip], algbw, algbw * factor_bus, wrong[ip]);
		}
		printf("\n");
		fflush(stdout);
	}
	if (rank == 0)
		printf("# Avg bus bandwidth    : %g\n", nbw ? bw_sum / nbw : 0.0);
	free(send);
	free(recv);
	MPI_Finalize();
	return 0;
bad:
	fputs(usage, stderr);
	return 2;
}
