#!/usr/bin/env python3
"""strata-mkmodel's types as docs/mkmodel.md states them, on the tiny shape.

For every --type: the file is the size `--list` gives, each tensor has the
type the mix's rule gives it (the *_M mixes: Q6_K for output, and for attn_v
and ffn_down in the layers llama.cpp's use_more_bits picks), and strata
decodes it (`strata run`, 8 tokens, exit 0).  The benchmarks stand on these
files: a Q5_K_M model that held Q4_K blocks would measure the wrong kernels.
"""
import os
import struct
import subprocess
import sys
import tempfile

strata = os.environ["STRATA_BIN"]
mkmodel = os.environ["STRATA_MKMODEL_BIN"]

# GGML type numbers, as the GGUF tensor infos carry them
NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
VALUE = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
         12: "d"}


def tensor_types(path):
    """{tensor name: type name} from a GGUF v3 header"""
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))

        def rstr():
            return f.read(rd("Q")[0]).decode()

        def skip(t):
            if t in VALUE:
                rd(VALUE[t])
            elif t == 8:
                rstr()
            else:  # array
                et, n = rd("I")[0], rd("Q")[0]
                for _ in range(n):
                    skip(et)

        magic, _, n_tensors, n_kv = rd("4sIQQ")
        assert magic == b"GGUF"
        for _ in range(n_kv):
            rstr()
            skip(rd("I")[0])
        types = {}
        for _ in range(n_tensors):
            name = rstr()
            rd("Q" * rd("I")[0])
            types[name] = NAMES.get(rd("I")[0], "?")
            rd("Q")
        return types


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def want_type(mix, name, n_layer):
    role = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
    if role.endswith("norm"):
        return "F32"
    flat = {"f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q6_k": "Q6_K"}
    if mix in flat:
        return flat[mix]
    base = {"q4_k_m": "Q4_K", "q5_k_m": "Q5_K"}[mix]
    if role == "output":
        return "Q6_K"
    if role in ("attn_v", "ffn_down") and more_bits(int(name.split(".")[1]), n_layer):
        return "Q6_K"
    return base


failed = 0


def check(what, ok, detail=""):
    global failed
    print(("ok " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))
    failed += not ok


listing = subprocess.run([mkmodel, "--list", "--shape", "tiny"], capture_output=True, text=True,
                         check=True).stdout.split("\n")
head, row = listing[0].split(), listing[1].split()
mixes = head[head.index("params") + 1:-1]
check("--list names q5_k_m", "q5_k_m" in mixes, " ".join(mixes))

with tempfile.TemporaryDirectory() as d:
    for mix in mixes:
        out = os.path.join(d, mix + ".gguf")
        r = subprocess.run([mkmodel, "--shape", "tiny", "--type", mix, "-o", out],
                           capture_output=True, text=True)
        check(f"{mix}: made", r.returncode == 0, r.stderr.strip())
        if r.returncode:
            continue
        mib = float(row[head.index(mix)])
        check(f"{mix}: {mib} MiB as --list says", abs(os.path.getsize(out) / 2**20 - mib) < 0.06,
              f"{os.path.getsize(out) / 2**20:.2f} MiB")
        types = tensor_types(out)
        n_layer = 1 + max(int(n.split(".")[1]) for n in types if n.startswith("blk."))
        wrong = [f"{n} {t}" for n, t in sorted(types.items()) if t != want_type(mix, n, n_layer)]
        check(f"{mix}: every tensor's type follows the rule ({len(types)} tensors)", not wrong,
              ", ".join(wrong[:4]))
        r = subprocess.run([strata, "run", "-m", out, "-p", "Once upon a time", "-n", "8",
                            "--temp", "0"], capture_output=True, text=True, errors="replace")
        check(f"{mix}: strata decodes it", r.returncode == 0 and "generated 8 tokens" in r.stderr,
              r.stderr.strip()[-300:])

sys.exit(1 if failed else 0)
