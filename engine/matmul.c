/*
 * matmul.c - weight matrix times a batch of activations, on the context's
 * thread pool.
 *
 * The activations are converted once per call into the weight type's
 * vec_dot_type (quant.h), packed if the kernel set wants, and the weight rows
 * are shared out in chunks; each row goes through the kernel set's vec_dotn
 * (a chunk at a time), vec_dot16, vec_dot8 or vec_dot, which give
 * bit-identical results, so how rows are
 * grouped never changes a logit.  A pass can also run many weights over
 * their own rows of one input (matmul_parts: a mixture's experts, each over
 * its tokens), so a layer's experts cost one wake-up of the pool, not one
 * each.  Nothing is allocated here: the converted activations live in the
 * context (qact).
 */
#include "model_i.h"

#include <assert.h>
#include <stdatomic.h>

#define MATMUL_TILE 16 /* weight rows kept hot in cache across a batch: one vec_dot16 */

/*
 * Up to three matmuls sharing one input: out_j[b][r] = W_j[r] . in[b].  The
 * rows are cut into chunks (eng_chunk_rows, quant.h: about 1024 token-rows,
 * down to 64 rows for a prompt, at most about 2 MiB of weights), numbered in
 * order over the n weights, and each thread owns a run of them, front to
 * back: its first chunk starts cold, the rest follow on from the row
 * prefetch of the one before (k_prefetch_rows, quant_x86_i.h).  Threads
 * that took chunks in turn from one counter started every chunk cold:
 * gemma3-4b decode 1.047x faster with runs (docs/benchmarks.md, issue 16,
 * session 44).  A thread done with its own run takes chunks from the back
 * of another's, so one slowed for a moment (the machine is shared, the
 * memory bandwidth too) does not leave the others waiting; hence chunks,
 * not fixed shares, and at most 2 MiB: an 8B-shaped ffn_down (14336
 * columns, 8-12 KB a row) was otherwise four chunks for two threads.  The
 * runs live in the job, on the caller's stack: nothing is allocated per
 * matmul.
 */
_Static_assert(MATMUL_TILE == 16, "eng_chunk_rows makes chunks of whole 16-row tiles");

#define MM_RUNS 16 /* runs of chunks at most: more threads share them */

struct mm_job {
	unsigned n;
	struct mm_part *parts; /* each: a weight, its output, its rows of the input */
	uint64_t chunk;     /* rows per chunk */
	unsigned n_runs;
	/* run r's chunks left, [lo, hi) as lo | hi << 32, over all n weights:
	 * threads r, r + n_runs, ... take from the front, others from the back */
	_Atomic uint64_t run[MM_RUNS];
	const uint8_t *act;  /* the input's rows of act_stride bytes, in vec_dot_type */
	const uint8_t *act8; /* the same for vec_dot8/16: pack8'ed if the set packs */
	size_t act_stride;
	const struct eng_kernels *k;
};

/* The 8 or 16 rows of part p's weight at r (fn is vec_dot8 or vec_dot16) by
 * all its tokens, up to max_nt (ENG_DOT8_NT or ENG_DOT16_NT) at a time. */
static void mm_group(const struct mm_job *j, const struct mm_part *p, eng_vec_dot8_fn fn,
		     unsigned max_nt, uint64_t r)
{
	const struct wt *w = p->w;
	const uint8_t *act8 = j->act8 + (size_t)p->row0 * j->act_stride;

	for (uint32_t b = 0; b < p->nb; b += max_nt) {
		unsigned nt = p->nb - b < max_nt ? p->nb - b : max_nt;

		fn(w->ne0, nt, &p->out[b * w->ne1 + r], w->ne1, w->data + r * w->row_bytes,
		   w->row_bytes, act8 + b * j->act_stride, j->act_stride);
	}
}

/* Rows [r0, r1) of part p's weight: all at once through vec_dotn where the
 * set has one, else in tiles of MATMUL_TILE rows. */
