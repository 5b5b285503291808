"""Frees in bursts: many frees with no allocation between them.

zero_grad(set_to_none=True) frees every gradient at once and a foreach optimizer drops its
temporaries at once; backward frees activations one or two at a time between the gradients it
allocates. So a burst free marks what is (usually) not an activation.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace

BURST = 8  # frees in a row, with no allocation between, that are not backward's
#: Frees at most this many events apart are one run: zero_grad freeing the gradients one after another
#: (each a free_requested/free_completed pair).
FREED_TOGETHER = 8
#: Gradients freed together before it counts as zero_grad; as many a backward must leave to one, or
#: zero_grad must free, to anchor a backward (anchored, seed, sharded, flat_updates, infer.finish).
ZERO_GRAD_MIN = 4


def burst_freed(trace: Trace) -> np.ndarray:
    """Per event: a free inside a burst of at least BURST frees with no allocation between them.

    zero_grad(set_to_none=True) frees every gradient at once and a foreach optimizer drops its
    temporaries at once; backward frees activations one or two at a time between the gradients it
    allocates. So burst frees mark what is not an activation.
    """
    is_free = (trace.action == A["free_completed"]) | (trace.action == A["free"])
    group = np.cumsum(trace.action == A["alloc"])
    count = np.bincount(group, weights=is_free)
    return is_free & (count[group] >= BURST)
