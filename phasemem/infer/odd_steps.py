"""Steps of odd shape, read from lifetimes alone: rules for what the passes' reading gets wrong there.

- An embedding's gradient made in chunks after backward's last saved activation is freed
  (``chunked_gradients``): EmbeddingBag's backward sorts and reduces its indices a chunk at a time,
  each chunk making temporaries of the parameters' sizes, freed one by one, and a slice of the table's
  gradient that zero_grad frees with the others.
"""
from __future__ import annotations

import numpy as np

from ..trace import A, Trace

#: Frees at most this many events apart are one run: zero_grad freeing the gradients one after another
#: (each a free_requested/free_completed pair; as ``gradients.FREED_TOGETHER``).
FREED_TOGETHER = 8

#: Chunked gradients a backward must make after its last saved free before it is read as going on:
#: heldout_embbag_adagrad makes 8 (one slice of its 8 embedding tables' gradient a chunk); one such
#: block alone is what ``gradients._late_gradients`` already reads.
MIN_CHUNKS = 2

#: Parameter-sized blocks made in a row, no free between, that are an optimizer's foreach outputs, not
#: a chunk of backward: Adagrad's 8 in heldout_embbag_adagrad; a chunk makes at most 2 (its slice of
#: the gradient, after one of its temporaries) there. As ``lifetimes.MIN_UPDATE_BLOCKS``.
ROW = 4


def chunked_gradients(trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                      top: int, b1: int, ours: np.ndarray, sized: np.ndarray) -> int:
    """Position in ``ours`` (the allocations after ``b1``) of the last gradient a backward makes in
    chunks after its last saved free, else -1.

    A chunk's gradient is a parameter-sized block freed among the pass's own gradients (within
    FREED_TOGETHER of the run of their frees, or, in the last step, never freed like them). Between
    two of them backward frees its chunk's temporaries one at a time; an optimizer instead frees its
    temporaries together, allocating its foreach outputs in a row (ROW), and keeps its state: the
    first such row or state block ends the chunks, and they must come in MIN_CHUNKS groups split by
    frees (heldout_embbag_adagrad: 0.495 of its events right, 404 events of its later backward passes
    read as Adagrad's).
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
    near = ((f >= big[0] - FREED_TOGETHER) & (f <= big[-1] + FREED_TOGETHER)) | (run & (f < n)) if big[0] < n else f >= n
    cand = np.flatnonzero(sized & near)
    if len(cand) < MIN_CHUNKS:
        return -1
    is_free = (trace.action == A["free_completed"]) | (trace.action == A["free"])
    frees_before = np.cumsum(is_free)
    # the optimizer's first sign: state (a parameter-sized block alive past the gradients' frees, not
    # one of them), or ROW parameter-sized blocks made in a row with no free between (foreach outputs)
    stop = sized & ~near & (f > big[0])
    fb = frees_before[ours]
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
