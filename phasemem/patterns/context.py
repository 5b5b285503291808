"""What every detector needs about a trace, computed once: allocations with their lifetimes and
the phase at both ends, and each step's phase runs."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..segment import P, Segmentation, runs
from ..timeline import Timeline
from ..trace import Trace


@dataclass
class Context:
    trace: Trace
    timeline: Timeline
    seg: Segmentation
    level: np.ndarray  # highest active bytes while each event ran
    before: np.ndarray  # active bytes just before each event
    # Allocations made inside the trace, in event order.
    alloc: np.ndarray  # alloc event
    free: np.ndarray  # free event, len(trace) if never freed
    size: np.ndarray
    phase_at_alloc: np.ndarray
    phase_at_free: np.ndarray  # -1 if never freed
    step_at_alloc: np.ndarray
    # Phase runs: first event, last event, phase code, step position.
    run_first: np.ndarray
    run_last: np.ndarray
    run_phase: np.ndarray
    run_step: np.ndarray
    param_sizes: np.ndarray  # sizes of the blocks alive from before recording to the end
    _memo: dict = field(default_factory=dict)

    def memo(self, key, compute):
        """Per-trace cache for what several detectors ask for (each step's gradients)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def n(self) -> int:
        return len(self.trace)

    @classmethod
    def build(cls, trace: Trace, tl: Timeline, seg: Segmentation) -> "Context":
        life = tl.lifetimes
        born = life.alloc_event >= 0
        a, f, s = life.alloc_event[born], life.free_event[born], life.size[born]
        n = len(trace)
        labels = seg.labels.astype(np.int64)
        pf = np.full(len(f), -1, np.int64)
        freed = f < n
        pf[freed] = labels[f[freed]]
        rf, rl, rp, rs = runs(seg.labels, seg.step_of)
        params = life.size[life.preexisting & (life.free_event >= n)]
        return cls(trace, tl, seg, tl.level, tl.active_before, a, f, s, labels[a], pf,
                   seg.step_of[a].astype(np.int64), rf, rl, rp, rs, params)

    def runs_of(self, step: int, phase: str) -> list[tuple[int, int]]:
        m = (self.run_step == step) & (self.run_phase == P[phase])
        return list(zip(self.run_first[m].tolist(), self.run_last[m].tolist()))

    def freed_between(self, first: int, last: int) -> np.ndarray:
        """Indices (into the alloc arrays) of allocations freed at events first..last."""
        order = self.memo("free_order", lambda: np.argsort(self.free, kind="stable"))
        sorted_free = self.memo("free_sorted", lambda: self.free[order])
        lo, hi = np.searchsorted(sorted_free, [first, last + 1])
        return order[lo:hi]

    def allocs_between(self, first: int, last: int) -> np.ndarray:
        """Indices (into the alloc arrays) of allocations made at events first..last."""
        lo, hi = np.searchsorted(self.alloc, [first, last + 1])
        return np.arange(lo, hi)

    def peak_in(self, first: int, last: int) -> int:
        return first + int(np.argmax(self.level[first:last + 1]))
