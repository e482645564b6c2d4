#!/usr/bin/env python3
"""Real memory pressure on an emulated device: does strata keep generating?

  tools/bench-pressure.py --model M.gguf [--model ...] [--limit 8G] [--tokens 30]
                          [--hog 3584M] [--working-set 1G] [--reps 1]

Everything runs inside one cgroup-v1 memory cgroup of --limit bytes (an 8 GB
device): stratad with no --budget (it takes the cgroup's limit), and
`strata bench --pager -p 0 -n TOKENS --trace` decoding.  Once the engine has
decoded three tokens, a hog starts in the same cgroup: it grows anonymous
memory by 128 MiB every 100 ms up to --hog, and all the while re-reads a
file of --working-set bytes through the page cache.  On a machine without
swap that is what real pressure is: the anonymous memory cannot go
anywhere, so the kernel reclaims page cache, the hog's re-reads fault it
back in and stall (PSI), and when nothing is left to reclaim the OOM killer
picks the biggest process, which is the daemon holding the model.  A hog
that only allocated would be OOM-killed without ever causing a stall.

Per model, in each repetition:
  stream    stratad --resident 0, no hog: full streaming, the speed that
            pressure must never push decoding below;
  stream-hog  the same with the hog beside it: full streaming on cores the
            hog shares (its loop takes one), the fair floor for the runs
            below;
  on        the hog, the daemon's pressure response on (the default);
  off       the hog, stratad --no-pressure;
  plain     (only when asked for with --runs) the default daemon, no hog:
            does the automatic budget run the model within the limit?
The daemon's log and its last `stratactl status` of every run are kept in
/tmp/strata-bench-pressure-logs.
For each it records: tokens decoded and tok/s per token (the trace), tok/s
before the hog, from two seconds after it started, and over the last ten
tokens (the steady state under the hog), the cgroup's peak and
OOM kills, whether the daemon and the engine survived, the daemon's sheds
(how many relieved the pressure) and the median time from a PSI event to the
shed layers' memory being free.  Markdown to stdout.  Needs root.
"""
import argparse, json, mmap, os, signal, statistics, subprocess, sys, time

from benchlib import CTL, STRATA, drop_caches, size, start_daemon, status

CG_ROOT = "/sys/fs/cgroup/memory"
STEP = 128 << 20


ap = argparse.ArgumentParser()
ap.add_argument("--model", action="append", required=True)
ap.add_argument("--limit", default="8G")
ap.add_argument("--tokens", type=int, default=30)
ap.add_argument("--hog", default="3584M", help="anonymous memory the hog grows to")
ap.add_argument("--working-set", default="1G", help="file the hog keeps re-reading")
ap.add_argument("--reps", type=int, default=1)
ap.add_argument("--runs", default="stream,stream-hog,on,off", help="which of stream, "
                "stream-hog, on, off, plain to run")
ap.add_argument("--hog-child", nargs=3, help=argparse.SUPPRESS)
a = ap.parse_args()


