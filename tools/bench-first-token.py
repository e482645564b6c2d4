#!/usr/bin/env python3
"""Time from the daemon's start to the engine's first token.

  tools/bench-first-token.py --model M.gguf [--budget 4G] [--reps 3]

Per repetition, with the page cache dropped: stratad --budget starts (its
request size and depth already measured for the device and remembered), an
engine is started as soon as the socket exists, `strata bench --pager -p 0
-n 1` (its cold token is the first token), and the first token's time from
the daemon's start is set against the time the resident set takes to read
at the bandwidth the daemon measured for the device: resident bytes (the
layers planned resident and the other tensors) / that bandwidth.  Prints a
markdown table of the runs and their median.  Needs root (drop_caches).
"""
import argparse, json, os, signal, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = os.path.join(ROOT, "build")
STRATA, STRATAD = os.path.join(B, "strata"), os.path.join(B, "daemon", "stratad")
CTL = os.path.join(B, "tools", "stratactl")

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--budget", default="4G")
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
sock = f"/tmp/strata-bench-ft-{os.getpid()}.sock"


def status():
    r = subprocess.run([CTL, "--socket", sock, "status", "--json"], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None


rows = []
for rep in range(a.reps):
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    t0 = time.monotonic()
    d = subprocess.Popen([STRATAD, "--socket", sock, "--budget", a.budget, a.model],
                         stderr=subprocess.DEVNULL)
    while not os.path.exists(sock):
        if d.poll() is not None or time.monotonic() - t0 > 60:
            sys.exit("stratad did not come up")
        time.sleep(0.005)  # polling a condition with a deadline
    t1 = time.monotonic()
    r = subprocess.run([STRATA, "bench", "-m", a.model, "--pager", sock, "-p", "0", "-n", "1",
                        "-c", "64", "-b", "32", "--no-hw", "--json"], capture_output=True,
                       text=True)
    st = status()
    d.send_signal(signal.SIGTERM)
    d.wait(30)
    if r.returncode:
        sys.exit("strata bench failed: " + r.stderr)
    first = t1 - t0 + json.loads(r.stdout)["first_token_s"]
    m = st["models"][0]
    resident = m["other"]["bytes"] + sum(l["bytes"] for l in m["layers"]
                                         if l["state"] == "resident")
    bound = resident / (st["io"]["probed_gbps"] * 1e9)
    rows.append((first, resident, st["io"]["probed_gbps"], bound, m["resident_layers_planned"],
                 len(m["layers"])))
    print(f"rep {rep + 1}: first token {first:.2f} s, resident {resident / 2**30:.2f} GiB, "
          f"{bound:.2f} s at {st['io']['probed_gbps']:.2f} GB/s: {first / bound:.2f}x",
          file=sys.stderr)

print(f"`{os.path.basename(a.model)}`, stratad --budget {a.budget}; {rows[0][4]} of "
      f"{rows[0][5]} layers resident; {a.reps} runs.\n")
print("| run | first token s | resident GiB | measured GB/s | resident / GB/s, s | ratio |")
print("|---|---|---|---|---|---|")
for i, (first, res, g, bound, _, _) in enumerate(rows):
    print(f"| {i + 1} | {first:.2f} | {res / 2**30:.2f} | {g:.2f} | {bound:.2f} | "
          f"{first / bound:.2f} |")
print(f"\nMedian ratio: {statistics.median(r[0] / r[3] for r in rows):.2f}")
