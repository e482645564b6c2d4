/*
 * test_share.c - a draft sharing the model's weights (eng_model_share)
 * computes what an unshared copy computes, bit for bit, and holds only what
 * it does not share (eng_model_own_bytes).
 *
 * For fixture models of every shape of binding (tied output, fused q|k|v and
 * gate|up bound as runs of rows, a mixture's experts, a hybrid's recurrent
 * layers): the model as the target, from its file's mapping; drafts loaded
 * from a copy of the file in memory, which holds the same bytes at other
 * addresses:
 *
 *   head    shared without ENG_SHARE_LAYERS: every tensor outside the
 *           layers is the target's; it holds the layers' bytes only
 *   all     shared with it: it holds nothing of its own
 *   changed a copy whose output matrix differs from the target's in its
 *           last byte alone: that tensor is not shared (the bytes are
 *           compared whole), the rest is
 *
 * Each computes logits bit-identical to an unshared model loaded from its
 * own image, over a prompt and tokens one at a time.  Sharing twice fails
 * with -EALREADY.
 */
#include "engine.h"
#include "fixture.h"
#include "gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPT 5
#define N_GEN 6

static const char *const models[] = {
	"models/stories260K.gguf",            "models/tiny-llama-q4_0.gguf",
	"arch/models/tiny-phi3-q4_k_m.gguf",  "arch/models/tiny-qwen3moe-q4_k_m.gguf",
	"arch/models/tiny-qwen35-q4_k_m.gguf", "arch/models/tiny-gemma2-q4_k_m.gguf",
};

static uint64_t tensor_size(const struct eng_model *m, const char *name)
{
	const struct gguf_tensor *t = gguf_find_tensor(eng_model_gguf(m), name);

	return t ? t->size : 0;
}

/* The logits of a prompt and N_GEN tokens after it, one at a time. */
static float *logits_of(const struct eng_model *m, const char *what)
{
	uint32_t V = eng_model_hparams(m)->n_vocab;
	struct eng_ctx_config cfg = { .n_ctx = 64, .n_threads = 2 };
	struct eng_ctx *c;
	char err[256];
	int32_t seq[N_PROMPT + N_GEN];
	float *out = calloc((size_t)(N_GEN + 1) * V, sizeof(float));

	for (uint32_t i = 0; i < N_PROMPT + N_GEN; i++)
		seq[i] = (int32_t)((i * 2654435761u + 11) % V);
	if (!out || eng_ctx_create(m, &cfg, &c, err, sizeof(err))) {
		CHECK(0, "%s: a context: %s", what, out ? err : "out of memory");
		free(out);
		return NULL;
	}
	CHECK(eng_decode(c, seq, N_PROMPT, out, false) == 0, "%s: prompt", what);
	for (uint32_t i = 0; i < N_GEN; i++)
		CHECK(eng_decode(c, &seq[N_PROMPT + i], 1, out + (size_t)(i + 1) * V, false) == 0,
		      "%s: token %u", what, i);
	eng_ctx_destroy(c);
	return out;
}

static void same_logits(const struct eng_model *a, const struct eng_model *b, const char *what)
{
	uint32_t V = eng_model_hparams(a)->n_vocab;
	float *la = logits_of(a, what), *lb = logits_of(b, what);

	if (la && lb)
		CHECK(!memcmp(la, lb, (size_t)(N_GEN + 1) * V * sizeof(float)),
		      "%s: the sharing draft's logits differ from the unshared copy's", what);
	free(la);
	free(lb);
}

/* A copy of the image at other addresses (page-aligned, as a mapping is). */
static uint8_t *copy_of(const void *base, size_t size)
{
	uint8_t *p = aligned_alloc(4096, (size + 4095) / 4096 * 4096);

	if (p)
		memcpy(p, base, size);
	return p;
}

static struct eng_model *load(const void *base, size_t size, const char *what)
{
	struct eng_model *m;
	char err[256];

	if (eng_model_load(base, size, &m, err, sizeof(err))) {
		CHECK(0, "%s: %s", what, err);
		return NULL;
	}
	return m;
}

