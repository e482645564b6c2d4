/*
 * probe.c - find the request size and queue depth that read a device fastest,
 * and remember them per device.
 *
 * Storage differs: the same 1 MiB x 16 reads that saturate one NVMe drive
 * leave another (or a virtual disk) at half its speed, and the best request
 * size and depth are found only by trying.  pio_probe() reads the model file
 * itself the way the pager does: O_DIRECT through io_uring, each request
 * straight to the ring's workers, into pages of a memfd that exist already,
 * as the streaming slots' pages do (residency.c), reused as a ring of 64 MiB
 * (what was read is never looked at).  Every
 * configuration of a small grid (request sizes 256 KiB to 16 MiB, depths 2 to
 * 64, at most 64 MiB in flight) reads 256 MiB, from a cursor that moves
 * through the file so no configuration re-reads what another just read
 * (a virtual disk's host may cache).  The four fastest are measured twice
 * more, interleaved, and the one with the best median wins; that median is
 * the probed bandwidth.  About four seconds on a 1.5 GB/s disk.
 *
 * The result is kept in a small text file (one line per device and file
 * system, written whole and renamed into place), so a daemon measures a
 * device once; `stratad --probe-io` measures again.  The file is input like
 * any other: a line that does not parse, or holds values out of range, is
 * ignored.
 *
 *   strata-io 1 dev=MAJ:MIN fs=HEX chunk=BYTES depth=N gbps=X.XXX time=UNIX
 *
 * Runs once, at start-up, on the daemon's thread, before the event loop:
 * blocking waits are fine here.
 */
#include "io_i.h"
#include "pager.h"
#include "pager_i.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define PROBE_BYTES (256ull << 20)    /* read per measurement */
#define PROBE_INFLIGHT (64ull << 20)  /* most bytes in flight (the grid keeps to it) */
#define PROBE_FINALISTS 4
#define PROBE_REPEATS 2               /* more measurements of each finalist */
#define CACHE_MAGIC "strata-io 1"
#define PATH_MAX_LEN 4096

static const struct {
	uint64_t chunk;
	unsigned depth;
} grid[] = {
	{ 256u << 10, 16 }, { 256u << 10, 64 }, { 1u << 20, 8 },  { 1u << 20, 16 },
	{ 1u << 20, 32 },   { 1u << 20, 64 },   { 2u << 20, 16 }, { 2u << 20, 32 },
	{ 4u << 20, 8 },    { 4u << 20, 16 },   { 8u << 20, 4 },  { 8u << 20, 8 },
	{ 16u << 20, 2 },   { 16u << 20, 4 },
};
#define N_GRID (sizeof(grid) / sizeof(grid[0]))
_Static_assert(16ull * 4 << 20 <= PROBE_INFLIGHT && 256ull * 64 << 10 <= PROBE_INFLIGHT,
	       "the grid's largest configurations");

/*
 * Read PROBE_BYTES of fd into buf (a mapping of a memfd of PROBE_INFLIGHT
 * bytes, used as a ring: what was read is never looked at) in requests of
 * `chunk`, `depth` at a time, starting at *cursor and wrapping before
 * `span`; the bandwidth in GB/s.
 */
