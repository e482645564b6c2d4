/*
 * test_tokenizer.c - the tokenizer against llama.cpp's test vectors, plus
 * decoding, invalid UTF-8 and hostile metadata.
 *
 * 1. Golden: every fixtures/vocab/X.gguf with X.gguf.inp/.out is loaded and
 *    each input tokenized without BOS; the ids must equal the expected line.
 *    The .inp file is split exactly as llama.cpp's test-tokenizer-0 does: on
 *    "\n__ggml_vocab_test__\n", the text after the last separator being one
 *    more input only if it is not empty.  WordPiece (bert) must be refused by
 *    name.
 * 2. Round trip: for SPM and GPT-2 vocabularies, the pieces of the ids of
 *    every ASCII input concatenate back to the input (SPM: plus the space it
 *    puts in front).
 * 3. Robustness: random bytes (mostly invalid UTF-8) through every vocabulary
 *    must tokenize, the same way twice.
 * 4. Hostile metadata: small GGUF images built in memory, each with one
 *    defect, must be refused with -EINVAL (or -ENOTSUP) and a message.
 *
 * Exits 77 when the fixtures are not there, 1 on any failure.
 */
#include "check.h"
#include "gguf.h"
#include "tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- files ------------------------------------------------------------ */

struct mapped {
	void *p;
	size_t n;
};

static int map_file(const char *path, struct mapped *m)
{
	struct stat st;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) || st.st_size == 0) {
		close(fd);
		return -EINVAL;
	}
	m->n = (size_t)st.st_size;
	m->p = mmap(NULL, m->n, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	return m->p == MAP_FAILED ? -errno : 0;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0, r;

	if (!f)
		return NULL;
	do {
		if (n + 4096 + 1 > cap) {
			char *q = realloc(buf, cap = (n + 4096 + 1) * 2);

			if (!q) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = q;
		}
		r = fread(buf + n, 1, 4096, f);
		n += r;
	} while (r > 0);
	fclose(f);
	buf[n] = '\0';
	*len = n;
	return buf;
}

/* ---- printing --------------------------------------------------------- */

static void print_escaped(const char *s, size_t n)
{
	putchar('"');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '\n')
			printf("\\n");
		else if (c == '\t')
			printf("\\t");
		else if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			printf("\\x%02x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void print_ids(const int32_t *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		printf(i ? " %d" : "%d", v[i]);
}

/* ---- golden vectors --------------------------------------------------- */

struct tcase {
	const char *in;
	size_t in_len;
	int32_t *want;
	size_t n_want;
};

/* Parse one .out line: ids separated by spaces, surrounding blanks ignored. */
static int parse_ids(const char *s, size_t n, int32_t **v, size_t *nv)
{
	size_t cap = 0;

	*v = NULL;
	*nv = 0;
	for (size_t i = 0; i < n;) {
		char *end;
		long x;

		if (s[i] == ' ' || s[i] == '\r' || s[i] == '\t') {
			i++;
			continue;
		}
		x = strtol(s + i, &end, 10);
		if (end == s + i)
			return -EINVAL;
		if (*nv == cap) {
			int32_t *q = realloc(*v, (cap = cap ? cap * 2 : 16) * sizeof(**v));

			if (!q)
				return -ENOMEM;
			*v = q;
		}
		(*v)[(*nv)++] = (int32_t)x;
		i = (size_t)(end - s);
	}
	return 0;
}

/* test-tokenizer-0's read_tests(): split on the separator; text after the
 * last one counts only if non-empty. */
static size_t split_inputs(char *raw, size_t n, struct tcase **cases)
{
	static const char sep[] = "\n__ggml_vocab_test__\n";
	const size_t sn = sizeof(sep) - 1;
	size_t pos = 0, k = 0, cap = 0;

	*cases = NULL;
	while (pos < n) {
		char *next = memmem(raw + pos, n - pos, sep, sn);
		size_t end = next ? (size_t)(next - raw) : n;

		if (k == cap) {
			struct tcase *q = realloc(*cases, (cap = cap ? cap * 2 : 64) * sizeof(**cases));

			if (!q)
				break;
			*cases = q;
		}
		(*cases)[k].in = raw + pos;
		(*cases)[k].in_len = end - pos;
		(*cases)[k].want = NULL;
		(*cases)[k].n_want = 0;
		k++;
		if (!next)
			break;
		pos = end + sn;
	}
	return k;
}

