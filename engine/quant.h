/*
 * quant.h - tensor element types and the compute kernels over them.
 *
 * Every weight type the engine understands is described by a row in a type
 * table (block size, bytes per block, the activation format its dot product
 * consumes).  The kernels come in one scalar reference set (quant_ref.c) and
 * SIMD sets (quant_avx2.c, ...) with identical signatures; eng_kernels_get()
 * picks the best set for this CPU once, and the forward pass only ever calls
 * through the table, so no #ifdef appears in model code.
 *
 * Weights are never converted at load: vec_dot reads a weight row where it lies
 * in the mapped file.  Activations are converted once per matmul into the
 * weight type's vec_dot_type (Q8_0 for Q4_0/Q8_0, Q8_K for the K-quants, F16
 * for F16, BF16 for BF16, F32 for F32), as the reference engine does: integer
 * dot products can be used, and the rounding of the activations is part of
 * the numbers the reference produces.
 *
 * Block layouts (little-endian, as in GGUF files; QK_K = 256):
 *   Q4_0  32 elems, 18 B:  f16 d; u8 qs[16]      x = d * ((q & 15) - 8), low
 *                          nibbles are elements 0..15, high nibbles 16..31
 *   Q8_0  32 elems, 34 B:  f16 d; i8 qs[32]      x = d * q
 *   Q4_K 256 elems, 144 B: f16 d, dmin; u8 scales[12] (8 6-bit scales and
 *                          8 6-bit mins); u8 qs[128]
 *   Q5_K 256 elems, 176 B: f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *   Q6_K 256 elems, 210 B: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
 *   Q8_K 256 elems, 292 B: f32 d; i8 qs[256]; i16 bsums[16] (activations only)
 *   Q4_0_R16 (strata's own, not a ggml type; see below): Q4_0 with 16 rows
 *                          interleaved, 288 B per block of 16 rows
 *   F16, BF16, F32: one element per block.
 */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Numbering is the GGUF/ggml one: these values appear in model files. */
enum eng_type {
	ENG_TYPE_F32 = 0,
	ENG_TYPE_F16 = 1,
	ENG_TYPE_Q4_0 = 2,
	ENG_TYPE_Q4_1 = 3,
	ENG_TYPE_Q5_0 = 6,
	ENG_TYPE_Q5_1 = 7,
	ENG_TYPE_Q8_0 = 8,
	ENG_TYPE_Q8_1 = 9,
	ENG_TYPE_Q2_K = 10,
	ENG_TYPE_Q3_K = 11,
	ENG_TYPE_Q4_K = 12,
	ENG_TYPE_Q5_K = 13,
	ENG_TYPE_Q6_K = 14,
	ENG_TYPE_Q8_K = 15,
	ENG_TYPE_BF16 = 30,
	/* strata's own, written only by strata-repack: far above ggml's numbers
	 * (0..39 in 2026) so that no ggml type will take it soon, and a ggml
	 * reader rejects the file rather than misreading it. */
	ENG_TYPE_Q4_0_R16 = 64,
	ENG_TYPE_COUNT = 65, /* table size; unknown values stay NULL in it */
};

#define ENG_QK4_0 32
#define ENG_QK8_0 32
#define ENG_QK_K 256
#define ENG_K_SCALE_SIZE 12

typedef uint16_t eng_fp16_t;
typedef uint16_t eng_bf16_t;

struct eng_block_q4_0 {
	eng_fp16_t d;
	uint8_t qs[ENG_QK4_0 / 2];
};
_Static_assert(sizeof(struct eng_block_q4_0) == 18, "q4_0 block");

/*
 * Q4_0_R16: the blocks of 16 Q4_0 rows interleaved, a layout the AVX-512
 * kernel reads with plain loads (it transposes ordinary Q4_0 rows into it
 * in registers, about half of its instructions at one token; see
 * quant_avx512.c).  Rows 16g .. 16g + 15 of a weight are one run of
 * ne0 / 32 of these, so the 16 rows take the bytes of 16 Q4_0 rows in the
 * same place in the file; block ib of the run holds block ib of each row:
 *   d[r]              the scale of row r
 *   qs[k][4r .. 4r+3] bytes 4k .. 4k+3 of row r's qs (its dword k)
 * The values are Q4_0's; only the order differs.  A weight can be Q4_0_R16
 * only if its row count is a multiple of 16 (gguf.c checks) and it is only
 * ever multiplied (there is no single-row to_float or vec_dot).
 */
#define ENG_R16_ROWS 16

