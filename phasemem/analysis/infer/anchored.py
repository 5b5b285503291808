"""Training passes found from their gradients, where the activation mountains show none: each set of
parameter-sized blocks freed together anchors a backward (docs/accuracy.md, "Passes the mountains miss").
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..timeline import Timeline
from .bursts import ZERO_GRAD_MIN
from .gradients import MIN_PARAM_SIZES, covers_parameters, parameter_sizes, sized_like_an_optimizer
from .odd_steps import held_over
from .other_work import label_update

#: A set of gradients lives past its last allocation at least 1/LIVE_ACROSS as long as it took to make
#: them (through the update): h6_save_on_cpu's backward makes them over 659 events, they live 632 more;
#: an optimizer's temporaries freed together right after they are made (2-6 events) do not.
LIVE_ACROSS = 2


def anchored_passes(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int], np.ndarray] | None:
    """Labels, step starts and the gradients' allocation events, from the gradients' sets (see the
    module), or None where fewer than two backward runs are anchored so: nothing then says the trace
    trains."""
    n = len(trace)
    params = parameter_sizes(tl)
    if len(params) < MIN_PARAM_SIZES:
        return None
    allocs = np.flatnonzero(trace.action == A["alloc"])
    free_of = tl.freed_at
    cand = allocs[np.isin(trace.size[allocs], params)]
    found = _gradient_sets(trace, params, allocs, free_of, cand)
    if found is None:
        return None
    bwd, grads = found
    # The last backward's gradients are never freed: the same sizes made after the last set's frees.
    last_z = max(z0 for _, _, z0 in bwd)
    kept = cand[(free_of[cand] >= n) & (cand > last_z)]
    if len(kept) >= ZERO_GRAD_MIN and covers_parameters(params, trace.size[kept]):
        bwd.append((int(kept.min()), int(kept.max()), n))
        grads.append(kept)
    bwd.sort()
    if len(bwd) < 2:
        return None
    passes = _label_passes(trace, params, allocs, free_of, bwd)
    if passes is None:
        return None
    labels, starts = passes
    return labels, starts, np.sort(np.concatenate(grads))


def _gradient_sets(trace: Trace, params: np.ndarray, allocs: np.ndarray, free_of: np.ndarray,
                   cand: np.ndarray) -> tuple[list[tuple[int, int, int]], list[np.ndarray]] | None:
    """(first made, last made, first freed) of each set of gradients freed together, and the sets'
    allocation events; None where none is found."""
    n = len(trace)
    freed = cand[free_of[cand] < n]
    order = np.argsort(free_of[freed], kind="stable")
    freed, fs = freed[order], free_of[freed][order]
    if len(fs) < ZERO_GRAD_MIN:
        return None
    # zero_grad frees every gradient without allocating between: a run of frees no allocation splits
    # (FREED_TOGETHER apart would join backward's own frees of parameter-sized activations to it:
    # h7_capturable_adam)
    made_before = np.searchsorted(allocs, fs, "left")
    run = np.concatenate([[0], np.cumsum(np.diff(made_before) > 0)])
    sets = [freed[run == r] for r in np.unique(run) if (run == r).sum() >= ZERO_GRAD_MIN]
    # A set of gradients was made in one backward, before the update that reads them: made within a
    # stretch shorter than the distance to their frees, of the parameters' sizes, with parameter-sized
    # work (the optimizer) between the last of them and their frees.
    bwd, grads = [], []
    for g in sets:
        # a block made long after the rest and freed with them (the next batch, h7_capturable_adam) is
        # no gradient of that backward
        g = np.sort(g)
        gaps = np.diff(g)
        if len(gaps) and gaps.max() > g[int(gaps.argmax())] - g[0] and int(gaps.argmax()) + 1 >= ZERO_GRAD_MIN:
            g = g[:int(gaps.argmax()) + 1]
        g0, g1, z0 = int(g.min()), int(g.max()), int(free_of[g].min())
        if LIVE_ACROSS * (z0 - g1) < g1 - g0 or not covers_parameters(params, trace.size[g]):
            continue
        between = allocs[np.searchsorted(allocs, g1, "right"):np.searchsorted(allocs, z0, "left")]
        if not sized_like_an_optimizer(params, trace.size[g], trace.size[between]):
            continue
        bwd.append((g0, g1, z0))
        grads.append(g)
    # An optimizer's own temporaries, made and freed together inside the gradients' life, are no set
    # of gradients (h10_moco_queue's foreach temporaries, inside the gradients' life)
    inner = [any(o is not b and o[0] < b[0] and b[2] < o[2] for o in bwd) for b in bwd]
    grads = [g for g, x in zip(grads, inner) if not x]
    bwd = [b for b, x in zip(bwd, inner) if not x]
    if not bwd:
        return None
    return bwd, grads


def _label_passes(trace: Trace, params: np.ndarray, allocs: np.ndarray, free_of: np.ndarray,
                  bwd: list[tuple[int, int, int]]) -> tuple[np.ndarray, list[int]] | None:
    """Labels and step starts of the passes the gradients' sets anchor (in order); None where a
    backward frees nothing its forward saved."""
    n = len(trace)
    labels = np.zeros(n, np.int8)
    starts = [0]
    prev_end = -1
    spans = []
    for g0, g1, _ in bwd:
        # what the forward saved: made since the previous backward, freed in this one
        lo, hi = np.searchsorted(allocs, prev_end, "right"), np.searchsorted(allocs, g0, "left")
        made = allocs[lo:hi]
        saved = made[(free_of[made] >= g0) & (free_of[made] <= g1)]
        if not len(saved):
            return None
        f0, top = int(saved.min()), int(saved.max())
        b1 = max(g1, int(free_of[saved].max()))
        spans.append((f0, top, b1))
        prev_end = b1
    nexts = [f0 for f0, _, _ in spans[1:]] + [n]
    for k, ((f0, top, b1), nxt) in enumerate(zip(spans, nexts)):
        if k:
            starts.append(f0)
        labels[f0:top + 1] = P["forward"]
        labels[top + 1:b1 + 1] = P["backward"]
        tail = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, nxt, "left")]
        if len(tail) and sized_like_an_optimizer(params, np.zeros(0, np.int64), trace.size[tail]):
            # the optimizer: to the last parameter-sized block it makes there, or frees of those; what
            # follows before the next forward (a target network's no-grad pass, logging) is not known
            # from its first parameter-sized block: what runs between backward and it allocating other
            # sizes (clipping's norms, a loop's logging) is not known (h7_capturable_adam, h11_tbptt_lstm)
            sized = tail[np.isin(trace.size[tail], params)]
            # the next step's batch, made after the update and freed inside that step, is not its work
            work = sized[~held_over(free_of[sized], nxt, n)]
            label_update(labels, trace, allocs, free_of, params, work if len(work) else sized, top, b1, nxt)
    return labels, starts
