"""What phasemem found, as plain dataclasses: steps, phases, their numbers, and JSON/text forms."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from .analysis import Analysis
from .categories import CategoryCurves
from .errors import RECORD_HINT
from .label_agreement import LabelAgreement, agreement
from .live import LiveMemory
from .model import Allocation, DeviceSummary, OutOfMemory, Pattern, PeakBreakdown, Phase, Step, WhatIf
from .output import Written
from .plain import plain
from .segmentation import Segmentation
from .spans import phase_runs
from .timeline import Timeline
from .trace import Trace
from .units import format_bytes
from .vocab import CATEGORIES, CATEGORY_NAMES, PHASES

__all__ = ["Report", "Allocation", "DeviceSummary", "OutOfMemory", "Pattern", "Phase", "Step", "format_report"]


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
    #: What is alive at the overall peak, by category and by shape (phasemem.peak).
    peak: PeakBreakdown | None = None
    #: The remedies replayed on the trace (phasemem.whatif), ranked by what they save.
    what_if: list[WhatIf] = field(default_factory=list)
    #: A snapshot without allocation history (legacy recording, bare segment list): what was alive when
    #: it was taken (``phasemem.live.LiveMemory``); then there are no steps, phases or shapes.
    live: LiveMemory | None = None
    #: The analysed trace the picture and the categories at any event are drawn from (not in to_dict()).
    analysis: Analysis | None = field(default=None, repr=False)

    # Read-only views of the analysis, for the picture and for scripts that predate it.
    @property
    def trace(self) -> Trace | None:
        return self.analysis.trace if self.analysis else None

    @property
    def timeline(self) -> Timeline | None:
        return self.analysis.timeline if self.analysis else None

    @property
    def segmentation(self) -> Segmentation | None:
        return self.analysis.segmentation if self.analysis else None

    @property
    def category_curves(self) -> CategoryCurves | None:
        return self.analysis.categories if self.analysis else None

    @property
    def label_codes(self) -> np.ndarray | None:
        """The phase code of every event (vocab.PhaseCode)."""
        return self.analysis.labels if self.analysis else None

    @property
    def step_of(self) -> np.ndarray | None:
        """The step position of every event, -1 outside every step."""
        return self.analysis.step_of if self.analysis else None

    @property
    def labels(self) -> np.ndarray:
        """The phase name of every trace event, as a numpy array of str."""
        return np.array(PHASES, dtype=object)[self.label_codes]

    @property
    def torch_labels(self) -> LabelAgreement | None:
        """Where the program labelled its allocations (``_set_memory_metadata``, torch's ``user_metadata``):
        how far the labels naming categories agree with phasemem's, which is right where not, the phases
        they marked and the labels kept (phasemem.label_agreement). None otherwise.

        Example:
            >>> la = report.torch_labels
            >>> la and [(d.label, d.phasemem, d.right) for d in la.disagreements]
        """
        return agreement(self.analysis) if self.analysis is not None else None

    def label_runs(self) -> list[tuple[int, int, str, int]]:
        """``labels`` run-length encoded: (first event, last event, phase, step position or -1)."""
        first, last, code, step = phase_runs(self.label_codes, self.step_of)
        return [(a, b, PHASES[c], s) for a, b, c, s in zip(first.tolist(), last.tolist(), code.tolist(), step.tolist())]

    def to_dict(self) -> dict:
        """Everything in the report as JSON-ready Python values."""
        skip = {"analysis", "live"}
        out = {f.name: plain(getattr(self, f.name)) for f in fields(self) if f.name not in skip}
        if self.live is not None:
            out["live"] = _live_dict(self.live)
            return out
        out["labels"] = [list(r) for r in self.label_runs()]
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
        row = self.category_curves.at_level([e], self.timeline)[0]
        return dict(zip(CATEGORIES, row.tolist()))

    def category_curve(self, points: int = 1000) -> dict[str, list[int]]:
        """Bytes per category at up to ``points`` evenly spaced events (and the overall peak)."""
        ev = np.unique(np.concatenate([np.linspace(0, self.n_events - 1, min(points, self.n_events)).astype(np.int64),
                                       [self.peak_event]]))
        m = self.category_curves.at_level(ev, self.timeline)
        return {"event": ev.tolist(), **{c: m[:, k].tolist() for k, c in enumerate(CATEGORIES)}}

    def patterns_of(self, kind: str) -> list[Pattern]:
        """The patterns of one kind, in trace order."""
        return [p for p in self.patterns if p.kind == kind]

    def fits(self, budget):
        """The largest batch and sequence factors predicted to fit in ``budget`` (bytes, or "80GiB"),
        with the allocator's reserve, and the remedies that would let the next factor fit
        (``phasemem.fits``).

            >>> print(report.fits("80GiB"))
        """
        from .units import parse_size
        from .errors import PhasememError
        from .fits import fits

        if self.analysis is None or self.live is not None:
            raise PhasememError("what fits is solved from an allocation history; this report has none" + RECORD_HINT)
        return fits(self.analysis, self.patterns, parse_size(budget))

    def plot(self, **options):
        """The labeled picture as a matplotlib Figure (for notebooks)."""
        from .render import plot

        return plot(self, **options)

    def picture_writer(self, path, **options):
        """The picture drawn now, and a function that writes it to the path it is given (format from
        ``path``'s extension), for ``output.write_all``."""
        from .render import picture_writer

        return picture_writer(self, path, **options)

    def __str__(self) -> str:
        return format_report(self)


#: Blocks listed in a history-less snapshot's text and JSON (the largest).
LIVE_TOP = 12
#: The first note of a report whose recording lost phases (instrument()'s ``lost_note``, capture/lost.py).
INCOMPLETE_NOTE = "INCOMPLETE RECORDING: "


def _live_dict(live) -> dict:
    return {"device": live.device, "allocated_bytes": live.allocated_bytes, "reserved_bytes": live.reserved_bytes,
            "cached_free_bytes": live.cached_free_bytes, "n_blocks": live.n_blocks, "has_frames": live.has_frames,
            "by_category": dict(live.by_category),
            "by_site": [{"site": s, "bytes": b, "count": c} for s, b, c in live.by_site],
            "largest_blocks": [{"size": b.requested_size, "site": b.site, "category": b.category}
                               for b in live.blocks[:4 * LIVE_TOP]],
            "devices": {str(d): {"allocated_bytes": a, "reserved_bytes": r} for d, (a, r) in live.devices.items()}}


def _format_live(r: Report) -> str:
    live = r.live
    lines = [f"phasemem report — {r.device}: this snapshot holds no allocation history"]
    lost = [f"note: {n}" for n in r.notes if n.startswith(INCOMPLETE_NOTE)]  # why it holds none, when known
    lines += lost or ["  (recorded with _record_memory_history(enabled=\"state\"), or taken with "
                      "torch.cuda.memory_snapshot() while no history was recorded),",
                      "  so it has no steps, phases or shapes to read; to get them, " + RECORD_HINT]
    lines += [f"live memory when it was taken: allocated {format_bytes(live.allocated_bytes)} in {live.n_blocks:,} "
              f"blocks; reserved {format_bytes(live.reserved_bytes)} (of it cached free "
              f"{format_bytes(live.cached_free_bytes)})"]
    known = {k: v for k, v in live.by_category.items() if k != "unknown"}
    if known:
        lines.append("  made of (where the allocating stack says) " + ", ".join(
            f"{k} {format_bytes(v)}" for k, v in known.items()) + (
            f"; unknown {format_bytes(live.by_category['unknown'])}" if live.by_category.get("unknown") else ""))
    else:
        lines.append("  what it is (parameters, activations, cache…) cannot be told without history: "
                     "no stack names a module's weights or an optimizer")
    others = [f"cuda:{d} {format_bytes(a)} allocated" for d, (a, _) in sorted(live.devices.items()) if d != live.device]
    if others:
        lines.append("other devices: " + "; ".join(others) + " (analyse one with --device N)")
    if live.has_frames:
        lines += ["", "largest allocation sites (live bytes, blocks):"]
        for site, nbytes, count in live.by_site[:LIVE_TOP]:
            lines.append(f"  {format_bytes(nbytes):>11} {count:>6}  {site or '(no stack recorded)'}")
    else:
        lines += ["", "no block carries a stack: the largest blocks are"]
        lines += [f"  {format_bytes(b.requested_size):>11}" for b in live.blocks[:LIVE_TOP]]
    return "\n".join(lines)


def _before(r: Report) -> str:
    """What the baseline is: memory from before recording, or, where optimizer steps ended before the
    first event (the ring buffer dropped them: h7_ring_wrapped keeps 2500 events of 6 steps), from
    before the first event the buffer kept."""
    seg = r.analysis.segmentation if r.analysis is not None else None
    if seg is not None and seg.t_lost > np.iinfo(np.int64).min:
        return "allocated before the trace's first event (the ring buffer dropped what came before)"
    return "allocated before recording"


def format_report(r: Report) -> str:
    if r.live is not None:
        return _format_live(r)
    lines = [_oom_line(r, o) for o in r.ooms]
    lines += [
        f"phasemem report — {r.device}, {r.n_events:,} events, {len(r.steps)} step(s)",
        f"peak allocated {format_bytes(r.peak_bytes)} at event {r.peak_event}"
        f" (step {_step_at(r, r.peak_event)}, {_phase_at(r, r.peak_event)}); "
        f"{_before(r)} {format_bytes(r.preexisting_bytes)}; peak reserved {format_bytes(r.reserved_peak_bytes)}",
    ]
    if r.by_category:
        parts = [f"{CATEGORY_NAMES.get(k, k)} {format_bytes(v)}" for k, v in r.by_category.items() if v]
        lines.append("  made of " + ", ".join(parts))
    if r.peak is not None and r.peak.by_shape:
        lines.append("  of which shapes: " + _shapes(r.peak.by_shape))
    if r.other_devices:
        lines.append("other devices: " + "; ".join(
            f"{d.device} {d.events:,} events, {format_bytes(d.allocated_bytes)} allocated at the end"
            + (f", {d.ooms} out-of-memory" if d.ooms else "") for d in r.other_devices)
            + " (analyse one with --device N, each with --device all)")
    if "inferred" in r.sources.values():
        low = sorted({p for p, v in r.sources.items() if v == "inferred"})
        lines.append("phases were inferred (no phasemem markers in this snapshot): " + ", ".join(
            f"{p} {_conf(r, p)}" for p in low) + " sure; docs/accuracy.md says how accurate")
    src = sorted(set(r.sources.values()))
    if src:
        said = {"markers": "from markers", "annotations": "from PyTorch's annotations",
                "inferred": "inferred from the trace"}
        lines.append("phases: " + "; ".join(
            f"{', '.join(p for p in PHASES if r.sources.get(p) == s)} {said.get(s, 'from ' + s)}" for s in src))
    lines += [f"note: {n}" for n in r.notes]
    lines += _step_table(r)
    lines += ["", "all steps (peak = highest over every occurrence):"]
    for ph in r.phases.values():
        at = f"at event {ph.peak_event}" if ph.peak_event is not None else "(it ran but allocated and freed nothing)"
        lines.append(f"      {ph.name:<10} peak {format_bytes(ph.peak_bytes):>11} {at}")
    if r.patterns:
        lines += ["", "shapes found:"] + _shape_lines(r)
    return "\n".join(lines)


def _shape_lines(r: Report) -> list[str]:
    """A line per shape found (13,000 at 1M events), each kind explained at its first."""
    lines, seen = [], set()
    for p, cell in zip(r.patterns, _byte_cells([p.bytes for p in r.patterns])):
        where = f"step {r.steps[p.step].number} {p.phase}, events {p.start_event}-{p.end_event}"
        sure = f"; {p.confidence:.0%} sure: its phase was inferred" if p.confidence < 1 else ""
        lines.append(f"  {p.kind:<22} {cell}  ({where}{sure})")
        if p.kind not in seen:  # explain each kind once, at its first occurrence
            seen.add(p.kind)
            lines.append("      " + p.explanation)
    return lines


def _step_table(r: Report) -> list[str]:
    """Every step's phases: start, peak and end bytes, and their events."""
    lines: list[str] = []
    head = f"{'step':>5} {'phase':<10} {'start':>11} {'peak':>11} {'end':>11} {'events':>13}"
    lines += ["", head, "-" * len(head)]
    pieces = _pieces(r)
    # every row's three byte cells, in table order: each distinct size formatted once
    cells = iter(_byte_cells([v for st in r.steps for x in (*st.phases.values(), st)
                              for v in (x.start_bytes, x.peak_bytes, x.end_bytes)]))
    for st in r.steps:
        tag = "" if st.complete else " (partial)"
        for ph in st.phases.values():
            ev = f"{ph.start_event}-{ph.end_event}" if ph.n_events else "—"
            k = pieces.get((st.index, ph.name), 1)
            more = f" in {k} runs" if k > 1 else ""
            lines.append(f"{st.number:>5} {ph.name:<10} {next(cells)} {next(cells)} {next(cells)} {ev:>13}{more}")
        lines.append(f"{'':>5} {'step' + tag:<10} {next(cells)} {next(cells)} {next(cells)} "
                     f"{f'{st.start_event}-{st.end_event}':>13}")
    if pieces:
        lines.append("(a phase 'in N runs' ran in N separate stretches between its first and last event)")
    return lines


def _byte_cells(values: list) -> list[str]:
    """``format_bytes`` of each value, right-aligned in 11: a distinct value formatted once (a loop's
    steps repeat their sizes; 39,000 cells at 1M events, 2,179 steps). Equal numbers format alike,
    whatever their type (format_bytes reads them as floats)."""
    memo: dict = {}
    return [memo[v] if v in memo else memo.setdefault(v, f"{format_bytes(v):>11}") for v in values]


def _oom_line(r: Report, o: OutOfMemory) -> str:
    where = f"step {o.step_number}, {o.phase}" if o.step_number is not None else o.phase
    held = ", ".join(f"{k} {format_bytes(v)}" for k, v in o.by_category.items() if v)
    line = (f"OUT OF MEMORY on {o.device or r.device} at event {o.event} ({where}): asked for "
            f"{format_bytes(o.requested_bytes)} with {format_bytes(o.device_free_bytes)} free on the device; "
            f"{format_bytes(o.allocated_bytes)} allocated" + (f" ({held})" if held else ""))
    if o.reserved_bytes:
        line += (f"; {format_bytes(o.reserved_bytes)} reserved, so {format_bytes(o.reserved_bytes - o.allocated_bytes)}"
                 f" cached but free (in blocks too small for the request, or fragmented)")
    if o.upcast_of:
        line += (f"\n  the request is twice the size of forward's last output ({format_bytes(o.upcast_of)}): an fp32 "
                 f"tensor of its shape made from half-precision values; in a language model, the logits' fp32 copy "
                 f"or their log-softmax for the loss")
    if o.by_shape:
        line += "\n  shapes alive then: " + _shapes(o.by_shape)
    if o.would_fit:
        line += "\n  would have got past this allocation (replayed, within what was reserved then): " + ", ".join(
            f"{k} (margin {format_bytes(v)})" for k, v in o.would_fit.items())
    elif o.device == r.device or not o.device:
        line += "\n  no remedy phasemem can replay keeps this allocation within what was reserved then"
    return line


def _shapes(by_shape: dict[str, int]) -> str:
    return ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(by_shape.items(), key=lambda kv: -kv[1]))


def format_what_if(r: Report) -> str:
    """The remedies, ranked by what they save, then those that do not apply and why."""
    if not r.what_if:
        return "what-if: nothing to replay (no allocation history)"
    lines = [f"what-if (the trace replayed with each remedy; peak now {format_bytes(r.peak_bytes)}):"]
    for w in r.what_if:
        if w.applies:
            verb = "saves" if w.saves_bytes >= 0 else "adds "  # a larger batch or sequence adds
            lines.append(f"  {w.remedy:<26} peak {format_bytes(w.predicted_peak_bytes):>11}  {verb} "
                         f"{format_bytes(abs(w.saves_bytes)):>11}  peak then in {w.new_peak_phase}")
            lines.append(f"      {w.explanation} Assumes: {'; '.join(w.assumptions)}.")
        else:
            lines.append(f"  {w.remedy:<26} does not apply: {w.explanation}")
    return "\n".join(lines)


def _conf(r: Report, phase: str) -> str:
    ph = r.phases.get(phase)
    return f"{ph.confidence:.0%}" if ph is not None else "?"


def _pieces(r: Report) -> dict[tuple[int, str], int]:
    """How many separate runs each (step, phase) has, where it has more than one: counted over the
    runs' columns, not a tuple per run."""
    if r.label_codes is None:
        return {}
    _, _, code, step = phase_runs(r.label_codes, r.step_of)
    keys, counts = np.unique(step * len(PHASES) + code, return_counts=True)  # step -1 (no step) too
    s, c = np.divmod(keys[counts > 1], len(PHASES))
    return {(a, PHASES[b]): k for a, b, k in zip(s.tolist(), c.tolist(), counts[counts > 1].tolist())}


def _step_at(r: Report, event: int | None):
    if event is None or r.step_of is None or r.step_of[event] < 0:
        return "-"
    return r.steps[int(r.step_of[event])].number


def _phase_at(r: Report, event: int | None) -> str:
    if event is None or r.label_codes is None:
        return "-"
    return PHASES[int(r.label_codes[event])]
