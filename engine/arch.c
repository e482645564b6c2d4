/*
 * arch.c - the architectures strata runs, each as the ways it differs from
 * llama, and the reading of their hyper-parameters from GGUF metadata.
 *
 * Keys and defaults are the reference engine's (llama.cpp): a key it treats
 * as optional gets its default here too, and a rule it hard-codes (gemma3's
 * one global layer in six, whatever sliding_window_pattern says) is
 * hard-coded here as well, because the same file must give the same logits.
 * Everything is read once at load; the result is plain data.
 */
#include "model_i.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int gemma2_hparams(struct eng_model *m, char *err, size_t errlen);
static int gemma3_hparams(struct eng_model *m, char *err, size_t errlen);
static int qwen35_hparams(struct eng_model *m, char *err, size_t errlen);
static int qwen3moe_hparams(struct eng_model *m, char *err, size_t errlen);

/* Per architecture, what is not llama's; plus a hook for keys of its own. */
static const struct arch {
	struct arch_desc d;
	int (*hparams)(struct eng_model *m, char *err, size_t errlen);
} archs[] = {
	{ { .name = "llama", .id = ENG_ARCH_LLAMA, .rope = ENG_ROPE_NORM }, NULL },
	{ { .name = "qwen2", .id = ENG_ARCH_QWEN2, .rope = ENG_ROPE_NEOX, .qkv_bias = true },
	  NULL },
	{ { .name = "qwen3", .id = ENG_ARCH_QWEN3, .rope = ENG_ROPE_NEOX, .qk_norm = true },
	  NULL },
	{ { .name = "gemma2", .id = ENG_ARCH_GEMMA2, .rope = ENG_ROPE_NEOX,
	    .act = ACT_GELU_TANH, .post_norms = true, .embd_scale = true, .q_prescale = true,
	    .softcap = true, .swa_period = 2 },
	  gemma2_hparams },
	{ { .name = "gemma3", .id = ENG_ARCH_GEMMA3, .rope = ENG_ROPE_NEOX,
	    .act = ACT_GELU_TANH, .qk_norm = true, .post_norms = true, .embd_scale = true,
	    .q_prescale = true, .swa_period = 6, .rope_base_local = 10000.0f },
	  gemma3_hparams },
	{ { .name = "phi3", .id = ENG_ARCH_PHI3, .rope = ENG_ROPE_NEOX, .fused_qkv = true,
	    .fused_gate_up = true, .q_prescale = true },
	  NULL },
	/* Its RoPE is the reference's multi-section kind, which for text (every
	 * section at the token's position) is NeoX's over rope.dimension_count. */
	{ { .name = "qwen35", .id = ENG_ARCH_QWEN35, .rope = ENG_ROPE_NEOX, .qk_norm = true,
	    .gated_q = true, .ffn_norm = "post_attention_norm", .hybrid = true },
	  qwen35_hparams },
	/* qwen3's attention; a routed mixture of SwiGLU experts for the FFN */
	{ { .name = "qwen3moe", .id = ENG_ARCH_QWEN3MOE, .rope = ENG_ROPE_NEOX, .qk_norm = true,
	    .moe = true },
	  qwen3moe_hparams },
};

#define N_ARCHS (sizeof(archs) / sizeof(archs[0]))

