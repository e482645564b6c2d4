/*
 * request.h - an OpenAI API request body, checked and decoded (request.c):
 * what `strata serve` does with the bytes a client sends before anything
 * touches the engine.  No HTTP and no server state, so a fuzzer can reach
 * it (tests/fuzz/fuzz_request.c).
 */
#ifndef STRATA_REQUEST_H
#define STRATA_REQUEST_H

#include "engine.h"
#include "template.h"

#include <stdbool.h>
#include <stddef.h>

#define API_MAX_STOP 4 /* stop strings per request, as OpenAI's */

/* What the server brings: its model's name, template and defaults. */
struct api_server {
	const char *model_id;
	enum tmpl_kind tmpl;
	const char *bos, *eos;            /* the vocabulary's texts for them */
	struct eng_sampler_config samp;   /* --temp, --top-p, ... */
};

struct api_request {
	bool chat, stream;
	char *prompt;        /* the text to tokenize; chat: the template's, with
			      * special tokens written out (eng_tokenize_special) */
	size_t prompt_len;
	long max_tokens;     /* -1: to the context's end */
	struct eng_sampler_config samp;
	bool seeded;         /* samp.seed is the client's */
	char *stop[API_MAX_STOP];
	size_t n_stop, stop_max; /* the longest stop string's length */
};

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}
 * with its HTTP status. */
struct api_error {
	unsigned status;
	const char *type, *code, *param; /* static strings; code, param may be NULL */
	char message[256];
};

/* Decode body (len bytes, any bytes) of a chat (/v1/chat/completions) or
 * text (/v1/completions) request into *r: 0, or -1 with *err filled (400 for
 * a malformed body, 404 for another model's name, 500 out of memory).  Free
 * *r with api_request_free either way. */
int api_request_parse(const char *body, size_t len, bool chat, const struct api_server *s,
		      struct api_request *r, struct api_error *err);
void api_request_free(struct api_request *r);

#endif
