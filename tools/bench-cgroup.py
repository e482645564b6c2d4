#!/usr/bin/env python3
"""strata through stratad against llama.cpp on a plain mmap, inside one memory cgroup.

  tools/bench-cgroup.py --model M.gguf [--model M2.gguf ...] --llama-bench PATH
                        [--limit 2560M] [--budget SIZE] [--reps 3] [--tokens 8]
                        [--fuse [--fuse-budget 2G]] [--only-fuse]

The device is emulated by a memory cgroup (v1) of --limit bytes.  Per model
and repetition, interleaved (strata, then llama.cpp, then the next model):

  strata    stratad --budget (default: the limit less 96 MiB) started inside
            the cgroup, and, once its resident layers are in memory,
            `strata bench --pager -p 0 -n TOKENS` inside it too (one warm-up
            token first, as llama-bench does).  The daemon's status before
            and after gives the read bandwidth achieved while streaming.
  llama     llama.cpp's `llama-bench -p 0 -n TOKENS -r 1` inside the cgroup,
            reading the file through the page cache (build it with
            GGML_CPU_AARCH64=OFF: with Q4_0 repacking on, it copies the whole
            model into its own memory at load and cannot run in the limit).

  fuse      (--fuse) llama.cpp's llama-bench inside the cgroup again, reading
            the model through stratad's FUSE mount; the daemon runs outside
            the cgroup (`--budget` --fuse-budget), as it would serve a
            runtime it does not control.  Its pressure events, sheds and
            their judgement are reported (shedding cannot relieve the
            reader's own cgroup, and must not be kept when it did not).
            --only-fuse runs just llama.cpp plain and through the mount.

The page cache is dropped before every run.  Prints a markdown table of
medians (decode tok/s, strata / llama.cpp), per-run values, the cgroup's
peak usage and failcnt, and the storage bandwidth the daemon measured for
the device.  Needs root (cgroup, drop_caches).
"""
import argparse, os, signal, statistics, sys, tempfile

from benchlib import Cgroup, bench_paged, drop_caches, llama_bench, size, start_daemon, status


ap = argparse.ArgumentParser()
ap.add_argument("--model", action="append", required=True)
ap.add_argument("--llama-bench", required=True)
ap.add_argument("--limit", default="2560M")
ap.add_argument("--budget", default="", help="stratad --budget (default: limit - 96 MiB)")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--tokens", type=int, default=8)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--window", type=int, default=0)
ap.add_argument("--fuse", action="store_true")
ap.add_argument("--only-fuse", action="store_true")
ap.add_argument("--fuse-budget", default="2G")
a = ap.parse_args()
a.fuse = a.fuse or a.only_fuse


limit = size(a.limit)
budget = size(a.budget) if a.budget else limit - (96 << 20)
sock = f"/tmp/strata-bench-cg-{os.getpid()}.sock"


def run_strata(model, cg):
    win = ["--window", str(a.window)] if a.window else []

    def loaded(st):
        m = st["models"][0]
        return sum(l["state"] == "resident" for l in m["layers"]) == m["resident_layers_planned"]

    j, before, after, _ = bench_paged(model, ["--budget", str(budget), *win], loaded,
                                      a.tokens, a.threads, cg.enter)
    io0, io1 = before["io"], after["io"]
    busy = (io1["busy_ms"] - io0["busy_ms"]) / 1e3
    m = after["models"][0]
    return {"tps": j["decode_tps"], "cold": j["cold_token_s"],
            "gbps": (io1["bytes_read"] - io0["bytes_read"]) / busy / 1e9 if busy > 0 else 0,
            "probed": io1["probed_gbps"], "io": f"{io1['chunk_bytes'] >> 10} KiB x {io1['depth']}",
            "planned": m["resident_layers_planned"], "layers": len(m["layers"]),
            "pressure": after["pressure_events"]}


def run_llama(model, cg):
    j, err = llama_bench(a.llama_bench, model, 0, a.tokens, a.threads, preexec_fn=cg.enter)
    if err:
        sys.exit("llama-bench failed: " + err)
    return {"tps": j["decode"]}


