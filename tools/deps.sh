#!/usr/bin/env bash
# Install the Debian packages strata builds and runs with.  Idempotent: does
# nothing when everything is already there.  Needs root (or sudo) only when
# something is missing.
set -euo pipefail
pkgs=(meson ninja-build pkg-config gcc libc6-dev libpcre2-dev liburing-dev libfuse3-dev
      libnuma-dev libsystemd-dev fuse3 python3 libmicrohttpd-dev libjson-c-dev
      clang libclang-rt-14-dev systemd)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "strata: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
