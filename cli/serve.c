/*
 * serve.c - `strata serve`: an HTTP server speaking the OpenAI API
 * (/v1/chat/completions, /v1/completions, /v1/models) plus /health and
 * /metrics, with -np N sequences decoded together.
 *
 * Threads and ownership.  libmicrohttpd runs a thread per connection: it
 * reads the body, the handler checks it, renders and tokenizes the prompt
 * and queues a request (struct req); then the same thread waits on the
 * request -- for the whole answer, or, streaming, for each piece of text as
 * the server-sent-event callback asks for it.  One scheduler thread owns the
 * engine: between passes it admits queued requests into free slots (each
 * slot a context of its own) and drops those whose client went away; each
 * pass takes a row from every decoding slot and a chunk of every new
 * prompt, up to the batch, through eng_decode_multi -- one read of each
 * layer for all of them -- then samples each slot's next token.  A request
 * is shared by its connection and the scheduler and freed by whichever lets
 * go last (refs); everything in it that changes is under srv.lock, and its
 * cond tells the connection that text came or the answer ended.
 *
 * Requests beyond the slots wait in a queue of --queue; beyond that, 503.
 * A streaming client that disconnects is noticed when a write to it fails:
 * libmicrohttpd then ends the response, the request is marked cancelled and
 * its slot is freed before the next pass.  A body is decoded and checked by
 * request.c (JSON, the fields, the chat template; no HTTP there, so it is
 * fuzzed on its own); every error is an OpenAI-style {"error": {...}} body
 * with its status.
 */
#include "cli.h"
#include "request.h"
#include "template.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_BODY (1u << 20) /* request bodies beyond this get 413 */
#define MAX_CONNECTIONS 256

enum req_state { REQ_QUEUED, REQ_RUNNING, REQ_DONE };

struct req {
	/* set before queueing, then read-only */
	bool chat, stream;
	int32_t *ids;
	size_t n_ids;
	long max_tokens;
	struct eng_sampler_config samp;
	char *stop[API_MAX_STOP];
	size_t n_stop, stop_max; /* the longest stop string's length */
	char id[48];
	long long created;
	/* under srv.lock */
	enum req_state state;
	char *text;       /* generated so far, stop strings cut */
	size_t len, cap;
	size_t ready;     /* of it, what may be sent: not a stop string's start,
			   * not half a UTF-8 character */
	size_t n_gen;
	const char *finish; /* "stop", "length"; NULL while running */
	bool cancelled;
	int refs;
	struct req *next; /* the queue */
	pthread_cond_t cond;
	/* the connection thread's own: what the stream has sent */
	size_t sent;
	int phase;        /* 0: nothing yet, 1: deltas, 2: final chunk sent, 3: [DONE] */
	char *out;        /* an event not yet handed to libmicrohttpd whole */
	size_t out_len, out_off;
	struct srv *srv;
};

struct slot {
	struct eng_ctx *ctx;
	struct req *r;        /* NULL: free */
	struct eng_sampler *sm;
	size_t fed;           /* prompt tokens fed */
	int32_t next;         /* the last sampled token, to feed */
};

struct srv {
	struct session s;
	struct opts o;
	pthread_mutex_t lock;
	pthread_cond_t work;
	struct req *qhead, *qtail;
	size_t qlen;
	struct slot *slots;
	unsigned n_slots, n_active;
	bool ready, stop;
	enum tmpl_kind tmpl;
	char bos_text[64], eos_text[64];
	int32_t turn_end; /* the template's end-of-turn token, or -1 */
	char model_id[256];
	uint32_t n_vocab;
	uint64_t seq;     /* request ids */
	/* metrics, under lock */
	uint64_t n_ok, n_err, n_cancelled, n_rejected, n_prompt_tok, n_gen_tok, n_passes,
		n_rows;
	double rate, rate_t0;
	uint64_t rate_tokens;
	long long t_start;
};

/* ---- requests ------------------------------------------------------------ */

static void req_unref(struct req *r)
{
	if (--r->refs > 0)
		return;
	free(r->ids);
	for (size_t i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->text);
	free(r->out);
	pthread_cond_destroy(&r->cond);
	free(r);
}

static size_t utf8_complete(const char *s, size_t n)
{
	size_t i = n, k = 0;

	/* back over continuation bytes to the last lead byte */
	while (i > 0 && k < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80)
		i--, k++;
	if (i == 0)
		return n;
	unsigned char c = (unsigned char)s[i - 1];
	size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;

	return k + 1 >= need ? n : i - 1;
}

/* What of r's text may go out: not a suffix that may be the start of a stop
 * string, not half a character.  Under lock. */
