/*
 * server.c - stratad's core: models, clients, the residency policy and the
 * fault handler, around one epoll loop.
 *
 * Memory: each model has a memfd the size of its file (rounded to a page), a
 * flat image of the file; the daemon maps it read-write for its own reads and
 * clients map it read-only.  A unit (layer) is "in memory" when its pages are
 * in the memfd; the daemon puts them there with O_DIRECT reads (io.c) and
 * takes them out with a punch hole, which also removes them from every
 * client's page tables.
 *
 * Clients register their mapping with a userfaultfd (MISSING | MINOR) and give
 * it to the daemon.  A client touching a page that is not in the memfd raises
 * MISSING; one touching a page that is in the memfd but not mapped into it
 * raises MINOR.  The daemon answers either with UFFDIO_CONTINUE once the
 * page's unit is completely read - never earlier, so a client never sees a
 * half-written page.  Whole units are mapped with one CONTINUE as soon as
 * they are read, so in steady state the engine takes no fault except one
 * tripwire per streamed layer: the first page of each tensor is left
 * unmapped, and the first fault in a layer tells the daemon where the engine
 * is.  From that the policy reads the next streamed layers ahead and evicts
 * the ones behind.
 *
 * Policy: unit 0 (everything that is not a layer) and N layers, spread evenly
 * over the model, stay resident; the rest stream through a window of `window`
 * layers.  N comes from --resident, or is the largest that fits the budget
 * after the streaming window and the clients' declared memory.  Under memory
 * pressure (PSI) a quarter of the resident layers are demoted to streaming.
 *
 * Threading: one thread runs everything; nothing blocks but the epoll wait.
 */
#include "pager.h"
#include "io_i.h"
#include "pager_i.h"
#include "proto_i.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_NUMA
#include <numa.h>
#endif

#define IO_DEPTH 16
#define IO_CHUNK (1u << 20)
#define DEFAULT_WINDOW 2
#define MAX_CLIENTS 256
/* 150 ms stalled within 2 s (windows must be multiples of 2 s for
 * processes without CAP_SYS_RESOURCE, and were refused otherwise here). */
#define PSI_TRIGGER "some 150000 2000000"

enum ustate { U_ABSENT, U_LOADING, U_LOADED, U_EVICTING };

struct ustat {
	enum ustate state;
	bool resident;      /* policy: keep in memory */
	unsigned reads_left;
	unsigned punches_left;
	bool want_load;     /* load again once the eviction completes */
	int io_err;
	uint64_t loads, faults, evictions, bytes_read;
};

struct client;

/* A fault a client is blocked on until its unit is read. */
struct waiter {
	struct waiter *next;
	struct client *c;
	uint64_t off;
	uint64_t since_ns;
};

struct model {
	struct pager *p;
	unsigned idx;
	char *path, *real, *name;
	int fd;   /* O_DIRECT */
	int memfd;
	uint8_t *map;
	struct pager_layout *lay;
	struct ustat *us;
	struct waiter **waiters; /* per unit */
	unsigned n_resident;     /* layers planned resident */
	unsigned shed;           /* layers demoted by memory pressure */
	uint64_t mem_bytes;      /* units loading or loaded */
	uint64_t bytes_read;
	uint64_t fault_wait_ns;
	unsigned n_clients;
	int node;                /* NUMA node the image is bound to, -1 none */
};

enum cstate { C_HELLO, C_REGISTER, C_ACTIVE, C_CONTROL };

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
	int pos;              /* last layer unit the client entered, -1 unknown */
	uint64_t faults;
	uint64_t wait_ns;
	bool dead;
};

struct pager {
	struct pager_config cfg;
	unsigned window;
	int epfd, lfd, sfd, psifd;
	struct pager_io *io;
	struct model *models;
	unsigned n_models;
	struct client *clients;
	unsigned n_clients;
	uint64_t page;
	uint64_t pressure_events;
	bool stop;
	char *sock_path;
};

/* epoll data: a tagged pointer (low bits: kind). */
enum ev_kind { EV_LISTEN = 1, EV_SIGNAL, EV_IO, EV_PSI, EV_SOCK, EV_UFFD };
#define EV(kind, ptr) ((uint64_t)(uintptr_t)(ptr) | (kind))
#define EV_KIND(u) ((enum ev_kind)((u) & 7))
#define EV_PTR(u) ((void *)(uintptr_t)((u) & ~(uint64_t)7))

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- memory of units -------------------------------------------------- */

/* A page of unit u that another unit also holds (a boundary page).  Such
 * pages are never punched: a neighbour may be loading into them while an
 * asynchronous punch is queued, and a page per boundary is cheap to keep. */
static bool page_shared(const struct model *m, unsigned u, uint64_t off)
{
	for (unsigned v = 0; v < m->lay->n_units; v++)
		if (v != u && pager_unit_has_page(&m->lay->units[v], off))
			return true;
	return false;
}

struct io_tag {
	struct model *m;
	unsigned u;
	bool punch;
};

static int load(struct model *m, unsigned u);

/* The last punch of unit u completed: its memory is free. */
static void released(struct model *m, unsigned u)
{
	m->us[u].state = U_ABSENT;
	m->mem_bytes -= m->lay->units[u].bytes;
	if (m->us[u].want_load) {
		m->us[u].want_load = false;
		load(m, u);
	}
}

/*
 * Take unit u's pages out of memory, and with them out of every client's
 * page tables.  The punch holes are queued on the ring; until they complete
 * the unit is EVICTING: still counted against the budget, and not reloaded
 * (a load racing a queued punch would lose pages).
 */
static void release(struct model *m, unsigned u)
{
	const struct pager_unit *un = &m->lay->units[u];
	uint64_t page = m->lay->page;

	m->us[u].state = U_EVICTING;
	m->us[u].punches_left = 0;
	for (unsigned i = 0; i < un->n_ext; i++) {
		uint64_t off = un->ext[i].off, end = off + un->ext[i].len;
		struct io_tag *tag;

		if (page_shared(m, u, off))
			off += page;
		if (end > off && page_shared(m, u, end - page))
			end -= page;
		if (end <= off)
			continue;
		tag = malloc(sizeof(*tag));
		if (!tag || pio_punch(m->p->io, m->memfd, off, end - off, tag)) {
			free(tag);
			pager_log(PAGER_LOG_ERR, "%s: cannot queue the eviction of layer %d", m->name,
				  un->layer);
			continue;
		}
		*tag = (struct io_tag){ m, u, true };
		m->us[u].punches_left++;
	}
	if (m->us[u].punches_left == 0)
		released(m, u);
}

