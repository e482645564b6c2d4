/*
 * q4k-rows-order.c - a measurement, not part of the engine: how fast could
 * an AVX2 Q4_K kernel for prompts be if it gave up the float order strata's
 * kernels share (issue 17; docs/benchmarks.md, "session 31: the AVX2
 * ceiling")?
 *
 * strata's Q4_K kernels keep the reference's eight int32 lanes a block (lane
 * k: elements 4k..4k+3 of every sub-block, each sub-block's products times
 * its scale) and one float step per lane and block, in every kernel, so that
 * a row's sum is the same bits whether its token is decoded alone or in a
 * batch.  Each sub-block then costs a scale `madd` per 64 products and token.
 *
 * The order tried here is llama.cpp's repacked GEMM's: one int32 per row,
 * token and block.  Eight rows' 32-byte quant runs are transposed by dwords
 * (lane r = row r), each dword of a sub-block's activations is broadcast,
 * and a sub-block's eight maddubs are summed in 16 bits (16 products of at
 * most 15 * 128: no overflow) before one madd by the eight rows' scales.
 * Per token and 256 products: 8 broadcast loads, 8 maddubs, 7 adds, a madd
 * and an add, against the file order's 8 maddubs, 4 adds, 4 madds and 4
 * adds; the rows' transpose and scales are shared by up to 8 tokens.
 *
 * It checks its own result bit for bit against a scalar version of the same
 * order (ref_dot) and prints GMAC/s, best of the repetitions.  Built with
 * CEILING=1 the scales are unpacked once for all blocks and with CEILING=2
 * the rows are also taken as already interleaved (a repacked file): both
 * give wrong sums (it says so) and time only what is left.
 *
 * meson builds it as build/tests/q4k-rows-order and, with CEILING=1 and 2,
 * q4k-rows-order-ceiling1 and -ceiling2 (not run by the suite):
 *   taskset -c 1 build/tests/q4k-rows-order TOKENS COLS ROWS REPS [INNER]
 *   taskset -c 1 build/tests/q4k-rows-order steps
 *
 * `steps` times each order's inner step alone, from registers and 64 bytes
 * of L1, as the core runs it when nothing else is in the way: the file
 * order's per 8 tokens and 64 elements (the loop of q4_k_block_tn
 * in quant_krows_tmpl.h) and this order's per token and 256 products.
 *
 * Run it beside `strata-kbench --isa avx2 --type Q4_K --tokens TOKENS --cols COLS
 * --rows ROWS --reps REPS`, the engine's kernel, in alternating runs.
 */
#include "quant_x86_i.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef CEILING
#define CEILING 0
#endif

/* keeps a running sum in its register: without it gcc turns the chain of
 * 16-bit adds into a tree and spills the products */
#define KEEP(v) __asm__("" : "+x"(v))

static void k4_sm(const uint8_t *q, int j, uint8_t *d, uint8_t *m)
{
	if (j < 4) {
		*d = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
	}
}

/* The order in scalar code: per block one int32 of the scaled products and
 * one of the mins, then one float step each. */
static void ref_dot(size_t nb, float *out, const struct eng_block_q4_k *x,
		    const struct eng_block_q8_k *y)
{
	float acc = 0, accm = 0;

	for (size_t i = 0; i < nb; i++) {
		int32_t sumi = 0, summ = 0;

		for (int s = 0; s < 8; s++) {
			uint8_t sc, mn;
			int32_t ss = 0;

			k4_sm(x[i].scales, s, &sc, &mn);
			for (int e = 0; e < 32; e++) {
				const uint8_t b = x[i].qs[32 * (s / 2) + e];

				ss += (s % 2 ? b >> 4 : b & 15) * y[i].qs[32 * s + e];
			}
			sumi += sc * ss;
			summ += mn * (y[i].bsums[2 * s] + y[i].bsums[2 * s + 1]);
		}
		acc = fmaf(y[i].d * fp16(x[i].d), (float)sumi, acc);
		accm = fmaf(-y[i].d * fp16(x[i].dmin), (float)summ, accm);
	}
	*out = acc + accm;
}

/* Rows 0..7 (stride bytes apart) of a 32-byte run at offset off, transposed
 * by dwords: t[k] = dword k of rows 0..7. */
