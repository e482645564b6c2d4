/*
 * deltanet.c - the token mixer of a hybrid's recurrent layers (qwen35): a
 * Gated DeltaNet, as the reference computes it one token at a time.
 *
 * Per token, with x the layer's normed input:
 *
 *   qkv   = x @ W_qkv                      [2 key_dim + value_dim]
 *   z     = x @ W_gate                     [value_dim]
 *   beta  = sigmoid(x @ W_beta)            [H_v]
 *   g     = softplus(x @ W_alpha + dt_bias) * a     (a = -exp(A_log), < 0)
 *   c     = silu(causal_conv(qkv))         the last d_conv inputs, per channel
 *   q, k  = l2norm per head (k heads), q / sqrt(d); v: H_v heads of d
 *   per v head h (q, k from k head h % H_k, as the reference tiles them):
 *     S    = S * exp(g_h)                  S [d (v)][d (k)]
 *     S   += (v - S k) beta_h  outer  k
 *     o    = S q
 *   out   = (rmsnorm(o) * ssm_norm) * silu(z) per head,  @ W_out
 *
 * The matmuls take the whole batch; the recurrence goes token after token.
 * State: per layer, the last d_conv - 1 inputs of the convolution and the H_v
 * matrices S (each stored transposed: head_step says why), in the context
 * (zeroed by eng_ctx_reset).  Threading: the
 * convolution runs on the caller; the recurrence, d^2 per head and token
 * (a tenth of a Qwen3.5-9B decode step when it ran on the caller alone),
 * goes head by head over the pool, each head through every token of the
 * batch.  A rewind (below) steps on the caller.
 *
 * Undoing tokens (eng_ctx_truncate): a checkpoint copies the state aside,
 * and each token fed after it leaves the recurrence's inputs (the
 * convolution's input row, beta and g: what step() takes) in c->undo_in.
 * Rewinding restores the copy and steps through the kept tokens' inputs
 * again: the same arithmetic on the same numbers, so the same state as if
 * the undone tokens had never come.
 */
#include "model_i.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

