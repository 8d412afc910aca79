/*
 * Shared-memory and device allocations, implicitly registered GPU
 * allocations, their table, and dfcclCommRegister handles; see mem.h.
 *
 * The memfd is sealed against shrinking and growing before it is
 * registered: the daemon's engine maps it too, and a client that truncated
 * it afterwards would make the engine fault on pages that vanished. For
 * memory of dfcclMemAlloc only a table lookup runs on the collective path:
 * a binary search under one mutex. The application's GPU memory adds one
 * driver query per translation, made outside the mutex.
 *
 * The mutex is never held across a daemon round trip: a GPU allocation
 * being registered stands in the table as a pending entry, which keeps
 * other threads from registering it too (they wait on mem_settled), and
 * entries being replaced are taken out of the table before their
 * registrations are dropped, so no other thread can hand them out
 * meanwhile.
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
#include "cudrv.h"
#include "errors.h"

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mem_settled = PTHREAD_COND_INITIALIZER; /* a pending entry was registered or dropped */
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

size_t mem_table_overlap(const struct mem_table *t, uintptr_t lo, uintptr_t hi, size_t *first)
{
	size_t i = table_upper(t, lo);
	if (i > 0 && t->v[i - 1]->base + t->v[i - 1]->size > lo)
		i--;
	size_t n = 0;
	while (i + n < t->n && t->v[i + n]->base < hi)
		n++;
	*first = i;
	return n;
}

/* Removes t->v[i .. i + n). */
static void table_remove(struct mem_table *t, size_t i, size_t n)
{
	if (n == 0)
		return; /* t->v may be NULL */
	memmove(&t->v[i], &t->v[i + n], (t->n - i - n) * sizeof(*t->v));
	t->n -= n;
}

int mem_table_insert(struct mem_table *t, struct mem_alloc *a)
{
	size_t i;
	if (mem_table_overlap(t, a->base, a->base + a->size, &i))
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
	table_remove(t, i - 1, 1);
	return a;
}

void mem_table_clear(struct mem_table *t)
{
	free(t->v);
	*t = (struct mem_table)MEM_TABLE_INIT;
}

/* Where address p of allocation a is, for a submission entry. */
static void alloc_ref(const struct mem_alloc *a, uintptr_t p, struct mem_ref *out)
{
	out->reg_id = a->reg_id;
	out->offset = p - a->base;
	out->alloc_id = a->id;
	out->device = a->device;
}

