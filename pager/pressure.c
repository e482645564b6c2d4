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
 * slow every engine down.  So a trigger sheds only when memory is short
 * where the daemon's memory is charged (its cgroup's limit less its usage,
 * or MemFree, below the budget's reserve), and each shed is judged:
 * SETTLE_S seconds later the stall rate (the PSI "some" total's growth per
 * second) is compared with the rate before it.  If it did not fall below
 * HELPED of it and memory is no longer short here, the layers come back and
 * triggers are ignored for PAUSE_S seconds ("futile").  If it did,
 * the demotion stays until the stall rate has been below CALM_US per second
 * for CALM_S seconds in a row and the memory is free for them; then the
 * layers return, half of the demotion at a time (hysteresis: a system that
 * is just recovering is not handed all of it back at once).
 *
 * Pressure is not the only sign: a program that grows fast reaches the OOM
 * killer before the page cache it squeezes has stalled anyone for long.  So
 * memory running out under the limit (less than half the reserve free,
 * reclaimable page cache counted free) sheds too, stalls or not.
 *
 * pager_on_tick runs four times a second (SIGALRM through the daemon's
 * signalfd) and does the shortage check, the judging and the restoring;
 * once a second also the automatic budget's following and the speed
 * predictor's bandwidth sample.
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

/* Demote a quarter of each model's resident layers; the ones in memory are
 * timed until they have left it (pager_pressure_released). */
static void shed(struct pager *p, const char *what)
{
	struct pressure *ps = &p->pressure;

	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		m->shed += (m->n_resident + 3) / 4;
		for (unsigned u = 1; u < m->lay->n_units; u++)
			m->us[u].shed_pending = m->us[u].resident; /* resident before */
	}
	pager_plan(p);
	ps->release_left = 0;
	ps->release_bytes = 0;
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		for (unsigned u = 1; u < m->lay->n_units; u++) {
			struct ustat *us = &m->us[u];

			/* demoted now, and in memory */
			us->shed_pending = us->shed_pending && !us->resident && us->state != U_ABSENT;
			ps->release_left += us->shed_pending;
		}
	}
	ps->event_ns = ps->release_left ? ps->shed_ns : 0;
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
		for (unsigned u = 0; u < m->lay->n_units; u++)
			m->us[u].shed_pending = false;
	}
	p->pressure.event_ns = 0; /* a shed still being freed is not timed */
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

void pager_pressure_released(struct pager *p, uint64_t bytes)
{
	struct pressure *ps = &p->pressure;
	double ms;

	ps->release_bytes += bytes;
	if (!ps->event_ns || !ps->release_left || --ps->release_left)
		return;
	ms = (pager_now_ns() - ps->event_ns) / 1e6;
	ps->release_ms[ps->n_release++ % PRESSURE_LATENCIES] = ms;
	ps->event_ns = 0;
	pager_log(PAGER_LOG_NOTICE, "memory pressure: %.1f MiB of shed layers freed %.1f ms after "
		  "the event", ps->release_bytes / 1048576.0, ms);
}

double pager_pressure_release_ms(const struct pager *p)
{
	const struct pressure *ps = &p->pressure;

	return pager_median(ps->release_ms, ps->n_release < PRESSURE_LATENCIES
						    ? ps->n_release : PRESSURE_LATENCIES);
}

/* Memory free where the daemon's memory is charged (its cgroup, or the
 * system) below which it is short: the budget's reserve, or 256 MiB. */
static uint64_t short_below(const struct pager *p)
{
	return p->budget.reserve ? p->budget.reserve : 256ull << 20;
}

/* Is memory short where the daemon's memory is: little left under its
 * cgroup's limit (or on the system), page cache counted as used, since it
 * is the page cache that thrashes first?  Unknown counts as short. */
static bool short_here(const struct pager *p, uint64_t *free)
{
	*free = 0;
	return pager_budget_headroom(p, false, free) || *free < short_below(p);
}

void pager_on_pressure(struct pager *p, const char *what, bool asked)
{
	struct pressure *ps = &p->pressure;
	uint64_t now = pager_now_ns(), free;

	p->pressure_events++;
	if (!asked && ps->paused_until_ns > now) {
		ps->ignored++;
		pager_log(PAGER_LOG_INFO, "%s: ignored (shedding did not relieve it %.0f s ago)",
			  what, (now - ps->judged_ns) / 1e9);
		return;
	}
	if (!asked && !short_here(p, &free)) {
		/* Stalls, but with memory free where the daemon's is: they are
		 * another cgroup's, at its own limit, and the daemon's memory
		 * is not what it lacks. */
		ps->ignored++;
		pager_log(PAGER_LOG_NOTICE, "%s: ignored: %.0f MiB free %s, not short of memory",
			  what, free / 1048576.0,
			  p->budget.source == BUDGET_CGROUP_V1 || p->budget.source == BUDGET_CGROUP_V2
				  ? "in the daemon's cgroup" : "on the system");
		return;
	}
	ps->shed_ns = now;
	ps->sheds++;
	/* The rate before: over the last tick, when there was one. */
	ps->rate_before = ps->rate;
	shed(p, what);
}

