#!/usr/bin/env python3
"""A memory budget that follows the OS, measured as an app meets it, through
the Python bindings: a model decoding under budget A inside a memory cgroup
of limit LA; mid-answer, another thread sets budget B < A
(`setMemoryBudget`) and the cgroup's limit is then lowered to LB; later the
limit goes back to LA and the budget to A. Checked: no OOM kill, the answer
token for token equal to an unbudgeted run's, and the decode speed of each
phase against a fresh start at that budget (same prompt, same positions).

usage (root; cgroup v1 or v2):
  cargo xtask bindings python --release --out target/bindings/python-release
  POCKET_PY_BINDINGS=target/bindings/python-release \\
    scripts/budget-follow.py MODEL --limit-a 8G --budget-a 7G --budget-b 4.5G --limit-b 5G \\
        [--tokens 120] [--threads 2] [--json OUT.json]

Runs, each in a fresh process with the page cache dropped first:
  reference  no budget, no limit (the unbudgeted answer)
  follow     A in LA; at 1/3 of the answer B then LB; at 2/3 LA then A
  fresh-b    B in LB from the start
  fresh-a    A in LA from the start
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

GIB = 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMGT" else s) * mult)


# ---- the cgroup -------------------------------------------------------------------


class Cgroup:
    def __init__(self, name):
        v1 = "/sys/fs/cgroup/memory"
        self.v2 = not os.path.isdir(v1)
        self.dir = os.path.join("/sys/fs/cgroup" if self.v2 else v1, name)
        os.makedirs(self.dir, exist_ok=True)

    def write(self, f, v):
        with open(os.path.join(self.dir, f), "w") as fh:
            fh.write(str(v))

    def read(self, f):
        with open(os.path.join(self.dir, f)) as fh:
            return fh.read()

    def set_limit(self, limit):
        if self.v2:
            self.write("memory.max", "max" if limit == 0 else limit)
        else:
            self.write("memory.limit_in_bytes", -1 if limit == 0 else limit)

    def usage(self):
        return int(self.read("memory.current" if self.v2 else "memory.usage_in_bytes"))

    def peak(self):
        return int(self.read("memory.peak" if self.v2 else "memory.max_usage_in_bytes"))

    def reset_peak(self):
        if not self.v2:
            self.write("memory.max_usage_in_bytes", 0)

    def oom_kills(self):
        text = self.read("memory.events" if self.v2 else "memory.oom_control")
        for line in text.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self):
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


# ---- one run, in a child process inside the cgroup ------------------------------


def child(args):
    # The bindings' folder (pocket.py beside libpocket_ffi.so), as the usage line says.
    sys.path.insert(0, os.path.abspath(os.environ.get("POCKET_PY_BINDINGS", os.path.join(ROOT, "target/bindings/python-release"))))
    import pocket

    cg = Cgroup(args.cgroup) if args.cgroup else None
    t0 = time.monotonic()
    model = pocket.PocketModel.load(args.model, pocket.LoadOptions(threads=args.threads, memory_budget_bytes=args.budget))
    load_s = time.monotonic() - t0
    session = pocket.PocketSession(model, pocket.SessionOptions(context_length=args.tokens + 512, threads=args.threads))
    stamps = []
    pieces = []
    events = []
    due = [threading.Event(), threading.Event()]
    k1, k2 = args.tokens // 3, 2 * args.tokens // 3

    def note(what, **kw):
        u = model.memory_usage()
        e = dict(what=what, piece=len(pieces), t=time.monotonic() - t0, budget=model.memory_budget_bytes(),
                 resident=u.resident_weights_bytes, cache=u.expert_cache_bytes, kv=u.kv_cache_bytes,
                 scratch=u.scratch_bytes, **kw)
        if cg:
            e.update(cgroup_usage=cg.usage(), cgroup_peak=cg.peak())
        events.append(e)
        print(json.dumps(e), file=sys.stderr, flush=True)

    def controller():
        # Phase 2: budget B from this thread, then the OS lowers the limit.
        if not due[0].wait(3600):
            return
        note("phase1-end")
        if cg:
            cg.reset_peak()
        t = time.monotonic()
        model.set_memory_budget(args.budget_b)
        note("set-budget-b", seconds=time.monotonic() - t)
        t = time.monotonic()
        try:
            cg.set_limit(args.limit_b)
            note("limit-b", seconds=time.monotonic() - t)
        except OSError as e:
            # v1 refuses a limit below what it cannot reclaim (EBUSY).
            note("limit-b-refused", error=str(e))
        # Phase 3: the limit back, then the budget.
        if not due[1].wait(3600):
            return
        note("phase2-end")
        cg.set_limit(args.limit_a)
        cg.reset_peak()
        t = time.monotonic()
        model.set_memory_budget(args.budget)
        note("set-budget-a", seconds=time.monotonic() - t)

    class Listener(pocket.TokenListener):
        def on_token(self, piece):
            stamps.append(time.monotonic() - t0)
            pieces.append(piece)
            if args.follow and len(pieces) == k1:
                due[0].set()
            if args.follow and len(pieces) == k2:
                due[1].set()
            return True

    ctl = threading.Thread(target=controller, daemon=True)
    if args.follow:
        ctl.start()
    note("start")
    stats = session.generate(args.prompt, pocket.GenerateOptions(max_tokens=args.tokens, temperature=0.0), Listener())
    note("end")
    if args.follow:
        ctl.join(60)
    out = dict(
        load_s=load_s,
        text=stats.text,
        pieces=len(pieces),
        generated_tokens=stats.generated_tokens,
        stamps=stamps,
        prefill_tps=stats.prefill_tokens_per_second,
        decode_tps=stats.decode_tokens_per_second,
        ttft_ms=stats.time_to_first_token_ms,
        expert_hits=stats.expert_cache_hits,
        expert_misses=stats.expert_cache_misses,
        storage_bytes=stats.storage_bytes_read,
        events=events,
    )
    with open(args.result, "w") as f:
        json.dump(out, f)


def run(args, name, budget, limit, follow):
    """One child in a fresh cgroup; its result and the cgroup's figures."""
    drop_caches()
    cg = Cgroup(f"pocket-budget-follow-{name}")
    cg.set_limit(limit)
    cg.reset_peak()
    kills0 = cg.oom_kills()
    result = f"/tmp/budget-follow-{name}.json"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", args.model, "--result", result,
           "--budget", str(budget), "--threads", str(args.threads), "--tokens", str(args.tokens),
           "--prompt", args.prompt, "--cgroup", os.path.basename(cg.dir),
           "--budget-b", str(args.budget_b), "--limit-a", str(limit), "--limit-b", str(args.limit_b)]
    if follow:
        cmd.append("--follow")
    procs = os.path.join(cg.dir, "cgroup.procs")
    sh = f"echo $$ > {procs} && exec " + " ".join(f"'{c}'" for c in cmd)
    print(f"== {name}: budget {budget / GIB:.2f} GiB, limit {limit / GIB if limit else 0:.2f} GiB", flush=True)
    p = subprocess.run(["sh", "-c", sh])
    kills = cg.oom_kills() - kills0
    peak = cg.peak()
    cg.remove()
    if p.returncode != 0:
        print(f"   exit status {p.returncode}, OOM kills {kills}", flush=True)
        return dict(name=name, returncode=p.returncode, oom_kills=kills)
    with open(result) as f:
        r = json.load(f)
    r.update(name=name, budget=budget, limit=limit, oom_kills=kills, cgroup_peak_end=peak, returncode=0)
    return r


