/*
 * residency.c - what of each model is in memory, and why.
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
 * pressure (PSI, or SIGUSR1) a quarter of the resident layers are demoted
 * to streaming.
 *
 * Threading: the daemon's one thread; see server_i.h.
 */
#include "server_i.h"
#include "proto_i.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef HAVE_NUMA
#include <numa.h>
#endif

/* ---- memory of units -------------------------------------------------- */

/* A page of unit u that another unit also holds (a boundary page).  Such
 * pages are never punched: a neighbour may be loading into them while an
 * asynchronous punch is queued, and a page per boundary is cheap to keep. */
bool pager_page_shared(const struct model *m, unsigned u, uint64_t off)
{
	for (unsigned v = 0; v < m->lay->n_units; v++)
		if (v != u && pager_unit_has_page(&m->lay->units[v], off))
			return true;
	return false;
}


/* Unit u's own pages in its extent i: the extent without a first or last
 * page another unit shares.  False if none are left. */
static bool own_range(const struct model *m, unsigned u, unsigned i, struct pager_extent *own)
{
	const struct pager_extent *e = &m->lay->units[u].ext[i];
	uint64_t page = m->lay->page, off = e->off, end = e->off + e->len;

	if (pager_page_shared(m, u, off))
		off += page;
	if (end > off && pager_page_shared(m, u, end - page))
		end -= page;
	*own = (struct pager_extent){ off, end > off ? end - off : 0 };
	return end > off;
}

/* All of unit u's own pages, up to max ranges; 0 when there are more. */
static unsigned own_ranges(const struct model *m, unsigned u, struct pager_extent *out,
			   unsigned max)
{
	unsigned n = 0;

	for (unsigned i = 0; i < m->lay->units[u].n_ext; i++) {
		struct pager_extent e;

		if (!own_range(m, u, i, &e))
			continue;
		if (n == max)
			return 0;
		out[n++] = e;
	}
	return n;
}

/* Unit u is out of memory (its punches completed, or every client maps its
 * range from the memfd again and its slot is free). */
static void released(struct model *m, unsigned u)
{
	if (m->us[u].shed_pending) {
		m->us[u].shed_pending = false;
		pager_pressure_released(m->p, m->lay->units[u].bytes);
	}
	m->us[u].state = U_ABSENT;
	if (m->us[u].slot >= 0) {
		m->slot_unit[m->us[u].slot] = -1;
		m->us[u].slot = -1;
	} else {
		m->mem_bytes -= m->lay->units[u].bytes;
	}
	if (m->us[u].want_load) {
		m->us[u].want_load = false;
		pager_load(m, u);
	}
}

/*
 * Take unit u's pages out of memory, and with them out of every client's
 * page tables.  The punch holes are queued on the ring; until they complete
 * the unit is EVICTING: still counted against the budget, and not reloaded
 * (a load racing a queued punch would lose pages).  A unit in a slot is
 * EVICTING until every client maps its range from the memfd again.
 */
static void send_remap(struct client *c, unsigned u, bool to_slot);

