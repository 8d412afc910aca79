/*
 * dfccl.h - the public interface of libdfccl, the client library of dfccld.
 *
 * Shaped like NCCL where the concepts match: result codes, a 128-byte unique
 * id handed from rank 0 to the others out of band, communicators created by
 * dfcclCommInitRank, collectives with a stream argument. The collectives run
 * in dfccld, the node's collective-communication daemon; libdfccl talks to it
 * over a Unix socket (found through DFCCL_SOCKET, default
 * /run/dfccl/dfccld.sock) and submits work through shared-memory queues.
 *
 * Every function returns a dfcclResult_t. On failure, dfcclGetLastError()
 * returns a sentence saying what went wrong and what to do about it.
 * Thread safety: every function may be called from any thread.
 *
 * A process has one session with the daemon, opened on first need. A child
 * created by fork() does not share it: communicators and buffers inherited
 * across fork fail with dfcclDaemonUnavailable in the child, and the child's
 * own calls open a session of its own.
 *
 * Environment:
 *   DFCCL_SOCKET                    the daemon's socket (default DFCCL_DEFAULT_SOCKET)
 *   DFCCL_DEBUG=WARN                print where each failure originated on stderr
 *   DFCCL_ALGO=NAME                 algorithm to ask the daemon for: auto, direct,
 *                                   ring, tree or multitree (default auto: the daemon's
 *                                   `algo` setting, else its plan for the size); it
 *                                   applies to the collectives that algorithm runs
 *                                   (ring: all but send/recv and all-to-all; trees:
 *                                   all-reduce, broadcast, reduce). Every rank of a
 *                                   communicator must ask for the same: a collective
 *                                   whose ranks disagree fails with dfcclInvalidUsage
 *                                   and aborts the communicator
 *   DFCCL_TIMEOUT_MS=N              collective timeout of this process's communicators
 *                                   (dfcclConfig_t.timeoutMs overrides it; default: the
 *                                   daemon's setting coll-timeout-ms); 0 turns it off
 *   DFCCL_PROTO_VERSION_OVERRIDE=N  diagnostic knob: claim to speak exactly control
 *                                   protocol version N, to test the daemon's version
 *                                   negotiation; never needed in normal use
 */
#ifndef DFCCL_H
#define DFCCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFCCL_MAJOR 0
#define DFCCL_MINOR 1
#define DFCCL_PATCH 0
#define DFCCL_VERSION_CODE (DFCCL_MAJOR * 10000 + DFCCL_MINOR * 100 + DFCCL_PATCH)

#define DFCCL_DEFAULT_SOCKET "/run/dfccl/dfccld.sock"
#define DFCCL_UNIQUE_ID_BYTES 128

typedef enum {
	dfcclSuccess = 0,
	dfcclUnhandledCudaError = 1,
	dfcclSystemError = 2,
	dfcclInternalError = 3,
	dfcclInvalidArgument = 4,
	dfcclInvalidUsage = 5,
	dfcclRemoteError = 6, /* a peer rank failed or disconnected */
	dfcclInProgress = 7,
	/* dfccl-specific results */
	dfcclDaemonUnavailable = 8, /* cannot reach dfccld, or it went away (what it held failed) */
	dfcclVersionMismatch = 9,   /* library and daemon share no protocol version */
	dfcclPermissionDenied = 10, /* another user's communicator, or a quota */
	dfcclTimeout = 11,
	dfcclAborted = 12,          /* the communicator was aborted */
	dfcclDeviceLost = 13,       /* the daemon's worker for the device died */
	dfcclNotSupported = 14,     /* not available with the daemon's engine */
	dfcclNumResults = 15
} dfcclResult_t;

typedef enum {
	dfcclInt8 = 0,
	dfcclChar = 0,
	dfcclUint8 = 1,
	dfcclInt32 = 2,
	dfcclInt = 2,
	dfcclUint32 = 3,
	dfcclInt64 = 4,
	dfcclUint64 = 5,
	dfcclFloat16 = 6,
	dfcclHalf = 6,
	dfcclFloat32 = 7,
	dfcclFloat = 7,
	dfcclFloat64 = 8,
	dfcclDouble = 8,
	dfcclBfloat16 = 9,
	dfcclNumTypes = 10
} dfcclDataType_t;

typedef enum {
	dfcclSum = 0,
	dfcclProd = 1,
	dfcclMax = 2,
	dfcclMin = 3,
	dfcclAvg = 4,
	dfcclNumOps = 5
} dfcclRedOp_t;

