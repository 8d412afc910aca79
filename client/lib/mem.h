/*
 * Buffers the daemon can reach, and the translation of a user pointer into
 * (registration id, offset) for a submission entry.
 *
 * Model. dfcclMemAlloc creates host shared memory (a sealed memfd mapped
 * MAP_SHARED), registers it with the daemon on the calling thread's device,
 * and records it in the process-wide allocation table: base, size,
 * registration id, descriptor, device, and an allocation id that is never
 * reused, so anything cached by allocation survives the same address being
 * handed out again after a free. dfcclMemFree deregisters and unmaps.
 * Collectives translate each buffer through the table with a bounds check;
 * a buffer that is not inside one allocation is refused before it reaches
 * the daemon. dfcclCommRegister hands out per-communicator handles that name
 * a range of an allocation.
 */
#ifndef DFCCL_CLIENT_MEM_H
#define DFCCL_CLIENT_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "dfccl.h"

struct dfcclComm;

struct mem_alloc {
	uint64_t id;            /* allocation id, unique in the process */
	uintptr_t base;
	size_t size;            /* bytes asked for (the registered range) */
	size_t map_size;        /* size rounded up to pages */
	uint32_t reg_id;        /* registration id in the session */
	int memfd;
	int device;
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
	int device;
};

/* A dfcclCommRegister handle. */
struct mem_handle {
	struct mem_handle *next;
	struct mem_ref ref;
	size_t size;
	unsigned refs;     /* registrations of the same range */
};

/* Adds a; 0, -ENOMEM, or -EEXIST if it overlaps an allocation in t. */
int mem_table_insert(struct mem_table *t, struct mem_alloc *a);

/* Removes and returns the allocation that starts exactly at base, or NULL. */
struct mem_alloc *mem_table_take(struct mem_table *t, uintptr_t base);

/* The allocation containing address addr, or NULL. */
struct mem_alloc *mem_table_find(const struct mem_table *t, uintptr_t addr);

/* Frees the table's array (not the allocations). */
void mem_table_clear(struct mem_table *t);

/*
 * Translates [ptr, ptr + bytes) (bytes > 0) of session c into a registration
 * and offset. dfcclInvalidArgument unless the range lies inside one
 * allocation; dfcclInvalidUsage if that allocation belongs to another
 * session (the daemon was restarted since it was made).
 */
dfcclResult_t mem_table_translate(const struct mem_table *t, const struct client *c, const void *ptr, size_t bytes,
                                  struct mem_ref *out);

/* mem_table_translate on the process-wide table. */
dfcclResult_t mem_translate(const struct client *c, const void *ptr, size_t bytes, struct mem_ref *out);

/* Frees every dfcclCommRegister handle of comm (it is being freed). */
void mem_comm_release(struct dfcclComm *comm);

#endif /* DFCCL_CLIENT_MEM_H */
