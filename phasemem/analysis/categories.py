"""What each allocated byte is: parameter, gradient, optimizer state, activation, temporary, input.

Known from lifetimes and phases alone, so it works on the autograd thread's frameless events (each
category's rule: docs/categories.md).
"""
from __future__ import annotations

import numpy as np

from ..vocab import CATEGORIES, C, P
from .before_recording import Reading, name_before
from .facts import Context
from .infer.frames import weight_moves, weight_sources
from .inputs import batch_blocks
from .spans import run_of_events

__all__ = ["CATEGORIES", "C", "Reading", "classify"]  # the vocabulary lives in vocab.py


def classify(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """Category codes for the pre-existing allocations and for the trace's own, in Lifetimes order."""
    pre_cat, cat, _ = classify_with_readings(ctx)
    return pre_cat, cat


def classify_with_readings(ctx: Context) -> tuple[np.ndarray, np.ndarray, list[Reading]]:
    """classify's codes, and what the rules for blocks made before the recording named (before_recording)."""
    pre_cat, workspace = _preexisting(ctx)
    cat = _own(ctx)
    # Gradient-sized blocks from before recording are optimizer state only if the optimizer did not
    # make its state in the trace: where it did (at least STATE_MADE of the gradients' bytes), they
    # are a copy of the weights the optimizer does not own (h5_gpt_varlen_ema's EMA weights).
    state = pre_cat == C["optimizer_state"]
    if state.any():
        grads = int(_gradient_sizes(ctx).sum())
        # State stays for good, made before the last step: what a misplaced optimizer phase keeps for
        # a while, or the last step's gradients it holds to the end, is not it (heldout_embbag_adagrad
        # without frames: 217 MB freed later, and the embedding's last 207 MB gradient).
        made = (cat == C["optimizer_state"]) & (ctx.free >= ctx.n) & (ctx.step_at_alloc < len(ctx.seg.steps) - 1)
        if grads and int(ctx.size[made].sum()) >= STATE_MADE * grads:
            pre_cat[state] = C["other"]
    readings = name_before(ctx, pre_cat, cat, workspace, _gradient_sizes(ctx), shows_training(ctx))
    return pre_cat, cat, readings


def _preexisting(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """Category codes of the blocks alive before the trace began, from their sizes and where they die;
    and which of them a math library's workspace getter made."""
    life = ctx.timeline.lifetimes
    n = ctx.n
    pre = life.preexisting
    pre_free = life.free_event[pre]
    freed = pre_free < n
    # A math library's workspace (its stack says so) is no weight, whatever its size.
    workspace = ~freed & np.isin(life.addr[pre], ctx.trace.live_workspaces)
    pre_cat = _preexisting_alive(ctx, life.size[pre], ~freed & ~workspace)
    pre_cat[workspace] = C["other"]
    # A pre-existing block freed during the trace was not a parameter: read it by where it dies.
    fphase = np.where(freed, ctx.seg.labels[np.minimum(pre_free, n - 1)], -1)
    pre_cat[freed] = C["other"]
    pre_cat[freed & (fphase == P["zero_grad"])] = C["gradient"]
    pre_cat[freed & (fphase == P["backward"])] = C["activation"]
    return pre_cat, workspace


def _own(ctx: Context) -> np.ndarray:
    """Category codes of the trace's own allocations, from the phase that made them and their lifetimes."""
    n = ctx.n
    a, f = ctx.alloc, ctx.free
    pa = ctx.phase_at_alloc
    cat = np.full(len(a), C["other"], np.int8)
    # Run index of each event: alloc and free in the same run = a temporary of that run.
    run_of = run_of_events(ctx.run_first, n)
    same_run = (f < n) & (run_of[a] == run_of[np.minimum(f, n - 1)])
    step_end = np.array([s[1] for s in ctx.seg.steps] + [n], dtype=np.int64)
    s_at = ctx.step_at_alloc
    end_of_step = np.where(s_at >= 0, step_end[np.maximum(s_at, 0)], n)
    run_end = ctx.run_last[np.maximum(run_of[a], 0)]

    cat[same_run] = C["temporary"]
    fwd = (pa == P["forward"]) | (pa == P["loss"])
    # Whatever forward makes and does not free itself is an activation (or, in inference, the output),
    # except what the first step makes and nobody ever frees: a lazily made cuBLAS workspace, a cache.
    cat[fwd & ~same_run] = C["activation"]
    cat[fwd & (f >= n) & (s_at == 0) & (len(ctx.seg.steps) > 1)] = C["other"]
    cat[(pa == P["backward"]) & (f > run_end)] = C["other"]
    cat[ctx.gradients_by_step[0]] = C["gradient"]  # every step's
    cat[(pa == P["optimizer"]) & (f >= end_of_step)] = C["optimizer_state"]
    other = (pa == P["other"]) & ~same_run
    fwd_starts = ctx.run_first[ctx.run_phase == P["forward"]]
    cat[batch_blocks(ctx, other, fwd_starts)] = C["input"]
    # Made before the first step's forward and kept to the end: weights created after recording began.
    # Without a forward found there is no "before": what a bare function computes and the script
    # keeps is no weight (wild/silmont_mem_snapshot: an attention output and its 4-byte sum were).
    first_fwd = fwd_starts[0] if len(fwd_starts) else -1
    made = other & (f >= n) & (a < first_fwd) & (s_at <= 0)
    if not shows_training(ctx):
        # in inference nothing pairs them with a gradient: only a stack that makes weights says so
        # (h12_static_kv_decode: an 80 MiB KV cache made by the script was "parameters")
        made &= weight_sources(ctx.trace)[ctx.trace.stack[a]]
    cat[made] = C["parameter"]
    # Weights the stack says a module placed on the device (model.to(), load_state_dict), in any
    # phase: offloading moves each block's weights in just before it runs and out after, inside
    # forward (h13_layer_offload_infer, marked: the blocks' weights were forward's temporaries).
    cat[weight_moves(ctx.trace)[a]] = C["parameter"]
    # ... but never a math library's workspace, made by the first matmul wherever it runs
    cat[(cat == C["parameter"]) & ctx.made_by_workspace_getter(a)] = C["other"]
    return cat


#: Share of the gradients' bytes that optimizer state made during the trace must reach for the
#: gradient-sized blocks from before recording not to be called optimizer state (Adam makes 2.0,
#: momentum SGD 1.0, Adafactor's factored state much less: heldout_t5_adafactor).
STATE_MADE = 0.5


def _gradient_sizes(ctx: Context) -> np.ndarray:
    """The sizes of the gradients of the step with the most gradient bytes (a trace that wrapped can
    start inside a backward, so not simply the first step's). Summing the steps' sets instead (for
    optimizers that take turns) counted noise twice where phases were inferred without frames
    (hf without frames: 299 MB of 'parameters' for 182); the trace's optimizer state names the
    other turns' parameters (_sizes_from_state)."""
    idx, bounds = ctx.gradients_by_step
    if len(bounds) < 2:
        return ctx.size[idx[:0]]
    total = np.concatenate([[0], np.cumsum(ctx.size[idx], dtype=np.int64)])[bounds]
    best = int(np.argmax(np.diff(total)))  # the first step with the most, as max() picks
    return ctx.size[idx[bounds[best]:bounds[best + 1]]]


def _preexisting_alive(ctx: Context, sizes: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """Every parameter gets a gradient of exactly its size, so the pre-existing blocks that pair
    off with the gradients' sizes are the parameters. Of the rest, blocks of a gradient's size are
    optimizer state made before recording (Adam's pair per parameter); others (cuBLAS workspaces,
    the input batch, buffers) are 'other'. Without gradients (inference) all are parameters."""
    cat = np.full(len(sizes), C["parameter"], np.int8)
    gsizes = _gradient_sizes(ctx)
    if not len(gsizes):
        # Inference: the weights. A trace that trains but shows no gradient (a CUDA graph's pool
        # makes them, h8_compile_reduce_overhead: 384 MiB of weights beside 768 MiB of AdamW
        # state, all from before recording) cannot tell weights from state: neither is claimed.
        if shows_training(ctx):
            cat[:] = C["other"]
        else:
            cat[_one_block_pool(sizes, alive)] = C["other"]
        return cat
    gsizes = _sizes_from_state(ctx, gsizes)
    idx = np.flatnonzero(alive)
    # Gradients in flat buffers (FSDP2, contiguous gradient buffers) pair with no parameter: then
    # size says nothing about which block is which, and the blocks stay parameters.
    paired = np.isin(gsizes, sizes[idx])
    if int(gsizes[paired].sum()) < int(gsizes.sum()) // 2:
        return cat
    order = idx[np.argsort(sizes[idx], kind="stable")]
    srt = sizes[order]
    # rank of each block among the blocks of its size
    starts = np.searchsorted(srt, srt, "left")
    rank = np.arange(len(srt)) - starts
    uniq, counts = np.unique(gsizes, return_counts=True)
    pos = np.searchsorted(uniq, srt)
    known = (pos < len(uniq)) & (uniq[np.minimum(pos, len(uniq) - 1)] == srt)
    n_grads = np.where(known, counts[np.minimum(pos, len(uniq) - 1)], 0)
    # State made before recording comes in a fixed number per parameter (Adam 2, momentum SGD 1):
    # the typical surplus per gradient-sized block. Blocks beyond that (a buffer that happens to
    # have a parameter's size) are not state.
    per_size = np.bincount(np.searchsorted(uniq, srt[known]), minlength=len(uniq)) if known.any() else np.zeros(0)
    surplus = (per_size - counts) / counts if len(per_size) else np.zeros(0)
    k = int(round(float(np.median(surplus)))) if len(surplus) else 0
    state = known & (rank >= n_grads) & (rank < n_grads * (1 + max(k, 0)))
    cat[order] = np.where(rank < n_grads, C["parameter"], np.where(state, C["optimizer_state"], C["other"]))
    return cat


#: In inference, a block from before recording that holds more than POOL_SHARE of what was alive
#: before recording and to the end, and is POOL_RATIO times the next largest, is no weight the trace
#: can vouch for: a serving loop's preallocated KV cache or pool is one such block (h9_paged_kv_inference:
#: 2 GiB beside 257 MiB of bf16 weights, called "parameters 2.31 GiB" before); an embedding that big
#: beside the rest of its model is counted 'other' too (the trace cannot tell them apart). The pools
#: seen are 64× (h9) and ~900× (wild/octreenca_mysnap's 20 MB seed) the next block; a two-layer MLP's
#: weights are 4× apart (h13_embeddings_cat_growth: 32 MiB beside 8 MiB, both weights).
POOL_SHARE = 0.5
POOL_RATIO = 16


def _one_block_pool(sizes: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """Mask of the pre-existing block that dominates an inference trace's weights (see POOL_SHARE)."""
    out = np.zeros(len(sizes), bool)
    idx = np.flatnonzero(alive)
    if len(idx) < 2:
        return out
    order = idx[np.argsort(sizes[idx])[::-1]]
    top, nxt = int(sizes[order[0]]), int(sizes[order[1]])
    if top > POOL_SHARE * int(sizes[idx].sum()) and top >= POOL_RATIO * nxt:
        out[order[0]] = True
    return out


#: The trace's optimizer state names the parameters' sizes when, for at least this share of the
#: bytes of the gradient sizes that state has too, its blocks of that size are a whole number of
#: parameters' worth (a multiple of the state per parameter, Adam 2, momentum SGD 1), at least the
#: gradients', and the sizes it names hold at least this share of the gradients' bytes. Set by h6_sparse_two_opt: a sparse embedding's gradient (32 MiB of
#: values) has no parameter's size, its 488 MiB weight no gradient's, and SparseAdam's two 488 MiB
#: state buffers say what it is; Adafactor's factored state (heldout_t5_adafactor) is not per size.
STATE_PER_GRADIENT = 0.9
#: Sizes holding less than this share of the gradients' bytes say nothing of the state per parameter.
STATE_SIZE_SHARE = 0.01


def shows_training(ctx: Context) -> bool:
    """Whether the trace shows training: a backward or an optimizer step (one that made no event too)."""
    labels = ctx.seg.labels
    return bool((labels == P["backward"]).any() or (labels == P["optimizer"]).any()
                or any(iv.phase == "optimizer" for iv in ctx.seg.intervals))


def _sizes_from_state(ctx: Context, gsizes: np.ndarray) -> np.ndarray:
    """The sizes (a multiset) the pre-existing parameters pair off with: the gradients', and where the
    trace made optimizer state that comes in a fixed number per gradient, the sizes that state names
    beyond them (the weight of a sparse gradient has state of its size, not a gradient)."""
    steps = ctx.seg.steps
    if ctx.seg.inferred_by == "lifetimes":
        # phases from lifetimes alone put other blocks kept for good in the optimizer (h5_two_losses
        # without frames: 68 MB more 'parameters' than the model has): only the gradients' sizes
        return gsizes
    # made by an optimizer run and kept for good, before the last step where there are several (as
    # in classify: what the last step leaves may be its own)
    made = (ctx.phase_at_alloc == P["optimizer"]) & (ctx.free >= ctx.n)
    if len(steps) > 1:
        made &= ctx.alloc < steps[-1][0]
    ssizes = ctx.size[made]
    if not len(ssizes):
        return gsizes
    gu, gc = np.unique(gsizes, return_counts=True)
    su, sc = np.unique(ssizes, return_counts=True)
    pos = np.searchsorted(su, gu)
    hit = (pos < len(su)) & (su[np.minimum(pos, len(su) - 1)] == gu)
    per = np.where(hit, sc[np.minimum(pos, len(su) - 1)], 0) / gc
    # state per parameter: the least whole number seen among the sizes that hold gradient bytes
    # (where optimizers take turns over parameters of one size their state counts add up:
    # h5_wgan_gp's critic and generator share sizes, 4 a size; a 4-byte bias beside a scalar's
    # gradient, h6_ppo, says 1 and holds nothing)
    weighty = gu * gc >= STATE_SIZE_SHARE * float((gu * gc).sum())
    whole = per[hit & weighty & (per >= 1) & (per == np.round(per))]
    if not len(whole):
        return gsizes
    k = int(whole.min())
    # a size's state names at least its gradients' parameters, and a whole number of them: more where
    # optimizers take turns and another step trained others of that size (h7_sac: the actor's 4 MiB
    # weight has the critics' size; the busiest step's gradients are the critics')
    sc_hit = np.where(hit, sc[np.minimum(pos, len(su) - 1)], 0)
    consistent = hit & (sc_hit % k == 0) & (sc_hit >= k * gc)
    implied = np.repeat(su, sc // k)
    # consistent where gradient and state sizes meet, and naming at least the gradients' bytes (a
    # factored state of full size only for the 1-D parameters names far fewer)
    if (gu[consistent] * gc[consistent]).sum() < STATE_PER_GRADIENT * (gu[hit] * gc[hit]).sum() or (
            int(implied.sum()) < STATE_PER_GRADIENT * int(gsizes.sum())):
        return gsizes
    # Only added to the gradients' sizes: a gradient with no state of its size still names its
    # weight when both are one flat buffer (cuDNN's RNN weights, heldout3_gru_seq2seq and
    # heldout_lstm_rmsprop: Adam's state is per view of it).
    have = np.zeros(len(su), np.int64)
    gpos = np.searchsorted(gu, su)
    ghit = (gpos < len(gu)) & (gu[np.minimum(gpos, len(gu) - 1)] == su)
    have[ghit] = gc[gpos[ghit]]
    extra = np.repeat(su, np.maximum(sc // k - have, 0))
    return np.concatenate([gsizes, extra])

