"""How long drawing the picture takes as traces grow: 125k, 250k, 500k and 1M events.

A real H200 snapshot (3 training steps, 7,562 events) is stretched to each size by repeating its
steady-state steps 1-2 (``replicate_steps`` from ``bench_analyze.py``, the same traces that
benchmark analyses). Each is analysed once, untimed; then ``render.save`` (the whole picture: band
stacking, labels, matplotlib, the PNG encoder) is timed, best of N, for the default picture and for
``color="stack"``. Targets: 1M events in under 5 s, and time growing no faster than the event count.

Run (from the repository root):

    python3 benchmarks/bench_render.py [--sizes 125000,250000,500000,1000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analyze import SOURCE, read_shared, replicate_steps  # noqa: E402


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="125000,250000,500000,1000000", help="about how many events, comma separated")
    ap.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
    ap.add_argument("--source", type=Path, default=SOURCE)
    args = ap.parse_args(argv)
    import phasemem
    from phasemem import render

    base = read_shared(args.source)
    n0 = len(base["device_traces"][0])
    per_block = len(replicate_steps(base, 2)["device_traces"][0]) - n0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "memory.png")
        for target in (int(s) for s in args.sizes.split(",")):
            copies = max(1, round((target - n0) / per_block) + 1)
            report = phasemem.analyze(replicate_steps(base, copies), marker_prefix="gt::")
            gc.collect()
            t_cat = best_of(args.repeat, lambda r=report: render.save(r, png))
            t_stack = best_of(args.repeat, lambda r=report: render.save(r, png, color="stack"))
            fig = render.plot(report)
            rows.append((report.n_events, len(report.steps), len(report.patterns), len(fig.phasemem_stack.index),
                         t_cat, t_stack))
            print(f"  {report.n_events:>9,} events done", file=sys.stderr)

    print(f"render.save to PNG, 1600x900, best of {args.repeat} ({args.source.name} stretched)")
    print("| events | steps | patterns | bands drawn | save (s) | save, color=stack (s) | µs per 1k events |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, steps, pats, drawn, t_cat, t_stack in rows:
        print(f"| {n:,} | {steps} | {pats:,} | {drawn:,} | {t_cat:.3f} | {t_stack:.3f} | {t_cat / n * 1e9:.0f} |")
    (n_a, *_, t_a, _), (n_b, *_, t_b, _) = rows[0], rows[-1]
    growth = (t_b / t_a) / (n_b / n_a)
    print(f"\n{n_b / n_a:.0f}x the events took {t_b / t_a:.2f}x the time "
          f"({'no faster than linear' if growth <= 1 else 'FASTER THAN LINEAR'}); "
          f"{n_b:,} events: {t_b:.2f} s" + (f" (1M-event target < 5 s: {'met' if t_b < 5 else 'MISSED'})"
                                              if n_b >= 1_000_000 * 0.99 else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
