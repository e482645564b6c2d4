/*
 * util.c - what the daemon, the client side and the tools share: the
 * pager's one log function, sending a protocol message, size parsing.
 *
 * Log messages go to a sink the daemon may replace (default: stderr with a
 * "stratad: " prefix); a level filter drops chatter.  Nothing on the fault
 * path logs above DEBUG: it counts into stats that stratactl reads instead.
 */
#include "pager.h"
#include "pager_i.h"
#include "proto_i.h"

#include <errno.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

/* Is stderr the journal (systemd sets JOURNAL_STREAM to its device:inode)?
 * Then a line's level goes in front as "<N>", which journald reads as its
 * priority, and the "stratad: " prefix is left to the journal's own. */
static bool stderr_is_journal(void)
{
	static int known = -1;

	if (known < 0) {
		const char *js = getenv("JOURNAL_STREAM");
		unsigned long long dev, ino;
		struct stat st;

		known = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &st) == 0 &&
			st.st_dev == (dev_t)dev && st.st_ino == (ino_t)ino;
	}
	return known;
}

static void default_sink(enum pager_log_level level, const char *msg)
{
	static const char *const names[8] = { "", "", "", "error: ", "warning: ", "", "", "debug: " };

	if (stderr_is_journal())
		fprintf(stderr, "<%d>%s\n", level & 7, msg);
	else
		fprintf(stderr, "stratad: %s%s\n", names[level & 7], msg);
}

static pager_log_fn sink = default_sink;
static enum pager_log_level max_level = PAGER_LOG_NOTICE;

void pager_set_log(pager_log_fn fn, enum pager_log_level level)
{
	sink = fn ? fn : default_sink;
	max_level = level;
}

static void vlog(enum pager_log_level level, int err, const char *fmt, va_list ap)
{
	char buf[512];
	int n;

	if (level > max_level)
		return;
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	if (err && n >= 0 && (size_t)n < sizeof(buf))
		snprintf(buf + n, sizeof(buf) - (size_t)n, ": %s", strerror(err < 0 ? -err : err));
	sink(level, buf);
}

void pager_log(enum pager_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, 0, fmt, ap);
	va_end(ap);
}

void pager_log_errno(enum pager_log_level level, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, err, fmt, ap);
	va_end(ap);
}

int pager_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	if (!s || !*s || *s == '-')
		return -EINVAL;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'B')
		end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

/* One message: header, payload and at most one descriptor (see proto_i.h). */
int proto_send(int fd, uint16_t type, const void *payload, uint32_t len, int pass_fd)
{
	uint8_t hdr[PROTO_HDR_SIZE];
	struct iovec iov[2] = { { hdr, sizeof(hdr) }, { (void *)payload, len } };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = len ? 2 : 1 };

	proto_put_u32(hdr, PROTO_MAGIC);
	hdr[4] = PROTO_VERSION;
	hdr[5] = 0;
	hdr[6] = (uint8_t)type;
	hdr[7] = (uint8_t)(type >> 8);
	proto_put_u32(hdr + 8, len);
	proto_put_u32(hdr + 12, 0);
	if (pass_fd >= 0) {
		memset(&cm, 0, sizeof(cm));
		mh.msg_control = cm.buf;
		mh.msg_controllen = sizeof(cm.buf);
		struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
		ch->cmsg_level = SOL_SOCKET;
		ch->cmsg_type = SCM_RIGHTS;
		ch->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(ch), &pass_fd, sizeof(int));
	}
	/* never blocks the daemon's loop; a full socket buffer is a dead peer */
	return sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)(sizeof(hdr) + len) ? 0 : -EIO;
}

/* CLOCK_MONOTONIC in nanoseconds, for the daemon's waits and busy times. */
uint64_t pager_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double pager_median(const double *v, unsigned n)
{
	double s[PAGER_MEDIAN_MAX];

	if (n > PAGER_MEDIAN_MAX)
		n = PAGER_MEDIAN_MAX;
	if (!n)
		return 0;
	memcpy(s, v, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}
