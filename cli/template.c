/*
 * template.c - chat templates: turning a conversation (system, user and
 * assistant messages) into the text a chat model was trained on.
 *
 * A GGUF carries its template as Jinja source (tokenizer.chat_template).
 * strata does not run Jinja: like the reference engine's built-in templates
 * it recognizes the few families nearly every model uses by substrings only
 * their templates contain, and renders each family in C.  What each family
 * renders is checked against the text the families' own templates produce
 * (tests/data/chat-templates.json, cases from the reference engine's
 * template tests).  Where a template refuses a system message (Gemma,
 * Mistral's [INST] without <<SYS>>), the system text goes before the first
 * user message, as the reference engine does.
 *
 * The rendered text holds the special tokens as text (<|im_start|>...): it
 * must be tokenized with eng_tokenize_special.  BOS is not written at the
 * start: the tokenizer adds it; eos and bos between turns (Llama 2,
 * Mistral) are written as the vocabulary's texts for them.
 *
 * No state; every function is safe from any thread.
 */
#include "template.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[TMPL_COUNT] = {
	[TMPL_CHATML] = "chatml", [TMPL_LLAMA3] = "llama3", [TMPL_LLAMA2] = "llama2",
	[TMPL_MISTRAL] = "mistral", [TMPL_GEMMA] = "gemma", [TMPL_PHI3] = "phi3",
};

/* the text that ends a turn of the assistant: generation stops at it */
static const char *const turn_end[TMPL_COUNT] = {
	[TMPL_CHATML] = "<|im_end|>", [TMPL_LLAMA3] = "<|eot_id|>", [TMPL_LLAMA2] = NULL,
	[TMPL_MISTRAL] = NULL,        [TMPL_GEMMA] = "<end_of_turn>", [TMPL_PHI3] = "<|end|>",
};

const char *tmpl_name(enum tmpl_kind k)
{
	return (unsigned)k < TMPL_COUNT ? names[k] : "?";
}

const char *tmpl_names(void)
{
	return "chatml, llama3, llama2, mistral, gemma, phi3";
}

int tmpl_parse(const char *name, enum tmpl_kind *out)
{
	for (unsigned k = 0; k < TMPL_COUNT; k++)
		if (!strcmp(name, names[k])) {
			*out = (enum tmpl_kind)k;
			return 0;
		}
	return -EINVAL;
}

const char *tmpl_turn_end(enum tmpl_kind k)
{
	return (unsigned)k < TMPL_COUNT ? turn_end[k] : NULL;
}

int tmpl_detect(const char *src, enum tmpl_kind *out)
{
	if (!src)
		return -ENOENT;
	if (strstr(src, "<|im_start|>"))
		*out = TMPL_CHATML;
	else if (strstr(src, "<|start_header_id|>") && strstr(src, "<|end_header_id|>"))
		*out = TMPL_LLAMA3;
	else if (strstr(src, "<start_of_turn>"))
		*out = TMPL_GEMMA;
	else if (strstr(src, "<|assistant|>") && strstr(src, "<|end|>"))
		*out = TMPL_PHI3;
	else if (strstr(src, "[INST]"))
		*out = strstr(src, "<<SYS>>") ? TMPL_LLAMA2 : TMPL_MISTRAL;
	else
		return -ENOENT;
	return 0;
}

/* ---- a growing string --------------------------------------------------- */

struct buf {
	char *p;
	size_t n, cap;
	bool oom;
};

