#!/usr/bin/env python3
"""How good is the daemon's speed predictor?

  tools/bench-predict.py --model M.gguf [--model ...] [--reps 2] [--tokens 8]
                         [--fractions 0,0.25,0.5,0.75,1] [--calibrate 0.5]

For each model and each resident fraction F (stratad --resident F x layers,
the page cache dropped first), in interleaved rounds: `strata bench --pager
-p 0 -n TOKENS` (one warm-up token first) measures decode, and the daemon's
status gives what the predictor said.  Two predictions are set against each
measurement:
  own         what the daemon predicted for F after this very run (its
              compute time and bandwidth learned from it);
  calibrated  what the daemon of the --calibrate run (same round) predicted
              for F: one short run's learning, asked about every other
              fraction, which is what choosing a plan with it means.
Prints a markdown table of medians and the errors (predicted / measured - 1).
Needs root (drop_caches).
"""
import argparse, json, os, signal, statistics, subprocess, sys

from benchlib import STRATA, drop_caches, start_daemon, status

ap = argparse.ArgumentParser()
ap.add_argument("--model", action="append", required=True)
ap.add_argument("--reps", type=int, default=2)
ap.add_argument("--tokens", type=int, default=8)
ap.add_argument("--fractions", default="0,0.25,0.5,0.75,1")
ap.add_argument("--calibrate", type=float, default=0.5)
a = ap.parse_args()
fractions = [float(f) for f in a.fractions.split(",")]
if a.calibrate not in fractions:
    fractions.append(a.calibrate)
sock = f"/tmp/strata-bench-predict-{os.getpid()}.sock"


def start(model, resident):
    """stratad --resident N serving model, once its socket answers."""
    return start_daemon(sock, ["--resident", str(resident), model])


def stop(d):
    d.send_signal(signal.SIGTERM)
    d.wait(30)


def run(model, fraction):
    """One daemon, one bench: (measured tok/s, {resident: predicted tok/s}, layers, n)."""
    drop_caches()
    d = start(model, 0)  # the layer count, from a daemon that holds nothing yet
    layers = len(status(sock)["models"][0]["layers"])
    stop(d)
    n = round(fraction * layers)
    d = start(model, n)
    try:
        r = subprocess.run([STRATA, "bench", "-m", model, "--pager", sock, "-p", "0", "-n",
                            str(a.tokens), "--no-hw", "--json"], capture_output=True, text=True)
        if r.returncode:
            sys.exit("strata bench failed: " + r.stderr)
        sp = status(sock)["models"][0]["speed"]
    finally:
        stop(d)
    pred = {p["resident"]: p["tps"] for p in sp["predicted"]}
    pred[n] = sp["predicted_tps"]
    return json.loads(r.stdout)["decode_tps"], pred, layers, n


results = {}  # (model, fraction) -> list of (measured, own, calibrated)
for rep in range(a.reps):
    for model in a.model:
        round_ = {f: run(model, f) for f in fractions}
        cal = round_[a.calibrate][1]
        for f in fractions:
            measured, pred, layers, n = round_[f]
            results.setdefault((model, f), []).append(
                (measured, pred.get(n, 0), cal.get(n, 0), n, layers))
            print(f"rep {rep + 1} {os.path.basename(model)} {n}/{layers} resident: "
                  f"{measured:.3f} tok/s, own {pred.get(n, 0):.3f}, calibrated "
                  f"{cal.get(n, 0):.3f}", file=sys.stderr)

print(f"{a.reps} interleaved rounds, {a.tokens} decoded tokens after one warm-up token; "
      f"calibrated: the prediction of the {a.calibrate:g} run of the same round.\n")
print("| model | resident | measured tok/s | own prediction | error | calibrated prediction | error |")
print("|---|---|---|---|---|---|---|")
for (model, f), rs in results.items():
    med = lambda i: statistics.median(r[i] for r in rs)
    m, own, cal = med(0), med(1), med(2)
    print(f"| {os.path.basename(model)} | {rs[0][3]}/{rs[0][4]} | {m:.3f} | {own:.3f} | "
          f"{(own / m - 1) * 100:+.0f}% | {cal:.3f} | {(cal / m - 1) * 100:+.0f}% |")
