/*
 * See topo_detect.h. NVML's types are declared here (only the few this file
 * uses, with the layouts of NVML's stable _v2/_v3 entry points) so that the
 * build needs no driver headers; the library is loaded at run time and
 * every missing entry point degrades the model instead of failing it,
 * except the four without which there is no GPU list.
 */
#include "topo_detect.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pci_id.h"
#include "topo_json.h"

/* ---------------------------------------------------------------- NVML, by hand */

typedef int nvmlReturn_t; /* 0: NVML_SUCCESS */
typedef void *nvmlDevice_t;
typedef struct {
	char busIdLegacy[16];
	unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

#define NVML_NVLINK_MAX_LINKS 18
#define NVML_NVLINK_DEVICE_TYPE_GPU 0
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 2
/* nvmlGpuTopologyLevel_t */
#define NVML_TOPOLOGY_SINGLE 10
#define NVML_TOPOLOGY_MULTIPLE 20
#define NVML_TOPOLOGY_HOSTBRIDGE 30
#define NVML_TOPOLOGY_NODE 40

struct nvml {
	void *lib;
	nvmlReturn_t (*init)(void);
	nvmlReturn_t (*shutdown)(void);
	const char *(*error_string)(nvmlReturn_t);
	nvmlReturn_t (*count)(unsigned *);
	nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *);
	nvmlReturn_t (*by_pci)(const char *, nvmlDevice_t *);
	nvmlReturn_t (*pci_info)(nvmlDevice_t, nvmlPciInfo_t *);
	nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned);
	nvmlReturn_t (*nvlink_state)(nvmlDevice_t, unsigned, int *);
	nvmlReturn_t (*nvlink_version)(nvmlDevice_t, unsigned, unsigned *);
	nvmlReturn_t (*nvlink_remote_pci)(nvmlDevice_t, unsigned, nvmlPciInfo_t *);
	nvmlReturn_t (*nvlink_remote_type)(nvmlDevice_t, unsigned, int *);
	nvmlReturn_t (*common_ancestor)(nvmlDevice_t, nvmlDevice_t, int *);
	nvmlReturn_t (*pcie_gen)(nvmlDevice_t, unsigned *);
	nvmlReturn_t (*pcie_width)(nvmlDevice_t, unsigned *);
};

static int nvml_open(struct nvml *n, char *err, size_t errlen)
{
	memset(n, 0, sizeof(*n));
	n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!n->lib) {
		snprintf(err, errlen,
		         "no NVIDIA driver on this node: NVML (libnvidia-ml.so.1) cannot be loaded (%s); "
		         "give the model with --topology FILE, or use the host engine",
		         dlerror());
		return -ENODEV;
	}