static bool is_ascii(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] >= 0x80)
			return false;
	return true;
}

/* Concatenated pieces of ids; returns malloc'd text and its length. */
static char *detokenize(const struct eng_tokenizer *t, const int32_t *ids, size_t n, size_t *len)
{
	size_t cap = 64, k = 0;
	char *out = malloc(cap);

	for (size_t i = 0; out && i < n; i++) {
		int r = eng_token_to_piece(t, ids[i], out + k, cap - k);

		if (r < 0) {
			free(out);
			return NULL;
		}
		if ((size_t)r >= cap - k) {
			char *q = realloc(out, cap = (k + (size_t)r + 1) * 2);

			if (!q) {
				free(out);
				return NULL;
			}
			out = q;
			r = eng_token_to_piece(t, ids[i], out + k, cap - k);
		}
		k += (size_t)r;
	}
	*len = k;
	return out;
}

static uint64_t rng_state = 0x70c3e1a2b5d49f01ull;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Random bytes, biased towards UTF-8 lead/continuation bytes and spaces. */
static void random_text(char *buf, size_t n)
{
	static const char pool[] = " \n\t'aZ09.!~\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x81\x80\xbf\xc0"
				   "\xe0\xf5\xff\xed\xa0";

	for (size_t i = 0; i < n; i++)
		buf[i] = rnd() % 3 ? pool[rnd() % (sizeof(pool) - 1)] : (char)rnd();
}

static void fuzz_vocab(const char *name, const struct eng_tokenizer *t)
{
	char buf[200];

	for (int it = 0; it < 200; it++) {
		size_t n = rnd() % sizeof(buf);
		int32_t *a = NULL, *b = NULL;
		size_t na = 0, nb = 0;
		int ra, rb;

		random_text(buf, n);
		ra = eng_tokenize(t, buf, n, true, &a, &na);
		rb = eng_tokenize(t, buf, n, true, &b, &nb);
		CHECK(ra == 0 && rb == 0, "%s: random input %d refused (%d)", name, it, ra);
		CHECK(na == nb && (!na || !memcmp(a, b, na * sizeof(*a))),
		      "%s: random input %d tokenized two ways", name, it);
		for (size_t i = 0; i < na; i++) {
			char piece[8];

			CHECK(a[i] >= 0 && (uint32_t)a[i] < eng_tokenizer_n_vocab(t) &&
				      eng_token_to_piece(t, a[i], piece, sizeof(piece)) >= 0,
			      "%s: random input %d gave id %d", name, it, a[i]);
		}
		free(a);
		free(b);
	}
}

