/*
 * The topology model: what the node looks like to the algorithms.
 *
 * A model is a list of devices (PCI bus id, NUMA node, CPU affinity), one
 * link between every ordered pair of devices (its type, how many NVLinks
 * and of which generation, its bandwidth in GB/s per direction and its
 * latency), and the NICs. Every decision about rings, trees and algorithm
 * selection is made from a model and nothing else, so a model loaded from
 * a file (topo_json.h) reproduces on any machine what the algorithms do on
 * the machine it describes. Detection (topo_detect.h) is just one way of
 * filling a model.
 *
 * Links are symmetric: topo_model_set_link() sets both directions. The
 * link of a device to itself is TOPO_LINK_SELF.
 */
#ifndef DFCCL_TOPO_MODEL_H
#define DFCCL_TOPO_MODEL_H

#include <stddef.h>

#define TOPO_MAX_DEVICES 64
#define TOPO_MAX_NICS 32
/* Ranks of one communicator (the host engine may place several on a device). */
#define TOPO_MAX_RANKS 128

/* Ordered from the fastest path to the slowest one, as nvidia-smi orders its
 * matrix; TOPO_LINK_HOST is the host engine's emulated link. */
enum topo_link_type {
	TOPO_LINK_SELF = 0,     /* a device to itself (or two ranks on one device) */
	TOPO_LINK_NVLINK,       /* direct NVLink(s) between the two GPUs */
	TOPO_LINK_NVSWITCH,     /* NVLink through NVSwitch */
	TOPO_LINK_PIX,          /* PCIe, at most one PCIe switch between them */
	TOPO_LINK_PXB,          /* PCIe, several switches, no host bridge */
	TOPO_LINK_PHB,          /* PCIe through a host bridge (one CPU) */
	TOPO_LINK_NODE,         /* PCIe across host bridges of one NUMA node */
	TOPO_LINK_SYS,          /* PCIe across sockets (the inter-socket link) */
	TOPO_LINK_HOST,         /* host engine: copies through host memory */
	TOPO_LINK_TYPE_COUNT_
};

struct topo_link {
	enum topo_link_type type;
	unsigned nvlinks;    /* TOPO_LINK_NVLINK / NVSWITCH: links used between the pair */
	unsigned nvlink_gen; /* NVLink generation, 0 when unknown or not NVLink */
	double bw_gbps;      /* bandwidth per direction, GB/s */
	double lat_us;       /* one-way latency of a small transfer, microseconds */
};

struct topo_device {
	char name[96];
	char pci_bus_id[32]; /* "0000:06:00.0"; empty for emulated devices */
	int numa_node;       /* -1 when unknown */
	char cpu_affinity[128]; /* CPU list as in sysfs ("0-19,40-59"); empty when unknown */
};

struct topo_nic {
	char name[32];
	char pci_bus_id[32];
	int numa_node;
	double bw_gbps;
};

struct topo_model {
	char name[64];
	unsigned ndev;
	struct topo_device *dev;   /* [ndev] */
	struct topo_link *links;   /* [ndev * ndev], row-major */
	unsigned nnic;
	struct topo_nic nic[TOPO_MAX_NICS];
};

/* A model of ndev devices (1..TOPO_MAX_DEVICES) whose links are all SELF
 * on the diagonal and unset (type SYS, bandwidth 0) elsewhere. */
int topo_model_new(unsigned ndev, struct topo_model **out);
void topo_model_free(struct topo_model *m);

/* A deep copy. */
int topo_model_dup(const struct topo_model *m, struct topo_model **out);

/* The link from device a to device b. */
static inline struct topo_link *topo_model_link(const struct topo_model *m, unsigned a, unsigned b)
{
	return &m->links[(size_t)a * m->ndev + b];
}

/* Sets the link between a and b, in both directions. */
void topo_model_set_link(struct topo_model *m, unsigned a, unsigned b, const struct topo_link *l);

/* The host engine's model: n emulated devices, every pair linked by
 * TOPO_LINK_HOST with the same bandwidth and latency. */
int topo_model_host(unsigned n, struct topo_model **out);

/* A model of n devices all linked alike (used when detection fails: the
 * daemon still serves, with algorithms chosen as for a uniform node). */
int topo_model_uniform(unsigned n, enum topo_link_type type, double bw_gbps, double lat_us, struct topo_model **out);

/* Names as used in model files ("nvlink", "pix", ...), and back (-1 when
 * unknown). */
const char *topo_link_type_name(enum topo_link_type t);
int topo_link_type_parse(const char *name);

/* The link's label in a link matrix, as nvidia-smi prints it: "X", "NV2",
 * "NVS", "PIX", "PXB", "PHB", "NODE", "SYS", "HOST". */
void topo_link_label(const struct topo_link *l, char *buf, size_t len);

/* Whether the link is an NVLink path (direct or through NVSwitch). */
static inline int topo_link_is_nvlink(const struct topo_link *l)
{
	return l->type == TOPO_LINK_NVLINK || l->type == TOPO_LINK_NVSWITCH;
}

/* Bandwidth at which device dev receives equal shares from the devices
 * peers[0..npeers) all at once (for direct algorithms; a device may appear
 * several times, for several ranks on it). Direct NVLinks are separate
 * wires; every other path (the NVSwitch port, the PCIe slot and host
 * memory) is one shared port. */
double topo_model_inbound_gbps(const struct topo_model *m, unsigned dev, const unsigned *peers, unsigned npeers);

/* Bandwidth between two ranks placed on devices a and b (a == b: the
 * device's own memory, TOPO_SELF_GBPS). */
#define TOPO_SELF_GBPS 1000.0
#define TOPO_SELF_LAT_US 0.1
double topo_model_pair_gbps(const struct topo_model *m, unsigned a, unsigned b);

/* The nranks x nranks bandwidth matrix of a communicator whose rank r runs
 * on device rank_dev[r] (the input of the ring and tree searches). Returns
 * 0, or -EINVAL when a device is outside the model or nranks is 0 or above
 * TOPO_MAX_RANKS. */
int topo_model_rank_gbps(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks, double *w);

#endif /* DFCCL_TOPO_MODEL_H */
