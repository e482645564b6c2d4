/*
 * attn_avx2.c - the AVX2/FMA/F16C attention kernels (attn_i.h): scores of
 * Q8_0 and Q4_0 keys against a Q8_0 query, and weighted sums of F16, Q8_0
 * and Q4_0 values.
 *
 * Built with the AVX2 flags (engine/meson.build); nothing here runs before
 * attn_kernels_avx2() has asked eng_kernels_avx2() whether the CPU has them.
 *
 * Numerics: the integer part of every score is exact; the scales are applied
 * per block with a fused multiply-add in 8 lanes, so a score can differ from
 * the scalar kernel's in the last bits.  The F16 weighted sum is
 * bit-identical to the scalar one (each product rounded to float, then added
 * in double, in the same order per dimension).  The quantized sums run a
 * block (32 dimensions, four registers) over all the keys of a run with
 * fused multiply-adds, then add into the double accumulators.
 *
 * The kernels are pure; the table is constant data.
 */
#include "attn_i.h"
#include "quant_x86_i.h"

#include <immintrin.h>

/* 32 signed products of a key block and a query block, summed to 8 int32
 * (|k| <= 128, |q| <= 127: a pair of products fits in int16). */
static inline __m256i dot_i8(__m256i k, __m256i q)
{
	__m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(k, k), _mm256_sign_epi8(q, k));

	return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The 32 values of a Q4_0 block as int8 (-8..7), in order. */
static inline __m256i q4_0_unpack(const uint8_t *qs)
{
	__m128i raw = _mm_loadu_si128((const __m128i *)qs);
	__m256i b = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);

	return _mm256_sub_epi8(_mm256_and_si256(b, _mm256_set1_epi8(0x0f)),
			       _mm256_set1_epi8(8));
}

static void score_q8_0(size_t hd, size_t n, float *out, const void *k, size_t stride,
		       const void *q)
{
	const struct eng_block_q8_0 *y = q;

	for (size_t t = 0; t < n; t++) {
		const struct eng_block_q8_0 *x =
			(const struct eng_block_q8_0 *)((const uint8_t *)k + t * stride);
		__m256 acc = _mm256_setzero_ps();

		for (size_t ib = 0; ib < hd / 32; ib++) {
			__m256i kx = _mm256_loadu_si256((const __m256i *)x[ib].qs);
			__m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
			__m256 d = _mm256_set1_ps(fp16(x[ib].d) * fp16(y[ib].d));

			acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(kx, qy)), acc);
		}
		out[t] = hsum_f32x8(acc);
	}
}

static void score_q4_0(size_t hd, size_t n, float *out, const void *k, size_t stride,
		       const void *q)
{
	const struct eng_block_q8_0 *y = q;

	for (size_t t = 0; t < n; t++) {
		const struct eng_block_q4_0 *x =
			(const struct eng_block_q4_0 *)((const uint8_t *)k + t * stride);
		__m256 acc = _mm256_setzero_ps();

		for (size_t ib = 0; ib < hd / 32; ib++) {
			__m256i kx = q4_0_unpack(x[ib].qs);
			__m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
			__m256 d = _mm256_set1_ps(fp16(x[ib].d) * fp16(y[ib].d));

			acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(kx, qy)), acc);
		}
		out[t] = hsum_f32x8(acc);
	}
}

/* acc[0..8) += f, each lane widened to double */
static inline void add_pd8(double *acc, __m256 f)
{
	_mm256_storeu_pd(acc, _mm256_add_pd(_mm256_loadu_pd(acc),
					    _mm256_cvtps_pd(_mm256_castps256_ps128(f))));
	_mm256_storeu_pd(acc + 4, _mm256_add_pd(_mm256_loadu_pd(acc + 4),
						_mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))));
}

