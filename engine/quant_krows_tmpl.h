/*
 * quant_krows_tmpl.h - the K-quant multi-row kernels (Q4_K's, Q5_K's and
 * Q6_K's vec_dotn) that share each weight block between the
 * tokens of a prompt, written once for the AVX2 set and the AVX-512 VNNI
 * one.  Included by quant_avx2.c and
 * quant_avx512.c after defining:
 *   KR_ATTR              the functions' target attribute (empty: the file's)
 *   KR_NAME(f)           the set's name for f
 *   KR_DPWSSD(acc, a, b) acc + madd(a, b): an int32 accumulation, which
 *                        VNNI does in one instruction (integers: exact in
 *                        any order, so both sets give the same lanes)
 * and defines, besides those, the one-row Q4_K and Q5_K kernel
 * (KR_NAME(dot_q45_k); KR_NAME(vec_dot_q4_k_q8_k) and
 * KR_NAME(vec_dot_q5_k_q8_k) are its vec_dots) and the one-row Q6_K one
 * (KR_NAME(vec_dot_q6_k_q8_k)).
 * Each row and token is bit-identical to the set's vec_dot: the same int32
 * lanes, the same float steps in the same order, block after block.
 */

/*
 * Per 64 elements: nibbles (plus Q5_K's fifth bit) times 32 activations each
 * via maddubs (unsigned quant <= 31 times signed int8: pair sums below 2^13,
 * no saturation), then madd with the sub-block scale into int32 lanes (and
 * the add: KR_DPWSSD, one instruction with VNNI; integers, so the same
 * lanes either way).  This is every x86 set's one-row Q4_K and Q5_K kernel
 * (avx512 decodes Q4_K with its own 512-bit one, the same bits): vec_dot
 * (S NULL) works the activation's k_q8_sums out for each block, a decoding
 * vec_dotn once for all its rows (S).  The scales and mins are unpacked
 * in general registers (k4_scales_mins: the vector pipes are this kernel's
 * limit), each scale put in every int16 lane by one pshufb (k_scale).
 * Session 29 had broadcast it by loads from a table stored on the stack,
 * faster on an Intel Xeon whose shuffle port was the busiest; on the Zen 5
 * the pshufb and d and dmin converted together are 1.28x (one core, one
 * token; session 39, docs/benchmarks.md).  The mins term is accumulated as
 * ggml's AVX2 kernels do it (the reference engine's results depend on the
 * float order): bsums summed in pairs (k_q8_sums), times the mins (madd)
 * into 4 int32 lanes.  Q4_K then adds those lanes with one FMA per block
 * into 4 float lanes, reduced at the end; Q5_K sums them to one integer and
 * accumulates dmin * that in a scalar (ggml's "summs += dmin * hsum",
 * contracted to an FMA in its -march=native build).  The row k_prefetch_rows
 * ahead is prefetched at the pace this one is read (quant_x86_i.h).
 */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(dot_q45_k)(size_t n, float *out, const void *w, const void *a, const struct k_q8_sums *S,
		   bool five)
{
	const struct eng_block_q4_k *x4 = w;
	const struct eng_block_q5_k *x5 = w;
	const struct eng_block_q8_k *y = a;
	const size_t bsize = five ? sizeof(*x5) : sizeof(*x4);
	const char *pf = (const char *)w + k_prefetch_rows * (n / ENG_QK_K) * bsize;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256 acc = _mm256_setzero_ps();
	__m128 acc_m = _mm_setzero_ps();
	float summs = 0.0f;

	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const uint8_t *qs = five ? x5[i].qs : x4[i].qs;
		/* [d, dmin] * y.d (d and dmin lead both blocks); y.d * d rounds
		 * the same either way round, and dmin's sign is carried by the
		 * FMAs below (fma(-a, b, c) = -(a*b) + c, one rounding) */
		uint32_t dbits;

		memcpy(&dbits, five ? (const void *)&x5[i].d : (const void *)&x4[i].d, 4);
		const __m128 dm = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dbits)),
					     _mm_set1_ps(S ? S[i].d : y[i].d));
		const int8_t *q8 = y[i].qs;
		__m256i hbits = _mm256_setzero_si256();
		__m256i sumi = _mm256_setzero_si256();

		/* the lines of block i of that row: three (144 or 176 bytes) */
		for (int l = 0; l < 3; l++)
			k_prefetch(pf + i * bsize + 64 * l);

		uint64_t sc, mn;

		k4_scales_mins(five ? x5[i].scales : x4[i].scales, &sc, &mn);
		const __m256i scales = k_scales(sc);
		const __m128i q8s = S ? _mm_loadu_si128((const void *)S[i].q8s) : k_q8_sums_of(&y[i]);
		const __m128i prod = _mm_madd_epi16(k_mins(mn), q8s);

		if (five) {
			summs = fmaf(-_mm_cvtss_f32(_mm_movehdup_ps(dm)), (float)hsum_i32x4(prod),
				     summs);
			hbits = _mm256_loadu_si256((const void *)x5[i].qh);
		} else {
			acc_m = _mm_fnmadd_ps(_mm_permute_ps(dm, 0x55), _mm_cvtepi32_ps(prod), acc_m);
		}

