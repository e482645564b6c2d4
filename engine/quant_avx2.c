/*
 * quant_avx2.c - the AVX2/FMA/F16C kernel set.
 *
 * Built with -mavx2 -mfma -mf16c (as quant_avx512.c is), and nothing in it
 * runs before eng_kernels_avx2() has checked cpuid, so the binary still
 * starts on older CPUs.  The set is the reference set with the hot kernels
 * replaced: the quantized dot products (and the eight-row Q4_0 vec_dot8),
 * the float dot products, F16 rows to float, and the two activation
 * quantizers.
 *
 * Numerics: the integer part of every quantized dot product is exact (the
 * per-block integer sums equal the reference ones for any input bytes, -128
 * included).  The float operations follow the x86 kernels of the engine the
 * test fixtures come from (ggml b4748 built with -march=native on an AVX-512
 * machine): Q8_0 and the K-quants in ggml's 8-lane order with its final
 * reductions, F32/F16 in the order of its AVX-512 ggml_vec_dot_f32/f16.  The
 * quantizers produce the reference's bytes exactly (Q8_0 with 127/amax and
 * ties to even, Q8_K with ggml's nearest_int bit trick lane by lane).
 *
 * Threading: the table is built once under pthread_once; the kernels are
 * pure.
 */
#include "quant_x86_i.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

BASELINE static bool cpu_has_avx2(void)
{
	unsigned int eax, ebx, ecx, edx;

	/* __builtin_cpu_supports also checks that the OS saves the YMM
	 * registers; clang's does not know "f16c", so that bit comes from
	 * CPUID leaf 1 directly. */
	__builtin_cpu_init();
	if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C))
		return false;
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static inline int32_t hsum_i32x8(__m256i v)
{
	__m128i r = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));

	r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
	r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 1));
	return _mm_cvtsi128_si32(r);
}

static inline float hmax_f32x8(__m256 v)
{
	__m128 r = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));

	r = _mm_max_ps(r, _mm_movehl_ps(r, r));
	r = _mm_max_ss(r, _mm_movehdup_ps(r));
	return _mm_cvtss_f32(r);
}

static inline __m256 abs_ps(__m256 v)
{
	return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/*
 * Four vectors of 8 int32 (each within int8 range) to 32 int8 in order.  The
 * packs work within 128-bit lanes, which leaves the dwords as a0 b0 c0 d0 a1
 * b1 c1 d1 (each 4 bytes); the permute puts them back as a0 a1 b0 b1 ...
 */
static inline __m256i pack_i32x32_i8(__m256i a, __m256i b, __m256i c, __m256i d)
{
	const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	__m256i v = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));

	return _mm256_permutevar8x32_epi32(v, perm);
}

/* ---- float types ------------------------------------------------------ */

static void f16_to_float(const void *src, float *dst, size_t n)
{
	const eng_fp16_t *x = src;
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const void *)(x + i))));
	for (; i < n; i++)
		dst[i] = fp16(x[i]);
}

/* Element i of a row as 8 floats (load8) or one (load1). */
static inline __m256 load8_f32(const void *w, size_t i)
{
	return _mm256_loadu_ps((const float *)w + i);
}

static inline __m256 load8_f16(const void *w, size_t i)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const void *)((const eng_fp16_t *)w + i)));
}

static inline float load1_f16(const void *w, size_t i)
{
	return fp16(((const eng_fp16_t *)w)[i]);
}

