"""What changed from one run to another, as plain dataclasses with their JSON-ready values: the
``Comparison`` that ``compare.compare`` builds (as ``report.py`` holds what ``pipeline.py`` builds).
Its text and picture are the reporters' (reporters/text/compare.py, reporters/picture/compare.py).

Example:
    >>> c = phasemem.compare("base.pickle", "new.pickle")
    >>> print(c); c.to_json("diff.json"); c.save_png("diff.png")
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..model import PeakBreakdown
from ..units import format_bytes, pct, signed  # noqa: F401  (pct, signed: public here too)
from .registry import Written

#: The overall peak "moved" when it changed by at least this share of A's peak; below that the
#: headline names the phase that changed most instead (a fused optimizer lowers the optimizer's
#: peak while the overall peak, set in backward, stays where it was: gpt_foreach's shape).
MOVED = 0.01
#: A cause of the peak's change is named when it moves at least this many bytes, or this share of
#: the larger peak where that is less (a run of a few MiB: the CPU path's tiny pairs); smaller ones
#: are added to the unexplained rest. The CUDA allocator rounds blocks to 512 B and small segments to
#: 2 MiB, so below a MiB of a GPU run a "cause" is bookkeeping, not a change a user made.
NAMED_CAUSE_BYTES = 1 << 20
NAMED_CAUSE_SHARE = 0.001


def named_floor(a_peak: int, b_peak: int) -> int:
    """The smallest change of a cause that is named: ``NAMED_CAUSE_BYTES``, or less for a small run."""
    return int(min(NAMED_CAUSE_BYTES, NAMED_CAUSE_SHARE * max(a_peak, b_peak, 0)))
#: What a shape's arrival or departure usually means: said as "typically", never as a finding, and only
#: where the recorded pairs showed no other cause (a softmax spike also goes when the logits are bf16:
#: fixtures/pairs/bf16_logits, so its departure says nothing here).
MEANS = {
    ("optimizer_temporaries", "disappeared"): "the optimizer step makes no temporaries now (typically a fused optimizer)",
    ("optimizer_temporaries", "appeared"): "the optimizer step now makes temporaries (typically a foreach or for-loop optimizer)",
    ("checkpoint_recompute", "appeared"): "backward recomputes forward activations (activation checkpointing)",
    ("checkpoint_recompute", "disappeared"): "backward no longer recomputes activations (checkpointing off)",
    ("forward_rerun", "appeared"): "the program now runs forward again in its backward phase (typically gradient caching)",
    ("gradient_accumulation", "appeared"): "gradients are accumulated over micro-batches",
}


@dataclass
class Side:
    """One run as compared: which steps, its peak there, where that peak is, and what it is made of."""

    name: str
    device: str
    n_events: int
    steps: list[int]  # Step.number of the compared step(s); every step for "all"
    peak_bytes: int  # the compared steps' peak
    peak_event: int
    peak_step: int | None  # Step.number where that peak is
    peak_phase: str
    peak_shape: str | None  # the shape whose own peak is the peak, if one is
    run_peak_bytes: int  # the whole recording's peak
    breakdown: PeakBreakdown
    sources: dict[str, str] = field(default_factory=dict)
    #: bytes alive at the peak per (shape or None, category): what the attribution reads; not in JSON
    cells: dict = field(default_factory=dict, repr=False)


@dataclass
class PhaseDelta:
    """One phase's peak on each side (None: the phase did not run there) and b − a."""

    name: str
    a_peak: int | None
    b_peak: int | None
    delta: int | None
    a_event: int | None = None
    b_event: int | None = None
    by_category: dict[str, int] = field(default_factory=dict)  # b − a per category at the phase peaks
    #: False when the phase ran at another place of the step in A than in B (zero_grad moved before the
    #: forward): its peaks are then of different moments, and the headline does not read them.
    aligned: bool = True


@dataclass
class ShapeDelta:
    """A shape kind in one phase: its largest size on each side (0: absent) and what happened to it."""

    kind: str
    phase: str
    a_bytes: int
    b_bytes: int
    change: str  # "appeared" | "disappeared" | "changed" | "same"
    a_event: int | None = None  # the occurrence's own peak event, for the picture
    b_event: int | None = None

    @property
    def delta(self) -> int:
        return self.b_bytes - self.a_bytes

    def said(self) -> str:
        """``softmax_spike 250.0 MiB → gone``, with what that typically means."""
        a = format_bytes(self.a_bytes) if self.a_bytes else "none"
        b = format_bytes(self.b_bytes) if self.b_bytes else "gone"
        why = MEANS.get((self.kind, self.change))
        return f"{self.kind} {a} → {b}" + (f": {why}" if why else "")


@dataclass
class Cause:
    """A named part of the peak's change: a shape's bytes, or a category's bytes that no shape claims."""

    cause: str
    type: str  # "shape" | "category"
    bytes: int


@dataclass
class Slot:
    """One phase run of the aligned steps: A's run and B's (first, last event), either None where only
    the other side ran that phase there."""

    phase: str
    a: tuple[int, int] | None
    b: tuple[int, int] | None


