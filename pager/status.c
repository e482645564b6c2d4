/*
 * status.c - the daemon's view, as text for people and JSON for scripts
 * (stratactl status; the fields are documented in docs/cli.md).
 */
#include "server_i.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

/* ---- status ----------------------------------------------------------- */

/* In memory for its readers: in the memfd, or in the mount's page cache. */
static bool in_memory(const struct model *m, unsigned u)
{
	return m->us[u].state == U_LOADED ||
	       (m->us[u].pc != PC_NONE && m->us[u].pc_job != PC_DROPPING);
}

static char state_char(const struct model *m, unsigned u)
{
	if (m->us[u].pc_job == PC_DROPPING)
		return 'e';
	if (m->us[u].state != U_LOADING && in_memory(m, u))
		return m->us[u].resident ? 'R' : 'L';
	switch (m->us[u].state) {
	case U_LOADING:
		return 'l';
	case U_EVICTING:
		return 'e';
	case U_LOADED:
		return m->us[u].resident ? 'R' : 'L';
	default:
		return '.';
	}
}

static const char *state_name(const struct model *m, unsigned u)
{
	if (m->us[u].pc_job == PC_DROPPING)
		return "evicting";
	if (m->us[u].state != U_LOADING && in_memory(m, u))
		return m->us[u].resident ? "resident" : "loaded";
	switch (m->us[u].state) {
	case U_LOADING:
		return "loading";
	case U_EVICTING:
		return "evicting";
	case U_LOADED:
		return m->us[u].resident ? "resident" : "loaded";
	default:
		return "absent";
	}
}

static const char *const pc_name[] = { "none", "some", "all but tripwire", "all" };
static const char *const io_source[] = { "defaults", "probed", "cached", "set" };

/* The mount's readers show once something read the model through it. */
static bool reader_active(const struct model *m)
{
	return m->fuse_reader && m->fuse_reads;
}

/* The declared memory is the last engine's, kept while none is connected. */
static bool engines_held(const struct pager *p)
{
	return !pager_declared_connected(p) && p->declared_hold;
}

struct sbuf {
	char *p;
	size_t cap, len;
};