static void accum_f16(size_t hd, size_t n, double *acc, const void *v, size_t stride,
		      const float *w)
{
	size_t d0 = 0;

	/* 16 dimensions at a time, their double sums in four registers */
	for (; d0 + 16 <= hd; d0 += 16) {
		__m256d a0 = _mm256_loadu_pd(acc + d0), a1 = _mm256_loadu_pd(acc + d0 + 4);
		__m256d a2 = _mm256_loadu_pd(acc + d0 + 8), a3 = _mm256_loadu_pd(acc + d0 + 12);

		for (size_t t = 0; t < n; t++) {
			const eng_fp16_t *x =
				(const eng_fp16_t *)((const uint8_t *)v + t * stride) + d0;
			__m256 wt = _mm256_set1_ps(w[t]);
			__m256 f0 = _mm256_mul_ps(
				wt, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)));
			__m256 f1 = _mm256_mul_ps(
				wt, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + 8))));

			a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(f0)));
			a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1)));
			a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(f1)));
			a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1)));
		}
		_mm256_storeu_pd(acc + d0, a0);
		_mm256_storeu_pd(acc + d0 + 4, a1);
		_mm256_storeu_pd(acc + d0 + 8, a2);
		_mm256_storeu_pd(acc + d0 + 12, a3);
	}
	for (; d0 < hd; d0++)
		for (size_t t = 0; t < n; t++) {
			const eng_fp16_t *x = (const eng_fp16_t *)((const uint8_t *)v + t * stride);

			acc[d0] += (double)(w[t] * fp16(x[d0]));
		}
}

static void accum_q8_0(size_t hd, size_t n, double *acc, const void *v, size_t stride,
		       const float *w)
{
	for (size_t ib = 0; ib < hd / 32; ib++) {
		__m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;

		for (size_t t = 0; t < n; t++) {
			const struct eng_block_q8_0 *x =
				(const struct eng_block_q8_0 *)((const uint8_t *)v + t * stride) + ib;
			__m256 a = _mm256_set1_ps(w[t] * fp16(x->d));
			__m128i q0 = _mm_loadu_si128((const __m128i *)x->qs);
			__m128i q1 = _mm_loadu_si128((const __m128i *)(x->qs + 16));

			f0 = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), f0);
			f1 = _mm256_fmadd_ps(
				a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))), f1);
			f2 = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), f2);
			f3 = _mm256_fmadd_ps(
				a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))), f3);
		}
		add_pd8(acc + ib * 32, f0);
		add_pd8(acc + ib * 32 + 8, f1);
		add_pd8(acc + ib * 32 + 16, f2);
		add_pd8(acc + ib * 32 + 24, f3);
	}
}

static void accum_q4_0(size_t hd, size_t n, double *acc, const void *v, size_t stride,
		       const float *w)
{
	const __m128i m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);

	for (size_t ib = 0; ib < hd / 32; ib++) {
		__m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;

		for (size_t t = 0; t < n; t++) {
			const struct eng_block_q4_0 *x =
				(const struct eng_block_q4_0 *)((const uint8_t *)v + t * stride) + ib;
			__m256 a = _mm256_set1_ps(w[t] * fp16(x->d));
			__m128i raw = _mm_loadu_si128((const __m128i *)x->qs);
			__m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), eight);
			__m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), eight);

			f0 = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), f0);
			f1 = _mm256_fmadd_ps(
				a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), f1);
			f2 = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), f2);
			f3 = _mm256_fmadd_ps(
				a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), f3);
		}
		add_pd8(acc + ib * 32, f0);
		add_pd8(acc + ib * 32 + 8, f1);
		add_pd8(acc + ib * 32 + 16, f2);
		add_pd8(acc + ib * 32 + 24, f3);
	}
}

static const struct attn_kernels avx2 = {
	.isa = "avx2",
	.score = { [ENG_KV_Q8_0] = score_q8_0, [ENG_KV_Q4_0] = score_q4_0 },
	.accum = { [ENG_KV_F16] = accum_f16, [ENG_KV_Q8_0] = accum_q8_0,
		   [ENG_KV_Q4_0] = accum_q4_0 },
};

BASELINE const struct attn_kernels *attn_kernels_avx2(void)
{
	return eng_kernels_avx2() ? &avx2 : NULL;
}
