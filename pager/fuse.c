/*
 * fuse.c - the FUSE front end: every served model as a read-only file, so any
 * mmap-based runtime gets the pager without changing a line.
 *
 * The mount is a libfuse3 low-level session driven from the daemon's own
 * epoll loop (no libfuse threads): the root directory lists one regular file
 * per model, of its exact size and bytes.  A read (the kernel asks only for
 * what its page cache lacks) is answered from the model's memfd when the
 * userfaultfd path holds the units there, waits (the request is kept, not
 * blocked on) when they are being loaded, and is read from the file itself
 * otherwise.  Each read also tells the policy where the reader is, through a
 * pseudo-client per model, so the layers ahead are stored before they are
 * asked for.
 *
 * Opens keep the page cache (keep_cache) and the kernel is asked for large
 * reads: max_readahead 1 MiB and the mount's bdi read_ahead_kb raised to
 * match (by default FUSE issues 128 KiB requests).
 *
 * The budget holds here as on the userfaultfd path: the page cache is the
 * reader's copy.  The policy stores the units it wants in memory into it
 * ahead of the reader and drops streamed layers behind it (fuse_store.c).
 * Streamed layers are stored without one page, whose read tells the policy
 * the reader reached the layer, as the tripwires do for engines.  What the
 * page cache holds counts against the budget (cache_bytes).  See the FUSE
 * section of docs/design.md.
 */
#include "fuse_i.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define READAHEAD (1u << 20)


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

/* ---- reads ------------------------------------------------------------ */

/* A read put [off, off+len) into the page cache. */
static void note_read(struct model *m, uint64_t off, uint64_t len)
{
	int last = -1;

	for (uint64_t pg = off - off % m->lay->page; pg < off + len; pg += m->lay->page) {
		int u = pager_layout_unit_of(m->lay, pg);
		struct ustat *us;

		if (u == PAGER_SPARSE)
			m->fuse_sparse_bytes += m->lay->page;
		if (u < 0 || u == last)
			continue;
		last = u;
		us = &m->us[u];
		if (us->pc == PC_NONE) {
			us->pc = PC_SOME;
			m->cache_bytes += m->lay->units[u].bytes;
			if (pager_is_expert(m->lay, (unsigned)u))
				pager_experts_fuse_read(m, (unsigned)u);
		}
		if (us->pc_job == PC_DROPPING)
			us->pc_read_during = true;
	}
	if (m->fuse_sparse_bytes > PAGER_SPARSE_CAP)
		pager_fuse_drop_sparse(m);
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

		if (u == PAGER_SPARSE)
			return DIRECT; /* the memfd's copy is partial, if any */
		if (u < 0 || u == last || m->us[u].state == U_LOADED)
			continue;
		last = u;
		if (m->us[u].state != U_LOADING)
			return DIRECT; /* nothing will bring this one into the memfd */
		how = WAIT;
	}
	return how;
}

/* A read of the file itself, on the ring; the reply goes when it is in. */
struct direct {
	fuse_req_t req;
	struct model *m;
	uint8_t *buf;   /* page-aligned, [start, start + span) of the file */
	uint64_t start, off, len, got;
	int err;
};

/* A staging slot whose read is in (its store queued or running) may hold
 * the whole range: answer from it. */
static bool reply_from_slot(struct pager_fuse *f, fuse_req_t req, struct model *m, uint64_t off,
			    uint64_t len)
{
	for (int i = 0; i < PAGER_FUSE_SLOTS; i++)
		if (f->slot_m[i] == m && off >= f->slot_off[i] &&
		    off + len <= f->slot_off[i] + f->slot_len[i]) {
			fuse_reply_buf(req, (const char *)f->slot[i] + (off - f->slot_off[i]), len);
			return true;
		}
	return false;
}

