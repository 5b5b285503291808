"""Split a trace into steps and phases: every event's phase code and step.

The parts, in the order ``segment`` uses them:

- ``markers.py``: phase intervals from ``record_function`` markers (phasemem's and PyTorch's
  optimizer annotations), painted onto the events; the loss between a forward and its backward;
- ``inferred.py``: phases inferred (``infer/``) where no marker placed them, and how sure they are;
- ``steps_from_intervals.py``: steps that end where an optimizer range ends (or start at each forward);
- ``steps_from_labels.py``: steps cut between the inferred backward passes, where no range was marked;
- ``partial.py``: steps an out-of-memory error cut short, and an evaluation after the last step.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..timeline import Lifetimes, lifetimes_of
from ..trace import Trace
from ..vocab import MARKER_PREFIX
from .inferred import find_doubts, infer_phases, lower_where_doubted
from .markers import Interval, find_intervals, locate, loss_intervals, outermost, paint
from .partial import cut_by_oom
from .steps_from_intervals import skipped_steps, steps_from_intervals
from .steps_from_labels import steps_from_labels

__all__ = ["Segmentation", "segment", "step_at_time", "window_first"]


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
    confidence: dict[str, float] = None  # phase → how sure (1 for markers and annotations)
    # µs: moments up to here belong to steps the ring buffer lost (a phase that ran then is not reported)
    t_lost: int = int(np.iinfo(np.int64).min)
    inferred_by: str | None = None  # "frames" or "lifetimes" where phases were inferred, else None
    # positions in ``steps`` of whole steps that ran no update: a zero_grad discarded their gradients
    skipped: list[int] = field(default_factory=list)
    # why the inferred phases are less sure than CONFIDENCE says (``inferred.find_doubts``); each
    # lowered to DOUBTFUL
    doubts: list[str] = field(default_factory=list)


def segment(trace: Trace, prefix: str = MARKER_PREFIX, timeline=None, lifetimes_given=None) -> Segmentation:
    """Label every event with its phase and step; without forward/backward markers, infer them
    (from frames, else from lifetimes, which needs ``timeline``). ``lifetimes_given``: the trace's
    Lifetimes where there is no timeline (a step index reads only those).

    Example:
        >>> seg = segment(Trace.from_snapshot(snap))
        >>> PHASES[seg.labels[100]], seg.step_of[100]
    """
    t = trace.time_us
    n = len(trace)

    @functools.cache
    def lifetimes() -> Lifetimes:  # which block each free frees: built only where a rule below asks
        if timeline is not None:
            return timeline.lifetimes
        return lifetimes_given if lifetimes_given is not None else lifetimes_of(trace)

    intervals, sources = find_intervals(trace, prefix)
    locate(intervals, t)
    loss = loss_intervals(intervals, sources.get("forward", "markers"), t)
    if loss:
        sources["loss"] = loss[0].source
    intervals = intervals + loss
    labels = paint(intervals, n)

    confidence = {ph: 1.0 for ph in sources}
    marked = any(iv.source == "markers" and iv.phase in ("forward", "backward") for iv in intervals)
    how, starts = None, None
    if not marked and n:
        labels, how, starts = infer_phases(trace, timeline, labels, sources, confidence)
    if not marked and n and not any(iv.phase == "optimizer" for iv in intervals):
        steps, numbers, ends = steps_from_labels(trace, labels, starts, lifetimes, inside=how == "frames")
    else:
        # only labels from markers or frames place a backward well enough to see an update inside it
        steps, numbers, ends = steps_from_intervals(trace, intervals, labels, lifetimes,
                                                    inside=marked or how == "frames")
    steps = cut_by_oom(trace, labels, steps)
    doubts = find_doubts(trace, timeline, labels, steps) if how == "lifetimes" else []
    lower_where_doubted(confidence, sources, doubts)
    numbers = [window_first(trace.meta) + k for k in numbers]
    step_of = np.full(n, -1, dtype=np.int32)
    for k, (a, b, _) in enumerate(steps):
        step_of[a:b] = k
    lost = [iv.t1 for iv in outermost([iv for iv in intervals if iv.phase == "optimizer"]) if iv.stop == 0]
    return Segmentation(labels, step_of, steps, numbers, np.array(ends, dtype=np.int64), intervals, sources,
                        confidence, max(lost) if lost else int(np.iinfo(np.int64).min),
                        how if how in ("frames", "lifetimes") else None, skipped_steps(intervals, steps), doubts)


def step_at_time(seg: Segmentation, t: int) -> int:
    """The step a moment belongs to (-1 after the last step): what places a phase that made no event."""
    if t <= seg.t_lost:
        return -1
    k = int(np.searchsorted(seg.step_t1, t, "left"))
    return k if k < len(seg.steps) else -1


def window_first(meta: dict) -> int:
    """The training step a step window began at (``instrument(steps="10-12")``, the trainer
    callbacks: snapshot["phasemem"]["steps"]), so that its steps are numbered as the loop numbered
    them; 0 for a recording of the loop from its start."""
    steps = meta.get("steps") if isinstance(meta, dict) else None
    if isinstance(steps, (list, tuple)) and steps and isinstance(steps[0], int) and steps[0] > 0:
        return steps[0]
    return 0
