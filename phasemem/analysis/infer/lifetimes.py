"""Steps and phases from lifetimes alone (snapshots recorded with ``context=None``, or stripped).

A step repeats the same allocation sizes; inside it, forward/backward is a mountain of
activations; what follows backward is the optimizer. docs/accuracy.md describes every rule and
how accurate they are.
"""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..timeline import Timeline
from .anchored import anchored_passes
from .bursts import BURST, burst_freed
from .cached import label_reforwards, repeats_forward
from .gradients import MIN_PARAM_SIZES, SCALAR, keeps_gradients, makes_gradients, parameter_sizes
from .hooked import hooked_updates
from .loss import graphed_steps, seeded_steps
from .odd_steps import accumulates, earlier_top
from .other_work import InputGradients, covers_an_update, stopped_step, unfinished_forwards
from .pass_labels import (
    Work,
    backward_goes_on,
    label_after_backward,
    label_refused,
    label_training_pass,
    update_going_on,
    wrapped_start,
)
from .passes import MIN_SAVED, candidate_periods, has_backward, mountains, passes
from .seed import all_seeded, reseat
from .sharded import sharded_passes


def labels_from_lifetimes(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int]]:
    """Phase codes per event and step starts (event indices) from lifetimes alone."""
    labels, starts, anchored, _ = _read(trace, tl)
    if anchored is None:
        unfinished_forwards(trace, tl, burst_freed(trace), labels)
    else:
        labels, starts = anchored[:2]
    # Where no pass read frees what a forward saved, the loss may still anchor them (FSDP: infer/sharded.py)
    if _saved_explained(trace, tl, labels) < MIN_SAVED:
        sharded = sharded_passes(trace, tl)
        if sharded is not None:
            labels, starts = sharded
    # Read as no training at all: a graphed model's backward may still show its seed (an MSE loss)
    seeded = None if (labels == P["backward"]).any() else seeded_steps(trace, tl)
    if seeded is not None:
        labels, starts = seeded
    hooked_updates(trace, tl, labels)
    return labels, stopped_step(trace, labels, starts)


def anchored_over_passes(trace: Trace, tl: Timeline) -> bool:
    """Whether the gradients' anchored reading replaced passes that read as training, with a different
    number of steps: the passes held more or fewer backward runs a step than the gradients' sets (h6_ppo's
    epochs: 7 steps read, 16 anchored), so what a step is, is a guess."""
    _, starts, anchored, overruled = _read(trace, tl)
    return overruled and anchored is not None and len(anchored[1]) != len(starts)


def _read(trace: Trace, tl: Timeline) -> tuple[np.ndarray, list[int], tuple | None, bool]:
    """The passes' labels and step starts, the gradients' anchored reading where it replaces them, and
    whether it overrules passes read as training (``EXPLAINS``)."""
    n_alloc = max(int((trace.action == A["alloc"]).sum()), 1)
    tries = []
    # Longest regular period first. A step holds its forward and backward: a period shorter than
    # the training passes it yields is a layer's, not a step's (in a trace of barely one step only
    # a layer's period is visible); then the next, then none.
    for period in candidate_periods(trace) + [None]:
        period_events = period * len(trace) / n_alloc if period else None
        labels, starts, lengths, tops = _label_passes(trace, tl, period_events, fill=False)
        if lengths and (period_events is None or np.median(lengths) <= period_events):
            break
        tries.append(period_events)
    else:
        # Cross-entropy's fingerprint before an optimizer's bursts is a CUDA-graphed step only where
        # no pass of the model's own is seen: a graph replays forward and backward without events, so
        # nothing is saved for a backward (odd_cudagraph, heldout2_encoder_cudagraphs: no pass with
        # saved activations). A trace whose passes were all rejected (no gradient kept: DDP's bucket
        # views, an out-of-memory error) has such passes, and is not graphed.
        graphed = None if _has_saved_passes(trace, tl) else graphed_steps(trace, tl)
        # ... nor where gradients are made, kept through an update and freed together: a graph keeps
        # them in its pool, without events (h6_save_on_cpu: its forward saves to the host, so no pass
        # shows, but each backward's gradients anchor it; infer/anchored.py)
        anchored = anchored_passes(trace, tl) if graphed is not None else None
        if graphed is not None and anchored is not None:  # anchored is read only where graphed is
            return *graphed, anchored, False
        if graphed is not None:
            return *graphed, None, False
        period_events = tries[0]
    if period_events is None:
        # No regular period (batches of varying length): the tops' usual spacing stands in for
        # it, so that what a loop holds for a whole step (the loss, kept for logging) is not
        # taken for an activation. (The last trial was the one without a period: its tops.)
        if len(tops) >= 3:
            est = float(np.median(np.diff(tops)))
            lengths2 = _label_passes(trace, tl, est, fill=False)[2]
            if lengths2 and np.median(lengths2) <= est:
                period_events = est
    moved: list[int] = []
    cached: list[int] = []
    labels, starts = _label_passes(trace, tl, period_events, moved=moved, cached=cached)[:2]
    if not (labels == P["backward"]).any():
        # No pass reads as training: a tiny model's gradients may still anchor its backward runs
        # (infer/anchored.py).
        return labels, starts, anchored_passes(trace, tl), False
    # Where passes were read, the gradients' reading overrules them only where it explains far more
    # of what was saved (EXPLAINS): MAML's inner autograd.grad updates make sets of their own.
    anchored = anchored_passes(trace, tl)
    # ... not where every backward run begins at its seed (infer/seed.py), as many as the gradients';
    # and against the passes as their tops were found: a top moved back (odd_steps.earlier_top) makes them
    # explain more, but not a pass the gradients' reading tells better (h8_weight_norm's optimizer)
    found = _label_passes(trace, tl, period_events, move_tops=False)[0] if anchored is not None and moved else labels
    if anchored is not None and not all_seeded(trace, tl, labels, anchored[0]) and \
            _saved_explained(trace, tl, anchored[0]) >= EXPLAINS * _saved_explained(trace, tl, found):
        return labels, starts, anchored, True
    label_reforwards(labels, cached)  # after the readings were weighed: the marks' backward saves nothing
    return labels, starts, None, False


