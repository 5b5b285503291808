"""What fits on a card of a given size: the largest batch and sequence factor, each block grown as
``scaling.growth`` says, replayed through the caching allocator under the budget (docs/what-if.md,
"What fits").

``search.py``: an axis's answer (and the remedies that make the next factor fit); ``capped.py``: the
replays under the cap; ``bounds.py``: the allocated peak and the reserve, without the allocator;
``answer.py``: ``Fit``, ``Fits`` and their text.
"""
from __future__ import annotations

from ...analysis.core import Analysis
from ...errors import PhasememError
from ...model import Pattern
from ..blocks import Change, Facts
from ..remedies import REMEDIES
from ..remedies.per_token import block_growth
from ..replay import points
from ..scaling import CONSTANT
from .answer import Fit, Fits
from .bounds import _at, _blocks, _parts, _reserve, fragmentation
from .capped import _Capped
from .search import _applicable, _solve


def fits(an: Analysis, patterns: list[Pattern], budget: int, changes: list[Change] | None = None) -> Fits:
    """The largest batch and sequence factors at which the trace, replayed through PyTorch's caching
    allocator with the budget as its cap, does not run out of memory; and the remedies that would let
    the next factor fit. ``changes`` (``blocks.Change``: sizes, frees, added blocks, e.g. a
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
    if base:  # the peak the answer starts from is the changed one (a plan's, per rank), as its plan says
        peak = int(points(f.n, *blocks[:3]).max())
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
