"""Prompt lookup on aarch64, counted in instructions: greedy chat answers (the prompts of
scripts/bench_speculation.py, at most 128 tokens, 1 thread) with --speculate lookup against
off, each run under qemu-aarch64 with the instruction-count plugin (tools/insn-count; built
by `cargo xtask insn-count`, or gcc -O2 -shared -fPIC -o target/libinsn_count.so
tools/insn-count/insn_count.c). Loading, the prompt and the first token (a run of one token) are subtracted.

With `verify` first: the verify pass's cost in instructions instead (no gate, no timing):
`pocket bench --verify-cost K --draws 1` for K = 1..4 (a warm-up draw and one draw, each a
decode step then verify passes of 1..K drafts: the difference between K and K - 1 is two
verify passes of K drafts), against one decoded token (`pocket bench -p 16 -n 8` minus
`-n 0`, as `cargo xtask insn-count` counts decode).

usage: python3 scripts/insn_speculation.py [verify] POCKET_AARCH64[,POCKET2] smol|gemma [free,list,typo,extract,schema] [cpu]"""
import json, os, subprocess, sys, tempfile
verify = sys.argv[1] == "verify"
if verify:
    sys.argv.pop(1)
bins = sys.argv[1].split(","); model = sys.argv[2]; prompts = [] if verify else sys.argv[3].split(",")
cpu = sys.argv[4 - verify] if len(sys.argv) > 4 - verify else "max"
here = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(here, "bench_speculation.py")).read()
ns = {}
exec(src.split("RUNS =")[0].replace('P = sys.argv[1] if len(sys.argv) > 1 else "target/release/pocket"', 'P="x"'), ns)
P = ns["PROMPTS"]; S = ns["SCHEMAS"]
short = {"free": "free chat", "list": "repeat a list, one change", "typo": "fix a typo in code", "extract": "extract fields", "schema": "extract fields as JSON (schema)"}
M = {"smol": "~/.cache/pocket/smollm2-135m-instruct-q4_1.gguf", "gemma": "~/.cache/pocket/gemma-3-270m-q4_k_m.gguf"}[model]
M = os.path.expanduser(M)
plugin = os.path.join(here, "..", "target", "libinsn_count.so")
def count(b, args):
    out = tempfile.mktemp()
    cmd = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", cpu, "-plugin", f"{plugin},out={out}", b] + args
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    total = int(open(out).read().split()[1]); os.unlink(out)
    return total
if verify:
    for b in bins:
        bench = lambda *a: count(b, ["bench", "--model", M, "--threads", "1", "--draws", "1", "-p", "16"] + list(a))
        decode = (bench("-n", "8") - bench("-n", "0")) / 16
        runs = [bench("--verify-cost", str(k)) for k in range(1, 5)]
        rows = [(runs[k - 1] - runs[k - 2]) / 2 for k in range(2, 5)]
        print(f"{model} {b}: decode {decode / 1e6:.2f} M insns/token; verify " +
              ", ".join(f"{k} drafts {v / 1e6:.2f} M ({v / decode:.2f}x)" for k, v in zip(range(2, 5), rows)), flush=True)
def run(b, name, spec, n=128):
    key = short[name]
    prompt, schema = (S[key] if key in S else (P[key], None))
    msgs = json.dumps([{"role": "user", "content": prompt}])
    out = tempfile.mktemp()
    cmd = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", cpu, "-plugin", f"{plugin},out={out}", b,
           "chat", "--model", M, "--messages", msgs, "--json", "-n", str(n), "--temp", "0", "--threads", "1", "--speculate", spec]
    if schema: cmd += ["--json-schema", schema]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    d = json.loads(r.stdout)
    total = int(open(out).read().split()[1]); os.unlink(out)
    return total, d
for name in prompts:
    for b in bins:
        # Loading, the prompt and the first token: what both runs share.
        base, _ = run(b, name, "off", n=1)
        o, do = run(b, name, "off")
        l, dl = run(b, name, "lookup")
        s = dl["stats"]
        n = s["generated_tokens"]
        print(f"{model} {name:8} {b}: decode insns/token off {(o - base) / (n - 1) / 1e6:7.2f} M, lookup {(l - base) / (n - 1) / 1e6:7.2f} M, "
              f"off/lookup {(o - base) / (l - base):5.2f}x; tokens {n} drafted {s['drafted_tokens']} accepted {s['accepted_tokens']} same {do['text'] == dl['text']}", flush=True)
