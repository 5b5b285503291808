"""The report as text: its header (the peak and what fills it, where the phases came from, the notes),
the whole report (``--full``: every step's phases, every shape), a snapshot without history, the
out-of-memory lines and the what-if table. The short report (``str(report)``) is short.py, built
from these pieces. Every figure of a shape is said with its label (vocab.AT_PEAK,
patterns.shape_size_label), so that the header's and the list's numbers can be told apart.

Example:
    >>> print(format_full(report))
"""
from __future__ import annotations

import numpy as np

from ...analysis.patterns import shape_size_label
from ...analysis.spans import phase_runs
from ...errors import RECORD_HINT
from ...model import OutOfMemory
from ...report.report import INCOMPLETE_NOTE, LIVE_TOP, Report, reserved_measured
from ...units import format_bytes
from ...vocab import AT_PEAK, CATEGORY_NAMES, PHASES


def format_full(r: Report) -> str:
    """Everything: the header, every step's phases, each phase's highest peak, every shape found."""
    if r.live is not None:
        return format_live(r)
    lines = [oom_line(r, o) for o in r.ooms] + header(r) + [f"note: {n}" for n in r.notes]
    lines += step_table(r, r.steps)
    lines += ["", "all steps (peak = highest over every occurrence):"]
    for ph in r.phases.values():
        at = f"at event {ph.peak_event}" if ph.peak_event is not None else "(it ran but allocated and freed nothing)"
        lines.append(f"      {ph.name:<10} peak {format_bytes(ph.peak_bytes):>11} {at}")
    if r.patterns:
        lines += ["", "shapes found (each one's size, and what it measures):"] + _shape_lines(r)
    return "\n".join(lines)


def header(r: Report) -> list[str]:
    """The first lines: the trace, the peak and what fills it, other devices, where the phases came from."""
    lines = [
        f"phasemem report — {r.device}, {r.n_events:,} events, {len(r.steps):,} step(s)",
        f"peak allocated {format_bytes(r.peak_bytes)} at event {r.peak_event}"
        f" (step {step_at(r, r.peak_event)}, {phase_at(r, r.peak_event)}); "
        f"{_before(r)} {format_bytes(r.preexisting_bytes)}; {reserved_words(r)}",
    ]
    if r.by_category:
        parts = [f"{CATEGORY_NAMES.get(k, k)} {format_bytes(v)}" for k, v in r.by_category.items() if v]
        lines.append("  made of " + ", ".join(parts))
    if r.peak is not None and r.peak.by_shape:
        lines.append(f"  of which shapes, {AT_PEAK}: " + _shapes(r.peak.by_shape))
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
    return lines


def reserved_words(r: Report) -> str:
    if reserved_measured(r):
        return f"peak reserved {format_bytes(r.reserved_peak_bytes)}"
    if r.device.startswith("cpu"):
        return "peak reserved: not measured on CPU (no caching allocator)"
    return "peak reserved: not recorded (no segment in this trace)"


def _shape_lines(r: Report) -> list[str]:
    """A line per shape found (13,000 at 1M events), each kind explained at its first."""
    lines, seen = [], set()
    for p, cell in zip(r.patterns, byte_cells([p.bytes for p in r.patterns])):
        where = f"step {r.steps[p.step].number} {p.phase}, events {p.start_event}-{p.end_event}"
        sure = f"; {p.confidence:.0%} sure: its phase was inferred" if p.confidence < 1 else ""
        lines.append(f"  {p.kind:<22} {cell}, {shape_size_label(p.kind, p.details)}  ({where}{sure})")
        if p.kind not in seen:  # explain each kind once, at its first occurrence
            seen.add(p.kind)
            lines.append("      " + p.explanation)
    return lines


def step_table(r: Report, steps) -> list[str]:
    """These steps' phases: start, peak and end bytes, and their events."""
    lines: list[str] = []
    head = f"{'step':>5} {'phase':<10} {'start':>11} {'peak':>11} {'end':>11} {'events':>13}"
    lines += ["", head, "-" * len(head)]
    pieces = _pieces(r)
    # every row's three byte cells, in table order: each distinct size formatted once
    ran = [[ph for ph in st.phases.values() if ph.ran] for st in steps]  # a phase a step did not run: no row
    cells = iter(byte_cells([v for st, phs in zip(steps, ran) for x in (*phs, st)
                              for v in (x.start_bytes, x.peak_bytes, x.end_bytes)]))
    for st, phs in zip(steps, ran):
        tag = "" if st.complete else " (partial)"
        for ph in phs:
            ev = f"{ph.start_event}-{ph.end_event}" if ph.n_events else "—"
            k = pieces.get((st.index, ph.name), 1)
            more = f" in {k} runs" if k > 1 else ""
            lines.append(f"{st.number:>5} {ph.name:<10} {next(cells)} {next(cells)} {next(cells)} {ev:>13}{more}")
        lines.append(f"{'':>5} {'step' + tag:<10} {next(cells)} {next(cells)} {next(cells)} "
                     f"{f'{st.start_event}-{st.end_event}':>13}")
    if any(st.index == s for st in steps for s, _ in pieces):
        lines.append("(a phase 'in N runs' ran in N separate stretches between its first and last event)")
    return lines


def byte_cells(values: list) -> list[str]:
    """``format_bytes`` of each value, right-aligned in 11: a distinct value formatted once (a loop's
    steps repeat their sizes; 39,000 cells at 1M events, 2,179 steps). Equal numbers format alike,
    whatever their type (format_bytes reads them as floats)."""
    memo: dict = {}
    return [memo[v] if v in memo else memo.setdefault(v, f"{format_bytes(v):>11}") for v in values]


def oom_line(r: Report, o: OutOfMemory) -> str:
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
            assert w.saves_bytes is not None and w.predicted_peak_bytes is not None  # a remedy that applies has both
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
    if r.analysis is None:
        return {}
    _, _, code, step = phase_runs(r.analysis.labels, r.analysis.step_of)
    keys, counts = np.unique(step * len(PHASES) + code, return_counts=True)  # step -1 (no step) too
    s, c = np.divmod(keys[counts > 1], len(PHASES))
    return {(a, PHASES[b]): k for a, b, k in zip(s.tolist(), c.tolist(), counts[counts > 1].tolist())}


def step_at(r: Report, event: int | None):
    if event is None or r.analysis is None or r.analysis.step_of[event] < 0:
        return "-"
    return r.steps[int(r.analysis.step_of[event])].number


def phase_at(r: Report, event: int | None) -> str:
    if event is None or r.analysis is None:
        return "-"
    return PHASES[int(r.analysis.labels[event])]


def _before(r: Report) -> str:
    """What the baseline is: memory from before recording, or, where optimizer steps ended before the
    first event (the ring buffer dropped them: h7_ring_wrapped keeps 2500 events of 6 steps), from
    before the first event the buffer kept."""
    seg = r.analysis.segmentation if r.analysis is not None else None
    if seg is not None and seg.t_lost > np.iinfo(np.int64).min:
        return "allocated before the trace's first event (the ring buffer dropped what came before)"
    return "allocated before recording"


def format_live(r: Report) -> str:
    live = r.live
    assert live is not None  # asked only of a report without history
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


