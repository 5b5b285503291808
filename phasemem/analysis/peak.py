"""What is alive at a moment, by category and by shape, summing exactly to the memory there.

Categories (vocab.CATEGORIES) cover every byte; shapes (the patterns' member allocations) refine
them: a byte of the logits block is an activation and also ``logits``. Each allocation counts for one
shape at most, the first of SHAPE_PRIORITY it belongs to (each kind's ``priority``, declared beside its
detector), so the shapes never count a byte twice.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from ..model import Pattern, PeakBreakdown, Step
from ..vocab import CATEGORIES, PHASES
from .core import Analysis
from .patterns import SHAPE_PRIORITY


def shape_codes(an: Analysis, patterns: list[Pattern]) -> np.ndarray:
    """Per allocation in Lifetimes order (pre-existing first): its shape's index in SHAPE_PRIORITY, -1 for none."""
    n_pre = int(an.timeline.lifetimes.preexisting.sum())
    codes = np.full(len(an.timeline.lifetimes), -1, np.int64)
    members: dict[str, list] = {}  # one pass over the patterns (130,000 at 10M events), not one per kind
    for p in patterns:
        if p.members:
            members.setdefault(p.kind, []).append(p.members)
    for k in range(len(SHAPE_PRIORITY) - 1, -1, -1):  # the first in priority is written last and wins
        if SHAPE_PRIORITY[k] in members:
            codes[n_pre + np.fromiter(chain.from_iterable(members[SHAPE_PRIORITY[k]]), np.int64)] = k
    return codes


def alive_at(an: Analysis, event: int) -> np.ndarray:
    """Which allocations (Lifetimes order) hold memory at the level ``event`` reaches: after an
    alloc, before a free (as ``Timeline.level`` counts it)."""
    life = an.timeline.lifetimes
    q = event if an.timeline.active_after[event] < an.timeline.active_before[event] else event + 1
    return (life.alloc_event < q) & (life.free_event >= q)


def breakdown(an: Analysis, patterns: list[Pattern], steps: list[Step], event: int) -> PeakBreakdown:
    """The memory at ``event``, by category and by shape.

    Example:
        >>> b = breakdown(report.analysis, report.patterns, report.steps, report.peak_event)
        >>> sum(b.by_category.values()) == report.peak_bytes
        True
    """
    alive = alive_at(an, event)
    size = an.timeline.lifetimes.size
    cat = an.categories.codes
    shape = shape_codes(an, patterns)
    by_cat = np.bincount(cat[alive], weights=size[alive], minlength=len(CATEGORIES)).astype(np.int64)
    free_of_shape = alive & (shape < 0)
    rest = np.bincount(cat[free_of_shape], weights=size[free_of_shape], minlength=len(CATEGORIES)).astype(np.int64)
    in_shape = alive & (shape >= 0)
    per_shape = np.bincount(shape[in_shape], weights=size[in_shape], minlength=len(SHAPE_PRIORITY)).astype(np.int64)
    s = int(an.step_of[event])
    return PeakBreakdown(
        bytes=int(an.timeline.level[event]), event=int(event), step=s if s >= 0 else None,
        step_number=steps[s].number if s >= 0 else None, phase=PHASES[int(an.labels[event])],
        by_category=dict(zip(CATEGORIES, by_cat.tolist())),
        by_shape={k: v for k, v in zip(SHAPE_PRIORITY, per_shape.tolist()) if v},
        rest_by_category={k: v for k, v in zip(CATEGORIES, rest.tolist()) if v},
    )
