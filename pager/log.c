/*
 * log.c - the pager's one log function.
 *
 * Messages go to a sink the daemon may replace (default: stderr with a
 * "stratad: " prefix); a level filter drops chatter.  Nothing on the fault
 * path logs above DEBUG: it counts into stats that stratactl reads instead.
 */
#include "pager.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void default_sink(enum pager_log_level level, const char *msg)
{
	static const char *const names[8] = { "", "", "", "error: ", "warning: ", "", "", "debug: " };

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
