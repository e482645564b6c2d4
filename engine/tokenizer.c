/*
 * tokenizer.c - text <-> token ids, reproducing llama.cpp's tokenizers.
 *
 * Both algorithms follow llama.cpp's llama-vocab.cpp and unicode.cpp step by
 * step, because a model only works with the exact ids it was trained on:
 *
 *   SPM ("llama"): a space is put in front (add_space_prefix), spaces become
 *   U+2581, the text is cut into UTF-8 characters, and neighbours whose
 *   concatenation is a token are merged, best score first (ties: leftmost),
 *   until no neighbouring pair is a token.  Pieces that are not tokens fall
 *   back to <0xNN> byte tokens.
 *
 *   BPE ("gpt2"): the text is cut into words by the pre-tokenizer regexes of
 *   tokenizer.ggml.pre (each regex re-splits the pieces of the previous one;
 *   text between matches is kept as pieces too), each word's bytes are mapped
 *   to GPT-2's printable byte alphabet, and neighbours are merged by merge
 *   rank, lowest first.
 *
 * Before either, user-defined tokens (MPT's runs of spaces, DeepSeek's "ø"...)
 * are cut out of the text as llama.cpp does even when specials are not parsed.
 *
 * Regexes: llama.cpp does not run the patterns on the text as written.  For a
 * pattern using \p{..} it runs std::regex over a "collapsed" copy in which each
 * non-ASCII character is one byte standing for its class (0x0B whitespace,
 * 0xD1 number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 any
 * other) and \p{L} becomes [\xD2A-Za-z] and so on; other patterns run over the
 * code points with non-ASCII whitespace replaced by 0x0B.  That has visible
 * consequences (\p{Lu} matches any letter, '~' is not \p{S}, \d and \b are
 * ASCII-only, U+3000 is not matched by a class listing it), so this file does
 * the same: PCRE2 in byte mode on the collapsed copy, PCRE2 in UTF mode without
 * Unicode properties on the other.  (For the GPT-2 and Llama-3 patterns
 * llama.cpp runs hand-written matchers instead; they agree with the regexes.)
 * Unicode classes come from PCRE2's tables, so characters added in Unicode
 * versions PCRE2 does not know yet may be classed differently.
 *
 * Invalid UTF-8 is handled as llama.cpp does: SPM works on bytes anyway (byte
 * fallback), BPE decodes each invalid byte to U+FFFD.
 *
 * Ownership and threading: the tokenizer points into the GGUF image for token
 * and merge texts (the image must outlive it), builds its hash tables and
 * compiles its regexes at create time and is read-only afterwards: any number
 * of threads may tokenize at once (each call has its own scratch and PCRE2
 * match data).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#define PCRE2_CODE_UNIT_WIDTH 8

#include "tokenizer.h"
#include "gguf.h"

#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS (1u << 24)
#define MAX_MERGES (1u << 25)
#define MAX_TOKEN_LEN (1u << 16)
#define MAX_TEXT (1u << 26) /* keeps symbol indices of a word within int */
#define MAX_RE 8

/* Token attributes, as llama.cpp derives them from tokenizer.ggml.token_type
 * (0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
 * 6 byte) and then adjusts them by token text. */
enum {
	ATTR_UNKNOWN = 1 << 0,
	ATTR_UNUSED = 1 << 1,
	ATTR_NORMAL = 1 << 2,
	ATTR_CONTROL = 1 << 3,
	ATTR_USER = 1 << 4,
	ATTR_BYTE = 1 << 5,
	ATTR_LSTRIP = 1 << 6,
	ATTR_RSTRIP = 1 << 7,
	ATTR_EOG = 1 << 8,
};

static const uint16_t type_attr[7] = {
	0, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER, ATTR_UNUSED, ATTR_BYTE,
};

/* A string inside the GGUF image. */
struct skey {
	const char *p;
	uint32_t n;
};

/* Open-addressing hash set over an array of keys: slot holds 1 + the key's
 * index (0 = empty).  Lookups of a merge pass the pair as two parts, hashed
 * and compared as "left right" without building that string. */
struct map {
	uint32_t *slot;
	uint32_t *hash;
	uint32_t mask;
	const struct skey *keys;
};

struct eng_tokenizer {
	bool bpe;
	bool add_space_prefix;
	bool add_bos;
	bool ignore_merges;
	uint32_t n_vocab;
	struct skey *text;
	float *score;
	uint16_t *attr;
	struct map vocab;
	struct skey *merge;
	uint32_t n_merges;
	struct map merges;
	int32_t bos, eos, unk;
	int32_t byte_tok[256];	/* SPM byte fallback, -1 if the vocabulary lacks it */
	int32_t *special;	/* user-defined tokens cut out of text, longest first */
	uint32_t n_special;
	unsigned n_re;
	pcre2_code *re[MAX_RE];
	bool re_collapsed[MAX_RE];
	bool need_collapse, need_wide;
	pcre2_code *cat_re;	/* tells a code point's Unicode class, for collapsing */
};

static int __attribute__((format(printf, 4, 5)))
seterr(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* Copy a file string for an error message, with anything unprintable as '?'. */
static const char *printable(char *dst, size_t dn, const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n && i + 1 < dn; i++)
		dst[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	dst[i] = '\0';
	return dst;
}

/* ---- hashing ---------------------------------------------------------- */

static uint32_t fnv(uint32_t h, const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)p[i];
		h *= 16777619u;
	}
	return h;
}

static uint32_t hash_key(const char *a, size_t an, const char *b, size_t bn)
{
	uint32_t h = fnv(2166136261u, a, an);

	if (b) {
		h = fnv(h, " ", 1);
		h = fnv(h, b, bn);
	}
	/* FNV's low bits are weak for power-of-two tables: finish with a mixer */
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

static bool key_eq(const struct skey *k, const char *a, size_t an, const char *b, size_t bn)
{
	if (!b)
		return k->n == an && memcmp(k->p, a, an) == 0;
	return k->n == an + 1 + bn && memcmp(k->p, a, an) == 0 && k->p[an] == ' ' &&
	       memcmp(k->p + an + 1, b, bn) == 0;
}

static int64_t map_find(const struct map *m, const char *a, size_t an, const char *b, size_t bn)
{
	uint32_t h = hash_key(a, an, b, bn);

	for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
		uint32_t s = m->slot[i];

		if (!s)
			return -1;
		if (m->hash[i] == h && key_eq(&m->keys[s - 1], a, an, b, bn))
			return s - 1;
	}
}

/* Insert keys[0..n) in order.  Empty keys are skipped (nothing looks them up).
 * A key seen before is not inserted again (the first index keeps it, as
 * std::map::emplace does for merges); the first such pair is reported. */
static int map_build(struct map *m, const struct skey *keys, uint32_t n, uint32_t *dup_first,
		     uint32_t *dup_again)
{
	size_t cap = 16;

	while (cap < (size_t)n + n / 2 + 1)
		cap <<= 1;
	m->slot = calloc(cap, sizeof(*m->slot));
	m->hash = malloc(cap * sizeof(*m->hash));
	if (!m->slot || !m->hash)
		return -ENOMEM;
	m->mask = (uint32_t)(cap - 1);
	m->keys = keys;
	*dup_first = *dup_again = UINT32_MAX;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t h, i;

		if (!keys[k].n)
			continue;
		h = hash_key(keys[k].p, keys[k].n, NULL, 0);
		for (i = h & m->mask; m->slot[i]; i = (i + 1) & m->mask)
			if (m->hash[i] == h && key_eq(&keys[m->slot[i] - 1], keys[k].p, keys[k].n,
						      NULL, 0))
				break;
		if (m->slot[i]) {
			if (*dup_first == UINT32_MAX) {
				*dup_first = m->slot[i] - 1;
				*dup_again = k;
			}
			continue;
		}
		m->slot[i] = k + 1;
		m->hash[i] = h;
	}
	return 0;
}

static void map_free(struct map *m)
{
	free(m->slot);
	free(m->hash);
}

static int32_t find_token(const struct eng_tokenizer *t, const char *s, size_t n)
{
	return (int32_t)map_find(&t->vocab, s, n, NULL, 0);
}

static int32_t find_cstr(const struct eng_tokenizer *t, const char *s)
{
	return find_token(t, s, strlen(s));
}

/* ---- UTF-8 and the GPT-2 byte alphabet -------------------------------- */

