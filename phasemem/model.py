"""The plain dataclasses of an analysis: allocations, phases, steps, shapes, out-of-memory events,
other devices. Built complete by the analysis (measure, patterns, analyze); the report holds them.
Imports nothing of phasemem."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Allocation:
    """One allocation: the trace event that made it, its size, when it was freed, where it came from."""

    event: int
    size: int
    free_event: int | None = None  # None: still alive when the trace ends
    stack: str | None = None  # short call-site summary; None when recorded without frames


@dataclass
class Phase:
    """A phase of one step (or of all steps, in ``Report.phases``).

    ``peak_bytes`` is the most memory allocated while the phase's events ran; ``start_bytes`` and
    ``end_bytes`` what was allocated just before its first event and just after its last (event indices,
    and a phase a step did not run: docs/design.md, "The public API").

    Example:
        >>> report.phases["optimizer"].peak_bytes
        >>> report.steps[1].phases["backward"].peak_event
    """

    name: str
    step: int | None
    peak_bytes: int
    start_bytes: int
    end_bytes: int
    start_event: int | None
    end_event: int | None
    peak_event: int | None
    n_events: int
    source: str  # "markers", "annotations", "inferred", or "none" (for "other")
    top_allocations: list[Allocation] = field(default_factory=list)
    confidence: float = 1.0  # 1 for markers and annotations; lower when inferred (docs/accuracy.md)
    by_category: dict[str, int] = field(default_factory=dict)  # bytes per category at peak_event
    at_event: float | None = None  # where it ran: start_event, or between two events when it made none
    #: False for a phase this step did not run, kept so that every step has the key of every phase any
    #: step ran (``steps[0].phases["loss"]``): no events, zero bytes, no position.
    ran: bool = True


@dataclass
class Pattern:
    """A recognised shape: what it is, where (event range and step/phase), how big, and what to do.

    Example:
        >>> for p in report.patterns_of("logits"):
        ...     print(p.step, format_bytes(p.bytes), p.explanation)
    """

    kind: str
    step: int  # position in Report.steps
    phase: str
    start_event: int
    end_event: int
    peak_event: int
    bytes: int
    explanation: str
    details: dict = field(default_factory=dict)
    #: How sure: that of the phase it sits in (1 where markers or PyTorch's annotations placed it;
    #: an inferred phase's measured precision otherwise, docs/accuracy.md).
    confidence: float = 1.0
    #: The allocations that make up the shape, as indices of the trace's own allocations in event
    #: order (``Analysis.facts.alloc``): what the peak decomposition and the what-ifs move. Not in JSON.
    members: tuple = field(default=(), repr=False, compare=False)


@dataclass
class OutOfMemory:
    """An ``oom`` event: where the allocator gave up, what was asked, and what was holding memory."""

    event: int
    step: int | None  # position in Report.steps of the device's own analysis
    phase: str
    requested_bytes: int
    device_free_bytes: int
    allocated_bytes: int
    by_category: dict[str, int] = field(default_factory=dict)
    device: str = ""  # where it happened: the report's device, or another one of the snapshot
    step_number: int | None = None  # the step's number (Step.number) on that device
    reserved_bytes: int = 0  # reserved from the driver when it happened
    by_shape: dict[str, int] = field(default_factory=dict)  # the shapes alive then (peak.breakdown)
    #: Remedies whose replay, up to this moment, stays below what was reserved when the allocation
    #: failed even with the request added: {remedy: margin in bytes}. Empty when none is known to fit.
    would_fit: dict[str, int] = field(default_factory=dict)
    #: When the request is twice the size of forward's last output, still alive (an fp32 tensor of a
    #: half-precision output's shape: the logits' upcast or log-softmax for the loss): that output's size.
    upcast_of: int | None = None


@dataclass
class DeviceSummary:
    """Another device of the snapshot, which this report did not analyse: enough to know whether
    it should be (``phasemem analyze --device N``, or ``--device all``)."""

    device: str
    index: int  # its position in snapshot["device_traces"]: what --device takes
    events: int  # memory events in its trace
    allocated_bytes: int  # at the moment the snapshot was taken
    reserved_bytes: int
    ooms: int


@dataclass
class Step:
    """One training step: from the end of the previous optimizer step to the end of this one."""

    index: int  # position in Report.steps
    number: int  # training step counted from the start of recording (differs when the ring buffer wrapped)
    start_event: int
    end_event: int
    complete: bool
    peak_bytes: int
    peak_event: int | None
    start_bytes: int
    end_bytes: int
    #: Every phase any step ran, in the order this step ran them, then those it did not (``ran`` False).
    phases: dict[str, Phase]
    by_category: dict[str, int] = field(default_factory=dict)  # bytes per category at peak_event


@dataclass
class PeakBreakdown:
    """What is alive at a peak, by category and by shape, summing exactly to the peak.

    ``by_category`` sums to ``bytes``. ``by_shape`` is the part of those bytes that belongs to a named
    shape (logits, optimizer_temporaries, ...); ``rest_by_category`` is what no shape claims, so
    ``sum(by_shape) + sum(rest_by_category) == bytes``.

    Example:
        >>> report.peak.phase, report.peak.by_shape.get("logits", 0)
        ('backward', 3355443200)
    """

    bytes: int
    event: int
    step: int | None  # position in Report.steps
    step_number: int | None
    phase: str
    by_category: dict[str, int] = field(default_factory=dict)
    by_shape: dict[str, int] = field(default_factory=dict)
    rest_by_category: dict[str, int] = field(default_factory=dict)


@dataclass
class WhatIf:
    """A remedy replayed on the trace: its blocks dropped, resized or re-timed, the curve summed again.

    Example:
        >>> best = max((w for w in report.what_if if w.applies), key=lambda w: w.saves_bytes)
        >>> best.remedy, best.predicted_peak_bytes, best.new_peak_phase
    """

    remedy: str
    applies: bool
    predicted_peak_bytes: int | None
    predicted_phase_peaks: dict[str, int]
    saves_bytes: int | None
    new_peak_phase: str | None
    explanation: str
    assumptions: list[str] = field(default_factory=list)
