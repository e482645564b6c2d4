#!/usr/bin/env bash
# The test command: build if needed, run the whole suite, and end with one
# line "N passed, N failed, N skipped".  Arguments go to `meson test`
# (e.g. --suite engine, or a test name).
#
# tools/test.sh --sanitize [ARGS]: the same suite built with AddressSanitizer
# and UndefinedBehaviorSanitizer (meson -Db_sanitize=address,undefined) in
# build-san/ (docs/security.md).  The fuzzing suite is left to the plain run
# (its harnesses are sanitized builds of their own), and so are the other
# kernel sets' runs of the logits tests (suite variants: test_quant checks
# those kernels under the sanitizers).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build
setup=()
if [ "${1:-}" = "--sanitize" ]; then
	shift
	dir=build-san
	setup=(-Db_sanitize=address,undefined)
	set -- --no-suite fuzz --no-suite variants "$@"
fi
export STRATA_BUILDDIR=$dir
tools/deps.sh || exit 1
tools/build.sh "${setup[@]}" || exit 1
meson test -C "$dir" --print-errorlogs "$@" | tee "$dir/test-output.txt"
rc=${PIPESTATUS[0]}
python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
res = [json.loads(l)["result"] for l in open(sys.argv[1]) if l.strip()]
ok = sum(r in ("OK", "EXPECTEDFAIL") for r in res)
skip = sum(r == "SKIP" for r in res)
print(f"{ok} passed, {len(res) - ok - skip} failed, {skip} skipped")
PY
exit $rc
