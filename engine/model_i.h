/*
 * model_i.h - what the engine's model files share: the per-architecture
 * description (arch.c), the validated model (model.c), the run state and
 * the blocks of the forward pass (forward.c, matmul.c, deltanet.c).
 *
 * An architecture is the llama block plus a few differences, and
 * struct arch_desc lists them; nothing outside arch.c tests an
 * architecture's identity.  The forward pass reads the description and the
 * per-layer facts (struct layer_w) and does the same steps for every model:
 *
 *   x      = embed(token) (* sqrt(n_embd))
 *   per layer:
 *     xb   = rmsnorm(x) * attn_norm
 *     mix  = attention(xb)  or, in a hybrid's recurrent layers, deltanet(xb)
 *     x   += post_attn_norm ? rmsnorm(mix) * post_attn_norm : mix
 *     xb   = rmsnorm(x) * ffn_norm
 *     f    = act(xb @ Wgate) * (xb @ Wup) @ Wdown
 *            or, a mixture of experts, the same per routed expert, weighted
 *     x   += post_ffn_norm ? rmsnorm(f) * post_ffn_norm : f
 *   logits = rmsnorm(x) * output_norm @ Woutput (soft-capped)
 */
#ifndef STRATA_MODEL_I_H
#define STRATA_MODEL_I_H

#include "attn_i.h"
#include "engine.h"
#include "gguf.h"
#include "quant.h"
#include "threads.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_CTX_DEFAULT 4096
/* the most tokens fed after a checkpoint that eng_ctx_truncate can undo, on
 * models that need a checkpoint (a draft and its verification fit) */
#define UNDO_MAX 32

/* A weight tensor as the forward pass sees it: ne1 rows of ne0 elements at
 * data.  A fused tensor (phi3's attn_qkv) is bound as several of these, each
 * a run of its rows: nothing is copied. */
struct wt {
	const uint8_t *data;
	uint32_t type;
	uint64_t ne0, ne1;
	size_t row_bytes;
};

enum ffn_act {
	ACT_SILU,      /* silu(gate) * up */
	ACT_GELU_TANH, /* gelu(gate) * up, tanh approximation */
};

/*
 * How an architecture differs from llama.  The loader binds the tensors the
 * flags name and the forward pass applies the steps they name; hyper-
 * parameters that come from metadata (window, soft-caps, rope bases) are in
 * eng_hparams.
 */
struct arch_desc {
	const char *name;
	enum eng_arch id;
	enum eng_rope_kind rope;
	enum ffn_act act;
	bool qkv_bias;      /* attn_{q,k,v}.bias (qwen2) */
	bool qk_norm;       /* attn_q_norm, attn_k_norm: rmsnorm per head before rope */
	bool post_norms;    /* post_attention_norm, post_ffw_norm on the block outputs */
	bool embd_scale;    /* embedding rows times sqrt(n_embd) (gemma) */
	bool fused_qkv;     /* attn_qkv holds q | k | v (phi3) */
	bool fused_gate_up; /* ffn_up holds gate | up, each n_ff rows (phi3) */
	bool q_prescale;    /* q times the attention scale before q.k; else the scores */
	bool softcap;       /* reads {attn,final}_logit_softcapping (gemma2) */
	uint32_t swa_period; /* layer l slides its window if l % period < period - 1;
			      * 1: every layer when a window is given; 0: none */
	float rope_base_local; /* rope base of sliding-window layers; 0: the global one */
	bool gated_q;       /* attn_q holds q | gate per head; out *= sigmoid(gate) */
	const char *ffn_norm; /* the pre-FFN norm's name: "ffn_norm" unless said */
	bool hybrid;        /* Gated DeltaNet layers between attention layers (qwen35) */
	bool moe;           /* the FFN is routed experts (qwen3moe): ffn_gate_inp and the
			     * 3-D ffn_{gate,up,down}_exps instead of ffn_{gate,up,down} */
};

/* Per layer.  Tensors an architecture does not have stay zero. */
struct layer_w {
	struct wt attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, post_attn_norm;
	struct wt ffn_norm, gate, up, down, post_ffn_norm;
	/* Mixture of experts: the router ([n_embd] -> [n_expert]) and the
	 * experts' matrices, bound as expert 0's; expert e's is the same shape
	 * e * ne1 rows further on (expert_w) */
	struct wt gate_inp, gate_exps, up_exps, down_exps;
	/* Gated DeltaNet (recurrent layers of a hybrid) */
	struct wt ssm_qkv, ssm_gate, ssm_conv, ssm_dt, ssm_a, ssm_beta, ssm_alpha, ssm_norm,
		ssm_out;
	uint32_t n_swa;    /* keys visible to a query: 0 all, else the last n_swa */
	bool local_rope;   /* rope with rope_base_local */
	bool recurrent;    /* a DeltaNet layer: no KV cache */
	uint32_t slot;     /* its slice of the KV cache, or of the recurrent state */
};