static void run_vocab(const char *dir, const char *gguf_name)
{
	char path[4096], err[256];
	struct mapped m = { NULL, 0 };
	struct gguf *g = NULL;
	struct eng_tokenizer *t = NULL;
	struct tcase *cases = NULL;
	char *inp = NULL, *outf = NULL;
	size_t inp_n, out_n, n_cases, n_lines = 0;
	bool is_bert = strstr(gguf_name, "bert") != NULL;
	bool spm, roundtrip;
	double t0;
	int rc, bad = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, gguf_name);
	rc = map_file(path, &m);
	if (rc) {
		CHECK(0, "%s: cannot map (%d)", gguf_name, rc);
		return;
	}
	rc = gguf_parse(m.p, m.n, &g, err, sizeof(err));
	if (rc) {
		CHECK(0, "%s: gguf_parse: %s", gguf_name, err);
		goto out;
	}
	t0 = now_ms();
	rc = eng_tokenizer_create(g, &t, err, sizeof(err));
	if (is_bert) {
		CHECK(rc == -ENOTSUP && strstr(err, "'bert'"),
		      "%s: want refusal naming 'bert', got %d '%s'", gguf_name, rc, err);
		if (rc == -ENOTSUP && strstr(err, "'bert'"))
			printf("ok %s refused: %s\n", gguf_name, err);
		goto out;
	}
	if (rc) {
		CHECK(0, "%s: eng_tokenizer_create: %s", gguf_name, err);
		goto out;
	}
	printf("   %s: %u tokens, created in %.1f ms\n", gguf_name, eng_tokenizer_n_vocab(t),
	       now_ms() - t0);

	snprintf(path, sizeof(path), "%s/%s.inp", dir, gguf_name);
	inp = slurp(path, &inp_n);
	snprintf(path, sizeof(path), "%s/%s.out", dir, gguf_name);
	outf = slurp(path, &out_n);
	if (!inp || !outf) {
		CHECK(0, "%s: cannot read the .inp/.out files", gguf_name);
		goto out;
	}
	n_cases = split_inputs(inp, inp_n, &cases);
	for (size_t pos = 0; pos < out_n && n_lines < n_cases; n_lines++) {
		char *nl = memchr(outf + pos, '\n', out_n - pos);
		size_t end = nl ? (size_t)(nl - outf) : out_n;

		if (parse_ids(outf + pos, end - pos, &cases[n_lines].want, &cases[n_lines].n_want)) {
			CHECK(0, "%s: bad line %zu in .out", gguf_name, n_lines + 1);
			goto out;
		}
		pos = end + 1;
	}
	if (n_lines != n_cases) {
		CHECK(0, "%s: %zu inputs but %zu expected lines", gguf_name, n_cases, n_lines);
		goto out;
	}

	spm = strstr(gguf_name, "llama-spm") || strstr(gguf_name, "phi-3");
	roundtrip = spm || strstr(gguf_name, "gpt-2");
	for (size_t i = 0; i < n_cases; i++) {
		int32_t *ids = NULL;
		size_t n = 0;

		rc = eng_tokenize(t, cases[i].in, cases[i].in_len, false, &ids, &n);
		if (rc || n != cases[i].n_want ||
		    (n && memcmp(ids, cases[i].want, n * sizeof(*ids)))) {
			if (!bad++) {
				printf("FAIL %s case %zu: input ", gguf_name, i);
				print_escaped(cases[i].in, cases[i].in_len);
				printf("\n  expected: ");
				print_ids(cases[i].want, cases[i].n_want);
				printf("\n  got:      ");
				if (rc)
					printf("error %d", rc);
				else
					print_ids(ids, n);
				printf("\n");
			}
		} else if (roundtrip && is_ascii(cases[i].in, cases[i].in_len)) {
			size_t dn = 0;
			char *d = detokenize(t, ids, n, &dn);
			/* SPM decodes the space it put in front */
			size_t skip = spm && cases[i].in_len ? 1 : 0;

			CHECK(d && dn == cases[i].in_len + skip && (!skip || d[0] == ' ') &&
				      !memcmp(d + skip, cases[i].in, cases[i].in_len),
			      "%s case %zu: pieces do not give the input back", gguf_name, i);
			free(d);
		}
		free(ids);
	}
	if (bad) {
		failures++;
		printf("FAIL %s: %d of %zu cases differ\n", gguf_name, bad, n_cases);
	} else {
		printf("ok %s (%zu cases)\n", gguf_name, n_cases);
	}
	fuzz_vocab(gguf_name, t);

out:
	for (size_t i = 0; cases && i < n_lines; i++)
		free(cases[i].want);
	free(cases);
	free(inp);
	free(outf);
	eng_tokenizer_destroy(t);
	gguf_destroy(g);
	munmap(m.p, m.n);
}

/* ---- a small GGUF writer for hostile images --------------------------- */

struct gw {
	uint8_t *buf;
	size_t n, cap;
	uint64_t n_kv;
};

static void gw_bytes(struct gw *w, const void *p, size_t n)
{
	if (w->n + n > w->cap) {
		size_t cap = (w->n + n) * 2 + 256;
		uint8_t *q = realloc(w->buf, cap);

		if (!q) {
			fprintf(stderr, "out of memory\n");
			exit(1);
		}
		w->buf = q;
		w->cap = cap;
	}
	memcpy(w->buf + w->n, p, n);
	w->n += n;
}

static void gw_u32(struct gw *w, uint32_t v)
{
	gw_bytes(w, &v, 4);
}

static void gw_u64(struct gw *w, uint64_t v)
{
	gw_bytes(w, &v, 8);
}

static void gw_str(struct gw *w, const char *s)
{
	gw_u64(w, strlen(s));
	gw_bytes(w, s, strlen(s));
}

static void gw_key(struct gw *w, const char *key, enum gguf_vtype type)
{
	gw_str(w, key);
	gw_u32(w, type);
	w->n_kv++;
}

