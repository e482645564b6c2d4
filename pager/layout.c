/*
 * layout.c - split a GGUF file into residency units.
 *
 * A unit is what the pager loads, keeps and evicts as a whole: one per layer
 * (every tensor named blk.N.*) and one for everything else (header, metadata,
 * embeddings, output).  A unit's bytes are a few extents of the file (the
 * tensors of a layer are usually contiguous, but nothing requires it), each
 * rounded out to whole pages: a page holds the same file bytes whichever unit
 * reads it, so rounding keeps the region exact.  Two units may share a
 * boundary page; pager_layout_page_shared() tells the evictor so it never
 * frees a page a neighbour still needs.
 *
 * Each layer also gets tripwires: the first page of each of its tensors.
 * The pager leaves those unmapped when it maps a streamed layer into a
 * client, so the client's first touch of the layer raises one fault that
 * tells the pager where the engine is, without the engine's help.
 *
 * In a mixture of experts (tensors blk.N.*_exps, [cols, rows, experts]),
 * when asked for, each expert is a unit of its own: its slices of the
 * layer's *_exps tensors (the expert dimension is the outermost, so a slice
 * is contiguous: size / E bytes at e * size / E), units n_layers + 1 on,
 * layer by layer.  The layer's unit keeps the rest (attention, norms, the
 * router): its core.  Expert units have no tripwires: the engine says which
 * experts it routed to (ROUTE), and a fault on one is answered when it is
 * read.
 */
#include "pager_i.h"

#include "gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "blk.N." -> N, or -1 when the name is not a layer tensor. */
static long layer_of(struct gguf_str name)
{
	long n = 0;
	uint64_t i = 4;

	if (name.len < 6 || memcmp(name.ptr, "blk.", 4))
		return -1;
	if (name.ptr[i] < '0' || name.ptr[i] > '9')
		return -1;
	for (; i < name.len && name.ptr[i] >= '0' && name.ptr[i] <= '9'; i++) {
		n = n * 10 + (name.ptr[i] - '0');
		if (n > 100000)
			return -1;
	}
	if (i >= name.len || name.ptr[i] != '.')
		return -1;
	return n;
}

