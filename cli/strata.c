/*
 * strata.c - the `strata` command: run, eval, tokenize, bench.
 *
 * The command line is a stable interface that scripts and later issues use.
 * Messages go to stderr and start with "strata: "; exit status is 0 on
 * success, 1 for a usage error, 2 for a bad model or bad input.
 *
 * The weights reach the engine as (base, size) of the whole file, from
 * open_weights(): a plain mmap, or, with --pager SOCKET (or $STRATA_PAGER),
 * the pager's mapping.  Nothing else in the engine knows the difference.
 *
 * bench also measures the machine (hwbench.h) after the engine has run, so
 * neither the timings nor the peak RSS it reports include the measurement.
 */
#include "engine.h"
#include "hwbench.h"
#include "pager.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXIT_USAGE 1
#define EXIT_BAD_INPUT 2

static void __attribute__((format(printf, 1, 2))) msg(const char *fmt, ...)
{
	va_list ap;

	fputs("strata: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static const char usage_text[] =
	"usage: strata COMMAND [options]\n"
	"\n"
	"  run      -m MODEL [-p PROMPT | -f FILE] [-n N] [-t THREADS] [-c CTX] [-b BATCH]\n"
	"           [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
	"           [--context-shift [--keep N]]\n"
	"  eval     -m MODEL --tokens ID,ID,... --logits-out FILE [-t THREADS] [-c CTX]\n"
	"           [-b BATCH]\n"
	"  tokenize -m MODEL [--no-bos] [--text STRING]   (stdin without --text)\n"
	"  bench    -m MODEL [-p N] [-n N] [-t THREADS] [-c CTX] [-b BATCH] [--json]\n"
	"           [--warmup N] [--no-hw] [--trace FILE]\n"
	"\n"
	"Every command also takes --pager SOCKET (default $STRATA_PAGER): map the\n"
	"model through a running stratad instead of mmap.  run, eval and bench take\n"
	"-ctk/--cache-type-k and -ctv/--cache-type-v TYPE (f16, q8_0, q4_0): the KV\n"
	"cache's element types.\n"
	"Exit status: 0 ok, 1 usage error, 2 bad model or input.\n";

static int usage(const char *why)
{
	if (why)
		msg("%s", why);
	fputs(usage_text, stderr);
	return EXIT_USAGE;
}

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
	struct eng_sampler_config samp;
	bool seen_n, seen_p;
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
	OPT_CACHE_K,
	OPT_CACHE_V,
	OPT_CONTEXT_SHIFT,
	OPT_KEEP,
};

static bool parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static bool parse_float(const char *s, float lo, float hi, float *out)
{
	char *end;
	float v;

	errno = 0;
	v = strtof(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi))
		return false;
	*out = v;
	return true;
}

/* Returns 0, or EXIT_USAGE after printing why. */
static int parse_opts(int argc, char **argv, const char *cmd, struct opts *o)
{
	static const struct option lo[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "file", required_argument, NULL, 'f' },
		{ "n-predict", required_argument, NULL, 'n' },
		{ "threads", required_argument, NULL, 't' },
		{ "ctx-size", required_argument, NULL, 'c' },
		{ "batch", required_argument, NULL, 'b' },
		{ "temp", required_argument, NULL, OPT_TEMP },
		{ "top-k", required_argument, NULL, OPT_TOP_K },
		{ "top-p", required_argument, NULL, OPT_TOP_P },
		{ "min-p", required_argument, NULL, OPT_MIN_P },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "tokens", required_argument, NULL, OPT_TOKENS },
		{ "logits-out", required_argument, NULL, OPT_LOGITS_OUT },
		{ "no-bos", no_argument, NULL, OPT_NO_BOS },
		{ "text", required_argument, NULL, OPT_TEXT },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "pager", required_argument, NULL, OPT_PAGER },
		{ "no-hw", no_argument, NULL, OPT_NO_HW },
		{ "warmup", required_argument, NULL, OPT_WARMUP },
		{ "trace", required_argument, NULL, OPT_TRACE },
		{ "cache-type-k", required_argument, NULL, OPT_CACHE_K },
		{ "cache-type-v", required_argument, NULL, OPT_CACHE_V },
		{ "context-shift", no_argument, NULL, OPT_CONTEXT_SHIFT },
		{ "keep", required_argument, NULL, OPT_KEEP },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool is_bench = strcmp(cmd, "bench") == 0;
	char why[256], name[64];
	long v;
	int c, li;

	memset(o, 0, sizeof(*o));
	o->n_predict = 128;
	o->warmup = 1;
	o->pager = getenv("STRATA_PAGER");
	if (o->pager && !*o->pager)
		o->pager = NULL;
	o->samp = (struct eng_sampler_config){ .temp = 0.8f, .top_k = 40, .top_p = 0.95f,
					       .min_p = 0.05f, .seed = (uint64_t)time(NULL) };
	/* llama.cpp's one-dash long spellings */
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-ctk"))
			argv[i] = (char *)"--cache-type-k";
		else if (!strcmp(argv[i], "-ctv"))
			argv[i] = (char *)"--cache-type-v";
	}
	optind = 1;
	opterr = 0;
	while ((li = -1, c = getopt_long(argc, argv, ":m:p:f:n:t:c:b:h", lo, &li)) != -1) {
		switch (c) {
		case 'm':
			o->model = optarg;
			break;
		case 'p':
			if (is_bench) {
				if (!parse_long(optarg, 0, 1 << 20, &o->n_prompt))
					goto bad;
				o->seen_p = true;
			} else {
				o->prompt = optarg;
			}
			break;
		case 'f':
			o->prompt_file = optarg;
			break;
		case 'n':
			if (!parse_long(optarg, 0, 1 << 24, &o->n_predict))
				goto bad;
			o->seen_n = true;
			break;
		case 't':
			if (!parse_long(optarg, 1, 1024, &v))
				goto bad;
			o->threads = (unsigned)v;
			break;
		case 'c':
			if (!parse_long(optarg, 1, 1 << 20, &v))
				goto bad;
			o->ctx = (unsigned)v;
			break;
		case 'b':
			if (!parse_long(optarg, 1, 1 << 16, &v))
				goto bad;
			o->batch = (unsigned)v;
			break;
		case OPT_TEMP:
			if (!parse_float(optarg, 0, 100, &o->samp.temp))
				goto bad;
			break;
		case OPT_TOP_K:
			if (!parse_long(optarg, 0, INT32_MAX, &v))
				goto bad;
			o->samp.top_k = (int32_t)v;
			break;
		case OPT_TOP_P:
			if (!parse_float(optarg, 0, 1, &o->samp.top_p))
				goto bad;
			break;
		case OPT_MIN_P:
			if (!parse_float(optarg, 0, 1, &o->samp.min_p))
				goto bad;
			break;
		case OPT_SEED:
			if (!parse_long(optarg, 0, LONG_MAX, &v))
				goto bad;
			o->samp.seed = (uint64_t)v;
			break;
		case OPT_TOKENS:
			o->tokens = optarg;
			break;
		case OPT_LOGITS_OUT:
			o->logits_out = optarg;
			break;
		case OPT_NO_BOS:
			o->no_bos = true;
			break;
		case OPT_TEXT:
			o->text = optarg;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_PAGER:
			o->pager = optarg;
			break;
		case OPT_WARMUP:
			if (!parse_long(optarg, 0, 1 << 16, &o->warmup))
				goto bad;
			break;
		case OPT_NO_HW:
			o->no_hw = true;
			break;
		case OPT_TRACE:
			o->trace = optarg;
			break;
		case OPT_CACHE_K:
		case OPT_CACHE_V:
			*(c == OPT_CACHE_K ? &o->seen_ctk : &o->seen_ctv) = true;
			if (eng_kv_type_parse(optarg, c == OPT_CACHE_K ? &o->type_k : &o->type_v)) {
				snprintf(why, sizeof(why),
					 "%s: unknown cache type '%s' for '%s' (f16, q8_0, q4_0)", cmd,
					 optarg, c == OPT_CACHE_K ? "-ctk" : "-ctv");
				return usage(why);
			}
			break;
		case OPT_CONTEXT_SHIFT:
			o->context_shift = true;
			break;
		case OPT_KEEP:
			if (!parse_long(optarg, -1, 1 << 20, &o->keep))
				goto bad;
			break;
		case 'h':
			fputs(usage_text, stdout);
			exit(0);
		case ':':
			snprintf(why, sizeof(why), "%s: option '%s' needs a value", cmd,
				 argv[optind - 1]);
			return usage(why);
		default:
			snprintf(why, sizeof(why), "%s: unknown option '%s'", cmd, argv[optind - 1]);
			return usage(why);
		}
	}
	if (optind < argc) {
		snprintf(why, sizeof(why), "%s: unexpected argument '%s'", cmd, argv[optind]);
		return usage(why);
	}
	if (!o->model) {
		snprintf(why, sizeof(why), "%s: -m MODEL is required", cmd);
		return usage(why);
	}
	return 0;
