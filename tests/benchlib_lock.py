#!/usr/bin/env python3
"""tools/benchlib.py's bench_lock, on a lock file of the test's own: it takes
the lock, waits while another process holds it, and exits with one line
instead of waiting forever when the script runs under an outer flock(1) of
the same file (with the file inherited, and with flock -o, which closes it
before the command runs)."""
import os, subprocess, sys, tempfile

tools = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
tmp = tempfile.mkdtemp(prefix="strata-benchlib-")
lock = os.path.join(tmp, "bench.lock")
script = os.path.join(tmp, "measure.py")
with open(script, "w") as f:
    f.write(f"""import sys
sys.path.insert(0, {tools!r})
import benchlib
benchlib.LOCK = {lock!r}
with benchlib.bench_lock():
    print("held by", sorted(benchlib.lock_holders()))
""")
failed = checks = 0


def check(what, ok, r):
    global failed, checks
    checks += 1
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        print(f"  exit {r.returncode}\n  stdout {r.stdout!r}\n  stderr {r.stderr!r}")
        failed += 1


def run(*pre, **kw):
    return subprocess.run([*pre, sys.executable, script], capture_output=True, text=True,
                          timeout=60, **kw)


r = run()
check("free: taken, held by the script itself", r.returncode == 0 and r.stdout.startswith("held by [")
      and r.stderr == "", r)
for pre in (["flock", lock], ["flock", "-o", lock]):
    r = run(*pre)
    check(" ".join(pre[:-1]) + " outside: exits 1 with one line", r.returncode == 1 and
          r.stdout == "" and "without an outer flock" in r.stderr and
          len(r.stderr.splitlines()) == 1, r)

# another process holds it: the script says it waits, and gets it once freed
holder = subprocess.Popen(["flock", lock, "sh", "-c", "echo held; read x"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline() == "held\n"
waiter = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
# its "waiting" line comes once it found the lock taken (no sleep to hope on)
line = waiter.stderr.readline()
got_early = waiter.poll() is not None
holder.stdin.write("\n")
holder.stdin.close()
holder.wait(30)
out, err = waiter.communicate(timeout=60)
r = subprocess.CompletedProcess([], waiter.returncode, out, line + err)
check("held by another: waits, then takes it", line.startswith("waiting for ") and
      not got_early and waiter.returncode == 0 and out.startswith("held by ["), r)

for f in (script, lock):
    os.unlink(f)
os.rmdir(tmp)
print(f"{checks - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
