"""The report's patterns as arrays, read once a picture: a 10M-event trace has 130,723 of them, and the
scene's filter, the legend's count and the callouts each read every pattern object (0.4 s at 10M)."""
from __future__ import annotations

from operator import attrgetter

import numpy as np

_KIND, _BYTES, _PEAK = attrgetter("kind"), attrgetter("bytes"), attrgetter("peak_event")

class PatternTable:
    """Patterns in report order: ``kind`` codes into ``kinds`` (first appearance first), ``size`` (bytes)
    and ``peak`` (event); the objects themselves only where one is named (``pattern(i)``).

    Example:
        >>> table = PatternTable.of(report.patterns).between(0, report.n_events)
        >>> table.repeated_kinds(), len(table)
    """

    def __init__(self, objects, index, kinds, code, size, peak):
        self._objects, self.index = objects, index
        self.kinds, self.code, self.size, self.peak = kinds, code, size, peak
        self._groups = None

    @classmethod
    def of(cls, patterns) -> "PatternTable":
        objects = list(patterns)
        n = len(objects)
        # One pass per field (a zip over attrgetter rows was 10 times slower at 130k patterns).
        kind = list(map(_KIND, objects))
        seen = {k: i for i, k in enumerate(dict.fromkeys(kind))}
        code = np.fromiter(map(seen.__getitem__, kind), np.int64, n)
        size = np.fromiter(map(_BYTES, objects), np.float64, n)
        peak = np.fromiter(map(_PEAK, objects), np.int64, n)
        return cls(objects, np.arange(n), list(seen), code, size, peak)

    def __len__(self) -> int:
        return len(self.index)

    def between(self, a: int, b: int) -> "PatternTable":
        """The patterns whose peak is in events [a, b), in report order."""
        keep = np.flatnonzero((self.peak >= a) & (self.peak < b))
        return PatternTable(self._objects, self.index[keep], self.kinds, self.code[keep], self.size[keep],
                            self.peak[keep])

    def pattern(self, i: int):
        """The i-th pattern of this table, as the report holds it."""
        return self._objects[int(self.index[i])]

    def by_kind(self) -> dict[str, np.ndarray]:
        """Each kind present (in order of its first pattern here) and its patterns' positions, in order."""
        if self._groups is not None:
            return self._groups
        if not len(self):
            return {}
        order = np.argsort(self.code, kind="stable")
        cut = np.flatnonzero(np.diff(self.code[order])) + 1
        groups = np.split(order, cut)
        groups.sort(key=lambda g: g[0])
        self._groups = {self.kinds[int(self.code[g[0]])]: g for g in groups}
        return self._groups

    def repeated_kinds(self) -> list[str]:
        """The kinds with more than one pattern here, in order of their first."""
        return [k for k, g in self.by_kind().items() if len(g) > 1]
