#!/usr/bin/env bash
# The test command: build if needed, run the whole suite, and end with one
# line "N passed, N failed, N skipped".  Arguments go to `meson test`
# (e.g. --suite engine, or a test name).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh || exit 1
tools/build.sh || exit 1
meson test -C build --print-errorlogs "$@" | tee build/test-output.txt
rc=${PIPESTATUS[0]}
python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
res = [json.loads(l)["result"] for l in open(sys.argv[1]) if l.strip()]
ok = sum(r in ("OK", "EXPECTEDFAIL") for r in res)
skip = sum(r == "SKIP" for r in res)
print(f"{ok} passed, {len(res) - ok - skip} failed, {skip} skipped")
PY
exit $rc