static void evict(struct model *m, unsigned u)
{
	if (m->us[u].state != U_LOADED)
		return;
	release(m, u);
	m->us[u].evictions++;
	pager_log(PAGER_LOG_DEBUG, "%s: evicted unit %u", m->name, u);
}

static uint64_t declared_total(const struct pager *p)
{
	uint64_t d = 0;

	for (const struct client *c = p->clients; c; c = c->next)
		if (c->state == C_ACTIVE || c->state == C_REGISTER)
			d += c->declared;
	return d;
}

/* What this model may hold: its share of the budget once clients' own
 * memory is set aside (models split the budget by size). */
static uint64_t allowance(const struct model *m)
{
	const struct pager *p = m->p;
	uint64_t total = 0, d = declared_total(p);

	if (!p->cfg.budget)
		return UINT64_MAX;
	for (unsigned i = 0; i < p->n_models; i++)
		total += p->models[i].lay->map_size;
	if (d >= p->cfg.budget)
		return 0;
	return (uint64_t)((double)(p->cfg.budget - d) * m->lay->map_size / total);
}

/* ---- mapping into clients --------------------------------------------- */

/* The uffd error policy, in one place: EEXIST (already mapped) is success,
 * EAGAIN (the mm is changing) means retry, ENOENT/ESRCH/EINVAL mean the
 * client's mapping or process is gone. */
static int uffd_continue(struct client *c, uint64_t off, uint64_t len)
{
	uint64_t page = c->m->lay->page;

	while (len) {
		struct uffdio_continue uc = {
			.range = { .start = c->base + off, .len = len },
		};

		if (ioctl(c->uffd, UFFDIO_CONTINUE, &uc) == 0)
			return 0;
		if (errno == EAGAIN) {
			if (uc.mapped > 0) {
				off += (uint64_t)uc.mapped;
				len -= (uint64_t)uc.mapped;
			}
			continue;
		}
		if (errno == EEXIST) {
			/* mapped counts the bytes before the existing page */
			uint64_t skip = (uc.mapped > 0 ? (uint64_t)uc.mapped : 0) + page;

			if (skip >= len)
				return 0;
			off += skip;
			len -= skip;
			continue;
		}
		return -errno;
	}
	return 0;
}

static void drop_client(struct client *c, const char *why);
static void place(struct model *m, pid_t pid);

/* Map unit u into client c: whole extents, minus tripwires for streamed
 * layers (so the first touch tells us the engine arrived). */
static void map_unit(struct client *c, unsigned u)
{
	const struct model *m = c->m;
	const struct pager_unit *un = &m->lay->units[u];
	bool trip = !m->us[u].resident && un->layer >= 0;
	uint64_t page = m->lay->page;
	int rc = 0;

	for (unsigned i = 0; i < un->n_ext && !rc; i++) {
		uint64_t off = un->ext[i].off, end = off + un->ext[i].len;
		unsigned t = 0;

		while (!rc && off < end) {
			uint64_t stop = end;

			if (trip) {
				while (t < un->n_trip && un->trip[t] < off)
					t++;
				if (t < un->n_trip && un->trip[t] < end)
					stop = un->trip[t];
			}
			if (stop > off)
				rc = uffd_continue(c, off, stop - off);
			off = stop == end ? end : stop + page;
		}
	}
	if (rc)
		drop_client(c, "its mapping is gone");
}

static void map_unit_everywhere(struct model *m, unsigned u)
{
	for (struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && c->state == C_ACTIVE && !c->dead)
			map_unit(c, u);
}

/* ---- loading ---------------------------------------------------------- */

static void wake_waiters(struct model *m, unsigned u);
static void policy_advance(struct model *m);

static int load(struct model *m, unsigned u)
{
	const struct pager_unit *un = &m->lay->units[u];
	struct io_tag *tag;

	if (m->us[u].state == U_EVICTING)
		m->us[u].want_load = true;
	if (m->us[u].state != U_ABSENT)
		return 0;
	tag = malloc(sizeof(*tag));
	if (!tag)
		return -ENOMEM;
	*tag = (struct io_tag){ m, u, false };
	m->us[u].state = U_LOADING;
	m->us[u].reads_left = 1; /* held until every chunk is queued */
	m->us[u].io_err = 0;
	m->us[u].loads++;
	m->mem_bytes += un->bytes;
	for (unsigned i = 0; i < un->n_ext; i++) {
		int n = pio_read(m->p->io, m->fd, m->map + un->ext[i].off, un->ext[i].off,
				 un->ext[i].len, m->lay->file_size, tag);

		if (n < 0) {
			m->us[u].io_err = n;
			break;
		}
		m->us[u].reads_left += (unsigned)n;
	}
	/* drop the hold; completes now if every chunk already finished */
	if (--m->us[u].reads_left == 0) {
		free(tag);
		m->us[u].state = U_LOADED;
		map_unit_everywhere(m, u);
		wake_waiters(m, u);
	}
	return m->us[u].io_err;
}

static void io_done(void *tag_, int err, uint64_t bytes, bool last, void *arg)
{
	struct io_tag *tag = tag_;
	struct model *m = tag->m;
	unsigned u = tag->u;
	struct ustat *us = &m->us[u];

	(void)arg;
	if (tag->punch) {
		free(tag);
		if (err)
			pager_log_errno(PAGER_LOG_ERR, err, "%s: evicting unit %u", m->name, u);
		if (--us->punches_left == 0) {
			released(m, u);
			policy_advance(m); /* the freed memory may let loads start */
		}
		return;
	}
	us->bytes_read += bytes;
	m->bytes_read += bytes;
	if (err && !us->io_err) {
		us->io_err = err;
		pager_log_errno(PAGER_LOG_ERR, err, "%s: reading unit %u", m->name, u);
	}
	if (!last || --us->reads_left)
		return;
	free(tag);
	if (us->io_err) {
		/* The data is not there: a client waiting on it cannot go on.
		 * Drop them (they exit with a message) rather than map garbage. */
		release(m, u);
		for (struct waiter *w = m->waiters[u]; w; w = w->next)
			drop_client(w->c, "the model file could not be read");
		return;
	}
	us->state = U_LOADED;
	map_unit_everywhere(m, u);
	wake_waiters(m, u);
}

