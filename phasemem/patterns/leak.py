"""Memory that each step leaves behind for good: the classic leak (a loss kept with its graph, a
growing cache). Steps after the first should end where they started."""
from __future__ import annotations

import numpy as np

from ..model import Pattern
from ..vocab import PHASES
from ..units import format_bytes
from ..facts import Context


def detect(ctx: Context) -> list[Pattern]:
    steps = ctx.seg.steps
    middle = [k for k in range(1, len(steps) - 1) if steps[k][2]]
    if len(middle) < 1:
        return []
    kept = {}
    for k in middle:
        s0, s1, _ = steps[k]
        idx = ctx.allocs_between(s0, s1 - 1)
        kept[k] = idx[ctx.free[idx] >= ctx.n]
    # A leak repeats: two or more steps keep memory for good. One step doing so is state made late
    # (Adam's, when GradScaler skipped the first step) or a cache filled once.
    kept = {k: v for k, v in kept.items() if len(v)}
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
