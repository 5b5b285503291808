"""Bytes live per category at any events (``CategoryCurves``), from categories.py's codes: the curves the
report, its steps and the picture read, answered without an events x categories matrix."""
from __future__ import annotations

import numpy as np

from ..vocab import CATEGORIES
from .categories import classify_with_readings
from .facts import Context

#: Up to this many points are answered by sorting the blocks between them (a (points x categories)
#: table); more (a curve over every event) by one cumsum over the events per category.
MAX_BUCKETED = 1 << 16
#: Sums of block sizes in float64 are exact below 2**53 bytes; a trace that allocated more in all
#: (9 PB) takes the integer path.
EXACT_FLOAT = 1 << 53


class CategoryCurves:
    """Bytes live per category, evaluated at any events, without an n × categories matrix."""

    def __init__(self, ctx: Context):
        life = ctx.timeline.lifetimes
        pre_cat, cat, self.readings = classify_with_readings(ctx)
        self.codes = np.concatenate([pre_cat, cat])
        self.alloc = life.alloc_event
        self.free = life.free_event
        self.size = life.size
        self.n = ctx.n

    def at(self, points) -> np.ndarray:
        """(len(points), len(CATEGORIES)) bytes alive at each point; point k is the moment just
        before event k, so point e + 1 is just after event e."""
        pts = np.asarray(points, dtype=np.int64)
        if len(pts) > MAX_BUCKETED or int(self.size.sum()) >= EXACT_FLOAT:
            return self._at_by_cumsum(pts)
        # Each block sorted into the gap between the asked points where it starts and where it ends,
        # then summed per gap and category: O(blocks log points), not a cumsum over every event per
        # category (12 of them on a 10M-event trace: 0.9 s).
        order = np.argsort(pts, kind="stable")
        sp, m, k = pts[order], len(pts), len(CATEGORIES)
        codes = self.codes.astype(np.int64)

        def reached(events):  # bytes of the blocks whose event is before each sorted point
            gap = np.searchsorted(sp, events + 1, "left")
            w = np.bincount(gap * k + codes, weights=self.size, minlength=(m + 1) * k)
            return np.cumsum(w.reshape(m + 1, k), axis=0)[:m].astype(np.int64)

        out = np.empty((m, k), np.int64)
        out[order] = reached(self.alloc) - reached(self.free)
        return out

    def _at_by_cumsum(self, pts: np.ndarray) -> np.ndarray:
        out = np.zeros((len(pts), len(CATEGORIES)), np.int64)
        for c in range(len(CATEGORIES)):
            m = self.codes == c
            if not m.any():
                continue
            d = np.zeros(self.n + 2, np.int64)
            np.add.at(d, self.alloc[m] + 1, self.size[m])  # pre-existing (alloc -1) land at point 0
            np.add.at(d, self.free[m] + 1, -self.size[m])
            out[:, c] = np.cumsum(d)[pts]
        return out

    def at_level(self, events, timeline) -> np.ndarray:
        """Bytes per category at the level each event reaches (after an alloc, before a free),
        so that each row sums to ``Timeline.level`` there."""
        ev = np.asarray(events, dtype=np.int64)
        return self.at(np.where(timeline.change_at(ev) < 0, ev, ev + 1))
