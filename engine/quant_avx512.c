/*
 * quant_avx512.c - the avx512 kernel set: the AVX2 set with the kernels that
 * AVX-512 VNNI (vpdpbusd, vpdpwssd) makes faster.
 *
 * Built with the AVX2 flags like quant_avx2.c; the kernels here carry their
 * own target attribute, and the table set-up is built for the baseline, so
 * nothing in this file runs on a CPU without AVX-512 VNNI.  256-bit vectors
 * where the work fits them: Zen 4 splits 512-bit operations in two.  The
 * exceptions, for the reasons given there: the Q4_0 kernel, and the
 * prompt kernels of Q4_K, Q6_K and Q8_0 (two tokens a vector), which are a
 * story of their own in quant_avx512_prompt.c; this file's vec_dotn kernels
 * hand them every call of two tokens or more.
 *
 * Numerics: every kernel gives the bits of the AVX2 kernel it replaces
 * (tests/test_quant.c checks each against it, and the Q4_0 ones against
 * vec_dot, as all vec_dot8s): the integer sums are exact
 * whatever the instructions, and the float operations are the same ones in
 * the same order.
 *
 * One exception, in a set of its own (avx512bf16, asked for by STRATA_ISA):
 * BF16 with AVX-512 BF16 (vdpbf16ps), where the CPU has it, as the reference
 * engine's builds for such CPUs use it.  It adds neighbouring products first,
 * an order no other kernel can follow, so its results differ from the AVX2
 * kernel's in the last bits (tests/test_quant.c checks it against the scalar
 * reference instead), and a BF16 model's logits by about 0.02 sigma from a
 * reference made with ggml's AVX2 kernel (quant_ref.c says why): that is why
 * it is not the default.
 *
 * Threading: the table is built once under pthread_once; the kernels are
 * pure.
 */
#include "quant_avx512_i.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* ---- Q4_0 ------------------------------------------------------------- */

/*
 * Q4_0 rows against nt tokens, lane r of each vector = weight row r.  Per
 * block, the rows' 16 quant bytes are transposed as dwords once (V_k lane r
 * = dword k of row r), so V_k & 15 holds elements 4k..4k+3 of every row and
 * (V_k >> 4) & 15 elements 16+4k..16+4k+3.  A token then takes 8 vpdpbusd,
 * each with one dword of its activations broadcast from memory, and leaves
 * row r's exact block sum in lane r with no reduction; one FMA per block and
 * token with d_x * d_y does in lane r what vec_dot_q4_0_q8_0 does for row r,
 * so the bits are the same.
 *
 * vpdpbusd takes the nibbles unsigned (0..15), so each sum starts from
 * -8 * sum(y), which pack8 computes once per activation row, with the scale
 * as float: a token's block is one 40-byte record (struct q8_0s; the AVX2
 * set's pack8 makes it) with aligned dwords, one stream per token.
 *
 * The tokens are interleaved, nt vpdpbusd chains side by side: one token
 * after the other (a chain of 8 dependent vpdpbusd, 4 cycles each, per
 * block) ran 10-15% slower.  gcc does not fold _mm256_set1_epi32 of a load
 * into vpdpbusd's embedded broadcast; a separate vpbroadcastd for every
 * dword cost another 10% (measured), so the instruction is written out.
 *
 * 16 rows in 512-bit vectors: Zen 4 splits them in two, but each broadcast
 * load and instruction serves 16 rows, and the loop was bound by loads and
 * instructions, not by vpdpbusd (8 rows in 256-bit vectors: 108 GMAC/s on
 * one core, 16 rows: 136, an 8B-shaped matrix and 64 tokens).  With 8 rows
 * (vec_dot8, for the rows a 16-row tile leaves, and decoding: see
 * vec_dot16_q4_0_vnni) the upper half is zero.
 * Before this layout: rows r and r + 4 in one vector, as quant_avx2.c had,
 * four partial sums per row and an unpack-and-add tree per token: 77.
 */

VNNI static inline __attribute__((always_inline)) __m512i
dpbusd_bcast(__m512i acc, __m512i u, const int32_t *p)
{
	__asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*p));
	return acc;
}

/* One block of the 16 (or 8) rows at rows, transposed: lo[k] and hi[k] lane r
 * = the nibbles of dword k of row r, dx lane r = row r's scale. */
VNNI static inline __attribute__((always_inline)) void
q4_0_rows(const unsigned nrows, const uint8_t *rows, size_t stride, size_t ib, __m512i lo[4],
	  __m512i hi[4], __m512 *dx)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const uint8_t *pf = rows + 2 * nrows * stride +
			    ((ib * nrows * sizeof(struct eng_block_q4_0)) & ~(size_t)63);
	uint64_t d[4] = { 0, 0, 0, 0 };
	__m512i raw[4];

	/* raw[p], 128-bit lane j: row p + 4j; the scales gathered in general
	 * registers (no vector shuffle) */
	for (int p = 0; p < 4; p++) {
		for (unsigned j = 0; j < nrows / 4; j++) {
			const struct eng_block_q4_0 *x =
				(const struct eng_block_q4_0 *)(rows + (p + 4 * j) * stride) + ib;
			const __m128i q = _mm_loadu_si128((const void *)x->qs);

			raw[p] = j == 0   ? _mm512_zextsi128_si512(q)
				 : j == 1 ? _mm512_inserti32x4(raw[p], q, 1)
				 : j == 2 ? _mm512_inserti32x4(raw[p], q, 2)
					  : _mm512_inserti32x4(raw[p], q, 3);
			d[j] |= (uint64_t)x->d << (16 * p);
		}
	}
	for (unsigned l = 0; l < (nrows * sizeof(struct eng_block_q4_0) + 127) / 64; l++)
		k_prefetch((const char *)pf + 64 * l);

	/* 4x4 dword transposes in each 128-bit lane: lane 4j + i of v[k] =
	 * dword k of row 4j + i */
	const __m512i t0 = _mm512_unpacklo_epi32(raw[0], raw[1]);
	const __m512i t1 = _mm512_unpackhi_epi32(raw[0], raw[1]);
	const __m512i t2 = _mm512_unpacklo_epi32(raw[2], raw[3]);
	const __m512i t3 = _mm512_unpackhi_epi32(raw[2], raw[3]);
	const __m512i v[4] = {
		_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
		_mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3),
	};

	*dx = _mm512_cvtph_ps(_mm256_set_epi64x((long long)d[3], (long long)d[2], (long long)d[1],
						(long long)d[0]));
	for (int k = 0; k < 4; k++) {
		lo[k] = _mm512_and_si512(v[k], m4);
		hi[k] = _mm512_and_si512(_mm512_srli_epi32(v[k], 4), m4);
	}
}

