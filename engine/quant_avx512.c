/*
 * quant_avx512.c - the avx512 kernel set: the AVX2 set with the kernels that
 * AVX-512 VNNI (vpdpbusd, vpdpwssd) makes faster.
 *
 * Built with the AVX2 flags like quant_avx2.c; the kernels here carry their
 * own target attribute, and the table set-up is built for the baseline, so
 * nothing in this file runs on a CPU without AVX-512 VNNI.  256-bit vectors
 * where the work fits them: Zen 4 splits 512-bit operations in two.  The
 * exceptions, for the reasons given there: the Q4_0 kernel, and the
 * prompt kernels of Q4_K, Q6_K and Q8_0 (two tokens a vector).
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
#include "quant_x86_i.h"

#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

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
 * (vec_dot8, for the rows a 16-row tile leaves) the upper half is zero.
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
		_mm_prefetch((const char *)pf + 64 * l, _MM_HINT_T1);

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

VNNI static void vec_dot16_q4_0_vnni(size_t n, unsigned nt, float *out, size_t out_stride,
				     const void *w, size_t stride, const void *a, size_t a_stride)
{
	if (nt > ENG_DOT8_NT)
		dot16_q4_0_many(n, false, nt, out, out_stride, w, stride, a, a_stride);
	else
		Q4_0_VNNI_NT(false, 16)
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
 * Eight Q8_0 rows with AVX-512 VNNI, each row bit-identical to
 * vec_dot_q8_0_q8_0: its own 8-lane float accumulator, one FMA per block
 * with d_x * d_y, the same hsum at the end.  The int32 lanes are ggml's
 * (lane j = elements 4j..4j+3), here from one vpdpbusd per row: the weights
 * biased to unsigned (x + 128), started from -128 * (the lane's y sum),
 * which all rows share.  Exact for any bytes.  Eight rows mean eight
 * independent FMA chains and the activation work done once; the rows are
 * prefetched linearly two calls ahead as for Q4_0 (272 bytes per block).
 * Decoding (one token) only: a prompt's tokens go to kq_q8_0 below, two
 * tokens a 512-bit vector (up to two at a time here, a prompt ran at 0.58x
 * llama.cpp's AVX-512 build).
 */
VNNI static inline __attribute__((always_inline)) void
dot8_q8_0_vnni(size_t n, const unsigned nt, float *out, size_t out_stride, const uint8_t *rows,
	       size_t stride, const uint8_t *act, size_t a_stride)
{
	const __m256i bias = _mm256_set1_epi8((char)0x80);
	__m256 acc[2][8];

	for (unsigned t = 0; t < nt; t++)
		for (int r = 0; r < 8; r++)
			acc[t][r] = _mm256_setzero_ps();
	for (size_t ib = 0; ib < n / ENG_QK8_0; ib++) {
		const uint8_t *pf = rows + Q4_0_PREFETCH_ROWS * stride +
				    ((ib * 8 * sizeof(struct eng_block_q8_0)) & ~(size_t)63);
		__m256i xq[8];
		uint64_t d0 = 0, d1 = 0;

		for (int r = 0; r < 8; r++) {
			const struct eng_block_q8_0 *x =
				(const struct eng_block_q8_0 *)(rows + (size_t)r * stride) + ib;

			xq[r] = _mm256_xor_si256(_mm256_loadu_si256((const void *)x->qs), bias);
			if (r < 4)
				d0 |= (uint64_t)x->d << (16 * r);
			else
				d1 |= (uint64_t)x->d << (16 * (r - 4));
		}
		for (int l = 0; l < 5; l++)
			_mm_prefetch((const char *)pf + 64 * l, _MM_HINT_T1);

		const __m256 dx = _mm256_cvtph_ps(_mm_set_epi64x((long long)d1, (long long)d0));

		for (unsigned t = 0; t < nt; t++) {
			const struct eng_block_q8_0 *y =
				(const struct eng_block_q8_0 *)(act + t * a_stride) + ib;
			const __m256i qy = _mm256_loadu_si256((const void *)y->qs);
			const __m256i base = _mm256_sub_epi32(
				_mm256_setzero_si256(),
				_mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, qy));
			const __m256 dd = _mm256_mul_ps(dx, fp16x8(y->d));

			for (int r = 0; r < 8; r++) {
				const __m256 d = _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(r));
				const __m256i p32 = _mm256_dpbusd_epi32(base, xq[r], qy);

				acc[t][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p32), acc[t][r]);
			}
		}
	}
	for (unsigned t = 0; t < nt; t++)
		for (int r = 0; r < 8; r++)
			out[t * out_stride + r] = hsum_f32x8(acc[t][r]);
}

/* ---- Q4_K, Q6_K ------------------------------------------------------- */

/*
 * Q4_K with AVX-512 VNNI: the same integer lanes as dot_q45_k, so the same
 * floats, with fewer instructions: the 6-bit scales and mins unpacked in
 * general registers as ggml does (kmask1-3) and widened to int16 at once,
 * each sub-block's scale broadcast by one pshufb, and vpdpwssd doing the
 * scale madd and the add to the int32 lanes in one (integers: any order).
 */
