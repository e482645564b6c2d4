/*
 * fuse.c - the FUSE front end: every served model as a read-only file, so any
 * mmap-based runtime gets the pager without changing a line.
 *
 * The mount is a libfuse3 low-level session driven from the daemon's own
 * epoll loop (no libfuse threads): the root directory lists one regular file
 * per model, of its exact size and bytes.  A read is answered from the
 * model's memfd, the same store the userfaultfd path uses: if the units the
 * read spans are in memory the reply is immediate, otherwise the read waits
 * (the request is kept, not blocked on) until the loader has them.  Each read
 * also tells the policy where the reader is, through a pseudo-client per
 * model, so the layers ahead are read in before they are asked for.
 *
 * Opens keep the page cache (keep_cache) and the kernel is asked for large
 * reads: max_readahead 1 MiB and the mount's bdi read_ahead_kb raised to
 * match (by default FUSE issues 128 KiB requests).
 *
 * The budget holds here as on the userfaultfd path: the page cache is the
 * reader's copy, the memfd only a staging area.  The policy stores the units
 * it wants in memory into the page cache (notify_store) as soon as the loader
 * has them in the memfd, which then lets its copy go; it drops streamed
 * layers behind the reader (notify_inval_inode, which also unmaps them from
 * the reader).  Streamed layers are stored without one page, whose read tells
 * the policy the reader reached the layer, as the tripwires do for engines.
 * What the page cache holds counts against the budget (cache_bytes).
 */
#define FUSE_USE_VERSION 35
#include "server_i.h"

#include <errno.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define READAHEAD (1u << 20)

struct job;

struct pager_fuse {
	struct pager *p;
	struct fuse_session *se;
	struct fuse_buf buf;
	char *dir;
	uint8_t *bounce; /* page-aligned, for reads from the file itself */
	uint64_t bounce_len;
	uint8_t *slot[PAGER_FUSE_SLOTS]; /* staging: the streamer's, page-aligned */
	bool slot_busy[PAGER_FUSE_SLOTS];
	unsigned stage_reads;            /* staging reads on the ring */
	/* the notifier thread: todo and done under mu; jobs and efd the loop's */
	pthread_t thread;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct job *todo, *done;
	bool quit;
	unsigned jobs; /* queued and not yet collected */
	int efd;
};

/* A read waiting for its units. */
struct fuse_wait {
	struct fuse_wait *next;
	fuse_req_t req;
	uint64_t off, len;
	uint64_t since_ns;
};

/* inode 1 is the root; model i is inode i + 2 */
static struct model *model_of(struct pager *p, fuse_ino_t ino)
{
	return ino >= 2 && ino - 2 < p->n_models ? &p->models[ino - 2] : NULL;
}

static void fill_attr(struct pager *p, fuse_ino_t ino, struct stat *st)
{
	struct model *m = model_of(p, ino);

	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	if (m) {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = (off_t)m->lay->file_size;
		st->st_blksize = READAHEAD;
		st->st_blocks = (blkcnt_t)((m->lay->file_size + 511) / 512);
	} else {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
	}
}

static void fs_init(void *ud, struct fuse_conn_info *conn)
{
	(void)ud;
	conn->max_readahead = READAHEAD;
}

static void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct pager *p = fuse_req_userdata(req);
	struct fuse_entry_param e = { .attr_timeout = 3600, .entry_timeout = 3600 };

	if (parent != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	for (unsigned i = 0; i < p->n_models; i++)
		if (!strcmp(p->models[i].name, name)) {
			p->models[i].fuse_lookups++;
			e.ino = i + 2;
			fill_attr(p, e.ino, &e.attr);
			fuse_reply_entry(req, &e);
			return;
		}
	fuse_reply_err(req, ENOENT);
}

/* The kernel dropped its inode of a model, and the page cache with it. */
static void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct pager *p = fuse_req_userdata(req);
	struct model *m = model_of(p, ino);

	if (m) {
		m->fuse_lookups = m->fuse_lookups > nlookup ? m->fuse_lookups - nlookup : 0;
		m->fuse_inode = m->fuse_lookups > 0;
		for (unsigned u = 0; !m->fuse_lookups && u < m->lay->n_units; u++)
			if (m->us[u].pc != PC_NONE && m->us[u].pc_job == PC_IDLE) {
				m->us[u].pc = PC_NONE;
				m->cache_bytes -= m->lay->units[u].bytes;
			}
	}
	fuse_reply_none(req);
}

