/*
 * quant_avx512_prompt.c - the avx512 set's kernels for a prompt's tokens:
 * Q4_K, Q6_K (with VBMI) and Q8_0 by two tokens or more, two tokens a
 * 512-bit vector, each block of a row unpacked once for sixteen tokens.
 * quant_avx512.c's vec_dotn kernels call them for every call of two tokens
 * or more (a thread's whole matmul chunk of rows) and keep decoding (one
 * token) to themselves.
 *
 * Numerics: each row and token gets the bits of the one-row kernel it
 * stands in for (tests/test_quant.c checks every vec_dot16 against vec_dot,
 * 1 to 64 tokens): the integer sums are exact whatever the instructions, and
 * the float operations are the same ones in the same order, lane by lane.
 * Built with the AVX2 flags like quant_avx512.c; every kernel carries its
 * own target attribute.
 */
#include "quant_avx512_i.h"

#include <string.h>

/*
 * Q4_K by a prompt's tokens in 512-bit vectors (the set's vec_dotn, for
 * two tokens or more), each row and token bit-identical to
 * vec_dot_q4_k_q8_k_vnni.  What is fixed is the lanes: each row keeps, per
 * block, 8 int32 sums (lane k: elements 4k..4k+3 of every 32-element
 * sub-block, times its scale) and 4 for the mins, converted and added to
 * float accumulators in that order.  How the integers get there is free, so
 * a vector holds two tokens: the same 32 bytes of nibbles in both halves
 * (one broadcast load, shared by all the tokens), the two tokens' 32
 * activation bytes side by side, and both tokens' 8 lanes end in place,
 * with nothing to fold at the end of a block.  Two sub-blocks share one
 * vpdpwssd as in the 256-bit kernels (k4_pair_a and k4_pair_b,
 * quant_x86_i.h): the nibbles and the activations are paired by 16-bit
 * words, so that two vpmaddubsw and a 16-bit add leave sub-block 2j's
 * four-product sums in the even words and 2j + 1's in the odd ones, and
 * one vpdpwssd against [s_2j, s_2j+1] in every dword adds both, scaled,
 * to the lanes they had before.  Three multiplies a token pair and 64
 * elements instead of four: one core, 4096 rows of 4096 by 64 tokens,
 * 176 -> 192 GMAC/s, by 8 tokens 173 -> 179 (docs/benchmarks.md, issue
 * 17, session 48).  On cores with two 512-bit multipliers
 * (Sapphire/Emerald Rapids: vpmaddubsw on zmm at 2 a cycle, measured, as
 * on ymm) that is half the instructions of the 256-bit kernel per token;
 * on Zen 4, which splits them, the same work in fewer instructions.
 *
 * The activations are rearranged for this once per call, for a span of
 * KZ_SPAN blocks at a time: struct kz_block holds a block of sixteen
 * tokens, the quants of each pair interleaved by sub-block, the scales
 * (y.d) spread to the lanes of their token, and the bsums' pair sums the
 * mins need.  Two blocks (10 KB) so that they, the activation rows they come
 * from and the rows' blocks fit in L1 together: with spans of 4 blocks the
 * rearranging took 17% of the kernel's time in a model's prompt, with 2
 * 14%, when it was done for every 16 rows; it is now done once for all the
 * rows of a call (KZ_ACC), and spans of 4 run as fast as 2.  Each row's
 * accumulators wait in memory between spans, so each lane still adds its
 * blocks in order and the bits do not change.  Eight pairs share each
 * unpacked block (four, with two chains each: 76 GMAC/s on one core; eight
 * with one: 83; 512 rows of 4096 by 64 tokens, from L2; the 256-bit kernel
 * of quant_krows_tmpl.h: 57; an Intel Xeon, before the pairing).  Paired,
 * one chain a token pair is the faster on the Zen 5, also for one or two
 * pairs (two chains, as before, were 0.94-0.97x at 4 and 8 tokens).  The
 * paired scales come from registers (vpbroadcastd per pair of sub-blocks):
 * as a broadcast memory operand of vpdpwssd it ran the same.
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
	/* pair p, 2j and 2j + 1: k4_pair_a and k4_pair_b of sub-blocks 2j and
	 * 2j + 1 (32-element chunks), token 2p's 32 bytes, then 2p+1's */
	int8_t qs[KZ_TOKENS / 2][8][64];
	float dp[KZ_TOKENS / 2][16];     /* pair p: token 2p's y.d x8, then 2p+1's */
	float dq[KZ_TOKENS / 4][16];     /* quad q: tokens 4q..4q+3's y.d x4 */
	int16_t q8s[KZ_TOKENS / 4][32];  /* quad q: each token's bsums[2k] + bsums[2k+1] */
};
_Static_assert(sizeof(struct kz_block) % 64 == 0, "kz_block");