/* bf16 is the top half of an fp32: widen and shift. */
static inline __m256 load8_bf16(const void *w, size_t i)
{
	const __m128i h = _mm_loadu_si128((const void *)((const eng_bf16_t *)w + i));

	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float load1_bf16(const void *w, size_t i)
{
	return eng_bf16_to_fp32(((const eng_bf16_t *)w)[i]);
}

/*
 * F32 and F16 dot products follow ggml_vec_dot_f32/f16 as built for the
 * reference engine's CPU, which has AVX-512: 64 elements per step into four
 * 16-lane FMA accumulators (here two 8-lane halves each: acc[k] holds
 * elements 8k..8k+7 of every step), folded as (a0 + a2) + (a1 + a3), then
 * reduced like _mm512_reduce_add_ps (upper 8 lanes onto the lower 8, then
 * hsum_f32x8).  The n % 64 elements left over are added one at a time: in
 * float with a fused multiply-add for F32 (ggml's "sumf += x[i]*y[i]" is
 * contracted in its -march=native build), in double for F16.  A row shorter
 * than 64, like an attention head, is thus a plain sequential sum.
 */
static inline __attribute__((always_inline)) float
steps64(size_t np, const void *w, const void *y, __m256 (*load_w)(const void *, size_t),
	__m256 (*load_y)(const void *, size_t))
{
	__m256 acc[8];

	if (!np)
		return 0.0f;
	for (int k = 0; k < 8; k++)
		acc[k] = _mm256_setzero_ps();
	for (size_t i = 0; i < np; i += 64)
		for (int k = 0; k < 8; k++)
			acc[k] = _mm256_fmadd_ps(load_w(w, i + 8 * k), load_y(y, i + 8 * k), acc[k]);
	for (int h = 0; h < 2; h++) {
		acc[h] = _mm256_add_ps(acc[h], acc[4 + h]);
		acc[2 + h] = _mm256_add_ps(acc[2 + h], acc[6 + h]);
	}
	for (int h = 0; h < 2; h++)
		acc[h] = _mm256_add_ps(acc[h], acc[2 + h]);
	return hsum_f32x8(_mm256_add_ps(acc[1], acc[0]));
}

static void vec_dot_f32(size_t n, float *out, const void *w, const void *a)
{
	const size_t np = n & ~(size_t)63;
	const float *x = w, *y = a;
	float sum = steps64(np, w, a, load8_f32, load8_f32);

	for (size_t i = np; i < n; i++)
		sum = fmaf(x[i], y[i], sum);
	*out = sum;
}

/* F16 weights with F16 activations (see quant_ref.c). */
static void vec_dot_f16(size_t n, float *out, const void *w, const void *a)
{
	const size_t np = n & ~(size_t)63;
	double sum = steps64(np, w, a, load8_f16, load8_f16);

	for (size_t i = np; i < n; i++)
		sum += (double)(load1_f16(w, i) * load1_f16(a, i));
	*out = (float)sum;
}

/*
 * BF16 weights with BF16 activations follow ggml_vec_dot_bf16 as built for
 * AVX2 (the reference's haswell build): 32 elements per step into four 8-lane
 * accumulators, folded as (c1 + c3) + (c2 + c4), the rest one at a time in
 * double.  A bf16 product is exact in float, so FMA or not is the same.
 */
static void vec_dot_bf16(size_t n, float *out, const void *w, const void *a)
{
	__m256 c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps();
	__m256 c3 = _mm256_setzero_ps(), c4 = _mm256_setzero_ps();
	double sum = 0;
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		c1 = _mm256_fmadd_ps(load8_bf16(w, i), load8_bf16(a, i), c1);
		c2 = _mm256_fmadd_ps(load8_bf16(w, i + 8), load8_bf16(a, i + 8), c2);
		c3 = _mm256_fmadd_ps(load8_bf16(w, i + 16), load8_bf16(a, i + 16), c3);
		c4 = _mm256_fmadd_ps(load8_bf16(w, i + 24), load8_bf16(a, i + 24), c4);
	}
	if (i)
		sum = hsum_f32x8(_mm256_add_ps(_mm256_add_ps(c1, c3), _mm256_add_ps(c2, c4)));
	for (; i < n; i++)
		sum += (double)(load1_bf16(w, i) * load1_bf16(a, i));
	*out = (float)sum;
}

/* Round to nearest even in integer arithmetic, as eng_fp32_to_bf16 (NaN
 * quieted): the same bits on every set. */
static void bf16_from_float(const float *src, void *dst, size_t n)
{
	const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
	const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i quiet = _mm256_set1_epi32(64);
	eng_bf16_t *y = dst;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
		__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
		__m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
		__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
		__m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);

		r = _mm256_blendv_epi8(r, qn, nan);
		/* 8 dwords to 8 words: pack (unsigned saturation is exact here,
		 * every value < 65536) and put the two halves in order */
		__m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);

		_mm_storeu_si128((void *)(y + i), _mm_packus_epi32(lo, hi));
	}
	for (; i < n; i++)
		y[i] = eng_fp32_to_bf16(src[i]);
}

static void f16_from_float(const float *src, void *dst, size_t n)
{
	eng_fp16_t *y = dst;
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((void *)(y + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		y[i] = eng_fp32_to_fp16(src[i]);
}

/* ---- Q4_0, Q8_0 ------------------------------------------------------- */

/*
 * ggml's AVX2 code multiplies signed by signed with the sign trick
 * (maddubs(|x|, sign(y, x))), which is wrong when an activation is -128.
 * Here the unsigned nibble q multiplies y, and 8*y is subtracted in 16 bits:
 * sum((q - 8) * y) exactly, for any y.  Pair sums stay below 2^12.
 */
static void vec_dot_q4_0_q8_0(size_t n, float *out, const void *w, const void *a)
{
	const struct eng_block_q4_0 *x = w;
	const struct eng_block_q8_0 *y = a;
	const __m128i m4 = _mm_set1_epi8(0x0f);
	const __m256i eight = _mm256_set1_epi8(8);
	const __m256i ones = _mm256_set1_epi16(1);
	float acc = 0.0f;

	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		const __m128i raw = _mm_loadu_si128((const void *)x[ib].qs);
		/* low nibbles are elements 0-15, high nibbles 16-31 */
		const __m256i qx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4),
						    _mm_and_si128(raw, m4));
		const __m256i qy = _mm256_loadu_si256((const void *)y[ib].qs);
		const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(qx, qy),
						     _mm256_maddubs_epi16(eight, qy));
		const __m256i p32 = _mm256_madd_epi16(p16, ones);

		/* exact block sum, then one fma per block in block order, as
		 * the reference (see quant_ref.c) */
		acc = fmaf((float)hsum_i32x8(p32), fp16(x[ib].d) * fp16(y[ib].d), acc);
	}
	*out = acc;
}

