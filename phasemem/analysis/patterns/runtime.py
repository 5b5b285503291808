"""What the runtime allocates around the model: cuBLAS/cuDNN workspaces made once and kept, and
the scalars between backward and the optimizer: AMP GradScaler's unscale/inf check, or gradient
clipping's norms."""
from __future__ import annotations

import numpy as np

from ...model import Pattern
from ...units import format_bytes
from ...vocab import PHASES, P
from ..facts import Context, gradient_allocs, per_trace
from .shape_kind import INK, ShapeKind

SCALAR = 64  # bytes: found_inf, inv_scale and their per-device copies are one-element tensors
#: A block this large between backward and the optimizer is backward's, not unscaling's or clipping's.
TAIL_BLOCK = 1 << 20
CLIP_MIN = 12  # scalars before the optimizer that are clipping's norms, not GradScaler's check
MIN_WORKSPACE = 512 << 10


def workspaces(ctx: Context) -> list[Pattern]:
    """Blocks the first step makes in forward or backward and nobody ever frees, that are not
    gradients: the math libraries' workspaces (cuBLAS keeps one per stream and thread — the
    autograd thread gets its own in the first backward) and caches."""
    if len(ctx.seg.steps) < 2:
        return []  # with one step, what outlives it may be its outputs
    s0, s1, _ = ctx.seg.steps[0]
    idx = ctx.allocs_between(s0, s1 - 1)
    # Workspaces are megabytes; a few bytes kept for good are state (GradScaler's scale), not this.
    keep = ((ctx.free[idx] >= ctx.n) & (ctx.size[idx] >= MIN_WORKSPACE)
            & np.isin(ctx.phase_at_alloc[idx], [P["forward"], P["backward"], P["loss"]]))
    idx = idx[keep & ~np.isin(idx, gradient_allocs(ctx, 0))]
    if not len(idx):
        return []
    nbytes = int(ctx.size[idx].sum())
    first, last = int(ctx.alloc[idx[0]]), int(ctx.alloc[idx[-1]])
    return [Pattern(
        kind="workspace", step=0, phase=PHASES[int(ctx.phase_at_alloc[idx[0]])],
        start_event=first, end_event=last, peak_event=first, bytes=nbytes,
        explanation=(
            f"{len(idx)} block(s), {format_bytes(nbytes)}, made during the first step and never freed: the math "
            f"libraries' workspaces (cuBLAS keeps one per stream and thread, 32 MiB each on Hopper; the autograd "
            f"thread makes its own in the first backward) and similar caches. They are paid once per process; "
            f"CUBLAS_WORKSPACE_CONFIG can make cuBLAS's smaller."
        ),
        details={"count": int(len(idx)), "sizes": sorted({int(x) for x in ctx.size[idx]})},
        members=tuple(idx.tolist()),
    )]


