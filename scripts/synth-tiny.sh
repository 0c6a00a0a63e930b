#!/usr/bin/env bash
# The tiny synthetic models the logits tests of families without shipped
# fixtures read: made by `cargo xtask synth-model` (fixed seed, so the same
# bytes every time; each test checks its file's sha256) into
# ${POCKET_SYNTH_TINY:-$HOME/.cache/pocket/synth-tiny} where missing. Prints
# the directory, for `export POCKET_SYNTH_TINY=$(scripts/synth-tiny.sh)`.
# One line per file: architecture, geometry, preset, file name.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${POCKET_SYNTH_TINY:-$HOME/.cache/pocket/synth-tiny}
mkdir -p "$dir"

synth() {
    local arch=$1 geometry=$2 quant=$3 name=$4
    if [ ! -f "$dir/$name" ]; then
        cargo xtask synth-model --arch "$arch" --geometry "$geometry" --quant "$quant" --out "$dir/$name.part" >&2
        mv "$dir/$name.part" "$dir/$name"
    fi
}

synth gpt-oss tiny q8_0 gptoss-tiny-q8_0.gguf
synth gpt-oss tiny mxfp4_moe gptoss-tiny-mxfp4_moe.gguf

echo "$dir"
