"""Forward/backward passes from allocation lifetimes: the step period, each pass's top and edges."""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ..sizes import in_sorted
from ..timeline import Timeline
from .bursts import burst_freed
from .gradients import SCALAR, parameter_sizes
from .odd_steps import held_start

K = 8  # allocation sizes in a k-gram
# An activation lives less than this share of a step (checkpointed block inputs live through the
# long backward, ~0.9; logits a loop keeps until the next step, ~1.1). 0.8/0.9/0.95/1.0 gave a
# mean frameless accuracy of 0.821/0.838/0.840/0.835 on the real snapshots (docs/accuracy.md).
SPAN = 0.95
# Stragglers: at most 3 frees, after a quiet stretch 8 % as long as the backward and 4 times the
# usual distance between its frees.
TAIL, STRAGGLE, GAPS = 3, 0.08, 4
#: A pass's first saved allocations are the previous step's (``forward_start``) only after a quiet
#: stretch longer than this share of the rest of the forward: a checkpointed forward saves one block
#: input a block, evenly spaced (heldout3_neox_hfckpt_accum2, h10_reentrant_ckpt, heldout_gpt_compile_ckpt
#: lost 0.01-0.2 at 0.08); pairs/chunked_ce's kept loss sits 2.7 forwards before its forward.
LEAD = 1.0
MIN_SAVED = 10  # activations alive at a pass's top before it can be a training pass
#: An activation lives at least this many events: shorter lives are a layer's temporaries, which would
#: fill the valleys between passes (chosen on the first-wave fixtures; docs/accuracy.md measures the
#: result out of sample).
MIN_LIFE = 16
#: A pass's top must stand out of the curve by this share of the highest top (scipy's find_peaks
#: prominence): backward's ripples and the loss's spike stand lower (same fixtures as MIN_LIFE).
PROMINENCE = 0.3
CORE = 0.05  # a pass's core: its activations' allocations and frees less the first and last 5 %
#: A quiet stretch before a pass's last frees holds a checkpointed block's recompute only if it is at
#: most this many times as long as the pass's forward: a recompute re-runs part of the forward, and its
#: backward. h16_compiled_fused's first step compiles its fused AdamW between the backward and the
#: batch's and kept loss's frees, 377 forwards long: its many small blocks read as a recompute, and the
#: whole optimizer as backward (0.06 of its events right). Real recompute stretches: 0.7-2.2 forwards
#: (pairs2 llama ckpt_1, heldout3_neox_hfckpt_accum2); h16_serve_paged's (no training) up to 13.5.
RECOMPUTE_SPAN = 30


def candidate_periods(trace: Trace) -> list[int]:
    """Regular recurrence distances with a fair share of the votes, longest first.

    Checkpointed layers recur regularly too (their recompute), and in a trace holding barely more
    than one step only a layer's period is visible at all; the caller tries them longest first.
    """
    sizes = trace.size[trace.action == A["alloc"]].astype(np.uint64)
    if len(sizes) < 4 * K:
        return []
    h = np.zeros(len(sizes) - K + 1, np.uint64)
    for j in range(K):
        h = h * np.uint64(1_000_003) + sizes[j:len(sizes) - K + 1 + j]
    order = np.argsort(h, kind="stable")
    hs, pos = h[order], order
    same = hs[1:] == hs[:-1]
    gap = np.where(same, pos[1:] - pos[:-1], 0)
    # group boundaries
    start = np.flatnonzero(np.concatenate([[True], ~same]))
    count = np.diff(np.concatenate([start, [len(hs)]]))
    votes: dict[int, int] = {}
    for s, c in zip(start.tolist(), count.tolist()):
        if c < 2:
            continue
        g = gap[s:s + c - 1]
        steady = g[1:] if c >= 3 else g  # the first step may be longer
        if len(steady) and (steady == steady[0]).all() and steady[0] >= 4 * K:
            votes[int(steady[0])] = votes.get(int(steady[0]), 0) + 1
    if not votes:
        return []
    top = max(votes.values())
    return sorted((d for d, v in votes.items() if v >= 0.2 * top), reverse=True)


