#!/usr/bin/env python3
"""Chart of `cargo xtask bench-budget` runs: decode t/s and time to first
token against the memory limit, for llama.cpp, Pocket mapped and Pocket
with a memory budget, so an app developer can pick a budget.

usage: scripts/budget-chart.py OUT.png RUN.json [RUN.json ...]
(one bench-budget --json file per limit; a limit of 0 is "unlimited").
Needs matplotlib (pip install matplotlib).
"""

import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ENGINES = [("llama.cpp", "tab:gray", "s"), ("pocket-mapped", "tab:orange", "o"), ("pocket-budget", "tab:blue", "D")]


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main(out, runs):
    # (engine, limit GiB) -> draws
    cells = defaultdict(list)
    model = None
    for path in runs:
        doc = json.load(open(path))
        model = model or doc["model"]
        for d in doc["draws"]:
            cells[(d["engine"], doc["limit"])].append(d)
    limits = sorted({lim for (_, lim) in cells}, key=lambda l: l or float("inf"))
    label = lambda l: "unlimited" if l == 0 else f"{l / 2**30:g} GiB"
    xs = list(range(len(limits)))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for engine, colour, marker in ENGINES:
        tg, ttft = [], []
        for lim in limits:
            ds = [d for d in cells.get((engine, lim), []) if not d.get("oom_killed")]
            tg.append(mean([d.get("decode_tps") for d in ds]))
            t = mean([d.get("time_to_first_token_ms") for d in ds])
            ttft.append(t / 1e3 if t is not None else None)
        pts = [(x, y) for x, y in zip(xs, tg) if y is not None]
        if pts:
            a.plot(*zip(*pts), marker=marker, color=colour, label=engine)
        pts = [(x, y) for x, y in zip(xs, ttft) if y is not None]
        if pts:
            b.plot(*zip(*pts), marker=marker, color=colour, label=engine)
    for ax, title in [(a, "decode (tokens/s, higher is better)"), (b, "time to first token (s, lower is better)")]:
        ax.set_xticks(xs, [label(l) for l in limits])
        ax.set_xlabel("memory limit (cgroup, page cache counted)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    b.set_yscale("log")
    fig.suptitle(f"{os.path.basename(model)}: a model larger than memory (2 threads, caches dropped per draw)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
