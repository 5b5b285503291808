"""What fits on a card of a given size: the largest batch and sequence factor, solved from the trace.

Every block grows with the tokens as ``scaling.growth`` says (constant, linear, quadratic in the
sequence), so the memory at every point of the replayed curve is ``c + f·l + f²·q`` for a factor f
(``f·(l + q)`` for the batch). The largest factor under a budget is then exact for the replay: the
smallest, over the points, of the largest f each point allows. The budget is read against the
allocator's reserve as the trace shows it: what it reserved over what was allocated at the peak
(caching, fragmentation). Remedies compose with the scaling (the replay with both applied), so the
answer can name the remedies that would let the next factor fit.

Example:
    >>> fit = fits(report.analysis, report.patterns, 80 << 30)
    >>> fit.batch.largest_factor, fit.batch.next_factor, fit.batch.next_fits_with
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import combinations

import numpy as np

from .analysis import Analysis
from .errors import PhasememError
from .model import Pattern
from .replay import points
from .scaling import CONSTANT, LINEAR, QUADRATIC
from .trace import A
from .units import format_bytes
from .remedies import REMEDIES, block_growth
from .remedy_facts import Change, Facts

#: Factors a user tries (the largest of them that fits is named, and the next one up is what the
#: remedies are asked to make fit).
FACTOR_GRID = (0.25, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: Remedies tried together at most (2 of 6: 21 replays; more are tried only greedily).
MAX_COMBINATION = 2
#: The reserve ratio above which fragmentation dominates what a cap allows: the answer is less sure
#: (fixtures/pairs/base: 1.15 reserved over allocated, its steady steps; the CNNs of the fixtures ~1.1).
LOOSE_RESERVE = 1.25
#: The reserve at another size can exceed the trace's: capacity run 2's llama at batch 14 reserved 1.20 x
#: what it allocated under the cap where its B 4 trace reserved 1.17 x (+2.3 %), and ran out of memory
#: 0.9 % under the budget its replay gave. The answer keeps this much more room.
RESERVE_MARGIN = 0.03
#: What the replay's predictions missed by at most, on the real runs of docs/what-if.md (50 remedy and
#: scale runs of fixtures/pairs and pairs2, `python3 docs/eval_whatif.py`: worst llama's chunked CE over
#: 8 chunks, -2.96 %, held out); the README says the same. The issues' target was 5 %.
CHECKED_ERROR = 0.03


@dataclass
class Fit:
    """The answer along one axis (batch or sequence)."""

    axis: str
    applies: bool
    largest_factor: float | None = None  # predicted peak x reserve stays within the budget
    largest_factor_fragmented: float | None = None  # with only the fragmentation seen at the peak
    largest_factor_allocated: float | None = None  # the allocated peak alone within the budget
    largest_listed: float | None = None  # the largest of FACTOR_GRID up to largest_factor
    next_factor: float | None = None  # the next of FACTOR_GRID above it
    predicted_peak_bytes_next: int | None = None  # allocated, at next_factor, no remedy
    next_fits_with: list[str] | None = None  # remedies that make next_factor fit (None: none found)
    largest_factor_with: float | None = None  # the largest factor with those remedies
    confidence: str = "low"  # high, medium, low
    why: list[str] = field(default_factory=list)


@dataclass
class Fits:
    """``report.fits(budget)``: the largest batch and sequence predicted to fit in ``budget_bytes``."""

    budget_bytes: int
    peak_bytes: int
    reserve_ratio: float  # reserved over allocated at the peak: what the budget is read against
    fragmentation_ratio: float  # (allocated + free bytes inside segments that hold live blocks) / allocated
    batch: Fit
    sequence: Fit

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return format_fits(self)


def fits(an: Analysis, patterns: list[Pattern], budget: int, changes: list[Change] | None = None) -> Fits:
    """The largest batch and sequence factors whose replayed peak, with the allocator's reserve as
    the trace shows it, stays within ``budget`` bytes; and the remedies that would let the next
    factor fit."""
    budget = int(budget)
    if budget <= 0:
        raise PhasememError(f"a budget of {budget} B: give the card's memory, such as 80GiB")
    peak = int(an.timeline.level.max()) if len(an.trace) else 0
    if not len(an.trace):
        no = Fit("batch", False, why=["the trace has no events"])
        return Fits(budget, 0, 1.0, 1.0, no, Fit("sequence", False, why=["the trace has no events"]))
    f = Facts(an, patterns)
    reserve = _reserve(an, peak)
    frag = min(reserve, fragmentation(an))
    g = block_growth(f)
    names = _applicable(f)
    out = []
    for axis in ("batch", "sequence"):
        if not (g.kind != CONSTANT).any():
            out.append(Fit(axis, False, why=["no block made in forward or backward grows with the tokens here"]))
            continue
        if axis == "sequence" and not g.sequence_known:
            out.append(Fit(axis, False, why=[g.evidence]))
            continue
        out.append(_solve(f, axis, budget, reserve, frag, names, list(changes or [])))
    return Fits(budget, peak, reserve, frag, out[0], out[1])


def predict(an: Analysis, patterns: list[Pattern], remedies: dict[str, dict] | None = None,
            batch: float = 1.0, seq: float = 1.0) -> int | str:
    """The replayed peak (allocated bytes) with ``remedies`` applied together (name: its settings,
    e.g. ``{"chunked_cross_entropy": {"chunks": 8}}``) at a batch and sequence factor; or why a
    remedy does not apply.

        >>> predict(report.analysis, report.patterns, {"activation_checkpointing": {"every": 2}}, batch=2)
    """
    f = Facts(an, patterns)
    changes = []
    for name, settings in (remedies or {}).items():
        ch = REMEDIES[name](f, **settings)
        if isinstance(ch, str):
            return f"{name}: {ch}"
        changes.append(ch)
    g = block_growth(f)
    if seq != 1 and not g.sequence_known:
        return g.evidence
    c, lin, quad = _parts(f, changes)
    return _at(c, lin * batch * seq, quad * batch * seq * seq, 1.0)


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


def _applicable(f: Facts) -> dict[str, Change]:
    out = {}
    for name, remedy in REMEDIES.items():
        ch = remedy(f)
        if not isinstance(ch, str):
            out[name] = ch
    return out


def _parts(f: Facts, changes: list[Change]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The replayed points of the constant, linear and quadratic blocks once ``changes`` (remedies)
    are applied together: sizes multiplied by each one's ratio, frees the earliest, blocks added."""
    size = f.size.astype(np.float64)
    free = f.free.copy()
    adds = [(np.zeros(0, np.int64),) * 3 + (np.zeros(0, np.int8),)]
    for ch in changes:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(f.size > 0, ch.size / np.maximum(f.size, 1), 1.0)
        size *= ratio
        free = np.minimum(free, ch.free)
        if ch.added:
            kind = ch.added_kind if ch.added_kind is not None else np.full(len(ch.added[2]), LINEAR, np.int8)
            adds.append((*ch.added, kind))
    a_alloc, a_free, a_size, a_kind = (np.concatenate(x) for x in zip(*adds))
    alloc = np.concatenate([f.alloc, a_alloc])
    free = np.concatenate([free, a_free])
    size = np.concatenate([np.round(size).astype(np.int64), a_size])
    kind = np.concatenate([block_growth(f).kind, a_kind.astype(np.int8)])
    return tuple(points(f.n, alloc, free, np.where(kind == k, size, 0)) for k in (CONSTANT, LINEAR, QUADRATIC))


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


