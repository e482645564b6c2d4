#!/usr/bin/env python3
"""stratad and strata --pager, as users rely on them.

  identical   every fixture model (the older ones and those of fixtures/arch
              strata runs) gives bit-identical `strata eval` logits with
              and without the pager, with every layer, half and none resident
  share       two engines on one model share its pages (one copy in memory)
  share-streaming  two engines streaming one model at once through the slots
              get bit-identical logits
  slow-remaps  an engine streaming under a tight budget beside a client that
              answers its REMAPs late: a layer it faults on waits for a slot
              on its way, never read into the memfd past the allowance;
              logits bit-identical
  stalled-remaps  the same beside a client that never answers: it is
              dropped once it has held a REMAP 5 s while the engine waited;
              the engine finishes bit-identical
  garbage     clients sending garbage, truncated messages or stray file
              descriptors are dropped; the daemon keeps serving
  kill-engine killing an engine mid-run leaves the daemon serving the next one
  kill-daemon killing the daemon makes the engine exit non-zero within a second
              with a message
  stale       a stale socket left by a killed daemon is replaced; a live one is
              refused; SIGTERM removes the socket
  unreadable  a model file truncated under the daemon: the engine stops with the
              daemon's reason, the daemon keeps serving
  fuse        every fixture through `stratad --fuse`: the mounted files have the
              exact bytes, and `strata eval` on them (plain mmap, no --pager)
              gives bit-identical logits; SIGTERM unmounts
  fuse-mixed  an engine through userfaultfd and one reading through the mount
              on the same model at once: both bit-identical, the memfd and
              the page cache together within one budget, and either one
              leaving first leaves the daemon serving
  warm        an engine started after another exits finds every layer planned
              resident still in memory: none is read again
  spec        a speculating engine's tokens per pass are shown by stratactl
  accounting  an engine's KV cache and buffers are declared, shown by stratactl
              and taken from the budget
  io-probe    the reader's request size and depth: the defaults for models too
              small to measure, set by hand, measured (--probe-io) and
              remembered per device in the cache file, whose bad lines are
              ignored
  experts     a mixture of experts an expert at a time: a budget that evicts
              experts; logits bit-identical to mmap, with the lookahead's
              reads ahead (--lookahead) and without (the default: no hint
              sent), the
              expert cache in the status; with --populate the cache's
              slots made before any read, every expert read into one; a
              HINT reads its experts before any fault; hostile ROUTEs and
              HINTs dropped
  experts-shed  SIGUSR1 while an engine streams a mixture of experts whose
              cache is full, in slots: the cache shrinks to one layer's
              experts (evicted, slots punched), the engine runs on, results
              stay bit-identical; SIGUSR2 restores the capacity
  shed        SIGUSR1 (the memory-pressure path) demotes resident layers while
              an engine runs; they are evicted, results stay bit-identical;
              SIGUSR2 restores them

Fault injection (docs/security.md), the model served from faultfs (a FUSE
filesystem in tests/faultfs.c that fails reads on command) where the disk is
the fault:
  read-error  reads failing with EIO in the middle of streaming: the engine
              stops with the daemon's reason (exit 2), never computes on
              zeros; the daemon keeps serving once the disk recovers
  short-read  a read returning fewer bytes than asked: the rest is read,
              logits bit-identical
  early-eof   a file whose reads end before its size: a clear error, never
              zero-filled weights
  changed     the model file written in place while served: detected, the
              streaming engine told, new clients refused with the reason,
              the daemon serves its other models; a file replaced by a
              rename keeps being served from the intact old inode
  restart     the daemon SIGKILLed mid-token with a socket and a mount: the
              engine exits within a second, and a restarted daemon clears the
              stale socket and mount and serves new clients
  late-guardian  the killed daemon's guardian held back until the next daemon
              has mounted (on the freed connection number): the new mount
              keeps serving reads
  kill-streaming  of two engines streaming one model, one SIGKILLed while it
              faults: its pages and slots are reclaimed, the other finishes
              bit-identical
  hostile     a malicious client: out-of-range and huge counts and lengths,
              several file descriptors, messages out of order, after READY
              too (a real userfaultfd session): each dropped and logged, the
              daemon unaffected
  peercred    a client of another user (nobody) is refused by SO_PEERCRED
              and logged; a same-user client is served

Every wait is for a condition (a status field, a line of output, a process
exit) with a deadline, never a fixed sleep (slow-remaps' late client sleeps
to be late, which is what it tests).

usage: pager_test.py [CASE ...]   (none: every case but the fault-injection
       ones; "faults": those)
"""
import json, os, signal, socket, struct, subprocess, sys, tempfile, threading, time

from smaps_util import mappings

BUILD = os.environ["STRATA_BUILD"]
FIX = os.environ["STRATA_FIXTURES"]
# the wire's version, as the C both sides are built from says it
with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pager",
                       "proto_i.h")) as f:
    PROTO_VERSION = int(next(l.split()[2] for l in f if l.startswith("#define PROTO_VERSION ")))
STRATA = os.path.join(BUILD, "strata")
STRATAD = os.path.join(BUILD, "daemon", "stratad")
CTL = os.path.join(BUILD, "tools", "stratactl")
MKMODEL = os.path.join(BUILD, "tools", "strata-mkmodel")
FAULTFS = os.path.join(BUILD, "tests", "faultfs")
MODELS = sorted(f for f in os.listdir(os.path.join(FIX, "models")) if f.endswith(".gguf"))
# The newer architectures (fixtures/arch), the mixture of experts among them.
ARCH_MODELS = ["tiny-qwen3-q4_k_m.gguf", "tiny-gemma2-q4_k_m.gguf", "tiny-gemma3-q4_k_m.gguf",
               "tiny-gemma3-q8_0.gguf", "tiny-phi3-q4_k_m.gguf", "tiny-qwen35-q4_k_m.gguf",
               "tiny-llama-bf16.gguf", "tiny-qwen3moe-q4_k_m.gguf"]
MODEL_DIR = {m: os.path.join(FIX, "models") for m in MODELS}
MODEL_DIR.update({m: os.path.join(FIX, "arch", "models") for m in ARCH_MODELS
                  if os.path.exists(os.path.join(FIX, "arch", "models", m))})
MODELS = sorted(MODEL_DIR)


def path_of(m):
    return os.path.join(MODEL_DIR[m], m)

if not os.path.exists("/dev/userfaultfd") and not os.path.exists("/proc/sys/vm/unprivileged_userfaultfd"):
    print("SKIP: this kernel has no userfaultfd")
    sys.exit(77)

TMP = tempfile.mkdtemp(prefix="strata-pager-test-")
failures = []


