/*
 * quant.c - the tensor type table, fp16/bf16 conversion, and the choice of
 * kernel set.
 *
 * The type table is indexed by the GGUF type number and holds what the loader
 * needs to size and validate tensors: name, block size, bytes per block and
 * the activation format the type's dot product consumes.  Types that GGUF
 * files may carry but strata has no kernels for are still named (so an error
 * can say "Q4_1") and sized (so the GGUF reader can check extents), with
 * supported = false.
 *
 * The fp16 conversions are portable integer code: they are used by the scalar
 * kernels and by the quantizers of every set, and must agree bit for bit with
 * the F16C instructions the AVX2 set uses (round to nearest even, subnormals
 * kept, NaN quieted with its payload truncated).
 *
 * Threading: everything here is read-only after eng_kernels_get()'s one-time
 * initialisation, which pthread_once makes safe to race.
 */
#include "quant.h"

#include "engine.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- type table ------------------------------------------------------- */

#define TYPE(t, n, b, s, vd, sup) \
	[ENG_TYPE_##t] = { .name = n, .blck = b, .bytes = s, \
			   .vec_dot_type = ENG_TYPE_##vd, .supported = sup, .row_group = 1 }

/*
 * Block sizes of the unsupported types are ggml's: Q4_1 = f16 d, m + 16 B;
 * Q5_0 = f16 d + u32 qh + 16 B; Q5_1 = f16 d, m + u32 qh + 16 B; Q8_1 = f16 d,
 * s + 32 B; Q2_K = 16 B scales + 64 B qs + f16 d, dmin; Q3_K = 32 B hmask +
 * 64 B qs + 12 B scales + f16 d.  Their vec_dot_type is ggml's too, so the
 * table stays right if kernels are added later.
 *
 * Q8_K is only ever an activation format (ggml has no Q8_K weight dot
 * product): it has to_float and from_float but no vec_dot, so it is not
 * "supported" in the sense the loader checks.
 */
static const struct eng_type_info types[ENG_TYPE_COUNT] = {
	TYPE(F32, "F32", 1, 4, F32, true),
	TYPE(F16, "F16", 1, 2, F16, true),
	TYPE(Q4_0, "Q4_0", ENG_QK4_0, 18, Q8_0, true),
	TYPE(Q4_1, "Q4_1", 32, 20, Q8_1, false),
	TYPE(Q5_0, "Q5_0", 32, 22, Q8_0, false),
	TYPE(Q5_1, "Q5_1", 32, 24, Q8_1, false),
	TYPE(Q8_0, "Q8_0", ENG_QK8_0, 34, Q8_0, true),
	TYPE(Q8_1, "Q8_1", 32, 36, Q8_1, false),
	TYPE(Q2_K, "Q2_K", ENG_QK_K, 84, Q8_K, false),
	TYPE(Q3_K, "Q3_K", ENG_QK_K, 110, Q8_K, false),
	TYPE(Q4_K, "Q4_K", ENG_QK_K, 144, Q8_K, true),
	TYPE(Q5_K, "Q5_K", ENG_QK_K, 176, Q8_K, true),
	TYPE(Q6_K, "Q6_K", ENG_QK_K, 210, Q8_K, true),
	TYPE(Q8_K, "Q8_K", ENG_QK_K, 292, Q8_K, false),
	TYPE(BF16, "BF16", 1, 2, BF16, true),
	/* Q4_0 bytes per block of 32 elements of a row, 16 rows interleaved:
	 * sizes and offsets are Q4_0's.  Supported means vec_dot16 here. */
	[ENG_TYPE_Q4_0_R16] = { .name = "Q4_0_R16", .blck = ENG_QK4_0, .bytes = 18,
				.vec_dot_type = ENG_TYPE_Q8_0, .supported = true,
				.row_group = ENG_R16_ROWS },
};

#undef TYPE

const struct eng_type_info *eng_type_info(uint32_t type)
{
	if (type >= ENG_TYPE_COUNT || !types[type].name)
		return NULL;
	return &types[type];
}

size_t eng_row_bytes(uint32_t type, uint64_t n)
{
	const struct eng_type_info *ti = eng_type_info(type);
	uint64_t nb;

	if (!ti || n % ti->blck)
		return 0;
	nb = n / ti->blck;
	/* A row length comes from a file: a huge one must not wrap. */
	if (nb > SIZE_MAX / ti->bytes)
		return 0;
	return (size_t)nb * ti->bytes;
}

/* ---- Q4_0_R16 --------------------------------------------------------- */

void eng_q4_0_to_r16(const void *src, size_t stride, size_t n, void *dst)
{
	struct eng_block_q4_0_r16 *y = dst;

	for (size_t ib = 0; ib < n / ENG_QK4_0; ib++) {
		for (unsigned r = 0; r < ENG_R16_ROWS; r++) {
			const struct eng_block_q4_0 *x =
				(const struct eng_block_q4_0 *)((const uint8_t *)src + r * stride) + ib;

			y[ib].d[r] = x->d;
			for (int k = 0; k < 4; k++)
				memcpy(&y[ib].qs[k][4 * r], &x->qs[4 * k], 4);
		}
	}
}

void eng_r16_to_q4_0(const void *src, unsigned r, size_t n, void *dst)
{
	const struct eng_block_q4_0_r16 *x = src;
	struct eng_block_q4_0 *y = dst;

	for (size_t ib = 0; ib < n / ENG_QK4_0; ib++) {
		y[ib].d = x[ib].d[r];
		for (int k = 0; k < 4; k++)
			memcpy(&y[ib].qs[4 * k], &x[ib].qs[k][4 * r], 4);
	}
}

/* ---- fp16 / bf16 ------------------------------------------------------ */

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float f32_from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

float eng_fp16_to_fp32(eng_fp16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f) /* inf; NaN quieted with its payload, as F16C does */
		return f32_from_bits(sign | 0x7f800000 | (man ? 0x400000 : 0) | man << 13);
	if (exp == 0) {
		if (!man)
			return f32_from_bits(sign);
		/* Subnormal: man * 2^-24.  Shift the leading one up to the
		 * implicit position; every fp16 subnormal is a normal fp32. */
		exp = 113; /* fp32 biased exponent of 2^-14 */
		while (!(man & 0x400)) {
			man <<= 1;
			exp--;
		}
		return f32_from_bits(sign | exp << 23 | (man & 0x3ff) << 13);
	}
	return f32_from_bits(sign | (exp + 112) << 23 | man << 13);
}