#define SYM(field, name) (*(void **)&n->field = dlsym(n->lib, name))
	SYM(init, "nvmlInit_v2");
	SYM(shutdown, "nvmlShutdown");
	SYM(error_string, "nvmlErrorString");
	SYM(count, "nvmlDeviceGetCount_v2");
	SYM(by_index, "nvmlDeviceGetHandleByIndex_v2");
	SYM(by_pci, "nvmlDeviceGetHandleByPciBusId_v2");
	SYM(pci_info, "nvmlDeviceGetPciInfo_v3");
	SYM(name, "nvmlDeviceGetName");
	SYM(nvlink_state, "nvmlDeviceGetNvLinkState");
	SYM(nvlink_version, "nvmlDeviceGetNvLinkVersion");
	SYM(nvlink_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
	SYM(nvlink_remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType");
	SYM(common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
	SYM(pcie_gen, "nvmlDeviceGetMaxPcieLinkGeneration");
	SYM(pcie_width, "nvmlDeviceGetMaxPcieLinkWidth");
#undef SYM
	if (!n->init || !n->count || !n->by_index || !n->pci_info) {
		snprintf(err, errlen, "NVML (libnvidia-ml.so.1) lacks nvmlInit_v2 or the device queries: driver too old");
		dlclose(n->lib);
		return -ENODEV;
	}
	nvmlReturn_t r = n->init();
	if (r != 0) {
		snprintf(err, errlen, "NVML cannot start: %s (is the NVIDIA driver loaded?)",
		         n->error_string ? n->error_string(r) : "unknown error");
		dlclose(n->lib);
		return -ENODEV;
	}
	return 0;
}

static void nvml_close(struct nvml *n)
{
	if (n->shutdown)
		n->shutdown();
	dlclose(n->lib);
}

/* ---------------------------------------------------------------- helpers */

/* A one-line sysfs attribute of a PCI device, without its newline. */
static int sysfs_read(const char *pci, const char *attr, char *buf, size_t len)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/%s", pci, attr);
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	int rc = fgets(buf, (int)len, f) ? 0 : -EIO;
	fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
	return rc;
}

/* Per-direction GB/s of one NVLink. NVML reports the version either as the
 * generation (older drivers) or as nvmlNvlinkVersion_t (1.0, 2.0, 2.2,
 * 3.0, 3.1, 4.0, 5.0 = 1..7): either way 1 is 20 GB/s, 7 is NVLink 5 at 50,
 * and everything between runs at 25 GB/s per link. gen gets the
 * generation. */
static double nvlink_gbps(unsigned version, unsigned *gen)
{
	static const unsigned gen_of[] = {0, 1, 2, 3, 4, 3, 4, 5};
	*gen = version < sizeof(gen_of) / sizeof(gen_of[0]) ? gen_of[version] : 5;
	return version <= 1 ? 20.0 : version >= 7 ? 50.0 : 25.0;
}

/* Usable GB/s of a PCIe link: per-lane rate by generation, times width,
 * times the share the path delivers (peer transfers through a host bridge
 * or across sockets deliver less). */
static double pcie_gbps(unsigned gen, unsigned width, enum topo_link_type type)
{
	static const double lane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};
	double raw = (gen < sizeof(lane) / sizeof(lane[0]) ? lane[gen] : lane[6]) * (width ? width : 16);
	if (gen == 0)
		raw = 0.985 * 16; /* unknown: assume gen3 x16 */
	switch (type) {
	case TOPO_LINK_PIX:
	case TOPO_LINK_PXB: return raw * 0.8;
	case TOPO_LINK_PHB: return raw * 0.75;
	case TOPO_LINK_NODE: return raw * 0.7;
	default: return raw * 0.6;
	}
}

static double type_lat_us(enum topo_link_type t)
{
	switch (t) {
	case TOPO_LINK_NVLINK: return 0.7;
	case TOPO_LINK_NVSWITCH: return 0.8;
	case TOPO_LINK_PIX: return 1.0;
	case TOPO_LINK_PXB: return 1.2;
	case TOPO_LINK_PHB: return 1.5;
	case TOPO_LINK_NODE: return 1.8;
	default: return 2.5;
	}
}

/* RDMA NICs from /sys/class/infiniband: name, PCI device, NUMA node, rate. */
static void detect_nics(struct topo_model *m)
{
	DIR *d = opendir("/sys/class/infiniband");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) && m->nnic < TOPO_MAX_NICS) {
		if (e->d_name[0] == '.')
			continue;
		struct topo_nic *n = &m->nic[m->nnic];
		char path[PATH_MAX], real[PATH_MAX], buf[128];
		memset(n, 0, sizeof(*n));
		snprintf(n->name, sizeof(n->name), "%.31s", e->d_name);
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device", e->d_name);
		if (realpath(path, real)) {
			const char *base = strrchr(real, '/');
			snprintf(n->pci_bus_id, sizeof(n->pci_bus_id), "%.31s", base ? base + 1 : real);
		}
		n->numa_node = -1;
		if (n->pci_bus_id[0] && sysfs_read(n->pci_bus_id, "numa_node", buf, sizeof(buf)) == 0)
			n->numa_node = atoi(buf);
		/* "100 Gb/sec (4X EDR)" */
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/rate", e->d_name);
		FILE *f = fopen(path, "re");
		n->bw_gbps = 12.5;
		if (f) {
			if (fgets(buf, sizeof(buf), f) && atof(buf) > 0)
				n->bw_gbps = atof(buf) / 8;
			fclose(f);
		}
		m->nnic++;
	}
	closedir(d);
}

