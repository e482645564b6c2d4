/*
 * chat.c - `strata chat`: an interactive chat prompt.  Each line typed is a
 * user message; the whole conversation goes through the chat template
 * (template.c) and the model's answer is printed token by token.  /reset
 * forgets the conversation, /exit (or end of input) ends the program;
 * Ctrl-C stops the answer being printed, not the program.
 *
 * The context keeps the tokens of the conversation so far; each turn feeds
 * only what the newly rendered conversation adds after the tokens it still
 * shares (re-tokenizing an answer can split it otherwise: then the context
 * starts over from the whole conversation).
 *
 * One thread; SIGINT only sets a flag the generation loop reads.
 */
#include "cli.h"
#include "template.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

struct history {
	struct chat_msg *m;
	char **own; /* the texts, owned */
	size_t n, cap;
};

static int history_add(struct history *h, const char *role, const char *text, size_t len)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? 2 * h->cap : 16;
		struct chat_msg *m = realloc(h->m, cap * sizeof(*m));
		char **own;

		if (!m)
			return -ENOMEM;
		h->m = m;
		own = realloc(h->own, cap * sizeof(*own));
		if (!own)
			return -ENOMEM;
		h->own = own;
		h->cap = cap;
	}
	h->own[h->n] = strndup(text, len);
	if (!h->own[h->n])
		return -ENOMEM;
	h->m[h->n] = (struct chat_msg){ role, h->own[h->n] };
	h->n++;
	return 0;
}

static void history_clear(struct history *h)
{
	for (size_t i = 0; i < h->n; i++)
		free(h->own[i]);
	h->n = 0;
}

static void special_text(const struct eng_tokenizer *t, int32_t id, char *buf, size_t n)
{
	buf[0] = 0;
	if (id >= 0)
		(void)!eng_token_to_piece(t, id, buf, n);
}

