/*
 * test_fuzz.c - truncated and byte-flipped fixtures through the loader and the
 * engine, built with AddressSanitizer and UndefinedBehaviorSanitizer.
 *
 * Two phases, both deterministic (fixed seed, so a failure reproduces):
 *
 * 1. In process: for every fixture model, and tiny-llama-q4_0 repacked to
 *    Q4_0_R16 (eng_repack_r16, what strata-repack writes), hundreds of
 *    mutants (truncations at chosen and random lengths; 1-8 flipped bytes,
 *    mostly in the header and tensor table where the structure lives) are
 *    copied into a buffer of exactly their size, so any read past the end
 *    trips ASan.  Each goes through eng_model_load; those that load also get
 *    a context and a few tokens decoded.  Each must load and run, or be
 *    refused with a message.
 *
 * 2. Through the command line: a sample of mutants written to files and given
 *    to the sanitized `strata eval`.  Each run must exit 0, or exit 2 with one
 *    line "strata: ..." on stderr; no sanitizer report, no other status, and
 *    it must finish within a time limit (no hangs).
 *
 * Any sanitizer report aborts the process (-fno-sanitize-recover), which
 * meson counts as a failure.
 */
#include "engine.h"
#include "repack.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

#define CLI_TIMEOUT_S 60

#define R16 "+r16" /* suffix: the model repacked to Q4_0_R16 in memory */

static const char *const models[] = {
	"stories260K.gguf",       "tiny-llama-f16.gguf",    "tiny-llama-q4_0.gguf",
	"tiny-llama-q4_k_m.gguf", "tiny-llama-q6_k.gguf",   "tiny-llama-q8_0.gguf",
	"tiny-qwen2-q4_k_m.gguf",  "tiny-llama-q4_0.gguf" R16,
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

static uint64_t rng_state = 0x5eed5eed12345678ull;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		*len = (size_t)n;
	}
	fclose(f);
	return buf;
}

/* Where the structure lives: the header, metadata and tensor table, i.e.
 * everything before the tensor data (weight_bytes of the intact file). */
static size_t header_bytes(const uint8_t *img, size_t len)
{
	struct eng_model *m;
	char err[256];
	size_t h = len < 4096 ? len : 4096;

	if (eng_model_load(img, len, &m, err, sizeof(err)) == 0) {
		uint64_t w = eng_model_hparams(m)->weight_bytes;

		h = w < len ? len - w : len;
		eng_model_destroy(m);
	}
	return h;
}

/* Make mutant k of img into out (same or shorter length); returns its length. */
static size_t mutate(const uint8_t *img, size_t len, size_t hdr, unsigned k, uint8_t *out)
{
	static const size_t cuts[] = { 0, 1, 4, 7, 8, 15, 16, 23, 24, 31, 32, 40 };
	size_t n = len;

	memcpy(out, img, len);
	if (k < sizeof(cuts) / sizeof(cuts[0]))
		return cuts[k];
	switch (k % 4) {
	case 0: /* truncate inside the header/table */
		return (size_t)(rnd() % hdr);
	case 1: /* truncate anywhere */
		return (size_t)(rnd() % len);
	default: { /* flip 1-8 bytes, 80% inside the header */
		unsigned flips = 1 + (unsigned)(rnd() % 8);

		for (unsigned i = 0; i < flips; i++) {
			size_t pos = rnd() % 5 ? rnd() % hdr : rnd() % len;

			out[pos] ^= (uint8_t)(1u << (rnd() % 8)) | (rnd() % 3 ? 0 : 0xff);
		}
		return n;
	}
	}
}

static int run_in_process(const char *name, const uint8_t *img, size_t len, unsigned count,
			  unsigned *loaded, unsigned *refused)
{
	size_t hdr = header_bytes(img, len);
	uint8_t *work = malloc(len);

	if (!work)
		return 1;
	for (unsigned k = 0; k < count; k++) {
		size_t n = mutate(img, len, hdr, k, work);
		uint8_t *exact = malloc(n ? n : 1); /* exact size: overreads trip ASan */
		struct eng_model *m = NULL;
		struct eng_ctx *c = NULL;
		char err[256] = "";
		int rc;

		if (!exact) {
			free(work);
			return 1;
		}
		memcpy(exact, work, n);
		rc = eng_model_load(exact, n, &m, err, sizeof(err));
		if (rc) {
			if (!err[0] || strchr(err, '\n')) {
				printf("FAIL %s mutant %u: refused without a one-line message\n", name,
				       k);
				free(exact);
				free(work);
				return 1;
			}
			(*refused)++;
		} else {
			struct eng_ctx_config cc = { .n_ctx = 16, .n_threads = 2 };

			(*loaded)++;
			if (eng_ctx_create(m, &cc, &c, err, sizeof(err)) == 0) {
				int32_t toks[4] = { 1, 2, 3, 4 };
				float *logits = malloc(eng_model_hparams(m)->n_vocab * sizeof(float));

				if (logits)
					eng_decode(c, toks, 4, logits, false);
				free(logits);
			}
			eng_ctx_destroy(c);
			eng_model_destroy(m);
		}
		free(exact);
	}
	free(work);
	return 0;
}

