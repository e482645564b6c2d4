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
 *   to GPT-2's tok_printable byte alphabet, and neighbours are merged by merge
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
 * This file tokenizes; tokenizer_vocab.c builds the tokenizer from the GGUF
 * file (and the pre-tokenizer table) and reads tokens back as text.
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
#include "tokenizer_i.h"
#include "gguf.h"

#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tok_seterr(char *err, size_t errlen, int rc, const char *fmt, ...)
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
const char *tok_printable(char *dst, size_t dn, const char *s, size_t n)
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
int tok_map_build(struct map *m, const struct skey *keys, uint32_t n, uint32_t *dup_first,
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

void tok_map_free(struct map *m)
{
	free(m->slot);
	free(m->hash);
}

int32_t tok_find_token(const struct eng_tokenizer *t, const char *s, size_t n)
{
	return (int32_t)map_find(&t->vocab, s, n, NULL, 0);
}

int32_t tok_find_cstr(const struct eng_tokenizer *t, const char *s)
{
	return tok_find_token(t, s, strlen(s));
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
uint32_t tok_decode_cpt(const uint8_t *s, size_t n, size_t *i)
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
size_t tok_encode_cpt(uint32_t cp, uint8_t *o)
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

/* GPT-2 maps every byte to a tok_printable character: bytes that already are one
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

int tok_cpt_to_byte(uint32_t cp)
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
	id = tok_find_token(t, sc->buf + sc->sym[left].off, b.size);
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
		int32_t id = tok_find_token(t, sc->buf + y->off, y->n);

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


static uint8_t classify(const struct eng_tokenizer *t, struct scratch *sc, uint32_t cp)
{
	static const uint8_t group_cat[6] = { CAT_OTHER, CAT_L, CAT_N, CAT_P, CAT_M, CAT_S };
	uint8_t u[4], cat = CAT_OTHER;
	size_t slot = cp & 255;
	int rc;

	if (sc->cache_cpt[slot] == cp)
		return sc->cache_cat[slot];
	if ((cp < 0xd800 || cp > 0xdfff) && cp <= 0x10ffff) {
		rc = pcre2_match(t->cat_re, u, tok_encode_cpt(cp, u), 0, PCRE2_NO_UTF_CHECK, sc->cat_md,
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

	if (t->ignore_merges && (id = tok_find_token(t, sc->buf, n)) >= 0)
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
		id = tok_find_token(t, sc->buf + y->off, y->n);
		if (id >= 0) {
			if (ids_push(out, id))
				return -ENOMEM;
			continue;
		}
		/* llama.cpp then looks up each byte of the encoded text on its
		 * own; only ASCII ones can match, the rest are dropped */
		for (uint32_t j = 0; j < y->n; j++) {
			id = tok_find_token(t, sc->buf + y->off + j, 1);
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
		sc->cpt[ncp++] = tok_decode_cpt(u, n, &i);

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
			wn += tok_encode_cpt(cp, sc->wide + wn);
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
			size_t nb = tok_encode_cpt(sc->cpt[i], b);

			for (size_t j = 0; j < nb; j++)
				bn += tok_encode_cpt(byte_to_cpt(b[j]), (uint8_t *)sc->buf + bn);
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

/* llama.cpp's tokenizer_st_partition: the tokens of list (longest first)
 * are cut out of the text, with optional stripping of whitespace beside
 * them.  Without parse_special that is the user-defined ones (control and
 * unknown tokens stay text); with it, those too. */
static int partition(const struct eng_tokenizer *t, const int32_t *list, uint32_t n_list,
		     const char *text, size_t len, struct frags *out)
{
	struct frags a = { 0 }, b = { 0 }, tmp;

	if (len && frag_push(&a, 0, len, -1))
		goto err_nomem;
	for (uint32_t s = 0; s < n_list && a.n; s++) {
		int32_t id = list[s];
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

static int tokenize(const struct eng_tokenizer *t, const char *text, size_t len, bool add_bos,
		    bool parse_special, int32_t **ids, size_t *n)
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
	rc = parse_special ? partition(t, t->special_all, t->n_special_all, text, len, &fr)
			   : partition(t, t->special, t->n_special, text, len, &fr);
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

int eng_tokenize(const struct eng_tokenizer *t, const char *text, size_t len, bool add_bos,
		 int32_t **ids, size_t *n)
{
	return tokenize(t, text, len, add_bos, false, ids, n);
}

int eng_tokenize_special(const struct eng_tokenizer *t, const char *text, size_t len,
			 bool add_bos, int32_t **ids, size_t *n)
{
	return tokenize(t, text, len, add_bos, true, ids, n);
}