def tps(stamps, a, b):
    """Pieces per second over pieces a..b (by their arrival times)."""
    b = min(b, len(stamps) - 1)
    if b <= a:
        return None
    return (b - a) / (stamps[b] - stamps[a])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--limit-a", type=size, default=8 * GIB)
    ap.add_argument("--budget-a", type=size, default=7 * GIB)
    ap.add_argument("--budget-b", type=size, default=int(4.5 * GIB))
    ap.add_argument("--limit-b", type=size, default=5 * GIB)
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="Once upon a time in a small village by the sea, there lived")
    ap.add_argument("--json")
    ap.add_argument("--runs", default="reference,follow,fresh-b,fresh-a")
    # child-only
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--result")
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--cgroup")
    ap.add_argument("--follow", action="store_true")
    args = ap.parse_args()
    if args.child:
        args.limit_a = args.limit_a
        return child(args)

    a, b = args.budget_a, args.budget_b
    plan = {
        "reference": (0, 0, False),
        "follow": (a, args.limit_a, True),
        "fresh-b": (b, args.limit_b, False),
        "fresh-a": (a, args.limit_a, False),
    }
    results = {}
    for name in args.runs.split(","):
        budget, limit, follow = plan[name]
        results[name] = run(args, name, budget, limit, follow)

    n = args.tokens
    k1, k2 = n // 3, 2 * n // 3
    phases = [("A", 1, k1), ("B", k1, k2), ("A again", k2, n - 1)]
    ref = results.get("reference", {})
    print()
    for name, r in results.items():
        if r.get("returncode"):
            print(f"{name}: FAILED (exit {r['returncode']}, OOM kills {r['oom_kills']})")
            continue
        same = "same text as the reference" if r["text"] == ref.get("text") else "TEXT DIFFERS from the reference"
        if name == "reference":
            same = "reference"
        speeds = ", ".join(
            f"{label} {tps(r['stamps'], s, e):.2f}" if tps(r["stamps"], s, e) else f"{label} -" for label, s, e in phases
        )
        print(f"{name}: {r['pieces']} pieces, {same}; OOM kills {r['oom_kills']}; load {r['load_s']:.1f} s; "
              f"TTFT {r['ttft_ms']:.0f} ms; decode t/s by phase (pieces {1}-{k1}, {k1}-{k2}, {k2}-{n - 1}): {speeds}")
        for e in r["events"]:
            if e["what"] not in ("start",):
                extra = f" in {e['seconds'] * 1e3:.0f} ms" if "seconds" in e else ""
                cg = f", cgroup {e['cgroup_usage'] / GIB:.2f} GiB (peak {e['cgroup_peak'] / GIB:.2f})" if "cgroup_usage" in e else ""
                print(f"    {e['what']}{extra} at piece {e['piece']}: budget {e['budget'] / GIB:.2f} GiB, "
                      f"resident {e['resident'] / GIB:.2f}, cache {e['cache'] / GIB:.2f}, kv {e['kv'] / 2**20:.0f} MiB, "
                      f"scratch {e['scratch'] / 2**20:.0f} MiB{cg}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
