/*
 * sample.c - choose the next token from a row of logits.
 *
 * Greedy when temp <= 0.  Otherwise the llama.cpp-style chain: top-k, then
 * softmax at the given temperature, top-p (smallest set whose probability
 * reaches p), min-p (drop tokens below min_p times the best one), and a draw
 * from what is left with a seeded xoshiro256** generator, so a seed
 * reproduces a run.  Scratch space is allocated once per sampler.
 */
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

struct cand {
	float logit;
	float p;
	int32_t id;
};

struct eng_sampler {
	struct eng_sampler_config cfg;
	uint32_t n_vocab;
	struct cand *cands;
	uint64_t s[4];
};

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(struct eng_sampler *r)
{
	uint64_t *s = r->s;
	uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

/* splitmix64, to spread a small seed over the whole state */
static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int eng_sampler_create(const struct eng_sampler_config *cfg, uint32_t n_vocab,
		       struct eng_sampler **out)
{
	struct eng_sampler *s = calloc(1, sizeof(*s));
	uint64_t x;

	*out = NULL;
	if (!s)
		return -ENOMEM;
	s->cands = calloc(n_vocab ? n_vocab : 1, sizeof(*s->cands));
	if (!s->cands) {
		free(s);
		return -ENOMEM;
	}
	s->cfg = *cfg;
	s->n_vocab = n_vocab;
	x = cfg->seed;
	for (int i = 0; i < 4; i++)
		s->s[i] = splitmix(&x);
	*out = s;
	return 0;
}

void eng_sampler_destroy(struct eng_sampler *s)
{
	if (!s)
		return;
	free(s->cands);
	free(s);
}

int32_t eng_argmax(const float *logits, uint32_t n)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return (int32_t)best;
}

static int by_logit_desc(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	if (x->logit != y->logit)
		return x->logit < y->logit ? 1 : -1;
	return x->id - y->id;
}

int32_t eng_sample(struct eng_sampler *s, const float *logits)
{
	const struct eng_sampler_config *cfg = &s->cfg;
	struct cand *c = s->cands;
	uint32_t n = s->n_vocab;
	double sum = 0, acc = 0, r;

	if (cfg->temp <= 0 || n == 0)
		return eng_argmax(logits, n);
	for (uint32_t i = 0; i < n; i++) {
		c[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
		c[i].id = (int32_t)i;
	}
	/* Sorting the whole vocabulary costs ~2 ms for 150k tokens, small next
	 * to a forward pass; it keeps every filter below a simple prefix cut. */
	qsort(c, n, sizeof(*c), by_logit_desc);
	if (cfg->top_k > 0 && (uint32_t)cfg->top_k < n)
		n = (uint32_t)cfg->top_k;
	for (uint32_t i = 0; i < n; i++) {
		c[i].p = expf((c[i].logit - c[0].logit) / cfg->temp);
		sum += c[i].p;
	}
	if (cfg->top_p < 1.0f) {
		for (uint32_t i = 0; i < n; i++) {
			acc += c[i].p / sum;
			if (acc >= cfg->top_p) {
				n = i + 1;
				break;
			}
		}
	}
	if (cfg->min_p > 0) {
		for (uint32_t i = 1; i < n; i++) {
			if (c[i].p < cfg->min_p * c[0].p) {
				n = i;
				break;
			}
		}
	}
	sum = 0;
	for (uint32_t i = 0; i < n; i++)
		sum += c[i].p;
	r = (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0) * sum;
	acc = 0;
	for (uint32_t i = 0; i < n; i++) {
		acc += c[i].p;
		if (r < acc)
			return c[i].id;
	}
	return c[n - 1].id;
}
