"""The pipeline, one way: read (the trace, or without history the live memory) → cut (the steps
asked for) → analyse → report."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..analysis.category_notes import other_note, readings_note
from ..analysis.core import Analysis
from ..analysis.measure import aggregate, measure
from ..analysis.patterns import detect as detect_patterns
from ..analysis.peak import breakdown
from ..analysis.segmentation import Segmentation
from ..analysis.spans import backward_resumed
from ..analysis.step_index import cut
from ..model import DeviceSummary, OutOfMemory, Step
from ..predictions.whatif import oom_fits, replays, upcast_source, what_if
from ..read import Reading, read
from ..read.columnar import StepIndex
from ..read.trace import A, Trace, no_gc
from ..units import format_bytes
from ..vocab import CATEGORIES, MARKER_PREFIX, PHASES, C, P
from .report import INCOMPLETE_NOTE, Report

PARTIAL_NOTE = "some steps are partial (the trace starts or ends inside them)"


def analyze(snapshot: Any, device: int | None = None, *, trusted: bool = False,
            marker_prefix: str | None = None, steps: str | int | None = None, what_ifs: bool = True) -> Report:
    """Analyse a memory snapshot: a path to a ``_dump_snapshot`` pickle (.pickle, .gz, .xz), the
    columnar file ``phasemem convert`` writes (.npz), or the snapshot dict.

    ``device`` picks the trace (default: the one with most events). ``marker_prefix`` names the
    ``record_function`` markers that delimit phases (``<prefix>forward``, ``zero_grad``,
    ``backward``, ``optimizer``); by default the prefix the snapshot says it was recorded with
    (``snapshot["phasemem"]["markers"]``), else ``phasemem::``. ``steps`` ("3", "2-4", "2-", "-4",
    by ``Step.number``) analyses only those steps when their phases come from markers, with the
    numbers the whole analysis gives them (from a columnar file, only their events are read); the
    report's notes say so. Otherwise (inferred phases) the whole trace is analysed. ``what_ifs=False``
    leaves ``report.what_if`` empty and skips the remedies' replays (a fifth of the analysis at 1M
    events) where no out-of-memory needs them (``phasemem diff`` reads none).

    Example:
        >>> report = phasemem.analyze("snapshot.pickle")
        >>> report.phases["optimizer"].peak_bytes
        >>> phasemem.analyze("big.npz", steps="100-102").steps[0].number
        100
    """
    with no_gc():  # the analysis builds many small objects too; freed while the collector is paused
        got = read(snapshot, device, trusted=trusted, steps=steps, marker_prefix=marker_prefix)
        got = cut(got)  # the steps asked for, where a step index can cut them from a trace read whole
        report = _report(got, what_ifs)
        # An out-of-memory on another device is the first thing to say, with its step and phase there.
        theirs = [o for other in report.other_devices if other.ooms
                  for o in _report(got.device(other.index), what_ifs).ooms]  # type: ignore[misc]  # read() sets it
    return replace(report, ooms=report.ooms + theirs) if theirs else report


def _live_report(got: Reading) -> Report:
    """The report of a snapshot without history: what was alive when it was taken."""
    live = got.live
    assert live is not None  # a reading without a trace has its live memory
    meta = got.meta or {}
    name = str(meta.get("device") or "") if live.device < 0 else ""  # a CPU recording is not "cuda:-1"
    return Report(device=name or f"cuda:{live.device}", n_events=got.live_events, peak_bytes=live.allocated_bytes,
                  peak_event=-1, preexisting_bytes=live.allocated_bytes, reserved_peak_bytes=live.reserved_bytes,
                  steps=[], phases={}, sources={}, notes=_lost_note(meta) + ["no allocation history: live memory only"],
                  by_category=dict(live.by_category), live=live)


def _report(got: Reading, what_ifs: bool = True) -> Report:
    """The report of what was read: without history, of the live memory; of the steps asked for
    alone where they were cut from the trace (and the result checks), else of the whole trace."""
    if got.trace is None:  # no allocation history: what was alive when it was taken
        return _live_report(got)
    if got.window is not None:
        assert got.whole is not None  # a window comes with the whole
        report = _sliced(got.trace, *got.window, got.prefix, what_ifs)
        return report if report is not None else analyze_trace(got.whole(), marker_prefix=got.prefix, what_ifs=what_ifs)
    report = analyze_trace(got.trace, marker_prefix=got.prefix, what_ifs=what_ifs)
    if got.steps is None:
        return report
    return replace(report, notes=report.notes + [
        f"steps {got.steps}: this trace's steps are not marked, so the report covers the whole "
        f"trace (its steps are found from all of it); only the picture shows those steps"])


def _sliced(part: Trace, index: StepIndex, k0: int, k1: int, prefix: str, what_ifs: bool = True) -> Report | None:
    """The report of a slice, checked against the index: None if its steps are not the index's."""
    report = analyze_trace(part, marker_prefix=prefix, what_ifs=what_ifs)
    a = int(index.first[k0])
    want = [(int(index.number[k]), int(index.first[k]) - a, int(index.stop[k]) - a - 1) for k in range(k0, k1 + 1)]
    if [(s.number, s.start_event, s.end_event) for s in report.steps] != want:
        return None  # never a silently different answer: the caller analyses the whole trace
    # Steps before the slice count as lost to the ring buffer, which marks the first one partial;
    # whether it is comes from the whole trace.
    steps = [replace(s, complete=bool(index.complete[k])) for s, k in zip(report.steps, range(k0, k1 + 1))]
    notes = [n for n in report.notes if n != PARTIAL_NOTE]
    if any(not s.complete for s in steps):
        notes.append(PARTIAL_NOTE)
    lo, hi = steps[0].number, steps[-1].number
    which = f"step {lo}" if lo == hi else f"steps {lo}-{hi}"
    notes.append(
        f"only {which} of {len(index)} read: events {part.first_event:,}-{part.first_event + len(part) - 1:,} of "
        f"{index.n_events:,}; event numbers here count from event {part.first_event:,}, and memory alive when "
        f"step {lo} began counts as allocated before recording (categories and shapes see these steps alone)")
    return replace(report, steps=steps, notes=notes)


