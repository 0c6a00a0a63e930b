#!/usr/bin/env python3
"""Tool calls through the CLI on a real model, checked independently.

For each case of the fixture tool suite (BFCL v4 function-calling cases),
runs `pocket chat --tools FILE --tool-choice required --json` and checks
every call: its name is among the case's tools and its arguments validate
against that tool's parameters (Python's jsonschema, with no properties
beyond the tool's own, as Pocket holds calls to). Optional templates
(`--chat-template`) put the calls into each family's syntax.

Usage: tool-check.py POCKET MODEL SUITE.json [--cases N] [--template FILE]...
"""
import argparse
import json
import subprocess
import sys
import tempfile

import jsonschema


def strict(schema):
    s = dict(schema)
    if s.get("type", "object") == "object":
        s.setdefault("additionalProperties", False)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pocket")
    ap.add_argument("model")
    ap.add_argument("suite")
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--template", action="append", default=[None])
    ap.add_argument("-n", type=int, default=400)
    a = ap.parse_args()
    cases = json.load(open(a.suite))["cases"][: a.cases]
    failures, calls, runs, unfinished = [], 0, 0, 0
    for template in a.template:
        for i, case in enumerate(cases):
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(case["tools"], f)
                tools_file = f.name
            cmd = [a.pocket, "chat", "--model", a.model, "--messages", json.dumps(case["messages"]), "--tools", tools_file,
                   "--tool-choice", "required", "--json", "--temp", "0.8", "--seed", str(i), "-n", str(a.n), "--threads", "2"]
            if template:
                cmd += ["--chat-template", template]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            runs += 1
            where = f"{template or 'file template'} {case['id']}"
            if r.returncode != 0:
                failures.append(f"{where}: exit {r.returncode}: {r.stderr.strip()[:300]}")
                continue
            out = json.loads(r.stdout)
            if out["stats"]["stop_reason"] == "max_tokens" and not out["tool_calls"]:
                unfinished += 1
                continue
            if not out["tool_calls"]:
                failures.append(f"{where}: no call ({out['stats']['stop_reason']}): {out['text'][:200]!r}")
            by_name = {t["name"]: t for t in case["tools"]}
            for c in out["tool_calls"]:
                calls += 1
                if c["name"] not in by_name:
                    failures.append(f"{where}: unknown tool {c['name']}")
                    continue
                try:
                    jsonschema.validate(c["arguments"], strict(by_name[c["name"]]["parameters"]), cls=jsonschema.Draft202012Validator)
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{where}: {c['name']}({json.dumps(c['arguments'])[:200]}): {str(e)[:200]}")
    print(f"tool-check: {runs} requests, {calls} calls, {unfinished} unfinished at the token limit, {len(failures)} failures")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
