/*
 * test_quant.c - the tensor types and their kernels (engine/quant*.c).
 *
 * Layout tests build blocks byte by byte and compare to_float with values
 * worked out here from the documented layout (not from the kernels), so a
 * kernel and its test cannot share a misreading.  Then: fp16 conversion
 * (exhaustive round trip, known values, and against F16C where the CPU has
 * it), the activation quantizers, every reference dot product against the
 * dequantized rows, every AVX2 kernel against the reference, and the type
 * table.  Prints one "ok"/"FAIL" line per check; exits 0 if all pass, 1 if
 * not.  Single-threaded; random data come from a fixed seed.
 */
#include "quant.h"

#include <cpuid.h>
#include <immintrin.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static void check(bool cond, const char *fmt, ...)
{
	va_list ap;

	printf("%s - ", cond ? "ok" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	if (!cond)
		failures++;
}

/* ---- helpers ---------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* uniform in [lo, hi) */
static float rndf(float lo, float hi)
{
	return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0));
}

static void rnd_bytes(void *p, size_t n)
{
	uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)rnd();
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	return p;
}

static uint32_t bits_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* a random fp16 scale of magnitude [lo, hi), sign random if signed_ */
static eng_fp16_t rnd_scale(float lo, float hi, bool signed_)
{
	float v = rndf(lo, hi);

	if (signed_ && (rnd() & 1))
		v = -v;
	return eng_fp32_to_fp16(v);
}

/* First index where two float arrays differ bitwise, or -1. */
static long first_diff(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (bits_of(a[i]) != bits_of(b[i]))
			return (long)i;
	return -1;
}

static const char *type_name(uint32_t t)
{
	return eng_type_info(t)->name;
}

/* ---- (a) block layouts ------------------------------------------------ */

static void test_layout_q4_0(const struct eng_kernels *k)
{
	struct eng_block_q4_0 b;
	float out[32], want[32];

	/* d = 0.5; byte j has low nibble j, high nibble 15 - j */
	b.d = 0x3800;
	for (int j = 0; j < 16; j++)
		b.qs[j] = (uint8_t)(j | (15 - j) << 4);
	for (int j = 0; j < 16; j++) {
		want[j] = -4.0f + 0.5f * j;             /* -4.0 .. 3.5 */
		want[16 + j] = -4.0f + 0.5f * (15 - j); /* 3.5 .. -4.0 */
	}
	k->to_float[ENG_TYPE_Q4_0](&b, out, 32);
	long d = first_diff(out, want, 32);
	check(d < 0, "%s: Q4_0 layout (low nibbles 0-15, high 16-31, -8 offset)%s", k->isa,
	      d < 0 ? "" : " [mismatch]");
	if (d >= 0)
		printf("  element %ld: got %g want %g\n", d, out[d], want[d]);
}

/* Q4_0_R16 puts row r's scale at d[r] and its dword k at qs[k][4r], as
 * quant.h says, and eng_r16_to_q4_0 gives each row back. */
static void test_layout_r16(void)
{
	enum { N = 64, NB = N / 32 };
	struct eng_block_q4_0 rows[16][NB], back[NB];
	struct eng_block_q4_0_r16 x[NB];
	bool placed = true, round = true;

	for (unsigned r = 0; r < 16; r++)
		for (unsigned ib = 0; ib < NB; ib++) {
			rows[r][ib].d = (eng_fp16_t)(0x3c00 + 16 * ib + r);
			for (unsigned j = 0; j < 16; j++)
				rows[r][ib].qs[j] = (uint8_t)(r * 16 + j + ib);
		}
	eng_q4_0_to_r16(rows, sizeof(rows[0]), N, x);
	for (unsigned r = 0; r < 16; r++) {
		for (unsigned ib = 0; ib < NB; ib++) {
			placed &= x[ib].d[r] == rows[r][ib].d;
			for (unsigned j = 0; j < 16; j++)
				placed &= x[ib].qs[j / 4][4 * r + j % 4] == rows[r][ib].qs[j];
		}
		eng_r16_to_q4_0(x, r, N, back);
		round &= !memcmp(back, rows[r], sizeof(back));
	}
	check(placed, "Q4_0_R16 layout: d[r] = row r's scale, qs[k][4r..4r+3] = its dword k");
	check(round, "Q4_0_R16 layout: each row comes back as it went in");
}

static void test_layout_q8_0(const struct eng_kernels *k)
{
	struct eng_block_q8_0 b[2];
	float out[64], want[64];

	b[0].d = 0x3400; /* 0.25 */
	b[1].d = 0xc000; /* -2 */
	for (int j = 0; j < 32; j++) {
		b[0].qs[j] = (int8_t)(j * 8 - 128); /* -128 .. 120 */
		b[1].qs[j] = (int8_t)(127 - j);
		want[j] = (j * 8 - 128) * 0.25f;
		want[32 + j] = (127 - j) * -2.0f;
	}
	k->to_float[ENG_TYPE_Q8_0](b, out, 64);
	check(first_diff(out, want, 64) < 0, "%s: Q8_0 layout (two blocks, -128 kept)", k->isa);
}

/* 8 scales and 8 mins used by the Q4_K/Q5_K tests, and their packing,
 * worked out by hand: for j < 4, byte j = sc[j] | (sc[j+4] >> 4) << 6,
 * byte j+4 = mn[j] | (mn[j+4] >> 4) << 6, byte j+8 = (sc[j+4] & 15) |
 * (mn[j+4] & 15) << 4. */
static const uint8_t k4_sc[8] = { 1, 2, 3, 63, 17, 33, 48, 62 };
static const uint8_t k4_mn[8] = { 0, 5, 63, 7, 40, 21, 9, 50 };
static const uint8_t k4_packed[12] = { 65, 130, 195, 255, 128, 69, 63, 199, 129, 81, 144, 46 };

static uint8_t q4k_qs_byte(int i)
{
	return (uint8_t)(((i * 7) & 15) | ((i * 3 + 1) & 15) << 4);
}

static void test_layout_q4_k(const struct eng_kernels *k)
{
	struct eng_block_q4_k b;
	float out[256], want[256];

	b.d = 0x3c00;    /* 1.0 */
	b.dmin = 0x3800; /* 0.5 */
	memcpy(b.scales, k4_packed, 12);
	for (int i = 0; i < 128; i++)
		b.qs[i] = q4k_qs_byte(i);
	/* 64 elements per 32 bytes: low nibbles sub-block 2c, high 2c+1 */
	for (int c = 0; c < 4; c++)
		for (int l = 0; l < 32; l++) {
			uint8_t q = b.qs[32 * c + l];

			want[64 * c + l] = 1.0f * k4_sc[2 * c] * (q & 15) - 0.5f * k4_mn[2 * c];
			want[64 * c + 32 + l] =
				1.0f * k4_sc[2 * c + 1] * (q >> 4) - 0.5f * k4_mn[2 * c + 1];
		}
	k->to_float[ENG_TYPE_Q4_K](&b, out, 256);
	long d = first_diff(out, want, 256);
	check(d < 0, "%s: Q4_K layout (6-bit scales/mins incl. sub-blocks 4-7)", k->isa);
	if (d >= 0)
		printf("  element %ld: got %g want %g\n", d, out[d], want[d]);
}