/*
 * Q8_0 activations to struct q8_0s records (quant_x86_i.h), once per row
 * and matmul: the eight-row Q4_0 kernels here and in quant_avx512.c read
 * them.
 */
static void pack8_q4_0(const void *src, void *dst, size_t n)
{
	const struct eng_block_q8_0 *y = src;
	struct q8_0s *p = dst;
	const __m256i bias = _mm256_set1_epi8((char)0x80);

	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		const __m256i q = _mm256_loadu_si256((const void *)y[ib].qs);
		/* the sum of the bytes biased to unsigned, less the bias */
		const __m256i s4 = _mm256_sad_epu8(_mm256_xor_si256(q, bias), _mm256_setzero_si256());
		const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4),
						 _mm256_extracti128_si256(s4, 1));
		const int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) -
				    128 * ENG_QK8_0;

		p[ib].base = -8 * sum;
		p[ib].d = fp16(y[ib].d);
		_mm256_storeu_si256((void *)p[ib].qs, q);
	}
}

/*
 * Eight Q4_0 rows against nt packed activation rows, each row's result
 * bit-identical to vec_dot_q4_0_q8_0: per block, each row's exact integer
 * sum goes into lane r of one vector, and one vector FMA does in lane r what
 * the scalar chain does for row r, fmaf(sum, d_x * d_y, acc) in block order.
 * Eight chains in flight instead of one, and the nibbles unpacked once for
 * all nt tokens.
 *
 * Layout (quant_avx512.c's, in 256 bits): per block the rows' 16 quant
 * bytes are transposed as dwords once (V_k lane r = dword k of row r: two
 * rounds of unpacks), so V_k & 15 holds elements 4k..4k+3 of every row and
 * (V_k >> 4) & 15 elements 16+4k..16+4k+3.  A token then takes eight
 * maddubs, each with one dword of its activations broadcast from memory,
 * added in 16 bits (each maddubs lane is at most 2 * 15 * 128, eight of
 * them 30720: no overflow, -128 included), and one madd leaves row r's sum
 * of nibble times y in lane r; pack8's -8 * sum(y) makes it the block sum.
 * No reduction tree (the rows-r-and-r+4 layout before this one needed an
 * unpack-and-add tree and four subtractions per token and block: 36
 * instructions against 20).
 *
 * The block loop prefetches the rows two calls ahead (see quant_x86_i.h).
 */
struct q4_0_x8 {
	__m256i lo[4], hi[4]; /* lane r: elements 4k.., 16 + 4k.. of row r */
	__m256 d;             /* the rows' scales, lane r = row r */
};

static inline __attribute__((always_inline)) void
q4_0_load8(struct q4_0_x8 *x, const uint8_t *rows, size_t stride, size_t ib)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	const uint8_t *pf = rows + Q4_0_PREFETCH_ROWS * stride +
			    ((ib * 8 * sizeof(struct eng_block_q4_0)) & ~(size_t)63);
	uint64_t d0 = 0, d1 = 0;
	__m256i raw[4];

	for (int p = 0; p < 4; p++) {
		const struct eng_block_q4_0 *xa =
			(const struct eng_block_q4_0 *)(rows + (size_t)p * stride) + ib;
		const struct eng_block_q4_0 *xb =
			(const struct eng_block_q4_0 *)(rows + (size_t)(p + 4) * stride) + ib;

		/* rows p | p + 4, dwords 0..3 each */
		raw[p] = _mm256_loadu2_m128i((const void *)xb->qs, (const void *)xa->qs);
		/* the scales gathered in general registers: no vector
		 * shuffle, no store-forwarding stall */
		d0 |= (uint64_t)xa->d << (16 * p);
		d1 |= (uint64_t)xb->d << (16 * p);
	}
	/* a 4x4 dword transpose in each 128-bit half */
	const __m256i t0 = _mm256_unpacklo_epi32(raw[0], raw[1]);
	const __m256i t1 = _mm256_unpackhi_epi32(raw[0], raw[1]);
	const __m256i t2 = _mm256_unpacklo_epi32(raw[2], raw[3]);
	const __m256i t3 = _mm256_unpackhi_epi32(raw[2], raw[3]);
	const __m256i v[4] = { _mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
			       _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3) };

	for (int k = 0; k < 4; k++) {
		x->lo[k] = _mm256_and_si256(v[k], m4);
		x->hi[k] = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), m4);
	}
	x->d = _mm256_cvtph_ps(_mm_set_epi64x((long long)d1, (long long)d0));
	k_prefetch((const char *)pf);
	k_prefetch((const char *)pf + 64);
	k_prefetch((const char *)pf + 128);
}

/* Up to eight tokens at a time: with the eight nibble vectors, more than
 * sixteen registers hold, but an accumulator spilled costs a load and a
 * store per token and block, and the transpose is then shared by twice the
 * tokens (8: 1.24x the GMAC/s of 4 on one core, 256 rows of 4096, best of 5). */
#define Q4_0_NT_AVX2 8

