#!/usr/bin/env bash
# The main job: fetch the demo model (Gemma 3 270M) if missing, build the
# `pocket` CLI, and generate text with it.
# Usage: scripts/demo.sh [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."

prompt="${1:-The capital of France is}"
model=$(scripts/fetch-demo-model.sh)
cargo build --quiet --release -p pocket-cli
./target/release/pocket run --model "$model" --prompt "$prompt" -n 64 --temp 0
