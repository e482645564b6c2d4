/*
 * quant_ref.c - the scalar reference kernels: dequantize a row (to_float),
 * quantize activations (from_float) and dot a weight row with an activation
 * row (vec_dot), for every type strata supports.
 *
 * These are the ground truth every SIMD set is tested against, and they are
 * meant to produce the same numbers as llama.cpp's ggml: the quantizers are
 * ggml's quantize_row_q8_0_ref / quantize_row_q8_K_ref, the dequantizers its
 * dequantize_row_*, and the quantized dot products its *_generic versions,
 * with the integer sums and the float operations done in the same order (a
 * float sum done in another order gives another answer).  The float-type dot
 * products accumulate in double like ggml_vec_dot_f32/f16/bf16, and F16/BF16
 * weights are dotted with activations rounded to F16/BF16, as in ggml.
 *
 * All functions are pure and reentrant; the table is a constant.
 */
#include "quant.h"

#include <math.h>
#include <string.h>

/* ---- float types ------------------------------------------------------ */

static void f32_to_float(const void *src, float *dst, size_t n)
{
	memcpy(dst, src, n * sizeof(float));
}

static void f32_from_float(const float *src, void *dst, size_t n)
{
	memcpy(dst, src, n * sizeof(float));
}

static void f16_to_float(const void *src, float *dst, size_t n)
{
	const eng_fp16_t *x = src;

	for (size_t i = 0; i < n; i++)
		dst[i] = eng_fp16_to_fp32(x[i]);
}

static void bf16_to_float(const void *src, float *dst, size_t n)
{
	const eng_bf16_t *x = src;

	for (size_t i = 0; i < n; i++)
		dst[i] = eng_bf16_to_fp32(x[i]);
}

/* Each product is rounded to float, then summed in double (ggml_float). */
static void vec_dot_f32(size_t n, float *out, const void *w, const void *a)
{
	const float *x = w, *y = a;
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += (double)(x[i] * y[i]);
	*out = (float)sum;
}

/* F16 weights take F16 activations, as in ggml: the activation rounding is
 * part of the result the reference engine produces. */
static void vec_dot_f16(size_t n, float *out, const void *w, const void *a)
{
	const eng_fp16_t *x = w;
	const eng_fp16_t *y = a;
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += (double)(eng_fp16_to_fp32(x[i]) * eng_fp16_to_fp32(y[i]));
	*out = (float)sum;
}

/*
 * BF16 weights take BF16 activations, likewise, and the sum is done in the
 * order of ggml_vec_dot_bf16 as the reference's AVX2 build runs it: element
 * 32s + 8k + j into float accumulator (k, j), the accumulators folded as
 * (c0 + c2) + (c1 + c3), the 8 lanes reduced pairwise, the rest one at a time
 * in double.  The order matters more here than for F16: a bf16 activation
 * has 8 bits of mantissa, so a last-bit difference in one matmul's sum flips
 * the rounding of some inputs of the next, and the logits of a BF16 model
 * drift by about 0.02 sigma from the reference's with any other order, the
 * exact (double) sum included.  Each product of two bf16 is exact in float.
 */
static void vec_dot_bf16(size_t n, float *out, const void *w, const void *a)
{
	const eng_bf16_t *x = w;
	const eng_bf16_t *y = a;
	float c[4][8] = { { 0 } }, v[8];
	double sum = 0;
	size_t i = 0;

	for (; i + 32 <= n; i += 32)
		for (int k = 0; k < 4; k++)
			for (int j = 0; j < 8; j++)
				c[k][j] += eng_bf16_to_fp32(x[i + 8 * k + j]) *
					   eng_bf16_to_fp32(y[i + 8 * k + j]);
	if (i) {
		for (int j = 0; j < 8; j++)
			v[j] = (c[0][j] + c[2][j]) + (c[1][j] + c[3][j]);
		for (int j = 0; j < 4; j++)
			v[j] = v[4 + j] + v[j];
		sum = (v[0] + v[2]) + (v[1] + v[3]);
	}
	for (; i < n; i++)
		sum += (double)(eng_bf16_to_fp32(x[i]) * eng_bf16_to_fp32(y[i]));
	*out = (float)sum;
}

