/*
 * forward.c - the run state (eng_ctx) and the forward pass: the blocks every
 * architecture shares (norms, RoPE, attention, feed-forward), written once
 * and steered by the architecture's description (model_i.h, arch.c).
 *
 * The pass takes a batch of tokens through one layer at a time (all of a
 * prompt batch goes through layer L before layer L+1 is read, so a streamed
 * layer is read once per batch).  Per layer:
 *
 *   x      [B][n_embd]                       residual stream
 *   xb     = rmsnorm(x) * attn_norm
 *   q,k,v  = xb @ Wq, Wk, Wv (+ bias)        [B][q_dim], [B][kv_dim] x2
 *   q,k    = rope(rmsnorm_per_head(q, k))    (the per-head norm if the arch has it)
 *   xb2    = attention(q, KV cache)           causal, GQA, maybe a sliding window,
 *                                             maybe soft-capped scores
 *   x     += (rmsnorm(xb2 @ Wo) * post_attn_norm)   (the norm if the arch has it)
 *   xb     = rmsnorm(x) * ffn_norm
 *   x     += (rmsnorm(act(xb @ Wgate) * (xb @ Wup) @ Wdown) * post_ffn_norm)
 *
 * then logits = rmsnorm(x) * output_norm @ Woutput, soft-capped if the arch
 * says so.
 *
 * Threading: matmuls split weight rows over the pool (matmul.c), attention
 * splits (token, head) pairs; everything else is cheap and runs on the
 * caller.  All buffers are allocated in eng_ctx_create: no allocation
 * happens per token.
 */
#include "model_i.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the run state ---------------------------------------------------- */

static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;
static void gelu_table_init(void);

/* An allocation of the context; in a dry run (eng_ctx_size) only counted.
 * A failure is remembered in c->oom, so a run of them is checked once. */
static void *xcalloc(struct eng_ctx *c, size_t n, size_t sz)
{
	void *p;

	if (n && sz > SIZE_MAX / n) {
		c->oom = true;
		return NULL;
	}
	c->bytes += n * sz;
	if (c->dry)
		return NULL;
	p = calloc(n ? n : 1, sz);
	if (!p)
		c->oom = true;
	return p;
}

/* The sizes a configuration gives, checked: everything but the buffers. */
static int ctx_plan(struct eng_ctx *c, const struct eng_model *m,
		    const struct eng_ctx_config *cfg, char *err, size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	int rc;

	if (m->vocab_only) {
		snprintf(err, errlen, "the model was loaded for its vocabulary only");
		return -EINVAL;
	}
	c->m = m;
	c->k = eng_kernels_get();
	c->ak = attn_kernels_for(c->k);
	c->n_ctx = cfg->n_ctx ? cfg->n_ctx
			      : (hp->n_ctx_train < MAX_CTX_DEFAULT ? hp->n_ctx_train
								   : MAX_CTX_DEFAULT);
	if (c->n_ctx == 0)
		c->n_ctx = MAX_CTX_DEFAULT;
	if (c->n_ctx > 1u << 20) {
		snprintf(err, errlen, "context of %u tokens is too large", c->n_ctx);
		return -EINVAL;
	}
	/* 256: a streamed layer is read once per 256 prompt tokens, not four
	 * times as with 64 (benchmarks.md, Streaming: a 256-token prompt at
	 * half the layers resident 1.14x the resident time, not 1.50x), for
	 * about 0.25 MB a token of activations, touched only by prompts that
	 * long (0.75 MB where every token's logits are kept, as in eval); no
	 * slower resident (256-token prompt 31.4 tok/s, 64: 30.8). */
	c->n_batch = cfg->n_batch ? cfg->n_batch : 256;
	if (c->n_batch > c->n_ctx)
		c->n_batch = c->n_ctx;
	c->n_threads = cfg->n_threads ? cfg->n_threads : eng_cpu_count();
	c->undo_anywhere = m->n_rs_layers == 0;
	for (uint32_t l = 0; l < hp->n_layer; l++)
		if (kv_slots(m, l, c->n_ctx, c->n_batch) < c->n_ctx)
			c->undo_anywhere = false;
	/* a ring keeps n_batch - 1 rows beyond its window: so many, and the
	 * token about to be fed, can be undone */
	c->undo_max = c->undo_anywhere ? c->n_ctx : c->n_batch < UNDO_MAX ? c->n_batch : UNDO_MAX;
	c->q_dim = hp->n_head * hp->head_dim;
	c->kv_dim = hp->n_head_kv * hp->head_dim;
	if ((rc = kv_check(m, cfg->type_k, cfg->type_v, err, errlen)))
		return rc;
	c->type_k = cfg->type_k;
	c->type_v = cfg->type_v;
	c->k_row = eng_row_bytes(kv_gguf_type(c->type_k), c->kv_dim);
	c->v_row = eng_row_bytes(kv_gguf_type(c->type_v), c->kv_dim);
	return 0;
}

