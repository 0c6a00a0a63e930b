#!/usr/bin/env bash
# pocket imatrix / pocket quantize against llama-imatrix / llama-quantize on
# the fixture F32 models: the importance matrices side by side, and every
# preset's output file compared byte for byte (with llama-imatrix's matrix
# for both tools, and without one where the preset allows).
#
# Needs the bench-compare host build of llama.cpp (~/.cache/pocket/llama-build-host)
# and a release pocket (cargo build --release -p pocket-cli). Writes into $OUT,
# with llama-quantize's outputs' SHA-256 in $OUT/llama-quantize.txt (the
# golden data of core/tests/quantize_files.rs, with the llama-imatrix files).
set -euo pipefail
cd "$(dirname "$0")/.."

FIXTURES=${POCKET_FIXTURES:-$(cd ../shared/fixtures 2>/dev/null && pwd)}
BIN=${LLAMA_BUILD:-$HOME/.cache/pocket/llama-build-host}/bin
POCKET=${POCKET:-$PWD/target/release/pocket}
OUT=${OUT:-/tmp/pocket-quantize-compare}
MODELS=${MODELS:-"gemma3-tiny qwen3moe-tiny qwen35moe-tiny"}
PRESETS=${PRESETS:-$("$POCKET" quantize --help | sed -n 's/^TYPE is one of: //p' | tr -d ',')}
TEXT=$FIXTURES/tokenizer/ppl_text.txt
export LD_LIBRARY_PATH=$BIN
mkdir -p "$OUT"
cd "$OUT"

same=0 differ=0
: >llama-quantize.txt
for m in $MODELS; do
    f32=$FIXTURES/models/$m-${SOURCE:-F32}.gguf   # SOURCE=F16 for the Gemma 4 fixtures (no F32 shipped)
    "$BIN/llama-imatrix" -m "$f32" -f "$TEXT" -o "$m.llama.imatrix.gguf" -c 128 --chunks 16 -t 2 >"$m.llama-imatrix.log" 2>&1
    "$POCKET" imatrix --model "$f32" --file "$TEXT" -o "$m.pocket.imatrix.gguf" --ctx 128 --chunks 16 >/dev/null 2>&1
    echo "== $m: llama-imatrix vs pocket imatrix"
    python3 "$OLDPWD/scripts/quantize-compare/imatrix_diff.py" "$m.llama.imatrix.gguf" "$m.pocket.imatrix.gguf"
    for p in $PRESETS; do
        [ "$p" = F32 ] && continue
        for im in with without; do
            args=()
            [ $im = with ] && args=(--imatrix "$m.llama.imatrix.gguf")
            rm -f "$m-$p.llama.gguf" "$m-$p.pocket.gguf"
            if ! "$BIN/llama-quantize" "${args[@]}" "$f32" "$m-$p.llama.gguf" "$p" 2 >"$m-$p-$im.llama.log" 2>&1; then
                # llama-quantize refuses (IQ1/IQ2 without a matrix): so must we.
                echo "$m $p $im refused" >>llama-quantize.txt
                if "$POCKET" quantize "${args[@]}" "$f32" "$m-$p.pocket.gguf" "$p" >/dev/null 2>&1; then
                    echo "$m $p ($im imatrix): llama-quantize refused, pocket did not"
                    differ=$((differ + 1))
                else
                    same=$((same + 1))
                fi
                continue
            fi
            echo "$m $p $im $(sha256sum "$m-$p.llama.gguf" | cut -c1-64)" >>llama-quantize.txt
            "$POCKET" quantize "${args[@]}" "$f32" "$m-$p.pocket.gguf" "$p" >/dev/null 2>"$m-$p-$im.pocket.log" || true
            if cmp -s "$m-$p.llama.gguf" "$m-$p.pocket.gguf"; then
                same=$((same + 1))
            else
                echo "$m $p ($im imatrix): files differ ($(cmp "$m-$p.llama.gguf" "$m-$p.pocket.gguf" 2>&1 | head -1))"
                differ=$((differ + 1))
            fi
        done
    done
done
echo "byte-identical outputs (or both tools refusing): $same; different: $differ"