static void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct pager *p = fuse_req_userdata(req);
	struct stat st;

	(void)fi;
	if (ino != FUSE_ROOT_ID && !model_of(p, ino)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_attr(p, ino, &st);
	fuse_reply_attr(req, &st, 3600);
}

static void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct pager *p = fuse_req_userdata(req);
	char *buf;
	size_t used = 0;

	(void)fi;
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	buf = malloc(size);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* entries: ".", "..", then the models; off is the next index */
	for (off_t i = off; i < (off_t)p->n_models + 2; i++) {
		struct stat st;
		const char *name = i == 0 ? "." : i == 1 ? ".." : p->models[i - 2].name;
		size_t n;

		fill_attr(p, i < 2 ? FUSE_ROOT_ID : (fuse_ino_t)i, &st);
		n = fuse_add_direntry(req, buf + used, size - used, name, &st, i + 1);
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct pager *p = fuse_req_userdata(req);

	if (!model_of(p, ino)) {
		fuse_reply_err(req, ino == FUSE_ROOT_ID ? EISDIR : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
	/* the kernel has an inode to store into now: the policy may fill its
	 * page cache */
	model_of(p, ino)->fuse_inode = true;
	pager_policy_advance(model_of(p, ino));
}

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

static void *notifier(void *arg)
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

static void job_run(struct pager_fuse *f, struct job *j)
{
	struct model *m = j->m;
	const struct pager_unit *un = &m->lay->units[j->u];
	uint64_t page = m->lay->page;

	j->err = 0;
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
static void jobs_collect(struct pager_fuse *f)
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
		struct ustat *us = &m->us[j->u];

		done = j->next;
		f->jobs--;
		if (j->kind == PC_STORING) {
			f->slot_busy[j->slot] = false;
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
		*tag = (struct io_tag){ .m = best, .u = bu, .kind = IO_STAGE, .slot = (unsigned)slot,
					.off = us->st_off, .len = len };
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
		job_queue(f, j);
	}
	free(tag);
	pump(m->p);
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
	for (unsigned u = 0; u < m->lay->n_units; u++) {
		struct ustat *us = &m->us[u];

		if (us->pc_job != PC_IDLE)
			continue;
		if (us->pc != PC_NONE && !pager_fuse_wants(m, u) && !pager_fuse_waits_for(m, u)) {
			struct job *j = calloc(1, sizeof(*j));

			if (!j)
				continue; /* retried at the next policy step */
			*j = (struct job){ .m = m, .u = u, .kind = PC_DROPPING };
			us->pc_job = PC_DROPPING;
			job_queue(f, j);
		} else if (pager_fuse_store_due(m, u)) {
			uint64_t need = us->pc == PC_NONE ? m->lay->units[u].bytes : 0;

			if (u != 0 && m->mem_bytes + m->cache_bytes + need > allow)
				continue; /* no room now */
			stream_start(m, u, us->resident || m->fuse_reader->pos == (int)u);
		}
	}
	pump(m->p);
}

/* ---- reads ------------------------------------------------------------ */

/* A read put [off, off+len) into the page cache. */
static void note_read(struct model *m, uint64_t off, uint64_t len)
{
	int last = -1;

	for (uint64_t pg = off - off % m->lay->page; pg < off + len; pg += m->lay->page) {
		int u = pager_layout_unit_of(m->lay, pg);
		struct ustat *us;

		if (u < 0 || u == last)
			continue;
		last = u;
		us = &m->us[u];
		if (us->pc == PC_NONE) {
			us->pc = PC_SOME;
			m->cache_bytes += m->lay->units[u].bytes;
		}
		if (us->pc_job == PC_DROPPING)
			us->pc_read_during = true;
	}
}

/*
 * How a read of [off, off+len) can be answered: READY when every unit it
 * spans is in the memfd; WAIT when one is being loaded there; DIRECT
 * otherwise: read from the file itself.  A read never starts a load: the
 * policy loads units only where the budget has room for the memfd's staging
 * copy and the page cache's, and a reader that outruns it (or needs a page
 * the kernel reclaimed, or a tripwire page) reads at storage speed into the
 * page cache alone.
 */
enum how { READY, WAIT, DIRECT };

static enum how how_to_read(struct model *m, uint64_t off, uint64_t len)
{
	uint64_t page = m->lay->page;
	enum how how = READY;
	int last = -1;

	for (uint64_t pg = off - off % page; pg < off + len; pg += page) {
		int u = pager_layout_unit_of(m->lay, pg);

		if (u < 0 || u == last || m->us[u].state == U_LOADED)
			continue;
		last = u;
		if (m->us[u].state != U_LOADING)
			return DIRECT; /* nothing will bring this one into the memfd */
		how = WAIT;
	}
	return how;
}

static void reply_direct(struct pager_fuse *f, fuse_req_t req, struct model *m, uint64_t off,
			 uint64_t len)
{
	uint64_t page = m->lay->page, start = off - off % page;
	uint64_t span = (off + len + page - 1) / page * page - start, got = 0;

	if (span > f->bounce_len) {
		free(f->bounce);
		f->bounce_len = 0;
		if (posix_memalign((void **)&f->bounce, page, span)) {
			f->bounce = NULL;
			fuse_reply_err(req, ENOMEM);
			return;
		}
		f->bounce_len = span;
	}
	while (got < span) {
		ssize_t n = pread(m->fd, f->bounce + got, span - got, (off_t)(start + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (uint64_t)n;
	}
	if (got < off - start + len) {
		pager_log(PAGER_LOG_ERR, "%s: cannot read %llu bytes at %llu", m->name,
			  (unsigned long long)len, (unsigned long long)off);
		fuse_reply_err(req, EIO);
		return;
	}
	m->fuse_direct++;
	fuse_reply_buf(req, (const char *)f->bounce + (off - start), len);
}

/* The process behind a request (its thread id, as the kernel reports it). */
static pid_t reader_pid(fuse_req_t req)
{
	pid_t tid = fuse_req_ctx(req)->pid, pid = tid;
	char path[64], line[128];
	FILE *st;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)tid);
	st = fopen(path, "r");
	while (st && fgets(line, sizeof(line), st))
		if (sscanf(line, "Tgid: %d", &pid) == 1)
			break;
	if (st)
		fclose(st);
	return pid;
}

static void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct pager *p = fuse_req_userdata(req);
	struct model *m = model_of(p, ino);
	struct client *r;
	struct fuse_wait *w;
	enum how how;
	uint64_t len;
	int u;

	(void)fi;
	if (!m) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	if (off < 0 || (uint64_t)off >= m->lay->file_size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	len = m->lay->file_size - (uint64_t)off < size ? m->lay->file_size - (uint64_t)off : size;
	/* where the reader is: the policy reads ahead of it */
	r = m->fuse_reader;
	u = pager_layout_unit_of(m->lay, (uint64_t)off);
	if (u > 0)
		r->pos = u;
	if (r->faults++ % 64 == 0 || !r->pid)
		r->pid = reader_pid(req);
	m->fuse_reads++;
	m->fuse_inode = true;
	pager_policy_advance(m);
	how = how_to_read(m, (uint64_t)off, len);
	if (how == WAIT && p->fuse->quit)
		how = DIRECT;
	switch (how) {
	case READY:
		fuse_reply_buf(req, (const char *)m->map + off, len);
		note_read(m, (uint64_t)off, len);
		return;
	case DIRECT:
		reply_direct(p->fuse, req, m, (uint64_t)off, len);
		note_read(m, (uint64_t)off, len);
		return;
	case WAIT:
		break;
	}
	w = malloc(sizeof(*w));
	if (!w) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	w->req = req;
	w->off = (uint64_t)off;
	w->len = len;
	w->since_ns = pager_now_ns();
	w->next = m->fuse_waiting;
	m->fuse_waiting = w;
}

/* A unit of m finished loading: answer the reads waiting for it. */
void pager_fuse_unit_ready(struct model *m)
{
	struct fuse_wait **pw = &m->fuse_waiting;

	while (*pw) {
		struct fuse_wait *w = *pw;
		enum how how = how_to_read(m, w->off, w->len);

		if (how == WAIT) {
			pw = &w->next;
			continue;
		}
		*pw = w->next;
		if (how == READY)
			fuse_reply_buf(w->req, (const char *)m->map + w->off, w->len);
		else
			reply_direct(m->p->fuse, w->req, m, w->off, w->len);
		note_read(m, w->off, w->len);
		m->fuse_reader->wait_ns += pager_now_ns() - w->since_ns;
		m->fault_wait_ns += pager_now_ns() - w->since_ns;
		free(w);
	}
}

static bool wait_spans(const struct model *m, const struct fuse_wait *w, unsigned u)
{
	for (uint64_t pg = w->off - w->off % m->lay->page; pg < w->off + w->len; pg += m->lay->page)
		if (pager_layout_unit_of(m->lay, pg) == (int)u)
			return true;
	return false;
}

/* A waiting read needs unit u: the policy must not evict it meanwhile (a
 * read spanning two units would otherwise reload them in turn forever). */
bool pager_fuse_waits_for(const struct model *m, unsigned u)
{
	for (const struct fuse_wait *w = m->fuse_waiting; w; w = w->next)
		if (wait_spans(m, w, u))
			return true;
	return false;
}

/* A unit whose reads failed: its waiting readers get EIO. */
void pager_fuse_unit_failed(struct model *m, unsigned u)
{
	struct fuse_wait **pw = &m->fuse_waiting;

	while (*pw) {
		struct fuse_wait *w = *pw;

		if (wait_spans(m, w, u)) {
			*pw = w->next;
			fuse_reply_err(w->req, EIO);
			free(w);
		} else {
			pw = &w->next;
		}
	}
}

static void fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv = { .f_bsize = 4096, .f_frsize = 4096, .f_namemax = 255 };

	(void)ino;
	fuse_reply_statfs(req, &sv);
}

static const struct fuse_lowlevel_ops ops = {
	.init = fs_init,
	.lookup = fs_lookup,
	.forget = fs_forget,
	.getattr = fs_getattr,
	.readdir = fs_readdir,
	.open = fs_open,
	.read = fs_read,
	.statfs = fs_statfs,
};

/*
 * Ask the kernel for 1 MiB reads on this mount: its bdi is named after the
 * mount's anonymous device.  The device comes from /proc/self/mountinfo, not
 * from stat(dir): a stat of our own mount would wait for this very thread to
 * answer it.
 */
static void raise_readahead(const char *dir)
{
	char *real = realpath(dir, NULL), line[4096], path[128];
	unsigned maj = 0, min = 0;
	bool found = false;
	FILE *mi = fopen("/proc/self/mountinfo", "r"), *f;

	while (real && mi && fgets(line, sizeof(line), mi)) {
		char mnt[4096];
		unsigned a, b;

		/* id parent maj:min root mountpoint ...; the last match is ours */
		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &a, &b, mnt) == 3 &&
		    !strcmp(mnt, real)) {
			maj = a;
			min = b;
			found = true;
		}
	}
	if (mi)
		fclose(mi);
	free(real);
	if (!found)
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
	f = fopen(path, "w");
	if (!f || fprintf(f, "%u", READAHEAD / 1024) < 0)
		pager_log(PAGER_LOG_NOTICE, "%s: cannot raise read-ahead (%s): reads stay 128 KiB",
			  dir, path);
	if (f)
		fclose(f);
}