/* Every buffer of the run state (or, dry, its size). */
static void ctx_alloc(struct eng_ctx *c)
{
	const struct eng_model *m = c->m;
	const struct eng_hparams *hp = &m->hp;
	unsigned nth = c->n_threads;
	size_t max_in, n_ff;

	/* only attention layers hold KV cache, a sliding-window layer a ring
	 * of its window (kv_slots); a hybrid's recurrent layers hold a small
	 * state each instead */
	c->kv = xcalloc(c, m->n_kv_layers, sizeof(*c->kv));
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		uint32_t n = kv_slots(m, l, c->n_ctx, c->n_batch);
		uint64_t before = c->bytes;
		uint8_t *k, *v;
		uint32_t *tag;

		if (m->layers[l].recurrent)
			continue;
		k = xcalloc(c, n, c->k_row);
		v = xcalloc(c, n, c->v_row);
		tag = n < c->n_ctx ? xcalloc(c, n, sizeof(uint32_t)) : NULL;
		c->kv_bytes += c->bytes - before;
		if (c->kv) {
			c->kv[m->layers[l].slot] = (struct kv_layer){ k, v, n, tag };
		} else {
			free(k);
			free(v);
			free(tag);
		}
	}
	max_in = hp->n_embd > c->q_dim ? hp->n_embd : c->q_dim;
	max_in = max_in > hp->ssm_d_inner ? max_in : hp->ssm_d_inner;
	c->x = xcalloc(c, (size_t)c->n_batch * hp->n_embd, sizeof(float));
	c->xb = xcalloc(c, (size_t)c->n_batch * max_in, sizeof(float));
	c->xb2 = xcalloc(c, (size_t)c->n_batch * max_in, sizeof(float));
	c->q = xcalloc(c, (size_t)c->n_batch * c->q_dim * (m->arch->gated_q ? 2 : 1),
		       sizeof(float));
	c->qgate = xcalloc(c, m->arch->gated_q ? (size_t)c->n_batch * c->q_dim : 0, sizeof(float));
	if (m->n_rs_layers) {
		size_t conv_dim = 2 * (size_t)hp->ssm_n_k_heads * hp->ssm_d_state + hp->ssm_d_inner;

		c->conv_state = xcalloc(c, (size_t)m->n_rs_layers * (hp->ssm_d_conv - 1) * conv_dim,
					sizeof(float));
		c->ssm_state = xcalloc(c, (size_t)m->n_rs_layers * hp->ssm_n_v_heads *
						  hp->ssm_d_state * hp->ssm_d_state,
				       sizeof(float));
		c->ssm_buf = xcalloc(c, (size_t)c->n_batch * (conv_dim + 2 * hp->ssm_d_inner +
							     2 * hp->ssm_n_v_heads),
				     sizeof(float));
		c->undo_conv = xcalloc(c, (size_t)m->n_rs_layers * (hp->ssm_d_conv - 1) * conv_dim,
				       sizeof(float));
		c->undo_ssm = xcalloc(c, (size_t)m->n_rs_layers * hp->ssm_n_v_heads *
						 hp->ssm_d_state * hp->ssm_d_state,
				      sizeof(float));
		c->undo_in = xcalloc(c, (size_t)m->n_rs_layers * c->undo_max *
						(conv_dim + 2 * hp->ssm_n_v_heads),
				     sizeof(float));
	}
	c->kb = xcalloc(c, (size_t)c->n_batch * c->kv_dim, sizeof(float));
	c->vb = xcalloc(c, (size_t)c->n_batch * c->kv_dim, sizeof(float));
	/* a mixture's feed_forward_length is not a matrix it has */
	n_ff = m->arch->moe ? hp->n_ff_exp : hp->n_ff;
	/* a mixture's rows are pairs: a token and one of its k experts */
	c->qact_rows = c->n_batch * (m->arch->moe ? hp->n_expert_used : 1);
	c->hb = xcalloc(c, (size_t)c->qact_rows * n_ff, sizeof(float));
	c->hb2 = xcalloc(c, (size_t)c->qact_rows * n_ff, sizeof(float));
	if (m->arch->moe) {
		size_t nk = c->qact_rows;

		c->moe_probs = xcalloc(c, (size_t)c->n_batch * hp->n_expert, sizeof(float));
		c->moe_sel = xcalloc(c, nk, sizeof(uint32_t));
		c->moe_w = xcalloc(c, nk, sizeof(float));
		c->moe_rows = xcalloc(c, nk, sizeof(uint32_t));
		c->moe_pos = xcalloc(c, nk, sizeof(uint32_t));
		c->moe_first = xcalloc(c, (size_t)hp->n_expert + 1, sizeof(uint32_t));
		c->moe_route = xcalloc(c, hp->n_expert, sizeof(uint32_t));
		c->moe_mark = xcalloc(c, hp->n_expert, 1);
		c->moe_parts = xcalloc(c, 2 * (size_t)hp->n_expert, sizeof(struct mm_part));
		c->moe_slice = xcalloc(c, 2 * (size_t)hp->n_expert, sizeof(struct wt));
		c->moe_in = xcalloc(c, nk * hp->n_embd, sizeof(float));
		c->moe_y = xcalloc(c, nk * hp->n_embd, sizeof(float));
	}
	/* attention's scratch: a thread takes up to a GQA group's heads at once */
	size_t group = hp->n_head / hp->n_head_kv;

	c->att = xcalloc(c, (size_t)nth * group * c->n_ctx, sizeof(float));
	c->att16 = xcalloc(c, (size_t)nth * c->n_ctx, sizeof(eng_fp16_t));
	c->vrow = xcalloc(c, (size_t)nth * hp->head_dim, sizeof(float));
	c->vacc = xcalloc(c, (size_t)nth * group * hp->head_dim, sizeof(double));
	/* the query as f16 (2 bytes a value) or Q8_0 (34 bytes per 32) */
	c->qbuf_stride = ((size_t)hp->head_dim * 2 + 63) & ~(size_t)63;
	c->qbuf = xcalloc(c, nth * group, c->qbuf_stride);
	c->row_ctx = xcalloc(c, c->n_batch, sizeof(*c->row_ctx));
	c->row_pos = xcalloc(c, c->n_batch, sizeof(*c->row_pos));
	c->theta[0] = xcalloc(c, hp->n_rot / 2, sizeof(float));
	c->theta[1] = xcalloc(c, hp->n_rot / 2, sizeof(float));
	/* Widest quantized activation row: any matmul input, in any vec_dot
	 * format (F32 rows: 4 bytes per element; a Q8_0 or Q8_K row and its
	 * pack8 copy after it: up to 1.15 + 3.16 bytes an element, 63 of
	 * alignment and ENG_PACK8_BYTES' 128, hence half a byte an element
	 * and 192 more). */
	max_in = max_in > n_ff ? max_in : n_ff;
	c->qact_stride = (max_in * sizeof(float) + max_in / 2 + 192 + 63) & ~(size_t)63;
	/* Each row on a cache line's start (the stride is a multiple of 64):
	 * the kernels read a row's blocks 32 bytes at a time, and calloc's
	 * large blocks start 16 bytes into a page, which split every other
	 * one of those loads over two lines.  One row more for the room. */
	c->qact_mem = xcalloc(c, (size_t)c->qact_rows + 1, c->qact_stride);
	c->qact = (uint8_t *)(((uintptr_t)c->qact_mem + 63) & ~(uintptr_t)63);
	c->layer_ns = xcalloc(c, hp->n_layer, sizeof(uint64_t));
}

