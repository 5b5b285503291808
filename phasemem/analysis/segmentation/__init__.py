"""Split a trace into steps and phases: every event's phase code and step. ``segment`` is one line of
stages, each a module entered once (the stages: docs/design.md, "`analyze`, one line"); the same line
without the inference, for a step index, is ``step_index.segment_marked``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ...read.trace import Trace
from ...vocab import MARKER_PREFIX
from ..timeline import Lifetimes, lifetimes_of
from .inferred import find_doubts, infer_phases, lower_where_doubted
from .markers import Interval, find_marks
from .partial import cut_by_oom
from .steps_from_intervals import steps_from_intervals
from .steps_from_labels import steps_from_labels

__all__ = ["Segmentation", "segment", "step_at_time"]


@dataclass
class Segmentation:
    """Per-event phase codes and step numbers, plus the intervals that made them.

    ``step_of[i]`` is the position in ``steps`` of event i, or -1 for events after the last step.
    """

    labels: np.ndarray  # int8 codes into PHASES
    step_of: np.ndarray  # int32
    steps: list[tuple[int, int, bool]]  # (first event, stop event, complete)
    step_numbers: list[int]  # the training step each entry of ``steps`` is, counting from recording start
    step_t1: np.ndarray  # int64 µs: the time each step ends (its optimizer's END); max int64 when open-ended
    intervals: list[Interval]
    sources: dict[str, str]  # phase → where its boundaries came from
    confidence: dict[str, float] = None  # type: ignore[assignment]  # phase → how sure (1 for markers and annotations)
    # µs: moments up to here belong to steps the ring buffer lost (a phase that ran then is not reported)
    t_lost: int = int(np.iinfo(np.int64).min)
    inferred_by: str | None = None  # "frames" or "lifetimes" where phases were inferred, else None
    # positions in ``steps`` of whole steps that ran no update: a zero_grad discarded their gradients
    skipped: list[int] = field(default_factory=list)
    # why the inferred phases are less sure than CONFIDENCE says (``inferred.find_doubts``); each
    # lowered to DOUBTFUL
    doubts: list[str] = field(default_factory=list)


def segment(trace: Trace, prefix: str = MARKER_PREFIX, timeline=None) -> Segmentation:
    """Label every event with its phase and step; without forward/backward markers, infer them
    (from frames, else from lifetimes, which needs ``timeline``).

    Example:
        >>> seg = segment(Trace.from_snapshot(snap))
        >>> PHASES[seg.labels[100]], seg.step_of[100]
    """
    n = len(trace)

    @functools.cache
    def lifetimes() -> Lifetimes:  # which block each free frees: built only where a rule below asks
        return timeline.lifetimes if timeline is not None else lifetimes_of(trace)

    marks = find_marks(trace, prefix)
    labels, how, starts = marks.labels, None, None
    sources, confidence = marks.sources, {ph: 1.0 for ph in marks.sources}
    if not marks.marked and n:
        labels, how, starts = infer_phases(trace, timeline, labels, sources, confidence)
    if not marks.marked and n and not marks.optimizer:
        steps, numbers, ends = steps_from_labels(trace, labels, starts, lifetimes, inside=how == "frames")
        skipped: list[int] = []  # no optimizer range: none was skipped
    else:
        # only labels from markers or frames place a backward well enough to see an update inside it
        steps, numbers, ends, skipped = steps_from_intervals(trace, marks, labels, lifetimes,
                                                             inside=marks.marked or how == "frames")
    steps = cut_by_oom(trace, labels, steps)
    doubts = find_doubts(trace, timeline, labels, steps) if how == "lifetimes" else []
    lower_where_doubted(confidence, sources, doubts)
    step_of = np.full(n, -1, dtype=np.int32)
    for k, (a, b, _) in enumerate(steps):
        step_of[a:b] = k
    return Segmentation(labels, step_of, steps, [marks.first_step + k for k in numbers], np.array(ends, dtype=np.int64),
                        marks.intervals, sources, confidence, marks.t_lost,
                        how if how in ("frames", "lifetimes") else None, [k for k in skipped if steps[k][2]], doubts)


def step_at_time(seg: Segmentation, t: int) -> int:
    """The step a moment belongs to (-1 after the last step): what places a phase that made no event."""
    if t <= seg.t_lost:
        return -1
    k = int(np.searchsorted(seg.step_t1, t, "left"))
    return k if k < len(seg.steps) else -1
