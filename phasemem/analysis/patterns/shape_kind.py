"""One record per shape kind: everything the rest of phasemem knows of a kind (its detector, how the
picture marks it, which shape a block counts for, what its figure measures), declared in the module of
the detector that finds it and collected by ``patterns/__init__.py`` (docs/patterns.md: adding a kind).

Example:
    >>> from phasemem.analysis.patterns import BY_NAME
    >>> BY_NAME["logits_release"].marker, BY_NAME["logits_release"].bytes_are({})
    ('v', 'the cliff')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: The edge every kind's marker is drawn with today: the picture's callout ink.
INK = "#1b1b1b"


@dataclass(frozen=True)
class ShapeKind:
    """A kind of shape; every field is required, so a kind cannot be declared without one."""

    name: str  # Pattern.kind, as the text, JSON and the picture say it
    #: detect(ctx, step) -> list[Pattern] where per_step, else detect(ctx): the whole trace at once.
    #: Kinds one detector finds together name the same function; it runs once.
    detector: Callable
    per_step: bool
    marker: str  # the matplotlib marker of its occurrences (filled: drawn white, edged in ``colour``)
    colour: str  # the marker's edge
    #: Which shape a block several shapes hold counts for at a moment: the lowest number wins
    #: (analysis.peak). None: the kind claims no bytes there (its figure is a count of scalars).
    priority: int | None
    #: What Pattern.bytes measures ("the cliff"), or a function of the pattern's details that says it.
    size_label: str | Callable[[dict], str]
    explanation: str  # one line: what the shape is
    order: int  # its place in a report's lists (and among shapes starting at one event): lowest first

    def bytes_are(self, details: dict | None = None) -> str:
        """What a shape of this kind with these ``details`` measures with its ``bytes``."""
        label = self.size_label
        return label(details or {}) if callable(label) else label
