"""The trace's blocks (with changes) replayed through the caching allocator at a factor, under the
budget as the cap, and the walk over factors that finds where it runs out."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...read.trace import A
from ...units import format_bytes
from ..allocator import over_events
from ..allocator.layout import block_streams, empty_cache_events, layout_at, outside_segments
from ..allocator.over_events import Replay
from ..allocator.rules import Settings
from ..blocks import Change, Facts
from ..scaling import LINEAR, QUADRATIC
from .answer import FACTOR_GRID
from .bounds import _blocks

#: Traces of at most this many events are replayed whole through the allocator, from their first
#: state; longer ones from the step before the peak's to the end of the peak's step (a 1M-event
#: trace's window is a few thousand events: docs/accuracy.md, allocator).
WHOLE_TRACE_EVENTS = 200_000
#: The bisection stops when the largest factor is known to this share of itself (a batch of 400 to
#: one sample; each step is one replay).
FACTOR_PRECISION = 0.0025
#: The walk up to the first factor that runs out: each step multiplies the factor by 1 + half the room
#: the reserved bytes leave under the budget, at least the first, at most the second. A gap narrower than
#: the smallest step can be missed (fixtures/capacity/llama's sequence: the replay runs out at x4.39-4.48
#: and fits again up to x4.72; a step of the whole room jumped from x3.81 over it to x4.60).
SCAN_STEPS = (0.01, 0.25)


class _Capped:
    """The trace's blocks (with changes) replayed through the caching allocator at a factor, under a
    cap: whole, or the window of the peak step (``WHOLE_TRACE_EVENTS``)."""

    def __init__(self, f: Facts, settings, layout, start: int, stop: int, empty_cache, stream, checked: str):
        self.f, self.settings, self.layout, self.start, self.stop = f, settings, layout, start, stop
        self.empty_cache, self.stream, self.checked = empty_cache, stream, checked
        self.recorded = f.size
        self.exact = True  # the replay at factor 1 makes the trace's own segments (``_check``)
        self._memo: dict[tuple, tuple] = {}
        self._windows: dict[int, tuple] = {}

    @classmethod
    def of(cls, f: Facts, changes: list[Change]) -> "_Capped | str":
        """The replay of this trace, or why the allocator cannot be replayed on it."""
        an = f.an
        tr, life = an.trace, an.timeline.lifetimes
        settings = Settings.of(tr)
        if isinstance(settings, str):
            return settings
        n = len(tr)
        start, stop = 0, n
        steps = an.segmentation.steps
        if n > WHOLE_TRACE_EVENTS and steps:
            k = int(an.step_of[int(np.argmax(an.timeline.level))])
            if k >= 0:
                start, stop = int(steps[max(k - 1, 0)][0]), int(steps[k][1])
        layout = layout_at(tr, life, start)
        if not layout.known:
            return ("the snapshot's segments are not known here (a slice of steps: --steps; an .npz converted before "
                    "they were kept), so the allocator cannot start from the state it was in: not replayed")
        if len(layout.unplaced):
            return (f"{len(layout.unplaced)} blocks alive at the start of the replay lie in no segment the snapshot "
                    f"lists, so the allocator cannot start from the state it was in: not replayed")
        outside = outside_segments(tr, layout)
        if outside:
            return (f"{outside} of the trace's allocations lie in no segment of the allocator's (a trace not of "
                    f"PyTorch's CUDA caching allocator: the CPU profiler's, or one built by hand): not replayed")
        stream = block_streams(tr, life)
        cap = cls(f, settings, layout, start, stop, empty_cache_events(tr), stream, "")
        cap.checked = cap._check()
        return cap

    def _check(self) -> str:
        """How the replay at factor 1, uncapped, matches the trace's own segments in its window."""
        tr = self.f.an.trace
        r = self.run(*_blocks(self.f, []), None, 1.0, "batch")
        seg = np.flatnonzero(np.isin(tr.action[self.start:self.stop], [A["segment_alloc"], A["segment_free"]])) + self.start
        made = np.where(tr.action[seg] == A["segment_alloc"], tr.size[seg], -tr.size[seg])
        where = "the trace" if (self.start, self.stop) == (0, len(tr)) else f"events {self.start}-{self.stop - 1} (the peak's step and the one before)"
        if len(made) == len(r.segment_size) and (made == r.segment_size).all():
            freed = int((made < 0).sum())
            return (f"at factor 1 the replay makes the same {int((made > 0).sum())} segments as {where}"
                    + (f" and frees the same {freed}" if freed else "") + ", in the same sizes and order")
        peak_t = int(self.f.an.timeline.reserved_after[self.start:self.stop].max(initial=0))
        self.exact = False
        cause = ("the driver's addresses for new segments, which decide ties between free blocks of one size, "
                 "are not known")
        return (f"at factor 1 the replay makes {int((r.segment_size > 0).sum())} segments where {where} made "
                f"{int((made > 0).sum())} (peak reserved {format_bytes(r.reserved_peak)} against "
                f"{format_bytes(peak_t)}): {cause}")

    def run(self, alloc, free, size, kind, cap, factor: float, axis: str) -> Replay:
        """One replay of the blocks at ``factor`` along ``axis`` under ``cap`` (None: uncapped); the
        same blocks, factor and cap are replayed once (the sequence is the batch where no block is
        quadratic)."""
        if axis == "sequence" and not (kind == QUADRATIC).any():
            axis = "batch"
        key = (id(size), float(factor), axis, cap)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is size:
            return hit[1]
        w_alloc, w_free, w_size, w_kind, w_stream, w_recorded, w_layout = self._window(alloc, free, size, kind)
        scaled = np.round(w_size * _growth_factor(w_kind, factor, axis)).astype(np.int64)
        r = over_events.replay(w_alloc, w_free, scaled, w_stream, w_layout, cap, self.settings, self.start, self.stop,
                             scaled == w_recorded, self.empty_cache)
        self._memo[key] = (size, r)  # the sizes kept alive with it: their id is not reused meanwhile
        return r

    def _window(self, alloc, free, size, kind):
        """The blocks that live in the replayed window, renumbered, with the layout's ids renumbered
        too (a 1M-event trace has 500k blocks and its window a few thousand); once per set of blocks."""
        hit = self._windows.get(id(size))
        if hit is not None and hit[0] is size:
            return hit[1]
        free = np.maximum(free, alloc)
        idx = np.flatnonzero((alloc < self.stop) & (free >= self.start) & (size > 0))
        n_rec = len(self.recorded)
        recorded = np.full(len(idx), -1, np.int64)  # added blocks have no place to keep
        mine = idx < n_rec
        recorded[mine] = self.recorded[idx[mine]]
        stream = np.where(mine, self.stream[np.minimum(idx, n_rec - 1)],
                          self.f.an.trace.stream[np.clip(alloc[idx], 0, max(self.f.n - 1, 0))])
        pos = np.full(len(size), -1, np.int64)
        pos[idx] = np.arange(len(idx))
        lay = self.layout
        keep = pos[lay.block] >= 0
        layout = replace(lay, block=pos[lay.block[keep]], block_addr=lay.block_addr[keep],
                         block_size=lay.block_size[keep], unplaced=pos[lay.unplaced][pos[lay.unplaced] >= 0])
        view = (alloc[idx], free[idx], size[idx], kind[idx], stream, recorded, layout)
        self._windows[id(size)] = (size, view)
        return view

    def largest(self, blocks, budget: int, axis: str, hi: float) -> tuple[float, float, Replay | None]:
        """The largest factor (to FACTOR_PRECISION) up to which the replay does not run out of memory,
        at most ``hi``; the factor just above it that ran out, and that replay (None: none did). Running
        out is not monotone in the factor, so factors are walked up from 1 (SCAN_STEPS), then halved
        (docs/what-if.md)."""
        def ok(x):
            r = self.run(*blocks, budget, x, axis)
            return r.oom_event is None, r

        lo, x = 0.0, min(1.0, hi)
        while True:
            good, r = ok(x)
            if not good:
                break
            lo = x
            if x >= hi:
                return hi, hi, None
            room = (budget / max(r.reserved_peak, 1) - 1) / 2
            x = min(hi, x * (1 + min(SCAN_STEPS[1], max(SCAN_STEPS[0], room))))
        hi, failed = x, r
        for g in (g for g in FACTOR_GRID if lo < g < hi):  # a factor a user tries is answered exactly
            good, r = ok(g)
            if good:
                lo = g
            else:
                hi, failed = g, r
                break
        while hi - lo > FACTOR_PRECISION * max(lo, 1e-3):
            mid = (lo + hi) / 2
            good, r = ok(mid)
            if good:
                lo = mid
            else:
                hi, failed = mid, r
        return lo, hi, failed

    def beyond(self, blocks: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], budget: int, axis: str,
               failed: float, hi: float) -> tuple[float, float] | None:
        """Above a factor that ran out (``failed``), up to ``hi``: the first factor that fits again
        and the largest one of that run of fitting ones (the gap's end and the next limit), walked
        in the smallest steps; None where nothing above fits."""
        x = failed * (1 + SCAN_STEPS[0])
        while x < hi:
            if self.run(*blocks, budget, x, axis).oom_event is None:
                return x, self._up_from(blocks, budget, axis, x, hi)[0]
            x *= 1 + SCAN_STEPS[0]
        return None

    def _up_from(self, blocks, budget, axis, lo, hi):
        """From ``lo``, which fits, up in the smallest steps to the first that runs out, then halved:
        (the largest that fits, the smallest above it that ran out, that replay)."""
        x, failed = lo, None
        while x < hi:
            x = min(hi, x * (1 + SCAN_STEPS[0]))
            r = self.run(*blocks, budget, x, axis)
            if r.oom_event is not None:
                failed = r
                break
            lo = x
        else:
            return hi, hi, None
        top = x
        while top - lo > FACTOR_PRECISION * lo:
            mid = (lo + top) / 2
            r = self.run(*blocks, budget, mid, axis)
            if r.oom_event is None:
                lo = mid
            else:
                top, failed = mid, r
        return lo, top, failed


def _growth_factor(kind: np.ndarray, factor: float, axis: str) -> np.ndarray:
    """Per block, what its size is multiplied by at ``factor`` along ``axis``."""
    quad = factor if axis == "batch" else factor * factor
    return np.select([kind == LINEAR, kind == QUADRATIC], [factor, quad], 1.0)
