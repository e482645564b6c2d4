#!/usr/bin/env bash
# The main job in one command: install dependencies, build, start the pager
# daemon with a memory budget, generate through it, and show residency.
#
#   tools/demo.sh [MODEL.gguf [PROMPT]]
#
# Without a model it makes a synthetic 1B-shaped Q4_0 model (random weights:
# the text is noise, the streaming is real) under /var/tmp/strata-demo.
# BUDGET (bytes or 512M/2G...) defaults to half the model and room for the
# engine's own memory, so about half of the layers stream from storage while
# it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
tools/build.sh
model=${1:-}
prompt=${2:-Once upon a time}
if [ -z "$model" ]; then
	mkdir -p /var/tmp/strata-demo
	model=/var/tmp/strata-demo/llama-1b-q4_0.gguf
	[ -f "$model" ] || build/tools/strata-mkmodel --shape llama-1b --type q4_0 -o "$model"
fi
# half the model for its layers, and room for what the engine declares
# against the budget (its heap and KV cache: about 180 MiB here); a budget
# that cannot hold both is refused, by the daemon or for the engine
budget=${BUDGET:-$(( $(stat -c %s "$model") / 2 + (256 << 20) ))}
sock=$(mktemp -u /tmp/strata-demo-XXXXXX.sock)
build/daemon/stratad --socket "$sock" --budget "$budget" "$model" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 300); do [ -S "$sock" ] && break; kill -0 $daemon || exit 1; sleep 0.1; done
# a 512-token context is plenty for this run, and its KV cache (which the
# engine declares against the budget) stays small
build/strata run --pager "$sock" -m "$model" -p "$prompt" -n 32 -c 512
echo
build/tools/stratactl --socket "$sock" status
