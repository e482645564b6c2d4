/*
 * fuse_store.c - what the mount's page cache holds: stores into it ahead of
 * the reader, drops from it behind the reader.
 *
 * Both are FUSE notifications, run on a notifier thread (see below), and
 * stores stream from the file through a few staging slots.  The policy that
 * decides what to store and drop is the daemon's (residency.c); this file
 * carries it out for the mount, and accounts for what the page cache holds.
 */
#include "fuse_i.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the notifier thread --------------------------------------------- */

/*
 * Stores into and drops from the page cache run on a thread of their own.
 * The kernel locks each page it fills or invalidates; a page can be locked
 * because a reader's read of it is queued on /dev/fuse, and that read is
 * answered by the loop's thread.  Were the loop's thread to notify, it would
 * wait for itself.  So the loop queues jobs, the notifier runs them (waiting
 * on such a page until the loop answers the read), and reports back through
 * an eventfd.  A unit has at most one job at a time (pc_job), and the memfd
 * pages a store copies from stay put until it reports.
 */
struct job {
	struct job *next;
	struct model *m;
	unsigned u;
	enum pcjob kind;
	/* a store: a chunk of the unit, read into staging slot `slot` */
	unsigned slot;
	uint64_t off, len;
	bool whole; /* the tripwire page too */
	int err;
};

static void job_run(struct pager_fuse *f, struct job *j);