struct eng_block_q4_0_r16 {
	eng_fp16_t d[ENG_R16_ROWS];
	uint8_t qs[4][4 * ENG_R16_ROWS];
};
_Static_assert(sizeof(struct eng_block_q4_0_r16) == ENG_R16_ROWS * 18, "q4_0_r16 block");

/* The 16 Q4_0 rows of n elements at src, src + stride, ... interleaved into
 * n / 32 blocks at dst; and back, row r of the run at src into dst. */
void eng_q4_0_to_r16(const void *src, size_t stride, size_t n, void *dst);
void eng_r16_to_q4_0(const void *src, unsigned r, size_t n, void *dst);

struct eng_block_q8_0 {
	eng_fp16_t d;
	int8_t qs[ENG_QK8_0];
};
_Static_assert(sizeof(struct eng_block_q8_0) == 34, "q8_0 block");

struct eng_block_q4_k {
	eng_fp16_t d;
	eng_fp16_t dmin;
	uint8_t scales[ENG_K_SCALE_SIZE];
	uint8_t qs[ENG_QK_K / 2];
};
_Static_assert(sizeof(struct eng_block_q4_k) == 144, "q4_k block");

struct eng_block_q5_k {
	eng_fp16_t d;
	eng_fp16_t dmin;
	uint8_t scales[ENG_K_SCALE_SIZE];
	uint8_t qh[ENG_QK_K / 8];
	uint8_t qs[ENG_QK_K / 2];
};
_Static_assert(sizeof(struct eng_block_q5_k) == 176, "q5_k block");

struct eng_block_q6_k {
	uint8_t ql[ENG_QK_K / 2];
	uint8_t qh[ENG_QK_K / 4];
	int8_t scales[ENG_QK_K / 16];
	eng_fp16_t d;
};
_Static_assert(sizeof(struct eng_block_q6_k) == 210, "q6_k block");

struct eng_block_q8_k {
	float d;
	int8_t qs[ENG_QK_K];
	int16_t bsums[ENG_QK_K / 16];
};
_Static_assert(sizeof(struct eng_block_q8_k) == 292, "q8_k block");

/* Static facts about a type.  supported is false for types that are named
 * (so errors can say "Q4_1") but have no kernels. */
struct eng_type_info {
	const char *name;         /* "Q4_K", "F16", ... */
	uint32_t blck;            /* elements per block */
	uint32_t bytes;           /* bytes per block */
	enum eng_type vec_dot_type; /* activation format vec_dot consumes */
	bool supported;           /* has to_float and vec_dot kernels */
	uint32_t row_group;       /* rows interleaved: ENG_R16_ROWS for Q4_0_R16,
				   * which has vec_dot16 only; 1 for the rest */
};

/* NULL for values no GGUF type has. */
const struct eng_type_info *eng_type_info(uint32_t type);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size
 * or the type is unknown. */
size_t eng_row_bytes(uint32_t type, uint64_t n);

/* n is the row length in elements and always a multiple of the block size.
 * vec_dot: *out = sum_i w[i] * a[i], w a row of the weight type, a the same
 * row length in vec_dot_type format. */
typedef void (*eng_to_float_fn)(const void *src, float *dst, size_t n);
typedef void (*eng_from_float_fn)(const float *src, void *dst, size_t n);
typedef void (*eng_vec_dot_fn)(size_t n, float *out, const void *w, const void *a);

/*
 * vec_dot8: out[t * out_stride + r] = row r . a_t for the 8 weight rows at
 * w, w + stride, ..., w + 7 * stride and the nt (1 to ENG_DOT8_NT)
 * activation rows at a, a + a_stride, ...; each result bit-identical to what
 * vec_dot gives for that pair: the summation chains run side by side (SIMD
 * lanes), not merged, so each keeps the float order vec_dot (and the
 * reference engine) uses.  A chain alone is latency-bound; eight at once are
 * not, and a weight block unpacked once serves nt tokens of a prompt.
 * vec_dot16 is the same for 16 rows (w .. w + 15 * stride) and 1 to
 * ENG_DOT16_NT tokens (a prompt batch: the kernel can then unpack a block
 * once for more tokens than its registers hold).
 *
 * pack8 (optional, by weight type) is for a set whose vec_dot8 and vec_dot16
 * read the activations in a layout of their own rather than vec_dot_type's:
 * it converts one vec_dot_type row of n elements into at most
 * ENG_PACK8_BYTES(n) bytes of it.  The caller does this once per row and
 * matmul and passes the packed rows to vec_dot8/16 (vec_dot still takes the
 * vec_dot_type rows), so work that depends only on the activations is not
 * redone for every 8 or 16 weight rows.
 *
 * vec_dotn (optional, by weight type) is vec_dot16 for any number of rows:
 * nrows (1 or more) rows at w, w + stride, ... by 1 to ENG_DOT16_NT tokens,
 * each result bit-identical to vec_dot.  Where a set has one, matmul.c hands
 * it a thread's whole chunk of rows in one call and uses neither vec_dot8
 * nor vec_dot16 for the type, so work that depends on the tokens alone (the
 * layout avx512's prompt kernels give the activations, the K-quant eight-row
 * kernels' table) is done once for the chunk, not once per 8 or 16 rows.
 */
