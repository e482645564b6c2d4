/*
 * gguf.h - a reader for GGUF model files (versions 2 and 3), over memory.
 *
 * The reader never copies the file: it parses a byte range the caller mapped
 * (plain mmap or the pager's region) and hands out pointers into it.  The file
 * is hostile input: every count, length and offset is checked against what is
 * left before it is used, with overflow checks, and gguf_parse() either
 * returns a fully validated view or a one-line reason.  After a successful
 * parse every accessor below is safe to call without further checks.
 *
 * File layout (all integers little-endian):
 *
 *   u32  magic      "GGUF" (0x46554747)
 *   u32  version    2 or 3 (1 had 32-bit counts and is refused)
 *   u64  n_tensors
 *   u64  n_kv
 *   n_kv times:     string key; u32 value_type; value
 *   n_tensors times: string name; u32 n_dims (1..4); u64 ne[n_dims];
 *                   u32 ggml_type; u64 offset (relative to the data section)
 *   padding to `general.alignment` (u32 key, default 32, a power of two)
 *   data section:   tensor data, each tensor at data_start + offset, aligned
 *
 *   string = u64 length; bytes (not NUL-terminated)
 *   value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (u8),
 *                8 string, 9 array (u32 elem_type; u64 n; n elems),
 *                10 u64, 11 i64, 12 f64.  Arrays of arrays are allowed by the
 *                format; this reader accepts them but no getter returns one.
 */
#ifndef STRATA_GGUF_H
#define STRATA_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC 0x46554747u
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum gguf_vtype {
	GGUF_VT_U8 = 0,
	GGUF_VT_I8 = 1,
	GGUF_VT_U16 = 2,
	GGUF_VT_I16 = 3,
	GGUF_VT_U32 = 4,
	GGUF_VT_I32 = 5,
	GGUF_VT_F32 = 6,
	GGUF_VT_BOOL = 7,
	GGUF_VT_STRING = 8,
	GGUF_VT_ARRAY = 9,
	GGUF_VT_U64 = 10,
	GGUF_VT_I64 = 11,
	GGUF_VT_F64 = 12,
	GGUF_VT_COUNT
};

/* A string inside the file: not NUL-terminated. */
struct gguf_str {
	const char *ptr;
	uint64_t len;
};

struct gguf_kv {
	struct gguf_str key;
	enum gguf_vtype type;
	union {
		uint64_t u64; /* every unsigned integer type and bool, widened */
		int64_t i64;  /* every signed integer type, widened */
		double f64;   /* f32 and f64, widened */
		struct gguf_str str;
		struct {
			enum gguf_vtype type;
			uint64_t n;
			const uint8_t *data; /* first element in the file */
		} arr;
	} v;
};

struct gguf_tensor {
	struct gguf_str name;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length; unused dims are 1 */
	uint32_t type;              /* enum eng_type (ggml numbering) */
	uint64_t offset;            /* absolute byte offset in the file */
	uint64_t size;              /* bytes of data */
	uint64_t n_elems;
};

struct gguf;

/*
 * Parse a GGUF image of `size` bytes at `data`.  On failure returns -EINVAL
 * (malformed), -ENOTSUP (valid but unsupported: version, tensor type) or
 * -ENOMEM, and writes a one-line reason without the file name to err.
 * The image must outlive the returned handle.
 */
int gguf_parse(const void *data, size_t size, struct gguf **out, char *err, size_t errlen);
void gguf_destroy(struct gguf *g);

uint32_t gguf_version(const struct gguf *g);
uint32_t gguf_alignment(const struct gguf *g);
uint64_t gguf_data_offset(const struct gguf *g); /* absolute start of data */

uint64_t gguf_n_kv(const struct gguf *g);
const struct gguf_kv *gguf_kv_at(const struct gguf *g, uint64_t i);
const struct gguf_kv *gguf_find_kv(const struct gguf *g, const char *key);

/* Typed getters: 0 on success, -ENOENT if absent, -EINVAL on a type that
 * cannot be converted (any integer type converts to a wider or checked
 * narrower one; f32/f64 convert to each other). */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
int gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out);
int gguf_get_f32(const struct gguf *g, const char *key, float *out);
int gguf_get_bool(const struct gguf *g, const char *key, bool *out);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out);
/* An array of elem_type (GGUF_VT_COUNT accepts any); *n elements, *data the
 * first element in the file (unaligned: read with memcpy). */
int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype elem_type,
		 uint64_t *n, const uint8_t **data);
/* Walk a validated array of strings: *p starts at arr data and is advanced. */
struct gguf_str gguf_arr_next_str(const uint8_t **p);
/* true if s equals the NUL-terminated c */
bool gguf_str_eq(struct gguf_str s, const char *c);

uint64_t gguf_n_tensors(const struct gguf *g);
const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, uint64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name);
/* Where the tensor's data lies in the image. */
const uint8_t *gguf_tensor_data_ptr(const struct gguf *g, const struct gguf_tensor *t);

const char *gguf_vtype_name(enum gguf_vtype t);

#endif
