/*
 * quant_avx512_i.h - what the avx512 kernel set's two files share: the
 * target attributes their kernels carry, the Q4_K scale unpacking both use,
 * and the prompt kernels (quant_avx512_prompt.c) that quant_avx512.c's
 * vec_dotn kernels hand every call of two tokens or more.
 */
#ifndef STRATA_QUANT_AVX512_I_H
#define STRATA_QUANT_AVX512_I_H

#include "quant_x86_i.h"

#include <immintrin.h>

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
/* Needs AVX-512BW and VBMI besides VNNI (vpermb, vpermt2b): kernels with it
 * are chosen at start-up only where the CPU has them. */
#define VBMI                                                                                       \
	__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vbmi,avx512vnni")))

/*
 * The 12 scale bytes b0..b11 (loaded with the 4 bytes after them) to
 * [sc0..sc7, mn0..mn7] in a vector register, with VBMI's two-source byte
 * permute (quant_x86_i.h's k4_scales_mins does it in general registers,
 * for the AVX2 kernels):
 *   sc_j = b_j & 63, mn_j = b_{j+4} & 63                          (j < 4)
 *   sc_{j+4} = (b_{j+8} & 15) | (b_j >> 6) << 4
 *   mn_{j+4} = (b_{j+8} >> 4) | (b_{j+4} >> 6) << 4
 * The 16-bit shifts pull bits of the next byte into the top of the low one;
 * the masks drop them.
 */
VBMI static inline __attribute__((always_inline)) __m128i k4_scales_mins_vbmi(const uint8_t *p)
{
	const __m128i v = _mm_loadu_si128((const void *)p);
	/* [b0..3, b8..11, b4..7, (b8..11) >> 4] */
	const __m128i t = _mm_permutex2var_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7,
								   24, 25, 26, 27),
						_mm_srli_epi16(v, 4));
	/* [0, b0..3, 0, b4..7] >> 6 << 4 */
	const __m128i b = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1,
							    4, 5, 6, 7));
	const __m128i bh = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30));
	const __m128i m = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);

	return _mm_ternarylogic_epi32(t, m, bh, 0xea); /* (t & m) | bh */
}

/* The same for two blocks at once, p0's in the low 128-bit half and p1's in
 * the high (the byte shuffle works within a half, the permute across both).
 * The one-block form stays 128-bit: the 256-bit permute's longer latency
 * cost the prompt kernel 1% (strata-kbench --tokens 8, Zen 4). */
VBMI static inline __attribute__((always_inline)) __m256i k4_scales_mins2_vbmi(const uint8_t *p0,
									     const uint8_t *p1)
{
	const __m256i v = _mm256_inserti128_si256(
		_mm256_castsi128_si256(_mm_loadu_si128((const void *)p0)),
		_mm_loadu_si128((const void *)p1), 1);
	const __m256i t = _mm256_permutex2var_epi8(
		v,
		_mm256_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 40, 41, 42, 43, 16, 17, 18, 19,
				 24, 25, 26, 27, 20, 21, 22, 23, 56, 57, 58, 59),
		_mm256_srli_epi16(v, 4));
	const __m256i b = _mm256_shuffle_epi8(
		v, _mm256_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1,
				    -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
	const __m256i bh = _mm256_and_si256(_mm256_srli_epi16(b, 2), _mm256_set1_epi8(0x30));
	const __m256i m = _mm256_broadcastsi128_si256(
		_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));

	return _mm256_ternarylogic_epi32(t, m, bh, 0xea);
}

/*
 * nrows (1 or more: a matmul chunk) rows of w (stride bytes apart) by nt
 * (1 or more; two or more is what they are for) tokens of a (a_stride
 * apart, the set's activation rows: Q8_K, or Q8_0 for avx512_prompt_q8_0),
 * out[t * out_stride + r]; each row and token bit-identical to the one-row
 * kernel of quant_avx512.c.
 */
VBMI void avx512_prompt_q4_k(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			     const void *w, size_t stride, const void *a, size_t a_stride);
VBMI void avx512_prompt_q6_k(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			     const void *w, size_t stride, const void *a, size_t a_stride);
VNNI void avx512_prompt_q8_0(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			     const void *w, size_t stride, const void *a, size_t a_stride);

#endif