static float sigmoid(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

static float silu(float x)
{
	return x / (1.0f + expf(-x));
}

static float softplus(float x)
{
	return x > 20.0f ? x : logf(1.0f + expf(x));
}

/* x / max(|x|, eps), the sum of squares in double as ggml's l2_norm */
static void l2norm(float *x, uint32_t n, float eps)
{
	double ss = 0;

	for (uint32_t i = 0; i < n; i++)
		ss += (double)(x[i] * x[i]);
	float scale = 1.0f / fmaxf(sqrtf((float)ss), eps);
	for (uint32_t i = 0; i < n; i++)
		x[i] *= scale;
}

/* The causal convolution of one token, then silu; the state keeps the last
 * K - 1 inputs.  qkv (conv_dim channels) in place becomes q, k (l2-normed per
 * head, q / sqrt(d)) and v. */
static void conv_step(const struct eng_ctx *c, const struct layer_w *w, float *conv_state,
		      float *qkv)
{
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t d = hp->ssm_d_state, Hk = hp->ssm_n_k_heads;
	uint32_t K = hp->ssm_d_conv;
	size_t key_dim = (size_t)Hk * d, conv_dim = 2 * key_dim + hp->ssm_d_inner;
	const float *kern = (const float *)w->ssm_conv.data; /* [conv_dim][K] */

	for (size_t ch = 0; ch < conv_dim; ch++) {
		float sum = 0.0f;

		for (uint32_t j = 0; j + 1 < K; j++)
			sum += conv_state[j * conv_dim + ch] * kern[ch * K + j];
		sum += qkv[ch] * kern[ch * K + K - 1];
		for (uint32_t j = 0; j + 2 < K; j++)
			conv_state[j * conv_dim + ch] = conv_state[(j + 1) * conv_dim + ch];
		if (K > 1)
			conv_state[(K - 2) * conv_dim + ch] = qkv[ch];
		qkv[ch] = silu(sum);
	}

	float *q = qkv, *k = qkv + key_dim;
	float qscale = 1.0f / sqrtf((float)d);

	for (uint32_t h = 0; h < Hk; h++) {
		l2norm(q + h * d, d, hp->norm_eps);
		l2norm(k + h * d, d, hp->norm_eps);
		for (uint32_t i = 0; i < d; i++)
			q[h * d + i] *= qscale;
	}
}

/*
 * v head h of one token: qkv as conv_step left it, the head's state s and
 * its output oh [d].  The state is kept transposed, s[j][i] = S[i][j] (j
 * along k, i along v), so that each step runs along contiguous rows of s
 * for DN_ROWS values of i at once, in vectors, while each i keeps its own
 * recurrence: its decay, its dot products summed in double in the order
 * j = 0, 1, ... (ggml's sum_rows of a product), its update.  Those are the
 * reference's operations in its order, so the bits are the same as S
 * decayed, then updated, then read; only which i goes beside which changed.
 * With S row-major, each i's sums were a chain of double additions waiting
 * on each other.  Built twice (target_clones), for AVX2 and for the
 * baseline, picked when the program loads: no FMA in either, and the same
 * operations in the same order per value, so both give the same bits.
 * Qwen3.5-9B-shaped decode: the recurrence 4.2% -> 2.5% of the samples.
 */
#define DN_ROWS 32

/*
 * A strip (DN_ROWS values of each of the d rows of s: 2 cache lines a row
 * in 512-byte steps) is read from memory by its first pass and is in L1 for
 * its second.  During the second pass the next strip's lines are fetched,
 * for writing (its first pass updates them): after the last strip, the
 * first of `next`, the state the caller runs next (NULL: none).  The
 * state, 64 KiB a head and 2 MiB a layer read and written every token, was
 * otherwise fetched a line at a time as the strided loads missed.  Same
 * bits.  Qwen3.5-9B-shaped decode, this machine's slower memory speed:
 * the recurrence 3.1-3.4% -> 2.2-2.8% of the samples.
 */
#define DN_LINE_FLOATS 16

__attribute__((target_clones("avx2", "default"))) static void
head_step(const struct eng_hparams *hp, float *s, const float *qkv, uint32_t h, float beta,
	  float g, float *oh, const float *next)
{
	uint32_t d = hp->ssm_d_state, Hk = hp->ssm_n_k_heads;
	size_t key_dim = (size_t)Hk * d;
	const float *kh = qkv + key_dim + (h % Hk) * d, *qh = qkv + (h % Hk) * d;
	const float *vh = qkv + 2 * key_dim + (size_t)h * d;
	float decay = expf(g);

	for (uint32_t i0 = 0; i0 < d; i0 += DN_ROWS) {
		uint32_t n = d - i0 < DN_ROWS ? d - i0 : DN_ROWS;
		double sk[DN_ROWS] = { 0 }, sq[DN_ROWS] = { 0 };
		float delta[DN_ROWS];

		/* S *= exp(g); sk = S k */
		for (uint32_t j = 0; j < d; j++) {
			float *sj = s + (size_t)j * d + i0;

			for (uint32_t r = 0; r < n; r++) {
				sj[r] *= decay;
				sk[r] += (double)(sj[r] * kh[j]);
			}
		}
		for (uint32_t r = 0; r < n; r++)
			delta[r] = (vh[i0 + r] - (float)sk[r]) * beta;
		/* S += delta outer k; o = S q; the next strip fetched */
		bool last = i0 + DN_ROWS >= d;
		const float *pf = last ? next : s + i0 + DN_ROWS;
		uint32_t pleft = last ? d : d - i0 - DN_ROWS;
		uint32_t pn = pleft < DN_ROWS ? pleft : DN_ROWS;

		for (uint32_t j = 0; j < d; j++) {
			float *sj = s + (size_t)j * d + i0;

			if (pf)
				for (uint32_t r = 0; r < pn; r += DN_LINE_FLOATS)
					__builtin_prefetch(pf + (size_t)j * d + r, 1);
			for (uint32_t r = 0; r < n; r++) {
				sj[r] += kh[j] * delta[r];
				sq[r] += (double)(sj[r] * qh[j]);
			}
		}
		for (uint32_t r = 0; r < n; r++)
			oh[i0 + r] = (float)sq[r];
	}
}

/* One token through the convolution and the recurrence, every head on this
 * thread: qkv (conv_dim channels) in place becomes the token's output o
 * [value_dim]. */
static void step(struct eng_ctx *c, const struct layer_w *w, float *conv_state, float *S,
		 float *qkv, const float *beta, const float *g, float *o)
{
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t d = hp->ssm_d_state;

	conv_step(c, w, conv_state, qkv);
	for (uint32_t h = 0; h < hp->ssm_n_v_heads; h++)
		head_step(hp, S + (size_t)h * d * d, qkv, h, beta[h], g[h], o + (size_t)h * d,
			  h + 1 < hp->ssm_n_v_heads ? S + (size_t)(h + 1) * d * d : NULL);
}

static size_t conv_dim_of(const struct eng_hparams *hp)
{
	return 2 * (size_t)hp->ssm_n_k_heads * hp->ssm_d_state + hp->ssm_d_inner;
}

/* Where the recurrence's inputs of the token `since` positions after the
 * checkpoint go, in recurrent layer slot. */
static float *undo_inputs(struct eng_ctx *c, uint32_t slot, uint32_t since)
{
	size_t row = conv_dim_of(&c->m->hp) + 2 * c->m->hp.ssm_n_v_heads;

	return c->undo_in + ((size_t)slot * c->undo_max + since) * row;
}

static size_t conv_state_floats(const struct eng_ctx *c)
{
	const struct eng_hparams *hp = &c->m->hp;

	return (size_t)c->m->n_rs_layers * (hp->ssm_d_conv - 1) * conv_dim_of(hp);
}

static size_t ssm_state_floats(const struct eng_ctx *c)
{
	const struct eng_hparams *hp = &c->m->hp;

	return (size_t)c->m->n_rs_layers * hp->ssm_n_v_heads * hp->ssm_d_state * hp->ssm_d_state;
}

void deltanet_checkpoint(struct eng_ctx *c)
{
	memcpy(c->undo_conv, c->conv_state, conv_state_floats(c) * sizeof(float));
	memcpy(c->undo_ssm, c->ssm_state, ssm_state_floats(c) * sizeof(float));
}

void deltanet_rewind(struct eng_ctx *c, uint32_t n)
{
	const struct eng_hparams *hp = &c->m->hp;
	size_t conv_dim = conv_dim_of(hp);
	uint32_t Hv = hp->ssm_n_v_heads, d = hp->ssm_d_state, K = hp->ssm_d_conv;
	float *qkv = c->ssm_buf, *o = c->ssm_buf + conv_dim; /* scratch */

	memcpy(c->conv_state, c->undo_conv, conv_state_floats(c) * sizeof(float));
	memcpy(c->ssm_state, c->undo_ssm, ssm_state_floats(c) * sizeof(float));
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct layer_w *w = &c->m->layers[l];

		if (!w->recurrent)
			continue;
		for (uint32_t t = 0; t < n; t++) {
			const float *in = undo_inputs(c, w->slot, t);

			memcpy(qkv, in, conv_dim * sizeof(float));
			step(c, w, c->conv_state + (size_t)w->slot * (K - 1) * conv_dim,
			     c->ssm_state + (size_t)w->slot * Hv * d * d, qkv, in + conv_dim,
			     in + conv_dim + Hv, o);
		}
	}
}