static void __attribute__((format(printf, 2, 3))) sb(struct sbuf *s, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (s->len >= s->cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(s->p + s->len, s->cap - s->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		s->len = s->len + (size_t)n < s->cap ? s->len + (size_t)n : s->cap;
}

/* s as the body of a JSON string (file names may hold anything). */
static void sb_json(struct sbuf *b, const char *s)
{
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			sb(b, "\\%c", ch);
		else if (ch < 0x20)
			sb(b, "\\u%04x", ch);
		else
			sb(b, "%c", ch);
	}
}

/* The decode speed its engines measured and the one predicted. */
static void render_speed(struct sbuf *s, const struct model *m)
{
	unsigned L = m->lay->n_layers;

	if (!m->speed.tokens) {
		sb(s, "  speed       no decoding yet: nothing to predict from\n");
		return;
	}
	if (m->lay->n_experts) { /* the predictor's curve is of streamed layers */
		sb(s, "  speed       %.2f tok/s measured (%.1f ms of compute a token)\n",
		   pager_measured_tps(m), m->speed.compute_ns / 1e6);
		return;
	}
	sb(s, "  speed       %.2f tok/s measured, %.2f predicted (%.1f ms of compute a token, "
	      "streaming at %.2f GB/s)\n",
	   pager_measured_tps(m), pager_predict_tps(m, m->n_resident), m->speed.compute_ns / 1e6,
	   pager_predict_gbps(m->p));
	sb(s, "  predicted   ");
	for (unsigned q = 0; q <= 4; q++)
		sb(s, "%s%u resident: %.2f", q ? ", " : "", L * q / 4,
		   pager_predict_tps(m, L * q / 4));
	sb(s, " tok/s\n");
}

/* The expert cache (experts.c): with expert units only.  Resident experts
 * per layer are one character each in the text (0-9, then a-z for 10-35,
 * then '+'), numbers in JSON. */
static void render_experts(struct sbuf *s, const struct model *m, bool json)
{
	const struct pager_layout *l = m->lay;
	const struct model_experts *x = &m->ex;
	uint64_t routed = x->hits + x->misses, loads = 0, evictions = 0, drops = 0;
	double rate = routed ? (double)x->hits / (double)routed : 0;
	double per_pass = x->passes ? (double)x->bytes_read / (double)x->passes : 0;
	double acc = x->hint_routed ? (double)x->hint_right / (double)x->hint_routed : 0;

	char cap[32] = "unlimited";

	if (!l->n_experts)
		return;
	if (x->capacity != UINT64_MAX)
		snprintf(cap, sizeof(cap), "%.1f MiB", x->capacity / 1048576.0);
	for (unsigned u = l->n_layers + 1; u < l->n_units; u++) {
		loads += m->us[u].loads;
		evictions += m->us[u].evictions;
		drops += m->us[u].drops;
	}
	if (json)
		sb(s, "\"experts\": {\"per_layer\": %u, \"bytes\": %llu, \"capacity_bytes\": %llu, "
		      "\"held_bytes\": %llu, \"hits\": %llu, \"misses\": %llu, \"hit_rate\": %.4f, "
		      "\"loads\": %llu, \"evictions\": %llu, \"bytes_read\": %llu, \"passes\": %llu, "
		      "\"bytes_per_pass\": %.0f, \"fuse_misses\": %llu, \"fuse_drops\": %llu, "
		      "\"lookahead\": {\"on\": %s, \"hinted\": %llu, \"read_ahead\": %llu, "
		      "\"read_ahead_used\": %llu, \"routed\": %llu, \"predicted\": %llu, "
		      "\"accuracy\": %.4f, \"routed_in_flight\": %llu}, \"resident\": [",
		   l->n_experts, (unsigned long long)l->expert_bytes,
		   (unsigned long long)(x->capacity == UINT64_MAX ? 0 : x->capacity),
		   (unsigned long long)x->held, (unsigned long long)x->hits,
		   (unsigned long long)x->misses, rate, (unsigned long long)loads,
		   (unsigned long long)evictions, (unsigned long long)x->bytes_read,
		   (unsigned long long)x->passes, per_pass, (unsigned long long)x->fuse_misses,
		   (unsigned long long)drops, m->p->cfg.lookahead ? "true" : "false",
		   (unsigned long long)x->hinted, (unsigned long long)x->ahead_loads,
		   (unsigned long long)x->ahead_used, (unsigned long long)x->hint_routed,
		   (unsigned long long)x->hint_right, acc, (unsigned long long)x->in_flight);
	else
		sb(s, "  experts     %u a layer, %.1f MiB; cache %.1f MiB of %s; hit rate %.3f "
		      "(%llu of %llu routed); %.2f MiB read a pass (%llu passes); %llu loads, "
		      "%llu evictions\n",
		   l->n_experts, l->expert_bytes / 1048576.0, x->held / 1048576.0,
		   cap, rate, (unsigned long long)x->hits,
		   (unsigned long long)routed, per_pass / 1048576.0, (unsigned long long)x->passes,
		   (unsigned long long)loads, (unsigned long long)evictions);
	if (!json && x->hinted)
		sb(s, "  lookahead   accuracy %.3f (%llu of %llu routed were hinted); %llu read "
		      "ahead%s, %llu of them routed to; %llu routed while in flight\n",
		   acc, (unsigned long long)x->hint_right, (unsigned long long)x->hint_routed,
		   (unsigned long long)x->ahead_loads,
		   !m->p->cfg.lookahead ? " (off: hints only scored)" : "",
		   (unsigned long long)x->ahead_used, (unsigned long long)x->in_flight);
	else if (!json && !m->p->cfg.lookahead)
		sb(s, "  lookahead   off (no guesses, nothing read ahead; stratad --lookahead)\n");
	if (!json)
		sb(s, "  in memory   [");
	for (unsigned layer = 0; layer < l->n_layers; layer++) {
		unsigned n = 0;

		for (unsigned e = 0; e < l->n_experts; e++) {
			const struct ustat *us = &m->us[pager_expert_unit(l, layer, e)];

			n += us->state == U_LOADED || (us->pc != PC_NONE && us->pc_job != PC_DROPPING);
		}
		if (json)
			sb(s, "%s%u", layer ? ", " : "", n);
		else
			sb(s, "%c", n < 10 ? '0' + n : n < 36 ? 'a' + n - 10 : '+');
	}
	if (json)
		sb(s, "]}, ");
	else
		sb(s, "]  (experts per layer: 0-9, a-z = 10-35, + more)\n");
	if (!json && m->fuse_reader)
		sb(s, "  mount       %llu experts read from the file by its reader (its hits are the "
		      "page cache's, unseen), %llu dropped from the page cache\n",
		   (unsigned long long)x->fuse_misses, (unsigned long long)drops);
}

/* The budget, the plan and the pressure, as text. */
static void render_plan(struct sbuf *s, const struct pager *p)
{
	static const char *const why[] = {
		[PLAN_SPEED] = "resident layers get all but what the engines declare",
		[PLAN_BALANCED] = "a quarter of the rest stays free for the engines' context",
		[PLAN_CONTEXT] = "half of the rest stays free for the engines' context",
	};
	const struct budget *b = &p->budget;
	const struct pressure *ps = &p->pressure;

	switch (b->source) {
	case BUDGET_NONE:
		sb(s, "budget        none: every layer resident\n");
		break;
	case BUDGET_GIVEN:
		sb(s, "budget        %.1f MiB (--budget)\n", p->cfg.budget / 1048576.0);
		break;
	default:
		sb(s, "budget        %.1f MiB (auto): %s %.1f MiB, less %.1f MiB kept back\n",
		   p->cfg.budget / 1048576.0,
		   b->source == BUDGET_MEMAVAILABLE ? "memory available and in use"
						    : "the memory cgroup's limit",
		   b->limit / 1048576.0, b->reserve / 1048576.0);
	}
	sb(s, "plan          %s: streaming needs %.1f MiB; %s (%.1f MiB for engines)\n",
	   plan_mode_name(p->plan.mode), p->plan.minimum / 1048576.0, why[p->plan.mode],
	   p->plan.engines / 1048576.0);
	if (p->n_models > 1)
		sb(s, "              the models share the layers' memory %s\n",
		   p->plan.by_gain ? "by the speed each gains from it (predicted)"
				   : "equally, until an engine has decoded with each");
	if (ps->fd < 0) {
		sb(s, "pressure      not watched%s\n", p->cfg.no_pressure ? " (--no-pressure)" : "");
		return;
	}
	sb(s, "pressure      %s: stalls %.1f ms/s; %llu sheds (%llu relieved it, %llu did not), "
	      "%llu events ignored",
	   ps->path, ps->rate / 1e3, (unsigned long long)ps->sheds, (unsigned long long)ps->helped,
	   (unsigned long long)ps->futile, (unsigned long long)ps->ignored);
	if (ps->n_release)
		sb(s, "; shed layers freed %.1f ms after the event (median of %u)",
		   pager_pressure_release_ms(p), ps->n_release);
	sb(s, "\n");
}

void pager_render_status(struct pager *p, bool json, char *out, size_t cap, size_t *len)
{
	struct sbuf s = { out, cap, 0 };
	double busy = pio_busy_ns(p->io) / 1e9;
	uint64_t read_all = 0; /* the reader is shared: throughput is over all models */

	for (unsigned j = 0; j < p->n_models; j++)
		read_all += p->models[j].bytes_read;

	const struct pio_params *io = &p->io_params;
	const struct pressure *ps = &p->pressure;
	double achieved = busy > 0 ? read_all / busy / 1e9 : 0;

	if (json) {
		sb(&s, "{\"pid\": %d, \"budget_bytes\": %llu, \"declared_bytes\": %llu, "
		       "\"pressure_events\": %llu, ",
		   (int)getpid(), (unsigned long long)p->cfg.budget,
		   (unsigned long long)pager_declared(p), (unsigned long long)p->pressure_events);
		sb(&s, "\"budget\": {\"source\": \"%s\", \"where\": \"",
		   pager_budget_source_name(p->budget.source));
		sb_json(&s, p->budget.where);
		sb(&s, "\", \"limit_bytes\": %llu, \"reserve_bytes\": %llu}, ",
		   (unsigned long long)p->budget.limit, (unsigned long long)p->budget.reserve);
		sb(&s, "\"plan\": {\"mode\": \"%s\", \"minimum_bytes\": %llu, "
		       "\"engines_bytes\": %llu, \"engine_limit_bytes\": %llu, \"layers_bytes\": %llu, "
		       "\"shared_by\": \"%s\"}, ",
		   plan_mode_name(p->plan.mode), (unsigned long long)p->plan.minimum,
		   (unsigned long long)p->plan.engines,
		   (unsigned long long)(p->cfg.budget && p->cfg.budget > p->plan.minimum
					? p->cfg.budget - p->plan.minimum : 0),
		   (unsigned long long)(p->plan.layers == UINT64_MAX ? 0 : p->plan.layers),
		   p->plan.by_gain ? "gain" : "equal");
		sb(&s, "\"pressure\": {\"watching\": \"");
		sb_json(&s, ps->fd >= 0 ? ps->path : "");
		sb(&s, "\", \"stall_us_per_s\": %.0f, \"sheds\": %llu, \"helped\": %llu, "
		       "\"futile\": %llu, \"ignored\": %llu, \"releases\": %u, "
		       "\"release_ms_median\": %.3f}, ",
		   ps->rate, (unsigned long long)ps->sheds, (unsigned long long)ps->helped,
		   (unsigned long long)ps->futile, (unsigned long long)ps->ignored, ps->n_release,
		   pager_pressure_release_ms(p));
		sb(&s, "\"io\": {\"chunk_bytes\": %llu, \"depth\": %u, \"source\": \"%s\", "
		       "\"probed_gbps\": %.3f, \"probed_time\": %lld, \"cache\": \"",
		   (unsigned long long)io->chunk, io->depth, io_source[io->source], io->gbps,
		   (long long)io->when);
		sb_json(&s, p->io_cache);
		sb(&s, "\", \"bytes_read\": %llu, \"busy_ms\": %.3f, \"achieved_gbps\": %.3f}, "
		       "\"models\": [",
		   (unsigned long long)read_all, busy * 1e3, achieved);
	} else {
		render_plan(&s, p);
		sb(&s, "reads         %g MiB requests, %u in flight", io->chunk / 1048576.0, io->depth);
		if (io->gbps > 0)
			sb(&s, ": the fastest measured on this device, %.2f GB/s (%s)\n", io->gbps,
			   io->source == PIO_PROBED ? "measured at start" : "measured before, remembered");
		else
			sb(&s, " (%s)\n", p->io_why ? p->io_why : io_source[io->source]);
		sb(&s, "              %.1f MiB read at %.2f GB/s while reading", read_all / 1048576.0,
		   achieved);
		if (io->gbps > 0 && achieved > 0)
			sb(&s, ", %.2f of the measured", achieved / io->gbps);
		sb(&s, "\n");
	}
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];
		uint64_t resident = 0;

		for (unsigned u = 0; u < m->lay->n_units; u++)
			if (in_memory(m, u))
				resident += m->lay->units[u].bytes;
		double tput = busy > 0 ? read_all / busy / 1e6 : 0;
		if (json) {
			sb(&s, "%s{\"name\": \"", i ? ", " : "");
			sb_json(&s, m->name);
			sb(&s, "\", \"path\": \"");
			sb_json(&s, m->real);
			sb(&s, "\", \"file_bytes\": %llu, "
			       "\"budget_bytes\": %llu, \"allowance_bytes\": %llu, "
			       "\"minimum_bytes\": %llu, \"shed\": %u, "
			       "\"resident_bytes\": %llu, \"resident_layers_planned\": %u, "
			       "\"bytes_read\": %llu, \"read_mbps\": %.1f, \"fault_wait_ms\": %.3f, "
			       "\"memfd_bytes\": %llu, \"page_cache_bytes\": %llu, "
			       "\"sparse_bytes\": %llu, \"slots\": %u, \"slot_size\": %llu, "
			       "\"slot_bytes\": %llu, \"slot_loads\": %llu, "
			       "\"remaps\": %llu, \"remap_ms\": %.3f, "
			       "\"other\": {\"state\": \"%s\", \"bytes\": %llu, \"loads\": %llu, "
			       "\"faults\": %llu}, \"layers\": [",
			   (unsigned long long)m->lay->file_size,
			   (unsigned long long)p->cfg.budget,
			   (unsigned long long)(pager_allowance(m) == UINT64_MAX ? 0 : pager_allowance(m)),
			   (unsigned long long)p->plan_models[i].minimum, m->shed,
			   (unsigned long long)resident, m->n_resident,
			   (unsigned long long)m->bytes_read, tput, m->fault_wait_ns / 1e6,
			   (unsigned long long)m->mem_bytes, (unsigned long long)m->cache_bytes,
			   (unsigned long long)m->sparse_bytes, m->n_slots,
			   (unsigned long long)m->slot_size, (unsigned long long)m->slot_bytes,
			   (unsigned long long)m->slot_loads, (unsigned long long)m->remaps,
			   m->remap_ns / 1e6,
			   state_name(m, 0), (unsigned long long)m->lay->units[0].bytes,
			   (unsigned long long)m->us[0].loads, (unsigned long long)m->us[0].faults);
			for (unsigned u = 1; u <= m->lay->n_layers; u++)
				sb(&s, "%s{\"layer\": %u, \"state\": \"%s\", \"bytes\": %llu, "
				       "\"loads\": %llu, \"faults\": %llu, \"evictions\": %llu, "
				       "\"page_cache\": \"%s\", \"stores\": %llu, \"drops\": %llu}",
				   u > 1 ? ", " : "", u - 1, state_name(m, u),
				   (unsigned long long)m->lay->units[u].bytes,
				   (unsigned long long)m->us[u].loads,
				   (unsigned long long)m->us[u].faults,
				   (unsigned long long)m->us[u].evictions, pc_name[m->us[u].pc],
				   (unsigned long long)m->us[u].stores,
				   (unsigned long long)m->us[u].drops);
			sb(&s, "], ");
			render_experts(&s, m, true);
			sb(&s, "\"speed\": {\"tokens\": %llu, \"measured_tps\": %.3f, "
			       "\"predicted_tps\": %.3f, \"compute_ms\": %.3f, \"stream_gbps\": %.3f, "
			       "\"predicted\": [",
			   (unsigned long long)m->speed.tokens, pager_measured_tps(m),
			   pager_predict_tps(m, m->n_resident), m->speed.compute_ns / 1e6,
			   pager_predict_gbps(p));
			for (unsigned q = 0; q <= 4; q++) {
				unsigned n = m->lay->n_layers * q / 4;

				sb(&s, "%s{\"resident\": %u, \"tps\": %.3f}", q ? ", " : "", n,
				   pager_predict_tps(m, n));
			}
			sb(&s, "]}, \"clients\": [");
			bool first = true;
			for (struct client *c = p->clients; c; c = c->next) {
				if (c->m != m || c->state != C_ACTIVE)
					continue;
				sb(&s, "%s{\"pid\": %d, \"kind\": \"uffd\", \"declared_bytes\": %llu, "
				       "\"kv_bytes\": %llu, "
				       "\"layer\": %d, \"faults\": %llu, \"fault_wait_ms\": %.3f, "
				       "\"passes\": %llu, \"tokens\": %llu, \"tokens_per_pass\": %.3f}",
				   first ? "" : ", ", (int)c->pid, (unsigned long long)c->declared,
				   (unsigned long long)c->kv_bytes,
				   c->pos > 0 ? c->pos - 1 : -1, (unsigned long long)c->faults,
				   c->wait_ns / 1e6, (unsigned long long)c->passes,
				   (unsigned long long)c->produced,
				   c->passes ? (double)c->produced / (double)c->passes : 0.0);
				first = false;
			}
			if (reader_active(m))
				sb(&s, "%s{\"pid\": %d, \"kind\": \"fuse\", \"layer\": %d, "
				       "\"reads\": %llu, \"direct_reads\": %llu, \"read_wait_ms\": %.3f}",
				   first ? "" : ", ", (int)m->fuse_reader->pid,
				   m->fuse_reader->pos > 0 ? m->fuse_reader->pos - 1 : -1,
				   (unsigned long long)m->fuse_reads, (unsigned long long)m->fuse_direct,
				   m->fuse_reader->wait_ns / 1e6);
			sb(&s, "]}");
			continue;
		}
		sb(&s, "model %s (%s)\n", m->name, m->real);
		sb(&s, "  budget      %.1f MiB%s, allowance %.1f MiB (streaming needs %.1f MiB)\n",
		   p->cfg.budget / 1048576.0, p->cfg.budget ? "" : " (no limit)",
		   pager_allowance(m) == UINT64_MAX ? m->lay->map_size / 1048576.0
					      : pager_allowance(m) / 1048576.0,
		   p->plan_models[i].minimum / 1048576.0);
		sb(&s, "  engines     %.1f MiB declared (KV cache, buffers), set aside from the budget%s\n",
		   pager_declared(p) / 1048576.0, engines_held(p) ? " (held for the next engine)" : "");
		sb(&s, "  resident    %.1f MiB of %.1f MiB, %u of %u layers planned resident",
		   resident / 1048576.0, m->lay->file_size / 1048576.0, m->n_resident,
		   m->lay->n_layers);
		if (m->shed)
			sb(&s, " (%u shed under memory pressure)", m->shed);
		sb(&s, "\n");
		sb(&s, "  layers      [");
		for (unsigned u = 1; u <= m->lay->n_layers; u++)
			sb(&s, "%c", state_char(m, u));
		sb(&s, "]  (R resident, L loaded, l loading, e evicting, . absent; other: %c)\n",
		   state_char(m, 0));
		sb(&s, "  read        %.1f MiB; fault wait %.1f ms\n", m->bytes_read / 1048576.0,
		   m->fault_wait_ns / 1e6);
		if (m->n_slots)
			sb(&s, "  slots       %u of %.1f MiB for %s, %.1f MiB in memory, "
			       "%llu loads into them\n",
			   m->n_slots, m->slot_size / 1048576.0,
			   m->lay->n_experts ? "experts" : "streamed layers", m->slot_bytes / 1048576.0,
			   (unsigned long long)m->slot_loads);
		if (m->lay->sparse.len)
			sb(&s, "  embedding   %.1f MiB, read a block at a time: %.1f MiB in memory\n",
			   m->lay->sparse.len / 1048576.0, m->sparse_bytes / 1048576.0);
		render_experts(&s, m, false);
		render_speed(&s, m);
		sb(&s, "  per layer   loads/faults:");
		for (unsigned u = 1; u <= m->lay->n_layers; u++)
			sb(&s, " %llu/%llu", (unsigned long long)m->us[u].loads,
			   (unsigned long long)m->us[u].faults);
		if (m->fuse_reader)
			sb(&s, "\n  memory      %.1f MiB in the memfd, %.1f MiB in the mount's page cache",
			   m->mem_bytes / 1048576.0, m->cache_bytes / 1048576.0);
		sb(&s, "\n  clients     %u\n", m->n_clients + reader_active(m));
		for (struct client *c = p->clients; c; c = c->next)
			if (c->m == m && c->state == C_ACTIVE)
				sb(&s, "    pid %-7d uffd  declares %.1f MiB (KV cache %.1f MiB), at layer %d, "
				       "%llu faults, waited %.1f ms, %.2f tokens per pass\n",
				   (int)c->pid, c->declared / 1048576.0, c->kv_bytes / 1048576.0,
				   c->pos > 0 ? c->pos - 1 : -1,
				   (unsigned long long)c->faults, c->wait_ns / 1e6,
				   c->passes ? (double)c->produced / (double)c->passes : 0.0);
		if (reader_active(m))
			sb(&s, "    pid %-7d fuse  at layer %d, %llu reads (%llu from the file), waited %.1f ms\n",
			   (int)m->fuse_reader->pid,
			   m->fuse_reader->pos > 0 ? m->fuse_reader->pos - 1 : -1,
			   (unsigned long long)m->fuse_reads, (unsigned long long)m->fuse_direct,
			   m->fuse_reader->wait_ns / 1e6);
	}
	if (json)
		sb(&s, "]}\n");
	*len = s.len;
}