def check(name, ok, detail=""):
    print(("ok " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(name)


def wait_for(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)  # polling a condition with a deadline
    raise TimeoutError(what)


class Daemon:
    def __init__(self, models, *args, sock=None):
        self.sock = sock or os.path.join(TMP, f"d{time.monotonic_ns()}.sock")
        self.log = open(os.path.join(TMP, "stratad.log"), "ab")
        self.p = subprocess.Popen([STRATAD, "--socket", self.sock, *args, *models],
                                  stdout=self.log, stderr=self.log)
        wait_for(lambda: os.path.exists(self.sock) or self.p.poll() is not None, 10,
                 "daemon socket")
        if self.p.poll() is not None:
            raise RuntimeError("stratad exited at start")
        wait_for(self.status, 10, "daemon status")

    def status(self):
        r = subprocess.run([CTL, "--socket", self.sock, "status", "--json"],
                           capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def model(self, name):
        return next(m for m in self.status()["models"] if m["name"] == name)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(10)
        self.log.close()


def tokens_of(name):
    ref_dir = os.path.join(os.path.dirname(MODEL_DIR[name]), "ref")
    ref = json.load(open(os.path.join(ref_dir, name.replace(".gguf", ".json"))))
    return ",".join(map(str, ref["prompt_tokens"] + ref["greedy_tokens"]))


def eval_cmd(model, toks, out, sock=None, opts=()):
    cmd = [STRATA, "eval", "-m", model, "--tokens", toks, "--logits-out", out, *opts]
    if sock:
        cmd += ["--pager", sock]
    return cmd


def run_eval(model, toks, out, sock=None, opts=()):
    return subprocess.run(eval_cmd(model, toks, out, sock, opts), capture_output=True, text=True,
                          timeout=120)


def case_identical():
    paths = [path_of(m) for m in MODELS]
    plain = {}
    for m, p in zip(MODELS, paths):
        out = os.path.join(TMP, m + ".plain")
        r = run_eval(p, tokens_of(m), out)
        check(f"identical: plain eval {m}", r.returncode == 0, r.stderr)
        plain[m] = open(out, "rb").read()
    for label, args in (("all resident", ["--resident", "1000"]),
                        ("half resident", None),
                        ("none resident", ["--resident", "0"])):
        for m, p in zip(MODELS, paths):
            a = args
            if a is None:
                n_layers = None
                d0 = Daemon([p], "--resident", "0")
                n_layers = len(d0.model(m)["layers"])
                d0.stop()
                a = ["--resident", str(n_layers // 2)]
            d = Daemon([p], *a)
            out = os.path.join(TMP, m + ".paged")
            r = run_eval(p, tokens_of(m), out, d.sock)
            st = d.model(m)
            d.stop()
            same = r.returncode == 0 and open(out, "rb").read() == plain[m]
            streamed = sum(1 for l in st["layers"] if l["loads"] > 0 and l["state"] != "resident")
            check(f"identical: {m} {label}", same,
                  r.stderr.strip() or "logits differ from the plain mmap run")
            if "experts" in st:
                # a mixture of experts: its cores stay resident, its experts
                # come and go an expert at a time (case experts)
                if label != "all resident":
                    ex = st["experts"]
                    check(f"identical: {m} {label}: experts evicted and read again",
                          ex["evictions"] > 0 and ex["loads"] > ex["evictions"], str(ex))
                continue
            if label == "none resident":
                check(f"identical: {m} {label} streamed every layer",
                      streamed == len(st["layers"]), f"{streamed} of {len(st['layers'])}")
            if label != "all resident":
                check(f"identical: {m} {label}: streamed layers went through the slots",
                      st["slot_loads"] > 0 and 0 < st["slot_bytes"] <= st["slots"] *
                      max(l["bytes"] for l in st["layers"]), str(st["slot_loads"]))


def long_model(layers=None):
    """A model big enough that a run lasts a while (seconds, not ms): the
    small shape, with `layers` layers in place of its 12 if given."""
    path = os.path.join(TMP, f"small-q4_0-{layers}.gguf" if layers else "small-q4_0.gguf")
    if not os.path.exists(path):
        more = ["--layers", str(layers)] if layers else []
        subprocess.run([MKMODEL, "--shape", "small", "--type", "q4_0", *more, "-o", path],
                       check=True, capture_output=True)
    return path


def start_engine(model, sock, n=4000, extra=()):
    return subprocess.Popen([STRATA, "run", "-m", model, "--pager", sock, "-p", "hello",
                             "-n", str(n), "-c", "2048", "--temp", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def first_output(p, timeout=60):
    """Block until the engine printed generated text (it is mid-run)."""
    os.set_blocking(p.stdout.fileno(), True)
    return wait_for(lambda: p.stdout.read(1) or p.poll() is not None, timeout, "engine output")


def mapping_rss_pss(pid, name):
    """Rss and Pss (kB) of the process's mappings of the memfd called name."""
    ours = [f for path, f in mappings(pid) if f"memfd:{name}" in path]
    return sum(int(f["Rss"][0]) for f in ours), sum(int(f["Pss"][0]) for f in ours)


def case_share():
    m = long_model()
    d = Daemon([m], "--resident", "1000")
    a = start_engine(m, d.sock)
    b = start_engine(m, d.sock)
    first_output(a)
    first_output(b)
    st = d.model(os.path.basename(m))
    shared = [mapping_rss_pss(p.pid, os.path.basename(m)) for p in (a, b)]
    for p in (a, b):
        p.kill()
        p.wait()
    d.stop()
    check("share: two clients attached", len(st["clients"]) == 2, str(st["clients"]))
    check("share: one copy resident", st["resident_bytes"] <= os.path.getsize(m) + 2 * 4096 * 64,
          f"{st['resident_bytes']} bytes for a {os.path.getsize(m)}-byte model")
    check("share: both engines map the same pages (Pss about half of Rss)",
          all(rss > 0 and pss * 10 < rss * 6 for rss, pss in shared), str(shared))


def case_share_streaming():
    """Two engines streaming one model at once, one layer resident: each
    streamed layer's slot is mapped into both (each answers its own REMAPs);
    both get the plain run's logits bit for bit."""
    m = long_model()
    toks = ",".join(str(i) for i in range(1, 25))
    plain = os.path.join(TMP, "sharestream.plain")
    run_eval(m, toks, plain)
    d = Daemon([m], "--resident", "1")
    outs = [os.path.join(TMP, f"sharestream.{i}") for i in range(2)]
    ps = [subprocess.Popen([STRATA, "eval", "-m", m, "--tokens", toks, "--logits-out", o,
                            "--pager", d.sock], stderr=subprocess.PIPE, text=True) for o in outs]
    errs = [p.communicate(timeout=120)[1] for p in ps]
    st = d.model(os.path.basename(m))
    d.stop()
    want = open(plain, "rb").read()
    check("share-streaming: both engines match the plain run",
          all(p.returncode == 0 for p in ps) and all(open(o, "rb").read() == want for o in outs),
          " ".join(errs))
    check("share-streaming: the layers streamed through the slots", st["slot_loads"] > 0,
          str(st["slot_loads"]))


def beside_late_client(tag, delay):
    """An engine streaming under a tight budget beside a hand-made client
    that carries out each REMAP `delay` seconds after it came (None: never).
    Returns the engine's run, the model's status before and after it, how
    many REMAPs the late client answered, whether the daemon still serves
    it, and the plain run's logits file."""
    # layers (32 MiB) larger than the rest of the allowance below, the
    # embedding's block cache (9 MiB) and half a layer
    m = os.path.join(TMP, "llama-1b-8.gguf")
    if not os.path.exists(m):
        subprocess.run([MKMODEL, "--shape", "llama-1b", "--layers", "8", "--vocab", "8000",
                        "--type", "q4_0", "-o", m], check=True, capture_output=True)
    name = os.path.basename(m)
    toks = "1,2,3,4"
    plain = os.path.join(TMP, f"{tag}.plain")
    run_eval(m, toks, plain, opts=("-b", "1"))
    # the budget: what streaming needs, what the engine declares and half a
    # layer (its heap varies by a page or two)
    d = Daemon([m])
    run_eval(m, toks, os.path.join(TMP, f"{tag}.probe"), d.sock, ("-b", "1"))
    st = d.model(name)
    need = st["minimum_bytes"] + d.status()["declared_bytes"] + st["slot_size"] // 2
    d.stop()
    # A first run under it: its declaration stays set aside once it exits,
    # so the run below finds no layer resident (read into the memfd) that
    # its own declaration would evict.
    d = Daemon([m], "--budget", str(need))
    first = run_eval(m, toks, os.path.join(TMP, f"{tag}.first"), d.sock, ("-b", "1"))
    assert first.returncode == 0, first.stderr
    mp = {}
    s, keep = uffd_session(d.sock, name.encode(), mp)
    stop = threading.Event()
    answered = []

    def answer_late():
        """Each REMAP carried out and answered `delay` after it came (the
        slowness under test, not a wait for anything), or never."""
        s.settimeout(0.1)
        while not stop.is_set():
            try:
                data = s.recv(70000)
            except socket.timeout:
                continue
            if not data:
                return
            if struct.unpack_from("<H", data, 6)[0] == 10 and delay is not None:  # REMAP
                time.sleep(delay)
                remap_by_hand(mp, data[16:])
                s.send(hdr(11, 4) + data[16:20])  # REMAPPED(seq)
                answered.append(1)

    t = threading.Thread(target=answer_late)
    t.start()
    try:
        before = d.model(name)
        out = os.path.join(TMP, f"{tag}.out")
        r = run_eval(m, toks, out, d.sock, ("-b", "1"))
        r.same = r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read()
        st = d.model(name)
    finally:
        stop.set()
        t.join()
        s.close()
        for fd in keep:
            os.close(fd)
        d.stop()
    late_alive = len([c for c in st["clients"] if c["kind"] == "uffd"]) == 1
    return r, before, st, len(answered), late_alive


def layer_loads(before, st):
    """Loads of the layers between two statuses, and of them into slots."""
    return (sum(l["loads"] for l in st["layers"]) - sum(l["loads"] for l in before["layers"]),
            st["slot_loads"] - before["slot_loads"])


def case_slow_remaps():
    """An engine streaming under a tight budget beside a client that answers
    its REMAPs 50 ms late, as an engine whose remapper thread is starved of
    CPU does: the slots are vacated late, and a layer the engine faults on
    then waits for one rather than be read into the memfd past the model's
    allowance.  Every layer read goes into a slot, and the logits are the
    plain run's."""
    r, before, st, answered, alive = beside_late_client("slowremaps", 0.05)
    check("slow-remaps: the engine's logits are the plain run's", r.same, r.stderr[-300:])
    check("slow-remaps: the late client carried out REMAPs, and stayed served",
          answered > 0 and alive, f"{answered} answered")
    loads, slot_loads = layer_loads(before, st)
    check("slow-remaps: every layer read went into a slot, none into the memfd",
          loads > 0 and slot_loads == loads and all(l["state"] != "resident" for l in st["layers"]),
          f"{slot_loads} of {loads} loads into slots; memfd {st['memfd_bytes']}, "
          f"allowance {st['allowance_bytes']}")


def case_stalled_remaps():
    """The same beside a client that never answers (stopped): the slots it
    maps never come free, and a layer on its way out that the engine needs
    again would wait for it forever.  Once its oldest REMAP has waited
    REMAP_STALL_NS (5 s) while the engine waits, the daemon drops it, with
    the reason logged; the engine finishes with the plain run's logits."""
    r, before, st, answered, alive = beside_late_client("stalledremaps", None)
    check("stalled-remaps: the engine finishes with the plain run's logits", r.same,
          r.stderr[-300:])
    log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
    check("stalled-remaps: the stalled client was dropped, and why logged",
          not alive and "left a REMAP unanswered" in log, log[-300:])


def raw_conn(sock):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sock)
    s.settimeout(5)
    return s


def hdr(t, n, magic=0x41525453, ver=PROTO_VERSION):
    return struct.pack("<IBBHII", magic, ver, 0, t, n, 0)


def dropped(s):
    """The daemon closed this connection (after an optional ERROR)."""
    try:
        while True:
            data = s.recv(70000)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def case_garbage():
    model = os.path.join(FIX, "models", "stories260K.gguf")
    d = Daemon([model], "--resident", "0")
    name = b"stories260K.gguf"
    hello = struct.pack("<IIQ", 1, len(name), 0) + name
    attacks = {
        "random bytes": os.urandom(100),
        "one byte": b"\0",
        "bad magic": hdr(1, len(hello), magic=0xdeadbeef) + hello,
        "bad version": hdr(1, len(hello), ver=PROTO_VERSION + 1) + hello,
        "length larger than sent": hdr(1, 5000) + hello,
        "length smaller than sent": hdr(1, 3) + hello,
        "short HELLO": hdr(1, 4) + b"\1\0\0\0",
        "name length lies": hdr(1, len(hello)) + struct.pack("<IIQ", 1, 999, 0) + name,
        "unknown role": hdr(1, len(hello)) + struct.pack("<IIQ", 7, len(name), 0) + name,
        "unknown model": hdr(1, 16 + 4) + struct.pack("<IIQ", 1, 4, 0) + b"nope",
        "REGISTER before HELLO": hdr(3, 16) + bytes(16),
        "unknown type": hdr(99, 0),
    }
    for what, msg in attacks.items():
        s = raw_conn(d.sock)
        s.send(msg)
        check(f"garbage: {what} is dropped", dropped(s))
        s.close()
    # a stray file descriptor with HELLO
    s = raw_conn(d.sock)
    r, w = os.pipe()
    s.sendmsg([hdr(1, len(hello)) + hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", r))])
    check("garbage: a file descriptor with HELLO is dropped", dropped(s))
    os.close(r); os.close(w); s.close()
    # REGISTER with something that is not a userfaultfd
    s = raw_conn(d.sock)
    s.send(hdr(1, len(hello)) + hello)
    s.recvmsg(100, socket.CMSG_SPACE(4))
    r, w = os.pipe()
    s.sendmsg([hdr(3, 16) + bytes(16)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", r))])
    check("garbage: REGISTER with a pipe instead of a uffd is dropped", dropped(s))
    os.close(r); os.close(w); s.close()
    # a client that vanishes halfway through the handshake
    s = raw_conn(d.sock)
    s.send(hdr(1, len(hello)) + hello)
    s.close()
    out = os.path.join(TMP, "after-garbage")
    r = run_eval(model, tokens_of("stories260K.gguf"), out, d.sock)
    alive = d.p.poll() is None
    d.stop()
    check("garbage: the daemon still serves a real client", alive and r.returncode == 0, r.stderr)


def case_kill_engine():
    m = long_model()
    d = Daemon([m], "--resident", "2")
    e = start_engine(m, d.sock)
    first_output(e)
    e.kill()
    e.wait()
    wait_for(lambda: not d.model(os.path.basename(m))["clients"], 10, "client gone")
    out = os.path.join(TMP, "after-kill")
    r = subprocess.run([STRATA, "run", "-m", m, "--pager", d.sock, "-p", "hi", "-n", "4",
                        "--temp", "0"], capture_output=True, text=True, timeout=120)
    alive = d.p.poll() is None
    d.stop()
    check("kill-engine: the daemon serves the next client", alive and r.returncode == 0, r.stderr)


def case_kill_daemon():
    m = long_model()
    # one layer resident: the engine keeps faulting on streamed layers
    d = Daemon([m], "--resident", "1")
    e = start_engine(m, d.sock)
    first_output(e)
    t0 = time.monotonic()
    d.p.kill()
    d.p.wait()
    try:
        e.wait(5)
    except subprocess.TimeoutExpired:
        e.kill()
        e.wait()
        check("kill-daemon: the engine stops", False, "still running 5 s after the daemon died")
        return
    dt = time.monotonic() - t0
    err = e.stderr.read().decode()
    d.log.close()
    check("kill-daemon: the engine exits non-zero", e.returncode not in (0, None), str(e.returncode))
    check("kill-daemon: within a second", dt < 1.0, f"{dt:.2f} s")
    check("kill-daemon: with a message", "pager daemon died" in err, err.strip())


def case_stale():
    model = os.path.join(FIX, "models", "stories260K.gguf")
    d = Daemon([model])
    sock = d.sock
    d.p.kill()
    d.p.wait()
    d.log.close()
    check("stale: a killed daemon leaves its socket", os.path.exists(sock))
    r = subprocess.run([STRATA, "eval", "-m", model, "--tokens", "1", "--logits-out",
                        os.path.join(TMP, "x"), "--pager", sock], capture_output=True, text=True)
    check("stale: the engine says the pager is not running", r.returncode == 2 and
          "stale socket" in r.stderr, r.stderr.strip())
    d2 = Daemon([model], sock=sock)
    r = subprocess.run([STRATAD, "--socket", sock, model], capture_output=True, text=True, timeout=10)
    check("stale: a second daemon on a live socket is refused",
          r.returncode == 2 and "another stratad" in r.stderr, r.stderr.strip())
    d2.stop()
    check("stale: SIGTERM removes the socket", d2.p.returncode == 0 and not os.path.exists(sock))


def case_unreadable():
    src = os.path.join(FIX, "models", "stories260K.gguf")
    model = os.path.join(TMP, "shrinking.gguf")
    with open(src, "rb") as f, open(model, "wb") as g:
        g.write(f.read())
    d = Daemon([model], "--resident", "0")
    os.truncate(model, 600000)  # layers 2 and up are gone
    r = run_eval(model, tokens_of("stories260K.gguf"), os.path.join(TMP, "x"), d.sock)
    alive = d.p.poll() is None and d.status() is not None
    d.stop()
    check("unreadable: the engine exits 2", r.returncode == 2, str(r.returncode))
    # the daemon tells either way: its read of the cut file fails, or (checked
    # after each unit's reads) the file's size has changed, whichever it
    # meets first
    check("unreadable: with the daemon's reason",
          "the pager dropped this engine: the model file could not be read" in r.stderr or
          "shrinking.gguf changed on disk while served" in r.stderr, r.stderr.strip())
    check("unreadable: the daemon keeps serving", alive)


def case_shed():
    m = long_model()
    name = os.path.basename(m)
    toks = ",".join(str(i) for i in range(1, 17))
    plain = os.path.join(TMP, "shed.plain")
    run_eval(m, toks, plain)
    d = Daemon([m], "--resident", "1000")
    n = len(d.model(name)["layers"])
    e = start_engine(m, d.sock)
    first_output(e)
    d.p.send_signal(signal.SIGUSR1)
    wait_for(lambda: d.model(name)["resident_layers_planned"] == n - (n + 3) // 4, 10, "shed")
    d.p.send_signal(signal.SIGUSR1)
    left = n - (n + 3) // 4
    left -= (left + 3) // 4
    wait_for(lambda: d.model(name)["resident_layers_planned"] == left, 10, "second shed")
    # the running engine keeps going and the demoted layers get evicted
    wait_for(lambda: sum(l["evictions"] > 0 for l in d.model(name)["layers"]) > 0, 30,
             "evictions of demoted layers")
    running = e.poll() is None
    pressure = wait_for(lambda: (lambda ps: ps if ps["releases"] >= 1 else None)(
        d.status()["pressure"]), 30, "the shed layers freed")
    paged = os.path.join(TMP, "shed.paged")
    r = run_eval(m, toks, paged, d.sock)
    st = d.model(name)
    d.p.send_signal(signal.SIGUSR2)
    wait_for(lambda: sum(l["state"] == "resident" for l in d.model(name)["layers"]) == n, 30,
             "restore")
    e.kill()
    e.wait()
    alive = d.p.poll() is None
    d.stop()
    check("shed: SIGUSR1 demotes a quarter of the resident layers, twice",
          st["resident_layers_planned"] == left, str(st["resident_layers_planned"]))
    check("shed: the running engine keeps running", running)
    check("shed: the time from the shed to its layers' memory being free is measured",
          pressure["sheds"] == 2 and pressure["release_ms_median"] > 0, str(pressure))
    check("shed: results through the shed pager are bit-identical",
          r.returncode == 0 and open(paged, "rb").read() == open(plain, "rb").read(), r.stderr)
    check("shed: SIGUSR2 restores every layer and the daemon lives on", alive)


def run_bench(m, sock, ctx, batch=32):
    return subprocess.run([STRATA, "bench", "-m", m, "--pager", sock, "-p", "4", "-n", "4",
                           "-c", str(ctx), "-b", str(batch), "--no-hw", "--json"],
                          capture_output=True, text=True, timeout=120)


def case_warm():
    """A budget with room for some of the small model's 12 layers (it needs
    37 MiB to stream, 68 MiB to hold whole): the engine's declared memory takes
    some of the six the idle daemon plans.  The second engine, started after
    the first exited, finds the same layers resident and reads none of them
    again."""
    m = long_model()
    name = os.path.basename(m)
    d = Daemon([m], "--budget", "60M")
    idle = d.model(name)["resident_layers_planned"]
    r1 = run_bench(m, d.sock, 256)
    wait_for(lambda: not d.model(name)["clients"], 10, "first engine detached")
    st1 = d.model(name)
    res1 = {l["layer"]: l["loads"] for l in st1["layers"] if l["state"] == "resident"}
    r2 = run_bench(m, d.sock, 256)
    wait_for(lambda: not d.model(name)["clients"], 10, "second engine detached")
    st2 = d.model(name)
    d.stop()
    check("warm: both engines ran", r1.returncode == 0 and r2.returncode == 0,
          r1.stderr + r2.stderr)
    check("warm: the engine's memory shrank the plan, some layers still resident",
          0 < st1["resident_layers_planned"] < idle and
          len(res1) == st1["resident_layers_planned"],
          f"idle {idle}, with the engine {st1['resident_layers_planned']}, loaded {len(res1)}")
    check("warm: the plan stays while no engine is connected",
          st2["resident_layers_planned"] == st1["resident_layers_planned"])
    check("warm: the second engine found every planned layer resident, none read again",
          all(st2["layers"][l]["state"] == "resident" and st2["layers"][l]["loads"] == n
              for l, n in res1.items()),
          str([(l["layer"], l["state"], l["loads"]) for l in st2["layers"]]))


def case_accounting():
    """What an engine allocates (KV cache, buffers) is declared, shown and
    taken from the budget.  The small shape's KV cache is 12 layers x (K, V)
    x 4 KV heads x 64 x f16 = 12 KiB a token.  The budget (70 MiB) holds the
    whole model (68 MiB; 37 MiB streams it) when no engine is there, and
    leaves 33 MiB for engines: the 2048-token engine declares about 27, the
    256-token one about 6, and both take layers.  In the sanitizer build they
    declare more (ASan's allocator holds more), so there the budget is 76
    MiB."""
    m = long_model()
    name = os.path.basename(m)
    asan = b"libasan" in subprocess.run(["ldd", STRATA], capture_output=True).stdout
    d = Daemon([m], "--budget", "76M" if asan else "70M")
    budget = d.status()["budget_bytes"]
    idle = d.model(name)["resident_layers_planned"]
    seen = {}
    for ctx in (256, 2048):
        e = subprocess.Popen([STRATA, "run", "-m", m, "--pager", d.sock, "-p", "hello",
                              "-n", "4000", "-c", str(ctx), "-b", "32", "--temp", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first_output(e)
        cl = wait_for(lambda: [c for c in d.model(name)["clients"]
                               if c["kind"] == "uffd" and c["declared_bytes"] > 0], 10,
                      "the engine's declaration")
        st, top = d.model(name), d.status()
        text = subprocess.run([CTL, "--socket", d.sock, "status"], capture_output=True,
                              text=True).stdout
        seen[ctx] = (cl[0]["declared_bytes"], top["declared_bytes"], st["allowance_bytes"],
                     st["resident_layers_planned"], text)
        e.kill()
        e.wait()
    d.stop()
    small, big = seen[256], seen[2048]
    check("accounting: the declared memory is the daemon's total, and the allowance is the "
          "budget less it", all(v[0] == v[1] and v[2] == budget - v[1] for v in seen.values()),
          str([v[:4] for v in seen.values()]))
    kv = 12 * 2 * 4 * 64 * 2
    # The rest of a declaration is the process's measured anonymous memory,
    # which differs between two runs by some KiB (seen: 20): the KV cache's
    # 21 MiB must show, less a MiB of that noise.
    check("accounting: the KV cache is counted (1792 more tokens of context declare "
          "1792 tokens of KV cache more, within 1 MiB)",
          big[0] - small[0] >= (2048 - 256) * kv - (1 << 20),
          f"{small[0]} and {big[0]}")
    check("accounting: the declared memory takes layers from the plan",
          big[3] <= small[3] < idle, f"idle {idle}, {small[3]}, {big[3]}")
    check("accounting: stratactl status shows it",
          f"{big[1] / 1048576:.1f} MiB declared" in big[4], big[4])


def case_spec():
    """A speculating engine's tokens per pass reach stratactl: the model drafting
    for itself, 4 drafts a pass, all kept, is 5 tokens a pass; a plain one 1."""
    m = long_model()
    name = os.path.basename(m)
    d = Daemon([m], "--resident", "2")
    got = {}
    for what, extra in (("plain", ()), ("speculating", ("--draft-model", m, "--draft-min", "4",
                                                       "--draft-max", "4"))):
        e = start_engine(m, d.sock, extra=extra)
        first_output(e)
        cl = wait_for(lambda: [c for c in d.model(name)["clients"]
                               if c["kind"] == "uffd" and c.get("passes", 0) >= 8], 30,
                      "the engine's reports")
        got[what] = cl[0]["tokens_per_pass"]
        text = subprocess.run([CTL, "--socket", d.sock, "status"], capture_output=True,
                              text=True).stdout
        e.kill()
        e.wait()
    d.stop()
    check("spec: a plain engine makes 1 token a pass", got["plain"] == 1.0, str(got))
    check("spec: a speculating one with every draft kept, 5", 4.5 <= got["speculating"] <= 5.0,
          str(got))
    check("spec: stratactl status shows tokens per pass", "tokens per pass" in text, text)


def case_plan():
    """What the budget cannot hold is refused with the numbers: a budget
    below what streaming needs (exit 2, one line), an engine that declares
    more than the budget leaves for engines (dropped, saying both numbers,
    while the engine beside it goes on).  The mode is shown and shapes the
    plan."""
    m = long_model()
    name = os.path.basename(m)
    r = subprocess.run([STRATAD, "--socket", os.path.join(TMP, "small.sock"), "--budget", "1M", m],
                       capture_output=True, text=True, timeout=30)
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    check("plan: a budget below the minimum is refused with exit 2 and the minimum",
          r.returncode == 2 and "below the" in last and "MiB that streaming needs" in last and
          name in last, f"{r.returncode}: {r.stderr}")

    # The small shape needs 37 MiB to stream: 40 MiB more leaves room for an
    # engine with a short context (about 10 MiB) but not for one with 8192
    # tokens (96 MiB of KV cache).
    d = Daemon([m])
    minimum = d.model(name)["minimum_bytes"]
    d.stop()
    d = Daemon([m], "--budget", str(minimum + (40 << 20)))
    a = start_engine(m, d.sock, extra=("-c", "256", "-b", "32"))
    first_output(a)
    b = subprocess.run([STRATA, "run", "-m", m, "--pager", d.sock, "-p", "hello", "-n", "4",
                        "-c", "8192"], capture_output=True, text=True, timeout=60)
    alive = a.poll() is None
    st = d.model(name)
    a.kill()
    a_err = a.communicate()[1].decode(errors="replace")
    d.stop()
    # strata itself checks its context against what MODEL says the daemon
    # lets it declare and stops first; the daemon's own refusal (it drops
    # an engine whose DECLARE is more, "... leaves N MiB for engines") is
    # for clients that do not.  Either way: one line, both numbers.
    engine_said = "MiB left to this process by the pager's budget" in b.stderr
    daemon_said = "leaves" in b.stderr and "MiB for engines" in b.stderr
    check("plan: an engine needing more than the budget leaves is refused with both numbers",
          b.returncode == 2 and "needs" in b.stderr and (engine_said or daemon_said) and
          len(b.stderr.strip().splitlines()) == 1, f"{b.returncode}: {b.stderr}")
    check("plan: the engine beside it goes on", alive and len(st["clients"]) == 1,
          f"{alive} {st['clients']} {a_err[-300:]}")
    # 256 tokens of the small shape's f16 cache: 12 layers x 2 x 256 x 4 heads x 64 x 2 bytes
    kv = st["clients"][0].get("kv_bytes", 0) if st["clients"] else 0
    check("plan: the status shows the engine's KV cache within what it declared",
          kv == 12 * 2 * 256 * 4 * 64 * 2 and kv < st["clients"][0]["declared_bytes"],
          str(st["clients"]))

    budget = str(minimum + (30 << 20))
    planned = {}
    for mode in ("speed", "balanced", "context"):
        d = Daemon([m], "--budget", budget, "--mode", mode)
        top = d.status()
        text = subprocess.run([CTL, "--socket", d.sock, "status"], capture_output=True,
                              text=True).stdout
        planned[mode] = d.model(name)["resident_layers_planned"]
        d.stop()
        check(f"plan: --mode {mode} is shown (JSON and text)",
              top["plan"]["mode"] == mode and f"plan          {mode}:" in text and
              top["budget"]["source"] == "given", text)
    check("plan: speed keeps more layers than balanced, balanced more than context",
          planned["speed"] > planned["balanced"] > planned["context"], str(planned))

    # With no -c, an engine sizes its context to what the daemon's plan
    # leaves it: the --mode's room for engines (context mode: more), or the
    # default context where that is less; a -c beyond what the daemon lets
    # it declare is refused with the numbers.
    long_ctx = os.path.join(TMP, "small-q4_0-ctx32k.gguf")
    subprocess.run([MKMODEL, "--shape", "small", "--type", "q4_0", "--ctx", "32768", "-o",
                    long_ctx], check=True, capture_output=True)
    sized = {}
    for mode in ("speed", "context"):
        d = Daemon([long_ctx], "--budget", str(400 << 20), "--mode", mode)
        r = subprocess.run([STRATA, "run", "-m", long_ctx, "--pager", d.sock, "-p", "hello", "-n",
                            "2"], capture_output=True, text=True, timeout=120)
        line = next((l for l in r.stderr.splitlines() if l.startswith("strata: context ")), "")
        sized[mode] = (r.returncode, int(line.split()[2]) if line else 0, line)
        if mode == "context":
            big = subprocess.run([STRATA, "run", "-m", long_ctx, "--pager", d.sock, "-p", "hi",
                                  "-n", "1", "-c", "1000000"], capture_output=True, text=True,
                                 timeout=120)
        d.stop()
    check("plan: with no -c, context mode gives an engine a longer context than speed mode",
          sized["speed"][0] == 0 and sized["context"][0] == 0 and
          sized["context"][1] > sized["speed"][1] == 4096 and
          "pager's room for engines" in sized["context"][2], str(sized))
    check("plan: a -c beyond what the pager lets the engine declare is refused with the numbers",
          big.returncode == 2 and "MiB left to this process by the pager's budget" in big.stderr,
          f"{big.returncode}: {big.stderr}")

    # Two models: shared equally until an engine has decoded with each, then
    # by what the predictor says each gains; within the budget either way.
    m2 = long_model(16)
    d = Daemon([m, m2])
    top = d.status()
    layer = max(l["bytes"] for l in top["models"][0]["layers"])
    budget = top["plan"]["minimum_bytes"] + 6 * layer + (24 << 20)  # and a short context
    d.stop()
    d = Daemon([m, m2], "--budget", str(budget))
    before = d.status()["plan"]["shared_by"]
    runs = [subprocess.run([STRATA, "run", "-m", x, "--pager", d.sock, "-p", "hello", "-n", "8",
                            "-c", "256", "-b", "32", "--temp", "0"], capture_output=True, text=True, timeout=120)
            for x in (m, m2)]
    top = d.status()
    text = subprocess.run([CTL, "--socket", d.sock, "status"], capture_output=True,
                          text=True).stdout
    d.stop()
    held = sum(x["allowance_bytes"] for x in top["models"])
    check("plan: two models share equally before either decoded, by predicted gain after",
          before == "equal" and top["plan"]["shared_by"] == "gain" and
          all(r.returncode == 0 for r in runs) and "by the speed each gains" in text,
          f"{before} -> {top['plan']['shared_by']}; {[r.stderr[-200:] for r in runs]}")
    check("plan: shared by gain, the allowances stay within the budget",
          held <= budget, f"{held} > {budget}")


def device_key(path):
    st = os.stat(path)
    fs = subprocess.run(["stat", "-f", "-c", "%t", path], capture_output=True, text=True,
                        check=True).stdout.strip()
    return f"dev={os.major(st.st_dev)}:{os.minor(st.st_dev)} fs={fs}"


def case_io_probe():
    """The reader's request size and depth: measured once per device and
    remembered, measured again on request, set by hand, or the defaults."""
    cache = os.path.join(TMP, "io-probe")
    tiny = os.path.join(FIX, "models", "tiny-llama-q4_0.gguf")
    d = Daemon([tiny], "--io-cache", cache)
    io = d.status()["io"]
    d.stop()
    check("io-probe: a model too small to measure the device gets the defaults",
          io["source"] == "defaults" and io["chunk_bytes"] == 1 << 20 and io["depth"] == 16
          and not os.path.exists(cache), str(io))
    d = Daemon([tiny], "--io-cache", cache, "--io-chunk", "512K", "--io-depth", "8")
    io = d.status()["io"]
    d.stop()
    check("io-probe: --io-chunk and --io-depth set them", io["source"] == "set" and
          io["chunk_bytes"] == 512 << 10 and io["depth"] == 8, str(io))
    # A cache written by hand: garbage and an out-of-range entry are ignored,
    # the valid entry for this device is used.
    key = device_key(tiny)
    with open(cache, "w") as f:
        f.write("garbage\n")
        f.write(f"strata-io 1 {key} chunk=4194304 depth=8 gbps=1.500 time=1700000000\n")
        f.write(f"strata-io 1 {key} chunk=3 depth=8 gbps=9.000 time=1700000001\n")
        f.write("strata-io 1 dev=9999:1 fs=ef53 chunk=65536 depth=1 gbps=0.100 time=1\n")
    d = Daemon([tiny], "--io-cache", cache)
    io = d.status()["io"]
    d.stop()
    check("io-probe: a remembered measurement for the device is used; bad lines are ignored",
          io["source"] == "cached" and io["chunk_bytes"] == 4 << 20 and io["depth"] == 8
          and io["probed_gbps"] == 1.5, str(io))
    # A model big enough to measure: --probe-io measures now and replaces
    # this device's entry, keeping the other device's.
    big = os.path.join(TMP, "probe-f16.gguf")
    subprocess.run([MKMODEL, "--shape", "small", "--type", "f16", "--layers", "16", "-o", big],
                   check=True, capture_output=True)
    d = Daemon([big], "--io-cache", cache, "--probe-io")
    io = d.status()["io"]
    d.stop()
    lines = open(cache).read().splitlines()
    mine = [l for l in lines if device_key(big) in l]
    check("io-probe: --probe-io measures the device", io["source"] == "probed" and
          io["probed_gbps"] > 0 and io["chunk_bytes"] >= 256 << 10 and 1 <= io["depth"] <= 64,
          str(io))
    check("io-probe: the measurement replaces the device's entry and keeps the others",
          len(mine) == 1 and f"chunk={io['chunk_bytes']} depth={io['depth']}" in mine[0] and
          any("dev=9999:1" in l for l in lines) and not any("garbage" in l for l in lines),
          "\n".join(lines))
    d = Daemon([big], "--io-cache", cache)
    io2 = d.status()["io"]
    d.stop()
    os.unlink(big)
    check("io-probe: the next daemon remembers it", io2["source"] == "cached" and
          (io2["chunk_bytes"], io2["depth"]) == (io["chunk_bytes"], io["depth"]), str(io2))


def case_fuse():
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        print("skip fuse: needs /dev/fuse and root")
        return
    mnt = os.path.join(TMP, "mnt")
    os.mkdir(mnt)
    paths = [path_of(m) for m in MODELS]
    d = Daemon(paths, "--resident", "0", "--fuse", mnt)
    check("fuse: every model is listed", sorted(os.listdir(mnt)) == MODELS, str(os.listdir(mnt)))
    r = subprocess.run([STRATAD, "--socket", os.path.join(TMP, "other.sock"), "--fuse", mnt,
                        paths[0]], capture_output=True, text=True, timeout=30)
    check("fuse: a second daemon on a live mount is refused",
          r.returncode == 2 and "another stratad serves a mount here" in r.stderr, r.stderr)
    for m, p in zip(MODELS, paths):
        mounted = os.path.join(mnt, m)
        same_bytes = open(mounted, "rb").read() == open(p, "rb").read()
        a, b = os.path.join(TMP, m + ".a"), os.path.join(TMP, m + ".b")
        ra = run_eval(p, tokens_of(m), a)
        rb = run_eval(mounted, tokens_of(m), b)
        check(f"fuse: {m} has the exact bytes", same_bytes)
        check(f"fuse: {m} eval through the mount is bit-identical",
              ra.returncode == 0 and rb.returncode == 0 and open(a, "rb").read() == open(b, "rb").read(),
              rb.stderr.strip())
    d.stop()
    with open("/proc/self/mountinfo") as f:
        mounted = any(f" {os.path.realpath(mnt)} " in line for line in f)
    check("fuse: SIGTERM unmounts", d.p.returncode == 0 and not mounted)

    # Streaming through the mount: a budget below the model's size, so layers are
    # stored ahead of the reader and dropped behind it, and the results are
    # still bit-identical (a dropped layer read again must come back whole).
    # The budget is what streaming through the mount needs (the other
    # tensors, the two layers a window of one holds, the mount's buffers:
    # docs/design.md), and nothing more.
    m = "tiny-llama-q4_0.gguf"
    p = os.path.join(FIX, "models", m)
    d = Daemon([p], "--window", "1", "--fuse", mnt)
    budget = d.model(m)["minimum_bytes"]
    d.stop()
    d = Daemon([p], "--budget", str(budget), "--window", "1", "--fuse", mnt)
    a, b = os.path.join(TMP, m + ".plain2"), os.path.join(TMP, m + ".fuse2")
    ra = run_eval(p, tokens_of(m), a)
    rb = [run_eval(os.path.join(mnt, m), tokens_of(m), b) for _ in range(2)][-1]
    st = d.model(m)
    text = subprocess.run([CTL, "--socket", d.sock, "status"], capture_output=True, text=True).stdout
    d.stop()
    check("fuse: eval through a budgeted mount is bit-identical",
          ra.returncode == 0 and rb.returncode == 0 and open(a, "rb").read() == open(b, "rb").read(),
          rb.stderr.strip())
    check("fuse: layers were stored ahead and dropped behind the reader",
          sum(l["stores"] for l in st["layers"]) > 0 and sum(l["drops"] for l in st["layers"]) > 0,
          str(st["layers"]))
    readers = [c for c in st["clients"] if c["kind"] == "fuse"]
    check("fuse: status lists the mount's reader (JSON and text)",
          len(readers) == 1 and readers[0]["reads"] > 0 and " fuse  at layer " in text, text)


def case_fuse_kill():
    """The daemon behind a mount dies under a plain-mmap engine: the engine
    stops with one line and exit 2 (not a crash, not garbage), and the next
    daemon takes the stale mount over."""
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        print("skip fuse-kill: needs /dev/fuse and root")
        return
    mnt = os.path.join(TMP, "mnt-kill")
    os.mkdir(mnt)
    m = "tiny-llama-q4_0.gguf"
    p = os.path.join(FIX, "models", m)
    d = Daemon([p], "--resident", "0", "--window", "1", "--fuse", mnt)
    e = subprocess.Popen([STRATA, "run", "-m", os.path.join(mnt, m), "-p", "Once upon a time",
                          "-n", "100000", "--temp", "0"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    # Every layer streams, so the engine needs the daemon for every token;
    # stop it mid-run, kill the daemon, and let it go on.
    wait_for(lambda: any(c["kind"] == "fuse" and c["reads"] > 0
                         for c in d.model(m)["clients"]), 10, "the engine reading")
    e.send_signal(signal.SIGSTOP)
    d.p.kill()
    d.p.wait(10)
    d.log.close()
    e.send_signal(signal.SIGCONT)
    try:
        err = e.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        e.kill()
        err = e.communicate()[1]
    lines = err.strip().splitlines()
    check("fuse-kill: the engine stops with exit 2 and says why",
          e.returncode == 2 and lines and "could not be read" in lines[-1], f"{e.returncode}: {err}")
    d = Daemon([p], "--fuse", mnt)
    check("fuse-kill: the next daemon takes the stale mount over",
          sorted(os.listdir(mnt)) == [m])
    d.stop()


def case_fuse_mixed():
    """One model, one budget, two consumers: an engine through userfaultfd
    (reading the memfd) and a plain-mmap engine reading the file through the
    mount (the page cache), at the same time.  Both get the plain run's
    logits bit for bit; the memory the daemon holds for the model, memfd and
    page cache together, stays within the model's allowance (the budget less
    the engines' declared memory) give or take the layer a reader's own
    reads may add and, while the engine is connected too, the layer its
    faults may (docs/design.md, the FUSE front end), while they run and
    while an engine runs after them; and whichever of the two leaves first,
    the daemon goes on serving."""
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        print("skip fuse-mixed: needs /dev/fuse and root")
        return
    mnt = os.path.join(TMP, "mnt-mixed")
    os.mkdir(mnt)
    # 32 layers of 3.4 MiB, 136 MiB in all.  The engine declares about
    # 65 MiB (2048 tokens of KV cache): one copy of the model fits the rest
    # of 250M, but not the two the consumers read at once (the memfd's and
    # the page cache's), so while both run the daemon plans for two copies
    # and streams some layers, and the budget has to hold them together.
    m = long_model(layers=32)
    name = os.path.basename(m)
    # one token a pass: every token goes through every layer, so the
    # streamed layers are read again and again while both engines run
    toks = ",".join(str(i) for i in range(1, 17))
    opts = ["-b", "1", "-c", "2048", "-t", "1"]
    plain = os.path.join(TMP, "mixed.plain")
    r = run_eval(m, toks, plain, opts=opts)
    check("fuse-mixed: plain eval", r.returncode == 0, r.stderr)
    want = open(plain, "rb").read()
    d = Daemon([m], "--budget", "250M", "--fuse", mnt)
    ps, worst, planned = [], {}, set()

    def sample(when):
        """The model's status, noting for each `when` how far the memory
        held for it went past its allowance at worst."""
        s = d.status()
        if not s:
            return None
        st = next(x for x in s["models"] if x["name"] == name)
        mib = {k: st[k] / 1048576 for k in ("memfd_bytes", "page_cache_bytes", "slot_bytes",
                                           "sparse_bytes")}
        held = sum(mib.values())
        over = held - st["allowance_bytes"] / 1048576
        planned.add(st["resident_layers_planned"])
        if when not in worst or over > worst[when][0]:
            worst[when] = (over, f"{held:.1f} MiB held ({mib['memfd_bytes']:.1f} in the memfd, "
                           f"{mib['page_cache_bytes']:.1f} in the page cache) against an "
                           f"allowance of {st['allowance_bytes'] / 1048576:.1f} MiB (a "
                           f"{s['budget_bytes'] / 1048576:.1f} MiB budget less "
                           f"{s['declared_bytes'] / 1048576:.1f} declared), "
                           f"{st['resident_layers_planned']} of {len(st['layers'])} layers "
                           f"planned resident: {over:.1f} MiB over")
        return st

    def start(model, out, sock=None):
        ps.append(subprocess.Popen(eval_cmd(model, toks, out, sock, opts),
                                   stderr=subprocess.PIPE, text=True))
        return ps[-1]

    def finish(p, when):
        wait_for(lambda: sample(when) and p.poll() is not None, 60, "an engine to finish")

    def detached(when):
        def no_engine():
            st = sample(when)
            return st is not None and not [c for c in st["clients"] if c["kind"] == "uffd"]
        wait_for(no_engine, 10, "the engine detached")

    try:
        # An engine alone first: what it declared stays set aside after it
        # exits, so the runs below start from the plan they run under
        # instead of shrinking one when the engine declares its memory
        # (which the daemon cannot know before).
        out = os.path.join(TMP, "mixed.alone")
        r = run_eval(m, toks, out, d.sock, opts)
        check("fuse-mixed: an engine alone through the budgeted daemon matches the plain run",
              r.returncode == 0 and open(out, "rb").read() == want, r.stderr.strip())
        both, after = "while both engines were connected", "while the next engine ran"
        # Three times: both to the end, then each of the two leaving first
        # while the other is held stopped, and an engine after them.
        for first in (None, "uffd", "fuse"):
            last = {"uffd": "fuse", "fuse": "uffd"}.get(first)
            alone = f"while the {last} engine went on alone"
            tag = f"fuse-mixed ({first} leaves first)" if first else "fuse-mixed (both to the end)"
            outs = {k: os.path.join(TMP, f"mixed.{first}.{k}") for k in ("uffd", "fuse")}
            p = {"uffd": start(m, outs["uffd"], d.sock),
                 "fuse": start(os.path.join(mnt, name), outs["fuse"])}
            # Overlap: the mount's reads went on between two samples that
            # both list the engine as connected.
            reads = []

            def overlap():
                st = sample(both)
                cl = st["clients"] if st else []
                if any(c["kind"] == "uffd" and c["pid"] == p["uffd"].pid for c in cl):
                    reads.append(sum(c["reads"] for c in cl if c["kind"] == "fuse"))
                return len(reads) > 1 and reads[-1] > reads[0]

            wait_for(lambda: overlap() or any(x.poll() is not None for x in p.values()), 60,
                     "both engines reading")
            check(f"{tag}: the two engines ran at the same time",
                  len(reads) > 1 and reads[-1] > reads[0],
                  f"the mount's reads {reads} while the engine was connected; exits "
                  f"{[x.poll() for x in p.values()]}")
            if first:
                # `first` finishes and leaves while `last` is held stopped
                p[last].send_signal(signal.SIGSTOP)
                finish(p[first], both)
                check(f"{tag}: the {last} engine was still running", p[last].poll() is None,
                      f"exit {p[last].poll()}")
                if first == "uffd":
                    detached(both)
                p[last].send_signal(signal.SIGCONT)
                finish(p[last], alone)
            else:
                for x in p.values():
                    finish(x, both)
            detached(alone if first else both)
            errs = [x.communicate()[1].strip() for x in p.values()]
            for k, x in p.items():
                check(f"{tag}: the {k} engine matches the plain run",
                      x.returncode == 0 and open(outs[k], "rb").read() == want,
                      f"exit {x.returncode}: {errs}")
            if not first:
                continue
            out = os.path.join(TMP, f"mixed.{first}.after")
            e = start(m, out, d.sock)
            finish(e, after)
            check(f"{tag}: the daemon serves the next engine", d.p.poll() is None and
                  e.returncode == 0 and open(out, "rb").read() == want, e.communicate()[1])
        st = d.model(name)
        n_layers = len(st["layers"])
        check("fuse-mixed: some layers streamed, through the memfd and through the page cache",
              any(0 < n < n_layers for n in planned) and
              sum(l["evictions"] for l in st["layers"]) > 0 and
              sum(l["drops"] for l in st["layers"]) > 0,
              f"planned resident {sorted(planned)} of {n_layers}; (layer, evictions, drops) "
              f"{[(l['layer'], l['evictions'], l['drops']) for l in st['layers']]}")
        layer = max(l["bytes"] for l in st["layers"]) / 1048576
        # A layer for each kind of consumer connected: the mount's reader
        # fills the page cache with its own reads whatever the daemon does,
        # and a daemon with a mount has no staging slots, so a layer the
        # engine faults on goes to the memfd even past the allowance
        # (pager_demand waits only for a slot on its way).  With both
        # connected, a CI run under load held 190.3 MiB against 184.1: 1.8
        # layers over (docs/design.md, the FUSE front end's accounting).
        kinds = {both: 2}
        check("fuse-mixed: the memfd and the page cache together stay within the model's "
              "allowance, give or take a layer for each kind of consumer connected",
              bool(worst) and all(over <= kinds.get(when, 1) * layer
                                  for when, (over, _) in worst.items()),
              "; ".join(f"{when}: {text}" for when, (_, text) in worst.items()) +
              f" (a layer is {layer:.1f} MiB)")
    finally:
        for x in ps:
            if x.poll() is None:
                x.kill()
                x.wait()
        d.stop()



class FaultFS:
    """tests/faultfs.c serving one file under a mount point, failing reads of
    it on command (set(): off, eio OFF, short OFF, eof OFF)."""

    def __init__(self, backing):
        self.mnt = tempfile.mkdtemp(prefix="faultfs-", dir=TMP)
        self.log = open(os.path.join(TMP, "faultfs.log"), "ab")
        self.p = subprocess.Popen([FAULTFS, backing, self.mnt], stdout=self.log, stderr=self.log)
        self.path = os.path.join(self.mnt, os.path.basename(backing))
        wait_for(lambda: os.path.exists(self.path) or self.p.poll() is not None, 10, "faultfs")
        if self.p.poll() is not None:
            raise RuntimeError("faultfs exited at start")

    def set(self, cmd):
        with open(os.path.join(self.mnt, "ctl"), "w") as f:
            f.write(cmd + "\n")

    def faults(self):
        with open(os.path.join(self.mnt, "ctl")) as f:
            return int(f.read().split()[3])

    def stop(self):
        subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def have_fuse():
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        print("skip: needs /dev/fuse and root")
        return False
    return True


def layer_offset(d, name, frac):
    """A byte offset inside the layer at fraction frac of the model's layers,
    from the daemon's status."""
    layers = d.model(name)["layers"]
    l = layers[min(len(layers) - 1, int(len(layers) * frac))]
    return l["offset"] + l["bytes"] // 2 if "offset" in l else None


def case_read_error():
    if not have_fuse():
        return
    m = long_model()
    fs = FaultFS(m)
    name = os.path.basename(m)
    toks = ",".join(str(i) for i in range(1, 13))
    plain = os.path.join(TMP, "readerr.plain")
    run_eval(m, toks, plain)
    try:
        d = Daemon([fs.path], "--resident", "1")
        e = start_engine(fs.path, d.sock)
        first_output(e)  # streaming: every layer but one is read for every token
        size = os.path.getsize(m)
        fs.set(f"eio {size * 3 // 4}")
        t0 = time.monotonic()
        try:
            err = e.communicate(timeout=30)[1].decode()
        except subprocess.TimeoutExpired:
            e.kill()
            err = e.communicate()[1].decode()
        dt = time.monotonic() - t0
        check("read-error: the disk failed reads", fs.faults() > 0, str(fs.faults()))
        check("read-error: the streaming engine stops with exit 2 and the daemon's reason",
              e.returncode == 2 and "the model file could not be read" in err,
              f"{e.returncode} after {dt:.1f} s: {err.strip()[-300:]}")
        log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
        check("read-error: the daemon logs the error", "Input/output error" in log, log[-500:])
        fs.set("off")
        out = os.path.join(TMP, "readerr.after")
        r = run_eval(fs.path, toks, out, d.sock)
        alive = d.p.poll() is None
        d.stop()
        check("read-error: once the disk recovers the daemon serves bit-identical logits",
              alive and r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read(),
              r.stderr.strip())
    finally:
        fs.stop()


def case_short_read():
    if not have_fuse():
        return
    m = long_model()
    fs = FaultFS(m)
    toks = ",".join(str(i) for i in range(1, 13))
    plain = os.path.join(TMP, "short.plain")
    run_eval(m, toks, plain)
    try:
        d = Daemon([fs.path], "--resident", "1")
        size = os.path.getsize(m)
        outs = []
        # short reads in three streamed layers: each completed by reading
        # the rest
        for frac in (0.8, 0.5, 0.3):
            fs.set(f"short {int(size * frac) // 4096 * 4096 + 12345}")
            before = fs.faults()
            out = os.path.join(TMP, f"short.{frac}")
            r = run_eval(fs.path, toks, out, d.sock)
            outs.append((frac, fs.faults() > before, r.returncode == 0 and
                         open(out, "rb").read() == open(plain, "rb").read(), r.stderr.strip()))
        d.stop()
        check("short-read: the short reads happened", all(hit for _, hit, _, _ in outs), str(outs))
        check("short-read: logits bit-identical after each", all(ok for _, _, ok, _ in outs),
              str(outs))
    finally:
        fs.stop()


def case_early_eof():
    if not have_fuse():
        return
    m = long_model()
    fs = FaultFS(m)
    toks = ",".join(str(i) for i in range(1, 13))
    try:
        d = Daemon([fs.path], "--resident", "1")
        fs.set(f"eof {os.path.getsize(m) * 2 // 3}")
        r = run_eval(fs.path, toks, os.path.join(TMP, "eof.out"), d.sock)
        alive = d.p.poll() is None and d.status() is not None
        d.stop()
        check("early-eof: the engine stops with exit 2 and the daemon's reason",
              r.returncode == 2 and "the model file could not be read" in r.stderr,
              f"{r.returncode}: {r.stderr.strip()}")
        check("early-eof: the daemon survives", alive)
    finally:
        fs.stop()


def case_changed():
    m = long_model()
    model = os.path.join(TMP, "changing.gguf")
    other = os.path.join(FIX, "models", "stories260K.gguf")
    subprocess.run(["cp", m, model], check=True)
    d = Daemon([model, other], "--resident", "1")
    e = start_engine(model, d.sock)
    first_output(e)
    # rewrite some bytes of a late layer in place: same size, new contents
    size = os.path.getsize(model)
    with open(model, "r+b") as f:
        f.seek(size * 3 // 4)
        f.write(os.urandom(4096))
    try:
        err = e.communicate(timeout=30)[1].decode()
    except subprocess.TimeoutExpired:
        e.kill()
        err = e.communicate()[1].decode()
    check("changed: the streaming engine is told and stops (exit 2)",
          e.returncode == 2 and "changed on disk while served" in err,
          f"{e.returncode}: {err.strip()[-300:]}")
    r = run_eval(model, "1,2,3", os.path.join(TMP, "changed.out"), d.sock)
    check("changed: a new client is refused with the reason",
          r.returncode == 2 and "changed on disk while served" in r.stderr, r.stderr.strip())
    r = run_eval(other, tokens_of("stories260K.gguf"), os.path.join(TMP, "changed.other"), d.sock)
    alive = d.p.poll() is None
    d.stop()
    log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
    check("changed: the daemon logs it", "changed on disk while served" in log, log[-300:])
    check("changed: the daemon keeps serving its other model", alive and r.returncode == 0,
          r.stderr.strip())

    # replaced by a rename: the daemon holds the old inode, intact
    toks = ",".join(str(i) for i in range(1, 13))
    plain = os.path.join(TMP, "replaced.plain")
    subprocess.run(["cp", m, model], check=True)
    run_eval(model, toks, plain)
    d = Daemon([model], "--resident", "1")
    tmp = model + ".new"
    subprocess.run(["cp", other, tmp], check=True)
    os.rename(tmp, model)
    out = os.path.join(TMP, "replaced.out")
    # by the model's name: the path now holds another file
    r = subprocess.run([STRATA, "eval", "-m", os.path.basename(model), "--tokens", toks,
                        "--logits-out", out, "--pager", d.sock], capture_output=True, text=True,
                       timeout=120)
    d.stop()
    check("changed: a file replaced by a rename is served from the intact old one",
          r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read(),
          r.stderr.strip())


def case_restart():
    if not have_fuse():
        return
    m = long_model()
    name = os.path.basename(m)
    mnt = os.path.join(TMP, "mnt-restart")
    os.mkdir(mnt)
    sock = os.path.join(TMP, "restart.sock")
    d = Daemon([m], "--resident", "1", "--fuse", mnt, sock=sock)
    e = start_engine(m, sock)
    first_output(e)
    t0 = time.monotonic()
    d.p.kill()
    d.p.wait()
    d.log.close()
    try:
        e.wait(5)
    except subprocess.TimeoutExpired:
        e.kill()
        e.wait()
    dt = time.monotonic() - t0
    err = e.stderr.read().decode()
    check("restart: the engine exits with a message within a second of the SIGKILL",
          e.returncode not in (0, None) and dt < 1.0 and "pager daemon died" in err,
          f"{e.returncode} after {dt:.2f} s: {err.strip()}")
    check("restart: the killed daemon left its socket", os.path.exists(sock))
    d = Daemon([m], "--resident", "1", "--fuse", mnt, sock=sock)
    toks = ",".join(str(i) for i in range(1, 9))
    plain = os.path.join(TMP, "restart.plain")
    run_eval(m, toks, plain)
    out = os.path.join(TMP, "restart.out")
    r = run_eval(m, toks, out, sock)
    r2 = run_eval(os.path.join(mnt, name), toks, out + ".mnt")
    d.stop()
    log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
    check("restart: the new daemon cleared the stale socket and mount",
          "stale socket" in log and "stale mount" in log, log[-400:])
    want = open(plain, "rb").read()
    check("restart: the new daemon serves new clients (socket and mount)",
          r.returncode == 0 and r2.returncode == 0 and open(out, "rb").read() == want and
          open(out + ".mnt", "rb").read() == want, r.stderr.strip() + r2.stderr.strip())


def guardians_of(daemon):
    """The pids of daemon's FUSE guardians (its children run as
    "stratad --fuse-guard CONN")."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            status = open(f"/proc/{pid}/status").read()
        except OSError:  # gone meanwhile
            continue
        if argv[1:2] == [b"--fuse-guard"] and f"PPid:\t{daemon}\n" in status:
            found.append(int(pid))
    return found


def exited(pid):
    """Has pid (not our child) exited: reaped, or a zombie its parent has
    yet to reap?"""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][0] == "Z"
    except OSError:  # reaped
        return True


def case_late_guardian():
    """A killed daemon's guardian that runs late must not abort the next
    daemon's mount, which the kernel gives the freed connection number."""
    if not have_fuse():
        return
    m = os.path.join(FIX, "models", "tiny-llama-q4_0.gguf")
    name = os.path.basename(m)
    mnt = os.path.join(TMP, "mnt-late-guardian")
    os.mkdir(mnt)
    d = Daemon([m], "--fuse", mnt)
    guards = guardians_of(d.p.pid)
    check("late-guardian: the daemon has one guardian", len(guards) == 1, guards)
    if len(guards) != 1:
        d.stop()
        return
    g = guards[0]
    os.kill(g, signal.SIGSTOP)  # held while its daemon dies and the next one mounts
    d.p.kill()
    d.p.wait()
    d.log.close()
    d = Daemon([m], "--fuse", mnt)
    os.kill(g, signal.SIGCONT)
    wait_for(lambda: exited(g), 10, "the guardian's exit")
    try:
        with open(os.path.join(mnt, name), "rb") as f:
            head = f.read(4)
        err = ""
    except OSError as ex:
        head, err = b"", str(ex)
    d.stop()
    log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
    check("late-guardian: the new daemon's mount still serves reads", head == b"GGUF", err)
    check("late-guardian: the old guardian says its connection had gone",
          "had gone with it" in log, log[-400:])


def case_kill_streaming():
    m = long_model()
    name = os.path.basename(m)
    toks = ",".join(str(i) for i in range(1, 25))
    plain = os.path.join(TMP, "killstream.plain")
    run_eval(m, toks, plain)
    d = Daemon([m], "--resident", "1")
    # what the model holds with no client, once one engine ran alone
    run_eval(m, "1,2", os.path.join(TMP, "killstream.warm"), d.sock)
    base = wait_for(lambda: (lambda s: s if not s["clients"] else None)(d.model(name)), 10,
                    "the lone engine gone")
    layer = max(l["bytes"] for l in base["layers"])
    victim = start_engine(m, d.sock)
    first_output(victim)
    out = os.path.join(TMP, "killstream.out")
    other = subprocess.Popen(eval_cmd(m, toks, out, d.sock), stderr=subprocess.PIPE, text=True)
    # both attached and faulting
    wait_for(lambda: len(d.model(name)["clients"]) == 2 or other.poll() is not None, 30,
             "two clients")
    victim.kill()
    victim.wait()
    err = other.communicate(timeout=120)[1]
    st = wait_for(lambda: (lambda s: s if not s["clients"] else None)(d.model(name)), 10,
                  "clients gone")
    alive = d.p.poll() is None
    d.stop()
    check("kill-streaming: the other engine finishes bit-identical",
          other.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read(),
          f"exit {other.returncode}: {err.strip()}")
    check("kill-streaming: its memory is back to what the model holds alone",
          alive and st["resident_bytes"] <= base["resident_bytes"] + layer,
          f"{st['resident_bytes']} now, {base['resident_bytes']} after a lone engine "
          f"(a layer is {layer})")


UFFD_API = 0xc018aa3f
UFFDIO_REGISTER = 0xc020aa00


def libc_maps():
    """The C library, with mmap(2) and mremap(2) typed for ctypes: the
    addresses a hand-made engine maps and moves its mapping to."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_void_p]
    return libc


def uffd_session(sock, name, mapping=None):
    """A real engine's handshake done by hand: HELLO, the memfd mapped, a
    userfaultfd registered over it, REGISTER, READY.  Returns the socket,
    still open, and what must stay alive with it; a dict given as `mapping`
    gets what a REMAP needs (base, memfd, slotfd, uffd)."""
    import mmap
    libc = libc_maps()
    s = raw_conn(sock)
    s.send(hdr(1, 16 + len(name)) + struct.pack("<IIQ", 1, len(name), 0) + name)
    data, anc, _, _ = s.recvmsg(200, socket.CMSG_SPACE(4))
    memfd = struct.unpack("i", anc[0][2][:4])[0]
    map_size = struct.unpack_from("<Q", data, 16 + 8)[0]
    slots = struct.unpack_from("<Q", data, 16 + 32)[0]
    keep = [memfd]
    if slots:
        _, anc2, _, _ = s.recvmsg(200, socket.CMSG_SPACE(4))
        keep.append(struct.unpack("i", anc2[0][2][:4])[0])
    base = libc.mmap(None, map_size, mmap.PROT_READ, mmap.MAP_SHARED, memfd, 0)
    uffd = libc.syscall(323, os.O_CLOEXEC | os.O_NONBLOCK)  # userfaultfd(2)
    api = bytearray(struct.pack("<QQQ", 0xaa, 1 << 10 | 1 << 2, 0))  # MINOR_SHMEM | EVENT_REMAP
    import fcntl
    fcntl.ioctl(uffd, UFFD_API, api)
    reg = bytearray(struct.pack("<QQQQ", base, map_size, 1 | 4, 0))  # MISSING | MINOR
    fcntl.ioctl(uffd, UFFDIO_REGISTER, reg)
    s.sendmsg([hdr(3, 16) + struct.pack("<QQ", base, map_size)],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", uffd))])
    ready = s.recv(100)
    assert struct.unpack_from("<H", ready, 6)[0] == 4, "READY"
    keep.append(uffd)
    if mapping is not None:
        mapping.update(base=base, memfd=memfd, slotfd=keep[1] if slots else -1, uffd=uffd)
    return s, keep


def remap_by_hand(mp, payload):
    """Carry out a REMAP as pager/client.c does: each range mapped afresh
    (from the slots, or the model's memfd), registered with the uffd, and
    moved into place."""
    import ctypes, fcntl, mmap
    libc = libc_maps()
    n = struct.unpack_from("<I", payload, 4)[0]
    for i in range(n):
        off, ln, frm = struct.unpack_from("<QQQ", payload, 8 + 24 * i)
        model = frm == (1 << 64) - 1
        tmp = libc.mmap(None, ln, mmap.PROT_READ, mmap.MAP_SHARED,
                        mp["memfd"] if model else mp["slotfd"], off if model else frm)
        assert tmp not in (None, ctypes.c_void_p(-1).value), "mmap"
        fcntl.ioctl(mp["uffd"], UFFDIO_REGISTER, bytearray(struct.pack("<QQQQ", tmp, ln, 1 | 4, 0)))
        moved = libc.mremap(tmp, ln, ln, 1 | 2, mp["base"] + off)  # MAYMOVE | FIXED
        assert moved == mp["base"] + off, "mremap"


def moe_fixture(tag):
    """The mixture-of-experts fixture: its name, path, tokens and the file of
    its logits on a plain mmap (TMP/TAG.plain); None without it."""
    m = "tiny-qwen3moe-q4_k_m.gguf"
    if m not in MODEL_DIR:
        return None
    p = path_of(m)
    toks = tokens_of(m)
    plain = os.path.join(TMP, f"{tag}.plain")
    run_eval(p, toks, plain)
    return m, p, toks, plain


def case_experts():
    """A mixture of experts through the pager an expert at a time: a budget
    that holds the cores and about two of the fixture's three layers of
    experts, so experts are evicted and read again; logits bit-identical to
    the plain mmap run, one token at a time and batched; the status shows the
    expert cache; an engine routing nonsense is dropped with one line; with
    --populate the cache's slots are made before any read and take every
    expert read."""
    fx = moe_fixture("experts")
    if not fx:
        return
    m, p, toks, plain = fx
    for b in ("512", "1"):  # the last daemon's status is checked below
        # the budget: what streaming needs, what this engine declares and
        # one layer's experts beyond the minimum's one
        d = Daemon([p])
        run_eval(p, toks, os.path.join(TMP, "experts.probe"), d.sock, ("-b", b))
        st = d.model(m)
        need = st["minimum_bytes"] + d.status()["declared_bytes"]
        per_layer = st["experts"]["bytes"] // len(st["experts"]["resident"])
        d.stop()
        d = Daemon([p], "--budget", str(need + per_layer), "--lookahead")
        out = os.path.join(TMP, f"experts.{b}")
        r = run_eval(p, toks, out, d.sock, ("-b", b))
        check(f"experts: batch {b} through expert units is bit-identical to mmap",
              r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read(),
              r.stderr.strip())
        if b != "1":
            d.stop()
    st = d.model(m)
    ex = st["experts"]
    check("experts: the cache holds fewer experts than the model has, within its capacity",
          0 < ex["held_bytes"] <= ex["capacity_bytes"] < ex["bytes"], str(ex))
    check("experts: experts were evicted and read again",
          ex["evictions"] > 0 and ex["loads"] > ex["evictions"], str(ex))
    # once the cache is full, experts are read into slots whose pages stay
    check("experts: once full, read into slots whose pages are reused, within the capacity",
          st["slots"] > 0 and 0 < st["slot_loads"] < ex["loads"] and
          0 < st["slot_bytes"] <= ex["capacity_bytes"] and
          st["slot_bytes"] // st["slot_size"] < st["slot_loads"],
          str({k: st[k] for k in ("slots", "slot_size", "slot_bytes", "slot_loads")}) + str(ex))
    check("experts: the status counts hits and misses",
          ex["hits"] > 0 and ex["misses"] > 0 and 0 < ex["hit_rate"] < 1 and
          ex["passes"] > 0 and ex["bytes_per_pass"] > 0, str(ex))
    check("experts: the layers' cores stay resident",
          all(l["state"] == "resident" for l in st["layers"]), str(st["layers"]))
    la = ex["lookahead"]
    check("experts: the engine's lookahead hinted, and experts read ahead were routed to",
          la["on"] and la["hinted"] > 0 and la["read_ahead"] > 0 and
          0 < la["read_ahead_used"] <= la["read_ahead"] and la["routed"] > 0 and
          0 < la["predicted"] <= la["routed"] and la["accuracy"] > 0, str(la))
    text = subprocess.run([CTL, "--socket", d.sock, "status"], capture_output=True,
                          text=True).stdout
    check("experts: stratactl shows the expert cache",
          "hit rate" in text and "experts per layer" in text, text)
    # hostile ROUTEs and HINTs: a layer or an expert the model lacks, an
    # expert twice, a count that does not match the message
    name = m.encode()
    for t, msg in ((13, "ROUTE"), (14, "HINT")):
        for what, body in (("a layer it lacks", struct.pack("<III", 99, 1, 0)),
                           ("an expert it lacks", struct.pack("<III", 0, 1, 8)),
                           ("an expert twice", struct.pack("<IIII", 0, 2, 1, 1)),
                           ("a count the message lacks", struct.pack("<III", 0, 2, 1)),
                           ("no experts", struct.pack("<II", 0, 0))):
            s, keep = uffd_session(d.sock, name)
            s.send(hdr(t, len(body)) + body)
            check(f"experts: a {msg} to {what} is dropped", dropped(s))
            s.close()
            for fd in keep:
                os.close(fd)
    log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
    check("experts: the drops are logged with their reason",
          "routed to an expert the model does not have" in log and
          "routed to an expert twice" in log, log[-500:])
    alive = run_eval(p, toks, os.path.join(TMP, "experts.after"), d.sock, ("-b", "1"))
    check("experts: the daemon serves on after them", alive.returncode == 0, alive.stderr)
    d.stop()
    # A HINT alone reads its experts: a client that never touches its
    # mapping (no fault at all) hints two experts of the last layer, which a
    # fresh daemon has not read; they come into memory, counted as read
    # ahead, before anything faults on them.
    d = Daemon([p], "--budget", str(need + per_layer), "--lookahead")
    last = len(d.model(m)["layers"]) - 1
    before = d.model(m)["experts"]
    s, keep = uffd_session(d.sock, name)
    body = struct.pack("<IIII", last, 2, 3, 5)
    s.send(hdr(14, len(body)) + body)
    st = wait_for(lambda: (lambda x: x if x["experts"]["resident"][last] == 2 and
                           x["experts"]["lookahead"]["read_ahead"] == 2 else None)(d.model(m)),
                  10, "the hinted experts read")
    check("experts: a HINT reads its experts ahead, before any fault",
          before["resident"][last] == 0 and st["experts"]["held_bytes"] > 0 and
          [c["faults"] for c in st["clients"]] == [0], str(before) + " -> " + str(st))
    s.close()
    for fd in keep:
        os.close(fd)
    d.stop()
    # Without --lookahead (the default): the engine is not asked for hints,
    # so it computes no guess and sends none, nothing is read ahead, and the
    # logits are the same
    d = Daemon([p], "--budget", str(need + per_layer))
    out = os.path.join(TMP, "experts.nolook")
    r = run_eval(p, toks, out, d.sock, ("-b", "1"))
    la = d.model(m)["experts"]["lookahead"]
    text = subprocess.run([CTL, "--socket", d.sock, "status"], capture_output=True,
                          text=True).stdout
    d.stop()
    check("experts: without --lookahead, bit-identical to mmap, no hint sent, nothing read ahead",
          r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read() and
          not la["on"] and la["hinted"] == 0 and la["read_ahead"] == 0 and
          "lookahead   off" in text, r.stderr.strip() + str(la) + text)
    # --populate: the cache's slots have their pages before anything is
    # read, as many as its capacity holds, and every expert read lands in
    # one of them; the logits are the same.  (The engine's declared memory
    # shrinks the cache as it connects: the slots past it are given back.)
    d = Daemon([p], "--budget", str(need + per_layer), "--populate")
    st0 = d.model(m)
    out = os.path.join(TMP, "experts.populate")
    r = run_eval(p, toks, out, d.sock, ("-b", "1"))
    st = d.model(m)
    d.stop()
    ex0, ex = st0["experts"], st["experts"]
    same = r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read()
    check("experts: --populate makes the cache's slots before any read, up to its capacity",
          ex0["loads"] == 0 and st0["slot_bytes"] > 0 and ex0["held_bytes"] == st0["slot_bytes"] and
          ex0["capacity_bytes"] - st0["slot_size"] < st0["slot_bytes"] <= ex0["capacity_bytes"],
          str({k: st0[k] for k in ("slots", "slot_size", "slot_bytes")}) + str(ex0))
    check("experts: with --populate every expert is read into a made slot, bit-identical to mmap",
          same and ex["loads"] > 0 and st["slot_loads"] == ex["loads"] and
          0 < st["slot_bytes"] <= st0["slot_bytes"] and ex["held_bytes"] <= ex["capacity_bytes"],
          f"identical: {same}, " + r.stderr.strip() +
          str({k: st[k] for k in ("slot_bytes", "slot_loads")}) + str(ex))
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        print("skip experts through the mount: needs /dev/fuse and root")
        return
    # Through the mount: a read inside an expert reads that expert, the
    # experts past the cache's capacity are dropped from the page cache, and
    # a dropped one read again comes back whole.
    mnt = os.path.join(TMP, "mnt-experts")
    os.makedirs(mnt, exist_ok=True)
    d = Daemon([p], "--fuse", mnt)
    need = d.model(m)["minimum_bytes"]
    d.stop()
    d = Daemon([p], "--budget", str(need + per_layer), "--fuse", mnt)
    out = os.path.join(TMP, "experts.fuse")
    r = [run_eval(os.path.join(mnt, m), toks, out, opts=("-b", "1")) for _ in range(2)][-1]
    st = d.model(m)
    d.stop()
    ex = st["experts"]
    check("experts: through the mount, bit-identical to mmap",
          r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read(),
          r.stderr.strip())
    check("experts: through the mount, experts past the capacity were dropped",
          ex["fuse_misses"] > 0 and ex["fuse_drops"] > 0, str(ex))
    # The fixture's experts (36 KiB) are far smaller than the kernel's reads
    # through the mount (1 MiB); with the real expert shape (2.6 MiB), a
    # token reads the parts of the experts it touches (and the kernel's
    # read-around of them), not whole layers of experts.
    big = os.path.join(TMP, "moe16.gguf")
    subprocess.run([MKMODEL, "--shape", "qwen3moe-30b-a3b", "--type", "q4_k_m", "--layers", "2",
                    "--experts", "16", "--vocab", "512", "--ctx", "256", "-o", big],
                   check=True, capture_output=True)
    d = Daemon([big], "--fuse", mnt)
    r = run_eval(os.path.join(mnt, "moe16.gguf"), "1", os.path.join(TMP, "moe16.out"))
    st = d.model("moe16.gguf")
    d.stop()
    os.unlink(big)
    ex = st["experts"]
    check("experts: a read inside an expert reads that expert, not its layer",
          r.returncode == 0 and ex["fuse_misses"] > 0 and st["bytes_read"] < ex["bytes"] // 2,
          f"{st['bytes_read']} bytes read, {ex}" + r.stderr)


def case_experts_shed():
    """The expert cache shrinks under a running engine: SIGUSR1 (the
    memory-pressure path) while an engine streams a mixture of experts whose
    cache is full, its experts in slots.  The capacity falls to one layer's
    experts; what it held beyond is evicted, the slots' pages punched (the
    running engine's ranges moved back by REMAPs first); the engine keeps
    running and another one's logits through the shrunk cache are
    bit-identical to mmap; SIGUSR2 gives the room back."""
    fx = moe_fixture("experts-shed")
    if not fx:
        return
    m, p, toks, plain = fx
    # the experts of the layer in use and one more layer's: the cache fills
    # and evicts, and SIGUSR1 sheds that layer's worth
    d = Daemon([p], "--resident", "1")
    ex = d.model(m)["experts"]
    per_layer = ex["bytes"] // len(ex["resident"])
    e = start_engine(p, d.sock, extra=("--context-shift",))
    first_output(e)
    # two thirds of the cache in slots, so that shrinking it to about half
    # must punch slots, not only experts in the memfd
    full = wait_for(lambda: (lambda x: x if x["slot_bytes"] > 2 * x["experts"]["capacity_bytes"]
                             // 3 else None)(d.model(m)), 120, "the expert cache full, in slots")
    d.p.send_signal(signal.SIGUSR1)

    def shrunk(x):
        ex = x["experts"]
        return x if ex["capacity_bytes"] < full["experts"]["capacity_bytes"] and \
            ex["held_bytes"] <= ex["capacity_bytes"] and \
            x["slot_bytes"] <= ex["capacity_bytes"] else None
    small = wait_for(lambda: shrunk(d.model(m)), 30, "the expert cache within its new capacity")
    out = os.path.join(TMP, "experts-shed.paged")
    r = run_eval(p, toks, out, d.sock, ("-b", "1"))
    running = e.poll() is None
    d.p.send_signal(signal.SIGUSR2)
    back = wait_for(lambda: (lambda x: x if x["experts"]["capacity_bytes"] ==
                             full["experts"]["capacity_bytes"] else None)(d.model(m)),
                    30, "the capacity restored")
    e.kill()
    e.wait()
    alive = d.p.poll() is None
    d.stop()
    f, s = full["experts"], small["experts"]
    check("experts-shed: SIGUSR1 shrinks a full expert cache to one layer's experts, and "
          "what it held beyond is evicted, slots and all",
          per_layer <= s["capacity_bytes"] < min(2 * per_layer, f["capacity_bytes"]) and
          s["evictions"] > f["evictions"] and
          small["slot_bytes"] < full["slot_bytes"],
          f"{per_layer} a layer; before {full['slot_bytes']} in slots, {f}; "
          f"after {small['slot_bytes']} in slots, {s}")
    check("experts-shed: the running engine keeps running", running)
    check("experts-shed: another engine through the shrunk cache is bit-identical to mmap",
          r.returncode == 0 and open(out, "rb").read() == open(plain, "rb").read(),
          r.stderr.strip())
    check("experts-shed: SIGUSR2 restores the capacity and the daemon lives on",
          alive and back["experts"]["capacity_bytes"] == f["capacity_bytes"])


def case_hostile():
    model = os.path.join(FIX, "models", "stories260K.gguf")
    d = Daemon([model], "--resident", "0")
    name = b"stories260K.gguf"
    hello = struct.pack("<IIQ", 1, len(name), 0) + name
    before = {
        "HELLO name length 4 GiB": hdr(1, 16) + struct.pack("<IIQ", 1, 0xffffffff, 0),
        "HELLO name longer than any path": hdr(1, 16 + 5000) + struct.pack("<IIQ", 1, 5000, 0) +
        b"a" * 5000,
        "length field 4 GiB": hdr(1, 0xffffffff) + hello,
        "PASS before READY": hdr(12, 32) + bytes(32),
        "DECLARE before READY": hdr(8, 16) + struct.pack("<QQ", 2**64 - 1, 2**64 - 1),
        "STATUS_REQ format 7": hdr(5, 4) + struct.pack("<I", 7),
    }
    for what, msg in before.items():
        s = raw_conn(d.sock)
        s.send(msg)
        check(f"hostile: {what} is dropped", dropped(s))
        s.close()
    # three descriptors with a HELLO
    s = raw_conn(d.sock)
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    s.sendmsg([hdr(1, len(hello)) + hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                              struct.pack("3i", *fds))])
    check("hostile: three file descriptors with HELLO are dropped", dropped(s))
    s.close()
    for f in fds:
        os.close(f)
    # REGISTER with a misaligned base and a length past the model
    for what, reg in (("misaligned base", struct.pack("<QQ", 4097, 1 << 20)),
                      ("length past the model", struct.pack("<QQ", 1 << 30, 1 << 62))):
        s, keep = None, []
        try:
            s = raw_conn(d.sock)
            s.send(hdr(1, len(hello)) + hello)
            _, anc, _, _ = s.recvmsg(200, socket.CMSG_SPACE(4))
            keep = [struct.unpack("i", anc[0][2][:4])[0]]
            import ctypes
            uffd = ctypes.CDLL(None).syscall(323, os.O_CLOEXEC | os.O_NONBLOCK)
            keep.append(uffd)
            s.sendmsg([hdr(3, 16) + reg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                             struct.pack("i", uffd))])
            check(f"hostile: REGISTER with a {what} is dropped", dropped(s))
        finally:
            if s:
                s.close()
            for f in keep:
                os.close(f)
    # after READY, on a real session
    after = {
        "PASS claiming 4 billion layers": hdr(12, 32) + struct.pack("<IIQIIII", 1, 0xffffffff,
                                                                    1, 1, 1, 1, 0),
        "PASS with more layers than the limit": hdr(12, 32 + 4 * 1001) +
        struct.pack("<IIQIIII", 1, 1001, 1, 1, 1, 1, 0) + bytes(4 * 1001),
        "a second HELLO": hdr(1, len(hello)) + hello,
        "REMAP from a client": hdr(10, 32) + struct.pack("<IIQQQ", 1, 1, 0, 4096, 0),
        "a stray descriptor with DECLARE": None,
    }
    for what, msg in after.items():
        s, keep = uffd_session(d.sock, name)
        try:
            if msg is None:
                r, w = os.pipe()
                keep += [r, w]
                s.sendmsg([hdr(8, 16) + struct.pack("<QQ", 1, 1)],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", r))])
            else:
                s.send(msg)
            check(f"hostile: after READY, {what} is dropped", dropped(s))
        finally:
            s.close()
            for f in keep:
                os.close(f)
    # a DECLARE of 2^64 - 1 bytes: refused by the budget, not an overflow
    s, keep = uffd_session(d.sock, name)
    s.send(hdr(8, 16) + struct.pack("<QQ", 2**64 - 1, 2**64 - 1))
    st = d.status()
    s.close()
    for f in keep:
        os.close(f)
    check("hostile: a DECLARE of 2^64 - 1 bytes leaves the budget sane",
          st is not None and all(m["resident_bytes"] <= 2**40 for m in st["models"]), str(st)[:300])
    out = os.path.join(TMP, "after-hostile")
    r = run_eval(model, tokens_of("stories260K.gguf"), out, d.sock)
    alive = d.p.poll() is None
    d.stop()
    log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
    check("hostile: the malformed messages are logged",
          "sent a malformed message" in log and "file descriptor" in log, log[-500:])
    check("hostile: the daemon still serves a real client", alive and r.returncode == 0,
          r.stderr)


def case_peercred():
    if os.geteuid() != 0:
        print("skip peercred: needs root (to run a client as nobody)")
        return
    model = os.path.join(FIX, "models", "stories260K.gguf")
    sdir = tempfile.mkdtemp(prefix="peercred-")
    os.chmod(sdir, 0o755)
    d = Daemon([model], sock=os.path.join(sdir, "s.sock"))
    os.chmod(d.sock, 0o777)  # the file lets anyone connect: the credentials decide
    client = ("import socket, struct, sys\n"
              "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
              "s.connect(sys.argv[1]); s.settimeout(5)\n"
              "try:\n"
              f"    s.send(struct.pack('<IHHII', 0x41525453, {PROTO_VERSION}, 1, 16, 0) + "
              "struct.pack('<IIQ', 2, 0, 0))\n"
              f"    s.send(struct.pack('<IHHII', 0x41525453, {PROTO_VERSION}, 5, 4, 0) + "
              "struct.pack('<I', 0))\n"
              "    d = s.recv(100000)\n"
              "except OSError:\n    d = b''\n"
              "print('served' if len(d) > 16 else 'refused')\n")
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        sys.executable, "-c", client, d.sock], capture_output=True, text=True,
                       timeout=30)
    me = subprocess.run([sys.executable, "-c", client, d.sock], capture_output=True, text=True,
                        timeout=30)
    alive = d.p.poll() is None
    d.stop()
    subprocess.run(["rm", "-rf", sdir])
    log = open(os.path.join(TMP, "stratad.log"), errors="replace").read()
    check("peercred: a client running as nobody is refused", r.stdout.strip() == "refused",
          r.stdout + r.stderr)
    check("peercred: the refusal is logged with its uid", "refused a connection from uid" in log,
          log[-300:])
    check("peercred: a client of the daemon's own user is served",
          alive and me.stdout.strip() == "served", me.stdout + me.stderr)


CASES = {"identical": case_identical, "share": case_share,
         "share-streaming": case_share_streaming, "garbage": case_garbage,
         "kill-engine": case_kill_engine, "kill-daemon": case_kill_daemon, "stale": case_stale,
         "unreadable": case_unreadable, "shed": case_shed, "fuse": case_fuse,
         "fuse-kill": case_fuse_kill, "fuse-mixed": case_fuse_mixed, "warm": case_warm,
         "accounting": case_accounting, "io-probe": case_io_probe, "plan": case_plan,
         "spec": case_spec, "read-error": case_read_error, "short-read": case_short_read,
         "early-eof": case_early_eof, "changed": case_changed, "restart": case_restart,
         "late-guardian": case_late_guardian,
         "kill-streaming": case_kill_streaming, "hostile": case_hostile,
         "experts": case_experts, "experts-shed": case_experts_shed,
         "peercred": case_peercred, "slow-remaps": case_slow_remaps,
         "stalled-remaps": case_stalled_remaps}

# the fault-injection cases: their own meson test (pager-faults), run in
# parallel with the others
FAULT_CASES = ["read-error", "short-read", "early-eof", "changed", "restart", "late-guardian",
               "kill-streaming", "hostile", "peercred"]
args = sys.argv[1:] or [c for c in CASES if c not in FAULT_CASES]
if args == ["faults"]:
    args = FAULT_CASES
for name in args:
    try:
        CASES[name]()
    except Exception as ex:  # a broken case must fail, not stop the others
        check(f"{name}: ran to the end", False, repr(ex))
subprocess.run(["rm", "-rf", TMP])
print(f"{len(failures)} failures" if failures else "all pager tests passed")
sys.exit(1 if failures else 0)