static void req_update_ready(struct req *r)
{
	size_t n = r->len, hold = 0;

	if (r->finish) {
		r->ready = r->len;
		return;
	}
	for (size_t i = 0; i < r->n_stop; i++) {
		size_t sl = strlen(r->stop[i]);

		for (size_t k = sl - 1; k > hold && k > 0; k--)
			if (k <= n && !memcmp(r->text + n - k, r->stop[i], k)) {
				hold = k;
				break;
			}
	}
	r->ready = utf8_complete(r->text, n - hold);
}

/* Append a token's text; a stop string ends the answer before it.  Under lock. */
static void req_append(struct req *r, const char *p, size_t n)
{
	if (r->len + n + 1 > r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 256;
		char *t;

		while (cap < r->len + n + 1)
			cap *= 2;
		t = realloc(r->text, cap);
		if (!t) {
			r->finish = "length";
			return;
		}
		r->text = t;
		r->cap = cap;
	}
	size_t from = r->len > r->stop_max ? r->len - r->stop_max : 0;

	memcpy(r->text + r->len, p, n);
	r->len += n;
	r->text[r->len] = 0;
	for (size_t i = 0; i < r->n_stop; i++) {
		char *hit = strstr(r->text + from, r->stop[i]);

		if (hit) {
			r->len = (size_t)(hit - r->text);
			r->text[r->len] = 0;
			r->finish = "stop";
		}
	}
}

/* ---- the scheduler ---------------------------------------------------------- */

static void slot_finish(struct srv *v, struct slot *sl, const char *finish)
{
	struct req *r = sl->r;

	if (!r->finish)
		r->finish = finish;
	r->state = REQ_DONE;
	req_update_ready(r);
	if (r->cancelled)
		v->n_cancelled++;
	else
		v->n_ok++;
	pthread_cond_broadcast(&r->cond);
	req_unref(r);
	eng_sampler_destroy(sl->sm);
	sl->sm = NULL;
	sl->r = NULL;
	v->n_active--;
}

/* Between passes, under lock: free the slots of gone clients, admit
 * queued requests into free slots. */
static void schedule(struct srv *v)
{
	for (unsigned i = 0; i < v->n_slots; i++)
		if (v->slots[i].r && v->slots[i].r->cancelled)
			slot_finish(v, &v->slots[i], "stop");
	for (unsigned i = 0; i < v->n_slots && v->qhead; i++) {
		struct slot *sl = &v->slots[i];
		struct req *r;

		if (sl->r)
			continue;
		r = v->qhead;
		v->qhead = r->next;
		if (!v->qhead)
			v->qtail = NULL;
		v->qlen--;
		if (r->cancelled) {
			v->n_cancelled++;
			r->state = REQ_DONE;
			req_unref(r);
			i--;
			continue;
		}
		sl->r = r;
		sl->fed = 0;
		r->state = REQ_RUNNING;
		v->n_active++;
		v->n_prompt_tok += r->n_ids;
		eng_ctx_reset(sl->ctx);
		if (eng_sampler_create(&r->samp, v->n_vocab, &sl->sm)) {
			slot_finish(v, sl, "length");
			continue;
		}
		if (r->max_tokens == 0)
			slot_finish(v, sl, "length");
	}
}

/* A token sampled for slot sl: the end of its turn, or text.  Under lock. */
static void slot_token(struct srv *v, struct slot *sl, int32_t t)
{
	struct req *r = sl->r;
	char piece[256];
	int n;

	if (eng_tokenizer_is_eog(v->s.tok, t) || t == v->turn_end) {
		slot_finish(v, sl, "stop");
		return;
	}
	n = eng_token_to_piece(v->s.tok, t, piece, sizeof(piece));
	if (n > 0)
		req_append(r, piece, (size_t)n < sizeof(piece) ? (size_t)n : sizeof(piece));
	r->n_gen++;
	v->n_gen_tok++;
	v->rate_tokens++;
	sl->next = t;
	if (!r->finish && (long)r->n_gen >= r->max_tokens)
		r->finish = "length";
	/* no room to feed it: the context is full */
	if (!r->finish && eng_ctx_n_past(sl->ctx) + 1 >= eng_ctx_n_ctx(sl->ctx))
		r->finish = "length";
	if (r->finish) {
		slot_finish(v, sl, r->finish);
		return;
	}
	req_update_ready(r);
	pthread_cond_broadcast(&r->cond);
}