bad:
	/* the option as named (li: which long one, -1 for a short one) */
	if (li >= 0)
		snprintf(name, sizeof(name), "--%s", lo[li].name);
	else
		snprintf(name, sizeof(name), "-%c", c);
	snprintf(why, sizeof(why), "%s: invalid value '%s' for option '%s'", cmd, optarg, name);
	return usage(why);
}

/*
 * A plain mapping of the model file raises SIGBUS when a page cannot be
 * read: the file shrank under us, the disk failed, or the filesystem went
 * away (a FUSE daemon that died).  That is bad input, not a crash: one line
 * and exit 2.  (Through --pager, the pager client watches the daemon.)
 */
static struct {
	const char *base;
	size_t size;
	char msg[512];
	size_t len;
} mapped;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	const char *a = si->si_addr;

	(void)uc;
	if (a >= mapped.base && a < mapped.base + mapped.size) {
		(void)!write(STDERR_FILENO, mapped.msg, mapped.len);
		_exit(EXIT_BAD_INPUT);
	}
	signal(sig, SIG_DFL); /* not ours: die of it as we would have */
}

static void watch_mapping(const char *path, const void *base, size_t size)
{
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO };
	int n;

	mapped.base = base;
	mapped.size = size;
	n = snprintf(mapped.msg, sizeof(mapped.msg),
		     "strata: %s: a page of the model could not be read (the file shrank, an "
		     "I/O error, or its filesystem went away)\n", path);
	mapped.len = n > 0 && (size_t)n < sizeof(mapped.msg) ? (size_t)n : sizeof(mapped.msg) - 1;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
}

/* The loaded model and where its bytes live. */
struct session {
	const void *base;
	size_t size;
	struct pager_client *pc; /* when the pager maps the model */
	struct eng_model *model;
	struct eng_ctx *ctx;
	const struct eng_hparams *hp;
	const struct eng_tokenizer *tok;
	uint64_t own_bytes; /* the process's heap once the model is loaded */
	enum eng_kv_type type_k, type_v; /* the cache's, as given or sized */
	/* decode passes not yet reported to the pager (session_decode) */
	uint32_t pass_tokens;
	double pass_s, pass_since;
	uint64_t *pass_layer_ns; /* [n_layer] */
	uint64_t pass_outside_ns;
};

/*
 * The process's own anonymous memory in use (RssAnon): once the model is
 * loaded, its tokenizer tables, tensor index and the C library's heap.  With
 * the context's allocations (KV cache, activation buffers: eng_ctx_bytes,
 * counted as allocated since calloc leaves large ones untouched until used)
 * it is what the engine declares to the pager, which holds it against the
 * budget.  0 where /proc cannot tell.
 */
static uint64_t anon_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

#define MIB(x) ((double)(x) / 1048576.0)
#define CTX_MIN 256 /* the smallest context sized to memory */

