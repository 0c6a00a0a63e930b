"""llama.cpp's own speculative decoding beside Pocket's (issue 50), on the prompts of
bench_speculation.py: the chat prompt rendered by `pocket template` (the same text both
engines get), greedy, 128 tokens, 2 threads; llama.cpp's llama-bench (decode after a
prompt as long: llama-speculative-simple refuses to run without a drafter) and `llama-speculative-simple` with
ngram-simple (lookup n-gram 3, drafts of at most 8, as Pocket's
`--speculate lookup --ngram 3 --draft-max 8`), Pocket's `pocket run --prompt` (the same text) with
--speculate off and lookup. 3 runs each, alternating, medians of decode t/s.

Usage: python3 scripts/bench_speculation_llama.py [POCKET] [LLAMA_BIN_DIR]
"""
import json, os, re, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(__file__))
P = sys.argv[1] if len(sys.argv) > 1 else "target/release/pocket"
L = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/pocket/llama-build-host/bin")
CACHE = os.path.expanduser("~/.cache/pocket/")
MODELS = {"Gemma 3 270M Q4_K_M": CACHE + "gemma-3-270m-q4_k_m.gguf",
          "SmolLM2-135M-Instruct Q4_1": CACHE + "smollm2-135m-instruct-q4_1.gguf"}
# The prompts of bench_speculation.py (kept in one place).
src = open(os.path.join(os.path.dirname(__file__), "bench_speculation.py")).read()
PROMPTS = eval(re.search(r"PROMPTS = (\{.*?\n\})", src, re.S).group(1))
RUNS, N = int(os.environ.get("RUNS", "3")), 128


def render(model, prompt):
    msgs = json.dumps([{"role": "user", "content": prompt}])
    return subprocess.run([P, "template", "-m", model, "--messages", msgs, "--add-generation-prompt"],
                          capture_output=True, text=True, check=True).stdout


def llama(model, path, spec):
    if spec == "none":
        # llama-speculative-simple refuses to run without a drafter: the baseline is
        # llama-bench's decode of N tokens after a prompt of the same length.
        ids = json.loads(subprocess.run([P, "tokenize", "--model", model, "--file", path, "--json"],
                                        capture_output=True, text=True, check=True).stdout)["ids"]
        n_prompt = len(ids)
        cmd = [L + "/llama-bench", "-m", model, "-p", "0", "-n", str(N), "-d", str(n_prompt), "-t", "2", "-r", "1", "-o", "json"]
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout)
        return out[0]["avg_ts"], 0, 0
    cmd = [L + "/llama-speculative-simple", "-m", model, "-f", path, "-n", str(N), "--temp", "0", "--top-k", "1",
           "-t", "2", "-c", "2048", "--spec-type", spec, "--spec-draft-n-max", "8",
           "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900).stderr
    tps = float(re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out).group(1))
    drafted = int(re.search(r"n_drafted\s*=\s*(\d+)", out).group(1))
    accepted = int(re.search(r"n_accept\s*=\s*(\d+)", out).group(1))
    return tps, drafted, accepted


def pocket(model, path, spec):
    cmd = [P, "run", "--model", model, "--prompt", open(path).read(), "--json", "-n", str(N), "--temp", "0",
           "--threads", "2", "--speculate", spec, "--ngram", "3", "--draft-max", "8"]
    d = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    s = d["stats"]
    return s["decode_tokens_per_second"], s["drafted_tokens"], s["accepted_tokens"]


rows = []
for mname, mpath in MODELS.items():
    for pname, prompt in PROMPTS.items():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(render(mpath, prompt))
            path = f.name
        res = {k: [] for k in ["llama none", "llama ngram", "pocket off", "pocket lookup"]}
        for _ in range(RUNS):
            res["llama none"].append(llama(mpath, path, "none"))
            res["llama ngram"].append(llama(mpath, path, "ngram-simple"))
            res["pocket off"].append(pocket(mpath, path, "off"))
            res["pocket lookup"].append(pocket(mpath, path, "lookup"))
        os.unlink(path)
        med = {k: statistics.median(r[0] for r in v) for k, v in res.items()}
        row = dict(model=mname, prompt=pname, **med,
                   llama_drafted=res["llama ngram"][0][1], llama_accepted=res["llama ngram"][0][2],
                   pocket_drafted=res["pocket lookup"][0][1], pocket_accepted=res["pocket lookup"][0][2])
        rows.append(row)
        print(json.dumps(row), flush=True)
json.dump(rows, open("bench_speculation_llama.json", "w"), indent=1)
print("| model | prompt | llama.cpp t/s | llama.cpp ngram t/s | its speed-up | accepted/drafted | Pocket t/s | Pocket lookup t/s | its speed-up | accepted/drafted | Pocket lookup / llama.cpp ngram |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['model']} | {r['prompt']} | {r['llama none']:.1f} | {r['llama ngram']:.1f} | {r['llama ngram']/r['llama none']:.2f}x | "
          f"{r['llama_accepted']}/{r['llama_drafted']} | {r['pocket off']:.1f} | {r['pocket lookup']:.1f} | "
          f"{r['pocket lookup']/r['pocket off']:.2f}x | {r['pocket_accepted']}/{r['pocket_drafted']} | "
          f"{r['pocket lookup']/r['llama ngram']:.2f}x |")