/* Is dir the mount point of a (live: its stat answered) strata mount? */
static bool strata_mount_at(const char *dir)
{
	char *real = realpath(dir, NULL), line[4096];
	FILE *mi = fopen("/proc/self/mountinfo", "r");
	bool found = false;

	while (real && mi && !found && fgets(line, sizeof(line), mi)) {
		char mnt[4096], *sep = strstr(line, " - ");
		char type[64];

		/* id parent maj:min root mountpoint ... - fstype source opts */
		if (sscanf(line, "%*u %*u %*u:%*u %*s %4095s", mnt) == 1 && !strcmp(mnt, real) &&
		    sep && sscanf(sep + 3, "%63s", type) == 1 && !strcmp(type, "fuse.strata"))
			found = true;
	}
	if (mi)
		fclose(mi);
	free(real);
	return found;
}

static int watch_fd(struct pager *p, int fd, uint64_t data)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = data };

	return epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev);
}

int pager_fuse_start(struct pager *p, const char *dir, char *err, size_t errlen)
{
	char *argv[] = { "stratad", "-o", "ro,default_permissions,allow_other,fsname=strata,subtype=strata", NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, argv);
	struct pager_fuse *f;
	struct stat st;

	if (stat(dir, &st) < 0 && errno == ENOTCONN) {
		/* A crashed daemon's mount: take it down and go on. */
		pager_log(PAGER_LOG_NOTICE, "%s: stale mount from a dead daemon: unmounting it", dir);
		if (umount2(dir, MNT_DETACH) < 0) {
			snprintf(err, errlen, "%s: stale FUSE mount; unmount it with: fusermount3 -u %s",
				 dir, dir);
			return -ENOTCONN;
		}
	}
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "%s: not a directory", dir);
		return -ENOTDIR;
	}
	if (strata_mount_at(dir)) {
		snprintf(err, errlen, "%s: another stratad serves a mount here; stop it or choose "
			 "another directory", dir);
		return -EBUSY;
	}
	f = calloc(1, sizeof(*f));
	if (!f || !(f->dir = strdup(dir))) {
		free(f);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	f->p = p;
	f->se = fuse_session_new(&args, &ops, sizeof(ops), p);
	if (!f->se || fuse_session_mount(f->se, dir)) {
		snprintf(err, errlen, "%s: cannot mount (is /dev/fuse there, and are we root?)", dir);
		if (f->se)
			fuse_session_destroy(f->se);
		free(f->dir);
		free(f);
		return -EIO;
	}
	raise_readahead(dir);
	for (int i = 0; i < PAGER_FUSE_SLOTS; i++)
		if (posix_memalign((void **)&f->slot[i], (size_t)p->page, PAGER_FUSE_SLOT)) {
			f->slot[i] = NULL;
			f->slot_busy[i] = true; /* never used */
		}
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	f->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	p->fuse = f;
	if (f->efd >= 0 && pthread_create(&f->thread, NULL, notifier, f) == 0)
		f->started = true;
	if (!f->started || watch_fd(p, f->efd, EV(EV_FUSE, f)) ||
	    watch_fd(p, fuse_session_fd(f->se), EV(EV_FUSE, p))) {
		snprintf(err, errlen, "%s: cannot start the mount's notifier: %s", dir,
			 strerror(errno));
		return -EIO; /* pager_destroy unmounts */
	}
	for (unsigned i = 0; i < p->n_models; i++) {
		struct client *c = calloc(1, sizeof(*c));

		if (!c)
			continue;
		/* the mount's readers, as one client per model for the policy */
		c->p = p;
		c->fd = c->uffd = -1;
		c->state = C_FUSE;
		c->m = &p->models[i];
		c->pos = -1;
		c->next = p->clients;
		p->clients = c;
		p->n_clients++;
		p->models[i].fuse_reader = c;
	}
	pager_log(PAGER_LOG_NOTICE, "serving %u model%s as files under %s", p->n_models,
		  p->n_models == 1 ? "" : "s", dir);
	return 0;
}

