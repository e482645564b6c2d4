/*
 * faultfs.c - a FUSE filesystem for fault-injection tests: it serves one file
 * (the BACKING file's bytes, under its own name) and fails reads of it on
 * command.  The pager reads models with io_uring and O_DIRECT, which no
 * LD_PRELOAD sees; this sits below, where a failing disk would.
 *
 * usage: faultfs BACKING MOUNTPOINT   (foreground, single-threaded; unmount
 *        with fusermount3 -u, or SIGTERM)
 *
 * Commands, one line written to MOUNTPOINT/ctl:
 *   off          serve every read
 *   eio OFF      every read covering byte OFF fails with EIO
 *   short OFF    the next read covering OFF returns only the bytes before it
 *                (at least one page, so the reader makes progress), once
 *   eof OFF      every read from OFF on returns no bytes (a file that ends
 *                early without its size saying so)
 * Reading ctl gives "reads N faults M": reads served and faults injected.
 *
 * The pager reads with O_DIRECT, which FUSE passes through: each of its reads
 * reaches fs_read() with its own offset and size, no page cache in between.
 * (The file itself is not direct_io: the daemon maps it once to parse the
 * header, and FUSE refuses to map a direct_io file.)
 */
#define FUSE_USE_VERSION 35
#include <fuse.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum mode { M_OFF, M_EIO, M_SHORT, M_EOF };

static int backing = -1;
static char name[256];
static off_t size;
static enum mode mode;
static uint64_t at, n_reads, n_faults;
static char ctl_out[64];

static int is_file(const char *path)
{
	return path[0] == '/' && !strcmp(path + 1, name);
}

static int fs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	(void)fi;
	memset(st, 0, sizeof(*st));
	if (!strcmp(path, "/")) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else if (is_file(path)) {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = size;
	} else if (!strcmp(path, "/ctl")) {
		st->st_mode = S_IFREG | 0600;
		st->st_nlink = 1;
		st->st_size = sizeof(ctl_out);
	} else {
		return -ENOENT;
	}
	return 0;
}

static int fs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off, (void)fi, (void)flags;
	if (strcmp(path, "/"))
		return -ENOENT;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, name, NULL, 0, 0);
	fill(buf, "ctl", NULL, 0, 0);
	return 0;
}

static int fs_open(const char *path, struct fuse_file_info *fi)
{
	if (is_file(path)) {
		if ((fi->flags & O_ACCMODE) != O_RDONLY)
			return -EACCES;
		return 0;
	}
	if (!strcmp(path, "/ctl")) {
		fi->direct_io = 1;
		return 0;
	}
	return -ENOENT;
}

static int fs_truncate(const char *path, off_t len, struct fuse_file_info *fi)
{
	(void)len, (void)fi;
	return strcmp(path, "/ctl") ? -EACCES : 0;
}

static int fs_read(const char *path, char *buf, size_t len, off_t off, struct fuse_file_info *fi)
{
	uint64_t o = (uint64_t)off, end;
	ssize_t n;

	(void)fi;
	if (!strcmp(path, "/ctl")) {
		int k = snprintf(ctl_out, sizeof(ctl_out), "reads %" PRIu64 " faults %" PRIu64 "\n",
				 n_reads, n_faults);

		if (off >= k)
			return 0;
		if ((size_t)(k - off) < len)
			len = (size_t)(k - off);
		memcpy(buf, ctl_out + off, len);
		return (int)len;
	}
	if (!is_file(path))
		return -ENOENT;
	n_reads++;
	if (off >= size)
		return 0;
	if ((uint64_t)(size - off) < len)
		len = (size_t)(size - off);
	end = o + len;
	switch (mode) {
	case M_OFF:
		break;
	case M_EIO:
		if (o <= at && at < end) {
			n_faults++;
			return -EIO;
		}
		break;
	case M_SHORT:
		if (o <= at && at < end) {
			uint64_t keep = at - o < 4096 ? 4096 : (at - o) & ~(uint64_t)4095;

			if (keep < len) {
				len = (size_t)keep;
				mode = M_OFF;
				n_faults++;
			}
		}
		break;
	case M_EOF:
		if (end > at) {
			n_faults++;
			if (o >= at)
				return 0;
			len = (size_t)(at - o);
		}
		break;
	}
	n = pread(backing, buf, len, off);
	return n < 0 ? -errno : (int)n;
}

static int fs_write(const char *path, const char *buf, size_t len, off_t off,
		    struct fuse_file_info *fi)
{
	char cmd[64], word[16];
	unsigned long long v = 0;
	int k;

	(void)off, (void)fi;
	if (strcmp(path, "/ctl"))
		return -EACCES;
	if (len >= sizeof(cmd))
		return -EINVAL;
	memcpy(cmd, buf, len);
	cmd[len] = '\0';
	k = sscanf(cmd, "%15s %llu", word, &v);
	if (k >= 1 && !strcmp(word, "off"))
		mode = M_OFF;
	else if (k == 2 && !strcmp(word, "eio"))
		mode = M_EIO;
	else if (k == 2 && !strcmp(word, "short"))
		mode = M_SHORT;
	else if (k == 2 && !strcmp(word, "eof"))
		mode = M_EOF;
	else
		return -EINVAL;
	at = v;
	fprintf(stderr, "faultfs: %s", cmd);
	return (int)len;
}

static const struct fuse_operations ops = {
	.getattr = fs_getattr,
	.readdir = fs_readdir,
	.open = fs_open,
	.truncate = fs_truncate,
	.read = fs_read,
	.write = fs_write,
};

int main(int argc, char **argv)
{
	struct stat st;
	const char *base;

	if (argc != 3) {
		fprintf(stderr, "usage: faultfs BACKING MOUNTPOINT\n");
		return 1;
	}
	backing = open(argv[1], O_RDONLY | O_CLOEXEC);
	if (backing < 0 || fstat(backing, &st) < 0) {
		fprintf(stderr, "faultfs: %s: %s\n", argv[1], strerror(errno));
		return 2;
	}
	size = st.st_size;
	base = strrchr(argv[1], '/');
	snprintf(name, sizeof(name), "%s", base ? base + 1 : argv[1]);
	char *fargv[] = { argv[0], "-f", "-s", "-o", "auto_unmount", argv[2], NULL };
	return fuse_main(6, fargv, &ops, NULL);
}
