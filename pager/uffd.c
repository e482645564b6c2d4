/*
 * uffd.c - the engines' way to the pages: userfaultfd.
 *
 * Clients register their mapping with a userfaultfd (MISSING | MINOR) and give
 * it to the daemon.  A client touching a page that is not in the memfd raises
 * MISSING; one touching a page that is in the memfd but not mapped into it
 * raises MINOR.  The daemon answers either with UFFDIO_CONTINUE once the
 * page's unit is completely read - never earlier, so a client never sees a
 * half-written page.  Whole units are mapped with one CONTINUE as soon as
 * they are read (unit_ready), so in steady state the engine takes no fault
 * except one tripwire per streamed layer: the first page of each tensor is
 * left unmapped, and the first fault in a layer tells the policy where the
 * engine is (c->pos).
 *
 * A streamed layer read into a streaming slot (residency.c) is mapped from
 * the slot: each client is asked to move the slot's pages into place (a
 * REMAP it carries out and answers, client.c) before its faults there are
 * answered, and to move the memfd back once the layer leaves.
 *
 * This is one consumer of the policy (residency.c), behind pager_uffd_ops;
 * the FUSE mount (fuse.c) is the other.
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
	bool trip = !m->us[u].resident && un->layer >= 0 && un->expert < 0;
	int rc = 0;

	if (!ready_for(c, u))
		return;
	for (unsigned i = 0; i < un->n_ext && !rc; i++) {
		uint64_t off = un->ext[i].off, end = off + un->ext[i].len;
		struct pager_extent own;

		if (!pager_own_range(m, u, i, &own)) {
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

/* ---- streaming slots: the clients' side -------------------------------- */

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
		w->sent_ns = pager_now_ns();
		c->remaps_sent++;
	}
}

/* Queue w for client c: a unit into its slot, which a fault may wait for,
 * goes before the unsent REMAPs back to the memfd, which only free slots
 * (each is for another unit: a unit goes into a slot only once every REMAP
 * of it back has been answered). */
static void queue_remap(struct client *c, struct remap_wait *w)
{
	struct remap_wait **at = &c->remaps;

	if (w->to_slot)
		while (*at && ((*at)->sent || (*at)->to_slot))
			at = &(*at)->next;
	else
		at = c->remaps_tail;
	w->next = *at;
	*at = w;
	if (!w->next)
		c->remaps_tail = &w->next;
}

/* Ask client c to map unit u's range from its slot (to_slot) or from the
 * memfd; the answer comes back as REMAPPED (pager_on_remapped). */
static void send_remap(struct client *c, unsigned u, bool to_slot)
{
	struct model *m = c->m;
	struct pager_extent own[PROTO_REMAP_MAX];
	unsigned n = pager_own_ranges(m, u, own, PROTO_REMAP_MAX);
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
	queue_remap(c, w);
	c->view[u] = to_slot ? VIEW_SLOT_PENDING : VIEW_MODEL_PENDING;
	if (!to_slot)
		m->us[u].remaps_left++;
	flush_remaps(c);
}

/* One more client maps unit u from the memfd again; the last one frees its
 * slot. */
static void remap_done(struct model *m, unsigned u)
{
	if (m->us[u].remaps_left && --m->us[u].remaps_left == 0 && m->us[u].state == U_EVICTING)
		pager_slot_vacated(m, u);
}

/* Unit u was given its slot (residency.c): every client that has READY
 * maps it from there (one still registering will: pager_slots_attach). */
void pager_uffd_slot_in(struct model *m, unsigned u)
{
	for (struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && c->ready && !c->dead)
			send_remap(c, u, true);
}

/* Unit u leaves its slot: every client maps its range from the memfd again.
 * Returns how many answers to wait for; the last calls pager_slot_vacated. */
unsigned pager_uffd_slot_out(struct model *m, unsigned u)
{
	m->us[u].remaps_left = 0;
	for (struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && c->state == C_ACTIVE && !c->dead && c->view[u] != VIEW_MODEL)
			send_remap(c, u, false);
	return m->us[u].remaps_left;
}

/*
 * A client that leaves its REMAPs unanswered (stopped: SIGSTOP, a debugger)
 * holds up the slots it maps: a slot's next layer waits for every client's
 * answer, and so does a layer on its way out that another engine faults on
 * again.  That engine would wait for as long as the other is stopped.  So
 * once a client has left a REMAP unanswered for REMAP_STALL_NS while another
 * client of the model waits on a fault, it is dropped, which answers for it;
 * when it runs again its watchdog finds the connection closed, with the
 * reason, and the engine exits.  A live engine answers within a few
 * milliseconds (1.5 ms on average in tests/pager_budget.py's runs here).
 */
