/*
 * template.h - chat templates (template.c): the families strata recognizes
 * in a GGUF's tokenizer.chat_template and renders without running Jinja.
 */
#ifndef STRATA_TEMPLATE_H
#define STRATA_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

enum tmpl_kind {
	TMPL_CHATML,  /* <|im_start|>role\n...<|im_end|>\n: Qwen, many fine-tunes */
	TMPL_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	TMPL_LLAMA2,  /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s><s> */
	TMPL_MISTRAL, /* [INST] ... [/INST]...</s> */
	TMPL_GEMMA,   /* <start_of_turn>user\n...<end_of_turn>\n, assistant as model */
	TMPL_PHI3,    /* <|role|>\n...<|end|>\n */
	TMPL_COUNT,
};

struct chat_msg {
	const char *role; /* "system", "user" or "assistant" */
	const char *content;
};

const char *tmpl_name(enum tmpl_kind k);
/* "chatml, llama3, ...": for messages */
const char *tmpl_names(void);
/* By name (--chat-template); 0 or -EINVAL. */
int tmpl_parse(const char *name, enum tmpl_kind *out);
/* The family of a template's Jinja source; 0, or -ENOENT when it is none
 * strata knows (the caller falls back to ChatML and says so). */
int tmpl_detect(const char *src, enum tmpl_kind *out);
/* The text of the token that ends the assistant's turn, or NULL where the
 * model's EOS does (Llama 2, Mistral). */
const char *tmpl_turn_end(enum tmpl_kind k);
/* The conversation as the model's prompt, then the start of the assistant's
 * turn when add_assistant; bos and eos are the vocabulary's texts for them
 * (written between turns by Llama 2 and Mistral; the leading BOS is the
 * tokenizer's to add).  Malloc'd, NUL-terminated; NULL when out of memory. */
char *tmpl_render(enum tmpl_kind k, const struct chat_msg *msgs, size_t n, bool add_assistant,
		  const char *bos, const char *eos);

#endif
