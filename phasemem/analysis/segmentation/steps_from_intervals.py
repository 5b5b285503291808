"""Steps from phase intervals: each ends where an optimizer range ends (markers or PyTorch's
annotations), or, without one, each marked forward starts one; and the iterations whose update was
skipped, split off. It reads the marks as ``markers.find_marks`` found them."""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..spans import phase_runs as runs
from ..timeline import Lifetimes
from .markers import Interval, Marks
from .partial import keeps_nothing


def steps_from_intervals(trace: Trace, marks: Marks, labels: np.ndarray, lifetimes,
                         inside: bool = True) -> tuple[list, list, list, list[int]]:
    """Steps end where an optimizer step ends; without an optimizer, each forward starts one; a
    step whose update was skipped ends where the next zero_grad discards its gradients. Returns the
    steps (first event, stop event, complete), their numbers, the µs each ends at, and the
    positions of the whole steps no optimizer range ends (``_skipped``)."""
    big, n = int(np.iinfo(np.int64).max), len(labels)
    opt = marks.optimizer
    if opt:
        # A step whose optimizer finished before the first recorded event was lost to the ring buffer.
        lost = sum(1 for iv in opt if iv.stop == 0)
        kept = _one_per_step([iv for iv in opt if iv.stop > 0], labels, inside)
        bounds = [0] + [iv.stop for iv in kept]
        steps = [(bounds[k], bounds[k + 1], kept[k].t1 != big) for k in range(len(kept))]
        ends = [iv.t1 for iv in kept]
        steps, ends = _split_skipped(trace, lifetimes, marks, labels, steps, ends, bounds)
        if steps and lost:
            steps[0] = (steps[0][0], steps[0][1], False)
        # A first step with no forward where every other has one began before the trace did
        # (h8_mid_step_start: recording started between a forward and its backward).
        # (the others are searched only where the first has none: 2,000 slices at 1M events)
        has_fwd = lambda a, b: bool((labels[a:b] == P["forward"]).any())  # noqa: E731
        if len(steps) > 1 and steps[0][2] and not has_fwd(*steps[0][:2]) and all(
                has_fwd(a, b) for a, b, _ in steps[1:]):
            steps[0] = (steps[0][0], steps[0][1], False)
        skipped = _skipped(marks.intervals, steps)  # a step the trace cut short (below) is not whole
        tail = labels[bounds[-1]:]
        # Training work after the last optimizer step is a step the trace cut short; a zero_grad or
        # logging after it is not a step, nor the end of a backward whose optimizer ran inside it
        # (h6_optim_in_backward: the graph freed after the last update). Every step starts with a
        # forward, where forwards are labelled at all.
        work = [P["forward"], P["loss"]] if np.isin(labels, [P["forward"], P["loss"]]).any() else [
            P["forward"], P["loss"], P["backward"]]
        # ... but not forward passes that keep nothing (an evaluation after the last update)
        if len(tail) and np.isin(tail, work).any() and (
                (tail == P["backward"]).any() or not keeps_nothing(trace, lifetimes, bounds[-1], n)):
            steps.append((bounds[-1], n, False))
            ends.append(big)
        return steps, list(range(lost, lost + len(steps))), ends, skipped
    fwd = marks.forward
    if fwd:
        # Each forward starts a step; events before the first forward belong to the first step.
        starts = sorted({(iv.first, iv.t0) for iv in fwd if iv.first < n})[1:]
        starts = [(a, t0) for a, t0 in starts if a > 0]
        bounds = [0] + [a for a, _ in starts] + [n]
        steps = [(bounds[k], bounds[k + 1], True) for k in range(len(bounds) - 1)]
        return steps, list(range(len(steps))), [t0 - 1 for _, t0 in starts] + [big], []
    return [(0, n, True)], [0], [big], []  # no optimizer range: none skipped


def _split_skipped(trace: Trace, lifetimes, marks: Marks, labels: np.ndarray, steps: list,
                   ends: list, bounds: list[int]) -> tuple[list, list]:
    """Split off the iterations that ran no optimizer update (``GradScaler.step`` skipping
    ``optimizer.step()`` on overflow): a zero_grad outside an optimizer's range that frees a block its
    previous backward made ends an iteration. Why each condition, and the trace: docs/accuracy.md."""
    zg = [iv for iv in marks.intervals if iv.phase == "zero_grad" and iv.stop > iv.first]
    zg = [iv for iv, closure in zip(zg, _in_optimizer(zg, marks.optimizer).tolist()) if not closure]
    if not zg:
        return steps, ends
    first, last, code, _ = runs(labels, np.zeros(len(labels), np.int32))
    bw_first, bw_last = first[code == P["backward"]], last[code == P["backward"]]
    fl_first = first[np.isin(code, [P["forward"], P["loss"]])]
    cuts = []
    for z, kb, lo in _between_passes(zg, bw_first, bw_last, fl_first, np.asarray(bounds, np.int64)):
        prev_end = int(bw_last[kb])
        # the previous pass: back to the forward or loss before it
        pass_first = int(fl_first[lo - 1]) if lo else 0
        if not _frees_made_in(trace, lifetimes(), z.first, z.stop, pass_first, prev_end, labels):
            continue
        cuts.append(min(int(fl_first[lo]), z.first))
    if not cuts:
        return steps, ends
    t = trace.time_us
    out, out_ends = [], []
    for (a, b, complete), end in zip(steps, ends):
        inner = sorted(c for c in set(cuts) if a < c < b)
        for lo, hi in zip([a] + inner, inner):
            out.append((lo, hi, True))
            out_ends.append(int(t[hi - 1]))
        out.append(((inner[-1] if inner else a), b, complete))
        out_ends.append(end)
    return out, out_ends


