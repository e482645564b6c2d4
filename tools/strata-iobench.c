/*
 * strata-iobench.c - measure storage read bandwidth the way stratad reads.
 *
 *   strata-iobench [--chunk SIZE] [--depth N] FILE
 *
 * Reads the whole file with io_uring, O_DIRECT, `depth` chunks of `chunk`
 * bytes in flight (defaults: stratad's, 1 MiB and 16), into one reused
 * buffer, and prints bytes, seconds and GB/s.  O_DIRECT bypasses the page
 * cache, so the number is the device's, whatever was cached before.  It is
 * the "storage bandwidth" in the streaming bound of docs/benchmarks.md.
 */
#include "pager.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	uint64_t chunk = 1 << 20, depth = 16, size, off = 0, done = 0;
	struct io_uring ring;
	struct timespec t0, t1;
	struct stat st;
	unsigned inflight = 0;
	uint8_t *buf;
	int fd, i;

	for (i = 1; i < argc - 1; i += 2) {
		if (!strcmp(argv[i], "--chunk") && !pager_parse_size(argv[i + 1], &chunk) &&
		    chunk >= 4096 && chunk % 4096 == 0)
			continue;
		if (!strcmp(argv[i], "--depth") && !pager_parse_size(argv[i + 1], &depth) && depth &&
		    depth <= 256)
			continue;
		break;
	}
	if (i != argc - 1) {
		fprintf(stderr, "usage: strata-iobench [--chunk SIZE] [--depth N] FILE\n");
		return 1;
	}
	fd = open(argv[i], O_RDONLY | O_DIRECT);
	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "strata-iobench: %s: %s\n", argv[i], strerror(errno));
		return 2;
	}
	size = (uint64_t)st.st_size;
	if (posix_memalign((void **)&buf, 4096, chunk * depth) ||
	    io_uring_queue_init((unsigned)depth, &ring, 0) < 0) {
		fprintf(stderr, "strata-iobench: cannot set up io_uring\n");
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (done < size) {
		struct io_uring_cqe *cqe;

		while (inflight < depth && off < size) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			unsigned slot = (unsigned)((off / chunk) % depth);

			io_uring_prep_read(sqe, fd, buf + slot * chunk, (unsigned)chunk, off);
			off += chunk;
			inflight++;
		}
		io_uring_submit(&ring);
		if (io_uring_wait_cqe(&ring, &cqe) < 0)
			break;
		if (cqe->res < 0) {
			fprintf(stderr, "strata-iobench: read: %s\n", strerror(-cqe->res));
			return 2;
		}
		done += cqe->res ? (uint64_t)cqe->res : chunk; /* 0 only past EOF */
		io_uring_cqe_seen(&ring, cqe);
		inflight--;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	printf("{\"bytes\": %llu, \"seconds\": %.3f, \"gbps\": %.3f, \"chunk\": %llu, \"depth\": %llu}\n",
	       (unsigned long long)size, s, size / s / 1e9, (unsigned long long)chunk,
	       (unsigned long long)depth);
	return 0;
}