VNNI static void vec_dot_q4_k_q8_k_vnni(size_t n, float *out, const void *w, const void *a)
{
	const struct eng_block_q4_k *x = w;
	const struct eng_block_q8_k *y = a;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256 acc = _mm256_setzero_ps();
	__m128 acc_m = _mm_setzero_ps();

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const float d = y[i].d * fp16(x[i].d);
		const float dmin = -y[i].d * fp16(x[i].dmin);
		const int8_t *q8 = y[i].qs;
		uint32_t u[4], lo;
		__m256i sumi = _mm256_setzero_si256();

		memcpy(u, x[i].scales, ENG_K_SCALE_SIZE);
		/* u[0] = sc0-3, u[1] = sc4-7, u[2] = mn0-3, u[3] = mn4-7 */
		u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
		lo = u[1] & 0x3f3f3f3f;
		u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
		u[2] = lo;
		u[0] &= 0x3f3f3f3f;

		const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)u));
		const __m128i sc = _mm256_castsi256_si128(sm);
		const __m256i scales = _mm256_set_m128i(sc, sc);
		const __m256i bs = _mm256_loadu_si256((const void *)y[i].bsums);
		const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs),
						   _mm256_extracti128_si256(bs, 1));
		const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), q8s);

		acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
		for (int j = 0; j < ENG_QK_K / 64; j++) {
			/* int16 scale 2j (2j + 1) in every lane */
			const __m256i shl = _mm256_set1_epi16((short)(0x0100 * (4 * j + 1) + 4 * j));
			const __m256i shh = _mm256_set1_epi16((short)(0x0100 * (4 * j + 3) + 4 * j + 2));
			const __m256i bits = _mm256_loadu_si256((const void *)(x[i].qs + 32 * j));
			const __m256i ql = _mm256_and_si256(bits, m4);
			const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
			const __m256i yl = _mm256_loadu_si256((const void *)(q8 + 64 * j));
			const __m256i yh = _mm256_loadu_si256((const void *)(q8 + 64 * j + 32));

			sumi = _mm256_dpwssd_epi32(sumi, _mm256_maddubs_epi16(ql, yl),
						   _mm256_shuffle_epi8(scales, shl));
			sumi = _mm256_dpwssd_epi32(sumi, _mm256_maddubs_epi16(qh, yh),
						   _mm256_shuffle_epi8(scales, shh));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
	}
	acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
	acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
	*out = hsum_f32x8(acc) + _mm_cvtss_f32(acc_m);
}

/*
 * Q4_K, eight rows at a time (vec_dot8), each row bit-identical to
 * vec_dot_q4_k_q8_k_vnni: the same int32 lanes and the same float
 * operations in the same order, from fewer instructions.  One row and block
 * is instruction-bound on Zen 4 (about 20 cycles a block, under the memory
 * bandwidth of a core), so:
 *   - the 6-bit scales and mins are unpacked in vector registers (a pshufb,
 *     a vpermt2b and a vpternlogd instead of some twenty general-register
 *     operations and the moves into vector registers);
 *   - each sub-block's scale is one vpermd from a table of (scale, scale)
 *     int16 pairs made by one zero-masking vpermb;
 *   - d and dmin are converted together, and dmin's sign is carried by
 *     vfnmadd (-(a*b) + c rounds as fma(-a, b, c));
 * Needs AVX-512BW and VBMI besides VNNI (vpermb, vpermt2b): chosen at start-up
 * only where the CPU has them.
 */
#define VBMI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vbmi,avx512vnni")))

/*
 * The 12 scale bytes b0..b11 (loaded with the 4 bytes after them) to
 * [sc0..sc7, mn0..mn7], as k4_scales_mins_ssse3 (quant_x86_i.h) does with
 * three pshufbs where VBMI is missing:
 *   sc_j = b_j & 63, mn_j = b_{j+4} & 63                          (j < 4)
 *   sc_{j+4} = (b_{j+8} & 15) | (b_j >> 6) << 4
 *   mn_{j+4} = (b_{j+8} >> 4) | (b_{j+4} >> 6) << 4
 * The 16-bit shifts pull bits of the next byte into the top of the low one;
 * the masks drop them.
 */
VBMI static inline __attribute__((always_inline)) __m128i k4_scales_mins(const uint8_t *p)
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

/* One block of one row: the lanes and float steps of vec_dot_q4_k_q8_k_vnni. */
VBMI static inline __attribute__((always_inline)) void
q4_k_block(const struct eng_block_q4_k *x, const int8_t *q8, __m128 dy, __m128i q8s, __m256 *acc,
	   __m128 *acc_m)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	/* byte j of the scales to both int16 halves of dword j (index 64:
	 * any, the mask zeroes those bytes) */
	const __m256i dup = _mm256_setr_epi8(0, 64, 0, 64, 1, 64, 1, 64, 2, 64, 2, 64, 3, 64, 3, 64,
					     4, 64, 4, 64, 5, 64, 5, 64, 6, 64, 6, 64, 7, 64, 7, 64);
	/* [d, dmin] * y.d: y.d * d rounds the same either way round */
	const __m128 dm = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const void *)&x->d)), dy);
	const __m128i sm = k4_scales_mins(x->scales);
	const __m256i tab = _mm256_maskz_permutexvar_epi8(0x55555555u, dup,
							  _mm256_castsi128_si256(sm));
	const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
	__m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();

	*acc_m = _mm_fnmadd_ps(_mm_permute_ps(dm, 0x55), _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s)),
			       *acc_m);
#pragma GCC unroll 4
	for (int j = 0; j < ENG_QK_K / 64; j++) {
		const __m256i bits = _mm256_loadu_si256((const void *)(x->qs + 32 * j));
		const __m256i ql = _mm256_and_si256(bits, m4);
		const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
		const __m256i yl = _mm256_loadu_si256((const void *)(q8 + 64 * j));
		const __m256i yh = _mm256_loadu_si256((const void *)(q8 + 64 * j + 32));

		/* two chains (integers: exact in any order) */
		s0 = _mm256_dpwssd_epi32(s0, _mm256_maddubs_epi16(ql, yl),
					 _mm256_permutexvar_epi32(_mm256_set1_epi32(2 * j), tab));
		s1 = _mm256_dpwssd_epi32(s1, _mm256_maddubs_epi16(qh, yh),
					 _mm256_permutexvar_epi32(_mm256_set1_epi32(2 * j + 1), tab));
	}
	*acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)),
			       *acc);
}

