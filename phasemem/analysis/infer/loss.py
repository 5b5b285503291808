"""The loss from cross-entropy's fingerprint, and CUDA-graphed steps found by it.

Cross-entropy allocates the log-softmax of the model's output (after an fp32 copy, under
autocast), then the loss value, a tiny block or two; backward then allocates its seed (a tiny
block) and the log-softmax's gradient, the log-softmax's size.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..timeline import Timeline
from .bursts import BURST, burst_freed
from .gradients import covers_parameters, parameter_sizes

TINY, LOOK, PAST, QUICK = 512, 32, 4, 4  # a scalar's block; allocations before the top searched; freed at once


def loss_span(trace: Trace, free_of: np.ndarray, f0: int, top: int,
              allocs: np.ndarray | None = None) -> tuple[int, int] | None:
    """(first event of the loss, first of backward) in a training pass, from cross-entropy's trace.

    The loss allocates the log-softmax of the model's output (after an fp32 copy, under autocast),
    then the loss value, a tiny block or two; backward then allocates its seed (a tiny block) and
    the log-softmax's gradient, the log-softmax's size. Found on every real trace with a
    cross-entropy loss; any other loss leaves the pass without one (its forward runs to backward).
    """
    if allocs is None:
        allocs = np.flatnonzero(trace.action == A["alloc"])
    # The top may fall just before backward's seed (the previous loss value freed as the new one
    # is assigned): backward's first few allocations past it are searched too.
    lo, mid = np.searchsorted(allocs, f0, "left"), np.searchsorted(allocs, top, "right")
    idx = allocs[lo:mid + PAST]
    n_after = len(idx) - (mid - lo)
    if len(idx) < 4:
        return None
    sz = trace.size[idx]
    tiny = sz <= TINY
    for j in range(len(idx) - 1, max(len(idx) - 1 - LOOK - n_after, 0), -1):
        if tiny[j]:
            continue
        before = np.flatnonzero(~tiny[:j])
        if not len(before):
            return None
        i = int(before[-1])
        if sz[i] != sz[j] or j - i < 3:
            continue
        k = j - 1  # backward's seed, past a tiny block freed at once
        if free_of[idx[k]] - idx[k] <= QUICK and k - 1 > i and tiny[k - 1]:
            k -= 1
        if k - 1 <= i:  # the loss value must come between
            continue
        # the fp32 copy of half-precision logits made for the log-softmax and dropped at once
        if (i > 1 and sz[i - 1] == sz[i] and 2 * sz[i - 2] == sz[i]
                and free_of[idx[i - 1]] - idx[i - 1] <= 2 * QUICK):
            i -= 1
        return int(idx[i]), int(idx[k])
    return None


def fingerprints(trace: Trace, tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Every place cross-entropy's fingerprint (see ``loss_span``) could be, anywhere in the trace:
    the loss's first event and backward's. Only where nothing else tells the loss (no forward
    events) is this trusted."""
    free_of = tl.freed_at
    allocs = np.flatnonzero(trace.action == A["alloc"])
    tiny = trace.size[allocs] <= TINY
    nt = np.flatnonzero(~tiny)
    if len(nt) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    i, j = nt[:-1], nt[1:]
    k = j - 1
    quick = (free_of[allocs[k]] - allocs[k] <= QUICK) & (k - 1 > i)
    k = np.where(quick, k - 1, k)
    ok = (trace.size[allocs[i]] == trace.size[allocs[j]]) & (j - i >= 3) & (k - 1 > i)
    return allocs[i[ok]], allocs[k[ok]]


def graphed_loss(trace: Trace, tl: Timeline, labels: np.ndarray) -> None:
    """With frames, a loss is the 'other' between a forward and its backward; a CUDA-graphed
    model's forward makes no events, so its loss is found by cross-entropy's fingerprint instead:
    'other' right before a backward that begins where a fingerprint says it does."""
    for l0, b0 in zip(*fingerprints(trace, tl)):
        if labels[b0] == P["backward"] and (b0 == 0 or labels[b0 - 1] != P["backward"]) and (
                labels[l0:b0] == P["other"]).all():
            labels[l0:b0] = P["loss"]


