#!/usr/bin/env python3
"""Which plain mappings of a model ask for huge pages (MADV_HUGEPAGE).

A model whose weights fit in the memory the engine may use is read from
memory every token, and its mapping asks the kernel for 2 MiB folios mapped
whole (session.c, advise_huge_pages); weights that do not fit stream from the
file and keep the kernel's read-around.  `strata serve -m stories260K.gguf`
is started twice and, once /health says "ok" (it listens first and says
"loading" until the model is loaded), the model's mapping in /proc/PID/smaps
is read:

  fits     no memory limit: the mapping's VmFlags has "hg";
  streams  in a memory cgroup of LIMIT, under the weights plus the 64 MiB
           the engine keeps spare (WEIGHTS_SPARE): no "hg".

Both servers must come to "ok": the advice (or its absence) stops nothing.
Needs transparent huge pages in the kernel, and root with the v1 memory
controller; skips (77) otherwise.
"""
import http.client, json, os, re, subprocess, sys, time

from cgroup_util import CG_ROOT, need_memory_cgroup
from smaps_util import mappings

MiB = 1 << 20
LIMIT = 48 * MiB

STRATA = os.environ["STRATA_BIN"]
MODEL = os.path.join(os.environ["STRATA_FIXTURES"], "models", "stories260K.gguf")
if not os.path.exists(MODEL):
    print(f"SKIP: no fixture {MODEL}")
    sys.exit(77)
if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
    print("SKIP: this kernel has no transparent huge pages (MADV_HUGEPAGE is refused)")
    sys.exit(77)
need_memory_cgroup()

failed = False


def check(name, ok, detail=""):
    global failed
    print(("ok " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    failed |= not ok


def model_vmflags(pid):
    """The VmFlags of the mapping of MODEL in process pid, or None."""
    real = os.path.realpath(MODEL)
    return next((f.get("VmFlags") for path, f in mappings(pid) if path == real), None)


def serve(name, cgroup=None):
    """Start strata serve (in cgroup if given), wait until /health says it has
    loaded the model, and return (the model mapping's VmFlags, /health's
    last status)."""
    def into_cgroup():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    p = subprocess.Popen([STRATA, "serve", "-m", MODEL, "--port", "0", "-t", "1"],
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=into_cgroup if cgroup else None)
    try:
        line = p.stderr.readline()
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            check(name + ": serve starts", False, line + p.stderr.read())
            return None, None
        # it listens first and loads after: /health says "ok" once loaded
        deadline = time.time() + 60
        status = None
        while status != "ok" and time.time() < deadline and p.poll() is None:
            c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=60)
            c.request("GET", "/health")
            r = c.getresponse()
            body = r.read()
            status = json.loads(body).get("status") if r.status == 200 else r.status
            c.close()
            if status != "ok":
                time.sleep(0.05)
        return (model_vmflags(p.pid) if status == "ok" else None), status
    finally:
        p.terminate()
        p.wait(timeout=60)


flags, status = serve("fits")
check("fits: the model is mapped", flags is not None)
check("fits: its mapping asks for huge pages (VmFlags hg)", flags is not None and "hg" in flags,
      f"VmFlags {flags}")
check("fits: loaded, /health ok", status == "ok", f"{status}")

cg = os.path.join(CG_ROOT, f"strata-test-{os.getpid()}-hugepages")
os.mkdir(cg)
try:
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(LIMIT))
    flags, status = serve("streams", cg)
    check("streams: the model is mapped", flags is not None)
    check("streams: its mapping keeps read-around (no hg)", flags is not None and "hg" not in flags,
          f"VmFlags {flags}")
    check("streams: loaded, /health ok", status == "ok", f"{status}")
finally:
    os.rmdir(cg)

sys.exit(1 if failed else 0)
