"""Where the time after reading goes: cProfile of ``analyze_trace`` and of ``save_png`` on one trace.

Reads the file (a snapshot pickle or a ``phasemem convert`` .npz) first, unprofiled, then profiles
the analysis and the picture separately, and prints the functions by cumulative and by own time.
Profiled times run ~1.5x the unprofiled ones; read them for where, not for how long.

Run (from the repository root):

    python3 benchmarks/profile_analysis.py TRACE [--markers gt::] [--top 45]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--markers", help="marker prefix (default: the trace's own, else phasemem::)")
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--png", default="/tmp/phasemem-profile.png")
    args = ap.parse_args(argv)
    from phasemem.report.pipeline import analyze_trace
    from phasemem.read import trace as read_trace
    from phasemem.read.trace import no_gc

    trace = read_trace(args.trace)  # any form: pickle, .npz
    prefix = args.markers or str(trace.meta.get("markers") or "phasemem::")
    analysis, picture = cProfile.Profile(), cProfile.Profile()
    with no_gc():  # as phasemem.analyze runs it
        analysis.enable()
        report = analyze_trace(trace, marker_prefix=prefix)
        analysis.disable()
    picture.enable()
    report.save_png(args.png)
    picture.disable()
    out = io.StringIO()
    print(f"{args.trace.name}: {len(trace):,} events, {len(report.steps)} steps", file=out)
    for title, prof, key, n in (("analyze_trace, by cumulative time", analysis, "cumtime", args.top),
                                ("analyze_trace, by own time", analysis, "tottime", args.top // 2),
                                ("save_png, by cumulative time", picture, "cumtime", args.top // 2)):
        print(f"== {title} ==", file=out)
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(n)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
