/*
 * pager_i.h - internals shared by the pager's files (not installed).
 */
#ifndef STRATA_PAGER_I_H
#define STRATA_PAGER_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A page-aligned byte range of the model file (and of its memfd). */
struct pager_extent {
	uint64_t off;
	uint64_t len;
};

/* A residency unit: a layer, or (unit 0) everything that is not a layer. */
struct pager_unit {
	int layer; /* -1 for unit 0 */
	uint64_t bytes;
	unsigned n_ext;
	struct pager_extent *ext; /* sorted, merged, page-aligned */
	unsigned n_trip;
	uint64_t *trip;           /* tripwire page offsets, sorted */
};

struct pager_layout {
	uint64_t file_size;
	uint64_t map_size; /* file_size rounded up to a page */
	uint64_t page;
	unsigned n_layers;
	unsigned n_units;  /* n_layers + 1 */
	struct pager_unit *units;
	uint64_t max_layer_bytes;
	uint16_t *page_unit; /* per page: its unit (the later one if shared), NO_UNIT, SPARSE */
	/* Sparse: the token embedding when the model has its own output matrix.
	 * A token reads one row of it, so it belongs to no unit: its pages are
	 * read on demand, a block at a time (residency.c). */
	struct pager_extent sparse;
};

#define NO_UNIT UINT16_MAX
#define SPARSE_UNIT (UINT16_MAX - 1)
#define PAGER_SPARSE (-2) /* pager_layout_unit_of: a sparse page */

/* Split the GGUF image into units; -errno with a one-line reason in err. */
int pager_layout_build(const void *image, size_t size, uint64_t page,
		       struct pager_layout **out, char *err, size_t errlen);
void pager_layout_destroy(struct pager_layout *l);
/* The unit of the page at off; PAGER_SPARSE for a sparse page, -1 for none. */
int pager_layout_unit_of(const struct pager_layout *l, uint64_t off);
bool pager_layout_sparse_own(const struct pager_layout *l, uint64_t *off, uint64_t *end);
bool pager_unit_has_page(const struct pager_unit *u, uint64_t off);

/* util.c: CLOCK_MONOTONIC in nanoseconds */
uint64_t pager_now_ns(void);
/* util.c: the median of v[0..n) (v unchanged; at most PAGER_MEDIAN_MAX
 * values are looked at), 0 for none: of the last few samples in a ring. */
#define PAGER_MEDIAN_MAX 64
double pager_median(const double *v, unsigned n);

#endif