static void test_layout_q5_k(const struct eng_kernels *k)
{
	struct eng_block_q5_k b;
	float out[256], want[256];

	b.d = 0x3c00;
	b.dmin = 0x3800;
	memcpy(b.scales, k4_packed, 12);
	for (int i = 0; i < 128; i++)
		b.qs[i] = q4k_qs_byte(i);
	for (int l = 0; l < 32; l++)
		b.qh[l] = (uint8_t)(l * 37 + 11);
	/* fifth bit of element 64c + l is qh[l] bit 2c, of 64c + 32 + l bit 2c+1 */
	for (int c = 0; c < 4; c++)
		for (int l = 0; l < 32; l++) {
			uint8_t q = b.qs[32 * c + l];
			int lo = (q & 15) + 16 * ((b.qh[l] >> (2 * c)) & 1);
			int hi = (q >> 4) + 16 * ((b.qh[l] >> (2 * c + 1)) & 1);

			want[64 * c + l] = 1.0f * k4_sc[2 * c] * lo - 0.5f * k4_mn[2 * c];
			want[64 * c + 32 + l] = 1.0f * k4_sc[2 * c + 1] * hi - 0.5f * k4_mn[2 * c + 1];
		}
	k->to_float[ENG_TYPE_Q5_K](&b, out, 256);
	long d = first_diff(out, want, 256);
	check(d < 0, "%s: Q5_K layout (high bits in qh)", k->isa);
	if (d >= 0)
		printf("  element %ld: got %g want %g\n", d, out[d], want[d]);
}

static void test_layout_q6_k(const struct eng_kernels *k)
{
	static const int8_t sc[16] = { 1, -2, 3, -4, 5, -6, 7, -8, 127, -128, 10, -11, 12, -13, 14, -15 };
	struct eng_block_q6_k b;
	float out[256], want[256];

	for (int i = 0; i < 128; i++)
		b.ql[i] = (uint8_t)(i * 11 + 5);
	for (int i = 0; i < 64; i++)
		b.qh[i] = (uint8_t)(i * 29 + 3);
	memcpy(b.scales, sc, 16);
	b.d = 0x3400; /* 0.25 */
	/* element e: half h = e / 128; within it quarter t = r / 32, l = r % 32;
	 * quarters 0/1 take the low nibble of ql[64h + l] / ql[64h + 32 + l],
	 * quarters 2/3 the high nibbles; qh[32h + l] bits 2t..2t+1 on top. */
	for (int e = 0; e < 256; e++) {
		int h = e / 128, r = e % 128, t = r / 32, l = r % 32;
		uint8_t qlb = b.ql[64 * h + (t & 1) * 32 + l];
		int lo = t < 2 ? (qlb & 15) : (qlb >> 4);
		int hi = (b.qh[32 * h + l] >> (2 * t)) & 3;

		want[e] = 0.25f * sc[e / 16] * ((lo | hi << 4) - 32);
	}
	k->to_float[ENG_TYPE_Q6_K](&b, out, 256);
	long d = first_diff(out, want, 256);
	check(d < 0, "%s: Q6_K layout (ql/qh split, int8 scales)", k->isa);
	if (d >= 0)
		printf("  element %ld: got %g want %g\n", d, out[d], want[d]);
}

static void test_layout_q8_k(const struct eng_kernels *k)
{
	struct eng_block_q8_k b;
	float out[256], want[256];

	memset(&b, 0, sizeof(b));
	b.d = -0.5f;
	for (int i = 0; i < 256; i++) {
		b.qs[i] = (int8_t)(i - 128);
		want[i] = -0.5f * (i - 128);
	}
	k->to_float[ENG_TYPE_Q8_K](&b, out, 256);
	check(first_diff(out, want, 256) < 0, "%s: Q8_K layout", k->isa);
}

static void test_layout_float(const struct eng_kernels *k)
{
	static const struct { uint16_t h; uint32_t f; } f16[] = {
		{ 0x0000, 0x00000000 }, { 0x8000, 0x80000000 }, /* +-0 */
		{ 0x3c00, 0x3f800000 }, { 0xc000, 0xc0000000 }, /* 1, -2 */
		{ 0x7bff, 0x477fe000 },                         /* 65504 */
		{ 0x0001, 0x33800000 },                         /* 2^-24, subnormal */
		{ 0x03ff, 0x387fc000 },                         /* largest subnormal */
		{ 0x8200, 0xb8000000 },                         /* -2^-15, subnormal */
		{ 0x0400, 0x38800000 },                         /* 2^-14 */
		{ 0x3555, 0x3eaaa000 },                         /* 0.333251953125 */
		{ 0x7c00, 0x7f800000 }, { 0xfc00, 0xff800000 }, /* +-inf */
		{ 0x7e00, 0x7fc00000 }, { 0x7c01, 0x7fc02000 }, /* NaNs, quieted */
	};
	static const struct { uint16_t h; uint32_t f; } bf16[] = {
		{ 0x3f80, 0x3f800000 }, { 0xc040, 0xc0400000 }, { 0x4049, 0x40490000 },
		{ 0x0001, 0x00010000 }, /* fp32 subnormal */
		{ 0x8000, 0x80000000 }, { 0x7f80, 0x7f800000 }, { 0xff81, 0xff810000 },
	};
	enum { NF = sizeof(f16) / sizeof(f16[0]), NB = sizeof(bf16) / sizeof(bf16[0]) };
	uint16_t in[NF > NB ? NF : NB];
	float out[NF > NB ? NF : NB];
	int bad = -1;

	for (int i = 0; i < NF; i++)
		in[i] = f16[i].h;
	k->to_float[ENG_TYPE_F16](in, out, NF);
	for (int i = 0; i < NF && bad < 0; i++)
		if (bits_of(out[i]) != f16[i].f)
			bad = i;
	check(bad < 0, "%s: F16 to_float bit patterns (subnormals, inf, NaN)", k->isa);
	if (bad >= 0)
		printf("  0x%04x: got 0x%08" PRIx32 " want 0x%08" PRIx32 "\n", f16[bad].h,
		       bits_of(out[bad]), f16[bad].f);

	bad = -1;
	for (int i = 0; i < NB; i++)
		in[i] = bf16[i].h;
	k->to_float[ENG_TYPE_BF16](in, out, NB);
	for (int i = 0; i < NB && bad < 0; i++)
		if (bits_of(out[i]) != bf16[i].f)
			bad = i;
	check(bad < 0, "%s: BF16 to_float bit patterns", k->isa);

	/* a long F16 row exercises the vector body and the tail */
	enum { N = 1003 };
	uint16_t *h = xmalloc(N * sizeof(*h));
	float *o = xmalloc(N * sizeof(*o));
	bad = -1;
	for (int i = 0; i < N; i++)
		h[i] = (uint16_t)rnd();
	k->to_float[ENG_TYPE_F16](h, o, N);
	for (int i = 0; i < N && bad < 0; i++)
		if (bits_of(o[i]) != bits_of(eng_fp16_to_fp32(h[i])))
			bad = i;
	check(bad < 0, "%s: F16 to_float row of %d random halves == eng_fp16_to_fp32", k->isa, N);
	free(h);
	free(o);

	float f[5] = { 1.0f, -2.5f, 0.0f, 1e30f, -1e-30f }, g[5];
	k->to_float[ENG_TYPE_F32](f, g, 5);
	check(!memcmp(f, g, sizeof(f)), "%s: F32 to_float copies", k->isa);
}

