/*
 * spec.c - speculative decoding: several tokens per pass of the model.
 *
 * A pass of the model over k + 1 positions reads every weight once, as a
 * pass over one does; when the weights stream from storage, or even from
 * memory, the extra positions cost little next to that read.  So a cheap
 * drafter guesses the next k tokens, the model checks them all in one pass
 * (the batched prompt path), and every guess it agrees with is a token for
 * nearly nothing.  One step (eng_spec_step):
 *
 *   last            the token chosen last, not yet fed
 *   d1..dk          drafted: by lookup (the tokens that followed the
 *                   latest earlier occurrence of the text's last n-gram),
 *                   else by the draft model, one token at a time
 *   pass            the model fed [last, d1..dk], logits of every row:
 *                   row i is what the model says follows d_i (d_0 = last)
 *   accept          d_i while the model agrees with it (greedy: its argmax
 *                   is d_i; sampling: with probability min(1, p(d_i) /
 *                   q(d_i)), the standard scheme that leaves the output
 *                   distributed as the model's own, p the model's and q
 *                   the drafter's distribution, one-hot for lookup)
 *   one more        at the first disagreement the model's choice (sampling:
 *                   from max(0, p - q), renormalized), or, all accepted,
 *                   a token from the last row: every pass gives at least
 *                   one token, as plain decoding does
 *   undo            the rejected drafts are forgotten (eng_ctx_truncate)
 *
 * Greedy output is the plain greedy output token for token: the kept rows
 * are bit-identical to one-token passes (test_undo), and every token is the
 * model's argmax.
 *
 * How many to draft (choose_k): a pass over n positions costs t1 + s (n - 1),
 * a drafted token td, and each draft is accepted with probability a (per
 * drafter, from what recent passes kept, 1/2 before any); a pass drafting
 * k gives (1 - a^(k+1)) / (1 - a) tokens on average.  t1 is the wall time
 * of a plain pass; s is what a position adds to the pass's computing, from
 * the engine's CPU time of each pass (eng_ctx_layer_ns, outside_ns) against
 * a plain pass's, until measured a quarter of a plain pass's CPU time.  Not
 * the wall time: streamed, a pass's wall time is the read of the streamed
 * layers and varies by more than the few milliseconds a position adds, and
 * a slope taken from it (wall - t1, over k) was mostly that noise, biased
 * up by the clip at zero: adaptive drafting drafted 2.2 tokens a pass where
 * always drafting 8 made 3.3.  The compute is an upper bound on what a
 * position adds to the wall time (streamed, the read ahead hides some of
 * it), and exact when nothing streams.  k is the one that
 * gives the most tokens per second, 0 (plain decoding) when none pays
 * (between --draft-min and --draft-max, where they are given).  The
 * first pass is plain, to measure t1; after that every PROBE_EVERY-th pass
 * makes the other choice (plain when drafting, one draft when not), to keep
 * t1 measured and to notice when drafting starts to pay (a probe that
 * drafted for nothing doubles the wait for the next, up to
 * PROBE_EVERY_MAX).  Every estimate
 * is a moving average of measured passes: streamed from storage, t1 is the
 * read and s small beside it, so k grows; fully resident, s is a good part
 * of t1 and k stays small or 0.
 *
 * The draft model's context follows the model's: it has been fed every
 * token the model has but those in `pending` (accepted in a pass it did
 * not draft, or its own last draft, accepted); they go in ahead of the
 * next draft.
 */
#include "model_i.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DRAFT_MAX_DEFAULT 16
#define LOOKUP_MIN_DEFAULT 2
#define LOOKUP_LONGEST 8  /* the longest n-gram looked for */
#define PROBE_EVERY 32     /* passes between probes, at first */
#define PROBE_EVERY_MAX 256 /* ... doubled by every probe that drafted for nothing */
#define EMA 0.1           /* weight of the newest measurement */
#define KEEP 0.95         /* what acceptance counts keep of the past, per pass */
#define SLOPE_PRIOR 0.25  /* a position's compute, of a plain pass's, until
			   * measured (8 positions at 3x one resident) */

