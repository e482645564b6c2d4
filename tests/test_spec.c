/*
 * test_spec.c - speculative sampling keeps the model's distribution.
 *
 * spec_judge is the verdict on one drafted token: accept it, or take
 * another.  Whatever the drafter's distribution q, the token that comes out
 * must be distributed as the model's own draw (eng_sample from the same
 * logits, after temperature, top-k, top-p and min-p).  For several p, q
 * pairs over a small vocabulary -- q close to p, far from it, one-hot (the
 * lookup drafter), and p cut by top-k and min-p -- a few hundred thousand
 * verdicts with d drawn from q are counted and compared with p by a
 * chi-square test at a significance of 1e-6 (fixed seeds: the same counts
 * every run).  Accepting every draft would give q's distribution, which
 * these cases are far from; so would rejecting without the residual draw.
 *
 * Also: greedy (temperature 0) accepts exactly the argmax.
 */
#include "check.h"
#include "engine.h"
#include "model_i.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 6
#define TRIALS 300000

/* chi-square critical values at 1e-6 for 1..5 degrees of freedom */
static const double chi2_crit[] = { 0, 23.93, 27.63, 30.66, 33.38, 35.89 };

static uint64_t rng = 88172645463325252ull;

static double uniform(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static void run_case(const char *name, const float *logits, const struct eng_sampler_config *cfg,
		     const float *qv /* NULL: one-hot at d_fixed */, int32_t d_fixed)
{
	struct eng_sampler *s;
	struct eng_token_p p[V], q[V], scratch[V];
	float resid[V];
	size_t n_p, n_q = 0;
	double expect[V] = { 0 }, count[V] = { 0 }, chi2 = 0;
	int df = -1;

	CHECK(eng_sampler_create(cfg, V, &s) == 0, "sampler");
	n_p = eng_sampler_dist(s, logits, p);
	for (size_t i = 0; i < n_p; i++)
		expect[p[i].id] = p[i].p;
	if (qv)
		for (int i = 0; i < V; i++)
			if (qv[i] > 0)
				q[n_q++] = (struct eng_token_p){ i, qv[i] };
	for (int t = 0; t < TRIALS; t++) {
		int32_t d = d_fixed;

		if (qv) {
			double r = uniform(), acc = 0;

			d = q[n_q - 1].id;
			for (size_t i = 0; i < n_q; i++) {
				acc += q[i].p;
				if (r < acc) {
					d = q[i].id;
					break;
				}
			}
		}
		int32_t out = spec_judge(s, V, logits, d, qv ? q : NULL, n_q, scratch, resid);

		CHECK(out >= 0 && out < V, "%s: token %d out of range", name, out);
		if (out >= 0 && out < V)
			count[out]++;
	}
	for (int i = 0; i < V; i++) {
		if (expect[i] == 0) {
			CHECK(count[i] == 0, "%s: token %d is outside the model's distribution but came "
			      "out %.0f times", name, i, count[i]);
			continue;
		}
		double e = expect[i] * TRIALS;

		chi2 += (count[i] - e) * (count[i] - e) / e;
		df++;
	}
	if (df > 0)
		CHECK(chi2 < chi2_crit[df], "%s: the verdicts are not distributed as the model's draw "
		      "(chi-square %.1f, %d degrees of freedom, critical %.1f)",
		      name, chi2, df, chi2_crit[df]);
	printf("%-28s chi-square %6.2f (df %d)\n", name, chi2, df);
	eng_sampler_destroy(s);
}

int main(void)
{
	const float logits[V] = { 2.0f, 1.5f, 1.0f, 0.2f, -0.5f, -1.0f };
	struct eng_sampler_config plain = { .temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0,
					    .seed = 1 };
	struct eng_sampler_config cut = { .temp = 0.7f, .top_k = 4, .top_p = 1.0f, .min_p = 0.1f,
					  .seed = 2 };
	const float q_near[V] = { 0.35f, 0.25f, 0.2f, 0.1f, 0.05f, 0.05f };
	const float q_far[V] = { 0.02f, 0.03f, 0.05f, 0.1f, 0.3f, 0.5f };
	const float q_outside[V] = { 0.1f, 0, 0, 0, 0.4f, 0.5f }; /* mostly outside a cut p */

	run_case("q near p", logits, &plain, q_near, 0);
	run_case("q far from p", logits, &plain, q_far, 0);
	run_case("one-hot on the likeliest", logits, &plain, NULL, 0);
	run_case("one-hot on an unlikely one", logits, &plain, NULL, 4);
	run_case("p cut by top-k, min-p", logits, &cut, q_outside, 0);
	run_case("cut, one-hot outside p", logits, &cut, NULL, 5);

	/* greedy: the argmax, whatever was drafted */
	{
		struct eng_sampler_config greedy = { .temp = 0, .seed = 3 };
		struct eng_sampler *s;
		struct eng_token_p scratch[V];
		float resid[V];

		CHECK(eng_sampler_create(&greedy, V, &s) == 0, "sampler");
		for (int32_t d = 0; d < V; d++)
			CHECK(spec_judge(s, V, logits, d, NULL, 0, scratch, resid) == 0,
			      "greedy: draft %d judged other than the argmax", d);
		eng_sampler_destroy(s);
	}
	return failures ? 1 : 0;
}