/* ---- (b) fp16 conversion ---------------------------------------------- */

__attribute__((target("f16c"))) static uint16_t f16c_from_f32(float f)
{
	return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

/* fp32 -> bf16: round to nearest even, NaN quieted, as ggml; and every
 * set's from_float gives the scalar conversion's bits. */
static void test_bf16(const struct eng_kernels *const *sets, int n_sets)
{
	static const struct { uint32_t f; uint16_t h; } known[] = {
		{ 0x3f800000, 0x3f80 }, { 0x3f808000, 0x3f80 }, /* tie to even (down) */
		{ 0x3f818000, 0x3f82 },                         /* tie to even (up) */
		{ 0x3f808001, 0x3f81 }, { 0xbf7fffff, 0xbf80 }, /* carry into the exponent */
		{ 0x7f7fffff, 0x7f80 },                         /* rounds to infinity */
		{ 0x7f800000, 0x7f80 }, { 0x00000001, 0x0000 }, { 0x00018000, 0x0002 },
		{ 0x7fa00000, 0x7fe0 }, /* signalling NaN quieted */
	};
	float in[4099];
	eng_bf16_t want[4099], got[4099];
	int bad = -1;

	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		float f;

		memcpy(&f, &known[i].f, sizeof(f));
		if (eng_fp32_to_bf16(f) != known[i].h && bad < 0)
			bad = (int)i;
	}
	check(bad < 0, "fp32->bf16 known values (RNE, overflow, NaN)");
	for (size_t i = 0; i < 4099; i++) {
		uint32_t u = (uint32_t)rand() * 2654435761u;

		/* every bit pattern class: ordinary values, ties, NaNs */
		if (i % 7 == 0)
			u = (u & 0xffff0000) | 0x8000;
		if (i % 101 == 0)
			u |= 0x7f800001;
		memcpy(&in[i], &u, sizeof(u));
		want[i] = eng_fp32_to_bf16(in[i]);
	}
	for (int k = 0; k < n_sets; k++) {
		if (!sets[k])
			continue;
		sets[k]->from_float[ENG_TYPE_BF16](in, got, 4099);
		check(!memcmp(got, want, sizeof(want)), "%s: BF16 from_float is fp32->bf16 RNE",
		      sets[k]->isa);
	}
}

static void test_fp16(void)
{
	static const struct { float f; uint16_t h; } known[] = {
		{ 1.0f, 0x3c00 }, { -2.0f, 0xc000 }, { 0.0f, 0x0000 }, { -0.0f, 0x8000 },
		{ 65504.0f, 0x7bff }, { 65519.99f, 0x7bff }, { 65520.0f, 0x7c00 }, /* ties to inf */
		{ 1e6f, 0x7c00 }, { -INFINITY, 0xfc00 }, { 0.1f, 0x2e66 },
		{ 0x1p-14f, 0x0400 }, { 0x1p-24f, 0x0001 }, { 0x1p-25f, 0x0000 }, /* tie to 0 */
		{ 0x1.000002p-25f, 0x0001 }, { 0x3p-25f, 0x0002 },                /* tie to even */
		{ 0x1.ffcp-15f, 0x0400 }, /* rounds up out of the subnormals */
		{ 0x1.002p0f, 0x3c00 }, { 0x1.006p0f, 0x3c02 },                  /* ties to even */
		{ 0x1.0021p0f, 0x3c01 }, { 1e-10f, 0x0000 }, { -0x1p-20f, 0x8010 },
	};
	int bad = -1;

	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (eng_fp32_to_fp16(known[i].f) != known[i].h && bad < 0)
			bad = (int)i;
	check(bad < 0, "fp32->fp16 known values (RNE, subnormals, overflow)");
	if (bad >= 0)
		printf("  %a: got 0x%04x want 0x%04x\n", known[bad].f,
		       eng_fp32_to_fp16(known[bad].f), known[bad].h);

	uint16_t nan = eng_fp32_to_fp16(NAN);
	check((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff), "fp32->fp16 NaN stays NaN (0x%04x)", nan);

	long rt_bad = -1;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = eng_fp16_to_fp32((uint16_t)h);
		bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);

		if (is_nan ? !isnan(f) || eng_fp32_to_fp16(f) != (h | 0x200)
			   : eng_fp32_to_fp16(f) != h) {
			rt_bad = h;
			break;
		}
	}
	check(rt_bad < 0, "fp16->fp32->fp16 round trip of all 65536 halves (NaN quieted)");
	if (rt_bad >= 0)
		printf("  0x%04lx\n", rt_bad);

	/* A half's value must be exact: check against a double computation. */
	rt_bad = -1;
	for (uint32_t h = 0; h < 0x7c00; h++) {
		int e = h >> 10, m = h & 0x3ff;
		double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);

		if ((double)eng_fp16_to_fp32((uint16_t)h) != v ||
		    (double)eng_fp16_to_fp32((uint16_t)(h | 0x8000)) != -v) {
			rt_bad = h;
			break;
		}
	}
	check(rt_bad < 0, "fp16->fp32 value of every finite half");

	unsigned int eax, ebx, ecx, edx;

	if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C)) {
		printf("skip - fp32->fp16 against F16C: CPU lacks F16C\n");
	} else {
		/* every 997th bit pattern (~4.3M floats, all classes) */
		uint64_t n = 0, diff = 0;
		uint32_t first = 0;

		for (uint64_t u = 0; u <= 0xffffffffull; u += 997, n++) {
			float f = from_bits((uint32_t)u);

			if (eng_fp32_to_fp16(f) != f16c_from_f32(f) && !diff++)
				first = (uint32_t)u;
		}
		/* and all floats near the fp16 rounding points */
		for (uint32_t h = 0; h < 0x7c00; h++) {
			uint32_t c = bits_of(eng_fp16_to_fp32((uint16_t)h));

			for (int dd = -3; dd <= 3; dd++, n++) {
				uint32_t u = c + (uint32_t)dd * 0x1000;
				float f = from_bits(u);

				if (eng_fp32_to_fp16(f) != f16c_from_f32(f) && !diff++)
					first = u;
			}
		}
		check(!diff, "fp32->fp16 == F16C vcvtps2ph on %" PRIu64 " floats", n);
		if (diff)
			printf("  %" PRIu64 " differ, first 0x%08" PRIx32 "\n", diff, first);
	}

	check(eng_bf16_to_fp32(0x3f80) == 1.0f && isnan(eng_bf16_to_fp32(0x7fc1)),
	      "bf16->fp32 known values");
}

