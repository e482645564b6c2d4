#!/usr/bin/env python3
"""Speculative decoding, measured: what a pass over k + 1 positions costs, and
what drafting buys end to end, fully resident and streamed through the pager.

  passes    `strata bench --pass-sizes`: one pass of the model over n positions
            (every row's logits, as a verification needs), n = --sizes, against
            a one-position pass; resident (plain mmap) and streamed (stratad
            --budget B, the rest of the layers read from storage every pass)
  decode    `strata bench` decode tok/s, plain and with the draft model
            (adaptive, and always drafting --fixed), in interleaved rounds in
            the same two settings; the acceptance beside every number

Random-weight models accept nothing from a real draft; use a pair whose
acceptance is known: strata-mkmodel --out-gain G makes layers that barely
change the residual stream, and the same shape with --layers 1 (same seed and
gain) drafts for it (docs/benchmarks.md says which G gives what).

Each round runs the settings, and the variants within each, in an order rotated
by one from the round before, so that none is always first or last.

Each run holds the machine's benchmark lock (/tmp/strata-bench.lock), with
what it needs just before it (the model files read into the page cache; for a
streamed set, dropping the cache and starting the daemon), and lets it go
after, so that other sessions measure between runs: run the script WITHOUT an
outer `flock` of that file (it would wait for itself; it exits saying so).

usage: tools/bench-spec.py --target T.gguf --draft D.gguf [--poor-draft P.gguf]
       [--budget 2G] [--rounds 3] [--sizes 1,2,4,8,12,16] [-n 48] [--fixed 8[,K...]]
       [--settings resident,streamed] [--variants plain,adaptive,fixed,poor] [--no-passes]
Run as root (drops the page cache before each streamed set).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import STRATA, bench_lock, drop_caches, size, start_daemon, status, \
    warm  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--target", required=True)
ap.add_argument("--draft", required=True)
ap.add_argument("--poor-draft", help="a draft that is rarely right (e.g. another seed): "
                "adaptive drafting should turn itself down")
ap.add_argument("--budget", default="2G")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--sizes", default="1,2,4,8,12,16")
ap.add_argument("-n", type=int, default=48, help="tokens decoded per run")
ap.add_argument("--fixed", default="8", help="drafts per pass in the fixed runs (a list: one "
                "variant each)")
ap.add_argument("-t", "--threads", type=int, default=2)
ap.add_argument("--settings", default="resident,streamed",
                help="which settings to run (e.g. resident alone, for the cost of drafting "
                "where it cannot pay)")
ap.add_argument("--variants", default="plain,adaptive,fixed,poor",
                help="which decoding variants to run (plain always runs: the others are "
                "measured against it)")
ap.add_argument("--no-passes", action="store_true", help="skip the pass-cost measurement")
a = ap.parse_args()

sock = f"/tmp/strata-bench-spec-{os.getpid()}.sock"
common = ["--json", "--no-hw", "-t", str(a.threads), "-p", "16", "-c", "512"]


def bench(args, pager):
    cmd = [STRATA, "bench", "-m", a.target, *common, *args] + (["--pager", sock] if pager else [])
    drafts = [args[i + 1] for i, x in enumerate(args) if x == "--draft-model"]
    with bench_lock():
        # what reads the files through the page cache (another session may
        # have dropped it while the lock was free): the target unless paged,
        # the draft always
        for f in drafts + ([] if pager else [a.target]):
            warm(f)
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    j = json.loads(r.stdout)
    if pager:
        # what the engine declared (the daemon holds it after the engine
        # exits) and the resident layers the plan gave the target for it
        st = status(sock)
        if st:
            j["declared_bytes"] = st["declared_bytes"]
            j["resident_layers"] = st["models"][0]["resident_layers_planned"]
    return j


def daemon():
    with bench_lock():
        drop_caches()
        return start_daemon(sock, ["--budget", str(size(a.budget)), a.target])


def stop(d):
    d.send_signal(signal.SIGTERM)
    d.wait(30)


wanted = set(a.variants.split(","))
if not wanted <= {"plain", "adaptive", "fixed", "poor"}:
    sys.exit("bench-spec: --variants takes plain, adaptive, fixed and poor")
variants = {"plain": []}
if "adaptive" in wanted:
    variants["draft (adaptive)"] = ["--draft-model", a.draft]
for k in a.fixed.split(",") if "fixed" in wanted else []:
    variants[f"draft (always {k})"] = ["--draft-model", a.draft, "--draft-min", k,
                                       "--draft-max", k]
if a.poor_draft and "poor" in wanted:
    variants["poor draft (adaptive)"] = ["--draft-model", a.poor_draft]
modes = [m for m in ("resident", "streamed") if m in a.settings.split(",")]
if not modes:
    sys.exit("bench-spec: --settings takes resident, streamed or both")
pass_s = {m: [] for m in modes}
dec = {(m, v): [] for m in modes for v in variants}


def rotated(xs, r):
    xs = list(xs)
    return xs[r % len(xs):] + xs[:r % len(xs)]


def acc_of(j):
    kept, rej = j.get("spec_accepted", 0), j.get("spec_rejected", 0)
    return f" (acc {kept / (kept + rej):.2f})" if kept + rej else ""


for r in range(a.rounds):
    for m in rotated(modes, r):
        d = daemon() if m == "streamed" else None
        order = rotated(variants, r)
        try:
            if not a.no_passes:
                j = bench(["-n", "2", "--pass-sizes", a.sizes], d is not None)
                pass_s[m].append({p["positions"]: p["seconds"] for p in j["passes"]})
            for v in order:
                dec[(m, v)].append(bench(["-n", str(a.n), *variants[v]], d is not None))
        finally:
            if d:
                stop(d)
        print(f"round {r + 1} {m}: " + ", ".join(
            f"{v} {dec[(m, v)][-1]['decode_tps']:.3f}{acc_of(dec[(m, v)][-1])}" for v in order),
            file=sys.stderr)

sizes = [] if a.no_passes else [int(x) for x in a.sizes.split(",")]
if sizes:
    print(f"\nOne pass over n positions (median of {a.rounds} rounds; x: against one position):\n")
    print("| n | " + " | ".join(f"{m} s | x" for m in modes) + " |")
    print("|---|" + "---|---|" * len(modes))
for n in sizes:
    cells = []
    for m in modes:
        med = statistics.median(p[n] for p in pass_s[m])
        one = statistics.median(p[sizes[0]] for p in pass_s[m])
        cells += [f"{med:.3f}", f"{med / one:.2f}"]
    print(f"| {n} | " + " | ".join(cells) + " |")

print(f"\nDecode, {a.n} tokens (median of {a.rounds} interleaved rounds; x plain: the median "
      f"of each round's ratio to plain in that round; acceptance: drafts kept / drafted, and "
      f"per token = kept / (kept + passes that rejected one)):\n")
print("| setting | decoding | tok/s | x plain | tokens per pass | kept / drafted | per token | "
      "declared MiB | resident layers |")
print("|---|---|---|---|---|---|---|---|---|")
for m in modes:
    for v in variants:
        js = dec[(m, v)]
        tps = statistics.median(j["decode_tps"] for j in js)
        ratio = statistics.median(j["decode_tps"] / p["decode_tps"]
                                  for j, p in zip(js, dec[(m, "plain")]))
        mem = (f"{statistics.median(j['declared_bytes'] for j in js) / 2**20:.0f} | "
               f"{statistics.median(j['resident_layers'] for j in js):.0f}"
               if all("declared_bytes" in j for j in js) else "- | -")
        if v == "plain":
            print(f"| {m} | {v} | {tps:.3f} | 1.00 | 1.00 | - | - | {mem} |")
            continue
        acc = sum(j["spec_accepted"] for j in js)
        dr = sum(j["spec_drafted"] for j in js)
        rej = sum(j["spec_rejected"] for j in js)
        tpp = sum(j["spec_tokens"] for j in js) / max(1, sum(j["spec_passes"] for j in js))
        print(f"| {m} | {v} | {tps:.3f} | {ratio:.3f} | {tpp:.2f} | "
              f"{acc / max(1, dr):.2f} | {acc / max(1, acc + rej):.2f} | {mem} |")
