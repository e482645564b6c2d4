/*
 * test_plan.c - the residency plan as arithmetic (pager/plan.c), without a
 * daemon: minimums, budgets, modes, several models (equal shares, and by
 * the gain the speed predictor expects), pressure's shedding and its
 * restoring, the spread order.
 *
 * Shapes are 8B-like (32 layers of 117 MiB, 650 MiB of other tensors) and
 * 1B-like; sizes in MiB to keep the cases readable.
 */
#include "plan_i.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MiB (1ull << 20)

static int failures;

static void check(int ok, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("%s ", ok ? "ok  " : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	if (!ok)
		failures++;
}

/* A model of n layers of `layer` MiB and `other` MiB besides, window 2. */
static struct plan_model model(unsigned n, uint64_t layer, uint64_t other)
{
	struct plan_model m = { .n_layers = n, .window = 2, .layer_bytes = layer * MiB };

	m.full = (other + n * layer) * MiB;
	m.minimum = plan_minimum(m.full, other * MiB, layer * MiB, n, 2, 0, 0);
	return m;
}

static void minimums(void)
{
	struct plan_model big = model(32, 117, 650), tiny = model(2, 1, 1);

	check(big.minimum == (650 + 3 * 117) * MiB,
	      "minimum: the other tensors and the window's three layers (%llu MiB)",
	      (unsigned long long)(big.minimum / MiB));
	check(tiny.minimum == tiny.full,
	      "minimum: a model smaller than its window needs only itself (%llu MiB)",
	      (unsigned long long)(tiny.minimum / MiB));
	check(plan_minimum(100 * MiB, 10 * MiB, 20 * MiB, 4, 1, 32 * MiB, 32 * MiB) ==
		      (10 + 40 + 32 + 32) * MiB,
	      "minimum: the sparse cache and the mount's buffers count");
	check(plan_minimum(60 * MiB, 10 * MiB, 20 * MiB, 4, 1, 32 * MiB, 32 * MiB) ==
		      (60 + 32) * MiB,
	      "minimum: never more than the model held whole, buffers on top");
}

static void budgets(void)
{
	struct plan_model m = model(32, 117, 650);
	struct plan pl = { .budget = 2560 * MiB, .resident = -1 };

	plan_compute(&pl, &m, 1);
	/* 2560 - 1001 = 1559 MiB for layers: 13 of 117 MiB */
	check(m.n_resident == 13 && m.allowance == pl.budget,
	      "2.5 GiB: 13 layers resident, the whole budget allowed (%u, %llu MiB)", m.n_resident,
	      (unsigned long long)(m.allowance / MiB));
	pl.budget = 1001 * MiB;
	plan_compute(&pl, &m, 1);
	check(m.n_resident == 0, "the minimum itself: everything streams (%u)", m.n_resident);
	pl.budget = 8192 * MiB;
	plan_compute(&pl, &m, 1);
	check(m.n_resident == 32 && m.allowance == m.full,
	      "8 GiB: all resident, the allowance is the model (%u)", m.n_resident);
	pl.budget = m.full - 1;
	plan_compute(&pl, &m, 1);
	/* 28 resident and 3 slots for the 4 streamed fit; 29 and 3 is the model */
	check(m.n_resident == 28,
	      "just short of the whole model: the layers and the window's slots fit (%u)",
	      m.n_resident);
	pl.budget = 0;
	plan_compute(&pl, &m, 1);
	check(m.n_resident == 32 && m.allowance == UINT64_MAX, "no budget: all resident");
	pl.budget = 2560 * MiB;
	pl.resident = 5;
	plan_compute(&pl, &m, 1);
	check(m.n_resident == 5, "--resident 5: five (%u)", m.n_resident);
}

static void declared(void)
{
	struct plan_model m = model(32, 117, 650);
	struct plan pl = { .budget = 4096 * MiB, .resident = -1 };
	unsigned idle;

	plan_compute(&pl, &m, 1);
	idle = m.n_resident;
	pl.declared = 468 * MiB; /* four layers' worth of KV cache */
	plan_compute(&pl, &m, 1);
	check(m.n_resident == idle - 4 && pl.engines == pl.declared,
	      "an engine's 468 MiB takes four layers (%u -> %u)", idle, m.n_resident);
	check(plan_engine_limit(&pl, &m, 1) == (4096 - 1001) * MiB,
	      "engines may declare the budget less the minimum (%llu MiB)",
	      (unsigned long long)(plan_engine_limit(&pl, &m, 1) / MiB));
}

static void modes(void)
{
	struct plan_model m = model(32, 117, 650);
	struct plan pl = { .budget = 4096 * MiB, .resident = -1 };
	unsigned n[3];
	enum plan_mode mode;

	for (int i = 0; i < 3; i++) {
		pl.mode = (enum plan_mode)i;
		plan_compute(&pl, &m, 1);
		n[i] = m.n_resident;
	}
	/* spare 3095 MiB: speed 26 layers, balanced 3/4 of it 19, context 1/2 13 */
	check(n[0] == 26 && n[1] == 19 && n[2] == 13,
	      "modes: speed %u, balanced %u, context %u layers", n[0], n[1], n[2]);
	pl.mode = PLAN_BALANCED;
	pl.declared = 1024 * MiB; /* more than balanced's quarter (773 MiB) */
	plan_compute(&pl, &m, 1);
	check(pl.engines == pl.declared && m.n_resident == 17,
	      "balanced: a declaration above the mode's room takes it over (%u)", m.n_resident);
	pl.declared = 100 * MiB; /* within the room: the layers keep theirs */
	plan_compute(&pl, &m, 1);
	check(m.n_resident == 19, "balanced: a declaration within the room costs no layer");
	check(!plan_mode_parse("context", &mode) && mode == PLAN_CONTEXT &&
		      plan_mode_parse("fast", &mode) < 0,
	      "modes parse by name and refuse others");
}

static void several_models(void)
{
	struct plan_model ms[2] = { model(32, 117, 650), model(12, 1, 1) };
	struct plan pl = { .budget = 2560 * MiB, .resident = -1 };

	plan_compute(&pl, ms, 2);
	check(ms[1].n_resident == 12 && ms[1].allowance >= ms[1].minimum,
	      "a small model beside a big one gets what it needs and keeps its layers (%u, "
	      "%llu MiB)", ms[1].n_resident, (unsigned long long)(ms[1].allowance / MiB));
	check(ms[0].allowance + ms[1].allowance <= pl.budget,
	      "two models share one budget (%llu + %llu MiB <= %llu)",
	      (unsigned long long)(ms[0].allowance / MiB),
	      (unsigned long long)(ms[1].allowance / MiB), (unsigned long long)(pl.budget / MiB));
	check(pl.minimum == ms[0].minimum + ms[1].minimum, "the minimums add up");

	struct plan_model two[2] = { model(32, 117, 650), model(32, 117, 650) };

	pl.budget = 4096 * MiB;
	plan_compute(&pl, two, 2);
	check(two[0].n_resident == two[1].n_resident && two[0].n_resident == 8,
	      "two 8B models in 4 GiB: the rest split evenly, 8 layers each (%u, %u)",
	      two[0].n_resident, two[1].n_resident);
}

/* The predictor's curve for a 32-layer model of 117 MiB layers: a token
 * takes the longer of its compute (compute_s) and reading its streamed
 * layers at 2 GB/s (pager/predict.c); the first r of the spread order are
 * resident. */
static void curve(double *tps, double compute_s)
{
	for (unsigned r = 0; r <= 32; r++) {
		double read_s = (32 - r) * 117.0 * MiB / 2e9;

		tps[r] = 1 / (read_s > compute_s ? read_s : compute_s);
	}
}

/* The sum of the logarithms of the speeds the plan predicts. */
static double log_speed(const struct plan_model *ms, unsigned n)
{
	double s = 0;

	for (unsigned i = 0; i < n; i++)
		s += log(ms[i].tps[ms[i].n_resident]);
	return s;
}

static void by_gain(void)
{
	double fast[33], slow[33], same[33];
	struct plan_model ms[2] = { model(32, 117, 650), model(32, 117, 650) };
	struct plan pl = { .budget = 4096 * MiB, .resident = -1 };

	curve(fast, 0.25);
	curve(slow, 3.0); /* its compute hides every read: layers buy nothing */
	curve(same, 0.25);
	plan_compute(&pl, ms, 2);
	check(!pl.by_gain && ms[0].n_resident == 8 && ms[1].n_resident == 8,
	      "no speed known yet: equal shares (%u, %u)", ms[0].n_resident, ms[1].n_resident);

	ms[0].tps = fast;
	plan_compute(&pl, ms, 2);
	check(!pl.by_gain, "one model's speed known, not the other's: still equal shares");

	ms[1].tps = slow;
	plan_compute(&pl, ms, 2);
	/* 4096 - 2 x 1001 MiB = 2094 MiB: 17 layers of 117 in one model (two
	 * equal shares held 8 each) */
	check(pl.by_gain && ms[0].n_resident == 17 && ms[1].n_resident == 0,
	      "a model whose compute hides its reads gets no layers; the other all 17 (%u, %u)",
	      ms[0].n_resident, ms[1].n_resident);
	check(ms[0].allowance + ms[1].allowance <= pl.budget &&
		      ms[1].allowance >= ms[1].minimum,
	      "by gain: within the budget, and every model still gets its minimum");

	ms[1].tps = same;
	plan_compute(&pl, ms, 2);
	double gain = log_speed(ms, 2);
	unsigned a = ms[0].n_resident, b = ms[1].n_resident;
	struct plan_model eq[2] = { ms[0], ms[1] };
	eq[0].n_resident = eq[1].n_resident = 8;
	check(a + b >= 16 && gain >= log_speed(eq, 2) - 1e-9,
	      "two alike: the split (%u, %u) predicts at least the speed of equal shares "
	      "(product of speeds %.3f >= %.3f)", a, b, exp(gain), exp(log_speed(eq, 2)));

	struct plan_model three[3] = { model(32, 117, 650), model(32, 117, 650), model(12, 1, 1) };
	double tiny[13];

	for (unsigned r = 0; r <= 12; r++)
		tiny[r] = 100 + r;
	three[0].tps = fast;
	three[1].tps = slow;
	three[2].tps = tiny;
	plan_compute(&pl, three, 3);
	check(three[2].n_resident == 12, "by gain too, a small model is held whole (%u)",
	      three[2].n_resident);
}

static void shedding(void)
{
	struct plan_model m = model(32, 117, 650);
	struct plan pl = { .budget = 4096 * MiB, .resident = -1 };
	unsigned full, shed;

	plan_compute(&pl, &m, 1);
	full = m.n_resident;
	m.shed = (full + 3) / 4;
	plan_compute(&pl, &m, 1);
	shed = m.n_resident;
	check(shed == full - (full + 3) / 4, "pressure sheds a quarter (%u -> %u)", full, shed);
	m.shed /= 2;
	plan_compute(&pl, &m, 1);
	check(m.n_resident > shed && m.n_resident < full,
	      "calm gives half of it back (%u -> %u)", shed, m.n_resident);
	m.shed = 1000;
	plan_compute(&pl, &m, 1);
	check(m.n_resident == 0, "shedding more than there is leaves none, not a wrap");
}

static void order(void)
{
	unsigned rank[32], first8[32] = { 0 }, n = 0;
	int spread = 1;

	check(!plan_order(32, rank), "spread order of 32 layers");
	for (unsigned l = 0; l < 32; l++)
		if (rank[l] < 8)
			first8[n++] = l;
	for (unsigned i = 0; i < n; i++)
		if ((first8[(i + 1) % n] + 32 - first8[i]) % 32 != 4)
			spread = 0;
	check(n == 8 && spread, "the first 8 resident layers are every fourth one");
	for (unsigned k = 1; k <= 32; k++) {
		unsigned in = 0;

		for (unsigned l = 0; l < 32; l++)
			in += rank[l] < k;
		if (in != k)
			spread = 0;
	}
	check(spread, "the ranks are a permutation: plans are nested");
}

int main(void)
{
	minimums();
	budgets();
	declared();
	modes();
	several_models();
	by_gain();
	shedding();
	order();
	printf("%s\n", failures ? "FAILED" : "all plan tests passed");
	return failures ? 1 : 0;
}
