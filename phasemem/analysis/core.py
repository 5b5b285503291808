"""One trace, analysed: the arrays every later step reads (the report's numbers, the shapes, the
picture, the what-ifs), built once and never changed after."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..read.trace import Trace
from ..vocab import MARKER_PREFIX
from .category_curves import CategoryCurves
from .facts import Context
from .segmentation import Segmentation, segment
from .timeline import Timeline


@dataclass(frozen=True)
class Analysis:
    """A trace with its memory curve and lifetimes, its steps and phases, the facts detectors
    share, and the category of every allocation.

    Example:
        >>> a = Analysis.of(trace)
        >>> a.timeline.level.max(), a.segmentation.steps[:2]
    """

    trace: Trace
    timeline: Timeline
    segmentation: Segmentation
    facts: Context
    categories: CategoryCurves

    @classmethod
    def of(cls, trace: Trace, marker_prefix: str = MARKER_PREFIX) -> "Analysis":
        tl = Timeline.from_trace(trace)
        seg = segment(trace, marker_prefix, tl)
        facts = Context.build(trace, tl, seg)
        return cls(trace, tl, seg, facts, CategoryCurves(facts))

    @property
    def labels(self) -> np.ndarray:
        """The phase code of every event (vocab.PhaseCode)."""
        return self.segmentation.labels

    @property
    def step_of(self) -> np.ndarray:
        """The step position of every event, -1 outside every step."""
        return self.segmentation.step_of

    def categories_at_level(self, events) -> np.ndarray:
        """(len(events), len(CATEGORIES)) bytes per category at the level each event reaches."""
        return self.categories.at_level(events, self.timeline)
