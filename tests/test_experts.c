/*
 * test_experts.c - which experts the expert cache keeps (pager/experts.c),
 * without a daemon: decayed use counts (frequency with recency), the victim
 * among those that may go, ties to the least recently used, and the cache's
 * hit rate under a skewed and a uniform routing, simulated.
 */
#include "experts_i.h"
#include "check.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static bool everyone(void *arg, unsigned i)
{
	(void)arg;
	(void)i;
	return true;
}

/* arg: bool[] of those that may go */
static bool listed(void *arg, unsigned i)
{
	return ((const bool *)arg)[i];
}

/* Simulate n_pass passes of one layer routing k of n experts, with a cache
 * of `cap` experts: rand_r picks expert e with weight w[e].  The hit rate. */
static double simulate(unsigned n, unsigned k, unsigned cap, const double *w, unsigned n_pass)
{
	struct expert_cache c;
	bool *in = calloc(n, sizeof(*in)), *may = calloc(n, sizeof(*may));
	unsigned held = 0, hits = 0, routed = 0, seed = 7;
	double sum = 0;

	CHECK(expert_cache_init(&c, n, 64) == 0, "init");
	for (unsigned e = 0; e < n; e++)
		sum += w[e];
	for (unsigned p = 0; p < n_pass; p++) {
		bool picked[256] = { false };

		for (unsigned j = 0; j < k; j++) {
			unsigned e;

			do { /* k distinct experts, by weight */
				double r = rand_r(&seed) / (RAND_MAX + 1.0) * sum;

				for (e = 0; e + 1 < n && r >= w[e]; e++)
					r -= w[e];
			} while (picked[e]);
			picked[e] = true;
		}
		for (unsigned e = 0; e < n; e++)
			if (picked[e]) {
				routed++;
				hits += in[e];
				expert_cache_use(&c, e);
			}
		for (unsigned e = 0; e < n; e++)
			if (picked[e] && !in[e]) {
				for (unsigned i = 0; i < n; i++)
					may[i] = in[i] && !picked[i];
				while (held >= cap) {
					long v = expert_cache_victim(&c, listed, may);

					CHECK(v >= 0 && in[v] && !picked[v], "a victim that may go");
					if (v < 0)
						break;
					in[v] = may[v] = false;
					held--;
				}
				in[e] = true;
				held++;
			}
		expert_cache_pass(&c);
	}
	expert_cache_free(&c);
	free(in);
	free(may);
	return (double)hits / routed;
}

int main(void)
{
	struct expert_cache c;

	CHECK(expert_cache_init(&c, 4, 2) == 0, "init");
	CHECK(expert_cache_victim(&c, everyone, NULL) == 0, "all alike: the lowest index");
	expert_cache_use(&c, 0);
	expert_cache_use(&c, 0);
	expert_cache_use(&c, 1);
	expert_cache_pass(&c);
	expert_cache_use(&c, 2);
	/* scores: 0 -> 2/sqrt2, 1 -> 1/sqrt2, 2 -> 1, 3 -> 0 */
	CHECK(fabs(c.score[0] - sqrt(2.0)) < 1e-9, "a use fades by half in half_life passes: %f",
	      c.score[0]);
	CHECK(expert_cache_victim(&c, everyone, NULL) == 3, "the unused one goes first");
	bool may[4] = { true, true, true, false };
	CHECK(expert_cache_victim(&c, listed, may) == 1, "then the least used lately");
	may[1] = false;
	CHECK(expert_cache_victim(&c, listed, may) == 2, "recent use outweighs a faded one");
	may[2] = false;
	CHECK(expert_cache_victim(&c, listed, may) == 0, "only those that may go");
	may[0] = false;
	CHECK(expert_cache_victim(&c, listed, may) == -1, "none may go: -1");
	/* a tie: the least recently used goes */
	expert_cache_free(&c);
	CHECK(expert_cache_init(&c, 3, 1e30) == 0, "init");
	expert_cache_use(&c, 1);
	expert_cache_pass(&c);
	expert_cache_use(&c, 0);
	expert_cache_pass(&c);
	expert_cache_use(&c, 2);
	CHECK(expert_cache_victim(&c, everyone, NULL) == 1, "a tie goes to the least recent");
	expert_cache_free(&c);

	/* 128 experts, 8 a pass, a cache of 48: a router that prefers some
	 * (weights falling as 1/(e+1)) hits far more than the cache's share,
	 * a uniform one about its share (48/128) */
	double skew[128], flat[128];
	for (unsigned e = 0; e < 128; e++) {
		skew[e] = 1.0 / (e + 1);
		flat[e] = 1.0;
	}
	double hs = simulate(128, 8, 48, skew, 4000), hf = simulate(128, 8, 48, flat, 4000);
	printf("hit rate, 48 of 128 experts cached: skewed %.3f, uniform %.3f\n", hs, hf);
	CHECK(hf > 0.30 && hf < 0.45, "uniform routing hits about the cache's share: %.3f", hf);
	CHECK(hs > 0.70, "a skewed router keeps its favourites: %.3f", hs);
	printf("%s\n", failures ? "FAILED" : "all expert cache tests passed");
	return failures != 0;
}