static inline void transpose8(const struct eng_block_q4_k *const x[8], int off, __m256i t[8])
{
	__m256i v[8], u[8];

	for (int r = 0; r < 8; r++)
		v[r] = _mm256_loadu_si256((const void *)(x[r]->qs + off));
	if (CEILING >= 2) { /* as if the file held them interleaved */
		memcpy(t, v, sizeof(v));
		return;
	}
	for (int r = 0; r < 8; r += 2) {
		u[r] = _mm256_unpacklo_epi32(v[r], v[r + 1]);
		u[r + 1] = _mm256_unpackhi_epi32(v[r], v[r + 1]);
	}
	for (int q = 0; q < 8; q += 4) {
		v[q + 0] = _mm256_unpacklo_epi64(u[q + 0], u[q + 2]); /* rows q..q+3: dw 0 | 4 */
		v[q + 1] = _mm256_unpackhi_epi64(u[q + 0], u[q + 2]); /* dw 1 | 5 */
		v[q + 2] = _mm256_unpacklo_epi64(u[q + 1], u[q + 3]); /* dw 2 | 6 */
		v[q + 3] = _mm256_unpackhi_epi64(u[q + 1], u[q + 3]); /* dw 3 | 7 */
	}
	for (int k = 0; k < 4; k++) {
		t[k] = _mm256_permute2x128_si256(v[k], v[4 + k], 0x20);
		t[k + 4] = _mm256_permute2x128_si256(v[k], v[4 + k], 0x31);
	}
}

/* The eight rows' scales and mins, from their [sc0..7, mn0..7] bytes:
 * sc[s] dword r = (sc_s, sc_s) of row r, mp[k] dword r = (mn_2k, mn_2k+1). */
static inline void scales8(const __m128i sm[8], __m256i sc[8], __m256i mp[4])
{
	__m128i a[4], b[4], c[4], d[4];

	for (int p = 0; p < 4; p++) {
		a[p] = _mm_unpacklo_epi8(sm[2 * p], sm[2 * p + 1]);
		b[p] = _mm_unpackhi_epi8(sm[2 * p], sm[2 * p + 1]);
	}
	c[0] = _mm_unpacklo_epi16(a[0], a[1]), c[1] = _mm_unpackhi_epi16(a[0], a[1]);
	c[2] = _mm_unpacklo_epi16(a[2], a[3]), c[3] = _mm_unpackhi_epi16(a[2], a[3]);
	d[0] = _mm_unpacklo_epi16(b[0], b[1]), d[1] = _mm_unpackhi_epi16(b[0], b[1]);
	d[2] = _mm_unpacklo_epi16(b[2], b[3]), d[3] = _mm_unpackhi_epi16(b[2], b[3]);

	const __m128i e[4] = { _mm_unpacklo_epi32(c[0], c[2]), _mm_unpackhi_epi32(c[0], c[2]),
			       _mm_unpacklo_epi32(c[1], c[3]), _mm_unpackhi_epi32(c[1], c[3]) };
	const __m128i f[4] = { _mm_unpacklo_epi32(d[0], d[2]), _mm_unpackhi_epi32(d[0], d[2]),
			       _mm_unpacklo_epi32(d[1], d[3]), _mm_unpackhi_epi32(d[1], d[3]) };

	for (int k = 0; k < 4; k++) { /* e[k], f[k]: rows 0..7 of s = 2k, then 2k + 1 */
		sc[2 * k] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(e[k], e[k]));
		sc[2 * k + 1] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(e[k], e[k]));
		mp[k] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(f[k], _mm_unpackhi_epi64(f[k], f[k])));
	}
}