typedef struct {
	char internal[DFCCL_UNIQUE_ID_BYTES];
} dfcclUniqueId;

typedef struct dfcclComm *dfcclComm_t;

/* A CUDA stream (cudaStream_t) or NULL; host-engine calls take NULL. */
typedef struct CUstream_st *dfcclStream_t;

/* Options for dfcclCommInitRankConfig; start from DFCCL_CONFIG_INITIALIZER. */
typedef struct {
	size_t size;          /* sizeof(dfcclConfig_t) */
	unsigned int magic;   /* DFCCL_CONFIG_MAGIC */
	unsigned int version; /* DFCCL_VERSION_CODE */
	int device;           /* a device as dfcclSetDevice takes it (a CUDA ordinal of this process
	                       * where it sees GPUs); -1: the calling thread's device */
	int initTimeoutMs;    /* 0: the daemon's default (setting comm-init-timeout-ms) */
	int blocking;         /* 1: init returns once the communicator is ready; 0: it returns
	                       * dfcclInProgress at once, and dfcclCommGetAsyncError says
	                       * dfcclInProgress until the init ended (then dfcclSuccess or its
	                       * error); destroy or abort may be called meanwhile */
	/* Collective timeout: a collective that some ranks submitted and others
	 * did not, or that made no progress, for this long fails on every rank
	 * with dfcclTimeout, and the communicator with it; dfcclGetLastError and
	 * the async error name the collective and the ranks that never submitted
	 * it (and whether their processes are stopped). -1: DFCCL_TIMEOUT_MS,
	 * else the daemon's setting coll-timeout-ms; 0: none. The communicator
	 * uses the shortest timeout any of its ranks asks for. */
	int timeoutMs;
} dfcclConfig_t;

#define DFCCL_CONFIG_MAGIC 0xdfcc1cf9u
#define DFCCL_CONFIG_INITIALIZER \
	{sizeof(dfcclConfig_t), DFCCL_CONFIG_MAGIC, DFCCL_VERSION_CODE, -1, 0, 1, -1}

/* ---------------------------------------------------------------- basics */

const char *dfcclGetErrorString(dfcclResult_t result);

/* The last error of the calling thread as a full sentence ("" if none).
 * comm is accepted for NCCL symmetry and may be NULL. */
const char *dfcclGetLastError(dfcclComm_t comm);

/* DFCCL_VERSION_CODE of the library. */
dfcclResult_t dfcclGetVersion(int *version);

/*
 * Select the device that later dfcclCommInitRank and dfcclMemAlloc calls of
 * this thread use (like cudaSetDevice for NCCL). Default 0.
 *
 * Where this process sees GPUs (a CUDA driver and at least one device
 * visible through CUDA_VISIBLE_DEVICES) and dfccld serves GPUs, `device`
 * is a CUDA ordinal of this process, the number cudaSetDevice takes: a
 * trainer that sees one GPU passes 0 whichever GPU of the node that is.
 * The communicator lives on the daemon's device with that GPU's PCI bus id
 * (`dfcclctl status` lists them); an ordinal whose GPU dfccld does not serve
 * fails with dfcclInvalidArgument naming its bus id and the daemon's
 * devices. Where the process has no CUDA driver or sees no GPU, or dfccld
 * runs the host engine, `device` is the daemon's device index, 0 to
 * dfcclGetDeviceCount() - 1. So it is too, for the process's connection,
 * where MPS is active and a worker of dfccld runs as another user than this
 * process: the CUDA driver cannot be asked then (a process of another user
 * than the running MPS server's waits in CUDA initialisation until that
 * server's clients have all gone), and an attach to a device that another
 * user's job holds is refused at once, naming it. The number is checked
 * when it is used (by dfcclCommInitRank or dfcclMemAlloc), not here.
 */
dfcclResult_t dfcclSetDevice(int device);
dfcclResult_t dfcclGetDevice(int *device);

/* Number of devices dfcclSetDevice can name: where this process sees GPUs
 * that it names by CUDA ordinal (see dfcclSetDevice), how many it sees, as
 * cudaGetDeviceCount says (the daemon may not serve every one); otherwise
 * the number of devices the daemon serves (GPUs, or the host engine's
 * emulated devices). Connects to the daemon. */
dfcclResult_t dfcclGetDeviceCount(int *count);

