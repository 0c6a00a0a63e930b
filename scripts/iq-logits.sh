#!/usr/bin/env bash
# IQ-format, MXFP4 and ternary (TQ1_0, TQ2_0) files made by llama.cpp's quantiser from the fixture
# qwen3moe-tiny-F32.gguf (each mixed with K-quants, as llama-quantize mixes
# them), against llama.cpp's own logits (core/tests/iq_logits.rs).
#
# Builds llama-quantize and llama-imatrix in the bench-compare host build
# (~/.cache/pocket/llama-build-host, made by `cargo xtask bench-compare`),
# a small dump tool against its libllama (iq-logits/dump_logits.c: the fixture
# store's settings), quantises into $OUT (default /tmp/pocket-iq), dumps the
# teacher-forced logits of the manifest's 16 prompt tokens next to each file
# and runs the test on every kernel path this CPU has.
set -euo pipefail
cd "$(dirname "$0")/.."

FIXTURES=${POCKET_FIXTURES:-$(cd ../shared/fixtures 2>/dev/null && pwd)}
BUILD=${LLAMA_BUILD:-$HOME/.cache/pocket/llama-build-host}
SRC=${LLAMA_SRC:-$(ls -d "$HOME"/.cache/pocket/llama-src/*/vendor/llama.cpp | head -1)}
OUT=${OUT:-/tmp/pocket-iq}
JOBS=${CARGO_BUILD_JOBS:-2}
BIN=$BUILD/bin
F32=$FIXTURES/models/qwen3moe-tiny-F32.gguf
mkdir -p "$OUT"

cmake --build "$BUILD" -j "$JOBS" --target llama-quantize llama-imatrix >/dev/null
gcc -O1 -o "$OUT/dump_logits" scripts/iq-logits/dump_logits.c -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$BIN" -lllama -Wl,-rpath,"$BIN"
TOKENS=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); \
print(' '.join(map(str, next(x for x in m['models'] if x['name']=='qwen3moe-tiny')['prompt'])))" "$FIXTURES/manifest.json")

export LD_LIBRARY_PATH=$BIN
# IQ3_XXS and the IQ1/IQ2 types need an importance matrix.
"$BIN/llama-imatrix" -m "$F32" -f "$FIXTURES/tokenizer/ppl_text.txt" -o "$OUT/imatrix.gguf" -c 128 --chunks 16 \
    -t "$JOBS" >"$OUT/imatrix.log" 2>&1
quantize() { # type, extra arguments
    local ty=$1
    shift
    "$BIN/llama-quantize" "$@" "$F32" "$OUT/qwen3moe-tiny-$ty.gguf" "$ty" "$JOBS" >"$OUT/quantize-$ty.log" 2>&1
    echo "$ty: $(grep -o 'converting to [a-z0-9_]*' "$OUT/quantize-$ty.log" | sort | uniq -c | awk '{printf "%s %s, ", $1, $4}')"
    # shellcheck disable=SC2086
    "$OUT/dump_logits" "$OUT/qwen3moe-tiny-$ty.gguf" "$OUT/qwen3moe-tiny-$ty.llama.f32" $TOKENS 2>/dev/null
}
quantize IQ4_XS
quantize IQ4_NL
quantize IQ3_S
quantize MXFP4_MOE
quantize TQ1_0
quantize TQ2_0
# attn_q as IQ3_XXS too (the mix would make it IQ2_S otherwise).
quantize IQ3_XXS --imatrix "$OUT/imatrix.gguf" --tensor-type attn_q=iq3_xxs
# The token embedding as Q2_K: IQ2_S/IQ2_M would make it IQ3_S. (The IQ2_S
# file type writes IQ2_XS tensors; IQ2_M's are IQ2_S.)
for q in IQ2_XXS IQ2_XS IQ2_M IQ1_S IQ1_M; do
    quantize $q --imatrix "$OUT/imatrix.gguf" --token-embedding-type q2_k
done

for isa in $(POCKET_FIXTURES=$FIXTURES cargo test -q -p pocket-core --lib -- show_isa --nocapture 2>&1 |
    sed -n 's/.*available: \[\(.*\)\]).*/\1/p' | tr -d ',' | tr 'A-Z' 'a-z'); do
    echo "== POCKET_ISA=$isa"
    POCKET_ISA=$isa POCKET_IQ_DIR=$OUT POCKET_FIXTURES=$FIXTURES \
        cargo test -q --release -p pocket-core --test iq_logits -- --ignored --nocapture 2>&1 | grep -E "median|test result|panicked"
done