static void kv_str(struct gw *w, const char *key, const char *v)
{
	gw_key(w, key, GGUF_VT_STRING);
	gw_str(w, v);
}

static void kv_u32(struct gw *w, const char *key, uint32_t v)
{
	gw_key(w, key, GGUF_VT_U32);
	gw_u32(w, v);
}

static void kv_strs(struct gw *w, const char *key, const char *const *v, size_t n)
{
	gw_key(w, key, GGUF_VT_ARRAY);
	gw_u32(w, GGUF_VT_STRING);
	gw_u64(w, n);
	for (size_t i = 0; i < n; i++)
		gw_str(w, v[i]);
}

static void kv_i32s(struct gw *w, const char *key, const int32_t *v, size_t n)
{
	gw_key(w, key, GGUF_VT_ARRAY);
	gw_u32(w, GGUF_VT_I32);
	gw_u64(w, n);
	gw_bytes(w, v, n * 4);
}

static void kv_f32s(struct gw *w, const char *key, const float *v, size_t n)
{
	gw_key(w, key, GGUF_VT_ARRAY);
	gw_u32(w, GGUF_VT_F32);
	gw_u64(w, n);
	gw_bytes(w, v, n * 4);
}

/* Header in front of the key-values, padded to the default alignment. */
static uint8_t *gw_finish(struct gw *w, size_t *n)
{
	struct gw out = { 0 };
	static const uint8_t zero[32];

	gw_u32(&out, GGUF_MAGIC);
	gw_u32(&out, 3);
	gw_u64(&out, 0);
	gw_u64(&out, w->n_kv);
	gw_bytes(&out, w->buf, w->n);
	gw_bytes(&out, zero, (32 - out.n % 32) % 32);
	free(w->buf);
	*n = out.n;
	return out.buf;
}

enum defect {
	D_NONE,
	D_MODEL_MISSING,
	D_MODEL_INT,
	D_MODEL_BERT,
	D_TOKENS_MISSING,
	D_TOKENS_INT,
	D_TOKENS_EMPTY,
	D_TOKENS_DUP,
	D_SCORES_SHORT,
	D_SCORES_STRING,
	D_TYPES_SHORT,
	D_TYPE_WEIRD,
	D_BOS_RANGE,
	D_EOS_STRING,
	D_MERGES_MISSING,
	D_MERGE_NO_SPACE,
	D_MERGES_INT,
	D_PRE_UNKNOWN,
	D_ADD_BOS_NO_BOS,
};

/* A tiny SPM vocabulary: <unk> <s> </s>, 256 byte tokens, then a few pieces. */
#define SPM_EXTRA 6
static const char *const spm_extra[SPM_EXTRA] = {
	"\u2581", "a", "b", "\u2581a", "ab", "\u2581ab",
};
static const float spm_extra_score[SPM_EXTRA] = { -1, -2, -2, -3, -4, -1 };

/* A tiny byte-level BPE vocabulary (U+0120 is GPT-2's space). */
static const char *const bpe_tokens[] = {
	"a", "b", "c", "\u0120", "ab", "\u0120a", "\u0120ab", "<|endoftext|>",
};
static const char *const bpe_merges[] = { "\u0120 a", "\u0120a b", "a b" };
#define N_BPE (sizeof(bpe_tokens) / sizeof(bpe_tokens[0]))