/* The recurrent layers' state to zero: a new sequence starts from it. */
static void rs_zero(struct eng_ctx *c)
{
	const struct eng_hparams *hp = &c->m->hp;

	if (c->m->n_rs_layers) {
		size_t conv_dim = 2 * (size_t)hp->ssm_n_k_heads * hp->ssm_d_state + hp->ssm_d_inner;

		memset(c->conv_state, 0, (size_t)c->m->n_rs_layers * (hp->ssm_d_conv - 1) *
						 conv_dim * sizeof(float));
		memset(c->ssm_state, 0, (size_t)c->m->n_rs_layers * hp->ssm_n_v_heads *
						hp->ssm_d_state * hp->ssm_d_state * sizeof(float));
	}
}

int eng_ctx_size(const struct eng_model *m, const struct eng_ctx_config *cfg,
		 struct eng_ctx_size *out, char *err, size_t errlen)
{
	struct eng_ctx c = { .dry = true };
	int rc = ctx_plan(&c, m, cfg, err, errlen);

	if (rc)
		return rc;
	ctx_alloc(&c);
	if (c.oom) {
		snprintf(err, errlen, "a context of %u tokens is too large", c.n_ctx);
		return -EINVAL;
	}
	out->n_ctx = c.n_ctx;
	out->kv_bytes = c.kv_bytes;
	out->total_bytes = c.bytes;
	return 0;
}

int eng_ctx_create(const struct eng_model *m, const struct eng_ctx_config *cfg,
		   struct eng_ctx **out, char *err, size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	struct eng_ctx *c;
	int rc;

	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		goto oom;
	rc = ctx_plan(c, m, cfg, err, errlen);
	if (rc) {
		eng_ctx_destroy(c);
		return rc;
	}
	rc = eng_pool_create(c->n_threads, &c->pool);
	if (rc) {
		snprintf(err, errlen, "cannot start %u threads", c->n_threads);
		eng_ctx_destroy(c);
		return rc;
	}
	ctx_alloc(c);
	if (c->oom)
		goto oom;
	/* The recurrent state is read, then written, on every token: its pages
	 * are made here by writing them.  Left to the first token, each page
	 * took two faults, a read mapping the zero page and a write copying
	 * it and flushing the other thread's TLB by an interprocessor
	 * interrupt (docs/benchmarks.md, issue 16, session 53). */
	rs_zero(c);
	if (m->arch->act == ACT_GELU_TANH)
		pthread_once(&gelu_once, gelu_table_init);

	/* theta for pair i at position p is p * freq_scale * base^(-2i/n_rot)
	 * (divided by the pair's factor if the model has rope factors),
	 * computed as the reference does: repeated multiplication in float.
	 * Table 1 is for sliding-window layers with a base of their own. */
	{
		const float *ff = (const float *)m->rope_freqs.data;

		if (hp->rope_longrope) /* the long factors only beyond the trained context */
			ff = (const float *)(c->n_ctx > hp->n_ctx_orig ? m->rope_long.data
								       : m->rope_short.data);
		for (int set = 0; set < 2; set++) {
			float base = set ? hp->rope_base_local : hp->rope_base;
			float theta_scale = powf(base, -2.0f / (float)hp->n_rot);
			float t = 1.0f;

			for (uint32_t i = 0; i < hp->n_rot / 2; i++) {
				float f;

				if (ff)
					memcpy(&f, &ff[i], sizeof(f));
				c->theta[set][i] = ff ? t / f : t;
				t *= theta_scale;
			}
		}
		c->rope_mscale = hp->rope_attn_factor;
	}
	*out = c;
	return 0;
oom:
	snprintf(err, errlen, "out of memory allocating the context");
	eng_ctx_destroy(c);
	return -ENOMEM;
}

void eng_ctx_destroy(struct eng_ctx *c)
{
	if (!c)
		return;
	eng_pool_destroy(c->pool);
	for (uint32_t s = 0; c->kv && s < c->m->n_kv_layers; s++) {
		free(c->kv[s].k);
		free(c->kv[s].v);
		free(c->kv[s].tag);
	}
	free(c->kv);
	free(c->x);
	free(c->xb);
	free(c->xb2);
	free(c->q);
	free(c->kb);
	free(c->vb);
	free(c->hb);
	free(c->hb2);
	free(c->moe_probs);
	free(c->moe_sel);
	free(c->moe_w);
	free(c->moe_rows);
	free(c->moe_pos);
	free(c->moe_first);
	free(c->moe_route);
	free(c->moe_mark);
	free(c->moe_parts);
	free(c->moe_slice);
	free(c->moe_in);
	free(c->moe_y);
	free(c->att);
	free(c->att16);
	free(c->vrow);
	free(c->vacc);
	free(c->qbuf);
	free(c->row_ctx);
	free(c->row_pos);
	free(c->qgate);
	free(c->conv_state);
	free(c->ssm_state);
	free(c->ssm_buf);
	free(c->undo_conv);
	free(c->undo_ssm);
	free(c->undo_in);
	free(c->theta[0]);
	free(c->theta[1]);
	free(c->qact_mem);
	free(c->layer_ns);
	free(c);
}

