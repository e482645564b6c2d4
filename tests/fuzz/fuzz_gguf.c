/*
 * fuzz_gguf.c - libFuzzer harness: the GGUF reader and the model loader
 * (gguf_parse through eng_model_load), and a short decode of whatever loads.
 *
 * The input is a GGUF image.  It is loaded twice:
 *  1. copied into a buffer of exactly its size, so a read one byte past the
 *     end trips AddressSanitizer;
 *  2. followed by PAD bytes of zeros, so that a header whose tensor data lies
 *     beyond the input (the seeds are fixture headers cut where the data
 *     starts: tests/fuzz/make_seeds.py) still loads, and the code after the
 *     structural checks (tensor roles, shapes, the tokenizer, a context, a
 *     forward pass over zero weights) is reached too.
 * A refusal must come with a one-line reason; anything else (a crash, a
 * sanitizer report, a leak, a time-out) is a finding.
 */
#include "engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAD (32u << 20)
#define MAX_INPUT (1u << 20) /* fuzz.sh passes -max_len below this */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *padded; /* MAX_INPUT + PAD, zero except while an input is in */

static void check_refusal(int rc, const char *err)
{
	/* a refusal is -EINVAL, -ENOTSUP or -ENOMEM with one line */
	if (rc >= 0 || !err[0] || strchr(err, '\n'))
		abort();
}

static void load(const uint8_t *img, size_t size, bool run)
{
	struct eng_model *m = NULL;
	char err[256] = "";
	int rc = eng_model_load(img, size, &m, err, sizeof(err));

	if (rc) {
		check_refusal(rc, err);
		return;
	}
	const struct eng_hparams *hp = eng_model_hparams(m);
	const struct eng_tokenizer *t = eng_model_tokenizer(m);
	int32_t *ids = NULL;
	size_t n = 0;

	if (t && eng_tokenize(t, "Once upon a time", 16, true, &ids, &n) == 0) {
		char piece[64];

		for (size_t i = 0; i < n; i++)
			eng_token_to_piece(t, ids[i], piece, sizeof(piece));
	}
	free(ids);
	/* a forward pass over small models only: big ones take too long a run */
	if (run && eng_model_token_bytes(m) < (8u << 20) && hp->n_vocab < (1u << 20)) {
		struct eng_ctx_config cc = { .n_ctx = 8, .n_threads = 1 };
		struct eng_ctx *c = NULL;

		if (eng_ctx_create(m, &cc, &c, err, sizeof(err)) == 0) {
			float *logits = malloc(hp->n_vocab * sizeof(float));
			int32_t toks[2] = { 1, (int32_t)(hp->n_vocab - 1) };

			if (logits)
				eng_decode(c, toks, 2, logits, false);
			free(logits);
			eng_ctx_destroy(c);
		}
	}
	eng_model_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *exact;

	if (size > MAX_INPUT)
		return 0;
	exact = malloc(size ? size : 1);
	if (!exact)
		return 0;
	memcpy(exact, data, size);
	load(exact, size, false);
	free(exact);

	if (!padded) {
		padded = mmap(NULL, MAX_INPUT + PAD, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (padded == MAP_FAILED)
			abort();
	}
	memcpy(padded, data, size);
	load(padded, size + PAD, true);
	memset(padded, 0, size);
	return 0;
}