/* Blocks b0 .. b0 + nbs - 1 of the tn (<= KZ_TOKENS) activation rows at a,
 * each 64 quants k4_pair'ed for the kernels' shared vpdpwssd; the tokens
 * past tn are zeros (their lanes are computed and dropped).  For Q6_K
 * (six) the quants go in as y + 128 (y ^ 0x80), unsigned. */
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
			for (int j = 0; j < 4; j++) {
				const int8_t *yq = y[b].qs + 64 * j;
				const __m256i l = _mm256_xor_si256(
					flip, _mm256_loadu_si256((const void *)yq));
				const __m256i hi = _mm256_xor_si256(
					flip, _mm256_loadu_si256((const void *)(yq + 32)));

				_mm256_store_si256((void *)&T[b].qs[p][2 * j][32 * h],
						   k4_pair_a(l, hi));
				_mm256_store_si256((void *)&T[b].qs[p][2 * j + 1][32 * h],
						   k4_pair_b(l, hi));
			}
			_mm256_store_ps(&T[b].dp[p][8 * h], _mm256_broadcast_ss(&y[b].d));
			_mm_store_ps(&T[b].dq[q][4 * i], _mm_broadcast_ss(&y[b].d));
			_mm_store_si128((void *)&T[b].q8s[q][8 * i], k_q8_sums_of(&y[b]));
		}
	}
}

/* Blocks 0 .. nbs - 1 of row x by np (1 to 8, a constant where inlined)
 * pairs of tokens from T, into the row's accumulators (first: starting
 * them from zero). */
VBMI static inline __attribute__((always_inline)) void
kz_q4_k_row(const struct eng_block_q4_k *x, const struct kz_block *T, size_t nbs,
	    const unsigned np, bool first, __m512 *acc_io, __m512 *accm_io)
{
	const unsigned nq = (np + 1) / 2;
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	__m512 acc[KZ_TOKENS / 2], accm[KZ_TOKENS / 4];

	for (unsigned p = 0; p < np; p++)
		acc[p] = first ? _mm512_setzero_ps() : acc_io[p];
	for (unsigned q = 0; q < nq; q++)
		accm[q] = first ? _mm512_setzero_ps() : accm_io[q];
	for (size_t b = 0; b < nbs; b++) {
		const struct eng_block_q4_k *xb = x + b;
		const __m128i sm = k4_scales_mins_vbmi(xb->scales);
		/* dword j: scale j */
		const __m256i s32 = _mm256_cvtepu8_epi32(sm);
		/* dword 2j: [s_2j, s_2j+1] as int16s, the paired madd's scales */
		int32_t tab[8] __attribute__((aligned(32)));
		const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64((const void *)&xb->d));
		const __m512 dv = _mm512_broadcastss_ps(dm);
		const __m512 dminv = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
		const __m512i mz = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm)));
		__m512i sumi[KZ_TOKENS / 2];

		_mm256_store_si256((void *)tab, _mm256_or_si256(s32, _mm256_srli_epi64(s32, 16)));
		_mm_prefetch((const char *)(xb + KZ_SPAN), _MM_HINT_T0);
		_mm_prefetch((const char *)(xb + KZ_SPAN) + 64, _MM_HINT_T0);
		_mm_prefetch((const char *)(xb + KZ_SPAN) + 128, _MM_HINT_T0);
		for (unsigned p = 0; p < np; p++)
			sumi[p] = _mm512_setzero_si512();
