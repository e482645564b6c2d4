"""What the benchmark scripts share: where the programs are, dropping the
page cache, a daemon's status, starting a daemon and waiting for it, and
sizes written as 2G or 512M."""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
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
