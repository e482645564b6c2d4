#!/usr/bin/env bash
# The suite's fuzzing: every libFuzzer harness (tests/fuzz/) for a short time
# (STRATA_FUZZ_SECONDS, default 15) through tools/fuzz.sh, which replays the
# committed corpus (and the regression inputs in it) first.  Any finding
# fails the test; no clang with libFuzzer skips it (77), saying so.
set -uo pipefail
cd "$(dirname "$0")/../.."
secs=${STRATA_FUZZ_SECONDS:-15}
failed=0
for h in fuzz_gguf fuzz_tokenize fuzz_vocab fuzz_proto_server fuzz_proto_client fuzz_template fuzz_request; do
	tools/fuzz.sh "$h" "$secs"
	rc=$?
	[ $rc -eq 77 ] && exit 77
	[ $rc -ne 0 ] && failed=1
done
exit $failed
