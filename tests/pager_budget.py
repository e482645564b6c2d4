#!/usr/bin/env python3
"""The budget holds: a model twice the budget generates inside a memory cgroup.

A synthetic llama model (mostly layers) is served by stratad with --budget of
half its size and room for what the engine declares (its heap and KV cache:
ENGINE below); stratad and the engine both run inside a cgroup-v1 memory
cgroup whose limit is the budget plus what nobody declares (code, page
tables: OVERHEAD below).  The engine must generate all its tokens (no OOM
kill), the cgroup's peak usage must stay under the limit, and the limit must
never have been hit (failcnt: the kernel had to reclaim).  Three times:
`strata run --pager` (userfaultfd), plain `strata run` of the file in
stratad's FUSE mount, whose page cache the daemon keeps in budget, and
`strata run --pager` with no --budget: the daemon takes its budget from the
cgroup's limit.  A reader through the mount declares nothing, so there the
budget leaves its room out, as docs/cli.md tells users to (the cgroup's
limit is the same: the reader's heap is in it).  Needs root and the v1
memory controller; skips (77) otherwise.

The same check on an 8B-shaped model is a benchmark: tools/bench-pager.sh.
"""
import json, os, signal, subprocess, sys, tempfile, time

from cgroup_util import CG_ROOT, need_memory_cgroup

BUILD = os.environ["STRATA_BUILD"]
ENGINE = 64 << 20
OVERHEAD = 48 << 20

need_memory_cgroup()

STRATA = os.path.join(BUILD, "strata")
STRATAD = os.path.join(BUILD, "daemon", "stratad")
CTL = os.path.join(BUILD, "tools", "stratactl")
MKMODEL = os.path.join(BUILD, "tools", "strata-mkmodel")

tmp = tempfile.mkdtemp(prefix="strata-budget-")
cg = os.path.join(CG_ROOT, f"strata-test-{os.getpid()}")
model = os.path.join(tmp, "m.gguf")
sock = os.path.join(tmp, "s.sock")
mnt = os.path.join(tmp, "mnt")
failed = 0  # checks failed so far