static void bf16_from_float(const float *src, void *dst, size_t n)
{
	eng_bf16_t *y = dst;

	for (size_t i = 0; i < n; i++)
		y[i] = eng_fp32_to_bf16(src[i]);
}

/* ---- Q4_0, Q8_0 ------------------------------------------------------- */

static void q4_0_to_float(const void *src, float *dst, size_t n)
{
	const struct eng_block_q4_0 *x = src;

	for (size_t i = 0; i < n / ENG_QK4_0; i++) {
		const float d = eng_fp16_to_fp32(x[i].d);

		for (int j = 0; j < ENG_QK4_0 / 2; j++) {
			const int x0 = (x[i].qs[j] & 0x0f) - 8;
			const int x1 = (x[i].qs[j] >> 4) - 8;

			dst[i * ENG_QK4_0 + j] = x0 * d;
			dst[i * ENG_QK4_0 + j + ENG_QK4_0 / 2] = x1 * d;
		}
	}
}

static void q8_0_to_float(const void *src, float *dst, size_t n)
{
	const struct eng_block_q8_0 *x = src;

	for (size_t i = 0; i < n / ENG_QK8_0; i++) {
		const float d = eng_fp16_to_fp32(x[i].d);

		for (int j = 0; j < ENG_QK8_0; j++)
			dst[i * ENG_QK8_0 + j] = x[i].qs[j] * d;
	}
}

/*
 * ggml stores roundf(x * id) straight into an int8_t, which is undefined for
 * NaN and out-of-range values.  Those only arise from inputs that are already
 * garbage (inf/NaN, or |x| < ~1e-37 making 1/d overflow); define them as
 * saturation with NaN -> 0 so the SIMD quantizers can match bit for bit.
 */
static int8_t sat_i8(float v)
{
	if (!(v == v))
		return 0;
	if (v > 127.0f)
		return 127;
	if (v < -128.0f)
		return -128;
	return (int8_t)v;
}

static void f16_from_float(const float *src, void *dst, size_t n)
{
	eng_fp16_t *y = dst;

	for (size_t i = 0; i < n; i++)
		y[i] = eng_fp32_to_fp16(src[i]);
}

static void q8_0_from_float(const float *src, void *dst, size_t n)
{
	struct eng_block_q8_0 *y = dst;

	for (size_t i = 0; i < n / ENG_QK8_0; i++) {
		const float *x = src + i * ENG_QK8_0;
		float amax = 0.0f;

		for (int j = 0; j < ENG_QK8_0; j++) {
			const float v = fabsf(x[j]);

			amax = amax > v ? amax : v; /* ggml's MAX(amax, v) */
		}
		/* This is ggml's x86 quantizer (the one the reference engine
		 * runs on this machine), not its portable one: id = 127/amax
		 * rather than 1/d, and ties to even rather than roundf.  The
		 * two differ in a few quants per row, and on models whose
		 * attention is sensitive that shows in the logits. */
		const float d = amax / 127.0f;
		const float id = amax != 0.0f ? 127.0f / amax : 0.0f;

		y[i].d = eng_fp32_to_fp16(d);
		for (int j = 0; j < ENG_QK8_0; j++)
			y[i].qs[j] = sat_i8(nearbyintf(x[j] * id));
	}
}

/* sumf plus the dot of one Q4_0 block and one Q8_0 block. */
static inline float dot_block_q4_0(const struct eng_block_q4_0 *x, const struct eng_block_q8_0 *y,
				   float sumf)
{
	int sumi0 = 0, sumi1 = 0;

	for (int j = 0; j < ENG_QK8_0 / 2; j++) {
		const int v0 = (x->qs[j] & 0x0f) - 8;
		const int v1 = (x->qs[j] >> 4) - 8;

		sumi0 += v0 * y->qs[j];
		sumi1 += v1 * y->qs[j + ENG_QK8_0 / 2];
	}
	const int sumi = sumi0 + sumi1;

	/* The order of ggml's x86 Q4_0 path (its repacked 8x8 gemv, what the
	 * reference engine runs here): one fused multiply-add per block with
	 * the two scales multiplied first. */
	return fmaf((float)sumi, eng_fp16_to_fp32(x->d) * eng_fp16_to_fp32(y->d), sumf);
}

