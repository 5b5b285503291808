"""A step's forward run twice: once without grad over the whole batch, then again, a chunk at a time,
with grad (GradCache), told by the no-grad forward repeating the chunks' sizes (docs/accuracy.md,
"Work that is no training step: the rules")."""
from __future__ import annotations

import numpy as np

from ...read.trace import Trace
from ...vocab import P

#: Share of the allocations between an update and the next pass (or before the first) whose sizes the
#: pass's own forward allocates, for that work to be the step's forward run over the same chunks:
#: h15_gradcache_contrastive's no-grad forwards 0.93 (before the first pass) and 0.99.
REPEAT_SHARE = 0.9


def repeats_forward(trace: Trace, allocs: np.ndarray, forward: tuple[int, int], work: tuple[int, int]) -> bool:
    """Whether the allocations strictly inside ``work`` (after, before) are REPEAT_SHARE or more of the
    sizes the pass's ``forward`` (start, top) allocates."""
    made = allocs[np.searchsorted(allocs, work[0], "right"):np.searchsorted(allocs, work[1], "left")]
    own = allocs[np.searchsorted(allocs, forward[0], "left"):np.searchsorted(allocs, forward[1], "right")]
    if not len(made) or not len(own):
        return False
    return float(np.isin(trace.size[made], trace.size[own]).mean()) >= REPEAT_SHARE


def label_reforwards(labels: np.ndarray, ends: list[int]) -> None:
    """After each no-grad forward found (``ends``: where each ended, at its step's first chunk), up to the
    update: the chunks' re-forwards, their surrogate losses and what runs between them are the marks'
    backward (GradCache's second phase: forward and backward again per chunk with the cached gradients),
    read so far as passes of their own."""
    for e in ends:
        upd = np.flatnonzero(labels[e:] == P["optimizer"])
        stop = e + int(upd[0]) if len(upd) else len(labels)
        part = labels[e:stop]
        part[np.isin(part, [P["forward"], P["loss"], P["other"]])] = P["backward"]