def analyze_trace(trace: Trace, *, marker_prefix: str = MARKER_PREFIX, what_ifs: bool = True) -> Report:
    """The Report of one device's trace, built complete (``what_ifs=False``: without ``what_if``)."""
    an = Analysis.of(trace, marker_prefix)
    steps = measure(an)
    patterns = detect_patterns(an.facts)
    replayed = replays(an, patterns) if what_ifs or trace.oom_device_free else []  # an OOM's would_fit reads them
    level = an.timeline.level
    peak_event = int(np.argmax(level))
    name = str(trace.meta.get("device") or f"cuda:{trace.device}")
    by_category = dict(zip(CATEGORIES, an.categories_at_level([peak_event])[0].tolist()))
    return Report(
        device=name,
        n_events=len(trace),
        peak_bytes=int(level[peak_event]),
        peak_event=peak_event,
        preexisting_bytes=int(an.timeline.baseline),
        reserved_peak_bytes=int(an.timeline.reserved_after.max()) if len(trace) else 0,
        steps=steps,
        phases=aggregate(steps, an),
        sources={p: an.segmentation.sources[p] for p in PHASES if p in an.segmentation.sources},  # one order, every run
        patterns=patterns,
        by_category=by_category,
        ooms=_ooms(an, steps, name, patterns, replayed),
        notes=(_notes(trace, an.segmentation, steps) + _unpaired_note(an) + _counted_note(trace.meta, by_category)
               + readings_note(an.categories) + other_note(an.facts, an.categories, peak_event, int(level[peak_event]))),
        other_devices=[DeviceSummary(device=f"cuda:{d['device']}", index=d["device"], events=d["events"],
                                     allocated_bytes=d["allocated_bytes"], reserved_bytes=d["reserved_bytes"],
                                     ooms=len(d["ooms"]))
                       for d in trace.other_devices if d["events"] or d["allocated_bytes"]],
        peak=breakdown(an, patterns, steps, peak_event) if len(trace) else None,
        what_if=what_if(an, patterns, replayed) if what_ifs else [],
        analysis=an,
    )


#: The parameter category at the peak may exceed the program's own parameters (instrument()'s count,
#: ``tensor_bytes``) by this share before the report says so. fixtures/fsdp2: 1.65 GiB against the
#: shards' 542.3 MiB, fused AdamW's two moments made in the warm-up step before recording having the
#: shards' sizes; the other instrument() fixtures with a count stay within it.
COUNTED_EXCESS = 0.05