static int cmp_ext(const void *a, const void *b)
{
	const struct pager_extent *x = a, *y = b;

	return (x->off > y->off) - (x->off < y->off);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Sort, page-round and merge a unit's extents; count its bytes. */
static void normalize(struct pager_unit *u, uint64_t page, uint64_t map_size)
{
	unsigned n = 0;

	for (unsigned i = 0; i < u->n_ext; i++) {
		uint64_t end = u->ext[i].off + u->ext[i].len;

		u->ext[i].off -= u->ext[i].off % page;
		end = (end + page - 1) / page * page;
		u->ext[i].len = (end < map_size ? end : map_size) - u->ext[i].off;
	}
	qsort(u->ext, u->n_ext, sizeof(*u->ext), cmp_ext);
	for (unsigned i = 0; i < u->n_ext; i++) {
		if (u->ext[i].len == 0)
			continue;
		if (n && u->ext[n - 1].off + u->ext[n - 1].len >= u->ext[i].off) {
			uint64_t end = u->ext[i].off + u->ext[i].len;
			uint64_t prev = u->ext[n - 1].off + u->ext[n - 1].len;

			if (end > prev)
				u->ext[n - 1].len = end - u->ext[n - 1].off;
		} else {
			u->ext[n++] = u->ext[i];
		}
	}
	u->n_ext = n;
	u->bytes = 0;
	for (unsigned i = 0; i < n; i++)
		u->bytes += u->ext[i].len;
	qsort(u->trip, u->n_trip, sizeof(*u->trip), cmp_u64);
	n = 0;
	for (unsigned i = 0; i < u->n_trip; i++)
		if (!n || u->trip[n - 1] != u->trip[i])
			u->trip[n++] = u->trip[i];
	u->n_trip = n;
}

/* Give every page no unit holds (padding between tensors, the tail) to unit
 * 0, so any byte of the file can be served. */
static int cover_gaps(struct pager_layout *l)
{
	struct pager_extent *all, *ext;
	size_t n = 0, cap = 0, gaps = 0;
	uint64_t at = 0;

	for (unsigned u = 0; u < l->n_units; u++)
		cap += l->units[u].n_ext;
	all = calloc(cap + 1, sizeof(*all));
	if (!all)
		return -ENOMEM;
	for (unsigned u = 0; u < l->n_units; u++)
		for (unsigned i = 0; i < l->units[u].n_ext; i++)
			all[n++] = l->units[u].ext[i];
	if (l->sparse.len)
		all[n++] = l->sparse;
	qsort(all, n, sizeof(*all), cmp_ext);
	for (size_t i = 0; i <= n; i++) {
		uint64_t next = i < n ? all[i].off : l->map_size;

		gaps += next > at;
		if (i < n && all[i].off + all[i].len > at)
			at = all[i].off + all[i].len;
		else if (i == n)
			break;
	}
	if (gaps) {
		struct pager_unit *u0 = &l->units[0];

		ext = realloc(u0->ext, (u0->n_ext + gaps) * sizeof(*ext));
		if (!ext) {
			free(all);
			return -ENOMEM;
		}
		u0->ext = ext;
		at = 0;
		for (size_t i = 0; i <= n; i++) {
			uint64_t next = i < n ? all[i].off : l->map_size;

			if (next > at)
				u0->ext[u0->n_ext++] = (struct pager_extent){ at, next - at };
			if (i < n && all[i].off + all[i].len > at)
				at = all[i].off + all[i].len;
		}
		normalize(u0, l->page, l->map_size);
	}
	free(all);
	return 0;
}

/* page -> owning unit, for every page of the image; later units win a
 * shared page (see pager_layout_unit_of). */
static int index_pages(struct pager_layout *l)
{
	uint64_t n = l->map_size / l->page;

	l->page_unit = malloc((n ? n : 1) * sizeof(*l->page_unit));
	l->page_units = calloc(n ? n : 1, 1);
	if (!l->page_unit || !l->page_units)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++)
		l->page_unit[i] = NO_UNIT;
	/* sparse first: a boundary page it shares belongs to the unit */
	for (uint64_t pg = l->sparse.off / l->page; pg < (l->sparse.off + l->sparse.len) / l->page;
	     pg++)
		l->page_unit[pg] = SPARSE_UNIT;
	for (unsigned u = 0; u < l->n_units; u++)
		for (unsigned i = 0; i < l->units[u].n_ext; i++) {
			const struct pager_extent *e = &l->units[u].ext[i];

			for (uint64_t pg = e->off / l->page; pg < (e->off + e->len) / l->page; pg++) {
				l->page_unit[pg] = (uint16_t)u;
				if (l->page_units[pg] < 2)
					l->page_units[pg]++;
			}
		}
	/* an expert's boundary page stays when it goes (its neighbour's) */
	for (uint64_t pg = 0; pg < n; pg++)
		if (l->page_units[pg] > 1 && pager_is_expert(l, l->page_unit[pg]))
			l->expert_shared += l->page;
	return 0;
}

/* A layer's expert tensor: blk.N.*_exps.weight, three dimensions. */
static bool is_exps(const struct gguf_tensor *t)
{
	static const char suffix[] = "_exps.weight";
	size_t n = sizeof(suffix) - 1;

	return t->n_dims == 3 && t->name.len > n &&
	       !memcmp(t->name.ptr + t->name.len - n, suffix, n);
}

/*
 * The experts per layer if the model is a mixture of experts whose expert
 * tensors agree (0 if it is none), and the most expert tensors a layer has.
 * -EINVAL with the reason when they disagree: a count that differs between
 * tensors, or a size that is no whole number of experts.
 */
