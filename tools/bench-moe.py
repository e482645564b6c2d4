#!/usr/bin/env python3
"""A mixture of experts through stratad's expert cache against llama.cpp on a
plain mmap, inside one memory cgroup (issue 22).

  tools/bench-moe.py --model M.gguf [--model M2.gguf ...]
                     --llama NAME=PATH[:LIBDIR] [--llama NAME2=PATH2 ...]
                     [--compute-model C.gguf] [--limit 8G] [--reps 3]
                     [--tokens 16] [--threads 2] [--lookahead-too] [--populate-too]
                     [--resident-too] [--strata-build NAME=BUILD_DIR ...]

The device is emulated by a memory cgroup (v1) of --limit bytes.  Per
repetition, interleaved (each model: strata, the other builds and settings
below, then each llama-bench; every other repetition in the reverse
order, so that none runs first in every round):

  strata    stratad started inside the cgroup with no --budget (its budget
            is the cgroup's limit less its reserve, docs/design.md), and
            once unit 0 and the layers' cores are in memory,
            `strata bench --pager -p 0 -n TOKENS --random-tokens` inside
            it too (one warm-up token first, and random tokens, as
            llama-bench decodes: the tokens choose the experts read).  The
            daemon's status before and after gives the expert cache's hit
            rate, the experts' bytes read per pass, the read bandwidth
            achieved while reads were in flight, the engine's compute a
            token (its wall time less the fault waits) and the bound
            1 / max(compute, missed expert bytes a token / probed bandwidth),
            with the bytes a token averaged over the run; and the same
            bound token by token (the sum over the tokens of max(compute,
            that token's bytes / probed bandwidth), each token's bytes those
            read while it ran, from `strata bench --trace` and `stratactl
            watch --json` every 50 ms), which a cold cache, reading most in
            the first tokens, holds lower (its tokens are the decoded ones
            only: the warm-up token's bytes, in the average, are not in it,
            which in short runs can make it the higher).
            Also the lookahead's accuracy (of the experts routed to, the
            share the engine's hint for that layer had named) and the
            experts read ahead on hints a token.  And the CPU time each
            process took a pass while the engine ran (user and system, all
            threads, the daemon's io_uring workers too; the engine's
            includes its start and warm-up token).
  strata lookahead  with --lookahead-too, the same with
            `stratad --lookahead` (the engine computes its guess of the
            next layer's experts and sends it, and they are read ahead):
            the lookahead's worth, its guess's cost included, interleaved.
  strata populate  with --populate-too, the same with `stratad --populate`
            (the expert cache's pages made before the daemon serves; the
            seconds from its start until the cores were loaded, the making
            included, are printed per run).
  resident  with --resident-too, the same model with every weight in
            memory: `strata bench -m M -p 0 -n TOKENS --random-tokens` on a
            plain mmap, outside the cgroup, the file read into the page
            cache first (so the machine must hold it: Qwen3-30B-A3B's 17 GiB
            fit in 24).  Each strata run is then also set against it, in
            its own repetition: what the pager and the limit cost, against
            the same model's own compute rather than the compute model's.
  strata NAME  with --strata-build NAME=BUILD_DIR, the same with the strata,
            stratad and stratactl of another build (e.g. of the commit
            before a change), interleaved too.
  llama     `PATH -m M -p 0 -n TOKENS -t THREADS -r 1` (llama-bench) inside
            the cgroup, reading the file through the page cache; with
            LIBDIR, its ggml libraries from there first (LD_LIBRARY_PATH:
            e.g. a libggml-cpu.so built with GGML_CPU_REPACK=OFF, whose
            weights stay in the mapped file instead of being converted
            into the process's own memory at load).

The compute a token in the bound is, with --compute-model C.gguf (the same
shape with fewer experts, e.g. strata-mkmodel --shape qwen3moe-30b-a3b
--experts 16: a token's work is the same, and the file fits in memory),
C's decode time with every weight in memory (plain mmap, outside the
cgroup, the file read into the page cache first; the best of two runs),
measured again at the start of every repetition: the host's memory speed
drifts over minutes, so each run is held against the bound of its own
repetition, and "strata / bound" is the median of those per-run
fractions.  Without it, the daemon's measure (wall time less the time any
of the engine's faults waited: a median of its reports, which include the
engine's first tokens), printed per run either way.

The page cache is dropped before every run.  Each run (and the compute
model's two) holds the machine's benchmark lock, /tmp/strata-bench.lock,
from the drop to its end, and lets it go between runs, so that other
sessions measure in between: run the script itself WITHOUT an outer
`flock /tmp/strata-bench.lock` (it would wait for itself; it exits saying
so).  Prints a markdown table of medians (decode tok/s), per-run values,
strata against llama.cpp (each repetition's run over the fastest llama.cpp
build's in the same repetition: the median of those ratios, and each;
with --resident-too, likewise against the resident run),
peak cgroup usage, failcnt and OOM kills, and the guest's free page reporting
(virtio-balloon): on a guest that hands free memory back to its host, the
memory the expert cache grows into costs a host fault a page, several times
what it costs on bare metal (docs/benchmarks.md, issue 22).  Needs root
(cgroup, drop_caches).
"""
import argparse, bisect, functools, json, os, statistics, subprocess, sys, tempfile, threading, \
    time