def run_fuse(model, cg):
    """llama.cpp in the cgroup, reading through the mount of a daemon outside it."""
    mnt = f"/tmp/strata-bench-cg-mnt-{os.getpid()}"
    os.makedirs(mnt, exist_ok=True)
    # the daemon's log to a file: a pipe nobody reads while it runs would
    # stop it at its 64 KiB of log
    log = tempfile.TemporaryFile("w+")
    d = None
    try:
        d = start_daemon(sock, ["--budget", a.fuse_budget, "--fuse", mnt, model], stderr=log,
                         timeout=180)
        r = run_llama(os.path.join(mnt, os.path.basename(model)), cg)
        st = status(sock)
    finally:
        if d:
            d.send_signal(signal.SIGTERM)
            d.wait(60)
        log.seek(0)
        err = log.read()
        log.close()
        os.rmdir(mnt)
    p = st["pressure"]
    r.update(pressure=st["pressure_events"], sheds=p["sheds"], helped=p["helped"],
             futile=p["futile"], ignored=p["ignored"],
             log=[l for l in err.splitlines() if "pressure" in l or "shed" in l])
    return r


def runs(rows):
    return ", ".join(f"{x['tps']:.3f}" for x in rows)


engines = ([] if a.only_fuse else [("strata", run_strata)]) + [("llama", run_llama)] + \
    ([("fuse", run_fuse)] if a.fuse else [])
res = {m: {who: [] for who, _ in engines} for m in a.model}
for rep in range(a.reps):
    for m in a.model:
        for who, fn in engines:
            drop_caches()
            cg = Cgroup(limit, "strata-bench")
            try:
                r = fn(m, cg)
                r["peak"] = cg.read("memory.max_usage_in_bytes")
                r["failcnt"] = cg.read("memory.failcnt")
            finally:
                cg.remove()
            res[m][who].append(r)
            print(f"rep {rep + 1} {os.path.basename(m)} {who}: {r['tps']:.3f} tok/s" +
                  (f", reads {r['gbps']:.2f} GB/s (probed {r['probed']:.2f})"
                   if who == "strata" else "") +
                  f", peak {r['peak'] >> 20} MiB", file=sys.stderr)

if a.fuse:
    print(f"llama.cpp through the FUSE mount of a daemon outside the cgroup (--budget "
          f"{a.fuse_budget}), against its own plain mmap, both inside the {limit >> 20} MiB "
          f"cgroup:\n")
    print("| model | through the mount tok/s (runs) | plain mmap tok/s (runs) | ratio | "
          "pressure events | sheds (relieved / not) | ignored |")
    print("|---|---|---|---|---|---|---|")
    for m in a.model:
        f, l = res[m]["fuse"], res[m]["llama"]
        mf, ml = statistics.median(x["tps"] for x in f), statistics.median(x["tps"] for x in l)
        print(f"| {os.path.basename(m)} | {mf:.3f} ({runs(f)}) | {ml:.3f} ({runs(l)}) | "
              f"{mf / ml:.2f} | {sum(x['pressure'] for x in f)} | "
              f"{sum(x['sheds'] for x in f)} ({sum(x['helped'] for x in f)} / "
              f"{sum(x['futile'] for x in f)}) | {sum(x['ignored'] for x in f)} |")
    for m in a.model:
        for x in res[m]["fuse"]:
            for line in x["log"]:
                print(f"    {line}", file=sys.stderr)
    if a.only_fuse:
        sys.exit(0)
    print()
print(f"Memory cgroup limit {limit >> 20} MiB; stratad --budget {budget >> 20} MiB; "
      f"{a.tokens} decoded tokens per run, {a.threads} threads; {a.reps} interleaved "
      f"repetitions, medians.\n")
print("| model | strata tok/s (runs) | llama.cpp tok/s (runs) | strata / llama.cpp | "
      "strata reads GB/s (probed) | resident layers | peak MiB strata / llama.cpp |")
print("|---|---|---|---|---|---|---|")
for m in a.model:
    s, l = res[m]["strata"], res[m]["llama"]
    ms, ml = statistics.median(x["tps"] for x in s), statistics.median(x["tps"] for x in l)
    g = statistics.median(x["gbps"] for x in s)
    print(f"| {os.path.basename(m)} | {ms:.3f} ({runs(s)}) | {ml:.3f} ({runs(l)}) | {ms / ml:.2f} | "
          f"{g:.2f} ({s[0]['probed']:.2f}, {s[0]['io']}) | {s[0]['planned']} of {s[0]['layers']} | "
          f"{max(x['peak'] for x in s) >> 20} / {max(x['peak'] for x in l) >> 20} |")
print("\nfailcnt (times the cgroup hit its limit), max per engine: " +
      ", ".join(f"{os.path.basename(m)} strata {max(x['failcnt'] for x in res[m]['strata'])} "
                f"llama.cpp {max(x['failcnt'] for x in res[m]['llama'])}" for m in a.model) +
      "; daemon pressure events: " +
      ", ".join(str(max(x["pressure"] for x in res[m]["strata"])) for m in a.model))
