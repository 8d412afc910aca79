/*
 * Unit tests of nccl_lib (client/tools/nccl_lib.c), NCCL opened at run
 * time, on machines with or without NCCL: the library loaded is a fake one
 * (fake_nccl.c) whose path the build gives, current (2.28.9) or old
 * (2.8.4, without the calls of later versions).
 *
 * Covered: a missing file fails with a sentence naming it, LD_LIBRARY_PATH
 * and DFCCL_NCCL_LIB, and so does a missing file named by DFCCL_NCCL_LIB; a
 * library that is not NCCL is refused with the call it lacks; version codes
 * of both encodings read as MAJOR.MINOR.PATCH; a current NCCL loads with
 * every call resolved, its version and the file it came from, and failed
 * calls read as "what: error string: last error"; a later open keeps the
 * first library; an old NCCL loads with the calls it lacks left NULL, and
 * symmetric windows are refused naming its version. A process keeps the
 * first NCCL it loads, so the old one is tried in a child process. When the
 * build has nccl.h, nccl_lib.h's declarations are held against it at
 * compile time (nccl_lib_nccl_h.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "nccl_lib.h"

#if !defined(FAKE_NCCL_PATH) || !defined(FAKE_NCCL_OLD_PATH)
#error "FAKE_NCCL_PATH and FAKE_NCCL_OLD_PATH must name the fake NCCL libraries"
#endif

#define assert_contains(haystack, needle)                                                        \
	do {                                                                                     \
		if (!strstr((haystack), (needle)))                                               \
			fail_msg("\"%s\" does not contain \"%s\"", (haystack), (needle));        \
	} while (0)

static void test_missing_file(void **state)
{
	unsetenv(NCCL_LIB_ENV);
	assert_int_equal(nccl_lib_open("/nonexistent/nccl/libnccl.so.2"), -1);
	assert_contains(nccl_lib_error(), "cannot load NCCL (/nonexistent/nccl/libnccl.so.2)");
	assert_contains(nccl_lib_error(), "LD_LIBRARY_PATH");
	assert_contains(nccl_lib_error(), NCCL_LIB_ENV);
	assert_false(nccl_lib_loaded());
	assert_null(nccl.get_version);
	assert_string_equal(nccl_lib_path(), "");
	assert_int_equal(nccl_lib_version(), 0);
}

static void test_missing_file_from_env(void **state)
{
	setenv(NCCL_LIB_ENV, "/nonexistent/env/libnccl.so.2", 1);
	assert_int_equal(nccl_lib_open(NULL), -1);
	unsetenv(NCCL_LIB_ENV);
	assert_contains(nccl_lib_error(), "cannot load NCCL (" NCCL_LIB_ENV "=/nonexistent/env/libnccl.so.2)");
	assert_false(nccl_lib_loaded());
}

static void test_not_nccl(void **state)
{
	/* The C math library is on every machine this builds on. */
	assert_int_equal(nccl_lib_open("libm.so.6"), -1);
	assert_contains(nccl_lib_error(), "libm.so.6 is not a usable NCCL: it has no ncclGetVersion");
	assert_false(nccl_lib_loaded());
	assert_null(nccl.all_reduce);
}

static void test_version_names(void **state)
{
	char v[32];
	assert_string_equal(nccl_lib_version_name(22809, v, sizeof(v)), "2.28.9");
	assert_string_equal(nccl_lib_version_name(21903, v, sizeof(v)), "2.19.3");
	assert_string_equal(nccl_lib_version_name(21000, v, sizeof(v)), "2.10.0");
	/* Up to 2.8 the minor version had one digit of its own. */
	assert_string_equal(nccl_lib_version_name(2804, v, sizeof(v)), "2.8.4");
	assert_string_equal(nccl_lib_version_name(2708, v, sizeof(v)), "2.7.8");
}

/* In a child: the old NCCL loads, lacks the later calls, and symmetric
 * windows are refused. Returns 0 when all of that holds. */
static int old_nccl_child(void)
{
	if (nccl_lib_open(FAKE_NCCL_OLD_PATH) < 0) {
		fprintf(stderr, "old NCCL: %s\n", nccl_lib_error());
		return 1;
	}
	if (nccl_lib_version() != 2804 || !nccl.all_reduce || !nccl.send || nccl.get_last_error || nccl.mem_alloc ||
	    nccl.comm_window_register)
		return 2;
	if (nccl_lib_need_windows() != -1 || !strstr(nccl_lib_error(), "NCCL 2.8.4") ||
	    !strstr(nccl_lib_error(), "no ncclMemAlloc: symmetric windows need NCCL 2.27 or later"))
		return 3;
	/* Without ncclGetLastError a failure has the error string alone. */
	if (nccl_lib_check(ncclInternalError, NULL, "ncclAllReduce") != -1 ||
	    strcmp(nccl_lib_error(), "ncclAllReduce: fake NCCL error") != 0)
		return 4;
	return 0;
}

static void test_old_nccl(void **state)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(old_nccl_child());
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_current_nccl(void **state)
{
	assert_int_equal(nccl_lib_open(FAKE_NCCL_PATH), 0);
	assert_true(nccl_lib_loaded());
	assert_int_equal(nccl_lib_version(), 22809);
	/* The file the dynamic linker opened: the fake's own path. */
	assert_string_equal(nccl_lib_path(), FAKE_NCCL_PATH);
	void *const calls[] = {
	    (void *)nccl.get_version,    (void *)nccl.get_unique_id,      (void *)nccl.comm_init_rank,
	    (void *)nccl.comm_destroy,   (void *)nccl.comm_abort,         (void *)nccl.comm_get_async_error,
	    (void *)nccl.get_error_string, (void *)nccl.get_last_error,   (void *)nccl.all_reduce,
	    (void *)nccl.broadcast,      (void *)nccl.reduce,             (void *)nccl.all_gather,
	    (void *)nccl.reduce_scatter, (void *)nccl.send,               (void *)nccl.recv,
	    (void *)nccl.group_start,    (void *)nccl.group_end,          (void *)nccl.mem_alloc,
	    (void *)nccl.mem_free,       (void *)nccl.comm_window_register, (void *)nccl.comm_window_deregister,
	};
	for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
		assert_non_null(calls[i]);
	assert_int_equal(nccl_lib_need_windows(), 0);

	ncclUniqueId id;
	assert_int_equal(nccl_lib_check(nccl.get_unique_id(&id), NULL, "ncclGetUniqueId"), 0);
	assert_int_equal((unsigned char)id.internal[0], 0x5a);
	ncclComm_t comm;
	assert_int_equal(nccl_lib_check(nccl.comm_init_rank(&comm, 2, id, 0), NULL, "ncclCommInitRank"), -1);
	assert_string_equal(nccl_lib_error(), "ncclCommInitRank: fake NCCL error: the fake NCCL does no work");

	/* Loaded once: a later open keeps it, whatever it names. */
	assert_int_equal(nccl_lib_open("/nonexistent/other/libnccl.so.2"), 0);
	assert_string_equal(nccl_lib_path(), FAKE_NCCL_PATH);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    /* Before any library is loaded: the process keeps the first. */
	    cmocka_unit_test(test_missing_file),
	    cmocka_unit_test(test_missing_file_from_env),
	    cmocka_unit_test(test_not_nccl),
	    cmocka_unit_test(test_version_names),
	    cmocka_unit_test(test_old_nccl),
	    cmocka_unit_test(test_current_nccl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
