/*
 * threads.h - a fixed pool of worker threads for data-parallel ops.
 *
 * eng_pool_run() runs fn(arg, ith, nth) once on every thread of the pool (the
 * caller is thread 0) and returns when all have finished.  Threads are created
 * once; between runs workers spin briefly and then sleep on a futex, so a
 * forward pass of a few hundred ops per token costs no thread creation and
 * little synchronization.
 */
#ifndef STRATA_THREADS_H
#define STRATA_THREADS_H

struct eng_pool;

typedef void (*eng_task_fn)(void *arg, unsigned ith, unsigned nth);

/* n_threads >= 1; 0 or -errno. */
int eng_pool_create(unsigned n_threads, struct eng_pool **out);
void eng_pool_destroy(struct eng_pool *p);
void eng_pool_run(struct eng_pool *p, eng_task_fn fn, void *arg);
unsigned eng_pool_size(const struct eng_pool *p);
/* eng_cpu_count() is in engine.h */

#endif