VBMI static inline float q4_k_finish(__m256 acc, __m128 acc_m)
{
	acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
	acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
	return hsum_f32x8(acc) + _mm_cvtss_f32(acc_m);
}

/* One row against one activation row. */
VBMI static float dot1_q4_k(size_t n, const struct eng_block_q4_k *x, const struct eng_block_q8_k *y)
{
	__m256 acc = _mm256_setzero_ps();
	__m128 acc_m = _mm_setzero_ps();

	const char *pf = (const char *)x + K_PREFETCH_ROWS * (n / ENG_QK_K) * sizeof(*x);

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const __m128i q8s = _mm_hadd_epi16(_mm_loadu_si128((const void *)y[i].bsums),
						   _mm_loadu_si128((const void *)(y[i].bsums + 8)));

		/* the lines of block i, 144 bytes: two or three */
		for (int l = 0; l < 3; l++)
			_mm_prefetch(pf + i * sizeof(*x) + 64 * l, _MM_HINT_T1);

		q4_k_block(&x[i], y[i].qs, _mm_broadcast_ss(&y[i].d), q8s, &acc, &acc_m);
	}
	return q4_k_finish(acc, acc_m);
}

/*
 * The eight rows one after the other, each read front to back: two rows
 * read side by side (sharing the activation's bsums) were a little faster
 * from cache and less than half as fast from memory, where the hardware
 * prefetcher follows one linear stream per core well and two interleaved
 * ones 2.3 KB apart poorly (7 GB/s a core instead of 22, measured).
 */
static void vec_dot8_q4_k_q8_k_vnni(size_t n, unsigned nt, float *out, size_t out_stride,
				    const void *w, size_t stride, const void *a, size_t a_stride);

/*
 * Q4_K by a prompt's tokens in 512-bit vectors (vec_dot16, and vec_dot8 for
 * two tokens or more), each row and token bit-identical to
 * vec_dot_q4_k_q8_k_vnni.  What is fixed is the lanes: each row keeps, per
 * block, 8 int32 sums (lane k: elements 4k..4k+3 of every 32-element
 * sub-block, times its scale) and 4 for the mins, converted and added to
 * float accumulators in that order.  How the integers get there is free, so
 * a vector holds two tokens: the same 32 nibbles in both halves (one
 * broadcast load, an and, a shift, shared by all the tokens), the two
 * tokens' 32 activation bytes side by side, and one vpmaddubsw and one
 * vpdpwssd (with the sub-block's scale in every int16) leave both
 * tokens' 8 lanes in place, with nothing to fold at the end of a block.  On
 * cores with two 512-bit multipliers (Sapphire/Emerald Rapids: vpmaddubsw
 * on zmm at 2 a cycle, measured, as on ymm) that is half the instructions
 * of the 256-bit kernel per token; on Zen 4, which splits them, the same
 * work in fewer instructions.
 *
 * The activations are rearranged for this once per call, for a span of
 * KZ_SPAN blocks at a time: struct kz_block holds a block of sixteen
 * tokens, the quants of each pair interleaved by sub-block, the scales
 * (y.d) spread to the lanes of their token, and the bsums' pair sums the
 * mins need.  Two blocks (10 KB) so that they, the activation rows they come
 * from, the rows' blocks and the accumulators fit in L1 together: with spans
 * of 4 blocks the rearranging took 17% of the kernel's time in a model's
 * prompt, with 2 14% (it is done for every 16 rows).  Each row's
 * accumulators wait in memory between spans, so each lane still adds its
 * blocks in order and the bits do not change.  Eight pairs share each
 * unpacked block (four, with two chains each: 76 GMAC/s on one core; eight
 * with one: 83; 512 rows of 4096 by 64 tokens, from L2; the 256-bit kernel
 * of quant_krows_tmpl.h: 57).  The scales come from registers (vpbroadcastd
 * per sub-block): as a broadcast memory operand of vpdpwssd it ran the same.
 */
#define KZ_SPAN 2    /* blocks per span */
#define KZ_TOKENS 16 /* tokens per group: eight pairs, four quads */

/* CALL(np) with np a constant from 1 to 8 */
#define KZ_SWITCH(n, CALL)                                                                       \
	switch (n) {                                                                               \
	case 1: CALL(1); break;                                                                    \
	case 2: CALL(2); break;                                                                    \
	case 3: CALL(3); break;                                                                    \
	case 4: CALL(4); break;                                                                    \
	case 5: CALL(5); break;                                                                    \
	case 6: CALL(6); break;                                                                    \
	case 7: CALL(7); break;                                                                    \
	default: CALL(8); break;                                                                   \
	}

struct kz_block {
	int8_t qs[KZ_TOKENS / 2][8][64]; /* pair p, sub-block s: token 2p's 32, then 2p+1's */
	float dp[KZ_TOKENS / 2][16];     /* pair p: token 2p's y.d x8, then 2p+1's */
	float dq[KZ_TOKENS / 4][16];     /* quad q: tokens 4q..4q+3's y.d x4 */
	int16_t q8s[KZ_TOKENS / 4][32];  /* quad q: each token's bsums[2k] + bsums[2k+1] */
};
_Static_assert(sizeof(struct kz_block) % 64 == 0, "kz_block");

