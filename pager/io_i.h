/*
 * io_i.h - the pager's reader (io.c): chunked O_DIRECT reads with io_uring.
 */
#ifndef STRATA_IO_I_H
#define STRATA_IO_I_H

#include <stdbool.h>
#include <stdint.h>

struct pager_io;

/* Called once per chunk read (last=true), and for partial progress of a
 * short read (last=false); err is 0 or -errno. */
typedef void (*pio_done_fn)(void *tag, int err, uint64_t bytes, bool last, void *arg);

int pio_create(unsigned depth, uint64_t chunk, struct pager_io **out);
void pio_destroy(struct pager_io *io);
/* The eventfd that becomes readable when reads complete. */
int pio_fd(const struct pager_io *io);
/* Queue a read of [off, off+len) of fd into buf; returns the number of
 * chunks queued (each completes with one last=true callback) or -errno. */
int pio_read(struct pager_io *io, int fd, uint8_t *buf, uint64_t off, uint64_t len,
	     uint64_t eof, void *tag);
/* Queue a punch hole of [off, off+len) in fd; completes with one last=true
 * callback with bytes 0. */
int pio_punch(struct pager_io *io, int fd, uint64_t off, uint64_t len, void *tag);
void pio_reap(struct pager_io *io, pio_done_fn done, void *arg);
/* Wall time during which at least one read was in flight. */
uint64_t pio_busy_ns(const struct pager_io *io);
unsigned pio_inflight(const struct pager_io *io);

#endif
