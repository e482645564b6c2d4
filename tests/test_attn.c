/*
 * test_attn.c - the KV cache and the attention kernels that read it.
 *
 *   kernels:  every set this CPU runs (scalar, AVX2) against a double-
 *             precision sum over the dequantized rows: Q8_0 and Q4_0 scores
 *             within float rounding, weighted sums of F16, Q8_0 and Q4_0
 *             values likewise; the AVX2 F16 sum bit-identical to the scalar.
 *   sizes:    eng_ctx_size agrees with what eng_ctx_create allocates; a q8_0
 *             cache is 34/64 of f16, q4_0 18/64; a sliding-window layer
 *             holds window + batch - 1 rows, not the context.
 *   shift:    after eng_ctx_shift the first layer's cache is what a fresh
 *             context fed the kept tokens and the rest at their new
 *             positions holds (keys within the rounding of rotating a
 *             rounded key); bad arguments are refused; a hybrid model
 *             refuses with -ENOTSUP.
 *
 * usage: test_attn (fixtures from $STRATA_FIXTURES, default ../shared/fixtures)
 */
#include "fixture.h"
#include "model_i.h" /* the cache itself, to look at after a shift */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;

static float frand(void) /* uniform in [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}

/* ---- kernels ---------------------------------------------------------- */

#define NKEYS 37
#define HEADS 3 /* a row holds three heads: the kernels must keep to theirs */

static void test_kernels(const struct attn_kernels *ak)
{
	const struct eng_kernels *ref = eng_kernels_ref();
	static const size_t hds[] = { 32, 64, 128, 256 };

	for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++) {
		size_t hd = hds[hi], row = HEADS * hd;
		float *kf = malloc(NKEYS * row * sizeof(float)), *q = malloc(hd * sizeof(float));
		float *deq = malloc(row * sizeof(float)), *qd = malloc(hd * sizeof(float));
		float w[NKEYS], out[NKEYS];
		uint8_t *cache = malloc(NKEYS * row * 2), *q8 = malloc(hd * 2);
		double *acc = malloc(hd * sizeof(double)), *acc2 = malloc(hd * sizeof(double));

		for (size_t i = 0; i < NKEYS * row; i++)
			kf[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f); /* some outliers */
		for (size_t i = 0; i < hd; i++)
			q[i] = frand();
		for (int t = 0; t < NKEYS; t++)
			w[t] = (frand() + 1.0f) / NKEYS;
		ref->from_float[ENG_TYPE_Q8_0](q, q8, hd);
		ref->to_float[ENG_TYPE_Q8_0](q8, qd, hd);

		for (int ty = 0; ty < ENG_KV_COUNT; ty++) {
			uint32_t gt = kv_gguf_type((enum eng_kv_type)ty);
			size_t rb = eng_row_bytes(gt, row), hoff = eng_row_bytes(gt, hd); /* head 1 */

			for (int t = 0; t < NKEYS; t++) {
				if (ty == ENG_KV_Q4_0)
					kv_q4_0_from_float(kf + t * row, cache + t * rb, row);
				else
					ref->from_float[gt](kf + t * row, cache + t * rb, row);
			}
			/* scores of head 1 against the double sum of the dequantized values */
			if (ak->score[ty]) {
				ak->score[ty](hd, NKEYS, out, cache + hoff, rb, q8);
				for (int t = 0; t < NKEYS; t++) {
					double s = 0, mag = 0;

					ref->to_float[gt](cache + t * rb, deq, row);
					for (size_t d = 0; d < hd; d++) {
						s += (double)qd[d] * deq[hd + d];
						mag += fabs((double)qd[d] * deq[hd + d]);
					}
					CHECK(fabs(out[t] - s) <= 1e-5 * mag + 1e-7,
					      "%s score %s hd %zu key %d: %.7g, want %.7g", ak->isa,
					      eng_kv_type_name(ty), hd, t, out[t], s);
				}
			}
			/* the weighted sum of head 1's values, added to what acc held */
			for (size_t d = 0; d < hd; d++)
				acc[d] = acc2[d] = d * 0.25;
			ak->accum[ty](hd, NKEYS, acc, cache + hoff, rb, w);
			for (int t = 0; t < NKEYS; t++) {
				ref->to_float[gt](cache + t * rb, deq, row);
				for (size_t d = 0; d < hd; d++)
					acc2[d] += (double)w[t] * deq[hd + d];
			}
			for (size_t d = 0; d < hd; d++)
				CHECK(fabs(acc[d] - acc2[d]) <= 1e-5 * (1 + fabs(acc2[d])),
				      "%s accum %s hd %zu dim %zu: %.7g, want %.7g", ak->isa,
				      eng_kv_type_name(ty), hd, d, acc[d], acc2[d]);
			/* F16: bit for bit the scalar set's (the reference's order) */
			if (ty == ENG_KV_F16) {
				for (size_t d = 0; d < hd; d++)
					acc[d] = acc2[d] = 0;
				ak->accum[ty](hd, NKEYS, acc, cache + hoff, rb, w);
				attn_kernels_ref()->accum[ty](hd, NKEYS, acc2, cache + hoff, rb, w);
				CHECK(!memcmp(acc, acc2, hd * sizeof(double)),
				      "%s accum f16 hd %zu differs from the scalar kernel", ak->isa, hd);
			}
		}
		free(kf);
		free(q);
		free(deq);
		free(qd);
		free(cache);
		free(q8);
		free(acc);
		free(acc2);
	}
}

