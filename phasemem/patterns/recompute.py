"""Activation-checkpoint recompute: backward re-runs each checkpointed block's forward.

Recognised by allocation sizes alone: the recompute allocates the same sizes in the same order as
the block's forward did, so runs of backward allocations whose consecutive sizes (k at a time)
also occur consecutively in the forward are recompute; one run per checkpointed block. Gradients
have the same shapes as activations but come in reverse order, so they do not match.
"""
from __future__ import annotations

import numpy as np

from ..report import Pattern
from ..units import format_bytes
from .context import Context

#: Consecutive sizes that must match (4 gave exactly one run per layer on real traces and none
#: without checkpointing).
K = 4
MIN_RUNS = 2
GAP = 3


def _kgrams(sizes: np.ndarray, k: int) -> np.ndarray:
    s = sizes.astype(np.uint64)
    h = np.zeros(max(len(s) - k + 1, 0), dtype=np.uint64)
    for j in range(k):  # a rolling polynomial hash; uint64 wraps, which is what we want
        h = h * np.uint64(1_000_003) + s[j:len(s) - k + 1 + j]
    return h


def detect(ctx: Context, step: int) -> list[Pattern]:
    fwd = np.concatenate([ctx.allocs_between(a, b) for a, b in ctx.runs_of(step, "forward")] or [np.zeros(0, int)])
    bwd_runs = ctx.runs_of(step, "backward")
    out = []
    for b0, b1 in bwd_runs:
        bwd = ctx.allocs_between(b0, b1)
        if len(fwd) < K or len(bwd) < K:
            continue
        hit = np.isin(_kgrams(ctx.size[bwd], K), _kgrams(ctx.size[fwd], K))
        covered = np.zeros(len(bwd), dtype=bool)
        for j in range(K):  # every allocation inside a matching k-gram is recompute
            covered[j:len(hit) + j] |= hit
        edges = np.diff(np.concatenate([[0], covered.astype(np.int8), [0]]))
        starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        # A first-step allocation (a workspace, a lazily made buffer) can split one block's
        # recompute in two; rejoin runs separated by a gap of at most GAP allocations.
        join = np.flatnonzero(starts[1:] - stops[:-1] <= GAP)
        starts, stops = np.delete(starts, join + 1), np.delete(stops, join)
        keep = stops - starts >= K
        starts, stops = starts[keep], stops[keep]
        if len(starts) < MIN_RUNS:
            continue
        csum = np.concatenate([[0], np.cumsum(ctx.size[bwd])])
        per_run = csum[stops] - csum[starts]
        first = int(ctx.alloc[bwd[starts[0]]])
        last_alloc = bwd[stops[-1] - 1]
        last = int(min(ctx.free[bwd[starts[-1]:stops[-1]]].max(), b1))
        last = max(last, int(ctx.alloc[last_alloc]))
        per_layer = int(np.median(per_run))
        out.append(Pattern(
            kind="checkpoint_recompute", step=step, phase="backward", start_event=first, end_event=last,
            peak_event=ctx.peak_in(first, last), bytes=per_layer,
            explanation=(
                f"Activation checkpointing at work: backward re-runs the forward of each checkpointed block "
                f"before differentiating it, {len(starts)} times here, allocating about {format_bytes(per_layer)} "
                f"per block and freeing it as backward moves on — the ripples. This trades compute for "
                f"memory; checkpoint fewer blocks if memory allows, to run faster."
            ),
            details={"count": int(len(starts)), "bytes_per_layer": per_layer,
                     "run_events": [[int(ctx.alloc[bwd[a]]), int(ctx.alloc[bwd[b - 1]])] for a, b in zip(starts, stops)]},
        ))
    return out