from benchlib import STRATA, Cgroup, bench_lock, bench_paged, context, cores_loaded, \
    drop_caches, llama_bench, llama_spec, program, size, warm


ap = argparse.ArgumentParser()
ap.add_argument("--model", action="append", required=True)
ap.add_argument("--llama", action="append", default=[], help="NAME=PATH[:LIBDIR]")
ap.add_argument("--limit", default="8G")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--tokens", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--compute-model", default="")
ap.add_argument("--lookahead-too", action="store_true")
ap.add_argument("--populate-too", action="store_true")
ap.add_argument("--resident-too", action="store_true")
ap.add_argument("--strata-build", action="append", default=[], help="NAME=BUILD_DIR")
a = ap.parse_args()

limit = size(a.limit)


def decode_resident(model, extra=()):
    """strata's decode tok/s of model on a plain mmap (of what the page cache
    holds of it), outside any cgroup."""
    r = subprocess.run([STRATA, "bench", "-m", model, "-p", "0", "-n", str(a.tokens), "-c",
                        str(context(a.tokens)), "-b", "32", "-t", str(a.threads), "--no-hw",
                        "--json", *extra], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["decode_tps"]


def resident_compute(model):
    """Seconds a token with every weight of model in memory (one measurement:
    the file read and two runs under one hold of the lock)."""
    with bench_lock():
        warm(model)
        return 1 / max(decode_resident(model) for _ in range(2))


compute_s = 0  # this repetition's, with --compute-model


def run_resident(model, cg):
    """The model decoded on a plain mmap with every weight in memory, outside
    the cgroup (cg unused)."""
    warm(model)
    return {"tps": decode_resident(model, tokens_arg(None))}


@functools.cache  # once a build
def tokens_arg(build):
    """Decode random tokens, as llama-bench does (a mixture of experts reads
    the experts its tokens route to): `strata bench --random-tokens`, where
    the build has it."""
    r = subprocess.run([program("strata", build)], capture_output=True, text=True)
    if "--random-tokens" in r.stderr + r.stdout:
        return ["--random-tokens"]
    print(f"note: {build or 'strata'} has no --random-tokens: it decodes greedy tokens",
          file=sys.stderr)
    return []


class ExpertReads:
    """The experts' bytes read so far, as `stratactl watch --json` reports them
    every 50 ms while the engine runs: (unix time it arrived, bytes) pairs."""

    def __init__(self, build):
        self.ctl = program("tools/stratactl", build)
        self.t, self.b, self.p = [], [], None

    def start(self, sock):
        self.p = subprocess.Popen([self.ctl, "--socket", sock, "watch", "--json", "--interval",
                                   "0.05"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.p.stdout:  # ends when the daemon stops
            try:
                b = json.loads(line)["models"][0]["experts"]["bytes_read"]
            except (ValueError, KeyError, IndexError):
                break  # cut off as the daemon stopped
            self.t.append(time.time())
            self.b.append(b)

    def stop(self):
        if not self.p:
            return  # the engine never started
        self.p.terminate()
        self.p.wait()
        self.reader.join()

    def at(self, t):
        """Bytes read by unix time t, linear between the reports."""
        i = bisect.bisect(self.t, t)
        if i == 0 or i == len(self.t):
            return self.b[min(i, len(self.b) - 1)] if self.b else 0
        f = (t - self.t[i - 1]) / (self.t[i] - self.t[i - 1])
        return self.b[i - 1] + f * (self.b[i] - self.b[i - 1])


def per_token_bound(toks, reads, compute, probed):
    """Tokens a second at the bound taken token by token: the sum over the
    decoded tokens of max(compute, that token's expert bytes / probed), each
    token's bytes those read while it ran (toks: its trace lines, when it
    ended and how long it took).  Reports 50 ms apart spread a token's bytes
    over its neighbours, which lowers the sum: the bound comes out high, if
    anything."""
    total = sum(max(compute, (reads.at(end) - reads.at(end - took)) / probed)
                for end, took in toks)
    return len(toks) / total


def run_strata(model, cg, daemon_args=(), build=None):
    reads = ExpertReads(build)
    with tempfile.NamedTemporaryFile(mode="r", prefix="strata-moe-", suffix=".trace") as trace:
        try:
            j, before, after, cpu = bench_paged(
                model, list(daemon_args), cores_loaded, a.tokens, a.threads, cg.enter, build,
                on_start=reads.start, engine_args=["--trace", trace.name, *tokens_arg(build)])
        finally:
            reads.stop()
        toks = [tuple(map(float, line.split())) for line in trace]
    m0, m1 = before["models"][0], after["models"][0]
    x0, x1 = m0["experts"], m1["experts"]
    routed = (x1["hits"] + x1["misses"]) - (x0["hits"] + x0["misses"])
    passes = x1["passes"] - x0["passes"]
    per_tok = (x1["bytes_read"] - x0["bytes_read"]) / passes
    probed = after["io"]["probed_gbps"] * 1e9
    compute = compute_s or m1["speed"]["compute_ms"] / 1e3
    token_s = max(compute, per_tok / probed)  # a token at the bound
    tok_bound = per_token_bound(toks, reads, compute, probed)
    io0, io1 = before["io"], after["io"]
    busy = (io1["busy_ms"] - io0["busy_ms"]) / 1e3
    keys = ("routed", "predicted", "read_ahead", "read_ahead_used", "routed_in_flight")
    la0, la1 = (x.get("lookahead", dict.fromkeys(keys, 0)) for x in (x0, x1))  # older daemons
    la = {k: la1[k] - la0[k] for k in keys}
    wait = (m1["fault_wait_ms"] - m0["fault_wait_ms"]) / passes
    remaps = m1.get("remaps", 0) - m0.get("remaps", 0)  # older daemons: none
    remap_ms = m1.get("remap_ms", 0) - m0.get("remap_ms", 0)
    return {"daemon_compute": m1["speed"]["compute_ms"] / 1e3, "wait": wait,
            "acc": la["predicted"] / la["routed"] if la["routed"] else 0,
            "ahead_tok": la["read_ahead"] / passes, "ahead_used": la["read_ahead_used"] /
            la["read_ahead"] if la["read_ahead"] else 0, "inflight_tok":
            la["routed_in_flight"] / passes,"tps": j["decode_tps"], "hit": (x1["hits"] - x0["hits"]) / routed,
            "gbps": (io1["bytes_read"] - io0["bytes_read"]) / busy / 1e9 if busy > 0 else 0,
            "mib_tok": per_tok / 2**20, "compute": compute, "probed": probed / 1e9,
            "bound": 1 / token_s, "frac": j["decode_tps"] * token_s,
            "tok_bound": tok_bound, "tok_frac": j["decode_tps"] / tok_bound,
            "cap": x1["capacity_bytes"] >> 20,
            "remaps_tok": remaps / passes, "remap_us": remap_ms * 1e3 / remaps if remaps else 0,
            "cpu_engine": cpu["engine"] / passes, "cpu_daemon": cpu["daemon"] / passes,
            "ready": cpu["ready"],
            "held": x1["held_bytes"] >> 20, "budget": after["budget_bytes"] >> 20,
            "io": f"{after['io']['chunk_bytes'] >> 10} KiB x {after['io']['depth']}"}


def run_llama(path, lib):
    def run(model, cg):
        j, err = llama_bench(path, model, 0, a.tokens, a.threads, lib, cg.enter)
        return {"tps": 0.0, "failed": err} if err else {"tps": j["decode"]}
    return run


engines = [("strata", run_strata)] + ([("strata lookahead", lambda m, cg: run_strata(
    m, cg, ["--lookahead"]))] if a.lookahead_too else []) + ([("strata populate", lambda m, cg:
    run_strata(m, cg, ["--populate"]))] if a.populate_too else []) + [
    ("strata " + n, (lambda b: lambda m, cg: run_strata(m, cg, build=b))(d))
    for n, _, d in (x.partition("=") for x in a.strata_build)] + [
    ("llama.cpp " + n, run_llama(p, lib)) for n, p, lib in map(llama_spec, a.llama)] + (
    [("resident", run_resident)] if a.resident_too else [])


def page_reporting():
    """This guest's free page reporting (virtio-balloon): the order of the
    free blocks it hands back to the host (absent: no reporting), and KiB
    handed back so far.  Memory handed back costs a host fault a page when
    next touched (docs/benchmarks.md, issue 22, session 42)."""
    d = "/sys/module/page_reporting/parameters"
    try:
        with open(os.path.join(d, "page_reporting_order")) as f:
            order = int(f.read())
        with open(os.path.join(d, "reported_kib")) as f:
            return order, int(f.read())
    except (OSError, ValueError):
        return None, 0


reporting = page_reporting()
res = {m: {who: [] for who, _ in engines} for m in a.model}
for rep in range(a.reps):
    if a.compute_model:
        compute_s = resident_compute(a.compute_model)
        print(f"rep {rep + 1} compute: {compute_s * 1e3:.0f} ms a token, "
              f"{a.compute_model} resident", file=sys.stderr)
    for m in a.model:
        # the engines in turn, the other way round every other repetition,
        # so that none always runs first (A B, B A: a drift cancels)
        for who, fn in engines if rep % 2 == 0 else engines[::-1]:
            with bench_lock():
                drop_caches()
                cg = Cgroup(limit, "strata-bench-moe")
                try:
                    r = fn(m, cg)
                    r["peak"] = cg.read("memory.max_usage_in_bytes")
                    r["failcnt"] = cg.read("memory.failcnt")
                    r["oom"] = cg.oom_kills()
                finally:
                    cg.remove()
            res[m][who].append(r)
            print(f"rep {rep + 1} {os.path.basename(m)} {who}: {r['tps']:.3f} tok/s" +
                  (f", hit rate {r['hit']:.3f}, {r['mib_tok']:.1f} MiB/token, compute "
                   f"{r['compute'] * 1e3:.0f} ms, reads {r['gbps']:.2f} GB/s, "
                   f"bound {r['bound']:.2f} ({r['frac']:.2f}), token by token "
                   f"{r['tok_bound']:.2f} ({r['tok_frac']:.2f}), lookahead accuracy {r['acc']:.3f}, "
                   f"{r['ahead_tok']:.1f} read ahead a token ({r['ahead_used']:.2f} used), "
                   f"{r['inflight_tok']:.1f} routed in flight a token, faults waited "
                   f"{r['wait']:.1f} ms a token (summed over threads), the daemon's compute "
                   f"{r['daemon_compute'] * 1e3:.0f} ms, {r['remaps_tok']:.1f} REMAPs a token "
                   f"answered in {r['remap_us']:.0f} us, CPU a token: engine "
                   f"{r['cpu_engine'] * 1e3:.0f} ms, daemon {r['cpu_daemon'] * 1e3:.1f} ms, "
                   f"the daemon ready in {r['ready']:.1f} s"
                   if who.startswith("strata") else "") +
                  (f", peak {r['peak'] >> 20} MiB, oom kills {r['oom']}" if who != "resident" else
                   ", outside the cgroup") +
                  (f" FAILED {r['failed']}" if "failed" in r else ""), file=sys.stderr)


def med(rows, k):
    return statistics.median(x[k] for x in rows)


def runs(rows, k="tps", fmt="{:.2f}"):
    return ", ".join(fmt.format(x[k]) for x in rows)


print(f"Memory cgroup limit {limit >> 20} MiB (v1); stratad without --budget inside it; "
      f"{a.tokens} decoded tokens per run after one warm-up token, {a.threads} threads; "
      f"{a.reps} interleaved repetitions, medians.\n")
llamas = [who for who, _ in engines if who.startswith("llama")]


def vs(m, who, refs):
    """strata WHO's decode of M over the fastest of the runs REFS in the same
    repetition (the runs side by side), the median of those ratios and each."""
    best = [max(res[m][w][i]["tps"] for w in refs) for i in range(a.reps)]
    r = [s["tps"] / b if b else 0.0 for s, b in zip(res[m][who], best)]
    return f"{statistics.median(r):.2f} ({', '.join(f'{x:.2f}' for x in r)})"


# without --llama, no llama.cpp columns (nor an empty ratio to it)
cols = ["model", "strata tok/s (runs)"] + [f"{w} tok/s (runs)" for w in llamas] + \
    (["strata / llama.cpp"] if llamas else []) + \
    ["expert hit rate", "expert MiB read / token", "compute ms / token", "reads GB/s",
     "bound tok/s", "strata / bound", "bound token by token", "strata / it",
     "peak MiB strata / llama.cpp" if llamas else "peak MiB", "OOM kills"]
print("| " + " | ".join(cols) + " |")
print("|" + "---|" * len(cols))
for m in a.model:
    s = res[m]["strata"]
    ms = med(s, "tps")
    ml = [med(res[m][w], "tps") for w in llamas]
    peak = str(max(x['peak'] for x in s) >> 20)
    if llamas:
        peak += " / " + "/".join(str(max(x['peak'] for x in res[m][w]) >> 20) for w in llamas)
    row = [os.path.basename(m), f"{ms:.2f} ({runs(s)})"] + \
        [f"{v:.2f} ({runs(res[m][w])})" for v, w in zip(ml, llamas)] + \
        ([vs(m, "strata", llamas)] if llamas else []) + \
        [f"{med(s, 'hit'):.3f}", f"{med(s, 'mib_tok'):.0f}", f"{med(s, 'compute') * 1e3:.0f}",
         f"{med(s, 'gbps'):.2f}", f"{med(s, 'bound'):.2f}", f"{med(s, 'frac'):.2f}",
         f"{med(s, 'tok_bound'):.2f}", f"{med(s, 'tok_frac'):.2f} ({runs(s, 'tok_frac')})", peak,
         str(sum(x["oom"] for w in res[m] for x in res[m][w]))]
    print("| " + " | ".join(row) + " |")
s0 = res[a.model[0]]["strata"][0]
print(f"\nstratad: budget {s0['budget']} MiB, expert cache {s0['cap']} MiB; reads "
      f"{s0['io']}, probed {s0['probed']:.2f} GB/s.  failcnt, max per engine: " +
      "; ".join(f"{os.path.basename(m)} " +
                ", ".join(f"{w} {max(x['failcnt'] for x in res[m][w])}" for w in res[m])
                for m in a.model))
order, kib = page_reporting()
# blocks above the largest order (10 on x86) are never free: nothing is handed back
print("Free page reporting: " + ("none" if order is None else
      f"order {order} ({'off' if order > 10 else 'on'}), {(kib - reporting[1]) >> 10} MiB "
      "handed back to the host during the runs"))
# each strata variant's row, and its ratio to the same model resident
if len([w for w, _ in engines if w.startswith("strata")]) > 1 or a.resident_too:
    var_cols = ["model", "strata", "tok/s (runs)", "expert hit rate", "expert MiB read / token",
            "lookahead accuracy", "read ahead / token (share routed to)",
            "routed in flight / token", "fault wait ms / token",
            "the engine's compute under the pager, ms / token", "CPU ms / token, engine + daemon",
            "strata / bound", "daemon ready s", "peak MiB"] + (["/ llama.cpp"] if llamas else []) + \
            (["/ resident"] if a.resident_too else [])
    print("\n| " + " | ".join(var_cols) + " |")
    print("|" + "---|" * len(var_cols))
    for m in a.model:
        for who in (w for w, _ in engines if w.startswith("strata")):
            s = res[m][who]
            print(f"| {os.path.basename(m)} | {who}"
                  f" | {med(s, 'tps'):.2f} ({runs(s)}) | {med(s, 'hit'):.3f} | "
                  f"{med(s, 'mib_tok'):.0f} | {med(s, 'acc'):.3f} | {med(s, 'ahead_tok'):.1f} "
                  f"({med(s, 'ahead_used'):.2f}) | {med(s, 'inflight_tok'):.1f} | "
                  f"{med(s, 'wait'):.1f} ({runs(s, 'wait', '{:.0f}')}) | "
                  f"{med(s, 'daemon_compute') * 1e3:.0f} "
                  f"({runs(s, 'daemon_compute', '{:.3f}')}) | "
                  f"{med(s, 'cpu_engine') * 1e3:.0f} + {med(s, 'cpu_daemon') * 1e3:.1f} | "
                  f"{med(s, 'frac'):.2f} ({runs(s, 'frac')}) | {med(s, 'ready'):.1f} | "
                  f"{max(x['peak'] for x in s) >> 20} |" +
                  (f" {vs(m, who, llamas)} |" if llamas else "") +
                  (f" {vs(m, who, ['resident'])} |" if a.resident_too else ""))