static uint8_t *build_spm(enum defect d, size_t *n)
{
	struct gw w = { 0 };
	const char *tok[3 + 256 + SPM_EXTRA];
	char bytes[256][7];
	float score[3 + 256 + SPM_EXTRA] = { 0 };
	int32_t type[3 + 256 + SPM_EXTRA];
	size_t nt = 3 + 256 + SPM_EXTRA;

	tok[0] = "<unk>";
	tok[1] = "<s>";
	tok[2] = "</s>";
	type[0] = 2;
	type[1] = type[2] = 3;
	for (int b = 0; b < 256; b++) {
		snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
		tok[3 + b] = bytes[b];
		type[3 + b] = 6;
	}
	for (int i = 0; i < SPM_EXTRA; i++) {
		tok[259 + i] = spm_extra[i];
		score[259 + i] = spm_extra_score[i];
		type[259 + i] = 1;
	}
	if (d == D_TOKENS_DUP)
		tok[262] = "a";
	if (d == D_TYPE_WEIRD)
		type[5] = 99;

	if (d == D_MODEL_INT)
		kv_u32(&w, "tokenizer.ggml.model", 1);
	else if (d == D_MODEL_BERT)
		kv_str(&w, "tokenizer.ggml.model", "bert");
	else if (d != D_MODEL_MISSING)
		kv_str(&w, "tokenizer.ggml.model", "llama");
	if (d == D_TOKENS_INT)
		kv_i32s(&w, "tokenizer.ggml.tokens", type, nt);
	else if (d == D_TOKENS_EMPTY)
		kv_strs(&w, "tokenizer.ggml.tokens", tok, 0);
	else if (d != D_TOKENS_MISSING)
		kv_strs(&w, "tokenizer.ggml.tokens", tok, nt);
	if (d == D_SCORES_STRING)
		kv_strs(&w, "tokenizer.ggml.scores", tok, nt);
	else
		kv_f32s(&w, "tokenizer.ggml.scores", score, d == D_SCORES_SHORT ? nt - 1 : nt);
	kv_i32s(&w, "tokenizer.ggml.token_type", type, d == D_TYPES_SHORT ? 10 : nt);
	kv_u32(&w, "tokenizer.ggml.bos_token_id", d == D_BOS_RANGE ? (uint32_t)nt : 1);
	if (d == D_EOS_STRING)
		kv_str(&w, "tokenizer.ggml.eos_token_id", "2");
	else
		kv_u32(&w, "tokenizer.ggml.eos_token_id", 2);
	return gw_finish(&w, n);
}

static uint8_t *build_bpe(enum defect d, const char *pre, size_t *n)
{
	struct gw w = { 0 };
	const char *merges[3] = { bpe_merges[0], bpe_merges[1], bpe_merges[2] };
	int32_t type[N_BPE];

	for (size_t i = 0; i < N_BPE; i++)
		type[i] = 1;
	type[N_BPE - 1] = 3;
	if (d == D_MERGE_NO_SPACE)
		merges[1] = "ab";
	kv_str(&w, "tokenizer.ggml.model", "gpt2");
	kv_str(&w, "tokenizer.ggml.pre", d == D_PRE_UNKNOWN ? "no-such-pre" : pre ? pre : "gpt-2");
	kv_strs(&w, "tokenizer.ggml.tokens", bpe_tokens, N_BPE);
	kv_i32s(&w, "tokenizer.ggml.token_type", type, N_BPE);
	if (d == D_MERGES_INT)
		kv_i32s(&w, "tokenizer.ggml.merges", type, 3);
	else if (d != D_MERGES_MISSING)
		kv_strs(&w, "tokenizer.ggml.merges", merges, 3);
	kv_u32(&w, "tokenizer.ggml.eos_token_id", N_BPE - 1);
	if (d == D_ADD_BOS_NO_BOS) {
		gw_key(&w, "tokenizer.ggml.add_bos_token", GGUF_VT_BOOL);
		gw_bytes(&w, "\1", 1);
	} else {
		kv_u32(&w, "tokenizer.ggml.bos_token_id", N_BPE - 1);
	}
	return gw_finish(&w, n);
}

/* Parse an image and create a tokenizer from it; *t only on success. */
static int try_create(uint8_t *img, size_t n, struct gguf **g, struct eng_tokenizer **t,
		      char *err, size_t errlen)
{
	int rc = gguf_parse(img, n, g, err, errlen);

	*t = NULL;
	if (rc) {
		printf("   (image refused by gguf_parse: %s)\n", err);
		return rc;
	}
	return eng_tokenizer_create(*g, t, err, errlen);
}

static void expect_ids(const struct eng_tokenizer *t, const char *text, bool bos,
		       const int32_t *want, size_t n_want)
{
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = eng_tokenize(t, text, strlen(text), bos, &ids, &n);

	CHECK(rc == 0 && n == n_want && (!n || !memcmp(ids, want, n * sizeof(*ids))),
	      "tokenize '%s': rc %d, %zu ids", text, rc, n);
	free(ids);
}

