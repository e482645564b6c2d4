#!/usr/bin/env python3
"""strata-repack as a user runs it, and Q4_0_R16 files as strata reads them.

- The repacked Q4_0 fixture gives the original's logits bit for bit, through
  each kernel set (scalar, avx2, avx512 where the CPU has it), so it matches
  the reference as the original does (the logits tests).
- Its header lists the matrices as type 64 (Q4_0_R16) and token_embd as Q4_0;
  the file is the original's size.
- Written onto another filesystem (tmpfs), the same bytes.
- Bad input: usage (1), not GGUF and nothing to repack (2), one-line
  messages, and no OUT or temporary file left behind.
- Hand-edited R16 types where they cannot be (token_embd, a 1-D norm) are
  refused by strata with exit 2 and a message naming the tensor.
- --layers 1: a draft of the first layer and everything outside the layers,
  with block_count 1; as --draft-model every one of its tensors is read from
  the model's mapping, and greedy text is the plain greedy text; more layers
  than the model has, or a bad count, exit 2 with one line and no file.
"""
import os, struct, subprocess, sys, tempfile

strata = os.environ["STRATA_BIN"]
repack = os.environ["STRATA_REPACK_BIN"]
fix = os.environ["STRATA_FIXTURES"]
src = os.path.join(fix, "models", "tiny-llama-q4_0.gguf")
if not os.path.exists(src):
    print(f"SKIP: no fixture {src}")
    sys.exit(77)

failed = 0


def check(ok, name, detail=""):
    global failed
    print(("ok " if ok else "FAIL ") + name + (f" ({detail})" if detail and not ok else ""))
    failed += not ok


def tensors(path):
    """name -> (type, offset of the type field) from a GGUF header."""
    with open(path, "rb") as f:
        b = f.read(1 << 20)
    assert b[:4] == b"GGUF"
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    p = 24

    def skip_val(p, vt):
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if vt == 8:
            (n,) = struct.unpack_from("<Q", b, p)
            return p + 8 + n
        if vt == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                p = skip_val(p, et)
            return p
        return p + sizes[vt]

    for _ in range(n_kv):
        (kl,) = struct.unpack_from("<Q", b, p)
        p += 8 + kl
        (vt,) = struct.unpack_from("<I", b, p)
        p = skip_val(p + 4, vt)
    out = {}
    for _ in range(n_t):
        (nl,) = struct.unpack_from("<Q", b, p)
        name = b[p + 8 : p + 8 + nl].decode()
        p += 8 + nl
        (nd,) = struct.unpack_from("<I", b, p)
        p += 4 + 8 * nd
        (ty,) = struct.unpack_from("<I", b, p)
        out[name] = (ty, p)
        p += 4 + 8
    return out


def logits(model, isa, out):
    env = dict(os.environ, STRATA_ISA=isa)
    r = subprocess.run([strata, "eval", "-m", model, "--tokens", "1,403,407,261,100,200",
                        "--logits-out", out], env=env, capture_output=True)
    return r.returncode, open(out, "rb").read() if r.returncode == 0 else r.stderr