/*
 * The context sized to memory (no -c): the largest that fits, from the
 * model's trained context down by halves, and at each size the best cache
 * type that fits (f16, then q8_0, then q4_0, for K and V alike; a type given
 * with -ctk/-ctv stays).  What it may take is the memory this process may
 * still use (hwbench_mem_headroom: the memory cgroup's room, or
 * MemAvailable) less the model's weights, which want to stay in memory too;
 * when they do not fit anyway (they will stream from the file), a quarter
 * of the room.  Through the pager, the daemon holds the weights and says
 * what its plan leaves this engine (pager_client_room): the --mode's room
 * for engines, which costs no resident layer, or where that is less than
 * the default context (min(trained, 4096)) needs, the default context, as
 * far as the most the daemon lets it declare.  The choice is told in one
 * line.  An explicit -c is checked against the whole room (the weights can
 * be paged out, the context cannot), through the pager against that most,
 * and refused with the numbers.  Returns 0 or an exit status.
 */
static int size_context(struct session *s, const struct opts *o, struct eng_ctx_config *cc)
{
	struct hwbench_headroom room;
	char err[256];
	uint64_t w = s->hp->weight_bytes, budget;
	uint32_t top = s->hp->n_ctx_train ? s->hp->n_ctx_train : 4096;
	const char *why;

	if (s->pc) {
		uint64_t mode_room, limit;
		struct eng_ctx_size def;
		struct eng_ctx_config d = *cc;

		pager_client_room(s->pc, &mode_room, &limit);
		if (limit == UINT64_MAX && !cc->n_ctx)
			return 0; /* no budget: the default context */
		d.n_ctx = s->hp->n_ctx_train && s->hp->n_ctx_train < 4096 ? s->hp->n_ctx_train : 4096;
		budget = mode_room;
		why = "the pager's room for engines in its mode";
		if (!eng_ctx_size(s->model, &d, &def, err, sizeof(err)) && budget < def.total_bytes) {
			budget = def.total_bytes < limit ? def.total_bytes : limit;
			top = d.n_ctx; /* no more than the default */
			why = "the default context, within what the pager lets this engine declare";
		}
		room = (struct hwbench_headroom){ .bytes = limit };
	} else {
		if (hwbench_mem_headroom("", &room))
			return 0; /* the default context */
		bool weights_fit = room.bytes > w + ((uint64_t)64 << 20);

		budget = weights_fit ? room.bytes - w : room.bytes / 4;
		why = weights_fit ? "the memory left after the weights"
				  : "a quarter of the memory left (the weights do not fit)";
	}
	if (cc->n_ctx) {
		struct eng_ctx_size sz;

		if (eng_ctx_size(s->model, cc, &sz, err, sizeof(err))) {
			msg("%s: %s", o->model, err);
			return EXIT_BAD_INPUT;
		}
		if (sz.total_bytes > room.bytes) {
			msg("%s: a context of %u tokens needs %.0f MiB (KV cache %s/%s %.0f MiB), "
			    "%.0f MiB left to this process%s: use a smaller -c, or -ctk/-ctv q8_0 or q4_0",
			    o->model, cc->n_ctx, MIB(sz.total_bytes), eng_kv_type_name(cc->type_k),
			    eng_kv_type_name(cc->type_v), MIB(sz.kv_bytes), MIB(room.bytes),
			    s->pc ? " by the pager's budget" : "");
			return EXIT_BAD_INPUT;
		}
		return 0;
	}
	top = top > (1u << 20) ? 1u << 20 : top;
	for (uint32_t n = top;; n = n / 2 > CTX_MIN ? n / 2 : CTX_MIN) {
		struct eng_ctx_size sz;

		for (int t = 0; t < ENG_KV_COUNT; t++) {
			struct eng_ctx_config try = *cc;

			try.n_ctx = n;
			try.type_k = o->seen_ctk ? o->type_k : (enum eng_kv_type)t;
			try.type_v = o->seen_ctv ? o->type_v : (enum eng_kv_type)t;
			if (eng_ctx_size(s->model, &try, &sz, err, sizeof(err)))
				continue; /* a type the model's heads do not fit */
			if (sz.total_bytes <= budget) {
				*cc = try;
				msg("context %u tokens, KV cache %s/%s %.1f MiB (%.1f MiB in all): the "
				    "largest that fits %.0f MiB, %s",
				    n, eng_kv_type_name(try.type_k), eng_kv_type_name(try.type_v),
				    MIB(sz.kv_bytes), MIB(sz.total_bytes), MIB(budget), why);
				return 0;
			}
		}
		if (n <= CTX_MIN)
			break;
	}
	if (s->pc)
		msg("%s: not even a context of %u tokens fits the %.0f MiB the pager's budget lets "
		    "this engine declare",
		    o->model, CTX_MIN < top ? CTX_MIN : top, MIB(room.bytes));
	else
		msg("%s: not even a context of %u tokens fits: %.0f MiB left to this process, "
		    "%.0f MiB of weights",
		    o->model, CTX_MIN < top ? CTX_MIN : top, MIB(room.bytes), MIB(w));
	return EXIT_BAD_INPUT;
}

static int session_open(struct session *s, const struct opts *o, bool want_ctx)
{
	char err[256];
	int rc;

	memset(s, 0, sizeof(*s));
	if (o->pager && want_ctx) {
		/* The engine's own memory (KV cache, buffers) is known only
		 * once the header is read through the mapping: it is declared
		 * to the daemon after the context exists. */
		struct pager_client_config pcfg = {
			.socket_path = o->pager,
			.model = o->model,
			.declared_bytes = 0,
		};

		rc = pager_client_open(&pcfg, &s->pc, &s->base, &s->size, err, sizeof(err));
		if (rc) {
			msg("%s: %s", o->model, err);
			return EXIT_BAD_INPUT;
		}
	} else {
		rc = eng_map_file(o->model, &s->base, &s->size);
		if (rc) {
			msg("%s: cannot map the model: %s", o->model, strerror(-rc));
			return EXIT_BAD_INPUT;
		}
		watch_mapping(o->model, s->base, s->size);
	}
	rc = want_ctx ? eng_model_load(s->base, s->size, &s->model, err, sizeof(err))
		      : eng_model_load_vocab(s->base, s->size, &s->model, err, sizeof(err));
	if (rc) {
		msg("%s: %s", o->model, err);
		return EXIT_BAD_INPUT;
	}
	s->hp = eng_model_hparams(s->model);
	s->tok = eng_model_tokenizer(s->model);
	if (!want_ctx)
		return 0;
	s->own_bytes = anon_rss_bytes();
	struct eng_ctx_config cc = { .n_ctx = o->ctx, .n_threads = o->threads, .n_batch = o->batch,
				     .type_k = o->type_k, .type_v = o->type_v };
	if ((rc = size_context(s, o, &cc)))
		return rc;
	s->type_k = cc.type_k;
	s->type_v = cc.type_v;
	rc = eng_ctx_create(s->model, &cc, &s->ctx, err, sizeof(err));
	if (rc) {
		msg("%s: %s", o->model, err);
		return EXIT_BAD_INPUT;
	}
	if (s->pc && pager_client_declare(s->pc, s->own_bytes + eng_ctx_bytes(s->ctx),
					  eng_ctx_kv_bytes(s->ctx))) {
		msg("%s: cannot talk to the pager", o->model);
		return EXIT_BAD_INPUT;
	}
	/* without it the reports go on, without per-layer times */
	if (s->pc && s->hp->n_layer <= PAGER_PASS_MAX_LAYERS)
		s->pass_layer_ns = calloc(s->hp->n_layer, sizeof(*s->pass_layer_ns));
	return 0;
}

