/*
 * Tests of dfccld's settings table (daemon/config.c): every default lies
 * within its own bounds; config_set accepts good values and refuses bad ones
 * with a message that names the setting; size suffixes; the configuration
 * file format and its errors (file:line); and the order of the sources:
 * defaults < file < environment < command line.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "log.h"
#include "worker_user.h"

/* Writes text to a fresh temporary file; the path goes to path[64]. */
static void write_conf(char *path, const char *text)
{
	snprintf(path, 64, "/tmp/dfccld-test-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	size_t len = strlen(text);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	close(fd);
}

/* Every setting the environment may carry, so no test sees another's. */
static const char *const env_names[] = {
    "DFCCLD_CONFIG", "DFCCLD_SOCKET", "DFCCLD_ENGINE", "DFCCLD_HOST_DEVICES", "DFCCLD_LOG_LEVEL",
    "DFCCLD_SQ_ENTRIES", "DFCCLD_MAX_SESSIONS_PER_UID", "DFCCLD_MAX_REGISTERED_BYTES_PER_UID",
};

static int clean_env(void **state)
{
	for (unsigned i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++)
		unsetenv(env_names[i]);
	return 0;
}

static void test_defaults(void **state)
{
	struct dfccld_config c;
	memset(&c, 0x5a, sizeof(c));
	config_defaults(&c);
	/* The documented defaults, and each one within its own bounds (a bad
	 * default would be silently skipped by config_defaults). */
	assert_string_equal(c.socket_path, "/run/dfccl/dfccld.sock");
	assert_string_equal(c.config_file, DFCCLD_DEFAULT_CONFIG);
	assert_string_equal(c.topology_file, "");
	assert_int_equal(c.engine, DFCCLD_ENGINE_AUTO);
	assert_int_equal(c.host_devices, 2);
	assert_int_equal(c.log_level, LOG_LEVEL_INFO);
	assert_int_equal(c.log_target, LOG_TARGET_AUTO);
	assert_int_equal(c.max_sessions_per_uid, 256);
	assert_int_equal(c.max_registered_bytes_per_uid, 64ll << 30);
	assert_int_equal(c.max_comms_per_uid, 4096);
	assert_int_equal(c.comm_init_timeout_ms, 30000);
	assert_int_equal(c.sq_entries, 1024);
	assert_int_equal(c.worker_restart_delay_ms, 100);
	assert_int_equal(c.worker_start_timeout_ms, 30000);
	assert_int_equal(c.channels, 32);
	assert_int_equal(c.channels_mps, 32);
	assert_int_equal(c.spread_blocks, 1);
	assert_int_equal(c.kernel_idle_us, 200);
	assert_int_equal(c.kernel_idle_mps_us, 5000);
	assert_int_equal(c.resident_blocks, 0);
	assert_int_equal(c.resident_blocks_mps, 1);
	assert_int_equal(c.bulk_idle_us, 1000);
	assert_int_equal(c.launch_gate, 0);
	assert_int_equal(c.launch_gate_mps, 1);
	assert_int_equal(c.launch_gate_idle_us, 5);
	assert_int_equal(c.early_take, 1);
	assert_int_equal(c.push_bytes, 65536);
	assert_int_equal(c.ll_bytes, 16384);
	assert_int_equal(c.visit_bytes, 4 << 20);
	assert_int_equal(c.chan_bytes, 256 << 10);
	assert_int_equal(c.oneshot_bytes, 64 << 10);
	assert_int_equal(c.shutdown_grace_ms, 2000);
	assert_int_equal(c.worker_user, WORKER_USER_AUTO);
	assert_int_equal(c.max_inflight_per_session, 256);
	assert_int_equal(c.max_inflight_per_uid, 1024);

	/* Setting each default again through config_set must succeed: that is
	 * the bounds check the table applies to every other source. */
	struct dfccld_config d;
	config_defaults(&d);
	char err[512];
	FILE *dump = tmpfile();
	assert_non_null(dump);
	config_dump(&c, dump);
	rewind(dump);
	char line[512];
	unsigned n = 0;
	while (fgets(line, sizeof(line), dump)) {
		line[strcspn(line, "\n")] = '\0';
		char *sp = strchr(line, ' ');
		assert_non_null(sp);
		*sp = '\0';
		assert_int_equal(config_set(&d, line, sp + 1, err, sizeof(err)), 0);
		n++;
	}
	fclose(dump);
	assert_int_equal(n, 54);
	assert_memory_equal(&c, &d, sizeof(c));
}

static void expect_set(const char *name, const char *value, int rc_expected)
{
	struct dfccld_config c;
	config_defaults(&c);
	char err[512] = "";
	int rc = config_set(&c, name, value, err, sizeof(err));
	assert_int_equal(rc, rc_expected);
	if (rc < 0) {
		/* The sentence names the setting (quoted) so a user can find it. */
		char quoted[128];
		snprintf(quoted, sizeof(quoted), "'%s'", name);
		assert_non_null(strstr(err, quoted));
	}
}

static void test_set_good(void **state)
{
	struct dfccld_config c;
	config_defaults(&c);
	char err[512];
	assert_int_equal(config_set(&c, "host-devices", "1", err, sizeof(err)), 0);
	assert_int_equal(c.host_devices, 1);
	assert_int_equal(config_set(&c, "channels", "32", err, sizeof(err)), 0);
	assert_int_equal(c.channels, 32);
	assert_int_equal(config_set(&c, "spread-blocks", "0", err, sizeof(err)), 0);
	assert_int_equal(c.spread_blocks, 0);
	assert_int_equal(config_set(&c, "early-take", "0", err, sizeof(err)), 0);
	assert_int_equal(c.early_take, 0);
	assert_int_equal(config_set(&c, "host-devices", "64", err, sizeof(err)), 0);
	assert_int_equal(c.host_devices, 64);
	assert_int_equal(config_set(&c, "engine", "cuda", err, sizeof(err)), 0);
	assert_int_equal(c.engine, DFCCLD_ENGINE_CUDA);
	assert_int_equal(config_set(&c, "engine", "host", err, sizeof(err)), 0);
	assert_int_equal(c.engine, DFCCLD_ENGINE_HOST);
	assert_int_equal(config_set(&c, "log-level", "debug", err, sizeof(err)), 0);
	assert_int_equal(c.log_level, LOG_LEVEL_DEBUG);
	assert_int_equal(config_set(&c, "log-level", "err", err, sizeof(err)), 0);
	assert_int_equal(c.log_level, LOG_LEVEL_ERR);
	assert_int_equal(config_set(&c, "log-target", "journal", err, sizeof(err)), 0);
	assert_int_equal(c.log_target, LOG_TARGET_JOURNAL);
	static const struct {
		const char *text;
		int value;
	} worker_users[] = {{"job", WORKER_USER_JOB}, {"daemon", WORKER_USER_DAEMON}, {"auto", WORKER_USER_AUTO}};
	for (unsigned i = 0; i < sizeof(worker_users) / sizeof(worker_users[0]); i++) {
		assert_int_equal(config_set(&c, "worker-user", worker_users[i].text, err, sizeof(err)), 0);
		assert_int_equal(c.worker_user, worker_users[i].value);
	}
	assert_int_equal(config_set(&c, "sq-entries", "16", err, sizeof(err)), 0);
	assert_int_equal(c.sq_entries, 16);
	assert_int_equal(config_set(&c, "sq-entries", "65536", err, sizeof(err)), 0);
	assert_int_equal(c.sq_entries, 65536);
	assert_int_equal(config_set(&c, "socket", "/tmp/x.sock", err, sizeof(err)), 0);
	assert_string_equal(c.socket_path, "/tmp/x.sock");
	assert_int_equal(config_set(&c, "worker-restart-delay-ms", "0", err, sizeof(err)), 0);
	assert_int_equal(c.worker_restart_delay_ms, 0);
	/* Under MPS the worker gets the twins' values. */
	assert_string_equal(config_mps_twin("channels"), "channels-mps");
	assert_string_equal(config_mps_twin("kernel-idle-us"), "kernel-idle-mps-us");
	assert_string_equal(config_mps_twin("resident-blocks"), "resident-blocks-mps");
	assert_string_equal(config_mps_twin("launch-gate"), "launch-gate-mps");
	assert_string_equal(config_mps_twin("spin-head"), "spin-head");
	char v[64];
	assert_int_equal(config_format(&c, config_mps_twin("resident-blocks"), v, sizeof(v)), 0);
	assert_string_equal(v, "1"); /* resident-blocks itself is 0 */
	assert_int_equal(config_set(&c, "visit-bytes", "4M", err, sizeof(err)), 0);
	assert_int_equal(c.visit_bytes, 4 << 20);
}

static void test_sizes(void **state)
{
	struct dfccld_config c;
	config_defaults(&c);
	char err[512];
	static const struct {
		const char *text;
		int64_t value;
	} ok[] = {
	    {"0", 0},
	    {"1024", 1024},
	    {"64G", 64ll << 30},
	    {"64g", 64ll << 30},
	    {"3K", 3072},
	    {"5M", 5ll << 20},
	    {"2T", 2ll << 40},
	    {"8GB", 8ll << 30},
	    {"8Gb", 8ll << 30},
	    {"9223372036854775807", INT64_MAX},
	};
	for (unsigned i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		assert_int_equal(config_set(&c, "max-registered-bytes-per-uid", ok[i].text, err, sizeof(err)), 0);
		assert_int_equal(c.max_registered_bytes_per_uid, ok[i].value);
	}
	/* Suffixes belong to sizes only. */
	expect_set("host-devices", "2K", -EINVAL);
	expect_set("max-registered-bytes-per-uid", "64X", -EINVAL);
	expect_set("max-registered-bytes-per-uid", "64GiB", -EINVAL);
	expect_set("max-registered-bytes-per-uid", "G", -EINVAL);
	expect_set("max-registered-bytes-per-uid", "-1K", -ERANGE);
	/* 2^23 T overflows int64. */
	expect_set("max-registered-bytes-per-uid", "8388608T", -ERANGE);
	expect_set("max-registered-bytes-per-uid", "-1", -ERANGE);
	expect_set("max-registered-bytes-per-uid", "99999999999999999999", -EINVAL);
}

static void test_set_bad(void **state)
{
	expect_set("host-devices", "0", -ERANGE);
	expect_set("host-devices", "65", -ERANGE);
	expect_set("host-devices", "-3", -ERANGE);
	expect_set("host-devices", "two", -EINVAL);
	expect_set("host-devices", "", -EINVAL);
	expect_set("host-devices", "3 ", -EINVAL);
	expect_set("host-devices", "0x10", -EINVAL);
	expect_set("comm-init-timeout-ms", "9", -ERANGE);
	expect_set("comm-init-timeout-ms", "3600001", -ERANGE);
	expect_set("sq-entries", "1000", -EINVAL); /* in range, not a power of two */
	expect_set("sq-entries", "48", -EINVAL);
	expect_set("sq-entries", "8", -ERANGE);
	expect_set("sq-entries", "131072", -ERANGE);
	expect_set("channels", "0", -ERANGE);
	expect_set("channels", "33", -ERANGE); /* DFCCL_COMM_MAX_CHANNELS */
	expect_set("visit-bytes", "1", -ERANGE);  /* one element a piece: a typo */
	expect_set("visit-bytes", "0", -ERANGE);
	expect_set("visit-bytes", "2G", -ERANGE);
	expect_set("spread-blocks", "2", -ERANGE);
	expect_set("resident-blocks", "9", -ERANGE); /* beside the channels: at most 8 */
	expect_set("resident-blocks", "8", 0);
	expect_set("resident-blocks-mps", "-1", -ERANGE);
	expect_set("spread-blocks", "yes", -EINVAL);
	expect_set("engine", "gpu", -EINVAL);
	expect_set("engine", "", -EINVAL);
	expect_set("engine", "CUDA", -EINVAL);
	expect_set("log-level", "verbose", -EINVAL);
	/* The unused slots of the level table are not a way to set level 0. */
	expect_set("log-level", "", -EINVAL);
	expect_set("log-target", "syslog", -EINVAL);
	expect_set("worker-user", "root", -EINVAL);
	expect_set("worker-user", "1000", -EINVAL);

	char longpath[200];
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[sizeof(longpath) - 1] = '\0';
	expect_set("socket", longpath, -ERANGE);

	/* An unknown name is named back, and the value is left alone. */
	struct dfccld_config c, d;
	config_defaults(&c);
	config_defaults(&d);
	char err[512] = "";
	assert_int_equal(config_set(&c, "host-device", "3", err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "'host-device'"));
	assert_memory_equal(&c, &d, sizeof(c));
	/* A refused value changes nothing either. */
	assert_int_equal(config_set(&c, "sq-entries", "1000", err, sizeof(err)), -EINVAL);
	assert_int_equal(config_set(&c, "engine", "gpu", err, sizeof(err)), -EINVAL);
	assert_memory_equal(&c, &d, sizeof(c));
	/* A NULL error buffer is allowed. */
	assert_int_equal(config_set(&c, "host-devices", "0", NULL, 0), -ERANGE);
}

static void test_file(void **state)
{
	char path[64];
	write_conf(path, "# dfccld settings\n"
	                 "\n"
	                 "   \t\n"
	                 "host-devices = 4   # four emulated devices\n"
	                 "engine=host\n"
	                 "  sq-entries   =   256  \n"
	                 "max-registered-bytes-per-uid = 2G\n"
	                 "socket = /tmp/dfccl test.sock\n");
	struct dfccld_config c;
	config_defaults(&c);
	char err[512] = "";
	assert_int_equal(config_load_file(&c, path, 1, err, sizeof(err)), 0);
	assert_int_equal(c.host_devices, 4);
	assert_int_equal(c.engine, DFCCLD_ENGINE_HOST);
	assert_int_equal(c.sq_entries, 256);
	assert_int_equal(c.max_registered_bytes_per_uid, 2ll << 30);
	assert_string_equal(c.socket_path, "/tmp/dfccl test.sock");
	unlink(path);
}

/* Loads a one-off file and returns the error sentence in err. */
static int load_text(const char *text, char *err, size_t errlen, char *path)
{
	write_conf(path, text);
	struct dfccld_config c;
	config_defaults(&c);
	int rc = config_load_file(&c, path, 1, err, errlen);
	unlink(path);
	return rc;
}

static void expect_file_error(const char *text, int rc_expected, unsigned line, const char *needle)
{
	char err[512] = "", path[64], where[96];
	assert_int_equal(load_text(text, err, sizeof(err), path), rc_expected);
	snprintf(where, sizeof(where), "%s:%u:", path, line);
	assert_non_null(strstr(err, where));
	assert_non_null(strstr(err, needle));
}

static void test_file_errors(void **state)
{
	expect_file_error("host-devices = 2\nthis line has no equals sign\n", -EINVAL, 2, "name = value");
	expect_file_error("# ok\n\nhost-devices = 100\n", -ERANGE, 3, "'host-devices'");
	expect_file_error("sq-entries = 100\n", -EINVAL, 1, "power of two");
	expect_file_error("\n\n\n\nno-such-setting = 1\n", -ENOENT, 5, "'no-such-setting'");
	/* A file cannot point at another file. */
	expect_file_error("host-devices = 2\nconfig = /etc/other.conf\n", -EINVAL, 2, "'config'");

	/* A missing file is fine unless it was asked for. */
	struct dfccld_config c;
	config_defaults(&c);
	char err[512] = "";
	assert_int_equal(config_load_file(&c, "/nonexistent/dfccld.conf", 0, err, sizeof(err)), 0);
	assert_int_equal(config_load_file(&c, "/nonexistent/dfccld.conf", 1, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/dfccld.conf"));
}

static void test_env(void **state)
{
	struct dfccld_config c;
	config_defaults(&c);
	char err[512] = "";
	setenv("DFCCLD_HOST_DEVICES", "7", 1);
	setenv("DFCCLD_MAX_REGISTERED_BYTES_PER_UID", "1T", 1);
	setenv("DFCCLD_LOG_LEVEL", "debug", 1);
	assert_int_equal(config_load_env(&c, err, sizeof(err)), 0);
	assert_int_equal(c.host_devices, 7);
	assert_int_equal(c.max_registered_bytes_per_uid, 1ll << 40);
	assert_int_equal(c.log_level, LOG_LEVEL_DEBUG);

	setenv("DFCCLD_SQ_ENTRIES", "17", 1);
	assert_int_equal(config_load_env(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "DFCCLD_SQ_ENTRIES"));
	assert_non_null(strstr(err, "'sq-entries'"));
}

static int parse(char *err, size_t errlen, struct dfccld_config *c, int argc, char **argv)
{
	memset(err, 0, errlen);
	return config_parse(c, argc, argv, err, errlen);
}

static void test_precedence(void **state)
{
	char path[64];
	write_conf(path, "host-devices = 3\n"
	                 "sq-entries = 64\n"
	                 "engine = cuda\n"
	                 "comm-init-timeout-ms = 500\n");
	setenv("DFCCLD_HOST_DEVICES", "5", 1);
	setenv("DFCCLD_SQ_ENTRIES", "128", 1);
	setenv("DFCCLD_ENGINE", "host", 1);
	char *argv[] = {"dfccld", "--config", path, "--host-devices=6", "--engine", "auto", NULL};
	struct dfccld_config c;
	char err[512];
	assert_int_equal(parse(err, sizeof(err), &c, 6, argv), 0);
	assert_string_equal(c.config_file, path);
	assert_int_equal(c.comm_init_timeout_ms, 500); /* file only */
	assert_int_equal(c.sq_entries, 128);           /* environment over file */
	assert_int_equal(c.host_devices, 6);           /* command line over both */
	assert_int_equal(c.engine, DFCCLD_ENGINE_AUTO);
	assert_int_equal(c.shutdown_grace_ms, 2000);   /* nobody: the default */

	/* DFCCLD_CONFIG names the file when the command line does not. */
	clean_env(NULL);
	setenv("DFCCLD_CONFIG", path, 1);
	char *argv2[] = {"dfccld", NULL};
	assert_int_equal(parse(err, sizeof(err), &c, 1, argv2), 0);
	assert_int_equal(c.host_devices, 3);
	assert_int_equal(c.engine, DFCCLD_ENGINE_CUDA);
	unlink(path);

	/* ...and then it must exist. */
	assert_int_equal(parse(err, sizeof(err), &c, 1, argv2), -ENOENT);
	assert_non_null(strstr(err, path));
}

static void test_command_line_errors(void **state)
{
	struct dfccld_config c;
	char err[512];
	char *a1[] = {"dfccld", "--config", "/nonexistent.conf", "--host-devices", NULL};
	assert_true(parse(err, sizeof(err), &c, 4, a1) < 0);
	assert_non_null(strstr(err, "needs a value"));
	char *a2[] = {"dfccld", "--no-such-option=1", NULL};
	assert_int_equal(parse(err, sizeof(err), &c, 2, a2), -ENOENT);
	assert_non_null(strstr(err, "--no-such-option"));
	char *a3[] = {"dfccld", "stray", NULL};
	assert_int_equal(parse(err, sizeof(err), &c, 2, a3), -EINVAL);
	assert_non_null(strstr(err, "'stray'"));
	char *a4[] = {"dfccld", "--config=/nonexistent.conf", NULL};
	assert_int_equal(parse(err, sizeof(err), &c, 2, a4), -ENOENT);
	char path[64];
	write_conf(path, "\n");
	char *a5[] = {"dfccld", "--config", path, "--sq-entries=100", NULL};
	assert_int_equal(parse(err, sizeof(err), &c, 4, a5), -EINVAL);
	assert_non_null(strstr(err, "'sq-entries'"));
	unlink(path);
}

/* config_parse prints --help and --version to stdout: keep the test log
 * readable by sending it to /dev/null meanwhile. */
static int parse_quietly(struct dfccld_config *c, int argc, char **argv)
{
	char err[512];
	fflush(stdout);
	int saved = dup(STDOUT_FILENO);
	int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
	assert_true(saved >= 0 && null >= 0);
	dup2(null, STDOUT_FILENO);
	int rc = parse(err, sizeof(err), c, argc, argv);
	fflush(stdout);
	dup2(saved, STDOUT_FILENO);
	close(saved);
	close(null);
	return rc;
}

static void test_help_and_version(void **state)
{
	struct dfccld_config c;
	/* --help and --version win over anything else on the line, even
	 * options that would fail. */
	char *a1[] = {"dfccld", "--bogus", "--help", NULL};
	assert_int_equal(parse_quietly(&c, 3, a1), 1);
	char *a2[] = {"dfccld", "-h", NULL};
	assert_int_equal(parse_quietly(&c, 2, a2), 1);
	char *a3[] = {"dfccld", "--version", NULL};
	assert_int_equal(parse_quietly(&c, 2, a3), 1);

	/* The help lists every setting with its environment name. */
	FILE *f = tmpfile();
	assert_non_null(f);
	config_print_help(f, "dfccld");
	long len = ftell(f);
	rewind(f);
	char *text = calloc(1, (size_t)len + 1);
	assert_non_null(text);
	assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	assert_non_null(strstr(text, "--sq-entries"));
	assert_non_null(strstr(text, "DFCCLD_SQ_ENTRIES"));
	assert_non_null(strstr(text, "DFCCLD_MAX_REGISTERED_BYTES_PER_UID"));
	assert_non_null(strstr(text, "range 16..65536"));
	free(text);

	assert_string_equal(config_engine_name(DFCCLD_ENGINE_HOST), "host");
	assert_string_equal(config_engine_name(7), "?");
	assert_string_equal(config_engine_name(-1), "?");
}

/* Every setting of the CUDA engine (its help starts "cuda engine") reaches
 * the workers: passed by name, or the MPS twin of one that is; each name
 * passed is a setting, once. A setting left out would keep its default in
 * the workers whatever dfccld was given. */
static void test_worker_settings(void **state)
{
	(void)state;
	size_t n;
	const char *const *w = config_worker_settings(&n);
	struct dfccld_config c;
	config_defaults(&c);
	char buf[256];
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(config_format(&c, w[i], buf, sizeof(buf)), 0);
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(w[i], w[j]);
	}
	const char *name, *help;
	size_t cuda = 0;
	for (size_t i = 0; config_setting_at(i, &name, &help) == 0; i++) {
		if (strncmp(help, "cuda engine", 11) != 0)
			continue;
		cuda++;
		int passed = 0;
		for (size_t k = 0; k < n && !passed; k++)
			passed = strcmp(w[k], name) == 0 || strcmp(config_mps_twin(w[k]), name) == 0;
		if (!passed)
			fail_msg("setting %s of the cuda engine is not passed to the workers (config_worker_settings)", name);
	}
	assert_true(cuda >= 10); /* the help's convention still holds */
	assert_int_equal(config_setting_at((size_t)-1, &name, &help), -1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, clean_env, clean_env)
	const struct CMUnitTest tests[] = {
	    T(test_defaults), T(test_set_good),  T(test_sizes),      T(test_set_bad),
	    T(test_file),     T(test_file_errors), T(test_env),      T(test_precedence),
	    T(test_command_line_errors), T(test_help_and_version), T(test_worker_settings),
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