uint64_t eng_ctx_bytes(const struct eng_ctx *c)
{
	return c->bytes;
}

uint64_t eng_ctx_kv_bytes(const struct eng_ctx *c)
{
	return c->kv_bytes;
}

void eng_ctx_set_route_hook(struct eng_ctx *c, eng_route_fn fn, void *arg)
{
	c->route_fn = fn;
	c->route_arg = arg;
}

void eng_ctx_set_lookahead_hook(struct eng_ctx *c, eng_route_fn fn, void *arg)
{
	c->ahead_fn = fn;
	c->ahead_arg = arg;
}

const uint64_t *eng_ctx_layer_ns(const struct eng_ctx *c)
{
	return c->layer_ns;
}

uint64_t eng_ctx_outside_ns(const struct eng_ctx *c)
{
	return c->outside_ns;
}

uint32_t eng_ctx_n_ctx(const struct eng_ctx *c)
{
	return c->n_ctx;
}

uint32_t eng_ctx_n_past(const struct eng_ctx *c)
{
	return c->n_past;
}

void eng_ctx_reset(struct eng_ctx *c)
{
	c->n_past = 0;
	c->undo_ok = false;
	kv_clear(c);
	rs_zero(c);
}

/* ---- undoing tokens ---------------------------------------------------- */

void eng_ctx_checkpoint(struct eng_ctx *c)
{
	c->undo_from = c->n_past;
	c->undo_high = c->n_past;
	c->undo_ok = true;
	if (c->m->n_rs_layers)
		deltanet_checkpoint(c);
}

uint32_t eng_ctx_undo_max(const struct eng_ctx *c)
{
	return c->undo_max;
}

int eng_ctx_truncate(struct eng_ctx *c, uint32_t n_past)
{
	if (n_past > c->n_past)
		return -EINVAL;
	if (n_past == c->n_past)
		return 0;
	if (!c->undo_anywhere) {
		if (!c->undo_ok || n_past < c->undo_from ||
		    c->undo_high - c->undo_from > c->undo_max)
			return -EINVAL;
		if (c->m->n_rs_layers)
			deltanet_rewind(c, n_past - c->undo_from);
	}
	/* the cache rows past n_past stay until overwritten: no query looks
	 * beyond its own position, and a ring's tags say whose row a slot
	 * holds */
	c->n_past = n_past;
	return 0;
}

/* ---- the blocks ------------------------------------------------------- */

void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
	double ss = 0;

	for (uint32_t i = 0; i < n; i++)
		ss += (double)(x[i] * x[i]); /* float square, double sum: as ggml */
	float scale = 1.0f / sqrtf((float)(ss / n) + eps);
	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] * scale * w[i];
}

/* rmsnorm of nb rows of n, with the weight vector of wt w */
static void rmsnorm_rows(float *out, const float *x, const struct wt *w, uint32_t nb, uint32_t n,
			 float eps)
{
	for (uint32_t b = 0; b < nb; b++)
		rmsnorm(out + (size_t)b * n, x + (size_t)b * n, (const float *)w->data, n, eps);
}

static void add_bias(float *x, const struct wt *b, uint32_t n)
{
	const float *v = (const float *)b->data;

	if (!v)
		return;
	for (uint32_t i = 0; i < n; i++)
		x[i] += v[i];
}

static void add(float *x, const float *y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] += y[i];
}

void rope_heads(const struct eng_ctx *c, float *v, uint32_t n_heads, float pos,
		const float *theta_base, float freq_scale, float mscale)
{
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t half = hp->n_rot / 2;
	bool norm = hp->rope_kind == ENG_ROPE_NORM;

	for (uint32_t i = 0; i < half; i++) {
		float theta = pos * freq_scale * theta_base[i];
		float cs = cosf(theta) * mscale, sn = sinf(theta) * mscale;

		for (uint32_t h = 0; h < n_heads; h++) {
			float *x = v + (size_t)h * hp->head_dim;
			uint32_t i0 = norm ? 2 * i : i, i1 = norm ? 2 * i + 1 : i + half;
			float x0 = x[i0], x1 = x[i1];

			x[i0] = x0 * cs - x1 * sn;
			x[i1] = x0 * sn + x1 * cs;
		}
	}
}

/* GELU, tanh approximation, as the reference computes it: on the input
 * rounded to f16, the result rounded to f16 (its table of all f16 inputs).
 * So is it here: gelu_table[h] is that result for the f16 value h, as a
 * float, made once (tanhf costs 30 ns; a layer of Gemma-2-9B has 14336
 * activations a token, which made it a sixth of a decode step). */
static float gelu_table[1 << 16]; /* made in eng_ctx_create, read-only after */

static void gelu_table_init(void)
{
	for (uint32_t i = 0; i < 1u << 16; i++) {
		float h = eng_fp16_to_fp32((eng_fp16_t)i);
		float g = 0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h *
						    (1.0f + 0.044715f * h * h)));

		gelu_table[i] = eng_fp16_to_fp32(eng_fp32_to_fp16(g));
	}
}

/* h[i] = gelu(h[i]) * u[i] for n values.  The inputs go to f16 a chunk at a
 * time through the kernel set's converter (F16C's, rounding as
 * eng_fp32_to_fp16 does): converted one by one in C, the GELU took 1.7% of
 * a Gemma-2-9B decode step's samples, all of it on one thread while the
 * others waited. */
static void gelu_mul(const struct eng_kernels *k, float *h, const float *u, size_t n)
{
	eng_fp16_t hf[256];

	for (size_t i0 = 0; i0 < n; i0 += 256) {
		size_t m = n - i0 < 256 ? n - i0 : 256;

		k->from_float[ENG_TYPE_F16](h + i0, hf, m);
		for (size_t i = 0; i < m; i++) {
			float x = h[i0 + i];
			float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : gelu_table[hf[i]];

			h[i0 + i] = g * u[i0 + i];
		}
	}
}

