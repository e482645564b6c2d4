"""What the benchmark scripts share: where the programs are, the machine's
benchmark lock, dropping the page cache, a daemon's status, starting a daemon
and waiting for it, a decode benchmark through a daemon, llama.cpp's
llama-bench, sizes written as 2G or 512M, and a memory cgroup (v1) to run in."""
import contextlib
import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the build whose programs run: build/, or STRATA_BUILD (e.g. another commit's
# build beside this one's, or a build that is not benchmarked while it compiles)
BUILD = os.environ.get("STRATA_BUILD") or os.path.join(ROOT, "build")
STRATA = os.path.join(BUILD, "strata")
STRATAD = os.path.join(BUILD, "daemon", "stratad")
CTL = os.path.join(BUILD, "tools", "stratactl")
IOBENCH = os.path.join(BUILD, "tools", "strata-iobench")
MKMODEL = os.path.join(BUILD, "tools", "strata-mkmodel")


def program(path, build=None):
    """A program of BUILD, a build directory (e.g. another commit's), or of
    the default build: program("daemon/stratad", build)."""
    return os.path.join(build or BUILD, path)

# flock(1)'s lock file: whoever measures speed on this shared machine holds it
LOCK = "/tmp/strata-bench.lock"


def lock_holders():
    """Pids holding a flock on LOCK (from /proc/locks)."""
    try:
        st = os.stat(LOCK)
    except FileNotFoundError:
        return set()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = set()
    for line in open("/proc/locks"):
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:1f:5678 0 EOF" ("->" before a waiter's type)
        if "FLOCK" in f and dev in f:
            pids.add(int(f[f.index(dev) - 1]))
    return pids


def ancestors():
    """This process's parent, its parent, ... up to pid 1."""
    pid, out = os.getpid(), []
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the name
        out.append(pid)
    return out


@contextlib.contextmanager
def bench_lock():
    """Hold LOCK (exclusive) for one measurement: one engine's run with what
    it needs just before (dropping or warming the page cache), so that other
    sessions measure between this script's runs and no one's run shares the
    machine.  A script run under an outer `flock LOCK ...` would wait for its
    own parent forever: it exits saying so instead."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if lock_holders() & set(ancestors()):
                sys.exit(f"{os.path.basename(sys.argv[0])}: takes {LOCK} itself, run by run: "
                         "run it without an outer flock")
            print(f"waiting for {LOCK}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def drop_caches():
    """Write back and drop the page cache (root)."""
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def status(sock, build=None):
    """The daemon's `stratactl status --json`, or None while it does not answer
    (stratactl of BUILD, a build directory, if given: it speaks its daemon's
    protocol)."""
    r = subprocess.run([program("tools/stratactl", build), "--socket", sock, "status", "--json"],
                       capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None


def start_daemon(sock, args, preexec_fn=None, stderr=subprocess.DEVNULL, timeout=60):
    """stratad --socket sock ARGS..., returned once its status answers."""
    d = subprocess.Popen([STRATAD, "--socket", sock, *args], preexec_fn=preexec_fn,
                         stderr=stderr, text=True)
    end = time.monotonic() + timeout
    while status(sock) is None:
        if d.poll() is not None or time.monotonic() > end:
            if stderr == subprocess.PIPE and d.poll() is not None:
                sys.exit("stratad did not come up: " + d.stderr.read())
            sys.exit("stratad did not come up" +
                     (f": see {stderr.name}" if isinstance(getattr(stderr, "name", None), str)
                      else ""))
        time.sleep(0.02)  # polling the socket with a deadline
    return d


def llama_spec(spec):
    """"NAME=PATH[:LIBDIR]" -> (NAME, PATH, LIBDIR or None)."""
    name, _, rest = spec.partition("=")
    path, _, lib = rest.partition(":")
    if not name or not path:
        sys.exit(f"--llama {spec}: expected NAME=PATH[:LIBDIR]")
    return name, path, lib or None


def llama_bench(path, model, prompt, tokens, threads, libdir=None, preexec_fn=None):
    """llama.cpp's `PATH -m MODEL -p PROMPT -n TOKENS -r 1 -t THREADS -o json`
    (llama-bench; with LIBDIR its ggml libraries from there first: e.g. a
    libggml-cpu.so built with GGML_CPU_REPACK=OFF, whose weights stay in the
    mapped file).  Returns ({"prompt": tok/s, "decode": tok/s} of the parts
    asked for, None) or (None, why it failed): a build that dies on this CPU
    (SIGILL), or the OOM killer of a cgroup it runs in."""
    env = dict(os.environ, LD_LIBRARY_PATH=libdir) if libdir else None
    r = subprocess.run([path, "-m", model, "-p", str(prompt), "-n", str(tokens), "-r", "1",
                        "-t", str(threads), "-o", "json"], capture_output=True, text=True,
                       env=env, preexec_fn=preexec_fn)
    if r.returncode:
        why = (f"killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0
               else f"exit status {r.returncode}")
        return None, f"{why} {r.stderr.strip()[-300:]}".strip()
    out = {}
    for row in json.loads(r.stdout):
        out["prompt" if row["n_prompt"] else "decode"] = row["avg_ts"]
    return out, None


def warm(path):
    """Read path into the page cache."""
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def size(s):
    """"2G", "512M", "64K" or bytes -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def context(tokens):
    """The context `strata bench` needs to decode TOKENS after its warm-up
    token: 64, or more for a longer run."""
    return max(64, tokens + 1)


def cores_loaded(st):
    """loaded() for bench_paged with a mixture of experts: unit 0 and every
    layer's core resident (the experts come as they are routed to)."""
    m = st["models"][0]
    return m["other"]["state"] == "resident" and all(l["state"] == "resident" for l in m["layers"])


def bench_paged(model, daemon_args, loaded, tokens, threads, preexec_fn=None, build=None,
                on_start=None, engine_args=()):
    """stratad DAEMON_ARGS MODEL on a socket of its own and, once loaded(status)
    holds, `strata bench --pager -p 0 -n TOKENS ENGINE_ARGS` (one warm-up
    token first), both with preexec_fn (e.g. entering a cgroup), the programs
    of BUILD (a build directory) if given; on_start(sock) is called as the
    engine starts.
    Returns strata bench's JSON and the daemon's status before and after it,
    and the CPU seconds (user and system, every thread) each process spent
    while the engine ran, with the wall seconds from the daemon's start until
    loaded(status) held: {"engine": s, "daemon": s, "ready": s}."""
    sock = f"/tmp/strata-bench-{os.getpid()}.sock"
    strata = program("strata", build)
    # the daemon's log to a file, read if it fails: a pipe nobody reads
    # while the engine runs would stop the daemon once it filled (64 KiB)
    log = tempfile.TemporaryFile(mode="w+")
    d = subprocess.Popen([program("daemon/stratad", build), "--socket", sock, *daemon_args, model],
                         stderr=log, text=True, preexec_fn=preexec_fn)
    start = time.monotonic()
    end = start + 180
    while time.monotonic() < end:
        st = status(sock, build)
        if st and loaded(st):
            break
        if d.poll() is not None:
            log.seek(0)
            sys.exit("stratad exited: " + "".join(log.readlines()[-20:]))
        time.sleep(0.05)  # polling a condition with a deadline
    ready = time.monotonic() - start
    before = status(sock, build)
    d_cpu, e_cpu = cpu_seconds(d.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    if on_start:
        on_start(sock)
    r = subprocess.run([strata, "bench", "-m", model, "--pager", sock, "-p", "0", "-n",
                        str(tokens), "-c", str(context(tokens)), "-b", "32", "-t", str(threads),
                        "--no-hw", "--json", *engine_args], capture_output=True, text=True,
                       preexec_fn=preexec_fn)
    after = status(sock, build)
    e = resource.getrusage(resource.RUSAGE_CHILDREN)  # strata bench, waited for
    cpu = {"daemon": cpu_seconds(d.pid) - d_cpu,
           "engine": e.ru_utime + e.ru_stime - e_cpu.ru_utime - e_cpu.ru_stime, "ready": ready}
    d.send_signal(signal.SIGTERM)
    d.wait(30)
    log.close()
    if r.returncode:
        sys.exit("strata bench failed: " + r.stderr)
    return json.loads(r.stdout), before, after, cpu


def cpu_seconds(pid):
    """User and system CPU seconds of a running process, all its threads
    (io_uring's workers too)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cgroup:
    """A memory cgroup (v1) of `limit` bytes that the caller's children
    enter (preexec_fn=cg.enter); remove() once they exited."""

    def __init__(self, limit, name):
        self.path = os.path.join("/sys/fs/cgroup/memory", f"{name}-{os.getpid()}")
        os.mkdir(self.path)
        self.write("memory.limit_in_bytes", limit)

    def write(self, name, v):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(v))

    def read(self, name):
        return int(open(os.path.join(self.path, name)).read())

    def oom_kills(self):
        """Processes the kernel's OOM killer killed in it."""
        for line in open(os.path.join(self.path, "memory.oom_control")):
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def enter(self):
        self.write("cgroup.procs", os.getpid())

    def remove(self):
        os.rmdir(self.path)
