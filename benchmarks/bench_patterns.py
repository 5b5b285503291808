"""``patterns.detect`` of one trace in two checkouts, A/B, with each per-step detector's loop apart.

Each round runs both trees in fresh processes, alternating which goes first; each process reads the
trace once, builds the Analysis and measure()s it (the memos detect finds in analyze_trace), then
times ``patterns.detect`` ``--inner`` times from those memos and each per-step detector over
every step, keeping its best. Prints each tree's median over rounds, and whether both found the same
patterns (fields, types and members).

Run (from the repository root; A is usually an export of the commit before, B this tree):

    python3 benchmarks/bench_patterns.py TRACE --a /tmp/base --b . [--rounds 3] [--inner 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_CHILD = r"""
import dataclasses, hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
from phasemem.analysis.core import Analysis
from phasemem.analysis.measure import measure
from phasemem.read import trace as read_trace
from phasemem.read.trace import no_gc
from phasemem.analysis import patterns
trace = read_trace(sys.argv[2])
with no_gc():
    an = Analysis.of(trace, str(trace.meta.get("markers") or "phasemem::"))
    measure(an)
    ctx, inner = an.facts, int(sys.argv[3])
    if hasattr(ctx, "_memo"):  # a checkout before typed facts: one dict of memos, reset per round
        memos = dict(ctx._memo)
        def fresh():
            ctx._memo = dict(memos)
            return ctx
        per_step = patterns._PER_STEP
    else:  # the shared facts measure() left (cached properties) on a new Context: detectors' own caches empty
        shared = {k: v for k, v in vars(ctx).items() if k not in {f.name for f in dataclasses.fields(ctx)}}
        def fresh():
            new = dataclasses.replace(ctx)
            vars(new).update(shared)
            return new
        per_step = patterns.detectors(True)
    best = {}
    for _ in range(inner):
        c = fresh()
        t = time.perf_counter()
        found = patterns.detect(c)
        best["detect"] = min(best.get("detect", 1e9), time.perf_counter() - t)
        c = fresh()
        for det in per_step:
            t = time.perf_counter()
            for step in range(len(c.seg.steps)):
                det(c, step)
            name = det.__module__.rsplit(".", 1)[-1] + "." + det.__name__
            best[name] = min(best.get(name, 1e9), time.perf_counter() - t)
sig = repr([(dataclasses.astuple(p), p.members) for p in found]).encode()
print(json.dumps({"best": best, "n": len(found), "sig": hashlib.sha256(sig).hexdigest()}))
"""


def _run(tree: str, trace: str, inner: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, tree, trace, str(inner)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner", type=int, default=5)
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for side in (("A", "B") if r % 2 == 0 else ("B", "A")):
            runs[side].append(_run(args.a if side == "A" else args.b, args.trace, args.inner))
    same = {x["sig"] for x in runs["A"] + runs["B"]}
    print(f"{args.trace}: A = {args.a}, B = {args.b}; {args.rounds} rounds, best of {args.inner} each")
    for key in runs["A"][0]["best"]:
        a, b = (statistics.median(x["best"][key] for x in runs[s]) for s in ("A", "B"))
        print(f"  {key:28s} A {a:.4f} s   B {b:.4f} s   B / A {b / a:.2f}")
    verdict = "identical" if len(same) == 1 else "DIFFERENT"
    print(f"  patterns: A {runs['A'][0]['n']}, B {runs['B'][0]['n']}, {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