#pragma GCC unroll 4
		for (int j = 0; j < ENG_QK_K / 64; j++) {
			const __m512i bits = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->qs + 32 * j)));
			/* k4_pair_a and k4_pair_b of the low nibbles (sub-block
			 * 2j) and the high ones (2j + 1), as kz_fill laid the
			 * tokens out: in each dword, qa's low word is the low
			 * nibbles of bits' low word, its high word the high
			 * nibbles of bits' high word; qb's the same of bits with
			 * its words swapped */
			const __m512i sw = _mm512_rol_epi32(bits, 16);
			const __m512i qa =
				_mm512_and_si512(_mm512_mask_srli_epi16(bits, 0xaaaaaaaa, bits, 4), m4);
			const __m512i qb =
				_mm512_and_si512(_mm512_mask_srli_epi16(sw, 0xaaaaaaaa, sw, 4), m4);
			const __m512i sp = _mm512_set1_epi32(tab[2 * j]);

			for (unsigned p = 0; p < np; p++) {
				const __m512i ya = _mm512_load_si512(T[b].qs[p][2 * j]);
				const __m512i yb = _mm512_load_si512(T[b].qs[p][2 * j + 1]);
				const __m512i p16 = _mm512_add_epi16(_mm512_maddubs_epi16(qa, ya),
								     _mm512_maddubs_epi16(qb, yb));

				sumi[p] = _mm512_dpwssd_epi32(sumi[p], p16, sp);
			}
		}
		for (unsigned p = 0; p < np; p++)
			acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(T[b].dp[p]), dv),
						 _mm512_cvtepi32_ps(sumi[p]), acc[p]);
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
 * Q6_K the same way (avx512_prompt_q4_k's comment): each row and token bit-identical to
 * vec_dot_q6_k_q8_k_vnni, whose lane k of a block is sum over the eight
 * 32-element chunks of scale * (q - 32) * y over elements 4k..4k+3 of the
 * chunk (the chunk's first 16 elements have one scale, its last 16 the
 * next).  vpmaddubsw wants one operand unsigned: here the activations, as
 * y + 128 (kz_fill), against q - 32 signed, and
 *   sum s (q - 32) y = sum s (q - 32) (y + 128) - 128 sum s (q - 32)
 * where the last sum depends on the row alone: it is computed once per
 * block, as for one more token whose y + 128 are all 128, and taken from
 * every token's lanes.  Two chunks share a vpdpwssd, paired by 16-bit
 * words as the Q4_K sub-blocks are (kz_fill lays the activations out so for
 * both types).  The int16 products stay within +-16320 (255 * 32 * 2):
 * vpmaddubsw never saturates, and the sum of a pair's two within +-32640.
 * A pair's scales are put in place by one load from a table of the
 * block's 16 scales (4 vpermw).  One core, 64 tokens: 162 -> 172 GMAC/s,
 * 8 tokens 147 -> 154, 4 tokens 109 -> 101 (the pairing's unpacking,
 * shared by fewer tokens; session 48).
 */
VBMI static inline __attribute__((always_inline)) void
kz_q6_k_row(const struct eng_block_q6_k *x, const struct kz_block *T, size_t nbs,
	    const unsigned np, bool first, __m512 *acc_io)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
	const __m512i m32 = _mm512_set1_epi8(32), u128 = _mm512_set1_epi8((char)0x80);
	__m512 acc[KZ_TOKENS / 2];

	for (unsigned p = 0; p < np; p++)
		acc[p] = first ? _mm512_setzero_ps() : acc_io[p];
	for (size_t b = 0; b < nbs; b++) {
		const struct eng_block_q6_k *xb = x + b;
		const __m512i sc16 = _mm512_zextsi256_si512(
			_mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)xb->scales)));
		/* tab + 32 c: the scales of chunks 2c and 2c + 1 for their paired
		 * madd (k4_pair_a), in each token's half: dword k of the low
		 * 128 bits [sc_4c, sc_4c+2] (the chunks' first 16 elements), of
		 * the high ones [sc_4c+1, sc_4c+3] */
		int16_t tab[4 * 32] __attribute__((aligned(64)));
		const __m512 dv = _mm512_set1_ps(fp16(xb->d));
		__m512i sumi[KZ_TOKENS / 2], corr = _mm512_setzero_si512();

		for (int c = 0; c < 4; c++) {
			/* word w: scale 4c + 2 (w % 2) + (w / 8) % 2 */
			const __m512i idx = _mm512_add_epi16(
				_mm512_set1_epi16((short)(4 * c)),
				_mm512_set_epi16(3, 1, 3, 1, 3, 1, 3, 1, 2, 0, 2, 0, 2, 0, 2, 0,
						 3, 1, 3, 1, 3, 1, 3, 1, 2, 0, 2, 0, 2, 0, 2, 0));

			_mm512_store_si512(tab + 32 * c, _mm512_permutexvar_epi16(idx, sc16));
		}
		for (int l = 0; l < 4; l++)
			_mm_prefetch((const char *)(xb + KZ_SPAN) + 64 * l, _MM_HINT_T0);
		for (unsigned p = 0; p < np; p++)
			sumi[p] = _mm512_setzero_si512();