#pragma GCC unroll 4
		for (int j = 0; j < ENG_QK_K / 64; j++) {
			/* int16 scale 2j (2j + 1) in every lane */
			const __m256i scale_l = k_scale(scales, 2 * j);
			const __m256i scale_h = k_scale(scales, 2 * j + 1);
			__m256i bits = _mm256_loadu_si256((const void *)(qs + 32 * j));
			__m256i ql, qh;

			K_IN_REGISTER(bits);
			if (five) {
				q5_k_quants(bits, hbits, j, &ql, &qh);
			} else {
				ql = _mm256_and_si256(bits, m4);
				qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
			}
			const __m256i yl = _mm256_loadu_si256((const void *)(q8 + 64 * j));
			const __m256i yh = _mm256_loadu_si256((const void *)(q8 + 64 * j + 32));
			sumi = KR_DPWSSD(sumi, _mm256_maddubs_epi16(ql, yl), scale_l);
			sumi = KR_DPWSSD(sumi, _mm256_maddubs_epi16(qh, yh), scale_h);
		}
		acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(sumi), acc);
	}
	if (five) {
		*out = hsum_f32x8(acc) + summs;
		return;
	}
	acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
	acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
	*out = hsum_f32x8(acc) + _mm_cvtss_f32(acc_m);
}

KR_ATTR static inline void KR_NAME(vec_dot_q5_k_q8_k)(size_t n, float *out, const void *w,
						      const void *a)
{
	KR_NAME(dot_q45_k)(n, out, w, a, NULL, true);
}

KR_ATTR static inline void KR_NAME(vec_dot_q4_k_q8_k)(size_t n, float *out, const void *w,
						      const void *a)
{
	KR_NAME(dot_q45_k)(n, out, w, a, NULL, false);
}

/*
 * Q4_K, a row by up to eight tokens (for vec_dotn), each row and
 * token bit-identical to vec_dot_q4_k_q8_k: the same int32 lanes (integer
 * sums: exact in any order) and the same float steps in the same order,
 * one block after the other.  A prompt's tokens share each weight block:
 * its scales are unpacked once, and each 32 bytes of nibbles are split
 * once into k4_pair's A and B (quant_x86_i.h) with the two sub-blocks'
 * scales paired, for eight tokens at a time; per token and 64 elements
 * that leaves the two activation loads (pack8_q8_k's paired quants), two
 * maddubs, a 16-bit add, one madd and one add.  The rows are read one after the
 * other, each front to back (a single stream, as the AVX-512 kernel found
 * fastest from memory), with the row k_prefetch_rows ahead prefetched.
 */
#ifndef KR_SWITCH
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

#ifndef KR_TABLE_BLOCKS
/*
 * What a block of the eight tokens gives every row, worked out once per
 * call (kr_q4_k_table): each token's y.d, alone and as four lanes, and its
 * bsums summed in pairs (the int16 the mins multiply), two tokens' side by
 * side so that one madd, one conversion and one FMA serve two tokens' mins.
 * Before, each row redid this for every block and token (a phaddw, two
 * scalar products and two broadcasts: a third of the instructions of a
 * block and token beside the 16 of the products).  Rows of up to
 * KR_TABLE_BLOCKS blocks (32768 elements; 37 KB on the stack) use it; longer
 * ones (none in the models of 2026) go row by row through vec_dot.
 */
#define KR_TABLE_BLOCKS 128
struct kr_q4_k_tab {
	float d[KR_TOKENS];          /* token t's y.d */
	float dq[KR_TOKENS][4];      /* token t's y.d x4 */
	int16_t q8s[KR_TOKENS][8];   /* token t's bsums[2k] + bsums[2k + 1] */
};
#endif

