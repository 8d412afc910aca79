/*
 * Shared behaviour of the command-line tools and the reference data of the
 * collectives; see tool.h.
 *
 * Elements are handled as doubles: every reference value is a small
 * integer, exact in every type, and the result of a reduction is quantised
 * through the data type (stored and loaded back) before it is compared, so
 * the comparison is exact except for floating-point averages.
 */
#include "tool.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int tool_standard_options(int argc, char **argv, const char *name, const char *usage)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return 0;
		}
		if (!strcmp(argv[i], "-V") || !strcmp(argv[i], "--version")) {
			printf("%s %d.%d.%d\n", name, DFCCL_MAJOR, DFCCL_MINOR, DFCCL_PATCH);
			return 0;
		}
	}
	return -1;
}

/* ---------------------------------------------------------------- names */

static const char *const coll_names[TOOL_NCOLLS] = {
    [TOOL_ALLREDUCE] = "allreduce", [TOOL_ALLGATHER] = "allgather", [TOOL_REDUCESCATTER] = "reducescatter",
    [TOOL_BROADCAST] = "broadcast", [TOOL_REDUCE] = "reduce",       [TOOL_SENDRECV] = "sendrecv",
    [TOOL_ALLTOALL] = "alltoall",
};

static const char *const dtype_names[dfcclNumTypes] = {
    [dfcclInt8] = "int8",       [dfcclUint8] = "uint8",     [dfcclInt32] = "int32",     [dfcclUint32] = "uint32",
    [dfcclInt64] = "int64",     [dfcclUint64] = "uint64",   [dfcclFloat16] = "half",    [dfcclFloat32] = "float",
    [dfcclFloat64] = "double",  [dfcclBfloat16] = "bfloat16",
};

static const char *const op_names[dfcclNumOps] = {
    [dfcclSum] = "sum", [dfcclProd] = "prod", [dfcclMax] = "max", [dfcclMin] = "min", [dfcclAvg] = "avg",
};

static int name_index(const char *const *names, int n, const char *s)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(names[i], s))
			return i;
	return -1;
}

const char *tool_coll_name(int coll)
{
	return coll >= 0 && coll < TOOL_NCOLLS ? coll_names[coll] : "?";
}

int tool_coll_parse(const char *s)
{
	return name_index(coll_names, TOOL_NCOLLS, s);
}

const char *tool_dtype_name(int dtype)
{
	return dtype >= 0 && dtype < dfcclNumTypes ? dtype_names[dtype] : "?";
}

int tool_dtype_parse(const char *s)
{
	static const struct {
		const char *name;
		int dtype;
	} aliases[] = {{"float16", dfcclFloat16}, {"float32", dfcclFloat32}, {"float64", dfcclFloat64},
	               {"char", dfcclInt8},       {"int", dfcclInt32},       {"bf16", dfcclBfloat16}};
	int d = name_index(dtype_names, dfcclNumTypes, s);
	for (size_t i = 0; d < 0 && i < sizeof(aliases) / sizeof(aliases[0]); i++)
		if (!strcmp(aliases[i].name, s))
			d = aliases[i].dtype;
	return d;
}

const char *tool_op_name(int op)
{
	return op >= 0 && op < dfcclNumOps ? op_names[op] : "?";
}

int tool_op_parse(const char *s)
{
	return name_index(op_names, dfcclNumOps, s);
}

bool tool_coll_reduces(int coll)
{
	return coll == TOOL_ALLREDUCE || coll == TOOL_REDUCESCATTER || coll == TOOL_REDUCE;
}

bool tool_coll_rooted(int coll)
{
	return coll == TOOL_BROADCAST || coll == TOOL_REDUCE;
}

bool tool_parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

bool tool_parse_list(const char *s, long hi, int *out, int cap, int *n)
{
	char *end;
	*n = 0;
	do {
		if (*s < '0' || *s > '9')
			return false;
		errno = 0;
		long v = strtol(s, &end, 10);
		if (errno || v > hi || *n == cap)
			return false;
		out[(*n)++] = (int)v;
		s = end + 1;
	} while (*end == ',');
	return *end == '\0';
}

bool tool_parse_devices(const char *s, struct tool_devices *d)
{
	return tool_parse_list(s, 1023, d->dev, TOOL_MAX_DEVICES, &d->n);
}

