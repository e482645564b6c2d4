/*
 * pager.h - the strata pager: serve a model's weight pages to other
 * processes under a memory budget.
 *
 * Two sides:
 *
 *   server  (stratad)  struct pager: owns one memfd per model (a flat image of
 *                      the file), decides which residency units (layers) are
 *                      in memory, reads ahead with io_uring, evicts with punch
 *                      hole, and answers the clients' userfaultfd faults.
 *
 *   client  (strata)   pager_client_open(): maps a served model read-only,
 *                      registers it with a userfaultfd, hands the uffd to the
 *                      daemon and returns (base, size) - the same interface
 *                      the engine gets from mmap(2).
 *
 * The wire protocol is in proto_i.h and docs/protocol.md.
 */
#ifndef STRATA_PAGER_H
#define STRATA_PAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- logging ---------------------------------------------------------- */

/* syslog levels */
enum pager_log_level {
	PAGER_LOG_ERR = 3,
	PAGER_LOG_WARNING = 4,
	PAGER_LOG_NOTICE = 5,
	PAGER_LOG_INFO = 6,
	PAGER_LOG_DEBUG = 7,
};

typedef void (*pager_log_fn)(enum pager_log_level level, const char *msg);
/* Messages at or below max_level go to fn (default: stderr, NOTICE). */
void pager_set_log(pager_log_fn fn, enum pager_log_level max_level);
void pager_log(enum pager_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Like pager_log, appending ": strerror(err)" (err positive or negative). */
void pager_log_errno(enum pager_log_level level, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- server ----------------------------------------------------------- */

struct pager_config {
	const char *socket_path;
	uint64_t budget;        /* bytes; 0 = no limit (every layer resident) */
	bool budget_auto;       /* budget: the memory limit the daemon runs under
				 * (its cgroup's, else MemAvailable) less a reserve,
				 * followed as it changes (budget.c) */
	const char *mode;       /* "speed" (NULL), "balanced", "context": plan_i.h */
	bool no_pressure;       /* do not watch memory pressure (pressure.c) */
	bool lookahead;         /* ask engines for HINTs and read experts ahead
				 * on them (experts.c); off: a HINT is only scored */
	bool populate;          /* make the expert cache's pages before serving
				 * (residency.c, pager_slots_populate) */
	int resident;           /* layers kept resident; -1 = as many as fit */
	unsigned window;        /* streamed layers read ahead; 0 = default (2) */
	unsigned n_models;
	const char *const *models; /* GGUF paths */
	const char *fuse_dir;      /* mount the models as files here; NULL: no */
	/* Reads: request size and depth.  Both 0: as measured for the device
	 * (probe.c), from the cache at io_cache (NULL: the default place) or,
	 * with probe_io or no entry yet, measured now. */
	uint64_t io_chunk;
	unsigned io_depth;
	const char *io_cache;
	bool probe_io;
	/* Who may connect: always root and the daemon's own user; with
	 * allow_group, also every process in that group (primary or
	 * supplementary, as SO_PEERCRED / SO_PEERGROUPS tell), and the socket
	 * is made rw for the group.  docs/security.md. */
	const char *allow_group;
};

struct pager;

/* Open the models, load what is resident, bind the socket.  -errno, with a
 * one-line reason in err. */
int pager_create(const struct pager_config *cfg, struct pager **out, char *err, size_t errlen);
/* Serve until SIGTERM/SIGINT (blocked and read through a signalfd) or a fatal
 * error; 0 on a clean stop. */
int pager_run(struct pager *p);
void pager_destroy(struct pager *p);
/* The FUSE mount's guardian (a daemon with --fuse runs its own binary with
 * the arguments "--fuse-guard CONN" and connection CONN's fusectl abort file
 * open at descriptor 3; its main must then call this and exit with what it
 * returns).  Waits for the daemon to die and aborts that connection, so a
 * reader never hangs on a dead daemon. */
int pager_fuse_guard(unsigned conn);

/* ---- client ----------------------------------------------------------- */

struct pager_client;

struct pager_client_config {
	const char *socket_path;
	const char *model;        /* path or served file name */
	uint64_t declared_bytes;  /* the client's own memory (KV cache, buffers) */
	/* Called from the watchdog thread when the daemon goes away; must not
	 * return (the process cannot compute safely any more).  NULL: print
	 * "strata: WHY" and _exit(2); WHY is "pager daemon died (...)" or
	 * "the pager dropped this engine: REASON". */
	void (*on_lost)(const char *why);
};

int pager_client_open(const struct pager_client_config *cfg, struct pager_client **out,
		      const void **base, size_t *size, char *err, size_t errlen);
/* What the daemon's plan leaves this engine, as it connected: *room, what
 * it may declare without taking a resident layer (the --mode's room for
 * engines, less what the others declared), and *limit, the most it may
 * declare at all (more is refused); UINT64_MAX: the daemon has no budget. */
void pager_client_room(const struct pager_client *c, uint64_t *room, uint64_t *limit);
/* Does the daemon read experts ahead on a HINT (stratad --lookahead)?  Its
 * MODEL says so; an engine that is not asked spares itself the guess. */
bool pager_client_wants_hints(const struct pager_client *c);
/* Tell the daemon how much memory this client needs besides the model (its
 * KV cache and buffers), of which kv_bytes its KV cache, once it knows;
 * the daemon re-plans residency. */
int pager_client_declare(struct pager_client *c, uint64_t bytes, uint64_t kv_bytes);
/* What an engine tells the daemon of its decoding since its last report:
 * `tokens` one-token passes took wall_ns (faults included), of which the
 * engine's CPU time was outside_ns outside the layers and layer_ns[l] in
 * each of the n_layers layers (n_layers 0: not known; at most
 * PAGER_PASS_MAX_LAYERS): the speed predictor learns the engine's compute
 * time from them.  And `passes` decode passes in all (speculative ones,
 * over several positions, too) produced `produced` tokens: stratactl shows
 * tokens per pass. */
#define PAGER_PASS_MAX_LAYERS 1000
struct pager_pass_report {
	uint32_t tokens;
	uint64_t wall_ns, outside_ns;
	const uint64_t *layer_ns;
	uint32_t n_layers;
	uint32_t passes, produced;
};
/* Send at most about ten a second (sum what came in between).  0 or -EIO. */
int pager_client_report(struct pager_client *c, const struct pager_pass_report *r);
/* A mixture of experts' layer is about to read experts[0..n) (its router's
 * picks for the pass, each once): the daemon reads those it lacks at once
 * (a daemon serving the model by whole layers ignores it).  Nothing is sent
 * for more than PAGER_ROUTE_MAX experts: the faults then say it.  0 or
 * -EIO. */
#define PAGER_ROUTE_MAX 1024
int pager_client_route(struct pager_client *c, uint32_t layer, const uint32_t *experts,
		       uint32_t n);
/* The experts[0..n) a mixture of experts' layer will likely route to (a
 * lookahead: its router applied to an earlier hidden state), sent while an
 * earlier layer computes: the daemon reads those it lacks ahead, as far as
 * its cache has room, and keeps them until the next ROUTE.  A hint changes
 * only when bytes are read.  As pager_client_route. */
int pager_client_hint(struct pager_client *c, uint32_t layer, const uint32_t *experts,
		      uint32_t n);
/* Unmap and disconnect (the watchdog stops first, so this is not "lost"). */
void pager_client_close(struct pager_client *c);

/* ---- control ---------------------------------------------------------- */

/* Fetch the daemon's status as text or JSON; *out is malloc'd. */
int pager_status_fetch(const char *socket_path, bool json, char **out, size_t *len, char *err,
		       size_t errlen);

/* "8G", "512M", "1024" -> bytes; -EINVAL on garbage or overflow. */
int pager_parse_size(const char *s, uint64_t *out);
/* Is s a residency mode pager_config.mode takes ("speed", "balanced",
 * "context")? */
bool pager_mode_valid(const char *s);

#endif