/* Blocks b0 .. b0 + nbs - 1 of the tn (<= KZ_TOKENS) activation rows at a;
 * the tokens past tn are zeros (their lanes are computed and dropped).
 * For Q6_K (six) the quants go in as y + 128 (y ^ 0x80), unsigned. */
VBMI static void kz_fill(struct kz_block *T, const uint8_t *a, size_t a_stride, unsigned tn,
			 size_t b0, size_t nbs, bool six)
{
	/* Q6_K reads the quants as unsigned, y + 128 (kz_q6_k_row) */
	const __m256i flip = _mm256_set1_epi8(six ? (char)0x80 : 0);

	if (tn < KZ_TOKENS)
		memset(T, 0, nbs * sizeof(*T));
	for (unsigned t = 0; t < tn; t++) {
		const struct eng_block_q8_k *y = (const struct eng_block_q8_k *)(a + t * a_stride) + b0;
		const unsigned p = t / 2, h = t % 2, q = t / 4, i = t % 4;

		for (size_t b = 0; b < nbs; b++) {
			const __m256i bs = _mm256_loadu_si256((const void *)y[b].bsums);

			for (int s = 0; s < 8; s++)
				_mm256_store_si256((void *)&T[b].qs[p][s][32 * h],
						   _mm256_xor_si256(flip, _mm256_loadu_si256(
									  (const void *)(y[b].qs + 32 * s))));
			_mm256_store_ps(&T[b].dp[p][8 * h], _mm256_broadcast_ss(&y[b].d));
			_mm_store_ps(&T[b].dq[q][4 * i], _mm_broadcast_ss(&y[b].d));
			_mm_store_si128((void *)&T[b].q8s[q][8 * i],
					_mm_hadd_epi16(_mm256_castsi256_si128(bs),
						       _mm256_extracti128_si256(bs, 1)));
		}
	}
}

/* Blocks 0 .. nbs - 1 of row x by np (1 to 8, a constant where inlined)
 * pairs of tokens from T, into the row's accumulators. */
VBMI static inline __attribute__((always_inline)) void
kz_q4_k_row(const struct eng_block_q4_k *x, const struct kz_block *T, size_t nbs,
	    const unsigned np, __m512 *acc_io, __m512 *accm_io)
{
	const unsigned nq = (np + 1) / 2;
	const bool two = np <= 4;
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	__m512 acc[KZ_TOKENS / 2], accm[KZ_TOKENS / 4];

	for (unsigned p = 0; p < np; p++)
		acc[p] = acc_io[p];
	for (unsigned q = 0; q < nq; q++)
		accm[q] = accm_io[q];
	for (size_t b = 0; b < nbs; b++) {
		const struct eng_block_q4_k *xb = x + b;
		const __m128i sm = k4_scales_mins(xb->scales);
		/* dword j: scale j in both int16 halves, for vpdpwssd's broadcast */
		const __m256i s32 = _mm256_cvtepu8_epi32(sm);
		int32_t tab[8] __attribute__((aligned(32)));
		const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64((const void *)&xb->d));
		const __m512 dv = _mm512_broadcastss_ps(dm);
		const __m512 dminv = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
		const __m512i mz = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm)));
		/* up to four pairs, two chains a pair (vpdpwssd's latency;
		 * more would not fit the registers): integers, any order */
		__m512i sumi[KZ_TOKENS / 2], sumh[KZ_TOKENS / 2];

		_mm256_store_si256((void *)tab, _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16)));
		_mm_prefetch((const char *)(xb + KZ_SPAN), _MM_HINT_T0);
		_mm_prefetch((const char *)(xb + KZ_SPAN) + 64, _MM_HINT_T0);
		_mm_prefetch((const char *)(xb + KZ_SPAN) + 128, _MM_HINT_T0);
		for (unsigned p = 0; p < np; p++)
			sumi[p] = sumh[p] = _mm512_setzero_si512();
#pragma GCC unroll 4
		for (int j = 0; j < ENG_QK_K / 64; j++) {
			const __m512i bits = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->qs + 32 * j)));
			const __m512i ql = _mm512_and_si512(bits, m4);
			const __m512i qh = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
			const __m512i sl = _mm512_set1_epi32(tab[2 * j]);
			const __m512i sh = _mm512_set1_epi32(tab[2 * j + 1]);

			for (unsigned p = 0; p < np; p++) {
				const __m512i yl = _mm512_load_si512(T[b].qs[p][2 * j]);
				const __m512i yh = _mm512_load_si512(T[b].qs[p][2 * j + 1]);

				sumi[p] = _mm512_dpwssd_epi32(sumi[p], _mm512_maddubs_epi16(ql, yl), sl);
				if (two)
					sumh[p] = _mm512_dpwssd_epi32(sumh[p],
								      _mm512_maddubs_epi16(qh, yh), sh);
				else
					sumi[p] = _mm512_dpwssd_epi32(sumi[p],
								      _mm512_maddubs_epi16(qh, yh), sh);
			}
		}
		for (unsigned p = 0; p < np; p++)
			acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(T[b].dp[p]), dv),
						 _mm512_cvtepi32_ps(two ? _mm512_add_epi32(sumi[p], sumh[p])
								    : sumi[p]),
						 acc[p]);
		for (unsigned q = 0; q < nq; q++) {
			const __m512i m = _mm512_madd_epi16(mz, _mm512_load_si512(T[b].q8s[q]));

			accm[q] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_load_ps(T[b].dq[q]), dminv),
						   _mm512_cvtepi32_ps(m), accm[q]);
		}
	}
	for (unsigned p = 0; p < np; p++)
		acc_io[p] = acc[p];
	for (unsigned q = 0; q < nq; q++)
		accm_io[q] = accm[q];
}