/* ---- (c) activation quantizers ---------------------------------------- */

static void fill_activations(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = rndf(-3.0f, 3.0f);
	/* some blocks of very different scale, and an all-zero one */
	for (size_t i = 0; i < n && i < 64; i++)
		x[i] *= 1e-3f;
	if (n >= 512)
		memset(x + 256, 0, 32 * sizeof(float));
}

static void test_q8_0_quant(const struct eng_kernels *k)
{
	enum { N = 1024 };
	float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
	struct eng_block_q8_0 *q = xmalloc(N / 32 * sizeof(*q));
	bool d_ok = true, close = true, range = true;

	fill_activations(x, N);
	k->from_float[ENG_TYPE_Q8_0](x, q, N);
	k->to_float[ENG_TYPE_Q8_0](q, y, N);
	for (int b = 0; b < N / 32; b++) {
		float amax = 0;

		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[b * 32 + j]));
		d_ok &= q[b].d == eng_fp32_to_fp16(amax / 127.0f);
		float d = eng_fp16_to_fp32(q[b].d);
		for (int j = 0; j < 32; j++) {
			range &= q[b].qs[j] >= -127;
			/* half a step, plus 127 times the fp16 rounding of d */
			close &= fabsf(x[b * 32 + j] - y[b * 32 + j]) <= 0.6f * d;
		}
	}
	check(d_ok, "%s: Q8_0 quantizer d == fp16(amax/127)", k->isa);
	check(range, "%s: Q8_0 quantizer stays in [-127, 127]", k->isa);
	check(close, "%s: Q8_0 dequantized within 0.6 d of the input", k->isa);

	/* amax 127 makes id 1: halves round to even, as ggml's x86 quantizer */
	static const float tie_in[8] = { 127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, -126.5f, 3.49f };
	static const int8_t tie_out[8] = { 127, 2, -2, 0, 0, 2, -126, 3 };
	float t[32] = { 0 };
	struct eng_block_q8_0 tb;

	memcpy(t, tie_in, sizeof(tie_in));
	k->from_float[ENG_TYPE_Q8_0](t, &tb, 32);
	check(tb.d == 0x3c00 && !memcmp(tb.qs, tie_out, 8), "%s: Q8_0 rounds halves to even",
	      k->isa);
	free(x);
	free(y);
	free(q);
}

static void test_q8_k_quant(const struct eng_kernels *k)
{
	enum { N = 1024 };
	float *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
	struct eng_block_q8_k *q = xmalloc(N / 256 * sizeof(*q));
	bool bsums = true, close = true, peak = true, zero = true;

	fill_activations(x, N);
	memset(x + 512, 0, 256 * sizeof(float)); /* block 2 all zero */
	k->from_float[ENG_TYPE_Q8_K](x, q, N);
	k->to_float[ENG_TYPE_Q8_K](q, y, N);
	for (int b = 0; b < N / 256; b++) {
		int imax = 0;

		for (int g = 0; g < 16; g++) {
			int s = 0;

			for (int j = 0; j < 16; j++)
				s += q[b].qs[g * 16 + j];
			bsums &= q[b].bsums[g] == s;
		}
		for (int j = 0; j < 256; j++) {
			if (fabsf(x[b * 256 + j]) > fabsf(x[b * 256 + imax]))
				imax = j;
			close &= fabsf(x[b * 256 + j] - y[b * 256 + j]) <=
				 0.5f * fabsf(q[b].d) * 1.0001f + 1e-30f;
		}
		if (b == 2)
			zero &= q[b].d == 0 && q[b].qs[0] == 0 && q[b].bsums[0] == 0;
		else
			peak &= q[b].qs[imax] == -127 && (q[b].d > 0) == (x[b * 256 + imax] < 0);
	}
	check(bsums, "%s: Q8_K bsums are the 16-element sums", k->isa);
	check(close, "%s: Q8_K dequantized within d/2 of the input", k->isa);
	check(peak, "%s: Q8_K largest element maps to -127, d has its opposite sign", k->isa);
	check(zero, "%s: Q8_K all-zero block gives d = 0, zero quants and bsums", k->isa);

	/* ties: the first of +-2 decides the sign; max -127 gives iscale 1 and
	 * nearest_int rounds halves to even */
	float t[256] = { 0 };
	struct eng_block_q8_k tb;

	t[3] = -2.0f;
	t[10] = 2.0f;
	k->from_float[ENG_TYPE_Q8_K](t, &tb, 256);
	check(tb.qs[3] == -127 && tb.qs[10] == 127 && tb.d == 1.0f / 63.5f,
	      "%s: Q8_K sign from the first largest element", k->isa);
	memset(t, 0, sizeof(t));
	t[0] = -127.0f;
	t[1] = 2.5f;
	t[2] = 3.5f;
	t[3] = -2.5f;
	t[4] = 126.5f;
	k->from_float[ENG_TYPE_Q8_K](t, &tb, 256);
	check(tb.d == 1.0f && tb.qs[0] == -127 && tb.qs[1] == 2 && tb.qs[2] == 4 &&
	      tb.qs[3] == -2 && tb.qs[4] == 126 && tb.bsums[0] == -127 + 2 + 4 - 2 + 126,
	      "%s: Q8_K rounds halves to even (ggml nearest_int)", k->isa);
	free(x);
	free(y);
	free(q);
}

/* ---- random rows ------------------------------------------------------ */

/*
 * A random row of type t and n elements: random bytes with every scale field
 * set to a small finite value (unit scales if unit, so that dot products are
 * small integers and exact).  Q8_K rows get consistent bsums.
 */
