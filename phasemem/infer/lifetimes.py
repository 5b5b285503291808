"""Steps and phases from lifetimes alone (snapshots recorded with ``context=None``, or stripped).

A step repeats the same allocation sizes; inside it, forward/backward is a mountain of
activations; what follows backward is the optimizer. docs/accuracy.md describes every rule and
how accurate they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..vocab import P
from ..timeline import Timeline
from ..trace import A, Trace
from .anchored import anchored_passes
from .bursts import BURST, burst_freed
from .gradients import (MIN_PARAM_SIZES, covers_parameters, keeps_gradients, makes_gradients, optimizer_start, parameter_sizes,
                        sized_like_an_optimizer)
from .hooked import hooked_updates
from .loss import graphed_steps
from .odd_steps import accumulates, earlier_top, update_sized
from .other_work import InputGradients, covers_an_update, rollout, stopped_step, unfinished_forwards, unwound, update_bursts
from .passes import MIN_SAVED, candidate_periods, has_backward, mountains, passes
from .seed import all_seeded, reseat, seeded_loss
from .sharded import sharded_passes
from .updates import foreach_temporaries, update_end, update_read_as_pass, wrapped_backward


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
    hooked_updates(trace, tl, labels)
    return labels, stopped_step(trace, labels, starts)


def anchored_over_passes(trace: Trace, tl: Timeline) -> bool:
    """Whether the gradients' anchored reading replaced passes that read as training, with a different
    number of steps: the passes held more or fewer backward runs a step than the gradients' sets (h6_ppo's
    epochs: 7 steps read, 16 anchored), so what a step is, is a guess."""
    _, starts, anchored, overruled = _read(trace, tl)
    return overruled and len(anchored[1]) != len(starts)


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
        if anchored is not None:
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
    labels, starts = _label_passes(trace, tl, period_events, moved=moved)[:2]
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

#: Parameter-sized blocks an optimizer read from lifetimes must allocate between its start and end: the
#: regions so labelled with 0-3 were never the optimizer (fused AdamW after its first step in `fused`,
#: `gpt_ckpt_fused`, `h14_pure_fp16_scaled`; HF's code between micro-batches in `hf_compile_accum`;
#: clip_infonce, seq2seq_sgd_keep, truth_gpt_ckpt_dropout, h5_gpt_varlen_ema: 0.00 of their events
#: right), the smallest real ones make 4 (h6_optim_in_backward, h9_scaler_skips_first).
MIN_UPDATE_BLOCKS = 4

#: Passes closer together than this share of a step's period are micro-batches of one step
#: (gradient accumulation): gpt_forloop_accum's and gpt_fp16_accum's passes are 0.25-0.5 of a period
#: apart, separate steps of the fixtures at least 0.9.
MICROBATCH_SHARE = 0.8


def _label_passes(trace: Trace, tl: Timeline, period_events: float | None, fill: bool = True, move_tops: bool = True,
                  moved: list[int] | None = None) -> tuple[np.ndarray, list[int], list[int], list[int]]:
    """Labels, step starts, the length in events of each training pass found, and every pass's top. Tops
    found inside a backward are moved back (``odd_steps.earlier_top``) with ``move_tops``, each appended
    to ``moved`` if given."""
    n = len(trace)
    labels = np.zeros(n, np.int8)
    mts = mountains(trace, tl, period_events, fill)
    if not mts:
        return labels, [0], [], []
    mts, seeds, graded = reseat(trace, tl, passes(trace, tl, mts))
    life = tl.lifetimes
    born = life.paired
    la, lf = life.alloc_event[born], life.free_event[born]
    w = _Work(trace, tl.freed_at, np.flatnonzero(trace.action == A["alloc"]), parameter_sizes(tl), burst_freed(trace))
    # A trace trains only if some backward leaves gradients behind: parameter-sized blocks made
    # after a top that outlive its pass (until zero_grad, or for good), or a seeded one any. An inference loop's
    # parameter-sized activations (a CNN's per-channel tensors) die within the pass.
    nexts = [f0 for f0, _, _ in mts[1:]] + [n]
    trains = bool(graded) or len(w.params) < MIN_PARAM_SIZES or any(
        keeps_gradients(trace, w.allocs, w.params, w.free_of, top, b1, nx) for (_, top, b1), nx in zip(mts, nexts)
    ) or any(_updates_after(w, la, lf, f0, top, b1, nx) for (f0, top, b1), nx in zip(mts, nexts))
    starts = [0]
    lengths = []
    if trains and _wrapped_start(labels, w, lf, mts[0][0]):
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
            b1 = _backward_goes_on(w, top, b1, nxt)
        prev_end = b1
        # A refused pass's top may lie inside its backward (odd_steps.earlier_top), where others plainly train;
        # a seed's pass keeps its top (infer/seed.py placed it)
        if move_tops and plain and not has_backward(la, lf, f0, top, min_saved) \
                and not _update_going_on(labels, w, f0, nxt):
            top = earlier_top(la, lf, w.allocs, f0, top, min_saved)
            if moved is not None:
                moved.append(top)
        # a seed is a backward's own mark, however few activations it frees (a tiny model's, retain_graph's)
        saves = top + 1 in seeds or has_backward(la, lf, f0, top, min_saved)
        if not (trains and saves and (seeded or makes_gradients(trace, w.allocs, w.params, top, b1))):
            if update_read_as_pass(trace, w.allocs, w.params, labels, f0, b1):  # no step of its own
                labels[f0:nxt] = P["optimizer"]
                starts = starts[:-1] if starts[-1] == f0 else starts
            else:
                _label_refused(labels, w, f0, b1, nxt, trains, plain)
            continue
        if inputs.only(labels, f0, top, b1):
            continue  # a backward for the inputs only, no step's (infer/other_work.py): left 'other'
        lengths.append(b1 - f0)
        _label_training_pass(labels, w, f0, top, b1, seeds)
        _label_after_backward(labels, w, top, b1, nxt, b1 - f0)
    _label_before_first(labels, w, [f0 for f0, _, _ in mts])
    return labels, starts, lengths, [top for _, top, _ in mts]


def _new_step(w: _Work, la: np.ndarray, lf: np.ndarray, period_events: float | None, start: int, prev_end: int,
              mt: tuple[int, int, int], min_saved: int) -> bool:
    """Whether the pass ``mt`` begins a step (the current one began at ``start``; the previous pass
    ended at ``prev_end``). Passes closer together than a step are micro-batches of one step
    (accumulation), unless an optimizer's bursts come between them (a step made longer by an evaluation
    loop); a training pass adding to gradients its step made is one however far (odd_steps.accumulates)."""
    f0, top, b1 = mt
    if not (period_events is None or f0 - start >= MICROBATCH_SHARE * period_events
            or w.burst[prev_end + 1:f0].sum() >= BURST):
        return False
    return not (accumulates(w.trace, w.allocs, w.params, w.free_of, start, f0, top, b1)
                and has_backward(la, lf, f0, top, min_saved) and makes_gradients(w.trace, w.allocs, w.params, top, b1))


def _label_before_first(labels: np.ndarray, w: _Work, firsts: list[int]) -> None:
    """The first step made like the others: where every later pass is preceded by forward work that
    saves nothing for backward (``_label_after_backward``'s evaluation forward: a frozen teacher's
    no-grad forward, heldout3_distill_kl), what allocates MIN_SAVED blocks or more before the first
    pass, and frees most of them there, is that work too. Only then: a ``generate()`` before training
    (h8_generate_then_train) or a rollout (h6_ppo) is no step's forward."""
    f0 = firsts[0]
    if len(firsts) < 2 or labels[f0] != P["forward"] or not all(labels[f - 1] == P["forward"] for f in firsts[1:]):
        return
    begun = np.flatnonzero(labels[:f0] != P["other"])
    lo = int(begun[-1]) + 1 if len(begun) else 0
    made = w.allocs_in(lo - 1, f0)
    if len(made) >= MIN_SAVED and (w.free_of[made] < f0).mean() > 0.5:
        labels[int(made[0]):f0] = P["forward"]