/* Length of the UTF-8 sequence a lead byte announces (llama.cpp's
 * unicode_len_utf8: continuation bytes count as 1). */
static size_t utf8_len(uint8_t c)
{
	static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };

	return len[c >> 4];
}

/* llama.cpp's decoder: it checks lead and continuation bits only, so overlong
 * forms and surrogates decode; any other invalid byte becomes U+FFFD and
 * decoding resumes at the next byte. */
static uint32_t decode_cpt(const uint8_t *s, size_t n, size_t *i)
{
	uint8_t c = s[*i];
	size_t need;
	uint32_t cp;

	if (c < 0x80) {
		(*i)++;
		return c;
	}
	if (!(c & 0x40))
		goto bad;
	if (!(c & 0x20)) {
		need = 1;
		cp = c & 0x1f;
	} else if (!(c & 0x10)) {
		need = 2;
		cp = c & 0x0f;
	} else if (!(c & 0x08)) {
		need = 3;
		cp = c & 0x07;
	} else {
		goto bad;
	}
	if (*i + need >= n)
		goto bad;
	for (size_t k = 1; k <= need; k++) {
		if ((s[*i + k] & 0xc0) != 0x80)
			goto bad;
		cp = cp << 6 | (s[*i + k] & 0x3f);
	}
	*i += need + 1;
	return cp;
bad:
	(*i)++;
	return 0xfffd;
}