/* Run the sanitized strata on one file; 0 if it behaved. */
static int run_cli(const char *bin, const char *file, const char *dir, const char *what)
{
	char errpath[512], outpath[512];
	char *argv[] = { (char *)bin, "eval", "-m", (char *)file, "--tokens", "1,2,3",
			 "--logits-out", outpath, "-c", "16", NULL };
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int st = 0, rc;
	struct pollfd pfd;
	char buf[4096];
	FILE *f;
	size_t n;

	snprintf(errpath, sizeof(errpath), "%s/stderr", dir);
	snprintf(outpath, sizeof(outpath), "%s/logits", dir);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 2, errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	rc = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc) {
		printf("FAIL cannot run %s: %s\n", bin, strerror(rc));
		return 1;
	}
	/* Wait for the child with a deadline: a pidfd becomes readable when
	 * the process exits. */
	pfd.fd = (int)syscall(SYS_pidfd_open, pid, 0);
	pfd.events = POLLIN;
	if (pfd.fd < 0 || poll(&pfd, 1, CLI_TIMEOUT_S * 1000) == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		if (pfd.fd >= 0)
			close(pfd.fd);
		printf("FAIL %s: %s\n", what, pfd.fd < 0 ? "pidfd_open failed" : "hung");
		return 1;
	}
	close(pfd.fd);
	waitpid(pid, &st, 0);
	f = fopen(errpath, "rb");
	n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = '\0';
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 2 && !strncmp(buf, "strata: ", 8) &&
	    strchr(buf, '\n') == buf + n - 1)
		return 0;
	printf("FAIL %s: %s %d, stderr:\n%s\n", what, WIFEXITED(st) ? "exit" : "signal",
	       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), buf);
	return 1;
}

int main(int argc, char **argv)
{
	const char *fix = getenv("STRATA_FIXTURES");
	const char *bin = getenv("STRATA_SAN_BIN");
	unsigned per_model = argc > 1 ? (unsigned)atoi(argv[1]) : 160;
	unsigned cli_per_model = argc > 2 ? (unsigned)atoi(argv[2]) : 16;
	unsigned loaded = 0, refused = 0, cli_runs = 0;
	char dir[] = "/tmp/strata-fuzz-XXXXXX";
	int fails = 0;

	if (!fix)
		fix = "../shared/fixtures";
	if (!mkdtemp(dir)) {
		printf("FAIL mkdtemp: %s\n", strerror(errno));
		return 1;
	}
	for (size_t i = 0; i < N_MODELS; i++) {
		char path[1024];
		size_t len = 0;
		uint8_t *img;

		size_t nl = strlen(models[i]);
		bool r16 = nl > strlen(R16) && !strcmp(models[i] + nl - strlen(R16), R16);

		snprintf(path, sizeof(path), "%s/models/%.*s", fix,
			 (int)(nl - (r16 ? strlen(R16) : 0)), models[i]);
		img = slurp(path, &len);
		if (!img) {
			printf("SKIP: cannot read %s (set STRATA_FIXTURES)\n", path);
			rmdir(dir);
			return 77;
		}
		if (r16) {
			uint64_t nt, nbytes;
			char err[256];

			if (eng_repack_r16(img, len, &nt, &nbytes, err, sizeof(err)) || !nt) {
				printf("FAIL %s: repack: %s\n", models[i], nt ? err : "nothing");
				fails++;
				free(img);
				continue;
			}
		}
		fails += run_in_process(models[i], img, len, per_model, &loaded, &refused);

		/* Phase 2: mutants through the sanitized command line. */
		if (bin) {
			size_t hdr = header_bytes(img, len);
			uint8_t *work = malloc(len);

			for (unsigned k = 0; work && k < cli_per_model; k++) {
				char file[512], what[600];
				size_t n = mutate(img, len, hdr, 12 + k, work);
				FILE *f;

				snprintf(file, sizeof(file), "%s/mutant.gguf", dir);
				f = fopen(file, "wb");
				if (!f || fwrite(work, 1, n, f) != n || fclose(f)) {
					printf("FAIL cannot write %s\n", file);
					fails++;
					break;
				}
				snprintf(what, sizeof(what), "%s cli mutant %u", models[i], k);
				fails += run_cli(bin, file, dir, what);
				cli_runs++;
			}
			free(work);
		}
		free(img);
		printf("%s: %u in-process mutants so far (%u loaded, %u refused)\n", models[i],
		       loaded + refused, loaded, refused);
	}
	{
		char p[600];

		snprintf(p, sizeof(p), "%s/mutant.gguf", dir);
		unlink(p);
		snprintf(p, sizeof(p), "%s/stderr", dir);
		unlink(p);
		snprintf(p, sizeof(p), "%s/logits", dir);
		unlink(p);
		rmdir(dir);
	}
	printf("%s: %u mutants in process (%u loaded and ran, %u refused), %u through the CLI%s\n",
	       fails ? "FAIL" : "ok", loaded + refused, loaded, refused, cli_runs,
	       bin ? "" : " (STRATA_SAN_BIN not set)");
	return fails ? 1 : 0;
}
