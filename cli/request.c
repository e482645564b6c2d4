/*
 * request.c - an OpenAI API request body, checked and decoded (request.h).
 *
 * The body is JSON (json-c); every field a client may send is checked for
 * its type and range, and each mistake is named in the error's message and
 * its "param", as the OpenAI API does.  A chat request's messages are
 * rendered by the model's chat template (template.c) here, so the server
 * gets one prompt text either way.
 */
#include "request.h"

#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of the valid UTF-8 character at s (n bytes left), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : s[0] >= 0xe0 && s[0] < 0xf0 ? 3
		   : s[0] >= 0xf0 && s[0] < 0xf5 ? 4 : 0;

	if (!len || len > n)
		return 0;
	for (size_t i = 1; i < len; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((len == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) ||
	    (len == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))))
		return 0; /* overlong, surrogate, beyond U+10FFFF */
	return len;
}

/* A message quotes what the client sent: one line of valid UTF-8 whatever
 * that was (control characters become spaces, broken sequences '?'). */
static void plain_text(char *m)
{
	unsigned char *s = (unsigned char *)m;
	size_t n = strlen(m);

	for (size_t i = 0; i < n;) {
		size_t l = utf8_len(s + i, n - i);

		if (l == 1 && (s[i] < 0x20 || s[i] == 0x7f))
			s[i] = ' ';
		else if (!l)
			s[i] = '?', l = 1;
		i += l;
	}
}

static int fail(struct api_error *e, unsigned status, const char *type, const char *code,
		const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int fail(struct api_error *e, unsigned status, const char *type, const char *code,
		const char *param, const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	e->type = type;
	e->code = code;
	e->param = param;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	plain_text(e->message);
	return -1;
}

#define BAD(param, ...) fail(err, 400, "invalid_request_error", NULL, param, __VA_ARGS__)
#define OOM() fail(err, 500, "server_error", NULL, NULL, "out of memory")

/* o[key], when it is there and of type t (an integer passes for a number) */
static bool get(json_object *o, const char *key, json_type t, json_object **out)
{
	json_object *x;

	if (!json_object_object_get_ex(o, key, &x) || !x)
		return false;
	*out = x;
	return json_object_is_type(x, t) ||
	       (t == json_type_double && json_object_is_type(x, json_type_int));
}

/* A message's content: a string, or an array of {"type": "text", "text"}
 * parts, joined. */
static char *content_text(json_object *m)
{
	json_object *x;

	if (!json_object_object_get_ex(m, "content", &x) || !x)
		return NULL;
	if (json_object_is_type(x, json_type_string))
		return strdup(json_object_get_string(x));
	if (!json_object_is_type(x, json_type_array))
		return NULL;
	size_t n = json_object_array_length(x), len = 0;
	char *s = calloc(1, 1);

	for (size_t i = 0; s && i < n; i++) {
		json_object *p = json_object_array_get_idx(x, i), *t;
		const char *pt;
		char *ns;

		if (!json_object_is_type(p, json_type_object) ||
		    !json_object_object_get_ex(p, "text", &t) || !json_object_is_type(t, json_type_string)) {
			free(s);
			return NULL;
		}
		pt = json_object_get_string(t);
		ns = realloc(s, len + strlen(pt) + 1);
		if (!ns) {
			free(s);
			return NULL;
		}
		s = ns;
		memcpy(s + len, pt, strlen(pt) + 1);
		len += strlen(pt);
	}
	return s;
}

/* The prompt of a chat request: the template applied to its messages. */
static int chat_prompt(json_object *body, const struct api_server *s, struct api_request *r,
		       struct api_error *err)
{
	json_object *msgs;
	struct chat_msg *m;
	char **texts;
	size_t n;
	int rc = 0;

	if (!get(body, "messages", json_type_array, &msgs) ||
	    (n = json_object_array_length(msgs)) == 0)
		return BAD("messages", "'messages' must be a non-empty array of messages");
	m = calloc(n, sizeof(*m));
	texts = calloc(n, sizeof(*texts));
	if (!m || !texts) {
		rc = OOM();
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_object *e = json_object_array_get_idx(msgs, i), *role;
		const char *rs;

		if (!json_object_is_type(e, json_type_object) ||
		    !get(e, "role", json_type_string, &role)) {
			rc = BAD("messages", "messages[%zu] needs a string 'role'", i);
			goto out;
		}
		rs = json_object_get_string(role);
		if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
		    strcmp(rs, "developer")) {
			rc = BAD("messages", "messages[%zu]: role '%.40s' is not system, user or "
					     "assistant", i, rs);
			goto out;
		}
		m[i].role = strcmp(rs, "developer") ? rs : "system";
		texts[i] = content_text(e);
		if (!texts[i]) {
			rc = BAD("messages", "messages[%zu] needs a string 'content' (or text parts)", i);
			goto out;
		}
		m[i].content = texts[i];
	}
	r->prompt = tmpl_render(s->tmpl, m, n, true, s->bos, s->eos);
	if (r->prompt)
		r->prompt_len = strlen(r->prompt);
	else
		rc = OOM();
out:
	for (size_t i = 0; texts && i < n; i++)
		free(texts[i]);
	free(texts);
	free(m);
	return rc;
}

