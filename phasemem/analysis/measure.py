"""Numbers for every (step, phase): start, peak and end bytes, event ranges, largest allocations."""
from __future__ import annotations

import heapq
from itertools import islice
from typing import Any

import numpy as np

from ..model import Allocation, Phase, Step
from ..read.stacks import stack_summary
from ..read.trace import A, Trace
from ..vocab import CATEGORIES, PHASES
from .core import Analysis
from .segmentation import Segmentation, step_at_time
from .timeline import Timeline

TOP_K = 5
#: Block sizes below 2**SIZE_BITS bytes (16 TiB) share one sort key with their (step, phase).
SIZE_BITS = 44


def measure(an: Analysis) -> list[Step]:
    """Every Step with its Phases, complete (categories at each peak included), vectorised over events."""
    trace, tl, seg = an.trace, an.timeline, an.segmentation
    ran = _phases_that_ran(an)
    phases = ran + _phases_without_events(seg, tl, len(trace), {(ph.step, ph.name) for ph in ran})
    step_specs = [_step_numbers(tl, a, b) for a, b, _ in seg.steps]
    peaks = [ph.peak_event for ph in phases if ph.peak_event is not None]
    peaks += [st[0] for st in step_specs if st[0] is not None]
    rows = iter(an.categories_at_level(peaks).tolist()) if peaks else iter(())
    for ph in phases:
        if ph.peak_event is not None:
            ph.by_category = dict(zip(CATEGORIES, next(rows)))
    by_step: dict[int | None, list[Phase]] = {}
    for ph in phases:
        by_step.setdefault(ph.step, []).append(ph)
    every = [name for name in PHASES if any(ph.name == name for ph in phases)]
    steps = []
    for s, ((a, b, complete), (p, peak, start_b, end_b)) in enumerate(zip(seg.steps, step_specs)):
        mine = {ph.name: ph for ph in sorted(by_step.get(s, []),  # every measured phase has its at_event
                                             key=lambda ph: ph.at_event)}  # type: ignore[arg-type, return-value]
        mine.update((name, _not_run(name, s)) for name in every if name not in mine)
        steps.append(Step(index=s, number=seg.step_numbers[s], start_event=a, end_event=b - 1, complete=complete,
                          peak_bytes=peak, peak_event=p, start_bytes=start_b, end_bytes=end_b,
                          phases=mine,
                          by_category=dict(zip(CATEGORIES, next(rows))) if p is not None else {}))
    return steps


def _not_run(name: str, step: int) -> Phase:
    """The phase a step did not run, kept so that every step has every phase's key."""
    return Phase(name=name, step=step, peak_bytes=0, start_bytes=0, end_bytes=0, start_event=None, end_event=None,
                 peak_event=None, n_events=0, source="none", ran=False)


def aggregate(steps: list[Step], an: Analysis) -> dict[str, Phase]:
    """One Phase per name over all steps that ran it: highest peak, first start, last end."""
    specs: list[dict[str, Any]] = []
    for name in PHASES:
        occ = [ph for s in steps if (ph := s.phases.get(name)) is not None and ph.ran]
        if not occ:
            continue
        top = max(occ, key=lambda p: p.peak_bytes)
        ran = [p for p in occ if p.n_events]
        # each phase's are in this order already (_top_allocations): the first TOP_K of their merge, not a
        # sort of them all (11,000 a phase at 1M events)
        allocs = list(islice(heapq.merge(*(p.top_allocations for p in occ), key=lambda a: (-a.size, a.event)), TOP_K))
        specs.append(dict(
            name=name, step=None, peak_bytes=top.peak_bytes,
            start_bytes=occ[0].start_bytes, end_bytes=occ[-1].end_bytes,
            start_event=ran[0].start_event if ran else None, end_event=ran[-1].end_event if ran else None,
            peak_event=top.peak_event, n_events=sum(p.n_events for p in occ), source=occ[0].source,
            confidence=min(p.confidence for p in occ),
            top_allocations=allocs, at_event=occ[0].at_event, by_category=top.by_category,
        ))
    return {s["name"]: Phase(**s) for s in specs}


def _step_numbers(tl: Timeline, a: int, b: int) -> tuple[int | None, int, int, int]:
    """(peak event, peak, start bytes, end bytes) of the step over events a..b-1."""
    if b <= a:
        return None, 0, 0, 0
    p = a + int(np.argmax(tl.level[a:b]))
    return p, int(tl.level[p]), int(tl.active_before[a]), int(tl.active_after[b - 1])


