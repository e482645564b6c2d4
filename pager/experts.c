/*
 * experts.c - the expert cache: a mixture of experts held an expert at a time.
 *
 * In a model with expert units (layout.c), the layers' cores (attention,
 * norms, routers) stay resident with unit 0; what the plan leaves beyond
 * them is the expert cache (model->ex.capacity).  Experts are read into the
 * model's memfd like any unit and leave by punch hole, which unmaps them
 * from every engine at once; but once the cache is full, a daemon that
 * serves engines alone reads them into slots whose pages are reused,
 * mapped at each expert's range by a REMAP as streamed layers' are
 * (residency.c; the third part of this file, "room for a load").
 *
 * An engine sends ROUTE before a layer reads its experts: the experts its
 * router picked for the pass.  Those it lacks are loaded at once, all of
 * them (io.c keeps them in flight together at the device's best depth), and
 * are pinned until the engine routes its next layer; its faults on them
 * wait until each is read (uffd.c), so the first experts' compute overlaps
 * the later ones' reads.  Room is made by evicting the experts with the
 * lowest decayed use count (the first part of this file, plain arithmetic
 * that tests/test_experts.c checks): experts that are pinned, or that a
 * fault waits for, never go.  An engine that sends no ROUTE still works: its
 * faults load what it touches, one expert at a time.
 *
 * The lookahead: while a layer computes, the engine may send HINT, the
 * experts the next layer will likely route to (its router applied to this
 * layer's hidden state).  Those not in memory are read once the experts the
 * client routed to are (they come first on the device), as far as the
 * cache makes room for them without going past its capacity (a hint never
 * forces a load), and the hinted experts are pinned until the client's next
 * ROUTE, which then finds them in memory or in flight.  A hint is no use:
 * it moves no score, so a wrong guess is the first to leave again.  Only
 * with --lookahead does the MODEL message ask engines for hints (server.c):
 * the guess costs an engine a router's bytes a layer, and on the machines
 * measured that was more than the reads ahead saved, with random and with
 * skewed routers alike (docs/design.md).  Hints a client sends unasked are
 * only scored (how many of the routed experts they named); nothing is read
 * on them.
 *
 * Evictions punch on the daemon's thread rather than on the ring: an expert
 * is a few MiB, and the load that waits for the room should not wait behind
 * the reads queued there.
 *
 * Threading: the daemon's one thread; see server_i.h.
 */
#include "experts_i.h"
#include "server_i.h"
#include "proto_i.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the choice ------------------------------------------------------- */

int expert_cache_init(struct expert_cache *c, unsigned n, double half_life)
{
	*c = (struct expert_cache){ .n = n, .decay = pow(0.5, 1.0 / half_life) };
	c->score = calloc(n ? n : 1, sizeof(*c->score));
	c->last = calloc(n ? n : 1, sizeof(*c->last));
	if (!c->score || !c->last) {
		expert_cache_free(c);
		return -ENOMEM;
	}
	return 0;
}

void expert_cache_free(struct expert_cache *c)
{
	free(c->score);
	free(c->last);
	c->score = NULL;
	c->last = NULL;
}

void expert_cache_use(struct expert_cache *c, unsigned i)
{
	if (i >= c->n)
		return;
	c->score[i] += 1.0;
	c->last[i] = c->pass;
}

void expert_cache_pass(struct expert_cache *c)
{
	for (unsigned i = 0; i < c->n; i++)
		c->score[i] *= c->decay;
	c->pass++;
}

long expert_cache_victim(const struct expert_cache *c, bool (*may_go)(void *arg, unsigned i),
			 void *arg)
{
	long best = -1;

	for (unsigned i = 0; i < c->n; i++) {
		if (!may_go(arg, i))
			continue;
		if (best < 0 || c->score[i] < c->score[best] ||
		    (c->score[i] == c->score[best] && c->last[i] < c->last[best]))
			best = i;
	}
	return best;
}

/* ---- the cache in the daemon ------------------------------------------ */

/* Decayed counts fade by half in this many passes. */
#define HALF_LIFE 64.0

int pager_experts_init(struct model *m)
{
	const struct pager_layout *l = m->lay;
	unsigned n = l->n_layers * l->n_experts;

	m->ex.capacity = UINT64_MAX;
	m->ex.fuse_layer = -1;
	if (!n)
		return 0;
	m->ex.pins = calloc(n, sizeof(*m->ex.pins));
	m->ex.ahead = calloc(n, sizeof(*m->ex.ahead));
	if (!m->ex.pins || !m->ex.ahead)
		return -ENOMEM; /* pager_experts_destroy frees what was */
	return expert_cache_init(&m->ex.cache, n, HALF_LIFE);
}