KR_ATTR static void KR_NAME(kr_q4_k_table)(struct kr_q4_k_tab *T, const uint8_t *act,
					   size_t a_stride, unsigned tn, size_t nb)
{
	/* fewer than eight tokens: q4_k_block_tn multiplies all eight y.d,
	 * and the others' products are dropped */
	if (tn < KR_TOKENS)
		for (size_t i = 0; i < nb; i++)
			memset(T[i].d, 0, sizeof(T[i].d));
	/* an odd token count: the last pair's second half is read, then dropped */
	if (tn % 2)
		for (size_t i = 0; i < nb; i++) {
			memset(T[i].dq[tn], 0, sizeof(T[i].dq[tn]));
			memset(T[i].q8s[tn], 0, sizeof(T[i].q8s[tn]));
		}
	for (unsigned t = 0; t < tn; t++) {
		const struct eng_block_q8_k *y = (const struct eng_block_q8_k *)(act + t * a_stride);

		for (size_t i = 0; i < nb; i++) {
			T[i].d[t] = y[i].d;
			_mm_storeu_ps(T[i].dq[t], _mm_set1_ps(y[i].d));
			_mm_storeu_si128((void *)T[i].q8s[t], k_q8_sums_of(&y[i]));
		}
	}
}

/* Block i of row x by tn (1 to KR_TOKENS, a constant where inlined: the
 * token loops unroll and sumi stays in registers) tokens, whose k4_pair
 * quants (pack8_q8_k) are at ys[t] + ENG_QK_K * i; T: the block's
 * kr_q4_k_tab; scales and mn its scales and mins (k_scales, k4_scales_mins).
 * acc_m[u] holds the mins' four lanes of tokens 2u (low half) and 2u + 1. */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(q4_k_block_tn)(const struct eng_block_q4_k *x, __m256i scales, uint64_t mn,
		       const int8_t *const *ys, size_t i, const struct kr_q4_k_tab *T,
		       const unsigned tn, __m256 *acc, __m256 *acc_m)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256i sumi[KR_TOKENS];
	/* y.d * d for the eight tokens in one multiply (the same products),
	 * stored now and broadcast by loads after the products below: on the
	 * Zen 5 a float multiply takes one of the two pipes that the maddubs
	 * and madds keep busy, a broadcast load none.  (Stored right before
	 * those loads it was slower, 0.97x: the loads wait on the store.) */
	float dd[KR_TOKENS] __attribute__((aligned(32)));

	_mm256_store_ps(dd, _mm256_mul_ps(_mm256_loadu_ps(T->d), _mm256_set1_ps(fp16(x->d))));
	for (unsigned t = 0; t < tn; t++)
		sumi[t] = _mm256_setzero_si256();
	/* unrolled, so that each j's pshufb mask is a constant (gcc left the
	 * loop rolled, the mask made in general registers and moved in, two
	 * vector instructions more a j; one core, 8 and 64 tokens: 1.07x) */
#pragma GCC unroll 4
	for (int j = 0; j < ENG_QK_K / 64; j++) {
		/* [s_2j, s_2j+1] in every dword: the shared madd's scales */
		const __m256i sp = k_scale_pair(scales, j);
		const __m256i bits = _mm256_loadu_si256((const void *)(x->qs + 32 * j));
		const __m256i ql = _mm256_and_si256(bits, m4);
		const __m256i qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
		const __m256i qa = k4_pair_a(ql, qh), qb = k4_pair_b(ql, qh);

		for (unsigned t = 0; t < tn; t++) {
			const int8_t *q8 = ys[t] + ENG_QK_K * i + 64 * j;
			const __m256i p16 = _mm256_add_epi16(
				_mm256_maddubs_epi16(qa, _mm256_loadu_si256((const void *)q8)),
				_mm256_maddubs_epi16(qb, _mm256_loadu_si256((const void *)(q8 + 32))));

			sumi[t] = KR_DPWSSD(sumi[t], p16, sp);
			K_IN_REGISTER(sumi[t]); /* one running register a token */
		}
	}
	/* the mins and dmin made only now, not live through the products
	 * (one core, 8 and 64 tokens: with dd above 1.04-1.05x; session 48) */
	const __m256i mins = _mm256_broadcastsi128_si256(k_mins(mn));
	const __m256 xdmin = _mm256_set1_ps(fp16(x->dmin));

	/* dmin's sign by fnmadd: -(a*b) + c rounds as fma(-a, b, c) */
	for (unsigned u = 0; u < (tn + 1) / 2; u++)
		acc_m[u] = _mm256_fnmadd_ps(
			_mm256_mul_ps(_mm256_loadu_ps(T->dq[2 * u]), xdmin),
			_mm256_cvtepi32_ps(_mm256_madd_epi16(
				mins, _mm256_loadu_si256((const void *)T->q8s[2 * u]))),
			acc_m[u]);
	for (unsigned t = 0; t < tn; t++)
		acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[t]), _mm256_cvtepi32_ps(sumi[t]),
					 acc[t]);
}

