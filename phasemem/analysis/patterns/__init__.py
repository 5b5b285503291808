"""Recognise the shapes in a trace. Each detector is a pure function of the trace, its timeline and
its segmentation; stack frames are never required."""
from __future__ import annotations

import numpy as np

from ..facts import Context
from ...model import Pattern
from ...vocab import KINDS, PHASES
from . import gradients, leak, logits, optimizer, recompute, runtime

__all__ = ["KINDS", "detect"]  # the kinds are defined in vocab.py

_PER_STEP = (logits.detect, recompute.detect, gradients.detect, optimizer.detect, runtime.before_step)


def detect(ctx: Context) -> list[Pattern]:
    """Every pattern in the trace, in event order."""
    seg = ctx.seg
    found = [p for step in range(len(seg.steps)) for det in _PER_STEP for p in det(ctx, step)]
    found += leak.detect(ctx) + runtime.workspaces(ctx)
    # each detector makes its patterns anew, so they are placed where they are (a copy each: 13,000 at 1M events)
    starts = np.fromiter((p.start_event for p in found), np.int64, len(found))
    labels = seg.labels[starts].tolist() if len(seg.labels) else [0] * len(found)
    conf = seg.confidence or {}
    lowest = min(conf.values(), default=1.0)
    for p, code in zip(found, labels):
        _place(p, PHASES[int(code)], conf, lowest)
    rank = {k: i for i, k in enumerate(KINDS)}
    return sorted(found, key=lambda p: (p.start_event, rank[p.kind]))


def _place(p: Pattern, phase: str, conf: dict, lowest: float) -> None:
    """A shape sits in the phase of the event that makes it (the table's phase for that event, so the
    two never disagree: a softmax spike made by a loss outside the model is the loss's), and is as
    sure as that phase is. A leak's allocations span phases: it keeps the phase holding most bytes."""
    if p.kind == "leak":
        phase = p.phase
    c = conf.get(phase, 1.0) if phase != "other" else lowest
    p.phase, p.confidence = phase, min(float(c), p.confidence)  # a detector may be less sure