static void *rnd_row(uint32_t t, size_t n, bool unit)
{
	size_t bytes = eng_row_bytes(t, n);
	uint8_t *p = xmalloc(bytes);
	const eng_fp16_t one = 0x3c00;

	rnd_bytes(p, bytes);
	switch (t) {
	case ENG_TYPE_F32:
		for (size_t i = 0; i < n; i++)
			((float *)p)[i] = rndf(-1, 1);
		break;
	case ENG_TYPE_F16:
		for (size_t i = 0; i < n; i++)
			((eng_fp16_t *)p)[i] = eng_fp32_to_fp16(rndf(-1, 1));
		break;
	case ENG_TYPE_BF16:
		for (size_t i = 0; i < n; i++)
			((eng_bf16_t *)p)[i] = (eng_bf16_t)(bits_of(rndf(-1, 1)) >> 16);
		break;
	case ENG_TYPE_Q4_0:
		for (size_t i = 0; i < n / 32; i++)
			((struct eng_block_q4_0 *)p)[i].d = unit ? one : rnd_scale(0.01f, 0.1f, true);
		break;
	case ENG_TYPE_Q8_0:
		for (size_t i = 0; i < n / 32; i++)
			((struct eng_block_q8_0 *)p)[i].d = unit ? one : rnd_scale(0.001f, 0.05f, true);
		break;
	case ENG_TYPE_Q4_K:
		for (size_t i = 0; i < n / 256; i++) {
			struct eng_block_q4_k *b = (struct eng_block_q4_k *)p + i;

			b->d = unit ? one : rnd_scale(0.001f, 0.01f, true);
			b->dmin = unit ? one : rnd_scale(0.001f, 0.01f, false);
		}
		break;
	case ENG_TYPE_Q5_K:
		for (size_t i = 0; i < n / 256; i++) {
			struct eng_block_q5_k *b = (struct eng_block_q5_k *)p + i;

			b->d = unit ? one : rnd_scale(0.001f, 0.01f, true);
			b->dmin = unit ? one : rnd_scale(0.001f, 0.01f, false);
		}
		break;
	case ENG_TYPE_Q6_K:
		for (size_t i = 0; i < n / 256; i++)
			((struct eng_block_q6_k *)p)[i].d = unit ? one : rnd_scale(0.0005f, 0.005f, true);
		break;
	case ENG_TYPE_Q8_K:
		for (size_t i = 0; i < n / 256; i++) {
			struct eng_block_q8_k *b = (struct eng_block_q8_k *)p + i;

			b->d = unit ? 1.0f : rndf(-0.05f, 0.05f);
			for (int g = 0; g < 16; g++) {
				int s = 0;

				for (int j = 0; j < 16; j++)
					s += b->qs[g * 16 + j];
				b->bsums[g] = (int16_t)s;
			}
		}
		break;
	default:
		abort();
	}
	return p;
}

static const uint32_t weight_types[] = {
	ENG_TYPE_F32, ENG_TYPE_F16, ENG_TYPE_BF16, ENG_TYPE_Q4_0,
	ENG_TYPE_Q8_0, ENG_TYPE_Q4_K, ENG_TYPE_Q5_K, ENG_TYPE_Q6_K,
};
enum { N_WEIGHT_TYPES = sizeof(weight_types) / sizeof(weight_types[0]) };

static const size_t float_lens[] = { 1, 7, 8, 31, 33, 100, 4096, 4099 };
static const size_t q32_lens[] = { 32, 64, 96, 256, 4128 };
static const size_t qk_lens[] = { 256, 512, 2816, 4096 };

static const size_t *lens_for(uint32_t t, size_t *count)
{
	uint32_t blck = eng_type_info(t)->blck;

	if (blck == 1) {
		*count = sizeof(float_lens) / sizeof(float_lens[0]);
		return float_lens;
	}
	if (blck == 32) {
		*count = sizeof(q32_lens) / sizeof(q32_lens[0]);
		return q32_lens;
	}
	*count = sizeof(qk_lens) / sizeof(qk_lens[0]);
	return qk_lens;
}

/* ---- (d) reference dot products vs dequantized rows ------------------- */

static void test_ref_dots(const struct eng_kernels *k)
{
	for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
		uint32_t t = weight_types[ti], vt = eng_type_info(t)->vec_dot_type;
		size_t nl;
		const size_t *lens = lens_for(t, &nl);
		double worst = 0;

		for (size_t li = 0; li < nl; li++) {
			size_t n = lens[li];
			void *w = rnd_row(t, n, false);
			void *a = rnd_row(vt, n, false);
			float *wf = xmalloc(n * sizeof(float)), *af = xmalloc(n * sizeof(float));
			double want = 0, mag = 0;
			float got;

			k->to_float[t](w, wf, n);
			k->to_float[vt](a, af, n);
			for (size_t i = 0; i < n; i++) {
				want += (double)wf[i] * af[i];
				mag += fabs((double)wf[i] * af[i]);
			}
			k->vec_dot[t](n, &got, w, a);
			/* relative to sum |w_i a_i|: plain relative error is
			 * meaningless when the sum cancels */
			double err = fabs(got - want) / (mag > 0 ? mag : 1);
			if (err > worst)
				worst = err;
			free(w);
			free(a);
			free(wf);
			free(af);
		}
		check(worst < 1e-4, "%s: vec_dot %s x %s == sum of dequantized products (rel err %.2g)",
		      k->isa, type_name(t), type_name(vt), worst);
	}

	/* Q8_K activations made by the quantizer, not random bytes */
	for (int ti = 5; ti < N_WEIGHT_TYPES; ti++) {
		uint32_t t = weight_types[ti];
		size_t n = 2048;
		void *w = rnd_row(t, n, false);
		float *x = xmalloc(n * sizeof(float)), *wf = xmalloc(n * sizeof(float));
		struct eng_block_q8_k *a = xmalloc(n / 256 * sizeof(*a));
		double want = 0, mag = 0;
		float got;

		fill_activations(x, n);
		k->from_float[ENG_TYPE_Q8_K](x, a, n);
		k->to_float[ENG_TYPE_Q8_K](a, x, n);
		k->to_float[t](w, wf, n);
		for (size_t i = 0; i < n; i++) {
			want += (double)wf[i] * x[i];
			mag += fabs((double)wf[i] * x[i]);
		}
		k->vec_dot[t](n, &got, w, a);
		check(fabs(got - want) <= 1e-4 * mag,
		      "%s: vec_dot %s x quantized Q8_K activations (rel err %.2g)", k->isa,
		      type_name(t), fabs(got - want) / mag);
		free(w);
		free(x);
		free(wf);
		free(a);
	}
}

/* ---- (e) AVX2 vs reference -------------------------------------------- */