/* Row x (nb blocks) by tn tokens, into out (stride out_stride). */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(q4_k_row_tn)(const struct eng_block_q4_k *x, size_t nb, const uint8_t *act, size_t a_stride,
		     const struct kr_q4_k_tab *T, const unsigned tn, float *out, size_t out_stride)
{
	const char *pf = (const char *)x + k_prefetch_rows * nb * sizeof(*x);
	__m256 acc[KR_TOKENS], acc_m[KR_TOKENS / 2];
	const int8_t *ys[KR_TOKENS]; /* pack8_q8_k's k4_pair quants */

	for (unsigned t = 0; t < tn; t++) {
		ys[t] = (const int8_t *)(act + t * a_stride + pack8_q8_k_at(nb).ys);
		acc[t] = _mm256_setzero_ps();
	}
	for (unsigned u = 0; u < (tn + 1) / 2; u++)
		acc_m[u] = _mm256_setzero_ps();
	for (size_t i = 0; i < nb; i++) {
		uint64_t sc, mn;

		k4_scales_mins(x[i].scales, &sc, &mn);
		for (int l = 0; l < 3; l++)
			k_prefetch(pf + i * sizeof(*x) + 64 * l);
		KR_NAME(q4_k_block_tn)(&x[i], k_scales(sc), mn, ys, i, &T[i], tn, acc, acc_m);
	}
	for (unsigned t = 0; t < tn; t++) {
		/* token t's four mins lanes: half t % 2 of acc_m[t / 2] */
		__m128 m = t % 2 ? _mm256_extractf128_ps(acc_m[t / 2], 1)
				 : _mm256_castps256_ps128(acc_m[t / 2]);

		m = _mm_add_ps(m, _mm_movehl_ps(m, m));
		m = _mm_add_ss(m, _mm_movehdup_ps(m));
		out[t * out_stride] = hsum_f32x8(acc[t]) + _mm_cvtss_f32(m);
	}
}

/*
 * Q6_K, one row: unsigned 6-bit q times y minus 32 * y, in 16 bits (|pair| <=
 * 2^13), then madd with the signed scales and the add (KR_DPWSSD): the low
 * 128-bit lane of each 32 activations holds elements 0-15 (scale 2k), the
 * high lane 16-31 (scale 2k+1).  The sixteen scales are widened once a block
 * and each pair put in place by one pshufb; the row k_prefetch_rows ahead is
 * prefetched (quant_x86_i.h).  y32, where given, holds each block's 32 * y
 * in pairs (maddubs(32, y), the same int16s), worked out once for a
 * decoding vec_dot8's eight rows (q6_k_y32): a load in place of a maddubs
 * each 32 elements.
 */
#define Q6_K_Y32 (ENG_QK_K / 2) /* int16s of y32 a block */

KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(dot_q6_k)(size_t n, float *out, const void *w, const void *a, const int16_t *y32)
{
	const struct eng_block_q6_k *x = w;
	const struct eng_block_q8_k *y = a;
	const __m256i m32 = _mm256_set1_epi8(32);
	const char *pf = (const char *)x + k_prefetch_rows * (n / ENG_QK_K) * sizeof(*x);
	__m256i shuf[4];
	__m256 acc = _mm256_setzero_ps();

	for (int k = 0; k < 4; k++)
		shuf[k] = _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 * (4 * k + 3) + 4 * k + 2)),
					   _mm_set1_epi16((short)(0x0100 * (4 * k + 1) + 4 * k)));
	for (size_t i = 0; i < n / ENG_QK_K; i++) {
		const float d = y[i].d * fp16(x[i].d);
		const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)x[i].scales));
		__m256i sumi = _mm256_setzero_si256();

		/* the lines of block i of that row, 210 bytes: four or five (the
		 * fifth is the next block's first) */
		for (int l = 0; l < 4; l++)
			k_prefetch(pf + i * sizeof(*x) + 64 * l);

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
				const int16_t *y32k = y32 + Q6_K_Y32 * i + 64 * h + 16 * k;
				const __m256i p16 = _mm256_sub_epi16(
					_mm256_maddubs_epi16(q[k], yk),
					y32 ? _mm256_loadu_si256((const void *)y32k)
					    : _mm256_maddubs_epi16(m32, yk));

				sumi = KR_DPWSSD(sumi, p16, _mm256_shuffle_epi8(sch, shuf[k]));
			}
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
	}
	*out = hsum_f32x8(acc);
}