/* The same from a Q4_0_R16 block (quant.h), already in that order: plain
 * loads.  No software prefetch: the 16 rows are one sequential run, which the
 * hardware prefetcher follows (decode, 5 interleaved runs: none 7.97 tok/s,
 * one line per block two calls ahead 7.93, all five lines 7.27). */
VNNI static inline __attribute__((always_inline)) void
q4_0_r16_rows(const uint8_t *run, size_t ib, __m512i lo[4], __m512i hi[4], __m512 *dx)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const struct eng_block_q4_0_r16 *b = (const struct eng_block_q4_0_r16 *)run + ib;

	*dx = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)b->d));
	for (int k = 0; k < 4; k++) {
		const __m512i v = _mm512_loadu_si512((const void *)b->qs[k]);

		lo[k] = _mm512_and_si512(v, m4);
		hi[k] = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
	}
}

/* Block ib of nt tokens against the transposed rows: acc[t] lane r += the
 * block's dot of row r and token t. */
VNNI static inline __attribute__((always_inline)) void
q4_0_tokens(const unsigned nt, const __m512i lo[4], const __m512i hi[4], __m512 dx,
	    const uint8_t *act, size_t a_stride, size_t ib, __m512 *acc)
{
	__m512i s[ENG_DOT8_NT];

	for (unsigned t = 0; t < nt; t++)
		s[t] = _mm512_set1_epi32(((const struct q8_0s *)(act + t * a_stride) + ib)->base);
	for (int k = 0; k < 8; k++)
		for (unsigned t = 0; t < nt; t++)
			s[t] = dpbusd_bcast(s[t], k < 4 ? lo[k] : hi[k - 4],
					    &((const struct q8_0s *)(act + t * a_stride) + ib)->qs[k]);
	for (unsigned t = 0; t < nt; t++) {
		const struct q8_0s *y = (const struct q8_0s *)(act + t * a_stride) + ib;

		acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dx, _mm512_set1_ps(y->d)),
					 acc[t]);
	}
}

VNNI static inline __attribute__((always_inline)) void
q4_0_store(const unsigned nrows, const unsigned nt, const __m512 *acc, float *out,
	   size_t out_stride)
{
	for (unsigned t = 0; t < nt; t++) {
		if (nrows == 16)
			_mm512_storeu_ps(out + t * out_stride, acc[t]);
		else
			_mm256_storeu_ps(out + t * out_stride, _mm512_castps512_ps256(acc[t]));
	}
}

/* Up to ENG_DOT8_NT tokens: each block transposed (or, r16, loaded) and
 * used at once. */
VNNI static inline __attribute__((always_inline)) void
dot_q4_0_vnni(size_t n, const bool r16, const unsigned nrows, const unsigned nt, float *out,
	      size_t out_stride, const uint8_t *rows, size_t stride, const uint8_t *act,
	      size_t a_stride)
{
	__m512 acc[ENG_DOT8_NT];

	for (unsigned t = 0; t < nt; t++)
		acc[t] = _mm512_setzero_ps();
	for (size_t ib = 0; ib < n / ENG_QK4_0; ib++) {
		__m512i lo[4], hi[4];
		__m512 dx;

		if (r16)
			q4_0_r16_rows(rows, ib, lo, hi, &dx);
		else
			q4_0_rows(nrows, rows, stride, ib, lo, hi, &dx);
		q4_0_tokens(nt, lo, hi, dx, act, a_stride, ib, acc);
	}
	q4_0_store(nrows, nt, acc, out, out_stride);
}

/*
 * More tokens than fit the registers (a prompt): the rows go by spans of
 * Q4_0_SPAN blocks; the first ENG_DOT8_NT tokens transpose each block of a
 * span and keep it (struct q4_0t, 18 KB for a span: in L1), and the other
 * tokens, ENG_DOT8_NT at a time, take the kept blocks.  The transpose was
 * about half the instructions of a block for 8 tokens; now it is done once
 * for all of them.  Each token's accumulators wait in acc between spans, so
 * every lane still adds its blocks in order: the same bits as dot_q4_0_vnni.
 * A Q4_0_R16 run needs no keeping: its span (9 KB) is read again from L1.
 */
#define Q4_0_SPAN 32 /* blocks */

struct q4_0t {
	__m512i lo[4], hi[4];
	__m512 dx;
};

VNNI static inline __attribute__((always_inline)) void
span_q4_0(const unsigned nt, const bool r16, const bool fill, size_t ib0, size_t ib1,
	  struct q4_0t *kept, __m512 *accm, const uint8_t *rows, size_t stride, const uint8_t *act,
	  size_t a_stride)
{
	__m512 acc[ENG_DOT8_NT];

	for (unsigned t = 0; t < nt; t++)
		acc[t] = accm[t];
	for (size_t ib = ib0; ib < ib1; ib++) {
		struct q4_0t *b = &kept[ib - ib0], l;

		if (r16) {
			q4_0_r16_rows(rows, ib, l.lo, l.hi, &l.dx);
			b = &l;
		} else if (fill) {
			q4_0_rows(16, rows, stride, ib, b->lo, b->hi, &b->dx);
		}
		q4_0_tokens(nt, b->lo, b->hi, b->dx, act, a_stride, ib, acc);
	}
	for (unsigned t = 0; t < nt; t++)
		accm[t] = acc[t];
}

