"""Work that is not a training step, read from lifetimes alone: attacks, rollouts, no-grad passes,
forwards an error stopped, serving, data sampled for the next step.

Each looks like a step; the rules that tell each apart: docs/accuracy.md, "Work that is no training
step: the rules"."""
from __future__ import annotations

import numpy as np

from ...read.trace import A, Trace
from ...vocab import P
from ..timeline import Timeline
from .bursts import BURST, burst_freed
from .gradients import MIN_PARAM_SIZES, SCALAR

#: Gradients a training backward keeps past its end (keeps_gradients' 2).
MIN_KEPT = 2
#: A backward for the inputs makes fewer parameter-sized blocks than this share of what a training
#: backward of the trace makes (the median of those that keep gradients): h11_pgd_adversarial's attack
#: passes make 8 against 21-24 (0.33-0.38); h7_sac's actor passes, which keep none before their
#: backward's end is found, 15 against 14-16; a micro-batch adding to kept gradients as many as the first.
INPUT_SHARE = 0.5


class InputGradients:
    """Which training-looking passes have a backward for the inputs only, not a training step's
    (``only``): where some pass keeps its gradients past its end, one that keeps none and makes far
    fewer parameter-sized blocks (INPUT_SHARE) computed no gradient for an update, only the ones it
    needs to reach the input (a PGD attack's autograd.grad for the image)."""

    def __init__(self, trace: Trace, allocs: np.ndarray, params: np.ndarray, free_of: np.ndarray,
                 mts: list[tuple[int, int, int]]):
        self.trace, self.allocs, self.params, self.free_of = trace, allocs, params, free_of
        made = [(self._made(top, b1), b1) for _, top, b1 in mts]
        training = [len(m) for m, b1 in made if (free_of[m] > b1).sum() >= MIN_KEPT]
        self.usual = float(np.median(training)) if training and len(params) else 0.0

    def _made(self, top: int, b1: int) -> np.ndarray:
        """Parameter-sized blocks made after ``top`` by ``b1``."""
        made = self.allocs[np.searchsorted(self.allocs, top, "right"):np.searchsorted(self.allocs, b1, "right")]
        return made[np.isin(self.trace.size[made], self.params)]

    def only(self, labels: np.ndarray, f0: int, top: int, b1: int) -> bool:
        """Whether the pass (forward start, top, backward end) is for the inputs only (see the class).
        If so, the forward-only work labelled right before it is its own start too (the perturbation's
        random start, 150 events of h11_pgd_adversarial read as an evaluation forward), and is
        unlabelled."""
        made = self._made(top, b1)
        if not self.usual or (self.free_of[made] > b1).any() or len(made) >= INPUT_SHARE * self.usual:
            return False
        named = np.flatnonzero(labels[:f0] != P["forward"])
        labels[int(named[-1]) + 1 if len(named) else 0:f0] = P["other"]
        return True


#: A quiet stretch between two bursts is still the update where this share of its allocations or more
#: has a parameter's size: h13_muon_adamw's Newton-Schulz iterations run 3,600 events without a burst,
#: 0.69 of their blocks parameter-sized; h16_grpo's rollout 0.03, h6_ppo's 0.18 (a small MLP policy).
UPDATE_SHARE = 0.2


def update_bursts(trace: Trace, allocs: np.ndarray, params: np.ndarray, burst: np.ndarray, b1: int, nxt: int,
                  span: int) -> np.ndarray:
    """The burst frees after a backward ending at ``b1`` (before the next pass at ``nxt``) that are
    its update's: those up to the first stretch longer than ``span`` (the backward's length) between
    two of them that allocates mostly other sizes than the parameters' (UPDATE_SHARE). A rollout after
    the update frees its KV cache in a burst at its end, 15,000 events on (h16_grpo), and the update
    was read as running to there."""
    at = b1 + 1 + np.flatnonzero(burst[b1 + 1:nxt])
    edges = np.concatenate([[b1], at])
    for k in np.flatnonzero(np.diff(edges) > span).tolist():
        made = allocs[np.searchsorted(allocs, edges[k], "right"):np.searchsorted(allocs, edges[k + 1], "left")]
        if len(made) and np.isin(trace.size[made], params).mean() < UPDATE_SHARE:
            return at[:k]
    return at


