"""What is alive at a compared peak, by (shape, category), and where an event sits, for the comparison
and the budgets; only the compared step's shapes claim bytes, so two runs compare (docs/compare.md).

Example:
    >>> bd = peak_breakdown(report, report.steps[1])
    >>> sum(bd.by_shape.values()) + sum(bd.rest_by_category.values()) == bd.bytes
    True"""
from __future__ import annotations

import bisect

import numpy as np

from ..analysis.patterns import SHAPE_PRIORITY
from ..analysis.peak import alive_at, shape_codes
from ..errors import PhasememError
from ..model import PeakBreakdown, Step
from ..vocab import CATEGORIES
from .report import Report

#: bytes alive, per (shape kind or None for no shape, category)
Cells = dict[tuple[str | None, str], int]


def composition(report: Report, step: Step | None = None) -> tuple[int, Cells]:
    """The peak event of ``step`` (or of the whole recording) and what is alive there, per (shape,
    category); the cells sum to the peak.

    Example:
        >>> event, cells = composition(report, report.steps[1])
        >>> cells[("logits", "activation")]
    """
    an = report.analysis
    if an is None:
        raise PhasememError("this report holds no trace to decompose (a snapshot without allocation history)")
    event = report.peak_event if step is None else step.peak_event
    if event is None:  # a step that allocated and freed nothing: its level is where it ran
        assert step is not None  # the report's own peak is an event
        event = max(step.start_event, 0)
    patterns = report.patterns if step is None else [p for p in report.patterns if p.step == step.index]
    alive = alive_at(an, int(event))
    size = an.timeline.lifetimes.size[alive]
    key = (shape_codes(an, patterns)[alive] + 1) * len(CATEGORIES) + an.categories.codes[alive]
    # int64 sums, not bincount's float weights: a peak of many GiB stays exact to the byte
    order = np.argsort(key, kind="stable")
    keys, first = np.unique(key[order], return_index=True)
    sums = np.add.reduceat(size[order], first) if len(first) else np.zeros(0, np.int64)
    names = (None,) + SHAPE_PRIORITY
    cells = {(names[int(k) // len(CATEGORIES)], CATEGORIES[int(k) % len(CATEGORIES)]): int(v)
             for k, v in zip(keys.tolist(), sums.tolist())}
    return int(event), cells


def peak_breakdown(report: Report, step: Step | None = None) -> PeakBreakdown:
    """``composition`` as a ``PeakBreakdown`` (the compared step's shapes only).

    Example:
        >>> peak_breakdown(report, report.steps[1]).by_category["activation"]
    """
    event, cells = composition(report, step)
    by_cat = {c: 0 for c in CATEGORIES}
    by_shape: dict[str, int] = {}
    rest: dict[str, int] = {}
    for (shape, cat), v in cells.items():
        by_cat[cat] += v
        if shape is None:
            rest[cat] = rest.get(cat, 0) + v
        else:
            by_shape[shape] = by_shape.get(shape, 0) + v
    at = step_at(report, event)
    return PeakBreakdown(bytes=sum(cells.values()), event=event, step=at.index if at else None,
                         step_number=at.number if at else None, phase=phase_at(report, event),
                         by_category=by_cat, by_shape=by_shape, rest_by_category=rest)


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