static void vec_dot_q4_0_q8_0(size_t n, float *out, const void *w, const void *a)
{
	const struct eng_block_q4_0 *x = w;
	const struct eng_block_q8_0 *y = a;
	float sumf = 0.0f;

	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++)
		sumf = dot_block_q4_0(&x[ib], &y[ib], sumf);
	*out = sumf;
}

/* Q4_0_R16: each row's blocks taken out of the interleave, then Q4_0's sum. */
static void vec_dot16_q4_0_r16(size_t n, unsigned nt, float *out, size_t out_stride,
			       const void *w, size_t stride, const void *a, size_t a_stride)
{
	const struct eng_block_q4_0_r16 *x = w;

	(void)stride; /* the 16 rows are one run */
	for (unsigned t = 0; t < nt; t++) {
		const struct eng_block_q8_0 *y =
			(const struct eng_block_q8_0 *)((const uint8_t *)a + t * a_stride);

		for (unsigned r = 0; r < ENG_R16_ROWS; r++) {
			float sumf = 0.0f;

			for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
				struct eng_block_q4_0 b;

				eng_r16_to_q4_0(&x[ib], r, ENG_QK4_0, &b);
				sumf = dot_block_q4_0(&b, &y[ib], sumf);
			}
			out[t * out_stride + r] = sumf;
		}
	}
}

static void vec_dot_q8_0_q8_0(size_t n, float *out, const void *w, const void *a)
{
	const struct eng_block_q8_0 *x = w;
	const struct eng_block_q8_0 *y = a;
	float sumf = 0.0f;

	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		int sumi = 0;

		for (int j = 0; j < ENG_QK8_0; j++)
			sumi += x[ib].qs[j] * y[ib].qs[j];
		/* ggml: sumi * (dx * dy) -- note the other grouping from Q4_0 */
		sumf += (float)sumi * (eng_fp16_to_fp32(x[ib].d) * eng_fp16_to_fp32(y[ib].d));
	}
	*out = sumf;
}

/* ---- Q8_K ------------------------------------------------------------- */

/*
 * ggml's nearest_int: adding 1.5 * 2^23 leaves the rounded integer in the low
 * mantissa bits (round to nearest even, in the current rounding mode).  Valid
 * for |v| < 2^22; the quantizer never goes past 128.
 */
static int nearest_int(float v)
{
	const float t = v + 12582912.0f;
	int32_t i;

	memcpy(&i, &t, sizeof(i));
	return (i & 0x007fffff) - 0x00400000;
}

/*
 * The product fed to nearest_int must be rounded to float first, as ISO C
 * says; in GNU C modes (-ffp-contract=fast) a compiler may fuse it with the
 * add inside nearest_int into one FMA, and ties then round differently.
 */
static float rounded(float v)
{
	volatile float r = v;

	return r;
}

static void q8_k_to_float(const void *src, float *dst, size_t n)
{
	const struct eng_block_q8_k *x = src;

	for (size_t i = 0; i < n / ENG_QK_K; i++)
		for (int j = 0; j < ENG_QK_K; j++)
			dst[i * ENG_QK_K + j] = x[i].d * x[i].qs[j];
}

/*
 * The scale comes from the element of largest magnitude *with its sign*, the
 * first one if several tie: iscale = -127/max maps that element to -127, and
 * d = 1/iscale is negative when max is positive.  ggml changed -128 to -127
 * for IQ2_XXS; current ggml uses -127.
 */
