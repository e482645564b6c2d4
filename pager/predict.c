/*
 * predict.c - how fast an engine decodes with n of a model's layers
 * resident, learned from what the engines and the reader do.
 *
 *   tok/s(n) = 1 / max(C, S(n) / B)
 *
 *   C     the engine's compute time a token: the wall time of its decode
 *         passes (PASS messages) less the time it waited on faults in them
 *         (the daemon times every fault it resolves);
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
 * prediction follows a machine whose storage or CPU gets busier.  Nothing here is a constant of this machine:
 * before an engine has decoded, there is no prediction (0).
 */
#include "server_i.h"

#include <stdlib.h>
#include <string.h>

#define NEW_WEIGHT 0.25
#define MIN_BUSY_NS 50000000ull /* a second with this much reading counts */

static double blend(double avg, double x)
{
	return avg > 0 ? avg + NEW_WEIGHT * (x - avg) : x;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of the last reports' values (v: a ring of SPEED_SAMPLES). */
static double median(const double *v, unsigned n)
{
	double s[SPEED_SAMPLES];

	if (n > SPEED_SAMPLES)
		n = SPEED_SAMPLES;
	memcpy(s, v, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* Medians, not averages: an engine's first token (the model coming into
 * memory) or one disturbed by another program is an outlier to ignore. */
void pager_predict_pass(struct client *c, uint32_t tokens, uint64_t wall_ns)
{
	struct model *m = c->m;
	uint64_t waited = c->wait_ns - c->wait_reported;
	double compute;
	unsigned k;

	c->wait_reported = c->wait_ns;
	if (!tokens || wall_ns == 0 || wall_ns > 3600ull * 1000000000)
		return;
	compute = waited < wall_ns ? (double)(wall_ns - waited) : 0;
	k = m->speed.reports++ % SPEED_SAMPLES;
	m->speed.wall[k] = (double)wall_ns / tokens;
	m->speed.compute[k] = compute / tokens;
	m->speed.wall_ns = median(m->speed.wall, m->speed.reports);
	m->speed.compute_ns = median(m->speed.compute, m->speed.reports);
	m->speed.tokens += tokens;
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

double pager_predict_tps(const struct model *m, unsigned n)
{
	double gbps = pager_predict_gbps(m->p), t = m->speed.compute_ns;
	uint64_t streamed = 0;

	if (m->speed.tokens == 0 || t <= 0)
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
