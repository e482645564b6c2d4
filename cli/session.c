/*
 * session.c - a loaded model and its context, as every sub-command opens
 * them: the weights mapped (plain mmap, or the pager's mapping with
 * --pager), the context sized to memory, and decode passes reported to the
 * pager.  Also the small helpers the sub-commands share (clocks, reading a
 * whole file, printing a token).
 *
 * The weights reach the engine as (base, size) of the whole file, from
 * session_open: nothing else in the engine knows where they came from.
 */
#include "cli.h"
#include "gguf.h"
#include "hwbench.h"
#include "template.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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

/*
 * Whether weights of w bytes fit in the memory this process may still use
 * (hwbench_mem_headroom), with some to spare: then they stay in memory once
 * read, and what is left after them is the context's.
 */
#define WEIGHTS_SPARE ((uint64_t)64 << 20)

static bool weights_fit(const struct hwbench_headroom *room, uint64_t w)
{
	return room->bytes > w + WEIGHTS_SPARE;
}

/*
 * A plain mapping of weights that fit is read from memory every token once
 * the first pass has faulted it in.  Ask the kernel to read the pages it
 * lacks as 2 MiB folios and map each one whole (MADV_HUGEPAGE): without the
 * advice a fault reads around itself in small folios, mapped 4 KiB at a
 * time, and decode reads the same bytes a few percent slower.  Pages the
 * page cache holds already keep their size.  Weights that do not fit stream
 * from the file, where every miss would read 4 MiB of which a sparse reader
 * (an expert's rows) wants less: they keep the read-around.  Advice only: a
 * kernel without transparent huge pages refuses it and nothing changes.
 * docs/design.md, "The plain mapping and huge pages", has the numbers.
 */
static void advise_huge_pages(const struct session *s, const struct hwbench_headroom *room)
{
	if (weights_fit(room, s->hp->weight_bytes))
		(void)madvise((void *)s->base, s->size, MADV_HUGEPAGE);
}

#define CTX_MIN 256 /* the smallest context sized to memory */

static int spec_decode(void *arg, const int32_t *ids, size_t n, float *logits, bool all)
{
	return session_decode(arg, ids, n, logits, all);
}

/*
 * Speculative decoding's drafters: the draft model (--draft-model), mapped
 * plainly -- it is small and read every token, so it stays in memory -- with
 * a context as long as the model's, and/or lookup.  The draft's tensors that
 * are the model's own (same name, type, shape and bytes: a draft made of the
 * model's head and first layers) are read from the model's mapping
 * (eng_model_share), one copy for both.  Through the pager only those outside
 * the layers: the daemon keeps unit 0 (head, norms) resident and reads the
 * embedding's rows on demand, while a layer may be streamed, and a draft
 * touching it every drafted token would read it from storage each time.
 * What the draft holds is what it computes with and does not share (its
 * embedding is read a row per token, so it is not counted), and its heap.
 * Returns 0 or an exit status after saying why.
 */
#define DRAFT_BATCH 32 /* drafts a pass can verify: as many as eng_ctx_truncate undoes */

