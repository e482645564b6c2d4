#!/usr/bin/env python3
"""What both cores' kernels read from memory at once, against the probe.

  tools/bench-ceiling.py --model M [--type Q4_K] [--type Q6_K ...]
                         [--cols 4096] [--isa avx512] [--rounds 3]

Decode reads its weights through one kernel a core.  Per round and type,
under the benchmark lock, one after the other:

  probe     `strata bench -m M -p 0 -n 0 -t 2 --json`: the memory read rate
            that sets the decode bound (any model will do: it is only
            loaded), before and after the kernels;
  kernels   two `strata-kbench --tokens 1` processes at once, pinned to
            cores 0 and 1, each over its own rows from memory (R = 262144 *
            4096 / C rows, 600 MB-1.1 GB, on 2 MiB pages); each one's median
            pass in GB/s of weights, and their sum;
  probe1    the same probe on one thread.

The sum over the mean of the two probes is the ceiling a decode of that
type could reach: no passes, no other steps, one long matrix a core.
Where the two probes differ by 5% or more, the memory changed speed during
the round (this machine's does every few seconds to minutes) and the ratio
is printed as "-".  Prints a markdown table, a row a round and type.
"""
import argparse
import json
import os
import re
import subprocess
import sys

from benchlib import BUILD, STRATA, bench_lock

KBENCH = os.path.join(BUILD, "tools", "strata-kbench")
TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--model", required=True)
ap.add_argument("--type", action="append", choices=TYPES)
ap.add_argument("--cols", type=int, default=4096)
ap.add_argument("--isa", default="avx512")
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()


def probe(threads):
    r = subprocess.run([STRATA, "bench", "-m", a.model, "-p", "0", "-n", "0", "-t", str(threads),
                        "--json"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"strata bench failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)["mem_read_gbps"]


def kernels(t):
    rows = 262144 * 4096 // a.cols
    cmd = [KBENCH, "--isa", a.isa, "--type", t, "--tokens", "1", "--cols", str(a.cols),
           "--rows", str(rows), "--reps", "5"]
    ps = [subprocess.Popen(["taskset", "-c", str(c)] + cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for c in (0, 1)]
    gbps = []
    for p in ps:
        out, err = p.communicate()
        m = re.search(r"\(([0-9.]+) GB/s of weights\)", out)
        if p.returncode or not m:
            sys.exit(f"strata-kbench failed: {err.strip() or out.strip()}")
        gbps.append(float(m.group(1)))
    return gbps


print("| type | probe GB/s | kernels GB/s (core 0 + core 1) | probe after | kernels / probe "
      "| probe, one thread |")
print("|---|---|---|---|---|---|", flush=True)
for _ in range(a.rounds):
    for t in a.type or ["Q4_K", "Q6_K"]:
        with bench_lock():
            before = probe(2)
            k = kernels(t)
            after = probe(2)
            one = probe(1)
        steady = abs(after - before) < 0.05 * max(after, before)
        ratio = f"{sum(k) / ((before + after) / 2):.3f}" if steady else "-"
        print(f"| {t} | {before:.1f} | {sum(k):.1f} ({k[0]:.1f} + {k[1]:.1f}) | {after:.1f} | "
              f"{ratio} | {one:.1f} |", flush=True)
