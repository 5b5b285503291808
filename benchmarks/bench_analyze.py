"""How long phasemem takes on a million-event trace, against just unpickling it.

A real H200 snapshot (3 training steps, 7,562 events) is stretched to ~1,000,000 events by
repeating its steady-state steps 1–2, times shifted and the ``gt::`` markers repeated with them,
then saved as a plain pickle like ``torch.cuda.memory._dump_snapshot`` writes. Best of 3 of:

- ``pickle.load`` of that file (the floor: any tool reading the file pays it), and
- ``phasemem.analyze(path)`` + ``report.save_png(...)`` end to end,

with a breakdown of where the second goes. Target: analyse + PNG <= 1.5 x pickle.load.

Run (from the repository root):

    python3 benchmarks/bench_analyze.py [--events 1000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import gc
import lzma
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "gpu-snapshots" / "gpt_ckpt_fused_seedlike.pkl.xz"
_SEGMENT_ACTIONS = {"segment_alloc", "segment_free", "segment_map", "segment_unmap"}


def read_shared(path: Path) -> dict:
    """The snapshot dict inside one of the shared ``{"snapshot": ..., "meta": ...}`` files."""
    obj = pickle.loads(lzma.decompress(path.read_bytes()))
    return obj.get("snapshot", obj)


def replicate_steps(snap: dict, copies: int, *, first: int = 1, last: int = 2, prefix: str = "gt::") -> dict:
    """A new snapshot whose steps ``first..last`` are repeated ``copies`` times in a row.

    Steps are cut where ``<prefix>optimizer`` ENDs (as phasemem cuts them). Each copy's events and
    annotations are shifted in time by the block's duration, so every copy is a complete, marked
    step. Addresses must keep allocs and frees paired as in a real run: copy k (but the first and
    the last, which keep the snapshot's own addresses so its ``segments`` still describe the end)
    moves its allocations to a range of its own, and the frees with which a copy releases what the
    copy before it left alive (last step's gradients, say) are pointed at those allocations, matched
    by size. Segment events are kept in the first copy only: the segments exist from then on.
    Event dicts are new (time and address differ) but share their ``frames`` lists, as torch's do.

    Example:
        >>> big = replicate_steps(read_shared(SOURCE), 200)   # ~1M events
    """
    events = snap["device_traces"][0]
    anns = snap["external_annotations"]
    ends = sorted(a["time_us"] for a in anns if a["name"] == prefix + "optimizer" and a["stage"] == "END")
    t_a = ends[first - 1] if first > 0 else min(e["time_us"] for e in events) - 1
    t_b = ends[last]
    span = t_b - t_a

    def split(items):
        head = [x for x in items if x["time_us"] <= t_a]
        block = [x for x in items if t_a < x["time_us"] <= t_b]
        tail = [x for x in items if x["time_us"] > t_b]
        return head, block, tail

    ev_head, ev_block, ev_tail = split(events)
    an_head, an_block, an_tail = split(anns)

    # What the block frees that it did not allocate (inherited), and what it leaves alive (handed on).
    live: dict[int, int] = {}  # addr -> size, allocated inside the block and not yet freed
    inherited: list[tuple[int, int]] = []  # (size, addr) in the order freed
    frees_inherited = set()  # positions in the block of the free events of inherited allocations
    for i, e in enumerate(ev_block):
        act = e["action"]
        if act == "alloc":
            live[e["addr"]] = e["size"]
        elif act in ("free_requested", "free_completed") and e["addr"] not in live:
            frees_inherited.add(i)
            if act == "free_completed":
                inherited.append((e["size"], e["addr"]))
        elif act == "free_completed":
            del live[e["addr"]]
    handed = sorted((size, addr) for addr, size in live.items())
    inherited_sorted = sorted(inherited)
    if [s for s, _ in handed] != [s for s, _ in inherited_sorted]:
        raise ValueError("steps first..last do not end in the state they start in; pick other steps")
    # inherited address -> the allocation of the previous copy that takes its place
    takes = {a_in: a_out for (_, a_in), (_, a_out) in zip(inherited_sorted, handed)}

    stride = 1 << 40  # beyond any real device address range
    def offset(k):
        return 0 if k == 0 or (k == copies - 1 and copies > 2) else k * stride

    out_events, out_anns = list(ev_head), list(an_head)
    for k in range(copies):
        dt, off, prev = k * span, offset(k), offset(k - 1)
        if k == 0:
            out_events += ev_block
        else:
            for i, e in enumerate(ev_block):
                act = e["action"]
                if act.startswith("segment_"):
                    continue
                addr = e["addr"]
                if i in frees_inherited:
                    new = takes[addr] + prev
                else:
                    new = addr + off
                out_events.append({**e, "time_us": e["time_us"] + dt, "addr": new})
        out_anns += an_block if k == 0 else [{**a, "time_us": a["time_us"] + dt} for a in an_block]
    out_events += [{**e, "time_us": e["time_us"] + (copies - 1) * span} for e in ev_tail]
    out_anns += [{**a, "time_us": a["time_us"] + (copies - 1) * span} for a in an_tail]
    traces = list(snap["device_traces"])
    traces[0] = out_events
    return {**snap, "device_traces": traces, "external_annotations": out_anns}


def _optional_parts(repeat, trace, tl, seg) -> dict:
    """Stages that exist only in newer versions of the pipeline (patterns, categories)."""
    try:
        from phasemem.analysis.category_curves import CategoryCurves
        from phasemem.analysis.patterns import detect
        from phasemem.analysis.patterns.context import Context
    except ImportError:
        return {}
    out = {}
    out["Context.build"], ctx = best_of(repeat, lambda: Context.build(trace, tl, seg))
    out["patterns.detect"], _ = best_of(repeat, lambda: detect(ctx))
    out["CategoryCurves"], _ = best_of(repeat, lambda: CategoryCurves(ctx))
    return out


def best_of(repeat: int, fn):
    times, result = [], None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="about how many events (default 1,000,000)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
    ap.add_argument("--source", type=Path, default=SOURCE)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import phasemem
    from phasemem.report.pipeline import analyze_trace
    from phasemem.read.snapshot import load_snapshot
    from phasemem.read.trace import no_gc
    from phasemem.analysis.measure import measure
    from phasemem.reporters.picture.draw import save
    from phasemem.analysis.segmentation import segment
    from phasemem.read import trace as read_trace
    from phasemem.analysis.timeline import Timeline
    from phasemem.read.trace import Trace

    base = read_shared(args.source)
    n0 = len(base["device_traces"][0])
    per_block = sum(1 for _ in replicate_steps(base, 2)["device_traces"][0]) - n0
    copies = max(1, round((args.events - n0) / per_block) + 1)
    big = replicate_steps(base, copies)
    n = len(big["device_traces"][0])

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        with open(path, "wb") as f:
            pickle.dump(big, f)
        size = os.path.getsize(path)
        del big
        png = os.path.join(tmp, "memory.png")
        print(f"snapshot: {n:,} events ({copies} copies of steps 1-2 of {args.source.name}), "
              f"{size / 2**20:.1f} MiB pickle; best of {args.repeat}")

        def plain_load():
            with open(path, "rb") as f:
                return pickle.load(f)

        # As a user (or memory_viz) calls it: the cyclic collector on. The gc-off figure is the
        # floor for any reader of this file; phasemem's loader runs with gc off.
        t_pickle, _ = best_of(args.repeat, plain_load)
        with no_gc():
            t_pickle_nogc, _ = best_of(args.repeat, plain_load)

        def end_to_end():
            report = phasemem.analyze(path, marker_prefix="gt::")
            report.save_png(png)
            return report

        t_total, report = best_of(args.repeat, end_to_end)
        steps = len(report.steps)
        del report

        # The same pipeline stage by stage, each best of N, under no_gc() as analyze() runs them.
        parts = {}
        with no_gc():
            # What analyze() reads a pickle with; the two stages after it are the ordinary reader's.
            parts["read_trace (streamed)"], _ = best_of(args.repeat, lambda: read_trace(path))
            parts["load_snapshot"], snap = best_of(args.repeat, lambda: load_snapshot(path))
            parts["Trace.from_snapshot"], trace = best_of(args.repeat, lambda: Trace.from_snapshot(snap))
            snap = None  # let the million event dicts go before timing the array stages
            parts["Timeline.from_trace"], tl = best_of(args.repeat, lambda: Timeline.from_trace(trace))
            parts["segment"], seg = best_of(args.repeat, lambda: segment(trace, "gt::"))
            parts["measure"], _ = best_of(args.repeat, lambda: measure(trace, tl, seg))
            t_report, report = best_of(args.repeat, lambda: analyze_trace(trace, marker_prefix="gt::"))
            parts["rest of analyze_trace"] = t_report - sum(parts[k] for k in ("Timeline.from_trace", "segment", "measure"))
            extra = _optional_parts(args.repeat, trace, tl, seg)
        parts["render + PNG (save_png)"], _ = best_of(args.repeat, lambda: save(report, png))

    ratio = t_total / t_pickle
    print(f"{'pickle.load (gc on, as usual)':<34} {t_pickle:7.3f} s")
    print(f"{'pickle.load (gc off)':<34} {t_pickle_nogc:7.3f} s")
    print(f"{'analyze + save_png':<34} {t_total:7.3f} s   = {ratio:.2f} x pickle.load, "
          f"{t_total / t_pickle_nogc:.2f} x gc-off pickle.load (target <= 1.50 x: {'met' if ratio <= 1.5 else 'MISSED'})")
    print(f"steps found: {steps}")
    print("breakdown (best of each stage):")
    for name, t in parts.items():
        print(f"  {name:<32} {t:7.3f} s")
    for name, t in extra.items():
        print(f"    of which {name:<23} {t:7.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