static int get_u32(const struct gguf *g, const char *arch, const char *suffix, uint32_t *out,
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

static int get_f32(const struct gguf *g, const char *arch, const char *suffix, float *out,
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

/* The gemma 27B models scale q by 1/sqrt(n_embd / n_head) (their
 * query_pre_attn_scalar), the others by 1/sqrt(head_dim); the reference
 * tells them apart by layer count, and so does strata. */
static void gemma_attn_scale(struct eng_hparams *hp, uint32_t n_layer_27b)
{
	if (hp->n_layer == n_layer_27b)
		hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
}

static int gemma2_hparams(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	int rc;

	if ((rc = get_u32(m->g, "gemma2", "attention.sliding_window", &hp->n_swa, false, 4096,
			  err, errlen)) ||
	    (rc = get_f32(m->g, "gemma2", "attn_logit_softcapping", &hp->attn_softcap, 50.0f,
			  err, errlen)) ||
	    (rc = get_f32(m->g, "gemma2", "final_logit_softcapping", &hp->final_softcap, 30.0f,
			  err, errlen)))
		return rc;
	if (hp->attn_softcap < 0 || hp->final_softcap < 0)
		return load_err(err, errlen, "negative logit soft-capping");
	gemma_attn_scale(hp, 46);
	return 0;
}

static int gemma3_hparams(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	int rc;

	/* no window, no sliding layers (the later reference reads it optional) */
	if ((rc = get_u32(m->g, "gemma3", "attention.sliding_window", &hp->n_swa, false, 0, err,
			  errlen)) ||
	    (rc = get_f32(m->g, "gemma3", "final_logit_softcapping", &hp->final_softcap, 0, err,
			  errlen)))
		return rc;
	if (hp->final_softcap < 0)
		return load_err(err, errlen, "negative logit soft-capping");
	if ((rc = get_u32(m->g, "gemma3", "attention.sliding_window_pattern", &hp->swa_period,
			  false, hp->swa_period, err, errlen)) ||
	    (rc = get_f32(m->g, "gemma3", "rope.freq_base_swa", &hp->rope_base_local,
			  hp->rope_base_local, err, errlen)))
		return rc;
	gemma_attn_scale(hp, 62);
	return 0;
}

static int qwen35_hparams(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	const char *a = "qwen35";
	int rc;

	if ((rc = get_u32(m->g, a, "ssm.conv_kernel", &hp->ssm_d_conv, true, 0, err, errlen)) ||
	    (rc = get_u32(m->g, a, "ssm.state_size", &hp->ssm_d_state, true, 0, err, errlen)) ||
	    (rc = get_u32(m->g, a, "ssm.group_count", &hp->ssm_n_k_heads, true, 0, err,
			  errlen)) ||
	    (rc = get_u32(m->g, a, "ssm.time_step_rank", &hp->ssm_n_v_heads, true, 0, err,
			  errlen)) ||
	    (rc = get_u32(m->g, a, "ssm.inner_size", &hp->ssm_d_inner, true, 0, err, errlen)) ||
	    (rc = get_u32(m->g, a, "full_attention_interval", &hp->full_attn_interval, false, 4,
			  err, errlen)))
		return rc;
	/* k and v heads of one size (the reference asserts it), v heads a
	 * multiple of k heads */
	if (hp->ssm_d_conv == 0 || hp->ssm_d_conv > 64 || hp->ssm_d_state == 0 ||
	    hp->ssm_d_state > 1024 || hp->ssm_n_k_heads == 0 || hp->ssm_n_v_heads == 0 ||
	    hp->ssm_n_v_heads > 1024 || hp->ssm_n_v_heads % hp->ssm_n_k_heads ||
	    hp->ssm_d_inner != hp->ssm_n_v_heads * hp->ssm_d_state ||
	    hp->full_attn_interval == 0)
		return load_err(err, errlen,
				"invalid DeltaNet dimensions: conv %u, state %u, k heads %u, v heads "
				"%u, inner %u, full attention every %u",
				hp->ssm_d_conv, hp->ssm_d_state, hp->ssm_n_k_heads,
				hp->ssm_n_v_heads, hp->ssm_d_inner, hp->full_attn_interval);
	return 0;
}

/* The reference's limit on experts (LLAMA_MAX_EXPERTS), and on the used
 * ones a bound the run state is sized by. */
#define MAX_EXPERTS 512
#define MAX_EXPERTS_USED 64

static int qwen3moe_hparams(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	const char *a = "qwen3moe";
	int rc;

	if ((rc = get_u32(m->g, a, "expert_count", &hp->n_expert, true, 0, err, errlen)) ||
	    (rc = get_u32(m->g, a, "expert_used_count", &hp->n_expert_used, true, 0, err,
			  errlen)) ||
	    (rc = get_u32(m->g, a, "expert_feed_forward_length", &hp->n_ff_exp, false, 0, err,
			  errlen)))
		return rc;
	if (hp->n_expert == 0 || hp->n_expert > MAX_EXPERTS || hp->n_expert_used == 0 ||
	    hp->n_expert_used > hp->n_expert || hp->n_expert_used > MAX_EXPERTS_USED)
		return load_err(err, errlen,
				"invalid expert counts: expert_count %u, expert_used_count %u",
				hp->n_expert, hp->n_expert_used);
	/* as the reference: without the key, n_ff split over the used experts */
	if (hp->n_ff_exp == 0)
		hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
	if (hp->n_ff_exp == 0 || hp->n_ff_exp > 1u << 20)
		return load_err(err, errlen, "invalid expert_feed_forward_length %u",
				hp->n_ff_exp);
	return 0;
}

/* RoPE scaling: none, linear (positions divided by the factor), or, for
 * phi3, longrope (per-pair factors from rope_factors_{long,short}, bound by
 * the loader).  The llama3 scheme comes as a rope_freqs tensor. */
static int rope_scaling(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	const char *a = m->arch->name;
	struct gguf_str s;
	char key[128];
	float factor = 0;
	int rc;

	hp->rope_freq_scale = 1.0f;
	snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
	if (!gguf_get_str(m->g, key, &s) && !gguf_str_eq(s, "none")) {
		if (gguf_str_eq(s, "longrope") && m->arch->id == ENG_ARCH_PHI3) {
			hp->rope_longrope = true;
		} else if (!gguf_str_eq(s, "linear")) {
			snprintf(err, errlen, "rope scaling '%.*s' is not supported",
				 (int)(s.len > 32 ? 32 : s.len), s.ptr);
			return -ENOTSUP;
		} else if ((rc = get_f32(m->g, a, "rope.scaling.factor", &factor, 0, err,
					 errlen))) {
			return rc;
		}
	} else if ((rc = get_f32(m->g, a, "rope.scale_linear", &factor, 0, err, errlen))) {
		/* older files carry only rope.scale_linear */
		return rc;
	}
	if (factor < 0 || (factor > 0 && factor < 1e-3f))
		return load_err(err, errlen, "invalid rope scaling factor %g", (double)factor);
	if (factor > 0)
		hp->rope_freq_scale = 1.0f / factor;
	if ((rc = get_f32(m->g, a, "rope.scaling.attn_factor", &hp->rope_attn_factor, 1.0f, err,
			  errlen)) ||
	    (rc = get_u32(m->g, a, "rope.scaling.original_context_length", &hp->n_ctx_orig, false,
			  hp->n_ctx_train, err, errlen)))
		return rc;
	if (!(hp->rope_attn_factor > 0))
		return load_err(err, errlen, "invalid rope attention factor %g",
				(double)hp->rope_attn_factor);
	return 0;
}

int arch_load_hparams(struct eng_model *m, char *err, size_t errlen)
{
	struct eng_hparams *hp = &m->hp;
	const struct gguf *g = m->g;
	const struct arch *arch = NULL;
	struct gguf_str s;
	const char *a;
	uint32_t key_len = 0;
	int rc;

	if (gguf_get_str(g, "general.architecture", &s))
		return load_err(err, errlen, "missing metadata 'general.architecture'");
	for (size_t i = 0; i < N_ARCHS && !arch; i++)
		if (gguf_str_eq(s, archs[i].d.name))
			arch = &archs[i];
	if (!arch) {
		snprintf(err, errlen,
			 "architecture '%.*s' is not supported (llama, qwen2, qwen3, gemma2, "
			 "gemma3, phi3, qwen35, qwen3moe are)",
			 (int)(s.len > 64 ? 64 : s.len), s.ptr);
		return -ENOTSUP;
	}
	m->arch = &arch->d;
	hp->arch = arch->d.id;
	hp->arch_name = a = arch->d.name;
	hp->rope_kind = arch->d.rope;
	if (!gguf_get_str(g, "general.name", &s))
		snprintf(hp->name, sizeof(hp->name), "%.*s", (int)(s.len > 120 ? 120 : s.len), s.ptr);

	if ((rc = get_u32(g, a, "embedding_length", &hp->n_embd, true, 0, err, errlen)) ||
	    (rc = get_u32(g, a, "block_count", &hp->n_layer, true, 0, err, errlen)) ||
	    (rc = get_u32(g, a, "feed_forward_length", &hp->n_ff, true, 0, err, errlen)) ||
	    (rc = get_u32(g, a, "attention.head_count", &hp->n_head, true, 0, err, errlen)) ||
	    (rc = get_u32(g, a, "context_length", &hp->n_ctx_train, false, MAX_CTX_DEFAULT, err,
			  errlen)) ||
	    (rc = get_u32(g, a, "attention.key_length", &key_len, false, 0, err, errlen)))
		return rc;
	if (hp->n_embd == 0 || hp->n_embd > 65536 || hp->n_layer == 0 || hp->n_layer > 1024 ||
	    hp->n_ff == 0 || hp->n_ff > 1u << 20 || hp->n_head == 0 || hp->n_head > hp->n_embd)
		return load_err(err, errlen,
				"implausible dimensions: n_embd %u, n_layer %u, n_ff %u, n_head %u",
				hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head);
	if ((rc = get_u32(g, a, "attention.head_count_kv", &hp->n_head_kv, false, hp->n_head, err,
			  errlen)))
		return rc;
	if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv)
		return load_err(err, errlen, "head_count_kv %u does not divide head_count %u",
				hp->n_head_kv, hp->n_head);
	/* qwen3 and gemma give the head size apart from n_embd / n_head */
	hp->head_dim = key_len ? key_len : hp->n_embd / hp->n_head;
	if (hp->head_dim == 0 || hp->head_dim % 2 || hp->head_dim > 1024 ||
	    (!key_len && hp->n_embd % hp->n_head))
		return load_err(err, errlen, "invalid head size %u", hp->head_dim);
	if ((rc = get_u32(g, a, "rope.dimension_count", &hp->n_rot, false, hp->head_dim, err,
			  errlen)))
		return rc;
	if (hp->n_rot == 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
		return load_err(err, errlen, "rope.dimension_count %u is invalid for head size %u",
				hp->n_rot, hp->head_dim);
	if ((rc = get_f32(g, a, "rope.freq_base", &hp->rope_base, 10000.0f, err, errlen)) ||
	    (rc = get_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->norm_eps, 1e-5f, err,
			  errlen)))
		return rc;
	if (hp->rope_base <= 0 || hp->norm_eps < 0)
		return load_err(err, errlen, "invalid rope base %g or norm epsilon %g",
				(double)hp->rope_base, (double)hp->norm_eps);
	hp->rope_base_local = arch->d.rope_base_local > 0 ? arch->d.rope_base_local
							  : hp->rope_base;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	hp->swa_period = arch->d.swa_period;
	if ((rc = rope_scaling(m, err, errlen)))
		return rc;
	if (arch->hparams && (rc = arch->hparams(m, err, errlen)))
		return rc;
	return 0;
}
