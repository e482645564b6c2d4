/*
 * tokenizer_i.h - the tokenizer's state, shared by tokenizer.c (tokenizing
 * and decoding) and tokenizer_vocab.c (the vocabulary: reading it from GGUF,
 * the pre-tokenizer table, the regexes, and reading tokens back).  Not installed.
 */
#ifndef STRATA_TOKENIZER_I_H
#define STRATA_TOKENIZER_I_H

#define PCRE2_CODE_UNIT_WIDTH 8

#include "tokenizer.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
	int32_t *special_all;	/* and control and unknown ones: what text that parses
				 * specials (a chat template's) cuts out, longest first */
	uint32_t n_special_all;
	unsigned n_re;
	pcre2_code *re[MAX_RE];
	bool re_collapsed[MAX_RE];
	bool need_collapse, need_wide;
	pcre2_code *cat_re;	/* tells a code point's Unicode class, for collapsing */
};


/* The class bytes of a collapsed text (see tokenizer.c): one byte stands
 * for each non-ASCII character */
enum { CAT_OTHER = 0xd0, CAT_N = 0xd1, CAT_L = 0xd2, CAT_P = 0xd3, CAT_M = 0xd4, CAT_S = 0xd5 };

/* tokenizer.c */
int tok_seterr(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
const char *tok_printable(char *dst, size_t dn, const char *s, size_t n);
int tok_map_build(struct map *m, const struct skey *keys, uint32_t n, uint32_t *dup_first,
		  uint32_t *dup_again);
void tok_map_free(struct map *m);
int32_t tok_find_token(const struct eng_tokenizer *t, const char *s, size_t n);
int32_t tok_find_cstr(const struct eng_tokenizer *t, const char *s);
uint32_t tok_decode_cpt(const uint8_t *s, size_t n, size_t *i);
size_t tok_encode_cpt(uint32_t cp, uint8_t *o);
int tok_cpt_to_byte(uint32_t cp);

#endif