/* 8 rows x nt tokens: out[t * os + r]. */
__attribute__((noinline)) static void dot8(size_t nb, unsigned nt, float *out, size_t os,
					   const uint8_t *w, size_t stride, const uint8_t *a,
					   size_t a_stride)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);

	for (unsigned t0 = 0; t0 < nt; t0 += 8) {
		const unsigned tn = nt - t0 < 8 ? nt - t0 : 8;
		__m256 acc[8], accm[8];
		__m256i sumi[8];

		for (unsigned t = 0; t < tn; t++)
			acc[t] = accm[t] = _mm256_setzero_ps();
		for (size_t i = 0; i < nb; i++) {
			const struct eng_block_q4_k *x[8];
			static __m256i sc[8], mp[4]; /* static: CEILING keeps block 0's */
			__m128i sm[8];
			float xd[8], xm[8];

			for (int r = 0; r < 8; r++) {
				x[r] = (const struct eng_block_q4_k *)(w + r * stride) + i;
				uint64_t s8, m8;

				k4_scales_mins(x[r]->scales, &s8, &m8);
				sm[r] = _mm_set_epi64x((long long)m8, (long long)s8);
				xd[r] = fp16(x[r]->d);
				xm[r] = fp16(x[r]->dmin);
			}
			if (!CEILING || i == 0)
				scales8(sm, sc, mp);
			for (unsigned t = 0; t < tn; t++)
				sumi[t] = _mm256_setzero_si256();
			for (int j = 0; j < 4; j++) {
				__m256i tr[8];

				transpose8(x, 32 * j, tr);
				for (int h = 0; h < 2; h++) { /* sub-block 2j (low nibbles), 2j + 1 */
					const int s = 2 * j + h;
					__m256i q[8];

					for (int k = 0; k < 8; k++)
						q[k] = _mm256_and_si256(h ? _mm256_srli_epi16(tr[k], 4) : tr[k], m4);
					for (unsigned t = 0; t < tn; t++) {
						const struct eng_block_q8_k *y =
							(const struct eng_block_q8_k *)(a + (t0 + t) * a_stride) + i;
						const int32_t *yq = (const int32_t *)(y->qs + 32 * s);
						__m256i p = _mm256_maddubs_epi16(q[0], _mm256_set1_epi32(yq[0]));

						for (int k = 1; k < 8; k++) {
							p = _mm256_add_epi16(
								p, _mm256_maddubs_epi16(q[k], _mm256_set1_epi32(yq[k])));
							KEEP(p);
						}
						sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sc[s]));
					}
				}
			}
			const __m256 vd = _mm256_loadu_ps(xd), vm = _mm256_loadu_ps(xm);

			for (unsigned t = 0; t < tn; t++) {
				const struct eng_block_q8_k *y =
					(const struct eng_block_q8_k *)(a + (t0 + t) * a_stride) + i;
				int32_t b4[4]; /* the bsums in 32-element pairs */

				_mm_storeu_si128((void *)b4,
						 _mm_hadd_epi16(_mm_loadu_si128((const void *)y->bsums),
								_mm_loadu_si128((const void *)(y->bsums + 8))));
				__m256i mm = _mm256_madd_epi16(mp[0], _mm256_set1_epi32(b4[0]));
				for (int k = 1; k < 4; k++)
					mm = _mm256_add_epi32(mm, _mm256_madd_epi16(mp[k], _mm256_set1_epi32(b4[k])));

				const __m256 yd = _mm256_set1_ps(y->d);

				acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(yd, vd), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
				accm[t] = _mm256_fnmadd_ps(_mm256_mul_ps(yd, vm), _mm256_cvtepi32_ps(mm), accm[t]);
			}
		}
		for (unsigned t = 0; t < tn; t++)
			_mm256_storeu_ps(out + (t0 + t) * os, _mm256_add_ps(acc[t], accm[t]));
	}
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The file order's step: 8 tokens x 64 elements, one row. */
#define FILE_TOKEN(off, acc)                                                                       \
	"vpmaddubsw " #off "(%0), %%ymm0, %%ymm12\n\t"                                            \
	"vpmaddubsw " #off "+32(%0), %%ymm1, %%ymm13\n\t"                                         \
	"vpaddw %%ymm13, %%ymm12, %%ymm12\n\t"                                                    \
	"vpmaddwd %%ymm2, %%ymm12, %%ymm12\n\t"                                                   \
	"vpaddd %%ymm12, " acc ", " acc "\n\t"
/* This order's: one token x 8 rows x 32 elements. */
#define ROWS_K(off, w) "vpbroadcastd " #off "(%0), %%ymm10\n\t"                                  \
		       "vpmaddubsw %%ymm10, " w ", %%ymm10\n\t"                                  \
		       "vpaddw %%ymm10, %%ymm8, %%ymm8\n\t"

