#!/usr/bin/env python3
"""Where a paged decode's waits go, from the kernel's tracepoints.

  tools/trace-pager.py --model M.gguf [--limit 8G] [--tokens 400] [--threads 2]
                       [--skip 5] [--seconds 4] [--out DIR] [-- STRATAD_ARGS...]

stratad (no --budget: the cgroup's) and `strata bench --pager -p 0 -n
TOKENS` run inside a memory cgroup (v1) of --limit bytes, under the
benchmark lock, the page cache dropped first, as tools/bench-moe.py runs
them; --skip seconds after the engine starts (its load and warm-up token
come first), `perf record` takes the scheduler's and io_uring's tracepoints
(no PMU needed) for --seconds, then reports:

- the io_uring requests completed in the window, by opcode (READ, WRITE,
  FALLOCATE): how many, their MiB, the time from submission to completion
  (median, p90, max) and, for reads and writes, ms a MiB (median, best);
  requests are paired by their user_data;
- each task's delay from wake-up to running (`perf sched latency`): the
  daemon, its io_uring workers (iou-wrk), the engine's threads;
- the decode's tok/s and the daemon's CPU a token while the engine ran.

docs/benchmarks.md, issue 22, "What an expert waits for", is what it was
written for: a missed expert's reads, then its writes into the memfd one
after another.  perf.data and the `perf script` text stay in --out (a
temporary directory by default) for a closer look.  Needs root, perf and
tracefs (mounted at /sys/kernel/tracing if it is not).
"""
import argparse, os, re, shutil, statistics, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (STRATA, STRATAD, Cgroup, bench_lock, bench_paged, cores_loaded,  # noqa: E402
                      drop_caches, size)

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--model", required=True)
ap.add_argument("--limit", default="8G")
ap.add_argument("--tokens", type=int, default=400)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--skip", type=float, default=5, help="seconds after the engine starts")
ap.add_argument("--seconds", type=float, default=4, help="the window")
ap.add_argument("--out", default="")
ap.add_argument("daemon_args", nargs="*", help="after --: more stratad options")
a = ap.parse_args()

EVENTS = ["sched:sched_switch", "sched:sched_wakeup", "io_uring:io_uring_submit_req",
          "io_uring:io_uring_complete"]


def need():
    for prog in (STRATAD, STRATA):
        if not os.access(prog, os.X_OK):
            sys.exit(f"trace-pager.py: no {prog}: build first (tools/build.sh) or set STRATA_BUILD")
    if not os.path.isfile(a.model):
        sys.exit(f"trace-pager.py: {a.model}: no such file")
    if os.geteuid() != 0:
        sys.exit("trace-pager.py: needs root (a memory cgroup, tracepoints)")
    if not shutil.which("perf"):
        sys.exit("trace-pager.py: needs perf (apt-get install linux-perf)")
    if not os.path.isdir("/sys/kernel/tracing/events/io_uring"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"],
                       capture_output=True)
        if not os.path.isdir("/sys/kernel/tracing/events/io_uring"):
            sys.exit("trace-pager.py: no io_uring tracepoints under /sys/kernel/tracing")


def record(data, started):
    """perf record over the window, once started is set (in a thread)."""
    started.wait()
    time.sleep(a.skip)
    ev = sum((["-e", e] for e in EVENTS), [])
    subprocess.run(["perf", "record", "-q", "-a", "-o", data, *ev, "--", "sleep", str(a.seconds)],
                   capture_output=True)


REQ = re.compile(r"\s(\d+\.\d+):\s+io_uring:io_uring_(submit_req|complete): .*?"
                 r"user_data (0x[0-9a-f]+)(?:, opcode (\w+))?(?:.*?result (-?\d+))?")


def io_report(text):
    sub, done = {}, {}
    for line in text.splitlines():
        m = REQ.search(line)
        if not m:
            continue
        t, ev, ud, op, res = float(m[1]), m[2], m[3], m[4], m[5]
        if ev == "submit_req":
            sub[ud] = (t, op)
        elif ud in sub:
            t0, op = sub.pop(ud)
            done.setdefault(op, []).append(((t - t0) * 1e3, max(int(res or 0), 0) / 2**20))
    print("| request | completed | MiB | ms: median | p90 | max | ms a MiB: median | best |")
    print("|---|---|---|---|---|---|---|---|")
    for op, rows in sorted(done.items()):
        ms = sorted(r[0] for r in rows)
        per = sorted(r[0] / r[1] for r in rows if r[1] > 0)
        mib = sum(r[1] for r in rows)
        print(f"| {op} | {len(rows)} | {mib:.1f} | {statistics.median(ms):.2f} | "
              f"{ms[int(0.9 * (len(ms) - 1))]:.2f} | {ms[-1]:.2f} | " +
              (f"{statistics.median(per):.2f} | {per[0]:.2f} |" if per else "- | - |"))
    if not done:
        print("| (none in the window) | 0 | | | | | | |")


def sched_report(data):
    r = subprocess.run(["perf", "sched", "latency", "-i", data], capture_output=True, text=True)
    rows = [l for l in r.stdout.splitlines()
            if re.match(r"\s*(stratad|strata|iou-wrk)", l)]
    print("\nwake-up to running (perf sched latency):")
    for l in rows:
        f = [x.strip() for x in l.split("|")]
        print(f"  {f[0]:<24} switches {f[2]:>6}  {f[3]}  {f[4]}")


need()
out = a.out or tempfile.mkdtemp(prefix="strata-trace-")
os.makedirs(out, exist_ok=True)
data = os.path.join(out, "perf.data")
started = threading.Event()
rec = threading.Thread(target=record, args=(data, started), daemon=True)
rec.start()
with bench_lock():
    drop_caches()
    cg = Cgroup(size(a.limit), "strata-trace")
    try:
        j, _, _, cpu = bench_paged(a.model, a.daemon_args, cores_loaded, a.tokens, a.threads,
                                   cg.enter, on_start=lambda sock: started.set())
    finally:
        started.set()
        cg.remove()
rec.join()
tps = j["decode_tps"]
print(f"{os.path.basename(a.model)}, {size(a.limit) >> 20} MiB cgroup, {a.tokens} tokens: "
      f"{tps:.2f} tok/s; the daemon's CPU {cpu['daemon'] / a.tokens * 1e3:.1f} ms a token "
      f"(its io_uring workers included); window {a.seconds:g} s from {a.skip:g} s after the "
      f"engine started\n")
if not os.path.exists(data):
    sys.exit("trace-pager.py: perf recorded nothing (the decode ended before the window?)")
text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,cpu,time,event,trace"],
                      capture_output=True, text=True).stdout
with open(os.path.join(out, "perf.txt"), "w") as f:
    f.write(text)
io_report(text)
sched_report(data)
print(f"\n{data} and {os.path.join(out, 'perf.txt')} kept")