def graphed_steps(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]] | None:
    """Steps of a model whose forward and backward replay as CUDA graphs (``torch.compile``'s
    reduce-overhead mode, ``make_graphed_callables``): they make no events, so there is no pass to
    find, but the loss outside the graph leaves cross-entropy's fingerprint (see ``loss_span``) and
    a foreach optimizer its bursts. Each fingerprint followed by an optimizer's bursts is a step:
    loss, backward up to the optimizer's first burst-freed temporary, optimizer to its last."""
    n = len(trace)
    life = tl.lifetimes
    born = life.paired
    loss0, bwd0 = fingerprints(trace, tl)
    if not len(loss0):
        return None
    burst = burst_freed(trace)
    params = parameter_sizes(tl)
    temp = np.zeros(n, bool)  # allocations freed in a burst: an optimizer's temporaries
    temp[life.alloc_event[born][burst[life.free_event[born]]]] = True
    labels = np.zeros(n, np.int8)
    starts = [0]
    ends = np.concatenate([loss0[1:], [n]])
    steps = 0
    for l0, b0, nxt in zip(loss0.tolist(), bwd0.tolist(), ends.tolist()):
        t = np.flatnonzero(temp[b0:nxt])
        f = np.flatnonzero(burst[b0:nxt])
        if len(t) < BURST or len(f) < BURST:
            continue  # no optimizer after it: not a training step's loss
        o0, o1 = b0 + int(t[0]), b0 + int(f[-1])
        # an optimizer's temporaries are the parameters' sizes (a generate() loop's bursts are not)
        if not covers_parameters(params, trace.size[b0 + t]):
            continue
        labels[l0:b0] = P["loss"]
        labels[b0:o0] = P["backward"]
        labels[o0:o1 + 1] = P["optimizer"]
        if steps:
            starts.append(l0)
        steps += 1
    return (labels, starts) if steps else None


#: A scalar loss's backward seed (``ones_like(loss)``): fp32 4 bytes, fp64 8.
SEED = 8
#: Allocations before the seed searched for the loss's unreduced value: it, then the reduction's
#: partial sums and its scalar (h8_compile_reduce_overhead: 3).
UNREDUCED = 3


def seeded_steps(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]] | None:
    """Steps of a CUDA-graphed model trained on a loss that leaves no cross-entropy fingerprint (MSE): the
    gradient of the loss's unreduced value, allocated right after backward's seed and freed before it,
    marks each step (the evidence: docs/accuracy.md).
    """
    n = len(trace)
    free_of = tl.freed_at
    allocs = np.flatnonzero(trace.action == A["alloc"])
    if len(allocs) <= UNREDUCED + 1:
        return None
    sz, fo = trace.size[allocs], free_of[allocs]
    m = np.arange(UNREDUCED, len(allocs) - 1)
    seed = (sz[m] <= SEED) & (sz[m + 1] > TINY) & (allocs[m + 1] == allocs[m] + 1) \
        & (fo[m + 1] < fo[m]) & (fo[m] - fo[m + 1] <= QUICK) & (fo[m] < n)
    labels = np.zeros(n, np.int8)
    starts: list[int] = []
    for k in m[seed].tolist():
        back = np.arange(k - UNREDUCED, k)
        same = back[(sz[back] == sz[k + 1]) & (fo[back] < allocs[k])]
        if not len(same) or (sz[same[0] + 1:k] >= sz[k + 1]).any():
            continue
        s0, s1 = int(allocs[same[0]]), int(fo[k])
        if s1 + 1 < n and trace.addr[s1 + 1] == trace.addr[s1] and trace.action[s1 + 1] == A["free_completed"]:
            s1 += 1
        labels[s0:allocs[k]] = P["loss"]
        labels[allocs[k]:s1 + 1] = P["backward"]
        starts.append(s0)
    if not starts:
        return None
    starts[0] = 0
    return labels, starts
