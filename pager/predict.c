/*
 * predict.c - how fast an engine decodes with n of a model's layers
 * resident, learned from what the engines and the reader do.
 *
 *   tok/s(n) = 1 / max(C, S(n) / B)
 *
 *   C(n)  the engine's compute time a token: the wall time of its decode
 *         passes (PASS messages) less the time it waited on faults in them
 *         (the daemon times every fault it resolves).  With the engine's
 *         per-layer CPU times it is outside + n * resident + (L - n) *
 *         streamed: a resident layer's CPU time, and a streamed layer's
 *         share of the rest (pager_predict_pass);
 *   S(n)  the bytes a token streams with the first n layers of the spread
 *         order resident: the other layers' bytes;
 *   B     the read bandwidth streaming achieves: bytes read over the time
 *         reads were in flight, each second that had reads; the device's
 *         measured best (probe.c) until the first such second.
 *
 * Reading runs ahead of the engine (the window), so a token takes the longer
 * of its compute and its reads, not their sum.  C is the median of the last
 * reports (an engine's first token, the model coming into memory, is an
 * outlier), B a running average (weight 1/4 for the newest), so the
 * prediction follows a machine whose storage or CPU gets busier.  Nothing
 * here is a constant of this machine: before an engine has decoded, there
 * is no prediction (0).
 */
#include "server_i.h"
#include "proto_i.h"

#define NEW_WEIGHT 0.25
/* With several models, the budget is shared again by the predictor's
 * curves (plan.c) at a model's first report, and once the median of a few
 * has left its first token (the model coming into memory) behind. */
#define PLAN_AFTER_REPORTS 4
#define MIN_BUSY_NS 50000000ull /* a second with this much reading counts */

static double blend(double avg, double x)
{
	return avg > 0 ? avg + NEW_WEIGHT * (x - avg) : x;
}

/* Record x in ring v (the report's slot k) and return the median of the
 * reports so far (at most SPEED_SAMPLES of them). */
static double sample(double *v, unsigned k, unsigned reports, double x)
{
	v[k] = x;
	return pager_median(v, reports < SPEED_SAMPLES ? reports : SPEED_SAMPLES);
}

/*
 * Medians, not averages: an engine's first token (the model coming into
 * memory) or one disturbed by another program is an outlier to ignore.
 * With per-layer times (the engine thread's CPU time in each layer), a
 * token's compute C (wall less waits) splits into: the pass outside the
 * layers, a resident layer (its CPU time: what it costs with nothing
 * streaming), and a streamed layer, which gets the rest.  The rest is
 * what streaming costs the engine beside its waits: the remapping, the
 * tripwire faults' round trips, and the cores the reads take from it while
 * it computes the resident layers too, so it scales with the layers that
 * stream.
 */
void pager_predict_pass(struct client *c, uint32_t tokens, uint64_t wall_ns,
			uint32_t outside_us, const uint8_t *layer_us, uint32_t n_layers)
{
	struct model *m = c->m;
	struct speed *sp = &m->speed;
	uint64_t waited = c->wait_ns - c->wait_reported;
	unsigned L = m->lay->n_layers, k, n_res = 0;
	double compute, res = 0, outside;

	c->wait_reported = c->wait_ns;
	if (!tokens || wall_ns == 0 || wall_ns > 3600ull * 1000000000)
		return;
	compute = waited < wall_ns ? (double)(wall_ns - waited) / tokens : 0;
	k = sp->reports++ % SPEED_SAMPLES;
	sp->wall_ns = sample(sp->wall, k, sp->reports, (double)wall_ns / tokens);
	sp->compute_ns = sample(sp->compute, k, sp->reports, compute);
	sp->tokens += tokens;
	if ((sp->reports == 1 || sp->reports == PLAN_AFTER_REPORTS) && m->p->n_models > 1)
		pager_replan(m->p);
	if (n_layers != L || !L)
		return;
	for (unsigned l = 0; l < L; l++)
		if (m->us[l + 1].resident && m->us[l + 1].state == U_LOADED) {
			res += proto_get_u32(layer_us + 4 * l) * 1e3 / tokens;
			n_res++;
		}
	outside = outside_us * 1e3 / tokens;
	k = sp->layers++ % SPEED_SAMPLES;
	sp->outside_ns = sample(sp->outside, k, sp->layers, outside);
	sp->last_full = n_res == L;
	if (!n_res)
		return;
	res /= n_res;
	k = sp->n_res++ % SPEED_SAMPLES;
	sp->resident_ns = sample(sp->resident, k, sp->n_res, res);
	if (n_res == L) {
		double slack = compute - outside - L * res;

		k = sp->n_slack++ % SPEED_SAMPLES;
		sp->slack_ns = sample(sp->slack, k, sp->n_slack, slack > 0 ? slack : 0);
	} else {
		double str = (compute - outside - n_res * res) / (L - n_res);

		k = sp->n_str++ % SPEED_SAMPLES;
		sp->streamed_ns = sample(sp->streamed, k, sp->n_str, str > res ? str : res);
	}
}

void pager_predict_tick(struct pager *p)
{
	uint64_t bytes = 0, busy = pio_busy_ns(p->io);

	for (unsigned i = 0; i < p->n_models; i++)
		bytes += p->models[i].bytes_read;
	if (busy - p->stream.busy_ns >= MIN_BUSY_NS)
		p->stream.gbps = blend(p->stream.gbps, (double)(bytes - p->stream.bytes) /
							       (double)(busy - p->stream.busy_ns));
	if (busy - p->stream.busy_ns >= MIN_BUSY_NS || p->stream.busy_ns == 0) {
		p->stream.bytes = bytes;
		p->stream.busy_ns = busy;
	}
}

double pager_predict_gbps(const struct pager *p)
{
	return p->stream.gbps > 0 ? p->stream.gbps : p->io_params.gbps;
}

/* A token's compute with n layers resident: from the per-layer times when
 * there are some (a streamed layer costs at least what a resident one
 * does), else what the engines measured at the plan they ran.  The CPU
 * times leave out the time the engine's thread is off its core (waiting
 * for the other threads at a barrier, preempted); while streaming, the
 * streamed layers' share takes that in (it is the rest of the measured
 * compute), and with every layer resident the slack does, so the plan the
 * engine runs predicts what it measured. */
static double compute_ns(const struct model *m, unsigned n)
{
	const struct speed *sp = &m->speed;
	unsigned L = m->lay->n_layers;
	double res = sp->resident_ns, str = sp->streamed_ns;

	if (!sp->n_res)
		return sp->compute_ns; /* nothing resident yet to learn from */
	if (!sp->n_str || str < res)
		str = res;
	return sp->outside_ns + n * res + (L - n) * str + (sp->last_full ? sp->slack_ns : 0);
}

double pager_predict_tps(const struct model *m, unsigned n)
{
	double gbps = pager_predict_gbps(m->p), t;
	uint64_t streamed = 0;

	if (m->speed.tokens == 0)
		return 0;
	t = compute_ns(m, n);
	if (t <= 0)
		return 0;
	for (unsigned l = 0; l < m->lay->n_layers; l++)
		if (m->rank[l] >= n)
			streamed += m->lay->units[l + 1].bytes;
	if (streamed && gbps <= 0)
		return 0; /* nothing known of the device yet */
	if (streamed && streamed / gbps > t)
		t = streamed / gbps;
	return 1e9 / t;
}

double pager_measured_tps(const struct model *m)
{
	return m->speed.wall_ns > 0 ? 1e9 / m->speed.wall_ns : 0;
}
