/*
 * fuzz_request.c - libFuzzer harness: what `strata serve` does with a
 * request body before anything reaches the engine (cli/request.c: the JSON,
 * every field's type and range, the chat template on the messages).
 *
 * Input: byte 0: bit 0 chat (/v1/chat/completions) else text
 * (/v1/completions), bits 1-3 the template family (mod TMPL_COUNT); the rest
 * is the body, any bytes.  Checks: a body is refused with a status of 400,
 * 404 or 500 and a message of one line of valid UTF-8 (it quotes the
 * client's bytes, and goes out in JSON), or accepted with a prompt (its length
 * as given), at most API_MAX_STOP non-empty stop strings, sampling values in
 * range; and everything is freed (LeakSanitizer).
 */
#include "request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* one line of valid UTF-8 (checked independently of request.c's cleaning) */
static int plain_utf8(const unsigned char *s)
{
	while (*s) {
		unsigned n = *s < 0x80 ? 0 : (*s & 0xe0) == 0xc0 ? 1 : (*s & 0xf0) == 0xe0 ? 2
			   : (*s & 0xf8) == 0xf0 ? 3 : 9;

		if (n == 9 || (n == 0 && (*s < 0x20 || *s == 0x7f)) || (n == 1 && *s < 0xc2))
			return 0;
		for (unsigned i = 1; i <= n; i++)
			if ((s[i] & 0xc0) != 0x80)
				return 0;
		s += n + 1;
	}
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct api_server s = {
		.model_id = "m.gguf",
		.tmpl = (enum tmpl_kind)((size ? data[0] >> 1 & 7 : 0) % TMPL_COUNT),
		.bos = "<s>",
		.eos = "</s>",
		.samp = { .temp = 0.8f, .top_p = 0.95f, .seed = 1 },
	};
	struct api_request r;
	struct api_error e;

	if (size < 1)
		return 0;
	if (api_request_parse((const char *)data + 1, size - 1, data[0] & 1, &s, &r, &e)) {
		if ((e.status != 400 && e.status != 404 && e.status != 500) || !e.type ||
		    !e.message[0] || !plain_utf8((const unsigned char *)e.message))
			abort();
	} else {
		if (!r.prompt || r.prompt[r.prompt_len] || r.n_stop > API_MAX_STOP ||
		    !(r.samp.temp >= 0 && r.samp.temp <= 2) || !(r.samp.top_p >= 0 && r.samp.top_p <= 1) ||
		    r.max_tokens < -1)
			abort();
		for (size_t i = 0; i < r.n_stop; i++)
			if (!r.stop[i] || !r.stop[i][0] || strlen(r.stop[i]) > r.stop_max)
				abort();
	}
	api_request_free(&r);
	return 0;
}