/* Block ib of eight rows, unpacked in x, by nt packed tokens: acc[t] lane r
 * += row r's block sum times x.d[r] * y.d, one FMA as the scalar chain. */
static inline __attribute__((always_inline)) void
q4_0_x8_tokens(const struct q4_0_x8 *x, const unsigned nt, const uint8_t *act, size_t a_stride,
	       size_t ib, __m256 *acc)
{
	const __m256i ones = _mm256_set1_epi16(1);

	for (unsigned t = 0; t < nt; t++) {
		const struct q8_0s *y = (const struct q8_0s *)(act + t * a_stride) + ib;
		__m256i p16 = _mm256_setzero_si256();

		for (int k = 0; k < 4; k++) {
			p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(
				x->lo[k], _mm256_set1_epi32(y->qs[k])));
			p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(
				x->hi[k], _mm256_set1_epi32(y->qs[4 + k])));
		}
		const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(p16, ones),
						   _mm256_set1_epi32(y->base));

		acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),
					 _mm256_mul_ps(x->d, _mm256_set1_ps(y->d)), acc[t]);
	}
}

static inline __attribute__((always_inline)) void
dot8_q4_0_avx2(size_t n, const unsigned nt, float *out, size_t out_stride, const uint8_t *rows,
	       size_t stride, const uint8_t *act, size_t a_stride)
{
	__m256 acc[Q4_0_NT_AVX2];

	for (unsigned t = 0; t < nt; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		struct q4_0_x8 x;

		q4_0_load8(&x, rows, stride, ib);
		q4_0_x8_tokens(&x, nt, act, a_stride, ib, acc);
	}
	for (unsigned t = 0; t < nt; t++)
		_mm256_storeu_ps(out + t * out_stride, acc[t]);
}

/*
 * Q4_0_R16 (quant.h) with AVX2: the order dot8_q4_0_avx2 builds, already
 * made.  Rows 8h .. 8h + 7 of a block are the half h of each qs[k], lane r =
 * dword k of row 8h + r, which is q4_0_load8's V_k with no loads to gather
 * and no transpose, and the half's eight scales lie side by side for one
 * cvtph.  The 16 rows are one run read front to back, which the hardware
 * prefetcher follows, so no software prefetch.  The rest is
 * dot8_q4_0_avx2's q4_0_x8_tokens: the nibbles unpacked once for up to eight
 * packed (pack8) tokens, one FMA in block order per row: the same bits as
 * vec_dot_q4_0_q8_0.
 */
static inline __attribute__((always_inline)) void
r16_load8(struct q4_0_x8 *x, const struct eng_block_q4_0_r16 *b, int h)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);

	for (int k = 0; k < 4; k++) {
		const __m256i v = _mm256_loadu_si256((const void *)&b->qs[k][32 * h]);

		x->lo[k] = _mm256_and_si256(v, m4);
		x->hi[k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
	}
	x->d = _mm256_cvtph_ps(_mm_loadu_si128((const void *)&b->d[8 * h]));
}

static inline __attribute__((always_inline)) void
dot16_q4_0_r16_avx2(size_t n, const unsigned nt, float *out, size_t out_stride,
		    const struct eng_block_q4_0_r16 *xb, const uint8_t *act, size_t a_stride)
{
	__m256 acc[2][Q4_0_NT_AVX2];

	for (unsigned t = 0; t < nt; t++)
		acc[0][t] = acc[1][t] = _mm256_setzero_ps();
	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		for (int h = 0; h < 2; h++) {
			struct q4_0_x8 x;

			r16_load8(&x, &xb[ib], h);
			q4_0_x8_tokens(&x, nt, act, a_stride, ib, acc[h]);
		}
	}
	for (unsigned t = 0; t < nt; t++) {
		_mm256_storeu_ps(out + t * out_stride, acc[0][t]);
		_mm256_storeu_ps(out + t * out_stride + 8, acc[1][t]);
	}
}

static void vec_dot16_q4_0_r16(size_t n, unsigned nt, float *out, size_t out_stride,
			       const void *w, size_t stride, const void *a, size_t a_stride)
{
	(void)stride; /* the 16 rows are one run */
	for (unsigned t0 = 0; t0 < nt; t0 += Q4_0_NT_AVX2) {
		float *o = out + t0 * out_stride;
		const uint8_t *y = (const uint8_t *)a + t0 * a_stride;

		switch (nt - t0) {
		case 1: dot16_q4_0_r16_avx2(n, 1, o, out_stride, w, y, a_stride); break;
		case 2: dot16_q4_0_r16_avx2(n, 2, o, out_stride, w, y, a_stride); break;
		case 3: dot16_q4_0_r16_avx2(n, 3, o, out_stride, w, y, a_stride); break;
		case 4: dot16_q4_0_r16_avx2(n, 4, o, out_stride, w, y, a_stride); break;
		case 5: dot16_q4_0_r16_avx2(n, 5, o, out_stride, w, y, a_stride); break;
		case 6: dot16_q4_0_r16_avx2(n, 6, o, out_stride, w, y, a_stride); break;
		case 7: dot16_q4_0_r16_avx2(n, 7, o, out_stride, w, y, a_stride); break;
		default: dot16_q4_0_r16_avx2(n, 8, o, out_stride, w, y, a_stride); break;
		}
	}
}

