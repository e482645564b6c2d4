/*
 * hwbench.h - the two machine bandwidths that bound the engine's speed.
 *
 *   memory read   every weight byte a decoded token needs is read once from
 *                 RAM, so tok/s <= memory bandwidth / bytes per token;
 *   storage read  a weight that is not resident is read from the model file,
 *                 so a streamed model is bound by storage bandwidth instead.
 *
 * Both are measured the way the engine and stratad use the hardware: memory
 * with the engine's thread count and AVX2 loads, storage with io_uring,
 * O_DIRECT and 1 MiB reads, 16 in flight (stratad's reader, pager/io.c).
 * Used by `strata bench`, strata-iobench and strata-kbench (hwbench_median,
 * the one median of the benchmarks' repeated timings).  No global state: a memory
 * buffer lives from hwbench_mem_open to hwbench_mem_close, and everything
 * else is set up and torn down by the call that uses it.
 */
#ifndef STRATA_HWBENCH_H
#define STRATA_HWBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hwbench_result {
	uint64_t bytes;  /* read in the timed interval (memory: one pass) */
	double seconds;  /* of that interval (memory: the fastest pass) */
	double gbps;     /* bytes / seconds / 1e9 */
	uint64_t huge_bytes; /* memory: of bytes, those on 2 MiB pages */
};

/*
 * Memory read bandwidth: allocate `bytes` (rounded down to 4 KiB), touch it
 * from n_threads threads, then read it `passes` times with n_threads threads
 * splitting it evenly; the result is the fastest pass.  0 or -errno.
 */
int hwbench_mem_read(unsigned n_threads, uint64_t bytes, unsigned passes,
		     struct hwbench_result *out);

/*
 * The same one pass at a time, for a caller that interleaves passes with
 * its own work (strata bench pairs each decoded token with the pass just
 * before it): open allocates and touches the buffer, each pass reads it
 * once and times it.  0 or -errno.
 */
struct hwbench_mem;
int hwbench_mem_open(unsigned n_threads, uint64_t bytes, struct hwbench_mem **out);
int hwbench_mem_pass(struct hwbench_mem *m, struct hwbench_result *out);
void hwbench_mem_close(struct hwbench_mem *m);

/*
 * How much more memory this process may take before the kernel kills it or
 * throttles it, for a caller about to size a probe's buffer:
 *
 *   cgroup     the smallest (limit - usage) of the process's memory cgroup
 *              and of each cgroup above it (v1: the "memory" line of
 *              /proc/self/cgroup, memory.limit_in_bytes - memory.usage_in_bytes
 *              under /sys/fs/cgroup/memory; v2: the "0::" line,
 *              min(memory.max, memory.high) - memory.current under
 *              /sys/fs/cgroup, "max" meaning no limit).  0 when the usage is
 *              at or over the limit.  UINT64_MAX when there is no limit or
 *              nothing of it could be read: a cgroup that cannot be read
 *              counts as none, the process then goes by MemAvailable alone;
 *   available  MemAvailable of /proc/meminfo; UINT64_MAX if unreadable;
 *   bytes      the smaller of the two.
 *
 * Every path is read under `root` ("" for the machine itself; a test passes
 * a directory laid out the same way).  The files are parsed as hostile: a
 * malformed number, a path with "..", a line or file too long, all count as
 * unreadable.  0, or, when neither the cgroup nor MemAvailable could be
 * read, what reading MemAvailable failed with (-errno; -EINVAL when
 * malformed).
 */
struct hwbench_headroom {
	uint64_t bytes;
	uint64_t cgroup;
	uint64_t available;
};
int hwbench_mem_headroom(const char *root, struct hwbench_headroom *out);

struct hwbench_io_config {
	uint64_t chunk;     /* bytes per read, a multiple of 4096; 0: 1 MiB */
	unsigned depth;     /* reads in flight, 1..256; 0: 16 */
	uint64_t max_bytes; /* read at most the first max_bytes of the file; 0: all */
	uint64_t min_bytes; /* read that range again until this much was read; 0: once */
	bool fresh;         /* into new pages of a memfd, each chunk its own (the
			     * way stratad's store fills): storage and the cost
			     * of new memory together; needs min_bytes 0 */
};

/*
 * Storage read bandwidth of `path`: O_DIRECT reads with io_uring into
 * reused buffers (or, with `fresh`, into new memfd pages), so the page cache
 * is neither used nor disturbed.  Returns
 * 0, or -errno with a one-line reason in err: -EINVAL when the file system
 * refuses O_DIRECT, -EOPNOTSUPP when the file lives in memory (tmpfs,
 * ramfs: there is no storage to measure), or what open, io_uring or a read
 * failed with.
 */
int hwbench_storage_read(const char *path, const struct hwbench_io_config *cfg,
			 struct hwbench_result *out, char *err, size_t errlen);

/* n bytes (rounded up to 2 MiB, 2 MiB-aligned, zero) on 2 MiB pages where
 * the kernel has transparent huge pages, as a model that fits is mapped;
 * NULL when out of memory.  hwbench_huge_free(p, n) unmaps it. */
void *hwbench_huge_alloc(size_t n);
void hwbench_huge_free(void *p, size_t n);

/* Bytes of the mappings overlapping [p, p + n) reached through 2 MiB
 * page-table entries (anonymous, file or shmem), from /proc/self/smaps;
 * 0 where it cannot tell.  Walks the page tables: not for a timed interval. */
uint64_t hwbench_pmd_mapped_bytes(const void *p, size_t n);

/* The median of v[0..n), n > 0; sorts v (so v[0] is then the least). */
double hwbench_median(double *v, size_t n);

#endif