static void *scheduler(void *arg)
{
	struct srv *v = arg;
	/* a pass's rows: the contexts' batch (they are all alike) */
	size_t max_rows = v->o.batch ? v->o.batch : 256;
	struct eng_ctx **rctx;
	int32_t *rtok;
	bool *want;
	unsigned *rslot;
	float *logits;

	if (max_rows > eng_ctx_n_ctx(v->s.ctx))
		max_rows = eng_ctx_n_ctx(v->s.ctx);
	rctx = calloc(max_rows, sizeof(*rctx));
	rtok = calloc(max_rows, sizeof(*rtok));
	want = calloc(max_rows, sizeof(*want));
	rslot = calloc(max_rows, sizeof(*rslot));
	logits = malloc((size_t)v->n_slots * v->n_vocab * sizeof(float));
	if (!rctx || !rtok || !want || !rslot || !logits) {
		msg("out of memory");
		exit(EXIT_BAD_INPUT);
	}
	pthread_mutex_lock(&v->lock);
	for (;;) {
		size_t n = 0;
		uint32_t produced = 0;

		schedule(v);
		while (!v->stop && v->n_active == 0 && !v->qhead)
			pthread_cond_wait(&v->work, &v->lock);
		if (v->stop)
			break;
		if (v->n_active == 0)
			continue;
		/* decoding slots first, a row each; then prompts, a chunk each */
		for (unsigned i = 0; i < v->n_slots && n < max_rows; i++) {
			struct slot *sl = &v->slots[i];

			if (!sl->r || sl->fed < sl->r->n_ids)
				continue;
			rctx[n] = sl->ctx;
			rtok[n] = sl->next;
			want[n] = true;
			rslot[n++] = i;
			produced++;
		}
		for (unsigned i = 0; i < v->n_slots && n < max_rows; i++) {
			struct slot *sl = &v->slots[i];

			if (!sl->r || sl->fed >= sl->r->n_ids)
				continue;
			while (sl->fed < sl->r->n_ids && n < max_rows) {
				rctx[n] = sl->ctx;
				rtok[n] = sl->r->ids[sl->fed++];
				want[n] = sl->fed == sl->r->n_ids;
				rslot[n++] = i;
			}
		}
		pthread_mutex_unlock(&v->lock);
		/* the slots' contexts and rows are the scheduler's alone */
		int rc = session_decode_multi(&v->s, rctx, rtok, want, n, logits, produced);
		pthread_mutex_lock(&v->lock);
		v->n_passes++;
		v->n_rows += n;
		for (size_t k = 0, j = 0; k < n; k++) {
			struct slot *sl = &v->slots[rslot[k]];

			if (!want[k])
				continue;
			if (!sl->r) {
				j++;
				continue;
			}
			if (rc) {
				slot_finish(v, sl, "length");
				continue;
			}
			slot_token(v, sl, eng_sample(sl->sm, logits + (size_t)j++ * v->n_vocab));
		}
		if (rc)
			msg("a decode pass failed: %s", strerror(-rc));
		double t = now_s();

		if (t - v->rate_t0 >= 1.0) {
			v->rate = v->rate_tokens / (t - v->rate_t0);
			v->rate_t0 = t;
			v->rate_tokens = 0;
		}
	}
	pthread_mutex_unlock(&v->lock);
	free(rctx);
	free(rtok);
	free(want);
	free(rslot);
	free(logits);
	return NULL;
}

/* ---- HTTP --------------------------------------------------------------------- */

