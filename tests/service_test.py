#!/usr/bin/env python3
"""stratad as operators run it (docs/service.md).

  install   `meson install` into a staging directory puts every command, the
            systemd unit, the sysusers entry and the config file where
            systemd and users look; the unit passes `systemd-analyze verify`
            with nothing to warn about
  config    stratad started with only --config FILE serves the models and the
            socket the file names; a bad line is refused naming the line
  peers     who may connect (SO_PEERCRED, SO_PEERGROUPS): a process of another
            user is refused, one of another user in the --allow-group group
            is served, and the socket is rw for that group only

Needs root (to act as other users) and setpriv; skips (77) without them.
"""
import os, shutil, signal, stat, subprocess, sys, tempfile, time, grp

BUILD = os.environ["STRATA_BUILD"]
FIX = os.environ["STRATA_FIXTURES"]
STRATAD = os.path.join(BUILD, "daemon", "stratad")
CTL = os.path.join(BUILD, "tools", "stratactl")
MODEL = os.path.join(FIX, "models", "tiny-llama-q4_0.gguf")
NOBODY = 65534
failed = False


def check(name, ok, detail=""):
    global failed
    print(("ok " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    failed |= not ok


def wait_for(cond, what, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)  # polling a condition, with a deadline
    print(f"FAIL timed out waiting for {what}")
    return False


def case_install(tmp):
    stage = os.path.join(tmp, "stage")
    r = subprocess.run(["meson", "install", "-C", BUILD, "--destdir", stage, "--no-rebuild",
                        "--quiet"], capture_output=True, text=True)
    check("install: meson install into a staging directory", r.returncode == 0, r.stderr[-400:])
    prefix = subprocess.run(["meson", "introspect", BUILD, "--buildoptions"], capture_output=True,
                            text=True).stdout
    import json
    opts = {o["name"]: o["value"] for o in json.loads(prefix)}
    root = stage + opts["prefix"]
    want = [os.path.join(opts["bindir"], c) for c in
            ("strata", "stratad", "stratactl", "strata-mkmodel", "strata-repack", "strata-iobench")]
    want += ["lib/systemd/system/stratad.service", "lib/sysusers.d/strata.conf",
             os.path.join(opts["sysconfdir"], "strata", "stratad.conf")]
    for w in want:
        p = os.path.join(root, w) if not os.path.isabs(w) else stage + w
        ok = os.path.isfile(p) and (not ("/bin/" in p) or os.access(p, os.X_OK))
        check(f"install: {w}", ok, f"{p} missing")
    if not shutil.which("systemd-analyze"):
        print("skip install: systemd-analyze not found (apt-get install systemd)")
        return
    # verify resolves ExecStart on this machine's root: point the unit's
    # paths into the staging tree, nothing else changes
    unit = open(os.path.join(root, "lib/systemd/system/stratad.service")).read()
    os.makedirs(os.path.join(tmp, "units"))
    vunit = os.path.join(tmp, "units", "stratad.service")
    with open(vunit, "w") as f:
        f.write(unit.replace(opts["prefix"] + "/", root + "/"))
    r = subprocess.run(["systemd-analyze", "verify", vunit], capture_output=True, text=True)
    check("install: the unit passes systemd-analyze verify without warnings",
          r.returncode == 0 and not r.stderr.strip(), r.stderr.strip()[-400:])
    sysusers = open(os.path.join(root, "lib/sysusers.d/strata.conf")).read()
    check("install: the unit's user and group are created by sysusers",
          "u strata " in sysusers and "g strata " in sysusers and "User=strata" in unit and
          "Group=strata" in unit)
    conf = open(os.path.join(root, opts["sysconfdir"], "strata", "stratad.conf")).read()
    check("install: the config's socket is in the unit's runtime directory",
          "socket /run/strata/stratad.sock" in conf and "RuntimeDirectory=strata" in unit)


def start(args, tmp, sock):
    log = open(os.path.join(tmp, "stratad.log"), "w+")
    d = subprocess.Popen([STRATAD, *args], stderr=log)
    wait_for(lambda: os.path.exists(sock) or d.poll() is not None, "the socket")
    return d, log


def stop(d):
    if d.poll() is None:
        d.send_signal(signal.SIGTERM)
        d.wait(10)


def ctl_as(uid, gid, sock):
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", CTL,
                           "--socket", sock, "status", "--json"], capture_output=True, text=True,
                          timeout=30)


