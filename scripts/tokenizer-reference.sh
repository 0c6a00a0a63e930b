#!/usr/bin/env bash
# llama.cpp's token ids for the corpora of vocabularies whose `.out` the
# llama.cpp tree lacks (core/tests/tokenizer_corpora.rs): today the UGM
# (T5-style unigram) vocabulary of nomic-embed-text-v2-moe,
# models/ggml-vocab-nomic-bert-moe.gguf, on the tree's usual test strings
# plus normalisation cases (core/tests/data/tokenizer/nomic-bert-moe.inp).
# Needs the bench-compare host build (~/.cache/pocket/llama-build-host).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${LLAMA_BUILD:-$HOME/.cache/pocket/llama-build-host}
SRC=${LLAMA_SRC:-$(ls -d "$HOME"/.cache/pocket/llama-src/*/vendor/llama.cpp | head -1)}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

gcc -O1 -o "$TMP/tokenize" scripts/tokenizer-reference/tokenize.c -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$BUILD/bin" -lllama -lggml -Wl,-rpath,"$BUILD/bin"
# The tool reproduces the tree's own corpora first.
for v in bert-bge llama-spm qwen2; do
    "$TMP/tokenize" "$SRC/models/ggml-vocab-$v.gguf" "$SRC/models/ggml-vocab-$v.gguf.inp" "$TMP/$v.out"
    cmp "$TMP/$v.out" "$SRC/models/ggml-vocab-$v.gguf.out"
done
D=core/tests/data/tokenizer
"$TMP/tokenize" "$SRC/models/ggml-vocab-nomic-bert-moe.gguf" "$D/nomic-bert-moe.inp" "$D/nomic-bert-moe.out"
wc -l "$D/nomic-bert-moe.out"
