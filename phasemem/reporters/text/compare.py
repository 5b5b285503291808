"""A comparison as text (``print(comparison)``, ``phasemem diff``): the headline and its main cause,
each phase's peak on both sides, the shapes that changed, the categories at the peak, and the peak's
change by cause.

Example:
    >>> print(format_comparison(phasemem.compare("base.pickle", "new.pickle")))
"""
from __future__ import annotations

from ...report.comparison import Cause, Comparison, Side, headline, named_floor
from ...units import format_bytes, pct, signed
from ...vocab import AT_PEAK, CATEGORY_NAMES

#: What the shapes' figures are (``ShapeDelta.a_bytes``, ``b_bytes``): each side's largest occurrence, whole;
#: the causes' are the bytes alive at each peak (vocab.AT_PEAK), so a shape's two figures differ.
SHAPE_SIZES = "each side's largest, whole"


def format_comparison(c: Comparison) -> str:
    """The comparison's text: a line per phase, shape, category and cause, under the headline."""
    lines = [f"phasemem diff — A: {c.a.name} ({_steps(c.a)}) vs B: {c.b.name} ({_steps(c.b)})", headline(c)]
    main = c.main_cause()
    if main is not None:
        what = main["cause"] if main["type"] != "category" else (
            f"{CATEGORY_NAMES.get(main['cause'], main['cause'])} outside the named shapes")
        lines.append(f"main cause: {what} {signed(main['bytes'])} {AT_PEAK}" if main["where"] == "peak" else
                     f"the peak did not move; the largest change is {main['where']}'s peak "
                     f"{signed(main['phase_delta'])}, mostly {what} {signed(main['bytes'])}")
    lines += [f"note: {n}" for n in c.notes]
    head = f"{'phase':<10} {'A peak':>11} {'B peak':>11} {'Δ':>11} {'Δ %':>8}"
    lines += ["", head, "-" * len(head)]
    for p in c.phases.values():
        a = format_bytes(p.a_peak) if p.a_peak is not None else "—"
        b = format_bytes(p.b_peak) if p.b_peak is not None else "—"
        d = signed(p.delta) if p.delta is not None else "—"
        moved = "" if p.aligned else "  (ran elsewhere in the step)"
        lines.append(f"{p.name:<10} {a:>11} {b:>11} {d:>11} {pct(p.delta, p.a_peak):>8}{moved}")
    lines.append(f"{'peak':<10} {format_bytes(c.a.peak_bytes):>11} {format_bytes(c.b.peak_bytes):>11} "
                 f"{signed(c.delta):>11} {pct(c.delta, c.a.peak_bytes):>8}")
    changed = [s for s in c.shapes if s.change != "same"]
    lines += ["", f"shapes ({SHAPE_SIZES}):" if changed else "shapes: none changed"]
    lines += [f"  {s.change:<12} {s.phase:<10} {s.said()}" for s in changed]
    lines += ["", f"{'category at the peak':<22} {'A':>11} {'B':>11} {'Δ':>11}"]
    lines += [f"  {CATEGORY_NAMES.get(k, k):<20} {format_bytes(v['a']):>11} {format_bytes(v['b']):>11} "
              f"{signed(v['delta']):>11}" for k, v in c.categories.items() if v["a"] or v["b"]]
    lines += ["", f"the peak's change {signed(c.delta)}, by cause ({AT_PEAK} on each side):"]
    lines += [f"  {_cause(x):<44} {signed(x.bytes):>11}" for x in c.attribution]
    small = f"unexplained (other; causes under {format_bytes(named_floor(c.a.peak_bytes, c.b.peak_bytes))})"
    lines.append(f"  {small:<44} {signed(c.unexplained_bytes):>11}")
    return "\n".join(lines)


def _cause(x: Cause) -> str:
    return f"shape {x.cause}" if x.type == "shape" else f"{CATEGORY_NAMES.get(x.cause, x.cause)} outside the shapes"


def _steps(s: Side) -> str:
    return f"step {s.steps[0]}" if len(s.steps) == 1 else f"all {len(s.steps)} steps"
