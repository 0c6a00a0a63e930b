#!/usr/bin/env bash
# The main job: fetch the demo's chat model (SmolLM2-135M-Instruct, 94 MB) if
# missing, build the `pocket` CLI, and chat with it: a two-turn conversation,
# then a structured answer (a person record extracted from a sentence, held to
# a JSON Schema by constrained decoding: a 135M model is weak, the constraint
# is what makes its output usable).
# Usage: scripts/demo.sh [--interactive]   (--interactive: chat yourself afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."

model=$(scripts/fetch-chat-model.sh)
cargo build --quiet --release -p pocket-cli
pocket=./target/release/pocket

echo "== A conversation (pocket chat --messages, each turn answered with the conversation so far)"
history='[{"role":"system","content":"You are a helpful assistant."}]'
for question in "What is the capital of France? Answer in one sentence." "Write a haiku about the sea."; do
    history=$(python3 -c 'import json,sys; h=json.loads(sys.argv[1]); h.append({"role":"user","content":sys.argv[2]}); print(json.dumps(h))' "$history" "$question")
    echo "  you:   $question"
    answer=$("$pocket" chat --model "$model" --temp 0 -n 80 --messages "$history" --json)
    text=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["text"])' "$answer")
    echo "  model: ${text//$'\n'/$'\n'         }"
    history=$(python3 -c 'import json,sys; h=json.loads(sys.argv[1]); h.append({"role":"assistant","content":sys.argv[2]}); print(json.dumps(h))' "$history" "$text")
done

echo
echo "== A structured answer (pocket chat --json-schema)"
schema='{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":130},"city":{"type":"string","maxLength":40}},"required":["name","age","city"],"additionalProperties":false}'
echo "  schema: $schema"
"$pocket" chat --model "$model" --temp 0.8 --seed 7 -n 80 --json-schema "$schema" \
    --messages '[{"role":"user","content":"Extract the person as JSON: Maria Lopez is 34 and lives in Seville."}]' --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("  answer:", r["text"]); print("  parsed:", json.loads(r["text"])); print("  stats:", r["stats"]["generated_tokens"], "tokens,", round(r["stats"]["decode_tokens_per_second"],1), "t/s,", r["stats"]["stop_reason"])'

if [ "${1:-}" = "--interactive" ]; then
    echo
    exec "$pocket" chat --model "$model"
fi
