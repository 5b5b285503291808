"""Two runs compared by meaning: steps aligned, phases aligned by name, shapes matched by kind, the
categories at each side's peak, and the change of the peak split into named causes that add up to it.
Pure functions of two Reports (docs/compare.md).

Example:
    >>> c = phasemem.compare("fixtures/gpt_zero_grad_keep.pkl.xz", "fixtures/gpt_zero_grad_end.pkl.xz")
    >>> c.delta, c.a.peak_phase, c.b.peak_phase
    (-182562816, 'backward', 'backward')
    >>> [(x.cause, x.bytes) for x in c.attribution]
    [('gradient', -182562816)]
"""
from __future__ import annotations

import re
from typing import Any

from ..analysis.patterns import KIND_NAMES
from ..errors import RECORD_HINT, PhasememError
from ..model import Step
from ..vocab import CATEGORIES, PHASES
from .breakdown import Cells, composition, peak_breakdown, phase_at, shape_at, step_at
from .comparison import Cause, Comparison, PhaseDelta, ShapeDelta, Side, Slot, named_floor
from .pipeline import analyze
from .report import Report

#: Two occurrences of a shape are "the same" when their sizes differ by at most this share of the
#: larger: identical H200 runs (gpt_foreach steps 1 and 2) give identical bytes, and a change of
#: 1 % is below what any of the fixtures' one-line changes moved a shape by.
SAME_SHAPE = 0.01
#: The LCS that aligns two steps' phase runs is quadratic: past this many cells the runs are paired
#: by position instead (a step of hundreds of micro-batches; never reached by a fixture).
MAX_ALIGN_CELLS = 250_000


def compare(a: Any, b: Any, *, steps: str | None = None, device: int | None = None, trusted: bool = False,
            marker_prefix: str | None = None, names: tuple[str, str] | None = None) -> Comparison:
    """Compare run B with run A. Each is a path (``analyze`` reads it, without the what-ifs, which a
    comparison does not read), a snapshot dict or a ``Report``.

    ``steps``: ``None`` or ``"steady"`` compares a steady step of each (the complete step after the
    first whose peak is the median of them); ``"3"`` step 3 of both; ``"2:3"`` A's step 2 with B's
    step 3; ``"all"`` the whole recordings (their overall peaks; phases over all steps).

    Example:
        >>> c = phasemem.compare("fixtures/gpt_zero_grad_keep.pkl.xz", "fixtures/gpt_zero_grad_end.pkl.xz")
        >>> c.delta < 0, c.attribution[0].cause
        (True, 'gradient')
    """
    ra, rb = (_as_report(x, device, trusted, marker_prefix) for x in (a, b))
    name_a, name_b = names or (_name(a, "A"), _name(b, "B"))
    for r, n in ((ra, name_a), (rb, name_b)):
        if r.live is not None:
            raise PhasememError(f"{n}: this snapshot holds no allocation history, so it has no steps or phases "
                                f"to compare; {RECORD_HINT}")
    pick_a, pick_b, notes = choose_steps(ra, rb, steps, (name_a, name_b))
    return compare_reports(ra, rb, pick_a, pick_b, (name_a, name_b), notes)


def compare_reports(ra: Report, rb: Report, pick_a: Step | None, pick_b: Step | None,
                    names=("A", "B"), notes=()) -> Comparison:
    """The comparison of two Reports at chosen steps (None: the whole recording)."""
    sa, sb = _side(ra, pick_a, names[0]), _side(rb, pick_b, names[1])
    causes, unexplained = attribute(sa.cells, sb.cells)
    cats = {c: {"a": int(sa.breakdown.by_category.get(c, 0)), "b": int(sb.breakdown.by_category.get(c, 0))}
            for c in CATEGORIES}
    for v in cats.values():
        v["delta"] = v["b"] - v["a"]
    notes = list(notes)
    for n, r in zip(names, (ra, rb)):
        low = sorted(p for p, s in r.sources.items() if s == "inferred")
        if low:
            notes.append(f"{n}: phases {', '.join(low)} were inferred, not marked; their peaks are less sure")
    slots = align_runs(_runs(ra, _drawn(ra, pick_a)), _runs(rb, _drawn(rb, pick_b)))
    phases = phase_deltas(ra, rb, pick_a, pick_b)
    for name in {s.phase for s in slots if s.a is None or s.b is None} & set(phases):
        if any(s.phase == name and s.a is not None for s in slots) and any(
                s.phase == name and s.b is not None for s in slots):
            phases[name].aligned = False  # both ran it, at different places of the step
    return Comparison(a=sa, b=sb, phases=phases, shapes=shape_deltas(ra, rb, pick_a, pick_b),
                      categories=cats, attribution=causes, unexplained_bytes=unexplained, slots=slots,
                      notes=notes, a_report=ra, b_report=rb)


# -- steps ------------------------------------------------------------------------------------------


