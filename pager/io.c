/*
 * io.c - read file extents into memory with io_uring, large and many at once.
 *
 * A request (one extent of a unit) is split into chunks of `chunk` bytes;
 * up to `depth` chunks' bytes are in flight, the rest wait in a FIFO.  Bytes,
 * not chunks: an expert of a mixture of experts is three extents of about
 * 1 MiB, and `depth` of those in flight would read a fraction of what the
 * device gives (at most IO_MAX_INFLIGHT requests).  Reads are
 * O_DIRECT (the caller opens the file so) into the caller's mapping of the
 * memfd: plain reads, never registered buffers, because registered buffers
 * pin pages that a later punch hole would orphan.  Punch holes go through
 * the ring too (IORING_OP_FALLOCATE), so freeing a 100 MiB layer (tens of ms
 * of kernel time) never stalls the loop that keeps reads in flight.  Completions arrive on an
 * eventfd the daemon's epoll loop watches; pio_reap() finishes them, resubmits
 * short reads and calls back once per chunk.
 *
 * Bounced reads (pio_read_to) go to a file instead of a mapping: each chunk
 * is read (O_DIRECT) into the ring's own bounce arena, whose pages are
 * touched once and reused, then written to the file (the model's memfd) by
 * IORING_OP_WRITE.  A read straight into the memfd's mapping has the kernel
 * fault in, zero and map every new page first; on the Zen 5 guest that was
 * 0.70-0.92 ms of CPU a MiB against 0.40-0.46 through a reused buffer and a
 * write, which does not zero the whole pages it fills (docs/benchmarks.md,
 * issue 22).  The writes into one memfd run one after another (io_uring
 * gives a file's buffered writes to one worker, and the write takes the
 * inode's lock anyway), each making its pages.  The arena is taken in 64
 * KiB grains; a chunk that finds no room waits, and the reads behind it
 * too (they stay in order).
 *
 * Single-threaded: only the daemon's event loop calls in.
 */
#include "io_i.h"
#include "pager.h"
#include "pager_i.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct chunk {
	struct chunk *next;
	bool punch;
	int fd;
	uint8_t *buf;
	uint64_t off;
	uint64_t len;
	uint64_t eof; /* file size: a short read ending here is complete */
	void *tag;
	/* bounced (dst_fd >= 0): read into the arena at base, then written to
	 * dst_fd at dst_off; got: bytes read so far, then written so far */
	int dst_fd;
	bool writing;
	uint8_t *base;
	uint64_t dst_off, got;
	unsigned grain, grains;
};

/* Requests in flight at most, however small. */
#define IO_MAX_INFLIGHT 64
#define BOUNCE_GRAIN (64u << 10)

struct pager_io {
	struct io_uring ring;
	int efd;
	unsigned depth;
	unsigned inflight;
	uint64_t inflight_bytes;
	uint64_t chunk;
	struct chunk *head, *tail; /* waiting to be submitted */
	uint64_t busy_since_ns;    /* when inflight_bytes went from 0 */
	uint64_t busy_ns;          /* total time with reads in flight (not writes
				    * or punches: the device's bandwidth is read
				    * over it, predict.c) */
	uint8_t *arena;            /* bounced reads' buffer (pio_bounce) */
	uint64_t arena_bytes;
	bool *grain_taken;         /* [arena_bytes / BOUNCE_GRAIN] */
};

int pio_create(unsigned depth, uint64_t chunk, struct pager_io **out)
{
	struct pager_io *io = calloc(1, sizeof(*io));
	int rc;

	*out = NULL;
	if (!io)
		return -ENOMEM;
	io->depth = depth;
	io->chunk = chunk;
	rc = io_uring_queue_init(depth * 2 > IO_MAX_INFLIGHT ? depth * 2 : IO_MAX_INFLIGHT,
				 &io->ring, 0);
	if (rc < 0) {
		free(io);
		return rc;
	}
	io->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (io->efd < 0) {
		rc = -errno;
		io_uring_queue_exit(&io->ring);
		free(io);
		return rc;
	}
	rc = io_uring_register_eventfd(&io->ring, io->efd);
	if (rc < 0) {
		close(io->efd);
		io_uring_queue_exit(&io->ring);
		free(io);
		return rc;
	}
	*out = io;
	return 0;
}

void pio_destroy(struct pager_io *io)
{
	struct chunk *c, *n;

	if (!io)
		return;
	/* In-flight reads target memory the caller is about to unmap: wait. */
	while (io->inflight) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(&io->ring, &cqe) < 0)
			break;
		free(io_uring_cqe_get_data(cqe));
		io_uring_cqe_seen(&io->ring, cqe);
		io->inflight--;
	}
	for (c = io->head; c; c = n) {
		n = c->next;
		free(c);
	}
	io_uring_queue_exit(&io->ring);
	close(io->efd);
	free(io->arena);
	free(io->grain_taken);
	free(io);
}

