#!/usr/bin/env bash
# The tiny synthetic models the logits tests of families without shipped
# fixtures read: made by `cargo xtask synth-model` (fixed seed, so the same
# bytes every time; each test checks its file's sha256) into
# ${POCKET_SYNTH_TINY:-$HOME/.cache/pocket/synth-tiny} where missing. Prints
# the directory, for `export POCKET_SYNTH_TINY=$(scripts/synth-tiny.sh)`.
# One line per file: its name, then synth-model's arguments. After a change
# to synth-model, delete the directory's file to remake it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${POCKET_SYNTH_TINY:-$HOME/.cache/pocket/synth-tiny}
mkdir -p "$dir"

synth() { # NAME ARGS...: write $dir/NAME.gguf with synth-model ARGS unless present
    local name="$1"
    shift
    if [ ! -f "$dir/$name.gguf" ]; then
        cargo xtask synth-model "$@" --out "$dir/$name.gguf.part" >&2
        mv "$dir/$name.gguf.part" "$dir/$name.gguf"
    fi
}

synth gptoss-tiny-q8_0 --arch gpt-oss --geometry tiny --quant q8_0
synth gptoss-tiny-mxfp4_moe --arch gpt-oss --geometry tiny --quant mxfp4_moe
synth olmoe-tiny-q8_0 --arch olmoe --geometry tiny --quant q8_0
synth ernie4_5-moe-tiny-q8_0 --arch ernie4_5-moe --geometry tiny --quant q8_0
# qwen35moe with its MTP (nextn) layer: the MTP drafter against llama.cpp's draft-mtp (core/tests/speculation.rs)
synth qwen35moe-tiny-mtp-Q8_0 --arch qwen35moe --geometry tiny --quant q8_0 --mtp

echo "$dir"