#: Where passes were read, the gradients' anchored reading (infer/anchored.py) replaces them only if
#: it explains this many times as many saved activations (blocks its forward or loss makes and its
#: backward frees): then the mountains' tops fell inside backward or the optimizer. h8_weight_norm 1.18
#: (0.68 -> 0.88), h6_ppo 5.0 (7 -> 16 steps, of 16); of the other 70 traces with both readings none is
#: above 1.08 (h5_vae_handadam, which would gain, and h10_reentrant_ckpt, which would lose), the
#: passes read well 0.2-1.07, MAML (its inner autograd.grad updates make sets of their own) 0.15.
EXPLAINS = 1.15


def _saved_explained(trace: Trace, tl: Timeline, labels: np.ndarray) -> int:
    """Blocks made in a forward (or its loss) and freed in a backward, under ``labels``."""
    n = len(trace)
    allocs = np.flatnonzero(trace.action == A["alloc"])
    fo = tl.freed_at[allocs]
    made, freed = allocs[fo < n], fo[fo < n]
    return int((np.isin(labels[made], [P["forward"], P["loss"]]) & (labels[freed] == P["backward"])).sum())


#: Activations a pass must save to be a training pass where another pass of the trace plainly is one
#: (MIN_SAVED of them): a checkpointed model's second micro-batch saves 8 (heldout3_neox_hfckpt_accum2).
MIN_SAVED_PEER = 4


#: Passes closer together than this share of a step's period are micro-batches of one step
#: (gradient accumulation): gpt_forloop_accum's and gpt_fp16_accum's passes are 0.25-0.5 of a period
#: apart, separate steps of the fixtures at least 0.9.
MICROBATCH_SHARE = 0.8