def steady_step(report: Report) -> Step | None:
    """The complete step after the first whose peak is the median of those (ties: the later); the
    first complete step is left out when there are others (optimizer state, lazy workspaces)."""
    complete = [s for s in report.steps if s.complete]
    pool = complete[1:] if len(complete) >= 2 else (complete or list(report.steps))
    if not pool:
        return None
    med = sorted(s.peak_bytes for s in pool)[(len(pool) - 1) // 2]
    return [s for s in pool if s.peak_bytes == med][-1]


def parse_compare_steps(spec) -> str | tuple[int, int]:
    """``--steps`` of a comparison: "steady" (also for None), "all", or (A's step, B's step) numbers.

    Example:
        >>> parse_compare_steps("3"), parse_compare_steps("2:3"), parse_compare_steps(None)
        ((3, 3), (2, 3), 'steady')
    """
    text = "steady" if spec is None else str(spec).strip()
    if text in ("steady", "all"):
        return text
    m = re.fullmatch(r"(\d+)(?:\s*:\s*(\d+))?", text)
    if m is None:
        raise PhasememError(f"steps={text!r}: give steady, all, a step number (3) or one per side (2:3)")
    return int(m.group(1)), int(m.group(2) or m.group(1))


def choose_steps(ra: Report, rb: Report, spec, names=("A", "B")) -> tuple[Step | None, Step | None, list[str]]:
    """The steps ``spec`` names on each side (None for the whole recording), and what to say about it."""
    want = parse_compare_steps(spec)
    if want == "all" or not ra.steps or not rb.steps:
        why = [] if want == "all" else ["one side has no steps: the whole recordings are compared"]
        return None, None, why
    if want == "steady":
        a, b = steady_step(ra), steady_step(rb)
        assert a is not None and b is not None  # both reports have steps
        return a, b, [f"steady steps compared: {names[0]} step {a.number}, {names[1]} step {b.number}"]
    picked = []
    for r, n, k in zip((ra, rb), names, want):
        got = [s for s in r.steps if s.number == k]
        if not got:
            raise PhasememError(f"steps={spec}: {n} has steps {r.steps[0].number}..{r.steps[-1].number}, not {k}")
        picked.append(got[0])
    return picked[0], picked[1], []


def _as_report(x, device, trusted, marker_prefix) -> Report:
    if isinstance(x, Report):
        return x
    return analyze(x, device, trusted=trusted, marker_prefix=marker_prefix, what_ifs=False)  # a comparison reads none


def _name(x, default: str) -> str:
    return str(x) if isinstance(x, (str, bytes)) or hasattr(x, "__fspath__") else default


# -- one side ---------------------------------------------------------------------------------------


def _side(report: Report, step: Step | None, name: str) -> Side:
    event, cells = composition(report, step)
    bd = peak_breakdown(report, step)
    at = step_at(report, event)
    return Side(name=name, device=report.device, n_events=report.n_events,
                steps=[s.number for s in report.steps] if step is None else [step.number],
                peak_bytes=int(bd.bytes), peak_event=event, peak_step=at.number if at else None,
                peak_phase=phase_at(report, event), peak_shape=shape_at(report, event),
                run_peak_bytes=int(report.peak_bytes), breakdown=bd, sources=dict(report.sources), cells=cells)


# -- the two sides together -------------------------------------------------------------------------


def attribute(ca: Cells, cb: Cells) -> tuple[list[Cause], int]:
    """The peak's change split into named causes, largest first, and the unexplained rest; they add up
    to the change exactly (read category by category: docs/compare.md).

    Example:
        >>> causes, rest = attribute(composition(ra, sa)[1], composition(rb, sb)[1])
        >>> sum(c.bytes for c in causes) + rest == sb.peak_bytes - sa.peak_bytes
        True
    """
    floor = max(named_floor(sum(ca.values()), sum(cb.values())), 1)
    shapes: dict[str, int] = {}
    causes, unexplained = [], 0
    for cat in CATEGORIES:
        d = {k[0]: cb.get(k, 0) - ca.get(k, 0) for k in set(ca) | set(cb) if k[1] == cat}
        total = sum(d.values())
        if abs(total) < floor:
            unexplained += total
            continue
        for kind, v in d.items():
            if kind is not None and abs(v) >= floor:
                shapes[kind] = shapes.get(kind, 0) + v
                total -= v
        if cat != "other" and abs(total) >= floor:
            causes.append(Cause(cat, "category", total))
        else:
            unexplained += total
    causes += [Cause(k, "shape", v) for k, v in shapes.items() if v]
    causes.sort(key=lambda c: -abs(c.bytes))
    return causes, unexplained


def phase_deltas(ra: Report, rb: Report, pa: Step | None, pb: Step | None) -> dict[str, PhaseDelta]:
    """Each phase's peak on both sides, by name, in phase order."""
    fa = ra.phases if pa is None else pa.phases
    fb = rb.phases if pb is None else pb.phases
    out = {}
    for name in _ordered(set(fa) | set(fb), PHASES):
        x, y = (p if p is not None and p.ran else None for p in (fa.get(name), fb.get(name)))
        a_peak = x.peak_bytes if x is not None else None
        b_peak = y.peak_bytes if y is not None else None
        cats = {c: int(y.by_category.get(c, 0)) - int(x.by_category.get(c, 0)) for c in CATEGORIES} if (
            x is not None and y is not None and x.by_category and y.by_category) else {}
        out[name] = PhaseDelta(name, a_peak, b_peak, None if a_peak is None or b_peak is None else b_peak - a_peak,
                               x.peak_event if x else None, y.peak_event if y else None, cats)
    return out


def shape_deltas(ra: Report, rb: Report, pa: Step | None, pb: Step | None) -> list[ShapeDelta]:
    """Shapes matched by (kind, phase): the largest occurrence in the compared steps of each side."""
    xa, xb = _largest_shapes(ra, pa), _largest_shapes(rb, pb)
    order = {k: i for i, k in enumerate(KIND_NAMES)}
    keys = sorted(set(xa) | set(xb), key=lambda k: (order.get(k[0], len(order)), PHASES.index(k[1])
                                                    if k[1] in PHASES else len(PHASES)))
    out = []
    for k in keys:
        a, b = xa.get(k), xb.get(k)
        na, nb = int(a.bytes) if a else 0, int(b.bytes) if b else 0
        if a is None or not na:
            change = "appeared" if nb else "same"
        elif b is None or not nb:
            change = "disappeared"
        else:
            change = "same" if abs(nb - na) <= SAME_SHAPE * max(na, nb) else "changed"
        out.append(ShapeDelta(k[0], k[1], na, nb, change, a.peak_event if a else None, b.peak_event if b else None))
    return out


def _largest_shapes(report: Report, step: Step | None) -> dict:
    out: dict = {}
    for p in report.patterns:
        if step is not None and p.step != step.index:
            continue
        key = (p.kind, p.phase)
        if key not in out or p.bytes > out[key].bytes:
            out[key] = p
    return out


def _ordered(names, vocabulary) -> list[str]:
    known = [n for n in vocabulary if n in names]
    return known + sorted(n for n in names if n not in vocabulary)


# -- aligned runs, for the picture ----------------------------------------------------------------


def _drawn(report: Report, step: Step | None) -> Step | None:
    """The step the picture shows: the compared one, or for the whole recording the one with its peak."""
    return step if step is not None else step_at(report, report.peak_event)


def _runs(report: Report, step: Step | None) -> list[tuple[int, int, str]]:
    if step is None:
        return [(r[0], r[1], r[2]) for r in report.label_runs()]
    return [(r[0], r[1], r[2]) for r in report.label_runs() if r[3] == step.index]


def align_runs(ra: list[tuple[int, int, str]], rb: list[tuple[int, int, str]]) -> list[Slot]:
    """Both sides' phase runs in one order: the longest common sequence of phase names shares slots,
    a run only one side has gets a slot of its own where it ran (A's before B's in one gap).

    Example:
        >>> [s.phase for s in align_runs([(0, 9, "forward"), (10, 19, "backward")], [(0, 9, "forward")])]
        ['forward', 'backward']
    """
    n, m = len(ra), len(rb)
    if n * m > MAX_ALIGN_CELLS:
        pairs = list(zip(range(min(n, m)), range(min(n, m))))
    else:
        pairs = _lcs([r[2] for r in ra], [r[2] for r in rb])
    out, i, j = [], 0, 0
    for pi, pj in pairs + [(n, m)]:
        out += [Slot(ra[k][2], ra[k][:2], None) for k in range(i, pi)]
        out += [Slot(rb[k][2], None, rb[k][:2]) for k in range(j, pj)]
        if pi < n and pj < m:
            out.append(Slot(ra[pi][2], ra[pi][:2], rb[pj][:2]))
        i, j = pi + 1, pj + 1
    _span(out, "a", "b")
    _span(out, "b", "a")
    return out


def _span(slots: list[Slot], side: str, other: str) -> None:
    """Where ``side`` ran a phase in two pieces with something else between (loss, zero_grad, loss) and
    ``other`` ran it in one, split ``other``'s run between the two pieces in proportion to their events,
    so the same work is drawn in the same place (``zero_grad_before``'s loss against base's)."""
    for i, s in enumerate(slots):
        if getattr(s, side) is None or getattr(s, other) is None:
            continue
        j = i + 1
        while j < len(slots) and getattr(slots[j], other) is None and slots[j].phase != s.phase:
            j += 1
        if j == i + 1 or j == len(slots) or getattr(slots[j], other) is not None or getattr(slots[j], side) is None:
            continue
        (f, last), (a0, a1), (b0, b1) = getattr(s, other), getattr(s, side), getattr(slots[j], side)
        n = last - f + 1
        if n < 2:
            continue
        k = min(max(round(n * (a1 - a0 + 1) / (a1 - a0 + b1 - b0 + 2)), 1), n - 1)
        setattr(s, other, (f, f + k - 1))
        setattr(slots[j], other, (f + k, last))


def _lcs(x: list[str], y: list[str]) -> list[tuple[int, int]]:
    n, m = len(x), len(y)
    t = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            t[i][j] = t[i + 1][j + 1] + 1 if x[i] == y[j] else max(t[i + 1][j], t[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if x[i] == y[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif t[i + 1][j] >= t[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs
