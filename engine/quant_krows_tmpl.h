/*
 * quant_krows_tmpl.h - the K-quant eight-row kernels (vec_dot8) that share
 * each weight block between the tokens of a prompt, written once for the
 * AVX2 set and the AVX-512 VNNI one.  Included by quant_avx2.c and
 * quant_avx512.c after defining:
 *   KR_ATTR              the functions' target attribute (empty: the file's)
 *   KR_NAME(f)           the set's name for f
 *   KR_DPWSSD(acc, a, b) acc + madd(a, b): an int32 accumulation, which
 *                        VNNI does in one instruction (integers: exact in
 *                        any order, so both sets give the same lanes)
 *   KR_DOT1_Q4_K, KR_DOT1_Q6_K  the set's one-row vec_dot, for one token
 * Each row and token is bit-identical to the set's vec_dot: the same int32
 * lanes, the same float steps in the same order, block after block.
 */

/*
 * Q4_K, eight rows by up to ENG_DOT8_NT tokens (vec_dot8), each row and
 * token bit-identical to vec_dot_q4_k_q8_k: the same int32 lanes (integer
 * sums: exact in any order) and the same float steps in the same order,
 * one block after the other.  A prompt's tokens share each weight block:
 * its scales are unpacked once, and each 32 bytes of nibbles are split
 * once with their two sub-block scales put in place, for eight tokens at a
 * time; per token and 64 elements that leaves the two activation loads,
 * two maddubs, two madds and two adds.  The rows are read one after the
 * other, each front to back (a single stream, as the AVX-512 kernel found
 * fastest from memory), with the row K_PREFETCH_ROWS ahead prefetched.
 */
#ifndef KR_SWITCH
/* Each token's int32 sum is one running register: without this, gcc
 * reassociates the integer adds of the unrolled loops (legal: integers) into
 * a tree over every product, and with eight tokens those products spill to
 * the stack, two stores and two reloads per token and 64 elements. */
#define KR_KEEP(v) __asm__("" : "+x"(v))
/* Call CALL(tn) with tn a constant from 1 to KR_TOKENS: each case is an
 * inlined copy in which the token loops unroll and the accumulators stay
 * in registers. */
#define KR_TOKENS 8 /* tokens sharing a block's unpacked quants */
#define KR_SWITCH(n, CALL)                                                                       \
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
#endif

/* Block i of row x by tn (1 to KR_TOKENS, a constant where inlined: the
 * token loops unroll and sumi stays in registers) tokens from act. */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(q4_k_block_tn)(const struct eng_block_q4_k *x, __m256i scales, __m128i mins, const uint8_t *act,
	      size_t a_stride, size_t i, const unsigned tn, __m256 *acc, __m128 *acc_m)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	const float xd = fp16(x->d), xdmin = fp16(x->dmin);
	const struct eng_block_q8_k *y[KR_TOKENS];
	__m256i sumi[KR_TOKENS];

	for (unsigned t = 0; t < tn; t++) {
		y[t] = (const struct eng_block_q8_k *)(act + t * a_stride) + i;
		sumi[t] = _mm256_setzero_si256();
	}
	for (int j = 0; j < ENG_QK_K / 64; j++) {
		const __m256i scale_l = _mm256_shuffle_epi8(
			scales, _mm256_set1_epi16((short)(0x0100 * (4 * j + 1) + 4 * j)));
		const __m256i scale_h = _mm256_shuffle_epi8(
			scales, _mm256_set1_epi16((short)(0x0100 * (4 * j + 3) + 4 * j + 2)));
		const __m256i bits = _mm256_loadu_si256((const void *)(x->qs + 32 * j));
		const __m256i ql = _mm256_and_si256(bits, m4);
		const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);

		for (unsigned t = 0; t < tn; t++) {
			const int8_t *q8 = y[t]->qs + 64 * j;
			const __m256i pl16 =
				_mm256_maddubs_epi16(ql, _mm256_loadu_si256((const void *)q8));
			const __m256i ph16 =
				_mm256_maddubs_epi16(qh, _mm256_loadu_si256((const void *)(q8 + 32)));

			sumi[t] = KR_DPWSSD(KR_DPWSSD(sumi[t], pl16, scale_l), ph16, scale_h);
			KR_KEEP(sumi[t]);
		}
	}
	for (unsigned t = 0; t < tn; t++) {
		const __m256i bs = _mm256_loadu_si256((const void *)y[t]->bsums);
		const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs),
						   _mm256_extracti128_si256(bs, 1));
		const float d = y[t]->d * xd, dmin = -y[t]->d * xdmin;

		acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s)),
					acc_m[t]);
		acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
	}
}

/* Row x (nb blocks) by tn tokens, into out (stride out_stride). */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(q4_k_row_tn)(const struct eng_block_q4_k *x, size_t nb, const uint8_t *act, size_t a_stride,
	    const unsigned tn, float *out, size_t out_stride)
{
	const char *pf = (const char *)x + K_PREFETCH_ROWS * nb * sizeof(*x);
	__m256 acc[KR_TOKENS];
	__m128 acc_m[KR_TOKENS];

	for (unsigned t = 0; t < tn; t++) {
		acc[t] = _mm256_setzero_ps();
		acc_m[t] = _mm_setzero_ps();
	}
	for (size_t i = 0; i < nb; i++) {
		const __m128i sm = k4_scales_mins_ssse3(x[i].scales);
		const __m128i sc16 = _mm_cvtepu8_epi16(sm);

		for (int l = 0; l < 3; l++)
			_mm_prefetch(pf + i * sizeof(*x) + 64 * l, _MM_HINT_T1);
		KR_NAME(q4_k_block_tn)(&x[i], _mm256_set_m128i(sc16, sc16),
			      _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm)), act, a_stride, i, tn, acc,
			      acc_m);
	}
	for (unsigned t = 0; t < tn; t++) {
		__m128 m = _mm_add_ps(acc_m[t], _mm_movehl_ps(acc_m[t], acc_m[t]));

		m = _mm_add_ss(m, _mm_movehdup_ps(m));
		out[t * out_stride] = hsum_f32x8(acc[t]) + _mm_cvtss_f32(m);
	}
}

