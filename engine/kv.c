/*
 * kv.c - the KV cache: its types and layout (attn_i.h tells the layout),
 * writing a token's key and value into it, walking the keys a query sees,
 * and the context shift.
 *
 * Everything here runs on the caller's thread, between forward passes or
 * before a layer's attention job starts; the attention workers (attn.c) only
 * read the cache.  The context owns the cache (forward.c allocates it with
 * the other buffers).
 */
#include "model_i.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kv_names[ENG_KV_COUNT] = {
	[ENG_KV_F16] = "f16",
	[ENG_KV_Q8_0] = "q8_0",
	[ENG_KV_Q4_0] = "q4_0",
};

const char *eng_kv_type_name(enum eng_kv_type t)
{
	return (unsigned)t < ENG_KV_COUNT ? kv_names[t] : "?";
}

int eng_kv_type_parse(const char *s, enum eng_kv_type *out)
{
	for (unsigned t = 0; t < ENG_KV_COUNT; t++)
		if (!strcmp(s, kv_names[t])) {
			*out = (enum eng_kv_type)t;
			return 0;
		}
	return -EINVAL;
}

uint32_t kv_gguf_type(enum eng_kv_type t)
{
	switch (t) {
	case ENG_KV_Q8_0:
		return ENG_TYPE_Q8_0;
	case ENG_KV_Q4_0:
		return ENG_TYPE_Q4_0;
	default:
		return ENG_TYPE_F16;
	}
}

int kv_check(const struct eng_model *m, enum eng_kv_type tk, enum eng_kv_type tv, char *err,
	     size_t errlen)
{
	const struct eng_hparams *hp = &m->hp;
	uint32_t hd = hp->head_dim, row = hp->n_head_kv * hd;
	enum eng_kv_type ts[2] = { tk, tv };

	for (int i = 0; i < 2; i++) {
		if ((unsigned)ts[i] >= ENG_KV_COUNT) {
			snprintf(err, errlen, "unknown KV cache type %d", (int)ts[i]);
			return -EINVAL;
		}
		/* a head is whole blocks, or a block holds whole heads */
		if (ts[i] != ENG_KV_F16 && (row % 32 || (hd % 32 && 32 % hd))) {
			snprintf(err, errlen,
				 "a %s %s cache needs rows of a multiple of 32 values and heads of "
				 "a multiple or divisor of 32 (this model: rows of %u, heads of %u)",
				 kv_names[ts[i]], i ? "V" : "K", row, hd);
			return -EINVAL;
		}
	}
	return 0;
}

uint32_t kv_slots(const struct eng_model *m, uint32_t l, uint32_t n_ctx, uint32_t n_batch)
{
	uint32_t w = m->layers[l].n_swa;

	if (w && (uint64_t)w + n_batch - 1 < n_ctx)
		return w + n_batch - 1;
	return n_ctx;
}

/* One row of kv_dim floats into cache type t. */
static void quant_row(const struct eng_ctx *c, enum eng_kv_type t, const float *src, void *dst)
{
	switch (t) {
	case ENG_KV_Q8_0:
		c->k->from_float[ENG_TYPE_Q8_0](src, dst, c->kv_dim);
		break;
	case ENG_KV_Q4_0:
		kv_q4_0_from_float(src, dst, c->kv_dim);
		break;
	default: /* the kernel set's conversion (F16C): the same bits as eng_fp32_to_fp16 */
		c->k->from_float[ENG_TYPE_F16](src, dst, c->kv_dim);
	}
}

void kv_store(struct eng_ctx *c, uint32_t s, uint32_t pos, const float *k, const float *v)
{
	struct kv_layer *kl = &c->kv[s];
	uint32_t slot = pos % kl->n_slots;

	quant_row(c, c->type_k, k, kl->k + (size_t)slot * c->k_row);
	quant_row(c, c->type_v, v, kl->v + (size_t)slot * c->v_row);
	if (kl->tag)
		kl->tag[slot] = pos + 1;
}

uint32_t kv_run(const struct kv_layer *kl, uint32_t *t, uint32_t end, uint32_t *slot)
{
	uint32_t p = *t, n;

	if (!kl->tag) { /* slot = position, and every position is there */
		*slot = p;
		*t = end;
		return end > p ? end - p : 0;
	}
	while (p < end && kl->tag[p % kl->n_slots] != p + 1)
		p++;
	*slot = p % kl->n_slots;
	for (n = 0; p + n < end && *slot + n < kl->n_slots && kl->tag[*slot + n] == p + n + 1; n++)
		;
	*t = p + n;
	return n;
}

void kv_slice_to_float(enum eng_kv_type t, const uint8_t *row, size_t off, size_t n,
		       float *dst)
{
	for (size_t i = 0; i < n; i++) {
		size_t e = off + i, j = e % 32;

		if (t == ENG_KV_Q8_0) {
			const struct eng_block_q8_0 *b = (const struct eng_block_q8_0 *)row + e / 32;

			dst[i] = b->qs[j] * eng_fp16_to_fp32(b->d);
		} else if (t == ENG_KV_Q4_0) {
			const struct eng_block_q4_0 *b = (const struct eng_block_q4_0 *)row + e / 32;
			int q = j < 16 ? (b->qs[j] & 0x0f) : (b->qs[j - 16] >> 4);

			dst[i] = (q - 8) * eng_fp16_to_fp32(b->d);
		} else {
			dst[i] = eng_fp16_to_fp32(((const eng_fp16_t *)row)[e]);
		}
	}
}

