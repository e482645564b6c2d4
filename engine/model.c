/*
 * model.c - load a GGUF model from a mapped image: find every tensor the
 * architecture needs, check its type and shape against the hyper-
 * parameters, and record where it lies.
 *
 * Nothing is copied, so the pages the engine holds are the pages it touches.
 * A fused tensor (phi3's attn_qkv, its gate|up ffn_up) is bound as runs of
 * its rows, one struct wt each, so the forward pass never knows it was
 * fused.  What the architecture adds to llama comes from its description
 * (arch.c); a missing or mis-shaped tensor fails the load with one line
 * naming it.  The model is immutable once loaded; contexts share it.
 */
#include "model_i.h"
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int load_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/*
 * Find tensor `name`, check its type is computable and its shape is
 * [ne0, ne1] (ne1 == 0 means a 1-D tensor of ne0), or [ne0, ne1, ne2] for
 * ne2 > 1: the experts of a mixture, ne2 matrices one after the other, bound
 * as the first (gguf.c keeps interleaved types 2-D, so an expert is always
 * whole groups of rows).  Optional tensors that are absent leave w->data
 * NULL.
 */
static int bind3(const struct eng_model *m, struct wt *w, const char *name, uint64_t ne0,
		 uint64_t ne1, uint64_t ne2, bool optional, char *err, size_t errlen)
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
	if (ne2 > 1 && (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1))
		return load_err(err, errlen,
				"tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%llu, %llu, "
				"%llu]",
				name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
				(unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
				(unsigned long long)ne0, (unsigned long long)ne1,
				(unsigned long long)ne2);
	if (ne2 <= 1 &&
	    (t->ne[0] != ne0 || t->ne[1] != (is_vec ? 1 : ne1) || t->ne[2] != 1 || t->ne[3] != 1))
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

static int bind(const struct eng_model *m, struct wt *w, const char *name, uint64_t ne0,
		uint64_t ne1, bool optional, char *err, size_t errlen)
{
	return bind3(m, w, name, ne0, ne1, 1, optional, err, errlen);
}

/* Rows [r0, r0 + n) of w as a weight of their own.  Interleaved types keep
 * groups of rows together, so a split must fall between groups. */
static int split_rows(const struct wt *w, uint64_t r0, uint64_t n, struct wt *out,
		      const char *name, char *err, size_t errlen)
{
	uint32_t group = eng_type_info(w->type)->row_group;

	if (r0 % group || n % group)
		return load_err(err, errlen, "tensor '%s' is %s and cannot be split at row %llu",
				name, eng_type_info(w->type)->name, (unsigned long long)r0);
	*out = *w;
	out->data = w->data + r0 * w->row_bytes;
	out->ne1 = n;
	return 0;
}

/* The tensor "blk.<l>.<suffix>" */
static int bind_l(const struct eng_model *m, struct wt *w, uint32_t l, const char *suffix,
		  uint64_t ne0, uint64_t ne1, bool optional, char *err, size_t errlen)
{
	char name[96];

	snprintf(name, sizeof(name), "blk.%u.%s", l, suffix);
	return bind(m, w, name, ne0, ne1, optional, err, errlen);
}

/* The attention projections: q, k, v apart or fused, then the output. */
static int bind_attn(const struct eng_model *m, struct layer_w *lw, uint32_t l, char *err,
		     size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	const struct arch_desc *a = m->arch;
	uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
	uint64_t kv_dim = (uint64_t)hp->n_head_kv * hp->head_dim;
	uint32_t E = hp->n_embd;
	int rc;

	char name[96];

	/* phi3 files hold attn_qkv; the reference takes q, k, v apart too */
	snprintf(name, sizeof(name), "blk.%u.attn_qkv.weight", l);
	if (a->fused_qkv && gguf_find_tensor(m->g, name)) {
		struct wt qkv;

		if ((rc = bind(m, &qkv, name, E, q_dim + 2 * kv_dim, false, err, errlen)) ||
		    (rc = split_rows(&qkv, 0, q_dim, &lw->wq, name, err, errlen)) ||
		    (rc = split_rows(&qkv, q_dim, kv_dim, &lw->wk, name, err, errlen)) ||
		    (rc = split_rows(&qkv, q_dim + kv_dim, kv_dim, &lw->wv, name, err, errlen)))
			return rc;
	} else if ((rc = bind_l(m, &lw->wq, l, "attn_q.weight", E,
				(a->gated_q ? 2 : 1) * q_dim, false, err, errlen)) ||
		   (rc = bind_l(m, &lw->wk, l, "attn_k.weight", E, kv_dim, false, err, errlen)) ||
		   (rc = bind_l(m, &lw->wv, l, "attn_v.weight", E, kv_dim, false, err, errlen))) {
		return rc;
	}
	if ((rc = bind_l(m, &lw->wo, l, "attn_output.weight", q_dim, E, false, err, errlen)) ||
	    (rc = bind_l(m, &lw->bq, l, "attn_q.bias", q_dim, 0, !a->qkv_bias, err, errlen)) ||
	    (rc = bind_l(m, &lw->bk, l, "attn_k.bias", kv_dim, 0, !a->qkv_bias, err, errlen)) ||
	    (rc = bind_l(m, &lw->bv, l, "attn_v.bias", kv_dim, 0, !a->qkv_bias, err, errlen)))
		return rc;
	if (a->qk_norm &&
	    ((rc = bind_l(m, &lw->q_norm, l, "attn_q_norm.weight", hp->head_dim, 0, false, err,
			  errlen)) ||
	     (rc = bind_l(m, &lw->k_norm, l, "attn_k_norm.weight", hp->head_dim, 0, false, err,
			  errlen))))
		return rc;
	return 0;
}

/* The feed-forward projections: gate and up apart or fused, then down. */
static int bind_ffn(const struct eng_model *m, struct layer_w *lw, uint32_t l, char *err,
		    size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	uint32_t E = hp->n_embd, F = hp->n_ff;
	int rc;

	if (m->arch->moe) {
		char name[96];

		snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", l);
		if ((rc = bind_l(m, &lw->gate_inp, l, "ffn_gate_inp.weight", E, hp->n_expert,
				 false, err, errlen)) ||
		    (rc = bind3(m, &lw->gate_exps, name, E, hp->n_ff_exp, hp->n_expert, false, err,
				errlen)))
			return rc;
		snprintf(name, sizeof(name), "blk.%u.ffn_up_exps.weight", l);
		if ((rc = bind3(m, &lw->up_exps, name, E, hp->n_ff_exp, hp->n_expert, false, err,
				errlen)))
			return rc;
		snprintf(name, sizeof(name), "blk.%u.ffn_down_exps.weight", l);
		return bind3(m, &lw->down_exps, name, hp->n_ff_exp, E, hp->n_expert, false, err,
			     errlen);
	}
	if (m->arch->fused_gate_up) {
		struct wt gu;
		char name[96];

		/* the gate is the first half, as the reference's swiglu splits it */
		snprintf(name, sizeof(name), "blk.%u.ffn_up.weight", l);
		if ((rc = bind(m, &gu, name, E, 2 * (uint64_t)F, false, err, errlen)) ||
		    (rc = split_rows(&gu, 0, F, &lw->gate, name, err, errlen)) ||
		    (rc = split_rows(&gu, F, F, &lw->up, name, err, errlen)))
			return rc;
	} else if ((rc = bind_l(m, &lw->gate, l, "ffn_gate.weight", E, F, false, err, errlen)) ||
		   (rc = bind_l(m, &lw->up, l, "ffn_up.weight", E, F, false, err, errlen))) {
		return rc;
	}
	return bind_l(m, &lw->down, l, "ffn_down.weight", F, E, false, err, errlen);
}

/* A hybrid's recurrent layer: the Gated DeltaNet's projections, its
 * convolution kernel (F32, [d_conv, conv_dim]) and per-head gate terms. */
static int bind_deltanet(const struct eng_model *m, struct layer_w *lw, uint32_t l, char *err,
			 size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	uint64_t key_dim = (uint64_t)hp->ssm_n_k_heads * hp->ssm_d_state;
	uint64_t conv_dim = 2 * key_dim + hp->ssm_d_inner;
	uint32_t E = hp->n_embd, H = hp->ssm_n_v_heads;
	int rc;

	if ((rc = bind_l(m, &lw->ssm_qkv, l, "attn_qkv.weight", E, conv_dim, false, err,
			 errlen)) ||
	    (rc = bind_l(m, &lw->ssm_gate, l, "attn_gate.weight", E, hp->ssm_d_inner, false, err,
			 errlen)) ||
	    (rc = bind_l(m, &lw->ssm_conv, l, "ssm_conv1d.weight", hp->ssm_d_conv, conv_dim,
			 false, err, errlen)) ||
	    (rc = bind_l(m, &lw->ssm_dt, l, "ssm_dt.bias", H, 0, false, err, errlen)) ||
	    (rc = bind_l(m, &lw->ssm_a, l, "ssm_a", H, 0, false, err, errlen)) ||
	    (rc = bind_l(m, &lw->ssm_beta, l, "ssm_beta.weight", E, H, false, err, errlen)) ||
	    (rc = bind_l(m, &lw->ssm_alpha, l, "ssm_alpha.weight", E, H, false, err, errlen)) ||
	    (rc = bind_l(m, &lw->ssm_norm, l, "ssm_norm.weight", hp->ssm_d_state, 0, false, err,
			 errlen)) ||
	    (rc = bind_l(m, &lw->ssm_out, l, "ssm_out.weight", hp->ssm_d_inner, E, false, err,
			 errlen)))
		return rc;
	/* the kernel is read as floats, row by row */
	if (lw->ssm_conv.type != ENG_TYPE_F32) {
		snprintf(err, errlen, "tensor 'blk.%u.ssm_conv1d.weight' is %s; it must be F32", l,
			 eng_type_info(lw->ssm_conv.type)->name);
		return -ENOTSUP;
	}
	return 0;
}

static int bind_layer(struct eng_model *m, struct layer_w *lw, uint32_t l, char *err,
		      size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	const struct arch_desc *a = m->arch;
	uint32_t E = hp->n_embd;
	char ffn_norm[64];
	int rc;

	lw->recurrent = a->hybrid && (l + 1) % hp->full_attn_interval != 0;
	lw->slot = lw->recurrent ? m->n_rs_layers++ : m->n_kv_layers++;
	snprintf(ffn_norm, sizeof(ffn_norm), "%s.weight", a->ffn_norm ? a->ffn_norm : "ffn_norm");
	if ((rc = bind_l(m, &lw->attn_norm, l, "attn_norm.weight", E, 0, false, err, errlen)) ||
	    (rc = lw->recurrent ? bind_deltanet(m, lw, l, err, errlen)
				: bind_attn(m, lw, l, err, errlen)) ||
	    (rc = bind_l(m, &lw->ffn_norm, l, ffn_norm, E, 0, false, err, errlen)) ||
	    (rc = bind_ffn(m, lw, l, err, errlen)))
		return rc;
	if (a->post_norms &&
	    ((rc = bind_l(m, &lw->post_attn_norm, l, "post_attention_norm.weight", E, 0, false,
			  err, errlen)) ||
	     (rc = bind_l(m, &lw->post_ffn_norm, l, "post_ffw_norm.weight", E, 0, false, err,
			  errlen))))
		return rc;
	/* the reference's layer pattern: l % period < period - 1 slides */
	if (hp->n_swa && hp->swa_period && l % hp->swa_period < hp->swa_period - 1) {
		lw->n_swa = hp->n_swa;
		lw->local_rope = a->rope_base_local > 0;
	}
	return 0;
}

static int load_tensors(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
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
		       errlen)) ||
	    (rc = bind(m, &m->rope_long, "rope_factors_long.weight", hp->n_rot / 2, 0,
		       !hp->rope_longrope, err, errlen)) ||
	    (rc = bind(m, &m->rope_short, "rope_factors_short.weight", hp->n_rot / 2, 0,
		       !hp->rope_longrope, err, errlen)))
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
	for (uint32_t l = 0; l < hp->n_layer; l++)
		if ((rc = bind_layer(m, &m->layers[l], l, err, errlen)))
			return rc;
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
	m->base = base;
	m->size = size;
	rc = gguf_parse(base, size, &m->g, err, errlen);
	if (rc)
		goto fail;
	m->vocab_only = vocab_only;
	if (!vocab_only) {
		rc = arch_load_hparams(m, err, errlen);
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
	/* Reasons quote names from the file (keys, tensors, tokens): a
	 * hostile one could put a newline or a terminal escape in them.  The
	 * reason is one line of plain text, whatever the file says. */
	for (char *c = err; errlen && *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
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

/* ---- what one decoded token reads ------------------------------------- */

static uint64_t wt_bytes(const struct wt *w)
{
	return w->data ? (uint64_t)w->row_bytes * w->ne1 : 0;
}

/* A layer's weights but the experts (expert 0's of each, bound alone). */
#define LAYER_WTS(l)                                                                        \
	{                                                                                   \
		&(l)->attn_norm, &(l)->wq, &(l)->wk, &(l)->wv, &(l)->wo, &(l)->bq, &(l)->bk,  \
		&(l)->bv, &(l)->q_norm, &(l)->k_norm, &(l)->post_attn_norm, &(l)->ffn_norm,   \
		&(l)->gate, &(l)->up, &(l)->down, &(l)->post_ffn_norm, &(l)->ssm_qkv,         \
		&(l)->ssm_gate, &(l)->ssm_conv, &(l)->ssm_dt, &(l)->ssm_a, &(l)->ssm_beta,    \
		&(l)->ssm_alpha, &(l)->ssm_norm, &(l)->ssm_out, &(l)->gate_inp,               \
	}
#define EXPERT_WTS(l) { &(l)->gate_exps, &(l)->up_exps, &(l)->down_exps }
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

uint64_t eng_model_token_bytes(const struct eng_model *m)
{
	uint64_t n = wt_bytes(&m->out_norm) + wt_bytes(&m->output);

	/* One embedding row; with tied output it is inside `output` already.
	 * rope_freqs and the rope factors are read once, in eng_ctx_create. */
	if (!m->hp.tied_output)
		n += m->tok_embd.row_bytes;
	for (uint32_t i = 0; m->layers && i < m->hp.n_layer; i++) {
		struct layer_w *l = &m->layers[i];
		struct wt *ws[] = LAYER_WTS(l), *ex[] = EXPERT_WTS(l);

		for (size_t j = 0; j < COUNT(ws); j++)
			n += wt_bytes(ws[j]);
		/* the experts the router picks (bound as one each) */
		for (size_t j = 0; j < COUNT(ex); j++)
			n += wt_bytes(ex[j]) * m->hp.n_expert_used;
	}
	return n;
}

/* w's bytes times `times` when they lie in m's own image, else 0 (shared). */
static uint64_t own_bytes(const struct eng_model *m, const struct wt *w, uint64_t times)
{
	if (!w->data || w->data < m->base || w->data >= m->base + m->size)
		return 0;
	return wt_bytes(w) * times;
}

uint64_t eng_model_own_bytes(const struct eng_model *m)
{
	uint64_t n = own_bytes(m, &m->out_norm, 1) + own_bytes(m, &m->output, 1);

	for (uint32_t i = 0; m->layers && i < m->hp.n_layer; i++) {
		struct layer_w *l = &m->layers[i];
		struct wt *ws[] = LAYER_WTS(l), *ex[] = EXPERT_WTS(l);

		for (size_t j = 0; j < COUNT(ws); j++)
			n += own_bytes(m, ws[j], 1);
		/* over the tokens every expert is picked: all of them */
		for (size_t j = 0; j < COUNT(ex); j++)
			n += own_bytes(m, ex[j], m->hp.n_expert);
	}
	return n;
}

/* ---- sharing a draft's weights with its model ------------------------- */

/* One tensor of m found identical in `from`: m's bytes [d, d + len) are
 * from's at t. */
struct same {
	const uint8_t *d, *t;
	uint64_t len;
};

/* w, when it lies in one of the n tensors found identical, into from's. */
static void repoint(struct wt *w, const struct same *s, size_t n)
{
	for (size_t i = 0; w->data && i < n; i++)
		if (w->data >= s[i].d && w->data < s[i].d + s[i].len) {
			w->data = s[i].t + (w->data - s[i].d);
			return;
		}
}

/* Every weight m computes with: the embedding, head and rope tables, then
 * each layer's, experts included. */
static void repoint_all(struct eng_model *m, const struct same *s, size_t n)
{
	struct wt *top[] = { &m->tok_embd, &m->out_norm, &m->output, &m->rope_freqs,
			     &m->rope_long, &m->rope_short };

	for (size_t j = 0; j < COUNT(top); j++)
		repoint(top[j], s, n);
	for (uint32_t i = 0; i < m->hp.n_layer; i++) {
		struct layer_w *l = &m->layers[i];
		struct wt *ws[] = LAYER_WTS(l), *ex[] = EXPERT_WTS(l);

		for (size_t j = 0; j < COUNT(ws); j++)
			repoint(ws[j], s, n);
		for (size_t j = 0; j < COUNT(ex); j++)
			repoint(ex[j], s, n);
	}
}

int eng_model_share(struct eng_model *m, const struct eng_model *from, unsigned flags,
		    uint64_t *bytes)
{
	uint64_t nt = gguf_n_tensors(m->g), total = 0;
	struct same *s;
	size_t n = 0;

	if (bytes)
		*bytes = 0;
	if (m->vocab_only || from->vocab_only)
		return -EINVAL;
	if (m->shared)
		return -EALREADY;
	s = calloc(nt ? nt : 1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	for (uint64_t i = 0; i < nt; i++) {
		const struct gguf_tensor *a = gguf_tensor_at(m->g, i), *b;
		char name[256];

		if (a->name.len >= sizeof(name))
			continue;
		memcpy(name, a->name.ptr, a->name.len);
		name[a->name.len] = '\0';
		if (!(flags & ENG_SHARE_LAYERS) && !strncmp(name, "blk.", 4))
			continue;
		b = gguf_find_tensor(from->g, name);
		if (!b || b->type != a->type || b->size != a->size ||
		    memcmp(a->ne, b->ne, sizeof(a->ne)))
			continue;
		const uint8_t *pa = gguf_tensor_data_ptr(m->g, a);
		const uint8_t *pb = gguf_tensor_data_ptr(from->g, b);

		/* the whole of both, compared once: never a sampled guess */
		if (memcmp(pa, pb, a->size))
			continue;
		s[n++] = (struct same){ .d = pa, .t = pb, .len = a->size };
		total += a->size;
	}
	repoint_all(m, s, n);
	free(s);
	m->shared = n > 0;
	if (bytes)
		*bytes = total;
	return (int)(n > INT32_MAX ? INT32_MAX : n);
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
