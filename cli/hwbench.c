/*
 * hwbench.c - measure memory and storage read bandwidth (see hwbench.h).
 *
 * Memory: one anonymous mapping, on 2 MiB pages where the kernel gives them,
 * split into equal 4 KiB-aligned parts, one per thread.  Each pass starts a
 * thread per part (the caller reads part 0), and is timed from before the
 * first thread starts to after the last one is joined; thread start-up
 * costs tens of microseconds against tens of milliseconds per pass over 1
 * GiB.  Every page is written before the first pass: an anonymous page
 * never written reads as the one shared zero page, which would stay in
 * cache.  The loads are AVX2 (when the CPU has it) and their sum goes to a
 * volatile sink, so the compiler cannot drop them.
 *
 * Headroom: what the process may still allocate, read from its memory
 * cgroup (and each one above it) and /proc/meminfo, for the caller to size
 * the memory buffer by; every file parsed as hostile, any of them missing.
 *
 * Storage: a single-threaded io_uring loop keeping `depth` O_DIRECT reads of
 * `chunk` bytes in flight, each into its own slot of one aligned buffer.  A
 * slot is reused only after its read completed; the buffer is freed only
 * once nothing is in flight.
 */
#include "hwbench.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <limits.h>
#include <liburing.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- memory ------------------------------------------------------------ */

/* n is a multiple of 256 and p 32-byte aligned (parts are whole pages). */
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t n)
{
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
	uint64_t lanes[4];

	for (size_t i = 0; i < n; i += 256) {
		const __m256i *v = (const __m256i *)(const void *)(p + i);

		a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 0));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 1));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 2));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 3));
		a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 4));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 5));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 6));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 7));
	}
	a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
	_mm256_storeu_si256((__m256i *)(void *)lanes, a0);
	return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

static uint64_t sum_scalar(const uint8_t *p, size_t n)
{
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;

	for (size_t i = 0; i < n; i += 32) {
		uint64_t v[4];

		memcpy(v, p + i, sizeof(v));
		s0 += v[0];
		s1 += v[1];
		s2 += v[2];
		s3 += v[3];
	}
	return s0 + s1 + s2 + s3;
}

static volatile uint64_t sink;

struct mem_part {
	uint8_t *p;
	size_t n;
	bool touch;
	uint64_t sum;
	pthread_t tid;
};

static void *mem_thread(void *arg)
{
	struct mem_part *w = arg;

	if (w->touch)
		memset(w->p, 1, w->n);
	else if (__builtin_cpu_supports("avx2"))
		w->sum += sum_avx2(w->p, w->n);
	else
		w->sum += sum_scalar(w->p, w->n);
	return NULL;
}

/* Run every part at once, part 0 on the caller.  0 or -errno. */
static int run_parts(struct mem_part *parts, unsigned n)
{
	unsigned i;
	int rc = 0;

	for (i = 1; i < n; i++) {
		rc = -pthread_create(&parts[i].tid, NULL, mem_thread, &parts[i]);
		if (rc)
			break;
	}
	mem_thread(&parts[0]);
	for (unsigned j = 1; j < i; j++)
		pthread_join(parts[j].tid, NULL);
	return rc;
}

struct hwbench_mem {
	uint8_t *buf;  /* hwbench_huge_alloc(size) */
	size_t size;
	uint64_t huge; /* of buf's bytes, on 2 MiB pages */
	unsigned n;
	struct mem_part *parts;
};

#define HUGE ((size_t)2 << 20)

/* n rounded up to whole 2 MiB pages; 0 for 0 or too large */
static size_t huge_len(size_t n)
{
	return n > SIZE_MAX - HUGE ? 0 : (n + HUGE - 1) & ~(HUGE - 1);
}

/*
 * 2 MiB pages where the kernel has them, as the weights of a model that fits
 * are mapped (session.c, advise_huge_pages): on a guest whose every TLB miss
 * is a nested walk, one thread read 4 KiB pages at 0.75 of the rate it read
 * 2 MiB ones, two threads at 0.7 (docs/benchmarks.md, issue 16, session 54),
 * and a probe or kernel benchmark slower than the decode it stands for
 * flatters it.  A mapping of its own, not malloc's: the advice must come
 * before any page is written, and malloc may write them first
 * (MALLOC_PERTURB_, which meson's test runner sets).  The pages come when
 * first written.
 */
