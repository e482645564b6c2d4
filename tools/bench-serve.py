#!/usr/bin/env python3
"""Serving concurrent requests, measured: aggregate decode tok/s of K streamed
requests at once against one request alone, through `strata serve -np K`.

  streamed   the model through the pager at --budget (stratad; the layers
             beyond the budget read from storage every pass): a pass costs
             about one read of them whatever its rows, so K sequences should
             decode for about the price of one
  resident   plain mmap, the file in the page cache: the weights' memory
             traffic is shared the same way; per-row compute is not

Each round, in each setting, one request alone and then K together (the
order alternating between rounds), after a warm-up request.  A request's
rate is counted between its first and its last streamed token (prompt time
excluded); K together are counted over the window in which all K are
decoding (from the last first token to the first last token): the tokens
all K received in it over its length.  Medians of the rounds.

usage: tools/bench-serve.py --model M.gguf [--budget 2G] [--rounds 3] [-n 24]
       [--clients 4] [-t 2] [-c 512]
Run as root (drops the page cache before each streamed server), under
flock /tmp/strata-bench.lock.
"""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import STRATA, drop_caches, size, start_daemon  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", required=True)
ap.add_argument("--budget", default="2G")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("-n", type=int, default=24, help="tokens per request")
ap.add_argument("--clients", type=int, default=4)
ap.add_argument("-t", "--threads", type=int, default=2)
ap.add_argument("-c", "--ctx", type=int, default=512)
ap.add_argument("--modes", default="streamed,resident")
a = ap.parse_args()

sock = f"/tmp/strata-bench-serve-{os.getpid()}.sock"
PROMPTS = ["Once upon a time", "The weather today", "In a small village", "A long road",
           "She opened the door", "Numbers and letters", "The ship sailed", "Under the bridge"]


def serve(pager):
    cmd = [STRATA, "serve", "-m", a.model, "--port", "0", "-np", str(a.clients), "-t",
           str(a.threads), "-c", str(a.ctx)] + (["--pager", sock] if pager else [])
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if " ready: " in line:
            break
    else:
        p.wait(60)
        raise RuntimeError("strata serve did not come up")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, port


def stream(port, prompt, out, n=None):
    """One streamed completion of n (a.n) tokens: the times its events
    arrived (a token each while decoding is slower than delivering, as with
    the models this is for)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = {"prompt": prompt, "max_tokens": n or a.n, "temperature": 0, "stream": True}
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    times = []
    for line in r:
        if line.startswith(b"data: {"):
            d = json.loads(line[6:])
            ch = d["choices"][0]
            if ch["text"]:
                times.append(time.monotonic())
            if ch["finish_reason"]:
                out.append((times, d["usage"]["completion_tokens"], ch["finish_reason"]))
    c.close()


def together(port, k):
    """k requests at once: aggregate tok/s while all k decode."""
    outs = [[] for _ in range(k)]
    ts = [threading.Thread(target=stream, args=(port, PROMPTS[i % len(PROMPTS)], outs[i]))
          for i in range(k)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    times = [o[0][0] for o in outs]
    if any(len(t) < 3 for t in times):
        sys.exit("a request ended early: " + str([(len(o[0][0]), o[0][2]) for o in outs]))
    if k == 1:
        t = times[0]
        return (len(t) - 1) / (t[-1] - t[0])
    start = max(t[0] for t in times)
    end = min(t[-1] for t in times)
    got = sum(sum(1 for x in t if start < x <= end) for t in times)
    return got / (end - start)


modes = a.modes.split(",")
res = {(m, k): [] for m in modes for k in (1, a.clients)}
for r in range(a.rounds):
    for m in modes:
        d = p = None
        try:
            if m == "streamed":
                drop_caches()
                d = start_daemon(sock, ["--budget", str(size(a.budget)), a.model])
            p, port = serve(m == "streamed")
            stream(port, "Warm up", [], n=4)  # the pager's plan, the page cache
            order = (1, a.clients) if r % 2 == 0 else (a.clients, 1)
            for k in order:
                res[(m, k)].append(together(port, k))
        finally:
            for x in (p, d):
                if x:
                    x.send_signal(signal.SIGTERM)
                    x.wait(60)
        print(f"round {r + 1} {m}: " + ", ".join(
            f"{k} at once {res[(m, k)][-1]:.3f} tok/s" for k in (1, a.clients)), flush=True)

print(f"\nAggregate decode tok/s, {a.n} tokens a request, -t {a.threads}, -c {a.ctx} "
      f"(median of {a.rounds} interleaved rounds):\n")
print(f"| setting | 1 request | {a.clients} at once | x |")
print("|---|---|---|---|")
for m in modes:
    one = statistics.median(res[(m, 1)])
    many = statistics.median(res[(m, a.clients)])
    name = f"streamed, --budget {a.budget}" if m == "streamed" else "resident"
    print(f"| {name} | {one:.3f} | {many:.3f} | {many / one:.2f} |")
