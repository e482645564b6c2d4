/*
 * threads.c - the worker pool behind eng_pool_run().
 *
 * Protocol: the caller publishes fn/arg, then bumps `gen` (release) and wakes
 * the futex.  Each worker waits for `gen` to change: it spins SPIN_ITERS
 * pauses first, since ops follow one another closely (0.4 ms on a Xeon of
 * 2023 and 0.5 ms on an AMD EPYC of 2024, Zen 5, both VMs here, whose pauses
 * are long; less on CPUs with short ones), then sleeps in FUTEX_WAIT.  It
 * runs its share and decrements `pending`; the last one to finish wakes the
 * caller.  The caller runs share 0 itself, so a pool of one thread has no
 * workers and no synchronization at all.
 */
#include "engine.h"
#include "threads.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPIN_ITERS 20000

struct eng_pool {
	unsigned n;
	pthread_t *tids;
	eng_task_fn fn;
	void *arg;
	_Atomic uint32_t gen;     /* bumped once per run; futex word for workers */
	_Atomic uint32_t pending; /* workers still running the current op */
	_Atomic uint32_t stop;
};

struct worker_arg {
	struct eng_pool *p;
	unsigned ith;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
	syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Wait until *addr != val. */
static void wait_change(_Atomic uint32_t *addr, uint32_t val)
{
	for (int i = 0; i < SPIN_ITERS; i++) {
		if (atomic_load_explicit(addr, memory_order_acquire) != val)
			return;
		cpu_relax();
	}
	while (atomic_load_explicit(addr, memory_order_acquire) == val)
		futex_wait(addr, val);
}

static void *worker(void *p_)
{
	struct worker_arg *wa = p_;
	struct eng_pool *p = wa->p;
	unsigned ith = wa->ith;
	uint32_t seen = 0;

	free(wa);
	for (;;) {
		wait_change(&p->gen, seen);
		seen = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (atomic_load_explicit(&p->stop, memory_order_acquire))
			return NULL;
		p->fn(p->arg, ith, p->n);
		if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1)
			futex_wake(&p->pending);
	}
}

int eng_pool_create(unsigned n_threads, struct eng_pool **out)
{
	struct eng_pool *p;
	unsigned started = 0;
	int rc = 0;

	*out = NULL;
	if (n_threads < 1 || n_threads > 1024)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->n = n_threads;
	p->tids = calloc(n_threads, sizeof(*p->tids));
	if (!p->tids) {
		free(p);
		return -ENOMEM;
	}
	for (unsigned i = 1; i < n_threads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));

		if (!wa) {
			rc = -ENOMEM;
			break;
		}
		wa->p = p;
		wa->ith = i;
		rc = -pthread_create(&p->tids[i], NULL, worker, wa);
		if (rc) {
			free(wa);
			break;
		}
		started++;
	}
	if (rc) {
		p->n = started + 1; /* destroy joins only what started */
		eng_pool_destroy(p);
		return rc;
	}
	*out = p;
	return 0;
}

void eng_pool_destroy(struct eng_pool *p)
{
	if (!p)
		return;
	atomic_store_explicit(&p->stop, 1, memory_order_release);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
	futex_wake(&p->gen);
	for (unsigned i = 1; i < p->n; i++)
		pthread_join(p->tids[i], NULL);
	free(p->tids);
	free(p);
}

void eng_pool_run(struct eng_pool *p, eng_task_fn fn, void *arg)
{
	uint32_t left;

	if (p->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	p->fn = fn;
	p->arg = arg;
	atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	futex_wake(&p->gen);
	fn(arg, 0, p->n);
	while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0)
		wait_change(&p->pending, left);
}

unsigned eng_pool_size(const struct eng_pool *p)
{
	return p->n;
}

unsigned eng_cpu_count(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		return (unsigned)CPU_COUNT(&set);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (unsigned)n : 1;
}
