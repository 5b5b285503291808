"""Steps and phases from lifetimes alone (snapshots recorded with ``context=None``, or stripped).

A step repeats the same allocation sizes; inside it, forward/backward is a mountain of
activations; what follows backward is the optimizer. docs/accuracy.md describes every rule and
how accurate they are.
"""
from __future__ import annotations

import numpy as np

from ..vocab import P
from ..timeline import Timeline
from ..trace import A, Trace
from .bursts import BURST, burst_freed
from .gradients import (covers_parameters, keeps_gradients, makes_gradients, optimizer_start, parameter_sizes,
                        sized_like_an_optimizer)
from .loss import graphed_steps, loss_span
from .passes import MIN_SAVED, candidate_periods, has_backward, mountains, passes


def labels_from_lifetimes(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]]:
    """Phase codes per event and step starts (event indices) from lifetimes alone."""
    n_alloc = max(int((trace.action == A["alloc"]).sum()), 1)
    tries = []
    # Longest regular period first. A step holds its forward and backward: a period shorter than
    # the training passes it yields is a layer's, not a step's (in a trace of barely one step only
    # a layer's period is visible); then the next, then none.
    for period in candidate_periods(trace) + [None]:
        period_events = period * len(trace) / n_alloc if period else None
        labels, starts, lengths, tops = _label_passes(trace, tl, period_events, fill=False)
        if lengths and (period_events is None or np.median(lengths) <= period_events):
            break
        tries.append(period_events)
    else:
        graphed = graphed_steps(trace, tl)
        if graphed is not None:
            return graphed
        period_events = tries[0]
    if period_events is None:
        # No regular period (batches of varying length): the tops' usual spacing stands in for
        # it, so that what a loop holds for a whole step (the loss, kept for logging) is not
        # taken for an activation. (The last trial was the one without a period: its tops.)
        if len(tops) >= 3:
            est = float(np.median(np.diff(tops)))
            lengths2 = _label_passes(trace, tl, est, fill=False)[2]
            if lengths2 and np.median(lengths2) <= est:
                period_events = est
    labels, starts = _label_passes(trace, tl, period_events)[:2]
    return labels, starts


def _label_passes(trace: Trace, tl: Timeline, period_events: float | None,
                  fill: bool = True) -> tuple[np.ndarray, list[int], list[int], list[int]]:
    """Labels, step starts, the length in events of each training pass found, and every pass's top."""
    n = len(trace)
    labels = np.zeros(n, np.int8)
    mts = mountains(trace, tl, period_events, fill)
    if not mts:
        return labels, [0], [], []
    mts = passes(trace, tl, mts)
    life = tl.lifetimes
    born = (life.alloc_event >= 0) & (life.free_event < n)
    la, lf = life.alloc_event[born], life.free_event[born]
    free_of = tl.freed_at
    allocs = np.flatnonzero(trace.action == A["alloc"])
    params = parameter_sizes(tl)
    # A trace trains only if some backward leaves gradients behind: parameter-sized blocks made
    # after a top that outlive its pass (until zero_grad, or for good). An inference loop's
    # parameter-sized activations (a CNN's per-channel tensors) die within the pass.
    nexts = [f0 for f0, _, _ in mts[1:]] + [n]
    trains = len(params) < 3 or any(keeps_gradients(trace, allocs, params, free_of, top, b1, nx)
                                    for (_, top, b1), nx in zip(mts, nexts))
    starts = [0]
    lengths = []
    burst = burst_freed(trace)
    # Burst frees of what the trace itself allocated: a foreach optimizer's temporaries (or
    # gradients zero_grad frees); pre-existing blocks freed at the start say nothing of a step.
    freed_in_burst = np.zeros(n, bool)
    freed_in_burst[lf[burst[lf]]] = True
    first = mts[0][0]
    if freed_in_burst[:first].sum() >= BURST:
        # The trace starts inside a step (the ring buffer wrapped): its optimizer ends that step.
        last = int(np.flatnonzero(freed_in_burst[:first])[-1])
        labels[:last + 1] = P["optimizer"]
        starts.append(first)
    prev_end = -1
    for k, (f0, top, b1) in enumerate(mts):
        nxt = mts[k + 1][0] if k + 1 < len(mts) else n
        # Passes closer together than a step are micro-batches of one step (accumulation), unless
        # an optimizer's bursts come between them (a step made longer by an evaluation loop).
        if k and (period_events is None or f0 - starts[-1] >= 0.8 * period_events
                  or burst[prev_end + 1:f0].sum() >= BURST):
            starts.append(f0)
        prev_end = b1
        if not (trains and has_backward(la, lf, f0, top) and makes_gradients(trace, allocs, params, top, b1)):
            # No backward, so no optimizer either (inference) -- unless what follows makes
            # parameter-sized temporaries and frees them in bursts, as a foreach optimizer does
            # after a backward the trace cannot see (a CUDA-graphed model's replay makes no events).
            made = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, nxt, "left")]
            temps = made[burst[np.minimum(free_of[made], n - 1)] & (free_of[made] < nxt)]
            opt = len(temps) >= BURST and covers_parameters(params, trace.size[temps])
            labels[f0:nxt] = P["forward"]
            if opt:
                labels[b1 + 1:nxt] = P["optimizer"]
            continue
        lengths.append(b1 - f0)
        labels[f0:top + 1] = P["forward"]
        labels[top + 1:b1 + 1] = P["backward"]
        span = loss_span(trace, free_of, f0, top, allocs)
        if span and span[1] <= b1:
            labels[span[0]:span[1]] = P["loss"]
            labels[span[1]:b1 + 1] = P["backward"]
        # What follows backward up to the next forward is the optimizer, if it allocates at all --
        # up to its last burst of frees when it has them (a foreach optimizer's temporaries, or
        # zero_grad's); what allocates after that is a forward the loop ran with no backward (an
        # evaluation), the rest 'other'.
        tail = np.arange(b1 + 1, nxt)
        tail_allocs = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, nxt, "left")]
        made = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
        grads = trace.size[made[free_of[made] > b1]]
        if len(tail_allocs) and sized_like_an_optimizer(params, grads, trace.size[tail_allocs]):
            bursts = np.flatnonzero(burst[tail])
            end = b1 + 1 + int(bursts[-1]) if len(bursts) >= BURST else nxt - 1
            labels[optimizer_start(trace, allocs, params, b1, end, labels):end + 1] = P["optimizer"]
            rest = np.searchsorted(allocs, nxt, "left") - np.searchsorted(allocs, end, "right")
            if rest >= MIN_SAVED:
                labels[end + 1:nxt] = P["forward"]
    return labels, starts, lengths, [top for _, top, _ in mts]
