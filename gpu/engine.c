/*
 * See engine.h: the choice of implementation, and calls forwarded to its
 * ops table. Nothing here knows how an engine works.
 */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "host_engine.h"
#if defined(DFCCL_HAVE_CUDA)
#include "cuda_engine.h"
#endif

struct engine {
	const struct engine_ops *ops;
	void *impl;
};

int engine_new(int kind, const struct engine_config *cfg, struct engine **out, char *err, size_t errlen)
{
	*out = NULL;
	struct engine *e = calloc(1, sizeof(*e));
	if (!e) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	int rc;
	if (kind == ENGINE_HOST) {
		rc = host_engine_ops_new(cfg, &e->ops, &e->impl);
		if (rc < 0)
			snprintf(err, errlen, "cannot create the host engine: %d", rc);
	} else if (kind == ENGINE_CUDA) {
#if defined(DFCCL_HAVE_CUDA)
		rc = cuda_engine_ops_new(cfg, &e->ops, &e->impl, err, errlen);
#else
		snprintf(err, errlen, "this dfccld was built without CUDA: the cuda engine is not available");
		rc = -ENOTSUP;
#endif
	} else {
		snprintf(err, errlen, "unknown engine kind %d", kind);
		rc = -EINVAL;
	}
	if (rc < 0) {
		free(e);
		return rc;
	}
	*out = e;
	return 0;
}

void engine_free(struct engine *e)
{
	if (!e)
		return;
	e->ops->free(e->impl);
	free(e);
}

int engine_qp_add(struct engine *e, struct sq_queue *q, char *err, size_t errlen)
{
	return e->ops->qp_add(e->impl, q, err, errlen);
}

void engine_qp_del(struct engine *e, struct sq_queue *q)
{
	e->ops->qp_del(e->impl, q);
}

int engine_reg_add(struct engine *e, const struct sq_reg *r, const struct engine_mem_src *src, char *err,
                   size_t errlen)
{
	return e->ops->reg_add(e->impl, r, src, err, errlen);
}

void engine_reg_del(struct engine *e, uint32_t reg_id)
{
	e->ops->reg_del(e->impl, reg_id);
}

int engine_mem_alloc(struct engine *e, uint32_t reg_id, uint64_t size, int *fd, uint64_t *alloc_size, char *err,
                     size_t errlen)
{
	if (!e->ops->mem_alloc) {
		snprintf(err, errlen, "the %s engine has no device memory to allocate", e->ops->name);
		return -ENOTSUP;
	}
	return e->ops->mem_alloc(e->impl, reg_id, size, fd, alloc_size, err, errlen);
}

int engine_comm_add(struct engine *e, uint64_t comm_id, uint32_t nranks, const struct engine_member *members,
                    void *region, size_t region_size, char *err, size_t errlen)
{
	return e->ops->comm_add(e->impl, comm_id, nranks, members, region, region_size, err, errlen);
}

int engine_comm_export(struct engine *e, uint64_t comm_id, void *blob, size_t *len, char *err, size_t errlen)
{
	*len = 0;
	return e->ops->comm_export ? e->ops->comm_export(e->impl, comm_id, blob, len, err, errlen) : 0;
}

int engine_comm_peers(struct engine *e, uint64_t comm_id, const struct engine_peer_blob *peers, size_t n, char *err,
                      size_t errlen)
{
	return e->ops->comm_peers ? e->ops->comm_peers(e->impl, comm_id, peers, n, err, errlen) : 0;
}

void engine_comm_abort(struct engine *e, uint64_t comm_id, uint32_t status)
{
	e->ops->comm_abort(e->impl, comm_id, status);
}

void engine_comm_del(struct engine *e, uint64_t comm_id)
{
	e->ops->comm_del(e->impl, comm_id);
}

void engine_comm_free(struct engine *e, uint64_t comm_id)
{
	if (e->ops->comm_free)
		e->ops->comm_free(e->impl, comm_id);
}

unsigned engine_poll(struct engine *e)
{
	return e->ops->poll(e->impl);
}

int engine_busy(struct engine *e, uint64_t *pause_ns)
{
	return e->ops->busy(e->impl, pause_ns);
}

int engine_sleep(struct engine *e)
{
	return e->ops->sleep(e->impl);
}

void engine_wake(struct engine *e)
{
	e->ops->wake(e->impl);
}

const char *engine_fatal(const struct engine *e)
{
	return e->ops->fatal ? e->ops->fatal(e->impl) : NULL;
}

const char *engine_name(const struct engine *e)
{
	return e->ops->name;
}