/* h[i] = silu(h[i]) * u[i] for n values, as the reference: g / (1 + e^-g). */
static void silu_mul(float *h, const float *u, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float g = h[i];

		h[i] = g / (1.0f + expf(-g)) * u[i];
	}
}

/*
 * The FFN's gate: h = act(h) * u over n values, a share on each thread of the
 * pool.  On the caller alone, a 64-token prompt's SiLUs (a libm expf and a
 * division each, 14336 a token and layer for an 8B model) were 2.2% of its
 * samples while the other thread waited.  Each value is computed as before,
 * wherever the shares split: the same bits.
 */
struct glu_job {
	const struct eng_kernels *k;
	enum ffn_act act;
	float *h;
	const float *u;
	size_t n;
};

static void glu_worker(void *arg, unsigned ith, unsigned nth)
{
	const struct glu_job *j = arg;
	size_t i0 = j->n * ith / nth, i1 = j->n * (ith + 1) / nth;

	if (j->act == ACT_GELU_TANH)
		gelu_mul(j->k, j->h + i0, j->u + i0, i1 - i0);
	else
		silu_mul(j->h + i0, j->u + i0, i1 - i0);
}

static void glu(struct eng_ctx *c, enum ffn_act act, float *h, const float *u, size_t n)
{
	struct glu_job j = { c->k, act, h, u, n };

	eng_pool_run(c->pool, glu_worker, &j);
}

/* x = tanh(x / cap) * cap over the final logits, a share on each thread: a
 * 256k vocabulary is 256k tanhf, 8 ms a token on one. */
struct softcap_job {
	float *x;
	size_t n;
	float cap;
};

static void softcap_worker(void *arg, unsigned ith, unsigned nth)
{
	const struct softcap_job *j = arg;
	size_t i0 = j->n * ith / nth, i1 = j->n * (ith + 1) / nth;
	float inv = 1.0f / j->cap;

	for (size_t i = i0; i < i1; i++)
		j->x[i] = tanhf(j->x[i] * inv) * j->cap;
}

static void softcap(struct eng_ctx *c, float *x, size_t n, float cap)
{
	struct softcap_job j = { x, n, cap };

	eng_pool_run(c->pool, softcap_worker, &j);
}

/* x += attention(rmsnorm(x)) for the nb rows, each at its own context's
 * position (row_ctx, row_pos) */
static void attention_block(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	const struct layer_w *w = &c->m->layers[l];
	uint32_t E = hp->n_embd, hd = hp->head_dim;
	const float *theta = c->theta[w->local_rope];
	float freq_scale = w->local_rope ? 1.0f : hp->rope_freq_scale;

	/* xb = rmsnorm(x); q, k, v = xb @ Wq, Wk, Wv */
	rmsnorm_rows(c->xb, c->x, &w->attn_norm, nb, E, hp->norm_eps);
	{
		const struct wt *ws[3] = { &w->wq, &w->wk, &w->wv };
		float *outs[3] = { c->q, c->kb, c->vb };

		matmul_shared(c, 3, ws, outs, c->xb, nb);
	}
	/* a gated q (qwen35) came as [q_h | gate_h] per head: q packed to the
	 * front of c->q, the gates aside */
	if (c->m->arch->gated_q)
		for (uint32_t b = 0; b < nb; b++)
			for (uint32_t h = 0; h < hp->n_head; h++) {
				const float *src = c->q + ((size_t)b * hp->n_head + h) * 2 * hd;

				memcpy(c->qgate + (size_t)b * c->q_dim + h * hd, src + hd,
				       hd * sizeof(float));
				memmove(c->q + (size_t)b * c->q_dim + h * hd, src, hd * sizeof(float));
			}
	for (uint32_t b = 0; b < nb; b++) {
		float *q = c->q + (size_t)b * c->q_dim;
		float *k = c->kb + (size_t)b * c->kv_dim;
		float *v = c->vb + (size_t)b * c->kv_dim;
		uint32_t pos = c->row_pos[b];

		add_bias(q, &w->bq, c->q_dim);
		add_bias(k, &w->bk, c->kv_dim);
		add_bias(v, &w->bv, c->kv_dim);
		if (w->q_norm.data) {
			for (uint32_t h = 0; h < hp->n_head; h++)
				rmsnorm(q + h * hd, q + h * hd, (const float *)w->q_norm.data, hd,
					hp->norm_eps);
			for (uint32_t h = 0; h < hp->n_head_kv; h++)
				rmsnorm(k + h * hd, k + h * hd, (const float *)w->k_norm.data, hd,
					hp->norm_eps);
		}
		rope_heads(c, q, hp->n_head, (float)pos, theta, freq_scale, c->rope_mscale);
		rope_heads(c, k, hp->n_head_kv, (float)pos, theta, freq_scale, c->rope_mscale);
		if (c->m->arch->q_prescale)
			for (uint32_t i = 0; i < c->q_dim; i++)
				q[i] *= hp->attn_scale;
		kv_store(c->row_ctx[b], w->slot, pos, k, v);
	}

	/* xb2 = attention(q, cache); xb = xb2 @ Wo (normed); x += xb */
	attention(c, l, nb);
	if (c->m->arch->gated_q)
		for (size_t i = 0; i < (size_t)nb * c->q_dim; i++)
			c->xb2[i] *= 1.0f / (1.0f + expf(-c->qgate[i]));
	matmul1(c, &w->wo, c->xb, c->xb2, nb);
	if (w->post_attn_norm.data)
		rmsnorm_rows(c->xb, c->xb, &w->post_attn_norm, nb, E, hp->norm_eps);
	add(c->x, c->xb, (size_t)nb * E);
}