/*
 * The v heads of a batch over the pool: a head's rows of every token (its
 * state matrices are its own; the rows' tokens in order, as a sequence's
 * states must go), then its gated norm.  Threads take heads from a shared
 * counter, so one slowed by a neighbour does not hold the other up.
 */
struct heads_job {
	struct eng_ctx *c;
	const struct layer_w *w;
	uint32_t nb;
	const float *qkv, *z, *beta, *g; /* as deltanet_forward lays them out */
	float *o;
	_Atomic uint32_t next; /* the next head to take */
};

/* Batch row b's state of v head h in layer w. */
static float *head_state(const struct eng_ctx *c, const struct layer_w *w, uint32_t b, uint32_t h)
{
	const struct eng_hparams *hp = &c->m->hp;
	size_t dd = (size_t)hp->ssm_d_state * hp->ssm_d_state;

	return c->row_ctx[b]->ssm_state + ((size_t)w->slot * hp->ssm_n_v_heads + h) * dd;
}

static void heads_worker(void *arg, unsigned ith, unsigned nth)
{
	struct heads_job *j = arg;
	const struct eng_ctx *c = j->c;
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t d = hp->ssm_d_state, Hv = hp->ssm_n_v_heads, V = hp->ssm_d_inner;
	size_t conv_dim = 2 * (size_t)hp->ssm_n_k_heads * d + V;
	const float *nw = (const float *)j->w->ssm_norm.data;
	uint32_t h = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed), nh;

	(void)ith;
	(void)nth;
	for (; h < Hv; h = nh) {
		/* the head after this one, taken now so that its state can be
		 * fetched while this one's is computed */
		nh = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		for (uint32_t b = 0; b < j->nb; b++) {
			float *oh = j->o + (size_t)b * V + (size_t)h * d;
			const float *zh = j->z + (size_t)b * V + (size_t)h * d;
			const float *next = b + 1 < j->nb ? head_state(c, j->w, b + 1, h)
					    : nh < Hv	  ? head_state(c, j->w, 0, nh)
							  : NULL;

			head_step(hp, head_state(c, j->w, b, h), j->qkv + b * conv_dim, h,
				  j->beta[b * Hv + h], j->g[b * Hv + h], oh, next);
			rmsnorm(oh, oh, nw, d, hp->norm_eps);
			for (uint32_t i = 0; i < d; i++)
				oh[i] *= silu(zh[i]);
		}
	}
}

