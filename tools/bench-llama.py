#!/usr/bin/env python3
"""strata's kernels against llama.cpp's, fully resident, in interleaved rounds.

  tools/bench-llama.py --model M.gguf [--model ...] --llama NAME=PATH[:LIBDIR] [...]
                       [--isa avx512,avx2] [--reps 3] [--threads 2]
                       [--prompt 64] [--tokens 16] [--batch 8]

Per round, per model, each run after reading the model's file into the page
cache:

  strata ISA   `STRATA_ISA=ISA strata bench -m M -p PROMPT -n TOKENS` for each
               ISA asked for: the prompt's and decode's tok/s;
  pass         `STRATA_ISA=ISA strata bench -m M -p BATCH -n TOKENS`: one pass
               over BATCH positions, its time set against a decode token of
               the same run (the cost of verifying BATCH drafts at once;
               --batch 0 leaves it out, and --prompt 0 the prompt: e.g. decode
               alone, --prompt 0 --batch 0 --tokens 32; prompts alone,
               --tokens 0 --batch 0);
  llama NAME   `llama-bench -m M -p PROMPT -n TOKENS -r 1` of each build given
               (e.g. default=/work/llama/build-default/bin/llama-bench,
               avx2=/work/llama/build-avx2-default/bin/llama-bench; with LIBDIR,
               its ggml libraries from there first).

Each run, with the reading before it, holds the machine's benchmark lock
(/tmp/strata-bench.lock) and lets it go after, so that other sessions
measure between runs: run the script WITHOUT an outer `flock` of that file
(it would wait for itself; it exits saying so).

Prints a markdown table of medians (runs in brackets) and the ratios strata /
llama.cpp of each ISA against each build, so that each path is compared with
the build that uses the same instructions (pair them in the text): the ratio
of the medians, then each round's own ratio in brackets (a round's two runs
follow each other, and a host's memory speed can change from one round to
the next: docs/benchmarks.md, issue 17, session 36).
"""
import argparse, json, os, statistics, subprocess, sys

from benchlib import STRATA, bench_lock, llama_bench, llama_spec, warm

ap = argparse.ArgumentParser()
ap.add_argument("--model", action="append", required=True)
ap.add_argument("--llama", action="append", default=[], help="NAME=PATH[:LIBDIR]")
ap.add_argument("--isa", default="avx512,avx2")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--prompt", type=int, default=64)
ap.add_argument("--tokens", type=int, default=16)
ap.add_argument("--batch", type=int, default=8)
a = ap.parse_args()
if a.batch and not a.tokens:
    ap.error("--batch sets a pass against a decode token: it needs --tokens (or --batch 0)")
isas = a.isa.split(",")
llamas = {n: (p, lib) for n, p, lib in map(llama_spec, a.llama)}


def strata(model, isa, prompt, tokens):
    env = dict(os.environ, STRATA_ISA=isa)
    with bench_lock():
        warm(model)
        r = subprocess.run([STRATA, "bench", "-m", model, "-p", str(prompt), "-n", str(tokens),
                            "-t", str(a.threads), "--no-hw", "--json"], capture_output=True,
                           text=True, env=env)
    if r.returncode:
        sys.exit(f"strata bench failed: {r.stderr}")
    return json.loads(r.stdout)


def llama(spec, model):
    with bench_lock():
        warm(model)
        return llama_bench(spec[0], model, a.prompt, a.tokens, a.threads, spec[1])


def speeds(prompt, decode):
    """"prompt P, decode D tok/s", of the parts this run measures."""
    parts = [f"prompt {prompt:.2f}"] if a.prompt else []
    parts += [f"decode {decode:.2f}"] if a.tokens else []
    return ", ".join(parts) + " tok/s"


runs = {}  # (model, engine) -> {"prompt": [...], "decode": [...], "pass": [...]}
dead = {}  # llama.cpp build -> why it failed: left out of the rest of the run
for rep in range(a.reps):
    for m in a.model:
        name = os.path.basename(m)
        for isa in isas:
            j = strata(m, isa, a.prompt, a.tokens)
            r = runs.setdefault((name, "strata " + isa), {"prompt": [], "decode": [], "pass": []})
            r["prompt"].append(j["prompt_tps"] if a.prompt else None)
            r["decode"].append(j["decode_tps"] if a.tokens else None)
            line = speeds(j.get("prompt_tps"), j.get("decode_tps"))
            if a.batch:
                b = strata(m, isa, a.batch, a.tokens)
                # seconds of one BATCH-position pass over seconds of one
                # token, both from one process: a host's memory can change
                # speed between two runs (docs/benchmarks.md, issue 17,
                # session 45)
                r["pass"].append(a.batch / b["prompt_tps"] * b["decode_tps"])
                line += f", {a.batch} positions {r['pass'][-1]:.2f}x a token"
            print(f"rep {rep + 1} {name} strata {isa}: {line}", file=sys.stderr)
        for lname, spec in llamas.items():
            if lname in dead:
                continue
            j, err = llama(spec, m)
            if err:
                # a build that dies on this CPU (a native build using an
                # instruction the machine lacks: SIGILL) dies every time
                dead[lname] = err
                print(f"rep {rep + 1} {name} llama.cpp {lname}: failed, {err}", file=sys.stderr)
                continue
            r = runs.setdefault((name, "llama.cpp " + lname), {"prompt": [], "decode": []})
            r["prompt"].append(j.get("prompt"))
            r["decode"].append(j.get("decode"))
            line = speeds(j.get("prompt"), j.get("decode"))
            print(f"rep {rep + 1} {name} llama.cpp {lname}: {line}", file=sys.stderr)


def med(v):
    return statistics.median(v)


def fmt(v):
    if not v or v[0] is None:
        return "-"
    return f"{med(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})"


def ratio(s, l):
    """The ratio of the medians, and each round's (a round whose llama.cpp
    run failed has none)."""
    if not s or s[0] is None:
        return "-"
    rounds = ", ".join(f"{x / y:.2f}" for x, y in zip(s, l))
    return f"{med(s) / med(l):.2f} ({rounds})"


print(f"{a.reps} interleaved rounds, {a.threads} threads, prompt {a.prompt}, decode {a.tokens}; "
      f"pass: one pass over {a.batch} positions / one decode token.\n")
pass_col = f"{a.batch}-position pass" if a.batch else "pass"
print(f"| model | engine | {a.prompt}-token prompt tok/s | decode tok/s | {pass_col} |")
print("|---|---|---|---|---|")
for (name, eng), r in runs.items():
    p = fmt(r["pass"]) + "x" if r.get("pass") else ""
    print(f"| {name} | {eng} | {fmt(r['prompt'])} | {fmt(r['decode'])} | {p} |")
for lname, why in dead.items():
    print(f"\nllama.cpp {lname} left out: {why}")
if set(llamas) - set(dead):
    print(f"\n| model | strata / llama.cpp | prompt | decode |")
    print("|---|---|---|---|")
    for m in a.model:
        name = os.path.basename(m)
        for isa in isas:
            s = runs[(name, "strata " + isa)]
            for lname in llamas:
                if (name, "llama.cpp " + lname) not in runs:
                    continue
                l = runs[(name, "llama.cpp " + lname)]
                print(f"| {name} | {isa} / {lname} | {ratio(s['prompt'], l['prompt'])} | "
                      f"{ratio(s['decode'], l['decode'])} |")
