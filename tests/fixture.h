/*
 * fixture.h - a fixture model mapped and loaded for a C test.
 *
 * fixture_open("models/tiny-llama-q4_0.gguf", &f) maps the file under
 * $STRATA_FIXTURES (default ../shared/fixtures) and loads it.  It returns 1
 * when the model is ready, 0 when the file is missing (it printed SKIP: the
 * test exits 77 if it can run nothing), -1 when the model did not load (a
 * counted failure).  fixture_close undoes it.
 */
#ifndef STRATA_TESTS_FIXTURE_H
#define STRATA_TESTS_FIXTURE_H

#include "check.h"
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>

struct fixture {
	const void *base;
	size_t size;
	struct eng_model *m;
};

static int fixture_open(const char *rel, struct fixture *f)
{
	const char *fix = getenv("STRATA_FIXTURES");
	char path[1024], err[256];

	snprintf(path, sizeof(path), "%s/%s", fix ? fix : "../shared/fixtures", rel);
	if (eng_map_file(path, &f->base, &f->size)) {
		printf("SKIP %s: cannot map it (fixtures missing?)\n", path);
		return 0;
	}
	if (eng_model_load(f->base, f->size, &f->m, err, sizeof(err))) {
		CHECK(0, "%s: %s", path, err);
		eng_unmap_file(f->base, f->size);
		return -1;
	}
	return 1;
}

static void fixture_close(struct fixture *f)
{
	eng_model_destroy(f->m);
	eng_unmap_file(f->base, f->size);
}

#endif