/* Is there memory for half of the demoted layers, and the reserve beside
 * them?  Calm alone is not enough: a program that took the memory the shed
 * freed stalls no more once it has it, and handing the memory back to the
 * layers would only start the pressure again. */
static bool room_to_restore(const struct pager *p)
{
	uint64_t free, want = p->budget.reserve;

	if (pager_budget_headroom(p, true, &free))
		return true; /* nothing to go by: calm decides */
	for (unsigned i = 0; i < p->n_models; i++) {
		const struct model *m = &p->models[i];
		unsigned back = m->shed - m->shed / 2;

		want += (uint64_t)back * p->plan_models[i].layer_bytes;
	}
	return free >= want;
}

void pager_on_restore(struct pager *p)
{
	p->pressure.paused_until_ns = 0;
	p->pressure.shed_ns = 0;
	restore(p, true, "residency restored");
}

/* The stall rate over the last second or more, when that is due. */
static void sample_rate(struct pressure *ps, uint64_t now)
{
	uint64_t total = 0;

	if (ps->fd < 0 || (ps->sample_ns && now - ps->sample_ns < 1000000000ull) ||
	    stall_total(ps, &total))
		return;
	if (ps->sample_ns)
		ps->rate = (double)(total - ps->sample_total) * 1e9 / (double)(now - ps->sample_ns);
	ps->sample_ns = now;
	ps->sample_total = total;
	if (ps->rate >= CALM_US)
		ps->calm_since_ns = 0;
	else if (!ps->calm_since_ns)
		ps->calm_since_ns = now;
}

/* Judge the last shed by the rate since it settled: it helped if the
 * stalls fell, or if memory is still short where the daemon's is (what it
 * freed was taken: demand grew, and the next trigger sheds more). */
static void judge(struct pager *p, uint64_t now)
{
	struct pressure *ps = &p->pressure;
	uint64_t free;
	bool helped = ps->rate < ps->rate_before * HELPED || ps->rate < CALM_US ||
		      short_here(p, &free);

	ps->shed_ns = 0;
	ps->judged_ns = now;
	if (helped) {
		ps->helped++;
		pager_log(PAGER_LOG_NOTICE,
			  "memory pressure fell after shedding (stalls %.0f -> %.0f ms/s)",
			  ps->rate_before / 1e3, ps->rate / 1e3);
		return;
	}
	ps->futile++;
	ps->paused_until_ns = now + PAUSE_S * 1000000000ull;
	pager_log(PAGER_LOG_NOTICE,
		  "memory pressure did not fall after shedding (stalls %.0f -> %.0f ms/s): it is "
		  "not the daemon's memory; layers back, pressure ignored for %d s",
		  ps->rate_before / 1e3, ps->rate / 1e3, PAUSE_S);
	restore(p, true, "shedding did not help");
}

void pager_on_tick(struct pager *p)
{
	struct pressure *ps = &p->pressure;
	uint64_t now = pager_now_ns(), free;
	bool any_shed = false;

	/* the budget and the bandwidth, once a second */
	if (ps->ticks++ % (1000 / PAGER_TICK_MS) == 0) {
		pager_budget_follow(p);
		pager_predict_tick(p);
	}
	pager_uffd_drop_stalled(p);
	for (unsigned i = 0; i < p->n_models; i++)
		pager_demand_retry(&p->models[i]); /* the ones a slot kept waiting */
	if (p->cfg.no_pressure)
		return;
	sample_rate(ps, now);
	for (unsigned i = 0; i < p->n_models; i++)
		any_shed |= p->models[i].shed != 0;
	if (ps->shed_ns && now - ps->shed_ns >= SETTLE_S * 1000000000ull) {
		judge(p, now);
		return;
	}
	/* Memory running out under the limit, stalls or not: a program
	 * growing fast reaches the OOM killer before the page cache it
	 * squeezes has stalled anyone for long.  Again as soon as the last
	 * shed's memory is free, if that was not enough. */
	if (!ps->event_ns && !pager_budget_headroom(p, true, &free) && free < short_below(p) / 2) {
		char what[96];

		snprintf(what, sizeof(what), "memory short (%.0f MiB free under the limit)",
			 free / 1048576.0);
		pager_on_pressure(p, what, true);
		return;
	}
	if (any_shed && !ps->shed_ns && ps->calm_since_ns &&
	    now - ps->calm_since_ns >= CALM_S * 1000000000ull && room_to_restore(p)) {
		ps->calm_since_ns = now;
		restore(p, false, "memory pressure gone");
	}
}

void pager_pressure_close(struct pager *p)
{
	if (p->pressure.fd >= 0)
		close(p->pressure.fd);
	p->pressure.fd = -1;
}
