/*
 * fuzz_vocab.c - libFuzzer harness: arbitrary vocabularies.  Each input is
 * made into a vocabulary-only GGUF file in memory, loaded (the tokenizer's
 * tables, special tokens, merges), and a text from the same input is
 * tokenized with it and turned back into pieces.
 *
 * Input layout:
 *    0  1 flags      bit 0: "gpt2" (byte-level BPE), else "llama" (SentencePiece)
 *                    bits 1-3: the pre-tokenizer (PRES), gpt2 only
 *                    bit 4: name BOS 1 and EOS 2; bit 5: add_bos_token true
 *                    bit 6: a general.name of "phi-3" (its strip attributes)
 *    1  ...  lines   separated by \n up to a \0: each line with a space is a
 *                    merge (gpt2), any other a token; a token whose first
 *                    byte is 1-7 has that token type, the byte dropped
 *    then    text    to tokenize (any bytes)
 * Scores are -index.  Tokens are capped at 4096, merges at 4096.
 */
#include "engine.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const PRES[] = { "default", "llama-bpe", "qwen2", "starcoder", "deepseek-llm",
				    "deepseek-coder", "falcon", "gpt-2" };

#define MAX_ITEMS 4096

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = (b->n + n) * 2;
		uint8_t *p = realloc(b->p, cap);

		if (!p)
			abort();
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, src, n);
	b->n += n;
}

static void put_u32(struct buf *b, uint32_t v)
{
	put(b, &v, 4);
}

static void put_u64(struct buf *b, uint64_t v)
{
	put(b, &v, 8);
}

static void put_str(struct buf *b, const void *s, size_t n)
{
	put_u64(b, n);
	put(b, s, n);
}

static void put_key(struct buf *b, const char *key, uint32_t type)
{
	put_str(b, key, strlen(key));
	put_u32(b, type);
}

struct item {
	const uint8_t *p;
	size_t n;
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct item toks[MAX_ITEMS], merges[MAX_ITEMS];
	size_t nt = 0, nm = 0, i = 1, n_kv = 5;
	struct buf b = { 0 };
	uint8_t flags;
	const uint8_t *text;
	size_t text_len;
	bool gpt2;

	if (size < 1)
		return 0;
	flags = data[0];
	gpt2 = flags & 1;
	while (i < size && data[i]) {
		size_t s = i;

		while (i < size && data[i] && data[i] != '\n')
			i++;
		if (gpt2 && memchr(data + s, ' ', i - s)) {
			if (nm < MAX_ITEMS)
				merges[nm++] = (struct item){ data + s, i - s };
		} else if (nt < MAX_ITEMS) {
			toks[nt++] = (struct item){ data + s, i - s };
		}
		if (i < size && data[i] == '\n')
			i++;
	}
	text = i < size ? data + i + 1 : data + size;
	text_len = (size_t)(data + size - text);

	/* header; n_kv is patched below */
	put_u32(&b, 0x46554747u);
	put_u32(&b, 3);
	put_u64(&b, 0);
	put_u64(&b, 0);
	put_key(&b, "general.architecture", 8);
	put_str(&b, "llama", 5);
	put_key(&b, "tokenizer.ggml.model", 8);
	put_str(&b, gpt2 ? "gpt2" : "llama", gpt2 ? 4 : 5);
	put_key(&b, "tokenizer.ggml.tokens", 9);
	put_u32(&b, 8);
	put_u64(&b, nt);
	for (size_t k = 0; k < nt; k++) {
		bool typed = toks[k].n && toks[k].p[0] >= 1 && toks[k].p[0] <= 7;

		put_str(&b, toks[k].p + typed, toks[k].n - typed);
	}
	put_key(&b, "tokenizer.ggml.scores", 9);
	put_u32(&b, 6);
	put_u64(&b, nt);
	for (size_t k = 0; k < nt; k++) {
		float s = -(float)k;

		put(&b, &s, 4);
	}
	put_key(&b, "tokenizer.ggml.token_type", 9);
	put_u32(&b, 5);
	put_u64(&b, nt);
	for (size_t k = 0; k < nt; k++)
		put_u32(&b, toks[k].n && toks[k].p[0] >= 1 && toks[k].p[0] <= 7 ? toks[k].p[0] : 1);
	if (gpt2) {
		const char *pre = PRES[(flags >> 1) & 7];

		put_key(&b, "tokenizer.ggml.pre", 8);
		put_str(&b, pre, strlen(pre));
		put_key(&b, "tokenizer.ggml.merges", 9);
		put_u32(&b, 8);
		put_u64(&b, nm);
		for (size_t k = 0; k < nm; k++)
			put_str(&b, merges[k].p, merges[k].n);
		n_kv += 2;
	}
	if (flags & 16) {
		put_key(&b, "tokenizer.ggml.bos_token_id", 4);
		put_u32(&b, 1);
		put_key(&b, "tokenizer.ggml.eos_token_id", 4);
		put_u32(&b, 2);
		n_kv += 2;
	}
	if (flags & 32) {
		put_key(&b, "tokenizer.ggml.add_bos_token", 7);
		put(&b, "\1", 1);
		n_kv++;
	}
	if (flags & 64) {
		put_key(&b, "general.name", 8);
		put_str(&b, "phi-3", 5);
		n_kv++;
	}
	memcpy(b.p + 16, &n_kv, 8);

	struct eng_model *m = NULL;
	char err[256] = "";
	int rc = eng_model_load_vocab(b.p, b.n, &m, err, sizeof(err));

	if (rc) {
		if (!err[0] || strchr(err, '\n'))
			abort();
	} else {
		const struct eng_tokenizer *t = eng_model_tokenizer(m);
		uint32_t n_vocab = eng_tokenizer_n_vocab(t);
		char *tx = malloc(text_len ? text_len : 1);
		int32_t *ids = NULL;
		size_t n = 0;

		if (!tx)
			abort();
		memcpy(tx, text, text_len);
		rc = eng_tokenize(t, tx, text_len, true, &ids, &n);
		if (rc && rc != -ENOMEM && rc != -EINVAL)
			abort();
		for (size_t k = 0; !rc && k < n; k++) {
			char piece[16];

			if (ids[k] < 0 || (uint32_t)ids[k] >= n_vocab ||
			    eng_token_to_piece(t, ids[k], piece, sizeof(piece)) < 0)
				abort();
		}
		free(ids);
		free(tx);
		eng_model_destroy(m);
	}
	free(b.p);
	return 0;
}
