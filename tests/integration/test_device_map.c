/*
 * Which of the daemon's devices a client's device number names, end to end:
 * dfccld's host engine, whose emulated devices report PCI bus ids
 * (host-pci-bus-ids: device 0 at 0000:1b:00.0, device 1 at 0000:3D:00.0),
 * and rank processes whose CUDA driver is a fake (cudrv_set_ops_for_test)
 * that shows them the GPUs a CUDA_VISIBLE_DEVICES of one GPU would.
 *
 * Covered:
 *   - two ranks that each see one GPU, ordinal 0, one the GPU of the
 *     daemon's device 1 (its bus id written as NVML writes it), the other
 *     that of device 0: the daemon puts each rank on the device with its
 *     GPU's bus id (as its communicator listing says), dfcclCommDevice
 *     gives the ordinal back, and an all-reduce on dfcclMemAlloc buffers
 *     (allocated for ordinal 0, so on each rank's daemon device) sums what
 *     the ranks put in;
 *   - a GPU the daemon does not serve: dfcclCommInitRank fails with a
 *     sentence naming its bus id and the daemon's devices; an ordinal past
 *     the GPUs the process sees fails too;
 *   - a process whose driver sees no GPU: numbers are the daemon's device
 *     indices, as without a driver;
 *   - dfcclGetDeviceCount counts what dfcclSetDevice can name: the one GPU
 *     a rank sees, or the daemon's two devices.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cudrv.h"
#include "dfccl.h"
#include "harness.h"

#define BUS_IDS "0000:1b:00.0,0000:3D:00.0"
#define SERVED "it serves 0 (0000:1b:00.0), 1 (0000:3D:00.0)"
#define COUNT 1000

/* ------------------------------------------------------------ the fake driver */

/* What the rank's driver shows: the bus id of its one GPU, or no GPU. */
static const char *fd_bus_id;