/* Up to eight tokens at a time, each count its own copy of the loop. */
static void vec_dot8_q4_0_q8_0(size_t n, unsigned nt, float *out, size_t out_stride,
			       const void *w, size_t stride, const void *a, size_t a_stride)
{
	for (unsigned t0 = 0; t0 < nt; t0 += Q4_0_NT_AVX2) {
		float *o = out + t0 * out_stride;
		const uint8_t *y = (const uint8_t *)a + t0 * a_stride;

		switch (nt - t0) {
		case 1: dot8_q4_0_avx2(n, 1, o, out_stride, w, stride, y, a_stride); break;
		case 2: dot8_q4_0_avx2(n, 2, o, out_stride, w, stride, y, a_stride); break;
		case 3: dot8_q4_0_avx2(n, 3, o, out_stride, w, stride, y, a_stride); break;
		case 4: dot8_q4_0_avx2(n, 4, o, out_stride, w, stride, y, a_stride); break;
		case 5: dot8_q4_0_avx2(n, 5, o, out_stride, w, stride, y, a_stride); break;
		case 6: dot8_q4_0_avx2(n, 6, o, out_stride, w, stride, y, a_stride); break;
		case 7: dot8_q4_0_avx2(n, 7, o, out_stride, w, stride, y, a_stride); break;
		default: dot8_q4_0_avx2(n, 8, o, out_stride, w, stride, y, a_stride); break;
		}
	}
}

/*
 * ggml's x86 kernel (mul_sum_i8_pairs_float) sums elements 4j..4j+3 of a
 * block into int32 lane j, converts, and adds d * lane with one FMA per
 * block; the lanes are reduced at the end by hsum_f32x8.  Here both sides
 * are widened to 16 bits (madd cannot saturate, so -128 is exact, unlike the
 * sign trick), madd gives pairs, and hadd puts pairs 2j and 2j+1 together:
 * within 128-bit halves that yields lanes 0 1 4 5 | 2 3 6 7, which the
 * 64-bit permute puts back in order.
 */
static void vec_dot_q8_0_q8_0(size_t n, float *out, const void *w, const void *a)
{
	const struct eng_block_q8_0 *x = w;
	const struct eng_block_q8_0 *y = a;
	const char *pf = (const char *)x + k_prefetch_rows * (n / ENG_QK8_0) * sizeof(*x);
	__m256 acc = _mm256_setzero_ps();

	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		/* the row k_prefetch_rows ahead, at this one's pace (34-byte
		 * blocks: a line every other block) */
		k_prefetch(pf + ib * sizeof(*x));
		const __m256i qx = _mm256_loadu_si256((const void *)x[ib].qs);
		const __m256i qy = _mm256_loadu_si256((const void *)y[ib].qs);
		const __m256i xl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qx));
		const __m256i xh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qx, 1));
		const __m256i yl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qy));
		const __m256i yh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qy, 1));
		const __m256i p32 = _mm256_permute4x64_epi64(
			_mm256_hadd_epi32(_mm256_madd_epi16(xl, yl), _mm256_madd_epi16(xh, yh)),
			0xd8);
		const __m256 d = _mm256_set1_ps(fp16(x[ib].d) * fp16(y[ib].d));

		acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p32), acc);
	}
	*out = hsum_f32x8(acc);
}

/*
 * Eight Q8_0 rows by up to eight tokens (vec_dot8), each row and token
 * bit-identical to vec_dot_q8_0_q8_0: the same int32 lanes (lane j =
 * elements 4j..4j+3; integers, exact in any order), one FMA per block with
 * d_x * d_y into its own 8-lane accumulator, the same hsum at the end.
 *
 * Both sides are widened to int16 (madd cannot saturate: exact for any
 * bytes, -128 included, where ggml's sign trick is not), in an order in
 * which two madds and an add give ggml's lanes with no hadd: the first 16
 * int16 of a block are elements 4j, 4j + 1 (j = 0..7), the last 16 are
 * 4j + 2, 4j + 3.  pack8 puts a token's activations in that order once per
 * matmul (struct below); a weight block is put in it once for all the
 * tokens.  Per row, token and block that leaves two madds (one activation
 * load each), an add, the conversion, the scale product and the FMA.  Rows
 * are read one after the other, front to back, the row k_prefetch_rows
 * ahead prefetched (a single stream each, as the K-quant kernels do).
 *
 * Packed activations of n elements: int16 qs[n] (block after block, each
 * in the order above), then float d[n / 32], the scales as float (exact).
 */
#define Q8_0_PACK_BYTES(n) ((n) / ENG_QK8_0 * (ENG_QK8_0 * 2 + sizeof(float)))
_Static_assert(Q8_0_PACK_BYTES(ENG_QK8_0) <= ENG_PACK8_BYTES(ENG_QK8_0), "q8_0 pack8 size");