static int steps(void)
{
	static int8_t buf[64] __attribute__((aligned(64)));
	const long n = 50000000;
	double t = now();

	for (long i = 0; i < n; i++)
		__asm__ volatile(FILE_TOKEN(0, "%%ymm4") FILE_TOKEN(0, "%%ymm5") FILE_TOKEN(0, "%%ymm6")
				 FILE_TOKEN(0, "%%ymm7") FILE_TOKEN(0, "%%ymm8") FILE_TOKEN(0, "%%ymm9")
				 FILE_TOKEN(0, "%%ymm10") FILE_TOKEN(0, "%%ymm11")
				 :
				 : "r"(buf)
				 : "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
				   "xmm12", "xmm13");
	t = now() - t;
	printf("file order, inner step alone: %.1f GMAC/s\n", n * 512 / t * 1e-9);
	t = now();
	for (long i = 0; i < n; i++)
		__asm__ volatile("vpbroadcastd (%0), %%ymm10\n\t"
				 "vpmaddubsw %%ymm10, %%ymm0, %%ymm8\n\t"
				 ROWS_K(4, "%%ymm1") ROWS_K(8, "%%ymm2") ROWS_K(12, "%%ymm3")
				 ROWS_K(16, "%%ymm4") ROWS_K(20, "%%ymm5") ROWS_K(24, "%%ymm6")
				 ROWS_K(28, "%%ymm7")
				 "vpmaddwd %%ymm11, %%ymm8, %%ymm8\n\t"
				 "vpaddd %%ymm8, %%ymm12, %%ymm12\n\t"
				 :
				 : "r"(buf)
				 : "xmm8", "xmm10", "xmm12");
	t = now() - t;
	printf("rows order, inner step alone: %.1f GMAC/s\n", n * 256 / t * 1e-9);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "steps"))
		return steps();
	if (argc < 5) {
		fprintf(stderr, "usage: %s TOKENS COLS ROWS REPS [INNER]\n", argv[0]);
		return 2;
	}
	const unsigned nt = atoi(argv[1]);
	const size_t n = atoi(argv[2]), rows = atoi(argv[3]);
	const int reps = atoi(argv[4]), inner = argc > 5 ? atoi(argv[5]) : 1;
	if (!nt || n % ENG_QK_K || !n || rows % 8 || !rows || reps < 1 || inner < 1) {
		fprintf(stderr, "TOKENS > 0, COLS a multiple of 256, ROWS of 8\n");
		return 2;
	}
	const size_t nb = n / ENG_QK_K, stride = nb * sizeof(struct eng_block_q4_k);
	const size_t a_stride = nb * sizeof(struct eng_block_q8_k);
	uint8_t *w = malloc(rows * stride), *a = malloc(nt * a_stride);
	float *out = malloc(rows * nt * sizeof(float)), *ref = malloc(rows * nt * sizeof(float));

	if (!w || !a || !out || !ref) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	srand(1);
	for (size_t i = 0; i < rows * stride; i++)
		w[i] = (uint8_t)rand();
	for (size_t b = 0; b < rows * nb; b++) { /* scales of 2^-7 .. 2^-6 */
		struct eng_block_q4_k *x = (struct eng_block_q4_k *)w + b;

		x->d = 0x2000 + rand() % 0x400;
		x->dmin = 0x2000 + rand() % 0x400;
	}
	for (size_t b = 0; b < nt * nb; b++) {
		struct eng_block_q8_k *y = (struct eng_block_q8_k *)a + b;

		y->d = 0.01f + rand() % 100 * 1e-4f;
		for (int e = 0; e < ENG_QK_K; e++)
			y->qs[e] = (int8_t)(rand() % 256 - 128);
		for (int g = 0; g < 16; g++) {
			int s = 0;

			for (int e = 0; e < 16; e++)
				s += y->qs[16 * g + e];
			y->bsums[g] = (int16_t)s;
		}
	}
	for (size_t r = 0; r < rows; r++)
		for (unsigned t = 0; t < nt; t++)
			ref_dot(nb, ref + t * rows + r, (const void *)(w + r * stride),
				(const void *)(a + t * a_stride));

	double best = 1e9;

	for (int k = 0; k < reps; k++) {
		double t = now();

		for (int it = 0; it < inner; it++)
			for (size_t r = 0; r < rows; r += 8)
				dot8(nb, nt, out + r, rows, w + r * stride, stride, a, a_stride);
		t = now() - t;
		if (t < best)
			best = t;
	}

	size_t bad = 0;

	for (size_t i = 0; i < rows * nt; i++)
		bad += memcmp(out + i, ref + i, sizeof(float)) != 0;
	printf("rows order%s: %zu rows x %zu cols x %u tokens: %.1f GMAC/s (best of %d), %s\n",
	       CEILING ? " (ceiling)" : "", rows, n, nt, (double)inner * rows * n * nt / best * 1e-9,
	       reps, bad ? "sums wrong" : "same bits as ref_dot");
	free(w), free(a), free(out), free(ref);
	return !CEILING && bad;
}