/*
 * Q6_K the same way (kz_q4_k's comment): each row and token bit-identical to
 * vec_dot_q6_k_q8_k_vnni, whose lane k of a block is sum over the eight
 * 32-element chunks of scale * (q - 32) * y over elements 4k..4k+3 of the
 * chunk (the chunk's first 16 elements have one scale, its last 16 the
 * next).  vpmaddubsw wants one operand unsigned: here the activations, as
 * y + 128 (kz_fill), against q - 32 signed, and
 *   sum s (q - 32) y = sum s (q - 32) (y + 128) - 128 sum s (q - 32)
 * where the last sum depends on the row alone: it is computed once per
 * block, as for one more token whose y + 128 are all 128, and taken from
 * every token's lanes.  The int16 products stay
 * within +-16320 (255 * 32 * 2): vpmaddubsw never saturates.  The scales of
 * a chunk are put in place by one broadcast load from a table of the
 * block's 16 scales, each widened to eight int16 (4 vpermw).
 */
VBMI static inline __attribute__((always_inline)) void
kz_q6_k_row(const struct eng_block_q6_k *x, const struct kz_block *T, size_t nbs,
	    const unsigned np, __m512 *acc_io)
{
	const bool two = np <= 4;
	const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
	const __m512i m32 = _mm512_set1_epi8(32), u128 = _mm512_set1_epi8((char)0x80);
	__m512 acc[KZ_TOKENS / 2];

	for (unsigned p = 0; p < np; p++)
		acc[p] = acc_io[p];
	for (size_t b = 0; b < nbs; b++) {
		const struct eng_block_q6_k *xb = x + b;
		const __m512i sc16 = _mm512_zextsi256_si512(
			_mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)xb->scales)));
		/* tab + 32 g: chunk g's two scales, each as eight int16 */
		int16_t tab[16 * 8] __attribute__((aligned(64)));
		const __m512 dv = _mm512_set1_ps(fp16(xb->d));
		__m512i sumi[KZ_TOKENS / 2], sumh[KZ_TOKENS / 2], corr = _mm512_setzero_si512();

		for (int c = 0; c < 4; c++) {
			/* word w of vector c: scale 4c + w / 8 */
			const __m512i idx = _mm512_add_epi16(
				_mm512_set1_epi16((short)(4 * c)),
				_mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22,
								   21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
								   11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
						  3));

			_mm512_store_si512(tab + 32 * c, _mm512_permutexvar_epi16(idx, sc16));
		}
		for (int l = 0; l < 4; l++)
			_mm_prefetch((const char *)(xb + KZ_SPAN) + 64 * l, _MM_HINT_T0);
		for (unsigned p = 0; p < np; p++)
			sumi[p] = sumh[p] = _mm512_setzero_si512();
#pragma GCC unroll 2
		for (int h = 0; h < ENG_QK_K / 128; h++) {
			const __m512i b1 = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->ql + 64 * h)));
			const __m512i b2 = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->ql + 64 * h + 32)));
			const __m512i bh = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->qh + 32 * h)));
			/* the 6-bit quants of chunks 4h .. 4h + 3 (q6_k_unpack), minus 32 */
			const __m512i q[4] = {
				_mm512_sub_epi8(_mm512_ternarylogic_epi32(
							b1, m4, _mm512_and_si512(_mm512_slli_epi16(bh, 4), m30), 0xea),
						m32),
				_mm512_sub_epi8(_mm512_ternarylogic_epi32(
							b2, m4, _mm512_and_si512(_mm512_slli_epi16(bh, 2), m30), 0xea),
						m32),
				_mm512_sub_epi8(_mm512_ternarylogic_epi32(_mm512_srli_epi16(b1, 4), m4,
									  _mm512_and_si512(bh, m30), 0xea),
						m32),
				_mm512_sub_epi8(_mm512_ternarylogic_epi32(
							_mm512_srli_epi16(b2, 4), m4,
							_mm512_and_si512(_mm512_srli_epi16(bh, 2), m30), 0xea),
						m32),
			};

#pragma GCC unroll 4
			for (int k = 0; k < 4; k++) {
				const int g = 4 * h + k;
				const __m512i sg = _mm512_broadcast_i64x4(
					_mm256_load_si256((const void *)(tab + 16 * g)));

				corr = _mm512_dpwssd_epi32(corr, _mm512_maddubs_epi16(u128, q[k]), sg);
				for (unsigned p = 0; p < np; p++) {
					const __m512i yk = _mm512_load_si512(T[b].qs[p][g]);
					const __m512i p16 = _mm512_maddubs_epi16(yk, q[k]);

					if (two && (k & 1))
						sumh[p] = _mm512_dpwssd_epi32(sumh[p], p16, sg);
					else
						sumi[p] = _mm512_dpwssd_epi32(sumi[p], p16, sg);
				}
			}
		}
		for (unsigned p = 0; p < np; p++) {
			const __m512i s = two ? _mm512_add_epi32(sumi[p], sumh[p]) : sumi[p];

			acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(T[b].dp[p]), dv),
						 _mm512_cvtepi32_ps(_mm512_sub_epi32(s, corr)), acc[p]);
		}
	}
	for (unsigned p = 0; p < np; p++)
		acc_io[p] = acc[p];
}