static void test_simd_vs_ref(const struct eng_kernels *s, const struct eng_kernels *r)
{
	for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
		uint32_t t = weight_types[ti], vt = eng_type_info(t)->vec_dot_type;
		size_t nl;
		const size_t *lens = lens_for(t, &nl);
		double worst = 0;
		bool exact = true;

		for (int rep = 0; rep < 4; rep++) {
			for (size_t li = 0; li < nl; li++) {
				size_t n = lens[li];
				void *w = rnd_row(t, n, false), *a = rnd_row(vt, n, false);
				float *wf = xmalloc(n * sizeof(float)), *af = xmalloc(n * sizeof(float));
				double mag = 0;
				float got, want;

				r->to_float[t](w, wf, n);
				r->to_float[vt](a, af, n);
				for (size_t i = 0; i < n; i++)
					mag += fabs((double)wf[i] * af[i]);
				s->vec_dot[t](n, &got, w, a);
				r->vec_dot[t](n, &want, w, a);
				double err = fabs((double)got - want) / (mag > 0 ? mag : 1);
				if (err > worst)
					worst = err;
				free(w);
				free(a);
				free(wf);
				free(af);
			}
		}
		check(worst < 1e-5, "%s: vec_dot %s matches %s (rel err %.2g)", s->isa,
		      type_name(t), r->isa, worst);

		if (eng_type_info(t)->blck == 1)
			continue;
		/* Unit scales: every term is an integer, the float sums are
		 * exact, so any difference is in the integer arithmetic
		 * (-128 activations, 6-bit scales, high bits...). */
		for (int rep = 0; rep < 200; rep++) {
			size_t n = eng_type_info(t)->blck * (1 + rep % 3);
			void *w = rnd_row(t, n, true), *a = rnd_row(vt, n, true);
			float got, want;

			s->vec_dot[t](n, &got, w, a);
			r->vec_dot[t](n, &want, w, a);
			if (got != want && exact) {
				printf("  %s: n %zu got %.1f want %.1f\n", type_name(t), n, got, want);
				exact = false;
			}
			free(w);
			free(a);
		}
		check(exact, "%s: vec_dot %s integer sums exact (unit scales, 200 rows)", s->isa,
		      type_name(t));
	}

	/* quantizers: identical bytes */
	for (int qt = 0; qt < 2; qt++) {
		uint32_t t = qt ? ENG_TYPE_Q8_K : ENG_TYPE_Q8_0;
		bool same = true;

		for (int rep = 0; rep < 50 && same; rep++) {
			size_t n = 4096;
			float *x = xmalloc(n * sizeof(float));
			size_t bytes = eng_row_bytes(t, n);
			uint8_t *qa = xmalloc(bytes), *qb = xmalloc(bytes);

			fill_activations(x, n);
			if (rep % 5 == 1) /* many exact ties */
				for (size_t i = 0; i < n; i++)
					x[i] = (float)((int)(rnd() % 255) - 127) * 0.5f;
			if (rep % 5 == 2) /* huge dynamic range, tiny values */
				for (size_t i = 0; i < n; i++)
					x[i] = ldexpf(rndf(-1, 1), (int)(rnd() % 200) - 140);
			if (rep % 5 == 3) /* repeated +-amax */
				for (size_t i = 0; i < n; i++)
					x[i] = (rnd() & 1) ? 1.0f : -1.0f;
			memset(qa, 0xaa, bytes);
			memset(qb, 0x55, bytes);
			s->from_float[t](x, qa, n);
			r->from_float[t](x, qb, n);
			if (memcmp(qa, qb, bytes)) {
				size_t i = 0;

				while (qa[i] == qb[i])
					i++;
				printf("  %s rep %d: byte %zu differs\n", type_name(t), rep, i);
				same = false;
			}
			free(x);
			free(qa);
			free(qb);
		}
		check(same, "%s: %s quantizer bytes identical to %s", s->isa, type_name(t), r->isa);
	}
}

/* ---- (f) type table ----------------------------------------------------- */

static void test_type_table(void)
{
	static const struct {
		uint32_t t;
		const char *name;
		uint32_t blck, bytes, vdt;
		bool sup;
	} want[] = {
		{ 0, "F32", 1, 4, 0, true },          { 1, "F16", 1, 2, 1, true },
		{ 2, "Q4_0", 32, 18, 8, true },       { 3, "Q4_1", 32, 20, 9, false },
		{ 6, "Q5_0", 32, 22, 8, false },      { 7, "Q5_1", 32, 24, 9, false },
		{ 8, "Q8_0", 32, 34, 8, true },       { 9, "Q8_1", 32, 36, 9, false },
		{ 10, "Q2_K", 256, 84, 15, false },   { 11, "Q3_K", 256, 110, 15, false },
		{ 12, "Q4_K", 256, 144, 15, true },   { 13, "Q5_K", 256, 176, 15, true },
		{ 14, "Q6_K", 256, 210, 15, true },   { 15, "Q8_K", 256, 292, 15, false },
		{ 30, "BF16", 1, 2, 30, true },        { 64, "Q4_0_R16", 32, 18, 8, true },
	};
	bool ok = true;
	int known = 0;

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct eng_type_info *ti = eng_type_info(want[i].t);

		if (!ti || strcmp(ti->name, want[i].name) || ti->blck != want[i].blck ||
		    ti->bytes != want[i].bytes || ti->vec_dot_type != want[i].vdt ||
		    ti->supported != want[i].sup) {
			printf("  type %" PRIu32 " (%s) wrong\n", want[i].t, want[i].name);
			ok = false;
		}
	}
	check(ok, "type table: names, block sizes, bytes, vec_dot_type, supported");

	for (uint32_t t = 0; t < ENG_TYPE_COUNT; t++)
		known += eng_type_info(t) != NULL;
	check(known == 16, "type table: exactly the 16 named types are known (%d)", known);
	check(eng_type_info(ENG_TYPE_Q4_0_R16)->row_group == 16 &&
	      eng_type_info(ENG_TYPE_Q4_0)->row_group == 1 &&
	      eng_type_info(ENG_TYPE_Q4_K)->row_group == 1,
	      "type table: Q4_0_R16 interleaves 16 rows, the ggml types none");
	check(!eng_type_info(4) && !eng_type_info(5) && !eng_type_info(16) && !eng_type_info(29) &&
	      !eng_type_info(31) && !eng_type_info(39) && !eng_type_info(40) &&
	      !eng_type_info(1000) && !eng_type_info(UINT32_MAX),
	      "type table: unknown values (4, 5, 16, 29, 31, 39, 40, 1000, 2^32-1) are NULL");

	check(eng_row_bytes(ENG_TYPE_F32, 10) == 40 && eng_row_bytes(ENG_TYPE_F16, 3) == 6 &&
	      eng_row_bytes(ENG_TYPE_BF16, 4096) == 8192 &&
	      eng_row_bytes(ENG_TYPE_Q4_0, 64) == 36 && eng_row_bytes(ENG_TYPE_Q8_0, 4096) == 4352 &&
	      eng_row_bytes(ENG_TYPE_Q4_K, 4096) == 16 * 144 &&
	      eng_row_bytes(ENG_TYPE_Q5_K, 256) == 176 && eng_row_bytes(ENG_TYPE_Q6_K, 512) == 420 &&
	      eng_row_bytes(ENG_TYPE_Q8_K, 256) == 292 && eng_row_bytes(ENG_TYPE_Q3_K, 256) == 110 &&
	      eng_row_bytes(ENG_TYPE_Q4_1, 32) == 20 && eng_row_bytes(ENG_TYPE_F32, 0) == 0,
	      "eng_row_bytes of whole blocks");
	check(!eng_row_bytes(ENG_TYPE_Q4_0, 33) && !eng_row_bytes(ENG_TYPE_Q4_K, 128) &&
	      !eng_row_bytes(ENG_TYPE_Q8_K, 257),
	      "eng_row_bytes is 0 for partial blocks");
	check(!eng_row_bytes(4, 32) && !eng_row_bytes(39, 32) && !eng_row_bytes(1000, 1) &&
	      !eng_row_bytes(ENG_TYPE_COUNT, 1),
	      "eng_row_bytes is 0 for unknown types");
	check(!eng_row_bytes(ENG_TYPE_F32, UINT64_MAX / 2) &&
	      !eng_row_bytes(ENG_TYPE_Q8_0, (UINT64_MAX / 32) * 32),
	      "eng_row_bytes is 0 when the size overflows");
}

