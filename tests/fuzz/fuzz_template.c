/*
 * fuzz_template.c - libFuzzer harness: chat templates (cli/template.c), the
 * text a GGUF file's tokenizer.chat_template holds and the messages a chat
 * or an HTTP client sends.
 *
 * Input layout:
 *    0  1 flags      bits 0-2: the family rendered (mod TMPL_COUNT); bit 3:
 *                    add the assistant's turn
 *    1  ...  source  a template's Jinja text, up to a \0, given to
 *                    tmpl_detect() (its family, when found, is rendered too)
 *    then messages   each a role byte (mod 3: system, user, assistant) and
 *                    the content up to a \0 (any other bytes); at most 64
 * Checks: tmpl_detect() answers 0 with a family in range or -ENOENT, and a
 * rendering is a string holding every message's content (templates write
 * the content as given, trimmed of surrounding white space at most).
 */
#include "template.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 64

/* s with white space trimmed at both ends: [*b, *b + *n) */
static void trimmed(const char *s, const char **b, size_t *n)
{
	size_t len = strlen(s);

	while (len && isspace((unsigned char)*s))
		s++, len--;
	while (len && isspace((unsigned char)s[len - 1]))
		len--;
	*b = s;
	*n = len;
}

static void render(enum tmpl_kind k, const struct chat_msg *m, size_t n, int add)
{
	char *out = tmpl_render(k, m, n, add, "<s>", "</s>");

	if (!out)
		abort(); /* out of memory: not with the sizes libFuzzer gives */
	for (size_t i = 0; i < n; i++) {
		const char *b;
		size_t len;

		trimmed(m[i].content, &b, &len);
		if (len && !memmem(out, strlen(out), b, len))
			abort(); /* a message lost from the prompt */
	}
	free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const roles[] = { "system", "user", "assistant" };
	struct chat_msg msgs[MAX_MSGS];
	enum tmpl_kind k;
	size_t n = 0;
	char *copy, *p, *end;
	int rc;

	if (size < 1)
		return 0;
	copy = malloc(size + 1);
	if (!copy)
		return 0;
	memcpy(copy, data + 1, size - 1);
	copy[size - 1] = 0;
	end = copy + size - 1;

	rc = tmpl_detect(copy, &k);
	if (rc != 0 && rc != -ENOENT)
		abort();
	if (rc == 0 && (unsigned)k >= TMPL_COUNT)
		abort();
	for (p = copy + strlen(copy) + 1; p < end && n < MAX_MSGS; n++) {
		msgs[n].role = roles[(unsigned char)*p % 3];
		msgs[n].content = ++p;
		p += strlen(p) + 1;
	}
	render((enum tmpl_kind)(data[0] & 7) % TMPL_COUNT, msgs, n, data[0] & 8);
	if (rc == 0)
		render(k, msgs, n, data[0] & 8);
	free(copy);
	return 0;
}
