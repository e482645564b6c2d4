/*
 * mem-hog.c - a measurement aid, not part of the engine: another core
 * reading memory as fast as it can, so that a kernel or the engine can be
 * measured with its memory shared, as it is on a busy host (docs/
 * benchmarks.md, "2026-11-27, session 37: fewer row streams").
 *
 *   taskset -c 0 build/tests/mem-hog [SECONDS]
 *
 * reads a 1 GiB buffer over and over (a word of each 64-byte line) for
 * SECONDS (default: until killed), and prints the rate it got every 2 s on
 * stderr.  Pin it to one core and what is measured to the other.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIZE (1ul << 30)

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A word of every line: the line comes from memory all the same. */
static uint64_t read_all(const uint64_t *p)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < SIZE / sizeof(*p); i += 64 / sizeof(*p))
		sum += p[i];
	return sum;
}

int main(int argc, char **argv)
{
	const double secs = argc > 1 ? atof(argv[1]) : 1e12;
	uint64_t *p = aligned_alloc(64, SIZE), sum = 0;
	double t0, last;
	size_t bytes = 0;

	if (!p || secs <= 0) {
		fprintf(stderr, "usage: mem-hog [SECONDS]\n");
		return 2;
	}
	memset(p, 1, SIZE);
	t0 = last = now();
	while (now() - t0 < secs) {
		double t;

		sum += read_all(p);
		bytes += SIZE;
		t = now();
		if (t - last > 2) {
			fprintf(stderr, "mem-hog: %.1f GB/s\n", (double)bytes / (t - last) / 1e9);
			bytes = 0;
			last = t;
		}
	}
	/* the sum, so that the reads are not optimized away */
	return sum == 42;
}
