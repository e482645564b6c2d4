/*
 * engine.h - the strata inference engine: load a GGUF model from a mapped
 * byte range and run it.
 *
 * The one narrow interface to the weights is (base, size) of the whole file:
 * the engine computes straight from that region and never copies or repacks a
 * weight, so the memory it holds is exactly the pages it touches.  Whether the
 * region came from mmap(2) (eng_map_file) or from the strata pager is none of
 * the engine's business.
 *
 * Objects:
 *   struct eng_model  the validated view of one file: hyper-parameters,
 *                     per-layer tensor pointers, tokenizer.  Immutable.
 *   struct eng_ctx    one inference stream over a model: KV cache (f16, q8_0
 *                     or q4_0, preallocated for n_ctx; a ring of the window
 *                     on sliding-window layers), activation buffers, threads.
 */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct eng_model;
struct eng_ctx;
struct eng_tokenizer;
struct gguf;

enum eng_arch {
	ENG_ARCH_LLAMA,
	ENG_ARCH_QWEN2,
	ENG_ARCH_QWEN3,
	ENG_ARCH_GEMMA2,
	ENG_ARCH_GEMMA3,
	ENG_ARCH_PHI3,
	ENG_ARCH_QWEN35,
	ENG_ARCH_QWEN3MOE,
};

enum eng_rope_kind {
	ENG_ROPE_NORM, /* rotate pairs (x[2i], x[2i+1]): llama */
	ENG_ROPE_NEOX, /* rotate pairs (x[i], x[i + n_rot/2]): qwen2 and newer */
};

struct eng_hparams {
	enum eng_arch arch;
	const char *arch_name;
	uint32_t n_vocab;
	uint32_t n_ctx_train;
	uint32_t n_embd;
	uint32_t n_layer;
	uint32_t n_ff;
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t head_dim;
	uint32_t n_rot;
	float rope_base;
	float rope_freq_scale; /* 1 / linear scaling factor */
	float rope_base_local; /* sliding-window layers' base (gemma3), else rope_base */
	float rope_attn_factor; /* rope.scaling.attn_factor: cos, sin times it */
	uint32_t n_ctx_orig;    /* rope.scaling.original_context_length (longrope) */
	bool rope_longrope;     /* per-pair factors, long or short by context size */
	enum eng_rope_kind rope_kind;
	float norm_eps;
	float attn_scale;       /* q.k times this */
	float attn_softcap;     /* scores = c * tanh(scores / c); 0: off */
	float final_softcap;    /* the same for the logits */
	uint32_t n_swa;         /* sliding window in tokens; 0: none */
	uint32_t swa_period;    /* layer l slides if l % period < period - 1 */
	bool tied_output;
	/* Gated DeltaNet (qwen35): the layers l with (l + 1) % full_attn_interval
	 * != 0 are recurrent, the others attention */
	uint32_t full_attn_interval; /* 0: no recurrent layers */
	uint32_t ssm_d_conv;         /* causal convolution width */
	uint32_t ssm_d_state;        /* head size of k and v */
	uint32_t ssm_n_k_heads;      /* ssm.group_count */
	uint32_t ssm_n_v_heads;      /* ssm.time_step_rank */
	uint32_t ssm_d_inner;        /* value_dim = n_v_heads * d_state */
	/* Mixture of experts (qwen3moe): each layer's FFN is n_expert SwiGLU
	 * experts of n_ff_exp, of which a router picks n_expert_used a token */
	uint32_t n_expert;           /* 0: a dense FFN */
	uint32_t n_expert_used;
	uint32_t n_ff_exp;
	uint64_t file_bytes;
	uint64_t weight_bytes;  /* sum of all tensor sizes */
	char name[128];         /* general.name, for messages */
};

/* A byte extent of the file the engine will read for one unit of work. */
struct eng_extent {
	uint64_t offset;
	uint64_t size;
};

/*
 * Load a model from the image of a GGUF file.  On failure returns -EINVAL
 * (malformed), -ENOTSUP (architecture, type or feature not supported) or
 * -ENOMEM, with a one-line reason in err.  The image must outlive the model.
 */
