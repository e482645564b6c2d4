/*
 * first-touch.c - a measurement, not part of the engine: what a new page
 * costs the CPU on this machine (docs/benchmarks.md, "Each run against its
 * own round's bound; where the CPU goes").
 *
 * Every read the pager makes into memory the cache has not held before
 * lands in new pages, which the kernel must make (allocate, zero, map)
 * before the read fills them.  This times that for a 512 MiB anonymous
 * mapping in 4 KiB pages, a byte written a page, in milliseconds a MiB:
 * fresh, again at once after MADV_DONTNEED (pages back from the free
 * lists), again after 5 s (time for a guest's free-page reporting to hand
 * them to the host), against writing over the same pages while they are
 * mapped.
 *
 *   build/tests/first-touch
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SIZE (512ul << 20)

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double ms_per_mib(double since)
{
	return (now() - since) * 1e3 / (double)(SIZE >> 20);
}

/* A byte a page: every page faulted in, nothing else written. */
static double touch(volatile char *p)
{
	double t = now();

	for (size_t i = 0; i < SIZE; i += 4096)
		p[i] = 1;
	return ms_per_mib(t);
}

int main(void)
{
	char *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	double t;

	if (p == MAP_FAILED) {
		perror("first-touch: mmap");
		return 1;
	}
	madvise(p, SIZE, MADV_NOHUGEPAGE); /* 4 KiB pages, as the pager's memfd has */
	printf("new pages, a byte each:       %.3f ms/MiB\n", touch(p));
	t = now();
	memset(p, 2, SIZE);
	printf("every byte, pages mapped:     %.3f ms/MiB\n", ms_per_mib(t));
	madvise(p, SIZE, MADV_DONTNEED);
	printf("new pages again at once:      %.3f ms/MiB\n", touch(p));
	madvise(p, SIZE, MADV_DONTNEED);
	sleep(5);
	printf("new pages again after 5 s:    %.3f ms/MiB\n", touch(p));
	return 0;
}
