#!/usr/bin/env bash
# The main job: fetch the demo model if missing, build the `pocket` CLI and
# show what it does with it. Usage: scripts/demo.sh [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."

model=$(scripts/fetch-demo-model.sh)
cargo build --quiet --release -p pocket-cli
./target/release/pocket inspect "$model"