def _counted_note(meta: dict, by_category: dict) -> list[str]:
    told = (meta.get("tensor_bytes") or {}) if isinstance(meta, dict) else {}
    params, got = told.get("parameters"), int(by_category.get("parameter", 0))
    if not params or got <= params * (1 + COUNTED_EXCESS):
        return []
    state = told.get("optimizer_state")
    return [f"the parameters at the peak ({format_bytes(got)}) are more than the program's own ({format_bytes(params)}, "
            f"counted by instrument()): {format_bytes(got - params)} of them are blocks of the weights' sizes that the "
            f"trace cannot tell from weights, made before recording: optimizer state (fused AdamW's moments"
            + (f"; {format_bytes(state)} of state counted" if state else "")
            + ") or copies of the weights"]


def _lost_note(meta: dict) -> list[str]:
    return [INCOMPLETE_NOTE + str(meta["lost_note"])] if isinstance(meta, dict) and meta.get("lost_note") else []


#: An out-of-memory error is caught where at least this many allocations follow it in the trace
#: (h13_oom_retry_halve: hundreds after each; a program that dies makes none, or a few as it unwinds).
CAUGHT_ALLOCS = 16


def _caught_ooms(trace: Trace) -> list[int]:
    """The ``oom`` events that the program went on after (CAUGHT_ALLOCS allocations follow)."""
    ooms = np.flatnonzero(trace.action == A["oom"])
    if not len(ooms):
        return []
    allocs = np.flatnonzero(trace.action == A["alloc"])
    after = len(allocs) - np.searchsorted(allocs, ooms, "right")
    return [int(e) for e, k in zip(ooms, after) if k >= CAUGHT_ALLOCS]


def _notes(trace: Trace, seg: Segmentation, steps: list[Step]) -> list[str]:
    """What the reader must know to trust the report: where its phases came from, partial steps."""
    # instrument() saw phase calls that its recording does not hold (capture/lost.py): first, and loud.
    notes = _lost_note(trace.meta)
    if not seg.intervals and "inferred" not in seg.sources.values():
        notes.append("no phase markers or optimizer annotations in this trace, and no phases could be "
                     "inferred: everything is 'other'; record with phasemem.instrument() to get phases")
    elif not seg.intervals:
        notes.append("no phase markers or optimizer annotations in this trace: every phase was inferred "
                     "from the trace itself; record with phasemem.instrument() for exact phases")
    if seg.doubts:  # said, not only scored: the confidence alone is easy to miss
        notes.append("the inferred phases are uncertain: " + "; ".join(seg.doubts)
                     + " (the inferred forward and optimizer confidence are lowered to what such readings measured)")
    if len(trace) and not trace.time_us.any():
        notes.append("the trace has no event times (an older PyTorch); markers cannot be placed, "
                     "so phases were inferred")
    notes += _step_notes(seg, steps)
    return notes + _program_notes(trace, seg, steps)


def _step_notes(seg: Segmentation, steps: list[Step]) -> list[str]:
    """Notes on the steps themselves: partial, skipped updates, work after the last one."""
    notes = []
    if any(not s.complete for s in steps):
        notes.append(PARTIAL_NOTE)
        last = steps[-1]
        tail = seg.labels[last.start_event:last.end_event + 1]
        if not last.complete and len(steps) > 1 and len(tail) and not np.isin(
                tail, [P["loss"], P["backward"], P["zero_grad"], P["optimizer"]]).any():
            # h13_eval_graph_leak: a validation forward after the last update that keeps its graph
            # reads as the start of a next step; a recording stopped inside a forward reads the same
            notes.append(f"step {last.number} is forward passes only (events {last.start_event:,}-{last.end_event:,}): "
                         f"either the trace ends inside that step's forward, or they are an evaluation after the "
                         f"last update that keeps memory; the trace cannot tell which")
    if seg.skipped:
        names = ", ".join(str(steps[k].number) for k in seg.skipped if k < len(steps))
        notes.append(f"step(s) {names} ran no optimizer update: a zero_grad discarded their gradients before "
                     f"the next forward and backward (GradScaler skips optimizer.step() while the scaled "
                     f"gradients overflow, as in a run's first iterations; a loop can also skip it by hand)")
    after = seg.labels[seg.steps[-1][1]:] if seg.steps else seg.labels[:0]
    if len(after) and not (after == P["backward"]).any() and (after == P["forward"]).any():
        a = seg.steps[-1][1]
        notes.append(f"events {a}-{len(seg.labels) - 1}, after the last step, are forward passes with no backward that "
                     f"free what they allocate (an evaluation or inference): not a step, and not in the steps' table")
    return notes


