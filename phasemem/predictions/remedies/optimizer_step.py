"""The optimizer's remedies: a fused update (no temporaries), 8-bit state, and zero_grad moved before
forward."""
from __future__ import annotations

import numpy as np

from ...units import format_bytes
from ...vocab import C
from ..blocks import Facts

#: 8-bit optimizer state (bitsandbytes' AdamW8bit) keeps 1 byte per number where torch keeps 4.
STATE_FACTOR = 0.25
#: ... and does not apply where the state is already below its gradients (patterns.optimizer.SMALLER).
SMALLER_STATE = 0.98


def _fused_optimizer(f: Facts):
    temps = f.members("optimizer_temporaries")
    if not len(temps):
        return ("no optimizer temporaries in this trace (the optimizer is fused already, updates without "
                "intermediates, or ran where the trace does not show it)")
    ch = f.change(f"A fused optimizer updates in place: the {len(temps)} update temporaries "
                  f"({format_bytes(int(f.size[temps].max()))} the largest) are not made.",
                  "fused AdamW allocates nothing after its first step (measured on the H200, torch 2.11)")
    ch.size[temps] = 0
    return ch


def _zero_grad_before_forward(f: Facts):
    moved = []
    for s in range(len(f.an.segmentation.steps)):
        fwd = f.runs(s, "forward")[0]
        for z0, z1 in zip(*f.runs(s, "zero_grad")):
            if not len(fwd) or fwd[0] >= z0:
                continue
            # only what already exists before forward can be freed there: not the gradients an
            # optimizer run inside backward frees as it makes them (h6_optim_in_backward)
            idx = f.freed_in(int(z0), int(z1))
            moved.append((idx[f.alloc[idx] < int(fwd[0])], int(fwd[0]) - 1))
    if not moved or not sum(len(i) for i, _ in moved):
        return "zero_grad already runs before forward (or frees nothing after it): nothing to move"
    ch = f.change("zero_grad(set_to_none=True) moves before forward: last step's gradients are freed before the "
                  "forward's activations are made instead of after them.",
                  "the gradients are not read between forward and the old zero_grad")
    for idx, at in moved:
        ch.free[idx] = at
    return ch


def _smaller_optimizer_state(f: Facts):
    state = np.flatnonzero(f.cat == C["optimizer_state"])
    if not len(state):
        return "no optimizer state in this trace"
    # State already below its gradients is kept in fewer bits or factored: a quarter of it is no 8-bit
    # optimizer's (h16_adam8bit's blockwise 8-bit Adam, 0.50x its fp32 gradients, was "kept in a quarter").
    small = [p.details["ratio_to_gradients"] for p in f.patterns if p.kind == "optimizer_state_init"
             and p.details.get("ratio_to_gradients") is not None and p.details["ratio_to_gradients"] < SMALLER_STATE]
    if small:
        return (f"the optimizer's state is already smaller than its gradients ({min(small):.2f}×): kept in fewer bits "
                f"or factored, it would not shrink to a quarter again")
    # the most state alive at once, not every state block summed: an optimizer that rebinds its state
    # makes it anew every step (wild/wedsonlin_medium512_train: 3.15 GiB at a time, 6.31 GiB made in all)
    points = np.concatenate([f.alloc[state], f.free[state]])
    change = np.concatenate([f.size[state], -f.size[state]])[np.argsort(points, kind="stable")]
    most = int(np.cumsum(change).max())
    ch = f.change(f"8-bit optimizer state: {format_bytes(most)} of state kept in a quarter "
                  f"of the bytes.", f"{STATE_FACTOR:g}× the state's bytes (remedies.STATE_FACTOR)")
    ch.size[state] = (f.size[state] * STATE_FACTOR).astype(np.int64)
    return ch
