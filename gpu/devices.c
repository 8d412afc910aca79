/*
 * See devices.h. The CUDA calls live in cuda/cuda_probe.cu, compiled only
 * when a toolkit was found; this file holds what every build has.
 */
#include "devices.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef DFCCL_HAVE_CUDA
int cuda_probe_print(FILE *f);
int cuda_open_device(int index, char *name, size_t namelen, char *pci, size_t pcilen, char *err, size_t errlen);
#endif

void devices_host(struct device_desc *out, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		snprintf(out[i].name, sizeof(out[i].name), "host-emulated device %u", i);
		out[i].pci_bus_id[0] = '\0';
	}
}

/* Sets out[i]'s bus id from the i-th of list's ids; the number of ids, or
 * -EINVAL (with err) for an empty or overlong one. */
static int host_bus_ids_set(struct device_desc *out, unsigned n, const char *list, char *err, size_t errlen)
{
	unsigned i = 0;
	for (const char *p = list;; i++) {
		size_t len = strcspn(p, ",");
		if (len == 0 || len >= sizeof(out[0].pci_bus_id)) {
			snprintf(err, errlen, "host-pci-bus-ids: bus id %u is %s", i, len ? "too long" : "empty");
			return -EINVAL;
		}
		if (i < n)
			snprintf(out[i].pci_bus_id, sizeof(out[i].pci_bus_id), "%.*s", (int)len, p);
		if (!p[len])
			return (int)i + 1;
		p += len + 1;
	}
}

int devices_host_bus_ids(struct device_desc *out, unsigned n, const char *list, char *err, size_t errlen)
{
	if (!list[0])
		return 0;
	int got = host_bus_ids_set(out, n, list, err, errlen);
	if (got >= 0 && (unsigned)got != n) {
		snprintf(err, errlen, "host-pci-bus-ids names %d bus id%s for %u emulated device%s (one each, or none)", got,
		         got == 1 ? "" : "s", n, n == 1 ? "" : "s");
		got = -EINVAL;
	}
	if (got < 0)
		for (unsigned k = 0; k < n; k++)
			out[k].pci_bus_id[0] = '\0';
	return got < 0 ? got : 0;
}

int devices_mps_active(void)
{
	/* The MPS control daemon listens in its pipe directory: the one the
	 * environment names, or the documented default. */
	const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
	char path[512];
	snprintf(path, sizeof(path), "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
	struct stat st;
	return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

int devices_probe_print(FILE *f)
{
#ifdef DFCCL_HAVE_CUDA
	return cuda_probe_print(f);
#else
	fprintf(f, "gpus 0 mps 0\n# dfccld was built without CUDA\n");
	return 0;
#endif
}

int devices_parse_probe(const char *text, struct device_desc *out, unsigned max, int *mps_active)
{
	int ngpus = -1, mps = 0, seen = 0;
	const char *p = text;
	while (p && *p) {
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		char line[256];
		if (len >= sizeof(line))
			len = sizeof(line) - 1;
		memcpy(line, p, len);
		line[len] = '\0';
		p = eol ? eol + 1 : NULL;
		if (line[0] == '#' || line[0] == '\0')
			continue;
		if (ngpus < 0) {
			if (sscanf(line, "gpus %d mps %d", &ngpus, &mps) != 2 || ngpus < 0)
				return -EBADMSG;
			continue;
		}
		unsigned idx;
		char pci[32];
		int consumed = 0;
		if (sscanf(line, "gpu %u %31s %n", &idx, pci, &consumed) < 2 || consumed == 0)
			return -EBADMSG;
		if (idx >= max || (int)idx >= ngpus)
			continue;
		snprintf(out[idx].pci_bus_id, sizeof(out[idx].pci_bus_id), "%s", pci);
		snprintf(out[idx].name, sizeof(out[idx].name), "%s", line + consumed);
		seen++;
	}
	if (ngpus < 0 || seen != ngpus)
		return -EBADMSG;
	*mps_active = mps;
	return ngpus;
}

int devices_open_cuda(int index, struct device_desc *d, char *err, size_t errlen)
{
#ifdef DFCCL_HAVE_CUDA
	return cuda_open_device(index, d->name, sizeof(d->name), d->pci_bus_id, sizeof(d->pci_bus_id), err, errlen);
#else
	snprintf(err, errlen, "dfccld was built without CUDA; use --engine host");
	return -ENOTSUP;
#endif
}