static int measure(struct io_uring *ring, int fd, uint8_t *buf, uint64_t chunk,
		   unsigned depth, uint64_t span, uint64_t *cursor, double *gbps)
{
	uint64_t issued = 0, done = 0, n_req = PROBE_BYTES / chunk;
	unsigned inflight = 0;
	struct timespec t0, t1;
	int rc = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (done < n_req && rc == 0) {
		while (issued < n_req && inflight < depth) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

			if (!sqe)
				break;
			if (*cursor + chunk > span)
				*cursor = 0;
			io_uring_prep_read(sqe, fd, buf + issued * chunk % PROBE_INFLIGHT,
					   (unsigned)chunk, *cursor);
			sqe->flags |= IOSQE_ASYNC; /* as io.c submits */
			io_uring_sqe_set_data64(sqe, issued);
			*cursor += chunk;
			issued++;
			inflight++;
		}
		rc = io_uring_submit_and_wait(ring, 1);
		if (rc < 0)
			break;
		rc = 0;
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;

		io_uring_for_each_cqe(ring, head, cqe) {
			if (cqe->res < 0 && rc == 0)
				rc = cqe->res;
			seen++;
		}
		io_uring_cq_advance(ring, seen);
		inflight -= seen;
		done += seen;
	}
	/* on an error, let what is in flight land before the buffer goes */
	while (inflight) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(ring, &cqe) < 0)
			break;
		io_uring_cqe_seen(ring, cqe);
		inflight--;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc)
		return rc;
	*gbps = (double)(n_req * chunk) /
		((double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / 1e9;
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int pio_probe(int fd, uint64_t size, struct pio_params *out)
{
	double first[N_GRID], runs[PROBE_FINALISTS][1 + PROBE_REPEATS];
	unsigned fin[PROBE_FINALISTS];
	uint64_t cursor = 0;
	struct io_uring ring;
	uint8_t *buf;
	int rc, mfd;

	if (size < PROBE_BYTES)
		return -EFBIG; /* too small to tell the device from its caches */
	mfd = memfd_create("strata-probe", MFD_CLOEXEC);
	if (mfd < 0)
		return -errno;
	/* 64 MiB, not the 256 a measurement reads: the daemon may start in a
	 * memory cgroup barely larger than its budget (tests/pager_budget.py) */
	buf = ftruncate(mfd, (off_t)PROBE_INFLIGHT) == 0
		      ? mmap(NULL, PROBE_INFLIGHT, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0)
		      : MAP_FAILED;
	if (buf == MAP_FAILED) {
		rc = -errno;
		close(mfd);
		return rc;
	}
	memset(buf, 0, PROBE_INFLIGHT); /* the pages exist before the first read */
	rc = io_uring_queue_init(64, &ring, 0);
	if (rc < 0) {
		munmap(buf, PROBE_INFLIGHT);
		close(mfd);
		return rc;
	}
	for (unsigned i = 0; i < N_GRID && rc == 0; i++)
		rc = measure(&ring, fd, buf, grid[i].chunk, grid[i].depth,
			     size / grid[i].chunk * grid[i].chunk, &cursor, &first[i]);
	/* the finalists: the fastest of the first round */
	for (unsigned f = 0; f < PROBE_FINALISTS && rc == 0; f++) {
		fin[f] = N_GRID;
		for (unsigned i = 0; i < N_GRID; i++) {
			bool taken = false;

			for (unsigned g = 0; g < f; g++)
				taken |= fin[g] == i;
			if (!taken && (fin[f] == N_GRID || first[i] > first[fin[f]]))
				fin[f] = i;
		}
		runs[f][0] = first[fin[f]];
	}
	for (unsigned r = 1; r <= PROBE_REPEATS && rc == 0; r++)
		for (unsigned f = 0; f < PROBE_FINALISTS && rc == 0; f++) {
			unsigned i = fin[f];

			rc = measure(&ring, fd, buf, grid[i].chunk, grid[i].depth,
				     size / grid[i].chunk * grid[i].chunk, &cursor, &runs[f][r]);
		}
	io_uring_queue_exit(&ring);
	munmap(buf, PROBE_INFLIGHT);
	close(mfd); /* and its pages with it */
	if (rc)
		return rc;
	/* Of the finalists within 5% of the best median (the same, given the
	 * noise of a shared device), the one with the largest requests: it
	 * costs the daemon the least CPU per byte, which the engine, computing
	 * on the same cores while layers stream, notices (2 MiB x 32 streamed
	 * 11% faster than 256 KiB x 16 here, although the probe, reading
	 * alone, timed them alike). */
	double best = 0;

	for (unsigned f = 0; f < PROBE_FINALISTS; f++) {
		qsort(runs[f], 1 + PROBE_REPEATS, sizeof(double), cmp_double);
		if (runs[f][PROBE_REPEATS / 2] > best)
			best = runs[f][PROBE_REPEATS / 2];
	}
	*out = (struct pio_params){ .source = PIO_PROBED, .when = (int64_t)time(NULL) };
	for (unsigned f = 0; f < PROBE_FINALISTS; f++) {
		double g = runs[f][PROBE_REPEATS / 2];
		uint64_t c = grid[fin[f]].chunk;

		if (g >= 0.95 * best && (c > out->chunk || (c == out->chunk &&
							     grid[fin[f]].depth > out->depth))) {
			out->gbps = g;
			out->chunk = c;
			out->depth = grid[fin[f]].depth;
		}
	}
	return 0;
}

/* ---- the cache -------------------------------------------------------- */

int pio_device_of(int fd, struct pio_device *dev)
{
	struct stat st;
	struct statfs sf;

	if (fstat(fd, &st) < 0 || fstatfs(fd, &sf) < 0)
		return -errno;
	dev->major = major(st.st_dev);
	dev->minor = minor(st.st_dev);
	dev->fstype = (uint64_t)sf.f_type;
	return 0;
}

/* Parse one cache line; false if it is not a valid entry. */
static bool parse_line(const char *line, struct pio_device *dev, struct pio_params *p)
{
	unsigned long long chunk, fstype;
	long long when;
	unsigned depth;
	double gbps;
	int end = -1;

	if (sscanf(line, CACHE_MAGIC " dev=%u:%u fs=%llx chunk=%llu depth=%u gbps=%lf time=%lld%n",
		   &dev->major, &dev->minor, &fstype, &chunk, &depth, &gbps, &when, &end) != 7 ||
	    end < 0 || (line[end] != '\n' && line[end] != '\0'))
		return false;
	if (chunk < 4096 || chunk > PIO_MAX_CHUNK || chunk % 4096 || depth < 1 ||
	    depth > PIO_MAX_DEPTH || !(gbps > 0 && gbps < 1e4))
		return false;
	dev->fstype = fstype;
	*p = (struct pio_params){ .chunk = chunk, .depth = depth, .gbps = gbps, .when = when,
				  .source = PIO_CACHED };
	return true;
}

int pio_cache_lookup(const char *path, const struct pio_device *dev, struct pio_params *out)
{
	FILE *f = fopen(path, "r");
	char line[256];
	bool found = false;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		struct pio_device d;
		struct pio_params p;

		if (parse_line(line, &d, &p) && d.major == dev->major && d.minor == dev->minor &&
		    d.fstype == dev->fstype) {
			*out = p;
			found = true; /* the last entry wins */
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

/* mkdir -p of path's directory */
static void make_parent(const char *path)
{
	char dir[PATH_MAX_LEN];

	snprintf(dir, sizeof(dir), "%s", path);
	for (char *s = dir + 1; *s; s++)
		if (*s == '/') {
			*s = '\0';
			mkdir(dir, 0755);
			*s = '/';
		}
}

int pio_cache_store(const char *path, const struct pio_device *dev, const struct pio_params *p)
{
	char tmp[PATH_MAX_LEN + 16], line[256];
	FILE *in, *out;
	int fd, rc = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	make_parent(path);
	fd = mkstemp(tmp);
	if (fd < 0)
		return -errno;
	out = fdopen(fd, "w");
	if (!out) {
		rc = -errno;
		close(fd);
		unlink(tmp);
		return rc;
	}
	/* keep the other devices' valid entries */
	in = fopen(path, "r");
	while (in && fgets(line, sizeof(line), in)) {
		struct pio_device d;
		struct pio_params q;

		if (parse_line(line, &d, &q) &&
		    !(d.major == dev->major && d.minor == dev->minor && d.fstype == dev->fstype))
			fputs(line, out);
	}
	if (in)
		fclose(in);
	fprintf(out, CACHE_MAGIC " dev=%u:%u fs=%llx chunk=%llu depth=%u gbps=%.3f time=%lld\n",
		dev->major, dev->minor, (unsigned long long)dev->fstype,
		(unsigned long long)p->chunk, p->depth, p->gbps, (long long)p->when);
	if (fflush(out) || fsync(fileno(out)))
		rc = -errno;
	if (fclose(out) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path) < 0)
		rc = -errno;
	if (rc)
		unlink(tmp);
	return rc;
}

/* Where the cache lives when --io-cache does not say: /var/cache/strata for
 * root, else under $XDG_CACHE_HOME or ~/.cache. */
void pio_cache_default(char *buf, size_t len)
{
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");

	if (geteuid() == 0)
		snprintf(buf, len, "/var/cache/strata/io-probe");
	else if (xdg && *xdg)
		snprintf(buf, len, "%s/strata/io-probe", xdg);
	else
		snprintf(buf, len, "%s/.cache/strata/io-probe", home && *home ? home : "/tmp");
}