def _solve(f: Facts, axis: str, budget: int, reserve: float, frag: float, remedies: dict[str, Change],
           base_changes: list[Change] = ()) -> Fit:
    def curve(changes):
        c, lin, quad = _parts(f, list(base_changes) + list(changes))
        return (c, lin + quad, np.zeros_like(quad)) if axis == "batch" else (c, lin, quad)

    base = curve([])
    room = budget / (reserve * (1 + RESERVE_MARGIN))
    best = _largest(*base, room)
    loose = _largest(*base, budget)
    fit = Fit(axis, True, largest_factor=round(best, 3), largest_factor_fragmented=round(_largest(*base, budget / frag), 3),
              largest_factor_allocated=round(loose, 3))
    listed = [x for x in FACTOR_GRID if x <= best]
    fit.largest_listed = listed[-1] if listed else None
    nxt = next((x for x in FACTOR_GRID if x > best), None)
    fit.next_factor = nxt
    if nxt is not None:
        fit.predicted_peak_bytes_next = _at(*base, nxt)
        found = _remedies_for(curve, remedies, nxt, room)
        if found is not None:
            fit.next_fits_with, fit.largest_factor_with = found[0], round(found[1], 3)
    fit.confidence, fit.why = _confidence(f, axis, reserve, frag, best, fit.largest_factor_fragmented, loose)
    return fit