enum { SRC_LOOKUP, SRC_DRAFT, SRC_COUNT };

/* What one drafter's proposals have earned, the past fading by KEEP a pass. */
struct src_stats {
	double accepted; /* drafts kept */
	double trials;   /* accepted + passes that rejected one */
	double td;       /* seconds per drafted token (EMA) */
};

struct eng_spec {
	struct eng_ctx *target, *draft;
	struct eng_spec_config cfg;
	struct eng_sampler *dsamp;   /* the draft model's sampler */
	uint32_t n_vocab;
	int32_t *hist;               /* every token fed to the model, in order */
	size_t n_hist, cap_hist;
	int32_t *pending;            /* [UNDO_MAX + 1] fed to the model, not the draft */
	uint32_t n_pending;
	float *rows;                 /* [draft_max + 1][n_vocab] the pass's logits */
	float *dlogits;              /* [n_vocab] the draft model's */
	struct eng_token_p *q;       /* [draft_max][n_vocab] the draft's dists */
	uint32_t *nq;                /* [draft_max] */
	struct eng_token_p *p;       /* [n_vocab] the model's dist */
	float *resid;                /* [n_vocab] max(0, p - q) */
	struct src_stats src[SRC_COUNT];
	double t1, slope;            /* pass cost model (EMA); 0: not measured */
	double c1;                   /* a plain pass's CPU time (EMA) */
	bool slope_seen;
	uint32_t since_probe, probe_every;
	struct eng_spec_stats stats;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void ema(double *v, double x)
{
	*v = *v > 0 ? (1 - EMA) * *v + EMA * x : x;
}

static uint32_t umin(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

int eng_spec_create(struct eng_ctx *target, const struct eng_spec_config *cfg,
		    struct eng_spec **out, char *err, size_t errlen)
{
	const struct eng_model *tm = target->m;
	uint32_t V = tm->hp.n_vocab;
	struct eng_spec *sp;

	*out = NULL;
	if (cfg->draft) {
		const struct eng_model *dm = cfg->draft->m;
		const struct eng_tokenizer *tt = tm->tok, *dt = dm->tok;

		if (dm->hp.n_vocab != V) {
			snprintf(err, errlen,
				 "the draft model's vocabulary has %u tokens, the model's %u: a draft "
				 "must share the model's vocabulary",
				 dm->hp.n_vocab, V);
			return -EINVAL;
		}
		/* same size is not the same vocabulary: compare the pieces */
		for (uint32_t id = 0; id < V; id++) {
			char a[128], b[128];
			int na = eng_token_to_piece(tt, (int32_t)id, a, sizeof(a));
			int nb = eng_token_to_piece(dt, (int32_t)id, b, sizeof(b));

			if (na != nb || (na > 0 && memcmp(a, b, (size_t)umin((uint32_t)na, sizeof(a))))) {
				snprintf(err, errlen,
					 "the draft model's token %u is not the model's: a draft must "
					 "share the model's vocabulary",
					 id);
				return -EINVAL;
			}
		}
		if (eng_tokenizer_bos(tt) != eng_tokenizer_bos(dt)) {
			snprintf(err, errlen, "the draft model's BOS token (%d) is not the model's (%d)",
				 eng_tokenizer_bos(dt), eng_tokenizer_bos(tt));
			return -EINVAL;
		}
		if (cfg->draft->n_ctx < target->n_ctx) {
			snprintf(err, errlen, "the draft's context (%u) is shorter than the model's (%u)",
				 cfg->draft->n_ctx, target->n_ctx);
			return -EINVAL;
		}
	}
	if (!cfg->draft && !cfg->lookup) {
		snprintf(err, errlen, "no drafter: give a draft model, lookup, or both");
		return -EINVAL;
	}
	sp = calloc(1, sizeof(*sp));
	if (!sp)
		goto oom;
	sp->target = target;
	sp->draft = cfg->draft;
	sp->probe_every = PROBE_EVERY;
	sp->cfg = *cfg;
	if (!sp->cfg.draft_max)
		sp->cfg.draft_max = DRAFT_MAX_DEFAULT;
	if (!sp->cfg.lookup_min)
		sp->cfg.lookup_min = LOOKUP_MIN_DEFAULT;
	/* every draft and the token before it must be undoable */
	{
		uint32_t undo = eng_ctx_undo_max(target);

		if (cfg->draft)
			undo = umin(undo, eng_ctx_undo_max(cfg->draft));
		sp->cfg.draft_max = umin(sp->cfg.draft_max, undo > 1 ? undo - 1 : 0);
		if (!sp->cfg.draft_max) {
			snprintf(err, errlen, "the context's batch is too small to verify drafts");
			free(sp);
			return -EINVAL;
		}
		sp->cfg.draft_min = umin(sp->cfg.draft_min, sp->cfg.draft_max);
	}
	sp->n_vocab = V;
	{
		struct eng_sampler_config sc = cfg->sampler;

		sc.seed = ~sc.seed; /* the draft's draws are its own */
		if (eng_sampler_create(&sc, V, &sp->dsamp))
			goto oom;
	}
	sp->cap_hist = 1024;
	sp->hist = malloc(sp->cap_hist * sizeof(*sp->hist));
	sp->pending = malloc((UNDO_MAX + 1) * sizeof(*sp->pending));
	sp->rows = malloc((size_t)(sp->cfg.draft_max + 1) * V * sizeof(float));
	sp->dlogits = malloc((size_t)V * sizeof(float));
	sp->q = malloc((size_t)sp->cfg.draft_max * V * sizeof(*sp->q));
	sp->nq = calloc(sp->cfg.draft_max, sizeof(*sp->nq));
	sp->p = malloc((size_t)V * sizeof(*sp->p));
	sp->resid = malloc((size_t)V * sizeof(float));
	if (!sp->hist || !sp->pending || !sp->rows || !sp->dlogits || !sp->q || !sp->nq ||
	    !sp->p || !sp->resid)
		goto oom;
	*out = sp;
	return 0;
oom:
	eng_spec_destroy(sp);
	snprintf(err, errlen, "out of memory for speculative decoding");
	return -ENOMEM;
}

void eng_spec_destroy(struct eng_spec *sp)
{
	if (!sp)
		return;
	eng_sampler_destroy(sp->dsamp);
	free(sp->hist);
	free(sp->pending);
	free(sp->rows);
	free(sp->dlogits);
	free(sp->q);
	free(sp->nq);
	free(sp->p);
	free(sp->resid);
	free(sp);
}

void eng_spec_reset(struct eng_spec *sp)
{
	eng_ctx_reset(sp->target);
	if (sp->draft)
		eng_ctx_reset(sp->draft);
	sp->n_hist = 0;
	sp->n_pending = 0;
}

const struct eng_spec_stats *eng_spec_stats(const struct eng_spec *sp)
{
	return &sp->stats;
}

static int hist_add(struct eng_spec *sp, const int32_t *ids, size_t n)
{
	if (sp->n_hist + n > sp->cap_hist) {
		size_t cap = (sp->n_hist + n) * 2;
		int32_t *h = realloc(sp->hist, cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		sp->hist = h;
		sp->cap_hist = cap;
	}
	memcpy(sp->hist + sp->n_hist, ids, n * sizeof(*ids));
	sp->n_hist += n;
	return 0;
}

static int target_decode(struct eng_spec *sp, const int32_t *ids, size_t n, float *logits,
			 bool all)
{
	if (sp->cfg.decode)
		return sp->cfg.decode(sp->cfg.decode_arg, ids, n, logits, all);
	return eng_decode(sp->target, ids, n, logits, all);
}

/* The pending tokens into the draft model. */
static int draft_catch_up(struct eng_spec *sp)
{
	int rc = 0;

	if (sp->n_pending)
		rc = eng_decode(sp->draft, sp->pending, sp->n_pending, NULL, false);
	sp->n_pending = 0;
	return rc;
}

static int pend(struct eng_spec *sp, const int32_t *ids, uint32_t n)
{
	int rc = 0;

	if (!sp->draft)
		return 0;
	/* more than the buffer: in now, the draft reads them in one batch */
	if (sp->n_pending + n > UNDO_MAX + 1)
		rc = draft_catch_up(sp);
	if (rc)
		return rc;
	if (n > UNDO_MAX + 1)
		return eng_decode(sp->draft, ids, n, NULL, false);
	memcpy(sp->pending + sp->n_pending, ids, n * sizeof(*ids));
	sp->n_pending += n;
	return 0;
}

int eng_spec_feed(struct eng_spec *sp, const int32_t *ids, size_t n, float *logits)
{
	int rc = target_decode(sp, ids, n, logits, false);

	if (!rc)
		rc = hist_add(sp, ids, n);
	if (!rc && sp->draft)
		rc = draft_catch_up(sp);
	if (!rc && sp->draft)
		rc = eng_decode(sp->draft, ids, n, NULL, false);
	return rc;
}

int eng_spec_shift(struct eng_spec *sp, uint32_t n_keep, uint32_t n_discard)
{
	int rc = eng_ctx_shift(sp->target, n_keep, n_discard);

	if (rc || !sp->draft)
		return rc;
	rc = draft_catch_up(sp);
	return rc ? rc : eng_ctx_shift(sp->draft, n_keep, n_discard);
}

/*
 * Lookup: the longest n-gram (lookup_min..LOOKUP_LONGEST tokens) ending the
 * text (hist, then last) that occurred before, at its latest occurrence;
 * the tokens that followed it there, up to k, into d.  Returns how many.
 */
static uint32_t lookup(struct eng_spec *sp, int32_t last, uint32_t k, int32_t *d)
{
	size_t n = sp->n_hist + 1;
	const int32_t *h = sp->hist;
#define TOK(i) ((i) == n - 1 ? last : h[i])

	for (uint32_t len = LOOKUP_LONGEST; len >= sp->cfg.lookup_min; len--) {
		if (len >= n)
			continue;
		/* an earlier occurrence ending at e (exclusive), latest first */
		for (size_t e = n - 1; e >= len; e--) {
			size_t j;

			for (j = 0; j < len && TOK(e - 1 - j) == TOK(n - 1 - j); j++)
				;
			if (j < len)
				continue;
			uint32_t m = 0;

			while (m < k && e + m < n)
				d[m] = TOK(e + m), m++;
			return m;
		}
	}
	return 0;
#undef TOK
}

/* k tokens from the draft model after last, each with the distribution it
 * was drawn from (sp->q).  Returns how many (fewer when it fails). */
static uint32_t draft_tokens(struct eng_spec *sp, int32_t last, uint32_t k, int32_t *d)
{
	int32_t t = last;

	if (draft_catch_up(sp))
		return 0;
	eng_ctx_checkpoint(sp->draft);
	for (uint32_t i = 0; i < k; i++) {
		struct eng_token_p *q = sp->q + (size_t)i * sp->n_vocab;

		if (eng_decode(sp->draft, &t, 1, sp->dlogits, false))
			return i;
		sp->nq[i] = (uint32_t)eng_sampler_dist(sp->dsamp, sp->dlogits, q);
		/* draw from q as listed */
		if (sp->nq[i] == 1) {
			t = q[0].id;
		} else {
			double r = eng_sampler_uniform(sp->dsamp), acc = 0;

			t = q[sp->nq[i] - 1].id;
			for (uint32_t j = 0; j < sp->nq[i]; j++) {
				acc += q[j].p;
				if (r < acc) {
					t = q[j].id;
					break;
				}
			}
		}
		d[i] = t;
	}
	return k;
}

static float prob_of(const struct eng_token_p *dist, size_t n, int32_t id)
{
	for (size_t i = 0; i < n; i++)
		if (dist[i].id == id)
			return dist[i].p;
	return 0.0f;
}

/*
 * The model's verdict on draft d given its logits row (what follows the
 * token before d) and q, the drafter's distribution (n_q entries; NULL:
 * one-hot at d).  Returns d when accepted, else the token to take instead.
 */
int32_t spec_judge(struct eng_sampler *s, uint32_t n_vocab, const float *row, int32_t d,
		   const struct eng_token_p *q, size_t n_q, struct eng_token_p *p, float *resid)
{
	size_t n_p = eng_sampler_dist(s, row, p);
	float pd = prob_of(p, n_p, d), qd = q ? prob_of(q, n_q, d) : 1.0f;
	double sum = 0, r, acc = 0;

	if (n_p == 1) /* greedy, or a distribution with one token */
		return p[0].id;
	if (qd > 0 && eng_sampler_uniform(s) * qd < pd)
		return d;
	/* rejected: draw from max(0, p - q) */
	memset(resid, 0, n_vocab * sizeof(float));
	for (size_t i = 0; i < n_p; i++)
		resid[p[i].id] = p[i].p;
	if (q)
		for (size_t i = 0; i < n_q; i++)
			resid[q[i].id] = fmaxf(0.0f, resid[q[i].id] - q[i].p);
	else
		resid[d] = 0.0f;
	for (size_t i = 0; i < n_p; i++)
		sum += resid[p[i].id];
	if (sum <= 0) /* p == q: cannot be rejected but for rounding */
		return d;
	r = eng_sampler_uniform(s) * sum;
	for (size_t i = 0; i < n_p; i++) {
		acc += resid[p[i].id];
		if (r < acc && resid[p[i].id] > 0)
			return p[i].id;
	}
	for (size_t i = n_p; i-- > 0;)
		if (resid[p[i].id] > 0)
			return p[i].id;
	return d;
}

/* The CPU time of the model's last pass, seconds (layers and logits). */
static double pass_cpu(const struct eng_ctx *c)
{
	uint64_t ns = c->outside_ns;

	for (uint32_t l = 0; l < c->m->hp.n_layer; l++)
		ns += c->layer_ns[l];
	return (double)ns * 1e-9;
}

/* The best number of tokens for drafter src to draft (0: none pays). */
static uint32_t choose_k(const struct eng_spec *sp, int src, uint32_t k_max)
{
	const struct src_stats *st = &sp->src[src];
	uint32_t k_min = umin(sp->cfg.draft_min, k_max), best = k_min;
	double a, best_rate = 0, t1 = sp->t1;

	double slope = sp->slope_seen ? sp->slope : SLOPE_PRIOR * (sp->c1 > 0 ? sp->c1 : t1);

	if (k_min == k_max)
		return k_max;
	if (t1 <= 0) /* a plain pass first, to know what one costs */
		return k_min;
	/*
	 * The chance a draft is kept: the mean of its Beta posterior under
	 * Jeffreys' prior, 1/2 with nothing seen, as Laplace's rule, but worth
	 * one pass of evidence rather than two: a drafter that is never right
	 * stops after three wasted passes, not five (fully resident each costs
	 * a drafted token and a wider pass, about 15% of a pass), and one that
	 * is kept earns a longer draft a pass sooner.
	 */
	a = (st->accepted + 0.5) / (st->trials + 1);
	a = a > 0.99 ? 0.99 : a;
	for (uint32_t k = k_min; k <= k_max; k++) {
		double tokens = (1 - pow(a, k + 1)) / (1 - a);
		double cost = t1 + slope * k + st->td * k;

		if (k == k_min || tokens / cost > best_rate * 1.01) {
			best_rate = tokens / cost;
			best = k;
		}
	}
	return best;
}

int eng_spec_step(struct eng_spec *sp, struct eng_sampler *s, int32_t last, int32_t *out,
		  uint32_t *n_out)
{
	struct eng_ctx *c = sp->target;
	uint32_t room = c->n_ctx - c->n_past, k_max, k = 0, a;
	int32_t d[UNDO_MAX];
	int src = SRC_LOOKUP;
	double t0, t_draft = 0;
	bool with_q = false;
	int rc;

	*n_out = 0;
	if (room == 0)
		return -ENOSPC;
	k_max = umin(sp->cfg.draft_max, room - 1);
	/* draft; now and then the other choice, to keep its cost measured */
	bool probe = sp->cfg.draft_min == 0 && sp->t1 > 0 && ++sp->since_probe >= sp->probe_every;

	if (probe)
		sp->since_probe = 0;
	if (sp->cfg.lookup && k_max) {
		uint32_t want = choose_k(sp, SRC_LOOKUP, k_max);

		if (probe)
			want = want ? 0 : 1;
		if (want)
			k = lookup(sp, last, want, d);
	}
	if (!k && sp->draft && k_max) {
		uint32_t want = choose_k(sp, SRC_DRAFT, k_max);

		if (probe)
			want = want ? 0 : 1;
		if (want) {
			t0 = now();
			k = draft_tokens(sp, last, want, d);
			t_draft = now() - t0;
			src = SRC_DRAFT;
			with_q = sp->cfg.sampler.temp > 0;
		}
	}

	/* one pass over last and the drafts */
	int32_t batch[UNDO_MAX + 1];
	uint32_t at = c->n_past;

	batch[0] = last;
	memcpy(batch + 1, d, k * sizeof(*d));
	if (k)
		eng_ctx_checkpoint(c);
	t0 = now();
	rc = target_decode(sp, batch, k + 1, sp->rows, true);
	if (rc)
		return rc;
	double t_pass = now() - t0, c_pass = pass_cpu(c);

	/* judge */
	for (a = 0; a < k; a++) {
		const float *row = sp->rows + (size_t)a * sp->n_vocab;
		int32_t t = spec_judge(s, sp->n_vocab, row, d[a],
				       with_q ? sp->q + (size_t)a * sp->n_vocab : NULL,
				       with_q ? sp->nq[a] : 0, sp->p, sp->resid);

		out[a] = t;
		if (t != d[a])
			break;
	}
	if (a == k) /* all kept: one more from the last row */
		out[a] = eng_sample(s, sp->rows + (size_t)k * sp->n_vocab);
	*n_out = a + 1;

	/* undo the rejected drafts in the model (and in the draft model) */
	if (a < k && (rc = eng_ctx_truncate(c, at + 1 + a)))
		return rc;
	if ((rc = hist_add(sp, batch, 1 + a)))
		return rc;
	if (src == SRC_DRAFT && k) {
		/* it was fed last and d1..d(k-1) */
		if (a < k)
			rc = eng_ctx_truncate(sp->draft, at + 1 + a);
		else
			rc = pend(sp, &d[k - 1], 1);
	} else {
		rc = pend(sp, batch, 1 + a);
	}
	if (rc)
		return rc;

	/* learn */
	if (k == 0) {
		ema(&sp->t1, t_pass);
		ema(&sp->c1, c_pass);
	} else {
		struct src_stats *st = &sp->src[src];

		if (sp->c1 > 0) {
			double per = fmax(0.0, (c_pass - sp->c1) / k);

			sp->slope = sp->slope_seen ? (1 - EMA) * sp->slope + EMA * per : per;
			sp->slope_seen = true;
		}
		st->accepted = KEEP * st->accepted + a;
		st->trials = KEEP * st->trials + a + (a < k);
		/* a probe that drafted for nothing: the next one comes later */
		if (probe && a == 0)
			sp->probe_every = umin(2 * sp->probe_every, PROBE_EVERY_MAX);
		else
			sp->probe_every = PROBE_EVERY;
		if (src == SRC_DRAFT)
			ema(&st->td, t_draft / k);
	}
	sp->stats.passes++;
	sp->stats.drafted += k;
	sp->stats.accepted += a;
	sp->stats.rejected += a < k;
	sp->stats.tokens += a + 1;
	return 0;
}
