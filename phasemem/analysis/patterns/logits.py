"""The LM head's logits block, the softmax spike on top of it, and its release where backward starts,
found from shapes, not stack frames (why the shape is an LM head's: docs/patterns.md). Where the logits
are is found for every step at once (``logits_regions.heads``); a step's detect only builds its patterns.
"""
from __future__ import annotations

import numpy as np

from ...model import Pattern
from ...units import format_bytes
from ..facts import Context, per_trace
from ..infer.frames import LINEAR, NOT_LINEAR, innermost_function, made_by_linear, outside_modules
from ..spans import concat_ranges
from .logits_regions import (  # noqa: F401 (the rules' thresholds and region finders, imported from here)
    ABOVE_ACTIVATIONS,
    GRAD_SIZE_TOLERANCE,
    LATE,
    LOSS_GRAD_FIRST,
    LOSS_GRAD_WITHIN,
    TINY,
    VOCAB_SHARE,
    Heads,
    all_microbatches,
    heads,
    losses_consuming,
)
from .shape_kind import INK, ShapeKind


def detect(ctx: Context, step: int) -> list[Pattern]:
    """The step's logits, softmax spikes and releases, from every step's numbers (made once)."""
    num = _numbers(ctx)
    rows = num["rows"]
    out: list[Pattern] = []
    for r in range(rows[step], rows[step + 1]) if step + 1 < len(rows) else ():
        noun = "vocabulary-sized" if num["made"][r] == LINEAR else "logits-sized"
        out.append(_logits(ctx, step, num, r))
        if num["spike_ok"][r]:
            out.append(_spike(step, num, r, noun))
        if num["release_ok"][r]:
            out.append(_release(ctx, step, num, r, noun))
    return out


@per_trace
def _numbers(ctx: Context) -> dict:
    """Every row's numbers (logits_regions.Heads: a region whose logits a loss consumed), as lists for
    the patterns to read one at a time: "rows" holds each step's rows (step s: rows[s]..rows[s + 1])."""
    h = heads(ctx)
    num = {"rows": np.searchsorted(h.step, np.arange(len(ctx.seg.steps) + 1)).tolist()}
    if not len(h):
        return num
    # a vocabulary-sized block is at least the smallest row's threshold: the few that can be, once
    cand = np.flatnonzero(ctx.size >= (VOCAB_SHARE * h.big).min())
    for part in (_logits_numbers(ctx, h, cand), _spike_numbers(ctx, h), _release_numbers(ctx, h, cand)):
        num.update({k: v.tolist() for k, v in part.items()})
    return num


