/*
 * stratad.c - the pager daemon's command line.
 *
 *   stratad [--config FILE] --socket PATH [--budget SIZE|auto] [--mode MODE]
 *           [--no-pressure] [--lookahead] [--populate] [--resident N] [--window N]
 *           [--allow-group GROUP] [--probe-io] [--io-cache FILE] [--io-chunk SIZE] [--io-depth N]
 *           [--verbose] MODEL.gguf...
 *
 * Everything it does lives in the pager library (pager/server.c); this file
 * parses options (from the command line and a config file, which a service
 * manager starts it with: daemon/stratad.service), reports what went wrong
 * in one line, tells systemd when it is ready, and runs the loop.
 * SIGTERM and SIGINT stop it cleanly (the socket is removed); SIGUSR1 sheds
 * resident layers as memory pressure does, SIGUSR2 restores them.  Exit 2
 * when it cannot start (a model it cannot serve, a budget below what
 * streaming needs), with the reason in one line.
 */
#include "pager.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#define DAEMON_NICE_RAISE 10 /* steps above the nice value it was started with */

static const char usage_text[] =
	"usage: stratad [--config FILE] --socket PATH [--fuse DIR] [--budget SIZE|auto]\n"
	"               [--mode MODE] [--no-pressure] [--lookahead] [--populate]\n"
	"               [--resident N] [--window N] [--allow-group GROUP] [--probe-io]\n"
	"               [--io-cache FILE] [--io-chunk SIZE] [--io-depth N] [--verbose]\n"
	"               MODEL.gguf...\n"
	"\n"
	"  --config FILE   read settings from FILE first: one per line, an option's\n"
	"                  name and value (\"budget 6G\", \"no-pressure\"), \"model PATH\"\n"
	"                  for each model, # comments; the command line overrides it\n"
	"  --socket PATH   unix socket clients connect to\n"
	"  --fuse DIR      also show every model as a read-only file under DIR, for\n"
	"                  any mmap-based runtime\n"
	"  --budget SIZE   memory for the models and their clients' own needs, in bytes\n"
	"                  or with a K/M/G suffix; auto (the default): the memory\n"
	"                  cgroup's limit, else what is available, less a reserve,\n"
	"                  followed as it changes\n"
	"  --mode MODE     how memory beyond what streaming needs is shared: speed\n"
	"                  (default: all to resident layers but what engines declare),\n"
	"                  balanced (a quarter kept for engines' context), context (half)\n"
	"  --no-pressure   do not shed resident layers under memory pressure\n"
	"  --lookahead     a mixture of experts: engines guess the next layer's experts\n"
	"                  (a router's bytes a layer) and those are read ahead; pays\n"
	"                  where faults wait long for experts and the guesses are used\n"
	"                  (off by default; --no-lookahead: off)\n"
	"  --populate      a mixture of experts: make the expert cache's pages before\n"
	"                  serving, so that expert reads never wait for new memory\n"
	"                  (for virtual machines that hand free memory to their host)\n"
	"  --resident N    keep N layers resident (default: as many as the budget allows)\n"
	"  --window N      streamed layers read ahead (default 2)\n"
	"  --allow-group GROUP  let processes of GROUP connect too (the socket becomes\n"
	"                  rw for the group); default: root and the daemon's user only\n"
	"  --probe-io      measure again which request size and depth read the\n"
	"                  models' storage fastest (done once per device otherwise)\n"
	"  --io-cache FILE where those measurements are kept\n"
	"                  (default /var/cache/strata/io-probe, ~/.cache/... for users)\n"
	"  --io-chunk SIZE read requests of SIZE (default: as measured)\n"
	"  --io-depth N    N read requests in flight (default: as measured)\n"
	"  --verbose       log every eviction and load\n"
	"\n"
	"Signals: TERM/INT stop, USR1 sheds a quarter of the resident layers,\n"
	"USR2 restores them.\n";

