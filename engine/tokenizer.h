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

#include "engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 0, or -EINVAL/-ENOTSUP/-ENOMEM with a one-line reason in err. */
int eng_tokenizer_create(const struct gguf *g, struct eng_tokenizer **out, char *err,
			 size_t errlen);
void eng_tokenizer_destroy(struct eng_tokenizer *t);

/* The rest of the tokenizer's interface (eng_tokenize, ...) is public, in
 * engine.h. */

#endif