static void q8_k_from_float(const float *src, void *dst, size_t n)
{
	struct eng_block_q8_k *y = dst;

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const float *x = src + i * ENG_QK_K;
		float max = 0.0f, amax = 0.0f;

		for (int j = 0; j < ENG_QK_K; j++) {
			const float ax = fabsf(x[j]);

			if (ax > amax) {
				amax = ax;
				max = x[j];
			}
		}
		if (!amax) {
			/* ggml leaves bsums stale here; zero is what they sum to */
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		const float iscale = -127.0f / max;

		for (int j = 0; j < ENG_QK_K; j++) {
			int v = nearest_int(rounded(iscale * x[j]));

			v = v < 127 ? v : 127;
			v = v > -128 ? v : -128; /* unreachable for finite x */
			y[i].qs[j] = (int8_t)v;
		}
		for (int j = 0; j < ENG_QK_K / 16; j++) {
			int sum = 0;

			for (int k = 0; k < 16; k++)
				sum += y[i].qs[j * 16 + k];
			y[i].bsums[j] = (int16_t)sum;
		}
		y[i].d = 1.0f / iscale;
	}
}

/* ---- Q4_K, Q5_K ------------------------------------------------------- */

/*
 * The 12 scale bytes hold eight 6-bit scales and eight 6-bit mins (ggml's
 * get_scale_min_k4).  Sub-blocks 0-3 use the low 6 bits of bytes 0-3
 * (scales) and 4-7 (mins); sub-blocks 4-7 take their low 4 bits from the
 * nibbles of bytes 8-11 and their top 2 bits from the spare top bits of
 * bytes 0-3 (scales) and 4-7 (mins).
 */
static void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

/*
 * Each 64 elements use 32 bytes of qs: the low nibbles are elements 0-31
 * (sub-block 2j), the high nibbles 32-63 (sub-block 2j+1).  x = d*sc*q - dmin*m.
 */
/* Q5_K is Q4_K with a fifth bit: bit 2j of qh[l] for element l of the low
 * nibbles of the j-th 64, bit 2j+1 for the high nibbles. */