static void mm_rows(const struct mm_job *j, const struct mm_part *p, uint64_t r0, uint64_t r1)
{
	const struct wt *w = p->w;
	float *out = p->out;
	const uint8_t *act = j->act + (size_t)p->row0 * j->act_stride;

	eng_vec_dot_fn dot = j->k->vec_dot[w->type];
	eng_vec_dot8_fn dot8 = j->k->vec_dot8[w->type];
	eng_vec_dot8_fn dot16 = j->k->vec_dot16[w->type];
	eng_vec_dotn_fn dotn = j->k->vec_dotn[w->type];

	if (dotn) {
		const uint8_t *act8 = j->act8 + (size_t)p->row0 * j->act_stride;

		for (uint32_t b = 0; b < p->nb; b += ENG_DOT16_NT)
			dotn(w->ne0, (unsigned)(r1 - r0),
			     p->nb - b < ENG_DOT16_NT ? p->nb - b : ENG_DOT16_NT,
			     &out[b * w->ne1 + r0], w->ne1, w->data + r0 * w->row_bytes,
			     w->row_bytes, act8 + b * j->act_stride, j->act_stride);
		return;
	}
	for (uint64_t t0 = r0; t0 < r1; t0 += MATMUL_TILE) {
		uint64_t t1 = t0 + MATMUL_TILE < r1 ? t0 + MATMUL_TILE : r1;
		uint64_t r = t0;

		/* sixteen or eight rows at a time (a Q4_0_R16 weight has
		 * vec_dot16 only: its row count is a multiple of 16, checked by
		 * gguf.c, and chunks are multiples of 16, so every tile is
		 * whole), */
		if (dot16 && t1 - t0 == 16) {
			mm_group(j, p, dot16, ENG_DOT16_NT, r);
			r = t1;
		}
		for (; dot8 && r + 8 <= t1; r += 8)
			mm_group(j, p, dot8, ENG_DOT8_NT, r);
		/* then the rows left one by one */
		for (uint32_t b = 0; b < p->nb; b++)
			for (uint64_t i = r; i < t1; i++)
				dot(w->ne0, &out[b * w->ne1 + i], w->data + i * w->row_bytes,
				    act + b * j->act_stride);
	}
}

/* A chunk from the front or the back of a run into *c; false if it is empty. */
static bool mm_take(_Atomic uint64_t *run, bool front, uint64_t *c)
{
	uint64_t v = atomic_load_explicit(run, memory_order_relaxed);

	for (;;) {
		const uint64_t lo = v & 0xffffffffu, hi = v >> 32;

		if (lo >= hi)
			return false;
		if (atomic_compare_exchange_weak_explicit(
			    run, &v, front ? (lo + 1) | hi << 32 : lo | (hi - 1) << 32,
			    memory_order_relaxed, memory_order_relaxed)) {
			*c = front ? lo : hi - 1;
			return true;
		}
	}
}

/* The part chunk c (over all parts) belongs to: the first whose chunks end
 * after it. */