int tool_rank_device(const struct tool_devices *d, int rank, int ndev)
{
	if (d->n > 0)
		return d->dev[rank % d->n];
	return ndev > 0 ? rank % ndev : 0;
}

bool tool_parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return false;
	unsigned shift = 0;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	default: break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v > (UINT64_MAX >> shift))
		return false;
	*out = (uint64_t)v << shift;
	return true;
}

/* ---------------------------------------------------------------- sizes */

size_t tool_dtype_size(int dtype)
{
	static const size_t sizes[dfcclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
	return dtype >= 0 && dtype < dfcclNumTypes ? sizes[dtype] : 0;
}

/* Whether the call's buffer of `bytes` holds nranks blocks of count. */
static bool blocks_of_count(int coll)
{
	return coll == TOOL_ALLGATHER || coll == TOOL_REDUCESCATTER || coll == TOOL_ALLTOALL;
}

size_t tool_count_for(int coll, size_t bytes, size_t elem, int nranks)
{
	size_t count = bytes / elem;
	return blocks_of_count(coll) ? count / (size_t)nranks : count;
}

size_t tool_send_elems(int coll, size_t count, int nranks)
{
	return coll == TOOL_REDUCESCATTER || coll == TOOL_ALLTOALL ? count * (size_t)nranks : count;
}

size_t tool_recv_elems(int coll, size_t count, int nranks)
{
	return coll == TOOL_ALLGATHER || coll == TOOL_ALLTOALL ? count * (size_t)nranks : count;
}

double tool_bus_factor(int coll, int nranks)
{
	double n = nranks;
	switch (coll) {
	case TOOL_ALLREDUCE: return 2 * (n - 1) / n;
	case TOOL_ALLGATHER:
	case TOOL_REDUCESCATTER:
	case TOOL_ALLTOALL: return (n - 1) / n;
	default: return 1;
	}
}

double tool_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- elements */

uint64_t tool_hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	/* splitmix64 over the four words in turn. */
	uint64_t x = 0x9e3779b97f4a7c15ull;
	uint64_t w[4] = {a, b, c, d};
	for (int i = 0; i < 4; i++) {
		x ^= w[i] + 0x9e3779b97f4a7c15ull + (x << 6) + (x >> 2);
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
		x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
		x ^= x >> 31;
	}
	return x;
}

