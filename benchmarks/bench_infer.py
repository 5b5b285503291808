"""How long phasemem takes to infer steps and phases when a snapshot has no markers.

Stretches a real H200 snapshot (steps 1-2 repeated, ``bench_analyze.replicate_steps``) to about
``--events`` events, removes every annotation, and times, best of ``--repeat``:

- ``frames``: ``phasemem.analyze`` of that snapshot (phases from stack frames);
- ``lifetimes``: the same with every stack frame removed too (``infer.labels_from_lifetimes`` alone,
  then the whole ``analyze``).

    python3 benchmarks/bench_infer.py --events 1000000
"""
from __future__ import annotations

import argparse
import copy
import lzma
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import replicate_steps  # noqa: E402

import phasemem  # noqa: E402
from phasemem.analysis.infer import labels_from_lifetimes  # noqa: E402
from phasemem.analysis.timeline import Timeline  # noqa: E402
from phasemem.read.trace import Trace  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "plain_gpt_foreach.pkl.xz"  # gt:: markers


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--source", type=Path, default=SOURCE)
    a = ap.parse_args(argv)
    obj = pickle.loads(lzma.decompress(a.source.read_bytes()))
    base = obj.get("snapshot", obj)
    per_copy = len(replicate_steps(base, 2)["device_traces"][0]) - len(replicate_steps(base, 1)["device_traces"][0])
    big = replicate_steps(base, max(1, (a.events - len(base["device_traces"][0])) // per_copy + 1))
    marked = len(phasemem.analyze(big, marker_prefix="gt::").steps)
    big["external_annotations"] = []
    bare = copy.deepcopy(big)
    for e in bare["device_traces"][0]:
        e["frames"] = []
    n = len(big["device_traces"][0])
    print(f"{n:,} events from {a.source.name} (steps 1-2 repeated), {marked} steps by its markers\n")
    print("| path | steps found | `analyze` (s) | inference alone (s) |")
    print("|---|---:|---:|---:|")
    r = phasemem.analyze(big)
    t_frames = best_of(a.repeat, lambda: phasemem.analyze(big))
    print(f"| frames | {len(r.steps)} | {t_frames:.2f} | — |")
    trace = Trace.from_snapshot(bare)
    tl = Timeline.from_trace(trace)
    t_infer = best_of(a.repeat, lambda: labels_from_lifetimes(trace, tl))
    r = phasemem.analyze(bare)
    t_all = best_of(a.repeat, lambda: phasemem.analyze(bare))
    print(f"| lifetimes | {len(r.steps)} | {t_all:.2f} | {t_infer:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