@dataclass(frozen=True)
class _Work:
    """What every pass's labelling reads: the trace, when each event's block is freed, the alloc
    events, the parameters' sizes, and which frees come in bursts."""
    trace: Trace
    free_of: np.ndarray
    allocs: np.ndarray
    params: np.ndarray
    burst: np.ndarray

    def allocs_in(self, after: int, before: int) -> np.ndarray:
        """Alloc events e with after < e < before."""
        return self.allocs[np.searchsorted(self.allocs, after, "right"):np.searchsorted(self.allocs, before, "left")]


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
    w = _Work(trace, tl.freed_at, np.flatnonzero(trace.action == A["alloc"]), parameter_sizes(tl), burst_freed(trace))
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


def _updates_after(w: _Work, la: np.ndarray, lf: np.ndarray, f0: int, top: int, b1: int, nxt: int) -> bool:
    """A pass with a backward and a gradient's sizes after its top, followed by an optimizer's bursts
    of parameter-sized temporaries before the next pass: the trace trains even where no backward is
    seen to keep its gradients (DDP's gradients as bucket views are made before the trace:
    heldout4_gpt_ddp_bucket_view; a backward whose end runs past zero_grad: pairs/ckpt). Between two
    passes only: what a loop frees in bursts on its way out after the last one is no update
    (heldout2_convnext_eval, inference: its residual blocks save enough to look like a backward)."""
    if nxt >= len(w.trace) or not (has_backward(la, lf, f0, top) and makes_gradients(w.trace, w.allocs, w.params, top, b1)):
        return False
    n = len(w.trace)
    # after backward's end: an inference pass frees parameter-sized blocks in bursts within itself
    # (heldout2_convnext_eval: a ConvNeXt block's per-channel tensors)
    made = w.allocs_in(b1, nxt)
    temps = made[w.burst[np.minimum(w.free_of[made], n - 1)] & (w.free_of[made] < nxt)]
    return len(temps) >= BURST and covers_an_update(w.params, w.trace.size[temps])