def mountains(trace: Trace, tl: Timeline, period_events: float | None = None,
              fill: bool = True) -> list[tuple[int, int, int]]:
    """(forward start, top, backward end) of each forward/backward pass, from activation lifetimes.

    Activations: allocations freed inside the trace, alive for more than a few events, and not
    freed in a burst (gradients, optimizer temporaries). Their live bytes rise through forward and
    fall through backward: one mountain per pass, its top where backward begins.
    """
    n = len(trace)
    a, f, act, curve, max_span = _activation_curve(trace, tl, period_events)
    if not len(curve) or curve.max() <= 0:
        return []
    out: list[tuple[int, int, int]] = []
    core = np.zeros(n, bool)  # events inside an accepted pass's core

    from scipy.signal import find_peaks  # ~2 s to import: paid by traces without markers, not `import phasemem`

    def climb(lo: int, hi: int) -> None:
        part = curve[lo:hi]
        # One point per run of equal values: the same peaks, found without scanning every event.
        first = np.flatnonzero(np.concatenate([[True], part[1:] != part[:-1]]))
        last = np.concatenate([first[1:], [len(part)]]) - 1
        peaks, _ = find_peaks(np.concatenate([[0], part[first], [0]]), prominence=PROMINENCE * part.max())
        # The top is the plateau's last event: activations stop being made when the loss is done,
        # but the first is freed only once backward runs (zero_grad's frees in between are not theirs).
        peaks = lo + last[peaks - 1]
        # Highest first: a lesser peak inside an accepted pass (a ripple of backward, the loss's
        # spike) is part of that pass, not a pass of its own.
        # Most of its activations, not all: one tensor a loop holds across passes (the last
        # micro-batch's logits, kept through the optimizer) must not swallow the next pass.
        for p in peaks[np.argsort(-curve[peaks], kind="stable")].tolist():
            if core[p]:
                continue
            # allocations are in event order, and an activation lives less than max_span
            lo, hi = np.searchsorted(a, p - max_span, "left"), np.searchsorted(a, p, "right")
            alive = act[lo:hi] & (f[lo:hi] > p)
            if alive.any():
                pa, pf = a[lo:hi][alive], f[lo:hi][alive]
                out.append((int(pa.min()), p, int(pf.max())))
                core[int(np.quantile(pa, CORE)):int(np.quantile(pf, 1 - CORE)) + 1] = True

    climb(0, n)
    if not fill:
        return sorted(out)
    # A pass far lower than the highest (the first step, before the loop holds its logits across
    # steps) is no peak against the whole curve; look again, in each long stretch no pass covers.
    long = 0.5 * (period_events or (np.median([b1 - f0 for f0, _, b1 in out]) if out else n))
    edges = [-1] + [x for f0, _, b1 in sorted(out) for x in (f0, b1)] + [n]
    for g0, g1 in zip(edges[0::2], edges[1::2]):
        if g1 - g0 - 1 >= long and curve[g0 + 1:g1].max(initial=0) >= 0.1 * curve.max():
            climb(g0 + 1, g1)
    return sorted(out)


def _activation_curve(trace: Trace, tl: Timeline, period_events: float | None):
    """The blocks' allocation and free events (event order), which of them are activations, the live
    bytes of those at each event, and the longest an activation lives (events)."""
    n = len(trace)
    life = tl.lifetimes
    born = life.paired
    a, f, s = life.alloc_event[born], life.free_event[born], life.size[born]
    # Anything alive for most of a step is not one pass's activation (logits the loop keeps until
    # the next step, a batch prefetched a step ahead).
    max_span = SPAN * period_events if period_events else n
    act = (f - a >= MIN_LIFE) & (f - a < max_span) & ~burst_freed(trace)[f]
    d = np.zeros(n + 1, np.int64)
    np.add.at(d, a[act], s[act])
    np.add.at(d, f[act], -s[act])
    curve = np.cumsum(d)[:n]
    return a, f, act, curve, max_span


def has_backward(a: np.ndarray, f: np.ndarray, f0: int, top: int, min_saved: int = MIN_SAVED) -> bool:
    """Backward frees the activations a forward saved, last made first freed: many alive at the top
    and freed in reverse order (rank correlation of alloc and free order < 0; -0.17 to -0.94 on the
    real training traces). Inference frees as it goes: a handful alive at its top (6 on a real GPT)."""
    lo, hi = np.searchsorted(a, f0, "left"), np.searchsorted(a, top, "right")  # a is in event order
    m = f[lo:hi] > top
    if m.sum() < min_saved:
        return False
    ra = np.argsort(np.argsort(a[lo:hi][m]))
    rf = np.argsort(np.argsort(f[lo:hi][m]))
    return float(np.corrcoef(ra, rf)[0, 1]) < 0


