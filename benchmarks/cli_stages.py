"""Where ``phasemem analyze FILE -o memory.png`` spends its time: its steps one after another in one
process, each timed (wall and CPU): numpy's import, phasemem's and its CLI's, reading, the analysis
(without the what-ifs, as the CLI runs it without --what-if or --json), the report's text,
matplotlib's import, the renderer's, and the PNG. The interpreter's own start (~0.08 s here) comes
before the first line.

Run (from the checkout to measure, so that its phasemem is the one imported):

    python3 benchmarks/cli_stages.py TRACE [--png OUT.png]
"""
from __future__ import annotations

import time

T0, C0 = time.perf_counter(), time.process_time()

import argparse  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402

_rows: list[tuple[str, float, float]] = []
_last = [T0, C0]


def lap(name: str) -> None:
    t, c = time.perf_counter(), time.process_time()
    _rows.append((name, t - _last[0], c - _last[1]))
    _last[:] = [t, c]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--png", default="/tmp/phasemem-cli-stages.png")
    args = ap.parse_args(argv)
    lap("argparse")
    import numpy  # noqa: F401
    lap("import numpy")
    import phasemem  # noqa: F401
    from phasemem.commands.cli import main as _cli  # noqa: F401  (what the CLI imports before reading)
    lap("import phasemem + cli")
    from phasemem.read import read
    from phasemem.analysis.step_index import cut
    from phasemem.read.trace import no_gc
    pipeline = importlib.import_module("phasemem.report.pipeline")
    with no_gc():
        got = cut(read(args.trace, None))
        lap("read")
        report = pipeline._report(got, False)
        lap("analysis (no what-ifs)")
    str(report)
    lap("report text")
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    lap("import matplotlib")
    import phasemem.reporters.picture.draw  # noqa: F401
    lap("import phasemem.reporters.picture.draw")
    report.picture_writer(args.png)(args.png)
    lap("PNG")
    for name, wall, cpu in _rows:
        print(f"{name:26s} wall {wall:6.3f}  cpu {cpu:6.3f}")
    print(f"{'total in process':26s} wall {time.perf_counter() - T0:6.3f}  cpu {time.process_time() - C0:6.3f}")
    print(f"(phasemem from {sys.modules['phasemem'].__file__})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
