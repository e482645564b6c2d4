#!/usr/bin/env python3
"""Decode speed through the pager against the bound the hardware sets.

  tools/bench-pager.py [--model M.gguf] [--reps 3] [--tokens 8] [--prompt 16] [--batch N]
                       [--threads T] [--fractions 1,0.75,0.5,0.25] [--cgroup [--window N]]

Without --model it makes (once) an 8B-shaped Q4_0 model with strata-mkmodel
under /var/tmp/strata-bench.  Each repetition measures, side by side:

  storage   the best read bandwidth of the model file's device, as stratad
            measures it (`--probe-io`: O_DIRECT, fresh memory, the request
            size and depth that read fastest), measured again in every
            repetition into a cache file of the run's own, which the pager
            runs of that repetition then read (so they use what it found)
  plain     `strata bench` on a plain mmap of the file (page cache warm, the
            whole model resident): the engine's own speed, and from it the
            compute time per token
  pager F   `strata bench --pager` with a fraction F of the layers resident
            (stratad --resident N), everything else streamed

and prints per configuration the median prompt (--prompt tokens) and decode
tokens/s, the prompt speed against plain's, the decode bound
1 / max(compute time, streamed bytes per token / storage bandwidth), the
ratio, and the read bandwidth the daemon achieved during the run (bytes read
over the time reads were in flight, from its status before and after)
against the storage bandwidth.  --cgroup adds runs inside a memory cgroup limited to half the model
+ 64 MiB: stratad --budget (half the model) serving the engine through
userfaultfd, the same serving a plain mmap of its FUSE mount, and a plain
mmap of the original file; it reports their speeds and peak usage.
Needs root for drop_caches and the cgroup.  Markdown goes to stdout.
"""
import argparse, json, os, signal, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the build whose programs run: build/, or STRATA_BUILD, as in benchlib.py
B = os.environ.get("STRATA_BUILD") or os.path.join(ROOT, "build")
STRATA, STRATAD = os.path.join(B, "strata"), os.path.join(B, "daemon", "stratad")
CTL, MK = os.path.join(B, "tools", "stratactl"), os.path.join(B, "tools", "strata-mkmodel")

ap = argparse.ArgumentParser()
ap.add_argument("--model")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--tokens", type=int, default=8)
ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per run")
ap.add_argument("--batch", type=int, default=0, help="strata -b: prompt tokens per forward pass "
                "(0: strata's default, 256)")
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--fractions", default="1,0.75,0.5,0.25", help="empty: only the cgroup runs")
ap.add_argument("--cgroup", action="store_true")
ap.add_argument("--window", type=int, default=0, help="stratad --window in the cgroup runs "
                "(0: its default)")
a = ap.parse_args()

model = a.model
if not model:
    os.makedirs("/var/tmp/strata-bench", exist_ok=True)
    model = "/var/tmp/strata-bench/llama-8b-q4_0.gguf"
    if not os.path.exists(model):
        subprocess.run([MK, "--shape", "llama-8b", "--type", "q4_0", "-o", model], check=True)
sock = f"/tmp/strata-bench-{os.getpid()}.sock"
eng_opts = (["-t", str(a.threads)] if a.threads else []) + (["-b", str(a.batch)] if a.batch else [])


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


def io_status():
    r = subprocess.run([CTL, "--socket", sock, "status", "--json"], capture_output=True, text=True)
    return json.loads(r.stdout)["io"]


def bench(extra, pre=None, path=None):
    # --no-hw: the machine is measured here once (strata-iobench), not per run
    r = subprocess.run([STRATA, "bench", "-m", path or model, "-p", str(a.prompt), "-n", str(a.tokens),
                        "--json", "--no-hw",
                        *eng_opts, *extra], capture_output=True, text=True, preexec_fn=pre)
    if r.returncode:
        sys.exit(f"bench failed: {r.stderr}")
    return json.loads(r.stdout)


def status():
    r = subprocess.run([CTL, "--socket", sock, "status", "--json"], capture_output=True, text=True)
    return json.loads(r.stdout)["models"][0] if r.returncode == 0 else None


io_cache = f"/tmp/strata-bench-io-{os.getpid()}"


