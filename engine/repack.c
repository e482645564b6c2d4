/*
 * repack.c - Q4_0 matrices of a GGUF image to Q4_0_R16, in place (repack.h),
 * and whether that pays on this CPU (eng_ctx_repack_gain).
 */
#include "repack.h"

#include "model_i.h"
#include "quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool repackable(const struct gguf_tensor *t)
{
	return t->type == ENG_TYPE_Q4_0 && t->n_dims == 2 && t->ne[1] % ENG_R16_ROWS == 0 &&
	       !gguf_str_eq(t->name, "token_embd.weight");
}

uint64_t eng_n_repackable(const struct gguf *g)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < gguf_n_tensors(g); i++)
		n += repackable(gguf_tensor_at(g, i));
	return n;
}

/* Where t's u32 type lies in img: after the name, n_dims and ne[] of its
 * header entry (gguf.h); the parsed name points into the image. */
static size_t type_field(const uint8_t *img, const struct gguf_tensor *t)
{
	return (size_t)((const uint8_t *)t->name.ptr - img) + t->name.len + 4 +
	       8 * (size_t)t->n_dims;
}

int eng_repack_r16(uint8_t *img, size_t len, uint64_t *n_tensors, uint64_t *n_bytes, char *err,
		   size_t errlen)
{
	struct gguf *g;
	uint64_t max_run = 0;
	uint8_t *buf;
	int rc = gguf_parse(img, len, &g, err, errlen);

	*n_tensors = *n_bytes = 0;
	if (rc)
		return rc;
	/* check every type field first, so a failure leaves img as it was */
	for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);
		uint32_t was;

		if (!repackable(t))
			continue;
		memcpy(&was, img + type_field(img, t), 4);
		if (was != t->type) {
			snprintf(err, errlen, "tensor '%.*s': type field not where expected",
				 (int)t->name.len, t->name.ptr);
			gguf_destroy(g);
			return -EINVAL;
		}
		if (t->size / t->ne[1] * ENG_R16_ROWS > max_run)
			max_run = t->size / t->ne[1] * ENG_R16_ROWS;
	}
	buf = max_run ? malloc(max_run) : NULL;
	if (max_run && !buf) {
		snprintf(err, errlen, "out of memory (%llu bytes)", (unsigned long long)max_run);
		gguf_destroy(g);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);
		const uint32_t type = ENG_TYPE_Q4_0_R16;
		uint8_t *data = img + t->offset;
		uint64_t rb = t->size / t->ne[1], run = rb * ENG_R16_ROWS;

		if (!repackable(t))
			continue;
		memcpy(img + type_field(img, t), &type, 4);
		for (uint64_t r0 = 0; r0 < t->ne[1]; r0 += ENG_R16_ROWS) {
			eng_q4_0_to_r16(data + r0 * rb, rb, t->ne[0], buf);
			memcpy(data + r0 * rb, buf, run);
		}
		(*n_tensors)++;
		*n_bytes += t->size;
	}
	free(buf);
	gguf_destroy(g);
	return 0;
}

/*
 * Whether the repack pays here (engine.h).  What it times is what decoding
 * does with those matrices: matmul1 of one token on the context's kernels and
 * threads.  A decoded token reads its weights from memory, so the matrices
 * timed are at least GAIN_BYTES (layers are added until then), far past the
 * caches; a model smaller than that is timed whole and over again, from the
 * caches, where the layout that saves instructions gains more than it would
 * decoding a model that does not fit them.
 */
#define GAIN_BYTES (64u << 20)
#define GAIN_MAX 64   /* matrices timed, at most */
#define GAIN_REPS 9   /* timings of each layout, alternated */

static bool repackable_wt(const struct wt *w)
{
	return w->data && w->type == ENG_TYPE_Q4_0 && w->ne1 % ENG_R16_ROWS == 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* n matmuls of one token, `times` times over */
static double time_all(struct eng_ctx *c, const struct wt *w, unsigned n, unsigned times,
		       float *out, const float *in)
{
	double t0 = now_s();

	for (unsigned t = 0; t < times; t++)
		for (unsigned i = 0; i < n; i++)
			matmul1(c, &w[i], out, in, 1);
	return now_s() - t0;
}

int eng_ctx_repack_gain(struct eng_ctx *c, double *gain)
{
	const struct eng_model *m = c->m;
	struct wt orig[GAIN_MAX], copy[GAIN_MAX]; /* both copies, made below */
	unsigned n = 0;
	uint64_t bytes = 0, max_ne0 = 0, max_ne1 = 0;

	for (uint32_t l = 0; l < m->hp.n_layer && bytes < GAIN_BYTES; l++) {
		const struct layer_w *L = &m->layers[l];
		const struct wt *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo,
					  &L->gate, &L->up, &L->down };

		for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]) && n < GAIN_MAX; i++) {
			if (!repackable_wt(ws[i]))
				continue;
			orig[n++] = *ws[i];
			bytes += ws[i]->ne1 * ws[i]->row_bytes;
			max_ne0 = ws[i]->ne0 > max_ne0 ? ws[i]->ne0 : max_ne0;
			max_ne1 = ws[i]->ne1 > max_ne1 ? ws[i]->ne1 : max_ne1;
		}
	}
	if (!n)
		return -ENOENT;

	/* Two copies, as Q4_0 and as Q4_0_R16 (each run of 16 rows
	 * interleaved), in memory allocated alike: the model's own pages may
	 * differ from fresh ones in ways that are not the layout's (huge pages,
	 * where they lie), and that difference is not what is asked */
	uint8_t *buf = malloc(2 * bytes);
	float *in = malloc(max_ne0 * sizeof(float)), *out = malloc(max_ne1 * sizeof(float));

	if (!buf || !in || !out) {
		free(buf);
		free(in);
		free(out);
		return -ENOMEM;
	}
	uint8_t *at = buf;

	for (unsigned i = 0; i < n; i++) {
		const struct wt *w = &orig[i];
		size_t size = w->ne1 * w->row_bytes;

		copy[i] = *w;
		copy[i].type = ENG_TYPE_Q4_0_R16;
		copy[i].data = at + size;
		memcpy(at, w->data, size);
		orig[i].data = at;
		for (uint64_t r0 = 0; r0 < w->ne1; r0 += ENG_R16_ROWS)
			eng_q4_0_to_r16(w->data + r0 * w->row_bytes, w->row_bytes, w->ne0,
					at + size + r0 * w->row_bytes);
		at += 2 * size;
	}
	for (uint64_t i = 0; i < max_ne0; i++) /* any token's values will do */
		in[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;

	/* alternated, the order swapped every time: neither layout always
	 * finds the other's reads just done; a small model's matrices read
	 * again until a timing is GAIN_BYTES of reads */
	unsigned times = (unsigned)((GAIN_BYTES + bytes - 1) / bytes);
	double best_orig = 1e30, best_copy = 1e30;

	for (unsigned r = 0; r < GAIN_REPS; r++) {
		double to, tc;

		if (r % 2) {
			tc = time_all(c, copy, n, times, out, in);
			to = time_all(c, orig, n, times, out, in);
		} else {
			to = time_all(c, orig, n, times, out, in);
			tc = time_all(c, copy, n, times, out, in);
		}
		best_orig = to < best_orig ? to : best_orig;
		best_copy = tc < best_copy ? tc : best_copy;
	}
	*gain = best_orig / best_copy;
	free(buf);
	free(in);
	free(out);
	return 0;
}
