/*
 * test_undo.c - undoing tokens (eng_ctx_truncate), as speculative decoding
 * uses it: a run that feeds drafts, keeps some and forgets the rest gives
 * bit-identical logits to a run that fed only the kept tokens.
 *
 * For every fixture model (the older ones and fixtures/arch, the hybrid and
 * the sliding-window models among them), with the default batch and with
 * a batch of 4 (rings of window + 3 rows, so undoing past them would read
 * overwritten rows):
 *
 *   plain   a prompt, then a fixed sequence of tokens one at a time: the
 *           logits after each;
 *   drafts  the same prompt, then at each step a checkpoint and one pass
 *           over the next real token, the next few real ones (the accepted
 *           draft) and some wrong ones (the rejected rest), every row's
 *           logits; truncate to the kept tokens; go on.
 *
 * The kept rows must equal plain's bit for bit.  Also: truncating further
 * back than the checkpoint allows (on models that need one) fails with
 * -EINVAL and changes nothing.
 */
#include "fixture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPT 6
#define N_GEN 24
#define UNDO_ROWS 8

static const char *const models[] = {
	"models/stories260K.gguf",        "models/tiny-llama-q4_0.gguf",   "models/tiny-llama-q4_k_m.gguf",
	"models/tiny-llama-q8_0.gguf",    "models/tiny-qwen2-q4_k_m.gguf", "arch/models/tiny-qwen3-q4_k_m.gguf",
	"arch/models/tiny-gemma2-q4_k_m.gguf", "arch/models/tiny-gemma3-q8_0.gguf",
	"arch/models/tiny-phi3-q4_k_m.gguf",   "arch/models/tiny-qwen35-q4_k_m.gguf",
};

static int32_t token(uint32_t i, uint32_t n_vocab)
{
	return (int32_t)((i * 2654435761u + 17) % n_vocab);
}

static void run(const char *name, const struct eng_model *m, uint32_t n_batch)
{
	const struct eng_hparams *hp = eng_model_hparams(m);
	uint32_t V = hp->n_vocab;
	struct eng_ctx_config cfg = { .n_ctx = 128, .n_threads = 2, .n_batch = n_batch };
	struct eng_ctx *c;
	char err[256];
	int32_t seq[N_PROMPT + N_GEN];
	float *plain = malloc((size_t)N_GEN * V * sizeof(float));
	float *rows = malloc((size_t)(UNDO_ROWS) * V * sizeof(float));

	for (uint32_t i = 0; i < N_PROMPT + N_GEN; i++)
		seq[i] = token(i, V);
	if (eng_ctx_create(m, &cfg, &c, err, sizeof(err))) {
		CHECK(0, "%s: %s", name, err);
		goto out;
	}
	/* plain: the prompt, then one token at a time (row i: after seq[N_PROMPT + i]) */
	CHECK(eng_decode(c, seq, N_PROMPT, NULL, false) == 0, "%s: prompt", name);
	for (uint32_t i = 0; i < N_GEN; i++)
		CHECK(eng_decode(c, &seq[N_PROMPT + i], 1, plain + (size_t)i * V, false) == 0,
		      "%s: token %u", name, i);

	/* drafts: pass p feeds 1 + keep real tokens and `wrong` others */
	eng_ctx_reset(c);
	CHECK(eng_decode(c, seq, N_PROMPT, NULL, false) == 0, "%s: prompt", name);
	uint32_t i = 0, pass = 0;
	while (i < N_GEN) {
		uint32_t keep = pass % 4, wrong = (pass * 3 + 1) % 4;
		uint32_t n_real = 1 + keep, n, undo = eng_ctx_undo_max(c);
		int32_t batch[UNDO_ROWS];

		if (n_real > N_GEN - i)
			n_real = N_GEN - i;
		n = n_real + wrong;
		if (n > undo)
			n = undo, n_real = n_real < n ? n_real : n;
		for (uint32_t j = 0; j < n; j++)
			/* wrong ones may run past the sequence: token() is the
			 * same function seq was made with */
			batch[j] = j < n_real ? seq[N_PROMPT + i + j]
					      : (token(N_PROMPT + i + j, V) + 1 + (int32_t)j) %
							(int32_t)V;
		eng_ctx_checkpoint(c);
		uint32_t at = eng_ctx_n_past(c);
		CHECK(eng_decode(c, batch, n, rows, true) == 0, "%s: pass %u", name, pass);
		for (uint32_t j = 0; j < n_real; j++)
			CHECK(!memcmp(rows + (size_t)j * V, plain + (size_t)(i + j) * V,
				      V * sizeof(float)),
			      "%s (batch %u): token %u's logits after undoing differ from the "
			      "plain run's",
			      name, n_batch, i + j);
		CHECK(eng_ctx_truncate(c, at + n_real) == 0, "%s: truncate", name);
		CHECK(eng_ctx_n_past(c) == at + n_real, "%s: n_past", name);
		i += n_real;
		pass++;
	}
	if (eng_ctx_undo_max(c) < eng_ctx_n_ctx(c)) {
		uint32_t at = eng_ctx_n_past(c);

		eng_ctx_checkpoint(c);
		CHECK(eng_ctx_truncate(c, at - 1) == -EINVAL,
		      "%s: truncating before the checkpoint must fail", name);
		CHECK(eng_ctx_n_past(c) == at, "%s: a failed truncate moved n_past", name);
	}
	CHECK(eng_ctx_truncate(c, eng_ctx_n_past(c) + 1) == -EINVAL,
	      "%s: truncating forward must fail", name);
	eng_ctx_destroy(c);
out:
	free(plain);
	free(rows);
}

int main(void)
{
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		struct fixture f;
		int rc = fixture_open(models[i], &f);

		if (!rc)
			return 77;
		if (rc < 0)
			continue;
		run(models[i], f.m, 0);
		run(models[i], f.m, 4);
		printf("ok %s\n", models[i]);
		fixture_close(&f);
	}
	return failures ? 1 : 0;
}
