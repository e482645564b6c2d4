/*
 * quant_x86_i.h - what the x86 kernel sets (quant_avx2.c, quant_avx512.c)
 * share: the baseline target for code that runs before the cpuid check,
 * scale conversions and reductions, and the eight-row Q4_0 block loader the
 * AVX2 and VNNI vec_dot8 kernels both use.  Everything is static inline and
 * is compiled with the flags (or target attributes) of the kernel using it.
 */
#ifndef STRATA_QUANT_X86_I_H
#define STRATA_QUANT_X86_I_H

#include "quant.h"

#include <immintrin.h>
#include <stdint.h>

/*
 * The code that runs before the cpuid check (and the table set-up, which the
 * compiler would otherwise happily vectorize with VEX instructions) is built
 * for the SSE2 baseline ("no-sse3" also turns off everything above it), so
 * that asking for this set on an old CPU returns NULL instead of dying with
 * SIGILL.
 */
#define BASELINE __attribute__((target("no-sse3")))

static inline float fp16(eng_fp16_t h)
{
	return _cvtsh_ss(h);
}

/* One scale on 8 lanes: a broadcast load and one conversion. */
static inline __m256 fp16x8(eng_fp16_t h)
{
	return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
}

static inline float hsum_f32x8(__m256 v)
{
	__m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));

	r = _mm_add_ps(r, _mm_movehl_ps(r, r));
	r = _mm_add_ss(r, _mm_movehdup_ps(r));
	return _mm_cvtss_f32(r);
}

/*
 * Eight Q4_0 rows against nt activation rows, each row's result
 * bit-identical to vec_dot_q4_0_q8_0: per block, each row's exact integer
 * sum goes into lane r of one vector, and one vector FMA does in lane r what
 * the scalar chain does for row r, fmaf(sum, d_x * d_y, acc) in block order.
 * Eight chains in flight instead of one, and the nibbles unpacked once for
 * all nt tokens.
 *
 * Layout: rows r and r + 4 share a vector, row r in the low 128 bits.  Their
 * 16 raw bytes side by side give, masked, elements 0-15 of both rows (4
 * dwords each), and shifted, elements 16-31; the activations are broadcast
 * to both halves (16 bytes each way), so no byte is moved across lanes.  Each
 * row then has four int32 partial sums, and an unpack-and-add tree
 * (integers: exact in any order) leaves row r's block sum in lane r.  (Not
 * hadd: Zen 4 issues one every two cycles.)
 *
 * Memory: eight rows are eight interleaved streams of 18-byte steps, which
 * the hardware prefetcher follows poorly (half of the single-stream
 * bandwidth, measured).  The rows of a matrix lie back to back, so the block
 * loop also prefetches, linearly, the eight rows two calls ahead: 144 bytes
 * per block, the same pace as it reads.  A prefetch past the matrix is
 * harmless (it never faults).  Q8_0's vec_dot8 does the same.
 */
#define Q4_0_PREFETCH_ROWS 16

struct q4_0_x8 {
	__m256i lo[4], hi[4]; /* rows p | p + 4: elements 0-15, 16-31 */
	__m256 d;             /* the rows' scales, lane r = row r */
};

static inline __attribute__((always_inline)) void
q4_0_load8(struct q4_0_x8 *x, const uint8_t *rows, size_t stride, size_t ib)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	const uint8_t *pf = rows + Q4_0_PREFETCH_ROWS * stride +
			    ((ib * 8 * sizeof(struct eng_block_q4_0)) & ~(size_t)63);
	uint64_t d0 = 0, d1 = 0;

	for (int p = 0; p < 4; p++) {
		const struct eng_block_q4_0 *xa =
			(const struct eng_block_q4_0 *)(rows + (size_t)p * stride) + ib;
		const struct eng_block_q4_0 *xb =
			(const struct eng_block_q4_0 *)(rows + (size_t)(p + 4) * stride) + ib;
		const __m256i raw = _mm256_loadu2_m128i((const void *)xb->qs,
							(const void *)xa->qs);

		x->lo[p] = _mm256_and_si256(raw, m4);
		x->hi[p] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
		/* the scales gathered in general registers: no vector
		 * shuffle, no store-forwarding stall */
		d0 |= (uint64_t)xa->d << (16 * p);
		d1 |= (uint64_t)xb->d << (16 * p);
	}
	x->d = _mm256_cvtph_ps(_mm_set_epi64x((long long)d1, (long long)d0));
	_mm_prefetch((const char *)pf, _MM_HINT_T1);
	_mm_prefetch((const char *)pf + 64, _MM_HINT_T1);
	_mm_prefetch((const char *)pf + 128, _MM_HINT_T1);
}

/* Four vectors of [row p: 4 lanes | row p + 4: 4 lanes] to lane r = row r. */
static inline __m256i q4_0_lanes(const __m256i s[4])
{
	const __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[0], s[1]),
					     _mm256_unpackhi_epi32(s[0], s[1]));
	const __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(s[2], s[3]),
					     _mm256_unpackhi_epi32(s[2], s[3]));

	return _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
}

#endif