int pio_bounce(struct pager_io *io, uint64_t bytes)
{
	bytes = (bytes + BOUNCE_GRAIN - 1) / BOUNCE_GRAIN * BOUNCE_GRAIN;
	if (io->arena || !bytes)
		return -EINVAL;
	io->grain_taken = calloc(bytes / BOUNCE_GRAIN, sizeof(*io->grain_taken));
	if (!io->grain_taken || posix_memalign((void **)&io->arena, 4096, bytes)) {
		free(io->grain_taken);
		io->grain_taken = NULL;
		io->arena = NULL;
		return -ENOMEM;
	}
	io->arena_bytes = bytes;
	return 0;
}

uint64_t pio_bounce_bytes(const struct pager_io *io)
{
	return io ? io->arena_bytes : 0;
}

/* Room in the arena for chunk c (first fit), or false. */
static bool take_grains(struct pager_io *io, struct chunk *c)
{
	unsigned n = (unsigned)(io->arena_bytes / BOUNCE_GRAIN), need;
	unsigned run = 0;

	need = (unsigned)((c->len + BOUNCE_GRAIN - 1) / BOUNCE_GRAIN);
	for (unsigned g = 0; g < n; g++) {
		run = io->grain_taken[g] ? 0 : run + 1;
		if (run == need) {
			c->grain = g + 1 - need;
			c->grains = need;
			for (unsigned k = c->grain; k <= g; k++)
				io->grain_taken[k] = true;
			c->base = c->buf = io->arena + (uint64_t)c->grain * BOUNCE_GRAIN;
			return true;
		}
	}
	return false;
}

/* A bounced chunk is done (written, or failed): its grains are free. */
static void drop_grains(struct pager_io *io, struct chunk *c)
{
	for (unsigned k = c->grain; k < c->grain + c->grains; k++)
		io->grain_taken[k] = false;
	c->grains = 0;
}

int pio_fd(const struct pager_io *io)
{
	return io->efd;
}

static void submit_waiting(struct pager_io *io)
{
	bool any = false;

	/* writes from the arena take no device time: they never wait for
	 * reads in flight */
	while (io->head && io->inflight < IO_MAX_INFLIGHT &&
	       (io->inflight == 0 || io->head->writing ||
		io->inflight_bytes + io->head->len <= io->chunk * io->depth)) {
		struct chunk *c = io->head;
		struct io_uring_sqe *sqe;

		if (c->dst_fd >= 0 && !c->base && !take_grains(io, c))
			break; /* the arena is full: when a chunk's write is done */
		sqe = io_uring_get_sqe(&io->ring);
		if (!sqe)
			break;
		if (!c->punch && !c->writing) {
			if (io->inflight_bytes == 0)
				io->busy_since_ns = pager_now_ns();
			io->inflight_bytes += c->len;
		}
		io->head = c->next;
		if (!io->head)
			io->tail = NULL;
		if (c->punch)
			io_uring_prep_fallocate(sqe, c->fd,
						FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
						(off_t)c->off, (off_t)c->len);
		else if (c->writing)
			io_uring_prep_write(sqe, c->dst_fd, c->base + c->got, (unsigned)c->len,
					    c->dst_off + c->got);
		else
			io_uring_prep_read(sqe, c->fd, c->buf, (unsigned)c->len, c->off);
		/* A read into pages the memfd has not allocated yet allocates
		 * and zeroes them first (about 0.5 s of CPU per GB here), which
		 * would otherwise run in io_uring_submit() on this thread, one
		 * read after the other, while faults wait: straight to the
		 * ring's workers, which do it in parallel.  A read into the
		 * arena has nothing to allocate: it goes to the device from
		 * here (O_DIRECT completes asynchronously), without a worker's
		 * wake-up and switch on the way.  A write to the memfd takes
		 * its inode's lock and makes its pages: a worker's. */
		if (c->dst_fd < 0 || c->writing)
			sqe->flags |= IOSQE_ASYNC;
		io_uring_sqe_set_data(sqe, c);
		io->inflight++;
		any = true;
	}
	if (any)
		io_uring_submit(&io->ring);
}

static void enqueue(struct pager_io *io, struct chunk *c)
{
	c->next = NULL;
	if (io->tail)
		io->tail->next = c;
	else
		io->head = c;
	io->tail = c;
}

/* Ahead of the reads waiting: a write frees its grains for them. */
static void enqueue_first(struct pager_io *io, struct chunk *c)
{
	c->next = io->head;
	io->head = c;
	if (!io->tail)
		io->tail = c;
}

/* Queue [first.off, first.off + len) as chunks of at most `step` bytes, each
 * a copy of `first` moved on (its buffer, or its destination); returns how
 * many were queued, or -errno. */