static void release(struct model *m, unsigned u)
{
	const struct pager_unit *un = &m->lay->units[u];

	m->us[u].state = U_EVICTING;
	m->us[u].punches_left = 0;
	if (m->us[u].slot >= 0) {
		/* nothing to free: every client maps the range from the memfd
		 * again, and then the slot takes the next layer */
		m->us[u].remaps_left = 0;
		for (struct client *c = m->p->clients; c; c = c->next)
			if (c->m == m && c->state == C_ACTIVE && !c->dead && c->view[u] != VIEW_MODEL)
				send_remap(c, u, false);
		if (m->us[u].remaps_left == 0)
			released(m, u);
		return;
	}
	/* One punch per run of adjacent extents (a layer's tensors mostly
	 * follow each other): each punch unmaps its range from every client,
	 * a page-table walk and a TLB shootdown on the engines' cores. */
	struct pager_extent run = { 0, 0 };

	for (unsigned i = 0; i <= un->n_ext; i++) {
		struct pager_extent own = { 0, 0 };
		struct io_tag *tag;

		if (i < un->n_ext && !own_range(m, u, i, &own))
			continue;
		if (i < un->n_ext && run.len && own.off == run.off + run.len) {
			run.len += own.len;
			continue;
		}
		if (run.len && m->us[u].shed_pending) {
			/* Memory pressure: free it now, on this thread, rather
			 * than behind the reads queued on the ring. */
			if (fallocate(m->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				      (off_t)run.off, (off_t)run.len))
				pager_log_errno(PAGER_LOG_ERR, errno, "%s: evicting layer %d", m->name,
						un->layer);
		} else if (run.len) {
			tag = malloc(sizeof(*tag));
			if (!tag || pio_punch(m->p->io, m->memfd, run.off, run.len, tag)) {
				free(tag);
				pager_log(PAGER_LOG_ERR, "%s: cannot queue the eviction of layer %d",
					  m->name, un->layer);
			} else {
				*tag = (struct io_tag){ .m = m, .u = u, .kind = IO_PUNCH };
				m->us[u].punches_left++;
			}
		}
		run = own;
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

/*
 * The memory the engines declared (KV cache, buffers), set aside from the
 * budget.  While no connected engine has declared anything, the last total
 * stays reserved: an engine that exits is usually followed by another (the
 * same one, restarted) of the same size, and giving its memory to layers in
 * between would load them only to evict them when it declares again.
 */
uint64_t pager_declared(const struct pager *p)
{
	uint64_t d = pager_declared_connected(p);

	return d ? d : p->declared_hold;
}

/* What the connected engines declared, without the hold. */
uint64_t pager_declared_connected(const struct pager *p)
{
	uint64_t d = 0;

	for (const struct client *c = p->clients; c; c = c->next)
		if (!c->dead && (c->state == C_ACTIVE || c->state == C_REGISTER))
			d += c->declared;
	return d;
}

/* Client c (active) needs `bytes` of its own (its KV cache and buffers):
 * reserve them from the budget and re-plan every model.  More than the
 * budget can give the engines beside what streaming needs is refused: the
 * client is dropped with both numbers, the others are not disturbed. */
void pager_declare(struct client *c, uint64_t bytes)
{
	struct pager *p = c->p;
	uint64_t others = pager_declared_connected(p) - c->declared, d;
	uint64_t limit = plan_engine_limit(&p->plan, p->plan_models, p->n_models);

	if (bytes > limit || others > limit - bytes) {
		char why[256];

		snprintf(why, sizeof(why),
			 "it needs %.1f MiB of its own, and the budget leaves %.1f MiB for engines "
			 "(%.1f MiB, less the %.1f MiB streaming needs%s)",
			 bytes / 1048576.0, (limit - (others < limit ? others : limit)) / 1048576.0,
			 p->cfg.budget / 1048576.0, p->plan.minimum / 1048576.0,
			 others ? ", less what other engines declared" : "");
		pager_drop_client(c, why);
		return;
	}
	c->declared = bytes;
	d = pager_declared_connected(p);
	if (d)
		p->declared_hold = d;
	pager_log(PAGER_LOG_NOTICE, "client pid %d declares %.1f MiB of its own (engines: %.1f MiB in all)",
		  (int)c->pid, bytes / 1048576.0, pager_declared(p) / 1048576.0);
	pager_replan(p);
}

/* What this model may hold (plan.c's allowance): its minimum, and its share
 * of what the engines and the mode leave of the budget. */
uint64_t pager_allowance(const struct model *m)
{
	return m->p->plan_models[m->idx].allowance;
}

/* ---- mapping into clients --------------------------------------------- */

/*
 * Read what client c's uffd holds without handling it: an event (the client
 * moving a range into place, client.c) holds every CONTINUE off with EAGAIN
 * until it is read, and the faults read with it wait in the backlog for
 * pager_on_uffd.
 */
static void drain_uffd(struct client *c)
{
	struct uffd_msg msgs[16];
	ssize_t n = read(c->uffd, msgs, sizeof(msgs));

	for (ssize_t i = 0; i < n / (ssize_t)sizeof(msgs[0]); i++) {
		if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
			continue;
		if (c->n_backlog == c->cap_backlog) {
			unsigned cap = c->cap_backlog ? 2 * c->cap_backlog : 16;
			struct uffd_msg *b = realloc(c->backlog, cap * sizeof(*b));

			if (!b) {
				pager_drop_client(c, "out of memory");
				return;
			}
			c->backlog = b;
			c->cap_backlog = cap;
		}
		c->backlog[c->n_backlog++] = msgs[i];
	}
}

/* The uffd error policy, in one place: EEXIST (already mapped) is success,
 * EAGAIN (the mm is changing: an event waits to be read) means drain the
 * uffd and retry, ENOENT/ESRCH/EINVAL mean the client's mapping or process
 * is gone. */
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
			drain_uffd(c);
			if (c->dead)
				return -ENOMEM;
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

/* A CONTINUE failed: ENOENT (the range is no longer registered: it unmapped
 * the model) and ESRCH (its process is exiting) are a client on its way
 * out, which its socket's EOF will confirm; anything else is a fault. */
static void uffd_failed(struct client *c, int rc)
{
	pager_drop_client(c, rc == -ENOENT || rc == -ESRCH ? NULL : "its mapping is gone");
}


/* CONTINUE [off, end) into client c, skipping tripwire pages when trip. */
static int map_range(struct client *c, const struct pager_unit *un, uint64_t off, uint64_t end,
		     bool trip)
{
	uint64_t page = c->m->lay->page;
	unsigned t = 0;
	int rc = 0;

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
	return rc;
}

/* Can client c be given unit u's pages?  Read, and for a unit in a slot,
 * mapped from that slot at the client (its REMAP answered). */
static bool ready_for(const struct client *c, unsigned u)
{
	const struct model *m = c->m;

	return m->us[u].state == U_LOADED && (m->us[u].slot < 0 || c->view[u] == VIEW_SLOT);
}

/* Map unit u into client c: whole extents, minus tripwires for streamed
 * layers (so the first touch tells us the engine arrived).  One CONTINUE
 * works within one mapping, so a shared boundary page (in the memfd) and a
 * unit's own pages (in a slot, maybe) go separately. */
void pager_map_unit(struct client *c, unsigned u)
{
	const struct model *m = c->m;
	const struct pager_unit *un = &m->lay->units[u];
	bool trip = !m->us[u].resident && un->layer >= 0;
	int rc = 0;

	if (!ready_for(c, u))
		return;
	for (unsigned i = 0; i < un->n_ext && !rc; i++) {
		uint64_t off = un->ext[i].off, end = off + un->ext[i].len;
		struct pager_extent own;

		if (!own_range(m, u, i, &own)) {
			rc = map_range(c, un, off, end, trip);
			continue;
		}
		rc = map_range(c, un, off, own.off, trip);
		if (!rc)
			rc = map_range(c, un, own.off, own.off + own.len, trip);
		if (!rc)
			rc = map_range(c, un, own.off + own.len, end, trip);
	}
	if (rc)
		uffd_failed(c, rc);
}

static void map_unit_everywhere(struct model *m, unsigned u)
{
	for (struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && c->state == C_ACTIVE && !c->dead)
			pager_map_unit(c, u);
}

/* ---- streaming slots -------------------------------------------------- */

/*
 * A streamed layer read into fresh memfd pages and punched out after use
 * costs a page allocation and zeroing for every page, and on virtual
 * machines that hand freed memory back to the host, the host's page faults
 * as well: about 0.5 s of CPU per GB here, on the cores the engine computes
 * on (design.md, "Reads").  So streamed layers are read into slots of a
 * second memfd whose pages, once there, are kept and reused: window + 1
 * slots, each as large as the largest layer's own pages (a boundary page
 * another unit shares stays in the model's memfd).  While a layer is in a
 * slot, every client maps the slot at the layer's range (a REMAP the client
 * carries out, client.c), and back the model's memfd, where those pages
 * were never filled, once the layer leaves; the slot takes the next layer
 * when every client has answered.  A layer that finds no slot free (clients
 * far apart), a resident layer and unit 0 are read into the memfd as
 * before.  With --fuse the memfd also serves the mount's reads at the
 * file's offsets: such a daemon has no slots.
 */
#define SLOT_RANGES PROTO_REMAP_MAX

int pager_slots_create(struct model *m)
{
	struct pager_extent own[SLOT_RANGES];
	unsigned L = m->lay->n_layers;

	m->slotfd = -1;
	for (unsigned u = 0; u < m->lay->n_units; u++)
		m->us[u].slot = -1;
	if (m->p->cfg.fuse_dir || L == 0)
		return 0;
	for (unsigned u = 1; u <= L; u++) {
		unsigned n = own_ranges(m, u, own, SLOT_RANGES);
		uint64_t b = 0;

		for (unsigned i = 0; i < n; i++)
			b += own[i].len;
		if (b > m->slot_size)
			m->slot_size = b;
	}
	if (!m->slot_size)
		return 0;
	m->n_slots = m->p->window + 1 < L ? m->p->window + 1 : L;
	m->slot_unit = malloc(m->n_slots * sizeof(*m->slot_unit));
	m->slot_touched = calloc(m->n_slots, sizeof(*m->slot_touched));
	m->slotfd = memfd_create(m->name, MFD_CLOEXEC);
	if (!m->slot_unit || !m->slot_touched || m->slotfd < 0 ||
	    ftruncate(m->slotfd, (off_t)(m->n_slots * m->slot_size)) < 0)
		return m->slotfd < 0 ? -errno : -ENOMEM;
	m->slot_map = mmap(NULL, m->n_slots * m->slot_size, PROT_READ | PROT_WRITE, MAP_SHARED,
			   m->slotfd, 0);
	if (m->slot_map == MAP_FAILED) {
		m->slot_map = NULL;
		return -errno;
	}
	for (unsigned s = 0; s < m->n_slots; s++)
		m->slot_unit[s] = -1;
	return 0;
}

void pager_slots_destroy(struct model *m)
{
	if (m->slot_map)
		munmap(m->slot_map, m->n_slots * m->slot_size);
	if (m->slotfd >= 0)
		close(m->slotfd);
	free(m->slot_unit);
	free(m->slot_touched);
}

/* The slot unit u would be read into, or -1 (the memfd). */
static int find_slot(const struct model *m, unsigned u)
{
	struct pager_extent own[SLOT_RANGES];

	if (!m->n_slots || u == 0 || m->us[u].resident || !own_ranges(m, u, own, SLOT_RANGES))
		return -1;
	for (unsigned s = 0; s < m->n_slots; s++)
		if (m->slot_unit[s] < 0)
			return (int)s;
	return -1;
}

/* What loading unit u adds to the memory held: its bytes in the memfd, or a
 * slot's the first time that slot is used. */
static uint64_t load_cost(const struct model *m, unsigned u)
{
	int s = find_slot(m, u);

	if (s < 0)
		return m->lay->units[u].bytes;
	return m->slot_touched[s] ? 0 : m->slot_size;
}

/* Unit u goes into its slot (us[u].slot): every client is asked to map it. */
static void take_slot(struct model *m, unsigned u)
{
	int s = m->us[u].slot;

	if (!m->slot_touched[s]) {
		m->slot_touched[s] = true;
		m->slot_bytes += m->slot_size;
	}
	m->slot_unit[s] = (int)u;
	m->slot_loads++;
	/* (a client still registering is asked once it has READY:
	 * pager_slots_attach) */
	for (struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && c->ready && !c->dead)
			send_remap(c, u, true);
}

/* Send c's queued REMAPs while fewer than REMAPS_IN_FLIGHT are unanswered. */
static void flush_remaps(struct client *c)
{
	struct remap_wait *w = c->remaps;

	while (w && w->sent)
		w = w->next;
	for (; w && c->remaps_sent < REMAPS_IN_FLIGHT && !c->dead; w = w->next) {
		if (proto_send(c->fd, PROTO_REMAP, w->msg, w->len, -1)) {
			pager_drop_client(c, "cannot send it REMAP");
			return;
		}
		w->sent = true;
		c->remaps_sent++;
	}
}

/* Ask client c to map unit u's range from its slot (to_slot) or from the
 * memfd; the answer comes back as REMAPPED (pager_on_remapped). */
static void send_remap(struct client *c, unsigned u, bool to_slot)
{
	struct model *m = c->m;
	struct pager_extent own[SLOT_RANGES];
	unsigned n = own_ranges(m, u, own, SLOT_RANGES);
	uint32_t len = PROTO_REMAP_FIXED + n * PROTO_REMAP_RANGE;
	uint64_t at = (uint64_t)m->us[u].slot * m->slot_size;
	struct remap_wait *w = malloc(sizeof(*w) + len);

	if (!w) {
		pager_drop_client(c, "out of memory");
		return;
	}
	*w = (struct remap_wait){ .seq = ++c->remap_seq, .u = u, .to_slot = to_slot, .len = len };
	proto_put_u32(w->msg, w->seq);
	proto_put_u32(w->msg + 4, n);
	for (unsigned i = 0; i < n; i++) {
		uint8_t *r = w->msg + PROTO_REMAP_FIXED + i * PROTO_REMAP_RANGE;

		proto_put_u64(r, own[i].off);
		proto_put_u64(r + 8, own[i].len);
		proto_put_u64(r + 16, to_slot ? at : PROTO_FROM_MODEL);
		at += own[i].len;
	}
	*c->remaps_tail = w;
	c->remaps_tail = &w->next;
	c->view[u] = to_slot ? VIEW_SLOT_PENDING : VIEW_MODEL_PENDING;
	if (!to_slot)
		m->us[u].remaps_left++;
	flush_remaps(c);
}

/* One more client maps unit u from the memfd again; the last one frees its
 * slot. */
static void remap_done(struct model *m, unsigned u)
{
	if (m->us[u].remaps_left && --m->us[u].remaps_left == 0 && m->us[u].state == U_EVICTING) {
		released(m, u);
		pager_policy_advance(m); /* the slot may let a load start */
	}
}

/* A client that just registered: the units in slots are mapped from them. */
void pager_slots_attach(struct client *c)
{
	struct model *m = c->m;

	for (unsigned u = 0; u < m->lay->n_units && !c->dead; u++)
		if (m->us[u].slot >= 0 &&
		    (m->us[u].state == U_LOADING || m->us[u].state == U_LOADED))
			send_remap(c, u, true);
}

static void resolve(struct client *c, uint64_t off, uint64_t since);

/* Client c answered REMAP seq (they come back in the order sent). */
void pager_on_remapped(struct client *c, uint32_t seq)
{
	struct remap_wait *w = c->remaps;
	struct model *m = c->m;
	unsigned u;

	if (!w || !w->sent || w->seq != seq) {
		pager_drop_client(c, "it answered a REMAP it was not sent");
		return;
	}
	c->remaps = w->next;
	if (!c->remaps)
		c->remaps_tail = &c->remaps;
	c->remaps_sent--;
	flush_remaps(c);
	u = w->u;
	if (!w->to_slot) {
		if (c->view[u] == VIEW_MODEL_PENDING)
			c->view[u] = VIEW_MODEL;
		free(w);
		remap_done(m, u);
		return;
	}
	free(w);
	if (c->view[u] != VIEW_SLOT_PENDING)
		return; /* a REMAP back to the memfd followed it */
	c->view[u] = VIEW_SLOT;
	if (!ready_for(c, u))
		return;
	pager_map_unit(c, u);
	/* its faults on the unit, which waited for the slot to be mapped */
	for (struct waiter **pw = &m->waiters[u]; *pw && !c->dead;) {
		struct waiter *x = *pw;

		if (x->c != c) {
			pw = &x->next;
			continue;
		}
		*pw = x->next;
		resolve(c, x->off, x->since_ns);
		free(x);
	}
}

/* A client is going: the REMAPs it will never answer count as done. */
void pager_slots_forget(struct client *c)
{
	while (c->remaps) {
		struct remap_wait *w = c->remaps;

		c->remaps = w->next;
		if (!w->to_slot && !c->p->stop)
			remap_done(c->m, w->u);
		free(w);
	}
	c->remaps_tail = &c->remaps;
}

/* ---- loading ---------------------------------------------------------- */

static void wake_waiters(struct model *m, unsigned u);

int pager_load(struct model *m, unsigned u)
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
	*tag = (struct io_tag){ .m = m, .u = u, .kind = IO_LOAD };
	m->us[u].state = U_LOADING;
	m->us[u].reads_left = 1; /* held until every chunk is queued */
	m->us[u].io_err = 0;
	m->us[u].loads++;
	m->us[u].slot = find_slot(m, u);
	if (m->us[u].slot >= 0)
		take_slot(m, u);
	else
		m->mem_bytes += un->bytes;
	/* Each extent: into the memfd, or, in a slot, its own pages there (one
	 * after the other) and any shared boundary page into the memfd. */
	uint64_t at = m->us[u].slot >= 0 ? (uint64_t)m->us[u].slot * m->slot_size : 0;
	for (unsigned i = 0; i < un->n_ext && !m->us[u].io_err; i++) {
		const struct pager_extent *e = &un->ext[i];
		struct pager_extent part[3] = { *e, { 0, 0 }, { 0, 0 } }, own;
		uint8_t *dst[3] = { m->map + e->off, NULL, NULL };

		if (m->us[u].slot >= 0 && own_range(m, u, i, &own)) {
			part[0] = (struct pager_extent){ e->off, own.off - e->off };
			part[1] = own;
			part[2] = (struct pager_extent){ own.off + own.len,
							 e->off + e->len - own.off - own.len };
			dst[1] = m->slot_map + at;
			dst[2] = m->map + own.off + own.len;
			at += own.len;
		}
		for (unsigned k = 0; k < 3; k++) {
			int n = part[k].len ? pio_read(m->p->io, m->fd, dst[k], part[k].off, part[k].len,
						       m->lay->file_size, tag)
					    : 0;

			if (n < 0) {
				m->us[u].io_err = n;
				break;
			}
			m->us[u].reads_left += (unsigned)n;
		}
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

void pager_io_done(void *tag_, int err, uint64_t bytes, bool last, void *arg)
{
	struct io_tag *tag = tag_;
	struct model *m = tag->m;
	unsigned u = tag->u;
	struct ustat *us = &m->us[u];

	(void)arg;
	if (tag->kind == IO_STAGE) {
		pager_fuse_staged(tag, err, bytes, last);
		return;
	}
	if (tag->kind == IO_DIRECT) {
		pager_fuse_direct_done(tag, err, bytes, last);
		return;
	}
	if (tag->kind == IO_PUNCH) {
		free(tag);
		if (err)
			pager_log_errno(PAGER_LOG_ERR, err, "%s: evicting unit %u", m->name, u);
		if (--us->punches_left == 0) {
			released(m, u);
			pager_policy_advance(m); /* the freed memory may let loads start */
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
			pager_drop_client(w->c, "the model file could not be read");
		if (m->p->fuse)
			pager_fuse_unit_failed(m, u);
		return;
	}
	us->state = U_LOADED;
	map_unit_everywhere(m, u);
	wake_waiters(m, u);
}

/* ---- policy ----------------------------------------------------------- */

/* The order layers become resident in (plan.c): m->rank. -ENOMEM, or 0. */
int pager_plan_init(struct model *m)
{
	unsigned L = m->lay->n_layers;

	m->rank = calloc(L ? L : 1, sizeof(*m->rank));
	if (!m->rank)
		return -ENOMEM;
	return plan_order(L, m->rank);
}

/* The most of m's sparse tensor (the embedding, read a block at a time)
 * that is kept in memory. */
static uint64_t sparse_held(const struct model *m)
{
	return m->lay->sparse.len < PAGER_SPARSE_CAP ? m->lay->sparse.len : PAGER_SPARSE_CAP;
}

/* Its layers' bytes. */
static uint64_t layer_bytes(const struct model *m)
{
	uint64_t n = 0;

	for (unsigned u = 1; u < m->lay->n_units; u++)
		n += m->lay->units[u].bytes;
	return n;
}

/* What m holds with every layer resident: no slots, the sparse cache. */
static uint64_t full_bytes(const struct model *m)
{
	return m->lay->units[0].bytes + layer_bytes(m) + sparse_held(m);
}

static bool has_uffd_clients(const struct model *m);

/* Copies of m's resident layers that exist at once: the memfd's for the
 * userfaultfd engines and the mount's page cache for the readers of the
 * file are separate memory, so with both kinds of consumer every resident
 * byte is held twice. */
static unsigned copies(const struct model *m)
{
	return m->fuse_inode && has_uffd_clients(m) ? 2 : 1;
}

/* What streaming model m needs at least (plan.c), in `n` copies: with a
 * FUSE mount, its staging buffers too (once). */
static uint64_t minimum(const struct model *m, const struct pager *p, unsigned n)
{
	return n * plan_minimum(full_bytes(m), m->lay->units[0].bytes, m->lay->max_layer_bytes,
				m->lay->n_layers, p->window, sparse_held(m), 0) +
	       (p->cfg.fuse_dir ? PAGER_FUSE_STAGING : 0);
}

/* Share the budget (plan.c) and mark each model's resident layers: the
 * first n_resident of its spread order. */
void pager_plan(struct pager *p)
{
	p->plan.budget = p->cfg.budget;
	p->plan.declared = pager_declared(p);
	p->plan.resident = p->cfg.resident;
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];
		struct plan_model *pm = &p->plan_models[i];
		unsigned L = m->lay->n_layers, n = copies(m);

		m->copies = n;
		pm->full = n * full_bytes(m) + (p->cfg.fuse_dir ? PAGER_FUSE_STAGING : 0);
		pm->minimum = minimum(m, p, n);
		pm->layer_bytes = L ? n * layer_bytes(m) / L : 0;
		pm->n_layers = L;
		pm->window = p->window;
		pm->shed = m->shed;
	}
	plan_compute(&p->plan, p->plan_models, p->n_models);
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];
		unsigned n = p->plan_models[i].n_resident;

		m->n_resident = n;
		m->us[0].resident = true;
		for (unsigned l = 0; l < m->lay->n_layers; l++)
			m->us[l + 1].resident = m->rank[l] < n;
	}
}

