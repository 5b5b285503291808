"""Allocation bands: every live allocation as a band of its own, stacked over time as memory_viz
stacks them, computed per pixel column rather than per event (docs/picture.md, "How the bands are
stacked").

Example:
    >>> cols = columns(X, tl.level, tl.active_after, tl.reserved_after, tl.delta, 0, n, 1400)
    >>> st = stack(tl.lifetimes, cols, n, max_bands=2000)
    >>> np.array_equal(st.total(), tl.level[cols.event])
    True"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...vocab import C


@dataclass
class Columns:
    """One sample per pixel column (or per event, when there are fewer events than columns)."""

    edges: np.ndarray  # float (S + 1,): x of the columns' edges
    event: np.ndarray  # int64 (S,): the event sampled in each column, the one with the highest level
    point: np.ndarray  # int64 (S,): that level as a state index: bytes alive after ``point`` events
    level: np.ndarray  # int64 (S,): Timeline.level at ``event``, i.e. the column's maximum
    low: np.ndarray  # int64 (S,): the column's minimum of active_after
    reserved: np.ndarray  # int64 (S,): the column's maximum of reserved_after

    def __len__(self) -> int:
        return len(self.event)


def columns(X, level, after, reserved, delta, a, b, ncols) -> Columns:
    """Sample events [a, b) once per column: ``ncols`` columns evenly spaced over X[a]..X[b].

    Example:
        >>> cols = columns(np.arange(n + 1.0), tl.level, tl.active_after, tl.reserved_after, tl.delta, 0, n, 1400)
        >>> cols.level.max() == tl.level.max()
        True
    """
    if b - a <= ncols:
        edges = np.asarray(X[a:b + 1], dtype=np.float64)
        event = np.arange(a, b, dtype=np.int64)
        low, res = after[a:b], reserved[a:b]
    else:
        edges = np.linspace(X[a], X[b], ncols + 1)
        # The event covering each column's left edge starts that column's group; a column no event
        # starts in repeats its covering event (reduceat does that for non-increasing indices).
        first = np.clip(np.searchsorted(X[a:b + 1], edges[:-1], "right") - 1, 0, b - a - 1)
        first[0] = 0  # events tied at the very first x still belong to the first column
        seg = level[a:b]
        stop = np.append(first[1:], b - a)
        event = first.astype(np.int64)
        # One argmax per column (the first event at the column's maximum): a loop over the ~1,500
        # columns reads each event once, where a vectorised argmax per group made five passes over
        # all of them (1 s of a 10M-event picture).
        for c in np.flatnonzero(stop > first).tolist():
            event[c] += int(seg[first[c]:stop[c]].argmax())
        event += a
        low = np.minimum.reduceat(after[a:b], first)
        res = np.maximum.reduceat(reserved[a:b], first)
    # A free's level is the moment before it (the block still counted); anything else's, after it.
    point = np.where(delta[event] < 0, event, event + 1)
    return Columns(edges, event, point, level[event], np.asarray(low), np.asarray(res))


@dataclass
class Stack:
    """The bands at every column, bottom to top: ``base`` (alive from before recording to the end,
    one part per key), the drawn allocations in allocation order, then ``folded`` (the rest).

    A drawn band j covers columns ``first[j]`` to ``stop[j] - 1`` (an allocation's life is one
    interval), from ``bottom[j, c]`` to ``bottom[j, c] + size[j]``. The offsets are kept only where
    a band is alive (``offsets[ptr[j]:ptr[j + 1]]`` are band j's, column by column): a million-event
    trace had 5,016 such cells of its 2,000 × 1,509, and the dense ``bottom`` is built on demand.
    """

    columns: Columns
    base_keys: np.ndarray  # (K,) the key of each base part (category code, say), bottom to top
    base: np.ndarray  # (K,) int64 bytes of each base part; constant over the trace
    index: np.ndarray  # (D,) Lifetimes index of each drawn band, bottom to top
    size: np.ndarray  # (D,) int64
    first: np.ndarray  # (D,) first column the band is alive in
    stop: np.ndarray  # (D,) one past its last column
    ptr: np.ndarray  # (D + 1,) int64: band j's offsets are offsets[ptr[j]:ptr[j + 1]]
    offsets: np.ndarray  # (P,) int64: each band's bottom at each column it is alive in, band by band
    folded: np.ndarray  # (S,) int64 bytes of the allocations not drawn, on top of the drawn ones
    n_folded: int  # how many allocations alive at some column were folded
    # True when the largest size alone had more allocations than bands: its earliest are drawn and
    # the rest folded, so the folded band is then not only "smaller" allocations.
    split: bool = False
    # ``folded`` split by the same keys as the base (category codes, say), bottom to top: where the
    # bands run out (thousands of steps) the summed band still says what the bytes are.
    folded_keys: np.ndarray = None  # type: ignore[assignment]  # (F,); stack() always gives it
    folded_parts: np.ndarray = None  # type: ignore[assignment]  # (F, S) int64; sums to ``folded``

    def cells(self) -> tuple[np.ndarray, np.ndarray]:
        """(band, column) of every offset: which band is alive in which column, band by band."""
        lengths = self.stop - self.first
        band = np.repeat(np.arange(len(self.index)), lengths)
        column = np.arange(len(band)) - np.repeat(self.ptr[:-1] - self.first, lengths)
        return band, column

    @property
    def bottom(self) -> np.ndarray:
        """(D, S) int64: each band's bottom at every column; meaningful in first..stop-1 (0 elsewhere)."""
        out = np.zeros((len(self.index), len(self.columns)), np.int64)
        out[self.cells()] = self.offsets
        return out

    def alive(self) -> np.ndarray:
        """(D, S) bool: which drawn band is alive in which column."""
        cols = np.arange(len(self.columns))
        return (self.first[:, None] <= cols) & (cols < self.stop[:, None])

    def drawn_top(self) -> np.ndarray:
        """(S,) the top of the drawn bands (the base when none is alive): where ``folded`` sits."""
        band, column = self.cells()
        top = np.bincount(column, weights=self.size[band], minlength=len(self.columns))
        return int(self.base.sum()) + np.rint(top).astype(np.int64)

    def total(self) -> np.ndarray:
        """(S,) every band added up: equals ``Timeline.level`` at ``columns.event``."""
        return self.drawn_top() + self.folded


def _folded(keys: np.ndarray, size: np.ndarray, first: np.ndarray, stop: np.ndarray, S: int):
    """(keys, bytes per key and column) of the allocations not drawn one by one, summed per key."""
    folded_keys = np.unique(keys)
    # One difference array per key: row r gains a folded allocation's size from its first column to
    # its stop (the spare last column takes the stops at S).
    # (bincount, not np.add.at, which is several times slower; byte sums stay exact below 2**53.)
    F = len(folded_keys)
    row = np.searchsorted(folded_keys, keys) * (S + 1)
    w = size.astype(np.float64)
    d = (np.bincount(row + first, weights=w, minlength=F * (S + 1))
         - np.bincount(row + stop, weights=w, minlength=F * (S + 1)))
    return folded_keys, np.cumsum(np.rint(d).astype(np.int64).reshape(F, S + 1), axis=1)[:, :S]


def stack(life, cols: Columns, n: int, max_bands: int = 2000, base_key=None) -> Stack:
    """Stack ``Lifetimes`` over the sampled columns, the ``max_bands`` largest drawn one by one.

    Only allocations alive at some sample compete for a band (one that lives and dies between two
    samples cannot be seen). Allocations tied in size are drawn all or none, so steps that repeat
    the same tensors look alike even where the cut falls (fewer than ``max_bands`` may be drawn);
    only if the largest size alone has more allocations than that are the earliest of them drawn.
    ``base_key`` (one per allocation, e.g.
    its category) splits the memory alive from before recording to the end into parts.

    Example:
        >>> st = stack(report.analysis.timeline.lifetimes, cols, report.n_events, max_bands=10)
        >>> len(st.index) <= 10
        True
    """
    if max_bands < 0:
        raise ValueError(f"max_bands={max_bands!r}: give a number of bands >= 0")
    alloc, free, size = life.alloc_event, life.free_event, life.size.astype(np.int64)
    P = cols.point
    S = len(P)
    # Alive at state p when alloc < p <= free (alloc -1: alive from state 0).
    first = np.searchsorted(P, alloc + 1, "left")
    stop = np.searchsorted(P, free, "right")
    constant = (alloc < 0) & (free >= n)
    visible = (stop > first) & ~constant
    cand = np.flatnonzero(visible)
    split = False
    if len(cand) > max_bands:
        by_size = cand[np.argsort(-size[cand], kind="stable")]
        cut = size[by_size[max_bands]]
        pick = by_size[:max_bands]
        whole = pick[size[pick] > cut]
        # Only when even the largest size has more allocations than bands is a size class split.
        split = not len(whole)
        cand = np.sort(whole if len(whole) else pick)
    rest = visible.copy()
    rest[cand] = False

    keys = np.zeros(len(size), np.int64) if base_key is None else np.asarray(base_key, dtype=np.int64)
    folded_keys, folded_parts = _folded(keys[rest], size[rest], first[rest], stop[rest], S)
    folded = folded_parts.sum(axis=0) if len(folded_keys) else np.zeros(S, np.int64)

    base_keys = np.unique(keys[constant])
    base = np.array([int(size[constant & (keys == k)].sum()) for k in base_keys], dtype=np.int64)

    dsize, dfirst, dstop = size[cand], first[cand], stop[cand]
    ptr = np.zeros(len(cand) + 1, np.int64)
    np.cumsum(dstop - dfirst, out=ptr[1:])
    st = Stack(cols, base_keys, base, cand, dsize, dfirst, dstop, ptr, np.zeros(0, np.int64), folded,
               int(rest.sum()), split, folded_keys, folded_parts)
    st.offsets = _offsets(st, int(base.sum()))
    return st


def _offsets(st: Stack, base: int) -> np.ndarray:
    """Every band's bottom at each column it is alive in: the base plus the sizes of the bands below
    it alive there. Only the live cells are visited: grouped by column (a stable sort keeps the bands'
    order within a column), summed, and put back band by band: O(cells), not O(bands × columns)."""
    band, column = st.cells()
    if not len(band):
        return np.zeros(0, np.int64)
    key = column.astype(np.uint16 if len(st.columns) < 2**16 else np.int64)
    order = np.argsort(key, kind="stable")  # radix sort for 16-bit keys
    sizes = st.size[band[order]]
    below = np.cumsum(sizes) - sizes
    starts = np.searchsorted(column[order], np.arange(len(st.columns)), "left")
    below -= below[np.minimum(starts, len(below) - 1)][column[order]]
    out = np.empty(len(band), np.int64)
    out[order] = base + below
    return out


def vertex_count(st: Stack) -> int:
    """How many vertices ``polygons`` would give the drawn bands (4 per flat run, 1 to close each):
    what an SVG or PDF of them weighs, counted without building them."""
    if not len(st.index):
        return 0
    moves = st.offsets[1:] != st.offsets[:-1]
    inner = np.ones(len(st.offsets) - 1 if len(st.offsets) else 0, bool)
    inner[st.ptr[1:-1] - 1] = False  # a change across two bands' cells is no vertex
    return int(4 * (len(st.index) + (moves & inner).sum()) + len(st.index))


def raster(st: Stack, column_of: np.ndarray, row_bytes: np.ndarray) -> np.ndarray:
    """(H, W) int32: the drawn band each pixel shows (an index into ``st.index``), -1 where none.

    ``column_of`` (W,): the sample column under each pixel column's centre, -1 outside the columns;
    ``row_bytes`` (H,), increasing: the bytes at each pixel row's centre, bottom row first. A band
    takes the pixels whose centre lies in [bottom, top), which is what the vector outline filled
    without antialiasing gives (matplotlib snaps a rectilinear outline to whole pixels); a band
    thinner than a pixel may take none. Per column, each band marks the row it starts on and the
    top the row it ends on; a running maximum carries each mark up to the next: O(cells + pixels).

    Example:
        >>> labels = raster(st, column_of, row_bytes)
        >>> rgba = palette[labels]   # palette[-1] transparent
    """
    S, H = len(st.columns), len(row_bytes)
    band, column = st.cells()
    lo = np.searchsorted(row_bytes, st.offsets, "left")
    hi = np.searchsorted(row_bytes, st.offsets + st.size[band], "left")
    shown = hi > lo
    band, column, lo, hi = band[shown], column[shown], lo[shown], hi[shown]
    unset, end = np.int32(-2), np.int32(-1)
    marks = np.full((S, H + 1), unset, np.int32)
    marks[column, hi] = end  # a band's end is the next one's start where they touch: starts go last
    marks[column, lo] = band
    rows = np.where(marks != unset, np.arange(H + 1, dtype=np.int32), 0)
    np.maximum.accumulate(rows, axis=1, out=rows)
    filled = np.take_along_axis(marks, rows, axis=1)[:, :H]
    filled[filled == unset] = end
    out = np.full((H, len(column_of)), end, np.int32)
    inside = column_of >= 0
    out[:, inside] = filled[column_of[inside]].T
    return out


def folded_label(st: Stack) -> str:
    """What the summed band on top holds, in words that stay true when a size class was split."""
    if st.split:
        return (f"{st.n_folded:,} allocations not drawn one by one, summed "
                f"(more than {len(st.index):,} of the largest size: only the earliest drawn)")
    return f"{st.n_folded:,} smaller allocations, summed"


def polygons(st: Stack, unit: float) -> list[np.ndarray]:
    """One closed outline per drawn band, in (x, bytes / unit), flat across each column.

    A band gets vertices only where its bottom moves (something below it was made or freed), so a
    long-lived band under a stable stack is a rectangle however many columns it spans.

    Example:
        >>> PolyCollection(polygons(st, 2**30), facecolors=colors)
    """
    edges = st.columns.edges
    out = []
    for j in range(len(st.index)):
        f, s = int(st.first[j]), int(st.stop[j])
        v = st.offsets[st.ptr[j]:st.ptr[j + 1]]
        keep = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1])))
        x0 = edges[f + keep]
        x1 = edges[f + np.append(keep[1:], s - f)]
        xb = np.column_stack([x0, x1]).ravel()
        yb = np.repeat(v[keep], 2) / unit
        yt = np.repeat(v[keep] + st.size[j], 2) / unit
        out.append(np.column_stack([np.concatenate([xb, xb[::-1]]), np.concatenate([yb, yt[::-1]])]))
    return out


def step_outline(edges, values, unit: float) -> tuple[np.ndarray, np.ndarray]:
    """x, y of a line flat across each column (for the folded band's top and the curve).

    Example:
        >>> ax.plot(*step_outline(cols.edges, cols.level, 2**30))
    """
    x = np.column_stack([edges[:-1], edges[1:]]).ravel()
    return x, np.repeat(values, 2) / unit


def x_values(report, by) -> np.ndarray:
    """x of every event's left edge, and one past the last (events span [X[e], X[e + 1]))."""
    n = report.n_events
    if by == "event":
        return np.arange(n + 1, dtype=np.float64)
    t = report.analysis.trace.time_us
    X = np.empty(n + 1, dtype=np.float64)
    X[:n] = t - t[0]
    X[n] = X[n - 1] + max((X[n - 1] - X[0]) / max(n - 1, 1), 1.0)
    return X


def category_codes(report) -> np.ndarray:
    """Each allocation's category code (Lifetimes order), 'other' for all where the report has none."""
    curves = report.analysis.categories
    if curves is None:
        return np.full(len(report.analysis.timeline.lifetimes), C["other"], np.int64)
    return np.asarray(curves.codes, dtype=np.int64)
