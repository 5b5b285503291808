"""Optimizer updates the passes' reading took for something else.

An optimizer's temporaries and state have the parameters' sizes (``gradients.py``); a forward's
activations mostly do not. Where the activation mountains find a pass inside an update, its
blocks say so.
"""
from __future__ import annotations

import numpy as np

from ..trace import Trace
from ..vocab import P
from .gradients import MIN_PARAM_SIZES

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
