/* See fd_budget.h. */
#include "fd_budget.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

static int64_t count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 64; /* no /proc: a generous guess of what a starting daemon holds */
	int64_t n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own descriptor */
}

void fd_budget_init(struct fd_budget *b, int64_t reserve, int64_t base_extra)
{
	struct rlimit rl;
	b->limit = 1024;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		if (rl.rlim_cur < rl.rlim_max) {
			struct rlimit raised = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
			if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
				rl.rlim_cur = rl.rlim_max;
		}
		b->limit = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT32_MAX ? INT32_MAX : (int64_t)rl.rlim_cur;
	}
	b->base = count_open_fds() + base_extra;
	b->used = 0;
	b->reserve = reserve;
	b->spare = -1;
	if (fd_budget_registration_cap(b) <= 0)
		log_warn("fd_budget", "the descriptor limit (%lld) leaves nothing for registrations after "
		                   "fd-reserve (%lld): raise LimitNOFILE or lower fd-reserve",
		         (long long)b->limit, (long long)reserve);
}

int64_t fd_budget_registration_cap(const struct fd_budget *b)
{
	return b->limit - b->base - b->reserve;
}

int fd_budget_charge(struct fd_budget *b, int64_t n, enum fd_use use)
{
	int64_t cap = use == FD_FOR_CONNECTION ? b->limit - b->base - FD_BUDGET_SLACK : fd_budget_registration_cap(b);
	if (n < 0 || b->used + n > cap)
		return -EMFILE;
	b->used += n;
	return 0;
}

void fd_budget_uncharge(struct fd_budget *b, int64_t n)
{
	b->used -= n;
}

void fd_budget_keep_spare(struct fd_budget *b)
{
	if (b->spare < 0)
		b->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int fd_budget_shed(struct fd_budget *b, int listen_fd)
{
	if (b->spare < 0)
		return -EMFILE;
	close(b->spare);
	b->spare = -1;
	int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
	int rc = fd < 0 ? -errno : 0;
	if (fd >= 0)
		close(fd);
	fd_budget_keep_spare(b);
	if (rc == 0)
		log_warn("fd_budget", "out of descriptors: refused a connection (descriptor limit %lld; raise the "
		                      "daemon's LimitNOFILE)", (long long)b->limit);
	return rc;
}
