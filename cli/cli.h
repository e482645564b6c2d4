/*
 * cli.h - what the sub-commands of `strata` share: the options and their
 * parsing (opts.c), the loaded model and its context (session.c), and the
 * sub-commands themselves, each int cmd_NAME(argc, argv) returning an exit
 * status.
 */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

#include "engine.h"
#include "pager.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define EXIT_USAGE 1
#define EXIT_BAD_INPUT 2
#define MIB(x) ((double)(x) / 1048576.0)

/* opts.c */
extern const char usage_text[];
/* "strata: " and the message and a newline, to stderr. */
void __attribute__((format(printf, 1, 2))) msg(const char *fmt, ...);
/* Print why (if any) and the usage text; returns EXIT_USAGE. */
int usage(const char *why);

/* Options shared by every command; each command uses what it needs. */
struct opts {
	const char *model;
	const char *prompt;
	const char *prompt_file;
	const char *text;
	const char *tokens;
	const char *logits_out;
	const char *pager;
	long n_predict;
	long n_prompt;
	unsigned threads;
	unsigned ctx;
	unsigned batch;
	bool no_bos;
	bool json;
	bool no_hw;
	enum eng_kv_type type_k, type_v;
	bool seen_ctk, seen_ctv;
	bool context_shift; /* run: shift the context when it fills */
	long keep;          /* run: tokens --context-shift keeps (-1: the prompt) */
	long warmup;     /* bench: tokens decoded before measuring */
	const char *trace; /* bench: a line per decoded token into this file */
	bool random_tokens; /* bench: decode pseudo-random tokens, not the greedy ones */
	struct eng_sampler_config samp;
	/* run, bench: speculative decoding (spec.c) */
	const char *draft_model;
	bool lookup;
	long draft_max, draft_min, lookup_min;
	const char *pass_sizes; /* bench: time passes over these many positions */
	bool seen_n, seen_p, seen_temp;
	/* serve, chat */
	const char *chat_template; /* a family's name (template.h), overriding the GGUF's */
	const char *host;
	long port;
	long n_parallel;           /* serve: sequences decoded together (-np) */
	long queue_max;            /* serve: requests waiting beyond those; then 503 */
	const char *api_key;       /* serve: required as "Authorization: Bearer KEY" */
	const char *alias;         /* serve: the model's id in the API */
};

enum {
	OPT_TEMP = 256,
	OPT_TOP_K,
	OPT_TOP_P,
	OPT_MIN_P,
	OPT_SEED,
	OPT_TOKENS,
	OPT_LOGITS_OUT,
	OPT_NO_BOS,
	OPT_TEXT,
	OPT_JSON,
	OPT_PAGER,
	OPT_NO_HW,
	OPT_WARMUP,
	OPT_TRACE,
	OPT_RANDOM_TOKENS,
	OPT_CACHE_K,
	OPT_CACHE_V,
	OPT_CONTEXT_SHIFT,
	OPT_KEEP,
	OPT_DRAFT_MODEL,
	OPT_DRAFT_MAX,
	OPT_DRAFT_MIN,
	OPT_LOOKUP,
	OPT_LOOKUP_MIN,
	OPT_PASS_SIZES,
	OPT_CHAT_TEMPLATE,
	OPT_HOST,
	OPT_PORT,
	OPT_PARALLEL,
	OPT_QUEUE,
	OPT_API_KEY,
	OPT_ALIAS,
};

/* Parse argv for sub-command cmd into o.  Returns 0, or EXIT_USAGE after
 * printing why. */
int parse_opts(int argc, char **argv, const char *cmd, struct opts *o);

/* session.c */
/* The loaded model and where its bytes live. */
struct session {
	const void *base;
	size_t size;
	struct pager_client *pc; /* when the pager maps the model */
	struct eng_model *model;
	struct eng_ctx *ctx;
	struct eng_ctx **seqs; /* [n_seqs] with --parallel: seqs[0] is ctx */
	unsigned n_seqs;
	const struct eng_hparams *hp;
	const struct eng_tokenizer *tok;
	uint64_t own_bytes; /* the process's heap once the model is loaded */
	/* the draft model (--draft-model), mapped plainly, and its context */
	const void *draft_base;
	size_t draft_size;
	struct eng_model *draft;
	struct eng_ctx *draft_ctx;
	uint64_t draft_bytes; /* what the draft holds: its heap, and the weights it
			       * computes with that are not the model's (session_open) */
	struct eng_spec *spec; /* with a draft model or --lookup */
	enum eng_kv_type type_k, type_v; /* the cache's, as given or sized */
	/* decode passes not yet reported to the pager (session_decode) */
	bool pass_open;
	uint32_t pass_all, pass_produced; /* every pass, and the tokens they gave */
	uint32_t pass_tokens;             /* one-token passes, timed */
	double pass_s, pass_since;
	uint64_t *pass_layer_ns; /* [n_layer] */
	uint64_t pass_outside_ns;
};

/* Map and load o->model (through the pager with o->pager) and, with
 * want_ctx, create its context sized to memory and declare it to the
 * pager.  Returns 0 or an exit status after saying why. */
int session_open(struct session *s, const struct opts *o, bool want_ctx);
void session_close(struct session *s);
/* eng_decode, timing single-token passes for the pager's predictor. */
int session_decode(struct session *s, const int32_t *ids, size_t n, float *logits, bool all);
/* Count decode passes and the tokens they produced, for the pager's status. */
void session_produced(struct session *s, uint32_t passes, uint32_t tokens);
/* One decode pass after token last (chosen, not fed): plain -- last fed,
 * the next token sampled from its logits into out[0] -- or speculative
 * (eng_spec_step: several tokens into out, room for 32); counted. */
int session_step(struct session *s, struct eng_sampler *sm, int32_t last, float *logits,
		 int32_t *out, uint32_t *n_out);
/* Bytes of the weights' mapping reached through 2 MiB page-table entries
 * (smaps' FilePmdMapped + ShmemPmdMapped); walks the page tables. */
uint64_t session_huge_mapped_bytes(const struct session *s);

double now_s(void);  /* CLOCK_MONOTONIC, seconds */
double unix_s(void); /* wall-clock time, to line a trace up with other logs */
uint64_t peak_rss_bytes(void);
/* "N passes, N drafted, N accepted (P%; A per token), T tokens per pass":
 * the speculation so far, into buf. */
char *spec_summary(const struct session *s, char *buf, size_t len);
/* All of a stream into a NUL-terminated malloc'd buffer; NULL on error. */
char *read_all(FILE *f, size_t *len);
/* The text of token id to stdout. */
void print_piece(const struct eng_tokenizer *tok, int32_t id);

/* eng_decode_multi over the session's sequences, reported to the pager as
 * session_decode's passes are (produced: tokens the pass gave). */
int session_decode_multi(struct session *s, struct eng_ctx *const *ctxs, const int32_t *ids,
			 const bool *want, size_t n, float *logits, uint32_t produced);
/* The chat template to use: --chat-template, else the GGUF's if known, else
 * ChatML with a notice.  0 or an exit status after saying why. */
int session_template(const struct session *s, const struct opts *o, int *kind);

/* the sub-commands */
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_chat(int argc, char **argv);

#endif