static CUresult fd_init(unsigned flags)
{
	(void)flags;
	return fd_bus_id ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static CUresult fd_count(int *n)
{
	*n = fd_bus_id ? 1 : 0;
	return CUDA_SUCCESS;
}

static CUresult fd_device_get(CUdevice *dev, int ordinal)
{
	if (!fd_bus_id || ordinal != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*dev = 0;
	return CUDA_SUCCESS;
}

static CUresult fd_bus(char *out, int len, CUdevice dev)
{
	if (dev != 0 || len < 13)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(out, (size_t)len, "%s", fd_bus_id);
	return CUDA_SUCCESS;
}

static CUresult fd_pointer_attrs(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
	(void)n, (void)attrs, (void)data, (void)p;
	return CUDA_ERROR_NOT_INITIALIZED; /* no device memory in this process */
}

static struct cudrv_ops fake_driver;

/* In a rank process, before its first libdfccl call. */
static void fake_driver_install(const char *bus_id)
{
	fd_bus_id = bus_id;
	memset(&fake_driver, 0, sizeof(fake_driver));
	fake_driver.init = fd_init;
	fake_driver.device_get_count = fd_count;
	fake_driver.device_get = fd_device_get;
	fake_driver.device_get_pci_bus_id = fd_bus;
	fake_driver.pointer_get_attributes = fd_pointer_attrs;
	cudrv_set_ops_for_test(&fake_driver);
}

/* ------------------------------------------------------------ rank bodies */

struct job {
	dfcclUniqueId id;
	int nranks;
	const char *bus_id[2]; /* each rank's GPU; NULL: it sees none */
	int device;            /* what every rank passes to dfcclSetDevice */
	int expect;            /* the init result */
	const char *expect_msg[2]; /* in its sentence, by rank */
	int ready_fd, go_fd;
};

static float in_value(int rank, size_t i)
{
	return (float)((rank * 17 + (int)(i % 89)) % 53) - 26.0f;
}

/* An all-reduce on dfcclMemAlloc buffers, checked against the sum of every
 * rank's input computed here; then the communicator is destroyed. */
static int allreduce_check(const struct job *j, int rank, dfcclComm_t comm)
{
	float *in = NULL, *out = NULL;
	if (dfcclMemAlloc((void **)&in, COUNT * sizeof(float)) != dfcclSuccess ||
	    dfcclMemAlloc((void **)&out, COUNT * sizeof(float)) != dfcclSuccess)
		RANK_FAIL("dfcclMemAlloc: %s", dfcclGetLastError(NULL));
	for (size_t i = 0; i < COUNT; i++)
		in[i] = in_value(rank, i);
	if (dfcclAllReduce(in, out, COUNT, dfcclFloat32, dfcclSum, comm, NULL) != dfcclSuccess ||
	    dfcclCommSynchronize(comm) != dfcclSuccess)
		RANK_FAIL("all-reduce: %s", dfcclGetLastError(NULL));
	for (size_t i = 0; i < COUNT; i++) {
		float want = 0;
		for (int r = 0; r < j->nranks; r++)
			want += in_value(r, i);
		if (out[i] != want)
			RANK_FAIL("element %zu is %g, expected %g", i, out[i], want);
	}
	if (dfcclMemFree(in) != dfcclSuccess || dfcclMemFree(out) != dfcclSuccess || dfcclCommDestroy(comm) != dfcclSuccess)
		RANK_FAIL("free and destroy: %s", dfcclGetLastError(NULL));
	return 0;
}

static int rank_main(void *arg, int rank)
{
	struct job *j = arg;
	fake_driver_install(j->bus_id[rank]);
	/* The numbers it may give: its one GPU, or the daemon's two devices. */
	int n = -1;
	if (dfcclGetDeviceCount(&n) != dfcclSuccess || n != (j->bus_id[rank] ? 1 : 2))
		RANK_FAIL("dfcclGetDeviceCount says %d (%s)", n, dfcclGetLastError(NULL));
	if (dfcclSetDevice(j->device) != dfcclSuccess)
		RANK_FAIL("dfcclSetDevice(%d): %s", j->device, dfcclGetLastError(NULL));
	dfcclComm_t comm = NULL;
	dfcclResult_t r = dfcclCommInitRank(&comm, j->nranks, j->id, rank);
	if ((int)r != j->expect)
		RANK_FAIL("init returned %d (%s: %s), expected %d", r, dfcclGetErrorString(r), dfcclGetLastError(NULL),
		          j->expect);
	if (j->expect_msg[rank] && !strstr(dfcclGetLastError(NULL), j->expect_msg[rank]))
		RANK_FAIL("error message '%s' lacks '%s'", dfcclGetLastError(NULL), j->expect_msg[rank]);
	if (r != dfcclSuccess)
		return 0;
	int d = -1;
	if (dfcclCommDevice(comm, &d) != dfcclSuccess || d != j->device)
		RANK_FAIL("dfcclCommDevice says %d, expected %d", d, j->device);
	/* The test checks where the rank landed meanwhile; a test that
	 * failed never says go, and the rank gives up. */
	char b = 'r';
	struct pollfd pf = {.fd = j->go_fd, .events = POLLIN};
	if (write(j->ready_fd, &b, 1) != 1 || poll(&pf, 1, 20000) != 1 || read(j->go_fd, &b, 1) != 1)
		RANK_FAIL("the test did not let the rank go on");
	return allreduce_check(j, rank, comm);
}

/* ------------------------------------------------------------ the test side */

static void job_init(struct job *j, int nranks)
{
	*j = (struct job){.nranks = nranks, .expect = dfcclSuccess};
	assert_int_equal(dfcclGetUniqueId(&j->id), dfcclSuccess);
}

/* Runs the job's ranks; where they join, checks with the daemon that rank
 * r lives on its device want[r] before letting them go on. The test keeps
 * no write end of the ready pipe, so ranks that die make it fail, not
 * hang. */
static void run_job(struct daemon_proc *d, struct job *j, const int *want)
{
	int ready[2], go[2];
	pid_t pid[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	j->ready_fd = ready[1];
	j->go_fd = go[0];
	for (int r = 0; r < j->nranks; r++)
		pid[r] = child_run(rank_main, j, r);
	close(ready[1]);
	close(go[0]);
	if (j->expect == dfcclSuccess) {
		char b;
		for (int r = 0; r < j->nranks; r++)
			assert_int_equal(read(ready[0], &b, 1), 1);
		dfccl_envelope *rep = daemon_query(d, DFCCL__V1__QUERY_KIND__QUERY_COMMS);
		assert_non_null(rep);
		const Dfccl__V1__QueryReply *q = rep->query_reply;
		assert_int_equal(q->n_comms, 1);
		assert_int_equal(q->comms[0]->n_ranks, (size_t)j->nranks);
		for (size_t i = 0; i < q->comms[0]->n_ranks; i++) {
			const Dfccl__V1__CommRank *cr = q->comms[0]->ranks[i];
			assert_true(cr->rank < (uint32_t)j->nranks);
			if ((int)cr->device != want[cr->rank])
				fail_msg("rank %u lives on the daemon's device %u, expected %d", cr->rank, cr->device,
				         want[cr->rank]);
		}
		frame_envelope_free(rep);
		for (int r = 0; r < j->nranks; r++)
			assert_int_equal(write(go[1], "g", 1), 1);
	}
	for (int r = 0; r < j->nranks; r++)
		assert_int_equal(child_wait(pid[r], 30000), 0);
	close(ready[0]);
	close(go[1]);
}

static int setup(void **state)
{
	struct daemon_proc *d = calloc(1, sizeof(*d));
	if (!d || daemon_start(d, 2, "--host-pci-bus-ids", BUS_IDS, NULL) != 0)
		return -1;
	*state = d;
	return 0;
}

/* Each rank sees one GPU, ordinal 0: rank 0 the daemon's device 1, rank 1
 * its device 0. */
static void test_ordinal_by_bus_id(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j, 2);
	j.bus_id[0] = "00000000:3d:00.0";
	j.bus_id[1] = "0000:1B:00.0";
	j.device = 0;
	const int want[2] = {1, 0};
	run_job(d, &j, want);
}

/* A GPU the daemon does not serve, and an ordinal the process lacks. */
static void test_unknown_gpu(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j, 1);
	j.bus_id[0] = "0000:99:00.0";
	j.expect = dfcclInvalidArgument;
	j.expect_msg[0] = "CUDA device 0 of this process is the GPU at PCI bus id 0000:99:00.0, which dfccld does not "
	                  "serve; " SERVED;
	run_job(d, &j, NULL);

	j.bus_id[0] = "0000:1b:00.0";
	j.device = 1;
	j.expect_msg[0] = "device 1 is no GPU of this process, which sees 1";
	run_job(d, &j, NULL);
}

/* A driver that sees no GPU: the numbers are the daemon's indices. */
static void test_no_gpu_index(void **state)
{
	struct daemon_proc *d = *state;
	struct job j;
	job_init(&j, 2);
	j.device = 1;
	const int want[2] = {1, 1};
	run_job(d, &j, want);

	j.device = 2;
	j.expect = dfcclInvalidArgument;
	j.nranks = 1;
	j.expect_msg[0] = "device 2 does not exist: dfccld serves 2 device(s)";
	run_job(d, &j, NULL);
}

static int teardown(void **state)
{
	struct daemon_proc *d = *state;
	int rc = daemon_stop(d);
	free(d);
	return rc == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_ordinal_by_bus_id),
	    cmocka_unit_test(test_unknown_gpu),
	    cmocka_unit_test(test_no_gpu_index),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
