/*
 * gguf.c - validate a GGUF image in memory and index it.
 *
 * The parser walks the header once with a bounds-checked cursor (struct rd):
 * every read first checks that the bytes are there, every count is checked
 * against the bytes left before anything is allocated for it (each element
 * needs at least one byte, so a count larger than the remaining bytes is a
 * lie), and every size computation is overflow-checked.  Tensor extents are
 * checked to lie inside the image, inside the data section, aligned, and not
 * to overlap one another.  After gguf_parse() succeeds, the accessors trust
 * the index.
 *
 * Ownership: the handle owns only its index arrays; all strings and tensor
 * data point into the caller's image.  Not thread-safe to create, safe to
 * read from many threads.
 */
#include "gguf.h"
#include "quant.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gguf {
	const uint8_t *base;
	size_t size;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_offset;
	uint64_t n_kv;
	struct gguf_kv *kv;
	uint64_t n_tensors;
	struct gguf_tensor *tensors;
	uint64_t *by_name; /* tensor indices sorted by name, for lookup */
};

/* Bounds-checked cursor.  The first failure records a message; later reads
 * fail quietly so callers can check once per logical item. */
struct rd {
	const uint8_t *start;
	const uint8_t *p;
	const uint8_t *end;
	char *err;
	size_t errlen;
	int failed;
};

static void __attribute__((format(printf, 2, 3))) fail(struct rd *r, const char *fmt, ...)
{
	va_list ap;

	if (r->failed)
		return;
	r->failed = -EINVAL;
	va_start(ap, fmt);
	vsnprintf(r->err, r->errlen, fmt, ap);
	va_end(ap);
}

static size_t left(const struct rd *r)
{
	return (size_t)(r->end - r->p);
}

static const uint8_t *take(struct rd *r, uint64_t n, const char *what)
{
	const uint8_t *p = r->p;

	if (r->failed)
		return NULL;
	if (n > left(r)) {
		fail(r, "truncated: %s needs %llu bytes at offset %zu, %zu left", what,
		     (unsigned long long)n, (size_t)(r->p - r->start), left(r));
		return NULL;
	}
	r->p += n;
	return p;
}

