"""Phase intervals from ``record_function`` markers (phasemem's own, PyTorch's optimizer annotations)
and from ``_set_memory_metadata`` labels, painted onto the events outer before inner, so nested phases
resolve to the innermost. ``find_marks``, ``segment``'s first stage, finds once all the later stages
read of the marks (docs/design.md, "Markers").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ...read.torch_labels import phase_runs
from ...read.trace import A, Trace
from ...vocab import MARKED, MARKER_PREFIX, P

_TORCH_ANNOTATIONS = {
    "optimizer": re.compile(r"^Optimizer\.step#"),
    "zero_grad": re.compile(r"^Optimizer\.zero_grad#"),
}


@dataclass
class Interval:
    phase: str
    t0: int  # µs, START
    t1: int  # µs, END
    source: str  # "markers", "metadata" or "annotations"
    first: int = 0  # first event index inside (searchsorted)
    stop: int = 0  # one past the last event index inside


@dataclass
class Marks:
    """What the marks say about a trace: every interval (the loss between a forward and its backward
    included), where each phase's boundaries came from, the events painted with them, and the
    outermost optimizer and forward ranges (a wrapper optimizer calling an inner one is one range)."""

    intervals: list[Interval]
    sources: dict[str, str]  # phase → "markers", "metadata" or "annotations"
    labels: np.ndarray  # int8 phase codes; 'other' where no interval lies
    marked: bool  # phasemem's markers or the program's labels place forward or backward: nothing is inferred
    optimizer: list[Interval]  # outermost optimizer ranges, in time order
    forward: list[Interval]  # outermost forward ranges, in time order
    t_lost: int  # µs: the end of the last optimizer range before the first event (steps the ring buffer lost)
    first_step: int = 0  # the training step the recording's first step is (``window_first``)


def find_marks(trace: Trace, prefix: str = MARKER_PREFIX) -> Marks:
    """The marks of a trace, located on its events.

    Example:
        >>> marks = find_marks(trace, "phasemem::")
        >>> marks.marked, [iv.stop for iv in marks.optimizer]
    """
    t = trace.time_us
    intervals, sources = find_intervals(trace, prefix)
    locate([iv for iv in intervals if iv.source != "metadata"], t)  # labels are located by entry already
    loss = loss_intervals(intervals, sources.get("forward", "markers"), t)
    labels = paint(intervals + loss, len(trace))
    computed = _computing(loss, labels, trace.action == A["alloc"])
    if len(computed) < len(loss):  # a gap that only released what forward returned is no loss
        loss = computed
        labels = paint(intervals + loss, len(trace))
    if loss:
        sources["loss"] = loss[0].source
    intervals = intervals + loss
    opt = outermost([iv for iv in intervals if iv.phase == "optimizer"])
    lost = [iv.t1 for iv in opt if iv.stop == 0]
    return Marks(intervals, sources, labels,
                 any(iv.source in ("markers", "metadata") and iv.phase in ("forward", "backward") for iv in intervals),
                 opt, outermost([iv for iv in intervals if iv.phase == "forward"]),
                 max(lost) if lost else int(np.iinfo(np.int64).min), window_first(trace.meta))


def window_first(meta: dict) -> int:
    """The training step a step window began at (``instrument(steps="10-12")``, the trainer
    callbacks: snapshot["phasemem"]["steps"]), so that its steps are numbered as the loop numbered
    them; 0 for a recording of the loop from its start."""
    steps = meta.get("steps") if isinstance(meta, dict) else None
    if isinstance(steps, (list, tuple)) and steps and isinstance(steps[0], int) and steps[0] > 0:
        return steps[0]
    return 0


def _pair(markers, wanted) -> list[tuple[str, int, int]]:
    """Match START/END per name with a stack; an unmatched START runs to the end of the trace.
    ``wanted`` is asked once per distinct name (a few dozen), not per marker (30,000 at 1M events)."""
    phase_of = {name: wanted(name) for name in dict.fromkeys(markers.name)}
    open_: dict[str, list[int]] = {}
    out = []
    for name, is_start, t in zip(markers.name, markers.start.tolist(), markers.time_us.tolist()):
        phase = phase_of[name]
        if phase is None:
            continue
        if is_start:
            open_.setdefault(name, []).append(t)
        elif open_.get(name):
            out.append((phase, open_[name].pop(), t))
    big = np.iinfo(np.int64).max
    out += [(phase_of[name], t, big) for name, ts in open_.items() for t in ts]
    return out


def find_intervals(trace: Trace, prefix: str = MARKER_PREFIX) -> tuple[list[Interval], dict[str, str]]:
    """Phase intervals from phasemem's markers, falling back to PyTorch's optimizer annotations.

    Example:
        >>> intervals, sources = find_intervals(trace)
        >>> sources.get("optimizer")  # "markers", "annotations" or None
    """
    ours = set(MARKED)

    def ours_of(name: str):
        if name.startswith(prefix):
            ph = name[len(prefix):]
            return ph if ph in ours else None
        return None

    def torch_of(name: str):
        for ph, pat in _TORCH_ANNOTATIONS.items():
            if pat.match(name):
                return ph
        return None

    found = [Interval(ph, t0, t1, "markers") for ph, t0, t1 in _pair(trace.markers, ours_of)]
    have = {iv.phase for iv in found}
    sources = {ph: "markers" for ph in have}
    # PyTorch's own ranges count beside ours: instrument() leaves a torch.optim optimizer's step and
    # zero_grad to them, while still marking model.zero_grad(); one nested in ours is the same call.
    torch_ranges = [Interval(ph, t0, t1, "annotations") for ph, t0, t1 in _pair(trace.markers, torch_of)]
    # the program's labels, for the phases our markers do not place
    labelled = [iv for iv in metadata_intervals(trace, torch_ranges) if iv.phase not in have]
    for iv in labelled + torch_ranges:
        sources.setdefault(iv.phase, iv.source)
    return found + labelled + torch_ranges, sources


def metadata_intervals(trace: Trace, torch_ranges: list[Interval]) -> list[Interval]:
    """Intervals of the runs of entries whose ``user_metadata`` names a phase (``torch_labels.phase_runs``),
    located by entry, not by time (entries share microseconds). One that overlaps a PyTorch range of
    its phase is widened to hold it: the two are one call (``optimizer`` set before ``opt.step()``),
    and ``outermost`` then keeps one range per step."""
    runs = phase_runs(trace.torch_labels)
    if not runs:
        return []
    t = trace.time_us
    phase = np.array([P[ph] for ph, _, _ in runs])
    first = np.array([a for _, a, _ in runs], dtype=np.int64)
    stop = np.array([z for _, _, z in runs], dtype=np.int64) + 1
    t0, t1 = t[first], t[stop - 1]
    for ph in {ph for ph, _, _ in runs}:
        rs = outermost([r for r in torch_ranges if r.phase == ph])  # disjoint, in time order
        if not rs:
            continue
        mine = np.flatnonzero(phase == P[ph])
        r0 = np.array([r.t0 for r in rs], dtype=np.int64)
        r1 = np.array([r.t1 for r in rs], dtype=np.int64)
        # the ranges that overlap each interval: [k0, k1)
        k0, k1 = np.searchsorted(r1, t0[mine], "left"), np.searchsorted(r0, t1[mine], "right")
        hit = mine[k1 > k0]
        k0, k1 = k0[k1 > k0], k1[k1 > k0]
        t0[hit], t1[hit] = np.minimum(t0[hit], r0[k0]), np.maximum(t1[hit], r1[k1 - 1])
        first[hit] = np.minimum(first[hit], np.searchsorted(t, t0[hit], "left"))
        stop[hit] = np.maximum(stop[hit], np.searchsorted(t, t1[hit], "right"))
    out = [Interval(ph, a, b, "metadata", f, z) for (ph, _, _), a, b, f, z in
           zip(runs, t0.tolist(), t1.tolist(), first.tolist(), stop.tolist())]
    return out


def locate(intervals: list[Interval], t: np.ndarray) -> None:
    """Set each interval's first and stop event: the events at START <= time <= END (two searches
    for all of them: 15,000 intervals at 1M events)."""
    first, stop = _search(t, [iv.t0 for iv in intervals], "left"), _search(t, [iv.t1 for iv in intervals], "right")
    for iv, a, b in zip(intervals, first, stop):
        iv.first, iv.stop = a, b


def _search(t: np.ndarray, times: list[int], side: Literal["left", "right"]) -> list[int]:
    """``np.searchsorted(t, time, side)`` of each time, as ints."""
    return np.searchsorted(t, np.array(times, dtype=np.int64), side).tolist()


def loss_intervals(intervals: list[Interval], source: str, t: np.ndarray) -> list[Interval]:
    """The loss: events after the model's forward ends and before the next backward begins (the
    forward that ended last before it, where it ended after every earlier backward)."""
    fwd_ends = np.sort(np.array([iv.t1 for iv in intervals if iv.phase == "forward"], dtype=np.int64))
    bwd = sorted((iv for iv in intervals if iv.phase == "backward"), key=lambda i: i.t0)
    if not len(fwd_ends) or not bwd:
        return []
    b_t0 = np.array([b.t0 for b in bwd], dtype=np.int64)
    prev_bwd_end = np.maximum.accumulate(np.array([np.iinfo(np.int64).min] + [b.t1 for b in bwd[:-1]], dtype=np.int64))
    k = np.searchsorted(fwd_ends, b_t0, "left") - 1
    at = fwd_ends[np.maximum(k, 0)]
    keep = np.flatnonzero((k >= 0) & (at > prev_bwd_end))
    loss = [Interval("loss", t0, bwd[j].t0, source) for j, t0 in zip(keep.tolist(), at[keep].tolist())]
    # open at both ends: the forward's last event and the backward's first are not the loss
    first, stop = _search(t, [iv.t0 for iv in loss], "right"), _search(t, [iv.t1 for iv in loss], "left")
    for iv, a, b in zip(loss, first, stop):
        iv.first, iv.stop = a, b
    return loss


def _computing(loss: list[Interval], labels: np.ndarray, is_alloc: np.ndarray) -> list[Interval]:
    """The loss intervals that allocate. A loss computed inside forward (``model(x, labels=y).loss``)
    leaves a gap between forward and backward that holds only frees: no phase; its events stay what
    encloses them (``other``; the traces: docs/accuracy.md)."""
    if not loss:
        return loss
    own = np.concatenate([[0], np.cumsum((labels == P["loss"]) & is_alloc)])
    return [iv for iv in loss if own[iv.stop] > own[iv.first]]


def paint(intervals: list[Interval], n: int) -> np.ndarray:
    """Phase codes of n events from located intervals; nested ones win (painted after their outer)."""
    labels = np.zeros(n, dtype=np.int8)
    for iv in sorted(intervals, key=lambda i: (i.t0, -i.t1)):
        labels[iv.first:iv.stop] = P[iv.phase]
    return labels


def outermost(ivs: list[Interval]) -> list[Interval]:
    """Drop intervals nested in another of the same list (a wrapper optimizer calling an inner one)."""
    out: list[Interval] = []
    for iv in sorted(ivs, key=lambda i: (i.t0, -i.t1)):
        if out and iv.t1 <= out[-1].t1:
            continue
        out.append(iv)
    return out
