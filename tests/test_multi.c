/*
 * test_multi.c - several sequences in one pass (eng_decode_multi), as the
 * server's scheduler runs them: each sequence's logits are bit-identical to
 * feeding that sequence alone.
 *
 * Bit-identical, not close: the weight matmuls give each row the same sums
 * whatever rows share the pass (matmul.c: vec_dot, vec_dot8 and vec_dot16
 * agree bit for bit), and attention, RoPE and the cache are per row, over
 * the row's own context.
 *
 * For every fixture model (the hybrid and the sliding-window ones among
 * them), with the default batch and a batch of 4 (rings of window + 3 rows):
 * three sequences with prompts of different lengths and fixed continuations
 * are run alone (prompt, then a token at a time); then together, each pass
 * taking a few rows from every sequence that has tokens left -- a prompt's
 * chunk beside another's single tokens, sequences joining late and ending
 * early, the order of the rows and the context whose buffers the pass uses
 * rotating.  Every row whose logits a lone run has must match them.
 *
 * Also refused, with nothing fed: a context of another model, more rows
 * than the first context's batch, a full context (-ENOSPC).
 */
#include "fixture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SEQ 3
#define N_GEN 12
#define MAX_ROWS 8

static const char *const models[] = {
	"models/stories260K.gguf",        "models/tiny-llama-q4_0.gguf",   "models/tiny-llama-q4_k_m.gguf",
	"models/tiny-llama-q8_0.gguf",    "models/tiny-qwen2-q4_k_m.gguf", "arch/models/tiny-qwen3-q4_k_m.gguf",
	"arch/models/tiny-gemma2-q4_k_m.gguf", "arch/models/tiny-gemma3-q8_0.gguf",
	"arch/models/tiny-phi3-q4_k_m.gguf",   "arch/models/tiny-qwen35-q4_k_m.gguf",
	"arch/models/tiny-qwen3moe-q4_k_m.gguf",
};

static const uint32_t n_prompt[N_SEQ] = { 5, 9, 2 };
static const uint32_t start_pass[N_SEQ] = { 0, 1, 3 }; /* when a sequence joins */

static int32_t token(uint32_t s, uint32_t i, uint32_t n_vocab)
{
	return (int32_t)(((i + 31 * s) * 2654435761u + 17 + s) % n_vocab);
}

struct seq {
	int32_t tok[16 + N_GEN];
	uint32_t n, fed;
	float *ref; /* [N_GEN + 1][V]: the logits after tok[n_prompt - 1 + j] */
	struct eng_ctx *c;
};

