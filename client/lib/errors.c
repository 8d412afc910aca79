/*
 * Results, their names, and the per-thread last error; see errors.h.
 *
 * The last error lives in thread-local storage, so concurrent callers never
 * see each other's sentences and no lock is needed. It is overwritten only
 * by a failure, as NCCL's ncclGetLastError is: a successful call leaves the
 * previous sentence in place.
 */
#include "errors.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dfccl.pb-c.h"

static _Thread_local char last_error[1024];

static pthread_once_t debug_once = PTHREAD_ONCE_INIT;
static int debug_warn;

static void debug_read_env(void)
{
	const char *v = getenv("DFCCL_DEBUG");
	debug_warn = v && (!strcasecmp(v, "WARN") || !strcasecmp(v, "INFO") || !strcasecmp(v, "DEBUG"));
}

dfcclResult_t errors_set_at(dfcclResult_t result, const char *func, int line, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);

	pthread_once(&debug_once, debug_read_env);
	if (debug_warn)
		fprintf(stderr, "dfccl[%d] WARN %s:%d: %s (%s)\n", (int)getpid(), func, line, last_error,
		        dfcclGetErrorString(result));
	return result;
}

const char *errors_last(void)
{
	return last_error;
}

dfcclResult_t errors_from_code(uint32_t code)
{
	/* Indexed by dfccl.v1.ErrorCode. NOT_FOUND is an argument error from the
	 * caller's point of view: it named a communicator or buffer that the
	 * daemon does not know. */
	static const dfcclResult_t map[] = {
	    [DFCCL__V1__ERROR_CODE__ERROR_NONE] = dfcclSuccess,
	    [DFCCL__V1__ERROR_CODE__ERROR_INTERNAL] = dfcclInternalError,
	    [DFCCL__V1__ERROR_CODE__ERROR_INVALID_ARGUMENT] = dfcclInvalidArgument,
	    [DFCCL__V1__ERROR_CODE__ERROR_INVALID_USAGE] = dfcclInvalidUsage,
	    [DFCCL__V1__ERROR_CODE__ERROR_VERSION_MISMATCH] = dfcclVersionMismatch,
	    [DFCCL__V1__ERROR_CODE__ERROR_PERMISSION] = dfcclPermissionDenied,
	    [DFCCL__V1__ERROR_CODE__ERROR_NOT_FOUND] = dfcclInvalidArgument,
	    [DFCCL__V1__ERROR_CODE__ERROR_TIMEOUT] = dfcclTimeout,
	    [DFCCL__V1__ERROR_CODE__ERROR_PEER_LOST] = dfcclRemoteError,
	    [DFCCL__V1__ERROR_CODE__ERROR_ABORTED] = dfcclAborted,
	    [DFCCL__V1__ERROR_CODE__ERROR_DEVICE_LOST] = dfcclDeviceLost,
	    [DFCCL__V1__ERROR_CODE__ERROR_SHUTTING_DOWN] = dfcclDaemonUnavailable,
	    [DFCCL__V1__ERROR_CODE__ERROR_RESOURCE] = dfcclSystemError,
	    [DFCCL__V1__ERROR_CODE__ERROR_NOT_SUPPORTED] = dfcclNotSupported,
	};
	/* A code from a newer daemon that this library does not know is still
	 * a failure; report it as the daemon's internal error. */
	if (code >= sizeof(map) / sizeof(map[0]) || (code != 0 && map[code] == dfcclSuccess))
		return dfcclInternalError;
	return map[code];
}

const char *dfcclGetErrorString(dfcclResult_t result)
{
	static const char *const s[dfcclNumResults] = {
	    [dfcclSuccess] = "no error",
	    [dfcclUnhandledCudaError] = "unhandled CUDA error",
	    [dfcclSystemError] = "system error (out of memory, descriptors or a resource limit)",
	    [dfcclInternalError] = "internal error in libdfccl or dfccld",
	    [dfcclInvalidArgument] = "invalid argument",
	    [dfcclInvalidUsage] = "invalid usage",
	    [dfcclRemoteError] = "a remote rank failed or disconnected",
	    [dfcclInProgress] = "operation in progress",
	    [dfcclDaemonUnavailable] = "dfccld is not reachable",
	    [dfcclVersionMismatch] = "libdfccl and dfccld share no protocol version",
	    [dfcclPermissionDenied] = "permission denied",
	    [dfcclTimeout] = "timed out",
	    [dfcclAborted] = "the communicator was aborted",
	    [dfcclDeviceLost] = "the daemon's worker for the device was lost",
	    [dfcclNotSupported] = "not supported by the daemon's engine",
	};
	if ((unsigned)result >= dfcclNumResults || !s[result])
		return "unknown result code";
	return s[result];
}

const char *dfcclGetLastError(dfcclComm_t comm)
{
	return last_error;
}

dfcclResult_t dfcclGetVersion(int *version)
{
	if (!version)
		return errors_set(dfcclInvalidArgument, "dfcclGetVersion: version is NULL");
	*version = DFCCL_VERSION_CODE;
	return dfcclSuccess;
}