def _program_notes(trace: Trace, seg: Segmentation, steps: list[Step]) -> list[str]:
    """Notes on what the program did that a step table cannot show: caught OOMs, updates inside
    backward, forward passes only."""
    notes = []
    caught = _caught_ooms(trace)
    if caught:
        where = ", ".join(f"{e:,}" for e in caught[:5]) + (" …" if len(caught) > 5 else "")
        notes.append(f"{len(caught)} out-of-memory error(s) (event(s) {where}) did not end the program: allocations "
                     f"succeed after each, so it caught them and went on (a retry, e.g. with a smaller batch); the "
                     f"step holding them includes the attempts that failed, and their memory")
    inside = backward_resumed(seg.labels, seg.step_of)
    if len(inside):
        notes.append(f"the optimizer runs inside backward in {len(inside)} of {len(steps)} step(s) (its steps "
                     f"interleave with backward: per-parameter updates from gradient hooks); a step ends at its "
                     f"last update, and each gradient is freed by its own update, not by zero_grad after backward")
    if seg.sources.get("forward") == "inferred" and not (seg.labels == P["backward"]).any() and not (
            seg.labels == P["optimizer"]).any():
        n_fwd = int((np.diff(np.concatenate([[0], (seg.labels == P["forward"]).astype(np.int8)])) == 1).sum())
        # Lifetimes alone miss a backward whose gradients have no weight's size (h9_per_sample_dpsgd
        # without frames: vmap(grad)'s per-sample gradients), so there it is what was found, not a fact.
        head = ("no backward and no optimizer in this trace: forward passes only" if seg.inferred_by != "lifetimes"
                else "no backward and no optimizer found by the allocations' lifetimes (the trace has no stack "
                     "frames, and a backward that makes no weight-sized gradients is missed): forward passes only, "
                     "as far as the trace shows")
        notes.append(f"{head} (inference, a forward-only "
                     f"benchmark or a calibration); its {n_fwd} forward run(s) are reported as one step, since "
                     f"nothing in the trace tells which of them make up one call of the model")
    return notes


#: The note on weights that pair with no gradient is written where they are at least this share of
#: what was alive before recording and to the end (h7_peft_lora: a frozen bf16 base, 99 %) and at
#: least UNPAIRED_MIN: the two cuBLAS workspaces a warm-up step leaves (64-66 MiB on the H200, in 40
#: of our traces) are no news.
UNPAIRED_SHARE = 0.25
UNPAIRED_MIN = 128 << 20


def _unpaired_note(an: Analysis) -> list[str]:
    """In a training trace, what was alive from before recording to the end and is no parameter,
    gradient or state: weights without a gradient are 'other', and the reader should know."""
    life = an.timeline.lifetimes
    codes = np.asarray(an.categories.codes)
    n = len(an.trace)
    kept = life.preexisting & (life.free_event >= n)
    if not kept.any() or not (codes == C["gradient"]).any():
        return []
    other = int(life.size[kept & (codes == C["other"])].sum())
    if other < max(UNPAIRED_SHARE * int(life.size[kept].sum()), UNPAIRED_MIN):
        return []
    return [f"{format_bytes(other)} alive from before recording to the end pair with no gradient: frozen weights (a "
            f"LoRA base, a reference or target model), weights whose gradients the trace does not show (made in a "
            f"CUDA graph's pool), a copy of the weights (an EMA, an fp32 master copy) and state kept for it, data "
            f"kept on the device (a graph, a dataset), the "
            f"math libraries' workspaces or a cache; they count as 'other', not as parameters"]


def _ooms(an: Analysis, steps: list[Step], device: str, patterns, replayed) -> list[OutOfMemory]:
    trace, seg = an.trace, an.segmentation
    out = []
    for e, free in sorted(trace.oom_device_free.items()):
        s = int(seg.step_of[e])
        reserved = int(an.timeline.reserved_after[e])
        out.append(OutOfMemory(
            event=e, step=s if s >= 0 else None, phase=PHASES[int(seg.labels[e])],
            requested_bytes=int(trace.size[e]), device_free_bytes=free,
            allocated_bytes=int(an.timeline.active_after[e]),
            by_category=dict(zip(CATEGORIES, an.categories.at([e + 1])[0].tolist())), device=device,
            step_number=steps[s].number if s >= 0 else None, reserved_bytes=reserved,
            by_shape=breakdown(an, patterns, steps, e).by_shape,
            would_fit=oom_fits(an, replayed, e, int(trace.size[e]), reserved),
            upcast_of=(int(an.timeline.lifetimes.size[u]) if (u := upcast_source(an, e, int(trace.size[e]))) is not None
                       else None)))
    return out
