#!/usr/bin/env bash
# Quantiser quality and speed against llama.cpp's on the real Gemma 3 270M
# (re-quantised from its Q4_K_M, as issue 27 asks): importance matrices from
# llama.cpp's documentation (--chunks 64 of 128 tokens), perplexity by
# `pocket perplexity --ctx 128 --chunks 32` on held-out text (the fixture
# store's ppl_text.txt; every file scored on the same 2,016 tokens), for
#   llama-imatrix + llama-quantize, pocket imatrix + pocket quantize,
#   llama-quantize with pocket's matrix, and both tools without a matrix,
# at Q2_K and IQ2_XXS; and each tool's quantisation time at 2 threads.
# Needs the bench-compare host build of llama.cpp and a release pocket; the
# matrices in $OUT are reused when present (delete them to recompute).
set -euo pipefail
cd "$(dirname "$0")/.."

FIXTURES=${POCKET_FIXTURES:-$(cd ../shared/fixtures 2>/dev/null && pwd)}
BIN=${LLAMA_BUILD:-$HOME/.cache/pocket/llama-build-host}/bin
SRC=${LLAMA_SRC:-$(ls -d "$HOME"/.cache/pocket/llama-src/*/vendor/llama.cpp | head -1)}
POCKET=${POCKET:-$PWD/target/release/pocket}
MODEL=${MODEL:-$HOME/.cache/pocket/gemma-3-270m-q4_k_m.gguf}
OUT=${OUT:-/tmp/pocket-quantize-quality}
THREADS=${THREADS:-2}
export LD_LIBRARY_PATH=$BIN
mkdir -p "$OUT"

cat "$SRC"/README.md "$SRC"/docs/build.md "$SRC"/docs/function-calling.md "$SRC"/tools/server/README.md >"$OUT/calibration.txt"
cp "$FIXTURES/tokenizer/ppl_text.txt" "$OUT/eval.txt"
echo "calibration: $(wc -c <"$OUT/calibration.txt") bytes; held-out: $(wc -c <"$OUT/eval.txt") bytes"

secs() { # command...: run it, print the seconds it took
    local t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    echo "$(date +%s.%N) - $t0" | bc
}
[ -f "$OUT/llama.imatrix.gguf" ] || echo "llama-imatrix: $(secs "$BIN/llama-imatrix" -m "$MODEL" -f "$OUT/calibration.txt" -o "$OUT/llama.imatrix.gguf" -c 128 --chunks 64 -t "$THREADS") s"
[ -f "$OUT/pocket.imatrix.gguf" ] || echo "pocket imatrix: $(secs "$POCKET" imatrix --model "$MODEL" --file "$OUT/calibration.txt" -o "$OUT/pocket.imatrix.gguf" --ctx 128 --chunks 64 --threads "$THREADS") s"
python3 scripts/quantize-compare/imatrix_diff.py "$OUT/llama.imatrix.gguf" "$OUT/pocket.imatrix.gguf"

ppl() { "$POCKET" perplexity --model "$1" --file "$OUT/eval.txt" --ctx 128 --chunks 32 --threads "$THREADS" --json | python3 -c "import json,sys; print('%.3f' % json.load(sys.stdin)['ppl'])"; }
echo "| file | quantised in (s) | PPL (ctx 128) |"
echo "|---|---|---|"
echo "| the Q4_K_M itself | - | $(ppl "$MODEL") |"
for T in Q2_K IQ2_XXS; do
    for run in "llama-quantize, no imatrix:llama:" "pocket quantize, no imatrix:pocket:" \
        "llama-imatrix + llama-quantize:llama:llama" "pocket imatrix + pocket quantize:pocket:pocket" \
        "pocket imatrix + llama-quantize:llama:pocket"; do
        IFS=: read -r label tool im <<<"$run"
        args=(--allow-requantize)
        [ -n "$im" ] && args+=(--imatrix "$OUT/$im.imatrix.gguf")
        f=$OUT/gemma-270m-$T-$tool-${im:-none}.gguf
        rm -f "$f"
        if [ "$tool" = llama ]; then
            s=$(secs "$BIN/llama-quantize" "${args[@]}" "$MODEL" "$f" "$T" "$THREADS")
        else
            s=$(secs "$POCKET" quantize "${args[@]}" --threads "$THREADS" "$MODEL" "$f" "$T")
        fi
        if [ -f "$f" ]; then
            echo "| $T, $label | $s | $(ppl "$f") |"
        else
            echo "| $T, $label | refused | - |"
        fi
    done
done
