/*
 * repack.c - Q4_0 matrices of a GGUF image to Q4_0_R16, in place (repack.h).
 */
#include "repack.h"

#include "quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
