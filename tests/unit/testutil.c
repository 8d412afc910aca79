/*
 * See testutil.h. These helpers deliberately do not use the code under test
 * where they produce inputs for it: raw frames are put together byte by byte
 * and sent with a plain sendmsg(), so a test of the framing code never checks
 * that code against itself.
 */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

int tu_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -errno;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	/* The directory stream itself was one of them. */
	return n - 1;
}

int tu_socketpair(int sv[2])
{
	return socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 ? -errno : 0;
}

int tu_set_rcvtimeo(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
	return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ? -errno : 0;
}

int tu_memfd(size_t size, int seal_shrink)
{
	int fd = memfd_create("dfccl-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0 || (seal_shrink && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

int tu_same_file(int a, int b)
{
	struct stat sa, sb;
	if (fstat(a, &sa) < 0 || fstat(b, &sb) < 0)
		return 0;
	return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int tu_reader_append(struct frame_reader *r, const void *data, size_t len)
{
	if (r->cap - r->len < len) {
		size_t cap = r->len + len;
		uint8_t *nb = realloc(r->buf, cap ? cap : 1);
		if (!nb)
			return -ENOMEM;
		r->buf = nb;
		r->cap = cap;
	}
	if (len)
		memcpy(r->buf + r->len, data, len);
	r->len += len;
	return 0;
}

int tu_send_raw(int sock, uint32_t len_prefix, const void *payload, size_t plen, const int *fds, unsigned nfds)
{
	if (nfds > TU_MAX_RAW_FDS)
		return -E2BIG;
	uint8_t *buf = malloc(4 + plen);
	if (!buf)
		return -ENOMEM;
	buf[0] = (uint8_t)len_prefix;
	buf[1] = (uint8_t)(len_prefix >> 8);
	buf[2] = (uint8_t)(len_prefix >> 16);
	buf[3] = (uint8_t)(len_prefix >> 24);
	if (plen)
		memcpy(buf + 4, payload, plen);
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * TU_MAX_RAW_FDS)];
	} ctrl;
	memset(&ctrl, 0, sizeof(ctrl));
	struct iovec iov = {.iov_base = buf, .iov_len = 4 + plen};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds) {
		msg.msg_control = ctrl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	int rc = n < 0 ? -errno : (int)n;
	free(buf);
	return rc;
}

/* Every builder starts from a clean envelope; the body pointer is set by the
 * caller-specific part. */
static void msg_base(struct tu_msg *m, uint64_t request_id, Dfccl__V1__Envelope__BodyCase body)
{
	memset(m, 0, sizeof(*m));
	dfccl__v1__envelope__init(&m->env);
	m->env.request_id = request_id;
	m->env.body_case = body;
}

void tu_msg_hello(struct tu_msg *m, uint64_t request_id, uint32_t min_version, uint32_t max_version)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_HELLO);
	dfccl__v1__hello__init(&m->u.hello);
	m->u.hello.min_version = min_version;
	m->u.hello.max_version = max_version;
	m->u.hello.client_name = "unit-test";
	m->env.hello = &m->u.hello;
}

void tu_msg_query(struct tu_msg *m, uint64_t request_id, Dfccl__V1__QueryKind kind)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_QUERY);
	dfccl__v1__query__init(&m->u.query);
	m->u.query.kind = kind;
	m->env.query = &m->u.query;
}

void tu_msg_attach(struct tu_msg *m, uint64_t request_id, uint32_t device, uint32_t sq_entries)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_ATTACH);
	dfccl__v1__attach_device__init(&m->u.attach);
	m->u.attach.device = device;
	m->u.attach.sq_entries = sq_entries;
	m->env.attach = &m->u.attach;
}

