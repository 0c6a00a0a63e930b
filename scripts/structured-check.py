#!/usr/bin/env python3
"""Constrained output through the CLI on real models, checked independently.

Runs `pocket chat --json-schema/--regex/--choice/--grammar --json` on each
model given, at temperature 0.8 over several seeds, and validates every
answer with Python's `jsonschema` (Draft 2020-12) or `re`: an answer that
ends (stop_reason end_of_text) must satisfy its constraint, always. Bad
constraints must be refused with an error naming the field.

Usage: structured-check.py POCKET MODEL... (exit 1 on any failure)
"""
import json
import re
import subprocess
import sys

import jsonschema

SCHEMAS = {
    "object": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 120}, "city": {"type": "string", "maxLength": 30}}, "required": ["name", "age", "city"], "additionalProperties": False},
    "nested_ref": {"$defs": {"addr": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 30}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "zip"], "additionalProperties": False}},
                   "type": "object", "properties": {"home": {"$ref": "#/$defs/addr"}, "work": {"$ref": "#/$defs/addr"}}, "required": ["home", "work"], "additionalProperties": False},
    "bounded_array": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4}}, "required": ["tags"], "additionalProperties": False},
    "enum_range": {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}, "score": {"type": "number", "minimum": -1, "maximum": 1}, "stars": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["sentiment", "score", "stars"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}, "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["date", "code"], "additionalProperties": False},
    "any_of_nullable": {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "string", "maxLength": 10}]}, "note": {"type": ["string", "null"], "maxLength": 20}}, "required": ["value", "note"], "additionalProperties": False},
}
PROMPT = "Maria Lopez, 34, lives at Calle Mayor 5 (41001) in Seville and works at Plaza Nueva 1 (41002). Answer in JSON."
SEEDS = [1, 2, 3]


def chat(pocket, model, extra, seed, n=300):
    msgs = json.dumps([{"role": "user", "content": PROMPT}])
    cmd = [pocket, "chat", "--model", model, "--messages", msgs, "--json", "--temp", "0.8", "--seed", str(seed), "-n", str(n), "--threads", "2"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return r


def main():
    pocket, models = sys.argv[1], sys.argv[2:]
    failures, runs, complete = [], 0, 0
    for model in models:
        for name, schema in SCHEMAS.items():
            for seed in SEEDS:
                r = chat(pocket, model, ["--json-schema", json.dumps(schema)], seed)
                runs += 1
                if r.returncode != 0:
                    failures.append(f"{model} {name} seed {seed}: exit {r.returncode}: {r.stderr.strip()}")
                    continue
                out = json.loads(r.stdout)
                if out["stats"]["stop_reason"] != "end_of_text":
                    failures.append(f"{model} {name} seed {seed}: stopped by {out['stats']['stop_reason']}: {out['text']!r}")
                    continue
                complete += 1
                try:
                    jsonschema.validate(json.loads(out["text"]), schema, cls=jsonschema.Draft202012Validator)
                except Exception as e:  # noqa: BLE001 - any failure is reported
                    failures.append(f"{model} {name} seed {seed}: {out['text']!r}: {e}")
        for seed in SEEDS:
            runs += 3
            rx = r"(yes|no), because [a-z ]{3,40}\."
            out = json.loads(chat(pocket, model, ["--regex", rx], seed).stdout)
            if out["stats"]["stop_reason"] != "end_of_text" or not re.fullmatch(rx, out["text"]):
                failures.append(f"{model} regex seed {seed}: {out['text']!r}")
            choices = ["positive", "negative", "neutral"]
            out = json.loads(chat(pocket, model, sum((["--choice", c] for c in choices), []), seed).stdout)
            if out["text"] not in choices:
                failures.append(f"{model} choice seed {seed}: {out['text']!r}")
            with open("/tmp/pocket-structured.lark", "w") as f:
                f.write('start: "Name: " NAME "\\nAge: " AGE\nNAME: /[A-Z][a-z]{1,12}( [A-Z][a-z]{1,12})?/\nAGE: /[1-9][0-9]?/\n')
            out = json.loads(chat(pocket, model, ["--grammar", "/tmp/pocket-structured.lark"], seed).stdout)
            if not re.fullmatch(r"Name: [A-Z][a-z]{1,12}( [A-Z][a-z]{1,12})?\nAge: [1-9][0-9]?", out["text"]):
                failures.append(f"{model} grammar seed {seed}: {out['text']!r}")
        # Refusals, by name.
        for extra, field in [
            (["--json-schema", '{"type":"array","uniqueItems":true}'], "json_schema"),
            (["--json-schema", '{"type": "obj'], "json_schema"),
            (["--regex", "(unclosed"], "regex"),
            (["--grammar", "/dev/null"], "grammar"),
            (["--regex", "a", "--choice", "b"], "choices"),
        ]:
            r = chat(pocket, model, extra, 1, n=4)
            if r.returncode == 0 or field not in r.stderr:
                failures.append(f"{model} {extra}: not refused naming {field}: {r.stderr.strip()!r}")
    print(f"structured-check: {runs} constrained runs on {len(models)} models, {complete} schema answers complete and valid, {len(failures)} failures")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