int cmd_chat(int argc, char **argv)
{
	struct opts o;
	struct session s;
	struct history h = { 0 };
	struct eng_sampler *sm = NULL;
	struct sigaction sa = { .sa_handler = on_sigint };
	char bos[64], eos[64], *line = NULL, *answer = NULL;
	size_t line_cap = 0, ans_len = 0, ans_cap = 0;
	int32_t *fed = NULL, turn_end = -1;
	size_t n_fed = 0;
	float *logits = NULL;
	int kind, rc = parse_opts(argc, argv, "chat", &o);
	enum tmpl_kind k;

	if (rc)
		return rc;
	rc = session_open(&s, &o, true);
	if (!rc)
		rc = session_template(&s, &o, &kind);
	if (rc)
		goto out;
	k = (enum tmpl_kind)kind;
	special_text(s.tok, eng_tokenizer_bos(s.tok), bos, sizeof(bos));
	special_text(s.tok, eng_tokenizer_eos(s.tok), eos, sizeof(eos));
	if (tmpl_turn_end(k)) {
		int32_t *ids;
		size_t n;

		if (!eng_tokenize_special(s.tok, tmpl_turn_end(k), strlen(tmpl_turn_end(k)), false,
					  &ids, &n)) {
			if (n == 1)
				turn_end = ids[0];
			free(ids);
		}
	}
	logits = malloc((size_t)s.hp->n_vocab * sizeof(float));
	fed = malloc((size_t)eng_ctx_n_ctx(s.ctx) * sizeof(*fed));
	if (!logits || !fed || eng_sampler_create(&o.samp, s.hp->n_vocab, &sm)) {
		msg("out of memory");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	/* Ctrl-C interrupts a read or the generation; it does not end us */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	msg("chat template %s; /reset forgets the conversation, /exit ends; Ctrl-C stops an "
	    "answer", tmpl_name(k));

	for (;;) {
		ssize_t len;
		char *text;
		int32_t *ids;
		size_t n_ids, p;
		long n_gen = 0;
		int32_t t;

		fputs("> ", stdout);
		fflush(stdout);
		interrupted = 0;
		errno = 0;
		len = getline(&line, &line_cap, stdin);
		if (len < 0) {
			if (errno == EINTR) { /* Ctrl-C at the prompt: a new prompt */
				clearerr(stdin);
				fputc('\n', stdout);
				continue;
			}
			fputc('\n', stdout);
			break;
		}
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = 0;
		if (!strcmp(line, "/exit"))
			break;
		if (!strcmp(line, "/reset")) {
			history_clear(&h);
			eng_ctx_reset(s.ctx);
			n_fed = 0;
			printf("(the conversation is forgotten)\n");
			continue;
		}
		if (len == 0)
			continue;
		if (history_add(&h, "user", line, (size_t)len)) {
			msg("out of memory");
			rc = EXIT_BAD_INPUT;
			break;
		}
		text = tmpl_render(k, h.m, h.n, true, bos, eos);
		if (!text || eng_tokenize_special(s.tok, text, strlen(text), true, &ids, &n_ids)) {
			free(text);
			msg("out of memory");
			rc = EXIT_BAD_INPUT;
			break;
		}
		free(text);
		if (n_ids >= eng_ctx_n_ctx(s.ctx)) {
			free(ids);
			h.n--;
			free(h.own[h.n]);
			printf("(the conversation does not fit the context of %u tokens: /reset "
			       "starts over)\n", eng_ctx_n_ctx(s.ctx));
			continue;
		}
		/* feed what the context does not hold yet */
		for (p = 0; p < n_fed && p < n_ids && fed[p] == ids[p]; p++)
			;
		if (p < n_fed && eng_ctx_truncate(s.ctx, (uint32_t)p)) {
			eng_ctx_reset(s.ctx);
			p = 0;
		}
		if (p == n_ids) { /* all of it held: feed the last again for its logits */
			p--;
			if (eng_ctx_truncate(s.ctx, (uint32_t)p)) {
				eng_ctx_reset(s.ctx);
				p = 0;
			}
		}
		memcpy(fed + p, ids + p, (n_ids - p) * sizeof(*fed));
		n_fed = n_ids;
		rc = session_decode(&s, ids + p, n_ids - p, logits, false);
		free(ids);
		if (rc) {
			msg("decoding the prompt failed: %s", strerror(-rc));
			rc = EXIT_BAD_INPUT;
			break;
		}
		/* the answer, token by token */
		ans_len = 0;
		for (;;) {
			char piece[256];
			int n;

			if (interrupted) {
				printf("\n(stopped)");
				break;
			}
			t = eng_sample(sm, logits);
			if (eng_tokenizer_is_eog(s.tok, t) || t == turn_end)
				break;
			n = eng_token_to_piece(s.tok, t, piece, sizeof(piece));
			if (n > 0) {
				size_t m = (size_t)n < sizeof(piece) ? (size_t)n : sizeof(piece);

				fwrite(piece, 1, m, stdout);
				fflush(stdout);
				if (ans_len + m + 1 > ans_cap) {
					size_t cap = ans_cap ? ans_cap * 2 : 1024;
					char *a;

					while (cap < ans_len + m + 1)
						cap *= 2;
					a = realloc(answer, cap);
					if (!a)
						break;
					answer = a;
					ans_cap = cap;
				}
				memcpy(answer + ans_len, piece, m);
				ans_len += m;
			}
			if (++n_gen >= o.n_predict && o.seen_n)
				break;
			if (n_fed + 1 >= eng_ctx_n_ctx(s.ctx)) {
				printf("\n(the context of %u tokens is full: /reset starts over)",
				       eng_ctx_n_ctx(s.ctx));
				break;
			}
			rc = session_decode(&s, &t, 1, logits, false);
			if (rc) {
				msg("decoding failed: %s", strerror(-rc));
				break;
			}
			fed[n_fed++] = t;
		}
		rc = 0;
		fputc('\n', stdout);
		if (history_add(&h, "assistant", answer ? answer : "", ans_len)) {
			msg("out of memory");
			rc = EXIT_BAD_INPUT;
			break;
		}
	}
out:
	history_clear(&h);
	free(h.m);
	free(h.own);
	free(line);
	free(answer);
	free(fed);
	free(logits);
	eng_sampler_destroy(sm);
	session_close(&s);
	return rc;
}
