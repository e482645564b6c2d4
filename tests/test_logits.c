/*
 * test_logits.c - every fixture model against the reference engine's logits.
 *
 * For each fixtures/[SET/]ref/NAME.json: feed prompt_tokens then
 * greedy_tokens (teacher forcing) and compare every row of logits with
 * NAME.logits.f16.  A row passes when max |ours - ref| <= tol * sigma(ref
 * row), tol being 0.02 for float models and, for quantized ones, 0.15 (or
 * what -q says: the arch set's references come from a newer release, whose
 * own K-quant noise is up to 0.15); the argmax must agree on at least 95% of
 * rows, and on every row that chose one of the 16 greedy tokens unless the
 * reference's own top two are closer than 0.02 sigma there (-g GAP).  The rows are fed
 * in batches and, separately, one token at a time: both must pass.
 *
 * usage: test_logits [-d SET] [-q TOL] [-g GAP] [-b BATCH] [-K TYPE -V TYPE [-t TOL] [-G N]]
 *                    [NAME ...]
 *        (default: every model under ref/; SET: a subdirectory of fixtures,
 *        e.g. arch, with its own models/ and ref/; BATCH: tokens per forward
 *        pass, small to make sliding-window layers wrap their rings)
 *
 * With -K/-V (KV cache types q8_0, q4_0, f16) the reference is the same
 * model run with an f16 cache: every row, batched and one at a time, must be
 * within TOL (-t, default 0.05) sigma of that run's, and the first N (-G,
 * default 16) of the 16 greedy tokens generated from the prompt with the
 * quantized cache must be the f16 cache's.
 * STRATA_TEST_VERBOSE=1 prints every row's error.  STRATA_TEST_FLOAT_TOL
 * replaces the float models' 0.02 (only for the avx512bf16 kernels, whose
 * summation order differs from the reference's; see quant_avx512.c).
 */
#include "engine.h"
#include "quant.h"

#include <dirent.h>
#include <getopt.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf) {
		buf[n] = '\0';
		if (len)
			*len = (size_t)n;
	}
	return buf;
}

/* The fixture JSON is flat and machine-written: find "key": and read. */
static const char *json_find(const char *js, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	p = strstr(js, pat);
	if (!p)
		return NULL;
	p = strchr(p + strlen(pat), ':');
	return p ? p + 1 : NULL;
}

static long json_int(const char *js, const char *key)
{
	const char *p = json_find(js, key);

	return p ? strtol(p, NULL, 10) : -1;
}

static void json_str(const char *js, const char *key, char *out, size_t outlen)
{
	const char *p = json_find(js, key);
	const char *q;

	out[0] = '\0';
	if (!p || !(p = strchr(p, '"')) || !(q = strchr(p + 1, '"')))
		return;
	snprintf(out, outlen, "%.*s", (int)(q - p - 1), p + 1);
}

static size_t json_int_array(const char *js, const char *key, int32_t *out, size_t max)
{
	const char *p = json_find(js, key);
	size_t n = 0;

	if (!p || !(p = strchr(p, '[')))
		return 0;
	p++;
	while (n < max) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p)
			break;
		out[n++] = (int32_t)v;
		p = end;
		while (*p == ',' || *p == ' ' || *p == '\n')
			p++;
		if (*p == ']')
			break;
	}
	return n;
}

static bool is_float_model(const struct eng_hparams *hp, const char *name)
{
	(void)hp;
	return strstr(name, "f16") || strstr(name, "f32") || strstr(name, "bf16") ||
	       strstr(name, "stories260K");
}

