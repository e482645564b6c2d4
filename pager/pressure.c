/*
 * pressure.c - give memory back when the system is short of it, and only
 * when that helps.
 *
 * A PSI trigger (the memory.pressure of the daemon's cgroup on cgroup v2,
 * else /proc/pressure/memory) fires when tasks stalled on memory for
 * PSI_TRIGGER's share of a window.  Then, at once, a quarter of every
 * model's resident layers are demoted to streaming (pager_on_pressure); their
 * pages go as soon as no engine is inside them.
 *
 * Shedding helps only with pressure the daemon's memory causes.  Pressure
 * a memory-limited reader puts on its own cgroup, or that streaming itself
 * causes, stays whatever the daemon gives back; shedding more would only
 * slow every engine down.  So each shed is judged: SETTLE_S seconds later
 * the stall rate (the PSI "some" total's growth per second) is compared with
 * the rate before it.  If it did not fall below HELPED of it, the layers come
 * back and triggers are ignored for PAUSE_S seconds ("futile").  If it did,
 * the demotion stays until the stall rate has been below CALM_US per second
 * for CALM_S seconds in a row; then the layers return, half of the
 * demotion at a time (hysteresis: a system that is just recovering is not
 * handed all of it back at once).
 *
 * pager_on_tick runs once a second (SIGALRM through the daemon's signalfd)
 * and does the judging, the restoring, the automatic budget's following
 * and the speed predictor's bandwidth sample.
 */
#include "server_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SETTLE_S 3       /* seconds after a shed before it is judged */
#define HELPED 0.7       /* the stall rate must fall below this share */
#define PAUSE_S 30       /* triggers ignored after a futile shed */
#define CALM_US 5000     /* stalls per second (us) that count as calm: 0.5% */
#define CALM_S 10        /* calm seconds before layers come back */

/* The PSI file to watch: the cgroup's (v2) or the system's. */
static void psi_path(const struct pager *p, char *path, size_t len)
{
	if (p->budget.source == BUDGET_CGROUP_V2) {
		snprintf(path, len, "/sys/fs/cgroup%s/memory.pressure", p->budget.where);
		if (!access(path, R_OK | W_OK))
			return;
	}
	snprintf(path, len, "/proc/pressure/memory");
}

int pager_pressure_open(struct pager *p)
{
	struct pressure *ps = &p->pressure;
	int fd;

	psi_path(p, ps->path, sizeof(ps->path));
	fd = open(ps->path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, PSI_TRIGGER, strlen(PSI_TRIGGER) + 1) < 0) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	ps->fd = fd;
	return 0;
}

/* The "some" stall total (us) of the watched PSI file; 0 or -errno. */
static int stall_total(const struct pressure *ps, uint64_t *out)
{
	char buf[256], *t;
	int fd = open(ps->path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return n < 0 ? -errno : -EIO;
	buf[n] = 0;
	t = strstr(buf, "total=");
	if (!t || strncmp(buf, "some", 4))
		return -EINVAL;
	*out = strtoull(t + 6, NULL, 10);
	return 0;
}

static void shed(struct pager *p, const char *what)
{
	for (unsigned i = 0; i < p->n_models; i++)
		p->models[i].shed += (p->models[i].n_resident + 3) / 4;
	pager_plan(p);
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		pager_log(PAGER_LOG_NOTICE, "%s: %s: %u layers resident now (%u shed)", m->name,
			  what, m->n_resident, m->shed);
		pager_policy_advance(m);
	}
}

/* Give back half of each model's demotion, or all of it. */
static void restore(struct pager *p, bool all, const char *why)
{
	bool any = false;

	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		any |= m->shed != 0;
		m->shed = all ? 0 : m->shed / 2;
	}
	if (!any)
		return;
	pager_plan(p);
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		pager_log(PAGER_LOG_NOTICE, "%s: %s: %u layers resident (%u still shed)", m->name,
			  why, m->n_resident, m->shed);
		pager_policy_advance(m);
	}
}

void pager_on_pressure(struct pager *p, const char *what)
{
	struct pressure *ps = &p->pressure;
	uint64_t now = pager_now_ns();

	p->pressure_events++;
	if (ps->paused_until_ns > now) {
		ps->ignored++;
		pager_log(PAGER_LOG_INFO, "%s: ignored (shedding did not relieve it %.0f s ago)",
			  what, (now - ps->judged_ns) / 1e9);
		return;
	}
	ps->shed_ns = now;
	ps->sheds++;
	/* The rate before: over the last tick, when there was one. */
	ps->rate_before = ps->rate;
	shed(p, what);
}

void pager_on_restore(struct pager *p)
{
	p->pressure.paused_until_ns = 0;
	p->pressure.shed_ns = 0;
	restore(p, true, "residency restored");
}

void pager_on_tick(struct pager *p)
{
	struct pressure *ps = &p->pressure;
	uint64_t now = pager_now_ns(), total;
	bool any_shed = false;

	pager_budget_follow(p);
	pager_predict_tick(p);
	if (ps->fd < 0 || stall_total(ps, &total))
		return;
	if (ps->sample_ns && now > ps->sample_ns)
		ps->rate = (double)(total - ps->sample_total) * 1e9 / (double)(now - ps->sample_ns);
	ps->sample_ns = now;
	ps->sample_total = total;
	ps->calm_s = ps->rate < CALM_US ? ps->calm_s + 1 : 0;
	for (unsigned i = 0; i < p->n_models; i++)
		any_shed |= p->models[i].shed != 0;

	if (ps->shed_ns && now - ps->shed_ns >= SETTLE_S * 1000000000ull) {
		/* Judge the last shed by the rate since it settled. */
		bool helped = ps->rate < ps->rate_before * HELPED || ps->rate < CALM_US;

		ps->shed_ns = 0;
		ps->judged_ns = now;
		if (helped) {
			ps->helped++;
			pager_log(PAGER_LOG_NOTICE,
				  "memory pressure fell after shedding (stalls %.0f -> %.0f ms/s)",
				  ps->rate_before / 1e3, ps->rate / 1e3);
		} else {
			ps->futile++;
			ps->paused_until_ns = now + PAUSE_S * 1000000000ull;
			pager_log(PAGER_LOG_NOTICE,
				  "memory pressure did not fall after shedding (stalls %.0f -> %.0f "
				  "ms/s): it is not the daemon's memory; layers back, pressure ignored "
				  "for %d s", ps->rate_before / 1e3, ps->rate / 1e3, PAUSE_S);
			restore(p, true, "shedding did not help");
		}
		return;
	}
	if (any_shed && !ps->shed_ns && ps->calm_s >= CALM_S) {
		ps->calm_s = 0;
		restore(p, false, "memory pressure gone");
	}
}

void pager_pressure_close(struct pager *p)
{
	if (p->pressure.fd >= 0)
		close(p->pressure.fd);
	p->pressure.fd = -1;
}