def before_step(ctx: Context, step: int) -> list[Pattern]:
    """Scalar allocations between the last backward and the optimizer: GradScaler.unscale_ checking
    the gradients for inf/NaN (found_inf, inv_scale per device: a handful), or gradient clipping
    (``clip_grad_norm_``: one norm per gradient, then their total and the clip coefficient)."""
    if step not in _steps_with_scalars(ctx):
        return []  # (most steps: read for every step at once)
    bwd = ctx.runs_of(step, "backward")
    opt = ctx.runs_of(step, "optimizer")
    if not bwd or (opt and opt[0][0] <= bwd[-1][1]):
        return []
    # A fused optimizer makes no events after its first step: then up to the step's end.
    a, b = bwd[-1][1] + 1, (opt[0][0] if opt else ctx.seg.steps[step][1]) - 1
    idx = ctx.allocs_between(a, b)
    idx = idx[ctx.phase_at_alloc[idx] == P["other"]]
    scalars = idx[ctx.size[idx] <= SCALAR]
    if len(scalars) < 2:
        return []
    first, last = int(ctx.alloc[scalars[0]]), int(ctx.alloc[scalars[-1]])
    # GradScaler makes 6 on one device (measured: mlp_fp16_scaler, gpt_fp16_accum); clipping makes
    # one per gradient (17-79 on the held-out traces that clip).
    grads = len(gradient_allocs(ctx, step)) or len(gradient_allocs(ctx, 0))
    if len(scalars) >= max(CLIP_MIN, grads // 2):
        kind, nbytes = "grad_clip", int(ctx.size[idx].sum())
        why = (f"Gradient clipping between backward and optimizer.step: {len(scalars)} one-element tensors, one "
               f"norm per gradient and then their total and the clip coefficient (clip_grad_norm_); the gradients "
               f"are scaled in place. Negligible memory; GradScaler's unscale, if the loop uses one, is among them.")
    elif (ctx.size[idx[ctx.alloc[idx] <= last]] >= TAIL_BLOCK).any():
        # Large blocks in the gap say backward has not ended: its tail was taken for 'other', and a
        # few scalars there are backward's (fixtures/big/torch_defaults_big without frames: the
        # embedding's 147 MiB gradient and two 8-byte scalars were called GradScaler's check).
        # Clipping's many norms stay evidence enough (heldout2_gpt_accum4_bf16_clip without frames).
        # Only blocks up to the last scalar count: after it comes what the next iteration uploads
        # where a step ends at the next forward (a skipped update: h9_scaler_skips_first's batches).
        return []
    else:
        kind, nbytes = "amp_unscale", int(ctx.size[scalars].sum())
        why = (f"AMP's GradScaler checking the gradients before the update: {len(scalars)} one-element tensors "
               f"(the inf/NaN flag and the inverse scale, per device) between backward and optimizer.step. "
               f"Negligible memory; it unscales the gradients in place, so no gradient-sized copies appear.")
    return [Pattern(kind=kind, step=step, phase="other", start_event=first, end_event=last, peak_event=last,
                    bytes=nbytes, explanation=why, details={"count": int(len(scalars))})]


@per_trace
def _steps_with_scalars(ctx: Context) -> set[int]:
    """The steps before_step reads further, every step at once: a backward run, no optimizer run
    before its last one ends, and at least two scalars of 'other' between that and the step's first
    optimizer run (or its end). Running sums over the allocations count each gap's scalars."""
    last_bwd = ctx.phase_span("backward")[1]
    first_opt = ctx.phase_span("optimizer")[0]  # none: past every event
    has_opt = first_opt <= ctx.n
    ok = (last_bwd >= 0) & ~(has_opt & (first_opt <= last_bwd))
    ends = np.array([s[1] for s in ctx.seg.steps], np.int64)
    a, b = last_bwd + 1, np.where(has_opt, first_opt, ends) - 1
    scalar = (ctx.phase_at_alloc == P["other"]) & (ctx.size <= SCALAR)
    c = np.concatenate([[0], np.cumsum(scalar)])
    count = c[ctx.alloc.searchsorted(b + 1)] - c[ctx.alloc.searchsorted(a)]
    return set(np.flatnonzero(ok & (count >= 2)).tolist())


KINDS = (
    ShapeKind("amp_unscale", before_step, per_step=True, marker="d", colour=INK, priority=None,
              size_label="all of them",
              explanation="AMP GradScaler's one-element tensors between backward and the update: the inf/NaN "
                          "check and the inverse scale.", order=100),
    ShapeKind("grad_clip", before_step, per_step=True, marker=">", colour=INK, priority=None,
              size_label="all of them",
              explanation="Gradient clipping's norms between backward and the update: one per gradient, then "
                          "their total and the clip coefficient.", order=110),
    ShapeKind("workspace", workspaces, per_step=False, marker="8", colour=INK, priority=100,
              size_label="all of them",
              explanation="Blocks the first step makes and never frees that are no gradients: the math "
                          "libraries' workspaces, paid once per process.", order=120),
)