struct eng_model {
	struct gguf *g;
	const struct arch_desc *arch;
	struct eng_hparams hp;
	struct eng_tokenizer *tok;
	struct wt tok_embd, out_norm, output, rope_freqs, rope_long, rope_short;
	struct layer_w *layers;
	const uint8_t *base;   /* the image it was loaded from, and its size */
	size_t size;
	bool shared;           /* some weights are another model's (eng_model_share) */
	uint32_t n_kv_layers, n_rs_layers; /* attention and recurrent layers */
	bool vocab_only;
};

/* arch.c */
/* The architecture of g and its hyper-parameters into m->arch, m->hp. */
int arch_load_hparams(struct eng_model *m, char *err, size_t errlen);

/* model.c: a one-line message into err, returns -EINVAL */
int __attribute__((format(printf, 3, 4))) load_err(char *err, size_t errlen, const char *fmt,
						   ...);

/*
 * The run state: everything a forward pass touches besides the weights,
 * allocated once in eng_ctx_create.
 */
struct eng_ctx {
	const struct eng_model *m;
	const struct eng_kernels *k;
	struct eng_pool *pool;
	uint32_t n_ctx, n_batch, n_past, n_threads;
	uint32_t q_dim, kv_dim;
	enum eng_kv_type type_k, type_v;
	size_t k_row, v_row;         /* bytes of a token's K, V row (kv_dim values) */
	struct kv_layer *kv;         /* [n_kv_layers] (attn_i.h) */
	const struct attn_kernels *ak;
	uint64_t kv_bytes;
	float *x, *xb, *xb2;         /* [n_batch][max(n_embd, q_dim, ...)] */
	float *q, *kb, *vb;          /* [n_batch][q_dim (x2 gated)], [n_batch][kv_dim] x2 */
	float *qgate;                /* [n_batch][q_dim] a gated q's gate */
	float *hb, *hb2;             /* [n_batch][n_ff], a mixture's [n_batch * k][n_ff_exp] */
	/* mixture of experts (forward.c, moe_block); k = n_expert_used, a
	 * pair is a token and one of its k slots, b * k + slot */
	float *moe_probs;            /* [n_batch][n_expert] router output */
	uint32_t *moe_sel;           /* [n_batch * k] the experts picked */
	float *moe_w;                /* [n_batch * k] their weights */
	uint32_t *moe_rows;          /* [n_batch * k] the pairs sorted by expert */
	uint32_t *moe_pos;           /* [n_batch * k] a pair's place in moe_rows */
	uint32_t *moe_first;         /* [n_expert + 1] each expert's run in moe_rows */
	uint32_t *moe_route;         /* [n_expert] the experts a pass picked */
	eng_route_fn route_fn;       /* told them first (eng_ctx_set_route_hook) */
	void *route_arg;
	eng_route_fn ahead_fn;       /* the next layer's guessed (eng_ctx_set_lookahead_hook) */
	void *ahead_arg;
	uint8_t *moe_mark;           /* [n_expert] the lookahead's picks */
	struct mm_part *moe_parts;   /* [2 n_expert] one matmul's experts */
	struct wt *moe_slice;        /* [2 n_expert] their matrices */
	float *moe_in;               /* [n_batch * k][n_embd] the pairs' inputs, sorted */
	float *moe_y;                /* [n_batch * k][n_embd] their experts' outputs */
	float *att;                  /* [n_threads][GQA group][n_ctx] scores */
	eng_fp16_t *att16;           /* [n_threads][n_ctx] the weights as f16 */
	float *vrow;                 /* [n_threads][head_dim] a cache slice as floats */
	double *vacc;                /* [n_threads][GQA group][head_dim] weighted sums */
	uint8_t *qbuf;               /* [n_threads][GQA group][qbuf_stride] the query as the keys' dot
				      * takes it (f16, Q8_0) */
	size_t qbuf_stride;
	/* Whose each row of the pass is: the context whose cache (or recurrent
	 * state) its token reads and writes, and its position there.  A plain
	 * pass fills them with this context and n_past.. ; eng_decode_multi
	 * with the rows' own sequences, so the weight matmuls run once over
	 * every sequence's rows. */
	struct eng_ctx **row_ctx;    /* [n_batch] */
	uint32_t *row_pos;           /* [n_batch] */
	float *theta[2];             /* [n_rot / 2] per-pair frequency: global, local */
	float rope_mscale;           /* cos and sin times this (longrope's attn_factor) */
	/* Gated DeltaNet state and scratch (hybrids only) */
	float *conv_state;           /* [n_rs_layers][d_conv - 1][conv_dim] */
	float *ssm_state;            /* [n_rs_layers][n_v_heads][d_state][d_state] */
	float *ssm_buf;              /* [n_batch][conv_dim + 2 value_dim + 2 n_v_heads] */
	/* undoing tokens (eng_ctx_truncate): the last checkpoint's position,
	 * how far past it the run went, and how far past it an undo can reach;
	 * for hybrids the checkpoint's recurrent state and the recurrence's
	 * inputs of the tokens fed since ([n_rs_layers][undo_max][conv_dim +
	 * 2 n_v_heads]) */
	uint32_t undo_from, undo_high, undo_max;
	bool undo_anywhere;          /* no rings, no recurrent layers: no limit */
	bool undo_ok;                /* a checkpoint is in force */
	float *undo_conv, *undo_ssm, *undo_in;
	uint8_t *qact;               /* quantized activations, [qact_rows] rows:
				      * n_batch, a mixture's n_batch * k
				      * (each with its pack8 copy beside it),
				      * on a cache line's start */
	uint8_t *qact_mem;           /* what holds qact (free this) */
	size_t qact_stride;
	uint32_t qact_rows;
	uint64_t *layer_ns;          /* [n_layer] each layer's CPU time in the last pass */
	uint64_t outside_ns;         /* the rest of its CPU time (output, logits) */
	uint64_t bytes;
	bool dry, oom;               /* eng_ctx_size's count only; an allocation failed */
};

