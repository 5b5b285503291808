"""Half-precision compute under FSDP2's MixedPrecisionPolicy, read off a trace in fp32 or under autocast:
which blocks halve, and whether the loss upcasts the logits (docs/plans.md)."""
from __future__ import annotations

import numpy as np

from ...vocab import P
from ..blocks import Change, Facts
from ..remedies.per_token import block_growth
from ..scaling import CONSTANT, QUADRATIC
from .params import Params, StepBlocks

#: Half-precision compute under FSDP2's MixedPrecisionPolicy, from a trace in fp32: every block that
#: grows with the tokens is made in the half dtype (this share of its fp32 size), but the vocabulary-sized
#: ones, which the loss upcasts (fixtures/plans gpt, fsdp2_bf16 at N=8: activations 981 -> 687 MiB,
#: the 393 MiB of logits kept).
HALF_COMPUTE = 0.5

#: autocast casts every weight once per forward: a trace ran under it where blocks of half the size of
#: at least this share of the large weights are made in each forward (fixtures/plans' autocast traces:
#: 93-100 %, its other traces 0; history in docs/accuracy.md).
AUTOCAST_SHARE = 0.8
#: Weights at least this large are the ones checked for their casts (small ones share sizes with much else).
LARGE_WEIGHT = 1 << 20


def autocast_casts(f: Facts, params: Params, steps: list[StepBlocks]) -> np.ndarray | None:
    """The weights' half-precision casts autocast makes in each forward (a mask), or None where the
    trace shows no autocast: for most large weights, as many blocks of half their size made in every
    forward as there are weights of that size."""
    big = params.bytes[(params.bytes >= LARGE_WEIGHT) & params.trainable]
    if not len(big):
        return None
    sizes, count = np.unique(big, return_counts=True)
    mask = np.zeros(len(f.size), bool)
    hits, forwards = np.zeros(len(sizes), np.int64), 0
    for s in steps:
        if s.forward is None:
            continue
        forwards += 1
        made = f.made_in(s.forward[0], s.forward[1] + 1)
        for k, (size, n) in enumerate(zip(sizes, count)):
            same = made[f.size[made] == size // 2]
            if len(same) >= n:
                hits[k] += 1
                mask[same[:n]] = True
    # counted by weights, not sizes: the few embeddings (which autocast does not cast) weigh as little as they are many
    if not forwards or count[hits >= forwards].sum() < AUTOCAST_SHARE * count.sum():
        return None
    return mask


#: Losses known to upcast the logits to fp32 before the cross-entropy (transformers 5.17's loss_utils:
#: ForCausalLMLoss, ForMaskedLMLoss: ``logits.float()``), by the file of cross_entropy's caller.
UPCASTING_CALLERS = ("transformers/loss/loss_utils.py",)
#: Callers known not to: a transformers model's own CrossEntropyLoss on its logits (BertForMaskedLM).
PLAIN_CALLERS = ("transformers/models/",)
_TORCH_NN = ("torch/nn/functional.py", "torch/nn/modules/")


def loss_upcasts(f: Facts) -> bool | None:
    """Whether the loss upcasts half-precision logits to fp32, by the frames of the cross-entropy that
    reads them: True or False where its caller is one whose code is known, None otherwise (an fp32
    trace cannot show a ``.float()``, which is a no-op there)."""
    tr = f.an.trace
    vocab = f.members("softmax_spike", "logits_release", "logits")
    seen = set()
    for i in vocab:
        st = int(tr.stack[f.alloc[i]]) if f.alloc[i] >= 0 else -1
        if st < 0 or st in seen:
            continue
        seen.add(st)
        frames = [tr.frames[k][0] for k in tr.stacks[st]]
        names = [tr.frames[k][2] for k in tr.stacks[st]]
        if "cross_entropy" not in names:
            continue
        caller = next((x for x in frames[names.index("cross_entropy") + 1:] if not any(t in x for t in _TORCH_NN)), "")
        if any(c in caller for c in UPCASTING_CALLERS):
            return True
        if any(c in caller for c in PLAIN_CALLERS):
            return False
    return None


def half_compute(f: Facts, params: Params, steps: list[StepBlocks], ch: Change, st: dict) -> str:
    """Blocks computed in the half dtype: per-token blocks made in forward, loss or backward halve, but
    the vocabulary-sized ones (upcast for the loss); under autocast, as they are, less its weight casts."""
    casts = autocast_casts(f, params, steps)
    kind = block_growth(f).kind
    grows = kind != CONSTANT
    made = np.isin(f.phase_alloc, [P["forward"], P["loss"], P["backward"]])
    if casts is not None:
        ch.size[casts] = 0
        scores = kind == QUADRATIC  # autocast runs softmax in fp32; a half-precision model does not
        ch.size[scores] = np.round(ch.size[scores] * HALF_COMPUTE).astype(np.int64)
        # which other blocks autocast kept in fp32 (a residual stream, norms, the loss) no trace tells: the
        # lower answer takes every per-token block for one
        st["_low"] = np.flatnonzero(grows & made & ~casts & ~scores)
        return ("the trace ran under autocast: its per-token blocks are taken as half precision already but the "
                "attention scores (autocast's softmax runs in fp32), and its casts of the weights give way to the "
                "gathered half-precision parameters; which other blocks autocast kept in fp32 (a residual stream, "
                "norms, the loss) no trace tells, so the lower answer halves every per-token block (from an fp32 "
                "trace the answer is one number: record a step without autocast for it)")
    vocab = np.zeros(len(f.size), bool)
    vocab[f.members("logits", "softmax_spike", "logits_release")] = True
    upcast = loss_upcasts(f) if vocab.any() else False
    half = grows & made & (~vocab if upcast is not False else True)
    ch.size[half] = np.round(ch.size[half] * HALF_COMPUTE).astype(np.int64)
    if not vocab.any():
        return f"compute in half precision: the trace's per-token blocks take {HALF_COMPUTE:g} of their fp32 size"
    if upcast is None:
        st["_low"] = np.flatnonzero(vocab & grows & made)  # halved too in the lower answer
        return (f"compute in half precision: the trace's per-token blocks take {HALF_COMPUTE:g} of their fp32 size; "
                "whether the loss upcasts the logits to fp32 cannot be told from an fp32 trace (a .float() is a "
                "no-op there): the vocabulary-sized blocks are kept whole (the peak if it does), and the lower "
                "answer halves them too")
    return (f"compute in half precision: the trace's per-token blocks take {HALF_COMPUTE:g} of their fp32 size"
            + (", the vocabulary-sized ones their whole: the loss upcasts them (transformers' loss_utils)" if upcast
               else ", the vocabulary-sized ones too: the model's own cross-entropy reads them as they are"))