dfcclResult_t mem_table_translate(const struct mem_table *t, const struct client *c, const void *ptr, size_t bytes,
                                  struct mem_ref *out)
{
	uintptr_t p = (uintptr_t)ptr;
	const struct mem_alloc *a = mem_table_find(t, p);
	if (!a || bytes > a->size - (p - a->base))
		return errors_set(dfcclInvalidArgument, "buffer %p of %zu bytes is not inside one dfcclMemAlloc allocation: "
		                  "host-engine buffers must come from dfcclMemAlloc (GPU buffers from cudaMalloc are "
		                  "accepted when dfccld runs the CUDA engine)", ptr, bytes);
	if (a->client != c)
		return errors_set(dfcclInvalidUsage, "buffer %p was allocated through an earlier connection to dfccld (the "
		                  "daemon restarted since); free it and allocate it again", ptr);
	alloc_ref(a, p, out);
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- registrations */

dfcclResult_t mem_deregister(struct client *c, uint32_t reg_id)
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

/* Frees a (not in the table any more) and what it holds; a GPU
 * allocation's memory is the application's and stays. */
static void mem_alloc_free(struct mem_alloc *a)
{
	if (!a)
		return;
	if (a->kind == MEM_ALLOC_HOST && a->base)
		munmap((void *)a->base, a->map_size);
	cudrv_vmm_unmap(&a->vmm);
	if (a->memfd >= 0)
		close(a->memfd);
	client_unref(a->client);
	free(a);
}

/* Deregisters a and frees it. */
static dfcclResult_t mem_alloc_drop(struct mem_alloc *a)
{
	dfcclResult_t r = mem_deregister(a->client, a->reg_id);
	mem_alloc_free(a);
	return r;
}

/*
 * Registers the whole of a with its session, as memory of `kind` (a
 * dfccl.v1.MemKind): host memory by its memfd (fd), GPU memory by the
 * legacy IPC handle of the allocation (ipc_handle, CUDRV_IPC_HANDLE_BYTES)
 * or by a VMM allocation's descriptor (fd). Sets a->reg_id.
 */
static dfcclResult_t mem_alloc_register(struct mem_alloc *a, int kind, const uint8_t *ipc_handle, int fd)
{
	Dfccl__V1__RegisterMem reg = DFCCL__V1__REGISTER_MEM__INIT;
	reg.kind = kind;
	reg.device = (uint32_t)a->device;
	reg.size = a->size;
	reg.offset = 0;
	if (ipc_handle) {
		reg.ipc_handle.data = (uint8_t *)ipc_handle;
		reg.ipc_handle.len = CUDRV_IPC_HANDLE_BYTES;
	}
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM;
	req.register_mem = &reg;
	struct client_reply rep;
	dfcclResult_t r = client_request(a->client, &req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0,
	                                 DFCCL__V1__ENVELOPE__BODY_REGISTER_REPLY, &rep);
	if (r != dfcclSuccess)
		return r;
	a->reg_id = rep.env->register_reply->reg_id;
	client_reply_release(&rep);
	return dfcclSuccess;
}

/* ---------------------------------------------------------------- GPU allocations */

/* Whether c's daemon takes GPU memory: it runs the CUDA engine. */
static bool mem_gpu_served(const struct client *c)
{
	return client_info(c)->engine == DFCCL__V1__ENGINE_KIND__ENGINE_CUDA;
}

/*
 * Takes the GPU entries that overlap [lo, hi) out of the table, onto *list
 * (linked through next). Returns 0; 1, taking nothing, when one of them is
 * pending (the caller waits and looks again); -EEXIST, taking nothing, when
 * a host allocation overlaps. Called with mem_lock held.
 */
static int gpu_take_overlapping(uintptr_t lo, uintptr_t hi, struct mem_alloc **list)
{
	size_t first, n = mem_table_overlap(&mem_allocs, lo, hi, &first);
	for (size_t i = first; i < first + n; i++) {
		if (mem_allocs.v[i]->kind != MEM_ALLOC_GPU)
			return -EEXIST;
		if (mem_allocs.v[i]->pending)
			return 1;
	}
	for (size_t i = first; i < first + n; i++) {
		mem_allocs.v[i]->next = *list;
		*list = mem_allocs.v[i];
	}
	table_remove(&mem_allocs, first, n);
	return 0;
}

/*
 * Takes out of the table, into *list, the entries of GPU allocations that
 * were freed since they were registered: the daemon's mappings of them
 * hold on to memory the process gave back, even when its addresses are
 * never passed again. One driver query per entry, outside the lock; run
 * only before a new registration, which is the slow path anyway.
 */
static void gpu_take_freed(struct mem_alloc **list)
{
	struct snap {
		uintptr_t base;
		uint64_t buffer_id, block_id;
		bool freed;
	} *s;
	size_t n = 0;
	pthread_mutex_lock(&mem_lock);
	s = malloc((mem_allocs.n ? mem_allocs.n : 1) * sizeof(*s));
	for (size_t i = 0; s && i < mem_allocs.n; i++) {
		const struct mem_alloc *a = mem_allocs.v[i];
		if (a->kind == MEM_ALLOC_GPU && !a->pending)
			s[n++] = (struct snap){a->base, a->buffer_id, a->block_id, false};
	}
	pthread_mutex_unlock(&mem_lock);
	if (!s)
		return; /* out of memory: the next registration sweeps */
	for (size_t k = 0; k < n; k++) {
		struct cudrv_ptr_info info;
		int rc = cudrv_pointer_info((const void *)s[k].base, &info);
		s[k].freed = rc == 0 || (rc > 0 && (info.base != s[k].base || info.buffer_id != s[k].buffer_id ||
		                                    info.block_id != s[k].block_id));
	}
	pthread_mutex_lock(&mem_lock);
	for (size_t k = 0; k < n; k++) {
		struct mem_alloc *a = s[k].freed ? mem_table_find(&mem_allocs, s[k].base) : NULL;
		if (a && a->kind == MEM_ALLOC_GPU && !a->pending && a->base == s[k].base && a->buffer_id == s[k].buffer_id) {
			mem_table_take(&mem_allocs, a->base);
			a->next = *list;
			*list = a;
		}
	}
	pthread_mutex_unlock(&mem_lock);
	free(s);
}

/* Drops entries taken out of the table. Their sessions may be gone, and
 * the daemon may have forgotten them already: either way nothing is left
 * to undo, so failures are not reported. */
static void gpu_release(struct mem_alloc *list)
{
	while (list) {
		struct mem_alloc *a = list;
		list = a->next;
		mem_alloc_drop(a);
	}
}

/* Registers GPU allocation n, described by info, the way its kind is
 * shared: a legacy IPC handle, or a VMM allocation's descriptor. */
static dfcclResult_t gpu_share(struct mem_alloc *n, const struct cudrv_ptr_info *info)
{
	if (info->kind == CUDRV_MEM_LEGACY) {
		uint8_t handle[CUDRV_IPC_HANDLE_BYTES];
		if (cudrv_ipc_handle(info, handle) < 0)
			return errors_set(dfcclSystemError, "cannot share GPU buffer %p with dfccld: %s", (void *)n->base,
			                  cudrv_last_error());
		return mem_alloc_register(n, DFCCL__V1__MEM_KIND__MEM_CUDA_IPC, handle, -1);
	}
	int fd = -1;
	int rc = cudrv_vmm_export(info, &fd);
	if (rc == -ENOTSUP)
		return errors_set(dfcclNotSupported, "GPU buffer %p lies in memory that is neither a cudaMalloc allocation "
		                  "nor a VMM allocation dfccld can map (%s): use cudaMalloc, cuMemCreate with "
		                  "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or dfcclMemAlloc", (void *)n->base,
		                  cudrv_last_error());
	if (rc < 0)
		return errors_set(dfcclSystemError, "cannot share GPU buffer %p with dfccld: %s", (void *)n->base,
		                  cudrv_last_error());
	dfcclResult_t r = mem_alloc_register(n, DFCCL__V1__MEM_KIND__MEM_CUDA_VMM_FD, NULL, fd);
	close(fd); /* the daemon holds its own duplicates */
	return r;
}

/*
 * Registers GPU allocation n (pending in the table) with its session, then
 * settles it: registered, with address p translated into *out, or out of
 * the table and freed. The old entries in `stale` are deregistered first,
 * so the daemon's workers let go of the memory freed under them before
 * they open what was allocated in its place.
 */
static dfcclResult_t gpu_register(struct mem_alloc *n, const struct cudrv_ptr_info *info, struct mem_alloc *stale,
                                  uintptr_t p, struct mem_ref *out)
{
	gpu_release(stale);
	dfcclResult_t r = gpu_share(n, info);

	/* Once settled, n may be replaced by another thread at any time: it is
	 * read for *out before the lock goes. */
	pthread_mutex_lock(&mem_lock);
	if (r == dfcclSuccess) {
		n->pending = false;
		alloc_ref(n, p, out);
	} else {
		mem_table_take(&mem_allocs, n->base);
	}
	pthread_cond_broadcast(&mem_settled);
	pthread_mutex_unlock(&mem_lock);
	if (r != dfcclSuccess)
		mem_alloc_free(n);
	return r;
}

/*
 * The registration of GPU allocation `info` in session c: the entry for it
 * (base, size and buffer id all match) if c registered it, else a new one,
 * replacing every entry it overlaps (allocations freed since, or
 * registered through a session that is gone).
 */
static dfcclResult_t gpu_lookup(struct client *c, const struct cudrv_ptr_info *info, uint32_t device, uintptr_t p,
                                struct mem_ref *out)
{
	struct mem_alloc *stale = NULL;
	struct mem_alloc *n = calloc(1, sizeof(*n));
	if (!n)
		return errors_set(dfcclSystemError, "out of memory");