#pragma GCC unroll 2
		for (int h = 0; h < ENG_QK_K / 128; h++) {
			const __m512i b1 = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->ql + 64 * h)));
			const __m512i b2 = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->ql + 64 * h + 32)));
			const __m512i bh = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const void *)(xb->qh + 32 * h)));
			const __m512i bh2 = _mm512_srli_epi16(bh, 2);
			/* paired first (whole 16-bit words: before or after the
			 * 16-bit shifts below, the same), as the AVX2 kernel
			 * (quant_krows_tmpl.h, q6_k_row_tn) */
			const __m512i la = _mm512_mask_blend_epi16(0xaaaaaaaa, b1, b2);
			const __m512i lb =
				_mm512_or_si512(_mm512_srli_epi32(b1, 16), _mm512_slli_epi32(b2, 16));
			const __m512i ha = _mm512_mask_blend_epi16(0xaaaaaaaa, bh, bh2);
			const __m512i hb =
				_mm512_or_si512(_mm512_srli_epi32(bh, 16), _mm512_slli_epi32(bh2, 16));

#pragma GCC unroll 2
			for (int c = 0; c < 2; c++) {
				const int cc = 2 * h + c;
				const __m512i sp = _mm512_load_si512(tab + 32 * cc);
				/* the quants minus 32: (low 4 bits | high 2 << 4) - 32 */
				const __m512i la4 = c ? _mm512_srli_epi16(la, 4) : la;
				const __m512i lb4 = c ? _mm512_srli_epi16(lb, 4) : lb;
				const __m512i ha4 = c ? ha : _mm512_slli_epi16(ha, 4);
				const __m512i hb4 = c ? hb : _mm512_slli_epi16(hb, 4);
				const __m512i qa = _mm512_sub_epi8(
					_mm512_ternarylogic_epi32(la4, m4, _mm512_and_si512(ha4, m30), 0xea),
					m32);
				const __m512i qb = _mm512_sub_epi8(
					_mm512_ternarylogic_epi32(lb4, m4, _mm512_and_si512(hb4, m30), 0xea),
					m32);

				/* 128 (qa + qb) in pairs: the bytes add up within -64..62 */
				corr = _mm512_dpwssd_epi32(
					corr, _mm512_maddubs_epi16(u128, _mm512_add_epi8(qa, qb)), sp);
				for (unsigned p = 0; p < np; p++) {
					const __m512i ya = _mm512_load_si512(T[b].qs[p][2 * cc]);
					const __m512i yb = _mm512_load_si512(T[b].qs[p][2 * cc + 1]);
					const __m512i p16 = _mm512_add_epi16(_mm512_maddubs_epi16(ya, qa),
									     _mm512_maddubs_epi16(yb, qb));

					sumi[p] = _mm512_dpwssd_epi32(sumi[p], p16, sp);
				}
			}
		}
		for (unsigned p = 0; p < np; p++) {
			acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(T[b].dp[p]), dv),
						 _mm512_cvtepi32_ps(_mm512_sub_epi32(sumi[p], corr)), acc[p]);
		}
	}
	for (unsigned p = 0; p < np; p++)
		acc_io[p] = acc[p];
}

