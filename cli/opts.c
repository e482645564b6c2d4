/*
 * opts.c - the command line every sub-command shares: the usage text, the
 * options (struct opts, cli.h) and their parsing, and msg(), the one-line
 * message format.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void msg(const char *fmt, ...)
{
	va_list ap;

	fputs("strata: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

const char usage_text[] =
	"usage: strata COMMAND [options]\n"
	"\n"
	"  run      -m MODEL [-p PROMPT | -f FILE] [-n N] [-t THREADS] [-c CTX] [-b BATCH]\n"
	"           [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
	"           [--context-shift [--keep N]] [SPECULATION]\n"
	"  eval     -m MODEL --tokens ID,ID,... --logits-out FILE [-t THREADS] [-c CTX]\n"
	"           [-b BATCH]\n"
	"  tokenize -m MODEL [--no-bos] [--text STRING]   (stdin without --text)\n"
	"  bench    -m MODEL [-p N] [-n N] [-t THREADS] [-c CTX] [-b BATCH] [--json]\n"
	"           [--warmup N] [--no-hw] [--trace FILE] [SPECULATION]\n"
	"           [--pass-sizes N,N,...] [--random-tokens]\n"
	"  serve    -m MODEL [--host ADDR] [--port N] [-np N] [--queue N] [--api-key KEY]\n"
	"           [--alias NAME] [--chat-template NAME] [-c CTX] [-t THREADS] [-b BATCH]\n"
	"           (an OpenAI-compatible HTTP server: /v1/chat/completions, ...)\n"
	"  chat     -m MODEL [--chat-template NAME] [-n N] [-c CTX] [sampling options]\n"
	"           (a chat prompt: /reset, /exit; Ctrl-C stops an answer)\n"
	"\n"
	"SPECULATION (several tokens per pass of the model): --draft-model FILE (-md),\n"
	"a small model with the same vocabulary, and/or --lookup (draft what followed\n"
	"the text's last n-gram before, --lookup-min N); --draft-max N (16),\n"
	"--draft-min N (0: as many as pay, measured as it runs).\n"
	"\n"
	"Every command also takes --pager SOCKET (default $STRATA_PAGER): map the\n"
	"model through a running stratad instead of mmap.  run, eval and bench take\n"
	"-ctk/--cache-type-k and -ctv/--cache-type-v TYPE (f16, q8_0, q4_0): the KV\n"
	"cache's element types.  --chat-template NAME (chatml, llama3, llama2, mistral,\n"
	"gemma, phi3) overrides the template the model's file names.\n"
	"Exit status: 0 ok, 1 usage error, 2 bad model or input.\n";

int usage(const char *why)
{
	if (why)
		msg("%s", why);
	fputs(usage_text, stderr);
	return EXIT_USAGE;
}



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
int parse_opts(int argc, char **argv, const char *cmd, struct opts *o)
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
		{ "random-tokens", no_argument, NULL, OPT_RANDOM_TOKENS },
		{ "cache-type-k", required_argument, NULL, OPT_CACHE_K },
		{ "cache-type-v", required_argument, NULL, OPT_CACHE_V },
		{ "context-shift", no_argument, NULL, OPT_CONTEXT_SHIFT },
		{ "keep", required_argument, NULL, OPT_KEEP },
		{ "draft-model", required_argument, NULL, OPT_DRAFT_MODEL },
		{ "model-draft", required_argument, NULL, OPT_DRAFT_MODEL },
		{ "draft-max", required_argument, NULL, OPT_DRAFT_MAX },
		{ "draft-min", required_argument, NULL, OPT_DRAFT_MIN },
		{ "lookup", no_argument, NULL, OPT_LOOKUP },
		{ "lookup-min", required_argument, NULL, OPT_LOOKUP_MIN },
		{ "pass-sizes", required_argument, NULL, OPT_PASS_SIZES },
		{ "chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE },
		{ "host", required_argument, NULL, OPT_HOST },
		{ "port", required_argument, NULL, OPT_PORT },
		{ "parallel", required_argument, NULL, OPT_PARALLEL },
		{ "queue", required_argument, NULL, OPT_QUEUE },
		{ "api-key", required_argument, NULL, OPT_API_KEY },
		{ "alias", required_argument, NULL, OPT_ALIAS },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool is_bench = strcmp(cmd, "bench") == 0;
	char why[256], name[64];
	long v;
	int c, li;

	memset(o, 0, sizeof(*o));
	o->n_predict = 128;
	o->host = "127.0.0.1";
	o->port = 8080;
	o->n_parallel = 1;
	o->queue_max = 16;
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
		else if (!strcmp(argv[i], "-md"))
			argv[i] = (char *)"--draft-model";
		else if (!strcmp(argv[i], "-np"))
			argv[i] = (char *)"--parallel";
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
			o->seen_temp = true;
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
		case OPT_RANDOM_TOKENS:
			o->random_tokens = true;
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
		case OPT_DRAFT_MODEL:
			o->draft_model = optarg;
			break;
		case OPT_DRAFT_MAX:
			if (!parse_long(optarg, 1, 31, &o->draft_max))
				goto bad;
			break;
		case OPT_DRAFT_MIN:
			if (!parse_long(optarg, 0, 31, &o->draft_min))
				goto bad;
			break;
		case OPT_LOOKUP:
			o->lookup = true;
			break;
		case OPT_LOOKUP_MIN:
			if (!parse_long(optarg, 1, 8, &o->lookup_min))
				goto bad;
			break;
		case OPT_PASS_SIZES:
			o->pass_sizes = optarg;
			break;
		case OPT_KEEP:
			if (!parse_long(optarg, -1, 1 << 20, &o->keep))
				goto bad;
			break;
		case OPT_CHAT_TEMPLATE:
			o->chat_template = optarg;
			break;
		case OPT_HOST:
			o->host = optarg;
			break;
		case OPT_PORT:
			if (!parse_long(optarg, 0, 65535, &o->port))
				goto bad;
			break;
		case OPT_PARALLEL:
			if (!parse_long(optarg, 1, 64, &o->n_parallel))
				goto bad;
			break;
		case OPT_QUEUE:
			if (!parse_long(optarg, 0, 4096, &o->queue_max))
				goto bad;
			break;
		case OPT_API_KEY:
			o->api_key = optarg;
			break;
		case OPT_ALIAS:
			o->alias = optarg;
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
