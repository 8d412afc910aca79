/*
 * Shared-memory allocations, their table, and dfcclCommRegister handles;
 * see mem.h.
 *
 * The memfd is sealed against shrinking and growing before it is
 * registered: the daemon's engine maps it too, and a client that truncated
 * it afterwards would make the engine fault on pages that vanished. Only a
 * table lookup runs on the collective path: a binary search under one
 * mutex.
 */
#include "mem.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm.h"
#include "errors.h"

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mem_table mem_allocs = MEM_TABLE_INIT;
static uint64_t mem_next_id; /* guarded by mem_lock */

/* ---------------------------------------------------------------- the table */

/* Index of the first allocation whose base is above addr. */
static size_t table_upper(const struct mem_table *t, uintptr_t addr)
{
	size_t lo = 0, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->v[mid]->base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int mem_table_insert(struct mem_table *t, struct mem_alloc *a)
{
	size_t i = table_upper(t, a->base);
	if ((i > 0 && t->v[i - 1]->base + t->v[i - 1]->size > a->base) ||
	    (i < t->n && a->base + a->size > t->v[i]->base))
		return -EEXIST;
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		struct mem_alloc **v = realloc(t->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		t->v = v;
		t->cap = cap;
	}
	memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
	t->v[i] = a;
	t->n++;
	return 0;
}

struct mem_alloc *mem_table_find(const struct mem_table *t, uintptr_t addr)
{
	size_t i = table_upper(t, addr);
	if (i == 0)
		return NULL;
	struct mem_alloc *a = t->v[i - 1];
	return addr - a->base < a->size ? a : NULL;
}

struct mem_alloc *mem_table_take(struct mem_table *t, uintptr_t base)
{
	size_t i = table_upper(t, base);
	if (i == 0 || t->v[i - 1]->base != base)
		return NULL;
	struct mem_alloc *a = t->v[i - 1];
	memmove(&t->v[i - 1], &t->v[i], (t->n - i) * sizeof(*t->v));
	t->n--;
	return a;
}

void mem_table_clear(struct mem_table *t)
{
	free(t->v);
	*t = (struct mem_table)MEM_TABLE_INIT;
}

dfcclResult_t mem_table_translate(const struct mem_table *t, const struct client *c, const void *ptr, size_t bytes,
                                  struct mem_ref *out)
{
	uintptr_t p = (uintptr_t)ptr;
	const struct mem_alloc *a = mem_table_find(t, p);
	if (!a || bytes > a->size - (p - a->base))
		return errors_set(dfcclInvalidArgument, "buffer %p of %zu bytes is not inside one dfcclMemAlloc allocation: "
		                  "host-engine buffers must come from dfcclMemAlloc", ptr, bytes);
	if (a->client != c)
		return errors_set(dfcclInvalidUsage, "buffer %p was allocated through an earlier connection to dfccld (the "
		                  "daemon restarted since); free it and allocate it again", ptr);
	out->reg_id = a->reg_id;
	out->offset = p - a->base;
	out->alloc_id = a->id;
	out->device = a->device;
	return dfcclSuccess;
}

dfcclResult_t mem_translate(const struct client *c, const void *ptr, size_t bytes, struct mem_ref *out)
{
	pthread_mutex_lock(&mem_lock);
	dfcclResult_t r = mem_table_translate(&mem_allocs, c, ptr, bytes, out);
	pthread_mutex_unlock(&mem_lock);
	return r;
}

/* ---------------------------------------------------------------- allocations */

static dfcclResult_t mem_deregister(struct client *c, uint32_t reg_id)
{
	Dfccl__V1__DeregisterMem dereg = DFCCL__V1__DEREGISTER_MEM__INIT;
	dereg.reg_id = reg_id;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_DEREGISTER_MEM;
	req.deregister_mem = &dereg;
	dfcclResult_t r = client_request_ok(c, &req);
	/* A session that is gone took its registrations with it. */
	return r == dfcclDaemonUnavailable ? dfcclSuccess : r;
}

static void mem_alloc_free(struct mem_alloc *a)
{
	if (!a)
		return;
	if (a->base)
		munmap((void *)a->base, a->map_size);
	if (a->memfd >= 0)
		close(a->memfd);
	client_unref(a->client);
	free(a);
}

/* Creates, sizes, seals and maps the memfd of a. */
static dfcclResult_t mem_alloc_map(struct mem_alloc *a)
{
	a->memfd = memfd_create("dfccl-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (a->memfd < 0)
		return errors_set(dfcclSystemError, "cannot allocate %zu bytes of shared memory: memfd_create: %s", a->size,
		                  strerror(errno));
	if (ftruncate(a->memfd, (off_t)a->map_size) < 0)
		return errors_set(dfcclSystemError, "cannot allocate %zu bytes of shared memory: %s", a->size, strerror(errno));
	if (fcntl(a->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return errors_set(dfcclSystemError, "cannot seal a shared-memory buffer: %s", strerror(errno));
	void *p = mmap(NULL, a->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, a->memfd, 0);
	if (p == MAP_FAILED)
		return errors_set(dfcclSystemError, "cannot map %zu bytes of shared memory: %s", a->size, strerror(errno));
	a->base = (uintptr_t)p;
	return dfcclSuccess;
}

static dfcclResult_t mem_alloc_register(struct mem_alloc *a)
{
	Dfccl__V1__RegisterMem reg = DFCCL__V1__REGISTER_MEM__INIT;
	reg.kind = DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD;
	reg.device = (uint32_t)a->device;
	reg.size = a->size;
	reg.offset = 0;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	req.register_mem = &reg;
	struct client_reply rep;
	dfcclResult_t r = client_request(a->client, &req, &a->memfd, 1, DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY, &rep);
	if (r != dfcclSuccess)
		return r;
	a->reg_id = rep.env->register_reply->reg_id;
	client_reply_release(&rep);
	return dfcclSuccess;
}

dfcclResult_t dfcclMemAlloc(void **ptr, size_t size)
{
	dfcclResult_t r;
	struct mem_alloc *a = NULL;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	if (!ptr)
		return errors_set(dfcclInvalidArgument, "dfcclMemAlloc: ptr is NULL");
	*ptr = NULL;
	if (size == 0 || size > SIZE_MAX - page)
		return errors_set(dfcclInvalidArgument, "dfcclMemAlloc: cannot allocate %zu bytes", size);

	a = calloc(1, sizeof(*a));
	if (!a)
		return errors_set(dfcclSystemError, "out of memory");
	a->memfd = -1;
	a->size = size;
	a->map_size = (size + page - 1) / page * page;
	a->device = client_current_device();
	r = client_default(&a->client);
	if (r != dfcclSuccess)
		goto fail;
	r = client_check_device(a->client, a->device);
	if (r != dfcclSuccess)
		goto fail;
	r = mem_alloc_map(a);
	if (r != dfcclSuccess)
		goto fail;
	r = mem_alloc_register(a);
	if (r != dfcclSuccess)
		goto fail;

	pthread_mutex_lock(&mem_lock);
	a->id = ++mem_next_id;
	int rc = mem_table_insert(&mem_allocs, a);
	pthread_mutex_unlock(&mem_lock);
	if (rc < 0) {
		mem_deregister(a->client, a->reg_id);
		r = errors_set(dfcclSystemError, "cannot record an allocation: %s", strerror(-rc));
		goto fail;
	}
	*ptr = (void *)a->base;
	return dfcclSuccess;

fail:
	mem_alloc_free(a);
	return r;
}

dfcclResult_t dfcclMemFree(void *ptr)
{
	if (!ptr)
		return dfcclSuccess;
	pthread_mutex_lock(&mem_lock);
	struct mem_alloc *a = mem_table_take(&mem_allocs, (uintptr_t)ptr);
	pthread_mutex_unlock(&mem_lock);
	if (!a)
		return errors_set(dfcclInvalidArgument, "dfcclMemFree: %p was not returned by dfcclMemAlloc, or was freed "
		                  "already", ptr);
	dfcclResult_t r = mem_deregister(a->client, a->reg_id);
	mem_alloc_free(a);
	return r;
}

/* ---------------------------------------------------------------- communicator handles */

dfcclResult_t dfcclCommRegister(const dfcclComm_t comm, void *buff, size_t size, void **handle)
{
	if (!comm || !buff || !handle || size == 0)
		return errors_set(dfcclInvalidArgument, "dfcclCommRegister: %s",
		                  !comm ? "comm is NULL" : !buff ? "buff is NULL" : !handle ? "handle is NULL" : "size is 0");
	struct mem_ref ref;
	dfcclResult_t r = mem_translate(comm->client, buff, size, &ref);
	if (r != dfcclSuccess)
		return r;

	pthread_mutex_lock(&comm->lock);
	struct mem_handle *h = comm->handles;
	while (h && !(h->ref.alloc_id == ref.alloc_id && h->ref.offset == ref.offset && h->size == size))
		h = h->next;
	if (h) {
		h->refs++;
	} else if ((h = calloc(1, sizeof(*h)))) {
		h->ref = ref;
		h->size = size;
		h->refs = 1;
		h->next = comm->handles;
		comm->handles = h;
	}
	pthread_mutex_unlock(&comm->lock);
	if (!h)
		return errors_set(dfcclSystemError, "out of memory");
	*handle = h;
	return dfcclSuccess;
}

dfcclResult_t dfcclCommDeregister(const dfcclComm_t comm, void *handle)
{
	if (!comm || !handle)
		return errors_set(dfcclInvalidArgument, "dfcclCommDeregister: %s is NULL", comm ? "handle" : "comm");
	/* Found by comparing pointers, so a stale or foreign handle is refused
	 * instead of being dereferenced. */
	struct mem_handle *found = NULL, *last = NULL;
	pthread_mutex_lock(&comm->lock);
	for (struct mem_handle **p = &comm->handles; *p; p = &(*p)->next) {
		if (*p == handle) {
			found = *p;
			if (--found->refs == 0) {
				*p = found->next;
				last = found;
			}
			break;
		}
	}
	pthread_mutex_unlock(&comm->lock);
	if (!found)
		return errors_set(dfcclInvalidArgument, "dfcclCommDeregister: %p is not a registration of this communicator",
		                  handle);
	free(last);
	return dfcclSuccess;
}

void mem_comm_release(struct dfcclComm *comm)
{
	struct mem_handle *h = comm->handles;
	while (h) {
		struct mem_handle *next = h->next;
		free(h);
		h = next;
	}
	comm->handles = NULL;
}
