/*
 * gguf_buf_i.h - a growing buffer for writing a GGUF header (the tools'
 * writers: strata-mkmodel's synthetic models, strata-repack --layers).
 * Little-endian, as every CPU strata runs on.  A failed allocation sets oom
 * and later puts do nothing: the writer checks oom once at the end.
 */
#ifndef STRATA_GGUF_BUF_I_H
#define STRATA_GGUF_BUF_I_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct buf {
	uint8_t *p;
	size_t len, cap;
	bool oom; /* checked once at the end instead of after every put */
};

static inline void buf_put(struct buf *b, const void *src, size_t n)
{
	if (b->oom)
		return;
	if (b->cap - b->len < n) {
		size_t cap = b->cap ? b->cap : 4096;
		uint8_t *p;

		while (cap - b->len < n)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, src, n);
	b->len += n;
}

static inline void put_u32(struct buf *b, uint32_t v)
{
	buf_put(b, &v, 4);
}

static inline void put_u64(struct buf *b, uint64_t v)
{
	buf_put(b, &v, 8);
}

static inline void put_str(struct buf *b, const char *s, size_t len)
{
	put_u64(b, len);
	buf_put(b, s, len);
}

#endif
