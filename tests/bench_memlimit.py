#!/usr/bin/env python3
"""strata bench does not kill itself under a memory limit.

`strata bench -m stories260K.gguf -p 8 -n 8 --json` runs in a fresh cgroup-v1
memory cgroup whose limit leaves no room for the 1 GiB memory-bandwidth
probe, three times:

  small   NEEDS + 300 MiB: half of what is left is under the probe's 256 MiB
          floor, so the probe is skipped: mem_read_gbps null, the reason in
          mem_read_error, and a notice on stderr;
  medium  NEEDS + 900 MiB: the probe runs over a smaller buffer
          (mem_read_bytes from 256 MiB to under 1 GiB), the paired tokens too;
  pager   the small limit with stratad serving the model from inside the same
          cgroup and bench reading it through --pager (the issue's case).

NEEDS is what bench takes besides the probe (about 4 MiB of RSS with this
model, 16 MiB for the storage probe's reads) with room to spare.  Each run
must exit 0 with its decode numbers, not be OOM-killed (memory.oom_control)
and never reach the limit (memory.failcnt 0).  Before the probe was fitted to
the limit, each run was OOM-killed by its own 1 GiB buffer.  Needs root and
the v1 memory controller; skips (77) otherwise.
"""
import json, os, shutil, signal, subprocess, sys, tempfile, time

from cgroup_util import CG_ROOT, need_memory_cgroup

MiB = 1 << 20
NEEDS = 32 * MiB

need_memory_cgroup()

BUILD = os.environ["STRATA_BUILD"]
STRATA = os.environ["STRATA_BIN"]
STRATAD = os.path.join(BUILD, "daemon", "stratad")
MODEL = os.path.join(os.environ["STRATA_FIXTURES"], "models", "stories260K.gguf")
if not os.path.exists(MODEL):
    print(f"SKIP: no fixture {MODEL}")
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="strata-memlimit-")
failed = False


def check(name, ok, detail=""):
    global failed
    print(("ok " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    failed |= not ok


def run_in_cgroup(kind, limit, pager):
    cg = os.path.join(CG_ROOT, f"strata-test-{os.getpid()}-{kind}")
    os.mkdir(cg)
    daemon = None

    def into_cgroup():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def cgread(name):
        with open(os.path.join(cg, name)) as f:
            return f.read()

    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        src = ["-m", MODEL]
        if pager:
            sock = os.path.join(tmp, "s.sock")
            daemon = subprocess.Popen([STRATAD, "--socket", sock, MODEL],
                                      preexec_fn=into_cgroup, stderr=subprocess.DEVNULL)
            end = time.monotonic() + 30
            while not os.path.exists(sock) and daemon.poll() is None and time.monotonic() < end:
                time.sleep(0.02)  # waiting for the socket to appear, with a deadline
            src += ["--pager", sock]
        r = subprocess.run([STRATA, "bench", *src, "-p", "8", "-n", "8", "--json"],
                           preexec_fn=into_cgroup, capture_output=True, text=True, timeout=300)
        oom_kills = [int(l.split()[1]) for l in cgread("memory.oom_control").splitlines()
                     if l.startswith("oom_kill ")]
        failcnt = int(cgread("memory.failcnt"))
        peak = int(cgread("memory.max_usage_in_bytes"))
        print(f"{kind}: limit {limit // MiB} MiB, peak {peak // MiB} MiB, exit {r.returncode}, "
              f"failcnt {failcnt}, oom kills {oom_kills}")
        for line in r.stderr.splitlines():
            print(f"{kind}: stderr: {line}")
        check(f"{kind}: bench exits 0", r.returncode == 0,
              f"exit {r.returncode}" + (" (killed: SIGKILL, the OOM killer)"
                                        if r.returncode == -signal.SIGKILL else ""))
        check(f"{kind}: nothing in the cgroup was OOM-killed", oom_kills == [0], str(oom_kills))
        check(f"{kind}: the limit was never reached", failcnt == 0, str(failcnt))
        if pager:
            check(f"{kind}: the daemon is alive", daemon.poll() is None)
        try:
            d = json.loads(r.stdout)
        except ValueError:
            check(f"{kind}: one JSON object on stdout", False, r.stdout[-300:])
            return None
        check(f"{kind}: the decode numbers are there",
              d["decode_tps"] > 0 and d["prompt_tps"] > 0 and d["n_decode"] == 8, str(d))
        return d, r.stderr
    finally:
        if daemon and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(10)
        # Our children are gone: the cgroup is empty.  A process the kernel
        # is still tearing down can hold it a moment.
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)


def skipped(kind, res):
    if not res:
        return
    d, err = res
    reason = d.get("mem_read_error") or ""
    check(f"{kind}: the memory probe was skipped, saying why",
          d["mem_read_gbps"] is None and reason.startswith("not measured:")
          and "MiB" in reason and d["decode_bound_tps"] is None and d["paired_tokens"] == 0,
          str(d))
    check(f"{kind}: a one-line notice on stderr",
          any(l.startswith("strata: bench: memory read not measured:") for l in err.splitlines()),
          err)


try:
    skipped("small", run_in_cgroup("small", NEEDS + 300 * MiB, pager=False))
    res = run_in_cgroup("medium", NEEDS + 900 * MiB, pager=False)
    if res:
        d = res[0]
        check("medium: the memory probe ran over a smaller buffer",
              d["mem_read_gbps"] and d["mem_read_gbps"] > 0 and d["mem_read_error"] is None
              and 256 * MiB <= d["mem_read_bytes"] < 1024 * MiB, str(d))
        check("medium: the paired tokens ran too",
              d["paired_tokens"] == 8 and d["paired_fraction"] > 0, str(d))
    skipped("pager", run_in_cgroup("pager", NEEDS + 300 * MiB, pager=True))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failed else 0)