/* ---------------------------------------------------------------- communicators */

/* 128 random bytes from the kernel's CSPRNG, with a version tag and room
 * for a bootstrap address. Call on one rank, share with the others. */
dfcclResult_t dfcclGetUniqueId(dfcclUniqueId *uniqueId);

/* Joins rank `rank` of an `nranks` communicator identified by commId on the
 * calling thread's device. Blocks until every rank has joined, or fails with
 * dfcclTimeout naming the ranks that never came. */
dfcclResult_t dfcclCommInitRank(dfcclComm_t *comm, int nranks, dfcclUniqueId commId, int rank);
dfcclResult_t dfcclCommInitRankConfig(dfcclComm_t *comm, int nranks, dfcclUniqueId commId,
                                      int rank, const dfcclConfig_t *config);

/* Leaves the communicator after its collectives completed and frees it. */
dfcclResult_t dfcclCommDestroy(dfcclComm_t comm);

/* Leaves at once: the daemon fails the other ranks' pending and later
 * collectives with dfcclAborted. Frees comm. */
dfcclResult_t dfcclCommAbort(dfcclComm_t comm);

dfcclResult_t dfcclCommCount(const dfcclComm_t comm, int *count);
dfcclResult_t dfcclCommUserRank(const dfcclComm_t comm, int *rank);
/* The device as the communicator was made with it (dfcclSetDevice's
 * numbering: a CUDA ordinal where this process sees GPUs). */
dfcclResult_t dfcclCommDevice(const dfcclComm_t comm, int *device);

/* dfcclSuccess, or the error the daemon reported for this communicator
 * (a peer lost, an abort, the device's worker lost). Never blocks. */
dfcclResult_t dfcclCommGetAsyncError(dfcclComm_t comm, dfcclResult_t *asyncError);

/* ---------------------------------------------------------------- recovery
 *
 * Shaped like NCCL's. dfcclCommRevoke stops a communicator: every rank's
 * pending and later collectives on it fail with dfcclAborted, and the
 * handle stays valid for dfcclCommShrink, dfcclCommDestroy or
 * dfcclCommAbort. dfcclCommShrink makes a communicator of the ranks not in
 * excludeRanksList, renumbered densely in their old order, without a new
 * unique id: every surviving rank calls it with the same list (the excluded
 * ranks do not call it). DFCCL_SHRINK_DEFAULT needs comm to be idle (no
 * collective outstanding in this process); DFCCL_SHRINK_ABORT revokes comm
 * first, so whatever hangs on it fails. dfcclCommSplit is collective over
 * every rank of comm: ranks of one color >= 0 form a communicator, ordered
 * by key and then by their old rank; DFCCL_SPLIT_NOCOLOR gets *newcomm =
 * NULL. Ranks must make their shrink and split calls on a communicator in
 * the same order. The new communicator lives on comm's device unless
 * config names another.
 */
#define DFCCL_SHRINK_DEFAULT 0x00
#define DFCCL_SHRINK_ABORT 0x01
#define DFCCL_SPLIT_NOCOLOR (-1)

dfcclResult_t dfcclCommRevoke(dfcclComm_t comm);

/*
 * Shrink advice from an operator: `dfcclctl shrink COMM --exclude RANKS`
 * revokes the communicator as dfcclctl abort does (every rank's pending
 * and later collectives on it fail; its async error becomes dfcclAborted
 * unless it had failed before) and tells every rank which ranks to drop,
 * since the daemon cannot shrink on behalf of the ranks' processes.
 * dfcclCommGetShrinkAdvice copies those ranks, ascending, into
 * excludeRanks (room for `capacity` of them; 0 with a NULL list asks for
 * the number alone) and stores how many there are in *count: 0 while no
 * advice came. A later advice replaces an earlier one. The ranks not in the
 * list pass it unchanged to dfcclCommShrink (DFCCL_SHRINK_DEFAULT once
 * their collectives on comm have ended, or DFCCL_SHRINK_ABORT); a rank that
 * finds itself in it leaves with dfcclCommDestroy or dfcclCommAbort. The
 * advice arrives with the communicator's async error (dfcclAborted, whose
 * sentence says who advised what): poll dfcclCommGetAsyncError, then ask
 * for the advice. Never blocks; *count > capacity means the list was cut.
 */
dfcclResult_t dfcclCommGetShrinkAdvice(dfcclComm_t comm, int *excludeRanks, int capacity, int *count);