def _in_optimizer(ivs: list[Interval], outer: list[Interval]) -> np.ndarray:
    """Whether each interval lies inside an outermost optimizer range (a closure's zero_grad)."""
    o_t0, o_t1 = np.array([o.t0 for o in outer], np.int64), np.array([o.t1 for o in outer], np.int64)
    if not len(ivs) or not len(o_t0):
        return np.zeros(len(ivs), bool)
    k = np.searchsorted(o_t0, np.array([iv.t0 for iv in ivs], np.int64), "right") - 1
    return (k >= 0) & (np.array([iv.t1 for iv in ivs], np.int64) <= o_t1[np.maximum(k, 0)])


def _between_passes(zg: list[Interval], bw_first: np.ndarray, bw_last: np.ndarray, fl_first: np.ndarray,
                    bounds: np.ndarray) -> list[tuple[Interval, int, int]]:
    """The zero_grads that lie between two backward passes with a forward between them and no
    update: each with the previous pass's backward run (kb) and the first forward or loss run after
    it (lo), for all of them at once (4,000 at 1M events)."""
    if len(bw_first) < 2 or not len(fl_first):
        return []
    z_first, z_stop = np.array([z.first for z in zg], np.int64), np.array([z.stop for z in zg], np.int64)
    kb = np.searchsorted(bw_last, z_first, "left") - 1
    ok = (kb >= 0) & (kb + 1 < len(bw_first))
    kb = np.clip(kb, 0, len(bw_first) - 2)
    prev_end, next_start = bw_last[kb], bw_first[kb + 1]
    ok &= z_stop <= next_start
    j = np.searchsorted(bounds, prev_end, "right")
    ok &= ~((j < len(bounds)) & (bounds[np.minimum(j, len(bounds) - 1)] <= next_start))  # an update ended a step
    lo = np.searchsorted(fl_first, prev_end, "right")
    ok &= (lo < len(fl_first)) & (fl_first[np.minimum(lo, len(fl_first) - 1)] < next_start)  # a forward between
    return [(zg[i], int(kb[i]), int(lo[i])) for i in np.flatnonzero(ok).tolist()]


def _frees_made_in(trace: Trace, life: Lifetimes, z0: int, z1: int, p0: int, p1: int, labels: np.ndarray) -> bool:
    """Whether events z0..z1-1 free a block allocated in backward between events p0 and p1."""
    made = np.flatnonzero((trace.action[p0:p1 + 1] == A["alloc"]) & (labels[p0:p1 + 1] == P["backward"])) + p0
    freed = life.free_of(made)
    return bool(((freed >= z0) & (freed < z1)).any())

def _one_per_step(opt: list[Interval], labels: np.ndarray, inside: bool = True) -> list[Interval]:
    """The optimizer ranges that end a step: of those that are one step's, the last.

    ``inside``: whether the labels place backward well enough to tell an update inside it (markers or
    frames). Which ranges are one step's, and the traces that showed each case: docs/accuracy.md."""
    if len(opt) < 2:
        return opt
    # by the phase runs, not per-event running sums: four of those are 320 MB at 10M events
    first, last, code, _ = runs(labels, np.zeros(len(labels), np.int32))
    at = {ph: (first[code == P[ph]], last[code == P[ph]]) for ph in ("forward", "loss", "backward", "zero_grad")}
    # the runs that say where in a step an event is (not the optimizer's, zero_grad's or other)
    sig = np.isin(code, [P["forward"], P["loss"], P["backward"]])
    sig_first, sig_last, sig_code = first[sig], last[sig], code[sig]

    def has(ph, a, b):  # any event labelled ph in a..b-1
        f, last = at[ph]
        k = int(np.searchsorted(last, a, "left"))
        return a < b and k < len(f) and int(f[k]) < b

    other_first, other_last = first[code == P["other"]], last[code == P["other"]]

    def inside_backward(iv):
        # the last such run starting before the range, and the first holding an event at or after it,
        # both backward, with nothing unplaced between them and the range: a compiled step's forward
        # leaves its allocations 'other' between two backward runs (h8_compile_reduce_overhead)
        k = int(np.searchsorted(sig_first, iv.first))
        if k == 0 or sig_code[k - 1] != P["backward"]:
            return False
        nxt = k - 1 if sig_last[k - 1] >= iv.first else k
        if nxt >= len(sig_code) or sig_code[nxt] != P["backward"]:
            return False
        lo, hi = int(min(sig_last[k - 1], iv.first)), int(max(sig_first[nxt], iv.stop))
        j = int(np.searchsorted(other_last, lo, "left"))
        return not (j < len(other_first) and int(other_first[j]) < hi)

    out = []
    for iv, nxt in zip(opt, opt[1:]):
        a, b = iv.stop, nxt.first
        if has("forward", a, nxt.stop) or has("loss", a, nxt.stop):
            out.append(iv)
        elif not has("backward", a, b) and not has("zero_grad", a, b):
            continue  # back to back: one step's optimizers
        elif inside and inside_backward(iv):
            continue  # an update inside backward
        else:
            out.append(iv)
    return out + [opt[-1]]


def _skipped(intervals: list[Interval], steps: list[tuple[int, int, bool]]) -> list[int]:
    """Positions of the whole steps that no optimizer range ends (``_split_skipped`` made them)."""
    stops = np.sort([iv.stop for iv in intervals if iv.phase == "optimizer"])
    skipped = []
    if len(stops) and steps:
        a, b = np.array([s[0] for s in steps]), np.array([s[1] for s in steps])
        ended = np.searchsorted(stops, b, "right") > np.searchsorted(stops, a, "right")
        skipped = [k for k in np.flatnonzero(~ended).tolist() if steps[k][2]]
    return skipped
