/*
 * quant_x86_i.h - what the x86 kernel sets (quant_avx2.c, quant_avx512.c)
 * share: the baseline target for code that runs before the cpuid check,
 * scale conversions and reductions, the Q6_K unpacking, and the prefetch
 * distance of the multi-row kernels.  Everything is static inline and is compiled with the
 * flags (or target attributes) of the kernel using it.
 */
#ifndef STRATA_QUANT_X86_I_H
#define STRATA_QUANT_X86_I_H

#include "quant.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

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

static inline int32_t hsum_i32x4(__m128i v)
{
	v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
	v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 1));
	return _mm_cvtsi128_si32(v);
}

/*
 * Holds vector v in a register, as it is at this point.  Two uses:
 *   - a vector of quants loaded once: GCC otherwise reads it again as the
 *     memory operand of each operation that uses it, and most of those
 *     loads cross two lines (a Q4_K block is 144 bytes, a Q6_K block 210):
 *     holding them gained 3-4% a core from L2 and from memory
 *     (docs/benchmarks.md, issue 16, session 53);
 *   - each token's int32 sum in the multi-token kernels, one running
 *     register: GCC otherwise reassociates the integer adds of the
 *     unrolled loops (legal: integers) into a tree over every product, and
 *     with eight tokens those products spill to the stack, two stores and
 *     two reloads per token and 64 elements.
 */
#define K_IN_REGISTER(v) __asm__("" : "+x"(v))

/*
 * The 6-bit quants (0..63) of 128 Q6_K elements: the low 4 bits from 64
 * bytes of ql, the high 2 from 32 bytes of qh, q[k] = elements 32k..32k+31.
 * Each 2-bit field of qh is shifted to bits 4-5 of its byte and masked
 * there (a 16-bit shift by up to 4 never brings the other byte's bits
 * into them).
 */
static inline void q6_k_unpack(const uint8_t *ql, const uint8_t *qh, __m256i q[4])
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	const __m256i m30 = _mm256_set1_epi8(0x30);
	__m256i b1 = _mm256_loadu_si256((const void *)ql);
	__m256i b2 = _mm256_loadu_si256((const void *)(ql + 32));
	__m256i bh = _mm256_loadu_si256((const void *)qh);

	K_IN_REGISTER(b1);
	K_IN_REGISTER(b2);
	K_IN_REGISTER(bh);

	q[0] = _mm256_or_si256(_mm256_and_si256(b1, m4),
			       _mm256_and_si256(_mm256_slli_epi16(bh, 4), m30));
	q[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
			       _mm256_and_si256(_mm256_slli_epi16(bh, 2), m30));
	q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
			       _mm256_and_si256(bh, m30));
	q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
			       _mm256_and_si256(_mm256_srli_epi16(bh, 2), m30));
}

/*
 * A Q4_K or Q5_K block's 12 scale bytes b0..b11 to its eight scales and
 * eight mins, a byte each (see quant_ref.c's k4_scale_min):
 *   sc_j = b_j & 63, mn_j = b_{j+4} & 63                          (j < 4)
 *   sc_{j+4} = (b_{j+8} & 15) | (b_j >> 6) << 4
 *   mn_{j+4} = (b_{j+8} >> 4) | (b_{j+4} >> 6) << 4
 * eight at a time in two 64-bit general registers: *sc = sc0..sc7 and *mn =
 * mn0..mn7, byte j in bits 8j..8j+7.  In the one-row kernels the vector
 * pipes are the busy ones and the integer ALUs idle: in vector registers
 * (three pshufbs, shifts and masks, then a widening and an insert) this
 * was a sixth of a block's vector instructions, and here it is two moves
 * into them (k_scales, k_mins).  One core's AVX2 Q4_K one-row kernel, Zen
 * 5: 1.2x (docs/benchmarks.md, issue 17, session 45).
 */
static inline void k4_scales_mins(const uint8_t *p, uint64_t *sc, uint64_t *mn)
{
	uint64_t l; /* b0..b7 */
	uint32_t h; /* b8..b11 */

	memcpy(&l, p, 8);
	memcpy(&h, p + 8, 4);
	/* [sc0..3 | mn0..3] */
	const uint64_t low = l & 0x3f3f3f3f3f3f3f3full;
	/* [sc4..7 | mn4..7]: the nibbles of b8..b11, low then high, and the
	 * top two bits of b0..b7 as bits 4-5 */
	const uint64_t high = (((uint64_t)h | (uint64_t)h << 28) & 0x0f0f0f0f0f0f0f0full) |
			      ((l >> 2) & 0x3030303030303030ull);

	*sc = (low & 0xffffffffu) | high << 32;
	*mn = low >> 32 | (high & 0xffffffff00000000ull);
}

/* The scales in every 64 bits, for k_scale and k_scale_pair. */
static inline __m256i k_scales(uint64_t sc)
{
	return _mm256_set1_epi64x((long long)sc);
}

