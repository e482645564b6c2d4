/*
 * strata-repack.c - rewrite a GGUF model's Q4_0 matrices as Q4_0_R16.
 *
 *   strata-repack IN.gguf OUT.gguf
 *
 * Q4_0_R16 (engine/quant.h) holds the same values as Q4_0 with the blocks
 * of each 16 rows interleaved, the order the AVX-512 kernel computes in; on
 * Q4_0 rows the kernel builds that order in registers for every block, about
 * half its instructions at one token.  The engine never repacks at load (its
 * memory is the file's pages), so this is the offline step: run it once, then
 * point strata (or stratad) at OUT.  Results are bit-identical to IN's.
 *
 * What is repacked: every 2-D Q4_0 tensor with a multiple of 16 rows, except
 * token_embd.weight (read one row at a time to embed a token).  Sizes and
 * offsets do not change: OUT is a copy of IN, mapped and repacked where it
 * lies by eng_repack_r16() (engine/repack.c; the fuzz test runs it too).
 *
 * OUT is written beside itself as OUT.XXXXXX, synced and renamed into place,
 * so an interrupted run never leaves a half-written model under OUT's name
 * (and removes OUT.XXXXXX on an error or SIGINT, SIGTERM, SIGHUP).
 * Files with the new type are for strata only: other GGUF readers reject the
 * type number (64) rather than misread it.
 *
 *   strata-repack --layers N IN.gguf OUT.gguf
 *
 * writes instead IN's first N layers and everything outside the layers
 * (embedding, output head, norms, all metadata but <arch>.block_count, which
 * becomes N), every tensor's bytes as they are: a self-speculative draft for
 * IN (--draft-model).  Its tensors are IN's, so strata computes the draft
 * from IN's copy (eng_model_share) and it costs no memory of its own but its
 * context (through the pager, its layers' bytes).  How well it drafts is
 * another matter: the first layers of a model and its head guess the next
 * token only as well as the model's later layers change little.
 */
#include "gguf.h"
#include "gguf_buf_i.h"
#include "repack.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *out_tmp; /* removed on failure */