/* One tokenizer.ggml.pre value for each kind of pre-tokenizer. */
static const char *const pre_names[] = {
	"default",	"llama-bpe",	"dbrx",		"chatglm-bpe",	"jais-2",
	"deepseek-llm",	"deepseek-v3",	"spark2_5",	"youtu",	"deepseek-coder",
	"falcon",	"refact",	"mpt",		"qwen2",	"qwen35",
	"bloom",	"viking",	"tekken",	"chameleon",	"gpt-4o",
	"granite-embed-multi-97m", "tiny_aya", "superbpe", "bailingmoe", "seed-coder",
	"ufakzeka",	"laguna",	"exaone-moe",	"minicpm5",
};

static void test_small_vocabs(void)
{
	static const struct {
		bool bpe;
		enum defect d;
		int rc;
	} hostile[] = {
		{ false, D_MODEL_MISSING, -EINVAL },  { false, D_MODEL_INT, -EINVAL },
		{ false, D_MODEL_BERT, -ENOTSUP },    { false, D_TOKENS_MISSING, -EINVAL },
		{ false, D_TOKENS_INT, -EINVAL },     { false, D_TOKENS_EMPTY, -EINVAL },
		{ false, D_TOKENS_DUP, -EINVAL },     { false, D_SCORES_SHORT, -EINVAL },
		{ false, D_SCORES_STRING, -EINVAL },  { false, D_TYPES_SHORT, -EINVAL },
		{ false, D_TYPE_WEIRD, -EINVAL },     { false, D_BOS_RANGE, -EINVAL },
		{ false, D_EOS_STRING, -EINVAL },     { true, D_MERGES_MISSING, -EINVAL },
		{ true, D_MERGE_NO_SPACE, -EINVAL },  { true, D_MERGES_INT, -EINVAL },
		{ true, D_PRE_UNKNOWN, -ENOTSUP },    { true, D_ADD_BOS_NO_BOS, -EINVAL },
	};
	char err[256], piece[16];
	struct gguf *g;
	struct eng_tokenizer *t;
	uint8_t *img;
	size_t n;
	int rc, np = 0, failures_before = failures;

	/* the good images work */
	img = build_spm(D_NONE, &n);
	rc = try_create(img, n, &g, &t, err, sizeof(err));
	CHECK(rc == 0, "tiny SPM vocabulary refused: %s", err);
	if (!rc) {
		/* " ab" -> "\u2581ab" (one token); bytes fall back to <0xNN> */
		expect_ids(t, "ab", true, (const int32_t[]){ 1, 264 }, 2);
		expect_ids(t, "ab b", false, (const int32_t[]){ 264, 259, 261 }, 3);
		expect_ids(t, "c\n", false, (const int32_t[]){ 259, 3 + 'c', 3 + '\n' }, 3);
		expect_ids(t, "", true, (const int32_t[]){ 1 }, 1);
		CHECK(eng_tokenizer_adds_bos(t) && eng_tokenizer_bos(t) == 1 &&
			      eng_tokenizer_eos(t) == 2 && eng_tokenizer_is_eog(t, 2) &&
			      !eng_tokenizer_is_eog(t, 1),
		      "tiny SPM special tokens");
		CHECK(eng_token_to_piece(t, 264, piece, sizeof(piece)) == 3 && !strcmp(piece, " ab"),
		      "piece of \\u2581ab");
		CHECK(eng_token_to_piece(t, 3 + 'x', piece, sizeof(piece)) == 1 && piece[0] == 'x',
		      "piece of <0x78>");
		CHECK(eng_token_to_piece(t, 1, piece, sizeof(piece)) == 0, "piece of <s>");
		CHECK(eng_token_to_piece(t, 264, piece, 2) == 3 && piece[0] == ' ' &&
			      piece[1] == 'a',
		      "truncated piece");
		CHECK(eng_token_to_piece(t, 100000, piece, sizeof(piece)) == -EINVAL &&
			      eng_token_to_piece(t, -1, piece, sizeof(piece)) == -EINVAL,
		      "piece of an id out of range");
		np++;
	}
	eng_tokenizer_destroy(t);
	gguf_destroy(g);
	free(img);

	img = build_bpe(D_NONE, NULL, &n);
	rc = try_create(img, n, &g, &t, err, sizeof(err));
	CHECK(rc == 0, "tiny BPE vocabulary refused: %s", err);
	if (!rc) {
		expect_ids(t, "ab ab c", true, (const int32_t[]){ 4, 6, 3, 2 }, 4);
		/* no tokens for these bytes: dropped, as llama.cpp does */
		expect_ids(t, "a\xff", false, (const int32_t[]){ 0 }, 1);
		CHECK(!eng_tokenizer_adds_bos(t) && eng_tokenizer_is_eog(t, N_BPE - 1),
		      "tiny BPE special tokens");
		CHECK(eng_token_to_piece(t, 6, piece, sizeof(piece)) == 3 && !strcmp(piece, " ab"),
		      "piece of \\u0120ab");
		np++;
	}
	eng_tokenizer_destroy(t);
	gguf_destroy(g);
	free(img);

	for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
		img = hostile[i].bpe ? build_bpe(hostile[i].d, NULL, &n) : build_spm(hostile[i].d, &n);
		err[0] = '\0';
		rc = try_create(img, n, &g, &t, err, sizeof(err));
		CHECK(rc == hostile[i].rc && err[0] && !t,
		      "defect %d: want %d with a message, got %d '%s'", hostile[i].d, hostile[i].rc,
		      rc, err);
		if (rc == hostile[i].rc && err[0])
			printf("   defect %2d refused: %s\n", hostile[i].d, err);
		if (hostile[i].d == D_MODEL_BERT)
			CHECK(strstr(err, "'bert'"), "bert refusal does not name it: %s", err);
		eng_tokenizer_destroy(t);
		gguf_destroy(g);
		free(img);
	}
	/* every pre-tokenizer's regexes compile and run (one name per kind) */
	for (size_t i = 0; i < sizeof(pre_names) / sizeof(pre_names[0]); i++) {
		static const char text[] =
			"Hello, y'all! I'M 3333 ~~! \xe4\xbd\xa0\xe5\xa5\xbd \xe3\x81\x93\xe3\x82\x93 "
			"\xea\xb0\x80 \xce\x95\xce\xbb\xce\xbb  \xe3\x80\x80\xe3\x80\x80x\n\n  "
			"<sentinel:12> \t\r\n \xff\xc3 end  ";
		int32_t *ids = NULL;
		size_t nid = 0;

		img = build_bpe(D_NONE, pre_names[i], &n);
		rc = try_create(img, n, &g, &t, err, sizeof(err));
		CHECK(rc == 0, "pre-tokenizer %s: %s", pre_names[i], err);
		if (!rc) {
			rc = eng_tokenize(t, text, sizeof(text) - 1, true, &ids, &nid);
			CHECK(rc == 0 && nid > 0, "pre-tokenizer %s: tokenize gave %d", pre_names[i],
			      rc);
			free(ids);
		}
		eng_tokenizer_destroy(t);
		gguf_destroy(g);
		free(img);
	}
	printf("%s small vocabularies (%d good, %zu hostile, %zu pre-tokenizers)\n",
	       failures > failures_before ? "FAIL" : "ok", np, sizeof(hostile) / sizeof(hostile[0]),
	       sizeof(pre_names) / sizeof(pre_names[0]));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
	const char *fix = getenv("STRATA_FIXTURES");
	char dir[1024];
	char *names[256];
	size_t n_names = 0;
	struct dirent *de;
	DIR *d;

	if (!fix || !*fix)
		fix = "../shared/fixtures";
	snprintf(dir, sizeof(dir), "%s/vocab", fix);
	d = opendir(dir);
	if (!d) {
		printf("SKIP: no vocabulary fixtures at %s: %s\n", dir, strerror(errno));
		return 77;
	}
	while ((de = readdir(d)) && n_names < sizeof(names) / sizeof(names[0])) {
		size_t len = strlen(de->d_name);

		if (len > 9 && !strcmp(de->d_name + len - 9, ".gguf.inp")) {
			names[n_names] = strndup(de->d_name, len - 4);
			if (names[n_names])
				n_names++;
		}
	}
	closedir(d);
	qsort(names, n_names, sizeof(names[0]), cmp_str);
	if (!n_names) {
		printf("SKIP: no X.gguf.inp files in %s\n", dir);
		return 77;
	}
	for (size_t i = 0; i < n_names; i++) {
		run_vocab(dir, names[i]);
		free(names[i]);
	}
	test_small_vocabs();
	if (failures) {
		printf("%d failure(s)\n", failures);
		return 1;
	}
	printf("all tokenizer tests passed\n");
	return 0;
}
