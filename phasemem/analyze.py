"""The pipeline: snapshot → trace → timeline → segmentation → report."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .columnar import is_columnar, load_trace
from .errors import PhasememError
from .load import load_snapshot, no_gc
from .measure import TOP_K, measure
from .categories import CATEGORIES, CategoryCurves
from .patterns import detect as detect_patterns
from .patterns.context import Context
from .report import OutOfMemory, Phase, Report
from .segment import PHASES, segment
from .timeline import Timeline
from .trace import Trace


def analyze(snapshot: Any, device: int | None = None, *, trusted: bool = False,
            marker_prefix: str | None = None) -> Report:
    """Analyse a memory snapshot: a path to a ``_dump_snapshot`` pickle (.pickle, .gz, .xz) or the dict.

    ``device`` picks the trace (default: the one with most events). ``marker_prefix`` names the
    ``record_function`` markers that delimit phases (``<prefix>forward``, ``zero_grad``,
    ``backward``, ``optimizer``); by default the prefix the snapshot says it was recorded with
    (``snapshot["phasemem"]["markers"]``), else ``phasemem::``.

    Example:
        >>> report = phasemem.analyze("snapshot.pickle")
        >>> report.phases["optimizer"].peak_bytes
    """
    if isinstance(snapshot, (str, os.PathLike)) and is_columnar(snapshot):
        trace = load_trace(snapshot)  # phasemem convert's output: no unpickling
        if device is not None and device != trace.device:
            raise PhasememError(f"{os.fspath(snapshot)} holds device {trace.device} only; convert the snapshot "
                                f"again with --device {device}")
        prefix = marker_prefix or str(trace.meta.get("markers") or "phasemem::")
        with no_gc():
            return analyze_trace(trace, marker_prefix=prefix)
    with no_gc():
        snap = load_snapshot(snapshot, trusted=trusted)
        trace = Trace.from_snapshot(snap, device)
        if marker_prefix is None:
            marker_prefix = str((snap.get("phasemem") or {}).get("markers") or "phasemem::")
        # Free the millions of event dicts we loaded while the collector is still paused: freeing
        # them also resets its allocation count, so re-enabling it does not set off a full pass.
        del snap
        return analyze_trace(trace, marker_prefix=marker_prefix)


def analyze_trace(trace: Trace, *, marker_prefix: str = "phasemem::") -> Report:
    tl = Timeline.from_trace(trace)
    seg = segment(trace, marker_prefix, tl)
    steps = measure(trace, tl, seg)
    ctx = Context.build(trace, tl, seg)
    patterns = detect_patterns(ctx)
    curves = CategoryCurves(ctx)
    level = tl.level
    peak_event = int(np.argmax(level))
    notes = []
    if not seg.intervals:
        notes.append("no phase markers or optimizer annotations in this trace: everything is 'other'; "
                     "record with phasemem.instrument() to get phases")
    if len(trace) and not trace.time_us.any():
        notes.append("the trace has no event times (an older PyTorch); markers cannot be placed, "
                     "so phases were inferred")
    if any(not s.complete for s in steps):
        notes.append("some steps are partial (the trace starts or ends inside them)")
    meta = trace.meta
    name = meta.get("device") or f"cuda:{trace.device}"
    report = Report(
        device=str(name),
        n_events=len(trace),
        peak_bytes=int(level[peak_event]),
        peak_event=peak_event,
        preexisting_bytes=int(tl.baseline),
        reserved_peak_bytes=int(tl.reserved_after.max()) if len(trace) else 0,
        steps=steps,
        phases=_aggregate(steps),
        sources=dict(seg.sources),
        patterns=patterns,
        notes=notes,
        label_codes=seg.labels,
        step_of=seg.step_of,
        trace=trace,
        timeline=tl,
        segmentation=seg,
        category_curves=curves,
    )
    _attach_categories(report, curves, tl)
    report.ooms = [
        OutOfMemory(
            event=e, step=int(seg.step_of[e]) if seg.step_of[e] >= 0 else None, phase=PHASES[int(seg.labels[e])],
            requested_bytes=int(trace.size[e]), device_free_bytes=free, allocated_bytes=int(tl.active_after[e]),
            by_category=dict(zip(CATEGORIES, curves.at([e + 1])[0].tolist())),
        )
        for e, free in sorted(trace.oom_device_free.items())
    ]
    return report


def _attach_categories(report: Report, curves: CategoryCurves, tl: Timeline) -> None:
    """Fill by_category of the report, every Step and every Phase in one vectorised evaluation."""
    holders = [report] + [s for s in report.steps] + list(report.phases.values())
    holders += [p for s in report.steps for p in s.phases.values()]
    holders = [h for h in holders if h.peak_event is not None]
    m = curves.at_level([h.peak_event for h in holders], tl.delta)
    for h, row in zip(holders, m.tolist()):
        h.by_category = dict(zip(CATEGORIES, row))


def _aggregate(steps) -> dict[str, Phase]:
    """One Phase per name over all steps: highest peak, first start, last end."""
    out: dict[str, Phase] = {}
    for name in PHASES:
        occ = [s.phases[name] for s in steps if name in s.phases]
        if not occ:
            continue
        top = max(occ, key=lambda p: p.peak_bytes)
        ran = [p for p in occ if p.n_events]
        allocs = sorted((a for p in occ for a in p.top_allocations), key=lambda a: (-a.size, a.event))
        out[name] = Phase(
            name=name, step=None, peak_bytes=top.peak_bytes,
            start_bytes=occ[0].start_bytes, end_bytes=occ[-1].end_bytes,
            start_event=ran[0].start_event if ran else None, end_event=ran[-1].end_event if ran else None,
            peak_event=top.peak_event, n_events=sum(p.n_events for p in occ), source=occ[0].source,
            confidence=min(p.confidence for p in occ),
            top_allocations=allocs[:TOP_K], at_event=occ[0].at_event,
        )
    return out
