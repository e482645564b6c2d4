/*
 * model.c - load a llama/qwen2 GGUF model from a mapped image and run its
 * forward pass.
 *
 * Loading validates the metadata and every tensor's shape and type against
 * the hyper-parameters, and records pointers into the image; nothing is
 * copied, so the pages the engine holds are the pages it touches.
 *
 * The forward pass takes a batch of tokens through one layer at a time (all
 * of a prompt batch goes through layer L before layer L+1 is read, so a
 * streamed layer is read once per batch).  Per layer:
 *
 *   x      [B][n_embd]           residual stream
 *   xb     = rmsnorm(x) * attn_norm
 *   q,k,v  = xb @ Wq, Wk, Wv (+ bias for qwen2); rope(q, k); k, v -> KV cache
 *   xb2    = attention(q, KV cache[0 .. pos])   causal, GQA
 *   x     += xb2 @ Wo
 *   xb     = rmsnorm(x) * ffn_norm
 *   x     += (silu(xb @ Wgate) * (xb @ Wup)) @ Wdown
 *
 * then logits = rmsnorm(x) * output_norm @ Woutput.
 *
 * Threading: matmuls split weight rows over the pool, attention splits
 * (token, head) pairs; everything else is cheap and runs on the caller.
 * Activations are quantized once per matmul input into the weight type's
 * vec_dot_type (see quant.h).  All buffers are allocated in eng_ctx_create:
 * no allocation happens per token.
 */
#include "engine.h"
#include "gguf.h"
#include "quant.h"
#include "threads.h"
#include "tokenizer.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_CTX_DEFAULT 4096
#define MATMUL_TILE 16 /* weight rows kept hot in cache across a batch: one vec_dot16 */

/* A weight tensor as the forward pass sees it: rows of ne0 elements. */
struct wt {
	const uint8_t *data;
	uint32_t type;
	uint64_t ne0, ne1;
	size_t row_bytes;
};

struct layer_w {
	struct wt attn_norm, wq, wk, wv, wo, bq, bk, bv;
	struct wt ffn_norm, gate, up, down;
};

struct eng_model {
	struct gguf *g;
	struct eng_hparams hp;
	struct eng_tokenizer *tok;
	struct wt tok_embd, out_norm, output, rope_freqs;
	struct layer_w *layers;
	bool vocab_only;
};

struct eng_ctx {
	const struct eng_model *m;
	const struct eng_kernels *k;
	struct eng_pool *pool;
	uint32_t n_ctx, n_batch, n_past;
	uint32_t q_dim, kv_dim;
	eng_fp16_t *kcache, *vcache; /* [n_layer][n_ctx][kv_dim] */
	float *x, *xb, *xb2;         /* [n_batch][n_embd] (xb2 also [n_batch][q_dim]) */
	float *q, *kb, *vb;          /* [n_batch][q_dim], [n_batch][kv_dim] x2 */
	float *hb, *hb2;             /* [n_batch][n_ff] */
	float *att;                  /* [n_threads][n_ctx] scores */
	float *vrow;                 /* [n_threads][head_dim] f16 -> f32 scratch */
	double *vacc;                /* [n_threads][head_dim] weighted-sum accumulators */
	eng_fp16_t *q16;             /* [n_threads][head_dim] query rounded to f16 */
	float *logits;               /* [n_batch][n_vocab] */
	float *theta_base;           /* [n_rot / 2] per-pair frequency */
	uint8_t *qact;               /* quantized activations, [n_batch] rows
				      * (each with its pack8 copy beside it) */
	size_t qact_stride;
	uint64_t *layer_ns;          /* [n_layer] each layer's CPU time in the last pass */
	uint64_t outside_ns;         /* the rest of its CPU time (output, logits) */
	uint64_t bytes;
};

/* ---- loading ---------------------------------------------------------- */

