#!/usr/bin/env bash
# The tiny synthetic models the tests check against llama.cpp (made by
# `cargo xtask synth-model`, deterministic): each is written into
# ${POCKET_SYNTH_TINY:-$HOME/.cache/pocket/synth-tiny} if missing, and the
# directory is printed (the tests read POCKET_SYNTH_TINY):
#   export POCKET_SYNTH_TINY=$(scripts/synth-tiny.sh)
# One line per file below; core/tests/data/synth/<name>.sha256 holds each one's hash.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${POCKET_SYNTH_TINY:-$HOME/.cache/pocket/synth-tiny}"
mkdir -p "$dir"

synth() { # NAME ARGS...: write $dir/NAME.gguf with synth-model ARGS unless present
    local name="$1"
    shift
    if [ ! -f "$dir/$name.gguf" ]; then
        cargo xtask synth-model "$@" --out "$dir/$name.gguf.tmp" >&2
        mv "$dir/$name.gguf.tmp" "$dir/$name.gguf"
    fi
}

synth qwen35moe-tiny-mtp-Q8_0 --arch qwen35moe --geometry tiny --quant q8_0 --mtp

echo "$dir"
