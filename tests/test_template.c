/*
 * test_template.c - chat templates (cli/template.c): for every case of
 * tests/data/chat-templates.json, the template's source is recognized as the
 * family the case names (or as none), and the conversation renders to
 * exactly the expected text.  Then the special tokens of a rendered
 * conversation tokenize as those tokens (eng_tokenize_special) on the
 * fixtures whose vocabularies have them (tiny-phi3: <|user|>, <|end|>,
 * <|assistant|>; tiny-llama with Llama 2's template: <s>, </s> between
 * turns), and stay text with eng_tokenize.  (The other fixtures' cut
 * vocabularies lack their families' turn tokens.)
 */
#include "check.h"
#include "engine.h"
#include "template.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *str(json_object *o, const char *key)
{
	json_object *v;

	return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)
		       ? json_object_get_string(v)
		       : NULL;
}

static void run_case(json_object *c)
{
	const char *name = str(c, "name"), *kind = str(c, "kind"), *src = str(c, "template");
	const char *bos = str(c, "bos"), *eos = str(c, "eos"), *want = str(c, "expected");
	json_object *msgs, *lb;
	enum tmpl_kind k;
	int rc = tmpl_detect(src, &k);

	if (!kind) {
		CHECK(rc != 0, "%s: recognized as %s, should be none", name, tmpl_name(k));
		return;
	}
	CHECK(rc == 0 && !strcmp(tmpl_name(k), kind), "%s: recognized as %s, not %s", name,
	      rc ? "none" : tmpl_name(k), kind);
	if (rc)
		return;
	CHECK(json_object_object_get_ex(c, "messages", &msgs), "%s: no messages", name);
	size_t n = json_object_array_length(msgs);
	struct chat_msg *m = calloc(n, sizeof(*m));

	for (size_t i = 0; i < n; i++) {
		json_object *e = json_object_array_get_idx(msgs, i);

		m[i].role = str(e, "role");
		m[i].content = str(e, "content");
	}
	char *got = tmpl_render(k, m, n, true, bos, eos);
	bool leading = json_object_object_get_ex(c, "leading_bos", &lb) && json_object_get_boolean(lb);
	size_t skip = leading ? strlen(bos) : 0;

	CHECK(got && strlen(want) >= skip && !strcmp(got, want + skip),
	      "%s:\n  got      \"%s\"\n  expected \"%s\"", name, got ? got : "(null)", want + skip);
	free(got);
	free(m);
}

/* The rendered conversation on a real vocabulary: each special text one token. */
static void specials(const char *fix, const char *model, enum tmpl_kind k, const char *bos,
		     const char *eos, const char *tokens[], size_t n_tokens)
{
	char path[1024];
	const void *base;
	size_t size, n, n_plain;
	struct eng_model *m;
	char err[256];
	int32_t *ids, *plain;
	const struct chat_msg conv[3] = { { "user", "Hello" }, { "assistant", "Hi" },
					  { "user", "Bye" } };

	snprintf(path, sizeof(path), "%s/%s.gguf", fix, model);
	if (eng_map_file(path, &base, &size)) {
		CHECK(0, "%s: cannot map", path);
		return;
	}
	if (eng_model_load_vocab(base, size, &m, err, sizeof(err))) {
		CHECK(0, "%s: %s", path, err);
		eng_unmap_file(base, size);
		return;
	}
	const struct eng_tokenizer *t = eng_model_tokenizer(m);
	char *text = tmpl_render(k, conv, 3, true, bos, eos);

	CHECK(eng_tokenize_special(t, text, strlen(text), false, &ids, &n) == 0, "tokenize");
	CHECK(eng_tokenize(t, text, strlen(text), false, &plain, &n_plain) == 0, "tokenize");
	for (size_t i = 0; i < n_tokens; i++) {
		int32_t *one;
		size_t n_one, count = 0, count_plain = 0;

		CHECK(eng_tokenize_special(t, tokens[i], strlen(tokens[i]), false, &one, &n_one) == 0 &&
			      n_one == 1,
		      "%s: %s is not one token", model, tokens[i]);
		for (size_t j = 0; j < n; j++)
			count += ids[j] == one[0];
		for (size_t j = 0; j < n_plain; j++)
			count_plain += plain[j] == one[0];
		CHECK(count > 0, "%s: %s not found as a token in the rendered text", model, tokens[i]);
		CHECK(count_plain == 0, "%s: %s parsed as a token without parsing specials", model,
		      tokens[i]);
		free(one);
	}
	free(ids);
	free(plain);
	free(text);
	eng_model_destroy(m);
	eng_unmap_file(base, size);
}

int main(int argc, char **argv)
{
	const char *fix = getenv("STRATA_FIXTURES");
	json_object *doc, *cases;
	enum tmpl_kind k;

	if (argc < 2) {
		printf("usage: test_template chat-templates.json\n");
		return 2;
	}
	doc = json_object_from_file(argv[1]);
	if (!doc || !json_object_object_get_ex(doc, "cases", &cases)) {
		printf("FAIL: cannot read %s\n", argv[1]);
		return 1;
	}
	for (size_t i = 0; i < json_object_array_length(cases); i++)
		run_case(json_object_array_get_idx(cases, i));
	printf("ok %zu template cases\n", json_object_array_length(cases));
	json_object_put(doc);

	/* names round-trip; an unknown one is refused */
	for (unsigned i = 0; i < TMPL_COUNT; i++)
		CHECK(tmpl_parse(tmpl_name((enum tmpl_kind)i), &k) == 0 && k == (enum tmpl_kind)i,
		      "name %u", i);
	CHECK(tmpl_parse("jinja", &k) != 0, "an unknown name must be refused");

	if (!fix)
		fix = "../shared/fixtures";
	{
		const char *phi3[] = { "<|user|>", "<|end|>", "<|assistant|>" };
		const char *llama2[] = { "<s>", "</s>" };

		specials(fix, "arch/models/tiny-phi3-q4_k_m", TMPL_PHI3, "<s>", "<|endoftext|>", phi3,
			 3);
		specials(fix, "models/tiny-llama-q4_0", TMPL_LLAMA2, "<s>", "</s>", llama2, 2);
	}
	return failures ? 1 : 0;
}