/* ---- policy ----------------------------------------------------------- */

/* Mark n layers resident, spread evenly (so streamed layers have resident
 * neighbours whose compute time hides their reads). */
static void plan(struct model *m)
{
	const struct pager *p = m->p;
	unsigned L = m->lay->n_layers, n;
	uint64_t allow = allowance(m), fixed;

	if (p->cfg.resident >= 0) {
		n = (unsigned)p->cfg.resident < L ? (unsigned)p->cfg.resident : L;
	} else if (!p->cfg.budget) {
		n = L;
	} else {
		uint64_t avg = L ? (m->lay->map_size - m->lay->units[0].bytes) / L : 0;
		unsigned w = p->window < L ? p->window : L;

		/* streamed layers in memory at once: the one the engine is in,
		 * plus the window being read ahead of it */
		fixed = m->lay->units[0].bytes + (uint64_t)(w + 1) * m->lay->max_layer_bytes;
		n = allow > fixed && avg ? (unsigned)((allow - fixed) / avg) : 0;
		if (n > L)
			n = L;
		if (n + w > L) /* streaming fewer than `window` layers */
			n = allow >= m->lay->map_size ? L : (L > w ? L - w : 0);
	}
	n = n > m->shed ? n - m->shed : 0;
	m->n_resident = n;
	m->us[0].resident = true;
	for (unsigned l = 0; l < L; l++) {
		/* layer l is resident when the spread count steps at l */
		bool r = (uint64_t)(l + 1) * n / L != (uint64_t)l * n / L;
		m->us[l + 1].resident = r;
	}
}

/* Is streamed unit u within `window` streamed layers ahead of some client of
 * m (or the one a client is in)? */
static bool needed(const struct model *m, unsigned u)
{
	unsigned L = m->lay->n_layers;

	for (const struct client *c = m->p->clients; c; c = c->next) {
		unsigned seen = 0;

		if (c->m != m || c->state != C_ACTIVE)
			continue;
		if (c->pos < 0) {
			/* not located yet: it starts at layer 0 */
			for (unsigned l = 0; l < L && seen < m->p->window; l++)
				if (!m->us[l + 1].resident) {
					if (l + 1 == u)
						return true;
					seen++;
				}
			continue;
		}
		if ((unsigned)c->pos == u)
			return true;
		for (unsigned k = 1; k <= L && seen < m->p->window; k++) {
			unsigned v = (unsigned)(c->pos - 1 + k) % L + 1;

			if (m->us[v].resident)
				continue;
			if (v == u)
				return true;
			seen++;
		}
	}
	return false;
}

/* Bring memory in line with the plan and the clients' positions: evict what
 * is neither resident nor needed, then load resident units and the streaming
 * window while the allowance has room. */
static void policy_advance(struct model *m)
{
	unsigned U = m->lay->n_units;
	uint64_t allow = allowance(m);

	/* This also frees layers a shrunken plan (pressure, a new client's
	 * declared memory) no longer keeps resident. */
	for (unsigned u = 1; u < U; u++)
		if (m->us[u].state == U_LOADED && !m->us[u].resident && !needed(m, u) &&
		    !m->waiters[u])
			evict(m, u);
	for (unsigned u = 0; u < U; u++) {
		if (m->us[u].state != U_ABSENT || !(m->us[u].resident || needed(m, u)))
			continue;
		if (m->mem_bytes + m->lay->units[u].bytes > allow && u != 0)
			continue; /* no room now; retried at the next step */
		if (load(m, u))
			break;
	}
}

/* ---- faults ----------------------------------------------------------- */

static void resolve(struct client *c, uint64_t off, uint64_t since)
{
	struct model *m = c->m;
	uint64_t page = m->lay->page;
	int u = pager_layout_unit_of(m->lay, off);
	uint64_t waited = now_ns() - since;
	int rc;

	c->wait_ns += waited;
	m->fault_wait_ns += waited;
	/* A fault in a layer means the client is in it: note the position
	 * and map the layer's remaining tripwires, so it takes one fault per
	 * layer, not one per tensor. */
	if (u > 0) {
		const struct pager_unit *un = &m->lay->units[u];

		c->pos = u;
		for (unsigned t = 0; t < un->n_trip; t++) {
			rc = uffd_continue(c, un->trip[t], page);
			if (rc) {
				drop_client(c, "its mapping is gone");
				return;
			}
		}
	}
	rc = uffd_continue(c, off, page);
	if (rc)
		drop_client(c, "its mapping is gone");
}

static void wake_waiters(struct model *m, unsigned u)
{
	struct waiter *w = m->waiters[u];

	m->waiters[u] = NULL;
	while (w) {
		struct waiter *n = w->next;

		if (!w->c->dead)
			resolve(w->c, w->off, w->since_ns);
		free(w);
		w = n;
	}
	policy_advance(m);
}

static void on_fault(struct client *c, uint64_t addr)
{
	struct model *m = c->m;
	uint64_t off = (addr - c->base) & ~(m->lay->page - 1);
	int u;

	if (addr < c->base || addr - c->base >= m->lay->map_size) {
		drop_client(c, "it faulted outside its model");
		return;
	}
	u = pager_layout_unit_of(m->lay, off);
	if (u < 0) {
		drop_client(c, "it faulted on a page no unit covers");
		return;
	}
	c->faults++;
	m->us[u].faults++;
	if (m->us[u].state == U_LOADED) {
		resolve(c, off, now_ns());
		policy_advance(m);
		return;
	}
	struct waiter *w = malloc(sizeof(*w));
	if (!w) {
		drop_client(c, "out of memory");
		return;
	}
	w->c = c;
	w->off = off;
	w->since_ns = now_ns();
	w->next = m->waiters[u];
	m->waiters[u] = w;
	if (u > 0 && (unsigned)u != (unsigned)c->pos)
		c->pos = u; /* it is here, waiting */
	if (m->us[u].state == U_EVICTING) {
		m->us[u].want_load = true;
	} else if (m->us[u].state == U_ABSENT) {
		/* A demand miss: the window did not cover it.  Make room. */
		policy_advance(m);
		if (m->us[u].state == U_ABSENT && load(m, u))
			drop_client(c, "the model file could not be read");
	}
}