static void test_tables(const struct eng_kernels *k)
{
	bool ok = true;

	for (uint32_t t = 0; t < ENG_TYPE_COUNT; t++) {
		const struct eng_type_info *ti = eng_type_info(t);
		bool sup = ti && ti->supported;
		bool grouped = ti && ti->row_group > 1;

		/* supported weights: to_float and vec_dot (interleaved rows:
		 * vec_dot16 and neither), and their activation type must have
		 * from_float and to_float */
		if (sup && !grouped && (!k->to_float[t] || !k->vec_dot[t]))
			ok = false;
		if (sup && grouped && (!k->vec_dot16[t] || k->vec_dot[t] || k->to_float[t]))
			ok = false;
		if (sup && (!k->from_float[ti->vec_dot_type] || !k->to_float[ti->vec_dot_type]))
			ok = false;
		if (!sup && k->vec_dot[t])
			ok = false;
		if (!ti && (k->to_float[t] || k->from_float[t]))
			ok = false;
	}
	ok &= k->to_float[ENG_TYPE_Q8_K] && k->from_float[ENG_TYPE_Q8_K];
	check(ok, "%s: kernel table has exactly the kernels the type table promises", k->isa);
}

/*
 * The distance between token rows of n elements for weight type t: room for
 * the vec_dot_type row or its pack8 copy, whichever is longer, in whole
 * cache lines, as the engine's rows of activations are (forward.c,
 * qact_stride): a packed row may be an odd number of bytes long.
 */
static size_t token_stride(const struct eng_kernels *k, uint32_t t, size_t n)
{
	size_t ab = eng_row_bytes(eng_type_info(t)->vec_dot_type, n);
	size_t pb = k->pack8[t] && ENG_PACK8_BYTES(n) > ab ? ENG_PACK8_BYTES(n) : ab;

	return (pb + 63) & ~(size_t)63;
}

/*
 * nt activation rows of n elements for weight type t, pb bytes apart, in a:
 * quantized from random floats (x: n floats of scratch), every other one raw
 * blocks with any byte (-128 too, which a quantizer never makes); and the
 * same through the set's pack8 in p, where it has one.
 */
static void token_rows(const struct eng_kernels *k, uint32_t t, size_t n, unsigned nt,
		       uint8_t *a, uint8_t *p, size_t pb, float *x)
{
	uint32_t vt = eng_type_info(t)->vec_dot_type;
	size_t ab = eng_row_bytes(vt, n);

	for (unsigned tk = 0; tk < nt; tk++) {
		void *raw = rnd_row(vt, n, false);

		fill_activations(x, n);
		if (tk % 2)
			memcpy(a + tk * pb, raw, ab);
		else
			k->from_float[vt](x, a + tk * pb, n);
		free(raw);
		if (k->pack8[t])
			k->pack8[t](a + tk * pb, p + tk * pb, n);
	}
}

/*
 * vec_dot8 (vec_dot16) must give, for each of its 8 (16) rows, exactly what
 * vec_dot gives for that row (the logits tests depend on the per-row float
 * order).  Rows are strided as in a weight matrix, with random data and
 * random scales; the activations go through pack8 where the set has one.
 * Q4_0_R16 is checked against Q4_0's vec_dot on the rows it interleaves.
 */
static void test_multirow(const struct eng_kernels *k, uint32_t t, unsigned nrows,
			  unsigned max_nt, eng_vec_dot8_fn fn, const char *name)
{
	static const size_t lens[] = { 32, 64, 256, 4096, 4160, 14336, 33024 };
	const bool r16 = t == ENG_TYPE_Q4_0_R16;
	const uint32_t rt = r16 ? ENG_TYPE_Q4_0 : t; /* the type of a row */

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t n = lens[li], rb = eng_row_bytes(rt, n);

		if (!rb) /* not a whole number of blocks (K-quants) */
			continue;
		size_t pb = token_stride(k, t, n);
		uint8_t *w = xmalloc(rb * nrows), *a = xmalloc(pb * max_nt);
		uint8_t *wi = r16 ? xmalloc(rb * nrows) : w; /* what fn reads */
		uint8_t *p = xmalloc(pb * max_nt);
		float *x = xmalloc(n * sizeof(float));
		float (*got)[17] = xmalloc(max_nt * sizeof(*got)), want;
		bool same = true;

		for (unsigned r = 0; r < nrows; r++) {
			void *row = rnd_row(rt, n, false);

			memcpy(w + r * rb, row, rb);
			free(row);
		}
		if (r16)
			eng_q4_0_to_r16(w, rb, n, wi);
		token_rows(k, t, n, max_nt, a, p, pb, x);
		for (unsigned nt = 1; nt <= max_nt; nt++) {
			fn(n, nt, &got[0][0], 17, wi, rb, k->pack8[t] ? p : a, pb);
			for (unsigned tk = 0; tk < nt; tk++)
				for (unsigned r = 0; r < nrows; r++) {
					k->vec_dot[rt](n, &want, w + r * rb, a + tk * pb);
					same &= bits_of(got[tk][r]) == bits_of(want);
				}
		}
		check(same, "%s %s is bit-identical to vec_dot per row and token, "
		      "n=%zu, 1 to %u tokens (%s%s)", type_name(t), name, n, max_nt, k->isa,
		      k->pack8[t] ? ", packed" : "");
		if (r16)
			free(wi);
		free(w);
		free(x);
		free(a);
		free(p);
		free(got);
	}
}

/*
 * vec_dotn the same way, with row counts that are not multiples of 8 or 16
 * and more rows than a call keeps accumulators for at sixteen tokens (the
 * avx512 prompt kernels: 64), by 1 to ENG_DOT16_NT tokens (some of them:
 * each count is its own pass over every row).
 */
