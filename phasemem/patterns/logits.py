"""The LM head's logits block, the softmax spike on top of it, and its release where backward starts.

Shape, not stack frames: a language model's forward ends with one allocation far larger than any
activation before it (batch × seq × vocab), usually followed by copies of the same size (an fp32
upcast, log-softmax). A network without an LM head (CNN, MLP) has its largest allocations early
or evenly spread, so it never satisfies both tests below.
"""
from __future__ import annotations

import numpy as np

from ..facts import Context
from ..infer.frames import LINEAR, NOT_LINEAR, innermost_function, made_by_linear, outside_modules
from ..model import Pattern
from ..units import format_bytes
from ..vocab import P

#: An allocation is vocabulary-sized when at least this share of the largest one in the forward
#: (bf16 logits next to their fp32 copy are half of it).
VOCAB_SHARE = 0.45
#: The logits must be at least this many times larger than every allocation in the network's
#: body (the first LATE share of the forward's allocations) and come after that body.
ABOVE_ACTIVATIONS = 1.5
LATE = 0.5
#: A loss consumes the logits when backward's gradient of them, vocabulary-sized, is among backward's
#: first LOSS_GRAD_WITHIN allocations above TINY bytes (the loss's seed and scalars come first). A
#: CNN's classifier output is small, so its backward starts small (heldout2_convnext_eval without
#: frames), and a forward with no backward (inference, ../shared/wild's no_grad benchmarks, a
#: cellular automaton) consumes nothing: neither may be called logits.
LOSS_GRAD_WITHIN = 6
TINY = 512
#: ... and what backward allocates before that gradient is small beside it (the loss's seed, a
#: per-token mask; Mixtral's router losses: 32 KiB before 32 MiB): below this share of it. A
#: recommender's backward starts with its MLP's gradients, 2 MiB before 4 MiB
#: (heldout_embbag_adagrad: its last dense activation was taken for logits).
LOSS_GRAD_FIRST = 0.125
#: The logits' gradient has their size, or twice or half of it (bf16 logits, an fp32 gradient), to
#: within this share (block sizes are rounded to 512 bytes).
GRAD_SIZE_TOLERANCE = 0.01


def detect(ctx: Context, step: int) -> list[Pattern]:
    out: list[Pattern] = []
    for last, bwd, idx, opening in ctx.memo("logits_regions", lambda: _regions(ctx)).get(step, ()):
        sizes = ctx.size[idx]
        big = sizes.max()
        vocab = idx[sizes >= VOCAB_SHARE * big]
        logits = _consumed(ctx, vocab, opening)
        vocab = vocab[ctx.alloc[vocab] >= ctx.alloc[logits]]  # what the loss made from them, not a workspace before
        made = int(ctx.memo("made_by_linear", lambda: made_by_linear(ctx.trace))[ctx.trace.stack[int(ctx.alloc[logits])]])
        noun = "vocabulary-sized" if made == LINEAR else "logits-sized"
        out.append(_logits(ctx, step, logits, vocab, big, last, made))
        spike = _spike(ctx, step, vocab, bwd, noun)
        if spike:
            out.append(spike)
        if bwd is not None:
            rel = _release(ctx, step, vocab, bwd, big, logits, noun)
            if rel:
                out.append(rel)
    return out