def _remedies_for(curve, remedies: dict[str, Change], target: float, room: float):
    """The fewest remedies (then the most room) under which ``target`` fits: (names, largest factor)."""
    names = list(remedies)
    for k in range(1, min(MAX_COMBINATION, len(names)) + 1):
        tried = [(list(combo), _largest(*curve([remedies[n] for n in combo]), room))
                 for combo in combinations(names, k)]
        ok = [t for t in tried if t[1] >= target]
        if ok:
            return max(ok, key=lambda t: t[1])
    if len(names) > MAX_COMBINATION:
        every = _largest(*curve(list(remedies.values())), room)
        if every >= target:
            return names, every
    return None


def _confidence(f: Facts, axis: str, reserve: float, frag: float, best: float, mid: float,
                loose: float) -> tuple[str, list[str]]:
    why = [f"the trace reserved {reserve:.2f}x what it allocated at its peak; the budget is checked against the "
           f"predicted peak x {reserve:.2f}, {RESERVE_MARGIN:.0%} more for the reserve at another size. Under a cap the allocator frees its unused cached segments before it "
           f"fails, and only the free space inside segments holding live blocks ({frag:.2f}x at the peak) stays: "
           f"the real limit lies between factor {best:.2f} (with the reserve), {mid:.2f} (with that fragmentation) "
           f"and {loose:.2f} (the allocated peak alone)",
           f"the replay's predictions were within {CHECKED_ERROR * 100:.0f} % of real runs on the model families of "
           f"docs/what-if.md"]
    level = 2
    sources = set(f.an.segmentation.sources.values())
    if "inferred" in sources or not sources:
        why.append("phases were inferred, not marked: which blocks are per-token is less sure")
        level -= 1
    if reserve > LOOSE_RESERVE:
        why.append(f"the reserve ({reserve:.2f}x) is large: fragmentation may differ at another size")
        level -= 1
    if axis == "sequence":
        why.append(block_growth(f).evidence)
        if not (block_growth(f).kind == QUADRATIC).any():
            level -= 1  # linear growth is assumed from the absence of evidence, not seen
    return ("low", "medium", "high")[max(level, 0)], why


def format_fits(fx: Fits) -> str:
    lines = [f"what fits in {format_bytes(fx.budget_bytes)} (peak now {format_bytes(fx.peak_bytes)}, "
             f"reserve {fx.reserve_ratio:.2f}x, fragmentation {fx.fragmentation_ratio:.2f}x):"]
    for fit in (fx.batch, fx.sequence):
        if not fit.applies:
            lines.append(f"  {fit.axis}: cannot tell: {fit.why[0]}")
            continue
        lines.append(f"  {fit.axis}: up to x{fit.largest_factor:g} predicted to fit (x{fit.largest_factor_fragmented:g} "
                     f"with fragmentation only, x{fit.largest_factor_allocated:g} without any reserve); "
                     f"confidence {fit.confidence}")
        if fit.next_factor is not None:
            need = (f"fits with {' + '.join(fit.next_fits_with)} (up to x{fit.largest_factor_with:g})"
                    if fit.next_fits_with else "no remedy phasemem knows makes it fit")
            lines.append(f"      x{fit.next_factor:g} would peak at {format_bytes(fit.predicted_peak_bytes_next)}: {need}")
        lines.extend(f"      - {w}" for w in fit.why)
    return "\n".join(lines)