void *hwbench_huge_alloc(size_t n)
{
	size_t len = huge_len(n);
	uint8_t *map, *p;

	if (!len || len > SIZE_MAX - HUGE)
		return NULL;
	map = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED)
		return NULL;
	/* keep the 2 MiB-aligned len bytes, unmap the slack either side */
	p = (uint8_t *)(((uintptr_t)map + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
	if (p > map)
		munmap(map, (size_t)(p - map));
	munmap(p + len, (size_t)(map + HUGE - p));
	(void)madvise(p, len, MADV_HUGEPAGE); /* EINVAL without THP: small pages */
	return p;
}

void hwbench_huge_free(void *p, size_t n)
{
	if (p)
		munmap(p, huge_len(n));
}

int hwbench_mem_open(unsigned n_threads, uint64_t bytes, struct hwbench_mem **out)
{
	struct hwbench_mem *m;
	size_t per;
	int rc;

	*out = NULL;
	if (n_threads < 1 || n_threads > 1024 || bytes > SIZE_MAX)
		return -EINVAL;
	per = (size_t)bytes / n_threads / PAGE * PAGE;
	if (per == 0)
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->n = n_threads;
	m->size = per * n_threads;
	m->parts = calloc(n_threads, sizeof(*m->parts));
	if (!m->parts) {
		rc = -ENOMEM;
		goto fail;
	}
	/* written by the touch pass below, each thread its own part */
	m->buf = hwbench_huge_alloc(m->size);
	if (!m->buf) {
		rc = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < n_threads; i++) {
		m->parts[i].p = m->buf + (size_t)i * per;
		m->parts[i].n = per;
		m->parts[i].touch = true;
	}
	rc = run_parts(m->parts, n_threads);
	for (unsigned i = 0; i < n_threads; i++)
		m->parts[i].touch = false;
	if (rc)
		goto fail;
	m->huge = hwbench_pmd_mapped_bytes(m->buf, m->size);
	*out = m;
	return 0;
fail:
	hwbench_mem_close(m);
	return rc;
}

int hwbench_mem_pass(struct hwbench_mem *m, struct hwbench_result *out)
{
	double t0 = now_s(), t;
	uint64_t sum = 0;
	int rc = run_parts(m->parts, m->n);

	t = now_s() - t0;
	if (rc)
		return rc;
	for (unsigned i = 0; i < m->n; i++)
		sum += m->parts[i].sum;
	sink += sum;
	out->bytes = m->size;
	out->seconds = t;
	out->gbps = t > 0 ? m->size / t / 1e9 : 0;
	out->huge_bytes = m->huge;
	return 0;
}

void hwbench_mem_close(struct hwbench_mem *m)
{
	if (!m)
		return;
	hwbench_huge_free(m->buf, m->size);
	free(m->parts);
	free(m);
}

int hwbench_mem_read(unsigned n_threads, uint64_t bytes, unsigned passes,
		     struct hwbench_result *out)
{
	struct hwbench_mem *m;
	int rc;

	memset(out, 0, sizeof(*out));
	if (passes < 1)
		return -EINVAL;
	rc = hwbench_mem_open(n_threads, bytes, &m);
	if (rc)
		return rc;
	for (unsigned pass = 0; pass < passes && rc == 0; pass++) {
		struct hwbench_result r;

		rc = hwbench_mem_pass(m, &r);
		if (rc == 0 && (pass == 0 || r.seconds < out->seconds))
			*out = r;
	}
	hwbench_mem_close(m);
	if (rc)
		memset(out, 0, sizeof(*out));
	return rc;
}

/*
 * Bytes of the mappings overlapping [p, p + n) that the process reaches
 * through 2 MiB page-table entries: AnonHugePages, FilePmdMapped and
 * ShmemPmdMapped in /proc/self/smaps (a mapping has one of the three).
 * Walks the page tables: not for a timed interval.  0 where /proc cannot
 * tell.
 */
uint64_t hwbench_pmd_mapped_bytes(const void *p, size_t n)
{
	uintptr_t lo = (uintptr_t)p, hi = lo + n;
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[PATH_MAX + 256]; /* a mapping's line ends in its path */
	bool inside = false;
	uint64_t total = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long start, end;
		unsigned long long kb;

		if (sscanf(line, "%lx-%lx ", &start, &end) == 2)
			inside = start < hi && end > lo;
		else if (inside && (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1 ||
				    sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1 ||
				    sscanf(line, "ShmemPmdMapped: %llu kB", &kb) == 1))
			total += (uint64_t)kb * 1024;
	}
	fclose(f);
	return total;
}