VNNI static inline __attribute__((always_inline)) void
dot16_q4_0_many(size_t n, const bool r16, unsigned nt, float *out, size_t out_stride,
		const uint8_t *rows, size_t stride, const uint8_t *act, size_t a_stride)
{
	struct q4_0t kept[Q4_0_SPAN];
	__m512 acc[ENG_DOT16_NT];
	const size_t nb = n / ENG_QK4_0;

	for (unsigned t = 0; t < nt; t++)
		acc[t] = _mm512_setzero_ps();
	for (size_t ib0 = 0; ib0 < nb; ib0 += Q4_0_SPAN) {
		size_t ib1 = ib0 + Q4_0_SPAN < nb ? ib0 + Q4_0_SPAN : nb;

		for (unsigned t0 = 0; t0 < nt; t0 += ENG_DOT8_NT) {
			const uint8_t *a = act + t0 * a_stride;
			unsigned g = nt - t0 < ENG_DOT8_NT ? nt - t0 : ENG_DOT8_NT;

#define SPAN(g, fill) \
	span_q4_0(g, r16, fill, ib0, ib1, kept, acc + t0, rows, stride, a, a_stride)
			if (t0 == 0) {
				SPAN(ENG_DOT8_NT, true); /* nt > ENG_DOT8_NT here */
				continue;
			}
			switch (g) {
			case 1: SPAN(1, false); break;
			case 2: SPAN(2, false); break;
			case 3: SPAN(3, false); break;
			case 4: SPAN(4, false); break;
			case 5: SPAN(5, false); break;
			case 6: SPAN(6, false); break;
			case 7: SPAN(7, false); break;
			default: SPAN(8, false); break;
			}
#undef SPAN
		}
	}
	for (unsigned t = 0; t < nt; t++)
		_mm512_storeu_ps(out + t * out_stride, acc[t]);
}

/* Each token count its own copy of the loop, so the accumulators stay in
 * registers (32 of them: 8 weight vectors, 8 sums, 8 accumulators). */
#define Q4_0_VNNI(r16, nrows, nt) \
	dot_q4_0_vnni(n, r16, nrows, nt, out, out_stride, w, stride, a, a_stride)
#define Q4_0_VNNI_NT(r16, nrows) \
	switch (nt) { \
	case 1: Q4_0_VNNI(r16, nrows, 1); break; \
	case 2: Q4_0_VNNI(r16, nrows, 2); break; \
	case 3: Q4_0_VNNI(r16, nrows, 3); break; \
	case 4: Q4_0_VNNI(r16, nrows, 4); break; \
	case 5: Q4_0_VNNI(r16, nrows, 5); break; \
	case 6: Q4_0_VNNI(r16, nrows, 6); break; \
	case 7: Q4_0_VNNI(r16, nrows, 7); break; \
	default: Q4_0_VNNI(r16, nrows, 8); break; \
	}

VNNI static void vec_dot8_q4_0_vnni(size_t n, unsigned nt, float *out, size_t out_stride,
				    const void *w, size_t stride, const void *a, size_t a_stride)
{
	Q4_0_VNNI_NT(false, 8)
}

/* Decoding (one token) takes the 16 rows as two tiles of 8, one after the
 * other: eight interleaved streams at a time instead of sixteen, which
 * with both cores reading kept more of the memory's speed than the 16-row
 * pass's fewer instructions did (Zen 5, 8B Q4_0 decode: 1.075x, every one
 * of 8 interleaved rounds faster; docs/benchmarks.md). */
VNNI static void vec_dot16_q4_0_vnni(size_t n, unsigned nt, float *out, size_t out_stride,
				     const void *w, size_t stride, const void *a, size_t a_stride)
{
	if (nt == 1) {
		vec_dot8_q4_0_vnni(n, 1, out, out_stride, w, stride, a, a_stride);
		vec_dot8_q4_0_vnni(n, 1, out + 8, out_stride, (const uint8_t *)w + 8 * stride, stride,
				   a, a_stride);
	} else if (nt > ENG_DOT8_NT) {
		dot16_q4_0_many(n, false, nt, out, out_stride, w, stride, a, a_stride);
	} else {
		Q4_0_VNNI_NT(false, 16)
	}
}

/* Q4_0_R16: the same kernel with loads for the transpose; the same bits. */
VNNI static void vec_dot16_q4_0_r16_vnni(size_t n, unsigned nt, float *out, size_t out_stride,
					 const void *w, size_t stride, const void *a,
					 size_t a_stride)
{
	if (nt > ENG_DOT8_NT)
		dot16_q4_0_many(n, true, nt, out, out_stride, w, stride, a, a_stride);
	else
		Q4_0_VNNI_NT(true, 16)
}

/* ---- Q8_0 ------------------------------------------------------------- */

/*
 * Q8_0 rows by one token (decoding) with AVX-512 VNNI, each row
 * bit-identical to vec_dot_q8_0_q8_0: its own 8-lane float accumulator, one
 * FMA per block with d_x * d_y, the same hsum at the end.  The int32 lanes
 * are ggml's (lane j = elements 4j..4j+3), here from one vpdpbusd per row:
 * the weights biased to unsigned (x + 128), started from -128 * (the lane's
 * y sum), which the rows share.  Exact for any bytes.
 *
 * Q8_0_ROWS rows side by side: their FMA chains (4 cycles a block) run in
 * parallel and share the activation's work, but each row is a stream of its
 * own, 34-byte steps.  Two rows, not eight: on a Zen 5 with both cores
 * reading, eight streams a core kept less of the memory's speed (8B Q8_0
 * decode: two rows 1.057x eight, median of 8 interleaved rounds, 7 of them
 * faster; four rows won only while the memory was slow; docs/benchmarks.md).
 * The rows are prefetched linearly Q4_0_PREFETCH_ROWS ahead as for Q4_0,
 * the two lines a step's 68 bytes can touch (a third line each step, as
 * before session 38, measured the same: 1.00, eight rounds).
 * A prompt's tokens go to avx512_prompt_q8_0 (quant_avx512_prompt.c).
 */