/*
 * Scale s (0..7) of k_scales' vector as an int16 in every lane: one pshufb
 * (a mask byte with its top bit set gives 0, the high byte).  (A store of
 * the scales in pairs and broadcast loads of them was faster on an Intel
 * Xeon, whose one shuffle port was the busiest; on the Zen 5 the pshufb is
 * 1.3-1.4x: the stores and reloads cost more than the shuffles.)
 */
static inline __attribute__((always_inline)) __m256i k_scale(__m256i scales, int s)
{
	return _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0xff00 | s)));
}

/* Scales 2j and 2j + 1 as int16s, [s_2j, s_2j+1] in every dword. */
static inline __attribute__((always_inline)) __m256i k_scale_pair(__m256i scales, int j)
{
	return _mm256_shuffle_epi8(scales,
				   _mm256_set1_epi32((int)(0xff00ff00u | (2u * j + 1) << 16 | 2u * j)));
}

/* The mins as int16s, [mn0..mn7]. */
static inline __m128i k_mins(uint64_t mn)
{
	return _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn));
}

/*
 * What a Q8_K block gives every K-quant row it meets: its bsums summed in
 * pairs (the int16s the eight mins of a Q4_K or Q5_K block multiply) and
 * y.d.  The one-row kernels work them out for each block (k_q8_sums_of),
 * or read them from a table that a call of several rows made once
 * (k_q8_sums_make): a load in place of four operations a block and row.
 */
struct k_q8_sums {
	int16_t q8s[8]; /* bsums[2k] + bsums[2k + 1] */
	float d;
};

static inline __m128i k_q8_sums_of(const struct eng_block_q8_k *y)
{
	return _mm_hadd_epi16(_mm_loadu_si128((const void *)y->bsums),
			      _mm_loadu_si128((const void *)(y->bsums + 8)));
}

static inline void k_q8_sums_make(struct k_q8_sums *S, const struct eng_block_q8_k *y, size_t nb)
{
	for (size_t i = 0; i < nb; i++) {
		_mm_storeu_si128((void *)S[i].q8s, k_q8_sums_of(&y[i]));
		S[i].d = y[i].d;
	}
}

/*
 * Q5_K's fifth bits: bit b (0..7) of every byte of h moved to bit 4 of its
 * byte by one 16-bit shift or none, for an AND with 16 to make the quant's
 * 16.  The other bits are the neighbours' (a shift down is at most 3 places,
 * so bit 4 never comes from the other byte).  b must be a constant: unroll
 * the loop it is in.
 */
static inline __attribute__((always_inline)) __m256i bit_to_4(__m256i h, int b)
{
	switch (b) {
	case 0: return _mm256_slli_epi16(h, 4);
	case 1: return _mm256_slli_epi16(h, 3);
	case 2: return _mm256_slli_epi16(h, 2);
	case 3: return _mm256_slli_epi16(h, 1);
	case 4: return h;
	case 5: return _mm256_srli_epi16(h, 1);
	case 6: return _mm256_srli_epi16(h, 2);
	default: return _mm256_srli_epi16(h, 3);
	}
}

/* The 5-bit quants (0..31) of Q5_K's 64-element chunk j: the nibbles of its
 * 32 bytes bits (low: elements 0..31, high: 32..63) and the fifth bits 2j
 * and 2j + 1 of hbits (the block's qh), as 16.  j must be a constant. */
static inline __attribute__((always_inline)) void q5_k_quants(__m256i bits, __m256i hbits, int j,
							      __m256i *ql, __m256i *qh)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f), sixteen = _mm256_set1_epi8(16);

	*ql = _mm256_or_si256(_mm256_and_si256(bits, m4),
			      _mm256_and_si256(bit_to_4(hbits, 2 * j), sixteen));
	*qh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
			      _mm256_and_si256(bit_to_4(hbits, 2 * j + 1), sixteen));
}

/*
 * The shared madd of the K-quant prompt kernels.  A row's block lanes are
 * fixed (int32 lane k: sum over the 32-element sub-blocks j of s_j S_j,k,
 * with S_j,k the four products of elements 4k..4k+3 of sub-block j), not
 * the instructions.  Two sub-blocks l (2m) and h (2m + 1) share one madd if
 * int16 lane 2k holds S_l,k and lane 2k + 1 S_h,k: that is
 *   maddubs(A, Y_A) + maddubs(B, Y_B)   (16-bit add)
 * with, in dword k, A = [l0 l1 h2 h3] and B = [l2 l3 h0 h1] (element 4k + i
 * of each as li, hi), on both the weight and the activation side; a madd
 * against [s_l, s_h] in every dword then gives s_l S_l,k + s_h S_h,k.
 * Three multiplies a token and 64 elements instead of four.  The 16-bit
 * sum of four products stays within 4 * 255 * 32 (Q6_K's y + 128 against
 * q - 32; Q4_K: 4 * 15 * 128): no saturation.  Pure byte moves, so they
 * serve weights and activations, signed or not.
 */