/* 32 int8 to the two int16 halves of the order above. */
static inline void q8_0_widen(const int8_t *q, __m256i *a, __m256i *b)
{
	/* in each 128-bit lane: pairs 4j, 4j + 1 to its low 8 bytes,
	 * 4j + 2, 4j + 3 to its high 8; then the low halves of both lanes
	 * together (qwords 0 2 1 3) */
	const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
					       0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
	const __m256i v = _mm256_permute4x64_epi64(
		_mm256_shuffle_epi8(_mm256_loadu_si256((const void *)q), pairs), 0xd8);

	*a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
	*b = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
}

static void pack8_q8_0(const void *src, void *dst, size_t n)
{
	const struct eng_block_q8_0 *y = src;
	int16_t *qs = dst;
	float *d = (float *)(qs + n);

	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		__m256i a, b;

		q8_0_widen(y[ib].qs, &a, &b);
		_mm256_storeu_si256((void *)(qs + ENG_QK8_0 * ib), a);
		_mm256_storeu_si256((void *)(qs + ENG_QK8_0 * ib + 16), b);
		d[ib] = fp16(y[ib].d);
	}
}

/* Row x (n elements) by tn (a constant where inlined) packed tokens. */
static inline __attribute__((always_inline)) void
q8_0_row_tn(size_t n, const struct eng_block_q8_0 *x, const uint8_t *act, size_t a_stride,
	    const unsigned tn, float *out, size_t out_stride)
{
	const size_t nb = n / ENG_QK8_0;
	const char *pf = (const char *)x + k_prefetch_rows * nb * sizeof(*x);
	__m256 acc[ENG_DOT8_NT];

	for (unsigned t = 0; t < tn; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t ib = 0; ib < nb; ib++) {
		__m256i xa, xb;

		k_prefetch(pf + ib * sizeof(*x));
		q8_0_widen(x[ib].qs, &xa, &xb);
		const __m256 dx = fp16x8(x[ib].d);

		for (unsigned t = 0; t < tn; t++) {
			const int16_t *qy = (const int16_t *)(act + t * a_stride) + ENG_QK8_0 * ib;
			const float *dy = (const float *)((const int16_t *)(act + t * a_stride) + n);
			const __m256i p32 = _mm256_add_epi32(
				_mm256_madd_epi16(xa, _mm256_loadu_si256((const void *)qy)),
				_mm256_madd_epi16(xb, _mm256_loadu_si256((const void *)(qy + 16))));

			acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_broadcast_ss(dy + ib)),
						 _mm256_cvtepi32_ps(p32), acc[t]);
		}
	}
	for (unsigned t = 0; t < tn; t++)
		out[t * out_stride] = hsum_f32x8(acc[t]);
}

static void vec_dot8_q8_0_q8_0(size_t n, unsigned nt, float *out, size_t out_stride,
			       const void *w, size_t stride, const void *a, size_t a_stride)
{
	for (int r = 0; r < 8; r++) {
		const struct eng_block_q8_0 *x =
			(const void *)((const uint8_t *)w + (size_t)r * stride);
		const uint8_t *y = a;
		float *o = out + r;

		switch (nt) {
		case 1: q8_0_row_tn(n, x, y, a_stride, 1, o, out_stride); break;
		case 2: q8_0_row_tn(n, x, y, a_stride, 2, o, out_stride); break;
		case 3: q8_0_row_tn(n, x, y, a_stride, 3, o, out_stride); break;
		case 4: q8_0_row_tn(n, x, y, a_stride, 4, o, out_stride); break;
		case 5: q8_0_row_tn(n, x, y, a_stride, 5, o, out_stride); break;
		case 6: q8_0_row_tn(n, x, y, a_stride, 6, o, out_stride); break;
		case 7: q8_0_row_tn(n, x, y, a_stride, 7, o, out_stride); break;
		default: q8_0_row_tn(n, x, y, a_stride, 8, o, out_stride); break;
		}
	}
}

/*
 * Round to nearest, ties to even (nearbyintf in the reference) on 8 lanes.
 * NaN becomes 0 and the result saturates to [-128, 127], as sat_i8() in the
 * reference does; the int32 conversion is then exact.
 */
static inline __m256i round_sat_i32(__m256 v)
{
	__m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);

	r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
	r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
	return _mm256_cvttps_epi32(r);
}

static void q8_0_from_float(const float *src, void *dst, size_t n)
{
	struct eng_block_q8_0 *y = dst;

	for (size_t i = 0; i < n / ENG_QK8_0; i++) {
		const float *x = src + i * ENG_QK8_0;
		__m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
		__m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
		const __m256 m = _mm256_max_ps(_mm256_max_ps(abs_ps(v0), abs_ps(v1)),
					       _mm256_max_ps(abs_ps(v2), abs_ps(v3)));
		const float amax = hmax_f32x8(m);
		/* the same scalar arithmetic as the reference */
		const float d = amax / 127.0f;
		const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
		const __m256 vid = _mm256_set1_ps(id);

		y[i].d = eng_fp32_to_fp16(d);
		_mm256_storeu_si256((void *)y[i].qs,
				    pack_i32x32_i8(round_sat_i32(_mm256_mul_ps(v0, vid)),
						   round_sat_i32(_mm256_mul_ps(v1, vid)),
						   round_sat_i32(_mm256_mul_ps(v2, vid)),
						   round_sat_i32(_mm256_mul_ps(v3, vid))));
	}
}

