"""Checkpoint recompute told by stack frames, and the ripples' common parts.

Where the frames say who made backward's allocations, the recompute runs need no sizes: torch.utils.
checkpoint's own recompute (``infer.frames.checkpoint_recomputes``), or a compiled backward's replays of
the forward's random ops (``infer.frames.rng_replays``). The runs of a mask, their span and their
pattern (``ripples``) serve both this and the sizes' reading in ``recompute.py``.
"""
from __future__ import annotations

import numpy as np

from ...model import Pattern
from ...units import format_bytes
from ..facts import Context, per_trace
from ..infer.frames import checkpoint_recomputes, rng_replays

#: Separate recompute runs one backward run must hold to be the ripples (one repeat proves no checkpoint).
MIN_RUNS = 2


def runs(mask: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray]:
    padded = np.zeros(len(mask) + 2, np.int8)
    padded[1:-1] = mask
    edges = np.flatnonzero(padded[1:] != padded[:-1])  # start, stop, start, stop...
    starts, stops = edges[0::2], edges[1::2]
    if len(starts) < 2:
        return starts, stops
    apart = starts[1:] - stops[:-1] > gap  # runs closer than gap are joined (masks: np.delete's cost, 8,000 calls at 10M)
    return starts[np.concatenate([[True], apart])], stops[np.concatenate([apart, [True]])]


def median(x: np.ndarray) -> float:
    """np.median of a few numbers (its overhead was ~40 us a call, twice per backward run at 10M events)."""
    if len(x) == 0:
        return float(np.median(x))
    s = np.sort(x)
    k = len(s) // 2
    return float(s[k]) if len(s) % 2 else (float(s[k - 1]) + float(s[k])) / 2


def span(ctx: Context, bwd: np.ndarray, starts, stops, b1: int) -> tuple[int, int, int]:
    """(first event, last event, median bytes per run) of runs ``bwd[starts[i]:stops[i]]``: from the
    first run's first allocation to the last run's last free inside the backward run (or its last
    allocation, if later)."""
    csize = np.concatenate([[0], np.cumsum(ctx.size[bwd])])
    per_run = int(median(csize[np.asarray(stops)] - csize[np.asarray(starts)]))
    first = int(ctx.alloc[bwd[starts[0]]])
    last = int(min(ctx.free[bwd[starts[-1]:stops[-1]]].max(), b1))
    return first, max(last, int(ctx.alloc[bwd[stops[-1] - 1]])), per_run


def ripples(ctx: Context, step: int, first: int, last: int, per_block: int, explanation: str,
             members: np.ndarray, details: dict, kind: str = "checkpoint_recompute",
             confidence: float = 1.0) -> Pattern:
    return Pattern(kind=kind, step=step, phase="backward", start_event=first, end_event=last,
                   peak_event=ctx.peak_in(first, last), bytes=per_block, explanation=explanation,
                   details=details, confidence=confidence, members=tuple(members.tolist()))


def _checkpoint_runs(ctx: Context, bwd: np.ndarray):
    """(allocations, starts, stops): the backward run's allocations less the math libraries' workspaces,
    and the runs among them that checkpoint's recompute made (infer.frames.checkpoint_recomputes). The
    autograd thread's cuBLAS workspace is made by the first matmul it runs, a recompute's if that comes
    first, and kept for good (h15_chunked_ce): no activation, and no break between two blocks."""
    if not len(bwd) or _checkpoint_allocs(ctx, bwd) == 0:
        return bwd[:0], np.zeros(0, np.int64), np.zeros(0, np.int64)  # most runs: no checkpoint frame at all
    bwd = bwd[~ctx.made_by_workspace_getter(ctx.alloc[bwd])]
    ck = _checkpoint_stacks(ctx)[ctx.trace.stack[ctx.alloc[bwd]]]
    starts, stops = runs(ck, 0)
    return bwd, starts, stops


def _checkpoint_allocs(ctx: Context, bwd: np.ndarray) -> int:
    """How many of the consecutive allocations ``bwd`` checkpoint's recompute made, workspaces aside
    (what _checkpoint_runs would find runs in), by two searches in the trace's list of them."""
    if int(bwd[-1]) - int(bwd[0]) != len(bwd) - 1:
        return len(bwd)  # not one stretch: count nothing, _checkpoint_runs reads them one by one
    at = checkpoint_positions(ctx)
    return int(at.searchsorted(int(bwd[-1]) + 1) - at.searchsorted(int(bwd[0])))


@per_trace
def _checkpoint_stacks(ctx: Context) -> np.ndarray:
    """Per stack id: made by checkpoint's recompute (infer.frames.checkpoint_recomputes)."""
    return checkpoint_recomputes(ctx.trace)


@per_trace
def _replay_stacks(ctx: Context) -> np.ndarray:
    """Per stack id: a compiled backward's RNG replay (infer.frames.rng_replays)."""
    return rng_replays(ctx.trace)


@per_trace
def checkpoint_positions(ctx: Context) -> np.ndarray:
    """The allocations (positions, sorted) that checkpoint's recompute made, workspaces aside: none in
    a trace without checkpointing."""
    ck = _checkpoint_stacks(ctx)[ctx.trace.stack[ctx.alloc]]
    return np.flatnonzero(ck & ~ctx.made_by_workspace_getter(ctx.alloc))