int eng_model_load(const void *base, size_t size, struct eng_model **out, char *err,
		   size_t errlen);
/* Load only the tokenizer (vocabulary-only GGUF files work): for tokenize.
 * The returned model cannot create a context. */
int eng_model_load_vocab(const void *base, size_t size, struct eng_model **out, char *err,
			 size_t errlen);
void eng_model_destroy(struct eng_model *m);
const struct eng_hparams *eng_model_hparams(const struct eng_model *m);
const struct eng_tokenizer *eng_model_tokenizer(const struct eng_model *m);
/* The model's parsed GGUF header (gguf.h), for tools that look at tensors. */
const struct gguf *eng_model_gguf(const struct eng_model *m);
/* Bytes of weights the forward pass reads for one decoded token: every
 * matrix, norm and bias once, one embedding row (0 for a vocabulary-only
 * model); of a mixture of experts the router and the used experts only.
 * Memory bandwidth divided by this bounds decode tok/s. */
uint64_t eng_model_token_bytes(const struct eng_model *m);

/*
 * A draft model's weights that are the model's own (a self-speculative
 * draft: the model's head and first layers): every tensor of m whose name,
 * type, shape and bytes equal a tensor of `from` is read from from's image
 * instead of m's, so both compute from one copy.  Equality is exact: the
 * two tensors' bytes are compared whole, once, here (a read of each); the
 * weights are never copied.  Tensors of layers (blk.N.*) are shared only
 * with ENG_SHARE_LAYERS: through the pager a layer of `from` may be
 * streamed, and a draft reading it every token would read it from storage
 * every token.  `from` must outlive m.  Returns the number of tensors now
 * shared (their bytes into *bytes, if not NULL), -EINVAL for a
 * vocabulary-only model, -EALREADY when m shares already.
 */
#define ENG_SHARE_LAYERS 1u
int eng_model_share(struct eng_model *m, const struct eng_model *from, unsigned flags,
		    uint64_t *bytes);
/*
 * Bytes of m's own image its passes keep touching, the memory it holds while
 * it runs: every weight it computes with, whole (all experts of a mixture),
 * but the token embedding, which a token reads one row of (unless the
 * output is tied to it), and what it shares with another model
 * (eng_model_share).  0 for a vocabulary-only model.
 */
uint64_t eng_model_own_bytes(const struct eng_model *m);

/*
 * KV cache element types.  The quantized ones are GGUF's Q8_0 and Q4_0 blocks
 * of 32 along a token's row of n_head_kv * head_dim values; the attention
 * reads them in place (kv.c, attn.c).  They need that row to be a multiple of
 * 32 and each head to be a multiple of 32 or to divide it.
 */
enum eng_kv_type {
	ENG_KV_F16,
	ENG_KV_Q8_0,
	ENG_KV_Q4_0,
	ENG_KV_COUNT,
};

/* "f16", "q8_0", "q4_0"; and back (0 or -EINVAL). */
const char *eng_kv_type_name(enum eng_kv_type t);
int eng_kv_type_parse(const char *s, enum eng_kv_type *out);

struct eng_ctx_config {
	uint32_t n_ctx;     /* 0: min(n_ctx_train, 4096) */
	uint32_t n_threads; /* 0: number of CPUs this process may use */
	uint32_t n_batch;   /* tokens per forward pass; 0: 256 */
	enum eng_kv_type type_k, type_v; /* 0: f16 */
};

/* What a context of a given configuration allocates, without allocating. */
struct eng_ctx_size {
	uint32_t n_ctx;      /* the context the configuration gives */
	uint64_t kv_bytes;   /* KV cache of every attention layer */
	uint64_t total_bytes; /* KV cache, recurrent state and buffers */
};
int eng_ctx_size(const struct eng_model *m, const struct eng_ctx_config *cfg,
		 struct eng_ctx_size *out, char *err, size_t errlen);

int eng_ctx_create(const struct eng_model *m, const struct eng_ctx_config *cfg,
		   struct eng_ctx **out, char *err, size_t errlen);
