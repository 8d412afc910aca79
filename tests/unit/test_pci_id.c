/*
 * Tests of PCI bus ids (proto/pci_id.c): the normal form of each way the
 * driver, sysfs and NVML write an id, equality across those ways, and the
 * ids that name nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pci_id.h"

static void test_normal_form(void **state)
{
	(void)state;
	static const char *const cases[][2] = {
	    {"0000:1B:00.0", "0000:1b:00.0"},     /* the CUDA driver */
	    {"00000000:1b:00.0", "0000:1b:00.0"}, /* NVML: an eight-digit domain */
	    {"0001:3d:00.1", "0001:3d:00.1"},     /* sysfs, another domain */
	    {"000000A2:C1:00.0", "00a2:c1:00.0"},
	    {"1b:00.0", "0000:1b:00.0"},          /* no domain */
	    {"", "0000:"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char out[PCI_ID_MAX];
		pci_id_normalize(cases[i][0], out, sizeof(out));
		assert_string_equal(out, cases[i][1]);
	}
	/* A buffer too small gets a cut, terminated string. */
	char small[6];
	pci_id_normalize("0000:1B:00.0", small, sizeof(small));
	assert_string_equal(small, "0000:");
}

static void test_equal(void **state)
{
	(void)state;
	assert_true(pci_id_equal("0000:1B:00.0", "00000000:1b:00.0"));
	assert_true(pci_id_equal("1b:00.0", "0000:1B:00.0"));
	assert_true(pci_id_equal("0000:3d:00.0", "0000:3D:00.0"));
	assert_false(pci_id_equal("0000:1b:00.0", "0000:1b:00.1"));
	assert_false(pci_id_equal("0000:1b:00.0", "0001:1b:00.0"));
	assert_false(pci_id_equal("0000:1b:00.0", "0000:3d:00.0"));
	/* An empty id (a device without one) equals nothing, itself included. */
	assert_false(pci_id_equal("", ""));
	assert_false(pci_id_equal("", "0000:1b:00.0"));
	assert_false(pci_id_equal("0000:1b:00.0", ""));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_normal_form),
	    cmocka_unit_test(test_equal),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