/* nrows (8 or 16) rows of Q4_K (Q6_K if six) by nt (2 or more) tokens. */
VBMI static inline __attribute__((always_inline)) void
kz_rows(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride, const void *w,
	size_t stride, const void *a, size_t a_stride, const bool six)
{
	const size_t nb = n / ENG_QK_K;
	struct kz_block T[KZ_SPAN] __attribute__((aligned(64)));
	__m512 acc[16][KZ_TOKENS / 2], accm[16][KZ_TOKENS / 4];

	for (unsigned t0 = 0; t0 < nt; t0 += KZ_TOKENS) {
		const unsigned tn = nt - t0 < KZ_TOKENS ? nt - t0 : KZ_TOKENS;
		const unsigned np = (tn + 1) / 2;

		for (unsigned r = 0; r < nrows; r++) {
			for (int p = 0; p < KZ_TOKENS / 2; p++)
				acc[r][p] = _mm512_setzero_ps();
			for (int q = 0; q < KZ_TOKENS / 4; q++)
				accm[r][q] = _mm512_setzero_ps();
		}
		for (size_t b0 = 0; b0 < nb; b0 += KZ_SPAN) {
			const size_t nbs = nb - b0 < KZ_SPAN ? nb - b0 : KZ_SPAN;

			kz_fill(T, (const uint8_t *)a + t0 * a_stride, a_stride, tn, b0, nbs, six);
			for (unsigned r = 0; r < nrows; r++) {
				const uint8_t *row = (const uint8_t *)w + r * stride;

				if (six) {
					const struct eng_block_q6_k *x =
						(const struct eng_block_q6_k *)row + b0;

#define CALL(k) kz_q6_k_row(x, T, nbs, k, acc[r])
					KZ_SWITCH(np, CALL)
#undef CALL
				} else {
					const struct eng_block_q4_k *x =
						(const struct eng_block_q4_k *)row + b0;

#define CALL(k) kz_q4_k_row(x, T, nbs, k, acc[r], accm[r])
					KZ_SWITCH(np, CALL)
#undef CALL
				}
			}
		}
		/* each token's lanes reduced as vec_dot_q4_k_q8_k_vnni
		 * (vec_dot_q6_k_q8_k_vnni: no mins) does */
		for (unsigned r = 0; r < nrows; r++) {
			float l[KZ_TOKENS / 2][16], m[KZ_TOKENS / 4][16];

			for (int p = 0; p < KZ_TOKENS / 2; p++)
				_mm512_storeu_ps(l[p], acc[r][p]);
			for (int q = 0; q < KZ_TOKENS / 4; q++)
				_mm512_storeu_ps(m[q], accm[r][q]);
			for (unsigned t = 0; t < tn; t++) {
				const float *x = &l[t / 2][8 * (t % 2)], *y = &m[t / 4][4 * (t % 4)];

				const float lanes = ((x[0] + x[4]) + (x[2] + x[6])) +
						    ((x[1] + x[5]) + (x[3] + x[7]));

				out[(t0 + t) * out_stride + r] =
					six ? lanes : lanes + ((y[0] + y[2]) + (y[1] + y[3]));
			}
		}
	}
}

VBMI static void kz_q4_k(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			 const void *w, size_t stride, const void *a, size_t a_stride)
{
	kz_rows(n, nrows, nt, out, out_stride, w, stride, a, a_stride, false);
}

VBMI static void kz_q6_k(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			 const void *w, size_t stride, const void *a, size_t a_stride)
{
	kz_rows(n, nrows, nt, out, out_stride, w, stride, a, a_stride, true);
}

VBMI static void vec_dot16_q4_k_q8_k_vbmi(size_t n, unsigned nt, float *out, size_t out_stride,
					   const void *w, size_t stride, const void *a,
					   size_t a_stride)
{
	if (nt == 1) { /* decoding: nothing to share */
		for (int r = 0; r < 16; r++)
			out[r] = dot1_q4_k(n, (const void *)((const uint8_t *)w + r * stride), a);
		return;
	}
	kz_q4_k(n, 16, nt, out, out_stride, w, stride, a, a_stride);
}

/* Decoding (one token): the eight rows one after the other with the VBMI
 * kernel; two tokens or more: kz_q4_k, which shares each block between
 * them, bit-identical to this one. */
VBMI static void vec_dot8_q4_k_q8_k_vbmi(size_t n, unsigned nt, float *out, size_t out_stride,
					  const void *w, size_t stride, const void *a,
					  size_t a_stride)
{
	if (nt > 1) {
		kz_q4_k(n, 8, nt, out, out_stride, w, stride, a, a_stride);
		return;
	}
	for (int r = 0; r < 8; r++)
		out[r] = dot1_q4_k(n, (const void *)((const uint8_t *)w + r * stride), a);
}

/*
 * Q6_K with AVX-512 VNNI: the lanes of vec_dot_q6_k_q8_k exactly, with the
 * sixteen scales widened once per block and each pair put in place by one
 * pshufb (low 128 bits scale 2k, high 2k + 1), and vpdpwssd doing the scale
 * madd and the add in one.
 */