void eng_ctx_destroy(struct eng_ctx *c);
/* Bytes of memory the context allocated (KV cache and buffers), and of
 * those the KV cache's. */
uint64_t eng_ctx_bytes(const struct eng_ctx *c);
uint64_t eng_ctx_kv_bytes(const struct eng_ctx *c);
/* The calling thread's CPU time in each layer in the last forward pass, ns
 * ([n_layer]; not the time it slept on a page fault or lost to other
 * programs), and in the rest of that pass (the output matrix). */
const uint64_t *eng_ctx_layer_ns(const struct eng_ctx *c);
/* Called on the thread running a pass, before a mixture-of-experts layer
 * reads its experts' weights, with the experts its router picked for the
 * pass's rows (each once, ascending): whoever serves the weights (the
 * pager) can read the missing ones at once.  NULL: none. */
typedef void (*eng_route_fn)(void *arg, uint32_t layer, const uint32_t *experts, uint32_t n);
void eng_ctx_set_route_hook(struct eng_ctx *c, eng_route_fn fn, void *arg);
/* Called right after the route hook of every mixture-of-experts layer but
 * the last, with a guess of the next layer's picks (a lookahead: the next
 * layer's router applied to the residual entering this layer's experts, the
 * union over the pass's rows, ascending), so that the next layer's weights
 * can be read while this layer computes.  It costs a router's bytes a layer
 * (in the pass of this layer's router), only while set; the pass's results
 * do not depend on it.  NULL: none. */
void eng_ctx_set_lookahead_hook(struct eng_ctx *c, eng_route_fn fn, void *arg);
uint64_t eng_ctx_outside_ns(const struct eng_ctx *c);
uint32_t eng_ctx_n_ctx(const struct eng_ctx *c);
uint32_t eng_ctx_n_past(const struct eng_ctx *c);
void eng_ctx_reset(struct eng_ctx *c);

/*
 * Context shift: forget the n_discard tokens after the first n_keep, move
 * the rest down as many positions and rotate their cached keys to the new
 * positions (RoPE is a rotation by position: the kept keys are rotated by
 * -n_discard).  n_keep + n_discard must not exceed eng_ctx_n_past.  Returns
 * 0, -EINVAL, or -ENOTSUP for a model with recurrent layers (their state
 * cannot forget tokens).
 */
int eng_ctx_shift(struct eng_ctx *c, uint32_t n_keep, uint32_t n_discard);

/*
 * Undoing tokens: speculative decoding feeds drafted tokens and keeps the
 * ones the model agrees with.  eng_ctx_truncate(c, n) forgets the tokens at
 * positions n.. (n <= eng_ctx_n_past): the next token fed goes to position
 * n, and the run goes on exactly as if the forgotten tokens had never been
 * fed.  How far back it may go: anywhere, for a model whose every layer
 * keeps its whole KV cache; otherwise back to the position of the last
 * eng_ctx_checkpoint, as long as no more than eng_ctx_undo_max tokens were
 * fed after it (a sliding-window ring overwrites older rows, and a hybrid's
 * recurrent state is brought back by restoring the checkpoint's copy and
 * replaying the recurrence of the tokens kept).  A reset or a context shift
 * drops the checkpoint.  Returns 0, or -EINVAL when n is out of that range.
 */
void eng_ctx_checkpoint(struct eng_ctx *c);
uint32_t eng_ctx_undo_max(const struct eng_ctx *c);
int eng_ctx_truncate(struct eng_ctx *c, uint32_t n_past);

/*
 * Feed n tokens at the next positions.  logits, if not NULL, receives n_vocab
 * floats for every token fed (all_logits) or for the last one only.  Returns
 * 0, -EINVAL for a token id out of range, or -ENOSPC when the context is full.
 */
int eng_decode(struct eng_ctx *c, const int32_t *tokens, size_t n, float *logits,
	       bool all_logits);

