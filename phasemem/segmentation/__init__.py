"""Split a trace into steps and phases from ``record_function`` markers.

Markers become time intervals; an event at time t belongs to an interval [START, END] when
START <= t <= END. Intervals are painted onto the events in start order, outer before inner, so
nested phases resolve to the innermost (Lightning runs forward and backward inside
``optimizer.step(closure)``; the optimizer's own work is what is left).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import numpy as np

from .. import infer
from ..spans import phase_runs
from ..timeline import Lifetimes, lifetimes_of
from ..trace import A, Trace
from ..vocab import MARKED, MARKER_PREFIX, P, PHASES

# The vocabulary lives in vocab.py; these names stay importable from here.
__all__ = ["PHASES", "P", "MARKED", "CONFIDENCE", "Interval", "Segmentation", "segment", "find_intervals", "runs",
           "step_at_time"]
runs = phase_runs

# An inferred phase's confidence: the share of the events it labels that the markers label the same,
# pooled over the 55 real H200 traces of tests/test_infer.py (fixtures/, ../shared, the first four
# held-out sets), measured by docs/eval_inference.py on 2026-12-02 (frames 0.999-1.000, given as 0.99:
# never certain); lifetimes refitted 2026-12-04 after the frameless rules of docs/accuracy.md
# ("Frameless, over every marked trace"), over the traces without doubts (the doubted ones get
# DOUBTFUL): 0.900 / 0.698 / 0.999 / 0.985 / 0.876 there; over all 146 marked traces without doubts
# (docs/eval_frameless.py) 0.93 / 0.71 / 0.996 / 0.97 / 0.855.
# Recompute it there when the inference changes; tests/test_infer.py checks it.
CONFIDENCE = {
    "frames": {"forward": 0.99, "loss": 0.99, "zero_grad": 0.99, "backward": 0.99, "optimizer": 0.99},
    "lifetimes": {"forward": 0.90, "loss": 0.69, "zero_grad": 0.99, "backward": 0.98, "optimizer": 0.87},
}

#: Optimizers whose step() evaluates the closure more than once.
REEVALUATING = ("torch/optim/lbfgs.py",)

_TORCH_ANNOTATIONS = {
    "optimizer": re.compile(r"^Optimizer\.step#"),
    "zero_grad": re.compile(r"^Optimizer\.zero_grad#"),
}


@dataclass
class Interval:
    phase: str
    t0: int  # µs, START
    t1: int  # µs, END
    source: str  # "markers" or "annotations"
    first: int = 0  # first event index inside (searchsorted)
    stop: int = 0  # one past the last event index inside


@dataclass
class Segmentation:
    """Per-event phase codes and step numbers, plus the intervals that made them.

    ``step_of[i]`` is the position in ``steps`` of event i, or -1 for events after the last step.
    """

    labels: np.ndarray  # int8 codes into PHASES
    step_of: np.ndarray  # int32
    steps: list[tuple[int, int, bool]]  # (first event, stop event, complete)
    step_numbers: list[int]  # the training step each entry of ``steps`` is, counting from recording start
    step_t1: np.ndarray  # int64 µs: the time each step ends (its optimizer's END); max int64 when open-ended
    intervals: list[Interval]
    sources: dict[str, str]  # phase → where its boundaries came from
    confidence: dict[str, float] = None  # phase → how sure (1 for markers and annotations)
    # µs: moments up to here belong to steps the ring buffer lost (a phase that ran then is not reported)
    t_lost: int = int(np.iinfo(np.int64).min)
    inferred_by: str | None = None  # "frames" or "lifetimes" where phases were inferred, else None
    # positions in ``steps`` of whole steps that ran no update: a zero_grad discarded their gradients
    skipped: list[int] = field(default_factory=list)
    # why the inferred phases are less sure than CONFIDENCE says (``_doubts``); each lowered to DOUBTFUL
    doubts: list[str] = field(default_factory=list)


def _pair(markers, wanted) -> list[tuple[str, int, int]]:
    """Match START/END per name with a stack; an unmatched START runs to the end of the trace."""
    open_: dict[str, list[int]] = {}
    out = []
    for name, is_start, t in zip(markers.name, markers.start.tolist(), markers.time_us.tolist()):
        phase = wanted(name)
        if phase is None:
            continue
        if is_start:
            open_.setdefault(name, []).append(t)
        elif open_.get(name):
            out.append((phase, open_[name].pop(), t))
    big = np.iinfo(np.int64).max
    out += [(wanted(name), t, big) for name, ts in open_.items() for t in ts]
    return out


def find_intervals(trace: Trace, prefix: str = MARKER_PREFIX) -> tuple[list[Interval], dict[str, str]]:
    """Phase intervals from phasemem's markers, falling back to PyTorch's optimizer annotations."""
    ours = set(MARKED)

    def ours_of(name: str):
        if name.startswith(prefix):
            ph = name[len(prefix):]
            return ph if ph in ours else None
        return None

    def torch_of(name: str):
        for ph, pat in _TORCH_ANNOTATIONS.items():
            if pat.match(name):
                return ph
        return None

    found = [Interval(ph, t0, t1, "markers") for ph, t0, t1 in _pair(trace.markers, ours_of)]
    have = {iv.phase for iv in found}
    sources = {ph: "markers" for ph in have}
    # PyTorch's own ranges count beside ours: instrument() leaves a torch.optim optimizer's step and
    # zero_grad to them, while still marking model.zero_grad(); one nested in ours is the same call.
    torch_ranges = [Interval(ph, t0, t1, "annotations") for ph, t0, t1 in _pair(trace.markers, torch_of)]
    for iv in torch_ranges:
        sources.setdefault(iv.phase, "annotations")
    return found + torch_ranges, sources


def _outermost(ivs: list[Interval]) -> list[Interval]:
    """Drop intervals nested in another of the same list (a wrapper optimizer calling an inner one)."""
    out: list[Interval] = []
    for iv in sorted(ivs, key=lambda i: (i.t0, -i.t1)):
        if out and iv.t1 <= out[-1].t1:
            continue
        out.append(iv)
    return out


def segment(trace: Trace, prefix: str = MARKER_PREFIX, timeline=None, lifetimes_given=None) -> Segmentation:
    """Label every event with its phase and step; without forward/backward markers, infer them
    (from frames, else from lifetimes, which needs ``timeline``). ``lifetimes_given``: the trace's
    Lifetimes where there is no timeline (a step index reads only those).

    Example:
        >>> seg = segment(Trace.from_snapshot(snap))
        >>> PHASES[seg.labels[100]], seg.step_of[100]
    """
    t = trace.time_us
    n = len(trace)

    @functools.cache
    def lifetimes() -> Lifetimes:  # which block each free frees: built only where a rule below asks
        if timeline is not None:
            return timeline.lifetimes
        return lifetimes_given if lifetimes_given is not None else lifetimes_of(trace)

    intervals, sources = find_intervals(trace, prefix)
    for iv in intervals:
        iv.first = int(np.searchsorted(t, iv.t0, "left"))
        iv.stop = int(np.searchsorted(t, iv.t1, "right"))

    # The loss: events after the model's forward ends and before the next backward begins.
    fwd_ends = np.sort([iv.t1 for iv in intervals if iv.phase == "forward"])
    bwd = sorted((iv for iv in intervals if iv.phase == "backward"), key=lambda i: i.t0)
    prev_bwd_end = np.iinfo(np.int64).min
    loss = []
    for b in bwd:
        k = np.searchsorted(fwd_ends, b.t0, "left") - 1
        if k >= 0 and fwd_ends[k] > prev_bwd_end:
            iv = Interval("loss", int(fwd_ends[k]), b.t0, sources.get("forward", "markers"))
            # open at both ends: the forward's last event and the backward's first are not the loss
            iv.first = int(np.searchsorted(t, iv.t0, "right"))
            iv.stop = int(np.searchsorted(t, iv.t1, "left"))
            loss.append(iv)
        prev_bwd_end = max(prev_bwd_end, b.t1)
    if loss:
        sources["loss"] = loss[0].source
    intervals = intervals + loss

    labels = np.zeros(n, dtype=np.int8)
    for iv in sorted(intervals, key=lambda i: (i.t0, -i.t1)):
        labels[iv.first:iv.stop] = P[iv.phase]

    confidence = {ph: 1.0 for ph in sources}
    marked = any(iv.source == "markers" and iv.phase in ("forward", "backward") for iv in intervals)
    how = None
    if not marked and n:
        labels, how, starts = _infer(trace, timeline, labels,
                                     [ph for ph, src in sources.items() if src == "annotations"])
        for code in np.unique(labels).tolist():
            ph = PHASES[code]
            if ph != "other" and ph not in sources:
                sources[ph] = "inferred"
                confidence[ph] = CONFIDENCE.get(how, {}).get(ph, 0.5)
    if not marked and n and not any(iv.phase == "optimizer" for iv in intervals):
        steps, numbers, ends = _steps_from_labels(trace, labels, starts, lifetimes, inside=how == "frames")
    else:
        # only labels from markers or frames place a backward well enough to see an update inside it
        steps, numbers, ends = _steps(trace, intervals, labels, lifetimes, inside=marked or how == "frames")
    steps = _cut_by_oom(trace, labels, steps)
    doubts = _doubts(trace, timeline, labels, steps) if how == "lifetimes" else []
    for ph in [p for p, src in sources.items() if src == "inferred"] if doubts else []:
        confidence[ph] = min(confidence[ph], DOUBTFUL.get(ph, 1.0))
    numbers = [window_first(trace.meta) + k for k in numbers]
    step_of = np.full(n, -1, dtype=np.int32)
    for k, (a, b, _) in enumerate(steps):
        step_of[a:b] = k
    lost = [iv.t1 for iv in _outermost([iv for iv in intervals if iv.phase == "optimizer"]) if iv.stop == 0]
    # whole steps that no optimizer range ends (_split_skipped made them)
    stops = np.sort([iv.stop for iv in intervals if iv.phase == "optimizer"])
    skipped = []
    if len(stops) and steps:
        a, b = np.array([s[0] for s in steps]), np.array([s[1] for s in steps])
        ended = np.searchsorted(stops, b, "right") > np.searchsorted(stops, a, "right")
        skipped = [k for k in np.flatnonzero(~ended).tolist() if steps[k][2]]
    return Segmentation(labels, step_of, steps, numbers, np.array(ends, dtype=np.int64), intervals, sources,
                        confidence, max(lost) if lost else int(np.iinfo(np.int64).min),
                        how if how in ("frames", "lifetimes") else None, skipped, doubts)


#: An inferred phase's confidence where the lifetimes contradict themselves (``_doubts``): the pooled
#: precision of each phase over the 15 of 146 marked traces so flagged (docs/eval_frameless.py,
#: 2026-12-04: forward 0.362, optimizer 0.273; their loss 0.75, backward 0.97 and zero_grad 0.97 are
#: no worse than elsewhere and keep CONFIDENCE's; the 131 others: forward 0.944, optimizer 0.875).
DOUBTFUL = {"forward": 0.36, "optimizer": 0.27}


def _doubts(trace: Trace, timeline, labels: np.ndarray, steps: list) -> list[str]:
    """Why phases read from lifetimes alone are less sure than usual, on evidence that contradicts them
    (each lowers the inferred forward and optimizer to DOUBTFUL; the labels stay):

    - a trace read without a backward whose lifetimes show gradients kept past a pass or an
      optimizer's bursts between passes (h10_shampoo_subclass, h7_capturable_adam, FSDP2): a training
      loop whose passes were not found;
    - whole steps that do not follow one order of phases (a GAN's turns, LBFGS's closure evaluated
      again, an evaluation loop between steps): what a step is, is a guess.
    """
    out = []
    if not (labels == P["backward"]).any() and timeline is not None and (
            (labels == P["optimizer"]).any() or infer.lifetimes.gradients_unplaced(trace, timeline)):
        out.append("the trace shows a training loop's gradients or updates, but no backward was placed")
    whole = [(a, b) for a, b, complete in steps if complete]
    orders = set()
    for a, b in whole[1:-1] if len(whole) > 2 else whole:
        _, _, code, _ = runs(labels[a:b], np.zeros(b - a, np.int32))
        code = code[code != P["other"]]
        orders.add(tuple(code[np.concatenate([[True], code[1:] != code[:-1]])].tolist()) if len(code) else ())
    # ... and whole steps after the first hold different numbers of backward runs (LBFGS evaluating its
    # closure again: 2, 4 and 3 in truth_lbfgs; a GAN's turns); accumulation holds the same number each
    bwd_runs = set()
    for a, b in whole[1:]:
        _, _, code, _ = runs(labels[a:b], np.zeros(b - a, np.int32))
        bwd_runs.add(int((code == P["backward"]).sum()))
    if len(orders) > 1 or len(bwd_runs) > 1:
        out.append("the steps found do not follow one order of phases")
    return out


def _infer(trace: Trace, timeline, labels: np.ndarray, annotated=()) -> tuple[np.ndarray, str, list[int] | None]:
    """Inferred labels where annotations left 'other'; how they were inferred; step starts if known."""
    if infer.has_usable_frames(trace):
        inferred, how, starts = infer.labels_from_frames(trace, timeline), "frames", None
    elif timeline is not None:
        inferred, starts = infer.labels_from_lifetimes(trace, timeline)
        how = "lifetimes"
    else:
        return labels, "none", None
    # PyTorch's own optimizer/zero_grad annotations stay authoritative, except for the phases they
    # nest: optimizer.step(closure) (Lightning, LBFGS) runs zero_grad, forward, the loss and backward
    # inside torch's Optimizer.step range, and those win there, as nested markers do.
    nested = (labels == P["optimizer"]) & np.isin(inferred, [P["forward"], P["backward"], P["zero_grad"]])
    keep = (labels != P["other"]) & ~nested
    merged = np.where(keep, labels, inferred).astype(np.int8)
    infer.finish(trace, timeline, merged)
    # ... for the phases they cover: none of those outside them
    for ph in annotated:
        merged[(merged == P[ph]) & ~keep & ~nested] = P["other"]
    merged[keep & (merged != P["loss"])] = labels[keep & (merged != P["loss"])]
    return merged, how, starts


def _steps_from_labels(trace: Trace, labels: np.ndarray, starts: list[int] | None, lifetimes,
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
        starts = [0] + sorted(set(cuts))
    bounds = sorted(set(starts)) + [n]
    bounds = [b for b in bounds if 0 <= b <= n]
    if bounds[0] != 0:
        bounds = [0] + bounds
    steps = [(bounds[k], bounds[k + 1], True) for k in range(len(bounds) - 1) if bounds[k + 1] > bounds[k]]
    # A step is partial when it lacks what every other step has: a first one with no forward (the
    # ring buffer wrapped inside it), a last one with no backward (the trace ends inside it).
    has = [{int(c) for c in np.unique(labels[a:b])} for a, b, _ in steps]
    if len(steps) > 1:
        for k, ph in ((0, P["forward"]), (len(steps) - 1, P["backward"])):
            others = [h for j, h in enumerate(has) if j != k]
            if ph not in has[k] and all(ph in h for h in others) and (k == 0 or P["forward"] in has[k]):
                steps[k] = (steps[k][0], steps[k][1], False)
        a, b, whole = steps[-1]
        if not whole and P["backward"] not in has[-1] and _keeps_nothing(trace, lifetimes, a, b):
            steps = steps[:-1]  # an evaluation after the last step (see _keeps_nothing)
    ends = [int(trace.time_us[b - 1]) for _, b, _ in steps[:-1]] + [big]
    return steps, list(range(len(steps))), ends


def _updates_between_forwards(code: np.ndarray, last: np.ndarray) -> list[int]:
    """The event after each optimizer run that a forward run follows (the runs of ``phase_runs``)."""
    opt = np.flatnonzero(code[:-1] == P["optimizer"])
    return [int(last[k]) + 1 for k in opt.tolist() if code[k + 1] == P["forward"]]


#: Forward passes after the last step are taken for an evaluation only when they allocate at least this
#: many blocks (a model's worth of work; h9_train_eval_interleaved's two batches make ~400): a trace
#: cut in the first layers of a training forward may have freed the few it made.
EVAL_MIN_ALLOCS = 16
#: ... and keep at most this share of the bytes they allocate (h9_train_eval_interleaved keeps its last
#: batch, 64 KiB of ~1.6 GiB allocated; a training forward keeps its activations for backward).
EVAL_KEPT_SHARE = 0.05


def _keeps_nothing(trace: Trace, lifetimes, a: int, b: int) -> bool:
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


def step_at_time(seg: Segmentation, t: int) -> int:
    """The step a moment belongs to (-1 after the last step): what places a phase that made no event."""
    if t <= seg.t_lost:
        return -1
    k = int(np.searchsorted(seg.step_t1, t, "left"))
    return k if k < len(seg.steps) else -1


def _steps(trace: Trace, intervals: list[Interval], labels: np.ndarray, lifetimes,
           inside: bool = True) -> tuple[list, list, list]:
    """Steps end where an optimizer step ends; without an optimizer, each forward starts one; a
    step whose update was skipped ends where the next zero_grad discards its gradients."""
    big, n = int(np.iinfo(np.int64).max), len(labels)
    opt = _outermost([iv for iv in intervals if iv.phase == "optimizer"])
    if opt:
        # A step whose optimizer finished before the first recorded event was lost to the ring buffer.
        lost = sum(1 for iv in opt if iv.stop == 0)
        kept = _one_per_step([iv for iv in opt if iv.stop > 0], labels, inside)
        bounds = [0] + [iv.stop for iv in kept]
        steps = [(bounds[k], bounds[k + 1], kept[k].t1 != big) for k in range(len(kept))]
        ends = [iv.t1 for iv in kept]
        steps, ends = _split_skipped(trace, lifetimes, intervals, labels, steps, ends, bounds)
        if steps and lost:
            steps[0] = (steps[0][0], steps[0][1], False)
        # A first step with no forward where every other has one began before the trace did
        # (h8_mid_step_start: recording started between a forward and its backward).
        if len(steps) > 1 and steps[0][2]:
            fwd = [bool((labels[a:b] == P["forward"]).any()) for a, b, _ in steps]
            if not fwd[0] and all(fwd[1:]):
                steps[0] = (steps[0][0], steps[0][1], False)
        tail = labels[bounds[-1]:]
        # Training work after the last optimizer step is a step the trace cut short; a zero_grad or
        # logging after it is not a step, nor the end of a backward whose optimizer ran inside it
        # (h6_optim_in_backward: the graph freed after the last update). Every step starts with a
        # forward, where forwards are labelled at all.
        work = [P["forward"], P["loss"]] if np.isin(labels, [P["forward"], P["loss"]]).any() else [
            P["forward"], P["loss"], P["backward"]]
        # ... but not forward passes that keep nothing (an evaluation after the last update)
        if len(tail) and np.isin(tail, work).any() and (
                (tail == P["backward"]).any() or not _keeps_nothing(trace, lifetimes, bounds[-1], n)):
            steps.append((bounds[-1], n, False))
            ends.append(big)
        return steps, list(range(lost, lost + len(steps))), ends
    fwd = _outermost([iv for iv in intervals if iv.phase == "forward"])
    if fwd:
        # Each forward starts a step; events before the first forward belong to the first step.
        starts = sorted({(iv.first, iv.t0) for iv in fwd if iv.first < n})[1:]
        starts = [(a, t0) for a, t0 in starts if a > 0]
        bounds = [0] + [a for a, _ in starts] + [n]
        steps = [(bounds[k], bounds[k + 1], True) for k in range(len(bounds) - 1)]
        return steps, list(range(len(steps))), [t0 - 1 for _, t0 in starts] + [big]
    return [(0, n, True)], [0], [big]


def _split_skipped(trace: Trace, lifetimes, intervals: list[Interval], labels: np.ndarray, steps: list,
                   ends: list, bounds: list[int]) -> tuple[list, list]:
    """Split off the iterations that ran no optimizer update.

    ``GradScaler.step`` skips ``optimizer.step()`` while the scaled gradients overflow (the first
    iterations of a run with a large initial scale): no ``Optimizer.step`` range, but a zero_grad
    that frees the gradients the skipped iteration's backward made, then another forward and
    backward. Gradient accumulation has a forward and backward between two updates too, but no
    zero_grad between them; a zero_grad inside an optimizer's range is a closure's
    (``optimizer.step(closure)``, LBFGS). The zero_grad must free a block its previous backward pass
    made: a second optimizer's zero_grad that frees nothing of it (a GAN clearing the generator's
    gradients between the critic's backward and its own) is not the end of an iteration
    (h9_scaler_skips_first: 3 steps for 5 iterations, the first holding three, before)."""
    outer = _outermost([iv for iv in intervals if iv.phase == "optimizer"])
    o_t0, o_t1 = np.array([o.t0 for o in outer], np.int64), np.array([o.t1 for o in outer], np.int64)

    def in_optimizer(iv):
        k = int(np.searchsorted(o_t0, iv.t0, "right")) - 1
        return k >= 0 and iv.t1 <= o_t1[k]

    zg = [iv for iv in intervals if iv.phase == "zero_grad" and iv.stop > iv.first and not in_optimizer(iv)]
    if not zg:
        return steps, ends
    first, last, code, _ = runs(labels, np.zeros(len(labels), np.int32))
    bw_first, bw_last = first[code == P["backward"]], last[code == P["backward"]]
    fl = np.isin(code, [P["forward"], P["loss"]])
    fl_first = first[fl]
    bounds = np.asarray(bounds, np.int64)  # searched once per zero_grad: not a list converted each time
    cuts = []
    for z in zg:
        kb = int(np.searchsorted(bw_last, z.first, "left")) - 1
        if kb < 0 or kb + 1 >= len(bw_first) or z.stop > bw_first[kb + 1]:
            continue
        prev_end, next_start = int(bw_last[kb]), int(bw_first[kb + 1])
        j = int(np.searchsorted(bounds, prev_end, "right"))
        if j < len(bounds) and bounds[j] <= next_start:
            continue  # an update ended a step between the two passes
        lo = int(np.searchsorted(fl_first, prev_end, "right"))
        if lo >= len(fl_first) or fl_first[lo] >= next_start:
            continue  # no forward between the two passes
        # the previous pass: back to the forward or loss before it
        pass_first = int(fl_first[lo - 1]) if lo else 0
        if not _frees_made_in(trace, lifetimes(), z.first, z.stop, pass_first, prev_end, labels):
            continue
        cuts.append(min(int(fl_first[lo]), z.first))
    if not cuts:
        return steps, ends
    t = trace.time_us
    out, out_ends = [], []
    for (a, b, complete), end in zip(steps, ends):
        inner = sorted(c for c in set(cuts) if a < c < b)
        for lo, hi in zip([a] + inner, inner):
            out.append((lo, hi, True))
            out_ends.append(int(t[hi - 1]))
        out.append(((inner[-1] if inner else a), b, complete))
        out_ends.append(end)
    return out, out_ends


def _frees_made_in(trace: Trace, life: Lifetimes, z0: int, z1: int, p0: int, p1: int, labels: np.ndarray) -> bool:
    """Whether events z0..z1-1 free a block allocated in backward between events p0 and p1."""
    made = np.flatnonzero((trace.action[p0:p1 + 1] == A["alloc"]) & (labels[p0:p1 + 1] == P["backward"])) + p0
    freed = life.free_of(made)
    return bool(((freed >= z0) & (freed < z1)).any())

def _one_per_step(opt: list[Interval], labels: np.ndarray, inside: bool = True) -> list[Interval]:
    """The optimizer ranges that end a step: of those that are one step's, the last.

    Two ranges are one step's when no forward or loss lies between them and either nothing does (two
    optimizers stepped one after the other: a sparse and a dense one, h6_sparse_two_opt) or the first
    sits inside a backward, which goes on after it (per-parameter updates from post-accumulate-grad
    hooks, torchtune's pattern, h6_optim_in_backward: 53 ranges a step, on the autograd thread, kept
    in a plain recording, a zero_grad range after each). A zero_grad between ranges that are not
    inside a backward starts another step (h6_ppo without frames: the lifetimes miss some forwards,
    the zero_grad annotation does not); a range holding a forward (``optimizer.step(closure)``)
    starts its own. ``inside``: whether the labels place backward well enough to tell an update
    inside it (markers or frames); phases from lifetimes alone label a whole forward and backward
    'backward' (h6_ppo without frames), so there only back-to-back ranges are merged."""
    if len(opt) < 2:
        return opt
    # by the phase runs, not per-event running sums: four of those are 320 MB at 10M events
    first, last, code, _ = runs(labels, np.zeros(len(labels), np.int32))
    at = {ph: (first[code == P[ph]], last[code == P[ph]]) for ph in ("forward", "loss", "backward", "zero_grad")}
    # the runs that say where in a step an event is (not the optimizer's, zero_grad's or other)
    sig = np.isin(code, [P["forward"], P["loss"], P["backward"]])
    sig_first, sig_last, sig_code = first[sig], last[sig], code[sig]

    def has(ph, a, b):  # any event labelled ph in a..b-1
        f, l = at[ph]
        k = int(np.searchsorted(l, a, "left"))
        return a < b and k < len(f) and int(f[k]) < b

    other_first, other_last = first[code == P["other"]], last[code == P["other"]]

    def inside_backward(iv):
        # the last such run starting before the range, and the first holding an event at or after it,
        # both backward, with nothing unplaced between them and the range: a compiled step's forward
        # leaves its allocations 'other' between two backward runs (h8_compile_reduce_overhead)
        k = int(np.searchsorted(sig_first, iv.first))
        if k == 0 or sig_code[k - 1] != P["backward"]:
            return False
        nxt = k - 1 if sig_last[k - 1] >= iv.first else k
        if nxt >= len(sig_code) or sig_code[nxt] != P["backward"]:
            return False
        lo, hi = int(min(sig_last[k - 1], iv.first)), int(max(sig_first[nxt], iv.stop))
        j = int(np.searchsorted(other_last, lo, "left"))
        return not (j < len(other_first) and int(other_first[j]) < hi)

    out = []
    for iv, nxt in zip(opt, opt[1:]):
        a, b = iv.stop, nxt.first
        if has("forward", a, nxt.stop) or has("loss", a, nxt.stop):
            out.append(iv)
        elif not has("backward", a, b) and not has("zero_grad", a, b):
            continue  # back to back: one step's optimizers
        elif inside and inside_backward(iv):
            continue  # an update inside backward
        else:
            out.append(iv)
    return out + [opt[-1]]


def _cut_by_oom(trace: Trace, labels: np.ndarray, steps: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
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


def window_first(meta: dict) -> int:
    """The training step a step window began at (``instrument(steps="10-12")``, the trainer
    callbacks: snapshot["phasemem"]["steps"]), so that its steps are numbered as the loop numbered
    them; 0 for a recording of the loop from its start."""
    steps = meta.get("steps") if isinstance(meta, dict) else None
    if isinstance(steps, (list, tuple)) and steps and isinstance(steps[0], int) and steps[0] > 0:
        return steps[0]
    return 0
