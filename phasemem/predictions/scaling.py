"""Which blocks grow with the batch and with the sequence, and how fast: what ``batch_xF`` and
``seq_xF`` replay, and what ``fits`` solves for.

Per-token blocks grow linearly; attention scores, told by frames or by the softmax's upcast, with the
square of the sequence (the rules: docs/what-if.md, "How the scaling tells per-token and quadratic blocks").

Example:
    >>> g = growth(trace, alloc, free, size, phase_alloc, phase_free, step, token, exclude)
    >>> (g.kind == QUADRATIC).sum(), g.evidence, g.factor(batch=2)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.infer.frames import per_stack
from ..read.trace import Trace
from ..vocab import P

#: Words in a Python frame's function name, or its file's name, that say attention is computed
#: there (transformers' eager_attention_forward, torch's multi_head_attention_forward, timm's
#: layers/attention.py, diffusers' attention_processor.py).
ATTENTION_WORDS = ("attention", "attn")
#: Batch and sequence factors the report replays (issue 30): named batch_x0.5 ... seq_x4.
BATCH_FACTORS = (0.5, 2, 4)
SEQ_FACTORS = (2, 4)
#: A word in a Python function's name that says it builds the attention mask (transformers'
#: create_causal_mask, eager_mask, sdpa_mask). The mask is batch x 1 x T x T (or T x T): quadratic in
#: the sequence like the scores (fixtures/pairs2/llama__seq_x4: its 8 MiB mask at T 512 is 128 MiB at
#: T 2048, where a linear reading said 32 MiB and the allocator replay missed a 2 GiB segment).
MASK_WORD = "mask"
#: Such a block is the mask where its size divides the probabilities' (batch x heads x T x T) and is at
#: least this share of it (fixtures/capacity/llama: 2 MiB and 256 KiB beside 16 MiB probabilities; the
#: mask function's linear blocks, positions and indices, are 4 KiB).
MASK_SHARE = 64
#: Frames of a compiled graph running: inductor's output code and its generated file. Not torch/_dynamo/
#: alone: transformers and checkpoint wrap eager functions in torch._dynamo.disable, whose ``_fn`` frame
#: is in every allocation of fixtures/llama_hf_ckpt_bf16 (an eager model).
GRAPH_FILES = ("torch/_inductor/", "/torchinductor_")
#: A forward whose per-token blocks come from a compiled graph at least this often is read as compiled:
#: inductor may replace an eager attention by a fused kernel, and its frames do not say which op made a block.
COMPILED_SHARE = 0.5
#: The softmax's upcast must be seen at least this often (once per layer) to be taken for attention.
MIN_REPEATS = 2
#: Codes of ``Growth.kind``.
CONSTANT, LINEAR, QUADRATIC = 0, 1, 2


@dataclass(frozen=True)
class Growth:
    """How every block (Lifetimes order) grows with the tokens: CONSTANT, LINEAR or QUADRATIC (in
    the sequence; every token-sized block is linear in the batch)."""

    kind: np.ndarray  # int8 per block
    evidence: str  # how the quadratic blocks were told, or why none were
    sequence_known: bool  # False: nothing in the trace can tell whether attention scores are materialised

    def factor(self, batch: float = 1.0, seq: float = 1.0) -> np.ndarray:
        """Per block, the factor its size is multiplied by."""
        f = np.ones(len(self.kind))
        f[self.kind == LINEAR] = batch * seq
        f[self.kind == QUADRATIC] = batch * seq * seq
        return f


def compiled(trace: Trace) -> np.ndarray:
    """Per stack id (``per_stack``): a frame is a compiled graph's (GRAPH_FILES)."""
    return per_stack(trace, lambda fr: any(part in fn.replace("\\", "/") for fn, _, _ in fr for part in GRAPH_FILES))


def _named_attention(frames) -> bool:
    return any(any(w in name.lower() or w in fn.replace("\\", "/").rsplit("/", 1)[-1].lower() for w in ATTENTION_WORDS)
               for fn, _, name in frames if fn.endswith(".py"))


