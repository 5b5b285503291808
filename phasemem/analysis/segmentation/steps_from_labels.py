"""Steps from inferred labels, where no optimizer range was marked: cut between backward passes."""
from __future__ import annotations

import numpy as np

from ...read.trace import Trace
from ...vocab import P
from .. import infer
from ..spans import phase_runs as runs
from .partial import keeps_nothing

#: Optimizers whose step() evaluates the closure more than once.
REEVALUATING = ("torch/optim/lbfgs.py",)


def steps_from_labels(trace: Trace, labels: np.ndarray, starts: list[int] | None, lifetimes,
                      inside: bool = False):
    """Steps from inferred phases. Between two backward passes, a step ends after the optimizer's
    last run; when the optimizer leaves no events (fused, after its first step) it ends right after
    the backward — unless the trace shows optimizer or zero_grad activity between some backward
    passes and not others: those without are micro-batches of one step (gradient accumulation)."""
    n = len(labels)
    big = int(np.iinfo(np.int64).max)
    first, last, code, _ = runs(labels, np.zeros(n, np.int32))
    if not (code == P["backward"]).any():
        starts = None  # no training step to find (see below), whatever the lifetimes' passes say
    if starts is None:
        starts = _starts_between_passes(trace, code, first, last, inside)
    bounds = sorted(set(starts)) + [n]
    bounds = [b for b in bounds if 0 <= b <= n]
    if bounds[0] != 0:
        bounds = [0] + bounds
    steps = [(bounds[k], bounds[k + 1], True) for k in range(len(bounds) - 1) if bounds[k + 1] > bounds[k]]
    steps = _partial_ends(trace, labels, lifetimes, steps)
    ends = [int(trace.time_us[b - 1]) for _, b, _ in steps[:-1]] + [big]
    return steps, list(range(len(steps))), ends


def _starts_between_passes(trace: Trace, code: np.ndarray, first: np.ndarray, last: np.ndarray,
                           inside: bool) -> list[int]:
    """Where each step starts, from the phase runs (``phase_runs``) between two backward passes."""
    bwd_runs = np.flatnonzero(code == P["backward"]).tolist()
    transitions = []
    # LBFGS evaluates its closure (zero_grad, forward, backward) several times in one step: passes
    # whose gap holds no framed event outside its step() are one step (truth_lbfgs: 12 -> 3).
    within, framed = infer.frames.inside_file(trace, REEVALUATING), trace.stack >= 0
    for j, k in zip(bwd_runs[:-1], bwd_runs[1:]):
        between = code[j + 1:k]
        if not (between == P["forward"]).any() and not (between == P["optimizer"]).any() and not (
                between == P["zero_grad"]).any():
            continue  # one backward split by a stray event, not two passes
        if inside and not np.isin(between, [P["forward"], P["loss"]]).any():
            # updates inside one backward (a step per parameter from gradient hooks,
            # h6_optim_in_backward without annotations: 84 steps for 3); frames place forward
            # well enough that a pass without one is none (lifetimes do not: h6_ppo)
            continue
        gap = slice(int(last[j]) + 1, int(first[k]))
        if within[gap].any() and not (framed[gap] & ~within[gap]).any():
            continue  # a closure evaluated again inside the same optimizer step
        opt = np.flatnonzero(between == P["optimizer"])
        cut = int(last[j + 1 + opt[-1]]) + 1 if len(opt) else int(last[j]) + 1
        transitions.append((cut, bool(len(opt) or (between == P["zero_grad"]).any())))
    regular = sum(t for _, t in transitions) >= 2
    cuts = [c for c, t in transitions if t or not regular]
    if not bwd_runs:
        # No backward: inference, a forward-only benchmark, or a layer-by-layer calibration
        # (sqattn_cuda in ../shared/wild runs 28 layers twice each). Nothing tells which forward
        # runs make up one call of the model, so the trace is one step, not one per forward --
        # unless an optimizer runs between forwards: a step ends with each update whose backward
        # the lifetimes did not see (heldout4_gpt_fsdp2_bf16 without frames: FSDP2's all-gathers
        # hide the backward, not the optimizer's bursts).
        cuts = _updates_between_forwards(code, last) if not inside else []
    return [0] + sorted(set(cuts))


def _partial_ends(trace: Trace, labels: np.ndarray, lifetimes, steps: list) -> list:
    """The steps with those at either end marked partial, or dropped when they are no step."""
    # A step is partial when it lacks what every other step has: a first one with no forward (the
    # ring buffer wrapped inside it), a last one with no backward (the trace ends inside it).
    has = [{int(c) for c in np.unique(labels[a:b])} for a, b, _ in steps]
    if len(steps) > 1:
        for k, ph in ((0, P["forward"]), (len(steps) - 1, P["backward"])):
            others = [h for j, h in enumerate(has) if j != k]
            if ph not in has[k] and all(ph in h for h in others) and (k == 0 or P["forward"] in has[k]):
                steps[k] = (steps[k][0], steps[k][1], False)
        a, b, whole = steps[-1]
        if not whole and P["backward"] not in has[-1] and keeps_nothing(trace, lifetimes, a, b):
            steps = steps[:-1]  # an evaluation after the last step (see keeps_nothing)
    return steps


def _updates_between_forwards(code: np.ndarray, last: np.ndarray) -> list[int]:
    """The event after each optimizer run that a forward run follows (the runs of ``phase_runs``)."""
    opt = np.flatnonzero(code[:-1] == P["optimizer"])
    return [int(last[k]) + 1 for k in opt.tolist() if code[k + 1] == P["forward"]]