#define Q8_0_ROWS 2

VNNI static void dot_q8_0_rows(size_t n, float *out, const uint8_t *rows, size_t stride,
			       const uint8_t *act)
{
	const __m256i bias = _mm256_set1_epi8((char)0x80);
	__m256 acc[Q8_0_ROWS];

	for (int r = 0; r < Q8_0_ROWS; r++)
		acc[r] = _mm256_setzero_ps();
	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		const uint8_t *pf = rows + Q4_0_PREFETCH_ROWS * stride +
				    ((ib * Q8_0_ROWS * sizeof(struct eng_block_q8_0)) & ~(size_t)63);
		const struct eng_block_q8_0 *y = (const struct eng_block_q8_0 *)act + ib;
		const __m256i qy = _mm256_loadu_si256((const void *)y->qs);
		const __m256i base = _mm256_sub_epi32(
			_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, qy));
		const __m256 dy = fp16x8(y->d);

		for (int l = 0; l < (Q8_0_ROWS * (int)sizeof(struct eng_block_q8_0) + 63) / 64; l++)
			k_prefetch((const char *)pf + 64 * l);
		for (int r = 0; r < Q8_0_ROWS; r++) {
			const struct eng_block_q8_0 *x =
				(const struct eng_block_q8_0 *)(rows + (size_t)r * stride) + ib;
			const __m256i xq = _mm256_xor_si256(_mm256_loadu_si256((const void *)x->qs), bias);
			const __m256 d = _mm256_mul_ps(fp16x8(x->d), dy);

			acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(base, xq, qy)),
						 acc[r]);
		}
	}
	for (int r = 0; r < Q8_0_ROWS; r++)
		out[r] = hsum_f32x8(acc[r]);
}

/* ---- Q4_K, Q6_K ------------------------------------------------------- */

/*
 * Q4_K decoding (one token) with AVX-512 VBMI: each row bit-identical to
 * vec_dot_q4_k_q8_k_vnni, the same int32 lanes and the same float operations
 * in the same order, from fewer instructions.  One row and block is
 * instruction-bound on Zen 4 and Zen 5 (under the memory bandwidth of a
 * core), so:
 *   - a block's 128 bytes of quants are two 512-bit loads, each the
 *     nibbles of four sub-blocks: the low ones sub-blocks 4p and 4p + 2 in
 *     the vector's two halves, the high ones 4p + 1 and 4p + 3;
 *   - the activations are laid out once a call to match (struct q8_k_z:
 *     each 64-byte load the two sub-blocks a vector holds), with the
 *     bsums' pair sums the mins need;
 *   - the 6-bit scales and mins are unpacked in vector registers
 *     (k4_scales_mins_vbmi), and each vector's two scales put in place by one
 *     zero-masking vpermb;
 *   - the two 256-bit halves of the int32 sums are added (exact) before
 *     the one conversion to float, so the lanes are vec_dot's;
 *   - d and dmin are converted together, and dmin's sign is carried by
 *     vfnmadd (-(a*b) + c rounds as fma(-a, b, c)).
 *   - each sub-block's four-product sums by one vpdpbusd (the high
 *     nibbles masked in place: 16 times the sums), and two sub-blocks'
 *     sums in the two int16 halves of a dword, so one vpdpwssd scales
 *     both: six multiplies a block instead of eight, and no shifts of
 *     the nibbles;
 *   - two blocks a step, their scales and mins unpacked in one 256-bit
 *     vector (k4_scales_mins2_vbmi) and the mins of both by one madd.
 * One core, from memory (65536 rows of 4096): 74-77 GMAC/s against 57-58
 * with 256-bit vectors (Zen 5).  The pairing: 49.5 -> 54.5 GMAC/s from
 * L2 (256 rows of 4096) on a Zen 4 (docs/benchmarks.md, issue 16, session
 * 52); two blocks a step: 53 -> 57.5 from L2, 40.3 -> 41.9 from memory
 * (session 53).  Needs AVX-512BW and VBMI besides VNNI: chosen at start-up
 * only where the CPU has them.
 */

/* An activation block as q4_k_span reads it: the quants with the middle two
 * of each four 32-byte sub-blocks swapped, the bsums' pair sums, y.d. */
struct q8_k_z {
	int8_t qs[ENG_QK_K];
	int16_t q8s[8];
	float d;
	uint8_t pad[44]; /* to 320 bytes: each block's quants on whole lines */
};
_Static_assert(sizeof(struct q8_k_z) % 64 == 0, "q8_k_z");

#define Z_SPAN 64 /* activation blocks laid out at a time (20 KiB): n up to 16384 in one */
#define Z_ROWS 64 /* rows whose sums are carried from span to span */

VBMI static void q8_k_z_make(size_t nb, const struct eng_block_q8_k *y, struct q8_k_z *z)
{
	static const int order[8] = { 0, 2, 1, 3, 4, 6, 5, 7 };

	for (size_t i = 0; i < nb; i++) {
		for (int c = 0; c < 8; c++)
			memcpy(z[i].qs + 32 * c, y[i].qs + 32 * order[c], 32);
		_mm_store_si128((void *)z[i].q8s, k_q8_sums_of(&y[i]));
		z[i].d = y[i].d;
	}
}

/* A row's float sums, carried from one span of its blocks to the next. */
struct q4_k_sum {
	__m256 acc;
	__m128 acc_m;
};

/*
 * Block x's int32 sums against activation block q8, as 8 lanes: the
 * scales are the 16-bit words of smz that si01 and si45 pick (sub-blocks
 * 0, 1 | 2, 3 and 4, 5 | 6, 7 of this block).
 */