def case_config_and_peers(tmp):
    sock = os.path.join(tmp, "s.sock")
    group = grp.getgrgid(100).gr_name  # "users" on Debian; any group nobody is not in
    conf = os.path.join(tmp, "stratad.conf")
    with open(conf, "w") as f:
        f.write(f"# a comment\n\nsocket {sock}\n  budget 64M\nallow-group {group}\n"
                f"no-pressure\nio-cache {tmp}/io\nmodel {MODEL}\n")
    d, log = start(["--config", conf], tmp, sock)
    try:
        r = subprocess.run([CTL, "--socket", sock, "status", "--json"], capture_output=True,
                           text=True)
        import json
        try:
            st = json.loads(r.stdout)
        except ValueError:
            st = {}
        check("config: the daemon serves the config's model on its socket",
              d.poll() is None and st.get("models", [{}])[0].get("name") ==
              os.path.basename(MODEL), f"{r.stderr.strip()} {st}")
        check("config: and its budget", st.get("budget_bytes") == 64 << 20,
              str(st.get("budget_bytes")))
        s = os.stat(sock)
        check(f"peers: the socket is rw for {group} and nobody else",
              stat.S_IMODE(s.st_mode) == 0o660 and s.st_gid == 100, oct(s.st_mode))
        r = ctl_as(NOBODY, NOBODY, sock)
        check("peers: another user outside the group cannot open the socket",
              r.returncode != 0 and "Permission denied" in r.stderr, r.stderr.strip()[-200:])
        # the socket's mode is one wall; the daemon's own check of the
        # peer's credentials is the other, should the mode be opened up
        os.chmod(sock, 0o666)
        r = ctl_as(NOBODY, NOBODY, sock)
        print(f"  (stratactl said: {r.stderr.strip()})")
        check("peers: with the socket open to all, the daemon still refuses the stranger",
              r.returncode != 0 and '"models"' not in r.stdout, r.stdout[-200:])
        check("peers: and tells it why", "serves root, its own user and its group only"
              in r.stderr, r.stderr.strip()[-200:])
        check("peers: and says so in its log", wait_for(
            lambda: "refused a connection from uid 65534" in open(log.name).read(),
            "the refusal in the log", 10))
        r = ctl_as(NOBODY, 100, sock)
        check(f"peers: another user in {group} is served",
              r.returncode == 0 and '"models"' in r.stdout, r.stderr.strip()[-200:])
        check("peers: the daemon goes on", d.poll() is None)
    finally:
        stop(d)
    # a bad config: one line naming the file and line, exit 1
    with open(conf, "w") as f:
        f.write(f"socket {sock}\nbudgett 64M\nmodel {MODEL}\n")
    r = subprocess.run([STRATAD, "--config", conf], capture_output=True, text=True, timeout=30)
    check("config: an unknown setting is refused naming its line",
          r.returncode == 1 and f"{conf}:2: unknown setting 'budgett'" in r.stderr and
          len(r.stderr.strip().splitlines()) == 1, r.stderr)
    with open(conf, "w") as f:
        f.write(f"socket\n")
    r = subprocess.run([STRATAD, "--config", conf], capture_output=True, text=True, timeout=30)
    check("config: a setting without its value is refused",
          r.returncode == 1 and f"{conf}:1: needs a value: 'socket'" in r.stderr, r.stderr)
    r = subprocess.run([STRATAD, "--config", os.path.join(tmp, "none.conf")],
                       capture_output=True, text=True, timeout=30)
    check("config: a missing file is refused", r.returncode == 1 and "none.conf" in r.stderr,
          r.stderr)


def main():
    if os.geteuid() != 0:
        print("skip: needs root to act as other users")
        sys.exit(77)
    if not shutil.which("setpriv"):
        print("skip: setpriv not found (util-linux)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="strata-service-")
    os.chmod(tmp, 0o755)  # other users reach the socket through it
    try:
        r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            CTL, "--help"], capture_output=True)
        if r.returncode != 0:
            print(f"skip: user {NOBODY} cannot run {CTL} (a directory above it is private)")
            sys.exit(77)
        case_install(tmp)
        case_config_and_peers(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if failed else 0)


main()