struct conn {
	char *body;
	size_t len;
	bool too_big;
};

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_object *o)
{
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
							       JSON_C_TO_STRING_NOSLASHESCAPE);
	struct MHD_Response *resp =
		MHD_create_response_from_buffer(strlen(s), (void *)s, MHD_RESPMEM_MUST_COPY);
	enum MHD_Result ret;

	MHD_add_response_header(resp, "Content-Type", "application/json");
	ret = MHD_queue_response(c, status, resp);
	MHD_destroy_response(resp);
	json_object_put(o);
	return ret;
}

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result send_error(struct srv *v, struct MHD_Connection *c, unsigned status,
				  const char *type, const char *code, const char *param,
				  const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error(struct srv *v, struct MHD_Connection *c, unsigned status,
				  const char *type, const char *code, const char *param,
				  const char *fmt, ...)
{
	json_object *o = json_object_new_object(), *e = json_object_new_object();
	char m[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	json_object_object_add(e, "message", json_object_new_string(m));
	json_object_object_add(e, "type", json_object_new_string(type));
	json_object_object_add(e, "param", param ? json_object_new_string(param) : NULL);
	json_object_object_add(e, "code", code ? json_object_new_string(code) : NULL);
	json_object_object_add(o, "error", e);
	pthread_mutex_lock(&v->lock);
	if (status == 503)
		v->n_rejected++;
	else
		v->n_err++;
	pthread_mutex_unlock(&v->lock);
	return send_json(c, status, o);
}

#define BAD(param, ...) send_error(v, c, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

static json_object *usage_obj(const struct req *r)
{
	json_object *u = json_object_new_object();

	json_object_object_add(u, "prompt_tokens", json_object_new_int64((int64_t)r->n_ids));
	json_object_object_add(u, "completion_tokens", json_object_new_int64((int64_t)r->n_gen));
	json_object_object_add(u, "total_tokens",
			       json_object_new_int64((int64_t)(r->n_ids + r->n_gen)));
	return u;
}

/* The response object around choice (a chunk when streaming). */
static json_object *envelope(const struct srv *v, const struct req *r, json_object *choice,
			     bool chunk)
{
	json_object *o = json_object_new_object(), *ch = json_object_new_array();

	json_object_object_add(o, "id", json_object_new_string(r->id));
	json_object_object_add(o, "object",
			       json_object_new_string(r->chat ? (chunk ? "chat.completion.chunk"
								       : "chat.completion")
							      : "text_completion"));
	json_object_object_add(o, "created", json_object_new_int64(r->created));
	json_object_object_add(o, "model", json_object_new_string(v->model_id));
	json_object_array_add(ch, choice);
	json_object_object_add(o, "choices", ch);
	return o;
}

/* The length of the valid UTF-8 character at s (n bytes left), 0 if none
 * starts there. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
	size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
		     : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;

	if (!len || len > n)
		return 0;
	for (size_t i = 1; i < len; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	/* overlong forms, surrogates, beyond U+10FFFF */
	if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
	    (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f))
		return 0;
	return len;
}

/* A JSON string of n bytes of generated text: a model can emit bytes that
 * are no UTF-8 (byte tokens of a broken sequence); each becomes U+FFFD, as
 * JSON must be UTF-8. */
