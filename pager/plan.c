/*
 * plan.c - how the budget is shared (see plan_i.h).
 *
 * The order, for a budget B, models with minimums m_i and engines that
 * declared D:
 *   1. every model gets its minimum, what streaming it needs at all;
 *   2. of the rest (B - sum m_i), the engines get what they declared, or the
 *      mode's share if that is more;
 *   3. what is left goes to resident layers.  Once the speed predictor knows
 *      every model that can take more (an engine decoded with each), by what
 *      each gains from it: a run of layers at a time to the model whose
 *      predicted speed rises the most for the bytes, relative to its own
 *      speed (so the sum of the logarithms of the speeds grows the most: a
 *      model that doubles counts the same whether it runs at 1 or at 10
 *      tok/s).  Before that, in equal shares; a model that needs less than
 *      its share to be held whole (full - minimum) gets what it needs and
 *      the others share the rest.  Either way a small model is never
 *      streamed to feed a big one: held whole it runs at memory speed for a
 *      sliver of the budget, which taken from a big one costs it almost
 *      nothing.
 * A model's resident layers are what its allowance holds beyond its
 * minimum, in whole average layers; memory pressure takes `shed` of them
 * back.
 */
#include "plan_i.h"
#include "pager.h"

#include <errno.h>
#include <math.h>
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

/* Each model's share of `layers` bytes, added to its allowance: equal
 * shares, capped at what each can use (water-filling). */
static void share(uint64_t layers, struct plan_model *ms, unsigned n)
{
	unsigned open = 0;

	for (unsigned i = 0; i < n; i++)
		open += ms[i].full > ms[i].allowance;
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

/* What model pm holds with r layers resident (r <= n_layers - window, or
 * all of them). */
static uint64_t cost_of(const struct plan_model *pm, unsigned r)
{
	uint64_t c = pm->minimum + (uint64_t)r * pm->layer_bytes;

	return r >= pm->n_layers || c > pm->full ? pm->full : c;
}

/* Can the predictor share: does every model that could take more bytes
 * have a curve? */
static bool gains_known(const struct plan_model *ms, unsigned n)
{
	unsigned open = 0;

	for (unsigned i = 0; i < n; i++) {
		if (ms[i].full <= ms[i].minimum)
			continue;
		if (!ms[i].tps)
			return false;
		for (unsigned r = 0; r <= ms[i].n_layers; r++)
			if (!(ms[i].tps[r] > 0))
				return false;
		open++;
	}
	return open > 0;
}

/* Share `layers` bytes by predicted gain (see the top of this file), added
 * to the allowances: the step with the most log-speed gained per byte goes
 * first, a step being any number of a model's next layers (the curve rises
 * faster near full residency, so one layer alone can look worth less than
 * the run it starts).  What no step can use is then shared equally.
 * Returns what is left. */
static uint64_t share_by_gain(uint64_t layers, struct plan_model *ms, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		ms[i].n_resident = 0; /* the layers given so far */
	for (;;) {
		struct plan_model *best = NULL;
		unsigned best_r = 0;
		uint64_t best_cost = 0;
		double best_rate = 0;

		for (unsigned i = 0; i < n; i++) {
			struct plan_model *pm = &ms[i];
			unsigned L = pm->n_layers, w = pm->window < L ? pm->window : L;
			unsigned r0 = pm->n_resident;

			for (unsigned r = r0 + 1; r <= L; r++) {
				uint64_t cost;
				double rate;

				if (r > L - w && r < L)
					continue; /* not a plan: fewer streamed than the window */
				cost = cost_of(pm, r) - pm->allowance;
				if (cost > layers)
					break;
				rate = (log(pm->tps[r]) - log(pm->tps[r0])) / ((double)cost + 1);
				if (rate > best_rate) {
					best = pm;
					best_r = r;
					best_cost = cost;
					best_rate = rate;
				}
			}
		}
		if (!best)
			break;
		best->allowance += best_cost;
		best->n_resident = best_r;
		layers -= best_cost;
	}
	return layers;
}

void plan_compute(struct plan *pl, struct plan_model *ms, unsigned n)
{
	uint64_t spare, room;

	pl->minimum = 0;
	pl->by_gain = false;
	for (unsigned i = 0; i < n; i++)
		pl->minimum += ms[i].minimum;
	if (!pl->budget) {
		pl->engines = pl->declared;
		pl->room = UINT64_MAX;
		pl->layers = UINT64_MAX;
		for (unsigned i = 0; i < n; i++)
			ms[i].allowance = UINT64_MAX;
	} else {
		spare = pl->budget > pl->minimum ? pl->budget - pl->minimum : 0;
		room = spare / 4 * mode_quarters[pl->mode];
		pl->room = room;
		pl->engines = pl->declared > room ? pl->declared : room;
		pl->layers = spare > pl->engines ? spare - pl->engines : 0;
		pl->by_gain = gains_known(ms, n);
		for (unsigned i = 0; i < n; i++)
			ms[i].allowance = ms[i].minimum;
		share(pl->by_gain ? share_by_gain(pl->layers, ms, n) : pl->layers, ms, n);
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
