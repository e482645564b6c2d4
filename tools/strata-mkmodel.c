/*
 * strata-mkmodel.c - write a synthetic GGUF model of a real shape, for
 * benchmarks.
 *
 * Benchmarks need models the size of real ones (an 8B-shaped Q4_0 file is
 * about 4.3 GiB) that no test fixture carries.  This tool writes a valid GGUF
 * v3 file of the llama, qwen3, gemma2, gemma3, phi3, qwen35 or qwen3moe
 * architecture with random weights and a synthetic SentencePiece vocabulary,
 * which the engine loads and runs like a downloaded model: tensor names,
 * shapes, types and metadata follow what llama.cpp writes, and the weight
 * scales keep activations bounded so a forward pass gives finite logits.
 * The text it generates is noise; speed and memory behaviour are what it is
 * for.
 *
 * The file is laid out as token_embd, then every layer's tensors together in
 * layer order (each layer one contiguous extent, which is what the pager
 * streams), then output_norm and output, each tensor aligned to 32 bytes.
 * Weights are a pure function of (seed, tensor name, shape, type): each tensor
 * has its own xoshiro256** stream, so --layers does not change the other
 * layers' bytes.
 *
 * Single-threaded: generating the random blocks runs at several GB/s, faster
 * than the page cache takes them, so one thread keeps the disk busy.  Data is
 * written to OUT.tmp and renamed over OUT at the end, so an interrupted or
 * failed run never leaves a truncated model under the real name.
 */
#include "gguf.h"
#include "gguf_buf_i.h"
#include "quant.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "strata-mkmodel writes GGUF's little-endian integers with memcpy"
#endif

#define EXIT_USAGE 1
#define EXIT_FAIL 2

#define ALIGNMENT 32                  /* general.alignment, as real files have */
#define OUT_BUF_SIZE (8u << 20)       /* one write() per 8 MiB */
#define MAX_LAYERS 1024               /* the engine refuses more */
#define MIN_VOCAB 259                 /* 3 specials + 256 byte tokens */
#define MAX_VOCAB (4u << 20)
#define MAX_CTX (16u << 20)
#define MAX_EXPERTS 512               /* the engine's (and the reference's) limit */

/* Every random weight aims at this standard deviation (GPT-2's init): with
 * RMS-normalised inputs a matmul output then has std 0.02 * sqrt(row length),
 * about 1.3 for n_embd 4096, and the residual stream grows only like
 * sqrt(layers). */
#define WEIGHT_STD 0.02