dfcclResult_t dfcclCommShrink(dfcclComm_t comm, int *excludeRanksList, int excludeRanksCount, dfcclComm_t *newcomm,
                              dfcclConfig_t *config, int shrinkFlags);
dfcclResult_t dfcclCommSplit(dfcclComm_t comm, int color, int key, dfcclComm_t *newcomm, dfcclConfig_t *config);

/*
 * Growing a communicator: new ranks join, the old ranks keep theirs. One
 * old rank calls dfcclCommGetGrowId for the new size and hands the id to
 * the new ranks out of band; then every old rank calls dfcclCommGrow(comm,
 * nranks, NULL, ...) (its rank argument is ignored) and every new rank
 * dfcclCommGrow(NULL, nranks, &growId, rank, ...) with a rank from the old
 * size up to nranks - 1. The id names comm's next shrink, split or grow:
 * take it right before growing.
 */
dfcclResult_t dfcclCommGetGrowId(dfcclComm_t comm, int nranks, dfcclUniqueId *growId);
dfcclResult_t dfcclCommGrow(dfcclComm_t comm, int nranks, const dfcclUniqueId *growId, int rank, dfcclComm_t *newcomm,
                            dfcclConfig_t *config);

/* ---------------------------------------------------------------- memory */

/*
 * Allocates size bytes the daemon can reach, on the calling thread's device
 * (dfcclSetDevice), registered with the daemon as they are allocated, so
 * collectives on them need no further registration:
 *   - host engine: host shared memory, readable and writable by the CPU;
 *   - CUDA engine: device memory of that GPU, allocated and owned by dfccld
 *     (a VMM allocation its worker creates) and mapped into this process
 *     with read-write access for that GPU. It is device memory: the CPU
 *     cannot dereference it; copy with cudaMemcpy, use it in kernels. The
 *     call initialises the CUDA driver (cuInit) if the process has not,
 *     and fails with dfcclUnhandledCudaError where the process cannot use
 *     it. Its size is rounded up to the allocation granularity inside the
 *     daemon; only [*ptr, *ptr + size) belongs to the caller.
 * dfcclMemFree unmaps it and lets the daemon free it; memory still
 * allocated when the process exits (or dies) is freed by the daemon as the
 * session ends.
 */
dfcclResult_t dfcclMemAlloc(void **ptr, size_t size);

/* Like dfcclMemAlloc, but host shared memory on either engine (the CUDA
 * engine's workers register it with their GPUs): for buffers the CPU fills
 * and reads, as dfccl-perf's and dfccl-chaos's are. */
dfcclResult_t dfcclMemAllocHost(void **ptr, size_t size);

/* Frees memory of dfcclMemAlloc or dfcclMemAllocHost (NULL: nothing). */
dfcclResult_t dfcclMemFree(void *ptr);

/* Registers [buff, buff+size) for collectives of comm and returns a handle.
 * The range must lie inside one allocation that collectives take (see
 * below). Registering the same range twice returns the same registration. */
dfcclResult_t dfcclCommRegister(const dfcclComm_t comm, void *buff, size_t size, void **handle);
dfcclResult_t dfcclCommDeregister(const dfcclComm_t comm, void *handle);

