"""Gradients and the optimizer, told by the parameters' sizes.

The blocks alive before the trace began are (mostly) the parameters. A backward allocates a
gradient of each trainable parameter's size; an optimizer's temporaries and state are those sizes
too. Inference, gradient clipping's norms and GradScaler's checks allocate other sizes.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import Trace
from ...vocab import P
from ..timeline import Timeline
from .bursts import FREED_TOGETHER
from .odd_steps import chunked_gradients

GRAD_SHARE = 0.25  # of the parameters' distinct sizes a backward must allocate
#: Fewer distinct parameter sizes than this say nothing about which later blocks are gradients or
#: optimizer work (a one-layer toy, a model made after recording began): the size tests then pass,
#: and other evidence (mountains, bursts) decides. An MLP of two equal layers has two sizes.
MIN_PARAM_SIZES = 3


#: Blocks of at most this many bytes hold a scalar (sizes are as requested: a float's 4, a double's 8; a
#: 128-float bias is 512). Where a parameter is one (capturable Adam keeps its step counts as scalars on
#: the device), clip_grad_norm_'s per-parameter norms have a parameter's size too and began the optimizer
#: (h7_capturable_adam: 0.58 of its optimizer right). Up to 512 bytes cut 0.27 of h8_weight_norm's
#: optimizer (its small parameters' updates begin it).
SCALAR = 8


def covers_parameters(params: np.ndarray, sizes: np.ndarray) -> bool:
    """Do these blocks come in enough of the parameters' sizes to be gradients, or an optimizer's
    temporaries? With fewer than MIN_PARAM_SIZES parameter sizes known there is nothing to compare: yes."""
    return len(params) < MIN_PARAM_SIZES or float(np.isin(params, sizes).mean()) >= GRAD_SHARE


def sized_like_an_optimizer(params: np.ndarray, grads: np.ndarray, sizes: np.ndarray) -> bool:
    """Do blocks of these sizes look like an optimizer's work? Its temporaries and state have the
    parameters' sizes (else, with no parameter made before the trace, the gradients'). Without either
    there is no evidence, and no optimizer is claimed: a forward + backward benchmark with no
    optimizer (magma27_cs336 in ../shared/wild) allocates other sizes after its backward."""
    ref = params if len(params) else np.unique(grads)
    if not len(ref) or not len(sizes):
        return False
    if len(ref) < MIN_PARAM_SIZES:  # an MLP of equal layers has two sizes: one must recur
        return bool(np.isin(ref, sizes).any())
    return float(np.isin(ref, sizes).mean()) >= GRAD_SHARE


def parameter_sizes(tl: Timeline) -> np.ndarray:
    """The distinct sizes of the blocks alive before the trace began: the parameters' (mostly)."""
    life = tl.lifetimes
    return np.unique(life.size[life.preexisting])


def optimizer_start(trace: Trace, allocs: np.ndarray, params: np.ndarray, b1: int, end: int,
                     labels: np.ndarray, free_of: np.ndarray, top: int) -> int:
    """Where the optimizer begins after a backward that ended at ``b1``: after backward's last
    parameter-sized gradients and any user code that allocates only other sizes (clipping's norms,
    GradScaler's unscale); those gradients, and a late embedding's (``_late_gradients``), stay backward's.
    Why: docs/accuracy.md.
    """
    ours = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, end, "right")]
    if len(params) < MIN_PARAM_SIZES or not len(ours):
        return b1 + 1
    sized = np.isin(trace.size[ours], params)
    if not sized.any():
        return b1 + 1
    late = _late_gradients(trace, allocs, params, free_of, top, b1, end, ours, sized)
    if late < 0:
        late = chunked_gradients(trace, allocs, params, free_of, top, b1, ours, sized)
    if late < 0:
        other = np.flatnonzero(~sized)
        before = ours[:other[0]][sized[:other[0]]] if len(other) else ours[:0]
        # ... only where what comes before the other sizes is backward's last gradients, alive across
        # them and freed later (by zero_grad), not the update itself: its state kept for good, its
        # temporaries freed before them (heldout3_clip_infonce: AdamW's first steps read as backward)
        if len(before) >= LATE_UPDATE and np.mean((free_of[before] > ours[other[0]])
                                                  & (free_of[before] < len(trace))) < LATE_SHARE:
            return int(ours[np.argmax(sized)])
        return _first_sized(labels, b1, ours, sized)
    # The embedding's backward runs after the last activation is freed: its sort buffers (other sizes),
    # its gradient, more buffers; the optimizer's blocks come after that, and backward ends with the
    # last free, before the optimizer begins, of what it made there.
    g = int(ours[late])
    start = _first_sized(labels, g, ours[late + 1:], sized[late + 1:]) if sized[late + 1:].any() else g + 1
    made = ours[ours < start]
    freed = free_of[made][free_of[made] < start]
    labels[b1 + 1:max(g, int(freed.max()) if len(freed) else g) + 1] = P["backward"]
    return start


