"""Gradients and the optimizer, told by the parameters' sizes.

The blocks alive before the trace began are (mostly) the parameters. A backward allocates a
gradient of each trainable parameter's size; an optimizer's temporaries and state are those sizes
too. Inference, gradient clipping's norms and GradScaler's checks allocate other sizes.
"""
from __future__ import annotations

import numpy as np

from ..vocab import P
from ..timeline import Timeline
from ..trace import Trace

GRAD_SHARE = 0.25  # of the parameters' distinct sizes a backward must allocate
#: Fewer distinct parameter sizes than this say nothing about which later blocks are gradients or
#: optimizer work (a one-layer toy, a model made after recording began): the size tests then pass,
#: and other evidence (mountains, bursts) decides. An MLP of two equal layers has two sizes.
MIN_PARAM_SIZES = 3


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
                     labels: np.ndarray) -> int:
    """Where the optimizer begins after a backward that ended at ``b1``.

    An optimizer works on blocks the parameters' sizes (its temporaries, its state). Backward's
    last gradients are such blocks too, right after its last activation is freed; then, in many
    loops, user code that allocates only other sizes -- gradient clipping's norms, GradScaler's
    unscale -- and only then the optimizer. Those last gradients are labelled backward here.
    """
    ours = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, end, "right")]
    if len(params) < MIN_PARAM_SIZES or not len(ours):
        return b1 + 1
    sized = np.isin(trace.size[ours], params)
    if not sized.any():
        return b1 + 1
    other = np.flatnonzero(~sized)
    if len(other) and sized[other[0]:].any():
        labels[b1 + 1:ours[other[0]]] = P["backward"]
        return int(ours[other[0] + np.argmax(sized[other[0]:])])
    return int(ours[np.argmax(sized)])


def keeps_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                     top: int, b1: int, nxt: int) -> bool:
    """Parameter-sized blocks made in this backward that outlive it (after the last pass: to the
    trace's end, since what a loop frees on its way out is no gradient)."""
    made = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
    made = made[np.isin(trace.size[made], params)]
    return int((free_of[made] > b1 if nxt < len(trace) else free_of[made] == nxt).sum()) >= 2


def makes_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, top: int, b1: int) -> bool:
    """A backward allocates a gradient the size of each trainable parameter; a forward keeping a
    KV cache (generate()) frees last-made-first too, but makes no such blocks. Measured share of the
    parameters' distinct sizes met after the top: training 0.33 (LoRA) to 1.0, inference 0 to 0.14.
    Without parameters made before the trace there is nothing to compare: no objection."""
    made = trace.size[allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]]
    return covers_parameters(params, made)
