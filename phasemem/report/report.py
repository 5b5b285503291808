"""What phasemem found, as plain dataclasses: steps, phases, their numbers, as JSON-ready values
(``to_dict``). Its text, JSON and pictures are written by the reporters (phasemem.reporters, through
report/registry.py), which read it and are imported by nothing here."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields

import numpy as np

from ..analysis.core import Analysis
from ..analysis.label_agreement import LabelAgreement, agreement
from ..analysis.patterns import SHAPE_PRIORITY, shape_size_label
from ..analysis.peak import alive_at, shape_codes
from ..analysis.spans import phase_runs
from ..errors import RECORD_HINT, PhasememError
from ..model import Allocation, DeviceSummary, OutOfMemory, Pattern, PeakBreakdown, Phase, Step, WhatIf
from ..read.live import LiveMemory
from ..units import parse_size
from ..vocab import AT_PEAK, CATEGORIES, PHASES
from .plain import plain
from .registry import Written, reporter

__all__ = ["Report", "Allocation", "DeviceSummary", "OutOfMemory", "Pattern", "Phase", "Step", "INCOMPLETE_NOTE",
           "LIVE_TOP", "reserved_measured"]

#: Blocks listed in a history-less snapshot's text, and four times as many in its JSON (the largest).
LIVE_TOP = 12
#: The first note of a report whose recording lost phases (instrument()'s ``lost_note``, capture/lost.py).
INCOMPLETE_NOTE = "INCOMPLETE RECORDING: "


def _view(name: str, attr: str, doc: str) -> property:
    """``Report.<name>``, a read-only view of ``report.analysis.<attr>`` kept for scripts that predate
    ``report.analysis``: it warns, naming the replacement."""
    def get(self):
        warnings.warn(f"Report.{name} is deprecated; use report.analysis.{attr}", DeprecationWarning, stacklevel=2)
        return getattr(self.analysis, attr) if self.analysis else None

    return property(get, doc=f"Deprecated: ``report.analysis.{attr}``, {doc}")


@dataclass
class Report(Written):
    """The analysis of one device's trace.

    Example:
        >>> report = phasemem.analyze("snapshot.pickle")
        >>> print(report)
        >>> report.phases["backward"].peak_bytes
        >>> report.save_png("memory.png")
    """

    device: str
    n_events: int
    peak_bytes: int
    peak_event: int
    preexisting_bytes: int
    reserved_peak_bytes: int
    steps: list[Step]
    phases: dict[str, Phase]
    sources: dict[str, str]
    patterns: list[Pattern] = field(default_factory=list)
    by_category: dict[str, int] = field(default_factory=dict)  # bytes per category at the overall peak
    ooms: list[OutOfMemory] = field(default_factory=list)  # every device's, this one's first
    notes: list[str] = field(default_factory=list)
    other_devices: list[DeviceSummary] = field(default_factory=list)
    #: What is alive at the overall peak, by category and by shape (phasemem.analysis.peak).
    peak: PeakBreakdown | None = None
    #: The remedies replayed on the trace (phasemem.predictions.whatif), ranked by what they save.
    what_if: list[WhatIf] = field(default_factory=list)
    #: A snapshot without allocation history (legacy recording, bare segment list): what was alive when
    #: it was taken (``phasemem.read.live.LiveMemory``); then there are no steps, phases or shapes.
    live: LiveMemory | None = None
    #: The analysed trace the picture and the categories at any event are drawn from (not in to_dict()).
    analysis: Analysis | None = field(default=None, repr=False)

    # Read-only views of the analysis for older scripts, deprecated: the analysis is ``report.analysis``.
    trace = _view("trace", "trace", "the trace read (``phasemem.read.trace.Trace``).")
    timeline = _view("timeline", "timeline", "the memory curve and lifetimes.")
    segmentation = _view("segmentation", "segmentation", "every event's phase and step.")
    category_curves = _view("category_curves", "categories", "the category of every allocation.")
    label_codes = _view("label_codes", "labels", "the phase code of every event (vocab.PhaseCode).")
    step_of = _view("step_of", "step_of", "the step position of every event, -1 outside every step.")

    @property
    def labels(self) -> np.ndarray:
        """The phase name of every trace event, as a numpy array of str (``report.analysis.labels``
        holds their codes, ``label_runs()`` their runs)."""
        return np.array(PHASES, dtype=object)[self.analysis.labels if self.analysis else None]

    @property
    def torch_labels(self) -> LabelAgreement | None:
        """Where the program labelled its allocations (``_set_memory_metadata``, torch's ``user_metadata``):
        how far the labels naming categories agree with phasemem's, which is right where not, the phases
        they marked and the labels kept (phasemem.analysis.label_agreement). None otherwise.

        Example:
            >>> la = report.torch_labels
            >>> la and [(d.label, d.phasemem, d.right) for d in la.disagreements]
        """
        return agreement(self.analysis) if self.analysis is not None else None

    def label_runs(self) -> list[tuple[int, int, str, int]]:
        """``labels`` run-length encoded: (first event, last event, phase, step position or -1)."""
        an = self.analysis
        if an is None:  # no trace, no runs
            return []
        first, last, code, step = phase_runs(an.labels, an.step_of)
        return [(a, b, PHASES[c], s) for a, b, c, s in zip(first.tolist(), last.tolist(), code.tolist(), step.tolist())]

    def to_dict(self) -> dict:
        """Everything in the report as JSON-ready Python values."""
        skip = {"analysis", "live"}
        out = {f.name: plain(getattr(self, f.name)) for f in fields(self) if f.name not in skip}
        if self.live is not None:
            out["live"] = _live_dict(self.live)
            return out
        out["labels"] = [list(r) for r in self.label_runs()]
        out["reserved_measured"] = reserved_measured(self)  # False: reserved_peak_bytes is no measurement
        for d, p, b in zip(out["patterns"], self.patterns, self.shape_bytes_at_peak()):
            d["bytes_is"], d["bytes_at_peak"] = shape_size_label(p.kind, p.details), b
        out["figures"] = FIGURES
        if self.analysis is not None:
            out["category_curve"] = self.category_curve()
            if (torch_labels := self.torch_labels) is not None:  # only where the snapshot carries them
                out["torch_labels"] = torch_labels.to_dict()
        return out

    def categories(self, event: int | None = None) -> dict[str, int]:
        """Bytes alive per category (parameter, gradient, optimizer_state, activation, temporary,
        input, other) at the level an event reaches; default: the overall peak.

        Example:
            >>> report.categories()["optimizer_state"]
        """
        e = self.peak_event if event is None else int(event)
        if not 0 <= e < self.n_events:
            raise IndexError(f"event {e} is outside the trace (0..{self.n_events - 1})")
        assert self.analysis is not None, "a snapshot without history has no categories over time"
        row = self.analysis.categories.at_level([e], self.analysis.timeline)[0]
        return dict(zip(CATEGORIES, row.tolist()))

    def category_curve(self, points: int = 1000) -> dict[str, list[int]]:
        """Bytes per category at up to ``points`` evenly spaced events (and the overall peak)."""
        ev = np.unique(np.concatenate([np.linspace(0, self.n_events - 1, min(points, self.n_events)).astype(np.int64),
                                       [self.peak_event]]))
        assert self.analysis is not None, "a snapshot without history has no categories over time"
        m = self.analysis.categories.at_level(ev, self.analysis.timeline)
        return {"event": ev.tolist(), **{c: m[:, k].tolist() for k, c in enumerate(CATEGORIES)}}

    def patterns_of(self, kind: str) -> list[Pattern]:
        """The patterns of one kind, in trace order."""
        return [p for p in self.patterns if p.kind == kind]

    def fits(self, budget, plan: str | None = None, ranks: int = 1, **settings):
        """The largest batch and sequence factors predicted to fit in ``budget`` (bytes, or "80GiB"),
        with the allocator's reserve, and the remedies that would let the next factor fit
        (``phasemem.predictions.fits``); with ``plan``, per rank of ``ranks`` under that parallel plan.

            >>> print(report.fits("80GiB"))
            >>> print(report.fits("80GiB", plan="fsdp2", ranks=8))
        """
        from ..predictions.fits import fits

        if self.analysis is None or self.live is not None:
            raise PhasememError("what fits is solved from an allocation history; this report has none; " + RECORD_HINT)
        if plan is None:
            return fits(self.analysis, self.patterns, parse_size(budget))
        from ..predictions.plans import plan_change
        pc = plan_change(self.analysis, self.patterns, plan, ranks, **settings)
        if isinstance(pc, str):
            raise PhasememError(f"what fits per rank under {plan}:{ranks} cannot be told: {pc}")
        return fits(self.analysis, self.patterns, parse_size(budget), changes=[pc.change])

    def plan(self, name: str, ranks: int = 1, rank: int = 0, **settings):
        """What rank ``rank`` of ``ranks`` would hold under a parallel plan (``"ddp"``, ``"zero1"``,
        ``"zero2"``, ``"fsdp2"``), replayed on this trace (``phasemem.predictions.plans``; docs/plans.md).

            >>> p = report.plan("fsdp2", ranks=8, param_dtype="bf16")
            >>> p.applies, p.predicted_peak_bytes, p.categories
        """
        from ..predictions.plans import plan

        if self.analysis is None or self.live is not None:
            raise PhasememError("a plan is replayed on an allocation history; this report has none; " + RECORD_HINT)
        return plan(self.analysis, self.patterns, name, ranks, rank, **settings)

    def plot(self, **options):
        """The labeled picture as a matplotlib Figure (for notebooks); ``options`` are
        ``phasemem.reporters.picture.draw.plot``'s."""
        return reporter("picture", self).figure(self, **options)

    def text(self, full: bool = False) -> str:
        """The report as text: a screen or two (the peak, the typical step and those that differ,
        each shape kind once, the notes); ``full``: every step's phases and every shape.

        Example:
            >>> print(report.text(full=True))
        """
        return reporter("text", self).render(self, full=full)  # type: ignore[return-value]  # text renders str

    def shape_bytes_at_peak(self) -> list[int]:
        """Per pattern, the bytes of its blocks alive at the peak that count for its kind (each block
        for one shape, ``patterns.SHAPE_PRIORITY``; a block in two shapes of one kind for the first): summed
        over a kind, ``peak.by_shape[kind]``. JSON ``bytes_at_peak``, beside the shape's own ``bytes``."""
        an, n = self.analysis, len(self.patterns)
        if an is None or not n or self.peak_event < 0:
            return [0] * n
        counts = np.fromiter((len(p.members) for p in self.patterns), np.int64, n)
        members = np.fromiter((m for p in self.patterns for m in p.members), np.int64, int(counts.sum()))
        owner = np.repeat(np.arange(n), counts)
        n_pre = int(an.timeline.lifetimes.preexisting.sum())
        rows = n_pre + members
        kind = np.array([SHAPE_PRIORITY.index(p.kind) if p.kind in SHAPE_PRIORITY else -2 for p in self.patterns])
        keep = alive_at(an, self.peak_event)[rows] & (shape_codes(an, self.patterns)[rows] == kind[owner])
        rows, owner = rows[keep], owner[keep]
        _, first = np.unique(rows, return_index=True)  # a block once, for the first pattern holding it
        size = an.timeline.lifetimes.size[rows[first]]
        return np.bincount(owner[first], weights=size, minlength=n).astype(np.int64).tolist()


def reserved_measured(r: Report) -> bool:
    """Whether the trace measured what the allocator reserved: a CPU trace has no caching allocator's
    segments (the profiler path, capture/cpu.py), and a trace with no segment at all said nothing."""
    return not r.device.startswith("cpu") and (r.reserved_peak_bytes > 0 or r.peak_bytes == 0)


def _live_dict(live) -> dict:
    return {"device": live.device, "allocated_bytes": live.allocated_bytes, "reserved_bytes": live.reserved_bytes,
            "cached_free_bytes": live.cached_free_bytes, "n_blocks": live.n_blocks, "has_frames": live.has_frames,
            "by_category": dict(live.by_category),
            "by_site": [{"site": s, "bytes": b, "count": c} for s, b, c in live.by_site],
            "largest_blocks": [{"size": b.requested_size, "site": b.site, "category": b.category}
                               for b in live.blocks[:4 * LIVE_TOP]],
            "devices": {str(d): {"allocated_bytes": a, "reserved_bytes": r} for d, (a, r) in live.devices.items()}}


#: What the JSON's figures of a shape are, beside them (the text says the same words: vocab.AT_PEAK,
#: each kind's ShapeKind.size_label).
FIGURES = {"peak.by_shape": f"bytes of each shape kind's blocks {AT_PEAK}, each block counted for one kind",
           "patterns[].bytes": "the shape's own size; patterns[].bytes_is says what it measures (the cliff, "
                               "the block, most at once, ...)",
           "patterns[].bytes_at_peak": f"bytes of this shape's blocks {AT_PEAK}; summed over a kind, peak.by_shape"}
