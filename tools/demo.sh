#!/usr/bin/env bash
# The main job in one command: install dependencies, build, and generate.
#   tools/demo.sh [MODEL.gguf [PROMPT]]
# Without a model it uses the fixture stories260K.gguf from ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
tools/build.sh
model=${1:-../shared/fixtures/models/stories260K.gguf}
prompt=${2:-Once upon a time}
exec build/engine/strata run -m "$model" -p "$prompt" -n 128