VBMI static inline __attribute__((always_inline)) __m256i
q4_k_block(const struct eng_block_q4_k *x, const int8_t *q8, __m512i smz, __m512i si01,
	   __m512i si45)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
	const __mmask64 lo = 0x5555555555555555ull;
	const __mmask32 odd_words = 0xaaaaaaaau;
	__m512i b0 = _mm512_loadu_si512(x->qs), b1 = _mm512_loadu_si512(x->qs + 64);

	K_IN_REGISTER(b0);
	K_IN_REGISTER(b1);
	/* each sub-block's four-product sums, t0: sub-blocks 0 | 2, t2: 4 | 6;
	 * t1 and t3 (1 | 3, 5 | 7) from the high nibbles left in place, so 16
	 * times theirs */
	const __m512i t0 = _mm512_dpbusd_epi32(zero, _mm512_and_si512(b0, m4), _mm512_load_si512(q8));
	const __m512i t1 =
		_mm512_dpbusd_epi32(zero, _mm512_andnot_si512(m4, b0), _mm512_load_si512(q8 + 64));
	const __m512i t2 =
		_mm512_dpbusd_epi32(zero, _mm512_and_si512(b1, m4), _mm512_load_si512(q8 + 128));
	const __m512i t3 =
		_mm512_dpbusd_epi32(zero, _mm512_andnot_si512(m4, b1), _mm512_load_si512(q8 + 192));
	/* |sum| <= 4 * 15 * 128 < 2^15: sub-blocks 2j and 2j + 1 in the low and
	 * high int16 of each dword (16 t << 12 is t << 16), and one vpdpwssd
	 * scales both */
	__m512i s0 = _mm512_dpwssd_epi32(
		zero, _mm512_mask_blend_epi16(odd_words, t0, _mm512_slli_epi32(t1, 12)),
		_mm512_maskz_permutexvar_epi8(lo, si01, smz));
	s0 = _mm512_dpwssd_epi32(s0,
				 _mm512_mask_blend_epi16(odd_words, t2, _mm512_slli_epi32(t3, 12)),
				 _mm512_maskz_permutexvar_epi8(lo, si45, smz));

	return _mm256_add_epi32(_mm512_castsi512_si256(s0), _mm512_extracti64x4_epi64(s0, 1));
}

/* Block x's [d, dmin] * y.d: y.d * d rounds the same either way round. */
VBMI static inline __attribute__((always_inline)) __m128 q4_k_dm(const struct eng_block_q4_k *x,
								 const struct q8_k_z *z)
{
	return _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const void *)&x->d)),
			  _mm_broadcast_ss(&z->d));
}

/* Blocks x[0 .. nb) of a row of row_nb blocks against z[0 .. nb), two at a
 * time: their scales and mins unpacked in one 256-bit vector, so the
 * second block's scales are words 16 on (si01, si45 + 16), and the mins of
 * both by one madd.  The float operations are one block's after the
 * other's, as vec_dot's. */
VBMI static void q4_k_span(const struct eng_block_q4_k *x, size_t nb, size_t row_nb,
			   const struct q8_k_z *z, struct q4_k_sum *sum)
{
	/* the scale bytes of sub-blocks a and b to the low bytes of each dword's
	 * two int16 halves (the high bytes masked to zero): (0, 1) | (2, 3) and
	 * (4, 5) | (6, 7) in the two 256-bit halves */
#define SC2(a, b) _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
	const __m512i si01 = SC2(0x00010000, 0x00030002), si45 = SC2(0x00050004, 0x00070006);
#undef SC2
	const __m512i sib = _mm512_set1_epi16(16);
	const __m512i si01b = _mm512_add_epi16(si01, sib), si45b = _mm512_add_epi16(si45, sib);
	/* each block's mins as int16 (the high half of its [sc, mn]) */
	const __m256i mins_of = _mm256_broadcastsi128_si256(
		_mm_setr_epi8(8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1));
	const char *pf = (const char *)x + k_prefetch_rows * row_nb * sizeof(*x);
	__m256 acc = sum->acc;
	__m128 acc_m = sum->acc_m;
	size_t i = 0;

	for (; i + 2 <= nb; i += 2) {
		/* the lines of blocks i and i + 1, 288 bytes: every line a point
		 * 48 bytes apart falls in (a last one past them, the next pair's
		 * first) */
		for (int l = 0; l < 6; l++)
			k_prefetch(pf + i * sizeof(*x) + 48 * l);

		const __m128 dm0 = q4_k_dm(&x[i], &z[i]), dm1 = q4_k_dm(&x[i + 1], &z[i + 1]);
		const __m256i sm = k4_scales_mins2_vbmi(x[i].scales, x[i + 1].scales);
		const __m512i smz = _mm512_castsi256_si512(sm);
		const __m256i q8s = _mm256_inserti128_si256(
			_mm256_castsi128_si256(_mm_load_si128((const void *)z[i].q8s)),
			_mm_load_si128((const void *)z[i + 1].q8s), 1);
		const __m256 mf =
			_mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_shuffle_epi8(sm, mins_of), q8s));

		acc_m = _mm_fnmadd_ps(_mm_permute_ps(dm0, 0x55), _mm256_castps256_ps128(mf), acc_m);
		acc_m = _mm_fnmadd_ps(_mm_permute_ps(dm1, 0x55), _mm256_extractf128_ps(mf, 1), acc_m);
		acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm0),
				      _mm256_cvtepi32_ps(q4_k_block(&x[i], z[i].qs, smz, si01, si45)),
				      acc);
		acc = _mm256_fmadd_ps(
			_mm256_broadcastss_ps(dm1),
			_mm256_cvtepi32_ps(q4_k_block(&x[i + 1], z[i + 1].qs, smz, si01b, si45b)), acc);
	}
	if (i < nb) { /* an odd last block */
		for (int l = 0; l < 3; l++)
			k_prefetch(pf + i * sizeof(*x) + 64 * l);

		const __m128 dm = q4_k_dm(&x[i], &z[i]);
		const __m128i sm = k4_scales_mins_vbmi(x[i].scales);
		const __m128 mf = _mm_cvtepi32_ps(
			_mm_madd_epi16(_mm_shuffle_epi8(sm, _mm256_castsi256_si128(mins_of)),
				       _mm_load_si128((const void *)z[i].q8s)));

		acc_m = _mm_fnmadd_ps(_mm_permute_ps(dm, 0x55), mf, acc_m);
		acc = _mm256_fmadd_ps(
			_mm256_broadcastss_ps(dm),
			_mm256_cvtepi32_ps(q4_k_block(&x[i], z[i].qs, _mm512_castsi128_si512(sm),
						      si01, si45)),
			acc);
	}
	sum->acc = acc;
	sum->acc_m = acc_m;
}