/* ---------------------------------------------------------------- collectives
 *
 * NCCL-style collectives: calls on one communicator match across ranks by
 * their order on that communicator. Buffers must come from dfcclMemAlloc
 * (either engine) or, with the CUDA engine, from cudaMalloc or from a VMM
 * mapping (cuMemCreate + cuMemMap) of an allocation created exportable as a
 * POSIX file descriptor (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in
 * CUmemAllocationProp.requestedHandleTypes). Such an allocation is
 * registered with the daemon, whole, the first time a call names it, once;
 * a buffer must lie inside one cudaMalloc allocation or one cuMemMap
 * mapping. Memory pools (cudaMallocAsync), managed memory and VMM
 * allocations not exportable that way fail with dfcclNotSupported.
 *
 * Two forms, chosen by `stream`:
 *
 * Stream-ordered (stream is a cudaStream_t, also cudaStreamPerThread), as
 * NCCL's: the collective starts after the work queued on the stream before
 * the call and the work queued after it starts once the collective has
 * completed; the CPU never waits for the GPU. libdfccl writes the
 * submission entry from the CPU and queues two operations on the stream: a
 * write that arms the entry, and a wait for its completion word, which
 * lies in the queue's shared host memory. With DFCCL_STREAM_WAIT=device
 * (CUDA engine) the stream waits on a word in device memory the daemon
 * gives this process instead, which a stream that has waited 20-30 us
 * notices 4-6 us sooner; should the daemon's worker for the GPU die, the
 * worker that replaces it stores the failures into those words before it
 * serves the GPU, or, where none has within 3 s, libdfccl copies them
 * there through a stream of its own (which can wait behind a stream that
 * waits there when both share a hardware queue). The call
 * waits only for a free slot of the submission queue (at most
 * DFCCL_QUEUE_WAIT_MS, default 60000, then dfcclTimeout). Ordering is
 * NCCL's: a later call on the same stream starts after the earlier one
 * completed, so a stream that waits for a collective its peers never issue
 * waits, as with NCCL; collectives on different streams or communicators
 * never wait for each other, in whatever order the ranks issue them.
 * The GPU runs the streams of a process on a few hardware queues
 * (CUDA_DEVICE_MAX_CONNECTIONS), each in submission order, and a stream that
 * waits for a collective stalls its queue: streams that carry collectives
 * in different orders on different ranks are independent only while each
 * has a queue of its own. libdfccl therefore sets CUDA_DEVICE_MAX_CONNECTIONS
 * to 16 when it is loaded, unless the environment sets it; a process that
 * sets 1 orders all its streams, as NCCL then does. Under MPS all clients
 * of a GPU share one pool of queues: with more than four processes on one
 * GPU set it lower (8 served eight processes on an H100).
 * Inside dfcclGroupStart/End, every stream arms all of its collectives of
 * the group, then waits for all of them, once: the group's collectives in
 * a row on one stream are one group of the daemon's queue, whose last
 * completion the daemon reports only once all of them completed
 * (DFCCL_GROUP_WAIT=each: a wait for each instead). A collective that fails completes
 * all the same (the stream goes on, the output is undefined): the failure is
 * reported by dfcclCommGetAsyncError and dfcclCommSynchronize, with its
 * sentence in dfcclGetLastError. Needs the CUDA driver (with the daemon's
 * CUDA engine, or any engine whose buffers the GPU can reach). Capture into
 * CUDA graphs is not supported: the entry is written by the CPU at the
 * call, so a replayed graph would arm a stale entry again; a call on a
 * capturing stream fails with dfcclNotSupported.
 *
 * Callback form (stream NULL), DFCCL's: the daemon's kernel reads the
 * buffers with no order to the caller's streams, so the work that writes
 * the send buffer must be complete (synchronize its stream) before the
 * call, and the receive buffer may be read once dfcclCommSynchronize
 * returns. Such calls never make a stream of the caller wait, so they stay
 * safe in any order and across cudaDeviceSynchronize.
 *
 * Buffers, in either form: sendbuff and recvbuff either do not overlap or
 * are NCCL's in place: the same buffer for all-reduce, broadcast and
 * reduce; for all-gather sendbuff at recvbuff + rank * sendcount elements;
 * for reduce-scatter recvbuff at sendbuff + rank * recvcount elements. Any
 * other overlap is refused with dfcclInvalidArgument (the daemon reads one
 * while it writes the other).
 */

dfcclResult_t dfcclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                             dfcclDataType_t datatype, dfcclRedOp_t op, dfcclComm_t comm,
                             dfcclStream_t stream);
dfcclResult_t dfcclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                             dfcclDataType_t datatype, int root, dfcclComm_t comm,
                             dfcclStream_t stream);
dfcclResult_t dfcclReduce(const void *sendbuff, void *recvbuff, size_t count,
                          dfcclDataType_t datatype, dfcclRedOp_t op, int root, dfcclComm_t comm,
                          dfcclStream_t stream);
dfcclResult_t dfcclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                             dfcclDataType_t datatype, dfcclComm_t comm, dfcclStream_t stream);
dfcclResult_t dfcclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                 dfcclDataType_t datatype, dfcclRedOp_t op, dfcclComm_t comm,
                                 dfcclStream_t stream);
dfcclResult_t dfcclSend(const void *sendbuff, size_t count, dfcclDataType_t datatype, int peer,
                        dfcclComm_t comm, dfcclStream_t stream);
dfcclResult_t dfcclRecv(void *recvbuff, size_t count, dfcclDataType_t datatype, int peer,
                        dfcclComm_t comm, dfcclStream_t stream);

