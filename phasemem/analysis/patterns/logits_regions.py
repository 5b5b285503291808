"""Where the logits are, in every step at once: the forward-or-loss regions that end in a
vocabulary-sized block a loss consumed (logits.py has the shape and the words), found with segment
reductions over all regions rather than a region at a time (issue 34: 2,179 steps at 1M events)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...vocab import P
from ..facts import Context
from ..spans import concat_ranges

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


@dataclass(frozen=True)
class Heads:
    """The regions whose logits a loss consumed, one row each, by step then event."""

    step: np.ndarray
    last: np.ndarray  # the region's last event
    b0: np.ndarray  # the backward run that follows: its first event ...
    b1: np.ndarray  # ... and its last
    big: np.ndarray  # the region's largest forward-or-loss allocation (bytes)
    logits: np.ndarray  # the logits (an allocation index)
    vocab: np.ndarray  # the vocabulary-sized allocations from the logits on, row after row
    row: np.ndarray  # the row of each of those

    def __len__(self) -> int:
        return len(self.step)


def heads(ctx: Context) -> Heads:
    """Every step's logits regions at once (see Heads): the microbatches' regions whose forward-or-loss
    allocations end in logits by size and whose loss consumed them, every region tested at once."""
    first, last, bwd, step = all_microbatches(ctx)
    lo, hi = ctx.alloc.searchsorted(first), ctx.alloc.searchsorted(last + 1)
    region, idx = concat_ranges(lo, hi)
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
    rows, j = pre[consumed], np.flatnonzero(consumed)
    at_row = np.full(len(first), -1)
    at_row[rows] = np.arange(len(rows))
    sel = is_vocab & (at_row[region] >= 0)  # idx and region run region after region, in event order
    logits, vocab, row = _logits_among(ctx, idx[sel], at_row[region[sel]], big[rows], opening,
                                       bounds[j], bounds[j + 1])
    return Heads(step[rows], last[rows], bwd[rows, 0], bwd[rows, 1], big[rows], logits, vocab, row)


def _logits_among(ctx: Context, vocab: np.ndarray, row: np.ndarray, big: np.ndarray, opening: np.ndarray,
                  o_lo: np.ndarray, o_hi: np.ndarray):
    """The logits among each row's vocabulary-sized blocks (``vocab``, row after row): the first, unless
    its size is none of the logits' gradient's (the same, or 2x either way) while a later one's is (a
    library's workspace can come first: docs/patterns.md). ``opening``: the backward runs' sizes
    (losses_consuming), row k's at o_lo[k]..o_hi[k]. Returns the logits, and the blocks from them on."""
    n = len(big)
    o_row, o_at = concat_ranges(o_lo, o_hi)  # a handful each (LOSS_GRAD_WITHIN)
    o_size = opening[o_at]
    is_grad = np.flatnonzero(o_size >= VOCAB_SHARE * big[o_row])
    g = np.full(n, np.nan)
    if len(is_grad):
        first = np.concatenate([[True], o_row[is_grad][1:] != o_row[is_grad][:-1]])
        g[o_row[is_grad][first]] = o_size[is_grad[first]]
    size, gv = ctx.size[vocab].astype(np.float64), g[row]
    fits = np.zeros(len(vocab), bool)  # nan (no gradient) fits nothing: the first is the logits
    for r in (0.5, 1.0, 2.0):
        fits |= np.abs(size - gv * r) <= GRAD_SIZE_TOLERANCE * gv * r
    pos = np.arange(len(vocab)) - np.searchsorted(row, row)  # each block's place in its row
    k = np.zeros(n, np.int64)
    hit = np.flatnonzero(fits)
    if len(hit):
        once = np.concatenate([[True], row[hit][1:] != row[hit][:-1]])
        k[row[hit][once]] = pos[hit][once]
    keep = pos >= k[row]  # what the loss made from them, not a workspace before
    start = np.searchsorted(row, np.arange(n))
    return vocab[start + k], vocab[keep], row[keep]


def losses_consuming(ctx: Context, bwd: np.ndarray, vocab_bytes: np.ndarray):
    """Evidence, for many regions at once, that a loss consumed a vocabulary-sized output (at least
    ``vocab_bytes``): its backward run (``bwd``: rows of first, last event) begins with a gradient of
    that size, among its first LOSS_GRAD_WITHIN allocations above TINY bytes (its opening), and what
    comes before that gradient is small beside it. Returns the openings' sizes one after another,
    each region's bounds in them, and the evidence per region."""
    lo, hi = ctx.alloc.searchsorted(bwd[:, 0]), ctx.alloc.searchsorted(bwd[:, 1] + 1)
    reg, idx = concat_ranges(lo, hi)
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