def _label_refused(labels: np.ndarray, w: _Work, f0: int, b1: int, nxt: int, trains: bool, plain: bool) -> None:
    """A pass refused as a training pass: a forward, and where others plainly train and long work
    follows it, a decoding step of a rollout whose rest is left 'other' (infer/other_work.rollout)."""
    _label_forward_only(labels, w, f0, b1, nxt, trains)
    if plain and rollout(b1, nxt, f0, b1):
        labels[b1 + 1:nxt][labels[b1 + 1:nxt] == P["forward"]] = P["other"]


def _label_training_pass(labels: np.ndarray, w: _Work, f0: int, top: int, b1: int, seeds) -> None:
    """Forward up to the top, backward after it; the loss between where the backward's seed shows it
    (infer/seed.seeded_loss)."""
    labels[f0:top + 1] = P["forward"]
    labels[top + 1:b1 + 1] = P["backward"]
    span = seeded_loss(w.trace, w.free_of, f0, top, seeds, w.allocs)
    if span and span[1] <= b1:
        labels[span[0]:span[1]] = P["loss"]
        labels[span[1]:b1 + 1] = P["backward"]


def _label_forward_only(labels: np.ndarray, w: _Work, f0: int, b1: int, nxt: int, trains: bool = True) -> None:
    """A pass with no backward, so no optimizer either (inference) -- unless what follows makes
    parameter-sized temporaries and frees them in bursts, as a foreach optimizer does after a
    backward the trace cannot see (a CUDA-graphed model's replay makes no events); in a trace that
    shows no training otherwise (not ``trains``), in as many of the parameters' sizes as an update
    (other_work.covers_an_update)."""
    n = len(w.trace)
    if f0 and labels[f0 - 1] == P["optimizer"]:
        end = _update_goes_on(w, f0 - 1, nxt)
        if end >= f0:  # no pass: the update, going on
            labels[f0:end + 1] = P["optimizer"]
            return
    made = w.allocs_in(b1, nxt)
    temps = made[w.burst[np.minimum(w.free_of[made], n - 1)] & (w.free_of[made] < nxt)]
    labels[f0:nxt] = P["forward"]
    if len(temps) >= BURST and (covers_parameters if trains else covers_an_update)(w.params, w.trace.size[temps]):
        labels[b1 + 1:nxt] = P["optimizer"]


#: An evaluation forward between steps is a batch or two, no longer than this many training passes
#: (forward and backward: gpt_train_eval's 0.9, heldout3_distill_kl's teacher 1.0); h8_generate_then_train's
#: generate() runs 25 passes' events of decoding, which the marks leave unnamed.
EVAL_SPAN = 2


def _label_after_backward(labels: np.ndarray, w: _Work, top: int, b1: int, nxt: int, span: int) -> None:
    """What follows backward up to the next forward is the optimizer, if it allocates at all -- up
    to its last burst of frees when it has them (a foreach optimizer's temporaries, or zero_grad's);
    what allocates after that is a forward the loop ran with no backward (an evaluation), the rest
    'other'."""
    tail_allocs = w.allocs_in(b1, nxt)
    made = w.allocs_in(top, b1 + 1)
    grads = w.trace.size[made[w.free_of[made] > b1]]
    if not (len(tail_allocs) and sized_like_an_optimizer(w.params, grads, w.trace.size[tail_allocs])):
        return
    bursts = update_bursts(w.trace, w.allocs, w.params, w.burst, b1, nxt, b1 - top)
    end = int(bursts[-1]) if len(bursts) >= BURST else nxt - 1
    start = optimizer_start(w.trace, w.allocs, w.params, b1, end, labels, w.free_of, top)
    made = w.allocs_in(start - 1, end + 1)
    if (len(w.params) >= MIN_PARAM_SIZES and np.isin(w.trace.size[made], w.params).sum() < MIN_UPDATE_BLOCKS
            and not foreach_temporaries(w.trace, made, w.free_of, w.burst, w.params)):
        return  # no update seen: a fused optimizer's later steps, or code between micro-batches
    end = min(end, update_end(w.trace, w.allocs_in(start - 1, end + 1), w.params, start, w.burst))
    labels[start:end + 1] = P["optimizer"]
    if len(w.allocs_in(end, nxt)) >= MIN_SAVED and nxt - end <= EVAL_SPAN * span and not rollout(end, nxt, top, b1):
        labels[end + 1:nxt] = P["forward"]


