/*
 * stratactl.c - look at a running stratad.
 *
 *   stratactl --socket PATH status [--json]
 *   stratactl --socket PATH watch [--interval SECONDS]
 *
 * status prints the daemon's view once: per model the budget, bytes
 * resident, a one-line map of every layer's state, per-layer loads and
 * faults, bytes read and read throughput, the time clients spent waiting on
 * faults, and the clients.  --json prints the same as one JSON object for
 * scripts.  watch redraws the text view until interrupted.
 *
 * The socket defaults to $STRATA_PAGER.  Exit status: 0 ok, 1 usage, 2 the
 * daemon cannot be reached.
 */
#include "pager.h"

#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_text[] =
	"usage: stratactl [--socket PATH] status [--json]\n"
	"       stratactl [--socket PATH] watch [--interval SECONDS]\n"
	"(the socket defaults to $STRATA_PAGER)\n";

static int show(const char *sock, bool json, bool clear)
{
	char err[256], *text;
	size_t len;
	int rc = pager_status_fetch(sock, json, &text, &len, err, sizeof(err));

	if (rc) {
		fprintf(stderr, "stratactl: %s\n", err);
		return 2;
	}
	if (clear)
		fputs("\033[H\033[2J", stdout);
	fwrite(text, 1, len, stdout);
	fflush(stdout);
	free(text);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "interval", required_argument, NULL, 'i' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *sock = getenv("STRATA_PAGER");
	bool json = false;
	double interval = 1.0;
	const char *cmd;
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:s:ji:h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			sock = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'i':
			interval = strtod(optarg, NULL);
			if (!(interval >= 0.05 && interval <= 3600)) {
				fprintf(stderr, "stratactl: invalid --interval '%s'\n", optarg);
				return 1;
			}
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		default:
			fprintf(stderr, "stratactl: bad option '%s'\n%s", argv[optind - 1], usage_text);
			return 1;
		}
	}
	if (optind >= argc || !sock) {
		fprintf(stderr, "stratactl: %s\n%s", sock ? "no command" : "no --socket (or STRATA_PAGER)",
			usage_text);
		return 1;
	}
	cmd = argv[optind++];
	/* options may also follow the command */
	while ((c = getopt_long(argc, argv, "+:s:ji:h", lo, NULL)) != -1) {
		if (c == 'j')
			json = true;
		else if (c == 'i')
			interval = strtod(optarg, NULL);
		else if (c == 's')
			sock = optarg;
		else {
			fprintf(stderr, "stratactl: bad option '%s'\n%s", argv[optind - 1], usage_text);
			return 1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "stratactl: unexpected argument '%s'\n", argv[optind]);
		return 1;
	}
	if (!strcmp(cmd, "status"))
		return show(sock, json, false);
	if (!strcmp(cmd, "watch")) {
		if (!(interval >= 0.05 && interval <= 3600)) {
			fprintf(stderr, "stratactl: invalid --interval\n");
			return 1;
		}
		for (;;) {
			int rc = show(sock, json, !json);

			if (rc)
				return rc;
			/* a refresh period, not a synchronization */
			poll(NULL, 0, (int)(interval * 1000));
		}
	}
	fprintf(stderr, "stratactl: unknown command '%s'\n%s", cmd, usage_text);
	return 1;
}