void pager_uffd_drop_stalled(struct pager *p)
{
	uint64_t now = pager_now_ns();
	char why[96];

	snprintf(why, sizeof(why), "it left a REMAP unanswered for %llu s while another engine "
				   "waited", REMAP_STALL_NS / 1000000000);
	for (struct client *c = p->clients; c; c = c->next) {
		if (c->state != C_ACTIVE || c->dead || !c->remaps || !c->remaps->sent ||
		    now - c->remaps->sent_ns < REMAP_STALL_NS)
			continue;
		for (const struct client *o = p->clients; o; o = o->next)
			if (o != c && o->m == c->m && o->n_waiting && !o->dead) {
				pager_drop_client(c, why);
				break;
			}
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

/* One of client c's waiting faults is answered.  The client waited while
 * any of its faults did: its threads fault together (two on one expert,
 * each on a part of a layer), and a sum of their waits would count the same
 * time once per thread (the speed predictor's compute, wall time less the
 * waits, came out far too low). */
static void wait_over(struct client *c)
{
	if (c->n_waiting && !--c->n_waiting)
		c->wait_ns += pager_now_ns() - c->waiting_since;
}

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
	m->remaps++;
	m->remap_ns += pager_now_ns() - w->sent_ns;
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
		wait_over(c);
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

/* ---- resolving faults ------------------------------------------------- */

static void resolve(struct client *c, uint64_t off, uint64_t since)
{
	struct model *m = c->m;
	uint64_t page = m->lay->page;
	int u = pager_layout_unit_of(m->lay, off);
	uint64_t waited = pager_now_ns() - since;
	int rc;

	m->fault_wait_ns += waited; /* the client's own: wait_over */
	/* A fault in a layer means the client is in it: note the position
	 * and map the layer's remaining tripwires, so it takes one fault per
	 * layer, not one per tensor. */
	if (u > 0) {
		const struct pager_unit *un = &m->lay->units[u];

		c->pos = un->layer + 1; /* an expert's: its layer's */
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
		if (!w->c->dead) {
			resolve(w->c, w->off, w->since_ns);
			wait_over(w->c);
		}
		free(w);
	}
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
	/* A page two experts share is given to the later one; the one the
	 * engine routed to, or is being read, is the likelier. */
	if (pager_is_expert(m->lay, (unsigned)u) && m->lay->units[u].expert > 0 &&
	    m->us[u].state == U_ABSENT && pager_unit_has_page(&m->lay->units[u - 1], off) &&
	    m->us[u - 1].state != U_ABSENT)
		u--;
	c->faults++;
	m->us[u].faults++;
	if (pager_is_expert(m->lay, (unsigned)u))
		pager_experts_fault(c, (unsigned)u);
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
	if (!c->n_waiting++)
		c->waiting_since = w->since_ns;
	if (u > 0)
		c->pos = m->lay->units[u].layer + 1; /* it is here, waiting */
	if (m->us[u].state == U_EVICTING) {
		m->us[u].want_load = true;
	} else if (pager_is_expert(m->lay, (unsigned)u)) {
		pager_experts_demand(m, (unsigned)u); /* not routed, or not yet */
	} else if (m->us[u].state == U_ABSENT) {
		/* A demand miss: the window did not cover it.  Make room. */
		pager_policy_advance(m);
		if (pager_demand(m, u))
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
			pager_log_errno(PAGER_LOG_WARNING, errno, "client pid %d: reading its userfaultfd",
					(int)c->pid);
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

/* ---- the consumer ----------------------------------------------------- */

/* An engine is connected to m (or registering). */
static bool uffd_present(const struct model *m)
{
	for (const struct client *c = m->p->clients; c; c = c->next)
		if (c->m == m && (c->state == C_ACTIVE || c->state == C_REGISTER))
			return true;
	return false;
}

/* The memfd serves the engines: their resident units and streaming window.
 * With no other consumer, the resident units also before any engine
 * connects, so the first one finds them ready. */
static bool uffd_wants(const struct model *m, unsigned u)
{
	if (!uffd_present(m) && m->p->n_consumers > 1)
		return false;
	return m->us[u].resident || pager_needed_by(m, u, C_ACTIVE);
}

static void uffd_unit_ready(struct model *m, unsigned u)
{
	map_unit_everywhere(m, u);
	wake_waiters(m, u);
}

/* The data is not there: a client waiting on it cannot go on.  Drop them
 * (they exit with a message) rather than map garbage. */
static void uffd_unit_failed(struct model *m, unsigned u)
{
	for (struct waiter *w = m->waiters[u]; w; w = w->next)
		pager_drop_client(w->c, m->changed ? "the model file could not be read: it changed on "
						     "disk while served"
						   : "the model file could not be read");
}

static bool uffd_holds(const struct model *m, unsigned u)
{
	return m->waiters[u] != NULL;
}

const struct consumer_ops pager_uffd_ops = {
	.name = "userfaultfd",
	.present = uffd_present,
	.wants = uffd_wants,
	.unit_ready = uffd_unit_ready,
	.unit_failed = uffd_unit_failed,
	.holds = uffd_holds,
};
