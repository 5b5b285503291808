"""What is alive at a report's peak (or one step's), by category and by shape, and where an event
sits (its step, its phase, the shape it is the peak of). Reads a Report's public parts only.

``peak_breakdown`` reads ``Report.peak`` (issue 15) once reports carry it; until then a small
fallback stands in, marked TEMPORARY below, to be deleted with it.

Example:
    >>> bd = peak_breakdown(report)
    >>> sum(bd.by_shape.values()) + sum(bd.rest_by_category.values()) == bd.bytes
    True
"""
from __future__ import annotations

import bisect

from .model import PeakBreakdown, Step
from .report import Report


def peak_breakdown(report: Report, step: Step | None = None) -> PeakBreakdown:
    """What is alive at the peak of ``step`` (a ``Step`` of ``report``), or of the whole recording.

    Example:
        >>> peak_breakdown(report, report.steps[1]).by_category["activation"]
    """
    got = getattr(report if step is None else step, "peak", None)
    if isinstance(got, PeakBreakdown) and (step is None or got.step == step.index):
        return got
    return _fallback_breakdown(report, step)


# ---- TEMPORARY: delete from here to "end of TEMPORARY" once Report.peak (issue 15) exists. ----------
_FALLBACK_CATEGORY = {"logits": "activation", "softmax_spike": "temporary", "checkpoint_recompute": "activation",
                      "gradients": "gradient", "gradient_accumulation": "gradient",
                      "optimizer_state_init": "optimizer_state", "optimizer_temporaries": "temporary",
                      "amp_unscale": "temporary", "grad_clip": "temporary", "workspace": "other", "leak": "other"}


def _fallback_breakdown(report: Report, step: Step | None) -> PeakBreakdown:
    """Categories at the peak (exact), and the shapes spanning it, each taken out of the category its
    kind usually is and capped at what that category holds, so that the sums stay exact."""
    event = report.peak_event if step is None else step.peak_event
    total = report.peak_bytes if step is None else step.peak_bytes
    cats = {k: int(v) for k, v in (report.by_category if step is None else step.by_category).items()}
    rest, shapes = dict(cats), {}
    for p in report.patterns:
        cat = _FALLBACK_CATEGORY.get(p.kind)
        if event is None or cat is None or p.details.get("release") or not p.start_event <= event <= p.end_event:
            continue
        take = min(int(p.bytes), rest.get(cat, 0))
        if take > 0:
            shapes[p.kind] = shapes.get(p.kind, 0) + take
            rest[cat] -= take
    at = step_at(report, event)
    return PeakBreakdown(bytes=int(total), event=int(event if event is not None else -1),
                         step=at.index if at else None, step_number=at.number if at else None,
                         phase=phase_at(report, event), by_category=cats, by_shape=shapes, rest_by_category=rest)
# ---- end of TEMPORARY -----------------------------------------------------------------------------


def phase_at(report: Report, event: int | None) -> str:
    """The phase of one event (``other`` outside every phase)."""
    if event is None:
        return "other"
    runs = report.label_runs()
    k = bisect.bisect_right([r[0] for r in runs], event) - 1
    return runs[k][2] if k >= 0 and runs[k][1] >= event else "other"


def shape_at(report: Report, event: int | None) -> str | None:
    """The shape whose own peak is at ``event`` (the most local one when several are)."""
    here = [p for p in report.patterns if p.peak_event == event]
    return min(here, key=lambda p: p.end_event - p.start_event).kind if here else None


def step_at(report: Report, event: int | None) -> Step | None:
    """The step holding ``event``, if one does."""
    for s in report.steps:
        if event is not None and s.start_event <= event <= s.end_event:
            return s
    return None