@dataclass
class Comparison(Written):
    """What changed from run A to run B (``delta`` = b − a throughout). ``attribution`` plus
    ``unexplained_bytes`` is exactly ``delta``.

    Example:
        >>> c = phasemem.compare("base.pickle", "new.pickle")
        >>> c.delta, c.a.peak_phase, c.b.peak_phase, c.main_cause()["cause"]
    """

    a: Side
    b: Side
    phases: dict[str, PhaseDelta]
    shapes: list[ShapeDelta]
    categories: dict[str, dict[str, int]]  # name: {"a", "b", "delta"}
    attribution: list[Cause]
    unexplained_bytes: int
    slots: list[Slot]
    notes: list[str] = field(default_factory=list)
    a_report: Any = field(default=None, repr=False)
    b_report: Any = field(default=None, repr=False)

    @property
    def delta(self) -> int:
        return self.b.peak_bytes - self.a.peak_bytes

    @property
    def delta_pct(self) -> float | None:
        return 100.0 * self.delta / self.a.peak_bytes if self.a.peak_bytes else None

    @property
    def moved(self) -> bool:
        """Whether the peak changed by at least ``MOVED`` of A's."""
        return abs(self.delta) >= MOVED * max(self.a.peak_bytes, 1)

    def main_cause(self) -> dict | None:
        """The change's headline: the largest cause of the peak's change (``where`` "peak"), or, when
        the peak did not move, the phase whose peak changed most with its largest shape change.

        Example:
            >>> phasemem.compare(a, b).main_cause()
            {'where': 'peak', 'cause': 'gradient', 'type': 'category', 'bytes': -182562816}
        """
        if self.moved:
            sign = 1 if self.delta > 0 else -1
            same_way = [c for c in self.attribution if c.bytes * sign > 0]
            if same_way:
                return {"where": "peak", **asdict(max(same_way, key=lambda c: abs(c.bytes)))}
        ran = [p for p in self.phases.values() if p.delta and p.aligned]
        if not ran:
            return None
        # ties (forward and the batch before it, both without last step's gradients): the higher phase
        ph = max(ran, key=lambda p: (abs(p.delta or 0), max(p.a_peak or 0, p.b_peak or 0)))
        top = max((s for s in self.shapes if s.phase == ph.name and s.change != "same"),
                  key=lambda s: abs(s.delta), default=None)
        if top is not None:
            return {"where": ph.name, "cause": top.kind, "type": "shape", "bytes": top.delta, "phase_delta": ph.delta}
        # no shape of that phase changed: the category that changed most at its peak
        cat = max(ph.by_category.items(), key=lambda kv: abs(kv[1]), default=(ph.name, ph.delta))
        return {"where": ph.name, "cause": cat[0], "type": "category" if ph.by_category else "phase",
                "bytes": cat[1], "phase_delta": ph.delta}

    def to_dict(self) -> dict:
        """The comparison as JSON-ready values (bytes as integers)."""
        return {
            "a": _side_dict(self.a), "b": _side_dict(self.b),
            "peak": {"a": self.a.peak_bytes, "b": self.b.peak_bytes, "delta": self.delta,
                     "delta_pct": None if self.delta_pct is None else round(self.delta_pct, 3),
                     "a_phase": self.a.peak_phase, "b_phase": self.b.peak_phase,
                     "a_shape": self.a.peak_shape, "b_shape": self.b.peak_shape},
            "phases": {n: {"a_peak": p.a_peak, "b_peak": p.b_peak, "delta": p.delta, "aligned": p.aligned,
                           "by_category": p.by_category}
                       for n, p in self.phases.items()},
            "shapes": [{"kind": s.kind, "phase": s.phase, "a_bytes": s.a_bytes, "b_bytes": s.b_bytes,
                        "delta": s.delta, "change": s.change, "means": MEANS.get((s.kind, s.change))}
                       for s in self.shapes],
            "categories": self.categories,
            "attribution": [asdict(c) for c in self.attribution],
            "unexplained_bytes": self.unexplained_bytes,
            "main_cause": self.main_cause(),
            "notes": list(self.notes),
        }

    def headline(self) -> str:
        """One line: the peak on both sides, its change, where it is."""
        return headline(self)


def _side_dict(s: Side) -> dict:
    out = {k: v for k, v in asdict(s).items() if k not in ("breakdown", "cells")}
    out["by_category"] = dict(s.breakdown.by_category)
    out["by_shape"] = dict(s.breakdown.by_shape)
    return out


def where(side: Side) -> str:
    """``backward (logits_release)``: the phase of a side's peak, and the shape that sets it."""
    return side.peak_phase + (f" ({side.peak_shape})" if side.peak_shape else "")


def headline(c: Comparison) -> str:
    """One line: the peak on both sides, its change, where it is."""
    moved = (f"moves from {where(c.a)} to {where(c.b)}" if where(c.a) != where(c.b)
             else f"at {where(c.a)} on both sides")
    return (f"peak {format_bytes(c.a.peak_bytes)} → {format_bytes(c.b.peak_bytes)}: {signed(c.delta)} "
            f"({pct(c.delta, c.a.peak_bytes)}); {moved}")