static void on_uffd(struct client *c)
{
	struct uffd_msg msgs[16];

	for (;;) {
		ssize_t n = read(c->uffd, msgs, sizeof(msgs));

		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			drop_client(c, "its userfaultfd failed");
			return;
		}
		if (n == 0 || n % (ssize_t)sizeof(msgs[0])) {
			drop_client(c, "its userfaultfd returned a partial message");
			return;
		}
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msgs[0]) && !c->dead; i++)
			if (msgs[i].event == UFFD_EVENT_PAGEFAULT)
				on_fault(c, msgs[i].arg.pagefault.address);
	}
}

/* ---- clients and the protocol ----------------------------------------- */

static void send_error(struct client *c, int err, const char *fmt, ...)
{
	char buf[300];
	va_list ap;
	int n;

	proto_put_u32((uint8_t *)buf, (uint32_t)err);
	va_start(ap, fmt);
	n = vsnprintf(buf + 4, sizeof(buf) - 4, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n > sizeof(buf) - 5)
		n = (int)sizeof(buf) - 5;
	proto_send(c->fd, PROTO_ERROR, buf, 4 + (uint32_t)n, -1);
}

/* End a connection; why NULL means the client left on its own.  An engine
 * is told why before its socket closes (its watchdog prints it). */
static void drop_client(struct client *c, const char *why)
{
	if (c->dead)
		return;
	if (why && c->state == C_ACTIVE)
		send_error(c, EIO, "%s", why);
	c->dead = true;
	if (!why && c->state == C_ACTIVE)
		pager_log(PAGER_LOG_NOTICE, "client pid %d detached from %s (%llu faults, %.1f ms waiting)",
			  (int)c->pid, c->m->name, (unsigned long long)c->faults, c->wait_ns / 1e6);
	else if (!why)
		pager_log(PAGER_LOG_INFO, "connection from pid %d closed", (int)c->pid);
	else if (c->state == C_ACTIVE || c->state == C_REGISTER)
		pager_log(PAGER_LOG_NOTICE, "client pid %d (%s) dropped: %s", (int)c->pid,
			  c->m ? c->m->name : "-", why);
	else
		pager_log(PAGER_LOG_INFO, "connection from pid %d dropped: %s", (int)c->pid, why);
	/* The rest happens in reap_dead(), outside any iteration. */
}

static void free_client(struct client *c)
{
	struct pager *p = c->p;
	struct model *m = c->m;

	epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	if (c->uffd >= 0) {
		epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->uffd, NULL);
		close(c->uffd);
	}
	if (m) {
		/* forget its waiters */
		for (unsigned u = 0; u < m->lay->n_units; u++) {
			struct waiter **pw = &m->waiters[u];

			while (*pw) {
				if ((*pw)->c == c) {
					struct waiter *w = *pw;
					*pw = w->next;
					free(w);
				} else {
					pw = &(*pw)->next;
				}
			}
		}
		if (c->state == C_ACTIVE || c->state == C_REGISTER)
			m->n_clients--;
	}
	free(c);
	p->n_clients--;
}

static void reap_dead(struct pager *p)
{
	struct client **pc = &p->clients;
	bool any = false;

	while (*pc) {
		struct client *c = *pc;

		if (c->dead) {
			*pc = c->next;
			free_client(c);
			any = true;
		} else {
			pc = &c->next;
		}
	}
	if (any)
		for (unsigned i = 0; i < p->n_models; i++) {
			plan(&p->models[i]);
			policy_advance(&p->models[i]);
		}
}

static struct model *find_model(struct pager *p, const char *name, size_t len)
{
	char buf[PROTO_MAX_NAME + 1], *real;

	memcpy(buf, name, len);
	buf[len] = '\0';
	real = realpath(buf, NULL);
	for (unsigned i = 0; i < p->n_models; i++) {
		if ((real && !strcmp(real, p->models[i].real)) || !strcmp(buf, p->models[i].name)) {
			free(real);
			return &p->models[i];
		}
	}
	free(real);
	return NULL;
}

static void render_status(struct pager *p, bool json, char *out, size_t cap, size_t *len);

static void on_hello(struct client *c, const uint8_t *pl, uint32_t len)
{
	struct pager *p = c->p;
	uint32_t role, name_len;
	uint8_t mp[PROTO_MODEL_SIZE];
	struct model *m;

	if (len < PROTO_HELLO_FIXED) {
		drop_client(c, "short HELLO");
		return;
	}
	role = proto_get_u32(pl);
	name_len = proto_get_u32(pl + 4);
	if (name_len > PROTO_MAX_NAME || name_len != len - PROTO_HELLO_FIXED) {
		send_error(c, EPROTO, "HELLO name length does not match the message");
		drop_client(c, "malformed HELLO");
		return;
	}
	if (role == PROTO_ROLE_CONTROL) {
		c->state = C_CONTROL;
		return;
	}
	if (role != PROTO_ROLE_UFFD) {
		send_error(c, EPROTO, "unknown role %u", role);
		drop_client(c, "unknown role");
		return;
	}
	c->declared = proto_get_u64(pl + 8);
	m = find_model(p, (const char *)pl + PROTO_HELLO_FIXED, name_len);
	if (!m) {
		send_error(c, ENOENT, "model '%.*s' is not served here", (int)(name_len > 200 ? 200 : name_len),
			   (const char *)pl + PROTO_HELLO_FIXED);
		drop_client(c, "it asked for a model not served");
		return;
	}
	/* The client gets the memfd itself: userfaultfd refuses to register
	 * a mapping that could never be writable (VM_MAYWRITE), so a
	 * read-only descriptor will not do, and write seals would also forbid
	 * the punch holes eviction needs.  Clients map it PROT_READ; they are
	 * trusted as far as SO_PEERCRED says (same user, or root). */
	proto_put_u64(mp, m->lay->file_size);
	proto_put_u64(mp + 8, m->lay->map_size);
	proto_put_u32(mp + 16, m->lay->n_units);
	proto_put_u32(mp + 20, (uint32_t)m->lay->page);
	proto_put_u64(mp + 24, m->idx);
	if (proto_send(c->fd, PROTO_MODEL, mp, sizeof(mp), m->memfd))
		drop_client(c, "cannot send MODEL");
	c->m = m;
	c->state = C_REGISTER;
	m->n_clients++;
}