static uint64_t rd_u(struct rd *r, unsigned bytes, const char *what)
{
	const uint8_t *p = take(r, bytes, what);
	uint64_t v = 0;

	if (!p)
		return 0;
	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static struct gguf_str rd_str(struct rd *r, const char *what)
{
	struct gguf_str s = { NULL, 0 };
	uint64_t len = rd_u(r, 8, what);
	const uint8_t *p = take(r, len, what);

	if (p) {
		s.ptr = (const char *)p;
		s.len = len;
	}
	return s;
}

static const unsigned scalar_size[GGUF_VT_COUNT] = {
	[GGUF_VT_U8] = 1,  [GGUF_VT_I8] = 1,  [GGUF_VT_U16] = 2, [GGUF_VT_I16] = 2,
	[GGUF_VT_U32] = 4, [GGUF_VT_I32] = 4, [GGUF_VT_F32] = 4, [GGUF_VT_BOOL] = 1,
	[GGUF_VT_U64] = 8, [GGUF_VT_I64] = 8, [GGUF_VT_F64] = 8,
};

const char *gguf_vtype_name(enum gguf_vtype t)
{
	static const char *const names[GGUF_VT_COUNT] = {
		"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
		"u64", "i64", "f64",
	};
	return (unsigned)t < GGUF_VT_COUNT ? names[t] : "invalid";
}

/* Decode one scalar (not string/array) of type t into kv->v. */
static void rd_scalar(struct rd *r, enum gguf_vtype t, struct gguf_kv *kv)
{
	uint64_t raw = rd_u(r, scalar_size[t], "value");
	float f;

	switch (t) {
	case GGUF_VT_I8:
		kv->v.i64 = (int8_t)raw;
		break;
	case GGUF_VT_I16:
		kv->v.i64 = (int16_t)raw;
		break;
	case GGUF_VT_I32:
		kv->v.i64 = (int32_t)raw;
		break;
	case GGUF_VT_I64:
		kv->v.i64 = (int64_t)raw;
		break;
	case GGUF_VT_F32: {
		uint32_t u = (uint32_t)raw;
		memcpy(&f, &u, 4);
		kv->v.f64 = f;
		break;
	}
	case GGUF_VT_F64:
		memcpy(&kv->v.f64, &raw, 8);
		break;
	case GGUF_VT_BOOL:
		if (raw > 1)
			fail(r, "bool value %llu is neither 0 nor 1", (unsigned long long)raw);
		kv->v.u64 = raw;
		break;
	default:
		kv->v.u64 = raw;
		break;
	}
}

/* Skip over (and validate) n elements of type t; nested arrays recurse with a
 * depth limit so a hostile file cannot exhaust the stack. */
static void skip_array(struct rd *r, enum gguf_vtype t, uint64_t n, int depth)
{
	if ((unsigned)t >= GGUF_VT_COUNT) {
		fail(r, "array element type %u is not a GGUF type", (unsigned)t);
		return;
	}
	if (t == GGUF_VT_STRING) {
		if (n > left(r) / 8) {
			fail(r, "array of %llu strings is longer than the file",
			     (unsigned long long)n);
			return;
		}
		for (uint64_t i = 0; i < n && !r->failed; i++)
			rd_str(r, "string array element");
	} else if (t == GGUF_VT_ARRAY) {
		if (depth >= 4) {
			fail(r, "arrays nested deeper than 4 levels");
			return;
		}
		if (n > left(r) / 12) {
			fail(r, "array of %llu arrays is longer than the file",
			     (unsigned long long)n);
			return;
		}
		for (uint64_t i = 0; i < n && !r->failed; i++) {
			uint32_t et = (uint32_t)rd_u(r, 4, "nested array type");
			uint64_t en = rd_u(r, 8, "nested array length");
			if (!r->failed)
				skip_array(r, (enum gguf_vtype)et, en, depth + 1);
		}
	} else {
		if (n > left(r) / scalar_size[t]) {
			fail(r, "array of %llu %s is longer than the file", (unsigned long long)n,
			     gguf_vtype_name(t));
			return;
		}
		take(r, n * scalar_size[t], "array");
	}
}

static int cmp_tensor_name(const struct gguf_tensor *a, const struct gguf_tensor *b)
{
	size_t n = a->name.len < b->name.len ? a->name.len : b->name.len;
	int c = memcmp(a->name.ptr, b->name.ptr, n);

	if (c)
		return c;
	return (a->name.len > b->name.len) - (a->name.len < b->name.len);
}

/* qsort has no context argument: the table being sorted is passed through a
 * thread-local, set only for the duration of the sorts in gguf_parse(). */
static _Thread_local const struct gguf_tensor *sort_tensors;

static int cmp_index(const void *a, const void *b)
{
	return cmp_tensor_name(&sort_tensors[*(const uint64_t *)a],
			       &sort_tensors[*(const uint64_t *)b]);
}

static int cmp_offset(const void *a, const void *b)
{
	uint64_t x = sort_tensors[*(const uint64_t *)a].offset;
	uint64_t y = sort_tensors[*(const uint64_t *)b].offset;

	return (x > y) - (x < y);
}

static int parse_tensor(struct rd *r, struct gguf_tensor *t, uint64_t idx)
{
	const struct eng_type_info *ti;
	uint64_t n = 1;

	t->name = rd_str(r, "tensor name");
	t->n_dims = (uint32_t)rd_u(r, 4, "tensor dims");
	if (r->failed)
		return r->failed;
	if (t->name.len == 0 || t->name.len > 256) {
		fail(r, "tensor %llu has a name of %llu bytes", (unsigned long long)idx,
		     (unsigned long long)t->name.len);
		return r->failed;
	}
	if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
		fail(r, "tensor '%.*s' has %u dimensions (1..4 allowed)", (int)t->name.len,
		     t->name.ptr, t->n_dims);
		return r->failed;
	}
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = d < t->n_dims ? rd_u(r, 8, "tensor shape") : 1;
		if (r->failed)
			return r->failed;
		if (t->ne[d] == 0 || (n && t->ne[d] > UINT64_MAX / n)) {
			fail(r, "tensor '%.*s' has an invalid shape", (int)t->name.len,
			     t->name.ptr);
			return r->failed;
		}
		n *= t->ne[d];
	}
	t->n_elems = n;
	t->type = (uint32_t)rd_u(r, 4, "tensor type");
	t->offset = rd_u(r, 8, "tensor offset");
	if (r->failed)
		return r->failed;
	ti = eng_type_info(t->type);
	if (!ti) {
		fail(r, "tensor '%.*s' has unknown type %u", (int)t->name.len, t->name.ptr,
		     t->type);
		return r->failed;
	}
	if (t->ne[0] % ti->blck) {
		fail(r, "tensor '%.*s': row of %llu is not a multiple of the %s block (%u)",
		     (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0], ti->name,
		     ti->blck);
		return r->failed;
	}
	/* Interleaved rows come in whole groups (a matrix: the rows of the
	 * higher dimensions would run into each other). */
	if (ti->row_group > 1 &&
	    (t->ne[1] % ti->row_group || t->ne[2] != 1 || t->ne[3] != 1)) {
		fail(r, "tensor '%.*s' is %s but not a matrix of whole %u-row groups",
		     (int)t->name.len, t->name.ptr, ti->name, ti->row_group);
		return r->failed;
	}
	if (n / ti->blck > UINT64_MAX / ti->bytes) {
		fail(r, "tensor '%.*s' is too large", (int)t->name.len, t->name.ptr);
		return r->failed;
	}
	t->size = n / ti->blck * ti->bytes;
	return 0;
}

