/*
 * server_i.h - stratad's shared state: models, units, clients (not installed).
 *
 * server.c owns the sockets, the protocol and the event loop; residency.c
 * owns what is in memory and why (loading, eviction, the policy, faults);
 * status.c renders the daemon's view for stratactl.  One thread runs all of
 * it, so nothing here is locked.
 */
#ifndef STRATA_SERVER_I_H
#define STRATA_SERVER_I_H

#include "experts_i.h"
#include "io_i.h"
#include "pager.h"
#include "pager_i.h"
#include "plan_i.h"

#include <linux/userfaultfd.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define DEFAULT_WINDOW 2
#define MAX_CLIENTS 256
/* 150 ms stalled within 2 s (windows must be multiples of 2 s for
 * processes without CAP_SYS_RESOURCE, and were refused otherwise here):
 * pressure.c. */
#define PSI_TRIGGER "some 150000 2000000"

enum ustate { U_ABSENT, U_LOADING, U_LOADED, U_EVICTING };

/* A unit in the FUSE mount's page cache, as far as the daemon knows (the
 * kernel may reclaim pages behind its back; the count errs on the high side). */
enum pcstate {
	PC_NONE,
	PC_SOME,   /* reads put some of it there */
	PC_NOTRIP, /* stored, except its tripwire page */
	PC_ALL,    /* stored whole */
};

/* A job on the notifier thread for a unit (fuse.c). */
enum pcjob { PC_IDLE, PC_STORING, PC_DROPPING };

struct ustat {
	enum ustate state;
	bool resident;      /* policy: keep in memory */
	unsigned reads_left;
	unsigned punches_left;
	bool want_load;     /* load again once the eviction completes */
	bool demand_waits;  /* a client waits for it, and it for a slot (pager_demand) */
	int io_err;
	uint8_t pc;         /* enum pcstate */
	uint8_t pc_job;     /* enum pcjob */
	/* a store streaming through the mount's staging slots (fuse.c) */
	unsigned st_ext;     /* extent being read */
	uint64_t st_off;     /* next offset to read in it */
	unsigned st_pending; /* chunks being read or stored */
	bool st_whole;       /* store the tripwire page too */
	int st_err;
	bool pc_read_during; /* a read refilled it while it was being dropped */
	int slot;            /* the streaming slot it is read into; -1: the memfd */
	bool shed_pending;   /* demoted by pressure, its memory not freed yet */
	unsigned remaps_left; /* clients yet to map it back from the memfd (evicting) */
	uint64_t loads, faults, evictions, bytes_read;
	uint64_t stores, drops; /* into and out of the mount's page cache */
};

struct client;
struct model;

struct consumer_ops;

/* What a read or punch on the ring is for (io.c calls back with it). */
struct io_tag {
	struct model *m;
	unsigned u;
	enum { IO_LOAD, IO_PUNCH, IO_STAGE, IO_DIRECT } kind;
	/* not NULL: a read of that consumer's own (fuse.c: IO_STAGE, IO_DIRECT),
	 * handed back to it */
	const struct consumer_ops *owner;
	void *ptr;      /* IO_DIRECT: the read (fuse.c) */
	/* IO_STAGE: the mount's staging slot and the file range read into it */
	unsigned slot;
	uint64_t off, len;
	unsigned parts; /* io chunks still to complete */
	int err;
};

/* A fault a client is blocked on until its unit is read. */
struct waiter {
	struct waiter *next;
	struct client *c;
	uint64_t off;
	uint64_t since_ns;
};

/* What a model's engines' decode passes took (predict.c): per token, in the
 * last reports (rings) and their medians. */
#define SPEED_SAMPLES 16
struct speed {
	double wall[SPEED_SAMPLES], compute[SPEED_SAMPLES];
	unsigned reports;
	double wall_ns, compute_ns;  /* wall time, and it less the waits */
	uint64_t tokens;
	/* from the per-layer times: outside the layers, a resident layer
	 * (its CPU time), a streamed layer (the rest of the compute) */
	double outside[SPEED_SAMPLES], resident[SPEED_SAMPLES], streamed[SPEED_SAMPLES];
	unsigned layers, n_res, n_str;
	double outside_ns, resident_ns, streamed_ns;
	/* with every layer resident: the compute the CPU times leave out (the
	 * engine thread off its core: barrier waits, preemption) */
	double slack[SPEED_SAMPLES];
	unsigned n_slack;
	double slack_ns;
	bool last_full; /* the last report had every layer resident */
};