def _update_going_on(labels: np.ndarray, w: _Work, f0: int, nxt: int) -> bool:
    """Whether a pass starting at ``f0`` is the optimizer going on (``_update_goes_on``): no pass, so
    its top is not moved (h5_vae_handadam's state replaced out of place)."""
    return bool(f0 and labels[f0 - 1] == P["optimizer"] and _update_goes_on(w, f0 - 1, nxt) >= f0)


def _update_goes_on(w: _Work, end: int, nxt: int) -> int:
    """Where the optimizer ended (at ``end``) but goes on allocating parameter-sized blocks only (at
    least MIN_UPDATE_BLOCKS of them before any other size), the last event of that run; else ``end``.
    A hand-written Adam replacing its state out of place makes mountains of its own after its first
    parameters' updates, read as forward-only passes (h5_vae_handadam: 0.58 of its events right). An
    evaluation forward's first blocks are activations, of other sizes."""
    tail = w.allocs_in(end, nxt)
    if not len(tail) or not len(w.params):
        return end
    other = np.flatnonzero(~np.isin(w.trace.size[tail], w.params))
    k = int(other[0]) if len(other) else len(tail)
    if k < MIN_UPDATE_BLOCKS:
        return end
    run = tail[:k]
    stop = int(tail[k]) if k < len(tail) else nxt
    fr = w.free_of[run][w.free_of[run] < stop]
    return max(int(run.max()), int(fr.max()) if len(fr) else 0)


def _backward_goes_on(w: _Work, top: int, b1: int, nxt: int) -> int:
    """Where a pass's last saved activation is freed before its gradients are made, its backward goes
    on until what it made of other sizes than the parameters' is freed, if that makes gradients:
    h16_int8_lora's later steps make their LoRA gradients after every saved activation is freed,
    while two of backward's own blocks live on (0.60 of its events right, 2 of 3 passes read
    forward-only). Else ``b1``."""
    made = w.allocs_in(top, b1 + 1)
    fr = w.free_of[made]
    own = (fr > b1) & (fr < nxt) & ~np.isin(w.trace.size[made], w.params)
    if not own.any():
        return b1
    end = int(fr[own].max())
    return end if makes_gradients(w.trace, w.allocs, w.params, top, end) else b1


def _wrapped_start(labels: np.ndarray, w: _Work, lf: np.ndarray, first: int) -> bool:
    """Whether a training trace starts inside a step (the ring buffer wrapped): BURST or more burst
    frees, before the first pass, of blocks the trace itself allocated (pre-existing ones freed at the
    start say nothing of a step) are its optimizer, which ends that step; labelled so. Only in a trace
    that trains: an inference loop offloading its layers frees their weights in bursts
    (h13_layer_offload_infer: 564 events of forward read as optimizer). Nor where those blocks are not
    mostly a parameter's size (a compiled forward's guards free scalars in bursts: h16_compiled_fused,
    odd_steps.update_sized; forwards that ran out of memory unwind so: h13_oom_retry_halve, other_work.unwound)."""
    freed_in_burst = np.zeros(len(labels), bool)
    freed_in_burst[lf[w.burst[lf]]] = True
    if freed_in_burst[:first].sum() < BURST or unwound(w.params, w.trace.size[:first][freed_in_burst[:first]]):
        return False
    end = int(np.flatnonzero(freed_in_burst[:first])[-1])
    if len(w.params) >= MIN_PARAM_SIZES and not update_sized(w.trace.size[w.allocs_in(-1, end + 1)], w.params):
        return False  # no optimizer's blocks (odd_steps.update_sized)
    labels[:end + 1] = P["optimizer"]
    wrapped_backward(w.trace, w.allocs, w.params, w.free_of, labels, first)
    return True
