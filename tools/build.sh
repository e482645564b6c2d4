#!/usr/bin/env bash
# Configure (once) and build strata into ./build.  Extra arguments go to
# `meson setup` the first time, e.g. tools/build.sh -Dwerror=true.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
	meson setup build "$@" >/dev/null
elif [ $# -gt 0 ]; then
	meson configure build "$@" >/dev/null
fi
ninja -C build >/dev/null