void pager_experts_destroy(struct model *m)
{
	free(m->ex.pins);
	free(m->ex.ahead);
	expert_cache_free(&m->ex.cache);
}

/* Client c's experts (its last ROUTE) are no longer pinned by it. */
static void unpin(struct client *c)
{
	struct model *m = c->m;

	for (uint32_t i = 0; i < c->n_route; i++)
		m->ex.pins[pager_expert_index(m->lay, c->route[i])]--;
	c->n_route = 0;
}

/* Nor its last HINT's. */
static void unpin_hint(struct client *c)
{
	struct model *m = c->m;

	for (uint32_t i = 0; i < c->n_hint; i++)
		m->ex.pins[pager_expert_index(m->lay, c->hint[i])]--;
	c->n_hint = 0;
	c->hint_layer = -1;
}

/* The expert units of a ROUTE's or HINT's experts (n u32) into units[],
 * checked: false, with the client dropped, on a layer or expert the model
 * lacks or an expert named twice. */
static bool units_of(struct client *c, uint32_t layer, const uint8_t *experts, uint32_t n,
		     unsigned *units)
{
	const struct pager_layout *l = c->m->lay;

	if (layer >= l->n_layers) {
		pager_drop_client(c, "it routed a layer the model does not have");
		return false;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t e = proto_get_u32(experts + 4 * i);

		if (e >= l->n_experts) {
			pager_drop_client(c, "it routed to an expert the model does not have");
			return false;
		}
		units[i] = pager_expert_unit(l, layer, e);
		for (uint32_t k = 0; k < i; k++)
			if (units[k] == units[i]) {
				pager_drop_client(c, "it routed to an expert twice");
				return false;
			}
	}
	return true;
}

/* c->route, c->hint: room for a layer's experts (a message names each of
 * them at most once). */
static bool lists(struct client *c)
{
	uint32_t E = c->m->lay->n_experts;

	if ((!c->route && !(c->route = malloc(E * sizeof(*c->route)))) ||
	    (!c->hint && !(c->hint = malloc(E * sizeof(*c->hint))))) {
		pager_drop_client(c, "out of memory");
		return false;
	}
	return true;
}

/*
 * Whether a ROUTE or HINT of n experts of layer is for the expert cache: not
 * when the model is served by whole layers (--fuse: the faults say it all),
 * and the client is dropped for a layer the model does not have or a list
 * longer than the model's experts (n <= them once none is named twice:
 * units_of checks that).
 */
static bool experts_apply(struct client *c, uint32_t layer, uint32_t n)
{
	const struct pager_layout *l = c->m->lay;

	if (!l->n_experts) {
		if (layer >= l->n_layers)
			pager_drop_client(c, "it routed a layer the model does not have");
		return false;
	}
	if (!lists(c))
		return false;
	if (n > l->n_experts) {
		pager_drop_client(c, "it routed to an expert twice");
		return false;
	}
	return true;
}

void pager_experts_route(struct client *c, uint32_t layer, const uint8_t *experts, uint32_t n)
{
	struct model *m = c->m;

	if (!experts_apply(c, layer, n))
		return;
	unpin(c);
	if (!units_of(c, layer, experts, n, c->route))
		return;
	/* the layers of a pass come in order: a layer not after the last is a
	 * new pass */
	if (c->route_layer < 0 || layer <= (uint32_t)c->route_layer) {
		expert_cache_pass(&m->ex.cache);
		m->ex.passes++;
	}
	c->route_layer = (int)layer;
	c->n_route = n;
	for (uint32_t i = 0; i < n; i++) {
		unsigned u = c->route[i], x = pager_expert_index(m->lay, u);

		m->ex.pins[x]++;
		expert_cache_use(&m->ex.cache, x);
		if (m->us[u].state == U_LOADED)
			m->ex.hits++;
		else
			m->ex.misses++;
		if (m->us[u].state == U_LOADING)
			m->ex.in_flight++;
		if (m->ex.ahead[x]) {
			m->ex.ahead_used++;
			m->ex.ahead[x] = 0;
		}
		/* the lookahead's score: was it named by the hint for this layer */
		if (c->hint_layer == (int)layer) {
			m->ex.hint_routed++;
			for (uint32_t k = 0; k < c->n_hint; k++)
				if (c->hint[k] == u) {
					m->ex.hint_right++;
					break;
				}
		}
	}
	unpin_hint(c); /* this ROUTE's pins hold what is wanted now */
	c->pos = (int)layer + 1;
	c->routes = true;
	pager_policy_advance(m);
}

