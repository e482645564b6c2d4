/*
 * tokenizer.h - text <-> token ids for the vocabularies GGUF files carry.
 *
 * Two models, chosen by `tokenizer.ggml.model`:
 *   "llama"  SentencePiece-style BPE over scores (with byte fallback <0xNN>),
 *            spaces become U+2581, a leading space is added (add_space_prefix).
 *   "gpt2"   byte-level BPE over merges, after a pre-tokenizer regex chosen by
 *            `tokenizer.ggml.pre` (default/gpt2, llama-bpe, qwen2, starcoder,
 *            falcon, deepseek-llm, deepseek-coder, mpt, refact, ...), run with
 *            PCRE2 in UTF mode with Unicode properties.
 * Anything else (e.g. "bert" WordPiece) is refused by name.
 *
 * The tokenizer keeps pointers into the GGUF image for token texts and builds
 * its own lookup tables (hash maps) at create time; it is immutable afterwards
 * and safe to use from several threads.
 */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf;
struct eng_tokenizer;

/* 0, or -EINVAL/-ENOTSUP/-ENOMEM with a one-line reason in err. */
int eng_tokenizer_create(const struct gguf *g, struct eng_tokenizer **out, char *err,
			 size_t errlen);
void eng_tokenizer_destroy(struct eng_tokenizer *t);

/* Tokenize len bytes of UTF-8 text (invalid UTF-8 must not crash: it is
 * treated byte by byte).  add_bos prepends BOS when the vocabulary says to
 * (tokenizer.ggml.add_bos_token, default true for "llama", false for "gpt2").
 * Special/control tokens written in the text are NOT parsed as specials.
 * On success *ids is malloc'd (caller frees) and *n set; returns 0 or -errno. */
int eng_tokenize(const struct eng_tokenizer *t, const char *text, size_t len, bool add_bos,
		 int32_t **ids, size_t *n);

/* The bytes token id stands for when printed as output: U+2581 -> ' ',
 * <0xNN> -> that byte, GPT-2 byte-to-unicode mapping undone, control tokens
 * (BOS/EOS...) -> "".  Returns the length (may exceed bufsz: then truncated,
 * like snprintf), or -EINVAL for an id out of range. */
int eng_token_to_piece(const struct eng_tokenizer *t, int32_t id, char *buf, size_t bufsz);

uint32_t eng_tokenizer_n_vocab(const struct eng_tokenizer *t);
int32_t eng_tokenizer_bos(const struct eng_tokenizer *t); /* -1 if none */
int32_t eng_tokenizer_eos(const struct eng_tokenizer *t); /* -1 if none */
/* true for ids that end generation (EOS, EOT, ...) */
bool eng_tokenizer_is_eog(const struct eng_tokenizer *t, int32_t id);
/* Whether eng_tokenize(add_bos=true) actually adds one for this vocab. */
bool eng_tokenizer_adds_bos(const struct eng_tokenizer *t);

#endif
