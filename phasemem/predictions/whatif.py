"""What a remedy would do to the peak: the trace replayed with the remedy applied (blocks dropped,
resized, re-timed or added; nothing guessed from a config), or why it does not apply. docs/what-if.md
compares each prediction with the real run.
"""
from __future__ import annotations

import numpy as np

from ..analysis.core import Analysis
from ..model import Pattern, WhatIf
from ..vocab import PHASES, P
from .blocks import Facts
from .remedies import REMEDIES, SCALINGS
from .remedies.cross_entropy import CE_CHUNKS, CHUNK_WORKING_SET
from .replay import Replayed, changed_points, points, replay


def replays(an: Analysis, patterns: list[Pattern]) -> list[tuple[str, Replayed | str]]:
    """Per remedy: what its replayed curve peaks at (or why it does not apply)."""
    life = an.timeline.lifetimes
    n = len(an.trace)
    facts = Facts(an, patterns)
    out: list[tuple[str, Replayed | str]] = []
    base = None
    ooms = sorted(an.trace.oom_device_free)
    for name, remedy in {**REMEDIES, **SCALINGS}.items():
        change = remedy(facts) if n else "the trace has no events"
        if isinstance(change, str):
            out.append((name, change))
            continue
        if base is None:
            base = _base(an)
        pts = changed_points(base, life.alloc_event, life.free_event, life.size, change.free, change.size,
                             change.added)
        out.append((name, Replayed.of_points(pts, an.facts.run_first, ooms, change.explanation, change.assumptions)))
        del pts, change  # a curve and a change are ~130 MB at 10M events: one of each at a time
    return out


def _base(an: Analysis):
    """The unchanged blocks' points: the timeline's own curve where they equal it (the blocks are
    its lifetimes, so they do: no 80 MB copy held through the replays at 10M events), else summed."""
    life, tl = an.timeline.lifetimes, an.timeline
    pts = points(len(an.trace), life.alloc_event, life.free_event, life.size)
    if pts[0] == tl.baseline and np.array_equal(pts[1:], tl.active_after):
        return tl.baseline, tl.active_after
    return pts


def what_if(an: Analysis, patterns: list[Pattern], replayed=None) -> list[WhatIf]:
    """Every remedy of REMEDIES, replayed on the trace, ranked by what it saves.

    Example:
        >>> for w in what_if(report.analysis, report.patterns):
        ...     print(w.remedy, w.applies, w.saves_bytes)
    """
    if not len(an.trace):
        return []
    base_peak = int(an.timeline.level.max())
    fx = an.facts
    ran = np.bincount(fx.run_phase, minlength=len(PHASES)) > 0
    out = []
    for name, r in replayed if replayed is not None else replays(an, patterns):
        if isinstance(r, str):
            out.append(WhatIf(name, False, None, {}, None, None, r))
            continue
        phases = np.zeros(len(PHASES), np.int64)
        np.maximum.at(phases, fx.run_phase, r.run_peaks)  # the runs cover every event
        out.append(WhatIf(
            remedy=name, applies=True, predicted_peak_bytes=r.peak_bytes,
            predicted_phase_peaks={PHASES[k]: int(phases[k]) for k in np.flatnonzero(ran)},
            saves_bytes=base_peak - r.peak_bytes, new_peak_phase=PHASES[int(an.labels[r.peak_event])],
            explanation=r.explanation, assumptions=r.assumptions))
    return sorted(out, key=lambda w: (not w.applies, -(w.saves_bytes or 0)))


def upcast_source(an: Analysis, event: int, request: int) -> int | None:
    """The block (Lifetimes index) a failed request has the shape of, in fp32: alive, made by forward
    as its last output, and exactly half the request's size (bf16 logits whose fp32 log-softmax
    failed: fixtures/pairs/oom_base). None when the request is no such tensor."""
    life = an.timeline.lifetimes
    q = event
    alive = np.flatnonzero((life.alloc_event >= 0) & (life.alloc_event < q) & (life.free_event >= q))
    if not len(alive):
        return None
    made_fwd = alive[an.labels[life.alloc_event[alive]] == P["forward"]]
    if not len(made_fwd):
        return None
    last = made_fwd[np.argmax(life.alloc_event[made_fwd])]
    return int(last) if 2 * int(life.size[last]) == int(request) else None


def oom_fits(an: Analysis, replayed, event: int, request: int, capacity: int) -> dict[str, int]:
    """``would_fit`` plus, when the failed request is an fp32 upcast of forward's output, the two
    remedies that act on it, replayed up to the failure: the loss on the half-precision output (no
    copy is made), or a chunked loss (the output never whole, one chunk's working set instead)."""
    out = would_fit(replayed, event, request, capacity)
    src = upcast_source(an, event, request)
    if src is None:
        return out
    life = an.timeline.lifetimes
    # fp32 tensors of the output's shape made since it (the upcast copy before a failed log-softmax)
    copies = np.flatnonzero((life.alloc_event >= life.alloc_event[src]) & (life.alloc_event < event)
                            & (life.free_event >= event) & (life.size == request))
    n = len(an.trace)
    for name, gone, asked in (("bf16_logits", copies, int(life.size[src])),  # the loss reads the bf16 output
                              ("chunked_cross_entropy", np.append(copies, src),
                               CHUNK_WORKING_SET * int(request) // CE_CHUNKS)):
        size = life.size.copy()
        size[gone] = 0
        level = replay(n, life.alloc_event, life.free_event, size)
        need = max(int(level[:event + 1].max()), int(level[event]) + asked)
        if need <= capacity and name not in out:
            out[name] = capacity - need
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def would_fit(replayed, event: int, request: int, capacity: int) -> dict[str, int]:
    """The remedies under which everything up to ``event`` plus the failed ``request`` stays within
    ``capacity`` (what was reserved when it failed: known to be obtainable), with the margin left.
    What would have come after the failure was never recorded, so a fit says: the step gets past here."""
    out = {}
    for name, r in replayed:
        if isinstance(r, str):
            continue
        need = r.need(event, request)
        if need <= capacity:
            out[name] = capacity - need
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