static inline __m256i k4_pair_a(__m256i l, __m256i h)
{
	return _mm256_blend_epi16(l, h, 0xaa);
}

static inline __m256i k4_pair_b(__m256i l, __m256i h)
{
	return _mm256_or_si256(_mm256_srli_epi32(l, 16), _mm256_slli_epi32(h, 16));
}

/* Q8_K's pack8 (pack8_q8_k): the Q8_K row, y + 128, y.d, the k4_pair quants. */
#define PACK8_Q8_K_BLOCK (sizeof(struct eng_block_q8_k) + ENG_QK_K + sizeof(float) + ENG_QK_K)

/*
 * Where pack8_q8_k puts its parts in a packed row of nb blocks: the Q8_K
 * row at the start, then y + 128 (yu), each block's y.d (yd), then the
 * k4_pair quants (ys), the two that the kernels read 32 bytes at a time each
 * on a cache line's start when the row's start is on one (matmul.c's
 * activations are: forward.c, qact).  A Q8_K block is 292 bytes, so with
 * 3584 columns (14 blocks) the parts back to back began 56 and 48 bytes
 * into a line, and every other 32-byte load crossed two.  At most two
 * lines' room more than PACK8_Q8_K_BLOCK a block (ENG_PACK8_BYTES).
 */
struct pack8_q8_k_at {
	size_t yu, yd, ys; /* byte offsets in the packed row */
};

static inline struct pack8_q8_k_at pack8_q8_k_at(size_t nb)
{
	struct pack8_q8_k_at at;

	at.yu = (nb * sizeof(struct eng_block_q8_k) + 63) & ~(size_t)63;
	at.yd = at.yu + nb * ENG_QK_K;
	at.ys = (at.yd + nb * sizeof(float) + 63) & ~(size_t)63;
	return at;
}

/*
 * A Q8_0 activation block as the eight- and sixteen-row Q4_0 kernels read it
 * (pack8_q4_0 in quant_avx2.c makes it; both sets use it): their maddubs or
 * vpdpbusd take the nibbles unsigned (0..15), so each block sum starts from
 * -8 * sum(y); the scale as float; the 32 int8 as dwords, each broadcast to
 * the eight or sixteen rows.  One 40-byte record, one stream per token.
 */
struct q8_0s {
	int32_t base;      /* -8 * sum(qs) */
	float d;           /* the fp16 scale, as float (exact) */
	int32_t qs[8];     /* the block's 32 int8, as dwords */
};
_Static_assert(sizeof(struct q8_0s) * 4 <= ENG_PACK8_BYTES(4 * ENG_QK8_0), "q8_0s");

/*
 * Memory: the multi-row kernels read 8 or 16 rows side by side, interleaved
 * streams of 18- or 34-byte steps, which the hardware prefetcher follows
 * poorly (half of the single-stream bandwidth, measured).  The rows of a
 * matrix lie back to back, so the block loops also prefetch, linearly, the
 * rows two calls ahead, at the pace they read (8 rows of Q4_0: 144 bytes per
 * block).  A prefetch past the matrix is harmless (it never faults).
 */
#define Q4_0_PREFETCH_ROWS 16 /* two calls of eight rows */

/*
 * The K-quant kernels read one row at a time, a single stream the hardware
 * prefetcher follows, yet a prefetch of the row k_prefetch_rows ahead, at
 * the same offset, still makes decode faster: the hardware prefetcher runs
 * only a few lines ahead, too few to cover the memory latency with two
 * cores reading.  Rows of a GGUF matrix are back to back, so row
 * i + k_prefetch_rows starts k_prefetch_rows row lengths on.
 *
 * Where the lines go and how far ahead is the CPU's, chosen once when the
 * kernel sets are built (k_prefetch_choose, quant_avx2.c):
 *   - Zen 5: T0 (into L1 and L2) at 8 rows.  T1 at 16 read 1-6% slower
 *     whenever the memory was fast (two threads of the Q4_K and Q6_K
 *     one-row kernels, from memory; NTA was as fast at 4096 columns and
 *     slower at 12288: docs/benchmarks.md, issue 16, session 49).
 *   - any other CPU: T1 (into L2) at 16 rows.  On a Zen 4, T0 at 8 rows
 *     read 0.65-0.75 as fast from memory (one core, the avx512 Q4_K and
 *     Q6_K one-row kernels) and decoded 8B models 0.65-0.75 as fast at
 *     the memory's fast speed (session 52); on an Intel Xeon T1 at 16
 *     was 4-11% faster than no prefetch.
 * The same hint serves the Q4_0 and Q8_0 row prefetches.
 */
extern unsigned k_prefetch_rows;
extern bool k_prefetch_l1;

static inline __attribute__((always_inline)) void k_prefetch(const void *p)
{
	if (k_prefetch_l1)
		_mm_prefetch((const char *)p, _MM_HINT_T0);
	else
		_mm_prefetch((const char *)p, _MM_HINT_T1);
}

#endif
