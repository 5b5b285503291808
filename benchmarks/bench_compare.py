"""How long ``phasemem diff`` takes on two million-event snapshots, against one analysis.

Two real H200 fixtures of the same GPT (``gpt_foreach``: zero_grad after the forward;
``gpt_zero_grad_end``: zero_grad at the end of the step) are each stretched to ~1,000,000 events by
repeating their steady steps 1-2 (``bench_analyze.replicate_steps``: times shifted, markers repeated,
allocs and frees still paired), written as plain pickles. The median of N runs of:

- ``phasemem.analyze(A)``: one analysis (the yardstick), and ``analyze(A)`` + ``analyze(B)``;
- ``phasemem diff A B -o diff.png --json diff.json`` end to end (both analyses, the comparison, the
  text, the picture and the JSON), in-process through ``phasemem.commands.cli.main``;
- ``compare_reports`` alone on the two finished reports, and the picture alone.

``diff`` analyses both without the what-ifs (``analyze(..., what_ifs=False)``: a comparison reads
none). Target (issue 34): diff <= 2 x one analysis. Run (from the repository root):

    python3 benchmarks/bench_compare.py [--events 1000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import lzma
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_analyze import replicate_steps  # noqa: E402


def median_of(repeat: int, fn):
    """The medians of ``repeat`` timed calls (issue 34: three runs, median), wall and CPU seconds
    (``time.process_time``: other processes on a shared machine move it less), and the last result."""
    wall, cpu, result = [], [], None
    for _ in range(repeat):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return (statistics.median(wall), statistics.median(cpu)), result


SOURCES = (ROOT / "fixtures" / "gpt_foreach.pkl.xz", ROOT / "fixtures" / "gpt_zero_grad_end.pkl.xz")


def stretched(path: Path, events: int) -> dict:
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    n0 = len(snap["device_traces"][0])
    per_block = len(replicate_steps(snap, 2, prefix="phasemem::")["device_traces"][0]) - n0
    return replicate_steps(snap, max(1, round((events - n0) / per_block) + 1), prefix="phasemem::")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="about how many events each (default 1,000,000)")
    ap.add_argument("--repeat", type=int, default=3, help="median of N runs (default 3)")
    args = ap.parse_args(argv)
    import phasemem
    from phasemem.commands.cli import main as cli
    from phasemem.report.compare import choose_steps, compare_reports

    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for src in SOURCES:
            big = stretched(src, args.events)
            p = os.path.join(tmp, src.name.split(".")[0] + ".pickle")
            with open(p, "wb") as f:
                pickle.dump(big, f)
            print(f"{src.name}: {len(big['device_traces'][0]):,} events, {os.path.getsize(p) / 2**20:.1f} MiB pickle")
            paths.append(p)
            del big
        a, b = paths
        png, js = os.path.join(tmp, "diff.png"), os.path.join(tmp, "diff.json")

        t_one, _ = median_of(args.repeat, lambda: phasemem.analyze(a))
        t_both, reports = median_of(args.repeat, lambda: (phasemem.analyze(a), phasemem.analyze(b)))

        def diff():
            with contextlib.redirect_stdout(io.StringIO()):
                rc = cli(["diff", a, b, "-o", png, "--json", js])
            assert rc == 0, rc
        t_diff, _ = median_of(args.repeat, diff)
        ra, rb = reports
        t_cmp, c = median_of(args.repeat, lambda: compare_reports(ra, rb, *choose_steps(ra, rb, None)[:2]))
        t_pic, _ = median_of(args.repeat, lambda: c.picture_writer(png)(png))

    print(f"median of {args.repeat}, {len(ra.steps)} + {len(rb.steps)} steps")
    print("| | wall s | × one analysis | CPU s | × one analysis |\n|---|---:|---:|---:|---:|")
    for label, (w, cp) in (("analyze A (one analysis)", t_one), ("analyze A + analyze B", t_both),
                          ("**phasemem diff A B -o diff.png --json diff.json**", t_diff),
                          ("of which compare_reports (the comparison itself)", t_cmp),
                          ("of which the picture (drawn and written)", t_pic)):
        print(f"| {label} | {w:.3f} | {w / t_one[0]:.2f} | {cp:.3f} | {cp / t_one[1]:.2f} |")
    verdict = {k: "met" if t_diff[i] <= 2 * t_one[i] else "NOT met" for i, k in enumerate(("wall", "CPU"))}
    print(f"target diff <= 2 x one analysis: {verdict['wall']} (wall), {verdict['CPU']} (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
