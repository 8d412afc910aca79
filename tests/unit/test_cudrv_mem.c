/*
 * Unit tests of libdfccl's GPU buffers: cudrv (client/lib/cudrv.c) and the
 * implicit registration of GPU allocations in mem_translate
 * (client/lib/mem.c), on machines without a GPU.
 *
 * The CUDA driver is a fake installed with cudrv_set_ops_for_test: a table
 * of made-up allocations (addresses that are never dereferenced) that the
 * test allocates and frees, counting the calls made on it, and VMM
 * allocations whose exported descriptors are memfds holding the id of the
 * physical allocation they stand for. The daemon is a fake too: a thread
 * of this test that listens on a Unix socket, answers Hello with the
 * engine the test chose, records every RegisterMem and DeregisterMem it is
 * sent, and answers AllocMem with such a descriptor; it can answer late,
 * refuse, send a malformed reply, or hang up.
 *
 * Covered: no driver at all behaves as before; an allocation is registered
 * once, whole, with its IPC handle, and later translations hit the cache
 * with one driver call each; an address freed and allocated again (a new
 * buffer id) replaces the old registration; ranges that straddle an
 * allocation's end and memory dfccld cannot map (pools, managed memory) are
 * refused; driver and daemon failures leave nothing behind; a thread
 * without a CUDA context borrows the primary one and is left as it was;
 * threads that translate a new allocation at once register it once; a lost
 * session's entries are not reused; the host engine never asks the driver;
 * dfcclMemAlloc memory works as before on the host engine, and
 * dfcclMemAllocHost gives host memory on the CUDA engine too; dfcclMemFree
 * refuses GPU memory.
 *
 * VMM allocations: one is exported as a descriptor of exactly the
 * allocation mapped there (and every handle taken for it released), also
 * from a thread without a context; one not created exportable is refused
 * with a sentence that says so, before the driver is asked; a mapping is
 * registered whole, by its descriptor, once, and the client keeps no
 * descriptor; another physical allocation mapped at the same address is
 * told apart by its block id even where the buffer id stays; the
 * importing side (the library's and the CUDA worker's) rounds a range up
 * to the granularity, opens it to the device, refuses a range past the
 * allocation's end and undoes everything when a step fails; an allocation
 * is created and exported. dfcclMemAlloc on the CUDA engine asks the
 * daemon for device memory and maps the descriptor it hands over,
 * translates it with neither the driver nor a registration, and on
 * dfcclMemFree deregisters and unmaps; a refusal, a malformed reply, a
 * mapping that fails and a process without a usable driver each leave
 * nothing mapped, retained or registered.
 * When the build has cuda.h, the driver declarations of cudrv.h are
 * compared with it (cudrv_cuda_h.c).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "client.h"
#include "comm.h"
#include "cudrv.h"
#include "cudrv_cuda_h.h"
#include "dfccl.h"
#include "frame.h"
#include "mem.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

/* ---------------------------------------------------------------- the fake driver */

struct CUctx_st {
	int device;
};

/* How a made-up device allocation was made. */
enum fake_kind {
	FK_LEGACY,      /* cudaMalloc */
	FK_VMM,         /* cuMemCreate exportable as a POSIX fd, mapped with cuMemMap */
	FK_VMM_PRIVATE, /* cuMemCreate without an exportable handle type */
	FK_POOL,        /* cudaMallocAsync */
	FK_MANAGED,     /* cudaMallocManaged */
};

/* Allocation granularity of the fake VMM allocations. */
#define FAKE_GRAN ((size_t)64 << 10)

/* A physical allocation (cuMemCreate, or one the fake daemon made). Its
 * handle is its id plus FAKE_HANDLE_BASE. */
struct fake_block {
	uint64_t id;
	size_t size;
	int device;
	bool exportable;
};
#define FAKE_HANDLE_BASE 0x10000ull

/* An address range the fake driver answers pointer queries for. */
struct fake_gpu_alloc {
	uintptr_t base;
	size_t size;
	int device;
	uint64_t buffer_id;
	uint64_t block_id;
	enum fake_kind kind;
	bool live;
};

static struct {
	pthread_mutex_t lock;
	struct fake_gpu_alloc a[64];
	unsigned n;
	struct fake_block blocks[64];
	unsigned nblocks;
	uint64_t next_buffer_id, next_block_id;
	uintptr_t next_va;     /* of cuMemAddressReserve */
	unsigned attr_calls;   /* cuPointerGetAttributes */
	unsigned attr_asked;   /* the attributes its last call asked for */
	unsigned ipc_calls;    /* cuIpcGetMemHandle */
	unsigned retain_calls; /* cuMemRetainAllocationHandle */
	unsigned inits;        /* cuInit */
	bool need_ctx;         /* cuIpcGetMemHandle and cuMemMap want a current context */
	int retained;          /* primary contexts retained and not released */
	int handle_refs;       /* allocation handles retained, imported or created, not released */
	int reserved;          /* address ranges reserved and not freed */
	int mapped;            /* mappings made and not unmapped */
	int access_device;     /* the device of the last cuMemSetAccess */
	CUresult attr_fails;   /* cuPointerGetAttributes answers this */
	CUresult ipc_fails;    /* cuIpcGetMemHandle answers this */
	CUresult retain_fails, export_fails, map_fails, init_fails; /* likewise */
	struct CUctx_st ctx[8];
	int visible;           /* GPUs cuDeviceGetCount reports (after cuInit) */
	const char *bus_id[8]; /* cuDeviceGetPCIBusId's answer for each of them */
} fk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread CUcontext fk_current;

static void fake_reset(void)
{
	pthread_mutex_lock(&fk.lock);
	fk.n = fk.nblocks = 0;
	fk.attr_calls = fk.ipc_calls = fk.retain_calls = fk.inits = 0;
	fk.need_ctx = false;
	fk.retained = fk.handle_refs = fk.reserved = fk.mapped = 0;
	fk.access_device = -1;
	fk.attr_fails = fk.ipc_fails = fk.retain_fails = fk.export_fails = fk.map_fails = fk.init_fails = CUDA_SUCCESS;
	fk.next_va = (uintptr_t)0x500000000000ull;
	fk.visible = 0;
	for (int i = 0; i < 8; i++)
		fk.ctx[i].device = i;
	pthread_mutex_unlock(&fk.lock);
	fk_current = NULL;
}

/* A new physical allocation; called with fk.lock held. */
static uint64_t fake_block_add(size_t size, int device, bool exportable)
{
	assert_true(fk.nblocks < 64);
	uint64_t id = ++fk.next_block_id;
	fk.blocks[fk.nblocks++] = (struct fake_block){id, size, device, exportable};
	return id;
}

/* Called with fk.lock held. */
static const struct fake_block *fake_block_of(uint64_t id)
{
	for (unsigned i = 0; i < fk.nblocks; i++)
		if (fk.blocks[i].id == id)
			return &fk.blocks[i];
	return NULL;
}

/* Makes [base, base + size) device memory of `kind` on device; returns its
 * buffer id. Called with fk.lock held. */
static uint64_t fake_map_locked(uintptr_t base, size_t size, int device, enum fake_kind kind, uint64_t block)
{
	assert_true(fk.n < 64);
	uint64_t id = ++fk.next_buffer_id;
	fk.a[fk.n++] = (struct fake_gpu_alloc){base, size, device, id, block, kind, true};
	return id;
}

/* Allocates [base, base + size) on device; returns its buffer id. */
static uint64_t fake_malloc(uintptr_t base, size_t size, int device, enum fake_kind kind)
{
	pthread_mutex_lock(&fk.lock);
	uint64_t block = fake_block_add(size, device, kind == FK_VMM);
	uint64_t id = fake_map_locked(base, size, device, kind, block);
	pthread_mutex_unlock(&fk.lock);
	return id;
}

static void fake_free(uintptr_t base)
{
	pthread_mutex_lock(&fk.lock);
	for (unsigned i = 0; i < fk.n; i++)
		if (fk.a[i].live && fk.a[i].base == base)
			fk.a[i].live = false;
	pthread_mutex_unlock(&fk.lock);
}

/* The VMM mapping at base now maps another physical allocation of the
 * same size, the driver keeping its buffer id (an application that unmaps
 * and maps again inside one reservation). Returns the new block id. */
static uint64_t fake_remap(uintptr_t base)
{
	pthread_mutex_lock(&fk.lock);
	uint64_t block = 0;
	for (unsigned i = 0; i < fk.n; i++)
		if (fk.a[i].live && fk.a[i].base == base) {
			block = fake_block_add(fk.a[i].size, fk.a[i].device, true);
			fk.a[i].block_id = block;
		}
	pthread_mutex_unlock(&fk.lock);
	assert_true(block != 0);
	return block;
}

/* The physical allocation a fake daemon makes for AllocMem. */
static uint64_t fake_daemon_block(size_t size, int device)
{
	pthread_mutex_lock(&fk.lock);
	uint64_t id = fake_block_add(size, device, true);
	pthread_mutex_unlock(&fk.lock);
	return id;
}

static unsigned fake_attr_calls(void)
{
	pthread_mutex_lock(&fk.lock);
	unsigned n = fk.attr_calls;
	pthread_mutex_unlock(&fk.lock);
	return n;
}

static unsigned fake_attr_asked(void)
{
	pthread_mutex_lock(&fk.lock);
	unsigned n = fk.attr_asked;
	pthread_mutex_unlock(&fk.lock);
	return n;
}

/* Nothing the fake driver handed out is still held. */
static void fake_all_released(void)
{
	pthread_mutex_lock(&fk.lock);
	int refs = fk.handle_refs, reserved = fk.reserved, mapped = fk.mapped, retained = fk.retained;
	pthread_mutex_unlock(&fk.lock);
	assert_int_equal(refs, 0);
	assert_int_equal(reserved, 0);
	assert_int_equal(mapped, 0);
	assert_int_equal(retained, 0);
}

/* Called with fk.lock held. */
static const struct fake_gpu_alloc *fake_find(uintptr_t p)
{
	for (unsigned i = 0; i < fk.n; i++)
		if (fk.a[i].live && p >= fk.a[i].base && p - fk.a[i].base < fk.a[i].size)
			return &fk.a[i];
	return NULL;
}

/* The handle the fake driver exports for an allocation. */
static void fake_handle(uint64_t buffer_id, int device, uint8_t out[64])
{
	memset(out, 0xa5, 64);
	memcpy(out, "FAKEIPC", 7);
	memcpy(out + 8, &buffer_id, sizeof(buffer_id));
	out[16] = (uint8_t)device;
}

/* An exported allocation: a memfd holding its block id. */
static int fake_export_fd(uint64_t block)
{
	int fd = memfd_create("fake-vmm-export", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, &block, sizeof(block), 0), sizeof(block));
	return fd;
}