/* A model's expert cache (experts.c), with expert units. */
struct model_experts {
	struct expert_cache cache; /* which to keep */
	uint32_t *pins;     /* per expert: the clients whose last ROUTE or HINT has it */
	uint8_t *ahead;     /* per expert: read on a HINT, not routed to since */
	uint64_t held;      /* bytes of experts loading, loaded or being evicted */
	uint64_t capacity;  /* what the plan leaves them; UINT64_MAX: no limit */
	uint64_t hits, misses; /* routed experts in memory or not, as routed */
	uint64_t bytes_read;   /* experts read */
	uint64_t passes;       /* passes routed (a pass of one token decodes one) */
	/* the lookahead (HINT): experts hinted, read ahead on a hint, routed
	 * to when a hint had named them (read ahead or not), routed to in a
	 * layer that had a hint, and routed to while still being read */
	uint64_t hinted, ahead_loads, ahead_used, hint_right, hint_routed, in_flight;
	bool demand_waits;     /* a fault's expert waits for a slot (experts.c) */
	bool full;             /* the cache has evicted: loads go to slots */
	uint64_t fuse_misses;  /* experts the mount's reader read from the file */
	int fuse_layer;        /* the layer of the last of them */
};

struct model {
	struct pager *p;
	unsigned idx;
	char *path, *real, *name;
	int fd;   /* O_DIRECT */
	struct stat file_st;     /* fd's, at open: a unit read finds it changed
				  * (residency.c, file_changed) */
	bool changed;            /* it did: nothing more is read from it */
	int memfd;
	uint8_t *map;
	struct pager_layout *lay;
	struct ustat *us;
	struct waiter **waiters; /* per unit */
	unsigned *rank;          /* per layer: its place in the residency order */
	double *plan_tps;        /* predicted tok/s with 0..L resident, for the plan */
	unsigned n_resident;     /* layers planned resident: rank < n_resident */
	unsigned shed;           /* layers demoted by memory pressure */
	unsigned copies;         /* of the resident layers, as planned: 2 with
				  * engines and the mount's readers at once */
	uint64_t mem_bytes;      /* units loading or loaded */
	uint64_t sparse_bytes;   /* sparse blocks in the memfd (residency.c) */
	uint64_t fuse_sparse_bytes; /* sparse pages the mount's reads cached */
	bool fuse_sparse_busy;   /* their drop is in flight */
	uint64_t bytes_read;
	uint64_t fault_wait_ns;
	unsigned n_clients;
	int node;                /* NUMA node the image is bound to, -1 none */
	struct client *fuse_reader;      /* the mount's readers, for the policy */
	struct fuse_wait *fuse_waiting;  /* FUSE reads waiting for units */
	uint64_t fuse_reads, fuse_direct; /* reads; those read from the file itself */
	uint64_t cache_bytes;    /* units (partly) in the mount's page cache */
	uint64_t fuse_lookups;   /* the kernel's references to the file's inode */
	bool fuse_inode;         /* the kernel has the file's inode (it was opened) */
	/* Streaming slots (residency.c): a second memfd whose pages are reused
	 * for one streamed layer after another.  n_slots 0: none (--fuse). */
	int slotfd;
	uint8_t *slot_map;
	unsigned n_slots;
	uint64_t slot_size;
	int *slot_unit;          /* per slot: the unit in it, -1 free */
	bool *slot_touched;      /* its pages exist (held from then on) */
	uint64_t slot_bytes;     /* bytes of touched slots */
	unsigned slots_free;     /* touched slots holding no unit */
	unsigned slots_vacating; /* slots whose unit is leaving (REMAPs back unanswered) */
	uint64_t slot_loads;     /* loads into a slot */
	uint64_t remaps;         /* REMAPs its clients answered */
	uint64_t remap_ns;       /* their time from sent to answered, summed */
	struct speed speed;      /* what its engines' decode passes took */
	struct model_experts ex; /* with expert units (layout.c) */
};