def _first_sized(labels: np.ndarray, b1: int, ours: np.ndarray, sized: np.ndarray) -> int:
    """The first parameter-sized allocation after the first of another size, where one comes first
    (clipping's norms, GradScaler's checks before the optimizer), else the first parameter-sized one;
    what comes before it is labelled backward."""
    other = np.flatnonzero(~sized)
    if len(other) and sized[other[0]:].any():
        labels[b1 + 1:ours[other[0]]] = P["backward"]
        return int(ours[other[0] + np.argmax(sized[other[0]:])])
    return int(ours[np.argmax(sized)])


#: Share of the parameter-sized blocks between a backward's last activation free and the first block
#: of another size that must outlive the other sizes and be freed (gradients zero_grad frees later) for
#: them to be backward's last gradients rather than the update itself, where they are LATE_UPDATE or
#: more (as pass_labels.MIN_UPDATE_BLOCKS): updates so read make 7-312, at most 0.43 of them alive so
#: (h6_optim_in_backward's hooks); 1-3 blocks are a backward's temporaries (truth_gpt_accum_clip's
#: embedding gradient's buffer) or its last gradients.
LATE_SHARE = 0.5
LATE_UPDATE = 4



def _late_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray, top: int, b1: int,
                    end: int, ours: np.ndarray, sized: np.ndarray) -> int:
    """Position in ``ours`` of the last of the parameter-sized blocks made first after ``b1`` that are
    freed among the pass's gradients (within FREED_TOGETHER events of the run of their frees: zero_grad
    freeing them one after another), else -1. Such a block is a gradient, not the optimizer's: without
    frames, h15_shared_layers' and h15_selective_ac's embedding gradients (64 and 48 MiB, made after the
    last activation's free) began the optimizer and were taken for its state."""
    n = len(trace)
    made = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
    grads = made[np.isin(trace.size[made], params) & (free_of[made] > b1) & (free_of[made] < n)]
    if len(grads) < 2:
        return -1
    # The gradients' frees: the largest run of them at most FREED_TOGETHER apart (zero_grad frees them
    # one after another). A backward block of a weight's size freed while clipping or the optimizer
    # runs is not among them (heldout_bert_mlm: clip_grad_norm_'s blocks were taken for gradients).
    fs = np.sort(free_of[grads])
    run = np.concatenate([[0], np.cumsum(np.diff(fs) > FREED_TOGETHER)])
    big = fs[run == np.argmax(np.bincount(run))]
    if big[0] <= end:
        # zero_grad right after step(): the optimizer's last temporaries are freed just before the
        # gradients, and nothing tells them from a gradient (truth_gpt_foreach, gpt_zero_grad_end)
        return -1
    f = free_of[ours]
    near = (f >= big[0] - FREED_TOGETHER) & (f <= big[-1] + FREED_TOGETHER)
    # ... and only those before the first weight-sized block that is not: the optimizer's first block
    # (state it keeps, or a temporary freed in its own burst) ends the backward's late gradients
    sp = np.flatnonzero(sized)
    ok = (f[sp] < n) & near[sp]
    k = len(sp) if ok.all() else int(np.argmin(ok))
    return int(sp[k - 1]) if k else -1


def keeps_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                     top: int, b1: int, nxt: int) -> bool:
    """Parameter-sized blocks made in this backward that outlive it (after the last pass: to the
    trace's end, since what a loop frees on its way out is no gradient)."""
    made = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
    made = made[np.isin(trace.size[made], params)]
    kept = free_of[made] > b1
    if nxt >= len(trace):
        # ... or freed after an update (parameter-sized work between), and the loop went on allocating
        # after it (hf_oom: step 0's gradients freed by zero_grad after AdamW, then the next step's
        # forward ran out of memory before it made a pass; heldout2_convnext_eval, inference, frees its
        # per-channel blocks at the loop's end with no update before)
        last = int(free_of[made][kept].max()) if kept.any() else len(trace)
        update = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, last, "left")]
        went_on = (len(allocs) - np.searchsorted(allocs, last, "right") >= WENT_ON
                   and len(params) >= MIN_PARAM_SIZES and covers_parameters(params, trace.size[update]))
        kept &= (free_of[made] == nxt) | went_on
    return int(kept.sum()) >= 2


#: Allocations after the frees of a last pass's gradients that show the loop went on (a next step's
#: forward; hf_oom makes 6 before the out-of-memory error, a loop's exit none).
WENT_ON = 4


def makes_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, top: int, b1: int) -> bool:
    """A backward allocates a gradient the size of each trainable parameter; a forward keeping a
    KV cache (generate()) frees last-made-first too, but makes no such blocks. Measured share of the
    parameters' distinct sizes met after the top: training 0.33 (LoRA) to 1.0, inference 0 to 0.14.
    Without parameters made before the trace there is nothing to compare: no objection."""
    made = trace.size[allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]]
    return covers_parameters(params, made)