/* Plan again and carry it out in every model. */
void pager_replan(struct pager *p)
{
	pager_plan(p);
	for (unsigned i = 0; i < p->n_models; i++)
		pager_policy_advance(&p->models[i]);
}

/* Is streamed unit u within `window` streamed layers ahead of a client of m
 * (or the one a client is in)?  fuse: ask about the mount's readers, else
 * about the userfaultfd clients. */
static bool needed_by(const struct model *m, unsigned u, bool fuse)
{
	unsigned L = m->lay->n_layers;

	for (const struct client *c = m->p->clients; c; c = c->next) {
		unsigned seen = 0;

		if (c->m != m || c->state != (fuse ? C_FUSE : C_ACTIVE))
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

static bool has_uffd_clients(const struct model *m)
{
	for (const struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && (c->state == C_ACTIVE || c->state == C_REGISTER))
			return true;
	return false;
}

/* Should unit u be in the mount's page cache?  Resident units always, and
 * the streamed ones the mount's reader is in or about to reach; but only
 * once the file was opened: before, the kernel has no page cache for it. */
bool pager_fuse_wants(const struct model *m, unsigned u)
{
	return m->fuse_reader && m->fuse_inode && (m->us[u].resident || needed_by(m, u, true));
}

/* Is a store of unit u into the page cache still to do?  Streamed layers are
 * stored without their tripwire page (see fuse.c), resident ones whole. */
bool pager_fuse_store_due(const struct model *m, unsigned u)
{
	return pager_fuse_wants(m, u) && (m->us[u].pc == PC_NONE || m->us[u].pc == PC_SOME);
}

/*
 * Should unit u be in the memfd?  The memfd serves userfaultfd clients:
 * resident units and their streaming window (resident units also when no one
 * is connected yet and there is no mount, so the first engine finds them
 * ready).  The mount has its own path into the page cache (fuse.c), and
 * reads what the memfd happens to hold.
 */
bool pager_wants_mem(const struct model *m, unsigned u)
{
	bool uffd = has_uffd_clients(m) || !m->fuse_reader;

	return uffd && (m->us[u].resident || needed_by(m, u, false));
}

/* Bytes this model holds against its allowance: its memfd and what it put
 * in the mount's page cache (the mount's staging buffers are in the plan). */
uint64_t pager_held(const struct model *m)
{
	return m->mem_bytes + m->slot_bytes + m->cache_bytes + m->sparse_bytes +
	       m->fuse_sparse_bytes;
}

/* Bring memory in line with the plan and the clients' positions: evict what
 * is not wanted, let the mount's page cache follow (fuse.c), then load what
 * is wanted while the allowance has room. */
void pager_policy_advance(struct model *m)
{
	unsigned U = m->lay->n_units;

	/* an engine and a reader of the mount arrived or left: the copies */
	if (copies(m) != m->copies)
		pager_plan(m->p);

	uint64_t allow = pager_allowance(m);

	/* This also frees layers a shrunken plan (pressure, a new client's
	 * declared memory) no longer keeps resident. */
	/* A layer memory pressure demoted goes now, even if the engine is
	 * about to need it: freeing the memory is the point, and reading it
	 * again into a slot is what streaming costs anyway. */
	for (unsigned u = 1; u < U; u++)
		if (m->us[u].state == U_LOADED && !m->waiters[u] &&
		    (!pager_wants_mem(m, u) || m->us[u].shed_pending ||
		     (m->us[u].slot >= 0 && m->us[u].resident)) &&
		    !(m->p->fuse && pager_fuse_waits_for(m, u)))
			evict(m, u); /* (a slot's layer planned resident goes to the memfd) */
	if (m->fuse_reader && m->us[0].state == U_LOADED && !pager_wants_mem(m, 0) && !m->waiters[0] &&
	    !pager_fuse_waits_for(m, 0))
		evict(m, 0);
	if (m->fuse_reader)
		pager_fuse_advance(m);
	/* Queue loads in the order the engine will need them: unit 0, then the
	 * layers from where the first located client is, cyclically.  The
	 * reader is one FIFO, so this is the order the bytes arrive in. */
	unsigned from = 0;
	for (const struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && c->state == C_ACTIVE && !c->dead && c->pos > 0) {
			from = (unsigned)c->pos - 1;
			break;
		}
	for (unsigned k = 0; k < U; k++) {
		unsigned u = k == 0 ? 0 : (from + k - 1) % (U - 1) + 1;

		if (m->us[u].state != U_ABSENT || !pager_wants_mem(m, u))
			continue;
		if (pager_held(m) + load_cost(m, u) > allow && u != 0)
			continue; /* no room now; retried at the next step */
		if (pager_load(m, u))
			break;
	}
}

/* ---- resolving faults ------------------------------------------------- */

static void resolve(struct client *c, uint64_t off, uint64_t since)
{
	struct model *m = c->m;
	uint64_t page = m->lay->page;
	int u = pager_layout_unit_of(m->lay, off);
	uint64_t waited = pager_now_ns() - since;
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
				uffd_failed(c, rc);
				return;
			}
		}
	}
	rc = uffd_continue(c, off, page);
	if (rc)
		uffd_failed(c, rc);
}