KR_ATTR static void KR_NAME(vec_dot_q6_k_q8_k)(size_t n, float *out, const void *w,
						const void *a)
{
	KR_NAME(dot_q6_k)(n, out, w, a, NULL);
}

/* dot_q6_k's y32 for the nb blocks of y. */
KR_ATTR static void KR_NAME(q6_k_y32)(int16_t *y32, const struct eng_block_q8_k *y, size_t nb)
{
	const __m256i m32 = _mm256_set1_epi8(32);

	for (size_t i = 0; i < nb; i++)
		for (int k = 0; k < ENG_QK_K / 32; k++) {
			const __m256i yk = _mm256_loadu_si256((const void *)(y[i].qs + 32 * k));

			_mm256_storeu_si256((void *)(y32 + Q6_K_Y32 * i + 16 * k),
					    _mm256_maddubs_epi16(m32, yk));
		}
}

/*
 * Q6_K, a row by up to eight tokens (for vec_dotn), each row and
 * token bit-identical to vec_dot_q6_k_q8_k, as for Q4_K above: each 128
 * elements of a row are unpacked to 6-bit quants once for eight tokens.
 * The one-row kernel takes the quants unsigned (0..63) and 32 * y off each
 * pair of products, maddubs(q, y) - maddubs(32, y): two maddubs a token.
 * Here the sign goes to the other side, as in the avx512 prompt kernel:
 * the activations as y + 128 (unsigned; the set's pack8, pack8_q8_k, lays
 * them out once per token and matmul) against q - 32 (signed), and
 *   sum s (q - 32) y = sum s (q - 32) (y + 128) - 128 sum s (q - 32)
 * where the last sum depends on the row alone: worked out once per block
 * for all the tokens, and taken off each token's int32 lanes, which are
 * then the one-row kernel's.  Two 32-element chunks share a madd as Q4_K's
 * sub-blocks do (k4_pair_a, k4_pair_b; pack8_q8_k lays y + 128 out so):
 * per token and 64 elements two loads, two maddubs, a 16-bit add, one madd
 * and one add.  The int16 products stay within +-16320 (255 * 32 * 2):
 * maddubs never saturates, and the 16-bit sum of two within +-32640.
 */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(q6_k_row_tn)(const struct eng_block_q6_k *x, size_t nb, const uint8_t *act, size_t a_stride,
	    const unsigned tn, float *out, size_t out_stride)
{
	const __m256i m32 = _mm256_set1_epi8(32), u128 = _mm256_set1_epi8((char)0x80);
	const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
	const char *pf = (const char *)x + k_prefetch_rows * nb * sizeof(*x);
	__m256 acc[KR_TOKENS];
	/* pack8_q8_k's parts of each token's packed row */
	const uint8_t *yu[KR_TOKENS]; /* y + 128, 256 bytes a block */
	const float *yd[KR_TOKENS];   /* y.d, a block each */
	const struct pack8_q8_k_at at = pack8_q8_k_at(nb);

	for (unsigned t = 0; t < tn; t++) {
		yu[t] = act + t * a_stride + at.yu;
		yd[t] = (const float *)(act + t * a_stride + at.yd);
		acc[t] = _mm256_setzero_ps();
	}
	for (size_t i = 0; i < nb; i++) {
		const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)x[i].scales));
		const __m256 xdv = _mm256_set1_ps(fp16(x[i].d));
		__m256i sumi[KR_TOKENS], corr = _mm256_setzero_si256();

		for (int l = 0; l < 4; l++)
			k_prefetch(pf + i * sizeof(*x) + 64 * l);
		for (unsigned t = 0; t < tn; t++)
			sumi[t] = _mm256_setzero_si256();
		/* The block's quants are made first, all four pairs of chunks
		 * (stored: 256 bytes, read back from L1), then the tokens go
		 * through them.  Made beside the token loop, they kept more
		 * vectors live than AVX2 has sixteen registers for, and the
		 * token sums spilled to the stack: one core, 8 and 64 tokens,
		 * 1.04-1.06x (docs/benchmarks.md, issue 17, session 48). */
		__m256i qab[ENG_QK_K / 32], spp[ENG_QK_K / 64];

		/* both loops unrolled: their masks and shifts constants (as
		 * q4_k_block_tn's; 1.10x on one core) */
