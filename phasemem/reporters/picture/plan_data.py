"""What the plan picture shows, before any drawing: the trace as recorded and a ``PlanBar`` per plan and
rank count under one budget (``PlanPicture``), and the same grid as a text table.

The figure is plans.py's (with plan_bars.py and plan_frame.py); nothing here imports matplotlib.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import PhasememError
from ...predictions.plans import GRID_RANKS, PLANS, PlanBar, plan_grid
from ...units import format_bytes

#: At most this many rank counts a picture draws (4 plans x 10 bars still leave each bar ~30 px at 1600 px).
MAX_RANK_COUNTS = 10


@dataclass
class PlanPicture:
    """What the plan picture shows: the trace as recorded (its peak by category and what fits on one
    GPU) and a ``PlanBar`` per plan and rank count, under one budget.

    Example:
        >>> pic = PlanPicture.of(report, parse_size("80GiB"), ranks=(1, 2, 4, 8), batch=16, param_dtype="bf16")
        >>> [(b.plan.plan, b.plan.ranks, pic.largest_batch(b.largest_factor)) for b in pic.bars]
    """

    name: str
    budget_bytes: int
    batch: int | None
    ranks: tuple
    plans: tuple
    settings: dict
    peak_bytes: int
    by_category: dict
    reference_factor: float | None
    reference_why: str
    bars: list[PlanBar] = field(default_factory=list)

    @classmethod
    def of(cls, report, budget: int, ranks: tuple = GRID_RANKS, plans: tuple = PLANS, batch: int | None = None,
           name: str = "", **settings) -> "PlanPicture":
        """Every plan at every rank count (``plan_grid``), with the one-GPU answer beside them."""
        if not 1 <= len(ranks) <= MAX_RANK_COUNTS:
            raise PhasememError(f"give 1 to {MAX_RANK_COUNTS} rank counts (the picture has a bar for each "
                                f"plan at each), not {len(ranks)}")
        factor, why = None, ""
        try:
            fit = report.fits(budget).batch
            factor, why = (fit.largest_factor, "") if fit.applies else (None, fit.why[0] if fit.why else "")
        except PhasememError as e:
            why = str(e)
        return cls(name, int(budget), batch, tuple(ranks), tuple(plans), dict(settings), int(report.peak_bytes),
                   {k: int(v) for k, v in report.by_category.items()}, factor, why,
                   plan_grid(report, budget, tuple(plans), tuple(ranks), **settings))

    def largest_batch(self, factor: float | None) -> int | None:
        """The largest batch per rank for a batch factor: the trace's batch x the factor, rounded down
        (None without ``batch`` or factor)."""
        if factor is None or self.batch is None:
            return None
        return int(math.floor(factor * self.batch + 1e-9))

    def fit_label(self, factor: float | None, times: str = "×") -> str:
        """What is written over a bar: the largest batch per rank (``46``; ``none`` where not even one
        sample fits), or with no batch given the factor (``x11.7``); ``?`` where it was not solved."""
        if factor is None:
            return "?"
        if self.batch is not None:
            n = self.largest_batch(factor)
            return str(n) if n is not None and n >= 1 else "none"
        return f"{times}{factor:.3g}"

    def to_dict(self) -> dict:
        return {"trace": self.name, "budget_bytes": self.budget_bytes, "batch": self.batch, "ranks": list(self.ranks),
                "plans": list(self.plans), "settings": self.settings,
                "reference": {"peak_bytes": self.peak_bytes, "by_category": self.by_category,
                              "largest_factor": self.reference_factor,
                              "largest_batch": self.largest_batch(self.reference_factor),
                              "fits_why": self.reference_why},
                "bars": [dict(b.to_dict(), largest_batch=self.largest_batch(b.largest_factor)) for b in self.bars]}

    def text(self) -> str:
        """The grid as a compact table: a row per plan, a column per rank count, each cell the peak per
        rank and, in brackets, the largest batch per rank that fits (or the factor)."""
        what = "largest batch per rank" if self.batch is not None else "largest batch factor per rank"
        head = (f"per-rank peak under each plan, replayed on {self.name or 'the trace'}; in brackets the {what} "
                f"that fits {format_bytes(self.budget_bytes)}" + (f" (the trace's batch {self.batch} x the "
                                                                  "factor, rounded down)" if self.batch else ""))
        ref = f"{format_bytes(self.peak_bytes)} ({self.fit_label(self.reference_factor, 'x')})"
        rows = [["", *(f"{n} rank" + ("s" if n > 1 else "") for n in self.ranks)]]
        off: dict[str, list[str]] = {}  # reason -> where
        unsolved: dict[str, list[str]] = {}
        for name in self.plans:
            row, mine = [name], self._bars_of(name)
            for b in mine:
                p = b.plan
                if not p.applies:
                    row.append("n/a")
                    off.setdefault(p.why[0] if p.why else "unknown", []).append(f"{name}:{p.ranks}")
                    continue
                peak = format_bytes(p.predicted_peak_bytes)  # type: ignore[arg-type]  # applies: it has one
                if p.predicted_peak_bytes_low is not None:
                    low = format_bytes(p.predicted_peak_bytes_low)
                    same = low.split()[-1] == peak.split()[-1]  # one unit: said once
                    peak = f"{low.split()[0] if same else low}-{peak}"
                row.append(f"{peak} ({self.fit_label(b.largest_factor, 'x')})")
                if b.largest_factor is None:
                    unsolved.setdefault(b.fits_why or "unknown", []).append(f"{name}:{p.ranks}")
            rows.append(row)
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = [head]
        tags = [f"{n}{settings_tag(self._settings_of(n))}" for n in self.plans if settings_tag(self._settings_of(n))]
        if tags:
            lines.append(f"  settings: {', '.join(tags)}")
        lines.append(f"  the trace as recorded (1 GPU): {ref}")
        lines += ["  " + "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
                  .rstrip() for r in rows]
        if any(b.plan.predicted_peak_bytes_low is not None for b in self.bars):
            lines.append("  a-b: two readings of what the trace cannot tell (docs/plans.md); the peak lies from a to b, "
                         "and the batch in brackets fits at b")
        lines += [f"  n/a ({self._where(w)}): {why}" for why, w in off.items()]
        lines += [f"  ? ({self._where(w)}): what fits cannot be told: {why}" for why, w in unsolved.items()]
        if self.reference_factor is None:
            lines.append(f"  ? (the trace): what fits cannot be told: {self.reference_why or 'unknown'}")
        return "\n".join(lines)

    def _where(self, items: list[str]) -> str:
        """``ddp:2, ddp:4`` said as ``ddp at 2, 4 ranks``, a plan at every rank count as its name."""
        by: dict[str, list[str]] = {}
        for item in items:
            name, n = item.split(":")
            by.setdefault(name, []).append(n)
        return "; ".join(name if len(ns) == len(self.ranks) else f"{name} at {', '.join(ns)} ranks"
                         for name, ns in by.items())

    def _bars_of(self, name: str) -> list[PlanBar]:
        return [b for b in self.bars if b.plan.plan == name]

    def _settings_of(self, name: str) -> dict:
        bars = self._bars_of(name)
        return bars[0].plan.settings if bars else {}


def settings_tag(settings: dict, short: bool = False) -> str:
    """What differs from the plan's defaults, for its name: `` (bf16 params)``."""
    said = []
    if settings.get("param_dtype"):
        said.append(f"{settings['param_dtype']} params")
    if settings.get("reshard_after_forward") is False:
        said.append("kept unsharded" if not short else "no reshard")
    if settings.get("bucket_view"):
        said.append("bucket view")
    return f" ({', '.join(said)})" if said else ""