	bool swept = false;
	pthread_mutex_lock(&mem_lock);
	for (;;) {
		struct mem_alloc *a = mem_table_find(&mem_allocs, info->base);
		bool same = a && a->kind == MEM_ALLOC_GPU && a->base == info->base && a->size == info->size &&
		            a->buffer_id == info->buffer_id && a->block_id == info->block_id;
		if (same && !a->pending && a->client == c) {
			alloc_ref(a, p, out);
			pthread_mutex_unlock(&mem_lock);
			gpu_release(stale);
			free(n);
			return dfcclSuccess;
		}
		if (same && !a->pending && !client_lost(a->client)) {
			pthread_mutex_unlock(&mem_lock);
			gpu_release(stale);
			free(n);
			return errors_set(dfcclInvalidUsage, "GPU buffer %p is registered through another connection to "
			                  "dfccld that is still open; use it with communicators of that connection", (void *)p);
		}
		if (!swept) {
			/* A new registration: the entries of allocations freed
			 * since go first; the table may change meanwhile, so look
			 * again after. */
			pthread_mutex_unlock(&mem_lock);
			gpu_take_freed(&stale);
			swept = true;
			pthread_mutex_lock(&mem_lock);
			continue;
		}
		int rc = same && a->pending ? 1 : gpu_take_overlapping(info->base, info->base + info->size, &stale);
		if (rc == 0)
			break;
		if (rc < 0) {
			pthread_mutex_unlock(&mem_lock);
			gpu_release(stale);
			free(n);
			return errors_set(dfcclInternalError, "GPU allocation [%p, +%zu) overlaps a dfcclMemAlloc allocation",
			                  (void *)info->base, info->size);
		}
		pthread_cond_wait(&mem_settled, &mem_lock);
	}
	n->id = ++mem_next_id;
	n->kind = MEM_ALLOC_GPU;
	n->base = info->base;
	n->size = info->size;
	n->memfd = -1;
	n->device = (int)device;
	n->ordinal = info->device;
	n->buffer_id = info->buffer_id;
	n->block_id = info->block_id;
	n->pending = true;
	n->client = client_ref(c);
	int rc = mem_table_insert(&mem_allocs, n);
	pthread_mutex_unlock(&mem_lock);
	if (rc < 0) {
		gpu_release(stale);
		mem_alloc_free(n);
		return errors_set(dfcclSystemError, "cannot record a GPU allocation: %s", strerror(-rc));
	}
	return gpu_register(n, info, stale, p, out);
}

/* mem_translate for a buffer that is not in host memory of dfcclMemAlloc. */
static dfcclResult_t gpu_translate(struct client *c, const void *ptr, size_t bytes, struct mem_ref *out)
{
	uintptr_t p = (uintptr_t)ptr;
	struct cudrv_ptr_info info;
	int rc = cudrv_pointer_info(ptr, &info);
	if (rc < 0)
		return errors_set(dfcclSystemError, "cannot tell whether buffer %p is GPU memory: %s", ptr,
		                  cudrv_last_error());
	if (rc == 0) {
		/* A GPU allocation that held this address was freed: its
		 * registration goes now rather than when the address is reused. */
		struct mem_alloc *stale = NULL;
		pthread_mutex_lock(&mem_lock);
		gpu_take_overlapping(p, p + 1, &stale);
		pthread_mutex_unlock(&mem_lock);
		gpu_release(stale);
		return errors_set(dfcclInvalidArgument, "buffer %p of %zu bytes is neither inside one dfcclMemAlloc "
		                  "allocation nor in GPU memory: pass memory from cudaMalloc or dfcclMemAlloc", ptr, bytes);
	}
	if (info.kind == CUDRV_MEM_POOL || info.kind == CUDRV_MEM_MANAGED)
		return errors_set(dfcclNotSupported, "GPU buffer %p lies in %s, which dfccld cannot map: use cudaMalloc, "
		                  "cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or dfcclMemAlloc", ptr,
		                  info.kind == CUDRV_MEM_POOL ? "a memory pool's allocation (cudaMallocAsync)"
		                                              : "managed memory (cudaMallocManaged)");
	if (info.kind == CUDRV_MEM_VMM && !info.fd_exportable)
		return errors_set(dfcclNotSupported, "GPU buffer %p lies in a VMM allocation (cuMemCreate) that was not "
		                  "created exportable as a POSIX file descriptor, the only way dfccld can map it: create it "
		                  "with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in CUmemAllocationProp.requestedHandleTypes", ptr);
	if (bytes > info.size - (p - info.base))
		return errors_set(dfcclInvalidArgument, "buffer %p of %zu bytes runs past the end of its GPU allocation "
		                  "[%p, +%zu): a buffer must lie inside one allocation (one cudaMalloc allocation, or one "
		                  "cuMemMap mapping)", ptr, bytes, (void *)info.base, info.size);
	struct client_device dev;
	dfcclResult_t r = client_device_map(c, info.device, &dev);
	if (r != dfcclSuccess)
		return r;
	return gpu_lookup(c, &info, dev.index, p, out);
}

dfcclResult_t mem_translate(struct client *c, const void *ptr, size_t bytes, struct mem_ref *out)
{
	uintptr_t p = (uintptr_t)ptr;
	pthread_mutex_lock(&mem_lock);
	const struct mem_alloc *a = mem_table_find(&mem_allocs, p);
	bool gpu = a ? a->kind == MEM_ALLOC_GPU : mem_gpu_served(c);
	dfcclResult_t r = gpu ? dfcclSuccess : mem_table_translate(&mem_allocs, c, ptr, bytes, out);
	/* A GPU entry of c's that holds the range: its translation, which
	 * stands while the driver gives the address the entry's ids. */
	uint64_t buffer_id = 0, block_id = 0;
	if (gpu && a && a->client == c && !a->pending && a->buffer_id != 0 && bytes <= a->size - (p - a->base)) {
		alloc_ref(a, p, out);
		buffer_id = a->buffer_id;
		block_id = a->block_id;
	}
	pthread_mutex_unlock(&mem_lock);
	if (!gpu)
		return r;
	uint64_t now_buffer, now_block;
	if (buffer_id != 0 && cudrv_pointer_ids(ptr, &now_buffer, &now_block) && now_buffer == buffer_id &&
	    now_block == block_id)
		return dfcclSuccess;
	return gpu_translate(c, ptr, bytes, out);
}

/* ---------------------------------------------------------------- host allocations */

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

/* Maps the device memory the daemon allocated for a (AllocMem): its
 * descriptor came with the reply. */
static dfcclResult_t mem_device_map(struct mem_alloc *a, struct client_reply *rep)
{
	const Dfccl__V1__AllocMemReply *m = rep->env->alloc_mem_reply;
	if (rep->nfds != 1 || m->nfds != 1 || m->size != a->size || m->map_size < a->size ||
	    m->device != (uint32_t)a->device)
		return errors_set(dfcclInternalError, "dfccld answered an allocation of %zu bytes on device %d with %llu "
		                  "bytes (of a %llu-byte allocation) on device %u and %u descriptor(s)", a->size, a->device,
		                  (unsigned long long)m->size, (unsigned long long)m->map_size, m->device, rep->nfds);
	if (cudrv_vmm_import(rep->fds[0], m->map_size, a->ordinal, &a->vmm) < 0)
		return errors_set(dfcclUnhandledCudaError, "dfcclMemAlloc: cannot map the %llu bytes of device memory "
		                  "dfccld allocated on device %d: %s", (unsigned long long)m->map_size, a->device,
		                  cudrv_last_error());
	a->base = a->vmm.base;
	a->map_size = a->vmm.size;
	return dfcclSuccess;
}

/* Device memory from the daemon (CUDA engine), registered as it is made. */
static dfcclResult_t mem_device_alloc(struct mem_alloc *a)
{
	a->kind = MEM_ALLOC_DEVICE;
	if (cudrv_init() < 0)
		return errors_set(dfcclUnhandledCudaError, "dfcclMemAlloc: dfccld runs the CUDA engine and gives device "
		                  "memory, but this process cannot use the CUDA driver: %s", cudrv_last_error());
	Dfccl__V1__AllocMem am = DFCCL__V1__ALLOC_MEM__INIT;
	am.device = (uint32_t)a->device;
	am.size = a->size;
	dfccl_envelope req = DFCCL__V1__ENVELOPE__INIT;
	req.body_case = DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM;
	req.alloc_mem = &am;
	struct client_reply rep;
	dfcclResult_t r = client_request(a->client, &req, NULL, 0, DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM_REPLY, &rep);
	if (r != dfcclSuccess)
		return r;
	a->reg_id = rep.env->alloc_mem_reply->reg_id;
	r = mem_device_map(a, &rep);
	client_reply_release(&rep); /* our mapping holds the memory now */
	if (r != dfcclSuccess)
		mem_deregister(a->client, a->reg_id);
	return r;
}

/* Host shared memory (host engine), registered as it is made. */
static dfcclResult_t mem_host_alloc(struct mem_alloc *a)
{
	dfcclResult_t r = mem_alloc_map(a);
	if (r == dfcclSuccess)
		r = mem_alloc_register(a, DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD, NULL, a->memfd);
	return r;
}

/* An allocation of session c (a reference taken) on its device dev, of
 * device memory where the daemon gives it unless host, registered and in
 * the table: *out. */
static dfcclResult_t mem_alloc_on(struct client *c, const struct client_device *dev, size_t size, bool host,
                                  struct mem_alloc **out)
{
	dfcclResult_t r;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct mem_alloc *a = calloc(1, sizeof(*a));
	if (!a)
		return errors_set(dfcclSystemError, "out of memory");
	a->memfd = -1;
	a->size = size;
	a->map_size = (size + page - 1) / page * page;
	a->client = client_ref(c);
	a->device = (int)dev->index;
	a->ordinal = dev->ordinal;
	r = !host && mem_gpu_served(a->client) ? mem_device_alloc(a) : mem_host_alloc(a);
	if (r != dfcclSuccess)
		goto fail;

