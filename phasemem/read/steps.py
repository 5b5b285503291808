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
from typing import Callable

import numpy as np

from ..live import LiveMemory
from ..steps import StepsError, parse_steps
from ..trace import Markers, Trace
from ..vocab import MARKER_PREFIX


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


@dataclass
class Reading:
    """What a source holds. ``trace``: its events (None without allocation history: then ``live``
    is what was alive when it was taken, and ``live_events`` the entries of its device). ``prefix``:
    the marker prefix its phases are read with; ``meta``: phasemem's metadata of a snapshot without history. ``window``: (step index, first, last position)
    where only those steps were read (``whole`` reads the rest); ``steps``: the steps still to cut
    from a trace read whole. ``device(d)``: another device of the same source, read the same way."""

    trace: Trace | None
    prefix: str = MARKER_PREFIX
    live: LiveMemory | None = None
    live_events: int = 0
    window: tuple[StepIndex, int, int] | None = None
    whole: Callable[[], Trace] | None = None
    steps: str | int | None = None
    device: Callable[[int], "Reading"] | None = None
    #: the snapshot's ``phasemem`` metadata, where the trace does not carry it (no history)
    meta: dict | None = None