/* Unit u is read: answer the faults waiting for it, but for clients that
 * have yet to map its slot (they are answered when they have: see
 * pager_on_remapped). */
static void wake_waiters(struct model *m, unsigned u)
{
	struct waiter **pw = &m->waiters[u];

	while (*pw) {
		struct waiter *w = *pw;

		if (!w->c->dead && !ready_for(w->c, u)) {
			pw = &w->next;
			continue;
		}
		*pw = w->next;
		if (!w->c->dead)
			resolve(w->c, w->off, w->since_ns);
		free(w);
	}
	if (m->p->fuse)
		pager_fuse_unit_ready(m);
	pager_policy_advance(m);
}

/* ---- sparse pages ----------------------------------------------------- */

/*
 * The token embedding (when the output has its own matrix) belongs to no
 * unit: a token reads one row of it, so keeping it resident would waste
 * hundreds of MiB of the budget on rows no one reads.  A fault on it reads
 * the block around the page, synchronously (one per token, ~0.1 ms); the
 * blocks stay until they pass SPARSE_CAP, and then all go at once.
 */
#define SPARSE_BLOCK (64u << 10)

static void drop_sparse(struct model *m)
{
	uint64_t off, end;

	if (pager_layout_sparse_own(m->lay, &off, &end) &&
	    fallocate(m->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
		      (off_t)(end - off)) < 0)
		pager_log_errno(PAGER_LOG_ERR, -errno, "%s: dropping the token embedding", m->name);
	m->sparse_bytes = 0;
}