/*
 * The accumulators a call keeps in memory between spans, for as many rows
 * as fit: each row's np (Q4_K: np + (np + 1) / 2, the mins' too) vectors.
 * A call lays out a span of the activations once for all those rows: with
 * sixteen tokens 64 rows (a prompt's whole matmul chunk), 128 with eight.
 * 48 KB on the stack; they live in L2 more than in L1, each row's few
 * lines loaded and stored once a span, and started at zero by the first
 * span (the row functions' first: zeroing all 48 KB for each group of
 * tokens was 0.9% of an AVX-512 prompt).
 */
#define KZ_ACC 768

/* nrows (1 or more) rows of Q4_K (Q6_K if six) by nt (1 or more) tokens. */
VBMI static inline __attribute__((always_inline)) void
kz_rows(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride, const void *w,
	size_t stride, const void *a, size_t a_stride, const bool six)
{
	const size_t nb = n / ENG_QK_K;
	struct kz_block T[KZ_SPAN] __attribute__((aligned(64)));
	__m512 acc[KZ_ACC];

	for (unsigned t0 = 0; t0 < nt; t0 += KZ_TOKENS) {
		const unsigned tn = nt - t0 < KZ_TOKENS ? nt - t0 : KZ_TOKENS;
		const unsigned np = (tn + 1) / 2, nq = six ? 0 : (np + 1) / 2;
		const unsigned per = np + nq, rows_max = KZ_ACC / per;

		for (unsigned r0 = 0; r0 < nrows; r0 += rows_max) {
			const unsigned rn = nrows - r0 < rows_max ? nrows - r0 : rows_max;
			const uint8_t *w0 = (const uint8_t *)w + r0 * stride;

			for (size_t b0 = 0; b0 < nb; b0 += KZ_SPAN) {
				const size_t nbs = nb - b0 < KZ_SPAN ? nb - b0 : KZ_SPAN;

				kz_fill(T, (const uint8_t *)a + t0 * a_stride, a_stride, tn, b0, nbs,
					six);
				for (unsigned r = 0; r < rn; r++) {
					const uint8_t *row = w0 + r * stride;
					__m512 *ar = acc + r * per;

					if (six) {
						const struct eng_block_q6_k *x =
							(const struct eng_block_q6_k *)row + b0;

#define CALL(k) kz_q6_k_row(x, T, nbs, k, b0 == 0, ar)
						KZ_SWITCH(np, CALL)
#undef CALL
					} else {
						const struct eng_block_q4_k *x =
							(const struct eng_block_q4_k *)row + b0;

#define CALL(k) kz_q4_k_row(x, T, nbs, k, b0 == 0, ar, ar + np)
						KZ_SWITCH(np, CALL)
#undef CALL
					}
				}
			}
			/* each token's lanes reduced as vec_dot_q4_k_q8_k_vnni
			 * (vec_dot_q6_k_q8_k_vnni: no mins) does */
			for (unsigned r = 0; r < rn; r++) {
				const float *l = (const float *)(acc + r * per);
				const float *m = l + 16 * np;

				for (unsigned t = 0; t < tn; t++) {
					const float *y = m + 4 * t;
					const float lanes = hsum_f32x8(_mm256_loadu_ps(l + 8 * t));

					out[(t0 + t) * out_stride + r0 + r] =
						six ? lanes : lanes + ((y[0] + y[2]) + (y[1] + y[3]));
				}
			}
		}
	}
}

