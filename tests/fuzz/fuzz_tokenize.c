/*
 * fuzz_tokenize.c - libFuzzer harness: arbitrary bytes through the tokenizers
 * of real vocabularies (the fixtures' ggml-vocab-*.gguf), both ways.
 *
 * Input: one byte choosing the vocabulary (its index in VOCABS, modulo their
 * number), then the text: any bytes, invalid UTF-8 included.  The text is
 * tokenized with and without BOS; every id must be in range and turn back into
 * a piece; a few ids taken from the input's bytes (in range or not) go
 * through eng_token_to_piece with a small buffer.
 *
 * The vocabularies are loaded once, at the first input, from the fixtures
 * directory (STRATA_FIXTURES, or the one the build was configured with).
 */
#include "engine.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FIXTURES
#define FIXTURES "../shared/fixtures"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* make_seeds.py writes seeds in this order */
static const char *const VOCABS[] = { "llama-spm", "gpt-2", "phi-3", "deepseek-coder", "falcon",
				      "starcoder", "mpt", "refact", "deepseek-llm" };
#define N_VOCABS (sizeof(VOCABS) / sizeof(VOCABS[0]))

static struct eng_model *models[N_VOCABS];

static void load_all(void)
{
	const char *dir = getenv("STRATA_FIXTURES");

	if (!dir)
		dir = FIXTURES;
	for (size_t i = 0; i < N_VOCABS; i++) {
		char path[4096], err[256];
		const void *base;
		size_t size;

		snprintf(path, sizeof(path), "%s/vocab/ggml-vocab-%s.gguf", dir, VOCABS[i]);
		if (eng_map_file(path, &base, &size) ||
		    eng_model_load_vocab(base, size, &models[i], err, sizeof(err))) {
			fprintf(stderr, "fuzz_tokenize: cannot load %s\n", path);
			exit(2);
		}
		/* mapped for the life of the process */
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct eng_tokenizer *t;
	uint32_t n_vocab;
	char *text;

	if (!models[0])
		load_all();
	if (size < 1)
		return 0;
	t = eng_model_tokenizer(models[data[0] % N_VOCABS]);
	n_vocab = eng_tokenizer_n_vocab(t);
	/* exactly the text's bytes, so an over-read is seen */
	text = malloc(size - 1 ? size - 1 : 1);
	if (!text)
		return 0;
	memcpy(text, data + 1, size - 1);
	for (int bos = 0; bos < 2; bos++) {
		int32_t *ids = NULL;
		size_t n = 0;
		char piece[8];

		if (eng_tokenize(t, text, size - 1, bos, &ids, &n))
			abort(); /* any bytes tokenize */
		for (size_t i = 0; i < n; i++) {
			if (ids[i] < 0 || (uint32_t)ids[i] >= n_vocab)
				abort();
			if (eng_token_to_piece(t, ids[i], piece, sizeof(piece)) < 0)
				abort();
		}
		free(ids);
	}
	for (size_t i = 1; i + 4 <= size && i < 64; i += 4) {
		int32_t id;
		char piece[3];

		memcpy(&id, data + i, 4);
		int r = eng_token_to_piece(t, id, piece, sizeof(piece));

		if ((id < 0 || (uint32_t)id >= n_vocab) != (r < 0))
			abort();
	}
	free(text);
	return 0;
}
