"""The short report, ``str(report)``: a screen or two at any trace size (issue 40: at 1M events the
whole report ran to 5,000–26,000 lines). The peak and what fills it, the typical step with its
phases, the steps that differ from it and how, each shape kind once with its count and the range of
its size, the notes. ``report.text(full=True)`` (``phasemem analyze --full``) is everything.

Example:
    >>> print(format_report(report))              # the short one
    >>> print(format_report(report, full=True))   # every step, every shape
"""
from __future__ import annotations

from ...analysis.patterns import KIND_NAMES, shape_size_label
from ...analysis.typical import Typical, ranges, typical
from ...model import Pattern
from ...report.report import Report
from ...units import format_bytes, signed
from ...vocab import AT_PEAK
from .full import format_full, format_live, header, oom_line, phase_at, step_table

#: Lines of each part at most, so that the report stays a screen or two whatever the trace holds:
#: out-of-memory events (each 2 to 5 lines), notes, and groups of steps that differ from the typical one.
MAX_OOMS = 3
MAX_NOTES = 10
MAX_GROUPS = 10
#: Where the rest is.
FULL_HINT = "(every step and every shape: phasemem analyze --full, or print(report.text(full=True)))"


def format_report(r: Report, full: bool = False) -> str:
    """The report as text: short (a screen or two), or ``full`` (every step and every shape)."""
    if full:
        return format_full(r)
    if r.live is not None:
        return format_live(r)
    lines = [oom_line(r, o) for o in r.ooms[:MAX_OOMS]]
    if len(r.ooms) > MAX_OOMS:
        lines.append(f"… and {len(r.ooms) - MAX_OOMS} more out-of-memory events")
    lines += header(r) + [f"note: {n}" for n in r.notes[:MAX_NOTES]]
    if len(r.notes) > MAX_NOTES:
        lines.append(f"… and {len(r.notes) - MAX_NOTES} more notes")
    t = typical(r.steps, r.patterns, lambda e: phase_at(r, e))
    if t is not None:
        lines += _typical_lines(r, t)
    if r.patterns:
        lines += ["", f"shapes, each kind once (how many; each one's size, and what it measures; {AT_PEAK}):"]
        lines += kind_lines(r, t)
    if len(r.steps) > 1 or len(r.patterns) > len({p.kind for p in r.patterns}):
        lines += ["", FULL_HINT]
    return "\n".join(lines)


def _typical_lines(r: Report, t: Typical) -> list[str]:
    s = t.step
    if len(r.steps) == 1:
        title = f"the one step, step {s.number}:"
    else:
        alike = f"one of {len(t.alike):,} steps alike: {ranges([x.number for x in t.alike])}" if len(t.alike) > 1 \
            else "no other step is like it"
        title = f"typical step: step {s.number} ({alike}; {len(r.steps):,} steps in all)"
    lines = ["", title] + step_table(r, [s])[1:]
    if t.differ:
        lines += ["", "steps that differ from it (peak against its peak, " f"{format_bytes(s.peak_bytes)}):"]
        for d in t.differ[:MAX_GROUPS]:
            lines.append("  " + _differ_line(d.steps, d.how, s.peak_bytes))
        left = t.differ[MAX_GROUPS:]
        if left:
            n = sum(len(d.steps) for d in left)
            lines.append(f"  … and {n:,} more steps that differ in {len(left)} other ways")
    return lines


def _differ_line(steps, how, peak: int) -> str:
    numbers = [x.number for x in steps]
    lo, hi = min(x.peak_bytes for x in steps), max(x.peak_bytes for x in steps)
    which = f"step {numbers[0]}" if len(numbers) == 1 else f"steps {ranges(numbers)} ({len(numbers):,})"
    figure = (f"peak {format_bytes(lo)} ({signed(lo - peak)})" if lo == hi else
              f"peak {format_bytes(lo)}–{format_bytes(hi)} ({signed(lo - peak)} to {signed(hi - peak)})")
    return f"{which}: {'; '.join(how)} — {figure}"


def kind_lines(r: Report, t: Typical | None) -> list[str]:
    """Each shape kind once (a line per measure: zero_grad's release of the gradients is counted
    apart from backward's gradients): how many, the range of their sizes, what of them is alive at
    the peak, and one of them explained (the typical step's where it has one)."""
    groups: dict[tuple[str, str], list[Pattern]] = {}
    for p in r.patterns:
        groups.setdefault((p.kind, shape_size_label(p.kind, p.details)), []).append(p)
    order = {k: i for i, k in enumerate(KIND_NAMES)}
    at_peak = r.peak.by_shape if r.peak is not None else {}
    lines, said = [], set()
    for (kind, label), ps in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[1][0].start_event)):
        lo, hi = min(p.bytes for p in ps), max(p.bytes for p in ps)
        size = format_bytes(lo) if lo == hi else f"{format_bytes(lo)}–{format_bytes(hi)}"
        line = f"  {kind:<22} ×{len(ps):<5,} {size}, {label}"
        if kind not in said and at_peak.get(kind):
            line += f"; {format_bytes(at_peak[kind])} {AT_PEAK}"
        sure = min(p.confidence for p in ps)
        if sure < 1:
            line += f" ({sure:.0%} sure: its phase was inferred)"
        lines.append(line)
        if kind not in said:
            said.add(kind)
            mine = [p for p in ps if t is not None and p.step == t.step.index] or ps
            lines.append(f"      step {r.steps[mine[0].step].number}: {mine[0].explanation}")
    return lines
