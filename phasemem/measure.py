"""Numbers for every (step, phase): start, peak and end bytes, event ranges, largest allocations."""
from __future__ import annotations

import numpy as np

from .model import Allocation, Phase, Step
from .segment import Segmentation, step_at_time
from .stacks import stack_summary
from .vocab import PHASES
from .timeline import Timeline
from .trace import A, Trace

TOP_K = 5


def measure(trace: Trace, tl: Timeline, seg: Segmentation) -> list[Step]:
    """Build every Step with its Phases, vectorised over events."""
    n = len(trace)
    level = tl.level
    before = tl.active_before
    after = tl.active_after
    nph = len(PHASES)
    in_step = seg.step_of >= 0
    key = (seg.step_of.astype(np.int64) * nph + seg.labels)[in_step]
    idx = np.flatnonzero(in_step)
    order = np.argsort(key, kind="stable")
    k_sorted = key[order]
    i_sorted = idx[order]
    if len(k_sorted):
        cut = np.flatnonzero(np.diff(k_sorted)) + 1
        starts = np.concatenate([[0], cut])
        groups = k_sorted[starts]
        first = i_sorted[starts]
        last = i_sorted[np.concatenate([cut - 1, [len(i_sorted) - 1]])]
        lv = level[i_sorted]
        gmax = np.maximum.reduceat(lv, starts)
        counts = np.diff(np.concatenate([starts, [len(i_sorted)]]))
        pos = np.where(lv == np.repeat(gmax, counts), np.arange(len(lv)), len(lv))
        peak_at = i_sorted[np.minimum.reduceat(pos, starts)]
    else:
        groups = first = last = gmax = counts = peak_at = np.zeros(0, np.int64)

    tops = _top_allocations(trace, tl, seg)
    found: dict[int, Phase] = {}
    for g, f, l, m, p, c in zip(groups.tolist(), first.tolist(), last.tolist(), gmax.tolist(),
                                peak_at.tolist(), counts.tolist()):
        s, code = divmod(g, nph)
        name = PHASES[code]
        found[g] = Phase(
            name=name, step=s, peak_bytes=m, start_bytes=int(before[f]), end_bytes=int(after[l]),
            start_event=f, end_event=l, peak_event=p, n_events=c,
            source=seg.sources.get(name, "markers") if name != "other" else "none",
            confidence=(seg.confidence or {}).get(name, 1.0),
            top_allocations=tops.get(g, []),
        )
    at = {g: ph.start_event for g, ph in found.items()}
    for g, ph in found.items():
        ph.at_event = float(ph.start_event)

    # Phases the markers say ran but that made no event (zero_grad before any gradient exists):
    # reported with the memory level at that moment and no event indices.
    for iv in seg.intervals:
        s = step_at_time(seg, iv.t1)
        if iv.first < iv.stop or iv.phase == "loss" or s < 0:
            continue
        g = s * nph + PHASES.index(iv.phase)
        if g not in found:
            lvl = int(before[iv.first]) if iv.first < n else int(after[-1])  # ran after the last event
            found[g] = Phase(
                name=iv.phase, step=g // nph, peak_bytes=lvl, start_bytes=lvl, end_bytes=lvl,
                start_event=None, end_event=None, peak_event=None, n_events=0,
                source=iv.source, top_allocations=[], confidence=(seg.confidence or {}).get(iv.phase, 1.0),
            )
            at[g] = iv.first - 0.5  # it ran before the event at iv.first
            found[g].at_event = at[g]

    steps = []
    for s, (a, b, complete) in enumerate(seg.steps):
        mine = sorted((g for g in found if g // nph == s), key=at.__getitem__)
        phases = {found[g].name: found[g] for g in mine}
        if b > a:
            seg_level = level[a:b]
            p = a + int(np.argmax(seg_level))
            peak, start_b, end_b = int(level[p]), int(before[a]), int(after[b - 1])
        else:
            p, peak, start_b, end_b = None, 0, 0, 0
        steps.append(Step(index=s, number=seg.step_numbers[s], start_event=a, end_event=b - 1, complete=complete,
                          peak_bytes=peak, peak_event=p, start_bytes=start_b, end_bytes=end_b, phases=phases))
    return steps


def _top_allocations(trace: Trace, tl: Timeline, seg: Segmentation) -> dict[int, list[Allocation]]:
    """The TOP_K largest allocations made in each (step, phase), vectorised."""
    ev = np.flatnonzero((trace.action == A["alloc"]) & (seg.step_of >= 0))
    if not len(ev):
        return {}
    key = seg.step_of[ev].astype(np.int64) * len(PHASES) + seg.labels[ev]
    order = np.lexsort((ev, -trace.size[ev], key))
    ks, es = key[order], ev[order]
    starts = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
    rank = np.arange(len(ks)) - np.repeat(starts, np.diff(np.concatenate([starts, [len(ks)]])))
    pick = rank < TOP_K
    n = len(trace)
    frees = tl.lifetimes.free_of(es[pick])
    out: dict[int, list[Allocation]] = {}
    for k, e, f in zip(ks[pick].tolist(), es[pick].tolist(), frees.tolist()):
        out.setdefault(k, []).append(Allocation(
            event=e, size=int(trace.size[e]), free_event=None if f >= n else f,
            stack=stack_summary(trace, int(trace.stack[e])),
        ))
    return out
