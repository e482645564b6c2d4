#!/usr/bin/env python3
"""`strata tokenize` against every vocabulary test vector in fixtures/vocab.

Each X.gguf.inp holds inputs separated by "\n__ggml_vocab_test__\n" (the last
one followed by it too); X.gguf.out holds the expected ids, one line per input,
without BOS.  Every input goes through the real command line (text on stdin,
--no-bos).  WordPiece (bert) vocabularies must be refused with exit 2.
"""
import glob, os, subprocess, sys

strata = os.environ["STRATA_BIN"]
fix = os.environ["STRATA_FIXTURES"]
vocabs = sorted(glob.glob(os.path.join(fix, "vocab", "*.gguf.inp")))
if not vocabs:
    print(f"SKIP: no vocabulary fixtures under {fix}")
    sys.exit(77)

failed = 0
for inp in vocabs:
    gguf = inp[: -len(".inp")]
    name = os.path.basename(gguf)
    with open(inp, "rb") as f:
        cases = f.read().split(b"\n__ggml_vocab_test__\n")
    if cases and cases[-1] == b"":
        cases.pop()
    with open(gguf + ".out", "rb") as f:
        want = f.read().decode().split("\n")
    if want and want[-1] == "":
        want.pop()
    if "bert" in name:
        r = subprocess.run([strata, "tokenize", "-m", gguf, "--no-bos", "--text", "x"],
                           capture_output=True)
        ok = r.returncode == 2 and b"bert" in r.stderr and r.stderr.startswith(b"strata: ")
        print(("ok" if ok else "FAIL"), name, "refused:", r.stderr.decode().strip())
        failed += not ok
        continue
    if len(cases) != len(want):
        print(f"FAIL {name}: {len(cases)} inputs but {len(want)} expected lines")
        failed += 1
        continue
    bad = 0
    for text, exp in zip(cases, want):
        r = subprocess.run([strata, "tokenize", "-m", gguf, "--no-bos"], input=text,
                           capture_output=True)
        got = r.stdout.decode().strip()
        if r.returncode != 0 or got.split() != exp.split():
            if bad < 3:
                print(f"  {name}: input {text!r}\n    want {exp.strip()}\n    got  {got} "
                      f"(exit {r.returncode}) {r.stderr.decode().strip()}")
            bad += 1
    print(("ok" if not bad else "FAIL"), f"{name}: {len(cases) - bad}/{len(cases)} inputs")
    failed += bad > 0
sys.exit(1 if failed else 0)