static void __attribute__((format(printf, 1, 2))) msg(const char *fmt, ...)
{
	va_list ap;

	fputs("strata-mkmodel: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- shapes and types ---------------------------------------------------- */

struct shape {
	const char *name;
	uint32_t n_embd, n_layer, n_ff, n_head, n_head_kv, n_vocab, n_ctx;
	float rope_base;
	/* the rest zero for llama: */
	const char *arch;   /* NULL: llama */
	uint32_t head_dim;  /* 0: n_embd / n_head */
	uint32_t n_rot;     /* 0: head_dim */
	bool tied;          /* no output.weight: the embedding serves */
	uint32_t n_swa;     /* attention.sliding_window (gemma) */
	float rope_scale;   /* linear rope scaling factor (gemma3's global layers) */
	/* qwen35's Gated DeltaNet layers: all but every full_attn-th */
	uint32_t full_attn;  /* full_attention_interval; 0: no recurrent layers */
	uint32_t ssm_state;  /* ssm.state_size: head size of its k and v */
	uint32_t ssm_groups; /* ssm.group_count: k heads */
	uint32_t ssm_heads;  /* ssm.time_step_rank: v heads */
	/* qwen3moe's mixture of experts: the FFN is n_expert experts of
	 * n_ff_exp (n_ff is only the header's feed_forward_length) */
	uint32_t n_expert, n_expert_used, n_ff_exp;
};

/*
 * The published configurations these are named after; Llama 3.2's tied
 * embeddings and llama3 RoPE scaling are left out (output is its own tensor),
 * and so are Phi-4-mini's longrope factors (at 4096 tokens of context or
 * fewer, where benchmarks run, the reference uses its short factors, a
 * per-pair constant that costs nothing).  Gemma's vocabularies are the
 * published sizes; the tokens are synthetic like the others'.  Qwen3.5-9B:
 * 32 layers, every fourth full attention (16 heads of 256, 4 KV heads,
 * rotary over a quarter of each head, the output gated), the others Gated
 * DeltaNet (16 k heads and 32 v heads of 128, a 4-wide convolution).
 * Qwen3-30B-A3B: 48 layers of qwen3 attention (32 heads of 128, 4 KV heads)
 * and 128 experts of 768, 8 used per token.
 */
static const struct shape shapes[] = {
	{ "tiny", 256, 4, 768, 8, 2, 4096, 512, 10000.0f, .arch = NULL },
	{ "small", 768, 12, 2048, 12, 4, 32000, 2048, 10000.0f, .arch = NULL },
	{ "llama-1b", 2048, 16, 8192, 32, 8, 128256, 8192, 500000.0f, .arch = NULL },
	{ "llama-3b", 3072, 28, 8192, 24, 8, 128256, 8192, 500000.0f, .arch = NULL },
	{ "llama-7b", 4096, 32, 11008, 32, 32, 32000, 4096, 10000.0f, .arch = NULL },
	{ "llama-8b", 4096, 32, 14336, 32, 8, 128256, 8192, 500000.0f, .arch = NULL },
	{ "qwen3-8b", 4096, 36, 12288, 32, 8, 151936, 40960, 1000000.0f, .arch = "qwen3",
	  .head_dim = 128 },
	{ "gemma2-9b", 3584, 42, 14336, 16, 8, 256000, 8192, 10000.0f, .arch = "gemma2",
	  .head_dim = 256, .tied = true, .n_swa = 4096 },
	{ "gemma3-4b", 2560, 34, 10240, 8, 4, 262208, 131072, 1000000.0f, .arch = "gemma3",
	  .head_dim = 256, .tied = true, .n_swa = 1024, .rope_scale = 8.0f },
	{ "gemma3-12b", 3840, 48, 15360, 16, 8, 262208, 131072, 1000000.0f, .arch = "gemma3",
	  .head_dim = 256, .tied = true, .n_swa = 1024, .rope_scale = 8.0f },
	{ "phi4-mini", 3072, 32, 8192, 24, 8, 200064, 131072, 10000.0f, .arch = "phi3",
	  .head_dim = 128, .n_rot = 96, .tied = true },
	{ "qwen35-9b", 4096, 32, 12288, 16, 4, 248320, 262144, 10000000.0f, .arch = "qwen35",
	  .head_dim = 256, .n_rot = 64, .full_attn = 4, .ssm_state = 128, .ssm_groups = 16,
	  .ssm_heads = 32 },
	{ "qwen3moe-30b-a3b", 2048, 48, 6144, 32, 4, 151936, 40960, 1000000.0f,
	  .arch = "qwen3moe", .head_dim = 128, .n_expert = 128, .n_expert_used = 8,
	  .n_ff_exp = 768 },
};
#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

/* Which tensor gets which type is decided in tensor_type(). */
enum mix { MIX_F16, MIX_Q8_0, MIX_Q4_0, MIX_Q4_K_M, MIX_Q5_K_M, MIX_Q6_K };

struct mixinfo {
	const char *name;
	enum mix mix;
	uint32_t file_type; /* llama.cpp's llama_ftype, for general.file_type */
};

static const struct mixinfo mixes[] = {
	{ "f16", MIX_F16, 1 },
	{ "q8_0", MIX_Q8_0, 7 },
	{ "q4_0", MIX_Q4_0, 2 },
	{ "q4_k_m", MIX_Q4_K_M, 15 },
	{ "q5_k_m", MIX_Q5_K_M, 17 },
	{ "q6_k", MIX_Q6_K, 18 },
};
#define N_MIXES (sizeof(mixes) / sizeof(mixes[0]))

struct typeinfo {
	const char *name;
	uint32_t blck, bytes;
};

static struct typeinfo typeinfo(uint32_t type)
{
	switch (type) {
	case ENG_TYPE_F32:
		return (struct typeinfo){ "F32", 1, 4 };
	case ENG_TYPE_F16:
		return (struct typeinfo){ "F16", 1, 2 };
	case ENG_TYPE_Q4_0:
		return (struct typeinfo){ "Q4_0", ENG_QK4_0, sizeof(struct eng_block_q4_0) };
	case ENG_TYPE_Q8_0:
		return (struct typeinfo){ "Q8_0", ENG_QK8_0, sizeof(struct eng_block_q8_0) };
	case ENG_TYPE_Q4_K:
		return (struct typeinfo){ "Q4_K", ENG_QK_K, sizeof(struct eng_block_q4_k) };
	case ENG_TYPE_Q5_K:
		return (struct typeinfo){ "Q5_K", ENG_QK_K, sizeof(struct eng_block_q5_k) };
	case ENG_TYPE_Q6_K:
		return (struct typeinfo){ "Q6_K", ENG_QK_K, sizeof(struct eng_block_q6_k) };
	}
	return (struct typeinfo){ NULL, 0, 0 };
}

/* llama.cpp's rule for spending more bits on some layers in *_M mixes: the
 * first and last eighth, and every third layer in between. */
static bool use_more_bits(uint32_t i, uint32_t n)
{
	return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* role: "token_embd", "output", or the per-layer name without "blk.N." */
static uint32_t tensor_type(enum mix mix, const char *role, uint32_t layer, uint32_t n_layer)
{
	switch (mix) {
	case MIX_F16:
		return ENG_TYPE_F16;
	case MIX_Q8_0:
		return ENG_TYPE_Q8_0;
	case MIX_Q4_0:
		return ENG_TYPE_Q4_0;
	case MIX_Q6_K:
		return ENG_TYPE_Q6_K;
	case MIX_Q4_K_M:
		if (!strcmp(role, "output"))
			return ENG_TYPE_Q6_K;
		if ((!strcmp(role, "attn_v") || !strcmp(role, "attn_qkv") ||
		     !strcmp(role, "ffn_down") || !strcmp(role, "ffn_down_exps")) &&
		    use_more_bits(layer, n_layer))
			return ENG_TYPE_Q6_K;
		return ENG_TYPE_Q4_K;
	case MIX_Q5_K_M:
		/* llama.cpp's Q5_K_M: Q4_K_M's rule, and a fused QKV always Q6_K */
		if (!strcmp(role, "output") || !strcmp(role, "attn_qkv"))
			return ENG_TYPE_Q6_K;
		if ((!strcmp(role, "attn_v") || !strcmp(role, "ffn_down") ||
		     !strcmp(role, "ffn_down_exps")) &&
		    use_more_bits(layer, n_layer))
			return ENG_TYPE_Q6_K;
		return ENG_TYPE_Q5_K;
	}
	return ENG_TYPE_F32;
}

/* ---- fp16 ---------------------------------------------------------------- */

/* Round-to-nearest-even fp32 -> fp16 without F16C (ggml's portable version):
 * the scales and the F16 table are computed once, so speed does not matter. */
static uint16_t fp32_to_fp16(float f)
{
	float base = (f < 0 ? -f : f) * 0x1.0p+112f * 0x1.0p-110f;
	uint32_t w, shl1_w, sign, bias, bits;

	memcpy(&w, &f, 4);
	shl1_w = w + w;
	sign = w & 0x80000000u;
	bias = shl1_w & 0xFF000000u;
	if (bias < 0x71000000u)
		bias = 0x71000000u;
	bits = (bias >> 1) + 0x07800000u;
	{
		float b;

		memcpy(&b, &bits, 4);
		base = b + base;
	}
	memcpy(&bits, &base, 4);
	bits = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
	return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : bits));
}

/* ---- random numbers ------------------------------------------------------ */

struct rng {
	uint64_t s[4];
	uint64_t bits; /* unused random bits for rng_bit(), nbits of them */
	unsigned nbits;
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static inline uint64_t rng_next(struct rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

/* One stream per tensor, keyed by its name, so a tensor's bytes do not depend
 * on which tensors come before it. */
static void rng_seed(struct rng *r, uint64_t seed, const char *name)
{
	uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
	uint64_t x;

	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * 0x100000001B3ull;
	x = seed ^ splitmix64(&h);
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&x);
	r->nbits = 0;
}

/* The reservoir lives in the per-tensor state, so the bytes do not depend on
 * where the writer's buffer boundaries split a tensor. */
static inline unsigned rng_bit(struct rng *r)
{
	unsigned b;

	if (!r->nbits) {
		r->bits = rng_next(r);
		r->nbits = 64;
	}
	b = r->bits & 1;
	r->bits >>= 1;
	r->nbits--;
	return b;
}

/* ---- block generators ---------------------------------------------------- */

/*
 * The scales below are chosen so every type's weights have std `std` (WEIGHT_STD but
 * for the output projections under --out-gain) with
 * (close to) zero mean.  A nonzero mean is what would make activations blow
 * up: the same bias on every weight of a row turns a matmul into a sum of the
 * inputs, which grows with the row length instead of its square root.
 */
struct scales {
	uint16_t q4_0_d[2], q8_0_d, q4_k_d, q5_k_d, q6_k_d;
	uint16_t f16[1021]; /* Irwin-Hall sum of 4 bytes (0..1020) -> fp16 */
};

static struct scales sc;

static void scales_init(double std)
{
	/* Q4_0: d * (q - 8), q uniform 0..15: E[(q-8)^2] = 21.5.  q - 8 has mean
	 * -0.5, so d gets a random sign per block, as in real files (ggml
	 * stores d = max / -8 with max the signed largest-magnitude value); with
	 * one sign the bias shows: tiny's residual stream grew 8x. */
	sc.q4_0_d[0] = fp32_to_fp16((float)(std / 4.6368));
	sc.q4_0_d[1] = fp32_to_fp16((float)(-std / 4.6368));
	/* Q8_0: d * q, q uniform -128..127: E[q^2] = 5461.5 */
	sc.q8_0_d = fp32_to_fp16((float)(std / 73.902));
	/* Q4_K: d*sc*q - dmin*m with dmin = d, sc = 2k, m = 15k (k 1..4) is
	 * d*2k*(q - 7.5): zero mean, E[4k^2] * E[(q-7.5)^2] = 30 * 21.25 */
	sc.q4_k_d = fp32_to_fp16((float)(std / 25.249));
	/* Q5_K: the same with q 0..31, sc = 2k and m = 31k (k 1..2: m has 6
	 * bits), d*2k*(q - 15.5): E[4k^2] * E[(q-15.5)^2] = 10 * 85.25 */
	sc.q5_k_d = fp32_to_fp16((float)(std / 29.198));
	/* Q6_K: d * s * (q - 32), s uniform -16..15 (E[s^2] = 85.5), q uniform
	 * 0..63 (E[(q-32)^2] = 341.5).  Full-range int8 scales would need d in
	 * fp16's subnormal range. */
	sc.q6_k_d = fp32_to_fp16((float)(std / 170.87));
	/* F16: a sum of 4 uniform bytes has mean 510 and std 147.80: close
	 * enough to a normal distribution for weights nobody reads. */
	for (int u = 0; u <= 1020; u++)
		sc.f16[u] = fp32_to_fp16((float)((u - 510) * (std / 147.80)));
}

static inline void put64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

static void fill_random(struct rng *r, uint8_t *p, size_t n) /* n % 8 == 0 */
{
	for (size_t i = 0; i < n; i += 8)
		put64(p + i, rng_next(r));
}

static void gen_f16(struct rng *r, uint8_t *dst, size_t n)
{
	for (size_t i = 0; i < n; i += 2) {
		uint64_t v = rng_next(r);
		uint16_t h[2];

		for (int k = 0; k < 2; k++, v >>= 32)
			h[k] = sc.f16[(v & 0xFF) + ((v >> 8) & 0xFF) + ((v >> 16) & 0xFF) +
				      ((v >> 24) & 0xFF)];
		memcpy(dst + 2 * i, h, n - i >= 2 ? 4 : 2);
	}
}

static void gen_q4_0(struct rng *r, uint8_t *dst, size_t n)
{
	for (size_t i = 0; i < n; i++, dst += sizeof(struct eng_block_q4_0)) {
		memcpy(dst + offsetof(struct eng_block_q4_0, d), &sc.q4_0_d[rng_bit(r)], 2);
		fill_random(r, dst + offsetof(struct eng_block_q4_0, qs), ENG_QK4_0 / 2);
	}
}

static void gen_q8_0(struct rng *r, uint8_t *dst, size_t n)
{
	for (size_t i = 0; i < n; i++, dst += sizeof(struct eng_block_q8_0)) {
		memcpy(dst + offsetof(struct eng_block_q8_0, d), &sc.q8_0_d, 2);
		fill_random(r, dst + offsetof(struct eng_block_q8_0, qs), ENG_QK8_0);
	}
}

/* The inverse of the engine's (and ggml's) get_scale_min_k4: sub-blocks 0..3
 * keep their 6-bit scale and min in the low bits of bytes 0..7; 4..7 split
 * theirs into a nibble in bytes 8..11 and two high bits on top of 0..7. */
static void pack_scale_min_k4(const uint8_t s[8], const uint8_t m[8], uint8_t q[12])
{
	for (int j = 0; j < 4; j++) {
		q[j] = (uint8_t)((s[j] & 63) | ((s[j + 4] >> 4) << 6));
		q[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
		q[j + 8] = (uint8_t)((s[j + 4] & 15) | ((m[j + 4] & 15) << 4));
	}
}

/* A Q4_K or Q5_K block's eight sub-block scales and mins: scale 2k and min
 * mid * 2k for a random k of 1..levels (levels a power of two), so that
 * d*scale*q - dmin*min with dmin = d has zero mean (scales_init). */
static void gen_scales_mins(struct rng *r, unsigned levels, unsigned mid2, uint8_t q[12])
{
	uint64_t v = rng_next(r);
	uint8_t s[8], m[8];

	for (int j = 0; j < 8; j++, v /= levels) {
		uint8_t k = (uint8_t)(v % levels + 1);

		s[j] = (uint8_t)(2 * k);
		m[j] = (uint8_t)(mid2 * k);
	}
	pack_scale_min_k4(s, m, q);
}

static void gen_q4_k(struct rng *r, uint8_t *dst, size_t n)
{
	for (size_t i = 0; i < n; i++, dst += sizeof(struct eng_block_q4_k)) {
		/* q 0..15: min 7.5 * 2k */
		gen_scales_mins(r, 4, 15, dst + offsetof(struct eng_block_q4_k, scales));
		memcpy(dst + offsetof(struct eng_block_q4_k, d), &sc.q4_k_d, 2);
		memcpy(dst + offsetof(struct eng_block_q4_k, dmin), &sc.q4_k_d, 2);
		fill_random(r, dst + offsetof(struct eng_block_q4_k, qs), ENG_QK_K / 2);
	}
}

static void gen_q5_k(struct rng *r, uint8_t *dst, size_t n)
{
	for (size_t i = 0; i < n; i++, dst += sizeof(struct eng_block_q5_k)) {
		/* q 0..31: min 15.5 * 2k, which fits 6 bits for k <= 2 */
		gen_scales_mins(r, 2, 31, dst + offsetof(struct eng_block_q5_k, scales));
		memcpy(dst + offsetof(struct eng_block_q5_k, d), &sc.q5_k_d, 2);
		memcpy(dst + offsetof(struct eng_block_q5_k, dmin), &sc.q5_k_d, 2);
		fill_random(r, dst + offsetof(struct eng_block_q5_k, qh), ENG_QK_K / 8);
		fill_random(r, dst + offsetof(struct eng_block_q5_k, qs), ENG_QK_K / 2);
	}
}

static void gen_q6_k(struct rng *r, uint8_t *dst, size_t n)
{
	for (size_t i = 0; i < n; i++, dst += sizeof(struct eng_block_q6_k)) {
		uint8_t *s = dst + offsetof(struct eng_block_q6_k, scales);

		fill_random(r, dst + offsetof(struct eng_block_q6_k, ql), ENG_QK_K / 2);
		fill_random(r, dst + offsetof(struct eng_block_q6_k, qh), ENG_QK_K / 4);
		fill_random(r, s, ENG_QK_K / 16);
		for (int j = 0; j < ENG_QK_K / 16; j++)
			s[j] = (uint8_t)(int8_t)((s[j] & 31) - 16);
		memcpy(dst + offsetof(struct eng_block_q6_k, d), &sc.q6_k_d, 2);
	}
}

typedef void (*gen_fn)(struct rng *r, uint8_t *dst, size_t n_blocks);

static gen_fn generator(uint32_t type)
{
	switch (type) {
	case ENG_TYPE_F16:
		return gen_f16;
	case ENG_TYPE_Q4_0:
		return gen_q4_0;
	case ENG_TYPE_Q8_0:
		return gen_q8_0;
	case ENG_TYPE_Q4_K:
		return gen_q4_k;
	case ENG_TYPE_Q5_K:
		return gen_q5_k;
	case ENG_TYPE_Q6_K:
		return gen_q6_k;
	}
	return NULL;
}

/* ---- the vocabulary ------------------------------------------------------ */

#define SPACE "\xE2\x96\x81" /* U+2581, SentencePiece's word-start mark */
#define N_FIXED_TOKENS (3 + 256 + 1 + 94 + 94)

enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_BYTE = 6 };

/*
 * Token id -> text and type.  After the specials, the byte tokens, "▁" and
 * the printable ASCII characters alone and after "▁" come "▁" + 2..8
 * lowercase letters, all two-letter words first, then three-letter ones and
 * so on; within a length, index k maps to k * 7919 mod 26^len (a bijection,
 * as 7919 is prime to 26), which spreads the words over the alphabet while
 * keeping them unique.  Because every shorter word-start prefix exists, the
 * merges that build a word are reachable, as in a trained vocabulary.
 */
static uint32_t vocab_piece(uint64_t id, char buf[32], size_t *len)
{
	static const char *const special[3] = { "<unk>", "<s>", "</s>" };
	uint64_t g, count = 26 * 26, p;
	int l = 2;

	if (id < 3) {
		*len = strlen(special[id]);
		memcpy(buf, special[id], *len);
		return id == 0 ? TOK_UNKNOWN : TOK_CONTROL;
	}
	if (id < 259) {
		*len = (size_t)snprintf(buf, 32, "<0x%02X>", (unsigned)(id - 3));
		return TOK_BYTE;
	}
	if (id == 259) {
		*len = 3;
		memcpy(buf, SPACE, 3);
		return TOK_NORMAL;
	}
	if (id < 260 + 94) {
		buf[0] = (char)(0x21 + id - 260);
		*len = 1;
		return TOK_NORMAL;
	}
	if (id < N_FIXED_TOKENS) {
		memcpy(buf, SPACE, 3);
		buf[3] = (char)(0x21 + id - 354);
		*len = 4;
		return TOK_NORMAL;
	}
	g = id - N_FIXED_TOKENS;
	while (g >= count && l < 8) {
		g -= count;
		count *= 26;
		l++;
	}
	/* MAX_VOCAB is far below the 26^2 + ... + 26^8 words there are */
	p = (g * 7919 + 12345) % count;
	memcpy(buf, SPACE, 3);
	for (int i = l - 1; i >= 0; i--, p /= 26)
		buf[3 + i] = (char)('a' + p % 26);
	*len = 3 + (size_t)l;
	return TOK_NORMAL;
}

/* ---- the header ---------------------------------------------------------- */

static void kv_key(struct buf *b, uint32_t *n_kv, const char *key, enum gguf_vtype t)
{
	put_str(b, key, strlen(key));
	put_u32(b, t);
	(*n_kv)++;
}

static void kv_u32(struct buf *b, uint32_t *n_kv, const char *key, uint32_t v)
{
	kv_key(b, n_kv, key, GGUF_VT_U32);
	put_u32(b, v);
}

static void kv_f32(struct buf *b, uint32_t *n_kv, const char *key, float v)
{
	kv_key(b, n_kv, key, GGUF_VT_F32);
	buf_put(b, &v, 4);
}

static void kv_bool(struct buf *b, uint32_t *n_kv, const char *key, bool v)
{
	uint8_t u = v;

	kv_key(b, n_kv, key, GGUF_VT_BOOL);
	buf_put(b, &u, 1);
}

static void kv_str(struct buf *b, uint32_t *n_kv, const char *key, const char *v)
{
	kv_key(b, n_kv, key, GGUF_VT_STRING);
	put_str(b, v, strlen(v));
}

static void kv_arr(struct buf *b, uint32_t *n_kv, const char *key, enum gguf_vtype t,
		   uint64_t n)
{
	kv_key(b, n_kv, key, GGUF_VT_ARRAY);
	put_u32(b, t);
	put_u64(b, n);
}

/* ---- the model plan ------------------------------------------------------ */

struct tensor {
	char name[48];
	uint32_t n_dims;
	uint64_t ne0, ne1; /* ne1 is 1 for the 1-D norms */
	uint64_t ne2;      /* experts of a 3-D tensor; 1 for the rest */
	uint32_t type;
	int32_t layer;   /* -1 outside the layers */
	bool out_proj;   /* attn_output, ffn_down, ssm_out: what a layer adds to the residual */
	float fill;      /* an F32 tensor's every value (1 for norms) */
	bool router;     /* F32 random rows instead (a mixture's ffn_gate_inp) */
	uint64_t offset; /* from the start of the data section */
	uint64_t size;
};

/* Everything about the file except the weight bytes, computed up front: the
 * writer and --list share it, so the sizes --list prints are exact. */
struct plan {
	struct shape sh;
	const struct mixinfo *mix;
	uint32_t head_dim;
	struct tensor *t;
	size_t n_t;
	uint64_t n_params;
	uint64_t data_size;
	double router_skew; /* ffn_gate_inp row e scaled by exp(-skew * e / n_expert) */
	struct buf head; /* header, KVs and tensor infos, padded to ALIGNMENT */
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

static void plan_destroy(struct plan *p)
{
	free(p->t);
	free(p->head.p);
	memset(p, 0, sizeof(*p));
}

/*
 * A tensor's role is its name without "blk.N." and without ".weight" (a role
 * with a '.' of its own, or ssm_a, is the whole rest of the name, as
 * llama.cpp names them).  ne1 0: a 1-D F32 tensor (norms, biases); f32: a
 * 2-D one (the DeltaNet's convolution); both filled with `fill`.
 */
static int add_tensor3(struct plan *p, const char *role, int32_t layer, uint64_t ne0,
		       uint64_t ne1, uint64_t ne2, bool f32, float fill, bool router)
{
	struct tensor *t = &p->t[p->n_t++];
	bool whole = strchr(role, '.') || !strcmp(role, "ssm_a");
	bool is_1d = ne1 == 0;
	struct typeinfo ti;
	int n;

	/* (two steps, not one "%s%s" with a chosen suffix: gcc's sanitized -O3
	 * build took the suffix for a null argument) */
	if (layer >= 0)
		n = snprintf(t->name, sizeof(t->name), "blk.%d.%s", (int)layer, role);
	else
		n = snprintf(t->name, sizeof(t->name), "%s", role);
	if (!whole && n >= 0 && (size_t)n < sizeof(t->name))
		snprintf(t->name + n, sizeof(t->name) - (size_t)n, ".weight");
	t->layer = layer;
	t->out_proj = layer >= 0 && (!strcmp(role, "attn_output") || !strcmp(role, "ffn_down") ||
				     !strcmp(role, "ssm_out"));
	t->fill = fill;
	t->router = router;
	t->ne0 = ne0;
	t->ne1 = is_1d ? 1 : ne1;
	t->ne2 = ne2;
	t->n_dims = is_1d ? 1 : ne2 > 1 ? 3 : 2;
	t->type = is_1d || f32 ? ENG_TYPE_F32
			       : tensor_type(p->mix->mix, role, layer < 0 ? 0 : (uint32_t)layer,
					     p->sh.n_layer);
	ti = typeinfo(t->type);
	if (ne0 % ti.blck) {
		msg("%s: row length %" PRIu64 " is not a multiple of %s's block size %u", t->name,
		    ne0, ti.name, ti.blck);
		return -EINVAL;
	}
	t->size = ne0 / ti.blck * ti.bytes * t->ne1 * ne2;
	t->offset = align_up(p->data_size, ALIGNMENT);
	p->data_size = t->offset + t->size;
	p->n_params += ne0 * t->ne1 * ne2;
	return 0;
}

static int add_tensor(struct plan *p, const char *role, int32_t layer, uint64_t ne0,
		      uint64_t ne1, bool f32, float fill)
{
	return add_tensor3(p, role, layer, ne0, ne1, 1, f32, fill, false);
}

static bool is_arch(const struct shape *s, const char *a)
{
	return s->arch && !strcmp(s->arch, a);
}

/* Per layer, in the order llama.cpp's converter writes them, with what each
 * architecture adds (the engine's arch.c lists the same differences). */
static int plan_tensors(struct plan *p)
{
	const struct shape *s = &p->sh;
	uint64_t q_dim = (uint64_t)s->n_head * p->head_dim;
	uint64_t kv_dim = (uint64_t)s->n_head_kv * p->head_dim;
	bool qk_norm = is_arch(s, "qwen3") || is_arch(s, "gemma3") || is_arch(s, "qwen35") ||
		       is_arch(s, "qwen3moe");
	bool moe = s->n_expert > 0;
	bool post_norms = is_arch(s, "gemma2") || is_arch(s, "gemma3");
	bool fused = is_arch(s, "phi3");
	bool gated_q = is_arch(s, "qwen35");
	uint64_t ssm_key = (uint64_t)s->ssm_groups * s->ssm_state;
	uint64_t ssm_inner = (uint64_t)s->ssm_heads * s->ssm_state;
	uint64_t conv_dim = 2 * ssm_key + ssm_inner;
	int rc;

	p->t = calloc((size_t)s->n_layer * 16 + 3, sizeof(*p->t));
	if (!p->t) {
		msg("out of memory");
		return -ENOMEM;
	}
	if ((rc = add_tensor(p, "token_embd", -1, s->n_embd, s->n_vocab, false, 0)))
		return rc;
	for (uint32_t i = 0; i < s->n_layer; i++) {
		/* a hybrid's recurrent layer: a Gated DeltaNet in place of attention */
		bool rec = s->full_attn && (i + 1) % s->full_attn != 0, att = !rec;
		/* [ne0, ne1] as GGUF stores them: ne0 is the input (row) length;
		 * ne1 0 for a 1-D tensor; absent roles skipped.  F32 tensors hold
		 * `fill`: 1 (norms, the DeltaNet's dt bias and convolution), and
		 * -1 for its A (a decay: exp(g * A) must stay below 1). */
		const struct {
			const char *role;
			bool present;
			uint64_t ne0, ne1;
			bool f32;
			float fill;
		} l[] = {
			{ "attn_norm", true, s->n_embd, 0, true, 1 },
			{ "attn_qkv", att && fused, s->n_embd, q_dim + 2 * kv_dim, false, 0 },
			{ "attn_q", att && !fused, s->n_embd, (gated_q ? 2 : 1) * q_dim, false, 0 },
			{ "attn_k", att && !fused, s->n_embd, kv_dim, false, 0 },
			{ "attn_v", att && !fused, s->n_embd, kv_dim, false, 0 },
			{ "attn_q_norm", att && qk_norm, p->head_dim, 0, true, 1 },
			{ "attn_k_norm", att && qk_norm, p->head_dim, 0, true, 1 },
			{ "attn_output", att, q_dim, s->n_embd, false, 0 },
			{ "attn_qkv", rec, s->n_embd, conv_dim, false, 0 },
			{ "attn_gate", rec, s->n_embd, ssm_inner, false, 0 },
			{ "ssm_conv1d", rec, 4, conv_dim, true, 1 },
			{ "ssm_dt.bias", rec, s->ssm_heads, 0, true, 1 },
			{ "ssm_a", rec, s->ssm_heads, 0, true, -1 },
			{ "ssm_beta", rec, s->n_embd, s->ssm_heads, false, 0 },
			{ "ssm_alpha", rec, s->n_embd, s->ssm_heads, false, 0 },
			{ "ssm_norm", rec, s->ssm_state, 0, true, 1 },
			{ "ssm_out", rec, ssm_inner, s->n_embd, false, 0 },
			{ "post_attention_norm", post_norms || gated_q, s->n_embd, 0, true, 1 },
			{ "ffn_norm", !gated_q, s->n_embd, 0, true, 1 },
			{ "ffn_gate", !fused && !moe, s->n_embd, s->n_ff, false, 0 },
			{ "ffn_up", !moe, s->n_embd, (fused ? 2 : 1) * (uint64_t)s->n_ff, false, 0 },
			{ "ffn_down", !moe, s->n_ff, s->n_embd, false, 0 },
			{ "post_ffw_norm", post_norms, s->n_embd, 0, true, 1 },
		};

		for (size_t j = 0; j < sizeof(l) / sizeof(l[0]); j++)
			if (l[j].present && (rc = add_tensor(p, l[j].role, (int32_t)i, l[j].ne0,
							     l[j].ne1, l[j].f32, l[j].fill)))
				return rc;
		/* the router (F32, random rows), then the experts, each 3-D
		 * tensor their matrices one after the other */
		if (moe &&
		    ((rc = add_tensor3(p, "ffn_gate_inp", (int32_t)i, s->n_embd, s->n_expert, 1, true,
				       0, true)) ||
		     (rc = add_tensor3(p, "ffn_gate_exps", (int32_t)i, s->n_embd, s->n_ff_exp,
				       s->n_expert, false, 0, false)) ||
		     (rc = add_tensor3(p, "ffn_up_exps", (int32_t)i, s->n_embd, s->n_ff_exp,
				       s->n_expert, false, 0, false)) ||
		     (rc = add_tensor3(p, "ffn_down_exps", (int32_t)i, s->n_ff_exp, s->n_embd,
				       s->n_expert, false, 0, false))))
			return rc;
	}
	if ((rc = add_tensor(p, "output_norm", -1, s->n_embd, 0, true, 1)) ||
	    (!s->tied && (rc = add_tensor(p, "output", -1, s->n_embd, s->n_vocab, false, 0))))
		return rc;
	return 0;
}

static int plan_header(struct plan *p)
{
	const struct shape *s = &p->sh;
	struct buf *b = &p->head;
	uint32_t n_kv = 0;
	size_t n_kv_at;
	char name[96], piece[32], key[96];
	const char *a = s->arch ? s->arch : "llama";
	size_t len;
	uint8_t zero[ALIGNMENT] = { 0 };

	put_u32(b, GGUF_MAGIC);
	put_u32(b, 3);
	put_u64(b, p->n_t);
	n_kv_at = b->len;
	put_u64(b, 0); /* patched below */

	snprintf(name, sizeof(name), "strata-synthetic-%s-%s", s->name, p->mix->name);
	kv_str(b, &n_kv, "general.architecture", a);
	kv_str(b, &n_kv, "general.name", name);
	kv_u32(b, &n_kv, "general.file_type", p->mix->file_type);
	kv_u32(b, &n_kv, "general.quantization_version", 2);
	kv_u32(b, &n_kv, "general.alignment", ALIGNMENT);
#define K(suffix) (snprintf(key, sizeof(key), "%s." suffix, a), key)
	kv_u32(b, &n_kv, K("context_length"), s->n_ctx);
	kv_u32(b, &n_kv, K("embedding_length"), s->n_embd);
	kv_u32(b, &n_kv, K("block_count"), s->n_layer);
	kv_u32(b, &n_kv, K("feed_forward_length"), s->n_ff);
	kv_u32(b, &n_kv, K("attention.head_count"), s->n_head);
	kv_u32(b, &n_kv, K("attention.head_count_kv"), s->n_head_kv);
	if (s->head_dim) {
		kv_u32(b, &n_kv, K("attention.key_length"), s->head_dim);
		kv_u32(b, &n_kv, K("attention.value_length"), s->head_dim);
	}
	kv_f32(b, &n_kv, K("rope.freq_base"), s->rope_base);
	kv_u32(b, &n_kv, K("rope.dimension_count"), s->n_rot ? s->n_rot : p->head_dim);
	kv_f32(b, &n_kv, K("attention.layer_norm_rms_epsilon"), s->arch ? 1e-6f : 1e-5f);
	kv_u32(b, &n_kv, K("vocab_size"), s->n_vocab);
	if (s->n_swa)
		kv_u32(b, &n_kv, K("attention.sliding_window"), s->n_swa);
	if (is_arch(s, "gemma2")) {
		kv_f32(b, &n_kv, K("attn_logit_softcapping"), 50.0f);
		kv_f32(b, &n_kv, K("final_logit_softcapping"), 30.0f);
	}
	if (s->rope_scale > 0) {
		kv_str(b, &n_kv, K("rope.scaling.type"), "linear");
		kv_f32(b, &n_kv, K("rope.scaling.factor"), s->rope_scale);
	}
	if (s->full_attn) {
		kv_u32(b, &n_kv, K("ssm.conv_kernel"), 4);
		kv_u32(b, &n_kv, K("ssm.state_size"), s->ssm_state);
		kv_u32(b, &n_kv, K("ssm.group_count"), s->ssm_groups);
		kv_u32(b, &n_kv, K("ssm.time_step_rank"), s->ssm_heads);
		kv_u32(b, &n_kv, K("ssm.inner_size"), s->ssm_heads * s->ssm_state);
		kv_u32(b, &n_kv, K("full_attention_interval"), s->full_attn);
		/* The reference requires its multi-section RoPE's split of the
		 * rotated pairs (Qwen3.5's is 11/11/10 of 32).  For text every
		 * section turns at the token's position, so only the sum counts. */
		uint32_t half = (s->n_rot ? s->n_rot : p->head_dim) / 2, sec = (half * 11 + 16) / 32;

		kv_arr(b, &n_kv, K("rope.dimension_sections"), GGUF_VT_I32, 4);
		put_u32(b, sec);
		put_u32(b, sec);
		put_u32(b, half - 2 * sec);
		put_u32(b, 0);
	}
	if (s->n_expert) {
		kv_u32(b, &n_kv, K("expert_count"), s->n_expert);
		kv_u32(b, &n_kv, K("expert_used_count"), s->n_expert_used);
		kv_u32(b, &n_kv, K("expert_feed_forward_length"), s->n_ff_exp);
	}
#undef K

	kv_str(b, &n_kv, "tokenizer.ggml.model", "llama");
	kv_str(b, &n_kv, "tokenizer.ggml.pre", "default");
	kv_arr(b, &n_kv, "tokenizer.ggml.tokens", GGUF_VT_STRING, s->n_vocab);
	for (uint32_t i = 0; i < s->n_vocab; i++) {
		vocab_piece(i, piece, &len);
		put_str(b, piece, len);
	}
	/* Earlier (shorter) tokens score higher, so merges prefer them. */
	kv_arr(b, &n_kv, "tokenizer.ggml.scores", GGUF_VT_F32, s->n_vocab);
	for (uint32_t i = 0; i < s->n_vocab; i++) {
		float score = -(float)i;

		buf_put(b, &score, 4);
	}
	kv_arr(b, &n_kv, "tokenizer.ggml.token_type", GGUF_VT_I32, s->n_vocab);
	for (uint32_t i = 0; i < s->n_vocab; i++)
		put_u32(b, vocab_piece(i, piece, &len));
	kv_u32(b, &n_kv, "tokenizer.ggml.bos_token_id", 1);
	kv_u32(b, &n_kv, "tokenizer.ggml.eos_token_id", 2);
	kv_u32(b, &n_kv, "tokenizer.ggml.unknown_token_id", 0);
	kv_bool(b, &n_kv, "tokenizer.ggml.add_bos_token", true);
	kv_bool(b, &n_kv, "tokenizer.ggml.add_eos_token", false);

	for (size_t i = 0; i < p->n_t; i++) {
		const struct tensor *t = &p->t[i];

		put_str(b, t->name, strlen(t->name));
		put_u32(b, t->n_dims);
		put_u64(b, t->ne0);
		if (t->n_dims >= 2)
			put_u64(b, t->ne1);
		if (t->n_dims == 3)
			put_u64(b, t->ne2);
		put_u32(b, t->type);
		put_u64(b, t->offset);
	}
	buf_put(b, zero, align_up(b->len, ALIGNMENT) - b->len);
	if (b->oom) {
		msg("out of memory");
		return -ENOMEM;
	}
	memcpy(b->p + n_kv_at, &(uint64_t){ n_kv }, 8);
	return 0;
}

/* Checks the dimensions the engine would refuse, then plans the whole file. */
static int plan_create(struct plan *p, const struct shape *s, const struct mixinfo *mix,
		       double router_skew)
{
	int rc;

	memset(p, 0, sizeof(*p));
	p->sh = *s;
	p->mix = mix;
	p->router_skew = router_skew;
	if (s->n_head == 0 || (!s->head_dim && s->n_embd % s->n_head) ||
	    (s->head_dim ? s->head_dim : s->n_embd / s->n_head) % 2 || s->n_head_kv == 0 ||
	    s->n_head % s->n_head_kv) {
		msg("shape %s: heads %u/%u do not divide n_embd %u into even head sizes", s->name,
		    s->n_head, s->n_head_kv, s->n_embd);
		return -EINVAL;
	}
	p->head_dim = s->head_dim ? s->head_dim : s->n_embd / s->n_head;
	rc = plan_tensors(p);
	if (!rc)
		rc = plan_header(p);
	if (rc)
		plan_destroy(p);
	return rc;
}

static uint64_t plan_file_size(const struct plan *p)
{
	return p->head.len + p->data_size;
}

/* ---- writing ------------------------------------------------------------- */

struct out {
	int fd;
	const char *path;
	uint8_t *buf;
	size_t pos;
	uint64_t written;
};

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int out_flush(struct out *o)
{
	int rc = write_all(o->fd, o->buf, o->pos);

	if (rc) {
		msg("writing %s: %s", o->path, strerror(-rc));
		return rc;
	}
	o->written += o->pos;
	o->pos = 0;
	return 0;
}

static int out_put(struct out *o, const void *src, size_t n)
{
	while (n) {
		size_t k = OUT_BUF_SIZE - o->pos;
		int rc;

		if (k > n)
			k = n;
		memcpy(o->buf + o->pos, src, k);
		o->pos += k;
		src = (const uint8_t *)src + k;
		n -= k;
		if (o->pos == OUT_BUF_SIZE && (rc = out_flush(o)))
			return rc;
	}
	return 0;
}

/* A router's rows: F32 of std WEIGHT_STD (the same Irwin-Hall sum as
 * F16's), row e scaled by exp(-skew * e / rows).  A row of larger scale
 * gives logits of larger spread, which reach the top k more often: the
 * first experts are preferred, the more the larger the skew. */
static int out_router(struct out *o, const struct tensor *t, struct rng *r, double skew)
{
	for (uint64_t e = 0; e < t->ne1; e++) {
		double std = WEIGHT_STD * exp(-skew * (double)e / (double)t->ne1) / 147.80;

		for (uint64_t i = 0; i < t->ne0; i++) {
			uint64_t v = rng_next(r);
			float f = (float)((double)((v & 0xFF) + ((v >> 8) & 0xFF) +
						   ((v >> 16) & 0xFF) + ((v >> 24) & 0xFF)) -
					  510.0) *
				  (float)std;
			int rc = out_put(o, &f, 4);

			if (rc)
				return rc;
		}
	}
	return 0;
}

static int out_tensor(struct out *o, const struct tensor *t, uint64_t seed, double out_gain,
		      double router_skew)
{
	static const uint8_t zero[ALIGNMENT];
	struct typeinfo ti = typeinfo(t->type);
	gen_fn gen = generator(t->type);
	uint64_t n = t->size / ti.bytes;
	struct rng r;
	int rc;

	/* o->written + o->pos is the position relative to the data section */
	if ((rc = out_put(o, zero, t->offset - (o->written + o->pos))))
		return rc;
	rng_seed(&r, seed, t->name);
	scales_init(t->out_proj ? WEIGHT_STD * out_gain : WEIGHT_STD);
	if (t->router)
		return out_router(o, t, &r, router_skew);
	if (t->type == ENG_TYPE_F32) {
		for (uint64_t i = 0; i < n; i++)
			if ((rc = out_put(o, &t->fill, 4)))
				return rc;
		return 0;
	}
	while (n) {
		/* F16 is generated two elements at a time: keep batches even */
		size_t room = (OUT_BUF_SIZE - o->pos) / ti.bytes & ~(size_t)1;

		if (room == 0) {
			if ((rc = out_flush(o)))
				return rc;
			continue;
		}
		if (room > n)
			room = (size_t)n;
		gen(&r, o->buf + o->pos, room);
		o->pos += room * ti.bytes;
		n -= room;
	}
	return 0;
}

/* The temp file's name, for the signal handler: removing it is all an
 * interrupted run has to undo. */
static char *volatile tmp_path;

static void on_signal(int sig)
{
	if (tmp_path)
		unlink(tmp_path);
	signal(sig, SIG_DFL);
	raise(sig);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int write_model(const struct plan *p, const char *path, uint64_t seed, double out_gain)
{
	struct out o = { .fd = -1, .path = NULL };
	struct sigaction sa = { .sa_handler = on_signal };
	uint64_t layers_bytes = 0;
	double t0 = now();
	char *tmp = malloc(strlen(path) + 5);
	int rc;

	o.buf = malloc(OUT_BUF_SIZE);
	if (!tmp || !o.buf) {
		msg("out of memory");
		rc = -ENOMEM;
		goto err_free;
	}
	sprintf(tmp, "%s.tmp", path);
	o.path = tmp;
	tmp_path = tmp;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);

	o.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (o.fd < 0) {
		rc = -errno;
		msg("cannot create %s: %s", tmp, strerror(errno));
		goto err_free;
	}
	/* Reserving the space up front fails early on a full disk instead of
	 * after gigabytes; filesystems that cannot (EOPNOTSUPP) just skip it. */
	if (fallocate(o.fd, 0, 0, (off_t)plan_file_size(p)) && errno == ENOSPC) {
		rc = -ENOSPC;
		msg("writing %s: %s (the model needs %.1f MiB)", tmp, strerror(ENOSPC),
		    (double)plan_file_size(p) / (1 << 20));
		goto err_unlink;
	}

	if ((rc = write_all(o.fd, p->head.p, p->head.len))) {
		msg("writing %s: %s", tmp, strerror(-rc));
		goto err_unlink;
	}
	for (size_t i = 0; i < p->n_t; i++)
		if ((rc = out_tensor(&o, &p->t[i], seed, out_gain, p->router_skew)))
			goto err_unlink;
	if ((rc = out_flush(&o)))
		goto err_unlink;
	/* fallocate may have reserved more than was written if a size was
	 * miscounted; the reader would then see trailing bytes. */
	if (o.written != p->data_size) {
		msg("internal error: wrote %" PRIu64 " data bytes, planned %" PRIu64, o.written,
		    p->data_size);
		rc = -EIO;
		goto err_unlink;
	}
	/* No fsync: the file is regenerated from the seed in seconds, and an fsync
	 * of gigabytes would dominate the run time.  close() still reports
	 * delayed write errors on some filesystems (NFS). */
	rc = close(o.fd);
	o.fd = -1;
	if (rc) {
		rc = -errno;
		msg("writing %s: %s", tmp, strerror(errno));
		goto err_unlink;
	}
	if (rename(tmp, path)) {
		rc = -errno;
		msg("cannot rename %s to %s: %s", tmp, path, strerror(errno));
		goto err_unlink;
	}
	tmp_path = NULL;

	for (size_t i = 0; i < p->n_t; i++)
		if (p->t[i].layer >= 0)
			layers_bytes += p->t[i].size;
	msg("wrote %s (%.1f MiB, %u layers of ~%.1f MiB) in %.2f s", path,
	    (double)plan_file_size(p) / (1 << 20), p->sh.n_layer,
	    (double)layers_bytes / p->sh.n_layer / (1 << 20), now() - t0);
	free(o.buf);
	free(tmp);
	return 0;

err_unlink:
	if (o.fd >= 0)
		close(o.fd);
	unlink(tmp);
err_free:
	tmp_path = NULL;
	free(o.buf);
	free(tmp);
	return rc;
}

/* ---- the command line ---------------------------------------------------- */

static const char usage_text[] =
	"usage: strata-mkmodel --shape NAME --type TYPE -o OUT.gguf [--seed S]\n"
	"                      [--layers N] [--vocab N] [--ctx N] [--out-gain G]\n"
	"                      [--router-skew S] [--experts N]\n"
	"       strata-mkmodel --list [--shape NAME] [--layers N] [--vocab N] [--ctx N]\n"
	"\n"
	"Writes a GGUF v3 llama model of a real shape with random weights, for\n"
	"benchmarks.  Shapes: tiny, small, llama-1b, ... qwen3moe-30b-a3b\n"
	"(--list shows them).  Types: f16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k.\n"
	"--layers, --vocab and --ctx override the shape's values; the seed\n"
	"(default 1) makes the file reproducible.  --out-gain G scales every\n"
	"layer's output projections (attn_output, ffn_down) by G: a small G makes\n"
	"layers that barely change the residual stream, so a one-layer model of\n"
	"the same seed and gain (--layers 1) guesses its tokens well -- a\n"
	"target/draft pair for speculative decoding whose acceptance G sets.\n"
	"--router-skew S (mixture-of-experts shapes) scales router row e by\n"
	"exp(-S e / experts), so the first experts are picked more often; random\n"
	"routers (S 0) do not route as trained ones do (docs/mkmodel.md).\n"
	"--experts N overrides a mixture's expert count (at least the number used).\n"
	"\n"
	"Exit status: 0 ok, 1 usage error, 2 the model could not be written.\n";

static int usage(const char *why)
{
	if (why)
		msg("%s", why);
	fputs(usage_text, stderr);
	return EXIT_USAGE;
}

static bool parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!*s || *s == '-' || *s == '+' || *s == ' ')
		return false;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end || v < min || v > max)
		return false;
	*out = v;
	return true;
}

