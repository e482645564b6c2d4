#!/usr/bin/env python3
"""A measurement, not a test: a model decoding with every weight in memory,
from a plain mmap of its file against the same file served by stratad (the
memfd's 4 KiB entries, every expert read in by a first run on the same
daemon), interleaved, each round under the benchmark lock
(docs/benchmarks.md, "256 tokens, and what the engine's compute under the
pager is made of").

  STRATA_BUILD=build tests/bench/pager-vs-mmap.py ROUNDS MODEL
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
from benchlib import STRATA, bench_lock, start_daemon, status  # noqa: E402

if len(sys.argv) != 3:
    sys.exit("usage: tests/bench/pager-vs-mmap.py ROUNDS MODEL")
rounds, model = int(sys.argv[1]), sys.argv[2]


def decode_tps(extra):
    r = subprocess.run([STRATA, "bench", "-m", model, *extra, "-p", "0", "-n", "64", "-c", "65",
                        "-b", "32", "-t", "2", "--no-hw", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["decode_tps"]


sock = f"/tmp/strata-pvm-{os.getpid()}.sock"
for rnd in range(rounds):
    with bench_lock():
        decode_tps([])  # the page cache warm
        plain = decode_tps([])
        d = start_daemon(sock, [model])
        decode_tps(["--pager", sock])  # every expert read in
        paged = decode_tps(["--pager", sock])
        m = status(sock)["models"][0]
        d.terminate()
        d.wait(30)
    print(f"round {rnd + 1}: mmap {plain:.2f} tok/s, pager {paged:.2f} tok/s, "
          f"ratio {paged / plain:.3f}; the daemon read {m['bytes_read'] >> 20} MiB, "
          f"faults waited {m['fault_wait_ms']:.0f} ms", flush=True)
