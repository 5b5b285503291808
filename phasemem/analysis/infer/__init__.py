"""Steps and phases for snapshots recorded without phasemem's markers: from stack frames
(``frames.py``), else from lifetimes alone (``lifetimes.py``); then the rules that hold whatever found
them (``finish``). The order, and what runs before: docs/design.md; how accurate each source is:
docs/accuracy.md.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..sizes import in_sorted
from ..spans import phase_runs as runs
from ..spans import run_of_events
from ..timeline import Timeline
from .bursts import ZERO_GRAD_MIN
from .frames import has_usable_frames, labels_from_frames
from .lifetimes import labels_from_lifetimes
from .loss import graphed_loss

__all__ = ["has_usable_frames", "labels_from_frames", "labels_from_lifetimes", "finish"]

def finish(trace: Trace, tl: Timeline | None, labels: np.ndarray) -> np.ndarray:
    """Lifetime rules that hold whatever found the phases: zero_grad's frees, then the loss."""
    if tl is not None:
        zero_grad_from_lifetimes(trace, tl, labels)
    _loss_between(labels, trace.action == A["alloc"])
    # A CUDA-graphed model's forward makes no events; its loss is found by cross-entropy's fingerprint,
    # but only in a training trace (an optimizer ran): a bare function's forward + .sum() + backward
    # (silmont_mem_snapshot in ../shared/wild) has no forward events either, and no cross-entropy.
    if tl is not None and not (labels == P["forward"]).any() and (labels == P["optimizer"]).any():
        graphed_loss(trace, tl, labels)
    return labels


def zero_grad_from_lifetimes(trace: Trace, tl: Timeline, labels: np.ndarray) -> None:
    """Frees of gradients outside backward are zero_grad(set_to_none=True): a gradient is made in a
    backward run and outlives it. Needs no frames (gradients never have any)."""
    life = tl.lifetimes
    n = len(trace)
    born = life.paired
    a, f = life.alloc_event[born], life.free_event[born]
    first, last, code, _ = runs(labels, np.zeros(n, np.int32))
    run_of = run_of_events(first, n)
    grad = (labels[a] == P["backward"]) & (run_of[f] != run_of[a]) & (labels[f] != P["backward"])
    # A gradient has a weight's size: where weights are known (blocks no backward made that stay
    # alive across a whole backward run: the parameters, their optimizer state, the batch), a block
    # freed after backward with no weight's size is none (h9_per_sample_dpsgd: vmap(grad) makes
    # batch x parameter-sized per-sample gradients on the autograd thread, freed after clipping).
    weights = _weight_sizes(life, labels, first[code == P["backward"]], last[code == P["backward"]])
    if len(weights):
        grad &= in_sorted(life.size[born], weights)
    fz = np.sort(f[grad])
    # zero_grad frees many gradients together; a lone free after backward (the loss's own
    # gradient, a hook's buffer) is not it.
    cluster = np.concatenate([[0], np.cumsum(np.diff(fz) > 8)]) if len(fz) else np.zeros(0, np.int64)
    sizes = np.bincount(cluster) if len(fz) else np.zeros(0, np.int64)
    fz = fz[sizes[cluster] >= ZERO_GRAD_MIN] if len(fz) else fz
    labels[fz] = P["zero_grad"]
    # the free_requested that announced each of those frees
    req = fz - 1
    ok = (req >= 0) & (trace.action[np.maximum(req, 0)] == A["free_requested"]) & (trace.addr[np.maximum(req, 0)] == trace.addr[fz])
    labels[req[ok]] = P["zero_grad"]


def _weight_sizes(life, labels: np.ndarray, bw_first: np.ndarray, bw_last: np.ndarray) -> np.ndarray:
    """Sizes of the blocks, not made in backward, alive from before a backward run to after it."""
    n = len(labels)
    if not len(bw_first) or not n:
        return np.zeros(0, np.int64)
    a = life.alloc_event
    made = a >= 0
    outside = ~made | (labels[np.clip(a, 0, n - 1)] != P["backward"])
    k = np.searchsorted(bw_first, np.where(made, a, -1), "left")
    spans = (k < len(bw_first)) & (life.free_event > bw_last[np.minimum(k, len(bw_last) - 1)])
    return np.unique(life.size[outside & spans])


def _loss_between(labels: np.ndarray, is_alloc: np.ndarray) -> None:
    """Relabel 'other' runs that sit between a forward run and the next backward run as loss, where
    they allocate: a run of frees alone is the model's output dropped (and the previous step's loss
    value released) after a forward that computed its loss inside, no loss (as
    ``segmentation.markers`` rules for marked traces)."""
    first, last, code, _ = runs(labels, np.zeros(len(labels), np.int32))
    telling = np.flatnonzero((code != P["zero_grad"]) & (code != P["other"]))
    allocs = np.concatenate([[0], np.cumsum(is_alloc)])
    for k in np.flatnonzero(code == P["other"]).tolist():
        j = np.searchsorted(telling, k)
        if 0 < j < len(telling) and code[telling[j - 1]] == P["forward"] and code[telling[j]] == P["backward"] \
                and allocs[last[k] + 1] > allocs[first[k]]:
            labels[first[k]:last[k] + 1] = P["loss"]
