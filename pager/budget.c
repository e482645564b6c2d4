/*
 * budget.c - where the budget comes from.
 *
 * Given (--budget SIZE), it is what the operator said.  Automatic (--budget
 * auto, the default), it is the memory limit the daemon runs under less a
 * reserve:
 *   - the limit of its memory cgroup, with the parents' (v1: the
 *     hierarchical_memory_limit in memory.stat; v2: the smallest memory.max
 *     on the way up), when there is one;
 *   - else what the system has available (MemAvailable) plus what the
 *     daemon and its engines already use, so that loading layers does not
 *     lower the budget it is loading them for.
 * The reserve, max(64 MiB, 1/16 of the limit), is for what nobody declares:
 * the processes' code and page tables, the daemon's heap, the kernel's
 * memory for all of them.  The daemon measures again once a second
 * (pager_budget_follow) and re-plans when the budget moved by more than
 * 1/32: an operator who changes the cgroup's limit, or other programs that
 * take or give back memory, move the plan with them.
 */
#include "server_i.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define RESERVE_MIN (64ull << 20)
#define NO_LIMIT (1ull << 60) /* cgroup v1 says "no limit" with ~2^63 */

static const char *const source_names[] = {
	[BUDGET_NONE] = "none",
	[BUDGET_GIVEN] = "given",
	[BUDGET_CGROUP_V1] = "cgroup-v1",
	[BUDGET_CGROUP_V2] = "cgroup-v2",
	[BUDGET_MEMAVAILABLE] = "memavailable",
};

const char *pager_budget_source_name(enum budget_source s)
{
	return source_names[s];
}

/* The first line of path parsed as a number ("max": NO_LIMIT).  0 or -errno. */
static int read_limit(const char *path, uint64_t *out)
{
	char line[64], *end;
	FILE *f = fopen(path, "re");
	int rc = 0;

	if (!f)
		return -errno;
	if (!fgets(line, sizeof(line), f)) {
		rc = -EIO;
	} else if (!strncmp(line, "max", 3)) {
		*out = NO_LIMIT;
	} else {
		errno = 0;
		*out = strtoull(line, &end, 10);
		if (errno || end == line)
			rc = -EINVAL;
	}
	fclose(f);
	return rc;
}

/* The value of `key` in a "key value" file (memory.stat, /proc/meminfo),
 * times `unit`.  0 or -errno. */
static int read_key(const char *path, const char *key, uint64_t unit, uint64_t *out)
{
	char line[256];
	size_t n = strlen(key);
	FILE *f = fopen(path, "re");
	int rc = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && (line[n] == ' ' || line[n] == ':')) {
			char *v = line + n + 1, *end;

			errno = 0;
			*out = strtoull(v, &end, 10) * unit;
			rc = errno || end == v ? -EINVAL : 0;
			break;
		}
	fclose(f);
	return rc;
}

/*
 * The memory limit of the cgroup this process is in, with its parents'.
 * 0 with *limit (NO_LIMIT or more: none) and a description in where; -errno
 * when it cannot be read (no memory controller is not an error: NO_LIMIT).
 */
static int cgroup_limit(uint64_t *limit, enum budget_source *src, char *where, size_t len)
{
	char line[4096], path[4096 + 64];
	FILE *f = fopen("/proc/self/cgroup", "re");
	int rc = 0;

	*limit = NO_LIMIT;
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *nl = strchr(line, '\n'), *v1 = strstr(line, ":memory:");

		if (nl)
			*nl = 0;
		if (v1) { /* v1: "N:memory:/path" */
			snprintf(path, sizeof(path), "/sys/fs/cgroup/memory%s/memory.stat",
				 v1 + 8);
			rc = read_key(path, "hierarchical_memory_limit", 1, limit);
			*src = BUDGET_CGROUP_V1;
			snprintf(where, len, "%.200s", v1 + 8);
			break;
		}
		if (!strncmp(line, "0::", 3)) { /* v2: the smallest memory.max upwards */
			char *cg = line + 3, *slash;

			for (;;) {
				uint64_t v = NO_LIMIT;

				snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", cg);
				if (!read_limit(path, &v) && v < *limit) {
					*limit = v;
					*src = BUDGET_CGROUP_V2;
					snprintf(where, len, "%.200s", *cg ? cg : "/");
				}
				slash = strrchr(cg, '/');
				if (!slash || slash == cg)
					break;
				*slash = 0;
			}
		}
	}
	fclose(f);
	return rc;
}