int gguf_parse(const void *data, size_t size, struct gguf **out, char *err, size_t errlen)
{
	struct rd r = { data, data, (const uint8_t *)data + size, err, errlen, 0 };
	struct gguf *g;
	uint64_t hdr_end, pad;
	const struct gguf_kv *al;

	*out = NULL;
	if (errlen)
		err[0] = '\0';
	if (size < 24) {
		snprintf(err, errlen, "not a GGUF file (%zu bytes, too short for a header)", size);
		return -EINVAL;
	}
	if (rd_u(&r, 4, "magic") != GGUF_MAGIC) {
		snprintf(err, errlen, "not a GGUF file (bad magic)");
		return -EINVAL;
	}
	g = calloc(1, sizeof(*g));
	if (!g) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	g->base = data;
	g->size = size;
	g->version = (uint32_t)rd_u(&r, 4, "version");
	if (g->version != 2 && g->version != 3) {
		snprintf(err, errlen, "unsupported GGUF version %u (2 and 3 are supported)",
			 g->version);
		gguf_destroy(g);
		return -ENOTSUP;
	}
	g->n_tensors = rd_u(&r, 8, "tensor count");
	g->n_kv = rd_u(&r, 8, "metadata count");
	/* A key-value pair takes at least 12 bytes (key length + type); a tensor
	 * record at least 8 + 4 + 8 + 4 + 8. */
	if (g->n_kv > left(&r) / 12 || g->n_tensors > left(&r) / 32) {
		fail(&r, "header claims %llu metadata entries and %llu tensors, more than the file holds",
		     (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);
		goto err;
	}
	g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
	g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
	g->by_name = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->by_name));
	if (!g->kv || !g->tensors || !g->by_name) {
		snprintf(err, errlen, "out of memory");
		gguf_destroy(g);
		return -ENOMEM;
	}

	for (uint64_t i = 0; i < g->n_kv && !r.failed; i++) {
		struct gguf_kv *kv = &g->kv[i];
		uint32_t t;

		kv->key = rd_str(&r, "metadata key");
		t = (uint32_t)rd_u(&r, 4, "metadata type");
		if (r.failed)
			break;
		if (kv->key.len == 0 || kv->key.len > 65535) {
			fail(&r, "metadata entry %llu has a key of %llu bytes",
			     (unsigned long long)i, (unsigned long long)kv->key.len);
			break;
		}
		if (t >= GGUF_VT_COUNT) {
			fail(&r, "metadata '%.*s' has unknown type %u", (int)kv->key.len,
			     kv->key.ptr, t);
			break;
		}
		kv->type = (enum gguf_vtype)t;
		if (t == GGUF_VT_STRING) {
			kv->v.str = rd_str(&r, "metadata string");
		} else if (t == GGUF_VT_ARRAY) {
			kv->v.arr.type = (enum gguf_vtype)rd_u(&r, 4, "array type");
			kv->v.arr.n = rd_u(&r, 8, "array length");
			kv->v.arr.data = r.p;
			if (!r.failed)
				skip_array(&r, kv->v.arr.type, kv->v.arr.n, 0);
		} else {
			rd_scalar(&r, kv->type, kv);
		}
		if (r.failed) {
			/* name the key in the message; the cursor message says what */
			char inner[160];
			snprintf(inner, sizeof(inner), "%s", err);
			snprintf(err, errlen, "metadata '%.*s': %s", (int)(kv->key.len > 64 ? 64 : kv->key.len),
				 kv->key.ptr ? kv->key.ptr : "", inner);
		}
	}
	if (r.failed)
		goto err;

	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	al = gguf_find_kv(g, "general.alignment");
	if (al) {
		if (al->type != GGUF_VT_U32 || al->v.u64 == 0 || al->v.u64 > (1u << 20) ||
		    (al->v.u64 & (al->v.u64 - 1))) {
			fail(&r, "general.alignment must be a u32 power of two up to 1 MiB");
			goto err;
		}
		g->alignment = (uint32_t)al->v.u64;
	}

	for (uint64_t i = 0; i < g->n_tensors; i++) {
		if (parse_tensor(&r, &g->tensors[i], i))
			goto err;
		g->by_name[i] = i;
	}

	hdr_end = (uint64_t)(r.p - g->base);
	pad = (g->alignment - hdr_end % g->alignment) % g->alignment;
	g->data_offset = hdr_end + pad;
	if (g->data_offset > size) {
		/* Vocabulary-only files end right after the header, unpadded. */
		if (g->n_tensors) {
			fail(&r, "truncated: data section starts past the end of the file");
			goto err;
		}
		g->data_offset = size;
	}

	/* Extents: aligned, inside the file, no two overlapping. */
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct gguf_tensor *t = &g->tensors[i];
		uint64_t avail = size - g->data_offset;

		if (t->offset % g->alignment) {
			fail(&r, "tensor '%.*s' data offset %llu is not aligned to %u",
			     (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
			     g->alignment);
			goto err;
		}
		if (t->offset > avail || t->size > avail - t->offset) {
			fail(&r, "truncated: tensor '%.*s' (%llu bytes at %llu) extends past the end of the file",
			     (int)t->name.len, t->name.ptr, (unsigned long long)t->size,
			     (unsigned long long)(g->data_offset + t->offset));
			goto err;
		}
		t->offset += g->data_offset;
	}
	sort_tensors = g->tensors;
	if (g->n_tensors > 1) {
		qsort(g->by_name, g->n_tensors, sizeof(*g->by_name), cmp_offset);
		for (uint64_t i = 1; i < g->n_tensors; i++) {
			const struct gguf_tensor *a = &g->tensors[g->by_name[i - 1]];
			const struct gguf_tensor *b = &g->tensors[g->by_name[i]];
			if (a->offset + a->size > b->offset) {
				fail(&r, "tensors '%.*s' and '%.*s' overlap", (int)a->name.len,
				     a->name.ptr, (int)b->name.len, b->name.ptr);
				goto err;
			}
		}
		qsort(g->by_name, g->n_tensors, sizeof(*g->by_name), cmp_index);
		for (uint64_t i = 1; i < g->n_tensors; i++) {
			const struct gguf_tensor *a = &g->tensors[g->by_name[i - 1]];
			const struct gguf_tensor *b = &g->tensors[g->by_name[i]];
			if (!cmp_tensor_name(a, b)) {
				fail(&r, "tensor name '%.*s' appears twice", (int)a->name.len,
				     a->name.ptr);
				goto err;
			}
		}
	}
	sort_tensors = NULL;
	*out = g;
	return 0;
