/*
 * sample.c - choose the next token from a row of logits.
 *
 * Greedy when temp <= 0.  Otherwise the llama.cpp-style chain: top-k, then
 * softmax at the given temperature, top-p (smallest set whose probability
 * reaches p), min-p (drop tokens below min_p times the best one), and a draw
 * from what is left with a seeded xoshiro256** generator, so a seed
 * reproduces a run.  Scratch space is allocated once per sampler.
 *
 * eng_sampler_dist gives the distribution the draw is made from, for
 * speculative decoding's accept/reject (spec.c), with eng_sampler_uniform
 * drawing from the same generator.
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

double eng_sampler_uniform(struct eng_sampler *s)
{
	return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* The candidates the draw is made from, into s->cands[0..n), most likely
 * first, with unnormalized p; returns n (temp > 0). */
static uint32_t candidates(struct eng_sampler *s, const float *logits)
{
	const struct eng_sampler_config *cfg = &s->cfg;
	struct cand *c = s->cands;
	uint32_t n = s->n_vocab;
	double sum = 0, acc = 0;

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
	return n;
}

size_t eng_sampler_dist(struct eng_sampler *s, const float *logits, struct eng_token_p *out)
{
	uint32_t n;
	double sum = 0;

	if (s->cfg.temp <= 0 || s->n_vocab == 0) {
		out[0] = (struct eng_token_p){ eng_argmax(logits, s->n_vocab), 1.0f };
		return 1;
	}
	n = candidates(s, logits);
	for (uint32_t i = 0; i < n; i++)
		sum += s->cands[i].p;
	for (uint32_t i = 0; i < n; i++)
		out[i] = (struct eng_token_p){ s->cands[i].id, (float)(s->cands[i].p / sum) };
	return n;
}

int32_t eng_sample(struct eng_sampler *s, const float *logits)
{
	struct cand *c = s->cands;
	uint32_t n;
	double sum = 0, acc = 0, r;

	if (s->cfg.temp <= 0 || s->n_vocab == 0)
		return eng_argmax(logits, s->n_vocab);
	n = candidates(s, logits);
	for (uint32_t i = 0; i < n; i++)
		sum += c[i].p;
	r = eng_sampler_uniform(s) * sum;
	for (uint32_t i = 0; i < n; i++) {
		acc += c[i].p;
		if (r < acc)
			return c[i].id;
	}
	return c[n - 1].id;
}