static void on_register(struct client *c, const uint8_t *pl, uint32_t len, int fd)
{
	struct pager *p = c->p;
	struct model *m = c->m;
	struct epoll_event ev = { .events = EPOLLIN };
	char link[64], target[64];
	ssize_t n;
	uint8_t ready[PROTO_READY_SIZE] = { 0 };
	unsigned mapped = 0;

	if (len != PROTO_REGISTER_SIZE || fd < 0) {
		drop_client(c, "malformed REGISTER");
		if (fd >= 0)
			close(fd);
		return;
	}
	/* The descriptor must really be a userfaultfd. */
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0 || (target[n] = '\0', strcmp(target, "anon_inode:[userfaultfd]"))) {
		send_error(c, EINVAL, "REGISTER did not carry a userfaultfd");
		drop_client(c, "REGISTER without a userfaultfd");
		close(fd);
		return;
	}
	c->base = proto_get_u64(pl);
	if (c->base % m->lay->page || proto_get_u64(pl + 8) != m->lay->map_size) {
		send_error(c, EINVAL, "REGISTER range does not match the model");
		drop_client(c, "REGISTER range mismatch");
		close(fd);
		return;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
		drop_client(c, "cannot make its uffd non-blocking");
		close(fd);
		return;
	}
	c->uffd = fd;
	ev.data.u64 = EV(EV_UFFD, c);
	if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		drop_client(c, "epoll");
		return;
	}
	c->state = C_ACTIVE;
	c->pos = -1;
	if (m->n_clients == 1)
		place(m, c->pid);
	pager_log(PAGER_LOG_NOTICE, "client pid %d attached to %s (declares %.1f MiB)", (int)c->pid,
		  m->name, c->declared / 1048576.0);
	plan(m);
	policy_advance(m);
	for (unsigned u = 0; u < m->lay->n_units && !c->dead; u++)
		if (m->us[u].state == U_LOADED) {
			map_unit(c, u);
			mapped++;
		}
	proto_put_u32(ready, mapped);
	if (!c->dead && proto_send(c->fd, PROTO_READY, ready, sizeof(ready), -1))
		drop_client(c, "cannot send READY");
}

static void on_status_req(struct client *c, const uint8_t *pl, uint32_t len)
{
	size_t cap = PROTO_MAX_PAYLOAD, n = 0;
	char *buf;

	if (len != PROTO_STATUS_REQ_SIZE || proto_get_u32(pl) > 1) {
		send_error(c, EPROTO, "malformed STATUS_REQ");
		drop_client(c, "malformed STATUS_REQ");
		return;
	}
	buf = malloc(cap);
	if (!buf) {
		drop_client(c, "out of memory");
		return;
	}
	render_status(c->p, proto_get_u32(pl) == 1, buf, cap, &n);
	if (proto_send(c->fd, PROTO_STATUS, buf, (uint32_t)n, -1))
		drop_client(c, "cannot send STATUS");
	free(buf);
}

static void on_sock(struct client *c)
{
	uint8_t buf[PROTO_HDR_SIZE + PROTO_MAX_NAME + 64];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 4)];
	} cm;
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
			     .msg_controllen = sizeof(cm.b) };
	int fds[4], nfd = 0, fd = -1;
	uint32_t len;
	uint16_t type;
	ssize_t n;

	n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	for (struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); ch; ch = CMSG_NXTHDR(&mh, ch))
		if (ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS) {
			size_t k = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			for (size_t i = 0; i < k && nfd < 4; i++)
				memcpy(&fds[nfd++], CMSG_DATA(ch) + i * sizeof(int), sizeof(int));
		}
	if (n <= 0) {
		for (int i = 0; i < nfd; i++)
			close(fds[i]);
		drop_client(c, n == 0 ? NULL : "read error on its socket");
		return;
	}
	if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n < PROTO_HDR_SIZE ||
	    proto_get_u32(buf) != PROTO_MAGIC || buf[4] != PROTO_VERSION || buf[5] != 0 ||
	    proto_get_u32(buf + 12) != 0 || nfd > 1) {
		for (int i = 0; i < nfd; i++)
			close(fds[i]);
		send_error(c, EPROTO, "malformed message (protocol version %d expected)",
			   PROTO_VERSION);
		drop_client(c, "it sent a malformed message");
		return;
	}
	type = (uint16_t)(buf[6] | buf[7] << 8);
	len = proto_get_u32(buf + 8);
	if (len != (uint64_t)n - PROTO_HDR_SIZE) {
		for (int i = 0; i < nfd; i++)
			close(fds[i]);
		send_error(c, EPROTO, "message length %u does not match the %zd bytes sent", len,
			   n - PROTO_HDR_SIZE);
		drop_client(c, "it sent a truncated message");
		return;
	}
	if (nfd)
		fd = fds[0];
	if (fd >= 0 && !(c->state == C_REGISTER && type == PROTO_REGISTER)) {
		close(fd);
		drop_client(c, "it sent a file descriptor where none belongs");
		return;
	}
	switch (c->state) {
	case C_HELLO:
		if (type == PROTO_HELLO)
			on_hello(c, buf + PROTO_HDR_SIZE, len);
		else
			drop_client(c, "it did not start with HELLO");
		break;
	case C_REGISTER:
		if (type == PROTO_REGISTER) {
			on_register(c, buf + PROTO_HDR_SIZE, len, fd);
		} else {
			if (fd >= 0)
				close(fd);
			drop_client(c, "expected REGISTER");
		}
		break;
	case C_CONTROL:
		if (type == PROTO_STATUS_REQ)
			on_status_req(c, buf + PROTO_HDR_SIZE, len);
		else
			drop_client(c, "unexpected message on a control connection");
		break;
	case C_ACTIVE:
		if (type == PROTO_DECLARE && len == PROTO_DECLARE_SIZE) {
			c->declared = proto_get_u64(buf + PROTO_HDR_SIZE);
			pager_log(PAGER_LOG_INFO, "client pid %d declares %.1f MiB", (int)c->pid,
				  c->declared / 1048576.0);
			for (unsigned i = 0; i < c->p->n_models; i++) {
				plan(&c->p->models[i]);
				policy_advance(&c->p->models[i]);
			}
		} else {
			drop_client(c, "unexpected message after READY");
		}
		break;
	}
}

