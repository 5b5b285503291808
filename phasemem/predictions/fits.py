"""What fits on a card of a given size: the largest batch and sequence factor, solved from the trace.

Every block grows with the tokens as ``scaling.growth`` says (constant, linear, quadratic in the
sequence). What a capped card runs out of is not the allocated peak but the caching allocator's
segments: the trace's allocations and frees, each block at its size for a factor, are replayed through
PyTorch's caching allocator (``phasemem.predictions.allocator``) under the budget as the cap on what it reserves,
and the largest factor that does not run out of memory is found by bisection. Where the allocator
cannot be replayed (expandable segments), the budget is read against the trace's reserve ratio, as
before. Remedies compose with the scaling (the replay with both applied), so the answer can name the
remedies that would let the next factor fit; a caller's own changes (``changes``: a parallel plan's)
are applied before everything.

Example:
    >>> fit = fits(report.analysis, report.patterns, 80 << 30)
    >>> fit.batch.largest_factor, fit.batch.next_factor, fit.batch.next_fits_with
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from itertools import combinations

import numpy as np

from . import allocator
from ..analysis.core import Analysis
from ..errors import PhasememError
from ..model import Pattern
from .replay import points
from .scaling import CONSTANT, LINEAR, QUADRATIC
from ..read.trace import A
from ..units import format_bytes
from ..vocab import PHASES
from .remedies import REMEDIES, block_growth
from .blocks import Change, Facts

#: Factors a user tries (the largest of them that fits is named, and the next one up is what the
#: remedies are asked to make fit).
FACTOR_GRID = (0.25, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: Remedies tried together at most (2 of 6: 21 replays; more are tried only greedily).
MAX_COMBINATION = 2
#: The reserve ratio above which fragmentation dominates what a cap allows: the answer is less sure
#: (fixtures/pairs/base: 1.15 reserved over allocated, its steady steps; the CNNs of the fixtures ~1.1).
#: Read only where the allocator is not replayed.
LOOSE_RESERVE = 1.25
#: Where the allocator is not replayed (expandable segments): the reserve at another size can exceed
#: the trace's: capacity run 2's llama at batch 14 reserved 1.20 x what it allocated under the cap where
#: its B 4 trace reserved 1.17 x (+2.3 %), and ran out of memory 0.9 % under the budget its replay gave.
#: The answer keeps this much more room.
RESERVE_MARGIN = 0.03
#: What the replay's predictions missed by at most, on the real runs of docs/what-if.md (50 remedy and
#: scale runs of fixtures/pairs and pairs2, `python3 docs/eval_whatif.py`: worst llama's chunked CE over
#: 8 chunks, -2.96 %, held out); the README says the same. The issues' target was 5 %.
CHECKED_ERROR = 0.03
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


@dataclass
class Fit:
    """The answer along one axis (batch or sequence)."""

    axis: str
    applies: bool
    largest_factor: float | None = None  # the allocator, replayed under the budget, does not run out
    largest_factor_fragmented: float | None = None  # the allocated peak with the fragmentation seen at the trace's peak
    largest_factor_allocated: float | None = None  # the allocated peak alone within the budget (the loose bound)
    largest_listed: float | None = None  # the largest of FACTOR_GRID up to largest_factor
    next_factor: float | None = None  # the next of FACTOR_GRID above it
    predicted_peak_bytes_next: int | None = None  # allocated, at next_factor, no remedy
    next_fits_with: list[str] | None = None  # remedies that make next_factor fit (None: none found)
    largest_factor_with: float | None = None  # the largest factor with those remedies
    fails_at: dict | None = None  # just above largest_factor: where the replayed allocator runs out
    fits_again: list[float] | None = None  # [from, up to]: larger factors that fit again past that gap
    confidence: str = "low"  # high, medium, low
    why: list[str] = field(default_factory=list)


@dataclass
class Fits:
    """``report.fits(budget)``: the largest batch and sequence predicted to fit in ``budget_bytes``."""

    budget_bytes: int
    peak_bytes: int
    reserve_ratio: float  # reserved over allocated at the trace's peak
    fragmentation_ratio: float  # (allocated + free bytes inside segments that hold live blocks) / allocated
    batch: Fit
    sequence: Fit
    allocator: str = ""  # how the allocator replay reproduced the trace at factor 1, or why it is not replayed

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return format_fits(self)


def fits(an: Analysis, patterns: list[Pattern], budget: int, changes: list[Change] | None = None) -> Fits:
    """The largest batch and sequence factors at which the trace, replayed through PyTorch's caching
    allocator with the budget as its cap, does not run out of memory; and the remedies that would let
    the next factor fit. ``changes`` (``remedy_facts.Change``: sizes, frees, added blocks, e.g. a
    parallel plan's) are applied first, to every replay.

        >>> fits(report.analysis, report.patterns, 24 << 30).batch.largest_factor
    """
    budget = int(budget)
    if budget <= 0:
        raise PhasememError(f"a budget of {budget} B: give the card's memory, such as 80GiB")
    peak = int(an.timeline.level.max()) if len(an.trace) else 0
    if not len(an.trace):
        no = Fit("batch", False, why=["the trace has no events"])
        return Fits(budget, 0, 1.0, 1.0, no, Fit("sequence", False, why=["the trace has no events"]))
    f = Facts(an, patterns)
    base = list(changes or [])
    reserve = _reserve(an, peak)
    frag = min(reserve, fragmentation(an))
    g = block_growth(f)
    names = _applicable(f)
    capped = _Capped.of(f, base)
    said = capped.checked if isinstance(capped, _Capped) else capped
    blocks = _blocks(f, base)  # one set of arrays for both axes: their replays are shared where alike
    out = []
    for axis in ("batch", "sequence"):
        if not (g.kind != CONSTANT).any():
            out.append(Fit(axis, False, why=["no block made in forward or backward grows with the tokens here"]))
            continue
        if axis == "sequence" and not g.sequence_known:
            out.append(Fit(axis, False, why=[g.evidence]))
            continue
        out.append(_solve(f, axis, budget, reserve, frag, names, base, capped, blocks))
    return Fits(budget, peak, reserve, frag, out[0], out[1], said)


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


def _blocks(f: Facts, changes: list[Change]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every block once ``changes`` are applied together (sizes multiplied by each one's ratio, frees
    the earliest, blocks added): alloc events, free events, sizes at factor 1 and growth kinds; the
    trace's blocks first, in Lifetimes order."""
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
        settings = allocator.Settings.of(tr)
        if isinstance(settings, str):
            return settings
        n = len(tr)
        start, stop = 0, n
        steps = an.segmentation.steps
        if n > WHOLE_TRACE_EVENTS and steps:
            k = int(an.step_of[int(np.argmax(an.timeline.level))])
            if k >= 0:
                start, stop = int(steps[max(k - 1, 0)][0]), int(steps[k][1])
        layout = allocator.layout_at(tr, life, start)
        if not layout.known:
            return ("the snapshot's segments are not known here (a slice of steps: --steps; an .npz converted before "
                    "they were kept), so the allocator cannot start from the state it was in: not replayed")
        if len(layout.unplaced):
            return (f"{len(layout.unplaced)} blocks alive at the start of the replay lie in no segment the snapshot "
                    f"lists, so the allocator cannot start from the state it was in: not replayed")
        outside = allocator.outside_segments(tr, layout)
        if outside:
            return (f"{outside} of the trace's allocations lie in no segment of the allocator's (a trace not of "
                    f"PyTorch's CUDA caching allocator: the CPU profiler's, or one built by hand): not replayed")
        stream = allocator.block_streams(tr, life)
        cap = cls(f, settings, layout, start, stop, allocator.empty_cache_events(tr), stream, "")
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

    def run(self, alloc, free, size, kind, cap, factor: float, axis: str) -> allocator.Replay:
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
        r = allocator.replay(w_alloc, w_free, scaled, w_stream, w_layout, cap, self.settings, self.start, self.stop,
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

    def largest(self, blocks, budget: int, axis: str, hi: float) -> tuple[float, float, allocator.Replay | None]:
        """The largest factor (to FACTOR_PRECISION) up to which the replay does not run out of memory,
        at most ``hi``; the factor just above it that ran out, and that replay (None: none did).
        Running out is not monotone in the factor (a size that splits the cached blocks worse runs out
        where a larger one fits), so the factors are walked up from 1, in steps as long as the reserved
        bytes leave room for (SCAN_STEPS), to the first that runs out; then halved between it and the
        last that fitted."""
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

    def beyond(self, blocks, budget: int, axis: str, failed: float, hi: float) -> tuple[float, float] | None:
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


def _solve(f: Facts, axis: str, budget: int, reserve: float, frag: float, remedies: dict[str, Change],
           base: list[Change], capped, blocks) -> Fit:
    def curve(changes):
        c, lin, quad = _parts(f, base + changes)
        return (c, lin + quad, np.zeros_like(quad)) if axis == "batch" else (c, lin, quad)

    plain = curve([])
    loose = _largest(*plain, budget)
    fit = Fit(axis, True, largest_factor_fragmented=round(_largest(*plain, budget / frag), 3),
              largest_factor_allocated=round(loose, 3))
    if isinstance(capped, _Capped):
        best, above, failed = capped.largest(blocks, budget, axis, loose)
        if failed is not None:
            fit.fails_at = _failure(f, failed, above)
            again = capped.beyond(blocks, budget, axis, above, loose)
            if again is not None:
                fit.fits_again = [round(again[0], 3), round(again[1], 3)]

        def fits_with(changes, target):
            """(the target fits with these changes, the largest factor they allow); the largest is
            replayed for the chosen changes only (``_remedies_for``)."""
            bound = _largest(*curve(changes), budget)
            if bound < target:  # the allocated peak alone is over the budget
                return False, bound, bound
            b = _blocks(f, base + changes)
            if capped.run(*b, budget, target, axis).oom_event is not None:
                return False, bound, bound
            return True, bound, lambda: capped.largest(b, budget, axis, bound)[0]
    else:
        room = budget / (reserve * (1 + RESERVE_MARGIN))
        best = _largest(*plain, room)

        def fits_with(changes, target):
            x = _largest(*curve(changes), room)
            return x >= target, x, x
    fit.largest_factor = round(best, 3)
    listed = [x for x in FACTOR_GRID if x <= best]
    fit.largest_listed = listed[-1] if listed else None
    nxt = next((x for x in FACTOR_GRID if x > best), None)
    fit.next_factor = nxt
    if nxt is not None:
        fit.predicted_peak_bytes_next = _at(*plain, nxt)
        found = _remedies_for(fits_with, remedies, nxt)
        if found is not None:
            fit.next_fits_with, fit.largest_factor_with = found[0], round(found[1], 3)
    fit.confidence, fit.why = _confidence(f, axis, reserve, frag, best, fit.largest_factor_fragmented, loose, capped)
    return fit


def _failure(f: Facts, r: allocator.Replay, factor: float) -> dict:
    """Where the replay just above the answer ran out of memory: the factor, the event, its phase and
    the segment the allocator asked for (what torch's error says it "tried to allocate")."""
    e = int(r.oom_event)
    phase = PHASES[int(f.an.labels[e])] if 0 <= e < f.n else "unknown"
    return {"factor": round(factor, 4), "event": e, "phase": phase, "request_bytes": int(r.oom_size)}


def _remedies_for(fits_with, remedies: dict[str, Change], target: float):
    """The fewest remedies (then the most room) under which ``target`` fits: (names, largest factor).
    ``fits_with(changes, target)``: (whether target fits, a bound to rank by, the largest factor: a
    number, or a function that replays it, called for the chosen remedies only). Up to MAX_COMBINATION
    remedies together, then all of them."""
    names = list(remedies)
    combos = [list(c) for k in range(1, min(MAX_COMBINATION, len(names)) + 1) for c in combinations(names, k)]
    if len(names) > MAX_COMBINATION:
        combos.append(names)
    for k in sorted({len(c) for c in combos}):
        ok = [(c, *rest) for c in combos if len(c) == k
              for good, *rest in [fits_with([remedies[n] for n in c], target)] if good]
        if ok:
            chosen, _, largest = max(ok, key=lambda t: t[1])
            return chosen, largest() if callable(largest) else largest
    return None


def _confidence(f: Facts, axis: str, reserve: float, frag: float, best: float, mid: float,
                loose: float, capped) -> tuple[str, list[str]]:
    level = 2
    if isinstance(capped, _Capped):
        why = [f"the trace's allocations and frees, each block at its size for the factor, replayed through "
               f"PyTorch's caching allocator (torch 2.11's rules) with the budget as the cap on the bytes it has "
               f"reserved (torch.cuda.set_per_process_memory_fraction): up to factor {best:.3f} it does not run out "
               f"of memory; the allocated peak alone would allow {loose:.3f}",
               capped.checked,
               "the budget is what the allocator may reserve: the CUDA context, other processes and memory "
               "allocated outside PyTorch are not in it"]
        if not capped.exact:
            level -= 1
    else:
        why = [f"the allocator is not replayed ({capped}); the trace reserved {reserve:.2f}x what it allocated at "
               f"its peak; the budget is checked against the predicted peak x {reserve:.2f}, {RESERVE_MARGIN:.0%} "
               f"more for the reserve at another size: the real limit lies between factor {best:.2f} (with the "
               f"reserve), {mid:.2f} (with the fragmentation at the peak) and {loose:.2f} (the allocated peak alone)"]
        if reserve > LOOSE_RESERVE:
            why.append(f"the reserve ({reserve:.2f}x) is large: fragmentation may differ at another size")
            level -= 1
    why.append(f"the replay's allocated-peak predictions were within {CHECKED_ERROR * 100:.0f} % of real runs on "
               f"the model families of docs/what-if.md")
    sources = set(f.an.segmentation.sources.values())
    if "inferred" in sources or not sources:
        why.append("phases were inferred, not marked: which blocks are per-token is less sure")
        level -= 1
    if axis == "sequence":
        why.append(block_growth(f).evidence)
        if not (block_growth(f).kind == QUADRATIC).any():
            level -= 1  # linear growth is assumed from the absence of evidence, not seen
    return ("low", "medium", "high")[max(level, 0)], why


def format_fits(fx: Fits) -> str:
    lines = [f"what fits in {format_bytes(fx.budget_bytes)} (peak now {format_bytes(fx.peak_bytes)}, "
             f"reserve {fx.reserve_ratio:.2f}x):"]
    for fit in (fx.batch, fx.sequence):
        if not fit.applies:
            lines.append(f"  {fit.axis}: cannot tell: {fit.why[0]}")
            continue
        lines.append(f"  {fit.axis}: up to x{fit.largest_factor:g} predicted to fit "
                     f"(x{fit.largest_factor_allocated:g} by the allocated peak alone); confidence {fit.confidence}")
        if fit.fails_at:
            fa = fit.fails_at
            lines.append(f"      at x{fa['factor']:g} the allocator runs out in {fa['phase']} (event {fa['event']}), "
                         f"asking for a segment of {format_bytes(fa['request_bytes'])}")
        if fit.fits_again:
            lines.append(f"      larger sizes fit again from x{fit.fits_again[0]:g} up to x{fit.fits_again[1]:g}: the "
                         f"cached blocks split better there (not every size between is replayed)")
        if fit.next_factor is not None:
            need = (f"fits with {' + '.join(fit.next_fits_with)} (up to x{fit.largest_factor_with:g})"
                    if fit.next_fits_with else "no remedy phasemem knows makes it fit")
            lines.append(f"      x{fit.next_factor:g} would peak at {format_bytes(fit.predicted_peak_bytes_next)}: {need}")
        lines.extend(f"      - {w}" for w in fit.why)
    return "\n".join(lines)
