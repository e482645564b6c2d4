/*
 * llama_logits.c - the reference engine's logits for a fixture's tokens, to
 * see how much its own builds disagree with each other.
 *
 * Not part of the meson build: it links against a llama.cpp build (the
 * fixtures' references came from llama.cpp, docs/design.md).  Build and run:
 *
 *   cc -O2 -I$LLAMA/include -I$LLAMA/ggml/include tools/llama_logits.c \
 *      -L$LLAMA/build-avx2/bin -lllama -lggml -lggml-base \
 *      -Wl,-rpath,$LLAMA/build-avx2/bin -o /tmp/llama_logits
 *   /tmp/llama_logits [--no-repack] MODEL TOKENS OUT
 *
 * TOKENS is a comma-separated list (the fixture JSON's prompt_tokens then
 * greedy_tokens); the tokens are fed one at a time, as the references were
 * made (2 threads, flash attention off), and OUT gets one row of n_vocab
 * little-endian floats after each, as `strata eval --logits-out` does.
 * tools/ref-spread.py compares the rows.
 */
#include <llama.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
	(void)user;
	if (level >= GGML_LOG_LEVEL_ERROR)
		fputs(text, stderr);
}

int main(int argc, char **argv)
{
	int repack = 1, argi = 1;

	if (argc > 1 && !strcmp(argv[1], "--no-repack")) {
		repack = 0;
		argi++;
	}
	if (argc - argi != 3) {
		fprintf(stderr, "usage: llama_logits [--no-repack] MODEL TOKENS OUT\n");
		return 2;
	}
	const char *path = argv[argi], *list = argv[argi + 1], *out_path = argv[argi + 2];
	int32_t toks[4096];
	int n = 0;

	for (const char *p = list; *p && n < 4096;) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p) {
			fprintf(stderr, "llama_logits: bad token list at '%s'\n", p);
			return 2;
		}
		toks[n++] = (int32_t)v;
		p = *end == ',' ? end + 1 : end;
	}
	llama_log_set(quiet, NULL);
	llama_backend_init();

	struct llama_model_params mp = llama_model_default_params();
	mp.use_extra_bufts = repack;
	struct llama_model *model = llama_model_load_from_file(path, mp);
	if (!model) {
		fprintf(stderr, "llama_logits: cannot load %s\n", path);
		return 2;
	}
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = 512;
	cp.n_batch = 512;
	cp.n_threads = 2;
	cp.n_threads_batch = 2;
	cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
	struct llama_context *ctx = llama_init_from_model(model, cp);
	if (!ctx) {
		fprintf(stderr, "llama_logits: cannot create a context\n");
		return 2;
	}
	const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
	FILE *out = fopen(out_path, "wb");
	if (!out) {
		perror(out_path);
		return 2;
	}
	for (int i = 0; i < n; i++) {
		if (llama_decode(ctx, llama_batch_get_one(&toks[i], 1))) {
			fprintf(stderr, "llama_logits: decode failed at token %d\n", i);
			return 1;
		}
		if (fwrite(llama_get_logits_ith(ctx, -1), sizeof(float), (size_t)n_vocab, out) !=
		    (size_t)n_vocab) {
			perror(out_path);
			return 1;
		}
	}
	fclose(out);
	llama_free(ctx);
	llama_model_free(model);
	return 0;
}