#pragma GCC unroll 2
		for (int h = 0; h < ENG_QK_K / 128; h++) {
			const __m256i sch = h ? _mm256_permute4x64_epi64(sc16, 0xee)
					      : _mm256_permute4x64_epi64(sc16, 0x44);
			const __m256i b1 = _mm256_loadu_si256((const void *)(x[i].ql + 64 * h));
			const __m256i b2 = _mm256_loadu_si256((const void *)(x[i].ql + 64 * h + 32));
			const __m256i bh = _mm256_loadu_si256((const void *)(x[i].qh + 32 * h));
			const __m256i bh2 = _mm256_srli_epi16(bh, 2);
			/* q6_k_unpack's quants of chunks 4h .. 4h + 3, already in
			 * k4_pair order: pairing moves whole 16-bit words, so it
			 * can come first, once for both pairs of chunks (ql's low
			 * nibbles are chunks 4h and 4h + 1, its high ones 4h + 2
			 * and 4h + 3; qh's 2-bit fields 0, 1, 2, 3 in that order) */
			const __m256i la = k4_pair_a(b1, b2), lb = k4_pair_b(b1, b2);
			const __m256i ha = k4_pair_a(bh, bh2), hb = k4_pair_b(bh, bh2);

			/* chunks 2c, 2c + 1 (32 elements each; 16 a scale) share
			 * a madd (k4_pair_a): dword k of the scales is
			 * [sc_4c, sc_4c+2] in the low half, [sc_4c+1, sc_4c+3]
			 * in the high one (of sch's eight) */
#pragma GCC unroll 2
			for (int c = 0; c < 2; c++) {
				const __m256i sp = _mm256_shuffle_epi8(sch, _mm256_set_m128i(
					_mm_set1_epi32(0x07060302 + 0x08080808 * c),
					_mm_set1_epi32(0x05040100 + 0x08080808 * c)));
				/* the quants minus 32: (low 4 bits | high 2 << 4) - 32 */
				const __m256i qa = _mm256_sub_epi8(
					_mm256_or_si256(
						_mm256_and_si256(c ? _mm256_srli_epi16(la, 4) : la, m4),
						_mm256_and_si256(c ? ha : _mm256_slli_epi16(ha, 4), m30)),
					m32);
				const __m256i qb = _mm256_sub_epi8(
					_mm256_or_si256(
						_mm256_and_si256(c ? _mm256_srli_epi16(lb, 4) : lb, m4),
						_mm256_and_si256(c ? hb : _mm256_slli_epi16(hb, 4), m30)),
					m32);

				/* 128 (qa + qb) in pairs: the sum of the two maddubs
				 * (the bytes add up within -64..62) */
				corr = KR_DPWSSD(corr, _mm256_maddubs_epi16(u128, _mm256_add_epi8(qa, qb)),
						 sp);
				_mm256_store_si256(&qab[4 * h + 2 * c], qa);
				_mm256_store_si256(&qab[4 * h + 2 * c + 1], qb);
				_mm256_store_si256(&spp[2 * h + c], sp);
			}
		}
		/* pair k of chunks (2k, 2k + 1): elements 64k .. 64k + 63 */
#pragma GCC unroll 4
		for (int k = 0; k < ENG_QK_K / 64; k++) {
			const __m256i qa = _mm256_load_si256(&qab[2 * k]);
			const __m256i qb = _mm256_load_si256(&qab[2 * k + 1]);
			const __m256i sp = _mm256_load_si256(&spp[k]);

			for (unsigned t = 0; t < tn; t++) {
				const uint8_t *yk = yu[t] + ENG_QK_K * i + 64 * k;
				const __m256i p16 = _mm256_add_epi16(
					_mm256_maddubs_epi16(_mm256_loadu_si256((const void *)yk), qa),
					_mm256_maddubs_epi16(_mm256_loadu_si256((const void *)(yk + 32)), qb));

				sumi[t] = KR_DPWSSD(sumi[t], p16, sp);
				K_IN_REGISTER(sumi[t]); /* one running register a token */
			}
		}
		/* y.d * d as before (the same product), its broadcast a load */
		for (unsigned t = 0; t < tn; t++)
			acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&yd[t][i]), xdv),
						 _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[t], corr)),
						 acc[t]);
	}
	for (unsigned t = 0; t < tn; t++)
		out[t * out_stride] = hsum_f32x8(acc[t]);
}

/*
 * Q6_K's vec_dotn: a thread's chunk of rows (matmul.c) by nt tokens, eight
 * tokens at a time over all the rows, as Q4_K's dotn_q45_k: those tokens'
 * activations stay in L1 while the chunk's rows (at least 64) come from L2
 * once for every eight tokens.  As a vec_dot8 it took eight rows at a time,
 * each row through all the tokens: every 4096-element row read the 64
 * tokens' activations (266 KB) from L2 again.  Decoding (one token) works
 * y32 out once for the chunk instead of once for every eight rows.
 */