static void reply_direct(struct pager_fuse *f, fuse_req_t req, struct model *m, uint64_t off,
			 uint64_t len)
{
	uint64_t page = m->lay->page, start = off - off % page;
	uint64_t span = (off + len + page - 1) / page * page - start;
	struct direct *d;
	struct io_tag *tag;
	int n;

	if (reply_from_slot(f, req, m, off, len))
		return;
	d = calloc(1, sizeof(*d));
	tag = calloc(1, sizeof(*tag));
	if (!d || !tag || posix_memalign((void **)&d->buf, page, span)) {
		free(d);
		free(tag);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	*d = (struct direct){ .req = req, .m = m, .buf = d->buf, .start = start, .off = off,
			      .len = len };
	*tag = (struct io_tag){ .m = m, .kind = IO_DIRECT, .owner = &pager_fuse_ops, .ptr = d };
	n = pio_read(m->p->io, m->fd, d->buf, start, span, m->lay->file_size, tag);
	if (n < 0) {
		pager_log_errno(PAGER_LOG_ERR, n, "%s: reading %llu bytes at %llu", m->name,
				(unsigned long long)len, (unsigned long long)off);
		fuse_reply_err(req, EIO);
		free(d->buf);
		free(d);
		free(tag);
		return;
	}
	tag->parts = (unsigned)n;
	f->direct_reads++;
	m->fuse_direct++;
}

/* Part of a read of the file itself completed. */
static void direct_done(struct io_tag *tag, int err, uint64_t bytes, bool last)
{
	struct direct *d = tag->ptr;

	d->got += bytes;
	if (err && !d->err)
		d->err = err;
	if (!last || --tag->parts)
		return;
	d->m->p->fuse->direct_reads--;
	if (d->err || d->got < d->off - d->start + d->len) {
		pager_log_errno(PAGER_LOG_ERR, d->err ? d->err : -EIO,
				"%s: reading %llu bytes at %llu", d->m->name,
				(unsigned long long)d->len, (unsigned long long)d->off);
		fuse_reply_err(d->req, EIO);
	} else {
		fuse_reply_buf(d->req, (const char *)d->buf + (d->off - d->start), d->len);
	}
	free(d->buf);
	free(d);
	free(tag);
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
		r->pos = m->lay->units[u].layer + 1; /* an expert's: its layer's */
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
static void fuse_unit_ready(struct model *m, unsigned u)
{
	struct fuse_wait **pw = &m->fuse_waiting;

	(void)u; /* a read may span several units: each waiting one is asked again */
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
static void fuse_unit_failed(struct model *m, unsigned u)
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

/* ---- the consumer ----------------------------------------------------- */

/* The kernel has the file's inode, and with it a page cache to fill. */
static bool fuse_present(const struct model *m)
{
	return m->fuse_inode;
}

/* The mount does not ask for the memfd: it has its own way into the page
 * cache (fuse_store.c), and answers reads from what the memfd holds for the
 * engines. */
static bool fuse_wants(const struct model *m, unsigned u)
{
	(void)m;
	(void)u;
	return false;
}

static uint64_t fuse_held(const struct model *m)
{
	return m->cache_bytes + m->fuse_sparse_bytes;
}

static void fuse_io_done(struct io_tag *tag, int err, uint64_t bytes, bool last)
{
	if (tag->kind == IO_STAGE)
		pager_fuse_staged(tag, err, bytes, last);
	else
		direct_done(tag, err, bytes, last);
}

const struct consumer_ops pager_fuse_ops = {
	.name = "FUSE",
	.present = fuse_present,
	.wants = fuse_wants,
	.unit_ready = fuse_unit_ready,
	.unit_failed = fuse_unit_failed,
	.holds = pager_fuse_waits_for,
	.advance = pager_fuse_advance,
	.held = fuse_held,
	.io_done = fuse_io_done,
	.fixed_bytes = PAGER_FUSE_STAGING,
};

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
/* The mount at dir, from /proc/self/mountinfo (the last one there is the
 * one on top): its device and file system type.  False if none. */
static bool find_mount(const char *dir, unsigned *maj, unsigned *min, char type[64])
{
	char *real = realpath(dir, NULL), line[4096];
	FILE *mi = fopen("/proc/self/mountinfo", "r");
	bool found = false;

	while (real && mi && fgets(line, sizeof(line), mi)) {
		char mnt[4096], t[64], *sep = strstr(line, " - ");
		unsigned a, b;

		/* id parent maj:min root mountpoint ... - fstype source opts */
		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &a, &b, mnt) == 3 &&
		    !strcmp(mnt, real) && sep && sscanf(sep + 3, "%63s", t) == 1) {
			*maj = a;
			*min = b;
			memcpy(type, t, sizeof(t));
			found = true;
		}
	}
	if (mi)
		fclose(mi);
	free(real);
	return found;
}

static void raise_readahead(const char *dir, unsigned maj, unsigned min)
{
	char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
	f = fopen(path, "w");
	if (!f || fprintf(f, "%u", READAHEAD / 1024) < 0)
		pager_log(PAGER_LOG_NOTICE, "%s: cannot raise read-ahead (%s): reads stay 128 KiB",
			  dir, path);
	if (f)
		fclose(f);
}

/*
 * The guardian.  A daemon killed while its notifier waits on a page lock
 * cannot finish dying: the lock is held for a read only the dead loop could
 * answer, the wait is uninterruptible, and the connection whose teardown
 * would fail that read goes only once the process has exited.  The reader
 * would hang with it.  So a small process (this binary again, see
 * pager_fuse_guard) waits for the daemon's main thread to die
 * (PR_SET_PDEATHSIG) and aborts the connection through fusectl, which fails
 * the pending reads and lets everyone go.  A clean stop kills it first.
 *
 * The daemon opens the connection's abort file itself, right after its
 * mount, and the guardian inherits that descriptor (GUARD_FD).  By name, a
 * guardian slow to run (a sanitizer build's) could abort the next daemon's
 * mount: that daemon detaches the dead one's and mounts again, and the
 * kernel gives the new connection the lowest free number, the dead one's.
 * A descriptor stays the old connection's: once that is gone, the file is
 * unlinked (st_nlink 0), and a write to it is accepted and aborts nothing.
 */
#define GUARD_FD 3

static int open_abort(unsigned conn)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/abort", conn);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT &&
	    mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, NULL) == 0)
		fd = open(path, O_WRONLY | O_CLOEXEC);
	return fd;
}