static int open_spec(struct session *s, const struct opts *o)
{
	char err[256];
	int rc;

	if (o->draft_model) {
		/* The draft decodes a token at a time, and catches up a few
		 * at once: a batch of DRAFT_BATCH rows is enough, and its
		 * logits buffer is DRAFT_BATCH rows, not the model's batch
		 * (256 rows of a 128k-token vocabulary: 131 MiB declared) */
		struct eng_ctx_config dc = { .n_ctx = eng_ctx_n_ctx(s->ctx),
					     .n_threads = o->threads,
					     .n_batch = o->batch && o->batch < DRAFT_BATCH
								? (uint32_t)o->batch
								: DRAFT_BATCH };

		rc = eng_map_file(o->draft_model, &s->draft_base, &s->draft_size);
		if (rc) {
			s->draft_base = NULL;
			msg("%s: cannot map the draft model: %s", o->draft_model, strerror(-rc));
			return EXIT_BAD_INPUT;
		}
		uint64_t before = anon_rss_bytes(), after, shared;

		rc = eng_model_load(s->draft_base, s->draft_size, &s->draft, err, sizeof(err));
		after = anon_rss_bytes();
		if (rc || eng_ctx_create(s->draft, &dc, &s->draft_ctx, err, sizeof(err))) {
			msg("%s: %s", o->draft_model, err);
			return EXIT_BAD_INPUT;
		}
		rc = eng_model_share(s->draft, s->model, s->pc ? 0 : ENG_SHARE_LAYERS, &shared);
		if (rc < 0) {
			msg("%s: cannot share the model's weights: %s", o->draft_model,
			    strerror(-rc));
			return EXIT_BAD_INPUT;
		}
		s->draft_bytes = (after > before ? after - before : 0) +
				 eng_model_own_bytes(s->draft);
		if (rc)
			msg("draft: %d tensors (%.1f MiB) are the model's own, read from its "
			    "mapping; the draft holds %.1f MiB besides its context",
			    rc, MIB(shared), MIB(s->draft_bytes));
	}
	struct eng_spec_config sc = {
		.draft = s->draft_ctx,
		.lookup = o->lookup,
		.lookup_min = (uint32_t)o->lookup_min,
		.draft_max = (uint32_t)o->draft_max,
		.draft_min = (uint32_t)o->draft_min,
		.sampler = o->samp,
		.decode = spec_decode,
		.decode_arg = s,
	};
	if (eng_spec_create(s->ctx, &sc, &s->spec, err, sizeof(err))) {
		msg("%s: %s", o->draft_model ? o->draft_model : o->model, err);
		return EXIT_BAD_INPUT;
	}
	return 0;
}

