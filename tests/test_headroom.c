/*
 * test_headroom.c - hwbench_mem_headroom() against fake /proc and
 * /sys/fs/cgroup trees, hostile ones included.
 *
 * Each case writes the files it needs under a fresh directory (the `root`
 * the function reads under) and checks the three numbers it returns:
 * cgroup v1 and v2, the tightest ancestor winning, memory.high below
 * memory.max, usage over the limit, then malformed numbers, a path leaving
 * the hierarchy, missing and truncated files, each of which must fall back
 * to MemAvailable (or to the cgroup when MemAvailable is the bad one) and
 * never fail the call while one source is readable.  Last, the machine's
 * own files must give a non-zero answer.
 *
 * Exits 1 on any failure.
 */
#include "check.h"
#include "hwbench.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1ull << 20)
#define NONE UINT64_MAX

static char root[PATH_MAX];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void remove_root(void)
{
	if (root[0])
		nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	root[0] = '\0';
}

/* A fresh, empty root for the next case. */
static void fresh_root(void)
{
	remove_root();
	snprintf(root, sizeof(root), "%s/strata-headroom-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(root)) {
		perror("mkdtemp");
		exit(1);
	}
}

/* root + path holds text, its directories made as needed. */
static void put(const char *path, const char *text)
{
	char full[PATH_MAX];
	FILE *f;

	snprintf(full, sizeof(full), "%s%s", root, path);
	for (char *p = full + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(full, 0755);
		*p = '/';
	}
	f = fopen(full, "w");
	if (!f || fputs(text, f) < 0 || fclose(f)) {
		perror(full);
		exit(1);
	}
}

static void put_num(const char *path, uint64_t v)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%" PRIu64 "\n", v);
	put(path, buf);
}

static void meminfo(uint64_t kib)
{
	char buf[256];

	snprintf(buf, sizeof(buf),
		 "MemTotal:       25000000 kB\nMemFree:        24000000 kB\n"
		 "MemAvailable:   %" PRIu64 " kB\nBuffers:            1000 kB\n",
		 kib);
	put("/proc/meminfo", buf);
}

/* The hybrid layout of this project's machine: v1 memory, v2 without it. */
static void v1_layout(const char *path)
{
	char buf[256];

	snprintf(buf, sizeof(buf), "9:name=systemd:/\n4:memory:%s\n2:cpu,cpuacct:/\n0::/\n", path);
	put("/proc/self/cgroup", buf);
	put_num("/sys/fs/cgroup/memory/memory.limit_in_bytes", 9223372036854771712ull);
	put_num("/sys/fs/cgroup/memory/memory.usage_in_bytes", 3000 * MiB);
}

static void expect(int line, int want_rc, uint64_t cgroup, uint64_t available)
{
	struct hwbench_headroom h;
	int rc = hwbench_mem_headroom(root, &h);
	uint64_t bytes = cgroup < available ? cgroup : available;

	if (rc != want_rc || h.cgroup != cgroup || h.available != available || h.bytes != bytes) {
		printf("FAIL line %d: rc %d (want %d), cgroup %" PRIu64 " (want %" PRIu64
		       "), available %" PRIu64 " (want %" PRIu64 "), bytes %" PRIu64 "\n",
		       line, rc, want_rc, h.cgroup, cgroup, h.available, available, h.bytes);
		failures++;
	}
}
#define EXPECT(rc, cgroup, available) expect(__LINE__, rc, cgroup, available)

