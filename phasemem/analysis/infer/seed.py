"""Backward's start and end from its seed (the loss's scalar gradient, allocated first and freed last),
where the activation mountain's top falls elsewhere (the evidence: docs/accuracy.md)."""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..timeline import Timeline
from .bursts import ZERO_GRAD_MIN, burst_freed
from .gradients import keeps_gradients, parameter_sizes
from .loss import loss_span
from .passes import forward_start, has_backward

#: The seed is a scalar: 4 bytes (fp32), 2 (fp16/bf16), 8 (fp64).
SEED_SIZE = 8
#: The loss value is among the allocations this close before the seed (0-1 allocations between
#: on 671 of the 709 marked backward runs, 2-3 on 6; the others are scaled or freed losses).
LOOK = 4
#: The seed comes after the pass's top by at most this share of the forward before the top: the loss
#: computed after the last activation (llama__chunked_ce_8's chunks: 0.6, h9_char_gpt_math_attention 0.7);
#: truth_lbfgs's line search makes a scalar 1.4 forwards after, living into the next closure's backward;
#: odd_cudagraph's optimizer one far after its only mountain (2 steps found of 3 without the bound).
LOSS_SHARE = 1.0
#: Blocks a seed no mountain showed must free (h10_moco_queue's tiny model: 7).
MIN_GAP_SAVED = 5
#: Passes' tops a seed's span must hold where it frees nothing of its forward (h6_save_on_cpu: 8).
MIN_HELD = 2
#: Allocations past the seed searched for cross-entropy's fingerprint (as ``loss.PAST`` past a top).
PAST = 4
#: A seed's span must free at least this many blocks its forward made (alive at the seed): 1-3 read the
#: 215 marked traces alike; at 4 h10_linear_probe's seeds (its linear head saves 2-3) are lost.
MIN_IN = 2
#: ... and at most OUT_MIN + OUT_SHARE of that many such blocks may outlive it: the loss value, the
#: batch, what the loop keeps (h10_moco_queue keeps its keys and queue logits: 6 beside 7 saved).
OUT_MIN, OUT_SHARE = 3, 0.25


