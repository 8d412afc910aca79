/*
 * NCCL opened with dlopen; see nccl_lib.h. The table of calls is filled
 * from a list of (symbol, slot, required) so that a missing call is named
 * in the error instead of surfacing as a NULL call later.
 */
#include "nccl_lib.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nccl_api nccl;

static void *nccl_handle;
static int nccl_version_code;
static char nccl_file[4096];
static _Thread_local char nccl_err[640];

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(nccl_err, sizeof(nccl_err), fmt, ap);
	va_end(ap);
}

const char *nccl_lib_error(void)
{
	return nccl_err;
}

#define SLOT(member) offsetof(struct nccl_api, member)

static const struct nccl_sym {
	const char *name;
	size_t slot;
	bool required;
} nccl_syms[] = {
    {"ncclGetVersion", SLOT(get_version), true},
    {"ncclGetUniqueId", SLOT(get_unique_id), true},
    {"ncclCommInitRank", SLOT(comm_init_rank), true},
    {"ncclCommDestroy", SLOT(comm_destroy), true},
    {"ncclCommAbort", SLOT(comm_abort), true},
    {"ncclCommGetAsyncError", SLOT(comm_get_async_error), true},
    {"ncclGetErrorString", SLOT(get_error_string), true},
    {"ncclGetLastError", SLOT(get_last_error), false},
    {"ncclAllReduce", SLOT(all_reduce), true},
    {"ncclBroadcast", SLOT(broadcast), true},
    {"ncclReduce", SLOT(reduce), true},
    {"ncclAllGather", SLOT(all_gather), true},
    {"ncclReduceScatter", SLOT(reduce_scatter), true},
    {"ncclSend", SLOT(send), true},
    {"ncclRecv", SLOT(recv), true},
    {"ncclGroupStart", SLOT(group_start), true},
    {"ncclGroupEnd", SLOT(group_end), true},
    {"ncclMemAlloc", SLOT(mem_alloc), false},
    {"ncclMemFree", SLOT(mem_free), false},
    {"ncclCommWindowRegister", SLOT(comm_window_register), false},
    {"ncclCommWindowDeregister", SLOT(comm_window_deregister), false},
};

/* Resolves every call of h into *api; -1 when a required one is missing. */
static int resolve(void *h, const char *path, struct nccl_api *api)
{
	for (size_t i = 0; i < sizeof(nccl_syms) / sizeof(nccl_syms[0]); i++) {
		const struct nccl_sym *s = &nccl_syms[i];
		void *fn = dlsym(h, s->name);
		if (!fn && s->required) {
			set_error("%s is not a usable NCCL: it has no %s (NCCL 2.7 or later is needed)", path, s->name);
			return -1;
		}
		/* POSIX lets a dlsym result be stored as a function pointer. */
		memcpy((char *)api + s->slot, &fn, sizeof(fn));
	}
	return 0;
}

int nccl_lib_open(const char *path)
{
	if (nccl_handle)
		return 0;
	const char *env = getenv(NCCL_LIB_ENV);
	bool from_env = !path && env && *env;
	if (!path)
		path = from_env ? env : NCCL_LIB_DEFAULT;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		set_error("cannot load NCCL (%s%s): %s; put the folder that holds libnccl.so.2 on LD_LIBRARY_PATH, or "
		          "name the file in %s",
		          from_env ? NCCL_LIB_ENV "=" : "", path, dlerror(), NCCL_LIB_ENV);
		return -1;
	}
	struct nccl_api api;
	int code = 0;
	if (resolve(h, path, &api) < 0) {
		dlclose(h);
		return -1;
	}
	if (api.get_version(&code) != ncclSuccess || code <= 0) {
		set_error("%s is not a usable NCCL: ncclGetVersion failed", path);
		dlclose(h);
		return -1;
	}
	/* The file the dynamic linker found, for the record of what ran. */
	Dl_info info;
	void *fn;
	memcpy(&fn, &api.get_version, sizeof(fn));
	snprintf(nccl_file, sizeof(nccl_file), "%s", dladdr(fn, &info) && info.dli_fname ? info.dli_fname : path);
	nccl = api;
	nccl_version_code = code;
	nccl_handle = h;
	return 0;
}

bool nccl_lib_loaded(void)
{
	return nccl_handle != NULL;
}

const char *nccl_lib_path(void)
{
	return nccl_file;
}

int nccl_lib_version(void)
{
	return nccl_version_code;
}

char *nccl_lib_version_name(int code, char *buf, size_t n)
{
	/* NCCL_VERSION(X, Y, Z): X * 1000 + Y * 100 + Z up to 2.8, then
	 * X * 10000 + Y * 100 + Z. */
	if (code >= 10000)
		snprintf(buf, n, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
	else
		snprintf(buf, n, "%d.%d.%d", code / 1000, code / 100 % 10, code % 100);
	return buf;
}

int nccl_lib_need_windows(void)
{
	if (nccl.mem_alloc && nccl.mem_free && nccl.comm_window_register && nccl.comm_window_deregister)
		return 0;
	char v[32];
	set_error("NCCL %s (%s) has no %s: symmetric windows need NCCL 2.27 or later",
	          nccl_lib_version_name(nccl_version_code, v, sizeof(v)), nccl_file,
	          nccl.mem_alloc ? "ncclCommWindowRegister" : "ncclMemAlloc");
	return -1;
}

int nccl_lib_check(ncclResult_t r, ncclComm_t comm, const char *what)
{
	if (r == ncclSuccess)
		return 0;
	const char *last = nccl.get_last_error ? nccl.get_last_error(comm) : NULL;
	set_error("%s: %s%s%s", what, nccl.get_error_string ? nccl.get_error_string(r) : "NCCL error",
	          last && *last ? ": " : "", last && *last ? last : "");
	return -1;
}