/*
 * The context sized to memory (no -c): the largest that fits, from the
 * model's trained context down by halves, and at each size the best cache
 * type that fits (f16, then q8_0, then q4_0, for K and V alike; a type given
 * with -ctk/-ctv stays).  What it may take is the memory this process may
 * still use (plain: hwbench_mem_headroom's reading, the memory cgroup's room
 * or MemAvailable; NULL where it cannot be told, and then the default
 * context) less the model's weights, which want to stay in memory too;
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
static int size_context(struct session *s, const struct opts *o, struct eng_ctx_config *cc,
			const struct hwbench_headroom *plain)
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
		if (!plain)
			return 0; /* the default context */
		room = *plain;
		bool fit = weights_fit(&room, w);

		budget = fit ? room.bytes - w : room.bytes / 4;
		why = fit ? "the memory left after the weights"
			  : "a quarter of the memory left (the weights do not fit)";
	}
	/* --parallel: as many contexts, sharing the room */
	unsigned n_seq = o->n_parallel > 1 ? (unsigned)o->n_parallel : 1;

	budget /= n_seq;
	if (cc->n_ctx) {
		struct eng_ctx_size sz;

		if (eng_ctx_size(s->model, cc, &sz, err, sizeof(err))) {
			msg("%s: %s", o->model, err);
			return EXIT_BAD_INPUT;
		}
		sz.total_bytes *= n_seq;
		sz.kv_bytes *= n_seq;
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

/* The engine's routes of a mixture of experts, to the pager: it reads the
 * experts a layer lacks at once. */
static void route_to_pager(void *arg, uint32_t layer, const uint32_t *experts, uint32_t n)
{
	pager_client_route(arg, layer, experts, n);
}

/* And its guesses of the next layer's: the pager reads them ahead. */
static void hint_to_pager(void *arg, uint32_t layer, const uint32_t *experts, uint32_t n)
{
	pager_client_hint(arg, layer, experts, n);
}

int session_open(struct session *s, const struct opts *o, bool want_ctx)
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
	/* a plain mapping: the memory this process may still use, read once
	 * for the huge-page advice and the context's size */
	struct hwbench_headroom room, *plain = NULL;

	if (!s->pc && !hwbench_mem_headroom("", &room))
		plain = &room;
	if (plain)
		advise_huge_pages(s, plain);
	s->own_bytes = anon_rss_bytes();
	struct eng_ctx_config cc = { .n_ctx = o->ctx, .n_threads = o->threads, .n_batch = o->batch,
				     .type_k = o->type_k, .type_v = o->type_v };
	if ((rc = size_context(s, o, &cc, plain)))
		return rc;
	s->type_k = cc.type_k;
	s->type_v = cc.type_v;
	rc = eng_ctx_create(s->model, &cc, &s->ctx, err, sizeof(err));
	if (rc) {
		msg("%s: %s", o->model, err);
		return EXIT_BAD_INPUT;
	}
	if ((o->draft_model || o->lookup) && (rc = open_spec(s, o)))
		return rc;
	/* --parallel: the other sequences' contexts, alike */
	s->n_seqs = o->n_parallel > 1 ? (unsigned)o->n_parallel : 1;
	s->seqs = calloc(s->n_seqs, sizeof(*s->seqs));
	if (!s->seqs) {
		msg("out of memory");
		return EXIT_BAD_INPUT;
	}
	s->seqs[0] = s->ctx;
	cc.n_ctx = eng_ctx_n_ctx(s->ctx);
	for (unsigned i = 1; i < s->n_seqs; i++)
		if (eng_ctx_create(s->model, &cc, &s->seqs[i], err, sizeof(err))) {
			msg("%s: sequence %u: %s", o->model, i, err);
			return EXIT_BAD_INPUT;
		}
	/* what the draft model holds and its context are this engine's memory too */
	if (s->pc && pager_client_declare(s->pc,
					  s->own_bytes + s->n_seqs * eng_ctx_bytes(s->ctx) +
						  s->draft_bytes +
						  (s->draft_ctx ? eng_ctx_bytes(s->draft_ctx) : 0),
					  s->n_seqs * eng_ctx_kv_bytes(s->ctx))) {
		msg("%s: cannot talk to the pager", o->model);
		return EXIT_BAD_INPUT;
	}
	/* a mixture of experts tells the pager its routes, and, if the pager
	 * reads ahead on them (stratad --lookahead), its guesses
	 * of the next layer's: a guess costs a router's bytes a layer */
	for (unsigned i = 0; s->pc && i < s->n_seqs; i++) {
		eng_ctx_set_route_hook(s->seqs[i], route_to_pager, s->pc);
		if (pager_client_wants_hints(s->pc))
			eng_ctx_set_lookahead_hook(s->seqs[i], hint_to_pager, s->pc);
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
	struct pager_pass_report r = {
		.tokens = s->pass_tokens,
		.wall_ns = (uint64_t)(s->pass_s * 1e9),
		.outside_ns = s->pass_outside_ns,
		.layer_ns = s->pass_layer_ns,
		.n_layers = L,
		.passes = s->pass_all,
		.produced = s->pass_produced,
	};

	pager_client_report(s->pc, &r);
	s->pass_open = false;
	s->pass_all = 0;
	s->pass_produced = 0;
	s->pass_tokens = 0;
	s->pass_s = 0;
	s->pass_outside_ns = 0;
	if (L)
		memset(s->pass_layer_ns, 0, L * sizeof(*s->pass_layer_ns));
}

void session_close(struct session *s)
{
	if (s->pc && s->pass_open) /* a run shorter than a report's 0.1 s too */
		session_report(s);
	free(s->pass_layer_ns);
	eng_spec_destroy(s->spec);
	eng_ctx_destroy(s->draft_ctx);
	eng_model_destroy(s->draft);
	if (s->draft_base)
		eng_unmap_file(s->draft_base, s->draft_size);
	for (unsigned i = 1; s->seqs && i < s->n_seqs; i++)
		eng_ctx_destroy(s->seqs[i]);
	free(s->seqs);
	eng_ctx_destroy(s->ctx);
	eng_model_destroy(s->model);
	if (s->pc)
		pager_client_close(s->pc);
	else
		eng_unmap_file(s->base, s->size);
}

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wall-clock time, to line a trace up with other programs' logs. */
double unix_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * eng_decode, timing one-token passes for the pager: their wall time (waits
 * on faults included) goes to the daemon about ten times a second, and its
 * speed predictor learns the engine's compute time from it.  Passes over
 * several positions (prompts, speculation) are not timed, but a report goes
 * out after them too, with what session_produced counted.
 */
int session_decode(struct session *s, const int32_t *ids, size_t n, float *logits, bool all)
{
	double t0 = s->pc ? now_s() : 0;
	int rc = eng_decode(s->ctx, ids, n, logits, all);

	if (rc || !s->pc)
		return rc;
	double t1 = now_s();

	if (!s->pass_open) {
		s->pass_open = true;
		s->pass_since = t0;
	}
	if (n == 1) {
		const uint64_t *layer = eng_ctx_layer_ns(s->ctx);
		uint32_t L = s->pass_layer_ns ? s->hp->n_layer : 0;

		s->pass_tokens++;
		s->pass_s += t1 - t0;
		for (uint32_t l = 0; l < L; l++)
			s->pass_layer_ns[l] += layer[l];
		s->pass_outside_ns += eng_ctx_outside_ns(s->ctx);
	}
	if (t1 - s->pass_since >= 0.1)
		session_report(s);
	return 0;
}

int session_decode_multi(struct session *s, struct eng_ctx *const *ctxs, const int32_t *ids,
			 const bool *want, size_t n, float *logits, uint32_t produced)
{
	double t0 = s->pc ? now_s() : 0;
	int rc = eng_decode_multi(ctxs, ids, want, n, logits);

	if (rc || !s->pc)
		return rc;
	double t1 = now_s();

	if (!s->pass_open) {
		s->pass_open = true;
		s->pass_since = t0;
	}
	s->pass_all++;
	s->pass_produced += produced;
	if (t1 - s->pass_since >= 0.1)
		session_report(s);
	return 0;
}

int session_template(const struct session *s, const struct opts *o, int *kind)
{
	struct gguf_str src;
	enum tmpl_kind k;

	if (o->chat_template) {
		if (tmpl_parse(o->chat_template, &k)) {
			msg("unknown chat template '%s' (%s)", o->chat_template, tmpl_names());
			return EXIT_USAGE;
		}
	} else if (gguf_get_str(eng_model_gguf(s->model), "tokenizer.chat_template", &src)) {
		msg("%s has no chat template: using chatml (--chat-template NAME to choose)",
		    o->model);
		k = TMPL_CHATML;
	} else {
		char *text = strndup(src.ptr, src.len);

		if (!text || tmpl_detect(text, &k)) {
			msg("%s: its chat template is none strata knows: using chatml "
			    "(--chat-template NAME to choose: %s)",
			    o->model, tmpl_names());
			k = TMPL_CHATML;
		}
		free(text);
	}
	*kind = (int)k;
	return 0;
}

void session_produced(struct session *s, uint32_t passes, uint32_t tokens)
{
	s->pass_all += passes;
	s->pass_produced += tokens;
}

char *spec_summary(const struct session *s, char *buf, size_t len)
{
	const struct eng_spec_stats *st = eng_spec_stats(s->spec);

	snprintf(buf, len,
		 "%" PRIu64 " passes, %" PRIu64 " drafted, %" PRIu64
		 " accepted (%.0f%%; %.2f per token), %.2f tokens per pass",
		 st->passes, st->drafted, st->accepted,
		 st->drafted ? 100.0 * st->accepted / st->drafted : 0.0,
		 st->accepted ? (double)st->accepted / (double)(st->accepted + st->rejected) : 0.0,
		 st->passes ? (double)st->tokens / (double)st->passes : 0.0);
	return buf;
}

/* One pass: plain (session_decode, then the sampler), or speculative. */
int session_step(struct session *s, struct eng_sampler *sm, int32_t last, float *logits,
		 int32_t *out, uint32_t *n_out)
{
	int rc;

	if (s->spec) {
		rc = eng_spec_step(s->spec, sm, last, out, n_out);
	} else {
		rc = session_decode(s, &last, 1, logits, false);
		out[0] = rc ? 0 : eng_sample(sm, logits);
		*n_out = 1;
	}
	if (!rc)
		session_produced(s, 1, *n_out);
	return rc;
}

uint64_t peak_rss_bytes(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_maxrss * 1024;
}

/*
 * How many bytes of the weights' mapping the process reaches through 2 MiB
 * page-table entries (hwbench_pmd_mapped_bytes): the plain mapping's large
 * folios, or a pager memfd's huge pages.  Decode from memory reads faster
 * through them (advise_huge_pages: a few percent on a Zen 5 guest, up to a
 * third on a Zen 4 one), so a benchmark says how much it had.  Walks the
 * page tables: not for a timed interval.  0 where /proc cannot tell.
 */
uint64_t session_huge_mapped_bytes(const struct session *s)
{
	return hwbench_pmd_mapped_bytes(s->base, s->size);
}

/* Read all of a stream into a NUL-terminated buffer. */
char *read_all(FILE *f, size_t *len)
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

void print_piece(const struct eng_tokenizer *tok, int32_t id)
{
	char buf[256];
	int n = eng_token_to_piece(tok, id, buf, sizeof(buf));

	if (n > 0)
		fwrite(buf, 1, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf), stdout);
}
