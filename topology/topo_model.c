/*
 * See topo_model.h. The model is plain data: two heap arrays (devices and
 * the ndev x ndev link matrix) so that 64-device models cost nothing when a
 * node has two GPUs.
 */
#include "topo_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The host engine copies through shared memory: one memcpy per hop. */
#define HOST_LINK_GBPS 10.0
#define HOST_LINK_LAT_US 2.0

static const char *const type_names[TOPO_LINK_TYPE_COUNT_] = {
    [TOPO_LINK_SELF] = "self", [TOPO_LINK_NVLINK] = "nvlink", [TOPO_LINK_NVSWITCH] = "nvswitch",
    [TOPO_LINK_PIX] = "pix",   [TOPO_LINK_PXB] = "pxb",       [TOPO_LINK_PHB] = "phb",
    [TOPO_LINK_NODE] = "node", [TOPO_LINK_SYS] = "sys",       [TOPO_LINK_HOST] = "host",
};

int topo_model_new(unsigned ndev, struct topo_model **out)
{
	*out = NULL;
	if (ndev == 0 || ndev > TOPO_MAX_DEVICES)
		return -EINVAL;
	struct topo_model *m = calloc(1, sizeof(*m));
	if (!m)
		goto fail;
	m->ndev = ndev;
	m->dev = calloc(ndev, sizeof(*m->dev));
	if (!m->dev)
		goto fail_model;
	m->links = calloc((size_t)ndev * ndev, sizeof(*m->links));
	if (!m->links)
		goto fail_dev;
	for (unsigned i = 0; i < ndev; i++) {
		m->dev[i].numa_node = -1;
		for (unsigned j = 0; j < ndev; j++) {
			struct topo_link *l = topo_model_link(m, i, j);
			l->type = i == j ? TOPO_LINK_SELF : TOPO_LINK_SYS;
			if (i == j) {
				l->bw_gbps = TOPO_SELF_GBPS;
				l->lat_us = TOPO_SELF_LAT_US;
			}
		}
	}
	*out = m;
	return 0;

fail_dev:
	free(m->dev);
fail_model:
	free(m);
fail:
	return -ENOMEM;
}

void topo_model_free(struct topo_model *m)
{
	if (!m)
		return;
	free(m->links);
	free(m->dev);
	free(m);
}

int topo_model_dup(const struct topo_model *m, struct topo_model **out)
{
	struct topo_model *c;
	int rc = topo_model_new(m->ndev, &c);
	if (rc < 0)
		return rc;
	struct topo_device *dev = c->dev;
	struct topo_link *links = c->links;
	*c = *m;
	c->dev = dev;
	c->links = links;
	memcpy(c->dev, m->dev, m->ndev * sizeof(*m->dev));
	memcpy(c->links, m->links, (size_t)m->ndev * m->ndev * sizeof(*m->links));
	*out = c;
	return 0;
}

void topo_model_set_link(struct topo_model *m, unsigned a, unsigned b, const struct topo_link *l)
{
	*topo_model_link(m, a, b) = *l;
	*topo_model_link(m, b, a) = *l;
}

int topo_model_uniform(unsigned n, enum topo_link_type type, double bw_gbps, double lat_us, struct topo_model **out)
{
	int rc = topo_model_new(n, out);
	if (rc < 0)
		return rc;
	struct topo_link l = {.type = type, .bw_gbps = bw_gbps, .lat_us = lat_us};
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = i + 1; j < n; j++)
			topo_model_set_link(*out, i, j, &l);
	return 0;
}

int topo_model_host(unsigned n, struct topo_model **out)
{
	int rc = topo_model_uniform(n, TOPO_LINK_HOST, HOST_LINK_GBPS, HOST_LINK_LAT_US, out);
	if (rc < 0)
		return rc;
	snprintf((*out)->name, sizeof((*out)->name), "host-engine-%u", n);
	for (unsigned i = 0; i < n; i++)
		snprintf((*out)->dev[i].name, sizeof((*out)->dev[i].name), "host-emulated device %u", i);
	return 0;
}

const char *topo_link_type_name(enum topo_link_type t)
{
	return (unsigned)t < TOPO_LINK_TYPE_COUNT_ ? type_names[t] : "unknown";
}

int topo_link_type_parse(const char *name)
{
	for (int t = 0; t < TOPO_LINK_TYPE_COUNT_; t++)
		if (strcmp(type_names[t], name) == 0)
			return t;
	return -1;
}

void topo_link_label(const struct topo_link *l, char *buf, size_t len)
{
	switch (l->type) {
	case TOPO_LINK_SELF: snprintf(buf, len, "X"); break;
	case TOPO_LINK_NVLINK: snprintf(buf, len, "NV%u", l->nvlinks); break;
	case TOPO_LINK_NVSWITCH: snprintf(buf, len, "NVS"); break;
	default: {
		/* The upper-case file name is the nvidia-smi label. */
		const char *n = topo_link_type_name(l->type);
		size_t i;
		for (i = 0; n[i] && i + 1 < len; i++)
			buf[i] = (char)(n[i] - 'a' + 'A');
		if (len)
			buf[i] = '\0';
	}
	}
}

double topo_model_pair_gbps(const struct topo_model *m, unsigned a, unsigned b)
{
	return a == b ? TOPO_SELF_GBPS : topo_model_link(m, a, b)->bw_gbps;
}

double topo_model_inbound_gbps(const struct topo_model *m, unsigned dev, const unsigned *peers, unsigned npeers)
{
	/* Each peer sends the same amount X. A device's own NVLinks carry
	 * their peer's share alone (twice for two ranks on that peer); every
	 * other path shares one port -- the NVSwitch port, or the PCIe slot and
	 * host memory -- which moves all its peers' shares at its best rate,
	 * and no share arrives faster than its own path allows. The slowest
	 * group sets the time t (per X); the rate is npeers X / t. */
	unsigned count[TOPO_MAX_DEVICES] = {0};
	unsigned nswitch = 0, nport = 0;
	double t = 0, switch_bw = 0, port_bw = 0;
	if (npeers == 0)
		return TOPO_SELF_GBPS;
	for (unsigned i = 0; i < npeers; i++)
		count[peers[i]]++;
	for (unsigned d = 0; d < m->ndev; d++) {
		if (!count[d])
			continue;
		const struct topo_link *l = topo_model_link(m, dev, d);
		double bw = topo_model_pair_gbps(m, dev, d);
		if (d == dev || l->type == TOPO_LINK_NVLINK) {
			t = fmax(t, count[d] / bw);
			continue;
		}
		t = fmax(t, 1.0 / bw);
		if (l->type == TOPO_LINK_NVSWITCH) {
			nswitch += count[d];
			switch_bw = fmax(switch_bw, bw);
		} else {
			nport += count[d];
			port_bw = fmax(port_bw, bw);
		}
	}
	if (nswitch)
		t = fmax(t, nswitch / switch_bw);
	if (nport)
		t = fmax(t, nport / port_bw);
	return npeers / t;
}

int topo_model_rank_gbps(const struct topo_model *m, const unsigned *rank_dev, unsigned nranks, double *w)
{
	if (nranks == 0 || nranks > TOPO_MAX_RANKS)
		return -EINVAL;
	for (unsigned r = 0; r < nranks; r++)
		if (rank_dev[r] >= m->ndev)
			return -EINVAL;
	for (unsigned a = 0; a < nranks; a++)
		for (unsigned b = 0; b < nranks; b++)
			w[(size_t)a * nranks + b] = a == b ? 0 : topo_model_pair_gbps(m, rank_dev[a], rank_dev[b]);
	return 0;
}