/* Q4_0 as ggml: the largest magnitude is -8 d exactly, the rest within d/2. */
static void test_q4_0_quant(void)
{
	float x[64], y[64];
	uint8_t b[2 * 18];

	for (int i = 0; i < 64; i++)
		x[i] = frand();
	x[5] = -3.0f;
	x[40] = 2.5f;
	kv_q4_0_from_float(x, b, 64);
	eng_kernels_ref()->to_float[ENG_TYPE_Q4_0](b, y, 64);
	for (int blk = 0; blk < 2; blk++) {
		float d = fabsf(blk ? 2.5f : 3.0f) / 8.0f;

		for (int i = 32 * blk; i < 32 * blk + 32; i++)
			CHECK(fabsf(x[i] - y[i]) <= d * 0.5f + 1e-3f, "q4_0 value %d: %g -> %g", i,
			      x[i], y[i]);
	}
	CHECK(y[5] == -3.0f, "q4_0: the largest magnitude -3 came back as %g", y[5]);
}

/* ---- models ----------------------------------------------------------- */

static void test_sizes(void)
{
	struct fixture mo;
	char err[256];

	if (fixture_open("models/tiny-llama-f16.gguf", &mo) == 1) {
		const struct eng_hparams *hp = eng_model_hparams(mo.m);
		uint64_t f16 = 0;

		for (int ty = 0; ty < ENG_KV_COUNT; ty++) {
			struct eng_ctx_config cfg = { .n_ctx = 128, .type_k = ty, .type_v = ty };
			struct eng_ctx_size sz;
			struct eng_ctx *c;

			CHECK(!eng_ctx_size(mo.m, &cfg, &sz, err, sizeof(err)), "size: %s", err);
			CHECK(!eng_ctx_create(mo.m, &cfg, &c, err, sizeof(err)), "create: %s", err);
			CHECK(sz.kv_bytes == eng_ctx_kv_bytes(c) && sz.total_bytes == eng_ctx_bytes(c),
			      "eng_ctx_size says %llu/%llu, the context has %llu/%llu",
			      (unsigned long long)sz.kv_bytes, (unsigned long long)sz.total_bytes,
			      (unsigned long long)eng_ctx_kv_bytes(c),
			      (unsigned long long)eng_ctx_bytes(c));
			if (ty == ENG_KV_F16) {
				f16 = sz.kv_bytes;
				CHECK(f16 == 2ull * 2 * hp->n_layer * 128 * hp->n_head_kv * hp->head_dim,
				      "f16 cache of %llu bytes", (unsigned long long)f16);
			} else {
				uint64_t per32 = ty == ENG_KV_Q8_0 ? 34 : 18;

				CHECK(sz.kv_bytes * 64 == f16 * per32, "%s cache %llu bytes, f16 %llu",
				      eng_kv_type_name(ty), (unsigned long long)sz.kv_bytes,
				      (unsigned long long)f16);
			}
			eng_ctx_destroy(c);
		}
		fixture_close(&mo);
	}
	/* gemma2: every other layer slides over 8 tokens */
	if (fixture_open("arch/models/tiny-gemma2-q4_k_m.gguf", &mo) == 1) {
		const struct eng_hparams *hp = eng_model_hparams(mo.m);
		struct eng_ctx_config cfg = { .n_ctx = 256, .n_batch = 4 };
		struct eng_ctx_size sz;
		uint64_t row = 2ull * 2 * hp->n_head_kv * hp->head_dim;
		uint64_t n_local = hp->n_layer / 2, n_global = hp->n_layer - n_local;
		/* a ring also keeps the position of each row */
		uint64_t want = n_global * 256 * row + n_local * (hp->n_swa + 3) * (row + 4);

		CHECK(hp->n_swa == 8, "tiny-gemma2 has a window of %u", hp->n_swa);
		CHECK(!eng_ctx_size(mo.m, &cfg, &sz, err, sizeof(err)), "size: %s", err);
		CHECK(sz.kv_bytes == want, "gemma2 cache %llu bytes, want %llu (rings of %u)",
		      (unsigned long long)sz.kv_bytes, (unsigned long long)want, hp->n_swa + 3);
		fixture_close(&mo);
	}
}