def _attention_stacks(trace: Trace) -> np.ndarray:
    """Per stack id: a Python frame is a function (or file) named for attention."""
    return per_stack(trace, _named_attention)


def _mask_stacks(trace: Trace) -> np.ndarray:
    """Per stack id: a Python frame is a function named for a mask (MASK_WORD)."""
    return per_stack(trace, lambda frames: any(MASK_WORD in name.lower() for fn, _, name in frames if fn.endswith(".py")))


def _softmax_in_attention(trace: Trace) -> np.ndarray:
    """Per stack id: made by a softmax (torch's, or the program's own: ../shared/wild/magma27_cs336's
    ``nn_utils.softmax``) called inside a function named for attention (transformers'
    eager_attention_forward: ``softmax(scores, dtype=float32)``; cs336's scaled_dot_product_attention)."""
    def of(frames):
        py = [(fn.replace("\\", "/"), name) for fn, _, name in frames if fn.endswith(".py")]
        if not py or "softmax" not in py[0][1].lower():
            return False
        return _named_attention(frames[1:])

    return per_stack(trace, of)


def _not_torch_op(trace: Trace) -> np.ndarray:
    """Per stack id: the innermost Python frame is no torch function but softmax (a ReLU, a BatchNorm
    or a Linear of torch's reads the sizes of a softmax's upcast: h11_pgd_adversarial, heldout_embbag)."""
    def of(frames):
        py = [(fn.replace("\\", "/"), name) for fn, _, name in frames if fn.endswith(".py")]
        return not py or "/torch/" not in py[0][0] or py[0][1] == "softmax"

    return per_stack(trace, of, none=True)


def _softmax_runs(trace: Trace, fwd: np.ndarray, alloc: np.ndarray, size: np.ndarray, phase_free: np.ndarray,
                  step: np.ndarray) -> np.ndarray:
    """Forward's blocks (``fwd`` in allocation order) around a softmax under autocast: a 2X block kept for
    backward (the fp32 probabilities) made by softmax alone, X right after it (their half-precision copy),
    a temporary of X or 2X freed within forward before it; MIN_REPEATS times in a step. What else looks
    so, and why it does not match: docs/what-if.md."""
    s = size[fwd]
    mid = np.arange(1, len(fwd) - 1)
    x = s[mid + 1]
    hit = mid[(s[mid] == 2 * x) & (x > 0) & (phase_free[fwd[mid]] == P["backward"])
              & ((s[mid - 1] == x) | (s[mid - 1] == 2 * x)) & (phase_free[fwd[mid - 1]] == P["forward"])]
    hit = hit[_not_torch_op(trace)[trace.stack[alloc[fwd[hit]]]]]
    # the probabilities are the forward's largest per-token blocks once T >= 2 x the head width (fp32
    # B·H·T² against a bf16 MLP of 4 x width); a rotary embedding's halves read 2X/X too, but beside
    # larger MLP blocks (../shared/wild/magma27_cs336)
    top = np.zeros(int(step.max()) + 2, np.int64)
    np.maximum.at(top, step[fwd] + 1, s)
    hit = hit[s[hit] >= top[step[fwd[hit]] + 1]]
    # a layer stack repeats it within a step: one per step is no attention (CLIP's logits, heldout3)
    steps, counts = np.unique(step[fwd[hit]], return_counts=True)
    hit = hit[np.isin(step[fwd[hit]], steps[counts >= MIN_REPEATS])]
    if not len(hit):
        return np.zeros(0, np.int64)
    keep = np.zeros(len(fwd), bool)
    keep[hit] = True
    keep[hit + 1] = True
    temp = phase_free[fwd] == P["forward"]
    for h in hit:  # the scores' temporaries before the probabilities: the scaled, masked, upcast copies
        x = s[h + 1]
        j = h - 1
        while j >= 0 and temp[j] and s[j] in (x, 2 * x):
            keep[j] = True
            j -= 1
    return fwd[keep]


