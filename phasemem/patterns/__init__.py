"""Recognise the shapes in a trace. Each detector is a pure function of the trace, its timeline and
its segmentation; stack frames are never required."""
from __future__ import annotations

from dataclasses import replace

from ..facts import Context
from ..model import Pattern
from ..vocab import KINDS, PHASES
from . import gradients, leak, logits, optimizer, recompute, runtime

__all__ = ["KINDS", "detect"]  # the kinds are defined in vocab.py

_PER_STEP = (logits.detect, recompute.detect, gradients.detect, optimizer.detect, runtime.before_step)


def detect(ctx: Context) -> list[Pattern]:
    """Every pattern in the trace, in event order."""
    seg = ctx.seg
    found = [p for step in range(len(seg.steps)) for det in _PER_STEP for p in det(ctx, step)]
    found += leak.detect(ctx) + runtime.workspaces(ctx)
    return sorted((_placed(ctx, p) for p in found), key=lambda p: (p.start_event, KINDS.index(p.kind)))


def _placed(ctx: Context, p: Pattern) -> Pattern:
    """A shape sits in the phase of the event that makes it (the table's phase for that event, so the
    two never disagree: a softmax spike made by a loss outside the model is the loss's), and is as
    sure as that phase is. A leak's allocations span phases: it keeps the phase holding most bytes."""
    phase = p.phase if p.kind == "leak" else PHASES[int(ctx.seg.labels[p.start_event])]
    conf = (ctx.seg.confidence or {}).get(phase, 1.0) if phase != "other" else min(
        (ctx.seg.confidence or {}).values(), default=1.0)
    return replace(p, phase=phase, confidence=min(float(conf), p.confidence))  # a detector may be less sure