VBMI static inline float q4_k_finish(__m256 acc, __m128 acc_m)
{
	acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
	acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
	return hsum_f32x8(acc) + _mm_cvtss_f32(acc_m);
}

/*
 * vec_dotn: decoding (one token), the rows one after the other, each read
 * front to back (a row longer than Z_SPAN blocks a span at a time, Z_ROWS
 * rows a span): two rows read side by side (sharing the activation's
 * bsums) were a little faster from cache and less than half as fast from
 * memory, where the hardware prefetcher follows one linear stream per core
 * well and two interleaved ones 2.3 KB apart poorly (7 GB/s a core instead
 * of 22, measured).  Two tokens or more: avx512_prompt_q4_k, which shares
 * each block between them, bit-identical to this one.
 */
VBMI static void vec_dotn_q4_k_q8_k_vbmi(size_t n, unsigned nrows, unsigned nt, float *out,
					  size_t out_stride, const void *w, size_t stride,
					  const void *a, size_t a_stride)
{
	const size_t nb = n / ENG_QK_K;
	struct q8_k_z z[Z_SPAN] __attribute__((aligned(64)));
	struct q4_k_sum sum[Z_ROWS];

	if (nt > 1) {
		avx512_prompt_q4_k(n, nrows, nt, out, out_stride, w, stride, a, a_stride);
		return;
	}
	for (unsigned r0 = 0; r0 < nrows; r0 += Z_ROWS) {
		const unsigned nr = nrows - r0 < Z_ROWS ? nrows - r0 : Z_ROWS;

		for (unsigned r = 0; r < nr; r++)
			sum[r] = (struct q4_k_sum){ _mm256_setzero_ps(), _mm_setzero_ps() };
		for (size_t b0 = 0; b0 < nb; b0 += Z_SPAN) {
			const size_t nbs = nb - b0 < Z_SPAN ? nb - b0 : Z_SPAN;

			q8_k_z_make(nbs, (const struct eng_block_q8_k *)a + b0, z);
			for (unsigned r = 0; r < nr; r++)
				q4_k_span((const struct eng_block_q4_k *)((const uint8_t *)w +
									  (size_t)(r0 + r) * stride) +
						  b0,
					  nbs, nb, z, &sum[r]);
		}
		for (unsigned r = 0; r < nr; r++)
			out[r0 + r] = q4_k_finish(sum[r].acc, sum[r].acc_m);
	}
}

/* Q8_0's vec_dotn: decoding, Q8_0_ROWS rows side by side (the rows a
 * multiple of Q8_0_ROWS leaves: the prompt kernel, which is as exact for
 * one token). */
VNNI static void vec_dotn_q8_0_zmm(size_t n, unsigned nrows, unsigned nt, float *out,
				   size_t out_stride, const void *w, size_t stride, const void *a,
				   size_t a_stride)
{
	unsigned r = 0;

	if (nt == 1)
		for (; r + Q8_0_ROWS <= nrows; r += Q8_0_ROWS)
			dot_q8_0_rows(n, out + r, (const uint8_t *)w + r * stride, stride, a);
	if (r < nrows)
		avx512_prompt_q8_0(n, nrows - r, nt, out + r, out_stride,
				   (const uint8_t *)w + r * stride, stride, a, a_stride);
}

/* ---- BF16 ------------------------------------------------------------- */

#define BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bf16")))

/*
 * BF16 weights by BF16 activations: vdpbf16ps multiplies 32 pairs and adds
 * each two neighbours' products into one of 16 float lanes.  Two
 * accumulators over 64 elements a step, then 32, then one at a time in
 * double; the lanes are reduced in double, as ggml's kernel adds each
 * accumulator's float reduction to its double sum.
 */
BF16 static void vec_dot_bf16_avx512(size_t n, float *out, const void *w, const void *a)
{
	const eng_bf16_t *x = w, *y = a;
	__m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
	double sum;
	size_t i = 0;

	for (; i + 64 <= n; i += 64) {
		c1 = _mm512_dpbf16_ps(c1, (__m512bh)_mm512_loadu_si512(x + i),
				      (__m512bh)_mm512_loadu_si512(y + i));
		c2 = _mm512_dpbf16_ps(c2, (__m512bh)_mm512_loadu_si512(x + i + 32),
				      (__m512bh)_mm512_loadu_si512(y + i + 32));
	}
	for (; i + 32 <= n; i += 32)
		c1 = _mm512_dpbf16_ps(c1, (__m512bh)_mm512_loadu_si512(x + i),
				      (__m512bh)_mm512_loadu_si512(y + i));
	sum = (double)_mm512_reduce_add_ps(c1) + (double)_mm512_reduce_add_ps(c2);
	for (; i < n; i++)
		sum += (double)(eng_bf16_to_fp32(x[i]) * eng_bf16_to_fp32(y[i]));
	*out = (float)sum;
}

/* ---- the K-quants' one-row Q6_K and eight-row kernels ------------------ */

#define KR_ATTR VNNI
#define KR_NAME(f) f##_vnni
#define KR_DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#include "quant_krows_tmpl.h"