/* x += ffn(rmsnorm(x)) */
static void ffn_block(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	const struct layer_w *w = &c->m->layers[l];
	uint32_t E = hp->n_embd;
	size_t n = (size_t)nb * hp->n_ff;

	rmsnorm_rows(c->xb, c->x, &w->ffn_norm, nb, E, hp->norm_eps);
	{
		const struct wt *ws[2] = { &w->gate, &w->up };
		float *outs[2] = { c->hb, c->hb2 };

		matmul_shared(c, 2, ws, outs, c->xb, nb);
	}
	glu(c, c->m->arch->act, c->hb, c->hb2, n);
	matmul1(c, &w->down, c->xb, c->hb, nb);
	if (w->post_ffn_norm.data)
		rmsnorm_rows(c->xb, c->xb, &w->post_ffn_norm, nb, E, hp->norm_eps);
	add(c->x, c->xb, (size_t)nb * E);
}

/* Expert e's matrix of a layer's 3-D expert tensor w: ne1 rows, e * ne1
 * rows after expert 0's.  Nothing is copied. */
static struct wt expert_w(const struct wt *w, uint32_t e)
{
	struct wt x = *w;

	x.data = w->data + (size_t)e * w->ne1 * w->row_bytes;
	return x;
}

/* The router's choice for one token: softmax over the n experts' logits p
 * (in place, as the reference: exp of the difference to the max, the sum
 * in double), the k most probable (ties to the lower index) into sel in
 * falling order, their probabilities renormalized to sum 1 into wsel. */
static void route(float *p, uint32_t n, uint32_t k, uint32_t *sel, float *wsel)
{
	float mx = p[0];
	double sum = 0;

	for (uint32_t i = 1; i < n; i++)
		mx = p[i] > mx ? p[i] : mx;
	for (uint32_t i = 0; i < n; i++) {
		p[i] = expf(p[i] - mx);
		sum += (double)p[i];
	}
	for (uint32_t i = 0; i < n; i++)
		p[i] *= (float)(1.0 / sum);
	sum = 0;
	for (uint32_t j = 0; j < k; j++) {
		uint32_t best = UINT32_MAX;

		/* k is small (8 of 128): a scan per pick, skipping those taken */
		for (uint32_t i = 0; i < n; i++) {
			bool taken = false;

			for (uint32_t t = 0; t < j && !taken; t++)
				taken = sel[t] == i;
			if (!taken && (best == UINT32_MAX || p[i] > p[best]))
				best = i;
		}
		sel[j] = best;
		wsel[j] = p[best];
		sum += (double)p[best];
	}
	for (uint32_t j = 0; j < k; j++)
		wsel[j] /= (float)sum;
}

/*
 * The lookahead: the next layer's router applied to the residual entering
 * this layer's experts (x, normalized with the next layer's ffn_norm), its
 * picks for all rows told to the hook as a guess of what the next layer
 * will route to, so that whoever serves the weights can read them while
 * this layer computes.  Only a guess: nothing here feeds the pass.  Both
 * routers run in the one pass of the pool this layer's router took alone
 * (the two inputs stacked), so the guess costs a router's bytes and no
 * wake-up of the pool; it borrows buffers this layer fills whole later
 * (moe_in, moe_y, moe_rows).  With a hook set and room for the two inputs
 * in the activation rows (2 B <= qact_rows, always with k >= 2); else the
 * router alone.
 *
 *   in    = [xb ; rmsnorm(x) * ffn_norm[l + 1]]       [2B][E]     (in moe_in)
 *   probs = in[0..B) @ Wgate_inp[l]                   [B][n_expert]
 *   next  = in[B..2B) @ Wgate_inp[l + 1]              [B][n_expert]  (in moe_y)
 */
static bool routers(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	const struct layer_w *w = &c->m->layers[l], *w1 = &c->m->layers[l + 1];
	uint32_t E = hp->n_embd;
	struct mm_part parts[2] = {
		{ &w->gate_inp, c->moe_probs, 0, nb, 0 },
		{ &w1->gate_inp, c->moe_y, nb, nb, 0 },
	};

	if (!c->ahead_fn || l + 1 >= hp->n_layer || 2 * nb > c->qact_rows ||
	    (size_t)hp->n_expert_used * E < hp->n_expert) {
		matmul1(c, &w->gate_inp, c->moe_probs, c->xb, nb);
		return false;
	}
	memcpy(c->moe_in, c->xb, (size_t)nb * E * sizeof(float));
	rmsnorm_rows(c->moe_in + (size_t)nb * E, c->x, &w1->ffn_norm, nb, E, hp->norm_eps);
	matmul_parts(c, 2, parts, c->moe_in, 2 * nb);
	return true;
}

/* The guess from routers(): the first half of each row's top-k of the next
 * layer's router (as route() picks them, the likeliest first), the union
 * over rows, ascending, to the hook.  Only half: a guess that is wrong
 * costs a read the device is short of and evicts an expert that was
 * right, and the guesses of lower rank are wrong most often where it
 * counts, among the experts not in memory (docs/benchmarks.md, "Where the
 * fault waits come from, and half the guesses"). */
static void lookahead(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t N = hp->n_expert, K = hp->n_expert_used, n = 0;

	memset(c->moe_mark, 0, N);
	for (uint32_t b = 0; b < nb; b++) {
		route(c->moe_y + (size_t)b * N, N, K, c->moe_rows, c->moe_in);
		for (uint32_t j = 0; j < (K + 1) / 2; j++)
			c->moe_mark[c->moe_rows[j]] = 1;
	}
	for (uint32_t e = 0; e < N; e++)
		if (c->moe_mark[e])
			c->moe_route[n++] = e;
	c->ahead_fn(c->ahead_arg, l, c->moe_route, n);
}