/* What a client maps at a slotted unit's range. */
enum view { VIEW_MODEL, VIEW_SLOT_PENDING, VIEW_SLOT, VIEW_MODEL_PENDING };

/* A REMAP for a client: waiting to be sent (at most REMAPS_IN_FLIGHT are
 * unanswered at once: a client's socket queues only a few messages), then
 * waiting for its REMAPPED. */
#define REMAPS_IN_FLIGHT 4
struct remap_wait {
	struct remap_wait *next;
	uint32_t seq;
	unsigned u;
	bool to_slot;
	bool sent;
	uint64_t sent_ns;
	uint32_t len;
	uint8_t msg[]; /* the payload */
};

enum cstate { C_HELLO, C_REGISTER, C_ACTIVE, C_CONTROL, C_FUSE /* a mount's readers */ };

struct client {
	struct client *next;
	struct pager *p;
	int fd;
	int uffd;
	enum cstate state;
	pid_t pid;
	uid_t uid;
	struct model *m;
	uint64_t base;
	uint64_t declared;
	uint64_t kv_bytes;    /* of declared, its KV cache (DECLARE) */
	uint64_t passes, produced; /* decode passes and the tokens they gave (PASS) */
	int pos;              /* last layer unit the client entered, -1 unknown */
	uint64_t faults;
	uint64_t wait_ns;     /* time at least one of its faults waited (uffd.c) */
	unsigned n_waiting;   /* its faults waiting now */
	uint64_t waiting_since; /* since n_waiting went from 0 to 1 */
	uint64_t wait_reported; /* wait_ns at its last PASS (predict.c) */
	bool dead;
	bool ready;                    /* READY sent: it may get REMAPs */
	struct uffd_msg *backlog;      /* faults read while draining its uffd */
	unsigned n_backlog, cap_backlog;
	uint8_t *view;                 /* per unit: enum view (slotted units) */
	struct remap_wait *remaps, **remaps_tail; /* in order: sent, then unsent */
	unsigned remaps_sent;
	uint32_t remap_seq;
	/* its last ROUTE (experts.c): the expert units it pins */
	unsigned *route;
	uint32_t n_route;
	int route_layer;      /* -1: none yet */
	bool routes;          /* it sends ROUTE */
	/* its last HINT: the expert units it pins until its next ROUTE */
	unsigned *hint;
	uint32_t n_hint;
	int hint_layer;       /* -1: none pending */
};

/* Where the budget comes from (budget.c). */
enum budget_source { BUDGET_NONE, BUDGET_GIVEN, BUDGET_CGROUP_V1, BUDGET_CGROUP_V2,
		     BUDGET_MEMAVAILABLE };

struct budget {
	enum budget_source source;
	char where[256];  /* the cgroup, or /proc/meminfo */
	uint64_t limit;   /* the limit measured */
	uint64_t reserve; /* kept back from it */
	uint64_t bytes;   /* the budget: limit - reserve */
	bool warned;      /* the cgroup could not be read: said once */
};

/* Memory pressure and the response to it (pressure.c). */
struct pressure {
	int fd;                    /* the PSI trigger, -1: none */
	char path[300];            /* its file */
	uint64_t sample_ns, sample_total; /* the last tick's reading */
	double rate;               /* stalls, us per second, over the last tick */
	double rate_before;        /* ... before the last shed */
	uint64_t shed_ns;          /* the last shed, until judged; 0: none */
	uint64_t judged_ns;        /* when the last shed was judged */
	uint64_t paused_until_ns;  /* triggers ignored until then */
	uint64_t calm_since_ns;    /* below the calm rate since; 0: not calm */
	unsigned ticks;            /* pager_on_tick calls */
	uint64_t sheds, helped, futile, ignored;
	/* From a shed to its layers' memory being free (pager_pressure_released) */
	uint64_t event_ns;         /* the shed waiting to be released; 0: none */
	unsigned release_left;     /* its layers still in memory */
	uint64_t release_bytes;    /* what they freed so far */
#define PRESSURE_LATENCIES 32
	double release_ms[PRESSURE_LATENCIES]; /* the last ones, a ring */
	unsigned n_release;        /* how many were recorded in all */
};

