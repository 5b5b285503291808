"""FSDP2's parameters gathered again in backward, read from sizes and lifetimes alone: a gathered block,
then each parameter's block copied out of it. Those copy-outs repeat forward's sizes in forward's order,
as a recompute would, so recompute.py takes them out of a backward run before reading its runs."""
from __future__ import annotations

import numpy as np

from ..facts import Context, per_trace
from ..spans import concat_ranges

#: FSDP2 (fully_shard) gathers a layer's parameters into one block and copies each parameter out of it
#: into a block of its own, in forward and again in backward, in the same order: the copy-out's
#: allocations add up to the gathered block. Bytes off in all 336 backward copy-outs of the 16 fsdp2 and
#: fsdp2_bf16 plans traces: 0 (a trace's sizes are the bytes asked for, and FSDP2 pads each parameter's
#: block as it pads the gathered one), so none are allowed.
GATHER_SLACK = 0
#: A copy-out holds at least this many parameters: 9-16 per layer in the plans traces, 3-10 for the root
#: (llama's 3: embedding, final norm, head).
MIN_PIECES = 3
#: The gathered block is made at most this many allocations before the copy-out's first one: backward
#: gathers the next layer while it differentiates this one (at most 73 between them: llama__fsdp2_bf16).
GATHER_LOOKBACK = 256
#: In backward the gathered block is freed as soon as its parameters are copied out: at most this many
#: allocations after the copy-out's last (1 in every backward copy-out of the plans traces: the copy's
#: small temporary; forward keeps it longer, 17-58).
GATHER_FREED_WITHIN = 2
#: A layer's parameters live until its backward is done, then go together: at least this many allocations
#: are made between the copy-out's last and their frees (33-471 in every backward copy-out of the plans
#: traces), and none between their frees. Look-alikes in backward on every fixture with frames (a split's
#: gradients, q, k and v, adding up to the block they are concatenated into) were freed within 2, all but
#: one (hf_compile_accum: 287), and were all of one size, which a layer's parameters never are.
GATHER_HELD = 8


@per_trace
def _alloc_size_csum(ctx: Context) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(ctx.size, dtype=np.int64)])


def gathered(ctx: Context, at: np.ndarray) -> np.ndarray:
    """The allocations (sorted indices) of FSDP2's backward copy-outs that begin at any of the allocations
    ``at``: a gathered block, then pieces made while it lives that add up to it (the thresholds, and why a
    recompute's sizes would repeat them: docs/patterns.md).
    """
    if not len(at):
        return np.zeros(0, np.int64)
    csum = _alloc_size_csum(ctx)
    i = np.repeat(at.astype(np.int64), GATHER_LOOKBACK)
    j = i - np.tile(np.arange(1, GATHER_LOOKBACK + 1), len(at))
    keep = j >= 0
    i, j = i[keep], j[keep]
    keep = (ctx.size[j] > 0) & (ctx.free[j] > ctx.alloc[i])  # the gathered block, alive at the first piece
    i, j = i[keep], j[keep]
    want = csum[i] + ctx.size[j]
    k = np.searchsorted(csum, want, "right") - 1  # the longest run of allocations from i adding up to at most it
    ok = (csum[k] >= want - GATHER_SLACK) & (k - i >= MIN_PIECES)
    i, j, k = i[ok], j[ok], k[ok]
    # alive while the last piece is copied out of it, and let go right after
    ok = (ctx.free[j] > ctx.alloc[k - 1]) & (ctx.alloc.searchsorted(ctx.free[j]) - k <= GATHER_FREED_WITHIN)
    i, j, k = i[ok], j[ok], k[ok]
    if not len(i):
        return np.zeros(0, np.int64)
    w, idx = concat_ranges(i, k)
    at0 = np.concatenate([[0], np.cumsum(k - i)[:-1]])
    first, last = np.minimum.reduceat(ctx.free[idx], at0), np.maximum.reduceat(ctx.free[idx], at0)
    held = ctx.alloc.searchsorted(first)
    ok = ((held == ctx.alloc.searchsorted(last)) & (held - k >= GATHER_HELD)
          & (np.minimum.reduceat(ctx.size[idx], at0) < np.maximum.reduceat(ctx.size[idx], at0)))
    w, idx = concat_ranges(i[ok], k[ok])
    return np.unique(np.concatenate([idx, j[ok]]))
