"""Some steps of a trace, as a trace of their own whose numbers for those steps are the full one's.

``phasemem analyze big.npz --steps 100-102`` should not read 10 million events to report three
steps. A step index, built once from the whole trace (``phasemem convert`` stores it in the
columnar file), says where each step's events are. Only those events are read; allocations alive
when the first of them starts become allocations from before the trace, as a trace already treats
memory from before recording (frees without an alloc, blocks in ``segments``): an allocation made
earlier and freed inside the steps is a free without an alloc, one alive through them is a block
alive throughout. Markers are kept up to the end of the last step: steps before the first read one
then count as steps the trace lost, which numbers the steps as the full trace does.

So every event's memory, phase and step, and every step's and phase's numbers, equal the full
analysis's (``tests/test_scale.py``), with event indices counted from ``Trace.first_event``.
Slicing is refused (``StepIndex.exact`` is False, and the whole trace is analysed) when phases are
inferred rather than marked — inference reads the whole trace — or when the trace has frees whose
size differs from their alloc's, or allocs that reuse a live address (a lost free): there a free
seen without its alloc would count a different size than the full trace does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .segmentation import segment
from .steps import StepsError, parse_steps
from .timeline import Timeline, lifetimes_of, reserved_curve
from .trace import A, Markers, Trace

BIG = int(np.iinfo(np.int64).max)
_INFERRED = "phases are inferred from the whole trace (no forward/backward markers)"


@dataclass
class StepIndex:
    """Where each step of a trace lies, for one marker prefix, and what slicing needs besides events."""

    prefix: str
    exact: bool  # slices give the full analysis's numbers
    reason: str  # why not, when not
    n_events: int
    first: np.ndarray  # int64 per step: first event
    stop: np.ndarray  # int64 per step: one past its last event
    number: np.ndarray  # int64 per step: Step.number
    complete: np.ndarray  # bool per step
    t_end: np.ndarray  # int64 per step: µs its optimizer ended (BIG when it did not)
    reserved_end: np.ndarray  # int64 per step: bytes reserved after its last event
    # (k, 4) int64: alloc event (-1: from before the trace), free event (n_events: never), address
    # and size of every allocation alive across some step's start: the only ones a slice can begin
    # inside of.
    cross: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def positions(self, spec: str) -> tuple[int, int]:
        """The first and last position of the steps ``spec`` names ("3", "2-4", "2-", "-4"), by
        ``Step.number``; raises the StepsError the picture would for steps the trace lacks."""

        lo, hi = parse_steps(spec)
        num = self.number
        want = np.ones(len(num), dtype=bool)
        if lo is not None:
            want &= num >= lo
        if hi is not None:
            want &= num <= hi
        hit = np.flatnonzero(want)
        if not len(hit):
            asked = str(spec).strip()
            raise StepsError(f"steps={asked}: this report has steps {num[0]}..{num[-1]}" if len(num)
                             else f"steps={asked}: this report has no steps")
        return int(hit[0]), int(hit[-1])

    def bounds(self, k0: int, k1: int) -> tuple[int, int]:
        """Events [a, b) of the steps at positions k0..k1."""
        return int(self.first[k0]), int(self.stop[k1])


def can_slice(trace: Trace, prefix: str) -> bool:
    """Whether a step index could be exact: forward or backward markers are there, with event times
    to place them (without them phases are inferred from the whole trace)."""
    names = {prefix + "forward", prefix + "backward"}
    return bool(len(trace) and trace.time_us.any() and any(n in names for n in trace.markers.name))


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
    # Only the lifetimes and the reserved bytes: no per-event curves for a whole trace of which a
    # few steps are wanted (10M events: 1.45 -> 1.33 GiB peak for --steps from the pickle).
    life = timeline.lifetimes if timeline is not None else lifetimes_of(trace)
    reserved = timeline.reserved_after if timeline is not None else reserved_curve(trace)
    seg = segment(trace, prefix, timeline, lifetimes_given=life)
    steps = seg.steps
    first = np.array([a for a, _, _ in steps], dtype=np.int64)
    stop = np.array([b for _, b, _ in steps], dtype=np.int64)
    before = np.concatenate([[reserved[0] - _reserved_change(trace, 0)], reserved]) if n else np.zeros(1, np.int64)

    starts = np.unique(first)
    nxt = np.searchsorted(starts, life.alloc_event, "right")
    crossing = nxt < len(starts)
    crossing[crossing] = starts[nxt[crossing]] <= life.free_event[crossing]
    cross = np.stack([life.alloc_event, life.free_event, life.addr, life.size], axis=1)[crossing].astype(np.int64)

    reason = _why_not_exact(trace, seg, life, n)
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


def _why_not_exact(trace: Trace, seg, life, n: int) -> str:
    if not any(iv.source == "markers" and iv.phase in ("forward", "backward") for iv in seg.intervals):
        return _INFERRED
    if not any(iv.phase == "optimizer" for iv in seg.intervals):
        return "no optimizer markers or annotations to cut steps at"
    if not seg.steps:
        return "no steps"
    paired = life.paired
    alloc, free = life.alloc_event[paired], life.free_event[paired]
    if (trace.action[free] == A["alloc"]).any():
        return "some allocations reuse a live address (a free was lost)"
    if (trace.size[free] != trace.size[alloc]).any():
        return "some frees give a size other than their alloc's"
    return ""


def slice_trace(skeleton: Trace, index: StepIndex, k0: int, k1: int, columns: dict) -> Trace:
    """The trace of steps k0..k1 (positions in ``index``).

    ``skeleton`` gives what is not per event (stacks, frames, markers, meta; its event columns are
    not read), ``columns`` the six event columns of events [a, b) only.
    """
    a, b = index.bounds(k0, k1)
    cross = index.cross
    alive = cross[(cross[:, 0] < a) & (cross[:, 1] >= b)]
    m = skeleton.markers
    keep = int(np.searchsorted(m.time_us, index.t_end[k1], "right"))
    return Trace(
        device=skeleton.device,
        stacks=skeleton.stacks,
        frames=skeleton.frames,
        markers=Markers(name=m.name[:keep], start=m.start[:keep], time_us=m.time_us[:keep]),
        live_blocks=np.ascontiguousarray(alive[:, 2:4]),
        live_workspaces=skeleton.live_workspaces,
        oom_device_free={e - a: v for e, v in skeleton.oom_device_free.items() if a <= e < b},
        reserved_at_snapshot=int(index.reserved_end[k1]),
        n_devices=skeleton.n_devices,
        meta=dict(skeleton.meta),
        first_event=skeleton.first_event + a,
        **columns,
    )


def slice_in_memory(trace: Trace, index: StepIndex, k0: int, k1: int) -> Trace:
    a, b = index.bounds(k0, k1)
    cols = {name: getattr(trace, name)[a:b] for name in ("action", "addr", "size", "stream", "time_us", "stack")}
    return slice_trace(trace, index, k0, k1, cols)
