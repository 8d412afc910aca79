/*
 * NCCL, opened at run time, for the programs that measure dfccl against it
 * (dfccl-perf --backend nccl) or show what it does where dfccl differs (the
 * GPU tests' NCCL runs).
 *
 * Nothing links NCCL and nothing needs nccl.h: NCCL may be missing from the
 * build machine and from the machine that runs the program, which then says
 * so when asked for NCCL and works otherwise. The types, constants and calls
 * used are declared below with the values of NCCL 2.28's nccl.h (NCCL keeps
 * them stable within major version 2); where nccl.h is found at build time,
 * a unit test holds them against it (tests/unit/nccl_lib_nccl_h.c). Include
 * nccl.h, where needed at all, before this header: the declarations then
 * come from it.
 *
 * nccl_lib_open() loads the library once per process and resolves the calls
 * into the table `nccl`. It touches no GPU and starts no CUDA: a process
 * may open NCCL and create a unique id (ncclGetUniqueId starts NCCL's
 * bootstrap listener, a thread, and nothing else) before it forks the rank
 * processes, which alone initialise CUDA.
 *
 * Functions return 0 or -1; after -1, nccl_lib_error() is a sentence saying
 * what failed, for the caller's message.
 */
#ifndef DFCCL_NCCL_LIB_H
#define DFCCL_NCCL_LIB_H

#include <stdbool.h>
#include <stddef.h>

/* The file loaded when no other is named. */
#define NCCL_LIB_DEFAULT "libnccl.so.2"

/* The environment variable that names another file. */
#define NCCL_LIB_ENV "DFCCL_NCCL_LIB"

/*
 * nccl.h's constants that these declarations use, as (name, value) lists:
 * they make the enumerations below, and the test against nccl.h checks each
 * pair.
 */
#define NCCL_LIB_RESULTS(X)                                                                  \
	X(ncclSuccess, 0) X(ncclUnhandledCudaError, 1) X(ncclSystemError, 2) X(ncclInternalError, 3) \
	X(ncclInvalidArgument, 4) X(ncclInvalidUsage, 5) X(ncclRemoteError, 6) X(ncclInProgress, 7)
#define NCCL_LIB_TYPES(X)                                                                            \
	X(ncclInt8, 0) X(ncclUint8, 1) X(ncclInt32, 2) X(ncclUint32, 3) X(ncclInt64, 4) X(ncclUint64, 5) \
	X(ncclFloat16, 6) X(ncclFloat32, 7) X(ncclFloat64, 8) X(ncclBfloat16, 9)
#define NCCL_LIB_OPS(X) X(ncclSum, 0) X(ncclProd, 1) X(ncclMax, 2) X(ncclMin, 3) X(ncclAvg, 4)
#define NCCL_LIB_MACROS(X) X(NCCL_UNIQUE_ID_BYTES, 128) X(NCCL_WIN_COLL_SYMMETRIC, 0x01)

#ifndef NCCL_H_ /* nccl.h was not included: declare what is used */
#define NCCL_LIB_ENUMERATOR(name, value) name = value,
typedef enum { NCCL_LIB_RESULTS(NCCL_LIB_ENUMERATOR) } ncclResult_t;
typedef enum { NCCL_LIB_TYPES(NCCL_LIB_ENUMERATOR) } ncclDataType_t;
typedef enum { NCCL_LIB_OPS(NCCL_LIB_ENUMERATOR) } ncclRedOp_t;
#undef NCCL_LIB_ENUMERATOR
#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_WIN_COLL_SYMMETRIC 0x01
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
#endif /* NCCL_H_ */

/* A CUDA stream (cudaStream_t), without the CUDA headers. */
typedef struct CUstream_st *nccl_lib_stream_t;

/*
 * The calls, with nccl.h's prototypes. Those marked optional are NULL when
 * the library predates them; every other one is there once
 * nccl_lib_open() has succeeded (NCCL 2.7 or later).
 */
struct nccl_api {
	ncclResult_t (*get_version)(int *version);
	ncclResult_t (*get_unique_id)(ncclUniqueId *id);
	ncclResult_t (*comm_init_rank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
	ncclResult_t (*comm_destroy)(ncclComm_t comm);
	ncclResult_t (*comm_abort)(ncclComm_t comm);
	ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t *async_error);
	const char *(*get_error_string)(ncclResult_t result);
	const char *(*get_last_error)(ncclComm_t comm); /* optional: 2.13 */
	ncclResult_t (*all_reduce)(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
	                           ncclRedOp_t op, ncclComm_t comm, nccl_lib_stream_t stream);
	ncclResult_t (*broadcast)(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
	                          int root, ncclComm_t comm, nccl_lib_stream_t stream);
	ncclResult_t (*reduce)(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
	                       ncclRedOp_t op, int root, ncclComm_t comm, nccl_lib_stream_t stream);
	ncclResult_t (*all_gather)(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
	                           ncclComm_t comm, nccl_lib_stream_t stream);
	ncclResult_t (*reduce_scatter)(const void *sendbuff, void *recvbuff, size_t recvcount,
	                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
	                               nccl_lib_stream_t stream);
	ncclResult_t (*send)(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
	                     nccl_lib_stream_t stream);
	ncclResult_t (*recv)(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
	                     nccl_lib_stream_t stream);
	ncclResult_t (*group_start)(void);
	ncclResult_t (*group_end)(void);
	ncclResult_t (*mem_alloc)(void **ptr, size_t size); /* optional: 2.19 */
	ncclResult_t (*mem_free)(void *ptr);               /* optional: 2.19 */
	ncclResult_t (*comm_window_register)(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
	                                     int win_flags); /* optional: 2.27 */
	ncclResult_t (*comm_window_deregister)(ncclComm_t comm, ncclWindow_t win); /* optional: 2.27 */
};

/* The calls of the library nccl_lib_open() loaded (all NULL before). */
extern struct nccl_api nccl;

/*
 * Loads NCCL: the file at path, else the one $DFCCL_NCCL_LIB names, else
 * libnccl.so.2 from the library search path (LD_LIBRARY_PATH, the ld.so
 * cache). Once it has succeeded, later calls return 0 and keep the library
 * loaded first; after a failure another path may be tried.
 */
int nccl_lib_open(const char *path);

/* Whether nccl_lib_open() has succeeded in this process. */
bool nccl_lib_loaded(void);

/* The file the library was loaded from ("" before), and its version
 * (NCCL_VERSION_CODE, from ncclGetVersion; 0 before). */
const char *nccl_lib_path(void);
int nccl_lib_version(void);

/* A version code as "MAJOR.MINOR.PATCH" into buf[n] (NCCL_VERSION's two
 * encodings: up to 2.8 and from 2.9). Returns buf. */
char *nccl_lib_version_name(int code, char *buf, size_t n);

/* 0 if the library has ncclMemAlloc and symmetric window registration
 * (NCCL 2.27 or later); else -1 and nccl_lib_error() says so. */
int nccl_lib_need_windows(void);

/* The check of every NCCL call: 0 for ncclSuccess; else -1, and
 * nccl_lib_error() is "what: NCCL's error string: its last error" (comm
 * may be NULL). */
int nccl_lib_check(ncclResult_t r, ncclComm_t comm, const char *what);

/* What the last failure of this thread's nccl_lib calls was. */
const char *nccl_lib_error(void);

#endif /* DFCCL_NCCL_LIB_H */