#: Work after an update that runs this many times as long as the backward before it is no forward of
#: the next step (a frozen teacher's, a reference model's: 1.2 times in heldout3_distill_kl, an
#: evaluation forward 0.85 in gpt_train_eval, GradCache's no-grad pass over the whole batch 5.6 in
#: h15_gradcache_contrastive) but a rollout or a generation over many decoding steps (h16_grpo 27
#: times, h6_ppo 25): it is left 'other'. So is what follows a forward-only pass in a trace that trains
#: for this many times the pass's own length: h16_grpo's decoding steps (50 events each) read as
#: passes, the last of them then 15,000 events of rollout before the training pass.
ROLLOUT = 10


#: Blocks made between an update and the next pass, freed after that pass's backward in a burst, that
#: make the work there the loop's data for the next step, not an evaluation forward ...
HELD_FOR_STEP = 4
#: ... and the share of that work's allocations they must be. GraphSAGE's sampled neighbourhoods
#: (h16_graphsage_sampled) hold 8 of 49 (0.16) until the next step's update is done, an embedding bag's
#: batch (heldout_embbag_adagrad) 18 of 18; DINO's crops before its teacher's no-grad forward 4 of 84
#: (0.05, the forward marked so), an evaluation loop followed by the next batch 4 of 141 (0.03,
#: h9_train_eval_interleaved).
HELD_SHARE = 0.1


def held_for_step(trace: Trace, allocs: np.ndarray, free_of: np.ndarray, burst: np.ndarray, end: int,
                  nxt: tuple[int, int]) -> bool:
    """Whether what is made after ``end`` (an update's) and before the next pass (``nxt``: its forward's
    start and backward's end) is the next step's data: HELD_FOR_STEP or more of its blocks freed after
    that pass's backward, in a burst (the loop dropping a step's data after its update). A checkpointed
    forward's first blocks, made before its pass's start, are freed inside the backward (llama__ckpt_1);
    a batch's input and target after the update, but they are two."""
    n = len(trace)
    made = allocs[np.searchsorted(allocs, end, "right"):np.searchsorted(allocs, nxt[0], "left")]
    fr = free_of[made]
    held = (fr > nxt[1]) & (fr < n) & burst[np.minimum(fr, n - 1)]
    return int(held.sum()) >= max(HELD_FOR_STEP, HELD_SHARE * len(made))


def rollout(end: int, nxt: int, top: int, b1: int) -> bool:
    """Whether what runs after ``end`` (an update's, or a forward-only pass's) up to the next pass at
    ``nxt`` is far longer (ROLLOUT) than the work from ``top`` to ``b1`` (the backward before the
    update, or the pass itself)."""
    return nxt - end > ROLLOUT * (b1 - top)


#: Blocks an exception frees in bursts, last made first, before they count as a forward it stopped
#: (passes.MIN_SAVED); allocations fewer than this between two bursts join them into one unwinding.
MIN_UNWOUND = 10


def unfinished_forwards(trace: Trace, tl: Timeline, burst: np.ndarray, labels: np.ndarray) -> None:
    """Forwards an error stopped (out of memory) before any step: blocks made one after another, then freed
    in bursts, last made first, around the trace's out-of-memory event as the exception unwinds; labelled
    so up to the first event read otherwise (the traces: docs/accuracy.md)."""
    life = tl.lifetimes
    a, f = life.alloc_event[life.paired], life.free_event[life.paired]
    named = np.flatnonzero(labels)
    fz = np.sort(f[burst[f]])
    fz = fz[fz < (named[0] if len(named) else len(trace))]
    if len(fz) < MIN_UNWOUND:
        return
    made = np.cumsum(trace.action == A["alloc"])
    run = np.concatenate([[0], np.cumsum(np.diff(made[fz]) >= MIN_UNWOUND)])
    for r in np.unique(run).tolist():
        frees = fz[run == r]
        mine = burst[f] & (f >= frees[0]) & (f <= frees[-1]) & (a < frees[0])
        if mine.sum() < MIN_UNWOUND:
            continue
        ra, rf = np.argsort(np.argsort(a[mine])), np.argsort(np.argsort(f[mine]))
        start = int(a[mine].min())
        end = int(np.flatnonzero(trace.action[:frees[0]] == A["alloc"])[-1])
        # ... where the trace recorded the error: an out-of-memory event among them (without it, 4,356
        # events of constructorsun_codeloc in ../shared/wild, a GNN trainer whose passes go unread)
        oom = (trace.action[start:frees[-1] + 1] == A["oom"]).any()
        if oom and float(np.corrcoef(ra, rf)[0, 1]) < 0:
            labels[start:end + 1] = P["forward"]


