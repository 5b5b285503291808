"""Runs of labels: where each phase ran, as contiguous stretches of events. Pure numpy over the
label arrays; used by segmentation, inference, the detectors, the report and the picture."""
from __future__ import annotations

import numpy as np

from ..vocab import P


def phase_runs(labels: np.ndarray, step_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous runs of the same (phase, step): first event, last event, phase code, step position."""
    if not len(labels):
        z = np.zeros(0, np.int64)
        return z, z, z, z
    # Two comparisons in the columns' own widths: a combined int64 key and its diff wrote four arrays of
    # 8 bytes an event (65 ms against 9 ms at 10M events, where the picture needs the runs).
    change = labels[1:] != labels[:-1]
    change |= step_of[1:] != step_of[:-1]
    cut = np.flatnonzero(change) + 1
    first = np.concatenate([[0], cut])
    last = np.concatenate([cut - 1, [len(labels) - 1]])
    return first, last, labels[first].astype(np.int64), step_of[first].astype(np.int64)


#: Optimizer runs sandwiched between backward runs, in one step, that make an optimizer that runs
#: inside backward: h6_optim_in_backward has 52 a step; a stray inferred event or two labelled
#: optimizer between phases (Lightning without its annotations: one, before backward) is not it.
MIN_INTERLEAVED = 2


def backward_resumed(labels: np.ndarray, step_of: np.ndarray) -> np.ndarray:
    """The steps (positions) whose optimizer runs inside backward: backward, optimizer, backward, at
    least MIN_INTERLEAVED times, with no forward between (per-parameter updates from gradient hooks,
    ``register_post_accumulate_grad_hook``, torchtune's optimizer-in-backward). ``optimizer.step(closure)``
    runs a forward before each backward it evaluates, so it is not one."""
    first, _, code, step = phase_runs(labels, step_of)
    keep = np.isin(code, (P["forward"], P["backward"], P["optimizer"])) & (step >= 0)
    code, step = code[keep], step[keep]
    if len(code) < 3:
        return np.zeros(0, np.int64)
    hit = ((code[1:-1] == P["optimizer"]) & (code[:-2] == P["backward"]) & (code[2:] == P["backward"])
           & (step[:-2] == step[1:-1]) & (step[1:-1] == step[2:]))
    steps, counts = np.unique(step[1:-1][hit], return_counts=True)
    return steps[counts >= MIN_INTERLEAVED]


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every integer of lo[k]..hi[k] - 1, range after range, with the range each belongs to: (k, value).
    The detectors read many short stretches at once this way (the allocations of every region, run or
    step: ``lo``, ``hi`` from ``searchsorted``), one pass instead of a slice each.

        >>> concat_ranges(np.array([2, 7]), np.array([4, 8]))
        (array([0, 0, 1]), array([2, 3, 7]))
    """
    length = hi - lo
    k = np.repeat(np.arange(len(lo)), length)
    return k, np.arange(len(k)) - np.repeat(np.cumsum(length) - length - lo, length)


def run_of_events(first: np.ndarray, n: int) -> np.ndarray:
    """The run each of n events is in (``first``: the runs' first events, sorted; -1 before the first
    run): the runs begun up to each event, counted (a ``searchsorted`` of every event costs six times
    this at 10M events)."""
    return np.cumsum(np.bincount(first, minlength=n)[:n]) - 1