/*
 * x += moe(rmsnorm(x)): the router picks k experts per token; the batch's
 * (token, slot) pairs are sorted by expert, and each matmul runs every
 * picked expert over the rows of its pairs in one pass of the pool, so each
 * picked expert's matrices are read once per batch, for all the tokens that
 * chose it.
 *
 *   xb        = rmsnorm(x) * ffn_norm                 [B][E]
 *   probs     = softmax(xb @ Wgate_inp)                [B][n_expert]  (routers(): with
 *                                                       the next layer's guess)
 *   sel, w    = top-k(probs), renormalized             [B][k]
 *   in        = xb of each pair, sorted by expert      [B*k][E]
 *   h         = silu(in @ Wgate_e) * (in @ Wup_e)      [B*k][F]   each row by its expert e
 *   y         = h @ Wdown_e                            [B*k][E]
 *   x[b]     += y[b,0] * w[b][0] + y[b,1] * w[b][1] + ...   (slot order, as the
 *                                                            reference sums them)
 */
static void moe_block(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	const struct layer_w *w = &c->m->layers[l];
	uint32_t E = hp->n_embd, F = hp->n_ff_exp, N = hp->n_expert, K = hp->n_expert_used;
	uint32_t *first = c->moe_first, np = nb * K;
	struct mm_part *parts = c->moe_parts;
	unsigned n = 0;
	bool ahead;

	rmsnorm_rows(c->xb, c->x, &w->ffn_norm, nb, E, hp->norm_eps);
	ahead = routers(c, l, nb); /* and the next layer's guess */
	memset(first, 0, ((size_t)N + 1) * sizeof(*first));
	for (uint32_t b = 0; b < nb; b++) {
		uint32_t *sel = c->moe_sel + (size_t)b * K;

		route(c->moe_probs + (size_t)b * N, N, K, sel, c->moe_w + (size_t)b * K);
		for (uint32_t j = 0; j < K; j++)
			first[sel[j] + 1]++;
	}
	/* a counting sort of the pairs by expert, tokens in order: expert e's
	 * are moe_rows[first[e] .. first[e + 1]) */
	/* the experts picked, before their weights are touched: a pager reads
	 * the missing ones at once instead of a fault at a time */
	if (c->route_fn) {
		uint32_t nr = 0;

		for (uint32_t e = 0; e < N; e++)
			if (first[e + 1])
				c->moe_route[nr++] = e;
		c->route_fn(c->route_arg, l, c->moe_route, nr);
	}
	/* and the next layer's likely picks, read while this one computes */
	if (ahead)
		lookahead(c, l + 1, nb);
	for (uint32_t e = 0; e < N; e++)
		first[e + 1] += first[e];
	for (uint32_t i = 0; i < np; i++) {
		uint32_t at = first[c->moe_sel[i]]++;

		c->moe_rows[at] = i;
		c->moe_pos[i] = at;
	}
	for (uint32_t e = N; e > 0; e--)
		first[e] = first[e - 1];
	first[0] = 0;
	for (uint32_t i = 0; i < np; i++)
		memcpy(c->moe_in + (size_t)i * E, c->xb + (size_t)(c->moe_rows[i] / K) * E,
		       E * sizeof(float));

	/* gate and up of every picked expert in one pass, if their weights take
	 * the same activations (else one pass each): gates at parts[0, n), ups
	 * at parts[N, N + n) */
	for (uint32_t e = 0; e < N; e++) {
		uint32_t r0 = first[e], ne = first[e + 1] - first[e];

		if (!ne)
			continue;
		c->moe_slice[n] = expert_w(&w->gate_exps, e);
		c->moe_slice[N + n] = expert_w(&w->up_exps, e);
		parts[n] = (struct mm_part){ &c->moe_slice[n], c->hb + (size_t)r0 * F, r0, ne, 0 };
		parts[N + n] = (struct mm_part){ &c->moe_slice[N + n], c->hb2 + (size_t)r0 * F, r0,
						 ne, 0 };
		n++;
	}
	if (eng_type_info(w->gate_exps.type)->vec_dot_type ==
		    eng_type_info(w->up_exps.type)->vec_dot_type &&
	    c->k->pack8[w->gate_exps.type] == c->k->pack8[w->up_exps.type]) {
		memmove(parts + n, parts + N, n * sizeof(*parts));
		matmul_parts(c, 2 * n, parts, c->moe_in, np);
	} else {
		matmul_parts(c, n, parts, c->moe_in, np);
		matmul_parts(c, n, parts + N, c->moe_in, np);
	}
	glu(c, ACT_SILU, c->hb, c->hb2, (size_t)np * F);

	n = 0;
	for (uint32_t e = 0; e < N; e++) {
		uint32_t r0 = first[e], ne = first[e + 1] - first[e];

		if (!ne)
			continue;
		c->moe_slice[n] = expert_w(&w->down_exps, e);
		parts[n] = (struct mm_part){ &c->moe_slice[n], c->moe_y + (size_t)r0 * E, r0, ne,
					     0 };
		n++;
	}
	matmul_parts(c, n, parts, c->hb, np);

	for (uint32_t b = 0; b < nb; b++) {
		float *x = c->x + (size_t)b * E;
		const uint32_t *pos = c->moe_pos + (size_t)b * K;
		const float *wb = c->moe_w + (size_t)b * K;

		for (uint32_t d = 0; d < E; d++) {
			float sum = c->moe_y[(size_t)pos[0] * E + d] * wb[0];

			for (uint32_t j = 1; j < K; j++)
				sum += c->moe_y[(size_t)pos[j] * E + d] * wb[j];
			x[d] += sum;
		}
	}
}

/* x += deltanet(rmsnorm(x)): a hybrid's recurrent token mixer */
static void deltanet_block(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;

	rmsnorm_rows(c->xb, c->x, &c->m->layers[l].attn_norm, nb, hp->n_embd, hp->norm_eps);
	deltanet_forward(c, l, nb);
	add(c->x, c->xb, (size_t)nb * hp->n_embd);
}