static long count_experts(const struct gguf *g, unsigned *per_layer, char *err, size_t errlen)
{
	unsigned counts[4097] = { 0 };
	uint64_t E = 0;

	*per_layer = 0;
	for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);
		long n = layer_of(t->name);

		if (n < 0 || n > 4096 || !is_exps(t))
			continue;
		if (!E)
			E = t->ne[2];
		if (t->ne[2] != E || !E || E > 65536 || t->size % E) {
			snprintf(err, errlen, "tensor %.*s has %llu experts of %llu bytes, "
				 "others %llu: inconsistent expert tensors", (int)t->name.len,
				 t->name.ptr, (unsigned long long)t->ne[2],
				 (unsigned long long)(t->ne[2] ? t->size / t->ne[2] : 0),
				 (unsigned long long)E);
			return -EINVAL;
		}
		if (++counts[n] > *per_layer)
			*per_layer = counts[n];
	}
	return (long)E;
}

int pager_layout_build(const void *image, size_t size, uint64_t page, bool experts,
		       struct pager_layout **out, char *err, size_t errlen)
{
	const struct gguf_tensor *sparse;
	struct pager_layout *l;
	struct gguf *g;
	long max_layer = -1, E = 0;
	unsigned per_layer = 0;
	int rc;

	*out = NULL;
	rc = gguf_parse(image, size, &g, err, errlen);
	if (rc)
		return rc;
	for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
		long n = layer_of(gguf_tensor_at(g, i)->name);

		if (n > max_layer)
			max_layer = n;
	}
	if (max_layer > 4096) {
		snprintf(err, errlen, "%ld layers is more than the pager handles", max_layer + 1);
		gguf_destroy(g);
		return -EINVAL;
	}
	if (experts) {
		E = count_experts(g, &per_layer, err, errlen);
		if (E < 0) {
			gguf_destroy(g);
			return (int)E;
		}
		/* more units than a page's owner can name: whole layers */
		if ((uint64_t)(max_layer + 1) * ((uint64_t)E + 1) + 1 >= SPARSE_UNIT)
			E = 0;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		goto oom;
	l->file_size = size;
	l->page = page;
	l->map_size = (size + page - 1) / page * page;
	l->n_layers = (unsigned)(max_layer + 1);
	l->n_experts = (unsigned)E;
	l->n_units = l->n_layers + 1 + l->n_layers * l->n_experts;
	l->units = calloc(l->n_units, sizeof(*l->units));
	if (!l->units)
		goto oom;
	/* Capacity: every tensor could land in one unit; plus the header.  An
	 * expert unit has a slice of each of its layer's expert tensors. */
	for (unsigned u = 0; u < l->n_units; u++) {
		bool ex = pager_is_expert(l, u);
		size_t cap = ex ? per_layer : gguf_n_tensors(g) + 1;

		l->units[u].layer = ex ? (int)((u - l->n_layers - 1) / l->n_experts) : (int)u - 1;
		l->units[u].expert = ex ? (int)((u - l->n_layers - 1) % l->n_experts) : -1;
		l->units[u].ext = calloc(cap, sizeof(struct pager_extent));
		l->units[u].trip = calloc(ex ? 1 : cap, sizeof(uint64_t));
		if (!l->units[u].ext || !l->units[u].trip)
			goto oom;
	}
	/* The token embedding is sparse when the output has its own matrix (a
	 * tied one is read whole for every token). */
	sparse = gguf_find_tensor(g, "output.weight") ? gguf_find_tensor(g, "token_embd.weight")
						      : NULL;
	/* Unit 0 is everything that is not a layer, starting with the header. */
	l->units[0].ext[l->units[0].n_ext++] = (struct pager_extent){ 0, gguf_data_offset(g) };
	for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);
		long n = layer_of(t->name);
		struct pager_unit *u = &l->units[n + 1];

		if (t->size == 0)
			continue;
		if (sparse && t == sparse) {
			uint64_t end = (t->offset + t->size + page - 1) / page * page;

			l->sparse.off = t->offset - t->offset % page;
			l->sparse.len = (end < l->map_size ? end : l->map_size) - l->sparse.off;
			continue;
		}
		if (E && n >= 0 && is_exps(t)) {
			uint64_t slice = t->size / (uint64_t)E;

			for (unsigned e = 0; e < (unsigned)E; e++) {
				struct pager_unit *x = &l->units[pager_expert_unit(l, (unsigned)n, e)];

				x->ext[x->n_ext++] = (struct pager_extent){ t->offset + e * slice, slice };
			}
			continue;
		}
		u->ext[u->n_ext++] = (struct pager_extent){ t->offset, t->size };
		if (n >= 0)
			u->trip[u->n_trip++] = t->offset - t->offset % page;
	}
	for (unsigned u = 0; u < l->n_units; u++)
		normalize(&l->units[u], page, l->map_size);
	if (cover_gaps(l))
		goto oom;
	for (unsigned u = 1; u <= l->n_layers; u++)
		if (l->units[u].bytes > l->max_layer_bytes)
			l->max_layer_bytes = l->units[u].bytes;
	for (unsigned n = 0; n < l->n_layers && E; n++) {
		uint64_t b = 0;

		for (unsigned e = 0; e < (unsigned)E; e++)
			b += l->units[pager_expert_unit(l, n, e)].bytes;
		if (b > l->max_layer_experts)
			l->max_layer_experts = b;
		l->expert_bytes += b;
	}
	if (index_pages(l))
		goto oom;
	gguf_destroy(g);
	*out = l;
	return 0;
