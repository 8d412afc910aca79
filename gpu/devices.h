/*
 * Device discovery for the daemon.
 *
 * The supervisor never touches a GPU, so it learns the node's GPUs from a
 * probe: a short-lived child process (`dfccld --probe-devices`) that asks the
 * CUDA runtime and prints one line per device, which devices_parse_probe()
 * reads back. Workers use devices_open_cuda() to create their device's
 * context. The host engine's devices are emulated and need no probe.
 */
#ifndef DFCCL_DEVICES_H
#define DFCCL_DEVICES_H

#include <stddef.h>
#include <stdio.h>

struct device_desc {
	char name[96];
	char pci_bus_id[32]; /* empty for emulated devices */
};

/* n emulated devices named "host-emulated device i". */
void devices_host(struct device_desc *out, unsigned n);

/*
 * Gives the n emulated devices of out the PCI bus ids of `list`: one per
 * device, in device order, separated by commas (setting host-pci-bus-ids);
 * an empty list leaves them without. So clients can be tested on the host
 * engine as they run on GPUs, where they find the daemon's device by the
 * bus id of their CUDA ordinal. Returns 0, or -EINVAL with a sentence in
 * err.
 */
int devices_host_bus_ids(struct device_desc *out, unsigned n, const char *list, char *err, size_t errlen);

/*
 * The probe's body: prints "gpus N mps M" then one "gpu INDEX PCI NAME" line
 * per GPU to f. Without a CUDA build, or without a usable GPU, prints
 * "gpus 0 mps 0" and a "# reason" line. Returns 0.
 */
int devices_probe_print(FILE *f);

/*
 * Parses probe output into out[0..max). Returns the number of GPUs (0 when
 * there are none) or -EBADMSG; *mps_active gets the MPS state.
 */
int devices_parse_probe(const char *text, struct device_desc *out, unsigned max, int *mps_active);

/* Worker side: makes `index` the current CUDA device and creates its context
 * (touching every kernel first, once kernels exist). Fills d. Returns 0, or
 * -ENODEV with a sentence in err. Without a CUDA build: -ENOTSUP. */
int devices_open_cuda(int index, struct device_desc *d, char *err, size_t errlen);

/* Whether an MPS control daemon is reachable (pipe directory present). */
int devices_mps_active(void);

#endif