/*
 * One pass over rows of several sequences of the same model: row i feeds
 * tokens[i] to ctxs[i] at that context's next position (rows of one context
 * take its positions in row order).  Every weight is read once for all n
 * rows, so a streamed layer serves every sequence; each row's attention,
 * RoPE and KV cache (or recurrent state) are its own context's.  The pass
 * runs on ctxs[0]'s threads and buffers: n <= its n_batch, every context no
 * longer than it, with its cache types, and no context given more than its
 * own n_batch rows.  logits, if not NULL, receives n_vocab floats for each
 * row want marks (want NULL: every row), in row order; a row's logits are
 * bit-identical to feeding its context alone.  The contexts must not be in
 * use elsewhere meanwhile.  Returns 0, -EINVAL (a mismatch or a token out
 * of range), or -ENOSPC when a context is full; then nothing was fed.
 */
int eng_decode_multi(struct eng_ctx *const *ctxs, const int32_t *tokens, const bool *want,
		     size_t n, float *logits);

/* Sampling. */
struct eng_sampler_config {
	float temp;    /* <= 0: greedy */
	int32_t top_k; /* <= 0: off */
	float top_p;   /* >= 1: off */
	float min_p;   /* <= 0: off */
	uint64_t seed;
};
struct eng_sampler;
int eng_sampler_create(const struct eng_sampler_config *cfg, uint32_t n_vocab,
		       struct eng_sampler **out);
void eng_sampler_destroy(struct eng_sampler *s);
int32_t eng_sample(struct eng_sampler *s, const float *logits);
/* The distribution eng_sample draws from: n (id, p) pairs into out
 * ([n_vocab] room), p summing to 1, most likely first; greedy, the argmax
 * alone with p 1.  Returns n. */
struct eng_token_p {
	int32_t id;
	float p;
};
size_t eng_sampler_dist(struct eng_sampler *s, const float *logits, struct eng_token_p *out);
/* A uniform number in [0, 1) from the sampler's generator. */
double eng_sampler_uniform(struct eng_sampler *s);
int32_t eng_argmax(const float *logits, uint32_t n);

/*
 * Speculative decoding (spec.c): a drafter guesses the next tokens, the
 * model checks them all in one pass and keeps those it agrees with.
 * Greedy output is the plain greedy output, token for token; sampled
 * output is distributed as plain sampling's.
 */
struct eng_spec_config {
	struct eng_ctx *draft;  /* a draft model's context (the same vocabulary,
				 * a context at least as long), or NULL */
	bool lookup;            /* draft the tokens that followed the latest earlier
				 * occurrence of the text's last n-gram */
	uint32_t lookup_min;    /* the shortest n-gram lookup matches; 0: 2 */
	uint32_t draft_max;     /* the most tokens drafted per pass; 0: 16 (and no
				 * more than eng_ctx_undo_max - 1) */
	uint32_t draft_min;     /* the fewest; between the two, as many as pay, by
				 * measured acceptance and pass costs (0: plain
				 * passes when none do); draft_min = draft_max: always */
	struct eng_sampler_config sampler; /* the run's: the draft model samples alike */
	/* how the model is fed (e.g. to time passes); NULL: eng_decode on the
	 * model's context */
	int (*decode)(void *arg, const int32_t *ids, size_t n, float *logits, bool all);
	void *decode_arg;
};
struct eng_spec_stats {
	uint64_t passes;   /* passes of the model */
	uint64_t drafted;  /* tokens drafted and judged */
	uint64_t accepted; /* of those, kept */
	uint64_t rejected; /* passes that rejected a draft: accepted / (accepted +
			    * rejected) is the chance a draft is kept, given the
			    * ones before it were */
	uint64_t tokens;   /* tokens produced (accepted, plus one per pass) */
};
struct eng_spec;
/* Checks that the draft shares the model's vocabulary (else -EINVAL and a
 * line naming the mismatch). */
int eng_spec_create(struct eng_ctx *target, const struct eng_spec_config *cfg,
		    struct eng_spec **out, char *err, size_t errlen);
void eng_spec_destroy(struct eng_spec *sp);
/* Feed tokens (the prompt) to the model and the draft; logits of the last. */
int eng_spec_feed(struct eng_spec *sp, const int32_t *ids, size_t n, float *logits);
/* One pass: last (chosen, not yet fed) and the drafts fed; into out
 * (draft_max + 1 room) the tokens that follow last, *n_out >= 1 of them;
 * the last of them is not fed yet.  0, -ENOSPC (context full) or -errno. */
