"""The step index of a whole trace (``phasemem.read.columnar.StepIndex``), from the steps its marks
give: built by ``phasemem convert`` into the columnar file, and by ``analyze --steps`` for a
snapshot read whole. It is exact (slices give the full analysis's numbers) only where phases are
marked; ``phasemem.read.columnar`` says why. Inference reads the whole trace, so an index is only
ever built from the marks (``segmentation.segment_marked``), never from a whole segmentation.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .read import Reading
from .read.columnar import StepIndex, slice_in_memory
from .segmentation import segment_marked
from .timeline import Timeline, lifetimes_of, reserved_curve
from .trace import A, Trace

_INFERRED = "phases are inferred from the whole trace (no forward/backward markers)"


def cut(got: Reading) -> Reading:
    """``got`` with the steps it asks for (``got.steps``) cut from its whole trace where a step index
    of it is exact; with ``steps`` left set where its steps are not marked (the caller says so).

    Example:
        >>> cut(read("snapshot.pickle", steps="2-3")).window[1:]
    """
    trace, prefix, steps = got.trace, got.prefix, got.steps
    if steps is None or trace is None or not can_slice(trace, prefix):
        return got
    index = build_index(trace, prefix)
    k0, k1 = index.positions(steps)
    a, b = index.bounds(k0, k1)
    if not (index.exact and b > a):
        return replace(got, steps=None)
    return replace(got, trace=slice_in_memory(trace, index, k0, k1), window=(index, k0, k1), whole=lambda: trace,
                   steps=None)


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
    life = timeline.lifetimes if timeline is not None else lifetimes_of(trace)
    reserved = timeline.reserved_after if timeline is not None else reserved_curve(trace)
    # a free seen without its alloc would count another size than the whole trace does
    paired = life.paired
    alloc, free = life.alloc_event[paired], life.free_event[paired]
    unsound = ("some allocations reuse a live address (a free was lost)" if (trace.action[free] == A["alloc"]).any()
               else "some frees give a size other than their alloc's" if (trace.size[free] != trace.size[alloc]).any()
               else "")
    seg = segment_marked(trace, prefix, life)
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


def _reserved_change(trace: Trace, i: int) -> int:
    act = int(trace.action[i])
    if act in (A["segment_alloc"], A["segment_map"]):
        return int(trace.size[i])
    if act in (A["segment_free"], A["segment_unmap"]):
        return -int(trace.size[i])
    return 0