/*
 * Q4_0 as ggml quantizes it: the value of largest magnitude, sign kept, is
 * -8 d; each value becomes trunc(x / d + 8.5) clamped to 15.  Written for
 * any input: NaN becomes the middle code rather than undefined behaviour.
 */
void kv_q4_0_from_float(const float *src, void *dst, size_t n)
{
	struct eng_block_q4_0 *y = dst;

	for (size_t i = 0; i < n / ENG_QK4_0; i++) {
		const float *x = src + i * ENG_QK4_0;
		float amax = 0.0f, max = 0.0f;

		for (int j = 0; j < ENG_QK4_0; j++)
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		const float d = max / -8.0f;
		const float id = d != 0.0f ? 1.0f / d : 0.0f;

		y[i].d = eng_fp32_to_fp16(d);
		for (int j = 0; j < ENG_QK4_0 / 2; j++) {
			float a = x[j] * id + 8.5f, b = x[j + ENG_QK4_0 / 2] * id + 8.5f;

			a = a >= 0.0f ? (a < 15.0f ? a : 15.0f) : (a < 0.0f ? 0.0f : 8.0f);
			b = b >= 0.0f ? (b < 15.0f ? b : 15.0f) : (b < 0.0f ? 0.0f : 8.0f);
			y[i].qs[j] = (uint8_t)((uint8_t)a | (uint8_t)b << 4);
		}
	}
}

void kv_clear(struct eng_ctx *c)
{
	for (uint32_t s = 0; s < c->m->n_kv_layers; s++)
		if (c->kv[s].tag)
			memset(c->kv[s].tag, 0, (size_t)c->kv[s].n_slots * sizeof(uint32_t));
}

/* ---- context shift ---------------------------------------------------- */

/* The key row at src, of a token that moves back by delta positions, into
 * dst (which may be src): to float, rotated by -delta, quantized again. */
static void rerotate(struct eng_ctx *c, const struct layer_w *lw, const uint8_t *src,
		     uint8_t *dst, uint32_t delta)
{
	const struct eng_hparams *hp = &c->m->hp;
	float *row = c->kb;

	c->k->to_float[kv_gguf_type(c->type_k)](src, row, c->kv_dim);
	rope_heads(c, row, hp->n_head_kv, -(float)delta, c->theta[lw->local_rope],
		   lw->local_rope ? 1.0f : hp->rope_freq_scale, 1.0f);
	quant_row(c, c->type_k, row, dst);
}

/* A ring: every live slot to the slot of its new position; k, v, tag
 * hold a copy of the ring. */
static void shift_ring(struct eng_ctx *c, const struct layer_w *lw, struct kv_layer *kl,
		       uint32_t n_keep, uint32_t n_discard, uint8_t *k, uint8_t *v, uint32_t *tag)
{
	size_t R = kl->n_slots;

	memcpy(k, kl->k, R * c->k_row);
	memcpy(v, kl->v, R * c->v_row);
	memcpy(tag, kl->tag, R * sizeof(uint32_t));
	memset(kl->tag, 0, R * sizeof(uint32_t));
	for (size_t s = 0; s < R; s++) {
		uint32_t p, np, ns;

		if (!tag[s])
			continue;
		p = tag[s] - 1;
		if (p >= n_keep && p < n_keep + n_discard)
			continue;
		np = p < n_keep ? p : p - n_discard;
		ns = np % (uint32_t)R;
		if (np == p)
			memcpy(kl->k + ns * c->k_row, k + s * c->k_row, c->k_row);
		else
			rerotate(c, lw, k + s * c->k_row, kl->k + ns * c->k_row, n_discard);
		memcpy(kl->v + ns * c->v_row, v + s * c->v_row, c->v_row);
		kl->tag[ns] = np + 1;
	}
}

int eng_ctx_shift(struct eng_ctx *c, uint32_t n_keep, uint32_t n_discard)
{
	const struct eng_model *m = c->m;

	if (m->n_rs_layers)
		return -ENOTSUP;
	if (n_keep > c->n_past || n_discard > c->n_past - n_keep)
		return -EINVAL;
	if (!n_discard)
		return 0;
	/* the rings' copies first: nothing has moved if they cannot be had */
	size_t R = 0;
	uint8_t *k = NULL, *v = NULL;
	uint32_t *tag = NULL;

	for (uint32_t s = 0; s < m->n_kv_layers; s++)
		if (c->kv[s].tag && c->kv[s].n_slots > R)
			R = c->kv[s].n_slots;
	if (R) {
		k = malloc(R * c->k_row);
		v = malloc(R * c->v_row);
		tag = malloc(R * sizeof(uint32_t));
		if (!k || !v || !tag) {
			free(k);
			free(v);
			free(tag);
			return -ENOMEM;
		}
	}
	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct layer_w *lw = &m->layers[l];
		struct kv_layer *kl = &c->kv[lw->slot];

		if (lw->recurrent)
			continue;
		if (kl->tag) {
			shift_ring(c, lw, kl, n_keep, n_discard, k, v, tag);
			continue;
		}
		/* slot = position: the rows after the gap move down, in order */
		for (uint32_t p = n_keep + n_discard; p < c->n_past; p++) {
			uint32_t np = p - n_discard;

			rerotate(c, lw, kl->k + (size_t)p * c->k_row, kl->k + (size_t)np * c->k_row,
				 n_discard);
			memcpy(kl->v + (size_t)np * c->v_row, kl->v + (size_t)p * c->v_row,
			       c->v_row);
		}
	}
	free(k);
	free(v);
	free(tag);
	c->n_past -= n_discard;
	c->undo_ok = false; /* the positions moved */
	return 0;
}