VNNI static void vec_dot_q6_k_q8_k_vnni(size_t n, float *out, const void *w, const void *a)
{
	const struct eng_block_q6_k *x = w;
	const struct eng_block_q8_k *y = a;
	const __m256i m32 = _mm256_set1_epi8(32);
	__m256i shuf[4];
	__m256 acc = _mm256_setzero_ps();

	for (int k = 0; k < 4; k++)
		shuf[k] = _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 * (4 * k + 3) + 4 * k + 2)),
					   _mm_set1_epi16((short)(0x0100 * (4 * k + 1) + 4 * k)));
	const char *pf = (const char *)x + K_PREFETCH_ROWS * (n / ENG_QK_K) * sizeof(*x);

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const float d = y[i].d * fp16(x[i].d);

		/* the lines of block i, 210 bytes: four or five (the fifth is
		 * the next block's first) */
		for (int l = 0; l < 4; l++)
			_mm_prefetch(pf + i * sizeof(*x) + 64 * l, _MM_HINT_T1);

		const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)x[i].scales));
		__m256i sumi = _mm256_setzero_si256();

		for (int h = 0; h < ENG_QK_K / 128; h++) {
			const uint8_t *ql = x[i].ql + 64 * h, *qhp = x[i].qh + 32 * h;
			const int8_t *q8 = y[i].qs + 128 * h;
			/* scales 8h .. 8h + 7 in both halves */
			const __m256i sch = h ? _mm256_permute4x64_epi64(sc16, 0xee)
					 : _mm256_permute4x64_epi64(sc16, 0x44);
			__m256i q[4];

			q6_k_unpack(ql, qhp, q);
			for (int k = 0; k < 4; k++) {
				const __m256i yk = _mm256_loadu_si256((const void *)(q8 + 32 * k));
				const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q[k], yk),
								     _mm256_maddubs_epi16(m32, yk));

				sumi = _mm256_dpwssd_epi32(sumi, p16, _mm256_shuffle_epi8(sch, shuf[k]));
			}
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
	}
	*out = hsum_f32x8(acc);
}

/* Q6_K: decoding (one token) with the one-row kernel, row after row; two
 * tokens or more: kz_q6_k, bit-identical to it. */
VBMI static void vec_dot8_q6_k_q8_k_vbmi(size_t n, unsigned nt, float *out, size_t out_stride,
					  const void *w, size_t stride, const void *a,
					  size_t a_stride)
{
	if (nt > 1) {
		kz_q6_k(n, 8, nt, out, out_stride, w, stride, a, a_stride);
		return;
	}
	for (int r = 0; r < 8; r++)
		vec_dot_q6_k_q8_k_vnni(n, out + r, (const uint8_t *)w + r * stride, a);
}

VBMI static void vec_dot16_q6_k_q8_k_vbmi(size_t n, unsigned nt, float *out, size_t out_stride,
					   const void *w, size_t stride, const void *a,
					   size_t a_stride)
{
	if (nt > 1) {
		kz_q6_k(n, 16, nt, out, out_stride, w, stride, a, a_stride);
		return;
	}
	for (int r = 0; r < 16; r++)
		vec_dot_q6_k_q8_k_vnni(n, out + r, (const uint8_t *)w + r * stride, a);
}

/*
 * Q8_0 by a prompt's tokens (vec_dot16, and vec_dot8 for two tokens or
 * more), two tokens a 512-bit vector as for the K-quants (kz_q4_k): each
 * row and token bit-identical to dot8_q8_0_vnni, whose lane k of a block is
 * the exact sum of elements 4k..4k+3, converted and added to its float lane
 * with d = x.d * y.d by one FMA.  A row's block, biased to unsigned
 * (x + 128), is broadcast to both halves once for all the tokens, and one
 * vpdpbusd, started from the pair's -128 * (lane sums of y), leaves both
 * tokens' lanes; with the product of the scales, the conversion and the FMA
 * that is four instructions for 64 products where the 256-bit kernel took
 * four (the scale's permute among them) for 32.  The pairs' quants, lane
 * sums and scales are laid out once per call, KQ_SPAN blocks at a time.
 */
#define KQ_SPAN 8 /* blocks per span: 12 KB */

struct kq_block {
	int8_t qs[KZ_TOKENS / 2][64];     /* pair p: token 2p's 32 quants, then 2p+1's */
	int32_t base[KZ_TOKENS / 2][16];  /* the same: -128 * each lane's four quants */
	float dy[KZ_TOKENS / 2][16];      /* the same: y.d x8 */
};
_Static_assert(sizeof(struct kq_block) % 64 == 0, "kq_block");

VNNI static void kq_fill(struct kq_block *T, const uint8_t *a, size_t a_stride, unsigned tn,
			 size_t b0, size_t nbs)
{
	const __m256i bias = _mm256_set1_epi8((char)0x80);

	if (tn < KZ_TOKENS)
		memset(T, 0, nbs * sizeof(*T));
	for (unsigned t = 0; t < tn; t++) {
		const struct eng_block_q8_0 *y = (const struct eng_block_q8_0 *)(a + t * a_stride) + b0;
		const unsigned p = t / 2, h = t % 2;

		for (size_t b = 0; b < nbs; b++) {
			const __m256i qy = _mm256_loadu_si256((const void *)y[b].qs);

			_mm256_store_si256((void *)&T[b].qs[p][32 * h], qy);
			_mm256_store_si256((void *)&T[b].base[p][8 * h],
					   _mm256_sub_epi32(_mm256_setzero_si256(),
							    _mm256_dpbusd_epi32(_mm256_setzero_si256(),
										bias, qy)));
			_mm256_store_ps(&T[b].dy[p][8 * h], fp16x8(y[b].d));
		}
	}
}

/* Blocks 0 .. nbs - 1 of row x by np (1 to 8, a constant where inlined)
 * pairs of tokens from T. */