/* Canonical encoding; beyond U+10FFFF (where llama.cpp throws) U+FFFD. */
static size_t encode_cpt(uint32_t cp, uint8_t *o)
{
	if (cp < 0x80) {
		o[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (uint8_t)(0xc0 | cp >> 6);
		o[1] = (uint8_t)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp > 0x10ffff)
		cp = 0xfffd;
	if (cp < 0x10000) {
		o[0] = (uint8_t)(0xe0 | cp >> 12);
		o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
		o[2] = (uint8_t)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (uint8_t)(0xf0 | cp >> 18);
	o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
	o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
	o[3] = (uint8_t)(0x80 | (cp & 0x3f));
	return 4;
}

/* Unicode White_Space, llama.cpp's unicode_set_whitespace. */
static bool is_space_cpt(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 ||
	       cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
	       cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* GPT-2 maps every byte to a printable character: bytes that already are one
 * (! to ~, U+A1 to U+AC, U+AE to U+FF) stand for themselves, the other 68 take
 * U+0100 onwards in byte order. */
static uint32_t byte_to_cpt(uint8_t b)
{
	if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)
		return b;
	if (b <= 0x20)
		return 0x100 + b;
	if (b <= 0xa0)
		return 0x100 + 33 + (b - 0x7f);
	return 0x100 + 67; /* 0xad */
}

static int cpt_to_byte(uint32_t cp)
{
	if (cp < 0x100)
		return byte_to_cpt((uint8_t)cp) == cp ? (int)cp : -1;
	if (cp < 0x100 + 33)
		return (int)(cp - 0x100);
	if (cp < 0x100 + 67)
		return (int)(cp - 0x100 - 33 + 0x7f);
	if (cp == 0x100 + 67)
		return 0xad;
	return -1;
}

/* ---- growable arrays -------------------------------------------------- */

/* Make room for `need` elements in the array whose pointer is at pp.  The
 * pointer is read and written with memcpy so that any element type works
 * without aliasing a T * as a void *. */
static int grow(void *pp, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 16;
	void *p, *q;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	if (c > SIZE_MAX / elem)
		return -ENOMEM;
	memcpy(&p, pp, sizeof(p));
	q = realloc(p, c * elem);
	if (!q)
		return -ENOMEM;
	memcpy(pp, &q, sizeof(q));
	*cap = c;
	return 0;
}

struct ids {
	int32_t *v;
	size_t n, cap;
};

static int ids_push(struct ids *o, int32_t id)
{
	if (grow(&o->v, &o->cap, o->n + 1, sizeof(*o->v)))
		return -ENOMEM;
	o->v[o->n++] = id;
	return 0;
}

struct span {
	size_t start, len;
};

struct spans {
	struct span *v;
	size_t n, cap;
};

static int span_push(struct spans *s, size_t start, size_t len)
{
	if (grow(&s->v, &s->cap, s->n + 1, sizeof(*s->v)))
		return -ENOMEM;
	s->v[s->n].start = start;
	s->v[s->n].len = len;
	s->n++;
	return 0;
}

/* A symbol of the merge loops: a byte range of the word, linked to its
 * neighbours; a symbol merged into its left neighbour has n = 0. */
struct sym {
	int prev, next;
	uint32_t off, n;
};

/* A candidate merge.  SPM's key is the score, BPE's minus the rank: the
 * highest key is merged first, ties go to the leftmost pair (llama.cpp's
 * comparators). */
struct bigram {
	double key;
	int left, right;
	uint32_t size;
};

struct heap {
	struct bigram *v;
	size_t n, cap;
};

static bool bg_before(const struct bigram *a, const struct bigram *b)
{
	return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(struct heap *h, struct bigram b)
{
	size_t i;

	if (grow(&h->v, &h->cap, h->n + 1, sizeof(*h->v)))
		return -ENOMEM;
	for (i = h->n++; i > 0; i = (i - 1) / 2) {
		size_t parent = (i - 1) / 2;

		if (!bg_before(&b, &h->v[parent]))
			break;
		h->v[i] = h->v[parent];
	}
	h->v[i] = b;
	return 0;
}

static struct bigram heap_pop(struct heap *h)
{
	struct bigram top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && bg_before(&h->v[c + 1], &h->v[c]))
			c++;
		if (!bg_before(&h->v[c], &last))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

/* Per-call scratch, reused across fragments and words. */
struct scratch {
	char *buf;
	size_t buf_cap;
	struct sym *sym;
	size_t sym_cap;
	struct heap heap;
	uint32_t *cpt;
	size_t cpt_cap;
	uint8_t *col;
	size_t col_cap;
	uint8_t *wide;
	size_t wide_cap;
	size_t *woff;
	size_t woff_cap;
	struct spans sp[2];
	pcre2_match_data *md;
	pcre2_match_data *cat_md;
	uint32_t cache_cpt[256];
	uint8_t cache_cat[256];
};

static void scratch_free(struct scratch *s)
{
	free(s->buf);
	free(s->sym);
	free(s->heap.v);
	free(s->cpt);
	free(s->col);
	free(s->wide);
	free(s->woff);
	free(s->sp[0].v);
	free(s->sp[1].v);
	pcre2_match_data_free(s->md);
	pcre2_match_data_free(s->cat_md);
}

/* Cut buf[0..n) into characters as symbols, linked in order. */
static int split_symbols(struct scratch *sc, size_t n, size_t *nsym)
{
	size_t k = 0;

	if (grow(&sc->sym, &sc->sym_cap, n ? n : 1, sizeof(*sc->sym)))
		return -ENOMEM;
	for (size_t off = 0; off < n; k++) {
		size_t len = utf8_len((uint8_t)sc->buf[off]);

		if (len > n - off)
			len = n - off;
		sc->sym[k].prev = (int)k - 1;
		sc->sym[k].next = off + len == n ? -1 : (int)k + 1;
		sc->sym[k].off = (uint32_t)off;
		sc->sym[k].n = (uint32_t)len;
		off += len;
	}
	*nsym = k;
	return 0;
}

/* ---- SPM -------------------------------------------------------------- */

typedef int (*pair_try_fn)(const struct eng_tokenizer *t, struct scratch *sc, int left,
			   int right);

/*
 * The merge loop both tokenizers share: queue every adjacent pair that
 * `try` accepts (SPM: the joined text is a token, ranked by score; BPE: the
 * pair is a merge, ranked by merge rank), then repeatedly join the best one
 * and offer its new neighbours.  A queued pair is stale when one side was
 * merged away or grew since; since the right symbol always starts where the
 * left one ends, equal lengths mean equal texts (llama.cpp compares texts).
 */
static int merge(const struct eng_tokenizer *t, struct scratch *sc, size_t nsym, pair_try_fn try)
{
	int rc;

	sc->heap.n = 0;
	for (size_t i = 1; i < nsym; i++) {
		rc = try(t, sc, (int)i - 1, (int)i);
		if (rc)
			return rc;
	}
	while (sc->heap.n) {
		struct bigram b = heap_pop(&sc->heap);
		struct sym *l = &sc->sym[b.left], *r = &sc->sym[b.right];

		if (!l->n || !r->n || l->n + r->n != b.size)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			sc->sym[r->next].prev = b.left;
		rc = try(t, sc, l->prev, b.left);
		if (!rc)
			rc = try(t, sc, b.left, l->next);
		if (rc)
			return rc;
	}
	return 0;
}

static int spm_try(const struct eng_tokenizer *t, struct scratch *sc, int left, int right)
{
	struct bigram b;
	int32_t id;

	if (left < 0 || right < 0)
		return 0;
	b.size = sc->sym[left].n + sc->sym[right].n;
	id = find_token(t, sc->buf + sc->sym[left].off, b.size);
	if (id < 0)
		return 0;
	b.key = t->score[id];
	b.left = left;
	b.right = right;
	return heap_push(&sc->heap, b);
}

static int spm_fragment(const struct eng_tokenizer *t, const char *s, size_t n, bool prefix,
			struct ids *out, struct scratch *sc)
{
	size_t bn = 0, nsym;
	int rc;

	if (grow(&sc->buf, &sc->buf_cap, 3 * (n + 1), 1))
		return -ENOMEM;
	if (prefix) {
		memcpy(sc->buf, "\xe2\x96\x81", 3);
		bn = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(sc->buf + bn, "\xe2\x96\x81", 3);
			bn += 3;
		} else {
			sc->buf[bn++] = s[i];
		}
	}
	rc = split_symbols(sc, bn, &nsym);
	if (rc)
		return rc;
	if (!nsym)
		return 0;

	rc = merge(t, sc, nsym, spm_try);
	if (rc)
		return rc;

	/* Every merged symbol is a token (merges are only made into tokens), so
	 * llama.cpp's re-segmentation through rev_merge never applies: what is
	 * left are single characters that are not tokens, spelled as bytes. */
	for (int i = 0; i != -1; i = sc->sym[i].next) {
		const struct sym *y = &sc->sym[i];
		int32_t id = find_token(t, sc->buf + y->off, y->n);

		if (id >= 0) {
			if (ids_push(out, id))
				return -ENOMEM;
			continue;
		}
		for (uint32_t j = 0; j < y->n; j++) {
			/* llama.cpp throws when a byte has no token; the unknown
			 * token (or nothing) is the robust stand-in */
			id = t->byte_tok[(uint8_t)sc->buf[y->off + j]];
			if (id < 0)
				id = t->unk;
			if (id >= 0 && ids_push(out, id))
				return -ENOMEM;
		}
	}
	return 0;
}

/* ---- BPE: pre-tokenizer ----------------------------------------------- */

enum { CAT_OTHER = 0xd0, CAT_N = 0xd1, CAT_L = 0xd2, CAT_P = 0xd3, CAT_M = 0xd4, CAT_S = 0xd5 };

static uint8_t classify(const struct eng_tokenizer *t, struct scratch *sc, uint32_t cp)
{
	static const uint8_t group_cat[6] = { CAT_OTHER, CAT_L, CAT_N, CAT_P, CAT_M, CAT_S };
	uint8_t u[4], cat = CAT_OTHER;
	size_t slot = cp & 255;
	int rc;

	if (sc->cache_cpt[slot] == cp)
		return sc->cache_cat[slot];
	if ((cp < 0xd800 || cp > 0xdfff) && cp <= 0x10ffff) {
		rc = pcre2_match(t->cat_re, u, encode_cpt(cp, u), 0, PCRE2_NO_UTF_CHECK, sc->cat_md,
				 NULL);
		if (rc > 1) {
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->cat_md);

			for (int g = 1; g < 6 && g < rc; g++)
				if (ov[2 * g] != PCRE2_UNSET)
					cat = group_cat[g];
		}
	}
	sc->cache_cpt[slot] = cp;
	sc->cache_cat[slot] = cat;
	return cat;
}

/* Code point index of byte offset b of a span's subject: the collapsed text
 * has one byte per code point, the wide one needs a search in woff. */
static size_t span_cpt(const struct scratch *sc, bool col, size_t cs, size_t ce, size_t b)
{
	size_t lo = cs, hi = ce;

	if (col)
		return cs + b;
	b += sc->woff[cs];
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (sc->woff[mid] < b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Re-split every span of `in` by regex k into `out`: matches and the text
 * between them both become spans (llama.cpp's unicode_regex_split_stl). */
static int re_split(const struct eng_tokenizer *t, struct scratch *sc, unsigned k,
		    const struct spans *in, struct spans *out)
{
	bool col = t->re_collapsed[k];
	const uint8_t *subj = col ? sc->col : sc->wide;

	out->n = 0;
	for (size_t i = 0; i < in->n; i++) {
		size_t cs = in->v[i].start, ce = cs + in->v[i].len;
		size_t b0 = col ? cs : sc->woff[cs];
		size_t blen = (col ? ce : sc->woff[ce]) - b0;
		size_t start = 0, last = 0, c_last = cs;
		uint32_t opts = 0;

		for (;;) {
			PCRE2_SIZE *ov;
			size_t c_ms, c_me;
			int rc = pcre2_match(t->re[k], subj + b0, blen, start,
					     opts | (col ? 0 : PCRE2_NO_UTF_CHECK), sc->md, NULL);

			if (rc == PCRE2_ERROR_NOMATCH) {
				/* after an empty match, std::regex_iterator
				 * retries there for a non-empty one, then moves
				 * on by one character */
				if (!opts || start >= blen)
					break;
				start += col ? 1 : utf8_len(subj[b0 + start]);
				opts = 0;
				continue;
			}
			if (rc < 0)
				return rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_HEAPLIMIT ?
					       -ENOMEM : -E2BIG;
			ov = pcre2_get_ovector_pointer(sc->md);
			c_ms = span_cpt(sc, col, cs, ce, ov[0]);
			c_me = span_cpt(sc, col, cs, ce, ov[1]);
			if (c_ms > c_last && span_push(out, c_last, c_ms - c_last))
				return -ENOMEM;
			if (c_me > c_ms && span_push(out, c_ms, c_me - c_ms))
				return -ENOMEM;
			last = ov[1];
			c_last = c_me;
			start = ov[1];
			opts = ov[1] == ov[0] ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
		}
		if (last < blen && span_push(out, c_last, ce - c_last))
			return -ENOMEM;
	}
	return 0;
}

/* ---- BPE: merges ------------------------------------------------------ */

static int bpe_try(const struct eng_tokenizer *t, struct scratch *sc, int left, int right)
{
	const struct sym *l, *r;
	struct bigram b;
	int64_t rank;

	if (left < 0 || right < 0)
		return 0;
	l = &sc->sym[left];
	r = &sc->sym[right];
	rank = map_find(&t->merges, sc->buf + l->off, l->n, sc->buf + r->off, r->n);
	if (rank < 0)
		return 0;
	b.key = -(double)rank;
	b.left = left;
	b.right = right;
	b.size = l->n + r->n;
	return heap_push(&sc->heap, b);
}

/* Merge one byte-encoded word (in sc->buf) and append its tokens. */
static int bpe_word(const struct eng_tokenizer *t, struct scratch *sc, size_t n, struct ids *out)
{
	size_t nsym;
	int32_t id;
	int rc;

	if (t->ignore_merges && (id = find_token(t, sc->buf, n)) >= 0)
		return ids_push(out, id);
	rc = split_symbols(sc, n, &nsym);
	if (rc)
		return rc;
	rc = merge(t, sc, nsym, bpe_try);
	if (rc)
		return rc;
	for (size_t i = 0; i < nsym; i++) {
		const struct sym *y = &sc->sym[i];

		if (!y->n)
			continue;
		id = find_token(t, sc->buf + y->off, y->n);
		if (id >= 0) {
			if (ids_push(out, id))
				return -ENOMEM;
			continue;
		}
		/* llama.cpp then looks up each byte of the encoded text on its
		 * own; only ASCII ones can match, the rest are dropped */
		for (uint32_t j = 0; j < y->n; j++) {
			id = find_token(t, sc->buf + y->off + j, 1);
			if (id >= 0 && ids_push(out, id))
				return -ENOMEM;
		}
	}
	return 0;
}

static int bpe_fragment(const struct eng_tokenizer *t, const char *s, size_t n, struct ids *out,
			struct scratch *sc)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t ncp = 0, wn = 0;
	struct spans *cur = &sc->sp[0], *next = &sc->sp[1];
	int rc;

	if (grow(&sc->cpt, &sc->cpt_cap, n, sizeof(*sc->cpt)))
		return -ENOMEM;
	for (size_t i = 0; i < n;)
		sc->cpt[ncp++] = decode_cpt(u, n, &i);

	if (t->need_collapse) {
		if (grow(&sc->col, &sc->col_cap, ncp, 1))
			return -ENOMEM;
		for (size_t i = 0; i < ncp; i++) {
			uint32_t cp = sc->cpt[i];

			if (cp < 0x80)
				sc->col[i] = (uint8_t)cp;
			else if (is_space_cpt(cp))
				sc->col[i] = 0x0b;
			else
				sc->col[i] = classify(t, sc, cp);
		}
	}
	if (t->need_wide) {
		if (grow(&sc->wide, &sc->wide_cap, 4 * ncp + 1, 1) ||
		    grow(&sc->woff, &sc->woff_cap, ncp + 1, sizeof(*sc->woff)))
			return -ENOMEM;
		for (size_t i = 0; i < ncp; i++) {
			uint32_t cp = sc->cpt[i];

			sc->woff[i] = wn;
			if (cp >= 0x80 && is_space_cpt(cp))
				cp = 0x0b;
			else if (cp >= 0xd800 && cp <= 0xdfff)
				cp = 0xfffd; /* PCRE2 refuses encoded surrogates */
			wn += encode_cpt(cp, sc->wide + wn);
		}
		sc->woff[ncp] = wn;
	}

	cur->n = 0;
	if (span_push(cur, 0, ncp))
		return -ENOMEM;
	for (unsigned k = 0; k < t->n_re; k++) {
		struct spans *tmp;

		rc = re_split(t, sc, k, cur, next);
		if (rc)
			return rc;
		tmp = cur;
		cur = next;
		next = tmp;
	}

	for (size_t w = 0; w < cur->n; w++) {
		size_t bn = 0;

		/* a code point takes at most 4 bytes, each at most 2 encoded */
		if (grow(&sc->buf, &sc->buf_cap, 8 * cur->v[w].len + 1, 1))
			return -ENOMEM;
		for (size_t i = cur->v[w].start; i < cur->v[w].start + cur->v[w].len; i++) {
			uint8_t b[4];
			size_t nb = encode_cpt(sc->cpt[i], b);

			for (size_t j = 0; j < nb; j++)
				bn += encode_cpt(byte_to_cpt(b[j]), (uint8_t *)sc->buf + bn);
		}
		if (!bn)
			continue;
		rc = bpe_word(t, sc, bn, out);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- user-defined tokens ---------------------------------------------- */

struct frag {
	size_t off, len;
	int32_t id; /* -1: text */
};

struct frags {
	struct frag *v;
	size_t n, cap;
};

static int frag_push(struct frags *f, size_t off, size_t len, int32_t id)
{
	if (grow(&f->v, &f->cap, f->n + 1, sizeof(*f->v)))
		return -ENOMEM;
	f->v[f->n].off = off;
	f->v[f->n].len = len;
	f->v[f->n].id = id;
	f->n++;
	return 0;
}

static bool ascii_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* llama.cpp's tokenizer_st_partition with parse_special = false: control and
 * unknown tokens stay text, user-defined ones are cut out, longest first,
 * with optional stripping of whitespace beside them. */
static int partition(const struct eng_tokenizer *t, const char *text, size_t len,
		     struct frags *out)
{
	struct frags a = { 0 }, b = { 0 }, tmp;

	if (len && frag_push(&a, 0, len, -1))
		goto err_nomem;
	for (uint32_t s = 0; s < t->n_special && a.n; s++) {
		int32_t id = t->special[s];
		const char *tp = t->text[id].p;
		size_t tn = t->text[id].n;
		uint16_t attr = t->attr[id];

		b.n = 0;
		for (size_t i = 0; i < a.n; i++) {
			struct frag f = a.v[i];
			size_t pos = f.off, end = f.off + f.len;
			const char *m;

			if (f.id >= 0) {
				if (frag_push(&b, f.off, f.len, f.id))
					goto err_nomem;
				continue;
			}
			while (pos < end && (m = memmem(text + pos, end - pos, tp, tn))) {
				size_t mo = (size_t)(m - text), l = mo;

				if (attr & ATTR_LSTRIP)
					while (l > pos && ascii_space(text[l - 1]))
						l--;
				if (l > pos && frag_push(&b, pos, l - pos, -1))
					goto err_nomem;
				if (frag_push(&b, mo, tn, id))
					goto err_nomem;
				pos = mo + tn;
				if (attr & ATTR_RSTRIP)
					while (pos < end && ascii_space(text[pos]))
						pos++;
			}
			if (pos < end && frag_push(&b, pos, end - pos, -1))
				goto err_nomem;
		}
		tmp = a;
		a = b;
		b = tmp;
	}
	free(b.v);
	*out = a;
	return 0;
err_nomem:
	free(a.v);
	free(b.v);
	return -ENOMEM;
}

/* ---- public: tokenize and decode -------------------------------------- */

int eng_tokenize(const struct eng_tokenizer *t, const char *text, size_t len, bool add_bos,
		 int32_t **ids, size_t *n)
{
	struct ids out = { 0 };
	struct frags fr = { 0 };
	struct scratch sc;
	bool prev_special = true;
	int rc;

	*ids = NULL;
	*n = 0;
	if (!t || (!text && len))
		return -EINVAL;
	if (len > MAX_TEXT)
		return -E2BIG;
	memset(&sc, 0, sizeof(sc));
	memset(sc.cache_cpt, 0xff, sizeof(sc.cache_cpt));
	if (t->bpe) {
		sc.md = pcre2_match_data_create(1, NULL);
		sc.cat_md = pcre2_match_data_create(6, NULL);
		if (!sc.md || !sc.cat_md) {
			rc = -ENOMEM;
			goto out;
		}
	}
	if (add_bos && eng_tokenizer_adds_bos(t) && ids_push(&out, t->bos)) {
		rc = -ENOMEM;
		goto out;
	}
	rc = partition(t, text, len, &fr);
	for (size_t i = 0; !rc && i < fr.n; i++) {
		const struct frag *f = &fr.v[i];

		if (f->id >= 0) {
			rc = ids_push(&out, f->id);
			/* SPM puts a space before the text after a special */
			prev_special = true;
			continue;
		}
		if (t->bpe)
			rc = bpe_fragment(t, text + f->off, f->len, &out, &sc);
		else
			rc = spm_fragment(t, text + f->off, f->len,
					  t->add_space_prefix && prev_special, &out, &sc);
		prev_special = false;
	}
	if (!rc && !out.v && !(out.v = malloc(sizeof(*out.v))))
		rc = -ENOMEM;
out:
	free(fr.v);
	scratch_free(&sc);
	if (rc) {
		free(out.v);
		return rc;
	}
	*ids = out.v;
	*n = out.n;
	return 0;
}

/* Writes what fits, counts everything (saturating: llama.cpp's [UNK_BYTE_..]
 * form repeats the whole token text per odd character). */
struct piece {
	char *buf;
	size_t cap, n;
};

static void put(struct piece *p, const void *s, size_t n)
{
	if (p->n < p->cap)
		memcpy(p->buf + p->n, s, n < p->cap - p->n ? n : p->cap - p->n);
	p->n = n > SIZE_MAX - p->n ? SIZE_MAX : p->n + n;
}

static int parse_byte_token(struct skey k)
{
	static const char hex[] = "0123456789ABCDEF0123456789abcdef";
	const char *h, *l;

	if (k.n != 6 || memcmp(k.p, "<0x", 3) || k.p[5] != '>')
		return -1;
	h = memchr(hex, k.p[3], 32);
	l = memchr(hex, k.p[4], 32);
	if (!h || !l || !k.p[3] || !k.p[4])
		return -1;
	return (int)((h - hex) % 16 * 16 + (l - hex) % 16);
}

int eng_token_to_piece(const struct eng_tokenizer *t, int32_t id, char *buf, size_t bufsz)
{
	struct piece p = { buf, buf ? bufsz : 0, 0 };
	struct skey k;
	uint16_t attr;

	if (!t || id < 0 || (uint32_t)id >= t->n_vocab)
		return -EINVAL;
	k = t->text[id];
	attr = t->attr[id];
	if (attr & (ATTR_UNKNOWN | ATTR_CONTROL)) {
		/* nothing: BOS, EOS and their kind print as "" */
	} else if (attr & ATTR_USER) {
		put(&p, k.p, k.n);
	} else if ((attr & ATTR_NORMAL) && !t->bpe) {
		for (uint32_t i = 0; i < k.n;) {
			if (k.n - i >= 3 && !memcmp(k.p + i, "\xe2\x96\x81", 3)) {
				put(&p, " ", 1);
				i += 3;
			} else {
				put(&p, k.p + i++, 1);
			}
		}
	} else if (attr & ATTR_NORMAL) {
		/* undo the byte alphabet (llama_decode_text) */
		for (size_t i = 0; i < k.n;) {
			uint32_t cp = decode_cpt((const uint8_t *)k.p, k.n, &i);
			int b = cpt_to_byte(cp);

			if (b >= 0) {
				uint8_t c = (uint8_t)b;

				put(&p, &c, 1);
			} else {
				uint8_t u[4];
				size_t nu = encode_cpt(cp, u);
				char hex[3];

				put(&p, "[UNK_BYTE_0x", 12);
				for (size_t j = 0; j < nu; j++) {
					snprintf(hex, sizeof(hex), "%02x", u[j]);
					put(&p, hex, 2);
				}
				put(&p, k.p, k.n);
				put(&p, "]", 1);
			}
		}
	} else if (attr & ATTR_BYTE) {
		int b = parse_byte_token(k);

		if (b >= 0) {
			uint8_t c = (uint8_t)b;

			put(&p, &c, 1);
		} else {
			put(&p, k.p, k.n);
		}
	}
	/* unused and undefined tokens print as "" too, as in llama.cpp */
	if (p.n < p.cap)
		buf[p.n] = '\0';
	return p.n > INT_MAX ? INT_MAX : (int)p.n;
}

uint32_t eng_tokenizer_n_vocab(const struct eng_tokenizer *t)
{
	return t->n_vocab;
}

int32_t eng_tokenizer_bos(const struct eng_tokenizer *t)
{
	return t->bos;
}

int32_t eng_tokenizer_eos(const struct eng_tokenizer *t)
{
	return t->eos;
}

bool eng_tokenizer_is_eog(const struct eng_tokenizer *t, int32_t id)
{
	return id >= 0 && (uint32_t)id < t->n_vocab && (t->attr[id] & ATTR_EOG);
}

bool eng_tokenizer_adds_bos(const struct eng_tokenizer *t)
{
	return t->add_bos && t->bos >= 0;
}

/* ---- pre-tokenizer table ---------------------------------------------- */

/* Patterns copied from llama.cpp's llm_tokenizer_bpe (non-ASCII characters
 * written as \x{..}: several of them are ones Unicode normalization would
 * silently replace). */
#define CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                   \
	CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
		 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                  \
	CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
		 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_PUNCT_ASCII "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
#define RE_CJK_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"
#define RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_CASED(U, L, C, N, TAIL)                                                          \
	"[^\\r\\n\\p{L}\\p{N}]?" U "*" L "+" C "|[^\\r\\n\\p{L}\\p{N}]?" U "+" L "*" C "|" N \
	"| ?[^\\s\\p{L}\\p{N}]+[\\r\\n" TAIL "]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LA_UPPER "((?=[\\p{L}])([^a-z]))"
#define LA_LOWER "((?=[\\p{L}])([^A-Z]))"
#define LA_UPPER_M "((?=[\\p{L}\\p{M}])([^a-z]))"
#define LA_LOWER_M "((?=[\\p{L}\\p{M}])([^A-Z]))"

#define PRE_IGNORE_MERGES 1u
#define PRE_ADD_BOS 2u
#define PRE_NO_BOS 4u

struct pre_type {
	const char *names; /* '|'-separated values of tokenizer.ggml.pre */
	unsigned flags;
	const char *re[MAX_RE];
};

static const struct pre_type pre_types[] = {
	{ "default", 0,
	  { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" } },
	{ "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano",
	  PRE_IGNORE_MERGES | PRE_ADD_BOS, { RE_LLAMA3 } },
	{ "dbrx|smaug-bpe", 0, { RE_LLAMA3 } },
	{ "glm4|chatglm-bpe", PRE_NO_BOS, { RE_LLAMA3 } },
	{ "jais-2", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
		     "|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)"
		     "|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)"
		     "|\\s{1,2}(?!\\S)|\\s{1}" } },
	{ "deepseek-llm", 0,
	  { "[\r\n]",
	    "\\s?[A-Za-z\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}"
	    "\\x{01BC}-\\x{01BF}\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}"
	    "\\x{0376}\\x{0377}\\x{037B}-\\x{037D}\\x{037F}\\x{0386}\\x{0388}-\\x{038A}"
	    "\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}\\x{03F7}-\\x{0481}"
	    "\\x{048A}-\\x{052F}\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
	    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
	    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
	    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}"
	    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"
	    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
	    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
	    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
	    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"
	    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
	    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
	    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
	    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"
	    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
	    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
	    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
	    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
	    "\\x{3000}-\\x{3002}]+",
	    "\\s+$", RE_CJK_HANGUL, "\\p{N}+" } },
	{ "deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", 0,
	  { "\\p{N}{1,3}", RE_CJK_KANA,
	    RE_PUNCT_ASCII "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*"
			   "|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" } },
	{ "spark2_5", 0,
	  { "\\p{N}{1,3}", RE_CJK_KANA,
	    RE_PUNCT_ASCII "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]"
			   "|\\s+(?!\\S)|\\s+",
	    "\\p{N}" } },
	{ "youtu", PRE_IGNORE_MERGES,
	  { "[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+|[\\x{FF01}\\x{2026}\\x{201C}\\x{201D}"
	    "\\x{2018}\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}\\x{FF0C}\\x{3001}-\\x{303F}"
	    "\\x{FE30}-\\x{FE4F}]+|[\\x{3105}-\\x{312F}]+|" RE_CJK_KANA,
	    RE_CASED(RE_UPPER, RE_LOWER, CONTRACT "?", "\\p{N}", "/") } },
	{ "deepseek-coder", 0,
	  { "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_HANGUL, "\\p{N}" } },
	{ "falcon", 0, { "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]" } },
	{ "starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", 0,
	  { "\\p{N}", RE_GPT2 } },
	{ "gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert"
	  "|exaone4|jina-v1-en|jina-v2-code|roberta-bpe|mpt|olmo|jais|trillion|granite-docling",
	  0, { RE_GPT2 } },
	{ "stablelm2|qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|hunyuan|solar-open|grok-2", 0,
	  { RE_QWEN2 } },
	{ "qwen35", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"
		     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
	{ "poro-chat|bloom|gpt3-finnish", 0, { RE_PORO } },
	{ "viking", 0, { RE_PORO, "\\p{N}" } },
	{ "tekken", PRE_IGNORE_MERGES | PRE_ADD_BOS,
	  { RE_CASED(LA_UPPER, LA_LOWER, "", "\\p{N}", "/") } },
	{ "chameleon", PRE_ADD_BOS,
	  { "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
	    "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2 } },
	{ "gpt-4o|llama4|kanana2|talkie|minimax-m2", 0,
	  { RE_CASED(LA_UPPER, LA_LOWER, CONTRACT "?", "\\p{N}{1,3}", "/") } },
	{ "granite-embed-multi-97m", PRE_IGNORE_MERGES,
	  { RE_CASED(LA_UPPER_M, LA_LOWER_M, CONTRACT "?", "\\p{N}{1,3}", "/") } },
	{ "tiny_aya|cohere2moe", 0,
	  { "\\d{1,3}(?=(?:\\d{3})*\\b)",
	    RE_CASED(RE_UPPER, RE_LOWER, CONTRACT "?", "\\p{N}{1,3}", "/") } },
	{ "superbpe", 0, { "\\p{N}+", "(?=(\\d{3})+(?!\\d))" } },
	{ "bailingmoe|bailingmoe2|llada-moe", 0,
	  { "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
	    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+" } },
	{ "seed-coder", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
		     "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
	{ "ufakzeka", 0,
	  { "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
	    "|\\s+(?!\\S)|\\s+" } },
	{ "laguna", 0, { "[^\\n]+|[\\n]+", RE_QWEN2 } },
	{ "exaone-moe", 0,
	  { CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
		     "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+" } },
	{ "minicpm5", PRE_IGNORE_MERGES,
	  { "\\p{N}{1,3}",
	    CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
		     "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
};

static bool name_in(const char *names, struct gguf_str s)
{
	for (const char *p = names;;) {
		const char *e = strchr(p, '|');
		size_t n = e ? (size_t)(e - p) : strlen(p);

		if (n == s.len && !memcmp(p, s.ptr, n))
			return true;
		if (!e)
			return false;
		p = e + 1;
	}
}

/* llama.cpp's unicode categories and their collapsed stand-ins. */
static const struct {
	const char *name;
	uint8_t cat;
} ucat[] = {
	{ "\\p{N}", CAT_N },  { "\\p{L}", CAT_L },  { "\\p{P}", CAT_P },  { "\\p{M}", CAT_M },
	{ "\\p{S}", CAT_S },  { "\\p{Lu}", CAT_L }, { "\\p{Ll}", CAT_L }, { "\\p{Lt}", CAT_L },
	{ "\\p{Lm}", CAT_L }, { "\\p{Lo}", CAT_L },
};

/* The ASCII members of each class, in std::regex bracket syntax. */
static const char *ucat_ascii(uint8_t cat)
{
	switch (cat) {
	case CAT_N:
		return "0-9";
	case CAT_L:
		return "A-Za-z";
	case CAT_P:
		return "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}";
	case CAT_S:
		return "\\$\\+<->^`\\|"; /* sic: no '~' */
	default:
		return "";
	}
}

static bool uses_ucat(const char *re)
{
	for (size_t i = 0; i < sizeof(ucat) / sizeof(ucat[0]); i++)
		if (strstr(re, ucat[i].name))
			return true;
	return false;
}

/* llama.cpp's rewrite of a pattern for the collapsed text: \p{X} becomes
 * [<cat byte><ASCII members>] (without the brackets inside a class). */
static char *collapse_regex(const char *re)
{
	size_t n = strlen(re);
	char *o = malloc(n * 8 + 1), *w = o;
	bool inside = false;

	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
			*w++ = '[';
			inside = true;
			continue;
		}
		if (inside && re[i] == ']' && re[i - 1] != '\\') {
			*w++ = ']';
			inside = false;
			continue;
		}
		if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
			const char *close = strchr(re + i + 3, '}');
			size_t k;

			for (k = 0; close && (size_t)(close - re) <= i + 10 &&
				    k < sizeof(ucat) / sizeof(ucat[0]);
			     k++) {
				size_t len = (size_t)(close - re) - i + 1;

				if (strlen(ucat[k].name) == len && !memcmp(re + i, ucat[k].name, len))
					break;
			}
			if (close && (size_t)(close - re) <= i + 10 &&
			    k < sizeof(ucat) / sizeof(ucat[0])) {
				const char *ascii = ucat_ascii(ucat[k].cat);

				if (!inside)
					*w++ = '[';
				*w++ = (char)ucat[k].cat;
				memcpy(w, ascii, strlen(ascii));
				w += strlen(ascii);
				if (!inside)
					*w++ = ']';
				i = (size_t)(close - re);
				continue;
			}
		}
		*w++ = re[i];
	}
	*w = '\0';
	return o;
}

static int compile_re(struct eng_tokenizer *t, const char *re, char *err, size_t errlen)
{
	uint32_t opts = PCRE2_DOLLAR_ENDONLY; /* ECMAScript's $: the very end only */
	char *pat = NULL;
	pcre2_code *code;
	PCRE2_SIZE eoff;
	int ecode;

	if (uses_ucat(re)) {
		pat = collapse_regex(re);
		if (!pat)
			return seterr(err, errlen, -ENOMEM, "out of memory");
		t->need_collapse = true;
		t->re_collapsed[t->n_re] = true;
	} else {
		opts |= PCRE2_UTF;
		t->need_wide = true;
	}
	code = pcre2_compile((PCRE2_SPTR)(pat ? pat : re), PCRE2_ZERO_TERMINATED, opts, &ecode,
			     &eoff, NULL);
	free(pat);
	if (!code) {
		PCRE2_UCHAR msg[120];

		pcre2_get_error_message(ecode, msg, sizeof(msg));
		return seterr(err, errlen, -EINVAL, "pre-tokenizer regex %u: %s at %zu", t->n_re,
			      (const char *)msg, (size_t)eoff);
	}
	t->re[t->n_re++] = code;
	return 0;
}

/* ---- create ----------------------------------------------------------- */

/* Texts llama.cpp recognizes special tokens by (llama_vocab::impl::load). */
static const char *const eot_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
	"<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
	NULL,
};
static const char *const eom_texts[] = { "<|eom_id|>", NULL };
static const char *const fim_pre_texts[] = {
	"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
	"<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
	"<|code_prefix|>", "<|prefix|>", NULL,
};
static const char *const fim_suf_texts[] = {
	"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
	"<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
	"<|code_suffix|>", "<|suffix|>", NULL,
};
static const char *const fim_mid_texts[] = {
	"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
	"<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
	"<|code_middle|>", "<|middle|>", NULL,
};
static const char *const fim_pad_texts[] = {
	"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL,
};
static const char *const fim_rep_texts[] = {
	"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL,
};
static const char *const fim_sep_texts[] = { "<|file_sep|>", NULL };
static const char *const eog_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
	"<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
	"[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
	"<|tool_response>",
	"<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[", NULL,
};

enum { SP_BOS, SP_EOS, SP_EOT, SP_EOM, SP_UNK, SP_FIM_PRE, SP_FIM_SUF, SP_FIM_MID, SP_FIM_PAD,
       SP_FIM_REP, SP_FIM_SEP, SP_COUNT };

static const struct {
	const char *key;
	int which;
} special_keys[] = {
	{ "tokenizer.ggml.bos_token_id", SP_BOS },
	{ "tokenizer.ggml.eos_token_id", SP_EOS },
	{ "tokenizer.ggml.eot_token_id", SP_EOT },
	{ "tokenizer.ggml.eom_token_id", SP_EOM },
	{ "tokenizer.ggml.unknown_token_id", SP_UNK },
	{ "tokenizer.ggml.fim_pre_token_id", SP_FIM_PRE },
	{ "tokenizer.ggml.fim_suf_token_id", SP_FIM_SUF },
	{ "tokenizer.ggml.fim_mid_token_id", SP_FIM_MID },
	{ "tokenizer.ggml.fim_pad_token_id", SP_FIM_PAD },
	{ "tokenizer.ggml.fim_rep_token_id", SP_FIM_REP },
	{ "tokenizer.ggml.fim_sep_token_id", SP_FIM_SEP },
	{ "tokenizer.ggml.prefix_token_id", SP_FIM_PRE }, /* deprecated names */
	{ "tokenizer.ggml.suffix_token_id", SP_FIM_SUF },
	{ "tokenizer.ggml.middle_token_id", SP_FIM_MID },
};

/* llama.cpp picks the first token whose text is in the list while iterating
 * a hash map; list order is the deterministic version of that.  The token
 * found is made a control token. */
static void detect(struct eng_tokenizer *t, int32_t *id, const char *const *list)
{
	if (*id >= 0)
		return;
	for (; *list; list++) {
		int32_t f = find_cstr(t, *list);

		if (f >= 0) {
			*id = f;
			t->attr[f] |= ATTR_CONTROL;
			return;
		}
	}
}

static int32_t eog_with_text(const struct eng_tokenizer *t, const char *s)
{
	int32_t id = find_cstr(t, s);

	return id >= 0 && (t->attr[id] & ATTR_EOG) ? id : -1;
}

static void set_attr(struct eng_tokenizer *t, const char *s, uint16_t bit, bool on)
{
	int32_t id = find_cstr(t, s);

	if (id >= 0)
		t->attr[id] = on ? t->attr[id] | bit : t->attr[id] & ~bit;
}

static bool str_has(struct gguf_str s, const char *needle, bool fold)
{
	size_t n = strlen(needle);

	for (size_t i = 0; i + n <= s.len; i++) {
		size_t k;

		for (k = 0; k < n; k++) {
			char c = s.ptr[i + k];

			if (fold && c >= 'A' && c <= 'Z')
				c = (char)(c - 'A' + 'a');
			if (c != needle[k])
				break;
		}
		if (k == n)
			return true;
	}
	return false;
}

struct special_ent {
	uint32_t n;
	int32_t id;
};

static int cmp_special(const void *a, const void *b)
{
	const struct special_ent *x = a, *y = b;

	if (x->n != y->n)
		return x->n > y->n ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Special ids, EOG set and attribute adjustments, in llama.cpp's order. */
static int setup_specials(struct eng_tokenizer *t, const struct gguf *g, int32_t *sp,
			  char *err, size_t errlen)
{
	struct gguf_str name = { "", 0 }, pre = { "", 0 }, arch = { "", 0 };
	int32_t end_id;
	bool call;
	int rc;

	for (size_t i = 0; i < sizeof(special_keys) / sizeof(special_keys[0]); i++) {
		uint32_t v;

		rc = gguf_get_u32(g, special_keys[i].key, &v);
		if (rc == -ENOENT)
			continue;
		if (rc)
			return seterr(err, errlen, -EINVAL, "%s is not an unsigned integer",
				      special_keys[i].key);
		/* llama.cpp warns and keeps its default; a file that names a
		 * token it does not have is corrupt */
		if (v >= t->n_vocab)
			return seterr(err, errlen, -EINVAL, "%s = %u is out of range (%u tokens)",
				      special_keys[i].key, v, t->n_vocab);
		sp[special_keys[i].which] = (int32_t)v;
	}

	detect(t, &sp[SP_EOT], eot_texts);
	detect(t, &sp[SP_EOM], eom_texts);
	detect(t, &sp[SP_FIM_PRE], fim_pre_texts);
	detect(t, &sp[SP_FIM_SUF], fim_suf_texts);
	detect(t, &sp[SP_FIM_MID], fim_mid_texts);
	detect(t, &sp[SP_FIM_PAD], fim_pad_texts);
	detect(t, &sp[SP_FIM_REP], fim_rep_texts);
	detect(t, &sp[SP_FIM_SEP], fim_sep_texts);

	if (sp[SP_FIM_PAD] >= 0)
		t->attr[sp[SP_FIM_PAD]] |= ATTR_EOG;
	if (sp[SP_FIM_REP] >= 0)
		t->attr[sp[SP_FIM_REP]] |= ATTR_EOG;
	if (sp[SP_FIM_SEP] >= 0)
		t->attr[sp[SP_FIM_SEP]] |= ATTR_EOG;
	for (const char *const *e = eog_texts; *e; e++) {
		int32_t id = find_cstr(t, *e);

		if (id >= 0)
			t->attr[id] |= ATTR_EOG | ATTR_CONTROL;
	}
	/* gpt-oss: these are printed, not hidden */
	for (const char *const *e = (const char *const[]){ "<|channel|>", "<|message|>",
							   "<|start|>", "<|constrain|>", NULL };
	     *e; e++) {
		int32_t id = find_cstr(t, *e);

		if (id >= 0)
			t->attr[id] = (t->attr[id] & ATTR_EOG) | ATTR_USER;
	}
	if (sp[SP_EOS] >= 0)
		t->attr[sp[SP_EOS]] |= ATTR_EOG;
	if (sp[SP_EOT] >= 0)
		t->attr[sp[SP_EOT]] |= ATTR_EOG;
	if (sp[SP_EOM] >= 0)
		t->attr[sp[SP_EOM]] |= ATTR_EOG;

	/* o200k_harmony and solar-open: there <|end|> ends a message, not the
	 * generation */
	end_id = eog_with_text(t, "<|end|>");
	call = eog_with_text(t, "<|call|>") >= 0 || eog_with_text(t, "<|calls|>") >= 0;
	if (end_id >= 0 && call &&
	    (eog_with_text(t, "<|return|>") >= 0 || eog_with_text(t, "<|flush|>") >= 0))
		t->attr[end_id] = ATTR_USER;
	/* gemma4 and paddleocr: </s> is text there */
	end_id = eog_with_text(t, "</s>");
	if (end_id >= 0 && eog_with_text(t, "<|tool_response>") >= 0)
		t->attr[end_id] = ATTR_NORMAL;

	/* the user-defined tokens tokenize() cuts out of the text */
	for (uint32_t id = 0; id < t->n_vocab; id++)
		if ((t->attr[id] & (ATTR_USER | ATTR_CONTROL | ATTR_UNKNOWN)) == ATTR_USER &&
		    t->text[id].n)
			t->n_special++;
	if (t->n_special) {
		/* longest first; llama.cpp's std::sort leaves ties in no
		 * particular order, ids make it deterministic */
		struct special_ent *e = malloc(t->n_special * sizeof(*e));
		uint32_t k = 0;

		t->special = malloc(t->n_special * sizeof(*t->special));
		if (!e || !t->special) {
			free(e);
			return seterr(err, errlen, -ENOMEM, "out of memory");
		}
		for (uint32_t id = 0; id < t->n_vocab; id++)
			if ((t->attr[id] & (ATTR_USER | ATTR_CONTROL | ATTR_UNKNOWN)) == ATTR_USER &&
			    t->text[id].n)
				e[k++] = (struct special_ent){ t->text[id].n, (int32_t)id };
		qsort(e, t->n_special, sizeof(*e), cmp_special);
		for (k = 0; k < t->n_special; k++)
			t->special[k] = e[k].id;
		free(e);
	}

	/* per-model strip attributes, chosen by name as llama.cpp does */
	gguf_get_str(g, "general.name", &name);
	gguf_get_str(g, "tokenizer.ggml.pre", &pre);
	gguf_get_str(g, "general.architecture", &arch);
	if (str_has(pre, "jina-v2-de", false) || str_has(pre, "jina-v2-es", false) ||
	    str_has(pre, "jina-v2-code", false) || str_has(arch, "nomic-bert-moe", false) ||
	    str_has(arch, "jina-bert-v3", false)) {
		set_attr(t, "<mask>", ATTR_LSTRIP, true);
	} else if (str_has(name, "phi-3", true) || str_has(name, "phi3", true)) {
		for (uint32_t id = 0; id < t->n_vocab; id++)
			if (t->attr[id] & (ATTR_CONTROL | ATTR_USER | ATTR_UNKNOWN))
				t->attr[id] |= ATTR_RSTRIP;
		set_attr(t, "</s>", ATTR_RSTRIP, true);
		set_attr(t, "<unk>", ATTR_RSTRIP, false);
		set_attr(t, "<s>", ATTR_RSTRIP, false);
		set_attr(t, "<|endoftext|>", ATTR_RSTRIP, false);
	} else if (str_has(name, "modern-bert", true)) {
		set_attr(t, "[MASK]", ATTR_LSTRIP, true);
	}
	return 0;
}

static int load_tokens(struct eng_tokenizer *t, const struct gguf *g, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
	const uint8_t *p;
	uint32_t dup_a, dup_b;
	int rc;

	if (!kv)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens is missing");
	if (kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_STRING)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens is not an array of strings");
	if (kv->v.arr.n == 0)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens is empty");
	if (kv->v.arr.n > MAX_TOKENS)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.tokens has %llu tokens (at most %u)",
			      (unsigned long long)kv->v.arr.n, MAX_TOKENS);
	t->n_vocab = (uint32_t)kv->v.arr.n;
	t->text = calloc(t->n_vocab, sizeof(*t->text));
	t->score = calloc(t->n_vocab, sizeof(*t->score));
	t->attr = calloc(t->n_vocab, sizeof(*t->attr));
	if (!t->text || !t->score || !t->attr)
		return seterr(err, errlen, -ENOMEM, "out of memory");
	p = kv->v.arr.data;
	for (uint32_t i = 0; i < t->n_vocab; i++) {
		struct gguf_str s = gguf_arr_next_str(&p);

		if (s.len > MAX_TOKEN_LEN)
			return seterr(err, errlen, -EINVAL, "token %u is %llu bytes long", i,
				      (unsigned long long)s.len);
		t->text[i].p = s.ptr;
		t->text[i].n = (uint32_t)s.len;
		t->attr[i] = ATTR_NORMAL;
	}

	kv = gguf_find_kv(g, "tokenizer.ggml.scores");
	if (kv) {
		if (kv->type != GGUF_VT_ARRAY ||
		    (kv->v.arr.type != GGUF_VT_F32 && kv->v.arr.type != GGUF_VT_I32))
			return seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.scores is not an array of f32 or i32");
		if (kv->v.arr.n != t->n_vocab)
			return seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.scores has %llu entries for %u tokens",
				      (unsigned long long)kv->v.arr.n, t->n_vocab);
		for (uint32_t i = 0; i < t->n_vocab; i++) {
			if (kv->v.arr.type == GGUF_VT_F32) {
				memcpy(&t->score[i], kv->v.arr.data + 4 * (size_t)i, 4);
			} else {
				int32_t v;

				memcpy(&v, kv->v.arr.data + 4 * (size_t)i, 4);
				t->score[i] = (float)v;
			}
		}
	}

	kv = gguf_find_kv(g, "tokenizer.ggml.token_type");
	if (kv) {
		if (kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_I32)
			return seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.token_type is not an array of i32");
		if (kv->v.arr.n != t->n_vocab)
			return seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.token_type has %llu entries for %u tokens",
				      (unsigned long long)kv->v.arr.n, t->n_vocab);
		for (uint32_t i = 0; i < t->n_vocab; i++) {
			int32_t v;

			memcpy(&v, kv->v.arr.data + 4 * (size_t)i, 4);
			if (v < 0 || v > 6)
				return seterr(err, errlen, -EINVAL,
					      "token %u has type %d (known types are 0 to 6)", i, v);
			t->attr[i] = type_attr[v];
		}
	}

	rc = map_build(&t->vocab, t->text, t->n_vocab, &dup_a, &dup_b);
	if (rc)
		return seterr(err, errlen, rc, "out of memory");
	if (dup_a != UINT32_MAX) {
		char s[40];

		return seterr(err, errlen, -EINVAL, "tokens %u and %u have the same text '%s'", dup_a,
			      dup_b, printable(s, sizeof(s), t->text[dup_a].p, t->text[dup_a].n));
	}
	return 0;
}

static int load_merges(struct eng_tokenizer *t, const struct gguf *g, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.merges");
	const uint8_t *p;
	uint32_t dup_a, dup_b;

	if (!kv)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.merges is missing");
	if (kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_STRING)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.merges is not an array of strings");
	if (kv->v.arr.n > MAX_MERGES)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.merges has %llu entries (at most %u)",
			      (unsigned long long)kv->v.arr.n, MAX_MERGES);
	t->n_merges = (uint32_t)kv->v.arr.n;
	t->merge = calloc(t->n_merges ? t->n_merges : 1, sizeof(*t->merge));
	if (!t->merge)
		return seterr(err, errlen, -ENOMEM, "out of memory");
	p = kv->v.arr.data;
	for (uint32_t i = 0; i < t->n_merges; i++) {
		struct gguf_str s = gguf_arr_next_str(&p);

		/* "left right", split at the first space after the first byte */
		if (s.len < 3 || s.len > 2 * (uint64_t)MAX_TOKEN_LEN + 1 ||
		    !memchr(s.ptr + 1, ' ', s.len - 1)) {
			char m[40];

			return seterr(err, errlen, -EINVAL,
				      "tokenizer.ggml.merges[%u] '%s' is not two tokens and a space",
				      i, printable(m, sizeof(m), s.ptr, s.len));
		}
		t->merge[i].p = s.ptr;
		t->merge[i].n = (uint32_t)s.len;
	}
	/* a repeated merge keeps its first (best) rank, as in llama.cpp */
	if (map_build(&t->merges, t->merge, t->n_merges, &dup_a, &dup_b))
		return seterr(err, errlen, -ENOMEM, "out of memory");
	return 0;
}

static int get_bool(const struct gguf *g, const char *key, bool *v, char *err, size_t errlen)
{
	int rc = gguf_get_bool(g, key, v);

	if (rc == -ENOENT)
		return 0;
	if (rc)
		return seterr(err, errlen, -EINVAL, "%s is not a bool", key);
	return 0;
}

int eng_tokenizer_create(const struct gguf *g, struct eng_tokenizer **out, char *err, size_t errlen)
{
	struct eng_tokenizer *t;
	struct gguf_str model, pre = { "", 0 };
	const struct pre_type *pt = NULL;
	int32_t sp[SP_COUNT];
	char s[40];
	int rc;

	*out = NULL;
	if (errlen)
		err[0] = '\0';
	rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
	if (rc == -ENOENT)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.model is missing");
	if (rc)
		return seterr(err, errlen, -EINVAL, "tokenizer.ggml.model is not a string");
	if (!gguf_str_eq(model, "llama") && !gguf_str_eq(model, "gpt2"))
		return seterr(err, errlen, -ENOTSUP, "tokenizer model '%s' is not supported",
			      printable(s, sizeof(s), model.ptr, model.len));

	t = calloc(1, sizeof(*t));
	if (!t)
		return seterr(err, errlen, -ENOMEM, "out of memory");
	for (int i = 0; i < SP_COUNT; i++)
		sp[i] = -1;
	t->bpe = gguf_str_eq(model, "gpt2");
	if (t->bpe) {
		rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
		if (rc && rc != -ENOENT) {
			rc = seterr(err, errlen, -EINVAL, "tokenizer.ggml.pre is not a string");
			goto err_free;
		}
		/* a missing pre-tokenizer means "default", with a warning in
		 * llama.cpp */
		if (rc == -ENOENT)
			pre = (struct gguf_str){ "default", 7 };
		for (size_t i = 0; i < sizeof(pre_types) / sizeof(pre_types[0]) && !pt; i++)
			if (name_in(pre_types[i].names, pre))
				pt = &pre_types[i];
		if (!pt) {
			rc = seterr(err, errlen, -ENOTSUP, "pre-tokenizer '%s' is not supported",
				    printable(s, sizeof(s), pre.ptr, pre.len));
			goto err_free;
		}
		t->ignore_merges = pt->flags & PRE_IGNORE_MERGES;
		t->add_bos = pt->flags & PRE_ADD_BOS;
		sp[SP_BOS] = pt->flags & PRE_NO_BOS ? -1 : 11;
		sp[SP_EOS] = 11;
	} else {
		t->add_bos = true;
		t->add_space_prefix = true;
		sp[SP_BOS] = 1;
		sp[SP_EOS] = 2;
		sp[SP_UNK] = 0;
	}
	rc = get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, errlen);
	if (rc)
		goto err_free;

	rc = load_tokens(t, g, err, errlen);
	if (rc)
		goto err_free;
	/* defaults the vocabulary is too small for are dropped (llama.cpp) */
	for (int i = 0; i < SP_COUNT; i++)
		if (sp[i] >= 0 && (uint32_t)sp[i] >= t->n_vocab)
			sp[i] = -1;
	if (t->bpe) {
		rc = load_merges(t, g, err, errlen);
		if (rc)
			goto err_free;
	}
	rc = setup_specials(t, g, sp, err, errlen);
	if (rc)
		goto err_free;
	t->bos = sp[SP_BOS];
	t->eos = sp[SP_EOS];
	t->unk = sp[SP_UNK];
	rc = get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err, errlen);
	if (rc)
		goto err_free;
	if (t->add_bos && t->bos < 0) {
		rc = seterr(err, errlen, -EINVAL,
			    "tokenizer.ggml.add_bos_token is true but there is no BOS token");
		goto err_free;
	}

	if (!t->bpe) {
		for (int b = 0; b < 256; b++) {
			char hex[8];
			char c = (char)b;

			snprintf(hex, sizeof(hex), "<0x%02X>", b);
			t->byte_tok[b] = find_cstr(t, hex);
			if (t->byte_tok[b] < 0)
				t->byte_tok[b] = find_token(t, &c, 1);
		}
	} else {
		int ecode;
		PCRE2_SIZE eoff;

		for (unsigned i = 0; i < MAX_RE && pt->re[i]; i++) {
			rc = compile_re(t, pt->re[i], err, errlen);
			if (rc)
				goto err_free;
		}
		if (t->need_collapse) {
			t->cat_re = pcre2_compile(
				(PCRE2_SPTR) "(\\p{L})|(\\p{N})|(\\p{P})|(\\p{M})|(\\p{S})",
				PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ecode,
				&eoff, NULL);
			if (!t->cat_re) {
				rc = seterr(err, errlen, -ENOMEM, "cannot compile the class regex");
				goto err_free;
			}
		}
	}
	*out = t;
	return 0;

err_free:
	eng_tokenizer_destroy(t);
	return rc;
}

void eng_tokenizer_destroy(struct eng_tokenizer *t)
{
	if (!t)
		return;
	for (unsigned i = 0; i < t->n_re; i++)
		pcre2_code_free(t->re[i]);
	pcre2_code_free(t->cat_re);
	free(t->special);
	map_free(&t->merges);
	free(t->merge);
	map_free(&t->vocab);
	free(t->attr);
	free(t->score);
	free(t->text);
	free(t);
}
