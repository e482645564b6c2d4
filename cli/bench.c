/*
 * bench.c - `strata bench`: prompt and decode speed, and what bounds them on
 * this machine (memory and storage read bandwidth, measured with hwbench.h
 * after the engine has run, so neither the timings nor the peak RSS it
 * reports include the measurement).
 */
#include "cli.h"
#include "hwbench.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
/* what the repacked matrices' speed-up must be for the hint to name it: its
 * measurement moves by a percent or two between runs */
#define REPACK_PAYS 1.03

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

/*
 * The token decoded after `logits`: the greedy one, or with --random-tokens
 * the next of a fixed pseudo-random sequence (*rng, xorshift64), as
 * llama-bench feeds its decode.  A dense model reads the same weights for
 * any token; a mixture of experts reads the experts its routers pick for
 * it, and a random model's greedy text soon repeats itself, so its experts
 * would be the same few again and again.
 */
static int32_t next_token(const struct opts *o, const float *logits, uint32_t n_vocab,
			  uint64_t *rng)
{
	if (!o->random_tokens)
		return eng_argmax(logits, n_vocab);
	*rng ^= *rng << 13;
	*rng ^= *rng >> 7;
	*rng ^= *rng << 17;
	return (int32_t)(*rng % n_vocab);
}

/*
 * The paired fraction: n more tokens decoded (next_token), each right after one pass
 * over the memory buffer, and the median over tokens of (weight bytes per
 * token / that token's time) / (the pass's bandwidth).  The machine is
 * shared: a neighbour's load comes and goes within a run, and the fastest
 * of measure_hw's passes is the machine at its quietest, while the decode
 * line is the average over whatever came.  A token against the bandwidth
 * read just before it compares the two under the same load.  *gbps gets the
 * median pass.  The buffer is `bytes`, measure_hw's size as far as it still
 * fits.  0, -errno from the memory buffer, or 1 when decoding failed.
 */
static int bench_pairs(struct session *s, const struct opts *o, int32_t next, long n,
		       unsigned threads, uint64_t bytes, uint64_t tok_bytes, uint64_t *rng,
		       double *frac, double *gbps)
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
		next = next_token(o, logits, s->hp->n_vocab, rng);
	}
	if (rc == 0) {
		*frac = hwbench_median(ratio, (size_t)n);
		*gbps = hwbench_median(bw, (size_t)n);
	}
	hwbench_mem_close(m);
	free(ratio);
	free(bw);
	free(logits);
	return rc;
}

/*
 * What one pass of the model over n positions costs (--pass-sizes): the
 * price of verifying n - 1 drafts.  Each size is timed PASS_REPS times at
 * the current position, every row's logits computed as a verification
 * needs, and undone after (eng_ctx_truncate); the median counts.
 */
#define PASS_SIZES_MAX 32
#define PASS_REPS 3

struct pass_cost {
	uint32_t n;
	double s;
};

/* "1,2,4,8" into sizes; returns how many, or -1 after saying why. */
static int parse_sizes(const char *list, uint32_t undo_max, uint32_t *sizes)
{
	int n = 0;
	const char *p = list;

	while (*p) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p || v < 1 || v > (long)undo_max || n == PASS_SIZES_MAX ||
		    (*end != ',' && *end)) {
			msg("bench: --pass-sizes: '%s' is not a list of up to %d sizes of 1 to %u", list,
			    PASS_SIZES_MAX, undo_max);
			return -1;
		}
		sizes[n++] = (uint32_t)v;
		p = *end ? end + 1 : end;
	}
	return n;
}

static int bench_passes(struct session *s, const uint32_t *sizes, int n_sizes,
			struct pass_cost *out)
{
	uint32_t V = s->hp->n_vocab, most = 0;

	for (int i = 0; i < n_sizes; i++)
		most = sizes[i] > most ? sizes[i] : most;
	float *rows = malloc((size_t)most * V * sizeof(float));
	int32_t *ids = malloc(most * sizeof(int32_t));