static void run(const char *name, const struct fixture *f)
{
	size_t size = f->size;
	uint8_t *img = copy_of(f->base, size), *img2 = copy_of(f->base, size);
	const struct eng_model *t = f->m;
	struct eng_model *head = NULL, *all = NULL, *plain = NULL, *chg = NULL, *chg_plain = NULL;
	char what[300];

	if (!img || !img2)
		goto out;
	head = load(img, size, name);
	all = load(img, size, name);
	plain = load(img, size, name);
	if (!head || !all || !plain)
		goto out;
	const struct eng_hparams *hp = eng_model_hparams(t);
	const struct gguf *g = eng_model_gguf(t);
	uint64_t n_top = 0, n_all = gguf_n_tensors(g), whole = eng_model_own_bytes(plain), b;
	/* the head it holds unshared: output (the embedding when tied) and its norm */
	const char *out_name = hp->tied_output ? "token_embd.weight" : "output.weight";
	uint64_t head_bytes = tensor_size(t, out_name) + tensor_size(t, "output_norm.weight");

	for (uint64_t i = 0; i < n_all; i++)
		n_top += memcmp(gguf_tensor_at(g, i)->name.ptr, "blk.", 4) != 0;
	CHECK(whole > head_bytes && whole == eng_model_own_bytes(t),
	      "%s: unshared, it holds %llu bytes, the model %llu (head %llu)", name,
	      (unsigned long long)whole, (unsigned long long)eng_model_own_bytes(t),
	      (unsigned long long)head_bytes);

	/* head: everything outside the layers */
	CHECK(eng_model_share(head, t, 0, &b) == (int)n_top, "%s: head: tensors shared", name);
	CHECK(eng_model_own_bytes(head) == whole - head_bytes,
	      "%s: head: holds %llu bytes, expected %llu", name,
	      (unsigned long long)eng_model_own_bytes(head),
	      (unsigned long long)(whole - head_bytes));
	snprintf(what, sizeof(what), "%s (head shared)", name);
	same_logits(head, plain, what);
	CHECK(eng_model_share(head, t, 0, NULL) == -EALREADY, "%s: sharing twice", name);

	/* all: every tensor */
	CHECK(eng_model_share(all, t, ENG_SHARE_LAYERS, &b) == (int)n_all,
	      "%s: all: tensors shared", name);
	CHECK(b == hp->weight_bytes, "%s: all: %llu bytes shared of %llu", name,
	      (unsigned long long)b, (unsigned long long)hp->weight_bytes);
	CHECK(eng_model_own_bytes(all) == 0, "%s: all: still holds %llu bytes", name,
	      (unsigned long long)eng_model_own_bytes(all));
	snprintf(what, sizeof(what), "%s (all shared)", name);
	same_logits(all, plain, what);

	/* changed: the output matrix's last byte differs, nothing else */
	const struct gguf_tensor *o = gguf_find_tensor(g, out_name);

	img2[o->offset + o->size - 1] ^= 0x5a;
	chg = load(img2, size, name);
	chg_plain = load(img2, size, name);
	if (!chg || !chg_plain)
		goto out;
	CHECK(eng_model_share(chg, t, ENG_SHARE_LAYERS, &b) == (int)n_all - 1,
	      "%s: changed: a tensor differing in its last byte was shared", name);
	CHECK(eng_model_own_bytes(chg) == o->size, "%s: changed: holds %llu bytes, expected %llu",
	      name, (unsigned long long)eng_model_own_bytes(chg), (unsigned long long)o->size);
	snprintf(what, sizeof(what), "%s (all but the changed output shared)", name);
	same_logits(chg, chg_plain, what);
out:
	eng_model_destroy(chg_plain);
	eng_model_destroy(chg);
	eng_model_destroy(plain);
	eng_model_destroy(all);
	eng_model_destroy(head);
	free(img);
	free(img2);
}

int main(void)
{
	size_t n = sizeof(models) / sizeof(models[0]);

	for (size_t i = 0; i < n; i++) {
		struct fixture f;
		int rc = fixture_open(models[i], &f);

		if (rc == 0)
			return 77;
		if (rc < 0)
			continue;
		run(models[i], &f);
		fixture_close(&f);
	}
	if (!failures)
		printf("ok: sharing drafts compute bit-identical logits and hold what they do not "
		       "share, %zu models\n", n);
	return failures ? 1 : 0;
}