def daemon(args, pre=None, opened=None):
    """stratad, once its resident layers are in memory.  opened: a file in its
    mount to open first (the mount fills a file's page cache once opened)."""
    p = subprocess.Popen([STRATAD, "--socket", sock, "--io-cache", io_cache, *args, model],
                         stderr=subprocess.DEVNULL, preexec_fn=pre)
    end = time.monotonic() + 120
    while opened and time.monotonic() < end:
        try:
            open(opened, "rb").close()  # from this process: the cgroup is the daemon's
            break
        except OSError:
            time.sleep(0.05)  # the mount is not up yet
    # ready when every resident layer is loaded
    while time.monotonic() < end:
        st = status()
        if st and sum(l["state"] == "resident" for l in st["layers"]) == \
                st["resident_layers_planned"]:
            return p
        time.sleep(0.05)
    sys.exit("stratad did not come up")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(30)


fractions = [float(x) for x in a.fractions.split(",") if x]
probed_io = []
rows = {f: [] for f in fractions}
achieved = {f: [] for f in fractions}
prompt_rows = {f: [] for f in fractions}
plain_prompt = []
plain, storage, streamed = [], [], {}
n_layers = None
for rep in range(a.reps):
    drop_caches()
    p = daemon(["--resident", "0", "--probe-io"])
    io = io_status()
    stop(p)
    storage.append(io["probed_gbps"])
    probed_io.append(f"{io['chunk_bytes'] >> 10} KiB x {io['depth']}")
    bench([])  # warm the page cache: the plain run measures a resident model
    r = bench([])
    plain.append(r["decode_tps"])
    plain_prompt.append(r["prompt_tps"])
    drop_caches()
    if n_layers is None:
        p = daemon(["--resident", "0"])
        n_layers = len(status()["layers"])
        stop(p)
    for f in fractions:
        n = round(f * n_layers)
        p = daemon(["--resident", str(n)])
        st = status()
        streamed[f] = sum(l["bytes"] for l in st["layers"] if l["state"] != "resident")
        io0 = io_status()
        r = bench(["--pager", sock])
        io1 = io_status()
        busy = (io1["busy_ms"] - io0["busy_ms"]) / 1e3
        achieved[f].append((io1["bytes_read"] - io0["bytes_read"]) / busy / 1e9 if busy else 0)
        rows[f].append(r["decode_tps"])
        prompt_rows[f].append(r["prompt_tps"])
        stop(p)
    print(f"rep {rep + 1}: storage {storage[-1]:.2f} GB/s, plain {plain[-1]:.2f} tok/s, " +
          ", ".join(f"{f:.0%} {rows[f][-1]:.3f}" for f in fractions), file=sys.stderr)

bw = statistics.median(storage) * 1e9
tps_plain = statistics.median(plain)
compute = 1 / tps_plain
size = os.path.getsize(model)
print(f"Model: `{os.path.basename(model)}`, {size / 2**30:.2f} GiB, {n_layers} layers; "
      f"{a.reps} repetitions, {a.tokens} decoded tokens each, medians.\n")
print(f"- storage read bandwidth (stratad --probe-io: the best it found, in each repetition; "
      f"with {', '.join(probed_io)}): {bw / 1e9:.2f} GB/s "
      f"(runs: {', '.join(f'{x:.2f}' for x in storage)})")
print(f"- engine without the pager (plain mmap, resident): {tps_plain:.3f} tok/s "
      f"(runs: {', '.join(f'{x:.3f}' for x in plain)}); compute time {compute * 1000:.0f} ms/token\n")
print(f"- prompt processing without the pager: {statistics.median(plain_prompt):.3f} tok/s "
      f"({a.prompt} tokens, batches of {a.batch or 256})\n")
print("| resident | streamed/token | decode tok/s (runs) | bound tok/s | ratio | "
      "prompt tok/s | prompt vs plain | reads GB/s (runs) | reads / storage |")