def _label_passes(trace: Trace, tl: Timeline, period_events: float | None, fill: bool = True, move_tops: bool = True,
                  moved: list[int] | None = None,
                  cached: list[int] | None = None) -> tuple[np.ndarray, list[int], list[int], list[int]]:
    """Labels, step starts, the length in events of each training pass found, and every pass's top. Tops
    found inside a backward are moved back (``odd_steps.earlier_top``) with ``move_tops``, each appended
    to ``moved`` if given; where each no-grad forward run again ended (``Work.cached``) to ``cached``."""
    n = len(trace)
    labels = np.zeros(n, np.int8)
    mts = mountains(trace, tl, period_events, fill)
    if not mts:
        return labels, [0], [], []
    mts, seeds, graded = reseat(trace, tl, passes(trace, tl, mts))
    la, lf = tl.lifetimes.alloc_event[tl.lifetimes.paired], tl.lifetimes.free_event[tl.lifetimes.paired]
    w = Work(trace, tl.freed_at, np.flatnonzero(trace.action == A["alloc"]), parameter_sizes(tl), burst_freed(trace))
    # A trace trains only if some backward leaves gradients behind: parameter-sized blocks made
    # after a top that outlive its pass (until zero_grad, or for good), or a seeded one any. An inference loop's
    # parameter-sized activations (a CNN's per-channel tensors) die within the pass.
    nexts = [f0 for f0, _, _ in mts[1:]] + [n]
    trains = bool(graded) or len(w.params) < MIN_PARAM_SIZES or any(
        keeps_gradients(trace, w.allocs, w.params, w.free_of, top, b1, nx) for (_, top, b1), nx in zip(mts, nexts)
    ) or any(_updates_after(w, la, lf, f0, top, b1, nx) for (f0, top, b1), nx in zip(mts, nexts))
    starts, lengths = [0], []
    if trains and wrapped_start(labels, w, lf, mts[0][0]):
        starts.append(mts[0][0])
    # Where some pass is plainly a training pass, a pass that saves fewer activations is one too if it
    # makes gradients: the second micro-batch of a checkpointed model (heldout3_neox_hfckpt_accum2).
    plain = trains and any(has_backward(la, lf, f0, top) and makes_gradients(trace, w.allocs, w.params, top, b1)
                           for f0, top, b1 in mts)
    min_saved = MIN_SAVED_PEER if plain else MIN_SAVED
    prev_end = -1
    inputs = InputGradients(trace, w.allocs, w.params, w.free_of, mts)
    for (f0, top, b1), nxt in zip(mts, nexts):
        if prev_end >= 0 and _new_step(w, la, lf, period_events, starts[-1], prev_end, (f0, top, b1), min_saved):
            starts.append(f0)
        seeded = top + 1 in graded
        if trains and not seeded and not makes_gradients(trace, w.allocs, w.params, top, b1):
            b1 = backward_goes_on(w, top, b1, nxt)
        prev_end = b1
        # A refused pass's top may lie inside its backward (odd_steps.earlier_top), where others plainly train;
        # a seed's pass keeps its top (infer/seed.py placed it)
        if move_tops and plain and not has_backward(la, lf, f0, top, min_saved) \
                and not update_going_on(labels, w, f0, nxt):
            top = earlier_top(la, lf, w.allocs, f0, top, min_saved)
            if moved is not None:
                moved.append(top)
        # a seed is a backward's own mark, however few activations it frees (a tiny model's, retain_graph's)
        saves = top + 1 in seeds or has_backward(la, lf, f0, top, min_saved)
        if not (trains and saves and (seeded or makes_gradients(trace, w.allocs, w.params, top, b1))):
            if label_refused(labels, w, f0, b1, nxt, trains, plain) and starts[-1] == f0:
                starts.pop()  # an update read as a pass: no step of its own
            continue
        if inputs.only(labels, f0, top, b1):
            continue  # a backward for the inputs only, no step's (infer/other_work.py): left 'other'
        lengths.append(b1 - f0)
        label_training_pass(labels, w, f0, top, b1, seeds)
        label_after_backward(labels, w, top, b1, nxt, b1 - f0, next((e for s, _, e in mts if s == nxt), n))
    _label_before_first(labels, w, mts, starts)
    if cached is not None:
        cached.extend(w.cached)
    return labels, starts, lengths, [top for _, top, _ in mts]


def _new_step(w: Work, la: np.ndarray, lf: np.ndarray, period_events: float | None, start: int, prev_end: int,
              mt: tuple[int, int, int], min_saved: int) -> bool:
    """Whether the pass ``mt`` begins a step (the current one began at ``start``; the previous pass
    ended at ``prev_end``). Passes closer together than a step are micro-batches of one step
    (accumulation), unless an optimizer's bursts come between them (a step made longer by an evaluation
    loop); a training pass adding to gradients its step made is one however far (odd_steps.accumulates)."""
    f0, top, b1 = mt
    if not (period_events is None or f0 - start >= MICROBATCH_SHARE * period_events
            or _temporaries_burst(w, start, prev_end, f0) >= BURST):
        return False
    return not (accumulates(w.trace, w.allocs, w.params, w.free_of, start, f0, top, b1)
                and has_backward(la, lf, f0, top, min_saved) and makes_gradients(w.trace, w.allocs, w.params, top, b1))