void tu_msg_comm_init(struct tu_msg *m, uint64_t request_id, const uint8_t *unique_id, size_t idlen,
                      uint32_t nranks, uint32_t rank, uint32_t device)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_COMM_INIT);
	dfccl__v1__comm_init__init(&m->u.comm_init);
	m->u.comm_init.unique_id.data = (uint8_t *)unique_id;
	m->u.comm_init.unique_id.len = idlen;
	m->u.comm_init.nranks = nranks;
	m->u.comm_init.rank = rank;
	m->u.comm_init.device = device;
	m->env.comm_init = &m->u.comm_init;
}

void tu_msg_comm_destroy(struct tu_msg *m, uint64_t request_id, uint64_t comm_id)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_COMM_DESTROY);
	dfccl__v1__comm_destroy__init(&m->u.comm_destroy);
	m->u.comm_destroy.comm_id = comm_id;
	m->env.comm_destroy = &m->u.comm_destroy;
}

void tu_msg_comm_abort(struct tu_msg *m, uint64_t request_id, uint64_t comm_id)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_COMM_ABORT);
	dfccl__v1__comm_abort__init(&m->u.comm_abort);
	m->u.comm_abort.comm_id = comm_id;
	m->env.comm_abort = &m->u.comm_abort;
}

void tu_msg_register_memfd(struct tu_msg *m, uint64_t request_id, uint32_t device, uint64_t size)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_REGISTER_MEM);
	dfccl__v1__register_mem__init(&m->u.register_mem);
	m->u.register_mem.kind = DFCCL__V1__MEM_KIND__MEM_HOST_MEMFD;
	m->u.register_mem.device = device;
	m->u.register_mem.size = size;
	m->env.register_mem = &m->u.register_mem;
}

void tu_msg_deregister(struct tu_msg *m, uint64_t request_id, uint32_t reg_id)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_DEREGISTER_MEM);
	dfccl__v1__deregister_mem__init(&m->u.deregister_mem);
	m->u.deregister_mem.reg_id = reg_id;
	m->env.deregister_mem = &m->u.deregister_mem;
}

void tu_msg_alloc_mem(struct tu_msg *m, uint64_t request_id, uint32_t device, uint64_t size)
{
	msg_base(m, request_id, DFCCL__V1__ENVELOPE__BODY_ALLOC_MEM);
	dfccl__v1__alloc_mem__init(&m->u.alloc_mem);
	m->u.alloc_mem.device = device;
	m->u.alloc_mem.size = size;
	m->env.alloc_mem = &m->u.alloc_mem;
}

uint32_t tu_rand(uint64_t *state, uint32_t below)
{
	uint64_t x = *state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*state = x;
	return (uint32_t)(x % below);
}

static void tu_shuffle(uint8_t *v, uint32_t n, uint64_t *state)
{
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = tu_rand(state, i + 1);
		uint8_t t = v[i];
		v[i] = v[j], v[j] = t;
	}
}

void tu_random_plan(struct dfccl_comm_plan *p, uint32_t n, uint8_t algo, uint64_t *state)
{
	memset(p, 0, sizeof(*p));
	uint8_t order[DFCCL_COMM_MAX_RANKS];
	for (uint32_t r = 0; r < n; r++)
		order[r] = (uint8_t)r;
	tu_shuffle(order, n, state);
	memcpy(p->ring, order, n);
	p->ntrees = (uint8_t)(n < DFCCL_PLAN_TREES ? n : DFCCL_PLAN_TREES);
	for (uint32_t k = 0; k < p->ntrees; k++) {
		tu_shuffle(order, n, state);
		unsigned nchild[DFCCL_COMM_MAX_RANKS] = {0};
		p->parent[k][order[0]] = DFCCL_PLAN_NO_PARENT;
		for (uint32_t i = 1; i < n; i++) {
			uint32_t par = tu_rand(state, 4) == 0 ? order[i - 1] : order[tu_rand(state, i)];
			while (nchild[par] >= 7)
				par = order[tu_rand(state, i)];
			nchild[par]++;
			p->parent[k][order[i]] = (uint8_t)par;
		}
	}
	memset(p->algo, algo, sizeof(p->algo));
	p->valid = DFCCL_PLAN_VALID;
}