static unsigned mm_part_of(const struct mm_job *j, uint64_t c)
{
	unsigned lo = 0, hi = j->n - 1;

	while (lo < hi) {
		const unsigned mid = (lo + hi) / 2;

		if (c < j->parts[mid].chunks_end)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

static void mm_worker(void *arg, unsigned ith, unsigned nth)
{
	struct mm_job *j = arg;
	const unsigned own = ith % j->n_runs;
	uint64_t c;

	(void)nth;
	for (;;) {
		bool got = mm_take(&j->run[own], true, &c);

		for (unsigned k = 1; !got && k < j->n_runs; k++)
			got = mm_take(&j->run[(own + k) % j->n_runs], false, &c);
		if (!got)
			return;

		const unsigned m = mm_part_of(j, c);
		const struct mm_part *p = &j->parts[m];
		uint64_t r0 = (c - (m ? j->parts[m - 1].chunks_end : 0)) * j->chunk;
		uint64_t r1 = r0 + j->chunk < p->w->ne1 ? r0 + j->chunk : p->w->ne1;

		mm_rows(j, p, r0, r1);
	}
}

/* The input's rows converted to vec_dot_type (and packed after each row, at
 * off, if the set packs): a share of the rows on each thread when there are
 * several (a prompt's 64 rows of 14336 were 0.65% of its samples on the
 * caller alone, the other thread waiting), on the caller for one. */
struct qa_job {
	eng_from_float_fn q;
	eng_pack8_fn pack;
	const float *in;
	uint64_t ne0;
	uint8_t *qact;
	size_t stride, off;
	uint32_t n_rows;
};

static void qa_worker(void *arg, unsigned ith, unsigned nth)
{
	const struct qa_job *j = arg;

	for (uint32_t b = j->n_rows * ith / nth; b < j->n_rows * (ith + 1) / nth; b++) {
		uint8_t *row = j->qact + b * j->stride;

		j->q(j->in + b * j->ne0, row, j->ne0);
		if (j->pack)
			j->pack(row, row + j->off, j->ne0);
	}
}

void matmul_parts(struct eng_ctx *c, unsigned n, struct mm_part *parts, const float *in,
		  uint32_t n_rows)
{
	struct mm_job j = { .n = n, .parts = parts, .k = c->k };
	const struct wt *w0 = parts[0].w;
	uint64_t ne0 = w0->ne0;
	uint32_t vt = eng_type_info(w0->type)->vec_dot_type;
	size_t row_bytes = 0;
	uint32_t nb = 0;

	assert(n_rows <= c->qact_rows);
	for (unsigned i = 0; i < n; i++) {
		const struct wt *w = parts[i].w;

		assert(w->ne0 == ne0 && eng_type_info(w->type)->vec_dot_type == vt &&
		       c->k->pack8[w->type] == c->k->pack8[w0->type] &&
		       parts[i].row0 + parts[i].nb <= n_rows);
		row_bytes = w->row_bytes > row_bytes ? w->row_bytes : row_bytes;
		nb = parts[i].nb > nb ? parts[i].nb : nb;
	}
	/* sized for the part of the most tokens: the others' chunks are
	 * lighter, which only makes them finer */
	j.chunk = eng_chunk_rows(row_bytes, nb);
	for (unsigned i = 0; i < n; i++)
		parts[i].chunks_end = (i ? parts[i - 1].chunks_end : 0) +
				      (parts[i].w->ne1 + j.chunk - 1) / j.chunk;
	const uint64_t chunks = parts[n - 1].chunks_end;
	const unsigned nth = eng_pool_size(c->pool);

	assert(chunks < 1ull << 32);
	j.n_runs = nth < MM_RUNS ? nth : MM_RUNS;
	for (unsigned r = 0; r < j.n_runs; r++)
		atomic_init(&j.run[r],
			    chunks * r / j.n_runs | (chunks * (r + 1) / j.n_runs) << 32);
	if (vt == ENG_TYPE_F32) {
		j.act = j.act8 = (const uint8_t *)in;
		j.act_stride = ne0 * sizeof(float);
	} else {
		eng_pack8_fn pack = c->k->pack8[w0->type];
		/* the packed copy after the row, on its own cache lines */
		size_t off = pack ? (eng_row_bytes(vt, ne0) + 63) & ~(size_t)63 : 0;
		struct qa_job qj = { c->k->from_float[vt], pack, in, ne0, c->qact, c->qact_stride,
				     off, n_rows };

		assert(off + ENG_PACK8_BYTES(ne0) <= c->qact_stride);
		if (n_rows > 1)
			eng_pool_run(c->pool, qa_worker, &qj);
		else
			qa_worker(&qj, 0, 1);
		j.act = c->qact;
		j.act8 = c->qact + off;
		j.act_stride = c->qact_stride;
	}
	eng_pool_run(c->pool, mm_worker, &j);
}

/*
 * out_j = in @ W_j^T for the n (<= 3) weights given (which share ne0 and
 * type class); in is [nb][ne0] floats.  Converting the input once serves all.
 */
static void matmul(struct eng_ctx *c, unsigned n, const struct wt *const *w, float *const *out,
		   const float *in, uint32_t nb)
{
	struct mm_part parts[3];

	assert(n <= 3);
	for (unsigned i = 0; i < n; i++)
		parts[i] = (struct mm_part){ .w = w[i], .out = out[i], .row0 = 0, .nb = nb };
	matmul_parts(c, n, parts, in, nb);
}

void matmul1(struct eng_ctx *c, const struct wt *w, float *out, const float *in,
		    uint32_t nb)
{
	matmul(c, 1, &w, &out, in, nb);
}

/* Weights sharing an input may still differ in type (Q4_K_M mixes Q4_K and
 * Q6_K): group only those whose activations are converted (and packed) the
 * same way. */
void matmul_shared(struct eng_ctx *c, unsigned n, const struct wt *const *w,
			  float *const *out, const float *in, uint32_t nb)
{
	bool same = true;

	for (unsigned i = 1; i < n; i++)
		same &= eng_type_info(w[i]->type)->vec_dot_type ==
				eng_type_info(w[0]->type)->vec_dot_type &&
			c->k->pack8[w[i]->type] == c->k->pack8[w[0]->type];
	if (same) {
		matmul(c, n, w, out, in, nb);
		return;
	}
	for (unsigned i = 0; i < n; i++)
		matmul1(c, w[i], out[i], in, nb);
}