static uint16_t half_from_float(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
	int exp = (int)((x >> 23) & 0xff) - 127 + 15;
	if (((x >> 23) & 0xff) == 0xff)
		return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
	if (exp >= 31)
		return (uint16_t)(sign | 0x7c00u);
	if (exp <= 0) {
		if (exp < -10)
			return (uint16_t)sign;
		mant |= 0x800000u;
		unsigned shift = (unsigned)(14 - exp);
		uint32_t h = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
		if (rest > half || (rest == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
	if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)h;
}

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, x;
	if (exp == 0) {
		float f = (float)mant * 0x1p-24f;
		return sign ? -f : f;
	}
	if (exp == 31)
		x = sign | 0x7f800000u | (mant << 13);
	else
		x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
	float f;
	memcpy(&f, &x, 4);
	return f;
}

static uint16_t bf16_from_float(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	x += 0x7fffu + ((x >> 16) & 1); /* round to nearest even */
	return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t b)
{
	uint32_t x = (uint32_t)b << 16;
	float f;
	memcpy(&f, &x, 4);
	return f;
}

static void elem_store(void *buf, int dtype, size_t i, double v)
{
	switch (dtype) {
	case dfcclInt8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
	case dfcclUint8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
	case dfcclInt32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
	case dfcclUint32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
	case dfcclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
	case dfcclUint64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
	case dfcclFloat16: ((uint16_t *)buf)[i] = half_from_float((float)v); break;
	case dfcclFloat32: ((float *)buf)[i] = (float)v; break;
	case dfcclFloat64: ((double *)buf)[i] = v; break;
	case dfcclBfloat16: ((uint16_t *)buf)[i] = bf16_from_float((float)v); break;
	}
}

static double elem_load(const void *buf, int dtype, size_t i)
{
	switch (dtype) {
	case dfcclInt8: return ((const int8_t *)buf)[i];
	case dfcclUint8: return ((const uint8_t *)buf)[i];
	case dfcclInt32: return ((const int32_t *)buf)[i];
	case dfcclUint32: return ((const uint32_t *)buf)[i];
	case dfcclInt64: return (double)((const int64_t *)buf)[i];
	case dfcclUint64: return (double)((const uint64_t *)buf)[i];
	case dfcclFloat16: return half_to_float(((const uint16_t *)buf)[i]);
	case dfcclFloat32: return ((const float *)buf)[i];
	case dfcclFloat64: return ((const double *)buf)[i];
	case dfcclBfloat16: return bf16_to_float(((const uint16_t *)buf)[i]);
	}
	return NAN;
}

static bool dtype_signed(int dtype)
{
	return dtype != dfcclUint8 && dtype != dfcclUint32 && dtype != dfcclUint64;
}

static bool dtype_float(int dtype)
{
	return dtype == dfcclFloat16 || dtype == dfcclFloat32 || dtype == dfcclFloat64 || dtype == dfcclBfloat16;
}

/* The reference value of element i of rank's send buffer (see tool.h). */
static double ref_value(uint64_t key, int rank, size_t i, int dtype, int op, bool reducing)
{
	/* One multiply-xorshift round per element: this runs for every element
	 * of every buffer, and its only job is to make neighbours differ. */
	uint64_t h = key ^ ((uint64_t)rank * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)i * 0xd6e8feb86659fd93ull);
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ull;
	h ^= h >> 32;
	bool neg = dtype_signed(dtype);
	if (!reducing)
		return neg ? (double)(h % 101) - 50 : (double)(h % 101);
	if (op == dfcclProd) {
		if (rank < 3 && h % 4 == 0)
			return 2;
		return neg && (h & 16) ? -1 : 1;
	}
	if (op == dfcclAvg || !neg)
		return (double)(h % 9);
	return (double)(h % 9) - 4;
}

static double ref_reduce(uint64_t key, int nranks, size_t i, int dtype, int op)
{
	double acc = ref_value(key, 0, i, dtype, op, true);
	for (int r = 1; r < nranks; r++) {
		double v = ref_value(key, r, i, dtype, op, true);
		switch (op) {
		case dfcclProd: acc *= v; break;
		case dfcclMax: acc = v > acc ? v : acc; break;
		case dfcclMin: acc = v < acc ? v : acc; break;
		default: acc += v; break;
		}
	}
	if (op == dfcclAvg)
		acc = dtype_float(dtype) ? acc / nranks : (double)((int64_t)acc / nranks);
	return acc;
}

void tool_fill(int coll, void *send, size_t count, int dtype, int op, int rank, int nranks, uint64_t key)
{
	size_t n = tool_send_elems(coll, count, nranks);
	bool reducing = tool_coll_reduces(coll);
	for (size_t i = 0; i < n; i++)
		elem_store(send, dtype, i, ref_value(key, rank, i, dtype, op, reducing));
}

void tool_poison(void *recv, size_t elems, int dtype)
{
	for (size_t i = 0; i < elems; i++)
		elem_store(recv, dtype, i, dtype_signed(dtype) ? -99 : 199);
}

/* The expected element i of rank's receive buffer. */
static double ref_expect(int coll, size_t i, size_t count, int dtype, int op, int root, int rank, int nranks,
                         uint64_t key)
{
	switch (coll) {
	case TOOL_ALLREDUCE:
	case TOOL_REDUCE: return ref_reduce(key, nranks, i, dtype, op);
	case TOOL_REDUCESCATTER: return ref_reduce(key, nranks, (size_t)rank * count + i, dtype, op);
	case TOOL_BROADCAST: return ref_value(key, root, i, dtype, op, false);
	case TOOL_ALLGATHER: return ref_value(key, (int)(i / count), i % count, dtype, op, false);
	case TOOL_ALLTOALL: return ref_value(key, (int)(i / count), (size_t)rank * count + i % count, dtype, op, false);
	default: return ref_value(key, (rank + nranks - 1) % nranks, i, dtype, op, false);
	}
}