def candidates(trace: Trace, free_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Allocation events, and each possible seed (a scalar made within LOOK allocations after
    another scalar that outlives it: the loss value) with the end of its chain (``_chain``)."""
    n = len(trace)
    allocs = np.flatnonzero(trace.action == A["alloc"])
    tiny = trace.size[allocs] <= SEED_SIZE
    k = np.flatnonzero(tiny & (free_of[allocs] < n))
    end = free_of[allocs[k]]
    loss = np.zeros(len(k), bool)
    for d in range(1, LOOK + 1):
        j = np.maximum(k - d, 0)
        loss |= (k - d >= 0) & tiny[j] & (free_of[allocs[j]] > end)
    k = k[loss]
    return allocs, allocs[k], np.array([_chain(trace, allocs, free_of, int(i)) for i in k], np.int64)


def _chain(trace: Trace, allocs: np.ndarray, free_of: np.ndarray, k: int) -> int:
    """Where the backward seeded at ``allocs[k]`` ends: its seed's free, or, where the very next event
    allocates a scalar again that frees some block made before the first seed (a second ``backward()``
    through the same forward), that one's, and so on (the traces, and scalars that are no seed:
    docs/accuracy.md)."""
    n = len(trace)
    end = int(free_of[allocs[k]])
    while end + 1 < n and trace.action[end + 1] == A["alloc"] and trace.size[end + 1] <= SEED_SIZE \
            and end + 1 < free_of[end + 1] < n:
        before = free_of[allocs[:k]]
        if not ((before > end + 1) & (before <= free_of[end + 1])).any():
            break
        end = int(free_of[end + 1])
    return end


def reseat(trace: Trace, tl: Timeline,
           mts: list[tuple[int, int, int]]) -> tuple[list[tuple[int, int, int]], set[int], set[int]]:
    """Each pass (forward start, top, backward end) with its backward moved to its seed's span,
    where a seed explains the pass (``_best_seed``), the others as they are; the seeds found (each
    such pass's top + 1), and those of them whose backward leaves gradients (``seeded_gradients``)."""
    n = len(trace)
    free_of = tl.freed_at
    allocs, seeds, ends = candidates(trace, free_of)
    if not mts or not len(seeds):
        return mts, set(), set()
    params = parameter_sizes(tl)
    life = tl.lifetimes
    la, lf = life.alloc_event[life.paired], life.free_event[life.paired]
    burst = burst_freed(trace)
    out: list[tuple[int, int, int]] = []
    found: set[int] = set()
    lead = _leading_seed(trace, tl, allocs, params, mts[0][0])
    if lead is not None:
        out.append((lead[0], lead[0] - 1, lead[1]))
        found.add(lead[0])
    for i, (f0, top, b1) in enumerate(mts):
        prev_end = out[-1][2] if out else -1
        if top <= prev_end:
            continue  # inside the backward a seed placed: a checkpointed block's recompute
        nxt = mts[i + 1] if i + 1 < len(mts) else (n, n, n)
        # several whole backward runs may precede the top (LBFGS's closure evaluations: truth_lbfgs)
        while (gap := _gap_seed(trace, free_of, allocs, params, (la, lf, burst), seeds, ends, (prev_end, top, b1))):
            s, e, saved = gap
            out.append((forward_start(saved, s - 1), s - 1, e))
            found.add(s)
            prev_end = e
        last = min(b1, top + int(LOSS_SHARE * (top - f0)))
        best = _best_seed(la, lf, burst, seeds, ends, (prev_end, top, last, nxt[2]))
        if best is not None:
            s, e, saved = best
            # the first block the seed frees starts the forward, where the mountain began later (FSDP2:
            # it lay in backward) or in the backward before (h10_moco_queue)
            start = forward_start(saved, s - 1)
            f0 = min(f0, start) if f0 > prev_end and not _held_around(trace, allocs, free_of, f0, start, e) else start
            top, b1 = s - 1, e
            found.add(s)
        elif (held := _held_seed(trace, free_of, allocs, params, seeds, ends, mts, i, prev_end)) is not None:
            while out and out[-1][1] + 1 not in found:  # the mountains since the last backward: its forward
                f0 = out.pop()[0]
            prev_end = out[-1][2] if out else -1
            top, b1 = held[0] - 1, held[1]
            found.add(held[0])
        out.append((max(f0, prev_end + 1), top, b1))
    # Where seeds placed backward, a mountain with neither a seed nor a backward's frees is no pass: an
    # optimizer's temporaries (h10_shampoo_subclass's matrix roots), or what follows it; left to what
    # reads after a backward (pass_labels.label_after_backward)
    if found:
        out = [p for p in out if p[1] + 1 in found or has_backward(la, lf, p[0], p[1])]
    graded = {p[1] + 1 for p in out if p[1] + 1 in found and seeded_gradients(trace, allocs, free_of, burst, p[1] + 1, p[2])}
    return out, found, graded


def _best_seed(la: np.ndarray, lf: np.ndarray, burst: np.ndarray, seeds: np.ndarray, ends: np.ndarray,
               bounds: tuple[int, int, int, int]) -> tuple[int, int, np.ndarray] | None:
    """(seed, its chain's end, the allocations it frees) of the seed made after the previous pass's
    backward and up to ``last`` whose span holds this pass's top and frees most of what is alive at it
    (MIN_IN, OUT_MIN, OUT_SHARE); None where none does. ``bounds``: the previous backward's end, this
    pass's top, ``last``, the next pass's backward end. Blocks freed in bursts (``burst``, per event)
    are left alive by no seed (docs/accuracy.md)."""
    prev_end, top, last, nxt_end = bounds
    found, refused = [], []
    k0, k1 = np.searchsorted(seeds, prev_end, "right"), np.searchsorted(seeds, last, "right")
    for s, e in zip(seeds[k0:k1].tolist(), ends[k0:k1].tolist()):
        if e < top:
            continue
        lo, hi = np.searchsorted(la, prev_end, "right"), np.searchsorted(la, s, "left")
        fr = lf[lo:hi]
        alive = (fr > s) & (fr < nxt_end)
        inside = alive & (fr <= e)
        out = alive & (fr > e) & ~burst[np.minimum(fr, len(burst) - 1)]
        n_in, n_out = int(inside.sum()), int(out.sum())
        if n_in >= MIN_IN and n_out <= OUT_MIN + OUT_SHARE * n_in:
            found.append((s, e, np.sort(la[lo:hi][inside]), n_in / (n_out + OUT_MIN)))
        elif n_in >= MIN_IN:
            refused.append((s, e, np.sort(la[lo:hi][inside]), n_in, int(fr[out].max(initial=e))))
    found = [closure_seed(f, refused) for f in found]
    # A span holding another is a loss value's, not a seed's (h9_multitask_retain_graph: the second loss,
    # made right after the first, is freed after both backward calls)
    found = [f for f in found if not any(g[0] > f[0] and g[1] <= f[1] for g in found)]
    # the most freed for each left alive (beside the OUT_MIN a loop keeps anyway): a scalar of the loss
    # frees the loss's temporaries and leaves alive what the backward frees (llama__ckpt_1: 33 freed, 9
    # left; the seed 11 and 0); an optimizer's scalar frees a few (truth_lbfgs: 4 and 0, the seed 33 and 10)
    return max(found, key=lambda f: f[3])[:3] if found else None


#: A closure's seed frees at least this many times what the optimizer's scalar around it frees
#: (truth_lbfgs: 33 against 10 and 4)
CLOSURE_FREES = 2


def closure_seed(f: tuple, refused: list[tuple]) -> tuple:
    """The seed of a backward run inside an optimizer's call (LBFGS's ``step(closure)``) in place of
    ``f``, a scalar of the optimizer's made before the closure and freed after it: a refused seed
    inside its span, freeing CLOSURE_FREES times as much, everything it leaves alive (the optimizer's
    flat vectors and scalars, made before the closure's forward) freed within ``f``'s span."""
    s, e, saved, _ = f
    inner = [g for g in refused if s < g[0] and g[1] <= e and g[4] <= e and g[3] >= CLOSURE_FREES * len(saved)]
    if not inner:
        return f
    g = max(inner, key=lambda g: g[3])
    return g[0], g[1], g[2], g[3] / OUT_MIN


#: Share of the blocks made between a mountain's start and its seed's forward that outlive the backward,
#: above which they are an enclosing call's, not the forward's (LBFGS's flat vectors and line-search
#: scalars, made before each closure: truth_lbfgs)
HELD_AROUND = 0.5


def _held_around(trace: Trace, allocs: np.ndarray, free_of: np.ndarray, f0: int, start: int, end: int) -> bool:
    """Whether most of the blocks made from ``f0`` to ``start``, or most of their bytes, outlive the
    backward ending at ``end`` (bytes: a line search's many scalars live briefly beside the vectors held)."""
    made = allocs[np.searchsorted(allocs, f0, "left"):np.searchsorted(allocs, start, "left")]
    size, held = trace.size[made].astype(np.float64), free_of[made] > end
    return size.sum() > 0 and max(float(held.mean()), float(size[held].sum() / size.sum())) > HELD_AROUND


def _gap_seed(trace: Trace, free_of: np.ndarray, allocs: np.ndarray, params: np.ndarray, live: tuple[np.ndarray, ...],
              seeds: np.ndarray, ends: np.ndarray, bounds: tuple[int, int, int]) -> tuple[int, int, np.ndarray] | None:
    """A whole backward before a pass's top that no mountain showed: a seed after the previous pass's
    backward whose span ends before the top, frees MIN_GAP_SAVED or more blocks made since, and keeps
    gradients past it (h10_moco_queue: its queue's logits outweigh the first step's activations; a PGD
    attack's autograd.grad for the input keeps none, h11_pgd_adversarial). ``live``: the blocks' alloc
    and free events and the burst frees; ``bounds``: the previous backward's end, the pass's top and
    backward end."""
    la, lf, burst = live
    prev_end, top, b1 = bounds
    inside = (seeds > prev_end) & (ends < top)
    best = _best_seed(la, lf, burst, seeds[inside], ends[inside], (prev_end, prev_end + 1, top, b1))
    if best is None or len(best[2]) < MIN_GAP_SAVED or not keeps_gradients(trace, allocs, params, free_of, best[0] - 1,
                                                                              best[1], top):
        return None
    # ... freed last made first, as a backward frees (an optimizer's scalar among its temporaries in
    # odd_cudagraph, whose graphed steps make no pass, frees them as made)
    return best if has_backward(la, lf, int(best[2][0]), best[0] - 1, MIN_GAP_SAVED) else None


def _leading_seed(trace: Trace, tl: Timeline, allocs: np.ndarray, params: np.ndarray, first: int) -> tuple[int, int] | None:
    """(seed, its chain's end) of a backward before the first pass whose forward ran before the trace
    began (a ring buffer that wrapped mid-step, h8_mid_step_start): a scalar whose span ends before the
    first pass, frees MIN_GAP_SAVED or more blocks older than the trace, and keeps gradients past it.
    Its loss value, made before the trace, is not seen: any scalar."""
    n = len(trace)
    free_of = tl.freed_at
    life = tl.lifetimes
    old = np.sort(life.free_event[life.preexisting])
    head = np.flatnonzero((trace.size[allocs] <= SEED_SIZE) & (allocs < first))
    for k in head.tolist():
        s = int(allocs[k])
        e = _chain(trace, allocs, free_of, k)
        if e >= first or e >= n:
            continue
        freed = np.searchsorted(old, e, "right") - np.searchsorted(old, s, "right")
        if freed >= MIN_GAP_SAVED and keeps_gradients(trace, allocs, params, free_of, s - 1, e, first):
            return s, e
    return None


def _held_seed(trace: Trace, free_of: np.ndarray, allocs: np.ndarray, params: np.ndarray, seeds: np.ndarray,
               ends: np.ndarray, mts: list[tuple[int, int, int]], i: int, prev_end: int) -> tuple[int, int] | None:
    """(seed, its chain's end) of a backward that frees nothing its forward left on the GPU, where pass
    ``i``'s top falls in it: a seed after ``prev_end`` whose span holds MIN_HELD or more passes' tops
    and keeps gradients past it (h6_save_on_cpu: the forward's saved tensors go to the host, backward
    brings them back layer by layer, a mountain each)."""
    tops = np.array([t for _, t, _ in mts])
    top = tops[i]
    k0, k1 = np.searchsorted(seeds, prev_end, "right"), np.searchsorted(seeds, top, "right")
    for s, e in zip(seeds[k0:k1].tolist(), ends[k0:k1].tolist()):
        held = int(((tops > s) & (tops <= e)).sum())
        if e >= top and held >= MIN_HELD and keeps_gradients(trace, allocs, params, free_of, s - 1, e, len(trace)):
            return s, e
    return None


def all_seeded(trace: Trace, tl: Timeline, labels: np.ndarray, other: np.ndarray) -> bool:
    """Whether every backward run in ``labels`` begins at a seed (``candidates``), and there are as
    many as in ``other``: passes so placed need no other reading (h5_vae_handadam: the gradients' sets
    explain 54 saved activations to the passes' 45, as many as EXPLAINS asks, and would move backward's
    start 29 events late). Where the other reading has more, passes were missed (h11_tbptt_lstm)."""
    starts = _run_starts(labels == P["backward"])
    return bool(len(starts)) and len(starts) >= len(_run_starts(other == P["backward"])) and bool(
        np.isin(starts, candidates(trace, tl.freed_at)[1]).all())


def _run_starts(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))


