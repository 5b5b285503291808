"""Which blocks hold per-token values, and how each grows with the batch and sequence
(``block_growth``); the batch or sequence scaled as a change to the blocks.

Example:
    >>> block_growth(Facts(report.analysis, report.patterns)).kind   # CONSTANT, LINEAR or QUADRATIC per block
"""
from __future__ import annotations

import numpy as np

from ...analysis.infer.frames import per_stack
from ...analysis.sizes import in_sorted
from ...units import format_bytes
from ...vocab import C, P
from ..blocks import Facts
from ..scaling import CONSTANT, QUADRATIC, Growth, growth
from .cross_entropy import _vocab

#: A block of half a weight's gradient's size is the weight's half-precision copy when made at most
#: this many times per such gradient: autocast's cast in forward and the half-precision weight gradient
#: in backward, once per step each. Made more often, that size also holds per-token values (at B 2,
#: fixtures/capacity's GPT's 4.5 MiB is both its MLP weights' bf16 casts and its qkv outputs): then a
#: forward block followed by more of its op's blocks is the cast, the rest scale. Before, any block of
#: a pre-existing block's size was a copy: cuBLAS's 32 MiB workspace made fixtures/pairs2/llama's 32 MiB
#: attention scores constant (seq x4 -12 %), and at B 2 llama's 2.75 MiB MLP activations were its MLP
#: weights' size (-3.4 % at batch x7).
COPIES_PER_WEIGHT = 2
#: A scaled size at or past this wraps in an int64 (a corrupt trace's sizes).
_I64 = float(1 << 63)


def _in_torch_layer(trace) -> np.ndarray:
    """Per stack id (``per_stack``): the innermost Python frame is torch's layer code (torch/nn/)."""
    def of(frames):
        py = [fn.replace("\\", "/") for fn, _, _ in frames if fn.endswith(".py")]
        return bool(py) and "/torch/nn/" in py[0]

    return per_stack(trace, of)


def _weight_copies(f: Facts, candidates: np.ndarray) -> np.ndarray:
    """Of ``candidates`` (a mask), the weights' copies, which do not grow with the tokens: blocks of a
    gradient's size or half of it, told from per-token blocks of those sizes by how often they are made
    (COPIES_PER_WEIGHT) and whether more of their op's blocks follow; without gradients in the trace,
    blocks of a pre-existing block's size. Each case, and the traces: docs/what-if.md."""
    grads = np.flatnonzero((f.cat == C["gradient"]) & (f.alloc >= 0))
    if not len(grads):
        return candidates & in_sorted(f.size, np.unique(f.an.facts.param_sizes))
    idx = np.flatnonzero(candidates)
    stack, ev = f.an.trace.stack, f.alloc[idx]
    nxt = np.minimum(ev + 1, f.n - 1)
    framed = stack[ev] >= 0
    # a cast is followed by more of its op's blocks (the input's or bias's cast, the output: the same
    # stack), and autocast casts weights inside torch's layers; a matmul on the program's own line
    # copies its inputs the same way but casts no weight (capacity run 2's ViT: q and k, 0.75 MiB)
    same_op = framed & (stack[nxt] == stack[ev]) & (nxt > ev) & _in_torch_layer(f.an.trace)[stack[ev]]
    fwd = f.phase_alloc[idx] == P["forward"]
    out = np.zeros(len(f.size), bool)
    gs, gn = np.unique(f.size[grads], return_counts=True)
    gpos = np.minimum(np.searchsorted(gs, f.size[idx]), len(gs) - 1)
    eq = gs[gpos] == f.size[idx]
    # backward: one partial sum per gradient and step at most (a tied head's); more is per-token
    made_bwd = np.bincount(gpos[eq & ~fwd], minlength=len(gs))
    out[idx[eq & ~fwd & (made_bwd <= gn)[gpos]]] = True
    # forward: a weight's fp32 copy cannot be told from a per-token block of its size by the frames (a
    # rotary line makes several per-token blocks in a row): only where the trace has none
    out[idx[eq & fwd & ~framed]] = True
    half, n = np.unique(f.size[grads] // 2, return_counts=True)
    pos = np.minimum(np.searchsorted(half, f.size[idx]), len(half) - 1)
    hit = (half[pos] == f.size[idx]) & ~eq
    made = np.bincount(pos[hit], minlength=len(half))
    alone = hit & (made <= COPIES_PER_WEIGHT * n)[pos]
    out[idx[alone | (hit & fwd & same_op)]] = True
    return out


def _batch_dependent(f: Facts) -> np.ndarray:
    """Blocks that scale with the tokens: made in forward, loss or backward, or an input; not the
    weights, their gradients, the optimizer's state, the weights' copies, or one-off workspaces."""
    made = np.isin(f.phase_alloc, [P["forward"], P["loss"], P["backward"]]) | (f.cat == C["input"])
    kept = np.isin(f.cat, [C["parameter"], C["gradient"], C["optimizer_state"]])
    out = made & ~kept & (f.alloc >= 0)
    out &= ~_weight_copies(f, out)
    out[f.members("workspace", "gradients")] = False
    return out


def block_growth(f: Facts) -> Growth:
    """How each block grows with the tokens (scaling.growth), once per trace."""
    if f._growth is None:
        vocab = np.zeros(len(f.size), bool)
        vocab[_vocab(f)] = True
        step = np.where(f.alloc >= 0, f.an.step_of[np.maximum(f.alloc, 0)], -1)
        recompute = bool(len(f.members("checkpoint_recompute", "forward_rerun")))
        f._growth = growth(f.an.trace, f.alloc, f.free, f.size, f.phase_alloc,
                           f.phase_free, step, _batch_dependent(f), vocab, recompute)
    return f._growth


def _scale(f: Facts, batch: float = 1.0, seq: float = 1.0):
    g = block_growth(f)
    scaled = g.kind != CONSTANT
    if not scaled.any():
        return "no block made in forward or backward scales with the tokens here"
    if seq != 1 and not g.sequence_known:
        return g.evidence
    quad = int((g.kind == QUADRATIC).sum())
    if batch != 1:
        text = (f"The batch x {batch:g}: the {int(scaled.sum())} blocks that hold per-token values (activations, "
                f"per-token temporaries, logits, inputs) x {batch:g}; parameters, gradients and optimizer state stay.")
    else:
        text = (f"The sequence x {seq:g}: {int(scaled.sum()) - quad} per-token blocks x {seq:g}"
                + (f", {quad} attention-score blocks (batch x heads x T x T) x {seq * seq:g}" if quad else "")
                + "; parameters, gradients and optimizer state stay.")
    scaled = np.round(f.size * g.factor(batch, seq))
    if not (np.abs(scaled) < _I64).all():  # an int64 cast of these would wrap (a corrupt trace's sizes)
        return (f"a block of {format_bytes(int(f.size.max()))} scaled so passes 64 bits: these sizes are no real "
                "run's (a corrupt trace)")
    ch = f.change(text, "blocks of a parameter's size are weights' copies (bf16 casts) and do not scale",
                  "the allocator's rounding (512 B, 2 MiB for large blocks) is ignored",
                  *([g.evidence] if seq != 1 else []))
    ch.size = scaled.astype(np.int64)
    return ch