oom:
	gguf_destroy(g);
	pager_layout_destroy(l);
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

void pager_layout_destroy(struct pager_layout *l)
{
	if (!l)
		return;
	for (unsigned u = 0; l->units && u < l->n_units; u++) {
		free(l->units[u].ext);
		free(l->units[u].trip);
	}
	free(l->units);
	free(l->page_unit);
	free(l->page_units);
	free(l);
}

/* The unit owning the page at offset off: the last unit whose extents hold
 * it (a boundary page belongs to two; the later one is where the engine is
 * heading).  -1 if no unit does (padding between tensors).  One table lookup:
 * the FUSE read path asks this for every page it serves. */
int pager_layout_unit_of(const struct pager_layout *l, uint64_t off)
{
	uint64_t pg = off / l->page;

	if (off >= l->map_size || l->page_unit[pg] == NO_UNIT)
		return -1;
	if (l->page_unit[pg] == SPARSE_UNIT)
		return PAGER_SPARSE;
	return l->page_unit[pg];
}

/* The sparse extent without its boundary pages that units hold: the pages
 * to drop when dropping it.  False if there are none. */
bool pager_layout_sparse_own(const struct pager_layout *l, uint64_t *off, uint64_t *end)
{
	*off = l->sparse.off;
	*end = l->sparse.off + l->sparse.len;
	if (!l->sparse.len)
		return false;
	if (pager_layout_unit_of(l, *off) != PAGER_SPARSE)
		*off += l->page;
	if (*end > *off && pager_layout_unit_of(l, *end - l->page) != PAGER_SPARSE)
		*end -= l->page;
	return *end > *off;
}

bool pager_layout_page_shared(const struct pager_layout *l, unsigned u, uint64_t off)
{
	uint64_t pg = off / l->page;

	if (off >= l->map_size || !l->page_units[pg])
		return false;
	return l->page_units[pg] > 1 || l->page_unit[pg] != u;
}

bool pager_unit_has_page(const struct pager_unit *u, uint64_t off)
{
	for (unsigned i = 0; i < u->n_ext; i++)
		if (off >= u->ext[i].off && off < u->ext[i].off + u->ext[i].len)
			return true;
	return false;
}
