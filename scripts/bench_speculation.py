"""Speculative decoding figures for BENCHMARKS.md (issue 50): greedy chat answers with
--speculate lookup against off, 3 runs each, medians. Usage: python3 scripts/bench_speculation.py [POCKET]"""
import json, os, subprocess, statistics, sys
P = sys.argv[1] if len(sys.argv) > 1 else "target/release/pocket"
MODELS = {"Gemma 3 270M Q4_K_M": os.path.expanduser("~/.cache/pocket/") + "gemma-3-270m-q4_k_m.gguf",
          "SmolLM2-135M-Instruct Q4_1": os.path.expanduser("~/.cache/pocket/") + "smollm2-135m-instruct-q4_1.gguf"}
PROMPTS = {
 "extract fields": "Extract the name, age, city and job of the person as lines 'name: ...', 'age: ...', 'city: ...', 'job: ...'.\n\nMaria Lopez, 34, is an architect. She moved from Seville to Valencia in 2015, where she now lives and runs a small studio designing schools.",
 "repeat a list, one change": "Repeat this list exactly, but replace 'pears' with 'figs':\napples, pears, plums, cherries, grapes, lemons, limes, oranges, peaches, apricots, mangoes, kiwis",
 "fix a typo in code": "Fix the typo in this code and print the whole corrected code:\n```python\ndef average(values):\n    total = 0\n    for v in values:\n        total += v\n    retrun total / len(values)\n\nprint(average([1, 2, 3, 4]))\n```",
 "free chat": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
# Prompts answered under a JSON Schema (speculation verifies each row under its own mask).
SCHEMAS = {
 "extract fields as JSON (schema)": (PROMPTS["extract fields"].replace("as lines 'name: ...', 'age: ...', 'city: ...', 'job: ...'", "as JSON"),
  '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"city":{"type":"string"},"job":{"type":"string"},"summary":{"type":"string"}},"required":["name","age","city","job","summary"],"additionalProperties":false}'),
}
RUNS = int(os.environ.get("RUNS", "3"))
def one(model, prompt, spec):
    schema = None
    if isinstance(prompt, tuple):
        prompt, schema = prompt
    msgs = json.dumps([{"role": "user", "content": prompt}])
    cmd = [P, "chat", "--model", model, "--messages", msgs, "--json", "-n", "128", "--temp", "0", "--threads", "2", "--speculate", spec]
    if schema:
        cmd += ["--json-schema", schema]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)
rows = []
for mname, mpath in MODELS.items():
    for pname, prompt in list(PROMPTS.items()) + list(SCHEMAS.items()):
        res = {"off": [], "lookup": []}
        texts = {}
        for r in range(RUNS):
            for spec in ["off", "lookup"]:
                d = one(mpath, prompt, spec)
                res[spec].append(d["stats"])
                texts.setdefault(spec, d["text"])
        same = texts["off"] == texts["lookup"]
        off = statistics.median(s["decode_tokens_per_second"] for s in res["off"])
        on = statistics.median(s["decode_tokens_per_second"] for s in res["lookup"])
        s0 = res["lookup"][0]
        row = dict(model=mname, prompt=pname, gen=s0["generated_tokens"], off=off, on=on, speedup=on/off,
                   drafted=s0["drafted_tokens"], accepted=s0["accepted_tokens"], acceptance=s0["acceptance"], same=same,
                   off_all=[s["decode_tokens_per_second"] for s in res["off"]], on_all=[s["decode_tokens_per_second"] for s in res["lookup"]])
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump(rows, open("bench_speculation.json", "w"), indent=1)
print("| model | prompt | generated | decode t/s off | decode t/s lookup | speed-up | drafted | accepted | acceptance | same text |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    acc = "-" if r["acceptance"] is None else f"{r['acceptance']*100:.0f} %"
    print(f"| {r['model']} | {r['prompt']} | {r['gen']} | {r['off']:.1f} | {r['on']:.1f} | {r['speedup']:.2f}x | {r['drafted']} | {r['accepted']} | {acc} | {'yes' if r['same'] else 'NO'} |")