/* matmul.c: out_j[b][r] = W_j[r] . in[b] for n (<= 3) weights sharing the
 * input in ([nb][ne0] floats), on the context's threads. */
/* One weight of a grouped matmul: out[b][r] = w[r] . in[row0 + b], b < nb. */
struct mm_part {
	const struct wt *w;
	float *out;
	uint32_t row0, nb;
	uint64_t chunks_end; /* matmul.c's: its chunks end here, over all parts */
};
/* n parts over the n_rows rows of in ([n_rows][ne0] floats), whose weights
 * share ne0 and the activation format: the input converted once, all the
 * parts' rows shared out in one run of the pool (a mixture's experts, each
 * over the rows of its tokens). */
void matmul_parts(struct eng_ctx *c, unsigned n, struct mm_part *parts, const float *in,
		  uint32_t n_rows);
void matmul_shared(struct eng_ctx *c, unsigned n, const struct wt *const *w, float *const *out,
		   const float *in, uint32_t nb);
void matmul1(struct eng_ctx *c, const struct wt *w, float *out, const float *in, uint32_t nb);

/* forward.c: blocks deltanet.c and kv.c share */
void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);
/* Rotate the first n_rot dimensions of each of n_heads heads of v to
 * position pos (negative: back by as many), with a layer's frequency table
 * and scale; cos and sin times mscale. */
void rope_heads(const struct eng_ctx *c, float *v, uint32_t n_heads, float pos,
		const float *theta_base, float freq_scale, float mscale);

/* deltanet.c: the token mixer of a hybrid's recurrent layer l, for the nb
 * tokens in c->xb (normed); the result into c->xb ([nb][n_embd]).  Tokens go
 * through the recurrence one after the other, as the reference feeds them,
 * each through the state of its row's context (c->row_ctx). */
void deltanet_forward(struct eng_ctx *c, uint32_t l, uint32_t nb);
/* The recurrent state into the checkpoint's copy; and back from it, with the
 * recurrence replayed for the n tokens fed after it that are kept. */
void deltanet_checkpoint(struct eng_ctx *c);
void deltanet_rewind(struct eng_ctx *c, uint32_t n);


/* spec.c: the model's verdict on draft token d, given its logits row (what
 * follows the token before d) and the drafter's distribution q (n_q
 * entries; NULL: one-hot at d): d when accepted, else the token to take
 * instead, distributed so that the result is distributed as eng_sample's
 * draw from row.  p ([n_vocab]) and resid ([n_vocab]) are scratch. */
int32_t spec_judge(struct eng_sampler *s, uint32_t n_vocab, const float *row, int32_t d,
		   const struct eng_token_p *q, size_t n_q, struct eng_token_p *p, float *resid);

#endif
