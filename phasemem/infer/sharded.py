"""Training passes of a sharded model (FSDP), found from the loss, where the mountains show none.

FSDP gathers each block's parameters before its forward and frees them after, and frees what a block
saved for backward in bursts, with the gathered parameters; its gradients are a few flat blocks made at
the end of backward. So nothing rises through forward and falls through backward as ``passes.py``
expects, and the gradients' sets (``anchored.py``) come in too few sizes to tell. The loss still shows:
cross-entropy's fingerprint (``loss.fingerprints``) is each backward's first event, and what the
forward made before it and backward frees after it is what it saved (a checkpointed block's input, the
root's gathered parameters), however it is freed.
"""
from __future__ import annotations

import numpy as np

from ..timeline import Timeline
from ..trace import A, Trace
from ..vocab import P
from .bursts import burst_freed
from .gradients import parameter_sizes, sized_like_an_optimizer
from .loss import fingerprints
from .passes import MIN_LIFE, MIN_SAVED, backward_end


def sharded_passes(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]] | None:
    """Labels and step starts with one pass a cross-entropy fingerprint, each saving MIN_SAVED blocks
    or more for its backward, which ends where its seed (the fingerprint's scalar) is freed: autograd
    drops it when the backward is done (the marked end of every backward in fsdp2_plain,
    fsdp2_instrument, heldout4_gpt_fsdp2_bf16, gpt_foreach, llama_hf, h13_multiscale_seg). Then the
    optimizer, where what follows allocates the parameters' sizes. None where fewer than two such
    passes are found."""
    n = len(trace)
    loss_at, bwd_at = fingerprints(trace, tl)
    if len(bwd_at) < 2:
        return None
    allocs, free_of = np.flatnonzero(trace.action == A["alloc"]), tl.freed_at
    act_a, act_f, act_p = _activations(trace, tl)
    spans, prev = [], -1
    for j, (i, k) in enumerate(zip(loss_at.tolist(), bwd_at.tolist())):
        nk = int(bwd_at[j + 1]) if j + 1 < len(bwd_at) else n
        made = allocs[np.searchsorted(allocs, prev, "right"):np.searchsorted(allocs, k, "left")]
        saved = made[(free_of[made] > k) & (free_of[made] < nk)]
        if len(saved) < MIN_SAVED:
            return None
        f0 = int(saved.min())
        b1 = int(free_of[k]) if k < free_of[k] < nk else backward_end(np.sort(free_of[saved]), k - 1, act_a, act_f, act_p, k - f0)
        spans.append((f0, i, k, b1))
        prev = b1
    labels = np.zeros(n, np.int8)
    params = parameter_sizes(tl)
    nexts = [s[0] for s in spans[1:]] + [n]
    for (f0, i, k, b1), nxt in zip(spans, nexts):
        labels[f0:i] = P["forward"]
        labels[i:k] = P["loss"]
        labels[k:b1 + 1] = P["backward"]
        _update(trace, allocs, free_of, params, labels, b1, nxt)
    return labels, [0] + [s[0] for s in spans[1:]]


def _update(trace: Trace, allocs: np.ndarray, free_of: np.ndarray, params: np.ndarray, labels: np.ndarray,
            b1: int, nxt: int) -> None:
    """The optimizer after a backward (ending at ``b1``), where it allocates the parameters' sizes: from
    its first such block to the last, or that block's free (as ``anchored.py``)."""
    tail = allocs[np.searchsorted(allocs, b1, "right"):np.searchsorted(allocs, nxt, "left")]
    if not (len(tail) and sized_like_an_optimizer(params, np.zeros(0, np.int64), trace.size[tail])):
        return
    work = tail[np.isin(trace.size[tail], params)]
    fr = free_of[work][free_of[work] < nxt]
    labels[int(work.min()):max(int(work.max()), int(fr.max()) if len(fr) else 0) + 1] = P["optimizer"]


def _activations(trace: Trace, tl: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Alloc and free events of the blocks that live MIN_LIFE events or more, not freed in a burst (in
    alloc order), and which of them have a parameter's size: what ``passes.backward_end`` reads as a
    checkpointed block's recompute."""
    life = tl.lifetimes
    born = life.paired
    a, f = life.alloc_event[born], life.free_event[born]
    act = (f - a >= MIN_LIFE) & ~burst_freed(trace)[f]
    return a[act], f[act], np.isin(life.size[born][act], parameter_sizes(tl))