/* Bytes of memory the memfd fd has (its pages, not its size). */
static uint64_t allocated(int fd)
{
	struct stat st;

	return fd >= 0 && !fstat(fd, &st) ? (uint64_t)st.st_blocks * 512 : 0;
}

/* What the daemon and its engines have taken of the system's memory: the
 * models' pages (allocated, not planned: reads in flight have not taken
 * theirs yet) and what the engines declared. */
static uint64_t in_use(const struct pager *p)
{
	uint64_t n = pager_declared_connected(p);

	for (unsigned i = 0; i < p->n_models; i++)
		n += allocated(p->models[i].memfd) + allocated(p->models[i].slotfd);
	return n;
}

static uint64_t reserve_for(uint64_t limit)
{
	return limit / 16 > RESERVE_MIN ? limit / 16 : RESERVE_MIN;
}

int pager_budget_measure(const struct pager *p, struct budget *b)
{
	uint64_t limit, avail;
	int rc;

	rc = cgroup_limit(&limit, &b->source, b->where, sizeof(b->where));
	if (rc && !b->warned) {
		pager_log_errno(PAGER_LOG_NOTICE, rc,
				"the memory cgroup's limit could not be read; the budget follows "
				"MemAvailable");
		b->warned = true;
	}
	if (rc || limit >= NO_LIMIT) {
		rc = read_key("/proc/meminfo", "MemAvailable", 1024, &avail);
		if (rc)
			return rc;
		b->source = BUDGET_MEMAVAILABLE;
		snprintf(b->where, sizeof(b->where), "/proc/meminfo");
		limit = avail + in_use(p);
	}
	b->limit = limit;
	b->reserve = reserve_for(limit);
	b->bytes = limit > b->reserve ? limit - b->reserve : 0;
	return 0;
}

int pager_budget_headroom(const struct pager *p, bool cache_free, uint64_t *out)
{
	const struct budget *b = &p->budget;
	char path[sizeof(b->where) + 64];
	uint64_t used;
	int rc;

	uint64_t cache = 0;
	bool v1 = b->source == BUDGET_CGROUP_V1;

	switch (b->source) {
	case BUDGET_CGROUP_V1:
	case BUDGET_CGROUP_V2:
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s%s/%s", v1 ? "/memory" : "", b->where,
			 v1 ? "memory.usage_in_bytes" : "memory.current");
		rc = read_limit(path, &used);
		if (rc)
			return rc;
		/* page cache nobody has touched lately is free for the taking */
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s%s/memory.stat", v1 ? "/memory" : "",
			 b->where);
		if (!cache_free ||
		    read_key(path, v1 ? "total_inactive_file" : "inactive_file", 1, &cache))
			cache = 0;
		used = used > cache ? used - cache : 0;
		*out = b->limit > used ? b->limit - used : 0;
		return 0;
	default:
		return read_key("/proc/meminfo", cache_free ? "MemAvailable" : "MemFree", 1024, out);
	}
}

bool pager_budget_follow(struct pager *p)
{
	struct budget b = p->budget;
	uint64_t old = p->cfg.budget, d;

	if (!p->cfg.budget_auto || pager_budget_measure(p, &b))
		return false;
	d = b.bytes > old ? b.bytes - old : old - b.bytes;
	p->budget = b;
	if (d <= old / 32)
		return false;
	p->cfg.budget = b.bytes;
	pager_log(PAGER_LOG_NOTICE, "budget %.1f -> %.1f MiB (%s %.1f MiB, less %.1f MiB)",
		  old / 1048576.0, b.bytes / 1048576.0,
		  b.source == BUDGET_MEMAVAILABLE ? "available and in use" : "memory cgroup limit",
		  b.limit / 1048576.0, b.reserve / 1048576.0);
	if (b.bytes < p->plan.minimum)
		pager_log(PAGER_LOG_WARNING,
			  "the budget is below the %.1f MiB that streaming needs: memory use will "
			  "exceed it", p->plan.minimum / 1048576.0);
	pager_replan(p);
	return true;
}
