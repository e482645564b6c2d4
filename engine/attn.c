/*
 * attn.c - attention over the KV cache: the pass (scores over the keys a
 * query sees, softmax, weighted sum of the values) and the scalar kernels
 * it runs on each cache type; attn_avx2.c has the AVX2 ones.
 *
 * Threading: a token and some query heads of one KV head per work item,
 * shared out over the context's pool; a worker writes only its items'
 * outputs and its own rows of the scratch buffers (att, att16, vrow, vacc,
 * qbuf).  The cache is read-only
 * while the job runs.  A row's keys are in its own context's cache
 * (row_ctx: a multi-sequence pass); the query, output and scratch are the
 * passing context's.
 *
 * Numerics.  An F16 cache is used as the reference engine uses it: the query
 * rounded to f16 for the q.k products (the kernel set's F16 dot), the
 * attention weights rounded to f16 for the weighted sum, whose float
 * products are summed in double; on models whose scores are large this
 * rounding shows in the logits, so keeping it is what keeps strata within
 * tolerance of the reference.  A quantized cache is used as the reference's
 * flash-attention path uses it: the query quantized to Q8_0 and dotted with
 * the key blocks in integers, the weights kept in float and the values
 * summed in float, a block at a time.
 */
#include "model_i.h"

#include <math.h>
#include <string.h>

/* ---- scalar kernels --------------------------------------------------- */

static void score_q8_0(size_t hd, size_t n, float *out, const void *k, size_t stride,
		       const void *q)
{
	const struct eng_block_q8_0 *y = q;

	for (size_t t = 0; t < n; t++) {
		const struct eng_block_q8_0 *x =
			(const struct eng_block_q8_0 *)((const uint8_t *)k + t * stride);
		float sumf = 0.0f;

		for (size_t ib = 0; ib < hd / 32; ib++) {
			int sumi = 0;

			for (int j = 0; j < 32; j++)
				sumi += x[ib].qs[j] * y[ib].qs[j];
			sumf += (float)sumi * (eng_fp16_to_fp32(x[ib].d) * eng_fp16_to_fp32(y[ib].d));
		}
		out[t] = sumf;
	}
}