KR_ATTR static void KR_NAME(vec_dotn_q6_k_q8_k)(size_t n, unsigned nrows, unsigned nt, float *out,
						 size_t out_stride, const void *w, size_t stride,
						 const void *a, size_t a_stride)
{
	const size_t nb = n / ENG_QK_K;

	if (nt == 1 && nb <= KR_TABLE_BLOCKS) {
		/* decoding: the one-row kernel, with y32 worked out once */
		int16_t y32[KR_TABLE_BLOCKS * Q6_K_Y32];

		KR_NAME(q6_k_y32)(y32, a, nb);
		for (unsigned r = 0; r < nrows; r++)
			KR_NAME(dot_q6_k)(n, out + r, (const uint8_t *)w + (size_t)r * stride, a, y32);
		return;
	}
	if (nt == 1) { /* decoding, a row longer than the table */
		for (unsigned r = 0; r < nrows; r++)
			KR_NAME(vec_dot_q6_k_q8_k)(n, out + r, (const uint8_t *)w + (size_t)r * stride,
						   a);
		return;
	}
	for (unsigned t0 = 0; t0 < nt; t0 += KR_TOKENS) {
		const uint8_t *y = (const uint8_t *)a + t0 * a_stride;
		const unsigned tn = nt - t0 < KR_TOKENS ? nt - t0 : KR_TOKENS;

		for (unsigned r = 0; r < nrows; r++) {
			const struct eng_block_q6_k *x =
				(const void *)((const uint8_t *)w + (size_t)r * stride);
			float *o = out + t0 * out_stride + r;

#define CALL(tn) KR_NAME(q6_k_row_tn)(x, nb, y, a_stride, tn, o, out_stride)
			KR_SWITCH(tn, CALL)
#undef CALL
		}
	}
}

/*
 * Q5_K, a row by up to eight tokens (for vec_dotn), each row and
 * token bit-identical to the set's one-row kernel (dot_q45_k: ggml's
 * lanes, and the mins summed to one integer a block, dmin times that
 * added to a scalar).  It reads the Q8_K rows themselves, at the start of
 * what matmul passes (pack8_q8_k copies them there; a set without a pack8
 * for Q5_K passes them as they are), so each block's 5-bit quants and
 * scales are made once for up to eight tokens, and the tokens' y.d and
 * paired bsums once for all the rows (kr_q4_k_table, as for Q4_K);
 * per token and 64 elements that leaves two loads, two maddubs, two madds
 * and two adds, and per token and block the mins' integer sum and two
 * scalar steps.
 */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(q5_k_row_tn)(const struct eng_block_q5_k *x, size_t nb, const uint8_t *act, size_t a_stride,
		     const struct kr_q4_k_tab *T, const unsigned tn, float *out, size_t out_stride)
{
	const char *pf = (const char *)x + k_prefetch_rows * nb * sizeof(*x);
	const struct eng_block_q8_k *y[KR_TOKENS];
	__m256 acc[KR_TOKENS];
	float summs[KR_TOKENS];

	for (unsigned t = 0; t < tn; t++) {
		y[t] = (const struct eng_block_q8_k *)(act + t * a_stride);
		acc[t] = _mm256_setzero_ps();
		summs[t] = 0.0f;
	}
	for (size_t i = 0; i < nb; i++) {
		uint64_t sc, mn;

		k4_scales_mins(x[i].scales, &sc, &mn);
		const __m256i scales = k_scales(sc);
		const __m128i mn16 = k_mins(mn);
		const __m256i hbits = _mm256_loadu_si256((const void *)x[i].qh);
		const float xd = fp16(x[i].d), xdmin = fp16(x[i].dmin);
		__m256i sumi[KR_TOKENS];

		for (int l = 0; l < 3; l++)
			k_prefetch(pf + i * sizeof(*x) + 64 * l);
		for (unsigned t = 0; t < tn; t++)
			sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
		for (int j = 0; j < ENG_QK_K / 64; j++) {
			const __m256i scale_l = k_scale(scales, 2 * j);
			const __m256i scale_h = k_scale(scales, 2 * j + 1);
			__m256i ql, qh;

			q5_k_quants(_mm256_loadu_si256((const void *)(x[i].qs + 32 * j)), hbits, j, &ql,
				    &qh);

			for (unsigned t = 0; t < tn; t++) {
				const int8_t *q8 = y[t][i].qs + 64 * j;
				const __m256i p = _mm256_add_epi32(
					_mm256_madd_epi16(_mm256_maddubs_epi16(
								  ql, _mm256_loadu_si256((const void *)q8)),
							  scale_l),
					_mm256_madd_epi16(
						_mm256_maddubs_epi16(
							qh, _mm256_loadu_si256((const void *)(q8 + 32))),
						scale_h));

				sumi[t] = _mm256_add_epi32(sumi[t], p);
				K_IN_REGISTER(sumi[t]); /* one running register a token */
			}
		}
		for (unsigned t = 0; t < tn; t++) {
			const __m128i m = _mm_madd_epi16(
				mn16, _mm_loadu_si128((const void *)T[i].q8s[t]));

			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(T[i].d[t] * xd),
						 _mm256_cvtepi32_ps(sumi[t]), acc[t]);
			summs[t] = fmaf(-T[i].d[t] * xdmin, (float)hsum_i32x4(m), summs[t]);
		}
	}
	for (unsigned t = 0; t < tn; t++)
		out[t * out_stride] = hsum_f32x8(acc[t]) + summs[t];
}

