"""What ``report.fits(budget)`` costs on a million-event trace, now that it replays the caching
allocator (phasemem.predictions.allocator): the replays walk only the window of the peak's step and the step
before it (fits/capped.py, WHOLE_TRACE_EVENTS).

The trace is bench_analyze's: ../shared/gpu-snapshots/gpt_ckpt_fused_seedlike stretched to ~1M events
by repeating its steps 1-2. Prints the analysis time (not fits'), then fits' time, its number of
replays and their share, at a budget of 1.5 x the trace's reserved peak.

    python3 benchmarks/bench_fits.py [--events 1000000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    from bench_analyze import SOURCE, read_shared, replicate_steps

    import phasemem
    from phasemem.predictions.allocator import over_events
    from phasemem.predictions.fits.capped import WHOLE_TRACE_EVENTS

    if not SOURCE.exists():
        print(f"{SOURCE} is missing (../shared)")
        return 1
    base = read_shared(SOURCE)
    n0 = len(base["device_traces"][0])
    per_block = len(replicate_steps(base, 2)["device_traces"][0]) - n0
    big = replicate_steps(base, max(1, round((args.events - n0) / per_block) + 1))
    t0 = time.perf_counter()
    r = phasemem.analyze(big, marker_prefix="gt::")
    t_an = time.perf_counter() - t0
    n = r.n_events
    reserved = int(r.analysis.timeline.reserved_after.max())
    calls, spent = [0], [0.0]
    real = over_events.replay

    def counted(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            calls[0] += 1
            spent[0] += time.perf_counter() - t

    over_events.replay = counted
    t0 = time.perf_counter()
    fx = r.fits(int(1.5 * reserved))
    t_fits = time.perf_counter() - t0
    over_events.replay = real
    print(f"{n:,} events ({len(r.steps)} steps), analysed in {t_an:.1f} s; whole-trace replay up to "
          f"{WHOLE_TRACE_EVENTS:,} events")
    print(f"fits(1.5 x reserved peak {reserved / 2**30:.2f} GiB): {t_fits:.2f} s, {calls[0]} replays taking "
          f"{spent[0]:.2f} s ({spent[0] / max(calls[0], 1) * 1000:.0f} ms each)")
    print(f"  {fx.allocator}")
    print(f"  batch x{fx.batch.largest_factor} (allocated bound x{fx.batch.largest_factor_allocated}); "
          f"sequence {'x%s' % fx.sequence.largest_factor if fx.sequence.applies else 'n/a'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