size_t tool_check(int coll, const void *recv, size_t count, int dtype, int op, int root, int rank, int nranks,
                  uint64_t key, size_t *first, double *got, double *want)
{
	if (coll == TOOL_REDUCE && rank != root)
		return 0;
	size_t n = tool_recv_elems(coll, count, nranks), wrong = 0;
	bool approx = op == dfcclAvg && tool_coll_reduces(coll) && dtype_float(dtype);
	double tol = dtype == dfcclBfloat16 ? 1.0 / 128 : dtype == dfcclFloat16 ? 1.0 / 1024 : 1e-6;
	for (size_t i = 0; i < n; i++) {
		double w = ref_expect(coll, i, count, dtype, op, root, rank, nranks, key);
		/* Quantised through the type, as the engine's result is. */
		union {
			double d;
			uint64_t u;
		} q;
		elem_store(&q, dtype, 0, w);
		w = elem_load(&q, dtype, 0);
		double g = elem_load(recv, dtype, i);
		bool ok = approx ? fabs(g - w) <= tol * (fabs(w) > 1 ? fabs(w) : 1) : g == w;
		if (!ok && wrong++ == 0) {
			*first = i;
			*got = g;
			*want = w;
		}
	}
	return wrong;
}

/* ---------------------------------------------------------------- issuing */

bool tool_inplace(int coll, void *buf, size_t count, int dtype, int rank, const void **send, void **recv)
{
	size_t off = (size_t)rank * count * tool_dtype_size(dtype);
	*send = buf;
	*recv = buf;
	switch (coll) {
	case TOOL_ALLGATHER: *send = (char *)buf + off; return true;
	case TOOL_REDUCESCATTER: *recv = (char *)buf + off; return true;
	case TOOL_SENDRECV:
	case TOOL_ALLTOALL: return false;
	default: return true;
	}
}

dfcclResult_t tool_issue(int coll, const void *send, void *recv, size_t count, int dtype, int op, int root,
                         dfcclComm_t comm)
{
	return tool_issue_on(coll, send, recv, count, dtype, op, root, comm, NULL);
}

dfcclResult_t tool_issue_on(int coll, const void *send, void *recv, size_t count, int dtype, int op, int root,
                            dfcclComm_t comm, dfcclStream_t stream)
{
	dfcclDataType_t t = (dfcclDataType_t)dtype;
	dfcclRedOp_t o = (dfcclRedOp_t)op;
	switch (coll) {
	case TOOL_ALLREDUCE: return dfcclAllReduce(send, recv, count, t, o, comm, stream);
	case TOOL_ALLGATHER: return dfcclAllGather(send, recv, count, t, comm, stream);
	case TOOL_REDUCESCATTER: return dfcclReduceScatter(send, recv, count, t, o, comm, stream);
	case TOOL_BROADCAST: return dfcclBroadcast(send, recv, count, t, root, comm, stream);
	case TOOL_REDUCE: return dfcclReduce(send, recv, count, t, o, root, comm, stream);
	case TOOL_ALLTOALL: return dfcclAllToAll(send, recv, count, t, comm, stream);
	default: break;
	}
	int n = 0, rank = 0;
	dfcclCommCount(comm, &n);
	dfcclCommUserRank(comm, &rank);
	/* One rank has nobody to talk to: its "message" is its own, which the
	 * CPU can copy only when nothing is stream-ordered. */
	if (n == 1 && stream)
		return dfcclInvalidUsage;
	dfcclGroupStart();
	if (n > 1) {
		dfcclSend(send, count, t, (rank + 1) % n, comm, stream);
		dfcclRecv(recv, count, t, (rank + n - 1) % n, comm, stream);
	}
	dfcclResult_t r = dfcclGroupEnd();
	if (n == 1 && r == dfcclSuccess && recv != send)
		memmove(recv, send, count * tool_dtype_size(dtype));
	return r;
}

/* ---------------------------------------------------------------- rank processes */

static void rank_report(const char *name, int rank, int status)
{
	if (WIFSIGNALED(status))
		fprintf(stderr, "%s: rank %d was killed by signal %d (%s)\n", name, rank, WTERMSIG(status),
		        strsignal(WTERMSIG(status)));
	else if (WIFEXITED(status))
		fprintf(stderr, "%s: rank %d failed (exit status %d)\n", name, rank, WEXITSTATUS(status));
}

