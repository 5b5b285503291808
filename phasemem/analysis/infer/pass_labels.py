"""How each pass the lifetimes found is labelled (infer/lifetimes.py finds the passes and steps): a
training pass's forward, loss and backward, the update after it, a refused pass's forward, and a trace
that begins inside a step. docs/accuracy.md describes every rule and how accurate it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...read.trace import Trace
from ...vocab import P
from .bursts import BURST
from .cached import repeats_forward
from .gradients import MIN_PARAM_SIZES, covers_parameters, makes_gradients, optimizer_start, sized_like_an_optimizer
from .odd_steps import update_sized
from .other_work import covers_an_update, held_for_step, rollout, unwound, update_bursts
from .passes import MIN_SAVED
from .seed import seeded_loss
from .updates import foreach_temporaries, sparse_update_start, update_end, update_read_as_pass, wrapped_backward

#: Parameter-sized blocks an optimizer read from lifetimes must allocate between its start and end: the
#: regions so labelled with 0-3 were never the optimizer (fused AdamW after its first step in `fused`,
#: `gpt_ckpt_fused`, `h14_pure_fp16_scaled`; HF's code between micro-batches in `hf_compile_accum`;
#: clip_infonce, seq2seq_sgd_keep, truth_gpt_ckpt_dropout, h5_gpt_varlen_ema: 0.00 of their events
#: right), the smallest real ones make 4 (h6_optim_in_backward, h9_scaler_skips_first).
MIN_UPDATE_BLOCKS = 4


@dataclass(frozen=True)
class Work:
    """What every pass's labelling reads: the trace, when each event's block is freed, the alloc
    events, the parameters' sizes, and which frees come in bursts; and where a forward run again
    without grad ended (``cached.repeats_forward``), which the labelling adds to."""
    trace: Trace
    free_of: np.ndarray
    allocs: np.ndarray
    params: np.ndarray
    burst: np.ndarray
    cached: list[int] = field(default_factory=list)

    def allocs_in(self, after: int, before: int) -> np.ndarray:
        """Alloc events e with after < e < before."""
        return self.allocs[np.searchsorted(self.allocs, after, "right"):np.searchsorted(self.allocs, before, "left")]


def label_refused(labels: np.ndarray, w: Work, f0: int, b1: int, nxt: int, trains: bool, plain: bool) -> bool:
    """A pass refused as a training pass, labelled; whether it was an update read as a pass
    (updates.update_read_as_pass: the optimizer to the next pass, no step of its own). Else a forward,
    and where others plainly train and long work follows it, a decoding step of a rollout whose rest is
    left 'other' (other_work.rollout)."""
    if update_read_as_pass(w.trace, w.allocs, w.params, labels, f0, b1):
        labels[f0:nxt] = P["optimizer"]
        return True
    label_forward_only(labels, w, f0, b1, nxt, trains)
    if plain and rollout(b1, nxt, f0, b1):
        labels[b1 + 1:nxt][labels[b1 + 1:nxt] == P["forward"]] = P["other"]
    return False


def label_training_pass(labels: np.ndarray, w: Work, f0: int, top: int, b1: int, seeds) -> None:
    """Forward up to the top, backward after it; the loss between where the backward's seed shows it
    (infer/seed.seeded_loss)."""
    labels[f0:top + 1] = P["forward"]
    labels[top + 1:b1 + 1] = P["backward"]
    span = seeded_loss(w.trace, w.free_of, f0, top, seeds, w.allocs)
    if span and span[1] <= b1:
        labels[span[0]:span[1]] = P["loss"]
        labels[span[1]:b1 + 1] = P["backward"]


def label_forward_only(labels: np.ndarray, w: Work, f0: int, b1: int, nxt: int, trains: bool = True) -> None:
    """A pass with no backward, so no optimizer either (inference) -- unless what follows makes
    parameter-sized temporaries and frees them in bursts, as a foreach optimizer does after a
    backward the trace cannot see (a CUDA-graphed model's replay makes no events); in a trace that
    shows no training otherwise (not ``trains``), in as many of the parameters' sizes as an update
    (other_work.covers_an_update)."""
    n = len(w.trace)
    if f0 and labels[f0 - 1] == P["optimizer"]:
        end = update_goes_on(w, f0 - 1, nxt)
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


def label_after_backward(labels: np.ndarray, w: Work, top: int, b1: int, nxt: int, span: int, nxt_end: int) -> None:
    """What follows backward up to the next forward is the optimizer, if it allocates at all -- up
    to its last burst of frees when it has them (a foreach optimizer's temporaries, or zero_grad's);
    what allocates after that is a forward the loop ran with no backward (an evaluation), the rest
    'other'; so is the next step's data (``held_for_step``; ``nxt_end``: the next pass's backward end)."""
    tail_allocs = w.allocs_in(b1, nxt)
    made = w.allocs_in(top, b1 + 1)
    grads = w.trace.size[made[w.free_of[made] > b1]]
    if not (len(tail_allocs) and sized_like_an_optimizer(w.params, grads, w.trace.size[tail_allocs])):
        return
    bursts = update_bursts(w.trace, w.allocs, w.params, w.burst, b1, nxt, b1 - top)
    end = int(bursts[-1]) if len(bursts) >= BURST else nxt - 1
    start = optimizer_start(w.trace, w.allocs, w.params, b1, end, labels, w.free_of, top)
    start = sparse_update_start(w.trace, w.allocs, w.free_of, w.burst, w.params, top, b1, start)
    made = w.allocs_in(start - 1, end + 1)
    if (len(w.params) >= MIN_PARAM_SIZES and np.isin(w.trace.size[made], w.params).sum() < MIN_UPDATE_BLOCKS
            and not foreach_temporaries(w.trace, made, w.free_of, w.burst, w.params)):
        return  # no update seen: a fused optimizer's later steps, or code between micro-batches
    end = min(end, update_end(w.trace, w.allocs_in(start - 1, end + 1), w.params, start, w.burst))
    labels[start:end + 1] = P["optimizer"]
    long = nxt - end > EVAL_SPAN * span
    rerun = long and repeats_forward(w.trace, w.allocs, (b1 - span, top), (end, nxt))
    if len(w.allocs_in(end, nxt)) >= MIN_SAVED and (rerun or not long) and not rollout(end, nxt, top, b1) \
            and not held_for_step(w.trace, w.allocs, w.free_of, w.burst, end, (nxt, nxt_end)):
        labels[end + 1:nxt] = P["forward"]
        if rerun:
            w.cached.append(nxt)


def update_going_on(labels: np.ndarray, w: Work, f0: int, nxt: int) -> bool:
    """Whether a pass starting at ``f0`` is the optimizer going on (``update_goes_on``): no pass, so
    its top is not moved (h5_vae_handadam's state replaced out of place)."""
    return bool(f0 and labels[f0 - 1] == P["optimizer"] and update_goes_on(w, f0 - 1, nxt) >= f0)


def update_goes_on(w: Work, end: int, nxt: int) -> int:
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


def backward_goes_on(w: Work, top: int, b1: int, nxt: int) -> int:
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


def wrapped_start(labels: np.ndarray, w: Work, lf: np.ndarray, first: int) -> bool:
    """Whether a training trace starts inside a step (the ring buffer wrapped): BURST or more burst frees,
    before the first pass, of mostly parameter-sized blocks the trace itself allocated are its optimizer,
    which ends that step; labelled so. Only in a trace that trains (the traces behind each condition:
    docs/accuracy.md)."""
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