/*
 * A consumer: one way the pages of a model reach the programs that use
 * them - the engines, through userfaultfd (uffd.c), and the readers of the
 * FUSE mount, through its page cache (fuse.c, fuse_store.c).  The policy
 * (residency.c) decides what is in memory and calls these; it knows
 * nothing else of how a consumer reaches the pages.  Consumers tell the
 * policy where their readers are through their clients' pos, and call
 * pager_policy_advance when that or what they wait for changed.
 */
struct consumer_ops {
	const char *name;
	/* Is m used this way now?  Each consumer present holds its own copy of
	 * the resident layers. */
	bool (*present)(const struct model *m);
	/* Should unit u of m be in the memfd for it? */
	bool (*wants)(const struct model *m, unsigned u);
	/* Unit u is read into the memfd: hand it over, answer what waited. */
	void (*unit_ready)(struct model *m, unsigned u);
	/* Unit u could not be read: fail what waited for it. */
	void (*unit_failed)(struct model *m, unsigned u);
	/* Is something being served from unit u's memfd pages (it must stay)? */
	bool (*holds)(const struct model *m, unsigned u);
	/* After each eviction step: bring its own memory in line (may be NULL). */
	void (*advance)(struct model *m);
	/* Bytes of m's allowance it holds outside the memfd (may be NULL). */
	uint64_t (*held)(const struct model *m);
	/* A read of its own (tag->owner) completed (may be NULL: none). */
	void (*io_done)(struct io_tag *tag, int err, uint64_t bytes, bool last);
	/* Memory it needs beside the models' pages, once, in every plan. */
	uint64_t fixed_bytes;
};
extern const struct consumer_ops pager_uffd_ops, pager_fuse_ops;

struct pager {
	struct pager_fuse *fuse; /* NULL without --fuse */
	/* the engines always; the mount's readers with --fuse */
	const struct consumer_ops *consumers[2];
	unsigned n_consumers;
	struct pager_config cfg;
	unsigned window;
	int epfd, lfd, sfd;
	gid_t allow_gid;             /* cfg.allow_group's id, when given */
	struct pressure pressure;
	struct pager_io *io;
	struct pio_params io_params; /* the reader's request size and depth */
	char io_cache[4096];         /* where they are remembered */
	const char *io_why;          /* why the defaults, when they are used */
	struct model *models;
	unsigned n_models;
	struct budget budget;           /* where cfg.budget comes from (budget.c) */
	/* The reader's bandwidth while streaming (predict.c): bytes and busy
	 * time at the last second that had reads, and the running average. */
	struct {
		uint64_t bytes, busy_ns;
		double gbps;
	} stream;
	struct plan plan;               /* how the budget is shared (plan.c) */
	struct plan_model *plan_models; /* per model, its inputs and share */
	struct client *clients;
	unsigned n_clients;
	uint64_t page;
	uint64_t pressure_events;
	/* The engines' declared memory, kept reserved while none is connected
	 * (residency.c: pager_declared) */
	uint64_t declared_hold;
	bool stop;
	char *sock_path;
};

/* epoll data: a tagged pointer (low bits: kind). */
enum ev_kind { EV_LISTEN = 1, EV_SIGNAL, EV_IO, EV_PSI, EV_SOCK, EV_UFFD, EV_FUSE };
#define EV(kind, ptr) ((uint64_t)(uintptr_t)(ptr) | (kind))
#define EV_KIND(u) ((enum ev_kind)((u) & 7))
#define EV_PTR(u) ((void *)(uintptr_t)((u) & ~(uint64_t)7))


/* residency.c */
/* Read unit u (absent) into a free slot if it streams and one is free, else
 * into the memfd; or (pager_load_at) into slot (-1: the memfd). */
int pager_load(struct model *m, unsigned u);
/* Unit u (a layer, absent) is what a client waits for: read it now, or,
 * if only the memfd has room and that is beyond the allowance, once a slot
 * on its way is free (pager_demand_retry, on every step of the policy and
 * every tick, takes it up again). */