/* Compare n_rows rows; returns number of failures and prints a summary. */
static int compare(const char *label, const float *ours, const eng_fp16_t *ref, size_t rows,
		   uint32_t n_vocab, double tol, double gap, const int32_t *greedy,
		   size_t n_prompt)
{
	size_t argmax_same = 0, greedy_close = 0;
	double worst = 0;
	size_t worst_row = 0;
	int fails = 0;

	for (size_t r = 0; r < rows; r++) {
		const float *o = ours + r * n_vocab;
		const eng_fp16_t *f = ref + r * n_vocab;
		double mean = 0, var = 0, maxd = 0;
		uint32_t am_ref = 0, am_ours = 0;
		float top1 = -INFINITY, top2 = -INFINITY;

		for (uint32_t i = 0; i < n_vocab; i++)
			mean += eng_fp16_to_fp32(f[i]);
		mean /= n_vocab;
		for (uint32_t i = 0; i < n_vocab; i++) {
			double rv = eng_fp16_to_fp32(f[i]), d = fabs(o[i] - rv);

			var += (rv - mean) * (rv - mean);
			if (!(d <= maxd))
				maxd = d; /* NaN counts as the worst difference */
			if (rv > eng_fp16_to_fp32(f[am_ref]))
				am_ref = i;
			if (rv > top1) {
				top2 = top1;
				top1 = (float)rv;
			} else if (rv > top2) {
				top2 = (float)rv;
			}
			if (o[i] > o[am_ours])
				am_ours = i;
		}
		double sigma = sqrt(var / n_vocab), rel = maxd / sigma;

		if (getenv("STRATA_TEST_VERBOSE"))
			printf("    %s row %zu: %.4f sigma, argmax %u vs ref %u\n", label, r, rel,
			       am_ours, am_ref);

		if (!(rel <= worst) || isnan(rel)) {
			worst = isnan(rel) ? INFINITY : rel;
			worst_row = r;
		}
		if (!(rel <= tol)) {
			if (fails < 3)
				printf("  %s row %zu: max diff %.4f = %.3f sigma (limit %.2f)\n", label,
				       r, maxd, rel, tol);
			fails++;
		}
		argmax_same += am_ref == am_ours;
		/* greedy_tokens[k] is the reference argmax of row n_prompt-1+k */
		if (r + 1 >= n_prompt && r + 1 - n_prompt < 16 &&
		    (int32_t)am_ref != greedy[r + 1 - n_prompt])
			printf("  note: ref argmax of row %zu is %u, greedy token says %d\n", r, am_ref,
			       greedy[r + 1 - n_prompt]);
		/* the greedy tokens themselves: identical, but where the
		 * reference could as well have chosen another */
		if (r + 1 >= n_prompt && r + 1 - n_prompt < 16 &&
		    (int32_t)am_ours != greedy[r + 1 - n_prompt]) {
			if ((top1 - top2) / sigma >= gap) {
				printf("  %s row %zu: argmax %u, the reference chose %d (top-2 gap "
				       "%.3f sigma)\n", label, r, am_ours, greedy[r + 1 - n_prompt],
				       (top1 - top2) / sigma);
				fails++;
			} else {
				greedy_close++;
			}
		}
	}
	printf("  %s: worst row %zu at %.4f sigma (limit %.2f), argmax agrees on %zu/%zu rows"
	       "%s\n", label, worst_row, worst, tol, argmax_same, rows,
	       greedy_close ? " (a greedy token differs where the reference's top two are "
			      "that close)" : "");
	if (argmax_same * 100 < rows * 95) {
		printf("  %s: argmax agreement below 95%%\n", label);
		fails++;
	}
	return fails;
}

struct cache_cmp {
	bool on;
	enum eng_kv_type tk, tv;
	double tol;
	uint32_t n_batch;
	unsigned greedy; /* greedy tokens that must agree */
};

/* Row by row: max |a - b| / sigma(b); the worst into *worst, failures out. */
static int compare_rows(const char *label, const float *a, const float *b, size_t rows,
			uint32_t n_vocab, double tol, double *worst)
{
	int fails = 0;

	for (size_t r = 0; r < rows; r++) {
		const float *x = a + r * n_vocab, *y = b + r * n_vocab;
		double mean = 0, var = 0, maxd = 0;

		for (uint32_t i = 0; i < n_vocab; i++)
			mean += y[i];
		mean /= n_vocab;
		for (uint32_t i = 0; i < n_vocab; i++) {
			double d = fabs((double)x[i] - y[i]);

			var += (y[i] - mean) * (y[i] - mean);
			if (!(d <= maxd))
				maxd = d;
		}
		double rel = maxd / sqrt(var / n_vocab);

		if (!(rel <= *worst))
			*worst = isnan(rel) ? INFINITY : rel;
		if (!(rel <= tol)) {
			if (fails < 3)
				printf("  %s row %zu: %.4f sigma from the f16 cache's (limit %.2f)\n",
				       label, r, rel, tol);
			fails++;
		}
	}
	return fails;
}