int eng_spec_step(struct eng_spec *sp, struct eng_sampler *s, int32_t last, int32_t *out,
		  uint32_t *n_out);
/* eng_ctx_reset for the model and the draft alike; the text so far is
 * forgotten, what passes cost and how drafts fare is not. */
void eng_spec_reset(struct eng_spec *sp);
/* eng_ctx_shift for the model and the draft alike. */
int eng_spec_shift(struct eng_spec *sp, uint32_t n_keep, uint32_t n_discard);
const struct eng_spec_stats *eng_spec_stats(const struct eng_spec *sp);

/* Text <-> token ids, with the vocabulary of a model (eng_model_tokenizer). */
/* Tokenize len bytes of UTF-8 text (invalid UTF-8 must not crash: it is
 * treated byte by byte).  add_bos prepends BOS when the vocabulary says to
 * (tokenizer.ggml.add_bos_token, default true for "llama", false for "gpt2").
 * Special/control tokens written in the text are NOT parsed as specials.
 * On success *ids is malloc'd (caller frees) and *n set; returns 0 or -errno. */
int eng_tokenize(const struct eng_tokenizer *t, const char *text, size_t len, bool add_bos,
		 int32_t **ids, size_t *n);

/* The same, with special tokens written in the text (<|im_start|>, <s>,
 * <start_of_turn>: control, user-defined and unknown tokens) parsed as
 * those tokens, longest first, as a chat template's output needs. */
int eng_tokenize_special(const struct eng_tokenizer *t, const char *text, size_t len,
			 bool add_bos, int32_t **ids, size_t *n);

/* The bytes token id stands for when printed as output: U+2581 -> ' ',
 * <0xNN> -> that byte, GPT-2 byte-to-unicode mapping undone, control tokens
 * (BOS/EOS...) -> "".  Returns the length (may exceed bufsz: then truncated,
 * like snprintf), or -EINVAL for an id out of range. */
int eng_token_to_piece(const struct eng_tokenizer *t, int32_t id, char *buf, size_t bufsz);

uint32_t eng_tokenizer_n_vocab(const struct eng_tokenizer *t);
int32_t eng_tokenizer_bos(const struct eng_tokenizer *t); /* -1 if none */
int32_t eng_tokenizer_eos(const struct eng_tokenizer *t); /* -1 if none */
/* true for ids that end generation (EOS, EOT, ...) */
bool eng_tokenizer_is_eog(const struct eng_tokenizer *t, int32_t id);
/* Whether eng_tokenize(add_bos=true) actually adds one for this vocab. */
bool eng_tokenizer_adds_bos(const struct eng_tokenizer *t);


/* Online CPUs this process may run on (sched_getaffinity), at least 1. */
unsigned eng_cpu_count(void);

/* How many of g's tensors strata-repack would turn into Q4_0_R16 (repack.h). */
uint64_t eng_n_repackable(const struct gguf *g);

/*
 * Whether that repack pays on this CPU, measured: c's model's Q4_0 layer
 * matrices (the first layers' ones, 64 MiB or more where the model has them,
 * so the reads come from memory as in decoding), times one token on c's
 * kernels and threads, against a Q4_0_R16 copy of them made here and freed
 * before returning; the fastest of a few timings of each, alternated.
 * *gain is the Q4_0 time over the Q4_0_R16 time (above 1: the repacked file
 * decodes faster here).  0, -ENOENT when the model has no such matrix, or
 * -ENOMEM.  It allocates as much as the matrices it times: not for a
 * process that runs under a tight memory limit.
 */
int eng_ctx_repack_gain(struct eng_ctx *c, double *gain);

/* The kernel set this process computes with: "scalar", "avx2", "avx512",
 * "avx512bf16" (STRATA_ISA, else the best this CPU has). */
const char *eng_isa_name(void);

/* Map a file read-only (MAP_SHARED); 0 or -errno. */
int eng_map_file(const char *path, const void **base, size_t *size);
void eng_unmap_file(const void *base, size_t size);

#endif