int main(void)
{
	struct hwbench_headroom h;

	/* v1: the parent's limit is the tighter one; the child has none. */
	fresh_root();
	meminfo(20 << 20);
	v1_layout("/a/b");
	put_num("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", 1000 * MiB);
	put_num("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", 100 * MiB);
	put_num("/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", 9223372036854771712ull);
	put_num("/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes", 50 * MiB);
	EXPECT(0, 900 * MiB, 20ull << 30);
	/* the child's own limit tighter still */
	put_num("/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", 300 * MiB);
	EXPECT(0, 250 * MiB, 20ull << 30);
	/* MemAvailable under the cgroup's room */
	meminfo(100 << 10);
	EXPECT(0, 250 * MiB, 100 * MiB);
	/* usage over the limit: no room at all */
	put_num("/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes", 400 * MiB);
	EXPECT(0, 0, 100 * MiB);
	/* the root cgroup itself */
	fresh_root();
	meminfo(20 << 20);
	v1_layout("/");
	EXPECT(0, NONE, 20ull << 30);

	/* v2: "max" is no limit, the root has no memory.max, memory.high
	 * counts when it is lower. */
	fresh_root();
	meminfo(20 << 20);
	put("/proc/self/cgroup", "0::/x/y\n");
	put_num("/sys/fs/cgroup/memory.current", 5000 * MiB);
	put("/sys/fs/cgroup/x/memory.max", "524288000\n");
	put("/sys/fs/cgroup/x/memory.high", "max\n");
	put_num("/sys/fs/cgroup/x/memory.current", 200 * MiB);
	put("/sys/fs/cgroup/x/y/memory.max", "max\n");
	put_num("/sys/fs/cgroup/x/y/memory.current", 10 * MiB);
	EXPECT(0, 300 * MiB, 20ull << 30);
	put_num("/sys/fs/cgroup/x/y/memory.high", 50 * MiB);
	EXPECT(0, 40 * MiB, 20ull << 30);
	/* no limit anywhere: MemAvailable alone */
	put("/sys/fs/cgroup/x/memory.max", "max\n");
	put("/sys/fs/cgroup/x/y/memory.high", "max\n");
	EXPECT(0, NONE, 20ull << 30);

	/* Malformed numbers: that level counts as unreadable, the others
	 * still count; none readable leaves MemAvailable. */
	static const char *const bad[] = {
		"", "\n", "12abc\n", "-1\n", " 5\n", "99999999999999999999\n",
		"18446744073709551616\n", "max max\n", "0x10\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		fresh_root();
		meminfo(20 << 20);
		v1_layout("/a");
		put("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", bad[i]);
		put_num("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", 10 * MiB);
		put("/sys/fs/cgroup/memory/memory.limit_in_bytes", bad[i]);
		EXPECT(0, NONE, 20ull << 30);
		put_num("/sys/fs/cgroup/memory/memory.limit_in_bytes", 100 * MiB);
		put_num("/sys/fs/cgroup/memory/memory.usage_in_bytes", 60 * MiB);
		EXPECT(0, 40 * MiB, 20ull << 30);
	}
	/* a usage file missing */
	fresh_root();
	meminfo(20 << 20);
	v1_layout("/a");
	put_num("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", 100 * MiB);
	put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "junk\n");
	EXPECT(0, NONE, 20ull << 30);

	/* /proc/self/cgroup hostile or absent: MemAvailable alone. */
	static const char *const bad_self[] = {
		"4:memory:/../outside\n",   /* outside the namespace */
		"4:memory:/a/..\n",         /* up, at the end */
		"4:memory:/a/../..\n",
		"4:memory:a\n",             /* not absolute */
		"4:memory:/a",              /* no newline: truncated */
		"4-memory-/a\n",            /* no fields */
		"4:cpu:/a\n",               /* no memory controller, no v2 line */
		"",
	};
	for (size_t i = 0; i < sizeof(bad_self) / sizeof(bad_self[0]); i++) {
		fresh_root();
		meminfo(20 << 20);
		v1_layout("/a");
		put_num("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", 100 * MiB);
		put_num("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", 10 * MiB);
		put_num("/sys/fs/cgroup/memory/memory.limit_in_bytes", 100 * MiB);
		put_num("/sys/fs/cgroup/memory/memory.usage_in_bytes", 10 * MiB);
		put("/proc/self/cgroup", bad_self[i]);
		EXPECT(0, NONE, 20ull << 30);
	}
	/* a path longer than PATH_MAX */
	{
		static char line[PATH_MAX + 64];
		size_t n = (size_t)snprintf(line, sizeof(line), "4:memory:");

		while (n < PATH_MAX + 16)
			n += (size_t)snprintf(line + n, sizeof(line) - n, "/d");
		snprintf(line + n, sizeof(line) - n, "\n");
		put("/proc/self/cgroup", line);
		EXPECT(0, NONE, 20ull << 30);
	}
	/* a file larger than the reader takes: refused, not cut */
	{
		static char big[20000];
		size_t n = 0;

		while (n + 16 < sizeof(big))
			n += (size_t)snprintf(big + n, sizeof(big) - n, "1:cpu:/\n");
		snprintf(big + n, sizeof(big) - n, "4:memory:/a\n");
		put("/proc/self/cgroup", big);
		EXPECT(0, NONE, 20ull << 30);
	}
	fresh_root();
	meminfo(20 << 20);
	EXPECT(0, NONE, 20ull << 30); /* no /proc/self/cgroup */

	/* MemAvailable hostile or absent: the cgroup alone. */
	static const char *const bad_meminfo[] = {
		"MemTotal: 1 kB\n",
		"MemAvailable: 12 MB\n",
		"MemAvailable: kB\n",
		"MemAvailable: 18014398509481984 kB\n", /* * 1024 overflows */
		"MemAvailable: 100 kB",                 /* no newline */
		"XMemAvailable: 100 kB\n",
	};
	for (size_t i = 0; i < sizeof(bad_meminfo) / sizeof(bad_meminfo[0]); i++) {
		fresh_root();
		v1_layout("/");
		put_num("/sys/fs/cgroup/memory/memory.limit_in_bytes", 100 * MiB);
		put_num("/sys/fs/cgroup/memory/memory.usage_in_bytes", 10 * MiB);
		put("/proc/meminfo", bad_meminfo[i]);
		EXPECT(0, 90 * MiB, NONE);
	}
	/* neither: an error, and no limit */
	fresh_root();
	EXPECT(-ENOENT, NONE, NONE);

	/* This machine: something readable, and some room. */
	CHECK(hwbench_mem_headroom("", &h) == 0 && h.bytes > 0 && h.bytes < NONE,
	      "the machine's own headroom: %" PRIu64, h.bytes);
	printf("this process may take %" PRIu64 " MiB more (cgroup %" PRIu64
	       " MiB, MemAvailable %" PRIu64 " MiB)\n",
	       h.bytes >> 20, h.cgroup == NONE ? 0 : h.cgroup >> 20, h.available >> 20);

	remove_root();
	if (failures) {
		printf("%d failure(s)\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