eng_fp16_t eng_fp32_to_fp16(float f)
{
	uint32_t x = f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000;
	uint32_t h, rem;

	x &= 0x7fffffff;
	if (x > 0x7f800000) /* NaN: quiet it, keep the top payload bits */
		return (eng_fp16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
	/* 65520 is the midpoint between 65504 (odd mantissa) and 2^16: ties go
	 * to even, i.e. to infinity. */
	if (x >= 0x477ff000)
		return (eng_fp16_t)(sign | 0x7c00);
	if (x < 0x38800000) { /* below 2^-14: fp16 subnormal or zero */
		uint32_t man, shift, half;

		/* 2^-25 is half the smallest subnormal; it ties to even (0). */
		if (x <= 0x33000000)
			return (eng_fp16_t)sign;
		/* value = man * 2^(e-150) and the result counts 2^-24 units,
		 * so shift right by 126 - e (between 14 and 24 here). */
		man = (x & 0x7fffff) | 0x800000;
		shift = 126 - (x >> 23);
		h = man >> shift;
		rem = man & ((1u << shift) - 1);
		half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++; /* may carry into the smallest normal: still right */
		return (eng_fp16_t)(sign | h);
	}
	h = (x >> 13) - (112u << 10);
	rem = x & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++; /* a carry out of the mantissa bumps the exponent */
	return (eng_fp16_t)(sign | h);
}

float eng_bf16_to_fp32(eng_bf16_t h)
{
	return f32_from_bits((uint32_t)h << 16);
}

eng_bf16_t eng_fp32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffff) > 0x7f800000) /* NaN: keep the top bits, force quiet */
		return (eng_bf16_t)((u >> 16) | 64);
	return (eng_bf16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

/* ---- kernel set selection -------------------------------------------- */

static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;
static const struct eng_kernels *kernels_best;

static void kernels_init(void)
{
	const char *isa = getenv("STRATA_ISA");
	const struct eng_kernels *avx2 = eng_kernels_avx2();
	const struct eng_kernels *avx512 = eng_kernels_avx512();
	const struct eng_kernels *avx512bf16 = eng_kernels_avx512bf16();

	/* The eng_kernels_*() functions check cpuid themselves, so asking for
	 * a set this CPU lacks quietly gives the next one down rather than
	 * SIGILL.  An unknown value is treated like no value. */
	if (isa && !strcmp(isa, "scalar"))
		kernels_best = eng_kernels_ref();
	else if (avx512bf16 && isa && !strcmp(isa, "avx512bf16"))
		kernels_best = avx512bf16;
	else if (avx512 && !(isa && !strcmp(isa, "avx2")))
		kernels_best = avx512;
	else if (avx2)
		kernels_best = avx2;
	else
		kernels_best = eng_kernels_ref();
}

const struct eng_kernels *eng_kernels_get(void)
{
	pthread_once(&kernels_once, kernels_init);
	return kernels_best;
}

const char *eng_isa_name(void)
{
	return eng_kernels_get()->isa;
}