static pid_t spawn_guard(unsigned conn)
{
	pid_t parent = getpid(), pid;
	int fd = open_abort(conn);
	char arg[16];
	sigset_t set;

	if (fd < 0)
		return -1;
	snprintf(arg, sizeof(arg), "%u", conn);
	pid = fork();
	if (pid != 0) {
		close(fd);
		return pid;
	}
	/* the abort file at GUARD_FD, kept across the exec */
	if (fd == GUARD_FD ? fcntl(fd, F_SETFD, 0) < 0 : dup2(fd, GUARD_FD) < 0)
		_exit(127);
	/* blocked, so a death before the guardian waits stays pending */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
		raise(SIGTERM);
	execl("/proc/self/exe", "stratad", "--fuse-guard", arg, (char *)NULL);
	_exit(127);
}

int pager_fuse_guard(unsigned conn)
{
	struct stat st;
	sigset_t set;
	int sig;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	close_range(GUARD_FD + 1, ~0u, 0);
	if (fcntl(GUARD_FD, F_GETFD) < 0) {
		pager_log(PAGER_LOG_ERR, "--fuse-guard: no abort file at descriptor %d (internal: "
			  "stratad --fuse starts it)", GUARD_FD);
		return 2;
	}
	if (sigwait(&set, &sig))
		return 1;
	if (fstat(GUARD_FD, &st) == 0 && st.st_nlink == 0)
		pager_log(PAGER_LOG_NOTICE, "the daemon died: its mount's connection %u had gone "
			  "with it", conn);
	else if (write(GUARD_FD, "1", 1) == 1)
		pager_log(PAGER_LOG_NOTICE, "the daemon died: its mount's connection %u aborted",
			  conn);
	close(GUARD_FD);
	return 0;
}

/* Is dir the mount point of a strata mount (a live one, once the stale
 * check passed)? */
static bool strata_mount_at(const char *dir)
{
	unsigned maj, min;
	char type[64];

	return find_mount(dir, &maj, &min, type) && !strcmp(type, "fuse.strata");
}

static int watch_fd(struct pager *p, int fd, uint64_t data)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = data };

	return epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev);
}

int pager_fuse_start(struct pager *p, const char *dir, char *err, size_t errlen)
{
	char *argv[] = { "stratad", "-o",
			 "ro,default_permissions,allow_other,fsname=strata,subtype=strata", NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, argv);
	struct pager_fuse *f;
	unsigned maj, min;
	char type[64];
	struct statvfs sv;
	struct stat st;

	/* statfs, not stat: a stat can be answered from cached attributes */
	if (statvfs(dir, &sv) < 0 && errno == ENOTCONN) {
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
	fuse_opt_free_args(&args); /* the session may have copied them */
	if (!f->se || fuse_session_mount(f->se, dir)) {
		snprintf(err, errlen, "%s: cannot mount (is /dev/fuse there, and are we root?)", dir);
		if (f->se)
			fuse_session_destroy(f->se);
		free(f->dir);
		free(f);
		return -EIO;
	}
	if (find_mount(dir, &maj, &min, type)) {
		raise_readahead(dir, maj, min);
		f->guard = spawn_guard(min);
	}
	if (f->guard <= 0)
		pager_log(PAGER_LOG_WARNING, "%s: no guardian: if this daemon is killed, a reader "
			  "may hang until the mount is aborted", dir);
	for (int i = 0; i < PAGER_FUSE_SLOTS; i++)
		if (posix_memalign((void **)&f->slot[i], (size_t)p->page, PAGER_FUSE_SLOT)) {
			f->slot[i] = NULL;
			f->slot_busy[i] = true; /* never used */
		}
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	f->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	p->fuse = f;
	if (f->efd >= 0 && pthread_create(&f->thread, NULL, pager_fuse_notifier, f) == 0)
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
		pager_fuse_collect(p->fuse);
}

void pager_fuse_stop(struct pager *p)
{
	struct pager_fuse *f = p->fuse;

	if (!f)
		return;
	if (f->guard > 0) {
		kill(f->guard, SIGKILL);
		waitpid(f->guard, NULL, 0);
	}
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
		while (f->jobs || f->stage_reads || f->direct_reads) {
			struct pollfd pf[3] = { { fuse_session_fd(f->se), POLLIN, 0 },
						{ f->efd, POLLIN, 0 },
						{ pio_fd(p->io), POLLIN, 0 } };

			if (poll(pf, 3, -1) < 0 && errno != EINTR)
				break;
			if (pf[0].revents & POLLIN)
				process(f);
			if (pf[1].revents & POLLIN)
				pager_fuse_collect(f);
			if (pf[2].revents & POLLIN)
				pio_reap(p->io, pager_io_done, p);
		}
		pthread_join(f->thread, NULL);
	}
	fuse_session_unmount(f->se);
	fuse_session_destroy(f->se);
	free(f->buf.mem);
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
