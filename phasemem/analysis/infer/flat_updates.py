"""An optimizer that works on one flat vector of every gradient (LBFGS), read from lifetimes alone
(docs/accuracy.md, "Third round, last traces"). Called once, after zero_grad is labelled
(segmentation/inferred.py), on the lifetimes' reading only.

LBFGS gathers the gradients into one flat block (``_gather_flat_grad``) and works on vectors of that
size (its direction, the line search's steps): no parameter's size, so nothing else names its work an
update, and it reads 'other' between a closure's backward and the next closure's zero_grad.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..spans import phase_runs as runs
from .bursts import ZERO_GRAD_MIN


def flat_updates(trace: Trace, labels: np.ndarray) -> None:
    """Label 'optimizer' the unknown work between a backward run and the next zero_grad run where it
    allocates a block of exactly the bytes that zero_grad frees: every gradient, flat. On the 215
    marked traces only truth_lbfgs's (all 11 such runs its optimizer's)."""
    first, last, code, _ = runs(labels, np.zeros(len(labels), np.int32))
    for k in np.flatnonzero(code == P["zero_grad"]).tolist():
        if k < 2 or code[k - 1] != P["other"] or code[k - 2] != P["backward"]:
            continue
        z0, z1 = int(first[k]), int(last[k]) + 1
        frees = np.flatnonzero(trace.action[z0:z1] == A["free_requested"]) + z0
        if len(frees) < ZERO_GRAD_MIN:
            continue
        o0 = int(first[k - 1])
        made = np.flatnonzero(trace.action[o0:z0] == A["alloc"]) + o0
        if (trace.size[made] == int(trace.size[frees].sum())).any():
            labels[o0:z0] = P["optimizer"]
