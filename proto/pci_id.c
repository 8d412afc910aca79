/*
 * See pci_id.h.
 */
#include "pci_id.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

void pci_id_normalize(const char *in, char *out, size_t len)
{
	const char *colon = strchr(in, ':');
	const char *rest = in;
	char dom[16] = "0000";
	/* Two colons: the first ends the domain, whose last four digits are
	 * kept (NVML pads to eight). One colon: bus:device.function only. */
	if (colon && strchr(colon + 1, ':')) {
		size_t dl = (size_t)(colon - in);
		const char *d = dl > 4 ? colon - 4 : in;
		snprintf(dom, sizeof(dom), "%.*s", (int)(colon - d), d);
		rest = colon + 1;
	}
	snprintf(out, len, "%s:%s", dom, rest);
	for (char *p = out; *p; p++)
		*p = (char)tolower((unsigned char)*p);
}

bool pci_id_equal(const char *a, const char *b)
{
	if (!a[0] || !b[0])
		return false;
	char na[PCI_ID_MAX], nb[PCI_ID_MAX];
	pci_id_normalize(a, na, sizeof(na));
	pci_id_normalize(b, nb, sizeof(nb));
	return strcmp(na, nb) == 0;
}
