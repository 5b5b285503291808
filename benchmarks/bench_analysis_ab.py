"""``analyze_trace`` of one trace in two checkouts, A/B: which is faster, in CPU and wall seconds.

Each round runs both trees in fresh processes, in alternating order (A B, B A, ...), each process
reading the trace once (unprofiled) and timing ``analyze_trace`` under ``no_gc()`` (as ``analyze``
runs it) ``--inner`` times, keeping its best. The table gives each tree's median over rounds, and
the median of the per-round ratios B / A (which the other agents' load moves less than either
alone), and each beside the floor: ``pickle.load`` of the file with the collector off, in a fresh
process at the start of every round. CPU seconds are ``time.process_time``: wall time on a shared 2-core machine moves ±30 %.

Run (from the repository root; A is usually an export of the commit before, B this tree):

    python3 benchmarks/bench_analysis_ab.py TRACE --a /tmp/base --b . [--rounds 5] [--inner 2] [--markers gt::]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from phasemem.report.pipeline import analyze_trace
from phasemem.read import trace as read_trace
from phasemem.read.trace import no_gc
trace = read_trace(sys.argv[2])
prefix = sys.argv[3] or str(trace.meta.get("markers") or "phasemem::")
best_cpu = best_wall = float("inf")
for _ in range(int(sys.argv[4])):
    with no_gc():
        c0, w0 = time.process_time(), time.perf_counter()
        report = analyze_trace(trace, marker_prefix=prefix)
        best_cpu, best_wall = min(best_cpu, time.process_time() - c0), min(best_wall, time.perf_counter() - w0)
    del report
print(json.dumps({"cpu": best_cpu, "wall": best_wall, "events": len(trace)}))
"""


_FLOOR = ("import gc, pickle, sys, time\ngc.disable()\nt, c = time.perf_counter(), time.process_time()\n"
          "with open(sys.argv[1], 'rb') as f:\n    pickle.load(f)\n"
          "print(time.perf_counter() - t, time.process_time() - c)\n")


def floor(trace: Path) -> dict:
    """``pickle.load`` of the file with the collector off (the floor), in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _FLOOR, str(trace)], capture_output=True, text=True, check=True)
    wall, cpu = map(float, out.stdout.split())
    return {"wall": wall, "cpu": cpu}


def run_one(tree: Path, trace: Path, markers: str, inner: int) -> dict:
    """One fresh process of ``tree`` timing ``analyze_trace`` of ``trace``."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tree.resolve()), str(trace), markers, str(inner)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--a", type=Path, required=True, help="the checkout measured as A (before)")
    ap.add_argument("--b", type=Path, default=Path("."), help="the checkout measured as B (after)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inner", type=int, default=2)
    ap.add_argument("--markers", default="")
    args = ap.parse_args(argv)
    res: dict[str, list[dict]] = {"A": [], "B": [], "floor": []}
    for r in range(args.rounds):
        res["floor"].append(floor(args.trace))
        order = (("A", args.a), ("B", args.b)) if r % 2 == 0 else (("B", args.b), ("A", args.a))
        for name, tree in order:
            res[name].append(run_one(tree, args.trace, args.markers, args.inner))
        print(f"round {r + 1}: " + "  ".join(f"{k} cpu {v[-1]['cpu']:.3f} s wall {v[-1]['wall']:.3f} s"
                                            for k, v in res.items()), flush=True)
    print("(floor: pickle.load of the file, collector off, in a fresh process each round)")
    print(f"\n{args.trace.name}: {res['A'][0]['events']:,} events; A = {args.a}, B = {args.b}; "
          f"{args.rounds} rounds, best of {args.inner} each")
    for key in ("cpu", "wall"):
        a = statistics.median(x[key] for x in res["A"])
        b = statistics.median(x[key] for x in res["B"])
        ratio = statistics.median(y[key] / x[key] for x, y in zip(res["A"], res["B"]))
        f = statistics.median(x[key] for x in res["floor"])
        print(f"  analyze_trace {key:<4}  A {a:6.3f} s ({a / f:4.2f} x floor)   B {b:6.3f} s ({b / f:4.2f} x floor)"
              f"   B / A (median of rounds) {ratio:5.2f}   floor {f:6.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
