/*
 * PCI bus ids, as the contracts carry them (DeviceInfo.pci_bus_id, the
 * topology model's devices) and as the tools that report them write them.
 *
 * Model. The same GPU has one bus id, written several ways: the CUDA driver
 * and sysfs give a four-digit domain ("0000:1B:00.0", upper or lower case),
 * NVML an eight-digit one ("00000000:1b:00.0"), and some tools none at all
 * ("1b:00.0"). Every comparison of bus ids goes through the normal form
 * here, "dddd:bb:dd.f" in lower case, so that whoever wrote an id, two
 * names of one device compare equal.
 */
#ifndef DFCCL_PCI_ID_H
#define DFCCL_PCI_ID_H

#include <stdbool.h>
#include <stddef.h>

/* Room for a normalised bus id and its NUL, with slack for odd input. */
#define PCI_ID_MAX 32

/* Writes the normal form of bus id `in` into out (len bytes): the domain
 * cut or padded to four digits (0000 when missing), all in lower case. */
void pci_id_normalize(const char *in, char *out, size_t len);

/* Whether a and b name the same device; an empty id names none. */
bool pci_id_equal(const char *a, const char *b);

#endif /* DFCCL_PCI_ID_H */
