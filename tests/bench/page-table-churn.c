/*
 * page-table-churn.c - a measurement, not part of the engine: what changing
 * a process's page tables costs the threads that compute in it
 * (docs/benchmarks.md, "256 tokens, and what the engine's compute under the
 * pager is made of").
 *
 * Preloaded into `strata bench`, it starts a thread that maps, touches and
 * unmaps CHURN_KIB (default 1024) KiB of anonymous memory CHURN_RATE times
 * a second: as many page-table entries made and dropped in the engine's
 * process as the pager makes when it maps an expert in and evicts one.
 * Preloaded into another program instead (`sleep 60 &`), the same work
 * takes the same CPU and changes none of the engine's entries: the
 * difference between the two is what the entries cost.
 *
 *   CHURN_RATE=100 LD_PRELOAD=build/tests/page-table-churn.so \
 *       build/strata bench -m MODEL -p 0 -n 64 -t 2 --no-hw
 *   CHURN_RATE=100 LD_PRELOAD=build/tests/page-table-churn.so sleep 60 &
 *   build/strata bench -m MODEL -p 0 -n 64 -t 2 --no-hw
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static long rate, kib;

static void *churn(void *arg)
{
	struct timespec gap = { 0, 1000000000L / rate };
	size_t len = (size_t)kib << 10;

	for (;;) {
		char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED)
			return arg;
		for (size_t o = 0; o < len; o += 4096)
			p[o] = 1;
		munmap(p, len);
		nanosleep(&gap, NULL);
	}
}

__attribute__((constructor)) static void start(void)
{
	const char *r = getenv("CHURN_RATE"), *k = getenv("CHURN_KIB");
	pthread_t t;

	rate = r ? atol(r) : 0;
	kib = k ? atol(k) : 1024;
	if (rate > 0 && rate <= 1000000 && kib > 0 && pthread_create(&t, NULL, churn, NULL) == 0)
		pthread_detach(t);
}