def passes(trace: Trace, tl: Timeline, mts: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(forward start, top, backward end) of each pass, from the allocations alive across its top (what a
    forward saves for its backward, however long it lives); burst frees are left out. Why: docs/accuracy.md.
    """
    n = len(trace)
    life = tl.lifetimes
    born = life.paired
    a, f = life.alloc_event[born], life.free_event[born]
    # Burst frees are zero_grad's or the optimizer's, not backward's -- except inside the backward
    # the activation mountain already shows (the embedding's backward freeing several at once), of
    # what no backward made (gradients kept across micro-batches are made by the first backward).
    depth = np.zeros(n + 1, np.int64)
    for _, top, b1 in mts:
        depth[top + 1] += 1
        depth[b1 + 1] -= 1
    in_bwd = np.cumsum(depth) > 0
    burst = burst_freed(trace)[f]
    keep = ~burst | (in_bwd[f] & ~in_bwd[a])
    size = life.size[born][keep]
    a, f = a[keep], f[keep]
    act = (f - a >= 16) & ~burst[keep]
    # parameter-sized ones are an optimizer's temporaries (grad², the update), not a recompute's
    act_a, act_f = a[act], f[act]
    act_p = in_sorted(size[act], parameter_sizes(tl))
    bounds = [-1] + [top for _, top, _ in mts] + [n]
    # allocations are in event order: those made between two tops are one slice
    cut = np.searchsorted(a, bounds, "right")
    starts, crossing, made = [], [], []
    for k in range(1, len(bounds) - 1):
        fk = f[cut[k - 1]:cut[k]]
        c = (fk > bounds[k]) & (fk < bounds[k + 1])
        crossing.append(fk[c])
        # a scalar the loop keeps across steps (HF Trainer's running loss) is no activation to start it
        made_k, size_k = a[cut[k - 1]:cut[k]][c], size[cut[k - 1]:cut[k]][c]
        lead = int(np.argmax(size_k > SCALAR)) if (size_k > SCALAR).any() else 0
        made.append(made_k[min(lead, TAIL):])
        starts.append(forward_start(made[-1], bounds[k]) if len(made[-1]) else bounds[k])
    out = []
    for k, fc in enumerate(crossing):
        top = bounds[k + 1]
        nxt = starts[k + 1] if k + 1 < len(starts) else n
        b1 = backward_end(np.sort(fc[fc < nxt]), top, act_a, act_f, act_p, top - starts[k])
        out.append((held_start(made[k], fc, starts[k], top, b1, MIN_SAVED), top, b1))
    return out


def forward_start(made: np.ndarray, top: int) -> int:
    """The first of a pass's saved allocations (in event order), less up to TAIL leading ones before a
    quiet stretch (LEAD, GAPS): what the previous step's loss made and the loop keeps is no activation of
    this forward (the trace that showed it: docs/accuracy.md). The mirror of ``backward_end``."""
    start = int(made[0])
    # A checkpointed forward saves a few block inputs far apart: nothing there tells a straggler
    # (heldout3_neox_hfckpt_accum2 keeps 8-9, h11_tbptt_lstm's truncated chunks 7).
    if len(made) < TAIL + MIN_SAVED:
        return start
    spacing = float(np.median(np.diff(made)))
    best = 0
    for k in range(1, TAIL + 1):
        g0, g1 = int(made[k - 1]), int(made[k])
        if g1 - g0 > max(LEAD * (top - g1), GAPS * spacing) and g1 - g0 > best:
            best, start = g1 - g0, g1
    return start


def backward_end(frees: np.ndarray, top: int, act_a: np.ndarray, act_f: np.ndarray,
                 act_p: np.ndarray, forward: int = 0) -> int:
    """The last of a pass's saved-activation frees (sorted), less a straggling few after a long
    stretch in which no activations live and die: the loss or the batch a loop keeps until after
    the optimizer is no activation backward frees. (A checkpointed backward's last block is a long
    stretch between two such frees too, but full of its recompute's activations, and not many times
    longer than the ``forward``, in events: RECOMPUTE_SPAN.)"""
    if not len(frees):
        return top
    best, end = 0, int(frees[-1])
    spacing = float(np.median(np.diff(frees))) if len(frees) > 2 else 0.0
    for k in range(1, min(TAIL, len(frees) - 1) + 1):
        g0, g1 = frees[-k - 1], frees[-k]
        # long against the backward, against the usual distance between its frees, and empty of
        # the activations a checkpointed block's recompute makes
        lo, hi = np.searchsorted(act_a, g0, "right"), np.searchsorted(act_a, g1, "left")
        inside = act_f[lo:hi] < g1
        recompute = int((inside & ~act_p[lo:hi]).sum())
        quiet = (g1 - g0 > max(STRAGGLE * (g0 - top), GAPS * spacing)
                 and (recompute < MIN_SAVED or recompute < int(inside.sum()) / 2
                      or (forward > 0 and g1 - g0 > RECOMPUTE_SPAN * forward)))
        if quiet and g1 - g0 > best:  # the longest quiet stretch, not the first
            best, end = g1 - g0, int(g0)
    return end
