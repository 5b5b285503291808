"""What a budget allows without replaying the allocator: the blocks with changes applied, their
allocated peak as a curve in the factor, and the reserve the trace showed at its peak."""
from __future__ import annotations

import numpy as np

from ...analysis.core import Analysis
from ...read.trace import A
from ..blocks import Change, Facts
from ..remedies.per_token import block_growth
from ..replay import points
from ..scaling import CONSTANT, LINEAR, QUADRATIC

#: The reserve ratio above which fragmentation dominates what a cap allows: the answer is less sure
#: (fixtures/pairs/base: 1.15 reserved over allocated, its steady steps; the CNNs of the fixtures ~1.1).
#: Read only where the allocator is not replayed.
LOOSE_RESERVE = 1.25
#: Where the allocator is not replayed (expandable segments): the reserve at another size can exceed
#: the trace's: capacity run 2's llama at batch 14 reserved 1.20 x what it allocated under the cap where
#: its B 4 trace reserved 1.17 x (+2.3 %), and ran out of memory 0.9 % under the budget its replay gave.
#: The answer keeps this much more room.
RESERVE_MARGIN = 0.03


def _reserve(an: Analysis, peak: int) -> float:
    """Reserved over allocated where the trace peaks (both at their highest), at least 1."""
    reserved = int(an.timeline.reserved_after.max()) if len(an.timeline.reserved_after) else 0
    return max(1.0, reserved / peak) if peak and reserved else 1.0


def fragmentation(an: Analysis) -> float:
    """At the peak: (allocated + the free bytes inside segments that hold a live block) / allocated.
    Those bytes cannot be given back; a segment with no live block can (a capped allocator frees its
    cached segments before it fails). Only segments made inside the trace are seen (the weights',
    made before, are packed). 1.0 where the trace has no segment events."""
    tr, life = an.trace, an.timeline.lifetimes
    level = an.timeline.level
    pk = int(np.argmax(level))
    ev = np.flatnonzero(np.isin(tr.action, [A["segment_alloc"], A["segment_free"]]) & (np.arange(len(tr)) <= pk))
    segs: dict[int, int] = {}
    for e in ev:  # segments come and go a few hundred times: a dict is simplest
        if tr.action[e] == A["segment_alloc"]:
            segs[int(tr.addr[e])] = int(tr.size[e])
        else:
            segs.pop(int(tr.addr[e]), None)
    if not segs or not level[pk]:
        return 1.0
    starts = np.array(sorted(segs), np.int64)
    sizes = np.array([segs[a] for a in starts], np.int64)
    live = (life.alloc_event >= 0) & (life.alloc_event <= pk) & (life.free_event > pk)
    addr, size = tr.addr[life.alloc_event[live]], life.size[live]
    k = np.searchsorted(starts, addr, "right") - 1
    inside = (k >= 0) & (addr < starts[np.maximum(k, 0)] + sizes[np.maximum(k, 0)])
    used = np.bincount(k[inside], weights=size[inside], minlength=len(starts))
    held = used > 0
    return float((level[pk] + (sizes[held] - used[held]).sum()) / level[pk])


def _blocks(f: Facts, changes: list[Change]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every block once ``changes`` are applied together (sizes multiplied by each one's ratio, frees
    the earliest, blocks added): alloc events, free events, sizes at factor 1 and growth kinds; the
    trace's blocks first, in Lifetimes order."""
    size = f.size.astype(np.float64)
    free = f.free.copy()
    adds: list[tuple[np.ndarray, ...]] = [(np.zeros(0, np.int64),) * 3 + (np.zeros(0, np.int8),)]
    for ch in changes:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(f.size > 0, ch.size / np.maximum(f.size, 1), 1.0)
        size *= ratio
        free = np.minimum(free, ch.free)
        if ch.added:
            kind = ch.added_kind if ch.added_kind is not None else np.full(len(ch.added[2]), LINEAR, np.int8)
            adds.append((*(np.asarray(x, np.int64) for x in ch.added), np.asarray(kind, np.int8)))
    a_alloc, a_free, a_size, a_kind = (np.concatenate(x) for x in zip(*adds))
    alloc = np.concatenate([f.alloc, a_alloc])
    free = np.concatenate([free, a_free])
    size = np.concatenate([np.round(size).astype(np.int64), a_size])
    kind = np.concatenate([block_growth(f).kind, a_kind.astype(np.int8)])
    return alloc, free, size, kind


def _parts(f: Facts, changes: list[Change]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The replayed points of the constant, linear and quadratic blocks once ``changes`` (remedies)
    are applied together."""
    alloc, free, size, kind = _blocks(f, changes)
    constant, linear, quadratic = (points(f.n, alloc, free, np.where(kind == k, size, 0))
                                   for k in (CONSTANT, LINEAR, QUADRATIC))
    return constant, linear, quadratic


def _largest(c: np.ndarray, lin: np.ndarray, quad: np.ndarray, room: float) -> float:
    """The largest f with c + f·lin + f²·quad <= room at every point (0 if nothing fits)."""
    c, lin, quad = (x.astype(np.float64) for x in (c, lin, quad))
    if (c > room).any():
        return 0.0
    left = room - c
    with np.errstate(divide="ignore", invalid="ignore"):
        disc = np.sqrt(lin * lin + 4 * quad * left)
        f = np.where(quad > 0, (disc - lin) / (2 * np.where(quad > 0, quad, 1)),
                     np.where(lin > 0, left / np.where(lin > 0, lin, 1), np.inf))
    return float(f.min())


def _at(c, lin, quad, factor: float) -> int:
    return int((c + factor * lin + factor * factor * quad).max())