static void layer_forward(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	if (c->m->layers[l].recurrent)
		deltanet_block(c, l, nb);
	else
		attention_block(c, l, nb);
	if (c->m->arch->moe)
		moe_block(c, l, nb);
	else
		ffn_block(c, l, nb);
}

/* This thread's CPU time: what a layer costs it, whatever else ran on its
 * core meanwhile or how long it slept on a page fault. */
static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * One pass of nb rows, each a token of its context (row_ctx) at its position
 * (row_pos), set by the caller: every weight is read once for all of them.
 * Logits for the rows want marks (NULL: rows [first, nb)), in row order.
 * Each row's context then holds its token: n_past moves past its position.
 */
static void forward_rows(struct eng_ctx *c, const int32_t *tok, uint32_t nb, const bool *want,
			 uint32_t first, float *logits)
{
	const struct eng_model *m = c->m;
	const struct eng_hparams *hp = &m->hp;
	uint32_t E = hp->n_embd;
	uint32_t n_out = 0;

	for (uint32_t b = 0; b < nb; b++)
		c->k->to_float[m->tok_embd.type](m->tok_embd.data +
							 (size_t)tok[b] * m->tok_embd.row_bytes,
						 c->x + (size_t)b * E, E);
	if (m->arch->embd_scale) {
		float s = sqrtf((float)E);

		for (size_t i = 0; i < (size_t)nb * E; i++)
			c->x[i] *= s;
	}
	/* Each layer's CPU time on this thread (a clock read costs well under
	 * a microsecond; a layer, milliseconds), and the rest of the pass's:
	 * the pager's speed predictor learns from them what compute costs
	 * with nothing streaming. */
	uint64_t t0 = cpu_ns(), t = t0;

	for (uint32_t l = 0; l < hp->n_layer; l++) {
		uint64_t t1;

		layer_forward(c, l, nb);
		t1 = cpu_ns();
		c->layer_ns[l] = t1 - t;
		t = t1;
	}
	if (logits) {
		/* the wanted rows' final norm, packed: xb[k] for the k-th wanted */
		for (uint32_t b = 0; b < nb; b++)
			if (want ? want[b] : b >= first)
				rmsnorm(c->xb + (size_t)n_out++ * E, c->x + (size_t)b * E,
					(const float *)m->out_norm.data, E, hp->norm_eps);
		/* straight into the caller's rows: a buffer of n_batch rows
		 * here would be 131 MiB for a 128k vocabulary at 256 rows */
		matmul1(c, &m->output, logits, c->xb, n_out);
		if (hp->final_softcap > 0)
			softcap(c, logits, (size_t)n_out * hp->n_vocab, hp->final_softcap);
	}
	c->outside_ns = n_out ? cpu_ns() - t : 0;
	for (uint32_t b = 0; b < nb; b++) {
		struct eng_ctx *rc = c->row_ctx[b];

		rc->n_past = c->row_pos[b] + 1;
		if (rc->n_past > rc->undo_high)
			rc->undo_high = rc->n_past;
	}
}

int eng_decode(struct eng_ctx *c, const int32_t *tokens, size_t n, float *logits,
	       bool all_logits)
{
	const struct eng_hparams *hp = &c->m->hp;

	if (n == 0)
		return 0;
	if (n > c->n_ctx - c->n_past)
		return -ENOSPC;
	for (size_t i = 0; i < n; i++)
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
			return -EINVAL;
	for (size_t i = 0; i < n; i += c->n_batch) {
		uint32_t nb = (uint32_t)(n - i < c->n_batch ? n - i : c->n_batch);
		bool last = i + nb == n;
		float *out = NULL;
		uint32_t first = nb - 1;

		if (logits && all_logits) {
			out = logits + i * hp->n_vocab;
			first = 0;
		} else if (logits && last) {
			out = logits;
		}
		for (uint32_t b = 0; b < nb; b++) {
			c->row_ctx[b] = c;
			c->row_pos[b] = c->n_past + b;
		}
		forward_rows(c, tokens + i, nb, NULL, first, out);
	}
	return 0;
}

/*
 * Rows of several sequences in one pass.  Positions are handed out in row
 * order from each context's n_past.  Everything is checked before anything
 * is fed: the positions are counted by moving each n_past forward and then
 * put back (last row first, so each context ends at its first row's
 * position), and a refused call feeds nothing.  A ring (sliding-window
 * layer) holds window + n_batch - 1 rows of its context, so no context may
 * have more than its n_batch rows in the pass; attention's scratch is the
 * first context's, so none may be longer than it.
 */
int eng_decode_multi(struct eng_ctx *const *ctxs, const int32_t *tokens, const bool *want,
		     size_t n, float *logits)
{
	struct eng_ctx *c;
	int rc = 0;
	size_t i;

	if (n == 0)
		return 0;
	c = ctxs[0];
	if (n > c->n_batch)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		struct eng_ctx *r = ctxs[i];

		if (r->m != c->m || r->type_k != c->type_k || r->type_v != c->type_v ||
		    r->n_ctx > c->n_ctx || tokens[i] < 0 ||
		    (uint32_t)tokens[i] >= c->m->hp.n_vocab) {
			rc = -EINVAL;
			break;
		}
		if (r->n_past >= r->n_ctx) {
			rc = -ENOSPC;
			break;
		}
		c->row_pos[i] = r->n_past++;
	}
	for (size_t k = 0; !rc && k < n; k++)
		if (ctxs[k]->n_past - c->row_pos[k] > ctxs[k]->n_batch)
			rc = -EINVAL;
	while (i-- > 0)
		ctxs[i]->n_past = c->row_pos[i];
	if (rc)
		return rc;
	for (i = 0; i < n; i++) {
		c->row_ctx[i] = ctxs[i];
		c->row_pos[i] = ctxs[i]->n_past++;
	}
	forward_rows(c, tokens, (uint32_t)n, want, 0, logits);
	return 0;
}