def hog(anon_max, ws_path, stop_path):
    """The hog itself (run as a child): grow, re-read, until stop_path exists."""
    maps, grown, buf = [], 0, bytearray(1 << 20)
    pattern = b"\x01" * STEP
    next_step = time.monotonic()
    with open(ws_path, "rb", buffering=0) as f:
        while not os.path.exists(stop_path):
            if grown < anon_max and time.monotonic() >= next_step:
                # private anonymous memory (mmap's default is shared, which
                # is shmem), every page written: really allocated
                m = mmap.mmap(-1, STEP, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                m[:] = pattern
                maps.append(m)
                grown += STEP
                next_step += 0.1
            if f.readinto(buf) == 0:
                f.seek(0)


if a.hog_child:
    hog(int(a.hog_child[0]), a.hog_child[1], a.hog_child[2])
    sys.exit(0)

limit, anon_max, ws = size(a.limit), size(a.hog), size(a.working_set)
ws_path = "/var/tmp/strata-hog-working-set"
if not os.path.exists(ws_path) or os.path.getsize(ws_path) != ws:
    with open(ws_path, "wb") as f:
        for _ in range(ws >> 20):
            f.write(os.urandom(1 << 20))
tmp = f"/tmp/strata-bench-pressure-{os.getpid()}"
os.makedirs(tmp)
sock = os.path.join(tmp, "d.sock")
cg = os.path.join(CG_ROOT, f"strata-pressure-{os.getpid()}")


def cgread(name):
    with open(os.path.join(cg, name)) as f:
        return f.read()


def into_cgroup():
    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def trace_of(path):
    try:
        with open(path) as f:
            return [tuple(map(float, l.split())) for l in f if l.strip()]
    except FileNotFoundError:
        return []


HOG_RUNS = ("stream-hog", "on", "off")


def run(model, kind):
    """One run in a fresh cgroup: kind is stream, on or off."""
    drop_caches()
    os.mkdir(cg)
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    trace, stop = os.path.join(tmp, "trace"), os.path.join(tmp, "stop")
    for p in (trace, stop, sock):
        if os.path.exists(p):
            os.unlink(p)
    args = {"stream": ["--resident", "0"], "stream-hog": ["--resident", "0"], "on": [],
            "off": ["--no-pressure"], "plain": []}[kind]
    log = open(os.path.join(tmp, f"stratad-{kind}.log"), "w")
    # the engine's stderr to a file: a pipe nobody reads while it runs could fill
    elog = open(os.path.join(tmp, f"strata-{kind}.err"), "w+")
    d = hogp = None
    samples = []
    try:
        d = start_daemon(sock, [*args, model], preexec_fn=into_cgroup, stderr=log)
        e = subprocess.Popen([STRATA, "bench", "-m", model, "--pager", sock, "-p", "0", "-n",
                              str(a.tokens), "--no-hw", "--json", "--trace", trace],
                             preexec_fn=into_cgroup, stdout=subprocess.PIPE,
                             stderr=elog, text=True)
        hog_t = None
        while e.poll() is None:
            if kind in HOG_RUNS and hogp is None and len(trace_of(trace)) >= 3:
                hogp = subprocess.Popen([sys.executable, __file__, "--model", model,
                                         "--hog-child", str(anon_max), ws_path, stop],
                                        preexec_fn=into_cgroup)
                hog_t = time.time()
            st = status(sock)
            samples.append((time.time(), int(cgread("memory.usage_in_bytes")),
                            st["models"][0]["resident_layers_planned"] if st else None))
            time.sleep(0.1)  # sampling every 100 ms while the engine runs
        out, _ = e.communicate()
        elog.seek(0)
        err = elog.read()
        st = status(sock)
        text = subprocess.run([CTL, "--socket", sock, "status"], capture_output=True,
                              text=True).stdout
        with open(os.path.join(tmp, f"status-{kind}-{os.path.basename(model)}.txt"), "w") as f:
            f.write(text)
        daemon_alive = d.poll() is None
    finally:
        open(stop, "w").close()
        if hogp:
            hogp.wait(30)
        if d and d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(30)
        log.close()
        elog.close()
        peak = int(cgread("memory.max_usage_in_bytes"))
        ooms = int(next(l.split()[1] for l in cgread("memory.oom_control").splitlines()
                        if l.startswith("oom_kill ")))
        os.rmdir(cg)
    toks = trace_of(trace)
    before = [1 / t for ts, t in toks if hog_t is None or ts < hog_t]
    during = [1 / t for ts, t in toks if hog_t is not None and ts >= hog_t + 2]
    pressure = st["pressure"] if st else {}
    return dict(kind=kind, tokens=len(toks), engine_rc=e.returncode, engine_err=err.strip()[-200:],
                daemon_alive=daemon_alive, peak=peak, ooms=ooms,
                tps=statistics.median(1 / t for _, t in toks) if toks else 0,
                before=statistics.median(before) if before else 0,
                during=statistics.median(during) if during else 0,
                last=statistics.median(1 / t for _, t in toks[-10:]) if toks else 0,
                hog_alive=hogp is not None and hogp.returncode == 0,
                sheds=pressure.get("sheds", 0), helped=pressure.get("helped", 0),
                futile=pressure.get("futile", 0), ignored=pressure.get("ignored", 0),
                release_ms=pressure.get("release_ms_median", 0),
                resident=[s[2] for s in samples], per_token=[round(1 / t, 3) for _, t in toks])


rows = []
try:
    for rep in range(a.reps):
        for model in a.model:
            for kind in a.runs.split(","):
                r = run(model, kind)
                r["model"] = os.path.basename(model)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
finally:
    # the daemons' logs stay for a look at what happened
    logs = "/tmp/strata-bench-pressure-logs"
    subprocess.run(["rm", "-rf", logs])
    subprocess.run(["mv", tmp, logs])
    print(f"daemon logs: {logs}", file=sys.stderr)

hog_runs = set(HOG_RUNS) & set(a.runs.split(","))
print(f"Memory cgroup limit {limit >> 20} MiB (daemon, engine" +
      (" and hog" if hog_runs else "") + f" inside; no swap); {a.tokens} decoded tokens" +
      (f"; the hog grows to {anon_max >> 20} MiB of anonymous memory and re-reads a "
       f"{ws >> 20} MiB file from the third token on" if hog_runs else "") + ".\n")
print("| model | run | tokens | median tok/s | before the hog | under the hog | last 10 | engine | daemon "
      "| OOM kills | peak MiB | sheds (relieved) | ignored | shed to freed, ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['model']} | {r['kind']} | {r['tokens']} | {r['tps']:.3f} | {r['before']:.3f} | "
          f"{r['during']:.3f} | {r['last']:.3f} | "
          f"{'ok' if r['engine_rc'] == 0 else 'exit %d' % r['engine_rc']} | "
          f"{'alive' if r['daemon_alive'] else 'dead'} | {r['ooms']} | {r['peak'] >> 20} | "
          f"{r['sheds']} ({r['helped']}) | {r['ignored']} | {r['release_ms']:.1f} |")