def check(name, ok, detail=""):
    global failed
    print(("ok " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    failed += not ok


def into_cgroup():
    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def cgread(name):
    with open(os.path.join(cg, name)) as f:
        return int(f.read())


def serve_and_run(kind):
    """stratad (budget: half the model and the engine's room) and an engine in
    a fresh cgroup; the engine maps the model through the pager ("uffd",
    "auto": the budget from the cgroup) or the mount ("fuse": plain mmap)."""
    fuse = kind == "fuse"
    failed_before = failed
    os.mkdir(cg)
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    # The mount needs its staging buffers besides the streamed layers
    # (docs/design.md), so it streams through a window of one.  Its reader
    # declares nothing: a budget with the engine's room in it would let the
    # daemon's page cache and buffers take the room the reader's heap is in.
    args = ["--fuse", mnt, "--window", "1"] if fuse else []
    if kind != "auto":
        args += ["--budget", str(budget - ENGINE if fuse else budget)]
    # its log in a file: a pipe nobody reads would stop a chatty daemon
    log = open(os.path.join(tmp, f"stratad-{kind}.log"), "w+")
    daemon = subprocess.Popen([STRATAD, "--socket", sock, *args, model],
                              preexec_fn=into_cgroup, stderr=log)
    try:
        end = time.monotonic() + 30
        while not os.path.exists(sock) and daemon.poll() is None and time.monotonic() < end:
            time.sleep(0.02)  # waiting for the socket to appear, with a deadline
        src = ["-m", os.path.join(mnt, "m.gguf")] if fuse else ["-m", model, "--pager", sock]
        r = subprocess.run([STRATA, "run", *src, "-p", "Once upon a time", "-n", "16", "-c",
                            "256", "--temp", "0"], preexec_fn=into_cgroup, capture_output=True,
                           text=True, timeout=300)
        top = json.loads(subprocess.run([CTL, "--socket", sock, "status", "--json"],
                                        capture_output=True, text=True).stdout)
        st = top["models"][0]
        peak = cgread("memory.max_usage_in_bytes")
        failcnt = cgread("memory.failcnt")
        streamed = sum(1 for l in st["layers"] if l["state"] != "resident")
        print(f"{kind}: model {size >> 20} MiB, budget {top['budget_bytes'] >> 20} MiB, cgroup limit "
              f"{limit >> 20} MiB, peak {peak >> 20} MiB, {st['resident_layers_planned']} of "
              f"{len(st['layers'])} layers resident, {st['bytes_read'] >> 20} MiB read")
        check(f"{kind}: the engine generated its tokens",
              r.returncode == 0 and "generated 16 tokens" in r.stderr,
              f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
        check(f"{kind}: some layers streamed", streamed > 0, f"{streamed}")
        check(f"{kind}: the daemon is alive", daemon.poll() is None)
        check(f"{kind}: peak usage stayed under the limit", peak < limit, f"{peak} >= {limit}")
        check(f"{kind}: no allocation failed in the cgroup", failcnt == 0, str(failcnt))
        if failed > failed_before:
            # what the memory was, for whoever reads the failure
            with open(os.path.join(cg, "memory.stat")) as f:
                ms = dict(l.split() for l in f)
            print(f"{kind}: the cgroup now: " + ", ".join(
                f"{k} {int(ms[k]) >> 20} MiB" for k in ("rss", "shmem", "cache", "mapped_file")))
            print(f"{kind}: the daemon held {st['memfd_bytes'] >> 20} MiB in its memfd, "
                  f"{st['slot_bytes'] >> 20} MiB in slots; allowance "
                  f"{st['allowance_bytes'] >> 20} MiB")
            log.seek(0)
            print(f"{kind}: the daemon's log, its end:\n" + "".join(log.readlines()[-20:]))
        if kind == "auto":
            b = top["budget"]
            check("auto: the budget is the cgroup's limit less the reserve",
                  b["source"] == "cgroup-v1" and
                  b["limit_bytes"] == cgread("memory.limit_in_bytes") and
                  top["budget_bytes"] == b["limit_bytes"] - b["reserve_bytes"] and
                  b["where"] == "/" + os.path.relpath(cg, CG_ROOT),
                  f"{top['budget']}, budget {top['budget_bytes']}")
        if fuse:
            readers = [c for c in st["clients"] if c["kind"] == "fuse"]
            check("fuse: status shows the mount's reader", len(readers) == 1 and
                  readers[0]["reads"] > 0, str(st["clients"]))
            check("fuse: streamed layers were dropped from the page cache after use",
                  sum(l["drops"] for l in st["layers"]) > 0, str(st["layers"]))
            check("fuse: memory held stays within the allowance",
                  st["memfd_bytes"] + st["page_cache_bytes"] <= max(st["allowance_bytes"], budget),
                  f"{st['memfd_bytes']} + {st['page_cache_bytes']}")
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(10)
        log.close()
        # empty the cgroup (our children are gone) and remove it
        os.rmdir(cg)


try:
    subprocess.run([MKMODEL, "--shape", "llama-1b", "--layers", "8", "--vocab", "8000",
                    "--type", "q4_0", "-o", model], check=True, capture_output=True)
    size = os.path.getsize(model)
    budget = size // 2 + ENGINE
    limit = budget + OVERHEAD
    # The model file was just written: its page cache belongs to us, not the
    # cgroup, and nothing in the cgroup reads it through the page cache (the
    # daemon reads with O_DIRECT).
    serve_and_run("uffd")
    if os.path.exists("/dev/fuse"):
        os.mkdir(mnt)
        serve_and_run("fuse")
    else:
        print("skip fuse: no /dev/fuse")
    serve_and_run("auto")
finally:
    subprocess.run(["rm", "-rf", tmp])
sys.exit(1 if failed else 0)