static void put_n(struct buf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;

		while (cap < b->n + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void put(struct buf *b, const char *s)
{
	put_n(b, s, strlen(s));
}

/* s without leading and trailing white space (Jinja's trim / strip) */
static void put_trim(struct buf *b, const char *s)
{
	size_t n = strlen(s);

	while (n && isspace((unsigned char)*s))
		s++, n--;
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	put_n(b, s, n);
}

/* ---- the families --------------------------------------------------------- */

/*
 * Each renders every message, then the start of the assistant's turn when
 * add_assistant.  sys: the leading system message's text for the families
 * that fold it into the first user message (NULL: none), msgs the rest.
 */
char *tmpl_render(enum tmpl_kind k, const struct chat_msg *msgs, size_t n, bool add_assistant,
		  const char *bos, const char *eos)
{
	struct buf b = { 0 }, sysb = { 0 };
	const char *sys = NULL;
	bool first_user = true;
	/* the families with no system turn fold system messages into the next
	 * user turn: the leading one as their templates do, a later one (which
	 * their templates drop or refuse) the same way, never lost */
	const bool fold = k == TMPL_LLAMA2 || k == TMPL_MISTRAL || k == TMPL_GEMMA;

	bos = bos ? bos : "";
	eos = eos ? eos : "";
	put(&b, "");
	for (size_t i = 0; i < n; i++) {
		const char *role = msgs[i].role, *c = msgs[i].content;
		bool user = !strcmp(role, "user"), asst = !strcmp(role, "assistant");

		if (fold && !strcmp(role, "system")) { /* pending, joined by \n */
			if (sys)
				put(&sysb, "\n");
			put(&sysb, c);
			sys = sysb.p ? sysb.p : "";
			continue;
		}
		switch (k) {
		case TMPL_CHATML:
			put(&b, "<|im_start|>");
			put(&b, role);
			put(&b, "\n");
			put(&b, c);
			put(&b, "<|im_end|>\n");
			break;
		case TMPL_LLAMA3:
			put(&b, "<|start_header_id|>");
			put(&b, role);
			put(&b, "<|end_header_id|>\n\n");
			put_trim(&b, c);
			put(&b, "<|eot_id|>");
			break;
		case TMPL_LLAMA2:
			/* bos + '[INST] ' + content.strip() + ' [/INST]', the
			 * system as <<SYS>> in the first; ' ' + strip + ' ' + eos */
			if (user) {
				struct buf u = { 0 };

				if (!first_user)
					put(&b, bos);
				put(&b, "[INST] ");
				if (sys) {
					put(&u, "<<SYS>>\n");
					put(&u, sys);
					put(&u, "\n<</SYS>>\n\n");
				}
				put(&u, c);
				if (u.oom)
					b.oom = true;
				else
					put_trim(&b, u.p ? u.p : "");
				free(u.p);
				put(&b, " [/INST]");
				first_user = false;
				sys = NULL;
				sysb.n = 0;
			} else if (asst) {
				put(&b, " ");
				put_trim(&b, c);
				put(&b, " ");
				put(&b, eos);
			}
			break;
		case TMPL_MISTRAL:
			if (user) {
				put(&b, "[INST] ");
				if (sys) {
					put(&b, sys);
					put(&b, "\n");
				}
				put(&b, c);
				put(&b, " [/INST]");
				first_user = false;
				sys = NULL;
				sysb.n = 0;
			} else if (asst) {
				put(&b, c);
				put(&b, eos);
			}
			break;
		case TMPL_GEMMA:
			put(&b, "<start_of_turn>");
			put(&b, asst ? "model" : role);
			put(&b, "\n");
			if (user && sys) {
				struct buf u = { 0 };

				put(&u, sys);
				put(&u, "\n");
				put(&u, c);
				if (u.oom)
					b.oom = true;
				else
					put_trim(&b, u.p ? u.p : "");
				free(u.p);
				sys = NULL;
				sysb.n = 0;
			} else {
				put_trim(&b, c);
			}
			if (user)
				first_user = false;
			put(&b, "<end_of_turn>\n");
			break;
		case TMPL_PHI3:
			put(&b, "<|");
			put(&b, role);
			put(&b, "|>\n");
			put(&b, c);
			put(&b, "<|end|>\n");
			break;
		default:
			free(b.p);
			return NULL;
		}
	}
	/* a system message and no user message after it: it still goes in, as
	 * the prefix of an empty one */
	if (sys) {
		const struct chat_msg two[2] = { { "system", sys }, { "user", "" } };
		char *rest = tmpl_render(k, two, 2, false, bos, eos);

		if (!rest)
			b.oom = true;
		else
			put(&b, rest);
		free(rest);
	}
	if (add_assistant) {
		switch (k) {
		case TMPL_CHATML:
			put(&b, "<|im_start|>assistant\n");
			break;
		case TMPL_LLAMA3:
			put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
			break;
		case TMPL_GEMMA:
			put(&b, "<start_of_turn>model\n");
			break;
		case TMPL_PHI3:
			put(&b, "<|assistant|>\n");
			break;
		default: /* [INST] ... [/INST] is the prompt: the answer follows */
			break;
		}
	}
	if (sysb.oom)
		b.oom = true;
	free(sysb.p);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p;
}