/*
 * Fill 40 of 64 positions, shift out the 19 after the first.  Layer 0's keys
 * and values depend only on the token and its position, so its cache must
 * now hold what a fresh context fed token 0 and tokens 20..39 holds: values
 * byte for byte, keys within the rounding of rotating a rounded key (f16:
 * 2^-10 of the row's largest value; q8_0: two steps of its scale).
 */
static void test_shift(enum eng_kv_type ty, double tol)
{
	struct fixture mo;
	struct eng_ctx *c = NULL, *f = NULL;
	struct eng_ctx_config cfg = { .n_ctx = 64, .type_k = ty, .type_v = ty };
	int32_t toks[41], fresh[21];
	char err[256];

	if (fixture_open("models/stories260K.gguf", &mo) != 1)
		return;
	for (int i = 0; i < 41; i++)
		toks[i] = i == 0 ? 1 : 200 + (i * 37) % 300;
	if (eng_ctx_create(mo.m, &cfg, &c, err, sizeof(err)) ||
	    eng_ctx_create(mo.m, &cfg, &f, err, sizeof(err))) {
		CHECK(0, "create: %s", err);
		goto out;
	}
	CHECK(eng_decode(c, toks, 40, NULL, false) == 0, "decode 40");
	CHECK(eng_ctx_shift(c, 30, 11) == -EINVAL, "a shift past n_past was not refused");
	CHECK(eng_ctx_shift(c, 41, 0) == -EINVAL, "a keep past n_past was not refused");
	CHECK(eng_ctx_shift(c, 1, 19) == 0, "shift");
	CHECK(eng_ctx_n_past(c) == 21, "n_past %u after the shift, want 21", eng_ctx_n_past(c));
	fresh[0] = toks[0];
	for (int i = 20; i < 40; i++)
		fresh[i - 19] = toks[i];
	CHECK(eng_decode(f, fresh, 21, NULL, false) == 0, "fresh decode");

	const struct kv_layer *a = &c->kv[0], *b = &f->kv[0];
	uint32_t gt = kv_gguf_type(ty);
	float ka[64], kb[64], worst = 0;

	CHECK(c->kv_dim <= 64, "kv_dim %u", c->kv_dim);
	CHECK(!memcmp(a->v, b->v, 21 * c->v_row), "layer 0's values moved wrongly");
	for (int p = 0; p < 21; p++) {
		float mx = 0, d = 0;

		eng_kernels_ref()->to_float[gt](a->k + p * c->k_row, ka, c->kv_dim);
		eng_kernels_ref()->to_float[gt](b->k + p * c->k_row, kb, c->kv_dim);
		for (uint32_t i = 0; i < c->kv_dim; i++) {
			mx = fabsf(kb[i]) > mx ? fabsf(kb[i]) : mx;
			d = fabsf(ka[i] - kb[i]) > d ? fabsf(ka[i] - kb[i]) : d;
		}
		if (d / mx > worst)
			worst = d / mx;
	}
	printf("shift %s: layer 0 keys within %.5f of the row maximum of a fresh context's "
	       "(limit %.4f)\n", eng_kv_type_name(ty), worst, tol);
	CHECK(worst <= tol, "shift %s: keys %.5f off", eng_kv_type_name(ty), worst);
	/* and the context goes on */
	float *lg = malloc(eng_model_hparams(mo.m)->n_vocab * sizeof(float));
	CHECK(eng_decode(c, &toks[40], 1, lg, false) == 0 && isfinite(lg[0]),
	      "decode after the shift");
	free(lg);
out:
	eng_ctx_destroy(c);
	eng_ctx_destroy(f);
	fixture_close(&mo);
}

