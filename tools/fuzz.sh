#!/usr/bin/env bash
# tools/fuzz.sh HARNESS SECONDS - run one libFuzzer harness (tests/fuzz/,
# docs/security.md) for SECONDS, from its committed corpus, and end with one
# line: "HARNESS: N runs in S s, cov C ft F, no finding" (exit 0), or the
# finding's file (exit 1).  Exit 77 when clang with libFuzzer is missing.
#
# The harnesses are built in a clang build dir of their own ($STRATA_FUZZ_BUILD,
# default build-fuzz), configured on first use with -Dfuzzing=enabled.  New
# inputs the run finds go to that dir (corpus/HARNESS), not into the tree;
# findings to findings/HARNESS-*.  Add a finding to tests/fuzz/corpus/HARNESS/
# (named regress-*) once its bug is fixed: every run replays the corpus first.
# The whole log is in logs/HARNESS-SECONDSs.log.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 2 ] || ! [[ $2 =~ ^[0-9]+$ ]] || ! [ -f "tests/fuzz/$1.c" ]; then
	echo "usage: tools/fuzz.sh HARNESS SECONDS (HARNESS: $(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//' | tr '\n' ' '))" >&2
	exit 2
fi
h=$1 secs=$2
bdir=${STRATA_FUZZ_BUILD:-build-fuzz}
if ! command -v clang >/dev/null; then
	echo "fuzz.sh: SKIP: clang is not installed (the harnesses need libFuzzer)"
	exit 77
fi
if [ ! -f "$bdir/build.ninja" ]; then
	if ! CC=clang meson setup "$bdir" -Dfuzzing=enabled >"/tmp/strata-fuzz-setup.$$" 2>&1; then
		if grep -q "needs clang with libFuzzer" "/tmp/strata-fuzz-setup.$$"; then
			echo "fuzz.sh: SKIP: clang cannot link libFuzzer (-fsanitize=fuzzer)"
			rm -f "/tmp/strata-fuzz-setup.$$"
			exit 77
		fi
		cat "/tmp/strata-fuzz-setup.$$" >&2
		rm -f "/tmp/strata-fuzz-setup.$$"
		exit 1
	fi
	rm -f "/tmp/strata-fuzz-setup.$$"
fi
# the harnesses only (not the whole project); flock: the suite may build two at once
flock "$bdir/.fuzz-build.lock" ninja -C "$bdir" "tests/fuzz/$h" >/dev/null
mkdir -p "$bdir/corpus/$h" "$bdir/findings" "$bdir/logs"
log=$bdir/logs/$h-${secs}s.log
export STRATA_FIXTURES=${STRATA_FIXTURES:-$PWD/../shared/fixtures}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
rc=0
"$bdir/tests/fuzz/$h" -max_total_time="$secs" -max_len=262144 -timeout=20 -rss_limit_mb=2560 \
	-print_final_stats=1 -artifact_prefix="$bdir/findings/$h-" \
	"$bdir/corpus/$h" "tests/fuzz/corpus/$h" >"$log" 2>&1 || rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
if [ $rc -ne 0 ]; then
	found=$(sed -n 's/^.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
	grep -E 'ERROR|SUMMARY|runtime error' "$log" | head -5 >&2 || true
	echo "$h: FINDING after ${runs:-?} runs: ${found:-see $log} (exit $rc)"
	exit 1
fi
echo "$h: ${runs:-?} runs in $secs s, cov ${cov:-?} ft ${ft:-?}, no finding"
