#!/usr/bin/env python3
"""The budget holds: a model twice the budget generates inside a memory cgroup.

A synthetic llama model (mostly layers) is served by stratad with --budget of
half its size; stratad and `strata run --pager` both run inside a cgroup-v1
memory cgroup whose limit is the budget plus the engine's own needs (code,
heap, tokenizer, page tables: OVERHEAD below).  The engine must generate all
its tokens (no OOM kill) and the cgroup's peak usage must stay under the
limit.  Needs root and the v1 memory controller; skips (77) otherwise.

The same check on an 8B-shaped model is a benchmark: tools/bench-pager.sh.
"""
import json, os, signal, subprocess, sys, tempfile, time

BUILD = os.environ["STRATA_BUILD"]
CG_ROOT = "/sys/fs/cgroup/memory"
OVERHEAD = 48 << 20

if os.geteuid() != 0:
    print("SKIP: needs root to create a memory cgroup")
    sys.exit(77)
if not os.path.exists(os.path.join(CG_ROOT, "cgroup.procs")):
    print(f"SKIP: no cgroup v1 memory controller at {CG_ROOT}")
    sys.exit(77)

STRATA = os.path.join(BUILD, "strata")
STRATAD = os.path.join(BUILD, "daemon", "stratad")
CTL = os.path.join(BUILD, "tools", "stratactl")
MKMODEL = os.path.join(BUILD, "tools", "strata-mkmodel")

tmp = tempfile.mkdtemp(prefix="strata-budget-")
cg = os.path.join(CG_ROOT, f"strata-test-{os.getpid()}")
model = os.path.join(tmp, "m.gguf")
sock = os.path.join(tmp, "s.sock")
daemon = None
failed = False


def check(name, ok, detail=""):
    global failed
    print(("ok " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    failed |= not ok


def into_cgroup():
    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def cgread(name):
    with open(os.path.join(cg, name)) as f:
        return int(f.read())


try:
    subprocess.run([MKMODEL, "--shape", "llama-1b", "--layers", "8", "--vocab", "8000",
                    "--type", "q4_0", "-o", model], check=True, capture_output=True)
    size = os.path.getsize(model)
    budget = size // 2
    limit = budget + OVERHEAD
    # The model file was just written: its page cache belongs to us, not the
    # cgroup, and nothing in the cgroup reads it through the page cache.
    os.mkdir(cg)
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    daemon = subprocess.Popen([STRATAD, "--socket", sock, "--budget", str(budget), model],
                              preexec_fn=into_cgroup, stderr=subprocess.PIPE)
    end = time.monotonic() + 30
    while not os.path.exists(sock) and daemon.poll() is None and time.monotonic() < end:
        time.sleep(0.02)  # waiting for the socket to appear, with a deadline
    r = subprocess.run([STRATA, "run", "-m", model, "--pager", sock, "-p", "Once upon a time",
                        "-n", "16", "-c", "256", "--temp", "0"], preexec_fn=into_cgroup,
                       capture_output=True, text=True, timeout=300)
    st = json.loads(subprocess.run([CTL, "--socket", sock, "status", "--json"],
                                   capture_output=True, text=True).stdout)["models"][0]
    peak = cgread("memory.max_usage_in_bytes")
    streamed = sum(1 for l in st["layers"] if l["state"] != "resident")
    print(f"model {size >> 20} MiB, budget {budget >> 20} MiB, cgroup limit {limit >> 20} MiB, "
          f"peak {peak >> 20} MiB, {st['resident_layers_planned']} of {len(st['layers'])} "
          f"layers resident, {st['bytes_read'] >> 20} MiB read")
    check("the engine generated its tokens", r.returncode == 0 and "generated 16 tokens" in r.stderr,
          f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
    check("some layers streamed", streamed > 0, f"{streamed}")
    check("the daemon is alive", daemon.poll() is None)
    check("peak usage stayed under the limit", peak < limit, f"{peak} >= {limit}")
    check("no allocation failed in the cgroup", cgread("memory.failcnt") == 0,
          str(cgread("memory.failcnt")))
finally:
    if daemon and daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)
    subprocess.run(["rm", "-rf", tmp])
    if os.path.isdir(cg):
        # empty the cgroup (our children are gone) and remove it
        os.rmdir(cg)
sys.exit(1 if failed else 0)