VNNI static inline __attribute__((always_inline)) void
kq_row(const struct eng_block_q8_0 *x, const struct kq_block *T, size_t nbs, const unsigned np,
       __m512 *acc_io)
{
	const __m512i bias = _mm512_set1_epi8((char)0x80);
	__m512 acc[KZ_TOKENS / 2];

	for (unsigned p = 0; p < np; p++)
		acc[p] = acc_io[p];
	for (size_t b = 0; b < nbs; b++) {
		const __m512i wq = _mm512_xor_si512(
			bias, _mm512_broadcast_i64x4(_mm256_loadu_si256((const void *)x[b].qs)));
		const __m512 dx = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(x[b].d)));

		_mm_prefetch((const char *)(x + b + KQ_SPAN), _MM_HINT_T0);
		for (unsigned p = 0; p < np; p++) {
			const __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(T[b].base[p]), wq,
							      _mm512_load_si512(T[b].qs[p]));

			acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_load_ps(T[b].dy[p])),
						 _mm512_cvtepi32_ps(s), acc[p]);
		}
	}
	for (unsigned p = 0; p < np; p++)
		acc_io[p] = acc[p];
}

/* nrows (8 or 16) rows by nt (2 or more) tokens. */
VNNI static void kq_q8_0(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			 const void *w, size_t stride, const void *a, size_t a_stride)
{
	const size_t nb = n / ENG_QK8_0;
	struct kq_block T[KQ_SPAN] __attribute__((aligned(64)));
	__m512 acc[16][KZ_TOKENS / 2];

	for (unsigned t0 = 0; t0 < nt; t0 += KZ_TOKENS) {
		const unsigned tn = nt - t0 < KZ_TOKENS ? nt - t0 : KZ_TOKENS;
		const unsigned np = (tn + 1) / 2;

		for (unsigned r = 0; r < nrows; r++)
			for (int p = 0; p < KZ_TOKENS / 2; p++)
				acc[r][p] = _mm512_setzero_ps();
		for (size_t b0 = 0; b0 < nb; b0 += KQ_SPAN) {
			const size_t nbs = nb - b0 < KQ_SPAN ? nb - b0 : KQ_SPAN;

			kq_fill(T, (const uint8_t *)a + t0 * a_stride, a_stride, tn, b0, nbs);
			for (unsigned r = 0; r < nrows; r++) {
				const struct eng_block_q8_0 *x =
					(const struct eng_block_q8_0 *)((const uint8_t *)w + r * stride) +
					b0;

#define CALL(k) kq_row(x, T, nbs, k, acc[r])
				KZ_SWITCH(np, CALL)
#undef CALL
			}
		}
		for (unsigned r = 0; r < nrows; r++) {
			float l[KZ_TOKENS / 2][16];

			for (int p = 0; p < KZ_TOKENS / 2; p++)
				_mm512_storeu_ps(l[p], acc[r][p]);
			for (unsigned t = 0; t < tn; t++) {
				const float *x = &l[t / 2][8 * (t % 2)];

				/* hsum_f32x8's order */
				out[(t0 + t) * out_stride + r] = ((x[0] + x[4]) + (x[2] + x[6])) +
								 ((x[1] + x[5]) + (x[3] + x[7]));
			}
		}
	}
}

VNNI static void vec_dot8_q8_0_zmm(size_t n, unsigned nt, float *out, size_t out_stride,
				   const void *w, size_t stride, const void *a, size_t a_stride)
{
	if (nt == 1) { /* decoding: the rows side by side */
		dot8_q8_0_vnni(n, 1, out, out_stride, w, stride, a, a_stride);
		return;
	}
	kq_q8_0(n, 8, nt, out, out_stride, w, stride, a, a_stride);
}

VNNI static void vec_dot16_q8_0_zmm(size_t n, unsigned nt, float *out, size_t out_stride,
				    const void *w, size_t stride, const void *a, size_t a_stride)
{
	if (nt == 1) {
		dot8_q8_0_vnni(n, 1, out, out_stride, w, stride, a, a_stride);
		dot8_q8_0_vnni(n, 1, out + 8, out_stride, (const uint8_t *)w + 8 * stride, stride, a,
			       a_stride);
		return;
	}
	kq_q8_0(n, 16, nt, out, out_stride, w, stride, a, a_stride);
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

/* ---- eight rows by several tokens --------------------------------------- */

#define KR_ATTR VNNI
#define KR_NAME(f) f##_vnni
#define KR_DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#define KR_DOT1_Q4_K vec_dot_q4_k_q8_k_vnni
#define KR_DOT1_Q6_K vec_dot_q6_k_q8_k_vnni
#include "quant_krows_tmpl.h"

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
	avx512.vec_dot8[ENG_TYPE_Q8_0] = vec_dot8_q8_0_zmm;
	avx512.vec_dot16[ENG_TYPE_Q8_0] = vec_dot16_q8_0_zmm;
	avx512.pack8[ENG_TYPE_Q8_0] = NULL; /* it reads the Q8_0 rows */
	avx512.vec_dot[ENG_TYPE_Q4_K] = vec_dot_q4_k_q8_k_vnni;
	avx512.vec_dot[ENG_TYPE_Q6_K] = vec_dot_q6_k_q8_k_vnni;
	avx512.vec_dot8[ENG_TYPE_Q4_K] = vec_dot8_q4_k_q8_k_vnni;
	avx512.vec_dot8[ENG_TYPE_Q6_K] = vec_dot8_q6_k_q8_k_vnni;
	avx512_novbmi = avx512;
	avx512_novbmi.isa = "avx512-novbmi";
	if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi")) {
		avx512.vec_dot8[ENG_TYPE_Q4_K] = vec_dot8_q4_k_q8_k_vbmi;
		avx512.vec_dot16[ENG_TYPE_Q4_K] = vec_dot16_q4_k_q8_k_vbmi;
		avx512.vec_dot8[ENG_TYPE_Q6_K] = vec_dot8_q6_k_q8_k_vbmi;
		avx512.vec_dot16[ENG_TYPE_Q6_K] = vec_dot16_q6_k_q8_k_vbmi;
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