static json_object *json_text(const char *text, size_t n)
{
	const unsigned char *s = (const unsigned char *)text;
	char *out = malloc(3 * n + 1);
	size_t o = 0;
	json_object *j;

	if (!out)
		return json_object_new_string("");
	for (size_t i = 0; i < n;) {
		size_t l = utf8_char(s + i, n - i);

		if (l) {
			memcpy(out + o, s + i, l);
			o += l;
			i += l;
		} else {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	j = json_object_new_string_len(out, (int)o);
	free(out);
	return j;
}

/* One choice: text (a delta when streaming), finish reason or null. */
static json_object *choice_obj(const struct req *r, const char *text, size_t n, bool delta,
			       bool role, const char *finish)
{
	json_object *c = json_object_new_object();

	json_object_object_add(c, "index", json_object_new_int(0));
	if (r->chat) {
		json_object *m = json_object_new_object();

		if (role || !delta)
			json_object_object_add(m, "role", json_object_new_string("assistant"));
		if (text)
			json_object_object_add(m, "content", json_text(text, n));
		json_object_object_add(c, delta ? "delta" : "message", m);
	} else {
		json_object_object_add(c, "text", json_text(text ? text : "", text ? n : 0));
		json_object_object_add(c, "logprobs", NULL);
	}
	json_object_object_add(c, "finish_reason", finish ? json_object_new_string(finish) : NULL);
	return c;
}

/* Server-sent events: the next event of r's stream into r->out, waiting
 * for text; false at the end. */
static bool next_event(struct req *r)
{
	struct srv *v = r->srv;
	json_object *o = NULL;
	const char *s;

	pthread_mutex_lock(&v->lock);
	while (r->phase == 1 && r->state != REQ_DONE && r->ready == r->sent)
		pthread_cond_wait(&r->cond, &v->lock);
	if (r->phase == 0) {
		/* the first chunk: the role (chat), or the text so far */
		o = envelope(v, r, choice_obj(r, "", 0, true, true, NULL), true);
		r->phase = 1;
	} else if (r->phase == 1 && r->ready > r->sent) {
		o = envelope(v, r, choice_obj(r, r->text + r->sent, r->ready - r->sent, true, false,
					      NULL),
			     true);
		r->sent = r->ready;
	} else if (r->phase == 1) { /* done, all sent: the finish reason and usage */
		o = envelope(v, r, choice_obj(r, r->chat ? NULL : "", 0, true, false, r->finish),
			     true);
		json_object_object_add(o, "usage", usage_obj(r));
		r->phase = 2;
	} else if (r->phase == 2) {
		r->phase = 3;
		pthread_mutex_unlock(&v->lock);
		free(r->out);
		r->out = strdup("data: [DONE]\n\n");
		r->out_len = r->out ? strlen(r->out) : 0;
		r->out_off = 0;
		return r->out != NULL;
	} else {
		pthread_mutex_unlock(&v->lock);
		return false;
	}
	pthread_mutex_unlock(&v->lock);
	s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
						      JSON_C_TO_STRING_NOSLASHESCAPE);
	free(r->out);
	r->out_len = strlen(s) + 8;
	r->out = malloc(r->out_len + 1);
	if (r->out)
		snprintf(r->out, r->out_len + 1, "data: %s\n\n", s);
	r->out_off = 0;
	json_object_put(o);
	return r->out != NULL;
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct req *r = cls;
	size_t n;

	(void)pos;
	if (r->out_off == r->out_len && !next_event(r))
		return MHD_CONTENT_READER_END_OF_STREAM;
	n = r->out_len - r->out_off < max ? r->out_len - r->out_off : max;
	memcpy(buf, r->out + r->out_off, n);
	r->out_off += n;
	return (ssize_t)n;
}

/* The stream is over: sent, or the client went away (then the slot goes
 * before the next pass). */
static void stream_free(void *cls)
{
	struct req *r = cls;
	struct srv *v = r->srv;

	pthread_mutex_lock(&v->lock);
	if (r->state != REQ_DONE) {
		r->cancelled = true;
		pthread_cond_signal(&v->work);
	}
	req_unref(r);
	pthread_mutex_unlock(&v->lock);
}

/* The whole answer, not streamed. */
static enum MHD_Result send_whole(struct srv *v, struct MHD_Connection *c, struct req *r)
{
	json_object *o;

	pthread_mutex_lock(&v->lock);
	while (r->state != REQ_DONE)
		pthread_cond_wait(&r->cond, &v->lock);
	o = envelope(v, r, choice_obj(r, r->text ? r->text : "", r->len, false, true, r->finish),
		     false);
	json_object_object_add(o, "usage", usage_obj(r));
	req_unref(r);
	pthread_mutex_unlock(&v->lock);
	return send_json(c, 200, o);
}

static enum MHD_Result completion(struct srv *v, struct MHD_Connection *c, const char *data,
				  size_t len, bool chat)
{
	const struct api_server as = { .model_id = v->model_id, .tmpl = v->tmpl,
				       .bos = v->bos_text, .eos = v->eos_text, .samp = v->o.samp };
	struct api_request q;
	struct api_error e;
	enum MHD_Result ret = MHD_NO;
	struct req *r = NULL;
	uint32_t n_ctx = eng_ctx_n_ctx(v->s.ctx);
	int rc;

	if (api_request_parse(data, len, chat, &as, &q, &e)) {
		ret = send_error(v, c, e.status, e.type, e.code, e.param, "%s", e.message);
		goto out;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		ret = send_error(v, c, 500, "server_error", NULL, NULL, "out of memory");
		goto out;
	}
	pthread_cond_init(&r->cond, NULL);
	r->refs = 1;
	r->srv = v;
	r->chat = chat;
	r->stream = q.stream;
	r->max_tokens = q.max_tokens;
	r->samp = q.samp;
	if (!q.seeded)
		r->samp.seed = (uint64_t)time(NULL) ^ (v->seq * 0x9e3779b97f4a7c15ull);
	memcpy(r->stop, q.stop, sizeof(r->stop)); /* the request owns them now */
	r->n_stop = q.n_stop;
	r->stop_max = q.stop_max;
	q.n_stop = 0;
	rc = (chat ? eng_tokenize_special : eng_tokenize)(v->s.tok, q.prompt, q.prompt_len, true,
							  &r->ids, &r->n_ids);
	if (rc || r->n_ids == 0) {
		ret = BAD(chat ? "messages" : "prompt", "the prompt gives no tokens");
		goto out;
	}
	if (r->n_ids >= n_ctx) {
		ret = send_error(v, c, 400, "invalid_request_error", "context_length_exceeded",
				 chat ? "messages" : "prompt",
				 "the prompt is %zu tokens: more than the context of %u allows",
				 r->n_ids, n_ctx);
		goto out;
	}
	if (r->max_tokens < 0 || (size_t)r->max_tokens > n_ctx - r->n_ids)
		r->max_tokens = (long)(n_ctx - r->n_ids);
	/* queue it, or 503 */
	pthread_mutex_lock(&v->lock);
	if (v->stop || v->n_active + v->qlen >= v->n_slots + (size_t)v->o.queue_max) {
		pthread_mutex_unlock(&v->lock);
		ret = send_error(v, c, 503, "server_error", "server_busy", NULL,
				 "all %u slots are busy and %ld requests wait: try again later",
				 v->n_slots, v->o.queue_max);
		goto out;
	}
	snprintf(r->id, sizeof(r->id), "%s-%" PRIu64, chat ? "chatcmpl" : "cmpl", ++v->seq);
	r->created = (long long)time(NULL);
	r->refs = 2; /* the connection's and the scheduler's */
	if (v->qtail)
		v->qtail->next = r;
	else
		v->qhead = r;
	v->qtail = r;
	v->qlen++;
	pthread_cond_signal(&v->work);
	pthread_mutex_unlock(&v->lock);
	if (r->stream) {
		struct MHD_Response *resp =
			MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_cb, r,
							  stream_free);

		MHD_add_response_header(resp, "Content-Type", "text/event-stream");
		MHD_add_response_header(resp, "Cache-Control", "no-cache");
		ret = MHD_queue_response(c, 200, resp);
		MHD_destroy_response(resp);
	} else {
		ret = send_whole(v, c, r);
	}
	r = NULL;
out:
	if (r) {
		pthread_mutex_lock(&v->lock);
		req_unref(r);
		pthread_mutex_unlock(&v->lock);
	}
	api_request_free(&q);
	return ret;
}