static void test_dotn(const struct eng_kernels *k, uint32_t t)
{
	static const size_t lens[] = { 32, 256, 4096, 4160, 14336, 33024 };
	static const unsigned rows[] = { 1, 7, 16, 37, 150 };
	static const unsigned nts[] = { 1, 2, 3, 8, 15, 16, 17, 31, 33, ENG_DOT16_NT };
	const unsigned max_nt = ENG_DOT16_NT, max_rows = 150;

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t n = lens[li], rb = eng_row_bytes(t, n);

		if (!rb)
			continue;
		size_t pb = token_stride(k, t, n);
		uint8_t *w = xmalloc(rb * max_rows), *a = xmalloc(pb * max_nt);
		uint8_t *p = xmalloc(pb * max_nt);
		float *x = xmalloc(n * sizeof(float));
		float *got = xmalloc((size_t)max_nt * (max_rows + 1) * sizeof(float)), want;
		bool same = true;

		for (unsigned r = 0; r < max_rows; r++) {
			void *row = rnd_row(t, n, false);

			memcpy(w + r * rb, row, rb);
			free(row);
		}
		token_rows(k, t, n, max_nt, a, p, pb, x);
		for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++)
			for (size_t ni = 0; ni < sizeof(nts) / sizeof(nts[0]); ni++) {
				const unsigned nr = rows[ri], nt = nts[ni];

				/* a stride of one more than the rows, as a matmul's
				 * chunk writes into the middle of its output */
				k->vec_dotn[t](n, nr, nt, got, max_rows + 1, w, rb,
					       k->pack8[t] ? p : a, pb);
				for (unsigned tk = 0; tk < nt; tk++)
					for (unsigned r = 0; r < nr; r++) {
						k->vec_dot[t](n, &want, w + r * rb, a + tk * pb);
						same &= bits_of(got[tk * (max_rows + 1) + r]) ==
							bits_of(want);
					}
			}
		check(same, "%s vec_dotn is bit-identical to vec_dot per row and token, "
		      "n=%zu, 1 to %u rows, 1 to %u tokens (%s%s)", type_name(t), n, max_rows,
		      max_nt, k->isa, k->pack8[t] ? ", packed" : "");
		free(w);
		free(x);
		free(a);
		free(p);
		free(got);
	}
}

static void test_vec_dot8(const struct eng_kernels *k)
{
	for (uint32_t t = 0; t < ENG_TYPE_COUNT; t++) {
		if (k->vec_dotn[t])
			test_dotn(k, t);
		if (k->vec_dot8[t])
			test_multirow(k, t, 8, ENG_DOT8_NT, k->vec_dot8[t], "vec_dot8");
		if (k->vec_dot16[t])
			test_multirow(k, t, 16, ENG_DOT16_NT, k->vec_dot16[t], "vec_dot16");
	}
}

/*
 * A set built on another (avx512 on avx2) may replace its kernels only with
 * ones that give the same bits: the logits tests hold the float order fixed.
 * Random rows and scales, activations from the quantizer and raw (any byte).
 */
static void test_same_bits(const struct eng_kernels *s, const struct eng_kernels *b)
{
	for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
		uint32_t t = weight_types[ti], vt = eng_type_info(t)->vec_dot_type;
		size_t nl;
		const size_t *lens = lens_for(t, &nl);
		bool same = true;

		if (s->vec_dot[t] == b->vec_dot[t])
			continue;
		/* vdpbf16ps adds in an order of its own: against the reference
		 * instead (test_simd_vs_ref) */
		if (t == ENG_TYPE_BF16)
			continue;
		for (int rep = 0; rep < 8; rep++) {
			for (size_t li = 0; li < nl; li++) {
				size_t n = lens[li];
				void *w = rnd_row(t, n, false), *a = rnd_row(vt, n, false);
				float got, want;

				if (rep % 2 && vt != ENG_TYPE_F32) {
					float *x = xmalloc(n * sizeof(float));

					fill_activations(x, n);
					b->from_float[vt](x, a, n);
					free(x);
				}
				s->vec_dot[t](n, &got, w, a);
				b->vec_dot[t](n, &want, w, a);
				same &= bits_of(got) == bits_of(want);
				free(w);
				free(a);
			}
		}
		check(same, "%s: vec_dot %s bit-identical to %s's", s->isa, type_name(t), b->isa);
	}
}

int main(void)
{
	const struct eng_kernels *ref = eng_kernels_ref();
	const struct eng_kernels *avx2 = eng_kernels_avx2();
	const struct eng_kernels *best = eng_kernels_get();
	const char *isa = getenv("STRATA_ISA");
	const struct eng_kernels *sets[2] = { ref, avx2 };

	printf("# kernel sets: ref %s, avx2 %s, chosen %s (STRATA_ISA=%s)\n", ref->isa,
	       avx2 ? avx2->isa : "unavailable", best->isa, isa ? isa : "");

	test_type_table();
	test_fp16();
	{
		const struct eng_kernels *all[4] = { ref, avx2, eng_kernels_avx512(),
						     eng_kernels_avx512bf16() };

		test_bf16(all, 4);
	}
	test_layout_r16();
	for (int i = 0; i < 2; i++) {
		const struct eng_kernels *k = sets[i];

		if (!k)
			continue;
		test_tables(k);
		test_layout_q4_0(k);
		test_layout_q8_0(k);
		test_layout_q4_k(k);
		test_layout_q5_k(k);
		test_layout_q6_k(k);
		test_layout_q8_k(k);
		test_layout_float(k);
		test_q8_0_quant(k);
		test_q8_k_quant(k);
	}
	test_ref_dots(ref);
	test_vec_dot8(ref); /* its only one: Q4_0_R16's vec_dot16 */
	if (avx2) {
		test_ref_dots(avx2);
		test_simd_vs_ref(avx2, ref);
		test_vec_dot8(avx2);
		if (eng_kernels_avx512bf16()) {
			test_ref_dots(eng_kernels_avx512bf16());
			test_simd_vs_ref(eng_kernels_avx512bf16(), ref);
			test_same_bits(eng_kernels_avx512bf16(), avx2);
		} else {
			printf("skip - avx512bf16 kernels: the CPU lacks AVX-512 BF16\n");
		}
		if (eng_kernels_avx512()) {
			test_same_bits(eng_kernels_avx512(), avx2);
			test_vec_dot8(eng_kernels_avx512());
			/* what a VNNI CPU without VBMI runs */
			test_same_bits(eng_kernels_avx512_novbmi(), avx2);
			test_vec_dot8(eng_kernels_avx512_novbmi());
		}
		else
			printf("skip - avx512 vec_dot8: the CPU lacks AVX-512 VNNI\n");
	} else {
		printf("skip - avx2 kernels vs reference: eng_kernels_avx2() is NULL "
		       "(CPU lacks AVX2/FMA/F16C)\n");
	}

	check(eng_kernels_get() == best, "eng_kernels_get is stable");
	if (isa && !strcmp(isa, "scalar"))
		check(best == ref, "STRATA_ISA=scalar selects the scalar set");
	else if (isa && !strcmp(isa, "avx2"))
		check(best == (avx2 ? avx2 : ref), "STRATA_ISA=avx2 selects %s",
		      avx2 ? "avx2" : "scalar (no AVX2)");
	else if (isa && !strcmp(isa, "avx512bf16") && eng_kernels_avx512bf16())
		check(best == eng_kernels_avx512bf16(), "STRATA_ISA=avx512bf16 selects it");
	else {
		const struct eng_kernels *want = eng_kernels_avx512() ? eng_kernels_avx512()
					       : avx2 ? avx2 : ref;

		check(best == want, "default / STRATA_ISA=%s selects the best set, %s",
		      isa ? isa : "", want->isa);
	}

	printf("%s: %d failure%s\n", failures ? "FAIL" : "PASS", failures,
	       failures == 1 ? "" : "s");
	return failures ? 1 : 0;
}