def _regions(ctx: Context) -> dict[int, list]:
    """Per step, the microbatches' regions whose forward-or-loss allocations end in logits by size and
    whose loss consumed them (last event, backward run, those allocations, the backward run's opening):
    every region of every step tested at once."""
    first, last, bwd, step = all_microbatches(ctx)
    lo, hi = ctx.alloc.searchsorted(first), ctx.alloc.searchsorted(last + 1)
    region = np.repeat(np.arange(len(first)), hi - lo)
    idx = np.arange(len(region)) - np.repeat(np.cumsum(hi - lo) - (hi - lo) - lo, hi - lo)
    pa = ctx.phase_at_alloc[idx]
    keep = (pa == P["forward"]) | (pa == P["loss"])  # np.isin costs 10x this
    idx, region = idx[keep], region[keep]
    pos, count = _positions(region, len(first))
    # The first step's workspaces (made by the first matmul, never freed) are no tensors; they
    # come early. Logits a script still holds at the end are late (magma27_cs336 keeps them).
    keep = (ctx.free[idx] < ctx.n) | ~(pos < LATE * count[region]) | (step[region] != 0)
    idx, region = idx[keep], region[keep]
    pos, count = _positions(region, len(first))
    ok = count >= 4
    at = np.flatnonzero(np.concatenate([[True], region[1:] != region[:-1]])) if len(region) else region
    sizes = ctx.size[idx]
    big = np.zeros(len(first), sizes.dtype)
    big[region[at]] = np.maximum.reduceat(sizes, at) if len(at) else big[:0]
    is_vocab = sizes >= VOCAB_SHARE * big[region]
    k = np.full(len(first), len(region))
    k[region[at]] = np.minimum.reduceat(np.where(is_vocab, pos, len(region)), at) if len(at) else k[:0]
    # Compare with the body of the network (the first part of forward), not with what comes
    # right before the logits: that is often the LM head's own weight cast to bf16 (vocab × d);
    # and among the body's activations: a workspace made lazily by the first matmul (32 MiB
    # of cuBLAS's on Hopper) is never freed and says nothing about the network.
    in_body = (pos < np.maximum((LATE * count).astype(np.int64), 1)[region]) & (ctx.free[idx] < ctx.n)
    body = np.zeros(len(first), sizes.dtype)
    body[region[at]] = np.maximum.reduceat(np.where(in_body, sizes, 0), at) if len(at) else body[:0]
    start = np.zeros(len(first), np.int64)
    start[region[at]] = at
    vocab_k = sizes[np.minimum(start + k, max(len(sizes) - 1, 0))] if len(sizes) else big
    ok &= ~(k < LATE * count) & ~(body * ABOVE_ACTIVATIONS > vocab_k) & (bwd[:, 0] >= 0)
    pre = np.flatnonzero(ok)
    opening, bounds, consumed = losses_consuming(ctx, bwd[pre], VOCAB_SHARE * big[pre])
    out: dict[int, list] = {}
    for j, r in zip(np.flatnonzero(consumed).tolist(), pre[consumed].tolist()):
        out.setdefault(int(step[r]), []).append((int(last[r]), (int(bwd[r, 0]), int(bwd[r, 1])),
                                                 idx[start[r]:start[r] + count[r]], opening[bounds[j]:bounds[j + 1]]))
    return out


def losses_consuming(ctx: Context, bwd: np.ndarray, vocab_bytes: np.ndarray):
    """Evidence, for many regions at once, that a loss consumed a vocabulary-sized output (at least
    ``vocab_bytes``): its backward run (``bwd``: rows of first, last event) begins with a gradient of
    that size, among its first LOSS_GRAD_WITHIN allocations above TINY bytes (its opening), and what
    comes before that gradient is small beside it. Returns the openings' sizes one after another,
    each region's bounds in them, and the evidence per region."""
    lo, hi = ctx.alloc.searchsorted(bwd[:, 0]), ctx.alloc.searchsorted(bwd[:, 1] + 1)
    reg = np.repeat(np.arange(len(bwd)), hi - lo)
    idx = np.arange(len(reg)) - np.repeat(np.cumsum(hi - lo) - (hi - lo) - lo, hi - lo)
    size = ctx.size[idx]
    above = size > TINY
    c = np.concatenate([[0], np.cumsum(above)])
    seen = c[1:] - np.repeat(c[np.cumsum(hi - lo) - (hi - lo)], hi - lo)
    keep = above & (seen <= LOSS_GRAD_WITHIN)  # seen: how many above TINY so far in its run, itself included
    size, reg, pos = size[keep], reg[keep], seen[keep] - 1
    bounds = np.searchsorted(reg, np.arange(len(bwd) + 1))
    hit = np.full(len(bwd), LOSS_GRAD_WITHIN)
    np.minimum.at(hit, reg[size >= vocab_bytes[reg]], pos[size >= vocab_bytes[reg]])
    found = hit < LOSS_GRAD_WITHIN
    at_hit = size[np.minimum(bounds[:-1] + hit, max(len(size) - 1, 0))] if len(size) else np.zeros(len(bwd), np.int64)
    small = np.ones(len(bwd), bool)  # what comes before the gradient is small beside it
    early = pos < hit[reg]
    np.logical_and.at(small, reg[early], size[early] < LOSS_GRAD_FIRST * at_hit[reg[early]])
    return size, bounds, found & small