/* The decode passes not yet reported, to the pager (session_decode). */
static void session_report(struct session *s)
{
	uint32_t L = s->pass_layer_ns ? s->hp->n_layer : 0;

	/* a full socket is a daemon that is not reading: the watchdog notices
	 * it going away; a lost report only delays learning */
	pager_client_report(s->pc, s->pass_tokens, (uint64_t)(s->pass_s * 1e9), s->pass_outside_ns,
			    s->pass_layer_ns, L);
	s->pass_tokens = 0;
	s->pass_s = 0;
	s->pass_outside_ns = 0;
	if (L)
		memset(s->pass_layer_ns, 0, L * sizeof(*s->pass_layer_ns));
}

static void session_close(struct session *s)
{
	if (s->pc && s->pass_tokens) /* a run shorter than a report's 0.1 s too */
		session_report(s);
	free(s->pass_layer_ns);
	eng_ctx_destroy(s->ctx);
	eng_model_destroy(s->model);
	if (s->pc)
		pager_client_close(s->pc);
	else
		eng_unmap_file(s->base, s->size);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wall-clock time, to line a trace up with other programs' logs. */
static double unix_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * eng_decode, timing decode passes for the pager: their wall time (waits on
 * faults included) goes to the daemon about ten times a second, and its
 * speed predictor learns the engine's compute time from it.
 */
static int session_decode(struct session *s, const int32_t *ids, size_t n, float *logits,
			  bool all)
{
	double t0 = s->pc && n == 1 ? now_s() : 0;
	int rc = eng_decode(s->ctx, ids, n, logits, all);

	if (rc || !t0)
		return rc;
	double t1 = now_s();
	const uint64_t *layer = eng_ctx_layer_ns(s->ctx);
	uint32_t L = s->pass_layer_ns ? s->hp->n_layer : 0;

	if (!s->pass_tokens)
		s->pass_since = t0;
	s->pass_tokens++;
	s->pass_s += t1 - t0;
	for (uint32_t l = 0; l < L; l++)
		s->pass_layer_ns[l] += layer[l];
	s->pass_outside_ns += eng_ctx_outside_ns(s->ctx);
	if (t1 - s->pass_since >= 0.1)
		session_report(s);
	return 0;
}

static uint64_t peak_rss_bytes(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_maxrss * 1024;
}

/* Read all of a stream into a NUL-terminated buffer. */
static char *read_all(FILE *f, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);

	while (buf) {
		size_t got = fread(buf + n, 1, cap - n - 1, f);

		n += got;
		if (got == 0)
			break;
		if (cap - n - 1 == 0) {
			char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);

			if (!nb) {
				free(buf);
				return NULL;
			}
			buf = nb;
			cap *= 2;
		}
	}
	if (!buf || ferror(f)) {
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	*len = n;
	return buf;
}

static void print_piece(const struct eng_tokenizer *tok, int32_t id)
{
	char buf[256];
	int n = eng_token_to_piece(tok, id, buf, sizeof(buf));

	if (n > 0)
		fwrite(buf, 1, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf), stdout);
}

/*
 * The context is full.  Without --context-shift that is the end, said in one
 * line.  With it, as llama.cpp's: keep the first --keep tokens (plus BOS; -1
 * or more than the prompt: the whole prompt), forget half of the rest, the
 * oldest, and go on.  Returns whether generation may go on.
 */
static bool shift_context(struct session *s, const struct opts *o, size_t n_prompt)
{
	uint32_t n_ctx = eng_ctx_n_ctx(s->ctx), n_past = eng_ctx_n_past(s->ctx);
	uint64_t keep = o->keep < 0 || (uint64_t)o->keep > n_prompt
				? n_prompt
				: (uint64_t)o->keep + eng_tokenizer_adds_bos(s->tok);
	uint32_t n_keep = keep < n_past ? (uint32_t)keep : n_past;
	uint32_t n_discard = (n_past - n_keep) / 2;
	int rc;

	if (!o->context_shift) {
		msg("context of %u tokens is full: generation stopped (--context-shift goes on)",
		    n_ctx);
		return false;
	}
	if (n_discard == 0) {
		msg("context of %u tokens is full and --keep %ld keeps all of it: generation stopped",
		    n_ctx, o->keep);
		return false;
	}
	rc = eng_ctx_shift(s->ctx, n_keep, n_discard);
	if (rc == -ENOTSUP) {
		msg("context of %u tokens is full: generation stopped (%s has recurrent layers, "
		    "whose state cannot forget tokens)",
		    n_ctx, s->hp->arch_name);
		return false;
	}
	if (rc) {
		msg("context of %u tokens is full and could not be shifted: %s", n_ctx,
		    strerror(-rc));
		return false;
	}
	return true;
}

