"""Optimizer updates the passes' reading took for something else, and a backward taken for one.

An optimizer's temporaries and state have the parameters' sizes (``gradients.py``); a forward's
activations mostly do not. Where the activation mountains find a pass inside an update, its
blocks say so.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import Trace
from ...vocab import P
from .bursts import BURST
from .gradients import MIN_PARAM_SIZES, covers_parameters

#: Share of a pass's allocations with the parameters' sizes above which a forward-only pass right after
#: a training pass's backward (no optimizer read between) is the update: 8-bit Adam dequantizes each
#: parameter's state into parameter-sized temporaries that live long enough to make mountains
#: (h16_adam8bit: 0.69-0.81, read as forward: 0.14 of its events right). Forward-only passes so placed
#: elsewhere: gpt_wrapped 0.50 (no optimizer there either); evaluation or rollout passes elsewhere
#: follow an optimizer, not a backward.
UPDATE_SHARE = 0.6

def update_read_as_pass(trace: Trace, allocs: np.ndarray, params: np.ndarray, labels: np.ndarray,
                        f0: int, b1: int) -> bool:
    """Whether the forward-only pass from ``f0`` to ``b1`` is an optimizer's update: the last phase
    read before it is a backward (its optimizer not found) and UPDATE_SHARE of its allocations have
    the parameters' sizes."""
    if len(params) < MIN_PARAM_SIZES:
        return False
    named = np.flatnonzero(labels[:f0] != P["other"])
    if not len(named) or labels[named[-1]] != P["backward"]:
        return False
    made = allocs[np.searchsorted(allocs, f0, "left"):np.searchsorted(allocs, b1, "right")]
    return len(made) > 0 and float(np.isin(trace.size[made], params).mean()) >= UPDATE_SHARE


#: Gradients a wrapped step's head must make (as ``bursts.ZERO_GRAD_MIN``) before its backward is read.
MIN_HEAD_GRADS = 4


def wrapped_backward(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                     labels: np.ndarray, first: int) -> None:
    """In a trace that begins inside a step, read up to its first pass ``first`` as that step's
    optimizer (``pass_labels.wrapped_start``), the backward that comes before the optimizer: from the
    head's first allocation (its seed) to that block's free, where it makes MIN_HEAD_GRADS gradients or
    more between (parameter-sized blocks that outlive the head, freed by a later zero_grad).
    h8_mid_step_start's recording begins before a backward: 466 of its events read as optimizer."""
    head = allocs[:np.searchsorted(allocs, first, "left")]
    if not len(head) or len(params) < MIN_PARAM_SIZES:
        return
    b0 = int(head[0])
    b1 = int(free_of[b0])
    if not (b1 < first and labels[b1] == P["optimizer"]):
        return
    kept = (free_of[head] >= first) & (free_of[head] < len(trace))
    grads = head[(head < b1) & np.isin(trace.size[head], params) & kept]
    if len(grads) >= MIN_HEAD_GRADS and covers_parameters(params, trace.size[grads]):
        labels[b0:b1 + 1] = P["backward"]


def foreach_temporaries(trace: Trace, made: np.ndarray, free_of: np.ndarray, burst: np.ndarray,
                        params: np.ndarray) -> bool:
    """Whether these allocations hold a foreach optimizer's temporaries: BURST or more of them freed in
    bursts (``bursts.burst_freed``), some of a parameter's size. RMSprop's later steps over an LSTM make
    11 so, 3 of a parameter's size (heldout_lstm_rmsprop: no update seen, too few parameter-sized
    blocks); where a step between backward and the next forward was no update, none qualified
    (h5_seq2seq_sgd_keep's 99 burst-freed blocks have no parameter's size)."""
    freed = free_of[made] < len(trace)
    temps = made[freed][burst[free_of[made][freed]]]
    return len(temps) >= BURST and bool(np.isin(trace.size[temps], params).any())


def update_end(trace: Trace, made: np.ndarray, params: np.ndarray, start: int, burst: np.ndarray,
               goes_on: bool = True) -> int:
    """The last event an update begun at ``start`` can hold, of the allocations ``made`` after it: before
    the first allocation of another size than the parameters' after its first burst of frees, unless
    (``goes_on``) under UPDATE_SHARE of what follows has other sizes; the trace's end where nothing cuts
    it. ``burst``: ``bursts.burst_freed``. The traces behind each case: docs/accuracy.md."""
    burst = np.flatnonzero(burst[start:]) + start
    if not len(burst):
        return len(trace)
    later = made[(made > burst[0]) & ~np.isin(trace.size[made], params)]
    if not len(later) or (goes_on and np.isin(trace.size[made[made >= later[0]]], params).mean() >= UPDATE_SHARE):
        return len(trace)
    return int(later[0]) - 1


#: Allocations between a backward and its update's first parameter-sized block that must have the size
#: of a gradient the backward made and kept of no parameter's size (a sparse gradient's values or
#: indices) for them to begin the update: SparseAdam coalesces the embedding's sparse gradient before
#: the dense Adam begins (h16_graphsage_sampled: 12-13 such blocks a step, 51 events read 'other').
SPARSE_MIN = 4


def sparse_update_start(trace: Trace, allocs: np.ndarray, free_of: np.ndarray, burst: np.ndarray,
                        params: np.ndarray, top: int, b1: int, start: int) -> int:
    """Where an update that first works on a sparse gradient begins: at the first allocation after the
    backward (from ``top`` to ``b1``) with the size of a block it made of no parameter's size, kept past
    it and freed in a burst (zero_grad) or never, where SPARSE_MIN or more come before ``start``; else
    ``start``. Clipping's norms and a scaler's checks are scalars, not a gradient's size."""
    n = len(trace)
    made = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
    fr = free_of[made]
    kept = made[(fr > b1) & ((fr >= n) | burst[np.minimum(fr, n - 1)]) & ~np.isin(trace.size[made], params)]
    gap = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, start, "left")]
    like = gap[np.isin(trace.size[gap], trace.size[kept])]
    return int(like[0]) if len(like) >= SPARSE_MIN else start