/*
 * Q6_K decoding (one token) in 512-bit vectors, each row bit-identical to
 * vec_dot_q6_k_q8_k_vnni (quant_krows_tmpl.h).  Each 128 elements: ql's
 * 64 bytes [b1 | b2] are one load, qh's 32 broadcast to both halves; a
 * vector's low nibbles and 2-bit fields make elements 0..63 in order, its
 * high ones 64..127, so the activations are read in their order.  Dword L
 * of a vector holds elements 4L..4L+3 of its 64: the halves are the
 * one-row kernel's 32-element chunks, added (exact) before the conversion.
 *
 * The quants are 0..63 for q - 32: vpdpbusd adds each dword's four
 * products q * y to -32 times the four activations' sum, which a call
 * works out once for all its rows (struct q6_k_u), so each dword holds
 * the four products (q - 32) * y, |sum| <= 4 * 32 * 128 < 2^15.  The
 * dwords of elements 0..63 and 64..127 of each 128 then share a dword's
 * two int16 halves, and one vpdpwssd scales both (dword L: 16-element
 * sub-blocks L / 4 and 4 + L / 4 of the 128).  A multiply and a half per
 * 64 elements instead of three and a subtraction: 35 -> 41 GMAC/s from L2
 * on a Zen 4 (docs/benchmarks.md, issue 16, session 52).  The activations
 * are read from a copy on whole lines in the same table: 1.065x from L2
 * (session 53).
 */

/* An activation block as q6_k_span reads it: its quants on whole lines
 * (a Q8_K block's lie 4 bytes in, so every 64-byte load of them would
 * cross two), -32 times the sum of each four of them, in order, and y.d. */
struct q6_k_u {
	int8_t qs[ENG_QK_K];
	int32_t m32[ENG_QK_K / 4];
	float d;
	uint8_t pad[60];
};
_Static_assert(sizeof(struct q6_k_u) % 64 == 0, "q6_k_u");

/* Activation blocks laid out at a time: 18 KiB, in a Zen 4's 32 KiB of L1
 * beside the rows streaming through.  One core from memory: at 64 blocks
 * (36 KiB) rows of 12288 read at 21 GMAC/s, at 32 at 29-30; rows of 14336
 * at 28-29.5, where main's 64-block span of the Q8_K blocks and their sums
 * (30 KiB) read them at 22 (session 53). */
#define Q6_SPAN 32

VBMI static void q6_k_u_make(size_t nb, const struct eng_block_q8_k *y, struct q6_k_u *u)
{
	const __m512i m32 = _mm512_set1_epi8(32), zero = _mm512_setzero_si512();

	for (size_t i = 0; i < nb; i++) {
		for (int v = 0; v < 4; v++) {
			const __m512i q = _mm512_loadu_si512(y[i].qs + 64 * v);

			_mm512_store_si512(u[i].qs + 64 * v, q);
			_mm512_store_si512(u[i].m32 + 16 * v,
					   _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, m32, q)));
		}
		u[i].d = y[i].d;
	}
}

/* Blocks x[0 .. nb) of a row of row_nb blocks against u[0 .. nb), into
 * *accp. */
VBMI static void q6_k_span(const struct eng_block_q6_k *x, size_t nb, size_t row_nb,
			   const struct q6_k_u *u, __m256 *accp)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
	/* qh's fields 0, 1 to bits 4-5 of the low and high halves (<< 4, << 2);
	 * fields 2, 3 (>> 0, >> 2) */
	const __m512i sh01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
	const __m512i sh23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
	const __mmask32 odd_words = 0xaaaaaaaau;
	const char *pf = (const char *)x + k_prefetch_rows * row_nb * sizeof(*x);
	/* the scales of int16 halves 2L and 2L + 1 of the 128 elements from
	 * 128h: sub-blocks 8h + L / 4 and 8h + 4 + L / 4 (L = 0..15) */
	const __m512i m8 = _mm512_setr_epi32(0x40000, 0x40000, 0x40000, 0x40000, 0x50001, 0x50001,
					     0x50001, 0x50001, 0x60002, 0x60002, 0x60002, 0x60002,
					     0x70003, 0x70003, 0x70003, 0x70003);
	const __m512i si[2] = { m8, _mm512_add_epi16(m8, _mm512_set1_epi16(8)) };
	__m256 acc = *accp;

	for (size_t i = 0; i < nb; i++) {
		const __m512i sc16 = _mm512_castsi256_si512(
			_mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)x[i].scales)));
		__m512i s0 = _mm512_setzero_si512();

		for (int l = 0; l < 4; l++)
			k_prefetch(pf + i * sizeof(*x) + 64 * l);
#pragma GCC unroll 2
		for (int h = 0; h < ENG_QK_K / 128; h++) {
			__m512i b = _mm512_loadu_si512(x[i].ql + 64 * h);
			const __m512i bh = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(x[i].qh + 32 * h)));

			K_IN_REGISTER(b);
			/* 0xe4: bits of the first operand where m4 is set, of the
			 * second elsewhere: (b & 15) | fields << 4 */
			const __m512i q01 = _mm512_ternarylogic_epi32(
				b, _mm512_and_si512(_mm512_sllv_epi16(bh, sh01), m30), m4, 0xe4);
			const __m512i q23 = _mm512_ternarylogic_epi32(
				_mm512_srli_epi16(b, 4), _mm512_and_si512(_mm512_srlv_epi16(bh, sh23), m30),
				m4, 0xe4);
			const __m512i t01 =
				_mm512_dpbusd_epi32(_mm512_load_si512(u[i].m32 + 32 * h), q01,
						    _mm512_load_si512(u[i].qs + 128 * h));
			const __m512i t23 =
				_mm512_dpbusd_epi32(_mm512_load_si512(u[i].m32 + 32 * h + 16), q23,
						    _mm512_load_si512(u[i].qs + 128 * h + 64));

			s0 = _mm512_dpwssd_epi32(
				s0, _mm512_mask_blend_epi16(odd_words, t01, _mm512_slli_epi32(t23, 16)),
				_mm512_permutexvar_epi16(si[h], sc16));
		}

		const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(s0),
						      _mm512_extracti64x4_epi64(s0, 1));

		acc = _mm256_fmadd_ps(_mm256_set1_ps(u[i].d * fp16(x[i].d)), _mm256_cvtepi32_ps(sumi),
				      acc);
	}
	*accp = acc;
}