static int queue_reads(struct pager_io *io, struct chunk first, uint64_t len, uint64_t step)
{
	int n = 0;

	for (uint64_t pos = 0; pos < len; pos += step) {
		struct chunk *c = malloc(sizeof(*c));

		if (!c)
			return n ? n : -ENOMEM;
		*c = first;
		c->buf = first.buf ? first.buf + pos : NULL;
		c->off = first.off + pos;
		c->dst_off = first.dst_off + pos;
		c->len = len - pos < step ? len - pos : step;
		enqueue(io, c);
		n++;
	}
	submit_waiting(io);
	return n;
}

int pio_read(struct pager_io *io, int fd, uint8_t *buf, uint64_t off, uint64_t len,
	     uint64_t eof, void *tag)
{
	return queue_reads(io, (struct chunk){ .fd = fd, .buf = buf, .off = off, .eof = eof,
					       .tag = tag, .dst_fd = -1 },
			   len, io->chunk);
}

int pio_read_to(struct pager_io *io, int fd, uint64_t off, uint64_t len, uint64_t eof,
		int dst_fd, uint64_t dst_off, void *tag)
{
	if (!io->arena || dst_fd < 0)
		return -EINVAL;
	return queue_reads(io, (struct chunk){ .fd = fd, .off = off, .eof = eof, .tag = tag,
					       .dst_fd = dst_fd, .dst_off = dst_off },
			   len, io->chunk < io->arena_bytes ? io->chunk : io->arena_bytes);
}

int pio_punch(struct pager_io *io, int fd, uint64_t off, uint64_t len, void *tag)
{
	struct chunk *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->dst_fd = -1;
	c->punch = true;
	c->fd = fd;
	c->off = off;
	c->len = len;
	c->tag = tag;
	enqueue(io, c);
	submit_waiting(io);
	return 0;
}

/* A bounced chunk's read or write completed with res: on to its write, or
 * done. */
static void bounced(struct pager_io *io, struct chunk *c, int res, pio_done_fn done, void *arg)
{
	bool end = !c->writing && res == 0 && c->off >= c->eof; /* read at the end */

	if (res < 0 || (res == 0 && !end)) {
		drop_grains(io, c);
		done(c->tag, res < 0 ? res : -EIO, 0, true, arg);
		free(c);
		return;
	}
	c->got += (uint64_t)res;
	if (!c->writing) {
		if ((uint64_t)res < c->len && c->off + (uint64_t)res < c->eof) {
			/* short, before the end of the file: read the rest (O_DIRECT
			 * keeps 4 KiB granularity, so it stays aligned) */
			c->buf += res;
			c->off += (uint64_t)res;
			c->len -= (uint64_t)res;
			enqueue_first(io, c);
			return;
		}
		c->writing = true;
		c->len = c->got;
		c->got = 0;
	} else {
		c->len -= (uint64_t)res;
	}
	if (c->len) {
		enqueue_first(io, c);
		return;
	}
	drop_grains(io, c);
	done(c->tag, 0, c->got, true, arg);
	free(c);
}

void pio_reap(struct pager_io *io, pio_done_fn done, void *arg)
{
	struct io_uring_cqe *cqe;
	uint64_t val;

	if (read(io->efd, &val, sizeof(val)) < 0 && errno != EAGAIN)
		pager_log_errno(PAGER_LOG_WARNING, errno, "reading the io_uring eventfd");
	while (io_uring_peek_cqe(&io->ring, &cqe) == 0) {
		struct chunk *c = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&io->ring, cqe);
		io->inflight--;
		if (!c->punch && !c->writing) {
			io->inflight_bytes -= c->len;
			if (io->inflight_bytes == 0)
				io->busy_ns += pager_now_ns() - io->busy_since_ns;
		}
		if (res == -EINTR || res == -EAGAIN) {
			enqueue(io, c);
			continue;
		}
		if (c->dst_fd >= 0) {
			bounced(io, c, res, done, arg);
			continue;
		}
		if (c->punch) {
			done(c->tag, res < 0 ? res : 0, 0, true, arg);
			free(c);
			continue;
		}
		if (res > 0 && (uint64_t)res < c->len && c->off + (uint64_t)res < c->eof) {
			/* Short read before the end of the file: read the rest.
			 * O_DIRECT keeps 4 KiB granularity, so the remainder stays
			 * aligned. */
			done(c->tag, 0, (uint64_t)res, false, arg);
			c->buf += res;
			c->off += (uint64_t)res;
			c->len -= (uint64_t)res;
			enqueue(io, c);
			continue;
		}
		if (res == 0 && c->off < c->eof) {
			done(c->tag, -EIO, 0, true, arg); /* file shrank under us */
			free(c);
			continue;
		}
		done(c->tag, res < 0 ? res : 0, res > 0 ? (uint64_t)res : 0, true, arg);
		free(c);
	}
	submit_waiting(io);
}

uint64_t pio_busy_ns(const struct pager_io *io)
{
	return io->busy_ns + (io->inflight_bytes ? pager_now_ns() - io->busy_since_ns : 0);
}

unsigned pio_inflight(const struct pager_io *io)
{
	return io->inflight;
}