static int cmd_run(int argc, char **argv)
{
	struct opts o;
	struct session s;
	struct eng_sampler *sm = NULL;
	char *text = NULL;
	size_t text_len = 0;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	float *logits = NULL;
	int rc = parse_opts(argc, argv, "run", &o);
	double t0, t1, t2;
	long generated = 0;

	if (rc)
		return rc;
	if (o.prompt && o.prompt_file)
		return usage("run: give -p or -f, not both");
	if (o.prompt_file) {
		FILE *f = fopen(o.prompt_file, "rb");

		if (!f) {
			msg("%s: %s", o.prompt_file, strerror(errno));
			return EXIT_BAD_INPUT;
		}
		text = read_all(f, &text_len);
		fclose(f);
		if (!text) {
			msg("%s: cannot read the prompt", o.prompt_file);
			return EXIT_BAD_INPUT;
		}
	} else {
		text = strdup(o.prompt ? o.prompt : "");
		text_len = strlen(text);
	}
	rc = session_open(&s, &o, true);
	if (rc)
		goto out;
	if (eng_tokenize(s.tok, text, text_len, true, &ids, &n_ids) || n_ids == 0) {
		msg("%s: the prompt gives no tokens to start from", o.model);
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (n_ids >= eng_ctx_n_ctx(s.ctx)) {
		msg("prompt of %zu tokens does not fit the context of %u", n_ids,
		    eng_ctx_n_ctx(s.ctx));
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	logits = malloc((size_t)s.hp->n_vocab * sizeof(float));
	if (!logits || eng_sampler_create(&o.samp, s.hp->n_vocab, &sm)) {
		msg("out of memory");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	t0 = now_s();
	if (session_decode(&s, ids, n_ids, logits, false)) {
		msg("%s: prompt evaluation failed", o.model);
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	t1 = now_s();
	while (generated < o.n_predict) {
		int32_t next = eng_sample(sm, logits);

		if (eng_tokenizer_is_eog(s.tok, next))
			break;
		print_piece(s.tok, next);
		fflush(stdout);
		generated++;
		if (generated == o.n_predict)
			break;
		if (eng_ctx_n_past(s.ctx) >= eng_ctx_n_ctx(s.ctx) && !shift_context(&s, &o, n_ids))
			break;
		if (session_decode(&s, &next, 1, logits, false)) {
			msg("%s: decoding failed", o.model);
			rc = EXIT_BAD_INPUT;
			goto out;
		}
	}
	t2 = now_s();
	/* End the line for a person; keep piped output exactly the text. */
	if (isatty(STDOUT_FILENO))
		fputc('\n', stdout);
	fflush(stdout);
	fprintf(stderr,
		"strata: prompt %zu tokens in %.3f s (%.2f tok/s), generated %ld tokens in %.3f s "
		"(%.2f tok/s), peak RSS %.1f MiB\n",
		n_ids, t1 - t0, n_ids / (t1 - t0 > 0 ? t1 - t0 : 1e-9), generated, t2 - t1,
		generated / (t2 - t1 > 0 ? t2 - t1 : 1e-9), peak_rss_bytes() / 1048576.0);
out:
	free(logits);
	free(ids);
	free(text);
	eng_sampler_destroy(sm);
	session_close(&s);
	return rc;
}

/* "1,2,3" -> ids; every id must be an integer in [0, n_vocab). */
static int parse_token_list(const char *list, uint32_t n_vocab, int32_t **ids, size_t *n)
{
	size_t cap = 1;
	const char *p;
	int32_t *v;

	for (p = list; *p; p++)
		cap += *p == ',';
	v = calloc(cap, sizeof(*v));
	if (!v)
		return -ENOMEM;
	*n = 0;
	p = list;
	for (;;) {
		char *end;
		long x;

		errno = 0;
		x = strtol(p, &end, 10);
		if (end == p || errno || x < 0 || x >= (long)n_vocab ||
		    (*end != ',' && *end != '\0')) {
			msg("--tokens: '%.*s' is not a token id below %u", (int)strcspn(p, ","), p,
			    n_vocab);
			free(v);
			return -EINVAL;
		}
		v[(*n)++] = (int32_t)x;
		if (*end == '\0')
			break;
		p = end + 1;
	}
	*ids = v;
	return 0;
}

static int cmd_eval(int argc, char **argv)
{
	struct opts o;
	struct session s;
	int32_t *ids = NULL;
	size_t n = 0;
	float *logits = NULL;
	FILE *f = NULL;
	int rc = parse_opts(argc, argv, "eval", &o);

	if (rc)
		return rc;
	if (!o.tokens || !o.logits_out)
		return usage("eval: --tokens and --logits-out are required");
	rc = session_open(&s, &o, true);
	if (rc)
		goto out;
	if (parse_token_list(o.tokens, s.hp->n_vocab, &ids, &n)) {
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (n > eng_ctx_n_ctx(s.ctx)) {
		msg("%zu tokens do not fit the context of %u (use -c)", n, eng_ctx_n_ctx(s.ctx));
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	logits = malloc(n * (size_t)s.hp->n_vocab * sizeof(float));
	if (!logits) {
		msg("out of memory");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (session_decode(&s, ids, n, logits, true)) {
		msg("%s: evaluation failed", o.model);
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	f = fopen(o.logits_out, "wb");
	if (!f || fwrite(logits, sizeof(float) * s.hp->n_vocab, n, f) != n || fclose(f)) {
		msg("%s: cannot write logits: %s", o.logits_out, strerror(errno));
		f = NULL;
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	f = NULL;
out:
	if (f)
		fclose(f);
	free(logits);
	free(ids);
	session_close(&s);
	return rc;
}

static int cmd_tokenize(int argc, char **argv)
{
	struct opts o;
	struct session s;
	char *text = NULL;
	size_t len = 0;
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = parse_opts(argc, argv, "tokenize", &o);

	if (rc)
		return rc;
	rc = session_open(&s, &o, false);
	if (rc)
		return rc;
	if (o.text) {
		text = strdup(o.text);
		len = strlen(o.text);
	} else {
		text = read_all(stdin, &len);
	}
	if (!text) {
		msg("cannot read the text");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (eng_tokenize(s.tok, text, len, !o.no_bos, &ids, &n)) {
		msg("tokenization failed");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		printf(i ? " %" PRId32 : "%" PRId32, ids[i]);
	printf("\n");
out:
	free(ids);
	free(text);
	session_close(&s);
	return rc;
}

/*
 * What bench measures of the machine: memory read bandwidth over a buffer
 * far larger than any L3, and O_DIRECT read bandwidth of the model file,
 * the way stratad reads it (1 MiB reads, 16 in flight).  A small model file
 * is read again until enough bytes went by to time; a large one only in
 * part.  One to two seconds in all on this project's machine.
 */
#define HW_MEM_BYTES (1ull << 30)
#define HW_MEM_MIN (256ull << 20)
#define HW_MEM_PASSES 5
#define HW_IO_CHUNK (1ull << 20)
#define HW_IO_DEPTH 16
#define HW_IO_MAX (1ull << 30)
#define HW_IO_MIN (256ull << 20)

struct hw {
	bool measured;         /* false with --no-hw */
	unsigned threads;
	int mem_rc, io_rc;     /* 0 or -errno */
	uint64_t mem_bytes;    /* the buffer asked for, after hw_fit */
	struct hwbench_result mem, io;
	char mem_err[200], io_err[200];
	uint64_t file_bytes;
};

/*
 * A probe's buffer fitted to what the process may still allocate
 * (hwbench_mem_headroom): `want` when there is room, less down to `min`,
 * else 0 with the reason in why.  The buffers count against the process's
 * memory cgroup like everything else: a 1 GiB buffer in a limit the model
 * (or stratad, streaming it in the same cgroup) mostly fills gets bench
 * OOM-killed after the engine has run.
 *
 * A buffer takes at most half the headroom, because the headroom is a
 * snapshot and more is charged after it: stratad in the same cgroup reads
 * layers in while the paired decode runs, the cgroup's usage lags the
 * truth by per-CPU batches, the probe's own page tables and thread stacks
 * are charged too, and MemAvailable counts caches the kernel may not
 * reclaim in time.  Half of a wrong guess still leaves room.  When nothing
 * can be read (no /proc), `want`, as before this check: there is no better
 * guess.
 */
static uint64_t hw_fit(uint64_t want, uint64_t min, char *why, size_t len)
{
	struct hwbench_headroom room;
	uint64_t fit;

	if (hwbench_mem_headroom("", &room))
		return want;
	fit = room.bytes / 2 / (1u << 20) * (1u << 20);
	if (fit >= want)
		return want;
	if (fit >= min)
		return fit;
	snprintf(why, len, "not measured: %" PRIu64 " MiB %s, %" PRIu64 " MiB needed",
		 room.bytes >> 20,
		 room.cgroup < room.available ? "left under the memory cgroup's limit"
					      : "of memory available",
		 2 * min >> 20);
	return 0;
}

/*
 * The memory buffer is HW_MEM_BYTES, or what hw_fit leaves of it, but not
 * under HW_MEM_MIN: a smaller buffer reads partly from the caches.  On a
 * 2-vCPU Xeon of this project's (lscpu: 480 MiB of L3, shared with its
 * neighbours) 64 MiB read at 22-25 GB/s and 128 MiB at 12-22, against 10-18
 * for 256 MiB and 1 GiB alike.  The storage probe's buffer (HW_IO_DEPTH reads of HW_IO_CHUNK)
 * cannot shrink without measuring another reader than stratad's.
 */
static void measure_hw(const char *path, unsigned threads, struct hw *h)
{
	struct hwbench_io_config io = {
		.chunk = HW_IO_CHUNK,
		.depth = HW_IO_DEPTH,
		.max_bytes = HW_IO_MAX,
		.min_bytes = HW_IO_MIN,
	};
	struct stat st;

	h->measured = true;
	h->threads = threads;
	h->mem_bytes = hw_fit(HW_MEM_BYTES, HW_MEM_MIN, h->mem_err, sizeof(h->mem_err));
	if (h->mem_bytes)
		h->mem_rc = hwbench_mem_read(threads, h->mem_bytes, HW_MEM_PASSES, &h->mem);
	else
		h->mem_rc = -ENOMEM;
	if (h->mem_rc && h->mem_bytes)
		snprintf(h->mem_err, sizeof(h->mem_err), "%s", strerror(-h->mem_rc));
	if (!h->mem_bytes)
		msg("bench: memory read %s", h->mem_err);
	if (hw_fit(HW_IO_CHUNK * HW_IO_DEPTH, HW_IO_CHUNK * HW_IO_DEPTH, h->io_err,
		   sizeof(h->io_err))) {
		h->io_rc = hwbench_storage_read(path, &io, &h->io, h->io_err, sizeof(h->io_err));
	} else {
		h->io_rc = -ENOMEM;
		msg("bench: storage read %s", h->io_err);
	}
	if (stat(path, &st) == 0)
		h->file_bytes = (uint64_t)st.st_size;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of v[0..n), n > 0; sorts v. */
static double median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * The paired fraction: n more tokens decoded, each right after one pass
 * over the memory buffer, and the median over tokens of (weight bytes per
 * token / that token's time) / (the pass's bandwidth).  The machine is
 * shared: a neighbour's load comes and goes within a run, and the fastest
 * of measure_hw's passes is the machine at its quietest, while the decode
 * line is the average over whatever came.  A token against the bandwidth
 * read just before it compares the two under the same load.  *gbps gets the
 * median pass.  The buffer is `bytes`, measure_hw's size as far as it still
 * fits.  0, -errno from the memory buffer, or 1 when decoding failed.
 */
static int bench_pairs(struct session *s, int32_t next, long n, unsigned threads,
		       uint64_t bytes, uint64_t tok_bytes, double *frac, double *gbps)
{
	struct hwbench_mem *m = NULL;
	double *ratio = calloc((size_t)n, sizeof(double)), *bw = calloc((size_t)n, sizeof(double));
	float *logits = malloc((size_t)s->hp->n_vocab * sizeof(float));
	int rc = !ratio || !bw || !logits ? -ENOMEM : hwbench_mem_open(threads, bytes, &m);

	for (long i = 0; rc == 0 && i < n; i++) {
		struct hwbench_result r;
		double t0;

		rc = hwbench_mem_pass(m, &r);
		if (rc)
			break;
		t0 = now_s();
		if (session_decode(s, &next, 1, logits, false)) {
			rc = 1;
			break;
		}
		ratio[i] = tok_bytes / (now_s() - t0) / (r.gbps * 1e9);
		bw[i] = r.gbps;
		next = eng_argmax(logits, s->hp->n_vocab);
	}
	if (rc == 0) {
		*frac = median(ratio, (size_t)n);
		*gbps = median(bw, (size_t)n);
	}
	hwbench_mem_close(m);
	free(ratio);
	free(bw);
	free(logits);
	return rc;
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void json_str(const char *str)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

/* A number, or null when not measured (ok false). */
static void json_num(const char *key, bool ok, double v)
{
	if (ok)
		printf(", \"%s\": %.3f", key, v);
	else
		printf(", \"%s\": null", key);
}

static int cmd_bench(int argc, char **argv)
{
	struct opts o;
	struct session s;
	struct hw h = { 0 };
	int32_t *ids = NULL;
	float *logits = NULL;
	double t0, t1, t2, pp_tps = 0, tg_tps = 0;
	uint64_t rss, tok_bytes;
	bool mem_ok, io_ok;
	double bound = 0, stream = 0, frac = 0, pair_frac = 0, pair_gbps = 0;
	long n_pairs = 0;
	double t_start = now_s(), cold_s = 0, first_s = 0;
	FILE *trace = NULL;
	int rc = parse_opts(argc, argv, "bench", &o);

	if (rc)
		return rc;
	if (!o.seen_p)
		o.n_prompt = 64;
	if (!o.seen_n)
		o.n_predict = 32;
	rc = session_open(&s, &o, true);
	if (rc)
		return rc;
	if ((uint64_t)o.n_prompt + (uint64_t)o.n_predict > eng_ctx_n_ctx(s.ctx)) {
		msg("bench: %ld + %ld tokens do not fit the context of %u (use -c)", o.n_prompt,
		    o.n_predict, eng_ctx_n_ctx(s.ctx));
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	if (o.trace) {
		trace = fopen(o.trace, "we");
		if (!trace) {
			msg("bench: %s: %s", o.trace, strerror(errno));
			rc = EXIT_BAD_INPUT;
			goto out;
		}
		setvbuf(trace, NULL, _IOLBF, 0); /* a line per token, as it happens */
	}
	ids = calloc((size_t)o.n_prompt + 1, sizeof(*ids));
	logits = malloc((size_t)s.hp->n_vocab * sizeof(float));
	if (!ids || !logits) {
		msg("out of memory");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
	/* A fixed pseudo-random prompt: same work every run. */
	for (long i = 0; i < o.n_prompt; i++)
		ids[i] = (int32_t)((uint64_t)(i + 1) * 2654435761u % s.hp->n_vocab);
	/* Warm-up (as llama-bench does): tokens decoded and discarded, so the
	 * measured runs find the model in memory, as it is once a server or a
	 * chat has run a while.  The first is the cold token, reported on its
	 * own: its time is mostly the model coming into memory (faults, or the
	 * pager's resident set still loading). */
	for (long i = 0; i < o.warmup; i++) {
		int32_t tok = (int32_t)(i % s.hp->n_vocab);

		if (eng_ctx_n_past(s.ctx) >= eng_ctx_n_ctx(s.ctx))
			eng_ctx_reset(s.ctx);
		t0 = now_s();
		if (session_decode(&s, &tok, 1, logits, false))
			goto fail;
		if (i == 0) {
			cold_s = now_s() - t0;
			first_s = now_s() - t_start;
		}
	}
	eng_ctx_reset(s.ctx);
	t0 = now_s();
	if (o.n_prompt && session_decode(&s, ids, (size_t)o.n_prompt, logits, false))
		goto fail;
	t1 = now_s();
	int32_t next = o.n_prompt ? eng_argmax(logits, s.hp->n_vocab) : 0;
	for (long i = 0; i < o.n_predict; i++) {
		double ts = now_s();

		if (session_decode(&s, &next, 1, logits, false))
			goto fail;
		next = eng_argmax(logits, s.hp->n_vocab);
		if (trace) /* when it ended (unix time) and how long it took */
			fprintf(trace, "%.6f %.6f\n", unix_s(), now_s() - ts);
	}
	t2 = now_s();
	if (o.n_prompt)
		pp_tps = o.n_prompt / (t1 - t0);
	if (o.n_predict)
		tg_tps = o.n_predict / (t2 - t1);
	/* Before the memory measurement allocates its buffer. */
	rss = peak_rss_bytes();
	if (!o.no_hw)
		measure_hw(o.model, o.threads ? o.threads : eng_cpu_count(), &h);
	tok_bytes = eng_model_token_bytes(s.model);
	mem_ok = h.measured && h.mem_rc == 0 && h.mem.gbps > 0 && tok_bytes;
	io_ok = h.measured && h.io_rc == 0 && h.io.gbps > 0 && tok_bytes;
	if (mem_ok) {
		bound = h.mem.gbps * 1e9 / (double)tok_bytes;
		frac = tg_tps / bound;
	}
	if (io_ok)
		stream = h.io.gbps * 1e9 / (double)tok_bytes;
	/* as many pairs as decoded tokens, as far as the context has room */
	if (mem_ok && o.n_predict) {
		long room = (long)(eng_ctx_n_ctx(s.ctx) - eng_ctx_n_past(s.ctx));

		n_pairs = o.n_predict < room ? o.n_predict : room;
	}
	if (n_pairs) {
		/* Fitted again: the headroom may have shrunk since. */
		char why[200];
		uint64_t bytes = hw_fit(h.mem_bytes, HW_MEM_MIN, why, sizeof(why));
		int prc = bytes ? bench_pairs(&s, next, n_pairs, h.threads, bytes, tok_bytes,
					      &pair_frac, &pair_gbps)
				: 0;

		if (prc == 1)
			goto fail;
		if (!bytes)
			msg("bench: paired measurement %s", why);
		else if (prc)
			msg("bench: paired measurement: %s", strerror(-prc));
		if (!bytes || prc)
			n_pairs = 0;
	}
	if (o.json) {
		printf("{\"model\": ");
		json_str(s.hp->name);
		printf(", \"n_prompt\": %ld, \"n_decode\": %ld, \"threads\": %u, "
		       "\"prompt_tps\": %.3f, \"decode_tps\": %.3f, \"peak_rss_bytes\": %" PRIu64
		       ", \"model_bytes\": %" PRIu64 ", \"token_weight_bytes\": %" PRIu64,
		       o.n_prompt, o.n_predict, o.threads, pp_tps, tg_tps, rss, s.hp->weight_bytes,
		       tok_bytes);
		printf(", \"warmup\": %ld", o.warmup);
		printf(", \"n_ctx\": %u, \"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", "
		       "\"kv_bytes\": %" PRIu64 ", \"ctx_bytes\": %" PRIu64,
		       eng_ctx_n_ctx(s.ctx), eng_kv_type_name(s.type_k), eng_kv_type_name(s.type_v),
		       eng_ctx_kv_bytes(s.ctx), eng_ctx_bytes(s.ctx));
		if (o.warmup) /* microseconds: a small model's token is well under 1 ms */
			printf(", \"cold_token_s\": %.6f, \"first_token_s\": %.6f", cold_s, first_s);
		else
			printf(", \"cold_token_s\": null, \"first_token_s\": null");
		json_num("mem_read_gbps", mem_ok, h.mem.gbps);
		printf(", \"mem_read_threads\": %u, \"mem_read_bytes\": %" PRIu64
		       ", \"mem_read_error\": ",
		       h.threads, h.mem.bytes);
		if (!h.measured)
			json_str("not measured (--no-hw)");
		else if (h.mem_rc)
			json_str(h.mem_err);
		else
			printf("null");
		json_num("storage_read_gbps", io_ok, h.io.gbps);
		printf(", \"storage_read_bytes\": %" PRIu64 ", \"storage_read_error\": ", h.io.bytes);
		if (!h.measured)
			json_str("not measured (--no-hw)");
		else if (h.io_rc)
			json_str(h.io_err);
		else
			printf("null");
		json_num("decode_bound_tps", mem_ok, bound);
		json_num("decode_fraction", mem_ok, frac);
		printf(", \"paired_tokens\": %ld", n_pairs);
		json_num("paired_mem_read_gbps", n_pairs > 0, pair_gbps);
		json_num("paired_fraction", n_pairs > 0, pair_frac);
		json_num("stream_bound_tps", io_ok, stream);
		printf("}\n");
	} else {
		printf("model        %s (%s, %.1f MiB of weights)\n", o.model, s.hp->arch_name,
		       s.hp->weight_bytes / 1048576.0);
		if (o.warmup)
			printf("cold token   %.3f s  (the first token after loading, %.3f s from the "
			       "start; %ld warm-up token%s in all)\n",
			       cold_s, first_s, o.warmup, o.warmup == 1 ? "" : "s");
		else
			printf("cold token   not measured (--warmup 0: the runs below start cold)\n");
		printf("context      %u tokens, KV cache %s/%s %.1f MiB\n", eng_ctx_n_ctx(s.ctx),
		       eng_kv_type_name(s.type_k), eng_kv_type_name(s.type_v),
		       eng_ctx_kv_bytes(s.ctx) / 1048576.0);
		printf("prompt       %ld tokens  %.2f tok/s\n", o.n_prompt, pp_tps);
		printf("decode       %ld tokens  %.2f tok/s\n", o.n_predict, tg_tps);
		printf("peak RSS     %.1f MiB\n", rss / 1048576.0);
		if (eng_n_repackable(eng_model_gguf(s.model)))
			printf("hint         its Q4_0 matrices decode faster repacked, with the same "
			       "results: strata-repack %s OUT.gguf\n",
			       o.model);
		if (!h.measured)
			goto out;
		if (h.mem_rc)
			printf("memory read  n/a (%s)\n", h.mem_err);
		else
			printf("memory read  %.2f GB/s  (%u threads, fastest of %d reads of %.0f MiB)\n",
			       h.mem.gbps, h.threads, HW_MEM_PASSES, h.mem.bytes / 1048576.0);
		if (h.io_rc)
			printf("storage read n/a (%s)\n", h.io_err);
		else if (h.io.bytes > h.file_bytes)
			printf("storage read %.2f GB/s  (O_DIRECT, 1 MiB x %d in flight, %.0f MiB: "
			       "the %.1f MiB file read again and again)\n",
			       h.io.gbps, HW_IO_DEPTH, h.io.bytes / 1048576.0,
			       h.file_bytes / 1048576.0);
		else if (h.io.bytes == h.file_bytes)
			printf("storage read %.2f GB/s  (O_DIRECT, 1 MiB x %d in flight, the whole "
			       "%.0f MiB model file)\n",
			       h.io.gbps, HW_IO_DEPTH, h.io.bytes / 1048576.0);
		else
			printf("storage read %.2f GB/s  (O_DIRECT, 1 MiB x %d in flight, first %.0f MiB "
			       "of the model file)\n",
			       h.io.gbps, HW_IO_DEPTH, h.io.bytes / 1048576.0);
		if (mem_ok) {
			printf("decode bound %.2f tok/s  (memory read / %.1f MiB of weights per "
			       "token)\n",
			       bound, tok_bytes / 1048576.0);
			printf("fraction     %.3f of the decode bound\n", frac);
		}
		if (n_pairs)
			printf("paired       %.3f of the bound  (median of %ld tokens, each against "
			       "a memory read just before it: median %.2f GB/s)\n",
			       pair_frac, n_pairs, pair_gbps);
		if (io_ok)
			printf("stream bound %.2f tok/s  (storage read / weights per token: every "
			       "weight streamed)\n",
			       stream);
	}
	goto out;
fail:
	msg("bench: evaluation failed");
	rc = EXIT_BAD_INPUT;
out:
	if (trace)
		fclose(trace);
	free(ids);
	free(logits);
	session_close(&s);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{ "run", cmd_run },
		{ "eval", cmd_eval },
		{ "tokenize", cmd_tokenize },
		{ "bench", cmd_bench },
	};

	if (argc < 2)
		return usage("no command given");
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		fputs(usage_text, stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(argv[1], cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	char why[128];
	snprintf(why, sizeof(why), "unknown command '%.40s'", argv[1]);
	return usage(why);
}
