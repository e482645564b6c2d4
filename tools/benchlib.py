"""What the benchmark scripts share: where the programs are, dropping the
page cache, a daemon's status, starting a daemon and waiting for it, a
decode benchmark through a daemon, sizes written as 2G or 512M, and a
memory cgroup (v1) to run in."""
import json
import os
import signal
import subprocess
import sys
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


def drop_caches():
    """Write back and drop the page cache (root)."""
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def status(sock):
    """The daemon's `stratactl status --json`, or None while it does not answer."""
    r = subprocess.run([CTL, "--socket", sock, "status", "--json"], capture_output=True, text=True)
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


def size(s):
    """"2G", "512M", "64K" or bytes -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def bench_paged(model, daemon_args, loaded, tokens, threads, preexec_fn=None):
    """stratad DAEMON_ARGS MODEL on a socket of its own and, once loaded(status)
    holds, `strata bench --pager -p 0 -n TOKENS` (one warm-up token first),
    both with preexec_fn (e.g. entering a cgroup).  Returns strata bench's
    JSON and the daemon's status before and after it."""
    sock = f"/tmp/strata-bench-{os.getpid()}.sock"
    d = subprocess.Popen([STRATAD, "--socket", sock, *daemon_args, model],
                         stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
    end = time.monotonic() + 180
    while time.monotonic() < end:
        st = status(sock)
        if st and loaded(st):
            break
        if d.poll() is not None:
            sys.exit("stratad exited: " + d.stderr.read())
        time.sleep(0.05)  # polling a condition with a deadline
    before = status(sock)
    r = subprocess.run([STRATA, "bench", "-m", model, "--pager", sock, "-p", "0", "-n",
                        str(tokens), "-c", "64", "-b", "32", "-t", str(threads), "--no-hw",
                        "--json"], capture_output=True, text=True, preexec_fn=preexec_fn)
    after = status(sock)
    d.send_signal(signal.SIGTERM)
    d.wait(30)
    if r.returncode:
        sys.exit("strata bench failed: " + r.stderr)
    return json.loads(r.stdout), before, after


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
