"""Runs of labels: where each phase ran, as contiguous stretches of events. Pure numpy over the
label arrays; used by segmentation, inference, the detectors, the report and the picture."""
from __future__ import annotations

import numpy as np


def phase_runs(labels: np.ndarray, step_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Contiguous runs of the same (phase, step): first event, last event, phase code, step position."""
    if not len(labels):
        z = np.zeros(0, np.int64)
        return z, z, z, z
    key = labels.astype(np.int64) * (1 << 32) + (step_of.astype(np.int64) + 1)
    cut = np.flatnonzero(np.diff(key)) + 1
    first = np.concatenate([[0], cut])
    last = np.concatenate([cut - 1, [len(key) - 1]])
    return first, last, labels[first].astype(np.int64), step_of[first].astype(np.int64)
