"""Recognise the shapes in a trace. Each detector is a pure function of the trace, its timeline and
its segmentation (``facts.Context``); stack frames are never required. Each module here that holds a
detector declares its kinds (``KINDS``, one ``ShapeKind`` each), and this package collects them: a new
kind is one new module (docs/patterns.md: adding a kind).

Example:
    >>> from phasemem.analysis.patterns import BY_NAME, KIND_NAMES, SHAPE_PRIORITY
    >>> KIND_NAMES[:3], BY_NAME["leak"].marker, SHAPE_PRIORITY[0]
    (('logits', 'softmax_spike', 'logits_release'), 'h', 'logits')
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

import numpy as np

from ...model import Pattern
from ...vocab import PHASES
from ..facts import Context
from .shape_kind import ShapeKind

__all__ = ["BY_NAME", "KINDS", "KIND_NAMES", "SHAPE_PRIORITY", "ShapeKind", "detect", "discover",
           "shape_size_label"]


def discover(package: str = __name__) -> tuple[ShapeKind, ...]:
    """Every ShapeKind the modules of ``package`` declare (their ``KINDS``), in listing order (``order``).

    Example:
        >>> [k.name for k in discover()][-2:]
        ['workspace', 'leak']
    """
    pkg = importlib.import_module(package)
    found: list[ShapeKind] = []
    for info in pkgutil.iter_modules(pkg.__path__):
        found += getattr(importlib.import_module(f"{package}.{info.name}"), "KINDS", ())
    return tuple(sorted(found, key=lambda k: k.order))


#: Every kind's record, in the order a report lists them (and those starting at one event).
KINDS = discover()
KIND_NAMES = tuple(k.name for k in KINDS)
BY_NAME = {k.name: k for k in KINDS}
#: Which shape an allocation in several patterns counts for: the most specific first (the logits block
#: is also among what the logits' release frees; gradients kept past a leak's step are gradients).
#: Kinds without a priority (a count of scalars) claim no bytes.
SHAPE_PRIORITY = tuple(k.name for k in sorted((k for k in KINDS if k.priority is not None),
                                               key=lambda k: k.priority))  # type: ignore[arg-type, return-value]  # each has one


def shape_size_label(kind: str, details: dict | None = None) -> str:
    """What ``Pattern.bytes`` measures for a shape of ``kind`` (with its ``details``).

    Example:
        >>> shape_size_label("logits_release"), shape_size_label("gradients", {"release": True})
        ('the cliff', 'freed at once')
    """
    record = BY_NAME.get(kind)
    return record.bytes_are(details) if record is not None else "its size"


def detectors(per_step: bool, kinds: tuple[ShapeKind, ...] = KINDS) -> tuple[Callable, ...]:
    """The detectors of ``kinds`` called a step at a time (or once for the whole trace), each once
    however many kinds it finds, in the kinds' order."""
    return tuple(dict.fromkeys(k.detector for k in kinds if k.per_step == per_step))


def detect(ctx: Context, kinds: tuple[ShapeKind, ...] = KINDS) -> list[Pattern]:
    """Every pattern in the trace, in event order (shapes starting at one event in listing order)."""
    seg = ctx.seg
    per_step = detectors(True, kinds)
    found = [p for step in range(len(seg.steps)) for det in per_step for p in det(ctx, step)]
    for det in detectors(False, kinds):
        found += det(ctx)
    # each detector makes its patterns anew, so they are placed where they are (a copy each: 13,000 at 1M events)
    starts = np.fromiter((p.start_event for p in found), np.int64, len(found))
    labels = seg.labels[starts].tolist() if len(seg.labels) else [0] * len(found)
    conf = seg.confidence or {}
    lowest = min(conf.values(), default=1.0)
    for p, code in zip(found, labels):
        _place(p, PHASES[int(code)], conf, lowest)
    rank = {k.name: i for i, k in enumerate(kinds)}
    return sorted(found, key=lambda p: (p.start_event, rank[p.kind]))


def _place(p: Pattern, phase: str, conf: dict, lowest: float) -> None:
    """A shape sits in the phase of the event that makes it (the table's phase for that event, so the
    two never disagree: a softmax spike made by a loss outside the model is the loss's), and is as
    sure as that phase is. A leak's allocations span phases: it keeps the phase holding most bytes."""
    if p.kind == "leak":
        phase = p.phase
    c = conf.get(phase, 1.0) if phase != "other" else lowest
    p.phase, p.confidence = phase, min(float(c), p.confidence)  # a detector may be less sure