KR_ATTR static void KR_NAME(vec_dot8_q4_k_q8_k)(size_t n, unsigned nt, float *out,
						 size_t out_stride, const void *w, size_t stride,
						 const void *a, size_t a_stride)
{
	if (nt == 1) { /* decoding: nothing to share, the one-row kernel */
		for (int r = 0; r < 8; r++)
			KR_DOT1_Q4_K(n, out + r, (const uint8_t *)w + (size_t)r * stride, a);
		return;
	}
	for (int r = 0; r < 8; r++) {
		const struct eng_block_q4_k *x =
			(const void *)((const uint8_t *)w + (size_t)r * stride);

		for (unsigned t0 = 0; t0 < nt; t0 += KR_TOKENS) {
			const uint8_t *y = (const uint8_t *)a + t0 * a_stride;
			float *o = out + t0 * out_stride + r;

#define CALL(tn) KR_NAME(q4_k_row_tn)(x, n / ENG_QK_K, y, a_stride, tn, o, out_stride)
			KR_SWITCH(nt - t0 < KR_TOKENS ? nt - t0 : KR_TOKENS, CALL)
#undef CALL
		}
	}
}

/*
 * Q6_K, eight rows by up to ENG_DOT8_NT tokens (vec_dot8), each row and
 * token bit-identical to vec_dot_q6_k_q8_k, as for Q4_K above: each 128
 * elements of a row are unpacked to 6-bit quants once for eight tokens.
 */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(q6_k_row_tn)(const struct eng_block_q6_k *x, size_t nb, const uint8_t *act, size_t a_stride,
	    const unsigned tn, float *out, size_t out_stride)
{
	const __m256i m32 = _mm256_set1_epi8(32);
	const char *pf = (const char *)x + K_PREFETCH_ROWS * nb * sizeof(*x);
	__m256 acc[KR_TOKENS];

	for (unsigned t = 0; t < tn; t++)
		acc[t] = _mm256_setzero_ps();
	for (size_t i = 0; i < nb; i++) {
		const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)x[i].scales));
		const float xd = fp16(x[i].d);
		const struct eng_block_q8_k *y[KR_TOKENS];
		__m256i sumi[KR_TOKENS];

		for (int l = 0; l < 4; l++)
			_mm_prefetch(pf + i * sizeof(*x) + 64 * l, _MM_HINT_T1);
		for (unsigned t = 0; t < tn; t++) {
			y[t] = (const struct eng_block_q8_k *)(act + t * a_stride) + i;
			sumi[t] = _mm256_setzero_si256();
		}
		for (int h = 0; h < ENG_QK_K / 128; h++) {
			const __m256i sch = h ? _mm256_permute4x64_epi64(sc16, 0xee)
					      : _mm256_permute4x64_epi64(sc16, 0x44);
			__m256i q[4];

			q6_k_unpack(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
			for (int k = 0; k < 4; k++) {
				const __m256i sk = _mm256_shuffle_epi8(sch, _mm256_set_m128i(
					_mm_set1_epi16((short)(0x0100 * (4 * k + 3) + 4 * k + 2)),
					_mm_set1_epi16((short)(0x0100 * (4 * k + 1) + 4 * k))));

				for (unsigned t = 0; t < tn; t++) {
					const __m256i yk = _mm256_loadu_si256(
						(const void *)(y[t]->qs + 128 * h + 32 * k));
					const __m256i p16 = _mm256_sub_epi16(
						_mm256_maddubs_epi16(q[k], yk),
						_mm256_maddubs_epi16(m32, yk));

					sumi[t] = KR_DPWSSD(sumi[t], p16, sk);
					KR_KEEP(sumi[t]);
				}
			}
		}
		for (unsigned t = 0; t < tn; t++)
			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t]->d * xd),
						 _mm256_cvtepi32_ps(sumi[t]), acc[t]);
	}
	for (unsigned t = 0; t < tn; t++)
		out[t * out_stride] = hsum_f32x8(acc[t]);
}

KR_ATTR static void KR_NAME(vec_dot8_q6_k_q8_k)(size_t n, unsigned nt, float *out,
						 size_t out_stride, const void *w, size_t stride,
						 const void *a, size_t a_stride)
{
	if (nt == 1) { /* decoding: nothing to share, the one-row kernel */
		for (int r = 0; r < 8; r++)
			KR_DOT1_Q6_K(n, out + r, (const uint8_t *)w + (size_t)r * stride, a);
		return;
	}
	for (int r = 0; r < 8; r++) {
		const struct eng_block_q6_k *x =
			(const void *)((const uint8_t *)w + (size_t)r * stride);

		for (unsigned t0 = 0; t0 < nt; t0 += KR_TOKENS) {
			const uint8_t *y = (const uint8_t *)a + t0 * a_stride;
			float *o = out + t0 * out_stride + r;

#define CALL(tn) KR_NAME(q6_k_row_tn)(x, n / ENG_QK_K, y, a_stride, tn, o, out_stride)
			KR_SWITCH(nt - t0 < KR_TOKENS ? nt - t0 : KR_TOKENS, CALL)
#undef CALL
		}
	}
}

#undef KR_ATTR
#undef KR_NAME
#undef KR_DPWSSD
#undef KR_DOT1_Q4_K
#undef KR_DOT1_Q6_K