#: Where no backward is seen to keep a gradient, an update is told by its temporaries alone, and they
#: must come in this share of the parameters' sizes or more (AdamW's after DDP's bucket-view backward:
#: 0.73 in heldout4_gpt_ddp_bucket_view): a serving engine frees its KV cache's pages in bursts, 2 of
#: its 8 parameter sizes (0.25, h16_serve_paged: read as 37 training steps).
UPDATE_COVER = 0.5


def covers_an_update(params: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether blocks of these sizes, freed in bursts after a pass, cover the parameters' sizes as an
    update's temporaries do (UPDATE_COVER); with fewer than MIN_PARAM_SIZES sizes known, yes."""
    return len(params) < MIN_PARAM_SIZES or float(np.isin(params, sizes).mean()) >= UPDATE_COVER


#: Blocks freed in bursts before a training trace's first pass are the end of an update cut by the
#: ring buffer (the previous step's optimizer) only where this share of them or more has a parameter's
#: size: 1.0 in gpt_wrapped and h8_mid_step_start; h13_oom_retry_halve's forwards that ran out of
#: memory, freed as the exceptions unwound, 0.16.
WRAPPED_UPDATE = 0.5


def unwound(params: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether blocks of these sizes, freed in bursts before the first pass, are a failed forward's
    (an exception unwinding it) rather than an update's temporaries (WRAPPED_UPDATE)."""
    return len(params) >= MIN_PARAM_SIZES and float(np.isin(sizes, params).mean()) < WRAPPED_UPDATE


def label_update(labels: np.ndarray, trace: Trace, allocs: np.ndarray, free_of: np.ndarray, params: np.ndarray,
                 work: np.ndarray, top: int, b1: int, nxt: int) -> None:
    """The update the gradients' sets anchor (infer/anchored.py): from its first parameter-sized block
    (``work``, made after backward's end ``b1``) to its last, or the last free of those, but not past its
    last burst of frees (``update_bursts``) unless what follows up to ``nxt`` is a rollout (``rollout``)."""
    # a parameter of a scalar's size makes every scalar look parameter-sized: the scalars made between
    # backward and the update (40 events a step in h7_capturable_adam, 0.66 -> 0.83) began it
    sized = work[trace.size[work] > SCALAR]
    work = sized if len(sized) else work
    fr = free_of[work][free_of[work] < nxt]
    end = max(int(work.max()), int(fr.max()) if len(fr) else 0)
    bursts = update_bursts(trace, allocs, params, burst_freed(trace), b1, nxt, b1 - top)
    if len(bursts) >= BURST and bursts[-1] < end:
        end = int(bursts[-1])
        after = allocs[np.searchsorted(allocs, end, "right"):np.searchsorted(allocs, nxt, "left")]
        if len(after) >= MIN_UNWOUND and not rollout(end, nxt, top, b1):
            labels[end + 1:nxt] = P["forward"]
    labels[int(work.min()):end + 1] = P["optimizer"]


#: Allocations between a step's last update and an out-of-memory event before they are the next
#: step's forward (lifetimes.WENT_ON: hf_oom makes 6).
OOM_WENT_ON = 4


def stopped_step(trace: Trace, labels: np.ndarray, starts: list[int]) -> list[int]:
    """Where the trace's last event read is an update (optimizer or zero_grad) and the trace then
    allocates OOM_WENT_ON blocks or more before an out-of-memory event, those allocations began the
    next step's forward, which the error stopped: labelled forward from the first of them to the
    event, and a step of its own (hf_oom: 1 step read of 2). The step starts, with it."""
    ooms = np.flatnonzero(trace.action == A["oom"])
    named = np.flatnonzero(labels)
    if not len(ooms) or not len(named) or named[-1] > ooms[-1] or labels[named[-1]] not in (P["optimizer"], P["zero_grad"]):
        return starts
    made = named[-1] + 1 + np.flatnonzero(trace.action[named[-1] + 1:ooms[-1]] == A["alloc"])
    if len(made) < OOM_WENT_ON:
        return starts
    labels[int(made[0]):int(ooms[-1]) + 1] = P["forward"]
    return starts + [int(made[0])]
