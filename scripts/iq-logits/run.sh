#!/usr/bin/env bash
# Pocket against llama.cpp on IQ1/IQ2 files made by llama.cpp's own quantiser:
# qwen3moe-tiny-F32 -> llama-imatrix -> llama-quantize --imatrix to IQ2_XXS,
# IQ2_XS, IQ2_M (IQ2_S tensors), IQ1_S, IQ1_M (each mixed with K-quants, as
# llama-quantize mixes them), then the 16-token fixture prompt's logits from
# both engines (scalar and the selected SIMD path), compared by compare.py.
# Needs the host llama.cpp build of `cargo xtask` (~/.cache/pocket/llama-build-host)
# and POCKET_FIXTURES. Work files go to ${OUT:-/tmp/iq-logits}.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${POCKET_CACHE:-$HOME/.cache/pocket}
BUILD=$CACHE/llama-build-host
SRC=$(ls -d "$CACHE"/llama-src/*/vendor/llama.cpp | head -1)
FIX=${POCKET_FIXTURES:?set POCKET_FIXTURES}
OUT=${OUT:-/tmp/iq-logits}
mkdir -p "$OUT"
F32=$FIX/models/qwen3moe-tiny-F32.gguf
TOKENS=785,2062,2174,315,2869,681,374,393,277,285,11,323,279,2062,2174,315

cmake --build "$BUILD" -j "${JOBS:-1}" --target llama-imatrix llama-quantize >/dev/null
cc -O1 -o "$OUT/llama-logits" scripts/iq-logits/llama-logits.c -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin"
cargo build -q --release -j "${JOBS:-1}" -p pocket-cli
POCKET=target/release/pocket

"$BUILD/bin/llama-imatrix" -m "$F32" -f "$FIX/tokenizer/ppl_text.txt" -o "$OUT/imatrix.gguf" -c 128 --chunks 16 -t 2 \
    >"$OUT/imatrix.log" 2>&1
fail=0
for q in IQ2_XXS IQ2_XS IQ2_M IQ1_S IQ1_M; do
    m=$OUT/qwen3moe-tiny-$q.gguf
    # The token embedding as Q2_K: IQ2_S/IQ2_M would make it IQ3_S.
    "$BUILD/bin/llama-quantize" --imatrix "$OUT/imatrix.gguf" --token-embedding-type q2_k "$F32" "$m" "$q" 2 \
        >"$OUT/quantize-$q.log" 2>&1
    "$OUT/llama-logits" "$m" "$OUT/$q.llama.f32" "$TOKENS" 2>/dev/null
    types=$("$POCKET" inspect "$m" | awk '/^type/{t=1; next} t && NF>=2 && $1 ~ /^[A-Z]/ && $1 != "memory" {printf "%s ", $1}')
    for isa in scalar "${ISA:-avx2}"; do
        POCKET_ISA=$isa "$POCKET" logits --model "$m" --tokens "$TOKENS" --out "$OUT/$q.$isa.npy" --kv f32 >/dev/null
        printf '%-8s %-7s [%s] ' "$q" "$isa" "${types% }"
        python3 scripts/iq-logits/compare.py "$OUT/$q.llama.f32" "$OUT/$q.$isa.npy" || fail=1
    done
done
exit $fail
