"""Steps of odd shape, read from lifetimes alone: rules for what the passes' reading gets wrong there
(each rule and the trace that showed it: docs/accuracy.md, "Third round: graph networks, LBFGS,
embeddings"). Each is called from one line of ``lifetimes``, ``gradients``, ``anchored`` or ``passes``.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from .bursts import FREED_TOGETHER

#: Chunked gradients a backward must make after its last saved free before it is read as going on:
#: heldout_embbag_adagrad makes 8 (one slice of its 8 embedding tables' gradient a chunk); one such
#: block alone is what ``gradients._late_gradients`` already reads.
MIN_CHUNKS = 2

#: Parameter-sized blocks made in a row, no free between, that are an optimizer's foreach outputs, not
#: a chunk of backward: Adagrad's 8 in heldout_embbag_adagrad; a chunk makes at most 2 (its slice of
#: the gradient, after one of its temporaries) there. As ``pass_labels.MIN_UPDATE_BLOCKS``.
ROW = 4

def held_over(freed: np.ndarray, nxt: int, n: int) -> np.ndarray:
    """Which blocks made after an update, freed inside the next step (after its pass begins at ``nxt``,
    before the trace ends), are that step's batch, not the update's work: an optimizer's temporaries die
    before the next pass, its state lives on (h7_capturable_adam: the next batch, a parameter's size,
    made after Adam, was read as its last block)."""
    return (freed > nxt) & (freed < n)


def chunked_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                      top: int, b1: int, ours: np.ndarray, sized: np.ndarray) -> int:
    """Position in ``ours`` (the allocations after ``b1``) of the last gradient a backward makes in
    chunks after its last saved free, else -1: an optimizer's row of foreach outputs or its state ends the
    chunks (the rule, and the EmbeddingBag trace behind it: docs/accuracy.md).
    """
    n = len(trace)
    made = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
    grads = made[np.isin(trace.size[made], params) & (free_of[made] > b1)]
    if len(grads) < 2 or not sized.any():
        return -1
    fs = np.sort(free_of[grads])
    run = np.concatenate([[0], np.cumsum(np.diff(fs) > FREED_TOGETHER)])
    big = fs[run == np.argmax(np.bincount(run))]
    f = free_of[ours]
    # zero_grad frees the chunks' slices with the other gradients, in one run of frees no allocation
    # splits (a for-loop optimizer's temporaries are freed one by one between its allocations)
    run = np.searchsorted(allocs, f, "left") == np.searchsorted(allocs, big[0], "left")
    if big[0] < n:
        near = ((f >= big[0] - FREED_TOGETHER) & (f <= big[-1] + FREED_TOGETHER)) | (run & (f < n))
    else:
        near = f >= n
    cand = np.flatnonzero(sized & near)
    if len(cand) < MIN_CHUNKS:
        return -1
    act = trace.action[ours[0]:ours[-1] + 1]
    frees_before = np.cumsum((act == A["free_completed"]) | (act == A["free"]))  # from ours[0] on
    # the optimizer's first sign: state (a parameter-sized block alive past the gradients' frees, not
    # one of them), or ROW parameter-sized blocks made in a row with no free between (foreach outputs)
    stop = sized & ~near & (f > big[0])
    fb = frees_before[ours - ours[0]]
    same = np.concatenate([[False], fb[1:] == fb[:-1]]) & sized & np.concatenate([[False], sized[:-1]])
    row = np.cumsum(~same)
    stop |= sized & (np.bincount(row, weights=sized)[row] >= ROW)
    first_stop = int(np.argmax(stop)) if stop.any() else len(ours)
    k = int((cand < first_stop).sum())
    if not k:
        return -1
    # ... the chunks come in MIN_CHUNKS groups split by frees, and make no more parameter-sized
    # temporaries than slices (one each in heldout_embbag_adagrad; a for-loop optimizer whose last
    # temporaries are freed right before zero_grad makes a few for each parameter)
    last = int(cand[k - 1])
    temps = int(sized[:last + 1].sum()) - k
    return last if len(np.unique(fb[cand[:k]])) >= MIN_CHUNKS and temps <= k else -1


#: The rank correlation of a pass's saved activations' allocation and free order (``passes.has_backward``)
#: an earlier top must reach before it replaces a refused one: strongly last-made-first-freed.
#: heldout3_gcn_scatter_adam's first pass reaches -0.965 at its forward's end (its found top, inside
#: backward, +0.15); the real training passes range -0.17 to -0.94, so only a clear one is taken.
EARLIER_CORR = -0.5
#: Tops within this of the lowest correlation are as good: the latest is taken (the loss's blocks, kept
#: to backward's end, come after the model's last activation and lower the correlation a little).
CORR_TIE = 0.01
#: Candidate tops tried at most (evenly spread over the pass's allocations): bounds the cost.
MAX_TRIES = 256


def earlier_top(la: np.ndarray, lf: np.ndarray, allocs: np.ndarray, f0: int, top: int, min_saved: int) -> int:
    """Where a pass's top fell inside its backward (a graph network's), the forward's real end: the latest
    allocation where ``min_saved`` blocks are alive and freed most nearly last-made-first (EARLIER_CORR);
    else ``top``. Why, and the trace: docs/accuracy.md."""
    cand = allocs[(allocs > f0) & (allocs < top)]
    if len(cand) > MAX_TRIES:
        cand = cand[np.linspace(0, len(cand) - 1, MAX_TRIES).astype(np.int64)]
    lo = np.searchsorted(la, f0, "left")
    corr = np.full(len(cand), np.inf)
    for i, t in enumerate(cand.tolist()):
        hi = np.searchsorted(la, t, "right")
        m = lf[lo:hi] > t
        if m.sum() >= max(min_saved, 3):
            ra = np.argsort(np.argsort(la[lo:hi][m]))
            rf = np.argsort(np.argsort(lf[lo:hi][m]))
            corr[i] = np.corrcoef(ra, rf)[0, 1]
    if not len(cand) or corr.min() >= EARLIER_CORR:
        return top
    return int(cand[np.flatnonzero(corr <= corr.min() + CORR_TIE)[-1]])



#: Leading blocks of a pass held past its backward are the step's data, not its forward, only after a
#: quiet stretch longer than this share of the rest of the forward (as ``passes.LEAD``): a batch made
#: right before its forward (h10_lion_subclass: the input and target) stays in it.
HELD_LEAD = 1.0
#: At most this many leading blocks so dropped (as ``passes.TAIL``).
HELD_TAIL = 3


def held_start(made: np.ndarray, freed: np.ndarray, f0: int, top: int, b1: int, min_saved: int) -> int:
    """A pass's forward start without what the loop made long before it and frees only after its
    backward (after the optimizer): data held for the whole step, not an activation. ``passes.forward_start``
    drops such stragglers only from passes that save MIN_SAVED + TAIL blocks; h16_graphsage_sampled's
    save 12, and a block of each step's sampling, 126 events before the forward, began it. ``made``
    (event order) and ``freed``: the blocks alive across the top; else ``f0``."""
    k = 0
    while k < min(HELD_TAIL, len(made) - 1) and freed[k] > b1:
        k += 1
    # ... and the pass without them still saves what a training pass does (``min_saved``: passes.MIN_SAVED;
    # h6_sparse_two_opt's pass inside its optimizer saves 6 and lost a step)
    if k and made[k] > f0 and made[k] - made[k - 1] > HELD_LEAD * (top - made[k]) and len(made) - k >= min_saved:
        return int(made[k])
    return f0


#: Gradients that must live through a pass (made in its step before it, freed after it) for it to be
#: a micro-batch of that step; and fewer new ones than this must it keep (as ``infer.ZERO_GRAD_MIN``).
MIN_CARRIED = 4


def accumulates(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                start: int, f0: int, top: int, b1: int) -> bool:
    """Whether the pass (``f0``, ``top``, ``b1``) adds to gradients its step already made (MIN_CARRIED
    parameter-sized blocks carried through it), so it is one of the step's micro-batches however far apart
    the passes are (GradCache's chunks, accumulation; the rule and its traces: docs/accuracy.md)."""
    n = len(trace)
    made = allocs[np.searchsorted(allocs, start, "left"):np.searchsorted(allocs, f0, "left")]
    carried = made[(free_of[made] > b1) & np.isin(trace.size[made], params)]
    if len(carried) < MIN_CARRIED:
        return False
    if (free_of[carried] < n).sum() < MIN_CARRIED:
        # the last step's are never freed: they count where the loop was seen to free an earlier step's
        # gradients (MIN_CARRIED blocks made before the step, living at least as long as it has so far)
        before = allocs[:np.searchsorted(allocs, start, "left")]
        before = before[(free_of[before] < f0) & (free_of[before] - before >= b1 - start)]
        if np.isin(trace.size[before], params).sum() < MIN_CARRIED:
            return False
    ours = allocs[np.searchsorted(allocs, top, "right"):np.searchsorted(allocs, b1, "right")]
    new = ours[np.isin(trace.size[ours], params) & (free_of[ours] > b1)]
    return len(new) < MIN_CARRIED


#: Share of the allocations before a trace's first pass that must have a parameter's size for them to be
#: the end of an optimizer (the ring buffer wrapped mid-step; ``pass_labels.wrapped_start``): gpt_wrapped
#: 1.0 and h8_mid_step_start 0.84 are; what else frees in bursts there is not: GradCache's no-grad
#: forward (h15_gradcache_contrastive 0.14, its first step read as an optimizer: 4 steps of 3),
#: truth_lbfgs's first closure 0.59, generate()'s rollouts (h16_grpo 0.02), a serving loop 0.0,
#: gpt_ckpt_fused 0.18.
UPDATE_SIZED = 0.75


def update_sized(sizes: np.ndarray, params: np.ndarray) -> bool:
    """Whether blocks of these sizes are an optimizer's (UPDATE_SIZED of them a parameter's size). The
    caller asks only where enough parameter sizes are known (``gradients.MIN_PARAM_SIZES``)."""
    if not len(sizes):
        return True
    return float(np.isin(sizes, params).mean()) >= UPDATE_SIZED