static int __attribute__((format(printf, 3, 4))) load_err(char *err, size_t errlen,
							   const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int get_hp_u32(const struct gguf *g, const char *arch, const char *suffix, uint32_t *out,
		      bool required, uint32_t def, char *err, size_t errlen)
{
	char key[128];
	int rc;

	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	rc = gguf_get_u32(g, key, out);
	if (rc == -ENOENT && !required) {
		*out = def;
		return 0;
	}
	if (rc == -ENOENT)
		return load_err(err, errlen, "missing metadata '%s'", key);
	if (rc)
		return load_err(err, errlen, "metadata '%s' is not a valid unsigned integer", key);
	return 0;
}

static int get_hp_f32(const struct gguf *g, const char *arch, const char *suffix, float *out,
		      float def, char *err, size_t errlen)
{
	char key[128];
	int rc;

	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	rc = gguf_get_f32(g, key, out);
	if (rc == -ENOENT) {
		*out = def;
		return 0;
	}
	if (rc || !isfinite(*out))
		return load_err(err, errlen, "metadata '%s' is not a finite float", key);
	return 0;
}

/*
 * Find tensor `name`, check its type is computable and its shape is
 * [ne0, ne1] (ne1 == 0 means a 1-D tensor of ne0).  Optional tensors that are
 * absent leave w->data NULL.
 */
static int bind(const struct eng_model *m, struct wt *w, const char *name, uint64_t ne0,
		uint64_t ne1, bool optional, char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_find_tensor(m->g, name);
	const struct eng_type_info *ti;
	bool is_vec = ne1 == 0;

	memset(w, 0, sizeof(*w));
	if (!t) {
		if (optional)
			return 0;
		return load_err(err, errlen, "missing tensor '%s'", name);
	}
	ti = eng_type_info(t->type);
	if (!ti->supported || t->type == ENG_TYPE_Q8_K) {
		snprintf(err, errlen, "tensor '%s' has type %s, which strata does not support", name,
			 ti->name);
		return -ENOTSUP;
	}
	if (t->ne[0] != ne0 || t->ne[1] != (is_vec ? 1 : ne1) || t->ne[2] != 1 || t->ne[3] != 1)
		return load_err(err, errlen,
				"tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%llu, %llu]",
				name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
				(unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
				(unsigned long long)ne0, (unsigned long long)(is_vec ? 1 : ne1));
	/* Norms and biases are applied as float vectors. */
	if (is_vec && t->type != ENG_TYPE_F32) {
		snprintf(err, errlen, "tensor '%s' is %s; norms and biases must be F32", name,
			 ti->name);
		return -ENOTSUP;
	}
	w->data = gguf_tensor_data_ptr(m->g, t);
	w->type = t->type;
	w->ne0 = ne0;
	w->ne1 = is_vec ? 1 : ne1;
	w->row_bytes = eng_row_bytes(t->type, ne0);
	return 0;
}

static int load_hparams(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	const struct gguf *g = m->g;
	struct gguf_str s;
	const char *a;
	uint32_t key_len = 0;
	float scale_factor = 0;
	int rc;

	if (gguf_get_str(g, "general.architecture", &s))
		return load_err(err, errlen, "missing metadata 'general.architecture'");
	if (gguf_str_eq(s, "llama")) {
		hp->arch = ENG_ARCH_LLAMA;
		hp->arch_name = "llama";
		hp->rope_kind = ENG_ROPE_NORM;
	} else if (gguf_str_eq(s, "qwen2")) {
		hp->arch = ENG_ARCH_QWEN2;
		hp->arch_name = "qwen2";
		hp->rope_kind = ENG_ROPE_NEOX;
	} else {
		snprintf(err, errlen, "architecture '%.*s' is not supported (llama, qwen2 are)",
			 (int)(s.len > 64 ? 64 : s.len), s.ptr);
		return -ENOTSUP;
	}
	a = hp->arch_name;
	if (!gguf_get_str(g, "general.name", &s))
		snprintf(hp->name, sizeof(hp->name), "%.*s", (int)(s.len > 120 ? 120 : s.len), s.ptr);

	if ((rc = get_hp_u32(g, a, "embedding_length", &hp->n_embd, true, 0, err, errlen)) ||
	    (rc = get_hp_u32(g, a, "block_count", &hp->n_layer, true, 0, err, errlen)) ||
	    (rc = get_hp_u32(g, a, "feed_forward_length", &hp->n_ff, true, 0, err, errlen)) ||
	    (rc = get_hp_u32(g, a, "attention.head_count", &hp->n_head, true, 0, err, errlen)) ||
	    (rc = get_hp_u32(g, a, "context_length", &hp->n_ctx_train, false, MAX_CTX_DEFAULT, err,
			     errlen)) ||
	    (rc = get_hp_u32(g, a, "attention.key_length", &key_len, false, 0, err, errlen)))
		return rc;
	if (hp->n_embd == 0 || hp->n_embd > 65536 || hp->n_layer == 0 || hp->n_layer > 1024 ||
	    hp->n_ff == 0 || hp->n_ff > 1u << 20 || hp->n_head == 0 || hp->n_head > hp->n_embd)
		return load_err(err, errlen,
				"implausible dimensions: n_embd %u, n_layer %u, n_ff %u, n_head %u",
				hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head);
	if ((rc = get_hp_u32(g, a, "attention.head_count_kv", &hp->n_head_kv, false, hp->n_head,
			     err, errlen)))
		return rc;
	if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv)
		return load_err(err, errlen, "head_count_kv %u does not divide head_count %u",
				hp->n_head_kv, hp->n_head);
	hp->head_dim = key_len ? key_len : hp->n_embd / hp->n_head;
	if (hp->head_dim == 0 || hp->head_dim % 2 || hp->head_dim > 1024 ||
	    (!key_len && hp->n_embd % hp->n_head))
		return load_err(err, errlen, "invalid head size %u", hp->head_dim);
	if ((rc = get_hp_u32(g, a, "rope.dimension_count", &hp->n_rot, false, hp->head_dim, err,
			     errlen)))
		return rc;
	if (hp->n_rot == 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
		return load_err(err, errlen, "rope.dimension_count %u is invalid for head size %u",
				hp->n_rot, hp->head_dim);
	if ((rc = get_hp_f32(g, a, "rope.freq_base", &hp->rope_base, 10000.0f, err, errlen)) ||
	    (rc = get_hp_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->norm_eps, 1e-5f, err,
			     errlen)))
		return rc;
	if (hp->rope_base <= 0 || hp->norm_eps < 0)
		return load_err(err, errlen, "invalid rope base %g or norm epsilon %g",
				(double)hp->rope_base, (double)hp->norm_eps);

	/* RoPE scaling: none, or linear (positions divided by the factor).  The
	 * llama3 scheme comes as a rope_freqs tensor, bound in load_tensors. */
	hp->rope_freq_scale = 1.0f;
	{
		char key[128];

		snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
		if (!gguf_get_str(g, key, &s) && !gguf_str_eq(s, "none")) {
			if (!gguf_str_eq(s, "linear")) {
				snprintf(err, errlen, "rope scaling '%.*s' is not supported",
					 (int)(s.len > 32 ? 32 : s.len), s.ptr);
				return -ENOTSUP;
			}
			if ((rc = get_hp_f32(g, a, "rope.scaling.factor", &scale_factor, 0, err,
					     errlen)))
				return rc;
		} else if (gguf_str_eq(s, "none") || gguf_find_kv(g, key) == NULL) {
			/* older files carry only rope.scale_linear */
			if ((rc = get_hp_f32(g, a, "rope.scale_linear", &scale_factor, 0, err,
					     errlen)))
				return rc;
		}
		if (scale_factor < 0 || (scale_factor > 0 && scale_factor < 1e-3f))
			return load_err(err, errlen, "invalid rope scaling factor %g",
					(double)scale_factor);
		if (scale_factor > 0)
			hp->rope_freq_scale = 1.0f / scale_factor;
	}
	return 0;
}

static int load_tensors(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
	uint64_t kv_dim = (uint64_t)hp->n_head_kv * hp->head_dim;
	const struct gguf_tensor *te = gguf_find_tensor(m->g, "token_embd.weight");
	int rc;

	if (!te)
		return load_err(err, errlen, "missing tensor 'token_embd.weight'");
	if (te->ne[1] == 0 || te->ne[1] > INT32_MAX)
		return load_err(err, errlen, "token_embd.weight has an invalid vocabulary size");
	hp->n_vocab = (uint32_t)te->ne[1];
	if ((rc = bind(m, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, false, err,
		       errlen)) ||
	    (rc = bind(m, &m->out_norm, "output_norm.weight", hp->n_embd, 0, false, err, errlen)) ||
	    (rc = bind(m, &m->output, "output.weight", hp->n_embd, hp->n_vocab, true, err,
		       errlen)) ||
	    (rc = bind(m, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, 0, true, err,
		       errlen)))
		return rc;
	/* An embedding is read one row at a time, which Q4_0_R16 cannot do. */
	if (eng_type_info(m->tok_embd.type)->row_group > 1) {
		snprintf(err, errlen, "tensor 'token_embd.weight' is %s; token embeddings must "
			 "keep a row layout (strata-repack leaves them as they are)",
			 eng_type_info(m->tok_embd.type)->name);
		return -ENOTSUP;
	}
	hp->tied_output = m->output.data == NULL;
	if (hp->tied_output)
		m->output = m->tok_embd;

	m->layers = calloc(hp->n_layer, sizeof(*m->layers));
	if (!m->layers)
		return -ENOMEM;
	for (uint32_t i = 0; i < hp->n_layer; i++) {
		struct layer_w *l = &m->layers[i];
		bool bias = hp->arch == ENG_ARCH_QWEN2;
		char n[12][64];

#define TN(j, s) snprintf(n[j], sizeof(n[j]), "blk.%u." s, i)
		TN(0, "attn_norm.weight");
		TN(1, "attn_q.weight");
		TN(2, "attn_k.weight");
		TN(3, "attn_v.weight");
		TN(4, "attn_output.weight");
		TN(5, "attn_q.bias");
		TN(6, "attn_k.bias");
		TN(7, "attn_v.bias");
		TN(8, "ffn_norm.weight");
		TN(9, "ffn_gate.weight");
		TN(10, "ffn_up.weight");
		TN(11, "ffn_down.weight");
#undef TN
		if ((rc = bind(m, &l->attn_norm, n[0], hp->n_embd, 0, false, err, errlen)) ||
		    (rc = bind(m, &l->wq, n[1], hp->n_embd, q_dim, false, err, errlen)) ||
		    (rc = bind(m, &l->wk, n[2], hp->n_embd, kv_dim, false, err, errlen)) ||
		    (rc = bind(m, &l->wv, n[3], hp->n_embd, kv_dim, false, err, errlen)) ||
		    (rc = bind(m, &l->wo, n[4], q_dim, hp->n_embd, false, err, errlen)) ||
		    (rc = bind(m, &l->bq, n[5], q_dim, 0, !bias, err, errlen)) ||
		    (rc = bind(m, &l->bk, n[6], kv_dim, 0, !bias, err, errlen)) ||
		    (rc = bind(m, &l->bv, n[7], kv_dim, 0, !bias, err, errlen)) ||
		    (rc = bind(m, &l->ffn_norm, n[8], hp->n_embd, 0, false, err, errlen)) ||
		    (rc = bind(m, &l->gate, n[9], hp->n_embd, hp->n_ff, false, err, errlen)) ||
		    (rc = bind(m, &l->up, n[10], hp->n_embd, hp->n_ff, false, err, errlen)) ||
		    (rc = bind(m, &l->down, n[11], hp->n_ff, hp->n_embd, false, err, errlen)))
			return rc;
	}
	for (uint64_t i = 0; i < gguf_n_tensors(m->g); i++)
		hp->weight_bytes += gguf_tensor_at(m->g, i)->size;
	return 0;
}

static int model_load(const void *base, size_t size, bool vocab_only, struct eng_model **out,
		      char *err, size_t errlen)
{
	struct eng_model *m;
	int rc;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	m->hp.file_bytes = size;
	rc = gguf_parse(base, size, &m->g, err, errlen);
	if (rc)
		goto fail;
	m->vocab_only = vocab_only;
	if (!vocab_only) {
		rc = load_hparams(m, err, errlen);
		if (rc)
			goto fail;
		rc = load_tensors(m, err, errlen);
		if (rc)
			goto fail;
	}
	rc = eng_tokenizer_create(m->g, &m->tok, err, errlen);
	if (rc)
		goto fail;
	if (vocab_only) {
		m->hp.n_vocab = eng_tokenizer_n_vocab(m->tok);
	} else if (eng_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
		rc = load_err(err, errlen, "tokenizer has %u tokens but the model only %u",
			      eng_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
		goto fail;
	}
	*out = m;
	return 0;
fail:
	if (rc == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	eng_model_destroy(m);
	return rc;
}

int eng_model_load(const void *base, size_t size, struct eng_model **out, char *err,
		   size_t errlen)
{
	return model_load(base, size, false, out, err, errlen);
}

int eng_model_load_vocab(const void *base, size_t size, struct eng_model **out, char *err,
			 size_t errlen)
{
	return model_load(base, size, true, out, err, errlen);
}

void eng_model_destroy(struct eng_model *m)
{
	if (!m)
		return;
	eng_tokenizer_destroy(m->tok);
	free(m->layers);
	gguf_destroy(m->g);
	free(m);
}

const struct eng_hparams *eng_model_hparams(const struct eng_model *m)
{
	return &m->hp;
}

const struct eng_tokenizer *eng_model_tokenizer(const struct eng_model *m)
{
	return m->tok;
}

const struct gguf *eng_model_gguf(const struct eng_model *m)
{
	return m->g;
}

/* ---- context ---------------------------------------------------------- */

static void *xcalloc(struct eng_ctx *c, size_t n, size_t sz)
{
	void *p;

	if (n && sz > SIZE_MAX / n)
		return NULL;
	p = calloc(n ? n : 1, sz);
	if (p)
		c->bytes += n * sz;
	return p;
}

int eng_ctx_create(const struct eng_model *m, const struct eng_ctx_config *cfg,
		   struct eng_ctx **out, char *err, size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	struct eng_ctx *c;
	unsigned nth;
	size_t kv_elems, max_in;
	int rc;

	*out = NULL;
	if (m->vocab_only) {
		snprintf(err, errlen, "the model was loaded for its vocabulary only");
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		goto oom;
	c->m = m;
	c->k = eng_kernels_get();
	c->n_ctx = cfg->n_ctx ? cfg->n_ctx
			      : (hp->n_ctx_train < MAX_CTX_DEFAULT ? hp->n_ctx_train
								   : MAX_CTX_DEFAULT);
	if (c->n_ctx == 0)
		c->n_ctx = MAX_CTX_DEFAULT;
	if (c->n_ctx > 1u << 20) {
		snprintf(err, errlen, "context of %u tokens is too large", c->n_ctx);
		eng_ctx_destroy(c);
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
	nth = cfg->n_threads ? cfg->n_threads : eng_cpu_count();
	c->q_dim = hp->n_head * hp->head_dim;
	c->kv_dim = hp->n_head_kv * hp->head_dim;

	rc = eng_pool_create(nth, &c->pool);
	if (rc) {
		snprintf(err, errlen, "cannot start %u threads", nth);
		eng_ctx_destroy(c);
		return rc;
	}
	kv_elems = (size_t)hp->n_layer * c->n_ctx * c->kv_dim;
	c->kcache = xcalloc(c, kv_elems, sizeof(eng_fp16_t));
	c->vcache = xcalloc(c, kv_elems, sizeof(eng_fp16_t));
	max_in = hp->n_embd > c->q_dim ? hp->n_embd : c->q_dim;
	c->x = xcalloc(c, (size_t)c->n_batch * hp->n_embd, sizeof(float));
	c->xb = xcalloc(c, (size_t)c->n_batch * max_in, sizeof(float));
	c->xb2 = xcalloc(c, (size_t)c->n_batch * max_in, sizeof(float));
	c->q = xcalloc(c, (size_t)c->n_batch * c->q_dim, sizeof(float));
	c->kb = xcalloc(c, (size_t)c->n_batch * c->kv_dim, sizeof(float));
	c->vb = xcalloc(c, (size_t)c->n_batch * c->kv_dim, sizeof(float));
	c->hb = xcalloc(c, (size_t)c->n_batch * hp->n_ff, sizeof(float));
	c->hb2 = xcalloc(c, (size_t)c->n_batch * hp->n_ff, sizeof(float));
	c->att = xcalloc(c, (size_t)nth * c->n_ctx, sizeof(float));
	c->vrow = xcalloc(c, (size_t)nth * hp->head_dim, sizeof(float));
	c->vacc = xcalloc(c, (size_t)nth * hp->head_dim, sizeof(double));
	c->q16 = xcalloc(c, (size_t)nth * hp->head_dim, sizeof(eng_fp16_t));
	c->logits = xcalloc(c, (size_t)c->n_batch * hp->n_vocab, sizeof(float));
	c->theta_base = xcalloc(c, hp->n_rot / 2, sizeof(float));
	/* Widest quantized activation row: any matmul input, in any vec_dot
	 * format (F32 rows are the largest: 4 bytes per element; a Q8_0 row
	 * and its pack8 copy after it take 2.3 and up to 63 of alignment). */
	max_in = max_in > hp->n_ff ? max_in : hp->n_ff;
	c->qact_stride = (max_in * sizeof(float) + 63) & ~(size_t)63;
	c->qact = xcalloc(c, (size_t)c->n_batch, c->qact_stride);
	c->layer_ns = xcalloc(c, hp->n_layer, sizeof(uint64_t));
	if (!c->kcache || !c->vcache || !c->x || !c->xb || !c->xb2 || !c->q || !c->kb || !c->vb ||
	    !c->hb || !c->hb2 || !c->att || !c->vrow || !c->vacc || !c->q16 || !c->logits ||
	    !c->theta_base || !c->qact || !c->layer_ns)
		goto oom;

	/* theta for pair i at position p is p * freq_scale * base^(-2i/n_rot),
	 * computed as the reference does: repeated multiplication in float. */
	{
		float theta_scale = powf(hp->rope_base, -2.0f / (float)hp->n_rot);
		float t = 1.0f;
		const float *ff = (const float *)m->rope_freqs.data;

		for (uint32_t i = 0; i < hp->n_rot / 2; i++) {
			float f;

			if (ff)
				memcpy(&f, &ff[i], sizeof(f));
			c->theta_base[i] = ff ? t / f : t;
			t *= theta_scale;
		}
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
	free(c->kcache);
	free(c->vcache);
	free(c->x);
	free(c->xb);
	free(c->xb2);
	free(c->q);
	free(c->kb);
	free(c->vb);
	free(c->hb);
	free(c->hb2);
	free(c->att);
	free(c->vrow);
	free(c->vacc);
	free(c->q16);
	free(c->logits);
	free(c->theta_base);
	free(c->qact);
	free(c->layer_ns);
	free(c);
}

uint64_t eng_ctx_bytes(const struct eng_ctx *c)
{
	return c->bytes;
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
}

/* ---- forward pass ----------------------------------------------------- */

/*
 * Up to three matmuls sharing one input: out_j[b][r] = W_j[r] . in[b].  The
 * threads take chunks of rows from a shared counter, in order over the n
 * weights, rather than fixed shares, so one slow thread (the machine is
 * shared, the memory bandwidth too) does not leave the other waiting.  A
 * chunk is about 1024 token-rows: big for a decode step (cold starts cost:
 * each chunk begins without the kernels' prefetch running ahead), down to 64
 * rows for a prompt, and at most about 2 MiB of weights: an 8B-shaped
 * ffn_down (14336 columns, 8-12 KB a row) was otherwise four chunks for two
 * threads, and a thread slowed for a moment left the other idle for up to a
 * quarter of the matrix.  The counter lives in the job, on the caller's
 * stack: nothing is allocated per matmul.
 */
#define MATMUL_CHUNK 64 /* rows: the smallest chunk, a multiple of MATMUL_TILE and 8 */
#define MATMUL_CHUNK_WORK 1024 /* token-rows per chunk */
#define MATMUL_CHUNK_BYTES (2u << 20) /* weight bytes per chunk, at most */

struct mm_job {
	unsigned n;
	const struct wt *w[3];
	float *out[3];
	uint64_t chunk;     /* rows per chunk */
	uint64_t chunks[3]; /* chunks of weight m: chunks[m] - chunks[m - 1] */
	_Atomic uint64_t next; /* next chunk to take, over all n weights */
	const uint8_t *act;  /* nb rows of act_stride bytes, in vec_dot_type */
	const uint8_t *act8; /* the same for vec_dot8/16: pack8'ed if the set packs */
	size_t act_stride;
	uint32_t nb;
	const struct eng_kernels *k;
};

/* The 8 or 16 rows of weight w at r (fn is vec_dot8 or vec_dot16) by all
 * tokens, up to max_nt (ENG_DOT8_NT or ENG_DOT16_NT) at a time. */
static void mm_group(const struct mm_job *j, eng_vec_dot8_fn fn, unsigned max_nt,
		     const struct wt *w, float *out, uint64_t r)
{
	for (uint32_t b = 0; b < j->nb; b += max_nt) {
		unsigned nt = j->nb - b < max_nt ? j->nb - b : max_nt;

		fn(w->ne0, nt, &out[b * w->ne1 + r], w->ne1, w->data + r * w->row_bytes,
		   w->row_bytes, j->act8 + b * j->act_stride, j->act_stride);
	}
}

/* Rows [r0, r1) of weight w, in tiles of MATMUL_TILE rows. */
static void mm_rows(const struct mm_job *j, const struct wt *w, float *out, uint64_t r0,
		    uint64_t r1)
{
	eng_vec_dot_fn dot = j->k->vec_dot[w->type];
	eng_vec_dot8_fn dot8 = j->k->vec_dot8[w->type];
	eng_vec_dot8_fn dot16 = j->k->vec_dot16[w->type];

	for (uint64_t t0 = r0; t0 < r1; t0 += MATMUL_TILE) {
		uint64_t t1 = t0 + MATMUL_TILE < r1 ? t0 + MATMUL_TILE : r1;
		uint64_t r = t0;

		/* sixteen or eight rows at a time (a Q4_0_R16 weight has
		 * vec_dot16 only: its row count is a multiple of 16, checked by
		 * gguf.c, and chunks are multiples of 16, so every tile is
		 * whole), */
		if (dot16 && t1 - t0 == 16) {
			mm_group(j, dot16, ENG_DOT16_NT, w, out, r);
			r = t1;
		}
		for (; dot8 && r + 8 <= t1; r += 8)
			mm_group(j, dot8, ENG_DOT8_NT, w, out, r);
		/* then the rows left one by one */
		for (uint32_t b = 0; b < j->nb; b++)
			for (uint64_t i = r; i < t1; i++)
				dot(w->ne0, &out[b * w->ne1 + i], w->data + i * w->row_bytes,
				    j->act + b * j->act_stride);
	}
}

static void mm_worker(void *arg, unsigned ith, unsigned nth)
{
	struct mm_job *j = arg;
	unsigned m = 0;

	for (;;) {
		uint64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);

		while (m < j->n && c >= j->chunks[m])
			m++;
		if (m == j->n)
			return;

		const struct wt *w = j->w[m];
		uint64_t r0 = (c - (m ? j->chunks[m - 1] : 0)) * j->chunk;
		uint64_t r1 = r0 + j->chunk < w->ne1 ? r0 + j->chunk : w->ne1;

		mm_rows(j, w, j->out[m], r0, r1);
	}
}

/*
 * out_j = in @ W_j^T for the n weights given (which share ne0 and type
 * class); in is [nb][ne0] floats.  Converting the input once serves all.
 */
static void matmul(struct eng_ctx *c, unsigned n, const struct wt *const *w, float *const *out,
		   const float *in, uint32_t nb)
{
	struct mm_job j = { .n = n, .nb = nb, .k = c->k };
	uint64_t ne0 = w[0]->ne0;
	uint32_t vt = eng_type_info(w[0]->type)->vec_dot_type;
	size_t row_bytes = 0;

	for (unsigned i = 0; i < n; i++)
		row_bytes = w[i]->row_bytes > row_bytes ? w[i]->row_bytes : row_bytes;
	j.chunk = MATMUL_CHUNK_WORK / (nb ? nb : 1);
	if (j.chunk > MATMUL_CHUNK_BYTES / row_bytes)
		j.chunk = MATMUL_CHUNK_BYTES / row_bytes;
	j.chunk = j.chunk / MATMUL_CHUNK * MATMUL_CHUNK;
	if (j.chunk < MATMUL_CHUNK)
		j.chunk = MATMUL_CHUNK;
	for (unsigned i = 0; i < n; i++) {
		j.w[i] = w[i];
		j.out[i] = out[i];
		j.chunks[i] = (i ? j.chunks[i - 1] : 0) + (w[i]->ne1 + j.chunk - 1) / j.chunk;
	}
	atomic_init(&j.next, 0);
	if (vt == ENG_TYPE_F32) {
		j.act = j.act8 = (const uint8_t *)in;
		j.act_stride = ne0 * sizeof(float);
	} else {
		eng_from_float_fn q = c->k->from_float[vt];
		eng_pack8_fn pack = c->k->pack8[w[0]->type];
		/* the packed copy after the row, on its own cache lines */
		size_t off = pack ? (eng_row_bytes(vt, ne0) + 63) & ~(size_t)63 : 0;

		assert(off + ENG_PACK8_BYTES(ne0) <= c->qact_stride);
		for (uint32_t b = 0; b < nb; b++) {
			uint8_t *row = c->qact + b * c->qact_stride;

			q(in + b * ne0, row, ne0);
			if (pack)
				pack(row, row + off, ne0);
		}
		j.act = c->qact;
		j.act8 = c->qact + off;
		j.act_stride = c->qact_stride;
	}
	eng_pool_run(c->pool, mm_worker, &j);
}

static void matmul1(struct eng_ctx *c, const struct wt *w, float *out, const float *in,
		    uint32_t nb)
{
	matmul(c, 1, &w, &out, in, nb);
}

/* Weights sharing an input may still differ in type (Q4_K_M mixes Q4_K and
 * Q6_K): group only those whose activations are converted (and packed) the
 * same way. */
static void matmul_shared(struct eng_ctx *c, unsigned n, const struct wt *const *w,
			  float *const *out, const float *in, uint32_t nb)
{
	bool same = true;

	for (unsigned i = 1; i < n; i++)
		same &= eng_type_info(w[i]->type)->vec_dot_type ==
				eng_type_info(w[0]->type)->vec_dot_type &&
			c->k->pack8[w[i]->type] == c->k->pack8[w[0]->type];
	if (same) {
		matmul(c, n, w, out, in, nb);
		return;
	}
	for (unsigned i = 0; i < n; i++)
		matmul1(c, w[i], out[i], in, nb);
}

static void rmsnorm(float *out, const float *x, const struct wt *w, uint32_t n, float eps)
{
	const float *g = (const float *)w->data;
	double ss = 0;

	for (uint32_t i = 0; i < n; i++)
		ss += (double)(x[i] * x[i]); /* float square, double sum: as ggml */
	float scale = 1.0f / sqrtf((float)(ss / n) + eps);
	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] * scale * g[i];
}

static void add_bias(float *x, const struct wt *b, uint32_t n)
{
	const float *v = (const float *)b->data;

	if (!v)
		return;
	for (uint32_t i = 0; i < n; i++)
		x[i] += v[i];
}

static void rope(const struct eng_ctx *c, float *v, uint32_t n_heads, uint32_t pos)
{
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t half = hp->n_rot / 2;

	for (uint32_t i = 0; i < half; i++) {
		float theta = (float)pos * hp->rope_freq_scale * c->theta_base[i];
		float cs = cosf(theta), sn = sinf(theta);

		for (uint32_t h = 0; h < n_heads; h++) {
			float *x = v + (size_t)h * hp->head_dim;
			uint32_t i0 = hp->rope_kind == ENG_ROPE_NORM ? 2 * i : i;
			uint32_t i1 = hp->rope_kind == ENG_ROPE_NORM ? 2 * i + 1 : i + half;
			float x0 = x[i0], x1 = x[i1];

			x[i0] = x0 * cs - x1 * sn;
			x[i1] = x0 * sn + x1 * cs;
		}
	}
}

struct attn_job {
	struct eng_ctx *c;
	uint32_t layer, nb, pos0;
};

/*
 * One (token, head) pair per work item: scores over the cached keys, softmax,
 * weighted sum of the cached values.  The cache is f16, and like the
 * reference engine the query is rounded to f16 for the q.k products and the
 * attention weights are rounded to f16 for the weighted sum: on models whose
 * scores are large this rounding is visible in the logits, so matching it is
 * what keeps strata within tolerance of the reference.
 */
static void attn_worker(void *arg, unsigned ith, unsigned nth)
{
	const struct attn_job *j = arg;
	struct eng_ctx *c = j->c;
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
	size_t layer_off = (size_t)j->layer * c->n_ctx * c->kv_dim;
	float *att = c->att + (size_t)ith * c->n_ctx;
	float *vrow = c->vrow + (size_t)ith * hd;
	double *vacc = c->vacc + (size_t)ith * hd;
	eng_fp16_t *q16 = c->q16 + (size_t)ith * hd;
	float scale = 1.0f / sqrtf((float)hd);
	uint32_t items = j->nb * hp->n_head;
	eng_vec_dot_fn dot16 = c->k->vec_dot[ENG_TYPE_F16];
	eng_from_float_fn to16 = c->k->from_float[ENG_TYPE_F16];
	eng_to_float_fn f16 = c->k->to_float[ENG_TYPE_F16];

	for (uint32_t it = items * ith / nth; it < items * (ith + 1) / nth; it++) {
		uint32_t b = it / hp->n_head, h = it % hp->n_head, kvh = h / group;
		uint32_t n_keys = j->pos0 + b + 1;
		const float *q = c->q + (size_t)b * c->q_dim + (size_t)h * hd;
		float *out = c->xb2 + (size_t)b * c->q_dim + (size_t)h * hd;
		float mx = -INFINITY;
		double sum = 0;

		to16(q, q16, hd);
		for (uint32_t t = 0; t < n_keys; t++) {
			const eng_fp16_t *kr = c->kcache + layer_off + (size_t)t * c->kv_dim +
					       (size_t)kvh * hd;
			float s;

			dot16(hd, &s, kr, q16);
			att[t] = s * scale;
			if (att[t] > mx)
				mx = att[t];
		}
		for (uint32_t t = 0; t < n_keys; t++) {
			att[t] = expf(att[t] - mx);
			sum += att[t];
		}
		float inv = (float)(1.0 / sum);
		/* float products summed in double, as ggml's f16 dot does for
		 * these rows: the weighted sum is as sensitive as the scores */
		memset(vacc, 0, hd * sizeof(double));
		for (uint32_t t = 0; t < n_keys; t++) {
			const eng_fp16_t *vr = c->vcache + layer_off + (size_t)t * c->kv_dim +
					       (size_t)kvh * hd;
			float a = eng_fp16_to_fp32(eng_fp32_to_fp16(att[t] * inv));

			f16(vr, vrow, hd);
			for (uint32_t d = 0; d < hd; d++)
				vacc[d] += (double)(a * vrow[d]);
		}
		for (uint32_t d = 0; d < hd; d++)
			out[d] = (float)vacc[d];
	}
}

static void layer_forward(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	const struct layer_w *w = &c->m->layers[l];
	uint32_t E = hp->n_embd, F = hp->n_ff;
	size_t layer_off = (size_t)l * c->n_ctx * c->kv_dim;

	/* xb[b] = rmsnorm(x[b]); q, k, v = xb @ Wq, Wk, Wv */
	for (uint32_t b = 0; b < nb; b++)
		rmsnorm(c->xb + (size_t)b * E, c->x + (size_t)b * E, &w->attn_norm, E, hp->norm_eps);
	{
		const struct wt *ws[3] = { &w->wq, &w->wk, &w->wv };
		float *outs[3] = { c->q, c->kb, c->vb };

		matmul_shared(c, 3, ws, outs, c->xb, nb);
	}
	for (uint32_t b = 0; b < nb; b++) {
		float *q = c->q + (size_t)b * c->q_dim;
		float *k = c->kb + (size_t)b * c->kv_dim;
		float *v = c->vb + (size_t)b * c->kv_dim;
		uint32_t pos = c->n_past + b;
		eng_fp16_t *kc = c->kcache + layer_off + (size_t)pos * c->kv_dim;
		eng_fp16_t *vc = c->vcache + layer_off + (size_t)pos * c->kv_dim;

		add_bias(q, &w->bq, c->q_dim);
		add_bias(k, &w->bk, c->kv_dim);
		add_bias(v, &w->bv, c->kv_dim);
		rope(c, q, hp->n_head, pos);
		rope(c, k, hp->n_head_kv, pos);
		for (uint32_t i = 0; i < c->kv_dim; i++) {
			kc[i] = eng_fp32_to_fp16(k[i]);
			vc[i] = eng_fp32_to_fp16(v[i]);
		}
	}

	/* xb2[b] = attention(q[b], cache[0 .. pos]); x += xb2 @ Wo */
	{
		struct attn_job j = { c, l, nb, c->n_past };

		eng_pool_run(c->pool, attn_worker, &j);
	}
	matmul1(c, &w->wo, c->xb, c->xb2, nb);
	for (size_t i = 0; i < (size_t)nb * E; i++)
		c->x[i] += c->xb[i];

	/* x += (silu(xb @ Wgate) * (xb @ Wup)) @ Wdown */
	for (uint32_t b = 0; b < nb; b++)
		rmsnorm(c->xb + (size_t)b * E, c->x + (size_t)b * E, &w->ffn_norm, E, hp->norm_eps);
	{
		const struct wt *ws[2] = { &w->gate, &w->up };
		float *outs[2] = { c->hb, c->hb2 };

		matmul_shared(c, 2, ws, outs, c->xb, nb);
	}
	for (size_t i = 0; i < (size_t)nb * F; i++) {
		float g = c->hb[i];

		c->hb[i] = g / (1.0f + expf(-g)) * c->hb2[i];
	}
	matmul1(c, &w->down, c->xb, c->hb, nb);
	for (size_t i = 0; i < (size_t)nb * E; i++)
		c->x[i] += c->xb[i];
}

/* This thread's CPU time: what a layer costs it, whatever else ran on its
 * core meanwhile or how long it slept on a page fault. */
static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One batch of nb tokens at positions n_past..; logits for rows [first, nb). */
static void forward_batch(struct eng_ctx *c, const int32_t *tok, uint32_t nb, uint32_t first,
			  float *logits)
{
	const struct eng_model *m = c->m;
	const struct eng_hparams *hp = &m->hp;
	uint32_t E = hp->n_embd;
	uint32_t n_out = nb - first;

	for (uint32_t b = 0; b < nb; b++)
		c->k->to_float[m->tok_embd.type](m->tok_embd.data +
							 (size_t)tok[b] * m->tok_embd.row_bytes,
						 c->x + (size_t)b * E, E);
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
	if (!logits) {
		c->outside_ns = 0;
		c->n_past += nb;
		return;
	}
	for (uint32_t b = first; b < nb; b++)
		rmsnorm(c->xb + (size_t)(b - first) * E, c->x + (size_t)b * E, &m->out_norm, E,
			hp->norm_eps);
	matmul1(c, &m->output, c->logits, c->xb, n_out);
	memcpy(logits, c->logits, (size_t)n_out * hp->n_vocab * sizeof(float));
	c->n_past += nb;
	c->outside_ns = cpu_ns() - t;
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
		forward_batch(c, tokens + i, nb, first, out);
	}
	return 0;
}

/* ---- the plain-mmap weight source ------------------------------------- */

int eng_map_file(const char *path, const void **base, size_t *size)
{
	struct stat st;
	void *p;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int rc;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	if (st.st_size == 0) {
		close(fd);
		*base = NULL;
		*size = 0;
		return 0;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	rc = p == MAP_FAILED ? -errno : 0;
	close(fd);
	if (rc)
		return rc;
	*base = p;
	*size = (size_t)st.st_size;
	return 0;
}

void eng_unmap_file(const void *base, size_t size)
{
	if (base && size)
		munmap((void *)base, size);
}

/* ---- what one decoded token reads ------------------------------------- */

static uint64_t wt_bytes(const struct wt *w)
{
	return w->data ? (uint64_t)w->row_bytes * w->ne1 : 0;
}

uint64_t eng_model_token_bytes(const struct eng_model *m)
{
	uint64_t n = wt_bytes(&m->out_norm) + wt_bytes(&m->output);

	/* One embedding row; with tied output it is inside `output` already.
	 * rope_freqs is read once, in eng_ctx_create. */
	if (!m->hp.tied_output)
		n += m->tok_embd.row_bytes;
	for (uint32_t i = 0; m->layers && i < m->hp.n_layer; i++) {
		const struct layer_w *l = &m->layers[i];

		n += wt_bytes(&l->attn_norm) + wt_bytes(&l->wq) + wt_bytes(&l->wk) +
		     wt_bytes(&l->wv) + wt_bytes(&l->wo) + wt_bytes(&l->bq) + wt_bytes(&l->bk) +
		     wt_bytes(&l->bv) + wt_bytes(&l->ffn_norm) + wt_bytes(&l->gate) +
		     wt_bytes(&l->up) + wt_bytes(&l->down);
	}
	return n;
}
