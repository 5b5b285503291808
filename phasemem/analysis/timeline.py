"""Memory over the trace: active bytes after every event, reserved bytes, and allocation lifetimes,
counted as memory_viz counts them (docs/trace.md, "Memory that existed before recording").
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..read.trace import A, Trace


@dataclass
class Lifetimes:
    """Every allocation's life: pre-existing ones first, then the trace's allocs in event order.

    ``alloc_event`` is -1 for an allocation alive before the trace began; ``free_event`` is
    ``len(trace)`` for one still alive at the end.
    """

    alloc_event: np.ndarray
    free_event: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    n_events: int  # len(trace): the free_event of what is still alive at the end

    def __len__(self) -> int:
        return len(self.size)

    @property
    def preexisting(self) -> np.ndarray:
        return self.alloc_event < 0

    @property
    def paired(self) -> np.ndarray:
        """Allocations the trace saw both made and freed."""
        return (self.alloc_event >= 0) & (self.free_event < self.n_events)

    def free_of(self, alloc_events: np.ndarray) -> np.ndarray:
        """The free event of each given alloc event (``len(trace)`` while still alive)."""
        k = int(self.preexisting.sum())
        pos = k + np.searchsorted(self.alloc_event[k:], alloc_events)
        return self.free_event[pos]


@dataclass
class Timeline:
    """Example:
        >>> tl = Timeline.from_trace(trace)
        >>> tl.active_after.max()   # peak allocated bytes
    """

    active_after: np.ndarray  # int64, bytes allocated after each event
    baseline: int  # bytes alive before the first event
    reserved_after: np.ndarray  # int64, bytes reserved from the driver after each event
    lifetimes: Lifetimes

    # Cached: measure, the patterns and the report all read these whole-trace arrays. Each is 80 MB
    # at 10M events, so none is made before something asks (the picture asks for delta, after the
    # what-if replays have freed theirs: the 10M analysis's peak).
    @cached_property
    def delta(self) -> np.ndarray:
        """int64, the change each event makes."""
        return np.diff(self.active_after, prepend=self.baseline)

    def change_at(self, events) -> np.ndarray:
        """The change the given events make (``delta[events]``, without the whole column)."""
        ev = np.asarray(events, dtype=np.int64)
        return self.active_after[ev] - self.active_before[ev]

    @cached_property
    def active_before(self) -> np.ndarray:
        out = np.empty_like(self.active_after)
        if len(out):
            out[0] = self.baseline
            out[1:] = self.active_after[:-1]
        return out

    @cached_property
    def level(self) -> np.ndarray:
        """The highest active bytes while each event ran: after an alloc, before a free."""
        return np.maximum(self.active_after, self.active_before)

    @cached_property
    def freed_at(self) -> np.ndarray:
        """Per event: the event that frees what it allocated (``len(trace)`` while still alive, and
        for events that allocate nothing)."""
        n = len(self.active_after)
        out = np.full(n, n, np.int64)
        made = self.lifetimes.alloc_event >= 0
        out[self.lifetimes.alloc_event[made]] = self.lifetimes.free_event[made]
        return out

    @classmethod
    def from_trace(cls, trace: Trace) -> "Timeline":
        n = len(trace)
        alloc_ev, free_ev, refree, orphan_ev = _pair(trace)
        delta = np.zeros(n, dtype=np.int64)
        delta[alloc_ev] = trace.size[alloc_ev]
        # A free returns what its alloc took (the two sizes agree in real traces; a corrupt one
        # must not make memory drift).
        matched = (free_ev < n) & ~refree
        delta[free_ev[matched]] = -trace.size[alloc_ev[matched]]
        delta[orphan_ev] = -trace.size[orphan_ev]
        # A lost free is charged at the re-alloc so memory does not creep upward forever.
        np.subtract.at(delta, free_ev[refree], trace.size[alloc_ev[refree]])

        lifetimes = _lifetimes(trace, alloc_ev, free_ev, orphan_ev)
        baseline = int(lifetimes.size[lifetimes.preexisting].sum())
        np.cumsum(delta, out=delta)
        delta += baseline  # now the bytes after each event
        return cls(active_after=delta, baseline=baseline, reserved_after=_reserved(trace), lifetimes=lifetimes)


def lifetimes_of(trace: Trace) -> Lifetimes:
    """The Lifetimes ``Timeline.from_trace(trace)`` holds, without the per-event curves (what a
    step index needs: ``phasemem.analysis.step_index``; three int64 columns fewer at the peak).

    Example:
        >>> lifetimes_of(trace).free_of(alloc_events)
    """
    alloc_ev, free_ev, _, orphan_ev = _pair(trace)
    return _lifetimes(trace, alloc_ev, free_ev, orphan_ev)


def _lifetimes(trace: Trace, alloc_ev, free_ev, orphan_ev) -> Lifetimes:
    n = len(trace)
    # Blocks of the snapshot's segments that no alloc of the trace made: alive all along.
    live_end = set(trace.addr[alloc_ev[free_ev == n]].tolist())
    blocks = trace.live_blocks
    keep = np.fromiter((a not in live_end for a in blocks[:, 0].tolist()), dtype=bool, count=len(blocks))
    pre_blocks = blocks[keep]
    return Lifetimes(
        alloc_event=np.concatenate([np.full(len(orphan_ev) + len(pre_blocks), -1, np.int64), alloc_ev]),
        free_event=np.concatenate([orphan_ev, np.full(len(pre_blocks), n, np.int64), free_ev]),
        addr=np.concatenate([trace.addr[orphan_ev], pre_blocks[:, 0], trace.addr[alloc_ev]]),
        size=np.concatenate([trace.size[orphan_ev], pre_blocks[:, 1], trace.size[alloc_ev]]),
        n_events=n,
    )


def reserved_curve(trace: Trace) -> np.ndarray:
    """Bytes reserved from the driver after each event (``Timeline.reserved_after``)."""
    return _reserved(trace)


def _pair(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each alloc with the next free at its address, in alloc order: (alloc events, free events
    (len(trace) while alive), lost frees, frees of blocks allocated before the trace)."""
    n = len(trace)
    act = trace.action
    is_alloc = act == A["alloc"]
    ev = np.flatnonzero(is_alloc | (act == A["free_completed"]) | (act == A["free"]))
    # Sort by (address, event index): an alloc followed by a free of the same address is one life.
    # ev is in event order, so a stable sort by address keeps it within an address; the temporaries
    # are dropped as soon as they are used (10M events: ~80 MB each).
    order = ev[np.argsort(trace.addr[ev], kind="stable")]
    del ev
    o_addr = trace.addr[order]
    same_next = np.zeros(len(order), dtype=bool)
    same_next[:-1] = o_addr[1:] == o_addr[:-1]
    del o_addr
    o_alloc = is_alloc[order]
    del is_alloc
    at = np.flatnonzero(o_alloc)  # positions of the allocs in ``order``
    after = np.minimum(at + 1, len(order) - 1)
    # alloc → its free (or, if the same address is allocated again first, that re-alloc: the
    # free was lost, and ending the life there keeps the totals honest).
    a_has_next = same_next[at]
    alloc_ev = order[at]
    free_ev = np.where(a_has_next, order[after], n)
    refree = a_has_next & o_alloc[after]  # lost free: no event to subtract at
    del at, after, a_has_next
    by_time = np.argsort(alloc_ev, kind="stable")
    # A free not preceded by an alloc of its address: allocated before the trace began.
    prev_is_alloc = np.zeros(len(order), dtype=bool)
    prev_is_alloc[1:] = o_alloc[:-1] & same_next[:-1]
    orphans = order[~o_alloc & ~prev_is_alloc]
    return alloc_ev[by_time], free_ev[by_time], refree[by_time], orphans


#: Per action code: +1 where the event reserves memory from the driver, -1 where it gives it back.
_RESERVING = np.zeros(len(A), np.int64)
_RESERVING[[A["segment_alloc"], A["segment_map"]]] = 1
_RESERVING[[A["segment_free"], A["segment_unmap"]]] = -1


def _reserved(trace: Trace) -> np.ndarray:
    sign = _RESERVING[trace.action]  # one gather, not four comparisons and two masks over every event
    at = np.flatnonzero(sign)  # segment events are few
    change = np.zeros(len(trace), dtype=np.int64)  # one column: each event's change, then their sum
    change[at] = sign[at] * trace.size[at]
    np.cumsum(change, out=change)
    # The snapshot's segments are the state at the end; walk back to the start.
    start = trace.reserved_at_snapshot - (int(change[-1]) if len(change) else 0)
    return np.maximum(start, 0) + change
