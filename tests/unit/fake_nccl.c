/*
 * A stand-in for libnccl.so.2 that has NCCL's symbols and does none of its
 * work, for the tests of the code that opens NCCL at run time (nccl_lib.h):
 * ncclGetVersion and ncclGetUniqueId answer, the calls that would need a
 * GPU fail with ncclInternalError, and error strings say they come from
 * here. Built twice: as a current NCCL (2.28.9), and with FAKE_NCCL_OLD as
 * an NCCL 2.8.4, which predates ncclGetLastError (2.13), ncclMemAlloc
 * (2.19) and window registration (2.27), so those symbols are missing.
 *
 * The types are spelled as plain C types of the same ABI (enums are ints,
 * handles pointers), so that this file depends on no NCCL declaration.
 */
#include <stddef.h>
#include <string.h>

#define FAKE_INTERNAL_ERROR 3

#ifdef FAKE_NCCL_OLD
#define FAKE_VERSION 2804
#else
#define FAKE_VERSION 22809
#endif

typedef struct {
	char internal[128];
} fake_unique_id;

int ncclGetVersion(int *version)
{
	*version = FAKE_VERSION;
	return 0;
}

int ncclGetUniqueId(fake_unique_id *id)
{
	memset(id, 0x5a, sizeof(*id));
	return 0;
}

const char *ncclGetErrorString(int result)
{
	return result ? "fake NCCL error" : "no error";
}

int ncclCommInitRank(void **comm, int nranks, fake_unique_id id, int rank)
{
	*comm = NULL;
	return FAKE_INTERNAL_ERROR;
}

int ncclCommDestroy(void *comm)
{
	return 0;
}

int ncclCommAbort(void *comm)
{
	return 0;
}

int ncclCommGetAsyncError(void *comm, int *async_error)
{
	*async_error = 0;
	return 0;
}

/* The collectives and point-to-point calls, which need a GPU. */
#define FAKE_CALL(name)                     \
	int name(void)                      \
	{                                   \
		return FAKE_INTERNAL_ERROR; \
	}
FAKE_CALL(ncclAllReduce)
FAKE_CALL(ncclBroadcast)
FAKE_CALL(ncclReduce)
FAKE_CALL(ncclAllGather)
FAKE_CALL(ncclReduceScatter)
FAKE_CALL(ncclSend)
FAKE_CALL(ncclRecv)

int ncclGroupStart(void)
{
	return 0;
}

int ncclGroupEnd(void)
{
	return 0;
}

#ifndef FAKE_NCCL_OLD
const char *ncclGetLastError(void *comm)
{
	return "the fake NCCL does no work";
}

FAKE_CALL(ncclMemAlloc)
FAKE_CALL(ncclMemFree)
FAKE_CALL(ncclCommWindowRegister)
FAKE_CALL(ncclCommWindowDeregister)
#endif
