"""What a remedy reads off the trace (``Facts``, read once per report) and what it gives back
(``Change``: the blocks dropped, resized, re-timed or added), shared by phasemem.predictions.remedies, the replay
in phasemem.predictions.whatif and phasemem.predictions.fits."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..analysis.core import Analysis
from ..model import Pattern
from ..vocab import P
from .scaling import Growth


@dataclass
class Change:
    size: np.ndarray
    free: np.ndarray
    explanation: str
    assumptions: list[str] = field(default_factory=list)
    added: tuple = ()  # extra blocks: (alloc events, free events, sizes)
    added_kind: np.ndarray | None = None  # how each added block grows with the tokens (scaling.LINEAR default)


class Facts:
    """What the remedies read: the blocks (Lifetimes order), their categories, the shapes' members."""

    def __init__(self, an: Analysis, patterns: list[Pattern]):
        self.an = an
        life = an.timeline.lifetimes
        self.n = len(an.trace)
        self.n_pre = int(life.preexisting.sum())
        self.alloc, self.free, self.size = life.alloc_event, life.free_event, life.size
        self.cat = an.categories.codes
        self.patterns = patterns
        labels = an.labels
        self.phase_alloc = np.where(self.alloc >= 0, labels[np.maximum(self.alloc, 0)], -1)
        self.phase_free = np.where(self.free < self.n, labels[np.minimum(self.free, self.n - 1)], -1)

        # Per step, its phase runs (facts' run arrays, grouped once: steps x runs would be quadratic).
        fx = an.facts
        self.run_order = np.argsort(fx.run_step, kind="stable")
        steps = np.arange(len(an.segmentation.steps))
        rs = fx.run_step[self.run_order]
        self.run_lo, self.run_hi = np.searchsorted(rs, steps, "left"), np.searchsorted(rs, steps, "right")
        self.free_order = np.argsort(self.free, kind="stable")
        self.free_sorted = self.free[self.free_order]
        self._members: dict[tuple, np.ndarray] = {}
        self._growth: Growth | None = None

    def runs(self, step: int, phase: str) -> tuple[np.ndarray, np.ndarray]:
        """(first events, last events) of the step's runs of a phase, in event order."""
        fx = self.an.facts
        k = self.run_order[self.run_lo[step]:self.run_hi[step]]
        k = np.sort(k[fx.run_phase[k] == P[phase]])
        return fx.run_first[k], fx.run_last[k]

    def made_in(self, first: int, stop: int) -> np.ndarray:
        """Allocations (Lifetimes order) the trace made at events first..stop-1."""
        lo, hi = np.searchsorted(self.alloc[self.n_pre:], [first, stop])
        return np.arange(self.n_pre + lo, self.n_pre + hi)

    def freed_in(self, first: int, last: int) -> np.ndarray:
        """Allocations freed at events first..last."""
        lo, hi = np.searchsorted(self.free_sorted, [first, last + 1])
        return self.free_order[lo:hi]

    def members(self, *kinds: str) -> np.ndarray:
        """The allocations (Lifetimes order) of every pattern of these kinds; asked by several remedies."""
        if kinds not in self._members:
            parts = [np.asarray(p.members, np.int64) for p in self.patterns if p.kind in kinds and p.members]
            # a mask, not np.unique: the members of 4k steps' shapes are millions, and sorting them was 1.5 s
            seen = np.zeros(len(self.size) - self.n_pre, bool)
            if parts:
                seen[np.concatenate(parts)] = True
            self._members[kinds] = self.n_pre + np.flatnonzero(seen)
        return self._members[kinds]

    def change(self, explanation: str, *assumptions: str) -> Change:
        return Change(self.size.copy(), self.free.copy(), explanation, list(assumptions))
