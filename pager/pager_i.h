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

/* A residency unit: a layer, or (unit 0) everything that is not a layer; in
 * a mixture of experts, a layer's core (all but its experts) or one expert
 * of a layer (its slices of the layer's three *_exps tensors). */
struct pager_unit {
	int layer;  /* -1 for unit 0 */
	int expert; /* -1 but for an expert unit */
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
	unsigned n_units;  /* n_layers + 1, + n_layers * n_experts */
	struct pager_unit *units;
	uint64_t max_layer_bytes;
	/* Expert units (a mixture of experts, when asked for): n_experts per
	 * layer, expert e of layer l is unit pager_expert_unit(l, e).  0: none,
	 * the experts are in their layer's unit. */
	unsigned n_experts;
	uint64_t max_layer_experts; /* the most bytes of one layer's experts */
	uint64_t expert_bytes;      /* of all experts */
	uint64_t expert_shared;     /* pages experts share with another unit: kept
				     * when the experts are evicted */
	uint8_t *page_units; /* per page: how many units hold it (at most 2 counted) */
	uint16_t *page_unit; /* per page: its unit (the later one if shared), NO_UNIT, SPARSE */
	/* Sparse: the token embedding when the model has its own output matrix.
	 * A token reads one row of it, so it belongs to no unit: its pages are
	 * read on demand, a block at a time (residency.c). */
	struct pager_extent sparse;
};

#define NO_UNIT UINT16_MAX
#define SPARSE_UNIT (UINT16_MAX - 1)
#define PAGER_SPARSE (-2) /* pager_layout_unit_of: a sparse page */

/* Split the GGUF image into units, with expert units when `experts` and the
 * model is a mixture of experts; -errno with a one-line reason in err. */
int pager_layout_build(const void *image, size_t size, uint64_t page, bool experts,
		       struct pager_layout **out, char *err, size_t errlen);
void pager_layout_destroy(struct pager_layout *l);
/* The unit of the page at off; PAGER_SPARSE for a sparse page, -1 for none. */
int pager_layout_unit_of(const struct pager_layout *l, uint64_t off);
bool pager_layout_sparse_own(const struct pager_layout *l, uint64_t *off, uint64_t *end);
bool pager_unit_has_page(const struct pager_unit *u, uint64_t off);
/* Does a unit other than u hold the page at off (a boundary page)? */
bool pager_layout_page_shared(const struct pager_layout *l, unsigned u, uint64_t off);

/* Expert units numbered over all layers (layer * n_experts + e), the
 * expert cache's index, and back. */
static inline unsigned pager_expert_index(const struct pager_layout *l, unsigned u)
{
	return u - l->n_layers - 1;
}
static inline unsigned pager_expert_at(const struct pager_layout *l, unsigned i)
{
	return l->n_layers + 1 + i;
}
/* The unit of expert e of layer l (the layout has n_experts > 0). */
static inline unsigned pager_expert_unit(const struct pager_layout *l, unsigned layer, unsigned e)
{
	return pager_expert_at(l, layer * l->n_experts + e);
}
static inline bool pager_is_expert(const struct pager_layout *l, unsigned u)
{
	return u > l->n_layers && u < l->n_units;
}

/* util.c: CLOCK_MONOTONIC in nanoseconds */
uint64_t pager_now_ns(void);
/* util.c: the median of v[0..n) (v unchanged; at most PAGER_MEDIAN_MAX
 * values are looked at), 0 for none: of the last few samples in a ring. */
#define PAGER_MEDIAN_MAX 64
double pager_median(const double *v, unsigned n);

#endif
