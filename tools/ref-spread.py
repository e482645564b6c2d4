#!/usr/bin/env python3
"""How far apart the reference engine's own builds are on a fixture, beside strata.

Each ROWS file is one row of n_vocab little-endian floats per token of the
fixture (its prompt_tokens then its greedy_tokens, fed one at a time):
tools/llama_logits.c writes them for a llama.cpp build, `strata eval
--logits-out` for strata.  For every file, against the fixture's reference
logits: the worst row's max |difference| in sigmas of the reference row (what
test_logits checks), and the greedy rows where its argmax is not the
reference's token, with the reference's top-2 gap there.  Then the same
between every pair of files, so the distance between two configurations of
the reference engine stands beside strata's distance from the reference.

  F=../shared/fixtures/arch; N=tiny-phi3-q4_k_m
  T=$(python3 -c "import json; d = json.load(open('$F/ref/$N.json'));
      print(','.join(map(str, d['prompt_tokens'] + d['greedy_tokens'])))")
  build/strata eval -m $F/models/$N.gguf --tokens $T --logits-out /tmp/$N.strata.f32
  /tmp/llama_logits $F/models/$N.gguf $T /tmp/$N.llama.f32
  /tmp/llama_logits --no-repack $F/models/$N.gguf $T /tmp/$N.llama-norepack.f32
  tools/ref-spread.py --fixtures $F $N strata=/tmp/$N.strata.f32 \
      llama=/tmp/$N.llama.f32 llama-norepack=/tmp/$N.llama-norepack.f32
"""
import argparse
import itertools
import json
import math
import os
import struct
import sys


def read_rows(path, code, rows, n_vocab):
    """rows x n_vocab little-endian values of struct code ('e' f16, 'f' f32)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != rows * n_vocab * struct.calcsize(code):
        sys.exit(f"ref-spread: {path} is not {rows} x {n_vocab} '{code}' values")
    x = struct.unpack(f"<{rows * n_vocab}{code}", data)
    return [x[r * n_vocab:(r + 1) * n_vocab] for r in range(rows)]


def load_fixture(fixtures, name):
    with open(os.path.join(fixtures, "ref", name + ".json")) as f:
        js = json.load(f)
    path = os.path.join(fixtures, "ref", js["logits_file"])
    return js, read_rows(path, "e", js["rows"], js["n_vocab"])


def sigma(row):
    mean = sum(row) / len(row)
    return math.sqrt(sum((v - mean) ** 2 for v in row) / len(row))


def spread(a, b):
    """Worst row of max|a - b| in sigmas of b's row, and that row."""
    rel = [max(abs(x - y) for x, y in zip(ra, rb)) / sigma(rb) for ra, rb in zip(a, b)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    return rel[worst], worst


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


def top2_gap(row):
    top = sorted(row)[-2:]
    return (top[1] - top[0]) / sigma(row)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", required=True, help="a fixtures directory (models/, ref/)")
    ap.add_argument("name", help="the fixture, e.g. tiny-phi3-q4_k_m")
    ap.add_argument("rows", nargs="+", help="LABEL=FILE of float32 rows")
    a = ap.parse_args()

    js, ref = load_fixture(a.fixtures, a.name)
    n_prompt, greedy = len(js["prompt_tokens"]), js["greedy_tokens"]
    sets = {}
    for spec in a.rows:
        label, _, path = spec.partition("=")
        if not path:
            sys.exit(f"ref-spread: '{spec}' is not LABEL=FILE")
        sets[label] = read_rows(path, "f", js["rows"], js["n_vocab"])

    print(f"{a.name}: {len(ref)} rows; against the reference ({js['reference']})")
    print("| rows | worst row, sigma | greedy tokens not the reference's (its top-2 gap) |")
    print("|---|---|---|")
    for label, x in sets.items():
        worst, row = spread(x, ref)
        differ = []
        for k, tok in enumerate(greedy):
            r = n_prompt - 1 + k
            if argmax(x[r]) != tok:
                differ.append(f"row {r} ({top2_gap(ref[r]):.3f})")
        print(f"| {label} | {worst:.4f} (row {row}) | {', '.join(differ) or 'none'} |")
    if len(sets) > 1:
        print("\nbetween the files (worst row, sigma of the second's rows):")
        for (la, xa), (lb, xb) in itertools.combinations(sets.items(), 2):
            worst, row = spread(xa, xb)
            print(f"  {la} vs {lb}: {worst:.4f} (row {row})")


if __name__ == "__main__":
    main()