void deltanet_forward(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	const struct layer_w *w = &c->m->layers[l];
	uint32_t d = hp->ssm_d_state, Hv = hp->ssm_n_v_heads, V = hp->ssm_d_inner;
	uint32_t K = hp->ssm_d_conv;
	size_t conv_dim = 2 * (size_t)hp->ssm_n_k_heads * d + V;
	float *qkv = c->ssm_buf;                      /* [nb][conv_dim] */
	float *z = qkv + (size_t)nb * conv_dim;       /* [nb][V] */
	float *beta = z + (size_t)nb * V;             /* [nb][Hv] */
	float *g = beta + (size_t)nb * Hv;            /* [nb][Hv] */
	float *o = g + (size_t)nb * Hv;               /* [nb][V] */
	const float *dt = (const float *)w->ssm_dt.data, *a = (const float *)w->ssm_a.data;
	/* the projections, for the whole batch */
	{
		const struct wt *ws[2] = { &w->ssm_qkv, &w->ssm_gate };
		float *outs[2] = { qkv, z };

		matmul_shared(c, 2, ws, outs, c->xb, nb);
	}
	{
		const struct wt *ws[2] = { &w->ssm_beta, &w->ssm_alpha };
		float *outs[2] = { beta, g };

		matmul_shared(c, 2, ws, outs, c->xb, nb);
	}
	for (uint32_t b = 0; b < nb; b++)
		for (uint32_t h = 0; h < Hv; h++) {
			beta[b * Hv + h] = sigmoid(beta[b * Hv + h]);
			g[b * Hv + h] = softplus(g[b * Hv + h] + dt[h]) * a[h];
		}

	/* the convolution, token after token (each row's own sequence: its
	 * state, its undo record) */
	for (uint32_t b = 0; b < nb; b++) {
		struct eng_ctx *rc = c->row_ctx[b];
		float *conv_state = rc->conv_state + (size_t)w->slot * (K - 1) * conv_dim;
		uint32_t since = c->row_pos[b] - rc->undo_from;

		if (rc->undo_ok && since < rc->undo_max) {
			float *in = undo_inputs(rc, w->slot, since);

			memcpy(in, qkv + b * conv_dim, conv_dim * sizeof(float));
			memcpy(in + conv_dim, beta + b * Hv, Hv * sizeof(float));
			memcpy(in + conv_dim + Hv, g + b * Hv, Hv * sizeof(float));
		}
		conv_step(c, w, conv_state, qkv + b * conv_dim);
	}

	/* the recurrence and the gated norm, head by head over the pool */
	struct heads_job j = { .c = c, .w = w, .nb = nb, .qkv = qkv, .z = z, .beta = beta,
			       .g = g, .o = o };

	atomic_init(&j.next, 0);
	eng_pool_run(c->pool, heads_worker, &j);
	matmul1(c, &w->ssm_out, c->xb, o, nb);
}