void pager_experts_forget(struct client *c)
{
	if (c->m && c->route)
		unpin(c);
	if (c->m && c->hint)
		unpin_hint(c);
	free(c->route);
	free(c->hint);
	c->route = NULL;
	c->hint = NULL;
}

/* A fault on expert unit u, from an engine that does not route: the fault
 * is its use. */
void pager_experts_fault(struct client *c, unsigned u)
{
	struct model *m = c->m;

	if (c->routes)
		return;
	expert_cache_use(&m->ex.cache, pager_expert_index(m->lay, u));
	if (m->us[u].state == U_LOADED)
		m->ex.hits++;
	else
		m->ex.misses++;
}

/* The mount's reader read from expert unit u, not in its page cache
 * (fuse.c): a miss, and a use.  Its layers come in order: a layer before
 * the last one read is a new pass. */
void pager_experts_fuse_read(struct model *m, unsigned u)
{
	int layer = m->lay->units[u].layer;

	if (layer < m->ex.fuse_layer) {
		expert_cache_pass(&m->ex.cache);
		m->ex.passes++;
	}
	m->ex.fuse_layer = layer;
	m->ex.fuse_misses++;
	expert_cache_use(&m->ex.cache, pager_expert_index(m->lay, u));
}

/* May expert i (an index over all layers) leave now? */
static bool may_go(void *arg, unsigned i)
{
	struct model *m = arg;
	unsigned u = pager_expert_at(m->lay, i);

	return m->us[u].state == U_LOADED && !m->ex.pins[i] && !m->waiters[u];
}

/* ---- room for a load -------------------------------------------------- */

/* Evict the least valued expert that may go; false if none may (everything
 * left is wanted). */
static bool evict_least(struct model *m)
{
	long v = expert_cache_victim(&m->ex.cache, may_go, m);

	if (v < 0)
		return false;
	pager_evict(m, pager_expert_at(m->lay, (unsigned)v));
	return true;
}

/* Evict the least valued experts until `need` more bytes fit the capacity;
 * false if they do not.  Experts in the memfd. */
static bool make_room(struct model *m, uint64_t need)
{
	while (m->ex.held + need > m->ex.capacity)
		if (!evict_least(m))
			return false;
	return true;
}

/*
 * Experts in slots (residency.c: a daemon serving engines alone).  While
 * the cache grows, a read lands on new pages wherever it goes, so experts
 * go to the memfd, as a mount needs them.  Once the cache is full (it has
 * evicted), every load goes to a slot: its pages, made once, are reused
 * for one expert after another, where a read into the memfd would make new
 * ones, which cost the kernel an allocation and zeroing (and this VM the
 * host's faults) on the cores the engine computes on (docs/benchmarks.md,
 * "What a read costs the CPU here"); the experts still in the memfd leave
 * by punch hole as before, their room going to new slots.  An evicted
 * expert's slot is free only once every client maps its range from the
 * memfd again (a REMAP round trip), so a few slots are kept free or on
 * their way (spares), and a miss starts reading at once.
 */

/* A sixteenth of the cache's slots, at most 16 (two layers' routed experts
 * of Qwen3-30B-A3B). */
static unsigned spares(const struct model *m)
{
	uint64_t n = m->ex.capacity == UINT64_MAX ? 0 : m->ex.capacity / m->slot_size / 16;

	return n < 16 ? (unsigned)n : 16;
}

/* Evict the least valued experts until `want` slots are free or on their
 * way, unless a new slot fits (the evicted were in the memfd). */
static void vacate(struct model *m, unsigned want)
{
	while (m->slots_free + m->slots_vacating < want && !pager_slot_new_fits(m)) {
		if (!evict_least(m))
			return;
		m->ex.full = true;
	}
}

#define IN_MEMFD (-1)
#define NO_ROOM (-2)

/* Where expert unit u may be read now within the capacity, after evicting
 * what must go for it: a slot, IN_MEMFD or NO_ROOM.  `waiting`: loads
 * already waiting for a slot in this step, each owed one. */
static int place(struct model *m, unsigned u, unsigned waiting)
{
	uint64_t b = m->lay->units[u].bytes;
	int s;

	if (!m->n_slots)
		return make_room(m, b) ? IN_MEMFD : NO_ROOM;
	if ((s = pager_slot_free(m, false)) >= 0)
		return s;
	if (!m->ex.full && m->ex.held + b <= m->ex.capacity)
		return IN_MEMFD;
	vacate(m, spares(m) + waiting + 1);
	s = pager_slot_free(m, pager_slot_new_fits(m));
	return s >= 0 ? s : NO_ROOM;
}

