#!/usr/bin/env bash
# Configure (once) and build strata into ./build.  Extra arguments go to
# `meson setup` the first time, e.g. tools/build.sh -Dwerror=true.
# STRATA_BUILDDIR names another build dir (tools/test.sh --sanitize: build-san).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${STRATA_BUILDDIR:-build}
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" "$@" >/dev/null
elif [ $# -gt 0 ]; then
	meson configure "$dir" "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null
