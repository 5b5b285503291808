"""The optimizer's state, created in its first step and kept, and the temporaries of each update."""
from __future__ import annotations

import re

import numpy as np

from ..report import Pattern
from ..segment import P
from ..units import format_bytes
from .context import Context
from .gradients import gradient_allocs

_CLASS = re.compile(r"^Optimizer\.step#(\w+)\.step")
_FUSABLE = {"Adam", "AdamW", "SGD", "Adagrad"}


def optimizer_class(ctx: Context) -> str | None:
    """The optimizer's class, from PyTorch's own ``Optimizer.step#<Class>.step`` annotation."""
    for name in ctx.trace.markers.name:
        m = _CLASS.match(name)
        if m:
            return m.group(1)
    return None


def detect(ctx: Context, step: int) -> list[Pattern]:
    out = []
    s0, s1, _ = ctx.seg.steps[step]
    cls = optimizer_class(ctx)
    grads = gradient_allocs(ctx, step)
    grad_bytes = int(ctx.size[grads].sum()) if len(grads) else 0
    for o0, o1 in ctx.runs_of(step, "optimizer"):
        idx = ctx.allocs_between(o0, o1)
        idx = idx[ctx.phase_at_alloc[idx] == P["optimizer"]]
        if not len(idx):
            continue
        kept = idx[ctx.free[idx] >= s1]
        temp = idx[ctx.free[idx] <= o1]
        if len(kept):
            nbytes = int(ctx.size[kept].sum())
            ratio = nbytes / grad_bytes if grad_bytes else None
            times = f", {ratio:.2f}× the gradients" if ratio else ""
            what = {"Adam": "exp_avg and exp_avg_sq: two numbers per parameter",
                    "AdamW": "exp_avg and exp_avg_sq: two numbers per parameter",
                    "SGD": "one momentum buffer per parameter"}.get(cls or "", "buffers per parameter (Adam keeps two, momentum SGD one)")
            first, last = int(ctx.alloc[kept[0]]), int(ctx.alloc[kept[-1]])
            out.append(Pattern(
                kind="optimizer_state_init", step=step, phase="optimizer", start_event=first, end_event=last,
                peak_event=ctx.peak_in(first, last), bytes=nbytes,
                explanation=(
                    f"The optimizer creates its state on its first step: {format_bytes(nbytes)}{times} — "
                    f"{what}. It stays for the rest of training, raising every later step's floor. "
                    f"An 8-bit or factored optimizer, or sharding the state (FSDP/ZeRO), makes it smaller."
                ),
                details={"count": int(len(kept)), "ratio_to_gradients": round(ratio, 4) if ratio else None,
                         "optimizer": cls},
            ))
        if len(temp) >= 2:
            delta = np.zeros(o1 - o0 + 2, dtype=np.int64)
            np.add.at(delta, ctx.alloc[temp] - o0, ctx.size[temp])
            np.add.at(delta, ctx.free[temp] - o0, -ctx.size[temp])
            live = np.cumsum(delta)
            p = o0 + int(np.argmax(live))
            peak = int(live.max())
            at_peak = temp[(ctx.alloc[temp] <= p) & (ctx.free[temp] > p)]
            # The flagpole is the last sizeable temporary up there, not a scalar made after it.
            at_peak = at_peak[ctx.size[at_peak] >= 0.1 * ctx.size[at_peak].max()] if len(at_peak) else temp[-1:]
            pole = at_peak[np.argmax(ctx.alloc[at_peak])]
            pole_bytes = int(ctx.size[pole])
            advice = (" Pass fused=True to the optimizer: the fused kernel updates in place and allocates no "
                      "temporaries." if cls in _FUSABLE or cls is None else
                      " A fused implementation, where one exists, avoids them.")
            first, last = int(ctx.alloc[temp].min()), int(ctx.free[temp].max())
            out.append(Pattern(
                kind="optimizer_temporaries", step=step, phase="optimizer", start_event=first, end_event=last,
                peak_event=p, bytes=peak,
                explanation=(
                    f"The update's temporaries, the 'temple with a flagpole': a foreach update makes "
                    f"per-parameter intermediates for all parameters layer by layer (e.g. sqrt(exp_avg_sq)), a "
                    f"for-loop update one parameter's at a time; here up to {format_bytes(peak)} at once. The "
                    f"flagpole on top ({format_bytes(pole_bytes)}) is the last temporary, for the division just "
                    f"before the update is applied.{advice}"
                ),
                details={"count": int(len(temp)), "flagpole_bytes": pole_bytes, "optimizer": cls},
            ))
    return out
