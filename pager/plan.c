/*
 * plan.c - how the budget is shared (see plan_i.h).
 *
 * The order, for a budget B, models with minimums m_i and engines that
 * declared D:
 *   1. every model gets its minimum, what streaming it needs at all;
 *   2. of the rest (B - sum m_i), the engines get what they declared, or the
 *      mode's share if that is more;
 *   3. what is left goes to resident layers, in equal shares; a model that
 *      needs less than its share to be held whole (full - minimum) gets what
 *      it needs and the others share the rest.  A byte saves the same
 *      reading whichever model keeps it, but not the same share of a
 *      token's time: a small model held whole runs at memory speed for a
 *      sliver of the budget, which taken from a big one costs it almost
 *      nothing, so small models are never streamed to feed big ones.
 * A model's resident layers are what its allowance holds beyond its
 * minimum, in whole average layers; memory pressure takes `shed` of them
 * back.
 */
#include "plan_i.h"
#include "pager.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const mode_names[] = { "speed", "balanced", "context" };

/* The engines' room in each mode, in quarters of the memory beyond the
 * minimums. */
static const unsigned mode_quarters[] = { 0, 1, 2 };

const char *plan_mode_name(enum plan_mode mode)
{
	return mode_names[mode];
}

bool pager_mode_valid(const char *s)
{
	enum plan_mode mode;

	return plan_mode_parse(s, &mode) == 0;
}

int plan_mode_parse(const char *s, enum plan_mode *out)
{
	for (unsigned i = 0; i < sizeof(mode_names) / sizeof(mode_names[0]); i++)
		if (!strcmp(s, mode_names[i])) {
			*out = (enum plan_mode)i;
			return 0;
		}
	return -EINVAL;
}

uint64_t plan_minimum(uint64_t full, uint64_t other, uint64_t max_layer, unsigned n_layers,
		      unsigned window, uint64_t sparse, uint64_t buffers)
{
	unsigned in_use = window < n_layers ? window + 1 : n_layers;
	uint64_t need = other + (uint64_t)in_use * max_layer + sparse;

	return (need < full ? need : full) + buffers;
}

int plan_order(unsigned L, unsigned *rank)
{
	unsigned *order = calloc(L ? L : 1, sizeof(*order));
	bool *chosen = calloc(L ? L : 1, sizeof(*chosen));

	if (!order || !chosen) {
		free(order);
		free(chosen);
		return -ENOMEM;
	}
	for (unsigned n = 0; n < L; n++) {
		unsigned best = 0, best_d = 0;

		for (unsigned l = 0; l < L; l++) {
			unsigned d = L;

			if (chosen[l])
				continue;
			for (unsigned k = 0; k < n; k++) {
				unsigned a = (l + L - order[k]) % L, b = (order[k] + L - l) % L;

				if (a < d)
					d = a;
				if (b < d)
					d = b;
			}
			if (d > best_d) {
				best_d = d;
				best = l;
			}
		}
		order[n] = best;
		chosen[best] = true;
		rank[best] = n;
	}
	free(order);
	free(chosen);
	return 0;
}

/* Layers an allowance keeps resident. */
static unsigned resident_layers(const struct plan_model *pm, uint64_t allow)
{
	unsigned L = pm->n_layers, w = pm->window < L ? pm->window : L, n;

	if (allow == UINT64_MAX || allow >= pm->full)
		return L;
	n = allow > pm->minimum && pm->layer_bytes
		    ? (unsigned)((allow - pm->minimum) / pm->layer_bytes) : 0;
	if (n > L - w) /* streaming fewer layers than the window reads ahead */
		n = L - w;
	return n;
}

/* Each model's share of `layers` bytes, into its allowance: equal shares,
 * capped at what each can use (water-filling). */
static void share(uint64_t layers, struct plan_model *ms, unsigned n)
{
	unsigned open = 0;

	for (unsigned i = 0; i < n; i++) {
		ms[i].allowance = ms[i].minimum;
		open += ms[i].full > ms[i].minimum;
	}
	while (open && layers) {
		uint64_t each = layers / open, given = 0;

		if (!each)
			break;
		for (unsigned i = 0; i < n; i++) {
			struct plan_model *pm = &ms[i];
			uint64_t want = pm->full > pm->allowance ? pm->full - pm->allowance : 0;
			uint64_t g = want < each ? want : each;

			if (!want)
				continue;
			pm->allowance += g;
			given += g;
			if (g == want)
				open--;
		}
		layers -= given;
	}
}

void plan_compute(struct plan *pl, struct plan_model *ms, unsigned n)
{
	uint64_t spare, room;

	pl->minimum = 0;
	for (unsigned i = 0; i < n; i++)
		pl->minimum += ms[i].minimum;
	if (!pl->budget) {
		pl->engines = pl->declared;
		pl->layers = UINT64_MAX;
		for (unsigned i = 0; i < n; i++)
			ms[i].allowance = UINT64_MAX;
	} else {
		spare = pl->budget > pl->minimum ? pl->budget - pl->minimum : 0;
		room = spare / 4 * mode_quarters[pl->mode];
		pl->engines = pl->declared > room ? pl->declared : room;
		pl->layers = spare > pl->engines ? spare - pl->engines : 0;
		share(pl->layers, ms, n);
	}
	for (unsigned i = 0; i < n; i++) {
		struct plan_model *pm = &ms[i];
		unsigned r;

		if (pl->resident >= 0)
			r = (unsigned)pl->resident < pm->n_layers ? (unsigned)pl->resident
								  : pm->n_layers;
		else
			r = resident_layers(pm, pm->allowance);
		pm->n_resident = r > pm->shed ? r - pm->shed : 0;
	}
}

uint64_t plan_engine_limit(const struct plan *pl, const struct plan_model *ms, unsigned n)
{
	uint64_t min = 0;

	if (!pl->budget)
		return UINT64_MAX;
	for (unsigned i = 0; i < n; i++)
		min += ms[i].minimum;
	return pl->budget > min ? pl->budget - min : 0;
}
