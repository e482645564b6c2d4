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
 */
#include "gguf.h"
#include "repack.h"

#include <errno.h>
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

/* Interrupted: no half-written OUT.XXXXXX left behind (unlink and _exit are
 * async-signal-safe). */
static void on_signal(int sig)
{
	if (out_tmp)
		unlink(out_tmp);
	_exit(128 + sig);
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

	if (argc != 3 || argv[1][0] == '-') {
		fprintf(stderr, "usage: strata-repack IN.gguf OUT.gguf\n"
				"  writes IN with its Q4_0 matrices as Q4_0_R16 (strata's "
				"interleaved layout; same results, faster decode)\n");
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
	gguf_destroy(g);
	if (!n_rep)
		return fail("%s: nothing to repack (no Q4_0 matrix with a multiple of 16 rows)",
			    in_path);

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.XXXXXX", out_path) >= sizeof(tmp))
		return fail("%s: path too long", out_path);
	out = mkostemp(tmp, O_CLOEXEC);
	if (out < 0)
		return fail("%s: %s", tmp, strerror(errno));
	out_tmp = tmp;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	if (fchmod(out, 0644) || copy_all(in, img, out, (uint64_t)st.st_size))
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