/* Q6_K's vec_dotn: decoding (one token) with q6_k_span, row after row (a
 * row longer than Q6_SPAN blocks a span at a time, Z_ROWS rows a span, as
 * Q4_K's); two tokens or more: avx512_prompt_q6_k, bit-identical to it. */
VBMI static void vec_dotn_q6_k_q8_k_vbmi(size_t n, unsigned nrows, unsigned nt, float *out,
					  size_t out_stride, const void *w, size_t stride,
					  const void *a, size_t a_stride)
{
	const size_t nb = n / ENG_QK_K;
	const struct eng_block_q8_k *y = a;
	struct q6_k_u u[Q6_SPAN] __attribute__((aligned(64)));
	__m256 acc[Z_ROWS];

	if (nt > 1) {
		avx512_prompt_q6_k(n, nrows, nt, out, out_stride, w, stride, a, a_stride);
		return;
	}
	for (unsigned r0 = 0; r0 < nrows; r0 += Z_ROWS) {
		const unsigned nr = nrows - r0 < Z_ROWS ? nrows - r0 : Z_ROWS;

		for (unsigned r = 0; r < nr; r++)
			acc[r] = _mm256_setzero_ps();
		for (size_t b0 = 0; b0 < nb; b0 += Q6_SPAN) {
			const size_t nbs = nb - b0 < Q6_SPAN ? nb - b0 : Q6_SPAN;

			q6_k_u_make(nbs, y + b0, u);
			for (unsigned r = 0; r < nr; r++)
				q6_k_span((const struct eng_block_q6_k *)((const uint8_t *)w +
									  (size_t)(r0 + r) * stride) +
						  b0,
					  nbs, nb, u, &acc[r]);
		}
		for (unsigned r = 0; r < nr; r++)
			out[r0 + r] = hsum_f32x8(acc[r]);
	}
}

/* ---- the table -------------------------------------------------------- */

/* The AVX2 set with the kernels AVX-512 VNNI speeds up. */
static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;
static struct eng_kernels avx512, avx512bf16, avx512_novbmi;
static bool avx512_ok, avx512bf16_ok;

BASELINE static void avx512_init(void)
{
	const struct eng_kernels *base = eng_kernels_avx2();

	__builtin_cpu_init();
	avx512_ok = base && __builtin_cpu_supports("avx512f") &&
		    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
	if (!avx512_ok)
		return;
	avx512 = *base;
	avx512.isa = "avx512";
	avx512.vec_dot8[ENG_TYPE_Q4_0] = vec_dot8_q4_0_vnni;
	avx512.vec_dot16[ENG_TYPE_Q4_0] = vec_dot16_q4_0_vnni;
	avx512.vec_dot16[ENG_TYPE_Q4_0_R16] = vec_dot16_q4_0_r16_vnni;
	avx512.pack8[ENG_TYPE_Q4_0_R16] = base->pack8[ENG_TYPE_Q4_0]; /* AVX2's */
	/* the prompt kernels lay out their activations themselves, once a
	 * call: vec_dotn, with neither vec_dot8 nor vec_dot16 (quant.h) */
	avx512.vec_dotn[ENG_TYPE_Q8_0] = vec_dotn_q8_0_zmm;
	avx512.vec_dot8[ENG_TYPE_Q8_0] = NULL;
	avx512.pack8[ENG_TYPE_Q8_0] = NULL; /* it reads the Q8_0 rows */
	avx512.vec_dot[ENG_TYPE_Q4_K] = vec_dot_q4_k_q8_k_vnni;
	avx512.vec_dot[ENG_TYPE_Q6_K] = vec_dot_q6_k_q8_k_vnni;
	avx512.vec_dotn[ENG_TYPE_Q4_K] = vec_dotn_q4_k_q8_k_vnni;
	avx512.vec_dotn[ENG_TYPE_Q6_K] = vec_dotn_q6_k_q8_k_vnni;
	avx512.vec_dot[ENG_TYPE_Q5_K] = vec_dot_q5_k_q8_k_vnni;
	avx512.vec_dotn[ENG_TYPE_Q5_K] = vec_dotn_q5_k_q8_k_vnni;
	avx512_novbmi = avx512;
	avx512_novbmi.isa = "avx512-novbmi";
	if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi")) {
		/* which read the Q8_K rows and lay them out themselves */
		avx512.pack8[ENG_TYPE_Q4_K] = avx512.pack8[ENG_TYPE_Q5_K] = NULL;
		avx512.pack8[ENG_TYPE_Q6_K] = NULL;
		avx512.vec_dotn[ENG_TYPE_Q4_K] = vec_dotn_q4_k_q8_k_vbmi;
		avx512.vec_dotn[ENG_TYPE_Q6_K] = vec_dotn_q6_k_q8_k_vbmi;
		avx512.vec_dot8[ENG_TYPE_Q6_K] = NULL;
	}
	avx512bf16_ok = __builtin_cpu_supports("avx512bf16");
	if (avx512bf16_ok) {
		avx512bf16 = avx512;
		avx512bf16.isa = "avx512bf16";
		avx512bf16.vec_dot[ENG_TYPE_BF16] = vec_dot_bf16_avx512;
	}
}

BASELINE const struct eng_kernels *eng_kernels_avx512(void)
{
	pthread_once(&avx512_once, avx512_init);
	return avx512_ok ? &avx512 : NULL;
}

BASELINE const struct eng_kernels *eng_kernels_avx512bf16(void)
{
	pthread_once(&avx512_once, avx512_init);
	return avx512bf16_ok ? &avx512bf16 : NULL;
}

BASELINE const struct eng_kernels *eng_kernels_avx512_novbmi(void)
{
	pthread_once(&avx512_once, avx512_init);
	return avx512_ok ? &avx512_novbmi : NULL;
}
