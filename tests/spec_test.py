#!/usr/bin/env python3
"""Speculative decoding through `strata run`, as users rely on it.

  identical   on every fixture model, greedy text with speculation is the
              plain greedy text byte for byte: with --lookup; with the model
              itself as its draft, always drafting 5 (every draft accepted);
              with another model of the same vocabulary as the draft where
              the fixtures have one (most drafts rejected) and lookup beside
              it, adaptive; and with a batch of 4 (sliding-window rings of
              window + 3 rows) drafting 3
  mismatch    a draft model of another vocabulary is refused: one line
              naming the mismatch, exit 2
  sampled     sampling with a draft and lookup runs to its end; with a fixed
              draft count the text is the same for the same seed (adaptive,
              how many are drafted follows measured times, and so do the
              draws: the distribution is the model's, the text is not
              reproducible)
  full        speculating into a full context stops with the one-line notice,
              or goes on with --context-shift
"""
import os, subprocess, sys

strata = os.environ["STRATA_BIN"]
fix = os.environ["STRATA_FIXTURES"]
models = ["models/stories260K", "models/tiny-llama-f16", "models/tiny-llama-q4_0",
          "models/tiny-llama-q4_k_m", "models/tiny-llama-q6_k", "models/tiny-llama-q8_0",
          "models/tiny-qwen2-q4_k_m", "arch/models/tiny-qwen3-q4_k_m",
          "arch/models/tiny-gemma2-q4_k_m", "arch/models/tiny-gemma3-q4_k_m",
          "arch/models/tiny-gemma3-q8_0", "arch/models/tiny-phi3-q4_k_m",
          "arch/models/tiny-qwen35-q4_k_m", "arch/models/tiny-llama-bf16"]
# a draft of the same vocabulary, where the fixtures have one
other = {"models/tiny-llama-q8_0": "models/tiny-llama-q4_0",
         "models/tiny-llama-q4_k_m": "models/tiny-llama-q6_k",
         "arch/models/tiny-gemma2-q4_k_m": "models/tiny-llama-q4_0",
         "arch/models/tiny-qwen3-q4_k_m": "models/tiny-qwen2-q4_k_m",
         "arch/models/tiny-qwen35-q4_k_m": "arch/models/tiny-qwen3-q4_k_m"}
path = lambda m: os.path.join(fix, m + ".gguf")
if not os.path.exists(path(models[0])):
    print(f"SKIP: no fixtures under {fix}")
    sys.exit(77)

failed = 0


def check(ok, what):
    global failed
    print(("ok  " if ok else "FAIL"), what)
    failed += not ok


def run(model, *args, n=48, prompt="Once upon a time, in a"):
    return subprocess.run([strata, "run", "-m", path(model), "-p", prompt, "-n", str(n),
                           "-c", "256", "-t", "2", *args], capture_output=True, timeout=120)


plains = {}


for m in models:
    if not os.path.exists(path(m)):
        check(False, f"{m}: fixture missing")
        continue
    plain = run(m, "--temp", "0")
    plain96 = run(m, "--temp", "0", "-n", "96")
    if plain.returncode != 0 or plain96.returncode != 0:
        check(False, f"{m}: plain run failed: {plain.stderr.decode().strip()}")
        continue
    variants = [["--lookup", "-n", "96"],
                ["--draft-model", path(m), "--draft-min", "5", "--draft-max", "5"],
                ["-b", "4", "--draft-model", path(m), "--lookup", "--draft-min", "3",
                 "--draft-max", "3"]]
    if m in other:
        variants.append(["--draft-model", path(other[m]), "--lookup"])
    for v in variants:
        r = run(m, "--temp", "0", *v)
        stats = [l for l in r.stderr.decode().splitlines() if "speculation:" in l]
        want = plain96 if "96" in v else plain
        same = r.returncode == 0 and r.stdout == want.stdout and len(stats) == 1
        name = " ".join(os.path.basename(a) for a in v)
        check(same, f"{m} [{name}]: {stats[0][8:] if stats else r.stderr.decode().strip()}")
        if not same and r.returncode == 0:
            print("   plain:", want.stdout[:120])
            print("   spec: ", r.stdout[:120])

# a draft of another vocabulary
r = run("models/tiny-llama-q4_0", "--draft-model", path("models/stories260K"))
err = r.stderr.decode().strip().splitlines()
check(r.returncode == 2 and len(err) == 1 and "vocabulary" in err[0] and
      err[0].startswith("strata: "), f"mismatched vocabulary refused: {err}")

# sampling with a draft and lookup: runs; reproducible by seed with a fixed count
ad = run("models/stories260K", "--temp", "0.8", "--seed", "7", "--draft-model",
         path("models/stories260K"), "--lookup", n=96)
check(ad.returncode == 0 and len(ad.stdout) > 100,
      f"sampled with adaptive speculation: {len(ad.stdout)} bytes")
fixed = ["--temp", "0.8", "--seed", "7", "--draft-model", path("models/tiny-llama-q4_0"),
         "--draft-min", "4", "--draft-max", "4"]
s1 = run("models/tiny-llama-q8_0", *fixed, n=96)
s2 = run("models/tiny-llama-q8_0", *fixed, n=96)
check(s1.returncode == 0 and len(s1.stdout) > 100 and s1.stdout == s2.stdout,
      f"sampled, 4 drafts a pass: {len(s1.stdout)} bytes, the same for the same seed")

# the context fills while speculating
full = subprocess.run([strata, "run", "-m", path("models/stories260K"), "-p", "Once upon a time",
                       "-n", "400", "-c", "64", "--temp", "0", "--lookup", "--draft-model",
                       path("models/stories260K")], capture_output=True, timeout=120)
check(full.returncode == 0 and b"context of 64 tokens is full" in full.stderr,
      "a full context stops with the notice")
shift = subprocess.run([strata, "run", "-m", path("models/stories260K"), "-p", "Once upon a time",
                        "-n", "200", "-c", "64", "--temp", "0", "--lookup", "--draft-model",
                        path("models/stories260K"), "--context-shift"],
                       capture_output=True, timeout=120)
words = shift.stdout.decode(errors="replace").split()
check(shift.returncode == 0 and b"is full" not in shift.stderr and len(words) > 100,
      f"--context-shift goes on while speculating ({len(words)} words)")
sys.exit(1 if failed else 0)