/* Recurrent layers cannot forget: -ENOTSUP, and the context is untouched. */
static void test_shift_hybrid(void)
{
	struct fixture mo;
	struct eng_ctx *c;
	int32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	char err[256];

	if (fixture_open("arch/models/tiny-qwen35-q4_k_m.gguf", &mo) != 1)
		return;
	if (eng_ctx_create(mo.m, &(struct eng_ctx_config){ .n_ctx = 16 }, &c, err, sizeof(err))) {
		CHECK(0, "create: %s", err);
	} else {
		CHECK(eng_decode(c, toks, 8, NULL, false) == 0, "decode");
		CHECK(eng_ctx_shift(c, 1, 3) == -ENOTSUP, "qwen35 shift not refused");
		CHECK(eng_ctx_n_past(c) == 8, "n_past %u after a refused shift", eng_ctx_n_past(c));
		eng_ctx_destroy(c);
	}
	fixture_close(&mo);
}

/*
 * A work item takes a GQA group's heads, or fewer where the pass has too few
 * items for its threads (attn.c, item_heads), and goes over the keys 64 at a
 * time for all of them.  tiny-llama's 8 heads on 2 KV heads: a token at a
 * time, 1 thread takes 4 heads an item, 2 threads 2, 3 threads 1; a whole
 * batch, 4.  Over 150 tokens (keys in three chunks and a part), every way
 * must give the same logits, bit for bit, for each cache type.
 */
static void test_groups(enum eng_kv_type ty)
{
	enum { N = 150 };
	static const struct { uint32_t threads, batch; } runs[] = { { 1, 1 }, { 2, 1 }, { 3, 1 },
								   { 2, N } };
	struct fixture mo;
	int32_t toks[N];
	float *want = NULL, *got = NULL;
	size_t nv;
	char err[256];

	if (fixture_open("models/tiny-llama-q4_0.gguf", &mo) != 1)
		return;
	nv = eng_model_hparams(mo.m)->n_vocab;
	want = malloc(nv * sizeof(float));
	got = malloc(nv * sizeof(float));
	for (int i = 0; i < N; i++)
		toks[i] = i == 0 ? 1 : 100 + (i * 37) % 200;
	for (size_t r = 0; r < sizeof(runs) / sizeof(runs[0]); r++) {
		struct eng_ctx_config cfg = { .n_ctx = 256, .n_threads = runs[r].threads,
					      .n_batch = runs[r].batch, .type_k = ty, .type_v = ty };
		struct eng_ctx *c;
		int rc = 0;

		if (eng_ctx_create(mo.m, &cfg, &c, err, sizeof(err))) {
			CHECK(0, "create: %s", err);
			break;
		}
		for (int i = 0; i < N && !rc; i += runs[r].batch)
			rc = eng_decode(c, toks + i, runs[r].batch, r ? got : want, false);
		CHECK(rc == 0, "decode");
		CHECK(r == 0 || !memcmp(want, got, nv * sizeof(float)),
		      "%s cache: %u threads, batch %u: the last token's logits differ from "
		      "1 thread's, a token at a time", eng_kv_type_name(ty), runs[r].threads,
		      runs[r].batch);
		eng_ctx_destroy(c);
	}
	free(want);
	free(got);
	fixture_close(&mo);
}