VBMI void avx512_prompt_q4_k(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			 const void *w, size_t stride, const void *a, size_t a_stride)
{
	kz_rows(n, nrows, nt, out, out_stride, w, stride, a, a_stride, false);
}

VBMI void avx512_prompt_q6_k(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			 const void *w, size_t stride, const void *a, size_t a_stride)
{
	kz_rows(n, nrows, nt, out, out_stride, w, stride, a, a_stride, true);
}

/*
 * Q8_0 by a prompt's tokens (vec_dotn, for two tokens or more), two tokens a
 * 512-bit vector as for the K-quants (avx512_prompt_q4_k): each row and
 * token bit-identical to dot8_q8_0_vnni, whose lane k of a block is the
 * exact sum of elements 4k..4k+3, converted and added to its float lane
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
 * pairs of tokens from T, into acc_io (first: from zero). */
VNNI static inline __attribute__((always_inline)) void
kq_row(const struct eng_block_q8_0 *x, const struct kq_block *T, size_t nbs, const unsigned np,
       bool first, __m512 *acc_io)
{
	const __m512i bias = _mm512_set1_epi8((char)0x80);
	__m512 acc[KZ_TOKENS / 2];

	for (unsigned p = 0; p < np; p++)
		acc[p] = first ? _mm512_setzero_ps() : acc_io[p];
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

/* nrows (1 or more) rows by nt (1 or more) tokens. */
VNNI void avx512_prompt_q8_0(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
			 const void *w, size_t stride, const void *a, size_t a_stride)
{
	const size_t nb = n / ENG_QK8_0;
	struct kq_block T[KQ_SPAN] __attribute__((aligned(64)));
	__m512 acc[KZ_ACC];

	for (unsigned t0 = 0; t0 < nt; t0 += KZ_TOKENS) {
		const unsigned tn = nt - t0 < KZ_TOKENS ? nt - t0 : KZ_TOKENS;
		const unsigned np = (tn + 1) / 2, rows_max = KZ_ACC / np;

		for (unsigned r0 = 0; r0 < nrows; r0 += rows_max) {
			const unsigned rn = nrows - r0 < rows_max ? nrows - r0 : rows_max;
			const uint8_t *w0 = (const uint8_t *)w + r0 * stride;

			for (size_t b0 = 0; b0 < nb; b0 += KQ_SPAN) {
				const size_t nbs = nb - b0 < KQ_SPAN ? nb - b0 : KQ_SPAN;

				kq_fill(T, (const uint8_t *)a + t0 * a_stride, a_stride, tn, b0, nbs);
				for (unsigned r = 0; r < rn; r++) {
					const struct eng_block_q8_0 *x =
						(const struct eng_block_q8_0 *)(w0 + r * stride) + b0;

#define CALL(k) kq_row(x, T, nbs, k, b0 == 0, acc + r * np)
					KZ_SWITCH(np, CALL)
#undef CALL
				}
			}
			for (unsigned r = 0; r < rn; r++) {
				const float *l = (const float *)(acc + r * np);

				for (unsigned t = 0; t < tn; t++)
					out[(t0 + t) * out_stride + r0 + r] =
						hsum_f32x8(_mm256_loadu_ps(l + 8 * t));
			}
		}
	}
}