	/* The mapping may lie where a GPU allocation was before it was freed
	 * and its addresses given back: those entries are stale. */
	struct mem_alloc *stale = NULL;
	pthread_mutex_lock(&mem_lock);
	a->id = ++mem_next_id;
	gpu_take_overlapping(a->base, a->base + a->size, &stale);
	int rc = mem_table_insert(&mem_allocs, a);
	pthread_mutex_unlock(&mem_lock);
	gpu_release(stale);
	if (rc < 0) {
		mem_deregister(a->client, a->reg_id);
		r = errors_set(dfcclSystemError, "cannot record an allocation: %s", strerror(-rc));
		goto fail;
	}
	*out = a;
	return dfcclSuccess;

fail:
	mem_alloc_free(a);
	return r;
}

/* dfcclMemAlloc (host: false) and dfcclMemAllocHost (true), named fn. */
static dfcclResult_t mem_alloc_new(void **ptr, size_t size, bool host, const char *fn)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	if (!ptr)
		return errors_set(dfcclInvalidArgument, "%s: ptr is NULL", fn);
	*ptr = NULL;
	if (size == 0 || size > SIZE_MAX - page)
		return errors_set(dfcclInvalidArgument, "%s: cannot allocate %zu bytes", fn, size);
	struct client *c = NULL;
	dfcclResult_t r = client_default(&c);
	struct client_device dev;
	if (r == dfcclSuccess)
		r = client_device_map(c, client_current_device(), &dev);
	struct mem_alloc *a = NULL;
	if (r == dfcclSuccess)
		r = mem_alloc_on(c, &dev, size, host, &a);
	client_unref(c);
	if (r == dfcclSuccess)
		*ptr = (void *)a->base;
	return r;
}

