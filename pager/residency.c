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
 * The memory serves consumers: the engines, through userfaultfd (uffd.c),
 * and with --fuse the readers of the mount, through its page cache (fuse.c).
 * Each is an adapter behind struct consumer_ops (server_i.h): this file
 * tells them when a unit is read or failed, asks whether one still needs a
 * unit before it goes, and learns from them where their readers are
 * (client->pos); it knows nothing else of how they reach the pages.  The
 * life of a fault, function by function, is in docs/design.md.
 *
 * Policy: unit 0 (everything that is not a layer) and N layers, spread evenly
 * over the model, stay resident; the rest stream through a window of `window`
 * layers.  N comes from --resident, or is the largest that fits the budget
 * after the streaming window and the clients' declared memory.  Under memory
 * pressure (PSI, or SIGUSR1) a quarter of the resident layers are demoted
 * to streaming.
 *
 * Threading: the daemon's one thread; see server_i.h.  (--populate makes the
 * expert slots' pages from threads of its own, joined before serving.)
 */
#include "server_i.h"
#include "proto_i.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
	return pager_layout_page_shared(m->lay, u, off);
}


/* Unit u's own pages in its extent i: the extent without a first or last
 * page another unit shares.  False if none are left. */
bool pager_own_range(const struct model *m, unsigned u, unsigned i, struct pager_extent *own)
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
unsigned pager_own_ranges(const struct model *m, unsigned u, struct pager_extent *out,
			  unsigned max)
{
	unsigned n = 0;

	for (unsigned i = 0; i < m->lay->units[u].n_ext; i++) {
		struct pager_extent e;

		if (!pager_own_range(m, u, i, &e))
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
		/* the slot keeps its pages for the next unit */
		m->slot_unit[m->us[u].slot] = -1;
		m->us[u].slot = -1;
		m->slots_free++;
		m->slots_vacating--;
	} else {
		m->mem_bytes -= m->lay->units[u].bytes;
		if (pager_is_expert(m->lay, u))
			m->ex.held -= m->lay->units[u].bytes;
	}
	if (m->us[u].want_load) {
		m->us[u].want_load = false;
		if (pager_is_expert(m->lay, u))
			pager_experts_demand(m, u); /* its room is the cache's */
		else
			pager_demand(m, u);
	}
}

/*
 * Take unit u's pages out of memory, and with them out of every client's
 * page tables.  The punch holes are queued on the ring; until they complete
 * the unit is EVICTING: still counted against the budget, and not reloaded
 * (a load racing a queued punch would lose pages).  A unit in a slot is
 * EVICTING until every client maps its range from the memfd again.
 */
