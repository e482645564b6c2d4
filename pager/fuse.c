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
 * Not yet: pushing streamed layers into the page cache ahead of use
 * (notify_store) and dropping them after use (notify_inval_inode), which the
 * budget needs on this path; see docs/design.md.
 */
#define FUSE_USE_VERSION 35
#include "server_i.h"

#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define READAHEAD (1u << 20)

struct pager_fuse {
	struct pager *p;
	struct fuse_session *se;
	struct fuse_buf buf;
	char *dir;
};

/* A read waiting for its units. */
struct fuse_wait {
	struct fuse_wait *next;
	fuse_req_t req;
	uint64_t off, len;
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
			e.ino = i + 2;
			fill_attr(p, e.ino, &e.attr);
			fuse_reply_entry(req, &e);
			return;
		}
	fuse_reply_err(req, ENOENT);
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
}

/* Are all units holding [off, off+len) in memory?  Starts loads if not. */
static bool range_ready(struct model *m, uint64_t off, uint64_t len)
{
	uint64_t page = m->lay->page;
	bool ready = true;

	for (uint64_t pg = off - off % page; pg < off + len; pg += page) {
		int u = pager_layout_unit_of(m->lay, pg);

		if (u < 0 || m->us[u].state == U_LOADED)
			continue;
		ready = false;
		pager_load(m, (unsigned)u);
		/* skip the rest of this unit's extent containing pg */
		for (unsigned i = 0; i < m->lay->units[u].n_ext; i++) {
			const struct pager_extent *e = &m->lay->units[u].ext[i];

			if (pg >= e->off && pg < e->off + e->len)
				pg = e->off + e->len - page;
		}
	}
	return ready;
}

static void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct pager *p = fuse_req_userdata(req);
	struct model *m = model_of(p, ino);
	struct fuse_wait *w;
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
	u = pager_layout_unit_of(m->lay, (uint64_t)off - (uint64_t)off % m->lay->page);
	if (m->fuse_reader && u > 0)
		m->fuse_reader->pos = u;
	m->fuse_reads++;
	if (range_ready(m, (uint64_t)off, len)) {
		fuse_reply_buf(req, (const char *)m->map + off, len);
		pager_policy_advance(m);
		return;
	}
	w = malloc(sizeof(*w));
	if (!w) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	w->req = req;
	w->off = (uint64_t)off;
	w->len = len;
	w->next = m->fuse_waiting;
	m->fuse_waiting = w;
	pager_policy_advance(m);
}

/* Called when a unit of m finished loading: answer reads now complete. */
void pager_fuse_unit_ready(struct model *m)
{
	struct fuse_wait **pw = &m->fuse_waiting;

	while (*pw) {
		struct fuse_wait *w = *pw;

		if (range_ready(m, w->off, w->len)) {
			*pw = w->next;
			fuse_reply_buf(w->req, (const char *)m->map + w->off, w->len);
			free(w);
		} else {
			pw = &w->next;
		}
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
	p->fuse = f;
	pager_log(PAGER_LOG_NOTICE, "serving %u model%s as files under %s", p->n_models,
		  p->n_models == 1 ? "" : "s", dir);
	return 0;
}

int pager_fuse_fd(const struct pager *p)
{
	return p->fuse ? fuse_session_fd(p->fuse->se) : -1;
}

/* One request from the kernel. */
void pager_fuse_process(struct pager *p)
{
	struct pager_fuse *f = p->fuse;
	int n = fuse_session_receive_buf(f->se, &f->buf);

	if (n > 0)
		fuse_session_process_buf(f->se, &f->buf);
	else if (n < 0 && n != -EINTR && n != -EAGAIN)
		pager_log_errno(PAGER_LOG_ERR, n, "%s: FUSE session", f->dir);
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
	fuse_session_unmount(f->se);
	fuse_session_destroy(f->se);
	free(f->buf.mem);
	pager_log(PAGER_LOG_NOTICE, "%s: unmounted", f->dir);
	free(f->dir);
	free(f);
	p->fuse = NULL;
}
