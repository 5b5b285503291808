"""Steps that are not whole, and work that is no step: a step an out-of-memory error cut short, and
forward passes after the last step that keep nothing (an evaluation or inference)."""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P

#: Forward passes after the last step are taken for an evaluation only when they allocate at least this
#: many blocks (a model's worth of work; h9_train_eval_interleaved's two batches make ~400): a trace
#: cut in the first layers of a training forward may have freed the few it made.
EVAL_MIN_ALLOCS = 16
#: ... and keep at most this share of the bytes they allocate (h9_train_eval_interleaved keeps its last
#: batch, 64 KiB of ~1.6 GiB allocated; a training forward keeps its activations for backward).
EVAL_KEPT_SHARE = 0.05


def keeps_nothing(trace: Trace, lifetimes, a: int, b: int) -> bool:
    """Whether events a..b-1 free (nearly) every block they allocate. A training step the trace cut short
    holds its forward's activations for a backward that never came; forward passes without backward
    that end where they began are an evaluation or inference after the last step, no step
    (h9_train_eval_interleaved: a no-grad evaluation after the last update was a "partial step")."""
    if any(a <= e < b for e in trace.oom_device_free):
        return False  # an out-of-memory error cut the step short and unwound what it held (hf_oom)
    made = np.flatnonzero(trace.action[a:b] == A["alloc"]) + a
    if len(made) < EVAL_MIN_ALLOCS:
        return False
    size = trace.size[made].astype(np.int64)
    kept = lifetimes().free_of(made) >= b
    # what is left is the loop's last batch (an evaluation's inputs stay referenced), not activations
    return int(size[kept].sum()) <= EVAL_KEPT_SHARE * int(size.sum())


def cut_by_oom(trace: Trace, labels: np.ndarray, steps: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
    """A step that an out-of-memory error cut short is not whole: no optimizer ran after it in the step
    (fixtures/oom: the program caught the error and stopped recording in the middle of the loss or backward)."""
    ooms = sorted(trace.oom_device_free)
    if not ooms:
        return steps
    out = []
    for a, b, complete in steps:
        cut = any(a <= e < b and not (labels[e:b] == P["optimizer"]).any() for e in ooms)
        out.append((a, b, complete and not cut))
    return out