def growth(trace: Trace, alloc: np.ndarray, free: np.ndarray, size: np.ndarray, phase_alloc: np.ndarray,
           phase_free: np.ndarray, step: np.ndarray, token: np.ndarray, exclude: np.ndarray,
           recompute: bool = False) -> Growth:
    """Per block (Lifetimes order): its alloc and free events, size, phases, step (-1 before the
    trace); ``token``: does it hold per-token values (whatif's batch-dependent blocks); ``exclude``:
    blocks that are per-token but never attention (the logits and their copies); ``recompute``: the
    trace shows a checkpoint's recompute (fixtures/pairs2/vit__ckpt_1 keeps no probabilities in forward)."""
    kind = np.where(token, LINEAR, CONSTANT).astype(np.int8)
    cand = token & ~exclude
    fwd = np.flatnonzero(cand & (phase_alloc == P["forward"]))
    fwd = fwd[np.argsort(alloc[fwd], kind="stable")]
    bwd = np.flatnonzero(cand & (phase_alloc == P["backward"]))
    bwd = bwd[np.argsort(alloc[bwd], kind="stable")]
    quad_fwd = np.zeros(0, np.int64)
    evidence = ""
    has_frames = bool(len(fwd)) and bool((trace.stack[alloc[fwd]] >= 0).any())
    if has_frames and compiled(trace)[trace.stack[alloc[fwd]]].mean() >= COMPILED_SHARE:
        return Growth(kind, "the forward runs as a compiled graph (torch.compile): its frames do not say which op "
                            "made a block, and inductor may fuse an attention, so whether attention scores "
                            "(quadratic in the sequence) are materialised cannot be told", False)
    if has_frames:
        stacks = trace.stack[alloc[fwd]]
        seed = _softmax_in_attention(trace)[stacks]
        if seed.any():
            probs = set(np.unique(size[fwd[seed]]).tolist())
            inside = _attention_stacks(trace)[stacks]
            top, s = max(probs), np.maximum(size[fwd], 1)
            mask = _mask_stacks(trace)[stacks] & (s >= top // MASK_SHARE) & (top % s == 0)
            quad_fwd = fwd[(inside & np.isin(size[fwd], list(probs | {v // 2 for v in probs}))) | mask]
            evidence = ("attention scores told by the frames: a softmax called inside a function named for "
                        "attention; the blocks made inside that function of the probabilities' size or half of it, "
                        "and the attention mask (made in a function named for a mask, a part of their size)")
    if not len(quad_fwd) and len(fwd) > 2:
        quad_fwd = _softmax_runs(trace, fwd, alloc, size, phase_free, step)
        if len(quad_fwd):
            evidence = ("attention scores told by the softmax's upcast (no frames name an attention function): "
                        "an fp32 block kept for backward, twice the size of the half-precision copy made right "
                        "after it and of the temporary made right before it")
    if len(quad_fwd):
        kind[quad_fwd] = QUADRATIC
        qsizes = set(np.unique(size[quad_fwd]).tolist())
        linear_sizes = set(np.unique(size[fwd[kind[fwd] == LINEAR]]).tolist())
        # backward has no frames to tell them: a size only attention makes in forward says it
        kind[bwd[np.isin(size[bwd], list(qsizes - linear_sizes))]] = QUADRATIC
        return Growth(kind, evidence, True)
    if has_frames and _attention_stacks(trace)[trace.stack[alloc[fwd]]].any():
        return Growth(kind, "no attention scores: frames name an attention function that makes no softmax (a "
                            "fused kernel: transformers' sdpa_attention_forward, torch's SDPA), so every "
                            "per-token block grows linearly with the sequence", True)
    if recompute:
        return Growth(kind, "the forward is checkpointed and no attention scores are seen: what a checkpointed "
                            "attention keeps is made again in backward, where the softmax's upcast is not looked "
                            "for, so whether scores (quadratic in the sequence) are materialised cannot be told",
                      False)
    if has_frames:
        return Growth(kind, "no attention scores seen: no softmax inside a function named for attention and no "
                            "softmax upcast, so every per-token block is taken to grow linearly with the "
                            "sequence (true with a fused attention kernel: SDPA, flash)", True)
    return Growth(kind, "the trace has no frames and no softmax upcast is seen: whether attention scores "
                        "(quadratic in the sequence) are materialised cannot be told", False)
