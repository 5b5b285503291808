"""Memory budgets, as ``--fail-if`` takes them: ``peak>20GiB``, ``optimizer.peak>6GiB``,
``activation>3GiB`` (a category at the peak), ``logits>1GiB`` (a shape's size), and against a base
run ``peak>+5%``, ``backward.peak>+512MiB``. Parsed in one place for ``phasemem analyze``,
``phasemem diff`` and the pytest marker; anything that does not parse, or names no phase, category
or shape, is a PhasememError (exit 2), never a pass.

Example:
    >>> b = parse_budget("backward.peak>+512MiB")
    >>> b.target, b.name, b.relative, b.limit
    ('phase', 'backward', True, 536870912.0)
    >>> check_report([parse_budget("peak>20GiB")], report)
    []
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ..analysis.patterns import KIND_NAMES
from ..errors import PhasememError
from ..units import SIZE_VALUE, format_bytes, parse_size, unit_bytes  # noqa: F401 - parse_size stays importable from here
from ..vocab import CATEGORIES, PHASES
from .breakdown import peak_breakdown, shape_at, step_at
from .comparison import Comparison, pct, signed
from .report import Report

_EXPR = re.compile(r"\s*([A-Za-z_]+)(?:\.([A-Za-z_]+))?\s*(>=|<=|>|<)\s*(.*?)\s*")
_SYNTAX = ("write NAME>LIMIT: peak>20GiB, backward.peak>+512MiB, peak>+5%, activation>3GiB, logits>1GiB "
           "(NAME: peak, PHASE.peak, a category or a shape kind)")
_OPS = {">": lambda v, lim: v > lim, ">=": lambda v, lim: v >= lim,
        "<": lambda v, lim: v < lim, "<=": lambda v, lim: v <= lim}


@dataclass(frozen=True)
class Budget:
    """One budget: what it measures (``target``: peak, phase, category, shape; ``name``), the test that
    breaks it (``op``, ``limit`` in bytes, or percent), and whether it is against a base run."""

    text: str
    target: str
    name: str
    op: str
    limit: float
    relative: bool = False
    percent: bool = False

    def limit_text(self) -> str:
        if self.percent:
            return f"{self.limit:+g} %"
        return signed(int(self.limit)) if self.relative else format_bytes(self.limit)


def parse_budget(text: str) -> Budget:
    """A ``--fail-if`` expression as a Budget; a clear PhasememError for anything else.

    A limit with a sign or a ``%`` is relative to a base run (``phasemem diff``: B − A); a plain size is
    an absolute limit (on the run, or on B).

    Example:
        >>> parse_budget("peak>+5%").percent, parse_budget("optimizer.peak > 6 GiB").limit
        (True, 6442450944.0)
    """
    m = _EXPR.fullmatch(str(text))
    if m is None:
        raise PhasememError(f"budget {text!r} does not parse: {_SYNTAX}")
    name, attr, op, value = m.group(1).lower(), (m.group(2) or "").lower(), m.group(3), m.group(4)
    target = _target(text, name, attr)
    v = SIZE_VALUE.fullmatch(value)
    if v is None:
        raise PhasememError(f"budget {text!r}: the limit {value!r} is not a size or a percentage: {_SYNTAX}")
    sign, number, unit = v.group(1), float(v.group(2)), v.group(3)
    percent = unit == "%"
    limit = number if percent else number * unit_bytes(unit, text)
    if not math.isfinite(limit):
        raise PhasememError(f"budget {text!r}: the limit is not a finite number")
    return Budget(text=str(text).strip(), target=target, name=name, op=op,
                  limit=-limit if sign == "-" else limit, relative=bool(sign) or percent, percent=percent)


def _target(text, name: str, attr: str) -> str:
    if attr:
        if attr != "peak":
            raise PhasememError(f"budget {text!r}: '.{attr}' is not something phasemem measures; a phase has "
                                f"a .peak ({name}.peak)")
        if name not in PHASES:
            raise PhasememError(f"budget {text!r}: no phase {name!r}; phases are {', '.join(PHASES)}")
        return "phase"
    if name == "peak":
        return "peak"
    if name in CATEGORIES:
        return "category"
    if name in KIND_NAMES:
        return "shape"
    if name in PHASES:
        raise PhasememError(f"budget {text!r}: {name} is a phase; write {name}.peak")
    raise PhasememError(f"budget {text!r}: {name!r} is no phase, category or shape; categories are "
                        f"{', '.join(CATEGORIES)}; shapes are {', '.join(KIND_NAMES)}")


def budget_for(name: str, limit) -> Budget:
    """The budget a keyword names, as the pytest marker takes them: ``peak="2 GiB"``, a phase's peak
    (``backward="1.5 GiB"``), a category at the peak (``activation=...``) or a shape (``logits=...``).

    Example:
        >>> budget_for("backward", "1.5 GiB").text, budget_for("backward", "1.5 GiB").target
        ('backward=1.5 GiB', 'phase')
    """
    key = f"{name}.peak" if name in PHASES and name not in CATEGORIES else name
    try:
        size = parse_size(limit)
    except PhasememError as e:
        raise PhasememError(f"budget {name}={limit!r}: {e}") from None
    return replace(parse_budget(f"{key}>{size}"), text=f"{name}={limit}")


def parse_budgets(texts, *, absolute: bool = False) -> list[Budget]:
    """Every ``--fail-if`` text parsed, before any analysis; ``absolute``: one run, no base to compare with."""
    budgets = [parse_budget(t) for t in texts]
    if absolute:
        require_absolute(budgets)
    return budgets


def require_absolute(budgets: list[Budget]) -> None:
    """One run has nothing to be relative to: a signed or percent limit needs ``phasemem diff``."""
    for b in budgets:
        if b.relative:
            raise PhasememError(f"budget {b.text!r} is relative to a base run; check it with phasemem diff BASE NEW, "
                                f"or give an absolute size here (peak>20GiB)")


# -- one run --------------------------------------------------------------------------------------


def check_report(budgets: list[Budget], report: Report) -> list[str]:
    """One line per budget ``report`` breaks (absolute budgets only), saying where.

    Example:
        >>> check_report([parse_budget("backward.peak>1GiB")], report)
        ['over budget: backward.peak>1GiB: backward peak 1.81 GiB (limit 1.00 GiB), at step 1, ...']
    """
    require_absolute(budgets)
    out = []
    for b in budgets:
        value, label, event = _measure(b, report)
        if _OPS[b.op](value, b.limit):
            out.append(f"over budget: {b.text}: {label} {format_bytes(value)} (limit {format_bytes(b.limit)})"
                       + _where(report, event))
    return out


def _measure(b: Budget, report: Report) -> tuple[int, str, int | None]:
    if report.live is not None and b.target != "peak":
        raise PhasememError(f"budget {b.text!r}: this snapshot has no allocation history, so no phases, "
                            f"categories or shapes; only peak can be checked")
    if b.target == "peak":
        return int(report.peak_bytes), "peak", (report.peak_event if report.live is None else None)
    if b.target == "phase":
        ph = report.phases.get(b.name)
        if ph is None:
            ran = ", ".join(report.phases) or "none"
            raise PhasememError(f"budget {b.text!r}: this run has no {b.name} phase (phases: {ran}); "
                                f"it cannot be checked")
        return int(ph.peak_bytes), f"{b.name} peak", ph.peak_event
    if b.target == "category":
        return int(report.by_category.get(b.name, 0)), f"{b.name} at the peak", report.peak_event
    top = max(report.patterns_of(b.name), key=lambda p: p.bytes, default=None)
    return (int(top.bytes) if top else 0), f"shape {b.name}", (top.peak_event if top else None)


def _where(report: Report, event: int | None) -> str:
    """``, at step 1 backward (logits_release); shapes alive there: logits 250.0 MiB``."""
    if event is None or report.live is not None:
        return ""
    st = step_at(report, event)
    if st is None:
        return f", at event {event}"
    ph = next((p.name for p in st.phases.values() if p.peak_event == event), None)
    shape = shape_at(report, event)
    said = f", at step {st.number}" + (f" {ph}" if ph else "") + (f" ({shape})" if shape else "")
    alive = peak_breakdown(report, st).by_shape if st.peak_event == event else {}
    if alive:
        said += "; shapes alive there: " + ", ".join(
            f"{k} {format_bytes(v)}" for k, v in sorted(alive.items(), key=lambda kv: -kv[1]))
    return said


# -- two runs -------------------------------------------------------------------------------------


def check_comparison(budgets: list[Budget], c: Comparison) -> list[str]:
    """One line per budget the comparison breaks: relative ones on B − A, absolute ones on B.

    Example:
        >>> check_comparison([parse_budget("peak>+5%")], phasemem.compare(base, new))
        ['over budget: peak>+5%: peak 1.56 GiB → 1.73 GiB (+174.1 MiB, +10.9 %); peak at backward (logits_release); ...']
    """
    out = []
    for b in budgets:
        a_val, b_val, label, why = _measure_both(b, c)
        if not b.relative:
            if _OPS[b.op](b_val, b.limit):
                out.append(f"over budget: {b.text}: {label} of B {format_bytes(b_val)} (limit {format_bytes(b.limit)}){why}")
            continue
        d = b_val - a_val
        value = d if not b.percent else (100.0 * d / a_val if a_val else math.copysign(math.inf, d) if d else 0.0)
        if _OPS[b.op](value, b.limit):
            out.append(f"over budget: {b.text}: {label} {format_bytes(a_val)} → {format_bytes(b_val)} "
                       f"({signed(d)}, {pct(d, a_val) if a_val else 'new'}){why}")
    return out


def _measure_both(b: Budget, c: Comparison) -> tuple[int, int, str, str]:
    if b.target == "peak":
        main = c.main_cause()
        why = f"; peak at {c.b.peak_phase}" + (f" ({c.b.peak_shape})" if c.b.peak_shape else "")
        if main and main["where"] == "peak":
            why += f"; main cause {main['cause']} {signed(main['bytes'])}"
        return c.a.peak_bytes, c.b.peak_bytes, "peak", why
    if b.target == "phase":
        ph = c.phases.get(b.name)
        if ph is None or ph.a_peak is None or ph.b_peak is None:
            which = "either run" if ph is None else ("A" if ph.a_peak is None else "B")
            raise PhasememError(f"budget {b.text!r}: {b.name} did not run in {which}; it cannot be checked")
        moved = sorted((s for s in c.shapes if s.phase == b.name and s.change != "same"), key=lambda s: -abs(s.delta))
        why = f"; shapes there: {', '.join(s.said() for s in moved[:3])}" if moved else ""
        return ph.a_peak, ph.b_peak, f"{b.name} peak", why
    if b.target == "category":
        v = c.categories.get(b.name, {"a": 0, "b": 0})
        return v["a"], v["b"], f"{b.name} at the peak", ""
    mine = [s for s in c.shapes if s.kind == b.name]
    return (max((s.a_bytes for s in mine), default=0), max((s.b_bytes for s in mine), default=0),
            f"shape {b.name}", "")