static void print_count(char *buf, size_t n, uint64_t v)
{
	if (v >= 1000000000ull)
		snprintf(buf, n, "%.2fB", (double)v / 1e9);
	else
		snprintf(buf, n, "%.1fM", (double)v / 1e6);
}

static int list_shapes(const struct shape *only, const struct shape *ov)
{
	printf("%-10s %6s %6s %6s %5s %5s %7s %6s %8s %7s", "shape", "n_embd", "layers", "n_ff",
	       "heads", "kv", "vocab", "ctx", "rope", "params");
	for (size_t j = 0; j < N_MIXES; j++)
		printf(" %9s", mixes[j].name);
	printf("   (MiB)\n");
	for (size_t i = 0; i < N_SHAPES; i++) {
		struct shape s = shapes[i];
		char params[16];

		if (only && strcmp(only->name, s.name))
			continue;
		if (ov->n_layer)
			s.n_layer = ov->n_layer;
		if (ov->n_vocab)
			s.n_vocab = ov->n_vocab;
		if (ov->n_ctx)
			s.n_ctx = ov->n_ctx;
		if (ov->n_expert && s.n_expert)
			s.n_expert = ov->n_expert;
		for (size_t j = 0; j < N_MIXES; j++) {
			struct plan p;

			if (plan_create(&p, &s, &mixes[j], 0))
				return EXIT_FAIL;
			if (j == 0) {
				print_count(params, sizeof(params), p.n_params);
				printf("%-10s %6u %6u %6u %5u %5u %7u %6u %8g %7s", s.name, s.n_embd,
				       s.n_layer, s.n_ff, s.n_head, s.n_head_kv, s.n_vocab, s.n_ctx,
				       (double)s.rope_base, params);
			}
			printf(" %9.1f", (double)plan_file_size(&p) / (1 << 20));
			plan_destroy(&p);
		}
		printf("\n");
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "shape", required_argument, NULL, 's' },
		{ "type", required_argument, NULL, 't' },
		{ "output", required_argument, NULL, 'o' },
		{ "seed", required_argument, NULL, 'S' },
		{ "layers", required_argument, NULL, 'L' },
		{ "vocab", required_argument, NULL, 'V' },
		{ "ctx", required_argument, NULL, 'C' },
		{ "out-gain", required_argument, NULL, 'G' },
		{ "router-skew", required_argument, NULL, 'R' },
		{ "experts", required_argument, NULL, 'E' },
		{ "list", no_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const struct shape *shape = NULL;
	const struct mixinfo *mix = NULL;
	struct shape ov = { 0 }, s;
	const char *out = NULL;
	uint64_t seed = 1, v;
	double out_gain = 1.0, router_skew = 0;
	bool list = false;
	struct plan p;
	int c, rc;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":s:t:o:h", opts, NULL)) != -1) {
		char why[160];

		switch (c) {
		case 's':
			shape = NULL;
			for (size_t i = 0; i < N_SHAPES; i++)
				if (!strcmp(optarg, shapes[i].name))
					shape = &shapes[i];
			if (!shape) {
				snprintf(why, sizeof(why), "unknown shape '%.40s' (see --list)",
					 optarg);
				return usage(why);
			}
			break;
		case 't':
			mix = NULL;
			for (size_t i = 0; i < N_MIXES; i++)
				if (!strcmp(optarg, mixes[i].name))
					mix = &mixes[i];
			if (!mix) {
				snprintf(why, sizeof(why),
					 "unknown type '%.40s' (f16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k)",
					 optarg);
				return usage(why);
			}
			break;
		case 'o':
			out = optarg;
			break;
		case 'S':
			if (!parse_u64(optarg, 0, UINT64_MAX, &seed))
				return usage("--seed needs an unsigned 64-bit integer");
			break;
		case 'L':
			if (!parse_u64(optarg, 1, MAX_LAYERS, &v))
				return usage("--layers needs a number from 1 to 1024");
			ov.n_layer = (uint32_t)v;
			break;
		case 'V':
			if (!parse_u64(optarg, MIN_VOCAB, MAX_VOCAB, &v)) {
				snprintf(why, sizeof(why), "--vocab needs a number from %u to %u",
					 MIN_VOCAB, MAX_VOCAB);
				return usage(why);
			}
			ov.n_vocab = (uint32_t)v;
			break;
		case 'C':
			if (!parse_u64(optarg, 1, MAX_CTX, &v)) {
				snprintf(why, sizeof(why), "--ctx needs a number from 1 to %u",
					 MAX_CTX);
				return usage(why);
			}
			ov.n_ctx = (uint32_t)v;
			break;
		case 'G': {
			char *end;

			out_gain = strtod(optarg, &end);
			if (end == optarg || *end || !(out_gain >= 0 && out_gain <= 100))
				return usage("--out-gain needs a number from 0 to 100");
			break;
		}
		case 'E':
			if (!parse_u64(optarg, 1, MAX_EXPERTS, &v))
				return usage("--experts needs a number from 1 to 512");
			ov.n_expert = (uint32_t)v;
			break;
		case 'R': {
			char *end;

			router_skew = strtod(optarg, &end);
			if (end == optarg || *end || !(router_skew >= 0 && router_skew <= 50))
				return usage("--router-skew needs a number from 0 to 50");
			break;
		}
		case 'l':
			list = true;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		case ':':
			snprintf(why, sizeof(why), "option '%s' needs a value", argv[optind - 1]);
			return usage(why);
		default:
			snprintf(why, sizeof(why), "unknown option '%.40s'", argv[optind - 1]);
			return usage(why);
		}
	}
	if (optind < argc)
		return usage("unexpected argument");
	scales_init(WEIGHT_STD);
	if (list) {
		if (out || mix)
			return usage("--list takes no -o or --type");
		return list_shapes(shape, &ov);
	}
	if (!shape || !mix || !out)
		return usage("--shape, --type and -o are required");
	if ((router_skew > 0 || ov.n_expert) && !shape->n_expert)
		return usage("--router-skew and --experts are for a mixture-of-experts shape");
	if (ov.n_expert && ov.n_expert < shape->n_expert_used) {
		char why[96];

		snprintf(why, sizeof(why), "--experts %u is fewer than the %u a token uses",
			 ov.n_expert, shape->n_expert_used);
		return usage(why);
	}

	s = *shape;
	if (ov.n_layer)
		s.n_layer = ov.n_layer;
	if (ov.n_vocab)
		s.n_vocab = ov.n_vocab;
	if (ov.n_ctx)
		s.n_ctx = ov.n_ctx;
	if (ov.n_expert)
		s.n_expert = ov.n_expert;
	if (plan_create(&p, &s, mix, router_skew))
		return EXIT_FAIL;
	rc = write_model(&p, out, seed, out_gain);
	plan_destroy(&p);
	return rc ? EXIT_FAIL : 0;
}