/* ---- Q8_K ------------------------------------------------------------- */

/* ggml's nearest_int on 8 lanes, then clamped to [-128, 127]. */
static inline __m256i nearest_sat_i32(__m256 v)
{
	__asm__("" : "+x"(v)); /* no FMA with the add below, as above */
	const __m256 t = _mm256_add_ps(v, _mm256_set1_ps(12582912.0f));
	__m256i i = _mm256_and_si256(_mm256_castps_si256(t), _mm256_set1_epi32(0x007fffff));

	i = _mm256_sub_epi32(i, _mm256_set1_epi32(0x00400000));
	return _mm256_max_epi32(_mm256_min_epi32(i, _mm256_set1_epi32(127)),
				_mm256_set1_epi32(-128));
}

static void q8_k_from_float(const float *src, void *dst, size_t n)
{
	struct eng_block_q8_k *y = dst;
	const __m256 sign = _mm256_set1_ps(-0.0f);

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const float *x = src + i * ENG_QK_K;
		__m256 vmax = _mm256_setzero_ps();
		float amax, max = 0.0f;

		/* max_ps returns its second operand if either is NaN, so a NaN
		 * input is skipped as the reference's "ax > amax" skips it. */
		for (int j = 0; j < ENG_QK_K; j += 8)
			vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), vmax);
		amax = hmax_f32x8(vmax);
		if (!amax) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		/* The sign of the scale comes from the first element of that
		 * magnitude, as in the reference. */
		const __m256 vamax = _mm256_set1_ps(amax);
		for (int j = 0; j < ENG_QK_K; j += 8) {
			const __m256 ax = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
			const int mask = _mm256_movemask_ps(_mm256_cmp_ps(ax, vamax, _CMP_EQ_OQ));

			if (mask) {
				max = x[j + __builtin_ctz((unsigned)mask)];
				break;
			}
		}
		const float iscale = -127.0f / max;
		const __m256 vis = _mm256_set1_ps(iscale);
		const __m256i bias = _mm256_set1_epi8((char)0x80);
		uint64_t s[4];

		for (int j = 0; j < ENG_QK_K; j += 32) {
			const __m256i q = pack_i32x32_i8(
				nearest_sat_i32(_mm256_mul_ps(vis, _mm256_loadu_ps(x + j))),
				nearest_sat_i32(_mm256_mul_ps(vis, _mm256_loadu_ps(x + j + 8))),
				nearest_sat_i32(_mm256_mul_ps(vis, _mm256_loadu_ps(x + j + 16))),
				nearest_sat_i32(_mm256_mul_ps(vis, _mm256_loadu_ps(x + j + 24))));

			_mm256_storeu_si256((void *)(y[i].qs + j), q);
			/* Group sums: bias to unsigned, let sad_epu8 add each 8
			 * bytes, take the bias (8 * 128 per 8) back out. */
			_mm256_storeu_si256((void *)s,
					    _mm256_sad_epu8(_mm256_xor_si256(q, bias),
							    _mm256_setzero_si256()));
			y[i].bsums[j / 16] = (int16_t)((int)(s[0] + s[1]) - 2048);
			y[i].bsums[j / 16 + 1] = (int16_t)((int)(s[2] + s[3]) - 2048);
		}
		y[i].d = 1.0f / iscale;
	}
}

/*
 * Q8_K activations for the K-quants' multi-row kernels (quant_krows_tmpl.h), once per
 * row and matmul: the Q8_K row as it is (the one-token kernels read that),
 * then each block's 256 quants plus 128 (unsigned, for Q6_K's vec_dotn: the
 * flip was two maddubs a token and 32 elements, done again for every row),
 * then each block's y.d, so that Q6_K reads 260 bytes a block and token,
 * then each block's quants for Q4_K: 808 bytes a block in all.  Both sets
 * of quants go in pairs of 32 for the shared madd (k4_pair_a, k4_pair_b).
 * Q5_K's vec_dotn reads only the Q8_K rows at the start, but takes the same
 * pack8, so that a matmul may group it with Q6_K (Q5_K_M mixes them).
 */
/* a row's blocks, and the at most 63 + 63 bytes pack8_q8_k_at skips to put
 * two of its parts on a cache line's start */
_Static_assert(PACK8_Q8_K_BLOCK + 63 + 63 <= ENG_PACK8_BYTES(ENG_QK_K), "q8_k pack8 size");

