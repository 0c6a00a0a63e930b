#!/usr/bin/env bash
# Golden data for the quantisers (core/src/quantize/tests.rs): the inputs of
# scripts/quantize-golden/inputs.py quantised by llama.cpp's
# ggml_quantize_chunk into every type, with and without an importance vector.
# Needs the bench-compare host build (~/.cache/pocket/llama-build-host, made
# by `cargo xtask bench-compare`); writes core/src/quantize/testdata/.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${LLAMA_BUILD:-$HOME/.cache/pocket/llama-build-host}
SRC=${LLAMA_SRC:-$(ls -d "$HOME"/.cache/pocket/llama-src/*/vendor/llama.cpp | head -1)}
OUT=core/src/quantize/testdata
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"

gcc -O1 -o "$TMP/gen" scripts/quantize-golden/gen.c -I"$SRC/ggml/include" \
    -L"$BUILD/bin" -lggml-base -Wl,-rpath,"$BUILD/bin"
python3 scripts/quantize-golden/inputs.py "$OUT/input.f32" "$OUT/imatrix.f32"
for ty in f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K \
    iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m iq4_nl iq4_xs mxfp4 tq1_0 tq2_0; do
    case $ty in
        iq2_xxs | iq2_xs | iq1_s) ;; # llama.cpp refuses these without an imatrix
        *) "$TMP/gen" "$ty" 8 512 "$OUT/input.f32" - "$OUT/$ty.bin" ;;
    esac
    "$TMP/gen" "$ty" 8 512 "$OUT/input.f32" "$OUT/imatrix.f32" "$OUT/$ty.imatrix.bin"
done
ls -l "$OUT" | awk '{s += $5} END {print NR - 1 " files, " s " bytes"}'