print("|---|---|---|---|---|---|---|---|---|")
for f in fractions:
    t = statistics.median(rows[f])
    bound = 1 / max(compute, streamed[f] / bw)
    runs = ", ".join(f"{x:.3f}" for x in rows[f])
    note = " (vs plain)" if streamed[f] == 0 else ""
    pt = statistics.median(prompt_rows[f])
    pp = statistics.median(plain_prompt)
    ach = statistics.median(achieved[f])
    aruns = ", ".join(f"{x:.2f}" for x in achieved[f])
    print(f"| {f:.0%} | {streamed[f] / 2**30:.2f} GiB | {t:.3f} ({runs}) | {bound:.3f} | "
          f"{t / bound:.2f}{note} | {pt:.3f} | {f'{pt / pp:.2f}' if pp else '-'} | "
          + (f"{ach:.2f} ({aruns}) | {ach * 1e9 / bw:.2f} |" if streamed[f] else "- | - |"))

if a.cgroup:
    # Budget half the model; the cgroup's limit adds 64 MiB for the engine's
    # own memory.  Three ways to run the model in that limit, interleaved per
    # repetition: through the pager (userfaultfd), through the pager's FUSE
    # mount (plain mmap of the mounted file), and plain mmap of the original
    # file, where the kernel's page cache alone decides what stays.
    budget = size // 2
    limit = budget + (64 << 20)
    mnt = f"/tmp/strata-bench-mnt-{os.getpid()}"
    os.mkdir(mnt)
    ways = ["uffd", "fuse", "plain"]
    got = {w: [] for w in ways}
    peaks = {w: [] for w in ways}
    fails = {w: [] for w in ways}  # times the cgroup hit its limit (the kernel reclaimed)
    planned = {}  # way -> layers the daemon planned resident
    for rep in range(a.reps):
        for w in ways:
            cg = f"/sys/fs/cgroup/memory/strata-bench-{os.getpid()}"
            os.mkdir(cg)
            open(os.path.join(cg, "memory.limit_in_bytes"), "w").write(str(limit))

            def into():
                open(os.path.join(cg, "cgroup.procs"), "w").write(str(os.getpid()))

            drop_caches()
            p = None
            if w == "plain":
                r = bench([], pre=into)
            else:
                win = ["--window", str(a.window)] if a.window else []
                p = daemon(["--budget", str(budget), *win] + (["--fuse", mnt] if w == "fuse" else []),
                           pre=into, opened=os.path.join(mnt, os.path.basename(model))
                           if w == "fuse" else None)
                planned[w] = status()["resident_layers_planned"]
                if w == "uffd":
                    r = bench(["--pager", sock], pre=into)
                else:
                    r = bench([], pre=into, path=os.path.join(mnt, os.path.basename(model)))
                stop(p)
            got[w].append(r["decode_tps"])
            peaks[w].append(int(open(os.path.join(cg, "memory.max_usage_in_bytes")).read()))
            fails[w].append(int(open(os.path.join(cg, "memory.failcnt")).read()))
            os.rmdir(cg)
        print(f"cgroup rep {rep + 1}: " + ", ".join(f"{w} {got[w][-1]:.3f} tok/s peak "
              f"{peaks[w][-1] / 2**20:.0f} MiB" for w in ways), file=sys.stderr)
    os.rmdir(mnt)
    med = {w: statistics.median(got[w]) for w in ways}
    print(f"\nUnder a memory cgroup limited to {limit / 2**20:.0f} MiB (budget "
          f"{budget / 2**20:.0f} MiB = half the model, + 64 MiB for the engine); the pager "
          f"plans {planned.get('uffd')} of {n_layers} layers resident for the engine and "
          f"{planned.get('fuse')} for the mount:\n")
    print("| how the engine maps the model | decode tok/s (runs) | peak MiB (max) | "
          "limit hit (failcnt, max) | vs uffd | vs plain |")
    print("|---|---|---|---|---|---|")
    names = {"uffd": "`--pager` (userfaultfd)", "fuse": "plain mmap of the FUSE mount",
             "plain": "plain mmap of the file"}
    for w in ways:
        runs = ", ".join(f"{x:.3f}" for x in got[w])
        peak = max(peaks[w])
        print(f"| {names[w]} | {med[w]:.3f} ({runs}) | {peak / 2**20:.0f} "
              f"({'under' if peak < limit else 'OVER'}) | {max(fails[w])} | "
              f"{med[w] / med['uffd']:.2f} | {med[w] / med['plain']:.2f} |")

if os.path.exists(io_cache):
    os.unlink(io_cache)
