"""Which allocations are a step's input (the batch): made outside every phase and read by the forward
that follows, for categories.py."""
from __future__ import annotations

import numpy as np

from ..vocab import P
from .facts import Context
from .infer.frames import copies


def batch_blocks(ctx: Context, other: np.ndarray, fwd_starts: np.ndarray) -> np.ndarray:
    """Which of the trace's allocations (``other``: made outside every phase, not freed in its own
    run) are the batch a forward reads."""
    # The batch: made outside every phase before a pass's first forward, alive when that forward
    # begins, and gone once a later step's batch replaces it (only the last step's may outlive the
    # trace). Made between two forward runs of one pass it is the loss or a head outside the model
    # (h5_two_losses' cross-entropy); kept for good from an earlier step it is state no phase was
    # found for (a hand-written optimizer's, h5_vae_handadam): neither is an input.
    out = np.zeros(len(ctx.alloc), bool)
    cand = np.flatnonzero(other)  # only these can be a batch: every test below runs on them alone
    if not len(fwd_starts) or not len(cand):
        return out
    a, f, n = ctx.alloc[cand], ctx.free[cand], ctx.n
    nxt = np.searchsorted(fwd_starts, a)
    has_next = nxt < len(fwd_starts)
    used = has_next & (f > fwd_starts[np.minimum(nxt, len(fwd_starts) - 1)])
    # A new pass begins: no forward before it, or a backward or an optimizer since the last one
    # (the batch may be copied at the end of the step before, as inferred steps often place it).
    trained = np.sort(ctx.run_first[np.isin(ctx.run_phase, [P["backward"], P["optimizer"]])])
    prev_fwd = fwd_starts[np.maximum(nxt - 1, 0)]
    last_trained = np.searchsorted(trained, a) - 1
    since = ((last_trained >= 0) & (trained[np.maximum(last_trained, 0)] > prev_fwd) if len(trained)
             else np.zeros(len(a), bool))
    # ... or the forward it feeds is its step's first (marked inference steps: steps begin where a
    # forward does, so the next batch is made at the end of the step before)
    fwd_step = ctx.run_step[ctx.run_phase == P["forward"]]
    opens_step = np.concatenate([[True], fwd_step[1:] != fwd_step[:-1]])
    new_step = has_next & opens_step[np.minimum(nxt, len(fwd_starts) - 1)]
    new_pass = (nxt == 0) | since | new_step | _pass_over(ctx, fwd_starts, nxt, a, used)
    # only the batch the last step's forward reads may be held to the end
    last_step = has_next & (fwd_step[np.minimum(nxt, len(fwd_starts) - 1)] >= fwd_step.max())
    batch = used & new_pass & ((f < n) | last_step)
    # A batch is replaced by a later step's: a block that the forwards of more than BATCH_STEPS steps
    # read is no batch (a serving engine's KV block pool, made at start-up and read by every engine
    # iteration, h16_serve_paged: 768 MiB of "inputs" over 137 marked steps).
    firsts = fwd_starts[opens_step]
    read_by = np.searchsorted(firsts, np.minimum(f, n), "left") - np.searchsorted(firsts, a, "left")
    batch &= read_by <= BATCH_STEPS
    # Forward only (inference), many calls of the model make one step: what the loop builds before
    # calling it (a KV cache, h5_gpt_decode_kv) is not told from the batch by when it is made.
    # There the batch is what C++ frames show copied to the device before a call (h5_vit_infer_bf16's
    # three batches); without C++ frames, what one call alone reads (an evaluation loop's
    # batches: heldout2_convnext_eval), not what many do (the cache, and the prompt, of 48 calls).
    # One forward and no backward is a training step cut short (oom_base: out of memory in the
    # loss), whose batch keeps the rule above.
    if not (ctx.seg.labels == P["backward"]).any() and len(fwd_starts) > len(ctx.seg.steps):
        copied, cpp = copies(ctx.trace)
        calls = np.searchsorted(fwd_starts, np.minimum(f, n), "left") - nxt  # forward starts it spans
        batch = used & (copied[a] if cpp else calls == 1)
    out[cand] = batch
    return out


#: The most steps whose forwards one batch may be read by: its own, and the next where a loader copies
#: the next batch ahead (the one it replaces is freed after the copy).
BATCH_STEPS = 2


#: The forward before a block is over when less than this share of the bytes it allocated is still
#: alive: a no_grad evaluation forward frees as it goes (gpt_train_eval's eval, then the next training
#: batch), while a forward whose backward is still to come keeps its activations (h5_two_losses: the
#: loss computed between the model and a second head is no batch).
PASS_OVER = 0.5


def _pass_over(ctx: Context, fwd_starts: np.ndarray, nxt: np.ndarray, a: np.ndarray, asked: np.ndarray) -> np.ndarray:
    """Per allocation asked of (``a``, ``nxt``, ``asked``: the candidates' events, next forward runs, and
    which to answer): is the forward run before it over (PASS_OVER)?"""
    out = np.zeros(len(a), bool)
    q = np.flatnonzero(asked & (nxt > 0))
    fwd = (ctx.phase_at_alloc == P["forward"]) | (ctx.phase_at_alloc == P["loss"])
    if not len(q) or not fwd.any():
        return out
    n = ctx.n
    k = np.searchsorted(fwd_starts, ctx.alloc[fwd], "right") - 1  # the forward run each was made in (or after)
    key = k.astype(np.int64) * (n + 1) + ctx.free[fwd]
    order = np.argsort(key, kind="stable")
    key, cum = key[order], np.concatenate([[0], np.cumsum(ctx.size[fwd][order])])
    total = np.bincount(k, weights=ctx.size[fwd], minlength=len(fwd_starts)).astype(np.int64)
    run = (nxt[q] - 1).astype(np.int64)
    lo = np.searchsorted(key, run * (n + 1), "left")
    hi = np.searchsorted(key, run * (n + 1) + a[q], "right")
    freed = cum[hi] - cum[lo]
    out[q] = (total[run] > 0) & (total[run] - freed < PASS_OVER * total[run])
    return out