#define ENG_DOT8_NT 8
#define ENG_DOT16_NT 64

/* The rows of a chunk, as matmul.c shares rows of row_bytes out to its
 * threads for nt tokens (and so how many rows a vec_dotn call gets): about
 * 1024 token-rows, at most 2 MiB of weights, a multiple of 64 rows (whole
 * tiles of 16 and of 8), at least 64.  matmul.c says why. */
static inline uint64_t eng_chunk_rows(size_t row_bytes, uint32_t nt)
{
	uint64_t rows = 1024 / (nt ? nt : 1);

	if (rows > (2u << 20) / row_bytes)
		rows = (2u << 20) / row_bytes;
	rows = rows / 64 * 64;
	return rows < 64 ? 64 : rows;
}

/* Q8_K's: 292 + 256 + 4 + 256 a block, 808, and two cache lines for its
 * parts' alignment (quant_x86_i.h, pack8_q8_k_at) */
#define ENG_PACK8_BYTES(n) ((n) / 32 * 101 + 128)
typedef void (*eng_vec_dot8_fn)(size_t n, unsigned nt, float *out, size_t out_stride,
				const void *w, size_t stride, const void *a, size_t a_stride);
typedef void (*eng_vec_dotn_fn)(size_t n, unsigned nrows, unsigned nt, float *out,
				size_t out_stride, const void *w, size_t stride, const void *a,
				size_t a_stride);
typedef void (*eng_pack8_fn)(const void *src, void *dst, size_t n);

struct eng_kernels {
	const char *isa; /* "scalar", "avx2", ... */
	eng_to_float_fn to_float[ENG_TYPE_COUNT];
	eng_from_float_fn from_float[ENG_TYPE_COUNT]; /* for activation types */
	eng_vec_dot_fn vec_dot[ENG_TYPE_COUNT];        /* indexed by weight type */
	eng_vec_dot8_fn vec_dot8[ENG_TYPE_COUNT];      /* optional: NULL = row by row */
	eng_vec_dot8_fn vec_dot16[ENG_TYPE_COUNT];     /* optional: NULL = by 8 rows */
	eng_vec_dotn_fn vec_dotn[ENG_TYPE_COUNT];      /* optional: NULL = by 16 and 8 rows */
	eng_pack8_fn pack8[ENG_TYPE_COUNT];            /* optional, see above; by weight type */
};

/* The scalar reference set: the ground truth for every other set. */
const struct eng_kernels *eng_kernels_ref(void);
/* The AVX2 set, or NULL if this CPU (or build) lacks AVX2/FMA/F16C. Types the
 * set does not accelerate fall back to the reference kernels. */
const struct eng_kernels *eng_kernels_avx2(void);
/* The AVX2 set plus AVX-512 VNNI kernels (256-bit), or NULL without them. */
const struct eng_kernels *eng_kernels_avx512(void);
/* The avx512 set as a CPU with VNNI but without AVX-512 BW and VBMI gets
 * it (256-bit K-quant kernels in place of the VBMI ones), or NULL without
 * VNNI: for the tests, which check those kernels on any VNNI CPU. */
const struct eng_kernels *eng_kernels_avx512_novbmi(void);
/* The avx512 set with AVX-512 BF16's vdpbf16ps for BF16 weights, or NULL
 * without it: its own summation order, so only when asked for. */
const struct eng_kernels *eng_kernels_avx512bf16(void);
/* The best set for this CPU, chosen once; STRATA_ISA=scalar|avx2|avx512|
 * avx512bf16 asks for one (a set the CPU lacks falls back to the next one
 * down). */
const struct eng_kernels *eng_kernels_get(void);

float eng_fp16_to_fp32(eng_fp16_t h);
eng_fp16_t eng_fp32_to_fp16(float f);
float eng_bf16_to_fp32(eng_bf16_t h);
/* Round to nearest even; NaN stays NaN (quieted), as ggml's conversion. */
eng_bf16_t eng_fp32_to_bf16(float f);

#endif
