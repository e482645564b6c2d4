/*
 * strata-iobench.c - measure storage read bandwidth the way stratad reads.
 *
 *   strata-iobench [--chunk SIZE] [--depth N] [--fresh] FILE
 *
 * Reads the whole file with io_uring, O_DIRECT, `depth` chunks of `chunk`
 * bytes in flight (defaults: stratad's, 1 MiB and 16), into reused buffers,
 * and prints bytes, seconds and GB/s.  With --fresh each chunk goes to new
 * pages of a memfd, as stratad fills its store the first time: the rate
 * then includes what new memory costs (on a VM whose host takes freed
 * memory back, about as much as the storage).  O_DIRECT bypasses the page cache, so
 * the number is the device's, whatever was cached before.  It is the
 * "storage bandwidth" in the streaming bound of docs/benchmarks.md; the
 * reading loop is hwbench_storage_read(), which `strata bench` runs too.
 */
#include "hwbench.h"
#include "pager.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	uint64_t chunk = 1 << 20, depth = 16;
	struct hwbench_io_config cfg = { 0 };
	struct hwbench_result r;
	char err[256];
	int i;

	for (i = 1; i < argc - 1; i += 2) {
		if (!strcmp(argv[i], "--fresh")) {
			cfg.fresh = true;
			i--;
			continue;
		}
		if (!strcmp(argv[i], "--chunk") && !pager_parse_size(argv[i + 1], &chunk) &&
		    chunk >= 4096 && chunk % 4096 == 0 && chunk <= 1 << 30)
			continue;
		if (!strcmp(argv[i], "--depth") && !pager_parse_size(argv[i + 1], &depth) && depth &&
		    depth <= 256)
			continue;
		break;
	}
	if (i != argc - 1) {
		fprintf(stderr, "usage: strata-iobench [--chunk SIZE] [--depth N] [--fresh] FILE\n");
		return 1;
	}
	cfg.chunk = chunk;
	cfg.depth = (unsigned)depth;
	if (hwbench_storage_read(argv[i], &cfg, &r, err, sizeof(err))) {
		fprintf(stderr, "strata-iobench: %s: %s\n", argv[i], err);
		return 2;
	}
	printf("{\"bytes\": %llu, \"seconds\": %.3f, \"gbps\": %.3f, \"chunk\": %llu, \"depth\": %llu, "
	       "\"fresh\": %s}\n",
	       (unsigned long long)r.bytes, r.seconds, r.gbps, (unsigned long long)chunk,
	       (unsigned long long)depth, cfg.fresh ? "true" : "false");
	return 0;
}