/*
 * The pass itself against attention written out plainly: 150 positions of
 * tiny-llama in an f16 cache (its 8 heads on 2 KV heads: groups of 4, the
 * keys in chunks of 64 and a part), a random query at the last position,
 * layer 0's attention(); each head's output against scores of the query
 * rounded to f16, a softmax in double, weights rounded to f16 and double
 * sums of the values.  Within 1e-5 of the largest value (the pass's scores
 * are its F16 dot kernel's, summed in another order).
 */
static void test_pass(uint32_t threads)
{
	enum { N = 150 };
	struct fixture mo;
	struct eng_ctx_config cfg = { .n_ctx = 256, .n_threads = threads };
	struct eng_ctx *c = NULL;
	int32_t toks[N];
	char err[256];

	if (fixture_open("models/tiny-llama-q4_0.gguf", &mo) != 1)
		return;
	for (int i = 0; i < N; i++)
		toks[i] = i == 0 ? 1 : 100 + (i * 53) % 200;
	if (eng_ctx_create(mo.m, &cfg, &c, err, sizeof(err))) {
		CHECK(0, "create: %s", err);
		goto out;
	}
	CHECK(eng_decode(c, toks, N, NULL, false) == 0, "decode %d", N);

	const struct eng_hparams *hp = &c->m->hp;
	const struct kv_layer *kl = &c->kv[c->m->layers[0].slot];
	uint32_t hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
	double worst = 0, vmax = 0;

	CHECK(group > 1 && hd % 32 == 0, "tiny-llama: %u heads a KV head, head_dim %u", group, hd);
	for (uint32_t i = 0; i < c->q_dim; i++)
		c->q[i] = frand();
	c->row_ctx[0] = c;
	c->row_pos[0] = N - 1;
	attention(c, 0, 1);
	for (uint32_t h = 0; h < hp->n_head; h++) {
		const uint8_t *koff = kl->k + (size_t)(h / group) * hd * 2;
		const uint8_t *voff = kl->v + (size_t)(h / group) * hd * 2;
		double sc[N], mx = -INFINITY, sum = 0, out[256] = { 0 };

		for (int t = 0; t < N; t++) {
			const eng_fp16_t *k = (const eng_fp16_t *)(koff + (size_t)t * c->k_row);

			sc[t] = 0;
			for (uint32_t d = 0; d < hd; d++)
				sc[t] += (double)eng_fp16_to_fp32(k[d]) *
					 eng_fp16_to_fp32(eng_fp32_to_fp16(c->q[h * hd + d]));
			sc[t] *= hp->attn_scale;
			mx = sc[t] > mx ? sc[t] : mx;
		}
		for (int t = 0; t < N; t++)
			sum += sc[t] = exp(sc[t] - mx);
		for (int t = 0; t < N; t++) {
			const eng_fp16_t *v = (const eng_fp16_t *)(voff + (size_t)t * c->v_row);
			float w = eng_fp16_to_fp32(eng_fp32_to_fp16((float)(sc[t] / sum)));

			for (uint32_t d = 0; d < hd; d++) {
				out[d] += (double)w * eng_fp16_to_fp32(v[d]);
				vmax = fmax(vmax, fabs(eng_fp16_to_fp32(v[d])));
			}
		}
		for (uint32_t d = 0; d < hd; d++)
			worst = fmax(worst, fabs(out[d] - c->xb2[h * hd + d]));
	}
	CHECK(worst <= 1e-5 * vmax, "%u threads: attention off by %g (values up to %g)", threads,
	      worst, vmax);
out:
	eng_ctx_destroy(c);
	fixture_close(&mo);
}

int main(void)
{
	test_kernels(attn_kernels_ref());
	if (attn_kernels_avx2())
		test_kernels(attn_kernels_avx2());
	else
		printf("no AVX2: the scalar kernels only\n");
	test_q4_0_quant();
	test_sizes();
	test_shift(ENG_KV_F16, 2.0 / 1024);
	test_shift(ENG_KV_Q8_0, 2.0 / 127);
	test_shift_hybrid();
	test_pass(1);
	test_pass(3);
	test_groups(ENG_KV_F16);
	test_groups(ENG_KV_Q8_0);
	printf("%s (%d failures)\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