int pager_demand(struct model *m, unsigned u);
void pager_demand_retry(struct model *m);
int pager_load_at(struct model *m, unsigned u, int slot);
uint64_t pager_allowance(const struct model *m);
/* What the engines declared: the connected ones', or while none of them has,
 * the last total (see residency.c). */
uint64_t pager_declared(const struct pager *p);
uint64_t pager_declared_connected(const struct pager *p);
void pager_declare(struct client *c, uint64_t bytes);
/* What the plan leaves an engine beside what the others declared: the
 * mode's room, and the most it may declare (UINT64_MAX: no budget). */
void pager_engine_room(const struct pager *p, uint64_t others, uint64_t *room, uint64_t *limit);
/* What the model holds against its allowance: memfd, page cache, sparse. */
uint64_t pager_held(const struct model *m);
int pager_plan_init(struct model *m);
void pager_plan(struct pager *p);
void pager_replan(struct pager *p);
void pager_policy_advance(struct model *m);
void pager_io_done(void *tag, int err, uint64_t bytes, bool last, void *arg);
void pager_place(struct model *m, pid_t pid);
bool pager_page_shared(const struct model *m, unsigned u, uint64_t off);
/* Unit u's own pages in its extent i (without a boundary page another unit
 * shares); false if none.  All of them, up to max ranges (0: more). */
bool pager_own_range(const struct model *m, unsigned u, unsigned i, struct pager_extent *own);
unsigned pager_own_ranges(const struct model *m, unsigned u, struct pager_extent *out,
			  unsigned max);
bool pager_wants_mem(const struct model *m, unsigned u);
/* Is streamed unit u in or just ahead of a client of m of this kind? */
bool pager_needed_by(const struct model *m, unsigned u, enum cstate kind);

/* residency.c: streaming slots */
int pager_slots_create(struct model *m);
void pager_slots_destroy(struct model *m);
/* stratad --populate: make the pages of as many expert slots as the expert
 * cache's capacity holds, before serving; 0 or -errno. */
int pager_slots_populate(struct model *m);
/* Without --populate: a notice where it would pay (a guest that hands free
 * memory back to its host, a mixture of experts with slots). */
void pager_slots_advise(const struct model *m);
/* Every client maps unit u from the memfd again: its slot is free. */
void pager_slot_vacated(struct model *m, unsigned u);
/* A free slot whose pages exist, or with fresh one without them; -1: none. */
int pager_slot_free(const struct model *m, bool fresh);
/* Whether one more slot's pages may be made: an untouched slot is left and,
 * with expert units, the expert cache has room for it (experts.c). */
bool pager_slot_new_fits(const struct model *m);
/* Punch a free touched slot's pages (a shrunken expert cache): false if
 * there is none. */
bool pager_slot_drop(struct model *m);

void pager_evict(struct model *m, unsigned u);

/* experts.c: the expert cache */
int pager_experts_init(struct model *m);
void pager_experts_destroy(struct model *m);
/* Client c's ROUTE: layer's experts (n u32, unchecked) it will read now. */
void pager_experts_route(struct client *c, uint32_t layer, const uint8_t *experts, uint32_t n);
/* Client c's HINT: layer's experts (n u32, unchecked) it will likely route
 * to next; read ahead as far as the cache has room. */
void pager_experts_hint(struct client *c, uint32_t layer, const uint8_t *experts, uint32_t n);
/* Client c goes: its pins too. */
void pager_experts_forget(struct client *c);
/* Client c faulted on expert unit u. */
void pager_experts_fault(struct client *c, unsigned u);
/* The mount's reader read expert unit u into the page cache. */
void pager_experts_fuse_read(struct model *m, unsigned u);
/* A fault waits for expert unit u: load it if nobody is. */
void pager_experts_demand(struct model *m, unsigned u);
/* Load the experts wanted, evict down to the capacity (pager_policy_advance). */
void pager_experts_advance(struct model *m);

