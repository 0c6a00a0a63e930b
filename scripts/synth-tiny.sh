#!/usr/bin/env bash
# The tiny synthetic models the `*_logits` tests of families without shipped
# fixtures read (`cargo xtask synth-model`, fixed seed: the same bytes every
# time, checked by the tests against core/tests/data/synth/NAME.sha256).
# Writes each missing one into ${POCKET_SYNTH_TINY:-~/.cache/pocket/synth-tiny}
# and prints the directory:
#   export POCKET_SYNTH_TINY=$(scripts/synth-tiny.sh)
# After a change to synth-model, delete the directory's file to remake it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${POCKET_SYNTH_TINY:-$HOME/.cache/pocket/synth-tiny}"
mkdir -p "$dir"

# synth NAME ARCH GEOMETRY QUANT
synth() {
    if [ ! -f "$dir/$1.gguf" ]; then
        cargo xtask synth-model --arch "$2" --geometry "$3" --quant "$4" --out "$dir/$1.gguf.part" >&2
        mv "$dir/$1.gguf.part" "$dir/$1.gguf"
    fi
}

synth olmoe-tiny-q8_0 olmoe tiny q8_0
synth ernie4_5-moe-tiny-q8_0 ernie4_5-moe tiny q8_0

echo "$dir"
