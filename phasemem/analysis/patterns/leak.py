"""Memory that each step leaves behind for good: the classic leak (a loss kept with its graph, a
growing cache). Steps after the first should end where they started."""
from __future__ import annotations

import numpy as np

from ...model import Pattern
from ...units import format_bytes
from ...vocab import PHASES
from ..facts import Context
from .shape_kind import INK, ShapeKind


def detect(ctx: Context) -> list[Pattern]:
    """The leak of every step that keeps the same tensors for good as another step does (the whole trace at once)."""
    steps = ctx.seg.steps
    middle = [k for k in range(1, len(steps) - 1) if steps[k][2]]
    if len(middle) < 1:
        return []
    # each step's allocations never freed: those of the whole trace once, cut at the steps' bounds
    never = np.flatnonzero(ctx.free >= ctx.n)
    s0, s1 = (np.array([steps[k][i] for k in middle], np.int64) for i in (0, 1))
    lo, hi = (np.searchsorted(never, ctx.alloc.searchsorted(e)).tolist() for e in (s0, s1))
    kept = {k: never[a:b] for k, a, b in zip(middle, lo, hi)}
    # A leak repeats: two or more steps keep the same tensors for good (the same sizes: a loss kept
    # with its graph, an output appended to a list). One step doing so is state made late (Adam's,
    # when GradScaler skipped the first step) or a cache filled once; two steps keeping different
    # tensors are two such one-offs: a GAN's second optimizer making its state in its first step,
    # and the loop's last tensors held by variables to the end (h5_wgan_gp in fixtures/heldout5:
    # 16 allocations each, 21.2 and 17.6 MiB, neither a leak).
    kept = {k: v for k, v in kept.items() if len(v)}
    alike: dict[tuple, list[int]] = {}
    for k, v in kept.items():
        alike.setdefault(tuple(np.sort(ctx.size[v]).tolist()), []).append(k)
    kept = {k: kept[k] for k in sorted(k for ks in alike.values() if len(ks) >= 2 for k in ks)}
    if len(kept) < 2:
        return []
    out = []
    for k, idx in kept.items():
        nbytes = int(ctx.size[idx].sum())
        first, last = int(ctx.alloc[idx[0]]), int(ctx.alloc[idx[-1]])
        phase = PHASES[int(np.bincount(ctx.phase_at_alloc[idx], weights=ctx.size[idx]).argmax())]
        out.append(Pattern(
            kind="leak", step=k, phase=phase, start_event=first, end_event=last,
            peak_event=ctx.peak_in(first, last), bytes=nbytes,
            explanation=(
                f"This step leaves {format_bytes(nbytes)} ({len(idx)} allocations, made in {phase}) that are never "
                f"freed, and so does every step like it: memory grows until it runs out. Look for tensors kept "
                f"across steps — a loss accumulated without .item() or .detach(), outputs appended to a list, a cache."
            ),
            details={"count": int(len(idx))},
            members=tuple(idx.tolist()),
        ))
    return out


KINDS = (
    ShapeKind("leak", detect, per_step=False, marker="h", colour=INK, priority=110, size_label="left by the step",
              explanation="Memory each step leaves behind for good, the same tensors step after step: memory "
                          "grows until it runs out.", order=130),
)
