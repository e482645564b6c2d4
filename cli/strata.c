/*
 * strata.c - the `strata` command: run, eval, tokenize, and the dispatch to
 * every sub-command (bench in bench.c).
 *
 * The command line is a stable interface that scripts and later issues use.
 * Messages go to stderr and start with "strata: "; exit status is 0 on
 * success, 1 for a usage error, 2 for a bad model or bad input.  What the
 * sub-commands share is in cli.h: the options (opts.c) and the loaded model
 * (session.c).
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * The context is full.  Without --context-shift that is the end, said in one
 * line.  With it, as llama.cpp's: keep the first --keep tokens (plus BOS; -1
 * or more than the prompt: the whole prompt), forget half of the rest, the
 * oldest, and go on.  Returns whether generation may go on.
 */
static bool shift_context(struct session *s, const struct opts *o, size_t n_prompt)
{
	uint32_t n_ctx = eng_ctx_n_ctx(s->ctx), n_past = eng_ctx_n_past(s->ctx);
	uint64_t keep = o->keep < 0 || (uint64_t)o->keep > n_prompt
				? n_prompt
				: (uint64_t)o->keep + eng_tokenizer_adds_bos(s->tok);
	uint32_t n_keep = keep < n_past ? (uint32_t)keep : n_past;
	uint32_t n_discard = (n_past - n_keep) / 2;
	int rc;

	if (!o->context_shift) {
		msg("context of %u tokens is full: generation stopped (--context-shift goes on)",
		    n_ctx);
		return false;
	}
	if (n_discard == 0) {
		msg("context of %u tokens is full and --keep %ld keeps all of it: generation stopped",
		    n_ctx, o->keep);
		return false;
	}
	rc = s->spec ? eng_spec_shift(s->spec, n_keep, n_discard)
		     : eng_ctx_shift(s->ctx, n_keep, n_discard);
	if (rc == -ENOTSUP) {
		msg("context of %u tokens is full: generation stopped (%s has recurrent layers, "
		    "whose state cannot forget tokens)",
		    n_ctx, s->hp->arch_name);
		return false;
	}
	if (rc) {
		msg("context of %u tokens is full and could not be shifted: %s", n_ctx,
		    strerror(-rc));
		return false;
	}
	return true;
}