static int fail(const char *fmt, ...)
{
	va_list ap;

	fputs("strata-repack: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (out_tmp)
		unlink(out_tmp);
	return 2;
}

/* All of buf at off, or -1 with errno set. */
static int pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	while (len) {
		ssize_t n = pwrite(fd, buf, len, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		buf = (const uint8_t *)buf + n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

/*
 * The whole of the image into out: in the kernel where it can
 * (copy_file_range), else from the mapping with pwrite (copy_file_range
 * refuses between some filesystems, e.g. ext4 to tmpfs: EXDEV).
 */
static int copy_all(int in, const uint8_t *img, int out, uint64_t size)
{
	loff_t ioff = 0, ooff = 0;

	while ((uint64_t)ioff < size) {
		ssize_t n = copy_file_range(in, &ioff, out, &ooff, size - (uint64_t)ioff, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && ioff == 0 &&
		    (errno == EXDEV || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL))
			return pwrite_all(out, img, size, 0);
		if (n <= 0)
			return n ? -1 : (errno = EIO, -1);
	}
	return 0;
}

/* Is tensor t kept by --layers n: outside the layers, or blk.L. with L < n? */
static bool kept(const struct gguf_tensor *t, uint32_t n)
{
	char name[96];
	unsigned l;
	char dot;

	if (t->name.len < 4 || memcmp(t->name.ptr, "blk.", 4))
		return true;
	if (t->name.len >= sizeof(name))
		return false;
	memcpy(name, t->name.ptr, t->name.len);
	name[t->name.len] = '\0';
	return sscanf(name, "blk.%u%c", &l, &dot) == 2 && dot == '.' && l < n;
}

/*
 * --layers n: the header of IN with its tensors cut to the first n layers
 * into out, then each kept tensor's bytes.  The key-value records are copied
 * as they lie in IN (a record runs from its key's length to the next key's,
 * the last to the first tensor's name), <arch>.block_count rewritten.
 */
static int write_layers(const uint8_t *img, const struct gguf *g, uint32_t n, int out,
			const char *in_path, uint64_t *n_kept, uint64_t *bytes)
{
	uint64_t n_kv = gguf_n_kv(g), n_t = gguf_n_tensors(g), align = gguf_alignment(g);
	struct gguf_str arch;
	char key[128];
	const struct gguf_kv *bc;
	struct buf b = { 0 };
	uint64_t off = 0, data;

	if (gguf_get_str(g, "general.architecture", &arch) || arch.len > 64)
		return fail("%s: no general.architecture", in_path);
	snprintf(key, sizeof(key), "%.*s.block_count", (int)arch.len, arch.ptr);
	bc = gguf_find_kv(g, key);
	if (!bc || (bc->type != GGUF_VT_U32 && bc->type != GGUF_VT_I32 &&
		    bc->type != GGUF_VT_U64 && bc->type != GGUF_VT_I64))
		return fail("%s: no integer %s", in_path, key);
	if (bc->v.u64 < n || n_t == 0)
		return fail("%s: has %llu layers, fewer than --layers %u", in_path,
			    (unsigned long long)bc->v.u64, n);
	*n_kept = 0;
	for (uint64_t i = 0; i < n_t; i++)
		*n_kept += kept(gguf_tensor_at(g, i), n);
	put_u32(&b, GGUF_MAGIC);
	put_u32(&b, gguf_version(g));
	put_u64(&b, *n_kept);
	put_u64(&b, n_kv);
	for (uint64_t i = 0; i < n_kv; i++) {
		const struct gguf_kv *kv = gguf_kv_at(g, i);
		const uint8_t *from = (const uint8_t *)kv->key.ptr - 8;
		const uint8_t *to = i + 1 < n_kv ? (const uint8_t *)gguf_kv_at(g, i + 1)->key.ptr - 8
						 : (const uint8_t *)gguf_tensor_at(g, 0)->name.ptr - 8;

		if (kv != bc) {
			buf_put(&b, from, (size_t)(to - from));
			continue;
		}
		put_str(&b, kv->key.ptr, kv->key.len);
		put_u32(&b, kv->type);
		if (kv->type == GGUF_VT_U32 || kv->type == GGUF_VT_I32)
			put_u32(&b, n);
		else
			put_u64(&b, n);
	}
	for (uint64_t i = 0; i < n_t; i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);

		if (!kept(t, n))
			continue;
		put_str(&b, t->name.ptr, t->name.len);
		put_u32(&b, t->n_dims);
		for (uint32_t d = 0; d < t->n_dims; d++)
			put_u64(&b, t->ne[d]);
		put_u32(&b, t->type);
		put_u64(&b, off);
		off = (off + t->size + align - 1) / align * align;
	}
	data = (b.len + align - 1) / align * align;
	while (!b.oom && b.len < data)
		buf_put(&b, "", 1);
	if (b.oom)
		return fail("out of memory");
	if (pwrite_all(out, b.p, b.len, 0))
		return fail("%s: %s", out_tmp, strerror(errno));
	free(b.p);
	off = 0;
	*bytes = 0;
	for (uint64_t i = 0; i < n_t; i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);

		if (!kept(t, n))
			continue;
		if (pwrite_all(out, img + t->offset, t->size, (off_t)(data + off)))
			return fail("%s: %s", out_tmp, strerror(errno));
		off = (off + t->size + align - 1) / align * align;
		*bytes += t->size;
	}
	/* the last tensor's padding, as writers leave it */
	if (ftruncate(out, (off_t)(data + off)))
		return fail("%s: %s", out_tmp, strerror(errno));
	return 0;
}

/*
 * Does the repack pay on this CPU?  Measured on IN's own matrices (engine.h,
 * eng_ctx_repack_gain) and said on stdout; OUT is written either way, since
 * it may be for another machine.  A model the engine cannot load (another
 * architecture, say) is repacked unmeasured.
 */
static void say_gain(const uint8_t *img, size_t size)
{
	struct eng_ctx_config cfg = { .n_ctx = 16, .n_batch = 1 };
	struct eng_model *m;
	struct eng_ctx *c;
	char err[256];
	double gain;

	if (eng_model_load(img, size, &m, err, sizeof(err)))
		return;
	if (!eng_ctx_create(m, &cfg, &c, err, sizeof(err))) {
		if (!eng_ctx_repack_gain(c, &gain))
			printf("on this CPU (%s kernels) its Q4_0 matrices read %.2fx as fast "
			       "repacked%s\n",
			       eng_isa_name(), gain,
			       gain < 1.03 ? ": the repacked file will not decode faster here" : "");
		eng_ctx_destroy(c);
	}
	eng_model_destroy(m);
}

/* Interrupted: no half-written OUT.XXXXXX left behind (unlink and _exit are
 * async-signal-safe). */
static void on_signal(int sig)
{
	if (out_tmp)
		unlink(out_tmp);
	_exit(128 + sig);
}

/* OUT.XXXXXX, made and watched: removed on an error or a signal. */
static int open_out(const char *out_path, char *tmp, size_t len, int *out)
{
	if ((size_t)snprintf(tmp, len, "%s.XXXXXX", out_path) >= len)
		return fail("%s: path too long", out_path);
	*out = mkostemp(tmp, O_CLOEXEC);
	if (*out < 0)
		return fail("%s: %s", tmp, strerror(errno));
	out_tmp = tmp;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	if (fchmod(*out, 0644))
		return fail("%s: %s", tmp, strerror(errno));
	return 0;
}

int main(int argc, char **argv)
{
	const char *in_path, *out_path;
	static char tmp[4096];
	struct gguf *g;
	struct stat st;
	char err[256];
	uint64_t n_rep, n_all, n_done, bytes_done;
	uint8_t *img, *oimg;
	int in, out, rc;
	long layers = 0;

	if (argc == 5 && !strcmp(argv[1], "--layers")) {
		char *end;

		errno = 0;
		layers = strtol(argv[2], &end, 10);
		if (errno || end == argv[2] || *end || layers < 1 || layers > 100000)
			return fail("--layers needs a number of layers from 1");
		argv += 2;
		argc -= 2;
	}
	if (argc != 3 || argv[1][0] == '-') {
		fprintf(stderr, "usage: strata-repack IN.gguf OUT.gguf\n"
				"  writes IN with its Q4_0 matrices as Q4_0_R16 (strata's "
				"interleaved layout; same results; says whether it decodes faster "
				"on this CPU)\n"
				"       strata-repack --layers N IN.gguf OUT.gguf\n"
				"  writes IN's first N layers and its embedding and head: a draft "
				"for IN (--draft-model) that shares IN's memory\n");
		return 1;
	}
	in_path = argv[1];
	out_path = argv[2];

	in = open(in_path, O_RDONLY | O_CLOEXEC);
	if (in < 0 || fstat(in, &st))
		return fail("%s: %s", in_path, strerror(errno));
	if (!S_ISREG(st.st_mode) || st.st_size == 0)
		return fail("%s: not a regular, non-empty file", in_path);
	img = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, in, 0);
	if (img == MAP_FAILED)
		return fail("%s: mmap: %s", in_path, strerror(errno));
	/* before writing anything: is there work? */
	if (gguf_parse(img, (size_t)st.st_size, &g, err, sizeof(err)))
		return fail("%s: %s", in_path, err);
	n_all = gguf_n_tensors(g);
	n_rep = eng_n_repackable(g);
	if (layers) {
		rc = open_out(out_path, tmp, sizeof(tmp), &out);
		if (!rc)
			rc = write_layers(img, g, (uint32_t)layers, out, in_path, &n_done,
					  &bytes_done);
		gguf_destroy(g);
		if (rc)
			return rc;
		if (fsync(out) || close(out) || rename(tmp, out_path))
			return fail("%s: %s", out_path, strerror(errno));
		out_tmp = NULL;
		printf("%s: %ld layers, %llu of %llu tensors (%.1f MiB) of %s\n", out_path, layers,
		       (unsigned long long)n_done, (unsigned long long)n_all,
		       (double)bytes_done / (1 << 20), in_path);
		return 0;
	}
	gguf_destroy(g);
	if (!n_rep)
		return fail("%s: nothing to repack (no Q4_0 matrix with a multiple of 16 rows)",
			    in_path);
	say_gain(img, (size_t)st.st_size);

	if ((rc = open_out(out_path, tmp, sizeof(tmp), &out)))
		return rc;
	if (copy_all(in, img, out, (uint64_t)st.st_size))
		return fail("%s: copy: %s", tmp, strerror(errno));
	munmap(img, (size_t)st.st_size);
	close(in);

	oimg = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, out, 0);
	if (oimg == MAP_FAILED)
		return fail("%s: mmap: %s", tmp, strerror(errno));
	rc = eng_repack_r16(oimg, (size_t)st.st_size, &n_done, &bytes_done, err, sizeof(err));
	if (rc)
		return fail("%s: %s", in_path, err);
	if (munmap(oimg, (size_t)st.st_size) || fsync(out) || close(out) || rename(tmp, out_path))
		return fail("%s: %s", out_path, strerror(errno));
	out_tmp = NULL; /* renamed: OUT is whole now */
	printf("%s: %llu of %llu tensors (%.1f MiB) repacked to Q4_0_R16\n", out_path,
	       (unsigned long long)n_done, (unsigned long long)n_all,
	       (double)bytes_done / (1 << 20));
	return 0;
}
