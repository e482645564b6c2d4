/*
 * experts_i.h - which experts of a mixture of experts stay in memory: the
 * choice alone, as arithmetic (experts.c; tests/test_experts.c runs it
 * without a daemon).
 *
 * Every expert (of every layer) has a score: how often it was routed to,
 * each use counting 1 and fading by half every `half_life` passes (a
 * decayed use count: frequency with recency).  When memory is needed, the
 * expert with the lowest score among those that may go leaves; a tie goes to
 * the one used least recently.
 */
#ifndef STRATA_EXPERTS_I_H
#define STRATA_EXPERTS_I_H

#include <stdbool.h>
#include <stdint.h>

struct expert_cache {
	unsigned n;      /* experts, all layers */
	double *score;   /* decayed use counts */
	uint64_t *last;  /* the pass each was last used in */
	uint64_t pass;   /* passes so far */
	double decay;    /* per pass */
};

/* -ENOMEM or 0. */
int expert_cache_init(struct expert_cache *c, unsigned n, double half_life);
void expert_cache_free(struct expert_cache *c);
/* Expert i was routed to in this pass. */
void expert_cache_use(struct expert_cache *c, unsigned i);
/* A pass ended: every score fades. */
void expert_cache_pass(struct expert_cache *c);
/* The expert to evict among those `may_go` says may, or -1. */
long expert_cache_victim(const struct expert_cache *c, bool (*may_go)(void *arg, unsigned i),
			 void *arg);

#endif