static int load_sparse(struct model *m, uint64_t off)
{
	const struct pager_extent *sp = &m->lay->sparse;
	uint64_t start = off - off % SPARSE_BLOCK, end = start + SPARSE_BLOCK;

	if (start < sp->off)
		start = sp->off;
	if (end > sp->off + sp->len)
		end = sp->off + sp->len;
	if (m->sparse_bytes + (end - start) > PAGER_SPARSE_CAP)
		drop_sparse(m);
	for (uint64_t at = start; at < end;) {
		ssize_t n = pread(m->fd, m->map + at, end - at, (off_t)at);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break; /* the file's end, inside its last page */
		at += (uint64_t)n;
		m->bytes_read += (uint64_t)n;
	}
	m->sparse_bytes += end - start;
	return 0;
}

/* ---- faults ----------------------------------------------------------- */

static void on_fault(struct client *c, uint64_t addr, bool minor)
{
	struct model *m = c->m;
	uint64_t off = (addr - c->base) & ~(m->lay->page - 1);
	int u;

	if (addr < c->base || addr - c->base >= m->lay->map_size) {
		pager_drop_client(c, "it faulted outside its model");
		return;
	}
	u = pager_layout_unit_of(m->lay, off);
	if (u == PAGER_SPARSE) {
		c->faults++;
		/* MISSING: not in the memfd yet; MINOR: there, not mapped */
		if (!minor && load_sparse(m, off)) {
			pager_drop_client(c, "the model file could not be read");
			return;
		}
		resolve(c, off, pager_now_ns());
		return;
	}
	if (u < 0) {
		pager_drop_client(c, "it faulted on a page no unit covers");
		return;
	}
	c->faults++;
	m->us[u].faults++;
	if (ready_for(c, u)) {
		resolve(c, off, pager_now_ns());
		pager_policy_advance(m);
		return;
	}
	struct waiter *w = malloc(sizeof(*w));
	if (!w) {
		pager_drop_client(c, "out of memory");
		return;
	}
	w->c = c;
	w->off = off;
	w->since_ns = pager_now_ns();
	w->next = m->waiters[u];
	m->waiters[u] = w;
	if (u > 0 && (unsigned)u != (unsigned)c->pos)
		c->pos = u; /* it is here, waiting */
	if (m->us[u].state == U_EVICTING) {
		m->us[u].want_load = true;
	} else if (m->us[u].state == U_ABSENT) {
		/* A demand miss: the window did not cover it.  Make room. */
		pager_policy_advance(m);
		if (m->us[u].state == U_ABSENT && pager_load(m, u))
			pager_drop_client(c, "the model file could not be read");
	}
}

