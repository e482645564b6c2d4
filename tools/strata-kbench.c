/*
 * strata-kbench.c - one matrix kernel on one core, in GMAC/s.
 *
 *   strata-kbench [--isa SET] [--type TYPE] [--tokens NT] [--cols N]
 *                 [--rows ROWS] [--reps R]
 *
 * Times ROWS weight rows of N columns of TYPE (random bytes, sane scales)
 * by NT quantized activation rows, the way matmul.c drives a kernel set:
 * matmul's chunks of rows through vec_dotn (up to ENG_DOT16_NT tokens a
 * call) where the set has one (eng_chunk_rows, quant.h), else tiles of 16
 * rows through vec_dot16 (up to ENG_DOT16_NT tokens) where it has one, else
 * of 8 through vec_dot8 (up to ENG_DOT8_NT), else row by row.  Prints the
 * best of R passes and their median, that also in GB/s of weights read:
 * from memory one core's rate follows the memory's speed, which on a shared
 * machine changes between passes, so the median says more there, the best
 * from cache.  Defaults: the avx512 set, Q4_K, 64 tokens, 4096 columns, 512
 * rows (about 1 MB of Q4_K: from L2), 5 passes.  Pin it (taskset -c 1) and
 * run it under the benchmark lock.
 * SET is scalar, avx2, avx512 or avx512-novbmi; TYPE is Q4_0, Q4_0_R16, Q8_0,
 * Q4_K, Q5_K or Q6_K.  The weights are on 2 MiB pages where the kernel gives
 * them (hwbench_huge_alloc).  Exit status 2 for a bad argument or a set this CPU lacks.
 */
#include "hwbench.h"
#include "quant.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *xalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);

	if (!p) {
		fprintf(stderr, "strata-kbench: out of memory\n");
		exit(1);
	}
	return p;
}

static int usage(const char *why)
{
	fprintf(stderr, "strata-kbench: %s\nusage: strata-kbench [--isa SET] [--type TYPE] "
		"[--tokens NT] [--cols N] [--rows ROWS] [--reps R]\n", why);
	return 2;
}

/* A positive number of at most max, or 0. */
static unsigned long number(const char *s, unsigned long max)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	return *s && !*end && v <= max ? v : 0;
}

/* Random bytes, then every fp16 scale of the row set to 1/64 (a random
 * fp16 could be a NaN or infinity, which would time differently). */
static void fill_weights(uint32_t type, uint8_t *w, size_t bytes)
{
	const struct eng_type_info *ti = eng_type_info(type);
	uint32_t s = 12345;
	size_t off = type == ENG_TYPE_Q6_K ? 208 : 0; /* where d lies in a block */

	for (size_t i = 0; i < bytes; i++) {
		s = s * 1664525u + 1013904223u;
		w[i] = (uint8_t)(s >> 24);
	}
	for (size_t b = 0; b + ti->bytes <= bytes; b += ti->bytes) {
		const eng_fp16_t d = eng_fp32_to_fp16(1.0f / 64);

		memcpy(w + b + off, &d, sizeof(d));
		if (type == ENG_TYPE_Q4_K || type == ENG_TYPE_Q5_K) /* dmin */
			memcpy(w + b + 2, &d, sizeof(d));
	}
}