def seeded_gradients(trace: Trace, allocs: np.ndarray, free_of: np.ndarray, burst: np.ndarray, seed: int,
                     end: int) -> bool:
    """Whether the backward from ``seed`` to ``end`` makes ZERO_GRAD_MIN or more blocks that outlive it and
    are then freed in a burst (zero_grad) or never: gradients, whatever their sizes (FSDP2 makes its
    gradients as one flat block a layer, of no parameter's size: heldout4_gpt_fsdp2_bf16)."""
    n = len(trace)
    made = allocs[np.searchsorted(allocs, seed, "right"):np.searchsorted(allocs, end, "left")]
    fr = free_of[made]
    kept = fr[fr > end]
    return len(kept) >= ZERO_GRAD_MIN and bool(((kept >= n) | burst[np.minimum(kept, n - 1)]).all())


def seeded_loss(trace: Trace, free_of: np.ndarray, f0: int, top: int, seeds: set[int],
                allocs: np.ndarray) -> tuple[int, int] | None:
    """The loss of the pass from ``f0`` with top ``top`` by cross-entropy's fingerprint (``loss.loss_span``).
    Where a seed placed its backward, the fingerprint is searched up to PAST allocations past the seed and
    the loss ends at the seed; one whose backward would begin before the seed is none (the traces:
    docs/accuracy.md)."""
    seed = top + 1
    if seed not in seeds:
        return loss_span(trace, free_of, f0, top, allocs)
    k = min(int(np.searchsorted(allocs, seed)) + PAST, len(allocs) - 1)
    for end in (int(allocs[k]), top):  # the latest fingerprint may lie in backward (heldout3_distill_kl)
        span = loss_span(trace, free_of, f0, end, allocs)
        if span is not None and span[0] < seed <= span[1]:
            return span[0], seed
    return None