	if (!rows || !ids) {
		free(rows);
		free(ids);
		return -ENOMEM;
	}
	for (uint32_t j = 0; j < most; j++)
		ids[j] = (int32_t)((j + 7) * 2654435761u % V);
	for (int i = 0; i < n_sizes; i++) {
		double t[PASS_REPS];
		uint32_t at = eng_ctx_n_past(s->ctx);

		for (int r = 0; r < PASS_REPS; r++) {
			double t0 = now_s();

			eng_ctx_checkpoint(s->ctx);
			if (session_decode(s, ids, sizes[i], rows, true) ||
			    eng_ctx_truncate(s->ctx, at)) {
				free(rows);
				free(ids);
				return -EIO;
			}
			t[r] = now_s() - t0;
		}
		out[i] = (struct pass_cost){ sizes[i], hwbench_median(t, PASS_REPS) };
	}
	free(rows);
	free(ids);
	return 0;
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

int cmd_bench(int argc, char **argv)
{
	struct opts o;
	struct session s;
	struct hw h = { 0 };
	int32_t *ids = NULL;
	float *logits = NULL;
	double t0, t1, t2, pp_tps = 0, tg_tps = 0;
	uint64_t rss, huge, tok_bytes;
	bool mem_ok, io_ok;
	double bound = 0, stream = 0, frac = 0, pair_frac = 0, pair_gbps = 0;
	double repack_gain = 0;
	int repack_rc = -ENOENT;
	long n_pairs = 0;
	double t_start = now_s(), cold_s = 0, first_s = 0;
	FILE *trace = NULL;
	uint32_t sizes[PASS_SIZES_MAX];
	struct pass_cost passes[PASS_SIZES_MAX];
	int n_sizes = 0;
	struct eng_sampler *greedy = NULL;
	struct eng_sampler_config gcfg = { .temp = 0 };
	long produced = 0;
	int rc = parse_opts(argc, argv, "bench", &o);

	if (rc)
		return rc;
	o.samp.temp = 0; /* bench decodes greedily; a draft model drafts alike */
	if (!o.seen_p)
		o.n_prompt = 64;
	if (!o.seen_n)
		o.n_predict = 32;
	if (o.random_tokens && (o.draft_model || o.lookup)) {
		msg("bench: --random-tokens leaves nothing for speculation to guess: not with "
		    "--draft-model or --lookup");
		return EXIT_USAGE;
	}
	rc = session_open(&s, &o, true);
	if (rc)
		return rc;
	if (o.pass_sizes &&
	    (n_sizes = parse_sizes(o.pass_sizes, eng_ctx_undo_max(s.ctx), sizes)) < 0) {
		rc = EXIT_USAGE;
		goto out;
	}
	if (eng_sampler_create(&gcfg, s.hp->n_vocab, &greedy)) {
		msg("out of memory");
		rc = EXIT_BAD_INPUT;
		goto out;
	}
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
	if (s.spec)
		eng_spec_reset(s.spec);
	else
		eng_ctx_reset(s.ctx);
	t0 = now_s();
	if (o.n_prompt && (s.spec ? eng_spec_feed(s.spec, ids, (size_t)o.n_prompt, logits)
				  : session_decode(&s, ids, (size_t)o.n_prompt, logits, false)))
		goto fail;
	t1 = now_s();
	/* n_predict tokens (with speculation, a pass's worth more at most):
	 * a trace line per pass, when it ended (unix time) and how long it
	 * took */
	uint64_t rng = 0x9e3779b97f4a7c15u; /* the same tokens every run */
	int32_t next = o.n_prompt ? next_token(&o, logits, s.hp->n_vocab, &rng) : 0;
	while (produced < o.n_predict) {
		double ts = now_s();

		int32_t out_ids[32];
		uint32_t n_out;

		if (session_step(&s, greedy, next, logits, out_ids, &n_out))
			goto fail;
		produced += n_out;
		next = o.random_tokens ? next_token(&o, logits, s.hp->n_vocab, &rng)
				       : out_ids[n_out - 1];
		if (trace)
			fprintf(trace, "%.6f %.6f\n", unix_s(), now_s() - ts);
	}
	t2 = now_s();
	if (o.n_prompt)
		pp_tps = o.n_prompt / (t1 - t0);
	if (o.n_predict)
		tg_tps = produced / (t2 - t1);
	if (n_sizes) {
		uint32_t room = eng_ctx_n_ctx(s.ctx) - eng_ctx_n_past(s.ctx);

		for (int i = 0; i < n_sizes; i++)
			if (sizes[i] > room) {
				msg("bench: a pass of %u positions does not fit the %u left in the "
				    "context (use -c)",
				    sizes[i], room);
				rc = EXIT_BAD_INPUT;
				goto out;
			}
		if (bench_passes(&s, sizes, n_sizes, passes))
			goto fail;
	}
	/* Before the memory measurement allocates its buffer. */
	rss = peak_rss_bytes();
	huge = session_huge_mapped_bytes(&s);
	/* Whether strata-repack would pay here: a hardware measurement, and a
	 * copy of some of the weights, so not with --no-hw nor under a pager's
	 * budget */
	if (!o.no_hw && !s.pc && eng_n_repackable(eng_model_gguf(s.model)))
		repack_rc = eng_ctx_repack_gain(s.ctx, &repack_gain);
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
		int prc = bytes ? bench_pairs(&s, &o, next, n_pairs, h.threads, bytes, tok_bytes,
					      &rng, &pair_frac, &pair_gbps)
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
		       o.n_prompt, produced, o.threads, pp_tps, tg_tps, rss, s.hp->weight_bytes,
		       tok_bytes);
		printf(", \"huge_mapped_bytes\": %" PRIu64, huge);
		printf(", \"warmup\": %ld, \"decode_tokens\": \"%s\"", o.warmup,
		       o.random_tokens ? "random" : "greedy");
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
		       ", \"mem_read_huge_bytes\": %" PRIu64 ", \"mem_read_error\": ",
		       h.threads, h.mem.bytes, h.mem.huge_bytes);
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
		if (s.spec) {
			const struct eng_spec_stats *st = eng_spec_stats(s.spec);

			printf(", \"spec_passes\": %" PRIu64 ", \"spec_drafted\": %" PRIu64
			       ", \"spec_accepted\": %" PRIu64 ", \"spec_rejected\": %" PRIu64
			       ", \"spec_tokens\": %" PRIu64,
			       st->passes, st->drafted, st->accepted, st->rejected, st->tokens);
		}
		if (n_sizes) {
			printf(", \"passes\": [");
			for (int i = 0; i < n_sizes; i++)
				printf("%s{\"positions\": %u, \"seconds\": %.6f}", i ? ", " : "",
				       passes[i].n, passes[i].s);
			printf("]");
		}
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
		printf("decode       %ld tokens  %.2f tok/s%s\n", produced, tg_tps,
		       o.random_tokens ? "  (random tokens)" : "");
		if (s.spec) {
			char line[200];

			printf("speculation  %s\n", spec_summary(&s, line, sizeof(line)));
		}
		for (int i = 0; i < n_sizes; i++)
			printf("pass         %2u positions  %.4f s  (%.2fx the %u-position pass)\n",
			       passes[i].n, passes[i].s, passes[i].s / passes[0].s, passes[0].n);
		printf("peak RSS     %.1f MiB\n", rss / 1048576.0);
		printf("huge-mapped  %.1f MiB of the weights' mapping in 2 MiB pages\n",
		       huge / 1048576.0);
		if (repack_rc == 0 && repack_gain >= REPACK_PAYS)
			printf("hint         its Q4_0 matrices read %.2fx as fast repacked (%s kernels), "
			       "with the same results: strata-repack %s OUT.gguf\n",
			       repack_gain, eng_isa_name(), o.model);
		else if (repack_rc == 0)
			printf("repack       would not pay here: its Q4_0 matrices read %.2fx as fast "
			       "repacked (%s kernels)\n",
			       repack_gain, eng_isa_name());
		if (!h.measured)
			goto out;
		if (h.mem_rc)
			printf("memory read  n/a (%s)\n", h.mem_err);
		else
			printf("memory read  %.2f GB/s  (%u threads, fastest of %d reads of %.0f MiB, "
			       "%.0f%% on 2 MiB pages)\n",
			       h.mem.gbps, h.threads, HW_MEM_PASSES, h.mem.bytes / 1048576.0,
			       h.mem.bytes ? 100.0 * h.mem.huge_bytes / h.mem.bytes : 0.0);
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
	eng_sampler_destroy(greedy);
	free(ids);
	free(logits);
	session_close(&s);
	return rc;
}
