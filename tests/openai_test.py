#!/usr/bin/env python3
"""A real third-party client, unchanged: the official `openai` npm package
(pinned below) lists the models, does a chat completion and the same chat
streamed against `strata serve` (stories260K, with an API key), and sees an
unknown model as its NotFoundError.  The package is installed once with npm
into the build directory (CI reaches the npm registry) and reused.
"""
import json, os, re, shutil, signal, subprocess, sys

OPENAI_VERSION = "4.95.0"
strata = os.environ["STRATA_BIN"]
fix = os.environ["STRATA_FIXTURES"]
build = os.environ["STRATA_BUILD_DIR"]
here = os.path.dirname(os.path.abspath(__file__))
model = os.path.join(fix, "models/stories260K.gguf")
if not os.path.exists(model):
    print(f"SKIP: no fixtures under {fix}")
    sys.exit(77)
if not shutil.which("node") or not shutil.which("npm"):
    print("FAIL: node and npm are needed (Debian: nodejs, npm)")
    sys.exit(1)

prefix = os.path.join(build, "npm-openai")
pkg = os.path.join(prefix, "node_modules", "openai", "package.json")
installed = os.path.exists(pkg) and json.load(open(pkg)).get("version") == OPENAI_VERSION
if not installed:
    os.makedirs(prefix, exist_ok=True)
    r = subprocess.run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund",
                        "--loglevel=error", f"openai@{OPENAI_VERSION}"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        print(f"FAIL: npm install openai@{OPENAI_VERSION}: {r.stderr.strip()}")
        sys.exit(1)

p = subprocess.Popen([strata, "serve", "-m", model, "--port", "0", "-t", "1", "-np", "2",
                      "--api-key", "sekrit", "-c", "512"], stderr=subprocess.PIPE, text=True)
failed = 0
try:
    port = None
    for line in p.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = m.group(1)
        if " ready: " in line:
            break
    env = dict(os.environ, NODE_PATH=os.path.join(prefix, "node_modules"))
    r = subprocess.run(["node", os.path.join(here, "openai_client.js"), port, "sekrit"],
                       capture_output=True, text=True, timeout=300, env=env)
    if r.returncode:
        print("FAIL: the client failed:", r.stderr.strip())
        sys.exit(1)
    out = json.loads(r.stdout)

    def check(ok, what):
        global failed
        print(("ok  " if ok else "FAIL"), what)
        failed += not ok

    check(out["models"] == ["stories260K.gguf"], "models.list()")
    check(bool(out["whole"]) and out["finish"] in ("stop", "length"),
          f"chat.completions.create: {out['whole']!r}")
    check(out["usage"]["completion_tokens"] > 0 and out["usage"]["total_tokens"] ==
          out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"], "usage")
    check(out["streamed"] == out["whole"] and out["chunks"] > 2,
          f"streamed: the same text in {out['chunks']} chunks")
    check(out["notfound"] == 404, f"an unknown model: NotFoundError ({out['notfound']})")
finally:
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
sys.exit(1 if failed else 0)
