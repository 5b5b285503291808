"""Training passes of a sharded model (FSDP), found from the loss, where the mountains show none: what
forward made before cross-entropy's fingerprint and backward frees after it is what it saved (why
the mountains and the gradients' sets fail there: docs/accuracy.md, "Passes the mountains miss")."""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..timeline import Timeline
from .bursts import burst_freed
from .gradients import makes_gradients, parameter_sizes, sized_like_an_optimizer
from .loss import fingerprints
from .passes import MIN_SAVED
from .updates import update_end


def sharded_passes(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]] | None:
    """Labels and step starts with one pass a cross-entropy fingerprint, each saving MIN_SAVED blocks or
    more for its backward (fewer where that backward makes gradients), which ends where its seed is freed;
    then the optimizer. None where fewer than two such passes are found (the traces behind each case:
    docs/accuracy.md)."""
    n = len(trace)
    loss_at, bwd_at = fingerprints(trace, tl)
    if len(bwd_at) < 2:
        return None
    allocs, free_of = np.flatnonzero(trace.action == A["alloc"]), tl.freed_at
    params = parameter_sizes(tl)
    spans, prev = [], -1
    for j, (i, k) in enumerate(zip(loss_at.tolist(), bwd_at.tolist())):
        nk = int(bwd_at[j + 1]) if j + 1 < len(bwd_at) else n
        b1 = int(free_of[k])
        made = allocs[np.searchsorted(allocs, prev, "right"):np.searchsorted(allocs, k, "left")]
        saved = made[(free_of[made] > k) & (free_of[made] <= b1)]
        if not k < b1 < nk:
            return None
        if len(saved) < MIN_SAVED and not makes_gradients(trace, allocs, params, k, b1):
            return None
        # nothing saved on the device (saved_tensors_hooks to the host): the forward starts after the
        # previous step's update, placed below
        spans.append((int(saved.min()) if len(saved) else -1, i, k, b1))
        prev = b1
    labels = np.zeros(n, np.int8)
    nexts = [s[0] if s[0] >= 0 else s[1] for s in spans[1:]] + [n]
    starts = []
    for (f0, i, k, b1), nxt in zip(spans, nexts):
        if f0 < 0:
            named = np.flatnonzero(labels[:i] != P["other"])
            f0 = int(allocs[np.searchsorted(allocs, named[-1] if len(named) else -1, "right")])
        starts.append(_forward_before(trace, allocs, params, labels, f0))
        labels[starts[-1]:i] = P["forward"]
        labels[i:k] = P["loss"]
        labels[k:b1 + 1] = P["backward"]
        _update(trace, allocs, free_of, params, labels, b1, nxt)
    return labels, [0] + starts[1:]


def _forward_before(trace: Trace, allocs: np.ndarray, params: np.ndarray, labels: np.ndarray, f0: int) -> int:
    """Where a forward whose first saved block is made at ``f0`` began: earlier, where MIN_SAVED blocks
    or more, none of a parameter's size, are made after the last phase read before it (a frozen
    backbone's no-grad forward, which saves nothing: h10_linear_probe); else ``f0``. Clipping's
    scalars and an optimizer's blocks before a forward have the parameters' sizes (fsdp2_plain)."""
    named = np.flatnonzero(labels[:f0] != P["other"])
    made = allocs[np.searchsorted(allocs, named[-1] if len(named) else -1, "right"):np.searchsorted(allocs, f0, "left")]
    sized = np.flatnonzero(np.isin(trace.size[made], params))
    made = made[sized[-1] + 1:] if len(sized) else made
    return int(made[0]) if len(made) >= MIN_SAVED else f0


def _update(trace: Trace, allocs: np.ndarray, free_of: np.ndarray, params: np.ndarray, labels: np.ndarray,
            b1: int, nxt: int) -> None:
    """The optimizer after a backward (ending at ``b1``), where it allocates the parameters' sizes: from
    its first such block to the last, or that block's free (as ``anchored.py``)."""
    tail = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, nxt, "left")]
    if not (len(tail) and sized_like_an_optimizer(params, np.zeros(0, np.int64), trace.size[tail])):
        return
    work = tail[np.isin(trace.size[tail], params)]
    work = work[work <= update_end(trace, tail, params, int(work.min()), burst_freed(trace))]
    fr = free_of[work][free_of[work] < nxt]
    labels[int(work.min()):max(int(work.max()), int(fr.max()) if len(fr) else 0) + 1] = P["optimizer"]