static const struct option lo[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "fuse", required_argument, NULL, 'f' },
	{ "budget", required_argument, NULL, 'b' },
	{ "mode", required_argument, NULL, 'm' },
	{ "no-pressure", no_argument, NULL, 'N' },
	{ "lookahead", no_argument, NULL, 'A' },
	{ "no-lookahead", no_argument, NULL, 'L' },
	{ "populate", no_argument, NULL, 'O' },
	{ "resident", required_argument, NULL, 'r' },
	{ "window", required_argument, NULL, 'w' },
	{ "probe-io", no_argument, NULL, 'P' },
	{ "io-cache", required_argument, NULL, 'C' },
	{ "io-chunk", required_argument, NULL, 'K' },
	{ "io-depth", required_argument, NULL, 'D' },
	{ "verbose", no_argument, NULL, 'v' },
	{ "allow-group", required_argument, NULL, 'G' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static void add_arg(char ***v, int *n, const char *s)
{
	char **nv = realloc(*v, (size_t)(*n + 2) * sizeof(**v));

	if (!nv || !(nv[*n] = strdup(s))) {
		fputs("stratad: out of memory\n", stderr);
		exit(2);
	}
	nv[++*n] = NULL;
	*v = nv;
}

/*
 * The config file as the command line it stands for: "budget 6G" is
 * --budget 6G, "no-pressure" is --no-pressure, "model PATH" a model (the
 * value is the rest of the line, so paths may hold spaces).  Appended to
 * *v; the caller adds the real command line after it, so that wins.
 * Nonzero, with the line named, on anything else.
 */
static int read_config(const char *path, char ***v, int *n)
{
	FILE *f = fopen(path, "re");
	char *line = NULL;
	size_t cap = 0;
	unsigned no = 0;
	int rc = 0;

	if (!f) {
		fprintf(stderr, "stratad: --config %s: %s\n", path, strerror(errno));
		return 1;
	}
	while (!rc && getline(&line, &cap, f) >= 0) {
		char *k = line, *val, *e;
		const struct option *o;

		no++;
		while (isspace((unsigned char)*k))
			k++;
		if (!*k || *k == '#')
			continue;
		for (val = k; *val && !isspace((unsigned char)*val); val++)
			;
		if (*val)
			*val++ = 0;
		while (isspace((unsigned char)*val))
			val++;
		for (e = val + strlen(val); e > val && isspace((unsigned char)e[-1]); e--)
			;
		*e = 0;
		for (o = lo; o->name; o++)
			if (!strcmp(o->name, k) && o->val != 'h')
				break;
		if (!strcmp(k, "model") && *val) {
			add_arg(v, n, val);
		} else if (!o->name || (o->has_arg == required_argument) != (*val != 0)) {
			fprintf(stderr, "stratad: %s:%u: %s '%s'\n", path, no,
				!o->name ? "unknown setting" : *val ? "takes no value:" : "needs a value:",
				k);
			rc = 1;
		} else {
			char opt[64];

			snprintf(opt, sizeof(opt), "--%s", k);
			add_arg(v, n, opt);
			if (*val)
				add_arg(v, n, val);
		}
	}
	if (!rc && ferror(f)) {
		fprintf(stderr, "stratad: --config %s: %s\n", path, strerror(errno));
		rc = 1;
	}
	free(line);
	fclose(f);
	return rc;
}

/* The expanded argv: the config points into it until exit, when it is freed
 * (so that the sanitizer build's leak check sees no leak on any way out). */
static char **expanded_argv;
static int expanded_argc;

static void free_expanded(void)
{
	for (int i = 0; i < expanded_argc; i++)
		free(expanded_argv[i]);
	free(expanded_argv);
}

/* argv with --config FILE replaced by what FILE says, in front of the rest */
static int expand_config(int *argc, char ***argv)
{
	atexit(free_expanded);
	add_arg(&expanded_argv, &expanded_argc, (*argv)[0]);
	for (int i = 1; i < *argc; i++) {
		const char *a = (*argv)[i];

		if (!strcmp(a, "--"))
			break;
		if (!strcmp(a, "--config") || !strncmp(a, "--config=", 9)) {
			const char *file = a[8] == '=' ? a + 9 : i + 1 < *argc ? (*argv)[i + 1] : NULL;

			if (!file) {
				fprintf(stderr, "stratad: option '--config' needs a value\n");
				return 1;
			}
			if (read_config(file, &expanded_argv, &expanded_argc))
				return 1;
		}
	}
	for (int i = 1; i < *argc; i++) {
		const char *a = (*argv)[i];

		if (!strcmp(a, "--config")) {
			i++;
			continue;
		}
		if (strncmp(a, "--config=", 9))
			add_arg(&expanded_argv, &expanded_argc, a);
	}
	*argc = expanded_argc;
	*argv = expanded_argv;
	return 0;
}

int main(int argc, char **argv)
{
	struct pager_config cfg = { .resident = -1, .budget_auto = true };
	struct pager *p;
	char err[512];
	int c, rc;

	if (argc == 3 && !strcmp(argv[1], "--fuse-guard"))
		return pager_fuse_guard((unsigned)strtoul(argv[2], NULL, 10));
	if (expand_config(&argc, &argv))
		return 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":s:f:b:m:r:w:vh", lo, NULL)) != -1) {
		char *end;
		long v;

		switch (c) {
		case 's':
			cfg.socket_path = optarg;
			break;
		case 'f':
			cfg.fuse_dir = optarg;
			break;
		case 'b':
			cfg.budget_auto = !strcmp(optarg, "auto");
			if (!cfg.budget_auto && (pager_parse_size(optarg, &cfg.budget) || !cfg.budget)) {
				fprintf(stderr,
					"stratad: invalid --budget '%s' (auto, bytes, or 512M, 8G ...)\n",
					optarg);
				return 1;
			}
			break;
		case 'm':
			if (!pager_mode_valid(optarg)) {
				fprintf(stderr, "stratad: invalid --mode '%s' (speed, balanced or context)\n",
					optarg);
				return 1;
			}
			cfg.mode = optarg;
			break;
		case 'r':
		case 'w':
			v = strtol(optarg, &end, 10);
			if (*end || end == optarg || v < 0 || v > 100000) {
				fprintf(stderr, "stratad: invalid value '%s' for --%s\n", optarg,
					c == 'r' ? "resident" : "window");
				return 1;
			}
			if (c == 'r')
				cfg.resident = (int)v;
			else
				cfg.window = (unsigned)v;
			break;
		case 'P':
			cfg.probe_io = true;
			break;
		case 'N':
			cfg.no_pressure = true;
			break;
		case 'A':
			cfg.lookahead = true;
			break;
		case 'L':
			cfg.lookahead = false;
			break;
		case 'O':
			cfg.populate = true;
			break;
		case 'C':
			cfg.io_cache = optarg;
			break;
		case 'K':
			if (pager_parse_size(optarg, &cfg.io_chunk) || cfg.io_chunk < 4096 ||
			    cfg.io_chunk % 4096 || cfg.io_chunk > (64u << 20)) {
				fprintf(stderr, "stratad: invalid --io-chunk '%s' (4K to 64M, a multiple of 4K)\n",
					optarg);
				return 1;
			}
			break;
		case 'D':
			v = strtol(optarg, &end, 10);
			if (*end || end == optarg || v < 1 || v > 256) {
				fprintf(stderr, "stratad: invalid --io-depth '%s' (1 to 256)\n", optarg);
				return 1;
			}
			cfg.io_depth = (unsigned)v;
			break;
		case 'v':
			pager_set_log(NULL, PAGER_LOG_DEBUG);
			break;
		case 'G':
			cfg.allow_group = optarg;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		case ':':
			fprintf(stderr, "stratad: option '%s' needs a value\n%s", argv[optind - 1],
				usage_text);
			return 1;
		default:
			fprintf(stderr, "stratad: unknown option '%s'\n%s", argv[optind - 1],
				usage_text);
			return 1;
		}
	}
	if (!cfg.socket_path || optind >= argc) {
		fprintf(stderr, "stratad: --socket and at least one model are required\n%s",
			usage_text);
		return 1;
	}
	/* The daemon's work is short and on the engines' critical path: a
	 * fault answered, a read submitted, a shed layer's memory freed.  With
	 * the engines computing on every core, at the default priority the
	 * kernel's share of a freeing punch hole came late (936 MiB of shed
	 * layers freed 226-389 ms after the event, 46-60 ms at nice -10).  Its
	 * threads, and the ring's workers, inherit this.  The raise is relative:
	 * a daemon started at nice 19 (a test beside a benchmark) stays below
	 * work started at nice 0. */
	errno = 0;
	int started_at = getpriority(PRIO_PROCESS, 0);
	if (errno)
		started_at = 0;
	if (setpriority(PRIO_PROCESS, 0, started_at - DAEMON_NICE_RAISE))
		fprintf(stderr, "stratad: running at the default priority (%s): slower to answer "
			"when the engines keep every core busy\n", strerror(errno));
	cfg.models = (const char *const *)argv + optind;
	cfg.n_models = (unsigned)(argc - optind);
	rc = pager_create(&cfg, &p, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "stratad: %s\n", err);
		return 2;
	}
#ifdef HAVE_SYSTEMD
	sd_notify(0, "READY=1"); /* serving: the socket is listening (Type=notify) */
#endif
	rc = pager_run(p);
#ifdef HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
	pager_destroy(p);
	return rc ? 2 : 0;
}
