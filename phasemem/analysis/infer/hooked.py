"""An optimizer run inside backward, one parameter at a time (post-accumulate-grad hooks): each hook
shows as a run of gradient-sized blocks made and freed right before the gradient itself is freed
(how it looks in the lifetimes: docs/accuracy.md).
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..spans import phase_runs as runs
from ..timeline import Timeline
from .gradients import covers_parameters, parameter_sizes

#: Blocks of the gradient's size a hook must allocate before freeing it: Adam makes two temporaries
#: (h6_optim_in_backward); a backward's own blocks of a weight's size come one at a time.
HOOK_BLOCKS = 2
#: Hooked updates a backward run must hold before any is believed (one per trainable parameter with
#: state): h6_optim_in_backward shows 37 a backward (0.55 of its events right without them); the most
#: found in another trace's backward is 11 (heldout2_mixtral_moe, whose optimizer runs after it).
MIN_HOOKS = 12

_SEGMENT = (A["segment_alloc"], A["segment_free"], A["segment_map"], A["segment_unmap"])


def hooked_updates(trace: Trace, tl: Timeline, labels: np.ndarray) -> None:
    """Label each hooked update inside a backward run optimizer, and its gradient's free zero_grad:
    only in a trace read with backward runs and no optimizer, where every backward run holds
    MIN_HOOKS of them or more, of enough of the parameters' sizes."""
    if (labels == P["optimizer"]).any() or not (labels == P["backward"]).any():
        return
    params = parameter_sizes(tl)
    found = [_hooks_in(trace, tl, labels, params, first, last)
             for first, last, code, _ in zip(*runs(labels, np.zeros(len(labels), np.int32))) if code == P["backward"]]
    if not found or min(len(h) for h in found) < MIN_HOOKS:
        return
    hooks = [h for each in found for h in each]
    if not covers_parameters(params, trace.size[[free for _, free in hooks]]):
        return
    for start, free in hooks:
        labels[start:free - 1] = P["optimizer"]
        labels[free - 1:free + 1] = P["zero_grad"]


def _hooks_in(trace: Trace, tl: Timeline, labels: np.ndarray, params: np.ndarray, first: int,
              last: int) -> list[tuple[int, int]]:
    """(first event of the update, the gradient's free_completed) of each hook between ``first`` and
    ``last``: a gradient (a parameter's size) made earlier in this backward, freed (free_requested,
    free_completed) right after HOOK_BLOCKS or more allocations of its size, with only its size (or
    segment events) between; a free there of what was made before them is an earlier hook's gradient,
    and ends the update."""
    life = tl.lifetimes
    made_at = np.full(len(trace) + 1, -2, np.int64)  # free event -> its block's alloc event
    made_at[life.free_event] = life.alloc_event
    freed = ((life.free_event > first) & (life.free_event <= last) & (life.alloc_event >= first)
             & np.isin(life.size, params))
    out: list[tuple[int, int]] = []
    order = np.argsort(life.free_event[freed], kind="stable")
    for a, f in zip(life.alloc_event[freed][order].tolist(), life.free_event[freed][order].tolist()):
        if trace.action[f - 1] != A["free_requested"] or trace.addr[f - 1] != trace.addr[f]:
            continue
        k = f - 2
        while k > a and (trace.action[k] in _SEGMENT or trace.size[k] == trace.size[f]):
            k -= 1
        run = np.arange(k + 1, f - 1)
        done = run[(trace.action[run] == A["free_completed"]) & (made_at[run] <= k)]
        start = int(done.max()) + 1 if len(done) else k + 1
        if ((trace.action[start:f - 1] == A["alloc"]).sum() >= HOOK_BLOCKS and labels[start] == P["backward"]
                and (not out or start > out[-1][1])):
            out.append((start, f))
    return out