/* The block id an exported descriptor stands for, or 0. */
static uint64_t fake_fd_block(int fd)
{
	uint64_t block = 0;
	if (pread(fd, &block, sizeof(block), 0) != sizeof(block))
		return 0;
	return block;
}

static CUresult fake_get_attributes(unsigned n, CUpointer_attribute *attrs, void **data, CUdeviceptr p)
{
	pthread_mutex_lock(&fk.lock);
	fk.attr_calls++;
	fk.attr_asked = n;
	CUresult r = fk.attr_fails;
	const struct fake_gpu_alloc *a = fake_find((uintptr_t)p);
	const struct fake_block *b = a ? fake_block_of(a->block_id) : NULL;
	/* The widths the driver documents, so a reader that assumed wider
	 * slots than it zeroed would be caught. */
	for (unsigned i = 0; r == CUDA_SUCCESS && i < n; i++) {
		switch (attrs[i]) {
		case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data[i] = a ? CU_MEMORYTYPE_DEVICE : 0; break;
		case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[i] = a ? a->device : 0; break;
		case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data[i] = a ? a->buffer_id : 0; break;
		case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(CUdeviceptr *)data[i] = a ? a->base : 0; break;
		case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data[i] = a ? a->size : 0; break;
		case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data[i] = a && a->kind == FK_LEGACY; break;
		case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned *)data[i] = a && a->kind == FK_MANAGED; break;
		case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
			*(void **)data[i] = a && a->kind == FK_POOL ? (void *)&fk : NULL;
			break;
		case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long *)data[i] = a ? a->block_id : 0; break;
		case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
			*(unsigned long long *)data[i] = b && b->exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
			break;
		default: r = CUDA_ERROR_INVALID_VALUE; break;
		}
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_ipc_get_mem_handle(CUipcMemHandle *h, CUdeviceptr base)
{
	pthread_mutex_lock(&fk.lock);
	fk.ipc_calls++;
	CUresult r = fk.ipc_fails;
	const struct fake_gpu_alloc *a = fake_find((uintptr_t)base);
	if (r == CUDA_SUCCESS && fk.need_ctx && (!fk_current || !a || fk_current->device != a->device))
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (r == CUDA_SUCCESS && (!a || a->base != (uintptr_t)base || a->kind != FK_LEGACY))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		fake_handle(a->buffer_id, a->device, (uint8_t *)h->reserved);
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_device_get(CUdevice *dev, int ordinal)
{
	if (ordinal < 0 || ordinal >= 8)
		return CUDA_ERROR_INVALID_VALUE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

/* Adds delta to one of the fake driver's counters; CUDA_SUCCESS. */
static CUresult fake_count(int *counter, int delta)
{
	pthread_mutex_lock(&fk.lock);
	*counter += delta;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

static CUresult fake_primary_ctx_retain(CUcontext *ctx, CUdevice dev)
{
	*ctx = &fk.ctx[dev];
	return fake_count(&fk.retained, 1);
}

static CUresult fake_primary_ctx_release(CUdevice dev)
{
	return fake_count(&fk.retained, -1);
}

static CUresult fake_ctx_get_current(CUcontext *ctx)
{
	*ctx = fk_current;
	return CUDA_SUCCESS;
}

static CUresult fake_ctx_set_current(CUcontext ctx)
{
	fk_current = ctx;
	return CUDA_SUCCESS;
}

static CUresult fake_get_error_name(CUresult r, const char **name)
{
	*name = r == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
	        : r == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
	                                        : "CUDA_ERROR_FAKE";
	return CUDA_SUCCESS;
}

static CUresult fake_init(unsigned flags)
{
	pthread_mutex_lock(&fk.lock);
	fk.inits++;
	CUresult r = flags ? CUDA_ERROR_INVALID_VALUE : fk.init_fails;
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_device_get_count(int *count)
{
	pthread_mutex_lock(&fk.lock);
	CUresult r = fk.inits ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
	*count = fk.visible;
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_device_get_pci_bus_id(char *bus_id, int len, CUdevice dev)
{
	pthread_mutex_lock(&fk.lock);
	CUresult r = dev >= 0 && dev < fk.visible && len > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		snprintf(bus_id, (size_t)len, "%s", fk.bus_id[dev]);
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_retain_allocation_handle(CUmemGenericAllocationHandle *h, void *addr)
{
	pthread_mutex_lock(&fk.lock);
	fk.retain_calls++;
	CUresult r = fk.retain_fails;
	const struct fake_gpu_alloc *a = fake_find((uintptr_t)addr);
	if (r == CUDA_SUCCESS && fk.need_ctx && !fk_current)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (r == CUDA_SUCCESS && (!a || (a->kind != FK_VMM && a->kind != FK_VMM_PRIVATE)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		*h = FAKE_HANDLE_BASE + a->block_id;
		fk.handle_refs++;
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_export(void *shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                            unsigned long long flags)
{
	pthread_mutex_lock(&fk.lock);
	CUresult r = fk.export_fails;
	const struct fake_block *b = h > FAKE_HANDLE_BASE ? fake_block_of(h - FAKE_HANDLE_BASE) : NULL;
	if (r == CUDA_SUCCESS && (!b || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS && !b->exportable)
		r = CUDA_ERROR_NOT_PERMITTED;
	if (r == CUDA_SUCCESS)
		*(int *)shareable = fake_export_fd(b->id);
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_import(CUmemGenericAllocationHandle *h, void *os_handle, CUmemAllocationHandleType type)
{
	uint64_t id = fake_fd_block((int)(uintptr_t)os_handle);
	pthread_mutex_lock(&fk.lock);
	CUresult r = type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && fake_block_of(id) ? CUDA_SUCCESS
	                                                                                     : CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		*h = FAKE_HANDLE_BASE + id;
		fk.handle_refs++;
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_properties(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
	pthread_mutex_lock(&fk.lock);
	const struct fake_block *b = h > FAKE_HANDLE_BASE ? fake_block_of(h - FAKE_HANDLE_BASE) : NULL;
	if (b) {
		memset(prop, 0, sizeof(*prop));
		prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop->location.id = b->device;
		prop->requestedHandleTypes = b->exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
	}
	pthread_mutex_unlock(&fk.lock);
	return b ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_granularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option)
{
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || option != CU_MEM_ALLOC_GRANULARITY_MINIMUM)
		return CUDA_ERROR_INVALID_VALUE;
	*g = FAKE_GRAN;
	return CUDA_SUCCESS;
}

static CUresult fake_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
	if (size == 0 || size % FAKE_GRAN || flags || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	uint64_t id = fake_block_add(size, prop->location.id,
	                             prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	*h = FAKE_HANDLE_BASE + id;
	fk.handle_refs++;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

static CUresult fake_release(CUmemGenericAllocationHandle h)
{
	return fake_count(&fk.handle_refs, -1);
}

static CUresult fake_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
	if (size == 0 || size % FAKE_GRAN || addr || flags || (align && align % FAKE_GRAN))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	*ptr = fk.next_va;
	fk.next_va += ((size >> 30) + 1) << 30;
	fk.reserved++;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

static CUresult fake_address_free(CUdeviceptr ptr, size_t size)
{
	return fake_count(&fk.reserved, -1);
}

static CUresult fake_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags)
{
	pthread_mutex_lock(&fk.lock);
	CUresult r = fk.map_fails;
	const struct fake_block *b = h > FAKE_HANDLE_BASE ? fake_block_of(h - FAKE_HANDLE_BASE) : NULL;
	if (r == CUDA_SUCCESS && fk.need_ctx && !fk_current)
		r = CUDA_ERROR_INVALID_CONTEXT;
	/* What the driver checks: the mapping lies inside the allocation. */
	else if (r == CUDA_SUCCESS && (!b || offset || flags || size % FAKE_GRAN || size > b->size))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		fake_map_locked((uintptr_t)ptr, size, b->device, FK_VMM, b->id);
		fk.mapped++;
	}
	pthread_mutex_unlock(&fk.lock);
	return r;
}

static CUresult fake_unmap(CUdeviceptr ptr, size_t size)
{
	pthread_mutex_lock(&fk.lock);
	for (unsigned i = 0; i < fk.n; i++)
		if (fk.a[i].live && fk.a[i].base == (uintptr_t)ptr && fk.a[i].size == size) {
			fk.a[i].live = false;
			fk.mapped--;
		}
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

static CUresult fake_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	if (count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fk.lock);
	fk.access_device = desc->location.id;
	pthread_mutex_unlock(&fk.lock);
	return CUDA_SUCCESS;
}

static const struct cudrv_ops fake_ops = {
    .pointer_get_attributes = fake_get_attributes,
    .ipc_get_mem_handle = fake_ipc_get_mem_handle,
    .device_get = fake_device_get,
    .primary_ctx_retain = fake_primary_ctx_retain,
    .primary_ctx_release = fake_primary_ctx_release,
    .ctx_get_current = fake_ctx_get_current,
    .ctx_set_current = fake_ctx_set_current,
    .get_error_name = fake_get_error_name,
    .init = fake_init,
    .mem_retain_allocation_handle = fake_retain_allocation_handle,
    .mem_export_to_shareable_handle = fake_export,
    .mem_import_from_shareable_handle = fake_import,
    .mem_get_allocation_properties_from_handle = fake_properties,
    .mem_get_allocation_granularity = fake_granularity,
    .mem_create = fake_create,
    .mem_release = fake_release,
    .mem_address_reserve = fake_reserve,
    .mem_address_free = fake_address_free,
    .mem_map = fake_map,
    .mem_unmap = fake_unmap,
    .mem_set_access = fake_set_access,
    .device_get_count = fake_device_get_count,
    .device_get_pci_bus_id = fake_device_get_pci_bus_id,
};

/* ---------------------------------------------------------------- the fake daemon */

#define FD_MAX_CONNS 4
#define FD_MAX_EVENTS 64

/* A RegisterMem, or an AllocMem (kind FAKE_ALLOC), the fake daemon got. */
struct fake_reg {
	uint64_t session;
	uint32_t reg_id;
	int kind;
	uint32_t device;
	uint64_t size, offset;
	uint8_t handle[64];
	size_t handle_len;
	uint64_t block;    /* VMM: the allocation its descriptor stands for; FAKE_ALLOC: the one it made */
	uint64_t map_size; /* FAKE_ALLOC: the allocation's size in its reply */
};
#define FAKE_ALLOC 100

/* How the fake daemon answers an AllocMem. */
enum fake_alloc_reply { FA_OK, FA_REFUSE, FA_NO_FD, FA_SMALL };

struct fake_daemon {
	char path[108];
	int lfd, wake;
	pthread_t thread;
	uint32_t engine;
	uint32_t ndevices;

	pthread_mutex_t lock; /* what follows */
	bool stop, hangup;
	int reply_delay_ms;   /* before answering a RegisterMem */
	bool refuse_next;     /* answer the next RegisterMem with NOT_SUPPORTED */
	enum fake_alloc_reply alloc_reply;
	uint64_t sessions;
	uint32_t next_reg;
	struct fake_reg regs[FD_MAX_EVENTS];
	unsigned nregs;
	uint32_t deregs[FD_MAX_EVENTS];
	unsigned nderegs;
	bool bus_ids;         /* its devices have PCI bus ids: device i at 0000:(0x10 + i):00.0 */
	bool mps_other_user;  /* MPS is active and device 0's worker runs as another user */
	unsigned nstatus;     /* status queries answered */
};

struct fake_conn {
	int fd;
	uint64_t session;
	struct frame_reader rd;
};

static void fd_reply(struct fake_conn *c, dfccl_envelope *env, uint64_t request_id)
{
	env->request_id = request_id;
	assert_int_equal(frame_send(c->fd, env, NULL, 0), 0);
}

static void fd_serve(struct fake_daemon *d, struct fake_conn *c, dfccl_envelope *req, int *fds, unsigned nfds)
{
	dfccl_envelope env = DFCCL__V1__ENVELOPE__INIT;
	switch (req->body_case) {
	case DFCCL__V1__ENVELOPE__BODY_HELLO: {
		Dfccl__V1__HelloReply h = DFCCL__V1__HELLO_REPLY__INIT;
		pthread_mutex_lock(&d->lock);
		c->session = ++d->sessions;
		pthread_mutex_unlock(&d->lock);
		h.version = DFCCL_PROTO_VERSION;
		h.daemon_version = "fake";
		h.session_id = c->session;
		h.engine = d->engine;
		h.ndevices = d->ndevices;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_HELLO_REPLY;
		env.hello_reply = &h;
		fd_reply(c, &env, req->request_id);
		break;
	}
	case DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM: {
		const Dfccl__V1__RegisterMem *m = req->register_mem;
		/* Host memory and VMM allocations come with their descriptor,
		 * legacy IPC memory without. */
		bool with_fd = m->kind == DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD ||
		               m->kind == DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD;
		assert_int_equal(nfds, with_fd ? 1 : 0);
		uint64_t block = m->kind == DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD ? fake_fd_block(fds[0]) : 0;
		/* Closed before answering, so a client that counts its
		 * descriptors after the reply sees them gone. */
		frame_close_fds(fds, nfds);
		nfds = 0;
		pthread_mutex_lock(&d->lock);
		int delay = d->reply_delay_ms;
		bool refuse = d->refuse_next;
		d->refuse_next = false;
		uint32_t reg_id = ++d->next_reg;
		assert_true(d->nregs < FD_MAX_EVENTS);
		struct fake_reg *r = &d->regs[d->nregs++];
		*r = (struct fake_reg){c->session, refuse ? 0 : reg_id, (int)m->kind, m->device, m->size, m->offset,
		                       {0}, m->ipc_handle.len, block, 0};
		if (m->ipc_handle.len <= 64 && m->ipc_handle.len)
			memcpy(r->handle, m->ipc_handle.data, m->ipc_handle.len);
		pthread_mutex_unlock(&d->lock);
		if (delay)
			usleep((useconds_t)delay * 1000);
		Dfccl__V1__RegisterReply rr = DFCCL__V1__REGISTER_REPLY__INIT;
		Dfccl__V1__ErrorReply er = DFCCL__V1__ERROR_REPLY__INIT;
		if (refuse) {
			er.code = DFCCL__V1__ERROR_CODE__ERROR_NOT_SUPPORTED;
			er.message = "the fake daemon refuses this buffer";
			env.body_case = DFCCL__V1__ENVELOPE__BODY_ERROR;
			env.error = &er;
		} else {
			rr.reg_id = reg_id;
			env.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY;
			env.register_reply = &rr;
		}
		fd_reply(c, &env, req->request_id);
		break;
	}
	case DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM: {
		const Dfccl__V1__AllocMem *m = req->alloc_mem;
		size_t map_size = (m->size + FAKE_GRAN - 1) / FAKE_GRAN * FAKE_GRAN;
		pthread_mutex_lock(&d->lock);
		enum fake_alloc_reply how = d->alloc_reply;
		uint32_t reg_id = ++d->next_reg;
		uint64_t block = how == FA_REFUSE ? 0 : fake_daemon_block(map_size, (int)m->device);
		assert_true(d->nregs < FD_MAX_EVENTS);
		d->regs[d->nregs++] = (struct fake_reg){c->session, reg_id, FAKE_ALLOC, m->device, m->size, 0, {0}, 0,
		                                        block, map_size};
		pthread_mutex_unlock(&d->lock);
		Dfccl__V1__AllocMemReply ar = DFCCL__V1__ALLOC_MEM_REPLY__INIT;
		Dfccl__V1__ErrorReply er = DFCCL__V1__ERROR_REPLY__INIT;
		if (how == FA_REFUSE) {
			er.code = DFCCL__V1__ERROR_CODE__ERROR_RESOURCE;
			er.message = "the fake daemon has no device memory";
			env.body_case = DFCCL__V1__ENVELOPE__BODY_ERROR;
			env.error = &er;
			fd_reply(c, &env, req->request_id);
			break;
		}
		ar.reg_id = reg_id;
		ar.size = m->size;
		ar.map_size = how == FA_SMALL ? m->size / 2 : map_size;
		ar.device = m->device;
		ar.nfds = 1;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM_REPLY;
		env.alloc_mem_reply = &ar;
		int fd = fake_export_fd(block);
		env.request_id = req->request_id;
		assert_int_equal(frame_send(c->fd, &env, &fd, how == FA_NO_FD ? 0 : 1), 0);
		close(fd);
		break;
	}
	case DFCCL__V1__ENVELOPE__BODY_QUERY: {
		/* A status query: the devices. */
		assert_int_equal(req->query->kind, DFCCL__V1__QUERY_KIND__QUERY_STATUS);
		assert_true(d->ndevices <= 8);
		Dfccl__V1__DeviceInfo dev[8], *devp[8];
		char bus[8][16];
		pthread_mutex_lock(&d->lock);
		bool with_ids = d->bus_ids, mps_other = d->mps_other_user;
		d->nstatus++;
		pthread_mutex_unlock(&d->lock);
		for (uint32_t i = 0; i < d->ndevices; i++) {
			dfccl__v1__device_info__init(&dev[i]);
			snprintf(bus[i], sizeof(bus[i]), "0000:%02x:00.0", 0x10 + i);
			dev[i].index = i;
			dev[i].pci_bus_id = with_ids ? bus[i] : "";
			dev[i].worker_up = true;
			dev[i].worker_uid = (uint32_t)geteuid() + (mps_other && i == 0);
			devp[i] = &dev[i];
		}
		Dfccl__V1__StatusInfo st = DFCCL__V1__STATUS_INFO__INIT;
		st.engine = d->engine;
		st.mps_active = mps_other;
		st.n_devices = d->ndevices;
		st.devices = devp;
		Dfccl__V1__QueryReply qr = DFCCL__V1__QUERY_REPLY__INIT;
		qr.kind = DFCCL__V1__QUERY_KIND__QUERY_STATUS;
		qr.status = &st;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_QUERY_REPLY;
		env.query_reply = &qr;
		fd_reply(c, &env, req->request_id);
		break;
	}
	case DFCCL__V1__ENVELOPE__BODY_DEREGISTER_MEM: {
		pthread_mutex_lock(&d->lock);
		assert_true(d->nderegs < FD_MAX_EVENTS);
		d->deregs[d->nderegs++] = req->deregister_mem->reg_id;
		pthread_mutex_unlock(&d->lock);
		Dfccl__V1__Ok ok = DFCCL__V1__OK__INIT;
		env.body_case = DFCCL__V1__ENVELOPE__BODY_OK;
		env.ok = &ok;
		fd_reply(c, &env, req->request_id);
		break;
	}
	default:
		fail_msg("the fake daemon got message %d", (int)req->body_case);
	}
	frame_close_fds(fds, nfds);
}

static void fd_conn_close(struct fake_conn *c)
{
	frame_reader_free(&c->rd);
	close(c->fd);
	c->fd = -1;
}

static void *fd_main(void *arg)
{
	struct fake_daemon *d = arg;
	struct fake_conn conns[FD_MAX_CONNS];
	for (int i = 0; i < FD_MAX_CONNS; i++)
		conns[i] = (struct fake_conn){.fd = -1, .rd = FRAME_READER_INIT};
	for (;;) {
		pthread_mutex_lock(&d->lock);
		bool stop = d->stop, hangup = d->hangup;
		d->hangup = false;
		pthread_mutex_unlock(&d->lock);
		if (stop || hangup)
			for (int i = 0; i < FD_MAX_CONNS; i++)
				if (conns[i].fd >= 0)
					fd_conn_close(&conns[i]);
		if (stop)
			break;
		struct pollfd pf[FD_MAX_CONNS + 2] = {{.fd = d->lfd, .events = POLLIN}, {.fd = d->wake, .events = POLLIN}};
		for (int i = 0; i < FD_MAX_CONNS; i++)
			pf[i + 2] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
		assert_true(poll(pf, FD_MAX_CONNS + 2, -1) > 0);
		if (pf[1].revents) {
			uint64_t v;
			assert_int_equal(read(d->wake, &v, sizeof(v)), sizeof(v));
		}
		if (pf[0].revents) {
			int fd = accept4(d->lfd, NULL, NULL, SOCK_CLOEXEC);
			int i = 0;
			while (i < FD_MAX_CONNS && conns[i].fd >= 0)
				i++;
			assert_true(fd >= 0 && i < FD_MAX_CONNS);
			conns[i].fd = fd;
		}
		for (int i = 0; i < FD_MAX_CONNS; i++) {
			if (conns[i].fd < 0 || !pf[i + 2].revents)
				continue;
			if (frame_reader_fill(&conns[i].rd, conns[i].fd) <= 0) {
				fd_conn_close(&conns[i]);
				continue;
			}
			dfccl_envelope *env;
			int fds[DFCCL_FRAME_MAX_FDS];
			unsigned nfds;
			while (frame_reader_next(&conns[i].rd, &env, fds, &nfds) == 1) {
				fd_serve(d, &conns[i], env, fds, nfds);
				frame_envelope_free(env);
			}
		}
	}
	return NULL;
}

static void fd_wake(struct fake_daemon *d)
{
	uint64_t one = 1;
	assert_int_equal(write(d->wake, &one, sizeof(one)), sizeof(one));
}

static struct fake_daemon *fd_start(uint32_t engine)
{
	static unsigned seq;
	struct fake_daemon *d = calloc(1, sizeof(*d));
	assert_non_null(d);
	pthread_mutex_init(&d->lock, NULL);
	d->engine = engine;
	d->ndevices = 8;
	snprintf(d->path, sizeof(d->path), "/tmp/dfccl-test-cudrv-%d-%u.sock", (int)getpid(), ++seq);
	unlink(d->path);
	d->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(d->lfd >= 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->path);
	assert_int_equal(bind(d->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(d->lfd, 8), 0);
	d->wake = eventfd(0, EFD_CLOEXEC);
	assert_true(d->wake >= 0);
	assert_int_equal(pthread_create(&d->thread, NULL, fd_main, d), 0);
	return d;
}

static void fd_stop(struct fake_daemon *d)
{
	pthread_mutex_lock(&d->lock);
	d->stop = true;
	pthread_mutex_unlock(&d->lock);
	fd_wake(d);
	pthread_join(d->thread, NULL);
	close(d->lfd);
	close(d->wake);
	unlink(d->path);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

/* Ends every session; returns once c has noticed. */
static void fd_hangup(struct fake_daemon *d, struct client *c)
{
	pthread_mutex_lock(&d->lock);
	d->hangup = true;
	pthread_mutex_unlock(&d->lock);
	fd_wake(d);
	for (int waited = 0; !client_lost(c); waited++) {
		assert_true(waited < 2000);
		usleep(1000);
	}
}

static unsigned fd_nregs(struct fake_daemon *d)
{
	pthread_mutex_lock(&d->lock);
	unsigned n = d->nregs;
	pthread_mutex_unlock(&d->lock);
	return n;
}

static unsigned fd_nderegs(struct fake_daemon *d)
{
	pthread_mutex_lock(&d->lock);
	unsigned n = d->nderegs;
	pthread_mutex_unlock(&d->lock);
	return n;
}

/* The i-th deregistration the daemon received. */
static uint32_t fd_dereg(struct fake_daemon *d, unsigned i)
{
	pthread_mutex_lock(&d->lock);
	assert_true(i < d->nderegs);
	uint32_t id = d->deregs[i];
	pthread_mutex_unlock(&d->lock);
	return id;
}

/* Answers RegisterMem after ms milliseconds; refuses the next one. */
static void fd_set_delay(struct fake_daemon *d, int ms)
{
	pthread_mutex_lock(&d->lock);
	d->reply_delay_ms = ms;
	pthread_mutex_unlock(&d->lock);
}

static void fd_refuse_next(struct fake_daemon *d)
{
	pthread_mutex_lock(&d->lock);
	d->refuse_next = true;
	pthread_mutex_unlock(&d->lock);
}

static void fd_set_alloc_reply(struct fake_daemon *d, enum fake_alloc_reply how)
{
	pthread_mutex_lock(&d->lock);
	d->alloc_reply = how;
	pthread_mutex_unlock(&d->lock);
}

/* The i-th registration the daemon received (a copy). */
static struct fake_reg fd_reg(struct fake_daemon *d, unsigned i)
{
	pthread_mutex_lock(&d->lock);
	assert_true(i < d->nregs);
	struct fake_reg r = d->regs[i];
	pthread_mutex_unlock(&d->lock);
	return r;
}

static struct client *fd_connect(struct fake_daemon *d)
{
	struct client *c;
	assert_int_equal(client_open(d->path, "test_cudrv_mem", &c), dfcclSuccess);
	return c;
}

/* ---------------------------------------------------------------- fixture */

struct fixture {
	struct fake_daemon *d;
	struct client *c;
	struct client *dflt; /* the process's default session, when the test uses it */
	int fds;             /* descriptors open when the test started */
};

static int setup_engine(void **state, uint32_t engine)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	if (!fx)
		return -1;
	fake_reset();
	cudrv_set_ops_for_test(&fake_ops);
	fx->d = fd_start(engine);
	fx->c = fd_connect(fx->d);
	fx->fds = tu_count_fds();
	*state = fx;
	return 0;
}

static int setup_cuda(void **state)
{
	return setup_engine(state, DFCCL__V1__ENGINE_KIND__ENGINE_CUDA);
}

static int setup_host(void **state)
{
	return setup_engine(state, DFCCL__V1__ENGINE_KIND__ENGINE_HOST);
}

/* Takes out of the process-wide table every entry this test left there:
 * with every fake allocation freed, a translation at each one's base drops
 * the entry found there. The entries hold their sessions, whose threads
 * would otherwise outlive the test. */
static void forget_gpu_entries(struct client *c)
{
	pthread_mutex_lock(&fk.lock);
	for (unsigned i = 0; i < fk.n; i++)
		fk.a[i].live = false;
	fk.attr_fails = fk.ipc_fails = CUDA_SUCCESS;
	unsigned n = fk.n;
	pthread_mutex_unlock(&fk.lock);
	for (unsigned i = 0; i < n; i++) {
		struct mem_ref ref;
		mem_translate(c, (void *)fk.a[i].base, 1, &ref);
	}
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	forget_gpu_entries(fx->c);
	fd_stop(fx->d);
	if (fx->dflt) {
		/* The next test's default session must be a new one. */
		for (int waited = 0; !client_lost(fx->dflt) && waited < 2000; waited++)
			usleep(1000);
		client_unref(fx->dflt);
		unsetenv("DFCCL_SOCKET");
	}
	client_unref(fx->c);
	cudrv_set_ops_for_test(NULL);
	free(fx);
	return 0;
}

/* Each test has its own stretch of made-up device addresses, so entries
 * one test leaves in the process-wide table never meet another's. */
static uintptr_t region(unsigned test)
{
	return (uintptr_t)0x300000000000ull + (uintptr_t)test * 0x100000000ull;
}

/* The process's default session (dfcclMemAlloc's), opened to this test's
 * fake daemon. */
static struct client *use_default_session(struct fixture *fx)
{
	setenv("DFCCL_SOCKET", fx->d->path, 1);
	assert_int_equal(client_default(&fx->dflt), dfcclSuccess);
	assert_int_equal(client_info(fx->dflt)->engine, fx->d->engine);
	return fx->dflt;
}

/* `want` descriptors are open in this process, within a moment: the fake
 * daemon may close its copies just after it replied. */
static void expect_fds(int want)
{
	int n = tu_count_fds();
	for (int waited = 0; n != want && waited < 2000; waited++) {
		usleep(1000);
		n = tu_count_fds();
	}
	assert_int_equal(n, want);
}

static void expect_error(dfcclResult_t r, dfcclResult_t want, const char *needle)
{
	assert_int_equal(r, want);
	if (!strstr(dfcclGetLastError(NULL), needle))
		fail_msg("error \"%s\" does not mention \"%s\"", dfcclGetLastError(NULL), needle);
}

/* ---------------------------------------------------------------- cudrv */

static void test_no_driver(void **state)
{
	/* The real driver: absent on CI machines, and where it is installed,
	 * not initialised by this process. Either way nothing is device memory. */
	cudrv_set_ops_for_test(NULL);
	int on_stack = 0;
	struct cudrv_ptr_info info;
	assert_int_equal(cudrv_pointer_info(&on_stack, &info), 0);
	void *heap = malloc(64);
	assert_int_equal(cudrv_pointer_info(heap, &info), 0);

	/* And mem_translate refuses unknown buffers as it always did, whatever
	 * engine the daemon runs, registering nothing. */
	struct fake_daemon *d = fd_start(DFCCL__V1__ENGINE_KIND__ENGINE_CUDA);
	struct client *c = fd_connect(d);
	struct mem_ref ref;
	expect_error(mem_translate(c, heap, 64, &ref), dfcclInvalidArgument,
	             "neither inside one dfcclMemAlloc allocation nor in GPU memory");
	assert_int_equal(fd_nregs(d), 0);
	fd_stop(d);
	client_unref(c);

	d = fd_start(DFCCL__V1__ENGINE_KIND__ENGINE_HOST);
	c = fd_connect(d);
	expect_error(mem_translate(c, heap, 64, &ref), dfcclInvalidArgument,
	             "host-engine buffers must come from dfcclMemAlloc (GPU buffers from cudaMalloc are accepted when "
	             "dfccld runs the CUDA engine)");
	assert_int_equal(fd_nregs(d), 0);
	fd_stop(d);
	client_unref(c);
	free(heap);
}

static void test_pointer_info(void **state)
{
	uintptr_t x = region(1);
	uint64_t id = fake_malloc(x, 4 * MiB, 3, FK_LEGACY);
	fake_malloc(x + 4 * MiB, MiB, 2, FK_POOL);
	struct cudrv_ptr_info info;

	assert_int_equal(cudrv_pointer_info((void *)(x + 12345), &info), 1);
	assert_int_equal(info.device, 3);
	assert_int_equal(info.base, x);
	assert_int_equal(info.size, 4 * MiB);
	assert_int_equal(info.buffer_id, id);
	assert_int_equal(info.kind, CUDRV_MEM_LEGACY);
	assert_int_equal(cudrv_pointer_info((void *)(x + 4 * MiB), &info), 1);
	assert_int_equal(info.kind, CUDRV_MEM_POOL);
	assert_int_equal(info.device, 2);
	assert_int_equal(cudrv_pointer_info((void *)(x + 5 * MiB), &info), 0);

	/* Managed memory; VMM mappings, exportable or not, each with the id of
	 * its physical allocation. */
	fake_malloc(x + 6 * MiB, MiB, 1, FK_MANAGED);
	assert_int_equal(cudrv_pointer_info((void *)(x + 6 * MiB + 1), &info), 1);
	assert_int_equal(info.kind, CUDRV_MEM_MANAGED);
	uint64_t vid = fake_malloc(x + 8 * MiB, 2 * MiB, 4, FK_VMM);
	fake_malloc(x + 10 * MiB, 2 * MiB, 4, FK_VMM_PRIVATE);
	assert_int_equal(cudrv_pointer_info((void *)(x + 9 * MiB), &info), 1);
	assert_int_equal(info.kind, CUDRV_MEM_VMM);
	assert_int_equal(info.base, x + 8 * MiB);
	assert_int_equal(info.size, 2 * MiB);
	assert_int_equal(info.device, 4);
	assert_int_equal(info.buffer_id, vid);
	assert_true(info.fd_exportable);
	uint64_t block = info.block_id;
	assert_true(block != 0);
	assert_int_equal(cudrv_pointer_info((void *)(x + 10 * MiB), &info), 1);
	assert_int_equal(info.kind, CUDRV_MEM_VMM);
	assert_false(info.fd_exportable);
	assert_int_not_equal(info.block_id, block);

	uint8_t h[64], want[64];
	assert_int_equal(cudrv_pointer_info((void *)x, &info), 1);
	assert_int_equal(cudrv_ipc_handle(&info, h), 0);
	fake_handle(id, 3, want);
	assert_memory_equal(h, want, 64);

	/* Failures: an errno, with the driver's words kept for the caller. */
	fk.ipc_fails = CUDA_ERROR_OUT_OF_MEMORY;
	assert_int_equal(cudrv_ipc_handle(&info, h), -ENOMEM);
	assert_non_null(strstr(cudrv_last_error(), "cuIpcGetMemHandle failed with CUDA_ERROR_OUT_OF_MEMORY"));
	fk.attr_fails = CUDA_ERROR_INVALID_VALUE;
	assert_int_equal(cudrv_pointer_info((void *)x, &info), -EIO);
	assert_non_null(strstr(cudrv_last_error(), "cuPointerGetAttributes failed with CUDA_ERROR_INVALID_VALUE"));
	/* A driver nobody initialised knows no device memory. */
	fk.attr_fails = CUDA_ERROR_NOT_INITIALIZED;
	assert_int_equal(cudrv_pointer_info((void *)x, &info), 0);
	fk.attr_fails = CUDA_ERROR_DEINITIALIZED;
	assert_int_equal(cudrv_pointer_info((void *)x, &info), 0);
}

static void test_ipc_handle_without_context(void **state)
{
	uintptr_t x = region(2);
	uint64_t id = fake_malloc(x, MiB, 5, FK_LEGACY);
	struct cudrv_ptr_info info;
	uint8_t h[64], want[64];
	assert_int_equal(cudrv_pointer_info((void *)x, &info), 1);

	/* No current context: the device's primary one is borrowed, and the
	 * thread is left without one again. */
	fk.need_ctx = true;
	assert_int_equal(cudrv_ipc_handle(&info, h), 0);
	fake_handle(id, 5, want);
	assert_memory_equal(h, want, 64);
	assert_null(fk_current);
	assert_int_equal(fk.retained, 0);

	/* Another device's context: the same, and that context is restored. */
	fk_current = &fk.ctx[1];
	assert_int_equal(cudrv_ipc_handle(&info, h), 0);
	assert_ptr_equal(fk_current, &fk.ctx[1]);
	assert_int_equal(fk.retained, 0);
	fk_current = NULL;
}

/* ---------------------------------------------------------------- mem_translate */

static void test_register_once(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(3);
	uint64_t id = fake_malloc(x, 8 * MiB, 1, FK_LEGACY);
	struct mem_ref ref, ref2;

	assert_int_equal(mem_translate(fx->c, (void *)(x + 100), 200, &ref), dfcclSuccess);
	assert_int_equal(ref.offset, 100);
	assert_int_equal(ref.device, 1);
	assert_int_equal(fd_nregs(fx->d), 1);
	struct fake_reg r = fd_reg(fx->d, 0);
	uint8_t want[64];
	fake_handle(id, 1, want);
	assert_int_equal(r.kind, DFCCL__V1__MEM_KIND__MEM_CUDA_IPC);
	assert_int_equal(r.device, 1);
	assert_int_equal(r.size, 8 * MiB);  /* the whole allocation */
	assert_int_equal(r.offset, 0);
	assert_int_equal(r.handle_len, 64);
	assert_memory_equal(r.handle, want, 64);
	assert_int_equal(ref.reg_id, r.reg_id);

	/* Later translations anywhere in it hit the cache, one driver call
	 * each, for the allocation's two ids alone. */
	unsigned calls = fake_attr_calls();
	assert_int_equal(mem_translate(fx->c, (void *)(x + MiB), MiB, &ref2), dfcclSuccess);
	assert_int_equal(fake_attr_asked(), 2);
	assert_int_equal(ref2.reg_id, ref.reg_id);
	assert_int_equal(ref2.alloc_id, ref.alloc_id);
	assert_int_equal(ref2.offset, MiB);
	assert_int_equal(mem_translate(fx->c, (void *)x, 8 * MiB, &ref2), dfcclSuccess);
	assert_int_equal(fake_attr_asked(), 2);
	assert_int_equal(ref2.offset, 0);
	assert_int_equal(fake_attr_calls(), calls + 2);
	assert_int_equal(fd_nregs(fx->d), 1);
	/* One byte past the end: not the cache's, and refused. */
	expect_error(mem_translate(fx->c, (void *)(x + MiB), 7 * MiB + 1, &ref2), dfcclInvalidArgument,
	             "runs past the end of its GPU allocation");
	assert_int_equal(fake_attr_calls(), calls + 3);
	assert_int_equal(fake_attr_asked(), 12);

	/* dfcclCommRegister takes it too. */
	struct dfcclComm *comm = calloc(1, sizeof(*comm));
	assert_non_null(comm);
	comm->client = fx->c;
	pthread_mutex_init(&comm->lock, NULL);
	void *handle = NULL;
	assert_int_equal(dfcclCommRegister(comm, (void *)(x + 64), 4096, &handle), dfcclSuccess);
	const struct mem_handle *mh = handle;
	assert_int_equal(mh->ref.reg_id, ref.reg_id);
	assert_int_equal(mh->ref.offset, 64);
	assert_int_equal(dfcclCommDeregister(comm, handle), dfcclSuccess);
	mem_comm_release(comm);
	pthread_mutex_destroy(&comm->lock);
	free(comm);

	/* GPU memory is the application's to free, not dfcclMemFree's. */
	expect_error(dfcclMemFree((void *)x), dfcclInvalidArgument, "was not returned by dfcclMemAlloc");
	assert_int_equal(mem_translate(fx->c, (void *)x, 8, &ref2), dfcclSuccess);
	assert_int_equal(ref2.reg_id, ref.reg_id);
	assert_int_equal(fd_nregs(fx->d), 1);
	assert_int_equal(fd_nderegs(fx->d), 0);
}

static void test_address_reused(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(4);
	struct mem_ref ref, ref2;

	fake_malloc(x, 2 * MiB, 0, FK_LEGACY);
	assert_int_equal(mem_translate(fx->c, (void *)(x + 8), 8, &ref), dfcclSuccess);

	/* Freed and allocated again at the same address: a new buffer id. */
	fake_free(x);
	fake_malloc(x, 2 * MiB, 0, FK_LEGACY);
	assert_int_equal(mem_translate(fx->c, (void *)(x + 8), 8, &ref2), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 2);
	assert_int_equal(fd_nderegs(fx->d), 1);
	assert_int_equal(fd_dereg(fx->d, 0), ref.reg_id);
	assert_int_not_equal(ref2.reg_id, ref.reg_id);
	assert_int_not_equal(ref2.alloc_id, ref.alloc_id);

	/* Freed and not reused: refused, and its registration goes. */
	fake_free(x);
	expect_error(mem_translate(fx->c, (void *)(x + 8), 8, &ref), dfcclInvalidArgument, "nor in GPU memory");
	assert_int_equal(fd_nderegs(fx->d), 2);
	assert_int_equal(fd_dereg(fx->d, 1), ref2.reg_id);

	/* Two allocations replaced by one larger one that covers both. */
	fake_malloc(x, MiB, 0, FK_LEGACY);
	fake_malloc(x + MiB, MiB, 0, FK_LEGACY);
	assert_int_equal(mem_translate(fx->c, (void *)x, 8, &ref), dfcclSuccess);
	assert_int_equal(mem_translate(fx->c, (void *)(x + MiB), 8, &ref2), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 4);
	fake_free(x);
	fake_free(x + MiB);
	fake_malloc(x, 2 * MiB, 0, FK_LEGACY);
	struct mem_ref big;
	assert_int_equal(mem_translate(fx->c, (void *)(x + MiB + 8), 8, &big), dfcclSuccess);
	assert_int_equal(big.offset, MiB + 8);
	assert_int_equal(fd_nregs(fx->d), 5);
	assert_int_equal(fd_nderegs(fx->d), 4);
	uint32_t a = fd_dereg(fx->d, 2), b = fd_dereg(fx->d, 3);
	assert_true((a == ref.reg_id && b == ref2.reg_id) || (a == ref2.reg_id && b == ref.reg_id));
}

/* A freed allocation whose addresses are never passed again: its
 * registration goes before the next new one, not while known buffers are
 * used. */
static void test_freed_swept(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(33), y = region(34), z = region(35);
	struct mem_ref rx, ry, rz;
	fake_malloc(x, MiB, 0, FK_LEGACY);
	fake_malloc(y, MiB, 0, FK_LEGACY);
	assert_int_equal(mem_translate(fx->c, (void *)x, 8, &rx), dfcclSuccess);
	assert_int_equal(mem_translate(fx->c, (void *)y, 8, &ry), dfcclSuccess);
	fake_free(x);
	/* A known buffer: no sweep on that path. */
	assert_int_equal(mem_translate(fx->c, (void *)(y + 64), 8, &ry), dfcclSuccess);
	assert_int_equal(fd_nderegs(fx->d), 0);
	/* A new one: x's registration goes first, y's stays. */
	fake_malloc(z, MiB, 0, FK_LEGACY);
	assert_int_equal(mem_translate(fx->c, (void *)z, 8, &rz), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 3);
	assert_int_equal(fd_nderegs(fx->d), 1);
	assert_int_equal(fd_dereg(fx->d, 0), rx.reg_id);
	assert_int_equal(mem_translate(fx->c, (void *)y, 8, &ry), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 3);
	fake_free(y);
	fake_free(z);
}

static void test_refused_ranges(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(5);
	struct mem_ref ref;
	fake_malloc(x, MiB, 0, FK_LEGACY);
	fake_malloc(x + MiB, MiB, 0, FK_LEGACY); /* right after it */

	/* Past the end of an allocation, also into the next one. */
	expect_error(mem_translate(fx->c, (void *)(x + MiB - 8), 16, &ref), dfcclInvalidArgument,
	             "runs past the end of its GPU allocation");
	expect_error(mem_translate(fx->c, (void *)(x + 8), SIZE_MAX, &ref), dfcclInvalidArgument, "runs past the end");
	/* Memory dfccld cannot map: a pool's, managed memory. */
	fake_malloc(x + 4 * MiB, MiB, 0, FK_POOL);
	expect_error(mem_translate(fx->c, (void *)(x + 4 * MiB), 8, &ref), dfcclNotSupported,
	             "a memory pool's allocation (cudaMallocAsync), which dfccld cannot map");
	fake_malloc(x + 6 * MiB, MiB, 0, FK_MANAGED);
	expect_error(mem_translate(fx->c, (void *)(x + 6 * MiB), 8, &ref), dfcclNotSupported,
	             "managed memory (cudaMallocManaged)");
	/* A device the daemon does not serve. */
	fake_malloc(x + 8 * MiB, MiB, 8, FK_LEGACY);
	expect_error(mem_translate(fx->c, (void *)(x + 8 * MiB), 8, &ref), dfcclInvalidArgument, "device 8 does not exist");
	assert_int_equal(fd_nregs(fx->d), 0);
	/* The first one is fine on its own. */
	assert_int_equal(mem_translate(fx->c, (void *)(x + MiB - 8), 8, &ref), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 1);
}

static void test_failures_leave_nothing(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(6);
	struct mem_ref ref;
	fake_malloc(x, MiB, 0, FK_LEGACY);

	fk.attr_fails = CUDA_ERROR_INVALID_VALUE;
	expect_error(mem_translate(fx->c, (void *)x, 8, &ref), dfcclSystemError, "cuPointerGetAttributes failed");
	fk.attr_fails = CUDA_SUCCESS;

	fk.ipc_fails = CUDA_ERROR_OUT_OF_MEMORY;
	expect_error(mem_translate(fx->c, (void *)x, 8, &ref), dfcclSystemError,
	             "cannot share GPU buffer");
	assert_int_equal(fd_nregs(fx->d), 0);
	fk.ipc_fails = CUDA_SUCCESS;

	fd_refuse_next(fx->d);
	expect_error(mem_translate(fx->c, (void *)x, 8, &ref), dfcclNotSupported, "the fake daemon refuses");
	assert_int_equal(fd_nregs(fx->d), 1);

	/* Nothing was left pending: the next try registers. */
	assert_int_equal(mem_translate(fx->c, (void *)x, 8, &ref), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 2);
	assert_int_equal(fd_reg(fx->d, 1).reg_id, ref.reg_id);
	assert_int_equal(fd_nderegs(fx->d), 0);
}

struct racer {
	pthread_barrier_t *start;
	struct client *c;
	uintptr_t p;
	dfcclResult_t r;
	struct mem_ref ref;
};

static void *race_translate(void *arg)
{
	struct racer *t = arg;
	pthread_barrier_wait(t->start);
	t->r = mem_translate(t->c, (void *)t->p, 64, &t->ref);
	return NULL;
}

static void test_concurrent_first_use(void **state)
{
	struct fixture *fx = *state;
	enum { N = 8 };
	uintptr_t x = region(7);
	fake_malloc(x, 16 * MiB, 0, FK_LEGACY);
	fd_set_delay(fx->d, 50); /* every thread arrives while the registration is in flight */

	pthread_barrier_t start;
	pthread_barrier_init(&start, NULL, N);
	pthread_t th[N];
	struct racer t[N];
	for (int i = 0; i < N; i++) {
		t[i] = (struct racer){&start, fx->c, x + (uintptr_t)i * MiB, dfcclInternalError, {0}};
		assert_int_equal(pthread_create(&th[i], NULL, race_translate, &t[i]), 0);
	}
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&start);
	for (int i = 0; i < N; i++) {
		assert_int_equal(t[i].r, dfcclSuccess);
		assert_int_equal(t[i].ref.reg_id, t[0].ref.reg_id);
		assert_int_equal(t[i].ref.offset, (uint64_t)i * MiB);
	}
	assert_int_equal(fd_nregs(fx->d), 1);
	assert_int_equal(fd_nderegs(fx->d), 0);
}

static void test_session_lost(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(8);
	struct mem_ref ref, ref2;
	fake_malloc(x, MiB, 0, FK_LEGACY);
	assert_int_equal(mem_translate(fx->c, (void *)x, 8, &ref), dfcclSuccess);
	assert_int_equal(fd_reg(fx->d, 0).session, 1);

	/* The daemon restarts: the next session registers the buffer again
	 * instead of using the dead session's registration. */
	fd_hangup(fx->d, fx->c);
	struct client *c2 = fd_connect(fx->d);
	assert_int_equal(mem_translate(c2, (void *)x, 8, &ref2), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 2);
	assert_int_equal(fd_reg(fx->d, 1).session, 2);
	assert_int_equal(ref2.reg_id, fd_reg(fx->d, 1).reg_id);
	assert_int_equal(mem_translate(c2, (void *)(x + 64), 8, &ref2), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 2);

	/* A second live session of the same process may not take it over. */
	struct client *c3 = fd_connect(fx->d);
	expect_error(mem_translate(c3, (void *)x, 8, &ref2), dfcclInvalidUsage, "another connection to dfccld");
	assert_int_equal(fd_nregs(fx->d), 2);
	client_unref(c3);
	client_unref(c2);
}

static void test_host_engine_never_asks(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(9);
	struct mem_ref ref;
	fake_malloc(x, MiB, 0, FK_LEGACY);
	expect_error(mem_translate(fx->c, (void *)x, 8, &ref), dfcclInvalidArgument,
	             "GPU buffers from cudaMalloc are accepted when dfccld runs the CUDA engine");
	assert_int_equal(fake_attr_calls(), 0);
	assert_int_equal(fd_nregs(fx->d), 0);
}

static void test_host_memory_unchanged(void **state)
{
	struct fixture *fx = *state;
	/* dfcclMemAlloc goes through the process's default session. */
	struct client *c = use_default_session(fx);
	void *p = NULL;
	assert_int_equal(dfcclMemAlloc(&p, 10000), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 1);
	struct fake_reg r = fd_reg(fx->d, 0);
	assert_int_equal(r.kind, DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD);
	assert_int_equal(r.size, 10000);
	assert_int_equal(r.handle_len, 0);

	struct mem_ref ref;
	assert_int_equal(mem_translate(c, (char *)p + 100, 9900, &ref), dfcclSuccess);
	assert_int_equal(ref.reg_id, r.reg_id);
	assert_int_equal(ref.offset, 100);
	assert_int_equal(ref.device, 0);
	expect_error(mem_translate(c, (char *)p + 100, 9901, &ref), dfcclInvalidArgument,
	             "not inside one dfcclMemAlloc allocation");
	memset(p, 0x5a, 10000); /* it is real memory */
	/* Host memory never asks the driver. */
	assert_int_equal(fake_attr_calls(), 0);

	assert_int_equal(dfcclMemFree(p), dfcclSuccess);
	assert_int_equal(fd_nderegs(fx->d), 1);
	assert_int_equal(fd_dereg(fx->d, 0), r.reg_id);
	expect_error(dfcclMemFree(p), dfcclInvalidArgument, "freed already");
	assert_int_equal(fk.inits, 0);
}

/* dfcclMemAllocHost gives host shared memory on the CUDA engine too. */
static void test_host_memory_on_cuda_engine(void **state)
{
	struct fixture *fx = *state;
	struct client *c = use_default_session(fx);
	void *p = NULL;
	assert_int_equal(dfcclMemAllocHost(&p, 5000), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 1);
	assert_int_equal(fd_reg(fx->d, 0).kind, DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD);
	memset(p, 0x5a, 5000);
	struct mem_ref ref;
	assert_int_equal(mem_translate(c, (char *)p + 8, 8, &ref), dfcclSuccess);
	assert_int_equal(ref.reg_id, fd_reg(fx->d, 0).reg_id);
	assert_int_equal(fake_attr_calls(), 0);
	assert_int_equal(dfcclMemFree(p), dfcclSuccess);
	assert_int_equal(fd_nderegs(fx->d), 1);
	expect_error(dfcclMemAllocHost(NULL, 8), dfcclInvalidArgument, "dfcclMemAllocHost: ptr is NULL");
	assert_int_equal(fk.inits, 0);
}

/* ---------------------------------------------------------------- VMM allocations */

static void test_vmm_export(void **state)
{
	uintptr_t x = region(10);
	struct cudrv_ptr_info info;
	int fd = -1;
	int before = tu_count_fds();

	fake_malloc(x, 2 * MiB, 1, FK_VMM);
	assert_int_equal(cudrv_pointer_info((void *)(x + 100), &info), 1);
	assert_int_equal(cudrv_vmm_export(&info, &fd), 0);
	assert_true(fd >= 0);
	assert_int_equal(fake_fd_block(fd), info.block_id);
	close(fd);
	/* The handle it retained to export is released again. */
	fake_all_released();

	/* No current context: the device's primary one is borrowed, and the
	 * thread is left without one. */
	fk.need_ctx = true;
	assert_int_equal(cudrv_vmm_export(&info, &fd), 0);
	assert_int_equal(fake_fd_block(fd), info.block_id);
	assert_null(fk_current);
	close(fd);
	fk.need_ctx = false;
	fake_all_released();

	/* Not exportable: refused before the driver is asked. */
	fake_malloc(x + 2 * MiB, 2 * MiB, 1, FK_VMM_PRIVATE);
	assert_int_equal(cudrv_pointer_info((void *)(x + 2 * MiB), &info), 1);
	unsigned retains = fk.retain_calls;
	assert_int_equal(cudrv_vmm_export(&info, &fd), -ENOTSUP);
	assert_non_null(strstr(cudrv_last_error(), "not created exportable"));
	assert_int_equal(fk.retain_calls, retains);

	/* The driver knows no allocation handle there: not VMM after all. */
	assert_int_equal(cudrv_pointer_info((void *)x, &info), 1);
	fk.retain_fails = CUDA_ERROR_INVALID_VALUE;
	assert_int_equal(cudrv_vmm_export(&info, &fd), -ENOTSUP);
	assert_non_null(strstr(cudrv_last_error(), "cuMemRetainAllocationHandle failed"));
	fk.retain_fails = CUDA_SUCCESS;
	/* Exporting fails: the retained handle is released. */
	fk.export_fails = CUDA_ERROR_OUT_OF_MEMORY;
	assert_int_equal(cudrv_vmm_export(&info, &fd), -ENOMEM);
	assert_non_null(strstr(cudrv_last_error(), "cuMemExportToShareableHandle failed"));
	fk.export_fails = CUDA_SUCCESS;
	fake_all_released();
	assert_int_equal(tu_count_fds(), before);
}

static void test_vmm_import(void **state)
{
	struct cudrv_vmm m;
	int before = tu_count_fds();
	uint64_t block = fake_daemon_block(4 * FAKE_GRAN, 2);
	int fd = fake_export_fd(block);

	/* A registered range is rounded up to the granularity, mapped, and
	 * opened to the device; the descriptor stays the caller's. */
	assert_int_equal(cudrv_vmm_import(fd, 2 * FAKE_GRAN + 1, 5, &m), 0);
	assert_int_equal(m.size, 3 * FAKE_GRAN);
	assert_true(m.base != 0 && m.handle != 0);
	assert_int_equal(fk.access_device, 5);
	assert_int_equal(fk.mapped, 1);
	/* What is mapped there is that allocation. */
	struct cudrv_ptr_info info;
	assert_int_equal(cudrv_pointer_info((void *)(m.base + 10), &info), 1);
	assert_int_equal(info.block_id, block);
	assert_int_equal(info.kind, CUDRV_MEM_VMM);
	cudrv_vmm_unmap(&m);
	assert_int_equal(m.handle, 0);
	fake_all_released();
	assert_int_equal(cudrv_pointer_info((void *)(m.base + 10), &info), 0);

	/* Past the allocation's end: the driver refuses the mapping, and
	 * nothing stays reserved or imported. */
	assert_int_equal(cudrv_vmm_import(fd, 4 * FAKE_GRAN + 1, 0, &m), -ERANGE);
	assert_non_null(strstr(cudrv_last_error(), "cuMemMap failed with CUDA_ERROR_INVALID_VALUE"));
	assert_int_equal(m.handle, 0);
	fake_all_released();
	/* The whole of it is fine. */
	assert_int_equal(cudrv_vmm_import(fd, 4 * FAKE_GRAN, 0, &m), 0);
	cudrv_vmm_unmap(&m);

	/* A thread without a context: mapped in the device's primary one,
	 * after undoing the first try. */
	fk.need_ctx = true;
	assert_int_equal(cudrv_vmm_import(fd, FAKE_GRAN, 3, &m), 0);
	assert_null(fk_current);
	fk.need_ctx = false;
	cudrv_vmm_unmap(&m);
	fake_all_released();

	/* Not an exported allocation at all. */
	int other = tu_memfd(64, 0);
	assert_int_equal(cudrv_vmm_import(other, FAKE_GRAN, 0, &m), -EIO);
	assert_non_null(strstr(cudrv_last_error(), "cuMemImportFromShareableHandle failed"));
	close(other);
	close(fd);
	fake_all_released();
	assert_int_equal(tu_count_fds(), before);
}

static void test_vmm_create(void **state)
{
	int fd = -1;
	unsigned long long h = 0;
	uint64_t size = 0;
	assert_int_equal(cudrv_vmm_create(6, 3 * FAKE_GRAN - 5, &fd, &h, &size), 0);
	assert_int_equal(size, 3 * FAKE_GRAN);
	assert_true(fd >= 0 && h != 0);
	/* Another process imports what the descriptor stands for. */
	struct cudrv_vmm m;
	assert_int_equal(cudrv_vmm_import(fd, size, 6, &m), 0);
	assert_int_equal(m.size, size);
	cudrv_vmm_unmap(&m);
	close(fd);
	cudrv_vmm_release(h);
	fake_all_released();
	assert_int_equal(cudrv_vmm_create(6, 0, &fd, &h, &size), -EINVAL);
}

static void test_vmm_register(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(11);
	struct mem_ref ref, ref2;
	fake_malloc(x, 4 * MiB, 2, FK_VMM);
	struct cudrv_ptr_info info;
	assert_int_equal(cudrv_pointer_info((void *)x, &info), 1);

	/* Registered once, whole, by its exported descriptor; the library
	 * keeps neither the descriptor nor a handle. */
	assert_int_equal(mem_translate(fx->c, (void *)(x + 300), 100, &ref), dfcclSuccess);
	assert_int_equal(ref.offset, 300);
	assert_int_equal(ref.device, 2);
	assert_int_equal(fd_nregs(fx->d), 1);
	struct fake_reg r = fd_reg(fx->d, 0);
	assert_int_equal(r.kind, DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD);
	assert_int_equal(r.device, 2);
	assert_int_equal(r.size, 4 * MiB);
	assert_int_equal(r.offset, 0);
	assert_int_equal(r.handle_len, 0);
	assert_int_equal(r.block, info.block_id);
	assert_int_equal(ref.reg_id, r.reg_id);
	fake_all_released();
	expect_fds(fx->fds);

	/* Cached: one driver query, no registration. */
	unsigned calls = fake_attr_calls(), retains = fk.retain_calls;
	assert_int_equal(mem_translate(fx->c, (void *)(x + 3 * MiB), MiB, &ref2), dfcclSuccess);
	assert_int_equal(ref2.reg_id, ref.reg_id);
	assert_int_equal(ref2.offset, 3 * MiB);
	assert_int_equal(fake_attr_calls(), calls + 1);
	assert_int_equal(fk.retain_calls, retains);
	assert_int_equal(fd_nregs(fx->d), 1);
	/* A buffer must lie inside the one mapping. */
	expect_error(mem_translate(fx->c, (void *)(x + 3 * MiB), MiB + 1, &ref2), dfcclInvalidArgument,
	             "one cuMemMap mapping");
	/* The application's memory, not dfcclMemFree's. */
	expect_error(dfcclMemFree((void *)x), dfcclInvalidArgument, "was not returned by dfcclMemAlloc");
}

static void test_vmm_address_reused(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(12);
	struct mem_ref ref, ref2;
	fake_malloc(x, 2 * MiB, 0, FK_VMM);
	assert_int_equal(mem_translate(fx->c, (void *)(x + 8), 8, &ref), dfcclSuccess);

	/* Another physical allocation mapped at the same address, the buffer
	 * id unchanged: the physical allocation's id tells them apart. */
	uint64_t block = fake_remap(x);
	assert_int_equal(mem_translate(fx->c, (void *)(x + 8), 8, &ref2), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 2);
	assert_int_equal(fd_reg(fx->d, 1).block, block);
	assert_int_equal(fd_nderegs(fx->d), 1);
	assert_int_equal(fd_dereg(fx->d, 0), ref.reg_id);
	assert_int_not_equal(ref2.reg_id, ref.reg_id);
	assert_int_not_equal(ref2.alloc_id, ref.alloc_id);

	/* Unmapped, and a cudaMalloc allocation in its place. */
	fake_free(x);
	fake_malloc(x, MiB, 0, FK_LEGACY);
	assert_int_equal(mem_translate(fx->c, (void *)(x + 8), 8, &ref), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 3);
	assert_int_equal(fd_reg(fx->d, 2).kind, DFCCL__V1__MEM_KIND__MEM_CUDA_IPC);
	assert_int_equal(fd_dereg(fx->d, 1), ref2.reg_id);
	fake_all_released();
}

static void test_vmm_refused(void **state)
{
	struct fixture *fx = *state;
	uintptr_t x = region(13);
	struct mem_ref ref;

	/* Not created exportable: said so, and nothing asked of the driver or
	 * the daemon. */
	fake_malloc(x, MiB, 0, FK_VMM_PRIVATE);
	expect_error(mem_translate(fx->c, (void *)x, 8, &ref), dfcclNotSupported,
	             "not created exportable as a POSIX file descriptor");
	assert_int_equal(fk.retain_calls, 0);

	/* Device memory that is no VMM mapping after all. */
	fake_malloc(x + 2 * MiB, MiB, 0, FK_VMM);
	fk.retain_fails = CUDA_ERROR_INVALID_VALUE;
	expect_error(mem_translate(fx->c, (void *)(x + 2 * MiB), 8, &ref), dfcclNotSupported,
	             "neither a cudaMalloc allocation nor a VMM allocation dfccld can map");
	fk.retain_fails = CUDA_SUCCESS;
	/* The driver fails to export it. */
	fk.export_fails = CUDA_ERROR_OUT_OF_MEMORY;
	expect_error(mem_translate(fx->c, (void *)(x + 2 * MiB), 8, &ref), dfcclSystemError, "cannot share GPU buffer");
	fk.export_fails = CUDA_SUCCESS;
	/* The daemon refuses it. */
	fd_refuse_next(fx->d);
	expect_error(mem_translate(fx->c, (void *)(x + 2 * MiB), 8, &ref), dfcclNotSupported, "the fake daemon refuses");
	fake_all_released();
	expect_fds(fx->fds);
	/* Nothing was left pending: the next try registers. */
	assert_int_equal(mem_translate(fx->c, (void *)(x + 2 * MiB), 8, &ref), dfcclSuccess);
	assert_int_equal(fd_nregs(fx->d), 2);
	assert_int_equal(fd_nderegs(fx->d), 0);
}

/* ---------------------------------------------------------------- devices by PCI bus id */

static unsigned fd_nstatus(struct fake_daemon *d)
{
	pthread_mutex_lock(&d->lock);
	unsigned n = d->nstatus;
	pthread_mutex_unlock(&d->lock);
	return n;
}

/*
 * The daemon serves 8 GPUs at bus 0x10..0x17; this process sees two:
 * ordinal 0 is the daemon's device 5 (its bus id written as NVML writes
 * it, in upper case), ordinal 1 a GPU the daemon does not serve. A GPU
 * buffer is registered on the daemon's device and shared through its own
 * ordinal; dfcclMemAlloc asks the daemon's device for memory and maps it
 * for the ordinal.
 */
static void test_device_map_by_bus_id(void **state)
{
	struct fixture *fx = *state;
	pthread_mutex_lock(&fx->d->lock);
	fx->d->bus_ids = true;
	pthread_mutex_unlock(&fx->d->lock);
	struct client *c = use_default_session(fx);
	fk.visible = 2;
	fk.bus_id[0] = "00000000:15:00.0";
	fk.bus_id[1] = "0000:9A:00.0";
	uintptr_t x = region(30);
	uint64_t id = fake_malloc(x, 4 * MiB, 0, FK_LEGACY);
	struct mem_ref ref;

	assert_int_equal(mem_translate(c, (void *)(x + 64), 128, &ref), dfcclSuccess);
	assert_int_equal(fk.inits, 1);
	assert_int_equal(ref.device, 5);
	assert_int_equal(fd_nregs(fx->d), 1);
	struct fake_reg r = fd_reg(fx->d, 0);
	uint8_t want[64];
	fake_handle(id, 0, want); /* asked of the driver for ordinal 0 */
	assert_int_equal(r.device, 5);
	assert_memory_equal(r.handle, want, 64);

	/* A buffer on the GPU the daemon does not serve. */
	fake_malloc(x + 4 * MiB, MiB, 1, FK_LEGACY);
	expect_error(mem_translate(c, (void *)(x + 4 * MiB), 8, &ref), dfcclInvalidArgument,
	             "CUDA device 1 of this process is the GPU at PCI bus id 0000:9A:00.0, which dfccld does not serve; "
	             "it serves 0 (0000:10:00.0), 1 (0000:11:00.0), 2 (0000:12:00.0), 3 (0000:13:00.0), 4 (0000:14:00.0), "
	             "5 (0000:15:00.0), 6 (0000:16:00.0), 7 (0000:17:00.0)");
	assert_int_equal(fd_nregs(fx->d), 1);

	/* dfcclMemAlloc on ordinal 0: the daemon's device 5, mapped for 0. */
	assert_int_equal(dfcclSetDevice(0), dfcclSuccess);
	void *p = NULL;
	assert_int_equal(dfcclMemAlloc(&p, 8192), dfcclSuccess);
	r = fd_reg(fx->d, 1);
	assert_int_equal(r.kind, FAKE_ALLOC);
	assert_int_equal(r.device, 5);
	assert_int_equal(fk.access_device, 0);
	assert_int_equal(mem_translate(c, p, 8192, &ref), dfcclSuccess);
	assert_int_equal(ref.device, 5);
	assert_int_equal(dfcclMemFree(p), dfcclSuccess);

	/* An ordinal past the GPUs this process sees. */
	assert_int_equal(dfcclSetDevice(2), dfcclSuccess);
	expect_error(dfcclMemAlloc(&p, 8192), dfcclInvalidArgument, "device 2 is no GPU of this process, which sees 2");
	assert_int_equal(dfcclSetDevice(0), dfcclSuccess);

	/* One status query for the session, whatever was mapped since. */
	assert_int_equal(fd_nstatus(fx->d), 1);
	fake_free(x + 4 * MiB);
	fake_free(x);
}

/* A buffer on ordinal 6 of a process that sees two GPUs is registered on
 * the daemon's device 6 without the driver's initialisation: the number is
 * an index (by bus id, 6 would be no GPU of this process). */
static void expect_index_numbering(struct fixture *fx, int where)
{
	fk.visible = 2;
	fk.bus_id[0] = "0000:15:00.0";
	fk.bus_id[1] = "0000:16:00.0";
	uintptr_t x = region(where);
	fake_malloc(x, MiB, 6, FK_LEGACY);
	struct mem_ref ref;
	assert_int_equal(mem_translate(fx->c, (void *)x, 8, &ref), dfcclSuccess);
	assert_int_equal(ref.device, 6);
	assert_int_equal(fd_reg(fx->d, 0).device, 6);
	assert_int_equal(fk.inits, 0);
	assert_int_equal(fd_nstatus(fx->d), 1);
	fake_free(x);
}

/* Without bus ids on the daemon's side, numbers stay its device indices
 * and the driver is never initialised for them. */
static void test_device_map_without_bus_ids(void **state)
{
	expect_index_numbering(*state, 31);
}

/* Under MPS with a worker of another user up, CUDA initialisation would
 * wait for that user's jobs to end: the driver is not asked, and numbers
 * stay the daemon's device indices for the session. */
static void test_device_map_mps_other_user(void **state)
{
	struct fixture *fx = *state;
	pthread_mutex_lock(&fx->d->lock);
	fx->d->bus_ids = true;
	fx->d->mps_other_user = true;
	pthread_mutex_unlock(&fx->d->lock);
	expect_index_numbering(fx, 32);
}

/* ---------------------------------------------------------------- dfcclMemAlloc on the CUDA engine */

static void test_memalloc_device(void **state)
{
	struct fixture *fx = *state;
	struct client *c = use_default_session(fx);
	int before = tu_count_fds();
	assert_int_equal(dfcclSetDevice(3), dfcclSuccess);

	/* The daemon allocates; the library maps what it hands over. */
	void *p = NULL;
	assert_int_equal(dfcclMemAlloc(&p, 100000), dfcclSuccess);
	assert_int_equal(fk.inits, 1);
	assert_int_equal(fd_nregs(fx->d), 1);
	struct fake_reg r = fd_reg(fx->d, 0);
	assert_int_equal(r.kind, FAKE_ALLOC);
	assert_int_equal(r.device, 3);
	assert_int_equal(r.size, 100000);
	assert_int_equal(fk.mapped, 1);
	assert_int_equal(fk.access_device, 3);
	struct cudrv_ptr_info info;
	assert_int_equal(cudrv_pointer_info(p, &info), 1);
	assert_int_equal(info.block_id, r.block);
	assert_int_equal(info.base, (uintptr_t)p);
	assert_int_equal(info.size, r.map_size);
	/* It holds the mapping's handle, and no descriptor. */
	expect_fds(before);

	/* Collectives on it need neither a registration nor the driver. */
	unsigned calls = fake_attr_calls();
	struct mem_ref ref;
	assert_int_equal(mem_translate(c, (char *)p + 4096, 1000, &ref), dfcclSuccess);
	assert_int_equal(ref.reg_id, r.reg_id);
	assert_int_equal(ref.offset, 4096);
	assert_int_equal(ref.device, 3);
	expect_error(mem_translate(c, (char *)p + 4096, 100000, &ref), dfcclInvalidArgument,
	             "not inside one dfcclMemAlloc allocation");
	assert_int_equal(fake_attr_calls(), calls);
	assert_int_equal(fd_nregs(fx->d), 1);

	/* Freed: deregistered, unmapped, released. */
	assert_int_equal(dfcclMemFree(p), dfcclSuccess);
	assert_int_equal(fd_nderegs(fx->d), 1);
	assert_int_equal(fd_dereg(fx->d, 0), r.reg_id);
	fake_all_released();
	expect_error(dfcclMemFree(p), dfcclInvalidArgument, "freed already");
	assert_int_equal(dfcclSetDevice(0), dfcclSuccess);
	expect_fds(before);
}

static void test_memalloc_device_failures(void **state)
{
	struct fixture *fx = *state;
	use_default_session(fx);
	int before = tu_count_fds();
	void *p = (void *)1;

	/* The daemon has no memory. */
	fd_set_alloc_reply(fx->d, FA_REFUSE);
	expect_error(dfcclMemAlloc(&p, 4096), dfcclSystemError, "the fake daemon has no device memory");
	assert_null(p);
	/* Its reply lacks the descriptor, or the size is wrong: refused, and
	 * the registration it made given back. */
	fd_set_alloc_reply(fx->d, FA_NO_FD);
	expect_error(dfcclMemAlloc(&p, 4096), dfcclInternalError, "0 descriptor(s)");
	assert_int_equal(fd_nderegs(fx->d), 1);
	assert_int_equal(fd_dereg(fx->d, 0), fd_reg(fx->d, 1).reg_id);
	fd_set_alloc_reply(fx->d, FA_SMALL);
	expect_error(dfcclMemAlloc(&p, 4096), dfcclInternalError, "dfccld answered an allocation of 4096 bytes");
	assert_int_equal(fd_nderegs(fx->d), 2);
	fd_set_alloc_reply(fx->d, FA_OK);
	/* The driver cannot map it. */
	fk.map_fails = CUDA_ERROR_OUT_OF_MEMORY;
	expect_error(dfcclMemAlloc(&p, 4096), dfcclUnhandledCudaError, "cannot map the 65536 bytes of device memory");
	fk.map_fails = CUDA_SUCCESS;
	assert_int_equal(fd_nderegs(fx->d), 3);
	assert_int_equal(fd_dereg(fx->d, 2), fd_reg(fx->d, 3).reg_id);
	/* The process cannot use the driver: nothing is asked of the daemon. */
	fk.init_fails = CUDA_ERROR_NOT_SUPPORTED;
	unsigned nregs = fd_nregs(fx->d);
	expect_error(dfcclMemAlloc(&p, 4096), dfcclUnhandledCudaError, "cannot use the CUDA driver: cuInit failed");
	fk.init_fails = CUDA_SUCCESS;
	assert_int_equal(fd_nregs(fx->d), nregs);
	fake_all_released();
	expect_fds(before);
	/* And then it works. */
	assert_int_equal(dfcclMemAlloc(&p, 4096), dfcclSuccess);
	assert_int_equal(dfcclMemFree(p), dfcclSuccess);
	fake_all_released();
}

#ifdef DFCCL_TEST_CUDA_H
static void test_matches_cuda_h(void **state)
{
	const long ours[] = {CUDRV_CHECKED_VALUES};
	for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
		if (ours[i] != cuda_h_values[i])
			fail_msg("value %zu of CUDRV_CHECKED_VALUES: cudrv.h says %ld, cuda.h %ld", i, ours[i], cuda_h_values[i]);
	/* The names cudrv.c looks up are the ones cuda.h binds the calls to. */
	static const char *const looked_up[] = {
	    "cuPointerGetAttributes",
	    "cuIpcGetMemHandle",
	    "cuDeviceGet",
	    "cuDevicePrimaryCtxRetain",
	    "cuDevicePrimaryCtxRelease_v2",
	    "cuCtxGetCurrent",
	    "cuCtxSetCurrent",
	    "cuGetErrorName",
	    "cuInit",
	    "cuMemRetainAllocationHandle",
	    "cuMemExportToShareableHandle",
	    "cuMemImportFromShareableHandle",
	    "cuMemGetAllocationPropertiesFromHandle",
	    "cuMemGetAllocationGranularity",
	    "cuMemCreate",
	    "cuMemRelease",
	    "cuMemAddressReserve",
	    "cuMemAddressFree",
	    "cuMemMap",
	    "cuMemUnmap",
	    "cuMemSetAccess",
	    "cuMemHostRegister_v2",
	    "cuMemHostUnregister",
	    "cuMemHostGetDevicePointer_v2",
	    "cuStreamBatchMemOp_v2",
	    "cuMemcpyAsync",
	    "cuMemcpy2DAsync_v2",
	    "cuStreamIsCapturing",
	    "cuDeviceGetCount",
	    "cuDeviceGetPCIBusId",
	};
	for (size_t i = 0; i < sizeof(looked_up) / sizeof(looked_up[0]); i++)
		assert_string_equal(looked_up[i], cuda_h_symbols[i]);
}
#endif

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_no_driver),
	    cmocka_unit_test_setup_teardown(test_pointer_info, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_ipc_handle_without_context, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_register_once, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_device_map_by_bus_id, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_device_map_without_bus_ids, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_device_map_mps_other_user, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_address_reused, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_freed_swept, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_refused_ranges, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_failures_leave_nothing, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_concurrent_first_use, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_session_lost, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_host_engine_never_asks, setup_host, teardown),
	    cmocka_unit_test_setup_teardown(test_host_memory_unchanged, setup_host, teardown),
	    cmocka_unit_test_setup_teardown(test_host_memory_on_cuda_engine, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_vmm_export, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_vmm_import, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_vmm_create, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_vmm_register, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_vmm_address_reused, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_vmm_refused, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_memalloc_device, setup_cuda, teardown),
	    cmocka_unit_test_setup_teardown(test_memalloc_device_failures, setup_cuda, teardown),
#ifdef DFCCL_TEST_CUDA_H
	    cmocka_unit_test(test_matches_cuda_h),
#endif
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