static void run(const char *name, const struct eng_model *m, uint32_t n_batch)
{
	uint32_t V = eng_model_hparams(m)->n_vocab;
	struct eng_ctx_config cfg = { .n_ctx = 64, .n_threads = 2, .n_batch = n_batch };
	struct seq sq[N_SEQ] = { 0 };
	float *out = malloc((size_t)MAX_ROWS * V * sizeof(float));
	char err[256];
	uint32_t cap;

	for (uint32_t s = 0; s < N_SEQ; s++) {
		struct seq *q = &sq[s];

		q->n = n_prompt[s] + N_GEN;
		for (uint32_t i = 0; i < q->n; i++)
			q->tok[i] = token(s, i, V);
		q->ref = malloc((size_t)(N_GEN + 1) * V * sizeof(float));
		if (eng_ctx_create(m, &cfg, &q->c, err, sizeof(err))) {
			CHECK(0, "%s: %s", name, err);
			goto out;
		}
		/* alone */
		CHECK(eng_decode(q->c, q->tok, n_prompt[s], q->ref, false) == 0, "%s: prompt", name);
		for (uint32_t j = 1; j <= N_GEN; j++)
			CHECK(eng_decode(q->c, &q->tok[n_prompt[s] - 1 + j], 1, q->ref + (size_t)j * V,
					 false) == 0,
			      "%s: token", name);
		eng_ctx_reset(q->c);
	}

	/* together */
	cap = n_batch && n_batch < MAX_ROWS ? n_batch : MAX_ROWS;
	for (uint32_t pass = 0;; pass++) {
		struct eng_ctx *rctx[MAX_ROWS];
		int32_t rtok[MAX_ROWS];
		bool want[MAX_ROWS];
		uint32_t rseq[MAX_ROWS], ridx[MAX_ROWS], n = 0, left = 0;

		for (uint32_t k = 0; k < N_SEQ; k++) {
			uint32_t s = (k + pass) % N_SEQ;
			struct seq *q = &sq[s];
			/* a few rows each: 1, 2 or 3, a prompt up to 4 */
			uint32_t quota = q->fed < n_prompt[s] ? 4 : 1 + (pass + s) % 3;

			if (pass < start_pass[s] || q->fed == q->n)
				continue;
			for (; quota && n < cap && q->fed < q->n; quota--, n++) {
				rctx[n] = q->c;
				rseq[n] = s;
				ridx[n] = q->fed;
				rtok[n] = q->tok[q->fed++];
				want[n] = ridx[n] + 1 >= n_prompt[s];
			}
		}
		for (uint32_t s = 0; s < N_SEQ; s++)
			left += sq[s].n - sq[s].fed;
		if (n == 0 && left == 0)
			break;
		if (n == 0)
			continue;
		int rc = eng_decode_multi(rctx, rtok, want, n, out);

		CHECK(rc == 0, "%s (batch %u): pass %u: %d", name, n_batch, pass, rc);
		if (rc)
			break;
		for (uint32_t r = 0, k = 0; r < n; r++) {
			if (!want[r])
				continue;
			struct seq *q = &sq[rseq[r]];
			uint32_t j = ridx[r] + 1 - n_prompt[rseq[r]];

			CHECK(!memcmp(out + (size_t)k * V, q->ref + (size_t)j * V, V * sizeof(float)),
			      "%s (batch %u): sequence %u's logits after token %u differ from "
			      "its lone run's (pass %u, row %u of %u)",
			      name, n_batch, rseq[r], ridx[r], pass, r, n);
			k++;
		}
	}
	for (uint32_t s = 0; s < N_SEQ; s++)
		CHECK(eng_ctx_n_past(sq[s].c) == sq[s].n, "%s: sequence %u holds %u tokens, not %u",
		      name, s, eng_ctx_n_past(sq[s].c), sq[s].n);

	/* refusals feed nothing */
	{
		struct eng_ctx *two[MAX_ROWS + 1];
		int32_t t[MAX_ROWS + 1] = { 0 };
		uint32_t before = eng_ctx_n_past(sq[0].c);

		for (uint32_t i = 0; i <= MAX_ROWS; i++)
			two[i] = sq[i % 2].c;
		if (n_batch && n_batch < MAX_ROWS + 1)
			CHECK(eng_decode_multi(two, t, NULL, n_batch + 1, NULL) == -EINVAL,
			      "%s: more rows than the batch", name);
		t[1] = (int32_t)V;
		CHECK(eng_decode_multi(two, t, NULL, 2, NULL) == -EINVAL,
		      "%s: a token out of range", name);
		CHECK(eng_ctx_n_past(sq[0].c) == before, "%s: a refused pass fed a token", name);
		/* fill sequence 1 to one short of full: a pass with two of its rows
		 * beside one of sequence 0's must be refused whole */
		struct eng_ctx *full = sq[1].c;
		int32_t pad[64] = { 0 };
		uint32_t room = eng_ctx_n_ctx(full) - eng_ctx_n_past(full);

		CHECK(eng_decode(full, pad, room - 1, NULL, false) == 0, "%s: fill", name);
		two[0] = sq[0].c;
		two[1] = full;
		two[2] = full;
		t[1] = 0;
		if (!n_batch || n_batch >= 3) {
			CHECK(eng_decode_multi(two, t, NULL, 3, NULL) == -ENOSPC,
			      "%s: a full context must be refused", name);
			CHECK(eng_ctx_n_past(sq[0].c) == before &&
				      eng_ctx_n_past(full) == eng_ctx_n_ctx(full) - 1,
			      "%s: a refused pass fed a token", name);
		}
	}
out:
	for (uint32_t s = 0; s < N_SEQ; s++) {
		eng_ctx_destroy(sq[s].c);
		free(sq[s].ref);
	}
	free(out);
}

/* A context of another model is refused. */
static void other_model(const struct eng_model *a, const struct eng_model *b)
{
	struct eng_ctx_config cfg = { .n_ctx = 32, .n_threads = 1 };
	struct eng_ctx *c[2] = { NULL, NULL };
	char err[256];
	int32_t t[2] = { 1, 1 };

	if (eng_ctx_create(a, &cfg, &c[0], err, sizeof(err)) ||
	    eng_ctx_create(b, &cfg, &c[1], err, sizeof(err))) {
		CHECK(0, "%s", err);
	} else {
		CHECK(eng_decode_multi(c, t, NULL, 2, NULL) == -EINVAL,
		      "a context of another model must be refused");
		CHECK(eng_ctx_n_past(c[0]) == 0 && eng_ctx_n_past(c[1]) == 0,
		      "a refused pass fed a token");
	}
	eng_ctx_destroy(c[0]);
	eng_ctx_destroy(c[1]);
}

int main(void)
{
	struct fixture first = { 0 };

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
		if (!first.m) {
			first = f;
			continue;
		}
		if (i == 1)
			other_model(first.m, f.m);
		fixture_close(&f);
	}
	if (first.m)
		fixture_close(&first);
	return failures ? 1 : 0;
}