/* ---- headroom ---------------------------------------------------------- */

/* The text of a small file at root + path, NUL-terminated, or -errno:
 * -EFBIG when it fills buf (a truncated file would parse as a different
 * one). */
static int read_text(const char *root, const char *path, char *buf, size_t len)
{
	char full[PATH_MAX];
	size_t n = 0;
	int fd, rc = 0;

	if ((size_t)snprintf(full, sizeof(full), "%s%s", root, path) >= sizeof(full))
		return -ENAMETOOLONG;
	fd = open(full, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t r = read(fd, buf + n, len - 1 - n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = -errno;
			break;
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (n == len - 1) {
			rc = -EFBIG;
			break;
		}
	}
	close(fd);
	if (rc)
		return rc;
	buf[n] = '\0';
	return 0;
}

/* A decimal number from s up to end (or the NUL): digits only, no sign, no
 * overflow, at least one digit. */
static int parse_u64(const char *s, const char *end, uint64_t *out)
{
	uint64_t v = 0;

	if (s == end || !*s)
		return -EINVAL;
	for (; s != end && *s; s++) {
		unsigned d = (unsigned)(*s - '0');

		if (d > 9 || v > (UINT64_MAX - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* A cgroup file holding one number and a newline; "max" (v2) is
 * UINT64_MAX. */
static int read_u64(const char *root, const char *path, uint64_t *out)
{
	char buf[64];
	size_t n;
	int rc = read_text(root, path, buf, sizeof(buf));

	if (rc)
		return rc;
	n = strlen(buf);
	if (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	if (!strcmp(buf, "max")) {
		*out = UINT64_MAX;
		return 0;
	}
	return parse_u64(buf, buf + n, out);
}

/* MemAvailable of /proc/meminfo, in bytes. */
static int mem_available(const char *root, uint64_t *out)
{
	static const char key[] = "\nMemAvailable:";
	char buf[8192];
	const char *p, *end;
	uint64_t kib;
	int rc;

	/* The key is looked for after a newline: put one in front. */
	buf[0] = '\n';
	rc = read_text(root, "/proc/meminfo", buf + 1, sizeof(buf) - 1);
	if (rc)
		return rc;
	p = strstr(buf, key);
	if (!p)
		return -ENOENT;
	p += sizeof(key) - 1;
	while (*p == ' ' || *p == '\t')
		p++;
	end = p + strspn(p, "0123456789");
	if (strncmp(end, " kB\n", 4) || parse_u64(p, end, &kib) || kib > UINT64_MAX / 1024)
		return -EINVAL;
	*out = kib * 1024;
	return 0;
}

/*
 * The process's memory cgroup as a directory under root: the v1 memory
 * hierarchy's when there is one (a hybrid system also lists v2's "0::"
 * line, with no memory controller in it), else v2's.  *v2 says which.
 */
static int cgroup_dir(const char *root, char *dir, size_t len, bool *v2)
{
	char buf[16384];
	const char *v1_path = NULL, *v2_path = NULL, *path;
	size_t n;
	int rc = read_text(root, "/proc/self/cgroup", buf, sizeof(buf));

	if (rc)
		return rc;
	/* Lines "ID:controller,controller:/path"; the path may hold ':'. */
	for (char *line = buf, *next; *line; line = next) {
		char *nl = strchr(line, '\n'), *c1, *c2;

		if (!nl)
			return -EINVAL; /* every line ends with a newline */
		*nl = '\0';
		next = nl + 1;
		c1 = strchr(line, ':');
		c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			return -EINVAL;
		*c1 = '\0';
		*c2 = '\0';
		if (!strcmp(line, "0") && c2 == c1 + 1) {
			v2_path = c2 + 1;
			continue;
		}
		for (char *tok = c1 + 1, *comma; tok; tok = comma ? comma + 1 : NULL) {
			comma = strchr(tok, ',');
			if (comma)
				*comma = '\0';
			if (!strcmp(tok, "memory"))
				v1_path = c2 + 1;
		}
	}
	if (!v1_path && !v2_path)
		return -ENOENT;
	*v2 = !v1_path;
	path = v1_path ? v1_path : v2_path;
	n = strlen(path);
	/* A cgroup outside the reader's cgroup namespace reads "/../x": not
	 * ours to follow, nor anything else that leaves the hierarchy. */
	if (path[0] != '/' || strstr(path, "/../") || (n >= 3 && !strcmp(path + n - 3, "/..")))
		return -EINVAL;
	if ((size_t)snprintf(dir, len, "%s%s", v1_path ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup",
			     path) >= len)
		return -ENAMETOOLONG;
	return 0;
}

static int read_cg(const char *root, const char *dir, const char *name, uint64_t *out)
{
	char path[PATH_MAX];

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path))
		return -ENAMETOOLONG;
	return read_u64(root, path, out);
}

/* limit - usage of one cgroup directory (0 when at or over it), or -errno. */
static int cgroup_room(const char *root, const char *dir, bool v2, uint64_t *out)
{
	uint64_t limit, high = UINT64_MAX, usage;
	int rc = read_cg(root, dir, v2 ? "memory.max" : "memory.limit_in_bytes", &limit);

	if (!rc)
		rc = read_cg(root, dir, v2 ? "memory.current" : "memory.usage_in_bytes", &usage);
	/* Over memory.high the kernel throttles and reclaims: no kill, but
	 * nothing worth timing either.  v1 has no such level. */
	if (!rc && v2) {
		rc = read_cg(root, dir, "memory.high", &high);
		if (rc == -ENOENT)
			rc = 0;
	}
	if (rc)
		return rc;
	if (high < limit)
		limit = high;
	/* v1 writes "no limit" as its page counter's maximum in bytes, 2^63
	 * less a page: anything from 2^62 (4 EiB) on is no limit. */
	if (limit >= 1ull << 62)
		*out = UINT64_MAX;
	else
		*out = limit > usage ? limit - usage : 0;
	return 0;
}

/*
 * The smallest room of the cgroup and each one above it: a parent's limit
 * holds for all its children together, and a child may have none of its
 * own.  Levels that cannot be read count as unlimited (v2's root has no
 * memory.max); -errno when none could be read.
 */
static int cgroup_headroom(const char *root, uint64_t *out)
{
	char dir[PATH_MAX];
	size_t base;
	bool v2, any = false;
	int rc = cgroup_dir(root, dir, sizeof(dir), &v2), last = -ENOENT;

	if (rc)
		return rc;
	base = strlen(v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
	*out = UINT64_MAX;
	for (;;) {
		size_t n = strlen(dir);
		uint64_t room;
		char *slash;

		while (n > base && dir[n - 1] == '/')
			dir[--n] = '\0';
		rc = cgroup_room(root, dir, v2, &room);
		if (rc == 0) {
			any = true;
			if (room < *out)
				*out = room;
		} else {
			last = rc;
		}
		if (n <= base)
			break;
		slash = strrchr(dir + base, '/');
		*slash = '\0'; /* not NULL: dir + base starts with '/' */
	}
	return any ? 0 : last;
}

int hwbench_mem_headroom(const char *root, struct hwbench_headroom *out)
{
	int crc = cgroup_headroom(root, &out->cgroup);
	int mrc = mem_available(root, &out->available);

	if (crc)
		out->cgroup = UINT64_MAX;
	if (mrc)
		out->available = UINT64_MAX;
	out->bytes = out->cgroup < out->available ? out->cgroup : out->available;
	return crc && mrc ? mrc : 0;
}

/* ---- storage ----------------------------------------------------------- */

struct io_slot {
	uint8_t *buf; /* where the rest of this read lands */
	uint64_t off; /* file offset of the rest */
	uint64_t len; /* bytes still to read */
};

static int __attribute__((format(printf, 4, 5)))
io_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

static void prep(struct io_uring *ring, int fd, struct io_slot *s, unsigned idx, bool fresh)
{
	/* Never NULL: the ring has `depth` entries and each slot has at most
	 * one read queued or in flight.  Slots are at most `chunk` bytes,
	 * checked to fit an unsigned. */
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	assert(sqe);
	io_uring_prep_read(sqe, fd, s->buf, (unsigned)s->len, s->off);
	/* New pages are allocated and zeroed by the read; on the ring's
	 * workers, in parallel, as stratad submits them (pager/io.c). */
	if (fresh)
		sqe->flags |= IOSQE_ASYNC;
	io_uring_sqe_set_data64(sqe, idx);
}

/* `len` bytes of a new memfd, mapped; its pages are allocated by the
 * reads into them.  0 or -errno. */
static int fresh_region(size_t len, uint8_t **out)
{
	int mfd = memfd_create("strata-iobench", MFD_CLOEXEC), rc = 0;
	void *p;

	if (mfd < 0)
		return -errno;
	if (ftruncate(mfd, (off_t)len)) {
		rc = -errno;
		goto out;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (p == MAP_FAILED)
		rc = -errno;
	else
		*out = p;
out:
	close(mfd); /* the mapping keeps the memory */
	return rc;
}

int hwbench_storage_read(const char *path, const struct hwbench_io_config *cfg,
			 struct hwbench_result *out, char *err, size_t errlen)
{
	uint64_t chunk = cfg && cfg->chunk ? cfg->chunk : 1u << 20;
	unsigned depth = cfg && cfg->depth ? cfg->depth : 16;
	bool fresh = cfg && cfg->fresh;
	uint64_t size, region, n_chunks, total, next = 0, bytes = 0;
	unsigned inflight = 0, n_free;
	unsigned *free_slots = NULL;
	struct io_slot *slots = NULL;
	struct io_uring ring;
	struct statfs sfs;
	struct stat st;
	uint8_t *buf = NULL;
	size_t buf_len = 0;
	bool leak = false;
	double t0;
	int fd, rc = 0;

	memset(out, 0, sizeof(*out));
	if (chunk % PAGE || chunk > 1u << 30 || depth > 256 || (fresh && cfg->min_bytes))
		return io_fail(err, errlen, -EINVAL, "invalid chunk size or depth");
	fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		if (rc == -EINVAL)
			return io_fail(err, errlen, rc, "the file system refuses O_DIRECT");
		return io_fail(err, errlen, rc, "%s", strerror(-rc));
	}
	if (fstat(fd, &st) || fstatfs(fd, &sfs)) {
		rc = io_fail(err, errlen, -errno, "%s", strerror(errno));
		goto err_fd;
	}
	if (sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC) {
		rc = io_fail(err, errlen, -EOPNOTSUPP,
			     "the file is on tmpfs, in memory: there is no storage to read");
		goto err_fd;
	}
	if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
		rc = io_fail(err, errlen, -EINVAL, "not a regular file with data");
		goto err_fd;
	}
	size = (uint64_t)st.st_size;
	region = size;
	if (cfg && cfg->max_bytes && cfg->max_bytes < size) {
		/* Whole pages, at least one. */
		region = cfg->max_bytes - cfg->max_bytes % PAGE;
		if (region == 0)
			region = PAGE;
	}
	n_chunks = (region + chunk - 1) / chunk;
	total = n_chunks;
	if (cfg && cfg->min_bytes > region)
		total = n_chunks * ((cfg->min_bytes + region - 1) / region);

	slots = calloc(depth, sizeof(*slots));
	free_slots = calloc(depth, sizeof(*free_slots));
	if (!slots || !free_slots) {
		rc = io_fail(err, errlen, -ENOMEM, "out of memory");
		goto err_mem;
	}
	if (fresh) {
		/* Whole chunks: the tail's read asks for whole pages. */
		buf_len = n_chunks * chunk;
		rc = fresh_region(buf_len, &buf);
		if (rc) {
			io_fail(err, errlen, rc, "a memfd of %llu bytes: %s",
				(unsigned long long)buf_len, strerror(-rc));
			goto err_mem;
		}
	} else if (posix_memalign((void **)&buf, PAGE, chunk * depth)) {
		buf = NULL;
		rc = io_fail(err, errlen, -ENOMEM, "out of memory");
		goto err_mem;
	}
	rc = io_uring_queue_init(depth, &ring, 0);
	if (rc < 0) {
		io_fail(err, errlen, rc, "io_uring: %s", strerror(-rc));
		goto err_mem;
	}
	for (n_free = 0; n_free < depth; n_free++)
		free_slots[n_free] = n_free;

	t0 = now_s();
	while (inflight || (next < total && !rc)) {
		struct io_uring_cqe *cqe;
		int ret;

		while (!rc && next < total && n_free) {
			unsigned idx = free_slots[--n_free];
			struct io_slot *s = &slots[idx];

			s->off = next % n_chunks * chunk;
			s->len = region - s->off < chunk ? region - s->off : chunk;
			/* The tail of an unaligned file: ask for whole pages,
			 * the read stops at the end of the file. */
			s->len = (s->len + PAGE - 1) / PAGE * PAGE;
			s->buf = buf + (fresh ? s->off : (size_t)idx * chunk);
			prep(&ring, fd, s, idx, fresh);
			next++;
			inflight++;
		}
		ret = io_uring_submit_and_wait(&ring, 1);
		if (ret < 0 && ret != -EINTR) {
			/* Reads may still land in buf: keep it. */
			rc = io_fail(err, errlen, ret, "io_uring: %s", strerror(-ret));
			leak = inflight != 0;
			break;
		}
		while (io_uring_peek_cqe(&ring, &cqe) == 0) {
			unsigned idx = (unsigned)io_uring_cqe_get_data64(cqe);
			struct io_slot *s = &slots[idx];
			int res = cqe->res;

			io_uring_cqe_seen(&ring, cqe);
			if (res == -EINTR || res == -EAGAIN) {
				prep(&ring, fd, s, idx, fresh);
				continue;
			}
			if (res < 0 || (res == 0 && s->off < size)) {
				if (!rc)
					rc = io_fail(err, errlen, res < 0 ? res : -EIO,
						     "read of %llu bytes at offset %llu: %s%s",
						     (unsigned long long)s->len,
						     (unsigned long long)s->off,
						     res < 0 ? strerror(-res) : "the file shrank",
						     res == -EINVAL ? " (O_DIRECT refused?)" : "");
				inflight--;
				free_slots[n_free++] = idx;
				continue;
			}
			bytes += (uint64_t)res;
			if ((uint64_t)res < s->len && s->off + (uint64_t)res < size &&
			    res % PAGE == 0 && !rc) {
				/* Short read before the end: read the rest. */
				s->buf += res;
				s->off += (uint64_t)res;
				s->len -= (uint64_t)res;
				prep(&ring, fd, s, idx, fresh);
				continue;
			}
			inflight--;
			free_slots[n_free++] = idx;
		}
	}
	if (!rc) {
		out->bytes = bytes;
		out->seconds = now_s() - t0;
		out->gbps = out->seconds > 0 ? bytes / out->seconds / 1e9 : 0;
	}
	io_uring_queue_exit(&ring);
err_mem:
	if (!leak && fresh && buf)
		munmap(buf, buf_len);
	else if (!leak)
		free(buf);
	free(free_slots);
	free(slots);
err_fd:
	close(fd);
	return rc;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double hwbench_median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