/* The gap between the top two logits of a row, in sigmas of the row. */
static double top2_gap(const float *x, uint32_t n)
{
	double mean = 0, var = 0;
	float t1 = -INFINITY, t2 = -INFINITY;

	for (uint32_t i = 0; i < n; i++)
		mean += x[i];
	mean /= n;
	for (uint32_t i = 0; i < n; i++) {
		var += (x[i] - mean) * (x[i] - mean);
		if (x[i] > t1) {
			t2 = t1;
			t1 = x[i];
		} else if (x[i] > t2) {
			t2 = x[i];
		}
	}
	return (t1 - t2) / sqrt(var / n);
}

/* n greedy tokens after the prompt, free-running; gap[i]: the top-2 gap
 * of the row that chose out[i]. */
static int greedy_run(struct eng_ctx *c, const int32_t *prompt, size_t n_prompt, uint32_t n_vocab,
		      float *logits, int32_t *out, double *gap, size_t n)
{
	eng_ctx_reset(c);
	if (eng_decode(c, prompt, n_prompt, logits, false))
		return -1;
	for (size_t i = 0; i < n; i++) {
		out[i] = eng_argmax(logits, n_vocab);
		gap[i] = top2_gap(logits, n_vocab);
		if (eng_decode(c, &out[i], 1, logits, false))
			return -1;
	}
	return 0;
}

/* The model with cache types cc against itself with an f16 cache. */
static int run_cache(const char *name, const struct eng_model *m, const int32_t *toks,
		     size_t n_tok, size_t n_prompt, uint32_t n_vocab, const struct cache_cmp *cc,
		     double gap)
{
	struct eng_ctx *c16 = NULL, *cq = NULL;
	struct eng_ctx_config cfg = { .n_ctx = 256, .n_batch = cc->n_batch };
	float *base = malloc(n_tok * n_vocab * sizeof(float));
	float *batch = malloc(n_tok * n_vocab * sizeof(float));
	float *single = malloc(n_tok * n_vocab * sizeof(float));
	int32_t g16[16], gq[16];
	double gap16[16], gapq[16];
	bool tie = false;
	char err[256];
	double worst = 0;
	int fails = 0;
	size_t need = cc->greedy, same = 0;

	if (!base || !batch || !single || eng_ctx_create(m, &cfg, &c16, err, sizeof(err))) {
		printf("FAIL %s: f16 context: %s\n", name, err);
		fails++;
		goto out;
	}
	cfg.type_k = cc->tk;
	cfg.type_v = cc->tv;
	if (eng_ctx_create(m, &cfg, &cq, err, sizeof(err))) {
		printf("FAIL %s: %s\n", name, err);
		fails++;
		goto out;
	}
	if (eng_decode(c16, toks, n_tok, base, true) || eng_decode(cq, toks, n_tok, batch, true)) {
		printf("FAIL %s: batched decode failed\n", name);
		fails++;
		goto out;
	}
	eng_ctx_reset(cq);
	for (size_t i = 0; i < n_tok; i++)
		if (eng_decode(cq, &toks[i], 1, single + i * n_vocab, false)) {
			printf("FAIL %s: decode of token %zu failed\n", name, i);
			fails++;
			goto out;
		}
	fails += compare_rows("batched", batch, base, n_tok, n_vocab, cc->tol, &worst);
	fails += compare_rows("one at a time", single, base, n_tok, n_vocab, cc->tol, &worst);
	if (greedy_run(c16, toks, n_prompt, n_vocab, base, g16, gap16, 16) ||
	    greedy_run(cq, toks, n_prompt, n_vocab, batch, gq, gapq, 16)) {
		printf("FAIL %s: greedy generation failed\n", name);
		fails++;
		goto out;
	}
	while (same < 16 && g16[same] == gq[same])
		same++;
	/* a near tie in the f16 run may go either way (as in the reference
	 * comparison); the texts part there, and the rest is not compared */
	tie = same < 16 && gap16[same] < gap;
	if (same < need && !tie) {
		printf("  greedy token %zu: %d with the f16 cache, %d with %s/%s\n", same, g16[same],
		       gq[same], eng_kv_type_name(cc->tk), eng_kv_type_name(cc->tv));
		fails++;
	}
	printf("%s %s: K %s V %s, %zu rows, worst %.4f sigma from the f16 cache (limit %.2f), "
	       "%zu/16 greedy tokens the same%s, KV %llu bytes vs %llu\n",
	       fails ? "FAIL" : "ok", name, eng_kv_type_name(cc->tk), eng_kv_type_name(cc->tv),
	       n_tok, worst, cc->tol, same,
	       tie ? " (then a near tie in the f16 run)" : "",
	       (unsigned long long)eng_ctx_kv_bytes(cq), (unsigned long long)eng_ctx_kv_bytes(c16));
	if (tie)
		printf("  greedy token %zu: top two of the f16 run %.4f sigma apart (under %.2f)\n",
		       same, gap16[same], gap);
out:
	eng_ctx_destroy(c16);
	eng_ctx_destroy(cq);
	free(base);
	free(batch);
	free(single);
	return fails;
}