static void pack8_q8_k(const void *src, void *dst, size_t n)
{
	const size_t nb = n / ENG_QK_K;
	const struct eng_block_q8_k *y = src;
	const struct pack8_q8_k_at at = pack8_q8_k_at(nb);
	uint8_t *yu = (uint8_t *)dst + at.yu;
	float *yd = (float *)((uint8_t *)dst + at.yd);
	uint8_t *ys = (uint8_t *)dst + at.ys;
	const __m256i u128 = _mm256_set1_epi8((char)0x80);

	memcpy(dst, src, nb * sizeof(*y));
	for (size_t i = 0; i < nb; i++) {
		for (int j = 0; j < ENG_QK_K / 64; j++) {
			const __m256i l = _mm256_loadu_si256((const void *)(y[i].qs + 64 * j));
			const __m256i h = _mm256_loadu_si256((const void *)(y[i].qs + 64 * j + 32));
			const __m256i a = k4_pair_a(l, h), b = k4_pair_b(l, h);

			_mm256_storeu_si256((void *)(ys + ENG_QK_K * i + 64 * j), a);
			_mm256_storeu_si256((void *)(ys + ENG_QK_K * i + 64 * j + 32), b);
			_mm256_storeu_si256((void *)(yu + ENG_QK_K * i + 64 * j),
					    _mm256_xor_si256(u128, a));
			_mm256_storeu_si256((void *)(yu + ENG_QK_K * i + 64 * j + 32),
					    _mm256_xor_si256(u128, b));
		}
		yd[i] = y[i].d;
	}
}

/* ---- the K-quants' one-row Q6_K and eight-row kernels ------------------ */

#define KR_ATTR
#define KR_NAME(f) f##_avx2
#define KR_DPWSSD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#include "quant_krows_tmpl.h"

/* ---- the table -------------------------------------------------------- */

/* The row prefetch's setting (quant_x86_i.h), written once, by
 * k_prefetch_choose under avx2_once, before any kernel runs. */
unsigned k_prefetch_rows = 16;
bool k_prefetch_l1;

/* Zen 5 (AMD family 1Ah): T0 at 8 rows; any other CPU: T1 at 16. */
BASELINE static void k_prefetch_choose(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(0, &a, &b, &c, &d) || b != signature_AMD_ebx || d != signature_AMD_edx ||
	    c != signature_AMD_ecx || !__get_cpuid(1, &a, &b, &c, &d))
		return;
	if (((a >> 8) & 0xf) + ((a >> 20) & 0xff) == 0x1a) {
		k_prefetch_rows = 8;
		k_prefetch_l1 = true;
	}
}

static pthread_once_t avx2_once = PTHREAD_ONCE_INIT;
static struct eng_kernels avx2;
static bool avx2_ok;

BASELINE static void avx2_init(void)
{
	avx2_ok = cpu_has_avx2();
	if (!avx2_ok)
		return;
	k_prefetch_choose();
	avx2 = *eng_kernels_ref();
	avx2.isa = "avx2";
	avx2.to_float[ENG_TYPE_F16] = f16_to_float;
	avx2.from_float[ENG_TYPE_Q8_0] = q8_0_from_float;
	avx2.from_float[ENG_TYPE_F16] = f16_from_float;
	avx2.from_float[ENG_TYPE_BF16] = bf16_from_float;
	avx2.from_float[ENG_TYPE_Q8_K] = q8_k_from_float;
	avx2.vec_dot[ENG_TYPE_F32] = vec_dot_f32;
	avx2.vec_dot[ENG_TYPE_F16] = vec_dot_f16;
	avx2.vec_dot[ENG_TYPE_BF16] = vec_dot_bf16;
	avx2.vec_dot[ENG_TYPE_Q4_0] = vec_dot_q4_0_q8_0;
	avx2.vec_dot8[ENG_TYPE_Q4_0] = vec_dot8_q4_0_q8_0;
	avx2.pack8[ENG_TYPE_Q4_0] = pack8_q4_0;
	avx2.vec_dot16[ENG_TYPE_Q4_0_R16] = vec_dot16_q4_0_r16;
	avx2.pack8[ENG_TYPE_Q4_0_R16] = pack8_q4_0;
	avx2.vec_dot[ENG_TYPE_Q8_0] = vec_dot_q8_0_q8_0;
	avx2.vec_dot8[ENG_TYPE_Q8_0] = vec_dot8_q8_0_q8_0;
	avx2.pack8[ENG_TYPE_Q8_0] = pack8_q8_0;
	avx2.vec_dot[ENG_TYPE_Q4_K] = vec_dot_q4_k_q8_k_avx2;
	avx2.vec_dotn[ENG_TYPE_Q4_K] = vec_dotn_q4_k_q8_k_avx2;
	avx2.pack8[ENG_TYPE_Q4_K] = pack8_q8_k;
	avx2.vec_dot[ENG_TYPE_Q5_K] = vec_dot_q5_k_q8_k_avx2;
	avx2.vec_dotn[ENG_TYPE_Q5_K] = vec_dotn_q5_k_q8_k_avx2;
	avx2.pack8[ENG_TYPE_Q5_K] = pack8_q8_k;
	avx2.vec_dot[ENG_TYPE_Q6_K] = vec_dot_q6_k_q8_k_avx2;
	avx2.vec_dotn[ENG_TYPE_Q6_K] = vec_dotn_q6_k_q8_k_avx2;
	avx2.pack8[ENG_TYPE_Q6_K] = pack8_q8_k;
}

BASELINE const struct eng_kernels *eng_kernels_avx2(void)
{
	pthread_once(&avx2_once, avx2_init);
	return avx2_ok ? &avx2 : NULL;
}