err:
	sort_tensors = NULL;
	gguf_destroy(g);
	return r.failed ? r.failed : -EINVAL;
}

void gguf_destroy(struct gguf *g)
{
	if (!g)
		return;
	free(g->kv);
	free(g->tensors);
	free(g->by_name);
	free(g);
}

uint32_t gguf_version(const struct gguf *g)
{
	return g->version;
}

uint32_t gguf_alignment(const struct gguf *g)
{
	return g->alignment;
}

uint64_t gguf_data_offset(const struct gguf *g)
{
	return g->data_offset;
}

uint64_t gguf_n_kv(const struct gguf *g)
{
	return g->n_kv;
}

const struct gguf_kv *gguf_kv_at(const struct gguf *g, uint64_t i)
{
	return i < g->n_kv ? &g->kv[i] : NULL;
}

bool gguf_str_eq(struct gguf_str s, const char *c)
{
	size_t n = strlen(c);

	return s.len == n && memcmp(s.ptr, c, n) == 0;
}

const struct gguf_kv *gguf_find_kv(const struct gguf *g, const char *key)
{
	/* Linear: metadata is a few dozen entries and read once at load. */
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (gguf_str_eq(g->kv[i].key, key))
			return &g->kv[i];
	return NULL;
}

static bool is_unsigned(enum gguf_vtype t)
{
	return t == GGUF_VT_U8 || t == GGUF_VT_U16 || t == GGUF_VT_U32 || t == GGUF_VT_U64 ||
	       t == GGUF_VT_BOOL;
}