with tempfile.TemporaryDirectory() as t:
    dst = os.path.join(t, "r16.gguf")
    r = subprocess.run([repack, src, dst], capture_output=True)
    check(r.returncode == 0 and b"repacked to Q4_0_R16" in r.stdout, "repack: exit 0",
          r.stderr.decode())
    check(os.path.getsize(dst) == os.path.getsize(src), "repack: same size as the original")
    ts = tensors(dst)
    mats = [n for n in ts if n.startswith("blk.") and n.endswith(".weight") and
            "norm" not in n]
    check(mats and all(ts[n][0] == 64 for n in mats), "repack: every layer matrix is Q4_0_R16")
    check(ts["token_embd.weight"][0] == 2, "repack: token_embd stays Q4_0")
    check(sorted(os.listdir(t)) == ["r16.gguf"], "repack: no temporary file left")

    # onto another filesystem (copy_file_range refuses ext4 -> tmpfs): the
    # same bytes
    if os.path.isdir("/dev/shm") and os.stat("/dev/shm").st_dev != os.stat(src).st_dev:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
            other = os.path.join(shm, "r16.gguf")
            r = subprocess.run([repack, src, other], capture_output=True)
            check(r.returncode == 0 and open(other, "rb").read() == open(dst, "rb").read(),
                  "repack: onto another filesystem, the same bytes", r.stderr.decode())

    for isa in ("scalar", "avx2", "avx512"):
        a = logits(src, isa, os.path.join(t, "a"))
        b = logits(dst, isa, os.path.join(t, "b"))
        check(a[0] == 0 and a == b, f"logits of the repacked model are the original's bits ({isa})")

    # bad input to the tool
    def tool(want, name, *args):
        r = subprocess.run([repack, *args], capture_output=True)
        err = r.stderr.decode().strip().split("\n")
        check(r.returncode == want and (want == 1 or (len(err) == 1 and
              err[0].startswith("strata-repack: "))), name, f"{r.returncode} {err}")

    tool(1, "repack: usage", src)
    bad = os.path.join(t, "bad.gguf")
    open(bad, "wb").write(b"not a model")
    tool(2, "repack: not GGUF", bad, os.path.join(t, "x.gguf"))
    tool(2, "repack: nothing to repack", os.path.join(fix, "models", "tiny-llama-q4_k_m.gguf"),
         os.path.join(t, "x.gguf"))
    check(sorted(os.listdir(t)) == ["a", "b", "bad.gguf", "r16.gguf"],
          "repack: a failed run leaves no file")

    # R16 where strata cannot read it
    def patched(name):
        img = bytearray(open(dst, "rb").read())
        struct.pack_into("<I", img, ts[name][1], 64)
        p = os.path.join(t, "p.gguf")
        open(p, "wb").write(img)
        return p

    for name, why in (("token_embd.weight", "token embeddings must keep a row layout"),
                      ("output_norm.weight", "not a matrix of whole 16-row groups")):
        r = subprocess.run([strata, "eval", "-m", patched(name), "--tokens", "1",
                            "--logits-out", os.path.join(t, "x")], capture_output=True)
        err = r.stderr.decode()
        check(r.returncode == 2 and why in err and name in err and err.count("\n") == 1,
              f"strata refuses Q4_0_R16 {name}", err.strip())

    # --layers: a self-speculative draft
    draft = os.path.join(t, "draft.gguf")
    r = subprocess.run([repack, "--layers", "1", src, draft], capture_output=True)
    check(r.returncode == 0 and b"1 layers" in r.stdout, "--layers 1: exit 0", r.stderr.decode())
    dt, st = tensors(draft), tensors(src)
    want = [n for n in st if not n.startswith("blk.") or n.startswith("blk.0.")]
    check(sorted(dt) == sorted(want), "--layers 1: the first layer and the rest, no other layer")
    r = subprocess.run([strata, "eval", "-m", draft, "--tokens", "1,403", "--logits-out",
                        os.path.join(t, "x")], capture_output=True)
    check(r.returncode == 0, "--layers 1: strata loads it (block_count 1)", r.stderr.decode())
    run = [strata, "run", "-m", src, "-p", "Once upon a time", "-n", "40", "--temp", "0"]
    plain = subprocess.run(run, capture_output=True)
    spec = subprocess.run(run + ["--draft-model", draft], capture_output=True)
    shared = f"{len(want)} tensors".encode()
    check(spec.returncode == 0 and spec.stdout == plain.stdout and plain.stdout,
          "--layers 1 as a draft: greedy text is the plain text", spec.stderr.decode())
    check(b"draft: " + shared in spec.stderr and b"are the model's own" in spec.stderr,
          "--layers 1 as a draft: all its tensors are read from the model's mapping",
          spec.stderr.decode())
    tool(2, "--layers more than the model has", "--layers", "99", src, os.path.join(t, "y.gguf"))
    tool(2, "--layers 0", "--layers", "0", src, os.path.join(t, "y.gguf"))
    check(not [f for f in os.listdir(t) if f.startswith("y.gguf")],
          "--layers: a failed run leaves no file")

sys.exit(1 if failed else 0)