/* ---------------------------------------------------------------- detection */

#ifdef DFCCL_HAVE_CUDA
int topo_cuda_devices(unsigned max, char (*pci)[32], int *p2p, char *err, size_t errlen);
#endif

int topo_detect(struct topo_model **out, char *err, size_t errlen)
{
	*out = NULL;
	struct nvml nv;
	int rc = nvml_open(&nv, err, errlen);
	if (rc < 0)
		return rc;

	static char pci[TOPO_MAX_DEVICES][32];
	static int p2p[TOPO_MAX_DEVICES * TOPO_MAX_DEVICES];
	nvmlDevice_t h[TOPO_MAX_DEVICES];
	unsigned n = 0, nvml_n = 0;
	struct topo_model *m = NULL;

	int have_p2p = 0;
#ifdef DFCCL_HAVE_CUDA
	/* CUDA's order is the daemon's device numbering. */
	int cn = topo_cuda_devices(TOPO_MAX_DEVICES, pci, p2p, err, errlen);
	if (cn < 0) {
		rc = cn;
		goto out_nvml;
	}
	n = (unsigned)cn;
	have_p2p = 1;
	for (unsigned i = 0; i < n; i++) {
		if (!nv.by_pci || nv.by_pci(pci[i], &h[i]) != 0) {
			snprintf(err, errlen, "NVML does not know the GPU at %s that CUDA reports", pci[i]);
			rc = -ENODEV;
			goto out_nvml;
		}
	}
#else
	if (nv.count(&nvml_n) != 0)
		nvml_n = 0;
	n = nvml_n > TOPO_MAX_DEVICES ? TOPO_MAX_DEVICES : nvml_n;
	for (unsigned i = 0; i < n; i++) {
		nvmlPciInfo_t pi;
		if (nv.by_index(i, &h[i]) != 0 || nv.pci_info(h[i], &pi) != 0) {
			snprintf(err, errlen, "NVML cannot describe GPU %u", i);
			rc = -ENODEV;
			goto out_nvml;
		}
		snprintf(pci[i], sizeof(pci[i]), "%s", pi.busId);
	}
#endif
	(void)nvml_n;
	if (n == 0) {
		snprintf(err, errlen, "the NVIDIA driver is loaded but reports no GPU");
		rc = -ENODEV;
		goto out_nvml;
	}
	rc = topo_model_new(n, &m);
	if (rc < 0)
		goto out_nvml;
	gethostname(m->name, sizeof(m->name) - 1);

	/* Per GPU: NVLinks to each peer, NVLinks to switches, their version. */
	unsigned (*links)[TOPO_MAX_DEVICES] = calloc(TOPO_MAX_DEVICES, sizeof(*links));
	unsigned sw[TOPO_MAX_DEVICES] = {0}, ver[TOPO_MAX_DEVICES] = {0}, pgen[TOPO_MAX_DEVICES], pwidth[TOPO_MAX_DEVICES];
	if (!links) {
		rc = -ENOMEM;
		goto out_model;
	}
	for (unsigned i = 0; i < n; i++) {
		struct topo_device *d = &m->dev[i];
		char buf[sizeof(d->cpu_affinity)];
		pci_id_normalize(pci[i], d->pci_bus_id, sizeof(d->pci_bus_id));
		if (nv.name)
			nv.name(h[i], d->name, sizeof(d->name));
		if (sysfs_read(d->pci_bus_id, "numa_node", buf, sizeof(buf)) == 0)
			d->numa_node = atoi(buf);
		if (sysfs_read(d->pci_bus_id, "local_cpulist", buf, sizeof(buf)) == 0)
			snprintf(d->cpu_affinity, sizeof(d->cpu_affinity), "%s", buf);
		pgen[i] = pwidth[i] = 0;
		if (nv.pcie_gen)
			nv.pcie_gen(h[i], &pgen[i]);
		if (nv.pcie_width)
			nv.pcie_width(h[i], &pwidth[i]);
	}
	for (unsigned i = 0; i < n && nv.nvlink_state && nv.nvlink_remote_pci; i++) {
		for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
			int active = 0, type = -1;
			nvmlPciInfo_t rp;
			if (nv.nvlink_state(h[i], l, &active) != 0 || !active)
				continue;
			if (nv.nvlink_version && ver[i] == 0)
				nv.nvlink_version(h[i], l, &ver[i]);
			if (nv.nvlink_remote_type && nv.nvlink_remote_type(h[i], l, &type) != 0)
				type = -1;
			if (type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
				sw[i]++;
				continue;
			}
			unsigned j = n;
			int have_remote = nv.nvlink_remote_pci(h[i], l, &rp) == 0;
			if (have_remote) {
				char remote[32];
				pci_id_normalize(rp.busId, remote, sizeof(remote));
				for (unsigned k = 0; k < n; k++)
					if (strcmp(remote, m->dev[k].pci_bus_id) == 0)
						j = k;
			}
			/* A link to a GPU outside the model (hidden from this
			 * process) counts for nothing; one whose far end NVML
			 * cannot name is taken for a switch port. */
			if (j < n)
				links[i][j]++;
			else if (!have_remote || type != NVML_NVLINK_DEVICE_TYPE_GPU)
				sw[i]++;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		for (unsigned j = i + 1; j < n; j++) {
			struct topo_link l = {0};
			unsigned gen;
			double per = nvlink_gbps(ver[i], &gen);
			if (links[i][j]) {
				l.type = TOPO_LINK_NVLINK;
				l.nvlinks = links[i][j];
				l.nvlink_gen = gen;
				l.bw_gbps = l.nvlinks * per;
			} else if (sw[i] && sw[j]) {
				l.type = TOPO_LINK_NVSWITCH;
				l.nvlinks = sw[i] < sw[j] ? sw[i] : sw[j];
				l.nvlink_gen = gen;
				l.bw_gbps = l.nvlinks * per;
			} else {
				int level = 50;
				if (nv.common_ancestor)
					nv.common_ancestor(h[i], h[j], &level);
				l.type = level <= NVML_TOPOLOGY_SINGLE       ? TOPO_LINK_PIX
				         : level <= NVML_TOPOLOGY_MULTIPLE   ? TOPO_LINK_PXB
				         : level <= NVML_TOPOLOGY_HOSTBRIDGE ? TOPO_LINK_PHB
				         : level <= NVML_TOPOLOGY_NODE       ? TOPO_LINK_NODE
				                                             : TOPO_LINK_SYS;
				unsigned g = pgen[i] < pgen[j] ? pgen[i] : pgen[j];
				unsigned w = pwidth[i] < pwidth[j] ? pwidth[i] : pwidth[j];
				/* Without P2P access the copy bounces through host
				 * memory, as across sockets. */
				int through_host = have_p2p && (!p2p[i * n + j] || !p2p[j * n + i]);
				l.bw_gbps = pcie_gbps(g, w, through_host ? TOPO_LINK_SYS : l.type);
			}
			l.lat_us = type_lat_us(l.type);
			topo_model_set_link(m, i, j, &l);
		}
	}
	free(links);
	detect_nics(m);
	nvml_close(&nv);
	*out = m;
	return 0;

out_model:
	topo_model_free(m);
out_nvml:
	nvml_close(&nv);
	return rc;
}

int topo_detect_print(FILE *f)
{
	char err[512] = "";
	struct topo_model *m;
	int rc = topo_detect(&m, err, sizeof(err));
	if (rc < 0) {
		fprintf(f, "# %s\n", err[0] ? err : strerror(-rc));
		return 1;
	}
	char *s = topo_json_dump(m);
	topo_model_free(m);
	if (!s) {
		fprintf(f, "# out of memory\n");
		return 1;
	}
	fputs(s, f);
	free(s);
	return 0;
}
