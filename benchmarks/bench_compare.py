"""How long ``phasemem diff`` takes on two million-event snapshots, against analysing both.

Two real H200 fixtures of the same GPT (``gpt_foreach``: zero_grad after the forward;
``gpt_zero_grad_end``: zero_grad at the end of the step) are each stretched to ~1,000,000 events by
repeating their steady steps 1-2 (``bench_analyze.replicate_steps``: times shifted, markers repeated,
allocs and frees still paired), written as plain pickles. Best of N of:

- ``phasemem.analyze(A)`` + ``phasemem.analyze(B)``: the floor, analysing both;
- ``phasemem diff A B -o diff.png --json diff.json`` end to end (both analyses, the comparison, the
  text, the picture and the JSON), in-process through ``phasemem.cli.main``;
- ``compare_reports`` alone on the two finished reports, and the picture alone.

Target: diff <= 2 x analysing both. Run (from the repository root):

    python3 benchmarks/bench_compare.py [--events 1000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import lzma
import os
import pickle
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_analyze import best_of, replicate_steps  # noqa: E402

SOURCES = (ROOT / "fixtures" / "gpt_foreach.pkl.xz", ROOT / "fixtures" / "gpt_zero_grad_end.pkl.xz")


def stretched(path: Path, events: int) -> dict:
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    n0 = len(snap["device_traces"][0])
    per_block = len(replicate_steps(snap, 2, prefix="phasemem::")["device_traces"][0]) - n0
    return replicate_steps(snap, max(1, round((events - n0) / per_block) + 1), prefix="phasemem::")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="about how many events each (default 1,000,000)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
    args = ap.parse_args(argv)
    import phasemem
    from phasemem.cli import main as cli
    from phasemem.compare import choose_steps, compare_reports

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

        t_both, reports = best_of(args.repeat, lambda: (phasemem.analyze(a), phasemem.analyze(b)))

        def diff():
            with contextlib.redirect_stdout(io.StringIO()):
                rc = cli(["diff", a, b, "-o", png, "--json", js])
            assert rc == 0, rc
        t_diff, _ = best_of(args.repeat, diff)
        ra, rb = reports
        t_cmp, c = best_of(args.repeat, lambda: compare_reports(ra, rb, *choose_steps(ra, rb, None)[:2]))
        t_pic, _ = best_of(args.repeat, lambda: c.picture_writer(png)(png))

    print(f"best of {args.repeat}, {len(ra.steps)} + {len(rb.steps)} steps")
    print("| | seconds | × analysing both |\n|---|---:|---:|")
    for label, t in (("analyze A + analyze B", t_both), ("**phasemem diff A B -o diff.png --json diff.json**", t_diff),
                     ("of which compare_reports (the comparison itself)", t_cmp),
                     ("of which the picture (drawn and written)", t_pic)):
        print(f"| {label} | {t:.3f} | {t / t_both:.2f} |")
    verdict = "met" if t_diff <= 2 * t_both else "NOT met"
    print(f"target diff <= 2 x analysing both: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