static void k45_to_float(const void *src, float *dst, size_t n, bool five)
{
	const struct eng_block_q4_k *x4 = src;
	const struct eng_block_q5_k *x5 = src;

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const float d = eng_fp16_to_fp32(five ? x5[i].d : x4[i].d);
		const float min = eng_fp16_to_fp32(five ? x5[i].dmin : x4[i].dmin);
		const uint8_t *scales = five ? x5[i].scales : x4[i].scales;
		const uint8_t *ql = five ? x5[i].qs : x4[i].qs;
		const uint8_t *qh = five ? x5[i].qh : NULL;
		float *y = dst + i * ENG_QK_K;
		unsigned u1 = 1, u2 = 2;

		for (int is = 0; is < 8; is += 2) {
			uint8_t sc, m;

			k4_scale_min(is, scales, &sc, &m);
			const float d1 = d * sc, m1 = min * m;
			k4_scale_min(is + 1, scales, &sc, &m);
			const float d2 = d * sc, m2 = min * m;

			for (int l = 0; l < 32; l++)
				*y++ = d1 * ((ql[l] & 0x0f) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
			for (int l = 0; l < 32; l++)
				*y++ = d2 * ((ql[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
			ql += 32;
			u1 <<= 2;
			u2 <<= 2;
		}
	}
}

static void q4_k_to_float(const void *src, float *dst, size_t n)
{
	k45_to_float(src, dst, n, false);
}

static void q5_k_to_float(const void *src, float *dst, size_t n)
{
	k45_to_float(src, dst, n, true);
}

/*
 * The reference engine ran ggml's x86 K-quant kernels, whose float order its
 * results carry: a block is summed in 8 int32 lanes (lane k of each
 * 32-element chunk takes elements 4k..4k+3 times their scale), each block
 * adds d * lane into a float lane with one fused multiply-add, and the lanes
 * are summed at the end as (x4+x0)+(x6+x2) + (x5+x1)+(x7+x3).  The integer
 * parts are exact whatever the order; this keeps the float parts identical
 * to the reference and to quant_avx2.c.
 */
static void lanes_add(int32_t lane[8], const int8_t *q, const int8_t *y, int scale_lo,
		      int scale_hi)
{
	for (int k = 0; k < 8; k++) {
		int s = 0;

		for (int e = 4 * k; e < 4 * k + 4; e++)
			s += q[e] * y[e];
		lane[k] += (k < 4 ? scale_lo : scale_hi) * s;
	}
}

static float lanes_sum(const float x[8])
{
	return ((x[4] + x[0]) + (x[6] + x[2])) + ((x[5] + x[1]) + (x[7] + x[3]));
}

static void vec_dot_q45_k(size_t n, float *out, const void *w, const void *a, bool five)
{
	const struct eng_block_q8_k *y = a;
	const struct eng_block_q4_k *x4 = w;
	const struct eng_block_q5_k *x5 = w;
	float acc[8] = { 0 }, acc_m[4] = { 0 };

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		/* Q5_K is Q4_K with qh inserted before qs. */
		const eng_fp16_t xd = five ? x5[i].d : x4[i].d;
		const eng_fp16_t xdmin = five ? x5[i].dmin : x4[i].dmin;
		const uint8_t *scales = five ? x5[i].scales : x4[i].scales;
		const uint8_t *q4 = five ? x5[i].qs : x4[i].qs;
		const uint8_t *qh = five ? x5[i].qh : NULL;
		int8_t aux8[ENG_QK_K], *p = aux8;
		int32_t lane[8] = { 0 };
		uint8_t sc[8], mn[8];
		unsigned m = 1;

		for (int j = 0; j < ENG_QK_K / 64; j++) {
			for (int l = 0; l < 32; l++)
				p[l] = (int8_t)((q4[l] & 0x0f) + (qh && (qh[l] & m) ? 16 : 0));
			p += 32;
			m <<= 1;
			for (int l = 0; l < 32; l++)
				p[l] = (int8_t)((q4[l] >> 4) + (qh && (qh[l] & m) ? 16 : 0));
			p += 32;
			m <<= 1;
			q4 += 32;
		}
		for (int j = 0; j < 8; j++)
			k4_scale_min(j, scales, &sc[j], &mn[j]);

		/* mins: bsums in pairs, times the mins, in 4 lanes */
		const float dmin = -y[i].d * eng_fp16_to_fp32(xdmin);
		for (int k = 0; k < 4; k++) {
			const int s0 = y[i].bsums[4 * k] + y[i].bsums[4 * k + 1];
			const int s1 = y[i].bsums[4 * k + 2] + y[i].bsums[4 * k + 3];

			acc_m[k] = fmaf(dmin, (float)(mn[2 * k] * s0 + mn[2 * k + 1] * s1), acc_m[k]);
		}
		for (int t = 0; t < 8; t++)
			lanes_add(lane, aux8 + 32 * t, y[i].qs + 32 * t, sc[t], sc[t]);
		const float d = y[i].d * eng_fp16_to_fp32(xd);
		for (int k = 0; k < 8; k++)
			acc[k] = fmaf(d, (float)lane[k], acc[k]);
	}
	*out = lanes_sum(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
}

static void vec_dot_q4_k_q8_k(size_t n, float *out, const void *w, const void *a)
{
	vec_dot_q45_k(n, out, w, a, false);
}

static void vec_dot_q5_k_q8_k(size_t n, float *out, const void *w, const void *a)
{
	vec_dot_q45_k(n, out, w, a, true);
}

/* ---- Q6_K ------------------------------------------------------------- */

/*
 * Each 128 elements use 64 bytes of ql and 32 of qh.  For l < 32:
 *   element l      = low  nibble of ql[l]      | qh[l] bits 0-1 << 4
 *   element l + 32 = low  nibble of ql[l + 32] | qh[l] bits 2-3 << 4
 *   element l + 64 = high nibble of ql[l]      | qh[l] bits 4-5 << 4
 *   element l + 96 = high nibble of ql[l + 32] | qh[l] bits 6-7 << 4
 * minus 32; each 16 elements have a signed 8-bit scale.
 */
static void q6_k_to_float(const void *src, float *dst, size_t n)
{
	const struct eng_block_q6_k *x = src;

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const float d = eng_fp16_to_fp32(x[i].d);
		const uint8_t *ql = x[i].ql, *qh = x[i].qh;
		const int8_t *sc = x[i].scales;
		float *y = dst + i * ENG_QK_K;

		for (int h = 0; h < ENG_QK_K / 128; h++) {
			for (int l = 0; l < 32; l++) {
				const int is = l / 16;
				const int8_t q1 = (int8_t)((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
				const int8_t q2 = (int8_t)((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
				const int8_t q3 = (int8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
				const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;

				y[l] = d * sc[is] * q1;
				y[l + 32] = d * sc[is + 2] * q2;
				y[l + 64] = d * sc[is + 4] * q3;
				y[l + 96] = d * sc[is + 6] * q4;
			}
			y += 128;
			ql += 64;
			qh += 32;
			sc += 8;
		}
	}
}

static void vec_dot_q6_k_q8_k(size_t n, float *out, const void *w, const void *a)
{
	const struct eng_block_q6_k *x = w;
	const struct eng_block_q8_k *y = a;
	float acc[8] = { 0 };

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const uint8_t *ql = x[i].ql, *qh = x[i].qh;
		int8_t aux8[ENG_QK_K], *p = aux8;
		int32_t lane[8] = { 0 };

		for (int h = 0; h < ENG_QK_K / 128; h++) {
			for (int l = 0; l < 32; l++) {
				p[l] = (int8_t)((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
				p[l + 32] = (int8_t)((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
				p[l + 64] = (int8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
				p[l + 96] = (int8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
			}
			p += 128;
			ql += 64;
			qh += 32;
		}
		/* chunk t: elements 0-15 use scale 2t, 16-31 scale 2t+1 */
		for (int t = 0; t < 8; t++)
			lanes_add(lane, aux8 + 32 * t, y[i].qs + 32 * t, x[i].scales[2 * t],
				  x[i].scales[2 * t + 1]);
		const float d = y[i].d * eng_fp16_to_fp32(x[i].d);
		for (int k = 0; k < 8; k++)
			acc[k] = fmaf(d, (float)lane[k], acc[k]);
	}
	*out = lanes_sum(acc);
}

/* ---- the table -------------------------------------------------------- */

static const struct eng_kernels ref = {
	.isa = "scalar",
	.to_float = {
		[ENG_TYPE_F32] = f32_to_float,
		[ENG_TYPE_F16] = f16_to_float,
		[ENG_TYPE_BF16] = bf16_to_float,
		[ENG_TYPE_Q4_0] = q4_0_to_float,
		[ENG_TYPE_Q8_0] = q8_0_to_float,
		[ENG_TYPE_Q4_K] = q4_k_to_float,
		[ENG_TYPE_Q5_K] = q5_k_to_float,
		[ENG_TYPE_Q6_K] = q6_k_to_float,
		[ENG_TYPE_Q8_K] = q8_k_to_float,
	},
	.from_float = {
		[ENG_TYPE_F32] = f32_from_float,
		[ENG_TYPE_F16] = f16_from_float,
		[ENG_TYPE_BF16] = bf16_from_float,
		[ENG_TYPE_Q8_0] = q8_0_from_float,
		[ENG_TYPE_Q8_K] = q8_k_from_float,
	},
	.vec_dot = {
		[ENG_TYPE_F32] = vec_dot_f32,
		[ENG_TYPE_F16] = vec_dot_f16,
		[ENG_TYPE_BF16] = vec_dot_bf16,
		[ENG_TYPE_Q4_0] = vec_dot_q4_0_q8_0,
		[ENG_TYPE_Q8_0] = vec_dot_q8_0_q8_0,
		[ENG_TYPE_Q4_K] = vec_dot_q4_k_q8_k,
		[ENG_TYPE_Q5_K] = vec_dot_q5_k_q8_k,
		[ENG_TYPE_Q6_K] = vec_dot_q6_k_q8_k,
	},
	.vec_dot16 = {
		[ENG_TYPE_Q4_0_R16] = vec_dot16_q4_0_r16,
	},
};

const struct eng_kernels *eng_kernels_ref(void)
{
	return &ref;
}
