#!/usr/bin/env python3
"""Decode against the memory-bandwidth bound, per model shape, beside llama.cpp.

  tools/bench-bound.py --shape qwen3-8b [--shape ...] [--type q4_k_m]
                       [--dir /work/bench] [--keep] [--rounds 3] [--tokens 16]
                       [--llama NAME=PATH[:LIBDIR] ...]

For each shape, the model is made with strata-mkmodel into DIR unless it is
there (and removed after its rounds unless --keep or it was there: 8B files
are 5 GB each), and its pages dropped from the page cache before the first
round reads it in.  Where DIR is matters: a file on a disk (ext4 here) is read
into 2 MiB folios and mapped 2 MiB at a time; one in tmpfs (/dev/shm) is
mapped in 4 KiB pages where transparent huge pages are off for shmem (this
machine's default), which cost gemma2-9b and qwen35-9b 3-4% of the bound
(docs/benchmarks.md, issue 16, session 31).  Each round reads the file into
the page cache (read(2) in 64 MiB pieces: its readahead grows the folios to
2 MiB; the "huge" column is the share of the model's bytes the engine then
reached by 2 MiB page-table entries, the median over the rounds), then runs

  strata       `strata bench -m M -p 0 -n TOKENS --json`: decode tok/s, the
               bound (the machine's memory read rate over the weight bytes a
               token reads, measured in the same run), their ratio, and the
               paired ratio (each token against a memory pass just before it);
  steady       the memory read rate also before it (`strata bench -m M -p 0
               -n 0 --json`): where that is within 5% of the run's own (read
               right after its tokens), the round held one memory speed
               through them, and its fraction is set against the mean of the
               two rates; else "-".  The fraction column cannot tell a memory
               that changed speed during the run (this machine's switches
               every few minutes between 45-50 and 70-83 GB/s) from decode at
               that fraction; this one drops such rounds;
  llama NAME   `llama-bench -m M -p 0 -n TOKENS -r 1` of each build given: its
               decode tok/s, set against the bound strata measured in the same
               round (llama.cpp reads the same weight bytes a token); with
               LIBDIR, its ggml libraries from there first.

Each run, with the reading before it, holds the machine's benchmark lock
(/tmp/strata-bench.lock) and lets it go after, so that other sessions
measure between runs: run the script WITHOUT an outer `flock` of that file
(it would wait for itself; it exits saying so).  Prints a markdown table of
medians, runs in brackets.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from benchlib import STRATA, bench_lock, llama_bench, llama_spec, warm

MKMODEL = os.path.join(os.path.dirname(STRATA), "tools", "strata-mkmodel")

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--shape", action="append", required=True)
ap.add_argument("--type", default="q4_k_m")
ap.add_argument("--dir", default="/work/bench")
ap.add_argument("--keep", action="store_true")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--tokens", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--llama", action="append", default=[], help="NAME=PATH[:LIBDIR]")
a = ap.parse_args()
llamas = {n: (p, lib) for n, p, lib in map(llama_spec, a.llama)}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{os.path.basename(cmd[0])} failed: {r.stderr[-2000:]}")
    return r.stdout


def uncache(path):
    """Drop path's pages from the page cache (written back first), so that the
    first round's reading brings the file in as large folios, which the
    engine's mapping takes 2 MiB at a time.  The pages strata-mkmodel just
    wrote are small ones.  (On tmpfs the pages are the file: nothing
    changes.)"""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fmt(v, d=2):
    if not v:
        return "-"
    return f"{statistics.median(v):.{d}f} ({', '.join(f'{x:.{d}f}' for x in v)})"


def steady(js, before):
    """The round's fraction against the mean of the memory read rate read
    before its tokens and the run's own (after them), or None where the two
    differ by 5% or more."""
    after = js["mem_read_gbps"]
    if not before or not after or abs(after - before) >= 0.05 * max(after, before):
        return None
    return js["decode_tps"] * js["token_weight_bytes"] / ((before + after) / 2 * 1e9)


def fmt_steady(v):
    kept = [x for x in v if x is not None]
    runs = ", ".join("-" if x is None else f"{x:.3f}" for x in v)
    return f"{statistics.median(kept):.3f} ({runs})" if kept else f"- ({runs})"


print(f"| shape | {a.type} GiB | huge | strata tok/s | bound tok/s | fraction | paired | steady | "
      + " | ".join(f"llama.cpp {n} tok/s | its fraction" for n in llamas) + " |")
print("|---|---|---|---|---|---|---|---|" + "---|---|" * len(llamas), flush=True)
for shape in a.shape:
    path = os.path.join(a.dir, f"{shape}-{a.type}.gguf")
    made = not os.path.exists(path)
    if made:
        run([MKMODEL, "--shape", shape, "--type", a.type, "-o", path])
    uncache(path)
    res = {"tps": [], "bound": [], "frac": [], "paired": [], "steady": [], "huge": []}
    lres = {n: ([], []) for n in llamas}
    try:
        for _ in range(a.rounds):
            with bench_lock():
                warm(path)
                before = json.loads(run([STRATA, "bench", "-m", path, "-p", "0", "-n", "0",
                                         "-t", str(a.threads), "--json"]))["mem_read_gbps"]
                js = json.loads(run([STRATA, "bench", "-m", path, "-p", "0", "-n",
                                     str(a.tokens), "-t", str(a.threads), "--json"]))
            res["steady"].append(steady(js, before))
            res["tps"].append(js["decode_tps"])
            res["huge"].append(js["huge_mapped_bytes"] / js["model_bytes"])
            res["bound"].append(js["decode_bound_tps"])
            res["frac"].append(js["decode_fraction"])
            res["paired"].append(js["paired_fraction"])
            for name, (bench, lib) in llamas.items():
                with bench_lock():
                    warm(path)
                    j, err = llama_bench(bench, path, 0, a.tokens, a.threads, lib)
                if err:  # a shape it does not load: say so, go on
                    print(f"llama.cpp {name} on {shape}: {err}", file=sys.stderr)
                    continue
                tps = j["decode"]
                lres[name][0].append(tps)
                lres[name][1].append(tps / js["decode_bound_tps"])
    finally:
        if made and not a.keep:
            os.unlink(path)
    size = js["model_bytes"] / (1 << 30)
    huge = statistics.median(res["huge"])
    print(f"| {shape} | {size:.2f} | {huge:.2f} | {fmt(res['tps'])} | {fmt(res['bound'])} | "
          f"{fmt(res['frac'], 3)} | {fmt(res['paired'], 3)} | {fmt_steady(res['steady'])} | "
          + " | ".join(f"{fmt(t)} | {fmt(f, 3)}" for t, f in lres.values()) + " |", flush=True)
