"""The step index of a whole trace (``phasemem.read.columnar.StepIndex``), built from the steps its
marks give (``segment_marked``: ``segment`` without the inference), and the cut of the steps ``--steps`` asks for by it
(``cut``: the one place a trace is sliced). Where it is built, and why only from marks:
docs/performance.md.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable

import numpy as np

from ..read import Reading
from ..read.columnar import EVENTS, StepIndex
from ..read.trace import A, Markers, Trace
from ..steps import StepsError, parse_steps
from .segmentation import Segmentation
from .segmentation.markers import find_marks
from .segmentation.partial import cut_by_oom
from .segmentation.steps_from_intervals import steps_from_intervals
from .timeline import Lifetimes, Timeline, lifetimes_of, reserved_curve

_INFERRED = "phases are inferred from the whole trace (no forward/backward markers)"


def cut(got: Reading) -> Reading:
    """``got`` with the steps it asks for (``got.steps``) cut from its trace: the one place a trace is
    sliced, for every source, by the source's own step index else by one built from the trace (which, and
    why a slice's numbers are the full analysis's: docs/performance.md, ``phasemem.read.columnar``).

    Example:
        >>> cut(read("snapshot.pickle", steps="2-3")).window[1:]
    """
    trace, prefix, steps, index = got.trace, got.prefix, got.steps, got.index
    if steps is None or trace is None or (index is None and not can_slice(trace, prefix)):
        return got
    index = index if index is not None else build_index(trace, prefix)
    whole = got.whole or (lambda: trace)
    # the positions of the steps asked for, by Step.number: none raises what the picture would
    lo, hi = parse_steps(steps)
    num = index.number
    want = np.ones(len(num), dtype=bool)
    if lo is not None:
        want &= num >= lo
    if hi is not None:
        want &= num <= hi
    hit = np.flatnonzero(want)
    if not len(hit):
        asked = str(steps).strip()
        raise StepsError(f"steps={asked}: this report has steps {num[0]}..{num[-1]}" if len(num)
                         else f"steps={asked}: this report has no steps")
    k0, k1 = int(hit[0]), int(hit[-1])
    a, b = int(index.first[k0]), int(index.stop[k1])
    if not (index.exact and b > a):
        return replace(got, trace=whole(), steps=None, index=None)
    # events [a, b) of the trace: a copy where the columns are mapped from a file (read-only)
    columns = {name: np.require(getattr(trace, name)[a:b], requirements=["A", "W"]) for name in EVENTS}
    alive = index.cross[(index.cross[:, 0] < a) & (index.cross[:, 1] >= b)]
    m = trace.markers
    keep = int(np.searchsorted(m.time_us, index.t_end[k1], "right"))
    # other devices and torch's own labels are said of the whole snapshot, not of these steps
    part = replace(trace, **columns,
                   markers=Markers(name=m.name[:keep], start=m.start[:keep], time_us=m.time_us[:keep]),
                   live_blocks=np.ascontiguousarray(alive[:, 2:4]), reserved_at_snapshot=int(index.reserved_end[k1]),
                   oom_device_free={e - a: v for e, v in trace.oom_device_free.items() if a <= e < b},
                   meta=dict(trace.meta), first_event=trace.first_event + a, other_devices=[], torch_labels=None,
                   segments=None, segment_blocks=None)  # the snapshot's layout is of the whole trace's end
    return replace(got, trace=part, window=(index, k0, k1), whole=whole, steps=None, index=None)


def can_slice(trace: Trace, prefix: str) -> bool:
    """Whether a step index could be exact: a forward or backward marker starts somewhere (its
    phase is then marked, not inferred), with event times to place it."""
    names = {prefix + "forward", prefix + "backward"}
    m = trace.markers
    return bool(len(trace) and trace.time_us.any() and any(s and n in names for n, s in zip(m.name, m.start.tolist())))


def build_index(trace: Trace, prefix: str, timeline: Timeline | None = None) -> StepIndex:
    """The step index of a whole trace, with the steps ``analyze_trace`` would find.

    Example:
        >>> index = build_index(trace, "phasemem::")
        >>> index.number, index.first
    """
    n = len(trace)
    if not can_slice(trace, prefix):
        # not worth segmenting (inference can take a while): slices would not be exact anyway
        z = np.zeros(0, np.int64)
        return StepIndex(prefix=prefix, exact=False, reason=_INFERRED, n_events=n, first=z, stop=z, number=z,
                         complete=z.astype(bool), t_end=z, reserved_end=z, cross=np.zeros((0, 4), np.int64))
    change0 = _reserved_change(trace, 0)
    # Only the lifetimes and the reserved bytes: no per-event curves for a whole trace of which a
    # few steps are wanted (10M events: 1.45 -> 1.33 GiB peak for --steps from the pickle).
    # the steps first, from the marks; the lifetimes are built where a rule asks, as ``segment`` builds them
    lifetimes = (lambda: timeline.lifetimes) if timeline is not None else functools.cache(
        functools.partial(lifetimes_of, trace))
    seg = segment_marked(trace, prefix, lifetimes)
    life = lifetimes()
    reserved = timeline.reserved_after if timeline is not None else reserved_curve(trace)
    # a free seen without its alloc would count another size than the whole trace does
    paired = life.paired
    alloc, free = life.alloc_event[paired], life.free_event[paired]
    unsound = ("some allocations reuse a live address (a free was lost)" if (trace.action[free] == A["alloc"]).any()
               else "some frees give a size other than their alloc's" if (trace.size[free] != trace.size[alloc]).any()
               else "")
    steps = seg.steps
    first = np.array([a for a, _, _ in steps], dtype=np.int64)
    stop = np.array([b for _, b, _ in steps], dtype=np.int64)
    before = np.concatenate([[reserved[0] - change0], reserved])

    starts = np.unique(first)
    nxt = np.searchsorted(starts, life.alloc_event, "right")
    crossing = nxt < len(starts)
    crossing[crossing] = starts[nxt[crossing]] <= life.free_event[crossing]
    cross = np.stack([life.alloc_event, life.free_event, life.addr, life.size], axis=1)[crossing].astype(np.int64)

    reason = ("no optimizer markers or annotations to cut steps at" if not any(iv.phase == "optimizer" for iv in seg.intervals)
              else "no steps" if not steps else unsound)
    return StepIndex(
        prefix=prefix, exact=not reason, reason=reason, n_events=n, first=first, stop=stop,
        number=np.array(seg.step_numbers, dtype=np.int64), complete=np.array([c for _, _, c in steps], dtype=bool),
        t_end=np.asarray(seg.step_t1, dtype=np.int64), reserved_end=before[stop].astype(np.int64), cross=cross,
    )


def segment_marked(trace: Trace, prefix: str, lifetimes: Callable[[], Lifetimes]) -> Segmentation:
    """``segment`` of a trace whose forward or backward markers are there, from its marks alone
    (nothing is inferred there), with the trace's lifetimes built where a rule asks, as ``segment``
    builds them: what a step index is built from. tests/reading/test_scale.py checks that it is
    ``segment``'s answer.

    Example:
        >>> seg = segment_marked(trace, "phasemem::", lambda: lifetimes_of(trace))
    """
    marks = find_marks(trace, prefix)
    steps, numbers, ends, skipped = steps_from_intervals(trace, marks, marks.labels, lifetimes, inside=marks.marked)
    steps = cut_by_oom(trace, marks.labels, steps)
    step_of = np.full(len(trace), -1, dtype=np.int32)
    for k, (a, b, _) in enumerate(steps):
        step_of[a:b] = k
    return Segmentation(marks.labels, step_of, steps, [marks.first_step + k for k in numbers],
                        np.array(ends, dtype=np.int64), marks.intervals, marks.sources,
                        {ph: 1.0 for ph in marks.sources}, marks.t_lost, None, [k for k in skipped if steps[k][2]], [])


def _reserved_change(trace: Trace, i: int) -> int:
    act = int(trace.action[i])
    if act in (A["segment_alloc"], A["segment_map"]):
        return int(trace.size[i])
    if act in (A["segment_free"], A["segment_unmap"]):
        return -int(trace.size[i])
    return 0