static void release(struct model *m, unsigned u)
{
	const struct pager_unit *un = &m->lay->units[u];

	m->us[u].state = U_EVICTING;
	m->us[u].punches_left = 0;
	if (m->us[u].slot >= 0) {
		/* nothing to free: every client maps the range from the memfd
		 * again (pager_slot_vacated), and then the slot takes the next
		 * unit */
		m->slots_vacating++;
		if (pager_uffd_slot_out(m, u) == 0)
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

		if (i < un->n_ext && !pager_own_range(m, u, i, &own))
			continue;
		if (i < un->n_ext && run.len && own.off == run.off + run.len) {
			run.len += own.len;
			continue;
		}
		if (run.len && (m->us[u].shed_pending || pager_is_expert(m->lay, u))) {
			/* Memory pressure: free it now, on this thread, rather
			 * than behind the reads queued on the ring.  An expert
			 * too: a few MiB, and the load that waits for the room
			 * should not wait behind the reads (experts.c). */
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

void pager_evict(struct model *m, unsigned u)
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

/* What the plan leaves an engine beside the `others` bytes the other
 * engines declared: *room, what it may declare and take no resident layer
 * (the --mode's room for engines), and *limit, the most it may declare at
 * all; UINT64_MAX without a budget. */
void pager_engine_room(const struct pager *p, uint64_t others, uint64_t *room, uint64_t *limit)
{
	uint64_t all = plan_engine_limit(&p->plan, p->plan_models, p->n_models);
	uint64_t mode = p->plan.room;

	*room = mode == UINT64_MAX ? UINT64_MAX : mode > others ? mode - others : 0;
	*limit = all == UINT64_MAX ? UINT64_MAX : all > others ? all - others : 0;
}

/* Client c (active) needs `bytes` of its own (its KV cache and buffers):
 * reserve them from the budget and re-plan every model.  More than the
 * budget can give the engines beside what streaming needs is refused: the
 * client is dropped with both numbers, the others are not disturbed. */
void pager_declare(struct client *c, uint64_t bytes)
{
	struct pager *p = c->p;
	uint64_t others = pager_declared_connected(p) - c->declared, d, room, left;
	uint64_t limit = plan_engine_limit(&p->plan, p->plan_models, p->n_models);

	pager_engine_room(p, others, &room, &left);
	if (bytes > limit || others > limit - bytes) {
		char why[256];

		snprintf(why, sizeof(why),
			 "it needs %.1f MiB of its own, and the budget leaves %.1f MiB for engines "
			 "(%.1f MiB, less the %.1f MiB streaming needs%s)",
			 bytes / 1048576.0, left / 1048576.0,
			 p->cfg.budget / 1048576.0, p->plan.minimum / 1048576.0,
			 others ? ", less what other engines declared" : "");
		pager_drop_client(c, why);
		return;
	}
	c->declared = bytes;
	d = pager_declared_connected(p);
	if (d)
		p->declared_hold = d;
	pager_log(PAGER_LOG_NOTICE,
		  "client pid %d declares %.1f MiB of its own (engines: %.1f MiB in all)",
		  (int)c->pid, bytes / 1048576.0, pager_declared(p) / 1048576.0);
	pager_replan(p);
}

/* What this model may hold (plan.c's allowance): its minimum, and its share
 * of what the engines and the mode leave of the budget. */
uint64_t pager_allowance(const struct model *m)
{
	return m->p->plan_models[m->idx].allowance;
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
 * before; but a layer a client waits for waits for a slot on its way
 * rather than go beyond the allowance (pager_demand).  Slots are the
 * engines' alone: with a mount, the memfd also serves its reads at the
 * file's offsets, and such a daemon has none.
 *
 * With expert units the layers' cores are resident and the experts take
 * the slots instead, one an expert (its three slices' own pages), as many
 * as the expert cache may hold (experts.c decides when a slot's pages may
 * be made or must be punched; the memfd is sparse until then).  Each expert
 * in a slot splits the client's mapping into about six areas, so their
 * number is capped well under the kernel's default vm.max_map_count
 * (65530): a cache larger than SLOTS_EXPERTS_MAX experts keeps the rest in
 * the memfd, as without slots.
 */
#define SLOT_RANGES PROTO_REMAP_MAX
#define SLOTS_EXPERTS_MAX 8192u

/* The memfd's and the slots' future pages on m->node (pager_place), if it
 * has one. */
static void place_on_node(struct model *m)
{
#ifdef HAVE_NUMA
	if (m->node < 0)
		return;
	numa_tonode_memory(m->map, m->lay->map_size, m->node);
	if (m->slot_map)
		numa_tonode_memory(m->slot_map, m->n_slots * m->slot_size, m->node);
#else
	(void)m;
#endif
}

int pager_slots_create(struct model *m)
{
	struct pager_extent own[SLOT_RANGES];
	const struct pager_layout *l = m->lay;
	unsigned L = l->n_layers;
	/* the units that stream: the experts, or the layers */
	unsigned first = l->n_experts ? L + 1 : 1, end = l->n_experts ? l->n_units : L + 1;

	m->slotfd = -1;
	for (unsigned u = 0; u < l->n_units; u++)
		m->us[u].slot = -1;
	if (m->p->n_consumers > 1 || L == 0)
		return 0;
	for (unsigned u = first; u < end; u++) {
		unsigned n = pager_own_ranges(m, u, own, SLOT_RANGES);
		uint64_t b = 0;

		for (unsigned i = 0; i < n; i++)
			b += own[i].len;
		if (b > m->slot_size)
			m->slot_size = b;
	}
	if (!m->slot_size)
		return 0;
	if (l->n_experts)
		m->n_slots = end - first < SLOTS_EXPERTS_MAX ? end - first : SLOTS_EXPERTS_MAX;
	else
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
	place_on_node(m); /* pager_place ran before the slots existed */
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

/* Slot s has pages from now on (held until pager_slot_drop punches them):
 * counted in the slots' bytes and, with expert units, in what the expert
 * cache holds. */
static void slot_touch(struct model *m, int s)
{
	m->slot_touched[s] = true;
	m->slot_bytes += m->slot_size;
	if (m->lay->n_experts)
		m->ex.held += m->slot_size;
}

/*
 * --populate: the expert cache's slots get their pages before the daemon
 * serves, as many as its capacity holds, and every expert read then lands
 * on pages that exist.  Without it the cache grows into new memory, whose
 * cost is the kernel's allocation and zeroing and, on a virtual machine
 * whose free memory the guest hands back to its host (free page
 * reporting), a host fault every 4 KiB: on the Zen 5 guest 3 ms of CPU a
 * MiB, in the engine's time (docs/design.md, "Where an expert is read").
 * The pages are made by MADV_POPULATE_WRITE from one thread a CPU (at most
 * POPULATE_THREADS), started and joined here: the daemon's loop has not
 * begun, and nothing else touches the slots yet.  They stay until the
 * cache shrinks (trim punches free slots) or the daemon ends.
 */
#define POPULATE_THREADS 4

struct populate_part {
	pthread_t thread;
	bool threaded; /* made by `thread`, to be joined */
	uint8_t *base;
	size_t len;
	int err; /* 0 or errno */
};

static void *populate_part(void *arg)
{
	struct populate_part *pp = arg;

	pp->err = madvise(pp->base, pp->len, MADV_POPULATE_WRITE) ? errno : 0;
	return NULL;
}

int pager_slots_populate(struct model *m)
{
	struct populate_part part[POPULATE_THREADS];
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = 0, k, per;
	uint64_t t0 = pager_now_ns();
	int err = 0;

	if (!m->lay->n_experts || !m->n_slots) {
		pager_log(PAGER_LOG_NOTICE,
			  "%s: --populate: no expert slots to make (%s)", m->name,
			  m->lay->n_experts ? "a mount serves the model" : "not a mixture of experts");
		return 0;
	}
	if (m->ex.capacity == UINT64_MAX) {
		pager_log(PAGER_LOG_NOTICE,
			  "%s: --populate: the expert cache has no bound (no budget): nothing made ahead",
			  m->name);
		return 0;
	}
	if (m->ex.held < m->ex.capacity) {
		uint64_t fit = (m->ex.capacity - m->ex.held) / m->slot_size;

		n = fit < m->n_slots ? (unsigned)fit : m->n_slots;
	}
	if (!n)
		return 0;
	k = cpus < 1 ? 1 : cpus < POPULATE_THREADS ? (unsigned)cpus : POPULATE_THREADS;
	k = k < n ? k : n;
	per = (n + k - 1) / k;
	for (unsigned i = 0; i < k; i++) {
		unsigned first = i * per, count = first + per <= n ? per : n - first;

		part[i] = (struct populate_part){ .base = m->slot_map + first * m->slot_size,
						  .len = count * m->slot_size };
		part[i].threaded = !pthread_create(&part[i].thread, NULL, populate_part, &part[i]);
		if (!part[i].threaded)
			populate_part(&part[i]); /* no thread: this one makes them */
	}
	for (unsigned i = 0; i < k; i++) {
		if (part[i].threaded)
			pthread_join(part[i].thread, NULL);
		if (part[i].err && !err)
			err = part[i].err;
	}
	if (err) {
		/* what was made is not counted: give it back */
		if (fallocate(m->slotfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
			      (off_t)(n * m->slot_size)))
			pager_log_errno(PAGER_LOG_ERR, errno, "%s: freeing the slots", m->name);
		return -err;
	}
	for (unsigned s = 0; s < n; s++) {
		slot_touch(m, (int)s);
		m->slots_free++;
	}
	pager_log(PAGER_LOG_NOTICE, "%s: populated %u expert slots (%.0f MiB) in %.1f s, %u threads",
		  m->name, n, n * m->slot_size / 1048576.0, (pager_now_ns() - t0) / 1e9, k);
	return 0;
}

/* Does this guest hand its free memory back to its host?  Free page
 * reporting reports blocks of page_reporting_order and above (none above
 * the largest order, 10 on x86), and reports to a virtio balloon. */
static bool page_reporting_on(void)
{
	const char *drv = "/sys/bus/virtio/drivers/virtio_balloon";
	FILE *f = fopen("/sys/module/page_reporting/parameters/page_reporting_order", "r");
	int order = 99;
	bool balloon = false;
	DIR *d;

	if (f) {
		if (fscanf(f, "%d", &order) != 1)
			order = 99;
		fclose(f);
	}
	if (order > 10 || !(d = opendir(drv)))
		return false;
	for (struct dirent *e; (e = readdir(d)) && !balloon;)
		balloon = strncmp(e->d_name, "virtio", 6) == 0; /* a bound device */
	closedir(d);
	return balloon;
}

void pager_slots_advise(const struct model *m)
{
	if (m->lay->n_experts && m->n_slots && m->ex.capacity != UINT64_MAX && page_reporting_on())
		pager_log(PAGER_LOG_NOTICE,
			  "%s: this guest hands free memory back to its host (free page "
			  "reporting): each page the expert cache grows into is a host fault; "
			  "--populate makes them before serving (docs/service.md)",
			  m->name);
}

/* The slot unit u would be read into, or -1 (the memfd): a free one whose
 * pages exist first, so that none are made while others wait. */
static int find_slot(const struct model *m, unsigned u)
{
	struct pager_extent own[SLOT_RANGES];

	if (!m->n_slots || u == 0 || m->us[u].resident || !pager_own_ranges(m, u, own, SLOT_RANGES))
		return -1;
	return pager_slot_free(m, true);
}

int pager_slot_free(const struct model *m, bool fresh)
{
	int untouched = -1;

	if (!fresh && !m->slots_free)
		return -1; /* no scan: each expert load asks while the cache grows */
	for (unsigned s = 0; s < m->n_slots; s++)
		if (m->slot_unit[s] < 0) {
			if (m->slot_touched[s])
				return (int)s;
			if (untouched < 0)
				untouched = (int)s;
		}
	return fresh ? untouched : -1;
}

bool pager_slot_new_fits(const struct model *m)
{
	return m->slot_bytes + m->slot_size <= m->n_slots * m->slot_size &&
	       m->ex.held + m->slot_size <= m->ex.capacity;
}

bool pager_slot_drop(struct model *m)
{
	for (unsigned s = 0; s < m->n_slots; s++) {
		if (m->slot_unit[s] >= 0 || !m->slot_touched[s])
			continue;
		if (fallocate(m->slotfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)(s * m->slot_size), (off_t)m->slot_size))
			pager_log_errno(PAGER_LOG_ERR, errno, "%s: freeing a slot", m->name);
		m->slot_touched[s] = false;
		m->slot_bytes -= m->slot_size;
		m->slots_free--;
		if (m->lay->n_experts)
			m->ex.held -= m->slot_size;
		return true;
	}
	return false;
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

	if (!m->slot_touched[s])
		slot_touch(m, s);
	else
		m->slots_free--;
	m->slot_unit[s] = (int)u;
	m->slot_loads++;
	pager_uffd_slot_in(m, u);
}

/* Every client of unit u maps its range from the memfd again (uffd.c): the
 * slot is free. */
void pager_slot_vacated(struct model *m, unsigned u)
{
	released(m, u);
	pager_policy_advance(m); /* the slot may let a load start */
}

/* Send c's queued REMAPs while fewer than REMAPS_IN_FLIGHT are unanswered. */
/* ---- loading ---------------------------------------------------------- */

/* Unit u is read: every consumer gets it, and the policy takes its next
 * step. */
static void loaded(struct model *m, unsigned u)
{
	struct pager *p = m->p;

	m->us[u].state = U_LOADED;
	for (unsigned i = 0; i < p->n_consumers; i++)
		p->consumers[i]->unit_ready(m, u);
	pager_policy_advance(m);
}

/*
 * Whether m's file is no longer the one opened: written in place, truncated,
 * grown (its size or modification time moved).  Checked after
 * each unit's reads: bytes read from a file being rewritten may be half old,
 * half new, and an engine must never compute with them.  A file replaced by a
 * rename is another inode; the one we hold is intact, and is served on.
 */
static bool file_changed(struct model *m)
{
	struct stat st;

	if (m->changed)
		return true;
	if (fstat(m->fd, &st) < 0)
		return false; /* cannot tell; the reads said they worked */
	/* not the change time: unlinking the file (a rename over it) moves it */
	if (st.st_size == m->file_st.st_size &&
	    st.st_mtim.tv_sec == m->file_st.st_mtim.tv_sec &&
	    st.st_mtim.tv_nsec == m->file_st.st_mtim.tv_nsec)
		return false;
	m->changed = true;
	pager_log(PAGER_LOG_ERR, "%s: the file changed on disk while served (size %lld, was %lld): "
		  "nothing more is read from it; restart stratad to serve the new file", m->name,
		  (long long)st.st_size, (long long)m->file_st.st_size);
	return true;
}

/* Every read of unit u is done: loaded, or, after any error (or with the
 * file changed under them), failed, and never mapped. */
static void finish_load(struct model *m, unsigned u)
{
	struct ustat *us = &m->us[u];

	if (!us->io_err && file_changed(m))
		us->io_err = -ESTALE;
	if (us->io_err) {
		/* The data is not there: what waits for it cannot go on. */
		release(m, u);
		for (unsigned i = 0; i < m->p->n_consumers; i++)
			m->p->consumers[i]->unit_failed(m, u);
		return;
	}
	loaded(m, u);
}

int pager_load(struct model *m, unsigned u)
{
	return pager_load_at(m, u, find_slot(m, u));
}

/*
 * A client waits for layer unit u: a demand miss (uffd.c: the window did
 * not bring it in), or a fault on it while it was evicted (released).  With
 * no slot free it would go to the memfd, a layer beyond the allowance if
 * the slots already take their share.  An engine slowed down (two cores
 * shared with other work, its REMAPs answered late) took the daemon 46 MiB
 * over its allowance that way, and was killed in its memory cgroup (the
 * kernel's report of an OOM in tests/pager_budget.py: 210 MiB of shmem
 * against an allowance of 164 MiB, the engine's 40 MiB beside it).  So
 * while a slot is on its way (its unit's REMAPs back are out), u waits for
 * it: pager_slot_vacated advances the policy, which reads u there first,
 * since it is where the client is.  The slot comes: every client answers
 * its REMAPs, or is dropped when one left another waiting too long
 * (pager_uffd_drop_stalled).
 */
int pager_demand(struct model *m, unsigned u)
{
	struct ustat *us = &m->us[u];

	if (us->state != U_ABSENT)
		return 0;
	us->demand_waits = u != 0 && !us->resident && m->slots_vacating && find_slot(m, u) < 0 &&
			   pager_held(m) + load_cost(m, u) > pager_allowance(m);
	return us->demand_waits ? 0 : pager_load(m, u);
}

static bool held_by_consumer(const struct model *m, unsigned u);

/* The units pager_demand left waiting: read them if they may go now, and
 * forget those nobody waits for any more. */
void pager_demand_retry(struct model *m)
{
	for (unsigned u = 1; u <= m->lay->n_layers; u++) {
		if (!m->us[u].demand_waits || m->us[u].state != U_ABSENT)
			continue;
		if (!held_by_consumer(m, u)) {
			m->us[u].demand_waits = false;
			continue;
		}
		if (pager_demand(m, u))
			for (unsigned i = 0; i < m->p->n_consumers; i++)
				m->p->consumers[i]->unit_failed(m, u);
	}
}

int pager_load_at(struct model *m, unsigned u, int slot)
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
	m->us[u].demand_waits = false;
	m->us[u].reads_left = 1; /* held until every chunk is queued */
	m->us[u].io_err = 0;
	m->us[u].loads++;
	m->us[u].slot = slot;
	if (m->us[u].slot >= 0) {
		take_slot(m, u);
	} else {
		m->mem_bytes += un->bytes;
		if (pager_is_expert(m->lay, u))
			m->ex.held += un->bytes;
	}
	/* Each extent: into the memfd, or, in a slot, its own pages there (one
	 * after the other) and any shared boundary page into the memfd.  An
	 * expert's bytes reach the memfd through the reader's arena and a
	 * write (pio_read_to), not as new pages faulted into the mapping. */
	uint64_t at = m->us[u].slot >= 0 ? (uint64_t)m->us[u].slot * m->slot_size : 0;
	for (unsigned i = 0; i < un->n_ext && !m->us[u].io_err; i++) {
		const struct pager_extent *e = &un->ext[i];
		struct pager_extent part[3] = { *e, { 0, 0 }, { 0, 0 } }, own;
		uint8_t *dst[3] = { m->map + e->off, NULL, NULL };

		if (m->us[u].slot >= 0 && pager_own_range(m, u, i, &own)) {
			part[0] = (struct pager_extent){ e->off, own.off - e->off };
			part[1] = own;
			part[2] = (struct pager_extent){ own.off + own.len,
							 e->off + e->len - own.off - own.len };
			dst[1] = m->slot_map + at;
			dst[2] = m->map + own.off + own.len;
			at += own.len;
		}
		for (unsigned k = 0; k < 3; k++) {
			/* an expert into the memfd: through the reader's arena
			 * and a write, not into new pages of the mapping (io.c) */
			bool bounce = dst[k] == m->map + part[k].off && pager_is_expert(m->lay, u) &&
				      pio_bounce_bytes(m->p->io);
			int n = !part[k].len ? 0
				: bounce     ? pio_read_to(m->p->io, m->fd, part[k].off, part[k].len,
							   m->lay->file_size, m->memfd, part[k].off, tag)
					     : pio_read(m->p->io, m->fd, dst[k], part[k].off, part[k].len,
							m->lay->file_size, tag);

			if (n < 0) {
				m->us[u].io_err = n;
				break;
			}
			m->us[u].reads_left += (unsigned)n;
		}
	}
	/* drop the hold; completes now if every chunk already finished */
	if (--m->us[u].reads_left == 0) {
		int err = m->us[u].io_err;

		free(tag);
		finish_load(m, u);
		return err;
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
	if (tag->owner) {
		tag->owner->io_done(tag, err, bytes, last);
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
	if (pager_is_expert(m->lay, u))
		m->ex.bytes_read += bytes;
	if (err && !us->io_err) {
		us->io_err = err;
		pager_log_errno(PAGER_LOG_ERR, err, "%s: reading unit %u", m->name, u);
	}
	if (!last || --us->reads_left)
		return;
	free(tag);
	finish_load(m, u);
}

/* ---- policy ----------------------------------------------------------- */

/* The order layers become resident in (plan.c): m->rank. -ENOMEM, or 0. */
int pager_plan_init(struct model *m)
{
	unsigned L = m->lay->n_layers;

	m->rank = calloc(L ? L : 1, sizeof(*m->rank));
	m->plan_tps = calloc(L + 1, sizeof(*m->plan_tps));
	if (!m->rank || !m->plan_tps)
		return -ENOMEM;
	return plan_order(L, m->rank);
}

/* The most of m's sparse tensor (the embedding, read a block at a time)
 * that is kept in memory. */
static uint64_t sparse_held(const struct model *m)
{
	return m->lay->sparse.len < PAGER_SPARSE_CAP ? m->lay->sparse.len : PAGER_SPARSE_CAP;
}

/* Its layers' bytes (with expert units: the cores and the experts). */
static uint64_t layer_bytes(const struct model *m)
{
	uint64_t n = 0;

	for (unsigned u = 1; u < m->lay->n_units; u++)
		n += m->lay->units[u].bytes;
	return n;
}

/* With expert units: what is always resident, unit 0 and the layers' cores,
 * and the experts' boundary pages (kept when they go). */
static uint64_t expert_fixed(const struct model *m)
{
	uint64_t n = m->lay->units[0].bytes + m->lay->expert_shared;

	for (unsigned u = 1; u <= m->lay->n_layers; u++)
		n += m->lay->units[u].bytes;
	return n;
}

/* What m holds with every layer resident: no slots, the sparse cache. */
static uint64_t full_bytes(const struct model *m)
{
	return m->lay->units[0].bytes + layer_bytes(m) + sparse_held(m);
}

/* Copies of m's resident layers that exist at once: each consumer present
 * holds its own (the memfd the engines map, the mount's page cache), so with
 * engines and readers of the mount at once every resident byte is held
 * twice. */
static unsigned copies(const struct model *m)
{
	unsigned n = 0;

	for (unsigned i = 0; i < m->p->n_consumers; i++)
		n += m->p->consumers[i]->present(m);
	return n ? n : 1;
}

/* What the consumers and the reader need beside the model's pages (the
 * mount's staging buffers, the reader's bounce arena), once for all models. */
static uint64_t consumers_fixed(const struct pager *p)
{
	uint64_t b = pio_bounce_bytes(p->io);

	for (unsigned i = 0; i < p->n_consumers; i++)
		b += p->consumers[i]->fixed_bytes;
	return b;
}

/* What streaming model m needs at least (plan.c), in `n` copies, with what
 * the consumers need beside it. */
static uint64_t minimum(const struct model *m, const struct pager *p, unsigned n)
{
	if (m->lay->n_experts) /* the cores, and one layer's experts in use */
		return n * plan_minimum(full_bytes(m), expert_fixed(m), m->lay->max_layer_experts,
					m->lay->n_layers, 0, sparse_held(m), 0) +
		       consumers_fixed(p);
	return n * plan_minimum(full_bytes(m), m->lay->units[0].bytes, m->lay->max_layer_bytes,
				m->lay->n_layers, p->window, sparse_held(m), 0) +
	       consumers_fixed(p);
}

/*
 * A model with expert units: the plan's layers are its experts, a layer's
 * at a time (the cores are in the minimum, always resident), and the
 * expert cache holds what the allowance leaves beyond the cores; with
 * --resident N or layers shed by pressure, no more than the layer in use
 * and N layers' worth of experts.
 */
static void plan_experts(struct model *m, const struct plan_model *pm)
{
	const struct pager_layout *l = m->lay;
	uint64_t fixed = m->copies * (expert_fixed(m) + sparse_held(m)) + consumers_fixed(m->p);
	uint64_t cap = UINT64_MAX;

	for (unsigned u = 1; u <= l->n_layers; u++)
		m->us[u].resident = true;
	/* each consumer present (engines, the mount's reader) has its own */
	if (pm->allowance != UINT64_MAX)
		cap = pm->allowance > fixed ? (pm->allowance - fixed) / m->copies : 0;
	if ((m->p->cfg.resident >= 0 || m->shed) && pm->n_resident < l->n_layers) {
		uint64_t r = l->max_layer_experts + pm->n_resident * (l->expert_bytes / l->n_layers);

		cap = r < cap ? r : cap;
	}
	m->ex.capacity = cap;
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
		pm->full = n * full_bytes(m) + consumers_fixed(p);
		pm->minimum = minimum(m, p, n);
		pm->layer_bytes = L ? n * layer_bytes(m) / L : 0;
		pm->n_layers = L;
		pm->window = p->window;
		pm->shed = m->shed;
		pm->tps = m->plan_tps;
		if (m->lay->n_experts) {
			/* the predictor's curve is of streamed layers: none here */
			pm->layer_bytes = m->lay->expert_bytes / L;
			pm->window = 0;
			pm->tps = NULL;
		}
		for (unsigned r = 0; r <= L && pm->tps; r++)
			if (!((m->plan_tps[r] = pager_predict_tps(m, r)) > 0))
				pm->tps = NULL; /* nothing decoded yet */
	}
	plan_compute(&p->plan, p->plan_models, p->n_models);
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];
		unsigned n = p->plan_models[i].n_resident;

		m->n_resident = n;
		m->us[0].resident = true;
		for (unsigned l = 0; l < m->lay->n_layers; l++)
			m->us[l + 1].resident = m->rank[l] < n;
		if (m->lay->n_experts)
			plan_experts(m, &p->plan_models[i]);
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
 * of the given kind (C_ACTIVE: an engine, C_FUSE: the mount's readers), or
 * the one such a client is in? */
bool pager_needed_by(const struct model *m, unsigned u, enum cstate kind)
{
	unsigned L = m->lay->n_layers;

	for (const struct client *c = m->p->clients; c; c = c->next) {
		unsigned seen = 0;

		if (c->m != m || c->state != kind)
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

/* Should unit u be in the memfd?  When a consumer wants it there. */
bool pager_wants_mem(const struct model *m, unsigned u)
{
	for (unsigned i = 0; i < m->p->n_consumers; i++)
		if (m->p->consumers[i]->wants(m, u))
			return true;
	return false;
}

/* Does a consumer serve something from unit u's memfd pages right now (a
 * fault or a read waiting for it)?  Then it stays until that is done. */
static bool held_by_consumer(const struct model *m, unsigned u)
{
	for (unsigned i = 0; i < m->p->n_consumers; i++)
		if (m->p->consumers[i]->holds(m, u))
			return true;
	return false;
}

/* Bytes this model holds against its allowance: its memfd and what the
 * consumers hold of their own (the mount's page cache; its staging buffers
 * are in the plan). */
uint64_t pager_held(const struct model *m)
{
	uint64_t b = m->mem_bytes + m->slot_bytes + m->sparse_bytes;

	for (unsigned i = 0; i < m->p->n_consumers; i++)
		if (m->p->consumers[i]->held)
			b += m->p->consumers[i]->held(m);
	return b;
}

/* Bring memory in line with the plan and the clients' positions: evict what
 * is not wanted, let each consumer bring its own memory in line (the mount's
 * page cache: fuse_store.c), then load what is wanted while the allowance
 * has room. */
void pager_policy_advance(struct model *m)
{
	struct pager *p = m->p;
	unsigned U = m->lay->n_layers + 1; /* the expert units: experts.c */

	/* an engine and a reader of the mount arrived or left: the copies */
	if (copies(m) != m->copies)
		pager_plan(p);

	uint64_t allow = pager_allowance(m);

	/* This also frees layers a shrunken plan (pressure, a new client's
	 * declared memory) no longer keeps resident. */
	/* A layer memory pressure demoted goes now, even if the engine is
	 * about to need it: freeing the memory is the point, and reading it
	 * again into a slot is what streaming costs anyway. */
	for (unsigned u = 0; u < U; u++)
		if (m->us[u].state == U_LOADED && !held_by_consumer(m, u) &&
		    (!pager_wants_mem(m, u) || m->us[u].shed_pending ||
		     (m->us[u].slot >= 0 && m->us[u].resident)))
			pager_evict(m, u); /* (a slot's layer planned resident goes to the memfd) */
	for (unsigned i = 0; i < p->n_consumers; i++)
		if (p->consumers[i]->advance)
			p->consumers[i]->advance(m);
	/* Queue loads in the order the engine will need them: unit 0, then the
	 * layers from where the first located client is, cyclically.  The
	 * reader is one FIFO, so this is the order the bytes arrive in. */
	unsigned from = 0;
	for (const struct client *c = p->clients; c; c = c->next)
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
	pager_demand_retry(m);
	pager_experts_advance(m);
}

/* ---- NUMA placement --------------------------------------------------- */

/*
 * Bind the model's image to the node process pid runs on, and issue the
 * reads from there: new pages of the memfd, and of the streaming slots,
 * come from that node (pages already read stay where they are; moving them
 * would cost more than the remote reads they save).  Called at start-up for
 * the daemon itself and again for a model's first client.  A no-op without
 * libnuma or on a one-node machine.
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
	place_on_node(m);
	numa_run_on_node(node);
	pager_log(PAGER_LOG_INFO, "%s: memory and reads on node %d (pid %d runs there)", m->name,
		  node, (int)pid);
#else
	(void)m;
	(void)pid;
#endif
}