static bool is_signed(enum gguf_vtype t)
{
	return t == GGUF_VT_I8 || t == GGUF_VT_I16 || t == GGUF_VT_I32 || t == GGUF_VT_I64;
}

int gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (is_unsigned(kv->type)) {
		*out = kv->v.u64;
		return 0;
	}
	if (is_signed(kv->type) && kv->v.i64 >= 0) {
		*out = (uint64_t)kv->v.i64;
		return 0;
	}
	return -EINVAL;
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out)
{
	uint64_t v;
	int rc = gguf_get_u64(g, key, &v);

	if (rc)
		return rc;
	if (v > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_F32 && kv->type != GGUF_VT_F64)
		return -EINVAL;
	*out = (float)kv->v.f64;
	return 0;
}

int gguf_get_bool(const struct gguf *g, const char *key, bool *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_BOOL)
		return -EINVAL;
	*out = kv->v.u64 != 0;
	return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_STRING)
		return -EINVAL;
	*out = kv->v.str;
	return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype elem_type, uint64_t *n,
		 const uint8_t **data)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_VT_ARRAY ||
	    (elem_type != GGUF_VT_COUNT && kv->v.arr.type != elem_type))
		return -EINVAL;
	*n = kv->v.arr.n;
	*data = kv->v.arr.data;
	return 0;
}

struct gguf_str gguf_arr_next_str(const uint8_t **p)
{
	struct gguf_str s;
	uint64_t len;

	memcpy(&len, *p, 8); /* validated at parse time; hosts are little-endian */
	s.ptr = (const char *)*p + 8;
	s.len = len;
	*p += 8 + len;
	return s;
}

uint64_t gguf_n_tensors(const struct gguf *g)
{
	return g->n_tensors;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, uint64_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name)
{
	struct gguf_tensor key = { .name = { name, strlen(name) } };
	uint64_t lo = 0, hi = g->n_tensors;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int c = cmp_tensor_name(&key, &g->tensors[g->by_name[mid]]);

		if (c == 0)
			return &g->tensors[g->by_name[mid]];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

const uint8_t *gguf_tensor_data_ptr(const struct gguf *g, const struct gguf_tensor *t)
{
	return g->base + t->offset;
}