/* One request from the kernel. */
static void process(struct pager_fuse *f)
{
	int n = fuse_session_receive_buf(f->se, &f->buf);

	if (n > 0)
		fuse_session_process_buf(f->se, &f->buf);
	else if (n < 0 && n != -EINTR && n != -EAGAIN)
		pager_log_errno(PAGER_LOG_ERR, n, "%s: FUSE session", f->dir);
}

/* The loop saw the session (ptr == p) or the notifier (ptr == p->fuse). */
void pager_fuse_event(struct pager *p, void *ptr)
{
	if (ptr == p)
		process(p->fuse);
	else
		jobs_collect(p->fuse);
}

void pager_fuse_stop(struct pager *p)
{
	struct pager_fuse *f = p->fuse;

	if (!f)
		return;
	for (unsigned i = 0; i < p->n_models; i++)
		while (p->models[i].fuse_waiting) {
			struct fuse_wait *w = p->models[i].fuse_waiting;

			p->models[i].fuse_waiting = w->next;
			fuse_reply_err(w->req, EIO);
			free(w);
		}
	if (f->started) {
		/* The notifier may be waiting on a page under a read only this
		 * thread can answer: serve the mount until it is done (reads
		 * then never wait for the loader, which has stopped). */
		pthread_mutex_lock(&f->mu);
		f->quit = true;
		pthread_cond_signal(&f->cv);
		pthread_mutex_unlock(&f->mu);
		/* and the ring, until the staging reads are in */
		while (f->jobs || f->stage_reads) {
			struct pollfd pf[3] = { { fuse_session_fd(f->se), POLLIN, 0 },
						{ f->efd, POLLIN, 0 },
						{ pio_fd(p->io), POLLIN, 0 } };

			if (poll(pf, 3, -1) < 0 && errno != EINTR)
				break;
			if (pf[0].revents & POLLIN)
				process(f);
			if (pf[1].revents & POLLIN)
				jobs_collect(f);
			if (pf[2].revents & POLLIN)
				pio_reap(p->io, pager_io_done, p);
		}
		pthread_join(f->thread, NULL);
	}
	fuse_session_unmount(f->se);
	fuse_session_destroy(f->se);
	free(f->buf.mem);
	free(f->bounce);
	for (int i = 0; i < PAGER_FUSE_SLOTS; i++)
		free(f->slot[i]);
	if (f->efd >= 0)
		close(f->efd);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
	pager_log(PAGER_LOG_NOTICE, "%s: unmounted", f->dir);
	free(f->dir);
	free(f);
	p->fuse = NULL;
}