dfcclResult_t mem_device_words(struct client *c, const struct client_device *dev, size_t size, void **ptr,
                               uint32_t *reg_id)
{
	if (!mem_gpu_served(c))
		return errors_set(dfcclNotSupported, "dfccld runs the host engine, which has no device memory");
	struct mem_alloc *a;
	dfcclResult_t r = mem_alloc_on(c, dev, size, false, &a);
	if (r != dfcclSuccess)
		return r;
	*ptr = (void *)a->base;
	*reg_id = a->reg_id;
	return dfcclSuccess;
}

dfcclResult_t dfcclMemAlloc(void **ptr, size_t size)
{
	return mem_alloc_new(ptr, size, false, "dfcclMemAlloc");
}

dfcclResult_t dfcclMemAllocHost(void **ptr, size_t size)
{
	return mem_alloc_new(ptr, size, true, "dfcclMemAllocHost");
}

dfcclResult_t dfcclMemFree(void *ptr)
{
	if (!ptr)
		return dfcclSuccess;
	/* GPU allocations in the table are the application's, for cudaFree. */
	pthread_mutex_lock(&mem_lock);
	struct mem_alloc *a = mem_table_find(&mem_allocs, (uintptr_t)ptr);
	if (a && a->base == (uintptr_t)ptr && a->kind != MEM_ALLOC_GPU)
		mem_table_take(&mem_allocs, a->base);
	else
		a = NULL;
	pthread_mutex_unlock(&mem_lock);
	if (!a)
		return errors_set(dfcclInvalidArgument, "dfcclMemFree: %p was not returned by dfcclMemAlloc or "
		                  "dfcclMemAllocHost, or was freed already", ptr);
	return mem_alloc_drop(a);
}

/* ---------------------------------------------------------------- communicator handles */

dfcclResult_t dfcclCommRegister(const dfcclComm_t comm, void *buff, size_t size, void **handle)
{
	if (!comm || !buff || !handle || size == 0)
		return errors_set(dfcclInvalidArgument, "dfcclCommRegister: %s",
		                  !comm ? "comm is NULL" : !buff ? "buff is NULL" : !handle ? "handle is NULL" : "size is 0");
	dfcclResult_t r = comm_usable(comm);
	if (r != dfcclSuccess)
		return r;
	struct mem_ref ref;
	r = mem_translate(comm->client, buff, size, &ref);
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
	dfcclResult_t u = comm_usable(comm);
	if (u != dfcclSuccess)
		return u;
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
