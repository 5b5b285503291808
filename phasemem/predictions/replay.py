"""The memory curve summed again after blocks are dropped, resized, re-timed or added: what the
what-ifs predict with. A replay keeps only what the report reads of its curve (the peak, each
phase run's peak, the level at each OOM), not the curve: seven remedies on a 10M-event trace held
400 MB of curves."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: A change touching fewer than this share of the blocks is replayed as the base curve plus a step
#: function of its touched blocks (sorting only them); more, by summing every block again.
SPARSE_SHARE = 0.125
#: Blocks placed at a time: their index columns are the only temporaries (8 MB), not one per block.
PIECE = 1 << 20


def points(n: int, alloc: np.ndarray, free: np.ndarray, size: np.ndarray, added: tuple = ()) -> np.ndarray:
    """Bytes alive at the n + 1 points between events (point k: just before event k) of blocks
    alive from alloc (-1: before the trace) to free (n: to the end), and of the blocks ``added``
    (alloc events, free events, sizes)."""
    # One int64 column, summed in place (80 MB at 10M events): ufunc.at is fast since numpy 1.25
    # (0.09 s against bincount's 0.5 s for 5M blocks at 10M events), and bincount's float64
    # columns and their int64 copy were three of these at once, the analysis's peak.
    d = np.zeros(n + 2, np.int64)
    _place(d, alloc, free, size)
    if added:
        _place(d, *added)
    np.cumsum(d, out=d)
    return d[:n + 1]


def _place(d: np.ndarray, alloc: np.ndarray, free: np.ndarray, size: np.ndarray, sign: int = 1) -> None:
    """Blocks' sizes added (``sign`` -1: taken out) to ``d`` at the point after their alloc and
    out at the point after their free, PIECE blocks at a time (no column of indices of every block)."""
    for a in range(0, len(size), PIECE):
        z = slice(a, a + PIECE)
        w = size[z] if sign > 0 else -size[z]
        np.add.at(d, alloc[z] + 1, w)
        np.subtract.at(d, free[z] + 1, w)


def replay(n: int, alloc: np.ndarray, free: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The memory level at each of ``n`` events, counted after an alloc and before a free as
    ``Timeline.level`` is (without a change it equals it exactly).

        >>> life = report.analysis.timeline.lifetimes
        >>> replay(report.n_events, life.alloc_event, life.free_event, life.size).max() == report.peak_bytes
        True
    """
    pts = points(n, alloc, free, size)
    return np.maximum(pts[:-1], pts[1:])


def changed_points(base, alloc: np.ndarray, free: np.ndarray, size: np.ndarray,
                   new_free: np.ndarray, new_size: np.ndarray, added: tuple = ()) -> np.ndarray:
    """The points (see ``points``) once blocks (alloc, free, size) take ``new_free``/``new_size`` and
    the blocks ``added`` (alloc events, free events, sizes) join them. ``base``: ``points`` of the
    unchanged blocks, or the pair (bytes before the first event, bytes after each event) that they
    equal (a Timeline's ``baseline`` and ``active_after``: no copy kept); not modified. The level
    is ``np.maximum(pts[:-1], pts[1:])``."""
    n = len(base) - 1 if isinstance(base, np.ndarray) else len(base[1])
    touched = (new_size != size) | (new_free != free)
    if np.count_nonzero(touched) > SPARSE_SHARE * len(size):  # summed again whole
        return points(n, alloc, new_free, new_size, added)
    t = np.flatnonzero(touched)
    del touched
    # each touched block: its original taken out, its changed self put in; then the base added
    d = np.zeros(n + 2, np.int64)
    _place(d, alloc[t], free[t], size[t], -1)
    _place(d, alloc[t], new_free[t], new_size[t])
    if added:
        _place(d, *added)
    np.cumsum(d, out=d)
    pts = d[:n + 1]
    if isinstance(base, np.ndarray):
        pts += base
    else:
        pts[0] += base[0]
        pts[1:] += base[1]
    return pts


@dataclass(frozen=True)
class Replayed:
    """What the report reads of a replayed curve."""

    explanation: str
    assumptions: list[str]
    peak_event: int
    peak_bytes: int
    run_peaks: np.ndarray  # the level's maximum over each phase run (Context.run_first)
    at_events: dict[int, tuple[int, int]] = field(default_factory=dict)  # event: (highest up to it, level at it)

    @classmethod
    def of(cls, level: np.ndarray, run_first: np.ndarray, events, explanation: str, assumptions: list[str]):
        peak = int(np.argmax(level))
        return cls(explanation, list(assumptions), peak, int(level[peak]),
                   np.maximum.reduceat(level, run_first) if len(run_first) else np.zeros(0, np.int64),
                   {int(e): (int(level[:e + 1].max()), int(level[e])) for e in events})

    @classmethod
    def of_points(cls, pts: np.ndarray, run_first: np.ndarray, events, explanation: str, assumptions: list[str]):
        """``of`` the level ``np.maximum(pts[:-1], pts[1:])`` without making it (80 MB at 10M events):
        event i's level is the larger of the points around it."""
        n = len(pts) - 1
        if n <= 0:
            return cls.of(np.maximum(pts[:-1], pts[1:]), run_first, events, explanation, assumptions)
        top = int(np.argmax(pts))  # the first point at the highest level; the first event touching it
        peak = max(top - 1, 0)
        if len(run_first):
            ends = np.append(run_first[1:], n)  # each run's events [r_k, r_k+1) touch points up to r_k+1
            runs = np.maximum(np.maximum.reduceat(pts[:n], run_first), pts[ends])
        else:
            runs = np.zeros(0, np.int64)
        return cls(explanation, list(assumptions), peak, int(pts[top]), runs,
                   {int(e): (int(pts[:e + 2].max()), int(max(pts[e], pts[e + 1]))) for e in events})

    def need(self, event: int, request: int) -> int:
        """The most memory needed up to ``event`` once it also asks for ``request`` bytes."""
        highest, at = self.at_events[event]
        return max(highest, at + int(request))
