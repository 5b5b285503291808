"""The vocabularies, each defined once: phases, categories, the marker prefix, and their display names
and colours (the shape kinds are records beside their detectors: analysis.patterns). The int codes are
what the numpy label arrays hold (int8). Imports nothing of phasemem: every layer may use it.

Example:
    >>> from phasemem.vocab import PhaseCode, PHASES, P
    >>> PHASES[PhaseCode.BACKWARD], P["optimizer"]
    ('backward', 5)
"""
from __future__ import annotations

from enum import IntEnum


class PhaseCode(IntEnum):
    """A phase's code in the per-event label arrays; ``other`` (no phase known) is 0."""

    OTHER = 0
    FORWARD = 1
    LOSS = 2
    ZERO_GRAD = 3
    BACKWARD = 4
    OPTIMIZER = 5


#: Phase names in code order, and name → code.
PHASES = tuple(p.name.lower() for p in PhaseCode)
P = {name: code for code, name in enumerate(PHASES)}
#: The phases instrument() marks (the loss is what lies between a forward and its backward).
MARKED = ("forward", "zero_grad", "backward", "optimizer")
#: Prefix of phasemem's own record_function markers: ``phasemem::forward`` ...
MARKER_PREFIX = "phasemem::"


class Category(IntEnum):
    """What a byte is (categories.py decides); the code is its column in the category curves."""

    PARAMETER = 0
    GRADIENT = 1
    OPTIMIZER_STATE = 2
    ACTIVATION = 3
    TEMPORARY = 4
    INPUT = 5
    OTHER = 6


CATEGORIES = tuple(c.name.lower() for c in Category)
C = {name: code for code, name in enumerate(CATEGORIES)}
#: How the report's text names each category (plural, as in "made of parameters 1.2 GiB").
CATEGORY_NAMES = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer state",
                  "activation": "activations", "temporary": "temporaries", "input": "inputs", "other": "other"}
#: How the text and pictures name what a distributed wrapper holds (``analysis.roles.ROLES``).
ROLE_NAMES = {"sharded_parameters": "sharded parameters", "unsharded_parameters": "unsharded parameters",
              "all_gather_buffers": "all-gather buffers", "reduce_scatter_buffers": "reduce-scatter buffers",
              "sharded_gradients": "sharded gradients", "ddp_buckets": "DDP buckets"}

#: Colours, keyed by the vocabularies (as torch's _memory_profiler keys its colours by Category).
PHASE_COLORS = {
    "forward": "#4e79a7",
    "loss": "#f28e2b",
    "zero_grad": "#b07aa1",
    "backward": "#e15759",
    "optimizer": "#59a14f",
}
#: Each category echoes the phase that usually makes it: activations blue like forward, gradients
#: red like backward, optimizer state green like optimizer.
CATEGORY_COLORS = {
    "parameter": "#937860",
    "gradient": "#c44e52",
    "optimizer_state": "#55a868",
    "activation": "#4c72b0",
    "temporary": "#dd8452",
    "input": "#64b5cd",
    "other": "#8c8c8c",
}

#: The two figures a shape has, each said with its label wherever it is shown (the report's text, the
#: picture's callouts, JSON), so that two different numbers of one shape never stand unlabelled side
#: by side (issue 40: the demo's header said logits_release 96.00 MiB, its list 91.50 MiB).
#: AT_PEAK: the bytes of the shape's blocks alive at the report's peak (``Report.peak.by_shape``,
#: JSON ``peak.by_shape`` and each pattern's ``bytes_at_peak``); each block counts for one shape only.
#: The other, what a shape's own figure (``Pattern.bytes``) measures, is its kind's: ``ShapeKind.size_label``.
AT_PEAK = "alive at the peak"
