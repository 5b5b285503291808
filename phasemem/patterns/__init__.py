"""Recognise the shapes in a trace. Each detector is a pure function of the trace, its timeline and
its segmentation; stack frames are never required."""
from __future__ import annotations

from ..report import Pattern
from . import gradients, leak, logits, optimizer, recompute, runtime
from .context import Context

KINDS = ("logits", "softmax_spike", "logits_release", "checkpoint_recompute", "gradients",
         "gradient_accumulation", "optimizer_state_init", "optimizer_temporaries", "amp_unscale", "grad_clip", "workspace",
         "leak")

_PER_STEP = (logits.detect, recompute.detect, gradients.detect, optimizer.detect, runtime.before_step)


def detect(ctx: Context) -> list[Pattern]:
    """Every pattern in the trace, in event order."""
    seg = ctx.seg
    found = [p for step in range(len(seg.steps)) for det in _PER_STEP for p in det(ctx, step)]
    found += leak.detect(ctx) + runtime.workspaces(ctx)
    return sorted(found, key=lambda p: (p.start_event, KINDS.index(p.kind)))