/* The signals that stop a tool, which its ranks get too. */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define NSTOP (sizeof(stop_signals) / sizeof(stop_signals[0]))
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
	stop_signal = sig;
}

int tool_run_ranks(const char *name, int nranks, int (*fn)(int rank, void *arg), void *arg, int grace_s)
{
	pid_t *pids = calloc((size_t)nranks, sizeof(*pids));
	int failed = 0, left = 0, first_failed = -1;
	if (!pids)
		return nranks;
	/* A stop signal (Ctrl-C, a job's end) is passed on to every rank,
	 * which then ends as that signal would end it alone; the tool then
	 * ends by it too. A signal the tool was started with ignored (nohup)
	 * stays ignored. A rank whose tool dies without passing it on gets
	 * SIGTERM from the kernel. The signals are blocked while the ranks
	 * are forked: a child takes its own dispositions back before one can
	 * reach it. */
	struct sigaction was[NSTOP], on = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
	sigset_t stops, before;
	sigemptyset(&on.sa_mask);
	sigemptyset(&stops);
	for (size_t i = 0; i < NSTOP; i++)
		sigaddset(&stops, stop_signals[i]);
	pthread_sigmask(SIG_BLOCK, &stops, &before);
	stop_signal = 0;
	for (size_t i = 0; i < NSTOP; i++) {
		sigaction(stop_signals[i], NULL, &was[i]);
		if (was[i].sa_handler != SIG_IGN)
			sigaction(stop_signals[i], &on, NULL);
	}
	pid_t parent = getpid();
	fflush(NULL);
	for (int r = 0; r < nranks; r++) {
		pids[r] = fork();
		if (pids[r] == 0) {
			for (size_t i = 0; i < NSTOP; i++)
				sigaction(stop_signals[i], &was[i], NULL);
			pthread_sigmask(SIG_SETMASK, &before, NULL);
			if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
				_exit(TOOL_EXIT_FAIL);
			int rc = fn(r, arg);
			fflush(NULL);
			_exit(rc);
		}
		if (pids[r] < 0) {
			fprintf(stderr, "%s: cannot start rank %d: %s\n", name, r, strerror(errno));
			failed++;
			continue;
		}
		left++;
	}
	pthread_sigmask(SIG_SETMASK, &before, NULL);
	double deadline = 0;
	int passed_on = 0;
	while (left > 0) {
		if (stop_signal && !passed_on) {
			passed_on = stop_signal;
			fprintf(stderr, "%s: stopped by signal %d (%s): stopping the ranks\n", name, passed_on,
			        strsignal(passed_on));
			for (int r = 0; r < nranks; r++)
				if (pids[r] > 0)
					kill(pids[r], passed_on);
			if (first_failed == -1) {
				first_failed = nranks; /* no rank: the grace below counts from now */
				deadline = tool_now() + grace_s;
			}
		}
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid > 0) {
			int r = 0;
			while (r < nranks && pids[r] != pid)
				r++;
			if (r == nranks)
				continue;
			pids[r] = 0;
			left--;
			if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
				rank_report(name, r, status);
				failed++;
				if (first_failed == -1) {
					first_failed = r;
					deadline = tool_now() + grace_s;
				}
			}
			continue;
		}
		if (pid < 0 && errno != EINTR)
			break;
		if (first_failed >= 0 && tool_now() > deadline) {
			for (int r = 0; r < nranks; r++) {
				if (pids[r] <= 0)
					continue;
				if (first_failed == nranks)
					fprintf(stderr, "%s: rank %d did not end within %d s of signal %d: killed\n", name, r, grace_s,
					        passed_on);
				else
					fprintf(stderr, "%s: rank %d did not end within %d s after rank %d failed: killed\n", name, r,
					        grace_s, first_failed);
				kill(pids[r], SIGKILL);
			}
			first_failed = -2; /* reported once; the loop reaps them */
		}
		usleep(10000);
	}
	free(pids);
	for (size_t i = 0; i < NSTOP; i++)
		sigaction(stop_signals[i], &was[i], NULL);
	/* One that came after the last rank ended still ends the tool. */
	if (!passed_on)
		passed_on = stop_signal;
	if (passed_on) {
		fflush(NULL);
		raise(passed_on);
	}
	return failed;
}
