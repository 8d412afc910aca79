/*
 * Tests of the daemon's device list (gpu/devices.c) that need no GPU: the
 * host engine's emulated devices, with and without the PCI bus ids of
 * host-pci-bus-ids, a list of the wrong length or with an empty or
 * overlong id refused with a sentence and nothing half-set, and the probe's
 * output read back.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "devices.h"

static void test_host_devices(void **state)
{
	(void)state;
	struct device_desc d[3];
	char err[256] = "";
	devices_host(d, 3);
	assert_string_equal(d[2].name, "host-emulated device 2");
	assert_int_equal(devices_host_bus_ids(d, 3, "", err, sizeof(err)), 0);
	for (int i = 0; i < 3; i++)
		assert_string_equal(d[i].pci_bus_id, "");

	assert_int_equal(devices_host_bus_ids(d, 3, "0000:1b:00.0,0000:3D:00.0,1e:00.0", err, sizeof(err)), 0);
	assert_string_equal(d[0].pci_bus_id, "0000:1b:00.0");
	assert_string_equal(d[1].pci_bus_id, "0000:3D:00.0");
	assert_string_equal(d[2].pci_bus_id, "1e:00.0");
}

static void expect_refused(unsigned n, const char *list, const char *sentence)
{
	struct device_desc d[3];
	char err[256] = "";
	devices_host(d, n);
	assert_int_equal(devices_host_bus_ids(d, n, list, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, sentence);
	for (unsigned i = 0; i < n; i++)
		assert_string_equal(d[i].pci_bus_id, "");
}

static void test_host_bus_ids_refused(void **state)
{
	(void)state;
	expect_refused(2, "0000:1b:00.0", "host-pci-bus-ids names 1 bus id for 2 emulated devices (one each, or none)");
	expect_refused(1, "0000:1b:00.0,0000:1c:00.0,0000:1d:00.0",
	               "host-pci-bus-ids names 3 bus ids for 1 emulated device (one each, or none)");
	expect_refused(2, "0000:1b:00.0,", "host-pci-bus-ids: bus id 1 is empty");
	expect_refused(2, ",0000:1b:00.0", "host-pci-bus-ids: bus id 0 is empty");
	expect_refused(1, "0000:1b:00.0-and-a-great-deal-more", "host-pci-bus-ids: bus id 0 is too long");
}

static void test_parse_probe(void **state)
{
	(void)state;
	struct device_desc d[4];
	int mps = -1;
	memset(d, 0, sizeof(d));
	assert_int_equal(devices_parse_probe("gpus 2 mps 1\ngpu 0 0000:1B:00.0 NVIDIA H100\ngpu 1 0000:3D:00.0 NVIDIA "
	                                     "H100\n", d, 4, &mps), 2);
	assert_int_equal(mps, 1);
	assert_string_equal(d[1].pci_bus_id, "0000:3D:00.0");
	assert_string_equal(d[1].name, "NVIDIA H100");
	assert_int_equal(devices_parse_probe("gpus 2 mps 0\ngpu 0 0000:1B:00.0 x\n", d, 4, &mps), -EBADMSG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_host_devices),
	    cmocka_unit_test(test_host_bus_ids_refused),
	    cmocka_unit_test(test_parse_probe),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