static void on_accept(struct pager *p)
{
	for (;;) {
		int fd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct ucred cr;
		socklen_t crl = sizeof(cr);
		struct client *c;
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };

		if (fd < 0)
			return;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) < 0 ||
		    (cr.uid != 0 && cr.uid != geteuid())) {
			pager_log(PAGER_LOG_WARNING, "refused a connection from uid %d",
				  (int)cr.uid);
			close(fd);
			continue;
		}
		if (p->n_clients >= MAX_CLIENTS) {
			pager_log(PAGER_LOG_WARNING, "refused pid %d: %d clients already",
				  (int)cr.pid, MAX_CLIENTS);
			close(fd);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->p = p;
		c->fd = fd;
		c->uffd = -1;
		c->pid = cr.pid;
		c->uid = cr.uid;
		c->pos = -1;
		ev.data.u64 = EV(EV_SOCK, c);
		if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			close(fd);
			free(c);
			continue;
		}
		c->next = p->clients;
		p->clients = c;
		p->n_clients++;
	}
}

/* ---- memory pressure -------------------------------------------------- */

/*
 * Memory pressure (a PSI trigger, or SIGUSR1 from an operator who wants
 * memory back now): demote a quarter of each model's resident layers to
 * streaming; their pages are evicted as soon as no engine needs them.  The
 * demotion stays until restore (SIGUSR2).
 */
static void on_pressure(struct pager *p, const char *what)
{
	p->pressure_events++;
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];
		unsigned before = m->n_resident;

		m->shed += (m->n_resident + 3) / 4;
		plan(m);
		if (m->n_resident < before)
			pager_log(PAGER_LOG_NOTICE,
				  "%s: %s: %u resident layers now stream (%u left)",
				  m->name, what, before - m->n_resident, m->n_resident);
		policy_advance(m);
	}
}

static void on_restore(struct pager *p)
{
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		m->shed = 0;
		plan(m);
		pager_log(PAGER_LOG_NOTICE, "%s: residency restored (%u layers resident)", m->name,
			  m->n_resident);
		policy_advance(m);
	}
}