/* All-to-all: rank r sends block j of sendbuff (count elements) to rank j
 * and receives block j of recvbuff from rank j; built on send/recv. Both
 * buffers hold nranks * count elements; not in place, nor overlapping. */
dfcclResult_t dfcclAllToAll(const void *sendbuff, void *recvbuff, size_t count, dfcclDataType_t datatype,
                            dfcclComm_t comm, dfcclStream_t stream);

dfcclResult_t dfcclGroupStart(void);
dfcclResult_t dfcclGroupEnd(void);

/*
 * Completion of NCCL-style calls on the host engine (stream NULL): the calls
 * return once submitted, and collectives of different communicators may be
 * issued in any order on different ranks. dfcclCommSynchronize waits until
 * every collective this process submitted on comm has completed and returns
 * the first error among them (dfcclSuccess if none); dfcclCommQuery tells
 * whether they all have, without blocking (dfcclSuccess: all done,
 * dfcclInProgress: not yet, else the first error). An error is reported
 * until a dfcclCommSynchronize has returned it. dfcclCommDestroy waits for
 * the outstanding collectives; dfcclCommAbort does not.
 */
dfcclResult_t dfcclCommSynchronize(dfcclComm_t comm);
dfcclResult_t dfcclCommQuery(dfcclComm_t comm);

/* ---------------------------------------------------------------- registered collectives
 *
 * DFCCL-style: describe a collective once, under an id the application
 * chooses (0 <= collId < DFCCL_MAX_COLL_ID, the same on every rank), then run
 * it many times. Runs of different registered collectives match by (collId,
 * run number), so ranks may run them in any order; a run completes through
 * a callback on the library's completion thread, or dfcclWait/dfcclTest.
 * dfcclRunCollective submits at once, also between dfcclGroupStart and
 * dfcclGroupEnd. Re-registering an id keeps counting its runs.
 */

#define DFCCL_MAX_COLL_ID 256

typedef enum {
	dfcclCollAllReduce = 0,
	dfcclCollAllGather = 1,
	dfcclCollReduceScatter = 2,
	dfcclCollBroadcast = 3,
	dfcclCollReduce = 4,
	dfcclNumCollTypes = 5
} dfcclCollType_t;

typedef struct {
	dfcclCollType_t type;
	size_t count;             /* as for the NCCL-style call (sendcount, recvcount) */
	dfcclDataType_t datatype;
	dfcclRedOp_t op;          /* reductions only */
	int root;                 /* broadcast and reduce only */
	int priority;             /* larger runs first when the engine has a choice; 0 default */
} dfcclCollDesc_t;

typedef struct dfcclRequest *dfcclRequest_t;

/* Called once per run, on the library's completion thread (one thread of
 * libdfccl per process, started with the first run that has a callback;
 * never the caller's thread), with the run's result. It must not block; it
 * may submit more work. The callback and dfcclWait/dfcclTest report the
 * same run independently: either may come first. The callback gets the
 * run's status as the daemon completed it: a run that failed as dfccld
 * died can reach it as dfcclRemoteError (its workers fail what they hold
 * on their way out), where dfcclWait, dfcclCommSynchronize and
 * dfcclCommGetAsyncError, which look at the session, say
 * dfcclDaemonUnavailable. */
typedef void (*dfcclCallback_t)(dfcclResult_t result, void *userArg);

dfcclResult_t dfcclRegisterCollective(dfcclComm_t comm, int collId, const dfcclCollDesc_t *desc);
dfcclResult_t dfcclDeregisterCollective(dfcclComm_t comm, int collId);

/*
 * Runs registered collective collId once on these buffers. callback (may
 * be NULL) runs when it completes. If request is not NULL it receives a
 * request to pass to dfcclWait or dfcclTest exactly once (which frees it);
 * with a NULL request only the callback reports completion.
 */
dfcclResult_t dfcclRunCollective(dfcclComm_t comm, int collId, const void *sendbuff, void *recvbuff,
                                 dfcclCallback_t callback, void *userArg, dfcclRequest_t *request);

/* Blocks until the request completes; returns its result and frees it. */
dfcclResult_t dfcclWait(dfcclRequest_t request);

/* *done = 1 and the result (request freed) if it completed; *done = 0 and
 * dfcclSuccess otherwise. */
dfcclResult_t dfcclTest(dfcclRequest_t request, int *done);

#ifdef __cplusplus
}
#endif

#endif /* DFCCL_H */
