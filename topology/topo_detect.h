/*
 * Detection: a topology model of this node's GPUs.
 *
 * The GPUs and their order come from the CUDA runtime when the build has
 * it (so device i of the model is CUDA device i, as the daemon numbers
 * devices), else from NVML. NVML, loaded with dlopen("libnvidia-ml.so.1")
 * so that nothing links against the driver, gives the NVLinks of every GPU
 * (which peer or NVSwitch each active link reaches, and its version), the
 * PCIe path between every pair (same switch, several switches, host
 * bridge, NUMA node, across sockets) and the PCIe generation and width.
 * CUDA's P2P attributes say whether a pair can reach each other's memory
 * at all. sysfs gives each GPU's NUMA node and local CPUs, and the RDMA
 * NICs (/sys/class/infiniband). Bandwidths are estimates from link kinds
 * and counts (a tuning file corrects the decisions they lead to).
 *
 * Detection touches the GPUs, so the daemon runs it only in its probe
 * process (`dfccld --probe-topology`), never in the supervisor.
 */
#ifndef DFCCL_TOPO_DETECT_H
#define DFCCL_TOPO_DETECT_H

#include <stddef.h>
#include <stdio.h>

#include "topo_model.h"

/*
 * Detects the node. Returns 0, or -ENODEV with a sentence in err when the
 * node has no usable NVIDIA GPU or driver (the caller decides what to do
 * without a model), or -ENOMEM.
 */
int topo_detect(struct topo_model **out, char *err, size_t errlen);

/* The probe's body: prints the detected model as JSON and returns 0, or
 * prints "# " and the reason and returns 1. */
int topo_detect_print(FILE *f);

#endif /* DFCCL_TOPO_DETECT_H */