static void score_q4_0(size_t hd, size_t n, float *out, const void *k, size_t stride,
		       const void *q)
{
	const struct eng_block_q8_0 *y = q;

	for (size_t t = 0; t < n; t++) {
		const struct eng_block_q4_0 *x =
			(const struct eng_block_q4_0 *)((const uint8_t *)k + t * stride);
		float sumf = 0.0f;

		for (size_t ib = 0; ib < hd / 32; ib++) {
			int sumi = 0;

			for (int j = 0; j < 16; j++)
				sumi += ((x[ib].qs[j] & 0x0f) - 8) * y[ib].qs[j] +
					((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + 16];
			sumf += (float)sumi * (eng_fp16_to_fp32(x[ib].d) * eng_fp16_to_fp32(y[ib].d));
		}
		out[t] = sumf;
	}
}

static void accum_f16(size_t hd, size_t n, double *acc, const void *v, size_t stride,
		      const float *w)
{
	for (size_t t = 0; t < n; t++) {
		const eng_fp16_t *x = (const eng_fp16_t *)((const uint8_t *)v + t * stride);

		for (size_t d = 0; d < hd; d++)
			acc[d] += (double)(w[t] * eng_fp16_to_fp32(x[d]));
	}
}

static void accum_q8_0(size_t hd, size_t n, double *acc, const void *v, size_t stride,
		       const float *w)
{
	for (size_t ib = 0; ib < hd / 32; ib++) {
		float f[32] = { 0 };

		for (size_t t = 0; t < n; t++) {
			const struct eng_block_q8_0 *x =
				(const struct eng_block_q8_0 *)((const uint8_t *)v + t * stride) + ib;
			float a = w[t] * eng_fp16_to_fp32(x->d);

			for (int j = 0; j < 32; j++)
				f[j] += a * x->qs[j];
		}
		for (int j = 0; j < 32; j++)
			acc[ib * 32 + j] += f[j];
	}
}

static void accum_q4_0(size_t hd, size_t n, double *acc, const void *v, size_t stride,
		       const float *w)
{
	for (size_t ib = 0; ib < hd / 32; ib++) {
		float f[32] = { 0 };

		for (size_t t = 0; t < n; t++) {
			const struct eng_block_q4_0 *x =
				(const struct eng_block_q4_0 *)((const uint8_t *)v + t * stride) + ib;
			float a = w[t] * eng_fp16_to_fp32(x->d);

			for (int j = 0; j < 16; j++) {
				f[j] += a * ((x->qs[j] & 0x0f) - 8);
				f[j + 16] += a * ((x->qs[j] >> 4) - 8);
			}
		}
		for (int j = 0; j < 32; j++)
			acc[ib * 32 + j] += f[j];
	}
}

static const struct attn_kernels ref = {
	.isa = "scalar",
	.score = { [ENG_KV_Q8_0] = score_q8_0, [ENG_KV_Q4_0] = score_q4_0 },
	.accum = { [ENG_KV_F16] = accum_f16, [ENG_KV_Q8_0] = accum_q8_0,
		   [ENG_KV_Q4_0] = accum_q4_0 },
};

const struct attn_kernels *attn_kernels_ref(void)
{
	return &ref;
}

const struct attn_kernels *attn_kernels_for(const struct eng_kernels *k)
{
	const struct attn_kernels *a = strcmp(k->isa, "scalar") ? attn_kernels_avx2() : NULL;

	return a ? a : &ref;
}

/* ---- the pass --------------------------------------------------------- */

struct attn_job {
	struct eng_ctx *c;
	uint32_t layer, nb;
	uint32_t heads; /* query heads an item takes, of one KV head */
};

/* Bytes from a row's start to head h's first value, for a type whose heads
 * are whole blocks (or F16). */
static size_t head_off(enum eng_kv_type t, uint32_t h, uint32_t hd)
{
	return eng_row_bytes(kv_gguf_type(t), (uint64_t)h * hd);
}

/* Keys a head's kernels take at a time: the group's heads go over the same
 * 64 keys one after the other, so those keys' rows come from memory once
 * and from the L1 cache for the others. */
#define KEY_CHUNK 64

/* A head's scores into its attention weights: soft-capped (cap > 0),
 * scaled, softmax.  With att16, rounded to f16 and back, as the reference's
 * f16 product rounds the weights it multiplies f16 values by: through the
 * kernel set's conversions (F16C where the CPU has it, the same bits as
 * eng_fp32_to_fp16). */
static void softmax(const struct eng_ctx *c, float *att, uint32_t n, float scale, float cap,
		    eng_fp16_t *att16)
{
	float mx = -INFINITY, inv;
	double sum = 0;

	for (uint32_t i = 0; i < n; i++) {
		float s = att[i];

		if (cap > 0)
			s = tanhf(s * (1.0f / cap)) * cap;
		att[i] = s * scale;
		if (att[i] > mx)
			mx = att[i];
	}
	for (uint32_t i = 0; i < n; i++) {
		att[i] = expf(att[i] - mx);
		sum += att[i];
	}
	inv = (float)(1.0 / sum);
	for (uint32_t i = 0; i < n; i++)
		att[i] *= inv;
	if (att16) {
		c->k->from_float[ENG_TYPE_F16](att, att16, n);
		c->k->to_float[ENG_TYPE_F16](att16, att, n);
	}
}

/*
 * One work item: a token and `heads` query heads that share a KV head (a
 * GQA group, or part of one): scores over the cached keys (the last n_swa
 * of them on a sliding-window layer), softmax, weighted sum of the cached
 * values, head by head, but each KEY_CHUNK of keys for all the item's heads
 * before the next, so that a long context's rows are read once per group
 * rather than once per head.  Each head's sums are in key order, as they
 * would be alone.  The keys come as runs of consecutive slots (kv_run): one
 * on a full layer, two where a ring wraps, more around the hole a context
 * shift leaves; the scores are kept in position order, so a ring gives the
 * same sums as a full cache.
 */
static void attn_worker(void *arg, unsigned ith, unsigned nth)
{
	const struct attn_job *j = arg;
	struct eng_ctx *c = j->c;
	const struct eng_hparams *hp = &c->m->hp;
	const struct layer_w *lw = &c->m->layers[j->layer];
	const struct attn_kernels *ak = c->ak;
	enum eng_kv_type tk = c->type_k, tv = c->type_v;
	uint32_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv, G = j->heads;
	float *att0 = c->att + (size_t)ith * G * c->n_ctx;
	eng_fp16_t *att16 = c->att16 + (size_t)ith * c->n_ctx;
	float *vrow = c->vrow + (size_t)ith * hd;
	double *vacc0 = c->vacc + (size_t)ith * G * hd;
	uint8_t *qbuf0 = c->qbuf + (size_t)ith * G * c->qbuf_stride;
	/* a pre-scaled q (gemma, phi3) leaves the scores as they are */
	float scale = c->m->arch->q_prescale ? 1.0f : hp->attn_scale;
	float cap = hp->attn_softcap;
	uint32_t per_token = hp->n_head / G, items = j->nb * per_token;
	eng_vec_dot_fn dot16 = c->k->vec_dot[ENG_TYPE_F16];
	/* heads inside a block (head_dim 8, 16) go through the slice path */
	bool k_slice = tk != ENG_KV_F16 && hd % 32, v_slice = tv != ENG_KV_F16 && hd % 32;

	for (uint32_t it = items * ith / nth; it < items * (ith + 1) / nth; it++) {
		uint32_t b = it / per_token, h0 = it % per_token * G, kvh = h0 / group;
		uint32_t pos = c->row_pos[b];
		const struct kv_layer *kl = &c->row_ctx[b]->kv[lw->slot];
		/* keys t with pos - t < n_swa, as the reference's mask */
		uint32_t t0 = lw->n_swa && pos >= lw->n_swa ? pos + 1 - lw->n_swa : 0;
		const float *q0 = c->q + (size_t)b * c->q_dim + (size_t)h0 * hd;
		size_t koff = k_slice ? 0 : head_off(tk, kvh, hd);
		size_t voff = v_slice ? 0 : head_off(tv, kvh, hd);
		uint32_t n_keys = 0, len, slot, t;

		for (uint32_t g = 0; g < G; g++) {
			uint8_t *qbuf = qbuf0 + (size_t)g * c->qbuf_stride;

			if (tk == ENG_KV_F16)
				c->k->from_float[ENG_TYPE_F16](q0 + (size_t)g * hd, qbuf, hd);
			else if (!k_slice)
				c->k->from_float[ENG_TYPE_Q8_0](q0 + (size_t)g * hd, qbuf, hd);
		}
		for (t = t0; (len = kv_run(kl, &t, pos + 1, &slot)); n_keys += len)
			for (uint32_t i0 = 0; i0 < len; i0 += KEY_CHUNK) {
				uint32_t n = len - i0 < KEY_CHUNK ? len - i0 : KEY_CHUNK;
				const uint8_t *kr = kl->k + ((size_t)slot + i0) * c->k_row + koff;
				float *att = att0 + n_keys + i0; /* head g's at g * n_ctx */

				if (k_slice) {
					/* a key's slice as floats once, for every head */
					for (uint32_t i = 0; i < n; i++) {
						kv_slice_to_float(tk, kr + (size_t)i * c->k_row,
								  (size_t)kvh * hd, hd, vrow);
						for (uint32_t g = 0; g < G; g++) {
							const float *q = q0 + (size_t)g * hd;
							float s = 0.0f;

							for (uint32_t d = 0; d < hd; d++)
								s += q[d] * vrow[d];
							att[(size_t)g * c->n_ctx + i] = s;
						}
					}
					continue;
				}
				for (uint32_t g = 0; g < G; g++) {
					const uint8_t *qbuf = qbuf0 + (size_t)g * c->qbuf_stride;
					float *ag = att + (size_t)g * c->n_ctx;

					if (tk == ENG_KV_F16)
						for (uint32_t i = 0; i < n; i++)
							dot16(hd, &ag[i], kr + (size_t)i * c->k_row, qbuf);
					else
						ak->score[tk](hd, n, ag, kr, c->k_row, qbuf);
				}
			}
		for (uint32_t g = 0; g < G; g++)
			softmax(c, att0 + (size_t)g * c->n_ctx, n_keys, scale, cap,
				tv == ENG_KV_F16 ? att16 : NULL);
		memset(vacc0, 0, (size_t)G * hd * sizeof(double));
		n_keys = 0;
		/* A quantized cache's values are summed in float over a run of
		 * keys, as the reference sums them, then added in double: chunks
		 * would change those sums.  F16 values are added in double one
		 * by one, so chunks of them give the same. */
		for (t = t0; (len = kv_run(kl, &t, pos + 1, &slot)); n_keys += len)
			for (uint32_t i0 = 0, step = tv == ENG_KV_F16 ? KEY_CHUNK : len; i0 < len;
			     i0 += step) {
				uint32_t n = len - i0 < step ? len - i0 : step;
				const uint8_t *vr = kl->v + ((size_t)slot + i0) * c->v_row + voff;
				const float *att = att0 + n_keys + i0; /* head g's at g * n_ctx */

				if (v_slice) {
					/* a value's slice as floats once, for every head */
					for (uint32_t i = 0; i < n; i++) {
						kv_slice_to_float(tv, vr + (size_t)i * c->v_row,
								  (size_t)kvh * hd, hd, vrow);
						for (uint32_t g = 0; g < G; g++) {
							float w = att[(size_t)g * c->n_ctx + i];
							double *vacc = vacc0 + (size_t)g * hd;

							for (uint32_t d = 0; d < hd; d++)
								vacc[d] += (double)(w * vrow[d]);
						}
					}
					continue;
				}
				for (uint32_t g = 0; g < G; g++)
					ak->accum[tv](hd, n, vacc0 + (size_t)g * hd, vr, c->v_row,
						      att + (size_t)g * c->n_ctx);
			}
		for (uint32_t g = 0; g < G; g++) {
			float *out = c->xb2 + (size_t)b * c->q_dim + (size_t)(h0 + g) * hd;

			for (uint32_t d = 0; d < hd; d++)
				out[d] = (float)vacc0[(size_t)g * hd + d];
		}
	}
}

/* Heads an item of attn_worker takes: a whole GQA group, unless that
 * leaves fewer than two items a thread; then the largest divisor of the
 * group that does not (1: a head an item). */
static uint32_t item_heads(const struct eng_ctx *c, uint32_t nb)
{
	const struct eng_hparams *hp = &c->m->hp;
	uint32_t group = hp->n_head / hp->n_head_kv, nth = eng_pool_size(c->pool);

	for (uint32_t g = group; g > 1; g--)
		if (group % g == 0 && (uint64_t)nb * (hp->n_head / g) >= 2 * (uint64_t)nth)
			return g;
	return 1;
}

void attention(struct eng_ctx *c, uint32_t l, uint32_t nb)
{
	struct attn_job j = { c, l, nb, item_heads(c, nb) };

	eng_pool_run(c->pool, attn_worker, &j);
}
