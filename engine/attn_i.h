/*
 * attn_i.h - the KV cache (kv.c) and the kernels attention runs on it
 * (attn.c: the scalar set and the attention pass; attn_avx2.c: AVX2).
 *
 * The cache holds, per attention layer, a K and a V row per slot: n_head_kv
 * heads of head_dim values in the cache type (F16, or Q8_0 / Q4_0 blocks of
 * 32 along the row, as GGUF lays them out).  A layer that sees every
 * position has a slot per position of the context (slot = position); a
 * sliding-window layer has a ring of window + batch - 1 slots (slot =
 * position % slots): a batch writes all its keys before its first query
 * reads, and that query still needs the window before it.  A ring keeps the
 * position each slot holds (tag, position + 1; 0: empty), which is how a
 * query tells a live key from an overwritten one or a hole a context shift
 * left.
 *
 * The kernels read the cache where it lies: a quantized key is dotted with
 * the query quantized to Q8_0 once per (token, head), a quantized value is
 * scaled into float accumulators a block at a time; no row is expanded into
 * a copy of the cache.
 */
#ifndef STRATA_ATTN_I_H
#define STRATA_ATTN_I_H

#include "engine.h"
#include "quant.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct eng_ctx;

/*
 * score: out[t] = q . k_t for the n keys of hd values at k, k + stride, ...
 *   (each the start of one head's blocks); q is the query as Q8_0 blocks.
 *   For Q8_0 and Q4_0 keys; F16 keys go through the kernel set's F16 dot.
 * accum: acc[d] += sum_t w[t] * v_t[d] for the n values at v, v + stride,
 *   ...; a set may sum the n terms in float before adding them to acc
 *   (quantized types), or add each product to acc in double (F16, as the
 *   reference does).
 */
typedef void (*attn_score_fn)(size_t hd, size_t n, float *out, const void *k, size_t stride,
			      const void *q);
typedef void (*attn_accum_fn)(size_t hd, size_t n, double *acc, const void *v, size_t stride,
			      const float *w);

struct attn_kernels {
	const char *isa;
	attn_score_fn score[ENG_KV_COUNT]; /* NULL for F16 */
	attn_accum_fn accum[ENG_KV_COUNT];
};

const struct attn_kernels *attn_kernels_ref(void);
/* NULL where the CPU lacks AVX2/FMA/F16C. */
const struct attn_kernels *attn_kernels_avx2(void);
/* The set to go with a kernel set: scalar with scalar, else AVX2 if any. */
const struct attn_kernels *attn_kernels_for(const struct eng_kernels *k);

/* One attention layer's cache. */
struct kv_layer {
	uint8_t *k, *v;   /* [n_slots][k_row], [n_slots][v_row] bytes */
	uint32_t n_slots;
	uint32_t *tag;    /* rings only: position + 1 held by each slot, 0 none */
};

/* kv.c */
/* The GGUF type of a cache type. */
uint32_t kv_gguf_type(enum eng_kv_type t);
/* Check that the model's rows fit the types' blocks; 0 or -EINVAL. */
int kv_check(const struct eng_model *m, enum eng_kv_type tk, enum eng_kv_type tv, char *err,
	     size_t errlen);
/* Slots of attention layer l for n_ctx and n_batch. */
uint32_t kv_slots(const struct eng_model *m, uint32_t l, uint32_t n_ctx, uint32_t n_batch);
/* Write the rotated key k and value v of position pos into layer slot s. */
void kv_store(struct eng_ctx *c, uint32_t s, uint32_t pos, const float *k, const float *v);
/* Keys of layer kl from position *t up to (not including) end, as a run of
 * consecutive slots: its length (0: none left) and first slot; *t moves past
 * it.  Positions a ring no longer holds are skipped. */
uint32_t kv_run(const struct kv_layer *kl, uint32_t *t, uint32_t end, uint32_t *slot);
/* n values of a cache row from element off on, to float: for heads that
 * are not whole blocks (head_dim 8 or 16 in a block of 32). */
void kv_slice_to_float(enum eng_kv_type t, const uint8_t *row, size_t off, size_t n,
		       float *dst);
/* Empty every ring (eng_ctx_reset). */
void kv_clear(struct eng_ctx *c);
/* The quantizer of Q4_0 rows (ggml's rounding: x / d + 8.5 truncated). */
void kv_q4_0_from_float(const float *src, void *dst, size_t n);

/* attn.c: xb2 = attention(q, cache of layer l) for the nb rows of the pass,
 * each over its own context's cache up to its position (c->row_ctx,
 * c->row_pos), on c's threads. */
void attention(struct eng_ctx *c, uint32_t l, uint32_t nb);

#endif