/*
 * Q4_K's or Q5_K's nrows rows by nt tokens (up to ENG_DOT16_NT): decoding,
 * row by row through the one-row kernel with the activation's k_q8_sums
 * worked out once for all the rows; rows longer than the table, row by row
 * as vec_dot does them; else eight tokens at a time, each eight's table
 * made once for all the rows and then the row kernels above.  As vec_dotn
 * it takes a thread's whole chunk of rows (matmul.c), so what depends on
 * the tokens alone is worked out once a chunk (at least 64 rows), not once
 * for every eight rows as their vec_dot8 did: one core, AVX2, Q4_K by 8
 * and 64 tokens, 1.04-1.05x (docs/benchmarks.md, issue 17, session 46).
 */
KR_ATTR static inline __attribute__((always_inline)) void
KR_NAME(dotn_q45_k)(size_t n, unsigned nrows, unsigned nt, float *out, size_t out_stride,
		    const void *w, size_t stride, const void *a, size_t a_stride, const bool five)
{
	const size_t nb = n / ENG_QK_K;

	if (nb > KR_TABLE_BLOCKS) {
		for (unsigned r = 0; r < nrows; r++)
			for (unsigned t = 0; t < nt; t++)
				KR_NAME(dot_q45_k)(n, out + t * out_stride + r,
						   (const uint8_t *)w + (size_t)r * stride,
						   (const uint8_t *)a + t * a_stride, NULL, five);
		return;
	}
	if (nt == 1) {
		struct k_q8_sums S[KR_TABLE_BLOCKS];

		k_q8_sums_make(S, a, nb);
		for (unsigned r = 0; r < nrows; r++)
			KR_NAME(dot_q45_k)(n, out + r, (const uint8_t *)w + (size_t)r * stride, a, S,
					   five);
		return;
	}
	for (unsigned t0 = 0; t0 < nt; t0 += KR_TOKENS) {
		const uint8_t *y = (const uint8_t *)a + t0 * a_stride;
		const unsigned tn = nt - t0 < KR_TOKENS ? nt - t0 : KR_TOKENS;
		struct kr_q4_k_tab T[KR_TABLE_BLOCKS];

		KR_NAME(kr_q4_k_table)(T, y, a_stride, tn, nb);
		for (unsigned r = 0; r < nrows; r++) {
			const void *x = (const uint8_t *)w + (size_t)r * stride;
			float *o = out + t0 * out_stride + r;

			if (five) {
#define CALL(tn) KR_NAME(q5_k_row_tn)(x, nb, y, a_stride, T, tn, o, out_stride)
				KR_SWITCH(tn, CALL)
#undef CALL
			} else {
#define CALL(tn) KR_NAME(q4_k_row_tn)(x, nb, y, a_stride, T, tn, o, out_stride)
				KR_SWITCH(tn, CALL)
#undef CALL
			}
		}
	}
}

KR_ATTR static void KR_NAME(vec_dotn_q4_k_q8_k)(size_t n, unsigned nrows, unsigned nt, float *out,
						 size_t out_stride, const void *w, size_t stride,
						 const void *a, size_t a_stride)
{
	KR_NAME(dotn_q45_k)(n, nrows, nt, out, out_stride, w, stride, a, a_stride, false);
}

KR_ATTR static void KR_NAME(vec_dotn_q5_k_q8_k)(size_t n, unsigned nrows, unsigned nt, float *out,
						 size_t out_stride, const void *w, size_t stride,
						 const void *a, size_t a_stride)
{
	KR_NAME(dotn_q45_k)(n, nrows, nt, out, out_stride, w, stride, a, a_stride, true);
}

#undef KR_ATTR
#undef KR_NAME
#undef KR_DPWSSD
#undef Q6_K_Y32
