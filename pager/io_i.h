/*
 * io_i.h - the pager's reader (io.c): chunked O_DIRECT reads with io_uring.
 */
#ifndef STRATA_IO_I_H
#define STRATA_IO_I_H

#include <stdbool.h>
#include <stddef.h>
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
/* The bounce arena of pio_read_to: `bytes` (rounded up to 64 KiB), once;
 * 0 or -errno. */
int pio_bounce(struct pager_io *io, uint64_t bytes);
/* Its size; 0 without one (or without io). */
uint64_t pio_bounce_bytes(const struct pager_io *io);
/* Queue a read of [off, off+len) of fd into file dst_fd at dst_off, through
 * the arena (io.c): the chunks as pio_read's, each calling back once its
 * bytes are written (bytes: how many); -EINVAL without an arena. */
int pio_read_to(struct pager_io *io, int fd, uint64_t off, uint64_t len, uint64_t eof,
		int dst_fd, uint64_t dst_off, void *tag);
/* Queue a punch hole of [off, off+len) in fd; completes with one last=true
 * callback with bytes 0. */
int pio_punch(struct pager_io *io, int fd, uint64_t off, uint64_t len, void *tag);
void pio_reap(struct pager_io *io, pio_done_fn done, void *arg);
/* Wall time during which at least one read was in flight. */
uint64_t pio_busy_ns(const struct pager_io *io);
unsigned pio_inflight(const struct pager_io *io);

/* ---- probe.c: the request size and depth a device reads fastest with ---- */

#define PIO_DEFAULT_CHUNK (1u << 20)
#define PIO_DEFAULT_DEPTH 16u
#define PIO_MAX_CHUNK (64u << 20)
#define PIO_MAX_DEPTH 256u

struct pio_params {
	uint64_t chunk;
	unsigned depth;
	double gbps;     /* read with them when measured; 0 if never */
	int64_t when;    /* unix time of that measurement */
	enum { PIO_DEFAULT, PIO_PROBED, PIO_CACHED, PIO_SET } source;
};

/* A device and file system, the key of the cache. */
struct pio_device {
	unsigned major, minor;
	uint64_t fstype; /* statfs f_type */
};

/* Measure fd (open O_DIRECT, `size` bytes) in every configuration of the
 * grid; the fastest in out.  -EFBIG when the file is too small to measure
 * the device rather than its caches, or -errno. */
int pio_probe(int fd, uint64_t size, struct pio_params *out);
int pio_device_of(int fd, struct pio_device *dev);
/* The cached entry for dev: 0, -ENOENT, or -errno reading the file. */
int pio_cache_lookup(const char *path, const struct pio_device *dev, struct pio_params *out);
/* Write (or replace) dev's entry; the file is replaced whole. */
int pio_cache_store(const char *path, const struct pio_device *dev, const struct pio_params *p);
void pio_cache_default(char *buf, size_t len);

#endif
