/*
 * memfd-read.c - a measurement, not part of the pager: the CPU it takes to
 * bring file bytes into new pages of a memfd, as the pager does for every
 * expert or layer it reads into memory the cache has not held before
 * (docs/benchmarks.md, "Each run against its own round's bound; where the
 * CPU goes").
 *
 *   build/tests/memfd-read FILE [MIB [AT_MIB]]
 *
 * reads MIB (default 256) MiB of FILE from AT_MIB on with O_DIRECT, 1 MiB a
 * read, three ways, each over bytes not read before (so that the device,
 * not a cache, serves them), and prints the CPU time a MiB (user and
 * system) and the rate:
 *   direct    into the memfd's mapping (the pager's way: the kernel
 *             faults in, zeroes and maps each page, then the read fills it)
 *   bounce    into one reused buffer, then pwrite() into the memfd (whole
 *             pages written are not zeroed first, and nothing is mapped)
 *   read      into the reused buffer only: the read's own cost
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1ul << 20)

static double cpu_s(void)
{
	struct rusage r;

	getrusage(RUSAGE_SELF, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
	       (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One way, over len bytes of fd from `at`; 0 or -1 (said why). */
static int run(const char *how, int fd, off_t at, size_t len, char *buf)
{
	int mfd = memfd_create("memfd-read", MFD_CLOEXEC);
	char *map;
	double c, t;

	if (mfd < 0 || ftruncate(mfd, (off_t)len) < 0) {
		perror("memfd-read: memfd");
		return -1;
	}
	map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (map == MAP_FAILED) {
		perror("memfd-read: mmap");
		return -1;
	}
	c = cpu_s();
	t = now_s();
	for (size_t o = 0; o < len; o += CHUNK) {
		char *to = strcmp(how, "direct") ? buf : map + o;

		if (pread(fd, to, CHUNK, at + (off_t)o) != (ssize_t)CHUNK ||
		    (!strcmp(how, "bounce") && pwrite(mfd, buf, CHUNK, (off_t)o) != (ssize_t)CHUNK)) {
			perror("memfd-read: a read or write fell short");
			return -1;
		}
	}
	printf("%-7s %.3f ms of CPU a MiB, %.2f GB/s\n", how,
	       (cpu_s() - c) * 1e3 / (double)(len >> 20), (double)len / (now_s() - t) / 1e9);
	munmap(map, len);
	close(mfd);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *const ways[] = { "direct", "bounce", "read" };
	size_t mib = argc > 2 ? strtoul(argv[2], NULL, 0) : 256;
	off_t at = (off_t)(argc > 3 ? strtoull(argv[3], NULL, 0) : 0) << 20;
	char *buf = aligned_alloc(4096, CHUNK);
	int fd;

	if (argc < 2 || !mib || !buf) {
		fprintf(stderr, "usage: memfd-read FILE [MIB [AT_MIB]]\n");
		return 1;
	}
	fd = open(argv[1], O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	memset(buf, 0, CHUNK);
	for (unsigned i = 0; i < 3; i++)
		if (run(ways[i], fd, at + (off_t)(i * (mib << 20)), mib << 20, buf))
			return 1;
	return 0;
}