void pager_on_uffd(struct client *c)
{
	struct uffd_msg msgs[16];

	/* faults read while draining (uffd_continue), in order */
	for (unsigned i = 0; i < c->n_backlog && !c->dead; i++)
		on_fault(c, c->backlog[i].arg.pagefault.address,
			 c->backlog[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR);
	c->n_backlog = 0;

	for (;;) {
		ssize_t n = read(c->uffd, msgs, sizeof(msgs));

		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			pager_drop_client(c, "its userfaultfd failed");
			return;
		}
		if (n == 0 || n % (ssize_t)sizeof(msgs[0])) {
			pager_drop_client(c, "its userfaultfd returned a partial message");
			return;
		}
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msgs[0]) && !c->dead; i++)
			if (msgs[i].event == UFFD_EVENT_PAGEFAULT)
				on_fault(c, msgs[i].arg.pagefault.address,
					 msgs[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR);
	}
}


/* ---- memory pressure -------------------------------------------------- */

/* ---- NUMA placement --------------------------------------------------- */

/*
 * Bind the model's image to the node process pid runs on, and issue the
 * reads from there: new pages of the memfd come from that node (pages
 * already read stay where they are; moving them would cost more than the
 * remote reads they save).  Called at start-up for the daemon itself and
 * again for a model's first client.  A no-op without libnuma or on a
 * one-node machine.
 */
void pager_place(struct model *m, pid_t pid)
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

