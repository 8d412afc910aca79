/*
 * Buffers the daemon can reach, and the translation of a user pointer into
 * (registration id, offset) for a submission entry.
 *
 * Model. The process-wide allocation table holds three kinds of entries.
 *
 * Host allocations: dfcclMemAlloc on the host engine creates host shared
 * memory (a sealed memfd mapped MAP_SHARED), registers it with the daemon
 * on the calling thread's device, and records it: base, size, registration
 * id, descriptor, device, and an allocation id that is never reused, so
 * anything cached by allocation survives the same address being handed out
 * again after a free. dfcclMemFree deregisters and unmaps.
 *
 * Device allocations: dfcclMemAlloc on the CUDA engine asks the daemon for
 * device memory (AllocMem). The daemon allocates it on the calling thread's
 * device, registers it with every worker and hands it over as a POSIX file
 * descriptor, which the library imports and maps (cudrv_vmm_import) and
 * records like host memory: translations need no driver call and no
 * registration. dfcclMemFree deregisters (the daemon lets go of it) and
 * unmaps; the memory goes once both sides have.
 *
 * GPU allocations of the application (CUDA engine only): a pointer that is
 * in no entry but lies in device memory (cudrv.h) makes mem_translate
 * register, once, the whole allocation it belongs to: a cudaMalloc
 * allocation by its legacy CUDA IPC handle, a VMM mapping (cuMemCreate +
 * cuMemMap) by its allocation exported as a POSIX file descriptor. The
 * entry is keyed by base, size and the driver's ids of the buffer and of
 * the physical allocation. Nothing is mapped and nothing is freed by the
 * library: the application frees the memory (cudaFree, or cuMemUnmap and
 * cuMemRelease) behind its back, and may map a new allocation at the same
 * address. So every translation through a GPU entry asks the driver again
 * (one call) which allocation the address belongs to now: the two ids alone
 * where the entry is the session's and holds the range (ids are never
 * reused, so the same ids are the same allocation and the entry's
 * translation stands), every attribute otherwise; an entry whose
 * allocation was freed, or whose session with the daemon is gone, is
 * deregistered and dropped, and the allocation found there now is
 * registered in its place. While one thread registers an allocation, the
 * entry stands in the table marked pending, and other threads that need the
 * same allocation wait for it instead of registering it again.
 *
 * Collectives translate each buffer through the table with a bounds check;
 * a buffer that is not inside one allocation is refused before it reaches
 * the daemon. dfcclCommRegister hands out per-communicator handles that name
 * a range of an allocation.
 */
#ifndef DFCCL_CLIENT_MEM_H
#define DFCCL_CLIENT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "cudrv.h"
#include "dfccl.h"

struct dfcclComm;

enum mem_alloc_kind {
	MEM_ALLOC_HOST = 0,     /* dfcclMemAlloc's shared memory (host engine) */
	MEM_ALLOC_GPU = 1,      /* a GPU allocation of the application, registered implicitly */
	MEM_ALLOC_DEVICE = 2,   /* dfcclMemAlloc's device memory (CUDA engine), the daemon's, mapped here */
};

struct mem_alloc {
	uint64_t id;            /* allocation id, unique in the process */
	uintptr_t base;
	size_t size;            /* host, device: bytes asked for; GPU: the whole allocation (the registered range) */
	size_t map_size;        /* host: size rounded up to pages; device: the allocation's size; GPU: 0 */
	uint32_t reg_id;        /* registration id in the session */
	int memfd;              /* host: the memfd; else -1 */
	int device;             /* the daemon's device index (client_device_map) */
	int ordinal;            /* device, GPU: the CUDA ordinal of the same GPU, for driver calls */
	enum mem_alloc_kind kind;
	uint64_t buffer_id;     /* GPU: the driver's id of the allocation */
	uint64_t block_id;      /* GPU: the driver's id of the physical allocation */
	struct cudrv_vmm vmm;   /* device: the mapping */
	bool pending;           /* GPU: registration in flight (guarded by the table's lock) */
	struct mem_alloc *next; /* links entries taken out of the table together */
	struct client *client;  /* the session it is registered with; reference held */
};

/* Allocations sorted by base; they never overlap. */
struct mem_table {
	struct mem_alloc **v;
	size_t n;
	size_t cap;
};

#define MEM_TABLE_INIT {NULL, 0, 0}

/* Where a buffer lives, for a submission entry. */
struct mem_ref {
	uint32_t reg_id;
	uint64_t offset;   /* bytes from the start of the registration */
	uint64_t alloc_id;
	int device;        /* the daemon's device index */
};

/* A dfcclCommRegister handle. */
struct mem_handle {
	struct mem_handle *next;
	struct mem_ref ref;
	size_t size;
	unsigned refs;     /* registrations of the same range */
};

/*
 * size bytes of device memory on c's device dev, from the daemon as
 * dfcclMemAlloc's (CUDA engine only: dfcclNotSupported on the host engine),
 * registered (*reg_id, the memory at offset 0), for the library's own use:
 * the queue pairs' device completion words (client_stream_words). It lives
 * as long as the process.
 */
dfcclResult_t mem_device_words(struct client *c, const struct client_device *dev, size_t size, void **ptr,
                               uint32_t *reg_id);

/* Adds a; 0, -ENOMEM, or -EEXIST if it overlaps an allocation in t. */
int mem_table_insert(struct mem_table *t, struct mem_alloc *a);

/* Removes and returns the allocation that starts exactly at base, or NULL. */
struct mem_alloc *mem_table_take(struct mem_table *t, uintptr_t base);

/* The allocation containing address addr, or NULL. */
struct mem_alloc *mem_table_find(const struct mem_table *t, uintptr_t addr);

/* The allocations that overlap [lo, hi) (lo < hi): t->v[*first ..
 * *first + returned count). With none, *first is where one would go. */
size_t mem_table_overlap(const struct mem_table *t, uintptr_t lo, uintptr_t hi, size_t *first);

/* Frees the table's array (not the allocations). */
void mem_table_clear(struct mem_table *t);

/*
 * Translates [ptr, ptr + bytes) (bytes > 0) of session c into a registration
 * and offset through host allocations. dfcclInvalidArgument unless the
 * range lies inside one allocation; dfcclInvalidUsage if that allocation
 * belongs to another session (the daemon was restarted since it was made).
 */
dfcclResult_t mem_table_translate(const struct mem_table *t, const struct client *c, const void *ptr, size_t bytes,
                                  struct mem_ref *out);

/*
 * Translates [ptr, ptr + bytes) (bytes > 0) of session c through the
 * process-wide table: mem_table_translate for dfcclMemAlloc memory. When the
 * daemon runs the CUDA engine, device memory is translated too, registering
 * its allocation with c first if needed (a daemon round trip); besides the
 * errors of mem_table_translate and of the registration,
 * dfcclInvalidArgument when the range runs past the end of its GPU
 * allocation, dfcclNotSupported for GPU memory dfccld cannot reach (a
 * memory pool's, managed memory, a VMM allocation not exportable as a
 * POSIX file descriptor), dfcclSystemError when the driver fails.
 */
dfcclResult_t mem_translate(struct client *c, const void *ptr, size_t bytes, struct mem_ref *out);

/* Drops registration reg_id of session c (DeregisterMem); a session that is
 * gone has dropped it already, which counts as success. */
dfcclResult_t mem_deregister(struct client *c, uint32_t reg_id);

/* Frees every dfcclCommRegister handle of comm (it is being freed). */
void mem_comm_release(struct dfcclComm *comm);

#endif /* DFCCL_CLIENT_MEM_H */