/* The request's options: sampling, length, streaming, stop strings. */
static int parse_options(json_object *body, struct api_request *r, struct api_error *err)
{
	json_object *x;

	if (json_object_object_get_ex(body, "max_tokens", &x) ||
	    json_object_object_get_ex(body, "max_completion_tokens", &x)) {
		if (x && !json_object_is_type(x, json_type_int))
			return BAD("max_tokens", "'max_tokens' must be an integer");
		if (x && json_object_get_int64(x) < 0)
			return BAD("max_tokens", "'max_tokens' must not be negative");
		if (x)
			r->max_tokens = (long)json_object_get_int64(x);
	}
	if (json_object_object_get_ex(body, "temperature", &x) && x) {
		double t;

		if (!get(body, "temperature", json_type_double, &x) ||
		    !((t = json_object_get_double(x)) >= 0 && t <= 2))
			return BAD("temperature", "'temperature' must be a number from 0 to 2");
		r->samp.temp = (float)t;
	}
	if (json_object_object_get_ex(body, "top_p", &x) && x) {
		double t;

		if (!get(body, "top_p", json_type_double, &x) ||
		    !((t = json_object_get_double(x)) >= 0 && t <= 1))
			return BAD("top_p", "'top_p' must be a number from 0 to 1");
		r->samp.top_p = (float)t;
	}
	if (json_object_object_get_ex(body, "seed", &x) && x) {
		if (!json_object_is_type(x, json_type_int))
			return BAD("seed", "'seed' must be an integer");
		r->samp.seed = (uint64_t)json_object_get_int64(x);
		r->seeded = true;
	}
	if (json_object_object_get_ex(body, "stream", &x) && x) {
		if (!json_object_is_type(x, json_type_boolean))
			return BAD("stream", "'stream' must be a boolean");
		r->stream = json_object_get_boolean(x);
	}
	if (json_object_object_get_ex(body, "stop", &x) && x) {
		size_t n = json_object_is_type(x, json_type_array) ? json_object_array_length(x) : 1;

		if (!json_object_is_type(x, json_type_string) && !json_object_is_type(x, json_type_array))
			return BAD("stop", "'stop' must be a string or an array of strings");
		if (n > API_MAX_STOP)
			return BAD("stop", "'stop' takes at most %d strings", API_MAX_STOP);
		for (size_t i = 0; i < n; i++) {
			json_object *e = json_object_is_type(x, json_type_array)
						 ? json_object_array_get_idx(x, i)
						 : x;

			if (!json_object_is_type(e, json_type_string) || !*json_object_get_string(e))
				return BAD("stop", "'stop' must hold non-empty strings");
			r->stop[r->n_stop] = strdup(json_object_get_string(e));
			if (!r->stop[r->n_stop])
				return OOM();
			if (strlen(r->stop[r->n_stop]) > r->stop_max)
				r->stop_max = strlen(r->stop[r->n_stop]);
			r->n_stop++;
		}
	}
	if (json_object_object_get_ex(body, "n", &x) && x &&
	    (!json_object_is_type(x, json_type_int) || json_object_get_int64(x) != 1))
		return BAD("n", "only 'n': 1 is supported");
	return 0;
}

int api_request_parse(const char *data, size_t len, bool chat, const struct api_server *s,
		      struct api_request *r, struct api_error *err)
{
	struct json_tokener *tk;
	json_object *body, *x = NULL;
	int rc;

	*r = (struct api_request){ .chat = chat, .max_tokens = -1, .samp = s->samp };
	if (len > (size_t)INT32_MAX)
		return BAD(NULL, "the body is too large");
	tk = json_tokener_new();
	if (!tk)
		return OOM();
	body = json_tokener_parse_ex(tk, data, (int)len);
	if (!body || json_tokener_get_error(tk) != json_tokener_success ||
	    tk->char_offset != (int)len) {
		json_tokener_free(tk);
		json_object_put(body);
		return BAD(NULL, "the body is not valid JSON");
	}
	json_tokener_free(tk);
	if (!json_object_is_type(body, json_type_object)) {
		rc = BAD(NULL, "the body must be a JSON object");
	} else if (json_object_object_get_ex(body, "model", &x) && x &&
		   !json_object_is_type(x, json_type_string)) {
		rc = BAD("model", "'model' must be a string");
	} else if (x && strcmp(json_object_get_string(x), s->model_id)) {
		rc = fail(err, 404, "invalid_request_error", "model_not_found", "model",
			  "the model '%.100s' does not exist (this server has '%.100s')",
			  json_object_get_string(x), s->model_id);
	} else if ((rc = parse_options(body, r, err))) {
		/* err says why */
	} else if (chat) {
		rc = chat_prompt(body, s, r, err);
	} else if (!get(body, "prompt", json_type_string, &x)) {
		rc = BAD("prompt", "'prompt' must be a string");
	} else {
		/* the client's bytes as given, a \u0000 in them too */
		r->prompt_len = (size_t)json_object_get_string_len(x);
		r->prompt = malloc(r->prompt_len + 1);
		if (r->prompt)
			memcpy(r->prompt, json_object_get_string(x), r->prompt_len + 1);
		else
			rc = OOM();
	}
	json_object_put(body);
	return rc;
}

void api_request_free(struct api_request *r)
{
	for (size_t i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->prompt);
	*r = (struct api_request){ 0 };
}
