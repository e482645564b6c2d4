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
};

/* Requests in flight at most, however small. */
#define IO_MAX_INFLIGHT 64

struct pager_io {
	struct io_uring ring;
	int efd;
	unsigned depth;
	unsigned inflight;
	uint64_t inflight_bytes;
	uint64_t chunk;
	struct chunk *head, *tail; /* waiting to be submitted */
	uint64_t busy_since_ns;    /* when inflight went from 0 to 1 */
	uint64_t busy_ns;          /* total time with reads in flight */
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
	free(io);
}

int pio_fd(const struct pager_io *io)
{
	return io->efd;
}

static void submit_waiting(struct pager_io *io)
{
	bool any = false;

	while (io->head && io->inflight < IO_MAX_INFLIGHT &&
	       (io->inflight == 0 ||
		io->inflight_bytes + io->head->len <= io->chunk * io->depth)) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
		struct chunk *c = io->head;

		if (!sqe)
			break;
		io->inflight_bytes += c->punch ? 0 : c->len;
		io->head = c->next;
		if (!io->head)
			io->tail = NULL;
		if (c->punch)
			io_uring_prep_fallocate(sqe, c->fd,
						FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
						(off_t)c->off, (off_t)c->len);
		else
			io_uring_prep_read(sqe, c->fd, c->buf, (unsigned)c->len, c->off);
		/* Straight to the ring's workers: a read into pages the memfd
		 * has not allocated yet allocates and zeroes them first (about
		 * 0.5 s of CPU per GB here), which would otherwise run in
		 * io_uring_submit() on this thread, one read after the other,
		 * while faults wait.  The workers do it in parallel. */
		sqe->flags |= IOSQE_ASYNC;
		io_uring_sqe_set_data(sqe, c);
		if (io->inflight++ == 0)
			io->busy_since_ns = pager_now_ns();
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

int pio_read(struct pager_io *io, int fd, uint8_t *buf, uint64_t off, uint64_t len,
	     uint64_t eof, void *tag)
{
	int n = 0;

	for (uint64_t pos = 0; pos < len; pos += io->chunk) {
		struct chunk *c = malloc(sizeof(*c));

		if (!c)
			return n ? n : -ENOMEM;
		c->punch = false;
		c->fd = fd;
		c->buf = buf + pos;
		c->off = off + pos;
		c->len = len - pos < io->chunk ? len - pos : io->chunk;
		c->eof = eof;
		c->tag = tag;
		enqueue(io, c);
		n++;
	}
	submit_waiting(io);
	return n;
}

int pio_punch(struct pager_io *io, int fd, uint64_t off, uint64_t len, void *tag)
{
	struct chunk *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->punch = true;
	c->fd = fd;
	c->off = off;
	c->len = len;
	c->tag = tag;
	enqueue(io, c);
	submit_waiting(io);
	return 0;
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
		io->inflight_bytes -= c->punch ? 0 : c->len;
		if (--io->inflight == 0)
			io->busy_ns += pager_now_ns() - io->busy_since_ns;
		if (res == -EINTR || res == -EAGAIN) {
			enqueue(io, c);
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
	return io->busy_ns + (io->inflight ? pager_now_ns() - io->busy_since_ns : 0);
}

unsigned pio_inflight(const struct pager_io *io)
{
	return io->inflight;
}