/* Bring the cache within a capacity that shrank (the plan, pressure):
 * evict, and punch the slots that frees; then keep the spares. */
static void trim(struct model *m)
{
	if (!m->n_slots) {
		make_room(m, 0);
		return;
	}
	while (m->ex.held > m->ex.capacity) {
		uint64_t over = (m->ex.held - m->ex.capacity + m->slot_size - 1) / m->slot_size;

		if (pager_slot_drop(m))
			continue;
		if (m->slots_vacating >= over)
			return; /* dropped once vacated: the next step comes then */
		if (!evict_least(m))
			return;
	}
	if (m->ex.full)
		vacate(m, spares(m));
}

/* Load expert unit u (not in memory), making room for it first.  Loaded
 * even if no room is left, into the memfd: an engine waits for it, and the
 * minimum (plan.c) holds a whole layer's experts, so only engines in
 * different layers at once can take the cache past its capacity, by what
 * they route.  But while a victim's slot is on its way, u waits for it
 * (still absent, *waiting counts it): pager_slot_vacated takes the next
 * step, which loads it. */
static int load(struct model *m, unsigned u, unsigned *waiting)
{
	int s = place(m, u, *waiting);

	if (s == NO_ROOM && m->slots_vacating) {
		++*waiting;
		return 0;
	}
	return pager_load_at(m, u, s == NO_ROOM ? IN_MEMFD : s);
}

/* A fault waits for expert unit u (uffd.c), or waited while it was being
 * evicted (residency.c, released: its client may have gone since): load it
 * if nobody is. */
void pager_experts_demand(struct model *m, unsigned u)
{
	unsigned waiting = 0;

	if (m->us[u].state != U_ABSENT)
		return;
	if (load(m, u, &waiting)) {
		if (m->waiters[u])
			pager_drop_client(m->waiters[u]->c, "the model file could not be read");
	}
	else if (waiting)
		m->ex.demand_waits = true;
}

/* Read client c's hinted experts that are not in memory, in the hint's
 * order (the engine names them ascending): a room that runs out stops the
 * reads ahead, the rest wait for the ROUTE.  Only once none of the experts
 * it routed to is still being read: the engine waits for those now, and a
 * read ahead would share the device with them (pager_experts_advance
 * comes back here when a load ends). */
static void read_ahead(struct client *c)
{
	struct model *m = c->m;

	if (!m->p->cfg.lookahead || !c->n_hint)
		return;
	for (uint32_t i = 0; i < c->n_route; i++)
		if (m->us[c->route[i]].state == U_LOADING)
			return;
	for (uint32_t i = 0; i < c->n_hint; i++) {
		unsigned u = c->hint[i];

		if (m->us[u].state != U_ABSENT)
			continue;
		int slot = place(m, u, 0);

		if (slot == NO_ROOM || pager_load_at(m, u, slot))
			break;
		m->ex.ahead_loads++;
		m->ex.ahead[pager_expert_index(m->lay, u)] = 1;
	}
}

/* Load the experts the clients routed to, and those faults wait for, that
 * are not in memory, then those they hinted at; then, if the plan shrank,
 * evict down to the capacity. */
void pager_experts_advance(struct model *m)
{
	const struct pager_layout *l = m->lay;
	unsigned waiting = 0;

	if (!l->n_experts)
		return;
	for (struct client *c = m->p->clients; c; c = c->next) {
		if (c->m != m || c->dead)
			continue;
		for (uint32_t i = 0; i < c->n_route; i++)
			if (m->us[c->route[i]].state == U_ABSENT && load(m, c->route[i], &waiting))
				return;
	}
	/* faults of an engine that does not route, which waited for a slot */
	if (m->ex.demand_waits) {
		unsigned before = waiting;

		for (unsigned u = l->n_layers + 1; u < l->n_units; u++)
			if (m->waiters[u] && m->us[u].state == U_ABSENT && load(m, u, &waiting))
				return;
		m->ex.demand_waits = waiting > before;
	}
	for (struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && !c->dead)
			read_ahead(c);
	trim(m);
}

void pager_experts_hint(struct client *c, uint32_t layer, const uint8_t *experts, uint32_t n)
{
	struct model *m = c->m;

	if (!experts_apply(c, layer, n))
		return;
	unpin_hint(c);
	if (!units_of(c, layer, experts, n, c->hint))
		return;
	c->hint_layer = (int)layer;
	c->n_hint = n;
	for (uint32_t i = 0; i < n; i++)
		m->ex.pins[pager_expert_index(m->lay, c->hint[i])]++;
	m->ex.hinted += n;
	read_ahead(c);
}