@per_trace
def replay_positions(ctx: Context) -> np.ndarray:
    """The allocations (positions, sorted) of a compiled backward's RNG replays (infer.frames.rng_replays)."""
    return np.flatnonzero(_replay_stacks(ctx)[ctx.trace.stack[ctx.alloc]])


def from_frames(ctx: Context, step: int, bwd: np.ndarray, b1: int) -> Pattern | None:
    """The ripples from checkpoint's frames alone: at least MIN_RUNS separate recomputes in one
    backward run (h15_selective_ac: 6 blocks under a selective policy; h15_chunked_ce: 8 loss chunks),
    where the sizes never repeat K in a row."""
    if not len(bwd):
        return None
    bwd, starts, stops = _checkpoint_runs(ctx, bwd)
    return _told_runs(ctx, step, bwd, starts, stops, b1, "frames", 1.0, lambda count, per_block: (
        f"Activation checkpointing at work: backward re-runs the forward of each checkpointed block before "
        f"differentiating it, {count} times here, allocating about {format_bytes(per_block)} per block and freeing "
        f"it as backward moves on (the stack frames show torch.utils.checkpoint's recompute; what a block saved "
        f"in forward, e.g. under a selective policy, is not made again). This trades compute for memory; "
        f"checkpoint fewer blocks if memory allows, to run faster."))


#: Confidence of the ripples told by compiled RNG replays alone: the replays prove that forward ops run
#: again inside backward; that a checkpoint (not the partitioner's own choice) asked for it is inferred.
RNG_REPLAY_CONFIDENCE = 0.9


def from_rng_replays(ctx: Context, step: int, bwd: np.ndarray, b1: int) -> Pattern | None:
    """The ripples of a checkpointed region recomputed inside a compiled backward (no checkpoint frame:
    torch.compile ignores them), told by the forward's random ops replayed with their saved RNG state
    (infer.frames.rng_replays): at least MIN_RUNS separate runs of such blocks in one backward run
    (fixtures/fsdp2: 6 runs of 5, one per checkpointed block, the attention's output and logsumexp)."""
    if not len(bwd):
        return None
    table = _replay_stacks(ctx)
    if int(bwd[-1]) - int(bwd[0]) == len(bwd) - 1:  # one stretch: count its replays by two searches first
        at = replay_positions(ctx)
        if int(at.searchsorted(int(bwd[-1]) + 1) - at.searchsorted(int(bwd[0]))) < MIN_RUNS:
            return None  # fewer replays than runs wanted (every run of a trace not compiled with checkpoints)
    starts, stops = runs(table[ctx.trace.stack[ctx.alloc[bwd]]], 0)
    return _told_runs(ctx, step, bwd, starts, stops, b1, "rng_replay", RNG_REPLAY_CONFIDENCE, lambda count, per_block: (
        f"The forward runs again inside the compiled backward: torch.compile replays the forward's random ops "
        f"with the RNG state the forward saved (torch/_prims/rng_prims.py), {count} times here — activation "
        f"checkpointing under torch.compile, each checkpointed region recomputed inside the backward graph. Only "
        f"those ops' blocks are told apart, about {format_bytes(per_block)} per region; the rest of each "
        f"recompute is fused in the graph and carries no frame that says so. This trades compute for memory; "
        f"checkpoint fewer blocks if memory allows, to run faster."))


def _told_runs(ctx: Context, step: int, bwd: np.ndarray, starts, stops, b1: int, evidence: str, confidence: float,
               words) -> Pattern | None:
    """The ripples of the runs ``bwd[starts[i]:stops[i]]`` that frames told apart (at least MIN_RUNS),
    worded by ``words(count, bytes per run)``."""
    if len(starts) < MIN_RUNS:
        return None
    first, last, per_block = span(ctx, bwd, starts, stops, b1)
    count = len(starts)
    return ripples(
        ctx, step, first, last, per_block, words(count, per_block),
        np.concatenate([bwd[a:b] for a, b in zip(starts, stops)]),
        {"count": count, "bytes_per_layer": per_block, "framed": True, "from_frames": True, "evidence": evidence,
         "run_events": [[int(ctx.alloc[bwd[a]]), int(ctx.alloc[bwd[b - 1]])] for a, b in zip(starts, stops)]},
        confidence=confidence)


def recompute_calls(ctx: Context, bwd: np.ndarray):
    """(recomputes, median bytes each) where the stack frames show checkpoint's own recompute: each
    block's forward runs again under torch/utils/checkpoint.py (reentrant: CheckpointFunction.backward;
    non-reentrant: its unpack hook), and the block's gradients, computed between two recomputes, are
    the engine's (infer.frames.checkpoint_recomputes). The matching runs of sizes split a block where
    its tensors' order differs (h10_hf_reentrant_ckpt: 17 runs for 4 layers); the frames count calls.
    None without such frames."""
    bwd, starts, stops = _checkpoint_runs(ctx, bwd)
    if not len(starts):
        return None
    csize = np.concatenate([[0], np.cumsum(ctx.size[bwd])])
    return len(starts), int(median(csize[stops] - csize[starts]))