int main(int argc, char **argv)
{
	const char *isa = "avx512", *tname = "Q4_K";
	unsigned long nt = 64, n = 4096, rows = 512, reps = 5;

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			return usage("an option without its value");
		if (!strcmp(argv[i], "--isa"))
			isa = v;
		else if (!strcmp(argv[i], "--type"))
			tname = v;
		else if (!strcmp(argv[i], "--tokens"))
			nt = number(v, 4096);
		else if (!strcmp(argv[i], "--cols"))
			n = number(v, 1ul << 20);
		else if (!strcmp(argv[i], "--rows"))
			rows = number(v, 1ul << 20);
		else if (!strcmp(argv[i], "--reps"))
			reps = number(v, 1000);
		else
			return usage("unknown option");
		i++;
	}
	if (!nt || !n || !rows || !reps)
		return usage("--tokens, --cols, --rows and --reps take a positive number");

	const struct eng_kernels *k = !strcmp(isa, "scalar")	    ? eng_kernels_ref()
				      : !strcmp(isa, "avx2")	    ? eng_kernels_avx2()
				      : !strcmp(isa, "avx512")	    ? eng_kernels_avx512()
				      : !strcmp(isa, "avx512-novbmi") ? eng_kernels_avx512_novbmi()
								    : NULL;
	uint32_t type = ENG_TYPE_COUNT;

	for (uint32_t t = 0; t < ENG_TYPE_COUNT; t++) {
		const struct eng_type_info *ti = eng_type_info(t);

		if (ti && ti->supported && (ti->row_group == 1 || t == ENG_TYPE_Q4_0_R16) &&
		    !strcmp(ti->name, tname))
			type = t;
	}
	if (!k)
		return usage("no such kernel set on this CPU");
	if (type == ENG_TYPE_COUNT || type == ENG_TYPE_F32 || type == ENG_TYPE_F16 ||
	    type == ENG_TYPE_BF16)
		return usage("the type is not one of Q4_0, Q4_0_R16, Q8_0, Q4_K, Q5_K, Q6_K");
	rows = (rows + 15) / 16 * 16;

	const struct eng_type_info *ti = eng_type_info(type);
	const uint32_t vt = ti->vec_dot_type;
	const size_t rb = eng_row_bytes(type, n), ab = eng_row_bytes(vt, n);

	if (!rb)
		return usage("--cols is not a whole number of the type's blocks");

	/* activation rows as matmul.c lays them: each row, then its pack8'ed
	 * copy on its own cache lines */
	const size_t off = k->pack8[type] ? (ab + 63) & ~(size_t)63 : 0;
	const size_t stride = (off + (k->pack8[type] ? ENG_PACK8_BYTES(n) : ab) + 63) & ~(size_t)63;
	uint8_t *w = hwbench_huge_alloc(rb * rows), *a = xalloc(stride * nt);
	float *x = xalloc(n * sizeof(float)), *out = xalloc(nt * rows * sizeof(float));
	double *dts = xalloc(reps * sizeof(double));
	uint32_t s = 777;

	if (!w) {
		fprintf(stderr, "strata-kbench: out of memory\n");
		return 1;
	}
	if (type == ENG_TYPE_Q4_0_R16) {
		/* Q4_0 rows, interleaved by 16 as strata-repack writes them */
		uint8_t *q = xalloc(rb * rows);

		fill_weights(ENG_TYPE_Q4_0, q, rb * rows);
		for (unsigned long r = 0; r < rows; r += 16)
			eng_q4_0_to_r16(q + r * rb, rb, n, w + r * rb);
		free(q);
	} else {
		fill_weights(type, w, rb * rows);
	}
	for (unsigned long t = 0; t < nt; t++) {
		for (unsigned long i = 0; i < n; i++) {
			s = s * 1664525u + 1013904223u;
			x[i] = (float)((int)(s >> 16) % 2001 - 1000) / 100.0f;
		}
		k->from_float[vt](x, a + t * stride, n);
		if (k->pack8[type])
			k->pack8[type](a + t * stride, a + t * stride + off, n);
	}
	/* vec_dotn takes matmul.c's chunks; the others tiles of 16 rows */
	const unsigned long step = k->vec_dotn[type] ? eng_chunk_rows(rb, (uint32_t)nt) : 16;

	for (unsigned long rep = 0; rep < reps; rep++) {
		const double t0 = now();

		for (unsigned long r = 0; r < rows; r += step) {
			if (k->vec_dotn[type]) {
				const unsigned long nr = rows - r < step ? rows - r : step;

				for (unsigned long b = 0; b < nt; b += ENG_DOT16_NT)
					k->vec_dotn[type](n, (unsigned)nr,
							  nt - b < ENG_DOT16_NT ? nt - b : ENG_DOT16_NT,
							  out + b * rows + r, rows, w + r * rb, rb,
							  a + b * stride + off, stride);
			} else if (k->vec_dot16[type]) {
				for (unsigned long b = 0; b < nt; b += ENG_DOT16_NT)
					k->vec_dot16[type](n, nt - b < ENG_DOT16_NT ? nt - b : ENG_DOT16_NT,
							   out + b * rows + r, rows, w + r * rb, rb,
							   a + b * stride + off, stride);
			} else if (k->vec_dot8[type]) {
				for (unsigned h = 0; h < 16; h += 8)
					for (unsigned long b = 0; b < nt; b += ENG_DOT8_NT)
						k->vec_dot8[type](n,
								  nt - b < ENG_DOT8_NT ? nt - b : ENG_DOT8_NT,
								  out + b * rows + r + h, rows,
								  w + (r + h) * rb, rb,
								  a + b * stride + off, stride);
			} else {
				for (unsigned long b = 0; b < nt; b++)
					for (unsigned long i = r; i < r + 16; i++)
						k->vec_dot[type](n, out + b * rows + i, w + i * rb,
								 a + b * stride);
			}
		}
		dts[rep] = now() - t0;
	}
	const double macs = (double)rows * (double)n * (double)nt;
	const double median = hwbench_median(dts, reps); /* sorted: dts[0] the best */

	printf("%s %s: %lu rows x %lu cols x %lu tokens: %.1f GMAC/s (best of %lu), median %.1f "
	       "(%.1f GB/s of weights)\n",
	       k->isa, ti->name, rows, n, nt, macs / dts[0] / 1e9, reps, macs / median / 1e9,
	       (double)rb * (double)rows / median / 1e9);
	free(dts);
	hwbench_huge_free(w, rb * rows);
	free(a);
	free(x);
	free(out);
	return 0;
}
