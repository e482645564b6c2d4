#!/usr/bin/env python3
"""Does the engine decode faster from 2 MiB pages?  The measurement behind
issue 5's "huge pages, kept only if they win" (docs/benchmarks.md).

The same model, the same engine, three places for the weights, run in turn
(interleaved, so the shared machine's drift hits all three alike):

  file     the model file's page cache, read once before (plain mmap, what
           `strata -m FILE` does; ext4 may map large folios with PMDs)
  shmem    a memfd (tmpfs, 4 KiB pages), what stratad's store is
  hugetlb  a MFD_HUGETLB memfd (2 MiB pages from the hugetlb pool), what
           stratad's store would be on huge pages

The engine maps /proc/self/fd/N of the memfd it inherits, so it computes
from exactly those pages.  Reserves the pool it needs in
/proc/sys/vm/nr_hugepages and puts the old value back, also on errors.
Needs root.  Prints one line per run and the medians.

  tools/bench-hugepages.py --model /work/bench/llama-8b-q4_0.gguf --reps 7
"""
import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys

HUGE = 2 << 20
NR = '/proc/sys/vm/nr_hugepages'
HERE = os.path.dirname(os.path.abspath(__file__))


def fill_memfd(model, flags, size):
    """A memfd of `size` bytes holding the model file; returns its fd."""
    fd = os.memfd_create('strata-bench', flags)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as m, open(model, 'rb') as f:
            off = 0
            while chunk := f.read(64 << 20):
                m[off:off + len(chunk)] = chunk
                off += len(chunk)
    except OSError:
        os.close(fd)
        raise
    return fd


def bench(strata, path, prompt, tokens, fds=()):
    out = subprocess.run([strata, 'bench', '-m', path, '-p', str(prompt), '-n', str(tokens),
                          '--json', '--no-hw'], stdout=subprocess.PIPE, pass_fds=fds,
                         check=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--model', required=True)
    ap.add_argument('--reps', type=int, default=7)
    ap.add_argument('--prompt', type=int, default=8, help='prompt tokens per run')
    ap.add_argument('--tokens', type=int, default=48, help='decoded tokens per run')
    ap.add_argument('--strata', default=os.path.join(HERE, '..', 'build', 'strata'))
    a = ap.parse_args()

    size = os.path.getsize(a.model)
    huge_size = (size + HUGE - 1) // HUGE * HUGE
    with open(NR) as f:
        old = int(f.read())
    need = old + huge_size // HUGE
    try:
        with open(NR, 'w') as f:
            f.write(str(need))
        with open(NR) as f:
            got = int(f.read())
        if got < need:
            sys.exit(f'bench-hugepages: only {got} of {need} huge pages could be reserved')
        res = {}
        for r in range(a.reps):
            for kind in ('file', 'shmem', 'hugetlb'):
                if kind == 'file':
                    subprocess.run(['cat', a.model], stdout=subprocess.DEVNULL, check=True)
                    d = bench(a.strata, a.model, a.prompt, a.tokens)
                else:
                    fd = fill_memfd(a.model, os.MFD_HUGETLB if kind == 'hugetlb' else 0,
                                    huge_size if kind == 'hugetlb' else size)
                    try:
                        d = bench(a.strata, f'/proc/self/fd/{fd}', a.prompt, a.tokens, (fd,))
                    finally:
                        os.close(fd)
                res.setdefault(kind, []).append(d)
                print(f'run {r + 1} {kind:8s} decode {d["decode_tps"]:.3f} tok/s  '
                      f'prompt {d["prompt_tps"]:.3f} tok/s', flush=True)
    finally:
        with open(NR, 'w') as f:
            f.write(str(old))
    print(f'medians of {a.reps} ({a.prompt}-token prompt, {a.tokens} decoded tokens):')
    for kind, ds in res.items():
        dec = statistics.median(d['decode_tps'] for d in ds)
        pp = statistics.median(d['prompt_tps'] for d in ds)
        print(f'  {kind:8s} decode {dec:.3f} tok/s  prompt {pp:.3f} tok/s')


if __name__ == '__main__':
    main()