static int run_one(const char *fix, const char *name, double qtol, double gap,
		   const struct cache_cmp *cc)
{
	char path[1024], model_file[256], logits_file[256];
	char *js;
	int32_t toks[4096], greedy[64];
	size_t n_prompt, n_greedy, n_tok, ref_len = 0;
	long n_vocab, rows;
	const void *base;
	size_t size;
	struct eng_model *m = NULL;
	struct eng_ctx *c = NULL;
	char err[256];
	eng_fp16_t *ref = NULL;
	float *batch = NULL, *single = NULL;
	int fails = 0;

	snprintf(path, sizeof(path), "%s/ref/%s.json", fix, name);
	js = slurp(path, NULL);
	if (!js) {
		printf("FAIL %s: cannot read %s\n", name, path);
		return 1;
	}
	json_str(js, "model", model_file, sizeof(model_file));
	json_str(js, "logits_file", logits_file, sizeof(logits_file));
	n_vocab = json_int(js, "n_vocab");
	rows = json_int(js, "rows");
	n_prompt = json_int_array(js, "prompt_tokens", toks, 2048);
	n_greedy = json_int_array(js, "greedy_tokens", greedy, 64);
	for (size_t i = 0; i < n_greedy; i++)
		toks[n_prompt + i] = greedy[i];
	n_tok = n_prompt + n_greedy;
	free(js);
	if (n_vocab <= 0 || (size_t)rows != n_tok) {
		printf("FAIL %s: reference JSON has %ld rows for %zu tokens\n", name, rows, n_tok);
		return 1;
	}

	snprintf(path, sizeof(path), "%s/ref/%s", fix, logits_file);
	ref = (eng_fp16_t *)slurp(path, &ref_len);
	if (!ref || ref_len != (size_t)rows * n_vocab * 2) {
		printf("FAIL %s: %s is missing or not %ld x %ld f16\n", name, path, rows, n_vocab);
		fails++;
		goto out;
	}
	snprintf(path, sizeof(path), "%s/models/%s", fix, model_file);
	if (eng_map_file(path, &base, &size)) {
		printf("FAIL %s: cannot map %s\n", name, path);
		fails++;
		goto out;
	}
	if (eng_model_load(base, size, &m, err, sizeof(err)) ||
	    eng_ctx_create(m, &(struct eng_ctx_config){ .n_ctx = 256, .n_batch = cc->n_batch }, &c,
			   err, sizeof(err))) {
		printf("FAIL %s: %s\n", name, err);
		fails++;
		goto out_unmap;
	}
	if (eng_model_hparams(m)->n_vocab != (uint32_t)n_vocab) {
		printf("FAIL %s: model has %u tokens, reference %ld\n", name,
		       eng_model_hparams(m)->n_vocab, n_vocab);
		fails++;
		goto out_unmap;
	}
	if (cc->on) {
		fails += run_cache(name, m, toks, n_tok, n_prompt, (uint32_t)n_vocab, cc, gap);
		goto out_unmap;
	}
	batch = malloc(n_tok * n_vocab * sizeof(float));
	single = malloc(n_tok * n_vocab * sizeof(float));
	if (!batch || !single || eng_decode(c, toks, n_tok, batch, true)) {
		printf("FAIL %s: batched decode failed\n", name);
		fails++;
		goto out_unmap;
	}
	eng_ctx_reset(c);
	for (size_t i = 0; i < n_tok; i++) {
		if (eng_decode(c, &toks[i], 1, single + i * n_vocab, false)) {
			printf("FAIL %s: decode of token %zu failed\n", name, i);
			fails++;
			goto out_unmap;
		}
	}
	double ftol = getenv("STRATA_TEST_FLOAT_TOL") ? atof(getenv("STRATA_TEST_FLOAT_TOL")) : 0.02;
	double tol = is_float_model(eng_model_hparams(m), name) ? ftol : qtol;
	printf("%s (%s, %zu rows, tol %.2f sigma):\n", name, eng_model_hparams(m)->arch_name, n_tok,
	       tol);
	fails += compare("batched", batch, ref, n_tok, (uint32_t)n_vocab, tol, gap, greedy,
			 n_prompt);
	fails += compare("one at a time", single, ref, n_tok, (uint32_t)n_vocab, tol, gap, greedy,
			 n_prompt);
	printf("%s %s\n", fails ? "FAIL" : "ok", name);
out_unmap:
	eng_ctx_destroy(c);
	eng_model_destroy(m);
	eng_unmap_file(base, size);
out:
	free(batch);
	free(single);
	free(ref);
	return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *env = getenv("STRATA_FIXTURES");
	const char *set = NULL;
	char fix[1024], dir[1100];
	double qtol = 0.15, gap = 0.02;
	struct cache_cmp cc = { .tol = 0.05, .greedy = 16 };
	int failed = 0, ran = 0, opt;

	while ((opt = getopt(argc, argv, "d:q:g:b:K:V:t:G:")) != -1) {
		if (opt == 'K' || opt == 'V') {
			if (eng_kv_type_parse(optarg, opt == 'K' ? &cc.tk : &cc.tv)) {
				fprintf(stderr, "test_logits: unknown cache type '%s'\n", optarg);
				return 2;
			}
			cc.on = true;
		} else if (opt == 'G') {
			cc.greedy = (unsigned)atoi(optarg);
			cc.greedy = cc.greedy > 16 ? 16 : cc.greedy;
		} else if (opt == 't') {
			cc.tol = atof(optarg);
		} else if (opt == 'b') {
			cc.n_batch = (uint32_t)atoi(optarg);
		} else if (opt == 'd') {
			set = optarg;
		} else if (opt == 'q') {
			qtol = atof(optarg);
		} else if (opt == 'g') {
			gap = atof(optarg);
		} else {
			fprintf(stderr, "usage: test_logits [-d SET] [-q TOL] [-g GAP] [-b BATCH] "
				"[-K TYPE -V TYPE [-t TOL] [-G N]] [NAME ...]\n");
			return 2;
		}
	}
	snprintf(fix, sizeof(fix), "%s%s%s", env ? env : "../shared/fixtures", set ? "/" : "",
		 set ? set : "");
	snprintf(dir, sizeof(dir), "%s/ref", fix);
	if (optind < argc) {
		for (int i = optind; i < argc; i++, ran++)
			failed += run_one(fix, argv[i], qtol, gap, &cc);
	} else {
		DIR *d = opendir(dir);
		struct dirent *e;

		if (!d) {
			printf("SKIP: no fixtures at %s (set STRATA_FIXTURES)\n", dir);
			return 77;
		}
		while ((e = readdir(d))) {
			size_t l = strlen(e->d_name);
			char name[256];

			if (l < 6 || strcmp(e->d_name + l - 5, ".json"))
				continue;
			snprintf(name, sizeof(name), "%.*s", (int)(l - 5), e->d_name);
			failed += run_one(fix, name, qtol, gap, &cc);
			ran++;
		}
		closedir(d);
	}
	printf("%d of %d models match the reference\n", ran - failed, ran);
	return failed || !ran ? 1 : 0;
}
