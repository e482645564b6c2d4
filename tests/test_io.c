/*
 * test_io.c - the reader's bounced reads (pager/io.c, pio_read_to) without a
 * daemon: ranges of a file read with O_DIRECT through an arena far smaller
 * than what is queued, so chunks wait for room, and written into a memfd at
 * other offsets, the last range running past the end of the file; every
 * byte lands where it should, each chunk calls back once with its bytes,
 * and a read of a descriptor that is not open fails its chunk alone; the
 * busy time counts reads in flight, not the writes or a punch.
 * Skips (77) where the temporary directory has no O_DIRECT.
 */
#include "io_i.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <unistd.h>

#define MIB (1u << 20)
#define FILE_BYTES (6 * MIB + 12288) /* not a whole number of chunks */

struct tally {
	unsigned calls, errors;
	uint64_t bytes;
};

static void on_done(void *tag, int err, uint64_t bytes, bool last, void *arg)
{
	struct tally *t = tag;

	(void)arg;
	CHECK(last, "a bounced chunk calls back once, when written");
	t->calls++;
	t->errors += err != 0;
	t->bytes += bytes;
}

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 2654435761u >> 13);
}

/* Reap until nothing is in flight, or a chunk never completes (10 s):
 * fail, not hang. */
static void drain(struct pager_io *io)
{
	for (int spins = 0; pio_inflight(io) && spins < 100000; spins++) {
		uint64_t v;
		fd_set rd;

		FD_ZERO(&rd);
		FD_SET(pio_fd(io), &rd);
		if (select(pio_fd(io) + 1, &rd, NULL, NULL, &(struct timeval){ .tv_sec = 10 }) <= 0)
			break;
		(void)!read(pio_fd(io), &v, sizeof(v));
		pio_reap(io, on_done, NULL);
	}
}

int main(void)
{
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	char path[4096];
	struct pager_io *io;
	struct tally t[5] = { { 0 } };
	uint64_t busy;
	uint8_t *buf = malloc(FILE_BYTES), *got;
	int fd, dfd, mfd, n[4];

	snprintf(path, sizeof(path), "%s/strata-test-io-XXXXXX", dir);
	fd = mkstemp(path);
	if (fd < 0 || !buf) {
		perror("mkstemp");
		return 1;
	}
	for (uint64_t i = 0; i < FILE_BYTES; i++)
		buf[i] = pattern(i);
	CHECK(write(fd, buf, FILE_BYTES) == FILE_BYTES, "writing the file");
	fsync(fd);
	dfd = open(path, O_RDONLY | O_DIRECT);
	unlink(path);
	if (dfd < 0) {
		printf("skip: no O_DIRECT in %s: %s\n", dir, strerror(errno));
		return 77;
	}
	mfd = memfd_create("test-io", MFD_CLOEXEC);
	CHECK(mfd >= 0 && ftruncate(mfd, 16 * MIB) == 0, "the memfd");

	/* chunks of 1 MiB, at most four in flight, an arena of 1.5 MiB: the
	 * second chunk of each pair waits for the first's write */
	CHECK(pio_create(4, MIB, &io) == 0, "pio_create");
	CHECK(pio_read_to(io, dfd, 0, MIB, FILE_BYTES, mfd, 0, &t[0]) == -EINVAL,
	      "no arena, no bounced read");
	CHECK(pio_bounce(io, 3 * MIB / 2) == 0 && pio_bounce_bytes(io) == 3 * MIB / 2,
	      "the arena: %llu", (unsigned long long)pio_bounce_bytes(io));
	/* [0, 3 MiB) to 8 MiB; [3 MiB + 4 KiB, 5 MiB) to 0; the tail from 5 MiB
	 * asked as 2 MiB, of which 1 MiB + 12 KiB exist */
	n[0] = pio_read_to(io, dfd, 0, 3 * MIB, FILE_BYTES, mfd, 8 * MIB, &t[0]);
	n[1] = pio_read_to(io, dfd, 3 * MIB + 4096, 2 * MIB - 4096, FILE_BYTES, mfd, 0, &t[1]);
	n[2] = pio_read_to(io, dfd, 5 * MIB, 2 * MIB, FILE_BYTES, mfd, 4 * MIB, &t[2]);
	n[3] = pio_read_to(io, -1, 0, MIB, FILE_BYTES, mfd, 12 * MIB, &t[3]);
	CHECK(n[0] == 3 && n[1] == 2 && n[2] == 2 && n[3] == 1, "chunks queued: %d %d %d %d", n[0],
	      n[1], n[2], n[3]);
	drain(io);
	CHECK(!pio_inflight(io), "every chunk completed");
	CHECK(t[0].calls == 3 && !t[0].errors && t[0].bytes == 3 * MIB, "range 0: %u calls, %llu bytes",
	      t[0].calls, (unsigned long long)t[0].bytes);
	CHECK(t[1].calls == 2 && !t[1].errors && t[1].bytes == 2 * MIB - 4096,
	      "range 1: %u calls, %llu bytes", t[1].calls, (unsigned long long)t[1].bytes);
	CHECK(t[2].calls == 2 && !t[2].errors && t[2].bytes == FILE_BYTES - 5 * MIB,
	      "range 2 (past the end): %u calls, %llu bytes", t[2].calls,
	      (unsigned long long)t[2].bytes);
	CHECK(t[3].calls == 1 && t[3].errors == 1 && t[3].bytes == 0,
	      "a bad descriptor fails its chunk: %u calls, %u errors", t[3].calls, t[3].errors);

	got = mmap(NULL, 16 * MIB, PROT_READ, MAP_SHARED, mfd, 0);
	CHECK(got != MAP_FAILED, "mapping the memfd");
	if (got != MAP_FAILED) {
		CHECK(!memcmp(got + 8 * MIB, buf, 3 * MIB), "range 0 in place");
		CHECK(!memcmp(got, buf + 3 * MIB + 4096, 2 * MIB - 4096), "range 1 in place");
		CHECK(!memcmp(got + 4 * MIB, buf + 5 * MIB, FILE_BYTES - 5 * MIB), "range 2 in place");
		for (uint64_t i = 4 * MIB + FILE_BYTES - 5 * MIB; i < 6 * MIB; i++)
			if (got[i]) {
				CHECK(0, "nothing past the file's end written, at %llu",
				      (unsigned long long)i);
				break;
			}
		munmap(got, 16 * MIB);
	}
	/* the busy time, over which the daemon reads the device's bandwidth,
	 * is the reads' alone: it stops with them, and a punch adds none */
	busy = pio_busy_ns(io);
	CHECK(busy > 0 && pio_busy_ns(io) == busy, "busy time while reads were in flight: %llu",
	      (unsigned long long)busy);
	CHECK(pio_punch(io, mfd, 0, MIB, &t[4]) == 0, "pio_punch");
	drain(io);
	CHECK(t[4].calls == 1 && !t[4].errors && pio_busy_ns(io) == busy,
	      "a punch is not read time: %llu ns after it, %llu before",
	      (unsigned long long)pio_busy_ns(io), (unsigned long long)busy);
	pio_destroy(io);
	close(mfd);
	close(dfd);
	close(fd);
	free(buf);
	printf("%s\n", failures ? "FAILED" : "PASS");
	return failures != 0;
}