def _phases_that_ran(an: Analysis) -> list[Phase]:
    """A Phase (its by_category still empty) for each (step, phase) that made events: grouped over
    the phase runs (a few per step and phase), not by sorting the events (10M of them: 0.5 s)."""
    trace, tl, seg, fx = an.trace, an.timeline, an.segmentation, an.facts
    nph = len(PHASES)
    if not len(trace):
        return []
    run_max = np.maximum.reduceat(tl.level, fx.run_first)
    # the runs tile the events: each run's first event at its maximum, for all runs in one pass
    # (was an argmax per (step, phase): 13,000 calls at 1M events)
    at = np.flatnonzero(tl.level == np.repeat(run_max, np.diff(np.append(fx.run_first, len(trace)))))
    run_of = np.searchsorted(fx.run_first, at, "right") - 1
    run_peak = at[np.concatenate([[True], run_of[1:] != run_of[:-1]])]  # every run holds its maximum
    in_step = np.flatnonzero(fx.run_step >= 0)
    if not len(in_step):
        return []
    key = fx.run_step[in_step] * nph + fx.run_phase[in_step]
    order = np.argsort(key, kind="stable")  # by (step, phase), then in event order
    runs, k_sorted = in_step[order], key[order]
    starts = np.flatnonzero(np.concatenate([[True], k_sorted[1:] != k_sorted[:-1]]))
    ends = np.concatenate([starts[1:], [len(runs)]])
    gmax = np.maximum.reduceat(run_max[runs], starts)
    # the peak is the first event at the group's maximum: in the first run that reaches it
    hit = np.where(run_max[runs] == np.repeat(gmax, ends - starts), np.arange(len(runs)), len(runs))
    peak_event = run_peak[runs[np.minimum.reduceat(hit, starts)]]
    lengths = fx.run_last[runs] - fx.run_first[runs] + 1
    counts = np.add.reduceat(lengths, starts)
    first, last = fx.run_first[runs[starts]], fx.run_last[runs[ends - 1]]
    tops = _top_allocations(trace, tl, seg)
    # each phase's source and confidence looked up once, not per (step, phase): 11,000 at 1M events
    source = [seg.sources.get(name, "markers") if name != "other" else "none" for name in PHASES]
    conf = [(seg.confidence or {}).get(name, 1.0) for name in PHASES]
    # by_category is filled in by measure(), from the categories at every peak found at once
    return [Phase(PHASES[code], s, m, b0, b1, f, end, p, c, source[code], tops.get(g, []), conf[code], {}, float(f))
            for g, s, code, f, end, m, p, c, b0, b1 in zip(
                k_sorted[starts].tolist(), *map(np.ndarray.tolist, divmod(k_sorted[starts], nph)), first.tolist(),
                last.tolist(), gmax.tolist(), peak_event.tolist(), counts.tolist(), tl.active_before[first].tolist(),
                tl.active_after[last].tolist())]


def _phases_without_events(seg: Segmentation, tl: Timeline, n: int, ran: set) -> list[Phase]:
    """Phases the markers say ran but that made no event (zero_grad before any gradient exists):
    the memory level at that moment and no event indices."""
    out, seen = [], set(ran)
    for iv in seg.intervals:
        if iv.first < iv.stop or iv.phase == "loss":
            continue  # (the step's search only for those that made no event: 15,000 intervals at 1M)
        s = step_at_time(seg, iv.t1)
        if s < 0 or (s, iv.phase) in seen:
            continue
        seen.add((s, iv.phase))
        lvl = int(tl.active_before[iv.first]) if iv.first < n else int(tl.active_after[-1])  # after the last event
        out.append(Phase(
            name=iv.phase, step=s, peak_bytes=lvl, start_bytes=lvl, end_bytes=lvl,
            start_event=None, end_event=None, peak_event=None, n_events=0, source=iv.source,
            top_allocations=[], confidence=(seg.confidence or {}).get(iv.phase, 1.0),
            at_event=iv.first - 0.5))  # it ran before the event at iv.first
    return out


def _top_allocations(trace: Trace, tl: Timeline, seg: Segmentation) -> dict[int, list[Allocation]]:
    """The TOP_K largest allocations made in each (step, phase), vectorised."""
    ev = np.flatnonzero((trace.action == A["alloc"]) & (seg.step_of >= 0))
    if not len(ev):
        return {}
    key = seg.step_of[ev].astype(np.int64) * len(PHASES) + seg.labels[ev]
    size = trace.size[ev]
    if len(ev) and int(key.max()) < 1 << (63 - SIZE_BITS) and int(size.max()) < 1 << SIZE_BITS:
        # (group, size descending) in one int64, sorted stably (events stay in order within a size):
        # a third of lexsort's time on 5M allocations
        order = np.argsort(key * (1 << SIZE_BITS) + ((1 << SIZE_BITS) - 1 - size), kind="stable")
    else:
        order = np.lexsort((ev, -size, key))
    ks, es = key[order], ev[order]
    starts = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
    rank = np.arange(len(ks)) - np.repeat(starts, np.diff(np.concatenate([starts, [len(ks)]])))
    pick = rank < TOP_K
    n = len(trace)
    picked, kp = es[pick], ks[pick]
    sids = trace.stack[picked]
    summary = {sid: stack_summary(trace, sid) for sid in np.unique(sids).tolist()}  # call sites recur every step
    allocs = [Allocation(e, nbytes, None if f >= n else f, summary[sid]) for e, nbytes, f, sid in zip(
        picked.tolist(), trace.size[picked].tolist(), tl.lifetimes.free_of(picked).tolist(), sids.tolist())]
    # the picks of a (step, phase) lie together: each group is one slice of them
    cut = np.flatnonzero(np.concatenate([[True], kp[1:] != kp[:-1]]))
    bounds = np.append(cut, len(kp)).tolist()
    return {k: allocs[a:b] for k, a, b in zip(kp[cut].tolist(), bounds[:-1], bounds[1:])}