def _temporaries_burst(w: Work, start: int, prev_end: int, f0: int) -> int:
    """Frees in bursts between two passes (an optimizer's), less the gradients a zero_grad frees there,
    made in the step's backward (parameter-sized): LBFGS's closure frees them before each evaluation's
    forward, several a step (truth_lbfgs, h16_accum_grad_buffers: each read as a step of its own)."""
    made = w.allocs_in(start, prev_end + 1)
    fo = w.free_of[made]
    # not a scalar: a loop's scalars freed among an update's temporaries count (h7_sac's 4-byte ones)
    sz = w.trace.size[made]
    grads = (fo > prev_end) & (fo < f0) & (sz > SCALAR) & np.isin(sz, w.params)
    return int(w.burst[prev_end + 1:f0].sum()) - int(w.burst[fo[grads]].sum())


def _label_before_first(labels: np.ndarray, w: Work, mts: list[tuple[int, int, int]], starts: list[int]) -> None:
    """The first step made like the others: where every later pass is preceded by forward work that saves
    nothing for backward, what allocates MIN_SAVED blocks or more before the first pass and frees most of
    them there is that work too (a teacher's no-grad forward, GradCache's; when it applies:
    docs/accuracy.md)."""
    f0, top = mts[0][:2]
    later = [f for f, _, _ in mts[1:]]
    steps = [s for s in starts if s > f0]
    if not later or labels[f0] != P["forward"]:
        return
    begun = np.flatnonzero(labels[:f0] != P["other"])
    lo = int(begun[-1]) + 1 if len(begun) else 0
    if not all(labels[f - 1] == P["forward"] for f in later) and not (
            steps and all(labels[f - 1] == P["forward"] for f in steps)
            and repeats_forward(w.trace, w.allocs, (f0, top), (lo - 1, f0))):
        return
    made = w.allocs_in(lo - 1, f0)
    if len(made) >= MIN_SAVED and (w.free_of[made] < f0).mean() > 0.5:
        labels[int(made[0]):f0] = P["forward"]
        if not all(labels[f - 1] == P["forward"] for f in later):
            w.cached.append(f0)


def gradients_unplaced(trace: Trace, tl: Timeline) -> bool:
    """Whether a trace read without any backward shows a training loop's evidence all the same: a
    pass after whose top parameter-sized blocks are made and kept past it (gradients), or an
    optimizer's bursts between two passes. The phases then are a guess (h10_shampoo_subclass: a tiny
    MLP's forward saves too few activations to be a pass, and Shampoo's temporaries make the only
    mountains; read as inference, 0.03 of its events right)."""
    mts = mountains(trace, tl, None, fill=False)
    if not mts:
        return False
    mts = passes(trace, tl, mts)
    life = tl.lifetimes
    la, lf = life.alloc_event[life.paired], life.free_event[life.paired]
    w = Work(trace, tl.freed_at, np.flatnonzero(trace.action == A["alloc"]), parameter_sizes(tl), burst_freed(trace))
    if len(w.params) < MIN_PARAM_SIZES:
        return False
    nexts = [f0 for f0, _, _ in mts[1:]] + [len(trace)]
    return any(keeps_gradients(trace, w.allocs, w.params, w.free_of, top, b1, nx)
               or _updates_after(w, la, lf, f0, top, b1, nx) for (f0, top, b1), nx in zip(mts, nexts))


def _has_saved_passes(trace: Trace, tl: Timeline) -> bool:
    """Whether some pass of the whole trace saves activations for a backward (``has_backward``)."""
    mts = mountains(trace, tl, None, fill=False)
    if not mts:
        return False
    life = tl.lifetimes
    la, lf = life.alloc_event[life.paired], life.free_event[life.paired]
    return any(has_backward(la, lf, f0, top) for f0, top, _ in passes(trace, tl, mts))


def _updates_after(w: Work, la: np.ndarray, lf: np.ndarray, f0: int, top: int, b1: int, nxt: int) -> bool:
    """A pass with a backward and a gradient's sizes after its top, followed by an optimizer's bursts of
    parameter-sized temporaries before the next pass: the trace trains, even where no backward is seen to
    keep its gradients. Between two passes only (the traces: docs/accuracy.md)."""
    if nxt >= len(w.trace) or not (has_backward(la, lf, f0, top) and makes_gradients(w.trace, w.allocs, w.params, top, b1)):
        return False
    n = len(w.trace)
    # after backward's end: an inference pass frees parameter-sized blocks in bursts within itself
    # (heldout2_convnext_eval: a ConvNeXt block's per-channel tensors)
    made = w.allocs_in(b1, nxt)
    temps = made[w.burst[np.minimum(w.free_of[made], n - 1)] & (w.free_of[made] < nxt)]
    return len(temps) >= BURST and covers_an_update(w.params, w.trace.size[temps])