static int open_psi(void)
{
	int fd = open("/proc/pressure/memory", O_RDWR | O_NONBLOCK | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (write(fd, PSI_TRIGGER, strlen(PSI_TRIGGER) + 1) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* ---- status ----------------------------------------------------------- */

static char state_char(const struct model *m, unsigned u)
{
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

static void render_status(struct pager *p, bool json, char *out, size_t cap, size_t *len)
{
	struct sbuf s = { out, cap, 0 };
	double busy = pio_busy_ns(p->io) / 1e9;

	if (json)
		sb(&s, "{\"pid\": %d, \"budget_bytes\": %llu, \"pressure_events\": %llu, \"models\": [",
		   (int)getpid(), (unsigned long long)p->cfg.budget,
		   (unsigned long long)p->pressure_events);
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];
		uint64_t resident = 0, read_all = 0;

		for (unsigned u = 0; u < m->lay->n_units; u++)
			if (m->us[u].state == U_LOADED)
				resident += m->lay->units[u].bytes;
		for (unsigned j = 0; j < p->n_models; j++)
			read_all += p->models[j].bytes_read;
		double tput = busy > 0 ? read_all / busy / 1e6 : 0;
		if (json) {
			sb(&s, "%s{\"name\": \"", i ? ", " : "");
			sb_json(&s, m->name);
			sb(&s, "\", \"path\": \"");
			sb_json(&s, m->real);
			sb(&s, "\", \"file_bytes\": %llu, "
			       "\"budget_bytes\": %llu, \"allowance_bytes\": %llu, "
			       "\"resident_bytes\": %llu, \"resident_layers_planned\": %u, "
			       "\"bytes_read\": %llu, \"read_mbps\": %.1f, \"fault_wait_ms\": %.3f, "
			       "\"other\": {\"state\": \"%s\", \"bytes\": %llu, \"loads\": %llu, "
			       "\"faults\": %llu}, \"layers\": [",
			   (unsigned long long)m->lay->file_size,
			   (unsigned long long)p->cfg.budget,
			   (unsigned long long)(allowance(m) == UINT64_MAX ? 0 : allowance(m)),
			   (unsigned long long)resident, m->n_resident,
			   (unsigned long long)m->bytes_read, tput, m->fault_wait_ns / 1e6,
			   state_name(m, 0), (unsigned long long)m->lay->units[0].bytes,
			   (unsigned long long)m->us[0].loads, (unsigned long long)m->us[0].faults);
			for (unsigned u = 1; u < m->lay->n_units; u++)
				sb(&s, "%s{\"layer\": %u, \"state\": \"%s\", \"bytes\": %llu, "
				       "\"loads\": %llu, \"faults\": %llu, \"evictions\": %llu}",
				   u > 1 ? ", " : "", u - 1, state_name(m, u),
				   (unsigned long long)m->lay->units[u].bytes,
				   (unsigned long long)m->us[u].loads,
				   (unsigned long long)m->us[u].faults,
				   (unsigned long long)m->us[u].evictions);
			sb(&s, "], \"clients\": [");
			bool first = true;
			for (struct client *c = p->clients; c; c = c->next) {
				if (c->m != m || c->state != C_ACTIVE)
					continue;
				sb(&s, "%s{\"pid\": %d, \"kind\": \"uffd\", \"declared_bytes\": %llu, "
				       "\"layer\": %d, \"faults\": %llu, \"fault_wait_ms\": %.3f}",
				   first ? "" : ", ", (int)c->pid, (unsigned long long)c->declared,
				   c->pos > 0 ? c->pos - 1 : -1, (unsigned long long)c->faults,
				   c->wait_ns / 1e6);
				first = false;
			}
			sb(&s, "]}");
			continue;
		}
		sb(&s, "model %s (%s)\n", m->name, m->real);
		sb(&s, "  budget      %.1f MiB%s, allowance %.1f MiB\n", p->cfg.budget / 1048576.0,
		   p->cfg.budget ? "" : " (no limit)",
		   allowance(m) == UINT64_MAX ? m->lay->map_size / 1048576.0
					      : allowance(m) / 1048576.0);
		sb(&s, "  resident    %.1f MiB of %.1f MiB, %u of %u layers planned resident\n",
		   resident / 1048576.0, m->lay->file_size / 1048576.0, m->n_resident,
		   m->lay->n_layers);
		sb(&s, "  layers      [");
		for (unsigned u = 1; u < m->lay->n_units; u++)
			sb(&s, "%c", state_char(m, u));
		sb(&s, "]  (R resident, L loaded, l loading, e evicting, . absent; other: %c)\n",
		   state_char(m, 0));
		sb(&s, "  read        %.1f MiB, %.0f MB/s while reading; fault wait %.1f ms\n",
		   m->bytes_read / 1048576.0, tput, m->fault_wait_ns / 1e6);
		sb(&s, "  per layer   loads/faults:");
		for (unsigned u = 1; u < m->lay->n_units; u++)
			sb(&s, " %llu/%llu", (unsigned long long)m->us[u].loads,
			   (unsigned long long)m->us[u].faults);
		sb(&s, "\n  clients     %u\n", m->n_clients);
		for (struct client *c = p->clients; c; c = c->next)
			if (c->m == m && c->state == C_ACTIVE)
				sb(&s, "    pid %-7d uffd  declares %.1f MiB, at layer %d, %llu faults, waited %.1f ms\n",
				   (int)c->pid, c->declared / 1048576.0, c->pos > 0 ? c->pos - 1 : -1,
				   (unsigned long long)c->faults, c->wait_ns / 1e6);
	}
	if (json)
		sb(&s, "]}\n");
	*len = s.len;
}

/* ---- NUMA placement --------------------------------------------------- */

/*
 * Bind the model's image to the node process pid runs on, and issue the
 * reads from there: new pages of the memfd come from that node (pages
 * already read stay where they are; moving them would cost more than the
 * remote reads they save).  Called at start-up for the daemon itself and
 * again for a model's first client.  A no-op without libnuma or on a
 * one-node machine.
 */
static void place(struct model *m, pid_t pid)
{
#ifdef HAVE_NUMA
	char path[64], buf[1024], *p;
	int cpu = -1, node, fd;
	ssize_t n;

	if (numa_available() < 0 || numa_max_node() == 0)
		return;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	/* "processor" is field 39; fields after the ")" of comm start at 3 */
	p = strrchr(buf, ')');
	for (int f = 2; p && f < 39; f++)
		p = strchr(p + 1, ' ');
	if (p)
		cpu = atoi(p + 1);
	node = cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
	if (node < 0 || node == m->node)
		return;
	m->node = node;
	numa_tonode_memory(m->map, m->lay->map_size, node);
	numa_run_on_node(node);
	pager_log(PAGER_LOG_INFO, "%s: memory and reads on node %d (pid %d runs there)", m->name,
		  node, (int)pid);
#else
	(void)m;
	(void)pid;
#endif
}

/* ---- set-up ----------------------------------------------------------- */

static int open_model(struct pager *p, struct model *m, const char *path, char *err,
		      size_t errlen)
{
	struct stat st;
	void *img;
	int rc, fd;
	const char *slash;

	m->p = p;
	m->fd = m->memfd = -1;
	m->path = strdup(path);
	m->real = realpath(path, NULL);
	slash = strrchr(path, '/');
	m->name = strdup(slash ? slash + 1 : path);
	if (!m->path || !m->real || !m->name) {
		snprintf(err, errlen, "%s: %s", path, strerror(m->real ? ENOMEM : errno));
		return -ENOENT;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rc = fd < 0 ? -errno : -EINVAL;
		snprintf(err, errlen, "%s: %s", path, fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return rc;
	}
	/* Parse the header through a temporary mapping, then drop those pages
	 * from the page cache: the model's memory is the memfd, nothing else. */
	img = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (img == MAP_FAILED) {
		snprintf(err, errlen, "%s: %s", path, st.st_size ? strerror(errno) : "empty file");
		close(fd);
		return -EINVAL;
	}
	rc = pager_layout_build(img, (size_t)st.st_size, p->page, &m->lay, err, errlen);
	munmap(img, (size_t)st.st_size);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	if (rc) {
		char tmp[256];

		snprintf(tmp, sizeof(tmp), "%s", err);
		snprintf(err, errlen, "%s: %s", path, tmp);
		return rc;
	}
	m->fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (m->fd < 0) {
		snprintf(err, errlen, "%s: cannot open with O_DIRECT: %s", path, strerror(errno));
		return -errno;
	}
	m->memfd = memfd_create(m->name, MFD_CLOEXEC);
	if (m->memfd < 0 || ftruncate(m->memfd, (off_t)m->lay->map_size) < 0) {
		snprintf(err, errlen, "%s: memfd: %s", path, strerror(errno));
		return -errno;
	}
	m->map = mmap(NULL, m->lay->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, m->memfd, 0);
	if (m->map == MAP_FAILED) {
		m->map = NULL;
		snprintf(err, errlen, "%s: mapping the memfd: %s", path, strerror(errno));
		return -errno;
	}
	m->node = -1;
	place(m, getpid()); /* until a client says where it runs */
	m->us = calloc(m->lay->n_units, sizeof(*m->us));
	m->waiters = calloc(m->lay->n_units, sizeof(*m->waiters));
	if (!m->us || !m->waiters) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static void close_model(struct model *m)
{
	if (m->map)
		munmap(m->map, m->lay->map_size);
	if (m->memfd >= 0)
		close(m->memfd);
	if (m->fd >= 0)
		close(m->fd);
	for (unsigned u = 0; m->waiters && u < m->lay->n_units; u++)
		while (m->waiters[u]) {
			struct waiter *w = m->waiters[u];
			m->waiters[u] = w->next;
			free(w);
		}
	free(m->waiters);
	free(m->us);
	pager_layout_destroy(m->lay);
	free(m->path);
	free(m->real);
	free(m->name);
}

/* Bind the socket; a leftover from a crashed daemon is replaced, a live
 * daemon's is not. */
static int bind_socket(struct pager *p, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(p->cfg.socket_path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path is longer than %zu bytes", sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, p->cfg.socket_path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == EADDRINUSE) {
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		bool live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;

		if (probe >= 0)
			close(probe);
		if (live) {
			snprintf(err, errlen, "%s: another stratad is serving this socket",
				 sa.sun_path);
			close(fd);
			return -EADDRINUSE;
		}
		pager_log(PAGER_LOG_NOTICE, "%s: removing a stale socket (no daemon behind it)",
			  sa.sun_path);
		unlink(sa.sun_path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			errno = 0;
	}
	if (errno && access(sa.sun_path, F_OK) != 0) {
		snprintf(err, errlen, "%s: bind: %s", sa.sun_path, strerror(errno));
		close(fd);
		return -errno;
	}
	if (listen(fd, 64) < 0) {
		snprintf(err, errlen, "%s: listen: %s", sa.sun_path, strerror(errno));
		close(fd);
		return -errno;
	}
	p->lfd = fd;
	p->sock_path = strdup(sa.sun_path);
	return 0;
}

static int watch(struct pager *p, int fd, uint32_t events, uint64_t data)
{
	struct epoll_event ev = { .events = events, .data.u64 = data };

	return epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

int pager_create(const struct pager_config *cfg, struct pager **out, char *err, size_t errlen)
{
	struct pager *p = calloc(1, sizeof(*p));
	sigset_t mask;
	int rc;

	*out = NULL;
	if (!p) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->cfg = *cfg;
	p->window = cfg->window ? cfg->window : DEFAULT_WINDOW;
	p->page = (uint64_t)sysconf(_SC_PAGESIZE);
	p->epfd = p->lfd = p->sfd = p->psifd = -1;
	if (!cfg->n_models) {
		snprintf(err, errlen, "no model to serve");
		free(p);
		return -EINVAL;
	}
	p->models = calloc(cfg->n_models, sizeof(*p->models));
	if (!p->models) {
		free(p);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->epfd = epoll_create1(EPOLL_CLOEXEC);
	rc = pio_create(IO_DEPTH, IO_CHUNK, &p->io);
	if (p->epfd < 0 || rc) {
		snprintf(err, errlen, "io_uring: %s", strerror(rc ? -rc : errno));
		goto fail;
	}
	for (unsigned i = 0; i < cfg->n_models; i++) {
		p->models[i].idx = i;
		rc = open_model(p, &p->models[i], cfg->models[i], err, errlen);
		p->n_models = i + 1;
		if (rc)
			goto fail;
	}
	rc = bind_socket(p, err, errlen);
	if (rc)
		goto fail;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGUSR2);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	p->sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	p->psifd = open_psi();
	if (p->psifd < 0)
		pager_log(PAGER_LOG_NOTICE, "no PSI memory trigger (%s): memory pressure is not watched",
			  strerror(errno));
	if ((rc = watch(p, p->lfd, EPOLLIN, EV(EV_LISTEN, p))) ||
	    (rc = watch(p, p->sfd, EPOLLIN, EV(EV_SIGNAL, p))) ||
	    (rc = watch(p, pio_fd(p->io), EPOLLIN, EV(EV_IO, p))) ||
	    (p->psifd >= 0 && (rc = watch(p, p->psifd, EPOLLPRI, EV(EV_PSI, p))))) {
		snprintf(err, errlen, "epoll: %s", strerror(-rc));
		goto fail;
	}
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		plan(m);
		policy_advance(m);
		pager_log(PAGER_LOG_NOTICE,
			  "serving %s: %.1f MiB, %u layers (largest %.1f MiB), %u planned resident",
			  m->name, m->lay->file_size / 1048576.0, m->lay->n_layers,
			  m->lay->max_layer_bytes / 1048576.0, m->n_resident);
	}
	*out = p;
	return 0;
fail:
	pager_destroy(p);
	return rc ? rc : -EINVAL;
}

int pager_run(struct pager *p)
{
	struct epoll_event evs[32];

	pager_log(PAGER_LOG_NOTICE, "listening on %s (budget %.1f MiB, window %u)", p->sock_path,
		  p->cfg.budget / 1048576.0, p->window);
	while (!p->stop) {
		int n = epoll_wait(p->epfd, evs, 32, -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			pager_log_errno(PAGER_LOG_ERR, errno, "epoll_wait");
			return -errno;
		}
		for (int i = 0; i < n; i++) {
			uint64_t d = evs[i].data.u64;

			switch (EV_KIND(d)) {
			case EV_LISTEN:
				on_accept(p);
				break;
			case EV_SIGNAL: {
				struct signalfd_siginfo si;

				if (read(p->sfd, &si, sizeof(si)) != sizeof(si))
					break;
				if (si.ssi_signo == SIGUSR1) {
					on_pressure(p, "SIGUSR1");
				} else if (si.ssi_signo == SIGUSR2) {
					on_restore(p);
				} else {
					pager_log(PAGER_LOG_NOTICE, "%s: shutting down",
						  strsignal((int)si.ssi_signo));
					p->stop = true;
				}
				break;
			}
			case EV_IO:
				pio_reap(p->io, io_done, p);
				break;
			case EV_PSI:
				on_pressure(p, "memory pressure");
				break;
			case EV_SOCK: {
				struct client *c = EV_PTR(d);

				if (!c->dead)
					on_sock(c);
				break;
			}
			case EV_UFFD: {
				struct client *c = EV_PTR(d);

				if (!c->dead)
					on_uffd(c);
				break;
			}
			}
		}
		reap_dead(p);
	}
	return 0;
}

void pager_destroy(struct pager *p)
{
	if (!p)
		return;
	while (p->clients) {
		struct client *c = p->clients;

		p->clients = c->next;
		free_client(c);
	}
	pio_destroy(p->io); /* waits for reads into the models' memory */
	for (unsigned i = 0; i < p->n_models; i++)
		close_model(&p->models[i]);
	free(p->models);
	if (p->lfd >= 0) {
		close(p->lfd);
		unlink(p->sock_path);
	}
	free(p->sock_path);
	if (p->sfd >= 0)
		close(p->sfd);
	if (p->psifd >= 0)
		close(p->psifd);
	if (p->epfd >= 0)
		close(p->epfd);
	free(p);
}
