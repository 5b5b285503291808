"""``phasemem analyze FILE -o memory.png`` end to end beside the floor, in fresh processes, median of N.

Per round, in this order (each a fresh interpreter, so imports count as a user pays them):
the floor (``pickle.load`` of the file with the collector off, timed inside its process), then
the CLI of each tree given (``python3 -m phasemem analyze FILE -o PNG``, wall time of the whole
process and its CPU seconds, user + system). Trees alternate their order every round. The table
gives each case's median over rounds and its ratio to the floor's median.

Make the file first, e.g. 1M events in torch's default form:

    python3 benchmarks/scale_snapshot.py fixtures/plain_gpt_torch_defaults.pkl.xz /tmp/big.pickle --events 1000000

Run (from the repository root; several trees to compare a change, e.g. an export of the commit before):

    python3 benchmarks/bench_e2e.py /tmp/big.pickle [--tree . --tree /tmp/base] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_FLOOR = ("import gc, pickle, sys, time\ngc.disable()\nt, c = time.perf_counter(), time.process_time()\n"
          "with open(sys.argv[1], 'rb') as f:\n    pickle.load(f)\nprint(time.perf_counter() - t, time.process_time() - c)\n")


def floor(path: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of ``pickle.load`` of the file with the collector off, timed inside a fresh process."""
    out = subprocess.run([sys.executable, "-c", _FLOOR, str(path)], capture_output=True, text=True, check=True)
    wall, cpu = map(float, out.stdout.split())
    return wall, cpu


def cli(tree: Path, path: Path, png: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of ``phasemem analyze FILE -o PNG`` run with ``tree`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # -m puts the working directory first on sys.path: run in the tree, or every tree runs the phasemem
    # of the directory the benchmark was started from (until 2026-12-05 it did: A/Bs compared one tree)
    subprocess.run([sys.executable, "-m", "phasemem", "analyze", str(path.resolve()), "-o", str(png.resolve())],
                   env=env, cwd=str(tree.resolve()), stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--tree", type=Path, action="append", help="a checkout to run (repeatable; default: this one)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    trees = args.tree or [Path(__file__).resolve().parents[1]]
    floors: list[tuple[float, float]] = []
    res: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.runs):
            floors.append(floor(args.trace))
            for tree in (trees if r % 2 == 0 else trees[::-1]):
                res[tree].append(cli(tree, args.trace, Path(tmp) / "memory.png"))
            print(f"run {r + 1}: floor {floors[-1][0]:.3f} s wall, {floors[-1][1]:.3f} s CPU  " + "  ".join(
                f"{t}: {v[-1][0]:.3f} s wall, {v[-1][1]:.3f} s CPU" for t, v in res.items()), flush=True)
    f, fc = statistics.median(w for w, _ in floors), statistics.median(c for _, c in floors)
    print(f"\n{args.trace.name} ({args.trace.stat().st_size / 2**20:,.1f} MiB), median of {args.runs}, fresh processes")
    print(f"  {'pickle.load, collector off (the floor)':<48} {f:7.3f} s   1.00 x floor   CPU {fc:.3f} s   1.00 x")
    for tree, v in res.items():
        wall, cpu = statistics.median(w for w, _ in v), statistics.median(c for _, c in v)
        print(f"  {'phasemem analyze -o PNG (' + str(tree) + ')':<48} {wall:7.3f} s   {wall / f:4.2f} x floor"
              f"   CPU {cpu:.3f} s   {cpu / fc:4.2f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
