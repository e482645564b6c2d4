/*
 * plan_i.h - how the budget is shared: the residency plan as arithmetic.
 *
 * plan_compute() knows nothing of clients, faults, FUSE or io_uring: given
 * the budget, what the engines declared, the mode and each model's shape,
 * it says how much each model may hold and how many of its layers stay
 * resident.  residency.c feeds it and carries the plan out; tests/test_plan.c
 * checks it without a daemon.
 */
#ifndef STRATA_PLAN_I_H
#define STRATA_PLAN_I_H

#include <stdbool.h>
#include <stdint.h>

/*
 * How the memory beyond what streaming needs is split between resident
 * layers and the engines' own memory (KV cache, buffers):
 *   speed     layers take all the engines have not declared;
 *   balanced  a quarter of it stays free for engines (a longer context, a
 *             second engine) even before they declare it;
 *   context   half of it stays free for engines.
 * An engine's declaration always comes first: it shrinks the layers' share
 * when it is more than the mode keeps free.
 */
enum plan_mode { PLAN_SPEED, PLAN_BALANCED, PLAN_CONTEXT };

struct plan_model {
	/* in */
	uint64_t full;        /* what it holds with every layer resident */
	uint64_t minimum;     /* what streaming it needs (plan_minimum) */
	uint64_t layer_bytes; /* an average layer */
	unsigned n_layers;
	unsigned window;      /* streamed layers read ahead */
	unsigned shed;        /* layers memory pressure demoted */
	/* predicted decode tok/s with 0..n_layers layers resident (n_layers + 1
	 * values, the speed predictor's), or NULL: nothing decoded yet */
	const double *tps;
	/* out */
	uint64_t allowance;   /* what it may hold; UINT64_MAX: no limit */
	unsigned n_resident;  /* layers kept resident */
};

struct plan {
	/* in */
	uint64_t budget;   /* 0: no limit */
	uint64_t declared; /* the engines' own memory */
	enum plan_mode mode;
	int resident;      /* layers resident in every model; -1: as the budget allows */
	/* out */
	uint64_t minimum;  /* the models' minimums together */
	uint64_t engines;  /* kept for engines: their declarations or the mode's room */
	uint64_t room;     /* the mode's room for engines (UINT64_MAX: no budget) */
	uint64_t layers;   /* for resident layers, all models */
	bool by_gain;      /* they were shared by predicted gain, not equally */
};

/* What streaming a model needs at least: its other tensors (`other`: unit
 * 0), the layer in use and `window` read ahead (each at most `max_layer`),
 * `sparse` (blocks of a tensor read a block at a time), never more than
 * `full` (the model held whole); then `buffers` (the mount's staging) on
 * top. */
uint64_t plan_minimum(uint64_t full, uint64_t other, uint64_t max_layer, unsigned n_layers,
		      unsigned window, uint64_t sparse, uint64_t buffers);

/*
 * The order in which a model's n layers become resident as its plan grows:
 * rank[l] is layer l's place.  Each next layer is the one farthest
 * (cyclically: after the last layer comes layer 0 of the next token) from
 * those already chosen, ties to the lowest index.  Any prefix is spread
 * evenly over the model, so streamed layers have resident neighbours whose
 * compute time hides their reads, and the sets are nested: a plan that grows
 * or shrinks by k layers (a client's declared memory, pressure) loads or
 * evicts k layers and keeps every other one.  -ENOMEM, or 0.
 */
int plan_order(unsigned n, unsigned *rank);

/* Fill the outputs of pl and of each of the n models. */
void plan_compute(struct plan *pl, struct plan_model *ms, unsigned n);

/* The most the engines may declare together: the budget less the minimums
 * (UINT64_MAX without a budget). */
uint64_t plan_engine_limit(const struct plan *pl, const struct plan_model *ms, unsigned n);

const char *plan_mode_name(enum plan_mode mode);
/* "speed", "balanced", "context" -> mode; -EINVAL otherwise. */
int plan_mode_parse(const char *s, enum plan_mode *out);

#endif