def _positions(region: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each element's place within its region (the regions are runs in ``region``), and each region's length."""
    count = np.bincount(region, minlength=n)
    return np.arange(len(region)) - np.repeat(np.cumsum(count) - count, count), count


def all_microbatches(ctx: Context):
    """Every step's forward+loss regions at once: first and last event of each, the backward run that
    follows ((-1, -1) for none) and its step, by step then event. A region runs from a forward run to
    the step's first backward run after it and before the step's next forward run; a forward with no
    such backward (an inner forward, a nested call, or inference) still ends at the next forward."""
    n_steps, width = len(ctx.seg.steps), ctx.n + 1
    none = np.zeros(0, np.int64)
    in_steps = (ctx.run_step >= 0) & (ctx.run_step < n_steps)
    f = np.flatnonzero((ctx.run_phase == P["forward"]) & in_steps)
    f = f[np.lexsort((ctx.run_first[f], ctx.run_step[f]))]
    b = np.flatnonzero((ctx.run_phase == P["backward"]) & in_steps)
    b = b[np.lexsort((ctx.run_first[b], ctx.run_step[b]))]
    if not len(f):
        return none, none, none.reshape(0, 2), none
    step, f0, f1 = ctx.run_step[f], ctx.run_first[f], ctx.run_last[f]
    has_nxt = np.append(step[1:] == step[:-1], False)
    nxt = np.append(f0[1:], -1)
    j = np.searchsorted(ctx.run_step[b] * width + ctx.run_first[b], step * width + f1, "right")
    jc = np.minimum(j, max(len(b) - 1, 0))
    b0 = ctx.run_first[b][jc] if len(b) else np.zeros(len(f), np.int64)
    b1 = ctx.run_last[b][jc] if len(b) else np.zeros(len(f), np.int64)
    has_b = (j < len(b)) & (ctx.run_step[b][jc] == step if len(b) else False) & (~has_nxt | (b0 < nxt))
    # Forward with no backward before the next forward: an inner forward (a nested call)
    # or inference; the region still ends at the next forward.
    use = has_b | ~has_nxt | (nxt > f1 + 1)
    last = np.where(has_b, b0 - 1, np.where(has_nxt, nxt - 1, f1))
    bwd = np.where(has_b[:, None], np.stack([b0, b1], 1), -1)
    return f0[use], last[use], bwd[use], step[use]


def _logits(ctx: Context, step: int, logits: int, vocab: np.ndarray, big: int, region_last: int,
            made: int) -> Pattern:
    a, f, size = int(ctx.alloc[logits]), int(ctx.free[logits]), int(ctx.size[logits])
    s0, s1, _ = ctx.seg.steps[step]
    p = ctx.peak_in(s0, s1 - 1)
    # Every vocabulary-sized tensor alive at the step's peak: logits, their copies, their gradients.
    lo, hi = int(ctx.alloc.searchsorted(s0)), int(ctx.alloc.searchsorted(s1))  # the step's allocations
    sizes = ctx.size[lo:hi]
    live = (sizes >= VOCAB_SHARE * big) & (ctx.alloc[lo:hi] <= p) & (ctx.free[lo:hi] > p)
    vocab_bytes = int(sizes[live].sum())
    share = vocab_bytes / max(int(ctx.level[p]), 1)
    end = min(f, ctx.n - 1)
    # a library's workspace made in forward can be larger (cuDNN's LSTM: h11_tbptt_lstm)
    largest = "the largest tensor of the forward pass" if size >= big else "among the largest tensors of the forward pass"
    loose = bool(ctx.memo("outside_modules", lambda: outside_modules(ctx.trace))[ctx.trace.stack[a]])
    # Its place is the forward that made it, even when the loop keeps it into the next step.
    return Pattern(
        kind="logits", step=step, phase="forward", start_event=a, end_event=end,
        peak_event=ctx.peak_in(a, min(end, region_last)), bytes=size,
        explanation=(_loose(size, share, largest) if loose else
                     f"The LM head's output: one {format_bytes(size)} block of batch × sequence × vocabulary scores, "
                     f"{largest}. Vocabulary-sized tensors (logits, their softmax and "
                     f"gradients) hold {share:.0%} of this step's peak. To shrink it: compute the loss in chunks of "
                     f"the sequence (a fused or chunked cross-entropy), keep logits in bf16, or use a smaller "
                     f"micro-batch." if made == LINEAR else
                     _unnamed(size, share, largest,
                              innermost_function(ctx.trace, int(ctx.trace.stack[a])) if made == NOT_LINEAR else None)),
        details={"vocab_share_of_peak": round(share, 4), "vocab_bytes_at_peak": vocab_bytes,
                 "copies": int(len(vocab))},
        members=(int(logits),),
    )


def _consumed(ctx: Context, vocab: np.ndarray, sizes: np.ndarray) -> int:
    """The logits among the vocabulary-sized blocks: the first, unless its size is none of the
    logits' gradient's (the same, or 2x either way: bf16 logits and an fp32 gradient) while a later
    one's is. A library's workspace can be the first: cuDNN's LSTM makes a 124 MB one before the 82 MB
    logits (h11_tbptt_lstm, where it was "the LM head's output"). ``sizes``: the backward run's opening
    (losses_consuming), where that gradient is."""
    first = int(vocab[0])
    grad = sizes[sizes >= VOCAB_SHARE * int(ctx.size[vocab].max())]
    if not len(grad):
        return first
    g = float(grad[0])

    def fits(b):
        return any(abs(float(ctx.size[b]) - g * r) <= GRAD_SIZE_TOLERANCE * g * r for r in (0.5, 1.0, 2.0))

    if fits(first):
        return first
    later = [int(b) for b in vocab[1:] if fits(b)]
    return later[0] if later else first


def _unnamed(size: int, share: float, largest: str, op: str | None) -> str:
    """The logits' words where nothing shows a linear layer made them: an LM head's, or a dense
    predictor's per-pixel scores (h13_multiscale_seg), or unknown (no frames, a compiled graph)."""
    who = (f"made by {op}() inside the model, not by a linear layer (so not an LM head's): scores per output "
           f"position and class, e.g. a dense prediction's per-pixel classes" if op else
           "scores per output position and class (an LM head's batch × sequence × vocabulary, or a dense "
           "prediction's per-pixel classes; the trace does not show which layer made them)")
    return (f"The output the loss reads (the logits): one {format_bytes(size)} block, {largest}, {who}. "
            f"Tensors of its size (the logits, their softmax and gradients) hold {share:.0%} of this step's peak. "
            f"To shrink it: compute the loss in chunks (a fused or chunked cross-entropy), keep the logits in bf16, "
            f"or use a smaller micro-batch.")


def _loose(size: int, share: float, largest: str = "the largest tensor of the forward pass") -> str:
    """The logits' words where the stack shows them made outside any module: no model head's output."""
    return (f"The scores the loss reads, computed outside any module (no model head made them: e.g. a contrastive "
            f"loss's similarities over a batch or a queue): one {format_bytes(size)} block, {largest}. Tensors "
            f"of its size (the scores, their softmax and gradients) hold {share:.0%} of this step's peak. To shrink it: compute the loss in chunks, keep the scores in bf16, or use a smaller "
            f"batch.")


def _spike(ctx: Context, step: int, vocab: np.ndarray, bwd, noun: str) -> Pattern | None:
    bwd_first = bwd[0] if bwd is not None else ctx.n
    transient = vocab[ctx.free[vocab] < bwd_first]
    if not len(transient):
        return None
    start0 = int(ctx.alloc[vocab[0]])
    end = int(ctx.free[transient].max())
    p = ctx.peak_in(start0, end)
    if int(((ctx.alloc[vocab] <= p) & (ctx.free[vocab] > p)).sum()) < 2:
        return None  # one vocabulary tensor alone is the logits block, not a spike on it
    start = int(ctx.alloc[vocab[ctx.alloc[vocab] <= p]].max())
    height = int(ctx.level[p] - ctx.timeline.active_after[end])
    if height <= 0:
        return None
    r = int(ctx.run_first.searchsorted(p, "right")) - 1  # the phase run the spike's top is in
    sets = int(ctx.level[p]) >= int(ctx.level[ctx.run_first[r]:ctx.run_last[r] + 1].max())
    sets_text = " It sets the peak of the phase it is in." if sets else ""
    return Pattern(
        kind="softmax_spike", step=step, phase="forward", start_event=start, end_event=end, peak_event=p,
        bytes=height,
        explanation=(
            f"The spike at the top of forward: while the logits are alive, the loss makes another "
            f"{noun} tensor (an fp32 upcast or the log-softmax), so for a moment both exist, "
            f"{format_bytes(height)} above where memory settles.{sets_text} A fused or "
            f"chunked cross-entropy, or dropping the logits before the loss, removes it."
        ),
        details={"tensors": int(len(transient)) + 1, "sets_phase_peak": sets},
        members=tuple(transient.tolist()),
    )


def _release(ctx: Context, step: int, vocab: np.ndarray, bwd, big: int, logits: int, noun: str) -> Pattern | None:
    b0, b1 = bwd
    # Vocabulary-sized tensors that backward frees: the saved softmax, the logits unless the
    # caller still holds them, and the logits' gradient made at backward's start.
    alive = vocab[(ctx.free[vocab] >= b0) & (ctx.free[vocab] <= b1)]
    if not len(alive):
        return None
    end = int(ctx.free[alive].max())
    in_bwd = ctx.allocs_between(b0, end)
    grads = in_bwd[(ctx.size[in_bwd] >= VOCAB_SHARE * big) & (ctx.free[in_bwd] <= b1)]
    if len(grads):
        end = max(end, int(ctx.free[grads].max()))
    p = ctx.peak_in(b0, end)
    # the spike is how far memory rises at backward's start, the logits' gradient and what comes with it
    # (wild/bcrafton_cs336 under torch.compile: 135 MiB beside a 12 MiB gradient, "a 135 MiB spike" read
    # as the gradient's size)
    # logits a variable still holds are not among what backward frees (h11_tbptt_lstm keeps them to the
    # end of the step: "the logits ... are freed together" was untrue there)
    held = bool(ctx.free[logits] > end)
    before = int(ctx.before[b0])
    after = int(ctx.timeline.active_after[end])
    spike, cliff = int(ctx.level[p]) - before, int(ctx.level[p]) - after
    return Pattern(
        kind="logits_release", step=step, phase="backward", start_event=b0, end_event=end, peak_event=p,
        bytes=cliff,
        explanation=(
            f"Where backward starts at the loss: the gradient of the logits is allocated (memory rises "
            f"{format_bytes(max(spike, 0))} there: the spike), then "
            + (f"their softmax and that gradient are freed together, a {format_bytes(cliff)} cliff. The logits "
               f"themselves ({format_bytes(int(ctx.size[logits]))}) stay: the loop still holds them "
               + _held_until(ctx, logits)
               + "; without that reference (del it before backward) they would be gone by here too." if held else
               f"the logits, their softmax and that gradient are freed together, a {format_bytes(cliff)} cliff. "
               f"Everything {noun} is gone after this, so the rest of backward runs far lower.")
        ),
        details={"spike_bytes": spike, "cliff_bytes": cliff},
        members=tuple(sorted(set(alive.tolist()) | set(grads.tolist()))),  # np.union1d's, for a handful
    )


def _held_until(ctx: Context, logits: int) -> str:
    """Until when a variable holds the logits: their free, or, where the trace never frees them (a
    snapshot dumped while the loop's variable still held them: wild/magma27_cs336), the recording's end,
    said as such rather than as a free the trace does not show."""
    free = int(ctx.free[logits])
    if free < ctx.n:
        return f"until event {free}"
    return f"to the end of the recording (event {ctx.n - 1}; the trace never frees them)"