static enum MHD_Result models(struct srv *v, struct MHD_Connection *c)
{
	json_object *o = json_object_new_object(), *d = json_object_new_array(),
		    *m = json_object_new_object();

	json_object_object_add(m, "id", json_object_new_string(v->model_id));
	json_object_object_add(m, "object", json_object_new_string("model"));
	json_object_object_add(m, "created", json_object_new_int64(v->t_start));
	json_object_object_add(m, "owned_by", json_object_new_string("strata"));
	json_object_array_add(d, m);
	json_object_object_add(o, "object", json_object_new_string("list"));
	json_object_object_add(o, "data", d);
	return send_json(c, 200, o);
}

/* Prometheus text format, version 0.0.4. */
static enum MHD_Result metrics(struct srv *v, struct MHD_Connection *c)
{
	char buf[4096];
	int n;
	struct MHD_Response *resp;
	enum MHD_Result ret;
	uint64_t room = 0, limit = 0;

	if (v->s.pc)
		pager_client_room(v->s.pc, &room, &limit);
	pthread_mutex_lock(&v->lock);
	n = snprintf(buf, sizeof(buf),
		     "# HELP strata_requests_total Requests answered, by outcome.\n"
		     "# TYPE strata_requests_total counter\n"
		     "strata_requests_total{outcome=\"ok\"} %" PRIu64 "\n"
		     "strata_requests_total{outcome=\"error\"} %" PRIu64 "\n"
		     "strata_requests_total{outcome=\"busy\"} %" PRIu64 "\n"
		     "strata_requests_total{outcome=\"cancelled\"} %" PRIu64 "\n"
		     "# HELP strata_prompt_tokens_total Prompt tokens fed.\n"
		     "# TYPE strata_prompt_tokens_total counter\n"
		     "strata_prompt_tokens_total %" PRIu64 "\n"
		     "# HELP strata_generated_tokens_total Tokens generated.\n"
		     "# TYPE strata_generated_tokens_total counter\n"
		     "strata_generated_tokens_total %" PRIu64 "\n"
		     "# HELP strata_decode_passes_total Forward passes, every slot's rows in one.\n"
		     "# TYPE strata_decode_passes_total counter\n"
		     "strata_decode_passes_total %" PRIu64 "\n"
		     "# HELP strata_decode_rows_total Rows (tokens fed) over all passes.\n"
		     "# TYPE strata_decode_rows_total counter\n"
		     "strata_decode_rows_total %" PRIu64 "\n"
		     "# HELP strata_tokens_per_second Tokens generated per second, last second.\n"
		     "# TYPE strata_tokens_per_second gauge\n"
		     "strata_tokens_per_second %.2f\n"
		     "# HELP strata_slots_active Slots decoding a request.\n"
		     "# TYPE strata_slots_active gauge\n"
		     "strata_slots_active %u\n"
		     "# HELP strata_slots Slots (-np).\n"
		     "# TYPE strata_slots gauge\n"
		     "strata_slots %u\n"
		     "# HELP strata_queue_length Requests waiting for a slot.\n"
		     "# TYPE strata_queue_length gauge\n"
		     "strata_queue_length %zu\n"
		     "# HELP strata_pager_connected Whether the weights come through the pager.\n"
		     "# TYPE strata_pager_connected gauge\n"
		     "strata_pager_connected %d\n"
		     "# HELP strata_pager_room_bytes What the pager's plan leaves this engine.\n"
		     "# TYPE strata_pager_room_bytes gauge\n"
		     "strata_pager_room_bytes %" PRIu64 "\n",
		     v->n_ok, v->n_err, v->n_rejected, v->n_cancelled, v->n_prompt_tok, v->n_gen_tok,
		     v->n_passes, v->n_rows, v->rate, v->n_active, v->n_slots, v->qlen,
		     v->s.pc != NULL, room);
	pthread_mutex_unlock(&v->lock);
	resp = MHD_create_response_from_buffer((size_t)n, buf, MHD_RESPMEM_MUST_COPY);
	MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
	ret = MHD_queue_response(c, 200, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
			       const char *method, const char *version, const char *upload,
			       size_t *upload_size, void **con_cls)
{
	struct srv *v = cls;
	struct conn *cn = *con_cls;
	bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
	bool ready;

	(void)version;
	if (!cn) {
		cn = calloc(1, sizeof(*cn));
		if (!cn)
			return MHD_NO;
		*con_cls = cn;
		return MHD_YES;
	}
	if (*upload_size) {
		if (cn->too_big || cn->len + *upload_size > MAX_BODY) {
			cn->too_big = true;
		} else {
			char *b = realloc(cn->body, cn->len + *upload_size + 1);

			if (!b)
				return MHD_NO;
			cn->body = b;
			memcpy(cn->body + cn->len, upload, *upload_size);
			cn->len += *upload_size;
			cn->body[cn->len] = 0;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	pthread_mutex_lock(&v->lock);
	ready = v->ready;
	pthread_mutex_unlock(&v->lock);
	if (!strcmp(url, "/health")) {
		json_object *o = json_object_new_object();

		json_object_object_add(o, "status", json_object_new_string(ready ? "ok" : "loading"));
		return send_json(c, ready ? 200 : 503, o);
	}
	if (v->o.api_key) {
		const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");

		if (!auth || strncmp(auth, "Bearer ", 7) || strcmp(auth + 7, v->o.api_key))
			return send_error(v, c, 401, "invalid_request_error", "invalid_api_key", NULL,
					  auth ? "the API key is wrong"
					       : "an API key is needed: Authorization: Bearer KEY");
	}
	if (!ready)
		return send_error(v, c, 503, "server_error", "loading", NULL,
				  "the model is still loading");
	if (cn->too_big)
		return send_error(v, c, 413, "invalid_request_error", "request_too_large", NULL,
				  "the body is larger than %u bytes", MAX_BODY);
	bool is_chat = !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions");
	bool is_cmpl = !strcmp(url, "/v1/completions") || !strcmp(url, "/completions");
	bool is_models = !strcmp(url, "/v1/models") || !strcmp(url, "/models");
	bool is_metrics = !strcmp(url, "/metrics");

	if ((is_chat || is_cmpl) && post)
		return completion(v, c, cn->body ? cn->body : "", cn->len, is_chat);
	if (is_models && get)
		return models(v, c);
	if (is_metrics && get)
		return metrics(v, c);
	if (is_chat || is_cmpl || is_models || is_metrics)
		return send_error(v, c, 405, "invalid_request_error", "method_not_allowed", NULL,
				  "%s is not allowed on %s", method, url);
	return send_error(v, c, 404, "invalid_request_error", "not_found", NULL,
			  "no such endpoint: %s %.200s", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	struct conn *cn = *con_cls;

	(void)cls;
	(void)c;
	(void)toe;
	if (cn) {
		free(cn->body);
		free(cn);
	}
	*con_cls = NULL;
}

/* Each streamed event goes out as it is made: without TCP_NODELAY a small
 * write waits for the peer's (delayed) ACK of the one before, ~40 ms. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	const union MHD_ConnectionInfo *ci;
	int one = 1;

	(void)cls;
	(void)socket_context;
	if (code != MHD_CONNECTION_NOTIFY_STARTED)
		return;
	ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci)
		setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ---- the command --------------------------------------------------------------- */

static void special_text(const struct eng_tokenizer *t, int32_t id, char *buf, size_t n)
{
	/* control tokens print as ""; their text is what a template writes */
	buf[0] = 0;
	if (id >= 0)
		(void)!eng_token_to_piece(t, id, buf, n);
}

/* The address to listen on: --host (a name or a numeric IPv4/IPv6
 * address) and --port.  0 or an exit status after saying why. */
static int listen_addr(const struct opts *o, struct sockaddr_storage *sa, socklen_t *len)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *res;
	char port[16];
	int rc;

	snprintf(port, sizeof(port), "%ld", o->port);
	rc = getaddrinfo(o->host, port, &hints, &res);
	if (rc) {
		msg("--host %s: %s", o->host, gai_strerror(rc));
		return EXIT_USAGE;
	}
	memcpy(sa, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

int cmd_serve(int argc, char **argv)
{
	static struct srv v;
	struct MHD_Daemon *d;
	pthread_t sched;
	sigset_t sigs;
	struct sockaddr_storage sa;
	socklen_t sa_len;
	int sig, rc, kind;
	const union MHD_DaemonInfo *info;
	const char *base;

	memset(&v, 0, sizeof(v));
	rc = parse_opts(argc, argv, "serve", &v.o);
	if (rc)
		return rc;
	if ((rc = listen_addr(&v.o, &sa, &sa_len)))
		return rc;
	if (!v.o.seen_temp)
		v.o.samp.temp = 1.0f; /* OpenAI's default; a request says its own */
	pthread_mutex_init(&v.lock, NULL);
	pthread_cond_init(&v.work, NULL);
	v.t_start = (long long)time(NULL);
	v.turn_end = -1;
	base = strrchr(v.o.model, '/');
	snprintf(v.model_id, sizeof(v.model_id), "%s",
		 v.o.alias ? v.o.alias : base ? base + 1 : v.o.model);
	/* SIGINT and SIGTERM end the server, through sigwait below: no thread
	 * started from here takes them */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* listening first: /health says "loading" while the model loads */
	d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
				     (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
			     (uint16_t)v.o.port, NULL, NULL, handler, &v,
			     MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
			     MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
			     MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
			     MHD_OPTION_CONNECTION_TIMEOUT, 600u,
			     MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_END);
	if (!d) {
		msg("cannot listen on %s port %ld: %s", v.o.host, v.o.port, strerror(errno));
		return EXIT_BAD_INPUT;
	}
	info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	msg("listening on http://%s:%u", v.o.host, info ? info->port : (unsigned)v.o.port);
	rc = session_open(&v.s, &v.o, true);
	if (!rc)
		rc = session_template(&v.s, &v.o, &kind);
	if (rc) {
		MHD_stop_daemon(d);
		session_close(&v.s);
		return rc;
	}
	v.tmpl = (enum tmpl_kind)kind;
	v.n_vocab = v.s.hp->n_vocab;
	special_text(v.s.tok, eng_tokenizer_bos(v.s.tok), v.bos_text, sizeof(v.bos_text));
	special_text(v.s.tok, eng_tokenizer_eos(v.s.tok), v.eos_text, sizeof(v.eos_text));
	if (tmpl_turn_end(v.tmpl)) {
		int32_t *ids;
		size_t n;
		const char *te = tmpl_turn_end(v.tmpl);

		if (!eng_tokenize_special(v.s.tok, te, strlen(te), false, &ids, &n)) {
			if (n == 1)
				v.turn_end = ids[0];
			free(ids);
		}
	}
	v.n_slots = v.s.n_seqs;
	v.slots = calloc(v.n_slots, sizeof(*v.slots));
	if (!v.slots) {
		msg("out of memory");
		MHD_stop_daemon(d);
		session_close(&v.s);
		return EXIT_BAD_INPUT;
	}
	for (unsigned i = 0; i < v.n_slots; i++)
		v.slots[i].ctx = v.s.seqs[i];
	v.rate_t0 = now_s();
	if (pthread_create(&sched, NULL, scheduler, &v)) {
		msg("cannot start the scheduler");
		MHD_stop_daemon(d);
		session_close(&v.s);
		return EXIT_BAD_INPUT;
	}
	pthread_mutex_lock(&v.lock);
	v.ready = true;
	pthread_mutex_unlock(&v.lock);
	msg("%s ready: %u slots of %u tokens, chat template %s", v.model_id, v.n_slots,
	    eng_ctx_n_ctx(v.s.ctx), tmpl_name(v.tmpl));

	sigwait(&sigs, &sig);
	msg("stopping (%s)", sig == SIGINT ? "SIGINT" : "SIGTERM");
	/* the scheduler stops between passes; every request still open ends
	 * as it stands, so no connection waits on it */
	pthread_mutex_lock(&v.lock);
	v.stop = true;
	pthread_cond_signal(&v.work);
	pthread_mutex_unlock(&v.lock);
	pthread_join(sched, NULL);
	pthread_mutex_lock(&v.lock);
	for (unsigned i = 0; i < v.n_slots; i++)
		if (v.slots[i].r)
			slot_finish(&v, &v.slots[i], "length");
	while (v.qhead) {
		struct req *r = v.qhead;

		v.qhead = r->next;
		r->state = REQ_DONE;
		r->finish = "length";
		pthread_cond_broadcast(&r->cond);
		req_unref(r);
	}
	pthread_mutex_unlock(&v.lock);
	MHD_stop_daemon(d);
	free(v.slots);
	session_close(&v.s);
	return 0;
}