void *pager_fuse_notifier(void *arg)
{
	struct pager_fuse *f = arg;
	uint64_t one = 1;

	pthread_mutex_lock(&f->mu);
	for (;;) {
		struct job *j;

		while (!f->todo && !f->quit)
			pthread_cond_wait(&f->cv, &f->mu);
		if (!f->todo)
			break;
		j = f->todo;
		f->todo = j->next;
		pthread_mutex_unlock(&f->mu);
		if (f->quit)
			j->err = -ECANCELED;
		else
			job_run(f, j);
		pthread_mutex_lock(&f->mu);
		j->next = f->done;
		f->done = j;
		/* fails only when the counter saturates, which a reader never lets happen */
		(void)!write(f->efd, &one, sizeof(one));
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

/* The page of unit u whose first read tells the daemon its reader entered
 * the unit: the unit's first page no other unit holds.  Streamed layers are
 * stored without it.  A single page per unit: with one per tensor, the
 * kernel's read-around of a fault near a unit's end would reach the next
 * unit's first tripwire and place the reader a layer early. */
static uint64_t trip_page(const struct model *m, unsigned u)
{
	const struct pager_unit *un = &m->lay->units[u];

	for (unsigned i = 0; i < un->n_ext; i++)
		for (uint64_t pg = un->ext[i].off; pg < un->ext[i].off + un->ext[i].len;
		     pg += m->lay->page)
			if (!pager_page_shared(m, u, pg))
				return pg;
	return UINT64_MAX;
}

#define STORE_CHUNK (4u << 20)

/* Store [off, end) of the model into the page cache from src (the bytes of
 * the file from offset base on). */
static int store(struct pager_fuse *f, struct model *m, const uint8_t *src, uint64_t base,
		 uint64_t off, uint64_t end)
{
	fuse_ino_t ino = m->idx + 2;

	/* never past the file's end: a store there would grow the file */
	if (end > m->lay->file_size)
		end = m->lay->file_size;
	while (off < end) {
		uint64_t n = end - off < STORE_CHUNK ? end - off : STORE_CHUNK;
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(n);
		int rc;

		bv.buf[0].mem = (void *)(src + (off - base));
		rc = fuse_lowlevel_notify_store(f->se, ino, (off_t)off, &bv, 0);
		if (rc)
			return rc;
		off += n;
	}
	return 0;
}

/* Drop the token embedding's pages from the page cache (see note_read). */
static int drop_sparse(struct pager_fuse *f, struct model *m)
{
	uint64_t off, end;

	if (!pager_layout_sparse_own(m->lay, &off, &end))
		return 0;
	return fuse_lowlevel_notify_inval_inode(f->se, m->idx + 2, (off_t)off, (off_t)(end - off));
}

static void job_run(struct pager_fuse *f, struct job *j)
{
	struct model *m = j->m;
	const struct pager_unit *un;
	uint64_t page = m->lay->page;

	j->err = 0;
	if (j->u == SPARSE_JOB) {
		j->err = drop_sparse(f, m);
		return;
	}
	un = &m->lay->units[j->u];
	if (j->kind == PC_STORING) {
		const uint8_t *src = f->slot[j->slot];
		uint64_t off = j->off, end = j->off + j->len;
		uint64_t trip = j->whole ? UINT64_MAX : trip_page(m, j->u);

		if (trip >= off && trip < end) {
			j->err = store(f, m, src, j->off, off, trip);
			off = trip + page;
		}
		if (!j->err)
			j->err = store(f, m, src, j->off, off, end);
		return;
	}
	for (unsigned i = 0; i < un->n_ext && !j->err; i++) {
		uint64_t off = un->ext[i].off, end = off + un->ext[i].len;

		/* a drop keeps the boundary pages a neighbour holds too */
		if (pager_page_shared(m, j->u, off))
			off += page;
		if (end > off && pager_page_shared(m, j->u, end - page))
			end -= page;
		if (end > off)
			j->err = fuse_lowlevel_notify_inval_inode(f->se, m->idx + 2, (off_t)off,
								   (off_t)(end - off));
	}
}

static void job_queue(struct pager_fuse *f, struct job *j)
{
	struct job **tail;

	pthread_mutex_lock(&f->mu);
	for (tail = &f->todo; *tail; tail = &(*tail)->next)
		;
	*tail = j;
	f->jobs++;
	pthread_cond_signal(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

/* A unit's store has no chunk left to read or store: account for it. */
static void stream_end(struct model *m, unsigned u)
{
	struct ustat *us = &m->us[u];

	us->pc_job = PC_IDLE;
	if (us->st_err == -ENOENT) {
		/* the kernel has no inode for the file any more (it forgot
		 * it), and so no page cache: until the next open */
		m->fuse_inode = false;
		if (us->pc != PC_NONE)
			m->cache_bytes -= m->lay->units[u].bytes;
		us->pc = PC_NONE;
	} else if (us->st_err) {
		pager_log_errno(PAGER_LOG_ERR, us->st_err, "%s: storing layer %d", m->name,
				m->lay->units[u].layer);
	} else {
		us->pc = us->st_whole || us->pc == PC_ALL ? PC_ALL : PC_NOTRIP;
		us->stores++;
	}
}

static bool stream_done(const struct model *m, unsigned u)
{
	return m->us[u].st_ext == m->lay->units[u].n_ext && m->us[u].st_pending == 0;
}

static void pump(struct pager *p);

/* The notifier reported: account for what it did. */
void pager_fuse_collect(struct pager_fuse *f)
{
	struct job *done;
	uint64_t n;

	if (read(f->efd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		pager_log_errno(PAGER_LOG_ERR, errno, "%s: notifier", f->dir);
	pthread_mutex_lock(&f->mu);
	done = f->done;
	f->done = NULL;
	pthread_mutex_unlock(&f->mu);
	while (done) {
		struct job *j = done;
		struct model *m = j->m;
		struct ustat *us = j->u == SPARSE_JOB ? NULL : &m->us[j->u];

		done = j->next;
		f->jobs--;
		if (!us) {
			m->fuse_sparse_busy = false;
			if (!j->err || j->err == -ENOENT)
				m->fuse_sparse_bytes = 0;
		} else if (j->kind == PC_STORING) {
			f->slot_busy[j->slot] = false;
			f->slot_m[j->slot] = NULL;
			us->st_pending--;
			if (j->err && !us->st_err)
				us->st_err = j->err;
			if (stream_done(m, j->u))
				stream_end(m, j->u);
		} else {
			us->pc_job = PC_IDLE;
			if (j->err == -ENOENT || (!j->err && !us->pc_read_during)) {
				us->pc = PC_NONE;
				m->cache_bytes -= m->lay->units[j->u].bytes;
			} else if (!j->err) {
				us->pc = PC_SOME; /* a read put pages back meanwhile */
			} else if (j->err != -ECANCELED) {
				pager_log_errno(PAGER_LOG_ERR, j->err, "%s: dropping layer %d",
						m->name, m->lay->units[j->u].layer);
			}
			if (j->err == -ENOENT)
				m->fuse_inode = false;
			if (!j->err)
				us->drops++;
			us->pc_read_during = false;
		}
		if (!f->quit)
			pager_policy_advance(m);
		free(j);
	}
	pump(f->p);
}

/* The reader's reads of the token embedding passed the cap: drop them all. */
void pager_fuse_drop_sparse(struct model *m)
{
	struct pager_fuse *f = m->p->fuse;
	struct job *j;

	if (m->fuse_sparse_busy || f->quit || !(j = calloc(1, sizeof(*j))))
		return;
	*j = (struct job){ .m = m, .u = SPARSE_JOB, .kind = PC_DROPPING };
	m->fuse_sparse_busy = true;
	job_queue(f, j);
}

/* ---- the streamer ----------------------------------------------------- */

/*
 * Stores go from the file to the page cache through a few staging slots,
 * not through the memfd: a unit is read in slot-sized chunks (io_uring,
 * O_DIRECT), each chunk stored by the notifier, the slot then reused.  So a
 * layer on its way into the page cache costs the slots' fixed memory, not a
 * second copy of the layer, and the daemon neither zeroes nor punches shmem
 * for it.
 */

/* How far unit u is ahead of the mount's reader: the nearest goes first. */
static unsigned distance(const struct model *m, unsigned u)
{
	int pos = m->fuse_reader->pos;
	unsigned L = m->lay->n_layers;

	if (u == 0)
		return 0;
	if (pos < 1)
		return u;
	return ((u + L) - (unsigned)pos) % L + 1;
}

static void stream_start(struct model *m, unsigned u, bool whole)
{
	struct ustat *us = &m->us[u];

	us->pc_job = PC_STORING;
	us->st_ext = 0;
	us->st_off = m->lay->units[u].ext[0].off;
	us->st_pending = 0;
	us->st_whole = whole;
	us->st_err = 0;
	if (us->pc == PC_NONE) {
		us->pc = PC_SOME;
		m->cache_bytes += m->lay->units[u].bytes;
	}
}

/* Keep the staging slots busy: read the next chunk of the streaming unit
 * nearest ahead of its reader into each free slot. */
static void pump(struct pager *p)
{
	struct pager_fuse *f = p->fuse;

	while (!f->quit) {
		struct model *best = NULL;
		unsigned bu = 0, bd = UINT_MAX;
		struct io_tag *tag;
		struct ustat *us;
		int slot = -1, n;

		for (int i = 0; i < PAGER_FUSE_SLOTS && slot < 0; i++)
			if (!f->slot_busy[i])
				slot = i;
		if (slot < 0)
			return;
		for (unsigned i = 0; i < p->n_models; i++) {
			struct model *m = &p->models[i];

			for (unsigned u = 0; u < m->lay->n_units; u++)
				if (m->us[u].pc_job == PC_STORING &&
				    m->us[u].st_ext < m->lay->units[u].n_ext && distance(m, u) < bd) {
					best = m;
					bu = u;
					bd = distance(m, u);
				}
		}
		if (!best)
			return;
		us = &best->us[bu];
		const struct pager_extent *e = &best->lay->units[bu].ext[us->st_ext];
		uint64_t len = e->off + e->len - us->st_off;

		if (len > PAGER_FUSE_SLOT)
			len = PAGER_FUSE_SLOT;
		tag = malloc(sizeof(*tag));
		if (!tag)
			return;
		*tag = (struct io_tag){ .m = best, .u = bu, .kind = IO_STAGE, .owner = &pager_fuse_ops,
					.slot = (unsigned)slot, .off = us->st_off, .len = len };
		n = pio_read(p->io, best->fd, f->slot[slot], us->st_off, len, best->lay->file_size,
			     tag);
		if (n < 0) {
			free(tag);
			us->st_err = n;
			us->st_ext = best->lay->units[bu].n_ext; /* give up on this unit */
			if (stream_done(best, bu))
				stream_end(best, bu);
			continue;
		}
		tag->parts = (unsigned)n;
		f->slot_busy[slot] = true;
		f->stage_reads++;
		us->st_pending++;
		us->st_off += len;
		if (us->st_off == e->off + e->len && ++us->st_ext < best->lay->units[bu].n_ext)
			us->st_off = best->lay->units[bu].ext[us->st_ext].off;
	}
}

/* A staging read completed (one call per io chunk of it). */
void pager_fuse_staged(struct io_tag *tag, int err, uint64_t bytes, bool last)
{
	struct model *m = tag->m;
	struct pager_fuse *f = m->p->fuse;
	struct ustat *us = &m->us[tag->u];
	struct job *j;

	us->bytes_read += bytes;
	m->bytes_read += bytes;
	if (err && !tag->err)
		tag->err = err;
	if (!last || --tag->parts)
		return;
	f->stage_reads--;
	j = calloc(1, sizeof(*j));
	if (tag->err || !j || f->quit) {
		if (!f->quit)
			pager_log_errno(PAGER_LOG_ERR, tag->err ? tag->err : -ENOMEM,
					"%s: reading layer %d", m->name, m->lay->units[tag->u].layer);
		if (!us->st_err)
			us->st_err = tag->err ? tag->err : -ENOMEM;
		f->slot_busy[tag->slot] = false;
		us->st_pending--;
		if (stream_done(m, tag->u))
			stream_end(m, tag->u);
		free(j);
	} else {
		*j = (struct job){ .m = m, .u = tag->u, .kind = PC_STORING, .slot = tag->slot,
				   .off = tag->off, .len = tag->len, .whole = us->st_whole };
		/* reads of this range are answered from the slot meanwhile */
		f->slot_m[tag->slot] = m;
		f->slot_off[tag->slot] = tag->off;
		f->slot_len[tag->slot] = tag->len;
		job_queue(f, j);
	}
	free(tag);
	pump(m->p);
}

/* Should unit u be in the mount's page cache?  Resident units always, and
 * the streamed ones the mount's reader is in or about to reach; but only
 * once the file was opened: before, the kernel has no page cache for it. */
static bool wanted(const struct model *m, unsigned u)
{
	return m->fuse_inode && (m->us[u].resident || pager_needed_by(m, u, C_FUSE));
}

/* Is a store of unit u into the page cache still to do?  Streamed layers are
 * stored without their tripwire page (see fuse.c), resident ones whole. */
static bool store_due(const struct model *m, unsigned u)
{
	return wanted(m, u) && (m->us[u].pc == PC_NONE || m->us[u].pc == PC_SOME);
}

/* Queue the drop of unit u from the page cache. */
static void drop(struct model *m, unsigned u)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return; /* retried at the next policy step */
	*j = (struct job){ .m = m, .u = u, .kind = PC_DROPPING };
	m->us[u].pc_job = PC_DROPPING;
	job_queue(m->p->fuse, j);
}

/* May expert i (over all layers) leave the page cache now? */
static bool expert_may_go(void *arg, unsigned i)
{
	const struct model *m = arg;
	unsigned u = pager_expert_at(m->lay, i);

	return m->us[u].pc != PC_NONE && m->us[u].pc_job == PC_IDLE &&
	       !pager_fuse_waits_for(m, u);
}

/*
 * A mixture of experts through the mount: its experts are never stored
 * ahead (the reader says nothing of its routes); a read inside an expert
 * reads that range from the file (fuse.c), and the expert then counts as
 * in the page cache.  Past the expert cache's capacity, the experts with
 * the lowest decayed count of such reads are dropped.  The page cache
 * answers the reader's hits without the daemon, so the count is of
 * misses only: the choice is closer to least recently read than to least
 * used.
 */
static void drop_experts(struct model *m)
{
	const struct pager_layout *l = m->lay;
	uint64_t held = 0;

	if (!l->n_experts)
		return;
	for (unsigned u = l->n_layers + 1; u < l->n_units; u++)
		if (m->us[u].pc != PC_NONE && m->us[u].pc_job != PC_DROPPING)
			held += l->units[u].bytes;
	while (held > m->ex.capacity) {
		long v = expert_cache_victim(&m->ex.cache, expert_may_go, m);

		if (v < 0)
			return;
		unsigned u = pager_expert_at(l, (unsigned)v);

		drop(m, u);
		held -= l->units[u].bytes;
	}
}

/*
 * The mount's side of a policy step: drop from the page cache what the
 * policy no longer wants there, and start storing what it wants while the
 * allowance has room.  Streamed layers are stored without their tripwire
 * page, so the reader's first touch of the layer is a read that tells us it
 * is there; resident ones (and a streamed one the reader is already in)
 * whole.
 */
void pager_fuse_advance(struct model *m)
{
	struct pager_fuse *f = m->p->fuse;
	uint64_t allow = pager_allowance(m);

	if (f->quit)
		return;
	for (unsigned u = 0; u <= m->lay->n_layers; u++) { /* experts: below */
		struct ustat *us = &m->us[u];

		if (us->pc_job != PC_IDLE)
			continue;
		if (us->pc != PC_NONE && !wanted(m, u) && !pager_fuse_waits_for(m, u)) {
			drop(m, u);
		} else if (store_due(m, u)) {
			uint64_t need = us->pc == PC_NONE ? m->lay->units[u].bytes : 0;

			if (u != 0 && pager_held(m) + need > allow)
				continue; /* no room now */
			stream_start(m, u, us->resident || m->fuse_reader->pos == (int)u);
		}
	}
	drop_experts(m);
	pump(m->p);
}