def _within(cand: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates (sorted allocation indices) in lo[k]..hi[k] - 1, range after range: (k, index)."""
    k, at = concat_ranges(np.searchsorted(cand, lo), np.searchsorted(cand, hi))
    return k, cand[at]


def _row_sums(row: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per row (``row`` sorted), the sum of its values: running sums, exact in int64."""
    c = np.concatenate([[0], np.cumsum(values)])
    at = _bounds(row, n)
    return c[at[1:]] - c[at[:-1]]


def _bounds(row: np.ndarray, n: int) -> np.ndarray:
    """Where each of n rows starts in ``row`` (sorted), and the end: row k's at [k]..[k + 1]."""
    return np.searchsorted(row, np.arange(n + 1))


def _logits_numbers(ctx: Context, h: Heads, cand: np.ndarray) -> dict:
    lg, n = h.logits, len(h)
    a, size = ctx.alloc[lg], ctx.size[lg]
    end = np.minimum(ctx.free[lg], ctx.n - 1)
    # each row's step peak: one argmax a step (peaks_in would copy the whole trace: ten times slower)
    s0, s1 = (np.array([s[i] for s in ctx.seg.steps], np.int64)[h.step] for i in (0, 1))
    p = np.fromiter((ctx.peak_in(f, stop - 1) for f, stop in zip(s0.tolist(), s1.tolist())), np.int64, n)
    # Every vocabulary-sized tensor alive at the step's peak: logits, their copies, their gradients.
    k, i = _within(cand, ctx.alloc.searchsorted(s0), ctx.alloc.searchsorted(p, "right"))  # made by the peak
    live = (ctx.size[i] >= VOCAB_SHARE * h.big[k]) & (ctx.free[i] > p[k])
    stack = ctx.trace.stack[a]
    return {"a": a, "end": end, "size": size, "big": h.big,
            "vocab_bytes": _row_sums(k, np.where(live, ctx.size[i], 0), n),
            "step_level": ctx.level[p], "peak": ctx.peaks_in(a, np.minimum(end, h.last)), "logits": lg,
            "made": made_by_linear(ctx.trace)[stack], "loose": outside_modules(ctx.trace)[stack],
            "copies": np.bincount(h.row, minlength=n)}


def _logits(ctx: Context, step: int, num: dict, r: int) -> Pattern:
    a, size, made, vocab_bytes = num["a"][r], num["size"][r], num["made"][r], num["vocab_bytes"][r]
    share = vocab_bytes / max(num["step_level"][r], 1)
    # a library's workspace made in forward can be larger (cuDNN's LSTM: h11_tbptt_lstm)
    largest = ("the largest tensor of the forward pass" if size >= num["big"][r] else
               "among the largest tensors of the forward pass")
    # Its place is the forward that made it, even when the loop keeps it into the next step.
    return Pattern(
        kind="logits", step=step, phase="forward", start_event=a, end_event=num["end"][r],
        peak_event=num["peak"][r], bytes=size,
        explanation=(_loose(size, share, largest) if num["loose"][r] else
                     f"The LM head's output: one {format_bytes(size)} block of batch × sequence × vocabulary scores, "
                     f"{largest}. Vocabulary-sized tensors (logits, their softmax and "
                     f"gradients) hold {share:.0%} of this step's peak. To shrink it: compute the loss in chunks of "
                     f"the sequence (a fused or chunked cross-entropy), keep logits in bf16, or use a smaller "
                     f"micro-batch." if made == LINEAR else
                     _unnamed(size, share, largest,
                              innermost_function(ctx.trace, int(ctx.trace.stack[a])) if made == NOT_LINEAR else None)),
        details={"vocab_share_of_peak": round(share, 4), "vocab_bytes_at_peak": vocab_bytes,
                 "copies": num["copies"][r]},
        members=(num["logits"][r],),
    )


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


def _spike_numbers(ctx: Context, h: Heads) -> dict:
    n, v, row = len(h), h.vocab, h.row
    av, fv = ctx.alloc[v], ctx.free[v]
    transient = fv < h.b0[row]  # freed before backward starts
    end = np.full(n, -1, np.int64)
    np.maximum.at(end, row[transient], fv[transient])
    has = end >= 0
    p = np.zeros(n, np.int64)
    p[has] = ctx.peaks_in(ctx.alloc[h.logits[has]], end[has])
    made = av <= p[row]
    alive = np.bincount(row[made & (fv > p[row])], minlength=n)
    start = np.full(n, -1, np.int64)
    np.maximum.at(start, row[made], av[made])
    height = ctx.level[p] - ctx.timeline.active_after[np.maximum(end, 0)]
    # one vocabulary tensor alone is the logits block, not a spike on it
    ok = has & (alive >= 2) & (height > 0)
    # the phase run the spike's top is in (numpy's indexing, as peak_in's slice had it), and its highest level
    run = (ctx.run_first.searchsorted(p, "right") - 1) % max(len(ctx.run_first), 1)
    runs, at = np.unique(run[ok], return_inverse=True)
    sets = np.zeros(n, bool)
    sets[ok] = ctx.level[p[ok]] >= _ranges_max(ctx.level, ctx.run_first[runs], ctx.run_last[runs])[at]
    bounds = _bounds(row[transient], n)
    return {"spike_ok": ok, "spike_start": start, "spike_end": end, "spike_peak": p, "spike_height": height,
            "spike_sets": sets, "spike_members": v[transient], "spike_bounds": bounds}


def _ranges_max(level: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The highest level in each of disjoint ranges in event order: one reduceat, the ranges not copied."""
    if not len(first):
        return level[:0]
    at = np.empty(2 * len(first), np.int64)
    at[0::2], at[1::2] = first, last + 1  # between two ranges, a row that is dropped
    return np.maximum.reduceat(level, at[:-1] if at[-1] == len(level) else at)[0::2]


def _spike(step: int, num: dict, r: int, noun: str) -> Pattern:
    height, b = num["spike_height"][r], num["spike_bounds"]
    sets_text = " It sets the peak of the phase it is in." if num["spike_sets"][r] else ""
    return Pattern(
        kind="softmax_spike", step=step, phase="forward", start_event=num["spike_start"][r],
        end_event=num["spike_end"][r], peak_event=num["spike_peak"][r], bytes=height,
        explanation=(
            f"The spike at the top of forward: while the logits are alive, the loss makes another "
            f"{noun} tensor (an fp32 upcast or the log-softmax), so for a moment both exist, "
            f"{format_bytes(height)} above where memory settles.{sets_text} A fused or "
            f"chunked cross-entropy, or dropping the logits before the loss, removes it."
        ),
        details={"tensors": b[r + 1] - b[r] + 1, "sets_phase_peak": num["spike_sets"][r]},
        members=tuple(num["spike_members"][b[r]:b[r + 1]]),
    )


def _release_numbers(ctx: Context, h: Heads, cand: np.ndarray) -> dict:
    n, v, row = len(h), h.vocab, h.row
    fv = ctx.free[v]
    # Vocabulary-sized tensors that backward frees: the saved softmax, the logits unless the
    # caller still holds them, and the logits' gradient made at backward's start.
    alive = (fv >= h.b0[row]) & (fv <= h.b1[row])
    end = np.full(n, -1, np.int64)
    np.maximum.at(end, row[alive], fv[alive])
    has = np.flatnonzero(end >= 0)
    k, g = _within(cand, ctx.alloc.searchsorted(h.b0[has]), ctx.alloc.searchsorted(end[has] + 1))
    k = has[k]
    grad = (ctx.size[g] >= VOCAB_SHARE * h.big[k]) & (ctx.free[g] <= h.b1[k])
    g, k = g[grad], k[grad]
    np.maximum.at(end, k, ctx.free[g])
    p = np.zeros(n, np.int64)
    p[has] = ctx.peaks_in(h.b0[has], end[has])
    # what backward frees, by row then allocation (the saved ones come before backward's gradients)
    members, m_row = np.concatenate([v[alive], g]), np.concatenate([row[alive], k])
    order = np.lexsort((members, m_row))
    members, m_row = members[order], m_row[order]
    once = np.ones(len(members), bool)  # sorted(set()) of each row's
    once[1:] = (members[1:] != members[:-1]) | (m_row[1:] != m_row[:-1])
    level, ends = ctx.level[p], np.maximum(end, 0)
    return {"release_ok": end >= 0, "b0": h.b0, "release_end": end, "release_peak": p,
            "release_spike": level - ctx.before[h.b0], "release_cliff": level - ctx.timeline.active_after[ends],
            # logits a variable still holds are not among what backward frees
            "release_held": ctx.free[h.logits] > end, "release_members": members[once],
            "release_bounds": _bounds(m_row[once], n)}


def _release(ctx: Context, step: int, num: dict, r: int, noun: str) -> Pattern:
    # the spike is how far memory rises at backward's start, the logits' gradient and what comes with it
    # (wild/bcrafton_cs336 under torch.compile: 135 MiB beside a 12 MiB gradient, "a 135 MiB spike" read
    # as the gradient's size)
    # logits a variable still holds are not among what backward frees (h11_tbptt_lstm keeps them to the
    # end of the step: "the logits ... are freed together" was untrue there)
    spike, cliff, b = num["release_spike"][r], num["release_cliff"][r], num["release_bounds"]
    return Pattern(
        kind="logits_release", step=step, phase="backward", start_event=num["b0"][r],
        end_event=num["release_end"][r], peak_event=num["release_peak"][r], bytes=cliff,
        explanation=(
            f"Where backward starts at the loss: the gradient of the logits is allocated (memory rises "
            f"{format_bytes(max(spike, 0))} there: the spike), then "
            + (f"their softmax and that gradient are freed together, a {format_bytes(cliff)} cliff. The logits "
               f"themselves ({format_bytes(num['size'][r])}) stay: the loop still holds them "
               + _held_until(ctx, num["logits"][r])
               + "; without that reference (del it before backward) they would be gone by here too."
               if num["release_held"][r] else
               f"the logits, their softmax and that gradient are freed together, a {format_bytes(cliff)} cliff. "
               f"Everything {noun} is gone after this, so the rest of backward runs far lower.")
        ),
        details={"spike_bytes": spike, "cliff_bytes": cliff},
        members=tuple(num["release_members"][b[r]:b[r + 1]]),
    )


def _held_until(ctx: Context, logits: int) -> str:
    """Until when a variable holds the logits: their free, or, where the trace never frees them (a
    snapshot dumped while the loop's variable still held them: wild/magma27_cs336), the recording's end,
    said as such rather than as a free the trace does not show."""
    free = int(ctx.free[logits])
    if free < ctx.n:
        return f"until event {free}"
    return f"to the end of the recording (event {ctx.n - 1}; the trace never frees them)"


KINDS = (
    ShapeKind("logits", detect, per_step=True, marker="D", colour=INK, priority=10, size_label="the block",
              explanation="The output the loss reads: one batch × sequence × vocabulary block (an LM head's "
                          "logits), among the largest tensors of forward.", order=10),
    ShapeKind("softmax_spike", detect, per_step=True, marker="^", colour=INK, priority=20,
              size_label="the spike's height",
              explanation="A second logits-sized tensor (an fp32 upcast, the log-softmax) made while the logits "
                          "are alive: the spike at the top of forward.", order=20),
    ShapeKind("logits_release", detect, per_step=True, marker="v", colour=INK, priority=30, size_label="the cliff",
              explanation="Where backward starts at the loss: the logits' gradient arrives, then the logits-sized "
                          "tensors are freed together (the cliff).", order=30),
)