static int cmd_run(int argc, char **argv)
{
	struct opts o;
	struct session s;
	struct eng_sampler *sm = NULL;
	char *text = NULL;
	size_t text_len = 0;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	float *logits = NULL;
	int rc = parse_opts(argc, argv, "run", &o);
	double t0, t1, t2;
	long generated = 0;

	if (rc)
		return rc;
	if (o.prompt && o.prompt_file)
		return usage("run: give -p or -f, not both");
	if (o.prompt_file) {
		FILE *f = fopen(o.prompt_file, "rb");

		if (!f) {
			msg("%s: %s", o.prompt_file, strerror(errno));
			return EXIT_BAD_INPUT;
		}
		text = read_all(f, &text_len);
		fclose(f);
		if (!text) {
			msg("%s: cannot read the prompt", o.prompt_file);
			return EXIT_BAD_INPUT;
		}
	} else {
		text = strdup(o.prompt ? o.prompt : "");
		text_len = strlen(text);
	}
	rc = session_open(&s, &o, true);
	if (rc)
		goto out;
	if (eng_tokenize(s.tok, text, text_len, true, &ids, &n_ids) || n_ids == 0) {
		msg("%s: the prompt gives no tokens to start from", o.model);
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (n_ids >= eng_ctx_n_ctx(s.ctx)) {
		msg("prompt of %zu tokens does not fit the context of %u", n_ids,
		    eng_ctx_n_ctx(s.ctx));
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	logits = malloc((size_t)s.hp->n_vocab * sizeof(float));
	if (!logits || eng_sampler_create(&o.samp, s.hp->n_vocab, &sm)) {
		msg("out of memory");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	t0 = now_s();
	if (s.spec ? eng_spec_feed(s.spec, ids, n_ids, logits)
		   : session_decode(&s, ids, n_ids, logits, false)) {
		msg("%s: prompt evaluation failed", o.model);
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	t1 = now_s();
	/* next[i..n): tokens chosen, to print; all but the last are fed (the
	 * drafts a pass accepted), the last is fed by the next pass */
	int32_t next[32];
	uint32_t n_next = 1, i_next = 0;

	next[0] = eng_sample(sm, logits);
	while (generated < o.n_predict) {
		int32_t t = next[i_next++];

		if (eng_tokenizer_is_eog(s.tok, t))
			break;
		print_piece(s.tok, t);
		fflush(stdout);
		generated++;
		if (generated == o.n_predict || i_next < n_next)
			continue;
		if (eng_ctx_n_past(s.ctx) >= eng_ctx_n_ctx(s.ctx) && !shift_context(&s, &o, n_ids))
			break;
		i_next = 0;
		if ((rc = session_step(&s, sm, t, logits, next, &n_next))) {
			msg("%s: decoding failed", o.model);
			rc = EXIT_BAD_INPUT;
			goto out;
		}
	}
	t2 = now_s();
	/* End the line for a person; keep piped output exactly the text. */
	if (isatty(STDOUT_FILENO))
		fputc('\n', stdout);
	fflush(stdout);
	fprintf(stderr,
		"strata: prompt %zu tokens in %.3f s (%.2f tok/s), generated %ld tokens in %.3f s "
		"(%.2f tok/s), peak RSS %.1f MiB\n",
		n_ids, t1 - t0, n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9), generated, t2 - t1,
		generated / (t2 - t1 > 0 ? t2 - t1 : 1e-9), peak_rss_bytes() / 1048576.0);
	if (s.spec) {
		char line[200];

		msg("speculation: %s", spec_summary(&s, line, sizeof(line)));
	}
out:
	free(logits);
	free(ids);
	free(text);
	eng_sampler_destroy(sm);
	session_close(&s);
	return rc;
}

/* "1,2,3" -> ids; every id must be an integer in [0, n_vocab). */
static int parse_token_list(const char *list, uint32_t n_vocab, int32_t **ids, size_t *n)
{
	size_t cap = 1;
	const char *p;
	int32_t *v;

	for (p = list; *p; p++)
		cap += *p == ',';
	v = calloc(cap, sizeof(*v));
	if (!v)
		return -ENOMEM;
	*n = 0;
	p = list;
	for (;;) {
		char *end;
		long x;

		errno = 0;
		x = strtol(p, &end, 10);
		if (end == p || errno || x < 0 || x >= (long)n_vocab ||
		    (*end != ',' && *end != '\0')) {
			msg("--tokens: '%.*s' is not a token id below %u", (int)strcspn(p, ","), p,
			    n_vocab);
			free(v);
			return -EINVAL;
		}
		v[(*n)++] = (int32_t)x;
		if (*end == '\0')
			break;
		p = end + 1;
	}
	*ids = v;
	return 0;
}

static int cmd_eval(int argc, char **argv)
{
	struct opts o;
	struct session s;
	int32_t *ids = NULL;
	size_t n = 0;
	float *logits = NULL;
	FILE *f = NULL;
	int rc = parse_opts(argc, argv, "eval", &o);

	if (rc)
		return rc;
	if (!o.tokens || !o.logits_out)
		return usage("eval: --tokens and --logits-out are required");
	rc = session_open(&s, &o, true);
	if (rc)
		goto out;
	if (parse_token_list(o.tokens, s.hp->n_vocab, &ids, &n)) {
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (n > eng_ctx_n_ctx(s.ctx)) {
		msg("%zu tokens do not fit the context of %u (use -c)", n, eng_ctx_n_ctx(s.ctx));
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	logits = malloc(n * (size_t)s.hp->n_vocab * sizeof(float));
	if (!logits) {
		msg("out of memory");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (session_decode(&s, ids, n, logits, true)) {
		msg("%s: evaluation failed", o.model);
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	f = fopen(o.logits_out, "wb");
	if (!f || fwrite(logits, sizeof(float) * s.hp->n_vocab, n, f) != n || fclose(f)) {
		msg("%s: cannot write logits: %s", o.logits_out, strerror(errno));
		f = NULL;
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	f = NULL;
out:
	if (f)
		fclose(f);
	free(logits);
	free(ids);
	session_close(&s);
	return rc;
}

static int cmd_tokenize(int argc, char **argv)
{
	struct opts o;
	struct session s;
	char *text = NULL;
	size_t len = 0;
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = parse_opts(argc, argv, "tokenize", &o);

	if (rc)
		return rc;
	rc = session_open(&s, &o, false);
	if (rc)
		return rc;
	if (o.text) {
		text = strdup(o.text);
		len = strlen(o.text);
	} else {
		text = read_all(stdin, &len);
	}
	if (!text) {
		msg("cannot read the text");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (eng_tokenize(s.tok, text, len, !o.no_bos, &ids, &n)) {
		msg("tokenization failed");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		printf(i ? " %" PRId32 : "%" PRId32, ids[i]);
	printf("\n");
out:
	free(ids);
	free(text);
	session_close(&s);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{ "run", cmd_run },
		{ "eval", cmd_eval },
		{ "tokenize", cmd_tokenize },
		{ "bench", cmd_bench },
		{ "serve", cmd_serve },
		{ "chat", cmd_chat },
	};

	if (argc < 2)
		return usage("no command given");
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		fputs(usage_text, stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(argv[1], cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	char why[128];
	snprintf(why, sizeof(why), "unknown command '%.40s'", argv[1]);
	return usage(why);
}
