"""Which step is typical, and how the others differ from it: the middle of the short report, so that
a trace of 2,000 steps reads as one step and its exceptions (how steps are compared: docs/first-screen.md).

Example:
    >>> t = typical(report.steps, report.patterns, lambda e: "backward")
    >>> t.step.number, len(t.alike), [(d.steps, d.how) for d in t.differ]
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ..model import Pattern, Step
from ..vocab import PHASES

#: Steps whose peak, and each phase's peak, lie within this share of the typical step's peak are
#: alike. A steady loop repeats its allocations nearly to the byte: over the 215 fixtures and shared
#: snapshots with several steps, of 461 steps of the typical step's kind 53 peak more than 0.1 % away
#: from it, 41 more than 1 %, 40 more than 2 %, 38 more than 5 % (growing or multi-scale inputs:
#: h13_embeddings_cat_growth, h13_multiscale_seg); the share sits in that gap.
ALIKE = 0.02


@dataclass
class Differs:
    """Steps that differ from the typical one in the same ways."""

    steps: list[Step]
    how: tuple[str, ...]  # what differs, in words without figures ("no zero_grad", "higher peak")


@dataclass
class Typical:
    step: Step
    alike: list[Step]  # the steps like it, itself among them
    differ: list[Differs] = field(default_factory=list)  # the others, grouped, most steps first


def ran(step: Step) -> tuple[str, ...]:
    """The phases of a step that made at least one event, in phase order."""
    return tuple(p for p in PHASES if (ph := step.phases.get(p)) is not None and ph.n_events > 0)


def typical(steps: list[Step], patterns: list[Pattern], phase_at: Callable[[int], str]) -> Typical | None:
    """The typical step of ``steps`` and how every other differs from it (None without steps);
    ``phase_at(event)`` names the phase an event is in (where a step peaks)."""
    if not steps:
        return None
    kinds: list[set] = [set() for _ in steps]
    for p in patterns:
        if 0 <= p.step < len(steps):
            kinds[p.step].add(p.kind)
    key = [(s.complete, ran(s), frozenset(k)) for s, k in zip(steps, kinds)]
    count = Counter(key)
    last = {k: i for i, k in enumerate(key)}
    best = max(count, key=lambda k: (count[k], k[0], last[k]))
    same = sorted((s for s, k in zip(steps, key) if k == best), key=lambda s: (s.peak_bytes, s.index))
    t = same[(len(same) - 1) // 2]
    groups: dict[tuple[str, ...], list[Step]] = {}
    alike = []
    for s in steps:
        how = _how(s, t, kinds[s.index], kinds[t.index], phase_at)
        if how:
            groups.setdefault(how, []).append(s)
        else:
            alike.append(s)
    differ = [Differs(v, k) for k, v in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0].index))]
    return Typical(t, alike, differ)


def _how(s: Step, t: Step, kinds: set, t_kinds: set, phase_at: Callable[[int], str]) -> tuple[str, ...]:
    """What differs between step ``s`` and the typical ``t``, in words (empty: alike)."""
    if s is t:
        return ()
    out = []
    if s.complete != t.complete:
        out.append("partial" if not s.complete else "complete")
    mine, theirs = ran(s), ran(t)
    out += [f"no {p} events" for p in theirs if p not in mine] + [f"also {p}" for p in mine if p not in theirs]
    out += [f"with {k}" for k in sorted(kinds - t_kinds)] + [f"without {k}" for k in sorted(t_kinds - kinds)]
    room = ALIKE * max(t.peak_bytes, 1)
    if abs(s.peak_bytes - t.peak_bytes) > room:
        out.append("higher peak" if s.peak_bytes > t.peak_bytes else "lower peak")
    where = _peak_phase(s, phase_at)
    if where != _peak_phase(t, phase_at):
        out.append(f"peaks in {where}")
    both = [p for p in mine if p in theirs]
    higher = [p for p in both if s.phases[p].peak_bytes - t.phases[p].peak_bytes > room]
    lower = [p for p in both if t.phases[p].peak_bytes - s.phases[p].peak_bytes > room]
    if higher:
        out.append("higher in " + ", ".join(higher))
    if lower:
        out.append("lower in " + ", ".join(lower))
    return tuple(out)


def _peak_phase(s: Step, phase_at: Callable[[int], str]) -> str:
    return phase_at(s.peak_event) if s.peak_event is not None else "-"


def ranges(numbers: list[int], most: int = 6) -> str:
    """``[1, 2, 3, 7, 9, 10]`` → ``"1-3, 7, 9-10"``; past ``most`` runs, ``"…, N more"``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    words = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most]]
    if len(runs) > most:
        left = sum(b - a + 1 for a, b in runs[most:])
        words.append(f"and {left:,} more")
    return ", ".join(words)
