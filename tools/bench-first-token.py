#!/usr/bin/env python3
"""Time from the daemon's start to the engine's first token.

  tools/bench-first-token.py --model M.gguf [--budget 4G] [--reps 3]

Per repetition, with the page cache dropped before each step:
  1. strata-iobench reads the model file with the request size and depth the
     daemon uses for the device (O_DIRECT, io_uring), into reused buffers
     (the device's bandwidth in this round: shared disks drift between 1.4
     and 2.9 GB/s here, so a bandwidth remembered from another hour is not a
     bound for this one), then again with --fresh, into new memfd pages as
     the daemon's store fills (storage and new memory together: on a VM
     whose host takes freed memory back, new memory costs as much again);
  2. stratad --budget starts, an engine is started as soon as the socket
     exists, `strata bench --pager -p 0 -n 1` (its cold token is the first
     token), and the first token's time from the daemon's start is set
     against two bounds:
       - the bytes the first token must read (every weight it touches: the
         resident set and the streamed layers, `token_weight_bytes`) over
         this round's bandwidth: no reader can do better;
       - the same bytes over this round's bandwidth into new memory: what
         a reader that fills new memory can do;
       - the resident bytes (the layers planned resident and the other
         tensors) over the bandwidth the daemon remembers: the bound issue 14
         named, which leaves out the streamed layers the first token also
         needs.
Prints a markdown table of the runs and their medians.  Needs root
(drop_caches).
"""
import argparse, json, os, signal, statistics, subprocess, sys, time

from benchlib import IOBENCH, STRATA, STRATAD, drop_caches, status

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--budget", default="4G")
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
sock = f"/tmp/strata-bench-ft-{os.getpid()}.sock"


def iobench(io, *extra):
    """strata-iobench over the model with the daemon's request size and
    depth (io, from its status), the page cache dropped: GB/s."""
    drop_caches()
    r = subprocess.run([IOBENCH, "--chunk", str(io["chunk_bytes"]), "--depth", str(io["depth"]),
                        *extra, a.model], capture_output=True, text=True)
    if r.returncode:
        sys.exit("strata-iobench failed: " + r.stderr)
    return json.loads(r.stdout)["gbps"]


io = None  # the daemon's request size and depth, from its status
rows = []
for rep in range(a.reps + 1):
    # Round 0 only learns the daemon's request size and depth.
    gbps = fresh_gbps = None
    if io:
        gbps, fresh_gbps = iobench(io), iobench(io, "--fresh")
    drop_caches()
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
    st = status(sock)
    d.send_signal(signal.SIGTERM)
    d.wait(30)
    if r.returncode:
        sys.exit("strata bench failed: " + r.stderr)
    b = json.loads(r.stdout)
    first = t1 - t0 + b["first_token_s"]
    io = st["io"]
    if gbps is None:
        continue
    m = st["models"][0]
    resident = m["other"]["bytes"] + sum(l["bytes"] for l in m["layers"]
                                         if l["state"] == "resident")
    row = dict(first=first, token=b["token_weight_bytes"], gbps=gbps, fresh=fresh_gbps,
               bound=b["token_weight_bytes"] / (gbps * 1e9),
               fresh_bound=b["token_weight_bytes"] / (fresh_gbps * 1e9), resident=resident,
               probed=io["probed_gbps"], res_bound=resident / (io["probed_gbps"] * 1e9),
               planned=m["resident_layers_planned"], layers=len(m["layers"]))
    rows.append(row)
    print(f"rep {rep}: first token {first:.2f} s; {row['token'] / 2**30:.2f} GiB at "
          f"{gbps:.2f} GB/s: {first / row['bound']:.2f}x, into new memory at "
          f"{fresh_gbps:.2f} GB/s: {first / row['fresh_bound']:.2f}x", file=sys.stderr)

r0 = rows[0]
print(f"`{os.path.basename(a.model)}`, stratad --budget {a.budget}; {r0['planned']} of "
      f"{r0['layers']} layers resident ({r0['resident'] / 2**30:.2f} GiB); the first token reads "
      f"{r0['token'] / 2**30:.2f} GiB; the daemon remembers {r0['probed']:.2f} GB/s; "
      f"{a.reps} runs.\n")
print("| run | first token s | device GB/s | token bytes / device, s | ratio "
      "| into new memory GB/s | token bytes / that, s | ratio "
      "| resident / remembered GB/s, s | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
for i, r in enumerate(rows):
    print(f"| {i + 1} | {r['first']:.2f} | {r['gbps']:.2f} | {r['bound']:.2f} | "
          f"{r['first'] / r['bound']:.2f} | {r['fresh']:.2f} | {r['fresh_bound']:.2f} | "
          f"{r['first'] / r['fresh_bound']:.2f} | {r['res_bound']:.2f} | "
          f"{r['first'] / r['res_bound']:.2f} |")
med = lambda k: statistics.median(r['first'] / r[k] for r in rows)
print(f"\nMedian ratios: to the token's bytes at the device's rate {med('bound'):.2f}, "
      f"at the rate into new memory {med('fresh_bound'):.2f}, "
      f"to the resident bytes at the remembered rate {med('res_bound'):.2f}")
