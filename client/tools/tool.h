/*
 * What the command-line tools (and the collective tests) share: the
 * standard options, parsing of sizes, data types, reductions and collective
 * names, rank processes, and the reference data of a collective.
 *
 * Reference data. Every rank fills its send buffer with a deterministic
 * function of (key, rank, index), where the key stands for whatever makes a
 * collective distinct (a seed, an iteration, a communicator), so every rank
 * can compute the expected result of every collective on its own. The
 * values are small integers (signed types get negative ones too) chosen so
 * that every reduction of up to 64 ranks is exact in every data type,
 * float16 and bfloat16 included, and no integer type overflows: sums of
 * values in [-4, 4], products of at most three factors of 2 or -1. An
 * average is the sum divided by the rank count, truncated for integer
 * types; floating-point averages are compared with a tolerance of the
 * type's precision, since an engine may divide or multiply by 1/n.
 */
#ifndef DFCCL_TOOL_H
#define DFCCL_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dfccl.h"

/* Exit statuses of the tools. */
#define TOOL_EXIT_FAIL 1
#define TOOL_EXIT_USAGE 2

/* The collectives the tools and tests drive. */
enum tool_coll {
	TOOL_ALLREDUCE,
	TOOL_ALLGATHER,
	TOOL_REDUCESCATTER,
	TOOL_BROADCAST,
	TOOL_REDUCE,
	TOOL_SENDRECV, /* send to rank + 1, receive from rank - 1, as nccl-tests does */
	TOOL_ALLTOALL,
	TOOL_NCOLLS
};

/* Handles -h/--help (prints usage) and -V/--version for every tool; returns
 * -1 when neither was given, else the exit status. */
int tool_standard_options(int argc, char **argv, const char *name, const char *usage);

/* "allreduce", ...; the index or -1. */
const char *tool_coll_name(int coll);
int tool_coll_parse(const char *s);

/* "int8", ..., "bfloat16" (also "float16", "float32", "float64", "half",
 * "float", "double"); the dfcclDataType_t or -1. */
const char *tool_dtype_name(int dtype);
int tool_dtype_parse(const char *s);

/* "sum", ...; the dfcclRedOp_t or -1. */
const char *tool_op_name(int op);
int tool_op_parse(const char *s);

/* Whether a collective reduces (takes an op) or has a root. */
bool tool_coll_reduces(int coll);
bool tool_coll_rooted(int coll);

/* A byte count with an optional K, M or G suffix (powers of 1024); false
 * if s is not one. */
bool tool_parse_size(const char *s, uint64_t *out);

/* A decimal in [lo, hi]. */
bool tool_parse_long(const char *s, long lo, long hi, long *out);

/* The devices of the ranks: rank r runs on dev[r % n], or with n == 0 on
 * device r % (the daemon's device count). */
#define TOOL_MAX_DEVICES 64
struct tool_devices {
	int n;
	int dev[TOOL_MAX_DEVICES];
};

/* A comma-separated list of decimals in [0, hi] ("1", "0,1", "0,0,1"), at
 * most cap of them, into out[*n]; false if s is not one. */
bool tool_parse_list(const char *s, long hi, int *out, int cap, int *n);

/* A comma-separated list of device indices ("1", "0,1", "0,0,1"); false if
 * s is not one. */
bool tool_parse_devices(const char *s, struct tool_devices *d);

/* Rank's device by d, ndev being the daemon's device count. */
int tool_rank_device(const struct tool_devices *d, int rank, int ndev);

/*
 * nccl-tests' layout of a size: the element count of the call's `count`
 * argument for a buffer of `bytes` (the larger of the two buffers: the
 * receive buffer of an all-gather, the send buffer of a reduce-scatter,
 * either of an all-to-all), and the elements of its send and receive
 * buffers.
 */
size_t tool_count_for(int coll, size_t bytes, size_t elem, int nranks);
size_t tool_send_elems(int coll, size_t count, int nranks);
size_t tool_recv_elems(int coll, size_t count, int nranks);

/* busbw = algbw * this factor (nccl-tests' conventions). */
double tool_bus_factor(int coll, int nranks);

/* Bytes of one element; 0 for an unknown type. */
size_t tool_dtype_size(int dtype);

/* A 64-bit mix of the arguments, for keys and random choices. */
uint64_t tool_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* Fills rank's send buffer of collective (coll, key) with its reference
 * values: tool_send_elems(coll, count, nranks) elements. */
void tool_fill(int coll, void *send, size_t count, int dtype, int op, int rank, int nranks, uint64_t key);

/* Fills a receive buffer with a pattern no correct result has. */
void tool_poison(void *recv, size_t elems, int dtype);

/*
 * Checks rank's receive buffer after collective (coll, key): returns the
 * number of wrong elements and, if any, the first wrong index in *first
 * with the value found and expected. Only the root's buffer of a reduce
 * is checked (others return 0).
 */
size_t tool_check(int coll, const void *recv, size_t count, int dtype, int op, int root, int rank, int nranks,
                  uint64_t key, size_t *first, double *got, double *want);

/*
 * Issues one collective through the public API with stream NULL: the
 * NCCL-style call, or for TOOL_SENDRECV a group of one send and one receive.
 * In place when send == recv for the calls that allow it (all-gather and
 * reduce-scatter then use their in-place offsets: see tool_inplace_send).
 */
dfcclResult_t tool_issue(int coll, const void *send, void *recv, size_t count, int dtype, int op, int root,
                         dfcclComm_t comm);

/* The same on `stream` (NULL: tool_issue): stream-ordered. A one-rank
 * TOOL_SENDRECV has no stream-ordered form here (dfcclInvalidUsage). */
dfcclResult_t tool_issue_on(int coll, const void *send, void *recv, size_t count, int dtype, int op, int root,
                            dfcclComm_t comm, dfcclStream_t stream);

/* Where an in-place call's send buffer lies inside recv (NCCL's rule:
 * all-gather sends from recv + rank * count, reduce-scatter receives into
 * send + rank * count, which is expressed here as the send buffer being
 * recv and the receive buffer the offset one); NULL if the collective has
 * no in-place form (send/recv, all-to-all). The returned pair is written
 * to *send and *recv. */
bool tool_inplace(int coll, void *buf, size_t count, int dtype, int rank, const void **send, void **recv);

/*
 * Runs fn(rank, arg) in nranks forked processes and waits for all of them.
 * When one fails or dies, the others get grace_s seconds to end on their
 * own (they should fail with errors rather than hang) before they are
 * killed. Prints one line per rank that did not succeed and returns the
 * number of such ranks. SIGINT, SIGTERM and SIGHUP meanwhile are passed on
 * to every rank (which get the same grace), and once they have ended the
 * caller is ended by that signal; a rank whose caller dies gets SIGTERM.
 */
int tool_run_ranks(const char *name, int nranks, int (*fn)(int rank, void *arg), void *arg, int grace_s);

/* CLOCK_MONOTONIC in seconds. */
double tool_now(void);

#endif /* DFCCL_TOOL_H */