/* uffd.c: the engines' faults and the slots they map */
void pager_map_unit(struct client *c, unsigned u);
void pager_on_uffd(struct client *c);
void pager_slots_attach(struct client *c);
void pager_on_remapped(struct client *c, uint32_t seq);
void pager_slots_forget(struct client *c);
void pager_uffd_slot_in(struct model *m, unsigned u);
unsigned pager_uffd_slot_out(struct model *m, unsigned u);
/* Drop each client that has left a REMAP unanswered for REMAP_STALL_NS while
 * another client of its model waits on a fault (from the tick). */
#define REMAP_STALL_NS (5ull * 1000000000)
void pager_uffd_drop_stalled(struct pager *p);

/* pressure.c */
/* Open the PSI trigger (p->pressure.fd).  0 or -errno. */
int pager_pressure_open(struct pager *p);
void pager_pressure_close(struct pager *p);
/* The trigger fired (`what`): demote resident layers if memory is short
 * where the daemon's is; asked (SIGUSR1): demote them whatever. */
void pager_on_pressure(struct pager *p, const char *what, bool asked);
/* SIGUSR2: every demoted layer back. */
void pager_on_restore(struct pager *p);
/* Every PAGER_TICK_MS: shed when memory runs short, judge the last shed,
 * restore when calm; once a second, follow the budget. */
#define PAGER_TICK_MS 250
void pager_on_tick(struct pager *p);
/* A layer a shed demoted has left memory (residency.c). */
void pager_pressure_released(struct pager *p, uint64_t bytes);
/* The median time from a shed to its layers' memory being free, ms (0:
 * none yet). */
double pager_pressure_release_ms(const struct pager *p);

/* predict.c: decode speed for any number of resident layers */
/* A PASS from client c: `tokens` decode passes took wall_ns, the engine's
 * CPU time outside the layers outside_us and in each of the n_layers
 * layers (0, or the model's count) layer_us[l] microseconds (little-endian
 * u32s, as on the wire). */
void pager_predict_pass(struct client *c, uint32_t tokens, uint64_t wall_ns,
			uint32_t outside_us, const uint8_t *layer_us, uint32_t n_layers);
/* Once a second: the bandwidth streaming achieved. */
void pager_predict_tick(struct pager *p);
/* The bandwidth the predictor uses, GB/s (0: unknown). */
double pager_predict_gbps(const struct pager *p);
/* Predicted decode tokens/s of model m with n layers resident; 0 before an
 * engine has decoded. */
double pager_predict_tps(const struct model *m, unsigned n);
/* What its engines decode at, tokens/s (0: nothing yet). */
double pager_measured_tps(const struct model *m);

/* budget.c */
/* The automatic budget now, into b.  0 or -errno (MemAvailable unreadable). */
int pager_budget_measure(const struct pager *p, struct budget *b);
/* With an automatic budget, measure again; re-plan when it moved.  True if
 * it did. */
bool pager_budget_follow(struct pager *p);
const char *pager_budget_source_name(enum budget_source s);
/* Memory free under the limit the budget follows now: the cgroup's limit
 * less its usage, or MemFree; with cache_free, page cache that can be
 * reclaimed counts as free (the cgroup's inactive file pages, or
 * MemAvailable).  0 or -errno. */
int pager_budget_headroom(const struct pager *p, bool cache_free, uint64_t *out);

/* server.c */
void pager_drop_client(struct client *c, const char *why);

/* fuse.c: the FUSE front end (see there) */
int pager_fuse_start(struct pager *p, const char *dir, char *err, size_t errlen);
void pager_fuse_event(struct pager *p, void *ptr);
/* Memory for the mount's staging slots: in every plan with a mount. */
/* Sparse blocks kept before all are dropped (residency.c). */
#define PAGER_SPARSE_CAP (32ull << 20)
#define PAGER_FUSE_SLOTS 8
#define PAGER_FUSE_SLOT (4u << 20)
#define PAGER_FUSE_STAGING ((uint64_t)PAGER_FUSE_SLOTS * PAGER_FUSE_SLOT)
/* The reader's bounce arena (io.c) when a model has experts: their reads go
 * through it into the memfd, about a dozen experts' extents in flight. */
#define PAGER_BOUNCE_BYTES (16ull << 20)
void pager_fuse_stop(struct pager *p);

/* status.c */
void pager_render_status(struct pager *p, bool json, char *out, size_t cap, size_t *len);

#endif
