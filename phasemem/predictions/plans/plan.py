"""A parallel plan replayed on a trace: the ``Plan`` answer, the plan as a change of the blocks, and the
grid of plans and rank counts the plan picture draws."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np

from ...analysis.core import Analysis
from ...errors import PhasememError
from ...model import Pattern
from ...units import format_bytes
from ...vocab import CATEGORIES, CATEGORY_NAMES, PHASES, ROLE_NAMES, C
from ..blocks import Facts
from ..replay import Replayed, changed_points
from ..scaling import CONSTANT
from ..whatif import _base
from .blocks import ROLE_CATEGORY, ROLES, Added, PlanChange
from .ddp_zero import ddp, zero
from .fsdp2 import from_rank, fsdp2
from .params import dtype_bytes, params_of, step_blocks
from .precision import HALF_COMPUTE

#: The plans, by name: what ``--plan NAME:N`` and ``report.plan(NAME, ranks=N)`` take.
PLANS = ("ddp", "zero1", "zero2", "fsdp2")


@dataclass
class Plan:
    """A parallel plan replayed on the trace: what rank ``rank`` of ``ranks`` would hold.

    Example:
        >>> p = report.plan("zero1", ranks=4)
        >>> p.predicted_peak_bytes, p.peak_phase, p.categories["optimizer_state"]
    """

    plan: str
    ranks: int
    rank: int
    applies: bool
    why: list[str] = field(default_factory=list)
    predicted_peak_bytes: int | None = None
    peak_phase: str | None = None
    peak_step: int | None = None
    phase_peaks: dict[str, int] = field(default_factory=dict)
    categories: dict[str, int] = field(default_factory=dict)  # at the predicted peak
    wrapper: dict[str, int] = field(default_factory=dict)  # the wrapper's own buffers at the predicted peak
    settings: dict = field(default_factory=dict)
    confidence: str = "low"
    explanation: str = ""
    #: Where the trace cannot tell between two readings: the peak under the lower one (else None); the
    #: peak lies from it to ``predicted_peak_bytes`` (a loss that may upcast: one of the two; autocast: between).
    predicted_peak_bytes_low: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return format_plan(self)


def parse_plan(text: str) -> tuple[str, int]:
    """``"fsdp2:8"`` -> ("fsdp2", 8); a one-line error otherwise."""
    m = re.fullmatch(r"\s*([a-z0-9_]+)\s*(?::\s*(\d+))?\s*", text or "")
    if not m or m.group(1) not in PLANS:
        raise PhasememError(f"unknown plan {text!r}: give one of {', '.join(PLANS)}, with the ranks after a colon "
                            "(fsdp2:8)")
    n = int(m.group(2) or 1)
    if n < 1:
        raise PhasememError(f"plan {text!r}: the ranks must be 1 or more")
    return m.group(1), n



def format_plan(p: Plan) -> str:
    head = f"{p.plan} with {p.ranks} rank(s), rank {p.rank}"
    if p.settings:
        head += " (" + ", ".join(f"{k}={v}" for k, v in p.settings.items()) + ")"
    if not p.applies:
        return f"{head}: cannot tell: {'; '.join(p.why)}"
    assert p.predicted_peak_bytes is not None  # a plan that applies has its peak
    peak = format_bytes(p.predicted_peak_bytes)
    if p.predicted_peak_bytes_low is not None:
        peak = f"{format_bytes(p.predicted_peak_bytes_low)} to {peak}"
    cats = ", ".join(f"{CATEGORY_NAMES.get(k, k)} {format_bytes(v)}" for k, v in p.categories.items() if v)
    wrap = ", ".join(f"{ROLE_NAMES.get(k, k)} {format_bytes(v)}" for k, v in p.wrapper.items() if v)
    lines = [f"{head}: peak {peak} in {p.peak_phase} (confidence {p.confidence})",
             f"    at the peak: {cats}" + (f"; of which the wrapper's own: {wrap}" if wrap else "")]
    lines += [f"    - {w}" for w in p.why]
    return "\n".join(lines)




# -- the changes -----------------------------------------------------------------------------------
BUILDERS: dict[str, Callable[..., list[str] | str]] = {"ddp": ddp, "zero1": partial(zero, stage=1), "zero2": partial(zero, stage=2),
            "fsdp2": fsdp2}


def plan_change(an: Analysis, patterns: list[Pattern], name: str, ranks: int = 1, rank: int = 0,
                param_dtype: str | None = None, reshard_after_forward: bool = True, bucket_view: bool = False,
                rebuild_buckets: bool = True) -> PlanChange | str:
    """The plan as blocks changed, or why it does not apply (what the trace lacks)."""
    if name not in PLANS:
        raise PhasememError(f"unknown plan {name!r}: give one of {', '.join(PLANS)}")
    if int(ranks) < 1 or not 0 <= int(rank) < int(ranks):
        raise PhasememError(f"plan {name}: rank {rank} of {ranks} ranks does not exist")
    if param_dtype is not None:
        dtype_bytes(param_dtype)
        if name != "fsdp2":
            return f"param_dtype is FSDP2's MixedPrecisionPolicy; {name} keeps the trace's dtype"
    if not len(an.trace):
        return "the trace has no events"
    f = Facts(an, patterns)
    world = int((an.trace.meta or {}).get("world_size") or 1) if isinstance(an.trace.meta, dict) else 1
    if world > 1:
        return from_rank(an, f, name, int(ranks), world, param_dtype, reshard_after_forward)
    steps = step_blocks(f)
    params = params_of(an, f, steps)
    if isinstance(params, str):
        return params
    st: dict[str, Any] = {"param_dtype": param_dtype, "reshard_after_forward": reshard_after_forward, "bucket_view": bucket_view,
          "rebuild_buckets": rebuild_buckets}
    ch, add = f.change(""), Added()
    notes = BUILDERS[name](f, steps, params, int(ranks), int(rank), st, ch, add)
    if isinstance(notes, str):
        return notes
    a_alloc, a_free, a_size, a_role = add.arrays()
    ch.added = (a_alloc, a_free, a_size)
    ch.added_kind = np.full(len(a_size), CONSTANT, np.int8)
    ch.explanation = notes[0]
    ch.assumptions = notes[1:]
    return PlanChange(f, ch, a_role, notes + [f"the parameters from {params.source}"], params, st.get("_low"))


def plan(an: Analysis, patterns: list[Pattern], name: str, ranks: int = 1, rank: int = 0,
         param_dtype: str | None = None, reshard_after_forward: bool = True, bucket_view: bool = False,
         rebuild_buckets: bool = True) -> Plan:
    """What rank ``rank`` of ``ranks`` would hold under plan ``name`` (one of PLANS), replayed on the trace.

    Example:
        >>> plan(report.analysis, report.patterns, "zero1", ranks=4).predicted_peak_bytes
    """
    settings: dict[str, Any] = {"param_dtype": param_dtype, "reshard_after_forward": reshard_after_forward, "bucket_view": bucket_view,
                "rebuild_buckets": rebuild_buckets}
    out = Plan(name, int(ranks), int(rank), False,
               settings={k: v for k, v in settings.items() if k in _SETTINGS.get(name, ()) and v is not None})
    pc = plan_change(an, patterns, name, ranks, rank, **settings)
    if isinstance(pc, str):
        out.why = [pc]
        return out
    f, ch = pc.facts, pc.change
    z = np.zeros(0, np.int64)
    a_alloc, a_free, a_size = ch.added or (z, z, z)
    life = an.timeline.lifetimes
    base = _base(an)
    pts = changed_points(base, life.alloc_event, life.free_event, life.size, ch.free, ch.size, ch.added or ())
    r = Replayed.of_points(pts, an.facts.run_first, [], "", [])
    if pc.low is not None and len(pc.low):
        size = ch.size.copy()
        size[pc.low] = np.round(size[pc.low] * HALF_COMPUTE).astype(np.int64)
        out.predicted_peak_bytes_low = int(changed_points(base, life.alloc_event, life.free_event, life.size,
                                                          ch.free, size, ch.added).max())
    e = r.peak_event
    phases = np.zeros(len(PHASES), np.int64)
    np.maximum.at(phases, an.facts.run_phase, r.run_peaks)
    ran = np.bincount(an.facts.run_phase, minlength=len(PHASES)) > 0
    alive = (f.alloc <= e) & (ch.free > e) & (ch.size > 0)
    cats = np.bincount(f.cat[alive], weights=ch.size[alive], minlength=len(CATEGORIES)).astype(np.int64)
    on = (a_alloc <= e) & (a_free > e)
    roles = np.bincount(pc.roles[on], weights=a_size[on], minlength=len(ROLES)).astype(np.int64)
    for k, role in enumerate(ROLES):
        cats[C[ROLE_CATEGORY[role]]] += roles[k]
    out.applies = True
    out.predicted_peak_bytes = r.peak_bytes
    out.peak_phase = PHASES[int(an.labels[e])]
    out.peak_step = int(an.step_of[e]) if an.step_of[e] >= 0 else None
    out.phase_peaks = {PHASES[k]: int(phases[k]) for k in np.flatnonzero(ran)}
    out.categories = {CATEGORIES[k]: int(cats[k]) for k in range(len(CATEGORIES))}
    out.wrapper = {ROLES[k]: int(roles[k]) for k in range(len(ROLES)) if roles[k]}
    out.why = pc.notes
    out.confidence = ("medium" if pc.params.source.startswith("the parameter table") and out.predicted_peak_bytes_low is None
                      else "low")
    out.explanation = pc.notes[0]
    return out


_SETTINGS = {"ddp": ("bucket_view", "rebuild_buckets"), "zero1": ("bucket_view", "rebuild_buckets"), "zero2": (),
             "fsdp2": ("param_dtype", "reshard_after_forward")}


#: The rank counts the plan picture shows for each plan.
GRID_RANKS = (1, 2, 4, 8, 16)


@dataclass
class PlanBar:
    """One bar of the plan picture: a plan at a rank count, its peak per rank by category, and the
    largest batch factor per rank that fits the budget (None: not solved, or the plan does not apply)."""

    plan: Plan
    largest_factor: float | None = None
    fits_why: str = ""

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "largest_factor": self.largest_factor, "fits_why": self.fits_why}


def plan_grid(report, budget: int | None = None, plans: tuple = PLANS, ranks: tuple = GRID_RANKS,
              **settings) -> list[PlanBar]:
    """Every plan at every rank count, with the largest batch factor per rank under ``budget``: what
    ``phasemem plan`` draws. ``settings`` go to the plans that take them.

    Example:
        >>> bars = plan_grid(report, 80 << 30, param_dtype="bf16")
        >>> [(b.plan.plan, b.plan.ranks, b.plan.predicted_peak_bytes, b.largest_factor) for b in bars]
    """
    out = []
    for name in plans:
        kw = {k: v for k, v in settings.items() if k in _SETTINGS[name]}
        for n in ranks:
            p = report.plan(name, n, **kw)
            bar = PlanBar(p)
            if budget is not None and p.applies:
                try:
                    fx = report.fits(budget, plan=name, ranks=n, **kw)
                    bar.largest_factor = fx.batch.largest_factor if fx.batch.applies else None
                    bar.fits_why = "" if fx.batch.applies else fx.batch.why[0]
                except PhasememError as e:
                    bar.fits_why = str(e)
            out.append(bar)
    return out
